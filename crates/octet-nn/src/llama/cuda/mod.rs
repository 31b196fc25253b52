//! Training a Llama model on the GPU: the same model as `crate::llama`
//! (RMSNorm, RoPE, causal grouped-query attention, SwiGLU, untied or tied LM
//! head, cross-entropy), with explicit forward and backward, the block
//! matrices as [`GpuLinear`]s under the run's recipe, and AdamW on the device.
//!
//! Precision: parameters live as one flat f32 buffer (the optimizer's masters,
//! in [`crate::llama::Llama::param_shapes`] order); the block matrices and
//! the LM head also have bf16 compute copies, rewritten by the AdamW kernel.
//! The residual stream and the gradients flowing through it are f32; the
//! inputs of matrix products are bf16, and so are the blocks' input
//! gradients (those of the projections reading one input summed by their
//! GEMMs, each adding in f32 and rounding once, as autocast PyTorch sums
//! them; the LM head's is f32); the logits are f32. The embedding and the
//! LM head stay in high precision (bf16 products), as on the CPU.
//!
//! Kernels: the training model's families in `octet-cuda/kernels`
//! ([`TRAIN_KERNELS`]: `embed.cu`, `norm.cu`, `rope.cu`, `swiglu.cu`,
//! `elementwise.cu`, `loss.cu`, `optim.cu`, `attention.cu`; attention is flash-style: the forward keeps
//! the per-row log-sum-exp, the backward recomputes probabilities tile by
//! tile; nothing of size T x T is stored). Every reduction runs in a fixed
//! order, so a step is deterministic on a given GPU.

use crate::linear::cuda::{forward_shared, forward_shared_with, GpuLinear, GpuLinearSaved};
use crate::llama::{Llama, LlamaConfig, LoraSpec, PROJ_NAMES};
use crate::lora::cuda::{
    forward_group, forward_group_with, GpuAdapter, GpuBase, GpuLoraLinear, GpuLoraSaved,
};
use crate::lora::Dropout;
use cudarc::driver::{
    CudaFunction, CudaSlice, CudaView, DevicePtr, DevicePtrMut, DeviceRepr, LaunchConfig,
    PushKernelArg, ValidAsZeroBits,
};
use octet_cuda::nccl::{NcclComm, Reduce};
use octet_cuda::tma::TmaMap;
use octet_cuda::{nvrtc, AddTo, DeviceFp8, Error, GemmDst, GemmOut, Gpu, Result, TensorAmax};
use octet_fp8::Recipe;
use octet_tensor::Tensor;
use std::collections::HashMap;
use std::rc::Rc;

mod attention;
mod backward;
mod family;
mod forward;
mod kernels;
mod lora;
mod optim;
mod shard;
use family::QkNormIn;
use kernels::{load_fns, Fns};
pub use kernels::{ATTN_TC_DIMS, ATTN_WG_DIMS, TRAIN_KERNELS};
use optim::launch_adamw;
use shard::Sharding;

/// Logits a chunk of the GPU's fused LM head and loss computes at most
/// (`max(1, GPU_HEAD_CHUNK / V)` rows: 512 MiB of f32 logits and 256 MiB of
/// their bf16 gradient). Large enough that a chunk's GEMMs run near the
/// full-size ones' speed (1,046 rows of 2,048 at a 128,256 vocabulary).
pub const GPU_HEAD_CHUNK: usize = 1 << 27;

/// Largest head dimension of the attention kernels.
pub const MAX_HEAD_DIM: usize = 128;

/// Why the GPU training model cannot run `cfg`, if it cannot: a head width
/// past the attention kernels' [`MAX_HEAD_DIM`]. (It runs every family
/// switch of [`LlamaConfig`]: the projections' biases, Qwen3's per-head q/k
/// norms and a head width of its own.) The message names the field and says
/// that the CPU runs the model.
pub fn unsupported_config(cfg: &LlamaConfig) -> Option<String> {
    let d = cfg.head_dim();
    (d > MAX_HEAD_DIM).then(|| {
        format!(
            "the GPU attention kernels take head_dim up to {MAX_HEAD_DIM}, not {d}; the CPU runs \
             this model (--device cpu)"
        )
    })
}

/// [`unsupported_config`] as an error.
pub fn check_config(cfg: &LlamaConfig) -> Result<()> {
    match unsupported_config(cfg) {
        Some(why) => Err(Error::Unsupported(why)),
        None => Ok(()),
    }
}
const TILE: usize = 64;
/// Rows per block of the norm backward: each block writes one row of the
/// gain's partial sums (a fixed grouping, so that the sum is deterministic),
/// which `sum_partials` adds. (32 rows a block was measured on the ~1B model:
/// the partials' sum took 12 instead of 65 us, but the norm backward 518
/// instead of 460 us: its 1024 blocks took 1.3 waves at 6 resident an SM.)
const NORM_ROWS: usize = 8;
/// Blocks of the gradient-norm reduction.
const NORM_BLOCKS: usize = 512;

/// One attention kernel with its launch shape.
struct AttnKernel {
    f: CudaFunction,
    threads: u32,
    /// Rows (queries or keys) per block.
    rows: usize,
    /// Dynamic shared bytes.
    smem: usize,
}

/// The attention kernels chosen for the head dim: tensor-core kernels
/// (`*_tc{D}_*`, mma.sync) for D in {16, 32, 64, 128}, or on sm_90a for D in
/// {64, 128} the wgmma kernels (`*_wg{D}`); the SIMT kernels (f32 products)
/// otherwise.
struct Attn {
    fwd: AttnKernel,
    dkdv: AttnKernel,
    dq: AttnKernel,
    tensor_cores: bool,
    /// The kernels take TMA maps (the wgmma kernels): q, k, v for the
    /// forward; q, k, v and the bf16 output gradient for the backward.
    tma: bool,
}

/// One parameter's place in the flat buffers.
#[derive(Clone, Debug)]
pub struct Slot {
    /// Hugging Face name.
    pub name: String,
    /// Shape.
    pub shape: Vec<usize>,
    /// First element in the flat buffers.
    pub offset: usize,
    /// Elements.
    pub numel: usize,
    /// Weight decay applies (matrices, not norm gains).
    pub decay: bool,
}

struct Block {
    /// Where the block's parameters sit among the slots (LoRA mode: among
    /// [`LoraMode::base_slots`]).
    slots: BlockSlots,
    /// q, k, v, o, gate, up, down (empty in LoRA mode).
    lin: Vec<GpuLinear>,
    /// LoRA mode: the frozen q, k, v, o, gate, up, down with their adapters.
    lora: Vec<GpuLoraLinear>,
    /// LoRA mode: the trainable slots `(lora_A, lora_B)` of each targeted projection.
    adapter_slots: [Option<(usize, usize)>; 7],
}

/// What one projection keeps for backward.
enum ProjSaved {
    Full(Box<GpuLinearSaved>),
    Lora(GpuLoraSaved),
}

impl ProjSaved {
    fn bytes_unique(&self, seen: &mut std::collections::HashSet<usize>) -> usize {
        match self {
            ProjSaved::Full(s) => s.bytes_unique(seen),
            ProjSaved::Lora(s) => s.bytes_unique(seen),
        }
    }
}

/// LoRA fine-tuning (see [`GpuLlama::new_lora`]): the base model is frozen,
/// and `GpuLlama::slots` with the flat master, gradient and moment buffers
/// cover the adapters only.
struct LoraMode {
    /// The base model's parameters (Hugging Face names, checkpoint order).
    base_slots: Vec<Slot>,
    /// f32 values of the frozen parameters the kernels read in f32 (embedding, norm gains).
    rep: CudaSlice<f32>,
    /// Offset of a base slot in `rep`.
    rep_off: Vec<Option<usize>>,
    rank: usize,
    alpha: f64,
    /// Targeted projections (`q_proj`, ...).
    targets: Vec<String>,
    /// LoRA dropout `(p, seed)` of training forwards (`None`: off).
    dropout: Option<(f64, u64)>,
    /// The training forward the next dropout masks belong to (see
    /// [`GpuLlama::set_dropout_round`]).
    dropout_round: u64,
    /// The round of the forward in progress (`None`: an evaluation, no dropout).
    dropout_now: Option<u64>,
}

/// AdamW hyper-parameters of [`GpuLlama::adamw_step`] (as `octet_train::optim::AdamWConfig`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamParams {
    /// Learning rate of this step.
    pub lr: f32,
    /// First-moment decay.
    pub beta1: f32,
    /// Second-moment decay.
    pub beta2: f32,
    /// Denominator epsilon.
    pub eps: f32,
    /// Decoupled weight decay (matrices only).
    pub weight_decay: f32,
    /// Clip the global gradient norm to this (0: no clipping).
    pub grad_clip: f32,
}

/// Wall time per phase of a step, when `OCTET_PROFILE` is set: the stream
/// is synchronized at each phase boundary (which costs a little speed).
struct Prof {
    on: bool,
    /// Backward is running a block's forward again: its phases count as one.
    recomputing: bool,
    last: std::time::Instant,
    acc: Vec<(&'static str, f64)>,
}

impl Prof {
    /// On under `OCTET_PROFILE=1` ([`octet_cuda::profile_enabled`]).
    fn from_env() -> Result<Prof> {
        Ok(Prof {
            on: octet_cuda::profile_enabled()?,
            recomputing: false,
            last: std::time::Instant::now(),
            acc: Vec::new(),
        })
    }

    fn mark(&mut self, gpu: &Gpu, what: &'static str) -> Result<()> {
        if !self.on {
            return Ok(());
        }
        gpu.synchronize()?;
        let now = std::time::Instant::now();
        let dt = now.duration_since(self.last).as_secs_f64() * 1e3;
        self.last = now;
        let what = match self.recomputing {
            true => "recompute (forward again)",
            false => what,
        };
        match self.acc.iter_mut().find(|(n, _)| *n == what) {
            Some((_, t)) => *t += dt,
            None => self.acc.push((what, dt)),
        }
        Ok(())
    }
}

/// One parameter's f32 master weights, first and second AdamW moments.
pub type MasterMoments = (Vec<f32>, Vec<f32>, Vec<f32>);

/// A Llama model on the GPU, with its optimizer state.
pub struct GpuLlama<'g> {
    gpu: &'g Gpu,
    /// Dimensions.
    pub cfg: LlamaConfig,
    f: Fns,
    /// Parameters in checkpoint order.
    pub slots: Vec<Slot>,
    master: CudaSlice<f32>,
    grad: CudaSlice<f32>,
    /// Per slot: its gradient has not been written this step (set by
    /// [`GpuLlama::zero_grad`] for the projection weights of an unsharded,
    /// fully trained model, whose memory it leaves as it was): the first
    /// weight-gradient GEMM overwrites the slot, later ones add to it.
    grad_unwritten: Vec<bool>,
    m: CudaSlice<f32>,
    v: CudaSlice<f32>,
    blocks: Vec<Block>,
    /// bf16 copy of the LM head (of the embedding when tied).
    head: CudaSlice<u16>,
    embed_slot: usize,
    norm_slot: usize,
    head_slot: usize,
    cos: CudaSlice<f32>,
    sin: CudaSlice<f32>,
    /// Optimizer steps taken.
    pub step: u64,
    /// Check every block's output for NaN/inf in the forward (one reduction
    /// and a host read per block): set by the trainer to locate a non-finite
    /// loss, which then fails with [`Error::NonFiniteIn`] naming the block.
    /// A checking forward draws LoRA dropout masks as a training one does
    /// (set the round of the forward it repeats first).
    pub check_layers: bool,
    /// Logits a chunk of the fused LM head and loss holds at most
    /// ([`GPU_HEAD_CHUNK`]; the selftest takes a few rows to check chunks).
    pub(crate) head_chunk: usize,
    /// A row of bf16 ones, the bias gradients' left operand (grown as needed).
    ones: Option<CudaSlice<u16>>,
    /// Kernels that write a projection's input or grad_output also compute
    /// its amax when the projection's quantizer reads one (current
    /// per-tensor scaling), saving that quantizer's amax pass. On by default;
    /// the selftest turns it off to check that both give the same bytes.
    pub fuse_amax: bool,
    /// How the tensors that only a norm's, SwiGLU's or the attention's
    /// backward reads are kept (see [`SavedActivations`]); `Full` by default.
    pub saved_activations: SavedActivations,
    /// Blocks whose activations are recomputed, from the first (see [`GpuLlama::set_recompute`]).
    recompute: usize,
    prof: Prof,
    /// Sharded data parallel: how the parameters are split over the ranks.
    shard: Option<Sharding<'g>>,
    /// LoRA fine-tuning of a frozen base.
    lora: Option<LoraMode>,
}

/// How a training step keeps the activations that only the backward of a
/// norm, of SwiGLU or of the attention reads (the inputs of the matrix
/// products are kept as the recipe and backward mode say, see `GpuLinear`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SavedActivations {
    /// As computed: the norms' inputs in f32, SwiGLU's inputs and the
    /// attention output in bf16.
    Full,
    /// In FP8 (E4M3): the norms' inputs and SwiGLU's two inputs with one
    /// factor per row (1/4 and 1/2 of the bytes); the attention output not
    /// at all where the o projection keeps a per-tensor E4M3 row-wise copy of
    /// it (the `dequantized` backward of per-tensor recipes), which the
    /// attention backward then reads. LoRA adapters under the `quantized`
    /// backward keep their inputs as the E4M3 codes the base's product read
    /// ([`crate::lora::cuda::GpuLoraLinear::fp8_saved_input`]), as they always do
    /// under the `dequantized` one. The forward is unchanged (same loss);
    /// the backward reads values within a relative 2^-4 of the originals.
    Fp8,
}

/// A norm's input kept for its backward.
enum NormIn {
    F32(CudaSlice<f32>),
    /// E4M3 codes and one f32 factor per row (`rmsnorm_fwd`'s `xq`, `xs`).
    Fp8(CudaSlice<u8>, CudaSlice<f32>),
}

impl NormIn {
    /// The FP8 codes and row factors where there are some, else the f32 input.
    fn of(x: CudaSlice<f32>, xq: Option<(CudaSlice<u8>, CudaSlice<f32>)>) -> NormIn {
        match xq {
            Some((c, f)) => NormIn::Fp8(c, f),
            None => NormIn::F32(x),
        }
    }

    fn bytes(&self) -> usize {
        match self {
            NormIn::F32(x) => 4 * x.len(),
            NormIn::Fp8(q, f) => q.len() + 4 * f.len(),
        }
    }
}

/// SwiGLU's inputs kept for its backward.
enum SwigluIn {
    Bf16 {
        gate: CudaSlice<u16>,
        up: CudaSlice<u16>,
    },
    /// E4M3 codes with one factor per row each (`swiglu_fwd_q`).
    Fp8 {
        gate: (CudaSlice<u8>, CudaSlice<f32>),
        up: (CudaSlice<u8>, CudaSlice<f32>),
    },
}

impl SwigluIn {
    fn bytes(&self) -> usize {
        match self {
            SwigluIn::Bf16 { gate, up } => 2 * (gate.len() + up.len()),
            SwigluIn::Fp8 { gate, up } => {
                gate.0.len() + up.0.len() + 4 * (gate.1.len() + up.1.len())
            }
        }
    }
}

/// The attention output as its backward reads it.
enum AttnOut {
    /// bf16, maybe shared with o's saved input.
    Bf16(Rc<CudaSlice<u16>>),
    /// o's saved per-tensor E4M3 row-wise input (counted with o's saved state).
    Linear(Rc<std::cell::RefCell<crate::linear::cuda::Quant>>),
    /// The o adapter's saved E4M3 input (LoRA, counted with o's saved state).
    Lora(Rc<crate::lora::cuda::Fp8Input>),
}

/// The attention backward's inputs: q, k, v (bf16), the forward's output and
/// lse, the output gradient (bf16) and `(B, T, Hq, Hkv, D)`.
#[derive(Clone, Copy)]
struct AttnBwdIn<'a> {
    q: &'a CudaSlice<u16>,
    k: &'a CudaSlice<u16>,
    v: &'a CudaSlice<u16>,
    out: OutRef<'a>,
    dout: &'a CudaSlice<u16>,
    lse: &'a CudaSlice<f32>,
    dims: (usize, usize, usize, usize, usize),
}

/// Where the attention backward's kernels write the input gradients.
enum AttnGradDst<'a> {
    /// f32 `(dq, dk, dv)`, before RoPE's backward.
    F32(
        &'a mut CudaSlice<f32>,
        &'a mut CudaSlice<f32>,
        &'a mut CudaSlice<f32>,
    ),
    /// bf16, RoPE's backward applied to dq and dk, and the amaxes of the
    /// three where given (the wgmma kernels only).
    Bf16 {
        dq: &'a mut CudaSlice<u16>,
        dk: &'a mut CudaSlice<u16>,
        dv: &'a mut CudaSlice<u16>,
        amax: [&'a mut Option<TensorAmax>; 3],
    },
}

/// The fused-store argument of the wgmma attention backward kernels
/// (`BwdStore` in attention.cu, same layout): device addresses, 0 for none.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct BwdStore {
    x: u64,
    y: u64,
    cs: u64,
    sn: u64,
    amax: u64,
    nonfinite: u64,
    amax2: u64,
    nonfinite2: u64,
}

// SAFETY: a plain struct of device addresses, copied into the kernel's
// parameter space.
unsafe impl DeviceRepr for BwdStore {}

/// The attention output as [`GpuLlama::attn_backward`] reads it.
#[derive(Clone, Copy)]
enum OutRef<'a> {
    Bf16(&'a CudaSlice<u16>),
    /// E4M3 codes and the one dequantization factor.
    Fp8(&'a CudaSlice<u8>, &'a CudaSlice<f32>),
}

impl AttnOut {
    /// `f` of the output's buffers.
    fn with<R>(&self, f: impl FnOnce(OutRef<'_>) -> R) -> Result<R> {
        Ok(match self {
            AttnOut::Bf16(o) => f(OutRef::Bf16(o)),
            AttnOut::Linear(q) => match &*q.borrow() {
                crate::linear::cuda::Quant::Tensor(d) => f(OutRef::Fp8(&d.rowwise, &d.scale_inv)),
                _ => {
                    return Err(Error::Shape(
                        "saved attention output is not per-tensor FP8".into(),
                    ))
                }
            },
            AttnOut::Lora(q) => f(OutRef::Fp8(&q.q.rowwise, &q.q.scale_inv)),
        })
    }
}

impl ProjSaved {
    /// The saved input as the attention backward can read it in place of a
    /// bf16 attention output: a per-tensor E4M3 row-wise copy, shared.
    fn attn_out(&self) -> Option<AttnOut> {
        match self {
            ProjSaved::Full(s) => s.rowwise_e4m3().map(AttnOut::Linear),
            ProjSaved::Lora(s) => s.rowwise_e4m3().map(AttnOut::Lora),
        }
    }
}

/// What one block's backward reads: its two norms' inputs (and `rstd`s) and
/// the rest ([`BlockCore`]).
struct BlockSaved {
    x: NormIn,
    rstd1: CudaSlice<f32>,
    x1: NormIn,
    core: BlockCore,
}

/// What a block's backward reads from its forward but the norms' inputs.
/// What a block's seven projections keep for backward, by name.
struct BlockProjSaved {
    q: ProjSaved,
    k: ProjSaved,
    v: ProjSaved,
    o: ProjSaved,
    gate: ProjSaved,
    up: ProjSaved,
    down: ProjSaved,
}

impl BlockProjSaved {
    /// The seven in the order of [`crate::llama::PROJ_NAMES`] (the index of
    /// each is its projection's in [`Block::lin`]).
    fn each(&self) -> [&ProjSaved; 7] {
        [
            &self.q, &self.k, &self.v, &self.o, &self.gate, &self.up, &self.down,
        ]
    }

    /// [`BlockProjSaved::each`], mutable.
    fn each_mut(&mut self) -> [&mut ProjSaved; 7] {
        [
            &mut self.q,
            &mut self.k,
            &mut self.v,
            &mut self.o,
            &mut self.gate,
            &mut self.up,
            &mut self.down,
        ]
    }
}

struct BlockCore {
    /// What the seven projections keep.
    lin: BlockProjSaved,
    q: CudaSlice<u16>,
    k: CudaSlice<u16>,
    v: CudaSlice<u16>,
    a: AttnOut,
    lse: CudaSlice<f32>,
    rstd2: CudaSlice<f32>,
    swiglu: SwigluIn,
    /// Qwen3's per-head q and k norms' inputs.
    qk_in: Option<QkNormIn>,
}

impl BlockSaved {
    /// Bytes kept, each buffer counted once however many layers share it,
    /// added into `kinds` (indexed as [`SAVED_KINDS`]).
    fn add_bytes(&self, kinds: &mut [usize; SAVED_KINDS.len()]) {
        let c = &self.core;
        let mut seen = std::collections::HashSet::new();
        let a = match &c.a {
            AttnOut::Bf16(a) => {
                seen.insert(Rc::as_ptr(a) as usize);
                2 * a.len()
            }
            _ => 0,
        };
        kinds[0] += self.x.bytes() + self.x1.bytes();
        kinds[1] += 4 * (self.rstd1.len() + c.rstd2.len());
        kinds[2] +=
            2 * (c.q.len() + c.k.len() + c.v.len()) + c.qk_in.as_ref().map_or(0, QkNormIn::bytes);
        kinds[3] += a + 4 * c.lse.len();
        kinds[4] += c.swiglu.bytes();
        kinds[5] += c
            .lin
            .each()
            .into_iter()
            .map(|l| l.bytes_unique(&mut seen))
            .sum::<usize>();
    }
}

/// The kinds of saved state [`GpuLlamaSaved::bytes_by_kind`] reports.
pub const SAVED_KINDS: [&str; 8] = [
    "norm inputs",
    "norm statistics",
    "attention q, k, v",
    "attention output and log-sum-exp",
    "SwiGLU inputs",
    "projection inputs (FP8 or bf16 copies)",
    "recomputed blocks' inputs",
    "final norm and LM head input gradient",
];

/// What [`GpuLlama::block_forward`] gives: what the block's backward reads
/// but its input's, and the down projection's output.
struct BlockOut {
    core: BlockCore,
    /// The residual after attention (f32), and its FP8 copy when asked for.
    x1: CudaSlice<f32>,
    xq2: Option<(CudaSlice<u8>, CudaSlice<f32>)>,
    /// The down projection's output (none when recomputing).
    dn: Option<CudaSlice<u16>>,
}

impl BlockOut {
    /// What the block's backward reads, given its input norm's input `x` and `rstd1`.
    fn into_saved(self, x: NormIn, rstd1: CudaSlice<f32>) -> BlockSaved {
        BlockSaved {
            x,
            rstd1,
            x1: NormIn::of(self.x1, self.xq2),
            core: self.core,
        }
    }
}

/// What [`GpuLlama::backward`] reads.
pub struct GpuLlamaSaved {
    b: usize,
    t: usize,
    starts: CudaSlice<i32>,
    rows: CudaSlice<i32>,
    /// What the blocks `inputs.len()..` that keep their state keep, in order.
    blocks: Vec<BlockSaved>,
    /// The residual entering each recomputed block, `0..inputs.len()`.
    inputs: Vec<CudaSlice<f32>>,
    /// LoRA: the dropout round of the forward, which its recomputation draws again.
    dropout_round: Option<u64>,
    xf: NormIn,
    rstd_f: CudaSlice<f32>,
    /// The LM head's input gradient (f32 `(N, C)`), formed in forward.
    dh: CudaSlice<f32>,
}

impl GpuLlamaSaved {
    /// Device bytes kept for backward (activations, FP8 copies, the LM head input gradient).
    pub fn bytes(&self) -> usize {
        self.bytes_by_kind().iter().map(|(_, b)| b).sum()
    }

    /// [`GpuLlamaSaved::bytes`] by kind ([`SAVED_KINDS`]), each buffer
    /// counted once however many layers share it.
    pub fn bytes_by_kind(&self) -> Vec<(&'static str, usize)> {
        let mut kinds = [0usize; SAVED_KINDS.len()];
        for b in &self.blocks {
            b.add_bytes(&mut kinds);
        }
        kinds[6] += 4 * self.inputs.iter().map(CudaSlice::len).sum::<usize>();
        kinds[7] += self.xf.bytes()
            + 4 * self.rstd_f.len()
            + 4 * self.dh.len()
            + 4 * (self.starts.len() + self.rows.len());
        SAVED_KINDS.into_iter().zip(kinds).collect()
    }
}

/// Each token id's rows in `tokens`, for the deterministic embedding backward:
/// `starts (V + 1)` and `rows (N)` such that id `v` occurs at rows
/// `rows[starts[v]..starts[v + 1]]`, in increasing order (ids below `v`).
pub fn token_rows(tokens: &[u32], v: usize) -> (Vec<i32>, Vec<i32>) {
    let mut starts = vec![0i32; v + 1];
    for &tok in tokens {
        starts[tok as usize + 1] += 1;
    }
    for i in 0..v {
        starts[i + 1] += starts[i];
    }
    let mut fill = starts.clone();
    let mut rows = vec![0i32; tokens.len()];
    for (r, &tok) in tokens.iter().enumerate() {
        rows[fill[tok as usize] as usize] = r as i32;
        fill[tok as usize] += 1;
    }
    (starts, rows)
}

/// The last output of a group of projections (pop order: last layer first).
fn next_out(outs: &mut Vec<(CudaSlice<u16>, ProjSaved)>) -> Result<(CudaSlice<u16>, ProjSaved)> {
    outs.pop()
        .ok_or_else(|| Error::Shape("a shared forward returned too few outputs".into()))
}

fn grid1(n: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (n.div_ceil(256) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// A grid-stride launch over `n` items: at most 2048 blocks of 256 (16 a
/// multiprocessor on the H100), so that a kernel's per-block amax atomics stay few.
fn grid_stride(n: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (n.div_ceil(256).clamp(1, 2048) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Tensors a launch of `add_many` (elementwise.cu's `ADD_MANY`).
const ADD_MANY: usize = 8;

/// `add_many`'s list (elementwise.cu's `struct AddMany`): source addresses,
/// offsets into the gradient buffer, lengths.
#[repr(C)]
#[derive(Clone, Copy)]
struct AddMany {
    src: [u64; ADD_MANY],
    off: [u64; ADD_MANY],
    n: [u64; ADD_MANY],
}

// SAFETY: `#[repr(C)]` plain data laid out as elementwise.cu's `struct AddMany`
// (three arrays of eight 8-byte words).
unsafe impl DeviceRepr for AddMany {}

/// Tensors a launch of `adamw_many` (optim.cu's `ADAM_MANY`).
const ADAM_MANY: usize = 64;

/// The largest tensor `adamw_many` takes (elements): a LoRA adapter of the
/// ~1B model has 33K-90K, a norm gain thousands; larger ones launch alone.
const ADAM_MANY_MOST: usize = 1 << 20;

/// One tensor of `adamw_many` (optim.cu's `struct AdamTensor`, 48 bytes):
/// elements `off .. off + n` of the flat buffers, the device addresses of
/// its bf16 copy and transposed copy (0: none), the copy's row length for
/// the transpose, the weight decay.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct AdamTensor {
    off: u64,
    n: u64,
    out: u64,
    out_t: u64,
    t_cols: u64,
    wd: f32,
    pad: f32,
}

/// `adamw_many`'s list (optim.cu's `struct AdamMany`; 3 KB, within a
/// kernel's 4 KB of parameters).
#[repr(C)]
#[derive(Clone, Copy)]
struct AdamMany {
    t: [AdamTensor; ADAM_MANY],
}

// SAFETY: both are `#[repr(C)]` plain data laid out as their optim.cu twins
// (8-byte words and two 4-byte floats; no padding inside).
unsafe impl DeviceRepr for AdamTensor {}
unsafe impl DeviceRepr for AdamMany {}

// The kernels' structs have these sizes (a mismatch would shift every
// argument after them); AdamMany must fit a kernel's 4 KB of parameters
// beside adamw_many's other 60 bytes.
const _: () = assert!(std::mem::size_of::<AddMany>() == 192);
const _: () = assert!(std::mem::size_of::<AdamTensor>() == 48);
const _: () = assert!(std::mem::size_of::<AdamMany>() == 48 * ADAM_MANY);
const _: () = assert!(std::mem::size_of::<AdamMany>() + 60 <= 4096);

/// An AdamW update's copies of `n` weights: the bf16 copy holds `n`; the
/// transposed one (a LoRA B's B^T) needs the bf16 copy too, holds `n`, in
/// rows of `cols` that divide `n`.
fn check_adamw_copies(
    n: usize,
    out: &Option<&mut CudaSlice<u16>>,
    out_t: &Option<(&mut CudaSlice<u16>, usize)>,
) -> Result<()> {
    if out.as_ref().is_some_and(|o| o.len() != n) {
        return Err(Error::Shape(format!(
            "AdamW bf16 copy of {} elements for {n} weights",
            out.as_ref().map_or(0, |o| o.len())
        )));
    }
    if let Some((t, cols)) = out_t {
        if out.is_none() || t.len() != n || *cols == 0 || !n.is_multiple_of(*cols) {
            return Err(Error::Shape(format!(
                "AdamW transposed copy of {} elements in rows of {cols} for {n} weights (and a bf16 copy)",
                t.len()
            )));
        }
    }
    Ok(())
}

/// Push an optional amax (`amax_bits`, `nonfinite`) as two kernel pointers (null when `None`).
fn push_amax<'a>(
    lb: &mut cudarc::driver::LaunchArgs<'a>,
    amax: &'a mut Option<TensorAmax>,
    null: &'a u64,
) {
    match amax {
        Some(a) => lb.arg(&mut a.amax_bits).arg(&mut a.nonfinite),
        None => lb.arg(null).arg(null),
    };
}

/// The widest row `rmsnorm_fwd_v4` takes: 4 groups of 4 columns for each of
/// [`rows_cfg`]'s 256 threads (`NORM_FWD_GROUPS` in norm.cu).
const NORM_FWD_V4_MAX: usize = 4 * 4 * 256;

/// Push `x`, or a null pointer when the kernel is not to write it.
fn push_f32_or_null<'a>(
    lb: &mut cudarc::driver::LaunchArgs<'a>,
    x: Option<&'a mut CudaSlice<f32>>,
    null: &'a u64,
) {
    match x {
        Some(x) => lb.arg(x),
        None => lb.arg(null),
    };
}

fn rows_cfg(rows: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (rows as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Shared bytes of the SIMT attention kernels for head dim `d`: `(fwd, dkdv, dq)`.
fn attn_smem(d: usize) -> (usize, usize, usize) {
    let tile = TILE * (d + 1);
    let p = TILE * (TILE + 1);
    (
        4 * (3 * tile + p),
        4 * (4 * tile + 2 * p + 2 * TILE),
        4 * (4 * tile + p),
    )
}

/// The module name of projection `li` (q, k, v, o, gate, up, down) of block
/// `bi`, as the CPU `Llama` names it.
fn lin_name(bi: usize, li: usize) -> String {
    let module = crate::llama::PROJ_NAMES[li % 7].1;
    format!("model.layers.{bi}.{module}")
}

/// Where block `i`'s parameters sit among the slots (checkpoint order,
/// [`Llama::param_shapes`]), found by name: a family's biases and q/k norms
/// add slots to each block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct BlockSlots {
    /// The block's first slot and one past its last.
    range: (usize, usize),
    /// The gains of the norms before the attention and the MLP.
    attn_norm: usize,
    mlp_norm: usize,
    /// The q, k, v, o, gate, up and down weights.
    lin: [usize; 7],
    /// The q, k, v and o biases (Qwen2's q/k/v; `attention_bias`'s all four).
    bias: [Option<usize>; 4],
    /// Qwen3's per-head q and k norm gains.
    qk_norm: Option<(usize, usize)>,
}

impl BlockSlots {
    /// Block `i` of a model of `cfg`.
    fn of(cfg: &LlamaConfig, i: usize) -> Result<BlockSlots> {
        let names = crate::llama::block_param_shapes(cfg, i);
        let start = 1 + i * names.len();
        let at = |suffix: &str| {
            names
                .iter()
                .position(|(n, _)| n.ends_with(suffix))
                .map(|p| start + p)
        };
        let need = |suffix: &str| {
            at(suffix).ok_or_else(|| Error::Shape(format!("block {i} has no {suffix}")))
        };
        let mut lin = [0; 7];
        for (slot, (_, module)) in lin.iter_mut().zip(crate::llama::PROJ_NAMES) {
            *slot = need(&format!("{module}.weight"))?;
        }
        let bias = ["q_proj", "k_proj", "v_proj", "o_proj"].map(|m| at(&format!("{m}.bias")));
        let qk_norm = match (at("q_norm.weight"), at("k_norm.weight")) {
            (Some(q), Some(k)) => Some((q, k)),
            _ => None,
        };
        Ok(BlockSlots {
            range: (start, start + names.len()),
            attn_norm: need("input_layernorm.weight")?,
            mlp_norm: need("post_attention_layernorm.weight")?,
            lin,
            bias,
            qk_norm,
        })
    }

    /// The block's slot indices, in order.
    fn ids(&self) -> std::ops::Range<usize> {
        self.range.0..self.range.1
    }
}

/// The final norm's slot: after the embedding and every block's.
fn final_norm_slot(cfg: &LlamaConfig) -> usize {
    1 + cfg.num_hidden_layers * crate::llama::block_param_shapes(cfg, 0).len()
}

/// The rotary tables `(cos, sin)` of `cfg` on the device.
fn rope_tables(gpu: &Gpu, cfg: &LlamaConfig) -> Result<(CudaSlice<f32>, CudaSlice<f32>)> {
    let rope = crate::rope::Rope::for_config(cfg).map_err(|e| Error::Shape(e.to_string()))?;
    let (cos, sin) = rope.tables_f32();
    Ok((gpu.upload(&cos)?, gpu.upload(&sin)?))
}

// Buffers from `alloc_uninit` in this file are outputs that the next kernel
// or GEMM writes in full (every row below B*T, every column); the selftest's
// comparisons against the CPU model would show any element left unwritten.
impl<'g> GpuLlama<'g> {
    /// A model from named weights (Hugging Face names, any dtype; missing,
    /// extra or misshapen tensors are errors naming the tensor), its block
    /// matrices under `recipe` (`None`: bf16). The optimizer moments start at zero.
    pub fn new(
        gpu: &'g Gpu,
        cfg: &LlamaConfig,
        weights: &HashMap<String, Tensor>,
        recipe: Option<Recipe>,
    ) -> Result<GpuLlama<'g>> {
        Self::build(gpu, cfg, weights, recipe, None)
    }

    /// [`GpuLlama::new`] as one rank of sharded data parallel over `comm`:
    /// every rank passes the same full weights and keeps its shard of the
    /// masters and optimizer state (see the module's sharding notes).
    pub fn new_sharded(
        gpu: &'g Gpu,
        cfg: &LlamaConfig,
        weights: &HashMap<String, Tensor>,
        recipe: Option<Recipe>,
        comm: &'g NcclComm,
    ) -> Result<GpuLlama<'g>> {
        Self::build(gpu, cfg, weights, recipe, Some(comm))
    }

    fn build(
        gpu: &'g Gpu,
        cfg: &LlamaConfig,
        weights: &HashMap<String, Tensor>,
        recipe: Option<Recipe>,
        comm: Option<&'g NcclComm>,
    ) -> Result<GpuLlama<'g>> {
        cfg.validate().map_err(|e| Error::Shape(e.to_string()))?;
        check_config(cfg)?;
        let d = cfg.head_dim();
        if d > MAX_HEAD_DIM {
            return Err(Error::Shape(format!(
                "head_dim {d}: the GPU attention kernels take at most {MAX_HEAD_DIM}"
            )));
        }
        let f = load_fns(gpu, d)?;
        // Flat parameter buffers in checkpoint order.
        let mut slots = Vec::new();
        let mut host = Vec::with_capacity(cfg.num_params());
        let mut remaining: HashMap<&str, &Tensor> =
            weights.iter().map(|(k, v)| (k.as_str(), v)).collect();
        for (name, shape) in Llama::param_shapes(cfg) {
            let t = remaining
                .remove(name.as_str())
                .ok_or_else(|| Error::Shape(format!("missing tensor {name}")))?;
            if t.shape() != shape.as_slice() {
                return Err(Error::Shape(format!(
                    "tensor {name} has shape {:?}, expected {shape:?}",
                    t.shape()
                )));
            }
            let numel = t.numel();
            slots.push(Slot {
                offset: host.len(),
                numel,
                decay: shape.len() >= 2,
                name,
                shape,
            });
            host.extend(t.to_f32_vec());
        }
        if cfg.tie_word_embeddings {
            remaining.remove("lm_head.weight");
        }
        if let Some(extra) = remaining.keys().next() {
            return Err(Error::Shape(format!(
                "unexpected tensor {extra} for this config"
            )));
        }
        let p = host.len();
        let bf16_of = |slot: &Slot| -> Result<CudaSlice<u16>> {
            let b: Vec<half::bf16> = host[slot.offset..slot.offset + slot.numel]
                .iter()
                .map(|&x| half::bf16::from_f32(x))
                .collect();
            gpu.upload_bf16(&b)
        };
        let mut blocks = Vec::with_capacity(cfg.num_hidden_layers);
        for i in 0..cfg.num_hidden_layers {
            let bs = BlockSlots::of(cfg, i)?;
            let mut lin = Vec::with_capacity(7);
            for &s in &bs.lin {
                let slot = &slots[s];
                lin.push(GpuLinear::new(
                    gpu,
                    bf16_of(slot)?,
                    slot.shape[0],
                    slot.shape[1],
                    recipe,
                )?);
            }
            blocks.push(Block {
                slots: bs,
                lin,
                lora: Vec::new(),
                adapter_slots: [None; 7],
            });
        }
        let embed_slot = 0;
        let norm_slot = final_norm_slot(cfg);
        let head_slot = if cfg.tie_word_embeddings {
            embed_slot
        } else {
            norm_slot + 1
        };
        let head = bf16_of(&slots[head_slot])?;
        let (master, grad_len, shard) = match comm {
            None => (gpu.upload(&host)?, p, None),
            Some(comm) => {
                let mut lin_slots = std::collections::HashSet::new();
                for blk in &blocks {
                    lin_slots.extend(blk.slots.lin);
                }
                Self::shard_state(
                    gpu,
                    comm,
                    &mut slots,
                    &host,
                    &lin_slots,
                    head_slot,
                    recipe,
                    &mut blocks,
                )?
            }
        };
        let (cos, sin) = rope_tables(gpu, cfg)?;
        Ok(GpuLlama {
            gpu,
            cfg: cfg.clone(),
            f,
            slots,
            grad: gpu.alloc_zeros(grad_len, "gradients")?,
            grad_unwritten: Vec::new(),
            m: gpu.alloc_zeros(master.len(), "AdamW first moments")?,
            v: gpu.alloc_zeros(master.len(), "AdamW second moments")?,
            master,
            blocks,
            head,
            embed_slot,
            norm_slot,
            head_slot,
            cos,
            sin,
            step: 0,
            check_layers: false,
            head_chunk: GPU_HEAD_CHUNK,
            ones: None,
            fuse_amax: true,
            saved_activations: SavedActivations::Full,
            recompute: 0,
            prof: Prof::from_env()?,
            shard,
            lora: None,
        })
    }

    /// Launch shape of an attention kernel: one block per tile of rows of a head.
    fn attn_cfg(k: &AttnKernel, t: usize, heads: usize, b: usize) -> LaunchConfig {
        LaunchConfig {
            grid_dim: (t.div_ceil(k.rows) as u32, heads as u32, b as u32),
            block_dim: (k.threads, 1, 1),
            shared_mem_bytes: k.smem as u32,
        }
    }

    /// A zeroed amax for the kernel that writes the input (or, with `grad`,
    /// the grad_output) of projection `li` of block `bi`, when that
    /// projection's quantizer reads one (see [`GpuLlama::fuse_amax`]); `None` otherwise.
    fn amax_for(&self, bi: usize, li: usize, grad: bool) -> Result<Option<TensorAmax>> {
        let Some(blk) = self.blocks.get(bi) else {
            return Ok(None);
        };
        let takes = match (blk.lin.get(li), blk.lora.get(li)) {
            (Some(l), _) => l.takes_amax(),
            (None, Some(l)) => l.takes_amax(grad),
            (None, None) => false,
        };
        Ok(if self.fuse_amax && takes {
            Some(self.gpu.alloc_amax()?)
        } else {
            None
        })
    }

    /// Whether the attention backward stores bf16 gradients with RoPE's
    /// backward applied itself (Hopper's wgmma kernels, head dim 64 or 128).
    pub fn attention_fused_store(&self) -> bool {
        self.f.attn.tma
    }

    /// Whether attention runs on tensor cores (head dim 16, 32, 64 or 128).
    pub fn attention_on_tensor_cores(&self) -> bool {
        self.f.attn.tensor_cores
    }

    /// Activation recomputation of the first `blocks` blocks (all of them at
    /// or above the model's depth; 0: none): a training forward keeps only
    /// the residual entering each of them (f32, `4 B T C` bytes a block), and
    /// backward runs that block's forward again just before its backward.
    /// The step's results are the same bits as without it: the recomputed
    /// forward runs the same kernels on the same inputs, delayed scaling's
    /// amax records take a maximum, LoRA dropout draws the forward's masks,
    /// and stochastic rounding is salted by gradient quantizations only.
    /// Each recomputed block's activations give way to its input, for one
    /// more forward of the block (less its last product, whose output
    /// nothing reads). Sharded, a recomputed block's weights are gathered
    /// again for its backward. Set between steps.
    pub fn set_recompute(&mut self, blocks: usize) {
        self.recompute = blocks;
    }

    /// How many blocks (from the first) are recomputed.
    pub fn recompute(&self) -> usize {
        self.recompute.min(self.blocks.len())
    }

    /// Whether the block linears' per-tensor FP8 forward products use
    /// cuBLASLt's fast accumulation ([`GpuLinear::fast_accum`], on by
    /// default); gradient products never do.
    pub fn set_fast_accum(&mut self, on: bool) {
        for blk in &mut self.blocks {
            for l in &mut blk.lin {
                l.fast_accum = on;
            }
            for l in &mut blk.lora {
                l.fast_accum = on;
            }
        }
    }

    /// Record numerics telemetry (amax, saturated and underflowed shares) of
    /// every block linear's quantizations from now on (or stop).
    pub fn set_telemetry(&mut self, on: bool) {
        for blk in &mut self.blocks {
            for l in &mut blk.lin {
                l.telemetry_on = on;
            }
        }
    }

    /// The block linears with their module names (`model.layers.{i}.{module}`,
    /// as the CPU `Llama` names them); none in LoRA mode.
    fn named_lin(&self) -> impl Iterator<Item = (String, &GpuLinear)> + '_ {
        self.blocks.iter().enumerate().flat_map(|(i, blk)| {
            blk.lin
                .iter()
                .enumerate()
                .map(move |(li, l)| (lin_name(i, li), l))
        })
    }

    /// Telemetry of each block linear's last recorded quantizations:
    /// `(module name, role, telemetry)`, as `crate::llama::Llama::telemetry`.
    pub fn telemetry(&self) -> Result<Vec<(String, octet_fp8::Role, octet_fp8::Telemetry)>> {
        self.per_lin_role(|l| l.telemetry(self.gpu))
    }

    /// `f`'s per-role values of every block linear, with the module's name.
    fn per_lin_role<T>(
        &self,
        f: impl Fn(&GpuLinear) -> Result<Vec<(octet_fp8::Role, T)>>,
    ) -> Result<Vec<(String, octet_fp8::Role, T)>> {
        let mut out = Vec::new();
        for (name, l) in self.named_lin() {
            for (role, t) in f(l)? {
                out.push((name.clone(), role, t));
            }
        }
        Ok(out)
    }

    /// The delayed-scaling states of the block linears, `(module name, role,
    /// state)` as `crate::llama::Llama::scaling_state` names them (empty
    /// for other recipes): what a checkpoint keeps.
    pub fn scaling_state(&self) -> Result<Vec<(String, octet_fp8::Role, octet_fp8::DelayedState)>> {
        self.per_lin_role(|l| l.delayed_states(self.gpu))
    }

    /// Restore states from [`GpuLlama::scaling_state`] (or a CPU checkpoint's);
    /// an unknown module name is an error.
    pub fn set_scaling_state(
        &mut self,
        states: &[(String, octet_fp8::Role, octet_fp8::DelayedState)],
    ) -> Result<()> {
        let gpu = self.gpu;
        let index: HashMap<String, (usize, usize)> = self
            .blocks
            .iter()
            .enumerate()
            .flat_map(|(bi, blk)| (0..blk.lin.len()).map(move |li| (lin_name(bi, li), (bi, li))))
            .collect();
        for (name, role, st) in states {
            let &(bi, li) = index
                .get(name)
                .ok_or_else(|| Error::Shape(format!("scaling state for unknown module {name}")))?;
            self.blocks[bi].lin[li].set_delayed_state(gpu, *role, st)?;
        }
        Ok(())
    }

    /// Milliseconds spent per phase since the model was made (empty unless
    /// the `OCTET_PROFILE` environment variable is set).
    pub fn profile(&self) -> Vec<(&'static str, f64)> {
        self.prof.acc.clone()
    }

    fn mark(&mut self, what: &'static str) -> Result<()> {
        let gpu = self.gpu;
        self.prof.mark(gpu, what)
    }

    /// Parameter count.
    pub fn num_params(&self) -> usize {
        self.slots.iter().map(|s| s.numel).sum()
    }

    /// Device bytes of parameters, gradients and optimizer state (f32 each)
    /// and the bf16 compute copies.
    pub fn state_bytes(&self) -> usize {
        self.state_by_kind().iter().map(|(_, b)| b).sum()
    }

    /// [`GpuLlama::state_bytes`] by kind: the f32 masters, AdamW's two
    /// moments, the gradients, the bf16 compute copies the GEMMs read, a
    /// sharded run's gathered weights and shards, and a LoRA run's frozen
    /// base and adapters' bf16 copies (kinds of zero bytes left out).
    pub fn state_by_kind(&self) -> Vec<(&'static str, usize)> {
        let sharded = self.shard.as_ref().map_or(0, |sh| {
            4 * (sh.gshard.len() + sh.rep.len())
                + 2 * sh.wsh.iter().flatten().map(|w| w.len()).sum::<usize>()
        });
        // Only in LoRA mode: otherwise `base_bytes` is the bf16 compute
        // copies, counted below.
        let base = self
            .lora
            .as_ref()
            .map_or(0, |lm| 4 * lm.rep.len() + self.base_bytes());
        let adapters = self
            .blocks
            .iter()
            .flat_map(|b| &b.lora)
            .filter_map(|l| l.adapter.as_ref())
            .map(|a| 2 * (a.a.len() + a.b.len()))
            .sum::<usize>();
        let copies = 2 * self.head.len()
            + self
                .blocks
                .iter()
                .flat_map(|b| &b.lin)
                .map(|l| 2 * l.weight.len())
                .sum::<usize>();
        [
            ("f32 masters", 4 * self.master.len()),
            ("AdamW moments (f32)", 8 * self.master.len()),
            ("gradients (f32)", 4 * self.grad.len()),
            ("bf16 compute copies", copies + adapters),
            ("sharded gathers and shards", sharded),
            ("frozen LoRA base", base),
        ]
        .into_iter()
        .filter(|(_, b)| *b > 0)
        .collect()
    }

    /// The f32 values of parameter `s` the kernels read (embedding, norm gains).
    fn slot_view(&self, s: usize) -> Result<cudarc::driver::CudaView<'_, f32>> {
        if let Some(lm) = &self.lora {
            let sl = &lm.base_slots[s];
            let off = lm.rep_off[s]
                .ok_or_else(|| Error::Shape(format!("{} has no f32 copy in LoRA mode", sl.name)))?;
            return Ok(lm.rep.slice(off..off + sl.numel));
        }
        let sl = &self.slots[s];
        match &self.shard {
            None => Ok(self.master.slice(sl.offset..sl.offset + sl.numel)),
            Some(sh) => {
                let off = sh.rep_off[s].ok_or_else(|| {
                    Error::Shape(format!("{} has no full f32 copy on this rank", sl.name))
                })?;
                Ok(sh.rep.slice(off..off + sl.numel))
            }
        }
    }

    /// [`GpuLinear::recording`] on every block linear.
    fn set_recording(&mut self, on: bool) {
        for blk in &mut self.blocks {
            for l in &mut blk.lin {
                l.recording = on;
            }
        }
    }

    /// The f32 masters as named tensors (checkpoint order).
    pub fn weights(&self) -> Result<Vec<(String, Tensor)>> {
        let host = self.per_slot(&self.master)?;
        self.named(host)
    }

    /// The gradients accumulated so far, as named tensors (for tests). Sharded:
    /// the reduce-scattered (summed over ranks) gradients, gathered.
    pub fn grads(&self) -> Result<Vec<(String, Tensor)>> {
        let host = match &self.shard {
            Some(sh) => self.per_slot(&sh.gshard)?,
            None => self.per_slot(&self.grad)?,
        };
        self.named(host)
    }

    /// `(masters, first moments, second moments)` per parameter, in order.
    pub fn optimizer_state(&self) -> Result<Vec<MasterMoments>> {
        let (p, m, v) = (
            self.per_slot(&self.master)?,
            self.per_slot(&self.m)?,
            self.per_slot(&self.v)?,
        );
        Ok(p.into_iter()
            .zip(m)
            .zip(v)
            .map(|((p, m), v)| (p, m, v))
            .collect())
    }

    /// Restore moments and the step count (resume); masters come with [`GpuLlama::new`].
    pub fn set_moments(&mut self, m: &[Vec<f32>], v: &[Vec<f32>], step: u64) -> Result<()> {
        if m.len() != self.slots.len() || v.len() != self.slots.len() {
            return Err(Error::Shape(format!(
                "optimizer state for {} tensors, the model has {}",
                m.len(),
                self.slots.len()
            )));
        }
        let mut hm = Vec::with_capacity(self.master.len());
        let mut hv = Vec::with_capacity(self.master.len());
        for ((s, a), b) in self.slots.iter().zip(m).zip(v) {
            if a.len() != s.numel || b.len() != s.numel {
                return Err(Error::Shape(format!(
                    "optimizer state of {} has {} elements, expected {}",
                    s.name,
                    a.len(),
                    s.numel
                )));
            }
            hm.extend_from_slice(a);
            hv.extend_from_slice(b);
        }
        if let Some(sh) = &self.shard {
            let (hm_full, hv_full) = (hm, hv);
            hm = Vec::with_capacity(self.master.len());
            hv = Vec::with_capacity(self.master.len());
            let mut off = 0;
            for (s, part) in self.slots.iter().zip(&sh.parts) {
                hm.extend(part.mine(&hm_full[off..off + s.numel], sh.comm.rank()));
                hv.extend(part.mine(&hv_full[off..off + s.numel], sh.comm.rank()));
                off += s.numel;
            }
        }
        self.m = self.gpu.upload(&hm)?;
        self.v = self.gpu.upload(&hv)?;
        self.step = step;
        Ok(())
    }

    fn named(&self, per_slot: Vec<Vec<f32>>) -> Result<Vec<(String, Tensor)>> {
        self.slots
            .iter()
            .zip(per_slot)
            .map(|(s, v)| Ok((s.name.clone(), Tensor::from_f32(&s.shape, v)?)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adapter_params_are_the_cpu_lora_models_params() {
        use crate::lora::{BaseFormat, Compute};
        let mut cfg = LlamaConfig::preset("tiny").unwrap();
        cfg.num_key_value_heads = 1;
        let spec = LoraSpec {
            rank: 4,
            alpha: 8.0,
            targets: vec!["q".into(), "v".into(), "down".into()],
            base: BaseFormat::Bf16,
            compute: Compute::Bf16,
            recipe: Recipe::from_name("tensorwise")
                .unwrap()
                .with_backward(octet_fp8::BackwardMode::HighPrecision)
                .unwrap(),
            seed: 1,
            dropout: 0.0,
        };
        let cpu = Llama::new_random(&cfg, octet_tensor::DType::F32, None, 3)
            .unwrap()
            .into_lora(&spec)
            .unwrap();
        let want: Vec<(String, Vec<usize>)> = cpu
            .params()
            .into_iter()
            .map(|(n, t)| (n, t.shape().to_vec()))
            .collect();
        assert_eq!(GpuLlama::adapter_params(&cfg, &spec), want);
    }

    #[test]
    fn token_rows_lists_each_ids_rows_in_order() {
        let tokens = [3u32, 0, 3, 1, 3, 0];
        let (starts, rows) = token_rows(&tokens, 5);
        assert_eq!(starts, vec![0, 2, 3, 3, 6, 6]);
        assert_eq!(rows, vec![1, 5, 3, 0, 2, 4]);
        // Every row appears once, under its own id.
        for v in 0..5 {
            for &r in &rows[starts[v] as usize..starts[v + 1] as usize] {
                assert_eq!(tokens[r as usize] as usize, v);
            }
        }
    }
}

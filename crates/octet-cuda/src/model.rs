//! Training a Llama model on the GPU: the same model as `octet_nn::llama`
//! (RMSNorm, RoPE, causal grouped-query attention, SwiGLU, untied or tied LM
//! head, cross-entropy), with explicit forward and backward, the block
//! matrices as [`GpuLinear`]s under the run's recipe, and AdamW on the device.
//!
//! Precision: parameters live as one flat f32 buffer (the optimizer's masters,
//! in [`octet_nn::llama::Llama::param_shapes`] order); the block matrices and
//! the LM head also have bf16 compute copies, rewritten by the AdamW kernel.
//! The residual stream and the gradients flowing through it are f32; the
//! inputs of matrix products are bf16, and so are the blocks' input
//! gradients (those of the projections reading one input summed by their
//! GEMMs, each adding in f32 and rounding once, as autocast PyTorch sums
//! them; the LM head's is f32); the logits are f32. The embedding and the
//! LM head stay in high precision (bf16 products), as on the CPU.
//!
//! Kernels: `kernels/train.cu` (attention is flash-style: the forward keeps
//! the per-row log-sum-exp, the backward recomputes probabilities tile by
//! tile; nothing of size T x T is stored). Every reduction runs in a fixed
//! order, so a step is deterministic on a given GPU.

use crate::linear::{forward_shared, forward_shared_with, GpuLinear, GpuLinearSaved};
use crate::lora::{
    forward_group, forward_group_with, GpuAdapter, GpuBase, GpuLoraLinear, GpuLoraSaved,
};
use crate::nccl::{NcclComm, Reduce};
use crate::tma::TmaMap;
use crate::{nvrtc, AddTo, DeviceFp8, Error, GemmDst, GemmOut, Gpu, Result, TensorAmax};
use cudarc::driver::{
    CudaFunction, CudaSlice, CudaView, DevicePtr, DevicePtrMut, DeviceRepr, LaunchConfig,
    PushKernelArg, ValidAsZeroBits,
};
use octet_fp8::Recipe;
use octet_nn::llama::{Llama, LlamaConfig, LoraSpec, PROJ_NAMES};
use octet_nn::lora::Dropout;
use octet_tensor::Tensor;
use std::collections::HashMap;
use std::rc::Rc;

mod shard;
use shard::Sharding;

/// Largest head dimension of the attention kernels.
pub const MAX_HEAD_DIM: usize = 128;

/// Why the GPU model and decoder cannot run `cfg`, if they cannot: the
/// family switches of `octet_nn::llama::LlamaConfig` the kernels do not
/// implement yet (q/k/v/o biases, Qwen3's per-head q/k norms, a head width
/// other than `hidden_size / num_attention_heads`). The CPU model runs them
/// all; the message names the field and says so.
pub fn unsupported_config(cfg: &LlamaConfig) -> Option<String> {
    let what = if cfg.qkv_bias || cfg.o_bias {
        "attention_bias (biases on the attention projections: Qwen2/2.5, or Llama's attention_bias)"
            .to_string()
    } else if cfg.qk_norm {
        "qk_norm (Qwen3's per-head RMSNorm of q and k)".to_string()
    } else if cfg.head_dim() * cfg.num_attention_heads != cfg.hidden_size {
        format!(
            "head_dim {} other than hidden_size {} / num_attention_heads {}",
            cfg.head_dim(),
            cfg.hidden_size,
            cfg.num_attention_heads
        )
    } else {
        return None;
    };
    Some(format!(
        "the GPU model does not implement {what} yet; the CPU runs this model (--device cpu)"
    ))
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

struct Fns {
    embed_fwd: CudaFunction,
    embed_bwd: CudaFunction,
    norm_fwd: CudaFunction,
    /// The vectorized forward for hidden sizes that are multiples of 4, up to
    /// [`NORM_FWD_V4_MAX`] (`rmsnorm_fwd_v4` in train.cu).
    norm_fwd_v4: CudaFunction,
    norm_bwd: CudaFunction,
    norm_bwd_v4: CudaFunction,
    norm_bwd_b16: CudaFunction,
    norm_bwd_b16_v4: CudaFunction,
    sum_partials: CudaFunction,
    rope_fwd: CudaFunction,
    rope_bwd: CudaFunction,
    swiglu_fwd: CudaFunction,
    swiglu_bwd: CudaFunction,
    /// SwiGLU keeping its inputs in FP8: `[scalar, 8 columns a thread]` of forward, backward.
    swiglu_fwd_q: [CudaFunction; 2],
    swiglu_bwd_q: [CudaFunction; 2],
    add: CudaFunction,
    /// Up to [`ADD_MANY`] gradients into the flat buffer in one launch.
    add_many: CudaFunction,
    add_bf16: CudaFunction,
    to_bf16: CudaFunction,
    xent: CudaFunction,
    sumsq: CudaFunction,
    adamw: CudaFunction,
    /// `adamw` over up to [`ADAM_MANY`] tensors without amax in one launch.
    adamw_many: CudaFunction,
    attn_delta: CudaFunction,
    attn: Attn,
}

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
    /// Slot indices of the two norm gains.
    attn_norm: usize,
    mlp_norm: usize,
    /// q, k, v, o, gate, up, down (empty in LoRA mode).
    lin: Vec<GpuLinear>,
    /// Slot index of each linear's weight (LoRA mode: in [`LoraMode::base_slots`]).
    lin_slot: [usize; 7],
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
    /// On under `OCTET_PROFILE=1` ([`crate::profile_enabled`]).
    fn from_env() -> Result<Prof> {
        Ok(Prof {
            on: crate::profile_enabled()?,
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
    /// ([`crate::lora::GpuLoraLinear::fp8_saved_input`]), as they always do
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
    Linear(Rc<std::cell::RefCell<crate::linear::Quant>>),
    /// The o adapter's saved E4M3 input (LoRA, counted with o's saved state).
    Lora(Rc<crate::lora::Fp8Input>),
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
/// (`BwdStore` in train.cu, same layout): device addresses, 0 for none.
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
                crate::linear::Quant::Tensor(d) => f(OutRef::Fp8(&d.rowwise, &d.scale_inv)),
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
struct BlockCore {
    /// q, k, v, o, gate, up, down.
    lin: Vec<ProjSaved>,
    q: CudaSlice<u16>,
    k: CudaSlice<u16>,
    v: CudaSlice<u16>,
    a: AttnOut,
    lse: CudaSlice<f32>,
    rstd2: CudaSlice<f32>,
    swiglu: SwigluIn,
}

impl BlockSaved {
    /// Bytes kept, each buffer counted once however many layers share it.
    fn bytes(&self) -> usize {
        let c = &self.core;
        let mut seen = std::collections::HashSet::new();
        let a = match &c.a {
            AttnOut::Bf16(a) => {
                seen.insert(Rc::as_ptr(a) as usize);
                2 * a.len()
            }
            _ => 0,
        };
        a + self.x.bytes()
            + self.x1.bytes()
            + c.swiglu.bytes()
            + 4 * (self.rstd1.len() + c.lse.len() + c.rstd2.len())
            + 2 * (c.q.len() + c.k.len() + c.v.len())
            + c.lin
                .iter()
                .map(|l| l.bytes_unique(&mut seen))
                .sum::<usize>()
    }
}

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
    hf: CudaSlice<u16>,
    dlogits: CudaSlice<u16>,
}

impl GpuLlamaSaved {
    /// Device bytes kept for backward (activations, FP8 copies, the logits gradient).
    pub fn bytes(&self) -> usize {
        self.blocks.iter().map(BlockSaved::bytes).sum::<usize>()
            + 4 * self.inputs.iter().map(CudaSlice::len).sum::<usize>()
            + self.xf.bytes()
            + 4 * self.rstd_f.len()
            + 2 * (self.hf.len() + self.dlogits.len())
            + 4 * (self.starts.len() + self.rows.len())
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

/// Tensors a launch of `add_many` (train.cu's `ADD_MANY`).
const ADD_MANY: usize = 8;

/// `add_many`'s list (train.cu's `struct AddMany`): source addresses,
/// offsets into the gradient buffer, lengths.
#[repr(C)]
#[derive(Clone, Copy)]
struct AddMany {
    src: [u64; ADD_MANY],
    off: [u64; ADD_MANY],
    n: [u64; ADD_MANY],
}

// SAFETY: `#[repr(C)]` plain data laid out as train.cu's `struct AddMany`
// (three arrays of eight 8-byte words).
unsafe impl DeviceRepr for AddMany {}

/// Tensors a launch of `adamw_many` (train.cu's `ADAM_MANY`).
const ADAM_MANY: usize = 64;

/// The largest tensor `adamw_many` takes (elements): a LoRA adapter of the
/// ~1B model has 33K-90K, a norm gain thousands; larger ones launch alone.
const ADAM_MANY_MOST: usize = 1 << 20;

/// One tensor of `adamw_many` (train.cu's `struct AdamTensor`, 48 bytes):
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

/// `adamw_many`'s list (train.cu's `struct AdamMany`; 3 KB, within a
/// kernel's 4 KB of parameters).
#[repr(C)]
#[derive(Clone, Copy)]
struct AdamMany {
    t: [AdamTensor; ADAM_MANY],
}

// SAFETY: both are `#[repr(C)]` plain data laid out as their train.cu twins
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
/// [`rows_cfg`]'s 256 threads (`NORM_FWD_GROUPS` in train.cu).
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
    let module = octet_nn::llama::PROJ_NAMES[li % 7].1;
    format!("model.layers.{bi}.{module}")
}

/// Slot indices (checkpoint order) of block `i`'s q, k, v, o, gate, up and
/// down weights: the block's slots are `1 + 9 i ..`, its norms at offsets 0 and 5.
fn block_matrix_slots(i: usize) -> [usize; 7] {
    let base = 1 + 9 * i;
    [1, 2, 3, 4, 6, 7, 8].map(|o| base + o)
}

/// The rotary tables `(cos, sin)` of `cfg` on the device.
fn rope_tables(gpu: &Gpu, cfg: &LlamaConfig) -> Result<(CudaSlice<f32>, CudaSlice<f32>)> {
    let rope = octet_nn::rope::Rope::for_config(cfg).map_err(|e| Error::Shape(e.to_string()))?;
    let (cos, sin) = rope.tables_f32();
    Ok((gpu.upload(&cos)?, gpu.upload(&sin)?))
}

/// Compile (or fetch from the cache) `train.cu` and load its kernels for head dim `d`.
fn load_fns(gpu: &Gpu, d: usize) -> Result<Fns> {
    let module = gpu.ctx.load_module(nvrtc::compile(
        "train",
        crate::KERNEL_SOURCES[9].1,
        gpu.arch,
    )?)?;
    let l = |n: &str| -> Result<CudaFunction> { Ok(module.load_function(n)?) };
    let f = Fns {
        embed_fwd: l("embed_fwd")?,
        embed_bwd: l("embed_bwd")?,
        norm_fwd: l("rmsnorm_fwd")?,
        norm_fwd_v4: l("rmsnorm_fwd_v4")?,
        norm_bwd: l("rmsnorm_bwd")?,
        norm_bwd_v4: l("rmsnorm_bwd_v4")?,
        norm_bwd_b16: l("rmsnorm_bwd_b16")?,
        norm_bwd_b16_v4: l("rmsnorm_bwd_b16_v4")?,
        sum_partials: l("sum_partials")?,
        rope_fwd: l(if (d / 2).is_multiple_of(4) {
            "rope_fwd_v4"
        } else {
            "rope_fwd"
        })?,
        rope_bwd: l(if (d / 2).is_multiple_of(4) {
            "rope_bwd_v4"
        } else {
            "rope_bwd"
        })?,
        swiglu_fwd: l("swiglu_fwd")?,
        swiglu_bwd: l("swiglu_bwd")?,
        swiglu_fwd_q: [l("swiglu_fwd_q")?, l("swiglu_fwd_q_v8")?],
        swiglu_bwd_q: [l("swiglu_bwd_q")?, l("swiglu_bwd_q_v8")?],
        add: l("add_inplace")?,
        add_many: l("add_many")?,
        add_bf16: l("add_bf16_inplace")?,
        to_bf16: l("to_bf16")?,
        xent: l("cross_entropy")?,
        sumsq: l("sumsq_partial")?,
        adamw: l("adamw")?,
        adamw_many: l("adamw_many")?,
        attn_delta: l("attn_delta")?,
        attn: if matches!(d, 16 | 32 | 64 | 128) {
            // 4 warps, 64 rows a block; bf16 tiles of pitch D + 8 (p bytes a
            // row). Forward: two stages of K, V (64 rows each; Q passes through
            // them into registers). dK/dV: K, V (64 rows each) + two stages of
            // Q, dO (32) and of lse, delta (32 f32 each). dQ: Q, dO (64) + two
            // stages of K, V (32).
            let p = 2 * (d + 8);
            let k = |name: String, smem: usize| -> Result<AttnKernel> {
                Ok(AttnKernel {
                    f: l(&name)?,
                    threads: 128,
                    rows: 64,
                    smem,
                })
            };
            // On sm_90a, for D in {64, 128}, the wgmma kernels: 64 rows a
            // warpgroup; 64-row tiles of 128 D bytes, plus 1 KiB to align the
            // swizzled tiles. Forward (two warpgroups): Q (two tiles) + two
            // stages of K, V. dK/dV (one warpgroup): K, V + two stages of Q,
            // dO and of lse, delta (64 f32 each). dQ (one warpgroup): Q, dO +
            // two stages of K, V. `OCTET_ATTN=mma` keeps the mma.sync kernels
            // (the ones other GPUs run).
            let wgmma = gpu.arch == "sm_90a"
                && matches!(d, 64 | 128)
                && !crate::env_switch("OCTET_ATTN", "mma")?;
            let tile = 64 * d * 2;
            let wg = |name: String, nwg: usize, smem: usize| -> Result<AttnKernel> {
                Ok(AttnKernel {
                    f: l(&name)?,
                    threads: 128 * nwg as u32,
                    rows: 64 * nwg,
                    smem: smem + 1024,
                })
            };
            // The backward blocks are one warpgroup (see ATTN_WG_BWD in train.cu).
            if wgmma {
                Attn {
                    fwd: wg(format!("attn_fwd_wg{d}"), 2, 6 * tile + 64)?,
                    dkdv: wg(format!("attn_dkdv_wg{d}_1"), 1, 6 * tile + 1024 + 64)?,
                    dq: wg(format!("attn_dq_wg{d}_1"), 1, 6 * tile + 64)?,
                    tensor_cores: true,
                    tma: true,
                }
            } else {
                Attn {
                    fwd: k(format!("attn_fwd_tc{d}"), 256 * p)?,
                    dkdv: k(format!("attn_dkdv_tc{d}"), 256 * p + 512)?,
                    dq: k(format!("attn_dq_tc{d}"), 256 * p)?,
                    tensor_cores: true,
                    tma: false,
                }
            }
        } else {
            let (s0, s1, s2) = attn_smem(d);
            let k = |name: &str, smem: usize| -> Result<AttnKernel> {
                Ok(AttnKernel {
                    f: l(name)?,
                    threads: 256,
                    rows: TILE,
                    smem,
                })
            };
            Attn {
                fwd: k("attn_fwd", s0)?,
                dkdv: k("attn_bwd_dkdv", s1)?,
                dq: k("attn_bwd_dq", s2)?,
                tensor_cores: false,
                tma: false,
            }
        },
    };
    use cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES as MAXSMEM;
    for a in [&f.attn.fwd, &f.attn.dkdv, &f.attn.dq] {
        a.f.set_attribute(MAXSMEM, a.smem as i32)?;
    }
    Ok(f)
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
            let base = 1 + 9 * i;
            let lin_slot = block_matrix_slots(i);
            let mut lin = Vec::with_capacity(7);
            for &s in &lin_slot {
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
                attn_norm: base,
                mlp_norm: base + 5,
                lin,
                lin_slot,
                lora: Vec::new(),
                adapter_slots: [None; 7],
            });
        }
        let embed_slot = 0;
        let norm_slot = 1 + 9 * cfg.num_hidden_layers;
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
                    lin_slots.extend(blk.lin_slot);
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
    /// `(module name, role, telemetry)`, as `octet_nn::llama::Llama::telemetry`.
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
    /// state)` as `octet_nn::llama::Llama::scaling_state` names them (empty
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

    /// Attention forward: `(out bf16 (B*T, Hq*D), lse f32 (B, Hq, T))`.
    fn attn_forward(
        &self,
        q: &CudaSlice<u16>,
        k: &CudaSlice<u16>,
        v: &CudaSlice<u16>,
        (b, t, hq, hkv, d): (usize, usize, usize, usize, usize),
        out_amax: &mut Option<TensorAmax>,
    ) -> Result<(CudaSlice<u16>, CudaSlice<f32>)> {
        let gpu = self.gpu;
        let mut out: CudaSlice<u16> =
            unsafe { gpu.alloc_uninit(b * t * hq * d, "attention output")? };
        let mut lse: CudaSlice<f32> = unsafe { gpu.alloc_uninit(b * hq * t, "attention lse")? };
        let (ti, hqi, hkvi, di) = (t as i32, hq as i32, hkv as i32, d as i32);
        let scale = 1.0 / (d as f32).sqrt();
        let null: u64 = 0;
        unsafe {
            let mut lb = gpu.stream.launch_builder(&self.f.attn.fwd.f);
            lb.arg(q)
                .arg(k)
                .arg(v)
                .arg(&mut out)
                .arg(&mut lse)
                .arg(&ti)
                .arg(&hqi)
                .arg(&hkvi)
                .arg(&di)
                .arg(&scale);
            // The tensor-core kernel also writes the output's amax; the SIMT one
            // does not (the quantizer then runs its own amax pass).
            if self.f.attn.tensor_cores {
                push_amax(&mut lb, out_amax, &null);
            } else {
                *out_amax = None;
            }
            // The wgmma kernel copies its tiles by TMA: q, k, v as 3-D
            // (H D, T, B) tensors, boxes of 64 columns x 128 (Q) or 64 rows.
            let maps = if self.f.attn.tma {
                use cudarc::driver::sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B as SW;
                use cudarc::driver::DevicePtr;
                let map = |x: &CudaSlice<u16>, heads: usize, rows: u32| -> Result<TmaMap> {
                    let (p, _g) = x.device_ptr(&gpu.stream);
                    TmaMap::new(p, 2, &[heads * d, t, b], &[64, rows, 1], SW)
                };
                Some([map(q, hq, 128)?, map(k, hkv, 64)?, map(v, hkv, 64)?])
            } else {
                None
            };
            if let Some(m) = &maps {
                lb.arg(&m[0]).arg(&m[1]).arg(&m[2]);
            }
            lb.launch(Self::attn_cfg(&self.f.attn.fwd, t, hq, b))?;
        }
        Ok((out, lse))
    }

    /// Attention backward, `(dq, dk, dv)` in f32 as the kernels sum them
    /// (before RoPE's backward): the conformance check's view.
    fn attn_backward(
        &self,
        a: AttnBwdIn<'_>,
    ) -> Result<(CudaSlice<f32>, CudaSlice<f32>, CudaSlice<f32>)> {
        let gpu = self.gpu;
        let (b, t, hq, hkv, d) = a.dims;
        let n = b * t;
        let mut dq: CudaSlice<f32> = unsafe { gpu.alloc_uninit(n * hq * d, "dq")? };
        let mut dk: CudaSlice<f32> = unsafe { gpu.alloc_uninit(n * hkv * d, "dk")? };
        let mut dv: CudaSlice<f32> = unsafe { gpu.alloc_uninit(n * hkv * d, "dv")? };
        self.attn_bwd_launch(a, AttnGradDst::F32(&mut dq, &mut dk, &mut dv))?;
        Ok((dq, dk, dv))
    }

    /// Attention backward as the q, k and v projections' backward reads it:
    /// `(dq, dk, dv)` in bf16, RoPE's backward applied to dq and dk, with
    /// their amaxes into `amax` where given. On Hopper the wgmma kernels store
    /// them so (`fused`); otherwise, or when `fused` is false, the f32
    /// gradients go through the `rope_bwd` and `to_bf16` passes, which give
    /// the same bits.
    fn attn_backward_bf16(
        &self,
        a: AttnBwdIn<'_>,
        amax: [&mut Option<TensorAmax>; 3],
        fused: bool,
    ) -> Result<(CudaSlice<u16>, CudaSlice<u16>, CudaSlice<u16>)> {
        let gpu = self.gpu;
        let s = &gpu.stream;
        let (b, t, hq, hkv, d) = a.dims;
        let n = b * t;
        let mut dq_bf: CudaSlice<u16> = unsafe { gpu.alloc_uninit(n * hq * d, "dq bf16")? };
        let mut dk_bf: CudaSlice<u16> = unsafe { gpu.alloc_uninit(n * hkv * d, "dk bf16")? };
        let [q_amax, k_amax, v_amax] = amax;
        if fused && self.f.attn.tma {
            let mut dv_bf: CudaSlice<u16> = unsafe { gpu.alloc_uninit(n * hkv * d, "dv bf16")? };
            let dst = AttnGradDst::Bf16 {
                dq: &mut dq_bf,
                dk: &mut dk_bf,
                dv: &mut dv_bf,
                amax: [q_amax, k_amax, v_amax],
            };
            self.attn_bwd_launch(a, dst)?;
            return Ok((dq_bf, dk_bf, dv_bf));
        }
        let (dq, dk, dv) = self.attn_backward(a)?;
        let (ni, ti, di) = (n as i32, t as i32, d as i32);
        let null: u64 = 0;
        for (src, dst, heads, amax) in [
            (&dq, &mut dq_bf, hq, q_amax),
            (&dk, &mut dk_bf, hkv, k_amax),
        ] {
            let hi = heads as i32;
            unsafe {
                let mut lb = s.launch_builder(&self.f.rope_bwd);
                lb.arg(src)
                    .arg(dst)
                    .arg(&self.cos)
                    .arg(&self.sin)
                    .arg(&ni)
                    .arg(&ti)
                    .arg(&hi)
                    .arg(&di);
                push_amax(&mut lb, amax, &null);
                lb.launch(rows_cfg(n))?;
            }
        }
        let dv_bf = self.bf16(&dv, "dv bf16", v_amax)?;
        Ok((dq_bf, dk_bf, dv_bf))
    }

    /// The attention backward's kernels: the `delta` pass, then dK/dV and dQ
    /// into `dst` (bf16 only on Hopper's wgmma kernels).
    fn attn_bwd_launch(&self, a: AttnBwdIn<'_>, dst: AttnGradDst<'_>) -> Result<()> {
        use cudarc::driver::{DevicePtr, DevicePtrMut};
        let AttnBwdIn {
            q,
            k,
            v,
            out,
            dout,
            lse,
            dims: (b, t, hq, hkv, d),
        } = a;
        let gpu = self.gpu;
        let s = &gpu.stream;
        let n = b * t;
        let (ti, hqi, hkvi, di) = (t as i32, hq as i32, hkv as i32, d as i32);
        let scale = 1.0 / (d as f32).sqrt();
        let mut delta: CudaSlice<f32> = unsafe { gpu.alloc_uninit(b * hq * t, "attention delta")? };
        let rows_n = (n * hq) as i32;
        let null: u64 = 0;
        // The f32 destinations (null when the kernels store bf16) and the
        // fused-store arguments of the dK/dV and dQ kernels. Device addresses
        // taken here are used on this stream only.
        let ptr = |x: &mut CudaSlice<u16>| -> u64 { x.device_ptr_mut(s).0 };
        let amax_ptrs = |a: &mut Option<TensorAmax>| -> (u64, u64) {
            a.as_mut().map_or((0, 0), |a| {
                (
                    a.amax_bits.device_ptr_mut(s).0,
                    a.nonfinite.device_ptr_mut(s).0,
                )
            })
        };
        let (mut dq32, mut dk32, mut dv32, stores) = match dst {
            AttnGradDst::F32(dq, dk, dv) => {
                (Some(dq), Some(dk), Some(dv), [BwdStore::default(); 2])
            }
            AttnGradDst::Bf16 {
                dq,
                dk,
                dv,
                amax: [qa, ka, va],
            } => {
                if !self.f.attn.tma {
                    return Err(Error::Shape(
                        "bf16 attention gradients are stored by the wgmma kernels only".into(),
                    ));
                }
                let (cs, sn) = (self.cos.device_ptr(s).0, self.sin.device_ptr(s).0);
                let (qm, qn) = amax_ptrs(qa);
                let (km, kn) = amax_ptrs(ka);
                let (vm, vn) = amax_ptrs(va);
                let dkdv = BwdStore {
                    x: ptr(dk),
                    y: ptr(dv),
                    cs,
                    sn,
                    amax: km,
                    nonfinite: kn,
                    amax2: vm,
                    nonfinite2: vn,
                };
                let dq = BwdStore {
                    x: ptr(dq),
                    y: 0,
                    cs,
                    sn,
                    amax: qm,
                    nonfinite: qn,
                    amax2: 0,
                    nonfinite2: 0,
                };
                (None, None, None, [dkdv, dq])
            }
        };
        unsafe {
            let mut lb = s.launch_builder(&self.f.attn_delta);
            match out {
                OutRef::Bf16(o) => lb.arg(o),
                OutRef::Fp8(..) => lb.arg(&null),
            };
            lb.arg(dout).arg(&mut delta);
            lb.arg(&ti).arg(&hqi).arg(&di).arg(&rows_n);
            match out {
                OutRef::Fp8(codes, si) => lb.arg(codes).arg(si),
                OutRef::Bf16(_) => lb.arg(&null).arg(&null),
            };
            lb.launch(LaunchConfig {
                grid_dim: ((n * hq).div_ceil(8) as u32, 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            })?;
            // The wgmma kernels copy their tiles by TMA: q, k, v and the bf16
            // output gradient as 3-D (H D, T, B) tensors, 64-row boxes.
            let maps = match self.f.attn.tma {
                true => {
                    use cudarc::driver::sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B as SW;
                    let map = |x: &CudaSlice<u16>, heads: usize| -> Result<TmaMap> {
                        let (p, _g) = x.device_ptr(s);
                        TmaMap::new(p, 2, &[heads * d, t, b], &[64, 64, 1], SW)
                    };
                    Some([map(q, hq)?, map(k, hkv)?, map(v, hkv)?, map(dout, hq)?])
                }
                false => None,
            };
            for (kern, heads, is_dq) in
                [(&self.f.attn.dkdv, hkv, false), (&self.f.attn.dq, hq, true)]
            {
                let mut lb = s.launch_builder(&kern.f);
                lb.arg(q).arg(k).arg(v).arg(dout).arg(lse).arg(&delta);
                if is_dq {
                    push_f32_or_null(&mut lb, dq32.as_deref_mut(), &null);
                } else {
                    push_f32_or_null(&mut lb, dk32.as_deref_mut(), &null);
                    push_f32_or_null(&mut lb, dv32.as_deref_mut(), &null);
                }
                if maps.is_some() {
                    lb.arg(&stores[is_dq as usize]);
                }
                lb.arg(&ti).arg(&hqi).arg(&hkvi).arg(&di).arg(&scale);
                if let Some(m) = &maps {
                    lb.arg(&m[0]).arg(&m[1]).arg(&m[2]).arg(&m[3]);
                }
                lb.launch(Self::attn_cfg(kern, t, heads, b))?;
            }
        }
        Ok(())
    }

    /// Parameter count.
    pub fn num_params(&self) -> usize {
        self.slots.iter().map(|s| s.numel).sum()
    }

    /// Device bytes of parameters, gradients and optimizer state (f32 each)
    /// and the bf16 compute copies.
    pub fn state_bytes(&self) -> usize {
        let sharded = self.shard.as_ref().map_or(0, |sh| {
            4 * (sh.gshard.len() + sh.rep.len())
                + 2 * sh.wsh.iter().flatten().map(|w| w.len()).sum::<usize>()
        });
        let lora = self.lora.as_ref().map_or(0, |lm| 4 * lm.rep.len()) + self.base_bytes();
        let adapters = self
            .blocks
            .iter()
            .flat_map(|b| &b.lora)
            .filter_map(|l| l.adapter.as_ref())
            .map(|a| 2 * (a.a.len() + a.b.len()))
            .sum::<usize>();
        12 * self.master.len()
            + 4 * self.grad.len()
            + sharded
            + lora
            + adapters
            + 2 * self.head.len()
            + self
                .blocks
                .iter()
                .flat_map(|b| &b.lin)
                .map(|l| 2 * l.weight.len())
                .sum::<usize>()
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

    /// Forward and mean cross-entropy on `tokens (B, T)` with `targets (B, T)`.
    /// `grad_scale` multiplies the logits' gradient (`1 / (B T)` for the mean,
    /// further divided by the number of accumulated micro-batches); with
    /// `keep = false` nothing is kept for backward (evaluation).
    pub fn forward(
        &mut self,
        tokens: &[u32],
        targets: &[u32],
        (b, t): (usize, usize),
        grad_scale: f32,
        keep: bool,
    ) -> Result<(f64, Option<GpuLlamaSaved>)> {
        // An evaluation (`keep = false`) records no amax (`GpuLinear::recording`),
        // so validation batches leave the training's delayed scales alone;
        // every forward sets it, so an early error leaves nothing stale.
        self.set_recording(keep);
        let cfg = self.cfg.clone();
        let (c, v) = (cfg.hidden_size, cfg.vocab_size);
        // B x T checked (as the CPU model checks it): a product that wraps
        // could match the tokens and run the kernels on a batch of one.
        let n = match b.checked_mul(t) {
            Some(n) if b > 0 && t > 0 && tokens.len() == n && targets.len() == n => n,
            _ => {
                return Err(Error::Shape(format!(
                    "{} tokens and {} targets for batch {b} x sequence {t}",
                    tokens.len(),
                    targets.len()
                )))
            }
        };
        if t > cfg.max_position_embeddings {
            return Err(Error::Shape(format!(
                "sequence {t} exceeds max_position_embeddings {}",
                cfg.max_position_embeddings
            )));
        }
        if let Some((i, &tok)) = tokens
            .iter()
            .chain(targets)
            .enumerate()
            .find(|(_, &x)| x as usize >= v)
        {
            return Err(Error::Shape(format!(
                "token id {tok} at position {} is outside the vocabulary of {v}",
                i % n
            )));
        }
        if let Some(mode) = &mut self.lora {
            // A training forward draws its round's dropout masks, and so does
            // the forward that checks every block (it repeats a training one).
            let train = keep || self.check_layers;
            mode.dropout_now = train.then_some(mode.dropout_round);
            if train {
                mode.dropout_round = mode.dropout_round.wrapping_add(1);
            }
        }
        let gpu = self.gpu;
        let s = &gpu.stream;
        let toks: Vec<i32> = tokens.iter().map(|&x| x as i32).collect();
        let tgts: Vec<i32> = targets.iter().map(|&x| x as i32).collect();
        let d_tok = gpu.upload(&toks)?;
        let d_tgt = gpu.upload(&tgts)?;
        let ci = c as i32;
        let eps = cfg.rms_norm_eps as f32;
        // Embedding.
        let mut x: CudaSlice<f32> = unsafe { gpu.alloc_uninit(n * c, "residual")? };
        {
            let table = self.slot_view(self.embed_slot)?;
            // SAFETY (every launch in this file): argument types and order match
            // the kernels in train.cu, and every buffer has the length the
            // kernel indexes (sizes derived from the shapes checked above).
            unsafe {
                s.launch_builder(&self.f.embed_fwd)
                    .arg(&table)
                    .arg(&d_tok)
                    .arg(&mut x)
                    .arg(&ci)
                    .launch(LaunchConfig {
                        grid_dim: (n as u32, c.div_ceil(256) as u32, 1),
                        block_dim: (256, 1, 1),
                        shared_mem_bytes: 0,
                    })?;
            }
        }
        if self.check_layers && !self.all_finite(&x)? {
            return Err(Error::NonFiniteIn("model.embed_tokens".into()));
        }
        let mut saved_blocks = Vec::with_capacity(cfg.num_hidden_layers);
        // A training forward keeps a recomputed block's input residual only
        // (see `GpuLlama::set_recompute`), and the other blocks' saved state.
        let recomputed = self.recompute;
        let saves = |bi: usize| keep && bi >= recomputed;
        let mut inputs = Vec::new();
        // Each residual add runs in the kernel of the norm that reads its
        // result: the next norm's input `h` comes out of the previous block.
        let first_norm = match self.blocks.first() {
            Some(b) => b.attn_norm,
            None => self.norm_slot,
        };
        // The norms' and SwiGLU's inputs (and maybe the attention output) in
        // FP8 for backward, for the blocks that keep their state and the
        // final norm; `recompute_block` writes a recomputed block's in backward.
        let fp8 = keep && self.saved_activations == SavedActivations::Fp8;
        let nblocks = self.blocks.len();
        let fp8_for = |bi: usize| fp8 && (bi == nblocks || saves(bi));
        let mut h_amax = self.amax_for(0, 0, false)?;
        let (_, mut h, mut rstd1, mut xq1) =
            self.add_norm(&x, None, first_norm, (n, eps), &mut h_amax, fp8_for(0))?;
        self.mark("rmsnorm")?;
        // Sharded: block i + 1's weights are gathered while block i computes.
        let mut gathering = match self.blocks.is_empty() {
            true => None,
            false => self.start_forward_gather(0)?,
        };
        for bi in 0..self.blocks.len() {
            let next_norm = match self.blocks.get(bi + 1) {
                Some(b) => b.attn_norm,
                None => self.norm_slot,
            };
            self.mark("other")?;
            if let Some(g) = gathering.take() {
                self.finish_gather(bi, g, None)?;
                self.mark("all-gather wait")?;
            }
            if bi + 1 < self.blocks.len() {
                gathering = self.start_forward_gather(bi + 1)?;
            }
            let rstd_in = rstd1;
            let mut out =
                self.block_forward(bi, &x, (h, h_amax.take()), (b, t), (fp8_for(bi), false))?;
            let dn = out
                .dn
                .take()
                .ok_or_else(|| Error::Shape("block forward gave no output".into()))?;
            h_amax = self.amax_for(bi + 1, 0, false)?;
            let fp8_next = fp8_for(bi + 1);
            let (x2, hn, rn, xqn) = self.add_norm(
                &out.x1,
                Some(&dn),
                next_norm,
                (n, eps),
                &mut h_amax,
                fp8_next,
            )?;
            let x2 = x2.ok_or_else(|| Error::Shape("add_norm returned no residual".into()))?;
            drop(dn);
            (h, rstd1) = (hn, rn);
            self.mark("rmsnorm")?;
            if self.check_layers && !self.all_finite(&x2)? {
                let what = if self.all_finite(&out.x1)? {
                    "its MLP (post_attention_layernorm, gate/up/down)"
                } else {
                    "its attention (input_layernorm, q/k/v, attention, o)"
                };
                return Err(Error::NonFiniteIn(format!("model.layers.{bi}: {what}")));
            }
            let prev = std::mem::replace(&mut x, x2);
            let xq_prev = std::mem::replace(&mut xq1, xqn);
            self.after_block_forward(bi, &mut out.core.lin, saves(bi))?;
            if saves(bi) {
                // With FP8 copies the f32 residuals are freed here.
                saved_blocks.push(out.into_saved(NormIn::of(prev, xq_prev), rstd_in));
            } else if keep {
                // Recomputation: backward runs the block again from its input.
                inputs.push(prev);
            }
        }
        let (hf, rstd_f) = (h, rstd1);
        let mut logits: CudaSlice<f32> = unsafe { gpu.alloc_uninit(n * v, "logits")? };
        gpu.gemm_bf16(&hf, &self.head, &mut logits, (n, v, c))?;
        let mut losses: CudaSlice<f32> = unsafe { gpu.alloc_uninit(n, "losses")? };
        let mut dlogits: CudaSlice<u16> =
            gpu.alloc_zeros(if keep { n * v } else { 1 }, "d_logits")?;
        let vi = v as i32;
        unsafe {
            let null: u64 = 0;
            let mut lb = s.launch_builder(&self.f.xent);
            lb.arg(&logits).arg(&d_tgt).arg(&mut losses);
            if keep {
                lb.arg(&mut dlogits);
            } else {
                lb.arg(&null);
            }
            lb.arg(&vi).arg(&grad_scale).launch(rows_cfg(n))?;
        }
        self.mark("head + loss")?;
        let host = gpu.download(&losses)?;
        let loss = host.iter().map(|&l| l as f64).sum::<f64>() / n as f64;
        if !loss.is_finite() {
            return Err(if self.check_layers {
                Error::NonFiniteIn("the final norm, LM head or loss".into())
            } else {
                Error::NonFinite
            });
        }
        if !keep {
            return Ok((loss, None));
        }
        let (counts, rows) = token_rows(tokens, v);
        Ok((
            loss,
            Some(GpuLlamaSaved {
                b,
                t,
                starts: gpu.upload(&counts)?,
                rows: gpu.upload(&rows)?,
                blocks: saved_blocks,
                inputs,
                dropout_round: self.lora.as_ref().and_then(|m| m.dropout_now),
                xf: match xq1 {
                    Some((c, f)) => NormIn::Fp8(c, f),
                    None => NormIn::F32(x),
                },
                rstd_f,
                hf,
                dlogits,
            }),
        ))
    }

    /// Block `bi`'s forward from the residual `x` entering it and its input
    /// norm's output `h` (with `h`'s amax where q/k/v's quantizer reads one),
    /// up to the down projection's output; the caller adds that to the
    /// residual. `fp8_saved`: keep the norms' and SwiGLU's inputs in FP8 (see
    /// [`SavedActivations::Fp8`]). `recomputing`: backward runs the block
    /// again, which needs no down projection output (`dn` is `None`).
    fn block_forward(
        &mut self,
        bi: usize,
        x: &CudaSlice<f32>,
        (h, h_amax): (CudaSlice<u16>, Option<TensorAmax>),
        (b, t): (usize, usize),
        (fp8_saved, recomputing): (bool, bool),
    ) -> Result<BlockOut> {
        let gpu = self.gpu;
        let s = &gpu.stream;
        let null: u64 = 0;
        let cfg = &self.cfg;
        let (ff, eps) = (cfg.intermediate_size, cfg.rms_norm_eps as f32);
        let (hq, hkv, d) = (
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim(),
        );
        let n = b * t;
        let (ni, ti) = (n as i32, t as i32);
        let mn = self.blocks[bi].mlp_norm;
        let mut lin_saved = Vec::with_capacity(7);
        // q, k and v read one quantization of h.
        let mut qkv = self.proj_forward(bi, 0..3, Rc::new(h), h_amax, n)?;
        let (vv, sv) = next_out(&mut qkv)?;
        let (mut k, sk) = next_out(&mut qkv)?;
        let (mut q, sq) = next_out(&mut qkv)?;
        self.mark("linear fwd")?;
        lin_saved.extend([sq, sk, sv]);
        for (buf, heads) in [(&mut q, hq), (&mut k, hkv)] {
            let (hi, di) = (heads as i32, d as i32);
            unsafe {
                s.launch_builder(&self.f.rope_fwd)
                    .arg(buf)
                    .arg(&self.cos)
                    .arg(&self.sin)
                    .arg(&ni)
                    .arg(&ti)
                    .arg(&hi)
                    .arg(&di)
                    .launch(rows_cfg(n))?;
            }
        }
        let mut a_amax = self.amax_for(bi, 3, false)?;
        let (a, lse) = self.attn_forward(&q, &k, &vv, (b, t, hq, hkv, d), &mut a_amax)?;
        self.mark("attention fwd (+rope)")?;
        // The attention output: o's input, and read again by the attention
        // backward (one buffer, shared with o's saved input when o keeps it).
        let a = Rc::new(a);
        let mut outs = self.proj_forward(bi, 3..4, a.clone(), a_amax, n)?;
        let (o, so) = next_out(&mut outs)?;
        self.mark("linear fwd")?;
        // FP8 saved activations: the attention backward reads o's E4M3 input where o keeps one.
        let a = match so.attn_out().filter(|_| fp8_saved) {
            Some(q) => {
                drop(a);
                q
            }
            None => AttnOut::Bf16(a),
        };
        lin_saved.push(so);
        let mut h2_amax = self.amax_for(bi, 4, false)?;
        let (x1, h2, rstd2, xq2) =
            self.add_norm(x, Some(&o), mn, (n, eps), &mut h2_amax, fp8_saved)?;
        let x1 = x1.ok_or_else(|| Error::Shape("add_norm returned no residual".into()))?;
        drop(o);
        self.mark("rmsnorm")?;
        let mut gu = self.proj_forward(bi, 4..6, Rc::new(h2), h2_amax, n)?;
        let (up, su) = next_out(&mut gu)?;
        let (gate, sg) = next_out(&mut gu)?;
        self.mark("linear fwd")?;
        lin_saved.extend([sg, su]);
        let mut act: CudaSlice<u16> = unsafe { gpu.alloc_uninit(n * ff, "swiglu")? };
        let nf = n * ff;
        let mut act_amax = self.amax_for(bi, 6, false)?;
        let swiglu = if fp8_saved {
            // SAFETY: one block a row writes every code and factor.
            let (mut gq, mut uq): (CudaSlice<u8>, CudaSlice<u8>) = unsafe {
                (
                    gpu.alloc_uninit(nf, "saved gate fp8")?,
                    gpu.alloc_uninit(nf, "saved up fp8")?,
                )
            };
            let (mut gs, mut us): (CudaSlice<f32>, CudaSlice<f32>) = unsafe {
                (
                    gpu.alloc_uninit(n, "saved gate factors")?,
                    gpu.alloc_uninit(n, "saved up factors")?,
                )
            };
            let ffi = ff as i32;
            unsafe {
                let mut lb = s.launch_builder(&self.f.swiglu_fwd_q[(ff % 8 == 0) as usize]);
                lb.arg(&gate).arg(&up).arg(&mut act);
                lb.arg(&mut gq)
                    .arg(&mut gs)
                    .arg(&mut uq)
                    .arg(&mut us)
                    .arg(&ffi);
                push_amax(&mut lb, &mut act_amax, &null);
                lb.launch(rows_cfg(n))?;
            }
            drop((gate, up));
            SwigluIn::Fp8 {
                gate: (gq, gs),
                up: (uq, us),
            }
        } else {
            unsafe {
                let mut lb = s.launch_builder(&self.f.swiglu_fwd);
                lb.arg(&gate).arg(&up).arg(&mut act).arg(&nf);
                push_amax(&mut lb, &mut act_amax, &null);
                lb.launch(grid_stride(nf.div_ceil(8)))?;
            }
            SwigluIn::Bf16 { gate, up }
        };
        self.mark("elementwise")?;
        let (dn, sd) = match recomputing {
            // Only the down projection's saved state: its output is not read.
            true => (
                None,
                self.proj_saved_only(bi, 6, Rc::new(act), act_amax, n)?,
            ),
            false => {
                let mut outs = self.proj_forward(bi, 6..7, Rc::new(act), act_amax, n)?;
                let (dn, sd) = next_out(&mut outs)?;
                (Some(dn), sd)
            }
        };
        self.mark("linear fwd")?;
        lin_saved.push(sd);
        Ok(BlockOut {
            core: BlockCore {
                lin: lin_saved,
                q,
                k,
                v: vv,
                a,
                lse,
                rstd2,
                swiglu,
            },
            x1,
            xq2,
            dn,
        })
    }

    /// Recomputation: block `bi`'s forward again from the residual `x` that
    /// entered it, keeping what its backward reads, as the training forward
    /// would have kept it (the same kernels on the same inputs, hence the
    /// same bytes; delayed scaling's amax records take a maximum, LoRA
    /// dropout draws the forward's masks again).
    fn recompute_block(
        &mut self,
        bi: usize,
        x: CudaSlice<f32>,
        (b, t): (usize, usize),
    ) -> Result<BlockSaved> {
        let n = b * t;
        let eps = self.cfg.rms_norm_eps as f32;
        let fp8_saved = self.saved_activations == SavedActivations::Fp8;
        self.mark("other")?;
        self.prof.recomputing = true;
        let mut h_amax = self.amax_for(bi, 0, false)?;
        let attn_norm = self.blocks[bi].attn_norm;
        let (_, h, rstd1, xq1) =
            self.add_norm(&x, None, attn_norm, (n, eps), &mut h_amax, fp8_saved)?;
        let out = self.block_forward(bi, &x, (h, h_amax), (b, t), (fp8_saved, true));
        self.prof.recomputing = false;
        let out = out?;
        self.mark("recompute (forward again)")?;
        Ok(out.into_saved(NormIn::of(x, xq1), rstd1))
    }

    /// The residual add and the RMSNorm that reads it, in one kernel:
    /// `xo = x + y` (f32 residual plus a bf16 projection output; with `y`
    /// `None` the norm reads `x` and `xo` is `None`), `h = norm(xo)` in bf16
    /// with gain `slot`, and the per-row `rstd` (and `h`'s amax into
    /// `h_amax` when given); with `fp8` also the norm's input (`xo`, or `x`)
    /// as E4M3 codes with a factor per row, for the backward. Returns `(xo,
    /// h, rstd, codes and factors)`.
    #[allow(clippy::type_complexity)]
    fn add_norm(
        &self,
        x: &CudaSlice<f32>,
        y: Option<&CudaSlice<u16>>,
        slot: usize,
        (n, eps): (usize, f32),
        h_amax: &mut Option<TensorAmax>,
        fp8: bool,
    ) -> Result<(
        Option<CudaSlice<f32>>,
        CudaSlice<u16>,
        CudaSlice<f32>,
        Option<(CudaSlice<u8>, CudaSlice<f32>)>,
    )> {
        let c = self.cfg.hidden_size;
        // SAFETY: the kernel writes every element of xo (when y is given), h and rstd.
        let mut h: CudaSlice<u16> = unsafe { self.gpu.alloc_uninit(n * c, "norm output")? };
        let mut rstd: CudaSlice<f32> = unsafe { self.gpu.alloc_uninit(n, "norm rstd")? };
        let mut xo: Option<CudaSlice<f32>> = match y {
            Some(_) => Some(unsafe { self.gpu.alloc_uninit(n * c, "residual")? }),
            None => None,
        };
        let mut xq: Option<(CudaSlice<u8>, CudaSlice<f32>)> = match fp8 {
            // SAFETY: the kernel writes every code and every row's factor.
            true => unsafe {
                Some((
                    self.gpu.alloc_uninit(n * c, "saved norm input fp8")?,
                    self.gpu.alloc_uninit(n, "saved norm input factors")?,
                ))
            },
            false => None,
        };
        let g = self.slot_view(slot)?;
        let ci = c as i32;
        let null: u64 = 0;
        unsafe {
            let f = if c.is_multiple_of(4) && c <= NORM_FWD_V4_MAX {
                &self.f.norm_fwd_v4
            } else {
                &self.f.norm_fwd
            };
            let mut lb = self.gpu.stream.launch_builder(f);
            lb.arg(x);
            match (y, xo.as_mut()) {
                (Some(y), Some(o)) => lb.arg(y).arg(o),
                _ => lb.arg(&null).arg(&null),
            };
            lb.arg(&g).arg(&mut h).arg(&mut rstd).arg(&ci).arg(&eps);
            push_amax(&mut lb, h_amax, &null);
            match xq.as_mut() {
                Some((codes, factors)) => lb.arg(codes).arg(factors),
                None => lb.arg(&null).arg(&null),
            };
            lb.launch(rows_cfg(n))?;
        }
        Ok((xo, h, rstd, xq))
    }

    /// RMSNorm backward from `dy` = the sum of `dys` (one to three input
    /// gradients of the projections that read the norm's output, added in
    /// order; f32 from the LM head, bf16 from a block's projections, whose
    /// GEMMs add them into one buffer): `dres (+)= dx`; the gain's gradient added to its slot (not in
    /// LoRA mode, where the gains are frozen); with `bf16_for = (block,
    /// projection)` also the updated `dres` in bf16, that projection's
    /// grad_output, with its amax when the projection's quantizer reads one.
    #[allow(clippy::too_many_arguments)]
    fn norm_bwd<D: GemmOut>(
        &mut self,
        x: &NormIn,
        rstd: &CudaSlice<f32>,
        dys: &[&CudaSlice<D>],
        dres: &mut CudaSlice<f32>,
        slot: usize,
        accumulate: bool,
        bf16_for: Option<(usize, usize)>,
    ) -> Result<Option<(CudaSlice<u16>, Option<TensorAmax>)>> {
        let (c, n) = (self.cfg.hidden_size, rstd.len());
        if dys.is_empty() || dys.len() > 3 || dys.iter().any(|d| d.len() != n * c) {
            return Err(Error::Shape(format!(
                "norm backward takes 1 to 3 gradients of {n} x {c}"
            )));
        }
        let (ci, ni, acc) = (c as i32, n as i32, accumulate as i32);
        let frozen = self.lora.is_some();
        let rows = NORM_ROWS;
        let groups = n.div_ceil(rows);
        let rows_i = rows as i32;
        let mut partial: Option<CudaSlice<f32>> = if frozen {
            None
        } else {
            // SAFETY: every block writes its row of partials.
            Some(unsafe { self.gpu.alloc_uninit(groups * c, "norm partials")? })
        };
        let mut dres_bf: Option<CudaSlice<u16>> = match bf16_for {
            Some(_) => Some(unsafe { self.gpu.alloc_uninit(n * c, "d_residual bf16")? }),
            None => None,
        };
        let mut amax = match bf16_for {
            Some((bi, li)) => self.amax_for(bi, li, true)?,
            None => None,
        };
        let s = &self.gpu.stream;
        let null: u64 = 0;
        {
            let g = self.slot_view(slot)?;
            // 16-byte accesses when every row and the gain start on a 16-byte boundary.
            let g_aligned = {
                let (ptr, _read) = cudarc::driver::DevicePtr::device_ptr(&g, s);
                ptr % 16 == 0
            };
            let kern = match (D::OUT, c % 4 == 0 && g_aligned) {
                (crate::gemm::OutType::F32, true) => &self.f.norm_bwd_v4,
                (crate::gemm::OutType::F32, false) => &self.f.norm_bwd,
                (crate::gemm::OutType::Bf16, true) => &self.f.norm_bwd_b16_v4,
                (crate::gemm::OutType::Bf16, false) => &self.f.norm_bwd_b16,
            };
            // The gain's column sums take 4 C bytes of dynamic shared memory;
            // past the default 48 KB (less the kernel's 256 static bytes) the
            // kernel must be allowed more, up to what the device has.
            if !frozen && 4 * c > 48 * 1024 - 256 {
                use cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES as MAXSMEM;
                kern.set_attribute(MAXSMEM, (4 * c) as i32).map_err(|e| {
                    Error::Shape(format!(
                        "hidden size {c}: the norm backward's column sums need {} bytes of shared memory: {e:?}",
                        4 * c
                    ))
                })?;
            }
            unsafe {
                let mut lb = s.launch_builder(kern);
                match x {
                    NormIn::F32(x) => lb.arg(x),
                    NormIn::Fp8(..) => lb.arg(&null),
                };
                lb.arg(&g).arg(rstd);
                for i in 0..3 {
                    match dys.get(i) {
                        Some(d) => lb.arg(*d),
                        None => lb.arg(&null),
                    };
                }
                lb.arg(dres);
                match dres_bf.as_mut() {
                    Some(b) => lb.arg(b),
                    None => lb.arg(&null),
                };
                match partial.as_mut() {
                    Some(p) => lb.arg(p),
                    None => lb.arg(&null),
                };
                lb.arg(&ni).arg(&ci).arg(&rows_i).arg(&acc);
                push_amax(&mut lb, &mut amax, &null);
                match x {
                    NormIn::Fp8(codes, factors) => lb.arg(codes).arg(factors),
                    NormIn::F32(_) => lb.arg(&null).arg(&null),
                };
                lb.launch(LaunchConfig {
                    grid_dim: (groups as u32, 1, 1),
                    block_dim: (256, 1, 1),
                    shared_mem_bytes: if frozen { 0 } else { 4 * c as u32 },
                })?;
            }
        }
        if let Some(partial) = partial {
            let sl = self.slots[slot].clone();
            let mut gview = self.grad.slice_mut(sl.offset..sl.offset + sl.numel);
            let yi = groups as i32;
            unsafe {
                s.launch_builder(&self.f.sum_partials)
                    .arg(&partial)
                    .arg(&mut gview)
                    .arg(&yi)
                    .arg(&ci)
                    .launch(LaunchConfig {
                        grid_dim: (c.div_ceil(32) as u32, 1, 1),
                        block_dim: (32, 8, 1),
                        shared_mem_bytes: 0,
                    })?;
            }
        }
        Ok(dres_bf.map(|b| (b, amax)))
    }

    /// Add each `(slot, gradient)` into the accumulated gradients,
    /// [`ADD_MANY`] a launch.
    fn add_grads(&mut self, items: &[(usize, CudaSlice<f32>)]) -> Result<()> {
        for chunk in items.chunks(ADD_MANY) {
            // One launch's tensors add concurrently: each slot once.
            if let Some((i, _)) = chunk
                .iter()
                .enumerate()
                .find(|(i, (s, _))| chunk[..*i].iter().any(|(t, _)| t == s))
            {
                return Err(Error::Shape(format!(
                    "two gradients for {} in one add",
                    self.slots[chunk[i].0].name
                )));
            }
            let mut list = AddMany {
                src: [0; ADD_MANY],
                off: [0; ADD_MANY],
                n: [0; ADD_MANY],
            };
            for (i, (slot, g)) in chunk.iter().enumerate() {
                let sl = &self.slots[*slot];
                if g.len() != sl.numel {
                    return Err(Error::Shape(format!(
                        "gradient of {} elements for {} ({} elements)",
                        g.len(),
                        sl.name,
                        sl.numel
                    )));
                }
                list.src[i] = g.device_ptr(&self.gpu.stream).0;
                list.off[i] = sl.offset as u64;
                list.n[i] = sl.numel as u64;
            }
            let most = chunk.iter().map(|(_, g)| g.len()).max().unwrap_or(0);
            let mut cfg = grid_stride(most);
            cfg.grid_dim.1 = chunk.len() as u32;
            // SAFETY: argument types match `add_many` in train.cu; each
            // source holds `n` elements and its slot `off .. off + n` lies
            // in the gradient buffer (the slots tile it); the sources live
            // until after the launch (borrowed from `items`).
            unsafe {
                self.gpu
                    .stream
                    .launch_builder(&self.f.add_many)
                    .arg(&mut self.grad)
                    .arg(&list)
                    .launch(cfg)?;
            }
        }
        Ok(())
    }

    /// `x` rounded to bf16 (and its amax into `amax` when given).
    fn bf16(
        &self,
        x: &CudaSlice<f32>,
        what: &str,
        amax: &mut Option<TensorAmax>,
    ) -> Result<CudaSlice<u16>> {
        let n = x.len();
        let mut y: CudaSlice<u16> = unsafe { self.gpu.alloc_uninit(n, what)? };
        let null: u64 = 0;
        unsafe {
            let mut lb = self.gpu.stream.launch_builder(&self.f.to_bf16);
            lb.arg(x).arg(&mut y).arg(&n);
            push_amax(&mut lb, amax, &null);
            lb.launch(grid_stride(n))?;
        }
        Ok(y)
    }

    /// Set every gradient to zero (before the first micro-batch of a step).
    pub fn zero_grad(&mut self) -> Result<()> {
        if self.shard.is_some() || self.lora.is_some() {
            self.gpu.stream.memset_zeros(&mut self.grad)?;
            if let Some(sh) = self.shard.as_mut() {
                self.gpu.stream.memset_zeros(&mut sh.gshard)?;
            }
            return Ok(());
        }
        // The projection weights' slots (nearly all of the buffer) are left
        // as they are: their first weight-gradient GEMM of the step
        // overwrites them (`grad_unwritten`). The others (embedding, head,
        // norm gains) are added to by kernels, so they are zeroed.
        self.grad_unwritten.clear();
        self.grad_unwritten.resize(self.slots.len(), false);
        for b in &self.blocks {
            for &sl in &b.lin_slot {
                self.grad_unwritten[sl] = true;
            }
        }
        // A tied head adds into the embedding's slot: never a projection's.
        for (i, sl) in self.slots.iter().enumerate() {
            if !self.grad_unwritten[i] {
                self.gpu
                    .stream
                    .memset_zeros(&mut self.grad.slice_mut(sl.offset..sl.offset + sl.numel))?;
            }
        }
        Ok(())
    }

    /// Backward of [`GpuLlama::forward`]: gradients added to the flat gradient buffer.
    pub fn backward(&mut self, saved: GpuLlamaSaved) -> Result<()> {
        let gpu = self.gpu;
        let cfg = self.cfg.clone();
        let (c, ff, v) = (cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size);
        let (hq, hkv, d) = (
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim(),
        );
        let GpuLlamaSaved {
            b,
            t,
            starts,
            rows,
            mut blocks,
            mut inputs,
            dropout_round,
            xf,
            rstd_f,
            hf,
            dlogits,
        } = saved;
        let n = b * t;
        let null: u64 = 0;
        let s = &gpu.stream;
        // LM head (bf16): dh = dlogits @ W, dW = dlogits^T @ h.
        let mut dh: CudaSlice<f32> = unsafe { gpu.alloc_uninit(n * c, "d_hidden")? };
        gpu.gemm_bf16_op((&dlogits, false), (&self.head, false), &mut dh, (n, c, v))?;
        if self.lora.is_none() {
            // Accumulated straight into the head's (or the tied embedding's) slot.
            let sl = &self.slots[self.head_slot];
            let mut dw = AddTo(self.grad.slice_mut(sl.offset..sl.offset + sl.numel));
            gpu.gemm_bf16_op((&dlogits, true), (&hf, false), &mut dw, (v, c, n))?;
        }
        drop((dlogits, hf));
        let mut dres: CudaSlice<f32> = unsafe { gpu.alloc_uninit(n * c, "d_residual")? };
        let nblocks = self.blocks.len();
        // Blocks 0..recomputed run their forward again; `blocks` holds the rest.
        let recomputed = inputs.len();
        if let Some(mode) = self.lora.as_mut().filter(|_| recomputed > 0) {
            // The recomputed forwards draw the masks of the forward they repeat.
            mode.dropout_now = dropout_round;
        }
        if blocks.len() + inputs.len() != nblocks {
            return Err(Error::Shape(format!(
                "saved state of {} blocks and inputs of {} for a model of {nblocks} blocks",
                blocks.len(),
                inputs.len()
            )));
        }
        let mut dres_bf = self.norm_bwd(
            &xf,
            &rstd_f,
            &[&dh],
            &mut dres,
            self.norm_slot,
            false,
            nblocks.checked_sub(1).map(|last| (last, 6)),
        )?;
        drop((dh, xf, rstd_f));
        // Sharded: block i - 1's weights are gathered (when resharding) and
        // block i + 1's gradients reduce-scattered while block i runs backward.
        let mut gathering = match nblocks.checked_sub(1) {
            Some(last) => self.start_backward_gather(last, last < recomputed)?,
            None => None,
        };
        let mut flushing = std::collections::VecDeque::new();
        for bi in (0..nblocks).rev() {
            // Kept, or (recomputed) run again from the block's input once its
            // weights are here.
            let mut kept = match bi < recomputed {
                true => None,
                false => blocks.pop(),
            };
            if let Some(g) = gathering.take() {
                self.finish_gather(bi, g, kept.as_mut().map(|sb| &mut sb.core.lin[..]))?;
                self.mark("all-gather wait")?;
            }
            if bi > 0 {
                gathering = self.start_backward_gather(bi - 1, bi - 1 < recomputed)?;
            }
            let sb = match (kept, bi < recomputed) {
                (Some(sb), false) => sb,
                (None, true) => match inputs.pop() {
                    Some(x) => self.recompute_block(bi, x, (b, t))?,
                    None => return Err(Error::Shape(format!("no input of block {bi}"))),
                },
                _ => return Err(Error::Shape(format!("no saved state of block {bi}"))),
            };
            // This block writes the gradient region of the block after next.
            if flushing.len() >= 2 {
                if let Some(f) = flushing.pop_front() {
                    self.finish_flush(f)?;
                    self.mark("reduce-scatter wait")?;
                }
            }
            let BlockSaved {
                x,
                rstd1,
                x1,
                core:
                    BlockCore {
                        lin,
                        q,
                        k,
                        v: vv,
                        a,
                        lse,
                        rstd2,
                        swiglu,
                    },
            } = sb;
            let mut lin = lin.into_iter();
            let mut next = || {
                lin.next()
                    .ok_or_else(|| Error::Shape("saved linear missing".into()))
            };
            let (sq, sk, sv, so, sg, su, sd) = (
                next()?,
                next()?,
                next()?,
                next()?,
                next()?,
                next()?,
                next()?,
            );
            self.mark("other")?;
            // MLP.
            let (dres_bf_mlp, mlp_amax) = dres_bf
                .take()
                .ok_or_else(|| Error::Shape("norm backward gave no bf16 gradient".into()))?;
            // In bf16: the SwiGLU backward's only input from it (as the
            // activations it multiplies are bf16), half the bytes of f32.
            let mut dact: Option<CudaSlice<u16>> = None;
            self.proj_backward((bi, 6), sd, &dres_bf_mlp, mlp_amax, &mut dact)?;
            let dact =
                dact.ok_or_else(|| Error::Shape("down projection gave no gradient".into()))?;
            self.mark("linear bwd")?;
            drop(dres_bf_mlp);
            let nf = n * ff;
            let mut dg: CudaSlice<u16> = unsafe { gpu.alloc_uninit(nf, "d_gate")? };
            let mut du: CudaSlice<u16> = unsafe { gpu.alloc_uninit(nf, "d_up")? };
            let (mut g_amax, mut u_amax) =
                (self.amax_for(bi, 4, true)?, self.amax_for(bi, 5, true)?);
            let ffi = ff as i32;
            unsafe {
                let (mut lb, cfg) = match &swiglu {
                    SwigluIn::Bf16 { gate, up } => {
                        let mut lb = s.launch_builder(&self.f.swiglu_bwd);
                        lb.arg(gate)
                            .arg(up)
                            .arg(&dact)
                            .arg(&mut dg)
                            .arg(&mut du)
                            .arg(&nf);
                        (lb, grid_stride(nf.div_ceil(8)))
                    }
                    SwigluIn::Fp8 { gate, up } => {
                        let mut lb = s.launch_builder(&self.f.swiglu_bwd_q[(ff % 8 == 0) as usize]);
                        lb.arg(&gate.0)
                            .arg(&gate.1)
                            .arg(&up.0)
                            .arg(&up.1)
                            .arg(&dact);
                        lb.arg(&mut dg).arg(&mut du).arg(&ffi);
                        (lb, rows_cfg(n))
                    }
                };
                push_amax(&mut lb, &mut g_amax, &null);
                push_amax(&mut lb, &mut u_amax, &null);
                lb.launch(cfg)?;
            }
            drop((dact, swiglu));
            self.mark("elementwise")?;
            // gate's and up's input gradients added into one bf16 buffer.
            let mut dh2: Option<CudaSlice<u16>> = None;
            self.proj_backward_group(
                (bi, 4),
                vec![(sg, &dg, g_amax), (su, &du, u_amax)],
                &mut dh2,
            )?;
            let dh2 = dh2.ok_or_else(|| Error::Shape("gate projection gave no gradient".into()))?;
            self.mark("linear bwd")?;
            drop((dg, du));
            let mn = self.blocks[bi].mlp_norm;
            let (dres_bf_attn, o_amax) = self
                .norm_bwd(&x1, &rstd2, &[&dh2], &mut dres, mn, true, Some((bi, 3)))?
                .ok_or_else(|| Error::Shape("norm backward gave no bf16 gradient".into()))?;
            self.mark("rmsnorm bwd")?;
            drop((dh2, x1, rstd2));
            // Attention.
            // In bf16: the attention backward's kernels read it so.
            let mut da: Option<CudaSlice<u16>> = None;
            self.proj_backward((bi, 3), so, &dres_bf_attn, o_amax, &mut da)?;
            let da = da.ok_or_else(|| Error::Shape("o projection gave no gradient".into()))?;
            self.mark("linear bwd")?;
            drop(dres_bf_attn);
            self.mark("elementwise")?;
            let (mut q_amax, mut k_amax, mut v_amax) = (
                self.amax_for(bi, 0, true)?,
                self.amax_for(bi, 1, true)?,
                self.amax_for(bi, 2, true)?,
            );
            let amaxes = [&mut q_amax, &mut k_amax, &mut v_amax];
            let (dq_bf, dk_bf, dv_bf) = a.with(|o| {
                let inputs = AttnBwdIn {
                    q: &q,
                    k: &k,
                    v: &vv,
                    out: o,
                    dout: &da,
                    lse: &lse,
                    dims: (b, t, hq, hkv, d),
                };
                self.attn_backward_bf16(inputs, amaxes, true)
            })??;
            drop((q, k, vv, a, lse, da));
            self.mark("attention bwd (+rope)")?;
            // q's, k's and v's input gradients added into one bf16 buffer, in
            // that order (each GEMM adds in f32 and rounds once).
            let mut dh: Option<CudaSlice<u16>> = None;
            self.proj_backward_group(
                (bi, 0),
                vec![
                    (sq, &dq_bf, q_amax),
                    (sk, &dk_bf, k_amax),
                    (sv, &dv_bf, v_amax),
                ],
                &mut dh,
            )?;
            let dh = dh.ok_or_else(|| Error::Shape("q projection gave no gradient".into()))?;
            self.mark("linear bwd")?;
            drop((dq_bf, dk_bf, dv_bf));
            let an = self.blocks[bi].attn_norm;
            // The next block down reads the gradient in bf16; the embedding in f32.
            let below = bi.checked_sub(1).map(|prev| (prev, 6));
            dres_bf = self.norm_bwd(&x, &rstd1, &[&dh], &mut dres, an, true, below)?;
            self.mark("rmsnorm bwd")?;
            if self.shard.is_some() {
                let ids: Vec<usize> = (1 + 9 * bi..1 + 9 * (bi + 1)).collect();
                flushing.extend(self.start_flush(&ids)?);
                self.release_block_bf16(bi)?;
                self.mark("reduce-scatter start")?;
            }
        }
        for f in flushing {
            self.finish_flush(f)?;
        }
        if self.lora.is_some() {
            // The embedding is frozen.
            return Ok(());
        }
        // Embedding: rows of dres added to their tokens' rows, in order.
        let sl = self.slots[self.embed_slot].clone();
        let mut gview = self.grad.slice_mut(sl.offset..sl.offset + sl.numel);
        let ci = c as i32;
        unsafe {
            s.launch_builder(&self.f.embed_bwd)
                .arg(&dres)
                .arg(&starts)
                .arg(&rows)
                .arg(&mut gview)
                .arg(&ci)
                .launch(LaunchConfig {
                    grid_dim: (v as u32, c.div_ceil(128) as u32, 1),
                    block_dim: (128, 1, 1),
                    shared_mem_bytes: 0,
                })?;
        }
        if self.shard.is_some() {
            let nb = self.blocks.len();
            let ids: Vec<usize> = (0..self.slots.len())
                .filter(|&i| i == 0 || i > 9 * nb)
                .collect();
            self.flush_grads(&ids)?;
            self.mark("reduce-scatter")?;
        }
        Ok(())
    }

    /// The global L2 norm of the gradients (f64 partial sums, added in a fixed order).
    pub fn grad_norm(&self) -> Result<f64> {
        self.sum_squares(&self.grad).map(f64::sqrt)
    }

    /// Whether every element is finite: the f64 sum of squares of finite f32
    /// values cannot overflow, so it is finite exactly when they all are.
    fn all_finite(&self, x: &CudaSlice<f32>) -> Result<bool> {
        Ok(self.sum_squares(x)?.is_finite())
    }

    fn sum_squares(&self, x: &CudaSlice<f32>) -> Result<f64> {
        self.sum_squares_of(&x.slice(..))
    }

    fn sum_squares_of(&self, x: &cudarc::driver::CudaView<'_, f32>) -> Result<f64> {
        let mut partial: CudaSlice<f64> = self.gpu.alloc_zeros(NORM_BLOCKS, "norm partials")?;
        let n = x.len();
        unsafe {
            self.gpu
                .stream
                .launch_builder(&self.f.sumsq)
                .arg(x)
                .arg(&n)
                .arg(&mut partial)
                .launch(LaunchConfig {
                    grid_dim: (NORM_BLOCKS as u32, 1, 1),
                    block_dim: (256, 1, 1),
                    shared_mem_bytes: 0,
                })?;
        }
        Ok(self.gpu.download(&partial)?.iter().sum::<f64>())
    }

    /// The parameters whose accumulated gradient holds a NaN or inf, in
    /// backward order (the LM head first, the embedding last): the first one
    /// named is nearest to where the non-finite values entered the backward.
    pub fn nonfinite_grads(&self) -> Result<Vec<String>> {
        let mut out = Vec::new();
        for (i, sl) in self.slots.iter().enumerate().rev() {
            let v = match &self.shard {
                // This rank's shard of the summed gradients.
                Some(sh) => {
                    let part = sh.parts[i];
                    sh.gshard
                        .slice(part.shard_off..part.shard_off + part.numel())
                }
                None => self.grad.slice(sl.offset..sl.offset + sl.numel),
            };
            if !self.sum_squares_of(&v)?.is_finite() {
                out.push(sl.name.clone());
            }
        }
        Ok(out)
    }

    /// One AdamW step on the device from the accumulated gradients: clips by
    /// the global norm, updates masters and moments, rewrites the bf16 compute
    /// copies, rolls delayed-scaling histories. Returns the norm before
    /// clipping; a non-finite norm is an error and nothing is updated.
    pub fn adamw_step(&mut self, p: AdamParams) -> Result<f32> {
        if self.shard.is_some() {
            return self.adamw_step_sharded(p);
        }
        self.mark("other")?;
        let norm = self.grad_norm()? as f32;
        let (clip, bc1, bc2) = self.begin_step(norm, &p)?;
        let gpu = self.gpu;
        let s = &gpu.stream;
        // Which bf16 copy each slot writes: (block, projection, 0 weight / 1 lora_A / 2 lora_B).
        let mut targets: HashMap<usize, (usize, usize, u8)> = HashMap::new();
        for (bi, blk) in self.blocks.iter().enumerate() {
            if self.lora.is_some() {
                for (li, ab) in blk.adapter_slots.iter().enumerate() {
                    if let Some((sa, sb)) = *ab {
                        targets.insert(sa, (bi, li, 1));
                        targets.insert(sb, (bi, li, 2));
                    }
                }
            } else {
                for (li, &sl) in blk.lin_slot.iter().enumerate() {
                    targets.insert(sl, (bi, li, 0));
                }
            }
        }
        let lora = self.lora.is_some();
        // Tensors without amax go to `adamw_many`, ADAM_MANY a launch, up to
        // ADAM_MANY_MOST elements each: its grid is sized for a chunk's
        // largest tensor, so a large one (an embedding) keeps its own launch
        // rather than leaving most of the blocks of the small ones idle.
        let mut many: Vec<AdamTensor> = Vec::new();
        for si in 0..self.slots.len() {
            let sl = self.slots[si].clone();
            let wd = if sl.decay { p.weight_decay } else { 0.0 };
            let range = sl.offset..sl.offset + sl.numel;
            let mut pm = self.master.slice_mut(range.clone());
            let g = self.grad.slice(range.clone());
            let mut mm = self.m.slice_mut(range.clone());
            let mut vm = self.v.slice_mut(range);
            // A tensorwise projection's next weight quantization reads the
            // amax that AdamW computes while writing the bf16 copy.
            let mut amax = match targets.get(&si) {
                Some(&(bi, li, 0)) if self.fuse_amax && self.blocks[bi].lin[li].takes_amax() => {
                    Some(gpu.alloc_amax()?)
                }
                _ => None,
            };
            // A LoRA B also keeps its transpose (`GpuAdapter::bt`).
            let mut out_t = None;
            let out: Option<&mut CudaSlice<u16>> = match targets.get(&si) {
                Some(&(bi, li, 0)) => Some(&mut self.blocks[bi].lin[li].weight),
                Some(&(bi, li, which)) => {
                    let ad = self.blocks[bi].lora[li].adapter.as_mut().ok_or_else(|| {
                        Error::Shape(format!("{}: its layer has no adapter", sl.name))
                    })?;
                    if which == 1 {
                        Some(&mut ad.a)
                    } else {
                        out_t = Some((&mut ad.bt, ad.rank));
                        Some(&mut ad.b)
                    }
                }
                None if !lora && si == self.head_slot => Some(&mut self.head),
                None => None,
            };
            if amax.is_none() && sl.numel <= ADAM_MANY_MOST {
                check_adamw_copies(sl.numel, &out, &out_t)?;
                let ptr = |o: &mut CudaSlice<u16>| o.device_ptr_mut(s).0;
                let (out_t, t_cols) = match out_t {
                    Some((t, cols)) => (ptr(t), cols),
                    None => (0, 0),
                };
                many.push(AdamTensor {
                    off: sl.offset as u64,
                    n: sl.numel as u64,
                    out: out.map_or(0, ptr),
                    out_t,
                    t_cols: t_cols as u64,
                    wd,
                    pad: 0.0,
                });
                continue;
            }
            launch_adamw(
                s,
                &self.f.adamw,
                (&mut pm, &g, &mut mm, &mut vm),
                (out, &mut amax, out_t),
                &p,
                wd,
                (bc1, bc2, clip),
            )?;
            if let (Some(a), Some(&(bi, li, 0))) = (amax, targets.get(&si)) {
                self.blocks[bi].lin[li].set_weight_amax(a);
            }
        }
        for chunk in many.chunks(ADAM_MANY) {
            let mut list = AdamMany {
                t: [AdamTensor::default(); ADAM_MANY],
            };
            list.t[..chunk.len()].copy_from_slice(chunk);
            let most = chunk.iter().map(|t| t.n as usize).max().unwrap_or(0);
            let mut cfg = grid_stride(most);
            cfg.grid_dim.1 = chunk.len() as u32;
            // SAFETY: argument types match `adamw_many` in train.cu; each
            // tensor's `off .. off + n` lies in the flat buffers (a slot), its
            // copies (checked above) hold `n` elements and live in the model.
            unsafe {
                s.launch_builder(&self.f.adamw_many)
                    .arg(&mut self.master)
                    .arg(&self.grad)
                    .arg(&mut self.m)
                    .arg(&mut self.v)
                    .arg(&list)
                    .arg(&p.lr)
                    .arg(&p.beta1)
                    .arg(&p.beta2)
                    .arg(&p.eps)
                    .arg(&bc1)
                    .arg(&bc2)
                    .arg(&clip)
                    .launch(cfg)?;
            }
        }
        for blk in &mut self.blocks {
            for l in &mut blk.lin {
                l.update_scales(self.gpu)?;
            }
        }
        self.mark("adamw")?;
        Ok(norm)
    }

    /// Start an optimizer step whose gradient norm is `norm`: a non-finite
    /// norm is an error (nothing changes); else count the step and return the
    /// clipping factor and the two bias corrections.
    fn begin_step(&mut self, norm: f32, p: &AdamParams) -> Result<(f32, f32, f32)> {
        if !norm.is_finite() {
            return Err(Error::NonFinite);
        }
        let clip = if p.grad_clip > 0.0 && norm > p.grad_clip {
            p.grad_clip / norm
        } else {
            1.0
        };
        self.step += 1;
        let tt = self.step as i32;
        Ok((clip, 1.0 - p.beta1.powi(tt), 1.0 - p.beta2.powi(tt)))
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

/// LoRA mode.
impl<'g> GpuLlama<'g> {
    /// A model for LoRA fine-tuning: the base from named weights (Hugging
    /// Face names, any dtype, checked as [`GpuLlama::new`] checks them) is
    /// frozen, its block matrices stored as `spec.base` (FP8 quantized once
    /// here, one matrix at a time, by the CPU reference's `Base::new`, so the
    /// codes are those of the CPU `LoraLinear`), the embedding and norm gains
    /// in f32, the LM head in bf16. The targeted projections get adapters:
    /// `adapters` (PEFT names, as `octet_train::checkpoint::load_adapter`
    /// reads them) when given, else PEFT's initialisation with the seeds the
    /// CPU `Llama::into_lora` uses. Only the adapters train: the slots, the
    /// f32 masters, gradients and AdamW moments are theirs.
    pub fn new_lora(
        gpu: &'g Gpu,
        cfg: &LlamaConfig,
        weights: &HashMap<String, Tensor>,
        spec: &LoraSpec,
        adapters: Option<&HashMap<String, Tensor>>,
    ) -> Result<GpuLlama<'g>> {
        Self::new_lora_with(gpu, cfg, weights, spec, adapters, &mut HashMap::new())
    }

    /// [`GpuLlama::new_lora`] where a checkpoint stored some block matrices
    /// in FP8: those (by name, taken out of `as_stored`) become bases as stored,
    /// as the CPU's `Llama::into_lora_with` makes them
    /// (`octet_nn::lora::Base::from_checkpoint`).
    pub fn new_lora_with(
        gpu: &'g Gpu,
        cfg: &LlamaConfig,
        weights: &HashMap<String, Tensor>,
        spec: &LoraSpec,
        adapters: Option<&HashMap<String, Tensor>>,
        as_stored: &mut HashMap<String, octet_tensor::mixed::Fp8Weight>,
    ) -> Result<GpuLlama<'g>> {
        cfg.validate().map_err(|e| Error::Shape(e.to_string()))?;
        check_config(cfg)?;
        let d = cfg.head_dim();
        if d > MAX_HEAD_DIM {
            return Err(Error::Shape(format!(
                "head_dim {d}: the GPU attention kernels take at most {MAX_HEAD_DIM}"
            )));
        }
        for t in &spec.targets {
            if !PROJ_NAMES.iter().any(|(short, _)| short == t) {
                return Err(Error::Shape(format!(
                    "LoRA target '{t}': expected some of q, k, v, o, gate, up, down"
                )));
            }
        }
        if spec.targets.is_empty() || spec.rank == 0 {
            return Err(Error::Shape(
                "LoRA needs at least one target and a rank of at least 1".into(),
            ));
        }
        octet_nn::lora::check_dropout(spec.dropout).map_err(|e| Error::Shape(e.to_string()))?;
        if spec.recipe.scaling()
            != (octet_fp8::Scaling::Tensorwise {
                power_of_two: false,
            })
        {
            return Err(Error::Shape(format!(
                "GPU LoRA quantizes inputs and gradients with tensorwise current scaling; recipe {} runs LoRA on the CPU only",
                spec.recipe
            )));
        }
        let f = load_fns(gpu, d)?;
        let mut base_slots = Vec::new();
        let mut rep_host: Vec<f32> = Vec::new();
        let mut rep_off = Vec::new();
        let mut bases: Vec<Option<(GpuBase, usize, usize)>> = Vec::new();
        let mut head: Option<CudaSlice<u16>> = None;
        let mut remaining: HashMap<&str, &Tensor> =
            weights.iter().map(|(k, v)| (k.as_str(), v)).collect();
        let nl = cfg.num_hidden_layers;
        let to_bf16 = |t: &Tensor| -> Result<CudaSlice<u16>> {
            let b: Vec<half::bf16> = t
                .to_f32_vec()
                .iter()
                .map(|&x| half::bf16::from_f32(x))
                .collect();
            gpu.upload_bf16(&b)
        };
        for (si, (name, shape)) in Llama::param_shapes(cfg).into_iter().enumerate() {
            // Block matrices: slots 1 + 9 i + {1, 2, 3, 4, 6, 7, 8}; the LM head is last when untied.
            let in_block =
                si >= 1 && si <= 9 * nl && block_matrix_slots((si - 1) / 9).contains(&si);
            let is_head = !cfg.tie_word_embeddings && si == 1 + 9 * nl + 1;
            // A block matrix kept as stored in FP8 may have no dense copy in
            // `weights` (`octet_train::checkpoint::load_base_fp8` makes none).
            let dense = remaining.remove(name.as_str());
            if let Some(t) = dense.filter(|t| t.shape() != shape.as_slice()) {
                return Err(Error::Shape(format!(
                    "tensor {name} has shape {:?}, expected {shape:?}",
                    t.shape()
                )));
            }
            let missing = || Error::Shape(format!("missing tensor {name}"));
            let mut stored = None;
            if in_block {
                let (n, k) = (shape[0], shape[1]);
                let b = octet_nn::lora::Base::from_checkpoint(
                    &name,
                    (n, k),
                    dense,
                    spec.base,
                    as_stored,
                )
                .map_err(|e| Error::Shape(format!("{name}: {e}")))?;
                let gb = match b {
                    octet_nn::lora::Base::Fp8(w) => GpuBase::Fp8(gpu.upload_fp8_weight(&w)?),
                    octet_nn::lora::Base::Dense(w) => GpuBase::Bf16(to_bf16(&w)?),
                };
                stored = Some((gb, n, k));
                rep_off.push(None);
            } else if is_head {
                head = Some(to_bf16(dense.ok_or_else(missing)?)?);
                rep_off.push(None);
            } else {
                let t = dense.ok_or_else(missing)?;
                rep_off.push(Some(rep_host.len()));
                rep_host.extend(t.to_f32_vec());
                if si == 0 && cfg.tie_word_embeddings {
                    head = Some(to_bf16(t)?);
                }
            }
            bases.push(stored);
            base_slots.push(Slot {
                offset: 0,
                numel: shape.iter().product(),
                decay: shape.len() >= 2,
                name,
                shape,
            });
        }
        if cfg.tie_word_embeddings {
            remaining.remove("lm_head.weight");
        }
        if let Some(extra) = remaining.keys().next() {
            return Err(Error::Shape(format!(
                "unexpected tensor {extra} for this config"
            )));
        }
        // A stored FP8 block matrix that no parameter took (it has no dense
        // copy in `weights` to be caught above).
        if let Some(extra) = as_stored.keys().find(|n| n.ends_with("_proj.weight")) {
            return Err(Error::Shape(format!(
                "unexpected FP8 tensor {extra} for this config"
            )));
        }
        let head = head.ok_or_else(|| Error::Shape("no LM head".into()))?;
        // Adapters, in the order (and with the seeds) of the CPU `into_lora`.
        let mut given: Option<HashMap<&str, &Tensor>> =
            adapters.map(|a| a.iter().map(|(k, v)| (k.as_str(), v)).collect());
        let mut slots = Vec::new();
        let mut host = Vec::new();
        let mut blocks = Vec::with_capacity(nl);
        let mut seed = spec.seed;
        let scale = (spec.alpha / spec.rank as f64) as f32;
        for i in 0..nl {
            let base = 1 + 9 * i;
            let lin_slot = block_matrix_slots(i);
            let mut lora = Vec::with_capacity(7);
            let mut adapter_slots = [None; 7];
            for (li, &s) in lin_slot.iter().enumerate() {
                let (gb, n, k) = bases[s]
                    .take()
                    .ok_or_else(|| Error::Shape(format!("{}: no base", base_slots[s].name)))?;
                let (short, module) = PROJ_NAMES[li];
                let adapter = if spec.targets.iter().any(|t| t == short) {
                    seed += 1;
                    let prefix = format!("base_model.model.model.layers.{i}.{module}");
                    let init = octet_nn::lora::Adapter::init(n, k, spec.rank, spec.alpha, seed)
                        .map_err(|e| Error::Shape(e.to_string()))?;
                    let mut pick =
                        |suffix: &str, fresh: &Tensor, shape: [usize; 2]| -> Result<Vec<f32>> {
                            let name = format!("{prefix}.{suffix}.weight");
                            let t = match given.as_mut() {
                                Some(g) => g.remove(name.as_str()).ok_or_else(|| {
                                    Error::Shape(format!("adapter: missing tensor {name}"))
                                })?,
                                None => fresh,
                            };
                            if t.shape() != shape {
                                return Err(Error::Shape(format!(
                                    "adapter tensor {name} has shape {:?}, expected {shape:?}",
                                    t.shape()
                                )));
                            }
                            let v = t.to_f32_vec();
                            slots.push(Slot {
                                offset: host.len(),
                                numel: v.len(),
                                decay: true,
                                name,
                                shape: shape.to_vec(),
                            });
                            host.extend_from_slice(&v);
                            Ok(v)
                        };
                    let a = pick("lora_A", &init.a, [spec.rank, k])?;
                    let b = pick("lora_B", &init.b, [n, spec.rank])?;
                    adapter_slots[li] = Some((slots.len() - 2, slots.len() - 1));
                    let bf = |v: &[f32]| -> Result<CudaSlice<u16>> {
                        let b: Vec<half::bf16> =
                            v.iter().map(|&x| half::bf16::from_f32(x)).collect();
                        gpu.upload_bf16(&b)
                    };
                    Some(GpuAdapter::new(gpu, bf(&a)?, bf(&b)?, spec.rank, scale)?)
                } else {
                    None
                };
                lora.push(GpuLoraLinear::new(
                    gb,
                    (n, k),
                    adapter,
                    spec.compute,
                    spec.recipe.backward(),
                )?);
            }
            blocks.push(Block {
                attn_norm: base,
                mlp_norm: base + 5,
                lin: Vec::new(),
                lin_slot,
                lora,
                adapter_slots,
            });
        }
        if let Some(extra) = given.as_ref().and_then(|g| g.keys().next()) {
            return Err(Error::Shape(format!(
                "adapter: unexpected tensor {extra} for targets {:?}",
                spec.targets
            )));
        }
        let (cos, sin) = rope_tables(gpu, cfg)?;
        let master = gpu.upload(&host)?;
        let norm_slot = 1 + 9 * nl;
        Ok(GpuLlama {
            gpu,
            cfg: cfg.clone(),
            f,
            grad: gpu.alloc_zeros(master.len(), "adapter gradients")?,
            grad_unwritten: Vec::new(),
            m: gpu.alloc_zeros(master.len(), "AdamW first moments")?,
            v: gpu.alloc_zeros(master.len(), "AdamW second moments")?,
            master,
            slots,
            blocks,
            head,
            embed_slot: 0,
            norm_slot,
            head_slot: if cfg.tie_word_embeddings {
                0
            } else {
                norm_slot + 1
            },
            cos,
            sin,
            step: 0,
            check_layers: false,
            fuse_amax: true,
            saved_activations: SavedActivations::Full,
            recompute: 0,
            prof: Prof::from_env()?,
            shard: None,
            lora: Some(LoraMode {
                base_slots,
                rep: gpu.upload(&rep_host)?,
                rep_off,
                rank: spec.rank,
                alpha: spec.alpha,
                targets: PROJ_NAMES
                    .iter()
                    .filter(|(short, _)| spec.targets.iter().any(|t| t == short))
                    .map(|(_, m)| m.rsplit('.').next().unwrap_or(m).to_string())
                    .collect(),
                dropout: (spec.dropout > 0.0).then_some((spec.dropout, spec.seed)),
                dropout_round: 0,
                dropout_now: None,
            }),
        })
    }

    /// Names (PEFT's) and shapes of the adapter tensors [`GpuLlama::new_lora`]
    /// makes for `cfg` and `spec`, in slot order (what a checkpoint's
    /// optimizer state holds), without building the model.
    pub fn adapter_params(cfg: &LlamaConfig, spec: &LoraSpec) -> Vec<(String, Vec<usize>)> {
        let (c, f) = (cfg.hidden_size, cfg.intermediate_size);
        let kv = cfg.num_key_value_heads * cfg.head_dim();
        let dims = [(c, c), (kv, c), (kv, c), (c, c), (f, c), (f, c), (c, f)];
        let mut out = Vec::new();
        for i in 0..cfg.num_hidden_layers {
            for ((short, module), (n, k)) in PROJ_NAMES.iter().zip(dims) {
                if spec.targets.iter().any(|t| t == short) {
                    let prefix = format!("base_model.model.model.layers.{i}.{module}");
                    out.push((format!("{prefix}.lora_A.weight"), vec![spec.rank, k]));
                    out.push((format!("{prefix}.lora_B.weight"), vec![n, spec.rank]));
                }
            }
        }
        out
    }

    /// Whether the model is in LoRA mode ([`GpuLlama::new_lora`]).
    pub fn is_lora(&self) -> bool {
        self.lora.is_some()
    }

    /// Set which training forward comes next, for the LoRA dropout masks
    /// (as `octet_nn::llama::Llama::set_dropout_round`: each training
    /// forward draws its round's masks, then counts one up; the CPU model
    /// at the same round draws the same masks).
    pub fn set_dropout_round(&mut self, round: u64) {
        if let Some(mode) = &mut self.lora {
            mode.dropout_round = round;
        }
    }

    /// Set which backward comes next, for the salts of stochastic rounding
    /// (NVFP4 gradients), as `octet_nn::llama::Llama::set_grad_round`: every
    /// block linear counts its gradient quantizations, one a backward, and
    /// salts its rounding with the count; this sets each count to `round`.
    /// The trainer sets it every micro-step, so that a resumed run draws the
    /// bits an uninterrupted one draws, and ranks of sharded data parallel
    /// draw different ones. LoRA adapters round to nearest and count nothing.
    pub fn set_grad_round(&mut self, round: u64) {
        for blk in &mut self.blocks {
            for l in &mut blk.lin {
                l.set_grad_calls(round);
            }
        }
    }

    /// LoRA mode: rank, alpha and the targeted module names (`q_proj`, ...).
    pub fn lora_summary(&self) -> Option<(usize, f64, Vec<String>)> {
        self.lora
            .as_ref()
            .map(|lm| (lm.rank, lm.alpha, lm.targets.clone()))
    }

    /// LoRA mode: whether the `quantized` backward makes each output
    /// gradient's codes and its adapter's `du` in one read
    /// ([`GpuLoraLinear::fuse_cast_du`]; on by default).
    pub fn set_lora_fuse_cast_du(&mut self, on: bool) {
        for b in &mut self.blocks {
            for l in &mut b.lora {
                l.fuse_cast_du = on;
            }
        }
    }

    /// LoRA mode: whether the forward makes each input's E4M3 codes and its
    /// adapters' `u` in one read ([`GpuLoraLinear::fuse_cast_u`]; on by default).
    pub fn set_lora_fuse_cast_u(&mut self, on: bool) {
        for b in &mut self.blocks {
            for l in &mut b.lora {
                l.fuse_cast_u = on;
            }
        }
    }

    /// LoRA mode: whether every adapter's `B^T` copy is the transpose of its
    /// `B` (the copies AdamW writes; for the conformance suite).
    pub fn lora_transposes_match(&self) -> Result<bool> {
        for b in &self.blocks {
            for ad in b.lora.iter().filter_map(|l| l.adapter.as_ref()) {
                let (bb, bt) = (self.gpu.download(&ad.b)?, self.gpu.download(&ad.bt)?);
                let n = bb.len() / ad.rank;
                if bt.len() != bb.len()
                    || (0..bb.len()).any(|o| bt[o] != bb[(o % n) * ad.rank + o / n])
                {
                    return Ok(false);
                }
            }
        }
        Ok(true)
    }

    /// Device bytes of the block matrices' stored weights (the frozen base in
    /// LoRA mode: FP8 codes and factors, or bf16; the bf16 compute copies otherwise).
    pub fn base_bytes(&self) -> usize {
        self.blocks
            .iter()
            .map(|b| {
                b.lora.iter().map(|l| l.base.bytes()).sum::<usize>()
                    + b.lin.iter().map(|l| 2 * l.weight.len()).sum::<usize>()
            })
            .sum()
    }

    /// LoRA mode: the full model with every adapter merged, `W + (alpha/r) B
    /// A` in bf16 (Hugging Face names; embedding and norm gains in f32), one
    /// matrix on the device at a time (for sampling and `merge`).
    pub fn merged_weights(&self) -> Result<Vec<(String, Tensor)>> {
        let lm = self
            .lora
            .as_ref()
            .ok_or_else(|| Error::Shape("merged weights: the model is not in LoRA mode".into()))?;
        let gpu = self.gpu;
        let mut out = Vec::with_capacity(lm.base_slots.len());
        let mut mats: HashMap<usize, (usize, usize)> = HashMap::new();
        for (bi, b) in self.blocks.iter().enumerate() {
            for (li, &s) in b.lin_slot.iter().enumerate() {
                mats.insert(s, (bi, li));
            }
        }
        let bf16_tensor = |shape: &[usize], bits: Vec<u16>| -> Result<Tensor> {
            let v: Vec<half::bf16> = bits.into_iter().map(half::bf16::from_bits).collect();
            Tensor::from_bf16(shape, v).map_err(|e| Error::Shape(e.to_string()))
        };
        for (si, sl) in lm.base_slots.iter().enumerate() {
            let t = if let Some(&(bi, li)) = mats.get(&si) {
                let l = &self.blocks[bi].lora[li];
                let (n, k) = (l.n, l.k);
                let mut w = match &l.base {
                    GpuBase::Bf16(w) => gpu.stream.clone_dtod(w)?,
                    GpuBase::Fp8(w) => {
                        let block = match w.scaling {
                            octet_tensor::mixed::WeightScaling::Tensor => (n, k),
                            octet_tensor::mixed::WeightScaling::Channel => (1, k),
                            octet_tensor::mixed::WeightScaling::Block128 => (128, 128),
                        };
                        gpu.dequant_bf16(
                            w.row_major("merging a LoRA base")?,
                            &w.factors,
                            (n, k),
                            block,
                            w.format,
                        )?
                    }
                };
                if let Some(ad) = &l.adapter {
                    gpu.gemm_bf16_acc(
                        (&ad.b, false),
                        (&ad.a, false),
                        &mut w,
                        (n, k, ad.rank),
                        (ad.scale, 1.0),
                    )?;
                }
                bf16_tensor(&sl.shape, gpu.download(&w)?)?
            } else if si == self.head_slot && !self.cfg.tie_word_embeddings {
                bf16_tensor(&sl.shape, gpu.download(&self.head)?)?
            } else {
                let v = self.slot_view(si)?;
                let mut host = vec![0f32; sl.numel];
                gpu.stream.memcpy_dtoh(&v, &mut host)?;
                Tensor::from_f32(&sl.shape, host).map_err(|e| Error::Shape(e.to_string()))?
            };
            out.push((sl.name.clone(), t));
        }
        Ok(out)
    }

    /// Forward of projections `range` of block `bi`, which all read `x (n, K)`.
    fn proj_forward(
        &mut self,
        bi: usize,
        range: std::ops::Range<usize>,
        x: Rc<CudaSlice<u16>>,
        x_amax: Option<TensorAmax>,
        n: usize,
    ) -> Result<Vec<(CudaSlice<u16>, ProjSaved)>> {
        let gpu = self.gpu;
        let dropout = self.lora_dropout_mask(bi, range.start)?;
        Ok(if self.lora.is_some() {
            forward_group(self.lora_layers(bi, range), gpu, (x, x_amax, n), dropout)?
                .into_iter()
                .map(|(y, s)| (y, ProjSaved::Lora(s)))
                .collect()
        } else {
            forward_shared(&mut self.blocks[bi].lin[range], gpu, x, x_amax, n)?
                .into_iter()
                .map(|(y, s)| (y, ProjSaved::Full(Box::new(s))))
                .collect()
        })
    }

    /// Block `bi`'s LoRA layers `range`, keeping their inputs as the model's
    /// [`SavedActivations`] says ([`GpuLoraLinear::fp8_saved_input`]).
    fn lora_layers(&mut self, bi: usize, range: std::ops::Range<usize>) -> &mut [GpuLoraLinear] {
        let fp8 = self.saved_activations == SavedActivations::Fp8;
        let layers = &mut self.blocks[bi].lora[range];
        for l in layers.iter_mut() {
            l.fp8_saved_input = fp8;
        }
        layers
    }

    /// What projection `li` of block `bi` keeps for backward from input `x`,
    /// without computing its output.
    fn proj_saved_only(
        &mut self,
        bi: usize,
        li: usize,
        x: Rc<CudaSlice<u16>>,
        x_amax: Option<TensorAmax>,
        n: usize,
    ) -> Result<ProjSaved> {
        let gpu = self.gpu;
        let dropout = self.lora_dropout_mask(bi, li)?;
        let saved = match self.lora.is_some() {
            true => {
                let lora = self.lora_layers(bi, li..li + 1);
                forward_group_with(lora, gpu, (x, x_amax, n), dropout, false)?
                    .pop()
                    .map(|(_, s)| ProjSaved::Lora(s))
            }
            false => {
                let lin = &mut self.blocks[bi].lin[li..li + 1];
                forward_shared_with(lin, gpu, (x, x_amax, n), false)?
                    .pop()
                    .map(|(_, s)| ProjSaved::Full(Box::new(s)))
            }
        };
        saved.ok_or_else(|| Error::Shape("a forward returned no saved state".into()))
    }

    /// LoRA: the dropout mask of the input of block `bi`'s projection `li`
    /// (shared by the projections that read that input) in the current
    /// training forward; `None` outside LoRA, without dropout, or in an
    /// evaluation forward.
    fn lora_dropout_mask(&self, bi: usize, li: usize) -> Result<Option<Dropout>> {
        match self.lora.as_ref().map(|m| (m.dropout, m.dropout_now)) {
            Some((Some((p, seed)), Some(round))) => Ok(Some(
                Dropout::for_projection(p, (seed, round), bi, li)
                    .map_err(|e| Error::Shape(e.to_string()))?,
            )),
            _ => Ok(None),
        }
    }

    /// Backward of block `bi`'s projection `li` from `dy`: its weight's (or
    /// adapters') gradients into their slots, and its input gradient into
    /// `dx`: written there when `dx` is empty, added to it otherwise (the
    /// projections that read one input add theirs into one buffer, in
    /// order, which the norm's backward then reads once).
    fn proj_backward<D: GemmOut>(
        &mut self,
        (bi, li): (usize, usize),
        saved: ProjSaved,
        dy: &CudaSlice<u16>,
        dy_amax: Option<TensorAmax>,
        dx: &mut Option<CudaSlice<D>>,
    ) -> Result<()> {
        self.proj_backward_group((bi, li), vec![(saved, dy, dy_amax)], dx)
    }

    /// [`GpuLlama::proj_backward`] of block `bi`'s projections `li..`, which
    /// read one input, from `(saved, dy, dy_amax)` each. In LoRA mode the
    /// layers' adapters share their products ([`crate::lora::backward_group`]).
    fn proj_backward_group<D: GemmOut>(
        &mut self,
        (bi, li): (usize, usize),
        items: Vec<(ProjSaved, &CudaSlice<u16>, Option<TensorAmax>)>,
        dx: &mut Option<CudaSlice<D>>,
    ) -> Result<()> {
        if self.lora.is_some() {
            let mut saved = Vec::with_capacity(items.len());
            let mut dys = Vec::with_capacity(items.len());
            for (s, dy, amax) in items {
                match s {
                    ProjSaved::Lora(s) => saved.push(s),
                    ProjSaved::Full(_) => {
                        return Err(Error::Shape(
                            "a full projection's state in LoRA mode".into(),
                        ))
                    }
                }
                dys.push((dy, amax));
            }
            let n = saved.len();
            let layers = self.blocks[bi].lora.get(li..li + n).ok_or_else(|| {
                Error::Shape(format!("block {bi} has no projections {li}..{}", li + n))
            })?;
            let grads = crate::lora::backward_group(layers, self.gpu, saved, dys, dx)?;
            let mut adds = Vec::with_capacity(2 * grads.len());
            for (j, g) in grads.into_iter().enumerate() {
                if let (Some((da, db)), Some(Some((sa, sb)))) =
                    (g, self.blocks[bi].adapter_slots.get(li + j).copied())
                {
                    adds.push((sa, da));
                    adds.push((sb, db));
                }
            }
            return self.add_grads(&adds);
        }
        for (j, (s, dy, amax)) in items.into_iter().enumerate() {
            let ProjSaved::Full(s) = s else {
                return Err(Error::Shape(
                    "a LoRA projection's state outside LoRA mode".into(),
                ));
            };
            self.proj_backward_one((bi, li + j), *s, dy, amax, dx)?;
        }
        Ok(())
    }

    /// [`GpuLlama::proj_backward`] of one full (not LoRA) projection.
    fn proj_backward_one<D: GemmOut>(
        &mut self,
        (bi, li): (usize, usize),
        saved: GpuLinearSaved,
        dy: &CudaSlice<u16>,
        dy_amax: Option<TensorAmax>,
        dx: &mut Option<CudaSlice<D>>,
    ) -> Result<()> {
        match dx {
            Some(d) => {
                let mut add = AddTo(d.slice_mut(..));
                self.proj_backward_to((bi, li), saved, dy, dy_amax, &mut add)
            }
            None => {
                let lin = &self.blocks[bi].lin[li];
                let (n, k) = (lin.n, lin.k);
                // The layer checks dy's length; here (m, k) with m = rows of dy.
                let numel = dy.len() / n.max(1) * k;
                // SAFETY: the input-gradient GEMM writes every element (beta = 0).
                let mut d = unsafe { self.gpu.alloc_uninit::<D>(numel, "d_input")? };
                self.proj_backward_to((bi, li), saved, dy, dy_amax, &mut d)?;
                *dx = Some(d);
                Ok(())
            }
        }
    }

    /// [`GpuLlama::proj_backward_one`] into a given destination. The
    /// weight's gradient goes straight into its slot: written by the step's
    /// first GEMM there, added by later ones.
    fn proj_backward_to<D: GemmOut>(
        &mut self,
        (bi, li): (usize, usize),
        saved: GpuLinearSaved,
        dy: &CudaSlice<u16>,
        dy_amax: Option<TensorAmax>,
        dx: &mut impl GemmDst<D>,
    ) -> Result<()> {
        let gpu = self.gpu;
        let si = self.blocks[bi].lin_slot[li];
        let sl = &self.slots[si];
        let view = self.grad.slice_mut(sl.offset..sl.offset + sl.numel);
        let lin = &mut self.blocks[bi].lin[li];
        if self.grad_unwritten.get_mut(si).is_some_and(std::mem::take) {
            let mut dw = view;
            lin.backward_into(gpu, saved, dy, dy_amax, dx, &mut dw)
        } else {
            lin.backward_into(gpu, saved, dy, dy_amax, dx, &mut AddTo(view))
        }
    }
}

/// What AdamW writes besides the master: its bf16 copy, that copy's amax,
/// and a transposed bf16 copy with its row length (a LoRA B's `B^T`).
type AdamwCopies<'a> = (
    Option<&'a mut CudaSlice<u16>>,
    &'a mut Option<TensorAmax>,
    Option<(&'a mut CudaSlice<u16>, usize)>,
);

/// One AdamW update of `n = p.len()` elements: `(master, grad, m, v)`, and the
/// copies of [`AdamwCopies`] rewritten from the new master where given.
fn launch_adamw(
    s: &std::sync::Arc<cudarc::driver::CudaStream>,
    adamw: &CudaFunction,
    (pm, g, mm, vm): (
        &mut cudarc::driver::CudaViewMut<'_, f32>,
        &CudaView<'_, f32>,
        &mut cudarc::driver::CudaViewMut<'_, f32>,
        &mut cudarc::driver::CudaViewMut<'_, f32>,
    ),
    (out, out_amax, out_t): AdamwCopies<'_>,
    p: &AdamParams,
    wd: f32,
    (bc1, bc2, clip): (f32, f32, f32),
) -> Result<()> {
    let n = pm.len();
    if g.len() != n || mm.len() != n || vm.len() != n {
        return Err(Error::Shape("AdamW buffers of different lengths".into()));
    }
    check_adamw_copies(n, &out, &out_t)?;
    let null: u64 = 0;
    // SAFETY: argument types match `adamw` in train.cu; every buffer holds `n` elements.
    unsafe {
        let mut lb = s.launch_builder(adamw);
        lb.arg(pm).arg(g).arg(mm).arg(vm);
        match out {
            Some(o) => lb.arg(o),
            None => lb.arg(&null),
        };
        lb.arg(&n)
            .arg(&p.lr)
            .arg(&p.beta1)
            .arg(&p.beta2)
            .arg(&p.eps)
            .arg(&wd)
            .arg(&bc1)
            .arg(&bc2)
            .arg(&clip);
        push_amax(&mut lb, out_amax, &null);
        let t_cols = out_t.as_ref().map_or(0usize, |(_, c)| *c);
        match out_t {
            Some((t, _)) => lb.arg(t),
            None => lb.arg(&null),
        };
        lb.arg(&t_cols);
        lb.launch(grid_stride(n))?;
    }
    Ok(())
}

/// Test hooks: the attention kernels alone on given inputs.
impl GpuLlama<'_> {
    /// Attention forward and backward on bf16 `q (B*T, Hq*D)`, `k`, `v (B*T,
    /// Hkv*D)` and an f32 output gradient: `(out bf16, dq, dk, dv)`, for the
    /// conformance check against an f64 reference.
    #[allow(clippy::type_complexity)]
    pub fn attention_check(
        &self,
        q: &CudaSlice<u16>,
        k: &CudaSlice<u16>,
        v: &CudaSlice<u16>,
        dout: &CudaSlice<u16>,
        (b, t, hq, hkv, d): (usize, usize, usize, usize, usize),
    ) -> Result<(
        CudaSlice<u16>,
        CudaSlice<f32>,
        CudaSlice<f32>,
        CudaSlice<f32>,
    )> {
        let dims = (b, t, hq, hkv, d);
        let (out, lse) = self.attention_forward_bench(q, k, v, dims)?;
        let (dq, dk, dv) = self.attention_backward_bench(q, k, v, &out, dout, &lse, dims)?;
        Ok((out, dq, dk, dv))
    }

    /// Test hook: the attention backward as the projections read it (bf16,
    /// RoPE's backward applied to dq and dk) on the output and lse of the
    /// forward, stored by the wgmma kernels (`fused`, on Hopper) or by the
    /// f32 kernels and the `rope_bwd` / `to_bf16` passes: the three tensors'
    /// bits and their amax bits, for a bit-exact comparison of the two.
    #[allow(clippy::type_complexity)]
    pub fn attention_backward_bf16_check(
        &self,
        q: &CudaSlice<u16>,
        k: &CudaSlice<u16>,
        v: &CudaSlice<u16>,
        dout: &CudaSlice<u16>,
        dims: (usize, usize, usize, usize, usize),
        fused: bool,
    ) -> Result<([Vec<u16>; 3], [u32; 3])> {
        let (out, lse) = self.attention_forward_bench(q, k, v, dims)?;
        let mut am = [
            Some(self.gpu.alloc_amax()?),
            Some(self.gpu.alloc_amax()?),
            Some(self.gpu.alloc_amax()?),
        ];
        let (dq, dk, dv) =
            self.attention_backward_bf16_bench(q, k, v, &out, dout, &lse, dims, &mut am, fused)?;
        let s = &self.gpu.stream;
        let mut bits = [0u32; 3];
        for (i, a) in am.iter().flatten().enumerate() {
            bits[i] = s.clone_dtoh(&a.amax_bits)?[0];
        }
        Ok((
            [s.clone_dtoh(&dq)?, s.clone_dtoh(&dk)?, s.clone_dtoh(&dv)?],
            bits,
        ))
    }

    /// Benchmark hook: the attention backward as the training step runs it
    /// (bf16 gradients, RoPE's backward applied, amaxes into `amax` where
    /// given), stored by the kernels when `fused` (Hopper) or by the passes.
    #[allow(clippy::too_many_arguments, clippy::type_complexity)]
    pub fn attention_backward_bf16_bench(
        &self,
        q: &CudaSlice<u16>,
        k: &CudaSlice<u16>,
        v: &CudaSlice<u16>,
        out: &CudaSlice<u16>,
        dout: &CudaSlice<u16>,
        lse: &CudaSlice<f32>,
        dims: (usize, usize, usize, usize, usize),
        amax: &mut [Option<TensorAmax>; 3],
        fused: bool,
    ) -> Result<(CudaSlice<u16>, CudaSlice<u16>, CudaSlice<u16>)> {
        let inputs = self.backward_hook_inputs(q, k, v, out, dout, lse, dims)?;
        let [a0, a1, a2] = amax;
        self.attn_backward_bf16(inputs, [a0, a1, a2], fused)
    }

    /// The backward hooks' inputs, checked: the shapes of
    /// [`GpuLlama::check_attention_dims`] and whole out/dout/lse buffers.
    #[allow(clippy::too_many_arguments)]
    fn backward_hook_inputs<'a>(
        &self,
        q: &'a CudaSlice<u16>,
        k: &'a CudaSlice<u16>,
        v: &'a CudaSlice<u16>,
        out: &'a CudaSlice<u16>,
        dout: &'a CudaSlice<u16>,
        lse: &'a CudaSlice<f32>,
        dims: (usize, usize, usize, usize, usize),
    ) -> Result<AttnBwdIn<'a>> {
        self.check_attention_dims(q, k, v, dims)?;
        let (b, t, hq, _, d) = dims;
        if out.len() != b * t * hq * d || dout.len() != out.len() || lse.len() != b * hq * t {
            return Err(Error::Shape(format!(
                "attention hook: out/dout/lse of {}/{}/{} elements for B={b} T={t} Hq={hq} D={d}",
                out.len(),
                dout.len(),
                lse.len()
            )));
        }
        Ok(AttnBwdIn {
            q,
            k,
            v,
            out: OutRef::Bf16(out),
            dout,
            lse,
            dims,
        })
    }

    /// The hooks' shape check: the model's head dim, whole query groups, a
    /// sequence within the model's positions (the bf16 backward rotates dq
    /// and dk back with the rotary tables, which hold that many rows), and
    /// buffers of the sizes the kernels read.
    fn check_attention_dims(
        &self,
        q: &CudaSlice<u16>,
        k: &CudaSlice<u16>,
        v: &CudaSlice<u16>,
        (b, t, hq, hkv, d): (usize, usize, usize, usize, usize),
    ) -> Result<()> {
        let n = b * t;
        if d != self.cfg.head_dim()
            || d > MAX_HEAD_DIM
            || hkv == 0
            || hq % hkv != 0
            || t > self.cfg.max_position_embeddings
            || q.len() != n * hq * d
            || k.len() != n * hkv * d
            || v.len() != n * hkv * d
        {
            return Err(Error::Shape(format!(
                "attention hook: head_dim {d} (model {}), heads {hq}/{hkv}, T {t} (model positions {}), B*T {n}, q/k/v of {}/{}/{} elements",
                self.cfg.head_dim(),
                self.cfg.max_position_embeddings,
                q.len(),
                k.len(),
                v.len()
            )));
        }
        Ok(())
    }

    /// Benchmark hook: the attention forward alone, `(out bf16, lse)`.
    pub fn attention_forward_bench(
        &self,
        q: &CudaSlice<u16>,
        k: &CudaSlice<u16>,
        v: &CudaSlice<u16>,
        dims: (usize, usize, usize, usize, usize),
    ) -> Result<(CudaSlice<u16>, CudaSlice<f32>)> {
        self.check_attention_dims(q, k, v, dims)?;
        self.attn_forward(q, k, v, dims, &mut None)
    }

    /// Benchmark hook: the attention backward alone (its `delta` pass
    /// included), `(dq, dk, dv)`.
    #[allow(clippy::too_many_arguments)]
    pub fn attention_backward_bench(
        &self,
        q: &CudaSlice<u16>,
        k: &CudaSlice<u16>,
        v: &CudaSlice<u16>,
        out: &CudaSlice<u16>,
        dout: &CudaSlice<u16>,
        lse: &CudaSlice<f32>,
        dims: (usize, usize, usize, usize, usize),
    ) -> Result<(CudaSlice<f32>, CudaSlice<f32>, CudaSlice<f32>)> {
        self.attn_backward(self.backward_hook_inputs(q, k, v, out, dout, lse, dims)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adapter_params_are_the_cpu_lora_models_params() {
        use octet_nn::lora::{BaseFormat, Compute};
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

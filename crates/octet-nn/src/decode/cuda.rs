//! Decoding of a Llama model on the GPU with a KV cache: the block matrices
//! as FP8 (weight-only products, `octet_cuda::mixed`) or bf16 (cuBLASLt), the glue in
//! `kernels/decode.cu`. One sequence: a prompt's rows at once
//! ([`GpuDecoder::prefill`]), then one token a step ([`GpuDecoder::step`], a
//! replayed CUDA graph). The residual stream is f32, the inputs of the
//! products bf16, the KV cache f32; the LM head is a bf16 product on the
//! last row. Logits come back to the host ([`GpuDecoder::step`]), or the
//! next token is sampled on the device and the steps queue back to back
//! with no host round trip a token ([`GpuDecoder::generate`]).

use crate::llama::LlamaConfig;
use cudarc::driver::{
    CudaFunction, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg,
};
use octet_cuda::launch::Dep;
use octet_cuda::mixed::{DeviceFp8Weight, SMALL_M};
use octet_cuda::{nvrtc, Error, Gpu, Result};
use octet_fp8::Format;
use octet_tensor::mixed::{Fp8Weight, WeightScaling};
use octet_tensor::Tensor;
use std::collections::HashMap;

/// How the block matrices are stored on the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GpuWeights {
    /// FP8 codes with scales, upcast inside the product.
    Fp8(Format, WeightScaling),
    /// bf16, multiplied by cuBLASLt.
    Bf16,
}

enum Mat {
    Fp8(DeviceFp8Weight),
    Bf16(CudaSlice<u16>, usize, usize),
}

impl Mat {
    fn bytes(&self) -> usize {
        match self {
            Mat::Fp8(w) => w.bytes(),
            Mat::Bf16(w, ..) => 2 * w.len(),
        }
    }
}

struct Layer {
    attn_norm: CudaSlice<f32>,
    mlp_norm: CudaSlice<f32>,
    /// The family's additions: the q, k and v biases stacked as the qkv
    /// rows are (Qwen2), the o bias, Qwen3's q and k norm gains.
    qkv_bias: Option<CudaSlice<f32>>,
    o_bias: Option<CudaSlice<f32>>,
    qk_norm: Option<(CudaSlice<f32>, CudaSlice<f32>)>,
    /// qkv (stacked), o, gate+up (interleaved by 8 features where the
    /// width allows, else stacked: `gu_group`), down.
    mats: Vec<Mat>,
    k_cache: CudaSlice<f32>,
    v_cache: CudaSlice<f32>,
}

struct Fns {
    embed: CudaFunction,
    rmsnorm: CudaFunction,
    add_rmsnorm: CudaFunction,
    rope_store: CudaFunction,
    attend: CudaFunction,
    swiglu: CudaFunction,
    sample: CudaFunction,
    bias_rows: CudaFunction,
    head_norm_qk: CudaFunction,
}

/// The activations of `rows` tokens at consecutive positions (1: a step;
/// more: a prompt's rows at once), each row-major `(rows, width)`.
struct Buffers {
    rows: usize,
    /// The position of row 0, then the rows' tokens: what the kernels read.
    state: CudaSlice<i32>,
    x: CudaSlice<f32>,
    h: CudaSlice<u16>,
    /// q, k, v of each row, one after the other.
    qkv: CudaSlice<f32>,
    a: CudaSlice<u16>,
    o: CudaSlice<f32>,
    /// gate and up of each row, in groups of `gu_group` features.
    gu: CudaSlice<f32>,
    act: CudaSlice<u16>,
    /// Each attention run's max score, sum and unnormalised output, `(rows, hq, runs, d + 2)`.
    att_part: CudaSlice<f32>,
    /// Finished runs of each row and head (reset to 0 by the last).
    att_count: CudaSlice<u32>,
    /// The last row's final norm, and its logits.
    last_h: CudaSlice<u16>,
    logits: CudaSlice<f32>,
}

impl Buffers {
    fn new(gpu: &Gpu, cfg: &LlamaConfig, rows: usize, runs: usize) -> Result<Buffers> {
        let (c, ff, v) = (cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size);
        let (hq, d) = (cfg.num_attention_heads, cfg.head_dim());
        let kvw = cfg.num_key_value_heads * d;
        Ok(Buffers {
            rows,
            state: gpu.alloc_zeros(1 + rows, "decode state")?,
            x: gpu.alloc_zeros(rows * c, "x")?,
            h: gpu.alloc_zeros(rows * c, "h")?,
            qkv: gpu.alloc_zeros(rows * (hq * d + 2 * kvw), "qkv")?,
            a: gpu.alloc_zeros(rows * hq * d, "a")?,
            o: gpu.alloc_zeros(rows * c, "o")?,
            gu: gpu.alloc_zeros(rows * 2 * ff, "gate, up")?,
            act: gpu.alloc_zeros(rows * ff, "act")?,
            att_part: gpu.alloc_zeros(rows * hq * runs * (d + 2), "attention runs")?,
            att_count: gpu.alloc_zeros(rows * hq, "attention run counters")?,
            last_h: gpu.alloc_zeros(c, "last row's norm")?,
            logits: gpu.alloc_zeros(v, "logits")?,
        })
    }
}

/// Prompt rows a prefill launch takes at once (longer prompts go in pieces).
pub const PREFILL_ROWS: usize = 256;

/// A Llama model on the GPU for generation (see the module docs).
pub struct GpuDecoder<'g> {
    gpu: &'g Gpu,
    /// Dimensions ([`GpuDecoder::cfg`]).
    pub(crate) cfg: LlamaConfig,
    /// The dimensions the buffers were made for (`cfg` is writable in the crate: a change
    /// to it is refused, not followed past the buffers' ends).
    built: LlamaConfig,
    f: Fns,
    embed: CudaSlice<f32>,
    /// Runs of the sequence an attention head is split into (`attend_decode`'s grid `(hq, runs, rows)`).
    att_runs: usize,
    /// The rotary tables `(max positions, D/2)`, cos then sin, as the CPU's `Rope` rounds them to f32.
    rope_cos: CudaSlice<f32>,
    rope_sin: CudaSlice<f32>,
    layers: Vec<Layer>,
    norm: CudaSlice<f32>,
    head: CudaSlice<u16>,
    /// The step's buffers (one row); `None` only while a step runs.
    buf: Option<Buffers>,
    len: usize,
    /// One step captured as a CUDA graph after the first (eager) step.
    graph: Option<cudarc::driver::CudaGraph>,
    /// One step and the sampling of its token, captured likewise.
    sampled_graph: Option<cudarc::driver::CudaGraph>,
    use_graph: bool,
    /// What [`GpuDecoder::generate`]'s sampling reads and writes: (step,
    /// top_k, temperature bits), a uniform a step, the tokens.
    gen: CudaSlice<i32>,
    uniforms: CudaSlice<f64>,
    tokens: CudaSlice<i32>,
}

/// The largest vocabulary [`GpuDecoder::generate`] samples from on the device
/// (`SAMPLE_MAX` in decode.cu: one block sorts the logits in shared memory).
pub const SAMPLE_MAX: usize = 2048;

/// Steps [`GpuDecoder::generate`] queues between two downloads of tokens.
const GENERATE_CHUNK: usize = 32;

/// Warps of an `attend_decode` block (its `__launch_bounds__(256, 3)`
/// in decode.cu assumes 8).
const ATT_WARPS: usize = 8;
/// The largest head dim `attend_decode` takes (`32 * ATT_R` in decode.cu).
const ATT_MAX_HEAD_DIM: usize = 256;

/// Shared memory of `attend_decode`: the warps' partial outputs, maxima and
/// sums, or (the last block of a head) the maxima and sums of up to 64 runs.
fn attend_smem(d: usize) -> usize {
    (ATT_WARPS * (d + 2)).max(2 * 64) * 4
}

/// Runs of the sequence each attention head is split into: enough blocks
/// for two an SM, but runs of at least 32 positions at the longest sequence.
fn attend_runs(sms: usize, hq: usize, positions: usize) -> usize {
    (2 * sms)
        .div_ceil(hq.max(1))
        .min(positions / 32)
        .clamp(1, 64)
}

fn cfg1(threads: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (threads.div_ceil(256) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

impl<'g> GpuDecoder<'g> {
    /// Upload a model from named weights (Hugging Face names), the block
    /// matrices stored as `weights`. Matrix `K` dims must be multiples of 16.
    /// The weights must match `cfg` exactly, as
    /// [`crate::llama::Llama::check_weights`] says (the kernels index the
    /// embedding and the norms by `cfg`'s dimensions).
    pub fn new(
        gpu: &'g Gpu,
        cfg: &LlamaConfig,
        w: &HashMap<String, Tensor>,
        weights: GpuWeights,
    ) -> Result<GpuDecoder<'g>> {
        crate::llama::Llama::check_weights(cfg, w).map_err(|e| Error::Shape(e.to_string()))?;
        if let Some(why) = unsupported_config(cfg) {
            return Err(Error::Unsupported(why));
        }
        let module = gpu.ctx.load_module(nvrtc::compile(
            "decode",
            octet_cuda::kernel_source("decode")?,
            gpu.arch,
        )?)?;
        let f = |n: &str| -> Result<CudaFunction> { Ok(module.load_function(n)?) };
        let fns = Fns {
            embed: f("embed_row")?,
            rmsnorm: f("rmsnorm_bf16")?,
            add_rmsnorm: f("add_rmsnorm_bf16")?,
            rope_store: f("rope_store")?,
            attend: f("attend_decode")?,
            swiglu: f("swiglu_bf16")?,
            sample: f("sample_token")?,
            bias_rows: f("bias_rows")?,
            head_norm_qk: f("head_norm_qk")?,
        };
        let get = |n: &str| -> Result<&Tensor> {
            w.get(n)
                .ok_or_else(|| Error::Shape(format!("missing tensor {n}")))
        };
        let att_runs = attend_runs(
            gpu.sm_count.max(1) as usize,
            cfg.num_attention_heads,
            cfg.max_position_embeddings,
        );
        let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
        for i in 0..cfg.num_hidden_layers {
            layers.push(upload_layer(gpu, cfg, w, i, weights)?);
        }
        let embed = get("model.embed_tokens.weight")?;
        let head = if cfg.tie_word_embeddings {
            embed
        } else {
            get("lm_head.weight")?
        };
        let buf = Buffers::new(gpu, cfg, 1, att_runs)?;
        let rope = crate::rope::Rope::for_config(cfg).map_err(|e| Error::Shape(e.to_string()))?;
        let (cos, sin) = rope.tables_f32();
        Ok(GpuDecoder {
            gpu,
            cfg: cfg.clone(),
            built: cfg.clone(),
            f: fns,
            embed: gpu.upload(&embed.to_f32_vec())?,
            att_runs,
            rope_cos: gpu.upload(&cos)?,
            rope_sin: gpu.upload(&sin)?,
            layers,
            norm: gpu.upload(&get("model.norm.weight")?.to_f32_vec())?,
            head: gpu.upload_bf16(&bf16s(head))?,
            buf: Some(buf),
            len: 0,
            graph: None,
            sampled_graph: None,
            use_graph: true,
            gen: gpu.alloc_zeros(3, "sampling state")?,
            uniforms: gpu.alloc_zeros(cfg.max_position_embeddings, "sampling uniforms")?,
            tokens: gpu.alloc_zeros(cfg.max_position_embeddings, "sampled tokens")?,
        })
    }

    /// Replay one captured CUDA graph per step (default) or launch every
    /// kernel each step (`false`): the same kernels either way.
    pub fn set_graphs(&mut self, on: bool) {
        self.use_graph = on;
        if !on {
            self.graph = None;
            self.sampled_graph = None;
        }
    }

    /// Device bytes of the block matrices.
    pub fn matrix_bytes(&self) -> usize {
        self.layers
            .iter()
            .flat_map(|l| &l.mats)
            .map(Mat::bytes)
            .sum()
    }

    /// Empty the cache.
    pub fn reset(&mut self) {
        self.len = 0;
    }

    /// Append one token; returns its logits `(V)`.
    pub fn step(&mut self, token: u32) -> Result<Vec<f32>> {
        self.check(&[token])?;
        let mut b = self
            .buf
            .take()
            .ok_or_else(|| Error::Shape("decoder in use".into()))?;
        let r = self.step_with(&mut b, token);
        self.buf = Some(b);
        r
    }

    fn step_with(&mut self, b: &mut Buffers, token: u32) -> Result<Vec<f32>> {
        let state = [self.len as i32, token as i32];
        self.gpu.stream.memcpy_htod(&state, &mut b.state)?;
        let may_capture = self.len > 0;
        self.run_step(b, false, may_capture)?;
        self.len += 1;
        self.gpu.download(&b.logits)
    }

    fn graph_slot(&mut self, sampled: bool) -> &mut Option<cudarc::driver::CudaGraph> {
        if sampled {
            &mut self.sampled_graph
        } else {
            &mut self.graph
        }
    }

    /// Queue one step (with its sampling when `sampled`): a replay of its
    /// CUDA graph, captured now if there is none yet and `may_capture`, or
    /// eager launches. The first step of a decoder runs eagerly (cuBLASLt
    /// plans, kernel loading), so the callers capture from the second.
    fn run_step(&mut self, b: &mut Buffers, sampled: bool, may_capture: bool) -> Result<()> {
        let enqueue = |d: &mut Self, b: &mut Buffers| {
            if sampled {
                d.enqueue_sampled(b)
            } else {
                d.enqueue(b)
            }
        };
        if self.graph_slot(sampled).is_none() && self.use_graph && may_capture {
            let s = self.gpu.stream.clone();
            s.begin_capture(
                cudarc::driver::sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            )?;
            let r = enqueue(self, b);
            let g = s.end_capture(cudarc::driver::sys::CUgraphInstantiate_flags(0))?;
            r?;
            *self.graph_slot(sampled) = g;
        }
        match self.graph_slot(sampled) {
            Some(g) => g.launch()?,
            None => enqueue(self, b)?,
        }
        Ok(())
    }

    /// Append a prompt's tokens, [`PREFILL_ROWS`] rows a launch (each product
    /// multiplies all of them, the attention of each row sees the positions up
    /// to its own); returns the logits `(V)` of the last. The same values as
    /// [`GpuDecoder::step`] over the tokens, up to the order of sums in the
    /// products.
    pub fn prefill(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        if tokens.is_empty() {
            return Err(Error::Shape("prefill of no tokens".into()));
        }
        self.check(tokens)?;
        // The pieces queue back to back; only the last one's logits come back.
        let mut last = None;
        for chunk in tokens.chunks(PREFILL_ROWS) {
            let mut b = Buffers::new(self.gpu, &self.cfg, chunk.len(), self.att_runs)?;
            let mut state = vec![self.len as i32];
            state.extend(chunk.iter().map(|&t| t as i32));
            self.gpu.stream.memcpy_htod(&state, &mut b.state)?;
            self.enqueue(&mut b)?;
            self.len += chunk.len();
            last = Some(b);
        }
        let b = last.ok_or_else(|| Error::Shape("prefill of no tokens".into()))?;
        self.gpu.download(&b.logits)
    }

    /// Whether [`GpuDecoder::generate`] can sample this model's vocabulary on
    /// the device (at most [`SAMPLE_MAX`] tokens).
    pub fn samples_on_device(&self) -> bool {
        self.cfg.vocab_size <= SAMPLE_MAX
    }

    /// `uniforms.len()` steps with sampling on the device: step `i` appends
    /// token `t_i` (`t_0 = first`) and samples `t_(i+1)` from its logits with
    /// `uniforms[i]`, exactly as `crate::decode::sample(logits,
    /// temperature, top_k, uniforms[i])` would on the host (see
    /// `sample_token` in decode.cu for the one way they can differ). The
    /// steps queue back to back, `GENERATE_CHUNK` between two downloads;
    /// `on_tokens` sees each chunk's tokens as they come. Returns
    /// `t_1 ..= t_n`.
    pub fn generate(
        &mut self,
        first: u32,
        uniforms: &[f64],
        temperature: f32,
        top_k: usize,
        mut on_tokens: impl FnMut(&[u32]),
    ) -> Result<Vec<u32>> {
        let n = uniforms.len();
        if !self.samples_on_device() {
            return Err(Error::Shape(format!(
                "sampling on the device takes vocabularies of up to {SAMPLE_MAX} tokens, the model has {}",
                self.cfg.vocab_size
            )));
        }
        self.check(&[first])?;
        if self.len + n > self.cfg.max_position_embeddings {
            return Err(Error::Shape(format!(
                "the cache is full: {} positions held, {n} more asked, {} in all",
                self.len, self.cfg.max_position_embeddings
            )));
        }
        let mut b = self
            .buf
            .take()
            .ok_or_else(|| Error::Shape("decoder in use".into()))?;
        let r = self.generate_with(
            &mut b,
            first,
            uniforms,
            (temperature, top_k),
            &mut on_tokens,
        );
        self.buf = Some(b);
        r
    }

    fn generate_with(
        &mut self,
        b: &mut Buffers,
        first: u32,
        uniforms: &[f64],
        (temperature, top_k): (f32, usize),
        on_tokens: &mut dyn FnMut(&[u32]),
    ) -> Result<Vec<u32>> {
        let n = uniforms.len();
        let s = self.gpu.stream.clone();
        s.memcpy_htod(&[self.len as i32, first as i32], &mut b.state)?;
        let k = top_k.min(i32::MAX as usize) as i32;
        s.memcpy_htod(&[0, k, temperature.to_bits() as i32], &mut self.gen)?;
        if n > 0 {
            let mut u = self.uniforms.slice_mut(0..n);
            s.memcpy_htod(uniforms, &mut u)?;
        }
        let mut out = Vec::with_capacity(n);
        let mut done = 0;
        while done < n {
            let c = GENERATE_CHUNK.min(n - done);
            for i in 0..c {
                self.run_step(b, true, done + i > 0)?;
                self.len += 1;
            }
            let got = s.clone_dtoh(&self.tokens.slice(done..done + c))?;
            // `sample_token` writes -1 for a row with an inf or NaN logit.
            if let Some(i) = got.iter().position(|&t| t < 0) {
                return Err(Error::NonFiniteLogits { step: done + i });
            }
            let got: Vec<u32> = got.into_iter().map(|t| t as u32).collect();
            on_tokens(&got);
            out.extend(got);
            done += c;
        }
        Ok(out)
    }

    /// `sample_token` alone on `logits` (at most the vocabulary, at most
    /// [`SAMPLE_MAX`]), for the selftest's comparison with the host's
    /// sampler. Leaves the cache as it was (the next step or `generate`
    /// rewrites `state`).
    pub(crate) fn sample_alone(
        &mut self,
        logits: &[f32],
        temperature: f32,
        top_k: usize,
        u: f64,
    ) -> Result<u32> {
        if logits.is_empty() || logits.len() > self.cfg.vocab_size.min(SAMPLE_MAX) {
            return Err(Error::Shape(format!(
                "{} logits: sampling takes 1 to {}",
                logits.len(),
                self.cfg.vocab_size.min(SAMPLE_MAX)
            )));
        }
        let mut b = self
            .buf
            .take()
            .ok_or_else(|| Error::Shape("decoder in use".into()))?;
        let s = self.gpu.stream.clone();
        let r = (|| -> Result<u32> {
            let mut l = b.logits.slice_mut(0..logits.len());
            s.memcpy_htod(logits, &mut l)?;
            let k = top_k.min(i32::MAX as usize) as i32;
            s.memcpy_htod(&[0, k, temperature.to_bits() as i32], &mut self.gen)?;
            let mut u0 = self.uniforms.slice_mut(0..1);
            s.memcpy_htod(&[u], &mut u0)?;
            self.launch_sample(&mut b, logits.len())?;
            let t = s.clone_dtoh(&self.tokens.slice(0..1))?[0];
            u32::try_from(t).map_err(|_| Error::NonFiniteLogits { step: 0 })
        })();
        self.buf = Some(b);
        r
    }

    /// One step, then its token sampled into `state` for the next.
    fn enqueue_sampled(&mut self, b: &mut Buffers) -> Result<()> {
        self.enqueue(b)?;
        let v = self.cfg.vocab_size;
        self.launch_sample(b, v)
    }

    /// `sample_token` over the first `v` logits of `b`.
    fn launch_sample(&mut self, b: &mut Buffers, v: usize) -> Result<()> {
        let cfg = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (1024, 1, 1),
            shared_mem_bytes: 0,
        };
        let v = v as i32;
        // SAFETY: `sample_token(logits, V, uniforms, gen, state, tokens)`;
        // logits hold at least V (<= SAMPLE_MAX, checked by the callers) floats, and `gen`'s step (below the
        // `n` of this call, which `generate` keeps within the cache) indexes
        // `uniforms` and `tokens` (max_position_embeddings each).
        unsafe {
            self.gpu
                .stream
                .launch_builder(&self.f.sample)
                .arg(&b.logits)
                .arg(&v)
                .arg(&self.uniforms)
                .arg(&mut self.gen)
                .arg(&mut b.state)
                .arg(&mut self.tokens)
                .launch(cfg)?;
        }
        Ok(())
    }

    /// The model's dimensions, as the decoder was built for them.
    pub fn cfg(&self) -> &LlamaConfig {
        &self.cfg
    }

    /// The tokens are in the vocabulary and fit in the cache after its `len`.
    fn check(&self, tokens: &[u32]) -> Result<()> {
        if self.cfg != self.built {
            return Err(Error::Shape(format!(
                "the decoder's cfg was changed after it was made (now {:?}, built for {:?}); \
                 its weights, cache and buffers keep the built dimensions",
                self.cfg, self.built
            )));
        }
        let (v, max) = (self.cfg.vocab_size, self.cfg.max_position_embeddings);
        if let Some(t) = tokens.iter().find(|&&t| t as usize >= v) {
            return Err(Error::Shape(format!(
                "token {t} outside the vocabulary of {v}"
            )));
        }
        if self.len + tokens.len() > max {
            return Err(Error::Shape(format!(
                "the cache is full: {} positions held, {} more asked, {max} in all",
                self.len,
                tokens.len()
            )));
        }
        Ok(())
    }

    /// Queue every kernel of `b.rows` tokens (position and tokens come from `b.state`).
    fn enqueue(&mut self, b: &mut Buffers) -> Result<()> {
        let cfg = &self.cfg;
        let (c, ff, v) = (cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size);
        let (hq, hkv, d) = (
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim(),
        );
        let (gpu, f) = (self.gpu, &self.f);
        let s = &gpu.stream;
        let rows = b.rows;
        let ru = rows as u32;
        let kvw = hkv * d;
        let (ci, ffi) = (c as i32, ff as i32);
        let (hqi, hkvi, di) = (hq as i32, hkv as i32, d as i32);
        let eps = cfg.rms_norm_eps as f32;
        let scale = 1.0 / (d as f32).sqrt();
        let pdl = gpu.pdl();
        let norm_cfg = LaunchConfig {
            grid_dim: (ru, 1, 1),
            block_dim: (1024, 1, 1),
            shared_mem_bytes: 0,
        };
        let rows_of = |threads: usize| {
            let mut c = cfg1(threads);
            c.grid_dim.1 = ru;
            c
        };
        let runs = self.att_runs;
        let attend_cfg = LaunchConfig {
            grid_dim: (hq as u32, runs as u32, ru),
            block_dim: (32 * ATT_WARPS as u32, 1, 1),
            shared_mem_bytes: attend_smem(d) as u32,
        };
        // SAFETY (every launch below): argument types match the kernels in
        // decode.cu and every buffer has `rows` rows of the width the kernel
        // indexes; positions up to `state[0] + rows - 1` are below
        // max_position_embeddings (`check`).
        // The embedding follows the host's copy of `state`: a plain launch.
        unsafe {
            s.launch_builder(&f.embed)
                .arg(&self.embed)
                .arg(&b.state)
                .arg(&mut b.x)
                .arg(&ci)
                .launch(rows_of(c))?;
        }
        // `b.o` holds the output of the previous block's last product, added
        // to the residual stream by the norm that follows it.
        for (i, layer) in self.layers.iter_mut().enumerate() {
            if i == 0 {
                let mut a = Dep::new(s);
                a.ptr(&b.x)
                    .ptr(&layer.attn_norm)
                    .ptr_mut(&mut b.h)
                    .i32(ci)
                    .f32(eps);
                unsafe { a.launch(&f.rmsnorm, norm_cfg, pdl) }?;
            } else {
                let n = (&b.o, &layer.attn_norm);
                add_rmsnorm(
                    s,
                    &f.add_rmsnorm,
                    &mut b.x,
                    n,
                    &mut b.h,
                    (ci, eps),
                    norm_cfg,
                    pdl,
                )?;
            }
            apply(gpu, &layer.mats[0], &b.h, &mut b.qkv, rows)?;
            qkv_family(s, f, layer, &mut b.qkv, (cfg, rows), pdl)?;
            let mut a = Dep::new(s);
            a.ptr_mut(&mut b.qkv)
                .ptr(&self.rope_cos)
                .ptr(&self.rope_sin)
                .ptr_mut(&mut layer.k_cache)
                .ptr_mut(&mut layer.v_cache)
                .ptr(&b.state)
                .i32(hqi)
                .i32(hkvi)
                .i32(di);
            unsafe { a.launch(&f.rope_store, rows_of((hq + hkv) * d / 2 + kvw), pdl) }?;
            let mut a = Dep::new(s);
            a.ptr(&b.qkv)
                .ptr(&layer.k_cache)
                .ptr(&layer.v_cache)
                .ptr_mut(&mut b.a)
                .ptr(&b.state)
                .i32(hqi)
                .i32(hkvi)
                .i32(di)
                .f32(scale)
                .ptr_mut(&mut b.att_part)
                .ptr_mut(&mut b.att_count);
            unsafe { a.launch(&f.attend, attend_cfg, pdl) }?;
            apply(gpu, &layer.mats[1], &b.a, &mut b.o, rows)?;
            if let Some(bias) = &layer.o_bias {
                bias_rows(s, &f.bias_rows, &mut b.o, bias, rows, pdl)?;
            }
            let n = (&b.o, &layer.mlp_norm);
            add_rmsnorm(
                s,
                &f.add_rmsnorm,
                &mut b.x,
                n,
                &mut b.h,
                (ci, eps),
                norm_cfg,
                pdl,
            )?;
            match &layer.mats[2] {
                // Up to SMALL_M rows the product's epilogue applies SwiGLU.
                Mat::Fp8(w) if rows <= SMALL_M && gu_group(ff) == 8 => {
                    gpu.mixed_matmul_swiglu(&b.h, rows, w, &mut b.act)?
                }
                m => {
                    apply(gpu, m, &b.h, &mut b.gu, rows)?;
                    let mut a = Dep::new(s);
                    a.ptr(&b.gu)
                        .ptr_mut(&mut b.act)
                        .i32(ffi)
                        .i32(gu_group(ff) as i32);
                    unsafe { a.launch(&f.swiglu, rows_of(ff), pdl) }?;
                }
            }
            apply(gpu, &layer.mats[3], &b.act, &mut b.o, rows)?;
        }
        // The final norm and the head for the last row only.
        let last = (rows - 1) * c..rows * c;
        let mut xl = b.x.slice_mut(last.clone());
        let ol = b.o.slice(last);
        let one = LaunchConfig {
            grid_dim: (1, 1, 1),
            ..norm_cfg
        };
        let n = (&ol, &self.norm);
        add_rmsnorm(
            s,
            &f.add_rmsnorm,
            &mut xl,
            n,
            &mut b.last_h,
            (ci, eps),
            one,
            pdl,
        )?;
        gpu.gemm_bf16(&b.last_h, &self.head, &mut b.logits, (1, v, c))
    }
}

/// `x += y; h = rmsnorm(x) * g` (bf16) with `yg = (y, g)` and `ce = (C,
/// eps)`, a block of 1024 threads a row (`cfg`'s grid: the rows).
#[allow(clippy::too_many_arguments)]
fn add_rmsnorm(
    s: &CudaStream,
    f: &CudaFunction,
    x: &mut impl DevicePtrMut<f32>,
    yg: (&impl DevicePtr<f32>, &CudaSlice<f32>),
    h: &mut impl DevicePtrMut<u16>,
    ce: (i32, f32),
    cfg: LaunchConfig,
    pdl: bool,
) -> Result<()> {
    let mut a = Dep::new(s);
    a.ptr_mut(x)
        .ptr(yg.0)
        .ptr(yg.1)
        .ptr_mut(h)
        .i32(ce.0)
        .f32(ce.1);
    // SAFETY: the arguments are `add_rmsnorm_bf16`'s; x, y and h hold a row
    // of `C` for each block of `cfg`, g holds `C`.
    unsafe { a.launch(f, cfg, pdl) }
}

/// Block `i` of the model on the device: its norms, the family's biases and
/// q/k norm gains, the four products' matrices stored as `weights`, and an
/// empty KV cache of `max_position_embeddings` positions.
fn upload_layer(
    gpu: &Gpu,
    cfg: &LlamaConfig,
    w: &HashMap<String, Tensor>,
    i: usize,
    weights: GpuWeights,
) -> Result<Layer> {
    let get = |n: &str| -> Result<&Tensor> {
        w.get(n)
            .ok_or_else(|| Error::Shape(format!("missing tensor {n}")))
    };
    let kvw = cfg.num_key_value_heads * cfg.head_dim();
    let ff = cfg.intermediate_size;
    let gu_group = gu_group(ff);
    let p = format!("model.layers.{i}");
    // Four products per block: q, k and v as one matrix (rows stacked), o,
    // gate and up as one (interleaved by 8 features when
    // intermediate_size allows, for the fused SwiGLU product), down.
    // Fewer, larger launches; with per-channel scales the codes are
    // exactly those of the separate matrices.
    let rows_of = |names: &[&str]| -> Result<(Vec<f32>, usize, usize)> {
        let (mut data, mut n, mut k) = (Vec::new(), 0, 0);
        for m in names {
            let t = get(&format!("{p}.{m}.weight"))?;
            let (tn, tk) = t.dims2().map_err(|e| Error::Shape(e.to_string()))?;
            if k != 0 && tk != k {
                return Err(Error::Shape(format!("{m}: {tk} columns, expected {k}")));
            }
            k = tk;
            n += tn;
            data.extend(t.to_f32_vec());
        }
        Ok((data, n, k))
    };
    let mut mats = Vec::with_capacity(4);
    for names in [
        &["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"][..],
        &["self_attn.o_proj"][..],
        &["mlp.gate_proj", "mlp.up_proj"][..],
        &["mlp.down_proj"][..],
    ] {
        let (mut data, n, k) = rows_of(names)?;
        if names[0] == "mlp.gate_proj" && gu_group == 8 {
            data = octet_cuda::mixed::interleave_gate_up(&data, ff, k)?;
        }
        mats.push(match weights {
            GpuWeights::Fp8(fmt, s) => {
                let q = Fp8Weight::quantize(&data, n, k, fmt, s)
                    .map_err(|e| Error::Shape(e.to_string()))?;
                Mat::Fp8(gpu.upload_fp8_weight_tiled(&q)?)
            }
            GpuWeights::Bf16 => {
                let b: Vec<half::bf16> = data.iter().map(|&x| half::bf16::from_f32(x)).collect();
                Mat::Bf16(gpu.upload_bf16(&b)?, n, k)
            }
        });
    }
    let vec_of = |names: &[&str]| -> Result<CudaSlice<f32>> {
        let mut data = Vec::new();
        for m in names {
            data.extend(get(&format!("{p}.{m}"))?.to_f32_vec());
        }
        gpu.upload(&data)
    };
    Ok(Layer {
        attn_norm: vec_of(&["input_layernorm.weight"])?,
        mlp_norm: vec_of(&["post_attention_layernorm.weight"])?,
        qkv_bias: match cfg.qkv_bias {
            true => Some(vec_of(&[
                "self_attn.q_proj.bias",
                "self_attn.k_proj.bias",
                "self_attn.v_proj.bias",
            ])?),
            false => None,
        },
        o_bias: match cfg.o_bias {
            true => Some(vec_of(&["self_attn.o_proj.bias"])?),
            false => None,
        },
        qk_norm: match cfg.qk_norm {
            true => Some((
                vec_of(&["self_attn.q_norm.weight"])?,
                vec_of(&["self_attn.k_norm.weight"])?,
            )),
            false => None,
        },
        mats,
        k_cache: gpu.alloc_zeros(cfg.max_position_embeddings * kvw, "k cache")?,
        v_cache: gpu.alloc_zeros(cfg.max_position_embeddings * kvw, "v cache")?,
    })
}

/// The family's steps between the qkv product and RoPE, on `rows` rows of
/// `qkv`: the q/k/v biases (Qwen2), then each q and k head normalized (Qwen3).
fn qkv_family(
    s: &CudaStream,
    f: &Fns,
    layer: &Layer,
    qkv: &mut CudaSlice<f32>,
    (cfg, rows): (&LlamaConfig, usize),
    pdl: bool,
) -> Result<()> {
    if let Some(bias) = &layer.qkv_bias {
        bias_rows(s, &f.bias_rows, qkv, bias, rows, pdl)?;
    }
    let Some((gq, gk)) = &layer.qk_norm else {
        return Ok(());
    };
    let (hq, hkv) = (cfg.num_attention_heads, cfg.num_key_value_heads);
    let width = (hq + 2 * hkv) * cfg.head_dim();
    if qkv.len() < rows * width {
        return Err(Error::Shape(format!(
            "q/k norms of {rows} rows of {width} in a {}-element buffer",
            qkv.len()
        )));
    }
    let mut a = Dep::new(s);
    a.ptr_mut(qkv)
        .ptr(gq)
        .ptr(gk)
        .i32(hq as i32)
        .i32(hkv as i32)
        .i32(cfg.head_dim() as i32)
        .f32(cfg.rms_norm_eps as f32);
    let heads = LaunchConfig {
        grid_dim: ((hq + hkv).div_ceil(8) as u32, rows as u32, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: `head_norm_qk` reads and writes the q and k heads of `rows`
    // rows of qkv (checked to hold them) and head_dim floats of each gain.
    unsafe { a.launch(&f.head_norm_qk, heads, pdl) }
}

/// `y (rows, width) += bias (width)` ([`bias_rows`] of decode.cu).
fn bias_rows(
    s: &CudaStream,
    f: &CudaFunction,
    y: &mut CudaSlice<f32>,
    bias: &CudaSlice<f32>,
    rows: usize,
    pdl: bool,
) -> Result<()> {
    let width = bias.len();
    if y.len() < rows * width {
        return Err(Error::Shape(format!(
            "bias of {width} for {rows} rows of a {}-element buffer",
            y.len()
        )));
    }
    let mut a = Dep::new(s);
    a.ptr_mut(y).ptr(bias).i32(width as i32);
    let cfg = LaunchConfig {
        grid_dim: (width.div_ceil(256) as u32, rows as u32, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: `bias_rows` reads `width` floats of the bias and adds them to
    // each of `rows` rows of y (checked to hold them).
    unsafe { a.launch(f, cfg, pdl) }
}

/// Why the GPU decoder cannot run `cfg`, if it cannot: a head width past
/// `attend_decode`'s (256). It runs every family switch of [`LlamaConfig`]
/// (the projections' biases, Qwen3's q/k norms, a head width of its own).
/// The message names the field and says that the CPU decodes the model.
pub fn unsupported_config(cfg: &LlamaConfig) -> Option<String> {
    let d = cfg.head_dim();
    (d > ATT_MAX_HEAD_DIM).then(|| {
        format!(
            "GPU decoding takes head_dim up to {ATT_MAX_HEAD_DIM}, not {d}; the CPU decodes this \
             model (--device cpu)"
        )
    })
}

fn bf16s(t: &Tensor) -> Vec<half::bf16> {
    t.to_f32_vec()
        .iter()
        .map(|&x| half::bf16::from_f32(x))
        .collect()
}

/// How the decoder's `gate+up` matrix groups its rows: 8 gate rows, then the
/// same features' 8 up rows (`interleave_gate_up`, what the fused SwiGLU
/// product takes), or all gates then all ups when `ff` (intermediate_size)
/// is not a multiple of 8.
fn gu_group(ff: usize) -> usize {
    if ff.is_multiple_of(8) {
        8
    } else {
        ff
    }
}

/// `y (rows, N) = x (rows, K) @ W^T`.
fn apply(
    gpu: &Gpu,
    m: &Mat,
    x: &CudaSlice<u16>,
    y: &mut CudaSlice<f32>,
    rows: usize,
) -> Result<()> {
    match m {
        Mat::Fp8(w) => gpu.mixed_matmul(x, rows, w, y),
        Mat::Bf16(w, n, k) => gpu.gemm_bf16(x, w, y, (rows, *n, *k)),
    }
}

#[cfg(test)]
mod tests {
    use super::attend_runs;

    #[test]
    fn attention_runs_fill_the_sms_but_stay_32_positions_long() {
        // ~1B model on an H100: 16 heads x 17 runs = 272 blocks, two an SM.
        assert_eq!(attend_runs(132, 16, 2048), 17);
        // The tiny model: 64 positions allow two runs of 32.
        assert_eq!(attend_runs(132, 4, 64), 2);
        // Short sequences and many heads: one run.
        assert_eq!(attend_runs(132, 4, 16), 1);
        assert_eq!(attend_runs(132, 512, 4096), 1);
        // Capped at 64 runs.
        assert_eq!(attend_runs(132, 1, 1 << 20), 64);
    }
}

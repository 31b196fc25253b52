//! LoRA on a frozen base: `y = x W^T + (alpha / r) (x A^T) B^T`, where the
//! base `W (N, K)` never trains and is stored in FP8 (or bf16), and only the
//! adapter `A (r, K)`, `B (N, r)` trains in f32.
//!
//! The base weight exists only in its stored form: an FP8 base is an
//! [`Fp8Weight`] (codes + scales, ~0.5x the bytes of bf16) and is never
//! dequantized into a persistent high-precision copy. Its forward is
//!
//! - `Compute::Fp8`: an FP8 GEMM, the input quantized under the layer's
//!   recipe (E4M3, current per-tensor scaling by default) times the FP8 codes;
//! - `Compute::Bf16`: the weight-only product, high-precision activations
//!   times the FP8 codes upcast inside the kernel ([`octet_tensor::mixed`]).
//!
//! Its input gradient `dy @ W` reads the same codes (upcast inside the loop,
//! [`octet_tensor::mixed::mixed_matmul_t`]), or, in the `quantized` backward
//! with a per-tensor FP8 base, is an FP8 GEMM of the E5M2 gradient with the
//! transposed codes (built for the call, 1 byte per weight, then dropped).
//!
//! What [`LoraSaved`] keeps: nothing for the base (no weight gradient, and
//! its input gradient reads the layer's own weight); for the adapter, its
//! input `x` once (FP8 row-wise copy in the `dequantized` backward, the
//! original tensor otherwise; under `Compute::Fp8` with `dequantized` it is
//! the very FP8 copy the base GEMM used) and `h = x A^T (M, r)`.
//!
//! LoRA dropout (PEFT's `lora_dropout`, [`Dropout`]) zeroes elements of the
//! adapter's input only (the base reads `x` whole). The mask is a counter
//! hash of a key and the element's index, so backward draws it again instead
//! of keeping it, and the CPU and GPU draw the same one. The kept elements
//! are not rescaled in the input: `1 / (1 - p)` joins the adapter's scale,
//! `s' = (alpha / r) / (1 - p)`, so `m * x` is exact in any dtype and
//!
//! ```text
//! h = (m*x) A^T    y += s' h B^T    dB = s' dy^T h    dh = s' dy B
//! dA = dh^T (m*x)  d_input += m * (dh A)
//! ```

pub mod cuda;

use crate::{Error, Result};
use octet_fp8::{
    BackwardMode, Format, Layout, QuantData, QuantSpec, QuantizedTensor, Recipe, Role, Scales,
    Scaling, Usage,
};
use octet_tensor::mixed::{mixed_matmul, mixed_matmul_t, Fp8Weight, WeightScaling};
use octet_tensor::{cpu, DType, Tensor};

/// How the frozen base weight is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BaseFormat {
    /// bf16, as loaded.
    Bf16,
    /// E4M3 codes with tensor, per-output-channel or 128x128 block scales.
    Fp8(WeightScaling),
}

impl BaseFormat {
    /// Parse `bf16`, `fp8-tensorwise`, `fp8-rowwise`, `fp8-block`.
    pub fn from_name(s: &str) -> Result<BaseFormat> {
        Ok(match s {
            "bf16" => BaseFormat::Bf16,
            "fp8-tensorwise" | "fp8" => BaseFormat::Fp8(WeightScaling::Tensor),
            "fp8-rowwise" => BaseFormat::Fp8(WeightScaling::Channel),
            "fp8-block" => BaseFormat::Fp8(WeightScaling::Block128),
            other => {
                return Err(Error::Config(format!(
                    "base format '{other}': expected bf16, fp8-tensorwise, fp8-rowwise or fp8-block"
                )))
            }
        })
    }

    /// The name [`BaseFormat::from_name`] reads (`fp8-tensorwise` for its
    /// alias `fp8`).
    pub fn name(&self) -> &'static str {
        match self {
            BaseFormat::Bf16 => "bf16",
            BaseFormat::Fp8(WeightScaling::Tensor) => "fp8-tensorwise",
            BaseFormat::Fp8(WeightScaling::Channel) => "fp8-rowwise",
            BaseFormat::Fp8(WeightScaling::Block128) => "fp8-block",
        }
    }
}

/// How the base's forward product runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compute {
    /// FP8 GEMM: the input is quantized too.
    Fp8,
    /// High-precision activations; an FP8 base is upcast inside the product.
    Bf16,
}

impl Compute {
    /// Parse `fp8` or `bf16`.
    pub fn from_name(s: &str) -> Result<Compute> {
        match s {
            "fp8" => Ok(Compute::Fp8),
            "bf16" => Ok(Compute::Bf16),
            other => Err(Error::Config(format!(
                "compute '{other}': expected fp8 or bf16"
            ))),
        }
    }
}

/// The frozen base weight.
#[derive(Clone, Debug)]
pub enum Base {
    /// A bf16 (or f32) tensor `(N, K)`.
    Dense(Tensor),
    /// FP8 codes and scales.
    Fp8(Fp8Weight),
}

impl Base {
    /// Store `w (N, K)` in `format`; an FP8 format quantizes it once here
    /// (E4M3, scale `448 / amax` per tensor, row or tile, nearest-even).
    pub fn new(w: &Tensor, format: BaseFormat) -> Result<Base> {
        let (n, k) = w.dims2()?;
        Ok(match format {
            BaseFormat::Bf16 => Base::Dense(w.to_dtype(DType::Bf16)),
            BaseFormat::Fp8(s) => {
                Base::Fp8(Fp8Weight::quantize(&w.to_f32_vec(), n, k, Format::E4M3, s)?)
            }
        })
    }

    /// The base of the `(n, k)` matrix `name` from a checkpoint: the FP8
    /// weight the checkpoint stored for it (taken out of `stored`) is kept as
    /// it is when `format` is an FP8 one, with its own scaling whatever
    /// `format`'s (no second quantization); otherwise `w`, its dense values
    /// (dequantized where it was stored in FP8), goes through [`Base::new`].
    /// `w` may be absent where the stored FP8 weight is kept (a reader that
    /// made no dense copy of it).
    pub fn from_checkpoint(
        name: &str,
        (n, k): (usize, usize),
        w: Option<&Tensor>,
        format: BaseFormat,
        stored: &mut std::collections::HashMap<String, Fp8Weight>,
    ) -> Result<Base> {
        match (stored.remove(name), format, w) {
            (Some(q), BaseFormat::Fp8(_), _) => {
                if (q.rows(), q.cols()) != (n, k) {
                    return Err(Error::Shape(format!(
                        "{name}: stored FP8 weight is ({}, {}), the model's ({n}, {k})",
                        q.rows(),
                        q.cols()
                    )));
                }
                Ok(Base::Fp8(q))
            }
            (_, _, Some(w)) if w.dims2()? == (n, k) => Base::new(w, format),
            (_, _, Some(w)) => Err(Error::Shape(format!(
                "{name} has shape {:?}, the model's ({n}, {k})",
                w.shape()
            ))),
            (_, _, None) => Err(Error::Shape(format!("missing tensor {name}"))),
        }
    }

    /// `(N, K)`.
    pub fn dims(&self) -> (usize, usize) {
        match self {
            Base::Dense(t) => (t.shape()[0], t.shape()[1]),
            Base::Fp8(w) => (w.rows(), w.cols()),
        }
    }

    /// Bytes the stored weight occupies.
    pub fn bytes(&self) -> usize {
        match self {
            Base::Dense(t) => t.bytes(),
            Base::Fp8(w) => w.bytes(),
        }
    }

    /// The weight in f32 `(N, K)` (for merging and references: a transient copy).
    pub fn dequantize(&self) -> Result<Tensor> {
        let (n, k) = self.dims();
        match self {
            Base::Dense(t) => Ok(t.try_to_dtype(DType::F32)?),
            Base::Fp8(w) => Ok(Tensor::from_f32(&[n, k], w.dequantize())?),
        }
    }
}

/// LoRA dropout on an adapter's input: element `i` of the row-major `(M, K)`
/// input is kept when its 16 random bits ([`Dropout::bits`]) are at least
/// [`Dropout::threshold`], so with probability `1 - p` up to 2^-17 (`p` is
/// resolved in steps of 2^-16; the kept elements' scale uses the exact
/// probability). One 64-bit hash serves four elements: the mask is cheap
/// to draw again, on the GPU too.
///
/// The adapters that read one input (q, k, v; gate, up) share its mask: the
/// GPU computes their products over the masked input once. (PEFT draws a mask
/// per module; a shared one drops the same features for q, k and v. The
/// expectation and the per-adapter drop rate are the same.)
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Dropout {
    /// Drop probability, in `[0, 1)`.
    pub p: f64,
    /// Key of the mask ([`dropout_key`]).
    pub key: u64,
}

impl Dropout {
    /// A mask of drop probability `p` (`0 <= p < 1`) and `key`.
    pub fn new(p: f64, key: u64) -> Result<Dropout> {
        check_dropout(p)?;
        Ok(Dropout { p, key })
    }

    /// The mask of projection `proj`'s input (index into
    /// [`crate::llama::PROJ_NAMES`]) in block `block` of training forward
    /// `round` of a run seeded `seed`: the key of its input's site
    /// ([`DROPOUT_SITE`], [`dropout_key`]), so the projections reading one
    /// input share it. What the CPU and GPU models both draw.
    pub fn for_projection(
        p: f64,
        (seed, round): (u64, u64),
        block: usize,
        proj: usize,
    ) -> Result<Dropout> {
        let site = *DROPOUT_SITE
            .get(proj)
            .ok_or_else(|| Error::Config(format!("no projection {proj} in a block")))?;
        Dropout::new(p, dropout_key(seed, round, block, site))
    }

    /// The mask as the GPU kernels draw it.
    pub fn device_mask(&self) -> octet_cuda::lora_ops::DropMask {
        octet_cuda::lora_ops::DropMask {
            key: self.key,
            threshold: self.threshold(),
        }
    }

    /// Elements whose bits are below this are dropped: `p 2^16` rounded to
    /// nearest (at most 65535, so some element is always kept).
    pub fn threshold(&self) -> u16 {
        (self.p * 65536.0).round().clamp(0.0, 65535.0) as u16
    }

    /// `1 / P(kept)` with the probability the threshold gives exactly,
    /// `2^16 / (2^16 - threshold)`: what the kept elements are scaled by.
    pub fn keep_scale(&self) -> f64 {
        65536.0 / (65536.0 - f64::from(self.threshold()))
    }

    /// The 16 random bits of element `i`: 16-bit lane `i % 4` (lowest first)
    /// of SplitMix64's finaliser over `key ^ (i / 4) * golden`.
    #[inline]
    pub fn bits(&self, i: u64) -> u16 {
        (self.group_bits(i / 4) >> (16 * (i % 4))) as u16
    }

    /// The 64 bits of elements `4 g .. 4 g + 4` (16 each, lowest first).
    #[inline]
    fn group_bits(&self, g: u64) -> u64 {
        splitmix64(self.key ^ g.wrapping_mul(GOLDEN))
    }

    /// Whether element `i` is kept.
    #[inline]
    pub fn keeps(&self, i: u64) -> bool {
        self.bits(i) >= self.threshold()
    }

    /// `x` with the dropped elements zeroed (not rescaled), in `x`'s dtype.
    pub fn mask(&self, x: &Tensor) -> Result<Tensor> {
        let thr = self.threshold();
        let mut v = x.try_to_f32_vec()?;
        // One hash per group of 4 elements.
        for (g, chunk) in v.chunks_mut(4).enumerate() {
            let h = self.group_bits(g as u64);
            for (lane, a) in chunk.iter_mut().enumerate() {
                if ((h >> (16 * lane)) as u16) < thr {
                    *a = 0.0;
                }
            }
        }
        Ok(Tensor::from_f32(x.shape(), v)?.into_dtype(x.dtype())?)
    }
}

/// The golden-ratio increment of SplitMix64.
const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// SplitMix64's output finaliser.
#[inline]
fn splitmix64(z: u64) -> u64 {
    let z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    let z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Check a LoRA dropout probability: finite, in `[0, 1)`.
pub fn check_dropout(p: f64) -> Result<()> {
    if !(0.0..1.0).contains(&p) {
        return Err(Error::Config(format!(
            "LoRA dropout {p}: expected a probability in [0, 1)"
        )));
    }
    Ok(())
}

/// Where in a block an adapter's input comes from, so the adapters that read
/// one tensor share its dropout mask: `0` the attention norm (q, k, v), `1`
/// the attention output (o), `2` the MLP norm (gate, up), `3` SwiGLU (down);
/// indexed like [`crate::llama::PROJ_NAMES`].
pub const DROPOUT_SITE: [u64; 7] = [0, 0, 0, 1, 2, 2, 3];

/// The dropout key of block `block`'s input `site` (see [`DROPOUT_SITE`]) in
/// training forward number `round` of a run seeded `seed`: SplitMix64 over
/// the four, so every (round, block, site) draws an unrelated mask.
pub fn dropout_key(seed: u64, round: u64, block: usize, site: u64) -> u64 {
    let z = splitmix64(seed ^ 0x6c6f_7261_6472_6f70); // "loradrop"
    let z = splitmix64(z ^ round.wrapping_mul(GOLDEN));
    splitmix64(z ^ ((block as u64) << 2 | site).wrapping_mul(GOLDEN))
}

/// The largest adapter rank accepted (`r`, 65536).
///
/// PEFT allows a rank above the layer's dimensions, so the rank is not bound
/// by `min(N, K)`; this cap only keeps a mistyped rank (or an
/// `adapter_config.json` with a corrupt `r`) from asking for a huge
/// allocation. Published adapters use ranks from 1 to a few thousand.
pub const MAX_LORA_RANK: usize = 1 << 16;

/// Check an adapter rank: at least 1 and at most [`MAX_LORA_RANK`]; `what`
/// names where it came from in the error (`--rank`, `adapter_config.json r`).
pub fn check_rank(rank: usize, what: &str) -> Result<()> {
    if rank == 0 || rank > MAX_LORA_RANK {
        return Err(Error::Config(format!(
            "{what} {rank}: a LoRA rank must be between 1 and {MAX_LORA_RANK}"
        )));
    }
    Ok(())
}

/// The trainable low-rank adapter.
#[derive(Clone, Debug)]
pub struct Adapter {
    /// `A (r, K)`, f32.
    pub a: Tensor,
    /// `B (N, r)`, f32 (zero at initialisation, so the adapted layer starts as the base).
    pub b: Tensor,
    /// `alpha`; the adapter's output is scaled by `alpha / r`.
    pub alpha: f64,
}

impl Adapter {
    /// PEFT's initialisation: `A` uniform in `+-1/sqrt(K)` (Kaiming-uniform
    /// with `a = sqrt(5)`), `B = 0`, from a counter hash of `seed`.
    ///
    /// The rank must be in `1..=`[`MAX_LORA_RANK`], and `A` and `B` must
    /// have element counts that fit in `usize`.
    pub fn init(n: usize, k: usize, rank: usize, alpha: f64, seed: u64) -> Result<Adapter> {
        check_rank(rank, "r")?;
        let a_len = octet_tensor::checked_numel(&[rank, k])?;
        octet_tensor::checked_numel(&[n, rank])?;
        let bound = 1.0 / (k as f64).sqrt();
        let a: Vec<f32> = (0..a_len)
            .map(|i| {
                let u = octet_fp8::format::sr_bits(seed, i as u64) as f64 / 4294967296.0;
                ((2.0 * u - 1.0) * bound) as f32
            })
            .collect();
        Ok(Adapter {
            a: Tensor::from_f32(&[rank, k], a)?,
            b: Tensor::zeros(&[n, rank], DType::F32)?,
            alpha,
        })
    }

    /// Rank `r`.
    pub fn rank(&self) -> usize {
        self.a.shape()[0]
    }

    /// `alpha / r`.
    pub fn scale(&self) -> f64 {
        self.alpha / self.rank() as f64
    }
}

/// A linear layer with a frozen base and an optional LoRA adapter.
#[derive(Clone, Debug)]
pub struct LoraLinear {
    /// The frozen weight.
    pub base: Base,
    /// The adapter (none: a frozen layer that LoRA does not target).
    pub adapter: Option<Adapter>,
    /// The base's bias `(N)`, frozen with it (Qwen2's q, k, v projections).
    pub bias: Option<Tensor>,
    compute: Compute,
    backward: BackwardMode,
    /// Quantization of inputs and gradients under `Compute::Fp8`.
    recipe: Recipe,
    /// Backward calls so far: the salt of stochastic rounding (forwards do
    /// not count, so a recomputed forward leaves the salts as they were).
    calls: u64,
}

/// What [`LoraLinear::forward`] keeps for backward.
#[derive(Clone, Debug)]
pub struct LoraSaved {
    m: usize,
    /// The input's features (checked against the layer in backward).
    k: usize,
    dtype: DType,
    input_requires_grad: bool,
    /// The adapter's input, original (`x`) or FP8 (`x_q`).
    x: Option<Tensor>,
    x_q: Option<QuantData>,
    /// `h = (m*x) A^T (M, r)`.
    h: Option<Tensor>,
    /// The forward's dropout mask, drawn again in backward.
    dropout: Option<Dropout>,
}

impl LoraSaved {
    /// Exact bytes kept alive.
    pub fn bytes(&self) -> usize {
        self.x.as_ref().map_or(0, Tensor::bytes)
            + self.x_q.as_ref().map_or(0, QuantData::bytes)
            + self.h.as_ref().map_or(0, Tensor::bytes)
    }
}

/// Gradients from [`LoraLinear::backward`].
#[derive(Clone, Debug)]
pub struct LoraGrads {
    /// `d_input (M, K)` in the input's dtype, if asked for.
    pub d_input: Option<Tensor>,
    /// `d_A (r, K)`, f32.
    pub d_a: Option<Tensor>,
    /// `d_B (N, r)`, f32.
    pub d_b: Option<Tensor>,
}

impl LoraLinear {
    /// A layer over `base`. `recipe` quantizes inputs and gradients when
    /// `compute` is FP8 (any current-scaling recipe; delayed is refused);
    /// its backward mode decides what the adapter saves and how the input
    /// gradient runs. The `quantized` backward needs an FP8 base with
    /// per-tensor scaling (its transpose is exact then). The adapter must be
    /// `A (r, K)`, `B (N, r)` with a rank accepted by [`check_rank`].
    pub fn new(
        base: Base,
        adapter: Option<Adapter>,
        compute: Compute,
        recipe: Recipe,
    ) -> Result<LoraLinear> {
        let (n, k) = base.dims();
        if let Some(ad) = &adapter {
            // Not `ad.rank()`: it indexes A's shape, which may be empty here.
            let rank = ad.a.shape().first().copied().unwrap_or(0);
            if ad.a.shape() != [rank, k] || ad.b.shape() != [n, rank] {
                return Err(Error::Shape(format!(
                    "adapter A {:?} / B {:?} do not fit a ({n}, {k}) base",
                    ad.a.shape(),
                    ad.b.shape()
                )));
            }
            // Rank 0 would scale by alpha / 0 and turn every output into NaN.
            check_rank(rank, "adapter rank")?;
        }
        if matches!(recipe.scaling(), Scaling::Delayed { .. }) {
            return Err(Error::Config(
                "LoRA layers quantize with current scaling (tensorwise, rowwise, blockwise, mxfp8, nvfp4), not delayed".into(),
            ));
        }
        let backward = recipe.backward();
        if backward == BackwardMode::Quantized
            && !matches!(base, Base::Fp8(ref w) if w.scaling() == WeightScaling::Tensor)
        {
            return Err(Error::Config(
                "the quantized backward needs an FP8 base with per-tensor scaling (fp8-tensorwise); use dequantized or high_precision".into(),
            ));
        }
        if backward == BackwardMode::Quantized && compute != Compute::Fp8 {
            return Err(Error::Config(
                "the quantized backward needs --compute fp8".into(),
            ));
        }
        Ok(LoraLinear {
            base,
            adapter,
            bias: None,
            compute,
            backward,
            recipe,
            calls: 0,
        })
    }

    /// The layer with a frozen bias `(N)` added to its output (`None`: none).
    pub fn with_bias(mut self, bias: Option<Tensor>) -> Result<LoraLinear> {
        let (n, _) = self.dims();
        if let Some(b) = &bias {
            if b.shape() != [n] {
                return Err(Error::Shape(format!(
                    "bias must be ({n}), got {:?}",
                    b.shape()
                )));
            }
        }
        self.bias = bias;
        Ok(self)
    }

    /// `(N, K)`.
    pub fn dims(&self) -> (usize, usize) {
        self.base.dims()
    }

    /// Backward calls so far: the count that salts stochastic rounding (each
    /// backward counts one up, then rounds with the new count as its salt).
    pub fn grad_calls(&self) -> u64 {
        self.calls
    }

    /// Set the count of backward calls so far, so that the next backward
    /// rounds with the salt `n + 1` (see [`crate::Linear::set_grad_calls`]).
    pub fn set_grad_calls(&mut self, n: u64) {
        self.calls = n;
    }

    /// The backward mode.
    pub fn backward_mode(&self) -> BackwardMode {
        self.backward
    }

    fn spec(&self, role: Role) -> Result<QuantSpec> {
        Ok(self.recipe.spec(role, Layout::Rowwise, None, self.calls)?)
    }

    /// Forward `y (M, N)` in `x`'s dtype (no dropout).
    pub fn forward(
        &mut self,
        x: &Tensor,
        input_requires_grad: bool,
    ) -> Result<(Tensor, LoraSaved)> {
        self.forward_with(x, input_requires_grad, None)
    }

    /// Forward `y (M, N)` in `x`'s dtype, the adapter's input masked by
    /// `dropout` (a training step; `None` or `p = 0`: no dropout).
    pub fn forward_with(
        &mut self,
        x: &Tensor,
        input_requires_grad: bool,
        dropout: Option<Dropout>,
    ) -> Result<(Tensor, LoraSaved)> {
        let (m, k) = x.dims2()?;
        let (n, wk) = self.dims();
        if k != wk {
            return Err(Error::Shape(format!(
                "input has {k} features, the layer expects {wk}"
            )));
        }
        if m == 0 {
            return Err(Error::Shape("empty input: M = 0".into()));
        }
        let mut saved = LoraSaved {
            m,
            k,
            dtype: x.dtype(),
            input_requires_grad,
            x: None,
            x_q: None,
            h: None,
            dropout: dropout.filter(|d| d.threshold() > 0 && self.adapter.is_some()),
        };
        let keep_fp8 = self.adapter.is_some() && self.backward == BackwardMode::Dequantized;
        // The base product.
        let mut qx_used: Option<QuantData> = None;
        let y = match (self.compute, &self.base) {
            (Compute::Bf16, Base::Fp8(w)) => mixed_matmul(x, w)?,
            (Compute::Bf16, Base::Dense(w)) => cpu::matmul(x, false, w, true, DType::F32)?,
            (Compute::Fp8, base) => {
                let sx = self.spec(Role::Input)?;
                let qx = take_row(cpu::quantize(x, &sx, &sx, Usage::ROW, None)?)?;
                let y = match base {
                    Base::Fp8(w) => cpu::fp8_gemm(&qx, w.quant_data())?,
                    Base::Dense(w) => {
                        let sw = self.spec(Role::Weight)?;
                        let qw = take_row(cpu::quantize(w, &sw, &sw, Usage::ROW, None)?)?;
                        cpu::fp8_gemm(&qx, &qw)?
                    }
                };
                qx_used = Some(qx);
                Tensor::from_f32(&[m, n], y)?
            }
        };
        // The adapter.
        let y = match &self.adapter {
            None => y,
            Some(ad) => {
                let h = match &saved.dropout {
                    Some(d) => cpu::matmul(&d.mask(x)?, false, &ad.a, true, DType::F32)?,
                    None => cpu::matmul(x, false, &ad.a, true, DType::F32)?,
                }; // (M, r)
                let z = cpu::matmul(&h, false, &ad.b, true, DType::F32)?; // (M, N)
                let s = adapter_scale(ad, saved.dropout);
                let mut yv = y.try_to_f32_vec()?;
                yv.iter_mut()
                    .zip(z.f32_values()?.iter())
                    .for_each(|(a, b)| *a += s * b);
                saved.h = Some(h);
                if keep_fp8 {
                    // The adapter's input in FP8: the base GEMM's copy when there is one.
                    saved.x_q = Some(match qx_used.take() {
                        Some(q) => q,
                        None => {
                            let sx = self.spec(Role::Input)?;
                            take_row(cpu::quantize(x, &sx, &sx, Usage::ROW, None)?)?
                        }
                    });
                } else {
                    saved.x = Some(x.try_clone()?);
                }
                Tensor::from_f32(&[m, n], yv)?
            }
        };
        // As in `Linear`: the bias added in f32, one rounding to x's dtype.
        let y = match &self.bias {
            Some(b) => cpu::add_bias(&y, b)?,
            None => y,
        };
        Ok((y.into_dtype(x.dtype())?, saved))
    }

    /// Backward from `dy (M, N)`: the adapter's gradients and, if the input
    /// asked for it, `d_input = dy @ W + (alpha/r) (dy B) A`; under the
    /// forward's dropout `dy @ W + m * (s' (dy B) A)` with `s' = (alpha/r) /
    /// P(kept)` (the module doc's formulas).
    pub fn backward(&mut self, saved: LoraSaved, dy: &Tensor) -> Result<LoraGrads> {
        let (n, k) = self.dims();
        let m = saved.m;
        if saved.k != k {
            return Err(Error::Shape(format!(
                "the saved state is of an input with {} features; this layer takes {k}",
                saved.k
            )));
        }
        let rank = self
            .adapter
            .as_ref()
            .and_then(|ad| ad.a.shape().first().copied());
        let h_rank = saved.h.as_ref().and_then(|h| h.shape().get(1).copied());
        if let (Some(r), Some(hr)) = (rank, h_rank) {
            if r != hr {
                return Err(Error::Shape(format!(
                    "the saved state is of an adapter of rank {hr}; this layer's has rank {r}"
                )));
            }
        }
        if dy.dims2()? != (m, n) {
            return Err(Error::Shape(format!(
                "grad_output is {:?}, expected ({m}, {n})",
                dy.shape()
            )));
        }
        self.calls += 1;
        let mut out = LoraGrads {
            d_input: None,
            d_a: None,
            d_b: None,
        };
        let mut dx_adapter: Option<Tensor> = None;
        if let Some(ad) = &self.adapter {
            let s = adapter_scale(ad, saved.dropout);
            let h = saved
                .h
                .as_ref()
                .ok_or_else(|| Error::Shape("backward: h was not saved".into()))?;
            let x = match (saved.x, &saved.x_q) {
                (Some(x), _) => x,
                (None, Some(q)) => Tensor::from_f32(&[m, k], q.dequantize()?)?,
                (None, None) => return Err(Error::Shape("backward: x was not saved".into())),
            };
            let x = match &saved.dropout {
                Some(d) => d.mask(&x)?,
                None => x,
            };
            let scaled = |t: Tensor| -> Result<Tensor> {
                let mut v = t.try_to_f32_vec()?;
                v.iter_mut().for_each(|a| *a *= s);
                Ok(Tensor::from_f32(t.shape(), v)?)
            };
            // dB = s dy^T h; dh = s dy B; dA = dh^T x.
            out.d_b = Some(scaled(cpu::matmul(dy, true, h, false, DType::F32)?)?);
            let dh = scaled(cpu::matmul(dy, false, &ad.b, false, DType::F32)?)?;
            out.d_a = Some(cpu::matmul(&dh, true, &x, false, DType::F32)?);
            if saved.input_requires_grad {
                let t = cpu::matmul(&dh, false, &ad.a, false, DType::F32)?;
                dx_adapter = Some(match &saved.dropout {
                    Some(d) => d.mask(&t)?,
                    None => t,
                });
            }
        }
        if saved.input_requires_grad {
            let base = match (&self.base, self.backward) {
                (Base::Fp8(w), BackwardMode::Quantized) => {
                    let sg = self.spec(Role::GradOutput)?;
                    let qdy = take_row(cpu::quantize(dy, &sg, &sg, Usage::ROW, None)?)?;
                    let wt = transpose_tensorwise(w.quant_data())?;
                    Tensor::from_f32(&[m, k], cpu::fp8_gemm(&qdy, &wt)?)?
                }
                (Base::Fp8(w), _) => mixed_matmul_t(dy, w)?,
                (Base::Dense(w), _) => cpu::matmul(dy, false, w, false, DType::F32)?,
            };
            let dx = match dx_adapter {
                Some(a) => cpu::add(&base, &a)?,
                None => base,
            };
            out.d_input = Some(dx.into_dtype(saved.dtype)?);
        }
        Ok(out)
    }

    /// The merged weight `W + (alpha/r) B A` in f32 `(N, K)`.
    pub fn merged(&self) -> Result<Tensor> {
        let w = self.base.dequantize()?;
        match &self.adapter {
            None => Ok(w),
            Some(ad) => {
                let ba = cpu::matmul(&ad.b, false, &ad.a, false, DType::F32)?;
                let s = ad.scale() as f32;
                let (wv, bav) = (w.f32_values()?, ba.f32_values()?);
                let v = octet_tensor::alloc_collect(
                    wv.iter().zip(bav.iter()).map(|(&a, &b)| a + s * b),
                    format_args!("the merged {:?} LoRA weight", w.shape()),
                )?;
                Ok(Tensor::from_f32(w.shape(), v)?)
            }
        }
    }
}

/// The adapter's scale `alpha / r`, over `P(kept)` under dropout.
fn adapter_scale(ad: &Adapter, dropout: Option<Dropout>) -> f32 {
    (ad.scale() * dropout.map_or(1.0, |d| d.keep_scale())) as f32
}

fn take_row(q: QuantizedTensor) -> Result<QuantData> {
    q.rowwise
        .ok_or_else(|| Error::Shape("quantize made no row-wise copy".into()))
}

/// The `(K, N)` copy of a per-tensor-scaled `(N, K)` FP8 matrix: the same
/// codes transposed, the same single scale (exact).
fn transpose_tensorwise(q: &QuantData) -> Result<QuantData> {
    let one = matches!(&q.scales, Scales::F32(v) if v.len() == 1);
    if !one || q.format == Format::E2M1 {
        return Err(Error::Config(
            "only a per-tensor FP8 base transposes exactly".into(),
        ));
    }
    Ok(QuantData {
        rows: q.cols,
        cols: q.rows,
        format: q.format,
        data: octet_fp8::quant::try_transpose(&q.data, q.rows, q.cols)?,
        block: (q.cols, q.rows),
        scales: q.scales.clone(),
        saturated: q.saturated,
        underflowed: q.underflowed,
    })
}

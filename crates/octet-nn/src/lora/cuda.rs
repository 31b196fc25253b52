//! LoRA on the GPU: `y = x W^T + s (x A^T) B^T` with `s = alpha / r`, the
//! same layer as `crate::lora::LoraLinear` on device buffers. The base `W
//! (N, K)` is frozen and stays in the form it was stored in (a
//! [`DeviceFp8Weight`]: E4M3 codes with tensor, channel or 128x128 factors,
//! about half the bytes of bf16; or bf16); only the adapter `A (r, K)`, `B
//! (N, r)` trains (its f32 masters and AdamW moments live in the model; the
//! layer holds the bf16 compute copies).
//!
//! Forward of the base:
//! - `Compute::Fp8` (per-tensor FP8 base): the input quantized to E4M3 with
//!   current per-tensor scaling (once per group of layers reading it), one
//!   cuBLASLt FP8 GEMM with the stored codes;
//! - `Compute::Bf16`: the weight-only product ([`Gpu::mixed_matmul`]), or a
//!   bf16 GEMM over a bf16 base.
//!
//! The adapters of the layers that read one input (q, k, v; gate, up) share
//! their products: `u^T = A x^T` is one GEMM over their stacked `A`s (one read
//! of `x`). Each layer's term `s u B^T` is written to its output first and the
//! base's GEMM adds to it (cuBLASLt beta = 1, f32 accumulation), so the
//! output is written once; over the weight-only kernel, which writes its own
//! output, the adapter's term is added after it.
//!
//! Backward: no weight gradient for the base, so the base saves nothing; its
//! input gradient `dy W` reads the stored codes: in the `quantized` backward
//! an FP8 GEMM of the E5M2-quantized `dy` with the codes transposed for the
//! call (Hopper takes K-major FP8 operands only; per-tensor scaling transposes
//! exactly), otherwise a bf16 GEMM with the codes dequantized to bf16 for the
//! call. Either transient is one matrix, freed before the next layer's
//! backward, so no step holds a second persistent copy of the base. The
//! adapter saves its input once per group (the FP8 row-wise copy under the
//! `dequantized` backward, and under the `quantized` one with
//! [`GpuLoraLinear::fp8_saved_input`]: the very copy the base GEMM read under
//! `Compute::Fp8`; the bf16 activation otherwise) and `u^T (r, M)` (rows of
//! the group's stacked buffer). The adapters' backward is grouped too: per
//! layer `d_B = s dy^T u` and `du^T = s B^T dy^T` into one stacked buffer,
//! then one `d_A = du^T x` and one `d_input = du A` for the group. `d_A`
//! reads the FP8 input's codes directly ([`Gpu::lora_da_e4m3`]); under
//! dropout (whose mask it would need) the group's FP8 input is dequantized
//! to bf16 once instead, and a GEMM reads that.
//! In the `quantized` backward `du^T` and the E5M2 codes of `dy` come from
//! one read of `dy` ([`Gpu::lora_cast_du`], which reads `B^T`, kept beside
//! `B` by the model's AdamW), and that layer's base input gradient is added
//! to `d_input` right after; otherwise the bases' input gradients add to it
//! after the adapters' products.
//!
//! LoRA dropout ([`Dropout`], training forwards only): one mask per input,
//! shared by the group's adapters. The forward's `u` product reads the
//! masked copy of `x` ([`Gpu::dropout_mask`]). Where the adapters keep the
//! bf16 input and nothing else holds it (the norms' and SwiGLU's outputs
//! in the model), they keep the masked copy in its place, same bytes;
//! otherwise (an input the caller keeps too, such as the attention output,
//! or the FP8 copy of the `dequantized` backward) the backward draws the
//! mask again for `d_A`. The adapters' `du A` is added to `d_input` through
//! the mask ([`Gpu::dropout_add`]). `1 / P(kept)` is folded into the scale `s`.
//!
//! Rounding against the CPU layer (which keeps `u`, `s dy B` and the
//! dequantized input in f32): here `u` and `du = s dy B` are bf16 operands of
//! the next GEMMs, and the dequantized input and base are rounded once to bf16.

use crate::lora::{Compute, Dropout};
use cudarc::driver::CudaSlice;
use octet_cuda::mixed::DeviceFp8Weight;
use octet_cuda::{AddTo, DeviceFp8, Error, Fp8Operand, GemmDst, GemmOut, Gpu, Result, TensorAmax};
use octet_fp8::{BackwardMode, Format};
use octet_tensor::mixed::WeightScaling;
use std::rc::Rc;

/// The frozen base weight `(N, K)` on the device.
pub enum GpuBase {
    /// bf16 bits.
    Bf16(CudaSlice<u16>),
    /// FP8 codes and factors.
    Fp8(DeviceFp8Weight),
}

impl GpuBase {
    /// Device bytes of the stored weight.
    pub fn bytes(&self) -> usize {
        match self {
            GpuBase::Bf16(w) => 2 * w.len(),
            GpuBase::Fp8(w) => w.bytes(),
        }
    }
}

/// The trainable adapter's bf16 compute copies (rewritten by the model's AdamW).
pub struct GpuAdapter {
    /// `A (r, K)`, bf16 bits.
    pub a: CudaSlice<u16>,
    /// `B (N, r)`, bf16 bits.
    pub b: CudaSlice<u16>,
    /// `B^T (r, N)`, bf16 bits: the same values transposed, rewritten with
    /// `b` (for [`Gpu::lora_cast_du`]).
    pub bt: CudaSlice<u16>,
    /// Rank `r`.
    pub rank: usize,
    /// `alpha / r`.
    pub scale: f32,
}

impl GpuAdapter {
    /// The scale of the adapter's term: `alpha / r`, over `P(kept)` under
    /// `dropout` (as `crate::lora`'s layer).
    fn scale_with(&self, dropout: Option<Dropout>) -> f32 {
        (f64::from(self.scale) * dropout.map_or(1.0, |d| d.keep_scale())) as f32
    }

    /// An adapter from its bf16 compute copies `A (r, K)` and `B (N, r)`
    /// (`B^T` is made here); `scale = alpha / r`.
    pub fn new(
        gpu: &Gpu,
        a: CudaSlice<u16>,
        b: CudaSlice<u16>,
        rank: usize,
        scale: f32,
    ) -> Result<GpuAdapter> {
        if rank == 0 || !b.len().is_multiple_of(rank) {
            return Err(Error::Shape(format!(
                "LoRA B of {} elements is not (N, {rank})",
                b.len()
            )));
        }
        let bt = gpu.transpose_bf16(&b, b.len() / rank, rank)?;
        Ok(GpuAdapter {
            a,
            b,
            bt,
            rank,
            scale,
        })
    }
}

/// A linear layer with a frozen base and an optional adapter.
pub struct GpuLoraLinear {
    /// Output features `N`.
    pub n: usize,
    /// Input features `K`.
    pub k: usize,
    /// The frozen weight.
    pub base: GpuBase,
    /// The adapter (none: a frozen layer that LoRA does not target).
    pub adapter: Option<GpuAdapter>,
    compute: Compute,
    backward: BackwardMode,
    /// In the `quantized` backward, make the E5M2 codes of `dy` and the
    /// adapter's `du` in one read of `dy` ([`Gpu::lora_cast_du`]) where the
    /// shapes allow (true by default; false: the cast and a cuBLASLt GEMM).
    pub fuse_cast_du: bool,
    /// The base's FP8 forward product (`--compute fp8`) accumulates in the
    /// tensor cores' own precision (cuBLASLt's fast accumulation, as
    /// [`crate::linear::cuda::GpuLinear::fast_accum`]); the input gradient's product always
    /// promotes to f32. True by default.
    pub fast_accum: bool,
    /// In forward, make the group's E4M3 input codes and its adapters' `u`
    /// together ([`Gpu::lora_cast_u`]) where the shapes allow and no dropout
    /// masks the adapters' input (true by default; false: the cast and a
    /// cuBLASLt GEMM). A recomputed forward decides as the first one did.
    pub fuse_cast_u: bool,
    /// Under the `quantized` backward, keep the adapter's input as the E4M3
    /// row-wise codes the base's product read, not the bf16 activation (the
    /// model sets it for [`crate::llama::cuda::SavedActivations::Fp8`]); `d_A` is
    /// then made from the codes ([`Gpu::lora_da_e4m3`]). The `dequantized`
    /// backward always keeps the codes, `high_precision` never. False by default.
    pub fp8_saved_input: bool,
}

/// An input prepared once for the layers of a group that read it (q, k, v;
/// gate, up): the bf16 activation and, where a layer reads it, its E4M3
/// per-tensor copy (row-wise only).
pub struct LoraInput {
    m: usize,
    k: usize,
    x: Rc<CudaSlice<u16>>,
    xq: Option<Rc<Fp8Input>>,
}

/// A group's FP8 input, and (in backward) its bf16 dequantization, made by
/// the first layer of the group whose backward needs it and shared with the
/// others (freed with the last layer's saved state).
pub(crate) struct Fp8Input {
    pub(crate) q: DeviceFp8,
    deq: std::cell::RefCell<Option<Rc<CudaSlice<u16>>>>,
}

/// What [`GpuLoraLinear::forward_input`] keeps for backward (nothing for the base).
pub struct GpuLoraSaved {
    m: usize,
    /// The adapter's input in bf16 (`high_precision`, `quantized` backward), shared in the group.
    x: Option<Rc<CudaSlice<u16>>>,
    /// The adapter's input in FP8 (`dequantized` backward), shared in the group.
    xq: Option<Rc<Fp8Input>>,
    /// `u^T = A x^T`: the group's stacked `(sum r, M)` bf16 buffer, this
    /// layer's first row in it and its rank.
    u: Option<(Rc<CudaSlice<u16>>, usize, usize)>,
    /// The forward's dropout mask (drawn again in backward where `x` is not
    /// masked already).
    dropout: Option<Dropout>,
    /// `x` is the masked input already (see the module doc).
    x_masked: bool,
}

impl GpuLoraSaved {
    /// The adapter's saved E4M3 row-wise input (`dequantized` backward), shared.
    pub(crate) fn rowwise_e4m3(&self) -> Option<Rc<Fp8Input>> {
        self.xq
            .as_ref()
            .filter(|q| q.q.format == Format::E4M3 && q.q.rowwise.len() == q.q.rows * q.q.cols)
            .cloned()
    }

    /// Device bytes kept, counting an input already in `seen` (shared with
    /// another layer of the group) once.
    pub fn bytes_unique(&self, seen: &mut std::collections::HashSet<usize>) -> usize {
        let mut total = self.u.as_ref().map_or(0, |&(_, _, r)| 2 * r * self.m);
        if let Some(x) = &self.x {
            if seen.insert(Rc::as_ptr(x) as usize) {
                total += 2 * x.len();
            }
        }
        if let Some(q) = &self.xq {
            if seen.insert(Rc::as_ptr(q) as usize) {
                total += q.q.rowwise.len() + 4;
            }
        }
        total
    }
}

/// Adapter gradients `(d_A (r, K), d_B (N, r))`, f32.
pub type AdapterGrads = (CudaSlice<f32>, CudaSlice<f32>);

impl GpuLoraLinear {
    /// A layer over `base (n, k)`. `Compute::Fp8` needs an FP8 base with
    /// per-tensor scaling (cuBLASLt's per-tensor FP8 GEMM); the `quantized`
    /// backward needs it too (its transpose is exact); delayed scaling is
    /// not a LoRA mode (the CPU layer refuses it as well).
    pub fn new(
        base: GpuBase,
        (n, k): (usize, usize),
        adapter: Option<GpuAdapter>,
        compute: Compute,
        backward: BackwardMode,
    ) -> Result<GpuLoraLinear> {
        match &base {
            GpuBase::Bf16(w) if w.len() != n * k => {
                return Err(Error::Shape(format!(
                    "bf16 base of {} elements is not ({n}, {k})",
                    w.len()
                )))
            }
            GpuBase::Fp8(w) if (w.n, w.k) != (n, k) => {
                return Err(Error::Shape(format!(
                    "FP8 base ({}, {}) is not ({n}, {k})",
                    w.n, w.k
                )))
            }
            GpuBase::Fp8(w) => {
                w.row_major("a LoRA base")?;
            }
            _ => {}
        }
        if let Some(ad) = &adapter {
            if ad.rank == 0 || ad.a.len() != ad.rank * k || ad.b.len() != n * ad.rank {
                return Err(Error::Shape(format!(
                    "adapter of rank {} (A {} / B {} elements) does not fit a ({n}, {k}) base",
                    ad.rank,
                    ad.a.len(),
                    ad.b.len()
                )));
            }
        }
        let per_tensor_fp8 = matches!(&base, GpuBase::Fp8(w) if w.scaling == WeightScaling::Tensor && w.format == Format::E4M3);
        if compute == Compute::Fp8 && !per_tensor_fp8 {
            return Err(Error::Shape(
                "LoRA --compute fp8 on the GPU needs an fp8-tensorwise base (per-tensor E4M3); use --compute bf16 for bf16, fp8-rowwise and fp8-block bases".into(),
            ));
        }
        if backward == BackwardMode::Quantized && !(per_tensor_fp8 && compute == Compute::Fp8) {
            return Err(Error::Shape(
                "the quantized backward needs an fp8-tensorwise base with --compute fp8; use dequantized or high_precision".into(),
            ));
        }
        Ok(GpuLoraLinear {
            n,
            k,
            base,
            adapter,
            compute,
            backward,
            fuse_cast_du: true,
            fast_accum: true,
            fuse_cast_u: true,
            fp8_saved_input: false,
        })
    }

    /// The base's shape and the adapter's buffers against the layer's
    /// `(n, k)` and the adapter's rank (the fields are public: an adapter set after [`GpuLoraLinear::new`] is
    /// checked here). A short `A` in a group of two or more would leave rows
    /// of the stacked `A` unwritten, read by the `u` and `du A` products.
    fn check_layer(&self) -> Result<()> {
        let (n, k) = (self.n, self.k);
        // The base too (also public): an FP8 base of `(k, n)` has the codes
        // of `(n, k)` and would be read as one; a non-per-tensor base under
        // the modes `new` refuses it for.
        let (dims, per_tensor) = match &self.base {
            GpuBase::Bf16(w) => (w.len() == n * k, false),
            GpuBase::Fp8(w) => (
                (w.n, w.k) == (n, k),
                w.scaling == WeightScaling::Tensor && w.format == Format::E4M3,
            ),
        };
        let needs_per_tensor =
            self.compute == Compute::Fp8 || self.backward == BackwardMode::Quantized;
        if !dims || (needs_per_tensor && !per_tensor) {
            return Err(Error::Shape(format!(
                "LoRA base does not fit a ({n}, {k}) layer with {:?} compute and the {:?} backward: {}",
                self.compute,
                self.backward,
                match &self.base {
                    GpuBase::Bf16(w) => format!("bf16 of {} elements", w.len()),
                    GpuBase::Fp8(w) => format!("FP8 ({}, {}) {:?} {}", w.n, w.k, w.scaling, w.format),
                }
            )));
        }
        if let Some(ad) = &self.adapter {
            let r = ad.rank;
            if r == 0 || ad.a.len() != r * k || ad.b.len() != n * r || ad.bt.len() != r * n {
                return Err(Error::Shape(format!(
                    "LoRA adapter of rank {r} (A {} / B {} / B^T {} elements) does not fit a ({n}, {k}) layer",
                    ad.a.len(),
                    ad.b.len(),
                    ad.bt.len()
                )));
            }
        }
        Ok(())
    }

    /// Whether this layer's backward makes `dy`'s codes and its adapter's
    /// `du` together ([`Gpu::lora_cast_du`]) for a `(m, n)` gradient.
    fn fuses_cast_du(&self, m: usize) -> bool {
        self.fuse_cast_du
            && matches!(self.base, GpuBase::Fp8(_))
            && self.backward == BackwardMode::Quantized
            && self
                .adapter
                .as_ref()
                .is_some_and(|a| Gpu::lora_cast_du_fits(m, self.n, a.rank))
    }

    /// Whether this layer quantizes its input with current per-tensor scaling
    /// (and its grad_output too, with `grad` and the quantized backward), so
    /// that the kernel writing the tensor can compute the amax for it.
    pub fn takes_amax(&self, grad: bool) -> bool {
        if grad {
            matches!(self.base, GpuBase::Fp8(_)) && self.backward == BackwardMode::Quantized
        } else {
            self.wants_fp8_input(true)
        }
    }

    /// Whether a prepared input needs its FP8 copy for this layer: for the
    /// base's FP8 product (when the forward makes its output, `output`), or
    /// for the adapter's saved input under the dequantized backward.
    fn wants_fp8_input(&self, output: bool) -> bool {
        (output && self.compute == Compute::Fp8 && matches!(self.base, GpuBase::Fp8(_)))
            || self.keeps_fp8_input()
    }

    /// Whether the adapter keeps its input as E4M3 codes (see
    /// [`GpuLoraLinear::fp8_saved_input`]).
    fn keeps_fp8_input(&self) -> bool {
        self.adapter.is_some()
            && match self.backward {
                BackwardMode::Dequantized => true,
                BackwardMode::Quantized => self.fp8_saved_input,
                BackwardMode::HighPrecision => false,
            }
    }

    /// Prepare `x (m, K)` (bf16 bits) for `layers`, which must share `K`,
    /// compute and backward mode: the FP8 copy is made once if any reads it.
    /// `x_amax`: the amax of `x` from the kernel that wrote it (see
    /// [`GpuLoraLinear::takes_amax`]), used instead of an amax pass.
    pub fn prepare(
        layers: &[GpuLoraLinear],
        gpu: &Gpu,
        x: Rc<CudaSlice<u16>>,
        x_amax: Option<TensorAmax>,
        m: usize,
    ) -> Result<LoraInput> {
        Self::prepare_with(layers, gpu, (x, x_amax, m), true)
    }

    /// [`GpuLoraLinear::prepare`] for a forward that makes its output
    /// (`output`) or only what backward reads (no FP8 copy for the base's
    /// product then).
    fn prepare_with(
        layers: &[GpuLoraLinear],
        gpu: &Gpu,
        (x, x_amax, m): (Rc<CudaSlice<u16>>, Option<TensorAmax>, usize),
        output: bool,
    ) -> Result<LoraInput> {
        let k = Self::group_width(layers, &x, m)?;
        let xq = if layers.iter().any(|l| l.wants_fp8_input(output)) {
            // Only the row-wise copy is read (forward GEMM, dequantized backward).
            Some(Rc::new(Fp8Input {
                q: gpu.quantize_tensorwise_rowwise_known(x.as_ref(), m, k, Format::E4M3, x_amax)?,
                deq: std::cell::RefCell::new(None),
            }))
        } else {
            None
        };
        Ok(LoraInput { m, k, x, xq })
    }

    /// The common `K` of layers that read one input `x (m, K)`; an error when
    /// they differ in `K`, compute or backward mode, or `x` is not `(m, K)`.
    fn group_width(layers: &[GpuLoraLinear], x: &CudaSlice<u16>, m: usize) -> Result<usize> {
        let first = layers
            .first()
            .ok_or_else(|| Error::Shape("a LoRA group of no layers".into()))?;
        let k = first.k;
        if let Some(l) = layers
            .iter()
            .find(|l| l.k != k || l.compute != first.compute || l.backward != first.backward)
        {
            return Err(Error::Shape(format!(
                "LoRA layers sharing an input differ: K {k} / {}",
                l.k
            )));
        }
        if m == 0 || x.len() != m * k {
            return Err(Error::Shape(format!(
                "input of {} elements is not ({m}, {k})",
                x.len()
            )));
        }
        for l in layers {
            l.check_layer()?;
        }
        Ok(k)
    }

    /// [`GpuLoraLinear::prepare_with`], with the adapters' `u^T` made in the
    /// same read of `x` as the E4M3 copy ([`Gpu::lora_cast_u`]) where the
    /// base's product reads that copy, the layers' adapters form one group
    /// ([`adapter_groups`]), no dropout masks their input and the kernel takes
    /// the shapes. The choice does not depend on `output`, so that a
    /// recomputed forward makes the same `u` (its codes are dropped unless
    /// backward reads them).
    fn prepare_group(
        layers: &[GpuLoraLinear],
        gpu: &Gpu,
        (x, x_amax, m): (Rc<CudaSlice<u16>>, Option<TensorAmax>, usize),
        dropout: Option<Dropout>,
        output: bool,
    ) -> Result<(LoraInput, Option<CudaSlice<u16>>)> {
        let k = Self::group_width(layers, &x, m)?;
        let fused = dropout.is_none_or(|d| d.threshold() == 0)
            && layers.iter().all(|l| l.fuse_cast_u)
            && layers.iter().any(|l| l.wants_fp8_input(true));
        let groups = adapter_groups(layers, m);
        if let (true, [group]) = (fused, groups.as_slice()) {
            let (ads, rows) = stacked(layers, group)?;
            if Gpu::lora_cast_du_fits(m, k, rows) {
                let a_stacked = stacked_a(gpu, &ads, rows, k)?;
                let a = a_stacked.as_ref().unwrap_or(&ads[0].1.a);
                // SAFETY: the kernel writes every element.
                let mut ut: CudaSlice<u16> = unsafe { gpu.alloc_uninit(rows * m, "LoRA u")? };
                let q = gpu.lora_cast_u(&x, (m, k), x_amax, (a, rows), &mut ut.slice_mut(..))?;
                let xq = layers.iter().any(|l| l.wants_fp8_input(output)).then(|| {
                    Rc::new(Fp8Input {
                        q,
                        deq: std::cell::RefCell::new(None),
                    })
                });
                return Ok((LoraInput { m, k, x, xq }, Some(ut)));
            }
        }
        let input = Self::prepare_with(layers, gpu, (x, x_amax, m), output)?;
        Ok((input, None))
    }

    /// Forward `y (m, N)` (bf16 bits) from a prepared input.
    pub fn forward_input(
        &self,
        gpu: &Gpu,
        input: &LoraInput,
    ) -> Result<(CudaSlice<u16>, GpuLoraSaved)> {
        let mut outs = forward_layers(std::slice::from_ref(self), gpu, input, None)?;
        outs.pop()
            .ok_or_else(|| Error::Shape("LoRA forward of no layer".into()))
    }

    /// Whether the base's product can add to an output the adapter wrote
    /// first (a cuBLASLt GEMM, beta = 1); the weight-only kernel writes its own.
    fn base_adds(&self) -> bool {
        !(matches!(self.base, GpuBase::Fp8(_)) && self.compute == Compute::Bf16)
    }

    /// The base's product `x W^T` into `y`: a new buffer when `y` is `None`,
    /// else added to what `y` holds (only where [`GpuLoraLinear::base_adds`]).
    fn forward_base(
        &self,
        gpu: &Gpu,
        input: &LoraInput,
        y: Option<CudaSlice<u16>>,
    ) -> Result<CudaSlice<u16>> {
        let (m, n, k) = (input.m, self.n, self.k);
        if input.k != k {
            return Err(Error::Shape(format!(
                "prepared input of width {} for a LoRA layer of width {k}",
                input.k
            )));
        }
        let fresh = y.is_none();
        let mut y = match y {
            Some(y) if y.len() == m * n && self.base_adds() => y,
            Some(_) => {
                return Err(Error::Shape(format!(
                    "LoRA base product: an output to add to that is not ({m}, {n}), or a base that cannot add"
                )))
            }
            // SAFETY: the base product writes every element of y.
            None => unsafe { gpu.alloc_uninit(m * n, "LoRA output")? },
        };
        let x = input.x.as_ref();
        match (&self.base, self.compute) {
            (GpuBase::Bf16(w), _) if fresh => gpu.gemm_bf16(x, w, &mut y, (m, n, k))?,
            (GpuBase::Bf16(w), _) => gpu.gemm_bf16(x, w, &mut AddTo(y.slice_mut(..)), (m, n, k))?,
            (GpuBase::Fp8(w), Compute::Fp8) => {
                let xq = input
                    .xq
                    .as_ref()
                    .ok_or_else(|| Error::Shape("FP8 input missing".into()))?;
                let (a, b) = (
                    xq.q.rowwise_operand(),
                    operand(w, w.row_major("the LoRA base's FP8 GEMM")?),
                );
                let fast = self.fast_accum;
                if fresh {
                    gpu.gemm_fp8(a, b, &mut y, (m, n, k), fast)?;
                } else {
                    gpu.gemm_fp8(a, b, &mut AddTo(y.slice_mut(..)), (m, n, k), fast)?;
                }
            }
            (GpuBase::Fp8(w), Compute::Bf16) => gpu.mixed_matmul(x, m, w, &mut y)?,
        }
        Ok(y)
    }

    /// What the layer keeps for backward from `input`: the adapter's input
    /// (its `u` is added by [`forward_layers`]); nothing for the base.
    fn saved_for(&self, input: &LoraInput) -> Result<GpuLoraSaved> {
        let mut saved = GpuLoraSaved {
            m: input.m,
            x: None,
            xq: None,
            u: None,
            dropout: None,
            x_masked: false,
        };
        if self.adapter.is_some() {
            if self.keeps_fp8_input() {
                saved.xq = Some(
                    input
                        .xq
                        .clone()
                        .ok_or_else(|| Error::Shape("FP8 input missing".into()))?,
                );
            } else {
                saved.x = Some(input.x.clone());
            }
        }
        Ok(saved)
    }

    /// Backward from `dy (m, N)` (bf16 bits): `d_input (m, K)` in f32 and the
    /// adapter's gradients (none for a frozen layer without adapter).
    /// `dy_amax`: the amax of `dy` from the kernel that wrote it (read by the
    /// quantized backward's E5M2 quantization, else unused).
    pub fn backward(
        &self,
        gpu: &Gpu,
        saved: GpuLoraSaved,
        dy: &CudaSlice<u16>,
        dy_amax: Option<TensorAmax>,
    ) -> Result<(CudaSlice<f32>, Option<AdapterGrads>)> {
        let mut dx: Option<CudaSlice<f32>> = None;
        let mut g = backward_group(
            std::slice::from_ref(self),
            gpu,
            vec![saved],
            vec![(dy, dy_amax)],
            &mut dx,
        )?;
        let dx = dx.ok_or_else(|| Error::Shape("LoRA backward wrote no input gradient".into()))?;
        Ok((dx, g.pop().flatten()))
    }

    /// The base's input gradient `dy W` into `dx` (overwritten, or added to
    /// through an [`octet_cuda::AddTo`]).
    fn base_backward_into<D: GemmOut>(
        &self,
        gpu: &Gpu,
        (m, dy, dy_amax): (usize, &CudaSlice<u16>, Option<TensorAmax>),
        dx: &mut impl GemmDst<D>,
    ) -> Result<()> {
        let (n, k) = (self.n, self.k);
        match (&self.base, self.backward) {
            (GpuBase::Bf16(w), _) => gpu.gemm_bf16_op((dy, false), (w, false), dx, (m, k, n)),
            (GpuBase::Fp8(_), BackwardMode::Quantized) => {
                let gq = gpu.quantize_tensorwise_rowwise_known(dy, m, n, Format::E5M2, dy_amax)?;
                self.base_backward_codes(gpu, m, &gq, dx)
            }
            (GpuBase::Fp8(w), _) => {
                let block = match w.scaling {
                    WeightScaling::Tensor => (n, k),
                    WeightScaling::Channel => (1, k),
                    WeightScaling::Block128 => (128, 128),
                };
                let wd = gpu.dequant_bf16(
                    w.row_major("the LoRA base's dequantize")?,
                    &w.factors,
                    (n, k),
                    block,
                    w.format,
                )?;
                gpu.gemm_bf16_op((dy, false), (&wd, false), dx, (m, k, n))
            }
        }
    }
}

impl GpuLoraLinear {
    /// The base's input gradient from `dy`'s row-wise E5M2 codes `gq` (the
    /// `quantized` backward over a per-tensor FP8 base): the stored codes
    /// transposed for the call, one FP8 GEMM.
    fn base_backward_codes<D: GemmOut>(
        &self,
        gpu: &Gpu,
        m: usize,
        gq: &DeviceFp8,
        dx: &mut impl GemmDst<D>,
    ) -> Result<()> {
        let wt = gpu.transpose_u8(
            self.fp8_base()?.row_major("the LoRA base's transpose")?,
            self.n,
            self.k,
        )?;
        self.base_backward_transposed(gpu, m, gq, &wt, dx)
    }

    /// The FP8 base (its frozen `(n, k)` codes and factors).
    fn fp8_base(&self) -> Result<&DeviceFp8Weight> {
        match &self.base {
            GpuBase::Fp8(w) => Ok(w),
            GpuBase::Bf16(_) => Err(Error::Shape(
                "an FP8 input gradient over a bf16 base".into(),
            )),
        }
    }

    /// [`GpuLoraLinear::base_backward_codes`] given the base's codes
    /// transposed (`wt`, `(k, n)`).
    fn base_backward_transposed<D: GemmOut>(
        &self,
        gpu: &Gpu,
        m: usize,
        gq: &DeviceFp8,
        wt: &CudaSlice<u8>,
        dx: &mut impl GemmDst<D>,
    ) -> Result<()> {
        let (n, k) = (self.n, self.k);
        let w = self.fp8_base()?;
        gpu.gemm_fp8(gq.rowwise_operand(), operand(w, wt), dx, (m, k, n), false)
    }
}

/// The adapters of `layers` in groups that share one `u` product (one read
/// of their common input) and one `dA` and `d_input` product in backward:
/// all adapter layers together when every block of `r m` values starts
/// 256-byte aligned in the stacked `(sum r, m)` buffers (cuBLASLt's operand
/// alignment), else one layer a group. Layer indices, in order.
fn adapter_groups(layers: &[GpuLoraLinear], m: usize) -> Vec<Vec<usize>> {
    let with: Vec<usize> = (0..layers.len())
        .filter(|&i| layers[i].adapter.is_some())
        .collect();
    let aligned = with.iter().all(|&i| {
        layers[i]
            .adapter
            .as_ref()
            .is_some_and(|a| (a.rank * m).is_multiple_of(128))
    });
    if aligned && !with.is_empty() {
        vec![with]
    } else {
        with.into_iter().map(|i| vec![i]).collect()
    }
}

/// A layer of an adapter group: its index, its adapter, its first row in
/// the group's stacked `(sum r, .)` buffers.
type Stacked<'a> = (usize, &'a GpuAdapter, usize);

/// The adapters of `group` with their row offsets in the stacked `(sum r, .)`
/// buffers, and `sum r`.
fn stacked<'a>(layers: &'a [GpuLoraLinear], group: &[usize]) -> Result<(Vec<Stacked<'a>>, usize)> {
    let mut out = Vec::with_capacity(group.len());
    let mut rows = 0;
    for &i in group {
        let ad = layers[i]
            .adapter
            .as_ref()
            .ok_or_else(|| Error::Shape("LoRA group: a layer without adapter".into()))?;
        out.push((i, ad, rows));
        rows += ad.rank;
    }
    Ok((out, rows))
}

/// Each adapter's rows of the group's stacked `(sum r, k)` result `da` (the
/// whole buffer for a group of one, copies otherwise).
fn split_rows(
    gpu: &Gpu,
    da: CudaSlice<f32>,
    ads: &[Stacked<'_>],
    k: usize,
) -> Result<Vec<CudaSlice<f32>>> {
    if ads.len() == 1 {
        return Ok(vec![da]);
    }
    ads.iter()
        .map(|&(_, ad, off)| {
            // SAFETY: the copy writes every element.
            let mut own: CudaSlice<f32> = unsafe { gpu.alloc_uninit(ad.rank * k, "d_lora_A")? };
            gpu.stream
                .memcpy_dtod(&da.slice(off * k..(off + ad.rank) * k), &mut own)?;
            Ok(own)
        })
        .collect()
}

/// `A` of the group's adapters stacked into one `(sum r, K)` bf16 matrix
/// (a copy; a group of one layer reads its own `A`).
fn stacked_a(
    gpu: &Gpu,
    ads: &[Stacked<'_>],
    rows: usize,
    k: usize,
) -> Result<Option<CudaSlice<u16>>> {
    if ads.len() < 2 {
        return Ok(None);
    }
    // SAFETY: every row is copied below.
    let mut a: CudaSlice<u16> = unsafe { gpu.alloc_uninit(rows * k, "stacked lora_A")? };
    for &(_, ad, off) in ads {
        let mut dst = a.slice_mut(off * k..(off + ad.rank) * k);
        gpu.stream.memcpy_dtod(&ad.a, &mut dst)?;
    }
    Ok(Some(a))
}

/// The FP8 base's codes `data` (the stored `(N, K)` or its transpose) as a
/// per-tensor GEMM operand with the base's one factor.
fn operand<'a>(w: &'a DeviceFp8Weight, data: &'a CudaSlice<u8>) -> Fp8Operand<'a> {
    Fp8Operand {
        data,
        format: w.format,
        scale_inv: &w.factors,
    }
}

/// Forward of `layers` from one prepared input. Per group of adapters,
/// `u^T = A x^T` (`(sum r, m)`, one GEMM over the stacked `A`s); each
/// layer's `s u B^T` is written first and its base's product added to it
/// (cuBLASLt beta = 1, so the output is read and written once), except over
/// the weight-only kernel, whose output the adapter's term is added to.
/// `dropout`: the adapters read the input through this mask.
fn forward_layers(
    layers: &[GpuLoraLinear],
    gpu: &Gpu,
    input: &LoraInput,
    dropout: Option<Dropout>,
) -> Result<Vec<(CudaSlice<u16>, GpuLoraSaved)>> {
    with_outputs(forward_layers_with(
        layers, gpu, input, dropout, true, None,
    )?)
}

/// The layers' outputs and saved states of a forward that makes its outputs.
#[allow(clippy::type_complexity)]
fn with_outputs(
    outs: Vec<(Option<CudaSlice<u16>>, GpuLoraSaved)>,
) -> Result<Vec<(CudaSlice<u16>, GpuLoraSaved)>> {
    outs.into_iter()
        .map(|(y, s)| match y {
            Some(y) => Ok((y, s)),
            None => Err(Error::Shape("LoRA forward gave no output".into())),
        })
        .collect()
}

/// [`forward_layers`], or with `output` false only what the layers'
/// backward reads (the adapters' `u` and saved inputs: bf16, masked, or the
/// group's FP8 copy; the frozen base keeps nothing),
/// without the base's and `B`'s products: a recomputed forward whose output
/// nothing reads. `made_ut`: the one adapter group's `u^T`, already made with
/// the input's FP8 copy ([`GpuLoraLinear::prepare_group`]).
#[allow(clippy::type_complexity)]
fn forward_layers_with(
    layers: &[GpuLoraLinear],
    gpu: &Gpu,
    input: &LoraInput,
    dropout: Option<Dropout>,
    output: bool,
    made_ut: Option<CudaSlice<u16>>,
) -> Result<Vec<(Option<CudaSlice<u16>>, GpuLoraSaved)>> {
    let (m, k) = (input.m, input.k);
    for l in layers {
        if l.k != k {
            return Err(Error::Shape(format!(
                "prepared input of width {k} for a LoRA layer of width {}",
                l.k
            )));
        }
        l.check_layer()?;
    }
    let mut saved = layers
        .iter()
        .map(|l| l.saved_for(input))
        .collect::<Result<Vec<_>>>()?;
    let dropout = dropout.filter(|d| d.threshold() > 0);
    let groups = adapter_groups(layers, m);
    if made_ut.is_some() && (groups.len() != 1 || dropout.is_some()) {
        return Err(Error::Shape(
            "LoRA forward: a premade u for other than one adapter group without dropout".into(),
        ));
    }
    let mut made_ut = made_ut;
    // The adapters' masked input (kept in place of x below where nothing
    // else holds x; otherwise a transient, the mask drawn again in backward).
    let masked = match dropout {
        Some(d) if !groups.is_empty() => Some(gpu.dropout_mask(&input.x, d.device_mask())?),
        _ => None,
    };
    let x_adapter = masked.as_ref().unwrap_or(input.x.as_ref());
    let mut first: Vec<Option<CudaSlice<u16>>> = layers.iter().map(|_| None).collect();
    // Adapters whose term is added after the base's product: (layer, u^T, row).
    let mut after = Vec::new();
    for group in groups {
        let (ads, rows) = stacked(layers, &group)?;
        let ut = match made_ut.take() {
            Some(ut) if ut.len() == rows * m => ut,
            Some(ut) => {
                return Err(Error::Shape(format!(
                    "LoRA forward: a premade u of {} elements for ({rows}, {m})",
                    ut.len()
                )))
            }
            None => {
                let a_stacked = stacked_a(gpu, &ads, rows, k)?;
                let a = a_stacked.as_ref().unwrap_or(&ads[0].1.a);
                // SAFETY: the GEMM writes every element.
                let mut ut: CudaSlice<u16> = unsafe { gpu.alloc_uninit(rows * m, "LoRA u")? };
                gpu.gemm_bf16(a, x_adapter, &mut ut, (rows, m, k))?;
                ut
            }
        };
        let ut = Rc::new(ut);
        for &(i, ad, off) in &ads {
            saved[i].u = Some((ut.clone(), off, ad.rank));
            saved[i].dropout = dropout;
            let s = ad.scale_with(dropout);
            if !output {
                continue;
            }
            if layers[i].base_adds() {
                let u = ut.slice(off * m..(off + ad.rank) * m);
                // SAFETY: the GEMM writes every element (beta = 0).
                let mut y: CudaSlice<u16> =
                    unsafe { gpu.alloc_uninit(m * layers[i].n, "LoRA output")? };
                gpu.gemm_bf16_acc(
                    (&u, true),
                    (&ad.b, true),
                    &mut y,
                    (m, layers[i].n, ad.rank),
                    (s, 0.0),
                )?;
                first[i] = Some(y);
            } else {
                after.push((i, ut.clone(), off, s));
            }
        }
    }
    if let Some(xm) = masked {
        // Keep the masked copy instead of x where only these saved states
        // would keep x alive (besides `input`).
        let holders = saved
            .iter()
            .filter(|s| s.x.as_ref().is_some_and(|x| Rc::ptr_eq(x, &input.x)))
            .count();
        if holders > 0 && Rc::strong_count(&input.x) == 1 + holders {
            let xm = Rc::new(xm);
            for s in saved.iter_mut().filter(|s| s.x.is_some()) {
                s.x = Some(xm.clone());
                s.x_masked = true;
            }
        }
    }
    if !output {
        return Ok(saved.into_iter().map(|s| (None, s)).collect());
    }
    let mut ys = layers
        .iter()
        .zip(first)
        .map(|(l, y)| l.forward_base(gpu, input, y))
        .collect::<Result<Vec<_>>>()?;
    for (i, ut, off, s) in after {
        let ad = layers[i]
            .adapter
            .as_ref()
            .ok_or_else(|| Error::Shape("LoRA forward: a layer without adapter".into()))?;
        let u = ut.slice(off * m..(off + ad.rank) * m);
        gpu.gemm_bf16_acc(
            (&u, true),
            (&ad.b, true),
            &mut ys[i],
            (m, layers[i].n, ad.rank),
            (s, 1.0),
        )?;
    }
    Ok(ys.into_iter().map(Some).zip(saved).collect())
}

/// The bf16 input an adapter saved: its own copy, or the group's FP8 copy
/// dequantized once (by the first layer that asks) and shared.
fn saved_input(gpu: &Gpu, saved: &GpuLoraSaved, k: usize) -> Result<Rc<CudaSlice<u16>>> {
    match (&saved.x, &saved.xq) {
        (Some(x), _) => Ok(x.clone()),
        (None, Some(q)) => {
            if let Some(d) = q.deq.borrow().clone() {
                return Ok(d);
            }
            let fp8 = &q.q;
            let d = Rc::new(gpu.dequant_bf16(
                &fp8.rowwise,
                &fp8.scale_inv,
                (saved.m, k),
                (saved.m, k),
                fp8.format,
            )?);
            *q.deq.borrow_mut() = Some(d.clone());
            Ok(d)
        }
        (None, None) => Err(Error::Shape("LoRA backward: x was not saved".into())),
    }
}

/// Backward of `layers` that read one input, from their grad_outputs `dys`
/// (bf16 bits, with the amaxes their producers recorded): the input gradient
/// written to `dx` when it is `None` (allocated here), else added to it; each
/// layer's adapter gradients `(d_A, d_B)` (`None` without adapter).
///
/// Per group of adapters: `d_B = s dy^T u` and `du^T = s B^T dy^T` per
/// layer, then one `d_A = du^T x` and one `d_input (+)= du A` over the
/// stacked `du^T` and `A` (one read of `x` and one pass over `d_input` for
/// q, k and v together). The adapters' term goes into `d_input` first, the
/// bases' products add to it: the memory-bound `du A` (a reduction over the
/// rank) writes `d_input` without reading it, and the compute-bound base
/// GEMMs read it under their arithmetic. Under the fused cast + `du`
/// ([`Gpu::lora_cast_du`]) the group's E5M2 codes of `dy` are therefore held
/// until `du A` is in (one `(m, n)` byte buffer a layer of the group). Under
/// dropout `x` is the masked input and `du A` goes to an f32 temporary,
/// added to `d_input` through the mask.
pub fn backward_group<D: GemmOut>(
    layers: &[GpuLoraLinear],
    gpu: &Gpu,
    saved: Vec<GpuLoraSaved>,
    dys: Vec<(&CudaSlice<u16>, Option<TensorAmax>)>,
    dx: &mut Option<CudaSlice<D>>,
) -> Result<Vec<Option<AdapterGrads>>> {
    let first = layers
        .first()
        .ok_or_else(|| Error::Shape("LoRA backward of no layer".into()))?;
    if saved.len() != layers.len() || dys.len() != layers.len() {
        return Err(Error::Shape(format!(
            "LoRA backward of {} layers with {} saved states and {} grad_outputs",
            layers.len(),
            saved.len(),
            dys.len()
        )));
    }
    let (m, k) = (saved[0].m, first.k);
    for ((l, s), (dy, _)) in layers.iter().zip(&saved).zip(&dys) {
        l.check_layer()?;
        // `u` was saved for the forward's adapter: another rank would read
        // another adapter's rows of the group's `u`, or past them.
        let (now, then) = (
            l.adapter.as_ref().map(|a| a.rank),
            s.u.as_ref().map(|u| u.2),
        );
        if now != then {
            return Err(Error::Shape(format!(
                "LoRA backward: the adapter's rank {now:?} is not the {then:?} of the saved forward"
            )));
        }
        if l.k != k || s.m != m || dy.len() != m * l.n {
            return Err(Error::Shape(format!(
                "LoRA backward: grad_output of {} elements for a ({m}, {}) output of width-{} input (group width {k})",
                dy.len(),
                l.n,
                l.k
            )));
        }
    }
    if let Some(d) = dx.as_ref() {
        if d.len() != m * k {
            return Err(Error::Shape(format!(
                "d_input destination of {} elements for a ({m}, {k}) input",
                d.len()
            )));
        }
    }
    // The first product into a new dx overwrites it; every other one adds.
    let mut fresh = dx.is_none();
    if fresh {
        // SAFETY: the first product below writes every element (beta = 0).
        *dx = Some(unsafe { gpu.alloc_uninit::<D>(m * k, "d_input")? });
    }
    let d = dx
        .as_mut()
        .ok_or_else(|| Error::Shape("LoRA backward: no d_input".into()))?;
    let mut grads: Vec<Option<AdapterGrads>> = (0..layers.len()).map(|_| None).collect();
    let mut dys = dys;
    // Layers whose base input gradient is already in dx.
    let mut based = vec![false; layers.len()];
    for group in adapter_groups(layers, m) {
        let (ads, rows) = stacked(layers, &group)?;
        let (dropout, x_masked) = (saved[ads[0].0].dropout, saved[ads[0].0].x_masked);
        if ads
            .iter()
            .any(|&(i, _, _)| saved[i].dropout != dropout || saved[i].x_masked != x_masked)
        {
            return Err(Error::Shape(
                "LoRA backward: adapters sharing an input saved different dropout masks".into(),
            ));
        }
        // SAFETY: each layer's rows are written below (by its GEMM, beta = 0,
        // or by the fused cast).
        let mut dut: CudaSlice<u16> = unsafe { gpu.alloc_uninit(rows * m, "LoRA du")? };
        let mut dbs = Vec::with_capacity(ads.len());
        // E5M2 codes of the group's dy, for the base products after `du A`.
        let mut codes = Vec::new();
        for &(i, ad, off) in &ads {
            let (dy, n, r) = (dys[i].0, layers[i].n, ad.rank);
            let s = ad.scale_with(dropout);
            let (ut, uoff, _) = saved[i]
                .u
                .as_ref()
                .ok_or_else(|| Error::Shape("LoRA backward: u was not saved".into()))?;
            let u = ut.slice(uoff * m..(uoff + r) * m);
            // SAFETY: the GEMM writes every element (beta = 0).
            let mut db: CudaSlice<f32> = unsafe { gpu.alloc_uninit(n * r, "d_lora_B")? };
            gpu.gemm_bf16_acc((dy, true), (&u, true), &mut db, (n, r, m), (s, 0.0))?;
            let mut du = dut.slice_mut(off * m..(off + r) * m);
            if layers[i].fuses_cast_du(m) {
                // dy's codes and du from one read of dy; the base's input
                // gradient from the codes once `du A` is in `d_input`.
                let gq = gpu.lora_cast_du(dy, (m, n), dys[i].1.take(), (&ad.bt, r, s), &mut du)?;
                codes.push((i, gq));
                based[i] = true;
            } else {
                gpu.gemm_bf16_acc((&ad.b, true), (dy, true), &mut du, (r, m, n), (s, 0.0))?;
            }
            dbs.push(db);
        }
        // Each layer's rows of d_A.
        let das = match saved[ads[0].0].rowwise_e4m3() {
            // Straight from the codes the forward kept (no dropout mask to
            // apply), each adapter's rows to its own buffer.
            Some(q)
                if dropout.is_none()
                    && Gpu::lora_da_fits(m, k, rows)
                    && ads.len() <= 4
                    && ads.iter().all(|&(_, ad, _)| ad.rank > 0) =>
            {
                let ranks: Vec<usize> = ads.iter().map(|&(_, ad, _)| ad.rank).collect();
                gpu.lora_da_e4m3(&dut, &ranks, &q.q, (m, k))?
            }
            _ => {
                let x = saved_input(gpu, &saved[ads[0].0], k)?;
                let masked = match dropout {
                    Some(d) if !x_masked => Some(gpu.dropout_mask(&x, d.device_mask())?),
                    _ => None,
                };
                let x = masked.as_ref().unwrap_or(x.as_ref());
                // SAFETY: the GEMM writes every element.
                let mut da: CudaSlice<f32> = unsafe { gpu.alloc_uninit(rows * k, "d_lora_A")? };
                gpu.gemm_bf16_op((&dut, false), (x, false), &mut da, (rows, k, m))?;
                split_rows(gpu, da, &ads, k)?
            }
        };
        let a_stacked = stacked_a(gpu, &ads, rows, k)?;
        let a = match &a_stacked {
            Some(a) => a,
            None => &ads[0].1.a,
        };
        let du_a = ((&dut, true), (a, false), (m, k, rows), (1.0, 0.0));
        if let Some(mask) = &dropout {
            // d_input gets m * (du A): the product in f32, added through the mask.
            // SAFETY: the GEMM writes every element (beta = 0).
            let mut t: CudaSlice<f32> = unsafe { gpu.alloc_uninit(m * k, "LoRA du A")? };
            gpu.gemm_bf16_acc(du_a.0, du_a.1, &mut t, du_a.2, du_a.3)?;
            gpu.dropout_add(&t, mask.device_mask(), d, std::mem::take(&mut fresh))?;
        } else if std::mem::take(&mut fresh) {
            gpu.gemm_bf16_acc(du_a.0, du_a.1, d, du_a.2, du_a.3)?;
        } else {
            gpu.gemm_bf16_acc(
                du_a.0,
                du_a.1,
                &mut AddTo(d.slice_mut(..)),
                du_a.2,
                (1.0, 1.0),
            )?;
        }
        // The group's frozen codes transposed in one launch.
        let bases = codes
            .iter()
            .map(|(i, _)| {
                let l = &layers[*i];
                Ok((
                    l.fp8_base()?.row_major("the LoRA base's transpose")?,
                    l.n,
                    l.k,
                ))
            })
            .collect::<Result<Vec<_>>>()?;
        let wts = gpu.transpose_u8_many(&bases)?;
        for ((i, gq), wt) in codes.iter().zip(&wts) {
            layers[*i].base_backward_transposed(gpu, m, gq, wt, &mut AddTo(d.slice_mut(..)))?;
        }
        for ((&(i, _, _), da), db) in ads.iter().zip(das).zip(dbs) {
            grads[i] = Some((da, db));
        }
    }
    for ((l, (dy, amax)), done) in layers.iter().zip(dys).zip(based) {
        if done {
            continue;
        }
        let at = (m, dy, amax);
        if std::mem::take(&mut fresh) {
            l.base_backward_into(gpu, at, d)?;
        } else {
            l.base_backward_into(gpu, at, &mut AddTo(d.slice_mut(..)))?;
        }
    }
    Ok(grads)
}

/// Forward of `layers` that read one input `x (m, K)`: one preparation,
/// each layer's output in order; the adapters read `x` through `dropout`'s
/// mask when there is one (a training forward).
pub fn forward_group(
    layers: &[GpuLoraLinear],
    gpu: &Gpu,
    (x, x_amax, m): (Rc<CudaSlice<u16>>, Option<TensorAmax>, usize),
    dropout: Option<Dropout>,
) -> Result<Vec<(CudaSlice<u16>, GpuLoraSaved)>> {
    with_outputs(forward_group_with(
        layers,
        gpu,
        (x, x_amax, m),
        dropout,
        true,
    )?)
}

/// [`forward_group`], or with `output` false only what the layers' backward
/// reads, without the products that make the output (see `forward_layers_with`).
#[allow(clippy::type_complexity)]
pub fn forward_group_with(
    layers: &[GpuLoraLinear],
    gpu: &Gpu,
    (x, x_amax, m): (Rc<CudaSlice<u16>>, Option<TensorAmax>, usize),
    dropout: Option<Dropout>,
    output: bool,
) -> Result<Vec<(Option<CudaSlice<u16>>, GpuLoraSaved)>> {
    let (input, ut) = GpuLoraLinear::prepare_group(layers, gpu, (x, x_amax, m), dropout, output)?;
    forward_layers_with(layers, gpu, &input, dropout, output, ut)
}

//! LoRA on the GPU: `y = x W^T + s (x A^T) B^T` with `s = alpha / r`, the
//! same layer as `octet_nn::lora::LoraLinear` on device buffers. The base `W
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
//! The adapter adds its term in the same output buffer: `u = x A^T` (bf16),
//! then one GEMM `y = s u B^T + y` (cuBLASLt beta = 1, f32 accumulation).
//!
//! Backward: no weight gradient for the base, so the base saves nothing; its
//! input gradient `dy W` reads the stored codes: in the `quantized` backward
//! an FP8 GEMM of the E5M2-quantized `dy` with the codes transposed for the
//! call (Hopper takes K-major FP8 operands only; per-tensor scaling transposes
//! exactly), otherwise a bf16 GEMM with the codes dequantized to bf16 for the
//! call. Either transient is one matrix, freed before the next layer's
//! backward, so no step holds a second persistent copy of the base. The
//! adapter saves its input once per group (the FP8 row-wise copy under the
//! `dequantized` backward, the very copy the base GEMM read under
//! `Compute::Fp8`; the bf16 activation otherwise) and `u (M, r)`. In
//! backward the group's FP8 input is dequantized to bf16 once, by the first
//! layer of the group that runs, and shared with the others.
//!
//! Rounding against the CPU layer (which keeps `u`, `s dy B` and the
//! dequantized input in f32): here `u` and `du = s dy B` are bf16 operands of
//! the next GEMMs, and the dequantized input and base are rounded once to bf16.

use crate::mixed::DeviceFp8Weight;
use crate::{DeviceFp8, Error, Fp8Operand, GemmDst, GemmOut, Gpu, Result, TensorAmax};
use cudarc::driver::CudaSlice;
use octet_fp8::{BackwardMode, Format};
use octet_nn::lora::Compute;
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
    /// Rank `r`.
    pub rank: usize,
    /// `alpha / r`.
    pub scale: f32,
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
    /// `u = x A^T (M, r)`, bf16.
    u: Option<CudaSlice<u16>>,
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
        let mut total = self.u.as_ref().map_or(0, |u| 2 * u.len());
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
        })
    }

    /// Whether this layer quantizes its input with current per-tensor scaling
    /// (and its grad_output too, with `grad` and the quantized backward), so
    /// that the kernel writing the tensor can compute the amax for it.
    pub fn takes_amax(&self, grad: bool) -> bool {
        if grad {
            matches!(self.base, GpuBase::Fp8(_)) && self.backward == BackwardMode::Quantized
        } else {
            self.wants_fp8_input()
        }
    }

    /// Whether a prepared input needs its FP8 copy for this layer.
    fn wants_fp8_input(&self) -> bool {
        (self.compute == Compute::Fp8 && matches!(self.base, GpuBase::Fp8(_)))
            || (self.adapter.is_some() && self.backward == BackwardMode::Dequantized)
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
        let xq = if layers.iter().any(GpuLoraLinear::wants_fp8_input) {
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

    /// Forward `y (m, N)` (bf16 bits) from a prepared input.
    pub fn forward_input(
        &self,
        gpu: &Gpu,
        input: &LoraInput,
    ) -> Result<(CudaSlice<u16>, GpuLoraSaved)> {
        let (m, n, k) = (input.m, self.n, self.k);
        if input.k != k {
            return Err(Error::Shape(format!(
                "prepared input of width {} for a LoRA layer of width {k}",
                input.k
            )));
        }
        // SAFETY: the base product writes every element of y.
        let mut y: CudaSlice<u16> = unsafe { gpu.alloc_uninit(m * n, "LoRA output")? };
        match (&self.base, self.compute) {
            (GpuBase::Bf16(w), _) => gpu.gemm_bf16(&input.x, w, &mut y, (m, n, k))?,
            (GpuBase::Fp8(w), Compute::Fp8) => {
                let xq = input
                    .xq
                    .as_ref()
                    .ok_or_else(|| Error::Shape("FP8 input missing".into()))?;
                gpu.gemm_fp8(
                    xq.q.rowwise_operand(),
                    operand(w, &w.codes),
                    &mut y,
                    (m, n, k),
                    false,
                )?;
            }
            (GpuBase::Fp8(w), Compute::Bf16) => gpu.mixed_matmul(&input.x, m, w, &mut y)?,
        }
        let mut saved = GpuLoraSaved {
            m,
            x: None,
            xq: None,
            u: None,
        };
        if let Some(ad) = &self.adapter {
            let r = ad.rank;
            // SAFETY: the GEMM writes every element.
            let mut u: CudaSlice<u16> = unsafe { gpu.alloc_uninit(m * r, "LoRA u")? };
            gpu.gemm_bf16(&input.x, &ad.a, &mut u, (m, r, k))?;
            gpu.gemm_bf16_acc(
                (&u, false),
                (&ad.b, true),
                &mut y,
                (m, n, r),
                (ad.scale, 1.0),
            )?;
            saved.u = Some(u);
            if self.backward == BackwardMode::Dequantized {
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
        Ok((y, saved))
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
        // SAFETY: the base's input-gradient GEMM writes every element (beta = 0).
        let mut dx: CudaSlice<f32> = unsafe { gpu.alloc_uninit(saved.m * self.k, "d_input")? };
        let g = self.backward_into(gpu, saved, dy, dy_amax, &mut dx)?;
        Ok((dx, g))
    }

    /// [`GpuLoraLinear::backward`] with the input gradient written to `dx`:
    /// overwriting a buffer, or added to an [`crate::AddTo`] (as
    /// [`crate::GpuLinear::backward_into`]); the adapter's term is added
    /// after the base's.
    pub fn backward_into<D: GemmOut>(
        &self,
        gpu: &Gpu,
        saved: GpuLoraSaved,
        dy: &CudaSlice<u16>,
        dy_amax: Option<TensorAmax>,
        dx: &mut impl GemmDst<D>,
    ) -> Result<Option<AdapterGrads>> {
        let (m, n, k) = (saved.m, self.n, self.k);
        if dy.len() != m * n {
            return Err(Error::Shape(format!(
                "grad_output of {} elements is not ({m}, {n})",
                dy.len()
            )));
        }
        if dx.len() != m * k {
            return Err(Error::Shape(format!(
                "d_input destination of {} elements for a ({m}, {k}) input",
                dx.len()
            )));
        }
        match (&self.base, self.backward) {
            (GpuBase::Bf16(w), _) => gpu.gemm_bf16_op((dy, false), (w, false), dx, (m, k, n))?,
            (GpuBase::Fp8(w), BackwardMode::Quantized) => {
                let gq = gpu.quantize_tensorwise_rowwise_known(dy, m, n, Format::E5M2, dy_amax)?;
                let wt = gpu.transpose_u8(&w.codes, n, k)?;
                gpu.gemm_fp8(gq.rowwise_operand(), operand(w, &wt), dx, (m, k, n), false)?;
            }
            (GpuBase::Fp8(w), _) => {
                let block = match w.scaling {
                    WeightScaling::Tensor => (n, k),
                    WeightScaling::Channel => (1, k),
                    WeightScaling::Block128 => (128, 128),
                };
                let wd = gpu.dequant_bf16(&w.codes, &w.factors, (n, k), block, w.format)?;
                gpu.gemm_bf16_op((dy, false), (&wd, false), dx, (m, k, n))?;
            }
        }
        let Some(ad) = &self.adapter else {
            return Ok(None);
        };
        let r = ad.rank;
        let u = saved
            .u
            .ok_or_else(|| Error::Shape("LoRA backward: u was not saved".into()))?;
        // dB = s dy^T u; du = s dy B; dA = du^T x; dx += du A.
        // SAFETY (three buffers): each GEMM writes every element (beta = 0).
        let mut db: CudaSlice<f32> = unsafe { gpu.alloc_uninit(n * r, "d_lora_B")? };
        gpu.gemm_bf16_acc((dy, true), (&u, false), &mut db, (n, r, m), (ad.scale, 0.0))?;
        let mut du: CudaSlice<u16> = unsafe { gpu.alloc_uninit(m * r, "LoRA du")? };
        gpu.gemm_bf16_acc(
            (dy, false),
            (&ad.b, false),
            &mut du,
            (m, r, n),
            (ad.scale, 0.0),
        )?;
        let mut da: CudaSlice<f32> = unsafe { gpu.alloc_uninit(r * k, "d_lora_A")? };
        match (&saved.x, &saved.xq) {
            (Some(x), _) => {
                gpu.gemm_bf16_op((&du, true), (x.as_ref(), false), &mut da, (r, k, m))?
            }
            (None, Some(q)) => {
                let cached = q.deq.borrow().clone();
                let xd = match cached {
                    Some(d) => d,
                    None => {
                        let fp8 = &q.q;
                        let d = Rc::new(gpu.dequant_bf16(
                            &fp8.rowwise,
                            &fp8.scale_inv,
                            (m, k),
                            (m, k),
                            fp8.format,
                        )?);
                        *q.deq.borrow_mut() = Some(d.clone());
                        d
                    }
                };
                gpu.gemm_bf16_op((&du, true), (xd.as_ref(), false), &mut da, (r, k, m))?;
            }
            (None, None) => {
                return Err(Error::Shape("LoRA backward: x was not saved".into()));
            }
        }
        gpu.gemm_bf16_acc((&du, false), (&ad.a, false), dx, (m, k, r), (1.0, 1.0))?;
        Ok(Some((da, db)))
    }
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

/// Forward of `layers` that read one input `x (m, K)`: one preparation, each
/// layer's output in order.
pub fn forward_group(
    layers: &[GpuLoraLinear],
    gpu: &Gpu,
    x: Rc<CudaSlice<u16>>,
    x_amax: Option<TensorAmax>,
    m: usize,
) -> Result<Vec<(CudaSlice<u16>, GpuLoraSaved)>> {
    let input = GpuLoraLinear::prepare(layers, gpu, x, x_amax, m)?;
    layers
        .iter()
        .map(|l| l.forward_input(gpu, &input))
        .collect()
}

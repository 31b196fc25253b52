//! The family switches of the one model on the GPU: the projections' biases
//! (Qwen2/2.5's q, k and v; `attention_bias`'s four) and Qwen3's per-head
//! RMSNorm of q and k, each a step of the block that the Llama shape skips.

use super::*;

/// What Qwen3's per-head q and k norms keep for backward: each one's input
/// (bf16, `(N, heads D)`) and its rows' `rstd` (`N heads`).
pub(super) struct QkNormIn {
    pub(super) q: (CudaSlice<u16>, CudaSlice<f32>),
    pub(super) k: (CudaSlice<u16>, CudaSlice<f32>),
}

impl QkNormIn {
    /// Device bytes kept.
    pub(super) fn bytes(&self) -> usize {
        2 * (self.q.0.len() + self.k.0.len()) + 4 * (self.q.1.len() + self.k.1.len())
    }
}

/// Warps of the per-head norm backward's grid (a fixed count, so that the
/// gain's partial sums add in one order).
const HEAD_NORM_WARPS: usize = 1024;

impl<'g> GpuLlama<'g> {
    /// The family's steps between the q/k/v projections and RoPE, in place on
    /// their bf16 outputs: the q/k/v biases (Qwen2), then each head of q and
    /// k normalized (Qwen3), whose inputs are returned for backward.
    pub(super) fn family_forward(
        &mut self,
        fam: &BlockSlots,
        (q, k, v): (
            &mut CudaSlice<u16>,
            &mut CudaSlice<u16>,
            &mut CudaSlice<u16>,
        ),
    ) -> Result<Option<QkNormIn>> {
        for (y, bias) in [
            (&mut *q, fam.bias[0]),
            (&mut *k, fam.bias[1]),
            (&mut *v, fam.bias[2]),
        ] {
            if let Some(slot) = bias {
                self.bias_add(y, slot)?;
            }
        }
        let Some((qn, kn)) = fam.qk_norm else {
            if fam.bias[..3].iter().any(Option::is_some) {
                self.mark("elementwise")?;
            }
            return Ok(None);
        };
        let (q2, rq) = self.head_norm(q, qn)?;
        let (k2, rk) = self.head_norm(k, kn)?;
        self.mark("elementwise")?;
        Ok(Some(QkNormIn {
            q: (std::mem::replace(q, q2), rq),
            k: (std::mem::replace(k, k2), rk),
        }))
    }

    /// The backward of [`GpuLlama::family_forward`] from the attention's
    /// `(dq, dk, dv)` (bf16, RoPE's backward applied): the per-head norms'
    /// backward (q's and k's gradients returned), then the biases' gradients
    /// added into their slots.
    pub(super) fn family_backward(
        &mut self,
        fam: &BlockSlots,
        qk_in: Option<QkNormIn>,
        (dq, dk, dv): (CudaSlice<u16>, CudaSlice<u16>, &CudaSlice<u16>),
    ) -> Result<(CudaSlice<u16>, CudaSlice<u16>)> {
        let (dq, dk) = match (qk_in, fam.qk_norm) {
            (Some(qk), Some((qn, kn))) => (
                self.head_norm_bwd(&qk.q, qn, &dq)?,
                self.head_norm_bwd(&qk.k, kn, &dk)?,
            ),
            _ => (dq, dk),
        };
        for (dy, bias) in [(&dq, fam.bias[0]), (&dk, fam.bias[1]), (dv, fam.bias[2])] {
            if let Some(slot) = bias {
                self.bias_grad(dy, slot)?;
            }
        }
        self.mark("elementwise")?;
        Ok((dq, dk))
    }

    /// `y (rows, C) += bias` (slot `slot`, f32), in place on the bf16 output
    /// of a projection: the sum of the rounded product and the bias, rounded
    /// to bf16 again (the CPU rounds once; the difference is one bf16
    /// rounding of the output, within the selftest's bf16 allowance).
    pub(super) fn bias_add(&self, y: &mut CudaSlice<u16>, slot: usize) -> Result<()> {
        let b = self.slot_view(slot)?;
        let (n, c) = (y.len(), b.len());
        if c == 0 || !n.is_multiple_of(c) {
            return Err(Error::Shape(format!(
                "bias of {c} for an output of {n} elements"
            )));
        }
        let ci = c as i32;
        // SAFETY: `bias_add` (elementwise.cu) reads and writes n elements of
        // y and reads c of b.
        unsafe {
            self.gpu
                .stream
                .launch_builder(&self.f.bias_add)
                .arg(y)
                .arg(&b)
                .arg(&n)
                .arg(&ci)
                .launch(grid_stride(n))?;
        }
        Ok(())
    }

    /// A bias's gradient, the column sums of `dy (N, C)` (bf16), added into
    /// its slot as a product with a row of ones (cuBLASLt: the same sum
    /// order on every run). Nothing in LoRA mode, where biases are frozen.
    pub(super) fn bias_grad(&mut self, dy: &CudaSlice<u16>, slot: usize) -> Result<()> {
        if self.lora.is_some() {
            return Ok(());
        }
        let sl = self.slots[slot].clone();
        let c = sl.numel;
        let n = dy.len() / c.max(1);
        if n * c != dy.len() {
            return Err(Error::Shape(format!(
                "{}: gradient of {} elements for a bias of {c}",
                sl.name,
                dy.len()
            )));
        }
        // One row of ones, uploaded once for the largest row count seen.
        if self.ones.as_ref().is_none_or(|o| o.len() < n) {
            self.ones = Some(self.gpu.upload_bf16(&vec![half::bf16::ONE; n])?);
        }
        let ones = self
            .ones
            .as_ref()
            .ok_or_else(|| Error::Shape("no row of ones".into()))?
            .slice(0..n);
        let mut dst = AddTo(self.grad.slice_mut(sl.offset..sl.offset + c));
        self.gpu
            .gemm_bf16_op((&ones, false), (dy, false), &mut dst, (1, c, n))
    }

    /// Qwen3's norm of each head of `x (N, heads D)` (bf16) with the gain in
    /// slot `slot`: the normalized bf16 rows and their `rstd`.
    pub(super) fn head_norm(
        &self,
        x: &CudaSlice<u16>,
        slot: usize,
    ) -> Result<(CudaSlice<u16>, CudaSlice<f32>)> {
        let d = self.cfg.head_dim();
        let rows = x.len() / d;
        let g = self.slot_view(slot)?;
        if g.len() != d || rows * d != x.len() {
            return Err(Error::Shape(format!(
                "head norm of {} elements with a gain of {} (head dim {d})",
                x.len(),
                g.len()
            )));
        }
        // SAFETY: one warp a row writes every element of y and every rstd.
        let mut y: CudaSlice<u16> = unsafe { self.gpu.alloc_uninit(x.len(), "head norm output")? };
        let mut rstd: CudaSlice<f32> = unsafe { self.gpu.alloc_uninit(rows, "head norm rstd")? };
        let (ri, di, eps) = (rows as i32, d as i32, self.cfg.rms_norm_eps as f32);
        // SAFETY: `head_norm_fwd` (norm.cu) reads rows x d of x and d of g.
        unsafe {
            self.gpu
                .stream
                .launch_builder(&self.f.head_norm_fwd)
                .arg(x)
                .arg(&g)
                .arg(&mut y)
                .arg(&mut rstd)
                .arg(&ri)
                .arg(&di)
                .arg(&eps)
                .launch(LaunchConfig {
                    grid_dim: (rows.div_ceil(8) as u32, 1, 1),
                    block_dim: (256, 1, 1),
                    shared_mem_bytes: 0,
                })?;
        }
        Ok((y, rstd))
    }

    /// The backward of [`GpuLlama::head_norm`] from `dy` (bf16): the input's
    /// gradient (bf16), and the gain's added into its slot (not in LoRA
    /// mode, where the gains are frozen).
    pub(super) fn head_norm_bwd(
        &mut self,
        (x, rstd): &(CudaSlice<u16>, CudaSlice<f32>),
        slot: usize,
        dy: &CudaSlice<u16>,
    ) -> Result<CudaSlice<u16>> {
        let d = self.cfg.head_dim();
        let rows = rstd.len();
        if x.len() != rows * d || dy.len() != x.len() {
            return Err(Error::Shape(format!(
                "head norm backward: {} inputs, {} gradients, {rows} rows of {d}",
                x.len(),
                dy.len()
            )));
        }
        let frozen = self.lora.is_some();
        let mut dx: CudaSlice<u16> =
            unsafe { self.gpu.alloc_uninit(x.len(), "head norm d_input")? };
        // SAFETY: every warp of the grid writes its row of partials.
        let mut partial: Option<CudaSlice<f32>> = match frozen {
            true => None,
            false => Some(unsafe {
                self.gpu
                    .alloc_uninit(HEAD_NORM_WARPS * d, "head norm partials")?
            }),
        };
        let (ri, di) = (rows as i32, d as i32);
        let null: u64 = 0;
        {
            let g = self.slot_view(slot)?;
            // SAFETY: `head_norm_bwd` (norm.cu) reads rows x d of x and dy, d
            // of g and rows of rstd; writes rows x d of dx and, given,
            // HEAD_NORM_WARPS x d partials.
            unsafe {
                let mut lb = self.gpu.stream.launch_builder(&self.f.head_norm_bwd);
                lb.arg(x).arg(&g).arg(rstd).arg(dy).arg(&mut dx);
                match partial.as_mut() {
                    Some(p) => lb.arg(p),
                    None => lb.arg(&null),
                };
                lb.arg(&ri).arg(&di).launch(LaunchConfig {
                    grid_dim: ((HEAD_NORM_WARPS / 8) as u32, 1, 1),
                    block_dim: (256, 1, 1),
                    shared_mem_bytes: 0,
                })?;
            }
        }
        if let Some(partial) = partial {
            let sl = self.slots[slot].clone();
            let mut gview = self.grad.slice_mut(sl.offset..sl.offset + sl.numel);
            let yi = HEAD_NORM_WARPS as i32;
            // SAFETY: `sum_partials` adds HEAD_NORM_WARPS rows of d partials
            // into the d gains' gradients.
            unsafe {
                self.gpu
                    .stream
                    .launch_builder(&self.f.sum_partials)
                    .arg(&partial)
                    .arg(&mut gview)
                    .arg(&yi)
                    .arg(&di)
                    .launch(LaunchConfig {
                        grid_dim: (d.div_ceil(32) as u32, 1, 1),
                        block_dim: (32, 8, 1),
                        shared_mem_bytes: 0,
                    })?;
            }
        }
        Ok(dx)
    }
}

//! Attention on the GPU model: the flash-style causal kernels of `attention.cu`,
//! forward and backward, and the hooks that run them alone (conformance, benchmarks).

use super::*;

impl<'g> GpuLlama<'g> {
    /// Attention forward: `(out bf16 (B*T, Hq*D), lse f32 (B, Hq, T))`.
    pub(super) fn attn_forward(
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
    pub(super) fn attn_backward(
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
    pub(super) fn attn_backward_bf16(
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
    pub(super) fn attn_bwd_launch(&self, a: AttnBwdIn<'_>, dst: AttnGradDst<'_>) -> Result<()> {
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
    pub(super) fn backward_hook_inputs<'a>(
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
    pub(super) fn check_attention_dims(
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

//! The backward pass: a reverse walk over the blocks, each recomputed where
//! asked, gradients added into the flat f32 buffer.

use super::*;

impl<'g> GpuLlama<'g> {
    /// RMSNorm backward from `dy` = the sum of `dys` (one to three input
    /// gradients of the projections that read the norm's output, added in
    /// order; f32 from the LM head, bf16 from a block's projections, whose
    /// GEMMs add them into one buffer): `dres (+)= dx`; the gain's gradient added to its slot (not in
    /// LoRA mode, where the gains are frozen); with `bf16_for = (block,
    /// projection)` also the updated `dres` in bf16, that projection's
    /// grad_output, with its amax when the projection's quantizer reads one.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn norm_bwd<D: GemmOut>(
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
                (octet_cuda::gemm::OutType::F32, true) => &self.f.norm_bwd_v4,
                (octet_cuda::gemm::OutType::F32, false) => &self.f.norm_bwd,
                (octet_cuda::gemm::OutType::Bf16, true) => &self.f.norm_bwd_b16_v4,
                (octet_cuda::gemm::OutType::Bf16, false) => &self.f.norm_bwd_b16,
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
    pub(super) fn add_grads(&mut self, items: &[(usize, CudaSlice<f32>)]) -> Result<()> {
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
            // SAFETY: argument types match `add_many` in elementwise.cu; each
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
    pub(super) fn bf16(
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
            for &sl in &b.slots.lin {
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
            dh,
        } = saved;
        let n = b * t;
        let null: u64 = 0;
        let s = &gpu.stream;
        // The LM head's gradients were formed in forward (`head_loss`).
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
                self.finish_gather(bi, g, kept.as_mut().map(|sb| &mut sb.core.lin))?;
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
                        qk_in,
                    },
            } = sb;
            let BlockProjSaved {
                q: sq,
                k: sk,
                v: sv,
                o: so,
                gate: sg,
                up: su,
                down: sd,
            } = lin;
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
            let mn = self.blocks[bi].slots.mlp_norm;
            let (dres_bf_attn, o_amax) = self
                .norm_bwd(&x1, &rstd2, &[&dh2], &mut dres, mn, true, Some((bi, 3)))?
                .ok_or_else(|| Error::Shape("norm backward gave no bf16 gradient".into()))?;
            self.mark("rmsnorm bwd")?;
            let fam = self.blocks[bi].slots;
            if let Some(slot) = fam.bias[3] {
                self.bias_grad(&dres_bf_attn, slot)?;
            }
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
            if qk_in.is_some() {
                // The attention's dq and dk are the norms' output gradients:
                // q's and k's quantizers find their own amaxes.
                (q_amax, k_amax) = (None, None);
            }
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
            let (dq_bf, dk_bf) = self.family_backward(&fam, qk_in, (dq_bf, dk_bf, &dv_bf))?;
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
            let an = self.blocks[bi].slots.attn_norm;
            // The next block down reads the gradient in bf16; the embedding in f32.
            let below = bi.checked_sub(1).map(|prev| (prev, 6));
            dres_bf = self.norm_bwd(&x, &rstd1, &[&dh], &mut dres, an, true, below)?;
            self.mark("rmsnorm bwd")?;
            if self.shard.is_some() {
                let ids: Vec<usize> = self.blocks[bi].slots.ids().collect();
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
            let ids: Vec<usize> = (0..self.slots.len())
                .filter(|&i| i == 0 || i >= final_norm_slot(&self.cfg))
                .collect();
            self.flush_grads(&ids)?;
            self.mark("reduce-scatter")?;
        }
        Ok(())
    }
}

//! The forward pass: embedding, the blocks (with their saved activations or
//! recomputation), the final norm and the LM head with the loss.

use super::*;

impl<'g> GpuLlama<'g> {
    /// Forward and mean cross-entropy on `tokens (B, T)` with `targets (B, T)`,
    /// over the counted targets (a masked one, [`crate::loss::IGNORE`], adds
    /// neither loss nor gradient). The gradient is that of the mean times
    /// `grad_scale` (1 for one micro-batch; `1 / (accumulated micro-batches
    /// x ranks)` where several add into one step). With `keep = false`
    /// nothing is kept for backward (evaluation). The LM head's gradients are
    /// formed here, chunk by chunk ([`GPU_HEAD_CHUNK`]): its weight's added
    /// into its slot, its input's kept for backward. So a forward with
    /// `keep` has changed the gradients: follow it with
    /// [`GpuLlama::backward`], or with [`GpuLlama::zero_grad`] before the
    /// next step (as the trainer does after an error).
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
            .find(|&(i, &x)| x as usize >= v && !(i >= n && x == crate::loss::IGNORE))
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
            // the kernels of their families (`TRAIN_KERNELS`), and every buffer has the length the
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
            Some(b) => b.slots.attn_norm,
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
                Some(b) => b.slots.attn_norm,
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
        let (loss, dh) = self.head_loss(&hf, &d_tgt, targets, grad_scale, keep)?;
        self.mark("head + loss")?;
        drop(hf);
        if !loss.is_finite() {
            return Err(if self.check_layers {
                Error::NonFiniteIn("the final norm, LM head or loss".into())
            } else {
                Error::NonFinite
            });
        }
        let Some(dh) = dh.filter(|_| keep) else {
            return Ok((loss, None));
        };
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
                dh,
            }),
        ))
    }

    /// The LM head and the loss, fused and chunked over rows: for each chunk
    /// of at most [`GPU_HEAD_CHUNK`] logits (`head_chunk`), the f32 logits of the final
    /// norm's output `hf (N, C)`, their cross-entropy against `targets`
    /// (masked rows, [`crate::loss::IGNORE`], count neither loss nor
    /// gradient), and with `keep` at once the logits' gradient's products:
    /// `dh` (returned, f32 `(N, C)`) and the head weight's gradient (added
    /// into its slot, except in LoRA mode). No `(N, V)` buffer exists.
    /// Returns the mean loss over the counted rows and `dh` (with `keep`).
    /// The gradient is that of the mean times `grad_scale`.
    fn head_loss(
        &mut self,
        hf: &CudaSlice<u16>,
        d_tgt: &CudaSlice<i32>,
        targets: &[u32],
        grad_scale: f32,
        keep: bool,
    ) -> Result<(f64, Option<CudaSlice<f32>>)> {
        let gpu = self.gpu;
        let (c, v) = (self.cfg.hidden_size, self.cfg.vocab_size);
        let n = targets.len();
        let counted = targets
            .iter()
            .filter(|&&t| t != crate::loss::IGNORE)
            .count();
        // The mean's gradient over the counted rows; all masked: none.
        let gscale = grad_scale / counted.max(1) as f32;
        // Rows a chunk: a multiple of 16 where there are that many (chunk
        // boundaries 16-row aligned for the GEMMs' tiles and operands).
        let rows = (self.head_chunk / v.max(1)).max(1);
        let step = match rows >= 16 {
            true => rows / 16 * 16,
            false => rows,
        }
        .min(n.max(1));
        // SAFETY: each chunk's xent writes its rows' losses; the head GEMMs
        // write every element of `dh` (beta 0) chunk by chunk.
        let mut losses: CudaSlice<f32> = unsafe { gpu.alloc_uninit(n, "losses")? };
        let mut logits: CudaSlice<f32> = unsafe { gpu.alloc_uninit(step * v, "logits chunk")? };
        let mut dlogits: CudaSlice<u16> = match keep {
            true => unsafe { gpu.alloc_uninit(step * v, "d_logits chunk")? },
            false => gpu.alloc_zeros(1, "d_logits")?,
        };
        let mut dh: Option<CudaSlice<f32>> = match keep {
            true => Some(unsafe { gpu.alloc_uninit(n * c, "d_hidden")? }),
            false => None,
        };
        let vi = v as i32;
        for r0 in (0..n).step_by(step) {
            let r1 = (r0 + step).min(n);
            let m = r1 - r0;
            let h = hf.slice(r0 * c..r1 * c);
            let mut lg = logits.slice_mut(0..m * v);
            gpu.gemm_bf16(&h, &self.head, &mut lg, (m, v, c))?;
            let tg = d_tgt.slice(r0..r1);
            let mut ls = losses.slice_mut(r0..r1);
            // SAFETY: `cross_entropy` (loss.cu) reads `m` rows of `v` logits
            // and `m` targets, writes `m` losses and, given, `m x v` gradients.
            unsafe {
                let null: u64 = 0;
                let mut lb = gpu.stream.launch_builder(&self.f.xent);
                lb.arg(&mut lg).arg(&tg).arg(&mut ls);
                match keep {
                    true => lb.arg(&mut dlogits),
                    false => lb.arg(&null),
                };
                lb.arg(&vi).arg(&gscale).launch(rows_cfg(m))?;
            }
            let Some(dh) = dh.as_mut() else { continue };
            // dh = dlogits @ W, dW += dlogits^T @ h.
            let dl = dlogits.slice(0..m * v);
            let mut dhc = dh.slice_mut(r0 * c..r1 * c);
            gpu.gemm_bf16_op((&dl, false), (&self.head, false), &mut dhc, (m, c, v))?;
            if self.lora.is_none() {
                // Accumulated straight into the head's (or the tied embedding's) slot.
                let sl = &self.slots[self.head_slot];
                let mut dw = AddTo(self.grad.slice_mut(sl.offset..sl.offset + sl.numel));
                gpu.gemm_bf16_op((&dl, true), (&h, false), &mut dw, (v, c, m))?;
            }
        }
        let host = gpu.download(&losses)?;
        let loss = host.iter().map(|&l| l as f64).sum::<f64>() / counted.max(1) as f64;
        Ok((loss, dh))
    }

    /// Block `bi`'s forward from the residual `x` entering it and its input
    /// norm's output `h` (with `h`'s amax where q/k/v's quantizer reads one),
    /// up to the down projection's output; the caller adds that to the
    /// residual. `fp8_saved`: keep the norms' and SwiGLU's inputs in FP8 (see
    /// [`SavedActivations::Fp8`]). `recomputing`: backward runs the block
    /// again, which needs no down projection output (`dn` is `None`).
    pub(super) fn block_forward(
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
        let mn = self.blocks[bi].slots.mlp_norm;
        // q, k and v read one quantization of h.
        let mut qkv = self.proj_forward(bi, 0..3, Rc::new(h), h_amax, n)?;
        let (mut vv, sv) = next_out(&mut qkv)?;
        let (mut k, sk) = next_out(&mut qkv)?;
        let (mut q, sq) = next_out(&mut qkv)?;
        self.mark("linear fwd")?;
        let fam = self.blocks[bi].slots;
        let qk_in = self.family_forward(&fam, (&mut q, &mut k, &mut vv))?;
        self.rope_forward((&mut q, &mut k), (n, t))?;
        let mut a_amax = self.amax_for(bi, 3, false)?;
        let (a, lse) = self.attn_forward(&q, &k, &vv, (b, t, hq, hkv, d), &mut a_amax)?;
        self.mark("attention fwd (+rope)")?;
        // The attention output: o's input, and read again by the attention
        // backward (one buffer, shared with o's saved input when o keeps it).
        let a = Rc::new(a);
        let mut outs = self.proj_forward(bi, 3..4, a.clone(), a_amax, n)?;
        let (mut o, so) = next_out(&mut outs)?;
        if let Some(slot) = fam.bias[3] {
            self.bias_add(&mut o, slot)?;
        }
        self.mark("linear fwd")?;
        // FP8 saved activations: the attention backward reads o's E4M3 input where o keeps one.
        let a = match so.attn_out().filter(|_| fp8_saved) {
            Some(q) => {
                drop(a);
                q
            }
            None => AttnOut::Bf16(a),
        };
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
        Ok(BlockOut {
            core: BlockCore {
                lin: BlockProjSaved {
                    q: sq,
                    k: sk,
                    v: sv,
                    o: so,
                    gate: sg,
                    up: su,
                    down: sd,
                },
                q,
                k,
                v: vv,
                a,
                lse,
                rstd2,
                swiglu,
                qk_in,
            },
            x1,
            xq2,
            dn,
        })
    }

    /// RoPE on q and k in place (rows of `t` positions, `n` rows in all).
    fn rope_forward(
        &self,
        (q, k): (&mut CudaSlice<u16>, &mut CudaSlice<u16>),
        (n, t): (usize, usize),
    ) -> Result<()> {
        let cfg = &self.cfg;
        let di = cfg.head_dim() as i32;
        let (ni, ti) = (n as i32, t as i32);
        for (buf, heads) in [(q, cfg.num_attention_heads), (k, cfg.num_key_value_heads)] {
            let hi = heads as i32;
            // SAFETY: `rope_fwd` (rope.cu) rotates n rows of `heads` heads of
            // d in place, reading the tables' rows of positions below t.
            unsafe {
                self.gpu
                    .stream
                    .launch_builder(&self.f.rope_fwd)
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
        Ok(())
    }

    /// Recomputation: block `bi`'s forward again from the residual `x` that
    /// entered it, keeping what its backward reads, as the training forward
    /// would have kept it (the same kernels on the same inputs, hence the
    /// same bytes; delayed scaling's amax records take a maximum, LoRA
    /// dropout draws the forward's masks again).
    pub(super) fn recompute_block(
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
        let attn_norm = self.blocks[bi].slots.attn_norm;
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
    pub(super) fn add_norm(
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
}

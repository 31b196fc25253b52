//! Gradient norm, finiteness and the AdamW step over the flat f32 masters.

use super::*;

impl<'g> GpuLlama<'g> {
    /// The global L2 norm of the gradients (f64 partial sums, added in a fixed order).
    pub fn grad_norm(&self) -> Result<f64> {
        self.sum_squares(&self.grad).map(f64::sqrt)
    }

    /// Whether every element is finite: the f64 sum of squares of finite f32
    /// values cannot overflow, so it is finite exactly when they all are.
    pub(super) fn all_finite(&self, x: &CudaSlice<f32>) -> Result<bool> {
        Ok(self.sum_squares(x)?.is_finite())
    }

    pub(super) fn sum_squares(&self, x: &CudaSlice<f32>) -> Result<f64> {
        self.sum_squares_of(&x.slice(..))
    }

    pub(super) fn sum_squares_of(&self, x: &cudarc::driver::CudaView<'_, f32>) -> Result<f64> {
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
                for (li, &sl) in blk.slots.lin.iter().enumerate() {
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
            // SAFETY: argument types match `adamw_many` in optim.cu; each
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
    pub(super) fn begin_step(&mut self, norm: f32, p: &AdamParams) -> Result<(f32, f32, f32)> {
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
pub(super) fn launch_adamw(
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
    // SAFETY: argument types match `adamw` in optim.cu; every buffer holds `n` elements.
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

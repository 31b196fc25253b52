//! Sharded data parallel (FSDP-style) for [`GpuLlama`]: how the parameters
//! are split over the ranks, the all-gathers of the block weights (bf16, or
//! FP8 with one global scale per tensor), the reduce-scatters of the
//! gradients, and AdamW on this rank's shards.

use super::*;
/// One parameter's shard: rows `[rank * rows, (rank + 1) * rows)` of its
/// first dimension (the last rank's padded with zero rows).
#[derive(Clone, Copy, Debug)]
pub(super) struct Part {
    /// Rows per rank (the first dimension divided up, rounded up).
    pub(super) rows: usize,
    /// Elements per row.
    pub(super) row_len: usize,
    /// First element in the shard-flat buffers.
    pub(super) shard_off: usize,
}

impl Part {
    pub(super) fn numel(&self) -> usize {
        self.rows * self.row_len
    }

    /// Rank `rank`'s rows of the full values `full`, padded with zeros to [`Part::numel`].
    pub(super) fn mine(&self, full: &[f32], rank: usize) -> Vec<f32> {
        let lo = (rank * self.numel()).min(full.len());
        let hi = ((rank + 1) * self.numel()).min(full.len());
        let mut v = full[lo..hi].to_vec();
        v.resize(self.numel(), 0.0);
        v
    }
}

/// Sharded data parallel state (FSDP-style) of one rank.
///
/// Masters and AdamW moments live only as this rank's shard of every
/// parameter (`master`, `m`, `v` hold the shards back to back, padded rows
/// zero). Gradients are computed in full for one block at a time: every
/// block's parameters share one region of `grad` (each padded to `world`
/// shards, rank-major), and as soon as backward finishes a block, one grouped
/// reduce-scatter sums its gradients over the ranks, this rank's shards are
/// added to `gshard`, and the region is zeroed for the next block (the
/// embedding, final norm and head have their own region, flushed at the
/// end). After AdamW the compute copies are gathered: bf16 block weights and
/// LM head, f32 embedding and norm gains (`rep`). Under the tensorwise recipe
/// with an FP8 backward the block weights travel as FP8 instead, gathered
/// block by block at each forward with one global scale (each rank's amax,
/// then the maximum over the ranks): the bytes every rank holds are exactly
/// those one rank would quantize from the whole weight.
pub(super) struct Sharding<'g> {
    pub(super) comm: &'g NcclComm,
    pub(super) parts: Vec<Part>,
    pub(super) gshard: CudaSlice<f32>,
    /// Full f32 copies of the parameters the kernels read in f32 (embedding, norm gains).
    pub(super) rep: CudaSlice<f32>,
    /// Offset of a slot in `rep`.
    pub(super) rep_off: Vec<Option<usize>>,
    /// bf16 shards of the parameters with bf16 compute copies (block matrices, LM head).
    pub(super) wsh: Vec<Option<CudaSlice<u16>>>,
    /// Block weights are gathered in FP8 at each forward.
    fp8: bool,
    /// Gradients are reduce-scattered in bf16 (half the bytes), else f32.
    bf16_grads: bool,
    /// Block weights are gathered for each block's forward and again for its
    /// backward, and freed in between (FSDP's `reshard_after_forward`).
    pub(super) reshard: bool,
}

/// Gather every rank's `send` (one [`Part`], `part.numel()` elements) into
/// `dst` (the parameter's `numel` elements, rank-major rows), leaving out
/// the last rank's padding (through a temporary when there is any).
fn gather_part<T: DeviceRepr + ValidAsZeroBits + cudarc::nccl::NcclType>(
    gpu: &Gpu,
    comm: &NcclComm,
    send: &CudaView<'_, T>,
    dst: &mut cudarc::driver::CudaViewMut<'_, T>,
) -> Result<()> {
    let full = send.len() * comm.world();
    if full == dst.len() {
        return comm.all_gather(send, dst);
    }
    // SAFETY: the all-gather writes every element.
    let mut tmp: CudaSlice<T> = unsafe { gpu.alloc_uninit(full, "gather buffer")? };
    comm.all_gather(send, &mut tmp)?;
    let n = dst.len();
    gpu.stream.memcpy_dtod(&tmp.slice(..n), dst)?;
    Ok(())
}

/// Add the reduce-scattered shards of parameters `ids`, back to back in
/// `tmp` (f32, or bf16 bits with the `add_bf16_inplace` kernel), to their
/// places in `gshard`.
fn accumulate_shards<T: DeviceRepr>(
    gpu: &Gpu,
    add: &CudaFunction,
    gshard: &mut CudaSlice<f32>,
    parts: &[Part],
    ids: &[usize],
    tmp: &CudaSlice<T>,
) -> Result<()> {
    let mut o = 0;
    for &i in ids {
        let part = parts[i];
        let n = part.numel();
        let mut dst = gshard.slice_mut(part.shard_off..part.shard_off + n);
        let src = tmp.slice(o..o + n);
        // SAFETY: `add` is `add_inplace` (f32) or `add_bf16_inplace` (u16 bits),
        // matching `T`; both views hold `n` elements.
        unsafe {
            gpu.stream
                .launch_builder(add)
                .arg(&mut dst)
                .arg(&src)
                .arg(&n)
                .launch(grid1(n))?;
        }
        o += n;
    }
    Ok(())
}

/// [`gather_part`] of bf16 bits (NCCL moves them as `ncclBfloat16`).
fn gather_bf16(
    gpu: &Gpu,
    comm: &NcclComm,
    send: &CudaSlice<u16>,
    dst: &mut CudaSlice<u16>,
) -> Result<()> {
    let (ns, nd) = (send.len(), dst.len());
    // SAFETY: bf16 and u16 have the same size; the bits are only moved.
    let (s, mut d) = unsafe {
        (
            send.transmute::<half::bf16>(ns),
            dst.transmute_mut::<half::bf16>(nd),
        )
    };
    match (s, d.as_mut()) {
        (Some(s), Some(d)) => gather_part(gpu, comm, &s, d),
        _ => Err(Error::Shape("bf16 view of a gather buffer".into())),
    }
}

/// Sharded data parallel (see [`Sharding`]).
impl<'g> GpuLlama<'g> {
    /// Split the parameters over the ranks of `comm`: this rank's shard of
    /// every parameter (masters, returned), the bf16 shards of the matrices,
    /// the full f32 copies of embedding and norm gains; `slots` get their
    /// offsets in the padded full-gradient layout (returned: its length).
    /// Under tensorwise with an FP8 backward, the block linears switch to
    /// weights gathered in FP8 (their bf16 copies are freed).
    #[allow(clippy::too_many_arguments, clippy::type_complexity)]
    pub(super) fn shard_state(
        gpu: &'g Gpu,
        comm: &'g NcclComm,
        slots: &mut [Slot],
        host: &[f32],
        lin_slots: &std::collections::HashSet<usize>,
        head_slot: usize,
        recipe: Option<Recipe>,
        blocks: &mut [Block],
    ) -> Result<(CudaSlice<f32>, usize, Option<Sharding<'g>>)> {
        let (world, rank) = (comm.world(), comm.rank());
        let mut parts = Vec::with_capacity(slots.len());
        let mut shard_host: Vec<f32> = Vec::new();
        let mut rep_host: Vec<f32> = Vec::new();
        let mut rep_off = vec![None; slots.len()];
        let mut wsh = Vec::with_capacity(slots.len());
        for (i, sl) in slots.iter().enumerate() {
            let total_rows = sl.shape.first().copied().unwrap_or(1).max(1);
            let row_len = sl.numel / total_rows;
            let part = Part {
                rows: total_rows.div_ceil(world),
                row_len,
                shard_off: shard_host.len(),
            };
            let src = &host[sl.offset..sl.offset + sl.numel];
            let mine = part.mine(src, rank);
            let bf16_copy = lin_slots.contains(&i) || i == head_slot;
            wsh.push(if bf16_copy {
                let b: Vec<half::bf16> = mine.iter().map(|&x| half::bf16::from_f32(x)).collect();
                Some(gpu.upload_bf16(&b)?)
            } else {
                None
            });
            // The embedding (also the tied head) and the norm gains are read in f32.
            let untied_head = i == head_slot && i != 0;
            if !(lin_slots.contains(&i) || untied_head) {
                rep_off[i] = Some(rep_host.len());
                rep_host.extend_from_slice(src);
            }
            shard_host.extend(mine);
            parts.push(part);
        }
        // Gradient layout: the blocks' parameters share one region (backward
        // reduce-scatters a block's gradients once they are complete, then
        // zeroes the region for the next block); the embedding, final norm and
        // head follow, each padded to `world` shards.
        let block_ids = |i: usize| 1 + 9 * i..1 + 9 * (i + 1);
        let mut off = 0;
        let mut region = Vec::with_capacity(9);
        if !blocks.is_empty() {
            for j in block_ids(0) {
                region.push(off);
                off += world * parts[j].numel();
            }
        }
        for (i, blk) in blocks.iter().enumerate() {
            if blk.attn_norm != 1 + 9 * i {
                return Err(Error::Shape("unexpected parameter order".into()));
            }
            for (j, sid) in block_ids(i).enumerate() {
                if parts[sid].numel() != parts[1 + j].numel() {
                    return Err(Error::Shape(format!(
                        "block {i} differs in shape from block 0 ({})",
                        slots[sid].name
                    )));
                }
                slots[sid].offset = region[j];
            }
        }
        for (sid, sl) in slots.iter_mut().enumerate() {
            if sid == 0 || sid > 9 * blocks.len() {
                sl.offset = off;
                off += world * parts[sid].numel();
            }
        }
        let full_off = off;
        let fp8 = recipe.is_some_and(|r| {
            matches!(
                r.scaling(),
                octet_fp8::Scaling::Tensorwise {
                    power_of_two: false
                }
            ) && r.backward() != octet_fp8::BackwardMode::HighPrecision
        });
        if fp8 {
            for blk in blocks.iter_mut() {
                for l in &mut blk.lin {
                    l.use_external_weight(gpu)?;
                }
            }
        }
        let sharding = Sharding {
            comm,
            parts,
            gshard: gpu.alloc_zeros(shard_host.len(), "gradient shards")?,
            rep: gpu.upload(&rep_host)?,
            rep_off,
            wsh,
            fp8,
            bf16_grads: false,
            reshard: false,
        };
        Ok((gpu.upload(&shard_host)?, full_off, Some(sharding)))
    }

    /// The GPU the model lives on.
    pub fn gpu(&self) -> &'g Gpu {
        self.gpu
    }

    /// Whether the parameters are sharded over ranks.
    pub fn sharded(&self) -> bool {
        self.shard.is_some()
    }

    /// Reduce-scatter gradients in bf16 (half the bytes; each rank's
    /// gradient rounded to bf16 and NCCL's sum kept in bf16) instead of f32.
    /// No effect on one rank.
    pub fn set_grad_reduce_bf16(&mut self, on: bool) {
        if let Some(sh) = self.shard.as_mut() {
            sh.bf16_grads = on;
        }
    }

    /// Whether block weights are all-gathered in FP8 (sharded, tensorwise, FP8 backward).
    pub fn fp8_gather(&self) -> bool {
        self.shard.as_ref().is_some_and(|sh| sh.fp8)
    }

    /// FSDP's `reshard_after_forward`: each block's weights are gathered
    /// before its forward, freed after it, and gathered again before its
    /// backward (one more all-gather of the block weights per step), so that
    /// no rank holds more than one block's full weights at a time. Off, the
    /// bf16 block weights stay gathered from one AdamW step to the next, and
    /// FP8-gathered ones from a block's forward to its backward. Sharded only.
    pub fn set_reshard_after_forward(&mut self, on: bool) -> Result<()> {
        let Some(sh) = self.shard.as_mut() else {
            return Err(Error::Shape(
                "reshard after forward needs sharded parameters (--nproc)".into(),
            ));
        };
        sh.reshard = on;
        if on {
            for bi in 0..self.blocks.len() {
                self.release_block_bf16(bi)?;
            }
        } else if !self.fp8_gather() {
            for bi in 0..self.blocks.len() {
                self.gather_block_bf16(bi)?;
            }
        }
        Ok(())
    }

    /// Whether block weights are resharded after forward.
    pub fn reshard_after_forward(&self) -> bool {
        self.shard.as_ref().is_some_and(|sh| sh.reshard)
    }

    /// Before block `bi`'s forward: its weights gathered in FP8 (each
    /// forward), or in bf16 when resharding after forward.
    pub(super) fn gather_for_block(&mut self, bi: usize) -> Result<()> {
        let Some(sh) = self.shard.as_ref() else {
            return Ok(());
        };
        if sh.fp8 {
            self.gather_block_fp8(bi)?;
            self.mark("fp8 all-gather")?;
        } else if sh.reshard {
            self.gather_block_bf16(bi)?;
            self.mark("bf16 all-gather")?;
        }
        Ok(())
    }

    /// After block `bi`'s forward, resharding: the FP8 weights its saved
    /// layers keep for backward dropped, or its bf16 weights freed.
    pub(super) fn reshard_after_block_forward(
        &mut self,
        bi: usize,
        saved: &mut [ProjSaved],
    ) -> Result<()> {
        let Some(sh) = self.shard.as_ref() else {
            return Ok(());
        };
        if !sh.reshard {
            return Ok(());
        }
        if sh.fp8 {
            for (li, ps) in saved.iter_mut().enumerate() {
                if let ProjSaved::Full(s) = ps {
                    self.blocks[bi].lin[li].release_saved_weight(s)?;
                }
            }
            Ok(())
        } else {
            self.release_block_bf16(bi)
        }
    }

    /// Before block `bi`'s backward, resharding: its weights gathered again
    /// (FP8: into the saved layers, the bytes the forward used).
    pub(super) fn gather_for_block_backward(
        &mut self,
        bi: usize,
        saved: &mut [ProjSaved],
    ) -> Result<()> {
        let Some(sh) = self.shard.as_ref() else {
            return Ok(());
        };
        if !sh.reshard {
            return Ok(());
        }
        if sh.fp8 {
            self.gather_block_fp8(bi)?;
            let gpu = self.gpu;
            for (li, ps) in saved.iter_mut().enumerate() {
                if let ProjSaved::Full(s) = ps {
                    self.blocks[bi].lin[li].reattach_gathered(gpu, s)?;
                }
            }
            self.mark("fp8 all-gather")
        } else {
            self.gather_block_bf16(bi)?;
            self.mark("bf16 all-gather")
        }
    }

    /// Gather block `bi`'s bf16 weights from the ranks' shards into full buffers.
    pub(super) fn gather_block_bf16(&mut self, bi: usize) -> Result<()> {
        let gpu = self.gpu;
        let Some(sh) = self.shard.as_ref() else {
            return Ok(());
        };
        for li in 0..self.blocks[bi].lin.len() {
            let si = self.blocks[bi].lin_slot[li];
            let w = sh.wsh[si]
                .as_ref()
                .ok_or_else(|| Error::Shape(format!("{}: no bf16 shard", self.slots[si].name)))?;
            let l = &mut self.blocks[bi].lin[li];
            // SAFETY: the all-gather writes every element.
            l.weight = unsafe { gpu.alloc_uninit(l.n * l.k, "gathered bf16 weight")? };
            gather_bf16(gpu, sh.comm, w, &mut l.weight)?;
        }
        Ok(())
    }

    /// Resharding with bf16 gathers: free block `bi`'s full bf16 weights.
    pub(super) fn release_block_bf16(&mut self, bi: usize) -> Result<()> {
        let gpu = self.gpu;
        if !self.shard.as_ref().is_some_and(|sh| sh.reshard && !sh.fp8) {
            return Ok(());
        }
        for l in &mut self.blocks[bi].lin {
            l.weight = gpu.alloc_zeros(1, "placeholder")?;
        }
        Ok(())
    }

    /// Gather block `bi`'s seven weights in FP8: each rank's bf16 shard's
    /// amax, the maximum over the ranks (one all-reduce of the seven), each
    /// shard cast (row-wise only) with its tensor's one scale, the codes all-gathered
    /// (one NCCL group) and transposed here for the column-wise copy
    /// (per-tensor scaling transposes locally).
    pub(super) fn gather_block_fp8(&mut self, bi: usize) -> Result<()> {
        let gpu = self.gpu;
        let Some(sh) = self.shard.as_ref() else {
            return Ok(());
        };
        let nl = self.blocks[bi].lin.len();
        let mut amaxes: CudaSlice<u32> = gpu.alloc_zeros(nl, "amax")?;
        let mut flags = Vec::with_capacity(nl);
        for li in 0..nl {
            let si = self.blocks[bi].lin_slot[li];
            let w = sh.wsh[si]
                .as_ref()
                .ok_or_else(|| Error::Shape(format!("{}: no bf16 shard", self.slots[si].name)))?;
            let mut amax: CudaSlice<u32> = gpu.alloc_zeros(1, "amax")?;
            let mut bad: CudaSlice<u32> = gpu.alloc_zeros(1, "flag")?;
            gpu.launch_amax(w, &mut amax, &mut bad)?;
            gpu.stream
                .memcpy_dtod(&amax, &mut amaxes.slice_mut(li..li + 1))?;
            flags.push(bad);
        }
        sh.comm.all_reduce(&mut amaxes, Reduce::Max)?;
        // Each shard cast with its tensor's global amax, row-wise copy only
        // (the gathered weight's column-wise copy is transposed locally below).
        let mut shards = Vec::with_capacity(nl);
        for (li, nonfinite) in flags.into_iter().enumerate() {
            let si = self.blocks[bi].lin_slot[li];
            let part = sh.parts[si];
            let k = self.blocks[bi].lin[li].k;
            let w = sh.wsh[si]
                .as_ref()
                .ok_or_else(|| Error::Shape(format!("{}: no bf16 shard", self.slots[si].name)))?;
            let amax = TensorAmax {
                amax_bits: gpu.stream.clone_dtod(&amaxes.slice(li..li + 1))?,
                nonfinite,
            };
            shards.push(gpu.quantize_tensorwise_rowwise_known(
                w,
                part.rows,
                k,
                octet_fp8::Format::E4M3,
                Some(amax),
            )?);
        }
        // The gathered row-wise codes: straight into the weight's buffer when
        // the ranks' shards tile it exactly, through a padded buffer otherwise.
        let world = sh.comm.world();
        let mut full: Vec<CudaSlice<u8>> = Vec::with_capacity(nl);
        for li in 0..nl {
            let part = sh.parts[self.blocks[bi].lin_slot[li]];
            // SAFETY: the all-gather writes every code.
            full.push(unsafe { gpu.alloc_uninit(world * part.numel(), "gathered FP8")? });
        }
        sh.comm.group(|| {
            for (shard, dst) in shards.iter().zip(full.iter_mut()) {
                sh.comm.all_gather(&shard.rowwise, dst)?;
            }
            Ok(())
        })?;
        for (li, (shard, gathered)) in shards.into_iter().zip(full).enumerate() {
            let (n, k) = (self.blocks[bi].lin[li].n, self.blocks[bi].lin[li].k);
            let rowwise = if gathered.len() == n * k {
                gathered
            } else {
                gpu.stream.clone_dtod(&gathered.slice(..n * k))?
            };
            let colwise = gpu.transpose_u8(&rowwise, n, k)?;
            self.blocks[bi].lin[li].set_gathered(DeviceFp8 {
                rows: n,
                cols: k,
                format: octet_fp8::Format::E4M3,
                rowwise,
                colwise,
                scale_inv: shard.scale_inv,
                amax_bits: shard.amax_bits,
                nonfinite: shard.nonfinite,
            })?;
        }
        Ok(())
    }

    /// AdamW on this rank's shards: gradients reduce-scattered (summed: each
    /// rank's loss is already scaled by the global token count), the global
    /// norm from every rank's shard (one f64 all-reduce), the update, then
    /// the compute copies gathered (block weights in bf16 here, or in FP8 at
    /// the next forward).
    pub(super) fn adamw_step_sharded(&mut self, p: AdamParams) -> Result<f32> {
        self.mark("other")?;
        let gpu = self.gpu;
        let mut sh = self
            .shard
            .take()
            .ok_or_else(|| Error::Shape("not sharded".into()))?;
        let r = self.adamw_sharded_inner(&mut sh, p);
        // Delayed scaling: each rank saw the amaxes of its own rows of the
        // batch; their maximum is what one rank would have seen over the whole
        // batch, so every rank rolls the same histories into the same scales.
        let mut pending: Vec<&mut CudaSlice<u32>> = self
            .blocks
            .iter_mut()
            .flat_map(|b| b.lin.iter_mut())
            .flat_map(|l| l.delayed_pending())
            .collect();
        if r.is_ok() && !pending.is_empty() {
            let mut all: CudaSlice<u32> = gpu.alloc_zeros(pending.len(), "delayed amaxes")?;
            for (i, p) in pending.iter().enumerate() {
                gpu.stream.memcpy_dtod(&**p, &mut all.slice_mut(i..i + 1))?;
            }
            sh.comm.all_reduce(&mut all, Reduce::Max)?;
            for (i, p) in pending.iter_mut().enumerate() {
                gpu.stream.memcpy_dtod(&all.slice(i..i + 1), *p)?;
            }
        }
        drop(pending);
        self.shard = Some(sh);
        let norm = r?;
        for blk in &mut self.blocks {
            for l in &mut blk.lin {
                l.update_scales(gpu)?;
            }
        }
        self.mark("adamw + collectives")?;
        Ok(norm)
    }

    pub(super) fn adamw_sharded_inner(
        &mut self,
        sh: &mut Sharding<'g>,
        p: AdamParams,
    ) -> Result<f32> {
        let gpu = self.gpu;
        let local = self.sum_squares(&sh.gshard)?;
        let norm = sh.comm.sum_f64(gpu, local)?.sqrt() as f32;
        let (clip, bc1, bc2) = self.begin_step(norm, &p)?;
        let s = &gpu.stream;
        for si in 0..self.slots.len() {
            let part = sh.parts[si];
            let wd = if self.slots[si].decay {
                p.weight_decay
            } else {
                0.0
            };
            let range = part.shard_off..part.shard_off + part.numel();
            let mut pm = self.master.slice_mut(range.clone());
            let g = sh.gshard.slice(range.clone());
            let mut mm = self.m.slice_mut(range.clone());
            let mut vm = self.v.slice_mut(range);
            launch_adamw(
                s,
                &self.f.adamw,
                (&mut pm, &g, &mut mm, &mut vm),
                (sh.wsh[si].as_mut(), &mut None),
                &p,
                wd,
                (bc1, bc2, clip),
            )?;
        }
        // The compute copies: f32 embedding and gains, bf16 head, bf16 block
        // weights unless they travel in FP8 at the next forward.
        for si in 0..self.slots.len() {
            let part = sh.parts[si];
            let numel = self.slots[si].numel;
            if let Some(off) = sh.rep_off[si] {
                let send = self
                    .master
                    .slice(part.shard_off..part.shard_off + part.numel());
                gather_part(gpu, sh.comm, &send, &mut sh.rep.slice_mut(off..off + numel))?;
            }
            let Some(w) = sh.wsh[si].as_ref() else {
                continue;
            };
            if si == self.head_slot {
                gather_bf16(gpu, sh.comm, w, &mut self.head)?;
            } else if !sh.fp8 && !sh.reshard {
                let dst = self
                    .blocks
                    .iter_mut()
                    .flat_map(|b| b.lin.iter_mut().zip(b.lin_slot))
                    .find(|(_, s)| *s == si)
                    .map(|(l, _)| l)
                    .ok_or_else(|| Error::Shape(format!("slot {si} has no layer")))?;
                gather_bf16(gpu, sh.comm, w, &mut dst.weight)?;
            }
        }
        Ok(norm)
    }

    /// A flat f32 buffer (masters, moments, gradients) on the host, one
    /// vector per parameter: sharded, gathered parameter by parameter from
    /// the shards (a collective: every rank calls it).
    pub(super) fn per_slot(&self, buf: &CudaSlice<f32>) -> Result<Vec<Vec<f32>>> {
        let Some(sh) = &self.shard else {
            let host = self.gpu.download(buf)?;
            return Ok(self
                .slots
                .iter()
                .map(|s| host[s.offset..s.offset + s.numel].to_vec())
                .collect());
        };
        let world = sh.comm.world();
        let mut out = Vec::with_capacity(self.slots.len());
        for (sl, part) in self.slots.iter().zip(&sh.parts) {
            let mut tmp: CudaSlice<f32> = self
                .gpu
                .alloc_zeros(world * part.numel(), "gather buffer")?;
            sh.comm.all_gather(
                &buf.slice(part.shard_off..part.shard_off + part.numel()),
                &mut tmp,
            )?;
            let mut v = self.gpu.download(&tmp)?;
            v.truncate(sl.numel);
            out.push(v);
        }
        Ok(out)
    }

    /// Sharded: reduce-scatter the finished gradients of parameters `ids`
    /// (summed over the ranks), add them to this rank's shards, and zero
    /// their full gradients (the region the next block reuses).
    pub(super) fn flush_grads(&mut self, ids: &[usize]) -> Result<()> {
        let gpu = self.gpu;
        let Some(sh) = self.shard.as_mut() else {
            return Ok(());
        };
        let world = sh.comm.world();
        let total: usize = ids.iter().map(|&i| sh.parts[i].numel()).sum();
        if sh.bf16_grads {
            return self.flush_grads_bf16(ids, total);
        }
        // SAFETY: the reduce-scatters write every element.
        let mut tmp: CudaSlice<f32> = unsafe { gpu.alloc_uninit(total, "gradient shards")? };
        let grad = &self.grad;
        let slots = &self.slots;
        let (comm, parts) = (sh.comm, &sh.parts);
        comm.group(|| {
            let mut o = 0;
            for &i in ids {
                let n = parts[i].numel();
                let send = grad.slice(slots[i].offset..slots[i].offset + world * n);
                comm.reduce_scatter(&send, &mut tmp.slice_mut(o..o + n), Reduce::Sum)?;
                o += n;
            }
            Ok(())
        })?;
        accumulate_shards(gpu, &self.f.add, &mut sh.gshard, &sh.parts, ids, &tmp)?;
        for &i in ids {
            let off = self.slots[i].offset;
            let n = world * sh.parts[i].numel();
            gpu.stream
                .memset_zeros(&mut self.grad.slice_mut(off..off + n))?;
        }
        Ok(())
    }

    /// [`GpuLlama::flush_grads`] with bf16 on the wire.
    pub(super) fn flush_grads_bf16(&mut self, ids: &[usize], total: usize) -> Result<()> {
        let gpu = self.gpu;
        let Some(sh) = self.shard.as_mut() else {
            return Ok(());
        };
        let world = sh.comm.world();
        let full: usize = world * total;
        // SAFETY: `to_bf16` writes every element of `send`; the reduce-scatters every one of `tmp`.
        let mut send: CudaSlice<u16> = unsafe { gpu.alloc_uninit(full, "bf16 gradients")? };
        let mut tmp: CudaSlice<u16> = unsafe { gpu.alloc_uninit(total, "gradient shards")? };
        let mut o = 0;
        for &i in ids {
            let n = world * sh.parts[i].numel();
            let off = self.slots[i].offset;
            let src = self.grad.slice(off..off + n);
            let mut dst = send.slice_mut(o..o + n);
            let null: u64 = 0;
            unsafe {
                gpu.stream
                    .launch_builder(&self.f.to_bf16)
                    .arg(&src)
                    .arg(&mut dst)
                    .arg(&n)
                    .arg(&null)
                    .arg(&null)
                    .launch(grid_stride(n))?;
            }
            gpu.stream
                .memset_zeros(&mut self.grad.slice_mut(off..off + n))?;
            o += n;
        }
        let (comm, parts) = (sh.comm, &sh.parts);
        // SAFETY: bf16 and u16 have the same size; NCCL reads and writes bf16 values.
        let (send16, tmp16) = unsafe {
            (
                send.transmute::<half::bf16>(full),
                tmp.transmute_mut::<half::bf16>(total),
            )
        };
        let (Some(send16), Some(mut tmp16)) = (send16, tmp16) else {
            return Err(Error::Shape("bf16 view of the gradients".into()));
        };
        comm.group(|| {
            let (mut o, mut t) = (0, 0);
            for &i in ids {
                let n = parts[i].numel();
                let s = send16.slice(o..o + world * n);
                comm.reduce_scatter(&s, &mut tmp16.slice_mut(t..t + n), Reduce::Sum)?;
                o += world * n;
                t += n;
            }
            Ok(())
        })?;
        accumulate_shards(gpu, &self.f.add_bf16, &mut sh.gshard, &sh.parts, ids, &tmp)
    }

    /// Bytes and calls this rank handed to NCCL so far (zero when not sharded).
    pub fn comm_stats(&self) -> crate::nccl::NcclStats {
        self.shard
            .as_ref()
            .map(|sh| sh.comm.stats())
            .unwrap_or_default()
    }
}

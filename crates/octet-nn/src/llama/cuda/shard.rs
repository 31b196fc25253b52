//! Sharded data parallel (FSDP-style) for [`GpuLlama`]: how the parameters
//! are split over the ranks, the all-gathers of the block weights (bf16, or
//! FP8 with one global scale per tensor), the reduce-scatters of the
//! gradients, and AdamW on this rank's shards.

use super::*;
use octet_cuda::block2d::DeviceBlock2dFp8;
use octet_cuda::nccl::InFlight;

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
/// zero).
///
/// Block weights are gathered block by block, on the communicator's stream,
/// one block ahead of the compute: block `i + 1`'s all-gather runs while
/// block `i` computes (and block `i - 1`'s while block `i` runs backward,
/// when resharding). bf16 weights are kept from a block's forward to its
/// backward (or freed after the forward when resharding) and freed after the
/// backward. Under per-tensor recipes with an FP8 backward (tensorwise, delayed)
/// they travel as FP8 instead, with one scale per tensor (tensorwise: each
/// rank's amax, then the maximum over the ranks; delayed: the layer's scale
/// from its amax history): the bytes every rank holds are exactly those one
/// rank would quantize from the whole weight. After AdamW the other compute
/// copies are gathered: the bf16 LM head, the f32 embedding and norm gains
/// (`rep`).
///
/// Gradients are computed in full for one block at a time, in two regions
/// of `grad` that even and odd blocks take in turn (each parameter padded to
/// `world` shards, rank-major): as soon as backward finishes a block, one
/// grouped reduce-scatter of its gradients starts on the communicator's
/// stream while the next block runs backward; once it is done this rank's
/// shards are added to `gshard` and the region is zeroed, before the block
/// after next writes it (the embedding, final norm and head have their own
/// region, flushed at the end).
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
    /// Where FP8-gathered weights take their scales from.
    scales: GatherScales,
    /// Gradients are reduce-scattered in bf16 (half the bytes), else f32.
    bf16_grads: bool,
    /// Block weights are gathered for each block's forward and again for its
    /// backward, and freed in between (FSDP's `reshard_after_forward`).
    pub(super) reshard: bool,
    /// bf16 gathers: whether a block's full weights are on this rank now.
    held: Vec<bool>,
    /// FP8 gathers: the block weights' global amaxes until the next AdamW step.
    weight_amax: Option<WeightAmax>,
}

impl Sharding<'_> {
    /// This rank's bf16 shard of parameter `si` (`name`).
    fn bf16_shard(&self, si: usize, name: &str) -> Result<&CudaSlice<u16>> {
        self.wsh[si]
            .as_ref()
            .ok_or_else(|| Error::Shape(format!("{name}: no bf16 shard")))
    }

    /// bf16 gathers: free block `bi`'s (`blk`'s) full weights if it holds them.
    fn release_bf16(&mut self, gpu: &Gpu, bi: usize, blk: &mut Block) -> Result<()> {
        if self.fp8 || !self.held[bi] {
            return Ok(());
        }
        for l in &mut blk.lin {
            l.weight = gpu.alloc_zeros(1, "placeholder")?;
        }
        self.held[bi] = false;
        Ok(())
    }
}

/// Where the scales of FP8-gathered block weights come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum GatherScales {
    /// Current per-tensor scaling (tensorwise): each weight's amax, the
    /// maximum over the ranks.
    Amax,
    /// Delayed scaling: the layer's weight scale from its amax history (the
    /// same on every rank; no amax needed before the cast).
    History,
    /// 128x128 blocks (blockwise): each block's own amax. Every rank's shard
    /// is a whole number of block rows, so no block spans two ranks.
    Blocks,
}

/// The amaxes of the block weights over all ranks (FP8 gathers).
pub(super) struct WeightAmax {
    /// f32 bits, one per parameter slot (zero for the others).
    bits: CudaSlice<u32>,
    /// This rank's non-finite flag per block weight slot.
    nonfinite: Vec<Option<CudaSlice<u32>>>,
}

/// Each block weight's local amax (`local`, per slot) reduced to the maximum
/// over the ranks (one all-reduce).
fn reduce_amaxes(gpu: &Gpu, comm: &NcclComm, local: Vec<Option<TensorAmax>>) -> Result<WeightAmax> {
    let mut bits: CudaSlice<u32> = gpu.alloc_zeros(local.len().max(1), "weight amaxes")?;
    let mut nonfinite = Vec::with_capacity(local.len());
    for (si, a) in local.into_iter().enumerate() {
        nonfinite.push(match a {
            Some(a) => {
                gpu.stream
                    .memcpy_dtod(&a.amax_bits, &mut bits.slice_mut(si..si + 1))?;
                Some(a.nonfinite)
            }
            None => None,
        });
    }
    comm.all_reduce(&mut bits, Reduce::Max)?;
    Ok(WeightAmax { bits, nonfinite })
}

/// A block's weights being all-gathered, with the buffers the gather reads and writes.
pub(super) type Gathering = InFlight<BlockGather>;

/// The buffers of one block's all-gather.
pub(super) enum BlockGather {
    /// Full bf16 weights (padded where the shards overhang).
    Bf16(Vec<CudaSlice<u16>>),
    /// This rank's FP8 shards (their codes are sent; their scales are the
    /// tensors') and the full row-wise codes (padded).
    Fp8 {
        shards: Vec<DeviceFp8>,
        full: Vec<CudaSlice<u8>>,
    },
    /// This rank's 128x128-block FP8 shards, and the full row-wise codes and
    /// scale grids (padded).
    Block2d {
        shards: Vec<DeviceBlock2dFp8>,
        codes: Vec<CudaSlice<u8>>,
        scales: Vec<CudaSlice<f32>>,
    },
}

/// The first `n` elements of a gathered buffer: itself when the ranks'
/// shards tile it exactly, a copy without the last rank's padding otherwise.
fn truncated<T: DeviceRepr>(gpu: &Gpu, full: CudaSlice<T>, n: usize) -> Result<CudaSlice<T>> {
    if full.len() == n {
        Ok(full)
    } else {
        Ok(gpu.stream.clone_dtod(&full.slice(..n))?)
    }
}

/// A block's gradients being reduce-scattered.
pub(super) struct Flush {
    /// The parameters.
    ids: Vec<usize>,
    /// Their full gradients are zeroed once the reduce-scatter is done (f32;
    /// the bf16 path zeroes them when it converts).
    zero: bool,
    run: InFlight<FlushBufs>,
}

/// The buffers of one reduce-scatter.
pub(super) enum FlushBufs {
    /// This rank's summed shards (the sends are the gradient regions).
    F32(CudaSlice<f32>),
    /// The bf16 copies sent and this rank's summed shards.
    Bf16 {
        send: CudaSlice<u16>,
        tmp: CudaSlice<u16>,
    },
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

/// Sharded data parallel (see `Sharding`).
impl<'g> GpuLlama<'g> {
    /// Split the parameters over the ranks of `comm`: this rank's shard of
    /// every parameter (masters, returned), the bf16 shards of the matrices,
    /// the full f32 copies of embedding and norm gains; `slots` get their
    /// offsets in the padded full-gradient layout (returned: its length).
    /// Under per-tensor E4M3 recipes with an FP8 backward (tensorwise,
    /// delayed) the block linears switch to weights gathered in FP8; the
    /// others gather bf16 weights at each forward (their full copies freed here).
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
        // Gradient layout: even and odd blocks take two regions in turn
        // (backward reduce-scatters a block's gradients once they are
        // complete, while the next block writes the other region); the
        // embedding, final norm and head follow, each padded to `world` shards.
        let block_ids = |i: usize| blocks[i].slots.ids();
        let mut off = 0;
        let mut regions = [Vec::new(), Vec::new()];
        for (r, region) in regions.iter_mut().enumerate().take(blocks.len()) {
            for j in block_ids(r) {
                region.push(off);
                off += world * parts[j].numel();
            }
        }
        for i in 0..blocks.len() {
            for (j, sid) in block_ids(i).enumerate() {
                if parts[sid].numel() != parts[1 + j].numel() {
                    return Err(Error::Shape(format!(
                        "block {i} differs in shape from block 0 ({})",
                        slots[sid].name
                    )));
                }
                slots[sid].offset = regions[i % 2][j];
            }
        }
        for (sid, sl) in slots.iter_mut().enumerate() {
            if sid == 0 || sid >= blocks.last().map_or(1, |b| b.slots.range.1) {
                sl.offset = off;
                off += world * parts[sid].numel();
            }
        }
        let full_off = off;
        // E4M3 weights whose column-wise copy is the row-wise one transposed
        // travel in FP8 when the backward reads FP8 weights: per-tensor scales,
        // and 128x128 blocks where each rank's shard is whole block rows.
        use octet_fp8::Scaling as S;
        let whole_block_rows = blocks
            .iter()
            .flat_map(|b| b.slots.lin)
            .all(|si| parts[si].rows % 128 == 0);
        let scales = recipe.and_then(|r| {
            let fp8_weights = r.backward() != octet_fp8::BackwardMode::HighPrecision
                && r.format(octet_fp8::Role::Weight) == octet_fp8::Format::E4M3;
            match r.scaling() {
                _ if !fp8_weights => None,
                S::Tensorwise {
                    power_of_two: false,
                } => Some(GatherScales::Amax),
                S::Delayed { .. } => Some(GatherScales::History),
                S::Blockwise {
                    power_of_two: false,
                } if whole_block_rows => Some(GatherScales::Blocks),
                _ => None,
            }
        });
        let fp8 = scales.is_some();
        for blk in blocks.iter_mut() {
            for l in &mut blk.lin {
                if fp8 {
                    l.use_external_weight(gpu)?;
                } else {
                    // Gathered for each block's forward.
                    l.weight = gpu.alloc_zeros(1, "placeholder")?;
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
            scales: scales.unwrap_or(GatherScales::Amax),
            bf16_grads: false,
            reshard: false,
            held: vec![false; blocks.len()],
            weight_amax: None,
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

    /// Whether block weights are all-gathered in FP8 (sharded, FP8 backward;
    /// tensorwise, delayed, or blockwise with whole 128-row blocks per shard).
    pub fn fp8_gather(&self) -> bool {
        self.shard.as_ref().is_some_and(|sh| sh.fp8)
    }

    /// FSDP's `reshard_after_forward`: each block's weights are gathered
    /// before its forward, freed after it, and gathered again before its
    /// backward (one more all-gather of the block weights per step), so that
    /// no rank holds more than two blocks' full weights at a time (the one
    /// computing and the one being gathered). Off, a block's gathered weights
    /// stay from its forward to its backward. Set between steps. Sharded only.
    pub fn set_reshard_after_forward(&mut self, on: bool) -> Result<()> {
        let Some(sh) = self.shard.as_mut() else {
            return Err(Error::Shape(
                "reshard after forward needs sharded parameters (--nproc)".into(),
            ));
        };
        sh.reshard = on;
        for bi in 0..self.blocks.len() {
            self.release_block_bf16(bi)?;
        }
        Ok(())
    }

    /// Whether block weights are resharded after forward.
    pub fn reshard_after_forward(&self) -> bool {
        self.shard.as_ref().is_some_and(|sh| sh.reshard)
    }

    /// Start gathering block `bi`'s weights for its forward, on the
    /// communicator's stream: FP8 every forward; bf16 unless the block holds
    /// them already. `None` when there is nothing to gather.
    pub(super) fn start_forward_gather(&mut self, bi: usize) -> Result<Option<Gathering>> {
        match &self.shard {
            Some(sh) if sh.fp8 => self.start_gather_fp8(bi).map(Some),
            Some(sh) if !sh.held[bi] => self.start_gather_bf16(bi).map(Some),
            _ => Ok(None),
        }
    }

    /// Start gathering block `bi`'s weights again for its backward, where
    /// they were freed after forward: resharding, or `recomputing` (the
    /// forward kept this block's input only, and backward runs its forward
    /// again first). bf16 ones are never held across an optimizer step
    /// either way.
    pub(super) fn start_backward_gather(
        &mut self,
        bi: usize,
        recomputing: bool,
    ) -> Result<Option<Gathering>> {
        match &self.shard {
            Some(sh) if sh.fp8 && (sh.reshard || recomputing) => {
                self.start_gather_fp8(bi).map(Some)
            }
            Some(sh) if !sh.fp8 && !sh.held[bi] => self.start_gather_bf16(bi).map(Some),
            _ => Ok(None),
        }
    }

    /// The compute stream waits for block `bi`'s gather and the layers take
    /// the weights: bf16 as their weights; FP8 with the column-wise copy
    /// transposed here (per-tensor scaling transposes locally), given to the
    /// next forward, or straight to the backward's `saved` layers.
    pub(super) fn finish_gather(
        &mut self,
        bi: usize,
        g: Gathering,
        saved: Option<&mut BlockProjSaved>,
    ) -> Result<()> {
        let gpu = self.gpu;
        match g.wait()? {
            BlockGather::Bf16(full) => {
                for (l, f) in self.blocks[bi].lin.iter_mut().zip(full) {
                    l.weight = truncated(gpu, f, l.n * l.k)?;
                }
                if let Some(sh) = self.shard.as_mut() {
                    sh.held[bi] = true;
                }
            }
            BlockGather::Fp8 { shards, full } => {
                for (li, (shard, gathered)) in shards.into_iter().zip(full).enumerate() {
                    let (n, k) = (self.blocks[bi].lin[li].n, self.blocks[bi].lin[li].k);
                    let rowwise = truncated(gpu, gathered, n * k)?;
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
            }
            BlockGather::Block2d {
                shards,
                codes,
                scales,
            } => {
                for (li, ((shard, c), sc)) in shards.into_iter().zip(codes).zip(scales).enumerate()
                {
                    let (n, k) = (self.blocks[bi].lin[li].n, self.blocks[bi].lin[li].k);
                    let (gr, gc) = (n.div_ceil(128), k.div_ceil(128));
                    let rowwise = truncated(gpu, c, n * k)?;
                    let row_scale_inv = truncated(gpu, sc, gr * gc)?;
                    let colwise = gpu.transpose_u8(&rowwise, n, k)?;
                    let mut col_scale_inv = gpu.alloc_zeros(gr * gc, "block scales")?;
                    gpu.transpose_f32(&row_scale_inv, gr, gc, &mut col_scale_inv)?;
                    self.blocks[bi].lin[li].set_gathered_block2d(DeviceBlock2dFp8 {
                        rows: n,
                        cols: k,
                        format: octet_fp8::Format::E4M3,
                        rowwise,
                        row_scale_inv,
                        colwise,
                        col_scale_inv,
                        nonfinite: shard.nonfinite,
                    })?;
                }
            }
        }
        // FP8: the backward's saved layers take the weights again.
        if let Some(saved) = saved.filter(|_| self.fp8_gather()) {
            for (li, ps) in saved.each_mut().into_iter().enumerate() {
                if let ProjSaved::Full(s) = ps {
                    self.blocks[bi].lin[li].reattach_gathered(gpu, s)?;
                }
            }
        }
        Ok(())
    }

    /// After block `bi`'s forward: resharding, or where the block's saved
    /// layers are not kept for a backward (`blocks_saved` false: an
    /// evaluation forward, or recomputation), the FP8 weights its saved
    /// layers keep dropped, or its bf16 weights freed.
    pub(super) fn after_block_forward(
        &mut self,
        bi: usize,
        saved: &mut BlockProjSaved,
        blocks_saved: bool,
    ) -> Result<()> {
        let Some(sh) = self.shard.as_ref() else {
            return Ok(());
        };
        if blocks_saved && !sh.reshard {
            return Ok(());
        }
        if sh.fp8 {
            for (li, ps) in saved.each_mut().into_iter().enumerate() {
                if let ProjSaved::Full(s) = ps {
                    self.blocks[bi].lin[li].release_saved_weight(s)?;
                }
            }
            Ok(())
        } else {
            self.release_block_bf16(bi)
        }
    }

    /// bf16 gathers: free block `bi`'s full weights (after its backward, or
    /// its forward when resharding or when no backward follows).
    pub(super) fn release_block_bf16(&mut self, bi: usize) -> Result<()> {
        match self.shard.as_mut() {
            Some(sh) => sh.release_bf16(self.gpu, bi, &mut self.blocks[bi]),
            None => Ok(()),
        }
    }

    /// Launch the all-gather of block `bi`'s bf16 weights (one NCCL group)
    /// into full buffers (padded where the ranks' shards overhang).
    fn start_gather_bf16(&mut self, bi: usize) -> Result<Gathering> {
        let gpu = self.gpu;
        let sh = self.sharding()?;
        let world = sh.comm.world();
        let mut sends = Vec::with_capacity(7);
        let mut full = Vec::with_capacity(7);
        for &si in &self.blocks[bi].slots.lin {
            let w = sh.bf16_shard(si, &self.slots[si].name)?;
            sends.push(w);
            // SAFETY: the all-gather writes every element.
            full.push(unsafe { gpu.alloc_uninit::<u16>(world * w.len(), "gathered bf16 weight")? });
        }
        let comm = sh.comm;
        comm.start(BlockGather::Bf16(full), |g| {
            let BlockGather::Bf16(full) = g else {
                return Err(Error::Shape("bf16 gather buffers".into()));
            };
            for (w, dst) in sends.iter().zip(full.iter_mut()) {
                let (ns, nd) = (w.len(), dst.len());
                // SAFETY: bf16 and u16 have the same size; the bits are only moved.
                let (s, d) = unsafe {
                    (
                        w.transmute::<half::bf16>(ns),
                        dst.transmute_mut::<half::bf16>(nd),
                    )
                };
                match (s, d) {
                    (Some(s), Some(mut d)) => comm.all_gather(&s, &mut d)?,
                    _ => return Err(Error::Shape("bf16 view of a gather buffer".into())),
                }
            }
            Ok(())
        })
    }

    /// Every block weight's amax over the ranks, for the FP8 gathers until
    /// the next AdamW step: each rank's bf16 shard's amax (AdamW records it
    /// as it writes the shard; measured here before the first step), then
    /// the maximum over the ranks, one all-reduce for the whole model.
    fn weight_amaxes(&mut self) -> Result<()> {
        let gpu = self.gpu;
        let Some(sh) = self.shard.as_mut() else {
            return Ok(());
        };
        if sh.weight_amax.is_some() {
            return Ok(());
        }
        let mut local = Vec::with_capacity(sh.wsh.len());
        for (si, w) in sh.wsh.iter().enumerate() {
            let is_block = self.blocks.iter().any(|b| b.slots.lin.contains(&si));
            local.push(match (w, is_block) {
                (Some(w), true) => {
                    let mut a = TensorAmax {
                        amax_bits: gpu.alloc_zeros(1, "amax")?,
                        nonfinite: gpu.alloc_zeros(1, "flag")?,
                    };
                    gpu.launch_amax(w, &mut a.amax_bits, &mut a.nonfinite)?;
                    Some(a)
                }
                _ => None,
            });
        }
        sh.weight_amax = Some(reduce_amaxes(gpu, sh.comm, local)?);
        Ok(())
    }

    /// Launch the FP8 all-gather of block `bi`'s seven weights: each rank's
    /// bf16 shard cast with its tensor's scales (see [`GatherScales`]), then
    /// the codes (and 128x128 scale grids) gathered in one NCCL group. The
    /// bytes every rank ends up with are the ones one rank would quantize
    /// from the whole weight. Delayed scaling records each shard's amax in
    /// the layer's state (AdamW takes the maximum over the ranks before the
    /// history rolls, so the history sees the whole weight's amax).
    fn start_gather_fp8(&mut self, bi: usize) -> Result<Gathering> {
        let scales = self.sharding()?.scales;
        if scales == GatherScales::Amax {
            self.weight_amaxes()?;
        }
        let gpu = self.gpu;
        let sh = self
            .shard
            .as_ref()
            .ok_or_else(|| Error::Shape("not sharded".into()))?;
        let world = sh.comm.world();
        let blk = &mut self.blocks[bi];
        let (mut tensor, mut block) = (Vec::new(), Vec::new());
        let (mut codes, mut grids) = (Vec::with_capacity(7), Vec::new());
        for (li, &si) in blk.slots.lin.iter().enumerate() {
            let name = &self.slots[si].name;
            let (part, l) = (sh.parts[si], &mut blk.lin[li]);
            let k = l.k;
            let w = sh.bf16_shard(si, name)?;
            let e4m3 = octet_fp8::Format::E4M3;
            match scales {
                GatherScales::Amax => {
                    let wa = sh
                        .weight_amax
                        .as_ref()
                        .ok_or_else(|| Error::Shape("block weight amaxes missing".into()))?;
                    let nonfinite = wa.nonfinite[si]
                        .as_ref()
                        .ok_or_else(|| Error::Shape(format!("{name}: no amax")))?;
                    let amax = TensorAmax {
                        amax_bits: gpu.stream.clone_dtod(&wa.bits.slice(si..si + 1))?,
                        nonfinite: gpu.stream.clone_dtod(nonfinite)?,
                    };
                    let q =
                        gpu.quantize_tensorwise_rowwise_known(w, part.rows, k, e4m3, Some(amax))?;
                    tensor.push(q);
                }
                GatherScales::History => {
                    let st = l
                        .weight_delayed_state()
                        .ok_or_else(|| Error::Shape(format!("{name}: no delayed-scaling state")))?;
                    let mut q = gpu.alloc_fp8(part.rows, k, e4m3)?;
                    gpu.quantize_given_scale_into(w, &st.scale, &mut q, false)?;
                    gpu.delayed_record(st, &q.amax_bits)?;
                    tensor.push(q);
                }
                GatherScales::Blocks => {
                    let mut q = gpu.alloc_block2d_fp8(part.rows, k, e4m3)?;
                    gpu.quantize_block128x128_into(w, &mut q, false)?;
                    // SAFETY: the all-gather writes every scale.
                    grids.push(unsafe {
                        gpu.alloc_uninit(world * q.row_scale_inv.len(), "gathered block scales")?
                    });
                    block.push(q);
                }
            }
            // SAFETY: the all-gather writes every code.
            codes.push(unsafe { gpu.alloc_uninit(world * part.numel(), "gathered FP8")? });
        }
        let comm = sh.comm;
        if scales != GatherScales::Blocks {
            let bufs = BlockGather::Fp8 {
                shards: tensor,
                full: codes,
            };
            return comm.start(bufs, |g| {
                let BlockGather::Fp8 { shards, full } = g else {
                    return Err(Error::Shape("FP8 gather buffers".into()));
                };
                for (shard, dst) in shards.iter().zip(full.iter_mut()) {
                    comm.all_gather(&shard.rowwise, dst)?;
                }
                Ok(())
            });
        }
        let bufs = BlockGather::Block2d {
            shards: block,
            codes,
            scales: grids,
        };
        comm.start(bufs, |g| {
            let BlockGather::Block2d {
                shards,
                codes,
                scales,
            } = g
            else {
                return Err(Error::Shape("block FP8 gather buffers".into()));
            };
            for ((shard, c), sc) in shards.iter().zip(codes.iter_mut()).zip(scales.iter_mut()) {
                comm.all_gather(&shard.rowwise, c)?;
                comm.all_gather(&shard.row_scale_inv, sc)?;
            }
            Ok(())
        })
    }

    /// The sharding state (an error when not sharded).
    fn sharding(&self) -> Result<&Sharding<'g>> {
        self.shard
            .as_ref()
            .ok_or_else(|| Error::Shape("not sharded".into()))
    }

    /// AdamW on this rank's shards: gradients reduce-scattered (summed: each
    /// rank's loss is already scaled by the global token count), the global
    /// norm from every rank's shard (one f64 all-reduce), the update, then
    /// the compute copies gathered (block weights at the next forward).
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
        // Block weights gathered in FP8: AdamW records each bf16 shard's amax
        // as it writes it, for the next gathers' global scales.
        let mut local = Vec::with_capacity(self.slots.len());
        // Stale after this step: bf16 weights still held (a forward whose
        // backward never ran).
        for (bi, blk) in self.blocks.iter_mut().enumerate() {
            sh.release_bf16(gpu, bi, blk)?;
        }
        for si in 0..self.slots.len() {
            let part = sh.parts[si];
            let is_block = self.blocks.iter().any(|b| b.slots.lin.contains(&si));
            let mut amax = if sh.fp8 && sh.scales == GatherScales::Amax && is_block {
                Some(TensorAmax {
                    amax_bits: gpu.alloc_zeros(1, "amax")?,
                    nonfinite: gpu.alloc_zeros(1, "flag")?,
                })
            } else {
                None
            };
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
                (sh.wsh[si].as_mut(), &mut amax, None),
                &p,
                wd,
                (bc1, bc2, clip),
            )?;
            local.push(amax);
        }
        sh.weight_amax = if sh.fp8 && sh.scales == GatherScales::Amax {
            Some(reduce_amaxes(gpu, sh.comm, local)?)
        } else {
            None
        };
        // The compute copies: f32 embedding and gains, bf16 head (block
        // weights are gathered at the next forward).
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
    /// (summed over the ranks) and add them to this rank's shards, waiting
    /// for it here ([`GpuLlama::start_flush`] and [`GpuLlama::finish_flush`]).
    pub(super) fn flush_grads(&mut self, ids: &[usize]) -> Result<()> {
        match self.start_flush(ids)? {
            Some(f) => self.finish_flush(f),
            None => Ok(()),
        }
    }

    /// Launch the reduce-scatter of the finished gradients of parameters
    /// `ids` on the communicator's stream (one NCCL group; in bf16, through a
    /// converted copy, the region is zeroed at once). The compute stream goes
    /// on; [`GpuLlama::finish_flush`] waits for it.
    pub(super) fn start_flush(&mut self, ids: &[usize]) -> Result<Option<Flush>> {
        let gpu = self.gpu;
        let Some(sh) = self.shard.as_mut() else {
            return Ok(None);
        };
        let world = sh.comm.world();
        let total: usize = ids.iter().map(|&i| sh.parts[i].numel()).sum();
        let comm = sh.comm;
        let parts = &sh.parts;
        let slots = &self.slots;
        if !sh.bf16_grads {
            // SAFETY: the reduce-scatters write every element.
            let tmp: CudaSlice<f32> = unsafe { gpu.alloc_uninit(total, "gradient shards")? };
            let grad = &self.grad;
            let run = comm.start(FlushBufs::F32(tmp), |b| {
                let FlushBufs::F32(tmp) = b else {
                    return Err(Error::Shape("f32 gradient buffers".into()));
                };
                let mut o = 0;
                for &i in ids {
                    let n = parts[i].numel();
                    let send = grad.slice(slots[i].offset..slots[i].offset + world * n);
                    comm.reduce_scatter(&send, &mut tmp.slice_mut(o..o + n), Reduce::Sum)?;
                    o += n;
                }
                Ok(())
            })?;
            return Ok(Some(Flush {
                ids: ids.to_vec(),
                zero: true,
                run,
            }));
        }
        // SAFETY: `to_bf16` writes every element of `send`; the reduce-scatters every one of `tmp`.
        let mut send: CudaSlice<u16> =
            unsafe { gpu.alloc_uninit(world * total, "bf16 gradients")? };
        let tmp: CudaSlice<u16> = unsafe { gpu.alloc_uninit(total, "gradient shards")? };
        let mut o = 0;
        for &i in ids {
            let n = world * parts[i].numel();
            let off = slots[i].offset;
            let src = self.grad.slice(off..off + n);
            let mut dst = send.slice_mut(o..o + n);
            let null: u64 = 0;
            // SAFETY: `to_bf16` (elementwise.cu) reads `n` f32 and writes `n` bf16 bits; no amax.
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
        let run = comm.start(FlushBufs::Bf16 { send, tmp }, |b| {
            let FlushBufs::Bf16 { send, tmp } = b else {
                return Err(Error::Shape("bf16 gradient buffers".into()));
            };
            // SAFETY: bf16 and u16 have the same size; NCCL reads and writes bf16 values.
            let (send16, tmp16) = unsafe {
                (
                    send.transmute::<half::bf16>(world * total),
                    tmp.transmute_mut::<half::bf16>(total),
                )
            };
            let (Some(send16), Some(mut tmp16)) = (send16, tmp16) else {
                return Err(Error::Shape("bf16 view of the gradients".into()));
            };
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
        Ok(Some(Flush {
            ids: ids.to_vec(),
            zero: false,
            run,
        }))
    }

    /// The compute stream waits for a reduce-scatter [`GpuLlama::start_flush`]
    /// launched, adds the shards to `gshard`, and zeroes the parameters' full
    /// gradients (the region a later block reuses) where that waited for it.
    pub(super) fn finish_flush(&mut self, f: Flush) -> Result<()> {
        let gpu = self.gpu;
        let Some(sh) = self.shard.as_mut() else {
            return Ok(());
        };
        let Flush { ids, zero, run } = f;
        match run.wait()? {
            FlushBufs::F32(tmp) => {
                accumulate_shards(gpu, &self.f.add, &mut sh.gshard, &sh.parts, &ids, &tmp)?
            }
            FlushBufs::Bf16 { tmp, .. } => {
                accumulate_shards(gpu, &self.f.add_bf16, &mut sh.gshard, &sh.parts, &ids, &tmp)?
            }
        }
        if zero {
            let world = sh.comm.world();
            for &i in &ids {
                let off = self.slots[i].offset;
                let n = world * sh.parts[i].numel();
                gpu.stream
                    .memset_zeros(&mut self.grad.slice_mut(off..off + n))?;
            }
        }
        Ok(())
    }

    /// Bytes and calls this rank handed to NCCL so far (zero when not sharded).
    pub fn comm_stats(&self) -> octet_cuda::nccl::NcclStats {
        self.shard
            .as_ref()
            .map(|sh| sh.comm.stats())
            .unwrap_or_default()
    }
}

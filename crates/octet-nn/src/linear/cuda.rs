//! The FP8 linear layer on the GPU: `y = x W^T` with its backward, the same
//! contract as `crate::Linear` (three GEMMs, a choice of backward, only
//! what backward needs kept), on device buffers: bf16 input, weight and
//! output gradient; bf16 output; f32 input and weight gradients.
//!
//! Recipes: current per-tensor (`tensorwise`), `rowwise` and `blockwise`
//! (1x128 activations and gradients, 128x128 weights), each with the
//! `quantized` backward (FP8 GEMMs from the column-wise copies, E5M2
//! gradients) or the `high_precision` backward (bf16 GEMMs from the saved
//! bf16 input); `None` is the bf16 layer. `mxfp8` runs emulated (exact
//! dequantize to bf16, bf16 GEMM): sm_90 has no MX tensor cores. `delayed`
//! keeps its amax histories on the device (`update_scales` once per step).
//! The `dequantized` backward multiplies the output gradient by the forward's
//! FP8 copies dequantized to bf16 (`code * scale_inv` rounded once to bf16;
//! the CPU reference keeps that product in f32). `nvfp4` runs emulated like
//! `mxfp8`, its stochastic rounding salted by the same call count as the CPU
//! `Linear`, so both draw the same bits.

use cudarc::driver::CudaSlice;
use octet_cuda::block2d::DeviceBlock2dFp8;
use octet_cuda::quantize::DeviceBlockFp8;
use octet_cuda::rowwise::DeviceRowwiseFp8;
use octet_cuda::{DeviceFp8, Error, GemmDst, GemmOut, Gpu, Result, TensorAmax};
use octet_fp8::{BackwardMode, Format, Recipe, Scaling};

/// Which scaling the layer runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Bf16,
    Tensorwise,
    Rowwise,
    Blockwise,
    /// MXFP8, emulated (dequantize to bf16, bf16 GEMM): no MX tensor cores on sm_90.
    Mxfp8,
    /// Per-tensor delayed scaling: scales from amax histories kept on the device.
    Delayed,
    /// NVFP4, emulated (dequantize to bf16, bf16 GEMM): no FP4 tensor cores on sm_90.
    Nvfp4,
}

/// An input or weight quantized by one of the recipes, both copies.
pub(crate) enum Quant {
    Tensor(DeviceFp8),
    Row(DeviceRowwiseFp8),
    /// 1x128 blocks, with the scale grids transposed into cuBLASLt's layout.
    Block1d(DeviceBlockFp8, CudaSlice<f32>, CudaSlice<f32>),
    Block2d(DeviceBlock2dFp8),
    Mx(octet_cuda::mx::DeviceMxFp8),
    Nv(octet_cuda::nvfp4::DeviceNvfp4),
}

impl Quant {
    fn bytes(&self) -> usize {
        match self {
            Quant::Tensor(q) => q.rowwise.len() + q.colwise.len() + 4,
            Quant::Row(q) => {
                q.rowwise.len()
                    + q.colwise.len()
                    + 4 * (q.row_scale_inv.len() + q.col_scale_inv.len())
            }
            Quant::Block1d(q, a, b) => q.rowwise.len() + q.colwise.len() + 4 * (a.len() + b.len()),
            Quant::Block2d(q) => {
                q.rowwise.len()
                    + q.colwise.len()
                    + 4 * (q.row_scale_inv.len() + q.col_scale_inv.len())
            }
            Quant::Nv(q) => {
                q.rowwise.packed.len()
                    + q.colwise.packed.len()
                    + q.rowwise.codes.len()
                    + q.colwise.codes.len()
                    + 4
            }
            Quant::Mx(q) => {
                q.rowwise.len() + q.colwise.len() + q.row_scales.len() + q.col_scales.len()
            }
        }
    }
}

impl Quant {
    /// Free the copy backward will not read (`keep_rowwise`: the dequantized
    /// backward reads the row-wise copy, the quantized one the column-wise
    /// copy), leaving a one-byte placeholder. Scales stay (they are small).
    /// NVFP4 keeps both (its emulated GEMMs read the unpacked codes).
    fn drop_copy(&mut self, gpu: &Gpu, keep_rowwise: bool) -> Result<()> {
        let slot = match self {
            Quant::Tensor(q) => Some((&mut q.rowwise, &mut q.colwise)),
            Quant::Row(q) => Some((&mut q.rowwise, &mut q.colwise)),
            Quant::Block1d(q, _, _) => Some((&mut q.rowwise, &mut q.colwise)),
            Quant::Block2d(q) => Some((&mut q.rowwise, &mut q.colwise)),
            Quant::Mx(q) => Some((&mut q.rowwise, &mut q.colwise)),
            Quant::Nv(_) => None,
        };
        if let Some((row, col)) = slot {
            let victim = if keep_rowwise { col } else { row };
            *victim = gpu.alloc_zeros(1, "placeholder")?;
        }
        Ok(())
    }
}

/// A layer input prepared once and shared by the layers that read it (q, k
/// and v read one normalized activation; gate and up another): the FP8 copies
/// under an FP8 recipe, the bf16 activation where backward or the bf16 layer
/// reads it. Cheap to clone (reference counted).
#[derive(Clone)]
pub struct LinearInput {
    m: usize,
    k: usize,
    x: Option<std::rc::Rc<CudaSlice<u16>>>,
    xq: Option<std::rc::Rc<std::cell::RefCell<Quant>>>,
    /// The FP8 copy the forward GEMMs read has been released.
    finished: bool,
    /// Telemetry counters of the input's quantization, when recorded.
    tele: Option<(std::rc::Rc<CudaSlice<u32>>, usize)>,
}

impl LinearInput {
    /// Rows.
    pub fn rows(&self) -> usize {
        self.m
    }
}

/// A linear layer on the GPU.
pub struct GpuLinear {
    /// Output features `N`.
    pub n: usize,
    /// Input features `K`.
    pub k: usize,
    /// Weight `(N, K)`, bf16 bits.
    pub weight: CudaSlice<u16>,
    kind: Kind,
    backward: BackwardMode,
    /// Delayed scaling: the states of input, weight and grad_output.
    states: Vec<octet_cuda::delayed::DeviceDelayed>,
    recipe: Option<Recipe>,
    /// Gradient quantizations so far: the salt of stochastic rounding, counted
    /// as the CPU `Linear` counts (forwards do not count, so a recomputed
    /// forward leaves the salts of the backward as they were).
    grad_calls: u64,
    /// Record numerics telemetry of each quantization (see [`GpuLinear::telemetry`]).
    pub telemetry_on: bool,
    /// Forwards record their amax into the delayed-scaling history (on by
    /// default). The model turns it off for an evaluation forward, so that
    /// validation batches do not set the scales of the training steps that
    /// follow (as the CPU `Linear::set_recording`). Backward always records.
    pub recording: bool,
    /// The forward's per-tensor FP8 product accumulates in the tensor cores'
    /// own precision (cuBLASLt's fast accumulation, the forward default of
    /// Transformer Engine and torchao); the gradients' products always
    /// promote to f32. True by default; other scalings ignore it.
    pub fast_accum: bool,
    /// Counters of the last recorded quantization per role: `[amax bits,
    /// saturated, underflowed]` and the element count.
    tele: [Option<(std::rc::Rc<CudaSlice<u32>>, usize)>; 3],
    /// The weight comes quantized from outside (sharded data parallel gathers
    /// it in FP8): no bf16 weight is kept; each forward takes [`GpuLinear::set_gathered`]'s.
    external: bool,
    /// The FP8 weight the next forward reads (when `external`).
    gathered: Option<Quant>,
    /// The amax of `weight` as the optimizer just wrote it (see
    /// [`GpuLinear::set_weight_amax`]); the next weight quantization takes it.
    weight_amax: Option<TensorAmax>,
}

/// What [`GpuLinear::forward`] keeps for backward.
pub struct GpuLinearSaved {
    m: usize,
    /// The bf16 input (bf16 layer, `high_precision` backward), maybe shared.
    x: Option<std::rc::Rc<CudaSlice<u16>>>,
    /// The FP8 input (maybe shared) and weight: after the forward, only the
    /// copy backward reads (column-wise for `quantized`, row-wise for `dequantized`).
    xq: Option<std::rc::Rc<std::cell::RefCell<Quant>>>,
    wq: Option<Quant>,
    /// Backward dequantizes `xq` and `wq` (row-wise copies) instead of quantizing `dy`.
    dequantized: bool,
}

impl GpuLinearSaved {
    /// The saved input when it is a per-tensor E4M3 row-wise copy (the
    /// `dequantized` backward of the tensorwise and delayed recipes), shared.
    pub(crate) fn rowwise_e4m3(&self) -> Option<std::rc::Rc<std::cell::RefCell<Quant>>> {
        let q = self.xq.as_ref()?;
        let whole = match &*q.borrow() {
            Quant::Tensor(d) => d.format == Format::E4M3 && d.rowwise.len() == d.rows * d.cols,
            _ => false,
        };
        (self.dequantized && whole).then(|| q.clone())
    }

    /// Device bytes kept alive for backward (a shared input counted in full).
    pub fn bytes(&self) -> usize {
        self.bytes_unique(&mut std::collections::HashSet::new())
    }

    /// Bytes kept, counting an input shared with layers already in `seen` once.
    pub fn bytes_unique(&self, seen: &mut std::collections::HashSet<usize>) -> usize {
        let mut total = self.wq.as_ref().map_or(0, Quant::bytes);
        if let Some(x) = &self.x {
            if seen.insert(std::rc::Rc::as_ptr(x) as usize) {
                total += 2 * x.len();
            }
        }
        if let Some(q) = &self.xq {
            if seen.insert(std::rc::Rc::as_ptr(q) as usize) {
                total += q.borrow().bytes();
            }
        }
        total
    }
}

impl GpuLinear {
    /// A layer over a bf16 weight `(n, k)` with `recipe` (`None`: bf16).
    pub fn new(
        gpu: &Gpu,
        weight: CudaSlice<u16>,
        n: usize,
        k: usize,
        recipe: Option<Recipe>,
    ) -> Result<GpuLinear> {
        if weight.len() != n * k {
            return Err(Error::Shape(format!(
                "weight of {} elements is not ({n}, {k})",
                weight.len()
            )));
        }
        let (kind, backward) = match recipe {
            None => (Kind::Bf16, BackwardMode::HighPrecision),
            Some(r) => {
                let kind = match r.scaling() {
                    Scaling::Tensorwise { power_of_two: false } => Kind::Tensorwise,
                    Scaling::Rowwise { power_of_two: false } => Kind::Rowwise,
                    Scaling::Blockwise { power_of_two: false } => Kind::Blockwise,
                    Scaling::Mxfp8 => Kind::Mxfp8,
                    Scaling::Delayed { .. } => Kind::Delayed,
                    Scaling::Nvfp4 => Kind::Nvfp4,
                    _ => {
                        return Err(Error::Shape(format!(
                            "recipe {r} runs on the CPU reference only so far (GPU: delayed, tensorwise, rowwise, blockwise, mxfp8 and nvfp4 emulated)"
                        )))
                    }
                };
                if r.backward() == BackwardMode::Dequantized && kind == Kind::Delayed {
                    return Err(Error::Shape(
                        "delayed scaling takes the quantized backward only".into(),
                    ));
                }
                if kind != Kind::Nvfp4
                    && (r.format(octet_fp8::Role::Input) != Format::E4M3
                        || r.format(octet_fp8::Role::GradOutput) != Format::E5M2)
                {
                    return Err(Error::Shape(format!(
                        "recipe {r}: the GPU layer takes E4M3 forward and E5M2 gradients"
                    )));
                }
                (kind, r.backward())
            }
        };
        let mut states = Vec::new();
        if let (Kind::Delayed, Some(r)) = (kind, recipe) {
            if let Scaling::Delayed {
                history_len,
                algo,
                margin,
            } = r.scaling()
            {
                for role in octet_fp8::Role::ALL {
                    states.push(gpu.delayed_state(history_len, algo, margin, r.format(role))?);
                }
            }
        }
        Ok(GpuLinear {
            n,
            k,
            weight,
            kind,
            backward,
            states,
            recipe,
            grad_calls: 0,
            telemetry_on: false,
            recording: true,
            fast_accum: true,
            tele: [None, None, None],
            external: false,
            weight_amax: None,
            gathered: None,
        })
    }

    /// From now on the weight comes quantized from outside, one
    /// [`GpuLinear::set_gathered`] per forward (sharded data parallel: the
    /// FP8 weight gathered from the ranks' shards); the bf16 weight is
    /// freed. Only E4M3 weights whose column-wise copy is the row-wise one
    /// transposed, with an FP8 backward, take it: per-tensor scales
    /// (tensorwise with the `quantized` or `dequantized` backward, delayed;
    /// [`GpuLinear::set_gathered`]) and 128x128 blocks (blockwise;
    /// [`GpuLinear::set_gathered_block2d`]). The others read a bf16 weight.
    /// Delayed scaling: whoever quantizes the weight casts with
    /// the weight state's scale (`weight_delayed_state`) and records its amax there.
    pub fn use_external_weight(&mut self, gpu: &Gpu) -> Result<()> {
        let transposable = matches!(
            self.kind,
            Kind::Tensorwise | Kind::Delayed | Kind::Blockwise
        );
        let e4m3 = self
            .recipe
            .is_some_and(|r| r.format(octet_fp8::Role::Weight) == Format::E4M3);
        if !transposable || !e4m3 || self.backward == BackwardMode::HighPrecision {
            return Err(Error::Shape(format!(
                "an FP8 weight from outside needs E4M3 weights scaled per tensor or in 128x128 blocks (tensorwise, delayed, blockwise) with a quantized or dequantized backward, not {:?}",
                self.recipe.map(|r| r.to_string())
            )));
        }
        self.external = true;
        self.weight = gpu.alloc_zeros(1, "placeholder")?;
        Ok(())
    }

    /// Delayed scaling: the weight's state (its scale to cast with, the
    /// step's amax to record into); `None` for other recipes.
    pub(crate) fn weight_delayed_state(
        &mut self,
    ) -> Option<&mut octet_cuda::delayed::DeviceDelayed> {
        match self.kind {
            Kind::Delayed => self.states.get_mut(1),
            _ => None,
        }
    }

    /// Whether the weight comes quantized from outside ([`GpuLinear::use_external_weight`]).
    pub fn external_weight(&self) -> bool {
        self.external
    }

    /// The FP8 weight `(N, K)` (both copies, one per-tensor scale) the next
    /// forward reads (tensorwise, delayed).
    pub fn set_gathered(&mut self, q: DeviceFp8) -> Result<()> {
        let per_tensor = matches!(self.kind, Kind::Tensorwise | Kind::Delayed);
        self.check_gathered(per_tensor, (q.rows, q.cols, q.format))?;
        self.gathered = Some(Quant::Tensor(q));
        Ok(())
    }

    /// The FP8 weight `(N, K)` (both copies, 128x128 block scales) the next
    /// forward reads (blockwise).
    pub fn set_gathered_block2d(&mut self, q: DeviceBlock2dFp8) -> Result<()> {
        self.check_gathered(self.kind == Kind::Blockwise, (q.rows, q.cols, q.format))?;
        self.gathered = Some(Quant::Block2d(q));
        Ok(())
    }

    fn check_gathered(
        &self,
        kind_ok: bool,
        (rows, cols, format): (usize, usize, Format),
    ) -> Result<()> {
        if !self.external || !kind_ok || rows != self.n || cols != self.k || format != Format::E4M3
        {
            return Err(Error::Shape(format!(
                "gathered weight ({rows}, {cols}) {format} for a {:?} layer ({}, {}) taking external weights: {}",
                self.kind, self.n, self.k, self.external
            )));
        }
        Ok(())
    }

    /// Sharded, resharding after forward: drop the gathered FP8 weight that
    /// `saved` keeps for backward (the layer's only copy). Before backward,
    /// the model gathers the weight again and [`GpuLinear::reattach_gathered`]
    /// puts it back.
    pub fn release_saved_weight(&self, saved: &mut GpuLinearSaved) -> Result<()> {
        if !self.external {
            return Err(Error::Shape(
                "only a layer taking gathered FP8 weights releases its saved weight".into(),
            ));
        }
        saved.wq = None;
        Ok(())
    }

    /// Give `saved` the weight [`GpuLinear::set_gathered`] was given again
    /// after [`GpuLinear::release_saved_weight`]: the copy its backward reads,
    /// as the forward kept it (the same bytes, since the weight's shards did
    /// not change between forward and backward).
    pub fn reattach_gathered(&mut self, gpu: &Gpu, saved: &mut GpuLinearSaved) -> Result<()> {
        let mut wq = self.gathered.take().ok_or_else(|| {
            Error::Shape(format!(
                "layer ({}, {}): its FP8 weight was not gathered again before backward",
                self.n, self.k
            ))
        })?;
        wq.drop_copy(gpu, saved.dequantized)?;
        saved.wq = Some(wq);
        Ok(())
    }

    /// The rounding of one quantization in `role` (counting it when it is a
    /// gradient's): the recipe's (stochastic for NVFP4 gradients, salted by
    /// the count as the CPU `Linear` salts it), nearest-even for every other
    /// recipe.
    fn rounding(&mut self, role: usize) -> Result<octet_fp8::Rounding> {
        if role >= 2 {
            self.grad_calls += 1;
        }
        match (self.kind, self.recipe) {
            (Kind::Nvfp4, Some(r)) => {
                let role = octet_fp8::Role::ALL[role.min(2)];
                Ok(
                    r.spec(role, octet_fp8::Layout::Rowwise, None, self.grad_calls)?
                        .rounding,
                )
            }
            _ => Ok(octet_fp8::Rounding::NearestEven),
        }
    }

    /// The delayed-scaling states (input, weight, grad_output) on the host,
    /// as the CPU `Linear` keeps them; empty for other recipes.
    pub fn delayed_states(
        &self,
        gpu: &Gpu,
    ) -> Result<Vec<(octet_fp8::Role, octet_fp8::DelayedState)>> {
        octet_fp8::Role::ALL
            .into_iter()
            .zip(&self.states)
            .map(|(role, st)| Ok((role, gpu.delayed_export(st)?)))
            .collect()
    }

    /// Set the count of gradient quantizations so far, the salt of the next
    /// backward's stochastic rounding (as the CPU `Linear::set_grad_calls`).
    pub fn set_grad_calls(&mut self, n: u64) {
        self.grad_calls = n;
    }

    /// The count of gradient quantizations so far.
    pub fn grad_calls(&self) -> u64 {
        self.grad_calls
    }

    /// The delayed-scaling step amaxes so far (f32 bits on the device) of the
    /// input, weight and grad_output; none for other recipes. Sharded data
    /// parallel max-reduces them over the ranks before
    /// [`GpuLinear::update_scales`]: each rank saw its rows of the batch, and,
    /// with FP8 gathers, its shard of the weight.
    pub(crate) fn delayed_pending(&mut self) -> impl Iterator<Item = &mut CudaSlice<u32>> + '_ {
        self.states.iter_mut().map(|s| s.pending_mut())
    }

    /// Restore a delayed-scaling state of `role` (from a checkpoint of either
    /// device); an error for a layer without one or with another configuration.
    pub fn set_delayed_state(
        &mut self,
        gpu: &Gpu,
        role: octet_fp8::Role,
        state: &octet_fp8::DelayedState,
    ) -> Result<()> {
        let st = self.states.get_mut(role as usize).ok_or_else(|| {
            Error::Shape(format!(
                "this layer ({:?}) has no delayed-scaling state for {role:?}",
                self.recipe.map(|r| r.to_string())
            ))
        })?;
        gpu.delayed_import(st, state)
    }

    /// End of an optimizer step: roll the delayed-scaling histories on the
    /// device into the next scales (no-op for other recipes).
    pub fn update_scales(&mut self, gpu: &Gpu) -> Result<()> {
        for st in &mut self.states {
            gpu.delayed_update(st)?;
        }
        Ok(())
    }

    /// Quantize `x` in role `role` (0 input, 1 weight, 2 grad_output); delayed
    /// scaling reads and records the role's state in `states`.
    #[allow(clippy::too_many_arguments)]
    fn quantize(
        kind: Kind,
        states: &mut [octet_cuda::delayed::DeviceDelayed],
        gpu: &Gpu,
        x: &CudaSlice<u16>,
        rows: usize,
        cols: usize,
        format: Format,
        role: usize,
        rounding: octet_fp8::Rounding,
        known: Option<TensorAmax>,
        record: bool,
    ) -> Result<Quant> {
        let weight = role == 1;
        Ok(match kind {
            Kind::Nvfp4 => Quant::Nv(gpu.quantize_nvfp4(
                x,
                rows,
                cols,
                if weight { 16 } else { 1 },
                rounding,
            )?),
            Kind::Delayed => {
                let st = states
                    .get_mut(role)
                    .ok_or_else(|| Error::Shape("delayed scaling state missing".into()))?;
                let mut q = gpu.alloc_fp8(rows, cols, format)?;
                gpu.quantize_given_scale_into(x, &st.scale, &mut q, false)?;
                if record {
                    gpu.delayed_record(st, &q.amax_bits)?;
                }
                Quant::Tensor(q)
            }
            Kind::Tensorwise => Quant::Tensor(match known {
                Some(a) => gpu.quantize_tensorwise_known(x, rows, cols, format, a)?,
                None => gpu.quantize_tensorwise(x, rows, cols, format, false)?,
            }),
            Kind::Rowwise => {
                let mut q = gpu.alloc_rowwise_fp8(rows, cols, format)?;
                gpu.quantize_rowwise_into(x, &mut q, false)?;
                Quant::Row(q)
            }
            Kind::Blockwise if weight => {
                let mut q = gpu.alloc_block2d_fp8(rows, cols, format)?;
                gpu.quantize_block128x128_into(x, &mut q, false)?;
                Quant::Block2d(q)
            }
            Kind::Blockwise => {
                let mut q = gpu.alloc_block_fp8(rows, cols, format)?;
                gpu.quantize_block1x128_into(x, &mut q, false, false)?;
                let (rb, cb) = (cols.div_ceil(128), rows.div_ceil(128));
                let mut rs = gpu.alloc_zeros::<f32>(rows * rb, "scales")?;
                let mut cs = gpu.alloc_zeros::<f32>(cols * cb, "scales")?;
                gpu.transpose_f32(&q.row_scale_inv, rows, rb, &mut rs)?;
                gpu.transpose_f32(&q.col_scale_inv, cols, cb, &mut cs)?;
                Quant::Block1d(q, rs, cs)
            }
            Kind::Mxfp8 => Quant::Mx(gpu.quantize_mx(x, rows, cols, format)?),
            Kind::Bf16 => return Err(Error::Shape("the bf16 layer quantizes nothing".into())),
        })
    }

    /// One FP8 GEMM `d (m, n) = a (m, k) @ b (n, k)^T` from the row-wise
    /// (`false`) or column-wise (`true`) copies of two quantized operands.
    #[allow(clippy::too_many_arguments)]
    /// The product of two quantized operands (each row-wise or, with
    /// `*_col`, column-wise); `fast` asks per-tensor FP8 for fast accumulation.
    #[allow(clippy::too_many_arguments)]
    fn gemm<D: GemmOut>(
        gpu: &Gpu,
        a: &Quant,
        a_col: bool,
        b: &Quant,
        b_col: bool,
        d: &mut impl GemmDst<D>,
        mnk: (usize, usize, usize),
        fast: bool,
    ) -> Result<()> {
        match (a, b) {
            (Quant::Tensor(qa), Quant::Tensor(qb)) => {
                let oa = if a_col {
                    qa.colwise_operand()
                } else {
                    qa.rowwise_operand()
                };
                let ob = if b_col {
                    qb.colwise_operand()
                } else {
                    qb.rowwise_operand()
                };
                gpu.gemm_fp8(oa, ob, d, mnk, fast)
            }
            (Quant::Row(qa), Quant::Row(qb)) => {
                let pa = if a_col {
                    (&qa.colwise, qa.format, &qa.col_scale_inv)
                } else {
                    (&qa.rowwise, qa.format, &qa.row_scale_inv)
                };
                let pb = if b_col {
                    (&qb.colwise, qb.format, &qb.col_scale_inv)
                } else {
                    (&qb.rowwise, qb.format, &qb.row_scale_inv)
                };
                gpu.gemm_fp8_rowwise(pa, pb, d, mnk)
            }
            (Quant::Block1d(qa, ar, ac), b) => {
                let pa = if a_col {
                    (&qa.colwise, qa.format, ac, false)
                } else {
                    (&qa.rowwise, qa.format, ar, false)
                };
                let pb = match b {
                    Quant::Block2d(qb) if b_col => {
                        (&qb.colwise, qb.format, &qb.col_scale_inv, true)
                    }
                    Quant::Block2d(qb) => (&qb.rowwise, qb.format, &qb.row_scale_inv, true),
                    Quant::Block1d(qb, br, bc) if b_col => (&qb.colwise, qb.format, bc, false),
                    Quant::Block1d(qb, br, _) => (&qb.rowwise, qb.format, br, false),
                    _ => return Err(Error::Shape("mismatched operand scalings".into())),
                };
                gpu.gemm_fp8_block(pa, pb, d, mnk)
            }
            (Quant::Nv(qa), Quant::Nv(qb)) => {
                let pa = (
                    if a_col { &qa.colwise } else { &qa.rowwise },
                    qa.block_rows,
                    &qa.global,
                );
                let pb = (
                    if b_col { &qb.colwise } else { &qb.rowwise },
                    qb.block_rows,
                    &qb.global,
                );
                gpu.gemm_nvfp4_emulated(pa, pb, d, mnk)
            }
            (Quant::Mx(qa), Quant::Mx(qb)) => {
                let pa = if a_col {
                    (&qa.colwise, &qa.col_scales, qa.format)
                } else {
                    (&qa.rowwise, &qa.row_scales, qa.format)
                };
                let pb = if b_col {
                    (&qb.colwise, &qb.col_scales, qb.format)
                } else {
                    (&qb.rowwise, &qb.row_scales, qb.format)
                };
                gpu.gemm_mx_emulated(pa, pb, d, mnk)
            }
            _ => Err(Error::Shape("mismatched operand scalings".into())),
        }
    }

    /// Forward `y (m, N)` (bf16 bits) from `x (m, K)` (bf16 bits), with what backward needs.
    pub fn forward(
        &mut self,
        gpu: &Gpu,
        x: &CudaSlice<u16>,
        m: usize,
    ) -> Result<(CudaSlice<u16>, GpuLinearSaved)> {
        let x = std::rc::Rc::new(gpu.stream.clone_dtod(x)?);
        let mut out = forward_shared(std::slice::from_mut(self), gpu, x, None, m)?;
        out.pop()
            .ok_or_else(|| Error::Shape("no output from one layer".into()))
    }

    /// Whether this layer's quantization reads a producer's amax
    /// ([`GpuLinear::prepare`], [`GpuLinear::backward`]): current per-tensor
    /// scaling, whose amax pass it saves. Row-wise and block scales are local
    /// to a tile, delayed scaling uses the amax history.
    pub fn takes_amax(&self) -> bool {
        self.kind == Kind::Tensorwise
    }

    /// The amax of `weight` as the caller has just written it (the AdamW
    /// kernel computes it while writing the bf16 compute copy): the next
    /// forward's weight quantization uses it instead of an amax pass, once.
    /// Whoever writes `weight` another way must not call this.
    pub fn set_weight_amax(&mut self, amax: TensorAmax) {
        self.weight_amax = Some(amax);
    }

    /// Count the telemetry of quantizing `x` (role 0 input, 1 weight, 2
    /// grad_output) into `q`: amax, saturated and underflowed values, as the
    /// CPU quantizer counts them. Per-tensor recipes from `x` and the one
    /// scale (tensorwise: from the amax; delayed: the role's scale); per-row
    /// and per-block recipes from `x`, the row-wise codes and their scales
    /// (`block_telemetry` in quantize.cu).
    fn record(
        &self,
        gpu: &Gpu,
        role: usize,
        x: &CudaSlice<u16>,
        q: &Quant,
        format: Format,
    ) -> Result<(std::rc::Rc<CudaSlice<u32>>, usize)> {
        use cudarc::driver::{LaunchConfig, PushKernelArg};
        let mut out: CudaSlice<u32> = gpu.alloc_zeros(3, "telemetry")?;
        if !matches!(q, Quant::Tensor(_)) {
            self.record_blocks(gpu, x, q, format, &mut out)?;
            return Ok((std::rc::Rc::new(out), x.len()));
        }
        let n = x.len() as u64;
        let null: u64 = 0;
        let fmax = format.max();
        // A plain cast overflows past the midpoint between max and the next
        // step (E4M3: 464, the tie rounds to even 448; E5M2: 61440, the tie
        // rounds up to infinity); zero takes |v| up to half the smallest subnormal.
        let (sat_at, inclusive) = match format {
            Format::E5M2 => (61440.0f32, 1i32),
            _ => (464.0f32, 0i32),
        };
        let flush_at = format.min_subnormal() / 2.0;
        let cfg = LaunchConfig {
            grid_dim: (x.len().div_ceil(256 * 8).clamp(1, 1024) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let s = &gpu.stream;
        // SAFETY: argument types match `fp8_telemetry` in quantize.cu; `out`
        // holds the three counters; scale and amax pointers hold one value.
        unsafe {
            let mut lb = s.launch_builder(gpu.fp8_telemetry_kernel());
            lb.arg(x).arg(&n);
            match (self.kind, q) {
                (Kind::Delayed, _) => {
                    let st = self
                        .states
                        .get(role)
                        .ok_or_else(|| Error::Shape("delayed scaling state missing".into()))?;
                    lb.arg(&st.scale).arg(&null);
                }
                (Kind::Tensorwise, Quant::Tensor(t)) => {
                    lb.arg(&null).arg(&t.amax_bits);
                }
                _ => {
                    lb.arg(&null).arg(&null);
                }
            }
            lb.arg(&fmax)
                .arg(&sat_at)
                .arg(&inclusive)
                .arg(&flush_at)
                .arg(&mut out)
                .launch(cfg)?;
        }
        Ok((std::rc::Rc::new(out), x.len()))
    }

    /// [`GpuLinear::record`] for the per-row and per-block recipes.
    fn record_blocks(
        &self,
        gpu: &Gpu,
        x: &CudaSlice<u16>,
        q: &Quant,
        format: Format,
        out: &mut CudaSlice<u32>,
    ) -> Result<()> {
        use cudarc::driver::{LaunchConfig, PushKernelArg};
        // (mode, cols, codes, scale codes, block rows, NVFP4 global)
        let none: Option<&CudaSlice<u8>> = None;
        let (mode, cols, codes, scales, br, global) = match q {
            Quant::Tensor(_) => {
                return Err(Error::Shape(
                    "per-tensor telemetry goes through fp8_telemetry".into(),
                ))
            }
            Quant::Row(r) => (0i32, r.cols, &r.rowwise, none, 1, None),
            Quant::Block1d(b, ..) => (0, b.cols, &b.rowwise, none, 1, None),
            Quant::Block2d(b) => (0, b.cols, &b.rowwise, none, 1, None),
            Quant::Mx(m) => (1, m.cols, &m.rowwise, Some(&m.row_scales), 1, None),
            Quant::Nv(v) => (
                2,
                v.rowwise.cols,
                &v.rowwise.packed,
                Some(&v.rowwise.codes),
                v.block_rows,
                Some(&v.global),
            ),
        };
        if cols == 0 || !x.len().is_multiple_of(cols) {
            return Err(Error::Shape(format!(
                "telemetry: {} elements are not rows of {cols}",
                x.len()
            )));
        }
        let rows = x.len() / cols;
        let (ri, ci, bri) = (rows as i32, cols as i32, br as i32);
        // As in `record`: where a plain cast overflows (MXFP8 only, by the copy's format).
        let format = match q {
            Quant::Mx(m) => m.format,
            _ => format,
        };
        let (sat_at, inclusive) = match format {
            Format::E5M2 => (61440.0f32, 1i32),
            _ => (464.0f32, 0i32),
        };
        let null: u64 = 0;
        let cfg = LaunchConfig {
            grid_dim: (x.len().div_ceil(256 * 8).clamp(1, 1024) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: argument types match `block_telemetry` in quantize.cu; the
        // codes and scale grids are the row-wise copy of `x`'s quantization,
        // of the sizes the kernel indexes; `out` holds three counters.
        unsafe {
            let mut lb = gpu.stream.launch_builder(gpu.block_telemetry_kernel());
            lb.arg(x).arg(codes).arg(&ri).arg(&ci).arg(&mode);
            match scales {
                Some(sc) => lb.arg(sc),
                None => lb.arg(&null),
            };
            lb.arg(&bri);
            match global {
                Some(g) => lb.arg(g),
                None => lb.arg(&null),
            };
            lb.arg(&sat_at).arg(&inclusive).arg(out).launch(cfg)?;
        }
        Ok(())
    }

    /// Telemetry of the last recorded quantization of each role (input,
    /// weight, grad_output) since [`GpuLinear::telemetry_on`] was set:
    /// `(role, telemetry)`, for every recipe.
    pub fn telemetry(&self, gpu: &Gpu) -> Result<Vec<(octet_fp8::Role, octet_fp8::Telemetry)>> {
        let mut out = Vec::new();
        for (role, t) in octet_fp8::Role::ALL.into_iter().zip(&self.tele) {
            if let Some((buf, n)) = t {
                let c = gpu.download(buf)?;
                let share = |v: u32| v as f64 / (*n).max(1) as f64;
                out.push((
                    role,
                    octet_fp8::Telemetry {
                        amax: f32::from_bits(c[0]),
                        saturated: share(c[1]),
                        underflowed: share(c[2]),
                    },
                ));
            }
        }
        Ok(out)
    }

    /// Quantize the input `x (m, K)` under this layer's recipe, for
    /// [`GpuLinear::forward_input`] of this layer and of others with the same
    /// `K` and recipe (their input quantization would give the same bytes).
    /// `x` is shared, not copied: the handle is kept only where backward reads
    /// the bf16 activation (the bf16 layer, the `high_precision` backward).
    /// `x_amax`: the amax of `x` from the kernel that wrote it, which current
    /// per-tensor scaling then uses instead of an amax pass (see
    /// [`GpuLinear::takes_amax`]; other recipes ignore it).
    pub fn prepare(
        &mut self,
        gpu: &Gpu,
        x: std::rc::Rc<CudaSlice<u16>>,
        x_amax: Option<TensorAmax>,
        m: usize,
    ) -> Result<LinearInput> {
        let k = self.k;
        if x.len() != m * k || m == 0 {
            return Err(Error::Shape(format!(
                "input of {} elements is not ({m}, {k})",
                x.len()
            )));
        }
        if self.kind == Kind::Bf16 {
            return Ok(LinearInput {
                m,
                k,
                x: Some(x),
                xq: None,
                finished: false,
                tele: None,
            });
        }
        let rx = self.rounding(0)?;
        let xq = Self::quantize(
            self.kind,
            &mut self.states,
            gpu,
            &x,
            m,
            k,
            Format::E4M3,
            0,
            rx,
            x_amax,
            self.recording,
        )?;
        let tele = if self.telemetry_on {
            Some(self.record(gpu, 0, &x, &xq, Format::E4M3)?)
        } else {
            None
        };
        let keep_x = self.backward == BackwardMode::HighPrecision;
        Ok(LinearInput {
            m,
            k,
            x: keep_x.then_some(x),
            xq: Some(std::rc::Rc::new(std::cell::RefCell::new(xq))),
            finished: false,
            tele,
        })
    }

    /// After the last forward that reads `input`: free its FP8 copy that
    /// backward does not read (and the FP8 input altogether under the
    /// `high_precision` backward).
    pub fn finish_input(&self, gpu: &Gpu, input: &mut LinearInput) -> Result<()> {
        if input.finished {
            return Ok(());
        }
        input.finished = true;
        match self.backward {
            BackwardMode::HighPrecision => input.xq = None,
            mode => {
                if let Some(q) = &input.xq {
                    q.borrow_mut()
                        .drop_copy(gpu, mode == BackwardMode::Dequantized)?;
                }
            }
        }
        Ok(())
    }

    /// Forward `y (m, N)` from a prepared input ([`GpuLinear::prepare`], by
    /// this layer or another of the same recipe and `K`).
    pub fn forward_input(
        &mut self,
        gpu: &Gpu,
        input: &LinearInput,
    ) -> Result<(CudaSlice<u16>, GpuLinearSaved)> {
        let (y, saved) = self.forward_input_with(gpu, input, true)?;
        let y = y.ok_or_else(|| Error::Shape("forward gave no output".into()))?;
        Ok((y, saved))
    }

    /// [`GpuLinear::forward_input`], or with `output` false only what its
    /// backward reads (the weight quantized and kept as the forward keeps
    /// it, no product): a recomputed forward whose output nothing reads.
    pub fn forward_input_with(
        &mut self,
        gpu: &Gpu,
        input: &LinearInput,
        output: bool,
    ) -> Result<(Option<CudaSlice<u16>>, GpuLinearSaved)> {
        let (n, k, m) = (self.n, self.k, input.m);
        if input.k != k || input.finished {
            return Err(Error::Shape(format!(
                "prepared input of width {} (finished: {}) for a layer of width {k}",
                input.k, input.finished
            )));
        }
        let mut saved = GpuLinearSaved {
            m,
            x: None,
            xq: None,
            wq: None,
            dequantized: false,
        };
        // SAFETY: the GEMM writes every element of y.
        let mut y: Option<CudaSlice<u16>> = match output {
            true => Some(unsafe { gpu.alloc_uninit(m * n, "linear output")? }),
            false => None,
        };
        if self.kind == Kind::Bf16 {
            let x = input
                .x
                .as_ref()
                .ok_or_else(|| Error::Shape("bf16 input missing".into()))?;
            if let Some(y) = y.as_mut() {
                gpu.gemm_bf16(x.as_ref(), &self.weight, y, (m, n, k))?;
            }
            saved.x = Some(x.clone());
            return Ok((y, saved));
        }
        let xq = input.xq.as_ref().ok_or_else(|| {
            Error::Shape("FP8 input missing (prepared for the bf16 layer?)".into())
        })?;
        let rw = self.rounding(1)?;
        let mut wq = if self.external {
            self.gathered.take().ok_or_else(|| {
                Error::Shape(format!(
                    "layer ({n}, {k}): its FP8 weight was not gathered before the forward"
                ))
            })?
        } else {
            Self::quantize(
                self.kind,
                &mut self.states,
                gpu,
                &self.weight,
                n,
                k,
                Format::E4M3,
                1,
                rw,
                self.weight_amax.take(),
                self.recording,
            )?
        };
        if self.telemetry_on {
            self.tele[0] = input.tele.clone();
            // A gathered weight's bf16 values are on the ranks that own them.
            if !self.external {
                self.tele[1] = Some(self.record(gpu, 1, &self.weight, &wq, Format::E4M3)?);
            }
        }
        if let Some(y) = y.as_mut() {
            Self::gemm(
                gpu,
                &xq.borrow(),
                false,
                &wq,
                false,
                y,
                (m, n, k),
                self.fast_accum,
            )?;
        }
        match self.backward {
            BackwardMode::Quantized | BackwardMode::Dequantized => {
                let deq = self.backward == BackwardMode::Dequantized;
                wq.drop_copy(gpu, deq)?;
                saved.xq = Some(xq.clone());
                saved.wq = Some(wq);
                saved.dequantized = deq;
            }
            BackwardMode::HighPrecision => saved.x = input.x.clone(),
        }
        Ok((y, saved))
    }

    /// Backward from `dy (m, N)` (bf16 bits): returns `d_input (m, K)` in f32
    /// and writes `d_weight (N, K)` to `dw` (overwriting a buffer, or adding
    /// to an [`octet_cuda::AddTo`] such as the weight's slot of a gradient buffer).
    /// `dy_amax`: the amax of `dy` from the kernel that wrote it (as in
    /// [`GpuLinear::prepare`]).
    pub fn backward(
        &mut self,
        gpu: &Gpu,
        saved: GpuLinearSaved,
        dy: &CudaSlice<u16>,
        dy_amax: Option<TensorAmax>,
        dw: &mut impl GemmDst<f32>,
    ) -> Result<CudaSlice<f32>> {
        // SAFETY: the input-gradient GEMM writes every element (beta = 0).
        let mut dx: CudaSlice<f32> = unsafe { gpu.alloc_uninit(saved.m * self.k, "d_input")? };
        self.backward_into(gpu, saved, dy, dy_amax, &mut dx, dw)?;
        Ok(dx)
    }

    /// [`GpuLinear::backward`] with the input gradient written to `dx` (f32,
    /// or bf16 bits where its reader takes bf16): overwriting a buffer, or
    /// added to an [`octet_cuda::AddTo`] (the sum formed in f32 by the GEMM's
    /// epilogue, then rounded once). Projections that read one input (q, k
    /// and v; gate and up) add their input gradients this way into one
    /// buffer, in their order, instead of keeping one buffer each for the
    /// norm's backward to add.
    pub fn backward_into<D: GemmOut>(
        &mut self,
        gpu: &Gpu,
        saved: GpuLinearSaved,
        dy: &CudaSlice<u16>,
        dy_amax: Option<TensorAmax>,
        dx: &mut impl GemmDst<D>,
        dw: &mut impl GemmDst<f32>,
    ) -> Result<()> {
        let (m, n, k) = (saved.m, self.n, self.k);
        if dy.len() != m * n {
            return Err(Error::Shape(format!(
                "grad_output of {} elements is not ({m}, {n})",
                dy.len()
            )));
        }
        if dw.len() != n * k {
            return Err(Error::Shape(format!(
                "d_weight destination of {} elements for a ({n}, {k}) weight",
                dw.len()
            )));
        }
        if dx.len() != m * k {
            return Err(Error::Shape(format!(
                "d_input destination of {} elements for a ({m}, {k}) input",
                dx.len()
            )));
        }
        match (saved.x, saved.xq, saved.wq) {
            (_, Some(xq), Some(wq)) if saved.dequantized => {
                // grad_input = grad_output @ dequant(weight); grad_weight = grad_output^T @ dequant(input).
                let wd = dequant_rowwise(gpu, &wq, n, k)?;
                let xd = dequant_rowwise(gpu, &xq.borrow(), m, k)?;
                gpu.gemm_bf16_op((dy, false), (&wd, false), dx, (m, k, n))?;
                gpu.gemm_bf16_op((dy, true), (&xd, false), dw, (n, k, m))?;
            }
            (_, Some(xq), Some(wq)) => {
                let rg = self.rounding(2)?;
                let gq = Self::quantize(
                    self.kind,
                    &mut self.states,
                    gpu,
                    dy,
                    m,
                    n,
                    Format::E5M2,
                    2,
                    rg,
                    dy_amax,
                    true,
                )?;
                if self.telemetry_on {
                    self.tele[2] = Some(self.record(gpu, 2, dy, &gq, Format::E5M2)?);
                }
                // grad_input = grad_output @ weight; grad_weight = grad_output^T @ input.
                Self::gemm(gpu, &gq, false, &wq, true, dx, (m, k, n), false)?;
                Self::gemm(gpu, &gq, true, &xq.borrow(), true, dw, (n, k, m), false)?;
            }
            (Some(x), _, _) => {
                gpu.gemm_bf16_op((dy, false), (&self.weight, false), dx, (m, k, n))?;
                gpu.gemm_bf16_op((dy, true), (x.as_ref(), false), dw, (n, k, m))?;
            }
            _ => {
                return Err(Error::Shape(
                    "backward: the saved state lacks what the gradients need".into(),
                ))
            }
        }
        Ok(())
    }
}

/// Forward of `layers` that all read the input `x (m, K)`: one preparation
/// (one quantization under the first layer's recipe, which all share), each
/// layer's product, then only what backward reads kept. Outputs in order.
pub fn forward_shared(
    layers: &mut [GpuLinear],
    gpu: &Gpu,
    x: std::rc::Rc<CudaSlice<u16>>,
    x_amax: Option<TensorAmax>,
    m: usize,
) -> Result<Vec<(CudaSlice<u16>, GpuLinearSaved)>> {
    forward_shared_with(layers, gpu, (x, x_amax, m), true)?
        .into_iter()
        .map(|(y, s)| match y {
            Some(y) => Ok((y, s)),
            None => Err(Error::Shape("forward gave no output".into())),
        })
        .collect()
}

/// [`forward_shared`], or with `output` false only what the layers'
/// backward reads (see [`GpuLinear::forward_input_with`]).
#[allow(clippy::type_complexity)]
pub fn forward_shared_with(
    layers: &mut [GpuLinear],
    gpu: &Gpu,
    (x, x_amax, m): (std::rc::Rc<CudaSlice<u16>>, Option<TensorAmax>, usize),
    output: bool,
) -> Result<Vec<(Option<CudaSlice<u16>>, GpuLinearSaved)>> {
    let (first, rest) = layers
        .split_first_mut()
        .ok_or_else(|| Error::Shape("forward_shared of no layers".into()))?;
    if let Some(l) = rest
        .iter()
        .find(|l| l.k != first.k || l.kind != first.kind || l.backward != first.backward)
    {
        return Err(Error::Shape(format!(
            "layers sharing an input differ: K {} / {}, {:?} / {:?}",
            first.k, l.k, first.recipe, l.recipe
        )));
    }
    let mut input = first.prepare(gpu, x, x_amax, m)?;
    let mut out = Vec::with_capacity(rest.len() + 1);
    out.push(first.forward_input_with(gpu, &input, output)?);
    for l in rest.iter_mut() {
        out.push(l.forward_input_with(gpu, &input, output)?);
    }
    first.finish_input(gpu, &mut input)?;
    Ok(out)
}

/// The row-wise copy of `q` (`rows x cols`) dequantized to bf16.
fn dequant_rowwise(gpu: &Gpu, q: &Quant, rows: usize, cols: usize) -> Result<CudaSlice<u16>> {
    match q {
        Quant::Tensor(t) => gpu.dequant_bf16(
            &t.rowwise,
            &t.scale_inv,
            (rows, cols),
            (rows, cols),
            t.format,
        ),
        Quant::Row(t) => gpu.dequant_bf16(
            &t.rowwise,
            &t.row_scale_inv,
            (rows, cols),
            (1, cols),
            t.format,
        ),
        Quant::Block1d(t, _, _) => gpu.dequant_bf16(
            &t.rowwise,
            &t.row_scale_inv,
            (rows, cols),
            (1, 128),
            t.format,
        ),
        Quant::Block2d(t) => gpu.dequant_bf16(
            &t.rowwise,
            &t.row_scale_inv,
            (rows, cols),
            (128, 128),
            t.format,
        ),
        Quant::Mx(t) => gpu.mx_dequant_bf16(&t.rowwise, &t.row_scales, rows, cols, t.format),
        Quant::Nv(t) => gpu.nv_dequant_bf16(&t.rowwise, t.block_rows, Some(&t.global)),
    }
}

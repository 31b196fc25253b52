//! LoRA on the GPU model: a frozen base (FP8 or bf16) whose targeted
//! projections carry trainable adapters.

use super::*;

/// LoRA mode.
impl<'g> GpuLlama<'g> {
    /// A model for LoRA fine-tuning: the base from named weights (Hugging
    /// Face names, any dtype, checked as [`GpuLlama::new`] checks them) is
    /// frozen, its block matrices stored as `spec.base` (FP8 quantized once
    /// here, one matrix at a time, by the CPU reference's `Base::new`, so the
    /// codes are those of the CPU `LoraLinear`), the embedding and norm gains
    /// in f32, the LM head in bf16. The targeted projections get adapters:
    /// `adapters` (PEFT names, as `octet_train::checkpoint::load_adapter`
    /// reads them) when given, else PEFT's initialisation with the seeds the
    /// CPU `Llama::into_lora` uses. Only the adapters train: the slots, the
    /// f32 masters, gradients and AdamW moments are theirs.
    pub fn new_lora(
        gpu: &'g Gpu,
        cfg: &LlamaConfig,
        weights: &HashMap<String, Tensor>,
        spec: &LoraSpec,
        adapters: Option<&HashMap<String, Tensor>>,
    ) -> Result<GpuLlama<'g>> {
        Self::new_lora_with(gpu, cfg, weights, spec, adapters, &mut HashMap::new())
    }

    /// [`GpuLlama::new_lora`] where a checkpoint stored some block matrices
    /// in FP8: those (by name, taken out of `as_stored`) become bases as stored,
    /// as the CPU's `Llama::into_lora_with` makes them
    /// (`crate::lora::Base::from_checkpoint`).
    pub fn new_lora_with(
        gpu: &'g Gpu,
        cfg: &LlamaConfig,
        weights: &HashMap<String, Tensor>,
        spec: &LoraSpec,
        adapters: Option<&HashMap<String, Tensor>>,
        as_stored: &mut HashMap<String, octet_tensor::mixed::Fp8Weight>,
    ) -> Result<GpuLlama<'g>> {
        cfg.validate().map_err(|e| Error::Shape(e.to_string()))?;
        check_config(cfg)?;
        let d = cfg.head_dim();
        if d > MAX_HEAD_DIM {
            return Err(Error::Shape(format!(
                "head_dim {d}: the GPU attention kernels take at most {MAX_HEAD_DIM}"
            )));
        }
        for t in &spec.targets {
            if !PROJ_NAMES.iter().any(|(short, _)| short == t) {
                return Err(Error::Shape(format!(
                    "LoRA target '{t}': expected some of q, k, v, o, gate, up, down"
                )));
            }
        }
        if spec.targets.is_empty() || spec.rank == 0 {
            return Err(Error::Shape(
                "LoRA needs at least one target and a rank of at least 1".into(),
            ));
        }
        crate::lora::check_dropout(spec.dropout).map_err(|e| Error::Shape(e.to_string()))?;
        if spec.recipe.scaling()
            != (octet_fp8::Scaling::Tensorwise {
                power_of_two: false,
            })
        {
            return Err(Error::Shape(format!(
                "GPU LoRA quantizes inputs and gradients with tensorwise current scaling; recipe {} runs LoRA on the CPU only",
                spec.recipe
            )));
        }
        let f = load_fns(gpu, d)?;
        let mut base_slots = Vec::new();
        let mut rep_host: Vec<f32> = Vec::new();
        let mut rep_off = Vec::new();
        let mut bases: Vec<Option<(GpuBase, usize, usize)>> = Vec::new();
        let mut head: Option<CudaSlice<u16>> = None;
        let mut remaining: HashMap<&str, &Tensor> =
            weights.iter().map(|(k, v)| (k.as_str(), v)).collect();
        let nl = cfg.num_hidden_layers;
        let to_bf16 = |t: &Tensor| -> Result<CudaSlice<u16>> {
            let b: Vec<half::bf16> = t
                .to_f32_vec()
                .iter()
                .map(|&x| half::bf16::from_f32(x))
                .collect();
            gpu.upload_bf16(&b)
        };
        let matrices: std::collections::HashSet<usize> = (0..nl)
            .map(|i| BlockSlots::of(cfg, i).map(|b| b.lin))
            .collect::<Result<Vec<_>>>()?
            .into_iter()
            .flatten()
            .collect();
        for (si, (name, shape)) in Llama::param_shapes(cfg).into_iter().enumerate() {
            // Block matrices; the LM head is last when untied.
            let in_block = matrices.contains(&si);
            let is_head = !cfg.tie_word_embeddings && si == final_norm_slot(cfg) + 1;
            // A block matrix kept as stored in FP8 may have no dense copy in
            // `weights` (`octet_train::checkpoint::load_base_fp8` makes none).
            let dense = remaining.remove(name.as_str());
            if let Some(t) = dense.filter(|t| t.shape() != shape.as_slice()) {
                return Err(Error::Shape(format!(
                    "tensor {name} has shape {:?}, expected {shape:?}",
                    t.shape()
                )));
            }
            let missing = || Error::Shape(format!("missing tensor {name}"));
            let mut stored = None;
            if in_block {
                let (n, k) = (shape[0], shape[1]);
                let b =
                    crate::lora::Base::from_checkpoint(&name, (n, k), dense, spec.base, as_stored)
                        .map_err(|e| Error::Shape(format!("{name}: {e}")))?;
                let gb = match b {
                    crate::lora::Base::Fp8(w) => GpuBase::Fp8(gpu.upload_fp8_weight(&w)?),
                    crate::lora::Base::Dense(w) => GpuBase::Bf16(to_bf16(&w)?),
                };
                stored = Some((gb, n, k));
                rep_off.push(None);
            } else if is_head {
                head = Some(to_bf16(dense.ok_or_else(missing)?)?);
                rep_off.push(None);
            } else {
                let t = dense.ok_or_else(missing)?;
                rep_off.push(Some(rep_host.len()));
                rep_host.extend(t.to_f32_vec());
                if si == 0 && cfg.tie_word_embeddings {
                    head = Some(to_bf16(t)?);
                }
            }
            bases.push(stored);
            base_slots.push(Slot {
                offset: 0,
                numel: shape.iter().product(),
                decay: shape.len() >= 2,
                name,
                shape,
            });
        }
        if cfg.tie_word_embeddings {
            remaining.remove("lm_head.weight");
        }
        if let Some(extra) = remaining.keys().next() {
            return Err(Error::Shape(format!(
                "unexpected tensor {extra} for this config"
            )));
        }
        // A stored FP8 block matrix that no parameter took (it has no dense
        // copy in `weights` to be caught above).
        if let Some(extra) = as_stored.keys().find(|n| n.ends_with("_proj.weight")) {
            return Err(Error::Shape(format!(
                "unexpected FP8 tensor {extra} for this config"
            )));
        }
        let head = head.ok_or_else(|| Error::Shape("no LM head".into()))?;
        // Adapters, in the order (and with the seeds) of the CPU `into_lora`.
        let mut given: Option<HashMap<&str, &Tensor>> =
            adapters.map(|a| a.iter().map(|(k, v)| (k.as_str(), v)).collect());
        let mut slots = Vec::new();
        let mut host = Vec::new();
        let mut blocks = Vec::with_capacity(nl);
        let mut seed = spec.seed;
        let scale = (spec.alpha / spec.rank as f64) as f32;
        for i in 0..nl {
            let bs = BlockSlots::of(cfg, i)?;
            let mut lora = Vec::with_capacity(7);
            let mut adapter_slots = [None; 7];
            for (li, &s) in bs.lin.iter().enumerate() {
                let (gb, n, k) = bases[s]
                    .take()
                    .ok_or_else(|| Error::Shape(format!("{}: no base", base_slots[s].name)))?;
                let (short, module) = PROJ_NAMES[li];
                let adapter = if spec.targets.iter().any(|t| t == short) {
                    seed += 1;
                    let prefix = format!("base_model.model.model.layers.{i}.{module}");
                    let init = crate::lora::Adapter::init(n, k, spec.rank, spec.alpha, seed)
                        .map_err(|e| Error::Shape(e.to_string()))?;
                    let mut pick =
                        |suffix: &str, fresh: &Tensor, shape: [usize; 2]| -> Result<Vec<f32>> {
                            let name = format!("{prefix}.{suffix}.weight");
                            let t = match given.as_mut() {
                                Some(g) => g.remove(name.as_str()).ok_or_else(|| {
                                    Error::Shape(format!("adapter: missing tensor {name}"))
                                })?,
                                None => fresh,
                            };
                            if t.shape() != shape {
                                return Err(Error::Shape(format!(
                                    "adapter tensor {name} has shape {:?}, expected {shape:?}",
                                    t.shape()
                                )));
                            }
                            let v = t.to_f32_vec();
                            slots.push(Slot {
                                offset: host.len(),
                                numel: v.len(),
                                decay: true,
                                name,
                                shape: shape.to_vec(),
                            });
                            host.extend_from_slice(&v);
                            Ok(v)
                        };
                    let a = pick("lora_A", &init.a, [spec.rank, k])?;
                    let b = pick("lora_B", &init.b, [n, spec.rank])?;
                    adapter_slots[li] = Some((slots.len() - 2, slots.len() - 1));
                    let bf = |v: &[f32]| -> Result<CudaSlice<u16>> {
                        let b: Vec<half::bf16> =
                            v.iter().map(|&x| half::bf16::from_f32(x)).collect();
                        gpu.upload_bf16(&b)
                    };
                    Some(GpuAdapter::new(gpu, bf(&a)?, bf(&b)?, spec.rank, scale)?)
                } else {
                    None
                };
                lora.push(GpuLoraLinear::new(
                    gb,
                    (n, k),
                    adapter,
                    spec.compute,
                    spec.recipe.backward(),
                )?);
            }
            blocks.push(Block {
                slots: bs,
                lin: Vec::new(),
                lora,
                adapter_slots,
            });
        }
        if let Some(extra) = given.as_ref().and_then(|g| g.keys().next()) {
            return Err(Error::Shape(format!(
                "adapter: unexpected tensor {extra} for targets {:?}",
                spec.targets
            )));
        }
        let (cos, sin) = rope_tables(gpu, cfg)?;
        let master = gpu.upload(&host)?;
        let norm_slot = final_norm_slot(cfg);
        Ok(GpuLlama {
            gpu,
            cfg: cfg.clone(),
            f,
            grad: gpu.alloc_zeros(master.len(), "adapter gradients")?,
            grad_unwritten: Vec::new(),
            m: gpu.alloc_zeros(master.len(), "AdamW first moments")?,
            v: gpu.alloc_zeros(master.len(), "AdamW second moments")?,
            master,
            slots,
            blocks,
            head,
            embed_slot: 0,
            norm_slot,
            head_slot: if cfg.tie_word_embeddings {
                0
            } else {
                norm_slot + 1
            },
            cos,
            sin,
            step: 0,
            check_layers: false,
            head_chunk: GPU_HEAD_CHUNK,
            ones: None,
            fuse_amax: true,
            saved_activations: SavedActivations::Full,
            recompute: 0,
            prof: Prof::from_env()?,
            shard: None,
            lora: Some(LoraMode {
                base_slots,
                rep: gpu.upload(&rep_host)?,
                rep_off,
                rank: spec.rank,
                alpha: spec.alpha,
                targets: PROJ_NAMES
                    .iter()
                    .filter(|(short, _)| spec.targets.iter().any(|t| t == short))
                    .map(|(_, m)| m.rsplit('.').next().unwrap_or(m).to_string())
                    .collect(),
                dropout: (spec.dropout > 0.0).then_some((spec.dropout, spec.seed)),
                dropout_round: 0,
                dropout_now: None,
            }),
        })
    }

    /// Names (PEFT's) and shapes of the adapter tensors [`GpuLlama::new_lora`]
    /// makes for `cfg` and `spec`, in slot order (what a checkpoint's
    /// optimizer state holds), without building the model.
    pub fn adapter_params(cfg: &LlamaConfig, spec: &LoraSpec) -> Vec<(String, Vec<usize>)> {
        let (c, f) = (cfg.hidden_size, cfg.intermediate_size);
        let kv = cfg.num_key_value_heads * cfg.head_dim();
        let dims = [(c, c), (kv, c), (kv, c), (c, c), (f, c), (f, c), (c, f)];
        let mut out = Vec::new();
        for i in 0..cfg.num_hidden_layers {
            for ((short, module), (n, k)) in PROJ_NAMES.iter().zip(dims) {
                if spec.targets.iter().any(|t| t == short) {
                    let prefix = format!("base_model.model.model.layers.{i}.{module}");
                    out.push((format!("{prefix}.lora_A.weight"), vec![spec.rank, k]));
                    out.push((format!("{prefix}.lora_B.weight"), vec![n, spec.rank]));
                }
            }
        }
        out
    }

    /// Whether the model is in LoRA mode ([`GpuLlama::new_lora`]).
    pub fn is_lora(&self) -> bool {
        self.lora.is_some()
    }

    /// Set which training forward comes next, for the LoRA dropout masks
    /// (as `crate::llama::Llama::set_dropout_round`: each training
    /// forward draws its round's masks, then counts one up; the CPU model
    /// at the same round draws the same masks).
    pub fn set_dropout_round(&mut self, round: u64) {
        if let Some(mode) = &mut self.lora {
            mode.dropout_round = round;
        }
    }

    /// Set which backward comes next, for the salts of stochastic rounding
    /// (NVFP4 gradients), as `crate::llama::Llama::set_grad_round`: every
    /// block linear counts its gradient quantizations, one a backward, and
    /// salts its rounding with the count; this sets each count to `round`.
    /// The trainer sets it every micro-step, so that a resumed run draws the
    /// bits an uninterrupted one draws, and ranks of sharded data parallel
    /// draw different ones. LoRA adapters round to nearest and count nothing.
    pub fn set_grad_round(&mut self, round: u64) {
        for blk in &mut self.blocks {
            for l in &mut blk.lin {
                l.set_grad_calls(round);
            }
        }
    }

    /// LoRA mode: rank, alpha and the targeted module names (`q_proj`, ...).
    pub fn lora_summary(&self) -> Option<(usize, f64, Vec<String>)> {
        self.lora
            .as_ref()
            .map(|lm| (lm.rank, lm.alpha, lm.targets.clone()))
    }

    /// LoRA mode: whether the `quantized` backward makes each output
    /// gradient's codes and its adapter's `du` in one read
    /// ([`GpuLoraLinear::fuse_cast_du`]; on by default).
    pub fn set_lora_fuse_cast_du(&mut self, on: bool) {
        for b in &mut self.blocks {
            for l in &mut b.lora {
                l.fuse_cast_du = on;
            }
        }
    }

    /// LoRA mode: whether the forward makes each input's E4M3 codes and its
    /// adapters' `u` in one read ([`GpuLoraLinear::fuse_cast_u`]; on by default).
    pub fn set_lora_fuse_cast_u(&mut self, on: bool) {
        for b in &mut self.blocks {
            for l in &mut b.lora {
                l.fuse_cast_u = on;
            }
        }
    }

    /// LoRA mode: whether every adapter's `B^T` copy is the transpose of its
    /// `B` (the copies AdamW writes; for the conformance suite).
    pub fn lora_transposes_match(&self) -> Result<bool> {
        for b in &self.blocks {
            for ad in b.lora.iter().filter_map(|l| l.adapter.as_ref()) {
                let (bb, bt) = (self.gpu.download(&ad.b)?, self.gpu.download(&ad.bt)?);
                let n = bb.len() / ad.rank;
                if bt.len() != bb.len()
                    || (0..bb.len()).any(|o| bt[o] != bb[(o % n) * ad.rank + o / n])
                {
                    return Ok(false);
                }
            }
        }
        Ok(true)
    }

    /// Device bytes of the block matrices' stored weights (the frozen base in
    /// LoRA mode: FP8 codes and factors, or bf16; the bf16 compute copies otherwise).
    pub fn base_bytes(&self) -> usize {
        self.blocks
            .iter()
            .map(|b| {
                b.lora.iter().map(|l| l.base.bytes()).sum::<usize>()
                    + b.lin.iter().map(|l| 2 * l.weight.len()).sum::<usize>()
            })
            .sum()
    }

    /// LoRA mode: the full model with every adapter merged, `W + (alpha/r) B
    /// A` in bf16 (Hugging Face names; embedding and norm gains in f32), one
    /// matrix on the device at a time (for sampling and `merge`).
    pub fn merged_weights(&self) -> Result<Vec<(String, Tensor)>> {
        let lm = self
            .lora
            .as_ref()
            .ok_or_else(|| Error::Shape("merged weights: the model is not in LoRA mode".into()))?;
        let gpu = self.gpu;
        let mut out = Vec::with_capacity(lm.base_slots.len());
        let mut mats: HashMap<usize, (usize, usize)> = HashMap::new();
        for (bi, b) in self.blocks.iter().enumerate() {
            for (li, &s) in b.slots.lin.iter().enumerate() {
                mats.insert(s, (bi, li));
            }
        }
        let bf16_tensor = |shape: &[usize], bits: Vec<u16>| -> Result<Tensor> {
            let v: Vec<half::bf16> = bits.into_iter().map(half::bf16::from_bits).collect();
            Tensor::from_bf16(shape, v).map_err(|e| Error::Shape(e.to_string()))
        };
        for (si, sl) in lm.base_slots.iter().enumerate() {
            let t = if let Some(&(bi, li)) = mats.get(&si) {
                let l = &self.blocks[bi].lora[li];
                let (n, k) = (l.n, l.k);
                let mut w = match &l.base {
                    GpuBase::Bf16(w) => gpu.stream.clone_dtod(w)?,
                    GpuBase::Fp8(w) => {
                        let block = match w.scaling {
                            octet_tensor::mixed::WeightScaling::Tensor => (n, k),
                            octet_tensor::mixed::WeightScaling::Channel => (1, k),
                            octet_tensor::mixed::WeightScaling::Block128 => (128, 128),
                        };
                        gpu.dequant_bf16(
                            w.row_major("merging a LoRA base")?,
                            &w.factors,
                            (n, k),
                            block,
                            w.format,
                        )?
                    }
                };
                if let Some(ad) = &l.adapter {
                    gpu.gemm_bf16_acc(
                        (&ad.b, false),
                        (&ad.a, false),
                        &mut w,
                        (n, k, ad.rank),
                        (ad.scale, 1.0),
                    )?;
                }
                bf16_tensor(&sl.shape, gpu.download(&w)?)?
            } else if si == self.head_slot && !self.cfg.tie_word_embeddings {
                bf16_tensor(&sl.shape, gpu.download(&self.head)?)?
            } else {
                let v = self.slot_view(si)?;
                let mut host = vec![0f32; sl.numel];
                gpu.stream.memcpy_dtoh(&v, &mut host)?;
                Tensor::from_f32(&sl.shape, host).map_err(|e| Error::Shape(e.to_string()))?
            };
            out.push((sl.name.clone(), t));
        }
        Ok(out)
    }

    /// Forward of projections `range` of block `bi`, which all read `x (n, K)`.
    pub(super) fn proj_forward(
        &mut self,
        bi: usize,
        range: std::ops::Range<usize>,
        x: Rc<CudaSlice<u16>>,
        x_amax: Option<TensorAmax>,
        n: usize,
    ) -> Result<Vec<(CudaSlice<u16>, ProjSaved)>> {
        let gpu = self.gpu;
        let dropout = self.lora_dropout_mask(bi, range.start)?;
        Ok(if self.lora.is_some() {
            forward_group(self.lora_layers(bi, range), gpu, (x, x_amax, n), dropout)?
                .into_iter()
                .map(|(y, s)| (y, ProjSaved::Lora(s)))
                .collect()
        } else {
            forward_shared(&mut self.blocks[bi].lin[range], gpu, x, x_amax, n)?
                .into_iter()
                .map(|(y, s)| (y, ProjSaved::Full(Box::new(s))))
                .collect()
        })
    }

    /// Block `bi`'s LoRA layers `range`, keeping their inputs as the model's
    /// [`SavedActivations`] says ([`GpuLoraLinear::fp8_saved_input`]).
    pub(super) fn lora_layers(
        &mut self,
        bi: usize,
        range: std::ops::Range<usize>,
    ) -> &mut [GpuLoraLinear] {
        let fp8 = self.saved_activations == SavedActivations::Fp8;
        let layers = &mut self.blocks[bi].lora[range];
        for l in layers.iter_mut() {
            l.fp8_saved_input = fp8;
        }
        layers
    }

    /// What projection `li` of block `bi` keeps for backward from input `x`,
    /// without computing its output.
    pub(super) fn proj_saved_only(
        &mut self,
        bi: usize,
        li: usize,
        x: Rc<CudaSlice<u16>>,
        x_amax: Option<TensorAmax>,
        n: usize,
    ) -> Result<ProjSaved> {
        let gpu = self.gpu;
        let dropout = self.lora_dropout_mask(bi, li)?;
        let saved = match self.lora.is_some() {
            true => {
                let lora = self.lora_layers(bi, li..li + 1);
                forward_group_with(lora, gpu, (x, x_amax, n), dropout, false)?
                    .pop()
                    .map(|(_, s)| ProjSaved::Lora(s))
            }
            false => {
                let lin = &mut self.blocks[bi].lin[li..li + 1];
                forward_shared_with(lin, gpu, (x, x_amax, n), false)?
                    .pop()
                    .map(|(_, s)| ProjSaved::Full(Box::new(s)))
            }
        };
        saved.ok_or_else(|| Error::Shape("a forward returned no saved state".into()))
    }

    /// LoRA: the dropout mask of the input of block `bi`'s projection `li`
    /// (shared by the projections that read that input) in the current
    /// training forward; `None` outside LoRA, without dropout, or in an
    /// evaluation forward.
    pub(super) fn lora_dropout_mask(&self, bi: usize, li: usize) -> Result<Option<Dropout>> {
        match self.lora.as_ref().map(|m| (m.dropout, m.dropout_now)) {
            Some((Some((p, seed)), Some(round))) => Ok(Some(
                Dropout::for_projection(p, (seed, round), bi, li)
                    .map_err(|e| Error::Shape(e.to_string()))?,
            )),
            _ => Ok(None),
        }
    }

    /// Backward of block `bi`'s projection `li` from `dy`: its weight's (or
    /// adapters') gradients into their slots, and its input gradient into
    /// `dx`: written there when `dx` is empty, added to it otherwise (the
    /// projections that read one input add theirs into one buffer, in
    /// order, which the norm's backward then reads once).
    pub(super) fn proj_backward<D: GemmOut>(
        &mut self,
        (bi, li): (usize, usize),
        saved: ProjSaved,
        dy: &CudaSlice<u16>,
        dy_amax: Option<TensorAmax>,
        dx: &mut Option<CudaSlice<D>>,
    ) -> Result<()> {
        self.proj_backward_group((bi, li), vec![(saved, dy, dy_amax)], dx)
    }

    /// [`GpuLlama::proj_backward`] of block `bi`'s projections `li..`, which
    /// read one input, from `(saved, dy, dy_amax)` each. In LoRA mode the
    /// layers' adapters share their products ([`crate::lora::cuda::backward_group`]).
    pub(super) fn proj_backward_group<D: GemmOut>(
        &mut self,
        (bi, li): (usize, usize),
        items: Vec<(ProjSaved, &CudaSlice<u16>, Option<TensorAmax>)>,
        dx: &mut Option<CudaSlice<D>>,
    ) -> Result<()> {
        if self.lora.is_some() {
            let mut saved = Vec::with_capacity(items.len());
            let mut dys = Vec::with_capacity(items.len());
            for (s, dy, amax) in items {
                match s {
                    ProjSaved::Lora(s) => saved.push(s),
                    ProjSaved::Full(_) => {
                        return Err(Error::Shape(
                            "a full projection's state in LoRA mode".into(),
                        ))
                    }
                }
                dys.push((dy, amax));
            }
            let n = saved.len();
            let layers = self.blocks[bi].lora.get(li..li + n).ok_or_else(|| {
                Error::Shape(format!("block {bi} has no projections {li}..{}", li + n))
            })?;
            let grads = crate::lora::cuda::backward_group(layers, self.gpu, saved, dys, dx)?;
            let mut adds = Vec::with_capacity(2 * grads.len());
            for (j, g) in grads.into_iter().enumerate() {
                if let (Some((da, db)), Some(Some((sa, sb)))) =
                    (g, self.blocks[bi].adapter_slots.get(li + j).copied())
                {
                    adds.push((sa, da));
                    adds.push((sb, db));
                }
            }
            return self.add_grads(&adds);
        }
        for (j, (s, dy, amax)) in items.into_iter().enumerate() {
            let ProjSaved::Full(s) = s else {
                return Err(Error::Shape(
                    "a LoRA projection's state outside LoRA mode".into(),
                ));
            };
            self.proj_backward_one((bi, li + j), *s, dy, amax, dx)?;
        }
        Ok(())
    }

    /// [`GpuLlama::proj_backward`] of one full (not LoRA) projection.
    pub(super) fn proj_backward_one<D: GemmOut>(
        &mut self,
        (bi, li): (usize, usize),
        saved: GpuLinearSaved,
        dy: &CudaSlice<u16>,
        dy_amax: Option<TensorAmax>,
        dx: &mut Option<CudaSlice<D>>,
    ) -> Result<()> {
        match dx {
            Some(d) => {
                let mut add = AddTo(d.slice_mut(..));
                self.proj_backward_to((bi, li), saved, dy, dy_amax, &mut add)
            }
            None => {
                let lin = &self.blocks[bi].lin[li];
                let (n, k) = (lin.n, lin.k);
                // The layer checks dy's length; here (m, k) with m = rows of dy.
                let numel = dy.len() / n.max(1) * k;
                // SAFETY: the input-gradient GEMM writes every element (beta = 0).
                let mut d = unsafe { self.gpu.alloc_uninit::<D>(numel, "d_input")? };
                self.proj_backward_to((bi, li), saved, dy, dy_amax, &mut d)?;
                *dx = Some(d);
                Ok(())
            }
        }
    }

    /// [`GpuLlama::proj_backward_one`] into a given destination. The
    /// weight's gradient goes straight into its slot: written by the step's
    /// first GEMM there, added by later ones.
    pub(super) fn proj_backward_to<D: GemmOut>(
        &mut self,
        (bi, li): (usize, usize),
        saved: GpuLinearSaved,
        dy: &CudaSlice<u16>,
        dy_amax: Option<TensorAmax>,
        dx: &mut impl GemmDst<D>,
    ) -> Result<()> {
        let gpu = self.gpu;
        let si = self.blocks[bi].slots.lin[li];
        let sl = &self.slots[si];
        let view = self.grad.slice_mut(sl.offset..sl.offset + sl.numel);
        let lin = &mut self.blocks[bi].lin[li];
        if self.grad_unwritten.get_mut(si).is_some_and(std::mem::take) {
            let mut dw = view;
            lin.backward_into(gpu, saved, dy, dy_amax, dx, &mut dw)
        } else {
            lin.backward_into(gpu, saved, dy, dy_amax, dx, &mut AddTo(view))
        }
    }
}

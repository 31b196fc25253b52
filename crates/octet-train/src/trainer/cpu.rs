//! The CPU run: the model and its AdamW on the host under the one loop
//! ([`crate::run::run`]).

use super::*;

pub(super) fn add_grads(
    acc: &mut Option<Vec<(String, Tensor)>>,
    g: Vec<(String, Tensor)>,
) -> Result<()> {
    match acc {
        None => *acc = Some(g),
        Some(a) => {
            for ((_, x), (_, y)) in a.iter_mut().zip(g) {
                *x = octet_tensor::cpu::add(x, &y)?;
            }
        }
    }
    Ok(())
}

/// What a non-finite loss or gradient norm at learning rate `lr` suggests
/// (appended to the error, which names the step): a rate too high is the
/// usual cause of a loss that grows until it is NaN or inf.
pub fn lr_hint(lr: f32) -> String {
    format!(
        " (at learning rate {lr:e}; a loss that diverges to NaN/inf usually means the rate is \
         too high: lower --lr, or --warmup longer)"
    )
}

/// Whether a model error is a NaN or inf (a loss, or an FP8 cast's input).
pub(super) fn is_non_finite(e: &octet_nn::Error) -> bool {
    use octet_fp8::Error::NonFinite as Cast;
    matches!(
        e,
        octet_nn::Error::NonFinite(_)
            | octet_nn::Error::Quant(Cast { .. })
            | octet_nn::Error::Tensor(octet_tensor::Error::Quant(Cast { .. }))
    )
}

/// What a run started with `init` says it starts from.
pub fn init_note(cfg: &TrainConfig) -> String {
    let dir = cfg
        .init
        .as_deref()
        .map(|d| d.display().to_string())
        .unwrap_or_default();
    match &cfg.init_adapter {
        Some(a) => format!("starting from {dir} with adapter {} merged", a.display()),
        None => format!("starting from {dir}"),
    }
}

/// Train from scratch (or from `cfg.init`'s weights), or resume from
/// `resume` (a checkpoint directory).
pub fn train(
    cfg: &TrainConfig,
    resume: Option<&Path>,
    obs: &mut dyn Observer,
) -> Result<RunSummary> {
    cfg.validate()?;
    if resume.is_some() && cfg.init.is_some() {
        return Err(Error::Train(
            "--resume continues a run; --init starts a new one from weights: give one".into(),
        ));
    }
    cfg.check_resume(resume)?;
    if cfg.saved_activations == "fp8" {
        return Err(Error::Train(format!(
            "--saved-activations {} is built for the GPU model (--device cuda); the CPU model keeps its activations in f32",
            cfg.saved_activations
        )));
    }
    let recipe = match &cfg.lora {
        Some(_) => None,
        None => cfg.recipe()?,
    };
    let recipe_name = cfg.run_label()?;
    // The model's dimensions (a resumed run's or a LoRA base's are its
    // checkpoint's), to refuse a run that cannot fit before allocating it.
    let mcfg = cfg.run_model_config(resume)?;
    cfg.check_memory(&mcfg, host_available_bytes())?;
    let data = cfg.dataset(cfg.model_vocab()?)?;
    let dir = cfg.out_dir.join(&cfg.name);
    crate::create_dir_all(&dir)?;
    let (mut model, opt) = match (resume, &cfg.lora) {
        (Some(ck), Some(l)) => {
            let mut model = l.build(cfg)?;
            let (adapter, ..) = checkpoint::load_adapter(ck)?;
            model.load_params(adapter)?;
            let opt = resume_optimizer(ck, &mut model, cfg, obs, "LoRA ")?;
            (model, opt)
        }
        (None, Some(l)) => {
            let model = l.build(cfg)?;
            obs.note(&format!(
                "LoRA: base matrices {} bytes ({}), {} adapter tensors",
                model.matrix_bytes(),
                l.base_format,
                model.params().len()
            ));
            let opt = AdamW::new(&model.params(), cfg.adamw);
            (model, opt)
        }
        (Some(ck), None) => {
            let mcfg = checkpoint::load_config(ck)?;
            let weights = checkpoint::load_weights(ck, DType::F32)?;
            let mut model = Llama::from_weights(&mcfg, weights, recipe)?;
            let opt = resume_optimizer(ck, &mut model, cfg, obs, "")?;
            (model, opt)
        }
        (None, None) => {
            let model = match cfg.init_weights()? {
                Some((mcfg, w)) => {
                    let m = Llama::from_weights(&mcfg, w, recipe)?;
                    obs.note(&init_note(cfg));
                    m
                }
                None => Llama::new_random(&cfg.llama_config()?, DType::F32, recipe, cfg.seed)?,
            };
            let opt = AdamW::new(&model.params(), cfg.adamw);
            (model, opt)
        }
    };
    model.set_recompute(cfg.recomputed_blocks());
    let mut stepper = CpuStepper {
        model,
        opt,
        cfg,
        grads: None,
        peak_saved: 0,
    };
    crate::run::run(cfg, resume, &data, &dir, &recipe_name, &mut stepper, obs)
}

/// The optimizer state of checkpoint `ck` for `model`, with this run's AdamW
/// settings (`--weight-decay`, `--grad-clip`, the config file's, as the GPU
/// and sharded trainers take them), its masters written back into the model.
fn resume_optimizer(
    ck: &Path,
    model: &mut Llama,
    cfg: &TrainConfig,
    obs: &mut dyn Observer,
    what: &str,
) -> Result<AdamW> {
    let (mut opt, _) = checkpoint::load_optimizer(ck, model)?;
    opt.cfg = cfg.adamw;
    opt.write_back(model.params_mut())?;
    obs.note(&format!(
        "resumed {what}from {} at step {}",
        ck.display(),
        opt.step
    ));
    Ok(opt)
}

/// The CPU model and its AdamW under the one loop ([`crate::run::run`]):
/// gradients summed over the micro-batches on the host, the optimizer
/// stepping the f32 masters and writing them back into the model.
pub(super) struct CpuStepper<'a> {
    model: Llama,
    opt: AdamW,
    cfg: &'a TrainConfig,
    /// The step's gradients so far (summed over its micro-batches).
    grads: Option<Vec<(String, Tensor)>>,
    peak_saved: usize,
}

impl crate::run::Stepper for CpuStepper<'_> {
    fn step(&self) -> u64 {
        self.opt.step
    }

    fn begin_step(&mut self, _telemetry: bool) -> Result<()> {
        self.grads = None;
        Ok(())
    }

    fn micro_batch(
        &mut self,
        x: &[u32],
        y: &[u32],
        round: u64,
        step: u64,
        lr: f32,
        weight: f64,
    ) -> Result<f64> {
        let cfg = self.cfg;
        self.model.set_dropout_round(round);
        // The salts of stochastic rounding follow the micro-step too (as
        // sharded data parallel sets them), also after a resume.
        self.model.set_grad_round(round);
        // The step and (inside `e`) the block, with the learning-rate hint
        // where a value went non-finite (a gradient that overflowed stops FP8
        // recipes in backward, quantizing it); checkpoints already written
        // stay as they are.
        let fail = |what: &str, e: octet_nn::Error| {
            let hint = if is_non_finite(&e) {
                lr_hint(lr)
            } else {
                String::new()
            };
            Error::Train(format!(
                "step {}: {what}{e}{hint}; the last good checkpoint is kept",
                step + 1
            ))
        };
        let (loss, saved) = self
            .model
            .forward(x, y, cfg.batch, cfg.seq)
            .map_err(|e| fail("", e))?;
        self.peak_saved = self.peak_saved.max(saved.bytes());
        let g = self
            .model
            .backward(saved)
            .map_err(|e| fail("backward: ", e))?;
        // The micro-batch's share of the step (1 for a step of one batch).
        let g = match weight == 1.0 {
            true => g,
            false => {
                let w = weight as f32;
                g.into_iter()
                    .map(|(n, t)| {
                        let v = t.try_to_f32_vec()?.into_iter().map(|v| v * w);
                        Ok((n, Tensor::from_f32(t.shape(), v.collect())?))
                    })
                    .collect::<Result<Vec<_>>>()?
            }
        };
        add_grads(&mut self.grads, g)?;
        Ok(loss * weight)
    }

    fn update(
        &mut self,
        lr: f32,
        step: u64,
        telemetry: bool,
    ) -> Result<(f32, crate::run::LayerTelemetry)> {
        // Each micro-batch's gradient came weighted by its share of the step.
        let grads = self.grads.take().unwrap_or_default();
        let grad_norm = self.opt.step(&grads, lr).map_err(|e| match e {
            Error::NonFinite(m) => Error::NonFinite(format!(
                "step {}: {m}{}; the last good checkpoint is kept",
                step + 1,
                lr_hint(lr)
            )),
            e => e,
        })?;
        self.opt.write_back(self.model.params_mut())?;
        self.model.update_scales();
        let layers = match telemetry {
            true => self.model.telemetry(),
            false => Vec::new(),
        };
        Ok((grad_norm, layers))
    }

    fn memory(&self) -> Result<crate::run::StepMemory> {
        Ok(crate::run::StepMemory {
            saved: self.peak_saved,
            ..Default::default()
        })
    }

    fn evaluate(&mut self, data: &Dataset, cfg: &TrainConfig, n: usize) -> Result<f64> {
        evaluate(&mut self.model, data, cfg, n)
    }

    fn save(
        &mut self,
        dir: &Path,
        (trainer_json, tok): (&str, Option<&Path>),
    ) -> Result<Option<PathBuf>> {
        let (parent, name) = (
            dir.join("checkpoints"),
            format!("step_{:06}", self.opt.step),
        );
        let p = match &self.cfg.lora {
            Some(l) => checkpoint::save_lora_checkpoint(
                &parent,
                &name,
                &self.model,
                &self.opt,
                trainer_json,
                tok,
                (&checkpoint::base_record(l.base.as_deref()), &l.record()),
            )?,
            None => checkpoint::save_checkpoint(
                &parent,
                &name,
                &self.model,
                &self.opt,
                trainer_json,
                tok,
            )?,
        };
        Ok(Some(p))
    }

    fn sample(&mut self, prompt: &[u32], n: usize, seed: u64) -> Result<Vec<u32>> {
        sample(&self.model, prompt, n, seed)
    }

    fn finish(
        &mut self,
        _steps_run: usize,
        _obs: &mut dyn Observer,
    ) -> Result<crate::run::DeviceFigures> {
        Ok(crate::run::DeviceFigures {
            params: self.model.cfg.num_params(),
            peak_saved_bytes: self.peak_saved,
            memory: cpu_memory(&self.model, &self.opt, self.peak_saved),
            ..Default::default()
        })
    }
}

/// The CPU run's memory at its peak: the model's parameters (and the
/// gradients of a step, as many bytes), AdamW's masters and moments, and the
/// largest saved activations of a micro-batch.
pub(super) fn cpu_memory(model: &Llama, opt: &AdamW, saved: usize) -> Vec<(String, usize)> {
    let params: usize = model
        .params()
        .iter()
        .map(|(_, t)| t.numel() * t.dtype().size())
        .sum();
    vec![
        ("parameters".to_string(), params),
        ("gradients".to_string(), params),
        ("AdamW masters and moments (f32)".to_string(), opt.bytes()),
        ("saved activations".to_string(), saved),
    ]
}

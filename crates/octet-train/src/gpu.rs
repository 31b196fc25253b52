//! The training loop on the GPU: the same run as [`crate::trainer::train`]
//! (data, schedule, evaluation, metrics, checkpoints, plot, sample), with the
//! model, its gradients and AdamW on the device ([`octet_nn::llama::cuda::GpuLlama`]).
//!
//! Checkpoints are the CPU trainer's (f32 masters downloaded at save time,
//! delayed-scaling histories and scales included), so a GPU run resumes on
//! the CPU and the other way round. Sharded, the ranks max-reduce each step's
//! amaxes before the histories roll, so every rank keeps the same histories
//! and the checkpoint's (rank 0's) are every rank's. What differs from the
//! CPU loop: the final sample decodes with the GPU KV-cache decoder (bf16 weights;
//! the same tokens' window as the CPU's, refilled once it slides past the positions).
//!
//! A LoRA run (`cfg.lora`) builds the model with [`GpuLlama::new_lora`]: the
//! base frozen on the device in its stored form, only the adapters training;
//! its checkpoints are the CPU LoRA run's (adapter in PEFT layout, the
//! adapters' optimizer state), and its sample decodes the merged weights.

use crate::checkpoint;
use crate::data::{Dataset, Split};
use crate::optim::{AdamW, ParamState};
use crate::trainer::{sample_windowed, Feed, LoraSettings, Observer, RunSummary, TrainConfig};
use crate::{Error, Result};
use octet_cuda::nccl::{NcclComm, NcclStats};
use octet_cuda::Gpu;
use octet_nn::decode::cuda::{GpuDecoder, GpuWeights};
use octet_nn::llama::cuda::{AdamParams, GpuLlama, SavedActivations};
use octet_nn::llama::Llama;
use octet_tensor::{DType, Tensor};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

fn gpu_err(step: u64) -> impl Fn(octet_cuda::Error) -> Error {
    move |e| match e {
        octet_cuda::Error::NonFinite => Error::NonFinite(format!(
            "step {step}: the loss is not finite; the last good checkpoint is kept"
        )),
        e => Error::Train(format!("step {step}: {e}")),
    }
}

/// Mean validation loss over `n` deterministic batches, on the GPU (with
/// `comm`, each rank takes its rows of every batch, and the batch's mean is
/// the sum of the ranks' means weighted by their shares of its counted
/// targets, `rank_share`).
pub fn evaluate_gpu(
    model: &mut GpuLlama<'_>,
    data: &Dataset,
    cfg: &TrainConfig,
    n: usize,
    comm: Option<&NcclComm>,
) -> Result<f64> {
    let (rank, world) = comm.map_or((0, 1), |c| (c.rank(), c.world()));
    let mut total = 0.0;
    for i in 0..n {
        let (x, full) = data.batch(Split::Val, cfg.batch, cfg.seq, cfg.seed, i as u64)?;
        let (x, y) = (rows_of(&x, rank, world), rows_of(&full, rank, world));
        let loss = model
            .forward(&x, &y, (cfg.batch / world, cfg.seq), 0.0, false)?
            .0;
        total += loss * rank_share(&full, &y);
    }
    let mean = total / n.max(1) as f64;
    match comm {
        Some(c) => Ok(c.sum_f64(model.gpu(), mean)?),
        None => Ok(mean),
    }
}

/// A rank's share of a batch's counted targets (those not
/// [`octet_nn::loss::IGNORE`]): its rows `local` of the batch `full`. The
/// batch's mean loss is the ranks' means weighted so, as one process
/// computes it over the whole batch (the ranks' counts differ where the
/// data masks prompts); 0 where nothing in the batch counts.
fn rank_share(full: &[u32], local: &[u32]) -> f64 {
    let counted = |t: &[u32]| t.iter().filter(|&&v| v != octet_nn::loss::IGNORE).count();
    match counted(full) {
        0 => 0.0,
        all => counted(local) as f64 / all as f64,
    }
}

/// Rank `rank`'s equal share of a batch's rows (`world` divides the batch).
fn rows_of(x: &[u32], rank: usize, world: usize) -> Vec<u32> {
    let chunk = x.len() / world;
    x[rank * chunk..(rank + 1) * chunk].to_vec()
}

/// The optimizer's f32 masters as named tensors.
fn masters_of(opt: &AdamW) -> Result<HashMap<String, Tensor>> {
    opt.states
        .iter()
        .map(|s| {
            Ok((
                s.name.clone(),
                Tensor::from_f32(&s.shape, s.master.clone())?,
            ))
        })
        .collect()
}

/// The CPU optimizer's form of the model's optimizer state `state` (per slot).
fn optimizer_of(
    model: &GpuLlama<'_>,
    state: Vec<octet_nn::llama::cuda::MasterMoments>,
    adamw: crate::optim::AdamWConfig,
) -> AdamW {
    let states = state
        .into_iter()
        .zip(&model.slots)
        .map(|((master, m, v), s)| ParamState {
            name: s.name.clone(),
            shape: s.shape.clone(),
            master,
            m,
            v,
            decay: s.decay,
        })
        .collect();
    AdamW {
        cfg: adamw,
        states,
        step: model.step,
    }
}

/// Save the GPU model and optimizer as an ordinary checkpoint (with the
/// run's `tokenizer` files, see [`checkpoint::save_checkpoint`]). Sharded,
/// every rank calls it (the shards are gathered) and rank 0 writes (`write`).
fn save(
    model: &GpuLlama<'_>,
    adamw: crate::optim::AdamWConfig,
    recipe: Option<octet_fp8::Recipe>,
    dir: &Path,
    (trainer_json, tokenizer): (&str, Option<&Path>),
    write: bool,
) -> Result<Option<std::path::PathBuf>> {
    let weights: HashMap<String, Tensor> = model.weights()?.into_iter().collect();
    let state = model.optimizer_state()?;
    if !write {
        return Ok(None);
    }
    let mut cpu = Llama::from_weights(&model.cfg, weights, recipe)?;
    cpu.set_scaling_state(model.scaling_state()?)?;
    let opt = optimizer_of(model, state, adamw);
    checkpoint::save_checkpoint(
        &dir.join("checkpoints"),
        &format!("step_{:06}", model.step),
        &cpu,
        &opt,
        trainer_json,
        tokenizer,
    )
    .map(Some)
}

/// The model of a LoRA run: the base from `l.base` (or the random base of
/// the run's preset and seed, as the CPU run makes it), the adapters fresh or
/// from a checkpoint's optimizer masters (`resume`, either device's).
fn lora_model<'g>(
    gpu: &'g Gpu,
    cfg: &TrainConfig,
    l: &LoraSettings,
    resume: Option<&Path>,
    obs: &mut dyn Observer,
) -> Result<GpuLlama<'g>> {
    let spec = l.spec(&cfg.recipe, &cfg.backward, cfg.seed)?;
    let (mcfg, weights, mut stored) = match &l.base {
        Some(dir) => {
            // An FP8 base keeps the stored codes; a bf16 base dequantizes them.
            let (w, fp8) = if matches!(spec.base, octet_nn::lora::BaseFormat::Fp8(_)) {
                checkpoint::load_base_fp8(dir, DType::F32)?
            } else {
                checkpoint::load_weights_fp8(dir, DType::F32)?
            };
            (checkpoint::load_config(dir)?, w, fp8)
        }
        None => {
            let cpu = Llama::new_random(&cfg.llama_config()?, DType::F32, None, cfg.seed)?;
            let w = cpu
                .params()
                .into_iter()
                .map(|(n, t)| (n, t.clone()))
                .collect();
            (cpu.cfg.clone(), w, HashMap::new())
        }
    };
    let Some(ck) = resume else {
        let model = GpuLlama::new_lora_with(gpu, &mcfg, &weights, &spec, None, &mut stored)?;
        obs.note(&format!(
            "LoRA on the GPU: base matrices {} bytes ({}), {} adapter tensors",
            model.base_bytes(),
            l.base_format,
            model.slots.len()
        ));
        return Ok(model);
    };
    let params = GpuLlama::adapter_params(&mcfg, &spec);
    let (opt, _, _) = checkpoint::load_optimizer_for(ck, &params)?;
    // The masters are the truth: the adapter file holds the same values.
    let masters = masters_of(&opt)?;
    let mut model =
        GpuLlama::new_lora_with(gpu, &mcfg, &weights, &spec, Some(&masters), &mut stored)?;
    let (m, v): (Vec<_>, Vec<_>) = opt.states.into_iter().map(|s| (s.m, s.v)).unzip();
    model.set_moments(&m, &v, opt.step)?;
    obs.note(&format!(
        "resumed LoRA from {} at step {}",
        ck.display(),
        opt.step
    ));
    Ok(model)
}

/// Save a LoRA run's checkpoint as the CPU trainer does: the adapter in
/// PEFT's layout with the base's `config.json`, the adapters' optimizer
/// state, and the run's `tokenizer` files.
fn save_lora(
    model: &GpuLlama<'_>,
    adamw: crate::optim::AdamWConfig,
    l: &LoraSettings,
    dir: &Path,
    (trainer_json, tokenizer): (&str, Option<&Path>),
) -> Result<Option<std::path::PathBuf>> {
    let (r, alpha, targets) = model
        .lora_summary()
        .ok_or_else(|| Error::Train("the model is not in LoRA mode".into()))?;
    let tensors = model.weights()?;
    let opt = optimizer_of(model, model.optimizer_state()?, adamw);
    checkpoint::save_checkpoint_with(
        &dir.join("checkpoints"),
        &format!("step_{:06}", model.step),
        |tmp| {
            checkpoint::write_adapter(
                tmp,
                &tensors,
                (r, alpha, &targets, l.dropout),
                Some(&checkpoint::base_record(l.base.as_deref())),
            )?;
            checkpoint::write_lora_record(tmp, &l.record())?;
            checkpoint::write_config(tmp, &model.cfg, DType::F32)?;
            checkpoint::save_optimizer(tmp, &opt, trainer_json, "[]")?;
            checkpoint::copy_run_tokenizer(tokenizer, tmp)
        },
    )
    .map(Some)
}

/// Train on `gpu` from scratch, or resume from `resume` (a checkpoint of
/// either device).
pub fn train_gpu(
    cfg: &TrainConfig,
    resume: Option<&Path>,
    obs: &mut dyn Observer,
    gpu: &Gpu,
) -> Result<RunSummary> {
    train_gpu_ranked(cfg, resume, obs, gpu, None)
}

/// [`train_gpu`] as one rank of sharded data parallel over `comm` (`None`:
/// the only rank). `cfg.batch` is the global batch: each rank trains on its
/// equal share of every batch's rows, so the run sees the same data as one
/// rank. Every rank calls this; rank 0 writes metrics, checkpoints, the plot
/// and the sample, and its summary counts the bytes it handed to NCCL.
pub fn train_gpu_ranked(
    cfg: &TrainConfig,
    resume: Option<&Path>,
    obs: &mut dyn Observer,
    gpu: &Gpu,
    comm: Option<&NcclComm>,
) -> Result<RunSummary> {
    cfg.validate()?;
    if resume.is_some() && cfg.init.is_some() {
        return Err(Error::Train(
            "--resume continues a run; --init starts a new one from weights: give one".into(),
        ));
    }
    cfg.check_resume(resume)?;
    let (rank, world) = comm.map_or((0, 1), |c| (c.rank(), c.world()));
    if !cfg.batch.is_multiple_of(world) {
        return Err(Error::Train(format!(
            "--batch {} (the global batch) does not split over {world} ranks",
            cfg.batch
        )));
    }
    let build = |mcfg: &octet_nn::llama::LlamaConfig, w: &HashMap<String, Tensor>| match comm {
        Some(c) => GpuLlama::new_sharded(gpu, mcfg, w, cfg.recipe().ok().flatten(), c),
        None => GpuLlama::new(gpu, mcfg, w, cfg.recipe().ok().flatten()),
    };
    if cfg.lora.is_some() && world > 1 {
        return Err(Error::Train(
            "LoRA fine-tuning runs on one GPU (or the CPU): drop --nproc".into(),
        ));
    }
    let recipe = match &cfg.lora {
        Some(_) => None,
        None => cfg.recipe()?,
    };
    let recipe_name = cfg.run_label()?;
    let data = cfg.dataset(cfg.model_vocab()?)?;
    // Refuse a run whose floor cannot fit the GPU's free memory before
    // allocating it (the model's dimensions: a resumed run's or a LoRA
    // base's are its checkpoint's).
    let mcfg = cfg.run_model_config(resume)?;
    cfg.check_device_memory(&mcfg, world, gpu.mem_free().ok().map(|b| b as u64))?;
    let dir = cfg.out_dir.join(&cfg.name);
    crate::create_dir_all(&dir)?;
    let mut model = match (resume, &cfg.lora) {
        (_, Some(l)) => lora_model(gpu, cfg, l, resume, obs)?,
        (Some(ck), None) => {
            let mcfg = checkpoint::load_config(ck)?;
            let weights = checkpoint::load_weights(ck, DType::F32)?;
            let mut cpu = Llama::from_weights(&mcfg, weights, recipe)?;
            let (opt, _) = checkpoint::load_optimizer(ck, &mut cpu)?;
            // The masters are the truth: the model file holds the same values.
            let masters = masters_of(&opt)?;
            // Delayed scaling: the amax histories and scales as saved (either device's).
            let scaling = cpu.scaling_state();
            drop(cpu);
            let mut model = build(&mcfg, &masters)?;
            model.set_scaling_state(&scaling)?;
            let (m, v): (Vec<_>, Vec<_>) = opt.states.into_iter().map(|s| (s.m, s.v)).unzip();
            model.set_moments(&m, &v, opt.step)?;
            obs.note(&format!(
                "resumed from {} at step {}",
                ck.display(),
                opt.step
            ));
            model
        }
        (None, None) => {
            let (mcfg, w) = match cfg.init_weights()? {
                Some(init) => {
                    obs.note(&crate::trainer::init_note(cfg));
                    init
                }
                None => {
                    let cpu = Llama::new_random(&cfg.llama_config()?, DType::F32, None, cfg.seed)?;
                    let w: HashMap<String, Tensor> = cpu
                        .params()
                        .into_iter()
                        .map(|(n, t)| (n, t.clone()))
                        .collect();
                    (cpu.cfg.clone(), w)
                }
            };
            build(&mcfg, &w)?
        }
    };
    model.set_grad_reduce_bf16(cfg.grad_reduce == "bf16");
    model.saved_activations = match cfg.fp8_saved_activations()? {
        true => SavedActivations::Fp8,
        false => SavedActivations::Full,
    };
    if cfg.reshard_after_forward {
        model.set_reshard_after_forward(true)?;
    }
    model.set_recompute(cfg.recomputed_blocks());
    model.set_fast_accum(cfg.fp8_fast_accum);
    let mut stepper = GpuStepper {
        model,
        gpu,
        comm,
        cfg,
        recipe,
        rank,
        world,
        // `OCTET_PROFILE=1`: per micro-step, the host's time to the loss
        // (batch and forward, which ends reading the loss back), to enqueue
        // the backward, and to its end on the device (a synchronization
        // added after it). An enqueue time near the device's means the
        // host's launches pace the backward.
        host: octet_cuda::profile_enabled()?.then(Vec::new),
        telemetry: false,
        peak_saved: 0,
        saved_kinds: Vec::new(),
        peak_dev: 0,
        comm_from: None,
        comm_steps: 0,
    };
    crate::run::run(cfg, resume, &data, &dir, &recipe_name, &mut stepper, obs)
}

/// The GPU model (one rank of a sharded run, or the only one) under the one
/// loop ([`crate::run::run`]): gradients and AdamW on the device, each rank
/// training on its share of the global batch's rows.
struct GpuStepper<'g> {
    model: GpuLlama<'g>,
    gpu: &'g Gpu,
    comm: Option<&'g NcclComm>,
    cfg: &'g TrainConfig,
    recipe: Option<octet_fp8::Recipe>,
    rank: usize,
    world: usize,
    /// Host timings per micro-step under `OCTET_PROFILE=1`.
    host: Option<Vec<[f64; 3]>>,
    /// Whether this step records telemetry.
    telemetry: bool,
    peak_saved: usize,
    /// The saved activations by kind at the micro-batch that kept the most.
    saved_kinds: Vec<(&'static str, usize)>,
    peak_dev: usize,
    /// NCCL counters at the start of the second step, and the steps since.
    comm_from: Option<NcclStats>,
    comm_steps: u64,
}

impl GpuStepper<'_> {
    /// Where the peak device memory went: the model's state by kind, the
    /// saved activations by kind, and the rest of the peak the driver
    /// reported (workspace, the allocator's cache, the CUDA context).
    fn memory_parts(&self) -> Vec<(String, usize)> {
        let mut parts: Vec<(String, usize)> = self
            .model
            .state_by_kind()
            .into_iter()
            .map(|(n, b)| (n.to_string(), b))
            .collect();
        parts.extend(
            self.saved_kinds
                .iter()
                .map(|(n, b)| (format!("saved: {n}"), *b)),
        );
        let known: usize = parts.iter().map(|(_, b)| b).sum();
        parts.push((
            "workspace, allocator cache and CUDA context".to_string(),
            self.peak_dev.saturating_sub(known),
        ));
        parts
    }
}

impl crate::run::Stepper for GpuStepper<'_> {
    fn step(&self) -> u64 {
        self.model.step
    }

    fn lead(&self) -> bool {
        self.rank == 0
    }

    fn plot_suffix(&self) -> &'static str {
        ", GPU"
    }

    fn timed(&self, step: u64, steps: u64) -> bool {
        // The first steps compile kernels and choose GEMM algorithms: the
        // run's tokens/s leaves them out when there are enough others.
        step >= 2 || steps < 5
    }

    fn begin_step(&mut self, telemetry: bool) -> Result<()> {
        // NCCL bytes per step, counted over the steps after the first.
        if self.comm.is_some() && self.comm_from.is_none() && self.model.step > 0 {
            self.comm_from = Some(self.model.comm_stats());
            self.comm_steps = 0;
        }
        self.model.zero_grad()?;
        self.telemetry = telemetry;
        self.model.set_telemetry(telemetry);
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
        let (rank, world) = (self.rank, self.world);
        let dims = (self.cfg.batch / world, self.cfg.seq);
        let tm = Instant::now();
        let (x, full) = (rows_of(x, rank, world), y);
        let y = rows_of(full, rank, world);
        // The rank's forward takes the mean over its own counted targets;
        // weighted by its share of the micro-batch's and the micro-batch's of
        // the step, the ranks' gradients (summed by the reduce-scatter) and
        // losses add up to the step's mean.
        let share = weight * rank_share(full, &y);
        let scale = share as f32;
        let model = &mut self.model;
        model.set_dropout_round(round);
        // The salts of stochastic rounding: the micro-step's (as the CPU
        // trainer's, also after a resume), one apiece for the ranks, whose
        // rows of the batch differ.
        model.set_grad_round(round * world as u64 + rank as u64);
        let (loss, saved) = match model.forward(&x, &y, dims, scale, true) {
            Err(octet_cuda::Error::NonFinite) => {
                // Run the batch again checking every block's output, to name
                // where the NaN/inf first appears.
                // The same dropout masks as the failed forward (a checking
                // forward draws them although it keeps nothing).
                model.check_layers = true;
                model.set_dropout_round(round);
                let at = match model.forward(&x, &y, dims, 0.0, false) {
                    Err(octet_cuda::Error::NonFiniteIn(at)) => at,
                    _ => "a place the block checks did not find".into(),
                };
                return Err(Error::NonFinite(format!(
                    "step {}: the loss is not finite{}; NaN/inf first appear in {at}{}; the last good checkpoint is kept",
                    step + 1,
                    if world > 1 { format!(" on rank {rank}") } else { String::new() },
                    crate::trainer::lr_hint(lr)
                )));
            }
            r => r.map_err(gpu_err(step + 1))?,
        };
        let saved = saved.ok_or_else(|| Error::Train("forward kept nothing".into()))?;
        let kinds = saved.bytes_by_kind();
        let bytes = kinds.iter().map(|(_, b)| b).sum::<usize>();
        if bytes > self.peak_saved {
            self.peak_saved = bytes;
            self.saved_kinds = kinds;
        }
        self.peak_dev = self.peak_dev.max(self.gpu.mem_used()?);
        let tb = Instant::now();
        model.backward(saved).map_err(gpu_err(step + 1))?;
        if let Some(h) = self.host.as_mut() {
            let queued = tb.elapsed().as_secs_f64();
            self.gpu.synchronize()?;
            h.push([(tb - tm).as_secs_f64(), queued, tb.elapsed().as_secs_f64()]);
        }
        Ok(loss * share)
    }

    fn update(
        &mut self,
        lr: f32,
        step: u64,
        telemetry: bool,
    ) -> Result<(f32, crate::run::LayerTelemetry)> {
        // The step's own quantizations (not the evaluation's that may follow).
        let layers = if telemetry {
            self.model.set_telemetry(false);
            self.model.telemetry()?
        } else {
            Vec::new()
        };
        let a = self.cfg.adamw;
        let model = &mut self.model;
        let grad_norm = model
            .adamw_step(AdamParams {
                lr,
                beta1: a.beta1,
                beta2: a.beta2,
                eps: a.eps,
                weight_decay: a.weight_decay,
                grad_clip: a.grad_clip,
            })
            .map_err(|e| match e {
                octet_cuda::Error::NonFinite => {
                    let names = model.nonfinite_grads().unwrap_or_default();
                    let first = names.first().cloned().unwrap_or_else(|| "?".into());
                    Error::NonFinite(format!(
                        "step {}: the gradient norm is not finite ({} of {} gradients have NaN/inf, the first in backward order {first}){}; the last good checkpoint is kept",
                        step + 1,
                        names.len(),
                        model.slots.len(),
                        crate::trainer::lr_hint(lr)
                    ))
                }
                e => e.into(),
            })?;
        self.gpu.synchronize()?;
        self.comm_steps += 1;
        Ok((grad_norm, layers))
    }

    /// Each rank's loss is its weighted share of the batch's mean
    /// (`micro_batch`): the step's loss is their sum.
    fn step_loss(&self, local: f64) -> Result<f64> {
        match self.comm {
            Some(c) => Ok(c.sum_f64(self.gpu, local)?),
            None => Ok(local),
        }
    }

    fn memory(&self) -> Result<crate::run::StepMemory> {
        Ok(crate::run::StepMemory {
            saved: self.peak_saved,
            device: Some(self.peak_dev),
            allocated: self.gpu.pool_peak_allocated()?,
            reserved: self.gpu.pool_peak_reserved()?,
        })
    }

    fn evaluate(&mut self, data: &Dataset, cfg: &TrainConfig, n: usize) -> Result<f64> {
        evaluate_gpu(&mut self.model, data, cfg, n, self.comm)
    }

    fn save(&mut self, dir: &Path, run: (&str, Option<&Path>)) -> Result<Option<PathBuf>> {
        match &self.cfg.lora {
            Some(l) => save_lora(&self.model, self.cfg.adamw, l, dir, run),
            None => save(
                &self.model,
                self.cfg.adamw,
                self.recipe,
                dir,
                run,
                self.rank == 0,
            ),
        }
    }

    fn sample(&mut self, prompt: &[u32], n: usize, seed: u64) -> Result<Vec<u32>> {
        // Sharded, gathering the weights is a collective: every rank takes part.
        let w = if self.model.is_lora() {
            self.model.merged_weights()?
        } else {
            self.model.weights()?
        };
        if self.rank != 0 {
            return Ok(Vec::new());
        }
        let w: HashMap<String, Tensor> = w.into_iter().collect();
        let mut dec = GpuDecoder::new(self.gpu, &self.model.cfg, &w, GpuWeights::Bf16)?;
        let ctx = self.model.cfg.max_position_embeddings;
        sample_windowed(prompt, n, ctx, seed, |feed| {
            Ok(match feed {
                Feed::Step(t) => dec.step(t)?,
                Feed::Fill(window) => {
                    dec.reset();
                    dec.prefill(window)?
                }
            })
        })
    }

    fn finish(
        &mut self,
        steps_run: usize,
        obs: &mut dyn Observer,
    ) -> Result<crate::run::DeviceFigures> {
        if let Some(h) = self.host.as_ref().filter(|h| h.len() > 2) {
            let median = |i: usize| {
                let mut v: Vec<f64> = h[2..].iter().map(|r| r[i] * 1e3).collect();
                v.sort_by(f64::total_cmp);
                v[v.len() / 2]
            };
            obs.note(&format!(
                "host timing, median of micro-steps 3-{}: forward to the loss {:.2} ms, backward enqueued in {:.2} ms, done on the device after {:.2} ms",
                h.len(),
                median(0),
                median(1),
                median(2)
            ));
        }
        let prof = self.model.profile();
        if !prof.is_empty() {
            let total: f64 = prof.iter().map(|(_, t)| t).sum();
            let mut text = format!("profile over {steps_run} steps (ms per step):");
            for (name, t) in &prof {
                text += &format!(
                    "\n  {name:24} {:9.2}  {:5.1}%",
                    t / steps_run.max(1) as f64,
                    100.0 * t / total
                );
            }
            obs.note(&text);
        }
        let nccl_per_step = self.comm_from.map(|from| {
            let d = self.model.comm_stats().since(&from);
            let k = self.comm_steps.max(1);
            NcclStats {
                all_gather_bytes: d.all_gather_bytes / k,
                all_gather_calls: d.all_gather_calls / k,
                reduce_scatter_bytes: d.reduce_scatter_bytes / k,
                reduce_scatter_calls: d.reduce_scatter_calls / k,
                all_reduce_bytes: d.all_reduce_bytes / k,
                all_reduce_calls: d.all_reduce_calls / k,
            }
        });
        Ok(crate::run::DeviceFigures {
            params: self.model.cfg.num_params(),
            peak_saved_bytes: self.peak_saved,
            peak_device_bytes: self.peak_dev,
            nccl_per_step,
            memory: self.memory_parts(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The windowed sample picks what re-running the model over the last
    /// `ctx` tokens picks: a decoder whose cache is a list of tokens and
    /// whose logits are the CPU model's at the cache's last token, driven by
    /// `sample_windowed`, gives what `trainer::sample_rerun` gives, also past the model's positions (the prompt
    /// alone, or with the sampled tokens); the cache never holds more than them.
    #[test]
    fn windowed_sample_is_the_cpu_trainers_sample() {
        let mut cfg = octet_nn::llama::LlamaConfig::preset("tiny").unwrap();
        let prompt: Vec<u32> = b"ROMEO:\n".iter().map(|&b| u32::from(b)).collect();
        for (ctx, n) in [(64, 10), (8, 12), (5, 9), (7, 1), (3, 0)] {
            cfg.max_position_embeddings = ctx;
            let mut model = Llama::new_random(&cfg, DType::F32, None, 3).unwrap();
            let want = crate::trainer::sample_rerun(&mut model, &prompt, n, 11).unwrap();
            let v = cfg.vocab_size;
            let mut cache: Vec<u32> = Vec::new();
            let got = sample_windowed(&prompt, n, ctx, 11, |feed| {
                match feed {
                    Feed::Step(t) => cache.push(t),
                    Feed::Fill(w) => cache = w.to_vec(),
                }
                assert!(cache.len() <= ctx, "cache of {} > {ctx}", cache.len());
                let l = model.logits(&cache, 1, cache.len())?.to_f32_vec();
                Ok(l[(cache.len() - 1) * v..].to_vec())
            })
            .unwrap();
            assert_eq!(got.len(), n, "ctx {ctx}");
            assert_eq!(got, want, "ctx {ctx}, n {n}");
        }
    }

    /// The ranks' shares of a batch's counted targets add up to one, follow
    /// the counts where the data masks prompts unevenly, and are equal
    /// where nothing is masked; a batch with nothing counted weighs nothing.
    #[test]
    fn rank_shares_follow_the_counted_targets() {
        use octet_nn::loss::IGNORE as X;
        let full = [1, X, X, X, 2, 3, 4, 5];
        let shares: Vec<f64> = (0..2)
            .map(|r| rank_share(&full, &rows_of(&full, r, 2)))
            .collect();
        assert_eq!(shares, vec![0.2, 0.8]);
        let plain = [1, 2, 3, 4, 5, 6];
        for r in 0..3 {
            assert_eq!(rank_share(&plain, &rows_of(&plain, r, 3)), 1.0 / 3.0);
        }
        assert_eq!(rank_share(&[X, X], &[X]), 0.0);
    }
}

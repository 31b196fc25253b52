//! The one training loop, whatever the device: schedule, micro-batches,
//! evaluation, metrics, telemetry, checkpoints, the loss plot and the final
//! sample. What differs between the CPU and the GPU (how a micro-batch runs,
//! how the optimizer steps, how weights are saved and sampled) is a
//! [`Stepper`]: [`crate::trainer::train`] builds the CPU one,
//! [`crate::gpu::train_gpu_ranked`] the GPU one (any rank), the CLI's
//! `--nproc` the sharded CPU one (each thread a rank), and all call [`run`].

use crate::data::{Dataset, Split};
use crate::metrics::{MetricsWriter, StepMetrics};
use crate::optim::lr_at;
use crate::trainer::{plot_losses, Observer, RunSummary, TrainConfig};
use crate::Result;
use octet_fp8::{Role, Telemetry};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// One layer's quantization counts of a step, as the metrics record them.
pub type LayerTelemetry = Vec<(String, Role, Telemetry)>;

/// Memory a step used, as the metrics record it.
#[derive(Clone, Copy, Debug, Default)]
pub struct StepMemory {
    /// Largest saved-for-backward bytes of a micro-batch so far.
    pub saved: usize,
    /// Peak device memory in use (GPU runs).
    pub device: Option<usize>,
    /// The memory pool's peak allocated bytes (GPU runs).
    pub allocated: Option<usize>,
    /// The memory pool's peak reserved bytes (GPU runs).
    pub reserved: Option<usize>,
}

/// A stepper's figures for the run's summary ([`Stepper::finish`]).
#[derive(Clone, Debug, Default)]
pub struct DeviceFigures {
    /// Parameters of the model.
    pub params: usize,
    /// Largest saved-for-backward bytes of a micro-batch.
    pub peak_saved_bytes: usize,
    /// Peak device memory in use (GPU runs; 0 on the CPU).
    pub peak_device_bytes: usize,
    /// Sharded GPU runs: what rank 0 handed to NCCL per step.
    pub nccl_per_step: Option<octet_cuda::nccl::NcclStats>,
    /// Where the memory at the peak went (see [`RunSummary::memory`]).
    pub memory: Vec<(String, usize)>,
}

/// Each micro-batch's share of its step's counted targets (those not
/// [`octet_nn::loss::IGNORE`]; `ys` holds each one's targets): the weights
/// that [`Stepper::micro_batch`] takes. They add up to 1 (`1 / n` each where
/// nothing is masked), or are all 0 where nothing in the step counts.
pub fn micro_weights(ys: &[&[u32]]) -> Vec<f64> {
    let counted = |y: &[u32]| y.iter().filter(|&&t| t != octet_nn::loss::IGNORE).count();
    let total: usize = ys.iter().map(|y| counted(y)).sum();
    ys.iter()
        .map(|y| match total {
            0 => 0.0,
            all => counted(y) as f64 / all as f64,
        })
        .collect()
}

/// What the loop needs of a model and its optimizer on one device.
pub trait Stepper {
    /// Optimizer steps taken so far (a resumed run's start).
    fn step(&self) -> u64;
    /// Whether this process writes metrics, checkpoints, the plot and the
    /// sample (rank 0 of a sharded run; always on one device).
    fn lead(&self) -> bool {
        true
    }
    /// The plot's title after the recipe (`""`, or `", GPU"`).
    fn plot_suffix(&self) -> &'static str {
        ""
    }
    /// Whether step `step` (from 0) counts toward the run's tokens/s.
    fn timed(&self, _step: u64, _steps: u64) -> bool {
        true
    }
    /// Before the step's micro-batches: clear gradients, turn telemetry on.
    fn begin_step(&mut self, telemetry: bool) -> Result<()>;
    /// One micro-batch (the global batch's tokens `x` and targets `y`):
    /// forward and backward, its gradient (that of its mean loss over its
    /// counted targets, times `weight`) added to the step's. Returns its
    /// mean loss times `weight`. `weight` is the micro-batch's share of the
    /// step's counted targets (those not [`octet_nn::loss::IGNORE`]), so
    /// that the step's loss and gradient are their mean over the whole step
    /// however the data masks them; `1 / --grad-accum` where nothing is
    /// masked. `round` is the micro-batch's index over the run (dropout and
    /// stochastic rounding follow it); `step` and `lr` name the step in errors.
    fn micro_batch(
        &mut self,
        x: &[u32],
        y: &[u32],
        round: u64,
        step: u64,
        lr: f32,
        weight: f64,
    ) -> Result<f64>;
    /// The optimizer's update at `lr` after the micro-batches: the gradient
    /// norm, and the step's telemetry when `telemetry` (the step's own casts).
    fn update(&mut self, lr: f32, step: u64, telemetry: bool) -> Result<(f32, LayerTelemetry)>;
    /// The step's loss from this process's sum of its micro-batches' weighted
    /// losses (with ranks, the sum of the ranks' shares).
    fn step_loss(&self, local: f64) -> Result<f64> {
        Ok(local)
    }
    /// Memory used so far.
    fn memory(&self) -> Result<StepMemory>;
    /// Mean validation loss over `n` batches.
    fn evaluate(&mut self, data: &Dataset, cfg: &TrainConfig, n: usize) -> Result<f64>;
    /// Write a checkpoint into `dir`'s `checkpoints/` (`None` where this
    /// process writes nothing).
    fn save(&mut self, dir: &Path, run: (&str, Option<&Path>)) -> Result<Option<PathBuf>>;
    /// `n` tokens sampled after `prompt` (empty where this process does
    /// not sample; every rank of a sharded run calls it).
    fn sample(&mut self, prompt: &[u32], n: usize, seed: u64) -> Result<Vec<u32>>;
    /// After the last step: notes on where the time went, and the summary's
    /// device figures.
    fn finish(&mut self, steps_run: usize, obs: &mut dyn Observer) -> Result<DeviceFigures>;
}

/// Train `stepper` to `cfg.steps` on `data`, writing into `dir`; `resume`
/// is the checkpoint the stepper was restored from (its curves start the
/// plot). The summary's device figures come from [`Stepper::finish`].
pub fn run(
    cfg: &TrainConfig,
    resume: Option<&Path>,
    data: &Dataset,
    dir: &Path,
    recipe_name: &str,
    stepper: &mut dyn Stepper,
    obs: &mut dyn Observer,
) -> Result<RunSummary> {
    let lead = stepper.lead();
    let mut metrics = match lead {
        true => Some(MetricsWriter::open(&dir.join("metrics.jsonl"))?),
        false => None,
    };
    let trainer_json =
        serde_json::to_string(cfg).map_err(|e| crate::Error::Train(e.to_string()))?;
    // A resumed run's plot starts with the steps before its checkpoint.
    let (mut curve, mut val_curve) = match resume {
        Some(ck) if lead => crate::metrics::curves_before(ck, stepper.step()),
        _ => (Vec::new(), Vec::new()),
    };
    let t0 = Instant::now();
    let mut losses = Vec::new();
    let (mut tok_total, mut time_total) = (0usize, 0f64);
    let mut last_val = f64::NAN;
    let tokens_per_step = cfg.batch * cfg.seq * cfg.grad_accum;
    while stepper.step() < cfg.steps {
        let step = stepper.step();
        let ts = Instant::now();
        let lr = lr_at(step, cfg.warmup, cfg.steps, cfg.lr, cfg.min_lr);
        let telemetry = cfg.telemetry_every > 0 && (step + 1).is_multiple_of(cfg.telemetry_every);
        stepper.begin_step(telemetry)?;
        // The step's micro-batches first: each one's weight is its share of
        // the step's counted targets.
        let rounds = (0..cfg.grad_accum as u64).map(|micro| step * cfg.grad_accum as u64 + micro);
        let batches = rounds
            .map(|round| {
                Ok((
                    round,
                    data.batch(Split::Train, cfg.batch, cfg.seq, cfg.seed, round)?,
                ))
            })
            .collect::<Result<Vec<_>>>()?;
        let ys: Vec<&[u32]> = batches.iter().map(|(_, (_, y))| y.as_slice()).collect();
        let weights = micro_weights(&ys);
        let mut loss_sum = 0.0;
        for ((round, (x, y)), weight) in batches.iter().zip(weights) {
            loss_sum += stepper.micro_batch(x, y, *round, step, lr, weight)?;
        }
        let (grad_norm, layers) = stepper.update(lr, step, telemetry)?;
        let dt = ts.elapsed().as_secs_f64();
        if stepper.timed(step, cfg.steps) {
            tok_total += tokens_per_step;
            time_total += dt;
        }
        let loss = stepper.step_loss(loss_sum)?;
        let done = stepper.step();
        losses.push(loss);
        curve.push((done as f64, loss));
        let mem = stepper.memory()?;
        let mut m = StepMetrics {
            step: done,
            loss,
            val_loss: None,
            lr,
            grad_norm,
            tokens_per_s: tokens_per_step as f64 / dt,
            elapsed_s: t0.elapsed().as_secs_f64(),
            saved_bytes: mem.saved,
            device_bytes: mem.device,
            allocated_bytes: mem.allocated,
            reserved_bytes: mem.reserved,
        };
        let last = done == cfg.steps;
        if cfg.eval_batches > 0
            && ((cfg.eval_every > 0 && done.is_multiple_of(cfg.eval_every)) || last)
        {
            if last && lead {
                obs.note(&format!(
                    "step {done}: final evaluation over {} validation batches",
                    cfg.eval_batches
                ));
            }
            let te = Instant::now();
            last_val = stepper.evaluate(data, cfg, cfg.eval_batches)?;
            tracing::debug!(
                step = done,
                batches = cfg.eval_batches,
                s = te.elapsed().as_secs_f64(),
                "evaluated"
            );
            m.val_loss = Some(last_val);
            val_curve.push((done as f64, last_val));
            obs.note(&format!("step {done}: val loss {last_val:.4}"));
        }
        if let Some(mw) = metrics.as_mut() {
            mw.write(&m)?;
            if telemetry {
                if let Some(r) = crate::metrics::telemetry_record(done, layers) {
                    mw.write(&r)?;
                }
            }
        }
        obs.step(&m, cfg.steps);
        if cfg.save && ((cfg.ckpt_every > 0 && done.is_multiple_of(cfg.ckpt_every)) || last) {
            let tok = cfg.tokenizer_files();
            if let Some(p) = stepper.save(dir, (trainer_json.as_str(), tok.as_deref()))? {
                obs.note(&format!("checkpoint {}", p.display()));
            }
        }
    }
    if lead {
        plot_losses(
            dir,
            &format!("train ({recipe_name}{})", stepper.plot_suffix()),
            cfg.tokenizer()?.loss_label(),
            curve,
            val_curve,
            obs,
        );
    }
    let figures = stepper.finish(losses.len(), obs)?;
    let mut sample = String::new();
    if cfg.sample_tokens > 0 {
        let tok = cfg.tokenizer()?;
        let prompt = tok.encode("ROMEO:\n");
        if lead {
            obs.note(&format!("sampling {} tokens", cfg.sample_tokens));
        }
        let ts = Instant::now();
        let toks = stepper.sample(&prompt, cfg.sample_tokens, cfg.seed)?;
        tracing::debug!(
            tokens = cfg.sample_tokens,
            s = ts.elapsed().as_secs_f64(),
            "sampled"
        );
        if lead {
            sample = tok.decode(&toks);
        }
    }
    Ok(RunSummary {
        dir: dir.to_path_buf(),
        recipe: recipe_name.to_string(),
        final_loss: losses.last().copied().unwrap_or(f64::NAN),
        final_val_loss: last_val,
        tokens_per_s: if time_total > 0.0 {
            tok_total as f64 / time_total
        } else {
            0.0
        },
        peak_saved_bytes: figures.peak_saved_bytes,
        losses,
        sample,
        params: figures.params,
        peak_device_bytes: figures.peak_device_bytes,
        nccl_per_step: figures.nccl_per_step,
        memory: figures.memory,
    })
}

#[cfg(test)]
mod tests {
    use super::micro_weights;
    use octet_nn::loss::IGNORE as X;

    /// The weights follow the counted targets where the data masks unevenly,
    /// are equal where nothing is masked, and are 0 where nothing counts.
    #[test]
    fn micro_batches_weigh_by_their_counted_targets() {
        let (a, b): (&[u32], &[u32]) = (&[1, X, X, X], &[1, 2, 3, X]);
        assert_eq!(micro_weights(&[a, b]), vec![0.25, 0.75]);
        let plain: &[u32] = &[1, 2, 3];
        assert_eq!(micro_weights(&[plain, plain, plain, plain]), vec![0.25; 4]);
        assert_eq!(micro_weights(&[plain]), vec![1.0]);
        let none: &[u32] = &[X, X];
        assert_eq!(micro_weights(&[none, none]), vec![0.0, 0.0]);
    }
}

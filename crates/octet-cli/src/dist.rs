//! `octet train --nproc N` on the CPU: N ranks as threads of this process
//! (`octet_dist::ThreadComm`), the parameters sharded on their first
//! dimension, block weights all-gathered in FP8 under an FP8 recipe,
//! gradients reduce-scattered, AdamW on each shard. Each rank runs the one
//! training loop (`octet_train::run`) over an [`FsdpStepper`]; rank 0 writes
//! the metrics, checkpoints, plot and sample.

use crate::train::{bar, Bar};
use octet_dist::{local_batch, spawn_ranks, Communicator, FsdpConfig, FsdpRank, ThreadComm};
use octet_nn::llama::Llama;
use octet_tensor::DType;
use octet_train::checkpoint;
use octet_train::data::Dataset;
use octet_train::run::{DeviceFigures, LayerTelemetry, StepMemory, Stepper};
use octet_train::trainer::{evaluate, Observer, Quiet, RunSummary, TrainConfig};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// What rank 0 reports at the end.
struct Summary {
    run: RunSummary,
    fp8_gather_bytes: u64,
    hp_gather_bytes: u64,
    /// Steps this run took (from its start or its checkpoint to `--steps`).
    steps: u64,
}

/// A sharded error as the loop's.
fn te(e: octet_dist::Error) -> octet_train::Error {
    octet_train::Error::Train(e.to_string())
}

/// One rank of the sharded CPU run under the one loop: a step is one
/// `FsdpRank::step` (gather, forward and backward on the rank's rows,
/// reduce-scatter, AdamW on its shards); evaluation, checkpoints and the
/// sample gather the full model (collectives: every rank takes part) and
/// rank 0 uses it.
struct FsdpStepper<'a> {
    rank: FsdpRank,
    comm: &'a ThreadComm,
    cfg: &'a TrainConfig,
    world: usize,
    /// The last step's gradient norm (`FsdpRank::step` also updates).
    grad_norm: f32,
    peak_saved: usize,
    fp8_gather_bytes: u64,
    hp_gather_bytes: u64,
    /// The full model gathered at the step it holds (evaluation, the
    /// checkpoint and the sample of one step share one gather); dropped when
    /// the next step begins.
    gathered: Option<(u64, Llama)>,
}

impl FsdpStepper<'_> {
    /// The full model at this step, gathered once (a collective: every rank
    /// calls this at the same points, so every rank gathers or none does).
    fn full(&mut self) -> octet_train::Result<&mut Llama> {
        let step = self.step();
        if self.gathered.as_ref().is_none_or(|(s, _)| *s != step) {
            let full = self.rank.gathered_model(self.comm).map_err(te)?;
            self.gathered = Some((step, full));
        }
        match self.gathered.as_mut() {
            Some((_, full)) => Ok(full),
            None => Err(octet_train::Error::Train("no gathered model".into())),
        }
    }
}

impl Stepper for FsdpStepper<'_> {
    fn step(&self) -> u64 {
        self.rank.step_count()
    }

    fn lead(&self) -> bool {
        self.comm.rank() == 0
    }

    fn begin_step(&mut self, _telemetry: bool) -> octet_train::Result<()> {
        self.gathered = None;
        Ok(())
    }

    fn micro_batch(
        &mut self,
        x: &[u32],
        y: &[u32],
        _round: u64,
        _step: u64,
        lr: f32,
        weight: f64,
    ) -> octet_train::Result<f64> {
        let cfg = self.cfg;
        let (lx, ly, per) =
            local_batch(x, y, cfg.batch, cfg.seq, self.comm.rank(), self.world).map_err(te)?;
        let out = self
            .rank
            .step(self.comm, &lx, &ly, per, cfg.seq, lr)
            .map_err(te)?;
        self.grad_norm = out.grad_norm;
        self.peak_saved = self.peak_saved.max(out.saved_bytes);
        self.fp8_gather_bytes = out.block_gather_bytes;
        self.hp_gather_bytes = out
            .comm
            .bytes(octet_dist::CollectiveKind::AllGather)
            .saturating_sub(out.block_gather_bytes);
        // One micro-batch a step (`--grad-accum 1`): `weight` is 1, or 0
        // where nothing counts; `FsdpRank::step` weights the ranks itself.
        Ok(out.loss * weight)
    }

    fn update(
        &mut self,
        _lr: f32,
        _step: u64,
        telemetry: bool,
    ) -> octet_train::Result<(f32, LayerTelemetry)> {
        // Rank 0's quantizations of this step, as one process writes them.
        let layers = match telemetry {
            true => self.rank.model().telemetry(),
            false => Vec::new(),
        };
        Ok((self.grad_norm, layers))
    }

    fn memory(&self) -> octet_train::Result<StepMemory> {
        Ok(StepMemory {
            saved: self.peak_saved,
            ..Default::default()
        })
    }

    fn evaluate(
        &mut self,
        data: &Dataset,
        cfg: &TrainConfig,
        n: usize,
    ) -> octet_train::Result<f64> {
        let lead = self.lead();
        let full = self.full()?;
        match lead {
            true => evaluate(full, data, cfg, n),
            false => Ok(f64::NAN),
        }
    }

    fn save(
        &mut self,
        dir: &Path,
        (trainer_json, tok): (&str, Option<&Path>),
    ) -> octet_train::Result<Option<PathBuf>> {
        let (lead, step) = (self.lead(), self.step());
        let opt = self.rank.gather_optimizer(self.comm).map_err(te)?;
        let full = self.full()?;
        if !lead {
            return Ok(None);
        }
        let p = checkpoint::save_checkpoint(
            &dir.join("checkpoints"),
            &format!("step_{step:06}"),
            full,
            &opt,
            trainer_json,
            tok,
        )?;
        Ok(Some(p))
    }

    fn sample(&mut self, prompt: &[u32], n: usize, seed: u64) -> octet_train::Result<Vec<u32>> {
        let lead = self.lead();
        let full = self.full()?;
        match lead {
            true => octet_train::trainer::sample(full, prompt, n, seed),
            false => Ok(Vec::new()),
        }
    }

    fn finish(
        &mut self,
        _steps_run: usize,
        _obs: &mut dyn Observer,
    ) -> octet_train::Result<DeviceFigures> {
        Ok(DeviceFigures {
            params: self.rank.model().cfg.num_params(),
            peak_saved_bytes: self.peak_saved,
            ..Default::default()
        })
    }
}

/// Rank 0's observer: the run's progress bar, shared with the threads.
struct SharedBar<'a>(&'a Mutex<Bar>);

impl Observer for SharedBar<'_> {
    fn step(&mut self, m: &octet_train::metrics::StepMetrics, total: u64) {
        if let Ok(mut o) = self.0.lock() {
            o.step(m, total);
        }
    }
    fn note(&mut self, msg: &str) {
        if let Ok(mut o) = self.0.lock() {
            o.note(msg);
        }
    }
}

pub fn run(cfg: &TrainConfig, n: usize, resume: Option<&std::path::Path>) -> anyhow::Result<()> {
    anyhow::ensure!(
        cfg.grad_accum == 1,
        "--nproc splits the global batch over ranks; use --grad-accum 1"
    );
    anyhow::ensure!(cfg.lora.is_none(), "--nproc with LoRA is not supported yet");
    anyhow::ensure!(
        resume.is_none() || cfg.init.is_none(),
        "--resume continues a run; --init starts a new one from weights: give one"
    );
    anyhow::ensure!(
        cfg.batch.is_multiple_of(n),
        "--batch {} (the global batch) does not split over {n} ranks",
        cfg.batch
    );
    cfg.check_resume(resume)?;
    let recipe = cfg.recipe()?;
    let mcfg = cfg.llama_config()?;
    let data = cfg.dataset(mcfg.vocab_size)?;
    // `--init`: read (and merge) the starting weights once; each rank takes a copy.
    let init = match resume {
        Some(_) => None,
        None => cfg.init_weights()?,
    };
    let dir = cfg.out_dir.join(&cfg.name);
    octet_train::create_dir_all(&dir)?;
    let obs = Mutex::new(bar(&format!("train x{n}")));
    let label = format!("x{n}, {}", cfg.run_label()?);
    let summary: Mutex<Option<Summary>> = Mutex::new(None);
    spawn_ranks(n, |comm: &ThreadComm| -> octet_dist::Result<()> {
        let dist_err = |e: String| octet_dist::Error::Config(e);
        let fcfg = FsdpConfig {
            adamw: cfg.adamw,
            grad_wire: if cfg.grad_reduce == "bf16" {
                octet_dist::Wire::Bf16
            } else {
                octet_dist::Wire::F32
            },
            ..Default::default()
        };
        // A checkpoint from any number of ranks is one full model and optimizer:
        // every rank loads it and keeps its own shard.
        let rank = match resume {
            Some(ck) => {
                let load = || -> octet_train::Result<(Llama, octet_train::optim::AdamW)> {
                    let c = checkpoint::load_config(ck)?;
                    let w = checkpoint::load_weights(ck, DType::F32)?;
                    let mut model = Llama::from_weights(&c, w, recipe)?;
                    let (opt, _) = checkpoint::load_optimizer(ck, &mut model)?;
                    opt.write_back(model.params_mut())?;
                    Ok((model, opt))
                };
                let (mut model, opt) = load().map_err(|e| dist_err(e.to_string()))?;
                model.set_recompute(cfg.recomputed_blocks());
                FsdpRank::from_optimizer(comm, model, &opt, fcfg)?
            }
            None => {
                let mut model = match &init {
                    Some((c, w)) => Llama::from_weights(c, w.clone(), recipe),
                    None => Llama::new_random(&mcfg, DType::F32, recipe, cfg.seed),
                }
                .map_err(|e| dist_err(e.to_string()))?;
                model.set_recompute(cfg.recomputed_blocks());
                FsdpRank::new(comm, model, fcfg)?
            }
        };
        let first = rank.step_count();
        let mut stepper = FsdpStepper {
            rank,
            comm,
            cfg,
            world: n,
            grad_norm: 0.0,
            peak_saved: 0,
            fp8_gather_bytes: 0,
            hp_gather_bytes: 0,
            gathered: None,
        };
        let (mut shared, mut quiet) = (SharedBar(&obs), Quiet);
        let o: &mut dyn Observer = match comm.rank() {
            0 => &mut shared,
            _ => &mut quiet,
        };
        let run = octet_train::run::run(cfg, resume, &data, &dir, &label, &mut stepper, o)
            .map_err(|e| dist_err(e.to_string()))?;
        if comm.rank() == 0 {
            if let Ok(mut s) = summary.lock() {
                *s = Some(Summary {
                    run,
                    fp8_gather_bytes: stepper.fp8_gather_bytes,
                    hp_gather_bytes: stepper.hp_gather_bytes,
                    steps: cfg.steps.saturating_sub(first),
                });
            }
        }
        Ok(())
    })?;
    if let Ok(o) = obs.lock() {
        o.bar.finish();
    }
    let s = summary
        .into_inner()
        .ok()
        .flatten()
        .ok_or_else(|| anyhow::anyhow!("rank 0 reported nothing"))?;
    println!(
        "\n{n} ranks (threads), recipe {}: final train loss {:.4}, val {}, {:.0} tokens/s over {} steps",
        recipe.map_or("bf16".into(), |r| r.to_string()),
        s.run.final_loss,
        match s.run.final_val_loss.is_finite() {
            true => format!("{:.4}", s.run.final_val_loss),
            false => "-".into(),
        },
        s.run.tokens_per_s,
        s.steps
    );
    println!(
        "per step and rank: block weights all-gathered {} bytes{}, other parameters {} bytes",
        s.fp8_gather_bytes,
        if recipe.is_some() {
            " (FP8 codes + scales)"
        } else {
            ""
        },
        s.hp_gather_bytes
    );
    if !s.run.sample.is_empty() {
        println!("\nsample:\n{}\n", s.run.sample);
    }
    if cfg.save {
        println!(
            "wrote {}/metrics.jsonl, loss.png and checkpoints/ (a single-file checkpoint, loads at any N)",
            dir.display()
        );
    } else {
        println!(
            "wrote {}/metrics.jsonl and loss.png (no checkpoint: --no-save)",
            dir.display()
        );
    }
    Ok(())
}

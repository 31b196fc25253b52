//! `octet train --nproc N` on the CPU: N ranks as threads of this process
//! (`octet_dist::ThreadComm`), the parameters sharded on their first
//! dimension, block weights all-gathered in FP8 under an FP8 recipe,
//! gradients reduce-scattered, AdamW on each shard. The same code path as
//! multi-GPU training once an NCCL communicator implements the trait.

use crate::train::bar;
use octet_dist::{local_batch, spawn_ranks, Communicator, FsdpConfig, FsdpRank, ThreadComm};
use octet_nn::llama::Llama;
use octet_tensor::DType;
use octet_train::checkpoint;
use octet_train::data::Split;
use octet_train::metrics::{MetricsWriter, StepMetrics};
use octet_train::optim::lr_at;
use octet_train::trainer::{evaluate, Observer, TrainConfig};
use std::sync::Mutex;
use std::time::Instant;

/// What rank 0 reports at the end.
struct Summary {
    final_loss: f64,
    /// `None` with `--eval-batches 0`.
    val_loss: Option<f64>,
    tokens_per_s: f64,
    fp8_gather_bytes: u64,
    hp_gather_bytes: u64,
    /// Steps this run took (from its start or its checkpoint to `--steps`).
    steps: u64,
    /// `--sample-tokens` of text from the gathered model, if asked for.
    sample: Option<String>,
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
    let metrics = Mutex::new(MetricsWriter::open(&dir.join("metrics.jsonl"))?);
    let obs = Mutex::new(bar(&format!("train x{n}")));
    let trainer_json = serde_json::to_string(cfg)?;
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
        let mut rank = match resume {
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
        let (mut fp8_bytes, mut hp_bytes, mut time, mut last) = (0u64, 0u64, 0f64, f64::NAN);
        let mut peak_saved = 0usize;
        let mut last_val = None;
        let t0 = Instant::now();
        for step in first..cfg.steps {
            let ts = Instant::now();
            let (x, y) = data
                .batch(Split::Train, cfg.batch, cfg.seq, cfg.seed, step)
                .map_err(|e| dist_err(e.to_string()))?;
            let (lx, ly, per) = local_batch(&x, &y, cfg.batch, cfg.seq, comm.rank(), n)?;
            let lr = lr_at(step, cfg.warmup, cfg.steps, cfg.lr, cfg.min_lr);
            let out = rank.step(comm, &lx, &ly, per, cfg.seq, lr)?;
            let dt = ts.elapsed().as_secs_f64();
            time += dt;
            last = out.loss;
            peak_saved = peak_saved.max(out.saved_bytes);
            fp8_bytes = out.block_gather_bytes;
            hp_bytes = out
                .comm
                .bytes(octet_dist::CollectiveKind::AllGather)
                .saturating_sub(out.block_gather_bytes);
            let done = step + 1;
            let ckpt =
                cfg.save && cfg.ckpt_every > 0 && done % cfg.ckpt_every == 0 && done < cfg.steps;
            // Evaluation at the steps the single-process trainer takes: every
            // --eval-every steps and the last one (with --eval-batches > 0).
            let eval_now = cfg.eval_batches > 0
                && ((cfg.eval_every > 0 && done % cfg.eval_every == 0) || done == cfg.steps);
            let mut val_loss = None;
            if ckpt || eval_now {
                // Gathering is a collective: every rank takes part, rank 0 writes and evaluates.
                let mut full = rank.gathered_model(comm)?;
                if ckpt {
                    let opt = rank.gather_optimizer(comm)?;
                    if comm.rank() == 0 {
                        checkpoint::save_checkpoint(
                            &dir.join("checkpoints"),
                            &format!("step_{done:06}"),
                            &full,
                            &opt,
                            &trainer_json,
                            cfg.tokenizer_files().as_deref(),
                        )
                        .map_err(|e| dist_err(e.to_string()))?;
                    }
                }
                if eval_now && comm.rank() == 0 {
                    let v = evaluate(&mut full, &data, cfg, cfg.eval_batches)
                        .map_err(|e| dist_err(e.to_string()))?;
                    val_loss = Some(v);
                    last_val = Some(v);
                    if let Ok(mut o) = obs.lock() {
                        o.note(&format!("step {done}: val loss {v:.4}"));
                    }
                }
            }
            if comm.rank() == 0 {
                let m = StepMetrics {
                    step: step + 1,
                    loss: out.loss,
                    val_loss,
                    lr,
                    grad_norm: out.grad_norm,
                    tokens_per_s: (cfg.batch * cfg.seq) as f64 / dt,
                    elapsed_s: t0.elapsed().as_secs_f64(),
                    saved_bytes: peak_saved,
                    device_bytes: None,
                    allocated_bytes: None,
                    reserved_bytes: None,
                };
                if let Ok(mut w) = metrics.lock() {
                    w.write(&m).map_err(|e| dist_err(e.to_string()))?;
                    // Rank 0's quantizations of this step, as one process writes them.
                    if cfg.telemetry_every > 0 && done % cfg.telemetry_every == 0 {
                        let layers = rank.model().telemetry();
                        if let Some(r) = octet_train::metrics::telemetry_record(done, layers) {
                            w.write(&r).map_err(|e| dist_err(e.to_string()))?;
                        }
                    }
                }
                if let Ok(mut o) = obs.lock() {
                    o.step(&m, cfg.steps);
                }
            }
        }
        // The final checkpoint, and the evaluation where the loop took no
        // last step (a run resumed at its end), on the gathered model
        // (collectives: every rank, or none: the same on every rank).
        let final_eval = cfg.eval_batches > 0 && first >= cfg.steps;
        let gathered = match cfg.save || final_eval || cfg.sample_tokens > 0 {
            true => Some((rank.gathered_model(comm)?, rank.gather_optimizer(comm)?)),
            false => None,
        };
        if comm.rank() == 0 {
            let mut val = last_val;
            let mut sample = None;
            if let Some((mut full, opt)) = gathered {
                if final_eval {
                    val = Some(
                        evaluate(&mut full, &data, cfg, cfg.eval_batches)
                            .map_err(|e| dist_err(e.to_string()))?,
                    );
                }
                if cfg.save {
                    checkpoint::save_checkpoint(
                        &dir.join("checkpoints"),
                        &format!("step_{:06}", cfg.steps),
                        &full,
                        &opt,
                        &trainer_json,
                        cfg.tokenizer_files().as_deref(),
                    )
                    .map_err(|e| dist_err(e.to_string()))?;
                }
                // The text a one-process run prints, from the same prompt and seed.
                if cfg.sample_tokens > 0 {
                    if let Ok(mut o) = obs.lock() {
                        o.note(&format!("sampling {} tokens", cfg.sample_tokens));
                    }
                    let text = (|| -> octet_train::Result<String> {
                        let tok = cfg.tokenizer()?;
                        let prompt = tok.encode("ROMEO:\n");
                        let toks = octet_train::trainer::sample(
                            &full,
                            &prompt,
                            cfg.sample_tokens,
                            cfg.seed,
                        )?;
                        Ok(tok.decode(&toks))
                    })()
                    .map_err(|e| dist_err(e.to_string()))?;
                    sample = Some(text);
                }
            }
            if let Ok(mut s) = summary.lock() {
                *s = Some(Summary {
                    final_loss: last,
                    val_loss: val,
                    tokens_per_s: (cfg.batch * cfg.seq) as f64
                        * cfg.steps.saturating_sub(first) as f64
                        / time.max(1e-9),
                    fp8_gather_bytes: fp8_bytes,
                    hp_gather_bytes: hp_bytes,
                    steps: cfg.steps.saturating_sub(first),
                    sample,
                });
            }
        }
        Ok(())
    })?;
    if let Ok(mut o) = obs.lock() {
        o.bar.finish();
        let (train, val) = octet_train::metrics::curves_of_run(&dir, cfg.steps);
        octet_train::trainer::plot_losses(
            &dir,
            &format!("train x{n} ({})", cfg.run_label()?),
            cfg.tokenizer()?.loss_label(),
            train,
            val,
            &mut *o,
        );
    }
    let s = summary
        .into_inner()
        .ok()
        .flatten()
        .ok_or_else(|| anyhow::anyhow!("rank 0 reported nothing"))?;
    println!(
        "\n{n} ranks (threads), recipe {}: final train loss {:.4}, val {}, {:.0} tokens/s over {} steps",
        recipe.map_or("bf16".into(), |r| r.to_string()),
        s.final_loss,
        s.val_loss.map_or("-".into(), |v| format!("{v:.4}")),
        s.tokens_per_s,
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
    if let Some(text) = &s.sample {
        println!("\nsample:\n{text}\n");
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

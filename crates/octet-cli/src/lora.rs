//! `octet lora`: LoRA fine-tuning on a frozen base stored in FP8 (or bf16),
//! and `octet lora merge`.

use crate::train::{bar, summary_table, TrainArgs};
use anyhow::Context;
use octet_nn::llama::Llama;
use octet_nn::lora::BaseFormat;
use octet_tensor::mixed::WeightScaling;
use octet_tensor::DType;
use octet_train::checkpoint;
use octet_train::plot::{line_plot, Series};
use octet_train::trainer::{merge_adapter, train, LoraSettings};
use std::path::{Path, PathBuf};

/// Flags of `octet lora`.
#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct LoraArgs {
    #[command(subcommand)]
    cmd: Option<LoraCmd>,
    /// Base checkpoint directory (config.json + model.safetensors), or a run
    /// directory (`runs/NAME`: its latest checkpoint). Default:
    /// with `--resume`, the base the adapter records (a directory, or a
    /// random base); else the latest checkpoint of `runs/default` if there is
    /// one, else a random base. A resume on a base other than the recorded
    /// one is an error.
    #[arg(long)]
    base: Option<PathBuf>,
    /// Adapter rank [default: 16; with `--resume`, the checkpoint's, and
    /// another value is an error].
    #[arg(long)]
    rank: Option<usize>,
    /// Adapter alpha, output scaled by alpha / rank [default: 32; with
    /// `--resume`, the checkpoint's, and another value is an error].
    #[arg(long)]
    alpha: Option<f64>,
    /// Targeted projections [default: q,k,v,o,gate,up,down; with `--resume`,
    /// the checkpoint's, and others are an error].
    #[arg(long)]
    targets: Option<String>,
    /// How the frozen base is stored: fp8-tensorwise, fp8-rowwise, fp8-block,
    /// bf16 [default: with `--resume`, what the adapter records, and another
    /// value is an error; else the config file's `lora.base_format`, else
    /// fp8-tensorwise].
    #[arg(long)]
    base_format: Option<String>,
    /// fp8 (FP8 GEMMs) or bf16 (activations in high precision, FP8 weights
    /// upcast in the product) [default: with `--resume`, what the adapter
    /// records, and another value is an error; else the config file's
    /// `lora.compute`, else fp8].
    #[arg(long)]
    compute: Option<String>,
    /// LoRA dropout on the adapters' inputs (PEFT's lora_dropout), in [0, 1)
    /// [default: with `--resume`, the adapter's, and another value is an
    /// error; else the config file's `lora.dropout`, else 0].
    #[arg(long)]
    lora_dropout: Option<f64>,
    /// Also run the same LoRA on a bf16 base and compare the two.
    #[arg(long)]
    compare_bf16: bool,
    #[command(flatten)]
    train: TrainArgs,
}

#[derive(clap::Subcommand)]
enum LoraCmd {
    /// Merge an adapter into its base: W + (alpha/r) B A, written as a full checkpoint.
    Merge(MergeArgs),
}

#[derive(clap::Args)]
struct MergeArgs {
    /// Base checkpoint directory, or a run directory (`runs/NAME`: its
    /// latest checkpoint).
    #[arg(long)]
    base: PathBuf,
    /// Adapter directory (adapter_config.json + adapter_model.safetensors),
    /// or a LoRA run directory (its latest checkpoint).
    #[arg(long)]
    adapter: PathBuf,
    /// Output checkpoint directory.
    #[arg(long)]
    out: PathBuf,
    /// The base the adapter was trained on (merge onto what training saw).
    /// Default: what the adapter records (`octet_lora.json`), else
    /// fp8-tensorwise.
    #[arg(long)]
    base_format: Option<String>,
    /// Dtype of the written weights: bf16, f32, or fp8 (the block matrices
    /// re-quantized to E4M3 with `--base-format`'s scaling, per channel when
    /// that is bf16, the other tensors in bf16).
    #[arg(long, default_value = "bf16")]
    dtype: String,
}

/// What a resumed adapter checkpoint records (`--resume`): the flags not
/// given take these values.
struct Trained {
    rank: usize,
    alpha: f64,
    targets: Vec<String>,
    /// `base_model_name_or_path`.
    base: Option<String>,
    /// `octet_lora.json`: base format and compute.
    record: Option<checkpoint::LoraRecord>,
    /// `lora_dropout`.
    dropout: Option<f64>,
}

pub fn run(mut a: LoraArgs) -> anyhow::Result<()> {
    a.train.resolve_resume()?;
    if let Some(LoraCmd::Merge(m)) = a.cmd {
        return merge(m);
    }
    // LoRA runs one process (no sharded LoRA yet).
    a.train.refuse_sharding("octet lora")?;
    let mut cfg = a.train.config_with(|c| {
        c.name = "lora".into();
        c.steps = 200;
        c.lr = 1e-3;
        c.min_lr = 1e-4;
        c.warmup = 20;
        c.backward = "dequantized".into();
    })?;
    // A resumed adapter keeps what it was trained with: the flags not given
    // take the checkpoint's values, and `check_resume` refuses the others.
    let resume = a.train.resume.as_deref();
    let trained = match resume {
        Some(ck) => {
            let not_lora = || {
                format!(
                    "--resume {}: not a LoRA checkpoint (adapter_config.json)",
                    ck.display()
                )
            };
            let (rank, alpha, targets) =
                checkpoint::load_adapter_config(ck).with_context(not_lora)?;
            Some(Trained {
                rank,
                alpha,
                targets,
                base: checkpoint::load_adapter_base(ck).with_context(not_lora)?,
                record: checkpoint::load_lora_record(ck)?,
                dropout: checkpoint::load_adapter_dropout(ck)?,
            })
        }
        None => None,
    };
    // A `[lora]` table of the config file (its missing keys at their
    // defaults) comes after the flags and a resumed adapter's values.
    let defaults = cfg.lora.take().unwrap_or_default();
    let base = match (&a.base, trained.as_ref().and_then(|t| t.base.as_deref())) {
        (Some(b), _) => Some(checkpoint::resolve_checkpoint_dir(b)?),
        (None, Some(checkpoint::RANDOM_BASE)) => None,
        (None, Some(recorded)) => Some(PathBuf::from(recorded)),
        // No record (an adapter saved before octet wrote one).
        // A random base where there is no `latest` (an error where it names no
        // checkpoint).
        (None, None) => match &defaults.base {
            Some(b) => Some(checkpoint::resolve_checkpoint_dir(b)?),
            None => checkpoint::latest_checkpoint(Path::new("runs/default/checkpoints")).context(
                "the default base (pass --base DIR; with no latest file the base is random)",
            )?,
        },
    };
    let targets: Vec<String> = match (&a.targets, &trained) {
        (Some(t), _) => t.split(',').map(|t| t.trim().to_string()).collect(),
        // PEFT's module names (`q_proj`) as the flag gives them (`q`).
        (None, Some(t)) => t
            .targets
            .iter()
            .map(|m| m.trim_end_matches("_proj").to_string())
            .collect(),
        (None, None) => defaults.targets.clone(),
    };
    let rank = a
        .rank
        .or(trained.as_ref().map(|t| t.rank))
        .unwrap_or(defaults.rank);
    let alpha = a
        .alpha
        .or(trained.as_ref().map(|t| t.alpha))
        .unwrap_or(defaults.alpha);
    let record = trained.as_ref().and_then(|t| t.record.as_ref());
    let mut base_format = a
        .base_format
        .clone()
        .or(record.map(|r| r.base_format.clone()))
        .unwrap_or(defaults.base_format);
    // A base whose block matrices are stored in FP8 keeps them as stored
    // under any FP8 form: the run reports and records the stored form, and a
    // `--base-format` naming another is an error, not a label. (Matrices
    // stored with different scalings keep the form asked for as the label.)
    if let (Some(dir), true) = (&base, base_format != "bf16") {
        if let Some(Some(stored)) = checkpoint::stored_fp8_scaling(dir)? {
            let name = octet_nn::lora::BaseFormat::Fp8(stored).name();
            let given = a.base_format.as_deref();
            if let Some(flag) = given.filter(|f| {
                octet_nn::lora::BaseFormat::from_name(f).map_or(true, |f| f.name() != name)
            }) {
                anyhow::bail!(
                    "--base-format {flag}: the base {} stores its block matrices in FP8 ({name}), \
                     which LoRA keeps as stored; drop the flag, or give bf16 to train on their \
                     dequantized values",
                    dir.display()
                );
            }
            base_format = name.to_string();
        }
    }
    let compute = a
        .compute
        .clone()
        .or(record.map(|r| r.compute.clone()))
        .unwrap_or(defaults.compute);
    cfg.lora = Some(LoraSettings {
        base: base.clone(),
        rank,
        alpha,
        targets: targets.clone(),
        base_format: base_format.clone(),
        compute: compute.clone(),
        dropout: a
            .lora_dropout
            .or(trained.as_ref().and_then(|t| t.dropout))
            .unwrap_or(defaults.dropout),
    });
    // A base from Hugging Face brings its tokenizer (a new adapter; a
    // resumed one keeps the tokenizer its run recorded).
    if !a.train.tokenizer_given() && resume.is_none() {
        cfg.use_model_tokenizer();
    }
    // The base's FP8 products quantize their inputs by an FP8 recipe: bf16
    // there was read as the default tensorwise without a word.
    if let Some(r) = Some(cfg.recipe.as_str()).filter(|r| matches!(*r, "bf16" | "hp")) {
        anyhow::ensure!(
            compute != "fp8",
            "--recipe {r} with --compute fp8: the base's FP8 products quantize their inputs by an \
             FP8 recipe (tensorwise unless given); for bf16 products over the FP8 base give --compute bf16"
        );
    }
    cfg.validate()?;
    cfg.check_resume(resume)?;
    crate::train::warn_short_schedule(&cfg);
    let gpu = crate::gpu::open_for(
        &a.train.device,
        (compute == "fp8").then_some("--compute fp8"),
    )?;
    let gpu = crate::gpu::model_gate(gpu, &a.train.device, &cfg.llama_config()?, false)?;
    let device = match &gpu {
        Some(g) => g.info()?,
        None => format!("CPU ({} threads)", rayon::current_num_threads()),
    };
    println!(
        "octet lora: base {}, stored as {}, compute {}, rank {} alpha {} on {}; backward {}; {} steps, batch {}x{}, {device}",
        base.as_ref().map_or(format!("random {} model", cfg.model), |p| p.display().to_string()),
        base_format,
        compute,
        rank,
        alpha,
        targets.join(","),
        cfg.backward,
        cfg.steps,
        cfg.batch,
        cfg.seq,
    );
    let run = |c: &octet_train::trainer::TrainConfig,
               resume: Option<&std::path::Path>,
               obs: &mut crate::train::Bar|
     -> anyhow::Result<octet_train::trainer::RunSummary> {
        Ok(match &gpu {
            Some(g) => {
                let s = octet_train::gpu::train_gpu(c, resume, obs, g)?;
                // The next run's peak memory starts from the baseline.
                g.release_pool()?;
                s
            }
            None => train(c, resume, obs)?,
        })
    };
    // The bf16-base comparison trains from step 0 into its own directory:
    // that must be free before the first run starts.
    let compare = a.compare_bf16.then(|| {
        let mut c2 = cfg.clone();
        c2.name = format!("{}-bf16base", cfg.name);
        c2.sample_tokens = 0;
        if let Some(l) = &mut c2.lora {
            l.base_format = "bf16".into();
            l.compute = "bf16".into();
        }
        // A bf16 base has no FP8 operand: its backward is the high-precision
        // one whatever the FP8 run's (`quantized` needs an FP8 base).
        c2.backward = "high_precision".into();
        c2
    });
    if let Some(c2) = &compare {
        c2.check_run_dir(None).with_context(|| {
            format!(
                "--compare-bf16 trains a bf16-base run from step 0 into {}",
                c2.out_dir.join(&c2.name).display()
            )
        })?;
    }
    let mut runs = Vec::new();
    let mut obs = bar("lora");
    let s = run(&cfg, resume, &mut obs)?;
    obs.bar.finish();
    println!("\nsample:\n{}\n", s.sample);
    runs.push(s);
    if let Some(c2) = compare {
        let mut obs = bar("lora bf16 base");
        let s2 = run(&c2, None, &mut obs)?;
        obs.bar.finish();
        runs.push(s2);
    }
    summary_table(&runs);
    if runs.len() == 2 {
        // No validation loss (`--eval-batches 0`): no ratio, not NaN.
        let (fp8, bf16) = (runs[0].final_val_loss, runs[1].final_val_loss);
        if fp8.is_finite() && bf16.is_finite() {
            let d = 100.0 * (fp8 / bf16 - 1.0);
            println!("\nFP8 base vs bf16 base: final validation loss {d:+.2}%");
        } else {
            println!("\nFP8 base vs bf16 base: no validation loss to compare (--eval-batches 0)");
        }
        let series: Vec<Series> = runs
            .iter()
            .zip([format!("{base_format} base"), "bf16 base".to_string()])
            .map(|(r, name)| Series {
                name,
                points: r
                    .losses
                    .iter()
                    .enumerate()
                    .map(|(i, &l)| (i as f64 + 1.0, l))
                    .collect(),
            })
            .collect();
        let path = cfg.out_dir.join(format!("{}-compare-bf16.png", cfg.name));
        line_plot(
            &path,
            "LoRA training loss: FP8 base vs bf16 base",
            "step",
            cfg.tokenizer()?.loss_label(),
            &series,
        )?;
        println!("overlaid loss curves: {}", path.display());
        if gpu.is_some() && runs[1].peak_device_bytes > 0 && runs[1].tokens_per_s > 0.0 {
            println!(
                "FP8 base vs bf16 base: peak device memory {:.3}x, step time {:.3}x",
                runs[0].peak_device_bytes as f64 / runs[1].peak_device_bytes as f64,
                runs[1].tokens_per_s / runs[0].tokens_per_s
            );
        }
    }
    println!(
        "\n{}",
        crate::train::wrote(&runs[0].dir, cfg.save, " (adapter in PEFT layout)")
    );
    Ok(())
}

/// `octet lora merge --out` must be a directory of its own: not the base
/// (whose weights the merge would replace, leaving its optimizer state
/// beside weights it does not belong to), not the adapter, not another
/// training checkpoint (an `optimizer.safetensors` there would make the
/// merged model look resumable with another run's moments), and not a run
/// directory or its `checkpoints` (a `model.safetensors` there would stand
/// in for the checkpoint its `latest` names: `--resume runs/NAME` and
/// `--checkpoint runs/NAME` would read the merge instead).
fn check_merge_out(out: &Path, base: &Path, adapter: &Path) -> anyhow::Result<()> {
    let same = |a: &Path, b: &Path| match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    };
    for (what, dir) in [("the base checkpoint", base), ("the adapter", adapter)] {
        anyhow::ensure!(
            !same(out, dir),
            "--out {} is {what}: the merge writes model.safetensors there; choose a new directory",
            out.display()
        );
    }
    anyhow::ensure!(
        !out.join("optimizer.safetensors").exists(),
        "--out {} holds a training checkpoint (optimizer.safetensors); choose a new directory",
        out.display()
    );
    for latest in [out.join("latest"), out.join("checkpoints").join("latest")] {
        anyhow::ensure!(
            !latest.exists(),
            "--out {} is a run directory ({} names its checkpoint): a merge there would stand in for that checkpoint; choose a new directory",
            out.display(),
            latest.display()
        );
    }
    Ok(())
}

fn merge(m: MergeArgs) -> anyhow::Result<()> {
    let dtype = match m.dtype.as_str() {
        "bf16" => Some(DType::Bf16),
        "f32" => Some(DType::F32),
        "fp8" => None,
        other => anyhow::bail!("--dtype {other}: expected bf16, f32 or fp8"),
    };
    // Run directories name their latest checkpoint, as for `octet generate`.
    let base = checkpoint::resolve_checkpoint_dir(&m.base)?;
    let adapter = checkpoint::resolve_checkpoint_dir(&m.adapter)?;
    check_merge_out(&m.out, &m.base, &m.adapter)?;
    check_merge_out(&m.out, &base, &adapter)?;
    let merged = merge_adapter(&base, &adapter, m.base_format.as_deref())?;
    if let Some(rec) = &merged.recorded_other_base {
        eprintln!(
            "warning: the adapter {} was trained on {rec}, not on {}; merging it anyway",
            adapter.display(),
            base.display()
        );
    }
    let (r, alpha, base_format) = (merged.rank, merged.alpha, merged.base);
    let mut full = Llama::from_weights(&merged.cfg, merged.weights, None)?;
    let fp8 = match dtype {
        Some(dtype) => {
            for (_, t) in full.params_mut() {
                *t = t.to_dtype(dtype);
            }
            // Finite f32 values near f32's largest round to infinity in bf16.
            let params = full.params();
            let named = params.iter().map(|(n, t)| (n.as_str(), *t));
            octet_train::trainer::check_finite(named).map_err(|e| {
                anyhow::anyhow!("merged weights in {}: {e}; nothing is written", m.dtype)
            })?;
            None
        }
        None => {
            let scaling = match base_format {
                BaseFormat::Fp8(s) => s,
                BaseFormat::Bf16 => WeightScaling::Channel,
            };
            Some((
                octet_train::export::quantize_block_matrices(&full, scaling)?,
                scaling,
            ))
        }
    };
    // The merged model appears only whole: one file, or shards and index,
    // with the tokenizer files of the adapter's run (or of the base).
    let tokenizer = checkpoint::merged_tokenizer_source(&base, &adapter)?;
    checkpoint::write_new_dir(&m.out, |out| {
        match &fp8 {
            None => checkpoint::save_model(out, &full)?,
            Some((fp8, scaling)) => checkpoint::save_model_fp8(out, &full, fp8, *scaling)?,
        }
        checkpoint::copy_run_tokenizer(tokenizer.as_deref(), out)
    })?;
    println!(
        "merged {} (r={r}, alpha={alpha}) onto {} ({}), wrote {} in {}",
        adapter.display(),
        base.display(),
        base_format.name(),
        m.out.display(),
        m.dtype
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::check_merge_out;

    /// The merge's output may not be the base, the adapter or another
    /// training checkpoint; a new directory (or an empty one) is fine.
    #[test]
    fn a_merge_refuses_to_write_over_the_base_the_adapter_or_a_checkpoint() {
        let root = std::env::temp_dir().join(format!("octet-merge-out-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let (base, adapter, other) = (root.join("base"), root.join("ad"), root.join("other"));
        for d in [&base, &adapter, &other] {
            std::fs::create_dir_all(d).expect("create a directory");
        }
        std::fs::write(other.join("optimizer.safetensors"), b"").expect("write");
        let err = |out: &std::path::Path| {
            check_merge_out(out, &base, &adapter)
                .expect_err("should be refused")
                .to_string()
        };
        assert!(err(&base).contains("the base checkpoint"));
        assert!(err(&root.join("base/../base")).contains("the base checkpoint"));
        assert!(err(&adapter).contains("the adapter"));
        assert!(err(&other).contains("optimizer.safetensors"));
        // A run directory and its `checkpoints` directory.
        let run = root.join("run");
        std::fs::create_dir_all(run.join("checkpoints")).expect("create a directory");
        std::fs::write(run.join("checkpoints/latest"), "step_000004").expect("write");
        assert!(err(&run).contains("run directory"));
        assert!(err(&run.join("checkpoints")).contains("run directory"));
        assert!(check_merge_out(&root.join("merged"), &base, &adapter).is_ok());
        let _ = std::fs::remove_dir_all(&root);
    }
}

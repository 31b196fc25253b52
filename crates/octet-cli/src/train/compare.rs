//! `octet compare`: one run per recipe on the same data, then one table.

use super::*;

/// The first of `NAME`, `NAME-2`, ... (`NAME` from `base`) under which no
/// recipe of `recipes` has a run yet and no comparison plot was written.
pub(super) fn free_compare_name(base: &TrainConfig, recipes: &str) -> anyhow::Result<String> {
    for i in 1..10_000 {
        let name = if i == 1 {
            base.name.clone()
        } else {
            format!("{}-{i}", base.name)
        };
        let free = !base.out_dir.join(format!("{name}-compare.png")).exists()
            && recipes.split(',').map(str::trim).all(|r| {
                let mut c = base.clone();
                c.name = format!("{name}-{r}");
                c.check_run_dir(None).is_ok()
            });
        if free {
            return Ok(name);
        }
    }
    anyhow::bail!(
        "{} holds comparisons {1} to {1}-9999: name one with `octet compare --name`",
        base.out_dir.display(),
        base.name
    )
}

/// Flags of `octet compare`.
#[derive(clap::Args, Clone)]
pub struct CompareArgs {
    /// Recipes to run, comma-separated (bf16 = no FP8).
    #[arg(
        long,
        default_value = "bf16,delayed,tensorwise,rowwise,blockwise,mxfp8,nvfp4"
    )]
    recipes: String,
    #[command(flatten)]
    train: TrainArgs,
}

pub fn compare(a: CompareArgs) -> anyhow::Result<()> {
    // Every recipe trains from step 0 in this process.
    anyhow::ensure!(
        a.train.resume.is_none(),
        "--resume continues one run; octet compare trains every recipe from step 0"
    );
    a.train.refuse_sharding("octet compare")?;
    // `--recipes` names every run's recipe and the runs sample no text:
    // these flags would be dropped without a word.
    if let Some(r) = &a.train.recipe {
        anyhow::bail!(
            "--recipe {r}: octet compare trains each recipe of --recipes ('{}'); name it there",
            a.recipes
        );
    }
    // `--sample-tokens 0` says what compare does anyway.
    if let Some(n) = a.train.sample_tokens.filter(|&n| n > 0) {
        anyhow::bail!("--sample-tokens {n}: octet compare samples no text (octet train does)");
    }
    let mut base = a.train.config()?;
    // Without `--name`, the first of `default`, `default-2`, ... whose runs
    // are all free, as bare `octet` numbers its runs: running compare again
    // starts new runs rather than being refused.
    if a.train.name.is_none() {
        base.name = free_compare_name(&base, &a.recipes)?;
    }
    let gpu = crate::gpu::open(&a.train.device)?;
    if let Some(g) = &gpu {
        println!("octet compare on {}", g.info()?);
    }
    // Every recipe's config is checked before any trains: a bad name late in
    // --recipes must not cost the runs before it.
    let cfgs = a
        .recipes
        .split(',')
        .map(str::trim)
        .map(|recipe| {
            let mut cfg = base.clone();
            cfg.recipe = recipe.to_string();
            cfg.name = format!("{}-{recipe}", base.name);
            cfg.sample_tokens = 0;
            cfg.validate()
                .with_context(|| format!("--recipes '{}'", a.recipes))?;
            Ok(cfg)
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    // Each recipe is one run directory: a repeat would append a second run to
    // the first's metrics.jsonl and replace its checkpoints.
    for (i, cfg) in cfgs.iter().enumerate() {
        anyhow::ensure!(
            !cfgs[..i].iter().any(|c| c.recipe == cfg.recipe),
            "--recipes '{}' names {} twice",
            a.recipes,
            cfg.recipe
        );
    }
    // Every run's directory is free before the first trains.
    for cfg in &cfgs {
        cfg.check_run_dir(None).map_err(|_| {
            anyhow::anyhow!(
                "compare: {} already holds a run; give another --name (without one, compare \
                 picks the first free name: {}, {}-2, ...)",
                cfg.out_dir.join(&cfg.name).display(),
                base.name,
                base.name
            )
        })?;
    }
    let mut runs = Vec::new();
    let mut series = Vec::new();
    let mut failed = Vec::new();
    for cfg in &cfgs {
        let recipe = cfg.recipe.as_str();
        let mut obs = bar(recipe);
        let result = match &gpu {
            Some(g) => octet_train::gpu::train_gpu(cfg, None, &mut obs, g),
            None => train(cfg, None, &mut obs),
        };
        obs.bar.finish();
        // One recipe that cannot run here (a shape its GPU kernels refuse, say)
        // is reported and the others still run.
        let s = match result {
            Ok(s) => s,
            Err(e) => {
                println!("{recipe}: {e}");
                failed.push(format!("{recipe}: {e}"));
                continue;
            }
        };
        series.push(Series {
            name: recipe.to_string(),
            points: s
                .losses
                .iter()
                .enumerate()
                .map(|(i, &l)| (i as f64 + 1.0, l))
                .collect(),
        });
        runs.push(s);
    }
    // With no run to compare, the errors are the result (not an empty plot's).
    anyhow::ensure!(
        !runs.is_empty(),
        "every recipe failed:\n{}",
        failed.join("\n")
    );
    println!();
    summary_table(&runs);
    let path = base.out_dir.join(format!("{}-compare.png", base.name));
    line_plot(
        &path,
        "training loss by recipe",
        "step",
        base.tokenizer()?.loss_label(),
        &series,
    )?;
    let json = base.out_dir.join(format!("{}-compare.json", base.name));
    let rows: Vec<_> = runs
        .iter()
        .map(|r| serde_json::json!({"recipe": r.recipe, "final_loss": r.final_loss, "final_val_loss": r.final_val_loss, "tokens_per_s": r.tokens_per_s, "peak_saved_bytes": r.peak_saved_bytes, "peak_device_bytes": r.peak_device_bytes}))
        .collect();
    crate::util::write_json(&json, "octet compare", &serde_json::json!(rows))?;
    println!("wrote {}", path.display());
    Ok(())
}

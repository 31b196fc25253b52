//! LoRA runs: bit-exact resume from a PEFT-layout adapter checkpoint (with
//! LoRA dropout too), the adapter round trip, and the base checkpoint it
//! trains on.

mod common;

use octet_nn::llama::Llama;
use octet_train::checkpoint;
use octet_train::trainer::{train, LoraSettings, Quiet, TrainConfig};

fn tmpdir(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("octet-lora-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn run(
    name: &str,
    out: &std::path::Path,
    base: Option<&std::path::Path>,
    format: &str,
    (compute, dropout): (&str, f64),
) -> TrainConfig {
    TrainConfig {
        name: name.into(),
        out_dir: out.to_path_buf(),
        model: "tiny".into(),
        batch: 2,
        seq: 32,
        steps: 6,
        warmup: 2,
        lr: 1e-2,
        eval_every: 3,
        eval_batches: 1,
        ckpt_every: 3,
        sample_tokens: 0,
        backward: "dequantized".into(),
        lora: Some(LoraSettings {
            base: base.map(|p| p.to_path_buf()),
            rank: 4,
            alpha: 8.0,
            targets: vec!["q".into(), "v".into(), "up".into()],
            base_format: format.into(),
            compute: compute.into(),
            dropout,
        }),
        ..Default::default()
    }
}

#[test]
fn lora_runs_resume_bit_for_bit_and_the_adapter_round_trips() {
    let out = tmpdir("resume");
    // A base checkpoint to fine-tune: a short full-training run.
    let base_cfg = TrainConfig {
        name: "base".into(),
        out_dir: out.clone(),
        model: "tiny".into(),
        recipe: "bf16".into(),
        batch: 2,
        seq: 32,
        steps: 2,
        eval_every: 2,
        eval_batches: 1,
        sample_tokens: 0,
        ..Default::default()
    };
    train(&base_cfg, None, &mut Quiet).unwrap();
    let base = out.join("base/checkpoints/step_000002");
    let mut no_dropout = Vec::new();
    for (format, compute, dropout) in [
        ("fp8-tensorwise", "fp8", 0.0),
        ("fp8-rowwise", "bf16", 0.0),
        ("bf16", "bf16", 0.0),
        ("fp8-tensorwise", "fp8", 0.2),
    ] {
        let tag = format!("{format}-{compute}-{dropout}");
        let setting = (compute, dropout);
        let full = train(
            &run(&format!("full-{tag}"), &out, Some(&base), format, setting),
            None,
            &mut Quiet,
        )
        .unwrap();
        if dropout == 0.0 && format == "fp8-tensorwise" {
            no_dropout = full.losses.clone();
        }
        if dropout > 0.0 {
            // B starts at zero, so the first step's loss is the base's either
            // way; after it, the masks change the adapters' updates.
            assert_eq!(full.losses[0].to_bits(), no_dropout[0].to_bits());
            assert_ne!(
                full.losses[1..],
                no_dropout[1..],
                "{tag}: dropout changed nothing"
            );
        }
        assert_eq!(full.losses.len(), 6);
        assert!(full.losses.iter().all(|l| l.is_finite()));
        // Fine-tuning changes the loss (B starts at zero, so step 1 is the base's loss).
        assert_ne!(
            full.losses[0], full.losses[5],
            "{tag}: the adapter did not train"
        );
        let ck = out.join(format!("full-{tag}/checkpoints/step_000003"));
        for f in [
            "adapter_model.safetensors",
            "adapter_config.json",
            "config.json",
            "optimizer.safetensors",
        ] {
            assert!(ck.join(f).exists(), "{tag}: {f} missing");
        }
        assert!(
            !ck.join("model.safetensors").exists(),
            "{tag}: LoRA wrote the base"
        );
        let resumed = train(
            &run(
                &format!("resumed-{tag}"),
                &out,
                Some(&base),
                format,
                setting,
            ),
            Some(&ck),
            &mut Quiet,
        )
        .unwrap();
        for (a, b) in full.losses[3..].iter().zip(&resumed.losses) {
            assert_eq!(a.to_bits(), b.to_bits(), "{tag}: {a} vs {b}");
        }
        // The saved adapter, loaded onto a fresh base, gives identical logits.
        let cfg = run("x", &out, Some(&base), format, setting);
        let l = cfg.lora.as_ref().unwrap();
        let mut m1 = l.build(&cfg).unwrap();
        let (adapter, r, alpha, targets) = checkpoint::load_adapter(&ck).unwrap();
        assert_eq!((r, alpha), (4, 8.0));
        assert_eq!(targets, ["q_proj", "v_proj", "up_proj"]);
        let config = std::fs::read_to_string(ck.join("adapter_config.json")).unwrap();
        let config: serde_json::Value = serde_json::from_str(&config).unwrap();
        assert_eq!(config["lora_dropout"].as_f64(), Some(dropout));
        m1.load_params(adapter.clone()).unwrap();
        let mut m2 = l.build(&cfg).unwrap();
        m2.load_params(adapter).unwrap();
        let tokens: Vec<u32> = (0..32).map(|i| (i * 7 + 1) % 256).collect();
        let (y1, y2) = (
            m1.logits(&tokens, 1, 32).unwrap(),
            m2.logits(&tokens, 1, 32).unwrap(),
        );
        assert_eq!(y1.to_f32_vec(), y2.to_f32_vec());
        // The merged model computes what base + adapter computes (bf16 compute, f32 sums).
        if compute == "bf16" {
            let merged = m1.merged_weights().unwrap().into_iter().collect();
            let mcfg = checkpoint::load_config(&base).unwrap();
            let mut full_model = Llama::from_weights(&mcfg, merged, None).unwrap();
            let y3 = full_model.logits(&tokens, 1, 32).unwrap().to_f32_vec();
            let y1 = y1.to_f32_vec();
            let scale = y1.iter().map(|v| v.abs()).fold(0f32, f32::max);
            let diff = y1
                .iter()
                .zip(&y3)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(
                diff <= 1e-4 * scale,
                "{tag}: merged differs by {diff} (scale {scale})"
            );
        }
    }
    // A corrupt adapter is an error naming the file.
    let ck = out.join("full-bf16-bf16-0/checkpoints/step_000006");
    std::fs::write(ck.join("adapter_model.safetensors"), b"not safetensors").unwrap();
    let e = checkpoint::load_adapter(&ck).unwrap_err().to_string();
    assert!(e.contains("adapter_model.safetensors"), "{e}");
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn a_lora_dropout_outside_zero_to_one_is_an_error_naming_the_flag() {
    let out = tmpdir("bad-dropout");
    for p in [-0.1, 1.0, 2.0, f64::NAN] {
        let cfg = run("bad", &out, None, "fp8-tensorwise", ("fp8", p));
        let e = train(&cfg, None, &mut Quiet).unwrap_err().to_string();
        assert!(
            e.contains("--lora-dropout") && e.contains("[0, 1)"),
            "{p}: {e}"
        );
    }
    let _ = std::fs::remove_dir_all(&out);
}

/// A short full-training run to fine-tune: its final checkpoint.
fn base_checkpoint(out: &std::path::Path, name: &str) -> std::path::PathBuf {
    let cfg = common::quick_run(name, out, 1);
    train(&cfg, None, &mut Quiet).unwrap();
    out.join(name).join("checkpoints/step_000001")
}

/// A two-step LoRA run (rank 4, alpha 8, q/v/up) on `base`: its checkpoint.
fn lora_checkpoint(
    out: &std::path::Path,
    name: &str,
    base: Option<&std::path::Path>,
) -> (TrainConfig, std::path::PathBuf) {
    let cfg = TrainConfig {
        steps: 2,
        seq: 16,
        eval_batches: 0,
        ckpt_every: 0,
        ..run(name, out, base, "bf16", ("bf16", 0.0))
    };
    train(&cfg, None, &mut Quiet).unwrap();
    (cfg, out.join(name).join("checkpoints/step_000002"))
}

#[test]
fn a_lora_resume_refuses_other_settings_and_another_base() {
    let out = tmpdir("resume-check");
    let base = base_checkpoint(&out, "base");
    let other = base_checkpoint(&out, "other");
    let (cfg, ck) = lora_checkpoint(&out, "on-base", Some(&base));
    // The adapter records its base (absolute).
    let recorded = checkpoint::load_adapter_base(&ck).unwrap().unwrap();
    assert!(std::path::Path::new(&recorded).is_absolute(), "{recorded}");
    assert!(checkpoint::same_base(&recorded, Some(&base)));
    let resumed = TrainConfig {
        steps: 3,
        ..cfg.clone()
    };
    assert!(resumed.check_resume(Some(&ck)).is_ok());
    let with = |f: &dyn Fn(&mut LoraSettings)| {
        let mut c = resumed.clone();
        f(c.lora.as_mut().unwrap());
        c
    };
    // The same targets in another order and spelling are the same.
    let same = with(&|l| l.targets = vec!["up_proj".into(), "q".into(), "v".into()]);
    assert!(same.check_resume(Some(&ck)).is_ok());
    for (c, want) in [
        (with(&|l| l.alpha = 1000.0), "--alpha 1000"),
        (with(&|l| l.rank = 8), "--rank 8"),
        (with(&|l| l.targets = vec!["q".into()]), "--targets q"),
        (with(&|l| l.dropout = 0.5), "--lora-dropout 0.5"),
        (with(&|l| l.base = None), "a random base"),
        (with(&|l| l.base = Some(other.clone())), "give --base"),
    ] {
        let e = train(&c, Some(&ck), &mut Quiet).unwrap_err().to_string();
        assert!(e.contains(want) && e.contains("step_000002"), "{want}: {e}");
    }
    // On a random base, "random" is recorded and a directory refused.
    let (rcfg, rck) = lora_checkpoint(&out, "on-random", None);
    assert_eq!(
        checkpoint::load_adapter_base(&rck).unwrap().as_deref(),
        Some(checkpoint::RANDOM_BASE)
    );
    let mut on_dir = TrainConfig {
        steps: 3,
        ..rcfg.clone()
    };
    on_dir.lora.as_mut().unwrap().base = Some(base.clone());
    let e = on_dir.check_resume(Some(&rck)).unwrap_err().to_string();
    assert!(
        e.contains("random base") && e.contains("without --base"),
        "{e}"
    );
    let s = train(
        &TrainConfig {
            steps: 3,
            ..rcfg.clone()
        },
        Some(&rck),
        &mut Quiet,
    )
    .unwrap();
    assert_eq!(s.losses.len(), 1);
    // An adapter saved before the base was recorded (null) is not checked.
    let cfg_path = rck.join("adapter_config.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cfg_path).unwrap()).unwrap();
    v["base_model_name_or_path"] = serde_json::Value::Null;
    std::fs::write(&cfg_path, v.to_string()).unwrap();
    assert!(on_dir.check_resume(Some(&rck)).is_ok());
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn merging_an_adapter_whose_alpha_overflows_writes_nothing() {
    let out = tmpdir("merge-alpha");
    let base = base_checkpoint(&out, "base");
    let (_, ck) = lora_checkpoint(&out, "lora", Some(&base));
    assert!(octet_train::trainer::merge_adapter(&base, &ck, Some("bf16")).is_ok());
    let cfg_path = ck.join("adapter_config.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cfg_path).unwrap()).unwrap();
    v["lora_alpha"] = serde_json::json!(1e308);
    std::fs::write(&cfg_path, v.to_string()).unwrap();
    let e = octet_train::trainer::merge_adapter(&base, &ck, Some("bf16"))
        .err()
        .expect("a merge to infinities is refused")
        .to_string();
    assert!(
        e.contains("non-finite") && e.contains("lora_alpha=1e308"),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(&out);
}

/// PEFT options that change the adapter's arithmetic (rsLoRA's alpha /
/// sqrt(r), DoRA, per-module ranks and alphas) are refused by name: read as
/// plain LoRA they merged with another scaling and no error.
#[test]
fn peft_options_that_change_the_arithmetic_are_errors_naming_them() {
    let out = tmpdir("peft-options");
    let base = base_checkpoint(&out, "base");
    let (_, ck) = lora_checkpoint(&out, "lora", Some(&base));
    let cfg_path = ck.join("adapter_config.json");
    let plain: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cfg_path).unwrap()).unwrap();
    for (key, value) in [
        ("use_rslora", serde_json::json!(true)),
        ("use_dora", serde_json::json!(true)),
        ("fan_in_fan_out", serde_json::json!(true)),
        ("alpha_pattern", serde_json::json!({"q_proj": 64})),
        ("rank_pattern", serde_json::json!({"q_proj": 8})),
    ] {
        let mut v = plain.clone();
        v[key] = value;
        std::fs::write(&cfg_path, v.to_string()).unwrap();
        let e = octet_train::trainer::merge_adapter(&base, &ck, Some("bf16"))
            .err()
            .unwrap_or_else(|| panic!("{key} should be refused"))
            .to_string();
        assert!(e.contains(key) && e.contains("not supported"), "{e}");
    }
    // A target that is not a module name is an error, not dropped.
    let mut v = plain.clone();
    v["target_modules"] = serde_json::json!(["q_proj", 7]);
    std::fs::write(&cfg_path, v.to_string()).unwrap();
    let e = octet_train::trainer::merge_adapter(&base, &ck, Some("bf16"))
        .err()
        .expect("a numeric target should be refused")
        .to_string();
    assert!(e.contains("target_modules entry 7"), "{e}");
    // A string is PEFT's regular expression over full module names: named so.
    let mut v = plain.clone();
    v["target_modules"] = serde_json::json!("q_proj");
    std::fs::write(&cfg_path, v.to_string()).unwrap();
    let e = octet_train::trainer::merge_adapter(&base, &ck, Some("bf16"))
        .err()
        .expect("a string of targets should be refused")
        .to_string();
    assert!(e.contains("regular expression"), "{e}");
    // PEFT writes the off values; those read as plain LoRA.
    let mut v = plain.clone();
    v["use_rslora"] = serde_json::json!(false);
    v["use_dora"] = serde_json::json!(false);
    v["alpha_pattern"] = serde_json::json!({});
    v["rank_pattern"] = serde_json::json!({});
    std::fs::write(&cfg_path, v.to_string()).unwrap();
    assert!(octet_train::trainer::merge_adapter(&base, &ck, Some("bf16")).is_ok());
    let _ = std::fs::remove_dir_all(&out);
}

/// An adapter records its base format and compute (`octet_lora.json`,
/// canonical names): a resume with another one is refused by name, a merge
/// without a format takes the recorded one (an fp8-block adapter merged onto
/// an fp8-tensorwise base would correct another base's rounding), and a format
/// given overrides it. Adapters without the file merge as before.
#[test]
fn an_adapter_records_its_base_format_and_compute() {
    let out = tmpdir("record");
    let base = base_checkpoint(&out, "base");
    let cfg = TrainConfig {
        steps: 2,
        seq: 16,
        eval_batches: 0,
        ckpt_every: 0,
        ..run("blk", &out, Some(&base), "fp8-block", ("bf16", 0.0))
    };
    train(&cfg, None, &mut Quiet).unwrap();
    let ck = out.join("blk/checkpoints/step_000002");
    let rec = checkpoint::load_lora_record(&ck)
        .unwrap()
        .expect("a record");
    assert_eq!(
        (rec.base_format.as_str(), rec.compute.as_str()),
        ("fp8-block", "bf16")
    );
    let resumed = TrainConfig {
        steps: 3,
        ..cfg.clone()
    };
    assert!(resumed.check_resume(Some(&ck)).is_ok());
    for (field, value, want) in [
        (
            "base_format",
            "fp8-tensorwise",
            "--base-format fp8-tensorwise",
        ),
        ("compute", "fp8", "--compute fp8"),
    ] {
        let mut c = resumed.clone();
        let l = c.lora.as_mut().unwrap();
        if field == "base_format" {
            l.base_format = value.into();
        } else {
            l.compute = value.into();
        }
        let e = c.check_resume(Some(&ck)).unwrap_err().to_string();
        assert!(e.contains(want) && e.contains("step_000002"), "{e}");
    }
    // The record's name is canonical: `fp8` resumes an fp8-tensorwise adapter.
    let tcfg = TrainConfig {
        steps: 2,
        seq: 16,
        eval_batches: 0,
        ckpt_every: 0,
        ..run("tw", &out, Some(&base), "fp8", ("bf16", 0.0))
    };
    train(&tcfg, None, &mut Quiet).unwrap();
    let tck = out.join("tw/checkpoints/step_000002");
    let trec = checkpoint::load_lora_record(&tck).unwrap().unwrap();
    assert_eq!(trec.base_format, "fp8-tensorwise");
    let mut tres = TrainConfig {
        steps: 3,
        ..tcfg.clone()
    };
    tres.lora.as_mut().unwrap().base_format = "fp8-tensorwise".into();
    assert!(tres.check_resume(Some(&tck)).is_ok());
    // Merges: the record, an override, and no record.
    use octet_nn::lora::BaseFormat;
    use octet_tensor::mixed::WeightScaling;
    let merge = |f: Option<&str>| octet_train::trainer::merge_adapter(&base, &ck, f).unwrap();
    assert_eq!(merge(None).base, BaseFormat::Fp8(WeightScaling::Block128));
    // Merged onto its own base, nothing to say; onto another, the record.
    assert_eq!(merge(None).recorded_other_base, None);
    let other = base_checkpoint(&out, "other");
    let onto_other = octet_train::trainer::merge_adapter(&other, &ck, None).unwrap();
    let rec = onto_other
        .recorded_other_base
        .expect("another base is named");
    assert!(checkpoint::same_base(&rec, Some(&base)), "{rec}");
    assert_eq!(merge(Some("bf16")).base, BaseFormat::Bf16);
    std::fs::remove_file(ck.join(checkpoint::LORA_RECORD)).unwrap();
    assert_eq!(merge(None).base, BaseFormat::Fp8(WeightScaling::Tensor));
    // A corrupt record is an error naming the file.
    std::fs::write(ck.join(checkpoint::LORA_RECORD), "{\"base_format\": 3}").unwrap();
    let e = octet_train::trainer::merge_adapter(&base, &ck, None)
        .err()
        .expect("a corrupt record is refused")
        .to_string();
    assert!(e.contains("octet_lora.json"), "{e}");
    let _ = std::fs::remove_dir_all(&out);
}

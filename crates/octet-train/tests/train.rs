//! The model's gradients against finite differences in f64, checkpoint round
//! trips and corruption, and bit-exact resume.

mod common;

use octet_nn::llama::{Llama, LlamaConfig};
use octet_tensor::{DType, Tensor};
use octet_train::checkpoint;
use octet_train::trainer::{train, Quiet, TrainConfig};
use rand::{Rng, SeedableRng};

fn tiny() -> LlamaConfig {
    LlamaConfig {
        vocab_size: 11,
        hidden_size: 8,
        intermediate_size: 12,
        num_hidden_layers: 2,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        max_position_embeddings: 16,
        rms_norm_eps: 1e-5,
        rope_theta: 10000.0,
        tie_word_embeddings: false,
        rope_scaling: None,
        head_dim: None,
        qkv_bias: false,
        o_bias: false,
        qk_norm: false,
    }
}

fn tmpdir(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("octet-test-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

#[test]
fn whole_model_gradients_match_finite_differences_in_f64() {
    // Central differences of a smooth loss: truncation O(h^2 * f''') ~ 1e-12
    // at h = 1e-5 for these O(1) third derivatives, rounding ~ 1e-16 * |L| / h
    // ~ 1e-11; a 1e-6 relative (1e-9 absolute) tolerance leaves three orders
    // of magnitude to both.
    for tied in [false, true] {
        let cfg = LlamaConfig {
            tie_word_embeddings: tied,
            ..tiny()
        };
        check_model_gradients(&cfg);
    }
}

fn check_model_gradients(cfg: &LlamaConfig) {
    let cfg = cfg.clone();
    let mut model = Llama::new_random(&cfg, DType::F64, None, 3).unwrap();
    // Larger weights than the default 0.02 so every path carries signal.
    let mut rng = rand::rngs::StdRng::seed_from_u64(9);
    for (_, t) in model.params_mut() {
        let v: Vec<f64> = t
            .to_f64_vec()
            .iter()
            .map(|x| x + 0.3 * (rng.random::<f64>() - 0.5))
            .collect();
        *t = Tensor::from_f64(t.shape(), v).unwrap();
    }
    let (b, t) = (2, 5);
    let tokens: Vec<u32> = (0..b * t)
        .map(|_| rng.random_range(0..cfg.vocab_size as u32))
        .collect();
    let targets: Vec<u32> = (0..b * t)
        .map(|_| rng.random_range(0..cfg.vocab_size as u32))
        .collect();
    let (_, saved) = model.forward(&tokens, &targets, b, t).unwrap();
    let grads = model.backward(saved).unwrap();
    let h = 1e-5;
    let mut checked = 0;
    for (pi, (name, g)) in grads.iter().enumerate() {
        assert_eq!(g.dtype(), DType::F64, "{name}");
        let gv = g.to_f64_vec();
        for _ in 0..3 {
            let i = rng.random_range(0..gv.len());
            let loss_at = |delta: f64| {
                let mut m = model.clone();
                let mut params = m.params_mut();
                let p = &mut params[pi].1;
                let mut v = p.to_f64_vec();
                v[i] += delta;
                **p = Tensor::from_f64(p.shape(), v).unwrap();
                m.forward(&tokens, &targets, b, t).unwrap().0
            };
            let num = (loss_at(h) - loss_at(-h)) / (2.0 * h);
            let tol = 1e-6 * gv[i].abs() + 1e-9;
            assert!(
                (num - gv[i]).abs() <= tol,
                "{name}[{i}]: numeric {num:e} vs analytic {:e}",
                gv[i]
            );
            checked += 1;
        }
    }
    assert_eq!(checked, 3 * Llama::param_shapes(&cfg).len());
}

#[test]
fn checkpoints_round_trip_and_reject_corruption() {
    let cfg = tiny();
    let model = Llama::new_random(&cfg, DType::F32, None, 5).unwrap();
    let dir = tmpdir("ckpt");
    checkpoint::save_model(&dir, &model).unwrap();
    let back = checkpoint::load_config(&dir).unwrap();
    assert_eq!(back, cfg);
    let w = checkpoint::load_weights(&dir, DType::F32).unwrap();
    let loaded = Llama::from_weights(&back, w, None).unwrap();
    for ((n, a), (_, b)) in model.params().iter().zip(loaded.params()) {
        assert_eq!(a.to_f32_vec(), b.to_f32_vec(), "{n}");
    }
    // A config that does not match the weights names the tensor.
    let mut wrong = cfg.clone();
    wrong.intermediate_size = 16;
    let err = Llama::from_weights(
        &wrong,
        checkpoint::load_weights(&dir, DType::F32).unwrap(),
        None,
    )
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("model.layers.0.mlp.gate_proj.weight"),
        "{err}"
    );
    // A missing tensor is named.
    let mut w = checkpoint::load_weights(&dir, DType::F32).unwrap();
    w.remove("model.norm.weight");
    let err = Llama::from_weights(&cfg, w, None).unwrap_err();
    assert!(
        err.to_string().contains("missing tensor model.norm.weight"),
        "{err}"
    );
    // A truncated file is an error, not a panic.
    let p = dir.join("model.safetensors");
    let bytes = std::fs::read(&p).unwrap();
    std::fs::write(&p, &bytes[..bytes.len() / 2]).unwrap();
    let err = checkpoint::load_weights(&dir, DType::F32).unwrap_err();
    assert!(err.to_string().contains("model.safetensors"), "{err}");
    std::fs::write(&p, b"garbage").unwrap();
    assert!(checkpoint::load_weights(&dir, DType::F32).is_err());
    let _ = std::fs::remove_dir_all(&dir);
}

fn small_run(name: &str, out: &std::path::Path, recipe: &str) -> TrainConfig {
    TrainConfig {
        name: name.into(),
        out_dir: out.to_path_buf(),
        model: "tiny".into(),
        recipe: recipe.into(),
        batch: 2,
        seq: 32,
        steps: 6,
        warmup: 2,
        eval_every: 3,
        eval_batches: 1,
        ckpt_every: 3,
        sample_tokens: 0,
        ..Default::default()
    }
}

#[test]
fn resumed_run_reproduces_the_uninterrupted_losses_bit_for_bit() {
    let out = tmpdir("resume");
    for recipe in ["bf16", "tensorwise", "delayed", "nvfp4"] {
        let full = train(
            &small_run(&format!("full-{recipe}"), &out, recipe),
            None,
            &mut Quiet,
        )
        .unwrap();
        assert_eq!(full.losses.len(), 6);
        assert!(full.losses.iter().all(|l| l.is_finite()));
        let ck = out
            .join(format!("full-{recipe}"))
            .join("checkpoints")
            .join("step_000003");
        let resumed = train(
            &small_run(&format!("resumed-{recipe}"), &out, recipe),
            Some(&ck),
            &mut Quiet,
        )
        .unwrap();
        assert_eq!(resumed.losses.len(), 3);
        for (a, b) in full.losses[3..].iter().zip(&resumed.losses) {
            assert_eq!(a.to_bits(), b.to_bits(), "{recipe}: {a} vs {b}");
        }
        assert!(out
            .join(format!("full-{recipe}"))
            .join("metrics.jsonl")
            .exists());
    }
    let _ = std::fs::remove_dir_all(&out);
}

/// A resumed run's `loss.png` shows the whole run, the steps before its
/// checkpoint included: the same picture as the uninterrupted run's (whose
/// losses it repeats bit for bit), not the resumed steps alone.
#[test]
fn a_resumed_run_plots_the_steps_before_its_checkpoint() {
    let out = tmpdir("resume-plot");
    train(&small_run("full", &out, "tensorwise"), None, &mut Quiet).unwrap();
    let ck = out.join("full").join("checkpoints").join("step_000003");
    train(
        &small_run("resumed", &out, "tensorwise"),
        Some(&ck),
        &mut Quiet,
    )
    .unwrap();
    let full = std::fs::read(out.join("full").join("loss.png")).unwrap();
    let resumed = std::fs::read(out.join("resumed").join("loss.png")).unwrap();
    assert!(full == resumed, "the resumed run's loss.png differs");
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn a_nan_stops_the_step_and_names_the_block() {
    let cfg = tiny();
    let mut model = Llama::new_random(
        &cfg,
        DType::F32,
        Some(octet_fp8::Recipe::from_name("tensorwise").unwrap()),
        1,
    )
    .unwrap();
    // Poison one gain of block 1's attention norm: block 0 is fine, block 1's q_proj input is NaN.
    for (name, t) in model.params_mut() {
        if name == "model.layers.1.input_layernorm.weight" {
            let mut v = t.to_f32_vec();
            v[0] = f32::NAN;
            *t = Tensor::from_f32(t.shape(), v).unwrap();
        }
    }
    let tokens: Vec<u32> = (0..8).map(|i| i % 11).collect();
    let err = model
        .forward(&tokens, &tokens, 1, 8)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("in model.layers.1") && err.contains("non-finite"),
        "{err}"
    );
}

#[test]
fn tied_embeddings_load_with_or_without_a_duplicate_head() {
    let cfg = LlamaConfig {
        tie_word_embeddings: true,
        ..tiny()
    };
    let model = Llama::new_random(&cfg, DType::F32, None, 4).unwrap();
    assert!(model.params().iter().all(|(n, _)| n != "lm_head.weight"));
    let weights: std::collections::HashMap<String, Tensor> = model
        .params()
        .into_iter()
        .map(|(n, t)| (n, t.clone()))
        .collect();
    assert!(Llama::from_weights(&cfg, weights.clone(), None).is_ok());
    let mut dup = weights.clone();
    dup.insert(
        "lm_head.weight".into(),
        weights["model.embed_tokens.weight"].clone(),
    );
    assert!(
        Llama::from_weights(&cfg, dup.clone(), None).is_ok(),
        "an equal duplicate head is accepted"
    );
    let e = &weights["model.embed_tokens.weight"];
    let other: Vec<f32> = e.to_f32_vec().iter().map(|v| v + 1.0).collect();
    dup.insert(
        "lm_head.weight".into(),
        Tensor::from_f32(e.shape(), other).unwrap(),
    );
    let err = Llama::from_weights(&cfg, dup, None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("lm_head.weight differs"), "{err}");
}

#[test]
fn gpt2_tokenizer_trains_a_model_of_its_vocabulary() {
    let out = tmpdir("gpt2");
    let cfg = TrainConfig {
        tokenizer: "gpt2".into(),
        save: false,
        ..small_run("gpt2", &out, "tensorwise")
    };
    let mcfg = cfg.llama_config().unwrap();
    assert_eq!(mcfg.vocab_size, 50304);
    let data = cfg.dataset(mcfg.vocab_size).unwrap();
    assert_eq!(data.vocab, 50257);
    assert!(data.train.iter().any(|&t| t > 255), "BPE ids, not bytes");
    let s = train(&cfg, None, &mut Quiet).unwrap();
    // Starts near ln(50304) = 10.83 (uniform over the vocabulary) and falls.
    assert!((s.losses[0] - 50304f64.ln()).abs() < 0.5, "{:?}", s.losses);
    assert!(s.losses.last().unwrap() < &s.losses[0], "{:?}", s.losses);
    // An explicit model smaller than the tokenizer's ids is refused.
    let small = TrainConfig {
        model_config: Some(tiny()),
        ..cfg.clone()
    };
    assert!(small.llama_config().is_err());
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn a_benchmark_run_writes_no_checkpoint_and_skips_evaluation() {
    let out = tmpdir("nosave");
    let cfg = TrainConfig {
        save: false,
        eval_batches: 0,
        ..small_run("nosave", &out, "tensorwise")
    };
    let s = train(&cfg, None, &mut Quiet).unwrap();
    assert_eq!(s.losses.len(), 6);
    assert!(
        s.final_val_loss.is_nan(),
        "no evaluation ran: {}",
        s.final_val_loss
    );
    assert!(!out.join("nosave").join("checkpoints").exists());
    // The metrics still record every step, without a validation loss.
    let metrics = std::fs::read_to_string(out.join("nosave").join("metrics.jsonl")).unwrap();
    let steps = metrics.lines().filter(|l| l.contains("\"loss\"")).count();
    assert_eq!(steps, 6);
    assert!(!metrics.contains("val_loss"));
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn config_rejects_an_unknown_gradient_reduction_type() {
    let mut cfg = TrainConfig::default();
    assert!(cfg.validate().is_ok());
    cfg.grad_reduce = "bf16".into();
    assert!(cfg.validate().is_ok());
    cfg.grad_reduce = "f16".into();
    let err = cfg.validate().expect_err("f16 is not a reduction type");
    assert!(err.to_string().contains("--grad-reduce f16"), "{err}");
}

#[test]
fn fp8_saved_activations_are_a_gpu_setting_and_unknown_names_are_rejected() {
    let mut cfg = TrainConfig {
        saved_activations: "fp8".into(),
        ..Default::default()
    };
    assert!(cfg.validate().is_ok());
    cfg.saved_activations = "e5m2".into();
    let err = cfg.validate().expect_err("e5m2 is not a setting");
    assert!(
        err.to_string().contains("--saved-activations e5m2"),
        "{err}"
    );
    // `auto` (the default) means FP8 under tensorwise, the recipe it was
    // measured and is checked with (on the GPU; the CPU keeps f32 whatever
    // it says), full under bf16 and the other recipes.
    let mut auto = TrainConfig::default();
    assert_eq!(auto.saved_activations, "auto");
    assert!(
        auto.fp8_saved_activations().unwrap(),
        "tensorwise by default"
    );
    auto.recipe = "bf16".into();
    assert!(
        !auto.fp8_saved_activations().unwrap(),
        "bf16 keeps them whole"
    );
    auto.recipe = "blockwise".into();
    assert!(!auto.fp8_saved_activations().unwrap(), "not measured there");
    auto.saved_activations = "fp8".into();
    assert!(auto.fp8_saved_activations().unwrap());
    auto.recipe = "tensorwise".into();
    auto.saved_activations = "full".into();
    assert!(!auto.fp8_saved_activations().unwrap());
    // The CPU model keeps f32 activations: asking for FP8 there is a clear
    // error, not a silent full run.
    let out = tmpdir("saved-fp8");
    let mut run = small_run("cpu-fp8", &out, "tensorwise");
    run.saved_activations = "fp8".into();
    let err =
        train(&run, None, &mut Quiet).expect_err("the CPU trainer has no FP8 saved activations");
    assert!(err.to_string().contains("--device cuda"), "{err}");
    assert!(!out.join("cpu-fp8").join("metrics.jsonl").exists());
}

#[test]
fn a_recomputing_run_gives_the_same_losses_with_less_saved() {
    // Six steps of the trainer (two optimizer updates roll delayed
    // scaling's histories in between): `--recompute` keeps only each block's
    // input for backward, and every loss must be the same bits.
    let out = tmpdir("recompute");
    for recipe in ["bf16", "delayed", "mxfp8"] {
        let run = |recompute: bool, recompute_blocks: usize| {
            let cfg = TrainConfig {
                recompute,
                recompute_blocks,
                eval_every: 0,
                ckpt_every: 0,
                save: false,
                ..small_run(
                    &format!("{recipe}-{recompute}-{recompute_blocks}"),
                    &out,
                    recipe,
                )
            };
            train(&cfg, None, &mut Quiet).unwrap()
        };
        // The tiny model has two blocks: all, or the first only.
        let (kept, again, first) = (run(false, 0), run(true, 0), run(false, 1));
        assert_eq!(kept.losses.len(), 6);
        for other in [&again, &first] {
            for (a, b) in kept.losses.iter().zip(&other.losses) {
                assert_eq!(a.to_bits(), b.to_bits(), "{recipe}: {a} vs {b}");
            }
        }
        let bytes = [&kept, &first, &again].map(|r| r.peak_saved_bytes);
        assert!(
            bytes[2] < bytes[0] / 2 && bytes[2] < bytes[1] && bytes[1] < bytes[0],
            "{recipe}: bytes saved keeping every block, recomputing the first, recomputing both: {bytes:?}"
        );
    }
    let both = TrainConfig {
        recompute: true,
        recompute_blocks: 1,
        ..small_run("both", &out, "bf16")
    };
    let e = train(&both, None, &mut Quiet).unwrap_err().to_string();
    assert!(e.contains("give one"), "{e}");
    let _ = std::fs::remove_dir_all(&out);
}

/// A resumed run trains with its own AdamW settings (`--weight-decay`,
/// `--grad-clip`), as the GPU and sharded trainers do, not the checkpoint's
/// while its metadata records the new ones.
#[test]
fn a_resumed_run_takes_its_own_adamw_settings() {
    let out = tmpdir("resume-adamw");
    let cfg = common::quick_run("first", &out, 2);
    train(&cfg, None, &mut Quiet).unwrap();
    let ck = out.join("first").join("checkpoints").join("step_000002");
    let mut again = TrainConfig {
        name: "again".into(),
        steps: 3,
        ..cfg.clone()
    };
    again.adamw.weight_decay = 0.5;
    again.adamw.grad_clip = 0.25;
    train(&again, Some(&ck), &mut Quiet).unwrap();
    let ck3 = out.join("again").join("checkpoints").join("step_000003");
    let mcfg = checkpoint::load_config(&ck3).unwrap();
    let params: Vec<(String, Vec<usize>)> = Llama::param_shapes(&mcfg);
    let (opt, _, _) = checkpoint::load_optimizer_for(&ck3, &params).unwrap();
    assert_eq!(opt.cfg, again.adamw);
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn the_8b_preset_has_llama3_8bs_shape_and_layers_keeps_its_first_blocks() {
    let mut cfg = TrainConfig {
        model: "8b".into(),
        layers: Some(2),
        ..Default::default()
    };
    let m = cfg.llama_config().unwrap();
    assert_eq!(
        (
            m.hidden_size,
            m.intermediate_size,
            m.num_attention_heads,
            m.num_key_value_heads,
            m.vocab_size,
            m.num_hidden_layers,
            m.rope_theta,
        ),
        (4096, 14336, 32, 8, 128_256, 2, 500_000.0)
    );
    cfg.layers = None;
    assert_eq!(cfg.llama_config().unwrap().num_hidden_layers, 32);
    cfg.layers = Some(0);
    let err = cfg.llama_config().expect_err("no blocks");
    assert!(err.to_string().contains("--layers 0"), "{err}");
    // A checkpoint gives its own blocks: --layers with --init is an error.
    cfg.layers = Some(2);
    cfg.init = Some("some/checkpoint".into());
    let err = cfg.llama_config().expect_err("--layers with --init");
    assert!(err.to_string().contains("--layers 2"), "{err}");
}

/// A run killed during an append (a torn last line in `metrics.jsonl`) and
/// between a checkpoint's rename and its `latest` update (a
/// `.latest.tmp.<pid>` left): resumed in its run directory, it cuts the torn
/// line before appending, so every line parses, and removes the dead
/// process's temporary files.
#[test]
fn a_run_resumed_after_a_kill_repairs_its_metrics_and_removes_stale_temp_files() {
    let out = tmpdir("resume-after-kill");
    let cfg = common::quick_run("killed", &out, 2);
    train(&cfg, None, &mut Quiet).unwrap();
    let run = out.join("killed");
    let metrics = run.join("metrics.jsonl");
    let mut text = std::fs::read_to_string(&metrics).unwrap();
    text.push_str(r#"{"step":3,"loss":4.1"#);
    std::fs::write(&metrics, text).unwrap();
    // No process has this id (Linux's pid_max is at most 2^22).
    let dead = 4_000_000_000u32;
    let stale = [
        run.join("checkpoints").join(format!(".latest.tmp.{dead}")),
        run.join(format!(".loss.png.tmp.{dead}")),
    ];
    for p in &stale {
        std::fs::write(p, "step_000003").unwrap();
    }
    // And a checkpoint directory the kill left half written.
    let half = run
        .join("checkpoints")
        .join(format!(".step_000003.tmp.{dead}.0"));
    std::fs::create_dir(&half).unwrap();
    std::fs::write(half.join("model.safetensors"), "partial").unwrap();
    let ck = run.join("checkpoints").join("step_000002");
    train(
        // No save: what is removed, the resume removed.
        &TrainConfig {
            steps: 3,
            save: false,
            ..cfg.clone()
        },
        Some(&ck),
        &mut Quiet,
    )
    .unwrap();
    let text = std::fs::read_to_string(&metrics).unwrap();
    let steps: Vec<u64> = text
        .lines()
        .map(|l| {
            let v: serde_json::Value =
                serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}"));
            v["step"].as_u64().unwrap()
        })
        .collect();
    assert_eq!(steps, [1, 2, 3], "{text}");
    #[cfg(target_os = "linux")]
    for p in stale.iter().chain([&half]) {
        assert!(!p.exists(), "{} is left", p.display());
    }
    let _ = std::fs::remove_dir_all(&out);
}

/// The summary's memory at the peak names the parameters, their gradients,
/// AdamW's f32 masters and moments (three f32 values a parameter) and the
/// saved activations, with the bytes the run held; the printed line sums them.
#[test]
fn a_cpu_run_reports_where_its_memory_went() {
    let out = tmpdir("memory-parts");
    let s = train(&small_run("mem", &out, "bf16"), None, &mut Quiet).unwrap();
    let part = |name: &str| {
        s.memory
            .iter()
            .find(|(n, _)| n.starts_with(name))
            .map(|(_, b)| *b)
            .unwrap_or_else(|| panic!("no {name} in {:?}", s.memory))
    };
    assert_eq!(part("parameters"), 4 * s.params, "{:?}", s.memory);
    assert_eq!(part("gradients"), 4 * s.params);
    assert_eq!(part("AdamW"), 12 * s.params);
    assert_eq!(part("saved"), s.peak_saved_bytes);
    assert!(s.peak_saved_bytes > 0);
    let total: usize = s.memory.iter().map(|(_, b)| b).sum();
    let line = octet_train::trainer::memory_line(&s.memory);
    // A tiny run's total is below 1 GiB: MiB.
    let mib = total as f64 / (1u64 << 20) as f64;
    assert!(
        line.starts_with(&format!("{mib:.2} MiB: parameters ")),
        "{line}"
    );
    let big = [("weights".to_string(), 3usize << 29)];
    assert_eq!(
        octet_train::trainer::memory_line(&big),
        "1.50 GiB: weights 1.50"
    );
    let _ = std::fs::remove_dir_all(&out);
}

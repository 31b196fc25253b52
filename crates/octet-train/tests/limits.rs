//! Extreme settings and corrupt checkpoint files are errors that name the
//! flag or field and its limit, never a wrapped product, a panic or a
//! run that trains nothing.

mod common;

use octet_nn::llama::{Llama, LlamaConfig};
use octet_tensor::DType;
use octet_train::checkpoint;
use octet_train::optim::{AdamW, AdamWConfig};
use octet_train::trainer::{train, LoraSettings, Quiet, TrainConfig, MAX_STEPS};

fn tmpdir(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("octet-limits-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn err(cfg: &TrainConfig) -> String {
    cfg.validate()
        .expect_err("the config should be rejected")
        .to_string()
}

#[test]
fn batch_seq_grad_accum_and_steps_are_bounded_with_checked_products() {
    let ok = TrainConfig {
        model: "tiny".into(),
        batch: 2,
        seq: 16,
        ..Default::default()
    };
    assert!(ok.validate().is_ok());
    // 2^61 x 2 wraps to 0 in a plain product.
    let e = err(&TrainConfig {
        batch: 1 << 61,
        seq: 2,
        ..ok.clone()
    });
    assert!(e.contains("--batch") && e.contains("limit"), "{e}");
    let e = err(&TrainConfig {
        grad_accum: usize::MAX,
        ..ok.clone()
    });
    assert!(e.contains("--grad-accum") && e.contains("limit"), "{e}");
    let e = err(&TrainConfig {
        batch: 1,
        seq: usize::MAX,
        ..ok.clone()
    });
    assert!(e.contains("--seq") && e.contains("limit"), "{e}");
    // Within the micro-batch cap, a sequence beyond the position cap.
    let e = err(&TrainConfig {
        batch: 1,
        seq: (octet_nn::llama::MAX_POSITIONS + 1),
        ..ok.clone()
    });
    assert!(e.contains("--seq") && e.contains("2097152"), "{e}");
    let e = err(&TrainConfig {
        steps: MAX_STEPS + 1,
        ..ok.clone()
    });
    assert!(e.contains("--steps") && e.contains("limit"), "{e}");
    // A LoRA rank that wraps rank * K is refused before anything is allocated.
    let e = err(&TrainConfig {
        lora: Some(LoraSettings {
            rank: (1 << 61) + 1,
            ..Default::default()
        }),
        ..ok.clone()
    });
    assert!(e.contains("--rank") && e.contains("65536"), "{e}");
}

#[test]
fn checkpoint_files_with_absurd_numbers_are_errors_naming_the_field() {
    let dir = tmpdir("files");
    let cfg = LlamaConfig::preset("tiny").unwrap();
    let model = Llama::new_random(&cfg, DType::F32, None, 1).unwrap();
    std::fs::create_dir_all(&dir).unwrap();
    checkpoint::save_model(&dir, &model).unwrap();
    assert_eq!(checkpoint::load_config(&dir).unwrap(), cfg);

    // config.json: positions that would ask Rope::new for terabytes.
    let mut big = cfg.clone();
    big.max_position_embeddings = 1_000_000_000_000;
    std::fs::write(
        dir.join("config.json"),
        octet_nn::hf_config::to_json(&big, DType::F32).to_string(),
    )
    .unwrap();
    let e = checkpoint::load_config(&dir).unwrap_err().to_string();
    assert!(
        e.contains("max_position_embeddings") && e.contains("limit"),
        "{e}"
    );
    let run = TrainConfig {
        init: Some(dir.clone()),
        ..Default::default()
    };
    assert!(run.validate().is_err(), "--init reads a validated config");

    // adapter_config.json: r that would ask for r x K floats first.
    let adapter = dir.join("adapter");
    std::fs::create_dir_all(&adapter).unwrap();
    for r in ["1000000000000", "0", "-1", "16.5"] {
        std::fs::write(
            adapter.join("adapter_config.json"),
            format!(r#"{{"r": {r}, "lora_alpha": 8.0, "target_modules": ["q_proj"]}}"#),
        )
        .unwrap();
        let e = checkpoint::load_adapter_config(&adapter)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&format!("r = {r}")) && e.contains("65536"),
            "{e}"
        );
        let e = checkpoint::load_adapter(&adapter).unwrap_err().to_string();
        assert!(e.contains("r = "), "{e}");
    }

    // optimizer.safetensors: a step whose i32 bias correction would wrap.
    let mut opt = AdamW::new(&model.params(), AdamWConfig::default());
    opt.step = MAX_STEPS + 1;
    checkpoint::save_optimizer(&dir, &opt, "{}", "").unwrap();
    let e = checkpoint::read_step(&dir).unwrap_err().to_string();
    assert!(e.contains("step 2147483648") && e.contains("limit"), "{e}");
    let params = param_shapes(&model);
    let e = checkpoint::load_optimizer_for(&dir, &params)
        .unwrap_err()
        .to_string();
    assert!(e.contains("step 2147483648"), "{e}");
    opt.step = 7;
    checkpoint::save_optimizer(&dir, &opt, "{}", "").unwrap();
    assert_eq!(checkpoint::read_step(&dir).unwrap(), 7);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn resuming_a_finished_run_is_an_error_not_an_empty_run() {
    let out = tmpdir("resume");
    let cfg = TrainConfig {
        eval_batches: 1,
        ..common::quick_run("done", &out, 2)
    };
    train(&cfg, None, &mut Quiet).unwrap();
    let ck = out.join("done").join("checkpoints").join("step_000002");
    assert_eq!(checkpoint::read_step(&ck).unwrap(), 2);
    for steps in [1, 2] {
        let again = TrainConfig {
            name: "again".into(),
            steps,
            ..cfg.clone()
        };
        let e = train(&again, Some(&ck), &mut Quiet)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("at step 2")
                && e.contains(&format!("--steps {steps}"))
                && e.contains("raise --steps"),
            "{e}"
        );
        assert!(!out.join("again").join("metrics.jsonl").exists());
    }
    let more = TrainConfig {
        name: "more".into(),
        steps: 3,
        ..cfg.clone()
    };
    let s = train(&more, Some(&ck), &mut Quiet).unwrap();
    assert_eq!(s.losses.len(), 1);
    assert!(s.final_loss.is_finite());
    let _ = std::fs::remove_dir_all(&out);
}

/// A peak `--lr` below the final `min_lr` (the default 3e-4, say, under
/// `--lr 1e-4`) would make the cosine "decay" raise the rate to `min_lr`:
/// an error naming both, not a schedule that climbs past the peak asked for.
#[test]
fn a_peak_learning_rate_below_the_final_one_is_an_error() {
    let ok = TrainConfig {
        model: "tiny".into(),
        batch: 2,
        seq: 16,
        ..Default::default()
    };
    let low = TrainConfig {
        lr: 1e-4,
        ..ok.clone()
    };
    // What the run would do: its last step's rate is above the peak.
    let last = octet_train::optim::lr_at(low.steps - 1, low.warmup, low.steps, low.lr, low.min_lr);
    assert!(last > low.lr, "{last}");
    let e = err(&low);
    assert!(
        e.contains("--lr") && e.contains("0.0001") && e.contains("min_lr") && e.contains("0.0003"),
        "{e}"
    );
    // Equal rates are a constant schedule, and no error.
    let flat = TrainConfig {
        lr: 3e-4,
        min_lr: 3e-4,
        ..ok.clone()
    };
    assert!(flat.validate().is_ok());
}

#[test]
fn non_finite_and_out_of_range_floats_are_errors_naming_the_setting_and_value() {
    let ok = TrainConfig {
        model: "tiny".into(),
        batch: 2,
        seq: 16,
        ..Default::default()
    };
    let adamw = |f: &dyn Fn(&mut AdamWConfig)| {
        let mut c = ok.clone();
        f(&mut c.adamw);
        c
    };
    let lora = |alpha: f64| TrainConfig {
        lora: Some(LoraSettings {
            alpha,
            ..Default::default()
        }),
        ..ok.clone()
    };
    let cases: Vec<(TrainConfig, &str, &str)> = vec![
        (
            TrainConfig {
                min_lr: f32::NAN,
                ..ok.clone()
            },
            "min_lr",
            "NaN",
        ),
        (
            TrainConfig {
                lr: f32::INFINITY,
                ..ok.clone()
            },
            "--lr",
            "inf",
        ),
        (
            adamw(&|a| a.weight_decay = f32::NAN),
            "--weight-decay",
            "NaN",
        ),
        (
            adamw(&|a| a.weight_decay = f32::INFINITY),
            "--weight-decay",
            "inf",
        ),
        (adamw(&|a| a.grad_clip = f32::NAN), "--grad-clip", "NaN"),
        (adamw(&|a| a.grad_clip = -1.0), "--grad-clip", "-1"),
        (adamw(&|a| a.beta1 = 1.0), "adamw.beta1", "= 1"),
        (adamw(&|a| a.beta2 = f32::NAN), "adamw.beta2", "NaN"),
        (lora(f64::NAN), "--alpha", "NaN"),
        (lora(f64::INFINITY), "--alpha", "inf"),
    ];
    for (cfg, name, value) in cases {
        let e = err(&cfg);
        assert!(e.contains(name) && e.contains(value), "{name}: {e}");
    }
    // 0 disables clipping, and is no error.
    assert!(adamw(&|a| a.grad_clip = 0.0).validate().is_ok());
}

#[test]
fn a_checkpoints_adamw_settings_are_checked_when_it_loads() {
    let dir = tmpdir("beta1");
    let cfg = LlamaConfig::preset("tiny").unwrap();
    let model = Llama::new_random(&cfg, DType::F32, None, 1).unwrap();
    let adamw = AdamWConfig {
        beta1: 1.0,
        ..Default::default()
    };
    let opt = AdamW::new(&model.params(), adamw);
    checkpoint::save_optimizer(&dir, &opt, "{}", "[]").unwrap();
    let params = param_shapes(&model);
    let e = checkpoint::load_optimizer_for(&dir, &params)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("optimizer.safetensors") && e.contains("adamw.beta1 = 1"),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn unknown_config_keys_are_errors_naming_the_key() {
    for (text, key) in [
        (r#"{"step": 2}"#, "step"),
        (r#"{"resume": "runs/x/checkpoints/step_000010"}"#, "resume"),
        (r#"{"lora": {"rnak": 8}}"#, "rnak"),
        (
            r#"{"adamw": {"beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.1, "grad_clip": 1.0, "clip": 2}}"#,
            "clip",
        ),
    ] {
        let e = serde_json::from_str::<TrainConfig>(text)
            .expect_err(text)
            .to_string();
        assert!(e.contains(&format!("unknown field `{key}`")), "{e}");
    }
    let c: TrainConfig = serde_json::from_str(r#"{"steps": 2}"#).unwrap();
    assert_eq!(c.steps, 2);
}

#[test]
fn a_validation_split_too_short_for_a_batch_fails_before_the_first_step() {
    let out = tmpdir("short-val");
    std::fs::create_dir_all(&out).unwrap();
    let data = out.join("small.txt");
    std::fs::write(&data, &octet_train::data::DEFAULT_CORPUS[..300]).unwrap();
    let cfg = TrainConfig {
        name: "short".into(),
        out_dir: out.clone(),
        model: "tiny".into(),
        data: Some(data.clone()),
        batch: 2,
        seq: 32,
        steps: 40,
        sample_tokens: 0,
        ..Default::default()
    };
    let e = train(&cfg, None, &mut Quiet).unwrap_err().to_string();
    assert!(
        e.contains("validation split") && e.contains("--seq 32") && e.contains("small.txt"),
        "{e}"
    );
    assert!(
        !out.join("short").join("metrics.jsonl").exists(),
        "steps ran before the error"
    );
    // Without evaluation the training split (270 tokens) is enough.
    let no_eval = TrainConfig {
        eval_batches: 0,
        ..cfg.clone()
    };
    assert!(no_eval.dataset(256).is_ok());
    // A training split too short is found as early.
    let long = TrainConfig {
        seq: 300,
        eval_batches: 0,
        ..cfg.clone()
    };
    let e = long.dataset(256).unwrap_err().to_string();
    assert!(e.contains("training split"), "{e}");
    let _ = std::fs::remove_dir_all(&out);
}

/// Every parameter's name and shape, as `load_optimizer_for` takes them.
fn param_shapes(model: &Llama) -> Vec<(String, Vec<usize>)> {
    model
        .params()
        .into_iter()
        .map(|(n, t)| (n, t.shape().to_vec()))
        .collect()
}

/// A resumed run trains the checkpoint's model, whatever `--model` says: a
/// tokenizer with more ids than its vocabulary, or a `--seq` beyond its
/// positions, is an error before anything trains (it was an error at the
/// first step, after the data loaded, or with `--model`'s larger vocabulary
/// passing the tokenizer check).
#[test]
fn a_resume_checks_the_tokenizer_and_seq_against_the_checkpoint() {
    let out = tmpdir("resume-dims");
    let cfg = common::quick_run("tiny", &out, 1);
    train(&cfg, None, &mut Quiet).unwrap();
    let ck = out.join("tiny").join("checkpoints").join("step_000001");
    let more = TrainConfig {
        name: "more".into(),
        model: "small".into(),
        steps: 2,
        ..cfg.clone()
    };
    assert!(more.check_resume(Some(&ck)).is_ok());
    let gpt2 = TrainConfig {
        tokenizer: "gpt2".into(),
        ..more.clone()
    };
    let e = gpt2.check_resume(Some(&ck)).unwrap_err().to_string();
    assert!(e.contains("gpt2") && e.contains("vocab_size is 256"), "{e}");
    // tiny has 64 positions, small 256.
    let long = TrainConfig {
        seq: 128,
        ..more.clone()
    };
    let e = long.check_resume(Some(&ck)).unwrap_err().to_string();
    assert!(e.contains("--seq 128") && e.contains("64"), "{e}");
    let e = train(&long, Some(&ck), &mut Quiet).unwrap_err().to_string();
    assert!(e.contains("--seq 128"), "{e}");
    assert!(!out.join("more").join("metrics.jsonl").exists());
    // A run started from --init keeps the checkpoint's dimensions too.
    let init = TrainConfig {
        init: Some(ck.clone()),
        ..more.clone()
    };
    assert!(init.validate().is_ok());
    let e = TrainConfig {
        seq: 128,
        ..init.clone()
    }
    .validate()
    .unwrap_err()
    .to_string();
    assert!(e.contains("--seq 128") && e.contains("--init"), "{e}");
    let e = TrainConfig {
        tokenizer: "gpt2".into(),
        ..init
    }
    .validate()
    .unwrap_err()
    .to_string();
    assert!(e.contains("gpt2"), "{e}");
    let _ = std::fs::remove_dir_all(&out);
}

/// `--sample-tokens 1e12` and `--eval-batches 1e12` were accepted and ran
/// without end, and `--lr 1e30` ran to a NaN loss: each is refused naming
/// the flag and its limit, and the limits themselves are accepted.
#[test]
fn sample_tokens_eval_batches_and_lr_past_their_limits_are_errors_naming_flag_and_limit() {
    use octet_train::trainer::{MAX_EVAL_BATCHES, MAX_LR, MAX_SAMPLE_TOKENS};
    let ok = TrainConfig {
        model: "tiny".into(),
        batch: 2,
        seq: 16,
        ..Default::default()
    };
    let at_limits = TrainConfig {
        sample_tokens: MAX_SAMPLE_TOKENS,
        eval_batches: MAX_EVAL_BATCHES,
        lr: MAX_LR,
        ..ok.clone()
    };
    assert!(at_limits.validate().is_ok());
    for (cfg, flag, limit) in [
        (
            TrainConfig {
                sample_tokens: 1_000_000_000_000,
                ..ok.clone()
            },
            "--sample-tokens",
            "1000000",
        ),
        (
            TrainConfig {
                eval_batches: 1_000_000_000_000,
                ..ok.clone()
            },
            "--eval-batches",
            "100000",
        ),
        (
            TrainConfig {
                lr: 1e30,
                ..ok.clone()
            },
            "--lr",
            "at most 10",
        ),
    ] {
        let e = err(&cfg);
        assert!(e.contains(flag) && e.contains(limit), "{flag}: {e}");
    }
}

/// A safetensors file of `header` (JSON) and `data` bytes at `path`.
fn safetensors_file(path: &std::path::Path, header: &str, data: &[u8]) {
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend(header.as_bytes());
    bytes.extend(data);
    std::fs::write(path, bytes).unwrap();
}

/// A `model.safetensors` that is a directory gave "No such device (os error
/// 19)"; a tensor whose dtype disagrees with its bytes (bf16 over f32-sized
/// data) or whose data offsets pass the end of the file gave the
/// safetensors crate's error, naming neither the tensor nor the file. Each
/// names what it is about.
#[test]
fn a_bad_safetensors_file_is_an_error_naming_the_file_and_the_tensor() {
    let dir = tmpdir("bad-safetensors");
    std::fs::create_dir_all(dir.join("model.safetensors")).unwrap();
    let p = dir.join("model.safetensors");
    let e = checkpoint::read_tensors(&p).unwrap_err().to_string();
    assert!(
        e.contains(&format!(
            "{} is a directory, not a safetensors file",
            p.display()
        )),
        "{e}"
    );
    let e = checkpoint::load_weights(&dir, DType::F32)
        .unwrap_err()
        .to_string();
    assert!(e.contains("is a directory, not a safetensors file"), "{e}");

    let p = dir.join("t.safetensors");
    let ok = r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"#;
    for (header, data, tensor, what) in [
        (
            format!(r#"{ok}"w":{{"dtype":"BF16","shape":[2,2],"data_offsets":[8,24]}}}}"#),
            vec![0u8; 24],
            "tensor w",
            "take 8 bytes",
        ),
        (
            format!(r#"{ok}"w":{{"dtype":"F32","shape":[4],"data_offsets":[8,24]}}}}"#),
            vec![0u8; 12],
            "tensor w",
            "lie outside",
        ),
    ] {
        safetensors_file(&p, &header, &data);
        let e = checkpoint::read_tensors(&p).unwrap_err().to_string();
        assert!(
            e.contains(&p.display().to_string()) && e.contains(tensor) && e.contains(what),
            "{header}: {e}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A loss that turns NaN (here from a NaN weight the run starts from) stops
/// the run with an error naming the step and suggesting a lower `--lr`, the
/// usual cause (`--lr 1e30` gave a message naming neither).
#[test]
fn a_non_finite_loss_names_the_step_and_suggests_lowering_lr() {
    let out = tmpdir("nan-loss");
    let init = out.join("init");
    let mcfg = LlamaConfig::preset("tiny").unwrap();
    let m = Llama::new_random(&mcfg, DType::F32, None, 3).unwrap();
    let mut w: std::collections::HashMap<_, _> = m
        .params()
        .into_iter()
        .map(|(n, t)| (n, t.clone()))
        .collect();
    let norm = &w["model.norm.weight"];
    let mut g = norm.to_f32_vec();
    g[0] = f32::NAN;
    let t = octet_tensor::Tensor::from_f32(norm.shape(), g).unwrap();
    w.insert("model.norm.weight".into(), t);
    let m = Llama::from_weights(&mcfg, w, None).unwrap();
    checkpoint::save_model(&init, &m).unwrap();
    checkpoint::write_config(&init, &mcfg, DType::F32).unwrap();
    let cfg = TrainConfig {
        init: Some(init),
        batch: 2,
        seq: 16,
        steps: 3,
        eval_batches: 0,
        sample_tokens: 0,
        save: false,
        out_dir: out.clone(),
        ..Default::default()
    };
    let e = train(&cfg, None, &mut Quiet).unwrap_err().to_string();
    assert!(e.contains("step 1:") && e.contains("lower --lr"), "{e}");
    let _ = std::fs::remove_dir_all(&out);
}

/// `--batch 65536 --seq 256` on the default model (over 400 GiB of
/// activations) was accepted and aborted in an allocation: it is refused
/// before anything is allocated, naming the estimate, the limit and the
/// flags that lower it; a run that fits is not.
#[test]
fn a_cpu_run_that_cannot_fit_in_host_memory_is_refused_naming_the_flags() {
    let huge = TrainConfig {
        batch: 65536,
        seq: 256,
        out_dir: tmpdir("memory"),
        ..Default::default()
    };
    let mcfg = huge.llama_config().unwrap();
    let plan = huge.memory_plan(&mcfg);
    assert!(plan.activations > 400 << 30, "{plan:?}");
    let e = huge
        .check_memory(&mcfg, Some(64 << 30))
        .unwrap_err()
        .to_string();
    for part in ["64.00 GiB", "--batch 65536", "--seq 256", "--recompute"] {
        assert!(e.contains(part), "{part}: {e}");
    }
    assert!(huge.check_memory(&mcfg, None).is_ok());
    let small = TrainConfig {
        model: "tiny".into(),
        batch: 2,
        seq: 16,
        ..Default::default()
    };
    assert!(small
        .check_memory(&small.llama_config().unwrap(), Some(64 << 30))
        .is_ok());
    // Recomputation lowers the floor, and the message no longer offers it.
    let recomputed = TrainConfig {
        recompute: true,
        ..huge.clone()
    };
    assert!(recomputed.memory_plan(&mcfg).activations < plan.activations);
    let e = recomputed
        .check_memory(&mcfg, Some(1 << 30))
        .unwrap_err()
        .to_string();
    assert!(!e.contains("--recompute"), "{e}");
    // The trainer checks the host's memory before it allocates.
    if let Some(avail) = octet_train::trainer::host_available_bytes() {
        assert!(avail < plan.total(), "this host has {avail} bytes");
        let e = train(&huge, None, &mut Quiet).unwrap_err().to_string();
        assert!(
            e.contains("--batch 65536") && e.contains("MemAvailable"),
            "{e}"
        );
    }
    let _ = std::fs::remove_dir_all(&huge.out_dir);
}

/// The GPU's floor refuses what cannot fit the device's free memory and
/// leaves the runs the benchmarks make: the ~1B model at batch 16 x 2048 and
/// four blocks of the 8B shape at batch 4 x 2048 fit an 80 GB GPU (their
/// measured peaks: 38-52 GiB), a batch of 2^20 sequences does not, and a
/// sharded rank's floor is below one GPU's.
#[test]
fn a_gpu_run_that_cannot_fit_the_devices_free_memory_is_refused_naming_the_flags() {
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    let free = Some(79u64 << 30);
    let one_b = TrainConfig {
        model: "1b".into(),
        batch: 16,
        seq: 2048,
        ..Default::default()
    };
    let m1 = one_b.llama_config().unwrap();
    let plan = one_b.device_memory_plan(&m1, 1);
    assert!(gib(plan.total()) < 52.0, "{plan:?}");
    assert!(one_b.check_device_memory(&m1, 1, free).is_ok());
    let sharded = one_b.device_memory_plan(&m1, 2);
    assert!(sharded.total() < plan.total(), "{sharded:?}");
    let eight = TrainConfig {
        model: "8b".into(),
        layers: Some(4),
        batch: 4,
        seq: 2048,
        ..Default::default()
    };
    let m8 = eight.llama_config().unwrap();
    assert!(eight.check_device_memory(&m8, 1, free).is_ok());
    let huge = TrainConfig {
        batch: 1 << 20,
        ..one_b.clone()
    };
    let e = huge
        .check_device_memory(&m1, 1, free)
        .expect_err("a million sequences")
        .to_string();
    for needle in [
        "device memory",
        "free on the GPU",
        "--batch 1048576",
        "--recompute",
    ] {
        assert!(e.contains(needle), "{needle}: {e}");
    }
    assert!(huge.check_device_memory(&m1, 1, None).is_ok());
}

/// An allocation the host cannot provide reaches the CLI's `error:` line
/// with the tensor crate's message as written (the byte count, the buffer
/// and the flags to lower), through the layer and training errors.
#[test]
fn an_allocation_error_keeps_its_message_through_the_training_error() {
    let t = octet_tensor::Tensor::zeros(&[1 << 40, 1 << 20], DType::F32).unwrap_err();
    assert!(matches!(t, octet_tensor::Error::Alloc { .. }), "{t:?}");
    let want = t.to_string();
    assert!(want.contains("4611686018427387904 bytes"), "{want}");
    let via_nn: octet_train::Error = octet_nn::Error::from(t.clone()).into();
    assert_eq!(via_nn.to_string(), want);
    let direct: octet_train::Error = t.clone().into();
    assert_eq!(direct.to_string(), want);
    // A failure inside a block keeps the message after the block's name.
    let in_layer = octet_nn::Error::InLayer("model.layers.3".into(), Box::new(t.into()));
    assert_eq!(in_layer.to_string(), format!("in model.layers.3: {want}"));
}

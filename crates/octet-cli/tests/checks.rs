//! Errors found before training, by the `octet` binary: an output directory
//! that cannot be made (named once, with its path), bad floating-point
//! flags, a LoRA resume with other settings or another base; and the
//! CPU-sharded run's `--no-save` and `--eval-batches 0`; a CPU benchmark's
//! `--reps 0`; a bad name in `octet compare --recipes`.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A fresh, empty temporary directory for test `tag`.
fn tmpdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("octet-checks-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

mod common;

use common::octet_in as octet;

/// A quick CPU run's flags.
const QUICK: [&str; 12] = [
    "--device",
    "cpu",
    "--model",
    "tiny",
    "--batch",
    "2",
    "--seq",
    "16",
    "--sample-tokens",
    "0",
    "--eval-batches",
    "0",
];

#[test]
fn an_output_directory_that_cannot_be_made_is_named_once() {
    let dir = tmpdir("io");
    std::fs::write(dir.join("file"), "a file, not a directory").expect("file");
    let out = dir.join("file").join("runs");
    let out = out.to_str().expect("utf-8 path");
    let mut args = vec!["train", "--steps", "1", "--out-dir", out];
    args.extend(QUICK);
    let (ok, text) = octet(&dir, &args);
    assert!(!ok, "{text}");
    let os = std::io::Error::from_raw_os_error(20).to_string(); // ENOTDIR
    let line = text
        .lines()
        .find(|l| l.starts_with("error:"))
        .unwrap_or_default();
    assert!(line.contains(out), "no path in: {line}");
    assert_eq!(line.matches(&os).count(), 1, "{line}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_floating_point_flags_are_errors_naming_the_flag_and_value() {
    let dir = tmpdir("floats");
    let out = dir.to_str().expect("utf-8 path");
    for (cmd, flag, value) in [
        ("train", "--weight-decay", "nan"),
        ("train", "--weight-decay", "inf"),
        ("train", "--grad-clip", "nan"),
        ("train", "--grad-clip", "-1"),
        ("lora", "--alpha", "nan"),
        ("lora", "--alpha", "inf"),
    ] {
        let given = format!("{flag}={value}");
        let mut args = vec![cmd, "--steps", "1", given.as_str(), "--out-dir", out];
        args.extend(QUICK);
        let (ok, text) = octet(&dir, &args);
        assert!(!ok, "{given} was accepted:\n{text}");
        let line = text
            .lines()
            .find(|l| l.starts_with("error:"))
            .unwrap_or_default()
            .to_lowercase();
        assert!(
            line.contains(flag) && line.contains(value),
            "{given}: {line}"
        );
    }
    assert!(!dir.join("default").exists() && !dir.join("lora").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_lora_resume_takes_the_adapters_settings_and_refuses_others() {
    let dir = tmpdir("lora-resume");
    let out = dir.to_str().expect("utf-8 path");
    let lora = |extra: &[&str]| {
        let mut args = vec!["lora", "--out-dir", out];
        args.extend(QUICK);
        args.extend(extra);
        octet(&dir, &args)
    };
    let (ok, text) = lora(&[
        "--steps",
        "2",
        "--rank",
        "4",
        "--alpha",
        "8",
        "--targets",
        "q,v",
    ]);
    assert!(ok, "{text}");
    let ck = dir.join("lora/checkpoints/step_000002");
    let ck = ck.to_str().expect("utf-8 path");
    // No --rank, --alpha, --targets or --base: the checkpoint's.
    let (ok, text) = lora(&["--steps", "3", "--resume", ck]);
    assert!(ok, "{text}");
    assert!(text.contains("rank 4 alpha 8 on q,v"), "{text}");
    let (ok, text) = lora(&["--steps", "3", "--resume", ck, "--alpha", "1000"]);
    assert!(!ok && text.contains("--alpha 1000"), "{text}");
    let (ok, text) = lora(&["--steps", "3", "--resume", ck, "--rank", "8"]);
    assert!(!ok && text.contains("--rank 8"), "{text}");
    // Trained on a random base: another base is refused.
    let (ok, text) = lora(&["--steps", "3", "--resume", ck, "--base", "elsewhere"]);
    assert!(!ok && text.contains("random base"), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sharded_cpu_runs_evaluate_every_eval_every_steps_as_one_process_does() {
    let dir = tmpdir("nproc-eval");
    let out = dir.to_str().expect("utf-8 path");
    // QUICK's flags but its `--eval-batches 0` (the last two).
    let mut args = vec!["train", "--nproc", "2", "--steps", "4", "--eval-every", "2"];
    args.extend(&QUICK[..QUICK.len() - 2]);
    args.extend(["--eval-batches", "1", "--no-save", "--out-dir", out]);
    let (ok, text) = octet(&dir, &args);
    assert!(ok, "{text}");
    let lines = std::fs::read_to_string(dir.join("default/metrics.jsonl")).expect("metrics");
    let mut val_steps = Vec::new();
    let mut last_val = None;
    for line in lines.lines().filter(|l| !l.trim().is_empty()) {
        let v: serde_json::Value = serde_json::from_str(line).expect("a JSON line");
        if let Some(val) = v.get("val_loss").and_then(serde_json::Value::as_f64) {
            assert!(val.is_finite() && val > 0.0, "{line}");
            val_steps.push(v["step"].as_u64().expect("step"));
            last_val = Some(val);
        }
    }
    assert_eq!(val_steps, [2, 4], "{lines}");
    // The summary reports the last step's evaluation.
    let last_val = last_val.expect("a val_loss");
    assert!(text.contains(&format!("val {last_val:.4},")), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The step records of `dir/NAME/metrics.jsonl` and its telemetry records.
fn metrics_of(dir: &Path, name: &str) -> (Vec<serde_json::Value>, Vec<serde_json::Value>) {
    let text = std::fs::read_to_string(dir.join(name).join("metrics.jsonl")).expect("metrics");
    let all: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    let (tel, steps) = all.into_iter().partition(|v| v.get("telemetry").is_some());
    (steps, tel)
}

/// `octet train ARGS` of the tiny model on the CPU, 4 steps of 16 tokens
/// with `dir/t.toml`, no checkpoints, evaluation or sample: the step records
/// of its metrics and its telemetry records.
fn sharded_run(
    dir: &Path,
    name: &str,
    extra: &[&str],
) -> (Vec<serde_json::Value>, Vec<serde_json::Value>) {
    let out = dir.to_str().expect("utf-8 path");
    let mut args = vec![
        "train",
        "--config",
        "t.toml",
        "--name",
        name,
        "--steps",
        "4",
        "--no-save",
        "--out-dir",
        out,
        "--device",
        "cpu",
        "--model",
        "tiny",
        "--seq",
        "16",
        "--sample-tokens",
        "0",
        "--eval-batches",
        "0",
    ];
    args.extend(extra);
    let (ok, text) = octet(dir, &args);
    assert!(ok, "{text}");
    metrics_of(dir, name)
}

/// A CPU-sharded run reports what each rank's forward keeps for backward
/// (`saved_bytes`; a rank's micro-batch is `--batch / --nproc` rows, so
/// without FP8-gathered weights it is the one-process trainer's figure for
/// that batch), not 0.
#[test]
fn sharded_cpu_runs_report_the_bytes_saved_for_backward() {
    let dir = tmpdir("nproc-saved");
    std::fs::write(dir.join("t.toml"), "").expect("config");
    let saved = |steps: &[serde_json::Value]| -> Vec<u64> {
        steps
            .iter()
            .map(|s| s["saved_bytes"].as_u64().expect("saved_bytes"))
            .collect()
    };
    let bf16 = ["--recipe", "bf16"];
    let (one, _) = sharded_run(&dir, "one", &[&bf16[..], &["--batch", "1"]].concat());
    let (two, _) = sharded_run(
        &dir,
        "two",
        &[&bf16[..], &["--batch", "2", "--nproc", "2"]].concat(),
    );
    let want = saved(&one)[0];
    assert!(want > 0);
    assert_eq!(saved(&two), [want; 4], "the sharded run's saved_bytes");
    let (fp8, _) = sharded_run(&dir, "fp8", &["--batch", "2", "--nproc", "2"]);
    assert!(saved(&fp8).iter().all(|&b| b > 0), "{fp8:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A CPU-sharded run writes the per-layer telemetry every `telemetry_every`
/// steps, with the layers and roles of the one-process trainer's.
#[test]
fn sharded_cpu_runs_write_telemetry_every_telemetry_every_steps() {
    let dir = tmpdir("nproc-telemetry");
    std::fs::write(dir.join("t.toml"), "telemetry_every = 2\n").expect("config");
    let (_, one) = sharded_run(&dir, "one", &["--batch", "1"]);
    let (_, two) = sharded_run(&dir, "two", &["--batch", "2", "--nproc", "2"]);
    let steps = |t: &[serde_json::Value]| -> Vec<u64> {
        t.iter()
            .map(|v| v["step"].as_u64().expect("step"))
            .collect()
    };
    assert_eq!(steps(&one), [2, 4]);
    assert_eq!(steps(&two), [2, 4], "the sharded run's telemetry");
    let names = |v: &serde_json::Value| -> Vec<(String, String)> {
        v["telemetry"]
            .as_array()
            .expect("layers")
            .iter()
            .map(|l| (l["layer"].to_string(), l["role"].to_string()))
            .collect()
    };
    assert_eq!(names(&one[0]), names(&two[0]));
    assert!(!names(&two[0]).is_empty());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sharded_cpu_runs_respect_no_save_and_report_no_val_without_evaluation() {
    let dir = tmpdir("nproc");
    let out = dir.to_str().expect("utf-8 path");
    let mut args = vec![
        "train",
        "--nproc",
        "2",
        "--steps",
        "2",
        "--no-save",
        "--out-dir",
        out,
    ];
    args.extend(QUICK);
    let (ok, text) = octet(&dir, &args);
    assert!(ok, "{text}");
    assert!(dir.join("default/metrics.jsonl").exists(), "{text}");
    assert!(
        !dir.join("default/checkpoints").exists(),
        "--no-save wrote a checkpoint:\n{text}"
    );
    assert!(
        text.contains("val -,") && !text.contains("val 0.0000"),
        "{text}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_cpu_benchmark_with_no_timed_runs_is_an_error_naming_the_flag() {
    let dir = tmpdir("reps");
    for op in ["gemm", "quantize", "linear", "mixed"] {
        let (ok, text) = octet(
            &dir,
            &[
                "bench", op, "--device", "cpu", "--reps", "0", "--shapes", "2x2x2", "--tensor",
                "2x2", "--mib", "1", "--m", "1", "--kn", "2x2",
            ],
        );
        assert!(!ok && text.contains("--reps 0"), "bench {op}: {text}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn compare_checks_every_recipe_before_training_any() {
    let dir = tmpdir("compare");
    let mut args = vec![
        "compare",
        "--recipes",
        "bf16,bogus",
        "--steps",
        "2",
        "--no-save",
        "--name",
        "cmp",
        "--out-dir",
        "runs",
    ];
    args.extend(QUICK);
    let (ok, text) = octet(&dir, &args);
    assert!(!ok && text.contains("'bogus'"), "{text}");
    assert!(
        !dir.join("runs").join("cmp-bf16").exists(),
        "bf16 trained before the bad recipe was found: {text}"
    );
    // A recipe named twice would be two runs in one directory.
    args[2] = "bf16,tensorwise,bf16";
    let (ok, text) = octet(&dir, &args);
    assert!(!ok && text.contains("names bf16 twice"), "{text}");
    assert!(!dir.join("runs").join("cmp-bf16").exists(), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `octet compare` trains every recipe from step 0 in one process: a
/// `--resume` or `--nproc` given to it is an error naming the flag, not a
/// flag dropped while the runs go ahead without it.
#[test]
fn compare_refuses_the_flags_it_does_not_apply() {
    let dir = tmpdir("compare-flags");
    for (flag, value) in [
        ("--resume", "runs/x/checkpoints/step_000002"),
        ("--nproc", "2"),
        ("--nnodes", "2"),
    ] {
        let mut args = vec![
            "compare",
            "--recipes",
            "bf16",
            "--steps",
            "1",
            "--no-save",
            "--name",
            "cmp",
            "--out-dir",
            "runs",
            flag,
            value,
        ];
        args.extend(QUICK);
        let (ok, text) = octet(&dir, &args);
        assert!(!ok && text.contains(flag), "{flag}: {text}");
        assert!(
            !dir.join("runs").join("cmp-bf16").exists(),
            "{flag}: {text}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `octet lora --config FILE` keeps its own defaults under the file: a file
/// that names no run trains into `runs/lora`, not `runs/default`, where it
/// replaced the checkpoint of `octet train` it took as its base (a
/// step_000003 of the same number) with an adapter and moved `latest` to it.
#[test]
fn a_lora_config_file_keeps_the_lora_defaults_and_the_trained_base() {
    let dir = tmpdir("lora-config");
    let mut args = vec!["train", "--steps", "3"];
    args.extend(QUICK);
    let (ok, text) = octet(&dir, &args);
    assert!(ok, "{text}");
    let base = dir.join("runs/default/checkpoints/step_000003");
    assert!(base.join("model.safetensors").is_file(), "{text}");
    let file = dir.join("lora.toml");
    std::fs::write(
        &file,
        "steps = 3\nbatch = 2\nseq = 16\nsample_tokens = 0\neval_batches = 0\n",
    )
    .expect("write the config");
    let file = file.to_str().expect("utf-8 path");
    let (ok, text) = octet(&dir, &["lora", "--config", file, "--device", "cpu"]);
    assert!(ok, "{text}");
    assert!(base.join("model.safetensors").is_file(), "{text}");
    assert!(!base.join("adapter_model.safetensors").exists(), "{text}");
    assert!(
        dir.join("runs/lora/checkpoints/step_000003/adapter_model.safetensors")
            .is_file(),
        "{text}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `octet lora` runs one process (`--nproc` is not available for LoRA):
/// the sharding flags are errors naming them, not dropped.
#[test]
fn lora_refuses_the_sharding_flags() {
    let dir = tmpdir("lora-nproc");
    for (flag, value) in [("--nproc", "2"), ("--nnodes", "2")] {
        let mut args = vec!["lora", "--steps", "1", "--no-save", flag, value];
        args.extend(QUICK);
        let (ok, text) = octet(&dir, &args);
        assert!(!ok && text.contains(flag), "{flag}: {text}");
        assert!(!dir.join("runs").join("lora").exists(), "{flag}: {text}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The `[lora]` table of `octet lora --config` is what the run trains
/// (flags still go over it): its rank, alpha, targets and base format
/// were replaced by the flags' defaults (rank 16, alpha 32, every
/// projection, fp8-tensorwise).
#[test]
fn a_lora_config_files_lora_table_is_used() {
    let dir = tmpdir("lora-table");
    let file = dir.join("lora.toml");
    std::fs::write(
        &file,
        "[lora]\nrank = 4\nalpha = 8.0\ntargets = [\"q\", \"v\"]\nbase_format = \"bf16\"\ncompute = \"bf16\"\n",
    )
    .expect("write the config");
    let file = file.to_str().expect("utf-8 path");
    let mut args = vec!["lora", "--config", file, "--steps", "1", "--name", "l"];
    args.extend(QUICK);
    let (ok, text) = octet(&dir, &args);
    assert!(ok, "{text}");
    assert!(text.contains("stored as bf16, compute bf16"), "{text}");
    let cfg = dir.join("runs/l/checkpoints/step_000001/adapter_config.json");
    let cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cfg).expect("adapter config"))
            .expect("json");
    assert_eq!(
        (cfg["r"].as_u64(), cfg["lora_alpha"].as_f64()),
        (Some(4), Some(8.0)),
        "{cfg}"
    );
    assert_eq!(
        cfg["target_modules"].as_array().map(Vec::len),
        Some(2),
        "{cfg}"
    );
    // A flag still goes over the file.
    args[6] = "l2";
    args.extend(["--rank", "2"]);
    let (ok, text) = octet(&dir, &args);
    assert!(ok && text.contains("rank 2 alpha 8"), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_bench_json_that_cannot_be_written_is_named_once() {
    let dir = tmpdir("bench-json");
    std::fs::write(dir.join("file"), "a file, not a directory").expect("file");
    let json = dir.join("file").join("out.json");
    let json = json.to_str().expect("utf-8 path");
    let args = [
        "bench", "quantize", "--device", "cpu", "--mib", "1", "--reps", "1", "--json", json,
    ];
    let (ok, text) = octet(&dir, &args);
    assert!(!ok, "{text}");
    assert_eq!(text.matches(json).count(), 1, "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_compare_whose_every_recipe_fails_reports_their_errors() {
    let dir = tmpdir("compare-fails");
    // Settings that send every run's weights to NaN within steps (--lr
    // itself is capped at 10; a weight decay of 1e30 overflows at once).
    let mut args = vec![
        "compare",
        "--recipes",
        "bf16,tensorwise",
        "--steps",
        "4",
        "--lr",
        "10",
        "--weight-decay",
        "1e30",
        "--no-save",
        "--name",
        "c",
        "--out-dir",
        "runs",
    ];
    args.extend(QUICK);
    let (ok, text) = octet(&dir, &args);
    assert!(!ok, "{text}");
    assert!(text.contains("every recipe failed"), "{text}");
    // Each names its step and the flag to lower.
    assert_eq!(text.matches("lower --lr").count(), 4, "{text}");
    assert!(!dir.join("runs").join("c-compare.json").exists(), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--no-save` writes no checkpoint, and the closing line of `octet train`
/// and `octet lora` says so instead of naming a `checkpoints/` it did not write.
#[test]
fn a_run_with_no_save_does_not_claim_to_have_written_checkpoints() {
    let dir = tmpdir("nosave");
    let out = dir.to_str().expect("utf-8 path");
    for cmd in ["train", "lora"] {
        let mut args = vec![cmd, "--steps", "1", "--no-save", "--out-dir", out];
        args.extend(QUICK);
        let (ok, text) = octet(&dir, &args);
        assert!(ok, "{cmd}: {text}");
        let name = if cmd == "train" { "default" } else { "lora" };
        assert!(!dir.join(name).join("checkpoints").exists(), "{text}");
        assert!(!text.contains("checkpoints/"), "{cmd}: {text}");
        assert!(text.contains("no checkpoint: --no-save"), "{cmd}: {text}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `-v` traces every step on standard error (the bar gives way to it) and
/// the checkpoint it writes; without it nothing is traced.
#[test]
fn verbose_traces_steps_and_checkpoints_on_stderr() {
    let dir = tmpdir("verbose");
    let run = |extra: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_octet"))
            .args(["train"])
            .args(QUICK)
            .args(["--out-dir", "o", "--steps", "2"])
            .args(extra)
            .current_dir(&dir)
            .output()
            .expect("the octet binary runs");
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let traced = run(&["-v", "--name", "v"]);
    for want in ["DEBUG", "step=1", "step=2", "loss=", "checkpoint written"] {
        assert!(traced.contains(want), "no {want:?} in:\n{traced}");
    }
    let quiet = run(&["--name", "q"]);
    assert!(!quiet.contains("DEBUG"), "{quiet}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Without a GPU, `octet selftest` says it needs one and does not suggest
/// `--device cpu` (which has nothing to compare); `octet train --device
/// cuda` does suggest it.
#[test]
fn selftest_without_a_gpu_does_not_point_to_the_cpu() {
    let dir = tmpdir("selftest");
    let (ok, text) = octet(&dir, &["selftest"]);
    if ok || !text.contains("libcuda could not be loaded") {
        return; // a machine with a driver: nothing to check here
    }
    assert!(!text.contains("--device cpu"), "{text}");
    let (ok, text) = octet(&dir, &["selftest", "--device", "cpu"]);
    assert!(!ok && text.contains("no GPU is available"), "{text}");
    let (ok, text) = octet(&dir, &["train", "--device", "cuda", "--steps", "1"]);
    assert!(
        !ok && text.contains("--device cpu runs on the CPU"),
        "{text}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--device cpu` runs the ranks as threads of one process: `--nnodes`
/// (machines joined over NCCL) and `--master-port` do not apply there and
/// are errors naming them, not a GPU job started against `--device cpu`.
#[test]
fn cpu_sharded_runs_refuse_the_multi_machine_flags() {
    let dir = tmpdir("cpu-nnodes");
    for (flag, extra) in [
        ("--nnodes", &["--nnodes", "2"][..]),
        ("--nnodes", &["--nnodes", "2", "--node-rank", "1"][..]),
        (
            "--master-port",
            &["--nproc", "2", "--master-port", "29511"][..],
        ),
    ] {
        let mut args = vec!["train", "--steps", "1", "--no-save", "--dist-timeout", "5"];
        args.extend(extra);
        args.extend(QUICK);
        let (ok, text) = octet(&dir, &args);
        assert!(!ok, "{extra:?}: {text}");
        assert!(
            text.contains(flag) && text.contains("--device cpu"),
            "{extra:?}: {text}"
        );
        assert!(
            !text.contains("GPU 0") && !text.contains("rendezvous"),
            "{extra:?}: {text}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A second run into a run directory is refused: it appended its steps to
/// the first's `metrics.jsonl` and replaced its checkpoints at the same
/// steps. Resuming that run goes on in it; an empty `--name` (which wrote
/// into the out-dir itself) is refused.
#[test]
fn a_run_directory_takes_one_run() {
    let dir = tmpdir("onerun");
    let out = dir.to_str().expect("utf-8 path");
    let base = |steps: &'static str| {
        let mut a = vec!["train", "--out-dir", out, "--name", "r", "--steps", steps];
        a.extend(QUICK);
        a
    };
    let (ok, text) = octet(&dir, &base("2"));
    assert!(ok, "{text}");
    let metrics = std::fs::read_to_string(dir.join("r/metrics.jsonl")).expect("metrics");
    let (ok, text) = octet(&dir, &base("2"));
    assert!(!ok && text.contains("already holds a run"), "{text}");
    assert_eq!(
        std::fs::read_to_string(dir.join("r/metrics.jsonl")).expect("metrics"),
        metrics,
        "the refused run wrote metrics"
    );
    let run_dir = dir.join("r");
    let mut resume = base("3");
    resume.extend(["--resume", run_dir.to_str().expect("utf-8 path")]);
    let (ok, text) = octet(&dir, &resume);
    assert!(ok, "{text}");
    let mut empty = vec!["train", "--out-dir", out, "--name", "", "--steps", "1"];
    empty.extend(QUICK);
    let (ok, text) = octet(&dir, &empty);
    assert!(!ok && text.contains("--name"), "{text}");
    assert!(!dir.join("metrics.jsonl").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

/// A resumed run takes the settings its checkpoint records where no flag
/// gives them: it went on with the byte tokenizer and the default `--seq`
/// (refused as too long for the model) after a GPT-2-tokenized run of 16
/// tokens a row. Another tokenizer is an error.
#[test]
fn a_resumed_run_keeps_its_recorded_settings() {
    let dir = tmpdir("resume-settings");
    let out = dir.to_str().expect("utf-8 path");
    let mut first = vec!["train", "--out-dir", out, "--name", "g", "--steps", "2"];
    first.extend(QUICK);
    first.extend(["--tokenizer", "gpt2"]);
    let (ok, text) = octet(&dir, &first);
    assert!(ok, "{text}");
    let run = dir.join("g");
    let run_s = run.to_str().expect("utf-8 path");
    let resume = [
        "train", "--device", "cpu", "--resume", run_s, "--steps", "3",
    ];
    let (ok, text) = octet(&dir, &resume);
    assert!(ok, "{text}");
    let ck = run.join("checkpoints/step_000003");
    let rec = octet_train::checkpoint::read_trainer_settings(&ck)
        .expect("readable")
        .expect("recorded");
    let rec: serde_json::Value = serde_json::from_str(&rec).expect("json");
    assert_eq!(
        (rec["tokenizer"].as_str(), rec["seq"].as_u64()),
        (Some("gpt2"), Some(16))
    );
    let mut other = resume.to_vec();
    other[6] = "4";
    other.extend(["--tokenizer", "byte"]);
    let (ok, text) = octet(&dir, &other);
    assert!(!ok && text.contains("gpt2"), "{text}");
    // Generation with the other tokenizer decoded most ids as U+FFFD.
    let gen = [
        "generate",
        "--device",
        "cpu",
        "--checkpoint",
        run_s,
        "--prompt",
        "hi",
    ];
    let (ok, text) = octet(&dir, &[&gen[..], &["--tokenizer", "byte"]].concat());
    assert!(!ok && text.contains("gpt2"), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A sharded CPU run (`--nproc`) draws `loss.png` and prints its sample as
/// one process does, and a resumed one counts the steps it took (it printed
/// `--steps`, the steps before its checkpoint included).
#[test]
fn a_sharded_run_plots_samples_and_counts_its_own_steps() {
    let dir = tmpdir("sharded");
    let out = dir.to_str().expect("utf-8 path");
    let mut first = vec![
        "train",
        "--out-dir",
        out,
        "--name",
        "s",
        "--steps",
        "2",
        "--nproc",
        "2",
    ];
    first.extend(QUICK);
    let n = first.len();
    first[n - 3] = "5"; // --sample-tokens 5
    let (ok, text) = octet(&dir, &first);
    assert!(ok, "{text}");
    assert!(dir.join("s/loss.png").exists(), "{text}");
    assert!(
        text.contains("sample:") && text.contains("over 2 steps"),
        "{text}"
    );
    let run = dir.join("s");
    let resume = [
        "train",
        "--device",
        "cpu",
        "--resume",
        run.to_str().expect("utf-8 path"),
        "--steps",
        "3",
        "--nproc",
        "2",
    ];
    let (ok, text) = octet(&dir, &resume);
    assert!(ok && text.contains("over 1 steps"), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A LoRA base stored in FP8 (here per tensor, by `lora merge --dtype fp8`)
/// is kept as stored: `--base-format fp8-block` was printed and recorded
/// while the per-tensor codes trained. It is now refused, and without the
/// flag the run reports the stored form.
#[test]
fn a_base_stored_in_fp8_reports_its_own_form() {
    let dir = tmpdir("fp8-base");
    let out = dir.to_str().expect("utf-8 path");
    let run = |extra: &[&str]| {
        let mut a: Vec<&str> = extra.to_vec();
        a.extend(QUICK);
        a.extend(["--out-dir", out, "--steps", "1"]);
        octet(&dir, &a)
    };
    let (ok, text) = run(&["train", "--name", "good"]);
    assert!(ok, "{text}");
    let good = dir.join("good");
    let good = good.to_str().expect("utf-8 path");
    let (ok, text) = run(&["lora", "--base", good, "--name", "l1"]);
    assert!(ok, "{text}");
    let (adapter, merged) = (dir.join("l1"), dir.join("merged8"));
    let merge = [
        "lora",
        "merge",
        "--base",
        good,
        "--adapter",
        adapter.to_str().expect("utf-8 path"),
        "--out",
        merged.to_str().expect("utf-8 path"),
        "--dtype",
        "fp8",
    ];
    let (ok, text) = octet(&dir, &merge);
    assert!(ok, "{text}");
    let merged = merged.to_str().expect("utf-8 path");
    let (ok, text) = run(&[
        "lora",
        "--base",
        merged,
        "--base-format",
        "fp8-block",
        "--name",
        "l2",
    ]);
    assert!(!ok && text.contains("fp8-tensorwise"), "{text}");
    let (ok, text) = run(&["lora", "--base", merged, "--name", "l3"]);
    assert!(ok && text.contains("stored as fp8-tensorwise"), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A LoRA run's checkpoint given where a full model is read, and a run
/// directory whose `latest` file is gone, are named as such (they were
/// reported as a missing `model.safetensors` or `config.json`).
#[test]
fn adapter_checkpoints_and_runs_without_latest_are_named() {
    let dir = tmpdir("named");
    let out = dir.to_str().expect("utf-8 path");
    let run = |extra: &[&str]| {
        let mut a: Vec<&str> = extra.to_vec();
        a.extend(QUICK);
        a.extend(["--out-dir", out, "--steps", "1"]);
        octet(&dir, &a)
    };
    let (ok, text) = run(&["train", "--name", "base"]);
    assert!(ok, "{text}");
    let base = dir.join("base");
    let (ok, text) = run(&[
        "lora",
        "--base",
        base.to_str().expect("utf-8"),
        "--name",
        "ad",
    ]);
    assert!(ok, "{text}");
    let ad = dir.join("ad");
    let ad = ad.to_str().expect("utf-8 path");
    let (ok, text) = octet(&dir, &["generate", "--checkpoint", ad, "--prompt", "hi"]);
    assert!(
        !ok && text.contains("LoRA adapter") && text.contains("--adapter"),
        "{text}"
    );
    let (ok, text) = octet(
        &dir,
        &["train", "--device", "cpu", "--resume", ad, "--steps", "3"],
    );
    assert!(!ok && text.contains("octet lora --resume"), "{text}");
    std::fs::remove_file(base.join("checkpoints/latest")).expect("latest");
    let b = base.to_str().expect("utf-8 path");
    let (ok, text) = octet(&dir, &["generate", "--checkpoint", b, "--prompt", "hi"]);
    assert!(
        !ok && text.contains("no `latest`") && text.contains("step_000001"),
        "{text}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Every run directory a command will write is checked before the first
/// run trains: `octet compare` trained its free recipes and then failed on
/// a taken one, replacing the earlier comparison's files, and `lora
/// --compare-bf16` failed after the FP8 run. A run with no checkpoint is
/// not offered a resume it cannot take.
#[test]
fn taken_run_directories_are_refused_before_anything_trains() {
    let dir = tmpdir("taken");
    let out = dir.to_str().expect("utf-8 path");
    let run = |extra: &[&str]| {
        let mut a: Vec<&str> = extra.to_vec();
        a.extend(QUICK);
        a.extend(["--out-dir", out, "--steps", "1"]);
        octet(&dir, &a)
    };
    let (ok, text) = run(&["train", "--name", "c-tensorwise", "--no-save"]);
    assert!(ok, "{text}");
    let (ok, text) = run(&["train", "--name", "c-tensorwise"]);
    assert!(
        !ok && text.contains("no checkpoint") && !text.contains("--resume"),
        "{text}"
    );
    let (ok, text) = run(&["compare", "--name", "c", "--recipes", "bf16,tensorwise"]);
    assert!(!ok && text.contains("c-tensorwise"), "{text}");
    assert!(!dir.join("c-bf16").exists(), "compare trained bf16 first");
    let (ok, text) = run(&["train", "--name", "l-bf16base"]);
    assert!(ok, "{text}");
    let (ok, text) = run(&["lora", "--name", "l", "--compare-bf16"]);
    assert!(!ok && text.contains("--compare-bf16"), "{text}");
    assert!(!dir.join("l").exists(), "the FP8 run trained first");
    let _ = std::fs::remove_dir_all(&dir);
}

/// An adapter recorded by an earlier build with the FP8 form asked for
/// (here fp8-block) over a base stored per tensor resumes: every FP8 form
/// trained the stored codes. Before, the resume asked for the recorded
/// form and the base check refused it.
#[test]
fn an_adapter_over_an_fp8_base_resumes_whatever_fp8_form_it_recorded() {
    let dir = tmpdir("old-record");
    let out = dir.to_str().expect("utf-8 path");
    let run = |extra: &[&str]| {
        let mut a: Vec<&str> = extra.to_vec();
        a.extend(QUICK);
        a.extend(["--out-dir", out]);
        octet(&dir, &a)
    };
    let (ok, text) = run(&["train", "--name", "good", "--steps", "1"]);
    assert!(ok, "{text}");
    let (good, adapter, merged) = (dir.join("good"), dir.join("l1"), dir.join("m8"));
    let (ok, text) = run(&[
        "lora",
        "--base",
        good.to_str().expect("utf-8"),
        "--name",
        "l1",
        "--steps",
        "1",
    ]);
    assert!(ok, "{text}");
    let merge = [
        "lora",
        "merge",
        "--base",
        good.to_str().expect("utf-8"),
        "--adapter",
        adapter.to_str().expect("utf-8"),
        "--out",
        merged.to_str().expect("utf-8"),
        "--dtype",
        "fp8",
    ];
    let (ok, text) = octet(&dir, &merge);
    assert!(ok, "{text}");
    let m8 = merged.to_str().expect("utf-8");
    let (ok, text) = run(&["lora", "--base", m8, "--name", "l2", "--steps", "1"]);
    assert!(ok, "{text}");
    let rec = dir.join("l2/checkpoints/step_000001/octet_lora.json");
    let text = std::fs::read_to_string(&rec).expect("record");
    assert!(text.contains("fp8-tensorwise"), "{text}");
    std::fs::write(&rec, text.replace("fp8-tensorwise", "fp8-block")).expect("write");
    let l2 = dir.join("l2");
    let resume = [
        "lora",
        "--device",
        "cpu",
        "--resume",
        l2.to_str().expect("utf-8"),
        "--steps",
        "2",
    ];
    let (ok, text) = octet(&dir, &resume);
    assert!(ok, "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A sharded CPU run stopped at a checkpoint and resumed repeats the
/// uninterrupted run's losses bit for bit (the one loop's resume, with the
/// model and optimizer gathered into one checkpoint and sharded again).
#[test]
fn a_resumed_sharded_cpu_run_repeats_the_uninterrupted_one() {
    let dir = tmpdir("nproc-resume");
    let out = dir.to_str().expect("utf-8 path");
    let run = |name: &str, steps: &str, extra: &[&str]| {
        let mut args = vec![
            "train",
            "--nproc",
            "2",
            "--name",
            name,
            "--steps",
            steps,
            "--ckpt-every",
            "2",
            "--out-dir",
            out,
        ];
        args.extend(QUICK);
        args.extend(extra);
        let (ok, text) = octet(&dir, &args);
        assert!(ok, "{text}");
    };
    run("whole", "4", &[]);
    run("half", "2", &[]);
    let ck = dir.join("half/checkpoints/step_000002");
    let ck = ck.to_str().expect("utf-8 path");
    run("half", "4", &["--resume", ck]);
    let losses = |name: &str| -> Vec<u64> {
        metrics_of(&dir, name)
            .0
            .iter()
            .map(|v| v["loss"].as_f64().expect("loss").to_bits())
            .collect()
    };
    let (whole, resumed) = (losses("whole"), losses("half"));
    assert_eq!(whole.len(), 4);
    assert_eq!(whole, resumed, "the resumed run's losses differ");
    let _ = std::fs::remove_dir_all(&dir);
}

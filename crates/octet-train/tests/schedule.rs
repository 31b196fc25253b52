//! The learning-rate schedule as `metrics.jsonl` records it, and the
//! backward mode of the bf16 baseline.

mod common;

use octet_train::trainer::{train, Quiet, TrainConfig};

fn tmpdir(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("octet-schedule-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// `--min-lr` is documented as the final learning rate of the cosine
/// decay: the last step's rate in `metrics.jsonl` is `min_lr`, after a
/// linear warmup to `lr` (step 1 of 4 at `lr`, a warmup of one step); it was
/// `min_lr + 0.146 (lr - min_lr)` on a 4-step run, never the final rate.
#[test]
fn the_last_step_runs_at_min_lr_and_the_rates_follow_the_cosine() {
    let out = tmpdir("lr");
    let cfg = TrainConfig {
        lr: 1e-2,
        min_lr: 1e-3,
        warmup: 1,
        save: false,
        ..common::quick_run("lr", &out, 4)
    };
    train(&cfg, None, &mut Quiet).expect("train");
    let text = std::fs::read_to_string(out.join("lr/metrics.jsonl")).expect("metrics");
    let lrs: Vec<f64> = text
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("a JSON line"))
        .map(|v| v["lr"].as_f64().expect("lr"))
        .collect();
    // Warmup (step 1), then the cosine from lr at step 2 to min_lr at step 4.
    let cos = |p: f64| 1e-3 + 0.5 * (1e-2 - 1e-3) * (1.0 + (std::f64::consts::PI * p).cos());
    let want = [1e-2, cos(0.0), cos(0.5), cos(1.0)];
    assert_eq!(lrs.len(), 4, "{text}");
    for (i, (&got, want)) in lrs.iter().zip(want).enumerate() {
        assert!(
            (got - want).abs() < 1e-7,
            "step {}: lr {got}, want {want}",
            i + 1
        );
    }
    let _ = std::fs::remove_dir_all(&out);
}

/// `--recipe bf16 --backward bogus` is an error naming the mode, as it is
/// under every FP8 recipe; it was accepted and dropped without a word.
#[test]
fn a_bad_backward_mode_is_an_error_under_bf16_too() {
    let cfg = TrainConfig {
        model: "tiny".into(),
        recipe: "bf16".into(),
        backward: "bogus".into(),
        ..Default::default()
    };
    let e = cfg.validate().expect_err("--backward bogus").to_string();
    assert!(e.contains("bogus"), "{e}");
    for mode in ["quantized", "high_precision", "dequantized"] {
        let ok = TrainConfig {
            backward: mode.into(),
            ..cfg.clone()
        };
        assert!(ok.validate().is_ok(), "{mode}");
    }
}

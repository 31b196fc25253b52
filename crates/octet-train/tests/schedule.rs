//! The learning-rate schedule as `metrics.jsonl` records it, and the
//! backward mode of the bf16 baseline.

use octet_train::trainer::TrainConfig;

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

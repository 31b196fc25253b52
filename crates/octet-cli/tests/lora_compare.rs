//! `octet lora --compare-bf16` with the `quantized` backward: the bf16 base's
//! run cannot use that backward (it needs an FP8 base) and takes the
//! high-precision one, so both runs finish and the comparison is printed.

mod common;

#[test]
fn compare_bf16_runs_the_bf16_base_under_the_quantized_backward() {
    let args: Vec<&str> = "lora --device cpu --model tiny --compare-bf16 --backward quantized --steps 2 --batch 2 --seq 32 --eval-every 2 --sample-tokens 0 --no-save"
        .split_whitespace()
        .collect();
    let (ok, text) = common::run_octet("lora-compare", &args, &[]);
    assert!(ok, "the comparison failed:\n{text}");
    assert!(
        text.contains("FP8 base vs bf16 base: final validation loss"),
        "no comparison printed:\n{text}"
    );
    assert!(
        text.contains("bwd:high_precision"),
        "the bf16 base's backward:\n{text}"
    );
}

/// Without evaluation (`--eval-batches 0`) there is no validation loss to
/// compare: the comparison says so instead of printing `NaN%`.
#[test]
fn compare_bf16_without_evaluation_prints_no_nan() {
    let args: Vec<&str> = "lora --device cpu --model tiny --compare-bf16 --steps 1 --batch 2 --seq 32 --eval-batches 0 --sample-tokens 0 --no-save"
        .split_whitespace()
        .collect();
    let (ok, text) = common::run_octet("lora-compare-noeval", &args, &[]);
    assert!(ok, "the comparison failed:\n{text}");
    assert!(!text.contains("NaN"), "{text}");
    assert!(
        text.contains("FP8 base vs bf16 base: no validation loss to compare"),
        "{text}"
    );
}

//! `octet lora --compare-bf16` with the `quantized` backward: the bf16 base's
//! run cannot use that backward (it needs an FP8 base) and takes the
//! high-precision one, so both runs finish and the comparison is printed.

use std::process::Command;

#[test]
fn compare_bf16_runs_the_bf16_base_under_the_quantized_backward() {
    let out_dir = std::env::temp_dir().join(format!("octet-lora-compare-{}", std::process::id()));
    let out = Command::new(env!("CARGO_BIN_EXE_octet"))
        .args([
            "lora",
            "--device",
            "cpu",
            "--model",
            "tiny",
            "--compare-bf16",
        ])
        .args([
            "--backward",
            "quantized",
            "--steps",
            "2",
            "--batch",
            "2",
            "--seq",
            "32",
        ])
        .args(["--eval-every", "2", "--sample-tokens", "0", "--no-save"])
        .arg("--out-dir")
        .arg(&out_dir)
        .output()
        .expect("the octet binary runs");
    let _ = std::fs::remove_dir_all(&out_dir);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "the comparison failed:\n{text}");
    assert!(
        text.contains("FP8 base vs bf16 base: final validation loss"),
        "no comparison printed:\n{text}"
    );
    assert!(
        text.contains("bwd:high_precision"),
        "the bf16 base's backward:\n{text}"
    );
}

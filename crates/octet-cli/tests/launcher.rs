//! The multi-GPU launcher's failure path, on any machine: with no GPU
//! visible, every rank fails to open its device, and the launcher must end
//! the job with an error naming the rank (not hang, not report success).

use std::process::Command;
use std::time::{Duration, Instant};

#[test]
fn a_failing_rank_ends_the_job_with_a_clear_error() {
    let out_dir = std::env::temp_dir().join(format!("octet-launcher-{}", std::process::id()));
    let t0 = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_octet"))
        .args([
            "train", "--nproc", "2", "--device", "cuda", "--model", "tiny",
        ])
        .args(["--steps", "1", "--batch", "2", "--seq", "16", "--no-save"])
        .arg("--out-dir")
        .arg(&out_dir)
        // No device visible to the ranks, whatever this machine has.
        .env("CUDA_VISIBLE_DEVICES", "")
        .output()
        .expect("the octet binary runs");
    let _ = std::fs::remove_dir_all(&out_dir);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "the job reported success:\n{text}");
    assert!(
        text.contains("ended with") && text.contains("rank"),
        "no rank named in:\n{text}"
    );
    assert!(
        text.contains("CUDA") || text.contains("libcuda") || text.contains("device"),
        "the rank's reason is missing:\n{text}"
    );
    assert!(
        t0.elapsed() < Duration::from_secs(120),
        "the job took too long to fail"
    );
}

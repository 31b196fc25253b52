//! The multi-GPU launcher's failure path, on any machine: with no GPU
//! visible, every rank fails to open its device, and the launcher must end
//! the job with an error naming the rank (not hang, not report success).

mod common;

use std::time::{Duration, Instant};

#[test]
fn a_failing_rank_ends_the_job_with_a_clear_error() {
    let t0 = Instant::now();
    let args: Vec<&str> =
        "train --nproc 2 --device cuda --model tiny --steps 1 --batch 2 --seq 16 --no-save"
            .split_whitespace()
            .collect();
    // No device visible to the ranks, whatever this machine has.
    let (ok, text) = common::run_octet("launcher", &args, &[("CUDA_VISIBLE_DEVICES", "")]);
    assert!(!ok, "the job reported success:\n{text}");
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

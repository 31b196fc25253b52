//! The GPU conformance cases (`octet selftest --device cuda`) under
//! `cargo test`: they run on GPU 0 when one opens, and the test says why
//! and passes when none does (CI's machines have no GPU).

use octet_nn::conformance::{selftest_groups, Scope};

#[test]
fn every_gpu_conformance_case_passes_where_a_gpu_is_present() {
    let gpu = match octet_cuda::Gpu::open(0) {
        Ok(gpu) => gpu,
        Err(e) => {
            eprintln!("GPU conformance cases not run: {e}");
            return;
        }
    };
    let (cases, skipped) = match selftest_groups(&gpu, Scope::All) {
        Ok(r) => r,
        Err(e) => panic!("the conformance run stopped: {e}"),
    };
    for group in &skipped {
        eprintln!("skipped on this GPU: {group}");
    }
    let failed: Vec<String> = cases
        .iter()
        .filter(|c| !c.pass)
        .map(|c| format!("{}: {}", c.name, c.worst))
        .collect();
    eprintln!(
        "{} GPU conformance cases, {} failed",
        cases.len(),
        failed.len()
    );
    assert!(!cases.is_empty(), "no conformance case ran");
    assert!(failed.is_empty(), "failed cases:\n{}", failed.join("\n"));
}

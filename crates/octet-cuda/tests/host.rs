//! What can be checked without a GPU: clear errors instead of crashes, and that
//! every kernel source compiles with NVRTC when the compiler is installed.

use octet_cuda::{nvrtc, Error, Gpu, KERNEL_SOURCES};

#[test]
fn opening_a_gpu_without_a_driver_is_an_error_value() {
    // SAFETY: probes library presence only.
    let driver = unsafe { cudarc::driver::sys::is_culib_present() };
    match Gpu::open(0) {
        Err(Error::NoDevice(msg)) => assert!(!driver || msg.contains("device"), "{msg}"),
        Err(e) => assert!(
            driver,
            "without a driver the error must be NoDevice, got {e}"
        ),
        Ok(g) => assert!(driver, "opened {:?} without a driver", g.cc),
    }
}

#[test]
fn every_kernel_compiles_for_hopper_when_nvrtc_is_installed() {
    if nvrtc::nvrtc_version().is_err() || nvrtc::find_include().is_err() {
        eprintln!("NVRTC or the CUDA headers are not installed here: kernel compilation not checked (CI installs them)");
        return;
    }
    for (name, src) in KERNEL_SOURCES {
        for arch in ["sm_90a", "sm_89"] {
            if let Err(e) = nvrtc::compile(&format!("check-{name}"), src, arch) {
                panic!("{name} for {arch}: {e}");
            }
        }
    }
    // A broken kernel must come back as a compile error carrying the log.
    match nvrtc::compile(
        "broken",
        "extern \"C\" __global__ void k() { this is not C++; }",
        "sm_90a",
    ) {
        Err(Error::Compile { log, .. }) => assert!(!log.is_empty()),
        other => panic!("a broken kernel compiled: {:?}", other.map(|_| ())),
    }
}

//! What can be checked without a GPU: clear errors instead of crashes, and
//! that every kernel source compiles with NVRTC when the compiler is installed
//! (CI installs it from NVIDIA's pip wheels: `.ci/nvrtc-setup`).

use octet_cuda::{kernel_names, kernel_source, nvrtc, Error, Gpu, KERNEL_SOURCES};

/// Whether NVRTC can be loaded here. Without it a test that compiles kernels
/// returns early, saying so, except under CI (`CI` set), where `.ci/run`
/// installs NVRTC and its absence is a failure: CI must compile every kernel.
fn nvrtc_present(test: &str) -> bool {
    match nvrtc::nvrtc_version() {
        Ok(_) => true,
        Err(e) if std::env::var_os("CI").is_some() => {
            panic!("{test}: NVRTC is required under CI and could not be loaded: {e}")
        }
        Err(e) => {
            eprintln!(
                "{test} SKIPPED: {e}. Run `eval \"$(.ci/nvrtc-setup /tmp/octet-nvrtc)\"` to check kernels here."
            );
            false
        }
    }
}

/// The kernel names of a PTX module: its `.entry` lines.
fn ptx_entries(ptx: &str) -> Vec<String> {
    ptx.lines()
        .filter_map(|l| l.split(".entry ").nth(1))
        .map(|rest| rest.trim_end_matches('(').trim().to_string())
        .collect()
}

#[test]
fn opening_a_gpu_without_a_driver_is_an_error_value() {
    // SAFETY: probes library presence only.
    let driver = unsafe { cudarc::driver::sys::is_culib_present() };
    let r = std::panic::catch_unwind(|| Gpu::open(0).map(|_| ()));
    let r = r.expect("Gpu::open must return an error value, never panic");
    match r {
        Err(Error::NoDevice(msg)) => {
            if !driver {
                assert!(msg.contains("libcuda"), "{msg}");
            }
        }
        Err(e) => assert!(
            driver,
            "without a driver the error must be NoDevice, got {e}"
        ),
        Ok(()) => assert!(driver, "opened a GPU without a driver"),
    }
    // An ordinal past the devices present is an error too.
    assert!(Gpu::open(1 << 20).is_err());
}

/// Compiles every kernel in `KERNEL_SOURCES` for Hopper (`sm_90a`) and Ada
/// (`sm_89`), bypassing the cache, and checks that a broken kernel comes back
/// as `Error::Compile` with NVRTC's log. Skipped, with a notice, where libnvrtc
/// cannot be loaded.
#[test]
fn kernels_compile() {
    if !nvrtc_present("kernels_compile") {
        return;
    }
    // FP8 instructions: sm_90a and sm_89 use them; sm_80 (Ampere) has none and
    // compiles the integer conversions, as sm_90a does under
    // `OCTET_FP8_CONVERT=soft` (the define in front of the source).
    let fp8_insns = [
        "cvt.rn.f16x2.e4m3x2",
        "cvt.rn.f16x2.e5m2x2",
        "cvt.rn.satfinite.e4m3x2.f32",
        "cvt.rn.satfinite.e5m2x2.f32",
    ];
    for (name, src) in KERNEL_SOURCES {
        for (arch, soft) in [
            ("sm_90a", false),
            ("sm_89", false),
            ("sm_80", true),
            ("sm_90a", true),
        ] {
            let src = if soft && arch == "sm_90a" {
                format!("{}{src}", nvrtc::SOFT_FP8_DEFINE)
            } else {
                src.to_string()
            };
            let ptx = nvrtc::compile_uncached(name, &src, arch)
                .unwrap_or_else(|e| panic!("{name} for {arch}: {e}"));
            // `OCTET_DUMP_PTX=DIR` keeps the PTX, e.g. for `ptxas -v` (registers, spills).
            if let Ok(dir) = std::env::var("OCTET_DUMP_PTX") {
                let tag = if soft { "-soft" } else { "" };
                std::fs::write(format!("{dir}/{name}-{arch}{tag}.ptx"), &ptx).expect("write PTX");
            }
            if soft {
                for m in fp8_insns {
                    assert!(!ptx.contains(m), "{name} for {arch} (soft FP8): {m}");
                }
            }
            assert!(
                ptx.contains(&format!(".target {arch}")),
                "{name}: {arch} target missing"
            );
            // The host-side scan of a source's `__global__`s (what the loaders'
            // host checks rely on) finds exactly the kernels of its PTX, on
            // sm_90a where every kernel is compiled.
            if arch == "sm_90a" && !soft {
                let mut scanned = kernel_names(&src);
                scanned.sort();
                let mut entries = ptx_entries(&ptx);
                entries.sort();
                assert_eq!(scanned, entries, "{name}: kernel_names against the PTX");
            }
            // The instructions each source exists for are there (not a software fallback).
            let markers: &[&str] = match name {
                "mixed" => &[
                    "mma.sync.aligned.m16n8k16",
                    "cvt.rn.f16x2.e4m3x2",
                    "cvt.rn.f16x2.e5m2x2",
                ],
                "decode" => &["attend_decode", "rmsnorm_bf16", "cvt.rn.bf16.f32"],
                "rowwise" => &["rowwise_cast_bf16_e4m3", "cvt.rn.satfinite.e5m2x2.f32"],
                "delayed" => &["delayed_update", "delayed_record"],
                "attention" => &[
                    "attn_fwd",
                    "attn_bwd_dkdv",
                    "attn_bwd_dq",
                    "attn_delta",
                    "attn_fwd_tc128",
                    "attn_dkdv_tc64",
                    "attn_dq_tc32",
                    "ex2.approx.ftz.f32",
                    "mma.sync.aligned.m16n8k16",
                    "ldmatrix.sync.aligned.m8n8.x4.trans",
                    "cvt.rn.bf16.f32",
                ],
                "embed" => &["embed_fwd", "embed_bwd"],
                "norm" => &[
                    "rmsnorm_fwd_v4",
                    "rmsnorm_bwd",
                    "rmsnorm_bwd_b16_v4",
                    "sum_partials",
                    "cvt.rn.bf16.f32",
                    "cvt.rn.satfinite.e4m3x2.f32",
                ],
                "rope" => &["rope_fwd_v4", "rope_bwd", "cvt.rn.bf16.f32"],
                "swiglu" => &[
                    "swiglu_fwd",
                    "swiglu_bwd_q_v8",
                    "cvt.rn.bf16.f32",
                    "cvt.rn.satfinite.e4m3x2.f32",
                ],
                "elementwise" => &["add_many", "to_bf16", "cvt.rn.bf16.f32"],
                "loss" => &["cross_entropy", "cvt.rn.bf16.f32"],
                "optim" => &["sumsq_partial", "adamw", "adamw_many", "cvt.rn.bf16.f32"],
                "nvfp4" => &["nv_encode", "nv_scales", "nv_dequant_full"],
                "mx" => &[
                    "mx_quant_bf16_e4m3",
                    "mx_dequant_e5m2",
                    "cvt.rn.satfinite.e4m3x2.f32",
                ],
                "block2d" => &[
                    "block128x128_bf16_e4m3",
                    "transpose_f32",
                    "dequant_e5m2",
                    "cvt.rn.satfinite.e4m3x2.f32",
                ],
                "lora" => &[
                    "lora_cast_du_e5m2_r16",
                    "transpose_b16",
                    "mma.sync.aligned.m16n8k16",
                    "cvt.rn.satfinite.e5m2x2.f32",
                ],
                "quantize" | "block_quantize" => {
                    &["cvt.rn.satfinite.e4m3x2.f32", "cvt.rn.satfinite.e5m2x2.f32"]
                }
                other => panic!("{other}: no markers listed for this source"),
            };
            for m in markers {
                if soft && fp8_insns.contains(m) {
                    continue;
                }
                assert!(ptx.contains(m), "{name} for {arch}: no {m}");
            }
            // Hopper's warpgroup-MMA attention exists for sm_90a only.
            let wg = ["attn_fwd_wg128", "wgmma.mma_async.sync.aligned.m64n128k16"];
            for m in wg {
                assert_eq!(
                    ptx.contains(m),
                    name == "attention" && arch == "sm_90a",
                    "{name} for {arch}: {m}"
                );
            }
        }
    }
    match nvrtc::compile_uncached(
        "broken",
        "extern \"C\" __global__ void k() { this is not C++; }",
        "sm_90a",
    ) {
        Err(Error::Compile { log, arch, .. }) => {
            assert_eq!(arch, "sm_90a");
            assert!(log.contains("error"), "log: {log}");
        }
        other => panic!("a broken kernel compiled: {:?}", other.map(|_| ())),
    }
}

/// The cached path end to end: a second compile of the same source is a hit.
#[test]
fn compile_goes_through_the_cache() {
    if !nvrtc_present("compile_goes_through_the_cache") {
        return;
    }
    let dir = std::env::temp_dir().join(format!("octet-cache-e2e-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let name = "quantize";
    let src = kernel_source(name).unwrap();
    let v = nvrtc::nvrtc_version().unwrap();
    let key = nvrtc::cache_key(name, src, "sm_90a", &nvrtc::OPTIONS, v);
    let (a, hit_a) = nvrtc::cached(&dir, name, "sm_90a", key, || {
        nvrtc::compile_cubin_uncached(name, src, "sm_90a")
    })
    .unwrap();
    let (b, hit_b) = nvrtc::cached(&dir, name, "sm_90a", key, || {
        panic!("second compile must hit the cache")
    })
    .unwrap();
    assert!(!hit_a && hit_b);
    assert_eq!(a, b);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Which GPUs octet takes, and where FP8 GEMMs exist.
#[test]
fn architectures_and_fp8_gemms() {
    use octet_cuda::{arch_for, fp8_tensor_cores};
    assert_eq!(arch_for((9, 0)).unwrap(), "sm_90a");
    assert_eq!(arch_for((8, 9)).unwrap(), "sm_89");
    // Ampere: bf16 tensor cores and cp.async, no FP8 instructions.
    for (cc, arch) in [((8, 0), "sm_80"), ((8, 6), "sm_86"), ((8, 7), "sm_87")] {
        assert_eq!(arch_for(cc).unwrap(), arch);
        assert!(!fp8_tensor_cores(cc));
    }
    assert!(fp8_tensor_cores((8, 9)) && fp8_tensor_cores((9, 0)) && fp8_tensor_cores((12, 0)));
    // Turing and older: a clear error, not a kernel that fails to load.
    match arch_for((7, 5)) {
        Err(Error::NoDevice(m)) => assert!(m.contains("7.5") && m.contains("8.0"), "{m}"),
        other => panic!("7.5 accepted: {other:?}"),
    }
}

/// `OCTET_FP8_CONVERT` and `OCTET_FP8_GEMM` take `auto` (or nothing) or one
/// other word; anything else is an error naming the variable. (Checked on the
/// parser: setting the variables here would race with the tests that open a GPU.)
#[test]
fn fp8_switches_reject_unknown_values() {
    use octet_cuda::parse_switch;
    for (var, word) in [("OCTET_FP8_CONVERT", "soft"), ("OCTET_FP8_GEMM", "off")] {
        assert!(!parse_switch(var, None, word).unwrap());
        assert!(!parse_switch(var, Some("auto"), word).unwrap());
        assert!(parse_switch(var, Some(word), word).unwrap());
        let e = parse_switch(var, Some("software"), word)
            .unwrap_err()
            .to_string();
        assert!(e.contains(var) && e.contains("software"), "{e}");
    }
}

/// The weight-only module compiled in its parts (`MIXED_PART`, as the GPU is
/// opened) holds every kernel of the whole file once: the `.entry` names of
/// the parts are disjoint and together are the whole module's. A kernel
/// left out of every part would fail the GPU's start-up. Skipped where
/// libnvrtc cannot be loaded.
#[test]
fn the_mixed_parts_hold_every_kernel_once() {
    if !nvrtc_present("the_mixed_parts_hold_every_kernel_once") {
        return;
    }
    let entries = ptx_entries;
    let src = kernel_source("mixed").unwrap();
    let mut whole = entries(&nvrtc::compile_uncached("mixed", src, "sm_90a").expect("whole"));
    whole.sort();
    assert!(whole.len() > 50, "{} entries", whole.len()); // 83 in all
    let mut parts = Vec::new();
    for part in 0..octet_cuda::mixed::MIXED_PARTS {
        let s = format!("#define MIXED_PART {part}\n{src}");
        let e = entries(&nvrtc::compile_uncached("mixed", &s, "sm_90a").expect("part"));
        assert!(!e.is_empty(), "part {part} is empty");
        parts.extend(e);
    }
    parts.sort();
    assert_eq!(parts, whole);
}

/// No wgmma kernel is serialized by the assembler: ptxas notes C7514
/// ("wgmma.mma_async instructions are serialized") where a kernel touches a
/// pending group's accumulators, and then runs every wgmma one at a time, a
/// silent slowdown (a version of the block kernel that rescaled half its
/// accumulators while the other half's group ran did). The wgmma modules, compiled for `sm_90a` as the GPU
/// compiles them (the weight-only one in its parts), must log no such note.
/// Skipped where libnvrtc cannot be loaded.
#[test]
fn no_wgmma_kernel_is_serialized() {
    if !nvrtc_present("no_wgmma_kernel_is_serialized") {
        return;
    }
    let mut jobs = Vec::new();
    for (name, src) in KERNEL_SOURCES {
        if !src.contains("wgmma.mma_async") {
            continue;
        }
        if name == "mixed" {
            for part in 0..octet_cuda::mixed::MIXED_PARTS {
                jobs.push((
                    format!("mixed.{part}"),
                    format!("#define MIXED_PART {part}\n{src}"),
                ));
            }
        } else {
            jobs.push((name.to_string(), src.to_string()));
        }
    }
    assert!(jobs.len() >= 2, "{} wgmma modules", jobs.len()); // mixed and attention
    for (name, src) in &jobs {
        let log = nvrtc::compile_log(name, src, "sm_90a").expect("compiles");
        assert!(!log.contains("C7514"), "{name}: {log}");
    }
}

/// `nvrtc::compile_all` returns one result a job, in the jobs' order, on a
/// pool of threads: a source that does not compile is its own error and the
/// others still compile. Skipped where libnvrtc cannot be loaded.
#[test]
fn compile_all_keeps_each_jobs_result_in_order() {
    if !nvrtc_present("compile_all_keeps_each_jobs_result_in_order") {
        return;
    }
    let good = "extern \"C\" __global__ void k(float* p) { p[threadIdx.x] = 1.f; }";
    let jobs: Vec<(String, String)> = [
        ("octet-test-good-a", good.to_string()),
        ("octet-test-bad", "this is not CUDA".to_string()),
        ("octet-test-good-b", good.replace("1.f", "2.f")),
    ]
    .into_iter()
    .map(|(n, s)| (n.to_string(), s))
    .collect();
    let r = nvrtc::compile_all(&jobs, "sm_90a");
    assert_eq!(r.len(), 3);
    assert!(
        r[0].is_ok() && r[2].is_ok(),
        "{:?} {:?}",
        r[0].is_ok(),
        r[2].is_ok()
    );
    assert!(
        matches!(r[1], Err(Error::Compile { .. })),
        "the bad source must fail"
    );
}

/// What `Gpu::open` loads is machine code: `compile_cubin_uncached` returns an
/// ELF image for a real target, and a source that does not compile is
/// `Error::Compile` with NVRTC's log. `cached` stores the image and reads it
/// back. Skipped where libnvrtc cannot be loaded.
#[test]
fn kernels_compile_to_cubin_and_cache_it() {
    if !nvrtc_present("kernels_compile_to_cubin_and_cache_it") {
        return;
    }
    let name = "delayed"; // small and quick
    let src = kernel_source(name).unwrap();
    for arch in ["sm_90a", "sm_89", "sm_80"] {
        let cubin = nvrtc::compile_cubin_uncached(name, src, arch)
            .unwrap_or_else(|e| panic!("{name} for {arch}: {e}"));
        assert!(
            cubin.starts_with(b"\x7fELF") && cubin.len() > 1000,
            "{arch}"
        );
    }
    match nvrtc::compile_cubin_uncached("broken", "this is not CUDA", "sm_90a") {
        Err(Error::Compile { log, .. }) => assert!(!log.is_empty()),
        other => panic!("expected a compile error, got {:?}", other.map(|b| b.len())),
    }
    let dir = std::env::temp_dir().join(format!("octet-cubin-cache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (a, hit_a) = nvrtc::cached(&dir, name, "sm_90a", 7, || {
        nvrtc::compile_cubin_uncached(name, src, "sm_90a")
    })
    .expect("first compile");
    let (b, hit_b) = nvrtc::cached(&dir, name, "sm_90a", 7, || {
        panic!("a cached image must not be compiled again")
    })
    .expect("cached");
    assert!(!hit_a && hit_b && a == b);
    let _ = std::fs::remove_dir_all(&dir);
}

//! Run-time compilation of CUDA C with NVRTC, cached on disk.
//!
//! The cache key hashes the kernel name, source, target architecture, options
//! and NVRTC version ([`cache_key`]). [`compile`] keeps machine code (CUBIN
//! for the GPU's exact target, [`compile_cubin_uncached`]), so a module loads
//! with no JIT by the driver. A compiled image is written to a uniquely
//! named temporary file in the cache directory, synced, and renamed into place
//! ([`write_atomic`]), so concurrent processes (one per GPU rank) and threads
//! never read a half-written entry: a reader sees either no file or a whole one.
//!
//! `Gpu::open` compiles every module at once on a pool of threads
//! ([`compile_all`]): the ones it loads, and the ones loaded on first use, into
//! the cache, so that a first run waits once, for the slowest module, and not
//! again at each first use.
//!
//! Every function that may call into libnvrtc checks first that the library
//! can be loaded, and the calls run under `catch_unwind`: cudarc's dynamic
//! loader panics on a missing symbol, and that must reach the caller as an
//! [`Error::Toolkit`] value, not a crash.

use crate::{Error, Result};
use cudarc::nvrtc::Ptx;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Options every kernel is compiled with (part of the cache key).
pub const OPTIONS: [&str; 2] = ["--std=c++17", "-default-device"];

/// What [`compile`] puts in front of a source under `OCTET_FP8_CONVERT=soft`.
pub const SOFT_FP8_DEFINE: &str = "#define OCTET_SOFT_FP8 1\n";

/// Whether the FP8 conversions are compiled as integer code on every
/// architecture. GPUs without FP8 instructions (compute capability 8.0, 8.6,
/// 8.7) always take that path (`kernels/common.cuh`, by `__CUDA_ARCH__`);
/// `OCTET_FP8_CONVERT=soft` selects it on sm_89 and later too, which is how
/// an FP8-capable GPU checks and times what an Ampere GPU runs.
/// `OCTET_FP8_CONVERT=auto` (or unset) keeps the hardware conversions where
/// they exist; any other value is an error.
///
/// Read once a process (so every module, compiled when first used, agrees
/// with the others and with [`crate::Gpu::device_info`]).
pub fn soft_fp8() -> Result<bool> {
    static SOFT: std::sync::OnceLock<std::result::Result<bool, String>> =
        std::sync::OnceLock::new();
    SOFT.get_or_init(|| crate::env_switch("OCTET_FP8_CONVERT", "soft").map_err(|e| e.to_string()))
        .clone()
        .map_err(Error::Toolkit)
}

/// 64-bit FNV-1a: a stable hash (std's hasher may change between Rust releases).
pub fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for p in parts {
        for &b in *p {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        h ^= 0xff; // separator, so ("ab", "c") and ("a", "bc") differ
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The cache key of one compilation: hash of (name, source, arch, options, NVRTC version).
pub fn cache_key(name: &str, src: &str, arch: &str, opts: &[&str], version: (i32, i32)) -> u64 {
    fnv1a(&[
        name.as_bytes(),
        src.as_bytes(),
        arch.as_bytes(),
        opts.join(" ").as_bytes(),
        format!("{}.{}", version.0, version.1).as_bytes(),
    ])
}

/// The cache file of one compilation inside `dir`: `<name>-<arch>-<key>.cubin`
/// (machine code, [`compile_cubin_uncached`]).
pub fn cache_path(dir: &Path, name: &str, arch: &str, key: u64) -> PathBuf {
    dir.join(format!("{name}-{arch}-{key:016x}.cubin"))
}

/// Directories that may hold the CUDA headers, in order, from an environment
/// lookup: `OCTET_CUDA_INCLUDE`, `$CUDA_HOME/include`, `$CUDA_PATH/include`,
/// `/usr/local/cuda/include`. Empty variables are skipped.
pub fn include_candidates_from(env: impl Fn(&str) -> Option<String>) -> Vec<PathBuf> {
    let mut v = Vec::new();
    let get = |k: &str| env(k).filter(|s| !s.is_empty());
    if let Some(p) = get("OCTET_CUDA_INCLUDE") {
        v.push(PathBuf::from(p));
    }
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(p) = get(var) {
            v.push(Path::new(&p).join("include"));
        }
    }
    v.push(PathBuf::from("/usr/local/cuda/include"));
    v
}

/// [`include_candidates_from`] over the process environment.
pub fn include_candidates() -> Vec<PathBuf> {
    include_candidates_from(|k| std::env::var(k).ok())
}

/// The first of `candidates` that holds `cuda_fp8.h` (the marker of a CUDA include directory).
pub fn first_include(candidates: &[PathBuf]) -> Option<PathBuf> {
    candidates
        .iter()
        .find(|d| d.join("cuda_fp8.h").is_file())
        .cloned()
}

/// The CUDA include directory, or an error listing where it was looked for.
///
/// octet's own kernels need no header (see `kernels/common.cuh`), so
/// [`compile`] goes on without one; this is for kernels that include
/// `<cuda_fp8.h>` or `<cuda_bf16.h>`.
pub fn find_include() -> Result<PathBuf> {
    let c = include_candidates();
    first_include(&c).ok_or_else(|| {
        Error::Toolkit(format!(
            "cuda_fp8.h not found in {}; set OCTET_CUDA_INCLUDE or CUDA_HOME to the CUDA include directory",
            c.iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ))
    })
}

/// The kernel cache directory from an environment lookup: `OCTET_CACHE`, else
/// `$XDG_CACHE_HOME/octet/kernels`, else `$HOME/.cache/octet/kernels`, else
/// the system temporary directory's `octet/kernels`.
pub fn cache_dir_from(env: impl Fn(&str) -> Option<String>) -> PathBuf {
    let get = |k: &str| env(k).filter(|s| !s.is_empty());
    if let Some(p) = get("OCTET_CACHE") {
        return PathBuf::from(p);
    }
    let base = get("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| get("HOME").map(|h| Path::new(&h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    base.join("octet").join("kernels")
}

/// [`cache_dir_from`] over the process environment.
pub fn cache_dir() -> PathBuf {
    cache_dir_from(|k| std::env::var(k).ok())
}

static TMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// Write `bytes` to `path` atomically: a temporary file unique to this
/// process and call, in the same directory, written, synced, then renamed
/// over `path`. On error the temporary file is removed.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(
        ".{}.{}.{}.tmp",
        path.file_name().and_then(|n| n.to_str()).unwrap_or("k"),
        std::process::id(),
        TMP_COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let res = (|| {
        use std::io::Write;
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if res.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    res
}

/// Compile through the cache in `dir`: return the cached image for `key`, or
/// run `compiler` and store what it returns. A failed cache write costs a
/// recompile next time, nothing more. Returns the bytes and whether they were
/// a hit.
pub fn cached(
    dir: &Path,
    name: &str,
    arch: &str,
    key: u64,
    compiler: impl FnOnce() -> Result<Vec<u8>>,
) -> Result<(Vec<u8>, bool)> {
    let path = cache_path(dir, name, arch, key);
    if let Ok(bytes) = std::fs::read(&path) {
        if !bytes.is_empty() {
            return Ok((bytes, true));
        }
    }
    let bytes = compiler()?;
    let _ = write_atomic(&path, &bytes);
    Ok((bytes, false))
}

/// Turn a panic payload into text.
pub(crate) fn panic_text(p: Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "unknown panic".into())
}

/// The NVRTC version as `(major, minor)`, or [`Error::Toolkit`] when libnvrtc cannot be loaded.
pub fn nvrtc_version() -> Result<(i32, i32)> {
    std::panic::catch_unwind(|| {
        // SAFETY: only probes whether the shared library can be loaded.
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            return Err(Error::Toolkit(
                "libnvrtc could not be loaded (install NVRTC 13: the CUDA toolkit, or the pip wheel nvidia-cuda-nvrtc, on LD_LIBRARY_PATH)".into(),
            ));
        }
        let (mut a, mut b) = (0, 0);
        // SAFETY: plain out-parameters.
        let r = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut a, &mut b) };
        if r != cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS {
            return Err(Error::Toolkit(format!("nvrtcVersion failed: {r:?}")));
        }
        Ok((a, b))
    })
    .unwrap_or_else(|p| Err(Error::Toolkit(format!("libnvrtc: {}", panic_text(p)))))
}

/// Compile `src` for `arch` (e.g. `sm_90a`, passed as `--gpu-architecture`)
/// through the on-disk cache ([`cache_dir`]). A compile failure returns
/// [`Error::Compile`] with NVRTC's log.
///
/// Under `OCTET_FP8_CONVERT=soft` the source gets `#define OCTET_SOFT_FP8` in
/// front (a different cache entry): see [`soft_fp8`].
pub fn compile(name: &str, src: &str, arch: &'static str) -> Result<Ptx> {
    let version = nvrtc_version()?;
    let src: std::borrow::Cow<str> = if soft_fp8()? {
        format!("{SOFT_FP8_DEFINE}{src}").into()
    } else {
        src.into()
    };
    let key = cache_key(name, &src, arch, &OPTIONS, version);
    let dir = cache_dir();
    let t0 = std::time::Instant::now();
    let (cubin, hit) = cached(&dir, name, arch, key, || {
        tracing::info!(
            "compiling CUDA kernels '{name}' for {arch} (once: then read from {})",
            dir.display()
        );
        compile_cubin_uncached(name, &src, arch)
    })?;
    tracing::debug!(
        module = name,
        arch,
        from_cache = hit,
        ms = t0.elapsed().as_secs_f64() * 1e3,
        cache = %dir.display(),
        "kernel module"
    );
    Ok(Ptx::from_binary(cubin))
}

/// [`compile`] every `(name, source)` of `jobs` for `arch`, on at most as
/// many threads as the machine runs at once, taking the jobs in order (put
/// the slowest first). Results are in the order of `jobs`.
pub fn compile_all(jobs: &[(String, String)], arch: &'static str) -> Vec<Result<Ptx>> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(jobs.len());
    let next = AtomicUsize::new(0);
    let done: Vec<Mutex<Option<Result<Ptx>>>> = jobs.iter().map(|_| Mutex::new(None)).collect();
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some((name, src)) = jobs.get(i) else {
                    break;
                };
                let r = std::panic::catch_unwind(|| compile(name, src, arch))
                    .unwrap_or_else(|p| Err(Error::Toolkit(format!("NVRTC: {}", panic_text(p)))));
                if let Ok(mut slot) = done[i].lock() {
                    *slot = Some(r);
                }
            });
        }
    });
    done.into_iter()
        .zip(jobs)
        .map(|(slot, (name, _))| {
            slot.into_inner().ok().flatten().unwrap_or_else(|| {
                Err(Error::Toolkit(format!(
                    "NVRTC: the compile of {name} did not finish"
                )))
            })
        })
        .collect()
}

/// Compile with NVRTC for the real architecture `arch`, skipping the cache;
/// returns the CUBIN (ELF machine code), which the driver loads as it is.
/// NVRTC runs the assembler for a real target anyway; loading its PTX instead
/// made the driver assemble every module again, one after another, at load
/// (18.7 s on a fresh H100 host for the modules a GPU opens with), or read
/// it from its own JIT cache.
pub fn compile_cubin_uncached(name: &str, src: &str, arch: &'static str) -> Result<Vec<u8>> {
    let cubin = nvrtc_build(name, src, arch, Output::Cubin)?;
    if !cubin.starts_with(b"\x7fELF") {
        return Err(Error::Toolkit(format!(
            "NVRTC returned no CUBIN for {name} ({arch})"
        )));
    }
    Ok(cubin)
}

/// What [`nvrtc_build`] takes from a compiled program.
#[derive(Clone, Copy, Debug)]
enum Output {
    Ptx,
    Cubin,
    /// The log of a successful compile, the assembler's notes included.
    Log,
}

/// NVRTC's log of compiling `src` for `arch` with the project's options:
/// empty, or the assembler's notes (for example C7514, "wgmma.mma_async
/// instructions are serialized", which the tests refuse for every wgmma
/// kernel). A compile failure is [`Error::Compile`], as in [`compile`].
pub fn compile_log(name: &str, src: &str, arch: &'static str) -> Result<String> {
    let log = nvrtc_build(name, src, arch, Output::Log)?;
    Ok(String::from_utf8_lossy(&log)
        .trim_end_matches('\0')
        .to_string())
}

/// One NVRTC program for `arch` with the project's options and the CUDA
/// include directory: its PTX (NUL-terminated) or CUBIN. A compile failure is
/// [`Error::Compile`] with NVRTC's log; a panic in the dynamic loader is
/// [`Error::Toolkit`].
fn nvrtc_build(name: &str, src: &str, arch: &'static str, what: Output) -> Result<Vec<u8>> {
    use cudarc::nvrtc::{result, sys};
    use std::ffi::{CStr, CString};
    nvrtc_version()?;
    let include = first_include(&include_candidates());
    let mut options = vec![format!("--gpu-architecture={arch}")];
    options.extend(
        include
            .iter()
            .map(|p| format!("--include-path={}", p.display())),
    );
    options.extend(OPTIONS.iter().map(|o| o.to_string()));
    let toolkit =
        |what: &str, e: &dyn std::fmt::Debug| Error::Toolkit(format!("NVRTC {what}: {e:?}"));
    let csrc = CString::new(src).map_err(|e| toolkit("source", &e))?;
    let cname = CString::new(format!("{name}.cu")).map_err(|e| toolkit("name", &e))?;
    std::panic::catch_unwind(|| -> Result<Vec<u8>> {
        let prog =
            result::create_program(&csrc, Some(&cname)).map_err(|e| toolkit("create", &e))?;
        let log = || {
            // SAFETY: the log of the live program.
            unsafe { result::get_program_log(prog) }
                .map(|raw| {
                    // SAFETY: NVRTC's log is NUL-terminated.
                    unsafe { CStr::from_ptr(raw.as_ptr()) }
                        .to_string_lossy()
                        .into_owned()
                })
                .unwrap_or_default()
        };
        // SAFETY: `prog` is a live program; the options outlive the call.
        let out = match unsafe { result::compile_program(prog, &options) } {
            Err(_) => Err(compile_error(name, arch, log(), include.is_none())),
            // SAFETY: the PTX of the compiled program.
            Ok(()) => match what {
                Output::Ptx => unsafe { result::get_ptx(prog) }
                    .map(|p| p.into_iter().map(|c| c as u8).collect())
                    .map_err(|e| toolkit("PTX", &e)),
                Output::Cubin => {
                    let mut n = 0usize;
                    // SAFETY: plain out-parameter of a compiled program.
                    let r = unsafe { sys::nvrtcGetCUBINSize(prog, &mut n) };
                    let mut cubin = vec![0u8; n];
                    // SAFETY: `cubin` holds the `n` bytes NVRTC said it needs.
                    let r2 = unsafe { sys::nvrtcGetCUBIN(prog, cubin.as_mut_ptr().cast()) };
                    match (r, r2) {
                        (sys::nvrtcResult::NVRTC_SUCCESS, sys::nvrtcResult::NVRTC_SUCCESS) => {
                            Ok(cubin)
                        }
                        other => Err(toolkit("CUBIN", &other)),
                    }
                }
                Output::Log => Ok(log().into_bytes()),
            },
        };
        // SAFETY: the program is not used after this.
        let _ = unsafe { result::destroy_program(prog) };
        out
    })
    .map_err(|p| Error::Toolkit(format!("NVRTC: {}", panic_text(p))))?
}

/// A compile failure with NVRTC's `log`, saying where the CUDA headers were
/// looked for when none was found and the log says a header is missing.
fn compile_error(name: &str, arch: &'static str, mut log: String, no_include: bool) -> Error {
    if no_include && log.contains("cannot open source file") {
        log.push_str(&format!(
            "\n(no CUDA include directory found in {:?}; set OCTET_CUDA_INCLUDE)",
            include_candidates()
        ));
    }
    Error::Compile {
        name: name.into(),
        arch,
        log,
    }
}

/// Compile with NVRTC, skipping the cache; returns the PTX text.
pub fn compile_uncached(name: &str, src: &str, arch: &'static str) -> Result<String> {
    let bytes = nvrtc_build(name, src, arch, Output::Ptx)?;
    let bytes = bytes.split(|&b| b == 0).next().unwrap_or(&bytes);
    String::from_utf8(bytes.to_vec()).map_err(|e| Error::Toolkit(format!("PTX is not UTF-8: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn tmpdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "octet-nvrtc-{tag}-{}-{}",
            std::process::id(),
            TMP_COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn hash_is_stable_and_separates_parts() {
        assert_eq!(fnv1a(&[b"abc"]), fnv1a(&[b"abc"]));
        assert_ne!(fnv1a(&[b"ab", b"c"]), fnv1a(&[b"a", b"bc"]));
        // Pinned: the key must not change between Rust releases or runs.
        assert_eq!(fnv1a(&[]), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(&[b""]), fnv1a(&[b""]));
    }

    #[test]
    fn cache_key_depends_on_every_part() {
        let base = cache_key("k", "src", "sm_90a", &OPTIONS, (13, 0));
        assert_eq!(base, cache_key("k", "src", "sm_90a", &OPTIONS, (13, 0)));
        assert_ne!(base, cache_key("j", "src", "sm_90a", &OPTIONS, (13, 0)));
        assert_ne!(base, cache_key("k", "src ", "sm_90a", &OPTIONS, (13, 0)));
        assert_ne!(base, cache_key("k", "src", "sm_89", &OPTIONS, (13, 0)));
        assert_ne!(base, cache_key("k", "src", "sm_90a", &["-O3"], (13, 0)));
        assert_ne!(base, cache_key("k", "src", "sm_90a", &OPTIONS, (13, 1)));
        let p = cache_path(Path::new("/c"), "k", "sm_90a", base);
        assert!(p.to_str().unwrap().starts_with("/c/k-sm_90a-"));
        assert!(p.to_str().unwrap().ends_with(".cubin"));
    }

    #[test]
    fn atomic_write_replaces_whole_files() {
        let d = tmpdir("atomic");
        let p = d.join("sub").join("k.ptx");
        write_atomic(&p, b"first").unwrap();
        write_atomic(&p, b"second").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"second");
        assert_eq!(std::fs::read_dir(p.parent().unwrap()).unwrap().count(), 1);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn concurrent_writers_leave_one_whole_file_and_no_temporaries() {
        let d = tmpdir("race");
        let p = d.join("k.ptx");
        let bodies: Vec<Vec<u8>> = (0..8u8).map(|i| vec![b'a' + i; 1 << 16]).collect();
        std::thread::scope(|s| {
            for b in &bodies {
                let p = &p;
                s.spawn(move || {
                    for _ in 0..20 {
                        write_atomic(p, b).unwrap();
                        // A reader never sees a torn file.
                        let got = std::fs::read(p).unwrap();
                        assert_eq!(got.len(), 1 << 16);
                        assert!(got.iter().all(|&c| c == got[0]));
                    }
                });
            }
        });
        assert_eq!(std::fs::read_dir(&d).unwrap().count(), 1);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn cache_hits_skip_the_compiler_and_misses_store() {
        let d = tmpdir("cache");
        let mut calls = 0;
        let (t, hit) = cached(&d, "k", "sm_90a", 42, || {
            calls += 1;
            Ok(b"image".to_vec())
        })
        .unwrap();
        assert_eq!((t.as_slice(), hit), (&b"image"[..], false));
        let (t, hit) = cached(&d, "k", "sm_90a", 42, || {
            calls += 1;
            Ok(b"other".to_vec())
        })
        .unwrap();
        assert_eq!((t.as_slice(), hit, calls), (&b"image"[..], true, 1));
        // Another key misses; a compile error is passed through and stores nothing.
        let e = cached(&d, "k", "sm_90a", 43, || {
            Err(Error::Compile {
                name: "k".into(),
                arch: "sm_90a",
                log: "bad".into(),
            })
        });
        assert!(matches!(e, Err(Error::Compile { .. })));
        assert!(!cache_path(&d, "k", "sm_90a", 43).exists());
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn include_discovery_follows_the_documented_order() {
        let env: HashMap<&str, &str> = [
            ("OCTET_CUDA_INCLUDE", "/o"),
            ("CUDA_HOME", "/h"),
            ("CUDA_PATH", "/p"),
        ]
        .into();
        let c = include_candidates_from(|k| env.get(k).map(|s| s.to_string()));
        let want: Vec<PathBuf> = ["/o", "/h/include", "/p/include", "/usr/local/cuda/include"]
            .iter()
            .map(PathBuf::from)
            .collect();
        assert_eq!(c, want);
        let c = include_candidates_from(|k| (k == "CUDA_PATH").then(|| "/p".to_string()));
        assert_eq!(c[0], PathBuf::from("/p/include"));
        // Empty variables are ignored.
        let c = include_candidates_from(|_| Some(String::new()));
        assert_eq!(c, vec![PathBuf::from("/usr/local/cuda/include")]);
        // The first directory holding cuda_fp8.h wins.
        let d = tmpdir("inc");
        let (a, b) = (d.join("a"), d.join("b"));
        std::fs::create_dir_all(&a).unwrap();
        std::fs::create_dir_all(&b).unwrap();
        std::fs::write(b.join("cuda_fp8.h"), "").unwrap();
        assert_eq!(first_include(&[a.clone(), b.clone()]), Some(b.clone()));
        std::fs::write(a.join("cuda_fp8.h"), "").unwrap();
        assert_eq!(first_include(&[a.clone(), b]), Some(a));
        assert_eq!(first_include(&[d.join("none")]), None);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn cache_dir_follows_the_documented_order() {
        let env: HashMap<&str, &str> = [
            ("OCTET_CACHE", "/oc"),
            ("XDG_CACHE_HOME", "/x"),
            ("HOME", "/home/u"),
        ]
        .into();
        let look = |skip: &'static [&'static str]| {
            let env = env.clone();
            move |k: &str| {
                (!skip.contains(&k))
                    .then(|| env.get(k).map(|s| s.to_string()))
                    .flatten()
            }
        };
        assert_eq!(cache_dir_from(look(&[])), PathBuf::from("/oc"));
        assert_eq!(
            cache_dir_from(look(&["OCTET_CACHE"])),
            PathBuf::from("/x/octet/kernels")
        );
        assert_eq!(
            cache_dir_from(look(&["OCTET_CACHE", "XDG_CACHE_HOME"])),
            PathBuf::from("/home/u/.cache/octet/kernels")
        );
    }
}

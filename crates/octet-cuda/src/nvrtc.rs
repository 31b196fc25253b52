//! Run-time compilation of CUDA C with NVRTC, cached on disk.
//!
//! The cache key hashes the kernel source, the target architecture, the
//! options and the NVRTC version; a compiled PTX is written to a temporary
//! file and renamed into place, so concurrent processes (one per GPU rank)
//! never read a half-written entry.

use crate::{Error, Result};
use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions, Ptx};
use std::path::{Path, PathBuf};

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

/// Directories that may hold `cuda_fp8.h`, in order: `OCTET_CUDA_INCLUDE`,
/// `$CUDA_HOME/include`, `$CUDA_PATH/include`, `/usr/local/cuda/include`.
pub fn include_candidates() -> Vec<PathBuf> {
    let mut v = Vec::new();
    if let Ok(p) = std::env::var("OCTET_CUDA_INCLUDE") {
        v.push(PathBuf::from(p));
    }
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Ok(p) = std::env::var(var) {
            v.push(Path::new(&p).join("include"));
        }
    }
    v.push(PathBuf::from("/usr/local/cuda/include"));
    v
}

/// The first candidate directory that has `cuda_fp8.h`.
pub fn find_include() -> Result<PathBuf> {
    let c = include_candidates();
    c.iter().find(|d| d.join("cuda_fp8.h").is_file()).cloned().ok_or_else(|| {
        Error::Toolkit(format!(
            "cuda_fp8.h not found in {}; set OCTET_CUDA_INCLUDE or CUDA_HOME to the CUDA include directory",
            c.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
        ))
    })
}

/// The kernel cache directory: `OCTET_CACHE`, else `$XDG_CACHE_HOME/octet/kernels`, else `~/.cache/octet/kernels`.
pub fn cache_dir() -> PathBuf {
    if let Ok(p) = std::env::var("OCTET_CACHE") {
        return PathBuf::from(p);
    }
    let base = std::env::var("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|_| std::env::var("HOME").map(|h| Path::new(&h).join(".cache")))
        .unwrap_or_else(|_| std::env::temp_dir());
    base.join("octet").join("kernels")
}

/// Write `bytes` to `path` through a temporary file and a rename.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(
        ".{}.{}.tmp",
        path.file_name().and_then(|n| n.to_str()).unwrap_or("k"),
        std::process::id()
    ));
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)
}

/// The NVRTC version as `(major, minor)`.
pub fn nvrtc_version() -> Result<(i32, i32)> {
    // SAFETY: checked presence of the library before calling into it.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(Error::Toolkit(
            "libnvrtc could not be loaded (install the CUDA runtime compiler, NVRTC 13)".into(),
        ));
    }
    let (mut a, mut b) = (0, 0);
    // SAFETY: plain out-parameters.
    unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut a, &mut b) };
    Ok((a, b))
}

/// Compile `src` for `arch` (e.g. `sm_90a`), through the cache.
pub fn compile(name: &str, src: &str, arch: &'static str) -> Result<Ptx> {
    let (maj, min) = nvrtc_version()?;
    let include = find_include()?;
    let opts = vec!["--std=c++17".to_string(), "-default-device".to_string()];
    let key = fnv1a(&[
        src.as_bytes(),
        arch.as_bytes(),
        opts.join(" ").as_bytes(),
        format!("{maj}.{min}").as_bytes(),
    ]);
    let path = cache_dir().join(format!("{name}-{arch}-{key:016x}.ptx"));
    if let Ok(text) = std::fs::read_to_string(&path) {
        return Ok(Ptx::from_src(text));
    }
    let co = CompileOptions {
        arch: Some(arch),
        include_paths: vec![include.display().to_string()],
        options: opts,
        name: Some(format!("{name}.cu")),
        ..Default::default()
    };
    let ptx = compile_ptx_with_opts(src, co).map_err(|e| Error::Compile {
        name: name.into(),
        log: format!("{e:?}"),
    })?;
    if let Some(bytes) = ptx.as_bytes() {
        // A failed cache write costs a recompile next time, nothing more.
        let text = bytes.split(|&b| b == 0).next().unwrap_or(bytes);
        let _ = write_atomic(&path, text);
    }
    Ok(ptx)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_is_stable_and_separates_parts() {
        assert_eq!(fnv1a(&[b"abc"]), fnv1a(&[b"abc"]));
        assert_ne!(fnv1a(&[b"ab", b"c"]), fnv1a(&[b"a", b"bc"]));
        assert_ne!(fnv1a(&[b"k", b"sm_90a"]), fnv1a(&[b"k", b"sm_89"]));
    }

    #[test]
    fn atomic_write_replaces_whole_files() {
        let d = std::env::temp_dir().join(format!("octet-cache-test-{}", std::process::id()));
        let p = d.join("k.ptx");
        write_atomic(&p, b"first").unwrap();
        write_atomic(&p, b"second").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"second");
        let leftovers = std::fs::read_dir(&d).unwrap().count();
        assert_eq!(leftovers, 1, "no temporary files remain");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn include_candidates_follow_the_environment_order() {
        let c = include_candidates();
        assert_eq!(c.last().unwrap(), Path::new("/usr/local/cuda/include"));
    }
}

//! Atomic writes: files through a temporary and a rename, checkpoint folders
//! built aside and swapped in, `latest`, and the cleanup of what a killed save left.

use super::*;

/// Write `bytes` to `path` atomically: a temp file beside it, fsync, rename, fsync the directory.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    atomic(path, |tmp| {
        let mut f = std::fs::File::create(tmp)?;
        f.write_all(bytes)
    })
}

/// Write `path` atomically by `write`, which fills the temp file it is given
/// (beside `path`); then fsync, rename, fsync the directory. On an error the
/// temp file is removed and `path` is left as it was.
pub(super) fn atomic(path: &Path, write: impl FnOnce(&Path) -> std::io::Result<()>) -> Result<()> {
    let io = |e: std::io::Error| Error::Checkpoint(format!("writing {}: {e}", path.display()));
    tracing::trace!(path = %path.display(), "atomic write");
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(io)?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.tmp.{}", std::process::id()));
    let done = write(&tmp)
        .and_then(|()| std::fs::File::open(&tmp)?.sync_all())
        .and_then(|()| std::fs::rename(&tmp, path));
    if let Err(e) = done {
        let _ = std::fs::remove_file(&tmp);
        return Err(io(e));
    }
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all(); // not every filesystem allows fsync on a directory
    }
    Ok(())
}

/// The checkpoint that `parent/latest` names (what the trainer writes beside
/// its `step_N` directories): `None` where there is no `latest`; an error,
/// naming the file and what it holds, where it cannot be read or names no
/// directory with weights (`model.safetensors` or a shards' index).
pub fn latest_checkpoint(parent: &Path) -> Result<Option<PathBuf>> {
    named_by_latest(
        parent,
        has_weights,
        "a checkpoint with a model.safetensors (or its shards' index)",
    )
}

/// The directory `parent/latest` names, if `accept` takes it: `None` where
/// there is no `latest`; an error naming the file, what it holds and `what`
/// was wanted, where it cannot be read or names nothing `accept` takes.
pub(super) fn named_by_latest(
    parent: &Path,
    accept: impl Fn(&Path) -> bool,
    what: &str,
) -> Result<Option<PathBuf>> {
    let latest = parent.join("latest");
    let text = match std::fs::read(&latest) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::file("reading", &latest)(e)),
        Ok(t) => t,
    };
    let name = String::from_utf8_lossy(&text).trim().to_string();
    let dir = parent.join(&name);
    if name.is_empty() || !accept(&dir) {
        return Err(Error::Checkpoint(format!(
            "{} names '{name}', which is not {what}",
            latest.display()
        )));
    }
    Ok(Some(dir))
}

/// The checkpoint a path names: a directory holding a checkpoint's files
/// (`model.safetensors` or its shards' index, `config.json` or
/// `adapter_config.json`) is itself;
/// a run directory (`runs/NAME`, what `--out-dir` and `--name` make) or its
/// `checkpoints` directory is the checkpoint its `latest` file names, so
/// `--checkpoint runs/NAME` reads the run's last checkpoint. Any other path
/// comes back as it is, for the loader to report. A `latest` that names no
/// checkpoint is an error naming both.
pub fn resolve_checkpoint_dir(p: &Path) -> Result<PathBuf> {
    let holds = |d: &Path| {
        has_weights(d)
            || ["config.json", "adapter_config.json"]
                .iter()
                .any(|f| d.join(f).is_file())
    };
    if holds(p) {
        return Ok(p.to_path_buf());
    }
    for parent in [p.join("checkpoints"), p.to_path_buf()] {
        if let Some(dir) = named_by_latest(&parent, holds, "a checkpoint directory")? {
            return Ok(dir);
        }
    }
    // A run directory whose `latest` is gone: name the checkpoints it holds.
    for parent in [p.join("checkpoints"), p.to_path_buf()] {
        let mut steps: Vec<PathBuf> = std::fs::read_dir(&parent)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|d| {
                d.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("step_"))
                    && holds(d)
            })
            .collect();
        steps.sort();
        if let Some(last) = steps.last() {
            return Err(Error::Checkpoint(format!(
                "{} holds checkpoints but no `latest` file naming one; name one, e.g. {}",
                parent.display(),
                last.display()
            )));
        }
    }
    Ok(p.to_path_buf())
}

/// Write a new model folder `out` whose files `write` puts into the
/// directory it is given, so that `out` appears only whole: the files go to
/// a temporary sibling `.out.tmp.<pid>.<n>` (removed on any error) that is
/// then renamed to `out`. `out` must not exist or be an empty directory; one
/// holding files is an error (nothing there is replaced).
pub fn write_new_dir(out: &Path, write: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
    let io = |what: &str, p: &Path, e: std::io::Error| {
        Error::Checkpoint(format!("{what} {}: {e}", p.display()))
    };
    let empty = match std::fs::read_dir(out) {
        Ok(mut d) => d.next().is_none(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => true,
        Err(e) => return Err(io("reading", out, e)),
    };
    if !empty {
        return Err(Error::Checkpoint(format!(
            "{} already holds files; write a model into a new (or empty) directory",
            out.display()
        )));
    }
    let name = out
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .ok_or_else(|| Error::Checkpoint(format!("{}: not a directory name", out.display())))?;
    let parent = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&parent).map_err(|e| io("creating", &parent, e))?;
    let tmp = parent.join(format!(".{name}.tmp.{}", unique_tag()));
    let done = std::fs::create_dir(&tmp)
        .map_err(|e| io("creating", &tmp, e))
        .and_then(|()| write(&tmp))
        .and_then(|()| {
            // An empty `out` goes first: not every system renames onto one.
            match std::fs::remove_dir(out) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(io("replacing", out, e))
                }
                _ => {}
            }
            std::fs::rename(&tmp, out).map_err(|e| io("renaming into", out, e))
        });
    if let Err(e) = done {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(e);
    }
    sync_dir(&parent);
    Ok(())
}

/// fsync a directory (its entries' renames); not every filesystem allows it.
pub(super) fn sync_dir(dir: &Path) {
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
}

/// `<pid>.<n>`: unique among this process's saves.
pub(super) fn unique_tag() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "{}.{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// Put the complete directory `new` at `dst`. Returns where the checkpoint
/// `dst` held before now is (to be removed), `None` if there was none. `aside`
/// is the name the old one takes where the filesystem cannot swap them.
pub(super) fn replace_dir(new: &Path, dst: &Path, aside: &Path) -> Result<Option<PathBuf>> {
    let io = |what: &str, p: &Path, e: std::io::Error| {
        Error::Checkpoint(format!("{what} {}: {e}", p.display()))
    };
    match std::fs::symlink_metadata(dst) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::rename(new, dst).map_err(|e| io("renaming into", dst, e))?;
            return Ok(None);
        }
        Err(e) => return Err(io("reading", dst, e)),
        Ok(_) => {}
    }
    match exchange(new, dst) {
        // `new` now names the old checkpoint.
        Ok(true) => return Ok(Some(new.to_path_buf())),
        Ok(false) => {}
        Err(e) => return Err(io("swapping in", dst, e)),
    }
    std::fs::rename(dst, aside).map_err(|e| io("moving aside", dst, e))?;
    if let Err(e) = std::fs::rename(new, dst) {
        let _ = std::fs::rename(aside, dst);
        return Err(io("renaming into", dst, e));
    }
    Ok(Some(aside.to_path_buf()))
}

/// Swap the directories `a` and `b` in one step. `Ok(false)`: this system or
/// filesystem cannot (the caller falls back to two renames).
#[cfg(target_os = "linux")]
pub(super) fn exchange(a: &Path, b: &Path) -> std::io::Result<bool> {
    use std::os::unix::ffi::OsStrExt;
    let c = |p: &Path| {
        std::ffi::CString::new(p.as_os_str().as_bytes())
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))
    };
    let (ca, cb) = (c(a)?, c(b)?);
    // SAFETY: both paths are NUL-terminated C strings that outlive the call;
    // renameat2 only reads them.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            ca.as_ptr(),
            libc::AT_FDCWD,
            cb.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    if rc == 0 {
        return Ok(true);
    }
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EINVAL | libc::ENOSYS | libc::EOPNOTSUPP) => Ok(false),
        _ => Err(e),
    }
}

/// Swap the directories `a` and `b` in one step: not available here.
#[cfg(not(target_os = "linux"))]
pub(super) fn exchange(_: &Path, _: &Path) -> std::io::Result<bool> {
    Ok(false)
}

/// Whether the process `pid` may still be running: `false` only where
/// `/proc` shows it is not (without `/proc`, every process may be).
pub(super) fn may_be_alive(pid: u32) -> bool {
    let proc = Path::new("/proc");
    !proc.join("self").exists() || proc.join(pid.to_string()).exists()
}

/// Remove the temporary files of [`write_atomic`] (`.<name>.tmp.<pid>`,
/// what a kill between the write and the rename leaves, e.g. a
/// `.latest.tmp.<pid>`) from `dir` where the process `<pid>` is no longer
/// alive (as `/proc` shows it; without `/proc` none is removed, and a pid
/// reused by a live process keeps its file until that one ends). This
/// process's own are kept: another thread of it may be writing one now. Each
/// file removed is traced at `info`, with its path. Returns the paths
/// removed. Best effort: a file that cannot be removed is left.
pub fn remove_stale_temp_files(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let me = std::process::id();
    let mut removed = Vec::new();
    for entry in entries.flatten() {
        let file = entry.file_name().to_string_lossy().into_owned();
        let Some(rest) = file.strip_prefix('.') else {
            continue;
        };
        let mut parts = rest.rsplitn(3, '.');
        let (Some(pid), Some("tmp"), Some(name)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let Ok(pid) = pid.parse::<u32>() else {
            continue;
        };
        if name.is_empty() || pid == me || may_be_alive(pid) {
            continue;
        }
        if !entry.file_type().is_ok_and(|t| t.is_file()) {
            continue;
        }
        let path = entry.path();
        if std::fs::remove_file(&path).is_ok() {
            tracing::info!(path = %path.display(), pid, "removed the temporary file of a process no longer running");
            removed.push(path);
        }
    }
    removed
}

/// Handle what killed saves left in the checkpoints directory `parent` (as
/// the next save does before it writes): an aside copy of a checkpoint that
/// is missing is renamed back, and temporary or aside directories of
/// processes no longer alive are removed. For a resume, which saves nothing
/// until its first checkpoint step.
pub fn clean_killed_saves(parent: &Path) {
    // No name of this process's own: its directories are all kept.
    clean_leftovers(parent, "");
}

/// Leftovers of saves that were killed (see [`save_checkpoint_with`]): in
/// `parent`, `.<ckpt>.tmp.<pid>.<n>` and `.<ckpt>.old.<pid>.<n>` directories
/// of processes no longer alive (and this process's for `name`) are removed,
/// after an aside copy of a checkpoint that is missing is renamed back. Best
/// effort: a leftover that cannot be handled is left where it is.
pub(super) fn clean_leftovers(parent: &Path, name: &str) {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    let me = std::process::id();
    let mut stale: Vec<(String, bool, PathBuf)> = Vec::new();
    for entry in entries.flatten() {
        let file = entry.file_name().to_string_lossy().into_owned();
        let Some(rest) = file.strip_prefix('.') else {
            continue;
        };
        // `<ckpt>.(tmp|old).<pid>.<n>`, the checkpoint's name may hold dots.
        let mut parts = rest.rsplitn(4, '.');
        let (Some(n), Some(pid), Some(kind), Some(ckpt)) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let (Ok(_), Ok(pid)) = (n.parse::<u64>(), pid.parse::<u32>()) else {
            continue;
        };
        if !matches!(kind, "tmp" | "old") || ckpt.is_empty() || ckpt.contains('/') {
            continue;
        }
        let dead = if pid == me {
            ckpt == name
        } else {
            !may_be_alive(pid)
        };
        if dead && entry.file_type().is_ok_and(|t| t.is_dir()) {
            stale.push((ckpt.to_string(), kind == "old", entry.path()));
        }
    }
    // A checkpoint that is missing gets an aside copy back (there is one
    // unless several saves of it were killed between their two renames).
    for (ckpt, is_old, path) in &stale {
        let dst = parent.join(ckpt);
        if *is_old
            && std::fs::symlink_metadata(&dst).is_err()
            && std::fs::rename(path, &dst).is_ok()
        {
            sync_dir(parent);
        }
    }
    for (_, _, path) in &stale {
        if path.exists() {
            let _ = std::fs::remove_dir_all(path);
        }
    }
}

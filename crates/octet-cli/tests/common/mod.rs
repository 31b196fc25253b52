//! Running the `octet` binary from the CLI tests, and their temp dirs.
//! (Each test file uses part of this module.)
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// A fresh, empty temp dir for one test (`octet-<tag>-<pid>`), removed when
/// dropped.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!("octet-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("temp dir");
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Run `octet ARGS` in `cwd`: whether it succeeded, and its stdout and
/// stderr together.
pub fn octet_in(cwd: &Path, args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_octet"))
        .args(args)
        .current_dir(cwd)
        .output()
        .expect("the octet binary runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// Run `octet ARGS --out-dir <a fresh temp dir>` with the extra environment
/// `env`; the temp dir is removed afterwards. Returns whether it succeeded
/// and its stdout and stderr together.
pub fn run_octet(name: &str, args: &[&str], env: &[(&str, &str)]) -> (bool, String) {
    let out_dir = std::env::temp_dir().join(format!("octet-{name}-{}", std::process::id()));
    let out = Command::new(env!("CARGO_BIN_EXE_octet"))
        .args(args)
        .arg("--out-dir")
        .arg(&out_dir)
        .envs(env.iter().copied())
        .output()
        .expect("the octet binary runs");
    let _ = std::fs::remove_dir_all(&out_dir);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

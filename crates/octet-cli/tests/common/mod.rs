//! Running the `octet` binary from the CLI tests.

use std::process::Command;

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

//! Run directories end to end on the CPU with the tiny model: a resumed
//! run stays in its own run directory, `octet lora merge` reads run
//! directories and refuses to write into one.

use std::path::Path;

mod common;

use common::TempDir;

/// Run `octet ARGS` in `cwd` (`common::octet_in`), which must not panic.
fn octet(cwd: &Path, args: &[&str]) -> (bool, String) {
    let (ok, text) = common::octet_in(cwd, args);
    assert!(!text.contains("panicked"), "{text}");
    (ok, text)
}

fn train(cwd: &Path, extra: &[&str]) {
    let mut args = vec![
        "train",
        "--device",
        "cpu",
        "--model",
        "tiny",
        "--batch",
        "2",
        "--seq",
        "16",
        "--eval-batches",
        "0",
        "--sample-tokens",
        "0",
    ];
    args.extend_from_slice(extra);
    let (ok, text) = octet(cwd, &args);
    assert!(ok, "{text}");
}

/// `octet train --resume RUN` with no `--name` or `--out-dir` goes on in
/// RUN, and leaves `runs/default` (another run's) as it was: it used to
/// write there, replacing that run's checkpoint of the same step.
#[test]
fn a_resumed_run_stays_in_its_own_run_directory() {
    let dir = TempDir::new("rundirs-resume");
    let d = &dir.0;
    train(d, &["--steps", "4", "--seed", "1"]);
    let other = d.join("runs/default/checkpoints/step_000004/model.safetensors");
    let before = std::fs::read(&other).expect("the default run's checkpoint");
    train(
        d,
        &[
            "--steps",
            "2",
            "--seed",
            "2",
            "--out-dir",
            "D",
            "--name",
            "b",
        ],
    );
    train(d, &["--steps", "4", "--resume", "D/b"]);
    assert!(
        d.join("D/b/checkpoints/step_000004/optimizer.safetensors")
            .is_file(),
        "the resumed run's checkpoint is not in its run directory"
    );
    assert_eq!(
        std::fs::read_to_string(d.join("D/b/checkpoints/latest")).expect("latest"),
        "step_000004"
    );
    let after = std::fs::read(&other).expect("the default run's checkpoint");
    assert!(
        before == after,
        "the resume replaced another run's checkpoint"
    );
}

/// `octet lora merge` takes run directories for `--base` and `--adapter`
/// (as `octet generate` does), and refuses an `--out` that is a run
/// directory, where the merged model would stand in for its latest checkpoint.
#[test]
fn lora_merge_reads_run_directories_and_does_not_write_into_one() {
    let dir = TempDir::new("rundirs-merge");
    let d = &dir.0;
    train(d, &["--steps", "2", "--out-dir", "D", "--name", "t"]);
    let (ok, text) = octet(
        d,
        &[
            "lora",
            "--device",
            "cpu",
            "--base",
            "D/t",
            "--steps",
            "2",
            "--batch",
            "2",
            "--seq",
            "16",
            "--eval-batches",
            "0",
            "--sample-tokens",
            "0",
            "--out-dir",
            "D",
            "--name",
            "l",
        ],
    );
    assert!(ok, "{text}");
    let (ok, text) = octet(
        d,
        &[
            "lora",
            "merge",
            "--base",
            "D/t",
            "--adapter",
            "D/l",
            "--out",
            "M",
        ],
    );
    assert!(ok, "{text}");
    assert!(d.join("M/model.safetensors").is_file(), "{text}");
    let base = "D/t/checkpoints/step_000002";
    for out in ["D/t", "D/t/checkpoints"] {
        let (ok, text) = octet(
            d,
            &[
                "lora",
                "merge",
                "--base",
                base,
                "--adapter",
                "D/l",
                "--out",
                out,
            ],
        );
        assert!(!ok && text.contains("run directory"), "{out}: {text}");
    }
    assert!(!d.join("D/t/model.safetensors").exists());
    // The run directory still resumes from its latest checkpoint.
    let (ok, text) = octet(
        d,
        &[
            "train",
            "--device",
            "cpu",
            "--resume",
            "D/t",
            "--steps",
            "3",
            "--batch",
            "2",
            "--seq",
            "16",
            "--eval-batches",
            "0",
            "--sample-tokens",
            "0",
        ],
    );
    assert!(ok, "{text}");
}

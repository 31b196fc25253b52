//! `octet generate` (and `octet info`) on bad input, on any machine (the
//! CPU): checkpoints whose config disagrees with their tensors, non-finite
//! temperatures and weights, bad `--compare` names, and a stdout closed by
//! its reader (`| head`). Each test writes its checkpoint to a fresh temp dir.

use octet_nn::llama::{Llama, LlamaConfig};
use octet_tensor::{DType, Tensor};
use octet_train::checkpoint;
use std::process::{Command, Stdio};

mod common;

use common::TempDir;

/// What a run of `octet` gave back.
struct Out {
    code: Option<i32>,
    stdout: Vec<u8>,
    stderr: String,
}

/// Run `octet ARGS`; with `close_stdout`, its stdout is a pipe whose reader
/// is closed at once (as `| head -c 0` would).
fn octet(args: &[&str], close_stdout: bool) -> Out {
    let mut child = Command::new(env!("CARGO_BIN_EXE_octet"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the octet binary runs");
    if close_stdout {
        drop(child.stdout.take());
    }
    let out = child.wait_with_output().expect("octet ends");
    Out {
        code: out.status.code(),
        stdout: out.stdout,
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// A random tiny model (2 layers, untied head), its weights changed by `edit`,
/// saved as a checkpoint in `dir` with `config` (the model's own by default).
fn checkpoint_in(
    dir: &TempDir,
    edit: impl FnOnce(&mut std::collections::HashMap<String, Tensor>),
    config: impl FnOnce(&mut LlamaConfig),
) -> String {
    let cfg = LlamaConfig::preset("tiny").expect("preset");
    let m = Llama::new_random(&cfg, DType::F32, None, 7).expect("model");
    let mut w = m
        .params()
        .into_iter()
        .map(|(n, t)| (n, t.clone()))
        .collect();
    edit(&mut w);
    let m = Llama::from_weights(&cfg, w, None).expect("edited model");
    checkpoint::save_model(&dir.0, &m).expect("save");
    let mut written = cfg.clone();
    config(&mut written);
    checkpoint::write_config(&dir.0, &written, DType::F32).expect("config");
    dir.0.display().to_string()
}

fn generate(ckpt: &str, extra: &[&str]) -> Out {
    let mut args = vec![
        "generate",
        "--checkpoint",
        ckpt,
        "--device",
        "cpu",
        "--max-tokens",
        "8",
    ];
    args.extend(extra);
    octet(&args, false)
}

#[test]
fn a_config_with_fewer_layers_than_the_weights_is_refused() {
    let dir = TempDir::new("gen-layers");
    let ckpt = checkpoint_in(&dir, |_| {}, |c| c.num_hidden_layers = 1);
    let out = generate(&ckpt, &[]);
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(
        out.stderr.contains("unexpected tensors")
            && out.stderr.contains("model.layers.1.mlp.down_proj.weight"),
        "the left-over layer is not named:\n{}",
        out.stderr
    );
    assert!(out.stdout.is_empty(), "it decoded before refusing");
}

#[test]
fn a_tied_config_with_a_different_lm_head_is_refused() {
    let dir = TempDir::new("gen-tied");
    let ckpt = checkpoint_in(&dir, |_| {}, |c| c.tie_word_embeddings = true);
    let out = generate(&ckpt, &[]);
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(
        out.stderr.contains("lm_head.weight differs"),
        "{}",
        out.stderr
    );
}

#[test]
fn a_non_finite_temperature_is_refused_before_decoding() {
    let dir = TempDir::new("gen-temperature");
    let ckpt = checkpoint_in(&dir, |_| {}, |_| {});
    for t in ["nan", "inf", "-inf", "NaN"] {
        let arg = format!("--temperature={t}");
        let out = generate(&ckpt, &[&arg]);
        assert_eq!(out.code, Some(1), "--temperature {t}: {}", out.stderr);
        assert!(out.stderr.contains("--temperature"), "{}", out.stderr);
        assert!(out.stdout.is_empty(), "--temperature {t} decoded");
    }
    assert_eq!(generate(&ckpt, &["--temperature", "0"]).code, Some(0));
}

#[test]
fn non_finite_logits_stop_generation_with_an_error() {
    let dir = TempDir::new("gen-huge-weight");
    // Finite weights whose products overflow: the logits' own check fires.
    let ckpt = checkpoint_in(
        &dir,
        |w| {
            let n = &w["model.norm.weight"];
            let g = vec![f32::MAX; n.numel()];
            let t = Tensor::from_f32(n.shape(), g).expect("tensor");
            w.insert("model.norm.weight".into(), t);
        },
        |_| {},
    );
    let out = generate(&ckpt, &[]);
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(
        out.stderr.contains("non-finite logits at step 0"),
        "{}",
        out.stderr
    );
    assert!(!out.stdout.contains(&0), "a NUL byte was printed");
}

/// A NaN in a projection weight used to surface as "non-finite logits at
/// step 0": the error names the tensor and the checkpoint before decoding.
#[test]
fn a_nan_in_a_projection_weight_is_named_before_decoding() {
    let dir = TempDir::new("gen-nan-weight");
    let name = "model.layers.1.self_attn.v_proj.weight";
    let ckpt = checkpoint_in(
        &dir,
        |w| {
            let n = &w[name];
            let mut g = n.to_f32_vec();
            g[5] = f32::NAN;
            let t = Tensor::from_f32(n.shape(), g).expect("tensor");
            w.insert(name.into(), t);
        },
        |_| {},
    );
    let out = generate(&ckpt, &[]);
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(
        out.stderr
            .contains(&format!("tensor {name} holds NaN at index 5"))
            && out.stderr.contains(&ckpt),
        "{}",
        out.stderr
    );
    assert!(out.stdout.is_empty(), "it decoded before refusing");
}

#[test]
fn a_bad_compare_name_is_refused_before_decoding() {
    let dir = TempDir::new("gen-compare");
    let ckpt = checkpoint_in(&dir, |_| {}, |_| {});
    let out = generate(&ckpt, &["--compare", "foo"]);
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(
        out.stderr.contains("--compare") && out.stderr.contains("'foo'"),
        "{}",
        out.stderr
    );
    assert!(
        out.stdout.is_empty(),
        "it decoded before checking --compare:\n{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn a_closed_stdout_ends_quietly() {
    let dir = TempDir::new("gen-pipe");
    let ckpt = checkpoint_in(&dir, |_| {}, |_| {});
    let runs: [&[&str]; 2] = [
        &["info"],
        &[
            "generate",
            "--checkpoint",
            &ckpt,
            "--device",
            "cpu",
            "--max-tokens",
            "50",
        ],
    ];
    let failed: Vec<String> = runs
        .iter()
        .map(|args| (args, octet(args, true)))
        .filter(|(_, out)| out.code != Some(0) || out.stderr.contains("panicked"))
        .map(|(args, out)| format!("octet {args:?}: {:?}\n{}", out.code, out.stderr))
        .collect();
    assert!(
        failed.is_empty(),
        "into a closed pipe:\n{}",
        failed.join("\n")
    );
}

#[test]
fn characters_of_several_tokens_are_echoed_whole() {
    // A byte-level model trained on "é" (bytes C3 A9) samples C3, A9, C3, ...:
    // echoed a token at a time, each byte read as U+FFFD on its own.
    let dir = TempDir::new("gen-utf8");
    let data = dir.0.join("e.txt");
    std::fs::write(&data, "é".repeat(20_000)).expect("data");
    let (data, out_dir) = (data.display().to_string(), dir.0.display().to_string());
    let args = [
        "train",
        "--device",
        "cpu",
        "--model",
        "tiny",
        "--data",
        &data,
        "--steps",
        "60",
        "--seq",
        "32",
        "--batch",
        "4",
        "--eval-batches",
        "0",
        "--sample-tokens",
        "0",
        "--out-dir",
        &out_dir,
        "--name",
        "e",
    ];
    let out = octet(&args, false);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let ckpt = dir
        .0
        .join("e/checkpoints/step_000060")
        .display()
        .to_string();
    let args = ["--prompt", "é", "--temperature", "0", "--weights", "f32"];
    let out = generate(&ckpt, &args);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&"é".repeat(5)) && !text.contains('\u{FFFD}'),
        "{text}"
    );
}

//! Hugging Face model folders of each family load and compute what
//! transformers computes, and bad folders are errors naming what is wrong.
//!
//! The fixtures (`crates/octet-nn/tests/fixtures/hf/<family>/`) were made by
//! transformers 5 (`make_fixtures.py` beside them): `config.json` (transformers 5 form), `config_v4.json`
//! (the same model in transformers 4 form), `model.safetensors` (f32) and
//! `reference.safetensors` with `tokens` (i64 `[16]`), `logits` (f32
//! `[16, 128]`) and `loss` (f32 `[1]`: the causal LM loss with labels =
//! tokens, the mean cross-entropy of `logits[:-1]` against `tokens[1:]`).

use octet_nn::hf_config;
use octet_nn::llama::{Llama, LlamaConfig};
use octet_tensor::DType;
use octet_train::checkpoint;
use safetensors::SafeTensors;
use std::path::{Path, PathBuf};

fn fixture(family: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../octet-nn/tests/fixtures/hf")
        .join(family)
}

struct Reference {
    tokens: Vec<u32>,
    logits: Vec<f32>,
    loss: f32,
}

fn reference(dir: &Path) -> Reference {
    let path = dir.join("reference.safetensors");
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let st = SafeTensors::deserialize(&bytes).expect("reference.safetensors");
    let raw = |name: &str| st.tensor(name).expect(name).data().to_vec();
    let tokens = raw("tokens")
        .chunks_exact(8)
        .map(|b| i64::from_le_bytes(b.try_into().expect("8 bytes")) as u32)
        .collect();
    let f32s = |name: &str| -> Vec<f32> {
        raw(name)
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes")))
            .collect()
    };
    Reference {
        tokens,
        logits: f32s("logits"),
        loss: f32s("loss")[0],
    }
}

/// Load `family`'s folder with each config form, run the reference tokens,
/// and compare with transformers: the loss to 1e-5 relative; the logits to
/// 1e-4 absolute (logits of these random models are O(1), where absolute
/// is the stricter bound for most entries and relative would blow up near
/// zero). Returns `(max logit error, loss relative error)` of the worse form.
fn matches_transformers(family: &str) -> (f32, f64) {
    let dir = fixture(family);
    let from_v5 = checkpoint::load_config(&dir).expect("config.json");
    let v4_text = std::fs::read_to_string(dir.join("config_v4.json")).expect("config_v4.json");
    let from_v4 = hf_config::parse(&v4_text).expect("config_v4.json").config;
    assert_eq!(from_v5, from_v4, "{family}: the two config forms differ");
    let r = reference(&dir);
    let (_, weights) = checkpoint::load_model_folder(&dir, DType::F32).expect("model folder");
    let mut worst = (0f32, 0f64);
    for cfg in [from_v5, from_v4] {
        let mut model = Llama::from_weights(&cfg, weights.clone(), None).expect("model");
        let n = r.tokens.len();
        let logits = model.logits(&r.tokens, 1, n).expect("logits").to_f32_vec();
        assert_eq!(logits.len(), r.logits.len(), "{family}: logits shape");
        let (i, err) = logits
            .iter()
            .zip(&r.logits)
            .map(|(a, b)| (a - b).abs())
            .enumerate()
            .fold((0, 0f32), |m, (i, e)| if e > m.1 { (i, e) } else { m });
        assert!(
            err <= 1e-4,
            "{family}: logit {i} (token {}, id {}) is {} where transformers has {} (|error| {err:e})",
            i / cfg.vocab_size,
            i % cfg.vocab_size,
            logits[i],
            r.logits[i]
        );
        let (loss, _) = model
            .forward(&r.tokens[..n - 1], &r.tokens[1..], 1, n - 1)
            .expect("loss");
        let rel = (loss - r.loss as f64).abs() / (r.loss as f64).abs();
        assert!(
            rel <= 1e-5,
            "{family}: loss {loss} where transformers has {} (relative error {rel:e})",
            r.loss
        );
        worst = (worst.0.max(err), worst.1.max(rel));
    }
    eprintln!(
        "{family}: max |logit error| {:.3e}, loss relative error {:.3e}",
        worst.0, worst.1
    );
    worst
}

#[test]
fn llama_matches_transformers() {
    matches_transformers("llama");
}

#[test]
fn llama3_rope_scaling_matches_transformers() {
    matches_transformers("llama3");
}

#[test]
fn mistral_matches_transformers() {
    matches_transformers("mistral");
}

#[test]
fn qwen2_attention_biases_match_transformers() {
    matches_transformers("qwen2");
}

#[test]
fn qwen3_qk_norms_match_transformers() {
    matches_transformers("qwen3");
}

fn tmpdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("octet-hf-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

fn qwen2() -> LlamaConfig {
    LlamaConfig {
        qkv_bias: true,
        ..LlamaConfig::preset("tiny").expect("tiny")
    }
}

#[test]
fn octet_saves_a_family_model_as_a_folder_that_loads_back() {
    let dir = tmpdir("roundtrip");
    let model = Llama::new_random(&qwen2(), DType::F32, None, 4).expect("model");
    checkpoint::save_model(&dir, &model).expect("save");
    let text = std::fs::read_to_string(dir.join("config.json")).expect("config.json");
    assert!(text.contains("Qwen2ForCausalLM"), "{text}");
    let (cfg, w) = checkpoint::load_model_folder(&dir, DType::F32).expect("load");
    assert_eq!(cfg, qwen2());
    assert_eq!(
        w["model.layers.1.self_attn.v_proj.bias"],
        *model
            .params()
            .into_iter()
            .find(|(n, _)| n == "model.layers.1.self_attn.v_proj.bias")
            .expect("bias")
            .1
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_missing_tensor_is_named_with_its_file() {
    let dir = tmpdir("missing");
    let plain = Llama::new_random(
        &LlamaConfig::preset("tiny").expect("tiny"),
        DType::F32,
        None,
        4,
    )
    .expect("model");
    checkpoint::save_model(&dir, &plain).expect("save");
    // The config says Qwen2; the weights have no biases.
    checkpoint::write_config(&dir, &qwen2(), DType::F32).expect("config");
    let e = checkpoint::load_model_folder(&dir, DType::F32)
        .expect_err("no biases")
        .to_string();
    assert!(
        e.contains("model.safetensors") && e.contains("self_attn.q_proj.bias"),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_unknown_architecture_or_field_is_named_with_its_file() {
    let dir = tmpdir("config");
    let model = Llama::new_random(&qwen2(), DType::F32, None, 4).expect("model");
    checkpoint::save_model(&dir, &model).expect("save");
    let text = std::fs::read_to_string(dir.join("config.json")).expect("config.json");
    for (from, to, words) in [
        (
            "Qwen2ForCausalLM",
            "Phi3ForCausalLM",
            ["architectures", "Phi3ForCausalLM"],
        ),
        (r#""silu""#, r#""relu""#, ["hidden_act", "relu"]),
    ] {
        std::fs::write(dir.join("config.json"), text.replace(from, to)).expect("write");
        let e = checkpoint::load_config(&dir).expect_err(to).to_string();
        for w in words.into_iter().chain(["config.json"]) {
            assert!(e.contains(w), "{w:?} missing from: {e}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

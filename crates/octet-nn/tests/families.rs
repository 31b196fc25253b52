//! The model families as switches of one model: q/k/v/o biases (Llama's
//! `attention_bias`, Qwen2), per-head q/k norms (Qwen3) and a head width of
//! its own. Their gradients against central finite differences of the f64
//! model, generation against training's forward, LoRA keeping the base's
//! biases frozen, and `config.json` in transformers 4 and 5 forms.

use octet_fp8::{BackwardMode, Recipe};
use octet_nn::decode::{DecodeModel, WeightStorage};
use octet_nn::hf_config::{self, Architecture};
use octet_nn::llama::{Llama, LlamaConfig, LoraSpec};
use octet_nn::lora::{BaseFormat, Compute};
use octet_tensor::{DType, Tensor};
use rand::{Rng, SeedableRng};
use std::collections::HashMap;

fn base() -> LlamaConfig {
    LlamaConfig {
        vocab_size: 40,
        hidden_size: 24,
        intermediate_size: 40,
        num_hidden_layers: 2,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        max_position_embeddings: 32,
        rms_norm_eps: 1e-6,
        rope_theta: 10000.0,
        tie_word_embeddings: false,
        rope_scaling: None,
        head_dim: None,
        qkv_bias: false,
        o_bias: false,
        qk_norm: false,
    }
}

/// One config per family shape, by name.
fn families() -> Vec<(&'static str, LlamaConfig)> {
    vec![
        (
            "llama attention_bias",
            LlamaConfig {
                qkv_bias: true,
                o_bias: true,
                ..base()
            },
        ),
        (
            "qwen2 (tied)",
            LlamaConfig {
                qkv_bias: true,
                tie_word_embeddings: true,
                ..base()
            },
        ),
        (
            // 4 heads of 8 over a width of 24: q is (32, 24), o is (24, 32).
            "qwen3 (head_dim 8)",
            LlamaConfig {
                qk_norm: true,
                head_dim: Some(8),
                ..base()
            },
        ),
        (
            "qwen3 attention_bias",
            LlamaConfig {
                qk_norm: true,
                qkv_bias: true,
                o_bias: true,
                head_dim: Some(8),
                ..base()
            },
        ),
    ]
}

/// A random model whose biases and norm gains are random too (a fresh
/// model's zeros and ones would hide a transposed or missing term).
fn model(cfg: &LlamaConfig, dtype: DType, seed: u64) -> Llama {
    let mut m = Llama::new_random(cfg, dtype, None, seed).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed + 1000);
    for (name, t) in m.params_mut() {
        let spread = if name.ends_with(".bias") {
            Some((0.0, 0.5))
        } else if name.contains("_norm.") || name.contains("layernorm") {
            Some((1.0, 0.3))
        } else {
            None
        };
        if let Some((mid, half)) = spread {
            let v: Vec<f64> = (0..t.numel())
                .map(|_| mid + rng.random_range(-half..half))
                .collect();
            *t = Tensor::from_f64(t.shape(), v).unwrap().to_dtype(dtype);
        }
    }
    m
}

fn tokens(cfg: &LlamaConfig, n: usize, seed: u64) -> Vec<u32> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..n)
        .map(|_| rng.random_range(0..cfg.vocab_size as u32))
        .collect()
}

fn set(m: &mut Llama, name: &str, i: usize, value: f64) {
    for (n, t) in m.params_mut() {
        if n == name {
            let mut v = t.to_f64_vec();
            v[i] = value;
            *t = Tensor::from_f64(t.shape(), v).unwrap();
        }
    }
}

#[test]
fn parameter_names_carry_the_family_tensors_with_their_shapes() {
    let cfgs: HashMap<_, _> = families().into_iter().collect();
    let shapes: HashMap<String, Vec<usize>> = Llama::param_shapes(&cfgs["qwen3 attention_bias"])
        .into_iter()
        .collect();
    let p = "model.layers.1.self_attn";
    for (name, shape) in [
        ("q_proj.weight", vec![32, 24]),
        ("q_proj.bias", vec![32]),
        ("k_proj.weight", vec![16, 24]),
        ("k_proj.bias", vec![16]),
        ("v_proj.bias", vec![16]),
        ("o_proj.weight", vec![24, 32]),
        ("o_proj.bias", vec![24]),
        ("q_norm.weight", vec![8]),
        ("k_norm.weight", vec![8]),
    ] {
        assert_eq!(shapes.get(&format!("{p}.{name}")), Some(&shape), "{name}");
    }
    let qwen2: Vec<String> = Llama::param_shapes(&cfgs["qwen2 (tied)"])
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert!(qwen2.contains(&format!("{p}.v_proj.bias")));
    assert!(!qwen2
        .iter()
        .any(|n| n.contains("o_proj.bias") || n.contains("q_norm")));
    for (name, cfg) in families() {
        let m = Llama::new_random(&cfg, DType::F32, None, 1).unwrap();
        let count: usize = m.params().iter().map(|(_, t)| t.numel()).sum();
        assert_eq!(count, cfg.num_params(), "{name}");
    }
}

/// Central differences of the f64 model's loss, step 1e-5, against
/// backward's gradient for every bias and q/k norm tensor (a few entries
/// each) and one entry of each projection. The truncation error is
/// O(h^2) ~ 1e-10 and the rounding ~1e-16/h ~ 1e-11; the bound leaves
/// room for both.
#[test]
fn bias_and_qk_norm_gradients_match_finite_differences() {
    for (fam, cfg) in families() {
        let mut m = model(&cfg, DType::F64, 7);
        let (b, t) = (2, 6);
        let x = tokens(&cfg, b * t, 11);
        let y = tokens(&cfg, b * t, 12);
        let (_, saved) = m.forward(&x, &y, b, t).unwrap();
        let grads: HashMap<String, Tensor> = m.backward(saved).unwrap().into_iter().collect();
        let names: Vec<String> = m.params().into_iter().map(|(n, _)| n).collect();
        let mut checked = 0;
        for name in &names {
            let family_tensor = name.ends_with(".bias") || name.contains("_norm.weight");
            let some_proj = name.contains("layers.0.self_attn") && name.ends_with("_proj.weight");
            if !(family_tensor || some_proj) {
                continue;
            }
            let value = m
                .params()
                .into_iter()
                .find(|(n, _)| n == name)
                .map(|(_, t)| t.to_f64_vec())
                .unwrap();
            let g = grads[name].to_f64_vec();
            for i in [0, value.len() / 3, value.len() - 1] {
                let h = 1e-5;
                set(&mut m, name, i, value[i] + h);
                let up = m.forward(&x, &y, b, t).unwrap().0;
                set(&mut m, name, i, value[i] - h);
                let down = m.forward(&x, &y, b, t).unwrap().0;
                set(&mut m, name, i, value[i]);
                let fd = (up - down) / (2.0 * h);
                let err = (fd - g[i]).abs();
                assert!(
                    err <= 1e-8 + 1e-6 * fd.abs(),
                    "{fam}: {name}[{i}]: backward {} vs finite difference {fd} (error {err:e})",
                    g[i]
                );
                checked += 1;
            }
        }
        // At least layer 0's four projections, three entries each.
        assert!(checked >= 12, "{fam}: only {checked} entries checked");
    }
}

/// The decoder's prefill and its token-by-token steps give the training
/// forward's logits (f32 weights; both accumulate in f32 in other orders).
#[test]
fn generation_matches_the_training_forward_for_every_family() {
    for (fam, cfg) in families() {
        let mut m = model(&cfg, DType::F32, 3);
        let n = 7;
        let x = tokens(&cfg, n, 5);
        let want = m.logits(&x, 1, n).unwrap().to_f32_vec();
        let w: HashMap<String, Tensor> = m
            .params()
            .into_iter()
            .map(|(k, t)| (k, t.clone()))
            .collect();
        let mut dec = DecodeModel::new(&cfg, &w, WeightStorage::F32).unwrap();
        let prefill = dec.forward(&x).unwrap();
        dec.reset();
        let mut steps = Vec::new();
        for &tok in &x {
            steps.extend(dec.forward(&[tok]).unwrap());
        }
        for (what, got) in [("prefill", &prefill), ("steps", &steps)] {
            let worst = want
                .iter()
                .zip(got.iter())
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(worst < 1e-4, "{fam} {what}: max |difference| {worst}");
        }
    }
}

#[test]
fn lora_keeps_the_base_biases_and_norms_frozen_and_in_use() {
    let recipe = Recipe::from_name("tensorwise")
        .unwrap()
        .with_backward(BackwardMode::HighPrecision)
        .unwrap();
    for (fam, cfg) in families() {
        let base = model(&cfg, DType::F32, 9);
        let spec = LoraSpec {
            rank: 2,
            alpha: 4.0,
            targets: vec!["q".into(), "k".into(), "v".into(), "o".into()],
            base: BaseFormat::Bf16,
            compute: Compute::Bf16,
            recipe,
            seed: 1,
            dropout: 0.0,
        };
        let mut lora = base.clone().into_lora(&spec).unwrap();
        let trainable: Vec<String> = lora.params().into_iter().map(|(n, _)| n).collect();
        assert!(
            trainable.iter().all(|n| n.contains(".lora_")),
            "{fam}: {trainable:?}"
        );
        let x = tokens(&cfg, 8, 2);
        let (_, saved) = lora.forward(&x, &x, 1, 8).unwrap();
        let grads = lora.backward(saved).unwrap();
        assert_eq!(grads.len(), trainable.len(), "{fam}");
        // The merged weights carry the biases and norms exactly as the base had them.
        let merged: HashMap<String, Tensor> = lora.merged_weights().unwrap().into_iter().collect();
        for (name, t) in base.params() {
            if name.ends_with(".bias") || name.contains("_norm.") {
                assert_eq!(&merged[&name], t, "{fam}: {name}");
            }
        }
        // B starts at zero: the adapted model computes what the base does, biases included
        // (bf16 base matrices: the difference is bf16 rounding of the weights).
        let mut plain = base.clone();
        let want = plain.logits(&x, 1, 8).unwrap().to_f32_vec();
        let got = lora.logits(&x, 1, 8).unwrap().to_f32_vec();
        let worst = want
            .iter()
            .zip(&got)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(worst < 2e-3, "{fam}: max |difference| {worst}");
    }
}

/// A checkpoint's config round-trips through octet's `config.json` form
/// under the architecture its switches name.
#[test]
fn configs_round_trip_through_config_json() {
    for (fam, cfg) in families() {
        let text = hf_config::to_json(&cfg, DType::Bf16).to_string();
        let back = hf_config::parse(&text).unwrap();
        assert_eq!(back.config, cfg, "{fam}");
        assert!(back.ignored.is_empty(), "{fam}: {:?}", back.ignored);
    }
    let qwen2 = families().remove(1).1;
    assert_eq!(Architecture::of(&qwen2), Architecture::Qwen2);
}

const QWEN3_V5: &str = r#"{
  "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "dtype": "float32",
  "vocab_size": 128, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
  "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
  "max_position_embeddings": 64, "rms_norm_eps": 1e-06, "tie_word_embeddings": true,
  "attention_bias": false, "attention_dropout": 0.0, "hidden_act": "silu",
  "use_sliding_window": false, "sliding_window": null, "max_window_layers": 2,
  "layer_types": ["full_attention", "full_attention"],
  "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"},
  "bos_token_id": 1, "eos_token_id": 2, "initializer_range": 0.02, "use_cache": true,
  "transformers_version": "5.0.0"
}"#;

const QWEN3_V4: &str = r#"{
  "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "torch_dtype": "float32",
  "vocab_size": 128, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
  "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
  "max_position_embeddings": 64, "rms_norm_eps": 1e-06, "tie_word_embeddings": true,
  "attention_bias": false, "attention_dropout": 0.0, "hidden_act": "silu",
  "use_sliding_window": false, "sliding_window": 4096, "max_window_layers": 2,
  "rope_theta": 1000000.0, "rope_scaling": null, "transformers_version": "4.51.0"
}"#;

#[test]
fn transformers_4_and_5_configs_of_one_model_read_the_same() {
    let v5 = hf_config::parse(QWEN3_V5).unwrap();
    let v4 = hf_config::parse(QWEN3_V4).unwrap();
    assert_eq!(v5.config, v4.config);
    assert_eq!(v5.architecture, Architecture::Qwen3);
    assert_eq!(v5.dtype.as_deref(), Some("float32"));
    assert_eq!(v4.dtype.as_deref(), Some("float32"));
    let c = v5.config;
    assert!(c.qk_norm && !c.qkv_bias && !c.o_bias && c.tie_word_embeddings);
    assert_eq!((c.head_dim(), c.rope_theta), (32, 1e6));
    // llama3 scaling in both spellings.
    let llama = |rope: &str| {
        format!(
            r#"{{"architectures": ["LlamaForCausalLM"], "vocab_size": 64, "hidden_size": 32,
            "intermediate_size": 48, "num_hidden_layers": 1, "num_attention_heads": 4,
            "max_position_embeddings": 64, {rope}}}"#
        )
    };
    let fields = r#""factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 16"#;
    let v5 = llama(&format!(
        r#""rope_parameters": {{"rope_type": "llama3", "rope_theta": 500000.0, {fields}}}"#
    ));
    let v4 = llama(&format!(
        r#""rope_theta": 500000.0, "rope_scaling": {{"rope_type": "llama3", {fields}}}"#
    ));
    let (a, b) = (
        hf_config::parse(&v5).unwrap(),
        hf_config::parse(&v4).unwrap(),
    );
    assert_eq!(a.config, b.config);
    assert_eq!(a.config.rope_scaling.as_ref().unwrap().factor, Some(8.0));
    assert_eq!(
        a.config.num_key_value_heads, 4,
        "absent: one per query head"
    );
}

#[test]
fn what_octet_does_not_run_is_refused_by_name() {
    let with = |extra: &str| QWEN3_V5.replacen('{', &format!("{{{extra}, "), 1);
    let mistral = |window: &str| {
        format!(
            r#"{{"architectures": ["MistralForCausalLM"], "vocab_size": 64, "hidden_size": 32,
            "intermediate_size": 48, "num_hidden_layers": 1, "num_attention_heads": 4,
            "max_position_embeddings": 64, "sliding_window": {window}}}"#
        )
    };
    let cases = [
        (
            QWEN3_V5.replace("Qwen3ForCausalLM", "GemmaForCausalLM"),
            vec!["architectures", "GemmaForCausalLM"],
        ),
        (
            QWEN3_V5.replace(r#""silu""#, r#""gelu_pytorch_tanh""#),
            vec!["hidden_act", "gelu_pytorch_tanh"],
        ),
        (
            QWEN3_V5.replace(r#""attention_dropout": 0.0"#, r#""attention_dropout": 0.1"#),
            vec!["attention_dropout", "0.1"],
        ),
        (
            QWEN3_V5.replace(r#""rope_type": "default""#, r#""rope_type": "yarn""#),
            vec!["rope_parameters", "yarn"],
        ),
        (
            QWEN3_V5
                .replace(
                    r#""use_sliding_window": false"#,
                    r#""use_sliding_window": true"#,
                )
                .replace(r#""sliding_window": null"#, r#""sliding_window": 16"#),
            vec!["sliding_window", "16"],
        ),
        (mistral("32"), vec!["sliding_window", "32"]),
        (
            QWEN3_V5.replace(r#""full_attention"]"#, r#""chunked_attention"]"#),
            vec!["layer_types", "chunked_attention"],
        ),
        (
            QWEN3_V5.replace(r#""vocab_size": 128, "#, ""),
            vec!["vocab_size", "missing"],
        ),
        (
            with(r#""partial_rotary_factor": 0.5"#),
            vec!["partial_rotary_factor", "0.5"],
        ),
    ];
    for (text, words) in cases {
        let e = hf_config::parse(&text).expect_err(&text).to_string();
        for w in words {
            assert!(e.contains(w), "{w:?} missing from: {e}");
        }
    }
    // A window no shorter than the context never masks: Mistral v0.1's form loads.
    assert!(hf_config::parse(&mistral("64")).is_ok());
    assert!(hf_config::parse(&mistral("null")).is_ok());
    // Fields octet does not know are listed, not read.
    let odd = hf_config::parse(&with(r#""some_new_switch": 3"#)).unwrap();
    assert_eq!(odd.ignored, vec!["some_new_switch".to_string()]);
}

#[test]
fn a_missing_family_tensor_is_named() {
    let cfg = families().remove(3).1;
    let m = Llama::new_random(&cfg, DType::F32, None, 1).unwrap();
    let mut w: HashMap<String, Tensor> = m
        .params()
        .into_iter()
        .map(|(k, t)| (k, t.clone()))
        .collect();
    w.remove("model.layers.1.self_attn.k_norm.weight");
    let e = Llama::from_weights(&cfg, w.clone(), None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("model.layers.1.self_attn.k_norm.weight"), "{e}");
    let e = DecodeModel::new(&cfg, &w, WeightStorage::F32)
        .unwrap_err()
        .to_string();
    assert!(e.contains("model.layers.1.self_attn.k_norm.weight"), "{e}");
}

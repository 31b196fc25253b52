//! Generation with a KV cache against the training forward.

use octet_fp8::tolerance::sqnr_db;
use octet_nn::decode::{
    check_logits, check_sampling, sample, sample_shares, DecodeModel, WeightStorage,
};
use octet_nn::llama::{Llama, LlamaConfig, RopeScaling};
use octet_tensor::{DType, Tensor};
use std::collections::HashMap;

fn model(seed: u64) -> (LlamaConfig, Llama, HashMap<String, Tensor>) {
    model_of(LlamaConfig::preset("tiny").unwrap(), seed)
}

fn model_of(cfg: LlamaConfig, seed: u64) -> (LlamaConfig, Llama, HashMap<String, Tensor>) {
    let m = Llama::new_random(&cfg, DType::F32, None, seed).unwrap();
    let w = m
        .params()
        .into_iter()
        .map(|(n, t)| (n, t.clone()))
        .collect();
    (cfg, m, w)
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(&x, &y)| (x as f64 - y as f64).abs())
        .fold(0.0, f64::max)
}

fn rms(a: &[f32]) -> f64 {
    (a.iter().map(|&x| (x as f64).powi(2)).sum::<f64>() / a.len() as f64).sqrt()
}

/// The tiny model with Llama 3's RoPE scaling, its four frequencies (1, 0.1,
/// 0.01, 0.001) one in each band: kept, kept, blended, divided.
fn llama3_tiny() -> LlamaConfig {
    LlamaConfig {
        rope_scaling: Some(RopeScaling {
            rope_type: "llama3".into(),
            factor: Some(8.0),
            low_freq_factor: Some(1.0),
            high_freq_factor: Some(16.0),
            original_max_position_embeddings: Some(1024),
        }),
        ..LlamaConfig::preset("tiny").unwrap()
    }
}

#[test]
fn llama3_rope_scaling_stretches_the_long_wavelengths_as_hugging_face_does() {
    let cfg = llama3_tiny();
    cfg.validate().unwrap();
    let f = cfg.rope_inv_freq();
    // Wavelengths 2 pi / f: 6.3 and 63 are below 1024 / 16 = 64 (kept), 6283
    // is above 1024 / 1 (divided by 8), 628 is between: the blend with
    // s = (1024 / 628.3 - 1) / (16 - 1).
    let s = (1024.0 * 0.01 / (2.0 * std::f64::consts::PI) - 1.0) / 15.0;
    let want = [1.0, 0.1, 0.01 * ((1.0 - s) / 8.0 + s), 0.001 / 8.0];
    assert_eq!(f.len(), 4);
    for (i, (g, w)) in f.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= 1e-15 * w, "frequency {i}: {g} vs {w}");
    }
    // Linear scaling divides every frequency.
    let linear = LlamaConfig {
        rope_scaling: Some(RopeScaling {
            rope_type: "linear".into(),
            factor: Some(4.0),
            low_freq_factor: None,
            high_freq_factor: None,
            original_max_position_embeddings: None,
        }),
        ..LlamaConfig::preset("tiny").unwrap()
    };
    let plain = LlamaConfig::preset("tiny").unwrap().rope_inv_freq();
    for (g, p) in linear.rope_inv_freq().iter().zip(&plain) {
        assert_eq!(*g, p / 4.0);
    }
    // Kinds not implemented, and llama3 without its numbers, are refused.
    for bad in ["yarn", "dynamic", "longrope"] {
        let mut c = llama3_tiny();
        if let Some(rs) = c.rope_scaling.as_mut() {
            rs.rope_type = bad.into();
        }
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains(bad), "{e}");
    }
    let mut c = llama3_tiny();
    if let Some(rs) = c.rope_scaling.as_mut() {
        rs.low_freq_factor = Some(32.0);
    }
    assert!(c.validate().is_err());
}

#[test]
fn prefill_and_cached_steps_match_the_training_forward() {
    prefill_and_cached_steps_match(model(3));
    // The decoder's rotary angles follow the model's under RoPE scaling too.
    prefill_and_cached_steps_match(model_of(llama3_tiny(), 3));
}

fn prefill_and_cached_steps_match(
    (cfg, mut train, w): (LlamaConfig, Llama, HashMap<String, Tensor>),
) {
    let tokens: Vec<u32> = (0..23u32).map(|i| (i * 37 + 5) % 256).collect();
    let want = train.logits(&tokens, 1, tokens.len()).unwrap().to_f32_vec();
    // Prefill of the whole prompt.
    let mut dec = DecodeModel::new(&cfg, &w, WeightStorage::F32).unwrap();
    let got = dec.forward(&tokens).unwrap();
    // f32 everywhere, different summation orders: agreement to ~1e-6 of the logits' scale.
    let tol = 1e-4 * rms(&want);
    let d = max_abs_diff(&got, &want);
    assert!(d <= tol, "prefill: max diff {d:e} > {tol:e}");
    // One token at a time through the cache.
    dec.reset();
    let mut steps = Vec::new();
    for &t in &tokens {
        steps.extend(dec.forward(&[t]).unwrap());
    }
    assert_eq!(dec.cached(), tokens.len());
    let d = max_abs_diff(&steps, &want);
    assert!(d <= tol, "cached steps: max diff {d:e} > {tol:e}");
    // Prompt in two chunks.
    dec.reset();
    let mut chunks = dec.forward(&tokens[..9]).unwrap();
    chunks.extend(dec.forward(&tokens[9..]).unwrap());
    let d = max_abs_diff(&chunks, &want);
    assert!(d <= tol, "chunked prefill: max diff {d:e} > {tol:e}");
}

#[test]
fn fp8_and_bf16_weights_stay_close_to_f32() {
    let (cfg, _, w) = model(5);
    let tokens: Vec<u32> = (0..16u32).map(|i| (i * 91 + 7) % 256).collect();
    let mut f32m = DecodeModel::new(&cfg, &w, WeightStorage::F32).unwrap();
    let want = f32m.forward(&tokens).unwrap();
    // Logits minus their mean over the vocabulary (what softmax sees).
    let centred = |l: &[f32]| -> Vec<f32> {
        l.chunks(cfg.vocab_size)
            .flat_map(|r| {
                let mean = r.iter().sum::<f32>() / r.len() as f32;
                r.iter().map(move |&x| x - mean).collect::<Vec<_>>()
            })
            .collect()
    };
    let want_c = centred(&want);
    for (name, floor) in [
        ("bf16", 35.0),
        ("fp8", 20.0),
        ("fp8-block", 20.0),
        ("fp8-e5m2", 14.0),
    ] {
        let st = WeightStorage::from_name(name).unwrap();
        let mut m = DecodeModel::new(&cfg, &w, st).unwrap();
        let got = centred(&m.forward(&tokens).unwrap());
        let s = sqnr_db(
            &got.iter().map(|&x| x as f64).collect::<Vec<_>>(),
            &want_c.iter().map(|&x| x as f64).collect::<Vec<_>>(),
        );
        assert!(s >= floor, "{name}: logits SQNR {s:.1} dB < {floor}");
        assert!(
            s < 200.0,
            "{name}: identical to f32, the weights were not converted"
        );
    }
    let f = DecodeModel::new(&cfg, &w, WeightStorage::from_name("fp8").unwrap()).unwrap();
    let b = DecodeModel::new(&cfg, &w, WeightStorage::Bf16).unwrap();
    assert!(f.matrix_bytes() * 2 <= b.matrix_bytes() + 4 * 7 * 2 * 64 * 2);
}

#[test]
fn bad_input_is_an_error() {
    let (cfg, _, mut w) = model(1);
    let mut m = DecodeModel::new(&cfg, &w, WeightStorage::F32).unwrap();
    assert!(m.forward(&[]).is_err());
    assert!(m.forward(&[256]).is_err(), "token outside the vocabulary");
    let long = vec![1u32; cfg.max_position_embeddings + 1];
    assert!(m.forward(&long).is_err(), "past max_position_embeddings");
    assert!(WeightStorage::from_name("int4").is_err());
    w.remove("model.layers.1.mlp.up_proj.weight");
    let e = DecodeModel::new(&cfg, &w, WeightStorage::F32)
        .unwrap_err()
        .to_string();
    assert!(e.contains("model.layers.1.mlp.up_proj.weight"), "{e}");
}

#[test]
fn sampling_is_greedy_at_zero_temperature_and_respects_top_k() {
    let logits = [0.1f32, 2.0, -1.0, 1.9, 0.0];
    assert_eq!(sample(&logits, 0.0, 0, 0.99), 1);
    for u in [0.0, 0.3, 0.999] {
        assert_eq!(sample(&logits, 1.0, 1, u), 1, "top-1 is greedy");
        let t = sample(&logits, 1.0, 2, u);
        assert!(t == 1 || t == 3, "top-2 gave {t}");
    }
    // u below the first probability picks the best; near 1 picks the last kept.
    assert_eq!(sample(&logits, 1.0, 0, 0.0), 1);
    assert_eq!(sample(&logits, 1.0, 0, 0.999999), 2);
}

#[test]
fn sample_shares_are_the_running_softmax_of_the_kept_logits_in_order() {
    // Ties go to the lower id; -0 sorts below +0 (f32 total order).
    let logits = [1.0f32, 3.0, 3.0, -2.0, -0.0, 0.0];
    let (idx, shares) = sample_shares(&logits, 0.5, 3);
    assert_eq!(idx, vec![1, 2, 0, 5, 4, 3]);
    let shares = shares.expect("T > 0 samples");
    // exp((l - 3) / 0.5) of ids 1, 2, 0: 1, 1, e^-4.
    let total = 2.0 + (-4.0f64).exp();
    let want = [1.0 / total, 2.0 / total, 1.0];
    assert_eq!(shares.len(), 3);
    for (g, w) in shares.iter().zip(want) {
        assert!((g - w).abs() < 1e-15, "{shares:?} vs {want:?}");
    }
    // `sample` takes the first share above u.
    assert_eq!(sample(&logits, 0.5, 3, 0.0), 1);
    assert_eq!(sample(&logits, 0.5, 3, want[0] + 1e-9), 2);
    assert_eq!(sample(&logits, 0.5, 3, 0.999_999), 0);
    // Greedy: no shares.
    assert!(sample_shares(&logits, 0.0, 3).1.is_none());
    assert!(sample_shares(&[2.0], 1.0, 0).1.is_none());
}

#[test]
fn a_config_that_disagrees_with_the_weights_is_refused() {
    let (cfg, _, w) = model(2);
    assert_eq!(cfg.num_hidden_layers, 2);
    // One layer in the config, two in the weights: layer 1 is not dropped.
    let mut one = cfg.clone();
    one.num_hidden_layers = 1;
    let e = DecodeModel::new(&one, &w, WeightStorage::F32)
        .unwrap_err()
        .to_string();
    assert!(e.contains("9 unexpected tensors"), "{e}");
    for n in [
        "model.layers.1.input_layernorm.weight",
        "model.layers.1.self_attn.q_proj.weight",
        "model.layers.1.mlp.down_proj.weight",
    ] {
        assert!(e.contains(n), "{n} not named in: {e}");
    }
    // The training model refuses the same weights with the same error.
    let e2 = Llama::from_weights(&one, w.clone(), None)
        .unwrap_err()
        .to_string();
    assert_eq!(e, e2);
    // A single left-over tensor is named too.
    let mut extra = w.clone();
    extra.insert(
        "model.rotary.inv_freq".into(),
        w["model.norm.weight"].clone(),
    );
    let e = DecodeModel::new(&cfg, &extra, WeightStorage::F32)
        .unwrap_err()
        .to_string();
    assert!(e.contains("unexpected tensor model.rotary.inv_freq"), "{e}");
    // A tied config with its own (different) lm_head.weight: not the embedding's logits.
    let mut tied = cfg.clone();
    tied.tie_word_embeddings = true;
    let e = DecodeModel::new(&tied, &w, WeightStorage::F32)
        .unwrap_err()
        .to_string();
    assert!(e.contains("lm_head.weight differs"), "{e}");
    // ... but an lm_head.weight equal to the embedding is the tied head, written twice.
    let mut dup = w.clone();
    dup.insert(
        "lm_head.weight".into(),
        w["model.embed_tokens.weight"].clone(),
    );
    assert!(DecodeModel::new(&tied, &dup, WeightStorage::F32).is_ok());
    dup.remove("lm_head.weight");
    assert!(DecodeModel::new(&tied, &dup, WeightStorage::F32).is_ok());
}

#[test]
fn non_finite_sampling_parameters_and_logits_are_errors() {
    for t in [0.0, 0.8, 2.0] {
        assert!(check_sampling(t).is_ok(), "{t}");
    }
    // A negative temperature is refused, not read as greedy.
    for t in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -1.0, -1e-30] {
        let e = check_sampling(t).unwrap_err().to_string();
        assert!(e.contains("temperature"), "{e}");
        // A finite negative one is out of range, not "non-finite".
        assert_eq!(e.starts_with("non-finite"), !t.is_finite(), "{e}");
    }
    assert!(check_logits(&[0.5, -3.0, 1e30], 0).is_ok());
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let e = check_logits(&[0.5, bad, 1.0], 7).unwrap_err().to_string();
        assert!(e.contains("non-finite logits at step 7"), "{e}");
    }
    // A NaN weight makes every logit NaN; the check catches it on the row
    // the sampler reads.
    let (cfg, _, mut w) = model(4);
    let n = &w["model.norm.weight"];
    let mut g = n.to_f32_vec();
    g[3] = f32::NAN;
    w.insert(
        "model.norm.weight".into(),
        Tensor::from_f32(n.shape(), g).unwrap(),
    );
    let mut m = DecodeModel::new(&cfg, &w, WeightStorage::F32).unwrap();
    let logits = m.forward(&[1, 2, 3]).unwrap();
    let last = &logits[logits.len() - cfg.vocab_size..];
    let e = check_logits(last, 0).unwrap_err().to_string();
    assert!(e.contains("non-finite logits at step 0"), "{e}");
}

/// `cfg` is a public field, the weights and the cache are not: a decoder
/// whose `cfg` was changed after `new` refuses to decode (it indexed the
/// embedding past its end, a panic, or attended with the wrong heads).
#[test]
fn a_decoder_whose_cfg_was_changed_refuses_to_decode() {
    let (cfg, _, w) = model(5);
    let mut m = DecodeModel::new(&cfg, &w, WeightStorage::F32).unwrap();
    m.cfg.vocab_size += 256;
    let e = m.forward(&[300]).unwrap_err().to_string();
    assert!(e.contains("cfg was changed"), "{e}");
    m.cfg.vocab_size -= 256;
    m.cfg.num_key_value_heads = m.cfg.num_attention_heads;
    assert!(m.forward(&[1]).is_err(), "other heads than the weights'");
    m.cfg = cfg.clone();
    assert_eq!(m.forward(&[1, 2]).unwrap().len(), 2 * cfg.vocab_size);
}

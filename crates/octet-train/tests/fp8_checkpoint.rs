//! FP8 weights in checkpoints: written and read back with their codes and
//! factors unchanged, bad FP8 tensors refused with the tensor's name, and a
//! LoRA base built from an FP8 checkpoint keeping the stored codes.

use octet_fp8::Format;
use octet_nn::llama::{Llama, LlamaConfig, LoraSpec};
use octet_nn::lora::{BaseFormat, Compute};
use octet_tensor::mixed::{Fp8Weight, WeightScaling};
use octet_tensor::DType;
use octet_train::checkpoint;
use std::collections::HashMap;

/// Widths that make partial 128x128 blocks (160 = 128 + 32, 272 = 2 * 128 + 16).
fn cfg() -> LlamaConfig {
    LlamaConfig {
        vocab_size: 11,
        hidden_size: 160,
        intermediate_size: 272,
        num_hidden_layers: 2,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        max_position_embeddings: 16,
        rms_norm_eps: 1e-5,
        rope_theta: 10000.0,
        tie_word_embeddings: false,
        rope_scaling: None,
        head_dim: None,
        qkv_bias: false,
        o_bias: false,
        qk_norm: false,
    }
}

fn tmpdir(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("octet-fp8ck-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// The block matrices of `model` quantized to `format` with `scaling`.
fn quantized(model: &Llama, format: Format, scaling: WeightScaling) -> HashMap<String, Fp8Weight> {
    model
        .params()
        .into_iter()
        .filter(|(n, _)| n.ends_with("_proj.weight"))
        .map(|(n, t)| {
            let (r, c) = t.dims2().unwrap();
            let q = Fp8Weight::quantize(&t.to_f32_vec(), r, c, format, scaling).unwrap();
            (n, q)
        })
        .collect()
}

#[test]
fn fp8_checkpoints_keep_codes_and_factors() {
    let model = Llama::new_random(&cfg(), DType::F32, None, 3).unwrap();
    for (format, scaling) in [
        (Format::E4M3, WeightScaling::Tensor),
        (Format::E4M3, WeightScaling::Channel),
        (Format::E4M3, WeightScaling::Block128),
        (Format::E5M2, WeightScaling::Channel),
    ] {
        let fp8 = quantized(&model, format, scaling);
        assert_eq!(fp8.len(), 14);
        let dir = tmpdir(&format!("{}-{scaling:?}", format.name()));
        checkpoint::save_model_fp8(&dir, &model, &fp8, scaling).unwrap();
        let (dense, back) = checkpoint::load_weights_fp8(&dir, DType::F32).unwrap();
        assert_eq!(back.len(), fp8.len());
        for (name, q) in &fp8 {
            let b = &back[name];
            assert!(
                b.codes() == q.codes()
                    && b.factors() == q.factors()
                    && (b.format(), b.scaling()) == (q.format(), q.scaling()),
                "{name}: {} {scaling:?} did not come back as written",
                format.name()
            );
        }
        // Every tensor is there densely too: FP8 ones dequantized exactly,
        // the others as the bf16 they were written in.
        assert_eq!(dense.len(), model.params().len());
        for (name, t) in model.params() {
            let got = dense[&name].to_f32_vec();
            match fp8.get(&name) {
                Some(q) => assert_eq!(got, q.dequantize(), "{name}"),
                None => assert_eq!(got, t.to_dtype(DType::Bf16).to_f32_vec(), "{name}"),
            }
        }
        // The GPU LoRA base reader makes no dense copy of the FP8 matrices.
        let (base, kept) = checkpoint::load_base_fp8(&dir, DType::F32).unwrap();
        assert_eq!(kept.len(), fp8.len());
        assert_eq!(base.len(), dense.len() - fp8.len());
        assert!(base
            .keys()
            .all(|n| !fp8.contains_key(n) && dense.contains_key(n)));
        // The plain loader gives the same dense weights, and the model loads.
        let plain = checkpoint::load_weights(&dir, DType::F32).unwrap();
        assert_eq!(plain.len(), dense.len());
        Llama::from_weights(&checkpoint::load_config(&dir).unwrap(), plain, None).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn bad_fp8_tensors_are_named() {
    use safetensors::tensor::{Dtype, TensorView};
    let dir = tmpdir("bad");
    std::fs::create_dir_all(&dir).unwrap();
    let codes: Vec<u8> = (0..32u8).collect();
    let write = |extra: Option<(&str, Vec<usize>, Vec<f32>)>| {
        let mut owned = vec![(
            "w.weight".to_string(),
            Dtype::F8_E4M3,
            vec![4usize, 8],
            codes.clone(),
        )];
        if let Some((name, shape, v)) = extra {
            let b = v.iter().flat_map(|f| f.to_le_bytes()).collect();
            owned.push((name.to_string(), Dtype::F32, shape, b));
        }
        let views: Vec<(String, TensorView<'_>)> = owned
            .iter()
            .map(|(n, d, s, b)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap()))
            .collect();
        let bytes = safetensors::serialize(views, None).unwrap();
        std::fs::write(dir.join("model.safetensors"), bytes).unwrap();
        checkpoint::load_weights_fp8(&dir, DType::F32)
    };
    let err = write(None).unwrap_err().to_string();
    assert!(err.contains("w.weight has no factors"), "{err}");
    let err = write(Some(("w.weight_scale", vec![3], vec![1.0; 3])))
        .unwrap_err()
        .to_string();
    assert!(err.contains("w.weight_scale has shape [3]"), "{err}");
    let err = write(Some(("w.weight_scale", vec![1], vec![f32::NAN])))
        .unwrap_err()
        .to_string();
    assert!(err.contains("non-finite"), "{err}");
    // Zero and negative factors are no scales: refused, not loaded.
    for bad in [0.0, -2.0] {
        let err = write(Some(("w.weight_scale", vec![4], vec![1.0, 1.0, bad, 1.0])))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("tensor w.weight") && err.contains("factor 2 is"),
            "{err}"
        );
    }
    // E4M3's NaN code (0x7F) in the matrix.
    let mut nan = codes.clone();
    nan[9] = 0x7f;
    let owned = [
        ("w.weight", Dtype::F8_E4M3, vec![4usize, 8], nan),
        (
            "w.weight_scale_inv",
            Dtype::F32,
            vec![1, 1],
            1f32.to_le_bytes().to_vec(),
        ),
    ];
    let views: Vec<(String, TensorView<'_>)> = owned
        .iter()
        .map(|(n, d, s, b)| (n.to_string(), TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    std::fs::write(
        dir.join("model.safetensors"),
        safetensors::serialize(views, None).unwrap(),
    )
    .unwrap();
    let err = checkpoint::load_weights_fp8(&dir, DType::F32)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("tensor w.weight") && err.contains("NaN"),
        "{err}"
    );
    // A scale that fits: per channel as (4, 1), read back exactly.
    let (dense, fp8) = write(Some((
        "w.weight_scale",
        vec![4, 1],
        vec![0.5, 1.0, 2.0, 4.0],
    )))
    .unwrap();
    assert_eq!(fp8["w.weight"].scaling(), WeightScaling::Channel);
    let table = Format::E4M3.table();
    let want: Vec<f32> = (0..32)
        .map(|i| table[i] * [0.5, 1.0, 2.0, 4.0][i / 8])
        .collect();
    assert_eq!(dense["w.weight"].to_f32_vec(), want);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn lora_on_an_fp8_checkpoint_keeps_its_codes() {
    let model = Llama::new_random(&cfg(), DType::F32, None, 4).unwrap();
    // Per-channel codes: a per-tensor quantization of their values would
    // make other codes, so keeping them is observable.
    let fp8 = quantized(&model, Format::E4M3, WeightScaling::Channel);
    let dir = tmpdir("lora");
    checkpoint::save_model_fp8(&dir, &model, &fp8, WeightScaling::Channel).unwrap();
    let spec = LoraSpec {
        rank: 4,
        alpha: 8.0,
        targets: vec!["q".into(), "v".into(), "down".into()],
        base: BaseFormat::Fp8(WeightScaling::Tensor),
        compute: Compute::Bf16,
        recipe: octet_fp8::Recipe::from_name("tensorwise")
            .unwrap()
            .with_backward(octet_fp8::BackwardMode::Dequantized)
            .unwrap(),
        seed: 1,
        dropout: 0.0,
    };
    let (w, mut stored) = checkpoint::load_weights_fp8(&dir, DType::F32).unwrap();
    let mcfg = checkpoint::load_config(&dir).unwrap();
    let kept = Llama::from_weights(&mcfg, w.clone(), None)
        .unwrap()
        .into_lora_with(&spec, &mut stored)
        .unwrap();
    assert!(stored.is_empty(), "every stored matrix became a base");
    let requantized = Llama::from_weights(&mcfg, w, None)
        .unwrap()
        .into_lora(&spec)
        .unwrap();
    // B starts at zero, so the merged weights are the bases' values.
    let kept_w: HashMap<_, _> = kept.merged_weights().unwrap().into_iter().collect();
    let req_w: HashMap<_, _> = requantized.merged_weights().unwrap().into_iter().collect();
    let mut differ = 0;
    for (name, q) in &fp8 {
        assert_eq!(kept_w[name].to_f32_vec(), q.dequantize(), "{name}");
        differ += usize::from(req_w[name].to_f32_vec() != q.dequantize());
    }
    assert!(differ > 0, "a per-tensor re-quantization changed no matrix");
    assert_eq!(
        kept.matrix_bytes(),
        fp8.values().map(|q| q.bytes()).sum::<usize>()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The streaming writer's files get the permissions of a file created in the
/// same place (the umask's), not the owner-only mode of the safetensors
/// crate's own temp file; no temp file is left beside them.
#[cfg(unix)]
#[test]
fn checkpoint_files_get_ordinary_permissions() {
    use std::os::unix::fs::PermissionsExt;
    let model = Llama::new_random(&cfg(), DType::F32, None, 5).unwrap();
    let dir = tmpdir("perms");
    checkpoint::save_model(&dir, &model).unwrap();
    let probe = dir.join("probe");
    let want = std::fs::File::create(&probe)
        .unwrap()
        .metadata()
        .unwrap()
        .permissions()
        .mode();
    std::fs::remove_file(&probe).unwrap();
    let got = std::fs::metadata(dir.join("model.safetensors"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(got & 0o777, want & 0o777);
    let names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        names.iter().all(|n| !n.starts_with('.')),
        "temp files left: {names:?}"
    );
    let back = checkpoint::load_weights(&dir, DType::F32).unwrap();
    assert_eq!(back.len(), model.params().len());
    let _ = std::fs::remove_dir_all(&dir);
}

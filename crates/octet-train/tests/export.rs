//! `octet export`: FP8 model folders in the compressed-tensors and
//! fine-grained FP8 layouts load back into octet as the FP8 model they
//! describe, and their `config.json` names the layout.

use octet_nn::hf_config::{self, Fp8Layout};
use octet_nn::llama::{Llama, LlamaConfig};
use octet_tensor::mixed::Fp8Weight;
use octet_tensor::{DType, Tensor};
use octet_train::{checkpoint, export};
use std::collections::HashMap;
use std::path::PathBuf;

fn tmpdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("octet-export-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The JSON header of a safetensors file: tensor name -> dtype, shape, offsets.
fn safetensors_header(path: &std::path::Path) -> serde_json::Value {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    serde_json::from_slice(&bytes[8..8 + n]).unwrap()
}

/// A random tiny model (Qwen2-style q/k/v biases, so that biases travel too)
/// saved in f32 under `dir/src`.
fn source(dir: &std::path::Path, seed: u64) -> (LlamaConfig, Llama) {
    let mut cfg = LlamaConfig::preset("tiny").unwrap();
    cfg.qkv_bias = true;
    let model = Llama::new_random(&cfg, DType::F32, None, seed).unwrap();
    let src = dir.join("src");
    std::fs::create_dir_all(&src).unwrap();
    checkpoint::save_model(&src, &model).unwrap();
    (cfg, model)
}

/// The model an export describes: the block matrices as their E4M3 codes
/// times factors under `layout`, every other tensor rounded to bf16.
fn expected(model: &Llama, layout: Fp8Layout) -> HashMap<String, Tensor> {
    let scaling = export::layout_scaling(layout);
    model
        .params()
        .into_iter()
        .map(|(name, t)| {
            let block = name.starts_with("model.layers.") && name.ends_with("_proj.weight");
            let t = if block {
                let (n, k) = t.dims2().unwrap();
                let q =
                    Fp8Weight::quantize(&t.to_f32_vec(), n, k, octet_fp8::Format::E4M3, scaling)
                        .unwrap();
                Tensor::from_f32(&[n, k], q.dequantize()).unwrap()
            } else {
                t.to_dtype(DType::Bf16).to_dtype(DType::F32)
            };
            (name, t)
        })
        .collect()
}

#[test]
fn every_layout_loads_back_as_the_fp8_model_it_describes() {
    let dir = tmpdir("layouts");
    let (cfg, model) = source(&dir, 7);
    let tokens: Vec<u32> = (0..24).map(|i| (i * 37 + 5) % 256).collect();
    for (name, layout, scale_name) in [
        (
            "compressed-tensors",
            Fp8Layout::CompressedTensors { per_channel: true },
            "weight_scale",
        ),
        (
            "compressed-tensors-tensor",
            Fp8Layout::CompressedTensors { per_channel: false },
            "weight_scale",
        ),
        ("fp8-block", Fp8Layout::FineGrained, "weight_scale_inv"),
    ] {
        assert_eq!(export::layout_from_name(name).unwrap(), layout);
        let out = dir.join(name);
        let n = export::export(&dir.join("src"), &out, layout).unwrap();
        assert_eq!(n, 7 * cfg.num_hidden_layers, "{name}");
        // config.json names the layout, and octet's reader takes it.
        let text = std::fs::read_to_string(out.join("config.json")).unwrap();
        let hf = hf_config::parse(&text).unwrap();
        assert_eq!(hf.quantization, Some(layout), "{name}");
        assert_eq!(hf.config.qkv_bias, cfg.qkv_bias);
        // The factors are stored under the layout's names.
        let header = safetensors_header(&out.join("model.safetensors"));
        let q = &header["model.layers.0.self_attn.q_proj.weight"];
        assert_eq!(q["dtype"], "F8_E4M3", "{name}");
        let scale = &header[format!("model.layers.0.self_attn.q_proj.{scale_name}").as_str()];
        assert_eq!(scale["dtype"], "F32", "{name}: {scale_name}");
        assert_eq!(
            header["model.embed_tokens.weight"]["dtype"], "BF16",
            "{name}"
        );
        // Loaded back, its logits are the described model's, bit for bit.
        let (lcfg, w) = checkpoint::load_model_folder(&out, DType::F32).unwrap();
        let mut back = Llama::from_weights(&lcfg, w, None).unwrap();
        let mut want = Llama::from_weights(&cfg, expected(&model, layout), None).unwrap();
        let got = back.logits(&tokens, 1, tokens.len()).unwrap().to_f32_vec();
        let exp = want.logits(&tokens, 1, tokens.len()).unwrap().to_f32_vec();
        let worst = got
            .iter()
            .zip(&exp)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert_eq!(worst, 0.0, "{name}: logits differ by up to {worst}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn an_export_never_writes_over_a_folder_and_names_a_bad_layout() {
    let dir = tmpdir("refuse");
    source(&dir, 3);
    let out = dir.join("taken");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("keep.txt"), "mine").unwrap();
    let e = export::export(&dir.join("src"), &out, Fp8Layout::FineGrained).unwrap_err();
    assert!(e.to_string().contains("taken"), "{e}");
    assert_eq!(
        std::fs::read_to_string(out.join("keep.txt")).unwrap(),
        "mine"
    );
    let e = export::layout_from_name("gguf").unwrap_err();
    assert!(e.to_string().contains("--format gguf"), "{e}");
    // A source that cannot be read leaves no output folder behind.
    let missing = dir.join("nothing-here");
    assert!(export::export(&missing, &dir.join("new"), Fp8Layout::FineGrained).is_err());
    assert!(!dir.join("new").exists());
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn quantization_configs_octet_does_not_read_are_refused_by_name() {
    let base = r#"{"architectures": ["LlamaForCausalLM"], "hidden_size": 32, "intermediate_size": 64,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": 64, "vocab_size": 256, "rope_theta": 10000.0,
        "quantization_config": QC}"#;
    for (qc, needle) in [
        (
            r#"{"quant_method": "awq", "bits": 4}"#,
            "quant_method 'awq'",
        ),
        (
            r#"{"quant_method": "fp8", "weight_block_size": [64, 64]}"#,
            "weight_block_size [64,64]",
        ),
        (
            r#"{"quant_method": "fp8", "weight_block_size": [128, 128], "activation_scheme": "static"}"#,
            "activation_scheme 'static'",
        ),
        (
            r#"{"quant_method": "compressed-tensors", "format": "pack-quantized"}"#,
            "format 'pack-quantized'",
        ),
        (
            r#"{"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {"g": {"weights": {"num_bits": 4, "type": "int", "strategy": "group"}}}}"#,
            "g.weights",
        ),
        (
            r#"{"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {"g": {"weights": {"num_bits": 8, "type": "float", "strategy": "channel"}, "input_activations": {"num_bits": 8, "type": "float", "dynamic": false}}}}"#,
            "static activation scales",
        ),
    ] {
        let e = hf_config::parse(&base.replace("QC", qc)).unwrap_err();
        let e = e.to_string();
        assert!(
            e.contains("quantization_config") && e.contains(needle),
            "{qc}: {e}"
        );
    }
}

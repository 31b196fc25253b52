//! FP8 checkpoints in the layouts serving engines load (`octet export`).
//!
//! The block matrices (q, k, v, o, gate, up, down) are quantized to E4M3
//! with the layout's factors; the embedding, norms, biases and LM head stay
//! in bf16. `config.json` gains the `quantization_config` that names the
//! layout ([`Fp8Layout::to_json`]):
//!
//! | layout | factors | `quantization_config` |
//! |---|---|---|
//! | compressed-tensors, per channel | `X.weight_scale` f32 `(N, 1)` | `quant_method: compressed-tensors`, `format: float-quantized`, weights `strategy: channel` |
//! | compressed-tensors, per tensor | `X.weight_scale` f32 `(1)` | the same with `strategy: tensor` |
//! | fine-grained FP8 | `X.weight_scale_inv` f32 `(ceil(N/128), ceil(K/128))` | `quant_method: fp8`, `weight_block_size: [128, 128]` |
//!
//! In all three a weight is code x factor, which is how octet reads FP8
//! checkpoints back ([`crate::checkpoint::load_weights`]), so an export
//! loads into octet as the FP8 model it describes. Activations are quantized
//! dynamically by the engine (no `input_scale`).

use crate::checkpoint;
use crate::{Error, Result};
use octet_fp8::Format;
use octet_nn::hf_config::Fp8Layout;
use octet_nn::llama::Llama;
use octet_tensor::mixed::{Fp8Weight, WeightScaling};
use octet_tensor::DType;
use std::collections::HashMap;
use std::path::Path;

/// The weight scaling a layout stores.
pub fn layout_scaling(layout: Fp8Layout) -> WeightScaling {
    match layout {
        Fp8Layout::CompressedTensors { per_channel: true } => WeightScaling::Channel,
        Fp8Layout::CompressedTensors { per_channel: false } => WeightScaling::Tensor,
        Fp8Layout::FineGrained => WeightScaling::Block128,
    }
}

/// The layout named on the command line: `compressed-tensors` (per output
/// channel), `compressed-tensors-tensor` (one factor a matrix) or
/// `fp8-block` (Hugging Face's fine-grained FP8, 128x128 blocks).
pub fn layout_from_name(name: &str) -> Result<Fp8Layout> {
    match name {
        "compressed-tensors" => Ok(Fp8Layout::CompressedTensors { per_channel: true }),
        "compressed-tensors-tensor" => Ok(Fp8Layout::CompressedTensors { per_channel: false }),
        "fp8-block" => Ok(Fp8Layout::FineGrained),
        other => Err(Error::Checkpoint(format!(
            "--format {other}: expected compressed-tensors, compressed-tensors-tensor or fp8-block"
        ))),
    }
}

/// The model's block matrices (`model.layers.*_proj.weight`) quantized to
/// E4M3 with `scaling`, by name.
pub fn quantize_block_matrices(
    model: &Llama,
    scaling: WeightScaling,
) -> Result<HashMap<String, Fp8Weight>> {
    let mut out = HashMap::new();
    for (name, t) in model.params() {
        if !name.starts_with("model.layers.") || !name.ends_with("_proj.weight") {
            continue;
        }
        let (n, k) = t.dims2()?;
        let q = Fp8Weight::quantize(&t.to_f32_vec(), n, k, Format::E4M3, scaling)
            .map_err(|e| Error::Checkpoint(format!("quantizing {name}: {e}")))?;
        out.insert(name, q);
    }
    Ok(out)
}

/// Write the checkpoint or model folder `src` to `out` in `layout`:
/// `model.safetensors`, `config.json` with its `quantization_config`, and
/// the tokenizer files of `src` (its own, else those of the tokenizer its
/// run recorded: [`checkpoint::tokenizer_source`]), unchanged. `out` must not exist yet (or be an empty
/// directory); the export is written beside it and renamed into place, so
/// a failure leaves no half-written folder. Returns the matrices quantized.
pub fn export(src: &Path, out: &Path, layout: Fp8Layout) -> Result<usize> {
    // Refused before the model is read: a folder that holds files is never written into.
    if std::fs::read_dir(out).is_ok_and(|mut d| d.next().is_some()) {
        return Err(Error::Checkpoint(format!(
            "{} already holds files: give a new --out",
            out.display()
        )));
    }
    let (cfg, weights) = checkpoint::load_model_folder(src, DType::F32)?;
    let model = Llama::from_weights(&cfg, weights, None)?;
    let scaling = layout_scaling(layout);
    let fp8 = quantize_block_matrices(&model, scaling)?;
    let tokenizer = checkpoint::tokenizer_source(src)?;
    checkpoint::write_new_dir(out, |tmp| {
        checkpoint::save_model_fp8(tmp, &model, &fp8, scaling)?;
        add_quantization_config(&tmp.join("config.json"), layout)?;
        checkpoint::copy_run_tokenizer(tokenizer.as_deref(), tmp)
    })?;
    Ok(fp8.len())
}

/// Add `layout`'s `quantization_config` to the `config.json` at `path`.
fn add_quantization_config(path: &Path, layout: Fp8Layout) -> Result<()> {
    let bad = |e: String| Error::Checkpoint(format!("{}: {e}", path.display()));
    let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
    let mut v: serde_json::Value = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
    let obj = v
        .as_object_mut()
        .ok_or_else(|| bad("not a JSON object".into()))?;
    obj.insert("quantization_config".into(), layout.to_json());
    let text = serde_json::to_string_pretty(&v).map_err(|e| bad(e.to_string()))?;
    checkpoint::write_atomic(path, text.as_bytes())
}

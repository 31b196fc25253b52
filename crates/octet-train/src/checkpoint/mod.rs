//! Checkpoints: safetensors with Hugging Face Llama names plus `config.json`,
//! and the optimizer state in a second file. Every file is written atomically
//! (temp file, fsync, rename), and a checkpoint directory appears only whole
//! (written under a temporary name, then renamed).
//!
//! Layout of `dir/`:
//! - `model.safetensors`: the weights (`model.embed_tokens.weight`, ...), or
//!   past 5 GB shards `model-0000i-of-0000n.safetensors` with their index
//!   `model.safetensors.index.json`, as transformers writes them ([`shards`])
//! - `config.json`: `LlamaConfig` in Hugging Face's form
//! - `optimizer.safetensors`: per parameter `<name>.master`, `<name>.exp_avg`,
//!   `<name>.exp_avg_sq` (f32), metadata `step` and `trainer` (JSON)
//! - for a run on a Hugging Face tokenizer, its files (`tokenizer.json`,
//!   `tokenizer_config.json`, ... [`TOKENIZER_FILES`]) copied unchanged, so
//!   that the folder loads with transformers' `AutoTokenizer` and
//!   `octet generate` finds the tokenizer in it
//!
//! FP8 weights in `model.safetensors` (read by [`load_weights_fp8`] and
//! [`load_weights`], written by [`save_model_fp8`]): a matrix `X.weight` of
//! dtype `F8_E4M3` or `F8_E5M2`, shape `(N, K)`, with its f32 dequantization
//! factors in `X.weight_scale` (the compressed-tensors convention) or
//! `X.weight_scale_inv` (DeepSeek-V3's), `value = code * factor` in both. The
//! factors' shape says their granularity: one value (per tensor), `(N)` or
//! `(N, 1)` (per output channel), `(ceil(N/128), ceil(K/128))` (128x128 blocks).

use crate::optim::{AdamW, AdamWConfig, ParamState};
use crate::{Error, Result};
use half::{bf16, f16};
use octet_fp8::{DelayedState, Role};
use octet_fp8::{Format, QuantData, Scales};
use octet_nn::llama::{Llama, LlamaConfig};
use octet_tensor::mixed::{Fp8Weight, WeightScaling};
use octet_tensor::{DType, Tensor};
use safetensors::tensor::Dtype;
use safetensors::{SafeTensors, View};
use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

mod adapter;
mod dirs;
mod optimizer;
pub mod shards;
mod tokenizer;

pub use adapter::*;
pub use dirs::*;
pub use optimizer::*;
pub use shards::{has_weights, MAX_SHARD_BYTES};
pub use tokenizer::*;

/// A tensor for [`write_tensors`]: its little-endian bytes are made when the
/// writer reaches it, so that one tensor's bytes are in memory at a time,
/// not the whole file's.
enum Lazy<'a> {
    /// A tensor, in its own dtype.
    Tensor(&'a Tensor),
    /// f32 values with a shape (optimizer state, without a tensor copy).
    F32(&'a [f32], &'a [usize]),
    /// Bytes as they are stored (FP8 codes, f32 factors).
    Raw(Dtype, Vec<usize>, std::borrow::Cow<'a, [u8]>),
}

impl safetensors::View for Lazy<'_> {
    fn dtype(&self) -> Dtype {
        match self {
            Lazy::Tensor(t) => st_dtype(t.dtype()),
            Lazy::F32(..) => Dtype::F32,
            Lazy::Raw(d, ..) => *d,
        }
    }

    fn shape(&self) -> &[usize] {
        match self {
            Lazy::Tensor(t) => t.shape(),
            Lazy::F32(_, shape) => shape,
            Lazy::Raw(_, shape, _) => shape,
        }
    }

    fn data(&self) -> std::borrow::Cow<'_, [u8]> {
        match self {
            Lazy::Tensor(t) => to_bytes(t).1.into(),
            Lazy::F32(v, _) => v
                .iter()
                .flat_map(|x| x.to_le_bytes())
                .collect::<Vec<u8>>()
                .into(),
            Lazy::Raw(_, _, b) => std::borrow::Cow::Borrowed(b),
        }
    }

    fn data_len(&self) -> usize {
        match self {
            Lazy::Tensor(t) => t.bytes(),
            Lazy::F32(v, _) => 4 * v.len(),
            Lazy::Raw(_, _, b) => b.len(),
        }
    }
}

/// Write `tensors` (and string metadata) as a safetensors file at `path`,
/// atomically, streaming: each tensor's bytes are made as the writer reaches
/// it. (A checkpoint used to be built whole in memory first: for the ~1B
/// model's optimizer state, three f32 copies of it besides the state itself.)
fn write_tensors(
    path: &Path,
    tensors: Vec<(String, Lazy<'_>)>,
    meta: Option<HashMap<String, String>>,
) -> Result<()> {
    for (name, t) in &tensors {
        let want = octet_tensor::checked_numel(t.shape()).ok();
        let bits = want.and_then(|n| n.checked_mul(t.dtype().bitsize()));
        if bits.map(|b| b.div_ceil(8)) != Some(t.data_len()) {
            return Err(Error::Checkpoint(format!(
                "tensor {name}: {} bytes for shape {:?}",
                t.data_len(),
                t.shape()
            )));
        }
    }
    atomic(path, |tmp| {
        // `serialize_to_file` writes through a file of its own that is
        // readable by its owner only; the checkpoint gets the permissions a
        // file created here gets (the umask's, as `write_atomic`'s files).
        let perms = std::fs::File::create(tmp)?.metadata()?.permissions();
        safetensors::serialize_to_file(tensors, meta, tmp).map_err(std::io::Error::other)?;
        std::fs::set_permissions(tmp, perms)
    })
}

/// The safetensors dtype of a tensor dtype.
fn st_dtype(d: DType) -> Dtype {
    match d {
        DType::F32 => Dtype::F32,
        DType::F64 => Dtype::F64,
        DType::Bf16 => Dtype::BF16,
    }
}

fn to_bytes(t: &Tensor) -> (Dtype, Vec<u8>) {
    let bytes = match t.dtype() {
        DType::F32 => t
            .to_f32_vec()
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect(),
        DType::F64 => t
            .to_f64_vec()
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect(),
        DType::Bf16 => t
            .as_bf16()
            .unwrap_or_default()
            .iter()
            .flat_map(|v| v.to_bits().to_le_bytes())
            .collect(),
    };
    (st_dtype(t.dtype()), bytes)
}

/// Read every tensor of a safetensors file into f32/bf16/f64 tensors (f16 widens to f32).
pub fn read_tensors(path: &Path) -> Result<(HashMap<String, Tensor>, HashMap<String, String>)> {
    let (out, fp8, meta) = read_tensors_fp8(path)?;
    if let Some(name) = fp8.keys().next() {
        return Err(Error::Checkpoint(format!(
            "{}: tensor {name} is FP8; this file takes F32, BF16, F16 or F64 tensors",
            path.display()
        )));
    }
    Ok((out, meta))
}

/// FP8 tensors as a file stores them: element format, shape, codes.
type RawFp8 = HashMap<String, (Format, Vec<usize>, Vec<u8>)>;

/// A file's floating-point tensors, FP8 ones and string metadata.
type FileTensors = (HashMap<String, Tensor>, RawFp8, HashMap<String, String>);

/// Every tensor of a safetensors file: the floating-point ones as tensors,
/// the FP8 ones (`F8_E4M3`, `F8_E5M2`) as raw codes, and the metadata.
///
/// The file is mapped, not read into memory: its pages are the page cache's,
/// so loading holds the converted tensors and not a second copy of the file.
fn read_tensors_fp8(path: &Path) -> Result<FileTensors> {
    let bad = |e: String| Error::Checkpoint(format!("{}: {e}", path.display()));
    let file = std::fs::File::open(path).map_err(|e| bad(e.to_string()))?;
    let meta = file.metadata().map_err(|e| bad(e.to_string()))?;
    if meta.is_dir() {
        // Mapping a directory fails with "No such device", which names nothing.
        return Err(not_a_file(path));
    }
    let len = meta.len();
    tracing::debug!(path = %path.display(), bytes = len, "reading tensors");
    if len < 8 {
        return Err(bad(format!(
            "not a valid safetensors file ({len} bytes, less than its 8-byte header length)"
        )));
    }
    // SAFETY: the map is read-only and dropped before this returns; octet
    // replaces checkpoint files by rename (never in place), so a file being
    // mapped is not written to by octet. (Another program truncating it
    // while it is read is outside what a checkpoint reader can guard.)
    let bytes = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| bad(e.to_string()))?;
    let st = SafeTensors::deserialize(&bytes).map_err(|e| {
        // The crate's errors for a tensor whose dtype and shape disagree
        // with its bytes, or whose bytes lie past the file's, name no tensor.
        bad(header_problem(&bytes).unwrap_or_else(|| format!("not a valid safetensors file ({e})")))
    })?;
    let (_, header) = SafeTensors::read_metadata(&bytes).map_err(|e| bad(e.to_string()))?;
    let meta = header.metadata().clone().unwrap_or_default();
    let mut out = HashMap::new();
    let mut fp8 = HashMap::new();
    for (name, view) in st.tensors() {
        let format = match view.dtype() {
            Dtype::F8_E4M3 => Some(Format::E4M3),
            Dtype::F8_E5M2 => Some(Format::E5M2),
            _ => None,
        };
        if let Some(f) = format {
            fp8.insert(name, (f, view.shape().to_vec(), view.data().to_vec()));
            continue;
        }
        let shape = view.shape().to_vec();
        let d = view.data();
        let t = match view.dtype() {
            Dtype::F32 => Tensor::from_f32(
                &shape,
                d.chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect(),
            ),
            Dtype::F64 => Tensor::from_f64(
                &shape,
                d.chunks_exact(8)
                    .map(|c| f64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
                    .collect(),
            ),
            Dtype::BF16 => Tensor::from_bf16(
                &shape,
                d.chunks_exact(2)
                    .map(|c| bf16::from_bits(u16::from_le_bytes([c[0], c[1]])))
                    .collect(),
            ),
            Dtype::F16 => Tensor::from_f32(
                &shape,
                d.chunks_exact(2)
                    .map(|c| f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32())
                    .collect(),
            ),
            other => {
                return Err(bad(format!(
                    "tensor {name} has dtype {other:?}; expected F32, BF16, F16, F64, F8_E4M3 or F8_E5M2"
                )))
            }
        }
        .map_err(|e| bad(format!("tensor {name}: {e}")))?;
        out.insert(name, t);
    }
    Ok((out, fp8, meta))
}

/// The error for a safetensors path that is a directory.
fn not_a_file(path: &Path) -> Error {
    Error::Checkpoint(format!(
        "{} is a directory, not a safetensors file",
        path.display()
    ))
}

/// What is wrong with the first tensor (by its data offsets) of the
/// safetensors file `bytes` whose entry the file's data cannot hold: data
/// offsets reversed or past the end of the data, or a byte count other than
/// its dtype and shape take (bf16 over f32-sized data). `None` where the
/// header does not parse that far or every entry fits (the file has another
/// problem, which the safetensors crate's error describes).
fn header_problem(bytes: &[u8]) -> Option<String> {
    let n = usize::try_from(u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?)).ok()?;
    let end = n.checked_add(8)?;
    let header: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(bytes.get(8..end)?).ok()?;
    let data = (bytes.len() - end) as u64;
    let mut entries = Vec::new();
    for (name, t) in header.iter().filter(|(n, _)| *n != "__metadata__") {
        let offsets = t.get("data_offsets")?.as_array()?;
        let (start, stop) = (offsets.first()?.as_u64()?, offsets.get(1)?.as_u64()?);
        entries.push((start, stop, name, t));
    }
    entries.sort_by_key(|e| (e.0, e.1));
    for (start, stop, name, t) in entries {
        if stop < start || stop > data {
            return Some(format!(
                "tensor {name}: data_offsets [{start}, {stop}] lie outside the file's {data} \
                 bytes of data"
            ));
        }
        let dtype: Dtype = serde_json::from_value(t.get("dtype")?.clone()).ok()?;
        let shape: Vec<u64> = serde_json::from_value(t.get("shape")?.clone()).ok()?;
        let need = shape
            .iter()
            .try_fold(1u64, |a, &d| a.checked_mul(d))
            .and_then(|n| n.checked_mul(dtype.bitsize() as u64))
            .map(|b| b.div_ceil(8));
        if need != Some(stop - start) {
            let need = need.map_or("more than 2^64".into(), |b| b.to_string());
            return Some(format!(
                "tensor {name}: dtype {dtype:?} and shape {shape:?} take {need} bytes, but its \
                 data_offsets [{start}, {stop}] hold {}",
                stop - start
            ));
        }
    }
    None
}

/// Pair each FP8 matrix of `raw` with its factors (`<name>_scale` or
/// `<name>_scale_inv`, taken out of `dense`); errors name the tensor.
fn fp8_weights(
    path: &Path,
    raw: RawFp8,
    dense: &mut HashMap<String, Tensor>,
) -> Result<HashMap<String, Fp8Weight>> {
    let bad = |e: String| Error::Checkpoint(format!("{}: {e}", path.display()));
    let mut out = HashMap::new();
    for (name, (format, shape, codes)) in raw {
        let &[n, k] = shape.as_slice() else {
            return Err(bad(format!(
                "FP8 tensor {name} has shape {shape:?}; FP8 is read for matrices only"
            )));
        };
        let (sname, scale) = [format!("{name}_scale"), format!("{name}_scale_inv")]
            .into_iter()
            .find_map(|s| dense.remove(&s).map(|t| (s, t)))
            .ok_or_else(|| {
                bad(format!(
                    "FP8 tensor {name} has no factors: expected {name}_scale or {name}_scale_inv"
                ))
            })?;
        let (gn, gk) = (n.div_ceil(128), k.div_ceil(128));
        let dims: Vec<usize> = scale.shape().to_vec();
        let scaling = match dims.as_slice() {
            d if d.iter().product::<usize>() == 1 => WeightScaling::Tensor,
            [r] | [r, 1] if *r == n => WeightScaling::Channel,
            [r, c] if (*r, *c) == (gn, gk) => WeightScaling::Block128,
            d => {
                return Err(bad(format!(
                    "{sname} has shape {d:?}; a ({n}, {k}) FP8 weight takes one factor, ({n}) or ({n}, 1) per channel, or ({gn}, {gk}) per 128x128 block"
                )))
            }
        };
        let factors = scale.to_f32_vec();
        if let Some(f) = factors.iter().find(|f| !f.is_finite()) {
            return Err(bad(format!("{sname} holds a non-finite factor {f}")));
        }
        let block = match scaling {
            WeightScaling::Tensor => (n, k),
            WeightScaling::Channel => (1, k),
            WeightScaling::Block128 => (128, 128),
        };
        let q = QuantData {
            rows: n,
            cols: k,
            format,
            data: codes,
            block,
            scales: Scales::F32(factors),
            saturated: 0,
            underflowed: 0,
        };
        let w = Fp8Weight::from_quant_data(q).map_err(|e| bad(format!("tensor {name}: {e}")))?;
        out.insert(name, w);
    }
    Ok(out)
}

/// Save the model weights and `config.json` into `dir` (created if needed).
/// A model in LoRA mode saves its adapter instead, in PEFT's layout
/// (`adapter_model.safetensors` + `adapter_config.json`), with the base's
/// `config.json` beside it.
/// The weights go to one `model.safetensors`, or to shards of at most
/// [`MAX_SHARD_BYTES`] with their index where they are larger.
pub fn save_model(dir: &Path, model: &Llama) -> Result<()> {
    save_model_sharded(dir, model, MAX_SHARD_BYTES)
}

/// [`save_model`] with shards of at most `max_shard_bytes` of tensor data
/// (see [`shards`]).
pub fn save_model_sharded(dir: &Path, model: &Llama, max_shard_bytes: usize) -> Result<()> {
    if model.is_lora() {
        save_adapter(dir, model, None)?;
        return write_config(dir, &model.cfg, DType::F32);
    }
    let params = model.params();
    let dtype = params.first().map(|(_, t)| t.dtype()).unwrap_or(DType::F32);
    let tensors = params
        .into_iter()
        .map(|(n, t)| (n, Lazy::Tensor(t)))
        .collect();
    shards::write_model_tensors(dir, tensors, max_shard_bytes)?;
    write_config(dir, &model.cfg, dtype)
}

/// Write `config.json` in Hugging Face's form for the model's family
/// ([`octet_nn::hf_config::to_json`]), for weights stored as `dtype`.
pub fn write_config(dir: &Path, model_cfg: &LlamaConfig, dtype: DType) -> Result<()> {
    let cfg = octet_nn::hf_config::to_json(model_cfg, dtype);
    let text = serde_json::to_string_pretty(&cfg).map_err(|e| Error::Checkpoint(e.to_string()))?;
    write_atomic(&dir.join("config.json"), text.as_bytes())
}

/// What `base_model_name_or_path` records for an adapter trained on a
/// random-initialised base (no `--base`).
pub const RANDOM_BASE: &str = "random";

/// Whether the checkpoint in `dir` is a LoRA adapter's (PEFT's
/// `adapter_config.json` and no model weights), which needs its base
/// to run.
pub fn is_adapter_only(dir: &Path) -> bool {
    dir.join("adapter_config.json").is_file() && !has_weights(dir)
}

/// Read `config.json` from a checkpoint directory or a Hugging Face model
/// folder, in the form transformers 4 or 5 writes (and octet's own), for
/// the families of [`octet_nn::hf_config`]; the dimensions are checked
/// ([`LlamaConfig::validate`]). A field that would change the forward in a
/// way the model does not implement is an error naming it and its value;
/// fields the reader does not know are logged, not read.
pub fn load_config(dir: &Path) -> Result<LlamaConfig> {
    let p = dir.join("config.json");
    let bad = |e: String| Error::Checkpoint(format!("{}: {e}", p.display()));
    let text = std::fs::read_to_string(&p).map_err(|e| bad(e.to_string()))?;
    let hf = octet_nn::hf_config::parse(&text).map_err(|e| bad(e.to_string()))?;
    if !hf.ignored.is_empty() {
        tracing::warn!(
            config = %p.display(),
            fields = ?hf.ignored,
            "config.json fields octet does not read"
        );
    }
    Ok(hf.config)
}

/// A checkpoint directory or Hugging Face model folder: its config and its
/// weights (as `dtype`), checked against each other
/// ([`Llama::check_weights`]); a missing, misshapen or left-over tensor is an
/// error naming the weights file and the tensor.
pub fn load_model_folder(
    dir: &Path,
    dtype: DType,
) -> Result<(LlamaConfig, HashMap<String, Tensor>)> {
    let cfg = load_config(dir)?;
    let w = load_weights(dir, dtype)?;
    Llama::check_weights(&cfg, &w).map_err(|e| {
        Error::Checkpoint(format!("{}: {e}", dir.join("model.safetensors").display()))
    })?;
    Ok((cfg, w))
}

/// The first tensor of `weights` (by name) that holds a NaN or an infinity,
/// as an error naming it, the value and its index, and `source` (the
/// checkpoint it came from): what `octet generate` checks before decoding,
/// so that a damaged checkpoint is named rather than ending in non-finite
/// logits.
pub fn check_finite(weights: &HashMap<String, Tensor>, source: &str) -> Result<()> {
    let mut names: Vec<&String> = weights.keys().collect();
    names.sort();
    for name in names {
        let v = weights[name].to_f32_vec();
        if let Some((i, x)) = v.iter().enumerate().find(|(_, x)| !x.is_finite()) {
            return Err(Error::NonFinite(format!(
                "{source}: tensor {name} holds {x} at index {i}: the checkpoint is damaged or \
                 was saved after training diverged; use an earlier checkpoint"
            )));
        }
    }
    Ok(())
}

/// Load the weights of a checkpoint directory, converted to `dtype` (FP8
/// matrices dequantized); errors name the tensor.
pub fn load_weights(dir: &Path, dtype: DType) -> Result<HashMap<String, Tensor>> {
    Ok(load_weights_fp8(dir, dtype)?.0)
}

/// [`load_weights`], and the FP8 matrices also as stored (codes and factors,
/// by name), for a LoRA base that keeps them as they are.
pub fn load_weights_fp8(
    dir: &Path,
    dtype: DType,
) -> Result<(HashMap<String, Tensor>, HashMap<String, Fp8Weight>)> {
    let (mut w, fp8) = load_base_fp8(dir, dtype)?;
    for (name, q) in fp8.iter().filter(|(n, _)| n.ends_with("_proj.weight")) {
        let t = Tensor::from_f32(&[q.rows(), q.cols()], q.dequantize())?;
        w.insert(name.clone(), t.to_dtype(dtype));
    }
    Ok((w, fp8))
}

/// A LoRA base for the GPU: the tensors a checkpoint stores in other dtypes
/// (as `dtype`), and its FP8 block matrices (`*_proj.weight`) as stored only,
/// with no dense copy of them in host memory (`GpuLlama::new_lora_with` takes
/// them from the second map). Other FP8 tensors are also read dequantized.
/// [`load_weights_fp8`] adds the block matrices' dense copies.
pub fn load_base_fp8(
    dir: &Path,
    dtype: DType,
) -> Result<(HashMap<String, Tensor>, HashMap<String, Fp8Weight>)> {
    let ((mut dense, raw, _), path) = shards::read_model_tensors(dir)?;
    let fp8 = fp8_weights(&path, raw, &mut dense)?;
    let mut w: HashMap<String, Tensor> = dense
        .into_iter()
        .map(|(n, t)| (n, t.to_dtype(dtype)))
        .collect();
    // Only the block matrices become FP8 bases; any other FP8 tensor (an LM
    // head, say) is read dequantized.
    for (name, q) in fp8.iter().filter(|(n, _)| !n.ends_with("_proj.weight")) {
        let t = Tensor::from_f32(&[q.rows(), q.cols()], q.dequantize())?;
        w.insert(name.clone(), t.to_dtype(dtype));
    }
    Ok((w, fp8))
}

/// Save `model`'s weights with its block matrices (q, k, v, o, gate, up,
/// down) stored as `fp8` gives them (by name: FP8 codes and f32 factors, see
/// the module docs) and every other tensor in bf16, and `config.json`.
/// `scaling` is the one the matrices were quantized with: it names the
/// factors (`_scale_inv` for 128x128 blocks, also where a matrix is one
/// block and so has one factor).
pub fn save_model_fp8(
    dir: &Path,
    model: &Llama,
    fp8: &HashMap<String, Fp8Weight>,
    scaling: WeightScaling,
) -> Result<()> {
    let mut out: Vec<(String, Lazy)> = Vec::new();
    for (name, t) in model.params() {
        let Some(w) = fp8.get(&name) else {
            // The other tensors (embedding, norms, head) in bf16.
            let t = t.to_dtype(DType::Bf16);
            let (d, b) = to_bytes(&t);
            out.push((name, Lazy::Raw(d, t.shape().to_vec(), b.into())));
            continue;
        };
        let (n, k) = (w.rows(), w.cols());
        if t.shape() != [n, k] {
            return Err(Error::Checkpoint(format!(
                "FP8 weight for {name} is ({n}, {k}), the tensor {:?}",
                t.shape()
            )));
        }
        let d = match w.format() {
            Format::E4M3 => Dtype::F8_E4M3,
            _ => Dtype::F8_E5M2,
        };
        out.push((
            name.clone(),
            Lazy::Raw(d, vec![n, k], std::borrow::Cow::Borrowed(w.codes())),
        ));
        let blocks = vec![n.div_ceil(128), k.div_ceil(128)];
        let (suffix, shape) = match w.scaling() {
            WeightScaling::Tensor if scaling == WeightScaling::Block128 => ("_scale_inv", blocks),
            WeightScaling::Tensor => ("_scale", vec![1]),
            WeightScaling::Channel => ("_scale", vec![n, 1]),
            WeightScaling::Block128 => ("_scale_inv", blocks),
        };
        let factors: Vec<u8> = w.factors().iter().flat_map(|f| f.to_le_bytes()).collect();
        out.push((
            format!("{name}{suffix}"),
            Lazy::Raw(Dtype::F32, shape, factors.into()),
        ));
    }
    shards::write_model_tensors(dir, out, MAX_SHARD_BYTES)?;
    write_config(dir, &model.cfg, DType::Bf16)
}

/// Write a full checkpoint to `parent/name` so that it appears only whole:
/// files go to a temporary sibling directory that is renamed at the end.
/// `tokenizer`: the run's Hugging Face tokenizer (a folder or its
/// `tokenizer.json`, see [`copy_tokenizer_files`]), whose files the
/// checkpoint carries; `None` for the `byte` and `gpt2` tokenizers.
pub fn save_checkpoint(
    parent: &Path,
    name: &str,
    model: &Llama,
    opt: &AdamW,
    trainer: &str,
    tokenizer: Option<&Path>,
) -> Result<PathBuf> {
    save_checkpoint_with(parent, name, |tmp| {
        save_model(tmp, model)?;
        save_run_state(tmp, model, opt, trainer, tokenizer)
    })
}

/// What every checkpoint holds besides the weights: the optimizer state with
/// the trainer's settings and delayed scaling's state, and the run's
/// tokenizer files.
fn save_run_state(
    tmp: &Path,
    model: &Llama,
    opt: &AdamW,
    trainer: &str,
    tokenizer: Option<&Path>,
) -> Result<()> {
    let scaling = serde_json::to_string(&model.scaling_state())
        .map_err(|e| Error::Checkpoint(e.to_string()))?;
    save_optimizer(tmp, opt, trainer, &scaling)?;
    copy_run_tokenizer(tokenizer, tmp)
}

/// [`save_checkpoint`] for a model in LoRA mode, its adapter recording the
/// base it trains on (`base`: the `base_model_name_or_path` to write, see
/// [`base_record`]) and how (`rec`), so that a resume can refuse another.
pub fn save_lora_checkpoint(
    parent: &Path,
    name: &str,
    model: &Llama,
    opt: &AdamW,
    trainer: &str,
    tokenizer: Option<&Path>,
    (base, rec): (&str, &LoraRecord),
) -> Result<PathBuf> {
    save_checkpoint_with(parent, name, |tmp| {
        save_adapter(tmp, model, Some(base))?;
        write_lora_record(tmp, rec)?;
        write_config(tmp, &model.cfg, DType::F32)?;
        save_run_state(tmp, model, opt, trainer, tokenizer)
    })
}

/// Write a checkpoint `parent/name` whose files `write` puts into the
/// directory it is given, so that it appears only whole and an existing
/// `parent/name` is replaced without a moment with no valid checkpoint there:
///
/// 1. the files go to a temporary sibling directory `.name.tmp.<pid>.<n>`
///    (removed again if `write` or anything after it fails);
/// 2. on Linux the two directories are swapped in one step
///    (`renameat2(RENAME_EXCHANGE)`); where the filesystem cannot, the old
///    directory is renamed aside (`.name.old.<pid>.<n>`) and the new one
///    renamed into place right after (put back if that fails);
/// 3. the parent directory is fsynced, the old checkpoint removed, and only
///    then `parent/latest` rewritten to name `name`.
///
/// Leftovers of a run killed while saving are handled first: a `.name.old.*`
/// directory whose `name` is missing is renamed back to `name` (the kill fell
/// between the two renames of step 2), and temporary or aside directories of
/// processes no longer alive are removed (of this process too, for `name`
/// itself: one process saves one name at a time), and so are the temporary
/// files of dead processes' atomic writes ([`remove_stale_temp_files`]: a
/// kill between the checkpoint's rename and the `latest` update leaves a
/// `.latest.tmp.<pid>`).
pub fn save_checkpoint_with(
    parent: &Path,
    name: &str,
    write: impl FnOnce(&Path) -> Result<()>,
) -> Result<PathBuf> {
    let io = |what: &str, p: &Path, e: std::io::Error| {
        Error::Checkpoint(format!("{what} {}: {e}", p.display()))
    };
    std::fs::create_dir_all(parent).map_err(|e| io("creating", parent, e))?;
    let t0 = std::time::Instant::now();
    clean_leftovers(parent, name);
    remove_stale_temp_files(parent);
    let tag = unique_tag();
    let tmp = parent.join(format!(".{name}.tmp.{tag}"));
    let dst = parent.join(name);
    let written = std::fs::create_dir(&tmp)
        .map_err(|e| io("creating", &tmp, e))
        .and_then(|()| write(&tmp))
        .and_then(|()| replace_dir(&tmp, &dst, &parent.join(format!(".{name}.old.{tag}"))));
    let old = match written {
        Ok(old) => old,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&tmp);
            return Err(e);
        }
    };
    sync_dir(parent);
    let old_existed = old.is_some();
    if let Some(old) = old {
        // The new checkpoint is in place: a failure here leaves a hidden
        // directory that the next save removes, not a broken checkpoint.
        let _ = std::fs::remove_dir_all(old);
    }
    write_atomic(&parent.join("latest"), name.as_bytes())?;
    tracing::debug!(
        path = %dst.display(),
        ms = t0.elapsed().as_secs_f64() * 1e3,
        replaced = old_existed,
        "checkpoint written"
    );
    Ok(dst)
}

#[cfg(test)]
mod tests {
    /// A run directory and its `checkpoints` directory name the checkpoint
    /// their `latest` names; a checkpoint directory, or a path with none of
    /// that, is itself; a `latest` naming nothing is an error.
    #[test]
    fn a_run_directory_resolves_to_its_latest_checkpoint() {
        let root = std::env::temp_dir().join(format!("octet-resolve-{}", std::process::id()));
        let run = root.join("runs/t");
        let ck = run.join("checkpoints");
        let step = ck.join("step_000020");
        std::fs::create_dir_all(&step).expect("mkdir");
        std::fs::write(step.join("model.safetensors"), b"x").expect("write");
        std::fs::write(ck.join("latest"), "step_000020\n").expect("write latest");
        assert_eq!(resolve_checkpoint_dir(&run).expect("run"), step);
        assert_eq!(resolve_checkpoint_dir(&ck).expect("checkpoints"), step);
        assert_eq!(resolve_checkpoint_dir(&step).expect("itself"), step);
        let other = root.join("nothing-here");
        assert_eq!(resolve_checkpoint_dir(&other).expect("as it is"), other);
        // An adapter checkpoint (LoRA) counts as one.
        let adapter = ck.join("step_000030");
        std::fs::create_dir_all(&adapter).expect("mkdir");
        std::fs::write(adapter.join("adapter_config.json"), b"{}").expect("write");
        std::fs::write(ck.join("latest"), "step_000030").expect("write latest");
        assert_eq!(resolve_checkpoint_dir(&run).expect("adapter"), adapter);
        std::fs::write(ck.join("latest"), "step_000999").expect("write latest");
        let e = resolve_checkpoint_dir(&run).unwrap_err().to_string();
        assert!(e.contains("latest") && e.contains("step_000999"), "{e}");
        std::fs::remove_dir_all(&root).expect("clean up");
    }

    use super::*;

    /// An `octet_lora.json` whose base format or compute octet does not know
    /// is an error naming the file, not one of a "model config" later.
    #[test]
    fn a_lora_record_with_an_unknown_base_format_or_compute_names_its_file() {
        let dir = tmpdir("lora-record");
        std::fs::create_dir_all(&dir).expect("create the directory");
        for (text, word) in [
            (r#"{"base_format": "fp9", "compute": "fp8"}"#, "fp9"),
            (r#"{"base_format": "bf16", "compute": "fp4"}"#, "fp4"),
        ] {
            std::fs::write(dir.join(LORA_RECORD), text).expect("write the record");
            let e = load_lora_record(&dir).expect_err(text).to_string();
            assert!(e.contains(LORA_RECORD) && e.contains(word), "{e}");
        }
        let rec = LoraRecord {
            base_format: "fp8-block".into(),
            compute: "bf16".into(),
        };
        write_lora_record(&dir, &rec).expect("write the record");
        assert_eq!(load_lora_record(&dir).expect("a good record"), Some(rec));
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A `latest` naming a checkpoint that is not there is an error, not a
    /// silent default; no `latest` at all is `None`.
    #[test]
    fn a_latest_that_names_no_checkpoint_is_an_error() {
        let parent = std::env::temp_dir().join(format!("octet-latest-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&parent);
        std::fs::create_dir_all(&parent).expect("create the directory");
        assert!(latest_checkpoint(&parent).expect("no latest").is_none());
        std::fs::write(parent.join("latest"), "step_000999\n").expect("write latest");
        let e = latest_checkpoint(&parent)
            .expect_err("a dangling latest")
            .to_string();
        assert!(e.contains("latest") && e.contains("step_000999"), "{e}");
        std::fs::write(parent.join("latest"), "").expect("write latest");
        assert!(latest_checkpoint(&parent).is_err());
        std::fs::write(parent.join("latest"), "step_000999\n").expect("write latest");
        let ck = parent.join("step_000999");
        std::fs::create_dir_all(&ck).expect("create the checkpoint");
        std::fs::write(ck.join("model.safetensors"), b"").expect("write the model");
        assert_eq!(latest_checkpoint(&parent).expect("a checkpoint"), Some(ck));
        let _ = std::fs::remove_dir_all(&parent);
    }

    /// Hugging Face config fields that change the forward and that the model
    /// does not implement (RoPE scaling, attention dropout, another
    /// activation) are errors naming the field, not silently dropped; their
    /// no-op values load.
    #[test]
    fn unsupported_hugging_face_config_fields_are_errors() {
        let dir = tmpdir("hf-config");
        std::fs::create_dir_all(&dir).expect("create the directory");
        let base = r#""vocab_size": 16, "hidden_size": 8, "intermediate_size": 12,
            "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
            "max_position_embeddings": 32, "rms_norm_eps": 1e-5, "rope_theta": 500000.0"#;
        let load = |extra: &str| {
            let text = format!("{{{base}{extra}}}");
            std::fs::write(dir.join("config.json"), text).expect("write config.json");
            load_config(&dir)
        };
        for ok in [
            "",
            r#", "rope_scaling": null"#,
            r#", "rope_scaling": {"rope_type": "default"}"#,
            r#", "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0, "original_max_position_embeddings": 8192, "rope_type": "llama3"}"#,
            r#", "rope_scaling": {"type": "linear", "factor": 2.0}"#,
            r#", "attention_dropout": 0.0, "hidden_act": "silu""#,
            r#", "head_dim": 4"#,
            r#", "head_dim": null"#,
            r#", "head_dim": 8"#,
            r#", "architectures": ["Qwen2ForCausalLM"]"#,
        ] {
            assert!(load(ok).is_ok(), "{ok}: {:?}", load(ok));
        }
        // No num_key_value_heads: one a query head, as Hugging Face reads it.
        let mha = base.replace(r#""num_key_value_heads": 1,"#, "");
        std::fs::write(dir.join("config.json"), format!("{{{mha}}}")).expect("write");
        assert_eq!(load_config(&dir).expect("mha").num_key_value_heads, 2);
        for (bad, field) in [
            (
                r#", "rope_scaling": {"rope_type": "yarn", "factor": 4.0}"#,
                "rope_scaling",
            ),
            (
                r#", "rope_scaling": {"rope_type": "llama3", "factor": 32.0}"#,
                "rope_scaling",
            ),
            (
                r#", "rope_scaling": {"type": "linear", "factor": -2.0}"#,
                "rope_scaling",
            ),
            (r#", "attention_dropout": 0.1"#, "attention_dropout"),
            (r#", "hidden_act": "gelu""#, "hidden_act"),
            (
                r#", "architectures": ["GemmaForCausalLM"]"#,
                "GemmaForCausalLM",
            ),
            (r#", "mlp_bias": true"#, "mlp_bias"),
        ] {
            let e = load(bad).expect_err(bad).to_string();
            assert!(e.contains(field) && e.contains("config.json"), "{e}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn tmpdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("octet-ckpt-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    /// A checkpoint writer of `n` small files holding `text`.
    fn files(n: usize, text: &'static str) -> impl FnOnce(&Path) -> Result<()> {
        move |dir| {
            for i in 0..n {
                std::fs::write(dir.join(format!("f{i}")), text)?;
            }
            Ok(())
        }
    }

    fn entries(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn a_failed_save_keeps_the_old_checkpoint_and_leaves_no_temporary_directory() {
        let parent = tmpdir("failed");
        save_checkpoint_with(&parent, "step_000001", files(3, "old")).unwrap();
        let e = save_checkpoint_with(&parent, "step_000001", |dir| {
            std::fs::write(dir.join("f0"), "new")?;
            Err(Error::Checkpoint("disk full".into()))
        })
        .unwrap_err();
        assert!(e.to_string().contains("disk full"), "{e}");
        let e = save_checkpoint_with(&parent, "step_000002", |_| {
            Err(Error::Checkpoint("disk full".into()))
        });
        assert!(e.is_err());
        assert_eq!(entries(&parent), ["latest", "step_000001"]);
        let dst = parent.join("step_000001");
        assert_eq!(std::fs::read_to_string(dst.join("f0")).unwrap(), "old");
        assert_eq!(
            std::fs::read_to_string(parent.join("latest")).unwrap(),
            "step_000001"
        );
        // A good save replaces it whole and leaves nothing beside it.
        save_checkpoint_with(&parent, "step_000001", files(2, "new")).unwrap();
        assert_eq!(entries(&dst), ["f0", "f1"]);
        assert_eq!(std::fs::read_to_string(dst.join("f0")).unwrap(), "new");
        assert_eq!(entries(&parent), ["latest", "step_000001"]);
        let _ = std::fs::remove_dir_all(&parent);
    }

    /// A reader polling a checkpoint while it is replaced again and again
    /// never finds it missing or partial (where the filesystem can swap
    /// directories in one step; elsewhere the fallback has a short gap).
    #[cfg(target_os = "linux")]
    #[test]
    fn a_replaced_checkpoint_is_never_missing() {
        use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
        let parent = tmpdir("swap");
        save_checkpoint_with(&parent, "step_000001", files(8, "0")).unwrap();
        let (a, b) = (parent.join("probe-a"), parent.join("probe-b"));
        std::fs::create_dir(&a).unwrap();
        std::fs::create_dir(&b).unwrap();
        let swaps = exchange(&a, &b).unwrap_or(false);
        std::fs::remove_dir(&a).unwrap();
        std::fs::remove_dir(&b).unwrap();
        if !swaps {
            eprintln!("this filesystem cannot swap directories: not checked");
            let _ = std::fs::remove_dir_all(&parent);
            return;
        }
        let dst = parent.join("step_000001");
        let (stop, missing, polls) = (
            AtomicBool::new(false),
            AtomicUsize::new(0),
            AtomicUsize::new(0),
        );
        std::thread::scope(|s| {
            s.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    if !(0..8).all(|i| dst.join(format!("f{i}")).exists()) {
                        missing.fetch_add(1, Ordering::Relaxed);
                    }
                    polls.fetch_add(1, Ordering::Relaxed);
                }
            });
            for i in 0..100 {
                let text = if i % 2 == 0 { "a" } else { "b" };
                save_checkpoint_with(&parent, "step_000001", files(8, text)).unwrap();
            }
            stop.store(true, Ordering::Relaxed);
        });
        assert!(polls.load(Ordering::Relaxed) > 0);
        assert_eq!(
            missing.load(Ordering::Relaxed),
            0,
            "the checkpoint went missing"
        );
        assert_eq!(entries(&parent), ["latest", "step_000001"]);
        let _ = std::fs::remove_dir_all(&parent);
    }

    /// A save killed between moving the old checkpoint aside and renaming
    /// the new one into place: the next save puts the old one back, and
    /// removes the dead process's temporary directories.
    #[cfg(target_os = "linux")]
    #[test]
    fn leftovers_of_a_killed_save_are_put_back_or_removed() {
        let parent = tmpdir("leftovers");
        std::fs::create_dir_all(&parent).unwrap();
        // No process has this id (Linux's pid_max is at most 2^22).
        let dead = 4_000_000_000u32;
        let aside = parent.join(format!(".step_000002.old.{dead}.0"));
        std::fs::create_dir(&aside).unwrap();
        std::fs::write(aside.join("f0"), "two").unwrap();
        let tmp = parent.join(format!(".step_000002.tmp.{dead}.0"));
        std::fs::create_dir(&tmp).unwrap();
        std::fs::write(tmp.join("f0"), "partial").unwrap();
        std::fs::write(parent.join("latest"), "step_000002").unwrap();
        // A live process's directory (this one's, for another checkpoint) stays.
        let live = parent.join(format!(".step_000009.tmp.{}.99", std::process::id()));
        std::fs::create_dir(&live).unwrap();
        save_checkpoint_with(&parent, "step_000003", files(1, "three")).unwrap();
        let restored = parent.join("step_000002").join("f0");
        assert_eq!(std::fs::read_to_string(restored).unwrap(), "two");
        assert_eq!(
            entries(&parent),
            [
                format!(".step_000009.tmp.{}.99", std::process::id()).as_str(),
                "latest",
                "step_000002",
                "step_000003"
            ]
        );
        let _ = std::fs::remove_dir_all(&parent);
    }

    /// A kill between a checkpoint's rename and the `latest` update leaves
    /// `.latest.tmp.<pid>`: the next save removes a dead process's, keeps a
    /// live one's, and leaves other files alone.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_save_removes_the_temporary_latest_of_a_killed_run() {
        let parent = tmpdir("latest-litter");
        std::fs::create_dir_all(&parent).unwrap();
        // No process has this id (Linux's pid_max is at most 2^22).
        let dead = 4_000_000_000u32;
        let me = std::process::id();
        std::fs::write(parent.join(format!(".latest.tmp.{dead}")), "step_000001").unwrap();
        // This process's (the save's own `latest` write uses that name).
        std::fs::write(parent.join(format!(".notes.json.tmp.{me}")), "in use").unwrap();
        std::fs::write(parent.join(".notes.tmp.x"), "not a pid").unwrap();
        save_checkpoint_with(&parent, "step_000002", files(1, "two")).unwrap();
        assert_eq!(
            entries(&parent),
            [
                format!(".notes.json.tmp.{me}").as_str(),
                ".notes.tmp.x",
                "latest",
                "step_000002"
            ]
        );
        let _ = std::fs::remove_dir_all(&parent);
    }
}

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

pub mod shards;
pub use shards::{has_weights, MAX_SHARD_BYTES};

/// Write `bytes` to `path` atomically: a temp file beside it, fsync, rename, fsync the directory.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    atomic(path, |tmp| {
        let mut f = std::fs::File::create(tmp)?;
        f.write_all(bytes)
    })
}

/// Write `path` atomically by `write`, which fills the temp file it is given
/// (beside `path`); then fsync, rename, fsync the directory. On an error the
/// temp file is removed and `path` is left as it was.
fn atomic(path: &Path, write: impl FnOnce(&Path) -> std::io::Result<()>) -> Result<()> {
    let io = |e: std::io::Error| Error::Checkpoint(format!("writing {}: {e}", path.display()));
    tracing::trace!(path = %path.display(), "atomic write");
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(io)?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.tmp.{}", std::process::id()));
    let done = write(&tmp)
        .and_then(|()| std::fs::File::open(&tmp)?.sync_all())
        .and_then(|()| std::fs::rename(&tmp, path));
    if let Err(e) = done {
        let _ = std::fs::remove_file(&tmp);
        return Err(io(e));
    }
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all(); // not every filesystem allows fsync on a directory
    }
    Ok(())
}

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

/// The `base_model_name_or_path` of an adapter trained on `base` (`None`: a
/// random base, [`RANDOM_BASE`]): the directory made absolute where it can
/// be, so that a resume from another working directory still matches it.
pub fn base_record(base: Option<&Path>) -> String {
    match base {
        None => RANDOM_BASE.to_string(),
        Some(p) => std::fs::canonicalize(p)
            .unwrap_or_else(|_| p.to_path_buf())
            .display()
            .to_string(),
    }
}

/// Whether an adapter whose config records the base `recorded` (as
/// [`base_record`] writes it) was trained on `base` (`None`: random).
/// Paths compare after both are made absolute where they exist.
pub fn same_base(recorded: &str, base: Option<&Path>) -> bool {
    match base {
        None => recorded == RANDOM_BASE,
        Some(_) if recorded == RANDOM_BASE => false,
        Some(p) => {
            let rec = Path::new(recorded);
            let canon = |q: &Path| std::fs::canonicalize(q).unwrap_or_else(|_| q.to_path_buf());
            rec == p || canon(rec) == canon(p)
        }
    }
}

/// The base an adapter directory records (`base_model_name_or_path` of its
/// `adapter_config.json`): `None` where it is null or missing (adapters
/// saved before octet recorded it, and PEFT's saved without one).
pub fn load_adapter_base(dir: &Path) -> Result<Option<String>> {
    let (v, p) = adapter_config_json(dir)?;
    let bad = |m: String| Error::Checkpoint(format!("{}: {m}", p.display()));
    match &v["base_model_name_or_path"] {
        serde_json::Value::Null => Ok(None),
        serde_json::Value::String(s) => Ok(Some(s.clone())),
        other => Err(bad(format!(
            "base_model_name_or_path = {other}: expected a string or null"
        ))),
    }
}

/// An adapter directory's `adapter_config.json`, parsed, with its path (for
/// errors, which name it).
fn adapter_config_json(dir: &Path) -> Result<(serde_json::Value, PathBuf)> {
    let p = dir.join("adapter_config.json");
    let bad = |e: String| Error::Checkpoint(format!("{}: {e}", p.display()));
    let text = std::fs::read_to_string(&p).map_err(|e| bad(e.to_string()))?;
    let v = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
    Ok((v, p))
}

/// Write a LoRA model's adapter in PEFT's layout: `adapter_model.safetensors`
/// (`base_model.model.<module>.lora_A/lora_B.weight`) and `adapter_config.json`
/// recording `base` as `base_model_name_or_path` (see [`base_record`]; `None`
/// writes null: the base is not known).
pub fn save_adapter(dir: &Path, model: &Llama, base: Option<&str>) -> Result<()> {
    let (r, alpha, targets) = model
        .lora_summary()
        .ok_or_else(|| Error::Checkpoint("the model has no LoRA adapter".into()))?;
    let tensors: Vec<(String, Tensor)> = model
        .params()
        .into_iter()
        .map(|(n, t)| (n, t.clone()))
        .collect();
    write_adapter(
        dir,
        &tensors,
        (r, alpha, &targets, model.lora_dropout()),
        base,
    )
}

/// Write adapter tensors (PEFT names) in PEFT's layout, with their rank,
/// alpha, target module names (`q_proj`, ...), the dropout they trained with
/// and the base they trained on (`base_model_name_or_path`, as
/// [`save_adapter`] takes it).
pub fn write_adapter(
    dir: &Path,
    tensors: &[(String, Tensor)],
    (r, alpha, targets, dropout): (usize, f64, &[String], f64),
    base: Option<&str>,
) -> Result<()> {
    std::fs::create_dir_all(dir)
        .map_err(|e| Error::Checkpoint(format!("{}: {e}", dir.display())))?;
    write_tensors(
        &dir.join("adapter_model.safetensors"),
        tensors
            .iter()
            .map(|(n, t)| (n.clone(), Lazy::Tensor(t)))
            .collect(),
        None,
    )?;
    let cfg = serde_json::json!({
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": r,
        "lora_alpha": alpha,
        "target_modules": targets,
        "lora_dropout": dropout,
        "bias": "none",
        "fan_in_fan_out": false,
        "inference_mode": true,
        "base_model_name_or_path": base,
    });
    let text = serde_json::to_string_pretty(&cfg).map_err(|e| Error::Checkpoint(e.to_string()))?;
    write_atomic(&dir.join("adapter_config.json"), text.as_bytes())
}

/// How an adapter was trained, beyond what PEFT's `adapter_config.json`
/// holds: the form of its frozen base (`fp8-tensorwise`, `fp8-rowwise`,
/// `fp8-block`, `bf16`) and its compute (`fp8`, `bf16`). octet writes it
/// beside the adapter as `octet_lora.json`, so that a resume keeps them and a
/// merge defaults to the base the adapter learned to correct.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LoraRecord {
    /// `octet lora --base-format`.
    pub base_format: String,
    /// `octet lora --compute`.
    pub compute: String,
}

/// The file [`LoraRecord`] is written to, in an adapter's directory.
pub const LORA_RECORD: &str = "octet_lora.json";

/// Write `rec` into the adapter directory `dir` (atomically).
pub fn write_lora_record(dir: &Path, rec: &LoraRecord) -> Result<()> {
    let text = serde_json::to_string_pretty(rec).map_err(|e| Error::Checkpoint(e.to_string()))?;
    write_atomic(&dir.join(LORA_RECORD), text.as_bytes())
}

/// The [`LoraRecord`] of the adapter directory `dir`: `None` where there is
/// none (adapters saved before octet wrote one, or by PEFT); an error naming
/// the file where it cannot be read or parsed, or where its base format or
/// compute is not one octet knows (else the merge or resume that reads it
/// reports a bad "model config" without saying where the value came from).
pub fn load_lora_record(dir: &Path) -> Result<Option<LoraRecord>> {
    let p = dir.join(LORA_RECORD);
    let text = match std::fs::read_to_string(&p) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::file("reading", &p)(e)),
        Ok(t) => t,
    };
    let bad = |e: &dyn std::fmt::Display| Error::Checkpoint(format!("{}: {e}", p.display()));
    let rec: LoraRecord = serde_json::from_str(&text).map_err(|e| bad(&e))?;
    octet_nn::lora::BaseFormat::from_name(&rec.base_format).map_err(|e| bad(&e))?;
    octet_nn::lora::Compute::from_name(&rec.compute).map_err(|e| bad(&e))?;
    Ok(Some(rec))
}

/// An adapter's tensors, rank, alpha and target module names.
pub type Adapter = (HashMap<String, Tensor>, usize, f64, Vec<String>);

/// Read an adapter written by [`save_adapter`] (or by PEFT): its tensors and
/// `(r, alpha, target module names)`.
pub fn load_adapter(dir: &Path) -> Result<Adapter> {
    let (r, alpha, targets) = load_adapter_config(dir)?;
    let (w, _) = read_tensors(&dir.join("adapter_model.safetensors"))?;
    Ok((w, r, alpha, targets))
}

/// The `lora_dropout` an adapter directory's `adapter_config.json` records:
/// `None` where it is missing or null; an error where it is not a number in
/// `[0, 1)`.
pub fn load_adapter_dropout(dir: &Path) -> Result<Option<f64>> {
    let (v, p) = adapter_config_json(dir)?;
    match &v["lora_dropout"] {
        serde_json::Value::Null => Ok(None),
        d => match d.as_f64() {
            Some(x) if (0.0..1.0).contains(&x) => Ok(Some(x)),
            _ => Err(Error::Checkpoint(format!(
                "{}: lora_dropout = {d}: expected a probability in [0, 1)",
                p.display()
            ))),
        },
    }
}

/// Read `adapter_config.json` alone: `(r, alpha, target module names)`,
/// with `r` an integer between 1 and
/// [`MAX_LORA_RANK`](octet_nn::lora::MAX_LORA_RANK).
pub fn load_adapter_config(dir: &Path) -> Result<(usize, f64, Vec<String>)> {
    let (v, p) = adapter_config_json(dir)?;
    let bad = |m: &str| Error::Checkpoint(format!("{}: {m}", p.display()));
    let max = octet_nn::lora::MAX_LORA_RANK;
    let r = match &v["r"] {
        serde_json::Value::Null => return Err(bad("missing r")),
        rv => match rv.as_u64().map(usize::try_from) {
            Some(Ok(r)) if (1..=max).contains(&r) => r,
            _ => {
                return Err(bad(&format!(
                    "r = {rv}: a LoRA rank must be an integer between 1 and {max}"
                )))
            }
        },
    };
    let alpha = v["lora_alpha"]
        .as_f64()
        .ok_or_else(|| bad("missing lora_alpha"))?;
    if !(alpha.is_finite() && alpha > 0.0) {
        return Err(bad(&format!(
            "lora_alpha = {alpha}: a LoRA alpha must be a finite number above 0"
        )));
    }
    if let Some(t) = v["target_modules"].as_str() {
        // PEFT matches a string against whole module names as a regular expression.
        return Err(bad(&format!(
            "target_modules is the string {t:?}, which PEFT reads as a regular expression over \
             full module names; octet takes a list of module names (e.g. [\"q_proj\", \"v_proj\"])"
        )));
    }
    let targets = v["target_modules"]
        .as_array()
        .ok_or_else(|| bad("missing target_modules"))?
        .iter()
        .map(|t| {
            t.as_str()
                .map(String::from)
                .ok_or_else(|| bad(&format!("target_modules entry {t}: expected a module name")))
        })
        .collect::<Result<Vec<_>>>()?;
    // PEFT options that change what the adapter computes: read as plain
    // LoRA (`W + (alpha/r) B A`, one r and alpha) they would merge and train
    // something else without a word.
    for key in ["use_rslora", "use_dora", "fan_in_fan_out"] {
        if v[key] == serde_json::Value::Bool(true) {
            return Err(bad(&format!(
                "{key} = true is not supported: octet reads plain LoRA adapters (W + (alpha/r) B A)"
            )));
        }
    }
    for key in ["rank_pattern", "alpha_pattern"] {
        let set = match &v[key] {
            serde_json::Value::Null => false,
            serde_json::Value::Object(o) => !o.is_empty(),
            _ => true,
        };
        if set {
            return Err(bad(&format!(
                "{key} = {}: per-module ranks and alphas are not supported (one r and lora_alpha for every module)",
                v[key]
            )));
        }
    }
    Ok((r, alpha, targets))
}

/// The checkpoint that `parent/latest` names (what the trainer writes beside
/// its `step_N` directories): `None` where there is no `latest`; an error,
/// naming the file and what it holds, where it cannot be read or names no
/// directory with weights (`model.safetensors` or a shards' index).
pub fn latest_checkpoint(parent: &Path) -> Result<Option<PathBuf>> {
    named_by_latest(
        parent,
        has_weights,
        "a checkpoint with a model.safetensors (or its shards' index)",
    )
}

/// The directory `parent/latest` names, if `accept` takes it: `None` where
/// there is no `latest`; an error naming the file, what it holds and `what`
/// was wanted, where it cannot be read or names nothing `accept` takes.
fn named_by_latest(
    parent: &Path,
    accept: impl Fn(&Path) -> bool,
    what: &str,
) -> Result<Option<PathBuf>> {
    let latest = parent.join("latest");
    let text = match std::fs::read(&latest) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::file("reading", &latest)(e)),
        Ok(t) => t,
    };
    let name = String::from_utf8_lossy(&text).trim().to_string();
    let dir = parent.join(&name);
    if name.is_empty() || !accept(&dir) {
        return Err(Error::Checkpoint(format!(
            "{} names '{name}', which is not {what}",
            latest.display()
        )));
    }
    Ok(Some(dir))
}

/// The checkpoint a path names: a directory holding a checkpoint's files
/// (`model.safetensors` or its shards' index, `config.json` or
/// `adapter_config.json`) is itself;
/// a run directory (`runs/NAME`, what `--out-dir` and `--name` make) or its
/// `checkpoints` directory is the checkpoint its `latest` file names, so
/// `--checkpoint runs/NAME` reads the run's last checkpoint. Any other path
/// comes back as it is, for the loader to report. A `latest` that names no
/// checkpoint is an error naming both.
pub fn resolve_checkpoint_dir(p: &Path) -> Result<PathBuf> {
    let holds = |d: &Path| {
        has_weights(d)
            || ["config.json", "adapter_config.json"]
                .iter()
                .any(|f| d.join(f).is_file())
    };
    if holds(p) {
        return Ok(p.to_path_buf());
    }
    for parent in [p.join("checkpoints"), p.to_path_buf()] {
        if let Some(dir) = named_by_latest(&parent, holds, "a checkpoint directory")? {
            return Ok(dir);
        }
    }
    // A run directory whose `latest` is gone: name the checkpoints it holds.
    for parent in [p.join("checkpoints"), p.to_path_buf()] {
        let mut steps: Vec<PathBuf> = std::fs::read_dir(&parent)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|d| {
                d.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("step_"))
                    && holds(d)
            })
            .collect();
        steps.sort();
        if let Some(last) = steps.last() {
            return Err(Error::Checkpoint(format!(
                "{} holds checkpoints but no `latest` file naming one; name one, e.g. {}",
                parent.display(),
                last.display()
            )));
        }
    }
    Ok(p.to_path_buf())
}

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

/// Save the optimizer state with `trainer` metadata (JSON text) and the
/// model's delayed-scaling state (`scaling`, JSON) into `dir`.
pub fn save_optimizer(dir: &Path, opt: &AdamW, trainer: &str, scaling: &str) -> Result<()> {
    let mut tensors = Vec::with_capacity(3 * opt.states.len());
    for s in &opt.states {
        for (suffix, v) in [
            ("master", &s.master),
            ("exp_avg", &s.m),
            ("exp_avg_sq", &s.v),
        ] {
            tensors.push((
                format!("{}.{suffix}", s.name),
                Lazy::F32(v.as_slice(), s.shape.as_slice()),
            ));
        }
    }
    let meta = HashMap::from([
        ("step".to_string(), opt.step.to_string()),
        (
            "adamw".to_string(),
            serde_json::to_string(&opt.cfg).map_err(|e| Error::Checkpoint(e.to_string()))?,
        ),
        ("trainer".to_string(), trainer.to_string()),
        ("scaling".to_string(), scaling.to_string()),
    ]);
    write_tensors(&dir.join("optimizer.safetensors"), tensors, Some(meta))
}

/// Load the optimizer state for `model`'s parameters and restore the model's
/// delayed-scaling state; returns the optimizer and the trainer metadata.
pub fn load_optimizer(dir: &Path, model: &mut Llama) -> Result<(AdamW, String)> {
    let params: Vec<(String, Vec<usize>)> = model
        .params()
        .into_iter()
        .map(|(n, p)| (n, p.shape().to_vec()))
        .collect();
    let (opt, trainer, scaling) = load_optimizer_for(dir, &params)?;
    if let Some(scaling) = scaling {
        model
            .set_scaling_state(scaling)
            .map_err(|e| Error::Checkpoint(format!("{}: {e}", dir.display())))?;
    }
    Ok((opt, trainer))
}

/// The optimizer step of a checkpoint's metadata: a number of at most
/// [`MAX_STEPS`](crate::trainer::MAX_STEPS).
fn parse_step(text: Option<&String>) -> std::result::Result<u64, String> {
    let text = text.ok_or_else(|| "missing step".to_string())?;
    let step: u64 = text
        .trim()
        .parse()
        .map_err(|_| format!("step '{text}' is not a step count"))?;
    let max = crate::trainer::MAX_STEPS;
    if step > max {
        return Err(format!("step {step} exceeds the limit of {max}"));
    }
    Ok(step)
}

/// The optimizer step a checkpoint directory was saved at, read from the
/// header of its `optimizer.safetensors` alone (the tensors are not read).
pub fn read_step(dir: &Path) -> Result<u64> {
    let path = dir.join("optimizer.safetensors");
    let bad = |e: String| Error::Checkpoint(format!("{}: {e}", path.display()));
    let meta = read_optimizer_metadata(dir)?;
    let step = meta["step"].as_str().map(String::from);
    parse_step(step.as_ref()).map_err(bad)
}

/// The settings of the run that saved the checkpoint in `dir` (the
/// `trainer` metadata of its `optimizer.safetensors`, the run's
/// [`TrainConfig`](crate::trainer::TrainConfig) as JSON), read from the header alone;
/// `None` where the checkpoint records none (`{}` or no key).
pub fn read_trainer_settings(dir: &Path) -> Result<Option<String>> {
    let meta = read_optimizer_metadata(dir)?;
    Ok(meta["trainer"]
        .as_str()
        .filter(|t| !t.trim().is_empty() && t.trim() != "{}")
        .map(String::from))
}

/// The `__metadata__` of `dir/optimizer.safetensors`, from its header only
/// (an optimizer file is three times the model's size).
fn read_optimizer_metadata(dir: &Path) -> Result<serde_json::Value> {
    let mut v = read_header(&dir.join("optimizer.safetensors"))?;
    Ok(v.get_mut("__metadata__")
        .map_or(serde_json::Value::Null, serde_json::Value::take))
}

/// How the checkpoint in `dir` stores its FP8 block matrices (`*_proj.weight`
/// of dtype `F8_E4M3` or `F8_E5M2`), from the headers of its weights
/// (`model.safetensors` or every shard) alone: the scaling their factors'
/// shapes give (see the module docs), `Some(None)` where they differ between matrices, and `None`
/// where no block matrix is stored in FP8. A LoRA base keeps such matrices
/// as stored whatever FP8 form it is asked for.
pub fn stored_fp8_scaling(dir: &Path) -> Result<Option<Option<WeightScaling>>> {
    // No weights (yet): what reads them names the path.
    let Some(header) = shards::read_model_header(dir)? else {
        return Ok(None);
    };
    let Some(map) = header.as_object() else {
        return Ok(None);
    };
    let shape = |name: &str| -> Option<Vec<usize>> {
        map.get(name)?["shape"]
            .as_array()?
            .iter()
            .map(|d| d.as_u64().and_then(|d| usize::try_from(d).ok()))
            .collect()
    };
    let mut found: Option<Option<WeightScaling>> = None;
    for (name, info) in map {
        let fp8 = matches!(info["dtype"].as_str(), Some("F8_E4M3" | "F8_E5M2"));
        if !fp8 || !name.ends_with("_proj.weight") {
            continue;
        }
        let dims = shape(name).and_then(|s| <[usize; 2]>::try_from(s).ok());
        let factors =
            shape(&format!("{name}_scale")).or_else(|| shape(&format!("{name}_scale_inv")));
        // Anything else is for `load_weights_fp8` to name.
        let (Some([n, k]), Some(d)) = (dims, factors) else {
            continue;
        };
        let scaling = match d.as_slice() {
            d if d.iter().product::<usize>() == 1 => WeightScaling::Tensor,
            [r] | [r, 1] if *r == n => WeightScaling::Channel,
            [r, c] if (*r, *c) == (n.div_ceil(128), k.div_ceil(128)) => WeightScaling::Block128,
            _ => continue,
        };
        found = Some(match found {
            None => Some(scaling),
            Some(Some(s)) if s == scaling => Some(s),
            Some(_) => None,
        });
    }
    Ok(found)
}

/// The JSON header of the safetensors file at `path`, read without its data.
fn read_header(path: &Path) -> Result<serde_json::Value> {
    use std::io::Read;
    let bad = |e: String| Error::Checkpoint(format!("{}: {e}", path.display()));
    let mut f = std::fs::File::open(path).map_err(|e| bad(e.to_string()))?;
    if f.metadata().is_ok_and(|m| m.is_dir()) {
        return Err(not_a_file(path));
    }
    let mut len = [0u8; 8];
    f.read_exact(&mut len)
        .map_err(|e| bad(format!("no safetensors header ({e})")))?;
    // The safetensors crate's own bound on a header.
    const MAX_HEADER: u64 = 100_000_000;
    let n = u64::from_le_bytes(len);
    if n > MAX_HEADER {
        return Err(bad(format!(
            "a header of {n} bytes exceeds the limit of {MAX_HEADER}"
        )));
    }
    let mut header = Vec::new();
    f.take(n)
        .read_to_end(&mut header)
        .map_err(|e| bad(e.to_string()))?;
    if header.len() as u64 != n {
        return Err(bad(format!(
            "the header is cut short ({} of {n} bytes)",
            header.len()
        )));
    }
    serde_json::from_slice(&header)
        .map_err(|e| bad(format!("not a valid safetensors header ({e})")))
}

/// Delayed-scaling state of a checkpoint: `(layer, role, state)`.
pub type ScalingState = Vec<(String, Role, DelayedState)>;

/// Load the optimizer state of the parameters `params` (names and shapes,
/// in order; every one must be there with its master and both moments):
/// the optimizer, the trainer metadata, and the delayed-scaling state if saved.
pub fn load_optimizer_for(
    dir: &Path,
    params: &[(String, Vec<usize>)],
) -> Result<(AdamW, String, Option<ScalingState>)> {
    let path = dir.join("optimizer.safetensors");
    let (mut t, meta) = read_tensors(&path)?;
    let bad = |m: String| Error::Checkpoint(format!("{}: {m}", path.display()));
    let step = parse_step(meta.get("step")).map_err(bad)?;
    let cfg: AdamWConfig = meta
        .get("adamw")
        .and_then(|s| serde_json::from_str(s).ok())
        .ok_or_else(|| bad("missing adamw config".into()))?;
    cfg.validate().map_err(|e| match e {
        Error::Train(m) => bad(m),
        e => e,
    })?;
    let mut states = Vec::new();
    for (name, shape) in params {
        let mut take = |suffix: &str| -> Result<Vec<f32>> {
            let key = format!("{name}.{suffix}");
            let v = t
                .remove(&key)
                .ok_or_else(|| bad(format!("missing tensor {key}")))?;
            if v.shape() != shape.as_slice() {
                return Err(bad(format!(
                    "tensor {key} has shape {:?}, parameter is {:?}",
                    v.shape(),
                    shape
                )));
            }
            Ok(v.to_f32_vec())
        };
        let (master, m, v) = (take("master")?, take("exp_avg")?, take("exp_avg_sq")?);
        states.push(ParamState {
            name: name.clone(),
            shape: shape.clone(),
            master,
            m,
            v,
            decay: shape.len() >= 2,
        });
    }
    let scaling = match meta.get("scaling") {
        Some(text) => Some(
            serde_json::from_str::<ScalingState>(text)
                .map_err(|e| bad(format!("scaling state: {e}")))?,
        ),
        None => None,
    };
    let trainer = meta.get("trainer").cloned().unwrap_or_default();
    Ok((AdamW { cfg, states, step }, trainer, scaling))
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
        let scaling = serde_json::to_string(&model.scaling_state())
            .map_err(|e| Error::Checkpoint(e.to_string()))?;
        save_optimizer(tmp, opt, trainer, &scaling)?;
        copy_run_tokenizer(tokenizer, tmp)
    })
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
        let scaling = serde_json::to_string(&model.scaling_state())
            .map_err(|e| Error::Checkpoint(e.to_string()))?;
        save_optimizer(tmp, opt, trainer, &scaling)?;
        copy_run_tokenizer(tokenizer, tmp)
    })
}

/// [`copy_tokenizer_files`] of a run's tokenizer (`None`: nothing to copy)
/// into the checkpoint being written at `tmp`.
pub fn copy_run_tokenizer(tokenizer: Option<&Path>, tmp: &Path) -> Result<()> {
    if let Some(t) = tokenizer {
        copy_tokenizer_files(t, tmp)?;
    }
    Ok(())
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

/// Write a new model folder `out` whose files `write` puts into the
/// directory it is given, so that `out` appears only whole: the files go to
/// a temporary sibling `.out.tmp.<pid>.<n>` (removed on any error) that is
/// then renamed to `out`. `out` must not exist or be an empty directory; one
/// holding files is an error (nothing there is replaced).
pub fn write_new_dir(out: &Path, write: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
    let io = |what: &str, p: &Path, e: std::io::Error| {
        Error::Checkpoint(format!("{what} {}: {e}", p.display()))
    };
    let empty = match std::fs::read_dir(out) {
        Ok(mut d) => d.next().is_none(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => true,
        Err(e) => return Err(io("reading", out, e)),
    };
    if !empty {
        return Err(Error::Checkpoint(format!(
            "{} already holds files; write a model into a new (or empty) directory",
            out.display()
        )));
    }
    let name = out
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .ok_or_else(|| Error::Checkpoint(format!("{}: not a directory name", out.display())))?;
    let parent = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&parent).map_err(|e| io("creating", &parent, e))?;
    let tmp = parent.join(format!(".{name}.tmp.{}", unique_tag()));
    let done = std::fs::create_dir(&tmp)
        .map_err(|e| io("creating", &tmp, e))
        .and_then(|()| write(&tmp))
        .and_then(|()| {
            // An empty `out` goes first: not every system renames onto one.
            match std::fs::remove_dir(out) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(io("replacing", out, e))
                }
                _ => {}
            }
            std::fs::rename(&tmp, out).map_err(|e| io("renaming into", out, e))
        });
    if let Err(e) = done {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(e);
    }
    sync_dir(&parent);
    Ok(())
}

/// The files of a model folder that describe its tokenizer, as transformers'
/// `AutoTokenizer` and octet's [`crate::hf_tokenizer`] read them. Each is
/// small (a vocabulary, merges, a SentencePiece model or settings), so every
/// folder octet writes from a run on such a tokenizer carries them unchanged
/// ([`copy_tokenizer_files`]); weight files are never among them.
pub const TOKENIZER_FILES: [&str; 13] = [
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "generation_config.json",
    "chat_template.jinja",
    "chat_template.json",
    "vocab.json",
    "merges.txt",
    "vocab.txt",
    "tokenizer.model",
    "spiece.model",
    "sentencepiece.bpe.model",
];

/// Copy the tokenizer files ([`TOKENIZER_FILES`]) of `tokenizer` into the
/// folder `to`, byte for byte. `tokenizer` is a model folder, or a
/// `tokenizer.json` file: that file arrives as `to/tokenizer.json` (whatever
/// its name) and the other files come from its folder, as
/// [`crate::hf_tokenizer`] reads them. Files the folder lacks are left out;
/// one that is there but cannot be read is an error naming it. Returns the
/// names copied.
pub fn copy_tokenizer_files(tokenizer: &Path, to: &Path) -> Result<Vec<&'static str>> {
    let (dir, json) = if tokenizer.is_dir() {
        (tokenizer.to_path_buf(), tokenizer.join("tokenizer.json"))
    } else {
        let dir = match tokenizer.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        (dir, tokenizer.to_path_buf())
    };
    let mut copied = Vec::new();
    for name in TOKENIZER_FILES {
        let from = match name {
            "tokenizer.json" => json.clone(),
            _ => dir.join(name),
        };
        match std::fs::copy(&from, to.join(name)) {
            Ok(_) => copied.push(name),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !from.exists() => {}
            Err(e) => {
                return Err(Error::Checkpoint(format!(
                    "copying the tokenizer file {} into {}: {e}",
                    from.display(),
                    to.display()
                )))
            }
        }
    }
    Ok(copied)
}

/// The tokenizer files the model folder or checkpoint `dir` goes with, for
/// a folder written from it ([`copy_tokenizer_files`] takes the path):
/// `dir`'s own where it holds a `tokenizer.json` or records no run (a
/// model folder), else those of the Hugging Face tokenizer its run recorded
/// (the `tokenizer` of [`read_trainer_settings`], where that is still
/// there; a checkpoint written before checkpoints carried them). `None` for
/// a run on the `byte` or `gpt2` tokenizer.
pub fn tokenizer_source(dir: &Path) -> Result<Option<PathBuf>> {
    if dir.join("tokenizer.json").is_file() {
        return Ok(Some(dir.to_path_buf()));
    }
    Ok(match recorded_tokenizer(dir)? {
        Some(recorded) => recorded,
        None => Some(dir.to_path_buf()),
    })
}

/// [`tokenizer_source`] of a model merged from `base` and the LoRA adapter
/// `adapter`: the adapter's where it holds a `tokenizer.json` or records the
/// run that trained it (on whichever tokenizer that run took), else the
/// base's (an adapter from elsewhere).
pub fn merged_tokenizer_source(base: &Path, adapter: &Path) -> Result<Option<PathBuf>> {
    if adapter.join("tokenizer.json").is_file() {
        return Ok(Some(adapter.to_path_buf()));
    }
    match recorded_tokenizer(adapter)? {
        Some(recorded) => Ok(recorded),
        None => tokenizer_source(base),
    }
}

/// The tokenizer the run that saved the checkpoint `dir` trained with:
/// `None` where `dir` records no run, `Some(None)` for `byte`, `gpt2` or
/// a tokenizer no longer there, else its `tokenizer.json`.
pub fn recorded_tokenizer(dir: &Path) -> Result<Option<Option<PathBuf>>> {
    if !dir.join("optimizer.safetensors").is_file() {
        return Ok(None);
    }
    let Some(text) = read_trainer_settings(dir)? else {
        return Ok(None);
    };
    let Ok(v) = serde_json::from_str::<serde_json::Value>(&text) else {
        return Ok(None);
    };
    let Some(name) = v["tokenizer"].as_str() else {
        return Ok(None);
    };
    Ok(Some(match name {
        "byte" | "gpt2" => None,
        path => crate::hf_tokenizer::tokenizer_json(Path::new(path)),
    }))
}

/// fsync a directory (its entries' renames); not every filesystem allows it.
fn sync_dir(dir: &Path) {
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
}

/// `<pid>.<n>`: unique among this process's saves.
fn unique_tag() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "{}.{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// Put the complete directory `new` at `dst`. Returns where the checkpoint
/// `dst` held before now is (to be removed), `None` if there was none. `aside`
/// is the name the old one takes where the filesystem cannot swap them.
fn replace_dir(new: &Path, dst: &Path, aside: &Path) -> Result<Option<PathBuf>> {
    let io = |what: &str, p: &Path, e: std::io::Error| {
        Error::Checkpoint(format!("{what} {}: {e}", p.display()))
    };
    match std::fs::symlink_metadata(dst) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::rename(new, dst).map_err(|e| io("renaming into", dst, e))?;
            return Ok(None);
        }
        Err(e) => return Err(io("reading", dst, e)),
        Ok(_) => {}
    }
    match exchange(new, dst) {
        // `new` now names the old checkpoint.
        Ok(true) => return Ok(Some(new.to_path_buf())),
        Ok(false) => {}
        Err(e) => return Err(io("swapping in", dst, e)),
    }
    std::fs::rename(dst, aside).map_err(|e| io("moving aside", dst, e))?;
    if let Err(e) = std::fs::rename(new, dst) {
        let _ = std::fs::rename(aside, dst);
        return Err(io("renaming into", dst, e));
    }
    Ok(Some(aside.to_path_buf()))
}

/// Swap the directories `a` and `b` in one step. `Ok(false)`: this system or
/// filesystem cannot (the caller falls back to two renames).
#[cfg(target_os = "linux")]
fn exchange(a: &Path, b: &Path) -> std::io::Result<bool> {
    use std::os::unix::ffi::OsStrExt;
    let c = |p: &Path| {
        std::ffi::CString::new(p.as_os_str().as_bytes())
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))
    };
    let (ca, cb) = (c(a)?, c(b)?);
    // SAFETY: both paths are NUL-terminated C strings that outlive the call;
    // renameat2 only reads them.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            ca.as_ptr(),
            libc::AT_FDCWD,
            cb.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    if rc == 0 {
        return Ok(true);
    }
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EINVAL | libc::ENOSYS | libc::EOPNOTSUPP) => Ok(false),
        _ => Err(e),
    }
}

/// Swap the directories `a` and `b` in one step: not available here.
#[cfg(not(target_os = "linux"))]
fn exchange(_: &Path, _: &Path) -> std::io::Result<bool> {
    Ok(false)
}

/// Whether the process `pid` may still be running: `false` only where
/// `/proc` shows it is not (without `/proc`, every process may be).
fn may_be_alive(pid: u32) -> bool {
    let proc = Path::new("/proc");
    !proc.join("self").exists() || proc.join(pid.to_string()).exists()
}

/// Remove the temporary files of [`write_atomic`] (`.<name>.tmp.<pid>`,
/// what a kill between the write and the rename leaves, e.g. a
/// `.latest.tmp.<pid>`) from `dir` where the process `<pid>` is no longer
/// alive (as `/proc` shows it; without `/proc` none is removed, and a pid
/// reused by a live process keeps its file until that one ends). This
/// process's own are kept: another thread of it may be writing one now. Each
/// file removed is traced at `info`, with its path. Returns the paths
/// removed. Best effort: a file that cannot be removed is left.
pub fn remove_stale_temp_files(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let me = std::process::id();
    let mut removed = Vec::new();
    for entry in entries.flatten() {
        let file = entry.file_name().to_string_lossy().into_owned();
        let Some(rest) = file.strip_prefix('.') else {
            continue;
        };
        let mut parts = rest.rsplitn(3, '.');
        let (Some(pid), Some("tmp"), Some(name)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let Ok(pid) = pid.parse::<u32>() else {
            continue;
        };
        if name.is_empty() || pid == me || may_be_alive(pid) {
            continue;
        }
        if !entry.file_type().is_ok_and(|t| t.is_file()) {
            continue;
        }
        let path = entry.path();
        if std::fs::remove_file(&path).is_ok() {
            tracing::info!(path = %path.display(), pid, "removed the temporary file of a process no longer running");
            removed.push(path);
        }
    }
    removed
}

/// Handle what killed saves left in the checkpoints directory `parent` (as
/// the next save does before it writes): an aside copy of a checkpoint that
/// is missing is renamed back, and temporary or aside directories of
/// processes no longer alive are removed. For a resume, which saves nothing
/// until its first checkpoint step.
pub fn clean_killed_saves(parent: &Path) {
    // No name of this process's own: its directories are all kept.
    clean_leftovers(parent, "");
}

/// Leftovers of saves that were killed (see [`save_checkpoint_with`]): in
/// `parent`, `.<ckpt>.tmp.<pid>.<n>` and `.<ckpt>.old.<pid>.<n>` directories
/// of processes no longer alive (and this process's for `name`) are removed,
/// after an aside copy of a checkpoint that is missing is renamed back. Best
/// effort: a leftover that cannot be handled is left where it is.
fn clean_leftovers(parent: &Path, name: &str) {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    let me = std::process::id();
    let mut stale: Vec<(String, bool, PathBuf)> = Vec::new();
    for entry in entries.flatten() {
        let file = entry.file_name().to_string_lossy().into_owned();
        let Some(rest) = file.strip_prefix('.') else {
            continue;
        };
        // `<ckpt>.(tmp|old).<pid>.<n>`, the checkpoint's name may hold dots.
        let mut parts = rest.rsplitn(4, '.');
        let (Some(n), Some(pid), Some(kind), Some(ckpt)) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let (Ok(_), Ok(pid)) = (n.parse::<u64>(), pid.parse::<u32>()) else {
            continue;
        };
        if !matches!(kind, "tmp" | "old") || ckpt.is_empty() || ckpt.contains('/') {
            continue;
        }
        let dead = if pid == me {
            ckpt == name
        } else {
            !may_be_alive(pid)
        };
        if dead && entry.file_type().is_ok_and(|t| t.is_dir()) {
            stale.push((ckpt.to_string(), kind == "old", entry.path()));
        }
    }
    // A checkpoint that is missing gets an aside copy back (there is one
    // unless several saves of it were killed between their two renames).
    for (ckpt, is_old, path) in &stale {
        let dst = parent.join(ckpt);
        if *is_old
            && std::fs::symlink_metadata(&dst).is_err()
            && std::fs::rename(path, &dst).is_ok()
        {
            sync_dir(parent);
        }
    }
    for (_, _, path) in &stale {
        if path.exists() {
            let _ = std::fs::remove_dir_all(path);
        }
    }
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

//! Hugging Face `config.json` to and from [`LlamaConfig`].
//!
//! Reading is an explicit step, not a serde image, because the same model
//! comes in several spellings:
//!
//! | what | transformers 4 | transformers 5 |
//! |---|---|---|
//! | RoPE base | `rope_theta` | `rope_parameters.rope_theta` |
//! | RoPE stretch | `rope_scaling` (`rope_type` or `type`) | `rope_parameters.rope_type` and its fields |
//! | dtype | `torch_dtype` | `dtype` |
//! | sliding attention | `sliding_window`, `use_sliding_window` | also `layer_types` |
//!
//! The architecture picks the family's switches (the table on
//! [`LlamaConfig`]): `LlamaForCausalLM`, `MistralForCausalLM`,
//! `Qwen2ForCausalLM` and `Qwen3ForCausalLM`, named by `architectures` or,
//! without it, by `model_type` (neither: Llama, octet's own older form).
//! A field that would change the forward in a way octet does not implement
//! is an error naming the field and its value: `hidden_act` other than
//! `silu`, `attention_dropout` above 0, Llama's `mlp_bias`, a
//! `partial_rotary_factor` below 1, a RoPE kind other than `default`,
//! `linear`, `llama3`, and a sliding window in use that is shorter than
//! `max_position_embeddings` (a window at least as long as the context
//! never masks anything, so such a Mistral config loads). Fields known to
//! leave the forward alone (token ids, `initializer_range`, ...) are
//! dropped; any other field is listed in [`HfConfig::ignored`] for the
//! caller to report.
//!
//! Writing ([`to_json`]) uses the transformers 4 spelling, which both
//! transformers 4 and 5 read, with the architecture the switches name
//! (Mistral is written as Llama: the same computation).

use crate::llama::{LlamaConfig, RopeScaling};
use crate::{Error, Result};
use octet_tensor::DType;
use serde_json::{json, Map, Value};

/// A model family octet runs, as `architectures` names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Architecture {
    /// `LlamaForCausalLM` (SmolLM too).
    Llama,
    /// `MistralForCausalLM`.
    Mistral,
    /// `Qwen2ForCausalLM` (Qwen2 and Qwen2.5).
    Qwen2,
    /// `Qwen3ForCausalLM`.
    Qwen3,
}

impl Architecture {
    const ALL: [Architecture; 4] = [
        Architecture::Llama,
        Architecture::Mistral,
        Architecture::Qwen2,
        Architecture::Qwen3,
    ];

    /// The class name transformers uses in `architectures`.
    pub fn class_name(self) -> &'static str {
        match self {
            Architecture::Llama => "LlamaForCausalLM",
            Architecture::Mistral => "MistralForCausalLM",
            Architecture::Qwen2 => "Qwen2ForCausalLM",
            Architecture::Qwen3 => "Qwen3ForCausalLM",
        }
    }

    /// The `model_type` of `config.json`.
    pub fn model_type(self) -> &'static str {
        match self {
            Architecture::Llama => "llama",
            Architecture::Mistral => "mistral",
            Architecture::Qwen2 => "qwen2",
            Architecture::Qwen3 => "qwen3",
        }
    }

    /// The family a config's switches are written as (Mistral computes as Llama).
    pub fn of(cfg: &LlamaConfig) -> Architecture {
        match (cfg.qk_norm, cfg.qkv_bias, cfg.o_bias) {
            (true, ..) => Architecture::Qwen3,
            (false, true, false) => Architecture::Qwen2,
            _ => Architecture::Llama,
        }
    }
}

fn class_list() -> String {
    Architecture::ALL.map(Architecture::class_name).join(", ")
}

/// A parsed `config.json`.
#[derive(Clone, Debug, PartialEq)]
pub struct HfConfig {
    /// The model, validated ([`LlamaConfig::validate`]).
    pub config: LlamaConfig,
    /// The family it named.
    pub architecture: Architecture,
    /// `dtype` (transformers 5) or `torch_dtype` (4), e.g. `bfloat16`.
    pub dtype: Option<String>,
    /// Fields this reader does not know, sorted: they are not read, so a
    /// caller should say so.
    pub ignored: Vec<String>,
    /// The FP8 layout `quantization_config` names, if any.
    pub quantization: Option<Fp8Layout>,
}

/// Fields that do not change the forward.
const HARMLESS: [&str; 12] = [
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "initializer_range",
    "use_cache",
    "transformers_version",
    "_name_or_path",
    "pretraining_tp",
    "max_window_layers",
    "output_attentions",
    "output_hidden_states",
    "return_dict",
];

/// Fields taken out of a JSON object one by one, each read with its name in
/// any error; what is left over was not read.
struct Fields(Map<String, Value>);

impl Fields {
    /// The value of `key`, a JSON `null` counting as absent.
    fn take(&mut self, key: &str) -> Option<Value> {
        self.0.remove(key).filter(|v| !v.is_null())
    }

    fn usize(&mut self, key: &str) -> Result<Option<usize>> {
        self.take(key)
            .map(|v| {
                v.as_u64()
                    .and_then(|n| usize::try_from(n).ok())
                    .ok_or_else(|| bad(format!("{key} must be a whole number, got {v}")))
            })
            .transpose()
    }

    fn need_usize(&mut self, key: &str) -> Result<usize> {
        self.usize(key)?
            .ok_or_else(|| bad(format!("{key} is missing")))
    }

    fn f64(&mut self, key: &str) -> Result<Option<f64>> {
        self.take(key)
            .map(|v| {
                v.as_f64()
                    .ok_or_else(|| bad(format!("{key} must be a number, got {v}")))
            })
            .transpose()
    }

    fn bool(&mut self, key: &str) -> Result<Option<bool>> {
        self.take(key)
            .map(|v| {
                v.as_bool()
                    .ok_or_else(|| bad(format!("{key} must be true or false, got {v}")))
            })
            .transpose()
    }

    fn string(&mut self, key: &str) -> Result<Option<String>> {
        self.take(key)
            .map(|v| match v {
                Value::String(s) => Ok(s),
                v => Err(bad(format!("{key} must be a string, got {v}"))),
            })
            .transpose()
    }
}

fn bad(m: String) -> Error {
    Error::Config(m)
}

/// Parse the text of a `config.json` (see the module doc).
pub fn parse(text: &str) -> Result<HfConfig> {
    let v: Value = serde_json::from_str(text).map_err(|e| bad(format!("not JSON: {e}")))?;
    parse_value(v)
}

/// Parse a `config.json` already read as JSON (see the module doc).
pub fn parse_value(v: Value) -> Result<HfConfig> {
    let Value::Object(obj) = v else {
        return Err(bad(format!("expected a JSON object, got {v}")));
    };
    let mut f = Fields(obj);
    let architecture = architecture(&mut f)?;
    let hidden_size = f.need_usize("hidden_size")?;
    let num_attention_heads = f.need_usize("num_attention_heads")?;
    let max_position_embeddings = f.need_usize("max_position_embeddings")?;
    // transformers' Qwen3Config defaults head_dim to 128, whatever the width.
    let head_dim = match (architecture, f.usize("head_dim")?) {
        (Architecture::Qwen3, None) => Some(128),
        (_, d) => d,
    };
    // A head_dim equal to C / Hq is the default spelled out: one form for both.
    let derived = (num_attention_heads > 0 && hidden_size.is_multiple_of(num_attention_heads))
        .then(|| hidden_size / num_attention_heads);
    let head_dim = head_dim.filter(|&d| Some(d) != derived);

    let (qkv_bias, o_bias, qk_norm) = match architecture {
        Architecture::Llama => {
            refuse_true(&mut f, "mlp_bias")?;
            let b = f.bool("attention_bias")?.unwrap_or(false);
            (b, b, false)
        }
        // transformers builds these without reading attention_bias.
        Architecture::Mistral => (false, false, false),
        Architecture::Qwen2 => (true, false, false),
        Architecture::Qwen3 => {
            let b = f.bool("attention_bias")?.unwrap_or(false);
            (b, b, true)
        }
    };
    check_sliding(&mut f, architecture, max_position_embeddings)?;
    if let Some(act) = f.string("hidden_act")? {
        if act != "silu" {
            return Err(bad(format!(
                "hidden_act '{act}' is not supported (only silu)"
            )));
        }
    }
    if let Some(p) = f.f64("attention_dropout")? {
        if p != 0.0 {
            return Err(bad(format!(
                "attention_dropout {p} is not supported (only 0)"
            )));
        }
    }
    check_partial_rotary(f.f64("partial_rotary_factor")?, "partial_rotary_factor")?;
    let quantization = f
        .take("quantization_config")
        .map(quantization)
        .transpose()?;
    let (rope_theta, rope_scaling) = rope(&mut f)?;
    let dtype = match f.string("dtype")? {
        Some(d) => Some(d),
        None => f.string("torch_dtype")?,
    };
    let num_key_value_heads = f
        .usize("num_key_value_heads")?
        .unwrap_or(num_attention_heads);
    let config = LlamaConfig {
        vocab_size: f.need_usize("vocab_size")?,
        hidden_size,
        intermediate_size: f.need_usize("intermediate_size")?,
        num_hidden_layers: f.need_usize("num_hidden_layers")?,
        num_attention_heads,
        num_key_value_heads,
        max_position_embeddings,
        // transformers' default for all four families.
        rms_norm_eps: f.f64("rms_norm_eps")?.unwrap_or(1e-6),
        rope_theta,
        tie_word_embeddings: f.bool("tie_word_embeddings")?.unwrap_or(false),
        rope_scaling,
        head_dim,
        qkv_bias,
        o_bias,
        qk_norm,
    };
    config.validate()?;
    for k in HARMLESS {
        f.0.remove(k);
    }
    let mut ignored: Vec<String> = f.0.into_iter().map(|(k, _)| k).collect();
    ignored.sort_unstable();
    Ok(HfConfig {
        config,
        architecture,
        dtype,
        ignored,
        quantization,
    })
}

/// How a checkpoint's FP8 matrices are laid out, as its `quantization_config`
/// says: the two layouts serving engines load, which octet reads and writes
/// (`octet export`). Either way a matrix `X.weight` is `F8_E4M3` codes and
/// its value is code x factor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fp8Layout {
    /// compressed-tensors' `float-quantized` format (vLLM, llm-compressor):
    /// factors in `X.weight_scale`, one per tensor (`per_channel` false) or
    /// one per output row, `(N, 1)`; activations quantized dynamically.
    CompressedTensors {
        /// One factor per output row (`strategy: channel`), else one per tensor.
        per_channel: bool,
    },
    /// Hugging Face's fine-grained FP8 (`quant_method: fp8`, DeepSeek's
    /// layout): factors in `X.weight_scale_inv`, one per 128x128 block.
    FineGrained,
}

impl Fp8Layout {
    /// The `quantization_config` entry of `config.json` for this layout; the
    /// LM head is left in high precision (`ignore`, `modules_to_not_convert`).
    pub fn to_json(self) -> Value {
        match self {
            Fp8Layout::CompressedTensors { per_channel } => {
                let quant = |strategy: &str, dynamic: bool, observer: Value| {
                    json!({
                        "num_bits": 8, "type": "float", "symmetric": true,
                        "strategy": strategy, "dynamic": dynamic, "group_size": null,
                        "block_structure": null, "actorder": null,
                        "observer": observer, "observer_kwargs": {}
                    })
                };
                json!({
                    "quant_method": "compressed-tensors",
                    "format": "float-quantized",
                    "quantization_status": "compressed",
                    "config_groups": {"group_0": {
                        "targets": ["Linear"],
                        "weights": quant(if per_channel { "channel" } else { "tensor" }, false, json!("minmax")),
                        "input_activations": quant("token", true, Value::Null),
                        "output_activations": null
                    }},
                    "ignore": ["lm_head"],
                    "kv_cache_scheme": null
                })
            }
            Fp8Layout::FineGrained => json!({
                "quant_method": "fp8",
                "activation_scheme": "dynamic",
                "weight_block_size": [128, 128],
                "modules_to_not_convert": ["lm_head"]
            }),
        }
    }
}

/// The layout a `quantization_config` describes, or an error naming what
/// octet does not read (another method, integer or 4-bit weights, static
/// activation scales, other block sizes).
fn quantization(v: Value) -> Result<Fp8Layout> {
    let q = |m: String| bad(format!("quantization_config: {m}"));
    let method = v.get("quant_method").and_then(Value::as_str).unwrap_or("");
    match method {
        "fp8" => {
            let block = v.get("weight_block_size");
            if block != Some(&json!([128, 128])) {
                return Err(q(format!(
                    "weight_block_size {} is not supported (only [128, 128])",
                    block.unwrap_or(&Value::Null)
                )));
            }
            match v.get("activation_scheme").and_then(Value::as_str) {
                None | Some("dynamic") => Ok(Fp8Layout::FineGrained),
                Some(s) => Err(q(format!(
                    "activation_scheme '{s}' is not supported (only dynamic)"
                ))),
            }
        }
        "compressed-tensors" => {
            let format = v.get("format").and_then(Value::as_str).unwrap_or("");
            if format != "float-quantized" {
                return Err(q(format!(
                    "compressed-tensors format '{format}' is not supported (only float-quantized)"
                )));
            }
            let groups = v
                .get("config_groups")
                .and_then(Value::as_object)
                .filter(|g| g.len() == 1)
                .ok_or_else(|| q("expected one entry in config_groups".into()))?;
            let (name, g) = groups
                .iter()
                .next()
                .ok_or_else(|| q("no config group".into()))?;
            let w = g.get("weights").unwrap_or(&Value::Null);
            let bits = w.get("num_bits").and_then(Value::as_u64);
            let ty = w.get("type").and_then(Value::as_str);
            if (bits, ty) != (Some(8), Some("float")) {
                return Err(q(format!(
                    "{name}.weights: {bits:?}-bit {ty:?} weights are not supported (only 8-bit float)"
                )));
            }
            let per_channel = match w.get("strategy").and_then(Value::as_str) {
                Some("channel") => true,
                Some("tensor") => false,
                s => {
                    return Err(q(format!(
                        "{name}.weights.strategy {s:?} is not supported (tensor or channel)"
                    )))
                }
            };
            let a = g.get("input_activations").unwrap_or(&Value::Null);
            if !a.is_null() && a.get("dynamic").and_then(Value::as_bool) != Some(true) {
                return Err(q(format!(
                    "{name}.input_activations: static activation scales are not supported (only dynamic)"
                )));
            }
            Ok(Fp8Layout::CompressedTensors { per_channel })
        }
        other => Err(q(format!(
            "quant_method '{other}' is not supported (compressed-tensors float-quantized, or fp8)"
        ))),
    }
}

/// The family `architectures` names (one entry), else `model_type`'s, else Llama.
fn architecture(f: &mut Fields) -> Result<Architecture> {
    let model_type = f.string("model_type")?;
    if let Some(v) = f.take("architectures") {
        let names: Vec<&str> = match &v {
            Value::Array(a) => a.iter().filter_map(Value::as_str).collect(),
            Value::String(s) => vec![s.as_str()],
            _ => vec![],
        };
        return match names.as_slice() {
            [one] => Architecture::ALL
                .into_iter()
                .find(|a| a.class_name() == *one)
                .ok_or_else(|| {
                    bad(format!(
                        "architectures {v} is not supported: octet runs {}",
                        class_list()
                    ))
                }),
            _ => Err(bad(format!(
                "architectures {v} must name one model class, one of {}",
                class_list()
            ))),
        };
    }
    match model_type {
        None => Ok(Architecture::Llama),
        Some(t) => Architecture::ALL
            .into_iter()
            .find(|a| a.model_type() == t)
            .ok_or_else(|| {
                bad(format!(
                    "model_type '{t}' is not supported: octet runs llama, mistral, qwen2, qwen3"
                ))
            }),
    }
}

fn refuse_true(f: &mut Fields, key: &str) -> Result<()> {
    match f.bool(key)? {
        Some(true) => Err(bad(format!("{key} true is not supported (only false)"))),
        _ => Ok(()),
    }
}

fn check_partial_rotary(p: Option<f64>, field: &str) -> Result<()> {
    match p {
        Some(p) if p != 1.0 => Err(bad(format!(
            "{field} {p} is not supported (RoPE over the whole head only: 1)"
        ))),
        _ => Ok(()),
    }
}

/// A sliding window masks keys farther back than the window; octet's
/// attention sees the whole context, which equals it only when no context
/// can be longer than the window.
fn check_sliding(f: &mut Fields, arch: Architecture, max_pos: usize) -> Result<()> {
    let window = f.usize("sliding_window")?;
    let use_flag = f.bool("use_sliding_window")?;
    let mut sliding_layers = false;
    if let Some(v) = f.take("layer_types") {
        let Value::Array(a) = &v else {
            return Err(bad(format!("layer_types must be a list, got {v}")));
        };
        for t in a {
            match t.as_str() {
                Some("full_attention") => {}
                Some("sliding_attention") => sliding_layers = true,
                _ => {
                    return Err(bad(format!(
                        "layer_types entry {t} is not supported (full_attention, or sliding_attention with a window no shorter than max_position_embeddings)"
                    )))
                }
            }
        }
    }
    let in_use = match arch {
        // transformers' Llama has no sliding window and reads neither field.
        Architecture::Llama => false,
        Architecture::Mistral => true,
        Architecture::Qwen2 | Architecture::Qwen3 => use_flag == Some(true) || sliding_layers,
    };
    match window {
        Some(w) if in_use && w < max_pos => Err(bad(format!(
            "sliding_window {w} is not supported: octet attends over the whole context, which \
             equals a sliding window only when max_position_embeddings ({max_pos}) is at most \
             the window"
        ))),
        _ => Ok(()),
    }
}

/// `(rope_theta, rope_scaling)` from transformers 5's `rope_parameters` or
/// transformers 4's `rope_theta` and `rope_scaling`; where both spellings are
/// present they must agree. A `default` kind is `None`.
fn rope(f: &mut Fields) -> Result<(f64, Option<RopeScaling>)> {
    let theta4 = f.f64("rope_theta")?;
    let scaling4 = f
        .take("rope_scaling")
        .map(|v| rope_dict(&v, "rope_scaling"))
        .transpose()?;
    let params5 = f
        .take("rope_parameters")
        .map(|v| rope_dict(&v, "rope_parameters"))
        .transpose()?;
    let (theta, scaling) = match (params5, scaling4) {
        (Some((t5, s5)), s4) => {
            if let Some((_, s4)) = s4 {
                if s4 != s5 {
                    return Err(bad(format!(
                        "rope_scaling {s4:?} and rope_parameters {s5:?} disagree"
                    )));
                }
            }
            match (t5, theta4) {
                (Some(a), Some(b)) if a != b => {
                    return Err(bad(format!(
                        "rope_theta {b} and rope_parameters.rope_theta {a} disagree"
                    )))
                }
                (t5, t4) => (t5.or(t4), s5),
            }
        }
        (None, Some((t, s))) => (theta4.or(t), s),
        (None, None) => (theta4, None),
    };
    // transformers' default base for all four families.
    Ok((theta.unwrap_or(10000.0), scaling))
}

/// One RoPE dictionary (`rope_scaling` or `rope_parameters`, named `field`
/// in errors): its `rope_theta` if it holds one, and its stretch.
fn rope_dict(v: &Value, field: &str) -> Result<(Option<f64>, Option<RopeScaling>)> {
    let Value::Object(obj) = v else {
        return Err(bad(format!("{field} must be an object, got {v}")));
    };
    let mut f = Fields(obj.clone());
    let kind = match (f.string("rope_type"), f.string("type")) {
        (Ok(Some(t)), _) | (Ok(None), Ok(Some(t))) => t,
        (Ok(None), Ok(None)) => "default".to_string(),
        (Err(e), _) | (_, Err(e)) => return Err(bad(format!("{field}: {e}"))),
    };
    let num = |f: &mut Fields, key: &str| -> Result<Option<f64>> {
        f.f64(key).map_err(|e| bad(format!("{field}: {e}")))
    };
    let theta = num(&mut f, "rope_theta")?;
    check_partial_rotary(
        num(&mut f, "partial_rotary_factor")?,
        &format!("{field}.partial_rotary_factor"),
    )?;
    let scaling = match kind.as_str() {
        // The stretch fields of another kind mean nothing to `default`.
        "default" => None,
        "linear" | "llama3" => {
            let s = RopeScaling {
                factor: num(&mut f, "factor")?,
                low_freq_factor: num(&mut f, "low_freq_factor")?,
                high_freq_factor: num(&mut f, "high_freq_factor")?,
                original_max_position_embeddings: f
                    .usize("original_max_position_embeddings")
                    .map_err(|e| bad(format!("{field}: {e}")))?,
                rope_type: kind,
            };
            if let Some(k) = f.0.keys().next() {
                return Err(bad(format!(
                    "{field}.{k} is not supported for rope_type {}",
                    s.rope_type
                )));
            }
            Some(s)
        }
        other => {
            return Err(bad(format!(
                "{field} rope_type '{other}' is not supported (default, linear, llama3)"
            )))
        }
    };
    Ok((theta, scaling))
}

/// `config.json` for `cfg` with weights stored as `dtype`, in the
/// transformers 4 spelling (read by transformers 4 and 5), under the
/// architecture its switches name ([`Architecture::of`]).
pub fn to_json(cfg: &LlamaConfig, dtype: DType) -> Value {
    let mut o = fields(cfg);
    if let Some(m) = o.as_object_mut() {
        let name = match dtype {
            DType::Bf16 => "bfloat16",
            DType::F64 => "float64",
            DType::F32 => "float32",
        };
        m.insert("torch_dtype".into(), name.into());
    }
    o
}

/// The fields of [`to_json`] but the dtype.
fn fields(cfg: &LlamaConfig) -> Value {
    let arch = Architecture::of(cfg);
    let mut o = json!({
        "architectures": [arch.class_name()],
        "model_type": arch.model_type(),
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_hidden_layers,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim(),
        "max_position_embeddings": cfg.max_position_embeddings,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "hidden_act": "silu",
        "attention_dropout": 0.0,
    });
    let Some(m) = o.as_object_mut() else {
        return o;
    };
    if let Some(rs) = &cfg.rope_scaling {
        let mut s = Map::new();
        s.insert("rope_type".into(), rs.rope_type.clone().into());
        let fields = [
            ("factor", rs.factor),
            ("low_freq_factor", rs.low_freq_factor),
            ("high_freq_factor", rs.high_freq_factor),
        ];
        for (k, v) in fields {
            if let Some(v) = v {
                s.insert(k.into(), v.into());
            }
        }
        if let Some(n) = rs.original_max_position_embeddings {
            s.insert("original_max_position_embeddings".into(), n.into());
        }
        m.insert("rope_scaling".into(), Value::Object(s));
    }
    if arch != Architecture::Qwen2 {
        m.insert("attention_bias".into(), cfg.qkv_bias.into());
    }
    o
}

/// A config inside octet's own settings (`TrainConfig::model_config`):
/// the `config.json` form, where a field the reader does not know is an
/// error (there, it is a misspelling rather than another tool's field).
impl TryFrom<Value> for LlamaConfig {
    type Error = Error;

    fn try_from(v: Value) -> Result<LlamaConfig> {
        let hf = parse_value(v)?;
        match hf.ignored.as_slice() {
            [] => Ok(hf.config),
            unknown => Err(bad(format!(
                "unknown fields {}: a model config takes config.json's fields",
                unknown.join(", ")
            ))),
        }
    }
}

impl From<LlamaConfig> for Value {
    fn from(cfg: LlamaConfig) -> Value {
        fields(&cfg)
    }
}

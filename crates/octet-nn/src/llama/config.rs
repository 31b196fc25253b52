//! The model's configuration: sizes, RoPE and its scaling, the family switches,
//! presets and validation.

use super::*;

/// Largest `vocab_size`, `hidden_size` and `intermediate_size` that
/// [`LlamaConfig::validate`] accepts: 2^24 (16,777,216), far above any
/// released Llama-style model (vocabularies reach ~256K, MLP widths ~54K).
pub const MAX_DIM: usize = 1 << 24;

/// Largest `num_hidden_layers` that [`LlamaConfig::validate`] accepts (2^16;
/// released models have at most a few hundred blocks).
pub const MAX_LAYERS: usize = 1 << 16;

/// Largest `max_position_embeddings` that [`LlamaConfig::validate`] accepts:
/// 2^21 = 2,097,152 positions (the longest released contexts are ~1M). The
/// training `--seq` is bound by it too.
pub const MAX_POSITIONS: usize = 1 << 21;

/// Largest rotary table, `max_position_embeddings * head_dim / 2` entries
/// (2^28: two f64 tables of 2 GiB each; a 2M-position context with
/// `head_dim` 256 fits).
pub const MAX_ROPE_ENTRIES: usize = 1 << 28;

/// Largest parameter count that [`LlamaConfig::validate`] accepts: 2^40
/// (about 1.1 trillion), counted with overflow checks.
pub const MAX_PARAMS: usize = 1 << 40;

/// Model dimensions, with Hugging Face `config.json` field names where
/// they have one, and the switches that make the one decoder each family:
///
/// | family | `qkv_bias` | `o_bias` | `qk_norm` | `head_dim` |
/// |---|---|---|---|---|
/// | Llama, Mistral, SmolLM | no (Llama's `attention_bias`: yes) | as `qkv_bias` | no | `C / Hq` unless given |
/// | Qwen2, Qwen2.5 | yes | no | no | `C / Hq` unless given |
/// | Qwen3 | `attention_bias` | as `qkv_bias` | yes | given (128 by default) |
///
/// Read from and written to `config.json` by [`crate::hf_config`], whose
/// form serde uses too.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "serde_json::Value", into = "serde_json::Value")]
pub struct LlamaConfig {
    /// Vocabulary size `V`.
    pub vocab_size: usize,
    /// Model width `C`.
    pub hidden_size: usize,
    /// MLP width `F`.
    pub intermediate_size: usize,
    /// Blocks `L`.
    pub num_hidden_layers: usize,
    /// Query heads `Hq`.
    pub num_attention_heads: usize,
    /// Key/value heads `Hkv` (divides `Hq`).
    pub num_key_value_heads: usize,
    /// Longest sequence the rotary tables cover.
    pub max_position_embeddings: usize,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f64,
    /// RoPE base.
    pub rope_theta: f64,
    /// Whether the LM head shares the embedding matrix (then there is no `lm_head.weight`).
    pub tie_word_embeddings: bool,
    /// Hugging Face's `rope_scaling`: how the rotary frequencies are
    /// stretched for long contexts (`None`: plain `rope_theta`).
    pub rope_scaling: Option<RopeScaling>,
    /// Width `D` of a head, when the config gives one (Qwen3's differs from
    /// `C / Hq`); `None`: `hidden_size / num_attention_heads`. See
    /// [`LlamaConfig::head_dim`].
    pub head_dim: Option<usize>,
    /// q, k and v projections add a bias `(Hq*D)`, `(Hkv*D)`, `(Hkv*D)`
    /// (`self_attn.{q,k,v}_proj.bias`).
    pub qkv_bias: bool,
    /// The o projection adds a bias `(C)` (`self_attn.o_proj.bias`).
    pub o_bias: bool,
    /// Each head of q and k goes through an RMSNorm of width `D` after its
    /// projection and before RoPE (`self_attn.q_norm.weight`,
    /// `self_attn.k_norm.weight`, both `(D)`).
    pub qk_norm: bool,
}

/// Hugging Face's `rope_scaling` entry of `config.json`, for the kinds this
/// model implements ([`LlamaConfig::rope_inv_freq`]): `default` (none),
/// `linear` (every frequency divided by `factor`) and `llama3` (Llama 3.1 and
/// later: long wavelengths divided by `factor`, short ones kept, a smooth
/// blend between). Any other kind is refused by [`LlamaConfig::validate`].
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RopeScaling {
    /// `default`, `linear` or `llama3` (older configs call the key `type`).
    #[serde(alias = "type")]
    pub rope_type: String,
    /// How much longer the context is than the one trained (linear, llama3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub factor: Option<f64>,
    /// llama3: wavelengths above `original_max_position_embeddings / low_freq_factor` are divided by `factor`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub low_freq_factor: Option<f64>,
    /// llama3: wavelengths below `original_max_position_embeddings / high_freq_factor` are kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub high_freq_factor: Option<f64>,
    /// llama3: the context length of the model before scaling.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub original_max_position_embeddings: Option<usize>,
}

/// A `rope_scaling` this model implements, with the numbers its kind needs:
/// `default`; `linear` with a finite `factor` above 0; `llama3` with a
/// `factor`, `low_freq_factor` below `high_freq_factor` (all finite, above
/// 0) and an `original_max_position_embeddings` above 0.
pub(super) fn check_rope_scaling(rs: &RopeScaling) -> Result<()> {
    let positive = |name: &str, v: Option<f64>| match v {
        Some(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(Error::Config(format!(
            "rope_scaling {} needs {name} finite and above 0, got {v:?}",
            rs.rope_type
        ))),
    };
    match rs.rope_type.as_str() {
        "default" => Ok(()),
        "linear" => positive("factor", rs.factor).map(|_| ()),
        "llama3" => {
            positive("factor", rs.factor)?;
            let low = positive("low_freq_factor", rs.low_freq_factor)?;
            let high = positive("high_freq_factor", rs.high_freq_factor)?;
            if low >= high {
                return Err(Error::Config(format!(
                    "rope_scaling llama3 needs low_freq_factor {low} below high_freq_factor {high}"
                )));
            }
            match rs.original_max_position_embeddings {
                Some(n) if n > 0 => Ok(()),
                n => Err(Error::Config(format!(
                    "rope_scaling llama3 needs original_max_position_embeddings above 0, got {n:?}"
                ))),
            }
        }
        other => Err(Error::Config(format!(
            "rope_scaling type '{other}' is not supported (default, linear, llama3)"
        ))),
    }
}

impl LlamaConfig {
    /// Named presets: `tiny` (tests), `small` (the CPU default, ~0.8M
    /// parameters), `medium`, `1b` (the GPU target shape) and `8b` (Llama 3
    /// 8B's shape: 32 blocks of width 4096, FFN 14336, 32 query and 8
    /// key-value heads, a 128,256-token vocabulary, RoPE base 500,000).
    pub fn preset(name: &str) -> Result<LlamaConfig> {
        let (c, f, l, h, kv, t) = match name {
            "tiny" => (32, 64, 2, 4, 2, 64),
            "small" => (128, 352, 4, 4, 2, 256),
            "medium" => (512, 1408, 8, 8, 4, 1024),
            "1b" => (2048, 5632, 16, 16, 16, 2048),
            "8b" => (4096, 14336, 32, 32, 8, 8192),
            other => {
                return Err(Error::Config(format!(
                    "unknown model preset '{other}' (tiny, small, medium, 1b, 8b)"
                )))
            }
        };
        let (vocab_size, rope_theta) = match name {
            "8b" => (128_256, 500_000.0),
            _ => (256, 10_000.0),
        };
        let cfg = LlamaConfig {
            vocab_size,
            hidden_size: c,
            intermediate_size: f,
            num_hidden_layers: l,
            num_attention_heads: h,
            num_key_value_heads: kv,
            max_position_embeddings: t,
            rms_norm_eps: 1e-5,
            rope_theta,
            tie_word_embeddings: false,
            rope_scaling: None,
            head_dim: None,
            qkv_bias: false,
            o_bias: false,
            qk_norm: false,
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// The rotary inverse frequencies, `D / 2` of them: `rope_theta^(-2i / D)`,
    /// then `rope_scaling`'s stretch as Hugging Face's `transformers` computes
    /// it (`linear`: divided by `factor`; `llama3`: a wavelength `2 pi / f`
    /// above `original / low_freq_factor` divided by `factor`, one below
    /// `original / high_freq_factor` kept, and between them
    /// `(1 - s) f / factor + s f` with `s = (original / wavelength -
    /// low_freq_factor) / (high_freq_factor - low_freq_factor)`). The scaling
    /// is checked by [`LlamaConfig::validate`]; an unchecked unknown kind
    /// leaves the frequencies plain.
    pub fn rope_inv_freq(&self) -> Vec<f64> {
        let d = self.head_dim();
        let plain = (0..d / 2).map(|i| self.rope_theta.powf(-2.0 * i as f64 / d as f64));
        let Some(rs) = &self.rope_scaling else {
            return plain.collect();
        };
        let factor = rs.factor.unwrap_or(1.0);
        match rs.rope_type.as_str() {
            "linear" => plain.map(|f| f / factor).collect(),
            "llama3" => {
                let (low, high) = (
                    rs.low_freq_factor.unwrap_or(1.0),
                    rs.high_freq_factor.unwrap_or(1.0),
                );
                let original = rs.original_max_position_embeddings.unwrap_or(1) as f64;
                let (low_wavelen, high_wavelen) = (original / low, original / high);
                plain
                    .map(|f| {
                        let wavelen = 2.0 * std::f64::consts::PI / f;
                        if wavelen < high_wavelen {
                            f
                        } else if wavelen > low_wavelen {
                            f / factor
                        } else {
                            let s = (original / wavelen - low) / (high - low);
                            (1.0 - s) * f / factor + s * f
                        }
                    })
                    .collect()
            }
            _ => plain.collect(),
        }
    }

    /// Head dimension `D`: `head_dim` when given, else `C / Hq`.
    pub fn head_dim(&self) -> usize {
        self.head_dim
            .unwrap_or(self.hidden_size / self.num_attention_heads.max(1))
    }

    /// Width of the attention, `Hq * D` (q's and the o projection's input
    /// features; `C` unless `head_dim` says otherwise).
    pub fn attn_width(&self) -> usize {
        self.num_attention_heads * self.head_dim()
    }

    /// Width of keys and values, `Hkv * D`.
    pub fn kv_width(&self) -> usize {
        self.num_key_value_heads * self.head_dim()
    }

    /// Check the dimensions fit together and stay within the caps:
    /// `vocab_size`, `hidden_size`, `intermediate_size` at most [`MAX_DIM`],
    /// `num_hidden_layers` at most [`MAX_LAYERS`], `max_position_embeddings`
    /// between 1 and [`MAX_POSITIONS`], the rotary table at most
    /// [`MAX_ROPE_ENTRIES`] and the parameter count at most [`MAX_PARAMS`];
    /// `rms_norm_eps` finite and not negative, `rope_theta` finite and positive.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::Config(m));
        if self.vocab_size == 0
            || self.hidden_size == 0
            || self.num_hidden_layers == 0
            || self.intermediate_size == 0
        {
            return bad(format!("zero-sized dimension in {self:?}"));
        }
        for (field, v, max) in [
            ("vocab_size", self.vocab_size, MAX_DIM),
            ("hidden_size", self.hidden_size, MAX_DIM),
            ("intermediate_size", self.intermediate_size, MAX_DIM),
            ("num_hidden_layers", self.num_hidden_layers, MAX_LAYERS),
            (
                "max_position_embeddings",
                self.max_position_embeddings,
                MAX_POSITIONS,
            ),
        ] {
            if v > max {
                return bad(format!("{field} {v} exceeds the limit of {max}"));
            }
        }
        if self.max_position_embeddings == 0 {
            return bad("max_position_embeddings must be at least 1".into());
        }
        if !(self.rms_norm_eps.is_finite() && self.rms_norm_eps >= 0.0) {
            return bad(format!(
                "rms_norm_eps {} must be finite and not negative",
                self.rms_norm_eps
            ));
        }
        if let Some(rs) = &self.rope_scaling {
            check_rope_scaling(rs)?;
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 0.0) {
            return bad(format!(
                "rope_theta {} must be finite and positive",
                self.rope_theta
            ));
        }
        if self.num_attention_heads == 0 {
            return bad("num_attention_heads must be at least 1".into());
        }
        match self.head_dim {
            Some(d) if d == 0 || d > MAX_DIM => {
                return bad(format!("head_dim {d} must be between 1 and {MAX_DIM}"));
            }
            Some(_) => {}
            None if !self.hidden_size.is_multiple_of(self.num_attention_heads) => {
                return bad(format!(
                    "hidden_size {} is not a multiple of {} heads (give head_dim to set the head width)",
                    self.hidden_size, self.num_attention_heads
                ));
            }
            None => {}
        }
        if self.num_attention_heads > MAX_DIM
            || self.num_attention_heads.saturating_mul(self.head_dim()) > MAX_DIM
        {
            return bad(format!(
                "num_attention_heads {} x head_dim {} exceeds the limit of {MAX_DIM}",
                self.num_attention_heads,
                self.head_dim()
            ));
        }
        // Each pattern is one family's (see the table on [`LlamaConfig`]):
        // only these have a config.json form to be saved in.
        match (self.qkv_bias, self.o_bias, self.qk_norm) {
            (false, false, _) | (true, true, _) | (true, false, false) => {}
            (q, o, n) => {
                return bad(format!(
                    "qkv_bias {q}, o_bias {o}, qk_norm {n} is no family's attention (Llama: \
                     attention_bias on all four projections; Qwen2: q, k, v only; Qwen3: \
                     qk_norm with attention_bias on all four or none)"
                ))
            }
        }
        if self.num_key_value_heads == 0
            || !self
                .num_attention_heads
                .is_multiple_of(self.num_key_value_heads)
        {
            return bad(format!(
                "{} query heads are not a multiple of {} key/value heads",
                self.num_attention_heads, self.num_key_value_heads
            ));
        }
        if !self.head_dim().is_multiple_of(2) {
            return bad(format!(
                "head_dim {} must be even for rotary embeddings",
                self.head_dim()
            ));
        }
        let rope = self
            .max_position_embeddings
            .saturating_mul(self.head_dim() / 2);
        if rope > MAX_ROPE_ENTRIES {
            return bad(format!(
                "max_position_embeddings {} x head_dim {} / 2 = {rope} rotary table entries exceed the limit of {MAX_ROPE_ENTRIES}",
                self.max_position_embeddings,
                self.head_dim()
            ));
        }
        match self.checked_num_params() {
            Some(n) if n <= MAX_PARAMS => Ok(()),
            n => bad(format!(
                "{} parameters exceed the limit of {MAX_PARAMS} (vocab_size {}, hidden_size {}, intermediate_size {}, num_hidden_layers {})",
                n.map_or_else(|| "more than 2^64".to_string(), |n| n.to_string()),
                self.vocab_size,
                self.hidden_size,
                self.intermediate_size,
                self.num_hidden_layers
            )),
        }
    }

    /// Parameter count (saturating at `usize::MAX` for a config that
    /// [`LlamaConfig::validate`] rejects).
    pub fn num_params(&self) -> usize {
        self.checked_num_params().unwrap_or(usize::MAX)
    }

    /// Parameter count, `None` where it overflows `usize`.
    pub(super) fn checked_num_params(&self) -> Option<usize> {
        let (c, f, v) = (self.hidden_size, self.intermediate_size, self.vocab_size);
        let kv = self.num_key_value_heads.checked_mul(self.head_dim())?;
        let a = self.num_attention_heads.checked_mul(self.head_dim())?;
        let ca = c.checked_mul(a)?;
        let ckv = c.checked_mul(kv)?;
        let cf = c.checked_mul(f)?;
        let mut block = (2 * c as u128) + 2 * ca as u128 + 2 * ckv as u128 + 3 * cf as u128;
        if self.qkv_bias {
            block += a as u128 + 2 * kv as u128;
        }
        if self.o_bias {
            block += c as u128;
        }
        if self.qk_norm {
            block += 2 * self.head_dim() as u128;
        }
        let heads: u128 = if self.tie_word_embeddings { 1 } else { 2 };
        let total = heads * v.checked_mul(c)? as u128
            + (self.num_hidden_layers as u128).checked_mul(block)?
            + c as u128;
        usize::try_from(total).ok()
    }
}

//! A Llama-style decoder with explicit forward and backward.
//!
//! token embedding -> L x [RMSNorm -> q,k,v (GQA) -> RoPE -> causal attention
//! -> o, residual; RMSNorm -> gate, up -> SwiGLU -> down, residual] -> RMSNorm
//! -> LM head -> cross-entropy. Every matrix product of the blocks is a
//! [`Linear`] under the model's recipe; the embedding and the LM head stay in
//! high precision (as Transformer Engine and torchao users keep them).
//! Parameters carry Hugging Face Llama names, so checkpoints round-trip.

pub mod cuda;

use crate::attention::{attention_backward, attention_forward, AttentionSaved};
use crate::embedding::Embedding;
use crate::linear::{Linear, LinearSaved};
use crate::lora::{Adapter, Base, BaseFormat, Compute, Dropout, LoraLinear, LoraSaved};
use crate::loss::cross_entropy;
use crate::norm::{RmsNorm, RmsNormSaved};
use crate::rope::Rope;
use crate::swiglu::{swiglu_backward, swiglu_forward, SwigluSaved};
use crate::{Error, Result};
use octet_fp8::{DelayedState, Recipe, Role, Telemetry};
use octet_tensor::{alloc_capacity, alloc_collect, alloc_vec, cpu, DType, Tensor};
use rand::SeedableRng;
use rand_distr::{Distribution, StandardNormal};
use std::borrow::Cow;
use std::collections::HashMap;

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
fn check_rope_scaling(rs: &RopeScaling) -> Result<()> {
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
    fn checked_num_params(&self) -> Option<usize> {
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

/// A block's matrix: a trainable [`Linear`], or a frozen base with an
/// optional LoRA adapter ([`LoraLinear`]).
#[derive(Clone, Debug)]
pub enum Proj {
    /// Full training.
    Full(Linear),
    /// Frozen base (FP8 or bf16) with an optional adapter.
    Lora(LoraLinear),
}

/// What a [`Proj`] keeps for backward.
#[derive(Clone, Debug)]
pub enum ProjSaved {
    /// Of a [`Linear`].
    Full(LinearSaved),
    /// Of a [`LoraLinear`].
    Lora(LoraSaved),
}

impl ProjSaved {
    fn bytes(&self) -> usize {
        match self {
            ProjSaved::Full(s) => s.bytes(),
            ProjSaved::Lora(s) => s.bytes(),
        }
    }
}

/// A [`Proj`]'s gradients: the input's, and its trainable tensors' in
/// parameter order (`[weight]`, `[weight, bias]` or `[lora_A, lora_B]`;
/// none when frozen).
struct ProjGrads {
    d_input: Option<Tensor>,
    params: Vec<Tensor>,
}

impl Proj {
    /// Forward; `dropout` masks a LoRA adapter's input (ignored by a full layer).
    fn forward(
        &mut self,
        x: &Tensor,
        input_requires_grad: bool,
        dropout: Option<Dropout>,
    ) -> Result<(Tensor, ProjSaved)> {
        Ok(match self {
            Proj::Full(l) => {
                let (y, s) = l.forward(x, input_requires_grad)?;
                (y, ProjSaved::Full(s))
            }
            Proj::Lora(l) => {
                let (y, s) = l.forward_with(x, input_requires_grad, dropout)?;
                (y, ProjSaved::Lora(s))
            }
        })
    }

    fn backward(&mut self, saved: ProjSaved, dy: &Tensor) -> Result<ProjGrads> {
        match (self, saved) {
            (Proj::Full(l), ProjSaved::Full(s)) => {
                let g = l.backward(s, dy)?;
                Ok(ProjGrads {
                    d_input: g.d_input,
                    params: g.d_weight.into_iter().chain(g.d_bias).collect(),
                })
            }
            (Proj::Lora(l), ProjSaved::Lora(s)) => {
                let g = l.backward(s, dy)?;
                Ok(ProjGrads {
                    d_input: g.d_input,
                    params: g.d_a.into_iter().chain(g.d_b).collect(),
                })
            }
            _ => Err(Error::Shape("saved state of another kind of layer".into())),
        }
    }

    fn set_grad_calls(&mut self, n: u64) {
        match self {
            Proj::Full(l) => l.set_grad_calls(n),
            Proj::Lora(l) => l.set_grad_calls(n),
        }
    }

    /// The trainable tensors of a full layer in parameter order: the weight,
    /// then the bias if it has one (none for a LoRA layer, whose base and
    /// bias are frozen).
    fn tensors(&self) -> Vec<&Tensor> {
        match self {
            Proj::Full(l) => std::iter::once(&l.weight).chain(&l.bias).collect(),
            Proj::Lora(_) => Vec::new(),
        }
    }

    fn tensors_mut(&mut self) -> Vec<&mut Tensor> {
        match self {
            Proj::Full(l) => std::iter::once(&mut l.weight)
                .chain(l.bias.as_mut())
                .collect(),
            Proj::Lora(_) => Vec::new(),
        }
    }

    /// The weight as a dense f32 matrix (a LoRA layer's merged with its
    /// adapter) and the bias.
    fn dense(&self) -> Result<(Tensor, Option<Tensor>)> {
        Ok(match self {
            Proj::Full(l) => (l.weight.try_clone()?, try_clone_opt(&l.bias)?),
            Proj::Lora(l) => (l.merged()?, try_clone_opt(&l.bias)?),
        })
    }

    /// The trainable [`Linear`], if this is one.
    pub fn linear(&self) -> Option<&Linear> {
        match self {
            Proj::Full(l) => Some(l),
            Proj::Lora(_) => None,
        }
    }

    fn linear_mut(&mut self) -> Option<&mut Linear> {
        match self {
            Proj::Full(l) => Some(l),
            Proj::Lora(_) => None,
        }
    }
}

/// LoRA settings of [`Llama::into_lora`].
#[derive(Clone, Debug, PartialEq)]
pub struct LoraSpec {
    /// Adapter rank `r`.
    pub rank: usize,
    /// `alpha` (the adapter output is scaled by `alpha / r`).
    pub alpha: f64,
    /// Targeted projections, by short name: `q, k, v, o, gate, up, down`.
    pub targets: Vec<String>,
    /// How the frozen base matrices are stored.
    pub base: BaseFormat,
    /// How their forward products run.
    pub compute: Compute,
    /// Input/gradient quantization under FP8 compute, and the backward mode.
    pub recipe: Recipe,
    /// Seed of the adapters' initialisation (and of the dropout masks).
    pub seed: u64,
    /// LoRA dropout on the adapters' inputs in training forwards
    /// (PEFT's `lora_dropout`; `0`: none). See [`Dropout`].
    pub dropout: f64,
}

/// Short names of a block's projections, in order, with their Hugging Face module paths.
pub const PROJ_NAMES: [(&str, &str); 7] = [
    ("q", "self_attn.q_proj"),
    ("k", "self_attn.k_proj"),
    ("v", "self_attn.v_proj"),
    ("o", "self_attn.o_proj"),
    ("gate", "mlp.gate_proj"),
    ("up", "mlp.up_proj"),
    ("down", "mlp.down_proj"),
];

/// One decoder block.
#[derive(Clone, Debug)]
pub struct Block {
    attn_norm: RmsNorm,
    q: Proj,
    k: Proj,
    v: Proj,
    o: Proj,
    /// Per-head norms of q and k, width `D` (`qk_norm`: Qwen3).
    q_norm: Option<RmsNorm>,
    k_norm: Option<RmsNorm>,
    mlp_norm: RmsNorm,
    gate: Proj,
    up: Proj,
    down: Proj,
}

impl Block {
    /// Every tensor under full training, in [`block_param_shapes`] order.
    fn tensors(&self) -> Vec<&Tensor> {
        let mut out = vec![&self.attn_norm.weight];
        for p in [&self.q, &self.k, &self.v, &self.o] {
            out.extend(p.tensors());
        }
        out.extend(self.q_norm.iter().chain(&self.k_norm).map(|n| &n.weight));
        out.push(&self.mlp_norm.weight);
        for p in [&self.gate, &self.up, &self.down] {
            out.extend(p.tensors());
        }
        out
    }

    fn tensors_mut(&mut self) -> Vec<&mut Tensor> {
        let Block {
            attn_norm,
            q,
            k,
            v,
            o,
            q_norm,
            k_norm,
            mlp_norm,
            gate,
            up,
            down,
        } = self;
        let mut out = vec![&mut attn_norm.weight];
        for p in [q, k, v, o] {
            out.extend(p.tensors_mut());
        }
        out.extend(
            q_norm
                .iter_mut()
                .chain(k_norm.iter_mut())
                .map(|n| &mut n.weight),
        );
        out.push(&mut mlp_norm.weight);
        for p in [gate, up, down] {
            out.extend(p.tensors_mut());
        }
        out
    }

    /// Every tensor in [`block_param_shapes`] order, each LoRA matrix merged
    /// with its adapter (f32).
    fn dense(&self) -> Result<Vec<Tensor>> {
        let mut out = vec![self.attn_norm.weight.try_clone()?];
        let proj = |out: &mut Vec<Tensor>, p: &Proj| -> Result<()> {
            let (w, b) = p.dense()?;
            out.push(w);
            out.extend(b);
            Ok(())
        };
        for p in [&self.q, &self.k, &self.v, &self.o] {
            proj(&mut out, p)?;
        }
        for n in self.q_norm.iter().chain(&self.k_norm) {
            out.push(n.weight.try_clone()?);
        }
        out.push(self.mlp_norm.weight.try_clone()?);
        for p in [&self.gate, &self.up, &self.down] {
            proj(&mut out, p)?;
        }
        Ok(out)
    }

    fn projs(&self) -> [&Proj; 7] {
        [
            &self.q, &self.k, &self.v, &self.o, &self.gate, &self.up, &self.down,
        ]
    }

    fn projs_mut(&mut self) -> [&mut Proj; 7] {
        [
            &mut self.q,
            &mut self.k,
            &mut self.v,
            &mut self.o,
            &mut self.gate,
            &mut self.up,
            &mut self.down,
        ]
    }
}

/// What a block's backward reads.
#[derive(Clone, Debug)]
pub struct BlockSaved {
    /// `(B, T, Hq, D)` of the attention output.
    attn_shape: [usize; 4],
    attn_norm: RmsNormSaved,
    q: ProjSaved,
    k: ProjSaved,
    v: ProjSaved,
    /// Of the per-head q and k norms (`qk_norm`).
    q_norm: Option<RmsNormSaved>,
    k_norm: Option<RmsNormSaved>,
    attn: AttentionSaved,
    o: ProjSaved,
    mlp_norm: RmsNormSaved,
    gate: ProjSaved,
    up: ProjSaved,
    swiglu: SwigluSaved,
    down: ProjSaved,
}

impl BlockSaved {
    /// Bytes kept for backward.
    pub fn bytes(&self) -> usize {
        self.attn_norm.bytes()
            + self.q.bytes()
            + self.k.bytes()
            + self.v.bytes()
            + self.q_norm.as_ref().map_or(0, RmsNormSaved::bytes)
            + self.k_norm.as_ref().map_or(0, RmsNormSaved::bytes)
            + self.attn.bytes()
            + self.o.bytes()
            + self.mlp_norm.bytes()
            + self.gate.bytes()
            + self.up.bytes()
            + self.swiglu.bytes()
            + self.down.bytes()
    }
}

/// The model.
#[derive(Clone, Debug)]
pub struct Llama {
    /// Dimensions.
    pub cfg: LlamaConfig,
    embed: Embedding,
    blocks: Vec<Block>,
    norm: RmsNorm,
    lm_head: Linear,
    rope: Rope,
    /// LoRA mode: the base is frozen, only adapters train.
    lora: bool,
    /// LoRA dropout `(p, seed)` of training forwards (`None`: off).
    dropout: Option<(f64, u64)>,
    /// The training forward the next dropout masks belong to (see
    /// [`Llama::set_dropout_round`]).
    dropout_round: u64,
    /// Blocks whose activations are recomputed, from the first (see [`Llama::set_recompute`]).
    recompute: usize,
}

/// What the model's backward reads.
#[derive(Clone, Debug)]
pub struct LlamaSaved {
    tokens: Vec<u32>,
    blocks: BlocksSaved,
    norm: RmsNormSaved,
    head: HeadSaved,
}

/// The LM head and loss's part of the backward, computed in the forward
/// ([`head_loss`]): the gradient of the final norm's output `(B*T, C)` and
/// the head weight's gradient `(V, C)` (`None` for a frozen head). No
/// `(B*T, V)` tensor outlives its chunk.
#[derive(Clone, Debug)]
struct HeadSaved {
    dh: Tensor,
    d_weight: Option<Tensor>,
}

impl HeadSaved {
    /// Bytes held.
    fn bytes(&self) -> usize {
        self.dh.bytes() + self.d_weight.as_ref().map_or(0, Tensor::bytes)
    }
}

/// Logits a chunk of the fused LM head and loss holds at most (16 MiB of
/// f32, twice over with their gradient): `max(1, HEAD_CHUNK / V)` rows.
pub const HEAD_CHUNK: usize = 1 << 22;

/// A copy of an optional tensor (a bias), or [`octet_tensor::Error::Alloc`].
fn try_clone_opt(t: &Option<Tensor>) -> Result<Option<Tensor>> {
    Ok(t.as_ref().map(Tensor::try_clone).transpose()?)
}

/// An empty buffer with room for the `(rows, cols)` matrix `what`, or
/// [`octet_tensor::Error::Alloc`] naming it when the allocator cannot
/// provide it: every copy of the head's helpers ([`rows`], [`stack_rows`])
/// is made in one.
fn row_buffer<T>(rows: usize, cols: usize, what: &str) -> Result<Vec<T>> {
    let n = rows
        .checked_mul(cols)
        .ok_or_else(|| Error::Shape(format!("{what}: ({rows}, {cols}) overflows usize")))?;
    Ok(alloc_capacity(n, format_args!("{what} ({rows}, {cols})"))?)
}

/// Rows `r0..r1` of a 2-D tensor, in its dtype; [`octet_tensor::Error::Alloc`]
/// when the copy cannot be allocated.
fn rows(t: &Tensor, r0: usize, r1: usize) -> Result<Tensor> {
    let (m, c) = t.dims2()?;
    if r0 > r1 || r1 > m {
        return Err(Error::Shape(format!(
            "rows {r0}..{r1} of a matrix of {m} rows"
        )));
    }
    let shape = [r1 - r0, c];
    fn copy<T: Copy>(v: Option<&[T]>, (r0, r1): (usize, usize), c: usize) -> Result<Vec<T>> {
        let src = v
            .and_then(|v| v.get(r0 * c..r1 * c))
            .ok_or_else(|| Error::Shape("rows of a tensor whose data does not fill it".into()))?;
        let mut out = row_buffer(r1 - r0, c, "a chunk of the LM head's input")?;
        out.extend_from_slice(src);
        Ok(out)
    }
    Ok(match t.dtype() {
        DType::F64 => Tensor::from_f64(&shape, copy(t.as_f64(), (r0, r1), c)?)?,
        DType::Bf16 => Tensor::from_bf16(&shape, copy(t.as_bf16(), (r0, r1), c)?)?,
        DType::F32 => Tensor::from_f32(&shape, copy(t.as_f32(), (r0, r1), c)?)?,
    })
}

/// Row blocks stacked into one tensor (all of one dtype and width);
/// [`octet_tensor::Error::Alloc`] when the result cannot be allocated.
fn stack_rows(parts: &[Tensor]) -> Result<Tensor> {
    let c = parts.first().map_or(Ok(0), |p| p.dims2().map(|d| d.1))?;
    let mut m = 0usize;
    for p in parts {
        let (r, pc) = p.dims2()?;
        if pc != c {
            return Err(Error::Shape(format!(
                "stacking rows of width {pc} under rows of width {c}"
            )));
        }
        m = m
            .checked_add(r)
            .ok_or_else(|| Error::Shape("stacked rows overflow usize".into()))?;
    }
    fn stack<'a, T: Copy + 'a>(
        parts: &'a [Tensor],
        (m, c): (usize, usize),
        data: impl Fn(&'a Tensor) -> Option<&'a [T]>,
    ) -> Result<Vec<T>> {
        let mut out = row_buffer(m, c, "the final norm's output gradient")?;
        for p in parts {
            let v =
                data(p).ok_or_else(|| Error::Shape("stacking rows of different dtypes".into()))?;
            out.extend_from_slice(v);
        }
        Ok(out)
    }
    Ok(match parts.first().map(Tensor::dtype) {
        Some(DType::F64) => Tensor::from_f64(&[m, c], stack(parts, (m, c), Tensor::as_f64)?)?,
        Some(DType::Bf16) => Tensor::from_bf16(&[m, c], stack(parts, (m, c), Tensor::as_bf16)?)?,
        _ => Tensor::from_f32(&[m, c], stack(parts, (m, c), Tensor::as_f32)?)?,
    })
}

/// `t * k` in its dtype; [`octet_tensor::Error::Alloc`] when the result
/// cannot be allocated.
fn scaled(t: &Tensor, k: f64) -> Result<Tensor> {
    let what = format_args!("a {:?} chunk of the logits gradient", t.shape());
    match t.as_f64() {
        Some(v) => Ok(Tensor::from_f64(
            t.shape(),
            alloc_collect(v.iter().map(|x| x * k), what)?,
        )?),
        None => Ok(Tensor::from_f32_as(
            t.shape(),
            alloc_collect(t.f32_values()?.iter().map(|x| x * k as f32), what)?,
            t.dtype(),
        )?),
    }
}

/// The LM head and the cross-entropy over `h (B*T, C)`, fused and chunked
/// over rows so that no `(B*T, V)` logits exist at once: each chunk's
/// logits, their loss and gradient, and the head's backward for them (the
/// input gradient's rows, the weight gradient summed over chunks). The mean
/// is over every counted target of the batch, so each chunk's loss and
/// gradient are weighted by its share of them; a batch that fits one chunk
/// computes exactly what the unchunked head and loss did.
fn head_loss(head: &mut Linear, h: &Tensor, targets: &[u32]) -> Result<(f64, HeadSaved)> {
    head_loss_in(head, h, targets, HEAD_CHUNK)
}

/// [`head_loss`] with chunks of at most `chunk` logits.
fn head_loss_in(
    head: &mut Linear,
    h: &Tensor,
    targets: &[u32],
    chunk: usize,
) -> Result<(f64, HeadSaved)> {
    let (m, _) = h.dims2()?;
    if targets.len() != m {
        return Err(Error::Shape(format!(
            "{} targets for {m} rows of logits",
            targets.len()
        )));
    }
    let v = head.out_features();
    let step = (chunk / v.max(1)).max(1);
    let counted = targets
        .iter()
        .filter(|&&t| t != crate::loss::IGNORE)
        .count();
    let chunks = m.max(1).div_ceil(step);
    let mut dh: Vec<Tensor> = alloc_capacity(chunks, "the LM head's input-gradient chunks")?;
    let (mut loss, mut d_weight) = (0.0, None::<Tensor>);
    for r0 in (0..m.max(1)).step_by(step) {
        let r1 = (r0 + step).min(m);
        let whole = r0 == 0 && r1 == m;
        // One chunk reads `h` itself; a chunk of it, a copy of its rows.
        let hc = match whole {
            true => Cow::Borrowed(h),
            false => Cow::Owned(rows(h, r0, r1)?),
        };
        let (logits, saved) = head.forward(&hc, true)?; // (rows, V)
        let tc = targets.get(r0..r1).ok_or_else(|| {
            Error::Shape(format!("{} targets for {m} rows of logits", targets.len()))
        })?;
        let (mut l, mut d_logits) = cross_entropy(&logits, tc)?;
        drop(logits);
        if !whole {
            let share = tc.iter().filter(|&&t| t != crate::loss::IGNORE).count() as f64
                / counted.max(1) as f64;
            l *= share;
            d_logits = scaled(&d_logits, share)?;
        }
        loss += l;
        let g = head.backward(saved, &d_logits)?;
        dh.push(
            g.d_input
                .ok_or_else(|| Error::Shape("lm_head gave no input gradient".into()))?,
        );
        d_weight = match (d_weight, g.d_weight) {
            (None, w) => w,
            (Some(a), Some(b)) => Some(cpu::add(&a, &b)?),
            (a, None) => a,
        };
    }
    let dh = match dh.len() {
        1 => dh
            .pop()
            .ok_or_else(|| Error::Shape("no head chunk".into()))?,
        _ => stack_rows(&dh)?,
    };
    Ok((loss, HeadSaved { dh, d_weight }))
}

/// What the blocks' backward reads: the saved tensors of the blocks that
/// keep them, and (activation recomputation) the input of each block whose
/// forward backward runs again: `inputs` for blocks `0..inputs.len()`,
/// `kept` for the rest.
#[derive(Clone, Debug)]
struct BlocksSaved {
    inputs: Vec<Tensor>,
    kept: Vec<BlockSaved>,
    /// Batch and sequence of the forward.
    bt: (usize, usize),
    /// The forward's dropout round.
    round: u64,
}

impl LlamaSaved {
    /// Bytes kept for backward (activations, FP8 copies, the head and loss's gradients).
    pub fn bytes(&self) -> usize {
        let blocks = self
            .blocks
            .kept
            .iter()
            .map(BlockSaved::bytes)
            .sum::<usize>()
            + self.blocks.inputs.iter().map(Tensor::bytes).sum::<usize>();
        blocks + self.norm.bytes() + self.head.bytes()
    }
}

/// `(name, shape)` of block `i`'s tensors in parameter order:
/// `input_layernorm`, q, k, v, o (each weight then its bias, where the
/// config has one), `q_norm`, `k_norm` (`qk_norm`),
/// `post_attention_layernorm`, gate, up, down.
fn block_param_shapes(cfg: &LlamaConfig, i: usize) -> Vec<(String, Vec<usize>)> {
    let (c, f) = (cfg.hidden_size, cfg.intermediate_size);
    let (a, kv, d) = (cfg.attn_width(), cfg.kv_width(), cfg.head_dim());
    let p = format!("model.layers.{i}");
    let mut out = vec![(format!("{p}.input_layernorm.weight"), vec![c])];
    for (m, n, k, bias) in [
        ("q_proj", a, c, cfg.qkv_bias),
        ("k_proj", kv, c, cfg.qkv_bias),
        ("v_proj", kv, c, cfg.qkv_bias),
        ("o_proj", c, a, cfg.o_bias),
    ] {
        out.push((format!("{p}.self_attn.{m}.weight"), vec![n, k]));
        if bias {
            out.push((format!("{p}.self_attn.{m}.bias"), vec![n]));
        }
    }
    if cfg.qk_norm {
        out.push((format!("{p}.self_attn.q_norm.weight"), vec![d]));
        out.push((format!("{p}.self_attn.k_norm.weight"), vec![d]));
    }
    out.push((format!("{p}.post_attention_layernorm.weight"), vec![c]));
    for (m, n, k) in [("gate_proj", f, c), ("up_proj", f, c), ("down_proj", c, f)] {
        out.push((format!("{p}.mlp.{m}.weight"), vec![n, k]));
    }
    out
}

/// Take tensor `name` out of `w`.
fn take(w: &mut HashMap<String, Tensor>, name: &str) -> Result<Tensor> {
    w.remove(name)
        .ok_or_else(|| Error::Config(format!("missing tensor {name}")))
}

impl Llama {
    /// Expected `(name, shape)` of every parameter, in the model's order.
    pub fn param_shapes(cfg: &LlamaConfig) -> Vec<(String, Vec<usize>)> {
        let (c, v) = (cfg.hidden_size, cfg.vocab_size);
        let mut out = vec![("model.embed_tokens.weight".to_string(), vec![v, c])];
        for i in 0..cfg.num_hidden_layers {
            out.extend(block_param_shapes(cfg, i));
        }
        out.push(("model.norm.weight".into(), vec![c]));
        if !cfg.tie_word_embeddings {
            out.push(("lm_head.weight".into(), vec![v, c]));
        }
        out
    }

    /// A randomly initialised model (normal(0, 0.02) matrices, the output
    /// projections scaled by 1/sqrt(2L) as GPT-2 does, unit norm gains, zero
    /// biases).
    pub fn new_random(
        cfg: &LlamaConfig,
        dtype: DType,
        recipe: Option<Recipe>,
        seed: u64,
    ) -> Result<Llama> {
        cfg.validate()?;
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let resid = 0.02 / (2.0 * cfg.num_hidden_layers as f64).sqrt();
        let mut weights = HashMap::new();
        for (name, shape) in Llama::param_shapes(cfg) {
            let n: usize = shape.iter().product();
            let what = format_args!("the initial f64 {name} {shape:?}");
            let data: Vec<f64> = if name.ends_with(".bias") {
                alloc_vec(n, 0.0, what)?
            } else if shape.len() == 1 {
                alloc_vec(n, 1.0, what)?
            } else {
                let std = if name.ends_with("o_proj.weight") || name.ends_with("down_proj.weight") {
                    resid
                } else {
                    0.02
                };
                let draws = (0..n).map(|_| {
                    std * <StandardNormal as Distribution<f64>>::sample(&StandardNormal, &mut rng)
                });
                alloc_collect(draws, what)?
            };
            weights.insert(name, Tensor::from_f64(&shape, data)?.into_dtype(dtype)?);
        }
        Llama::from_weights(cfg, weights, recipe)
    }

    /// Check named weights (e.g. a checkpoint's) against `cfg`, as
    /// [`Llama::from_weights`] and [`crate::decode::DecodeModel::new`] do
    /// before building: `cfg` must be valid, every tensor of
    /// [`Llama::param_shapes`] present with its exact shape, and no other
    /// tensor left over (all of them are named in the error). Under
    /// `tie_word_embeddings`, an `lm_head.weight` is accepted only if it
    /// equals `model.embed_tokens.weight` (some exporters write the shared
    /// matrix twice).
    pub fn check_weights(cfg: &LlamaConfig, w: &HashMap<String, Tensor>) -> Result<()> {
        cfg.validate()?;
        let shapes = Llama::param_shapes(cfg);
        for (name, shape) in &shapes {
            let t = w
                .get(name)
                .ok_or_else(|| Error::Config(format!("missing tensor {name}")))?;
            if t.shape() != shape.as_slice() {
                return Err(Error::Config(format!(
                    "tensor {name} has shape {:?}, expected {shape:?}",
                    t.shape()
                )));
            }
        }
        const HEAD: &str = "lm_head.weight";
        const EMBED: &str = "model.embed_tokens.weight";
        if cfg.tie_word_embeddings {
            if let (Some(head), Some(embed)) = (w.get(HEAD), w.get(EMBED)) {
                if head != embed {
                    return Err(Error::Config(format!(
                        "tie_word_embeddings is set but {HEAD} differs from {EMBED}"
                    )));
                }
            }
        }
        let known: std::collections::HashSet<&str> =
            shapes.iter().map(|(n, _)| n.as_str()).collect();
        let mut extra: Vec<&str> = w
            .keys()
            .map(String::as_str)
            .filter(|&n| {
                let tied_head = cfg.tie_word_embeddings && n == HEAD;
                !known.contains(n) && !tied_head
            })
            .collect();
        extra.sort_unstable();
        match extra.as_slice() {
            [] => Ok(()),
            [one] => Err(Error::Config(format!(
                "unexpected tensor {one} for this config"
            ))),
            many => {
                const SHOWN: usize = 12;
                let mut list = many[..many.len().min(SHOWN)].join(", ");
                if many.len() > SHOWN {
                    list.push_str(&format!(" and {} more", many.len() - SHOWN));
                }
                Err(Error::Config(format!(
                    "{} unexpected tensors for this config: {list}",
                    many.len()
                )))
            }
        }
    }

    /// A model from named weights (e.g. a checkpoint); every tensor must be
    /// present with its exact shape, and no unknown tensor may remain
    /// ([`Llama::check_weights`]).
    pub fn from_weights(
        cfg: &LlamaConfig,
        mut w: HashMap<String, Tensor>,
        recipe: Option<Recipe>,
    ) -> Result<Llama> {
        Llama::check_weights(cfg, &w)?;
        let eps = cfg.rms_norm_eps;
        let embed = Embedding::new(take(&mut w, "model.embed_tokens.weight")?)?;
        let mut blocks = Vec::with_capacity(cfg.num_hidden_layers);
        for i in 0..cfg.num_hidden_layers {
            let p = format!("model.layers.{i}");
            let w = &mut w;
            let mut proj = |m: &str, bias: bool| -> Result<Proj> {
                let weight = take(w, &format!("{p}.{m}.weight"))?;
                let bias = match bias {
                    true => Some(take(w, &format!("{p}.{m}.bias"))?),
                    false => None,
                };
                Ok(Proj::Full(Linear::new(weight, bias, recipe, true)?))
            };
            let (q, k, v) = (
                proj("self_attn.q_proj", cfg.qkv_bias)?,
                proj("self_attn.k_proj", cfg.qkv_bias)?,
                proj("self_attn.v_proj", cfg.qkv_bias)?,
            );
            let o = proj("self_attn.o_proj", cfg.o_bias)?;
            let (gate, up, down) = (
                proj("mlp.gate_proj", false)?,
                proj("mlp.up_proj", false)?,
                proj("mlp.down_proj", false)?,
            );
            let mut norm = |n: &str| RmsNorm::new(take(w, &format!("{p}.{n}.weight"))?, eps);
            let (q_norm, k_norm) = match cfg.qk_norm {
                true => (
                    Some(norm("self_attn.q_norm")?),
                    Some(norm("self_attn.k_norm")?),
                ),
                false => (None, None),
            };
            blocks.push(Block {
                attn_norm: norm("input_layernorm")?,
                q,
                k,
                v,
                o,
                q_norm,
                k_norm,
                mlp_norm: norm("post_attention_layernorm")?,
                gate,
                up,
                down,
            });
        }
        let norm = RmsNorm::new(take(&mut w, "model.norm.weight")?, eps)?;
        let head_weight = if cfg.tie_word_embeddings {
            embed.weight.try_clone()?
        } else {
            take(&mut w, "lm_head.weight")?
        };
        let lm_head = Linear::new(head_weight, None, None, true)?;
        let rope = Rope::for_config(cfg)?;
        Ok(Llama {
            cfg: cfg.clone(),
            embed,
            blocks,
            norm,
            lm_head,
            rope,
            lora: false,
            dropout: None,
            dropout_round: 0,
            recompute: 0,
        })
    }

    /// Trainable parameters in order, with their names: every tensor of the
    /// model under full training (Hugging Face names); only the adapters in
    /// LoRA mode (PEFT names, `base_model.model.<module>.lora_A.weight`).
    pub fn params(&self) -> Vec<(String, &Tensor)> {
        if self.lora {
            let mut out = Vec::new();
            for (i, b) in self.blocks.iter().enumerate() {
                for (p, (_, module)) in b.projs().into_iter().zip(PROJ_NAMES) {
                    if let Proj::Lora(LoraLinear {
                        adapter: Some(ad), ..
                    }) = p
                    {
                        let n = format!("base_model.model.model.layers.{i}.{module}");
                        out.push((format!("{n}.lora_A.weight"), &ad.a));
                        out.push((format!("{n}.lora_B.weight"), &ad.b));
                    }
                }
            }
            return out;
        }
        let mut out = vec![("model.embed_tokens.weight".to_string(), &self.embed.weight)];
        for (i, b) in self.blocks.iter().enumerate() {
            let names = block_param_shapes(&self.cfg, i).into_iter().map(|(n, _)| n);
            out.extend(names.zip(b.tensors()));
        }
        out.push(("model.norm.weight".into(), &self.norm.weight));
        if !self.cfg.tie_word_embeddings {
            out.push(("lm_head.weight".into(), &self.lm_head.weight));
        }
        out
    }

    /// Mutable parameters in the same order as [`Llama::params`].
    pub fn params_mut(&mut self) -> Vec<(String, &mut Tensor)> {
        if self.lora {
            let mut out = Vec::new();
            for (i, b) in self.blocks.iter_mut().enumerate() {
                for (p, (_, module)) in b.projs_mut().into_iter().zip(PROJ_NAMES) {
                    if let Proj::Lora(LoraLinear {
                        adapter: Some(ad), ..
                    }) = p
                    {
                        let n = format!("base_model.model.model.layers.{i}.{module}");
                        out.push((format!("{n}.lora_A.weight"), &mut ad.a));
                        out.push((format!("{n}.lora_B.weight"), &mut ad.b));
                    }
                }
            }
            return out;
        }
        let mut out = vec![(
            "model.embed_tokens.weight".to_string(),
            &mut self.embed.weight,
        )];
        for (i, b) in self.blocks.iter_mut().enumerate() {
            let names = block_param_shapes(&self.cfg, i).into_iter().map(|(n, _)| n);
            out.extend(names.zip(b.tensors_mut()));
        }
        out.push(("model.norm.weight".into(), &mut self.norm.weight));
        if !self.cfg.tie_word_embeddings {
            out.push(("lm_head.weight".into(), &mut self.lm_head.weight));
        }
        out
    }

    /// Rank, alpha and targeted module names (`q_proj`, ...) in LoRA mode.
    pub fn lora_summary(&self) -> Option<(usize, f64, Vec<String>)> {
        if !self.lora {
            return None;
        }
        let mut targets = Vec::new();
        let mut ra = None;
        for b in self.blocks.iter().take(1) {
            for (p, (_, module)) in b.projs().into_iter().zip(PROJ_NAMES) {
                if let Proj::Lora(LoraLinear {
                    adapter: Some(ad), ..
                }) = p
                {
                    ra = Some((ad.rank(), ad.alpha));
                    let short = module.rsplit('.').next().unwrap_or(module);
                    targets.push(short.to_string());
                }
            }
        }
        ra.map(|(r, a)| (r, a, targets))
    }

    /// Replace the trainable tensors by `tensors` (names and shapes as
    /// [`Llama::params`]); every one must be present, none may be extra.
    pub fn load_params(&mut self, mut tensors: HashMap<String, Tensor>) -> Result<()> {
        for (name, t) in self.params_mut() {
            let new = tensors
                .remove(&name)
                .ok_or_else(|| Error::Config(format!("missing tensor {name}")))?;
            if new.shape() != t.shape() {
                return Err(Error::Config(format!(
                    "tensor {name} has shape {:?}, expected {:?}",
                    new.shape(),
                    t.shape()
                )));
            }
            let dtype = t.dtype();
            *t = new.into_dtype(dtype)?;
        }
        match tensors.keys().next() {
            Some(extra) => Err(Error::Config(format!("unexpected tensor {extra}"))),
            None => Ok(()),
        }
    }

    /// Whether the model is in LoRA mode (frozen base, adapters train).
    pub fn is_lora(&self) -> bool {
        self.lora
    }

    /// The LoRA dropout probability of training forwards (`0`: none).
    pub fn lora_dropout(&self) -> f64 {
        self.dropout.map_or(0.0, |(p, _)| p)
    }

    /// Set which training forward comes next, for the LoRA dropout masks
    /// (each [`Llama::forward`] draws those of its round, then counts one
    /// up). A trainer sets it to the micro-step's index from the run's start
    /// (`step * grad_accum + micro`), so a resumed run draws the masks the
    /// uninterrupted one would.
    pub fn set_dropout_round(&mut self, round: u64) {
        self.dropout_round = round;
    }

    /// Set which backward comes next, for the salts of stochastic rounding:
    /// every linear layer (the block projections, LoRA or not, and the LM
    /// head) counts its gradient quantizations, one per [`Llama::backward`],
    /// and salts its rounding with that count. This sets each count to
    /// `round`, the number of backwards before this one. One process doing
    /// gradient accumulation reaches `step * grad_accum + micro` by itself;
    /// sharded data parallel sets `step * world + rank`, so that its ranks
    /// round with exactly the bits of those micro-batches.
    pub fn set_grad_round(&mut self, round: u64) {
        for b in &mut self.blocks {
            for p in b.projs_mut() {
                p.set_grad_calls(round);
            }
        }
        self.lm_head.set_grad_calls(round);
    }

    /// Activation recomputation of the first `blocks` blocks (all of them
    /// at or above the model's depth; 0: none): a training forward keeps only
    /// the residual entering each of them, and backward runs that block's
    /// forward again (with the same dropout masks) just before its backward.
    /// The gradients are bit-identical to those without it (the recomputed
    /// forward repeats the same arithmetic, delayed scaling's amax records
    /// take a maximum, and stochastic rounding is salted by gradient
    /// quantizations only); each recomputed block's activations give way to
    /// its input, for one more forward of the block.
    pub fn set_recompute(&mut self, blocks: usize) {
        self.recompute = blocks;
    }

    /// How many blocks (from the first) are recomputed.
    pub fn recompute(&self) -> usize {
        self.recompute.min(self.blocks.len())
    }

    /// Turn every block matrix into a frozen base stored as `spec.base`, with
    /// an adapter on the targeted ones; the embedding, norms and LM head
    /// freeze. Each dense weight is converted and dropped in turn, so at most
    /// one matrix exists in both forms at any time.
    pub fn into_lora(self, spec: &LoraSpec) -> Result<Llama> {
        self.into_lora_with(spec, &mut HashMap::new())
    }

    /// [`Llama::into_lora`] where a checkpoint stored some block matrices in
    /// FP8: those (by Hugging Face name, taken out of `stored`) become bases
    /// as stored ([`Base::from_checkpoint`]).
    pub fn into_lora_with(
        mut self,
        spec: &LoraSpec,
        stored: &mut HashMap<String, octet_tensor::mixed::Fp8Weight>,
    ) -> Result<Llama> {
        for t in &spec.targets {
            if !PROJ_NAMES.iter().any(|(short, _)| short == t) {
                return Err(Error::Config(format!(
                    "LoRA target '{t}': expected some of q, k, v, o, gate, up, down"
                )));
            }
        }
        if spec.targets.is_empty() {
            return Err(Error::Config("LoRA needs at least one target".into()));
        }
        crate::lora::check_dropout(spec.dropout)?;
        let mut seed = spec.seed;
        for (i, b) in self.blocks.iter_mut().enumerate() {
            for (p, (short, module)) in b.projs_mut().into_iter().zip(PROJ_NAMES) {
                let Proj::Full(l) = p else {
                    return Err(Error::Config("the model is already in LoRA mode".into()));
                };
                let (n, k) = (l.out_features(), l.in_features());
                let name = format!("model.layers.{i}.{module}.weight");
                let base = Base::from_checkpoint(
                    &name,
                    l.weight.dims2()?,
                    Some(&l.weight),
                    spec.base,
                    stored,
                )?;
                let adapter = if spec.targets.iter().any(|t| t == short) {
                    seed += 1;
                    Some(Adapter::init(n, k, spec.rank, spec.alpha, seed)?)
                } else {
                    None
                };
                // The bias stays with the frozen base: it trains no more than the matrix.
                let bias = l.bias.take();
                *p = Proj::Lora(
                    LoraLinear::new(base, adapter, spec.compute, spec.recipe)?.with_bias(bias)?,
                );
            }
        }
        self.lm_head.trainable = false;
        self.lora = true;
        self.dropout = (spec.dropout > 0.0).then_some((spec.dropout, spec.seed));
        Ok(self)
    }

    /// Bytes of the block matrices' stored weights (the frozen base in LoRA mode).
    pub fn matrix_bytes(&self) -> usize {
        self.blocks
            .iter()
            .flat_map(|b| b.projs())
            .map(|p| match p {
                Proj::Full(l) => l.weight.bytes(),
                Proj::Lora(l) => l.base.bytes(),
            })
            .sum()
    }

    /// Dense weights with Hugging Face names where every LoRA matrix is merged
    /// (`W + (alpha/r) B A`, f32), one matrix at a time; the other tensors
    /// (biases and norms included) as they are.
    pub fn merged_weights(&self) -> Result<Vec<(String, Tensor)>> {
        let mut out = vec![(
            "model.embed_tokens.weight".to_string(),
            self.embed.weight.try_clone()?,
        )];
        for (i, b) in self.blocks.iter().enumerate() {
            let names = block_param_shapes(&self.cfg, i).into_iter().map(|(n, _)| n);
            out.extend(names.zip(b.dense()?));
        }
        out.push(("model.norm.weight".into(), self.norm.weight.try_clone()?));
        if !self.cfg.tie_word_embeddings {
            out.push(("lm_head.weight".into(), self.lm_head.weight.try_clone()?));
        }
        Ok(out)
    }

    /// Numerics telemetry of every block linear's last quantization:
    /// `(module name, role, amax / saturated / underflowed)`. Empty without an FP8 recipe.
    pub fn telemetry(&self) -> Vec<(String, Role, Telemetry)> {
        let mut out = Vec::new();
        for (name, l) in self.named_linears() {
            for role in Role::ALL {
                if let Some(t) = l.telemetry(role) {
                    out.push((name.clone(), role, t));
                }
            }
        }
        out
    }

    /// Every block linear's delayed-scaling state, `(module name, role, state)`
    /// (empty unless the recipe is delayed): saved with checkpoints so that a
    /// resumed run scales exactly as the uninterrupted one.
    pub fn scaling_state(&self) -> Vec<(String, Role, DelayedState)> {
        let mut out = Vec::new();
        for (name, l) in self.named_linears() {
            for role in Role::ALL {
                if let Some(s) = l.delayed_state(role) {
                    out.push((name.clone(), role, s.clone()));
                }
            }
        }
        out
    }

    /// Restore states from [`Llama::scaling_state`]; an unknown module name is an error.
    pub fn set_scaling_state(&mut self, states: Vec<(String, Role, DelayedState)>) -> Result<()> {
        for (name, role, st) in states {
            let mut found = false;
            for (n, l) in self.named_linears_mut() {
                if n == name {
                    l.set_delayed_state(role, st.clone())?;
                    found = true;
                }
            }
            if !found {
                return Err(Error::Config(format!(
                    "scaling state for unknown module {name}"
                )));
            }
        }
        Ok(())
    }

    /// The trainable block [`Linear`]s with their module names (none in LoRA mode):
    /// what sharded data parallel hands FP8 all-gathered weights to.
    pub fn linears_mut(&mut self) -> Vec<(String, &mut Linear)> {
        self.named_linears_mut()
    }

    fn named_linears(&self) -> Vec<(String, &Linear)> {
        let mut out = Vec::new();
        for (i, b) in self.blocks.iter().enumerate() {
            for (p, (_, module)) in b.projs().into_iter().zip(PROJ_NAMES) {
                if let Some(l) = p.linear() {
                    out.push((format!("model.layers.{i}.{module}"), l));
                }
            }
        }
        out
    }

    fn named_linears_mut(&mut self) -> Vec<(String, &mut Linear)> {
        let mut out = Vec::new();
        for (i, b) in self.blocks.iter_mut().enumerate() {
            for (p, (_, module)) in b.projs_mut().into_iter().zip(PROJ_NAMES) {
                if let Some(l) = p.linear_mut() {
                    out.push((format!("model.layers.{i}.{module}"), l));
                }
            }
        }
        out
    }

    /// End of an optimizer step: roll delayed-scaling histories (no-op for other recipes).
    pub fn update_scales(&mut self) {
        self.named_linears_mut()
            .into_iter()
            .for_each(|(_, l)| l.update_scales());
    }

    fn check_tokens(&self, tokens: &[u32], b: usize, t: usize) -> Result<()> {
        if b == 0 || t == 0 || b.checked_mul(t) != Some(tokens.len()) {
            return Err(Error::Shape(format!(
                "{} tokens for batch {b} x sequence {t}",
                tokens.len()
            )));
        }
        if t > self.cfg.max_position_embeddings {
            return Err(Error::Shape(format!(
                "sequence {t} exceeds max_position_embeddings {}",
                self.cfg.max_position_embeddings
            )));
        }
        Ok(())
    }

    /// Forward and loss on `tokens (B, T)` with next-token `targets (B, T)`:
    /// returns the mean cross-entropy and what backward needs.
    pub fn forward(
        &mut self,
        tokens: &[u32],
        targets: &[u32],
        b: usize,
        t: usize,
    ) -> Result<(f64, LlamaSaved)> {
        self.check_tokens(tokens, b, t)?;
        if targets.len() != tokens.len() {
            return Err(Error::Shape(format!(
                "{} targets for {} tokens",
                targets.len(),
                tokens.len()
            )));
        }
        self.sync_tied_head()?;
        let mut x = self.embed.forward(tokens)?; // (B*T, C)
        let mut saved_blocks = Vec::with_capacity(self.blocks.len());
        let mut inputs = Vec::new();
        let rope = &self.rope;
        let round = self.dropout_round;
        self.dropout_round = round.wrapping_add(1);
        for (i, blk) in self.blocks.iter_mut().enumerate() {
            let drop = BlockDropout::new(self.dropout, round, i);
            // Name the block where a NaN/inf (or any failure) first shows up.
            let (y, s) = block_forward(blk, rope, &x, (b, t), &self.cfg, drop)
                .map_err(|e| Error::InLayer(format!("model.layers.{i}"), Box::new(e)))?;
            match i < self.recompute {
                true => inputs.push(std::mem::replace(&mut x, y)),
                false => {
                    x = y;
                    saved_blocks.push(s);
                }
            }
        }
        let blocks = BlocksSaved {
            inputs,
            kept: saved_blocks,
            bt: (b, t),
            round,
        };
        let (h, norm) = self.norm.forward(&x)?; // (B*T, C)
        let (loss, head) = head_loss(&mut self.lm_head, &h, targets)?;
        if !loss.is_finite() {
            return Err(Error::NonFinite(format!("loss is {loss}")));
        }
        Ok((
            loss,
            LlamaSaved {
                tokens: alloc_collect(tokens.iter().copied(), "the tokens kept for backward")?,
                blocks,
                norm,
                head,
            },
        ))
    }

    /// With tied embeddings the head reads the embedding matrix as it is now
    /// (the optimizer updates only the embedding); [`octet_tensor::Error::Alloc`]
    /// when its copy cannot be allocated.
    fn sync_tied_head(&mut self) -> Result<()> {
        if self.cfg.tie_word_embeddings {
            self.lm_head.weight = self.embed.weight.try_clone()?;
        }
        Ok(())
    }

    /// Logits `(B*T, V)` for `tokens (B, T)` (nothing kept for backward). An
    /// evaluation: the linears record no amax or telemetry
    /// ([`Linear::set_recording`]), so it leaves the training's delayed
    /// scales as they were.
    pub fn logits(&mut self, tokens: &[u32], b: usize, t: usize) -> Result<Tensor> {
        self.set_recording(false);
        let r = self.eval_logits(tokens, b, t);
        self.set_recording(true);
        r
    }

    fn eval_logits(&mut self, tokens: &[u32], b: usize, t: usize) -> Result<Tensor> {
        self.check_tokens(tokens, b, t)?;
        self.sync_tied_head()?;
        let mut x = self.embed.forward(tokens)?;
        let rope = &self.rope;
        for blk in &mut self.blocks {
            x = block_forward(blk, rope, &x, (b, t), &self.cfg, None)?.0;
        }
        let (h, _) = self.norm.forward(&x)?;
        Ok(self.lm_head.forward(&h, false)?.0)
    }

    /// [`Linear::set_recording`] on every linear of the model.
    fn set_recording(&mut self, on: bool) {
        self.named_linears_mut()
            .into_iter()
            .for_each(|(_, l)| l.set_recording(on));
        self.lm_head.set_recording(on);
    }

    /// Backward of the loss: gradients in [`Llama::params`] order (f32, or f64 for an f64 model).
    pub fn backward(&mut self, saved: LlamaSaved) -> Result<Vec<(String, Tensor)>> {
        let LlamaSaved {
            tokens,
            blocks,
            norm,
            head,
        } = saved;
        let (mut dx, d_norm) = self.norm.backward(norm, &head.dh)?;
        let mut block_grads = Vec::with_capacity(self.blocks.len());
        let BlocksSaved {
            mut inputs,
            mut kept,
            bt,
            round,
        } = blocks;
        if inputs.len() + kept.len() != self.blocks.len() {
            return Err(Error::Shape(format!(
                "saved state of {} blocks and inputs of {} for a model of {} blocks",
                kept.len(),
                inputs.len(),
                self.blocks.len()
            )));
        }
        let recomputed = inputs.len();
        for (i, blk) in self.blocks.iter_mut().enumerate().rev() {
            let missing = || Error::Shape(format!("no saved state of block {i}"));
            let s = if i < recomputed {
                let x = inputs.pop().ok_or_else(missing)?;
                let drop = BlockDropout::new(self.dropout, round, i);
                block_forward(blk, &self.rope, &x, bt, &self.cfg, drop)
                    .map_err(|e| {
                        Error::InLayer(format!("model.layers.{i} (recomputed)"), Box::new(e))
                    })?
                    .1
            } else {
                kept.pop().ok_or_else(missing)?
            };
            let (dprev, g) = block_backward(blk, &self.rope, s, &dx, self.lora)?;
            dx = dprev;
            block_grads.push(g);
        }
        block_grads.reverse();
        if self.lora {
            // Only the adapters train: the embedding, norms and head are frozen.
            let grads: Vec<Tensor> = block_grads.into_iter().flatten().collect();
            let names: Vec<String> = self.params().into_iter().map(|(n, _)| n).collect();
            if names.len() != grads.len() {
                return Err(Error::Shape(format!(
                    "{} adapter gradients for {} adapter tensors",
                    grads.len(),
                    names.len()
                )));
            }
            let _ = d_norm;
            return Ok(names.into_iter().zip(grads).collect());
        }
        let d_head = head
            .d_weight
            .ok_or_else(|| Error::Shape("lm_head gave no weight gradient".into()))?;
        let mut d_embed = self.embed.backward(&tokens, &dx)?;
        if self.cfg.tie_word_embeddings {
            // One matrix, two uses: its gradient is the sum of both.
            d_embed = cpu::add(&d_embed, &d_head)?;
        }
        let mut grads = vec![d_embed];
        grads.extend(block_grads.into_iter().flatten());
        grads.push(d_norm);
        if !self.cfg.tie_word_embeddings {
            grads.push(d_head);
        }
        let names = Llama::param_shapes(&self.cfg).into_iter().map(|(n, _)| n);
        Ok(names.zip(grads).collect())
    }
}

fn need(t: Option<Tensor>, what: &str) -> Result<Tensor> {
    t.ok_or_else(|| Error::Shape(format!("missing gradient: {what}")))
}

/// The LoRA dropout of one block in one training forward.
#[derive(Clone, Copy)]
struct BlockDropout {
    p: f64,
    seed: u64,
    round: u64,
    block: usize,
}

impl BlockDropout {
    /// Block `block`'s dropout in training forward `round`, where the model
    /// has dropout `(p, seed)`.
    fn new(dropout: Option<(f64, u64)>, round: u64, block: usize) -> Option<BlockDropout> {
        dropout.map(|(p, seed)| BlockDropout {
            p,
            seed,
            round,
            block,
        })
    }

    /// The mask of projection `proj`'s input (index into [`PROJ_NAMES`]).
    fn of(this: Option<BlockDropout>, proj: usize) -> Result<Option<Dropout>> {
        this.map(|d| Dropout::for_projection(d.p, (d.seed, d.round), d.block, proj))
            .transpose()
    }
}

/// `x (B*T, C) -> (B*T, C)` through one block (`drop`: its LoRA dropout,
/// in training forwards).
fn block_forward(
    blk: &mut Block,
    rope: &Rope,
    x: &Tensor,
    (b, t): (usize, usize),
    cfg: &LlamaConfig,
    drop: Option<BlockDropout>,
) -> Result<(Tensor, BlockSaved)> {
    let dr = |proj: usize| BlockDropout::of(drop, proj);
    let (hq, hkv, d) = (
        cfg.num_attention_heads,
        cfg.num_key_value_heads,
        cfg.head_dim(),
    );
    let (h, attn_norm) = blk.attn_norm.forward(x)?; // (B*T, C)
    let (q, sq) = blk.q.forward(&h, true, dr(0)?)?; // (B*T, Hq*D)
    let (k, sk) = blk.k.forward(&h, true, dr(1)?)?; // (B*T, Hkv*D)
    let (v, sv) = blk.v.forward(&h, true, dr(2)?)?; // (B*T, Hkv*D)
    let (q, q_norm) = head_norm(blk.q_norm.as_ref(), q)?; // (B*T, Hq*D)
    let (k, k_norm) = head_norm(blk.k_norm.as_ref(), k)?; // (B*T, Hkv*D)
    let q = rope.forward(&q.reshape(&[b, t, hq, d])?)?; // (B, T, Hq, D)
    let k = rope.forward(&k.reshape(&[b, t, hkv, d])?)?; // (B, T, Hkv, D)
    let v = v.reshape(&[b, t, hkv, d])?;
    let (a, attn) = attention_forward(&q, &k, &v)?; // (B, T, Hq, D)
    let (o, so) = blk.o.forward(&a.reshape(&[b * t, hq * d])?, true, dr(3)?)?; // (B*T, C)
    let x1 = cpu::add(x, &o)?;
    let (h2, mlp_norm) = blk.mlp_norm.forward(&x1)?;
    let (g, sg) = blk.gate.forward(&h2, true, dr(4)?)?; // (B*T, F)
    let (u, su) = blk.up.forward(&h2, true, dr(5)?)?; // (B*T, F)
    let (act, swiglu) = swiglu_forward(&g, &u)?; // (B*T, F)
    let (dn, sd) = blk.down.forward(&act, true, dr(6)?)?; // (B*T, C)
    let x2 = cpu::add(&x1, &dn)?;
    let attn_shape = [b, t, hq, d];
    let saved = BlockSaved {
        attn_shape,
        attn_norm,
        q: sq,
        k: sk,
        v: sv,
        q_norm,
        k_norm,
        attn,
        o: so,
        mlp_norm,
        gate: sg,
        up: su,
        swiglu,
        down: sd,
    };
    Ok((x2, saved))
}

/// Backward of one block from `dx2 (B*T, C)`: the input gradient and the
/// trainable tensors' gradients in [`Llama::params`] order.
fn block_backward(
    blk: &mut Block,
    rope: &Rope,
    s: BlockSaved,
    dx2: &Tensor,
    lora: bool,
) -> Result<(Tensor, Vec<Tensor>)> {
    let bt = dx2.shape()[0];
    let down = blk.down.backward(s.down, dx2)?;
    let (dg, du) = swiglu_backward(s.swiglu, &need(down.d_input, "down input")?)?;
    let gate = blk.gate.backward(s.gate, &dg)?;
    let up = blk.up.backward(s.up, &du)?;
    let dh2 = cpu::add(
        &need(gate.d_input, "gate input")?,
        &need(up.d_input, "up input")?,
    )?;
    let (dx1_norm, d_mlp_norm) = blk.mlp_norm.backward(s.mlp_norm, &dh2)?;
    let dx1 = cpu::add(dx2, &dx1_norm)?;
    let o = blk.o.backward(s.o, &dx1)?;
    let da = need(o.d_input, "o input")?.reshape(&s.attn_shape)?; // (B, T, Hq, D)
    let (dq, dk, dv) = attention_backward(s.attn, &da)?;
    let (dq, d_q_norm) = head_norm_backward(blk.q_norm.as_ref(), s.q_norm, rope.backward(&dq)?)?;
    let (dk, d_k_norm) = head_norm_backward(blk.k_norm.as_ref(), s.k_norm, rope.backward(&dk)?)?;
    let flat = |t: Tensor| -> Result<Tensor> {
        let n = t.numel() / bt;
        Ok(t.reshape(&[bt, n])?)
    };
    let q = blk.q.backward(s.q, &flat(dq)?)?;
    let k = blk.k.backward(s.k, &flat(dk)?)?;
    let v = blk.v.backward(s.v, &flat(dv)?)?;
    let dh = cpu::add(
        &cpu::add(&need(q.d_input, "q input")?, &need(k.d_input, "k input")?)?,
        &need(v.d_input, "v input")?,
    )?;
    let (dx_norm, d_attn_norm) = blk.attn_norm.backward(s.attn_norm, &dh)?;
    let dx = cpu::add(&dx1, &dx_norm)?;
    // Trainable tensors' gradients in parameter order: full training has the
    // norm gains and one weight per projection; LoRA only the adapters.
    let mut grads = Vec::new();
    if !lora {
        grads.push(d_attn_norm);
    }
    for g in [q.params, k.params, v.params, o.params] {
        grads.extend(g);
    }
    if !lora {
        grads.extend(d_q_norm.into_iter().chain(d_k_norm));
        grads.push(d_mlp_norm);
    }
    for g in [gate.params, up.params, down.params] {
        grads.extend(g);
    }
    Ok((dx, grads))
}

/// Qwen3's per-head RMSNorm: `x (B*T, H*D)` with each head's `D` values
/// normalised by `norm` (width `D`), or `x` as it is without one.
fn head_norm(norm: Option<&RmsNorm>, x: Tensor) -> Result<(Tensor, Option<RmsNormSaved>)> {
    let Some(n) = norm else {
        return Ok((x, None));
    };
    let shape = x.shape().to_vec();
    let d = n.weight.numel();
    let (y, saved) = n.forward(&x.reshape(&[shape.iter().product::<usize>() / d, d])?)?; // (B*T*H, D)
    Ok((y.reshape(&shape)?, Some(saved)))
}

/// Backward of [`head_norm`] from `dy` (any shape of `B*T*H*D` values): the
/// input gradient in `dy`'s shape and the norm's weight gradient `(D)`.
fn head_norm_backward(
    norm: Option<&RmsNorm>,
    saved: Option<RmsNormSaved>,
    dy: Tensor,
) -> Result<(Tensor, Option<Tensor>)> {
    match (norm, saved) {
        (None, None) => Ok((dy, None)),
        (Some(n), Some(s)) => {
            let shape = dy.shape().to_vec();
            let d = n.weight.numel();
            let (dx, dw) =
                n.backward(s, &dy.reshape(&[shape.iter().product::<usize>() / d, d])?)?;
            Ok((dx.reshape(&shape)?, Some(dw)))
        }
        _ => Err(Error::Shape(
            "saved state of a per-head norm the block does not have".into(),
        )),
    }
}

#[cfg(test)]
mod head_tests {
    use super::*;
    use crate::loss::IGNORE;

    /// The fused head and loss chunked over a few rows at a time computes
    /// what one chunk does (the unchunked head and loss): the loss, the norm
    /// output's gradient and the head weight's gradient, with masked targets
    /// in the batch, in f64 (to 1e-12 relative: the chunk weights reorder a
    /// sum) and in f32 (to 2e-6: f32 rounding of the reweighted gradients).
    #[test]
    fn a_chunked_head_and_loss_compute_what_one_chunk_does() {
        let (m, c, v) = (37, 24, 101);
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        let mut normal = |n: usize| -> Vec<f64> {
            (0..n)
                .map(|_| StandardNormal.sample(&mut rng))
                .collect::<Vec<f64>>()
        };
        let (w, h) = (normal(v * c), normal(m * c));
        let targets: Vec<u32> = (0..m)
            .map(|i| {
                if i % 5 == 3 {
                    IGNORE
                } else {
                    (i * 7 % v) as u32
                }
            })
            .collect();
        for (dtype, tol) in [(DType::F64, 1e-12), (DType::F32, 2e-6)] {
            let mk = |d: &[f64], shape: &[usize]| {
                Tensor::from_f64(shape, d.to_vec()).map(|t| t.to_dtype(dtype))
            };
            let ht = mk(&h, &[m, c]).unwrap();
            let run = |chunk| {
                let mut head = Linear::new(mk(&w, &[v, c]).unwrap(), None, None, true).unwrap();
                head_loss_in(&mut head, &ht, &targets, chunk).unwrap()
            };
            let (l1, s1) = run(usize::MAX);
            // 3 rows a chunk: 13 chunks, the last of one row.
            let (l3, s3) = run(3 * v);
            assert!((l1 - l3).abs() <= tol * l1.abs(), "{dtype:?}: {l1} vs {l3}");
            let close = |a: &Tensor, b: &Tensor, what: &str| {
                let (a, b) = (a.to_f64_vec(), b.to_f64_vec());
                let scale = a.iter().fold(0f64, |s, x| s.max(x.abs()));
                let worst = a
                    .iter()
                    .zip(&b)
                    .map(|(x, y)| (x - y).abs())
                    .fold(0f64, f64::max);
                assert!(
                    worst <= tol * scale,
                    "{dtype:?} {what}: {worst:e} of {scale:e}"
                );
            };
            close(&s1.dh, &s3.dh, "d_h");
            close(
                s1.d_weight.as_ref().unwrap(),
                s3.d_weight.as_ref().unwrap(),
                "d_weight",
            );
        }
    }

    /// The head's copies ([`rows`], [`stack_rows`]) reserve their buffer
    /// through [`row_buffer`]: one the allocator cannot provide is the
    /// tensor crate's allocation error naming the matrix, not an abort.
    /// Their sources exist (`h`, the head's own gradient chunks), so no small
    /// input reaches an impossible copy: the size here is constructed, 2^62
    /// bytes of f32, beyond any address space.
    #[test]
    fn a_head_copy_too_large_for_memory_is_an_error_naming_the_bytes() {
        let e = row_buffer::<f32>(1 << 40, 1 << 20, "a chunk of the LM head's input").unwrap_err();
        let Error::Tensor(octet_tensor::Error::Alloc { bytes, .. }) = &e else {
            panic!("expected an allocation error, got {e:?}");
        };
        assert_eq!(*bytes, 1 << 62);
        let msg = e.to_string();
        for want in [
            "out of memory",
            "4611686018427387904 bytes (4.0 EiB)",
            "a chunk of the LM head's input (1099511627776, 1048576)",
            "--batch",
        ] {
            assert!(msg.contains(want), "{want:?} missing from: {msg}");
        }
        // An element count past usize is a shape error, not a wrapped size.
        let e = row_buffer::<f32>(1 << 40, 1 << 40, "x").unwrap_err();
        assert!(matches!(e, Error::Shape(_)), "{e:?}");
    }

    /// The fallible helpers give the values of the copies they replace, bit
    /// for bit, in every dtype; out-of-range rows, mixed widths and
    /// mismatched targets are errors, not panics.
    #[test]
    fn the_head_helpers_copy_and_scale_as_before() {
        let vals: Vec<f64> = (0..7 * 5).map(|i| (i as f64 - 11.3) / 3.7).collect();
        let base = Tensor::from_f64(&[7, 5], vals).unwrap();
        let bits =
            |t: &Tensor| -> Vec<u64> { t.to_f64_vec().iter().map(|x| x.to_bits()).collect() };
        for dtype in [DType::F64, DType::F32, DType::Bf16] {
            let t = base.to_dtype(dtype);
            let parts: Vec<Tensor> = [(0, 3), (3, 6), (6, 7)]
                .iter()
                .map(|&(a, b)| rows(&t, a, b).unwrap())
                .collect();
            assert_eq!(parts[1].shape(), [3, 5]);
            assert_eq!(parts[1].dtype(), dtype);
            let all = t.to_f64_vec();
            assert_eq!(
                bits(&parts[1]),
                bits(&Tensor::from_f64(&[3, 5], all[15..30].to_vec()).unwrap())
            );
            let stacked = stack_rows(&parts).unwrap();
            assert_eq!(stacked.dtype(), dtype);
            assert_eq!(stacked.shape(), t.shape());
            assert_eq!(bits(&stacked), bits(&t));
            // `scaled` as it was: f64 `x * k`, else f32 `x * (k as f32)`
            // rounded back to the dtype.
            let k = 0.37;
            let want = match dtype {
                DType::F64 => Tensor::from_f64(t.shape(), all.iter().map(|x| x * k).collect()),
                _ => Tensor::from_f32_as(
                    t.shape(),
                    t.to_f32_vec().iter().map(|x| x * k as f32).collect(),
                    dtype,
                ),
            }
            .unwrap();
            let got = scaled(&t, k).unwrap();
            assert_eq!(got.dtype(), dtype);
            assert_eq!(bits(&got), bits(&want));
            assert!(matches!(rows(&t, 5, 8), Err(Error::Shape(_))));
            assert!(matches!(rows(&t, 4, 3), Err(Error::Shape(_))));
        }
        let narrow = Tensor::from_f32(&[1, 4], vec![0.0; 4]).unwrap();
        let wide = Tensor::from_f32(&[1, 5], vec![0.0; 5]).unwrap();
        assert!(matches!(stack_rows(&[wide, narrow]), Err(Error::Shape(_))));
        let empty = stack_rows(&[]).unwrap();
        assert_eq!(empty.shape(), [0, 0]);
        let mut head = Linear::new(base.to_dtype(DType::F32), None, None, true).unwrap();
        let h = Tensor::from_f32(&[2, 7], vec![0.5; 14]).unwrap();
        let e = head_loss_in(&mut head, &h, &[1, 2, 3], HEAD_CHUNK).unwrap_err();
        assert!(matches!(e, Error::Shape(_)), "{e:?}");
    }
}

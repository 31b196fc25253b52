//! A Llama-style decoder with explicit forward and backward.
//!
//! token embedding -> L x [RMSNorm -> q,k,v (GQA) -> RoPE -> causal attention
//! -> o, residual; RMSNorm -> gate, up -> SwiGLU -> down, residual] -> RMSNorm
//! -> LM head -> cross-entropy. Every matrix product of the blocks is a
//! [`Linear`] under the model's recipe; the embedding and the LM head stay in
//! high precision (as Transformer Engine and torchao users keep them).
//! Parameters carry Hugging Face Llama names, so checkpoints round-trip.

mod block;
mod config;
pub mod cuda;
mod head;

pub use block::*;
pub use config::*;
pub use head::HEAD_CHUNK;
use head::*;

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
pub(crate) fn block_param_shapes(cfg: &LlamaConfig, i: usize) -> Vec<(String, Vec<usize>)> {
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

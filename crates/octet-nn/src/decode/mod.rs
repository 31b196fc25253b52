//! Inference with a KV cache: the Llama model of [`crate::llama`] for text
//! generation, with its block matrices stored as f32, bf16 or FP8.
//!
//! Every matrix product is `octet_tensor::mixed::matmul_weights`: the same
//! kernel over FP8 codes (upcast in registers), bf16 or f32 weights, so the
//! three storage formats differ only in the bytes they move. The embedding
//! and the LM head stay in f32 (as in training, they are not quantized).
//! Activations are f32, one row per new token.
//!
//! Each [`DecodeModel::forward`] takes the new tokens of one sequence,
//! appends their keys and values to the cache, and returns the logits of
//! every new token: a prompt goes in at once (prefill), then one token per step.

pub mod cuda;

use crate::llama::LlamaConfig;
use crate::{Error, Result};
use half::bf16;
use octet_fp8::Format;
use octet_tensor::mixed::{matmul_weights, Fp8Weight, WeightRef, WeightScaling};
use octet_tensor::Tensor;
use std::collections::HashMap;

/// How the block matrices are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightStorage {
    /// f32 (4 bytes per weight).
    F32,
    /// bf16 (2 bytes).
    Bf16,
    /// FP8 codes with scales (1 byte plus scales).
    Fp8(Format, WeightScaling),
}

impl WeightStorage {
    /// Parse `f32`, `bf16`, `fp8` (E4M3, per-channel scales), `fp8-tensor`, `fp8-block`, `fp8-e5m2`.
    pub fn from_name(s: &str) -> Result<WeightStorage> {
        Ok(match s {
            "f32" => WeightStorage::F32,
            "bf16" => WeightStorage::Bf16,
            "fp8" | "fp8-channel" => WeightStorage::Fp8(Format::E4M3, WeightScaling::Channel),
            "fp8-tensor" => WeightStorage::Fp8(Format::E4M3, WeightScaling::Tensor),
            "fp8-block" => WeightStorage::Fp8(Format::E4M3, WeightScaling::Block128),
            "fp8-e5m2" => WeightStorage::Fp8(Format::E5M2, WeightScaling::Channel),
            other => {
                return Err(Error::Config(format!(
                    "weights '{other}': expected f32, bf16, fp8, fp8-tensor, fp8-block or fp8-e5m2"
                )))
            }
        })
    }
}

/// One stored matrix `(N, K)`.
#[derive(Clone, Debug)]
enum Matrix {
    F32(Vec<f32>, usize, usize),
    Bf16(Vec<bf16>, usize, usize),
    Fp8(Fp8Weight),
}

impl Matrix {
    fn new(w: &Tensor, storage: WeightStorage) -> Result<Matrix> {
        let (n, k) = w.dims2()?;
        let v = w.to_f32_vec();
        Ok(match storage {
            WeightStorage::F32 => Matrix::F32(v, n, k),
            WeightStorage::Bf16 => {
                Matrix::Bf16(v.iter().map(|&x| bf16::from_f32(x)).collect(), n, k)
            }
            WeightStorage::Fp8(f, s) => Matrix::Fp8(Fp8Weight::quantize(&v, n, k, f, s)?),
        })
    }

    fn bytes(&self) -> usize {
        match self {
            Matrix::F32(v, ..) => 4 * v.len(),
            Matrix::Bf16(v, ..) => 2 * v.len(),
            Matrix::Fp8(w) => w.bytes(),
        }
    }

    /// `x (m, K) -> (m, N)`.
    fn apply(&self, x: &[f32], m: usize) -> Result<Vec<f32>> {
        let r = match self {
            Matrix::F32(v, n, k) => WeightRef::F32(v, *n, *k),
            Matrix::Bf16(v, n, k) => WeightRef::Bf16(v, *n, *k),
            Matrix::Fp8(w) => WeightRef::Fp8(w),
        };
        let k = x.len() / m.max(1);
        Ok(matmul_weights(&Tensor::from_f32(&[m, k], x.to_vec())?, &r)?.to_f32_vec())
    }
}

#[derive(Clone, Debug)]
struct DecodeBlock {
    attn_norm: Vec<f32>,
    q: Matrix,
    k: Matrix,
    v: Matrix,
    o: Matrix,
    /// Biases of q, k, v (`qkv_bias`) and o (`o_bias`), f32.
    q_bias: Option<Vec<f32>>,
    k_bias: Option<Vec<f32>>,
    v_bias: Option<Vec<f32>>,
    o_bias: Option<Vec<f32>>,
    /// Per-head norms of q and k, width `D` (`qk_norm`).
    q_norm: Option<Vec<f32>>,
    k_norm: Option<Vec<f32>>,
    mlp_norm: Vec<f32>,
    gate: Matrix,
    up: Matrix,
    down: Matrix,
    /// Cached keys and values, `(len, Hkv * D)` each, post-RoPE keys.
    k_cache: Vec<f32>,
    v_cache: Vec<f32>,
}

/// A Llama model for generation, with a KV cache for one sequence.
#[derive(Clone, Debug)]
pub struct DecodeModel {
    /// Dimensions. A change after [`DecodeModel::new`] is refused by
    /// [`DecodeModel::forward`]: the weights and the cache keep the built ones.
    pub cfg: LlamaConfig,
    /// The dimensions the weights were stored for.
    built: LlamaConfig,
    storage: WeightStorage,
    embed: Vec<f32>,
    blocks: Vec<DecodeBlock>,
    norm: Vec<f32>,
    /// LM head `(V, C)` in f32 (tied: the embedding).
    head: Vec<f32>,
    /// Tokens in the cache.
    len: usize,
}

impl DecodeModel {
    /// Build from named weights (Hugging Face names, as [`crate::Llama::params`] gives
    /// or a checkpoint holds), storing the block matrices as `storage`. The
    /// weights must match `cfg` exactly, as [`crate::Llama::check_weights`]
    /// says: a missing, misshapen or left-over tensor is an error, and so is
    /// an `lm_head.weight` unlike the embedding under `tie_word_embeddings`.
    pub fn new(
        cfg: &LlamaConfig,
        weights: &HashMap<String, Tensor>,
        storage: WeightStorage,
    ) -> Result<DecodeModel> {
        crate::Llama::check_weights(cfg, weights)?;
        let get = |name: &str| -> Result<&Tensor> {
            weights
                .get(name)
                .ok_or_else(|| Error::Config(format!("missing tensor {name}")))
        };
        let mut blocks = Vec::with_capacity(cfg.num_hidden_layers);
        for i in 0..cfg.num_hidden_layers {
            let p = format!("model.layers.{i}");
            let mat = |n: &str| Matrix::new(get(&format!("{p}.{n}.weight"))?, storage);
            let vec_if = |on: bool, n: &str| -> Result<Option<Vec<f32>>> {
                on.then(|| get(&format!("{p}.{n}")).map(Tensor::to_f32_vec))
                    .transpose()
            };
            blocks.push(DecodeBlock {
                q_bias: vec_if(cfg.qkv_bias, "self_attn.q_proj.bias")?,
                k_bias: vec_if(cfg.qkv_bias, "self_attn.k_proj.bias")?,
                v_bias: vec_if(cfg.qkv_bias, "self_attn.v_proj.bias")?,
                o_bias: vec_if(cfg.o_bias, "self_attn.o_proj.bias")?,
                q_norm: vec_if(cfg.qk_norm, "self_attn.q_norm.weight")?,
                k_norm: vec_if(cfg.qk_norm, "self_attn.k_norm.weight")?,
                attn_norm: get(&format!("{p}.input_layernorm.weight"))?.to_f32_vec(),
                q: mat("self_attn.q_proj")?,
                k: mat("self_attn.k_proj")?,
                v: mat("self_attn.v_proj")?,
                o: mat("self_attn.o_proj")?,
                mlp_norm: get(&format!("{p}.post_attention_layernorm.weight"))?.to_f32_vec(),
                gate: mat("mlp.gate_proj")?,
                up: mat("mlp.up_proj")?,
                down: mat("mlp.down_proj")?,
                k_cache: Vec::new(),
                v_cache: Vec::new(),
            });
        }
        let embed = get("model.embed_tokens.weight")?.to_f32_vec();
        let head = if cfg.tie_word_embeddings {
            embed.clone()
        } else {
            get("lm_head.weight")?.to_f32_vec()
        };
        Ok(DecodeModel {
            cfg: cfg.clone(),
            built: cfg.clone(),
            storage,
            embed,
            blocks,
            norm: get("model.norm.weight")?.to_f32_vec(),
            head,
            len: 0,
        })
    }

    /// How the block matrices are stored.
    pub fn storage(&self) -> WeightStorage {
        self.storage
    }

    /// Bytes of the block matrices (what a decode step streams from memory).
    pub fn matrix_bytes(&self) -> usize {
        self.blocks
            .iter()
            .map(|b| {
                [&b.q, &b.k, &b.v, &b.o, &b.gate, &b.up, &b.down]
                    .iter()
                    .map(|m| m.bytes())
                    .sum::<usize>()
            })
            .sum()
    }

    /// Tokens in the cache.
    pub fn cached(&self) -> usize {
        self.len
    }

    /// Empty the cache (start a new sequence).
    pub fn reset(&mut self) {
        self.len = 0;
        for b in &mut self.blocks {
            b.k_cache.clear();
            b.v_cache.clear();
        }
    }

    /// Append `tokens` to the sequence and return their logits `(tokens.len(), V)`.
    pub fn forward(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        if self.cfg != self.built {
            return Err(Error::Config(format!(
                "the decoder's cfg was changed after it was made (now {:?}, built for {:?}); \
                 its weights and cache keep the built dimensions",
                self.cfg, self.built
            )));
        }
        let cfg = &self.cfg;
        let (c, v) = (cfg.hidden_size, cfg.vocab_size);
        let (hq, hkv, d) = (
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim(),
        );
        let m = tokens.len();
        if m == 0 {
            return Err(Error::Shape("no tokens to decode".into()));
        }
        if self.len + m > cfg.max_position_embeddings {
            return Err(Error::Shape(format!(
                "{} cached + {m} new tokens exceed max_position_embeddings {}",
                self.len, cfg.max_position_embeddings
            )));
        }
        let mut x = Vec::with_capacity(m * c);
        for &t in tokens {
            let t = t as usize;
            if t >= v {
                return Err(Error::Shape(format!(
                    "token {t} outside the vocabulary of {v}"
                )));
            }
            x.extend_from_slice(&self.embed[t * c..(t + 1) * c]);
        }
        let eps = cfg.rms_norm_eps;
        let inv_freq = cfg.rope_inv_freq();
        let start = self.len;
        for blk in &mut self.blocks {
            let h = rms_norm(&x, &blk.attn_norm, eps);
            let mut q = with_bias(blk.q.apply(&h, m)?, &blk.q_bias);
            let mut k = with_bias(blk.k.apply(&h, m)?, &blk.k_bias);
            let vv = with_bias(blk.v.apply(&h, m)?, &blk.v_bias);
            // Per-head norms: rows of width D, one per (token, head).
            if let Some(g) = &blk.q_norm {
                q = rms_norm(&q, g, eps);
            }
            if let Some(g) = &blk.k_norm {
                k = rms_norm(&k, g, eps);
            }
            rope(&mut q, m, hq, d, start, &inv_freq);
            rope(&mut k, m, hkv, d, start, &inv_freq);
            blk.k_cache.extend_from_slice(&k);
            blk.v_cache.extend_from_slice(&vv);
            let a = attend(&q, &blk.k_cache, &blk.v_cache, m, start, hq, hkv, d);
            let o = with_bias(blk.o.apply(&a, m)?, &blk.o_bias);
            x.iter_mut().zip(&o).for_each(|(xi, oi)| *xi += oi);
            let h2 = rms_norm(&x, &blk.mlp_norm, eps);
            let g = blk.gate.apply(&h2, m)?;
            let u = blk.up.apply(&h2, m)?;
            let act: Vec<f32> = g
                .iter()
                .zip(&u)
                .map(|(&g, &u)| g / (1.0 + (-g).exp()) * u)
                .collect();
            let dn = blk.down.apply(&act, m)?;
            x.iter_mut().zip(&dn).for_each(|(xi, di)| *xi += di);
        }
        self.len += m;
        let h = rms_norm(&x, &self.norm, eps);
        let logits = matmul_weights(
            &Tensor::from_f32(&[m, c], h)?,
            &WeightRef::F32(&self.head, v, c),
        )?;
        Ok(logits.to_f32_vec())
    }
}

/// `y (m, N)` plus `bias (N)` on every row, if there is one.
fn with_bias(mut y: Vec<f32>, bias: &Option<Vec<f32>>) -> Vec<f32> {
    if let Some(b) = bias {
        for row in y.chunks_mut(b.len().max(1)) {
            row.iter_mut().zip(b).for_each(|(o, &bi)| *o += bi);
        }
    }
    y
}

/// Row-wise RMSNorm in f32 with an f64 mean of squares.
fn rms_norm(x: &[f32], g: &[f32], eps: f64) -> Vec<f32> {
    let c = g.len();
    let mut out = vec![0f32; x.len()];
    for (o, r) in out.chunks_mut(c).zip(x.chunks(c)) {
        let ms = r.iter().map(|&v| (v as f64) * (v as f64)).sum::<f64>() / c as f64;
        let inv = (1.0 / (ms + eps).sqrt()) as f32;
        for i in 0..c {
            o[i] = r[i] * inv * g[i];
        }
    }
    out
}

/// Rotary embedding of `(m, heads, d)` rows at positions `start..start+m`
/// (the same rotation as [`crate::rope::Rope`]: pairs `(i, i + d/2)`).
fn rope(x: &mut [f32], m: usize, heads: usize, d: usize, start: usize, inv_freq: &[f64]) {
    let half = d / 2;
    for t in 0..m {
        let pos = (start + t) as f64;
        for (i, &f) in inv_freq.iter().enumerate().take(half) {
            let a = pos * f;
            let (c, s) = (a.cos() as f32, a.sin() as f32);
            for h in 0..heads {
                let base = (t * heads + h) * d;
                let (p, q) = (x[base + i], x[base + i + half]);
                x[base + i] = p * c - q * s;
                x[base + i + half] = q * c + p * s;
            }
        }
    }
}

/// Causal attention of `m` new queries (positions `start..`) over the cache
/// (`start + m` keys and values), grouped-query heads.
#[allow(clippy::too_many_arguments)]
fn attend(
    q: &[f32],
    kc: &[f32],
    vc: &[f32],
    m: usize,
    start: usize,
    hq: usize,
    hkv: usize,
    d: usize,
) -> Vec<f32> {
    let group = hq / hkv;
    let kvw = hkv * d;
    let scale = 1.0 / (d as f64).sqrt();
    let mut out = vec![0f32; m * hq * d];
    let mut scores = Vec::new();
    for t in 0..m {
        let len = start + t + 1;
        for h in 0..hq {
            let kh = h / group;
            let qv = &q[(t * hq + h) * d..(t * hq + h + 1) * d];
            scores.clear();
            let mut max = f64::NEG_INFINITY;
            for j in 0..len {
                let kv = &kc[j * kvw + kh * d..j * kvw + (kh + 1) * d];
                let s = qv
                    .iter()
                    .zip(kv)
                    .map(|(&a, &b)| a as f64 * b as f64)
                    .sum::<f64>()
                    * scale;
                max = max.max(s);
                scores.push(s);
            }
            let mut sum = 0.0;
            scores.iter_mut().for_each(|s| {
                *s = (*s - max).exp();
                sum += *s;
            });
            let o = &mut out[(t * hq + h) * d..(t * hq + h + 1) * d];
            for (j, &p) in scores.iter().enumerate() {
                let vv = &vc[j * kvw + kh * d..j * kvw + (kh + 1) * d];
                let w = (p / sum) as f32;
                o.iter_mut().zip(vv).for_each(|(oi, &vi)| *oi += w * vi);
            }
        }
    }
    out
}

/// Check the sampling parameters of [`sample`] before decoding: the
/// temperature must be finite (a NaN one would turn every share into NaN,
/// and [`sample`] would always pick the last kept token;
/// [`Error::NonFinite`]) and not negative ([`Error::OutOfRange`]).
pub fn check_sampling(temperature: f32) -> Result<()> {
    let want = "expected a finite number, 0 or above (0 = greedy)";
    if !temperature.is_finite() {
        Err(Error::NonFinite(format!(
            "temperature {temperature}: {want}"
        )))
    } else if temperature < 0.0 {
        Err(Error::OutOfRange(format!(
            "temperature {temperature}: {want}"
        )))
    } else {
        Ok(())
    }
}

/// Check the logits row that [`sample`] is about to read: every value must
/// be finite, or the model's output is garbage (e.g. a NaN weight). `step`
/// names the token being generated in the error (0: the first, from the
/// prompt's logits).
pub fn check_logits(logits: &[f32], step: usize) -> Result<()> {
    match logits.iter().position(|x| !x.is_finite()) {
        None => Ok(()),
        Some(i) => Err(Error::NonFinite(format!(
            "the model produced non-finite logits at step {step} (token {i}: {}); are its weights finite?",
            logits[i]
        ))),
    }
}

/// Pick the next token from `logits`: greedy at temperature 0, else softmax
/// at `temperature` over the `top_k` largest (all when 0), drawn with `u` in `[0, 1)`.
pub fn sample(logits: &[f32], temperature: f32, top_k: usize, u: f64) -> u32 {
    let (idx, shares) = sample_shares(logits, temperature, top_k);
    let Some(shares) = shares else {
        return idx.first().copied().unwrap_or(0) as u32;
    };
    shares
        .iter()
        .position(|&acc| u < acc)
        .map_or(idx[shares.len() - 1], |j| idx[j]) as u32
}

/// What [`sample`] draws from: the token ids ordered by logit (f32 total
/// order, largest first, ties to the lower id) and, unless the pick is
/// greedy (`None`: temperature not above 0, or one logit), the running
/// shares of the first `top_k` (all when 0) that `u` is compared with in
/// turn: weights `exp((l - l_max) / T)` in f64, each share the previous plus
/// `weight / total`, in that order.
pub fn sample_shares(
    logits: &[f32],
    temperature: f32,
    top_k: usize,
) -> (Vec<usize>, Option<Vec<f64>>) {
    let mut idx: Vec<usize> = (0..logits.len()).collect();
    idx.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    if temperature <= 0.0 || idx.len() <= 1 {
        return (idx, None);
    }
    let keep = if top_k == 0 {
        idx.len()
    } else {
        top_k.min(idx.len())
    };
    let top = logits[idx[0]] as f64;
    let w: Vec<f64> = idx[..keep]
        .iter()
        .map(|&i| ((logits[i] as f64 - top) / temperature as f64).exp())
        .collect();
    let total: f64 = w.iter().sum();
    let mut acc = 0.0;
    let shares = w
        .iter()
        .map(|&wi| {
            acc += wi / total;
            acc
        })
        .collect();
    (idx, Some(shares))
}

//! Rotary position embedding, Hugging Face Llama convention ("rotate_half":
//! element `i` pairs with `i + D/2`), positions `0..T`.
//!
//! `out[i] = x[i] cos - x[i + D/2] sin`, `out[i + D/2] = x[i + D/2] cos + x[i] sin`
//! with angle `t * theta^(-2i/D)`. A rotation is orthogonal, so the backward
//! is the rotation by the opposite angle and nothing needs saving.

use crate::{Error, Result};
use octet_tensor::cpu::Real;
use octet_tensor::Tensor;
use rayon::prelude::*;

/// Precomputed cos/sin tables.
#[derive(Clone, Debug)]
pub struct Rope {
    head_dim: usize,
    max_seq: usize,
    cos: Vec<f64>, // (max_seq, D/2)
    sin: Vec<f64>, // (max_seq, D/2)
}

impl Rope {
    /// Tables for `head_dim` (even) up to `max_seq` positions with base `theta`;
    /// `max_seq * head_dim / 2` may not exceed
    /// [`MAX_ROPE_ENTRIES`](crate::llama::MAX_ROPE_ENTRIES).
    pub fn new(head_dim: usize, max_seq: usize, theta: f64) -> Result<Rope> {
        let inv_freq: Vec<f64> = (0..head_dim / 2)
            .map(|i| theta.powf(-2.0 * i as f64 / head_dim as f64))
            .collect();
        Rope::with_inv_freq(head_dim, max_seq, &inv_freq)
    }

    /// Tables for a model: its head dimension, `max_position_embeddings`
    /// positions and [`LlamaConfig::rope_inv_freq`](crate::llama::LlamaConfig::rope_inv_freq)
    /// (`rope_theta` with any `rope_scaling`).
    pub fn for_config(cfg: &crate::llama::LlamaConfig) -> Result<Rope> {
        Rope::with_inv_freq(
            cfg.head_dim(),
            cfg.max_position_embeddings,
            &cfg.rope_inv_freq(),
        )
    }

    /// Tables whose pair `i` turns by angle `t * inv_freq[i]` at position
    /// `t` (`inv_freq` holds `head_dim / 2` frequencies).
    pub fn with_inv_freq(head_dim: usize, max_seq: usize, inv_freq: &[f64]) -> Result<Rope> {
        if head_dim == 0 || !head_dim.is_multiple_of(2) || max_seq == 0 {
            return Err(Error::Shape(format!(
                "RoPE needs an even head_dim and max_seq > 0, got {head_dim}, {max_seq}"
            )));
        }
        let half = head_dim / 2;
        if inv_freq.len() != half {
            return Err(Error::Shape(format!(
                "RoPE needs head_dim / 2 = {half} frequencies, got {}",
                inv_freq.len()
            )));
        }
        let max = crate::llama::MAX_ROPE_ENTRIES;
        let entries = match max_seq.checked_mul(half) {
            Some(n) if n <= max => n,
            _ => {
                return Err(Error::Config(format!(
                    "RoPE tables for {max_seq} positions x head_dim {head_dim} / 2 exceed the limit of {max} entries (lower max_position_embeddings)"
                )))
            }
        };
        let (mut cos, mut sin) = (Vec::with_capacity(entries), Vec::with_capacity(entries));
        for t in 0..max_seq {
            for &f in inv_freq {
                let a = t as f64 * f;
                cos.push(a.cos());
                sin.push(a.sin());
            }
        }
        Ok(Rope {
            head_dim,
            max_seq,
            cos,
            sin,
        })
    }

    fn apply(&self, x: &Tensor, sign: f64) -> Result<Tensor> {
        let s = x.shape();
        // An empty batch, sequence or head count is an error (a zero T or H
        // would also make the per-sequence chunk size zero, which panics).
        if s.len() != 4 || s[3] != self.head_dim || s[1] > self.max_seq || s.contains(&0) {
            return Err(Error::Shape(format!(
                "RoPE expects (B > 0, 0 < T <= {}, H > 0, {}), got {s:?}",
                self.max_seq, self.head_dim
            )));
        }
        let (t, h, d) = (s[1], s[2], s[3]);
        fn run<T: Real>(
            rope: &Rope,
            x: &[T],
            (t, h, d): (usize, usize, usize),
            sign: f64,
        ) -> octet_tensor::Result<Vec<T>> {
            let half = d / 2;
            let what = format_args!("a RoPE output of {} elements", x.len());
            let mut out = octet_tensor::alloc_vec(x.len(), T::zero(), what)?;
            // One (T, H, D) sequence per task; position = row index within the sequence.
            out.par_chunks_mut(t * h * d)
                .zip(x.par_chunks(t * h * d))
                .for_each(|(o, xs)| {
                    for pos in 0..t {
                        let cs = &rope.cos[pos * half..(pos + 1) * half];
                        let sn = &rope.sin[pos * half..(pos + 1) * half];
                        for head in 0..h {
                            let base = (pos * h + head) * d;
                            for i in 0..half {
                                let c = T::from(cs[i]).unwrap_or_else(T::zero);
                                let s = T::from(sign * sn[i]).unwrap_or_else(T::zero);
                                let (a, b) = (xs[base + i], xs[base + i + half]);
                                o[base + i] = a * c - b * s;
                                o[base + i + half] = b * c + a * s;
                            }
                        }
                    }
                });
            Ok(out)
        }
        match x.as_f64() {
            Some(v) => Tensor::from_f64(s, run(self, v, (t, h, d), sign)?),
            None => {
                Tensor::from_f32_as(s, run(self, &x.f32_values()?, (t, h, d), sign)?, x.dtype())
            }
        }
        .map_err(Into::into)
    }

    /// The cos and sin tables as f32, `(max_seq, D/2)` each, row-major: what
    /// the GPU kernels read (the same values the CPU rotation rounds to f32).
    pub fn tables_f32(&self) -> (Vec<f32>, Vec<f32>) {
        (
            self.cos.iter().map(|&v| v as f32).collect(),
            self.sin.iter().map(|&v| v as f32).collect(),
        )
    }

    /// Rotate `x (B, T, H, D)` by each position's angle.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.apply(x, 1.0)
    }

    /// Backward of [`Rope::forward`]: rotate `dy (B, T, H, D)` by the opposite angle.
    pub fn backward(&self, dy: &Tensor) -> Result<Tensor> {
        self.apply(dy, -1.0)
    }
}

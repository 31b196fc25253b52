//! Token embedding: a row lookup forward, a scatter-add backward.

use crate::{Error, Result};
use octet_tensor::cpu::Real;
use octet_tensor::{DType, Tensor};

/// Embedding table `(V, C)`.
#[derive(Clone, Debug)]
pub struct Embedding {
    /// The table `(V, C)`.
    pub weight: Tensor,
}

impl Embedding {
    /// An embedding from its table `(V, C)`.
    pub fn new(weight: Tensor) -> Result<Embedding> {
        if weight.shape().len() != 2 || weight.numel() == 0 {
            return Err(Error::Shape(format!(
                "embedding table must be (V, C), got {:?}",
                weight.shape()
            )));
        }
        Ok(Embedding { weight })
    }

    fn check(&self, tokens: &[u32]) -> Result<(usize, usize)> {
        let (v, c) = (self.weight.shape()[0], self.weight.shape()[1]);
        if tokens.is_empty() {
            return Err(Error::Shape("embedding: no tokens".into()));
        }
        if let Some((i, &t)) = tokens.iter().enumerate().find(|(_, &t)| t as usize >= v) {
            return Err(Error::Shape(format!(
                "token id {t} at position {i} is outside the vocabulary of {v}"
            )));
        }
        Ok((v, c))
    }

    /// Rows of the table for `tokens`: `(N, C)` in the table's dtype.
    pub fn forward(&self, tokens: &[u32]) -> Result<Tensor> {
        let (_, c) = self.check(tokens)?;
        fn gather<T: Copy>(w: &[T], tokens: &[u32], c: usize) -> octet_tensor::Result<Vec<T>> {
            let n = tokens.len();
            let len = octet_tensor::checked_numel(&[n, c])?;
            let what = format_args!("the ({n}, {c}) embedding output");
            let mut out = octet_tensor::alloc_capacity(len, what)?;
            for &t in tokens {
                out.extend_from_slice(&w[t as usize * c..(t as usize + 1) * c]);
            }
            Ok(out)
        }
        let n = tokens.len();
        let w = &self.weight;
        Ok(match w.dtype() {
            DType::F64 => {
                Tensor::from_f64(&[n, c], gather(w.as_f64().unwrap_or_default(), tokens, c)?)?
            }
            DType::Bf16 => {
                Tensor::from_bf16(&[n, c], gather(w.as_bf16().unwrap_or_default(), tokens, c)?)?
            }
            DType::F32 => {
                Tensor::from_f32(&[n, c], gather(w.as_f32().unwrap_or_default(), tokens, c)?)?
            }
        })
    }

    /// `d_weight (V, C)`: each row of `dy (N, C)` added to its token's row, in order.
    pub fn backward(&self, tokens: &[u32], dy: &Tensor) -> Result<Tensor> {
        let (v, c) = self.check(tokens)?;
        if dy.shape() != [tokens.len(), c] {
            return Err(Error::Shape(format!(
                "embedding grad {:?} for {} tokens of width {c}",
                dy.shape(),
                tokens.len()
            )));
        }
        fn scatter<T: Real>(
            dy: &[T],
            tokens: &[u32],
            v: usize,
            c: usize,
        ) -> octet_tensor::Result<Vec<T>> {
            let what = format_args!("the ({v}, {c}) embedding gradient");
            let mut dw = octet_tensor::alloc_vec(v * c, T::zero(), what)?;
            for (&t, row) in tokens.iter().zip(dy.chunks(c)) {
                for (o, &g) in dw[t as usize * c..(t as usize + 1) * c].iter_mut().zip(row) {
                    *o = *o + g;
                }
            }
            Ok(dw)
        }
        Ok(match dy.dtype() {
            DType::F64 => Tensor::from_f64(&[v, c], scatter(&dy.try_to_f64_vec()?, tokens, v, c)?)?,
            _ => Tensor::from_f32(&[v, c], scatter(&dy.f32_values()?, tokens, v, c)?)?,
        })
    }
}

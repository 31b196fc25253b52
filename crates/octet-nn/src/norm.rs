//! RMSNorm: `y = x / rms(x) * weight`, `rms(x) = sqrt(mean(x^2) + eps)` per row.

use crate::{Error, Result};
use octet_tensor::cpu::Real;
use octet_tensor::{alloc_vec, DType, Tensor};
use rayon::prelude::*;

/// Root-mean-square normalisation over the last dimension.
#[derive(Clone, Debug)]
pub struct RmsNorm {
    /// Gain `(C)`.
    pub weight: Tensor,
    /// Added to the mean square.
    pub eps: f64,
}

/// What [`RmsNorm::backward`] reads: the input and the per-row `1 / rms`.
#[derive(Clone, Debug)]
pub struct RmsNormSaved {
    x: Tensor,      // (M, C)
    rstd: Vec<f64>, // (M)
}

impl RmsNormSaved {
    /// Bytes kept: the input in its dtype and one f64 `1/rms` per row.
    pub fn bytes(&self) -> usize {
        self.x.bytes() + 8 * self.rstd.len()
    }
}

fn rows_forward<T: Real>(x: &[T], w: &[T], c: usize, eps: f64) -> Result<(Vec<T>, Vec<f64>)> {
    let m = x.len() / c;
    let mut y = alloc_vec(
        x.len(),
        T::zero(),
        format_args!("the ({m}, {c}) RMSNorm output"),
    )?;
    let mut rstd = alloc_vec(m, 0f64, format_args!("the RMSNorm statistics of {m} rows"))?;
    y.par_chunks_mut(c)
        .zip(x.par_chunks(c))
        .zip(rstd.par_iter_mut())
        .for_each(|((yr, xr), rs)| {
            let ms =
                xr.iter().fold(T::zero(), |a, &v| a + v * v) / T::from(c).unwrap_or_else(T::one);
            let r = T::one() / (ms + T::from(eps).unwrap_or_else(T::zero)).sqrt();
            *rs = r.to_f64().unwrap_or(f64::NAN);
            for ((o, &v), &g) in yr.iter_mut().zip(xr).zip(w) {
                *o = v * r * g;
            }
        });
    Ok((y, rstd))
}

fn rows_backward<T: Real>(
    x: &[T],
    w: &[T],
    dy: &[T],
    rstd: &[f64],
    c: usize,
) -> Result<(Vec<T>, Vec<T>)> {
    // dx_i = r (g_i dy_i) - r^3 x_i mean_j(g_j dy_j x_j);  dw_i = sum_rows dy_i x_i r
    let m = x.len() / c;
    let mut dx = alloc_vec(
        x.len(),
        T::zero(),
        format_args!("the ({m}, {c}) RMSNorm input gradient"),
    )?;
    dx.par_chunks_mut(c)
        .zip(x.par_chunks(c))
        .zip(dy.par_chunks(c))
        .zip(rstd.par_iter())
        .for_each(|(((dxr, xr), dyr), &r)| {
            let r = T::from(r).unwrap_or_else(T::zero);
            let dot = xr
                .iter()
                .zip(dyr)
                .zip(w)
                .fold(T::zero(), |a, ((&xv, &g), &wv)| a + g * wv * xv);
            let k = r * r * r * dot / T::from(c).unwrap_or_else(T::one);
            for (((o, &xv), &g), &wv) in dxr.iter_mut().zip(xr).zip(dyr).zip(w) {
                *o = r * g * wv - k * xv;
            }
        });
    // Weight gradient: rows summed in order (deterministic).
    let mut dw = vec![T::zero(); c];
    for ((xr, dyr), &r) in x.chunks(c).zip(dy.chunks(c)).zip(rstd) {
        let r = T::from(r).unwrap_or_else(T::zero);
        for ((o, &xv), &g) in dw.iter_mut().zip(xr).zip(dyr) {
            *o = *o + g * xv * r;
        }
    }
    Ok((dx, dw))
}

impl RmsNorm {
    /// A norm with gain `(C)`.
    pub fn new(weight: Tensor, eps: f64) -> Result<RmsNorm> {
        if weight.shape().len() != 1 || weight.numel() == 0 {
            return Err(Error::Shape(format!(
                "RMSNorm weight must be (C), got {:?}",
                weight.shape()
            )));
        }
        Ok(RmsNorm { weight, eps })
    }

    fn check(&self, x: &Tensor) -> Result<(usize, usize)> {
        let (m, c) = x.dims2()?;
        if c != self.weight.numel() || m == 0 {
            return Err(Error::Shape(format!(
                "RMSNorm of width {} got input {:?}",
                self.weight.numel(),
                x.shape()
            )));
        }
        Ok((m, c))
    }

    /// `y (M, C)` in `x`'s dtype; an error naming the bytes, not an abort,
    /// when the output or the saved input cannot be allocated.
    pub fn forward(&self, x: &Tensor) -> Result<(Tensor, RmsNormSaved)> {
        let (_, c) = self.check(x)?;
        let y = match x.as_f64() {
            Some(xv) => {
                let (y, rstd) = rows_forward(xv, &self.weight.try_to_f64_vec()?, c, self.eps)?;
                return Ok((
                    Tensor::from_f64(x.shape(), y)?,
                    RmsNormSaved {
                        x: x.try_clone()?,
                        rstd,
                    },
                ));
            }
            None => rows_forward(&x.f32_values()?, &self.weight.f32_values()?, c, self.eps)?,
        };
        let out = Tensor::from_f32_as(x.shape(), y.0, x.dtype())?;
        Ok((
            out,
            RmsNormSaved {
                x: x.try_clone()?,
                rstd: y.1,
            },
        ))
    }

    /// `(dx (M, C) in x's dtype, d_weight (C))`; d_weight is f64 for f64 input, else f32.
    pub fn backward(&self, saved: RmsNormSaved, dy: &Tensor) -> Result<(Tensor, Tensor)> {
        let (_, c) = self.check(&saved.x)?;
        if dy.shape() != saved.x.shape() {
            return Err(Error::Shape(format!(
                "RMSNorm grad {:?} vs input {:?}",
                dy.shape(),
                saved.x.shape()
            )));
        }
        if saved.x.dtype() == DType::F64 {
            let (dx, dw) = rows_backward(
                &saved.x.try_to_f64_vec()?,
                &self.weight.try_to_f64_vec()?,
                &dy.try_to_f64_vec()?,
                &saved.rstd,
                c,
            )?;
            return Ok((
                Tensor::from_f64(saved.x.shape(), dx)?,
                Tensor::from_f64(&[c], dw)?,
            ));
        }
        let (dx, dw) = rows_backward(
            &saved.x.f32_values()?,
            &self.weight.f32_values()?,
            &dy.f32_values()?,
            &saved.rstd,
            c,
        )?;
        Ok((
            Tensor::from_f32_as(saved.x.shape(), dx, saved.x.dtype())?,
            Tensor::from_f32(&[c], dw)?,
        ))
    }
}

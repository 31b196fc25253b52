//! Causal softmax attention with grouped-query heads.
//!
//! Query head `h` reads key/value head `h / (Hq / Hkv)`; scores are scaled by
//! `1 / sqrt(D)`. Like flash attention, the forward keeps only the per-row
//! log-sum-exp of the scores, and the backward recomputes the probabilities
//! from q and k instead of keeping a `(B, H, T, T)` matrix.

use crate::{Error, Result};
use octet_tensor::cpu::Real;
use octet_tensor::{alloc_vec, DType, Tensor};
use rayon::prelude::*;

/// What [`attention_backward`] reads.
#[derive(Clone, Debug)]
pub struct AttentionSaved {
    q: Tensor,     // (B, T, Hq, D)
    k: Tensor,     // (B, T, Hkv, D)
    v: Tensor,     // (B, T, Hkv, D)
    out: Tensor,   // (B, T, Hq, D)
    lse: Vec<f64>, // (B, Hq, T)
}

impl AttentionSaved {
    /// Bytes kept: q, k, v, the output and one f64 log-sum-exp per (b, h, t).
    pub fn bytes(&self) -> usize {
        self.q.bytes() + self.k.bytes() + self.v.bytes() + self.out.bytes() + 8 * self.lse.len()
    }
}

#[derive(Clone, Copy)]
struct Dims {
    b: usize,
    t: usize,
    hq: usize,
    hkv: usize,
    d: usize,
}

impl Dims {
    fn q(&self, b: usize, t: usize, h: usize) -> usize {
        ((b * self.t + t) * self.hq + h) * self.d
    }
    fn kv(&self, b: usize, t: usize, g: usize) -> usize {
        ((b * self.t + t) * self.hkv + g) * self.d
    }
}

fn dims(q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Dims> {
    let (qs, ks) = (q.shape(), k.shape());
    let ok = qs.len() == 4
        && ks.len() == 4
        && k.shape() == v.shape()
        && qs[0] == ks[0]
        && qs[1] == ks[1]
        && qs[3] == ks[3]
        && ks[2] > 0
        && qs[2] % ks[2] == 0
        && qs.iter().all(|&n| n > 0);
    if !ok {
        return Err(Error::Shape(format!(
            "attention expects q (B, T, Hq, D), k and v (B, T, Hkv, D) with Hkv dividing Hq; got {qs:?}, {ks:?}, {:?}",
            v.shape()
        )));
    }
    Ok(Dims {
        b: qs[0],
        t: qs[1],
        hq: qs[2],
        hkv: ks[2],
        d: qs[3],
    })
}

fn dot<T: Real>(a: &[T], b: &[T]) -> T {
    a.iter().zip(b).fold(T::zero(), |s, (&x, &y)| s + x * y)
}

fn forward_impl<T: Real>(
    q: &[T],
    k: &[T],
    v: &[T],
    n: Dims,
) -> octet_tensor::Result<(Vec<T>, Vec<f64>)> {
    let scale = T::from(1.0 / (n.d as f64).sqrt()).unwrap_or_else(T::one);
    let group = n.hq / n.hkv;
    // One task per (batch, query head): its (T, D) output and (T) log-sum-exp.
    let parts: Vec<(Vec<T>, Vec<f64>)> = (0..n.b * n.hq)
        .into_par_iter()
        .map(|bh| {
            let (b, h) = (bh / n.hq, bh % n.hq);
            let g = h / group;
            let mut out = vec![T::zero(); n.t * n.d];
            let mut lse = vec![0f64; n.t];
            let mut s = vec![T::zero(); n.t];
            for t in 0..n.t {
                let qt = &q[n.q(b, t, h)..n.q(b, t, h) + n.d];
                let mut m = T::neg_infinity();
                for j in 0..=t {
                    s[j] = dot(qt, &k[n.kv(b, j, g)..n.kv(b, j, g) + n.d]) * scale;
                    m = m.max(s[j]);
                }
                let l = (0..=t).fold(T::zero(), |a, j| a + (s[j] - m).exp());
                let lt = m + l.ln();
                lse[t] = lt.to_f64().unwrap_or(f64::NAN);
                let o = &mut out[t * n.d..(t + 1) * n.d];
                for j in 0..=t {
                    let p = (s[j] - lt).exp();
                    for (od, &vd) in o.iter_mut().zip(&v[n.kv(b, j, g)..n.kv(b, j, g) + n.d]) {
                        *od = *od + p * vd;
                    }
                }
            }
            (out, lse)
        })
        .collect();
    let what = format_args!("the {:?} attention output", [n.b, n.t, n.hq, n.d]);
    let mut out = alloc_vec(q.len(), T::zero(), what)?;
    let what = format_args!("the attention statistics of {} rows", n.b * n.hq * n.t);
    let mut lse = alloc_vec(n.b * n.hq * n.t, 0f64, what)?;
    for (bh, (o, l)) in parts.into_iter().enumerate() {
        let (b, h) = (bh / n.hq, bh % n.hq);
        for t in 0..n.t {
            out[n.q(b, t, h)..n.q(b, t, h) + n.d].copy_from_slice(&o[t * n.d..(t + 1) * n.d]);
        }
        lse[bh * n.t..(bh + 1) * n.t].copy_from_slice(&l);
    }
    Ok((out, lse))
}

/// Causal attention: `out (B, T, Hq, D)` from `q (B, T, Hq, D)`, `k, v (B, T, Hkv, D)`.
pub fn attention_forward(q: &Tensor, k: &Tensor, v: &Tensor) -> Result<(Tensor, AttentionSaved)> {
    let n = dims(q, k, v)?;
    let (out, lse) = if q.dtype() == DType::F64 {
        let (q64, k64, v64) = (
            q.try_to_f64_vec()?,
            k.try_to_f64_vec()?,
            v.try_to_f64_vec()?,
        );
        let (o, l) = forward_impl(&q64, &k64, &v64, n)?;
        (Tensor::from_f64(q.shape(), o)?, l)
    } else {
        let (o, l) = forward_impl(&q.f32_values()?, &k.f32_values()?, &v.f32_values()?, n)?;
        (Tensor::from_f32_as(q.shape(), o, q.dtype())?, l)
    };
    let saved = AttentionSaved {
        q: q.try_clone()?,
        k: k.try_clone()?,
        v: v.try_clone()?,
        out: out.try_clone()?,
        lse,
    };
    Ok((out, saved))
}

type Grads<T> = (Vec<T>, Vec<T>, Vec<T>);

fn backward_impl<T: Real>(
    q: &[T],
    k: &[T],
    v: &[T],
    out: &[T],
    lse: &[f64],
    dout: &[T],
    n: Dims,
) -> octet_tensor::Result<Grads<T>> {
    let scale = T::from(1.0 / (n.d as f64).sqrt()).unwrap_or_else(T::one);
    let group = n.hq / n.hkv;
    // One task per (batch, kv head): it owns dk, dv of that head and dq of its query heads.
    let parts: Vec<(Vec<T>, Vec<T>, Vec<T>)> = (0..n.b * n.hkv)
        .into_par_iter()
        .map(|bg| {
            let (b, g) = (bg / n.hkv, bg % n.hkv);
            let mut dq = vec![T::zero(); group * n.t * n.d]; // (G, T, D)
            let mut dk = vec![T::zero(); n.t * n.d]; // (T, D)
            let mut dv = vec![T::zero(); n.t * n.d]; // (T, D)
            for hh in 0..group {
                let h = g * group + hh;
                for t in 0..n.t {
                    let qi = n.q(b, t, h);
                    let (qt, ot, dot_) =
                        (&q[qi..qi + n.d], &out[qi..qi + n.d], &dout[qi..qi + n.d]);
                    let lt = T::from(lse[(b * n.hq + h) * n.t + t]).unwrap_or_else(T::zero);
                    let big_d = dot(dot_, ot); // sum_j p_j dp_j
                    for j in 0..=t {
                        let kj = &k[n.kv(b, j, g)..n.kv(b, j, g) + n.d];
                        let vj = &v[n.kv(b, j, g)..n.kv(b, j, g) + n.d];
                        let p = (dot(qt, kj) * scale - lt).exp();
                        let ds = p * (dot(dot_, vj) - big_d) * scale;
                        let dqt = &mut dq[(hh * n.t + t) * n.d..(hh * n.t + t + 1) * n.d];
                        for e in 0..n.d {
                            dqt[e] = dqt[e] + ds * kj[e];
                            dk[j * n.d + e] = dk[j * n.d + e] + ds * qt[e];
                            dv[j * n.d + e] = dv[j * n.d + e] + p * dot_[e];
                        }
                    }
                }
            }
            (dq, dk, dv)
        })
        .collect();
    let (mut dq, mut dk, mut dv) = (
        alloc_vec(q.len(), T::zero(), "the attention query gradient")?,
        alloc_vec(k.len(), T::zero(), "the attention key gradient")?,
        alloc_vec(v.len(), T::zero(), "the attention value gradient")?,
    );
    for (bg, (pq, pk, pv)) in parts.into_iter().enumerate() {
        let (b, g) = (bg / n.hkv, bg % n.hkv);
        for t in 0..n.t {
            let i = n.kv(b, t, g);
            dk[i..i + n.d].copy_from_slice(&pk[t * n.d..(t + 1) * n.d]);
            dv[i..i + n.d].copy_from_slice(&pv[t * n.d..(t + 1) * n.d]);
            for hh in 0..group {
                let qi = n.q(b, t, g * group + hh);
                dq[qi..qi + n.d]
                    .copy_from_slice(&pq[(hh * n.t + t) * n.d..(hh * n.t + t + 1) * n.d]);
            }
        }
    }
    Ok((dq, dk, dv))
}

/// Backward of [`attention_forward`]: `(dq, dk, dv)` in the inputs' dtype.
pub fn attention_backward(
    saved: AttentionSaved,
    d_out: &Tensor,
) -> Result<(Tensor, Tensor, Tensor)> {
    let AttentionSaved { q, k, v, out, lse } = saved;
    let n = dims(&q, &k, &v)?;
    if d_out.shape() != q.shape() {
        return Err(Error::Shape(format!(
            "attention grad {:?} vs output {:?}",
            d_out.shape(),
            q.shape()
        )));
    }
    if q.dtype() == DType::F64 {
        let (dq, dk, dv) = backward_impl(
            &q.try_to_f64_vec()?,
            &k.try_to_f64_vec()?,
            &v.try_to_f64_vec()?,
            &out.try_to_f64_vec()?,
            &lse,
            &d_out.try_to_f64_vec()?,
            n,
        )?;
        return Ok((
            Tensor::from_f64(q.shape(), dq)?,
            Tensor::from_f64(k.shape(), dk)?,
            Tensor::from_f64(v.shape(), dv)?,
        ));
    }
    let (dq, dk, dv) = backward_impl(
        &q.f32_values()?,
        &k.f32_values()?,
        &v.f32_values()?,
        &out.f32_values()?,
        &lse,
        &d_out.f32_values()?,
        n,
    )?;
    let dt = q.dtype();
    Ok((
        Tensor::from_f32_as(q.shape(), dq, dt)?,
        Tensor::from_f32_as(k.shape(), dk, dt)?,
        Tensor::from_f32_as(v.shape(), dv, dt)?,
    ))
}

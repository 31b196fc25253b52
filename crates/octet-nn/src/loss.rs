//! Mean cross-entropy over rows of logits, with its gradient.

use crate::{Error, Result};
use octet_tensor::cpu::Real;
use octet_tensor::{DType, Tensor};
use rayon::prelude::*;

/// Mean over `M` rows of `-log softmax(logits)[target]`, and `d_logits (M, V)`
/// (`softmax - onehot`, divided by `M`): f64 for f64 logits, f32 otherwise.
/// The log-sum-exp subtracts each row's max, so large logits do not overflow.
pub fn cross_entropy(logits: &Tensor, targets: &[u32]) -> Result<(f64, Tensor)> {
    let (m, v) = logits.dims2()?;
    if targets.len() != m || m == 0 {
        return Err(Error::Shape(format!(
            "{} targets for {m} rows of logits",
            targets.len()
        )));
    }
    if let Some((i, &t)) = targets.iter().enumerate().find(|(_, &t)| t as usize >= v) {
        return Err(Error::Shape(format!(
            "target {t} at row {i} is outside the vocabulary of {v}"
        )));
    }
    fn run<T: Real>(x: &[T], targets: &[u32], v: usize) -> (f64, Vec<T>) {
        let m = targets.len();
        let inv_m = T::from(1.0 / m as f64).unwrap_or_else(T::zero);
        let mut grad = vec![T::zero(); x.len()];
        let losses: Vec<f64> = grad
            .par_chunks_mut(v)
            .zip(x.par_chunks(v))
            .zip(targets.par_iter())
            .map(|((g, row), &t)| {
                let mx = row.iter().fold(T::neg_infinity(), |a, &b| a.max(b));
                let sum = row.iter().fold(T::zero(), |a, &b| a + (b - mx).exp());
                let lse = mx + sum.ln();
                for (gi, &xi) in g.iter_mut().zip(row) {
                    *gi = (xi - lse).exp() * inv_m;
                }
                g[t as usize] = g[t as usize] - inv_m;
                (lse - row[t as usize]).to_f64().unwrap_or(f64::NAN)
            })
            .collect();
        (losses.iter().sum::<f64>() / m as f64, grad)
    }
    match logits.dtype() {
        DType::F64 => {
            let (l, g) = run(&logits.to_f64_vec(), targets, v);
            Ok((l, Tensor::from_f64(&[m, v], g)?))
        }
        _ => {
            let (l, g) = run(&logits.to_f32_vec(), targets, v);
            Ok((l, Tensor::from_f32(&[m, v], g)?))
        }
    }
}

//! Mean cross-entropy over rows of logits, with its gradient.
//!
//! A row whose target is [`IGNORE`] is masked (a prompt token in
//! fine-tuning data, as PyTorch's `ignore_index=-100`): it adds neither loss
//! nor gradient, and the mean is over the counted rows only.
//!
//! | counted rows | loss                           | `d_logits` of a counted row |
//! |--------------|--------------------------------|-----------------------------|
//! | `n >= 1`     | mean of their `-log p[target]` | `(softmax - onehot) / n`    |
//! | `0`          | 0 (nothing to learn)           | all zero                    |
//!
//! (PyTorch returns NaN for a batch with no counted row; 0 keeps such a batch
//! of packed fine-tuning data, a window inside one long prompt, from failing
//! the run.)

use crate::{Error, Result};
use octet_tensor::cpu::Real;
use octet_tensor::{DType, Tensor};
use rayon::prelude::*;

/// The target of a masked row: it counts toward neither the loss nor the
/// gradient.
pub const IGNORE: u32 = u32::MAX;

/// Mean over the counted rows of `M` of `-log softmax(logits)[target]`, and
/// `d_logits (M, V)` (`softmax - onehot` over the number of counted rows, 0 on
/// masked rows): f64 for f64 logits, f32 otherwise. Rows with target
/// [`IGNORE`] are masked (see the module docs). The log-sum-exp subtracts
/// each row's max, so large logits do not overflow.
pub fn cross_entropy(logits: &Tensor, targets: &[u32]) -> Result<(f64, Tensor)> {
    let (m, v) = logits.dims2()?;
    if targets.len() != m || m == 0 {
        return Err(Error::Shape(format!(
            "{} targets for {m} rows of logits",
            targets.len()
        )));
    }
    if let Some((i, &t)) = targets
        .iter()
        .enumerate()
        .find(|(_, &t)| t != IGNORE && t as usize >= v)
    {
        return Err(Error::Shape(format!(
            "target {t} at row {i} is outside the vocabulary of {v}"
        )));
    }
    fn run<T: Real>(x: &[T], targets: &[u32], v: usize) -> octet_tensor::Result<(f64, Vec<T>)> {
        let counted = targets.iter().filter(|&&t| t != IGNORE).count();
        let inv_m = T::from(1.0 / counted.max(1) as f64).unwrap_or_else(T::zero);
        let what = format_args!("the ({}, {v}) logits gradient", targets.len());
        let mut grad = octet_tensor::alloc_vec(x.len(), T::zero(), what)?;
        let losses: Vec<f64> = grad
            .par_chunks_mut(v)
            .zip(x.par_chunks(v))
            .zip(targets.par_iter())
            .map(|((g, row), &t)| {
                if t == IGNORE {
                    return 0.0;
                }
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
        Ok((losses.iter().sum::<f64>() / counted.max(1) as f64, grad))
    }
    match logits.dtype() {
        DType::F64 => {
            let (l, g) = run(&logits.try_to_f64_vec()?, targets, v)?;
            Ok((l, Tensor::from_f64(&[m, v], g)?))
        }
        _ => {
            let (l, g) = run(&logits.f32_values()?, targets, v)?;
            Ok((l, Tensor::from_f32(&[m, v], g)?))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `-log softmax(row)[t]` and its gradient row in f64, for the reference.
    fn row_ref(row: &[f64], t: usize) -> (f64, Vec<f64>) {
        let mx = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let lse = mx + row.iter().map(|x| (x - mx).exp()).sum::<f64>().ln();
        let mut g: Vec<f64> = row.iter().map(|x| (x - lse).exp()).collect();
        g[t] -= 1.0;
        (lse - row[t], g)
    }

    /// A masked loss equals the loss over the kept rows alone (an f64
    /// reference), its gradient is theirs over the kept count, and masked
    /// rows get none; an all-masked batch is 0 with no gradient.
    #[test]
    fn a_masked_loss_is_the_loss_over_the_kept_tokens_only() {
        let (m, v) = (7, 5);
        let x: Vec<f64> = (0..m * v)
            .map(|i| ((i * 37 % 11) as f64 - 5.0) * 0.7)
            .collect();
        let targets = [3, IGNORE, 0, 4, IGNORE, IGNORE, 1];
        let kept: Vec<usize> = (0..m).filter(|&i| targets[i] != IGNORE).collect();
        let n = kept.len() as f64;
        let mut want_loss = 0.0;
        let mut want_grad = vec![0.0; m * v];
        for &i in &kept {
            let (l, g) = row_ref(&x[i * v..(i + 1) * v], targets[i] as usize);
            want_loss += l / n;
            for (w, gi) in want_grad[i * v..(i + 1) * v].iter_mut().zip(g) {
                *w = gi / n;
            }
        }
        // The kept rows alone, unmasked, give the same loss.
        let only: Vec<f64> = kept
            .iter()
            .flat_map(|&i| x[i * v..(i + 1) * v].to_vec())
            .collect();
        let only_t: Vec<u32> = kept.iter().map(|&i| targets[i]).collect();
        let t_only = Tensor::from_f64(&[kept.len(), v], only).unwrap();
        let (l_only, _) = cross_entropy(&t_only, &only_t).unwrap();
        for dtype in [DType::F64, DType::F32] {
            let logits = Tensor::from_f64(&[m, v], x.clone())
                .unwrap()
                .to_dtype(dtype);
            let (loss, grad) = cross_entropy(&logits, &targets).unwrap();
            let tol = if dtype == DType::F64 { 1e-12 } else { 1e-6 };
            assert!(
                (loss - want_loss).abs() < tol,
                "{dtype:?}: {loss} vs {want_loss}"
            );
            assert!((loss - l_only).abs() < tol, "{dtype:?}: {loss} vs {l_only}");
            for (i, (g, w)) in grad.to_f64_vec().iter().zip(&want_grad).enumerate() {
                assert!((g - w).abs() < tol, "{dtype:?} d_logits[{i}]: {g} vs {w}");
                if targets[i / v] == IGNORE {
                    assert_eq!(*g, 0.0, "masked row {} has a gradient", i / v);
                }
            }
        }
        let logits = Tensor::from_f64(&[m, v], x).unwrap();
        let (loss, grad) = cross_entropy(&logits, &[IGNORE; 7]).unwrap();
        assert_eq!(loss, 0.0);
        assert!(grad.to_f64_vec().iter().all(|&g| g == 0.0));
        // A target past the vocabulary that is not the mask is still an error.
        assert!(cross_entropy(&logits, &[5, 0, 0, 0, 0, 0, 0]).is_err());
    }
}

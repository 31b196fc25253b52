//! The LM head and cross-entropy, fused and chunked over tokens so that no
//! `tokens x vocab` f32 tensor exists at once, forward or backward.

use super::*;

/// The LM head and loss's part of the backward, computed in the forward
/// ([`head_loss`]): the gradient of the final norm's output `(B*T, C)` and
/// the head weight's gradient `(V, C)` (`None` for a frozen head). No
/// `(B*T, V)` tensor outlives its chunk.
#[derive(Clone, Debug)]
pub(super) struct HeadSaved {
    pub(super) dh: Tensor,
    pub(super) d_weight: Option<Tensor>,
}

impl HeadSaved {
    /// Bytes held.
    pub(super) fn bytes(&self) -> usize {
        self.dh.bytes() + self.d_weight.as_ref().map_or(0, Tensor::bytes)
    }
}

/// Logits a chunk of the fused LM head and loss holds at most (16 MiB of
/// f32, twice over with their gradient): `max(1, HEAD_CHUNK / V)` rows.
pub const HEAD_CHUNK: usize = 1 << 22;

/// A copy of an optional tensor (a bias), or [`octet_tensor::Error::Alloc`].
pub(super) fn try_clone_opt(t: &Option<Tensor>) -> Result<Option<Tensor>> {
    Ok(t.as_ref().map(Tensor::try_clone).transpose()?)
}

/// An empty buffer with room for the `(rows, cols)` matrix `what`, or
/// [`octet_tensor::Error::Alloc`] naming it when the allocator cannot
/// provide it: every copy of the head's helpers ([`rows`], [`stack_rows`])
/// is made in one.
pub(super) fn row_buffer<T>(rows: usize, cols: usize, what: &str) -> Result<Vec<T>> {
    let n = rows
        .checked_mul(cols)
        .ok_or_else(|| Error::Shape(format!("{what}: ({rows}, {cols}) overflows usize")))?;
    Ok(alloc_capacity(n, format_args!("{what} ({rows}, {cols})"))?)
}

/// Rows `r0..r1` of a 2-D tensor, in its dtype; [`octet_tensor::Error::Alloc`]
/// when the copy cannot be allocated.
pub(super) fn rows(t: &Tensor, r0: usize, r1: usize) -> Result<Tensor> {
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
pub(super) fn stack_rows(parts: &[Tensor]) -> Result<Tensor> {
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
pub(super) fn scaled(t: &Tensor, k: f64) -> Result<Tensor> {
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
pub(super) fn head_loss(
    head: &mut Linear,
    h: &Tensor,
    targets: &[u32],
) -> Result<(f64, HeadSaved)> {
    head_loss_in(head, h, targets, HEAD_CHUNK)
}

/// [`head_loss`] with chunks of at most `chunk` logits.
pub(super) fn head_loss_in(
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

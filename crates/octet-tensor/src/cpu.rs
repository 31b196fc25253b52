//! CPU reference kernels.

use crate::tensor::checked_alloc;
use crate::{alloc_capacity, alloc_collect, alloc_vec, DType, Error, Result, Tensor};
use gemm::Parallelism;
use octet_fp8::convert::ToF32;
use octet_fp8::{QuantData, QuantSpec, QuantizedTensor, Scales, Usage};
use std::convert::Infallible;

/// Below this many multiply-adds a GEMM runs on one thread.
const PAR_FLOPS: usize = 1 << 18;

/// Scalars the CPU GEMM runs on (f32, and f64 for gradient checks).
pub trait Real: num_traits::Float + Send + Sync + std::fmt::Debug + 'static {}
impl Real for f32 {}
impl Real for f64 {}

/// `c (m, n) = op(a) @ op(b)` with f32 accumulation ([`gemm()`] over f32).
pub fn sgemm(m: usize, n: usize, k: usize, a: &[f32], ta: bool, b: &[f32], tb: bool) -> Vec<f32> {
    gemm(m, n, k, a, ta, b, tb)
}

/// `c (m, n) = op(a) @ op(b)`, accumulating in `T`.
///
/// `a` is `(m, k)` row-major, or `(k, m)` when `ta`; `b` is `(k, n)`, or
/// `(n, k)` when `tb`. The result is deterministic: the `gemm` crate splits
/// work over `m` and `n`, never over `k`.
///
/// # Panics
/// If a slice length disagrees with its shape (callers check shapes first).
pub fn gemm<T: Real>(m: usize, n: usize, k: usize, a: &[T], ta: bool, b: &[T], tb: bool) -> Vec<T> {
    let alloc = |len| Ok::<_, Infallible>(vec![T::zero(); len]);
    match gemm_with(m, n, k, a, ta, b, tb, alloc) {
        Ok(c) => c,
        Err(e) => match e {},
    }
}

/// [`gemm()`], with an [`Error::Alloc`] in place of the abort when the
/// `(m, n)` output cannot be allocated.
///
/// # Panics
/// As [`gemm()`], if a slice length disagrees with its shape.
#[allow(clippy::too_many_arguments)]
pub fn try_gemm<T: Real>(
    m: usize,
    n: usize,
    k: usize,
    a: &[T],
    ta: bool,
    b: &[T],
    tb: bool,
) -> Result<Vec<T>> {
    let alloc = |len| alloc_vec(len, T::zero(), format_args!("a {m}x{n} GEMM output"));
    gemm_with(m, n, k, a, ta, b, tb, alloc)
}

/// The body of [`gemm()`]: the operands checked, then the `m * n` output
/// taken from `alloc` and computed.
#[allow(clippy::too_many_arguments)]
fn gemm_with<T: Real, E>(
    m: usize,
    n: usize,
    k: usize,
    a: &[T],
    ta: bool,
    b: &[T],
    tb: bool,
    alloc: impl FnOnce(usize) -> std::result::Result<Vec<T>, E>,
) -> std::result::Result<Vec<T>, E> {
    assert_eq!(
        Some(a.len()),
        m.checked_mul(k),
        "gemm: a has {} elements, want {m}x{k}",
        a.len()
    );
    assert_eq!(
        Some(b.len()),
        k.checked_mul(n),
        "gemm: b has {} elements, want {k}x{n}",
        b.len()
    );
    let mut c = alloc(out_len(m, n))?;
    let a_strides = if ta { (1, m) } else { (k, 1) };
    let b_strides = if tb { (1, k) } else { (n, 1) };
    gemm_strided(m, n, k, a, a_strides, b, b_strides, &mut c);
    Ok(c)
}

/// `m * n` elements of a GEMM's output.
///
/// # Panics
/// If the product overflows `usize` (no such output can be allocated; callers check shapes first).
fn out_len(m: usize, n: usize) -> usize {
    m.checked_mul(n)
        .unwrap_or_else(|| panic!("gemm: an output of {m}x{n} overflows usize"))
}

/// `c (m, n) = a (m, k) @ b^T` for `b (n, k)`, both row-major, on the calling
/// thread only (for callers that already split work across threads).
///
/// # Panics
/// If a slice length disagrees with its shape (callers check shapes first).
pub fn gemm_serial(m: usize, n: usize, k: usize, a: &[f32], b: &[f32]) -> Vec<f32> {
    let alloc = |len| Ok::<_, Infallible>(vec![0f32; len]);
    match gemm_serial_with(m, n, k, a, b, alloc) {
        Ok(c) => c,
        Err(e) => match e {},
    }
}

/// [`gemm_serial`], with an [`Error::Alloc`] in place of the abort when the
/// `(m, n)` output cannot be allocated.
///
/// # Panics
/// As [`gemm_serial`], if a slice length disagrees with its shape.
pub fn try_gemm_serial(m: usize, n: usize, k: usize, a: &[f32], b: &[f32]) -> Result<Vec<f32>> {
    let alloc = |len| alloc_vec(len, 0f32, format_args!("a {m}x{n} GEMM output"));
    gemm_serial_with(m, n, k, a, b, alloc)
}

/// The body of [`gemm_serial`]: the operands checked, then the `m * n`
/// output taken from `alloc` and computed.
fn gemm_serial_with<E>(
    m: usize,
    n: usize,
    k: usize,
    a: &[f32],
    b: &[f32],
    alloc: impl FnOnce(usize) -> std::result::Result<Vec<f32>, E>,
) -> std::result::Result<Vec<f32>, E> {
    assert_eq!(
        Some(a.len()),
        m.checked_mul(k),
        "gemm_serial: a is not {m}x{k}"
    );
    assert_eq!(
        Some(b.len()),
        n.checked_mul(k),
        "gemm_serial: b is not {n}x{k}"
    );
    let mut c = alloc(out_len(m, n))?;
    gemm_strided_par(m, n, k, a, (k, 1), b, (1, k), &mut c, Parallelism::None);
    Ok(c)
}

/// `c (m, n) = a @ b` with explicit (row stride, column stride) in elements for `a (m, k)` and `b (k, n)`;
/// `c` is row-major and overwritten.
#[allow(clippy::too_many_arguments)]
fn gemm_strided<T: Real>(
    m: usize,
    n: usize,
    k: usize,
    a: &[T],
    (a_rs, a_cs): (usize, usize),
    b: &[T],
    (b_rs, b_cs): (usize, usize),
    c: &mut [T],
) {
    let par = if m.saturating_mul(n).saturating_mul(k) >= PAR_FLOPS {
        Parallelism::Rayon(rayon::current_num_threads())
    } else {
        Parallelism::None
    };
    gemm_strided_par(m, n, k, a, (a_rs, a_cs), b, (b_rs, b_cs), c, par);
}

/// [`gemm_strided`] with the parallelism given.
#[allow(clippy::too_many_arguments)]
fn gemm_strided_par<T: Real>(
    m: usize,
    n: usize,
    k: usize,
    a: &[T],
    (a_rs, a_cs): (usize, usize),
    b: &[T],
    (b_rs, b_cs): (usize, usize),
    c: &mut [T],
    par: Parallelism,
) {
    let mn = m.checked_mul(n);
    assert!(
        mn.is_some_and(|mn| c.len() >= mn),
        "gemm: c too short for {m}x{n}"
    );
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        c[..m * n].fill(T::zero());
        return;
    }
    // Bounds of the farthest element each operand's strides reach, in
    // checked arithmetic: a wrapped offset must never pass.
    let reach = |rows: usize, rs: usize, cols: usize, cs: usize| {
        (rows - 1)
            .checked_mul(rs)
            .zip((cols - 1).checked_mul(cs))
            .and_then(|(x, y)| x.checked_add(y))
    };
    assert!(
        reach(m, a_rs, k, a_cs).is_some_and(|e| e < a.len()),
        "gemm: a too short for its strides"
    );
    assert!(
        reach(k, b_rs, n, b_cs).is_some_and(|e| e < b.len()),
        "gemm: b too short for its strides"
    );
    // The gemm crate takes strides as isize.
    assert!(
        [a_rs, a_cs, b_rs, b_cs, n]
            .iter()
            .all(|&s| isize::try_from(s).is_ok()),
        "gemm: a stride exceeds isize"
    );
    // SAFETY: the asserts above keep every index the strides reach inside `a`, `b` and `c`;
    // `c` is exclusively borrowed and does not alias `a` or `b`.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c.as_mut_ptr(),
            1,
            n as isize,
            false,
            a.as_ptr(),
            a_cs as isize,
            a_rs as isize,
            b.as_ptr(),
            b_cs as isize,
            b_rs as isize,
            T::zero(),
            T::one(),
            false,
            false,
            false,
            par,
        );
    }
}

/// `op(a) @ op(b)` on tensors viewed as matrices (leading dims flattened),
/// result in `out` dtype with shape `(m, n)`. Accumulates in f64 when both
/// operands are f64 (the gradient-check reference), in f32 otherwise.
///
/// f32 operands are read in place; [`Error::Alloc`] when the output (or an
/// operand's f32 copy) cannot be allocated.
pub fn matmul(a: &Tensor, ta: bool, b: &Tensor, tb: bool, out: DType) -> Result<Tensor> {
    let (ar, ac) = a.dims2()?;
    let (br, bc) = b.dims2()?;
    let (m, k) = if ta { (ac, ar) } else { (ar, ac) };
    let (kb, n) = if tb { (bc, br) } else { (br, bc) };
    if k != kb {
        return Err(Error::Shape(format!(
            "matmul: op(a) is ({m}, {k}) but op(b) is ({kb}, {n}) (a {:?}{}, b {:?}{})",
            a.shape(),
            if ta { "^T" } else { "" },
            b.shape(),
            if tb { "^T" } else { "" }
        )));
    }
    let f64s = a.as_f64().is_some() && b.as_f64().is_some();
    checked_alloc(&[m, n], if f64s { 8 } else { 4 })?;
    match (a.as_f64(), b.as_f64()) {
        (Some(av), Some(bv)) => {
            Tensor::from_f64(&[m, n], try_gemm(m, n, k, av, ta, bv, tb)?)?.into_dtype(out)
        }
        _ => {
            let (av, bv) = (a.f32_values()?, b.f32_values()?);
            Tensor::from_f32_as(&[m, n], try_gemm(m, n, k, &av, ta, &bv, tb)?, out)
        }
    }
}

/// The codes of `q` decoded without their scales, row-major `(rows, cols)`;
/// [`Error::Alloc`] when that buffer cannot be allocated.
fn decode_codes(q: &QuantData) -> Result<Vec<f32>> {
    let table = q.format.table();
    let n = checked_alloc(&[q.rows, q.cols], 4)?;
    let (r, c) = (q.rows, q.cols);
    let mut out = alloc_capacity(n, format_args!("the decoded ({r}, {c}) FP8 codes"))?;
    for r in 0..q.rows {
        out.extend((0..q.cols).map(|c| table[q.code(r, c) as usize]));
    }
    Ok(out)
}

/// FP8 GEMM emulation: `d (m, n) = a (m, k) @ b (n, k)^T`, both operands K-major ("TN", as Hopper takes them).
///
/// For each stretch of K over which both operands' block scales are constant
/// (the whole K for per-tensor and row-wise scaling, 128 for DeepSeek blocks,
/// 32 for MX, 16 for NVFP4), the products of the decoded codes are summed in
/// f32 (exact products: FP8 x FP8 fits in f32), then multiplied by
/// `factor_a * factor_b` (in f64, rounded once: two tiny factors can
/// multiply below f32's range where the scaled sum is a normal f32) and added
/// to the f32 accumulator; the NVFP4 per-tensor factors multiply the result
/// last, the same way. This is the order of
/// cuBLASLt's block-scaled GEMMs and of DeepGEMM's promotion, up to the
/// summation order inside a stretch.
///
/// An error, not a panic, when an operand's codes or scales do not fill its
/// shape and block grid (`QuantData`'s fields are public).
pub fn fp8_gemm(a: &QuantData, b: &QuantData) -> Result<Vec<f32>> {
    check_quant_data(a, "a")?;
    check_quant_data(b, "b")?;
    if a.cols != b.cols {
        return Err(Error::Shape(format!(
            "fp8_gemm: reduction dims differ: a is ({}, {}), b is ({}, {})",
            a.rows, a.cols, b.rows, b.cols
        )));
    }
    let (m, n, k) = (a.rows, b.rows, a.cols);
    checked_alloc(&[m, n], 4)?;
    let (da, db) = (decode_codes(a)?, decode_codes(b)?);
    let mut acc = alloc_vec(m * n, 0f32, format_args!("a {m}x{n} FP8 GEMM output"))?;
    let mut part = alloc_vec(m * n, 0f32, format_args!("a {m}x{n} FP8 GEMM partial sum"))?;
    let mut k0 = 0;
    while k0 < k {
        let next = |blk: usize| (k0 / blk + 1) * blk;
        let k1 = next(a.block.1).min(next(b.block.1)).min(k);
        // part = da[:, k0..k1] @ db[:, k0..k1]^T, through strided views.
        gemm_strided(
            m,
            n,
            k1 - k0,
            &da[k0..],
            (k, 1),
            &db[k0..],
            (1, k),
            &mut part,
        );
        let (ka, kb) = (k0 / a.block.1, k0 / b.block.1);
        let fb: Vec<f32> = (0..n).map(|j| b.block_factor(j / b.block.0, kb)).collect();
        for (i, (acc_row, part_row)) in acc
            .chunks_exact_mut(n)
            .zip(part.chunks_exact(n))
            .enumerate()
        {
            let fa = a.block_factor(i / a.block.0, ka);
            // In f64: `fa * fb` alone can fall below f32's range (two tiny
            // factors) where the scaled sum is a normal f32.
            let fa = f64::from(fa);
            for ((o, &p), &fb) in acc_row.iter_mut().zip(part_row).zip(&fb) {
                *o += (f64::from(p) * fa * f64::from(fb)) as f32;
            }
        }
        k0 = k1;
    }
    let t = f64::from(a.tensor_factor()) * f64::from(b.tensor_factor());
    if t != 1.0 {
        acc.iter_mut().for_each(|v| *v = (f64::from(*v) * t) as f32);
    }
    Ok(acc)
}

/// `q`'s blocks are not empty, its codes fill `(rows, cols)` and it holds one
/// scale per block of its grid: what [`fp8_gemm`] indexes.
fn check_quant_data(q: &QuantData, which: &str) -> Result<()> {
    let (r, c) = (q.rows, q.cols);
    if q.block.0 == 0 || q.block.1 == 0 {
        return Err(Error::Shape(format!(
            "fp8_gemm: {which} ({r}, {c}) has empty {:?} blocks",
            q.block
        )));
    }
    let codes = r.checked_mul(q.row_stride());
    let (gr, gc) = q.grid();
    let blocks = gr.checked_mul(gc);
    let scales = match &q.scales {
        Scales::F32(v) => v.len(),
        Scales::E8M0(v) => v.len(),
        Scales::Nvfp4 { codes, .. } => codes.len(),
    };
    if codes != Some(q.data.len()) || blocks != Some(scales) {
        return Err(Error::Shape(format!(
            "fp8_gemm: {which} ({r}, {c}) in {:?} blocks has {} code bytes and {scales} scales, \
             expected {} and {}",
            q.block,
            q.data.len(),
            r as u128 * q.row_stride() as u128,
            gr as u128 * gc as u128
        )));
    }
    Ok(())
}

/// Quantize a tensor viewed as a matrix (see [`octet_fp8::quantize`]).
pub fn quantize(
    x: &Tensor,
    row: &QuantSpec,
    col: &QuantSpec,
    usage: Usage,
    tensor_amax: Option<f32>,
) -> Result<QuantizedTensor> {
    let (r, c) = x.dims2()?;
    let q = match (x.as_f32(), x.as_bf16()) {
        (Some(v), _) => octet_fp8::quantize(v, r, c, row, col, usage, tensor_amax)?,
        (_, Some(v)) => octet_fp8::quantize(v, r, c, row, col, usage, tensor_amax)?,
        _ => {
            return Err(Error::Unsupported(format!(
                "quantize: {:?} input; use f32 or bf16",
                x.dtype()
            )))
        }
    };
    Ok(q)
}

/// Sum over rows: `(rows, cols) -> (cols)` (the bias gradient), in f64 for f64
/// input and in f32 otherwise.
pub fn sum_rows(x: &Tensor) -> Result<Tensor> {
    let (r, c) = x.dims2()?;
    fn sum<T: Real>(v: &[T], r: usize, c: usize) -> Vec<T> {
        let mut out = vec![T::zero(); c];
        // `max(1)`: no columns, no sums (and no zero-sized chunks).
        for row in v.chunks_exact(c.max(1)).take(r) {
            for (o, &e) in out.iter_mut().zip(row) {
                *o = *o + e;
            }
        }
        out
    }
    match x.as_f64() {
        Some(v) => Tensor::from_f64(&[c], sum(v, r, c)),
        None => Tensor::from_f32(&[c], sum(&x.f32_values()?, r, c)),
    }
}

/// `y[i, j] + bias[j]` for a matrix `y (rows, cols)`, computed in f64 for f64
/// `y` and in f32 otherwise, returned in `y`'s dtype.
pub fn add_bias(y: &Tensor, bias: &Tensor) -> Result<Tensor> {
    let (_, c) = y.dims2()?;
    if bias.numel() != c {
        return Err(Error::Shape(format!(
            "bias has {} elements for {c} columns",
            bias.numel()
        )));
    }
    fn add<T: Real>(mut v: Vec<T>, b: &[T]) -> Vec<T> {
        // `max(1)`: no columns, nothing to add (and no zero-sized chunks).
        for row in v.chunks_exact_mut(b.len().max(1)) {
            for (o, &e) in row.iter_mut().zip(b) {
                *o = *o + e;
            }
        }
        v
    }
    match y.as_f64() {
        Some(_) => Tensor::from_f64(y.shape(), add(y.try_to_f64_vec()?, &bias.try_to_f64_vec()?)),
        None => Tensor::from_f32_as(
            y.shape(),
            add(y.try_to_f32_vec()?, &bias.f32_values()?),
            y.dtype(),
        ),
    }
}

/// Elementwise `a + b` (same shapes), in f64 for f64 `a` and f32 otherwise, in `a`'s dtype.
pub fn add(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    if a.shape() != b.shape() {
        return Err(Error::Shape(format!(
            "add: {:?} vs {:?}",
            a.shape(),
            b.shape()
        )));
    }
    let what = format_args!("the sum of two {:?} tensors", a.shape());
    match a.as_f64() {
        Some(av) => {
            let bv = b.try_to_f64_vec()?;
            let v = alloc_collect(av.iter().zip(&bv).map(|(x, y)| x + y), what)?;
            Tensor::from_f64(a.shape(), v)
        }
        None => {
            let (av, bv) = (a.f32_values()?, b.f32_values()?);
            let v = alloc_collect(av.iter().zip(bv.iter()).map(|(x, y)| x + y), what)?;
            Tensor::from_f32_as(a.shape(), v, a.dtype())
        }
    }
}

/// Widen any supported element slice to f32.
pub fn widen<T: ToF32>(x: &[T]) -> Vec<f32> {
    x.iter().map(|v| v.to_f32_exact()).collect()
}

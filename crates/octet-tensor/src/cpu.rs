//! CPU reference kernels.

use crate::{DType, Error, Result, Tensor};
use gemm::Parallelism;
use octet_fp8::convert::ToF32;
use octet_fp8::{QuantData, QuantSpec, QuantizedTensor, Usage};

/// Below this many multiply-adds a GEMM runs on one thread.
const PAR_FLOPS: usize = 1 << 18;

/// `c (m, n) = op(a) @ op(b)` with f32 accumulation.
///
/// `a` is `(m, k)` row-major, or `(k, m)` when `ta`; `b` is `(k, n)`, or
/// `(n, k)` when `tb`. The result is deterministic: the `gemm` crate splits
/// work over `m` and `n`, never over `k`.
pub fn sgemm(m: usize, n: usize, k: usize, a: &[f32], ta: bool, b: &[f32], tb: bool) -> Vec<f32> {
    assert_eq!(
        a.len(),
        m * k,
        "sgemm: a has {} elements, want {m}x{k}",
        a.len()
    );
    assert_eq!(
        b.len(),
        k * n,
        "sgemm: b has {} elements, want {k}x{n}",
        b.len()
    );
    let mut c = vec![0f32; m * n];
    sgemm_strided(
        m,
        n,
        k,
        a,
        if ta { (1, m) } else { (k, 1) },
        b,
        if tb { (1, k) } else { (n, 1) },
        &mut c,
    );
    c
}

/// `c (m, n) = a @ b` with explicit (row stride, column stride) in elements for `a (m, k)` and `b (k, n)`;
/// `c` is row-major and overwritten.
#[allow(clippy::too_many_arguments)]
fn sgemm_strided(
    m: usize,
    n: usize,
    k: usize,
    a: &[f32],
    (a_rs, a_cs): (usize, usize),
    b: &[f32],
    (b_rs, b_cs): (usize, usize),
    c: &mut [f32],
) {
    assert!(c.len() >= m * n);
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        c[..m * n].fill(0.0);
        return;
    }
    // Bounds of the farthest element each operand's strides reach.
    assert!(
        (m - 1) * a_rs + (k - 1) * a_cs < a.len(),
        "sgemm: a too short for its strides"
    );
    assert!(
        (k - 1) * b_rs + (n - 1) * b_cs < b.len(),
        "sgemm: b too short for its strides"
    );
    let par = if m * n * k >= PAR_FLOPS {
        Parallelism::Rayon(rayon::current_num_threads())
    } else {
        Parallelism::None
    };
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
            0.0,
            1.0,
            false,
            false,
            false,
            par,
        );
    }
}

/// `op(a) @ op(b)` on tensors viewed as matrices (leading dims flattened), f32
/// accumulation, result in `out` dtype with shape `(m, n)`.
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
    let c = sgemm(m, n, k, &a.to_f32_vec(), ta, &b.to_f32_vec(), tb);
    Tensor::from_f32_as(&[m, n], c, out)
}

/// The codes of `q` decoded without their scales, row-major `(rows, cols)`.
fn decode_codes(q: &QuantData) -> Vec<f32> {
    let table = q.format.table();
    let mut out = Vec::with_capacity(q.rows * q.cols);
    for r in 0..q.rows {
        out.extend((0..q.cols).map(|c| table[q.code(r, c) as usize]));
    }
    out
}

/// FP8 GEMM emulation: `d (m, n) = a (m, k) @ b (n, k)^T`, both operands K-major ("TN", as Hopper takes them).
///
/// For each stretch of K over which both operands' block scales are constant
/// (the whole K for per-tensor and row-wise scaling, 128 for DeepSeek blocks,
/// 32 for MX, 16 for NVFP4), the products of the decoded codes are summed in
/// f32 (exact products: FP8 x FP8 fits in f32), then multiplied by
/// `(factor_a * factor_b)` and added to the f32 accumulator; the NVFP4
/// per-tensor factors multiply the result last. This is the order of
/// cuBLASLt's block-scaled GEMMs and of DeepGEMM's promotion, up to the
/// summation order inside a stretch.
pub fn fp8_gemm(a: &QuantData, b: &QuantData) -> Result<Vec<f32>> {
    if a.cols != b.cols {
        return Err(Error::Shape(format!(
            "fp8_gemm: reduction dims differ: a is ({}, {}), b is ({}, {})",
            a.rows, a.cols, b.rows, b.cols
        )));
    }
    let (m, n, k) = (a.rows, b.rows, a.cols);
    let (da, db) = (decode_codes(a), decode_codes(b));
    let mut acc = vec![0f32; m * n];
    let mut part = vec![0f32; m * n];
    let mut k0 = 0;
    while k0 < k {
        let next = |blk: usize| (k0 / blk + 1) * blk;
        let k1 = next(a.block.1).min(next(b.block.1)).min(k);
        // part = da[:, k0..k1] @ db[:, k0..k1]^T, through strided views.
        sgemm_strided(
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
            for ((o, &p), &fb) in acc_row.iter_mut().zip(part_row).zip(&fb) {
                *o += p * (fa * fb);
            }
        }
        k0 = k1;
    }
    let t = a.tensor_factor() * b.tensor_factor();
    if t != 1.0 {
        acc.iter_mut().for_each(|v| *v *= t);
    }
    Ok(acc)
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
        _ => return Err(Error::Unsupported("quantize: unknown dtype".into())),
    };
    Ok(q)
}

/// Sum over rows: `(rows, cols) -> (cols)` in f32 (the bias gradient).
pub fn sum_rows(x: &Tensor) -> Result<Vec<f32>> {
    let (r, c) = x.dims2()?;
    let v = x.to_f32_vec();
    let mut out = vec![0f32; c];
    for row in v.chunks_exact(c).take(r) {
        for (o, &e) in out.iter_mut().zip(row) {
            *o += e;
        }
    }
    Ok(out)
}

/// `x[i, j] += bias[j]` in f32 for an f32 row-major matrix.
pub fn add_bias(x: &mut [f32], bias: &[f32]) {
    for row in x.chunks_exact_mut(bias.len()) {
        for (o, &b) in row.iter_mut().zip(bias) {
            *o += b;
        }
    }
}

/// Widen any supported element slice to f32.
pub fn widen<T: ToF32>(x: &[T]) -> Vec<f32> {
    x.iter().map(|v| v.to_f32_exact()).collect()
}

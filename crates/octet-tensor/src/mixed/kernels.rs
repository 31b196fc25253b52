//! The portable parts of the weight-only kernels: the small-M path (rows
//! of x against streamed weight rows), the tiled path for larger M, row and
//! block factors, decoding, and the f64 fallback for sums f32 cannot hold.

use super::*;

/// A bf16 or f32 weight holds exactly the `N x K` values its dims say (an
/// FP8 weight is checked when it is built).
pub(super) fn check_values(w: &WeightRef<'_>) -> Result<()> {
    let (n, k) = w.dims();
    let (kind, len) = match w {
        WeightRef::Bf16(v, ..) => ("bf16", v.len()),
        WeightRef::F32(v, ..) => ("f32", v.len()),
        WeightRef::Fp8(_) => return Ok(()),
    };
    if n.checked_mul(k) != Some(len) {
        return Err(Error::Shape(format!(
            "{kind} weight of {len} values is not ({n}, {k})"
        )));
    }
    Ok(())
}

/// Decode columns `k0..k0 + buf.len()` of weight row `j` (unscaled) into `buf`.
pub(super) fn decode_row_stripe(w: &WeightRef<'_>, j: usize, k0: usize, buf: &mut [f32]) {
    let (_, k) = w.dims();
    let len = buf.len();
    match w {
        WeightRef::Fp8(q) => decode_fp8(
            cpu_simd(),
            q.format,
            &q.codes()[j * k + k0..j * k + k0 + len],
            buf,
        ),
        WeightRef::Bf16(v, ..) => {
            for (o, s) in buf.iter_mut().zip(&v[j * k + k0..j * k + k0 + len]) {
                *o = s.to_f32();
            }
        }
        WeightRef::F32(v, ..) => buf.copy_from_slice(&v[j * k + k0..j * k + k0 + len]),
    }
}

/// Up to this many rows of `x` run the streaming kernel; more run the tiled one.
pub(super) const SMALL_M: usize = 16;
/// Output channels per tile of the tiled kernel (decoded into a small f32 panel).
pub(super) const TILE_N: usize = 64;
/// Columns per scale block of 128x128 block scaling.
pub(super) const BLOCK: usize = 128;

/// Streaming kernel: rows of `W` split across threads; each weight row is
/// decoded in registers and multiplied with up to 4 rows of `x` at once
/// (AVX-512; with AVX2, one row of `x`, or more from an L1-resident decoded
/// row). Every path gives the same bits ([`dot_rows`]).
pub(super) fn small_m(x: &[f32], m: usize, k: usize, n: usize, w: &WeightRef<'_>) -> Vec<f32> {
    // y^T (N, M): each task writes whole rows of it, then one transpose.
    let level = cpu_simd();
    let x_up = scaled_input(level, w, x);
    // Rows of `x` with a non-zero element: only their zero sums can be underflows.
    let live: Vec<bool> = (0..m)
        .map(|i| x[i * k..(i + 1) * k].iter().any(|&v| v != 0.0))
        .collect();
    // The smallest non-zero |x| of each row, for `tiny_products`.
    let xmin: Vec<f32> = (0..m)
        .map(|i| {
            x[i * k..(i + 1) * k]
                .iter()
                .filter(|&&v| v != 0.0)
                .fold(f32::INFINITY, |a, &v| a.min(v.abs()))
        })
        .collect();
    let mut yt = vec![0f32; n * m];
    let rows_per_task = (n / (4 * rayon::current_num_threads().max(1))).clamp(1, 256);
    yt.par_chunks_mut(rows_per_task * m)
        .enumerate()
        .for_each(|(task, out)| {
            let mut buf = vec![0f32; k];
            let row0 = task * rows_per_task;
            // MXCSR is per thread: check DAZ where the kernel runs.
            let x_up = x_up.as_deref().filter(|_| denormals_honoured());
            dot_rows(level, w, row0, x, x_up, m, k, out, &mut buf);
            for (r, yrow) in out.chunks_mut(m).enumerate() {
                let post = row_factor(w, row0 + r);
                for (i, v) in yrow.iter_mut().enumerate() {
                    // A subnormal sum kept only a few bits, and a zero sum of
                    // a non-zero row may be products that underflowed: the
                    // factor can bring either back into the normal range.
                    let sub = v.abs() < f32::MIN_POSITIVE && live[i];
                    *v *= post;
                    if !v.is_finite() || sub || tiny_products(xmin[i], w, row0 + r, k) {
                        *v = dot_f64(level, w, row0 + r, &x[i * k..(i + 1) * k], &mut buf);
                    }
                }
            }
        });
    octet_fp8::quant::transpose(&yt, n, m)
}

/// Whether the streaming kernel's f32 sum of `x . w[row]` may have rounded
/// in the subnormal range, where a rounding's error is up to `2^-150` rather
/// than `2^-24` of the result, for a row of `x` whose smallest non-zero `|x|`
/// is `xmin`: such outputs are summed again in f64 ([`dot_f64`]).
///
/// The kernel multiplies `x` by the codes' values before any factor (the
/// smallest non-zero one, `c`, is `2^-17` for E4M3 as decoded, `2^-16` for
/// E5M2), so with `xmin * c >= 2^-126` no product is subnormal, and a sum of
/// normal products is exact wherever it is subnormal. Block scales then enter
/// as `lanes * factor + total`, one FMA per lane and block: `nf = 32 *
/// ceil(K/128)` of them, each off by up to `2^-150` where its result is
/// subnormal. With `xmin * c * min(factor) >= nf * 2^-126`, any non-zero
/// product makes `sum |x w| >= nf * 2^-126`, so together they stay within
/// `2^-24 * sum |x w|`, one of [`error_bound`]'s terms. A per-tensor or
/// per-channel factor multiplies the finished sum once: a subnormal result
/// there is the output's own rounding. Under per-tensor and per-channel
/// scaling the rows of `x` this flags hold values below about `2^-109`.
/// Under block scaling the bound scales with the row's smallest block
/// factor: values below about `2^-86` with factors near `2^-13` and K =
/// 4096, or any row at all against a weight row with a block of factors
/// near `2^-100`. A flagged output costs about 25 times its f32 sum (3 ->
/// 85 ms at M = 4 over 4096x4096 when every row was flagged); no trained model's activations or
/// weights come near either.
pub(super) fn tiny_products(xmin: f32, w: &WeightRef<'_>, row: usize, k: usize) -> bool {
    let WeightRef::Fp8(q) = w else {
        return false;
    };
    let c = f64::from(q.format.min_subnormal() / e4m3_fixup(q.format));
    let p = f64::from(xmin) * c;
    let normal = f64::from(f32::MIN_POSITIVE);
    if p < normal {
        return true;
    }
    block_factors(w, row).is_some_and(|b| {
        let fmin = b.iter().fold(f32::INFINITY, |a, &f| a.min(f));
        p * f64::from(fmin) < (32 * k.div_ceil(BLOCK)) as f64 * normal
    })
}

/// `x . w[row]` with the row's factors, summed in f64 and rounded once: the
/// streaming kernel's answer for an output whose f32 sum came out infinite or
/// NaN, or subnormal or zero (a few bits, or products that underflowed,
/// where the factor may make it normal). That sum multiplies `x` by the codes' values before the factor, and
/// a code's value exceeds the weight's by `1 / factor` (E5M2; `1 / (256
/// factor)` for E4M3 as decoded), so it can overflow where the product of the
/// dequantized weight is finite; in f64 it cannot, and an infinite or NaN
/// input still gives inf or NaN. The tiled kernel takes it for outputs that
/// came out infinite or NaN, and for rows whose factors make dequantized
/// weights f32 subnormals.
pub(super) fn dot_f64(
    level: CpuSimd,
    w: &WeightRef<'_>,
    row: usize,
    x: &[f32],
    buf: &mut [f32],
) -> f32 {
    let buf = &mut buf[..x.len()];
    decode_row(level, w, row, buf);
    let blocks = block_factors(w, row);
    let sum: f64 = buf
        .iter()
        .zip(x)
        .enumerate()
        .map(|(c, (&wv, &xv))| {
            let f = blocks.map_or(1.0, |b| f64::from(b[c / BLOCK]));
            f64::from(wv) * f64::from(xv) * f
        })
        .sum();
    (sum * f64::from(row_factor(w, row))) as f32
}

/// `x * 2^112` for the AVX-512 E4M3 kernel that decodes codes with integer
/// instructions only, or `None` where that kernel does not apply.
///
/// That kernel places each code's bits in an f32 as `value * 2^-120` (see
/// `simd::e4m3x32_up`: sign-extend, shift, mask; E4M3's subnormals become
/// f32 denormals) and multiplies by `x * 2^112`, so every product
/// `(value 2^-120)(x 2^112) = value x 2^-8` is the same real number as on the
/// other paths and every FMA rounds the same: the bits do not change. It
/// needs `|x| < 2^16` (so that `x * 2^112` is finite: checked here, NaN
/// included) and denormal inputs honoured (MXCSR's DAZ clear: each task
/// checks [`denormals_honoured`] on the thread that runs it).
pub(super) fn scaled_input(level: CpuSimd, w: &WeightRef<'_>, x: &[f32]) -> Option<Vec<f32>> {
    let e4m3 = matches!(w, WeightRef::Fp8(q) if q.format == Format::E4M3);
    if level != CpuSimd::Avx512 || !e4m3 || !x.iter().all(|v| v.abs() < 65536.0) {
        return None;
    }
    let up = 2f32.powi(112);
    Some(x.iter().map(|&v| v * up).collect())
}

/// Whether this thread keeps denormal inputs (MXCSR's DAZ clear), as the
/// integer E4M3 decode needs ([`scaled_input`]).
pub(super) fn denormals_honoured() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: reading MXCSR has no preconditions on x86-64.
        #[allow(deprecated)]
        let csr = unsafe { std::arch::x86_64::_mm_getcsr() };
        csr & 0x40 == 0
    }
    #[cfg(not(target_arch = "x86_64"))]
    true
}

/// Tiled kernel: `TILE_N` rows of `W` are decoded into an f32 panel (`TILE_N x K`,
/// in L2) and multiplied with all of `x` by the f32 GEMM; tiles run in parallel.
/// Outputs that come out infinite or NaN, and rows whose factors make
/// dequantized values f32 subnormals, are summed in f64 (`dot_f64`).
/// [`Error::Alloc`] when the output, or a tile's share of it, cannot be allocated.
pub(super) fn tiled(
    x: &[f32],
    m: usize,
    k: usize,
    n: usize,
    w: &WeightRef<'_>,
) -> Result<Vec<f32>> {
    let tiles = n.div_ceil(TILE_N);
    let level = cpu_simd();
    let parts: Vec<Vec<f32>> = (0..tiles)
        .into_par_iter()
        .map(|t| {
            let r0 = t * TILE_N;
            let rows = TILE_N.min(n - r0);
            let mut panel = vec![0f32; rows * k];
            let mut exact = vec![false; rows];
            for r in 0..rows {
                let out = &mut panel[r * k..(r + 1) * k];
                decode_row(level, w, r0 + r, out);
                let post = row_factor(w, r0 + r);
                // Below `2^-126 / min_subnormal`, a factor makes some
                // `code * factor` an f32 subnormal (or zero) with few of its
                // bits: such rows are summed in f64, which multiplies the
                // factor in after the codes, as the streaming kernel does.
                if let WeightRef::Fp8(q) = w {
                    let fmin = block_factors(w, r0 + r).map_or(post / e4m3_fixup(q.format), |b| {
                        b.iter().fold(f32::INFINITY, |a, &f| a.min(f))
                    });
                    exact[r] = fmin * q.format.min_subnormal() < f32::MIN_POSITIVE;
                }
                match block_factors(w, r0 + r) {
                    Some(f) => out
                        .iter_mut()
                        .enumerate()
                        .for_each(|(c, v)| *v *= f[c / BLOCK] * post),
                    None if post != 1.0 => out.iter_mut().for_each(|v| *v *= post),
                    None => {}
                }
            }
            let mut part = cpu::try_gemm_serial(m, rows, k, x, &panel)?;
            // As in the streaming kernel: an output the f32 sum made infinite
            // or NaN (partial sums can pass f32's range where the f64 product
            // does not) is summed again in f64; an inf or NaN input still shows.
            let buf = &mut panel[..k];
            for (i, prow) in part.chunks_mut(rows).enumerate() {
                for (r, v) in prow.iter_mut().enumerate() {
                    if exact[r] || !v.is_finite() {
                        *v = dot_f64(level, w, r0 + r, &x[i * k..(i + 1) * k], buf);
                    }
                }
            }
            Ok(part)
        })
        .collect::<Result<_>>()?;
    let mut y = alloc_vec(m * n, 0f32, format_args!("a {m}x{n} product output"))?;
    for (t, part) in parts.iter().enumerate() {
        let r0 = t * TILE_N;
        let rows = TILE_N.min(n - r0);
        for i in 0..m {
            y[i * n + r0..i * n + r0 + rows].copy_from_slice(&part[i * rows..(i + 1) * rows]);
        }
    }
    Ok(y)
}

/// The factor applied after the sum over `K` (per tensor or channel; 1 for
/// block scales, which apply per block inside the sum). Includes E4M3's `2^8`
/// from the decode trick.
pub(super) fn row_factor(w: &WeightRef<'_>, row: usize) -> f32 {
    match w {
        WeightRef::Fp8(q) => {
            let f = match q.scaling {
                WeightScaling::Tensor => q.factors()[0],
                WeightScaling::Channel => q.factors()[row],
                WeightScaling::Block128 => 1.0,
            };
            f * e4m3_fixup(q.format)
        }
        _ => 1.0,
    }
}

/// The factors of `row`'s 128-column blocks under block scaling.
pub(super) fn block_factors<'a>(w: &WeightRef<'a>, row: usize) -> Option<&'a [f32]> {
    match w {
        WeightRef::Fp8(q) if q.scaling == WeightScaling::Block128 => {
            let kb = q.k.div_ceil(BLOCK);
            Some(&q.factors()[(row / BLOCK) * kb..(row / BLOCK + 1) * kb])
        }
        _ => None,
    }
}

/// `2^8` for E4M3 codes decoded through f16 (see the module docs), 1 otherwise.
pub(super) fn e4m3_fixup(format: Format) -> f32 {
    if format == Format::E4M3 {
        256.0
    } else {
        1.0
    }
}

/// Decode `row` into `out` without its scales (E4M3 as `value * 2^-8`).
pub(super) fn decode_row(level: CpuSimd, w: &WeightRef<'_>, row: usize, out: &mut [f32]) {
    let k = out.len();
    match w {
        WeightRef::Fp8(q) => decode_fp8(level, q.format, &q.codes()[row * k..(row + 1) * k], out),
        WeightRef::Bf16(v, ..) => {
            for (o, s) in out.iter_mut().zip(&v[row * k..(row + 1) * k]) {
                *o = s.to_f32();
            }
        }
        WeightRef::F32(v, ..) => out.copy_from_slice(&v[row * k..(row + 1) * k]),
    }
}

/// Decode FP8 codes to f32: E5M2 exactly, E4M3 as `value * 2^-8`.
pub(super) fn decode_fp8(level: CpuSimd, format: Format, src: &[u8], out: &mut [f32]) {
    let e4m3 = format == Format::E4M3;
    match level {
        // SAFETY (both arms): callers pass `cpu_simd()` or narrower.
        #[cfg(target_arch = "x86_64")]
        CpuSimd::Avx512 => unsafe { simd::decode_fp8_512(e4m3, src, out) },
        #[cfg(target_arch = "x86_64")]
        CpuSimd::Avx2 => unsafe { simd::decode_fp8(e4m3, src, out) },
        _ => {
            let table = format.table();
            let fix = 1.0 / e4m3_fixup(format);
            for (o, &c) in out.iter_mut().zip(src) {
                *o = table[c as usize] * fix;
            }
        }
    }
}

/// `out[v * m + i] = sum_j w[row0 + v, j] * x[i, j]` for the `m` rows of `x`
/// (row-major, `k` columns) and the `out.len() / m` weight rows from `row0`
/// (unscaled but for block factors), each bit-identical to [`decode_row`]
/// then [`dot_f32`]. With AVX-512, two weight rows are decoded in registers
/// once for up to 4 rows of `x` at a time; with AVX2, one weight row in
/// registers for one row of `x`, else decoded into `buf` (`k` values) and
/// multiplied from there. `x_up` is `x * 2^112` where the integer E4M3
/// decode may run ([`scaled_input`], DAZ checked by the caller), else `None`.
#[allow(clippy::too_many_arguments)]
pub(super) fn dot_rows(
    level: CpuSimd,
    w: &WeightRef<'_>,
    row0: usize,
    x: &[f32],
    x_up: Option<&[f32]>,
    m: usize,
    k: usize,
    out: &mut [f32],
    buf: &mut [f32],
) {
    let nrows = out.len() / m;
    #[cfg(target_arch = "x86_64")]
    {
        if level == CpuSimd::Avx512 {
            let mut v = 0;
            while v < nrows {
                let pair = nrows - v >= 2;
                let mut i = 0;
                while i < m {
                    let rows = (m - i).min(4);
                    let o = &mut out[v * m..];
                    // One instance per shape: the accumulators stay in registers.
                    macro_rules! run {
                        ($w:literal, $r:literal) => {
                            dot512::<$w, $r>(w, row0 + v, x, x_up, m, k, i, o)
                        };
                    }
                    // SAFETY: the CPU has AVX-512 F + BW, AVX2, FMA and F16C.
                    unsafe {
                        match (pair, rows) {
                            (true, 4) => run!(2, 4),
                            (true, 3) => run!(2, 3),
                            (true, 2) => run!(2, 2),
                            (true, _) => run!(2, 1),
                            (false, 4) => run!(1, 4),
                            (false, 3) => run!(1, 3),
                            (false, 2) => run!(1, 2),
                            (false, _) => run!(1, 1),
                        }
                    }
                    i += rows;
                }
                v += if pair { 2 } else { 1 };
            }
            return;
        }
        if level == CpuSimd::Avx2 && m == 1 {
            let x = &x[..k];
            for (v, o) in out.iter_mut().enumerate() {
                let row = row0 + v;
                let blocks = block_factors(w, row);
                let span = row * k..(row + 1) * k;
                // SAFETY: the CPU has AVX2, FMA and F16C.
                *o = unsafe {
                    match w {
                        WeightRef::Fp8(q) => match q.format {
                            Format::E4M3 => simd::dot_e4m3(&q.codes()[span], x, blocks),
                            _ => simd::dot_e5m2(&q.codes()[span], x, blocks),
                        },
                        WeightRef::Bf16(v, ..) => simd::dot_bf16(&v[span], x, blocks),
                        WeightRef::F32(v, ..) => simd::dot_f32(&v[span], x, blocks),
                    }
                };
            }
            return;
        }
    }
    let buf = &mut buf[..k];
    for (v, o) in out.chunks_mut(m).enumerate() {
        let row = row0 + v;
        let blocks = block_factors(w, row);
        decode_row(level, w, row, buf);
        for (i, o) in o.iter_mut().enumerate() {
            *o = dot_f32(level, buf, &x[i * k..(i + 1) * k], blocks);
        }
    }
}

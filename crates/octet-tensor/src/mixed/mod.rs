//! Weight-only FP8 products on the CPU: `y (M, N) = x (M, K) @ W^T` with `x`
//! in f32 or bf16 and `W (N, K)` stored as FP8 codes (E4M3 or E5M2) with
//! per-tensor, per-output-channel or 128x128 block scales.
//!
//! The weight bytes that stream from memory are the FP8 codes; each code is
//! widened to f32 in registers inside the loop over `K` and never written
//! back to memory as a high-precision matrix ([`CpuSimd`]: AVX-512, where two
//! weight rows are decoded once for up to 4 rows of `x`; AVX2 + F16C; a
//! 256-entry table otherwise). The SIMD kernels prefetch 32 KiB ahead of the
//! weight stream. This pays where moving weight bytes is the cost: `M` of 1
//! to a few dozen (decoding) and weights beyond the caches.
//!
//! Layout ([`Fp8Weight`], built once at load): codes row-major `(N, K)`, each
//! output channel's `K` codes contiguous, so a matrix-vector product streams
//! every row once front to back; scales as `f32` dequantization factors, one
//! per tensor, per row, or per `128 x 128` tile `(ceil(N/128), ceil(K/128))`.
//!
//! Exact decoding without a table. An E4M3 byte `s eeee mmm` placed as the
//! f16 bit pattern `s 0eeee mmm0000000` is the f16 number `value * 2^-8`
//! (normals and subnormals alike, since both formats put the implicit bit in
//! the same place), so `vcvtph2ps` decodes 8 codes and the `2^8` folds into
//! the scale; an E5M2 byte is the top byte of its f16. With AVX-512, E4M3
//! skips the conversion: the byte sign-extended, shifted and masked into an
//! f32 is `value * 2^-120`, multiplied against `x * 2^112` (the same
//! products, see `scaled_input`). These tricks turn the NaN codes into finite
//! numbers, so [`Fp8Weight`] refuses weights with NaN codes (and E5M2's
//! infinities) when it is built.
//!
//! Accumulation is f32 in a fixed order per output (32 lanes over `K`, then
//! the lanes summed, for `M` up to 16; the f32 GEMM's order over `K` for
//! larger `M`), so results do not depend on the thread count. Against the
//! f64 product of the dequantized weight the error is bounded by
//! [`error_bound`]: about `(K/32 + K/128 + 8) * 2^-24 * sum_k |x_k * w_k|`
//! up to `M = 16`, `(2K + 8) * 2^-24 * sum_k |x_k * w_k|` beyond. An output whose
//! f32 sum overflows (the codes' values exceed the weight's by the inverse
//! factor) is summed again in f64 (`dot_f64`), as is one whose products may
//! have rounded as f32 subnormals (rows of `x` holding values below about
//! `2^-109`, or higher under small block factors: see `tiny_products`).

use crate::tensor::checked_alloc;
use crate::{alloc_vec, cpu, DType, Error, Result, Tensor};
use octet_fp8::{Format, Granularity, QuantData, QuantSpec, Rounding, ScaleRule, Scales};
use rayon::prelude::*;

/// Which weight elements share a scale.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightScaling {
    /// One scale for the matrix.
    Tensor,
    /// One scale per output channel (row of `W`).
    Channel,
    /// One scale per `128 x 128` tile (DeepSeek-V3's weight blocks).
    Block128,
}

impl WeightScaling {
    /// Parse `tensor`, `channel` or `block`.
    pub fn from_name(s: &str) -> Result<WeightScaling> {
        match s {
            "tensor" | "tensorwise" => Ok(WeightScaling::Tensor),
            "channel" | "rowwise" => Ok(WeightScaling::Channel),
            "block" | "block128" | "blockwise" => Ok(WeightScaling::Block128),
            other => Err(Error::Unsupported(format!(
                "weight scaling '{other}' (tensor, channel, block)"
            ))),
        }
    }
}

/// An FP8 weight `(N, K)` prepared for [`mixed_matmul`] (see the module docs for the layout).
#[derive(Clone, Debug, PartialEq)]
pub struct Fp8Weight {
    n: usize,
    k: usize,
    format: Format,
    scaling: WeightScaling,
    /// The row-wise quantized copy: row-major `(N, K)` codes and f32
    /// dequantization factors (1, `N`, or `ceil(N/128) * ceil(K/128)` of them).
    /// Kept as `QuantData` so that the FP8 GEMM takes the same bytes.
    q: QuantData,
}

impl Fp8Weight {
    /// Quantize a row-major `(n, k)` f32 weight: scale `format.max() / amax`
    /// per tensor, row or tile, round to nearest even, saturate.
    pub fn quantize(
        w: &[f32],
        n: usize,
        k: usize,
        format: Format,
        scaling: WeightScaling,
    ) -> Result<Fp8Weight> {
        if !matches!(format, Format::E4M3 | Format::E5M2) {
            return Err(Error::Unsupported(format!(
                "weight-only products take E4M3 or E5M2 weights, not {}",
                format.name()
            )));
        }
        if n == 0 || k == 0 {
            return Err(Error::Shape(format!(
                "weight ({n}, {k}) is empty: a weight needs rows and columns"
            )));
        }
        if n.checked_mul(k) != Some(w.len()) {
            return Err(Error::Shape(format!(
                "weight of {} values is not ({n}, {k})",
                w.len()
            )));
        }
        let granularity = match scaling {
            WeightScaling::Tensor => Granularity::Tensor,
            WeightScaling::Channel => Granularity::Row,
            WeightScaling::Block128 => Granularity::Tile {
                rows: 128,
                cols: 128,
            },
        };
        let spec = QuantSpec {
            format,
            granularity,
            rule: ScaleRule::Amax {
                power_of_two: false,
            },
            rounding: Rounding::NearestEven,
        };
        let q = octet_fp8::quantize(w, n, k, &spec, &spec, octet_fp8::Usage::ROW, None)?;
        let data = q
            .rowwise
            .ok_or_else(|| Error::Unsupported("quantize made no row-wise copy".into()))?;
        Fp8Weight::from_quant_data(data)
    }

    /// Wrap the row-wise copy of a quantized weight (f32 scale factors per
    /// tensor, row, or 128x128 tile), e.g. an FP8 checkpoint's tensor. Each
    /// factor must be positive, and finite times the format's largest value
    /// (so that every code dequantizes to a finite f32); no code may be NaN
    /// or infinite.
    pub fn from_quant_data(q: QuantData) -> Result<Fp8Weight> {
        let (n, k) = (q.rows, q.cols);
        if !matches!(q.format, Format::E4M3 | Format::E5M2) {
            return Err(Error::Unsupported(format!(
                "weight-only products take E4M3 or E5M2 weights, not {}",
                q.format.name()
            )));
        }
        if n == 0 || k == 0 {
            return Err(Error::Shape(format!(
                "weight ({n}, {k}) is empty: a weight needs rows and columns"
            )));
        }
        let factors = match &q.scales {
            Scales::F32(v) => v,
            _ => {
                return Err(Error::Unsupported(
                    "weight-only products take f32 scale factors (not E8M0 / NVFP4 scales)".into(),
                ))
            }
        };
        let scaling = match q.block {
            (r, c) if r >= n && c >= k => WeightScaling::Tensor,
            (1, c) if c >= k => WeightScaling::Channel,
            (128, 128) => WeightScaling::Block128,
            other => {
                return Err(Error::Unsupported(format!(
                "weight-only products take tensor, per-row or 128x128 scales, not {other:?} blocks"
            )))
            }
        };
        let want = match scaling {
            WeightScaling::Tensor => 1,
            WeightScaling::Channel => n,
            WeightScaling::Block128 => n.div_ceil(128) * k.div_ceil(128),
        };
        if factors.len() != want || n.checked_mul(k) != Some(q.data.len()) {
            return Err(Error::Shape(format!(
                "weight ({n}, {k}) has {} codes and {} scales, expected {} and {want}",
                q.data.len(),
                factors.len(),
                n as u128 * k as u128
            )));
        }
        // A zero, negative or non-finite factor is no scale; and the kernels
        // fold E4M3's 2^8 (see the module docs) into the factor, which must
        // stay finite: `quantize` never gives a factor whose largest code
        // overflows f32, nor may a file.
        let max = q.format.max();
        if let Some((i, f)) = factors
            .iter()
            .enumerate()
            .find(|(_, &f)| !(f > 0.0 && (f * max).is_finite()))
        {
            return Err(Error::Unsupported(format!(
                "weight scale factor {i} is {f:e}: a factor must be positive, and finite times \
                 {}'s largest value {max}",
                q.format.name()
            )));
        }
        // E5M2's infinities too: `mixed_matmul_t` skips zero gradients, which
        // would hide the NaN of 0 * inf that the dequantized product has.
        let table = q.format.table();
        if let Some(i) = q
            .data
            .iter()
            .position(|&c| q.format.is_nan(c) || table[c as usize].is_infinite())
        {
            let what = if q.format.is_nan(q.data[i]) {
                "NaN"
            } else {
                "infinite"
            };
            return Err(Error::Unsupported(format!(
                "weight element ({}, {}) is {what}",
                i / k,
                i % k
            )));
        }
        Ok(Fp8Weight {
            n,
            k,
            format: q.format,
            scaling,
            q,
        })
    }

    /// Output channels `N`.
    pub fn rows(&self) -> usize {
        self.n
    }

    /// Input features `K`.
    pub fn cols(&self) -> usize {
        self.k
    }

    /// Element format.
    pub fn format(&self) -> Format {
        self.format
    }

    /// Scale granularity.
    pub fn scaling(&self) -> WeightScaling {
        self.scaling
    }

    /// Row-major `(N, K)` codes.
    pub fn codes(&self) -> &[u8] {
        &self.q.data
    }

    /// Dequantization factors (1, `N`, or one per 128x128 tile row-major).
    pub fn factors(&self) -> &[f32] {
        match &self.q.scales {
            Scales::F32(v) => v,
            // from_quant_data accepts f32 scales only.
            _ => &[],
        }
    }

    /// The row-wise quantized copy (what `cpu::fp8_gemm` takes as its `b`).
    pub fn quant_data(&self) -> &QuantData {
        &self.q
    }

    /// Bytes held: codes plus scales.
    pub fn bytes(&self) -> usize {
        self.q.bytes()
    }

    /// The factor of element `(row, col)`.
    fn factor(&self, row: usize, col: usize) -> f32 {
        match self.scaling {
            WeightScaling::Tensor => self.factors()[0],
            WeightScaling::Channel => self.factors()[row],
            WeightScaling::Block128 => {
                self.factors()[(row / 128) * self.k.div_ceil(128) + col / 128]
            }
        }
    }

    /// The dequantized `(N, K)` matrix in f32 (for references and tests; the
    /// product never builds it).
    pub fn dequantize(&self) -> Vec<f32> {
        let table = self.format.table();
        let mut out = vec![0f32; self.n * self.k];
        for r in 0..self.n {
            for c in 0..self.k {
                out[r * self.k + c] =
                    table[self.codes()[r * self.k + c] as usize] * self.factor(r, c);
            }
        }
        out
    }
}

/// The instruction sets the CPU kernels can use, narrowest first. Every set
/// gives the same bits: the kernels follow one summation order (`dot_f32`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum CpuSimd {
    /// Plain Rust; FP8 codes decode through a 256-entry table.
    Scalar,
    /// AVX2 + FMA + F16C: 8 f32 lanes an instruction.
    Avx2,
    /// AVX-512 F + BW on top of AVX2: 16 lanes an instruction, and each weight
    /// row decoded once for up to 4 rows of the input.
    Avx512,
}

impl CpuSimd {
    /// `scalar`, `avx2` or `avx512`.
    pub fn name(self) -> &'static str {
        match self {
            CpuSimd::Scalar => "scalar",
            CpuSimd::Avx2 => "avx2",
            CpuSimd::Avx512 => "avx512",
        }
    }

    /// Parse [`CpuSimd::name`]'s names.
    pub fn from_name(s: &str) -> Result<CpuSimd> {
        match s {
            "scalar" => Ok(CpuSimd::Scalar),
            "avx2" => Ok(CpuSimd::Avx2),
            "avx512" => Ok(CpuSimd::Avx512),
            other => Err(Error::Unsupported(format!(
                "CPU instruction set '{other}' (scalar, avx2, avx512)"
            ))),
        }
    }

    /// The widest set this CPU has (detected once).
    pub fn detected() -> CpuSimd {
        static DETECTED: std::sync::OnceLock<CpuSimd> = std::sync::OnceLock::new();
        *DETECTED.get_or_init(|| {
            #[cfg(target_arch = "x86_64")]
            {
                let avx2 = is_x86_feature_detected!("avx2")
                    && is_x86_feature_detected!("fma")
                    && is_x86_feature_detected!("f16c");
                let avx512 =
                    is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw");
                match (avx2, avx512) {
                    (true, true) => CpuSimd::Avx512,
                    (true, false) => CpuSimd::Avx2,
                    _ => CpuSimd::Scalar,
                }
            }
            #[cfg(not(target_arch = "x86_64"))]
            CpuSimd::Scalar
        })
    }
}

/// The widest set the kernels may use ([`limit_cpu_simd`]); `u8::MAX`: no limit.
static SIMD_LIMIT: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(u8::MAX);

/// Keep the CPU kernels at `level` or narrower, for comparisons (`octet bench
/// mixed --cpu-simd avx2`). The results do not change, only the speed. An
/// error if this CPU does not have `level`.
pub fn limit_cpu_simd(level: CpuSimd) -> Result<()> {
    let have = CpuSimd::detected();
    if level > have {
        return Err(Error::Unsupported(format!(
            "this CPU has no {} (widest: {})",
            level.name(),
            have.name()
        )));
    }
    SIMD_LIMIT.store(level as u8, std::sync::atomic::Ordering::Relaxed);
    Ok(())
}

/// The set the CPU kernels use now.
pub fn cpu_simd() -> CpuSimd {
    // `limit_cpu_simd` stores only sets the CPU has.
    match SIMD_LIMIT.load(std::sync::atomic::Ordering::Relaxed) {
        0 => CpuSimd::Scalar,
        1 => CpuSimd::Avx2,
        _ => CpuSimd::detected(),
    }
}

/// Bound on `|y - y_f64|` for one output of [`mixed_matmul`] of an input
/// with `m` rows, over `k` terms whose absolute products sum to `abs_sum`.
///
/// Up to `m = 16` (the streaming kernel): f32 accumulation in 32 lanes of
/// `ceil(k/32)` terms each per 128-column chunk, a 5-level lane sum, the sum
/// over chunks and the scale multiplies. Each step rounds with relative error
/// at most `2^-24`; the chunk sums add `ceil(k/128)` steps.
///
/// Beyond (the tiled kernel): the factor is multiplied into each weight (one
/// rounding), then the f32 GEMM sums in its own order, sequentially over `K`
/// within a block of `K` and block by block after: up to `2k` roundings of
/// each term, so the bound is `gamma(2k + 8) * abs_sum` with
/// `gamma(n) = n 2^-24 / (1 - n 2^-24)`.
pub fn error_bound(m: usize, k: usize, abs_sum: f64) -> f64 {
    let u = 2f64.powi(-24);
    if m <= SMALL_M {
        (k.div_ceil(32) + k.div_ceil(128) + 8) as f64 * u * abs_sum
    } else {
        let n = (2.0 * k as f64 + 8.0) * u;
        n / (1.0 - n).max(0.0) * abs_sum
    }
}

/// Weights the same kernel runs over, for comparisons: FP8 codes, bf16 or f32.
pub enum WeightRef<'a> {
    /// FP8 weight with its scales.
    Fp8(&'a Fp8Weight),
    /// bf16 row-major `(N, K)`.
    Bf16(&'a [half::bf16], usize, usize),
    /// f32 row-major `(N, K)`.
    F32(&'a [f32], usize, usize),
}

impl WeightRef<'_> {
    fn dims(&self) -> (usize, usize) {
        match self {
            WeightRef::Fp8(w) => (w.n, w.k),
            WeightRef::Bf16(_, n, k) | WeightRef::F32(_, n, k) => (*n, *k),
        }
    }
}

/// `y (M, N) = x (M, K) @ W^T` in f32 with FP8 weights upcast inside the loop.
/// `x` is f32 or bf16 (widened once: it is `M x K`, small next to `W`).
pub fn mixed_matmul(x: &Tensor, w: &Fp8Weight) -> Result<Tensor> {
    matmul_weights(x, &WeightRef::Fp8(w))
}

/// The same kernel over any [`WeightRef`] (bf16 and f32 weights are the baselines of `octet bench mixed`).
pub fn matmul_weights(x: &Tensor, w: &WeightRef<'_>) -> Result<Tensor> {
    let (m, k) = x.dims2()?;
    let (n, wk) = w.dims();
    if k != wk {
        return Err(Error::Shape(format!(
            "input has {k} features, the weight ({n}, {wk}) expects {wk}"
        )));
    }
    if m == 0 {
        return Err(Error::Shape("empty input: M = 0".into()));
    }
    check_values(w)?;
    checked_alloc(&[m, n], 4)?;
    if x.dtype() == DType::F64 {
        return Err(Error::Unsupported(format!(
            "mixed product of a {:?} input; use f32 or bf16",
            x.dtype()
        )));
    }
    // f32 read in place; bf16 widened once (an error if that copy cannot be allocated).
    let xs = x.f32_values()?;
    let y = if m <= SMALL_M {
        small_m(&xs, m, k, n, w)
    } else {
        tiled(&xs, m, k, n, w)?
    };
    Tensor::from_f32(&[m, n], y)
}

/// `dx (M, K) = dy (M, N) @ W` in f32 with FP8 weights upcast inside the
/// loop: the input gradient of `y = x W^T`, reading the row-major `(N, K)`
/// codes once without a transposed copy. Tasks own 128-column stripes of
/// `dx` (and row groups of `dy`); for each weight row `n` a stripe adds
/// `(dy[m, n] * factor) * w[n, stripe]` in `n` order (in f64 where
/// `dy * factor` is not a normal f32), so the error is at most
/// `(N + 2) 2^-24 sum_n |dy w|` per element.
pub fn mixed_matmul_t(dy: &Tensor, w: &Fp8Weight) -> Result<Tensor> {
    matmul_weights_t(dy, &WeightRef::Fp8(w))
}

/// [`mixed_matmul_t`] over any [`WeightRef`].
pub fn matmul_weights_t(dy: &Tensor, w: &WeightRef<'_>) -> Result<Tensor> {
    let (m, n) = dy.dims2()?;
    let (wn, k) = w.dims();
    if n != wn {
        return Err(Error::Shape(format!(
            "gradient has {n} columns, the weight ({wn}, {k}) has {wn} rows"
        )));
    }
    if m == 0 {
        return Err(Error::Shape("empty gradient: M = 0".into()));
    }
    check_values(w)?;
    checked_alloc(&[m, k], 4)?;
    let g = dy.f32_values()?;
    let stripes = k.div_ceil(BLOCK);
    let row_groups = m.div_ceil(8);
    let parts: Vec<(usize, usize, Vec<f32>)> = (0..stripes * row_groups)
        .into_par_iter()
        .map(|task| {
            let (s, rg) = (task % stripes, task / stripes);
            let (k0, k1) = (s * BLOCK, ((s + 1) * BLOCK).min(k));
            let (m0, m1) = (rg * 8, ((rg + 1) * 8).min(m));
            let width = k1 - k0;
            let mut out = vec![0f32; (m1 - m0) * width];
            let mut buf = vec![0f32; width];
            for j in 0..n {
                decode_row_stripe(w, j, k0, &mut buf);
                let f = row_factor(w, j) * block_factors(w, j).map_or(1.0, |b| b[s]);
                for (i, o) in (m0..m1).zip(out.chunks_mut(width)) {
                    let gv = g[i * n + j];
                    let c = gv * f;
                    if c.is_normal() {
                        o.iter_mut().zip(&buf).for_each(|(ov, &bv)| *ov += c * bv);
                    } else if gv != 0.0 {
                        // `dy * factor` overflowed (inf, and NaN on zero codes)
                        // or lost bits in a subnormal, where `dy * w` need
                        // not: the code's value (up to 57344, or 1/256 of
                        // E4M3's as decoded) is on the other side. In f64
                        // neither happens; an inf or NaN `dy` still shows.
                        let c = f64::from(gv) * f64::from(f);
                        o.iter_mut()
                            .zip(&buf)
                            .for_each(|(ov, &bv)| *ov += (c * f64::from(bv)) as f32);
                    }
                }
            }
            (task, width, out)
        })
        .collect();
    let mut dx = alloc_vec(m * k, 0f32, format_args!("a {m}x{k} input gradient"))?;
    for (task, width, out) in parts {
        let (s, rg) = (task % stripes, task / stripes);
        let k0 = s * BLOCK;
        for (r, o) in out.chunks(width).enumerate() {
            let i = rg * 8 + r;
            dx[i * k + k0..i * k + k0 + width].copy_from_slice(o);
        }
    }
    Tensor::from_f32(&[m, k], dx)
}

mod kernels;
use kernels::*;

/// [`dot_rows`] on the AVX-512 path for weight rows `row0..row0 + W` and rows
/// `i0..i0 + R` of `x`, into `out[v * m + i]`.
///
/// # Safety
/// The CPU must have AVX-512 F + BW, AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
unsafe fn dot512<const W: usize, const R: usize>(
    w: &WeightRef<'_>,
    row0: usize,
    x: &[f32],
    x_up: Option<&[f32]>,
    m: usize,
    k: usize,
    i0: usize,
    out: &mut [f32],
) {
    let xs: [&[f32]; R] = std::array::from_fn(|r| &x[(i0 + r) * k..(i0 + r + 1) * k]);
    let blocks: [Option<&[f32]>; W] = std::array::from_fn(|v| block_factors(w, row0 + v));
    let span = |v: usize| (row0 + v) * k..(row0 + v + 1) * k;
    let y = match w {
        WeightRef::Fp8(q) => {
            let ws: [&[u8]; W] = std::array::from_fn(|v| &q.codes()[span(v)]);
            match (q.format, x_up) {
                (Format::E4M3, Some(xu)) => {
                    let xs: [&[f32]; R] =
                        std::array::from_fn(|r| &xu[(i0 + r) * k..(i0 + r + 1) * k]);
                    simd::dot512_e4m3_up(ws, xs, blocks)
                }
                (Format::E4M3, _) => simd::dot512_e4m3(ws, xs, blocks),
                _ => simd::dot512_e5m2(ws, xs, blocks),
            }
        }
        WeightRef::Bf16(d, ..) => {
            simd::dot512_bf16(std::array::from_fn(|v| &d[span(v)]), xs, blocks)
        }
        WeightRef::F32(d, ..) => simd::dot512_f32(std::array::from_fn(|v| &d[span(v)]), xs, blocks),
    };
    for (v, yv) in y.iter().enumerate() {
        out[v * m + i0..v * m + i0 + R].copy_from_slice(yv);
    }
}

/// The dot product every kernel uses, over decoded weights `w` and `x`.
///
/// Order, which the SIMD paths follow exactly: the sum runs over blocks (128
/// columns under block scaling, else all of `K`); within a block element `i`
/// accumulates by FMA into lane `i % 32` of 32 fresh lanes; each lane then
/// enters the running total as `total[l] = lanes[l] * factor + total[l]`
/// (one FMA; factor 1 without block scales); the 32 totals are summed by [`sum32`].
fn dot_f32(level: CpuSimd, w: &[f32], x: &[f32], blocks: Option<&[f32]>) -> f32 {
    match level {
        // SAFETY (both arms): callers pass `cpu_simd()` or narrower.
        #[cfg(target_arch = "x86_64")]
        CpuSimd::Avx512 => return unsafe { simd::dot512_f32([w], [x], [blocks])[0][0] },
        #[cfg(target_arch = "x86_64")]
        CpuSimd::Avx2 => return unsafe { simd::dot_f32(w, x, blocks) },
        _ => {}
    }
    let n = w.len().min(x.len());
    let block = if blocks.is_some() { BLOCK } else { n.max(1) };
    let mut total = [0f32; 32];
    for (b, start) in (0..n).step_by(block).enumerate() {
        let mut lanes = [0f32; 32];
        for i in start..(start + block).min(n) {
            lanes[i % 32] = w[i].mul_add(x[i], lanes[i % 32]);
        }
        let f = blocks.map_or(1.0, |f| f[b]);
        for l in 0..32 {
            total[l] = lanes[l].mul_add(f, total[l]);
        }
    }
    sum32(&total)
}

/// The lane sum every path uses: the four groups of 8 lanes added pairwise,
/// then ((0+4)+(2+6)) + ((1+5)+(3+7)) over the 8 results.
fn sum32(l: &[f32; 32]) -> f32 {
    let mut v = [0f32; 8];
    for j in 0..8 {
        v[j] = (l[j] + l[8 + j]) + (l[16 + j] + l[24 + j]);
    }
    let a = [v[0] + v[4], v[1] + v[5], v[2] + v[6], v[3] + v[7]];
    let b = [a[0] + a[2], a[1] + a[3]];
    b[0] + b[1]
}

#[cfg(target_arch = "x86_64")]
mod simd;

#[cfg(test)]
mod tests {
    use super::*;

    /// The instruction sets this CPU can run, narrowest first.
    fn levels() -> Vec<CpuSimd> {
        [CpuSimd::Scalar, CpuSimd::Avx2, CpuSimd::Avx512]
            .into_iter()
            .filter(|&l| l <= CpuSimd::detected())
            .collect()
    }

    /// Every non-NaN code decodes exactly, on every path this CPU has (the
    /// 253 or 254 codes end in a tail shorter than a vector, which also runs).
    #[test]
    fn every_code_decodes_exactly() {
        for level in levels() {
            for format in [Format::E4M3, Format::E5M2] {
                let codes: Vec<u8> = (0..=255u8).filter(|&c| !format.is_nan(c)).collect();
                let want: Vec<f32> = codes.iter().map(|&c| format.decode(c)).collect();
                let fix = e4m3_fixup(format);
                let mut got = vec![0f32; codes.len()];
                decode_fp8(level, format, &codes, &mut got);
                for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
                    assert_eq!(
                        (g * fix).to_bits(),
                        w.to_bits(),
                        "{level:?} {format:?} code {:#x}",
                        codes[i]
                    );
                }
            }
        }
    }

    /// The integer-only E4M3 decode gives `value * 2^-120` for every code,
    /// and inputs it cannot scale by `2^112` keep the other kernel.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn scaled_decode_is_exact() {
        for c in (0..=255u8).filter(|&c| !Format::E4M3.is_nan(c)) {
            let got = f64::from(simd::e4m3_up_one(c)) * 2f64.powi(120);
            assert_eq!(got, f64::from(Format::E4M3.decode(c)), "code {c:#x}");
        }
        if CpuSimd::detected() == CpuSimd::Avx512 {
            let q = Fp8Weight::quantize(&[0.5, -1.0], 1, 2, Format::E4M3, WeightScaling::Tensor)
                .unwrap();
            let w = WeightRef::Fp8(&q);
            assert!(scaled_input(CpuSimd::Avx512, &w, &[1.0, -65535.0]).is_some());
            for bad in [65536.0, f32::INFINITY, f32::NAN] {
                assert!(scaled_input(CpuSimd::Avx512, &w, &[1.0, bad]).is_none());
            }
            assert!(scaled_input(CpuSimd::Avx2, &w, &[1.0, 2.0]).is_none());
        }
    }

    /// Only sets the CPU has can be chosen; names parse back.
    #[test]
    fn simd_limit_refuses_missing_sets() {
        for level in [CpuSimd::Scalar, CpuSimd::Avx2, CpuSimd::Avx512] {
            assert_eq!(CpuSimd::from_name(level.name()).unwrap(), level);
            if level > CpuSimd::detected() {
                let e = limit_cpu_simd(level).unwrap_err().to_string();
                assert!(e.contains(level.name()), "{e}");
            }
        }
        assert!(CpuSimd::from_name("neon").is_err());
    }

    /// The scalar reference of [`dot_f32`]'s order, written out again.
    fn scalar_dot(w: &[f32], x: &[f32], blocks: Option<&[f32]>) -> f32 {
        let n = w.len();
        let block = if blocks.is_some() { BLOCK } else { n };
        let mut total = [0f32; 32];
        for b in 0..n.div_ceil(block) {
            let mut lanes = [0f32; 32];
            for i in b * block..((b + 1) * block).min(n) {
                lanes[i % 32] = w[i].mul_add(x[i], lanes[i % 32]);
            }
            let f = blocks.map_or(1.0, |f| f[b]);
            for l in 0..32 {
                total[l] = lanes[l].mul_add(f, total[l]);
            }
        }
        sum32(&total)
    }

    /// Register-decoded dots (1 to 5 rows of `x` at once) equal
    /// decode-then-dot equal the scalar order, bit for bit, on every
    /// instruction set this CPU has.
    #[test]
    fn dots_follow_the_documented_order_bit_for_bit() {
        for k in [1usize, 31, 32, 33, 128, 205, 300] {
            let w: Vec<f32> = (0..3 * k)
                .map(|i| ((i * 7919 % 1000) as f32 - 500.0) * 1e-3)
                .collect();
            let x: Vec<f32> = (0..5 * k)
                .map(|i| ((i * 104729 % 997) as f32 - 498.0) * 1e-2)
                .collect();
            let wb: Vec<half::bf16> = w.iter().map(|&v| half::bf16::from_f32(v)).collect();
            for format in [Format::E4M3, Format::E5M2] {
                for scaling in [WeightScaling::Tensor, WeightScaling::Block128] {
                    let q = Fp8Weight::quantize(&w, 3, k, format, scaling).unwrap();
                    for wr in [
                        WeightRef::Fp8(&q),
                        WeightRef::Bf16(&wb, 3, k),
                        WeightRef::F32(&w, 3, k),
                    ] {
                        // want[v][i]: weight row v times row i of x, in the scalar order.
                        let mut rows = vec![vec![0f32; k]; 3];
                        let mut want = vec![Vec::new(); 3];
                        for v in 0..3 {
                            decode_row(CpuSimd::Scalar, &wr, v, &mut rows[v]);
                            want[v] = x
                                .chunks(k)
                                .map(|xr| scalar_dot(&rows[v], xr, block_factors(&wr, v)).to_bits())
                                .collect::<Vec<u32>>();
                        }
                        for level in levels() {
                            let label = format!("{level:?} {format:?} {scaling:?} k {k}");
                            let mut buf = vec![0f32; k];
                            decode_row(level, &wr, 1, &mut buf);
                            assert_eq!(buf, rows[1], "{label}");
                            assert_eq!(
                                dot_f32(level, &buf, &x[..k], block_factors(&wr, 1)).to_bits(),
                                want[1][0],
                                "{label}"
                            );
                            for m in 1..=5 {
                                let up = scaled_input(level, &wr, &x);
                                for ((row0, nrows), x_up) in [(0, 2), (1, 1), (0, 3)]
                                    .into_iter()
                                    .flat_map(|r| [(r, None), (r, up.as_deref())])
                                {
                                    let mut got = vec![0f32; nrows * m];
                                    dot_rows(level, &wr, row0, &x, x_up, m, k, &mut got, &mut buf);
                                    for v in 0..nrows {
                                        let g: Vec<u32> = got[v * m..(v + 1) * m]
                                            .iter()
                                            .map(|v| v.to_bits())
                                            .collect();
                                        assert_eq!(
                                            g,
                                            want[row0 + v][..m],
                                            "{label} m {m} row {}",
                                            row0 + v
                                        );
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

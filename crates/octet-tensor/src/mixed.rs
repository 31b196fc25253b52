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

/// A bf16 or f32 weight holds exactly the `N x K` values its dims say (an
/// FP8 weight is checked when it is built).
fn check_values(w: &WeightRef<'_>) -> Result<()> {
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
fn decode_row_stripe(w: &WeightRef<'_>, j: usize, k0: usize, buf: &mut [f32]) {
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
const SMALL_M: usize = 16;
/// Output channels per tile of the tiled kernel (decoded into a small f32 panel).
const TILE_N: usize = 64;
/// Columns per scale block of 128x128 block scaling.
const BLOCK: usize = 128;

/// Streaming kernel: rows of `W` split across threads; each weight row is
/// decoded in registers and multiplied with up to 4 rows of `x` at once
/// (AVX-512; with AVX2, one row of `x`, or more from an L1-resident decoded
/// row). Every path gives the same bits ([`dot_rows`]).
fn small_m(x: &[f32], m: usize, k: usize, n: usize, w: &WeightRef<'_>) -> Vec<f32> {
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
fn tiny_products(xmin: f32, w: &WeightRef<'_>, row: usize, k: usize) -> bool {
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
fn dot_f64(level: CpuSimd, w: &WeightRef<'_>, row: usize, x: &[f32], buf: &mut [f32]) -> f32 {
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
fn scaled_input(level: CpuSimd, w: &WeightRef<'_>, x: &[f32]) -> Option<Vec<f32>> {
    let e4m3 = matches!(w, WeightRef::Fp8(q) if q.format == Format::E4M3);
    if level != CpuSimd::Avx512 || !e4m3 || !x.iter().all(|v| v.abs() < 65536.0) {
        return None;
    }
    let up = 2f32.powi(112);
    Some(x.iter().map(|&v| v * up).collect())
}

/// Whether this thread keeps denormal inputs (MXCSR's DAZ clear), as the
/// integer E4M3 decode needs ([`scaled_input`]).
fn denormals_honoured() -> bool {
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
fn tiled(x: &[f32], m: usize, k: usize, n: usize, w: &WeightRef<'_>) -> Result<Vec<f32>> {
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
fn row_factor(w: &WeightRef<'_>, row: usize) -> f32 {
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
fn block_factors<'a>(w: &WeightRef<'a>, row: usize) -> Option<&'a [f32]> {
    match w {
        WeightRef::Fp8(q) if q.scaling == WeightScaling::Block128 => {
            let kb = q.k.div_ceil(BLOCK);
            Some(&q.factors()[(row / BLOCK) * kb..(row / BLOCK + 1) * kb])
        }
        _ => None,
    }
}

/// `2^8` for E4M3 codes decoded through f16 (see the module docs), 1 otherwise.
fn e4m3_fixup(format: Format) -> f32 {
    if format == Format::E4M3 {
        256.0
    } else {
        1.0
    }
}

/// Decode `row` into `out` without its scales (E4M3 as `value * 2^-8`).
fn decode_row(level: CpuSimd, w: &WeightRef<'_>, row: usize, out: &mut [f32]) {
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
fn decode_fp8(level: CpuSimd, format: Format, src: &[u8], out: &mut [f32]) {
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
fn dot_rows(
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
mod simd {
    use std::arch::x86_64::*;

    /// How far ahead of the weight stream the kernels ask for cache lines.
    /// The hardware prefetcher alone left the FP8 kernel waiting on memory
    /// (it reads 32 bytes a step, so the out-of-order window covers few
    /// lines); 8 KiB ahead measured best for every weight type with two
    /// threads (`octet bench mixed`, BENCHMARKS.md).
    const PREFETCH_BYTES: usize = 32768;

    /// Prefetch the cache lines `PREFETCH_BYTES` past the `bytes` at `p`. A
    /// prefetch past the end of the weights is harmless: it never faults.
    #[inline(always)]
    unsafe fn prefetch_ahead<T>(p: *const T, bytes: usize) {
        let p = p.cast::<i8>().wrapping_add(PREFETCH_BYTES);
        let mut off = 0;
        while off < bytes {
            _mm_prefetch(p.wrapping_add(off), _MM_HINT_T1);
            off += 64;
        }
    }

    /// Decode FP8 codes through their f16 bit patterns (E4M3 as `value * 2^-8`).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn decode_fp8(e4m3: bool, src: &[u8], out: &mut [f32]) {
        let n = src.len().min(out.len());
        let full = n / 16 * 16;
        let mut i = 0;
        while i < full {
            let p = src.as_ptr().add(i);
            let (a, b) = if e4m3 { e4m3x16(p) } else { e5m2x16(p) };
            _mm256_storeu_ps(out.as_mut_ptr().add(i), a);
            _mm256_storeu_ps(out.as_mut_ptr().add(i + 8), b);
            i += 16;
        }
        for j in full..n {
            out[j] = if e4m3 {
                e4m3_one(src[j])
            } else {
                e5m2_one(src[j])
            };
        }
    }

    /// Split 16 f16 bit patterns into two vectors of 8 f32.
    #[inline(always)]
    unsafe fn halves_to_f32(h: __m256i) -> (__m256, __m256) {
        (
            _mm256_cvtph_ps(_mm256_castsi256_si128(h)),
            _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1)),
        )
    }

    /// 16 E4M3 codes as `value * 2^-8`: sign-extend to 16 bits, shift left by
    /// 7, clear bit 14 (giving s 0eeee mmm 0000000), convert from f16.
    #[inline(always)]
    unsafe fn e4m3x16(p: *const u8) -> (__m256, __m256) {
        let v = _mm256_cvtepi8_epi16(_mm_loadu_si128(p as *const __m128i));
        halves_to_f32(_mm256_and_si256(
            _mm256_slli_epi16(v, 7),
            _mm256_set1_epi16(0xbf80u16 as i16),
        ))
    }

    /// 16 E5M2 codes: each is the top byte of its f16.
    #[inline(always)]
    unsafe fn e5m2x16(p: *const u8) -> (__m256, __m256) {
        let v = _mm256_cvtepu8_epi16(_mm_loadu_si128(p as *const __m128i));
        halves_to_f32(_mm256_slli_epi16(v, 8))
    }

    /// 16 bf16 values: each is the top half of its f32.
    #[inline(always)]
    unsafe fn bf16x16(p: *const half::bf16) -> (__m256, __m256) {
        let v = _mm256_loadu_si256(p as *const __m256i);
        let lo = _mm256_cvtepu16_epi32(_mm256_castsi256_si128(v));
        let hi = _mm256_cvtepu16_epi32(_mm256_extracti128_si256(v, 1));
        (
            _mm256_castsi256_ps(_mm256_slli_epi32(lo, 16)),
            _mm256_castsi256_ps(_mm256_slli_epi32(hi, 16)),
        )
    }

    /// 16 f32 values.
    #[inline(always)]
    unsafe fn f32x16(p: *const f32) -> (__m256, __m256) {
        (_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8)))
    }

    fn e4m3_one(c: u8) -> f32 {
        let c = c as u16;
        half::f16::from_bits(((c & 0x80) << 8) | ((c & 0x7f) << 7)).to_f32()
    }

    fn e5m2_one(c: u8) -> f32 {
        half::f16::from_bits((c as u16) << 8).to_f32()
    }

    /// [`super::dot_f32`]'s order over weights decoded 16 at a time by `$x16`
    /// and one at a time by `$one` (the tail of a block).
    macro_rules! dot_kernel {
        ($(#[$doc:meta])* $name:ident, $t:ty, $x16:ident, $one:expr) => {
            $(#[$doc])*
            #[target_feature(enable = "avx2,fma,f16c")]
            pub unsafe fn $name(w: &[$t], x: &[f32], blocks: Option<&[f32]>) -> f32 {
                let n = w.len().min(x.len());
                let block = if blocks.is_some() { super::BLOCK } else { n.max(1) };
                let (pw, px) = (w.as_ptr(), x.as_ptr());
                let mut total = [_mm256_setzero_ps(); 4];
                let mut start = 0;
                let mut b = 0;
                while start < n {
                    let end = (start + block).min(n);
                    let full = start + (end - start) / 32 * 32;
                    let mut acc = [_mm256_setzero_ps(); 4];
                    let mut i = start;
                    while i < full {
                        prefetch_ahead(pw.add(i), 32 * std::mem::size_of::<$t>());
                        let (w0, w1) = $x16(pw.add(i));
                        let (w2, w3) = $x16(pw.add(i + 16));
                        acc[0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(px.add(i)), acc[0]);
                        acc[1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(px.add(i + 8)), acc[1]);
                        acc[2] = _mm256_fmadd_ps(w2, _mm256_loadu_ps(px.add(i + 16)), acc[2]);
                        acc[3] = _mm256_fmadd_ps(w3, _mm256_loadu_ps(px.add(i + 24)), acc[3]);
                        i += 32;
                    }
                    if full < end {
                        // The block's tail, one element at a time into its lane.
                        let mut lanes = [0f32; 32];
                        for c in 0..4 {
                            _mm256_storeu_ps(lanes.as_mut_ptr().add(8 * c), acc[c]);
                        }
                        for j in full..end {
                            let wj: f32 = $one(w[j]);
                            lanes[j % 32] = wj.mul_add(x[j], lanes[j % 32]);
                        }
                        for c in 0..4 {
                            acc[c] = _mm256_loadu_ps(lanes.as_ptr().add(8 * c));
                        }
                    }
                    let f = _mm256_set1_ps(blocks.map_or(1.0, |f| f[b]));
                    for c in 0..4 {
                        total[c] = _mm256_fmadd_ps(acc[c], f, total[c]);
                    }
                    start = end;
                    b += 1;
                }
                let mut lanes = [0f32; 32];
                for c in 0..4 {
                    _mm256_storeu_ps(lanes.as_mut_ptr().add(8 * c), total[c]);
                }
                super::sum32(&lanes)
            }
        };
    }

    dot_kernel!(
        /// f32 weights.
        dot_f32, f32, f32x16, |v: f32| v
    );
    dot_kernel!(
        /// E4M3 codes, decoded as `value * 2^-8`.
        dot_e4m3, u8, e4m3x16, e4m3_one
    );
    dot_kernel!(
        /// E5M2 codes.
        dot_e5m2, u8, e5m2x16, e5m2_one
    );
    dot_kernel!(
        /// bf16 weights.
        dot_bf16, half::bf16, bf16x16, |v: half::bf16| v.to_f32()
    );

    /// [`decode_fp8`] 32 codes at a time in 512-bit registers.
    #[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
    pub unsafe fn decode_fp8_512(e4m3: bool, src: &[u8], out: &mut [f32]) {
        let n = src.len().min(out.len());
        let full = n / 32 * 32;
        let mut i = 0;
        while i < full {
            let p = src.as_ptr().add(i);
            let (a, b) = if e4m3 { e4m3x32(p) } else { e5m2x32(p) };
            _mm512_storeu_ps(out.as_mut_ptr().add(i), a);
            _mm512_storeu_ps(out.as_mut_ptr().add(i + 16), b);
            i += 32;
        }
        decode_fp8(e4m3, &src[full..n], &mut out[full..n]);
    }

    /// Split 32 f16 bit patterns into two vectors of 16 f32.
    #[inline(always)]
    unsafe fn halves_to_f32_512(h: __m512i) -> (__m512, __m512) {
        (
            _mm512_cvtph_ps(_mm512_castsi512_si256(h)),
            _mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1)),
        )
    }

    /// 32 E4M3 codes as `value * 2^-8` (as [`e4m3x16`]).
    #[inline(always)]
    unsafe fn e4m3x32(p: *const u8) -> (__m512, __m512) {
        let v = _mm512_cvtepi8_epi16(_mm256_loadu_si256(p as *const __m256i));
        halves_to_f32_512(_mm512_and_si512(
            _mm512_slli_epi16(v, 7),
            _mm512_set1_epi16(0xbf80u16 as i16),
        ))
    }

    /// 32 E4M3 codes as `value * 2^-120` with integer instructions only:
    /// sign-extend each to 32 bits, shift left by 20 and keep the sign bit
    /// and the code's 7 exponent and mantissa bits (`s 0000eeee mmm 0..0`).
    /// For the input scaled by `2^112` ([`super::scaled_input`]).
    #[inline(always)]
    unsafe fn e4m3x32_up(p: *const u8) -> (__m512, __m512) {
        let mask = _mm512_set1_epi32(E4M3_UP_MASK as i32);
        let a = _mm512_cvtepi8_epi32(_mm_loadu_si128(p as *const __m128i));
        let b = _mm512_cvtepi8_epi32(_mm_loadu_si128(p.add(16) as *const __m128i));
        (
            _mm512_castsi512_ps(_mm512_and_si512(_mm512_slli_epi32(a, 20), mask)),
            _mm512_castsi512_ps(_mm512_and_si512(_mm512_slli_epi32(b, 20), mask)),
        )
    }

    /// The sign bit and bits 26..20 (E4M3's exponent and mantissa after the shift).
    const E4M3_UP_MASK: u32 = 0x87f0_0000;

    /// One E4M3 code as `value * 2^-120` (as [`e4m3x32_up`]).
    pub(super) fn e4m3_up_one(c: u8) -> f32 {
        f32::from_bits(((c as i8 as i32 as u32) << 20) & E4M3_UP_MASK)
    }

    /// 32 E5M2 codes.
    #[inline(always)]
    unsafe fn e5m2x32(p: *const u8) -> (__m512, __m512) {
        let v = _mm512_cvtepu8_epi16(_mm256_loadu_si256(p as *const __m256i));
        halves_to_f32_512(_mm512_slli_epi16(v, 8))
    }

    /// 32 bf16 values.
    #[inline(always)]
    unsafe fn bf16x32(p: *const half::bf16) -> (__m512, __m512) {
        let lo = _mm512_cvtepu16_epi32(_mm256_loadu_si256(p as *const __m256i));
        let hi = _mm512_cvtepu16_epi32(_mm256_loadu_si256(p.add(16) as *const __m256i));
        (
            _mm512_castsi512_ps(_mm512_slli_epi32(lo, 16)),
            _mm512_castsi512_ps(_mm512_slli_epi32(hi, 16)),
        )
    }

    /// 32 f32 values.
    #[inline(always)]
    unsafe fn f32x32(p: *const f32) -> (__m512, __m512) {
        (_mm512_loadu_ps(p), _mm512_loadu_ps(p.add(16)))
    }

    /// [`super::dot_f32`]'s order for `W` weight rows times `R` rows of `x`
    /// at once: each chunk of 32 weights is decoded once by `$x32` (`$one`
    /// for a block's tail) and multiplied into every `x` row's two 16-lane
    /// accumulators (lanes 0-15 and 16-31 of the documented 32). Two weight
    /// rows make two streams from memory and share the loads of `x`.
    macro_rules! dot512_kernel {
        ($(#[$doc:meta])* $name:ident, $t:ty, $x32:ident, $one:expr) => {
            $(#[$doc])*
            #[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
            pub unsafe fn $name<const W: usize, const R: usize>(
                ws: [&[$t]; W],
                xs: [&[f32]; R],
                blocks: [Option<&[f32]>; W],
            ) -> [[f32; R]; W] {
                let mut n = usize::MAX;
                for w in &ws {
                    n = n.min(w.len());
                }
                for x in &xs {
                    n = n.min(x.len());
                }
                let block = if blocks[0].is_some() { super::BLOCK } else { n.max(1) };
                let mut total = [[[_mm512_setzero_ps(); 2]; R]; W];
                let mut start = 0;
                let mut b = 0;
                while start < n {
                    let end = (start + block).min(n);
                    let full = start + (end - start) / 32 * 32;
                    let mut acc = [[[_mm512_setzero_ps(); 2]; R]; W];
                    let mut i = start;
                    while i < full {
                        for v in 0..W {
                            let pw = ws[v].as_ptr().add(i);
                            prefetch_ahead(pw, 32 * std::mem::size_of::<$t>());
                            let (w0, w1) = $x32(pw);
                            for r in 0..R {
                                let px = xs[r].as_ptr().add(i);
                                acc[v][r][0] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(px), acc[v][r][0]);
                                acc[v][r][1] =
                                    _mm512_fmadd_ps(w1, _mm512_loadu_ps(px.add(16)), acc[v][r][1]);
                            }
                        }
                        i += 32;
                    }
                    for v in 0..W {
                        if full < end {
                            // The block's tail, one element at a time into its lane.
                            for r in 0..R {
                                let mut lanes = [0f32; 32];
                                _mm512_storeu_ps(lanes.as_mut_ptr(), acc[v][r][0]);
                                _mm512_storeu_ps(lanes.as_mut_ptr().add(16), acc[v][r][1]);
                                for j in full..end {
                                    let wj: f32 = $one(ws[v][j]);
                                    lanes[j % 32] = wj.mul_add(xs[r][j], lanes[j % 32]);
                                }
                                acc[v][r][0] = _mm512_loadu_ps(lanes.as_ptr());
                                acc[v][r][1] = _mm512_loadu_ps(lanes.as_ptr().add(16));
                            }
                        }
                        let f = _mm512_set1_ps(blocks[v].map_or(1.0, |f| f[b]));
                        for r in 0..R {
                            for c in 0..2 {
                                total[v][r][c] = _mm512_fmadd_ps(acc[v][r][c], f, total[v][r][c]);
                            }
                        }
                    }
                    start = end;
                    b += 1;
                }
                let mut out = [[0f32; R]; W];
                for v in 0..W {
                    for r in 0..R {
                        let mut lanes = [0f32; 32];
                        _mm512_storeu_ps(lanes.as_mut_ptr(), total[v][r][0]);
                        _mm512_storeu_ps(lanes.as_mut_ptr().add(16), total[v][r][1]);
                        out[v][r] = super::sum32(&lanes);
                    }
                }
                out
            }
        };
    }

    dot512_kernel!(
        /// f32 weights, 16 lanes an instruction.
        dot512_f32, f32, f32x32, |v: f32| v
    );
    dot512_kernel!(
        /// E4M3 codes, decoded as `value * 2^-8`.
        dot512_e4m3, u8, e4m3x32, e4m3_one
    );
    dot512_kernel!(
        /// E4M3 codes decoded as `value * 2^-120`, for `x` scaled by `2^112`.
        dot512_e4m3_up, u8, e4m3x32_up, e4m3_up_one
    );
    dot512_kernel!(
        /// E5M2 codes.
        dot512_e5m2, u8, e5m2x32, e5m2_one
    );
    dot512_kernel!(
        /// bf16 weights.
        dot512_bf16, half::bf16, bf16x32, |v: half::bf16| v.to_f32()
    );
}

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

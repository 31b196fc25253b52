//! Weight-only FP8 products on the CPU: `y (M, N) = x (M, K) @ W^T` with `x`
//! in f32 or bf16 and `W (N, K)` stored as FP8 codes (E4M3 or E5M2) with
//! per-tensor, per-output-channel or 128x128 block scales.
//!
//! The weight bytes that stream from memory are the FP8 codes; each code is
//! widened to f32 in registers inside the loop over `K` (AVX2 + F16C where the
//! CPU has them, a 256-entry table otherwise) and never written back to
//! memory as a high-precision matrix. This pays where moving weight bytes is
//! the cost: `M` of 1 to a few dozen (decoding) and weights beyond the caches.
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
//! the scale; an E5M2 byte is the top byte of its f16. The E4M3 trick turns
//! the NaN codes into finite numbers, so [`Fp8Weight`] refuses weights with
//! NaN codes when it is built.
//!
//! Accumulation is f32 in a fixed order per output (8 lanes over `K`, then the
//! lanes summed), so results do not depend on the thread count. Against the
//! f64 product of the dequantized weight the error is bounded by
//! `(K/8 + 3) * 2^-24 * sum_k |x_k * w_k|` ([`error_bound`]).

use crate::{cpu, Error, Result, Tensor};
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
    /// Row-major `(N, K)` codes.
    codes: Vec<u8>,
    /// Dequantization factors: 1, `N`, or `ceil(N/128) * ceil(K/128)` of them.
    factors: Vec<f32>,
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
        if w.len() != n * k || n == 0 || k == 0 {
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
        Fp8Weight::from_quant_data(&data)
    }

    /// Wrap the row-wise copy of a quantized weight (f32 scale factors per
    /// tensor, row, or 128x128 tile), e.g. an FP8 checkpoint's tensor.
    pub fn from_quant_data(q: &QuantData) -> Result<Fp8Weight> {
        let (n, k) = (q.rows, q.cols);
        if !matches!(q.format, Format::E4M3 | Format::E5M2) {
            return Err(Error::Unsupported(format!(
                "weight-only products take E4M3 or E5M2 weights, not {}",
                q.format.name()
            )));
        }
        let factors = match &q.scales {
            Scales::F32(v) => v.clone(),
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
            other => return Err(Error::Unsupported(format!(
                "weight-only products take tensor, per-row or 128x128 scales, not {other:?} blocks"
            ))),
        };
        let want = match scaling {
            WeightScaling::Tensor => 1,
            WeightScaling::Channel => n,
            WeightScaling::Block128 => n.div_ceil(128) * k.div_ceil(128),
        };
        if factors.len() != want || q.data.len() != n * k {
            return Err(Error::Shape(format!(
                "weight ({n}, {k}) has {} codes and {} scales, expected {} and {want}",
                q.data.len(),
                factors.len(),
                n * k
            )));
        }
        if let Some(i) = q.data.iter().position(|&c| q.format.is_nan(c)) {
            return Err(Error::Unsupported(format!(
                "weight element ({}, {}) is NaN",
                i / k,
                i % k
            )));
        }
        Ok(Fp8Weight {
            n,
            k,
            format: q.format,
            scaling,
            codes: q.data.clone(),
            factors,
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
        &self.codes
    }

    /// Dequantization factors (1, `N`, or one per 128x128 tile row-major).
    pub fn factors(&self) -> &[f32] {
        &self.factors
    }

    /// Bytes held: codes plus scales.
    pub fn bytes(&self) -> usize {
        self.codes.len() + 4 * self.factors.len()
    }

    /// The factor of element `(row, col)`.
    fn factor(&self, row: usize, col: usize) -> f32 {
        match self.scaling {
            WeightScaling::Tensor => self.factors[0],
            WeightScaling::Channel => self.factors[row],
            WeightScaling::Block128 => self.factors[(row / 128) * self.k.div_ceil(128) + col / 128],
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
                    table[self.codes[r * self.k + c] as usize] * self.factor(r, c);
            }
        }
        out
    }
}

/// Bound on `|y - y_f64|` for one output of [`mixed_matmul`] over `k` terms
/// whose absolute products sum to `abs_sum`: f32 accumulation in 8 lanes of
/// `ceil(k/8)` terms each, a 3-level lane sum and the scale multiply, each
/// step rounding with relative error at most `2^-24`.
pub fn error_bound(k: usize, abs_sum: f64) -> f64 {
    (k.div_ceil(8) + 5) as f64 * 2f64.powi(-24) * abs_sum
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
    match w {
        WeightRef::Bf16(v, ..) if v.len() != n * k => {
            return Err(Error::Shape(format!(
                "bf16 weight of {} values is not ({n}, {k})",
                v.len()
            )))
        }
        WeightRef::F32(v, ..) if v.len() != n * k => {
            return Err(Error::Shape(format!(
                "f32 weight of {} values is not ({n}, {k})",
                v.len()
            )))
        }
        _ => {}
    }
    let xs: Vec<f32> = match (x.as_f32(), x.as_bf16()) {
        (Some(v), _) => v.to_vec(),
        (_, Some(v)) => v.iter().map(|b| b.to_f32()).collect(),
        _ => {
            return Err(Error::Unsupported(format!(
                "mixed product of a {:?} input; use f32 or bf16",
                x.dtype()
            )))
        }
    };
    let y = if m <= SMALL_M {
        small_m(&xs, m, k, n, w)
    } else {
        tiled(&xs, m, k, n, w)
    };
    Tensor::from_f32(&[m, n], y)
}

/// Up to this many rows of `x` run the streaming kernel; more run the tiled one.
const SMALL_M: usize = 16;
/// Output channels per tile of the tiled kernel (decoded into a small f32 panel).
const TILE_N: usize = 64;
/// Columns of `K` decoded per step of the streaming kernel (fits L1 with `x`'s slice).
const CHUNK_K: usize = 128;

/// Streaming kernel: rows of `W` split across threads; each row is decoded
/// `CHUNK_K` codes at a time into an L1-resident buffer and multiplied with
/// the `M` rows of `x`. Block scales apply per 128-column block.
fn small_m(x: &[f32], m: usize, k: usize, n: usize, w: &WeightRef<'_>) -> Vec<f32> {
    // y^T (N, M): each thread writes whole rows of it, then one transpose.
    let mut yt = vec![0f32; n * m];
    let rows_per_task = (n / (4 * rayon::current_num_threads().max(1))).clamp(1, 256);
    yt.par_chunks_mut(rows_per_task * m)
        .enumerate()
        .for_each(|(task, out)| {
            let mut buf = [0f32; CHUNK_K];
            let mut acc = vec![0f32; m];
            let mut block_acc = vec![0f32; m];
            for (r, yrow) in out.chunks_mut(m).enumerate() {
                let row = task * rows_per_task + r;
                acc.iter_mut().for_each(|a| *a = 0.0);
                let mut k0 = 0;
                while k0 < k {
                    let len = CHUNK_K.min(k - k0);
                    // One chunk never straddles a 128 block: CHUNK_K = 128.
                    let (factor, scaled) = decode_chunk(w, row, k0, &mut buf[..len]);
                    block_acc.iter_mut().for_each(|a| *a = 0.0);
                    for i in 0..m {
                        block_acc[i] = dot(&buf[..len], &x[i * k + k0..i * k + k0 + len]);
                    }
                    match scaled {
                        // Block scales: scale each block's partial sum.
                        true => (0..m).for_each(|i| acc[i] += block_acc[i] * factor),
                        false => (0..m).for_each(|i| acc[i] += block_acc[i]),
                    }
                    k0 += len;
                }
                let post = row_factor(w, row);
                for i in 0..m {
                    yrow[i] = acc[i] * post;
                }
            }
        });
    octet_fp8::quant::transpose(&yt, n, m)
}

/// Tiled kernel: `TILE_N` rows of `W` are decoded into an f32 panel (`TILE_N x K`,
/// in L2) and multiplied with all of `x` by the f32 GEMM; tiles run in parallel.
fn tiled(x: &[f32], m: usize, k: usize, n: usize, w: &WeightRef<'_>) -> Vec<f32> {
    let tiles = n.div_ceil(TILE_N);
    let parts: Vec<Vec<f32>> = (0..tiles)
        .into_par_iter()
        .map(|t| {
            let r0 = t * TILE_N;
            let rows = TILE_N.min(n - r0);
            let mut panel = vec![0f32; rows * k];
            for r in 0..rows {
                decode_row_scaled(w, r0 + r, &mut panel[r * k..(r + 1) * k]);
            }
            cpu::gemm_serial(m, rows, k, x, &panel)
        })
        .collect();
    let mut y = vec![0f32; m * n];
    for (t, part) in parts.iter().enumerate() {
        let r0 = t * TILE_N;
        let rows = TILE_N.min(n - r0);
        for i in 0..m {
            y[i * n + r0..i * n + r0 + rows].copy_from_slice(&part[i * rows..(i + 1) * rows]);
        }
    }
    y
}

/// The factor applied after the sum over `K` (per tensor or channel; 1 for block scales,
/// which apply per block inside the loop). Includes E4M3's `2^8` from the decode trick.
fn row_factor(w: &WeightRef<'_>, row: usize) -> f32 {
    match w {
        WeightRef::Fp8(q) => {
            let f = match q.scaling {
                WeightScaling::Tensor => q.factors[0],
                WeightScaling::Channel => q.factors[row],
                WeightScaling::Block128 => 1.0,
            };
            f * e4m3_fixup(q.format)
        }
        _ => 1.0,
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

/// Decode `out.len()` weights of `row` from column `k0` into `out` (unscaled
/// codes, E4M3 as `value * 2^-8`); returns the block factor and whether it
/// applies per block.
fn decode_chunk(w: &WeightRef<'_>, row: usize, k0: usize, out: &mut [f32]) -> (f32, bool) {
    match w {
        WeightRef::Fp8(q) => {
            let src = &q.codes[row * q.k + k0..row * q.k + k0 + out.len()];
            decode_fp8(q.format, src, out);
            match q.scaling {
                WeightScaling::Block128 => (q.factor(row, k0), true),
                _ => (1.0, false),
            }
        }
        WeightRef::Bf16(v, _, k) => {
            let src = &v[row * k + k0..row * k + k0 + out.len()];
            for (o, s) in out.iter_mut().zip(src) {
                *o = s.to_f32();
            }
            (1.0, false)
        }
        WeightRef::F32(v, _, k) => {
            out.copy_from_slice(&v[row * k + k0..row * k + k0 + out.len()]);
            (1.0, false)
        }
    }
}

/// Decode a whole row with every factor applied (the tiled kernel's panel).
fn decode_row_scaled(w: &WeightRef<'_>, row: usize, out: &mut [f32]) {
    let k = out.len();
    let mut k0 = 0;
    while k0 < k {
        let len = CHUNK_K.min(k - k0);
        let (f, block) = decode_chunk(w, row, k0, &mut out[k0..k0 + len]);
        let f = if block { f } else { 1.0 } * row_factor(w, row);
        if f != 1.0 {
            out[k0..k0 + len].iter_mut().for_each(|v| *v *= f);
        }
        k0 += len;
    }
}

/// Decode FP8 codes to f32: E5M2 exactly, E4M3 as `value * 2^-8`.
fn decode_fp8(format: Format, src: &[u8], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        if simd::available() {
            // SAFETY: the CPU has AVX2, FMA and F16C (checked at run time).
            unsafe { simd::decode_fp8(format == Format::E4M3, src, out) };
            return;
        }
    }
    let table = format.table();
    let fix = 1.0 / e4m3_fixup(format);
    for (o, &c) in out.iter_mut().zip(src) {
        *o = table[c as usize] * fix;
    }
}

/// `sum a_i b_i` in f32 over 8 lanes (the same order with and without SIMD).
fn dot(a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    {
        if simd::available() {
            // SAFETY: the CPU has AVX2 and FMA (checked at run time).
            return unsafe { simd::dot(a, b) };
        }
    }
    let mut lanes = [0f32; 8];
    let full = a.len() / 8 * 8;
    for i in (0..full).step_by(8) {
        for l in 0..8 {
            lanes[l] = a[i + l].mul_add(b[i + l], lanes[l]);
        }
    }
    for i in full..a.len() {
        lanes[i - full] = a[i].mul_add(b[i], lanes[i - full]);
    }
    sum8(lanes)
}

/// The lane sum both paths use: ((0+4)+(2+6)) + ((1+5)+(3+7)).
fn sum8(l: [f32; 8]) -> f32 {
    let a = [l[0] + l[4], l[1] + l[5], l[2] + l[6], l[3] + l[7]];
    let b = [a[0] + a[2], a[1] + a[3]];
    b[0] + b[1]
}

#[cfg(target_arch = "x86_64")]
mod simd {
    use std::arch::x86_64::*;

    /// Whether the AVX2 + FMA + F16C paths can run.
    pub fn available() -> bool {
        is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
    }

    /// Decode FP8 codes through their f16 bit patterns.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn decode_fp8(e4m3: bool, src: &[u8], out: &mut [f32]) {
        let n = src.len().min(out.len());
        let full = n / 8 * 8;
        let sign = _mm_set1_epi16(0x80);
        let rest = _mm_set1_epi16(0x7f);
        let mut i = 0;
        while i < full {
            let bytes = _mm_loadl_epi64(src.as_ptr().add(i) as *const __m128i);
            let h = _mm_cvtepu8_epi16(bytes);
            let half = if e4m3 {
                // s eeee mmm -> s 0eeee mmm 0000000
                _mm_or_si128(
                    _mm_slli_epi16(_mm_and_si128(h, sign), 8),
                    _mm_slli_epi16(_mm_and_si128(h, rest), 7),
                )
            } else {
                _mm_slli_epi16(h, 8)
            };
            _mm256_storeu_ps(out.as_mut_ptr().add(i), _mm256_cvtph_ps(half));
            i += 8;
        }
        for j in full..n {
            let c = src[j] as u16;
            let bits = if e4m3 {
                ((c & 0x80) << 8) | ((c & 0x7f) << 7)
            } else {
                c << 8
            };
            out[j] = half::f16::from_bits(bits).to_f32();
        }
    }

    /// 8-lane FMA dot product, lanes summed as [`super::sum8`] does.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot(a: &[f32], b: &[f32]) -> f32 {
        let n = a.len().min(b.len());
        let full = n / 8 * 8;
        let mut acc = _mm256_setzero_ps();
        let mut i = 0;
        while i < full {
            let va = _mm256_loadu_ps(a.as_ptr().add(i));
            let vb = _mm256_loadu_ps(b.as_ptr().add(i));
            acc = _mm256_fmadd_ps(va, vb, acc);
            i += 8;
        }
        let mut lanes = [0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), acc);
        for j in full..n {
            lanes[j - full] = a[j].mul_add(b[j], lanes[j - full]);
        }
        super::sum8(lanes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every non-NaN code decodes exactly, on the scalar and the SIMD path.
    #[test]
    fn every_code_decodes_exactly() {
        for format in [Format::E4M3, Format::E5M2] {
            let codes: Vec<u8> = (0..=255u8).filter(|&c| !format.is_nan(c)).collect();
            let want: Vec<f32> = codes.iter().map(|&c| format.decode(c)).collect();
            let fix = e4m3_fixup(format);
            let mut got = vec![0f32; codes.len()];
            decode_fp8(format, &codes, &mut got);
            for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(
                    (g * fix).to_bits(),
                    w.to_bits(),
                    "{format:?} code {:#x}",
                    codes[i]
                );
            }
            #[cfg(target_arch = "x86_64")]
            if simd::available() {
                let mut got = vec![0f32; codes.len()];
                // SAFETY: checked just above.
                unsafe { simd::decode_fp8(format == Format::E4M3, &codes, &mut got) };
                for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
                    assert_eq!(
                        (g * fix).to_bits(),
                        w.to_bits(),
                        "simd {format:?} code {:#x}",
                        codes[i]
                    );
                }
            }
        }
    }

    /// The SIMD dot product sums in the scalar path's order: bit-identical.
    #[test]
    fn simd_and_scalar_dots_agree_bit_for_bit() {
        #[cfg(target_arch = "x86_64")]
        if simd::available() {
            for len in [1usize, 7, 8, 9, 100, 128] {
                let a: Vec<f32> = (0..len)
                    .map(|i| ((i * 37 % 11) as f32 - 5.0) * 0.37)
                    .collect();
                let b: Vec<f32> = (0..len)
                    .map(|i| ((i * 53 % 13) as f32 - 6.0) * 1.13)
                    .collect();
                let mut lanes = [0f32; 8];
                let full = len / 8 * 8;
                for i in 0..len {
                    let l = if i < full { i % 8 } else { i - full };
                    lanes[l] = a[i].mul_add(b[i], lanes[l]);
                }
                // SAFETY: checked just above.
                let s = unsafe { simd::dot(&a, &b) };
                assert_eq!(s.to_bits(), sum8(lanes).to_bits(), "len {len}");
            }
        }
    }
}

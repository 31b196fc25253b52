//! The x86-64 kernels of the weight-only products: AVX-512 and AVX2 + F16C
//! dot products over FP8, f16 and bf16 weight rows, with prefetching ahead of
//! the weight stream.

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

//! Slice conversions: many elements at once, split across threads when large.
//!
//! The loops are written so that the compiler can keep them branch-light; each
//! element runs exactly the scalar rule of [`Format::encode`], so slice and
//! scalar results are the same bytes.

use crate::format::{encode_minifloat, Format, Overflow, Rounding, E4M3_SPEC, E5M2_SPEC};
use half::{bf16, f16};
use rayon::prelude::*;

/// Below this many elements a conversion stays on the calling thread.
const PAR_MIN: usize = 1 << 16;
/// Elements per parallel task (a multiple of 2 so FP4 pairs never straddle tasks).
const CHUNK: usize = 1 << 15;

/// A source element type that widens exactly to f32.
pub trait ToF32: Copy + Default + Send + Sync {
    /// The exact f32 value.
    fn to_f32_exact(self) -> f32;
}
impl ToF32 for f32 {
    #[inline(always)]
    fn to_f32_exact(self) -> f32 {
        self
    }
}
impl ToF32 for bf16 {
    #[inline(always)]
    fn to_f32_exact(self) -> f32 {
        // bf16 is the upper half of an f32: a shift is exact for every value,
        // NaN payloads included, and vectorises (`half`'s conversion quiets
        // NaNs with a branch).
        f32::from_bits(u32::from(self.to_bits()) << 16)
    }
}
impl ToF32 for f16 {
    #[inline(always)]
    fn to_f32_exact(self) -> f32 {
        self.to_f32()
    }
}

/// Encode `src[i] * scale` into `dst[i]` for an 8-bit format, with `src.len() == dst.len()`.
///
/// `base_index` is the index of `src[0]` in the whole tensor (stochastic
/// rounding draws its bits by global index).
///
/// # Panics
/// If the lengths differ or the format is E2M1 (use [`encode_fp4_slice`]).
pub fn encode_slice<T: ToF32>(
    format: Format,
    src: &[T],
    scale: f32,
    dst: &mut [u8],
    overflow: Overflow,
    rounding: Rounding,
    base_index: u64,
) {
    assert_eq!(src.len(), dst.len(), "encode_slice: length mismatch");
    assert!(
        format != Format::E2M1,
        "encode_slice: use encode_fp4_slice for E2M1"
    );
    let run = |s: &[T], d: &mut [u8], base: u64| match (format, rounding) {
        (Format::E4M3 | Format::E5M2, Rounding::NearestEven) => {
            encode_nearest(format, s, scale, d, overflow)
        }
        _ => {
            for (i, (o, &x)) in d.iter_mut().zip(s).enumerate() {
                *o = format.encode(
                    x.to_f32_exact() * scale,
                    overflow,
                    rounding,
                    base + i as u64,
                );
            }
        }
    };
    if src.len() < PAR_MIN {
        run(src, dst, base_index);
    } else {
        src.par_chunks(CHUNK)
            .zip(dst.par_chunks_mut(CHUNK))
            .enumerate()
            .for_each(|(c, (s, d))| run(s, d, base_index + (c * CHUNK) as u64));
    }
}

/// One loop per format with the spec as a constant, so the compiler folds it
/// in and vectorises the branch-free encoder.
#[inline(always)]
fn encode_nearest_generic<T: ToF32>(
    format: Format,
    s: &[T],
    scale: f32,
    d: &mut [u8],
    overflow: Overflow,
) {
    let spec = if format == Format::E4M3 {
        &E4M3_SPEC
    } else {
        &E5M2_SPEC
    };
    match (format, overflow) {
        (Format::E4M3, Overflow::Saturate) => {
            for (o, &x) in d.iter_mut().zip(s) {
                *o = encode_minifloat(
                    x.to_f32_exact() * scale,
                    &E4M3_SPEC,
                    Overflow::Saturate,
                    None,
                );
            }
        }
        (Format::E5M2, Overflow::Saturate) => {
            for (o, &x) in d.iter_mut().zip(s) {
                *o = encode_minifloat(
                    x.to_f32_exact() * scale,
                    &E5M2_SPEC,
                    Overflow::Saturate,
                    None,
                );
            }
        }
        _ => {
            for (o, &x) in d.iter_mut().zip(s) {
                *o = encode_minifloat(x.to_f32_exact() * scale, spec, overflow, None);
            }
        }
    }
}

/// The same loop compiled for AVX2 (variable shifts and wider selects).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn encode_nearest_avx2<T: ToF32>(
    format: Format,
    s: &[T],
    scale: f32,
    d: &mut [u8],
    overflow: Overflow,
) {
    encode_nearest_generic(format, s, scale, d, overflow)
}

/// Nearest-even encode of E4M3/E5M2, picking the widest instruction set the CPU has at run time.
fn encode_nearest<T: ToF32>(format: Format, s: &[T], scale: f32, d: &mut [u8], overflow: Overflow) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2 (checked just above).
        unsafe { encode_nearest_avx2(format, s, scale, d, overflow) };
        return;
    }
    encode_nearest_generic(format, s, scale, d, overflow)
}

/// Decode `src[i]` times `scale` into `dst[i]` (8-bit formats).
///
/// # Panics
/// If the lengths differ or the format is E2M1.
pub fn decode_slice(format: Format, src: &[u8], scale: f32, dst: &mut [f32]) {
    assert_eq!(src.len(), dst.len(), "decode_slice: length mismatch");
    assert!(
        format != Format::E2M1,
        "decode_slice: use decode_fp4_slice for E2M1"
    );
    let table = format.table();
    let run = |s: &[u8], d: &mut [f32]| {
        for (o, &c) in d.iter_mut().zip(s) {
            *o = table[c as usize] * scale;
        }
    };
    if src.len() < PAR_MIN {
        run(src, dst);
    } else {
        src.par_chunks(CHUNK)
            .zip(dst.par_chunks_mut(CHUNK))
            .for_each(|(s, d)| run(s, d));
    }
}

/// Bytes needed for `n` packed E2M1 values (two per byte, element `2i` in the low nibble).
pub fn fp4_bytes(n: usize) -> usize {
    n.div_ceil(2)
}

/// Encode `src[i] * scale` as packed E2M1 into `dst` (`fp4_bytes(src.len())` bytes).
/// An odd tail leaves the high nibble of the last byte zero.
pub fn encode_fp4_slice<T: ToF32>(
    src: &[T],
    scale: f32,
    dst: &mut [u8],
    rounding: Rounding,
    base_index: u64,
) {
    assert_eq!(
        dst.len(),
        fp4_bytes(src.len()),
        "encode_fp4_slice: length mismatch"
    );
    let f = Format::E2M1;
    for (j, (o, pair)) in dst.iter_mut().zip(src.chunks(2)).enumerate() {
        let i = base_index + 2 * j as u64;
        let lo = f.encode(
            pair[0].to_f32_exact() * scale,
            Overflow::Saturate,
            rounding,
            i,
        );
        let hi = match pair.get(1) {
            Some(&x) => f.encode(
                x.to_f32_exact() * scale,
                Overflow::Saturate,
                rounding,
                i + 1,
            ),
            None => 0,
        };
        *o = lo | (hi << 4);
    }
}

/// Read element `i` of a packed E2M1 buffer as its 4-bit code.
#[inline]
pub fn fp4_code(packed: &[u8], i: usize) -> u8 {
    (packed[i / 2] >> ((i % 2) * 4)) & 0xF
}

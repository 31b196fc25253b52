//! Slice conversions: many elements at once, split across threads when large.
//!
//! The loops are written so that the compiler can keep them branch-light; each
//! element runs exactly the scalar rule of [`Format::encode`], so slice and
//! scalar results are the same bytes.

use crate::format::{Format, Overflow, Rounding};
use half::{bf16, f16};
use rayon::prelude::*;

/// Below this many elements a conversion stays on the calling thread.
const PAR_MIN: usize = 1 << 16;
/// Elements per parallel task (a multiple of 2 so FP4 pairs never straddle tasks).
const CHUNK: usize = 1 << 15;

/// A source element type that widens exactly to f32.
pub trait ToF32: Copy + Send + Sync {
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
        self.to_f32()
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
    let run = |s: &[T], d: &mut [u8], base: u64| match rounding {
        Rounding::NearestEven => {
            for (o, &x) in d.iter_mut().zip(s) {
                *o = format.encode_rne(x.to_f32_exact() * scale, overflow);
            }
        }
        Rounding::Stochastic { .. } => {
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

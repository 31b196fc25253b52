//! Scale rules: from an amax to the factor that maps a block into a format's range.
//!
//! Convention (as Transformer Engine): `scale` multiplies high-precision values
//! before the cast (`q = cast(x * scale)`), `scale_inv = 1 / scale` multiplies
//! codes back (`x ~= decode(q) * scale_inv`). Only `scale_inv` is stored.

use crate::format::Format;

/// `scale = format.max() / amax`, with every edge case defined:
///
/// | amax | scale | why |
/// |---|---|---|
/// | `0` | `1` | an all-zero block quantizes to zeros under any scale; 1 keeps `scale_inv` finite (TE does the same) |
/// | tiny, `max/amax` overflows f32 | `f32::MAX` | the largest finite scale; such blocks are (near) zero anyway |
/// | NaN or inf | `None` | no finite scale exists: the caller reports the non-finite input |
///
/// With `power_of_two`, the scale is rounded *down* to a power of two, so
/// `amax * scale` still fits the format and `scale_inv` is exact.
/// `margin` divides the scale by `2^margin` (delayed scaling's headroom),
/// applied to `max` before the division as Transformer Engine does.
pub fn scale_from_amax(amax: f32, format: Format, margin: i32, power_of_two: bool) -> Option<f32> {
    if !amax.is_finite() || amax < 0.0 {
        return None;
    }
    if amax == 0.0 {
        return Some(1.0);
    }
    // As Transformer Engine: `(max * 2^-margin) / amax`, so the margin is
    // applied before the f32 cap (dividing first overflows for amaxes the
    // margin brings back into range, and the cap then loses the margin).
    // The product is exact for any margin a recipe uses.
    let mut scale = (format.max() * pow2(-margin)) / amax;
    if !scale.is_finite() {
        scale = f32::MAX;
    }
    if power_of_two {
        scale = floor_pow2(scale);
    }
    Some(scale)
}

/// `2^k` as an exact f32 for `k` in `[-149, 127]` (clamped outside).
pub fn pow2(k: i32) -> f32 {
    let k = k.clamp(-149, 127);
    if k >= -126 {
        f32::from_bits(((k + 127) as u32) << 23)
    } else {
        f32::from_bits(1u32 << (k + 149))
    }
}

/// The largest power of two not above a positive finite `x`.
pub fn floor_pow2(x: f32) -> f32 {
    let bits = x.to_bits();
    if bits >> 23 == 0 {
        // f32 subnormal: keep the leading bit only.
        f32::from_bits(1u32 << (31 - bits.leading_zeros()))
    } else {
        f32::from_bits(bits & 0xFF80_0000)
    }
}

/// MX shared exponent: the smallest `e` with `amax / 2^e <= format.max()`,
/// clamped to E8M0's range `[-127, 127]`; `amax == 0` gives `-127`.
///
/// The OCP MX v1.0 spec takes `floor(log2(amax)) - emax(format)`, which lets
/// the largest elements of a block exceed the format's max and saturate (up
/// to 1.14x over for E4M3); the MXFP8 pre-training study (Mishra et al., 2025)
/// found that saturation hurts convergence and rounds the exponent up instead.
/// This rule is that round-up, computed exactly on the bits (no division):
/// with `amax = m * 2^ea` (`m` in `[1, 2)`) and `max = mf * 2^emax`, the
/// answer is `ea - emax` when `m <= mf` and `ea - emax + 1` otherwise. Blocks
/// therefore never saturate; the price is at most one binade of headroom.
///
/// Returns `None` for a non-finite amax.
pub fn mx_exponent(amax: f32, format: Format) -> Option<i32> {
    if !amax.is_finite() || amax < 0.0 {
        return None;
    }
    if amax == 0.0 {
        return Some(-127);
    }
    let (ma, ea) = split(amax);
    let (mf, emax) = split(format.max());
    let e = if ma <= mf { ea - emax } else { ea - emax + 1 };
    Some(e.clamp(-127, 127))
}

/// Split a positive finite f32 into (mantissa bits with implicit one, unbiased exponent),
/// normalising subnormals so that mantissas compare as values of one binade.
fn split(x: f32) -> (u32, i32) {
    let bits = x.to_bits();
    let e = (bits >> 23) as i32;
    if e == 0 {
        let m = bits & 0x7F_FFFF;
        let shift = m.leading_zeros() - 8; // bring the leading one to bit 23
        (m << shift, -126 - shift as i32)
    } else {
        ((bits & 0x7F_FFFF) | 0x80_0000, e - 127)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scale_edge_cases() {
        assert_eq!(scale_from_amax(0.0, Format::E4M3, 0, false), Some(1.0));
        assert_eq!(scale_from_amax(f32::NAN, Format::E4M3, 0, false), None);
        assert_eq!(scale_from_amax(f32::INFINITY, Format::E5M2, 0, false), None);
        assert_eq!(scale_from_amax(-1.0, Format::E5M2, 0, false), None);
        assert_eq!(
            scale_from_amax(1e-45, Format::E4M3, 0, false),
            Some(f32::MAX)
        );
        assert_eq!(scale_from_amax(448.0, Format::E4M3, 0, false), Some(1.0));
        assert_eq!(scale_from_amax(448.0, Format::E4M3, 2, false), Some(0.25));
        // 448 / 3 = 149.33 -> 128 as a power of two.
        assert_eq!(scale_from_amax(3.0, Format::E4M3, 0, true), Some(128.0));
        assert_eq!(
            scale_from_amax(1e-45, Format::E4M3, 0, true),
            Some(pow2(127))
        );
    }

    #[test]
    fn mx_exponent_never_saturates_and_is_tight() {
        let mut rng = 0x1234_5678_u64;
        for _ in 0..100_000 {
            rng = rng
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let amax = f32::from_bits(((rng >> 33) as u32) & 0x7F7F_FFFF);
            if amax == 0.0 {
                continue;
            }
            for f in [Format::E4M3, Format::E5M2] {
                let e = mx_exponent(amax, f).unwrap();
                if e > -127 && e < 127 {
                    let a = amax as f64;
                    assert!(a / 2f64.powi(e) <= f.max() as f64, "{amax} {e}");
                    assert!(
                        a / 2f64.powi(e - 1) > f.max() as f64,
                        "not tight: {amax} {e}"
                    );
                }
            }
        }
        assert_eq!(mx_exponent(448.0, Format::E4M3), Some(0));
        assert_eq!(mx_exponent(449.0, Format::E4M3), Some(1));
        assert_eq!(mx_exponent(0.0, Format::E4M3), Some(-127));
        assert_eq!(mx_exponent(f32::NAN, Format::E4M3), None);
    }

    #[test]
    fn pow2_is_exact() {
        for k in -149..=127 {
            assert_eq!(pow2(k) as f64, 2f64.powi(k), "{k}");
            if k >= -126 {
                assert_eq!(floor_pow2(pow2(k) * 1.5), pow2(k), "{k}");
            }
        }
    }
}

//! Shared accuracy measures for tests and benchmarks: one place, one definition.
//!
//! Floors in signal-to-quantization-noise ratio (dB), as torchao's float8
//! tests use them, with the derivation: rounding to nearest with `p` mantissa
//! bits has a relative error uniform in `[-2^-(p+1), 2^-(p+1)]` for values in
//! the normal range, so its RMS is `2^-(p+1) / sqrt(3)` and a cast's SQNR is
//! about `6.02 (p + 1) + 4.77` dB: 28.9 dB for E4M3, 22.8 dB for E5M2, 16.8
//! dB for E2M1. Measured values run about 2.5 dB higher (within a binade,
//! larger values have smaller relative error). Per-block scaling loses a little to the top binade, so the
//! floors keep 3 to 4 dB of margin. A product of two quantized operands sums
//! two independent noises (-3 dB), and a GEMM's sum over K averages the
//! relative error of each term but not of the result, so the output keeps
//! the product's SQNR.

/// Minimum SQNR (dB) of an E4M3 quantize-dequantize of Gaussian data (torchao's 25;
/// measured 31.5-32.3 dB for every FP8 recipe on 256x512 Gaussian data with row magnitudes
/// spread over 16 binades' quarter steps).
pub const SQNR_CAST_E4M3: f64 = 25.0;
/// Minimum SQNR (dB) of an E5M2 quantize-dequantize (22.8 dB estimated, measured 25.5-26.3 dB).
pub const SQNR_CAST_E5M2: f64 = 22.0;
/// Minimum SQNR (dB) of a layer output with E4M3 operands (torchao's 18).
pub const SQNR_OUTPUT: f64 = 18.0;
/// Minimum SQNR (dB) of a gradient from FP8 GEMMs with E5M2 grad_output (torchao's 17 for grad_weight).
pub const SQNR_GRAD: f64 = 17.0;
/// Minimum SQNR (dB) of an E2M1 (NVFP4) quantize-dequantize: 16.8 dB estimated; measured
/// 17.1 dB (16x16 weight tiles), 20.4-20.7 dB (1x16 input tiles), 17.3 dB (stochastic
/// rounding of gradients, which adds noise to buy unbiasedness).
pub const SQNR_CAST_E2M1: f64 = 14.0;
/// Minimum SQNR (dB) of NVFP4 outputs and gradients (two E2M1 operands: about 3 dB under a cast).
pub const SQNR_FP4_GEMM: f64 = 11.0;

/// Signal-to-noise ratio in dB of `approx` against `reference`:
/// `10 log10(sum ref^2 / sum (approx - ref)^2)`. Infinite when equal; NaN anywhere gives NaN.
pub fn sqnr_db(reference: &[f64], approx: &[f64]) -> f64 {
    assert_eq!(reference.len(), approx.len(), "sqnr_db: length mismatch");
    let (mut s, mut n) = (0f64, 0f64);
    for (&r, &a) in reference.iter().zip(approx) {
        s += r * r;
        n += (a - r) * (a - r);
    }
    if n == 0.0 {
        // Equal, an all-zero (or empty) reference included, where s / n is 0 / 0.
        return f64::INFINITY;
    }
    10.0 * (s / n).log10()
}

/// The index and both values of the first position where two slices differ bitwise, if any.
pub fn first_bit_mismatch<T: PartialEq + Copy>(a: &[T], b: &[T]) -> Option<(usize, T, T)> {
    a.iter()
        .zip(b)
        .enumerate()
        .find(|(_, (x, y))| x != y)
        .map(|(i, (&x, &y))| (i, x, y))
}

/// Assert two f32 slices are bitwise identical, naming the first differing index.
pub fn assert_bitwise_eq_f32(a: &[f32], b: &[f32], what: &str) {
    assert_eq!(
        a.len(),
        b.len(),
        "{what}: length {} vs {}",
        a.len(),
        b.len()
    );
    let ab: Vec<u32> = a.iter().map(|v| v.to_bits()).collect();
    let bb: Vec<u32> = b.iter().map(|v| v.to_bits()).collect();
    if let Some((i, _, _)) = first_bit_mismatch(&ab, &bb) {
        panic!("{what}: first mismatch at index {i}: {} vs {}", a[i], b[i]);
    }
}

/// Assert two byte slices are identical, naming the first differing index.
pub fn assert_bytes_eq(a: &[u8], b: &[u8], what: &str) {
    assert_eq!(
        a.len(),
        b.len(),
        "{what}: length {} vs {}",
        a.len(),
        b.len()
    );
    if let Some((i, x, y)) = first_bit_mismatch(a, b) {
        panic!("{what}: first mismatch at byte {i}: {x:#04x} vs {y:#04x}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqnr_is_infinite_when_equal_and_nan_with_nan() {
        assert_eq!(sqnr_db(&[1.0, -2.0], &[1.0, -2.0]), f64::INFINITY);
        // An all-zero reference reproduced exactly is equal too (0 / 0 gave NaN).
        assert_eq!(sqnr_db(&[0.0, 0.0], &[0.0, -0.0]), f64::INFINITY);
        assert_eq!(sqnr_db(&[], &[]), f64::INFINITY);
        assert_eq!(sqnr_db(&[0.0], &[1.0]), f64::NEG_INFINITY);
        assert!((sqnr_db(&[1.0, 1.0], &[1.1, 0.9]) - 20.0).abs() < 1e-9);
        assert!(sqnr_db(&[f64::NAN], &[f64::NAN]).is_nan());
        assert!(sqnr_db(&[0.0, 1.0], &[0.0, f64::NAN]).is_nan());
    }
}

//! Test and benchmark inputs: reproducible pseudo-random values from a
//! counter hash (never all zero), shared by the conformance cases and the
//! benchmarks.

use half::bf16;

/// Uniform values in `[-scale, scale)` from a counter hash (fast, reproducible, never all zero).
pub fn random_bf16(n: usize, seed: u64, scale: f32) -> Vec<bf16> {
    random_f32(n, seed, scale)
        .into_iter()
        .map(bf16::from_f32)
        .collect()
}

/// Uniform f32 values in `[-scale, scale)` from a counter hash.
pub fn random_f32(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let u = octet_fp8::format::sr_bits(seed, i as u64) as f32 / 4_294_967_296.0;
            (2.0 * u - 1.0) * scale
        })
        .collect()
}

/// Log-uniform magnitudes over `2^-30 .. 2^6` with random signs, about 3% exact
/// zeros: exercises FP8 subnormals, underflow to zero and both signs.
pub fn random_wide_f32(n: usize, seed: u64) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let r = octet_fp8::format::sr_bits(seed, i as u64);
            if r.is_multiple_of(32) {
                return 0.0;
            }
            let e = (r >> 8) as f32 / 16_777_216.0 * 36.0 - 30.0;
            let v = e.exp2();
            if r & 1 == 1 {
                -v
            } else {
                v
            }
        })
        .collect()
}

/// The bits of bf16 values, as the device buffers hold them.
pub fn bf16_bits(v: &[bf16]) -> Vec<u16> {
    v.iter().map(|x| x.to_bits()).collect()
}

//! Tolerances and the comparisons every case uses: relative Frobenius errors,
//! bf16 output bounds, byte differences.

/// `||got - want|| / ||want||` in f64; infinite if `got` has a NaN/inf (an unwritten, poisoned element).
pub fn rel_frobenius(got: &[f32], want: &[f32]) -> f64 {
    if got.len() != want.len() || got.iter().any(|v| !v.is_finite()) {
        return f64::INFINITY;
    }
    let (mut e, mut s) = (0f64, 0f64);
    for (&g, &w) in got.iter().zip(want) {
        e += (g as f64 - w as f64).powi(2);
        s += (w as f64).powi(2);
    }
    (e / s.max(f64::MIN_POSITIVE)).sqrt()
}

/// Mismatching bytes: count and the first index, as text (`"0 of N"` when equal).
pub(super) fn byte_diff(got: &[u8], want: &[u8]) -> (usize, String) {
    if got.len() != want.len() {
        return (
            usize::MAX,
            format!("length {} vs {}", got.len(), want.len()),
        );
    }
    let bad = got.iter().zip(want).filter(|(a, b)| a != b).count();
    let first = got.iter().zip(want).position(|(a, b)| a != b);
    let text = match first {
        None => format!("0 of {} differ", got.len()),
        Some(i) => format!(
            "{bad} of {} differ, first at {i}: gpu {:#04x} cpu {:#04x}",
            got.len(),
            got[i],
            want[i]
        ),
    };
    (bad, text)
}

pub(super) fn f32_bits_equal(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// Elements of a bf16 output outside `2^-8 |w| + atol` of the f32 reference `w`
/// (a correct bf16 rounding is within `2^-9 |w|`; `atol` covers the
/// accumulation error, which does not shrink with `|w|` where a sum cancels).
/// Returns the count and the worst ratio of error to bound.
pub(super) fn bf16_outside(got: &[f32], want: &[f32], atol: f64) -> (usize, f64) {
    let mut bad = 0;
    let mut worst = 0f64;
    for (&g, &w) in got.iter().zip(want) {
        let bound = (w as f64).abs() / 256.0 + atol;
        tally(
            ((g as f64) - (w as f64)).abs() / bound,
            &mut bad,
            &mut worst,
        );
    }
    (bad, worst)
}

/// One element's ratio of error to bound: counted as outside when above 1
/// or NaN, and the worst ratio kept (NaN as infinity).
pub(super) fn tally(r: f64, bad: &mut usize, worst: &mut f64) {
    if r.is_nan() || r > 1.0 {
        *bad += 1;
    }
    *worst = worst.max(if r.is_nan() { f64::INFINITY } else { r });
}

pub(super) fn rms(v: &[f32]) -> f64 {
    (v.iter().map(|&x| (x as f64).powi(2)).sum::<f64>() / v.len().max(1) as f64).sqrt()
}

// FP8 GEMM tolerances, f32 output against the CPU's f32 accumulation of the same
// exact FP8 products (`octet_tensor::cpu::fp8_gemm`). If the GPU accumulated in
// f32 the error would be order noise, ~1e-6. Measured on an H100 (cuBLASLt 13,
// 2026-11-22): 0.88e-4 to 1.09e-4 without fast accumulation at every k from 256
// to 8192 (Hopper's FP8 tensor cores keep partial sums in reduced precision
// before cuBLASLt promotes them to f32, so the error is per chunk, not per k),
// and 1.4e-4 (k=256) to 9.6e-4 (k=4096) with fast accumulation, which never
// promotes and so grows with k. Bounds: twice the worst measured value.
pub(super) const FP8_TOL: f64 = 2e-4;
pub(super) const FP8_FAST_TOL: f64 = 2e-3;
// A bf16 output adds its rounding (relative 2^-9 per element, ~1.7e-3 Frobenius).
pub(super) const BF16_OUT_TOL: f64 = 4e-3;

// bf16 GEMMs with f32 output against the CPU's f32 accumulation: order noise.
pub(super) const BF16_F32_TOL: f64 = 1e-5;
// LoRA gradients through bf16 operands (`u`, `du` and the dequantized base
// rounded once to bf16, against the CPU layer's f32): a few bf16 roundings.
pub(super) const GRAD_TOL: f64 = 1e-2;

/// How many tensors of two lists (in the same order) differ in any bit.
pub(crate) fn differing(
    a: &[(String, octet_tensor::Tensor)],
    b: &[(String, octet_tensor::Tensor)],
) -> usize {
    let bits = |t: &octet_tensor::Tensor| -> Vec<u32> {
        t.to_f32_vec().iter().map(|v| v.to_bits()).collect()
    };
    a.iter()
        .zip(b)
        .filter(|((_, x), (_, y))| bits(x) != bits(y))
        .count()
}

pub(crate) fn rel_frobenius_f64(got: &[f32], want: &[f64]) -> f64 {
    let num: f64 = got
        .iter()
        .zip(want)
        .map(|(&a, &b)| (a as f64 - b) * (a as f64 - b))
        .sum();
    let den: f64 = want.iter().map(|b| b * b).sum();
    if got.len() != want.len() || got.iter().any(|v| !v.is_finite()) {
        return f64::INFINITY;
    }
    (num / den.max(1e-300)).sqrt()
}

/// Signal-to-noise ratio of `got` against `want`, in dB.
pub(super) fn logits_sqnr(got: &[f32], want: &[f32]) -> f64 {
    let err: f64 = got
        .iter()
        .zip(want)
        .map(|(&a, &b)| (a as f64 - b as f64).powi(2))
        .sum();
    let sig: f64 = want.iter().map(|&b| (b as f64).powi(2)).sum();
    if got.len() != want.len() {
        return f64::NEG_INFINITY;
    }
    10.0 * (sig / err.max(f64::MIN_POSITIVE)).log10()
}

//! Weight-only FP8 products against the f64 product of the dequantized weight.

use half::bf16;
use octet_fp8::Format;
use octet_tensor::mixed::{
    error_bound, matmul_weights, mixed_matmul, mixed_matmul_t, Fp8Weight, WeightRef, WeightScaling,
};
use octet_tensor::Tensor;
use rand::{Rng, SeedableRng};
use rand_distr::StandardNormal;

fn gaussian(n: usize, seed: u64, std: f32) -> Vec<f32> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..n)
        .map(|_| rng.sample::<f32, _>(StandardNormal) * std)
        .collect()
}

/// Check `y` against the f64 product of `x` and the dequantized `w` (both `(.., k)`),
/// element by element, with [`error_bound`].
fn check(y: &[f32], x: &[f32], w: &[f32], m: usize, n: usize, k: usize, label: &str) {
    let mut worst = 0f64;
    for i in 0..m {
        for j in 0..n {
            let (mut s, mut abs) = (0f64, 0f64);
            for p in 0..k {
                let t = x[i * k + p] as f64 * w[j * k + p] as f64;
                s += t;
                abs += t.abs();
            }
            let err = (y[i * n + j] as f64 - s).abs();
            let bound = error_bound(m, k, abs) + f64::MIN_POSITIVE;
            assert!(
                err <= bound,
                "{label}: ({i}, {j}) err {err:e} > bound {bound:e} (y {} want {s})",
                y[i * n + j]
            );
            worst = worst.max(err / bound);
        }
    }
    assert!(
        worst > 0.0,
        "{label}: every element exact: the test inputs are too easy"
    );
}

#[test]
fn mixed_products_match_the_f64_product_of_the_dequantized_weight() {
    // K and N not multiples of 8, 128 or the tile; M on both sides of the
    // streaming / tiled switch (16).
    let mut seed = 7;
    for &(k, n) in &[(200usize, 131usize), (300, 70), (256, 257)] {
        let w = gaussian(n * k, seed, 0.05);
        for format in [Format::E4M3, Format::E5M2] {
            for scaling in [
                WeightScaling::Tensor,
                WeightScaling::Channel,
                WeightScaling::Block128,
            ] {
                let q = Fp8Weight::quantize(&w, n, k, format, scaling).unwrap();
                let wd = q.dequantize();
                for m in [1usize, 3, 16, 17, 40] {
                    seed += 1;
                    let x = gaussian(m * k, seed, 1.0);
                    let label = format!("{format:?} {scaling:?} m={m} k={k} n={n}");
                    let y =
                        mixed_matmul(&Tensor::from_f32(&[m, k], x.clone()).unwrap(), &q).unwrap();
                    assert_eq!(y.shape(), [m, n]);
                    // The tiled path (M > 16) multiplies the factor into the panel
                    // and sums in the GEMM's order: error_bound takes M.
                    check(&y.to_f32_vec(), &x, &wd, m, n, k, &label);
                    // bf16 activations: the same product of the bf16-rounded x.
                    let xb: Vec<bf16> = x.iter().map(|&v| bf16::from_f32(v)).collect();
                    let xr: Vec<f32> = xb.iter().map(|v| v.to_f32()).collect();
                    let yb = mixed_matmul(&Tensor::from_bf16(&[m, k], xb).unwrap(), &q).unwrap();
                    check(
                        &yb.to_f32_vec(),
                        &xr,
                        &wd,
                        m,
                        n,
                        k,
                        &format!("{label} bf16 x"),
                    );
                }
            }
        }
    }
}

#[test]
fn the_bf16_and_f32_baselines_compute_the_same_product() {
    let (m, k, n) = (4, 136, 50);
    let w = gaussian(n * k, 3, 0.1);
    let x = gaussian(m * k, 4, 1.0);
    let xt = Tensor::from_f32(&[m, k], x.clone()).unwrap();
    let y = matmul_weights(&xt, &WeightRef::F32(&w, n, k)).unwrap();
    check(&y.to_f32_vec(), &x, &w, m, n, k, "f32 weights");
    let wb: Vec<bf16> = w.iter().map(|&v| bf16::from_f32(v)).collect();
    let wr: Vec<f32> = wb.iter().map(|v| v.to_f32()).collect();
    let y = matmul_weights(&xt, &WeightRef::Bf16(&wb, n, k)).unwrap();
    check(&y.to_f32_vec(), &x, &wr, m, n, k, "bf16 weights");
}

#[test]
fn bad_input_is_an_error() {
    let w = gaussian(16 * 32, 1, 1.0);
    let q = Fp8Weight::quantize(&w, 16, 32, Format::E4M3, WeightScaling::Tensor).unwrap();
    let x = Tensor::from_f32(&[2, 31], vec![1.0; 62]).unwrap();
    let e = mixed_matmul(&x, &q).unwrap_err().to_string();
    assert!(e.contains("31 features"), "{e}");
    assert!(Fp8Weight::quantize(&w, 16, 32, Format::E2M1, WeightScaling::Tensor).is_err());
    assert!(Fp8Weight::quantize(&w, 16, 31, Format::E4M3, WeightScaling::Tensor).is_err());
    // A NaN in the weight becomes a NaN code: refused when the weight is built.
    let mut bad = w.clone();
    bad[37] = f32::NAN;
    let e = Fp8Weight::quantize(&bad, 16, 32, Format::E4M3, WeightScaling::Channel)
        .unwrap_err()
        .to_string();
    assert!(e.contains("NaN"), "{e}");
    assert!(WeightScaling::from_name("columns").is_err());
    let empty = Tensor::from_f32(&[0, 32], vec![]).unwrap();
    assert!(mixed_matmul(&empty, &q).is_err());
    // A bf16 or f32 weight shorter than its dims: an error from either
    // product, not a slice index out of range.
    let short = [1f32; 3];
    let dy = Tensor::from_f32(&[1, 2], vec![1.0; 2]).unwrap();
    let e = octet_tensor::mixed::matmul_weights_t(&dy, &WeightRef::F32(&short, 2, 4))
        .unwrap_err()
        .to_string();
    assert!(e.contains("3 values"), "{e}");
    let x4 = Tensor::from_f32(&[1, 4], vec![1.0; 4]).unwrap();
    assert!(matmul_weights(&x4, &WeightRef::F32(&short, 2, 4)).is_err());
}

#[test]
fn bytes_are_the_codes_plus_scales() {
    let (n, k) = (300, 260);
    let w = gaussian(n * k, 9, 0.02);
    for (scaling, scales) in [
        (WeightScaling::Tensor, 1),
        (WeightScaling::Channel, n),
        (WeightScaling::Block128, 3 * 3),
    ] {
        let q = Fp8Weight::quantize(&w, n, k, Format::E4M3, scaling).unwrap();
        assert_eq!(q.bytes(), n * k + 4 * scales, "{scaling:?}");
    }
}

#[test]
fn the_transposed_product_is_the_input_gradient() {
    // dx = dy @ W against f64, with the (N + 2) u sum |dy w| bound; K and N off the tiles.
    let mut seed = 70;
    for &(m, n, k) in &[(1usize, 70usize, 200usize), (9, 131, 300), (20, 257, 129)] {
        let w = gaussian(n * k, seed, 0.05);
        for format in [Format::E4M3, Format::E5M2] {
            for scaling in [
                WeightScaling::Tensor,
                WeightScaling::Channel,
                WeightScaling::Block128,
            ] {
                seed += 1;
                let q = Fp8Weight::quantize(&w, n, k, format, scaling).unwrap();
                let wd = q.dequantize();
                let dy = gaussian(m * n, seed, 1e-2);
                let dx =
                    mixed_matmul_t(&Tensor::from_f32(&[m, n], dy.clone()).unwrap(), &q).unwrap();
                assert_eq!(dx.shape(), [m, k]);
                let dx = dx.to_f32_vec();
                for i in 0..m {
                    for c in 0..k {
                        let (mut s, mut abs) = (0f64, 0f64);
                        for j in 0..n {
                            let t = dy[i * n + j] as f64 * wd[j * k + c] as f64;
                            s += t;
                            abs += t.abs();
                        }
                        let bound = (n + 2) as f64 * 2f64.powi(-24) * abs + f64::MIN_POSITIVE;
                        let err = (dx[i * k + c] as f64 - s).abs();
                        assert!(
                            err <= bound,
                            "{format:?} {scaling:?} ({i}, {c}): {err:e} > {bound:e}"
                        );
                    }
                }
            }
        }
    }
    let q = Fp8Weight::quantize(
        &gaussian(16 * 32, 1, 1.0),
        16,
        32,
        Format::E4M3,
        WeightScaling::Tensor,
    )
    .unwrap();
    assert!(mixed_matmul_t(&Tensor::from_f32(&[2, 15], vec![1.0; 30]).unwrap(), &q).is_err());
}

/// A weight without rows or columns is refused when it is built, as
/// `quantize` refuses one (it used to give an all-zero or empty product).
#[test]
fn empty_weights_are_refused() {
    use octet_fp8::{QuantData, Scales};
    for (n, k, block) in [
        (0, 4, (1, 1)),
        (3, 0, (3, 1)),
        (3, 0, (1, 1)),
        (0, 0, (1, 1)),
    ] {
        let factors = if block == (1, 1) && n != 0 {
            vec![1.0; n]
        } else {
            vec![1.0]
        };
        let e = Fp8Weight::from_quant_data(QuantData {
            rows: n,
            cols: k,
            format: Format::E4M3,
            data: vec![],
            block,
            scales: Scales::F32(factors),
            saturated: 0,
            underflowed: 0,
        })
        .unwrap_err()
        .to_string();
        assert!(e.contains(&format!("({n}, {k}) is empty")), "{e}");
    }
}

/// Factors that are no scale (zero, negative, NaN, infinite) or that
/// overflow f32 on the format's largest code are refused when the weight is
/// built, for every scale kind: a factor of 1e37 on E4M3 codes used to give
/// an infinite product where the dequantized weight's is finite.
#[test]
fn bad_factors_are_refused() {
    use octet_fp8::{QuantData, Scales};
    let (n, k) = (3, 130);
    let weight = |format: Format, block: (usize, usize), factors: Vec<f32>| {
        Fp8Weight::from_quant_data(QuantData {
            rows: n,
            cols: k,
            format,
            // 0x38: 1.0 in E4M3, 0.5 in E5M2.
            data: vec![0x38; n * k],
            block,
            scales: Scales::F32(factors),
            saturated: 0,
            underflowed: 0,
        })
    };
    for format in [Format::E4M3, Format::E5M2] {
        for (block, count) in [((n, k), 1), ((1, k), n), ((128, 128), 2)] {
            let ok = weight(format, block, vec![0.5; count]).unwrap();
            let x = Tensor::from_f32(&[1, k], vec![1.0; k]).unwrap();
            assert!(mixed_matmul(&x, &ok).unwrap().to_f32_vec()[0].is_finite());
            for bad in [
                0.0,
                -0.0,
                -1.0,
                f32::NAN,
                f32::INFINITY,
                -f32::INFINITY,
                1e37,
            ] {
                let mut factors = vec![0.5; count];
                factors[count - 1] = bad;
                let e = weight(format, block, factors).unwrap_err().to_string();
                assert!(
                    e.contains(&format!("factor {} is", count - 1)),
                    "{format:?} {block:?} {bad}: {e}"
                );
            }
        }
    }
}

/// E5M2's infinite codes are refused when the weight is built, as NaN codes
/// are: `mixed_matmul_t` skips zero gradients, so a zero gradient against an
/// infinite weight gave 1.0 where the dequantized product is 0 * inf = NaN.
#[test]
fn infinite_codes_are_refused() {
    use octet_fp8::{QuantData, Scales};
    for inf in [0x7cu8, 0xfc] {
        let mut data = vec![0x3cu8; 2 * 4];
        data[5] = inf;
        let e = Fp8Weight::from_quant_data(QuantData {
            rows: 2,
            cols: 4,
            format: Format::E5M2,
            data,
            block: (2, 4),
            scales: Scales::F32(vec![1.0]),
            saturated: 0,
            underflowed: 0,
        })
        .unwrap_err()
        .to_string();
        assert!(e.contains("(1, 1) is infinite"), "{inf:#x}: {e}");
    }
}

/// Large activations whose product with the dequantized weight is finite
/// give that product on both kernels. The streaming kernel (M <= 16) sums
/// `x` times the codes' values before the factor; a code's value is
/// `1 / factor` times the weight's (57344 for an E5M2 weight of 1.0, 1.75
/// times for E4M3 as decoded), so that sum overflowed to inf where the
/// dequantized product, and the tiled kernel's, is finite.
#[test]
fn large_inputs_do_not_overflow_before_the_factor() {
    for (format, x, k) in [(Format::E5M2, 1e34f32, 4usize), (Format::E4M3, 2.5e38, 1)] {
        for scaling in [
            WeightScaling::Tensor,
            WeightScaling::Channel,
            WeightScaling::Block128,
        ] {
            let w = vec![1.0f32; 3 * k];
            let q = Fp8Weight::quantize(&w, 3, k, format, scaling).unwrap();
            assert_eq!(q.dequantize(), w);
            for m in [1usize, 5, 17] {
                let xt = Tensor::from_f32(&[m, k], vec![x; m * k]).unwrap();
                let y = mixed_matmul(&xt, &q).unwrap().to_f32_vec();
                let want = (x as f64 * k as f64) as f32;
                assert!(want.is_finite());
                for (i, &v) in y.iter().enumerate() {
                    let err = (v as f64 - want as f64).abs();
                    assert!(
                        err <= error_bound(m, k, want as f64),
                        "{format:?} {scaling:?} m={m} [{i}]: {v:e}, want {want:e}"
                    );
                }
            }
        }
    }
    // A product that overflows f32 (and NaN from inf * 0) still shows.
    let q = Fp8Weight::quantize(&[1.0, 0.0], 1, 2, Format::E5M2, WeightScaling::Tensor).unwrap();
    let y = |x: Vec<f32>| mixed_matmul(&Tensor::from_f32(&[1, 2], x).unwrap(), &q).unwrap();
    let q1 = Fp8Weight::quantize(&[1.0, 1.0], 1, 2, Format::E5M2, WeightScaling::Tensor).unwrap();
    let x = Tensor::from_f32(&[1, 2], vec![3e38, 3e38]).unwrap();
    assert_eq!(mixed_matmul(&x, &q1).unwrap().to_f32_vec(), [f32::INFINITY]);
    assert_eq!(y(vec![f32::INFINITY, 1.0]).to_f32_vec(), [f32::INFINITY]);
    assert!(y(vec![1.0, f32::INFINITY]).to_f32_vec()[0].is_nan());
    assert!(y(vec![f32::NAN, 1.0]).to_f32_vec()[0].is_nan());
}

/// The transposed product (`dx = dy @ W`) against the f64 product of the
/// dequantized weight when `dy * factor` leaves the normal f32 range but the
/// products `dy * w` do not: it multiplies `dy` by the factor first (by
/// `256 * factor` for E4M3 as decoded), which overflowed to inf (and gave
/// NaN on zero codes) or lost bits in a subnormal.
#[test]
fn the_transposed_product_keeps_large_gradients() {
    for format in [Format::E4M3, Format::E5M2] {
        for scaling in [
            WeightScaling::Tensor,
            WeightScaling::Channel,
            WeightScaling::Block128,
        ] {
            // Large: weight amax 2 * max, so factor 2 (512 for E4M3 as decoded).
            let big = 2.0 * format.max();
            let w = [big, 1.0, 0.0];
            let q = Fp8Weight::quantize(&w, 1, 3, format, scaling).unwrap();
            assert_eq!(q.dequantize(), w);
            let dy = Tensor::from_f32(&[1, 1], vec![1e36]).unwrap();
            let dx = mixed_matmul_t(&dy, &q).unwrap().to_f32_vec();
            assert_eq!(dx[0], f32::INFINITY, "{format:?} {scaling:?}");
            assert_eq!(dx[1..], [1e36, 0.0], "{format:?} {scaling:?} large: {dx:?}");
        }
    }
}

/// E5M2 codes reach 57344, so a normal `dy * w` can come from a subnormal
/// `dy * factor` (E4M3 codes as decoded stay below 2: that output is subnormal anyway).
#[test]
fn the_transposed_product_keeps_tiny_gradients() {
    let format = Format::E5M2;
    for scaling in [
        WeightScaling::Tensor,
        WeightScaling::Channel,
        WeightScaling::Block128,
    ] {
        // Weight amax 57344 * 2^-100: factor 2^-100, so dy * factor is an f32 subnormal.
        let small = format.max() * 2f32.powi(-100);
        let w = [small, small / 3.0];
        let q = Fp8Weight::quantize(&w, 1, 2, format, scaling).unwrap();
        let wd = q.dequantize();
        let g = 1.234_567_9 * 2f32.powi(-35);
        let dy = Tensor::from_f32(&[1, 1], vec![g]).unwrap();
        let dx = mixed_matmul_t(&dy, &q).unwrap().to_f32_vec();
        for c in 0..2 {
            let want = g as f64 * wd[c] as f64;
            assert!(want >= f32::MIN_POSITIVE as f64);
            let err = (dx[c] as f64 - want).abs();
            assert!(
                err <= 3.0 * 2f64.powi(-24) * want.abs(),
                "{scaling:?} [{c}]: {:e} want {want:e}",
                dx[c]
            );
        }
    }
}

/// Tiny activations whose product with the dequantized weight is a normal
/// f32: the kernels sum `x` times the codes' values before the factor (for
/// E4M3, `value * 2^-8` as decoded), and that sum was a subnormal with a
/// few bits where the factor brings the answer back into the normal range.
#[test]
fn tiny_inputs_keep_their_bits_before_the_factor() {
    for scaling in [
        WeightScaling::Tensor,
        WeightScaling::Channel,
        WeightScaling::Block128,
    ] {
        // Factor 2 (per tensor; the other rows' factors are 2 too): row 1
        // holds 1.0 as the code 0.5, decoded as 2^-9.
        let w = [896.0f32, 1.0, 896.0, 896.0];
        let q = Fp8Weight::quantize(&w, 4, 1, Format::E4M3, scaling).unwrap();
        assert_eq!(q.dequantize(), w);
        let x = 1.234_567_9e-37f32;
        for m in [1usize, 17] {
            let y = mixed_matmul(&Tensor::from_f32(&[m, 1], vec![x; m]).unwrap(), &q)
                .unwrap()
                .to_f32_vec();
            for i in 0..m {
                for j in 0..4 {
                    let want = x as f64 * w[j] as f64;
                    let v = y[i * 4 + j];
                    assert!(
                        (v as f64 - want).abs() <= error_bound(m, 1, want),
                        "{scaling:?} m={m} ({i}, {j}): {v:e} want {want:e}"
                    );
                }
            }
        }
    }
}

/// An output whose f64 product is finite but whose f32 partial sums pass
/// f32's range in some order: the streaming kernel (M <= 16) sums it again
/// in f64, and the tiled kernel (M > 16) must too, or the same row of `x`
/// gives inf or the f64 product depending on how many rows come with it.
#[test]
fn outputs_whose_partial_sums_overflow_are_summed_again_on_both_kernels() {
    let (n, k) = (5, 3);
    let q = Fp8Weight::quantize(
        &vec![1.0f32; n * k],
        n,
        k,
        Format::E4M3,
        WeightScaling::Tensor,
    )
    .unwrap();
    assert_eq!(q.dequantize(), vec![1.0; n * k]);
    // Every order of two large positive terms and one negative: the f64 sum is 3e38.
    for row in [
        [3e38f32, 3e38, -3e38],
        [3e38, -3e38, 3e38],
        [-3e38, 3e38, 3e38],
    ] {
        for m in [1usize, 16, 17, 40] {
            let x: Vec<f32> = (0..m).flat_map(|_| row).collect();
            let y = mixed_matmul(&Tensor::from_f32(&[m, k], x).unwrap(), &q)
                .unwrap()
                .to_f32_vec();
            let want = 3e38f64;
            for (i, &v) in y.iter().enumerate() {
                assert!(
                    (v as f64 - want).abs() <= error_bound(m, k, 9e38),
                    "{row:?} m={m} [{i}]: {v:e}, want {want:e}"
                );
            }
        }
    }
}

/// Tiny activations whose products with the codes' values underflow to
/// zero before the factor, where the factor brings the answer back into the
/// normal range: the streaming kernel (M <= 16) returned 0 for a normal
/// product (the tiled kernel multiplies the factor in first).
#[test]
fn tiny_inputs_whose_sum_underflows_before_the_factor_keep_the_product() {
    for format in [Format::E4M3, Format::E5M2] {
        // The smallest subnormal code under the factor 2^100.
        let q = Fp8Weight::from_quant_data(octet_fp8::QuantData {
            rows: 2,
            cols: 3,
            format,
            data: vec![0x01; 6],
            block: (2, 3),
            scales: octet_fp8::Scales::F32(vec![2f32.powi(100)]),
            saturated: 0,
            underflowed: 0,
        })
        .unwrap();
        let wd = q.dequantize();
        let x = 2f32.powi(-140);
        for m in [1usize, 5, 16, 17] {
            let y = mixed_matmul(&Tensor::from_f32(&[m, 3], vec![x; m * 3]).unwrap(), &q)
                .unwrap()
                .to_f32_vec();
            let want = 3.0 * x as f64 * wd[0] as f64;
            assert!(want >= f32::MIN_POSITIVE as f64);
            for (i, &v) in y.iter().enumerate() {
                assert!(
                    (v as f64 - want).abs() <= error_bound(m, 3, want),
                    "{format:?} m={m} [{i}]: {v:e}, want {want:e}"
                );
            }
        }
    }
    // A row of zeros still gives zeros.
    let q = Fp8Weight::quantize(
        &[1.0, -2.0, 0.5, 3.0],
        2,
        2,
        Format::E4M3,
        WeightScaling::Tensor,
    )
    .unwrap();
    let y = mixed_matmul(
        &Tensor::from_f32(&[2, 2], vec![0.0, 0.0, 1.0, 1.0]).unwrap(),
        &q,
    )
    .unwrap()
    .to_f32_vec();
    assert_eq!(y[..2], [0.0, 0.0]);
}

/// Weights whose dequantized values are f32 subnormals (a factor below
/// `2^-126 / min_subnormal`): the streaming kernel multiplies the factor in
/// after the sum and keeps the product's bits; the tiled kernel multiplied
/// it into each weight first, rounding `code * factor` to a subnormal (3.7%
/// off here), so one row of `x` gave two answers depending on M.
#[test]
fn subnormal_dequantized_weights_keep_their_bits_on_both_kernels() {
    for (format, code) in [(Format::E4M3, 0x39u8), (Format::E5M2, 0x3Du8)] {
        let factor = 3.0 * 2f32.powi(-148);
        for (block, scales, k) in [
            ((4, 5), vec![factor], 5usize),
            ((1, 5), vec![factor; 4], 5),
            ((128, 128), vec![factor, 1.0], 130),
        ] {
            let q = Fp8Weight::from_quant_data(octet_fp8::QuantData {
                rows: 4,
                cols: k,
                format,
                data: vec![code; 4 * k],
                block,
                scales: octet_fp8::Scales::F32(scales.clone()),
                saturated: 0,
                underflowed: 0,
            })
            .unwrap();
            let x = 2f32.powi(120);
            // The f64 product of the exact dequantized weight (code value times factor).
            let want: f64 = (0..k)
                .map(|c| {
                    let f = if block == (128, 128) {
                        scales[c / 128]
                    } else {
                        factor
                    };
                    x as f64 * format.decode(code) as f64 * f as f64
                })
                .sum();
            let abs = want.abs();
            for m in [1usize, 17] {
                let y = mixed_matmul(&Tensor::from_f32(&[m, k], vec![x; m * k]).unwrap(), &q)
                    .unwrap()
                    .to_f32_vec();
                for (i, &v) in y.iter().enumerate() {
                    assert!(
                        (v as f64 - want).abs() <= error_bound(m, k, abs),
                        "{format:?} {block:?} m={m} [{i}]: {v:e}, want {want:e}"
                    );
                }
            }
        }
    }
}

/// [`error_bound`] on sums whose roundings all go one way: 1 followed by
/// terms of 0.75 ulp(1), each of which a running f32 sum rounds up to a
/// whole ulp. The streaming kernel spreads the terms over 32 lanes; the
/// tiled kernel (M > 16) sums in the GEMM's order, sequentially over K.
#[test]
fn the_error_bound_holds_for_roundings_that_all_go_one_way() {
    let t = 1.5 * 2f32.powi(-24);
    for k in [64usize, 128, 300, 1024] {
        let q = Fp8Weight::quantize(
            &vec![1.0f32; 3 * k],
            3,
            k,
            Format::E4M3,
            WeightScaling::Tensor,
        )
        .unwrap();
        assert_eq!(q.dequantize(), vec![1.0; 3 * k]);
        for m in [1usize, 16, 17, 40] {
            let mut x = vec![t; m * k];
            for i in 0..m {
                x[i * k] = 1.0;
            }
            let y = mixed_matmul(&Tensor::from_f32(&[m, k], x).unwrap(), &q)
                .unwrap()
                .to_f32_vec();
            let want = 1.0 + (k - 1) as f64 * t as f64;
            for (i, &v) in y.iter().enumerate() {
                let err = (v as f64 - want).abs();
                let bound = error_bound(m, k, want);
                assert!(
                    err <= bound,
                    "k={k} m={m} [{i}]: err {:.1} u > bound {:.1}",
                    err / 2f64.powi(-24),
                    bound / 2f64.powi(-24)
                );
            }
        }
    }
}

/// An empty weight given to `Fp8Weight::quantize` is refused as empty, as
/// `from_quant_data` refuses it (it said '0 values is not (0, 4)', which
/// they are).
#[test]
fn quantizing_an_empty_weight_says_it_is_empty() {
    for (n, k) in [(0usize, 4usize), (3, 0), (0, 0)] {
        let e = Fp8Weight::quantize(&[], n, k, Format::E4M3, WeightScaling::Tensor)
            .unwrap_err()
            .to_string();
        assert!(e.contains(&format!("({n}, {k}) is empty")), "{e}");
    }
    let e = Fp8Weight::quantize(&[1.0; 5], 2, 3, Format::E4M3, WeightScaling::Tensor)
        .unwrap_err()
        .to_string();
    assert!(e.contains("5 values is not (2, 3)"), "{e}");
}

/// One product just above f32's normal range and K - 1 products that are f32
/// subnormals in the streaming kernel's domain (the codes' values before the
/// factor), each `0.75 * 2^-149`, which rounds up to `2^-149`: the sum is
/// normal, but a quarter of a subnormal step on every term is far more than
/// `2^-24` of the sum, and a factor (here `2^100`, or 1 where block scales
/// multiply each block) carries it into the output. Both kernels must stay
/// within [`error_bound`].
#[test]
fn tiny_inputs_whose_products_round_as_subnormals_keep_the_bound() {
    let k: usize = 1025;
    for (format, big) in [(Format::E4M3, 0x7Eu8), (Format::E5M2, 0x7B)] {
        // E4M3 codes are decoded as `value * 2^-8` (see the module docs).
        let domain = if format == Format::E4M3 {
            2f64.powi(-8)
        } else {
            1.0
        };
        let small = format.decode(0x01) as f64 * domain;
        let large = format.decode(big) as f64 * domain;
        let mut x = vec![(1.5 * 2f64.powi(-126) / large) as f32];
        x.extend((1..k).map(|_| (0.75 * 2f64.powi(-149) / small) as f32));
        for (block, scales) in [
            ((2, k), vec![2f32.powi(100)]),
            ((1, k), vec![2f32.powi(100), 2f32.powi(90)]),
            ((128, 128), vec![2f32.powi(40); k.div_ceil(128)]),
        ] {
            let mut data = vec![0x01u8; 2 * k];
            data[0] = big;
            data[k] = big | 0x80;
            let q = Fp8Weight::from_quant_data(octet_fp8::QuantData {
                rows: 2,
                cols: k,
                format,
                data,
                block,
                scales: octet_fp8::Scales::F32(scales),
                saturated: 0,
                underflowed: 0,
            })
            .unwrap();
            let wd = q.dequantize();
            for m in [1usize, 4, 16, 17] {
                let xs: Vec<f32> = (0..m).flat_map(|_| x.iter().copied()).collect();
                let y = mixed_matmul(&Tensor::from_f32(&[m, k], xs.clone()).unwrap(), &q)
                    .unwrap()
                    .to_f32_vec();
                for i in 0..m {
                    for j in 0..2 {
                        let (mut want, mut abs) = (0f64, 0f64);
                        for c in 0..k {
                            let t = x[c] as f64 * wd[j * k + c] as f64;
                            want += t;
                            abs += t.abs();
                        }
                        assert!(want.abs() >= f32::MIN_POSITIVE as f64);
                        let v = y[i * 2 + j] as f64;
                        assert!(
                            (v - want).abs() <= error_bound(m, k, abs),
                            "{format:?} {block:?} m={m} ({i}, {j}): {v:e} want {want:e} \
                             (off by {:.2} bounds)",
                            (v - want).abs() / error_bound(m, k, abs)
                        );
                    }
                }
            }
        }
    }
}

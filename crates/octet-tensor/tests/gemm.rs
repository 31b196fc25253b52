//! The CPU GEMMs against f64 references with error bounds from f32 accumulation.

use octet_fp8::{quantize, Layout, Recipe, Role, Usage};
use octet_tensor::cpu::{fp8_gemm, gemm, matmul, sgemm};
use octet_tensor::{DType, Tensor};
use rand::{Rng, SeedableRng};
use rand_distr::StandardNormal;

fn gaussian(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..n).map(|_| rng.sample(StandardNormal)).collect()
}

/// `c (m, n) = a (m, k) @ b (n, k)^T` in f64, and `sum_k |a||b|` per element.
fn reference(a: &[f64], b: &[f64], m: usize, n: usize, k: usize) -> (Vec<f64>, Vec<f64>) {
    let (mut c, mut abs) = (vec![0.0; m * n], vec![0.0; m * n]);
    for i in 0..m {
        for j in 0..n {
            for p in 0..k {
                c[i * n + j] += a[i * k + p] * b[j * k + p];
                abs[i * n + j] += (a[i * k + p] * b[j * k + p]).abs();
            }
        }
    }
    (c, abs)
}

#[test]
fn sgemm_every_transposition_within_the_accumulation_bound() {
    // Recursive summation of K products in f32: |error| <= gamma_K * sum |a||b|,
    // gamma_K = K u / (1 - K u), u = 2^-24 (Higham, Accuracy and Stability, 3.1).
    let (m, n, k) = (37, 29, 301);
    let a = gaussian(m * k, 1);
    let b = gaussian(n * k, 2);
    let a64: Vec<f64> = a.iter().map(|&v| v as f64).collect();
    let b64: Vec<f64> = b.iter().map(|&v| v as f64).collect();
    let (want, abs) = reference(&a64, &b64, m, n, k);
    let u = 2f64.powi(-24);
    let gamma = k as f64 * u / (1.0 - k as f64 * u);
    let at = octet_fp8::quant::transpose(&a, m, k); // (k, m)
    let bt = octet_fp8::quant::transpose(&b, n, k); // (k, n)
    let cases = [
        (&a, false, &b, true),
        (&at, true, &b, true),
        (&a, false, &bt, false),
        (&at, true, &bt, false),
    ];
    for (ai, ta, bi, tb) in cases {
        let c = sgemm(m, n, k, ai, ta, bi, tb);
        for i in 0..m * n {
            assert!(
                ((c[i] as f64) - want[i]).abs() <= gamma * abs[i],
                "ta={ta} tb={tb} [{i}]"
            );
        }
    }
    // f64 GEMM: the same bound with u = 2^-53.
    let c64 = gemm(m, n, k, &a64, false, &b64, true);
    for i in 0..m * n {
        assert!(
            (c64[i] - want[i]).abs() <= 1e-13 * abs[i].max(1.0),
            "f64 [{i}]"
        );
    }
}

#[test]
fn fp8_gemm_equals_the_product_of_what_the_codes_represent() {
    // The emulation sums exact FP8 products in f32 per block stretch, scales
    // each partial sum (two roundings) and adds it to the accumulator (one):
    // against f64 over the dequantized operands the error is at most
    // (K + 3 S) u sum |a_dq||b_dq| for S stretches; S <= ceil(K / 16) for every
    // recipe (the smallest block is NVFP4's 16).
    let (m, n, k) = (33, 45, 280);
    let a = gaussian(m * k, 3);
    let b = gaussian(n * k, 4);
    for name in Recipe::NAMES {
        let r = Recipe::from_name(name).unwrap();
        let ds = (name == "delayed").then_some(60.0);
        let qa = {
            let s = r.spec(Role::Input, Layout::Rowwise, ds, 0).unwrap();
            quantize(&a, m, k, &s, &s, Usage::ROW, None).unwrap()
        };
        let qb = {
            let s = r.spec(Role::Weight, Layout::Rowwise, ds, 0).unwrap();
            quantize(&b, n, k, &s, &s, Usage::ROW, None).unwrap()
        };
        let c = fp8_gemm(
            qa.get(Layout::Rowwise).unwrap(),
            qb.get(Layout::Rowwise).unwrap(),
        )
        .unwrap();
        let da: Vec<f64> = qa.dequantize().unwrap().iter().map(|&v| v as f64).collect();
        let db: Vec<f64> = qb.dequantize().unwrap().iter().map(|&v| v as f64).collect();
        let (want, abs) = reference(&da, &db, m, n, k);
        let bound = (k + 3 * k.div_ceil(16)) as f64 * 2f64.powi(-24);
        for i in 0..m * n {
            assert!(
                ((c[i] as f64) - want[i]).abs() <= bound * abs[i] + 1e-30,
                "{name} [{i}]: {} vs {}",
                c[i],
                want[i]
            );
        }
    }
}

/// Operands with amaxes near `2^-68`: each scale factor is about `2^-77`,
/// and their product (about `2^-154`) is below f32's smallest subnormal,
/// while the product of the operands (`K` terms near `2^-137`) is a normal
/// f32. Multiplying the two factors together first gave 0 for every recipe.
#[test]
fn fp8_gemm_keeps_products_whose_factors_multiply_below_f32() {
    let (m, n, k) = (3, 4, 4096);
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let tiny = 2f32.powi(-68);
    let mut uniform = |len: usize| -> Vec<f32> {
        (0..len)
            .map(|_| rng.random_range(0.5f32..1.0) * tiny)
            .collect()
    };
    let (a, b) = (uniform(m * k), uniform(n * k));
    for name in Recipe::NAMES {
        let r = Recipe::from_name(name).unwrap();
        let ds = (name == "delayed").then_some(2f32.powi(76));
        let quant = |x: &[f32], rows: usize, role: Role| {
            let s = r.spec(role, Layout::Rowwise, ds, 0).unwrap();
            quantize(x, rows, k, &s, &s, Usage::ROW, None).unwrap()
        };
        let (qa, qb) = (quant(&a, m, Role::Input), quant(&b, n, Role::Weight));
        let c = fp8_gemm(
            qa.get(Layout::Rowwise).unwrap(),
            qb.get(Layout::Rowwise).unwrap(),
        )
        .unwrap();
        let da: Vec<f64> = qa.dequantize().unwrap().iter().map(|&v| v as f64).collect();
        let db: Vec<f64> = qb.dequantize().unwrap().iter().map(|&v| v as f64).collect();
        let (want, abs) = reference(&da, &db, m, n, k);
        // As in the test above; each stretch's scaled sum may be an f32
        // subnormal, off by up to 2^-150 more.
        let bound = (k + 3 * k.div_ceil(16)) as f64 * 2f64.powi(-24);
        for i in 0..m * n {
            assert!(
                want[i] >= f32::MIN_POSITIVE as f64,
                "{name}: too small a test"
            );
            let slack = k.div_ceil(16) as f64 * 2f64.powi(-150);
            assert!(
                ((c[i] as f64) - want[i]).abs() <= bound * abs[i] + slack,
                "{name} [{i}]: {:e} vs {:e}",
                c[i],
                want[i]
            );
        }
    }
}

#[test]
fn shape_errors_are_values() {
    let a = Tensor::from_f32(&[3, 4], gaussian(12, 5)).unwrap();
    let b = Tensor::from_f32(&[5, 3], gaussian(15, 6)).unwrap();
    assert!(matmul(&a, false, &b, true, DType::F32).is_err());
    assert!(matmul(&a, true, &b, true, DType::F32).is_ok());
    let r = Recipe::from_name("tensorwise").unwrap();
    let s = r.spec(Role::Input, Layout::Rowwise, None, 0).unwrap();
    let qa = quantize(&gaussian(12, 7), 3, 4, &s, &s, Usage::ROW, None).unwrap();
    let qb = quantize(&gaussian(15, 8), 5, 3, &s, &s, Usage::ROW, None).unwrap();
    assert!(fp8_gemm(
        qa.get(Layout::Rowwise).unwrap(),
        qb.get(Layout::Rowwise).unwrap()
    )
    .is_err());
}

/// Operands whose codes or scales do not fill their shape and block grid
/// (`QuantData`'s fields are public) are errors, not an index or a division
/// by zero panicking inside the emulation.
#[test]
fn fp8_gemm_refuses_operands_that_do_not_fill_their_blocks() {
    use octet_fp8::{Format, QuantData, Scales};
    let op = |rows, cols, data: usize, block, scales: usize| QuantData {
        rows,
        cols,
        format: Format::E4M3,
        data: vec![0x38; data],
        block,
        scales: Scales::F32(vec![1.0; scales]),
        saturated: 0,
        underflowed: 0,
    };
    let good = op(2, 4, 8, (2, 4), 1);
    assert_eq!(fp8_gemm(&good, &good).unwrap(), vec![4.0; 4]);
    for (label, bad) in [
        ("short codes", op(2, 4, 5, (2, 4), 1)),
        ("empty blocks", op(2, 4, 8, (0, 0), 1)),
        ("too few scales", op(2, 4, 8, (1, 4), 1)),
        ("too many scales", op(2, 4, 8, (2, 4), 3)),
    ] {
        for (a, b) in [(&bad, &good), (&good, &bad)] {
            let e = fp8_gemm(a, b).unwrap_err().to_string();
            assert!(e.contains("fp8_gemm"), "{label}: {e}");
        }
    }
}

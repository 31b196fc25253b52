//! Dtype conversions round once, to nearest even.

use half::bf16;
use octet_tensor::cpu::matmul;
use octet_tensor::{DType, Tensor};

#[test]
fn f64_to_bf16_rounds_once_with_every_discarded_bit() {
    let one_up = 1.0 + 2f64.powi(-7); // the bf16 after 1.0
    let cases = [
        // Just above the tie 1 + 2^-8, by bits that lie below f32's mantissa
        // (and below the f64's high 32 bits): up, not to even.
        (1.0 + 2f64.powi(-8) + 2f64.powi(-30), one_up),
        (-(1.0 + 2f64.powi(-8) + 2f64.powi(-50)), -one_up),
        // The tie itself and just below it: down.
        (1.0 + 2f64.powi(-8), 1.0),
        (1.0 + 2f64.powi(-8) - 2f64.powi(-40), 1.0),
        // A tie onto an odd neighbour: up to even.
        (one_up + 2f64.powi(-8), 1.0 + 2f64.powi(-6)),
        // Subnormals, overflow, zero, NaN.
        (2f64.powi(-134) * (1.0 + 2f64.powi(-40)), 2f64.powi(-133)),
        (2f64.powi(-134), 0.0),
        (1e39, f64::INFINITY),
        (-1e300, f64::NEG_INFINITY),
        (1e-300, 0.0),
        (0.0, 0.0),
    ];
    let x: Vec<f64> = cases.iter().map(|c| c.0).collect();
    let t = Tensor::from_f64(&[1, x.len()], x)
        .unwrap()
        .to_dtype(DType::Bf16);
    let got = t.as_bf16().unwrap();
    for (&(x, want), g) in cases.iter().zip(got) {
        assert_eq!(g.to_f64(), want, "{x:e} -> {g}");
    }
    let nan = Tensor::from_f64(&[1], vec![f64::NAN]).unwrap();
    assert!(nan.to_dtype(DType::Bf16).as_bf16().unwrap()[0].is_nan());

    // An f64 product delivered in bf16 rounds once too.
    let a = Tensor::from_f64(&[1, 2], vec![1.0 + 2f64.powi(-8), 1.0]).unwrap();
    let b = Tensor::from_f64(&[2, 1], vec![1.0, 2f64.powi(-30)]).unwrap();
    let c = matmul(&a, false, &b, false, DType::Bf16).unwrap();
    assert_eq!(c.as_bf16().unwrap(), &[bf16::from_f64(one_up)]);
}

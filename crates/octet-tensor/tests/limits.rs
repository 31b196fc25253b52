//! Shapes whose element counts overflow `usize` are errors (or, in the raw
//! GEMM whose callers check shapes first, a panic), never a tensor that
//! claims more elements than it holds.

use octet_tensor::cpu::{gemm, gemm_serial, matmul};
use octet_tensor::{checked_numel, DType, Tensor};

#[test]
fn shapes_whose_element_count_wraps_are_rejected() {
    // (2^61 + 1) * 32 wraps to 32 in a plain product.
    let wraps = [(1usize << 61) + 1, 32];
    let e = Tensor::from_f32(&wraps, vec![0.0; 32]).unwrap_err();
    assert!(e.to_string().contains("overflows"), "{e}");
    assert!(Tensor::from_bf16(&wraps, vec![half::bf16::ZERO; 32]).is_err());
    assert!(Tensor::from_f64(&wraps, vec![0.0; 32]).is_err());
    assert!(Tensor::zeros(&wraps, DType::F32).is_err());
    assert!(checked_numel(&[usize::MAX, 2]).is_err());
    assert_eq!(checked_numel(&[3, 0, usize::MAX]).unwrap(), 0);
    let t = Tensor::from_f32(&[4, 8], vec![0.0; 32]).unwrap();
    assert!(t.reshape(&wraps).is_err());
    assert_eq!(Tensor::zeros(&[2, 3], DType::Bf16).unwrap().numel(), 6);
}

#[test]
fn matmul_with_an_output_that_overflows_is_an_error() {
    // Empty operands (K = 0) whose (M, N) output cannot exist.
    let a = Tensor::from_f32(&[1 << 40, 0], vec![]).unwrap();
    let b = Tensor::from_f32(&[1 << 40, 0], vec![]).unwrap();
    let e = matmul(&a, false, &b, true, DType::F32).unwrap_err();
    assert!(e.to_string().contains("overflows"), "{e}");
}

#[test]
#[should_panic(expected = "gemm: a has 0 elements")]
fn gemm_asserts_do_not_pass_a_wrapped_product() {
    // m * k = 2^62 * 4 wraps to 0, the length of `a`.
    gemm::<f32>(1 << 62, 1, 4, &[], false, &[0.0; 4], false);
}

#[test]
#[should_panic(expected = "gemm_serial: b is not")]
fn gemm_serial_asserts_do_not_pass_a_wrapped_product() {
    gemm_serial(1, 1 << 62, 4, &[0.0; 4], &[]);
}

/// A matrix with rows but no columns is valid: its column sums and a bias
/// of no elements give empty results, not a zero-sized-chunk panic.
#[test]
fn row_sums_and_bias_of_a_matrix_without_columns() {
    let x = Tensor::from_f32(&[3, 0], vec![]).unwrap();
    let s = octet_tensor::cpu::sum_rows(&x).unwrap();
    assert_eq!(s.shape(), &[0]);
    let b = Tensor::from_f32(&[0], vec![]).unwrap();
    let y = octet_tensor::cpu::add_bias(&x, &b).unwrap();
    assert_eq!(y.shape(), &[3, 0]);
}

#[test]
fn outputs_too_large_to_allocate_are_errors_not_capacity_panics() {
    // 2^61 f32 elements (2^63 bytes) fit in usize but in no allocation.
    let a = Tensor::from_f32(&[1, 0], vec![]).unwrap();
    let b = Tensor::from_f32(&[0, 1 << 61], vec![]).unwrap();
    let e = matmul(&a, false, &b, false, DType::F32).unwrap_err();
    assert!(e.to_string().contains("largest allocation"), "{e}");
    let e = Tensor::zeros(&[1 << 61], DType::F32).unwrap_err();
    assert!(e.to_string().contains("2305843009213693952"), "{e}");
    let e = Tensor::zeros(&[1 << 60], DType::F64).unwrap_err();
    assert!(e.to_string().contains("largest allocation"), "{e}");
}

/// The weight-only products with a bf16 or f32 weight of no columns (or a
/// gradient of no columns) refuse an output too large to allocate, as
/// `matmul` does, instead of panicking on "capacity overflow" or a wrapped
/// `M * N`.
#[test]
fn weight_only_outputs_too_large_to_allocate_are_errors() {
    use octet_tensor::mixed::{matmul_weights, matmul_weights_t, WeightRef};
    for m in [1usize, 1 << 40] {
        let x = Tensor::from_f32(&[m, 0], vec![]).unwrap();
        // 2^61 f32 outputs exceed the largest allocation; 2^101 overflow usize.
        let want = if m == 1 {
            "largest allocation"
        } else {
            "overflows"
        };
        let e = matmul_weights(&x, &WeightRef::F32(&[], 1 << 61, 0)).unwrap_err();
        assert!(e.to_string().contains(want), "{e}");
        let dy = Tensor::from_f32(&[m, 0], vec![]).unwrap();
        let e = matmul_weights_t(&dy, &WeightRef::F32(&[], 0, 1 << 61)).unwrap_err();
        assert!(e.to_string().contains(want), "{e}");
    }
}

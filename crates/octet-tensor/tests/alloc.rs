//! Buffers the allocator cannot provide are errors naming the bytes and the
//! buffer, not a process abort ("memory allocation of N bytes failed").
//!
//! Every size here is beyond any address space (2^58 bytes and up), so the
//! reservation fails at once and nothing is touched.

use octet_tensor::cpu::matmul;
use octet_tensor::{alloc_collect, alloc_vec, DType, Error, Tensor};
use std::borrow::Cow;

/// The bytes of an [`Error::Alloc`], and its message.
fn alloc_err(e: Error) -> (u128, String) {
    let msg = e.to_string();
    match e {
        Error::Alloc { bytes, .. } => (bytes, msg),
        other => panic!("expected an allocation error, got {other:?}"),
    }
}

#[test]
fn zeros_too_large_for_memory_is_an_error_naming_the_bytes() {
    let (bytes, msg) = alloc_err(Tensor::zeros(&[1 << 40, 1 << 20], DType::F32).unwrap_err());
    assert_eq!(bytes, 1 << 62);
    for want in [
        "out of memory",
        "4611686018427387904 bytes (4.0 EiB)",
        "a F32 tensor of shape [1099511627776, 1048576]",
        "--batch",
    ] {
        assert!(msg.contains(want), "{want:?} missing from: {msg}");
    }
    let (bytes, _) = alloc_err(Tensor::zeros(&[1 << 40, 1 << 20], DType::Bf16).unwrap_err());
    assert_eq!(bytes, 1 << 61);
}

#[test]
fn a_matmul_output_too_large_for_memory_is_an_error() {
    // Empty operands (K = 0): the (2^28, 2^28) output alone is 2^58 bytes in f32.
    let a = Tensor::from_f32(&[1 << 28, 0], vec![]).unwrap();
    let b = Tensor::from_f32(&[0, 1 << 28], vec![]).unwrap();
    let (bytes, msg) = alloc_err(matmul(&a, false, &b, false, DType::F32).unwrap_err());
    assert_eq!(bytes, 1 << 58);
    assert!(msg.contains("268435456x268435456 GEMM output"), "{msg}");
    // Bf16 operands go through their f32 copies; f64 ones accumulate in f64.
    let (a16, b16) = (a.to_dtype(DType::Bf16), b.to_dtype(DType::Bf16));
    let (bytes, _) = alloc_err(matmul(&a16, false, &b16, false, DType::Bf16).unwrap_err());
    assert_eq!(bytes, 1 << 58);
    let (a64, b64) = (a.to_dtype(DType::F64), b.to_dtype(DType::F64));
    let (bytes, _) = alloc_err(matmul(&a64, false, &b64, false, DType::F64).unwrap_err());
    assert_eq!(bytes, 1 << 59);
}

#[test]
fn the_helpers_report_the_request_that_failed() {
    let (bytes, msg) = alloc_err(alloc_vec(1usize << 60, 0f32, "a test buffer").unwrap_err());
    assert_eq!(bytes, 1 << 62);
    assert!(msg.contains("for a test buffer"), "{msg}");
    // Past `isize::MAX` bytes (a capacity overflow): the same error.
    let (bytes, _) = alloc_err(alloc_vec(1usize << 62, 0f64, "x").unwrap_err());
    assert_eq!(bytes, 1 << 65);
    let (bytes, _) =
        alloc_err(alloc_collect((0..1usize << 60).map(|i| i as f32), "y").unwrap_err());
    assert_eq!(bytes, 1 << 62);
    assert_eq!(alloc_vec(3, 1u8, "z").unwrap(), [1, 1, 1]);
}

#[test]
fn f32_reads_and_same_dtype_conversions_do_not_copy() {
    let t = Tensor::from_f32(&[2, 2], vec![1.0, 2.0, 3.0, 4.0]).unwrap();
    let p = t.as_f32().unwrap().as_ptr();
    assert!(matches!(t.f32_values().unwrap(), Cow::Borrowed(_)));
    let t = t.into_dtype(DType::F32).unwrap();
    assert_eq!(t.as_f32().unwrap().as_ptr(), p);
    let h = t.to_dtype(DType::Bf16);
    assert!(matches!(h.f32_values().unwrap(), Cow::Owned(_)));
    assert_eq!(h.try_clone().unwrap(), h);
}

#[test]
fn fallible_conversions_give_the_values_of_the_infallible_ones() {
    // A tie, a value just above one, an overflow, a subnormal and a NaN.
    let vals = [
        1.0 + 2f64.powi(-8),
        1.0 + 2f64.powi(-8) + 2f64.powi(-30),
        1e39,
        1e-40,
        f64::NAN,
        -3.25,
    ];
    let t64 = Tensor::from_f64(&[2, 3], vals.to_vec()).unwrap();
    for src in [
        t64.clone(),
        t64.to_dtype(DType::F32),
        t64.to_dtype(DType::Bf16),
    ] {
        for dt in [DType::F32, DType::Bf16, DType::F64] {
            let want = src.to_dtype(dt);
            let got = src.try_to_dtype(dt).unwrap();
            assert_eq!(got.dtype(), dt);
            assert_eq!(got.shape(), want.shape());
            // NaN != NaN: compare the bits.
            let bits =
                |t: &Tensor| -> Vec<u64> { t.to_f64_vec().iter().map(|x| x.to_bits()).collect() };
            assert_eq!(bits(&got), bits(&want), "{:?} -> {dt:?}", src.dtype());
            assert_eq!(bits(&src.clone().into_dtype(dt).unwrap()), bits(&want));
        }
        let f = |v: Vec<f32>| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(f(src.try_to_f32_vec().unwrap()), f(src.to_f32_vec()));
        let g = |v: Vec<f64>| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(g(src.try_to_f64_vec().unwrap()), g(src.to_f64_vec()));
    }
}

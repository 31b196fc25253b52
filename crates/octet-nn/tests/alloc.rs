//! A layer whose buffers the allocator cannot provide returns the tensor
//! crate's allocation error, message unchanged, instead of aborting.

use octet_fp8::{BackwardMode, Recipe};
use octet_nn::lora::{Adapter, Base, BaseFormat, Compute, LoraLinear};
use octet_nn::Error;
use octet_tensor::Tensor;

#[test]
fn a_lora_forward_too_large_for_memory_is_an_error_naming_the_bytes() {
    // No features (K = 0): the input and weights hold nothing, while the
    // (2^56, 4) output is 2^60 bytes in f32, more than any address space.
    let (m, n) = (1usize << 56, 4);
    let w = Tensor::from_f32(&[n, 0], vec![]).unwrap();
    let base = Base::new(&w, BaseFormat::Bf16).unwrap();
    let adapter = Adapter::init(n, 0, 1, 1.0, 7).unwrap();
    let recipe = Recipe::from_name("tensorwise")
        .unwrap()
        .with_backward(BackwardMode::HighPrecision)
        .unwrap();
    let mut l = LoraLinear::new(base, Some(adapter), Compute::Bf16, recipe).unwrap();
    let x = Tensor::from_f32(&[m, 0], vec![]).unwrap();
    let e = l.forward(&x, true).unwrap_err();
    let Error::Tensor(inner @ octet_tensor::Error::Alloc { bytes, .. }) = &e else {
        panic!("expected an allocation error, got {e:?}");
    };
    assert_eq!(*bytes, 1 << 60);
    // The layer adds nothing to the tensor crate's message.
    assert_eq!(e.to_string(), inner.to_string());
    let msg = e.to_string();
    assert!(msg.contains("1152921504606846976 bytes (1.0 EiB)"), "{msg}");
    assert!(msg.contains("--rank"), "{msg}");
}

/// The quantizer's allocation failure (a dequantized matrix, a quantized
/// copy) reaches a layer's caller as the tensor crate's `Alloc`, message
/// unchanged, as every other buffer does. The copy declares a (2^30, 2^30)
/// shape with no codes: its 2^62-byte f32 matrix is refused before any code
/// is read.
#[test]
fn a_quantizer_allocation_failure_is_the_tensor_crates_alloc_error() {
    let (rows, cols) = (1usize << 30, 1usize << 30);
    let q = octet_fp8::QuantData {
        rows,
        cols,
        format: octet_fp8::Format::E4M3,
        data: Vec::new(),
        block: (rows, cols),
        scales: octet_fp8::Scales::F32(vec![1.0]),
        saturated: 0,
        underflowed: 0,
    };
    let fp8 = q.dequantize().unwrap_err();
    assert!(matches!(fp8, octet_fp8::Error::Alloc { .. }), "{fp8:?}");
    let want = fp8.to_string();
    assert!(
        want.contains("4611686018427387904 bytes (4.0 EiB)"),
        "{want}"
    );
    let t = octet_tensor::Error::from(fp8.clone());
    assert!(
        matches!(t, octet_tensor::Error::Alloc { bytes, .. } if bytes == 1 << 62),
        "{t:?}"
    );
    assert_eq!(t.to_string(), want);
    let e = Error::from(fp8);
    assert!(
        matches!(&e, Error::Tensor(octet_tensor::Error::Alloc { bytes, .. }) if *bytes == 1 << 62),
        "{e:?}"
    );
    assert_eq!(e.to_string(), want);
    // Other quantizer errors keep their variant.
    let other = Error::from(octet_fp8::Error::BadScale(0.0));
    assert!(matches!(other, Error::Quant(_)), "{other:?}");
}

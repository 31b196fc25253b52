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

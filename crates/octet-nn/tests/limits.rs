//! Model dimensions and adapter ranks beyond the documented caps, or whose
//! products overflow, are configuration errors naming the field and limit.

use octet_nn::llama::{LlamaConfig, MAX_DIM, MAX_LAYERS, MAX_PARAMS, MAX_POSITIONS};
use octet_nn::lora::{Adapter, MAX_LORA_RANK};
use octet_nn::rope::Rope;

fn tiny() -> LlamaConfig {
    LlamaConfig::preset("tiny").unwrap()
}

fn rejects(cfg: LlamaConfig, words: &[&str]) {
    let e = cfg.validate().expect_err("should be rejected").to_string();
    for w in words {
        assert!(e.contains(w), "{w:?} missing from: {e}");
    }
}

#[test]
fn presets_pass_and_overflowing_or_oversized_configs_fail() {
    for p in ["tiny", "small", "medium", "1b"] {
        assert!(LlamaConfig::preset(p).unwrap().validate().is_ok(), "{p}");
    }
    // The products of these wrap in usize (the review's TOML files).
    rejects(
        LlamaConfig {
            intermediate_size: 576460752303423490,
            ..tiny()
        },
        &["intermediate_size", "16777216"],
    );
    rejects(
        LlamaConfig {
            vocab_size: 576460752303423496,
            ..tiny()
        },
        &["vocab_size", "16777216"],
    );
    rejects(
        LlamaConfig {
            num_hidden_layers: 100_000_000_000,
            ..tiny()
        },
        &["num_hidden_layers", &MAX_LAYERS.to_string()],
    );
    rejects(
        LlamaConfig {
            max_position_embeddings: 1_000_000_000_000,
            ..tiny()
        },
        &["max_position_embeddings", &MAX_POSITIONS.to_string()],
    );
    rejects(
        LlamaConfig {
            max_position_embeddings: 0,
            ..tiny()
        },
        &["max_position_embeddings"],
    );
    // Every dimension within its cap, the total beyond the parameter cap.
    rejects(
        LlamaConfig {
            hidden_size: MAX_DIM,
            intermediate_size: MAX_DIM,
            num_attention_heads: 4096,
            num_key_value_heads: 4096,
            ..tiny()
        },
        &["parameters", &MAX_PARAMS.to_string()],
    );
    // A long context with a wide head: the rotary table.
    rejects(
        LlamaConfig {
            hidden_size: 1 << 20,
            num_attention_heads: 1,
            num_key_value_heads: 1,
            max_position_embeddings: MAX_POSITIONS,
            ..tiny()
        },
        &["rotary", "max_position_embeddings"],
    );
    rejects(
        LlamaConfig {
            rms_norm_eps: f64::NAN,
            ..tiny()
        },
        &["rms_norm_eps"],
    );
    rejects(
        LlamaConfig {
            rope_theta: 0.0,
            ..tiny()
        },
        &["rope_theta"],
    );
    // num_params saturates instead of wrapping.
    let huge = LlamaConfig {
        vocab_size: usize::MAX,
        ..tiny()
    };
    assert_eq!(huge.num_params(), usize::MAX);
}

#[test]
fn adapter_ranks_are_bounded_before_allocating() {
    // (2^61 + 1) * 32 wraps to 32: the review's segfault.
    let e = Adapter::init(64, 32, (1 << 61) + 1, 8.0, 1)
        .unwrap_err()
        .to_string();
    assert!(e.contains("65536"), "{e}");
    assert!(Adapter::init(64, 32, MAX_LORA_RANK + 1, 8.0, 1).is_err());
    assert!(Adapter::init(64, 32, 0, 8.0, 1).is_err());
    let a = Adapter::init(4, 3, 2, 8.0, 1).unwrap();
    assert_eq!((a.a.shape(), a.b.shape()), (&[2, 3][..], &[4, 2][..]));
    // Rank within the cap, but rank * K overflows.
    assert!(Adapter::init(1, usize::MAX / 2, 4, 8.0, 1).is_err());
}

#[test]
fn rope_tables_beyond_the_cap_are_errors() {
    assert!(Rope::new(64, usize::MAX, 10000.0).is_err());
    assert!(Rope::new(64, 1 << 30, 10000.0).is_err());
    assert!(Rope::new(8, 64, 10000.0).is_ok());
}

#[test]
fn rope_of_an_empty_sequence_or_no_heads_is_an_error_not_a_panic() {
    let rope = Rope::new(4, 8, 10000.0).unwrap();
    for shape in [[1, 0, 2, 4], [1, 3, 0, 4], [0, 3, 2, 4]] {
        let x = octet_tensor::Tensor::zeros(&shape, octet_tensor::DType::F32).unwrap();
        let fwd = std::panic::catch_unwind(|| rope.forward(&x).is_err());
        assert_eq!(fwd.ok(), Some(true), "forward of {shape:?}");
        let bwd = std::panic::catch_unwind(|| rope.backward(&x).is_err());
        assert_eq!(bwd.ok(), Some(true), "backward of {shape:?}");
    }
    // A non-empty input still rotates.
    let x = octet_tensor::Tensor::zeros(&[1, 3, 2, 4], octet_tensor::DType::F32).unwrap();
    assert!(rope.forward(&x).is_ok());
}

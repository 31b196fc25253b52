//! The GPU model's host-side checks (no GPU needed).

use octet_nn::llama::cuda::unsupported_config;
use octet_nn::llama::LlamaConfig;

#[test]
fn the_gpu_model_refuses_family_switches_naming_the_field_and_the_cpu() {
    let tiny = LlamaConfig::preset("tiny").unwrap();
    assert_eq!(unsupported_config(&tiny), None);
    for (cfg, field) in [
        (
            LlamaConfig {
                qkv_bias: true,
                ..tiny.clone()
            },
            "attention_bias",
        ),
        (
            LlamaConfig {
                qk_norm: true,
                ..tiny.clone()
            },
            "qk_norm",
        ),
        (
            LlamaConfig {
                head_dim: Some(16),
                ..tiny.clone()
            },
            "head_dim 16",
        ),
    ] {
        let why = unsupported_config(&cfg).expect(field);
        assert!(why.contains(field) && why.contains("--device cpu"), "{why}");
    }
}

//! The GPU model's host-side checks (no GPU needed).

use octet_nn::decode::cuda::unsupported_config as decode_gate;
use octet_nn::llama::cuda::unsupported_config as train_gate;
use octet_nn::llama::LlamaConfig;

/// The GPU training model and decoder run every family switch, and refuse
/// a head width past their attention kernels', naming it and the CPU.
#[test]
fn the_gpu_model_and_decoder_run_every_family_and_refuse_wide_heads() {
    let tiny = LlamaConfig::preset("tiny").unwrap();
    for cfg in [
        tiny.clone(),
        LlamaConfig {
            qkv_bias: true,
            o_bias: true,
            ..tiny.clone()
        },
        LlamaConfig {
            qk_norm: true,
            head_dim: Some(16),
            ..tiny.clone()
        },
    ] {
        assert_eq!(train_gate(&cfg), None);
        assert_eq!(decode_gate(&cfg), None);
    }
    for (d, train, decode) in [(256, true, false), (512, true, true)] {
        let wide = LlamaConfig {
            head_dim: Some(d),
            ..tiny.clone()
        };
        for (why, refused) in [(train_gate(&wide), train), (decode_gate(&wide), decode)] {
            assert_eq!(why.is_some(), refused, "head_dim {d}: {why:?}");
            if let Some(why) = why {
                assert!(
                    why.contains(&d.to_string()) && why.contains("--device cpu"),
                    "{why}"
                );
            }
        }
    }
}

/// The first function of a Rust source whose signature starts `sig`: from
/// there to the first `}` line indented as the signature.
fn fn_body<'a>(src: &'a str, sig: &str) -> &'a str {
    let at = src.find(sig).unwrap_or_else(|| panic!("no {sig}"));
    let line = src[..at].rfind('\n').map_or(0, |i| i + 1);
    let indent = src[line..].len() - src[line..].trim_start().len();
    let end = format!("\n{}}}\n", " ".repeat(indent));
    let len = src[at..].find(&end).expect("end of the function");
    &src[at..at + len]
}

/// The string literals of a piece of Rust source (no escapes in them).
fn literals(src: &str) -> Vec<&str> {
    src.split('"').skip(1).step_by(2).collect()
}

/// Every kernel the GPU model loads is a `__global__` of exactly the source
/// that `TRAIN_KERNELS` loads it from, and of no other family of the table;
/// every kernel of those sources is in the table (nothing left that nothing
/// loads); and every name `load_fns` asks for is in the table (its literals,
/// `{d}` expanded over the head dims of the kernels it names). A kernel moved
/// to another file fails here, not when a GPU loads the module.
#[test]
fn every_kernel_the_gpu_model_loads_is_in_the_source_it_is_loaded_from() {
    use octet_nn::llama::cuda::{ATTN_TC_DIMS, ATTN_WG_DIMS, TRAIN_KERNELS};
    use std::collections::BTreeSet;
    let mut families = BTreeSet::new();
    let mut table = BTreeSet::new();
    for (family, names) in TRAIN_KERNELS {
        assert!(families.insert(family), "{family} listed twice");
        let src = octet_cuda::kernel_source(family).expect("a kernel source");
        let defined = octet_cuda::kernel_names(src);
        let unique: BTreeSet<&str> = defined.iter().map(String::as_str).collect();
        assert_eq!(
            unique.len(),
            defined.len(),
            "{family}: a kernel defined twice"
        );
        for name in names {
            assert!(table.insert(*name), "{name} listed twice");
            for (other, _) in TRAIN_KERNELS {
                let there = octet_cuda::kernel_names(octet_cuda::kernel_source(other).unwrap());
                assert_eq!(
                    there.iter().any(|k| k == name),
                    other == family,
                    "{name}: loaded from {family}, {} {other}.cu",
                    if other == family {
                        "absent from"
                    } else {
                        "defined in"
                    },
                );
            }
        }
        let listed: BTreeSet<&str> = names.iter().copied().collect();
        assert_eq!(
            unique, listed,
            "{family}: the kernels of the source against those the table loads from it"
        );
    }
    let body = fn_body(include_str!("../src/llama/cuda/kernels.rs"), "fn load_fns(");
    // The literals of load_fns that are not kernel names.
    let other_words = ["OCTET_ATTN", "mma", "sm_90a"];
    let mut asked = BTreeSet::new();
    for lit in literals(body) {
        if other_words.contains(&lit)
            || !lit
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "_{}".contains(c))
        {
            continue;
        }
        if lit.contains("{d}") {
            let dims: &[usize] = if lit.contains("_tc{d}") {
                &ATTN_TC_DIMS
            } else if lit.contains("_wg{d}") {
                &ATTN_WG_DIMS
            } else {
                panic!("{lit}: which head dims does load_fns load it for? (teach this test)")
            };
            for d in dims {
                asked.insert(lit.replace("{d}", &d.to_string()));
            }
        } else {
            asked.insert(lit.to_string());
        }
    }
    let table: BTreeSet<String> = table.into_iter().map(str::to_string).collect();
    assert_eq!(
        asked, table,
        "the kernels load_fns asks for against TRAIN_KERNELS (a word that is not a kernel goes in other_words)"
    );

    // The decoder's kernels, loaded from one module.
    let decode = octet_cuda::kernel_names(octet_cuda::kernel_source("decode").unwrap());
    let body = fn_body(include_str!("../src/decode/cuda.rs"), "pub fn new(");
    let loaded: Vec<&str> = body
        .split("f(\"")
        .skip(1)
        .filter_map(|s| s.split('"').next())
        .collect();
    assert!(loaded.len() >= 7, "{loaded:?}");
    for name in loaded {
        assert!(
            decode.iter().any(|k| k == name),
            "{name} is not in decode.cu"
        );
    }
}

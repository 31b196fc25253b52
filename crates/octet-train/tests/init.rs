//! Runs that start from a checkpoint's weights (`TrainConfig::init`), with
//! or without a LoRA adapter merged in first.

mod common;

use octet_nn::llama::{Llama, LoraSpec};
use octet_nn::lora::{BaseFormat, Compute};
use octet_tensor::{DType, Tensor};
use octet_train::checkpoint;
use octet_train::trainer::{merge_adapter, train, Quiet, TrainConfig};
use rand::{Rng, SeedableRng};
use std::collections::HashMap;

fn tmpdir(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("octet-init-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn run(name: &str, out: &std::path::Path) -> TrainConfig {
    TrainConfig {
        seq: 32,
        warmup: 1,
        eval_every: 4,
        eval_batches: 2,
        ..common::quick_run(name, out, 4)
    }
}

#[test]
fn a_run_started_from_a_checkpoint_starts_from_its_weights() {
    let out = tmpdir("run");
    let first = train(&run("first", &out), None, &mut Quiet).unwrap();
    let ck = out.join("first/checkpoints/step_000004");
    // A learning rate far below f32's resolution of the weights: one step
    // leaves every weight as loaded, so the evaluation after it is the
    // first run's final one, bit for bit.
    let mut c = run("second", &out);
    c.init = Some(ck.clone());
    c.steps = 1;
    c.eval_every = 1;
    c.lr = 1e-30;
    c.min_lr = 1e-30;
    c.model = "small".into(); // ignored: the checkpoint's dimensions win
    let second = train(&c, None, &mut Quiet).unwrap();
    assert_eq!(second.params, first.params);
    assert_eq!(second.final_val_loss, first.final_val_loss);
    // --init and --resume together are refused.
    let err = train(&c, Some(&ck), &mut Quiet).unwrap_err().to_string();
    assert!(err.contains("--init"), "{err}");
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn merged_adapters_match_an_f64_reference() {
    let out = tmpdir("merge");
    let cfg = octet_nn::llama::LlamaConfig::preset("tiny").unwrap();
    let model = Llama::new_random(&cfg, DType::F32, None, 9).unwrap();
    let base = out.join("base");
    std::fs::create_dir_all(&base).unwrap();
    checkpoint::save_model(&base, &model).unwrap();
    // An adapter on q and down with random A and B (B is zero at a real
    // adapter's start, which would test nothing).
    let spec = LoraSpec {
        rank: 3,
        alpha: 5.0,
        targets: vec!["q".into(), "down".into()],
        base: BaseFormat::Bf16,
        compute: Compute::Bf16,
        recipe: octet_fp8::Recipe::from_name("tensorwise")
            .unwrap()
            .with_backward(octet_fp8::BackwardMode::HighPrecision)
            .unwrap(),
        seed: 1,
        dropout: 0.0,
    };
    let mut lora = model.clone().into_lora(&spec).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(17);
    let mut adapter: HashMap<String, Tensor> = HashMap::new();
    for (name, t) in lora.params() {
        let v: Vec<f32> = (0..t.numel())
            .map(|_| rng.random_range(-0.5..0.5))
            .collect();
        adapter.insert(name, Tensor::from_f32(t.shape(), v).unwrap());
    }
    lora.load_params(adapter.clone()).unwrap();
    let adir = out.join("adapter");
    checkpoint::save_model(&adir, &lora).unwrap();
    let merged = merge_adapter(&base, &adir, Some("bf16")).unwrap();
    assert_eq!((merged.rank, merged.alpha), (3, 5.0));
    let s = 5.0 / 3.0;
    let mut checked = 0;
    for (name, w) in model.params() {
        let got = merged.weights[&name].to_f32_vec();
        let wb = w.to_dtype(DType::Bf16).to_f32_vec();
        let module = name.trim_end_matches(".weight");
        let a_name = adapter
            .keys()
            .find(|k| k.contains(&format!("{module}.lora_A")));
        let Some(a_name) = a_name else {
            if name.ends_with("_proj.weight") {
                assert_eq!(got, wb, "{name}: no adapter, the bf16 base as it is");
            }
            continue;
        };
        let b_name = a_name.replace("lora_A", "lora_B");
        let (a, b) = (adapter[a_name].to_f32_vec(), adapter[&b_name].to_f32_vec());
        let (n, k) = w.dims2().unwrap();
        // f64 reference W + s B A; the merge sums in f32: per element at most
        // (r + 2) roundings of values below |W| + s r max|B||A|.
        for i in 0..n {
            for j in 0..k {
                let ba: f64 = (0..3)
                    .map(|p| b[i * 3 + p] as f64 * a[p * k + j] as f64)
                    .sum();
                let want = wb[i * k + j] as f64 + s * ba;
                let bound =
                    5.0 * f32::EPSILON as f64 * (wb[i * k + j].abs() as f64 + s * 3.0 * 0.25);
                let e = (got[i * k + j] as f64 - want).abs();
                assert!(
                    e <= bound,
                    "{name} ({i}, {j}): {} vs {want}",
                    got[i * k + j]
                );
            }
        }
        checked += 1;
    }
    assert_eq!(checked, 2 * cfg.num_hidden_layers);
    let _ = std::fs::remove_dir_all(&out);
}

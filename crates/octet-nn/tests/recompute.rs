//! Activation recomputation (`Llama::set_recompute`): backward runs the
//! forward of each recomputed block (every block, or the first ones) again
//! from the block's input, and the gradients are the same bits as those of
//! the model that kept every block's activations.

use octet_fp8::{BackwardMode, Recipe};
use octet_nn::llama::{Llama, LlamaConfig, LoraSpec};
use octet_nn::lora::{BaseFormat, Compute};
use octet_tensor::{DType, Tensor};
use rand::{Rng, SeedableRng};

fn tokens(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..n).map(|_| rng.random_range(0..vocab as u32)).collect()
}

fn bits(t: &Tensor) -> Vec<u64> {
    t.to_f64_vec().into_iter().map(f64::to_bits).collect()
}

/// Two training steps' losses and gradients (delayed scaling's histories
/// roll between them, LoRA dropout draws a new round), with and without
/// recomputation, must agree bit for bit; the recomputing model keeps fewer
/// bytes for backward.
fn same_gradients(kept: Llama, what: &str) {
    // Every block recomputed, and the first only (the tiny model has two).
    for blocks in [usize::MAX, 1] {
        same_gradients_with(kept.clone(), blocks, &format!("{what}, {blocks} blocks"));
    }
}

fn same_gradients_with(mut kept: Llama, blocks: usize, what: &str) {
    let cfg = kept.cfg.clone();
    let mut again = kept.clone();
    again.set_recompute(blocks);
    assert_eq!(again.recompute(), blocks.min(cfg.num_hidden_layers));
    assert_eq!(kept.recompute(), 0);
    let (b, t) = (2, 16);
    for step in 0..2u64 {
        let toks = tokens(b * t, cfg.vocab_size, 40 + step);
        let tgts = tokens(b * t, cfg.vocab_size, 80 + step);
        let (loss_k, saved_k) = kept.forward(&toks, &tgts, b, t).unwrap();
        let (loss_r, saved_r) = again.forward(&toks, &tgts, b, t).unwrap();
        assert_eq!(
            loss_k.to_bits(),
            loss_r.to_bits(),
            "{what}: loss, step {step}"
        );
        assert!(
            saved_r.bytes() < saved_k.bytes(),
            "{what}: {} bytes saved with recomputation against {}",
            saved_r.bytes(),
            saved_k.bytes()
        );
        let gk = kept.backward(saved_k).unwrap();
        let gr = again.backward(saved_r).unwrap();
        assert_eq!(gk.len(), gr.len());
        for ((nk, tk), (nr, tr)) in gk.iter().zip(&gr) {
            assert_eq!(nk, nr);
            assert!(
                tk.to_f64_vec().iter().any(|&v| v != 0.0) || nk.contains("lora_B"),
                "{what}: {nk} has an all-zero gradient"
            );
            let (bk, br) = (bits(tk), bits(tr));
            let differ = bk.iter().zip(&br).filter(|(x, y)| x != y).count();
            assert!(
                bk.len() == br.len() && differ == 0,
                "{what}: {nk}, step {step}: {differ} of {} elements differ",
                bk.len()
            );
        }
        kept.update_scales();
        again.update_scales();
    }
}

#[test]
fn recomputed_blocks_give_the_same_gradients_under_every_recipe() {
    let cfg = LlamaConfig::preset("tiny").unwrap();
    let plain = Llama::new_random(&cfg, DType::F32, None, 5).unwrap();
    same_gradients(plain, "f32");
    for name in Recipe::NAMES {
        for mode in [BackwardMode::Quantized, BackwardMode::Dequantized] {
            // Delayed scaling takes the quantized backward only.
            let Ok(recipe) = Recipe::from_name(name).unwrap().with_backward(mode) else {
                assert_eq!((name, mode), ("delayed", BackwardMode::Dequantized));
                continue;
            };
            let m = Llama::new_random(&cfg, DType::F32, Some(recipe), 5).unwrap();
            same_gradients(m, &format!("{name}, {mode:?}"));
        }
    }
}

#[test]
fn recomputed_blocks_draw_the_same_lora_dropout_masks() {
    let cfg = LlamaConfig::preset("tiny").unwrap();
    let base = Llama::new_random(&cfg, DType::F32, None, 9).unwrap();
    let spec = LoraSpec {
        rank: 4,
        alpha: 8.0,
        targets: ["q", "k", "v", "o", "gate", "up", "down"]
            .map(String::from)
            .to_vec(),
        base: BaseFormat::from_name("fp8-tensorwise").unwrap(),
        compute: Compute::Fp8,
        recipe: Recipe::from_name("tensorwise").unwrap(),
        seed: 3,
        dropout: 0.25,
    };
    let mut lora = base.into_lora(&spec).unwrap();
    // A trained-looking B, so that A's gradient (through B) is not zero.
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    for (name, t) in lora.params_mut() {
        if name.ends_with("lora_B.weight") {
            let v: Vec<f32> = (0..t.numel())
                .map(|_| rng.random_range(-0.05f32..0.05))
                .collect();
            *t = Tensor::from_f32(t.shape(), v).unwrap();
        }
    }
    same_gradients(lora, "LoRA, FP8 base, dropout 0.25");
}

/// Evaluation (`Llama::logits`) between training steps leaves delayed
/// scaling as it was: the same scales and bit-identical gradients as
/// training without it (validation batches used to enter the amax history).
#[test]
fn evaluation_between_steps_leaves_delayed_scaling_as_it_was() {
    use octet_fp8::Recipe;
    use octet_nn::{Llama, LlamaConfig};
    use octet_tensor::DType;
    let cfg = LlamaConfig::preset("tiny").unwrap();
    let rec = Recipe::from_name("delayed").unwrap();
    let (b, t) = (2, 16);
    let tok: Vec<u32> = (0..b * t).map(|i| ((i * 37 + 11) % 256) as u32).collect();
    let tgt: Vec<u32> = (0..b * t).map(|i| ((i * 53 + 7) % 256) as u32).collect();
    let other: Vec<u32> = (0..b * t).map(|i| ((i * 101 + 5) % 256) as u32).collect();
    let run = |evaluate: bool| {
        let mut m = Llama::new_random(&cfg, DType::F32, Some(rec), 3).unwrap();
        let mut grads = Vec::new();
        for _ in 0..3 {
            let (_, s) = m.forward(&tok, &tgt, b, t).unwrap();
            grads = m.backward(s).unwrap();
            m.update_scales();
            if evaluate {
                m.logits(&other, b, t).unwrap();
            }
        }
        let scales: Vec<u32> = m
            .scaling_state()
            .iter()
            .map(|(_, _, s)| s.scale().to_bits())
            .collect();
        let bits: Vec<u32> = grads
            .iter()
            .flat_map(|(_, g)| g.to_f32_vec())
            .map(f32::to_bits)
            .collect();
        (scales, bits)
    };
    let (plain, evaluated) = (run(false), run(true));
    assert!(!plain.0.is_empty());
    assert_eq!(plain.0, evaluated.0, "delayed scales");
    assert!(plain.1 == evaluated.1, "gradients differ");
}

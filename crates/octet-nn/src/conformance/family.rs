//! The model families on the GPU against the CPU `Llama` in f64: Qwen2's
//! q/k/v biases, `attention_bias`'s o bias, Qwen3's per-head q/k norms and a
//! head width other than `hidden_size / num_attention_heads`; loss and every
//! gradient per recipe, and recomputation giving the same bits.

use super::*;

/// `w` with random biases (normal, 0.1) and q/k norm gains (1 plus normal,
/// 0.2) in place of the zeros and ones of a fresh model, so that a bias or
/// gain read wrongly shows in the loss and gradients.
pub(super) fn perturbed(
    mut w: std::collections::HashMap<String, octet_tensor::Tensor>,
    seed: u64,
) -> Result<std::collections::HashMap<String, octet_tensor::Tensor>> {
    let mut names: Vec<String> = w.keys().cloned().collect();
    names.sort();
    for (i, name) in names.iter().enumerate() {
        let (scale, offset) = if name.ends_with(".bias") {
            (0.1, 0.0)
        } else if name.ends_with("q_norm.weight") || name.ends_with("k_norm.weight") {
            (0.2, 1.0)
        } else {
            continue;
        };
        if let Some(t) = w.get_mut(name) {
            let v: Vec<f32> = random_f32(t.numel(), seed + i as u64, scale)
                .into_iter()
                .map(|x| x + offset)
                .collect();
            *t = octet_tensor::Tensor::from_f32(t.shape(), v)
                .map_err(|e| Error::Shape(e.to_string()))?;
        }
    }
    Ok(w)
}

/// The family cases: for each switch, the GPU model's loss and gradients in
/// bf16 and every FP8 recipe (blockwise where every projection's width is a
/// multiple of 128) against the CPU model in f64 (the tolerances of
/// [`model_cases`]' whole-model case), and all blocks recomputed against
/// none, bit for bit.
pub fn family_cases(gpu: &Gpu, out: &mut Vec<CaseResult>) -> Result<()> {
    use crate::llama::cuda::GpuLlama;
    use crate::llama::{Llama, LlamaConfig};
    use octet_tensor::DType;
    let nn = |e: crate::Error| Error::Shape(e.to_string());
    let base = test_config(256, 512, 2, 4, 2, 64);
    let families = [
        (
            "Qwen2: q/k/v biases",
            LlamaConfig {
                qkv_bias: true,
                ..base.clone()
            },
        ),
        (
            "q/k/v/o biases",
            LlamaConfig {
                qkv_bias: true,
                o_bias: true,
                ..base.clone()
            },
        ),
        (
            "Qwen3: q/k norms, head_dim 128 (q 512 wide at C=256)",
            LlamaConfig {
                qk_norm: true,
                head_dim: Some(128),
                ..base.clone()
            },
        ),
        (
            "head_dim 32 (q 128 wide at C=256)",
            LlamaConfig {
                head_dim: Some(32),
                ..base.clone()
            },
        ),
    ];
    let (b, t) = (2usize, 64usize);
    let (toks, tgts) = (test_tokens(2301, b * t), test_tokens(2302, b * t));
    for (what, cfg) in families {
        let w = perturbed(test_weights(&cfg, 31)?, 2310)?;
        let w64 = w
            .iter()
            .map(|(n, t)| (n.clone(), t.to_dtype(DType::F64)))
            .collect();
        let mut cpu64 = Llama::from_weights(&cfg, w64, None).map_err(nn)?;
        let (loss64, s64) = cpu64.forward(&toks, &tgts, b, t).map_err(nn)?;
        let g64 = cpu64.backward(s64).map_err(nn)?;
        let worst = |got: &[(String, octet_tensor::Tensor)]| -> (f64, String) {
            if got.len() != g64.len() {
                return (
                    f64::INFINITY,
                    format!("{} gradients, want {}", got.len(), g64.len()),
                );
            }
            let mut worst = (0f64, String::new());
            for ((name, g), (rname, r)) in got.iter().zip(&g64) {
                let e = match name == rname {
                    true => rel_frobenius_f64(&g.to_f32_vec(), &r.to_f64_vec()),
                    false => f64::INFINITY,
                };
                if e > worst.0 || e.is_nan() {
                    worst = (e, name.clone());
                }
            }
            worst
        };
        // 128x128 weight blocks need every projection's width a multiple of 128.
        let widths = [cfg.attn_width(), cfg.kv_width()];
        let blocks = widths.iter().all(|w| w.is_multiple_of(128));
        let recipes = ["bf16", "tensorwise", "rowwise", "delayed", "blockwise"];
        for recipe_name in recipes.into_iter().filter(|&r| r != "blockwise" || blocks) {
            let recipe = match recipe_name {
                "bf16" => None,
                r => Some(octet_fp8::Recipe::from_name(r)?),
            };
            let run = |recompute: usize| -> Result<(f64, Vec<(String, octet_tensor::Tensor)>)> {
                let mut model = GpuLlama::new(gpu, &cfg, &w, recipe)?;
                model.set_recompute(recompute);
                model.zero_grad()?;
                let (loss, saved) = model.forward(&toks, &tgts, (b, t), 1.0, true)?;
                model
                    .backward(saved.ok_or_else(|| Error::Shape("forward kept nothing".into()))?)?;
                Ok((loss, model.grads()?))
            };
            let (loss, grads) = run(0)?;
            let (eg, gname) = worst(&grads);
            let el = (loss - loss64).abs() / loss64;
            // As the whole-model case: bf16 roundings at each product input;
            // FP8 no worse than the CPU's FP8 model is, plus that allowance.
            let (pass, note) = match recipe {
                None => (el <= 2e-3 && eg <= 3e-2, String::new()),
                Some(r) => {
                    let mut cpu = Llama::from_weights(&cfg, w.clone(), Some(r)).map_err(nn)?;
                    let (closs, cs) = cpu.forward(&toks, &tgts, b, t).map_err(nn)?;
                    let (ecg, _) = worst(&cpu.backward(cs).map_err(nn)?);
                    let ecl = (closs - loss64).abs() / loss64;
                    (
                        el <= 2.0 * ecl + 2e-3 && eg <= 1.5 * ecg + 3e-2,
                        format!(", CPU FP8 model: loss {ecl:.2e}, grad {ecg:.2e}"),
                    )
                }
            };
            out.push(CaseResult {
                name: format!(
                    "Llama {what}, {recipe_name} fwd+bwd (2 blocks, B=2 T=64) vs CPU f64"
                ),
                pass,
                worst: format!("loss {el:.2e}, worst grad {eg:.2e} ({gname}){note}"),
            });
            let (rloss, rgrads) = run(usize::MAX)?;
            let differ = differing(&grads, &rgrads);
            out.push(CaseResult {
                name: format!("Llama {what}, {recipe_name}: every block recomputed gives the same loss and gradients"),
                pass: rloss.to_bits() == loss.to_bits() && differ == 0 && rgrads.len() == grads.len(),
                worst: format!("loss {loss} / {rloss}; {differ} of {} gradients differ", grads.len()),
            });
        }
    }
    Ok(())
}

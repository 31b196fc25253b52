//! The training model on the GPU against the CPU `Llama`: attention, loss,
//! gradients, AdamW steps, FP8 saved activations and recomputation.

use super::*;

/// f64 causal grouped-query attention and its backward, the output gradient's
/// `delta` taken from `out_used` (the output the backward sees, as the GPU
/// backward takes its own bf16 output): `(out, dq, dk, dv)`.
#[allow(clippy::type_complexity)]
pub(super) fn attention_ref(
    q: &[f64],
    k: &[f64],
    v: &[f64],
    dout: &[f64],
    out_used: Option<&[f64]>,
    (b, t, hq, hkv, d): (usize, usize, usize, usize, usize),
) -> (Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>) {
    let scale = 1.0 / (d as f64).sqrt();
    let (qw, kw) = (hq * d, hkv * d);
    let mut out = vec![0.0; b * t * qw];
    let mut dq = vec![0.0; b * t * qw];
    let mut dk = vec![0.0; b * t * kw];
    let mut dv = vec![0.0; b * t * kw];
    for bi in 0..b {
        for h in 0..hq {
            let g = h / (hq / hkv);
            for i in 0..t {
                let qi = &q[(bi * t + i) * qw + h * d..][..d];
                let s: Vec<f64> = (0..=i)
                    .map(|j| {
                        let kj = &k[(bi * t + j) * kw + g * d..][..d];
                        qi.iter().zip(kj).map(|(a, b)| a * b).sum::<f64>() * scale
                    })
                    .collect();
                let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = s.iter().map(|x| (x - m).exp()).sum();
                let p: Vec<f64> = s.iter().map(|x| (x - m).exp() / z).collect();
                let o = &mut out[(bi * t + i) * qw + h * d..][..d];
                for (j, pj) in p.iter().enumerate() {
                    for c in 0..d {
                        o[c] += pj * v[(bi * t + j) * kw + g * d + c];
                    }
                }
                let ou = out_used.map_or_else(
                    || o.to_vec(),
                    |u| u[(bi * t + i) * qw + h * d..][..d].to_vec(),
                );
                let dro = &dout[(bi * t + i) * qw + h * d..][..d];
                let delta: f64 = dro.iter().zip(&ou).map(|(a, b)| a * b).sum();
                for (j, pj) in p.iter().enumerate() {
                    let vj = &v[(bi * t + j) * kw + g * d..][..d];
                    let dp: f64 = dro.iter().zip(vj).map(|(a, b)| a * b).sum();
                    let ds = pj * (dp - delta) * scale;
                    for c in 0..d {
                        dv[(bi * t + j) * kw + g * d + c] += pj * dro[c];
                        dk[(bi * t + j) * kw + g * d + c] += ds * qi[c];
                        dq[(bi * t + i) * qw + h * d + c] += ds * k[(bi * t + j) * kw + g * d + c];
                    }
                }
            }
        }
    }
    (out, dq, dk, dv)
}

/// The training model on the GPU against the CPU reference: the attention
/// kernels against f64 attention (several head dims, sequences off the
/// 64-tile, grouped heads), the whole model's loss and gradients against the
/// CPU `Llama` in f64 (bf16 model) and against the CPU's own FP8 error (FP8
/// recipes), and one AdamW step against the formula on the host.
pub fn model_cases(gpu: &Gpu, out: &mut Vec<CaseResult>) -> Result<()> {
    use crate::llama::cuda::{AdamParams, GpuLlama};
    use crate::llama::Llama;
    use octet_tensor::{DType, Tensor};
    use std::collections::HashMap;
    let nn = |e: crate::Error| Error::Shape(e.to_string());
    let config = test_config;
    // Attention kernels alone: out within bf16 rounding; gradients within f32
    // accumulation noise of the f64 reference fed the GPU's own bf16 output.
    for (b, t, hq, hkv, d) in [
        (2, 150, 4, 2, 64),
        (1, 200, 4, 1, 128),
        (3, 70, 2, 2, 16),
        (1, 64, 8, 4, 8),
    ] {
        let cfg = config(hq * d, 32, 1, hq, hkv, t);
        let w = test_weights(&cfg, 5)?;
        let model = GpuLlama::new(gpu, &cfg, &w, None)?;
        let n = b * t;
        let qb = random_bf16(n * hq * d, 1301, 2.0);
        let kb = random_bf16(n * hkv * d, 1302, 2.0);
        let vb = random_bf16(n * hkv * d, 1303, 1.0);
        // The output gradient in bf16, as the o projection's backward writes it.
        let go = random_bf16(n * hq * d, 1304, 1e-2);
        let (o, dq, dk, dv) = model.attention_check(
            &gpu.upload(&bf16_bits(&qb))?,
            &gpu.upload(&bf16_bits(&kb))?,
            &gpu.upload(&bf16_bits(&vb))?,
            &gpu.upload(&bf16_bits(&go))?,
            (b, t, hq, hkv, d),
        )?;
        let f = |v: &[bf16]| v.iter().map(|x| x.to_f64()).collect::<Vec<f64>>();
        let go64 = f(&go);
        let got_o = download_f32(gpu, &o)?;
        let got_o64: Vec<f64> = got_o.iter().map(|&x| x as f64).collect();
        let (ro, rdq, rdk, rdv) = attention_ref(
            &f(&qb),
            &f(&kb),
            &f(&vb),
            &go64,
            Some(&got_o64),
            (b, t, hq, hkv, d),
        );
        let eo = rel_frobenius_f64(&got_o, &ro);
        let eq = rel_frobenius_f64(&gpu.download(&dq)?, &rdq);
        let ek = rel_frobenius_f64(&gpu.download(&dk)?, &rdk);
        let ev = rel_frobenius_f64(&gpu.download(&dv)?, &rdv);
        // Tensor cores multiply bf16 operands: the probabilities and dS are
        // rounded to bf16 (relative 2^-9 each) before their products, as flash
        // attention does; the SIMT kernels keep f32. (The output gradient is
        // bf16 on both sides.)
        let (gtol, kind) = if model.attention_on_tensor_cores() {
            (1e-2, "tensor cores")
        } else {
            (1e-5, "SIMT")
        };
        out.push(CaseResult {
            name: format!("attention fwd+bwd B={b} T={t} heads {hq}/{hkv} D={d} ({kind}) vs f64"),
            pass: eo <= BF16_OUT_TOL && eq.max(ek).max(ev) <= gtol,
            worst: format!("out {eo:.2e}, dq {eq:.2e}, dk {ek:.2e}, dv {ev:.2e}"),
        });
        // The bf16 gradients the projections read: the wgmma kernels' fused
        // store (RoPE's backward, bf16, amax) against the f32 kernels and the
        // passes, bit for bit (the same f32 operations, rounded the same way).
        if model.attention_fused_store() {
            let up = |x: &[bf16]| gpu.upload(&bf16_bits(x));
            let (qd, kd, vd, god) = (up(&qb)?, up(&kb)?, up(&vb)?, up(&go)?);
            let dims = (b, t, hq, hkv, d);
            let (fg, fa) = model.attention_backward_bf16_check(&qd, &kd, &vd, &god, dims, true)?;
            let (pg, pa) = model.attention_backward_bf16_check(&qd, &kd, &vd, &god, dims, false)?;
            let diff: Vec<usize> = (0..3)
                .map(|i| fg[i].iter().zip(&pg[i]).filter(|(a, b)| a != b).count())
                .collect();
            let nonzero = fg.iter().all(|g| g.iter().any(|&x| x & 0x7fff != 0));
            out.push(CaseResult {
                name: format!(
                    "attention bwd fused bf16 + RoPE store B={b} T={t} heads {hq}/{hkv} D={d} vs f32 + passes"
                ),
                pass: diff.iter().all(|&c| c == 0) && fa == pa && nonzero,
                worst: format!(
                    "differing dq/dk/dv {}/{}/{} of {}/{}/{}, amax bits {fa:08x?} vs {pa:08x?}",
                    diff[0],
                    diff[1],
                    diff[2],
                    fg[0].len(),
                    fg[1].len(),
                    fg[2].len()
                ),
            });
        }
    }
    // The bf16 backward hooks rotate dq and dk back with the rotary tables
    // (max_position_embeddings rows): a sequence past them is refused, not
    // read past the tables' end (fused wgmma store and rope_bwd pass alike).
    {
        let (b, t, h, d) = (1usize, 65usize, 2usize, 64usize);
        let cfg = config(h * d, 32, 1, h, h, t - 1);
        let w = test_weights(&cfg, 5)?;
        let model = GpuLlama::new(gpu, &cfg, &w, None)?;
        let up = |seed: u64| gpu.upload(&bf16_bits(&random_bf16(b * t * h * d, seed, 1.0)));
        let (qd, kd, vd, god) = (up(1311)?, up(1312)?, up(1313)?, up(1314)?);
        for fused in [true, false] {
            out.push(shape_error(
                format!(
                    "attention bwd bf16 hook with T={t} past the model's {} positions (fused store {fused}) -> shape error",
                    t - 1
                ),
                model.attention_backward_bf16_check(&qd, &kd, &vd, &god, (b, t, h, h, d), fused),
            ));
        }
    }
    // A batch x sequence product that wraps (here to 2) is refused, as the
    // CPU model refuses it, not run as a batch of one (head dim 32: the
    // mma.sync attention, which takes the batch as a grid dimension).
    {
        let cfg = config(64, 32, 1, 2, 2, 8);
        let w = test_weights(&cfg, 5)?;
        let mut model = GpuLlama::new(gpu, &cfg, &w, None)?;
        let b = usize::MAX / 2 + 2;
        out.push(shape_error(
            format!("Llama forward of batch {b} x sequence 2 (B x T wraps to 2) on 2 tokens -> shape error"),
            model.forward(&[1, 2], &[2, 3], (b, 2), 1.0, false),
        ));
    }
    // The whole model: loss and every gradient.
    // Widths multiples of 128, as blockwise needs (512: 4 k blocks a 128x128 scale row).
    let cfg = config(512, 1024, 2, 4, 4, 96);
    // B T = 384, a multiple of 128: the block-scaled weight-gradient GEMM reduces over tokens.
    let (b, t) = (4usize, 96usize);
    let w = test_weights(&cfg, 11)?;
    let (toks, tgts) = (test_tokens(1401, b * t), test_tokens(1402, b * t));
    let w64: HashMap<String, Tensor> = w
        .iter()
        .map(|(n, t)| (n.clone(), t.to_dtype(DType::F64)))
        .collect();
    let mut cpu64 = Llama::from_weights(&cfg, w64, None).map_err(nn)?;
    let (loss64, s64) = cpu64.forward(&toks, &tgts, b, t).map_err(nn)?;
    let g64 = cpu64.backward(s64).map_err(nn)?;
    let worst_grad = |got: &[(String, Tensor)]| -> (f64, String) {
        let mut worst = (0f64, String::new());
        for ((name, g), (_, r)) in got.iter().zip(&g64) {
            let e = rel_frobenius_f64(&g.to_f32_vec(), &r.to_f64_vec());
            if e > worst.0 || e.is_nan() {
                worst = (e, name.clone());
            }
        }
        worst
    };
    let grad_scale = 1.0;
    // A NaN planted in block 1's down projection: the loss is NaN, and the
    // checked forward names block 1's MLP.
    {
        let mut wn = w.clone();
        let name = "model.layers.1.mlp.down_proj.weight";
        if let Some(t) = wn.get_mut(name) {
            let mut v = t.to_f32_vec();
            v[7] = f32::NAN;
            *t = Tensor::from_f32(t.shape(), v).map_err(|e| Error::Shape(e.to_string()))?;
        }
        let mut model = GpuLlama::new(gpu, &cfg, &wn, None)?;
        let plain = model.forward(&toks, &tgts, (b, t), grad_scale, false);
        model.check_layers = true;
        let located = model.forward(&toks, &tgts, (b, t), grad_scale, false);
        let ok = matches!(plain, Err(Error::NonFinite))
            && matches!(&located, Err(Error::NonFiniteIn(at)) if at.starts_with("model.layers.1: its MLP"));
        out.push(CaseResult {
            name:
                "Llama with a NaN in layers.1 down_proj: non-finite loss, located in block 1's MLP"
                    .into(),
            pass: ok,
            worst: match located {
                Err(e) => e.to_string(),
                Ok((l, _)) => format!("loss {l}"),
            },
        });
    }
    head_cases(gpu, (&cfg, &w), (&toks, &tgts, b, t), loss64, out)?;
    for recipe_name in ["bf16", "tensorwise", "rowwise", "blockwise", "delayed"] {
        let recipe = match recipe_name {
            "bf16" => None,
            r => Some(octet_fp8::Recipe::from_name(r)?),
        };
        let mut model = GpuLlama::new(gpu, &cfg, &w, recipe)?;
        model.zero_grad()?;
        let (loss, saved) = model.forward(&toks, &tgts, (b, t), grad_scale, true)?;
        let saved = saved.ok_or_else(|| Error::Shape("forward kept nothing".into()))?;
        model.backward(saved)?;
        let (eg, gname) = worst_grad(&model.grads()?);
        let el = (loss - loss64).abs() / loss64;
        // bf16: activations rounded to bf16 at each product input (relative
        // 2^-9 each, about 30 roundings between the loss and the first block):
        // 3% on the worst gradient. FP8: no worse than the CPU's FP8 model
        // (same recipe, f32) is against f64, plus that bf16 allowance.
        let (pass, note) = if let Some(r) = recipe {
            let mut cpu = Llama::from_weights(&cfg, w.clone(), Some(r)).map_err(nn)?;
            let (closs, cs) = cpu.forward(&toks, &tgts, b, t).map_err(nn)?;
            let (ecg, _) = worst_grad(&cpu.backward(cs).map_err(nn)?);
            let ecl = (closs - loss64).abs() / loss64;
            (
                el <= 2.0 * ecl + 2e-3 && eg <= 1.5 * ecg + 3e-2,
                format!(", CPU FP8 model: loss {ecl:.2e}, grad {ecg:.2e}"),
            )
        } else {
            (el <= 2e-3 && eg <= 3e-2, String::new())
        };
        out.push(CaseResult {
            name: format!(
                "Llama {recipe_name} fwd+bwd (C=512, F=1024, 2 blocks, 4 heads, B=4 T=96) vs CPU f64"
            ),
            pass,
            worst: format!("loss {el:.2e}, worst grad {eg:.2e} ({gname}){note}"),
        });
        if recipe_name == "delayed" {
            // Evaluation forwards (keep = false) between steps leave the
            // delayed scales as they were: validation batches used to enter
            // the amax history.
            let other: Vec<u32> = toks
                .iter()
                .map(|&x| (x * 7 + 3) % cfg.vocab_size as u32)
                .collect();
            let run = |evaluate: bool| -> Result<Vec<u32>> {
                let mut m = GpuLlama::new(gpu, &cfg, &w, recipe)?;
                for _ in 0..2 {
                    m.zero_grad()?;
                    let (_, s) = m.forward(&toks, &tgts, (b, t), grad_scale, true)?;
                    m.backward(s.ok_or_else(|| Error::Shape("forward kept nothing".into()))?)?;
                    m.adamw_step(TEST_ADAM)?;
                    if evaluate {
                        m.forward(&other, &tgts, (b, t), grad_scale, false)?;
                    }
                }
                Ok(m.scaling_state()?
                    .iter()
                    .flat_map(|(_, _, st)| st.history().chain([st.scale()]).collect::<Vec<_>>())
                    .map(f32::to_bits)
                    .collect())
            };
            let (plain, evaluated) = (run(false)?, run(true)?);
            let differ = plain.iter().zip(&evaluated).filter(|(a, b)| a != b).count();
            out.push(CaseResult {
                name: "Llama delayed: evaluation forwards between steps leave the amax histories and scales as they were".into(),
                pass: !plain.is_empty() && plain.len() == evaluated.len() && differ == 0,
                worst: format!("{differ} of {} history entries and scales differ", plain.len()),
            });
        }
        if recipe_name == "bf16" || recipe_name == "tensorwise" {
            saved_fp8_cases(gpu, &cfg, &w, (&toks, &tgts, b, t), recipe, out, |g| {
                worst_grad(g).0
            })?;
        }
        if recipe_name == "tensorwise" {
            // The amaxes that the norm, SwiGLU, attention, RoPE and cast kernels
            // compute for the quantizers that read their outputs must be the
            // amax passes' own: the same scales give the same FP8 bytes, so the
            // loss and every gradient are bit-identical with the fusion off.
            let mut plain = GpuLlama::new(gpu, &cfg, &w, recipe)?;
            plain.fuse_amax = false;
            plain.zero_grad()?;
            let (ploss, psaved) = plain.forward(&toks, &tgts, (b, t), grad_scale, true)?;
            plain.backward(psaved.ok_or_else(|| Error::Shape("forward kept nothing".into()))?)?;
            let (fused, unfused) = (model.grads()?, plain.grads()?);
            let differ = differing(&fused, &unfused);
            // One AdamW step (which computes the weights' amaxes while writing
            // their bf16 copies), then the next forward's loss.
            let p = AdamParams {
                lr: 1e-3,
                beta1: 0.9,
                beta2: 0.95,
                eps: 1e-8,
                weight_decay: 0.1,
                grad_clip: 1.0,
            };
            model.adamw_step(p)?;
            plain.adamw_step(p)?;
            let (next, _) = model.forward(&toks, &tgts, (b, t), grad_scale, false)?;
            let (pnext, _) = plain.forward(&toks, &tgts, (b, t), grad_scale, false)?;
            out.push(CaseResult {
                name: "Llama tensorwise: amaxes fused into the producing kernels and AdamW give the bytes of the amax passes".into(),
                pass: ploss.to_bits() == loss.to_bits()
                    && differ == 0
                    && fused.len() == unfused.len()
                    && next.to_bits() == pnext.to_bits(),
                worst: format!(
                    "loss {loss} / {ploss}; {differ} of {} gradients differ; after AdamW {next} / {pnext}",
                    fused.len()
                ),
            });
        }
        if recipe_name == "bf16" {
            // One AdamW step against the formula on the host.
            let before = model.optimizer_state()?;
            let grads = model.grads()?;
            let p = AdamParams {
                lr: 1e-2,
                beta1: 0.9,
                beta2: 0.95,
                eps: 1e-8,
                weight_decay: 0.1,
                grad_clip: 0.5,
            };
            let norm = model.adamw_step(p)?;
            let host_norm = grads
                .iter()
                .flat_map(|(_, g)| g.to_f32_vec())
                .map(|g| (g as f64) * (g as f64))
                .sum::<f64>()
                .sqrt() as f32;
            let clip = if norm > p.grad_clip {
                p.grad_clip / norm
            } else {
                1.0
            };
            let (bc1, bc2) = (1.0 - p.beta1, 1.0 - p.beta2);
            let after = model.optimizer_state()?;
            let mut worst = 0f64;
            for (((w0, _, _), (w1, _, _)), ((_, g), slot)) in before
                .iter()
                .zip(&after)
                .zip(grads.iter().zip(&model.slots))
            {
                let wd = if slot.decay { p.weight_decay } else { 0.0 };
                for ((&a, &bb), &gi) in w0.iter().zip(w1).zip(&g.to_f32_vec()) {
                    let gi = gi * clip;
                    let m = (1.0 - p.beta1) * gi;
                    let v = (1.0 - p.beta2) * gi * gi;
                    let want = a - p.lr * ((m / bc1) / ((v / bc2).sqrt() + p.eps) + wd * a);
                    worst = worst.max(((bb - want) as f64).abs() / (want.abs() as f64).max(1e-3));
                }
            }
            let en = ((norm - host_norm) / host_norm).abs();
            out.push(CaseResult {
                name: "AdamW step on the device (clipping, decay, bias correction) vs host formula"
                    .into(),
                pass: worst <= 1e-5 && en <= 1e-6,
                worst: format!("masters {worst:.2e}, grad norm {en:.2e}"),
            });
        }
    }
    Ok(())
}

/// FP8 saved activations (`SavedActivations::Fp8`) against the full ones,
/// for `recipe` (bf16: `None`; an FP8 recipe also with the `dequantized`
/// backward, where the attention backward reads o's FP8 input): the loss is
/// bit-identical (the forward is the same); the saved bytes are exactly the
/// full model's less what FP8 saves (norm inputs 4 -> 1 byte plus a factor a
/// row, SwiGLU's inputs 2 -> 1 plus a factor a row each, and the bf16
/// attention output where o keeps an E4M3 row-wise copy); and each gradient's
/// error against f64 (`grad_err`, the worst over the parameters) is at most
/// the full model's plus 2^-4: every value the backward reads changed by a
/// relative 2^-4 at most (E4M3's half ulp), and the gradients are linear in
/// each of them, so the perturbation is bounded by that share (the rounding
/// errors are independent, so in practice far less).
pub(super) fn saved_fp8_cases(
    gpu: &Gpu,
    cfg: &crate::llama::LlamaConfig,
    w: &std::collections::HashMap<String, octet_tensor::Tensor>,
    (toks, tgts, b, t): (&[u32], &[u32], usize, usize),
    recipe: Option<octet_fp8::Recipe>,
    out: &mut Vec<CaseResult>,
    grad_err: impl Fn(&[(String, octet_tensor::Tensor)]) -> f64,
) -> Result<()> {
    use crate::llama::cuda::{GpuLlama, SavedActivations};
    type Grads = Vec<(String, octet_tensor::Tensor)>;
    let mut recipes = vec![recipe];
    if let Some(r) = recipe {
        recipes.push(Some(r.with_backward(octet_fp8::BackwardMode::Dequantized)?));
    }
    let grad_scale = 1.0;
    let (n, c, ff) = (b * t, cfg.hidden_size, cfg.intermediate_size);
    let layers = cfg.num_hidden_layers;
    for r in recipes {
        let run = |saved: SavedActivations| -> Result<(f64, usize, Grads)> {
            let mut model = GpuLlama::new(gpu, cfg, w, r)?;
            model.saved_activations = saved;
            model.zero_grad()?;
            let (loss, kept) = model.forward(toks, tgts, (b, t), grad_scale, true)?;
            let kept = kept.ok_or_else(|| Error::Shape("forward kept nothing".into()))?;
            let bytes = kept.bytes();
            model.backward(kept)?;
            Ok((loss, bytes, model.grads()?))
        };
        let (loss_full, bytes_full, g_full) = run(SavedActivations::Full)?;
        let (loss_fp8, bytes_fp8, g_fp8) = run(SavedActivations::Fp8)?;
        let deq = r.is_some_and(|r| r.backward() == octet_fp8::BackwardMode::Dequantized);
        // Norm inputs: 2 a block and the final one; SwiGLU: 2 a block.
        let norm_saving = 3 * n * c - 4 * n;
        let want_saving = (2 * layers + 1) * norm_saving
            + layers * (2 * n * ff - 8 * n)
            + if deq { layers * 2 * n * c } else { 0 };
        let (e_full, e_fp8) = (grad_err(&g_full), grad_err(&g_fp8));
        out.push(CaseResult {
            name: format!(
                "Llama {} {}: FP8 saved activations vs full (same loss bits, exact saved bytes, grads vs f64)",
                r.map_or("bf16".to_string(), |r| r.to_string()),
                if deq { "dequantized" } else { "" }
            ),
            pass: loss_full.to_bits() == loss_fp8.to_bits()
                && bytes_full.checked_sub(bytes_fp8) == Some(want_saving)
                && e_fp8 <= e_full + 0.0625,
            worst: format!(
                "loss {loss_full} / {loss_fp8}; saved {bytes_full} -> {bytes_fp8} B (want -{want_saving}); worst grad vs f64 {e_full:.2e} -> {e_fp8:.2e}"
            ),
        });
    }
    Ok(())
}

/// Activation recomputation (`GpuLlama::set_recompute`): two AdamW steps,
/// each followed by an evaluation forward, of a model that runs each block's
/// forward again in backward equal those of the model that kept every
/// block's activations, bit for bit (losses, then the masters: weights, or
/// adapters in LoRA mode), for every recipe, with FP8 saved activations and
/// with LoRA dropout; and the recomputing model keeps fewer bytes between
/// forward and backward (the block inputs, `4 B T C` a block, plus what the
/// head and final norm keep). Delayed scaling checks that the recomputed
/// amaxes leave the histories as they were; NVFP4 that the stochastic
/// rounding of the gradients keeps its salts; dropout that the masks are
/// drawn again. Sharded with recomputation: `sharded_cases`.
pub(super) fn recompute_cases(gpu: &Gpu, out: &mut Vec<CaseResult>) -> Result<()> {
    use crate::llama::cuda::{GpuLlama, SavedActivations};
    use crate::llama::LoraSpec;
    use crate::lora::{BaseFormat, Compute};
    use octet_fp8::{BackwardMode, Recipe};
    use octet_tensor::{mixed::WeightScaling, Tensor};
    use std::collections::HashMap;
    let (b, t) = (4, 64);
    let (toks, tgts) = (test_tokens(2301, b * t), test_tokens(2302, b * t));
    let p = TEST_ADAM;
    let cfg = test_config(256, 512, 2, 4, 2, 64);
    let w = test_weights(&cfg, 78)?;
    let lora = |compute: Compute, mode: BackwardMode| -> Result<Option<LoraSpec>> {
        Ok(Some(LoraSpec {
            rank: 8,
            alpha: 16.0,
            targets: ["q", "k", "v", "o", "gate", "up", "down"]
                .map(String::from)
                .to_vec(),
            base: BaseFormat::Fp8(WeightScaling::Tensor),
            compute,
            recipe: Recipe::from_name("tensorwise")?.with_backward(mode)?,
            seed: 5,
            dropout: 0.1,
        }))
    };
    let recipe = |name: &str, mode: BackwardMode| -> Result<Option<Recipe>> {
        Ok(Some(Recipe::from_name(name)?.with_backward(mode)?))
    };
    let (full, fp8) = (SavedActivations::Full, SavedActivations::Fp8);
    let (quantized, dequantized) = (BackwardMode::Quantized, BackwardMode::Dequantized);
    // (name, recipe of a full model, saved activations, LoRA spec of a LoRA model)
    let cases = [
        ("bf16", None, full, None),
        ("bf16, FP8 saved", None, fp8, None),
        (
            "tensorwise quantized, FP8 saved",
            recipe("tensorwise", quantized)?,
            fp8,
            None,
        ),
        (
            "tensorwise dequantized, FP8 saved",
            recipe("tensorwise", dequantized)?,
            fp8,
            None,
        ),
        ("delayed", recipe("delayed", quantized)?, full, None),
        ("rowwise", recipe("rowwise", quantized)?, full, None),
        ("blockwise", recipe("blockwise", quantized)?, full, None),
        ("mxfp8", recipe("mxfp8", quantized)?, full, None),
        ("nvfp4", recipe("nvfp4", quantized)?, full, None),
        (
            "LoRA, fp8 base, compute fp8, quantized, dropout 0.1, FP8 saved",
            None,
            fp8,
            lora(Compute::Fp8, quantized)?,
        ),
        (
            "LoRA, fp8 base, compute fp8, dequantized, dropout 0.1",
            None,
            full,
            lora(Compute::Fp8, dequantized)?,
        ),
        (
            "LoRA, fp8 base, compute bf16 (weight-only), high precision, dropout 0.1",
            None,
            full,
            lora(Compute::Bf16, BackwardMode::HighPrecision)?,
        ),
    ];
    for (name, r, saved, lora) in cases {
        // Losses, bytes kept for backward, masters.
        type Run = (Vec<f64>, Vec<usize>, Vec<(String, Tensor)>);
        let run = |recompute: usize| -> Result<Run> {
            let mut model = match &lora {
                Some(spec) => {
                    // Adapters with a non-zero B, so that every adapter gradient carries signal.
                    let mut adapters = HashMap::new();
                    for (i, (pname, shape)) in
                        GpuLlama::adapter_params(&cfg, spec).into_iter().enumerate()
                    {
                        let n: usize = shape.iter().product();
                        let v = random_f32(n, 2400 + i as u64, 0.03);
                        adapters.insert(pname, Tensor::from_f32(&shape, v)?);
                    }
                    GpuLlama::new_lora(gpu, &cfg, &w, spec, Some(&adapters))?
                }
                None => GpuLlama::new(gpu, &cfg, &w, r)?,
            };
            model.saved_activations = saved;
            model.set_recompute(recompute);
            let (mut losses, mut bytes) = (Vec::new(), Vec::new());
            for _ in 0..2 {
                model.zero_grad()?;
                let (loss, kept) = model.forward(&toks, &tgts, (b, t), 1.0, true)?;
                let kept = kept.ok_or_else(|| Error::Shape("forward kept nothing".into()))?;
                bytes.push(kept.bytes());
                model.backward(kept)?;
                model.adamw_step(p)?;
                losses.push(loss);
                losses.push(model.forward(&toks, &tgts, (b, t), 1.0, false)?.0);
            }
            Ok((losses, bytes, model.weights()?))
        };
        let (want, kept_bytes, want_w) = run(0)?;
        // Every block recomputed, and the first of the two only.
        for blocks in [usize::MAX, 1] {
            let (got, again_bytes, got_w) = run(blocks)?;
            let same_l = want.len() == got.len()
                && want
                    .iter()
                    .zip(&got)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
            let same_w = want_w.len() == got_w.len()
                && want_w
                    .iter()
                    .zip(&got_w)
                    .all(|((_, a), (_, b))| f32_bits_equal(&a.to_f32_vec(), &b.to_f32_vec()));
            let fewer = kept_bytes.iter().zip(&again_bytes).all(|(k, a)| a < k);
            out.push(CaseResult {
                name: format!(
                    "recomputation ({name}, {}): 2 AdamW steps and evaluations equal those keeping every block, fewer bytes kept",
                    if blocks == 1 { "first block" } else { "every block" }
                ),
                pass: same_l && same_w && fewer,
                worst: format!(
                    "losses {got:?} vs {want:?}; masters equal: {same_w}; kept {kept_bytes:?} -> {again_bytes:?} B"
                ),
            });
        }
    }
    Ok(())
}

/// `n` token ids below 256, a fixed function of `seed` and the position.
pub(crate) fn test_tokens(seed: u64, n: usize) -> Vec<u32> {
    (0..n)
        .map(|i| (octet_fp8::format::sr_bits(seed, i as u64) % 256) as u32)
        .collect()
}

/// The AdamW settings of the whole-model cases that take optimizer steps.
pub(super) const TEST_ADAM: crate::llama::cuda::AdamParams = crate::llama::cuda::AdamParams {
    lr: 3e-3,
    beta1: 0.9,
    beta2: 0.95,
    eps: 1e-8,
    weight_decay: 0.1,
    grad_clip: 1.0,
};

/// The f32 weights of a random Llama of `cfg` (seed `seed`), by name.
pub(crate) fn test_weights(
    cfg: &crate::llama::LlamaConfig,
    seed: u64,
) -> Result<std::collections::HashMap<String, octet_tensor::Tensor>> {
    Ok(
        crate::llama::Llama::new_random(cfg, octet_tensor::DType::F32, None, seed)
            .map_err(|e| Error::Shape(e.to_string()))?
            .params()
            .into_iter()
            .map(|(n, t)| (n, t.clone()))
            .collect(),
    )
}

/// A byte-vocabulary Llama config of the given width `c`, MLP width `f`,
/// layers `l`, heads `hq` / `hkv` and context `t`, for the GPU model checks.
pub(crate) fn test_config(
    c: usize,
    f: usize,
    l: usize,
    hq: usize,
    hkv: usize,
    t: usize,
) -> crate::llama::LlamaConfig {
    crate::llama::LlamaConfig {
        vocab_size: 256,
        hidden_size: c,
        intermediate_size: f,
        num_hidden_layers: l,
        num_attention_heads: hq,
        num_key_value_heads: hkv,
        max_position_embeddings: t,
        rms_norm_eps: 1e-5,
        rope_theta: 10000.0,
        tie_word_embeddings: false,
        rope_scaling: None,
        head_dim: None,
        qkv_bias: false,
        o_bias: false,
        qk_norm: false,
    }
}

/// The fused LM head and loss in chunks of 7 rows (384 rows: 55 chunks, the
/// last of 6) with every third target masked, against the CPU model in f64
/// on the same masked targets (`loss64`: the unmasked f64 loss), with the
/// bf16 tolerances of the whole-model case. Masked rows add neither loss nor
/// gradient, and the mean is over the counted rows, as the CPU's (and
/// PyTorch's `ignore_index`).
fn head_cases(
    gpu: &Gpu,
    (cfg, w): (
        &crate::llama::LlamaConfig,
        &std::collections::HashMap<String, octet_tensor::Tensor>,
    ),
    (toks, tgts, b, t): (&[u32], &[u32], usize, usize),
    loss64: f64,
    out: &mut Vec<CaseResult>,
) -> Result<()> {
    use crate::llama::cuda::GpuLlama;
    use crate::llama::Llama;
    use octet_tensor::{DType, Tensor};
    use std::collections::HashMap;
    let nn = |e: crate::Error| Error::Shape(e.to_string());
    let masked: Vec<u32> = tgts
        .iter()
        .enumerate()
        .map(|(i, &x)| if i % 3 == 1 { crate::loss::IGNORE } else { x })
        .collect();
    let w64: HashMap<String, Tensor> = w
        .iter()
        .map(|(n, t)| (n.clone(), t.to_dtype(DType::F64)))
        .collect();
    let mut cpu = Llama::from_weights(cfg, w64, None).map_err(nn)?;
    let (mloss64, ms) = cpu.forward(toks, &masked, b, t).map_err(nn)?;
    let mg64 = cpu.backward(ms).map_err(nn)?;
    let mut model = GpuLlama::new(gpu, cfg, w, None)?;
    model.head_chunk = 7 * cfg.vocab_size;
    model.zero_grad()?;
    let (loss, saved) = model.forward(toks, &masked, (b, t), 1.0, true)?;
    model.backward(saved.ok_or_else(|| Error::Shape("forward kept nothing".into()))?)?;
    let mut worst = (0f64, String::new());
    for ((name, g), (_, r)) in model.grads()?.iter().zip(&mg64) {
        let e = rel_frobenius_f64(&g.to_f32_vec(), &r.to_f64_vec());
        if e > worst.0 || e.is_nan() {
            worst = (e, name.clone());
        }
    }
    let el = (loss - mloss64).abs() / mloss64;
    // The unmasked loss differs: the mask is not ignored.
    let unmasked = (loss64 - mloss64).abs() / mloss64;
    out.push(CaseResult {
        name: "Llama bf16 fwd+bwd, LM head + loss in 55 chunks of 7 rows, every third target masked, vs CPU f64".into(),
        pass: el <= 2e-3 && worst.0 <= 3e-2 && unmasked > 1e-4,
        worst: format!(
            "loss {el:.2e}, worst grad {:.2e} ({}); masked and unmasked losses differ by {unmasked:.2e}",
            worst.0, worst.1
        ),
    });
    Ok(())
}

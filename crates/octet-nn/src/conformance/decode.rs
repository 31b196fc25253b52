//! The KV-cache decoder on the GPU against the CPU decoder: logits, sampling and
//! whole generations.

use super::*;

/// GPU decoding of a tiny random model against the CPU decoder with the same
/// stored weights (the same FP8 codes, or bf16): the GPU rounds the inputs of
/// its products to bf16, so logits agree to the bf16 activation error, not
/// bit for bit. Floor: 30 dB SQNR over the decoded tokens' logits (measured
/// values are printed). Two models: the tiny one (head dim 8, fewer lanes
/// than a warp) for 48 of its 64 positions, the small one (head dim 32) for
/// 200, past the attention kernel's 8-warp stride many times over.
pub(super) fn decode_cases(gpu: &Gpu, out: &mut Vec<CaseResult>) -> Result<()> {
    for (preset, steps) in [("tiny", 48u32), ("small", 200)] {
        decode_model_cases(gpu, preset, None, steps, out)?;
    }
    // The families on the small model, with random biases and q/k norm
    // gains: Qwen2's q/k/v biases with an o bias, Qwen3's q/k norms with a
    // head width of its own (64 at 4 heads of a 128-wide model).
    let small =
        crate::llama::LlamaConfig::preset("small").map_err(|e| Error::Shape(e.to_string()))?;
    for (what, cfg) in [
        (
            "small model with q/k/v/o biases",
            crate::llama::LlamaConfig {
                qkv_bias: true,
                o_bias: true,
                ..small.clone()
            },
        ),
        (
            "small model with q/k norms and head_dim 64",
            crate::llama::LlamaConfig {
                qk_norm: true,
                head_dim: Some(64),
                ..small.clone()
            },
        ),
    ] {
        decode_config_cases(gpu, what, cfg, 100, out)?;
    }
    // Llama 3's RoPE scaling, stretched so that 200 positions turn most of
    // the small model's 16 frequencies differently from plain RoPE: the GPU
    // decoder's rotary tables must follow the CPU's.
    let llama3 = crate::llama::RopeScaling {
        rope_type: "llama3".into(),
        factor: Some(8.0),
        low_freq_factor: Some(1.0),
        high_freq_factor: Some(8.0),
        original_max_position_embeddings: Some(64),
    };
    decode_model_cases(gpu, "small", Some(llama3), 200, out)
}

pub(super) fn decode_model_cases(
    gpu: &Gpu,
    preset: &str,
    rope_scaling: Option<crate::llama::RopeScaling>,
    steps: u32,
    out: &mut Vec<CaseResult>,
) -> Result<()> {
    use crate::llama::LlamaConfig;
    let shape = |e: crate::Error| Error::Shape(e.to_string());
    let scaled = rope_scaling.is_some();
    let cfg = LlamaConfig {
        rope_scaling,
        ..LlamaConfig::preset(preset).map_err(shape)?
    };
    let preset = if scaled {
        format!("{preset} model (llama3 RoPE scaling)")
    } else {
        format!("{preset} model")
    };
    decode_config_cases(gpu, &preset, cfg, steps, out)
}

/// [`decode_model_cases`] on the model `cfg` (named `preset` in the cases),
/// random weights with random biases and q/k norm gains where it has them.
fn decode_config_cases(
    gpu: &Gpu,
    preset: &str,
    cfg: crate::llama::LlamaConfig,
    steps: u32,
    out: &mut Vec<CaseResult>,
) -> Result<()> {
    use crate::decode::cuda::{GpuDecoder, GpuWeights};
    use crate::decode::{DecodeModel, WeightStorage};
    use crate::llama::Llama;
    let shape = |e: crate::Error| Error::Shape(e.to_string());
    cfg.validate().map_err(shape)?;
    let model = Llama::new_random(&cfg, octet_tensor::DType::F32, None, 17).map_err(shape)?;
    let w = perturbed(
        model
            .params()
            .into_iter()
            .map(|(n, t)| (n, t.clone()))
            .collect(),
        1701,
    )?;
    let tokens: Vec<u32> = (0..steps).map(|i| (i * 37 + 11) % 256).collect();
    for (label, gw, cw) in [
        (
            "fp8 e4m3 per-channel",
            GpuWeights::Fp8(Format::E4M3, octet_tensor::mixed::WeightScaling::Channel),
            "fp8",
        ),
        ("bf16", GpuWeights::Bf16, "bf16"),
    ] {
        let mut cpu = DecodeModel::new(&cfg, &w, WeightStorage::from_name(cw).map_err(shape)?)
            .map_err(shape)?;
        let want = cpu.forward(&tokens).map_err(shape)?;
        let mut dec = GpuDecoder::new(gpu, &cfg, &w, gw)?;
        let mut got = Vec::new();
        for &t in &tokens {
            got.extend(dec.step(t)?);
        }
        let sqnr = logits_sqnr(&got, &want);
        out.push(CaseResult {
            name: format!("decode {preset}, {label} weights, {steps} tokens vs CPU decoder"),
            pass: sqnr >= 30.0 && got.iter().all(|v| v.is_finite()),
            worst: format!("logits SQNR {sqnr:.1} dB"),
        });
        // Two prefills (the second starting after the first's positions),
        // then steps: the last logits of each prefill and every step's
        // against the CPU's rows of the same tokens.
        let v = cfg.vocab_size;
        let (p1, p2) = (steps as usize / 4, steps as usize / 2);
        let mut pre = GpuDecoder::new(gpu, &cfg, &w, gw)?;
        let mut pgot = pre.prefill(&tokens[..p1])?;
        let mut want_rows = want[(p1 - 1) * v..p1 * v].to_vec();
        pgot.extend(pre.prefill(&tokens[p1..p2])?);
        want_rows.extend_from_slice(&want[(p2 - 1) * v..p2 * v]);
        for &t in &tokens[p2..] {
            pgot.extend(pre.step(t)?);
        }
        want_rows.extend_from_slice(&want[p2 * v..]);
        let sqnr = logits_sqnr(&pgot, &want_rows);
        out.push(CaseResult {
            name: format!(
                "decode {preset}, {label}: prefill {p1} + {} tokens, then steps, vs CPU decoder",
                p2 - p1
            ),
            pass: sqnr >= 30.0 && pgot.iter().all(|v| v.is_finite()),
            worst: format!("logits SQNR {sqnr:.1} dB"),
        });
        // Past the cache, and no tokens: errors, and the cache is kept.
        let full = pre.prefill(&vec![1; cfg.max_position_embeddings]);
        let empty = pre.prefill(&[]);
        out.push(CaseResult {
            name: format!(
                "decode {preset}, {label}: prefill past the cache or of nothing -> shape errors"
            ),
            pass: matches!(full, Err(Error::Shape(_))) && matches!(empty, Err(Error::Shape(_))),
            worst: format!(
                "{:?} / {:?}",
                full.err().map(|e| e.to_string()),
                empty.err().map(|e| e.to_string())
            ),
        });
        // The captured CUDA graph replays exactly the eager launches.
        let mut eager = GpuDecoder::new(gpu, &cfg, &w, gw)?;
        eager.set_graphs(false);
        let mut e = Vec::new();
        for &t in &tokens {
            e.extend(eager.step(t)?);
        }
        let same = e.iter().zip(&got).all(|(a, b)| a.to_bits() == b.to_bits());
        out.push(CaseResult {
            name: format!("decode {preset}, {label}: CUDA graph replay == eager launches"),
            pass: same && e.len() == got.len(),
            worst: if same {
                "bit-identical".into()
            } else {
                "logits differ".into()
            },
        });
        generate_cases(gpu, preset, label, (&cfg, &w, gw), &tokens, out)?;
    }
    sample_cases(gpu, preset, &cfg, &w, out)
}

/// How far `u` is from the nearest running share at which the host's
/// `sample` changes its pick (infinite when greedy): a pick of the device
/// may differ from the host's only within the last bits of an exponential.
pub(super) fn sample_margin(logits: &[f32], temperature: f32, top_k: usize, u: f64) -> f64 {
    let (_, shares) = crate::decode::sample_shares(logits, temperature, top_k);
    shares.map_or(f64::INFINITY, |sh| {
        sh.iter()
            .map(|&acc| (u - acc).abs())
            .fold(f64::INFINITY, f64::min)
    })
}

/// The sampling settings the device sampler is checked under:
/// (temperature, top_k).
pub(super) const SAMPLINGS: [(f32, usize); 6] = [
    (0.0, 40),
    (0.8, 40),
    (1.0, 0),
    (0.7, 1),
    (2.0, 100_000),
    (0.3, 3),
];

/// `sample_token` against the host's `sample` on logits of several kinds
/// (random, with ties, with both zeros, one huge, V not a power of two, V
/// = 1), every setting of `SAMPLINGS`, 64 uniforms each. The picks must be
/// equal unless the uniform lies within 1e-12 of a boundary of the host's
/// running shares (the two `exp`s may differ in the last bit, 1e-16).
pub(super) fn sample_cases(
    gpu: &Gpu,
    preset: &str,
    cfg: &crate::llama::LlamaConfig,
    w: &std::collections::HashMap<String, octet_tensor::Tensor>,
    out: &mut Vec<CaseResult>,
) -> Result<()> {
    use crate::decode::cuda::{GpuDecoder, GpuWeights};
    use crate::decode::sample;
    let mut dec = GpuDecoder::new(gpu, cfg, w, GpuWeights::Bf16)?;
    let v = cfg.vocab_size.min(crate::decode::cuda::SAMPLE_MAX);
    let random = random_f32(v, 901, 4.0);
    let ties: Vec<f32> = random.iter().map(|x| (x * 2.0).round() / 2.0).collect();
    let mut zeros = vec![-1.0f32; v];
    for (i, z) in zeros.iter_mut().enumerate().take(8) {
        *z = if i % 2 == 0 { 0.0 } else { -0.0 };
    }
    let mut huge = random.clone();
    huge[v / 3] = 1e30;
    let odd = random_f32(v - v / 5, 902, 10.0);
    let kinds: [(&str, Vec<f32>); 6] = [
        ("random", random.clone()),
        ("ties", ties),
        ("+-0", zeros),
        ("one huge", huge),
        ("V not a power of 2", odd),
        ("V = 1", vec![0.5]),
    ];
    for (kind, logits) in kinds {
        let (mut worst, mut bad, mut near) = (String::from("all equal"), 0, 0);
        for &(t, k) in &SAMPLINGS {
            for i in 0..64u64 {
                let u = octet_fp8::format::sr_bits(903 + i, t.to_bits() as u64 ^ k as u64) as f64
                    / 4_294_967_296.0;
                let want = sample(&logits, t, k, u);
                let got = dec.sample_alone(&logits, t, k, u)?;
                if got != want {
                    if sample_margin(&logits, t, k, u) < 1e-12 {
                        near += 1;
                    } else {
                        bad += 1;
                        worst = format!("T {t} k {k} u {u}: device {got}, host {want}");
                    }
                }
            }
        }
        out.push(CaseResult {
            name: format!(
                "sample on the device ({preset}, {kind} logits, {} settings x 64 uniforms) == host sample",
                SAMPLINGS.len()
            ),
            pass: bad == 0,
            worst: format!("{bad} differ, {near} within 1e-12 of a boundary; {worst}"),
        });
    }
    // An inf or NaN logit anywhere in the row: an error, not a token.
    let mut refused = 0;
    for (i, x) in [
        (0, f32::NAN),
        (v / 2, f32::INFINITY),
        (v - 1, f32::NEG_INFINITY),
    ] {
        let mut logits = random.clone();
        logits[i] = x;
        for &(t, k) in &SAMPLINGS {
            if let Err(Error::NonFiniteLogits { step: 0 }) = dec.sample_alone(&logits, t, k, 0.5) {
                refused += 1;
            }
        }
    }
    out.push(CaseResult {
        name: format!("sample on the device ({preset}): a NaN, +inf or -inf logit is refused"),
        pass: refused == 3 * SAMPLINGS.len(),
        worst: format!("{refused} of {} refused", 3 * SAMPLINGS.len()),
    });
    // `cfg` is public, the cache and buffers are not: a larger
    // max_position_embeddings would let steps write past the KV cache. Step
    // 0 itself stays inside it, so the case is safe even unrefused.
    dec.cfg.max_position_embeddings += 1;
    out.push(shape_error(
        format!("decoder step after cfg.max_position_embeddings changed ({preset}) -> shape error"),
        dec.step(0),
    ));
    dec.cfg.max_position_embeddings -= 1;
    // Weights unlike `cfg`: a final norm of half the width and an embedding
    // of half the vocabulary. The kernels index them by `cfg` (the norm's
    // weight up to C, the embedding up to token V - 1), past their ends.
    let c = cfg.hidden_size;
    for (name, shape) in [
        ("model.norm.weight", vec![c / 2]),
        ("model.embed_tokens.weight", vec![cfg.vocab_size / 2, c]),
    ] {
        let mut bad = w.clone();
        let n = shape.iter().product();
        let t = octet_tensor::Tensor::from_f32(&shape, vec![0.5; n])
            .map_err(|e| Error::Shape(e.to_string()))?;
        bad.insert(name.into(), t);
        out.push(shape_error(
            format!(
                "decoder of weights unlike the config ({preset}, {name} {shape:?}) -> shape error"
            ),
            GpuDecoder::new(gpu, cfg, &bad, GpuWeights::Bf16).map(|_| ()),
        ));
    }
    Ok(())
}

/// `GpuDecoder::generate` (steps queued, sampling on the device) against
/// steps whose logits the host samples, same uniforms, after a prefill of a
/// quarter of `tokens`: the same tokens (up to the margin of `sample_cases`).
pub(super) fn generate_cases(
    gpu: &Gpu,
    preset: &str,
    label: &str,
    (cfg, w, gw): (
        &crate::llama::LlamaConfig,
        &std::collections::HashMap<String, octet_tensor::Tensor>,
        crate::decode::cuda::GpuWeights,
    ),
    tokens: &[u32],
    out: &mut Vec<CaseResult>,
) -> Result<()> {
    use crate::decode::cuda::GpuDecoder;
    use crate::decode::sample;
    let p = tokens.len() / 4;
    let n = tokens.len() - p;
    for &(t, k) in &SAMPLINGS[..3] {
        let u: Vec<f64> = (0..n)
            .map(|i| {
                octet_fp8::format::sr_bits(977, i as u64 ^ t.to_bits() as u64) as f64
                    / 4_294_967_296.0
            })
            .collect();
        let mut host = GpuDecoder::new(gpu, cfg, w, gw)?;
        let mut last = host.prefill(&tokens[..p])?;
        let first = sample(&last, t, k, 0.5);
        let (mut want, mut margin, mut next) = (Vec::new(), f64::INFINITY, first);
        for &ui in &u {
            last = host.step(next)?;
            margin = margin.min(sample_margin(&last, t, k, ui));
            next = sample(&last, t, k, ui);
            want.push(next);
        }
        let mut dev = GpuDecoder::new(gpu, cfg, w, gw)?;
        dev.prefill(&tokens[..p])?;
        let mut seen = Vec::new();
        let got = dev.generate(first, &u, t, k, |c| seen.extend_from_slice(c))?;
        // The cache ends where the host's did: one more step agrees too.
        let after_host = host.step(1)?;
        let after_dev = dev.step(1)?;
        let same = got == want && seen == got;
        let tail = after_host
            .iter()
            .zip(&after_dev)
            .all(|(a, b)| a.to_bits() == b.to_bits());
        let first_diff = got.iter().zip(&want).position(|(a, b)| a != b);
        out.push(CaseResult {
            name: format!(
                "decode {preset}, {label}: generate {n} tokens on the device (T {t}, top-k {k}) == host sampling of step logits"
            ),
            pass: (same || margin < 1e-12) && tail,
            worst: format!(
                "{} tokens, first difference at {first_diff:?}, smallest margin {margin:.1e}, next step's logits {}",
                got.len(),
                if tail { "bit-identical" } else { "differ" }
            ),
        });
    }
    Ok(())
}

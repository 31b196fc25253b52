//! LoRA on a frozen FP8 base against an f64 reference from the dequantized base.

use octet_fp8::tolerance::sqnr_db;
use octet_fp8::{BackwardMode, Recipe};
use octet_nn::lora::{Adapter, Base, BaseFormat, Compute, Dropout, LoraLinear};
use octet_tensor::mixed::WeightScaling;
use octet_tensor::{cpu, DType, Tensor};
use rand::{Rng, SeedableRng};
use rand_distr::StandardNormal;

fn gaussian(n: usize, seed: u64, std: f32) -> Vec<f32> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..n)
        .map(|_| rng.sample::<f32, _>(StandardNormal) * std)
        .collect()
}

struct Case {
    m: usize,
    k: usize,
    n: usize,
    r: usize,
    x: Tensor,
    dy: Tensor,
    w: Tensor,
    adapter: Adapter,
}

fn case(m: usize, k: usize, n: usize, r: usize, seed: u64) -> Case {
    let mut adapter = Adapter::init(n, k, r, 2.0 * r as f64, seed).unwrap();
    // A trained-looking B (the initial B is zero, which would hide its gradient path).
    adapter.b = Tensor::from_f32(&[n, r], gaussian(n * r, seed + 9, 0.05)).unwrap();
    Case {
        m,
        k,
        n,
        r,
        x: Tensor::from_f32(&[m, k], gaussian(m * k, seed, 1.0)).unwrap(),
        dy: Tensor::from_f32(&[m, n], gaussian(m * n, seed + 1, 1e-2)).unwrap(),
        w: Tensor::from_f32(&[n, k], gaussian(n * k, seed + 2, 1.0 / (k as f32).sqrt())).unwrap(),
        adapter,
    }
}

fn recipe(mode: BackwardMode) -> Recipe {
    Recipe::from_name("tensorwise")
        .unwrap()
        .with_backward(mode)
        .unwrap()
}

/// f64 reference: y, dx, dA, dB from the dequantized base `wd` and the given `x`.
fn reference(c: &Case, wd: &[f32], x: &[f32]) -> [Vec<f64>; 4] {
    let (m, k, n, r) = (c.m, c.k, c.n, c.r);
    let (a, b) = (c.adapter.a.to_f64_vec(), c.adapter.b.to_f64_vec());
    let s = c.adapter.scale();
    let dy = c.dy.to_f64_vec();
    let xv: Vec<f64> = x.iter().map(|&v| v as f64).collect();
    let mut h = vec![0f64; m * r];
    for i in 0..m {
        for j in 0..r {
            h[i * r + j] = (0..k).map(|p| xv[i * k + p] * a[j * k + p]).sum();
        }
    }
    let mut y = vec![0f64; m * n];
    for i in 0..m {
        for j in 0..n {
            let base: f64 = (0..k).map(|p| xv[i * k + p] * wd[j * k + p] as f64).sum();
            let ad: f64 = (0..r).map(|q| h[i * r + q] * b[j * r + q]).sum();
            y[i * n + j] = base + s * ad;
        }
    }
    let mut dh = vec![0f64; m * r];
    for i in 0..m {
        for q in 0..r {
            dh[i * r + q] = s * (0..n).map(|j| dy[i * n + j] * b[j * r + q]).sum::<f64>();
        }
    }
    let mut db = vec![0f64; n * r];
    for j in 0..n {
        for q in 0..r {
            db[j * r + q] = s * (0..m).map(|i| dy[i * n + j] * h[i * r + q]).sum::<f64>();
        }
    }
    let mut da = vec![0f64; r * k];
    for q in 0..r {
        for p in 0..k {
            da[q * k + p] = (0..m).map(|i| dh[i * r + q] * xv[i * k + p]).sum();
        }
    }
    let mut dx = vec![0f64; m * k];
    for i in 0..m {
        for p in 0..k {
            let base: f64 = (0..n).map(|j| dy[i * n + j] * wd[j * k + p] as f64).sum();
            let ad: f64 = (0..r).map(|q| dh[i * r + q] * a[q * k + p]).sum();
            dx[i * k + p] = base + ad;
        }
    }
    [y, dx, da, db]
}

fn f64s(t: &Tensor) -> Vec<f64> {
    t.to_f64_vec()
}

#[test]
fn adapter_gradients_match_the_reference_from_the_dequantized_base() {
    let c = case(24, 160, 96, 8, 11);
    let formats = [
        BaseFormat::Fp8(WeightScaling::Tensor),
        BaseFormat::Fp8(WeightScaling::Channel),
        BaseFormat::Fp8(WeightScaling::Block128),
        BaseFormat::Bf16,
    ];
    for format in formats {
        for compute in [Compute::Bf16, Compute::Fp8] {
            for mode in BackwardMode::ALL {
                let base = Base::new(&c.w, format).unwrap();
                let wd = base.dequantize().unwrap().to_f32_vec();
                let l = LoraLinear::new(base, Some(c.adapter.clone()), compute, recipe(mode));
                let Ok(mut l) = l else {
                    // Only the quantized backward on a non-per-tensor base (or bf16 compute) is refused.
                    assert_eq!(
                        mode,
                        BackwardMode::Quantized,
                        "{format:?} {compute:?} {mode:?}"
                    );
                    continue;
                };
                let label = format!("{format:?} {compute:?} {mode:?}");
                let (y, saved) = l.forward(&c.x, true).unwrap();
                let g = l.backward(saved, &c.dy).unwrap();
                let [ry, rdx, rda, rdb] = reference(&c, &wd, &c.x.to_f32_vec());
                // FP8 compute quantizes the input (E4M3: ~30 dB); bf16 compute is exact up to f32 sums.
                let (fy, fa) = match (compute, mode) {
                    (Compute::Fp8, _) => (25.0, 25.0),
                    (Compute::Bf16, BackwardMode::Dequantized) => (100.0, 25.0),
                    _ => (100.0, 100.0),
                };
                let fx = if mode == BackwardMode::Quantized {
                    20.0
                } else {
                    90.0
                };
                assert!(
                    sqnr_db(&f64s(&y), &ry) > fy,
                    "{label}: y {:.1} dB",
                    sqnr_db(&f64s(&y), &ry)
                );
                let dx = g.d_input.unwrap();
                assert!(
                    sqnr_db(&f64s(&dx), &rdx) > fx,
                    "{label}: dx {:.1} dB",
                    sqnr_db(&f64s(&dx), &rdx)
                );
                let da = g.d_a.unwrap();
                assert!(
                    sqnr_db(&f64s(&da), &rda) > fa,
                    "{label}: dA {:.1} dB",
                    sqnr_db(&f64s(&da), &rda)
                );
                // dB reads only dy and h = x A^T (always from the unquantized x).
                let db = g.d_b.unwrap();
                assert!(
                    sqnr_db(&f64s(&db), &rdb) > 100.0,
                    "{label}: dB {:.1} dB",
                    sqnr_db(&f64s(&db), &rdb)
                );
            }
        }
    }
}

#[test]
fn the_dequantized_backward_is_exactly_the_math_on_the_saved_fp8_input() {
    // dA = dh^T @ dequant(x_fp8) bit for bit, with the same f32 GEMM.
    let c = case(16, 128, 48, 4, 21);
    let base = Base::new(&c.w, BaseFormat::Fp8(WeightScaling::Tensor)).unwrap();
    let mut l = LoraLinear::new(
        base,
        Some(c.adapter.clone()),
        Compute::Bf16,
        recipe(BackwardMode::Dequantized),
    )
    .unwrap();
    let (_, saved) = l.forward(&c.x, false).unwrap();
    let g = l.backward(saved, &c.dy).unwrap();
    let rec = recipe(BackwardMode::Dequantized);
    let spec = rec
        .spec(octet_fp8::Role::Input, octet_fp8::Layout::Rowwise, None, 0)
        .unwrap();
    let qx = cpu::quantize(&c.x, &spec, &spec, octet_fp8::Usage::ROW, None).unwrap();
    let xd = Tensor::from_f32(&[c.m, c.k], qx.dequantize().unwrap()).unwrap();
    let s = c.adapter.scale() as f32;
    let dh = cpu::matmul(&c.dy, false, &c.adapter.b, false, DType::F32).unwrap();
    let dh = Tensor::from_f32(
        &[c.m, c.r],
        dh.to_f32_vec().iter().map(|&v| v * s).collect(),
    )
    .unwrap();
    let want = cpu::matmul(&dh, true, &xd, false, DType::F32).unwrap();
    assert_eq!(g.d_a.unwrap().to_f32_vec(), want.to_f32_vec());
    assert!(g.d_input.is_none(), "no input gradient was asked for");
}

#[test]
fn saved_bytes_are_exact_and_the_base_saves_nothing() {
    let c = case(32, 192, 64, 8, 31);
    let fp8 = BaseFormat::Fp8(WeightScaling::Channel);
    for (mode, x_bytes) in [
        (BackwardMode::Dequantized, c.m * c.k + 4), // FP8 codes + one f32 scale
        (BackwardMode::HighPrecision, 4 * c.m * c.k),
    ] {
        for compute in [Compute::Bf16, Compute::Fp8] {
            let base = Base::new(&c.w, fp8).unwrap();
            let mut l =
                LoraLinear::new(base, Some(c.adapter.clone()), compute, recipe(mode)).unwrap();
            let (_, saved) = l.forward(&c.x, true).unwrap();
            assert_eq!(
                saved.bytes(),
                x_bytes + 4 * c.m * c.r,
                "{mode:?} {compute:?}"
            );
        }
    }
    // A frozen layer without adapter keeps nothing at all, and still gives d_input.
    let base = Base::new(&c.w, fp8).unwrap();
    let mut l =
        LoraLinear::new(base, None, Compute::Bf16, recipe(BackwardMode::Dequantized)).unwrap();
    let (_, saved) = l.forward(&c.x, true).unwrap();
    assert_eq!(saved.bytes(), 0);
    let g = l.backward(saved, &c.dy).unwrap();
    assert!(g.d_input.is_some() && g.d_a.is_none() && g.d_b.is_none());
    // The FP8 base: codes + scales, at most 0.52x the bf16 base.
    for s in [
        WeightScaling::Tensor,
        WeightScaling::Channel,
        WeightScaling::Block128,
    ] {
        let f = Base::new(&c.w, BaseFormat::Fp8(s)).unwrap().bytes();
        let b = Base::new(&c.w, BaseFormat::Bf16).unwrap().bytes();
        assert_eq!(b, 2 * c.n * c.k);
        assert!(f as f64 <= 0.52 * b as f64, "{s:?}: {f} vs bf16 {b}");
    }
}

#[test]
fn the_merged_weight_reproduces_base_plus_adapter() {
    let c = case(10, 144, 40, 4, 41);
    let base = Base::new(&c.w, BaseFormat::Fp8(WeightScaling::Channel)).unwrap();
    let mut l = LoraLinear::new(
        base,
        Some(c.adapter.clone()),
        Compute::Bf16,
        recipe(BackwardMode::HighPrecision),
    )
    .unwrap();
    let (y, _) = l.forward(&c.x, false).unwrap();
    let merged = l.merged().unwrap();
    let y2 = cpu::matmul(&c.x, false, &merged, true, DType::F32).unwrap();
    let s = sqnr_db(&f64s(&y2), &f64s(&y));
    assert!(s > 100.0, "merged vs adapted: {s:.1} dB");
}

#[test]
fn bad_input_is_an_error() {
    let c = case(4, 64, 32, 4, 51);
    let chan = || Base::new(&c.w, BaseFormat::Fp8(WeightScaling::Channel)).unwrap();
    let e =
        LoraLinear::new(chan(), None, Compute::Fp8, recipe(BackwardMode::Quantized)).unwrap_err();
    assert!(e.to_string().contains("per-tensor"), "{e}");
    let delayed = Recipe::from_name("delayed").unwrap();
    assert!(LoraLinear::new(chan(), None, Compute::Fp8, delayed).is_err());
    let wrong = Adapter::init(32, 63, 4, 8.0, 1).unwrap();
    assert!(LoraLinear::new(
        chan(),
        Some(wrong),
        Compute::Bf16,
        recipe(BackwardMode::Dequantized)
    )
    .is_err());
    assert!(Adapter::init(32, 64, 0, 8.0, 1).is_err());
    assert!(BaseFormat::from_name("fp8-mx").is_err());
    assert!(Compute::from_name("int8").is_err());
    let mut l = LoraLinear::new(
        chan(),
        None,
        Compute::Bf16,
        recipe(BackwardMode::Dequantized),
    )
    .unwrap();
    let x = Tensor::from_f32(&[4, 63], vec![1.0; 4 * 63]).unwrap();
    assert!(l.forward(&x, true).is_err());
}

#[test]
fn model_adapter_gradients_follow_the_chain_rule_of_the_merged_model() {
    // y = x (W + s B A)^T: with G the full model's gradient for the merged
    // weight, dA = s B^T G and dB = s G A^T. A bf16-exact base in bf16
    // storage, bf16 compute and the high-precision backward make both models
    // the same function up to f32 rounding.
    use octet_nn::llama::{Llama, LlamaConfig, LoraSpec};
    use std::collections::HashMap;
    let cfg = LlamaConfig::preset("tiny").unwrap();
    let mut base = Llama::new_random(&cfg, DType::F32, None, 7).unwrap();
    for (_, t) in base.params_mut() {
        *t = t.to_dtype(DType::Bf16).to_dtype(DType::F32);
    }
    let spec = LoraSpec {
        rank: 4,
        alpha: 8.0,
        targets: vec!["q".into(), "v".into(), "down".into()],
        base: BaseFormat::Bf16,
        compute: Compute::Bf16,
        recipe: recipe(BackwardMode::HighPrecision),
        seed: 3,
        dropout: 0.0,
    };
    let mut lora = base.clone().into_lora(&spec).unwrap();
    let mut seed = 100;
    for (name, t) in lora.params_mut() {
        if name.ends_with("lora_B.weight") {
            seed += 1;
            *t = Tensor::from_f32(t.shape(), gaussian(t.numel(), seed, 0.05)).unwrap();
        }
    }
    let names: Vec<String> = lora.params().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names.len(), 2 * 3 * cfg.num_hidden_layers);
    assert!(names[0].starts_with("base_model.model.model.layers.0.self_attn.q_proj.lora_A"));
    let merged: HashMap<String, Tensor> = lora.merged_weights().unwrap().into_iter().collect();
    let mut full = Llama::from_weights(&cfg, merged, None).unwrap();
    let (b, t) = (2, 16);
    let tokens: Vec<u32> = (0..b * t).map(|i| (i as u32 * 29 + 3) % 256).collect();
    let targets: Vec<u32> = (0..b * t).map(|i| (i as u32 * 17 + 11) % 256).collect();
    let (l1, s1) = lora.forward(&tokens, &targets, b, t).unwrap();
    let (l2, s2) = full.forward(&tokens, &targets, b, t).unwrap();
    assert!(
        (l1 - l2).abs() < 1e-5 * l2.abs(),
        "loss {l1} vs merged {l2}"
    );
    let g_lora: HashMap<String, Tensor> = lora.backward(s1).unwrap().into_iter().collect();
    let g_full: HashMap<String, Tensor> = full.backward(s2).unwrap().into_iter().collect();
    let params: HashMap<String, Tensor> = lora
        .params()
        .into_iter()
        .map(|(n, t)| (n, t.clone()))
        .collect();
    let s = spec.alpha as f32 / spec.rank as f32;
    for i in 0..cfg.num_hidden_layers {
        for module in ["self_attn.q_proj", "self_attn.v_proj", "mlp.down_proj"] {
            let p = format!("base_model.model.model.layers.{i}.{module}");
            let (a, bm) = (
                &params[&format!("{p}.lora_A.weight")],
                &params[&format!("{p}.lora_B.weight")],
            );
            let g = &g_full[&format!("model.layers.{i}.{module}.weight")];
            let scale = |t: Tensor| {
                Tensor::from_f32(t.shape(), t.to_f32_vec().iter().map(|v| v * s).collect()).unwrap()
            };
            let want_a = scale(cpu::matmul(bm, true, g, false, DType::F32).unwrap());
            let want_b = scale(cpu::matmul(g, false, a, true, DType::F32).unwrap());
            let ga = sqnr_db(
                &f64s(&g_lora[&format!("{p}.lora_A.weight")]),
                &f64s(&want_a),
            );
            let gb = sqnr_db(
                &f64s(&g_lora[&format!("{p}.lora_B.weight")]),
                &f64s(&want_b),
            );
            assert!(ga > 80.0 && gb > 80.0, "{p}: dA {ga:.1} dB, dB {gb:.1} dB");
        }
    }
    // Frozen: the base holds no trainable tensor, the model reports bf16 matrix bytes.
    assert_eq!(lora.matrix_bytes() * 2, full.matrix_bytes());
}

/// f64 reference of a layer with LoRA dropout, written with the usual
/// inverted dropout (the adapter reads `x_d = m * x / P(kept)`), not with the
/// layer's folded scale: `y, dx, dA, dB`.
fn reference_dropout(c: &Case, wd: &[f32], d: &Dropout) -> [Vec<f64>; 4] {
    let (m, k, n, r) = (c.m, c.k, c.n, c.r);
    let (a, b) = (c.adapter.a.to_f64_vec(), c.adapter.b.to_f64_vec());
    let s = c.adapter.scale();
    let keep = |i: usize| d.keeps(i as u64);
    let ks = d.keep_scale();
    let x = c.x.to_f64_vec();
    let xd: Vec<f64> = (0..m * k)
        .map(|i| if keep(i) { x[i] * ks } else { 0.0 })
        .collect();
    let dy = c.dy.to_f64_vec();
    let h: Vec<f64> = (0..m * r)
        .map(|o| (0..k).map(|p| xd[o / r * k + p] * a[o % r * k + p]).sum())
        .collect();
    let y: Vec<f64> = (0..m * n)
        .map(|o| {
            let (i, j) = (o / n, o % n);
            let base: f64 = (0..k).map(|p| x[i * k + p] * wd[j * k + p] as f64).sum();
            base + s * (0..r).map(|q| h[i * r + q] * b[j * r + q]).sum::<f64>()
        })
        .collect();
    let dh: Vec<f64> = (0..m * r)
        .map(|o| {
            s * (0..n)
                .map(|j| dy[o / r * n + j] * b[j * r + o % r])
                .sum::<f64>()
        })
        .collect();
    let db: Vec<f64> = (0..n * r)
        .map(|o| {
            s * (0..m)
                .map(|i| dy[i * n + o / r] * h[i * r + o % r])
                .sum::<f64>()
        })
        .collect();
    let da: Vec<f64> = (0..r * k)
        .map(|o| (0..m).map(|i| dh[i * r + o / k] * xd[i * k + o % k]).sum())
        .collect();
    let dx: Vec<f64> = (0..m * k)
        .map(|o| {
            let (i, p) = (o / k, o % k);
            let base: f64 = (0..n).map(|j| dy[i * n + j] * wd[j * k + p] as f64).sum();
            let ad: f64 = (0..r).map(|q| dh[i * r + q] * a[q * k + p]).sum();
            base + if keep(o) { ks * ad } else { 0.0 }
        })
        .collect();
    [y, dx, da, db]
}

#[test]
fn dropout_gradients_match_the_inverted_dropout_reference() {
    let c = case(24, 160, 96, 8, 31);
    let d = Dropout::new(0.3, 0xfeed).unwrap();
    for (format, compute, mode, min_db) in [
        // bf16 compute, original input: f32 sums only.
        (
            BaseFormat::Bf16,
            Compute::Bf16,
            BackwardMode::HighPrecision,
            90.0,
        ),
        // FP8 input and E5M2 gradients (E4M3: ~30 dB; E5M2 in dx: ~20 dB).
        (
            BaseFormat::Fp8(WeightScaling::Tensor),
            Compute::Fp8,
            BackwardMode::Quantized,
            18.0,
        ),
        (
            BaseFormat::Fp8(WeightScaling::Tensor),
            Compute::Fp8,
            BackwardMode::Dequantized,
            25.0,
        ),
    ] {
        let base = Base::new(&c.w, format).unwrap();
        let wd = base.dequantize().unwrap().to_f32_vec();
        let mut l = LoraLinear::new(base, Some(c.adapter.clone()), compute, recipe(mode)).unwrap();
        let (y, saved) = l.forward_with(&c.x, true, Some(d)).unwrap();
        let g = l.backward(saved, &c.dy).unwrap();
        let want = reference_dropout(&c, &wd, &d);
        let got = [
            f64s(&y),
            f64s(g.d_input.as_ref().unwrap()),
            f64s(g.d_a.as_ref().unwrap()),
            f64s(g.d_b.as_ref().unwrap()),
        ];
        for (name, (gv, wv)) in ["y", "dx", "dA", "dB"].iter().zip(got.iter().zip(&want)) {
            let db = sqnr_db(gv, wv);
            assert!(db > min_db, "{mode:?} {name}: {db:.1} dB");
        }
        // Without dropout the same layer computes something else (the mask matters).
        let (y0, _) = l.forward(&c.x, true).unwrap();
        assert!(sqnr_db(&f64s(&y0), &want[0]) < sqnr_db(&got[0], &want[0]));
    }
    // The chain rule itself: the reference's dA and dx against finite
    // differences of L = <dy, y> (linear in A and in x, so a step of 1 is
    // exact up to f64 rounding).
    let wd = c.w.to_f32_vec();
    let loss = |c: &Case| -> f64 {
        let y = reference_dropout(c, &wd, &d)[0].clone();
        y.iter().zip(c.dy.to_f64_vec()).map(|(a, b)| a * b).sum()
    };
    let [_, rdx, rda, _] = reference_dropout(&c, &wd, &d);
    let l0 = loss(&c);
    for &(q, p) in &[(0usize, 0usize), (3, 17), (7, 159)] {
        let mut c2 = case(24, 160, 96, 8, 31);
        let mut av = c2.adapter.a.to_f32_vec();
        let before = av[q * 160 + p];
        av[q * 160 + p] += 1.0;
        // The step as stored in f32 (exactly representable, so exact in f64).
        let step = f64::from(av[q * 160 + p]) - f64::from(before);
        c2.adapter.a = Tensor::from_f32(&[8, 160], av).unwrap();
        let fd = (loss(&c2) - l0) / step;
        assert!(
            (fd - rda[q * 160 + p]).abs() <= 1e-9 * fd.abs().max(1e-3),
            "dA {fd} vs {}",
            rda[q * 160 + p]
        );
    }
    for o in [0usize, 5, 161, 24 * 160 - 1] {
        let mut c2 = case(24, 160, 96, 8, 31);
        let mut xv = c2.x.to_f32_vec();
        let before = xv[o];
        xv[o] += 1.0;
        let step = f64::from(xv[o]) - f64::from(before);
        c2.x = Tensor::from_f32(&[24, 160], xv).unwrap();
        let fd = (loss(&c2) - l0) / step;
        assert!(
            (fd - rdx[o]).abs() <= 1e-9 * fd.abs().max(1e-3),
            "dx {fd} vs {}",
            rdx[o]
        );
    }
}

#[test]
fn dropout_masks_drop_at_rate_p_and_differ_by_round_block_and_site() {
    use octet_nn::lora::{dropout_key, DROPOUT_SITE};
    let n = 200_000u64;
    for p in [0.05, 0.3, 0.5] {
        let d = Dropout::new(p, dropout_key(9, 0, 0, 0)).unwrap();
        let dropped = (0..n).filter(|&i| !d.keeps(i)).count() as f64 / n as f64;
        // Binomial: 5 standard deviations (at most 0.0056 here).
        let sd = (p * (1.0 - p) / n as f64).sqrt();
        assert!((dropped - p).abs() < 5.0 * sd, "p {p}: dropped {dropped}");
        // keep_scale is 1 / P(kept) of the threshold the mask uses, and p
        // is resolved to 2^-17.
        let kept = 1.0 - f64::from(d.threshold()) / 65536.0;
        assert!((d.keep_scale() * kept - 1.0).abs() < 1e-15);
        assert!((kept - (1.0 - p)).abs() <= 1.0 / 131072.0);
    }
    // q, k, v share their input's key; o, gate/up and down have their own.
    assert_eq!(DROPOUT_SITE, [0, 0, 0, 1, 2, 2, 3]);
    let keys = [
        dropout_key(9, 0, 0, 0),
        dropout_key(9, 1, 0, 0),
        dropout_key(9, 0, 1, 0),
        dropout_key(9, 0, 0, 1),
        dropout_key(10, 0, 0, 0),
    ];
    for (i, &a) in keys.iter().enumerate() {
        for &b in &keys[i + 1..] {
            // Two unrelated masks of p = 0.5 agree on about half the elements.
            let (da, db) = (Dropout::new(0.5, a).unwrap(), Dropout::new(0.5, b).unwrap());
            let same = (0..n).filter(|&i| da.keeps(i) == db.keeps(i)).count() as f64 / n as f64;
            assert!((same - 0.5).abs() < 0.01, "keys {a:x} {b:x}: {same}");
        }
    }
    // The mask zeroes exactly the dropped elements and keeps the others' bits.
    let x = Tensor::from_f32(&[1000], gaussian(1000, 5, 1.0)).unwrap();
    let d = Dropout::new(0.25, 77).unwrap();
    let mx = d.mask(&x).unwrap().to_f32_vec();
    for (i, (a, b)) in x.to_f32_vec().into_iter().zip(mx).enumerate() {
        assert_eq!(b, if d.keeps(i as u64) { a } else { 0.0 });
    }
    for bad in [-0.1, 1.0, f64::NAN] {
        let e = Dropout::new(bad, 1).unwrap_err().to_string();
        assert!(e.contains("[0, 1)"), "{e}");
    }
}

#[test]
fn dropout_lanes_of_one_hash_are_independent() {
    // Four elements share a 64-bit hash: neighbours in a group (and across
    // groups) agree as two independent p = 1/2 draws do, on about half.
    let d = Dropout::new(0.5, 123).unwrap();
    let n = 400_000u64;
    for lag in [1u64, 2, 3, 4] {
        let same = (0..n).filter(|&i| d.keeps(i) == d.keeps(i + lag)).count() as f64 / n as f64;
        assert!((same - 0.5).abs() < 0.005, "lag {lag}: {same}");
    }
}

/// A saved state of another LoRA layer (other K, other rank) is a shape
/// error, not adapter gradients of the other layer's shapes.
#[test]
fn a_saved_state_from_another_lora_layer_is_an_error() {
    let t = |shape: &[usize], seed| {
        Tensor::from_f32(shape, gaussian(shape.iter().product(), seed, 1.0)).unwrap()
    };
    for mode in [BackwardMode::HighPrecision, BackwardMode::Dequantized] {
        let r = Recipe::from_name("tensorwise")
            .unwrap()
            .with_backward(mode)
            .unwrap();
        let layer = |k: usize, rank: usize| {
            let base = Base::new(&t(&[8, k], 1), BaseFormat::Bf16).unwrap();
            let ad = Adapter::init(8, k, rank, 8.0, 1).unwrap();
            LoraLinear::new(base, Some(ad), Compute::Bf16, r).unwrap()
        };
        let (mut a, mut b, mut c) = (layer(16, 4), layer(32, 2), layer(16, 2));
        let (_, saved) = a.forward(&t(&[4, 16], 3), true).unwrap();
        let e = b
            .backward(saved.clone(), &t(&[4, 8], 4))
            .unwrap_err()
            .to_string();
        assert!(e.contains("16 features"), "{mode:?}: {e}");
        let e = c.backward(saved, &t(&[4, 8], 4)).unwrap_err().to_string();
        assert!(e.contains("rank 4"), "{mode:?}: {e}");
    }
}

/// An adapter built by hand (its fields are public) is checked like one from
/// [`Adapter::init`]: rank 0 (which scaled by `alpha / 0` and made every
/// output NaN) and an `A` without a matrix shape (which panicked) are errors.
#[test]
fn an_adapter_of_rank_zero_or_without_a_matrix_shape_is_refused() {
    let w = Tensor::from_f32(&[6, 8], gaussian(48, 1, 0.3)).unwrap();
    let layer = |a: Tensor, b: Tensor| {
        let base = Base::new(&w, BaseFormat::Bf16).unwrap();
        let ad = Adapter { a, b, alpha: 8.0 };
        LoraLinear::new(
            base,
            Some(ad),
            Compute::Bf16,
            recipe(BackwardMode::HighPrecision),
        )
    };
    let zero_rank = layer(
        Tensor::zeros(&[0, 8], DType::F32).unwrap(),
        Tensor::zeros(&[6, 0], DType::F32).unwrap(),
    );
    match zero_rank {
        Ok(mut l) => {
            let x = Tensor::from_f32(&[2, 8], gaussian(16, 2, 1.0)).unwrap();
            let (y, _) = l.forward(&x, true).unwrap();
            panic!("rank 0 accepted; y[0] = {}", y.to_f32_vec()[0]);
        }
        Err(e) => assert!(e.to_string().contains("rank"), "{e}"),
    }
    let scalar_a = Tensor::from_f32(&[], vec![1.0]).unwrap();
    let r = std::panic::catch_unwind(|| {
        layer(scalar_a, Tensor::from_f32(&[6, 1], vec![0.0; 6]).unwrap()).is_err()
    });
    assert!(
        matches!(r, Ok(true)),
        "a 0-d A must be an error, not a panic"
    );
}

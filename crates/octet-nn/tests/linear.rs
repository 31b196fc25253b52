//! The quantized Linear: exactness of the high-precision and dequantized
//! backwards, accuracy of the quantized path against f64, a finite-difference
//! check, exact saved bytes, and bad input.

use octet_fp8::tolerance::{assert_bitwise_eq_f32, sqnr_db, SQNR_FP4_GEMM, SQNR_GRAD, SQNR_OUTPUT};
use octet_fp8::{BackwardMode, Layout, Recipe, Role, Scaling, Usage};
use octet_nn::Linear;
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
    x: Vec<f32>,
    w: Vec<f32>,
    b: Vec<f32>,
    dy: Vec<f32>,
}

fn case(m: usize, k: usize, n: usize, seed: u64) -> Case {
    Case {
        m,
        k,
        n,
        x: gaussian(m * k, seed, 1.0),
        w: gaussian(n * k, seed + 1, 1.0 / (k as f32).sqrt()),
        b: gaussian(n, seed + 2, 0.1),
        dy: gaussian(m * n, seed + 3, 1e-3),
    }
}

fn layer(c: &Case, recipe: Option<Recipe>, trainable: bool, bias: bool) -> Linear {
    let w = Tensor::from_f32(&[c.n, c.k], c.w.clone()).unwrap();
    let b = bias.then(|| Tensor::from_f32(&[c.n], c.b.clone()).unwrap());
    Linear::new(w, b, recipe, trainable).unwrap()
}

/// f64 reference of y = x W^T + b, dx = dy W, dW = dy^T x.
fn reference(c: &Case) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (m, k, n) = (c.m, c.k, c.n);
    let mut y = vec![0f64; m * n];
    let mut dx = vec![0f64; m * k];
    let mut dw = vec![0f64; n * k];
    for i in 0..m {
        for j in 0..n {
            let mut s = c.b[j] as f64;
            for p in 0..k {
                s += c.x[i * k + p] as f64 * c.w[j * k + p] as f64;
            }
            y[i * n + j] = s;
            let g = c.dy[i * n + j] as f64;
            for p in 0..k {
                dx[i * k + p] += g * c.w[j * k + p] as f64;
                dw[j * k + p] += g * c.x[i * k + p] as f64;
            }
        }
    }
    (y, dx, dw)
}

fn f64s(t: &Tensor) -> Vec<f64> {
    t.to_f32_vec().into_iter().map(f64::from).collect()
}

fn all_recipes() -> Vec<Recipe> {
    let mut out = Vec::new();
    for name in Recipe::NAMES {
        for mode in BackwardMode::ALL {
            if let Ok(r) = Recipe::from_name(name).unwrap().with_backward(mode) {
                out.push(r);
            }
        }
    }
    out
}

#[test]
fn high_precision_backward_is_the_plain_backward_bit_for_bit() {
    let c = case(37, 200, 51, 1);
    let x = Tensor::from_f32(&[c.m, c.k], c.x.clone()).unwrap();
    let dy = Tensor::from_f32(&[c.m, c.n], c.dy.clone()).unwrap();
    let mut plain = layer(&c, None, true, true);
    let (_, saved) = plain.forward(&x, true).unwrap();
    let plain_g = plain.backward(saved, &dy).unwrap();
    // The plain backward itself: dx = dy @ W, dW = dy^T @ x, through the same GEMM.
    assert_bitwise_eq_f32(
        &plain_g.d_input.as_ref().unwrap().to_f32_vec(),
        &cpu::sgemm(c.m, c.k, c.n, &c.dy, false, &c.w, false),
        "plain dx",
    );
    for name in ["tensorwise", "rowwise", "blockwise", "mxfp8", "nvfp4"] {
        let r = Recipe::from_name(name)
            .unwrap()
            .with_backward(BackwardMode::HighPrecision)
            .unwrap();
        let mut l = layer(&c, Some(r), true, true);
        let (_, saved) = l.forward(&x, true).unwrap();
        let g = l.backward(saved, &dy).unwrap();
        for (a, b, what) in [
            (&g.d_input, &plain_g.d_input, "d_input"),
            (&g.d_weight, &plain_g.d_weight, "d_weight"),
            (&g.d_bias, &plain_g.d_bias, "d_bias"),
        ] {
            assert_bitwise_eq_f32(
                &a.as_ref().unwrap().to_f32_vec(),
                &b.as_ref().unwrap().to_f32_vec(),
                &format!("{name} {what}"),
            );
        }
    }
}

#[test]
fn dequantized_backward_equals_the_reference_from_dequantized_tensors() {
    let c = case(37, 200, 51, 2);
    let x = Tensor::from_f32(&[c.m, c.k], c.x.clone()).unwrap();
    let w = Tensor::from_f32(&[c.n, c.k], c.w.clone()).unwrap();
    let dy = Tensor::from_f32(&[c.m, c.n], c.dy.clone()).unwrap();
    for name in ["tensorwise", "rowwise", "blockwise", "mxfp8", "nvfp4"] {
        let r = Recipe::from_name(name)
            .unwrap()
            .with_backward(BackwardMode::Dequantized)
            .unwrap();
        let mut l = layer(&c, Some(r), true, false);
        let (_, saved) = l.forward(&x, true).unwrap();
        let g = l.backward(saved, &dy).unwrap();
        // Rebuild what the forward quantized, dequantize, and run the high-precision GEMMs.
        let q = |role: Role, t: &Tensor| {
            let s = r.spec(role, Layout::Rowwise, None, 0).unwrap();
            cpu::quantize(t, &s, &s, Usage::ROW, None)
                .unwrap()
                .dequantize()
                .unwrap()
        };
        let (x_dq, w_dq) = (q(Role::Input, &x), q(Role::Weight, &w));
        let dx = cpu::sgemm(c.m, c.k, c.n, &c.dy, false, &w_dq, false);
        let dw = cpu::sgemm(c.n, c.k, c.m, &c.dy, true, &x_dq, false);
        assert_bitwise_eq_f32(
            &g.d_input.unwrap().to_f32_vec(),
            &dx,
            &format!("{name} d_input"),
        );
        assert_bitwise_eq_f32(
            &g.d_weight.unwrap().to_f32_vec(),
            &dw,
            &format!("{name} d_weight"),
        );
    }
}

#[test]
fn quantized_paths_meet_the_accuracy_floors() {
    // Ragged shapes: nothing here is a multiple of 16 or of any block size.
    for (m, k, n, seed) in [(37, 200, 51, 3), (64, 256, 96, 4)] {
        let c = case(m, k, n, seed);
        let (y_ref, dx_ref, dw_ref) = reference(&c);
        let x = Tensor::from_f32(&[m, k], c.x.clone()).unwrap();
        let dy = Tensor::from_f32(&[m, n], c.dy.clone()).unwrap();
        for r in all_recipes() {
            let mut l = layer(&c, Some(r), true, true);
            let (y, saved) = l.forward(&x, true).unwrap();
            let g = l.backward(saved, &dy).unwrap();
            let fp4 = r.scaling() == Scaling::Nvfp4;
            let out_floor = if fp4 { SQNR_FP4_GEMM } else { SQNR_OUTPUT };
            let s = sqnr_db(&y_ref, &f64s(&y));
            eprintln!("sqnr {r} {m}x{k}x{n} output {s:.2}");
            assert!(
                s >= out_floor,
                "{r} {m}x{k}x{n}: output SQNR {s:.1} dB < {out_floor}"
            );
            // Gradients are exact-from-f32 in high_precision mode, quantized otherwise.
            let grad_floor = if fp4 { SQNR_FP4_GEMM } else { SQNR_GRAD };
            for (name, got, want) in [
                ("d_input", &g.d_input, &dx_ref),
                ("d_weight", &g.d_weight, &dw_ref),
            ] {
                let s = sqnr_db(want, &f64s(got.as_ref().unwrap()));
                eprintln!("sqnr {r} {m}x{k}x{n} {name} {s:.2}");
                let floor = if r.backward() == BackwardMode::HighPrecision {
                    100.0
                } else {
                    grad_floor
                };
                assert!(
                    s >= floor,
                    "{r} {m}x{k}x{n}: {name} SQNR {s:.1} dB < {floor}"
                );
            }
        }
    }
}

#[test]
fn finite_differences_in_f64_confirm_the_high_precision_gradients() {
    // The layer runs in f64 here (its reference dtype). L = <dy, y(x, W, b)>
    // is linear in each of x, W and b, so a central difference has no
    // truncation error and a large step is fine: what remains is f64 rounding
    // of y, about 1e-16 |y| per term, far under the 1e-9 relative tolerance.
    let c = case(6, 10, 7, 5);
    let wide = |v: &[f32]| -> Vec<f64> { v.iter().map(|&e| e as f64).collect() };
    let t64 = |shape: &[usize], v: &[f64]| Tensor::from_f64(shape, v.to_vec()).unwrap();
    let (x, w, b, dyv) = (wide(&c.x), wide(&c.w), wide(&c.b), wide(&c.dy));
    let (xs, ws, bs) = ([c.m, c.k], [c.n, c.k], [c.n]);
    let dy = t64(&[c.m, c.n], &dyv);
    let build =
        |w: &[f64], b: &[f64]| Linear::new(t64(&ws, w), Some(t64(&bs, b)), None, true).unwrap();
    let mut l = build(&w, &b);
    let (y, saved) = l.forward(&t64(&xs, &x), true).unwrap();
    assert_eq!(y.dtype(), DType::F64);
    let g = l.backward(saved, &dy).unwrap();
    let loss = |l: &mut Linear, x: &[f64]| -> f64 {
        let (y, _) = l.forward(&t64(&xs, x), false).unwrap();
        y.to_f64_vec().iter().zip(&dyv).map(|(&a, &b)| a * b).sum()
    };
    let h = 0.5f64;
    let check = |num: f64, ana: f64, what: &str| {
        assert!(
            (num - ana).abs() <= 1e-9 * ana.abs().max(1e-6),
            "{what}: numeric {num:e} vs analytic {ana:e}"
        );
    };
    let bump = |v: &[f64], i: usize, d: f64| {
        let mut v = v.to_vec();
        v[i] += d;
        v
    };
    let dx = g.d_input.unwrap().to_f64_vec();
    for i in 0..c.m * c.k {
        let num = (loss(&mut l, &bump(&x, i, h)) - loss(&mut l, &bump(&x, i, -h))) / (2.0 * h);
        check(num, dx[i], &format!("d_input[{i}]"));
    }
    let dw = g.d_weight.unwrap().to_f64_vec();
    for i in 0..c.n * c.k {
        let lp = loss(&mut build(&bump(&w, i, h), &b), &x);
        let lm = loss(&mut build(&bump(&w, i, -h), &b), &x);
        check((lp - lm) / (2.0 * h), dw[i], &format!("d_weight[{i}]"));
    }
    let db = g.d_bias.unwrap().to_f64_vec();
    for j in 0..c.n {
        let lp = loss(&mut build(&w, &bump(&b, j, h)), &x);
        let lm = loss(&mut build(&w, &bump(&b, j, -h)), &x);
        check((lp - lm) / (2.0 * h), db[j], &format!("d_bias[{j}]"));
    }
}

/// Bytes of one quantized copy of a `(rows, cols)` tensor for `recipe`'s `role`,
/// computed from the recipe's definition (not from the quantizer).
fn copy_bytes(recipe: &Recipe, role: Role, rows: usize, cols: usize) -> usize {
    let blocks = |br: usize, bc: usize| rows.div_ceil(br) * cols.div_ceil(bc);
    match (recipe.scaling(), role) {
        (Scaling::Delayed { .. } | Scaling::Tensorwise { .. }, _) => rows * cols + 4,
        (Scaling::Rowwise { .. }, _) => rows * cols + 4 * rows,
        (Scaling::Blockwise { .. }, Role::Weight) => rows * cols + 4 * blocks(128, 128),
        (Scaling::Blockwise { .. }, _) => rows * cols + 4 * blocks(1, 128),
        (Scaling::Mxfp8, _) => rows * cols + blocks(1, 32),
        // Two E2M1 per byte per row, one E4M3 per block, one f32 per tensor.
        (Scaling::Nvfp4, Role::Weight) => rows * cols.div_ceil(2) + blocks(16, 16) + 4,
        (Scaling::Nvfp4, _) => rows * cols.div_ceil(2) + blocks(1, 16) + 4,
    }
}

#[test]
fn saved_bytes_are_exactly_what_backward_needs() {
    let (m, k, n) = (37, 200, 51);
    let c = case(m, k, n, 6);
    for dtype in [DType::F32, DType::Bf16] {
        let x = Tensor::from_f32_as(&[m, k], c.x.clone(), dtype).unwrap();
        let hp_x = m * k * dtype.size();
        for trainable in [true, false] {
            for input_grad in [true, false] {
                let mut plain = layer(&c, None, trainable, true);
                let (_, saved) = plain.forward(&x, input_grad).unwrap();
                assert_eq!(
                    saved.bytes(),
                    if trainable { hp_x } else { 0 },
                    "plain t={trainable} ig={input_grad}"
                );
                for r in all_recipes() {
                    let mut l = layer(&c, Some(r), trainable, true);
                    let (_, saved) = l.forward(&x, input_grad).unwrap();
                    let want = match r.backward() {
                        // Column-wise copies: x^T is (K, M), W^T is (K, N).
                        BackwardMode::Quantized => {
                            (if trainable {
                                copy_bytes(&r, Role::Input, k, m)
                            } else {
                                0
                            }) + (if input_grad {
                                copy_bytes(&r, Role::Weight, k, n)
                            } else {
                                0
                            })
                        }
                        BackwardMode::HighPrecision => {
                            if trainable {
                                hp_x
                            } else {
                                0
                            }
                        }
                        // The forward's row-wise copies: x (M, K), W (N, K).
                        BackwardMode::Dequantized => {
                            (if trainable {
                                copy_bytes(&r, Role::Input, m, k)
                            } else {
                                0
                            }) + (if input_grad {
                                copy_bytes(&r, Role::Weight, n, k)
                            } else {
                                0
                            })
                        }
                    };
                    assert_eq!(
                        saved.bytes(),
                        want,
                        "{r} {dtype:?} trainable={trainable} input_grad={input_grad}"
                    );
                    // And backward works from exactly that.
                    let dy = Tensor::from_f32_as(&[m, n], c.dy.clone(), dtype).unwrap();
                    let g = l.backward(saved, &dy).unwrap();
                    assert_eq!(g.d_input.is_some(), input_grad, "{r}");
                    assert_eq!(g.d_weight.is_some(), trainable, "{r}");
                    assert_eq!(g.d_bias.is_some(), trainable, "{r}");
                    if let Some(dx) = &g.d_input {
                        assert_eq!(dx.dtype(), dtype);
                    }
                }
            }
        }
    }
}

#[test]
fn delayed_scaling_uses_the_previous_steps_amax() {
    let c = case(16, 64, 32, 7);
    let r = Recipe::from_name("delayed").unwrap();
    let mut l = layer(&c, Some(r), true, false);
    let x = Tensor::from_f32(&[c.m, c.k], c.x.clone()).unwrap();
    let dy = Tensor::from_f32(&[c.m, c.n], c.dy.clone()).unwrap();
    assert_eq!(
        l.delayed_state(Role::Input).unwrap().scale(),
        1.0,
        "first step uses scale 1"
    );
    let (y1, saved) = l.forward(&x, true).unwrap();
    l.backward(saved, &dy).unwrap();
    l.update_scales();
    let amax = |v: &[f32]| v.iter().fold(0f32, |a, b| a.max(b.abs()));
    assert_eq!(
        l.delayed_state(Role::Input).unwrap().scale(),
        448.0 / amax(&c.x)
    );
    assert_eq!(
        l.delayed_state(Role::Weight).unwrap().scale(),
        448.0 / amax(&c.w)
    );
    assert_eq!(
        l.delayed_state(Role::GradOutput).unwrap().scale(),
        57344.0 / amax(&c.dy)
    );
    // With the scale now fitted to the data, the second step is more accurate than the first.
    let (y2, _) = l.forward(&x, true).unwrap();
    let (y_ref, _, _) = reference(&c);
    assert!(sqnr_db(&y_ref, &f64s(&y2)) > sqnr_db(&y_ref, &f64s(&y1)));
}

#[test]
fn bad_input_is_an_error() {
    let c = case(8, 32, 16, 8);
    let r = Recipe::from_name("tensorwise").unwrap();
    let mut l = layer(&c, Some(r), true, true);
    let wrong_k = Tensor::from_f32(&[8, 31], gaussian(8 * 31, 1, 1.0)).unwrap();
    assert!(l.forward(&wrong_k, true).is_err());
    let flat = Tensor::from_f32(&[32], gaussian(32, 1, 1.0)).unwrap();
    assert!(l.forward(&flat, true).is_err());
    let empty = Tensor::from_f32(&[0, 32], vec![]).unwrap();
    assert!(l.forward(&empty, true).is_err());
    let mut nan = c.x.clone();
    nan[5] = f32::NAN;
    let err = l
        .forward(&Tensor::from_f32(&[8, 32], nan).unwrap(), true)
        .unwrap_err();
    assert!(
        err.to_string().contains("non-finite input at element 5"),
        "{err}"
    );
    let x = Tensor::from_f32(&[8, 32], c.x.clone()).unwrap();
    let (_, saved) = l.forward(&x, true).unwrap();
    let wrong_dy = Tensor::from_f32(&[8, 15], gaussian(8 * 15, 2, 1.0)).unwrap();
    assert!(l.backward(saved, &wrong_dy).is_err());
    let w = Tensor::from_f32(&[16, 32], c.w.clone()).unwrap();
    assert!(Linear::new(
        w.clone(),
        Some(Tensor::from_f32(&[15], vec![0.5; 15]).unwrap()),
        None,
        true
    )
    .is_err());
    assert!(Tensor::from_f32(&[3, 3], vec![1.0; 8]).is_err());
}

#[test]
fn an_externally_quantized_weight_gives_the_same_results_as_quantizing_locally() {
    // What FSDP's FP8 all-gather hands the layer is the weight quantized with
    // the layer's own spec: the layer must then compute exactly what it computes
    // when it quantizes the weight itself (weights round to nearest, so the
    // call counter does not matter).
    let c = case(48, 160, 64, 91);
    for name in ["tensorwise", "rowwise", "blockwise", "mxfp8"] {
        for mode in [BackwardMode::Quantized, BackwardMode::Dequantized] {
            let recipe = Recipe::from_name(name)
                .unwrap()
                .with_backward(mode)
                .unwrap();
            let x = Tensor::from_f32(&[c.m, c.k], c.x.clone()).unwrap();
            let dy = Tensor::from_f32(&[c.m, c.n], c.dy.clone()).unwrap();
            let mut local = layer(&c, Some(recipe), true, true);
            let (y0, s0) = local.forward(&x, true).unwrap();
            let g0 = local.backward(s0, &dy).unwrap();

            let mut ext = layer(&c, Some(recipe), true, true);
            let spec = recipe.spec(Role::Weight, Layout::Rowwise, None, 0).unwrap();
            let q = cpu::quantize(&ext.weight, &spec, &spec, Usage::BOTH, None).unwrap();
            ext.set_quantized_weight(Some(std::sync::Arc::new(q)))
                .unwrap();
            let (y1, s1) = ext.forward(&x, true).unwrap();
            let g1 = ext.backward(s1, &dy).unwrap();
            let label = format!("{name} {mode:?}");
            assert_bitwise_eq_f32(&y0.to_f32_vec(), &y1.to_f32_vec(), &label);
            let (dx0, dx1) = (g0.d_input.unwrap(), g1.d_input.unwrap());
            assert_bitwise_eq_f32(&dx0.to_f32_vec(), &dx1.to_f32_vec(), &label);
            let (dw0, dw1) = (g0.d_weight.unwrap(), g1.d_weight.unwrap());
            assert_bitwise_eq_f32(&dw0.to_f32_vec(), &dw1.to_f32_vec(), &label);
        }
    }
    // A wrong shape or a missing copy is an error, not a wrong answer.
    let mut l = layer(
        &c,
        Some(Recipe::from_name("tensorwise").unwrap()),
        true,
        false,
    );
    let spec = Recipe::from_name("tensorwise")
        .unwrap()
        .spec(Role::Weight, Layout::Rowwise, None, 0)
        .unwrap();
    let wrong = Tensor::from_f32(&[c.n, c.k - 16], vec![0.5; c.n * (c.k - 16)]).unwrap();
    let q = cpu::quantize(&wrong, &spec, &spec, Usage::BOTH, None).unwrap();
    assert!(l
        .set_quantized_weight(Some(std::sync::Arc::new(q)))
        .is_err());
    let row_only = cpu::quantize(&l.weight, &spec, &spec, Usage::ROW, None).unwrap();
    l.set_quantized_weight(Some(std::sync::Arc::new(row_only)))
        .unwrap();
    let x = Tensor::from_f32(&[c.m, c.k], c.x.clone()).unwrap();
    assert!(
        l.forward(&x, true).is_err(),
        "quantized backward needs the column-wise copy"
    );
    assert!(l.forward(&x, false).is_ok());
}

fn tensor(shape: &[usize], seed: u64) -> Tensor {
    Tensor::from_f32(shape, gaussian(shape.iter().product(), seed, 1.0)).unwrap()
}

/// A saved state of another layer (same N, other K) is a shape error in
/// every backward mode, not gradients of the other layer's shapes.
#[test]
fn a_saved_state_from_another_layer_is_an_error() {
    let mut recipes = vec![None];
    for m in BackwardMode::ALL {
        recipes.push(Some(
            Recipe::from_name("tensorwise")
                .unwrap()
                .with_backward(m)
                .unwrap(),
        ));
    }
    for r in recipes {
        let mut a = Linear::new(tensor(&[8, 16], 1), None, r, true).unwrap();
        let mut b = Linear::new(tensor(&[8, 32], 2), None, r, true).unwrap();
        let (_, saved) = a.forward(&tensor(&[4, 16], 3), true).unwrap();
        let e = b
            .backward(saved, &tensor(&[4, 8], 4))
            .unwrap_err()
            .to_string();
        assert!(e.contains("16 features") && e.contains("32"), "{r:?}: {e}");
    }
}

/// A delayed-scaling state made for another format (or history, algorithm,
/// margin) than the role's is refused; a matching one is taken.
#[test]
fn a_delayed_state_made_for_another_role_is_refused() {
    use octet_fp8::{AmaxAlgo, DelayedState, Format};
    let mut l = Linear::new(
        tensor(&[16, 64], 1),
        None,
        Recipe::from_name("delayed").ok(),
        true,
    )
    .unwrap();
    let fits = l.delayed_state(Role::Input).unwrap().clone();
    let (len, algo, margin, format) = fits.config();
    assert_eq!(format, Format::E4M3);
    for other in [
        DelayedState::new(len, algo, margin, Format::E5M2),
        DelayedState::new(len + 1, algo, margin, format),
        DelayedState::new(len, AmaxAlgo::MostRecent, margin, format),
        DelayedState::new(len, algo, margin + 1, format),
    ] {
        let e = l
            .set_delayed_state(Role::Input, other)
            .unwrap_err()
            .to_string();
        assert!(e.contains("does not fit"), "{e}");
    }
    assert!(l.set_delayed_state(Role::Input, fits).is_ok());
}

/// Delayed scaling across a step whose grad_output is all zeros (a batch whose
/// loss is fully masked): the next step's quantized gradients must still use
/// the scale fitted to the earlier steps (Transformer Engine keeps the scale
/// when the amax is 0). Reset to 1, E5M2 flushes gradients of 1e-6 (its
/// smallest subnormal is 2^-16) and d_weight comes back all zero. The floor is
/// the crate's SQNR_GRAD for FP8 gradients.
#[test]
fn delayed_scaling_survives_a_step_of_zero_gradients() {
    let c = case(16, 64, 32, 12);
    let scaling = Scaling::Delayed {
        history_len: 1,
        algo: octet_fp8::AmaxAlgo::MostRecent,
        margin: 0,
    };
    let r = Recipe::new(
        scaling,
        octet_fp8::Format::E4M3,
        octet_fp8::Format::E5M2,
        BackwardMode::Quantized,
    )
    .unwrap();
    let mut l = layer(&c, Some(r), true, false);
    let x = Tensor::from_f32(&[c.m, c.k], c.x.clone()).unwrap();
    let small: Vec<f32> = c.dy.iter().map(|v| v * 1e-3).collect(); // ~1e-6
    let dy = Tensor::from_f32(&[c.m, c.n], small.clone()).unwrap();
    let zero = Tensor::from_f32(&[c.m, c.n], vec![0.0; c.m * c.n]).unwrap();
    for g in [&dy, &zero] {
        let (_, saved) = l.forward(&x, true).unwrap();
        l.backward(saved, g).unwrap();
        l.update_scales();
    }
    let (_, saved) = l.forward(&x, true).unwrap();
    let g = l.backward(saved, &dy).unwrap();
    let c_small = Case {
        dy: small,
        ..case(16, 64, 32, 12)
    };
    let (_, _, dw_ref) = reference(&c_small);
    let s = sqnr_db(&dw_ref, &f64s(g.d_weight.as_ref().unwrap()));
    assert!(
        s >= SQNR_GRAD,
        "d_weight after a zero-gradient step: {s:.1} dB"
    );
}

/// The high_precision backward computes `d_input = dy @ weight` from the
/// layer's own weight, so a weight quantized elsewhere (which replaces
/// `weight` in the forward, as sharded data parallel's FP8 all-gather does,
/// leaving `weight` as it was) would give an input gradient of another
/// matrix than the forward used. It is refused, as the GPU layer refuses it.
#[test]
fn an_external_quantized_weight_is_refused_under_the_high_precision_backward() {
    let c = case(8, 64, 16, 13);
    let r = Recipe::from_name("tensorwise")
        .unwrap()
        .with_backward(BackwardMode::HighPrecision)
        .unwrap();
    let w = Tensor::from_f32(&[c.n, c.k], c.w.clone()).unwrap();
    let spec = r.spec(Role::Weight, Layout::Rowwise, None, 0).unwrap();
    let q = cpu::quantize(&w, &spec, &spec, Usage::BOTH, None).unwrap();
    // The layer's own weight is a stale placeholder (not the gathered one).
    let stale = Tensor::zeros(&[c.n, c.k], DType::F32).unwrap();
    let mut l = Linear::new(stale, None, Some(r), true).unwrap();
    match l.set_quantized_weight(Some(std::sync::Arc::new(q))) {
        Ok(()) => {
            let x = Tensor::from_f32(&[c.m, c.k], c.x.clone()).unwrap();
            let dy = Tensor::from_f32(&[c.m, c.n], c.dy.clone()).unwrap();
            let (_, saved) = l.forward(&x, true).unwrap();
            let g = l.backward(saved, &dy).unwrap();
            let (_, dx_ref, _) = reference(&c);
            let s = sqnr_db(&dx_ref, &f64s(g.d_input.as_ref().unwrap()));
            panic!("accepted; d_input SQNR against dy @ W: {s:.1} dB");
        }
        Err(e) => assert!(e.to_string().contains("high_precision"), "{e}"),
    }
}

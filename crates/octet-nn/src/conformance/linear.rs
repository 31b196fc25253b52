//! The quantized Linear on the GPU against `octet_nn::Linear`, per recipe and
//! backward mode, and its telemetry.

use super::*;

/// The GPU `Linear` against the CPU reference `crate::Linear` on the same
/// bf16 input, weight and output gradient, for the bf16 layer and every GPU
/// recipe with the quantized and the high-precision backward. The FP8 codes
/// are the same on both sides (bit-exact quantizers), so the differences are
/// the accumulation order and the bf16 rounding of `y` (and of the CPU's `dx`).
pub(super) fn linear_cases(gpu: &Gpu, out: &mut Vec<CaseResult>) -> Result<()> {
    use crate::linear::cuda::GpuLinear;
    use crate::Linear;
    use octet_fp8::{BackwardMode, Recipe};
    use octet_tensor::Tensor;
    let (m, k, n) = (256usize, 512usize, 512usize);
    let xb = random_bf16(m * k, 1201, 2.0);
    let wb = random_bf16(n * k, 1202, 0.05);
    let gb = random_bf16(m * n, 1203, 1e-3);
    let shape = |e: octet_tensor::Error| Error::Shape(e.to_string());
    let nn = |e: crate::Error| Error::Shape(e.to_string());
    let mut recipes: Vec<(String, Option<Recipe>)> = vec![("bf16".into(), None)];
    for name in ["tensorwise", "rowwise", "blockwise", "mxfp8", "nvfp4"] {
        for mode in BackwardMode::ALL {
            let r = Recipe::from_name(name)?.with_backward(mode)?;
            recipes.push((format!("{name} {}", mode.name()), Some(r)));
        }
    }
    for (label, recipe) in recipes {
        let rname = label.split(' ').next().unwrap_or_default();
        let what = format!("linear layer {label}");
        if skip_without_fp8_gemm(gpu, octet_cuda::recipe_uses_fp8_gemm(rname), what, out) {
            continue;
        }
        let mut cpu = Linear::new(
            Tensor::from_bf16(&[n, k], wb.clone()).map_err(shape)?,
            None,
            recipe,
            true,
        )
        .map_err(nn)?;
        let x = Tensor::from_bf16(&[m, k], xb.clone()).map_err(shape)?;
        let (cy, cs) = cpu.forward(&x, true).map_err(nn)?;
        let cg = cpu
            .backward(cs, &Tensor::from_bf16(&[m, n], gb.clone()).map_err(shape)?)
            .map_err(nn)?;
        let mut layer = GpuLinear::new(gpu, gpu.upload(&bf16_bits(&wb))?, n, k, recipe)?;
        let (gy, saved) = layer.forward(gpu, &gpu.upload(&bf16_bits(&xb))?, m)?;
        // d_weight accumulates into a buffer that already holds `prior` (as a
        // gradient slot does from earlier micro-batches), of the size of the
        // gradient itself: what comes back minus `prior` is the layer's d_weight,
        // up to the f32 rounding of the sum (2^-24 of |prior|, far below the tolerances).
        let cdw = cg.d_weight.map(|t| t.to_f32_vec()).unwrap_or_default();
        let rms = (cdw.iter().map(|v| (*v as f64).powi(2)).sum::<f64>() / cdw.len().max(1) as f64)
            .sqrt() as f32;
        let prior = random_f32(n * k, 1204, 2.0 * rms);
        let mut acc = gpu.upload(&prior)?;
        let gdx = layer.backward(
            gpu,
            saved,
            &gpu.upload(&bf16_bits(&gb))?,
            None,
            &mut octet_cuda::AddTo(acc.slice_mut(..)),
        )?;
        let gdw: Vec<f32> = gpu
            .download(&acc)?
            .iter()
            .zip(&prior)
            .map(|(a, p)| a - p)
            .collect();
        let ey = rel_frobenius(&download_f32(gpu, &gy)?, &cy.to_f32_vec());
        let edx = rel_frobenius(
            &gpu.download(&gdx)?,
            &cg.d_input.map(|t| t.to_f32_vec()).unwrap_or_default(),
        );
        let edw = rel_frobenius(&gdw, &cdw);
        // The dequantized backward rounds its dequantized operand to bf16 on the
        // GPU (relative 2^-8 per element) where the CPU keeps f32: bf16 tolerance for d_weight.
        let dw_tol = if label.ends_with("dequantized") {
            BF16_OUT_TOL
        } else {
            FP8_TOL
        };
        out.push(CaseResult {
            name: format!("linear fwd+bwd {label} {m}x{k}x{n} (d_weight added to a filled buffer) vs CPU Linear"),
            pass: ey <= BF16_OUT_TOL && edx <= BF16_OUT_TOL && edw <= dw_tol,
            worst: format!("y {ey:.2e}, d_input {edx:.2e}, d_weight {edw:.2e}"),
        });
    }
    // The salts of NVFP4's stochastic rounding of grad_output follow the count
    // of backwards: a layer set to count 1 rounds as a layer's second backward
    // does (what a resumed run relies on), bit for bit, and unlike its first.
    let recipe = Recipe::from_name("nvfp4")?.with_backward(BackwardMode::Quantized)?;
    if !skip_without_fp8_gemm(
        gpu,
        octet_cuda::recipe_uses_fp8_gemm("nvfp4"),
        "linear nvfp4 salts",
        out,
    ) {
        let (x, g) = (gpu.upload(&bf16_bits(&xb))?, gpu.upload(&bf16_bits(&gb))?);
        let grads = |layer: &mut GpuLinear| -> Result<(Vec<f32>, Vec<f32>)> {
            let (_, saved) = layer.forward(gpu, &x, m)?;
            // SAFETY: backward overwrites every element of dw.
            let mut dw: CudaSlice<f32> = unsafe { gpu.alloc_uninit(n * k, "d_weight")? };
            let dx = layer.backward(gpu, saved, &g, None, &mut dw)?;
            Ok((gpu.download(&dx)?, gpu.download(&dw)?))
        };
        let mut run = GpuLinear::new(gpu, gpu.upload(&bf16_bits(&wb))?, n, k, Some(recipe))?;
        let first = grads(&mut run)?;
        let second = grads(&mut run)?;
        let mut resumed = GpuLinear::new(gpu, gpu.upload(&bf16_bits(&wb))?, n, k, Some(recipe))?;
        resumed.set_grad_calls(1);
        let again = grads(&mut resumed)?;
        let same = f32_bits_equal(&again.0, &second.0) && f32_bits_equal(&again.1, &second.1);
        let differ = first
            .1
            .iter()
            .zip(&second.1)
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        out.push(CaseResult {
            name: format!("linear nvfp4 quantized {m}x{k}x{n}: a layer set to 1 gradient quantization rounds as a second backward, bit for bit, and not as a first"),
            pass: same && differ > 0 && resumed.grad_calls() == 2,
            worst: format!("same as the second backward {same}; d_weight elements differing between the first and second {differ} of {}", n * k),
        });
    }
    // Delayed scaling over 4 steps: the scales come from the previous steps' amaxes
    // (step 1 uses scale 1), updated on the device on one side, on the host on the other.
    let recipe = Recipe::from_name("delayed")?;
    let mut cpu = Linear::new(
        Tensor::from_bf16(&[n, k], wb.clone()).map_err(shape)?,
        None,
        Some(recipe),
        true,
    )
    .map_err(nn)?;
    let mut layer = GpuLinear::new(gpu, gpu.upload(&bf16_bits(&wb))?, n, k, Some(recipe))?;
    let mut worst = (0f64, 0f64, 0f64);
    let mut ok = true;
    for step in 0..4u64 {
        let mag = [1.0f32, 8.0, 0.25, 3.0][step as usize];
        let xs = random_bf16(m * k, 1210 + step, 2.0 * mag);
        let gs = random_bf16(m * n, 1220 + step, 1e-3 * mag);
        let x = Tensor::from_bf16(&[m, k], xs.clone()).map_err(shape)?;
        let (cy, cs) = cpu.forward(&x, true).map_err(nn)?;
        let cg = cpu
            .backward(cs, &Tensor::from_bf16(&[m, n], gs.clone()).map_err(shape)?)
            .map_err(nn)?;
        cpu.update_scales();
        let (gy, saved) = layer.forward(gpu, &gpu.upload(&bf16_bits(&xs))?, m)?;
        // SAFETY: backward overwrites every element of gdw.
        let mut gdw: CudaSlice<f32> = unsafe { gpu.alloc_uninit(n * k, "d_weight")? };
        let gdx = layer.backward(gpu, saved, &gpu.upload(&bf16_bits(&gs))?, None, &mut gdw)?;
        layer.update_scales(gpu)?;
        let ey = rel_frobenius(&download_f32(gpu, &gy)?, &cy.to_f32_vec());
        let edx = rel_frobenius(
            &gpu.download(&gdx)?,
            &cg.d_input.map(|t| t.to_f32_vec()).unwrap_or_default(),
        );
        let edw = rel_frobenius(
            &gpu.download(&gdw)?,
            &cg.d_weight.map(|t| t.to_f32_vec()).unwrap_or_default(),
        );
        ok &= ey <= BF16_OUT_TOL && edx <= BF16_OUT_TOL && edw <= FP8_TOL;
        worst = (worst.0.max(ey), worst.1.max(edx), worst.2.max(edw));
    }
    out.push(CaseResult {
        name: format!("linear fwd+bwd delayed quantized {m}x{k}x{n}, 4 steps, scales updated on the device, vs CPU Linear"),
        pass: ok,
        worst: format!("y {:.2e}, d_input {:.2e}, d_weight {:.2e}", worst.0, worst.1, worst.2),
    });
    // The device states as a checkpoint stores them: equal to the CPU's after
    // the same 4 steps, and loaded into a fresh layer they give the same next
    // output bit for bit (what a resumed delayed run relies on).
    let exported = layer.delayed_states(gpu)?;
    let same_as_cpu = exported.len() == 3
        && exported
            .iter()
            .all(|(role, st)| cpu.delayed_state(*role) == Some(st));
    let mut fresh = GpuLinear::new(gpu, gpu.upload(&bf16_bits(&wb))?, n, k, Some(recipe))?;
    for (role, st) in &exported {
        fresh.set_delayed_state(gpu, *role, st)?;
    }
    let roundtrip = fresh.delayed_states(gpu)? == exported;
    let xs = random_bf16(m * k, 1230, 4.0);
    let (y1, _) = layer.forward(gpu, &gpu.upload(&bf16_bits(&xs))?, m)?;
    let (y2, _) = fresh.forward(gpu, &gpu.upload(&bf16_bits(&xs))?, m)?;
    let same_y = gpu.download(&y1)? == gpu.download(&y2)?;
    let wrong = Recipe::from_name("delayed")?;
    let mut other = GpuLinear::new(gpu, gpu.upload(&bf16_bits(&wb))?, n, k, Some(wrong))?;
    let mismatch =
        octet_fp8::DelayedState::new(7, octet_fp8::AmaxAlgo::Max, 0, octet_fp8::Format::E4M3);
    let refused = other
        .set_delayed_state(gpu, octet_fp8::Role::Input, &mismatch)
        .is_err();
    out.push(CaseResult {
        name: "delayed states exported from the device equal the CPU's; imported into a fresh layer, the next output is bit-identical; a mismatched state is refused".into(),
        pass: same_as_cpu && roundtrip && same_y && refused,
        worst: format!(
            "equal to CPU {same_as_cpu}, round trip {roundtrip}, same output {same_y}, mismatch refused {refused}"
        ),
    });
    Ok(())
}

/// Numerics telemetry of `GpuLinear` against the CPU `Linear` on the same
/// data: amax, saturated and underflowed counts equal (shares compared
/// exactly), for every recipe. Wide-range inputs (underflow in every recipe;
/// saturation where NVFP4's E4M3-rounded block scales let a value past 6; the
/// amax-derived scales of the other block recipes, MXFP8's included, cannot
/// overflow), and
/// for delayed scaling a third step whose magnitude jumps past the history
/// (saturation of input and gradient). The case fails if no recipe's counts
/// were non-zero, so that it cannot pass on empty counters.
pub(super) fn telemetry_cases(gpu: &Gpu, out: &mut Vec<CaseResult>) -> Result<()> {
    use crate::linear::cuda::GpuLinear;
    use crate::Linear;
    use octet_fp8::{Recipe, Role};
    use octet_tensor::Tensor;
    let (m, k, n) = (128usize, 512usize, 512usize);
    let shape = |e: octet_tensor::Error| Error::Shape(e.to_string());
    let nn = |e: crate::Error| Error::Shape(e.to_string());
    for name in [
        "tensorwise",
        "delayed",
        "rowwise",
        "blockwise",
        "mxfp8",
        "nvfp4",
    ] {
        if skip_without_fp8_gemm(
            gpu,
            octet_cuda::recipe_uses_fp8_gemm(name),
            format!("telemetry {name}"),
            out,
        ) {
            continue;
        }
        let recipe = Recipe::from_name(name)?;
        let wb = random_bf16(n * k, 1501, 0.05);
        let mut cpu = Linear::new(
            Tensor::from_bf16(&[n, k], wb.clone()).map_err(shape)?,
            None,
            Some(recipe),
            true,
        )
        .map_err(nn)?;
        let mut layer = GpuLinear::new(gpu, gpu.upload(&bf16_bits(&wb))?, n, k, Some(recipe))?;
        layer.telemetry_on = true;
        let (mut ok, mut worst) = (true, String::new());
        let (mut any_sat, mut any_under) = (false, false);
        for step in 0..3u64 {
            let mag = [1.0f32, 1.0, 64.0][step as usize];
            let xs: Vec<bf16> = random_wide_f32(m * k, 1510 + step)
                .into_iter()
                .map(|v| bf16::from_f32(v * mag))
                .collect();
            let gs: Vec<bf16> = random_wide_f32(m * n, 1520 + step)
                .into_iter()
                .map(|v| bf16::from_f32(v * 1e-3 * mag))
                .collect();
            let (_, cs) = cpu
                .forward(
                    &Tensor::from_bf16(&[m, k], xs.clone()).map_err(shape)?,
                    true,
                )
                .map_err(nn)?;
            cpu.backward(cs, &Tensor::from_bf16(&[m, n], gs.clone()).map_err(shape)?)
                .map_err(nn)?;
            cpu.update_scales();
            let (_, saved) = layer.forward(gpu, &gpu.upload(&bf16_bits(&xs))?, m)?;
            let mut dw: CudaSlice<f32> = gpu.alloc_zeros(n * k, "d_weight")?;
            layer.backward(gpu, saved, &gpu.upload(&bf16_bits(&gs))?, None, &mut dw)?;
            let got = layer.telemetry(gpu)?;
            layer.update_scales(gpu)?;
            for role in Role::ALL {
                let want = cpu.telemetry(role);
                let have = got.iter().find(|(r, _)| *r == role).map(|(_, t)| *t);
                let same = match (want, have) {
                    (Some(w), Some(h)) => {
                        any_sat |= w.saturated > 0.0;
                        any_under |= w.underflowed > 0.0;
                        w.amax == h.amax
                            && w.saturated == h.saturated
                            && w.underflowed == h.underflowed
                    }
                    _ => false,
                };
                if !same || step == 2 {
                    worst += &format!("step {step} {role:?}: cpu {want:?} gpu {have:?}; ");
                }
                ok &= same;
            }
        }
        // Inputs that exercise the counters: underflow in every recipe, and
        // saturation where the scales let values overflow (delayed, NVFP4).
        let want_sat = matches!(name, "delayed" | "nvfp4");
        ok &= any_under && (any_sat || !want_sat);
        out.push(CaseResult {
            name: format!("telemetry (amax, saturated, underflowed) {name} {m}x{k}x{n}, 3 steps, vs CPU Linear"),
            pass: ok,
            worst: format!("{worst}non-zero saturated {any_sat}, underflowed {any_under}"),
        });
    }
    Ok(())
}

//! Conformance cases of GPU LoRA ([`crate::lora`], [`GpuLlama::new_lora`])
//! against the CPU reference (`crate::lora::LoraLinear`, the CPU `Llama`
//! in LoRA mode) on the same data: fresh random inputs and adapters (`B`
//! non-zero, so every gradient is), the same FP8 base codes.
//!
//! Tolerances. The CPU layer keeps `u = x A^T`, `s dy B` and the dequantized
//! operands in f32 and rounds `y` and `d_input` once to bf16; the GPU rounds
//! `u`, `du` and (in the `dequantized` backward) the dequantized input and
//! base to bf16 before their products, and the base output before the
//! adapter term is added. Each rounding is relative 2^-9 per element; two on
//! a path give at most 2^-8 per element and about 2^-9 in relative Frobenius
//! norm over random data: outputs within [`BF16_OUT_TOL`] (4e-3, as the other
//! bf16 outputs of the selftest), gradients within 1e-2 (the same allowance
//! plus the FP8 GEMM's reduced-precision partial sums, 2e-4).

use super::*;
use crate::llama::cuda::{AdamParams, GpuLlama};
use crate::llama::{Llama, LoraSpec};
use crate::lora::cuda::{GpuAdapter, GpuBase, GpuLoraLinear};
use crate::lora::{Adapter, Base, BaseFormat, Compute, Dropout, LoraLinear};
use octet_cuda::testdata::random_bf16;
use octet_cuda::{Error, Gpu, Result};
use octet_fp8::{BackwardMode, Format, Recipe};
use octet_tensor::mixed::WeightScaling;
use octet_tensor::{DType, Tensor};
use std::collections::HashMap;
use std::rc::Rc;

fn nn(e: crate::Error) -> Error {
    Error::Shape(e.to_string())
}

fn bits(t: &Tensor) -> Vec<u16> {
    t.to_f32_vec()
        .into_iter()
        .map(|x| half::bf16::from_f32(x).to_bits())
        .collect()
}

/// A bf16-valued tensor (so the CPU's f32 copy and the GPU's bf16 copy hold the same numbers).
fn bf16_tensor(shape: &[usize], seed: u64, scale: f32) -> Result<Tensor> {
    let n = shape.iter().product();
    Tensor::from_bf16(shape, random_bf16(n, seed, scale)).map_err(|e| Error::Shape(e.to_string()))
}

fn gpu_base(gpu: &Gpu, b: &Base) -> Result<GpuBase> {
    Ok(match b {
        Base::Fp8(w) => GpuBase::Fp8(gpu.upload_fp8_weight(w)?),
        Base::Dense(t) => GpuBase::Bf16(gpu.upload(&bits(t))?),
    })
}

/// The same layer on both sides: the CPU `LoraLinear` and the GPU layer over
/// `base` (`(N, K)`) with adapter `A (r, K)`, `B (N, r)` (bf16 values) and
/// `alpha`, under `recipe` (whose backward mode the GPU layer takes too).
fn layer_pair(
    gpu: &Gpu,
    base: Base,
    (a, b, alpha): (Tensor, Tensor, f64),
    compute: Compute,
    recipe: Recipe,
) -> Result<(LoraLinear, GpuLoraLinear)> {
    let (r, dims) = (a.shape()[0], base.dims());
    let gpu_layer = GpuLoraLinear::new(
        gpu_base(gpu, &base)?,
        dims,
        Some(GpuAdapter::new(
            gpu,
            gpu.upload(&bits(&a))?,
            gpu.upload(&bits(&b))?,
            r,
            (alpha / r as f64) as f32,
        )?),
        compute,
        recipe.backward(),
    )?;
    let cpu = LoraLinear::new(base, Some(Adapter { a, b, alpha }), compute, recipe).map_err(nn)?;
    Ok((cpu, gpu_layer))
}

/// [`Gpu::lora_cast_du`] (E5M2) and [`Gpu::lora_cast_u`] (E4M3) against
/// their two separate products: the codes and `scale_inv` of the per-tensor
/// cast, bit for bit (the same scale, multiply and conversion), and
/// `du^T = s B^T dy^T` (`u^T = A x^T`) against an f64 product of the same
/// bf16 values within [`BF16_OUT_TOL`] (one bf16 rounding of an f32 sum,
/// relative 2^-9 per element). Shapes with fewer 64-column chunks than the
/// block has warps, and ranks 8, 16, 24, 32, 48 (q, k and v stacked) and 64
/// (of the 8 to 64 it takes).
pub(crate) fn fused_cases(gpu: &Gpu, out: &mut Vec<CaseResult>) -> Result<()> {
    for ((i, (m, n, r)), format) in [
        (64usize, 192usize, 8usize),
        (48, 128, 16),
        (32, 320, 32),
        (32, 256, 24),
        (16, 64, 64),
        (256, 5632, 16),
        (64, 2048, 48),
    ]
    .into_iter()
    .enumerate()
    .flat_map(|c| [(c, Format::E5M2), (c, Format::E4M3)])
    {
        // E5M2: the backward's dy and du^T = s B^T dy^T; E4M3: the
        // forward's x and u^T = A x^T, with B^T standing for A (s = 1).
        let seed = 2600 + 10 * i as u64;
        let dy_h = random_bf16(m * n, seed, 0.3);
        let b_h = random_bf16(n * r, seed + 1, 0.05);
        let s = if format == Format::E5M2 { 2.0f32 } else { 1.0 };
        let dy = gpu.upload_bf16(&dy_h)?;
        let b = gpu.upload_bf16(&b_h)?;
        let plain = gpu.quantize_tensorwise_rowwise_known(&dy, m, n, format, None)?;
        let bt = gpu.transpose_bf16(&b, n, r)?;
        let bt_h = gpu.download(&bt)?;
        let bt_exact = (0..n * r).all(|o| bt_h[o] == b_h[(o % n) * r + o / n].to_bits());
        // SAFETY: the kernel writes every element.
        let mut dut = unsafe { gpu.alloc_uninit::<u16>(r * m, "du^T")? };
        let fused = match format {
            Format::E5M2 => {
                gpu.lora_cast_du(&dy, (m, n), None, (&bt, r, s), &mut dut.slice_mut(..))?
            }
            _ => gpu.lora_cast_u(&dy, (m, n), None, (&bt, r), &mut dut.slice_mut(..))?,
        };
        let codes_equal = gpu.download(&fused.rowwise)? == gpu.download(&plain.rowwise)?;
        let scale_equal = gpu.download(&fused.scale_inv)?[0].to_bits()
            == gpu.download(&plain.scale_inv)?[0].to_bits();
        let got: Vec<f32> = gpu
            .download(&dut)?
            .into_iter()
            .map(|v| half::bf16::from_bits(v).to_f32())
            .collect();
        let mut want = vec![0f32; r * m];
        for j in 0..r {
            for t in 0..m {
                let sum: f64 = (0..n)
                    .map(|c| {
                        f64::from(b_h[c * r + j].to_f32()) * f64::from(dy_h[t * n + c].to_f32())
                    })
                    .sum();
                want[j * m + t] = (f64::from(s) * sum) as f32;
            }
        }
        let e = rel_frobenius(&got, &want);
        let what = match format {
            Format::E5M2 => "E5M2 cast + du",
            _ => "E4M3 cast + u (forward)",
        };
        out.push(CaseResult {
            name: format!("LoRA fused {what} (m={m}, n={n}, r={r}) vs cast and f64 product"),
            pass: codes_equal && scale_equal && bt_exact && e <= BF16_OUT_TOL,
            worst: format!(
                "codes equal: {codes_equal}, scale_inv equal: {scale_equal}, B^T exact: {bt_exact}, du {e:.2e}"
            ),
        });
    }
    Ok(())
}

/// [`Gpu::lora_da_e4m3`] against an f64 product of the same values: `d_A =
/// f du^T c` for bf16 `du^T (r, m)`, the E4M3 codes `c (m, k)` of a random
/// input (their exact values) and the codes' factor `f`. Every product of a
/// bf16 and an E4M3 value is exact in f32; each of the at most `m` f32
/// additions of a sum (the splits' sums and their sum in order) and the
/// final multiply round by at most 2^-24 of a value bounded by the sum of
/// the absolute terms `S`, so each element is within `(m + 1) 2^-24 S` of
/// f64; the check allows twice that (for the tensor cores' internal
/// accumulation order). Ranks 1 to 64 (partial row tiles: 8, 24, 40), up
/// to 4 stacked adapters (each written to its own output, boundaries inside
/// a row tile: 5 + 11 + 24), widths that leave part of a 256-feature block
/// (272, 80), one split (16 tokens; more 256-feature blocks than SMs) or
/// many (the grid barrier, between launches of different grids). The last
/// case's input spans 2^-30 to 2^6 (log-uniform), so that its codes include
/// E4M3 subnormals (checked), which the kernel decodes with integer
/// operations.
pub(crate) fn da_cases(gpu: &Gpu, out: &mut Vec<CaseResult>) -> Result<()> {
    let cases: [(usize, usize, &[usize]); 12] = [
        (64, 256, &[16]),
        (48, 272, &[16, 16, 16]),
        (16, 80, &[8]),
        (2048, 512, &[24]),
        (256, 5632, &[16]),
        (1024, 2048, &[16, 16, 16]),
        (32, 1024, &[16, 16, 16, 16]),
        (96, 320, &[5, 11, 24]),
        (16, 256, &[1]),
        (32, 34816, &[8]),
        (4096, 2048, &[16, 16]),
        (512, 768, &[32]),
    ];
    for (i, &(m, k, ranks)) in cases.iter().enumerate() {
        let r: usize = ranks.iter().sum();
        let seed = 2700 + 10 * i as u64;
        let wide = i + 1 == cases.len();
        let mut x_h = random_bf16(m * k, seed, 2.0);
        if wide {
            for v in &mut x_h {
                let u = v.to_f32() / 2.0;
                *v = half::bf16::from_f32(u.signum() * 2f32.powf(u.abs() * 36.0 - 30.0));
            }
        }
        let du_h = random_bf16(r * m, seed + 1, 0.01);
        let x = gpu.upload_bf16(&x_h)?;
        let du = gpu.upload_bf16(&du_h)?;
        let xq = gpu.quantize_tensorwise_rowwise_known(&x, m, k, Format::E4M3, None)?;
        let mut got = Vec::with_capacity(r * k);
        for d in gpu.lora_da_e4m3(&du, ranks, &xq, (m, k))? {
            got.extend(gpu.download(&d)?);
        }
        let codes = gpu.download(&xq.rowwise)?;
        let subnormals = codes
            .iter()
            .filter(|&&c| c & 0x78 == 0 && c & 7 != 0)
            .count();
        let f = f64::from(gpu.download(&xq.scale_inv)?[0]);
        let vals: Vec<f64> = codes
            .iter()
            .map(|&c| f64::from(Format::E4M3.decode(c)))
            .collect();
        let whole = got.len() == r * k;
        let (mut worst, mut ok) = (0f64, whole);
        for j in (0..r).filter(|_| whole) {
            for c in 0..k {
                let (mut sum, mut abs) = (0f64, 0f64);
                for t in 0..m {
                    let p = f64::from(du_h[j * m + t].to_f32()) * vals[t * k + c];
                    sum += p;
                    abs += p.abs();
                }
                let err = (f64::from(got[j * k + c]) - f * sum).abs();
                let bound = 2.0 * (m as f64 + 1.0) * 2f64.powi(-24) * f * abs;
                worst = worst.max(err / bound.max(f64::MIN_POSITIVE));
                ok &= err <= bound;
            }
        }
        out.push(CaseResult {
            name: format!(
                "LoRA d_A from E4M3 codes (m={m}, k={k}, ranks {ranks:?}{}) vs f64 of the same values",
                if wide { ", input over 2^-30..2^6" } else { "" }
            ),
            pass: ok && (!wide || subnormals > 0),
            worst: format!("worst error / bound {worst:.3}; {subnormals} subnormal codes"),
        });
    }
    Ok(())
}

/// One GPU layer's forward on `x` and backward from `dy`: the bytes it kept
/// for backward, and the relative distances of `y`, `d_input`, `d_A`, `d_B`
/// to the references (`d_A` from `ga`, the others from `g`).
fn run_layer(
    gpu: &Gpu,
    layer: &GpuLoraLinear,
    (x, dy): (&Tensor, &Tensor),
    (y_ref, g, ga): (&Tensor, &crate::lora::LoraGrads, &crate::lora::LoraGrads),
) -> Result<(usize, [f64; 4])> {
    let m = x.shape()[0];
    let xg = Rc::new(gpu.upload(&bits(x))?);
    let mut outs =
        crate::lora::cuda::forward_group(std::slice::from_ref(layer), gpu, (xg, None, m), None)?;
    let (y, saved) = outs
        .pop()
        .ok_or_else(|| Error::Shape("no LoRA output".into()))?;
    let saved_bytes = saved.bytes_unique(&mut std::collections::HashSet::new());
    let (dx, grads) = layer.backward(gpu, saved, &gpu.upload(&bits(dy))?, None)?;
    let (da, db) = grads.ok_or_else(|| Error::Shape("no adapter gradients".into()))?;
    let want = |t: &Option<Tensor>| t.as_ref().map(Tensor::to_f32_vec).unwrap_or_default();
    Ok((
        saved_bytes,
        [
            rel_frobenius(&download_f32(gpu, &y)?, &y_ref.to_f32_vec()),
            rel_frobenius(&gpu.download(&dx)?, &want(&g.d_input)),
            rel_frobenius(&gpu.download(&da)?, &want(&ga.d_a)),
            rel_frobenius(&gpu.download(&db)?, &want(&g.d_b)),
        ],
    ))
}

/// `(base name, base format, compute, backward, (M, K, N))`.
type LayerCase = (
    &'static str,
    BaseFormat,
    Compute,
    BackwardMode,
    (usize, usize, usize),
);

pub(crate) fn layer_cases(gpu: &Gpu, out: &mut Vec<CaseResult>) -> Result<()> {
    let t = BaseFormat::Fp8(WeightScaling::Tensor);
    let cases: [LayerCase; 7] = [
        (
            "fp8-tensorwise",
            t,
            Compute::Fp8,
            BackwardMode::Dequantized,
            (96, 256, 192),
        ),
        (
            "fp8-tensorwise",
            t,
            Compute::Fp8,
            BackwardMode::Quantized,
            (96, 256, 192),
        ),
        (
            "fp8-tensorwise",
            t,
            Compute::Fp8,
            BackwardMode::HighPrecision,
            (96, 256, 192),
        ),
        // M <= 64 takes the fused weight-only kernel; above, the upcast + cuBLASLt path.
        (
            "fp8-tensorwise",
            t,
            Compute::Bf16,
            BackwardMode::Dequantized,
            (40, 128, 80),
        ),
        (
            "fp8-rowwise",
            BaseFormat::Fp8(WeightScaling::Channel),
            Compute::Bf16,
            BackwardMode::Dequantized,
            (96, 256, 192),
        ),
        (
            "fp8-block",
            BaseFormat::Fp8(WeightScaling::Block128),
            Compute::Bf16,
            BackwardMode::HighPrecision,
            (130, 384, 200),
        ),
        (
            "bf16",
            BaseFormat::Bf16,
            Compute::Bf16,
            BackwardMode::HighPrecision,
            (96, 256, 192),
        ),
    ];
    let (r, alpha) = (16usize, 32.0f64);
    for (ci, (name, format, compute, mode, (m, k, n))) in cases.into_iter().enumerate() {
        let what = format!("LoRA layer case {ci} ({name}, {m}x{k}x{n}, compute fp8)");
        if skip_without_fp8_gemm(gpu, matches!(compute, Compute::Fp8), what, out) {
            continue;
        }
        let seed = 4000 + 10 * ci as u64;
        let w = bf16_tensor(&[n, k], seed, 0.05)?;
        let x = bf16_tensor(&[m, k], seed + 1, 1.0)?;
        let dy = bf16_tensor(&[m, n], seed + 2, 0.1)?;
        // A as PEFT initialises it (bound 1/sqrt(K)); B non-zero, so the adapter's
        // term is a few percent of the base's and dA is not zero.
        let a = bf16_tensor(&[r, k], seed + 3, 1.0 / (k as f32).sqrt())?;
        let b = bf16_tensor(&[n, r], seed + 4, 0.02)?;
        let recipe = Recipe::from_name("tensorwise")?.with_backward(mode)?;
        let base = Base::new(&w, format).map_err(nn)?;
        let (mut cpu, layer) = layer_pair(gpu, base, (a, b, alpha), compute, recipe)?;
        let (y_ref, saved) = cpu.forward(&x, true).map_err(nn)?;
        let g_ref = cpu.backward(saved, &dy).map_err(nn)?;
        let want_bytes = 2 * m * r
            + if mode == BackwardMode::Dequantized {
                m * k + 4
            } else {
                2 * m * k
            };
        let (saved_bytes, [ey, ex, ea, eb]) =
            run_layer(gpu, &layer, (&x, &dy), (&y_ref, &g_ref, &g_ref))?;
        out.push(CaseResult {
            name: format!(
                "LoRA layer {name} base, compute {compute:?}, {mode:?} backward, M={m} K={k} N={n} r={r} vs CPU LoraLinear; saved bytes exact"
            ),
            pass: ey <= BF16_OUT_TOL
                && ex.max(ea).max(eb) <= GRAD_TOL
                && saved_bytes == want_bytes,
            worst: format!(
                "y {ey:.2e}, d_input {ex:.2e}, dA {ea:.2e}, dB {eb:.2e}; saved {saved_bytes} B (want {want_bytes})"
            ),
        });
    }
    // The row-wise-only quantize (LoRA's inputs and gradients) writes the
    // bytes and scale of the two-copy quantize's row-wise copy, partial tiles included.
    for (rows, cols, fmt) in [
        (217, 300, octet_fp8::Format::E4M3),
        (96, 64, octet_fp8::Format::E5M2),
    ] {
        let x = gpu.upload(&crate::conformance::bf16_bits(&random_bf16(
            rows * cols,
            4950,
            3.0,
        )))?;
        let both = gpu.quantize_tensorwise(&x, rows, cols, fmt, false)?;
        let row = gpu.quantize_tensorwise_rowwise(&x, rows, cols, fmt)?;
        let same = gpu.download(&both.rowwise)? == gpu.download(&row.rowwise)?
            && gpu.download(&both.scale_inv)?[0].to_bits()
                == gpu.download(&row.scale_inv)?[0].to_bits();
        out.push(CaseResult {
            name: format!("row-wise-only tensorwise quantize {rows}x{cols} {fmt}: bytes and scale equal the two-copy quantize's"),
            pass: same,
            worst: format!("equal: {same}"),
        });
    }
    // A frozen layer without adapter keeps nothing for backward.
    let (m, k, n) = (32, 64, 48);
    let w = bf16_tensor(&[n, k], 4900, 0.05)?;
    let base = Base::new(&w, BaseFormat::Fp8(WeightScaling::Tensor)).map_err(nn)?;
    let layer = GpuLoraLinear::new(
        gpu_base(gpu, &base)?,
        (n, k),
        None,
        Compute::Fp8,
        BackwardMode::Dequantized,
    )?;
    let xg = Rc::new(gpu.upload(&bits(&bf16_tensor(&[m, k], 4901, 1.0)?))?);
    let mut outs =
        crate::lora::cuda::forward_group(std::slice::from_ref(&layer), gpu, (xg, None, m), None)?;
    let (_, saved) = outs.pop().ok_or_else(|| Error::Shape("no output".into()))?;
    let bytes = saved.bytes_unique(&mut std::collections::HashSet::new());
    out.push(CaseResult {
        name: "LoRA layer without adapter (frozen FP8 base): saves 0 bytes".into(),
        pass: bytes == 0,
        worst: format!("{bytes} bytes"),
    });
    // Bad input: compute fp8 on a row-wise base is refused with a message.
    let wb = Base::new(&w, BaseFormat::Fp8(WeightScaling::Channel)).map_err(nn)?;
    let refused = GpuLoraLinear::new(
        gpu_base(gpu, &wb)?,
        (n, k),
        None,
        Compute::Fp8,
        BackwardMode::Dequantized,
    );
    out.push(CaseResult {
        name: "LoRA layer: --compute fp8 on an fp8-rowwise base is a clear error".into(),
        pass: matches!(&refused, Err(Error::Shape(m)) if m.contains("--compute bf16")),
        worst: match refused {
            Err(e) => e.to_string(),
            Ok(_) => "accepted".into(),
        },
    });
    // A base uploaded with tiled codes (for the weight-only kernels alone)
    // is refused: cuBLASLt's GEMMs and the transposes read them row-major.
    let Base::Fp8(q) = &wb else {
        return Err(Error::Shape("expected an FP8 base".into()));
    };
    let refused = GpuLoraLinear::new(
        GpuBase::Fp8(gpu.upload_fp8_weight_tiled(q)?),
        (n, k),
        None,
        Compute::Bf16,
        BackwardMode::Dequantized,
    );
    out.push(CaseResult {
        name: "LoRA layer: a base with tiled codes is a clear error".into(),
        pass: matches!(&refused, Err(Error::Shape(m)) if m.contains("row-major")),
        worst: match refused {
            Err(e) => e.to_string(),
            Ok(_) => "accepted".into(),
        },
    });
    Ok(())
}

/// The `quantized` backward keeping the adapter's input as its E4M3 codes
/// ([`GpuLoraLinear::fp8_saved_input`]): `y`, `d_input` and `d_B` against the
/// CPU layer's `quantized` backward (the same math), `d_A` against its
/// `dequantized` one (`d_A` from the dequantized input, as here), within the
/// layer cases' tolerances; saved bytes exactly `2 M r` for `u` and `M K +
/// 4` for the codes and their factor. Rank 16 reads the codes in
/// [`Gpu::lora_da_e4m3`]; rank 80 (above its 64) dequantizes them for a GEMM.
pub(crate) fn fp8_saved_layer_cases(gpu: &Gpu, out: &mut Vec<CaseResult>) -> Result<()> {
    let alpha = 32.0f64;
    for (ci, (m, k, n, r)) in [(96usize, 256usize, 192usize, 16usize), (64, 128, 80, 80)]
        .into_iter()
        .enumerate()
    {
        let seed = 4100 + 10 * ci as u64;
        let w = bf16_tensor(&[n, k], seed, 0.05)?;
        let x = bf16_tensor(&[m, k], seed + 1, 1.0)?;
        let dy = bf16_tensor(&[m, n], seed + 2, 0.1)?;
        let a = bf16_tensor(&[r, k], seed + 3, 1.0 / (k as f32).sqrt())?;
        let b = bf16_tensor(&[n, r], seed + 4, 0.02)?;
        let format = BaseFormat::Fp8(WeightScaling::Tensor);
        let cpu_grads = |mode: BackwardMode| -> Result<(Tensor, crate::lora::LoraGrads)> {
            let recipe = Recipe::from_name("tensorwise")?.with_backward(mode)?;
            let base = Base::new(&w, format).map_err(nn)?;
            let ad = Adapter {
                a: a.clone(),
                b: b.clone(),
                alpha,
            };
            let mut cpu = LoraLinear::new(base, Some(ad), Compute::Fp8, recipe).map_err(nn)?;
            let (y, saved) = cpu.forward(&x, true).map_err(nn)?;
            Ok((y, cpu.backward(saved, &dy).map_err(nn)?))
        };
        let (y_ref, g_q) = cpu_grads(BackwardMode::Quantized)?;
        let (_, g_d) = cpu_grads(BackwardMode::Dequantized)?;
        let recipe = Recipe::from_name("tensorwise")?.with_backward(BackwardMode::Quantized)?;
        let base = Base::new(&w, format).map_err(nn)?;
        let (_, mut layer) = layer_pair(
            gpu,
            base,
            (a.clone(), b.clone(), alpha),
            Compute::Fp8,
            recipe,
        )?;
        layer.fp8_saved_input = true;
        let want_bytes = 2 * m * r + m * k + 4;
        let (saved_bytes, [ey, ex, ea, eb]) =
            run_layer(gpu, &layer, (&x, &dy), (&y_ref, &g_q, &g_d))?;
        out.push(CaseResult {
            name: format!(
                "LoRA layer, quantized backward keeping the input's E4M3 codes, M={m} K={k} N={n} r={r}: vs CPU (d_A vs its dequantized backward); saved bytes exact"
            ),
            pass: ey <= BF16_OUT_TOL && ex.max(ea).max(eb) <= GRAD_TOL && saved_bytes == want_bytes,
            worst: format!(
                "y {ey:.2e}, d_input {ex:.2e}, dA {ea:.2e}, dB {eb:.2e}; saved {saved_bytes} B (want {want_bytes})"
            ),
        });
    }
    Ok(())
}

/// LoRA dropout. The kernels against the CPU's [`Dropout`] on the same key,
/// bit for bit: the masked input (lengths a multiple of 8 and not, for the
/// 16-byte and the scalar path) and the masked add into f32 and bf16 (one
/// rounding of the same f32 sum). Then a group of three adapters sharing an
/// input and its mask (as q, k, v) against three CPU layers with the same
/// mask, in each backward mode that groups them: outputs, adapter gradients
/// and the summed input gradient within the layer cases' tolerances.
pub(crate) fn dropout_cases(gpu: &Gpu, out: &mut Vec<CaseResult>) -> Result<()> {
    for (n, p) in [(4096usize, 0.25f64), (1001, 0.1)] {
        let d = Dropout::new(p, 0xd5 + n as u64).map_err(nn)?;
        let x = bf16_tensor(&[n], 4700 + n as u64, 1.0)?;
        let t_h: Vec<f32> = random_bf16(n, 4710 + n as u64, 0.5)
            .into_iter()
            .map(|v| v.to_f32())
            .collect();
        let base_h: Vec<f32> = random_bf16(n, 4720 + n as u64, 0.5)
            .into_iter()
            .map(|v| v.to_f32())
            .collect();
        let masked = gpu.download(&gpu.dropout_mask(&gpu.upload(&bits(&x))?, d.device_mask())?)?;
        let mask_ok = masked == bits(&d.mask(&x).map_err(nn)?);
        let kept = (0..n as u64).filter(|&i| d.keeps(i)).count();
        let t = gpu.upload(&t_h)?;
        let mut acc = gpu.upload(&base_h)?;
        gpu.dropout_add(&t, d.device_mask(), &mut acc, false)?;
        let mut fresh = gpu.upload(&base_h)?;
        gpu.dropout_add(&t, d.device_mask(), &mut fresh, true)?;
        let base16: Vec<u16> = base_h
            .iter()
            .map(|&v| half::bf16::from_f32(v).to_bits())
            .collect();
        let mut acc16 = gpu.upload(&base16)?;
        gpu.dropout_add(&t, d.device_mask(), &mut acc16, false)?;
        let add = |i: usize| if d.keeps(i as u64) { t_h[i] } else { 0.0 };
        let acc_ok = gpu.download(&acc)? == (0..n).map(|i| base_h[i] + add(i)).collect::<Vec<_>>();
        let fresh_ok = gpu.download(&fresh)? == (0..n).map(add).collect::<Vec<_>>();
        let acc16_ok = gpu.download(&acc16)?
            == (0..n)
                .map(|i| half::bf16::from_f32(base_h[i] + add(i)).to_bits())
                .collect::<Vec<_>>();
        out.push(CaseResult {
            name: format!("LoRA dropout kernels (n={n}, p={p}): masked input and masked add (f32, bf16, fresh) equal the CPU's bit for bit"),
            pass: mask_ok && acc_ok && fresh_ok && acc16_ok && kept > 0 && kept < n,
            worst: format!(
                "mask {mask_ok}, add {acc_ok}, fresh {fresh_ok}, bf16 {acc16_ok}; kept {kept} of {n}"
            ),
        });
    }
    let (m, k, r, alpha) = (96usize, 256usize, 16usize, 32.0f64);
    let ns = [192usize, 64, 128];
    let t = BaseFormat::Fp8(WeightScaling::Tensor);
    // (base, compute, backward, fused cast + du, d_input given to add to)
    let q = BackwardMode::Quantized;
    for (ci, (name, format, compute, mode, fuse, prefilled)) in [
        ("fp8-tensorwise", t, Compute::Fp8, q, true, false),
        ("fp8-tensorwise", t, Compute::Fp8, q, false, false),
        ("fp8-tensorwise", t, Compute::Fp8, q, true, true),
        ("fp8-tensorwise", t, Compute::Fp8, q, false, true),
        (
            "fp8-tensorwise",
            t,
            Compute::Fp8,
            BackwardMode::Dequantized,
            false,
            false,
        ),
        (
            "bf16",
            BaseFormat::Bf16,
            Compute::Bf16,
            BackwardMode::HighPrecision,
            false,
            true,
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let what = format!("LoRA dropout layer case {ci} ({name}, compute fp8)");
        if skip_without_fp8_gemm(gpu, matches!(compute, Compute::Fp8), what, out) {
            continue;
        }
        let seed = 4800 + 20 * ci as u64;
        let drop = Dropout::new(0.25, 0x5eed + ci as u64).map_err(nn)?;
        let recipe = Recipe::from_name("tensorwise")?.with_backward(mode)?;
        let x = bf16_tensor(&[m, k], seed, 1.0)?;
        let (mut cpus, mut gpus, mut dys) = (Vec::new(), Vec::new(), Vec::new());
        for (j, &n) in ns.iter().enumerate() {
            let s = seed + 1 + 5 * j as u64;
            let w = bf16_tensor(&[n, k], s, 0.05)?;
            let a = bf16_tensor(&[r, k], s + 1, 1.0 / (k as f32).sqrt())?;
            let b = bf16_tensor(&[n, r], s + 2, 0.02)?;
            dys.push(bf16_tensor(&[m, n], s + 3, 0.1)?);
            let base = Base::new(&w, format).map_err(nn)?;
            let (cpu, layer) = layer_pair(gpu, base, (a, b, alpha), compute, recipe)?;
            cpus.push(cpu);
            gpus.push(layer);
        }
        for l in &mut gpus {
            l.fuse_cast_du = fuse;
        }
        let xg = Rc::new(gpu.upload(&bits(&x))?);
        let outs = crate::lora::cuda::forward_group(&gpus, gpu, (xg, None, m), Some(drop))?;
        let (mut worst_y, mut worst_g) = (0f64, 0f64);
        let mut dx_ref: Vec<f32> = if prefilled {
            random_bf16(m * k, seed + 99, 0.01)
                .into_iter()
                .map(|v| v.to_f32())
                .collect()
        } else {
            vec![0f32; m * k]
        };
        let mut dx: Option<cudarc::driver::CudaSlice<f32>> = if prefilled {
            Some(gpu.upload(&dx_ref)?)
        } else {
            None
        };
        let mut saved = Vec::new();
        let mut grads_ref = Vec::new();
        for ((cpu, (y, s)), dy) in cpus.iter_mut().zip(outs).zip(&dys) {
            let (y_ref, cs) = cpu.forward_with(&x, true, Some(drop)).map_err(nn)?;
            worst_y = worst_y.max(rel_frobenius(&download_f32(gpu, &y)?, &y_ref.to_f32_vec()));
            let g = cpu.backward(cs, dy).map_err(nn)?;
            if let Some(d) = &g.d_input {
                dx_ref
                    .iter_mut()
                    .zip(d.to_f32_vec())
                    .for_each(|(a, b)| *a += b);
            }
            grads_ref.push(g);
            saved.push(s);
        }
        let dy_dev = dys
            .iter()
            .map(|d| gpu.upload(&bits(d)))
            .collect::<Result<Vec<_>>>()?;
        let grads = crate::lora::cuda::backward_group(
            &gpus,
            gpu,
            saved,
            dy_dev.iter().map(|d| (d, None)).collect(),
            &mut dx,
        )?;
        let dx = dx.ok_or_else(|| Error::Shape("no d_input".into()))?;
        let ex = rel_frobenius(&gpu.download(&dx)?, &dx_ref);
        let want = |t: &Option<Tensor>| t.as_ref().map(Tensor::to_f32_vec).unwrap_or_default();
        for (g, gr) in grads.into_iter().zip(&grads_ref) {
            let (da, db) = g.ok_or_else(|| Error::Shape("no adapter gradients".into()))?;
            worst_g = worst_g
                .max(rel_frobenius(&gpu.download(&da)?, &want(&gr.d_a)))
                .max(rel_frobenius(&gpu.download(&db)?, &want(&gr.d_b)));
        }
        out.push(CaseResult {
            name: format!(
                "LoRA dropout 0.25, q/k/v-like group sharing the mask: {name} base, compute {compute:?}, {mode:?} backward{}{} vs CPU LoRA layers with the same mask",
                if fuse { ", fused cast + du" } else { "" },
                if prefilled { ", adding to a given d_input" } else { "" },
            ),
            pass: worst_y <= BF16_OUT_TOL && ex.max(worst_g) <= GRAD_TOL,
            worst: format!("y {worst_y:.2e}, d_input {ex:.2e}, worst dA/dB {worst_g:.2e}"),
        });
    }
    Ok(())
}

/// The whole model in LoRA mode, GPU against the CPU `Llama` (f32) with the
/// same base, adapters and tokens: loss and every adapter gradient; then
/// three AdamW steps on the GPU change only the adapters, lower the loss, and
/// `merged_weights` reproduces the adapted model's loss as a plain model.
/// The small model of the whole-model LoRA cases: its config, random f32
/// weights, `b * t` random tokens and targets, and all seven projections as
/// LoRA targets.
type ModelSetup = (
    crate::llama::LlamaConfig,
    HashMap<String, Tensor>,
    Vec<u32>,
    Vec<u32>,
    Vec<String>,
);

/// The largest relative distance between two models' gradients, in order,
/// and its name (a NaN, or names that differ, count as the largest).
fn worst_apart(a: &[(String, Tensor)], b: &[(String, Tensor)]) -> (f64, String) {
    let mut worst = (0f64, String::new());
    for ((gn, g), (hn, h)) in a.iter().zip(b) {
        let r = if gn == hn {
            rel_frobenius(&g.to_f32_vec(), &h.to_f32_vec())
        } else {
            f64::INFINITY
        };
        if r > worst.0 || r.is_nan() {
            worst = (r, gn.clone());
        }
    }
    worst
}

/// [`ModelSetup`] with weights from `seed`, tokens from `seed + 2200` and
/// targets from `seed + 2201`.
fn model_setup(seed: u64, (b, t): (usize, usize)) -> Result<ModelSetup> {
    let cfg = crate::conformance::test_config(256, 512, 2, 4, 2, 64);
    let w = crate::conformance::test_weights(&cfg, seed)?;
    let tokens = |s: u64| crate::conformance::test_tokens(s, b * t);
    let targets = ["q", "k", "v", "o", "gate", "up", "down"]
        .map(String::from)
        .to_vec();
    Ok((cfg, w, tokens(seed + 2200), tokens(seed + 2201), targets))
}

/// The CPU LoRA model of `spec` over `(cfg, w)` and the exact reference (the
/// same adapters without input or gradient quantization: bf16 compute, the
/// high-precision backward), both loaded with adapters of random bf16 values
/// (a non-zero B; the GPU side gets the same numbers), and those adapters.
fn cpu_lora_pair(
    cfg: &crate::llama::LlamaConfig,
    w: &HashMap<String, Tensor>,
    spec: &LoraSpec,
    seed: u64,
) -> Result<(Llama, Llama, HashMap<String, Tensor>)> {
    let lora_of = |spec: &LoraSpec| -> Result<Llama> {
        Llama::from_weights(cfg, w.clone(), None)
            .map_err(nn)?
            .into_lora(spec)
            .map_err(nn)
    };
    let mut cpu = lora_of(spec)?;
    let mut adapters = HashMap::new();
    for (i, (pname, p)) in cpu.params().into_iter().enumerate() {
        let scale = if pname.contains("lora_B") { 0.02 } else { 0.05 };
        adapters.insert(pname, bf16_tensor(p.shape(), seed + i as u64, scale)?);
    }
    let f32s = || {
        adapters
            .iter()
            .map(|(k, v)| (k.clone(), v.to_dtype(DType::F32)))
            .collect()
    };
    cpu.load_params(f32s()).map_err(nn)?;
    let mut exact = lora_of(&LoraSpec {
        compute: Compute::Bf16,
        recipe: Recipe::from_name("tensorwise")?.with_backward(BackwardMode::HighPrecision)?,
        ..spec.clone()
    })?;
    exact.load_params(f32s()).map_err(nn)?;
    Ok((cpu, exact, adapters))
}

pub(crate) fn model_cases(gpu: &Gpu, out: &mut Vec<CaseResult>) -> Result<()> {
    let (b, t) = (4usize, 64usize);
    let (cfg, w, toks, tgts, targets) = model_setup(91, (b, t))?;
    for (name, base, compute, mode, dropout) in [
        (
            "fp8-tensorwise base, compute fp8, dequantized",
            BaseFormat::Fp8(WeightScaling::Tensor),
            Compute::Fp8,
            BackwardMode::Dequantized,
            0.0,
        ),
        (
            "fp8-tensorwise base, compute fp8, quantized",
            BaseFormat::Fp8(WeightScaling::Tensor),
            Compute::Fp8,
            BackwardMode::Quantized,
            0.0,
        ),
        (
            "bf16 base, compute bf16, high_precision",
            BaseFormat::Bf16,
            Compute::Bf16,
            BackwardMode::HighPrecision,
            0.0,
        ),
        // The CPU model at the same round draws the same masks.
        (
            "fp8-tensorwise base, compute fp8, quantized, dropout 0.1",
            BaseFormat::Fp8(WeightScaling::Tensor),
            Compute::Fp8,
            BackwardMode::Quantized,
            0.1,
        ),
        (
            "fp8-tensorwise base, compute fp8, dequantized, dropout 0.1",
            BaseFormat::Fp8(WeightScaling::Tensor),
            Compute::Fp8,
            BackwardMode::Dequantized,
            0.1,
        ),
    ] {
        let what = format!("LoRA model, {name}");
        if skip_without_fp8_gemm(gpu, matches!(compute, Compute::Fp8), what, out) {
            continue;
        }
        let spec = LoraSpec {
            rank: 8,
            alpha: 16.0,
            targets: targets.clone(),
            base,
            compute,
            recipe: Recipe::from_name("tensorwise")?.with_backward(mode)?,
            seed: 5,
            dropout,
        };
        let (mut cpu, mut exact, adapters) = cpu_lora_pair(&cfg, &w, &spec, 2400)?;
        let (closs, cs) = cpu.forward(&toks, &tgts, b, t).map_err(nn)?;
        let cgrads = cpu.backward(cs).map_err(nn)?;
        let (eloss, es) = exact.forward(&toks, &tgts, b, t).map_err(nn)?;
        let egrads = exact.backward(es).map_err(nn)?;
        let worst_vs = |got: &[(String, Tensor)]| worst_apart(got, &egrads);
        let mut model = GpuLlama::new_lora(gpu, &cfg, &w, &spec, Some(&adapters))?;
        model.zero_grad()?;
        let (loss, saved) = model.forward(&toks, &tgts, (b, t), 1.0, true)?;
        let saved = saved.ok_or_else(|| Error::Shape("nothing kept".into()))?;
        let full_bytes = saved.bytes();
        model.backward(saved)?;
        let grads = model.grads()?;
        // The same model with one setting changed: its loss and gradients.
        #[allow(clippy::type_complexity)]
        let variant = |set: &dyn Fn(&mut GpuLlama)| -> Result<(f64, Vec<(String, Tensor)>)> {
            let mut v = GpuLlama::new_lora(gpu, &cfg, &w, &spec, Some(&adapters))?;
            set(&mut v);
            v.zero_grad()?;
            let (vloss, vsaved) = v.forward(&toks, &tgts, (b, t), 1.0, true)?;
            v.backward(vsaved.ok_or_else(|| Error::Shape("nothing kept".into()))?)?;
            Ok((vloss, v.grads()?))
        };
        let (eg, gname) = worst_vs(&grads);
        let (ecg, _) = worst_vs(&cgrads);
        let el = (loss - eloss).abs() / eloss;
        let ecl = (closs - eloss).abs() / eloss;
        // As the full model's case: bf16 activations against f32 allow 2e-3 on
        // the loss and 3e-2 on the worst gradient; FP8 inputs and gradients
        // (compute fp8, quantized backward) add their own noise, which the
        // CPU model with the same settings shows against the same reference.
        out.push(CaseResult {
            name: format!("Llama LoRA ({name}) fwd+bwd vs CPU LoRA model (f32, no input quantization): loss, adapter grads"),
            pass: el <= 2.0 * ecl + 2e-3
                && eg <= 1.5 * ecg + 3e-2
                && grads.len() == egrads.len()
                && grads.len() == 28,
            worst: format!(
                "loss {el:.2e}, worst grad {eg:.2e} ({gname}), {} adapter tensors; CPU model with the same settings: loss {ecl:.2e}, grad {ecg:.2e}",
                grads.len()
            ),
        });
        if mode == BackwardMode::Quantized {
            // The norm, attention, SwiGLU, RoPE and cast kernels compute the
            // amaxes of the FP8 base's inputs and output gradients: the same
            // scales as the amax passes, so the same loss and gradients, bit for bit.
            let (ploss, pgrads) = variant(&|m| m.fuse_amax = false)?;
            let differ = crate::conformance::differing(&grads, &pgrads);
            out.push(CaseResult {
                name: format!(
                    "Llama LoRA ({name}): fused amaxes give the bytes of the amax passes"
                ),
                pass: ploss.to_bits() == loss.to_bits()
                    && differ == 0
                    && grads.len() == pgrads.len(),
                worst: format!(
                    "loss {loss} / {ploss}; {differ} of {} gradients differ",
                    grads.len()
                ),
            });
            // The output gradients' codes and the adapters' du in one read of
            // each gradient (`lora_cast_du`, the default) against the cast and
            // a cuBLASLt GEMM: the same codes for the same gradient, du within
            // a bf16 rounding (checked tightly per layer: `fused_cases`,
            // `dropout_cases`). Through the model the two paths round the
            // adapters' share of each input gradient differently; where that
            // moves a later gradient's largest element by one bf16 step, its
            // E5M2 scale moves and codes flip all over the tensor. So the
            // whole-model bound is the quantized backward's own noise: the
            // CPU model's distance from the exact one with the same settings
            // (the dropout case hits this: 7.5e-2 here, 9.6e-2 the CPU's),
            // and the bf16 allowance where that is smaller.
            let (sloss, sgrads) = variant(&|m| m.set_lora_fuse_cast_du(false))?;
            let worst = worst_apart(&grads, &sgrads);
            // The top block's down projection runs first, on the same
            // gradient in both: its adapter's gradients agree within the
            // bf16 allowance whatever happens downstream.
            let worst_of = |part: &str| {
                grads
                    .iter()
                    .zip(&sgrads)
                    .filter(|((gn, _), _)| gn.contains(part))
                    .map(|((_, g), (_, h))| rel_frobenius(&g.to_f32_vec(), &h.to_f32_vec()))
                    .fold(0f64, f64::max)
            };
            let top = cfg.num_hidden_layers - 1;
            let worst_top = worst_of(&format!("layers.{top}."));
            let worst_down = worst_of(&format!("layers.{top}.mlp.down_proj"));
            out.push(CaseResult {
                name: format!(
                    "Llama LoRA ({name}): fused cast + du against the cast and a GEMM (same loss, adapter grads)"
                ),
                pass: sloss.to_bits() == loss.to_bits()
                    && worst.0 <= GRAD_TOL.max(ecg)
                    && worst_down <= GRAD_TOL
                    && grads.len() == sgrads.len(),
                worst: format!(
                    "loss {loss} / {sloss}; worst grad {:.2e} ({}); top block's worst {worst_top:.2e}, its down_proj's {worst_down:.2e}; CPU model's noise {ecg:.2e}",
                    worst.0, worst.1
                ),
            });
        }
        if compute == Compute::Fp8 && dropout == 0.0 {
            // The forward's inputs' codes and the adapters' u in one read of
            // each input (`lora_cast_u`, the default) against the cast and a
            // cuBLASLt GEMM: the same codes, u within a bf16 rounding
            // (`fused_cases`), so the loss within the bf16 allowance and the
            // gradients within the model's own noise, as the fused du above.
            let (uloss, ugrads) = variant(&|m| m.set_lora_fuse_cast_u(false))?;
            let worst = worst_apart(&grads, &ugrads);
            let el = (loss - uloss).abs() / uloss.abs();
            out.push(CaseResult {
                name: format!(
                    "Llama LoRA ({name}): fused cast + u against the cast and a GEMM (loss, adapter grads)"
                ),
                pass: el <= 2e-3 && worst.0 <= GRAD_TOL.max(ecg) && grads.len() == ugrads.len(),
                worst: format!(
                    "loss {loss} / {uloss} ({el:.2e}); worst grad {:.2e} ({}); CPU model's noise {ecg:.2e}",
                    worst.0, worst.1
                ),
            });
        }
        if mode != BackwardMode::HighPrecision {
            // FP8 saved activations (the memory setting of the LoRA step):
            // the same forward; exactly the bytes that FP8 norm inputs,
            // SwiGLU inputs and the attention output read from o's adapter
            // input save (and under the quantized backward the adapters'
            // inputs kept as their E4M3 codes); adapter gradients within
            // 2^-4 more of the reference (the bound of `check::saved_fp8_cases`).
            let mut fp8 = GpuLlama::new_lora(gpu, &cfg, &w, &spec, Some(&adapters))?;
            fp8.saved_activations = crate::llama::cuda::SavedActivations::Fp8;
            fp8.zero_grad()?;
            let (floss, fsaved) = fp8.forward(&toks, &tgts, (b, t), 1.0, true)?;
            let fsaved = fsaved.ok_or_else(|| Error::Shape("nothing kept".into()))?;
            let fbytes = fsaved.bytes();
            fp8.backward(fsaved)?;
            let (fg, fname) = worst_vs(&fp8.grads()?);
            let (n, c, ff, l) = (
                b * t,
                cfg.hidden_size,
                cfg.intermediate_size,
                cfg.num_hidden_layers,
            );
            let norms_swiglu = (2 * l + 1) * (3 * n * c - 4 * n) + l * (2 * n * ff - 8 * n);
            let want = match mode {
                // o's FP8 input was kept already; the bf16 attention output goes.
                BackwardMode::Dequantized => norms_swiglu + l * 2 * n * c,
                // bf16 -> E4M3 codes and a factor: the attention output (o's
                // input, which the attention backward then reads), the two
                // norms' outputs (q, k, v's and gate, up's) and down's input.
                _ => norms_swiglu + l * (3 * (n * c - 4) + n * ff - 4),
            };
            out.push(CaseResult {
                name: format!("Llama LoRA ({name}): FP8 saved activations (same loss bits, exact saved bytes, adapter grads)"),
                pass: floss.to_bits() == loss.to_bits()
                    && full_bytes.checked_sub(fbytes) == Some(want)
                    && fg <= eg + 0.0625,
                worst: format!(
                    "loss {loss} / {floss}; saved {full_bytes} -> {fbytes} B (want -{want}); worst grad {eg:.2e} -> {fg:.2e} ({fname})"
                ),
            });
        }
        if mode != BackwardMode::Dequantized {
            continue;
        }
        // Training: only adapters move; the merged model computes the adapted loss.
        let before = model.weights()?;
        let p = AdamParams {
            lr: 1e-2,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.0,
            grad_clip: 1.0,
        };
        let mut losses = vec![loss];
        model.adamw_step(p)?;
        for _ in 0..3 {
            model.zero_grad()?;
            let (l, s) = model.forward(&toks, &tgts, (b, t), 1.0, true)?;
            model.backward(s.ok_or_else(|| Error::Shape("nothing kept".into()))?)?;
            model.adamw_step(p)?;
            losses.push(l);
        }
        let (last, _) = model.forward(&toks, &tgts, (b, t), 0.0, false)?;
        let moved = model
            .weights()?
            .iter()
            .zip(&before)
            .all(|((_, a), (_, b))| a.to_f32_vec() != b.to_f32_vec());
        let transposed = model.lora_transposes_match()?;
        let merged: HashMap<String, Tensor> = model.merged_weights()?.into_iter().collect();
        let mut plain = GpuLlama::new(gpu, &cfg, &merged, None)?;
        let (mloss, _) = plain.forward(&toks, &tgts, (b, t), 0.0, false)?;
        // The merged bf16 weight rounds W + s B A once; the LoRA model adds the
        // adapter's bf16 product to the FP8 base's: a few bf16 roundings apart.
        let em = (mloss - last).abs() / last;
        let fp8_bytes = model.base_bytes();
        let bf16_bytes = {
            let spec16 = LoraSpec {
                base: BaseFormat::Bf16,
                compute: Compute::Bf16,
                ..spec.clone()
            };
            GpuLlama::new_lora(gpu, &cfg, &w, &spec16, None)?.base_bytes()
        };
        out.push(CaseResult {
            name: format!("Llama LoRA ({name}): 4 AdamW steps move every adapter (B^T kept with B) and lower the loss; merged weights give the adapted loss; FP8 base <= 0.52x bf16 bytes"),
            pass: moved
                && transposed
                && losses.windows(2).all(|p| p[1] < p[0])
                && last < losses[losses.len() - 1]
                && em <= 2e-2
                && (fp8_bytes as f64) <= 0.52 * bf16_bytes as f64,
            worst: format!(
                "losses {losses:.4?} then {last:.4}; merged {mloss:.4} ({em:.2e}); base {fp8_bytes} vs {bf16_bytes} B; B^T copies match: {transposed}"
            ),
        });
    }
    Ok(())
}

/// `(name, each projection's stored scaling, compute, backward)`.
type StoredCase = (
    &'static str,
    fn(&str) -> WeightScaling,
    Compute,
    BackwardMode,
);

/// LoRA on a base whose block matrices a checkpoint stored in FP8
/// ([`GpuLlama::new_lora_with`], as `octet lora` reads an FP8
/// `model.safetensors`): the GPU keeps the stored codes and factors (per
/// channel, 128x128 blocks, per tensor: whatever the file holds, not the
/// spec's format) and computes what the CPU `Llama::into_lora_with` computes
/// from the same codes.
pub(crate) fn stored_cases(gpu: &Gpu, out: &mut Vec<CaseResult>) -> Result<()> {
    use octet_tensor::mixed::Fp8Weight;
    let (b, t) = (2usize, 64usize);
    let (cfg, w, toks, tgts, targets) = model_setup(93, (b, t))?;
    // The scaling a checkpoint stored each projection with.
    let mixed_scaling = |name: &str| -> WeightScaling {
        if name.contains("mlp.gate") || name.contains("mlp.up") {
            WeightScaling::Block128
        } else if name.contains("down") {
            WeightScaling::Tensor
        } else {
            WeightScaling::Channel
        }
    };
    let all_tensor = |_: &str| WeightScaling::Tensor;
    let cases: [StoredCase; 2] = [
        (
            "stored per channel, 128x128 blocks and per tensor; compute bf16, high_precision",
            mixed_scaling,
            Compute::Bf16,
            BackwardMode::HighPrecision,
        ),
        (
            "stored per tensor; compute fp8, quantized",
            all_tensor,
            Compute::Fp8,
            BackwardMode::Quantized,
        ),
    ];
    for (name, scaling, compute, mode) in cases {
        let what = format!("LoRA model on a stored FP8 checkpoint, {name}");
        if skip_without_fp8_gemm(gpu, matches!(compute, Compute::Fp8), what, out) {
            continue;
        }
        let mut stored: HashMap<String, Fp8Weight> = HashMap::new();
        for (n, t) in &w {
            if n.ends_with("_proj.weight") {
                let (r, c) = (t.shape()[0], t.shape()[1]);
                let q = Fp8Weight::quantize(&t.to_f32_vec(), r, c, Format::E4M3, scaling(n))
                    .map_err(|e| Error::Shape(e.to_string()))?;
                stored.insert(n.clone(), q);
            }
        }
        let stored_bytes: usize = stored.values().map(|q| q.bytes()).sum();
        let spec = LoraSpec {
            rank: 8,
            alpha: 16.0,
            targets: targets.clone(),
            base: BaseFormat::Fp8(WeightScaling::Tensor),
            compute,
            recipe: Recipe::from_name("tensorwise")?.with_backward(mode)?,
            seed: 7,
            dropout: 0.0,
        };
        let cpu_model = |spec: &LoraSpec| -> Result<Llama> {
            Llama::from_weights(&cfg, w.clone(), None)
                .map_err(nn)?
                .into_lora_with(spec, &mut stored.clone())
                .map_err(nn)
        };
        let mut cpu = cpu_model(&spec)?;
        let mut adapters = HashMap::new();
        for (i, (pname, p)) in cpu.params().into_iter().enumerate() {
            let scale = if pname.contains("lora_B") { 0.02 } else { 0.05 };
            adapters.insert(pname, bf16_tensor(p.shape(), 2500 + i as u64, scale)?);
        }
        let f32_adapters: HashMap<String, Tensor> = adapters
            .iter()
            .map(|(k, v)| (k.clone(), v.to_dtype(DType::F32)))
            .collect();
        cpu.load_params(f32_adapters.clone()).map_err(nn)?;
        let (closs, cs) = cpu.forward(&toks, &tgts, b, t).map_err(nn)?;
        let cgrads = cpu.backward(cs).map_err(nn)?;
        // The exact reference: the same codes, no input or gradient quantization.
        let mut exact = cpu_model(&LoraSpec {
            compute: Compute::Bf16,
            recipe: Recipe::from_name("tensorwise")?.with_backward(BackwardMode::HighPrecision)?,
            ..spec.clone()
        })?;
        exact.load_params(f32_adapters).map_err(nn)?;
        let (eloss, es) = exact.forward(&toks, &tgts, b, t).map_err(nn)?;
        let egrads = exact.backward(es).map_err(nn)?;
        let worst_vs = |got: &[(String, Tensor)]| -> f64 {
            let mut worst = 0f64;
            for ((gn, g), (en, e)) in got.iter().zip(&egrads) {
                let r = if gn == en {
                    rel_frobenius(&g.to_f32_vec(), &e.to_f32_vec())
                } else {
                    f64::INFINITY
                };
                if r > worst || r.is_nan() {
                    worst = r;
                }
            }
            worst
        };
        let mut as_stored = stored.clone();
        let mut model =
            GpuLlama::new_lora_with(gpu, &cfg, &w, &spec, Some(&adapters), &mut as_stored)?;
        model.zero_grad()?;
        let (loss, saved) = model.forward(&toks, &tgts, (b, t), 1.0, true)?;
        model.backward(saved.ok_or_else(|| Error::Shape("nothing kept".into()))?)?;
        let grads = model.grads()?;
        let (eg, ecg) = (worst_vs(&grads), worst_vs(&cgrads));
        let (el, ecl) = ((loss - eloss).abs() / eloss, (closs - eloss).abs() / eloss);
        let base = model.base_bytes();
        // The bounds of the whole-model LoRA cases above.
        out.push(CaseResult {
            name: format!("Llama LoRA on FP8 checkpoint codes ({name}) vs CPU into_lora_with: loss, adapter grads, base bytes as stored"),
            pass: el <= 2.0 * ecl + 2e-3
                && eg <= 1.5 * ecg + 3e-2
                && grads.len() == 28
                && as_stored.is_empty()
                && base == stored_bytes,
            worst: format!(
                "loss {el:.2e}, worst grad {eg:.2e}; CPU with the same settings: loss {ecl:.2e}, grad {ecg:.2e}; base {base} B, stored {stored_bytes} B, {} left unused",
                as_stored.len()
            ),
        });
    }
    Ok(())
}

/// A LoRA layer `(n, k)` over a zero bf16 base with a rank-`r` adapter of
/// small random values, `--compute bf16`, the `high_precision` backward.
pub(super) fn small_lora(
    gpu: &Gpu,
    (n, k): (usize, usize),
    r: usize,
) -> Result<crate::lora::cuda::GpuLoraLinear> {
    use crate::lora::cuda::{GpuAdapter, GpuBase, GpuLoraLinear};
    let base = GpuBase::Bf16(gpu.alloc_zeros(n * k, "base")?);
    let a = gpu.upload(&bf16_bits(&random_bf16(r * k, 31, 0.1)))?;
    let b = gpu.upload(&bf16_bits(&random_bf16(n * r, 32, 0.1)))?;
    let ad = GpuAdapter::new(gpu, a, b, r, 1.0)?;
    GpuLoraLinear::new(
        base,
        (n, k),
        Some(ad),
        crate::lora::Compute::Bf16,
        octet_fp8::BackwardMode::HighPrecision,
    )
}

/// LoRA layers whose public fields were changed after `GpuLoraLinear::new`.
pub(super) fn lora_error_cases(gpu: &Gpu, out: &mut Vec<CaseResult>) -> Result<()> {
    use crate::lora::cuda::{forward_group, GpuAdapter};
    let (m, n, k, r) = (16usize, 16usize, 16usize, 8usize);
    let x = std::rc::Rc::new(gpu.upload(&bf16_bits(&random_bf16(m * k, 33, 1.0)))?);
    // Two adapters of rank 8 at m = 16 form one group (r m % 128 == 0), whose
    // A is stacked by copies: a short A left rows of it unwritten.
    let mut layers = vec![small_lora(gpu, (n, k), r)?, small_lora(gpu, (n, k), r)?];
    let short = gpu.upload(&bf16_bits(&random_bf16((r - 1) * k, 34, 0.1)))?;
    let b = gpu.upload(&bf16_bits(&random_bf16(n * r, 35, 0.1)))?;
    layers[1].adapter = Some(GpuAdapter::new(gpu, short, b, r, 1.0)?);
    out.push(shape_error(
        "LoRA group forward with an adapter A of (r - 1) k elements set after new -> shape error",
        forward_group(&layers, gpu, (x.clone(), None, m), None),
    ));
    // Backward with an adapter of another rank than the forward saved `u`
    // for: rank 16 in place of 8 read the next adapter's rows of the
    // group's u (16 rows), a wrong d_B and no error.
    let mut layers = vec![small_lora(gpu, (n, k), r)?, small_lora(gpu, (n, k), r)?];
    let saved: Vec<_> = forward_group(&layers, gpu, (x.clone(), None, m), None)?
        .into_iter()
        .map(|(_, s)| s)
        .collect();
    layers[0] = small_lora(gpu, (n, k), 2 * r)?;
    let dy = gpu.upload(&bf16_bits(&random_bf16(m * n, 36, 1.0)))?;
    let mut dx: Option<CudaSlice<f32>> = None;
    out.push(shape_error(
        "LoRA backward with an adapter of rank 16 for a forward of rank 8 -> shape error",
        crate::lora::cuda::backward_group(
            &layers,
            gpu,
            saved,
            vec![(&dy, None), (&dy, None)],
            &mut dx,
        ),
    ));
    // A per-tensor FP8 base of (16, 32) set in place of the (32, 16) one:
    // the same number of codes, so the FP8 GEMM ran with the wrong matrix.
    use octet_tensor::mixed::WeightScaling;
    let w = gpu.upload_fp8_weight(&small_fp8_weight(32, 16, WeightScaling::Tensor)?)?;
    let mut fp8 = crate::lora::cuda::GpuLoraLinear::new(
        crate::lora::cuda::GpuBase::Fp8(w),
        (32, 16),
        None,
        crate::lora::Compute::Fp8,
        octet_fp8::BackwardMode::HighPrecision,
    )?;
    let wt = gpu.upload_fp8_weight(&small_fp8_weight(16, 32, WeightScaling::Tensor)?)?;
    fp8.base = crate::lora::cuda::GpuBase::Fp8(wt);
    out.push(shape_error(
        "LoRA FP8 forward of a (32, 16) layer whose base was set to (16, 32) -> shape error",
        forward_group(std::slice::from_ref(&fp8), gpu, (x.clone(), None, m), None),
    ));
    Ok(())
}

/// LoRA over the model families (Qwen2's q/k/v biases, Qwen3's q/k norms
/// with a head width of its own): the GPU LoRA model against the CPU LoRA
/// model without input or gradient quantization, with the bounds of
/// [`model_cases`] (the biases and norm gains frozen, as the base's weights).
pub(crate) fn family_model_cases(gpu: &Gpu, out: &mut Vec<CaseResult>) -> Result<()> {
    let (b, t) = (4usize, 64usize);
    let (base_cfg, _, toks, tgts, targets) = model_setup(93, (b, t))?;
    for (family, cfg) in [
        (
            "Qwen2: q/k/v biases",
            crate::llama::LlamaConfig {
                qkv_bias: true,
                ..base_cfg.clone()
            },
        ),
        (
            "Qwen3: q/k norms, head_dim 128",
            crate::llama::LlamaConfig {
                qk_norm: true,
                head_dim: Some(128),
                ..base_cfg.clone()
            },
        ),
    ] {
        let w = super::family::perturbed(crate::conformance::test_weights(&cfg, 93)?, 2410)?;
        for (name, base, compute, mode) in [
            (
                "fp8-tensorwise base, compute fp8, quantized",
                BaseFormat::Fp8(WeightScaling::Tensor),
                Compute::Fp8,
                BackwardMode::Quantized,
            ),
            (
                "bf16 base, compute bf16, high_precision",
                BaseFormat::Bf16,
                Compute::Bf16,
                BackwardMode::HighPrecision,
            ),
        ] {
            let what = format!("LoRA {family}, {name}");
            if skip_without_fp8_gemm(gpu, matches!(compute, Compute::Fp8), what, out) {
                continue;
            }
            let spec = LoraSpec {
                rank: 8,
                alpha: 16.0,
                targets: targets.clone(),
                base,
                compute,
                recipe: Recipe::from_name("tensorwise")?.with_backward(mode)?,
                seed: 5,
                dropout: 0.0,
            };
            let (mut cpu, mut exact, adapters) = cpu_lora_pair(&cfg, &w, &spec, 2500)?;
            let (closs, cs) = cpu.forward(&toks, &tgts, b, t).map_err(nn)?;
            let cgrads = cpu.backward(cs).map_err(nn)?;
            let (eloss, es) = exact.forward(&toks, &tgts, b, t).map_err(nn)?;
            let egrads = exact.backward(es).map_err(nn)?;
            let mut model = GpuLlama::new_lora(gpu, &cfg, &w, &spec, Some(&adapters))?;
            model.zero_grad()?;
            let (loss, saved) = model.forward(&toks, &tgts, (b, t), 1.0, true)?;
            model.backward(saved.ok_or_else(|| Error::Shape("nothing kept".into()))?)?;
            let grads = model.grads()?;
            let (eg, gname) = worst_apart(&grads, &egrads);
            let (ecg, _) = worst_apart(&cgrads, &egrads);
            let el = (loss - eloss).abs() / eloss;
            let ecl = (closs - eloss).abs() / eloss;
            out.push(CaseResult {
                name: format!("Llama LoRA {family} ({name}) fwd+bwd vs CPU LoRA model (f32, no input quantization)"),
                pass: el <= 2.0 * ecl + 2e-3
                    && eg <= 1.5 * ecg + 3e-2
                    && grads.len() == egrads.len()
                    && grads.len() == 28,
                worst: format!(
                    "loss {el:.2e}, worst grad {eg:.2e} ({gname}), {} adapter tensors; CPU model with the same settings: loss {ecl:.2e}, grad {ecg:.2e}",
                    grads.len()
                ),
            });
        }
    }
    Ok(())
}

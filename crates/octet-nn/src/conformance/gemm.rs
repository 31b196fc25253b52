//! GEMMs against `octet_tensor::cpu`: FP8 (per-tensor, fast accumulation,
//! block-scaled) and bf16, and the errors a bad operand gets.

use super::*;

pub(super) fn gemm_fp8_cases(gpu: &Gpu, out: &mut Vec<CaseResult>) -> Result<()> {
    for &(m, k, n, fa, fb) in &[
        (256, 512, 384, Format::E4M3, Format::E4M3),
        (1024, 1024, 1024, Format::E4M3, Format::E4M3),
        (512, 256, 128, Format::E5M2, Format::E4M3),
        (128, 8192, 256, Format::E4M3, Format::E4M3),
        (256, 4096, 512, Format::E4M3, Format::E5M2),
    ] {
        let (a, b) = (
            random_bf16(m * k, 7 + k as u64, 2.0),
            random_bf16(n * k, 8 + m as u64, 0.5),
        );
        let (da, db) = (gpu.upload(&bf16_bits(&a))?, gpu.upload(&bf16_bits(&b))?);
        let qa = gpu.quantize_tensorwise(&da, m, k, fa, true)?;
        let qb = gpu.quantize_tensorwise(&db, n, k, fb, true)?;
        let want = octet_tensor::cpu::fp8_gemm(
            &to_host(gpu, &qa, Layout::Rowwise)?,
            &to_host(gpu, &qb, Layout::Rowwise)?,
        )?;
        for fast in [false, true] {
            let mut d: CudaSlice<f32> = gpu.upload(&vec![f32::NAN; m * n])?;
            gpu.gemm_fp8(
                qa.rowwise_operand(),
                qb.rowwise_operand(),
                &mut d,
                (m, n, k),
                fast,
            )?;
            let e = rel_frobenius(&download_f32(gpu, &d)?, &want);
            let tol = if fast { FP8_FAST_TOL } else { FP8_TOL };
            out.push(CaseResult {
                name: format!(
                    "gemm fp8 {fa}x{fb} {m}x{k}x{n} ->f32{} vs CPU fp8_gemm",
                    if fast { " fast-accum" } else { "" }
                ),
                pass: e < tol,
                worst: format!("rel Frobenius {e:.2e} (tol {tol:.0e})"),
            });
        }
        // bf16 output: each element within its rounding plus the accumulation error.
        let mut d: CudaSlice<u16> = gpu.upload(&vec![0xFFFFu16; m * n])?;
        gpu.gemm_fp8(
            qa.rowwise_operand(),
            qb.rowwise_operand(),
            &mut d,
            (m, n, k),
            false,
        )?;
        let got = download_f32(gpu, &d)?;
        let (bad, worst) = bf16_outside(&got, &want, 10.0 * FP8_TOL * rms(&want));
        let e = rel_frobenius(&got, &want);
        out.push(CaseResult {
            name: format!("gemm fp8 {fa}x{fb} {m}x{k}x{n} ->bf16 vs CPU fp8_gemm"),
            pass: bad == 0 && e < BF16_OUT_TOL,
            worst: format!(
                "rel Frobenius {e:.2e}; {bad} of {} outside 2^-8|w|+2e-3 rms (worst {worst:.2} of bound)",
                m * n
            ),
        });
    }
    // The backward operands: grad_weight-like D (k, n) = X^T (k, m) @ Y (m, n)
    // from the column-wise copies of X (m, k) and Y (m, n).
    let (m, k, n) = (384, 256, 512);
    let (x, y) = (random_bf16(m * k, 31, 1.0), random_bf16(m * n, 32, 0.1));
    let (dx, dy) = (gpu.upload(&bf16_bits(&x))?, gpu.upload(&bf16_bits(&y))?);
    let qx = gpu.quantize_tensorwise(&dx, m, k, Format::E4M3, true)?;
    let qy = gpu.quantize_tensorwise(&dy, m, n, Format::E5M2, true)?;
    let want = octet_tensor::cpu::fp8_gemm(
        &to_host(gpu, &qx, Layout::Colwise)?,
        &to_host(gpu, &qy, Layout::Colwise)?,
    )?;
    let mut d: CudaSlice<f32> = gpu.upload(&vec![f32::NAN; k * n])?;
    gpu.gemm_fp8(
        qx.colwise_operand(),
        qy.colwise_operand(),
        &mut d,
        (k, n, m),
        false,
    )?;
    let e = rel_frobenius(&download_f32(gpu, &d)?, &want);
    out.push(CaseResult {
        name: format!("gemm fp8 e4m3xe5m2 col-wise operands (X^T Y) {k}x{m}x{n} ->f32"),
        pass: e < FP8_TOL,
        worst: format!("rel Frobenius {e:.2e} (tol {FP8_TOL:.0e})"),
    });
    Ok(())
}

// bf16 GEMM with f32 output against the CPU's f32 GEMM of the same bf16 values:
// products are exact in f32, only the summation order differs. Measured on an
// H100: 1.3e-7 (k=136) to 8.8e-7 (k=1024).
pub(super) fn gemm_bf16_cases(gpu: &Gpu, out: &mut Vec<CaseResult>) -> Result<()> {
    let f = |v: &[bf16]| v.iter().map(|e| e.to_f32()).collect::<Vec<f32>>();
    for &(m, k, n) in &[(256, 512, 384), (1024, 1024, 1024), (200, 136, 120)] {
        let (a, b) = (random_bf16(m * k, 41, 2.0), random_bf16(n * k, 42, 0.5));
        let (da, db) = (gpu.upload(&bf16_bits(&a))?, gpu.upload(&bf16_bits(&b))?);
        let want = octet_tensor::cpu::sgemm(m, n, k, &f(&a), false, &f(&b), true);
        let mut d: CudaSlice<f32> = gpu.upload(&vec![f32::NAN; m * n])?;
        gpu.gemm_bf16(&da, &db, &mut d, (m, n, k))?;
        let e = rel_frobenius(&download_f32(gpu, &d)?, &want);
        out.push(CaseResult {
            name: format!("gemm bf16 TN {m}x{k}x{n} ->f32 vs CPU f32"),
            pass: e < BF16_F32_TOL,
            worst: format!("rel Frobenius {e:.2e} (tol {BF16_F32_TOL:.0e})"),
        });
        let mut d: CudaSlice<u16> = gpu.upload(&vec![0xFFFFu16; m * n])?;
        gpu.gemm_bf16(&da, &db, &mut d, (m, n, k))?;
        let got = download_f32(gpu, &d)?;
        let (bad, worst) = bf16_outside(&got, &want, 10.0 * BF16_F32_TOL * rms(&want));
        let e = rel_frobenius(&got, &want);
        out.push(CaseResult {
            name: format!("gemm bf16 TN {m}x{k}x{n} ->bf16 vs CPU f32"),
            pass: bad == 0 && e < BF16_OUT_TOL,
            worst: format!(
                "rel Frobenius {e:.2e}; {bad} of {} outside 2^-8|w|+1e-4 rms (worst {worst:.2} of bound)",
                m * n
            ),
        });
    }
    // The high-precision backward GEMMs with transposed operands.
    let (m, k, n) = (192, 320, 256);
    let (dy, w, x) = (
        random_bf16(m * n, 21, 1.0),
        random_bf16(n * k, 22, 1.0),
        random_bf16(m * k, 23, 1.0),
    );
    let (ddy, dw, dx) = (
        gpu.upload(&bf16_bits(&dy))?,
        gpu.upload(&bf16_bits(&w))?,
        gpu.upload(&bf16_bits(&x))?,
    );
    let mut d: CudaSlice<f32> = gpu.upload(&vec![f32::NAN; m * k])?;
    gpu.gemm_bf16_op((&ddy, false), (&dw, false), &mut d, (m, k, n))?;
    let e = rel_frobenius(
        &download_f32(gpu, &d)?,
        &octet_tensor::cpu::sgemm(m, k, n, &f(&dy), false, &f(&w), false),
    );
    out.push(CaseResult {
        name: format!("gemm bf16 NN (grad_input) {m}x{n}x{k} ->f32"),
        pass: e < BF16_F32_TOL,
        worst: format!("rel Frobenius {e:.2e}"),
    });
    let mut d: CudaSlice<f32> = gpu.upload(&vec![f32::NAN; n * k])?;
    gpu.gemm_bf16_op((&ddy, true), (&dx, false), &mut d, (n, k, m))?;
    let e = rel_frobenius(
        &download_f32(gpu, &d)?,
        &octet_tensor::cpu::sgemm(n, k, m, &f(&dy), true, &f(&x), false),
    );
    out.push(CaseResult {
        name: format!("gemm bf16 TN-transposed (grad_weight) {n}x{m}x{k} ->f32"),
        pass: e < BF16_F32_TOL,
        worst: format!("rel Frobenius {e:.2e}"),
    });
    Ok(())
}

/// 128x128 block quantize bit-exact against the CPU's `blk128x128` (both
/// copies), then block-scaled FP8 GEMMs from device-quantized operands
/// (1x128 activations x 128x128 weights, E5M2 1x128 gradients x 128x128
/// weights, 1x128 x 1x128 for the weight gradient) against the CPU's
/// exact-product FP8 GEMM of the CPU-quantized operands. The inputs' magnitudes
/// change from block to block, so a scale read from the wrong block is a large error.
pub(super) fn block_gemm_cases(gpu: &Gpu, out: &mut Vec<CaseResult>) -> Result<()> {
    let tile = |format: Format, r: usize, c: usize| QuantSpec {
        format,
        granularity: Granularity::Tile { rows: r, cols: c },
        rule: ScaleRule::Amax {
            power_of_two: false,
        },
        rounding: Rounding::NearestEven,
    };
    let vary = |v: Vec<f32>, cols: usize| -> Vec<f32> {
        v.into_iter()
            .enumerate()
            .map(|(i, x)| {
                let (r, c) = (i / cols, i % cols);
                x * 2f32.powi(((r / 128 + 3 * (c / 128)) % 7) as i32 - 3)
            })
            .collect()
    };
    // 1. The 128x128 quantizer.
    for (i, &(rows, cols)) in [
        (256usize, 512usize),
        (217, 300),
        (1, 16),
        (333, 1000),
        (128, 4096),
    ]
    .iter()
    .enumerate()
    {
        let xb: Vec<bf16> = vary(random_f32(rows * cols, 950 + i as u64, 3.0), cols)
            .iter()
            .map(|&v| bf16::from_f32(v))
            .collect();
        for format in [Format::E4M3, Format::E5M2] {
            let sp = tile(format, 128, 128);
            let want = octet_fp8::quantize(&xb, rows, cols, &sp, &sp, Usage::BOTH, None)?;
            let mut q = gpu.alloc_block2d_fp8(rows, cols, format)?;
            gpu.quantize_block128x128_into(&gpu.upload(&bf16_bits(&xb))?, &mut q, true)?;
            let (pr, tr) = compare_copy(
                &gpu.download(&q.rowwise)?,
                &gpu.download(&q.row_scale_inv)?,
                want.get(Layout::Rowwise)?,
                "row",
            );
            let (pc, tc) = compare_copy(
                &gpu.download(&q.colwise)?,
                &gpu.download(&q.col_scale_inv)?,
                want.get(Layout::Colwise)?,
                "col",
            );
            out.push(CaseResult {
                name: format!("quantize 128x128 bf16 -> {} {rows}x{cols}", format.name()),
                pass: pr && pc,
                worst: format!("{tr}; {tc}"),
            });
        }
    }
    // 2. The GEMMs, operands quantized on the device.
    // k/128 of 4, 12, 3 and 5 blocks (the last two pad cuBLASLt's 128x128
    // scale rows), and k = 352 (codes padded with zeros to 384, then as 3 blocks).
    for &(m, k, n) in &[
        (1024usize, 512usize, 1536usize),
        (1040, 512, 640),
        (512, 384, 640),
        (512, 352, 352),
    ] {
        let xa: Vec<bf16> = vary(random_f32(m * k, 901, 2.0), k)
            .iter()
            .map(|&v| bf16::from_f32(v))
            .collect();
        let xw: Vec<bf16> = vary(random_f32(n * k, 902, 0.1), k)
            .iter()
            .map(|&v| bf16::from_f32(v))
            .collect();
        let xg: Vec<bf16> = vary(random_f32(m * n, 903, 1e-3), n)
            .iter()
            .map(|&v| bf16::from_f32(v))
            .collect();
        // CPU references.
        let s1 = tile(Format::E4M3, 1, 128);
        let s2 = tile(Format::E4M3, 128, 128);
        let g1 = tile(Format::E5M2, 1, 128);
        let qa = octet_fp8::quantize(&xa, m, k, &s1, &s1, Usage::BOTH, None)?;
        let qw = octet_fp8::quantize(&xw, n, k, &s2, &s2, Usage::BOTH, None)?;
        let qg = octet_fp8::quantize(&xg, m, n, &g1, &g1, Usage::BOTH, None)?;
        let cpu = |a: &QuantData, b: &QuantData| {
            octet_tensor::cpu::fp8_gemm(a, b).map_err(|e| Error::Shape(e.to_string()))
        };
        let want_y = cpu(qa.get(Layout::Rowwise)?, qw.get(Layout::Rowwise)?)?;
        let want_dx = cpu(qg.get(Layout::Rowwise)?, qw.get(Layout::Colwise)?)?;
        let want_dw = cpu(qg.get(Layout::Colwise)?, qa.get(Layout::Colwise)?)?;
        // Device quantization.
        let mut da = gpu.alloc_block_fp8(m, k, Format::E4M3)?;
        gpu.quantize_block1x128_into(&gpu.upload(&bf16_bits(&xa))?, &mut da, false, true)?;
        let mut dw = gpu.alloc_block2d_fp8(n, k, Format::E4M3)?;
        gpu.quantize_block128x128_into(&gpu.upload(&bf16_bits(&xw))?, &mut dw, true)?;
        let mut dg = gpu.alloc_block_fp8(m, n, Format::E5M2)?;
        gpu.quantize_block1x128_into(&gpu.upload(&bf16_bits(&xg))?, &mut dg, false, true)?;
        // 1x128 scale grids into cuBLASLt's (k/128, rows) layout.
        let t = |s: &CudaSlice<f32>, rows: usize, kb: usize| -> Result<CudaSlice<f32>> {
            let mut o = gpu.alloc_zeros::<f32>(rows * kb, "scales")?;
            gpu.transpose_f32(s, rows, kb, &mut o)?;
            Ok(o)
        };
        let a_row = t(&da.row_scale_inv, m, k.div_ceil(128))?;
        let a_col = t(&da.col_scale_inv, k, m.div_ceil(128))?;
        let g_row = t(&dg.row_scale_inv, m, n.div_ceil(128))?;
        let g_col = t(&dg.col_scale_inv, n, m.div_ceil(128))?;
        let (e4, e5) = (Format::E4M3, Format::E5M2);
        type Case<'a> = (String, Result<Vec<f32>>, &'a Vec<f32>);
        let mut cases: Vec<Case<'_>> = Vec::new();
        let mut y: CudaSlice<f32> = gpu.upload(&vec![f32::NAN; m * n])?;
        let r = gpu.gemm_fp8_block(
            (&da.rowwise, e4, &a_row, false),
            (&dw.rowwise, e4, &dw.row_scale_inv, true),
            &mut y,
            (m, n, k),
        );
        cases.push((
            format!("output 1x128 x 128x128 {m}x{k}x{n}"),
            r.and_then(|_| gpu.download(&y)),
            &want_y,
        ));
        {
            let mut dx: CudaSlice<f32> = gpu.upload(&vec![f32::NAN; m * k])?;
            let r = gpu.gemm_fp8_block(
                (&dg.rowwise, e5, &g_row, false),
                (&dw.colwise, e4, &dw.col_scale_inv, true),
                &mut dx,
                (m, k, n),
            );
            cases.push((
                format!("grad_input e5m2 1x128 x 128x128 {m}x{n}x{k}"),
                r.and_then(|_| gpu.download(&dx)),
                &want_dx,
            ));
        }
        // m = 1040 tokens: the weight gradient's k padded to 1152.
        {
            let mut dwt: CudaSlice<f32> = gpu.upload(&vec![f32::NAN; n * k])?;
            let r = gpu.gemm_fp8_block(
                (&dg.colwise, e5, &g_col, false),
                (&da.colwise, e4, &a_col, false),
                &mut dwt,
                (n, k, m),
            );
            cases.push((
                format!("grad_weight e5m2 1x128 x 1x128 {n}x{m}x{k}"),
                r.and_then(|_| gpu.download(&dwt)),
                &want_dw,
            ));
        }
        if k == 384 {
            // A k that is not a multiple of 16: refused, never wrong numbers.
            let mut dx: CudaSlice<f32> = gpu.alloc_zeros(m * k, "dx")?;
            let r = gpu.gemm_fp8_block(
                (&dg.rowwise, e5, &g_row, false),
                (&dw.colwise, e4, &dw.col_scale_inv, true),
                &mut dx,
                (m, k, n - 8),
            );
            out.push(shape_error(
                format!("gemm fp8 block-scaled with k={} -> shape error", n - 8),
                r,
            ));
        }
        for (name, got, want) in cases {
            let (pass, text) = match got {
                Ok(g) => {
                    let e = rel_frobenius(&g, want);
                    (e <= FP8_TOL, format!("relative error {e:.2e}"))
                }
                Err(e) => (false, e.to_string()),
            };
            out.push(CaseResult {
                name: format!("gemm fp8 block-scaled {name} vs CPU"),
                pass,
                worst: text,
            });
        }
    }
    Ok(())
}

/// The forward's per-tensor FP8 product with and without fast accumulation
/// ([`crate::GpuLinear::fast_accum`]) at k = 4096, where the fast one's error
/// is largest among the model's widths, against the CPU `Linear` (f32 sums of
/// the same codes): both within the bf16 output's tolerance, and not the same
/// numbers (the setting reaches cuBLASLt).
pub(super) fn fast_accum_cases(gpu: &Gpu, out: &mut Vec<CaseResult>) -> Result<()> {
    use crate::linear::cuda::GpuLinear;
    use crate::Linear;
    use octet_fp8::Recipe;
    use octet_tensor::Tensor;
    let (m, k, n) = (256usize, 4096usize, 256usize);
    let xb = random_bf16(m * k, 1301, 2.0);
    let wb = random_bf16(n * k, 1302, 0.05);
    let recipe = Some(Recipe::from_name("tensorwise")?);
    let shape = |e: octet_tensor::Error| Error::Shape(e.to_string());
    let mut cpu = Linear::new(
        Tensor::from_bf16(&[n, k], wb.clone()).map_err(shape)?,
        None,
        recipe,
        true,
    )
    .map_err(|e| Error::Shape(e.to_string()))?;
    let x = Tensor::from_bf16(&[m, k], xb.clone()).map_err(shape)?;
    let want = cpu
        .forward(&x, false)
        .map_err(|e| Error::Shape(e.to_string()))?
        .0
        .to_f32_vec();
    let mut ys = Vec::new();
    for fast in [false, true] {
        let mut layer = GpuLinear::new(gpu, gpu.upload(&bf16_bits(&wb))?, n, k, recipe)?;
        layer.fast_accum = fast;
        let (gy, _) = layer.forward(gpu, &gpu.upload(&bf16_bits(&xb))?, m)?;
        ys.push(download_f32(gpu, &gy)?);
    }
    let (e0, e1) = (rel_frobenius(&ys[0], &want), rel_frobenius(&ys[1], &want));
    let differ = ys[0].iter().zip(&ys[1]).filter(|(a, b)| a != b).count();
    out.push(CaseResult {
        name: format!(
            "linear forward tensorwise {m}x{k}x{n}, f32 and fast accumulation, vs CPU Linear"
        ),
        pass: e0 <= BF16_OUT_TOL && e1 <= BF16_OUT_TOL && differ > 0,
        worst: format!(
            "y {e0:.2e} (f32 accumulation), {e1:.2e} (fast); {differ} of {} outputs differ",
            m * n
        ),
    });
    Ok(())
}

pub(super) fn error_cases(gpu: &Gpu, out: &mut Vec<CaseResult>) -> Result<()> {
    let q = gpu.quantize_tensorwise(
        &gpu.upload(&bf16_bits(&random_bf16(24 * 32, 9, 1.0)))?,
        24,
        32,
        Format::E4M3,
        true,
    )?;
    let mut d: CudaSlice<u16> = gpu.alloc_zeros(24 * 24, "d")?;
    let r = gpu.gemm_fp8(
        q.rowwise_operand(),
        q.rowwise_operand(),
        &mut d,
        (24, 24, 32),
        false,
    );
    out.push(shape_error(
        "gemm fp8 with m=24 (not a multiple of 16) -> shape error",
        r,
    ));
    // NVFP4: the block height must be the one the copy was quantized with
    // (1x16 indexes 16 times as many block scales as a 16x16 copy holds),
    // and each global scale is one value.
    let x32 = gpu.upload(&bf16_bits(&random_bf16(32 * 32, 12, 1.0)))?;
    let nv = gpu.quantize_nvfp4(&x32, 32, 32, 16, Rounding::NearestEven)?;
    out.push(shape_error(
        "NVFP4 dequantize of a 16x16-block copy with block_rows=1 -> shape error",
        gpu.nv_dequant_bf16(&nv.rowwise, 1, None),
    ));
    let two = gpu.upload(&[1f32, 1.0])?;
    let mut d32: CudaSlice<f32> = gpu.alloc_zeros(32 * 32, "d")?;
    out.push(shape_error(
        "NVFP4 GEMM with a global scale of 2 values -> shape error",
        gpu.gemm_nvfp4_emulated(
            (&nv.rowwise, 16, &two),
            (&nv.rowwise, 16, &nv.global),
            &mut d32,
            (32, 32, 32),
        ),
    ));
    // Delayed scaling writes both copies: a row-wise-only tensor (its
    // column-wise copy a 1-byte placeholder) must be refused.
    let x24 = gpu.upload(&bf16_bits(&random_bf16(24 * 32, 9, 1.0)))?;
    let mut ro = gpu.quantize_tensorwise_rowwise(&x24, 24, 32, Format::E4M3)?;
    let one = gpu.upload(&[1f32])?;
    out.push(shape_error(
        "delayed quantize into a row-wise-only tensor -> shape error",
        gpu.quantize_given_scale_into(&x24, &one, &mut ro, false),
    ));
    // Outer-vector scaling reads one scale per row of each operand.
    let codes = gpu.alloc_zeros::<u8>(16 * 16, "codes")?;
    let (s1, s16) = (gpu.upload(&[1f32])?, gpu.upload(&[1f32; 16])?);
    let mut d16: CudaSlice<f32> = gpu.alloc_zeros(16 * 16, "d")?;
    let r = gpu.blas()?.gemm_fp8_outer(
        &codes,
        Format::E4M3,
        &s1,
        &codes,
        Format::E4M3,
        &s16,
        &mut d16,
        (16, 16, 16),
    );
    out.push(shape_error(
        "row-wise FP8 GEMM (Blas::gemm_fp8_outer) with 1 scale for m=16 -> shape error",
        r,
    ));
    // One block row of the quantizers' grids per 64 (128) rows, at most
    // 65535 of them: one row more is refused (one column, so the buffers
    // stay a few MB; the two allocations are refused before they are made).
    let tall = 65535 * 64 + 1;
    out.push(shape_error(
        "row-wise quantize buffers of 65535 * 64 + 1 rows (grid limit) -> shape error",
        gpu.alloc_rowwise_fp8(tall, 1, Format::E4M3),
    ));
    out.push(shape_error(
        "128x128 block quantize buffers of 65535 * 128 + 1 rows (grid limit) -> shape error",
        gpu.alloc_block2d_fp8(65535 * 128 + 1, 1, Format::E4M3),
    ));
    let xt: CudaSlice<u16> = gpu.alloc_zeros(tall, "tall x")?;
    out.push(shape_error(
        "MXFP8 quantize of 65535 * 64 + 1 rows (grid limit) -> shape error",
        gpu.quantize_mx(&xt, tall, 1, Format::E4M3),
    ));
    drop(xt);
    // The transposes: one block row per 32 rows (64 on the 4-byte path), at
    // most 65535 of them; one column, so the buffers stay a few MB (an odd
    // row count takes the 32-row path).
    let tall = 65535 * 32 + 1;
    let t8: CudaSlice<u8> = gpu.alloc_zeros(tall, "tall codes")?;
    out.push(shape_error(
        "transpose_u8 of 65535 * 32 + 1 rows (grid limit) -> shape error",
        gpu.transpose_u8(&t8, tall, 1),
    ));
    drop(t8);
    let t32: CudaSlice<f32> = gpu.alloc_zeros(tall, "tall f32")?;
    let mut t32_out: CudaSlice<f32> = gpu.alloc_zeros(tall, "tall f32 out")?;
    out.push(shape_error(
        "transpose_f32 of 65535 * 32 + 1 rows (grid limit) -> shape error",
        gpu.transpose_f32(&t32, tall, 1, &mut t32_out),
    ));
    drop((t32, t32_out));
    // Preallocated outputs' shapes are public fields: 1x128 buffers made for
    // (16, 128), relabelled (32, 128) with an x of that size, would be
    // written past their ends.
    let mut blk = gpu.alloc_block_fp8(16, 128, Format::E4M3)?;
    blk.rows = 32;
    let x32x128: CudaSlice<u16> = gpu.alloc_zeros(32 * 128, "x")?;
    out.push(shape_error(
        "1x128 quantize into (16, 128) buffers relabelled (32, 128) -> shape error",
        gpu.quantize_block1x128_into(&x32x128, &mut blk, false, false),
    ));
    // Row-wise: the same relabelling, and a format the kernels do not have
    // (it was cast as E4M3).
    let mut rw = gpu.alloc_rowwise_fp8(16, 128, Format::E4M3)?;
    rw.rows = 32;
    out.push(shape_error(
        "row-wise quantize into (16, 128) buffers relabelled (32, 128) -> shape error",
        gpu.quantize_rowwise_into(&x32x128, &mut rw, false),
    ));
    rw.rows = 16;
    rw.format = Format::E2M1;
    let x16x128: CudaSlice<u16> = gpu.alloc_zeros(16 * 128, "x")?;
    out.push(shape_error(
        "row-wise quantize into buffers relabelled E2M1 -> shape error",
        gpu.quantize_rowwise_into(&x16x128, &mut rw, false),
    ));
    // 128x128 blocks: the same relabelling (both copies and both scale
    // grids sized for 128 rows) and a format the kernels do not have.
    let mut b2 = gpu.alloc_block2d_fp8(128, 128, Format::E4M3)?;
    b2.rows = 256;
    let x256x128: CudaSlice<u16> = gpu.alloc_zeros(256 * 128, "x")?;
    out.push(shape_error(
        "128x128 quantize into (128, 128) buffers relabelled (256, 128) -> shape error",
        gpu.quantize_block128x128_into(&x256x128, &mut b2, false),
    ));
    b2.rows = 128;
    b2.format = Format::E2M1;
    let x128x128: CudaSlice<u16> = gpu.alloc_zeros(128 * 128, "x")?;
    out.push(shape_error(
        "128x128 quantize into buffers relabelled E2M1 -> shape error",
        gpu.quantize_block128x128_into(&x128x128, &mut b2, false),
    ));
    lora::lora_error_cases(gpu, out)
}

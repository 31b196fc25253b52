//! Casts against `octet_fp8::quantize`, bit for bit: per-tensor, row-wise, 1x128 and
//! 128x128 blocks, delayed scaling, MXFP8 and NVFP4, and the FP8 byte transpose.

use super::*;

/// The FP8 conversions, exhaustively, against `octet_fp8` (the hardware
/// instructions, or the integer code of `kernels/common.cuh` on GPUs without
/// them and under `OCTET_FP8_CONVERT=soft`):
/// - every code of each format decoded by both dequantize kernels (scale 1,
///   bf16 out: exact), bit for bit, NaN for NaN;
/// - every bf16 bit pattern encoded with scale 1 (round to nearest even,
///   saturating, NaN to NaN), both copies, bit for bit;
/// - the weight-only products with every code in every one of the 16 column
///   positions of a 16-byte load, times one-hot token rows: each output is
///   one decoded code (or the inf / NaN that 0 x inf makes), so the product
///   must equal the f64 one exactly, at M = 16 (small-M kernel) and M = 80.
pub(super) fn conversion_cases(gpu: &Gpu, out: &mut Vec<CaseResult>) -> Result<()> {
    use octet_fp8::Overflow;
    let all: Vec<u8> = (0..=255u8).collect();
    for format in [Format::E4M3, Format::E5M2] {
        // Decode: (1, 256) takes the 8-a-thread kernel, (256, 1) the scalar one.
        let codes = gpu.upload(&all)?;
        for (shape, block) in [((1usize, 256usize), (1usize, 256usize)), ((256, 1), (1, 1))] {
            let scales = gpu.upload(&vec![1f32; 256 / (block.0 * block.1)])?;
            let got = gpu.download(&gpu.dequant_bf16(&codes, &scales, shape, block, format)?)?;
            let bad: Vec<u8> = all
                .iter()
                .zip(&got)
                .filter(|&(&c, &g)| {
                    let want = bf16::from_f32(format.decode(c));
                    !(want.to_bits() == g || (want.is_nan() && bf16::from_bits(g).is_nan()))
                })
                .map(|(&c, _)| c)
                .collect();
            out.push(CaseResult {
                name: format!(
                    "decode every {format} code, dequantize {}x{}",
                    shape.0, shape.1
                ),
                pass: bad.is_empty(),
                worst: if bad.is_empty() {
                    "256 of 256 exact".into()
                } else {
                    format!("{} codes differ, first {:#04x}", bad.len(), bad[0])
                },
            });
        }
        // Encode: all 65536 bf16 bit patterns as a (256, 256) matrix.
        let x: Vec<u16> = (0..=u16::MAX).collect();
        let dx = gpu.upload(&x)?;
        let scale = gpu.upload(&[1f32])?;
        let mut q = gpu.alloc_fp8(256, 256, format)?;
        gpu.quantize_given_scale_into(&dx, &scale, &mut q, false)?;
        let (row, col) = (gpu.download(&q.rowwise)?, gpu.download(&q.colwise)?);
        let mut bad = 0usize;
        let mut first = None;
        for (i, &b) in x.iter().enumerate() {
            let want = format.encode_rne(bf16::from_bits(b).to_f32(), Overflow::Saturate);
            let (r, c) = (i / 256, i % 256);
            for got in [row[i], col[c * 256 + r]] {
                if !(got == want || (format.is_nan(got) && format.is_nan(want))) {
                    bad += 1;
                    first.get_or_insert((b, got, want));
                }
            }
        }
        out.push(CaseResult {
            name: format!("encode every bf16 value to {format} (scale 1, saturating)"),
            pass: bad == 0,
            worst: match first {
                None => "65536 of 65536 exact, both copies".into(),
                Some((b, g, w)) => {
                    format!("{bad} codes differ, first bf16 {b:#06x}: {g:#04x} for {w:#04x}")
                }
            },
        });
        let (total, bad) = block_factor_product(gpu, format)?;
        out.push(CaseResult {
            name: format!(
                "weight-only product, every finite {format} code times 128x128 block factors \
                 2^-6 to 2^4 apart, one-hot x, M=80, each output within 2^-8 + 2^-14"
            ),
            pass: bad.is_none(),
            worst: bad.unwrap_or_else(|| format!("{total} of {total} within")),
        });
        for block128 in [false, true] {
            for m in [16usize, 80] {
                let (total, bad) = every_code_product(gpu, format, block128, m)?;
                out.push(CaseResult {
                    name: format!(
                        "weight-only product, every finite {format} code at every position, {}, M={m}",
                        if block128 { "128x128 blocks" } else { "tensor" }
                    ),
                    pass: bad.is_none(),
                    worst: bad.unwrap_or_else(|| format!("{total} of {total} exact")),
                });
            }
        }
    }
    Ok(())
}

/// The byte transpose (column-wise copies of per-tensor FP8 matrices) against
/// the CPU's, bit for bit: shapes for the 4x4-block kernel (multiples of 4,
/// with partial 64x64 tiles) and for the one-byte kernel (odd dims).
pub(super) fn transpose_cases(gpu: &Gpu, out: &mut Vec<CaseResult>) -> Result<()> {
    for (i, &(rows, cols)) in [
        (64, 64),
        (200, 136),
        (4, 12),
        (2048, 5632),
        (33, 17),
        (16, 6),
    ]
    .iter()
    .enumerate()
    {
        let bytes: Vec<u8> = (0..rows * cols)
            .map(|j| octet_fp8::format::sr_bits(0x7a5e + i as u64, j as u64) as u8)
            .collect();
        let want = octet_fp8::quant::transpose(&bytes, rows, cols);
        let got = gpu.download(&gpu.transpose_u8(&gpu.upload(&bytes)?, rows, cols)?)?;
        let (bad, text) = byte_diff(&got, &want);
        out.push(CaseResult {
            name: format!("transpose_u8 {rows}x{cols}"),
            pass: bad == 0,
            worst: text,
        });
    }
    // Several in one launch (shapes of different sizes, so that blocks past
    // a smaller one's edge return), and a list the one launch does not take
    // (an odd dim: one launch each).
    for (i, shapes) in [
        &[(2048usize, 512usize), (512, 2048), (200, 136)][..],
        &[(64, 64), (33, 17)][..],
    ]
    .iter()
    .enumerate()
    {
        let inputs: Vec<Vec<u8>> = shapes
            .iter()
            .enumerate()
            .map(|(j, &(rows, cols))| {
                (0..rows * cols)
                    .map(|e| {
                        octet_fp8::format::sr_bits(0x7b00 + 16 * i as u64 + j as u64, e as u64)
                            as u8
                    })
                    .collect()
            })
            .collect();
        let dev = inputs
            .iter()
            .map(|b| gpu.upload(b))
            .collect::<Result<Vec<_>>>()?;
        let list: Vec<_> = dev
            .iter()
            .zip(shapes.iter())
            .map(|(d, &(rows, cols))| (d, rows, cols))
            .collect();
        let got = gpu.transpose_u8_many(&list)?;
        let (mut bad, mut text) = (usize::from(got.len() != shapes.len()), String::new());
        for ((g, b), &(rows, cols)) in got.iter().zip(&inputs).zip(shapes.iter()) {
            let (nb, t) = byte_diff(
                &gpu.download(g)?,
                &octet_fp8::quant::transpose(b, rows, cols),
            );
            bad += nb;
            text += &format!("{rows}x{cols}: {t}; ");
        }
        out.push(CaseResult {
            name: format!("transpose_u8_many {shapes:?}"),
            pass: bad == 0,
            worst: text,
        });
    }
    Ok(())
}

pub(super) const SHAPES: [(usize, usize); 7] = [
    (256, 512),
    (217, 300),
    (64, 64),
    (1, 16),
    (1000, 8),
    (333, 1000),
    (128, 4096),
];

/// Inputs named by kind: uniform, wide dynamic range, all zeros, tiny amax.
pub(super) fn input(kind: &str, n: usize, seed: u64) -> Vec<f32> {
    match kind {
        "uniform" => random_f32(n, seed, 3.0),
        "wide" => random_wide_f32(n, seed),
        "zeros" => vec![0.0; n],
        // amax ~1e-39 (a bf16/f32 subnormal): max / amax overflows f32, the scale is f32::MAX.
        _ => random_f32(n, seed, 1e-39),
    }
}

pub(super) fn quantize_cases(gpu: &Gpu, out: &mut Vec<CaseResult>) -> Result<()> {
    let mut cases: Vec<((usize, usize), &str)> = SHAPES.iter().map(|&s| (s, "uniform")).collect();
    cases.extend([
        ((217, 300), "wide"),
        ((256, 512), "wide"),
        ((64, 128), "zeros"),
        ((64, 128), "tiny"),
    ]);
    for (i, &((rows, cols), kind)) in cases.iter().enumerate() {
        let xf = input(kind, rows * cols, 100 + i as u64);
        let xb: Vec<bf16> = xf.iter().map(|&v| bf16::from_f32(v)).collect();
        for format in [Format::E4M3, Format::E5M2] {
            let sp = spec(format, Granularity::Tensor, false);
            for dtype in ["bf16", "f32"] {
                let (want, got) = if dtype == "bf16" {
                    let want = octet_fp8::quantize(&xb, rows, cols, &sp, &sp, Usage::BOTH, None)?;
                    let dx = gpu.upload(&bf16_bits(&xb))?;
                    (
                        want,
                        gpu.quantize_tensorwise_poisoned(&dx, rows, cols, format, 0x7F)?,
                    )
                } else {
                    let want = octet_fp8::quantize(&xf, rows, cols, &sp, &sp, Usage::BOTH, None)?;
                    let dx = gpu.upload(&xf)?;
                    (
                        want,
                        gpu.quantize_tensorwise_poisoned(&dx, rows, cols, format, 0x7F)?,
                    )
                };
                let (pr, tr) = compare_copy(
                    &gpu.download(&got.rowwise)?,
                    &gpu.download(&got.scale_inv)?,
                    want.get(Layout::Rowwise)?,
                    "row",
                );
                let (pc, tc) = compare_copy(
                    &gpu.download(&got.colwise)?,
                    &gpu.download(&got.scale_inv)?,
                    want.get(Layout::Colwise)?,
                    "col",
                );
                let amax = f32::from_bits(gpu.download(&got.amax_bits)?[0]);
                let amax_ok = amax.to_bits() == want.amax.to_bits();
                out.push(CaseResult {
                    name: format!("quantize tensorwise {dtype}->{format} {rows}x{cols} {kind}"),
                    pass: pr && pc && amax_ok,
                    worst: format!(
                        "{tr}; {tc}; amax {}",
                        if amax_ok { "equal" } else { "DIFFERS" }
                    ),
                });
            }
        }
    }
    // Delayed scaling: a given scale (large enough that values above 2 in
    // magnitude saturate), one pass, the tensor's amax recorded for the history.
    for (i, &(rows, cols)) in [(256usize, 512usize), (217, 300), (1, 16), (1000, 8)]
        .iter()
        .enumerate()
    {
        let xb: Vec<bf16> = input("uniform", rows * cols, 300 + i as u64)
            .iter()
            .map(|&v| bf16::from_f32(v))
            .collect();
        for format in [Format::E4M3, Format::E5M2] {
            let scale = format.max() / 2.0;
            let sp = QuantSpec {
                rule: ScaleRule::Fixed(scale),
                ..spec(format, Granularity::Tensor, false)
            };
            let want = octet_fp8::quantize(&xb, rows, cols, &sp, &sp, Usage::BOTH, None)?;
            let dx = gpu.upload(&bf16_bits(&xb))?;
            let dscale = gpu.upload(&[scale])?;
            let mut got = gpu.alloc_fp8(rows, cols, format)?;
            let p = vec![0x7Fu8; rows * cols];
            gpu.stream.memcpy_htod(&p, &mut got.rowwise)?;
            gpu.stream.memcpy_htod(&p, &mut got.colwise)?;
            gpu.quantize_given_scale_into(&dx, &dscale, &mut got, true)?;
            let si = gpu.download(&got.scale_inv)?;
            let (pr, tr) = compare_copy(
                &gpu.download(&got.rowwise)?,
                &si,
                want.get(Layout::Rowwise)?,
                "row",
            );
            let (pc, tc) = compare_copy(
                &gpu.download(&got.colwise)?,
                &si,
                want.get(Layout::Colwise)?,
                "col",
            );
            let amax = f32::from_bits(gpu.download(&got.amax_bits)?[0]);
            let amax_ok = amax.to_bits() == want.amax.to_bits();
            out.push(CaseResult {
                name: format!(
                    "quantize given scale (delayed) bf16->{format} {rows}x{cols}, one pass"
                ),
                pass: pr && pc && amax_ok,
                worst: format!(
                    "{tr}; {tc}; amax {}",
                    if amax_ok { "equal" } else { "DIFFERS" }
                ),
            });
        }
    }
    // A NaN must be reported, not turned into a scale.
    let mut x = random_bf16(64 * 64, 5, 1.0);
    x[1234] = bf16::NAN;
    let dx = gpu.upload(&bf16_bits(&x))?;
    let r = gpu.quantize_tensorwise(&dx, 64, 64, Format::E4M3, true);
    out.push(CaseResult {
        name: "quantize tensorwise with a NaN -> NonFinite error".into(),
        pass: matches!(r, Err(Error::NonFinite)),
        worst: match r {
            Err(e) => e.to_string(),
            Ok(_) => "no error".into(),
        },
    });
    Ok(())
}

pub(super) fn block_cases(gpu: &Gpu, out: &mut Vec<CaseResult>) -> Result<()> {
    let g = Granularity::Tile { rows: 1, cols: 128 };
    let mut cases: Vec<((usize, usize), &str, bool)> =
        SHAPES.iter().map(|&s| (s, "uniform", false)).collect();
    cases.extend([
        ((256, 384), "wide", false),
        ((217, 300), "wide", true),
        ((256, 512), "uniform", true),
        ((128, 256), "zeros", false),
    ]);
    for (i, &((rows, cols), kind, p2)) in cases.iter().enumerate() {
        let xf = input(kind, rows * cols, 300 + i as u64);
        let xb: Vec<bf16> = xf.iter().map(|&v| bf16::from_f32(v)).collect();
        let dx = gpu.upload(&bf16_bits(&xb))?;
        for format in [Format::E4M3, Format::E5M2] {
            let sp = spec(format, g, p2);
            let want = octet_fp8::quantize(&xb, rows, cols, &sp, &sp, Usage::BOTH, None)?;
            let mut q = gpu.alloc_block_fp8(rows, cols, format)?;
            let p = vec![0x7Fu8; rows * cols];
            gpu.stream.memcpy_htod(&p, &mut q.rowwise)?;
            gpu.stream.memcpy_htod(&p, &mut q.colwise)?;
            gpu.stream
                .memcpy_htod(&vec![f32::NAN; q.row_scale_inv.len()], &mut q.row_scale_inv)?;
            gpu.stream
                .memcpy_htod(&vec![f32::NAN; q.col_scale_inv.len()], &mut q.col_scale_inv)?;
            gpu.quantize_block1x128_into(&dx, &mut q, p2, true)?;
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
                name: format!(
                    "quantize 1x128 bf16->{format} {rows}x{cols} {kind}{}",
                    if p2 { " pow2" } else { "" }
                ),
                pass: pr && pc,
                worst: format!("{tr}; {tc}"),
            });
        }
    }
    Ok(())
}

/// The direct-store 1x128 variant (benchmark A/B) writes the same bytes as the default.
pub(super) fn block_variant_cases(gpu: &Gpu, out: &mut Vec<CaseResult>) -> Result<()> {
    for (i, &(rows, cols)) in [(256usize, 512usize), (217, 300)].iter().enumerate() {
        let x = bf16_bits(&random_bf16(rows * cols, 500 + i as u64, 2.0));
        let dx = gpu.upload(&x)?;
        let a = gpu.quantize_block1x128(&dx, rows, cols, Format::E4M3, false, true)?;
        let mut b = gpu.alloc_block_fp8(rows, cols, Format::E4M3)?;
        let p = vec![0x7Fu8; rows * cols];
        gpu.stream.memcpy_htod(&p, &mut b.rowwise)?;
        gpu.stream.memcpy_htod(&p, &mut b.colwise)?;
        gpu.quantize_block1x128_direct_into(&dx, &mut b)?;
        let (br, tr) = byte_diff(&gpu.download(&b.rowwise)?, &gpu.download(&a.rowwise)?);
        let (bc, tc) = byte_diff(&gpu.download(&b.colwise)?, &gpu.download(&a.colwise)?);
        let scales = f32_bits_equal(
            &gpu.download(&b.row_scale_inv)?,
            &gpu.download(&a.row_scale_inv)?,
        ) && f32_bits_equal(
            &gpu.download(&b.col_scale_inv)?,
            &gpu.download(&a.col_scale_inv)?,
        );
        out.push(CaseResult {
            name: format!("quantize 1x128 direct-store variant = staged {rows}x{cols}"),
            pass: br == 0 && bc == 0 && scales,
            worst: format!(
                "row: {tr}; col: {tc}; scales {}",
                if scales { "equal" } else { "DIFFER" }
            ),
        });
    }
    Ok(())
}

/// Row-wise quantize bit-exact against the CPU's `rowwise` recipe (codes and
/// per-row scales of both copies), and the outer-vector FP8 GEMM against the
/// CPU's exact-product FP8 GEMM of the same codes.
pub(super) fn rowwise_cases(gpu: &Gpu, out: &mut Vec<CaseResult>) -> Result<()> {
    let mut cases: Vec<((usize, usize), &str)> = SHAPES.iter().map(|&s| (s, "uniform")).collect();
    cases.extend([((217, 300), "wide"), ((64, 128), "zeros")]);
    for (i, &((rows, cols), kind)) in cases.iter().enumerate() {
        let xf = input(kind, rows * cols, 700 + i as u64);
        let xb: Vec<bf16> = xf.iter().map(|&v| bf16::from_f32(v)).collect();
        for format in [Format::E4M3, Format::E5M2] {
            let sp = spec(format, Granularity::Row, false);
            for dtype in ["bf16", "f32"] {
                let mut q = gpu.alloc_rowwise_fp8(rows, cols, format)?;
                let want = if dtype == "bf16" {
                    gpu.quantize_rowwise_into(&gpu.upload(&bf16_bits(&xb))?, &mut q, true)?;
                    octet_fp8::quantize(&xb, rows, cols, &sp, &sp, Usage::BOTH, None)?
                } else {
                    gpu.quantize_rowwise_into(&gpu.upload(&xf)?, &mut q, true)?;
                    octet_fp8::quantize(&xf, rows, cols, &sp, &sp, Usage::BOTH, None)?
                };
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
                    name: format!(
                        "quantize rowwise {dtype} -> {} {rows}x{cols} {kind}",
                        format.name()
                    ),
                    pass: pr && pc,
                    worst: format!("{tr}; {tc}"),
                });
            }
        }
    }
    for &(m, k, n) in &[
        (256usize, 512usize, 384usize),
        (128, 4096, 256),
        (64, 256, 1024),
    ] {
        let (xa, xw) = (random_f32(m * k, 801, 2.0), random_f32(n * k, 802, 0.1));
        let sp = spec(Format::E4M3, Granularity::Row, false);
        let qa = octet_fp8::quantize(&xa, m, k, &sp, &sp, Usage::ROW, None)?;
        let qb = octet_fp8::quantize(&xw, n, k, &sp, &sp, Usage::ROW, None)?;
        let want = octet_tensor::cpu::fp8_gemm(qa.get(Layout::Rowwise)?, qb.get(Layout::Rowwise)?)
            .map_err(|e| Error::Shape(e.to_string()))?;
        let mut da = gpu.alloc_rowwise_fp8(m, k, Format::E4M3)?;
        let mut db = gpu.alloc_rowwise_fp8(n, k, Format::E4M3)?;
        gpu.quantize_rowwise_into(&gpu.upload(&xa)?, &mut da, true)?;
        gpu.quantize_rowwise_into(&gpu.upload(&xw)?, &mut db, true)?;
        let mut d: CudaSlice<f32> = gpu.upload(&vec![f32::NAN; m * n])?;
        gpu.gemm_fp8_rowwise(
            (&da.rowwise, Format::E4M3, &da.row_scale_inv),
            (&db.rowwise, Format::E4M3, &db.row_scale_inv),
            &mut d,
            (m, n, k),
        )?;
        let got = gpu.download(&d)?;
        let e = rel_frobenius(&got, &want);
        out.push(CaseResult {
            name: format!("gemm fp8 rowwise (outer-vector scales) {m}x{k}x{n} vs CPU"),
            pass: e <= FP8_TOL,
            worst: format!("relative error {e:.2e}"),
        });
    }
    Ok(())
}

/// Delayed scaling with its state on the device: 12 steps of two quantizes
/// each (the given-scale kernel reads the device scale), amaxes recorded and
/// the history rolled on the device, against the CPU's `DelayedState` fed the
/// same tensors: the scale after every step bit for bit, and the codes of
/// every quantize against the CPU quantized with the CPU's scale.
/// End a delayed-scaling step on both sides, first recording `extra` (an
/// amax with no quantize behind it) if given: whether the new scales are the
/// same bits.
pub(super) fn delayed_step(
    gpu: &Gpu,
    cpu: &mut octet_fp8::DelayedState,
    dev: &mut octet_cuda::delayed::DeviceDelayed,
    extra: Option<f32>,
) -> Result<bool> {
    if let Some(a) = extra {
        cpu.record(a);
        gpu.delayed_record(dev, &gpu.upload(&[a.to_bits()])?)?;
    }
    cpu.update();
    gpu.delayed_update(dev)?;
    Ok(gpu.download(&dev.scale)?[0].to_bits() == cpu.scale().to_bits())
}

pub(super) fn delayed_cases(gpu: &Gpu, out: &mut Vec<CaseResult>) -> Result<()> {
    use octet_fp8::{AmaxAlgo, DelayedState};
    let (rows, cols) = (128, 256);
    for (algo, margin, format, hist) in [
        (AmaxAlgo::Max, 0, Format::E4M3, 16usize),
        (AmaxAlgo::MostRecent, 1, Format::E5M2, 16),
        (AmaxAlgo::Max, 2, Format::E4M3, 4),
    ] {
        let mut cpu = DelayedState::new(hist, algo, margin, format);
        let mut dev = gpu.delayed_state(hist, algo, margin, format)?;
        let mut q = gpu.alloc_fp8(rows, cols, format)?;
        let (mut scale_bad, mut code_bad) = (0, 0);
        for step in 0..12u64 {
            for part in 0..2u64 {
                // Magnitudes over 5 decades, so the history's max moves up and down.
                let mag = 10f32.powi((step * 3 + part) as i32 % 5 - 2);
                let xb = random_bf16(rows * cols, 1000 + step * 2 + part, mag);
                let sp = QuantSpec {
                    format,
                    granularity: Granularity::Tensor,
                    rule: ScaleRule::Fixed(cpu.scale()),
                    rounding: Rounding::NearestEven,
                };
                let want = octet_fp8::quantize(&xb, rows, cols, &sp, &sp, Usage::ROW, None)?;
                gpu.quantize_given_scale_into(
                    &gpu.upload(&bf16_bits(&xb))?,
                    &dev.scale,
                    &mut q,
                    false,
                )?;
                if byte_diff(&gpu.download(&q.rowwise)?, &want.get(Layout::Rowwise)?.data).0 != 0 {
                    code_bad += 1;
                }
                cpu.record(want.amax);
                gpu.delayed_record(&mut dev, &q.amax_bits)?;
            }
            // An overflow upstream: an infinite amax at step 5, a NaN at step
            // 8. Both keep the scale while they are in the window.
            let bad = match step {
                5 => Some(f32::INFINITY),
                8 => Some(f32::NAN),
                _ => None,
            };
            if !delayed_step(gpu, &mut cpu, &mut dev, bad)? {
                scale_bad += 1;
            }
        }
        // Then steps that record only an amax: zeros (the window's amax 0 keeps
        // the scale), and amaxes so small that max / amax alone overflows f32
        // (the margin applies before the division and the cap).
        let tail = [0.0f32, 0.0, 5e-37, 5e-37, 5e-37, 5e-37, 6e-35, 0.0];
        for a in tail {
            if !delayed_step(gpu, &mut cpu, &mut dev, Some(a))? {
                scale_bad += 1;
            }
        }
        out.push(CaseResult {
            name: format!("delayed scaling on the device, {algo:?} history {hist} margin {margin} {}: 12 steps x 2 quantizes, an inf and a NaN amax, then amaxes of 0 and below 1e-34", format.name()),
            pass: scale_bad == 0 && code_bad == 0,
            worst: format!("{scale_bad} of {} scales differ, {code_bad} of 24 quantizes differ", 12 + tail.len()),
        });
    }
    Ok(())
}

/// MXFP8 quantize bit-exact against the CPU's `mxfp8` recipe: codes and E8M0
/// scale codes of both copies.
pub(super) fn mx_cases(gpu: &Gpu, out: &mut Vec<CaseResult>) -> Result<()> {
    for (i, &(rows, cols)) in [
        (256usize, 512usize),
        (217, 300),
        (1, 16),
        (333, 1000),
        (64, 128),
    ]
    .iter()
    .enumerate()
    {
        let xb: Vec<bf16> = random_wide_f32(rows * cols, 1300 + i as u64)
            .iter()
            .map(|&v| bf16::from_f32(v))
            .collect();
        for format in [Format::E4M3, Format::E5M2] {
            let sp = QuantSpec {
                format,
                granularity: Granularity::Tile { rows: 1, cols: 32 },
                rule: ScaleRule::E8M0,
                rounding: Rounding::NearestEven,
            };
            let want = octet_fp8::quantize(&xb, rows, cols, &sp, &sp, Usage::BOTH, None)?;
            let q = gpu.quantize_mx(&gpu.upload(&bf16_bits(&xb))?, rows, cols, format)?;
            let codes = |q: &QuantData| match &q.scales {
                Scales::E8M0(v) => v.clone(),
                _ => Vec::new(),
            };
            let (wr, wc) = (want.get(Layout::Rowwise)?, want.get(Layout::Colwise)?);
            let (br, tr) = byte_diff(&gpu.download(&q.rowwise)?, &wr.data);
            let (bc, tc) = byte_diff(&gpu.download(&q.colwise)?, &wc.data);
            let sr = gpu.download(&q.row_scales)? == codes(wr);
            let sc = gpu.download(&q.col_scales)? == codes(wc);
            out.push(CaseResult {
                name: format!(
                    "quantize mxfp8 bf16 -> {} {rows}x{cols} wide",
                    format.name()
                ),
                pass: br == 0 && bc == 0 && sr && sc,
                worst: format!(
                    "row: {tr}, scales {}; col: {tc}, scales {}",
                    if sr { "equal" } else { "DIFFER" },
                    if sc { "equal" } else { "DIFFER" }
                ),
            });
        }
    }
    Ok(())
}

/// NVFP4 quantize bit-exact against the CPU: packed E2M1 codes, E4M3 block
/// scale codes and the per-tensor scale of both copies, for 1x16 blocks with
/// nearest and stochastic rounding and for 16x16 blocks.
pub(super) fn nvfp4_cases(gpu: &Gpu, out: &mut Vec<CaseResult>) -> Result<()> {
    // The last shape again with a tensor amax near 1e-36: the per-tensor
    // scale and the block multipliers are capped at the largest f32.
    for (i, &(rows, cols, mag)) in [
        (256usize, 512usize, 1f32),
        (217, 300, 1.0),
        (1, 16, 1.0),
        (333, 1000, 1.0),
        (64, 130, 1.0),
        (64, 130, 1e-37),
    ]
    .iter()
    .enumerate()
    {
        let xb: Vec<bf16> = random_wide_f32(rows * cols, 1400 + i as u64)
            .iter()
            .map(|&v| bf16::from_f32(v * mag))
            .collect();
        for (br, rounding, label) in [
            (1usize, Rounding::NearestEven, "1x16 nearest"),
            (
                1,
                Rounding::Stochastic {
                    seed: 0x5eed_0000_0001 + i as u64,
                },
                "1x16 stochastic",
            ),
            (16, Rounding::NearestEven, "16x16 nearest"),
        ] {
            let sp = QuantSpec {
                format: Format::E2M1,
                granularity: Granularity::Tile { rows: br, cols: 16 },
                rule: ScaleRule::Nvfp4,
                rounding,
            };
            let want = octet_fp8::quantize(&xb, rows, cols, &sp, &sp, Usage::BOTH, None)?;
            let q = gpu.quantize_nvfp4(&gpu.upload(&bf16_bits(&xb))?, rows, cols, br, rounding)?;
            let g = gpu.download(&q.global)?[0];
            let mut text = Vec::new();
            let mut pass = true;
            for (got, want) in [
                (&q.rowwise, want.get(Layout::Rowwise)?),
                (&q.colwise, want.get(Layout::Colwise)?),
            ] {
                let (bad, t) = byte_diff(&gpu.download(&got.packed)?, &want.data);
                let (codes_ok, g_ok) = match &want.scales {
                    Scales::Nvfp4 { codes, global } => (
                        gpu.download(&got.codes)? == *codes,
                        global.to_bits() == g.to_bits(),
                    ),
                    _ => (false, false),
                };
                pass &= bad == 0 && codes_ok && g_ok;
                text.push(format!(
                    "{t}, scales {}, global {}",
                    if codes_ok { "equal" } else { "DIFFER" },
                    if g_ok { "equal" } else { "DIFFERS" }
                ));
            }
            out.push(CaseResult {
                name: format!("quantize nvfp4 {label} {rows}x{cols} wide x {mag:e}"),
                pass,
                worst: text.join("; "),
            });
        }
    }
    Ok(())
}

//! Weight-only FP8 products (`Gpu::mixed_matmul`) against the f64 product of the
//! decoded codes, and the fused SwiGLU product.

use super::*;

/// Block factors applied code by code, where a rounding or indexing slip
/// cannot hide in a sum: a `(256, 384)` weight (two bands of rows, three
/// column blocks) holding every finite code (`(j + 3p) % 256` at row `j`,
/// column `p`), each 128x128 tile with its own factor (`2^e (1 + f)`, `e`
/// from -6 to 4 and `f` in [0, 1) off bf16's grid), times 80 one-hot bf16
/// token rows (token `i` at column `(37 i) % 384`, so the wgmma path on
/// Hopper). Each output is one code times its tile's factor, rounded to bf16
/// where the codes are scaled (in bf16 arithmetic, `RN(v hi + RN(v lo))`, or
/// in f32) and exact where the factor applies to sums: within `(2^-8 +
/// 2^-14)` of the f64 value on every path. A kernel that dropped `lo`
/// (`2^-7` off at worst) or read another tile's factor fails it.
/// Returns the outputs checked and, if any is outside, a line on the first.
pub(crate) fn block_factor_product(gpu: &Gpu, format: Format) -> Result<(usize, Option<String>)> {
    use octet_tensor::mixed::Fp8Weight;
    let (n, k, m) = (256usize, 384usize, 80usize);
    let mut w = vec![0u8; n * k];
    for j in 0..n {
        for p in 0..k {
            let c = ((j + 3 * p) % 256) as u8;
            let finite = !format.is_nan(c) && format.decode(c).is_finite();
            w[j * k + p] = if finite { c } else { 0 };
        }
    }
    let tiles = n.div_ceil(128) * k.div_ceil(128);
    let factors: Vec<f32> = (0..tiles)
        .map(|t| {
            let e = [-6, 4, -1, 2, -4, 0][t % 6];
            let f = (random_f32(1, 700 + t as u64, 1.0)[0].abs()).fract();
            2f32.powi(e) * (1.0 + f + 1e-3)
        })
        .collect();
    let wq = Fp8Weight::from_quant_data(QuantData {
        rows: n,
        cols: k,
        format,
        data: w.clone(),
        block: (128, 128),
        scales: Scales::F32(factors.clone()),
        saturated: 0,
        underflowed: 0,
    })
    .map_err(|e| Error::Shape(e.to_string()))?;
    let dw = gpu.upload_fp8_weight(&wq)?;
    let col = |i: usize| (37 * i) % k;
    let xb: Vec<u16> = (0..m * k)
        .map(|e| if e % k == col(e / k) { 0x3f80 } else { 0 })
        .collect();
    let dx = gpu.upload(&xb)?;
    let mut y = gpu.upload(&vec![f32::NAN; m * n])?;
    gpu.mixed_matmul(&dx, m, &dw, &mut y)?;
    let got = gpu.download(&y)?;
    let kb = k.div_ceil(128);
    let mut bad = 0usize;
    let mut first = None;
    for i in 0..m {
        let p = col(i);
        for j in 0..n {
            let want =
                format.decode(w[j * k + p]) as f64 * factors[(j / 128) * kb + p / 128] as f64;
            let g = got[i * n + j] as f64;
            let within = (g - want).abs() <= (2f64.powi(-8) + 2f64.powi(-14)) * want.abs();
            if !within {
                bad += 1;
                first.get_or_insert((i, j, g, want));
            }
        }
    }
    Ok((
        m * n,
        first.map(|(i, j, g, w)| format!("{bad} outside, first ({i}, {j}): {g} for {w}")),
    ))
}

/// Weight-only products against the f64 product of the bf16 input and the
/// dequantized weight. Bound per element: `(K + 16) 2^-24 sum |x w|`, a bound
/// for f32 sums in any order; the large-M path under block scaling adds the
/// rounding of each scaled weight to x's type: `2^-8 sum |x w|` for bf16
/// (unit roundoff `2^-8`), `2^-11 sum |x w| + 2^-25 sum |x|` for f16 (unit
/// roundoff `2^-11`, and half the spacing of its subnormals); a bf16 output
/// adds `2^-8 |y|`. x takes values that bf16 and f16 both hold exactly
/// (`f16_exact`), so one f64 reference serves both x types. The outputs are
/// poisoned with NaN first.
pub(super) fn mixed_cases(gpu: &Gpu, out: &mut Vec<CaseResult>) -> Result<()> {
    use octet_cuda::XType;
    use octet_tensor::mixed::{Fp8Weight, WeightScaling};
    let shapes = [
        (1usize, 200usize, 336usize),
        // The small-M kernel's three shapes with more 128-column blocks a
        // warp than ring slots, a partial last block (K % 128 == 16), and a
        // token group of 12.
        (2, 72, 8192),
        (4, 130, 4096),
        (7, 40, 4112),
        (12, 24, 3088),
        (5, 257, 1024),
        (8, 130, 512),
        (9, 64, 272),
        (16, 300, 4096),
        // 265 row tiles: more than two blocks an SM on 132 SMs, so f16 x
        // takes the table's 16-token shape rather than the few-block one;
        // 133 blocks of 32 rows, so both types take a wide shape
        // (`SMALL_WIDE`, 32 rows), whose last block has one tile of the two.
        (12, 4240, 272),
        // The wide shape over three token groups (the last of one token),
        // 131 row tiles.
        (33, 2088, 272),
        // 529 row tiles: 133 blocks of 64 rows on 132 SMs (`SMALL_WIDE`'s
        // widest), the last with one tile of its four.
        (16, 8456, 272),
        // 94 blocks of 32 rows on 132 SMs: the few-block shape (`SMALL_FEW`,
        // 8 warps over 9 column blocks, the last of 16 columns).
        (14, 3000, 1040),
        (17, 200, 336),
        (40, 130, 272),
        (64, 384, 512),
        (100, 136, 272),
        // The large-M kernel: two token tiles (one partial), a partial tile of
        // weight rows with N % 8 != 0 (scalar stores), K % 64 == 16; then an
        // odd number of 64-column stages and a partial 128-column block.
        (300, 201, 336),
        (520, 136, 1040),
        // A long K on the wgmma kernel: 2049 stages, 1025 block factors a
        // row tile, N below one tile.
        (72, 8, 131_088),
    ];
    let mut seed = 900;
    for &(m, n, k) in &shapes {
        for format in [Format::E4M3, Format::E5M2] {
            for scaling in [
                WeightScaling::Tensor,
                WeightScaling::Channel,
                WeightScaling::Block128,
            ] {
                seed += 1;
                let wf = random_f32(n * k, seed, 0.05);
                let w = Fp8Weight::quantize(&wf, n, k, format, scaling)
                    .map_err(|e| Error::Shape(e.to_string()))?;
                let wd = w.dequantize();
                let xb: Vec<bf16> = random_bf16(m * k, seed + 7, 2.0)
                    .into_iter()
                    .map(f16_exact)
                    .collect();
                let dw = gpu.upload_fp8_weight(&w)?;
                let dwt = gpu.upload_fp8_weight_tiled(&w)?;
                let dx_bf16 = gpu.upload(&bf16_bits(&xb))?;
                let dx_f16 = gpu.upload(
                    &xb.iter()
                        .map(|v| half::f16::from_f32(v.to_f32()).to_bits())
                        .collect::<Vec<u16>>(),
                )?;
                let reference = f64_reference(&xb, &wd, m, n, k);
                let x_abs: Vec<f64> = xb
                    .chunks_exact(k)
                    .map(|r| r.iter().map(|v| v.to_f64().abs()).sum())
                    .collect();
                for (xt, dx, bf16_out) in [
                    (XType::Bf16, &dx_bf16, false),
                    (XType::Bf16, &dx_bf16, true),
                    (XType::F16, &dx_f16, false),
                    (XType::F16, &dx_f16, true),
                ] {
                    if bf16_out && ![5, 17, 100, 300, 520].contains(&m) {
                        continue;
                    }
                    // Row-major codes, checked against the bound; tiled codes
                    // (the same sums in the same order) must give the same bits.
                    let product = |dw: &octet_cuda::DeviceFp8Weight| -> Result<Vec<f32>> {
                        Ok(if bf16_out {
                            let mut y = gpu.upload(&vec![0x7fc0u16; m * n])?;
                            gpu.mixed_matmul_x(dx, xt, m, dw, &mut y)?;
                            download_f32(gpu, &y)?
                        } else {
                            let mut y = gpu.upload(&vec![f32::NAN; m * n])?;
                            gpu.mixed_matmul_x(dx, xt, m, dw, &mut y)?;
                            gpu.download(&y)?
                        })
                    };
                    let got = product(&dw)?;
                    let tiled = product(&dwt)?;
                    let differ = got
                        .iter()
                        .zip(&tiled)
                        .filter(|(a, b)| a.to_bits() != b.to_bits())
                        .count();
                    let mut bad = 0;
                    let mut worst = 0f64;
                    for (e, (g, &(sum, abs))) in got.iter().zip(&reference).enumerate() {
                        let mut bound = (k + 16) as f64 * 2f64.powi(-24) * abs;
                        if m > octet_cuda::mixed::SMALL_M && scaling == WeightScaling::Block128 {
                            bound += match xt {
                                XType::Bf16 => 2f64.powi(-8) * abs,
                                XType::F16 => 2f64.powi(-11) * abs + 2f64.powi(-25) * x_abs[e / n],
                            };
                        }
                        if bf16_out {
                            bound += 2f64.powi(-8) * sum.abs();
                        }
                        let r = (*g as f64 - sum).abs() / (bound + f64::MIN_POSITIVE);
                        tally(r, &mut bad, &mut worst);
                    }
                    out.push(CaseResult {
                        name: format!(
                            "mixed {} {scaling:?} m={m} n={n} k={k}, x {} -> {}, row-major and tiled codes",
                            format.name(),
                            if xt == XType::F16 { "f16" } else { "bf16" },
                            if bf16_out { "bf16" } else { "f32" }
                        ),
                        pass: bad == 0 && differ == 0,
                        worst: format!(
                            "{bad} outside; worst error / bound {worst:.3}; {differ} differ tiled"
                        ),
                    });
                }
            }
        }
    }
    mixed_swiglu_cases(gpu, &mut seed, out)?;
    // Bad input: K not a multiple of 16, x of the wrong size.
    let w = small_fp8_weight(16, 40, WeightScaling::Tensor)?;
    let r = gpu.upload_fp8_weight(&w);
    out.push(shape_error(
        "mixed weight with K=40 (not a multiple of 16) -> shape error",
        r,
    ));
    let w = small_fp8_weight(16, 48, WeightScaling::Tensor)?;
    let dw = gpu.upload_fp8_weight(&w)?;
    let dx = gpu.upload(&[0u16; 2 * 47])?;
    let mut y: CudaSlice<f32> = gpu.alloc_zeros(2 * 16, "y")?;
    let r = gpu.mixed_matmul(&dx, 2, &dw, &mut y);
    out.push(shape_error(
        "mixed product with x of 2x47 for K=48 -> shape error",
        r,
    ));
    // The weight's shape and scaling are crate-visible fields, the buffers are not:
    // a K or scaling changed after upload must not send the kernels past the
    // codes (16 x 48 of them, read as 16 x 64) or the one per-tensor factor
    // (read as 16 per-row ones). x and y fit the changed shape, so only the
    // weight's own check can refuse it.
    let mut dw = dw;
    dw.k = 64;
    let dx = gpu.upload(&[0u16; 2 * 64])?;
    out.push(shape_error(
        "mixed product with a (16, 48) weight's k changed to 64 after upload -> shape error",
        gpu.mixed_matmul(&dx, 2, &dw, &mut y),
    ));
    dw.k = 48;
    dw.scaling = WeightScaling::Channel;
    let dx = gpu.upload(&[0u16; 2 * 48])?;
    out.push(shape_error(
        "mixed product with a per-tensor weight's scaling changed to per-row -> shape error",
        gpu.mixed_matmul(&dx, 2, &dw, &mut y),
    ));
    // f16 x above SMALL_M rows rounds each scaled code to f16: a block-scaled
    // weight reaching past 65504 is refused there, and taken at SMALL_M rows
    // (the small-M kernel scales f32 partial sums). Two 128-column blocks: a
    // weight of one block is per-tensor scaled.
    let (n, k) = (16, 256);
    let big: Vec<f32> = random_f32(n * k, 6, 1.0)
        .iter()
        .map(|v| v * 1.0e5)
        .collect();
    let w = Fp8Weight::quantize(&big, n, k, Format::E4M3, WeightScaling::Block128)
        .map_err(|e| Error::Shape(e.to_string()))?;
    let dw = gpu.upload_fp8_weight(&w)?;
    for m in [octet_cuda::mixed::SMALL_M + 1, octet_cuda::mixed::SMALL_M] {
        let dx = gpu.upload(&vec![0x3c00u16; m * k])?; // 1.0 in f16
        let mut y: CudaSlice<f32> = gpu.alloc_zeros(m * n, "y")?;
        let r = gpu.mixed_matmul_x(&dx, XType::F16, m, &dw, &mut y);
        if m > octet_cuda::mixed::SMALL_M {
            out.push(shape_error(
                format!("mixed f16 x, {m} rows, block-scaled |W| up to 1e5 -> shape error"),
                r,
            ));
        } else {
            let finite = r.is_ok() && download_f32(gpu, &y)?.iter().all(|v| v.is_finite());
            out.push(CaseResult {
                name: format!("mixed f16 x, {m} rows, block-scaled |W| up to 1e5 -> finite"),
                pass: finite,
                worst: r.err().map_or("ok".into(), |e| e.to_string()),
            });
        }
    }
    mixed_block_scale_cases(gpu, &mut seed, out)
}

/// The f64 product `x W^T` of `x (m, k)` and the dequantized `wd (n, k)`,
/// each output with the sum of its terms' magnitudes (which bounds the
/// error of an f32 accumulation).
pub(super) fn f64_reference(
    xb: &[bf16],
    wd: &[f32],
    m: usize,
    n: usize,
    k: usize,
) -> Vec<(f64, f64)> {
    let mut reference = vec![(0f64, 0f64); m * n];
    for i in 0..m {
        for j in 0..n {
            let (mut sum, mut abs) = (0f64, 0f64);
            for p in 0..k {
                let t = xb[i * k + p].to_f64() * wd[j * k + p] as f64;
                sum += t;
                abs += t.abs();
            }
            reference[i * n + j] = (sum, abs);
        }
    }
    reference
}

/// Block factors on either side of the wgmma kernel's bf16 scaling
/// (`mixed::bf16_scalable`), bf16 x, 100 rows: typical weights must take it
/// wherever the GPU has it, and weights whose factors are past its range
/// (|W| near 10^5 or 10^11, or below 10^-35) the f32 scaling. Each against
/// the f64 product within the bound of `mixed_cases` for codes scaled and
/// rounded to bf16, `(k + 16) 2^-24 abs + 2^-8 abs` (bf16's rounding is
/// `2^-8` relative; the split factor's up to `2^-15` more is inside the
/// `(k + 16) 2^-24` term), plus the bf16 output's `2^-8 |sum|`. These
/// cases catch gross errors only: a kernel that dropped `lo`, or applied
/// another block's factor, stays within a fifth of the bound.
pub(super) fn mixed_block_scale_cases(
    gpu: &Gpu,
    seed: &mut u64,
    out: &mut Vec<CaseResult>,
) -> Result<()> {
    use octet_cuda::XType;
    use octet_tensor::mixed::{Fp8Weight, WeightScaling};
    let (m, n, k) = (100usize, 136usize, 1040usize);
    for (format, size, typical) in [
        (Format::E4M3, 1.0f32, true),
        (Format::E4M3, 1e7, false),
        (Format::E4M3, 1e-35, false),
        (Format::E5M2, 1.0, true),
        (Format::E5M2, 1e11, false),
    ] {
        *seed += 1;
        let wf: Vec<f32> = random_f32(n * k, *seed, 0.05)
            .iter()
            .map(|v| v * size)
            .collect();
        let w = Fp8Weight::quantize(&wf, n, k, format, WeightScaling::Block128)
            .map_err(|e| Error::Shape(e.to_string()))?;
        let xb = random_bf16(m * k, *seed + 7, 2.0);
        let reference = f64_reference(&xb, &w.dequantize(), m, n, k);
        let dw = gpu.upload_fp8_weight(&w)?;
        let dx = gpu.upload(&bf16_bits(&xb))?;
        let in_bf16 = gpu.block_in_bf16(&dw, XType::Bf16);
        // Typical factors take bf16 wherever the kernel is loaded (sm_90a,
        // not OCTET_MIXED=upcast or OCTET_MIXED_BLOCK=f32); others never.
        let routed = if typical {
            in_bf16 == gpu.has_wgmma_block_bf16()
        } else {
            !in_bf16
        };
        for bf16_out in [false, true] {
            let got = if bf16_out {
                let mut y = gpu.upload(&vec![0x7fc0u16; m * n])?;
                gpu.mixed_matmul(&dx, m, &dw, &mut y)?;
                download_f32(gpu, &y)?
            } else {
                let mut y = gpu.upload(&vec![f32::NAN; m * n])?;
                gpu.mixed_matmul(&dx, m, &dw, &mut y)?;
                gpu.download(&y)?
            };
            let (mut bad, mut worst) = (0, 0f64);
            for (g, &(sum, abs)) in got.iter().zip(&reference) {
                let mut bound = ((k + 16) as f64 * 2f64.powi(-24) + 2f64.powi(-8)) * abs;
                if bf16_out {
                    bound += 2f64.powi(-8) * sum.abs();
                }
                tally(
                    (*g as f64 - sum).abs() / (bound + f64::MIN_POSITIVE),
                    &mut bad,
                    &mut worst,
                );
            }
            out.push(CaseResult {
                name: format!(
                    "mixed {} Block128 m={m} n={n} k={k}, |W| ~ {size:e} x 0.05, x bf16 -> {}, \
                     scaled in {}",
                    format.name(),
                    if bf16_out { "bf16" } else { "f32" },
                    if in_bf16 { "bf16" } else { "f32" }
                ),
                pass: bad == 0 && routed,
                worst: format!("{bad} outside; worst error / bound {worst:.3}; routed {routed}"),
            });
        }
    }
    Ok(())
}

/// `v` moved to a value both bf16 and f16 hold exactly: a bf16 of magnitude
/// at least 2^-14 (f16's smallest normal) and at most 65504 is one; smaller
/// ones become +-2^-14 (the selftest's x stay far below 65504; larger ones
/// are not changed).
pub(super) fn f16_exact(v: bf16) -> bf16 {
    let a = v.to_f32().abs();
    if a == 0.0 || a >= 2f32.powi(-14) {
        return v;
    }
    bf16::from_f32(2f32.powi(-14).copysign(v.to_f32()))
}

/// The case "`name` -> shape error": passes when `r` is `Error::Shape`.
pub(super) fn shape_error<T>(name: impl Into<String>, r: Result<T>) -> CaseResult {
    CaseResult {
        name: name.into(),
        pass: matches!(r, Err(Error::Shape(_))),
        worst: r.err().map_or("no error".into(), |e| e.to_string()),
    }
}

/// A random E4M3 weight `(n, k)` for the refused-shape cases.
pub(super) fn small_fp8_weight(
    n: usize,
    k: usize,
    scaling: octet_tensor::mixed::WeightScaling,
) -> Result<octet_tensor::mixed::Fp8Weight> {
    octet_tensor::mixed::Fp8Weight::quantize(
        &random_f32(n * k, 5, 1.0),
        n,
        k,
        Format::E4M3,
        scaling,
    )
    .map_err(|e| Error::Shape(e.to_string()))
}

/// The fused SwiGLU product (`Gpu::mixed_matmul_swiglu`, the decoder's
/// gate/up step) against SwiGLU computed on the host, in f64, from the
/// kernel's own f32 product of the same interleaved weight (`mixed_matmul`,
/// which `mixed_cases` checks against f64). Both start from the same f32
/// gate and up, so they differ only by `__expf` and the f32 division, which
/// can move the bf16 rounding by one unit: within 2^-7 of the value.
/// Shapes: tokens of each small-M group and across groups, K off the
/// 128-column blocks, both layouts, every format and scaling; then the
/// shapes it refuses.
pub(super) fn mixed_swiglu_cases(
    gpu: &Gpu,
    seed: &mut u64,
    out: &mut Vec<CaseResult>,
) -> Result<()> {
    use octet_cuda::mixed::interleave_gate_up;
    use octet_tensor::mixed::{Fp8Weight, WeightScaling};
    for &(m, ff, k) in &[
        (1usize, 64usize, 272usize),
        (3, 200, 4096),
        (8, 136, 1040),
        (16, 64, 512),
        (40, 72, 272),
        // 4240 and 8464 rows: on 132 SMs the wide 16-token shapes
        // (`SMALL_WIDE`, 32 and 64 rows), features 8 (tile0 + rt) + g of
        // every tile, the last block's later tiles absent.
        (16, 2120, 272),
        (16, 4232, 272),
        // 2992 rows: the few-block shape (`SMALL_FEW`) on 132 SMs.
        (13, 1496, 1040),
    ] {
        for format in [Format::E4M3, Format::E5M2] {
            for scaling in [
                WeightScaling::Tensor,
                WeightScaling::Channel,
                WeightScaling::Block128,
            ] {
                *seed += 1;
                let stacked = random_f32(2 * ff * k, *seed, 0.05);
                let wf = interleave_gate_up(&stacked, ff, k)?;
                let w = Fp8Weight::quantize(&wf, 2 * ff, k, format, scaling)
                    .map_err(|e| Error::Shape(e.to_string()))?;
                let dx = gpu.upload(&bf16_bits(&random_bf16(m * k, *seed + 7, 2.0)))?;
                for tiled in [false, true] {
                    let dw = if tiled {
                        gpu.upload_fp8_weight_tiled(&w)?
                    } else {
                        gpu.upload_fp8_weight(&w)?
                    };
                    let mut gu = gpu.upload(&vec![f32::NAN; m * 2 * ff])?;
                    gpu.mixed_matmul(&dx, m, &dw, &mut gu)?;
                    let gu = gpu.download(&gu)?;
                    let mut act = gpu.upload(&vec![0x7fc0u16; m * ff])?;
                    gpu.mixed_matmul_swiglu(&dx, m, &dw, &mut act)?;
                    let got = download_f32(gpu, &act)?;
                    let (mut bad, mut worst) = (0, 0f64);
                    for t in 0..m {
                        for f in 0..ff {
                            let at = t * 2 * ff + (f / 8) * 16 + f % 8;
                            let (a, u) = (gu[at] as f64, gu[at + 8] as f64);
                            let want = a / (1.0 + (-a).exp()) * u;
                            let r = (got[t * ff + f] as f64 - want).abs()
                                / (2f64.powi(-7) * want.abs() + 1e-30);
                            tally(r, &mut bad, &mut worst);
                        }
                    }
                    out.push(CaseResult {
                        name: format!(
                            "mixed SwiGLU {} {scaling:?} m={m} ff={ff} k={k}, {} codes",
                            format.name(),
                            if tiled { "tiled" } else { "row-major" }
                        ),
                        pass: bad == 0,
                        worst: format!("{bad} outside; worst error / (2^-7 |value|) {worst:.3}"),
                    });
                }
            }
        }
    }
    // Refused: more rows than the small-M kernel takes; N not whole 16-row tiles.
    let w = small_fp8_weight(16, 32, WeightScaling::Channel)?;
    let dw = gpu.upload_fp8_weight_tiled(&w)?;
    let m = octet_cuda::mixed::SMALL_M + 1;
    let dx = gpu.upload(&vec![0u16; m * 32])?;
    let mut act = gpu.upload(&vec![0u16; m * 8])?;
    let r = gpu.mixed_matmul_swiglu(&dx, m, &dw, &mut act);
    out.push(shape_error(
        format!("mixed SwiGLU with {m} rows -> shape error"),
        r,
    ));
    let w = small_fp8_weight(24, 32, WeightScaling::Channel)?;
    let dw = gpu.upload_fp8_weight_tiled(&w)?;
    let dx = gpu.upload(&[0u16; 32])?;
    let mut act = gpu.upload(&[0u16; 12])?;
    let r = gpu.mixed_matmul_swiglu(&dx, 1, &dw, &mut act);
    out.push(shape_error(
        "mixed SwiGLU with N = 24 (not whole 16-row tiles) -> shape error",
        r,
    ));
    Ok(())
}

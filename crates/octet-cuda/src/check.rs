//! Conformance: the GPU against the CPU reference on the same inputs.
//!
//! Quantize must be bit-exact (codes and scales) with `octet_fp8::quantize`;
//! GEMMs must agree with `octet_tensor::cpu` within f32 accumulation-order
//! noise. Inputs are fresh pseudo-random data (never all zeros, except the one
//! case that tests amax = 0), outputs are poisoned before each run so an
//! element the GPU never writes shows up as a mismatch.

use crate::{Error, Gpu, Result};
use cudarc::driver::CudaSlice;
use half::bf16;
use octet_fp8::{
    Format, Granularity, Layout, QuantData, QuantSpec, Rounding, ScaleRule, Scales, Usage,
};

pub use crate::bench::{bench, bench_linear, BenchRow};

/// One conformance case.
#[derive(Clone, Debug)]
pub struct CaseResult {
    /// What was checked.
    pub name: String,
    /// Whether it passed.
    pub pass: bool,
    /// The worst error seen (bytes differing with the first bad index, or relative error), as text.
    pub worst: String,
}

/// Uniform values in `[-scale, scale)` from a counter hash (fast, reproducible, never all zero).
pub fn random_bf16(n: usize, seed: u64, scale: f32) -> Vec<bf16> {
    random_f32(n, seed, scale)
        .into_iter()
        .map(bf16::from_f32)
        .collect()
}

/// Uniform f32 values in `[-scale, scale)` from a counter hash.
pub fn random_f32(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let u = octet_fp8::format::sr_bits(seed, i as u64) as f32 / 4_294_967_296.0;
            (2.0 * u - 1.0) * scale
        })
        .collect()
}

/// Log-uniform magnitudes over `2^-30 .. 2^6` with random signs, about 3% exact
/// zeros: exercises FP8 subnormals, underflow to zero and both signs.
pub fn random_wide_f32(n: usize, seed: u64) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let r = octet_fp8::format::sr_bits(seed, i as u64);
            if r.is_multiple_of(32) {
                return 0.0;
            }
            let e = (r >> 8) as f32 / 16_777_216.0 * 36.0 - 30.0;
            let v = e.exp2();
            if r & 1 == 1 {
                -v
            } else {
                v
            }
        })
        .collect()
}

pub(crate) fn bf16_bits(v: &[bf16]) -> Vec<u16> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn spec(format: Format, granularity: Granularity, power_of_two: bool) -> QuantSpec {
    QuantSpec {
        format,
        granularity,
        rule: ScaleRule::Amax { power_of_two },
        rounding: Rounding::NearestEven,
    }
}

/// `||got - want|| / ||want||` in f64; infinite if `got` has a NaN/inf (an unwritten, poisoned element).
pub fn rel_frobenius(got: &[f32], want: &[f32]) -> f64 {
    if got.len() != want.len() || got.iter().any(|v| !v.is_finite()) {
        return f64::INFINITY;
    }
    let (mut e, mut s) = (0f64, 0f64);
    for (&g, &w) in got.iter().zip(want) {
        e += (g as f64 - w as f64).powi(2);
        s += (w as f64).powi(2);
    }
    (e / s.max(f64::MIN_POSITIVE)).sqrt()
}

/// Mismatching bytes: count and the first index, as text (`"0 of N"` when equal).
fn byte_diff(got: &[u8], want: &[u8]) -> (usize, String) {
    if got.len() != want.len() {
        return (
            usize::MAX,
            format!("length {} vs {}", got.len(), want.len()),
        );
    }
    let bad = got.iter().zip(want).filter(|(a, b)| a != b).count();
    let first = got.iter().zip(want).position(|(a, b)| a != b);
    let text = match first {
        None => format!("0 of {} differ", got.len()),
        Some(i) => format!(
            "{bad} of {} differ, first at {i}: gpu {:#04x} cpu {:#04x}",
            got.len(),
            got[i],
            want[i]
        ),
    };
    (bad, text)
}

fn f32_bits_equal(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// Compare one GPU copy (codes + f32 scales) with the CPU's; returns (pass, text).
fn compare_copy(got: &[u8], got_scales: &[f32], want: &QuantData, what: &str) -> (bool, String) {
    let (bad, text) = byte_diff(got, &want.data);
    let scales_ok = match &want.scales {
        Scales::F32(v) => f32_bits_equal(got_scales, v),
        _ => false,
    };
    (
        bad == 0 && scales_ok,
        format!(
            "{what}: {text}, scales {}",
            if scales_ok { "equal" } else { "DIFFER" }
        ),
    )
}

fn host_data(
    gpu: &Gpu,
    rows: usize,
    cols: usize,
    format: Format,
    data: &CudaSlice<u8>,
    scale_inv: &CudaSlice<f32>,
) -> Result<QuantData> {
    Ok(QuantData {
        rows,
        cols,
        format,
        data: gpu.download(data)?,
        block: (rows, cols),
        scales: Scales::F32(gpu.download(scale_inv)?),
        saturated: 0,
        underflowed: 0,
    })
}

/// Host copy of a device per-tensor quantized tensor's `layout` copy as a CPU [`QuantData`].
pub fn to_host(gpu: &Gpu, q: &crate::DeviceFp8, layout: Layout) -> Result<QuantData> {
    match layout {
        Layout::Rowwise => host_data(gpu, q.rows, q.cols, q.format, &q.rowwise, &q.scale_inv),
        Layout::Colwise => host_data(gpu, q.cols, q.rows, q.format, &q.colwise, &q.scale_inv),
    }
}

/// The conformance suite: quantize bit-exact against the CPU, FP8 and bf16
/// GEMMs within tolerance, weight-only products, the layers, the training and
/// LoRA models, and the bad-input errors (about a minute on an H100). See [`selftest_groups`] for the groups skipped on a
/// GPU without FP8 GEMMs.
pub fn selftest(gpu: &Gpu) -> Result<Vec<CaseResult>> {
    Ok(selftest_groups(gpu, Scope::All)?.0)
}

/// A group of conformance cases.
pub(crate) type Group = fn(&Gpu, &mut Vec<CaseResult>) -> Result<()>;

/// On a GPU without FP8 GEMMs, a case that `needs` them is recorded as
/// skipped (returns `true`: the caller goes on to its next case). Groups
/// guard their FP8 cases with it, so that the cases after one still run.
pub(crate) fn skip_without_fp8_gemm(
    gpu: &Gpu,
    needs: bool,
    name: impl Into<String>,
    out: &mut Vec<CaseResult>,
) -> bool {
    let skip = needs && !gpu.fp8_gemm;
    if skip {
        out.push(CaseResult {
            name: name.into(),
            pass: false,
            worst: Error::Unsupported("needs FP8 GEMMs".into()).to_string(),
        });
    }
    skip
}

/// Which cases [`selftest_groups`] runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// Every group.
    All,
    /// The FP8 conversions and the weight-only products alone (`octet
    /// selftest --only weight-only`): the checks a GPU without FP8 GEMMs
    /// runs in full, in a fraction of the time.
    WeightOnly,
}

/// What [`Error::Unsupported`] displays first (checked by a unit test).
const UNSUPPORTED: &str = "not supported on this GPU: ";

/// [`selftest`], and the names of the cases and groups skipped because they
/// need FP8 GEMMs, which this GPU lacks (Ampere, or `OCTET_FP8_GEMM=off`).
/// There the groups skip their FP8 cases one by one
/// (`skip_without_fp8_gemm`); a group that still stops on
/// [`Error::Unsupported`] is skipped from there on (its name is listed), and
/// one case checks that an FP8 GEMM is refused. A group that fails with any
/// other error is a failed case named after it.
pub fn selftest_groups(gpu: &Gpu, scope: Scope) -> Result<(Vec<CaseResult>, Vec<String>)> {
    let mut out = Vec::new();
    let mut skipped = Vec::new();
    let groups: &[(&'static str, Group)] = if scope == Scope::WeightOnly {
        &[
            ("FP8 conversion cases", conversion_cases),
            ("weight-only product cases", mixed_cases),
        ]
    } else {
        &[
            ("FP8 conversion cases", conversion_cases),
            ("quantize cases", quantize_cases),
            ("1x128 block cases", block_cases),
            ("block variant cases", block_variant_cases),
            ("transpose cases", transpose_cases),
            ("FP8 GEMM cases", gemm_fp8_cases),
            ("bf16 GEMM cases", gemm_bf16_cases),
            ("bad-input cases", error_cases),
            ("weight-only product cases", mixed_cases),
            ("decoding cases", decode_cases),
            ("row-wise cases", rowwise_cases),
            ("delayed scaling cases", delayed_cases),
            ("block-scaled GEMM cases", block_gemm_cases),
            ("linear layer cases", linear_cases),
            ("fast accumulation cases", fast_accum_cases),
            ("MXFP8 cases", mx_cases),
            ("NVFP4 cases", nvfp4_cases),
            ("telemetry cases", telemetry_cases),
            ("training model cases", model_cases),
            ("LoRA fused cast cases", crate::lora_check::fused_cases),
            ("LoRA d_A cases", crate::lora_check::da_cases),
            ("LoRA layer cases", crate::lora_check::layer_cases),
            (
                "LoRA FP8-saved input cases",
                crate::lora_check::fp8_saved_layer_cases,
            ),
            ("LoRA dropout cases", crate::lora_check::dropout_cases),
            ("LoRA model cases", crate::lora_check::model_cases),
            (
                "LoRA stored-checkpoint cases",
                crate::lora_check::stored_cases,
            ),
            ("activation recomputation cases", recompute_cases),
            ("sharded model cases (NCCL, one rank)", sharded_cases),
        ]
    };
    for &(name, group) in groups {
        match group(gpu, &mut out) {
            Ok(()) => {}
            Err(Error::Unsupported(_)) if !gpu.fp8_gemm => skipped.push(name.to_string()),
            Err(e) => out.push(CaseResult {
                name: name.into(),
                pass: false,
                worst: e.to_string(),
            }),
        }
    }
    if !gpu.fp8_gemm {
        let (refused, kept): (Vec<CaseResult>, Vec<CaseResult>) = out
            .into_iter()
            .partition(|c| !c.pass && c.worst.starts_with(UNSUPPORTED));
        out = kept;
        skipped.extend(refused.into_iter().map(|c| c.name));
    }
    if !gpu.fp8_gemm {
        let (a, sa) = (gpu.upload(&[0u8; 256])?, gpu.upload(&[1f32])?);
        let mut d = gpu.upload(&[0f32; 256])?;
        let r = gpu.blas()?.gemm_fp8(
            &a,
            Format::E4M3,
            &sa,
            &a,
            Format::E4M3,
            &sa,
            &mut d,
            (16, 16, 16),
            false,
        );
        out.push(CaseResult {
            name: "FP8 GEMM refused without FP8 tensor cores".into(),
            pass: matches!(r, Err(Error::Unsupported(_))),
            worst: match r {
                Err(e) => e.to_string(),
                Ok(()) => "it ran".into(),
            },
        });
    }
    Ok((out, skipped))
}

/// Equal values, or both NaN (an FP8 NaN's sign and payload are not part of
/// the contract).
fn same_value(a: f64, b: f64) -> bool {
    a == b || (a.is_nan() && b.is_nan())
}

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
fn conversion_cases(gpu: &Gpu, out: &mut Vec<CaseResult>) -> Result<()> {
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

/// The weight-only product of a weight whose 256 rows hold codes
/// `(j + p) % 256` at column `p` (every code at each of the 16 positions of a
/// 16-byte load; NaN codes and E5M2's infinities, which a weight may not
/// hold, replaced by zero; factors 1, per tensor or per 128x128 tile) with
/// `m` one-hot token rows (token `i` at column `i % 16`). Each output is one
/// decoded code, so it must equal the f64 product exactly.
/// Returns the outputs checked and, if any differs, a line on the first.
pub(crate) fn every_code_product(
    gpu: &Gpu,
    format: Format,
    block128: bool,
    m: usize,
) -> Result<(usize, Option<String>)> {
    use octet_tensor::mixed::Fp8Weight;
    let (n, k) = (256usize, 16usize);
    let mut w = vec![0u8; n * k];
    for j in 0..n {
        for p in 0..k {
            let c = ((j + p) % 256) as u8;
            let finite = !format.is_nan(c) && format.decode(c).is_finite();
            w[j * k + p] = if finite { c } else { 0 };
        }
    }
    let (block, nf) = if block128 {
        ((128, 128), n.div_ceil(128))
    } else {
        ((n, k), 1)
    };
    let wq = Fp8Weight::from_quant_data(QuantData {
        rows: n,
        cols: k,
        format,
        data: w.clone(),
        block,
        scales: Scales::F32(vec![1.0; nf]),
        saturated: 0,
        underflowed: 0,
    })
    .map_err(|e| Error::Shape(e.to_string()))?;
    let dw = gpu.upload_fp8_weight(&wq)?;
    let xb: Vec<u16> = (0..m * k)
        .map(|e| if e % k == (e / k) % k { 0x3f80 } else { 0 })
        .collect();
    let dx = gpu.upload(&xb)?;
    let mut y = gpu.upload(&vec![0f32; m * n])?;
    gpu.mixed_matmul(&dx, m, &dw, &mut y)?;
    let got = gpu.download(&y)?;
    let mut bad = 0usize;
    let mut first = None;
    for i in 0..m {
        for j in 0..n {
            let want: f64 = (0..k)
                .map(|p| {
                    let xv = if p == i % k { 1.0 } else { 0.0 };
                    xv * format.decode(w[j * k + p]) as f64
                })
                .sum();
            let g = got[i * n + j] as f64;
            if !same_value(g, want) {
                bad += 1;
                first.get_or_insert((i, j, g, want));
            }
        }
    }
    Ok((
        m * n,
        first.map(|(i, j, g, w)| format!("{bad} differ, first ({i}, {j}): {g} for {w}")),
    ))
}

/// The byte transpose (column-wise copies of per-tensor FP8 matrices) against
/// the CPU's, bit for bit: shapes for the 4x4-block kernel (multiples of 4,
/// with partial 64x64 tiles) and for the one-byte kernel (odd dims).
fn transpose_cases(gpu: &Gpu, out: &mut Vec<CaseResult>) -> Result<()> {
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

const SHAPES: [(usize, usize); 7] = [
    (256, 512),
    (217, 300),
    (64, 64),
    (1, 16),
    (1000, 8),
    (333, 1000),
    (128, 4096),
];

/// Inputs named by kind: uniform, wide dynamic range, all zeros, tiny amax.
fn input(kind: &str, n: usize, seed: u64) -> Vec<f32> {
    match kind {
        "uniform" => random_f32(n, seed, 3.0),
        "wide" => random_wide_f32(n, seed),
        "zeros" => vec![0.0; n],
        // amax ~1e-39 (a bf16/f32 subnormal): max / amax overflows f32, the scale is f32::MAX.
        _ => random_f32(n, seed, 1e-39),
    }
}

fn quantize_cases(gpu: &Gpu, out: &mut Vec<CaseResult>) -> Result<()> {
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

fn block_cases(gpu: &Gpu, out: &mut Vec<CaseResult>) -> Result<()> {
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
fn block_variant_cases(gpu: &Gpu, out: &mut Vec<CaseResult>) -> Result<()> {
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

pub(crate) fn download_f32<D: crate::GemmOut>(gpu: &Gpu, d: &CudaSlice<D>) -> Result<Vec<f32>> {
    Ok(gpu.download(d)?.into_iter().map(D::to_f32).collect())
}

/// Elements of a bf16 output outside `2^-8 |w| + atol` of the f32 reference `w`
/// (a correct bf16 rounding is within `2^-9 |w|`; `atol` covers the
/// accumulation error, which does not shrink with `|w|` where a sum cancels).
/// Returns the count and the worst ratio of error to bound.
fn bf16_outside(got: &[f32], want: &[f32], atol: f64) -> (usize, f64) {
    let mut bad = 0;
    let mut worst = 0f64;
    for (&g, &w) in got.iter().zip(want) {
        let bound = (w as f64).abs() / 256.0 + atol;
        tally(
            ((g as f64) - (w as f64)).abs() / bound,
            &mut bad,
            &mut worst,
        );
    }
    (bad, worst)
}

/// One element's ratio of error to bound: counted as outside when above 1
/// or NaN, and the worst ratio kept (NaN as infinity).
fn tally(r: f64, bad: &mut usize, worst: &mut f64) {
    if r.is_nan() || r > 1.0 {
        *bad += 1;
    }
    *worst = worst.max(if r.is_nan() { f64::INFINITY } else { r });
}

fn rms(v: &[f32]) -> f64 {
    (v.iter().map(|&x| (x as f64).powi(2)).sum::<f64>() / v.len().max(1) as f64).sqrt()
}

// FP8 GEMM tolerances, f32 output against the CPU's f32 accumulation of the same
// exact FP8 products (`octet_tensor::cpu::fp8_gemm`). If the GPU accumulated in
// f32 the error would be order noise, ~1e-6. Measured on an H100 (cuBLASLt 13,
// 2026-11-22): 0.88e-4 to 1.09e-4 without fast accumulation at every k from 256
// to 8192 (Hopper's FP8 tensor cores keep partial sums in reduced precision
// before cuBLASLt promotes them to f32, so the error is per chunk, not per k),
// and 1.4e-4 (k=256) to 9.6e-4 (k=4096) with fast accumulation, which never
// promotes and so grows with k. Bounds: twice the worst measured value.
const FP8_TOL: f64 = 2e-4;
const FP8_FAST_TOL: f64 = 2e-3;
// A bf16 output adds its rounding (relative 2^-9 per element, ~1.7e-3 Frobenius).
const BF16_OUT_TOL: f64 = 4e-3;

fn gemm_fp8_cases(gpu: &Gpu, out: &mut Vec<CaseResult>) -> Result<()> {
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
const BF16_F32_TOL: f64 = 1e-5;

fn gemm_bf16_cases(gpu: &Gpu, out: &mut Vec<CaseResult>) -> Result<()> {
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

fn error_cases(gpu: &Gpu, out: &mut Vec<CaseResult>) -> Result<()> {
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
    lora_error_cases(gpu, out)
}

/// A LoRA layer `(n, k)` over a zero bf16 base with a rank-`r` adapter of
/// small random values, `--compute bf16`, the `high_precision` backward.
fn small_lora(gpu: &Gpu, (n, k): (usize, usize), r: usize) -> Result<crate::lora::GpuLoraLinear> {
    use crate::lora::{GpuAdapter, GpuBase, GpuLoraLinear};
    let base = GpuBase::Bf16(gpu.alloc_zeros(n * k, "base")?);
    let a = gpu.upload(&bf16_bits(&random_bf16(r * k, 31, 0.1)))?;
    let b = gpu.upload(&bf16_bits(&random_bf16(n * r, 32, 0.1)))?;
    let ad = GpuAdapter::new(gpu, a, b, r, 1.0)?;
    GpuLoraLinear::new(
        base,
        (n, k),
        Some(ad),
        octet_nn::lora::Compute::Bf16,
        octet_fp8::BackwardMode::HighPrecision,
    )
}

/// LoRA layers whose public fields were changed after `GpuLoraLinear::new`.
fn lora_error_cases(gpu: &Gpu, out: &mut Vec<CaseResult>) -> Result<()> {
    use crate::lora::{forward_group, GpuAdapter};
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
        crate::lora::backward_group(&layers, gpu, saved, vec![(&dy, None), (&dy, None)], &mut dx),
    ));
    // A per-tensor FP8 base of (16, 32) set in place of the (32, 16) one:
    // the same number of codes, so the FP8 GEMM ran with the wrong matrix.
    use octet_tensor::mixed::WeightScaling;
    let w = gpu.upload_fp8_weight(&small_fp8_weight(32, 16, WeightScaling::Tensor)?)?;
    let mut fp8 = crate::lora::GpuLoraLinear::new(
        crate::lora::GpuBase::Fp8(w),
        (32, 16),
        None,
        octet_nn::lora::Compute::Fp8,
        octet_fp8::BackwardMode::HighPrecision,
    )?;
    let wt = gpu.upload_fp8_weight(&small_fp8_weight(16, 32, WeightScaling::Tensor)?)?;
    fp8.base = crate::lora::GpuBase::Fp8(wt);
    out.push(shape_error(
        "LoRA FP8 forward of a (32, 16) layer whose base was set to (16, 32) -> shape error",
        forward_group(std::slice::from_ref(&fp8), gpu, (x.clone(), None, m), None),
    ));
    Ok(())
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
fn mixed_cases(gpu: &Gpu, out: &mut Vec<CaseResult>) -> Result<()> {
    use crate::XType;
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
                    let product = |dw: &crate::DeviceFp8Weight| -> Result<Vec<f32>> {
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
                        if m > crate::mixed::SMALL_M && scaling == WeightScaling::Block128 {
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
    for m in [crate::mixed::SMALL_M + 1, crate::mixed::SMALL_M] {
        let dx = gpu.upload(&vec![0x3c00u16; m * k])?; // 1.0 in f16
        let mut y: CudaSlice<f32> = gpu.alloc_zeros(m * n, "y")?;
        let r = gpu.mixed_matmul_x(&dx, XType::F16, m, &dw, &mut y);
        if m > crate::mixed::SMALL_M {
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
fn f64_reference(xb: &[bf16], wd: &[f32], m: usize, n: usize, k: usize) -> Vec<(f64, f64)> {
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
fn mixed_block_scale_cases(gpu: &Gpu, seed: &mut u64, out: &mut Vec<CaseResult>) -> Result<()> {
    use crate::XType;
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
            in_bf16 == gpu.k.mixed.wg_block_bf16.is_some()
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
fn f16_exact(v: bf16) -> bf16 {
    let a = v.to_f32().abs();
    if a == 0.0 || a >= 2f32.powi(-14) {
        return v;
    }
    bf16::from_f32(2f32.powi(-14).copysign(v.to_f32()))
}

/// The case "`name` -> shape error": passes when `r` is `Error::Shape`.
fn shape_error<T>(name: impl Into<String>, r: Result<T>) -> CaseResult {
    CaseResult {
        name: name.into(),
        pass: matches!(r, Err(Error::Shape(_))),
        worst: r.err().map_or("no error".into(), |e| e.to_string()),
    }
}

/// A random E4M3 weight `(n, k)` for the refused-shape cases.
fn small_fp8_weight(
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
fn mixed_swiglu_cases(gpu: &Gpu, seed: &mut u64, out: &mut Vec<CaseResult>) -> Result<()> {
    use crate::mixed::interleave_gate_up;
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
    let m = crate::mixed::SMALL_M + 1;
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

/// GPU decoding of a tiny random model against the CPU decoder with the same
/// stored weights (the same FP8 codes, or bf16): the GPU rounds the inputs of
/// its products to bf16, so logits agree to the bf16 activation error, not
/// bit for bit. Floor: 30 dB SQNR over the decoded tokens' logits (measured
/// values are printed). Two models: the tiny one (head dim 8, fewer lanes
/// than a warp) for 48 of its 64 positions, the small one (head dim 32) for
/// 200, past the attention kernel's 8-warp stride many times over.
fn decode_cases(gpu: &Gpu, out: &mut Vec<CaseResult>) -> Result<()> {
    for (preset, steps) in [("tiny", 48u32), ("small", 200)] {
        decode_model_cases(gpu, preset, None, steps, out)?;
    }
    // Llama 3's RoPE scaling, stretched so that 200 positions turn most of
    // the small model's 16 frequencies differently from plain RoPE: the GPU
    // decoder's rotary tables must follow the CPU's.
    let llama3 = octet_nn::llama::RopeScaling {
        rope_type: "llama3".into(),
        factor: Some(8.0),
        low_freq_factor: Some(1.0),
        high_freq_factor: Some(8.0),
        original_max_position_embeddings: Some(64),
    };
    decode_model_cases(gpu, "small", Some(llama3), 200, out)
}

/// Signal-to-noise ratio of `got` against `want`, in dB.
fn logits_sqnr(got: &[f32], want: &[f32]) -> f64 {
    let err: f64 = got
        .iter()
        .zip(want)
        .map(|(&a, &b)| (a as f64 - b as f64).powi(2))
        .sum();
    let sig: f64 = want.iter().map(|&b| (b as f64).powi(2)).sum();
    if got.len() != want.len() {
        return f64::NEG_INFINITY;
    }
    10.0 * (sig / err.max(f64::MIN_POSITIVE)).log10()
}

fn decode_model_cases(
    gpu: &Gpu,
    preset: &str,
    rope_scaling: Option<octet_nn::llama::RopeScaling>,
    steps: u32,
    out: &mut Vec<CaseResult>,
) -> Result<()> {
    use crate::decode::{GpuDecoder, GpuWeights};
    use octet_nn::decode::{DecodeModel, WeightStorage};
    use octet_nn::llama::{Llama, LlamaConfig};
    let shape = |e: octet_nn::Error| Error::Shape(e.to_string());
    let scaled = rope_scaling.is_some();
    let cfg = LlamaConfig {
        rope_scaling,
        ..LlamaConfig::preset(preset).map_err(shape)?
    };
    cfg.validate().map_err(shape)?;
    let preset = if scaled {
        format!("{preset} (llama3 RoPE scaling)")
    } else {
        preset.to_string()
    };
    let model = Llama::new_random(&cfg, octet_tensor::DType::F32, None, 17).map_err(shape)?;
    let w: std::collections::HashMap<String, octet_tensor::Tensor> = model
        .params()
        .into_iter()
        .map(|(n, t)| (n, t.clone()))
        .collect();
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
            name: format!("decode {preset} model, {label} weights, {steps} tokens vs CPU decoder"),
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
                "decode {preset} model, {label}: prefill {p1} + {} tokens, then steps, vs CPU decoder",
                p2 - p1
            ),
            pass: sqnr >= 30.0 && pgot.iter().all(|v| v.is_finite()),
            worst: format!("logits SQNR {sqnr:.1} dB"),
        });
        // Past the cache, and no tokens: errors, and the cache is kept.
        let full = pre.prefill(&vec![1; cfg.max_position_embeddings]);
        let empty = pre.prefill(&[]);
        out.push(CaseResult {
            name: format!("decode {preset} model, {label}: prefill past the cache or of nothing -> shape errors"),
            pass: matches!(full, Err(Error::Shape(_))) && matches!(empty, Err(Error::Shape(_))),
            worst: format!("{:?} / {:?}", full.err().map(|e| e.to_string()), empty.err().map(|e| e.to_string())),
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
            name: format!("decode {preset} model, {label}: CUDA graph replay == eager launches"),
            pass: same && e.len() == got.len(),
            worst: if same {
                "bit-identical".into()
            } else {
                "logits differ".into()
            },
        });
        generate_cases(gpu, &preset, label, (&cfg, &w, gw), &tokens, out)?;
    }
    sample_cases(gpu, &preset, &cfg, &w, out)
}

/// How far `u` is from the nearest running share at which the host's
/// `sample` changes its pick (infinite when greedy): a pick of the device
/// may differ from the host's only within the last bits of an exponential.
fn sample_margin(logits: &[f32], temperature: f32, top_k: usize, u: f64) -> f64 {
    let (_, shares) = octet_nn::decode::sample_shares(logits, temperature, top_k);
    shares.map_or(f64::INFINITY, |sh| {
        sh.iter()
            .map(|&acc| (u - acc).abs())
            .fold(f64::INFINITY, f64::min)
    })
}

/// The sampling settings the device sampler is checked under:
/// (temperature, top_k).
const SAMPLINGS: [(f32, usize); 6] = [
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
fn sample_cases(
    gpu: &Gpu,
    preset: &str,
    cfg: &octet_nn::llama::LlamaConfig,
    w: &std::collections::HashMap<String, octet_tensor::Tensor>,
    out: &mut Vec<CaseResult>,
) -> Result<()> {
    use crate::decode::{GpuDecoder, GpuWeights};
    use octet_nn::decode::sample;
    let mut dec = GpuDecoder::new(gpu, cfg, w, GpuWeights::Bf16)?;
    let v = cfg.vocab_size.min(crate::decode::SAMPLE_MAX);
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
fn generate_cases(
    gpu: &Gpu,
    preset: &str,
    label: &str,
    (cfg, w, gw): (
        &octet_nn::llama::LlamaConfig,
        &std::collections::HashMap<String, octet_tensor::Tensor>,
        crate::decode::GpuWeights,
    ),
    tokens: &[u32],
    out: &mut Vec<CaseResult>,
) -> Result<()> {
    use crate::decode::GpuDecoder;
    use octet_nn::decode::sample;
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
                "decode {preset} model, {label}: generate {n} tokens on the device (T {t}, top-k {k}) == host sampling of step logits"
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

/// Row-wise quantize bit-exact against the CPU's `rowwise` recipe (codes and
/// per-row scales of both copies), and the outer-vector FP8 GEMM against the
/// CPU's exact-product FP8 GEMM of the same codes.
fn rowwise_cases(gpu: &Gpu, out: &mut Vec<CaseResult>) -> Result<()> {
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
fn delayed_step(
    gpu: &Gpu,
    cpu: &mut octet_fp8::DelayedState,
    dev: &mut crate::delayed::DeviceDelayed,
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

fn delayed_cases(gpu: &Gpu, out: &mut Vec<CaseResult>) -> Result<()> {
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

/// 128x128 block quantize bit-exact against the CPU's `blk128x128` (both
/// copies), then block-scaled FP8 GEMMs from device-quantized operands
/// (1x128 activations x 128x128 weights, E5M2 1x128 gradients x 128x128
/// weights, 1x128 x 1x128 for the weight gradient) against the CPU's
/// exact-product FP8 GEMM of the CPU-quantized operands. The inputs' magnitudes
/// change from block to block, so a scale read from the wrong block is a large error.
fn block_gemm_cases(gpu: &Gpu, out: &mut Vec<CaseResult>) -> Result<()> {
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
fn fast_accum_cases(gpu: &Gpu, out: &mut Vec<CaseResult>) -> Result<()> {
    use crate::linear::GpuLinear;
    use octet_fp8::Recipe;
    use octet_nn::Linear;
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

/// The GPU `Linear` against the CPU reference `octet_nn::Linear` on the same
/// bf16 input, weight and output gradient, for the bf16 layer and every GPU
/// recipe with the quantized and the high-precision backward. The FP8 codes
/// are the same on both sides (bit-exact quantizers), so the differences are
/// the accumulation order and the bf16 rounding of `y` (and of the CPU's `dx`).
fn linear_cases(gpu: &Gpu, out: &mut Vec<CaseResult>) -> Result<()> {
    use crate::linear::GpuLinear;
    use octet_fp8::{BackwardMode, Recipe};
    use octet_nn::Linear;
    use octet_tensor::Tensor;
    let (m, k, n) = (256usize, 512usize, 512usize);
    let xb = random_bf16(m * k, 1201, 2.0);
    let wb = random_bf16(n * k, 1202, 0.05);
    let gb = random_bf16(m * n, 1203, 1e-3);
    let shape = |e: octet_tensor::Error| Error::Shape(e.to_string());
    let nn = |e: octet_nn::Error| Error::Shape(e.to_string());
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
        if skip_without_fp8_gemm(gpu, crate::recipe_uses_fp8_gemm(rname), what, out) {
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
            &mut crate::AddTo(acc.slice_mut(..)),
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
        crate::recipe_uses_fp8_gemm("nvfp4"),
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

/// MXFP8 quantize bit-exact against the CPU's `mxfp8` recipe: codes and E8M0
/// scale codes of both copies.
fn mx_cases(gpu: &Gpu, out: &mut Vec<CaseResult>) -> Result<()> {
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
fn nvfp4_cases(gpu: &Gpu, out: &mut Vec<CaseResult>) -> Result<()> {
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

/// f64 causal grouped-query attention and its backward, the output gradient's
/// `delta` taken from `out_used` (the output the backward sees, as the GPU
/// backward takes its own bf16 output): `(out, dq, dk, dv)`.
#[allow(clippy::type_complexity)]
fn attention_ref(
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

/// How many tensors of two lists (in the same order) differ in any bit.
pub(crate) fn differing(
    a: &[(String, octet_tensor::Tensor)],
    b: &[(String, octet_tensor::Tensor)],
) -> usize {
    let bits = |t: &octet_tensor::Tensor| -> Vec<u32> {
        t.to_f32_vec().iter().map(|v| v.to_bits()).collect()
    };
    a.iter()
        .zip(b)
        .filter(|((_, x), (_, y))| bits(x) != bits(y))
        .count()
}

pub(crate) fn rel_frobenius_f64(got: &[f32], want: &[f64]) -> f64 {
    let num: f64 = got
        .iter()
        .zip(want)
        .map(|(&a, &b)| (a as f64 - b) * (a as f64 - b))
        .sum();
    let den: f64 = want.iter().map(|b| b * b).sum();
    if got.len() != want.len() || got.iter().any(|v| !v.is_finite()) {
        return f64::INFINITY;
    }
    (num / den.max(1e-300)).sqrt()
}

/// The training model on the GPU against the CPU reference: the attention
/// kernels against f64 attention (several head dims, sequences off the
/// 64-tile, grouped heads), the whole model's loss and gradients against the
/// CPU `Llama` in f64 (bf16 model) and against the CPU's own FP8 error (FP8
/// recipes), and one AdamW step against the formula on the host.
pub fn model_cases(gpu: &Gpu, out: &mut Vec<CaseResult>) -> Result<()> {
    use crate::model::{AdamParams, GpuLlama};
    use octet_nn::llama::Llama;
    use octet_tensor::{DType, Tensor};
    use std::collections::HashMap;
    let nn = |e: octet_nn::Error| Error::Shape(e.to_string());
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
    let grad_scale = 1.0 / (b * t) as f32;
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
fn saved_fp8_cases(
    gpu: &Gpu,
    cfg: &octet_nn::llama::LlamaConfig,
    w: &std::collections::HashMap<String, octet_tensor::Tensor>,
    (toks, tgts, b, t): (&[u32], &[u32], usize, usize),
    recipe: Option<octet_fp8::Recipe>,
    out: &mut Vec<CaseResult>,
    grad_err: impl Fn(&[(String, octet_tensor::Tensor)]) -> f64,
) -> Result<()> {
    use crate::model::{GpuLlama, SavedActivations};
    type Grads = Vec<(String, octet_tensor::Tensor)>;
    let mut recipes = vec![recipe];
    if let Some(r) = recipe {
        recipes.push(Some(r.with_backward(octet_fp8::BackwardMode::Dequantized)?));
    }
    let grad_scale = 1.0 / (b * t) as f32;
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

/// Numerics telemetry of `GpuLinear` against the CPU `Linear` on the same
/// data: amax, saturated and underflowed counts equal (shares compared
/// exactly), for every recipe. Wide-range inputs (underflow in every recipe;
/// saturation where NVFP4's E4M3-rounded block scales let a value past 6; the
/// amax-derived scales of the other block recipes, MXFP8's included, cannot
/// overflow), and
/// for delayed scaling a third step whose magnitude jumps past the history
/// (saturation of input and gradient). The case fails if no recipe's counts
/// were non-zero, so that it cannot pass on empty counters.
fn telemetry_cases(gpu: &Gpu, out: &mut Vec<CaseResult>) -> Result<()> {
    use crate::linear::GpuLinear;
    use octet_fp8::{Recipe, Role};
    use octet_nn::Linear;
    use octet_tensor::Tensor;
    let (m, k, n) = (128usize, 512usize, 512usize);
    let shape = |e: octet_tensor::Error| Error::Shape(e.to_string());
    let nn = |e: octet_nn::Error| Error::Shape(e.to_string());
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
            crate::recipe_uses_fp8_gemm(name),
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
fn recompute_cases(gpu: &Gpu, out: &mut Vec<CaseResult>) -> Result<()> {
    use crate::model::{GpuLlama, SavedActivations};
    use octet_fp8::{BackwardMode, Recipe};
    use octet_nn::llama::LoraSpec;
    use octet_nn::lora::{BaseFormat, Compute};
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
                let (loss, kept) =
                    model.forward(&toks, &tgts, (b, t), 1.0 / (b * t) as f32, true)?;
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
const TEST_ADAM: crate::model::AdamParams = crate::model::AdamParams {
    lr: 3e-3,
    beta1: 0.9,
    beta2: 0.95,
    eps: 1e-8,
    weight_decay: 0.1,
    grad_clip: 1.0,
};

/// The f32 weights of a random Llama of `cfg` (seed `seed`), by name.
pub(crate) fn test_weights(
    cfg: &octet_nn::llama::LlamaConfig,
    seed: u64,
) -> Result<std::collections::HashMap<String, octet_tensor::Tensor>> {
    Ok(
        octet_nn::llama::Llama::new_random(cfg, octet_tensor::DType::F32, None, seed)
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
) -> octet_nn::llama::LlamaConfig {
    octet_nn::llama::LlamaConfig {
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

/// Sharded data parallel on one rank (an NCCL communicator of one): three
/// AdamW steps of the sharded model equal those of the plain model bit for
/// bit (losses, masters), in bf16 (bf16 gathers), in tensorwise with the
/// quantized backward (FP8 gathers with the all-reduced amax), in delayed
/// (FP8 gathers with the scale from the history) and in blockwise (FP8
/// gathers of 128x128-block codes and scale grids). With one rank
/// every collective is a copy, so any difference is a bug in the sharded
/// bookkeeping (offsets, padding, the gathered FP8 bytes and scale, the
/// locally transposed column-wise copy), with and without resharding after
/// forward (the weights gathered again for backward must be the same bytes),
/// and with the forward of every block, or of the first only, recomputed in
/// backward (the weights gathered again for it), with an evaluation forward
/// after each step. The collectives run on the
/// communicator's own stream, ordered with the compute stream by events, so
/// these cases also check that ordering (a missing wait reads stale or
/// half-written weights or gradients). Several ranks: `bench/multi-gpu.sh`.
pub fn sharded_cases(gpu: &Gpu, out: &mut Vec<CaseResult>) -> Result<()> {
    use crate::model::GpuLlama;
    use crate::nccl::NcclComm;
    let (b, t) = (4, 64);
    let (toks, tgts) = (test_tokens(2201, b * t), test_tokens(2202, b * t));
    let p = TEST_ADAM;
    let comm = NcclComm::new(gpu, 0, 1, &NcclComm::unique_id()?)?;
    for recipe_name in ["bf16", "tensorwise", "delayed", "blockwise"] {
        let recipe = match recipe_name {
            "bf16" => None,
            r => Some(octet_fp8::Recipe::from_name(r)?),
        };
        // 128x128 weight blocks: widths multiples of 128, shards of whole blocks.
        let cfg = match recipe_name {
            "blockwise" => test_config(512, 1024, 2, 4, 4, 64),
            _ => test_config(256, 512, 2, 4, 2, 64),
        };
        let w = test_weights(&cfg, 77)?;
        let run = |model: &mut GpuLlama<'_>| -> Result<Vec<f64>> {
            let mut losses = Vec::new();
            for _ in 0..3 {
                model.zero_grad()?;
                let (loss, saved) =
                    model.forward(&toks, &tgts, (b, t), 1.0 / (b * t) as f32, true)?;
                model.backward(saved.ok_or_else(|| Error::Shape("nothing kept".into()))?)?;
                model.adamw_step(p)?;
                losses.push(loss);
                // An evaluation forward (nothing kept, no backward) between
                // steps: the sharded model gathers and frees the weights itself.
                losses.push(model.forward(&toks, &tgts, (b, t), 1.0, false)?.0);
            }
            Ok(losses)
        };
        let mut plain = GpuLlama::new(gpu, &cfg, &w, recipe)?;
        let want = run(&mut plain)?;
        let want_w = plain.weights()?;
        drop(plain);
        // Recomputing every block (usize::MAX) or the first of the two only.
        for (reshard, recompute) in [
            (false, 0),
            (true, 0),
            (false, usize::MAX),
            (true, usize::MAX),
            (false, 1),
            (true, 1),
        ] {
            let mut sharded = GpuLlama::new_sharded(gpu, &cfg, &w, recipe, &comm)?;
            sharded.set_reshard_after_forward(reshard)?;
            sharded.set_recompute(recompute);
            let fp8 = sharded.fp8_gather();
            let got = run(&mut sharded)?;
            let got_w = sharded.weights()?;
            let same_w = want_w
                .iter()
                .zip(&got_w)
                .all(|((_, a), (_, b))| f32_bits_equal(&a.to_f32_vec(), &b.to_f32_vec()));
            let same_l = want
                .iter()
                .zip(&got)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            let gathered = sharded.comm_stats().all_gather_bytes;
            out.push(CaseResult {
            name: format!(
                "sharded model, 1 rank, {recipe_name} ({} gathers{}): 3 AdamW steps and evaluations equal the plain model's",
                if fp8 { "FP8" } else { "bf16" },
                match (reshard, recompute) {
                    (true, 0) => ", resharded after forward",
                    (true, 1) => ", resharded after forward, recomputing the first block in backward",
                    (true, _) => ", resharded after forward, recomputing each block in backward",
                    (false, 0) => "",
                    (false, 1) => ", recomputing the first block in backward",
                    (false, _) => ", recomputing each block in backward",
                }
            ),
            pass: same_w && same_l && (recipe.is_none() || fp8) && gathered > 0,
            worst: format!(
                "losses {:?} vs {:?}; masters equal: {same_w}; {gathered} bytes gathered",
                got, want
            ),
        });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unsupported_errors_start_with_the_prefix_the_selftest_skips() {
        assert!(Error::Unsupported("FP8 GEMM".into())
            .to_string()
            .starts_with(UNSUPPORTED));
    }
}

//! Conformance (GPU against the CPU reference) and benchmarks.

use crate::{Gpu, Result};
use cudarc::driver::{sys::CUevent_flags, CudaSlice};
use half::bf16;
use octet_fp8::{
    Format, Granularity, Layout, QuantData, QuantSpec, Rounding, ScaleRule, Scales, Usage,
};

/// One conformance case.
#[derive(Clone, Debug)]
pub struct CaseResult {
    /// What was checked.
    pub name: String,
    /// Whether it passed.
    pub pass: bool,
    /// The worst error seen (bytes differing, or relative error), as text.
    pub worst: String,
}

/// One benchmark figure.
#[derive(Clone, Debug)]
pub struct BenchRow {
    /// Operation and shape.
    pub name: String,
    /// Median milliseconds.
    pub ms: f64,
    /// Throughput with its unit (`TFLOP/s` or `GB/s`).
    pub rate: f64,
    /// Unit of `rate`.
    pub unit: &'static str,
    /// Ratio to the floor or baseline named in `vs`.
    pub ratio: f64,
    /// What `ratio` compares against.
    pub vs: String,
}

/// Uniform values in [-scale, scale) from a counter hash (fast, reproducible, never all zero).
pub fn random_bf16(n: usize, seed: u64, scale: f32) -> Vec<bf16> {
    (0..n)
        .map(|i| {
            let u = octet_fp8::format::sr_bits(seed, i as u64) as f32 / 4_294_967_296.0;
            bf16::from_f32((2.0 * u - 1.0) * scale)
        })
        .collect()
}

fn bf16_bits(v: &[bf16]) -> Vec<u16> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn tensorwise(format: Format) -> QuantSpec {
    QuantSpec {
        format,
        granularity: Granularity::Tensor,
        rule: ScaleRule::Amax {
            power_of_two: false,
        },
        rounding: Rounding::NearestEven,
    }
}

fn rel_frobenius(got: &[f32], want: &[f32]) -> f64 {
    let (mut e, mut s) = (0f64, 0f64);
    for (&g, &w) in got.iter().zip(want) {
        e += ((g - w) as f64).powi(2);
        s += (w as f64).powi(2);
    }
    if got.iter().any(|v| !v.is_finite()) {
        return f64::INFINITY;
    }
    (e / s).sqrt()
}

/// Host copy of a device quantized tensor's row-wise copy as a CPU [`QuantData`].
fn to_host(gpu: &Gpu, q: &crate::DeviceFp8, layout: Layout) -> Result<QuantData> {
    let s = &gpu.stream;
    let (rows, cols, data) = match layout {
        Layout::Rowwise => (q.rows, q.cols, s.clone_dtoh(&q.rowwise)?),
        Layout::Colwise => (q.cols, q.rows, s.clone_dtoh(&q.colwise)?),
    };
    let si = s.clone_dtoh(&q.scale_inv)?;
    Ok(QuantData {
        rows,
        cols,
        format: q.format,
        data,
        block: (rows, cols),
        scales: Scales::F32(si),
        saturated: 0,
        underflowed: 0,
    })
}

/// The conformance suite: quantize bit-exact against the CPU, FP8 and bf16 GEMMs within tolerance.
pub fn selftest(gpu: &mut Gpu) -> Result<Vec<CaseResult>> {
    let mut out = Vec::new();
    // Quantize: ragged shapes too; outputs poisoned (0x7F = NaN in E4M3) before each run.
    for (i, &(rows, cols)) in [
        (256, 512),
        (217, 300),
        (64, 64),
        (1, 16),
        (1000, 8),
        (333, 1000),
    ]
    .iter()
    .enumerate()
    {
        for format in [Format::E4M3, Format::E5M2] {
            let x = random_bf16(rows * cols, 100 + i as u64, 3.0);
            let spec = tensorwise(format);
            let want = octet_fp8::quantize(&x, rows, cols, &spec, &spec, Usage::BOTH, None)?;
            let dx = gpu.stream.clone_htod(&bf16_bits(&x))?;
            let got = gpu.quantize_tensorwise_poisoned(&dx, rows, cols, format, 0x7F)?;
            let (gr, gc) = (
                to_host(gpu, &got, Layout::Rowwise)?,
                to_host(gpu, &got, Layout::Colwise)?,
            );
            let (wr, wc) = (want.get(Layout::Rowwise)?, want.get(Layout::Colwise)?);
            let bad_r = gr.data.iter().zip(&wr.data).filter(|(a, b)| a != b).count();
            let bad_c = gc.data.iter().zip(&wc.data).filter(|(a, b)| a != b).count();
            let scale_ok = gr.scales == wr.scales;
            out.push(CaseResult {
                name: format!("quantize tensorwise bf16->{format} {rows}x{cols} (row+col)"),
                pass: bad_r == 0 && bad_c == 0 && scale_ok,
                worst: format!(
                    "{bad_r}+{bad_c} bytes differ, scale_inv {}",
                    if scale_ok { "equal" } else { "differs" }
                ),
            });
        }
    }
    // GEMMs: the output is bf16, so each element carries a rounding of 2^-9
    // relative; the relative Frobenius error of correct results sits near
    // 2^-9 / sqrt(3) = 1.1e-3. Tolerance 4e-3.
    for &(m, k, n, fa, fb) in &[
        (256, 512, 384, Format::E4M3, Format::E4M3),
        (1024, 1024, 1024, Format::E4M3, Format::E4M3),
        (512, 256, 128, Format::E5M2, Format::E4M3),
    ] {
        let (a, b) = (random_bf16(m * k, 7, 2.0), random_bf16(n * k, 8, 0.5));
        let (da, db) = (
            gpu.stream.clone_htod(&bf16_bits(&a))?,
            gpu.stream.clone_htod(&bf16_bits(&b))?,
        );
        let qa = gpu.quantize_tensorwise(&da, m, k, fa, true)?;
        let qb = gpu.quantize_tensorwise(&db, n, k, fb, true)?;
        let mut d = gpu.stream.clone_htod(&vec![0xFFFFu16; m * n])?; // poison: bf16 NaN
        gpu.blas.gemm_fp8(
            &qa.rowwise,
            fa,
            &qa.scale_inv,
            &qb.rowwise,
            fb,
            &qb.scale_inv,
            &mut d,
            (m, n, k),
            false,
        )?;
        let got: Vec<f32> = gpu
            .stream
            .clone_dtoh(&d)?
            .iter()
            .map(|&v| bf16::from_bits(v).to_f32())
            .collect();
        let want = octet_tensor::cpu::fp8_gemm(
            &to_host(gpu, &qa, Layout::Rowwise)?,
            &to_host(gpu, &qb, Layout::Rowwise)?,
        )?;
        let e = rel_frobenius(&got, &want);
        out.push(CaseResult {
            name: format!("gemm fp8 {fa}x{fb} {m}x{k}x{n} vs CPU emulation"),
            pass: e < 4e-3,
            worst: format!("rel err {e:.2e}"),
        });
        let mut d = gpu.stream.clone_htod(&vec![0xFFFFu16; m * n])?;
        gpu.blas.gemm_bf16(&da, &db, &mut d, m, n, k)?;
        let got: Vec<f32> = gpu
            .stream
            .clone_dtoh(&d)?
            .iter()
            .map(|&v| bf16::from_bits(v).to_f32())
            .collect();
        let af: Vec<f32> = a.iter().map(|v| v.to_f32()).collect();
        let bf: Vec<f32> = b.iter().map(|v| v.to_f32()).collect();
        let want = octet_tensor::cpu::sgemm(m, n, k, &af, false, &bf, true);
        let e = rel_frobenius(&got, &want);
        out.push(CaseResult {
            name: format!("gemm bf16 {m}x{k}x{n} vs CPU f32"),
            pass: e < 4e-3,
            worst: format!("rel err {e:.2e}"),
        });
    }
    // The high-precision backward GEMMs with transposed operands, against the CPU.
    let (m, k, n) = (192, 320, 256);
    let (dy, w, x) = (
        random_bf16(m * n, 21, 1.0),
        random_bf16(n * k, 22, 1.0),
        random_bf16(m * k, 23, 1.0),
    );
    let f = |v: &[bf16]| v.iter().map(|e| e.to_f32()).collect::<Vec<f32>>();
    let (ddy, dw_, dx_) = (
        gpu.stream.clone_htod(&bf16_bits(&dy))?,
        gpu.stream.clone_htod(&bf16_bits(&w))?,
        gpu.stream.clone_htod(&bf16_bits(&x))?,
    );
    let mut d = gpu.stream.clone_htod(&vec![0xFFFFu16; m * k])?;
    gpu.blas
        .gemm_bf16_op(&ddy, false, &dw_, false, &mut d, (m, k, n))?;
    let got: Vec<f32> = gpu
        .stream
        .clone_dtoh(&d)?
        .iter()
        .map(|&v| bf16::from_bits(v).to_f32())
        .collect();
    let e = rel_frobenius(
        &got,
        &octet_tensor::cpu::sgemm(m, k, n, &f(&dy), false, &f(&w), false),
    );
    out.push(CaseResult {
        name: format!("gemm bf16 NN (grad_input) {m}x{n}x{k}"),
        pass: e < 4e-3,
        worst: format!("rel err {e:.2e}"),
    });
    let mut d = gpu.stream.clone_htod(&vec![0xFFFFu16; n * k])?;
    gpu.blas
        .gemm_bf16_op(&ddy, true, &dx_, false, &mut d, (n, k, m))?;
    let got: Vec<f32> = gpu
        .stream
        .clone_dtoh(&d)?
        .iter()
        .map(|&v| bf16::from_bits(v).to_f32())
        .collect();
    let e = rel_frobenius(
        &got,
        &octet_tensor::cpu::sgemm(n, k, m, &f(&dy), true, &f(&x), false),
    );
    out.push(CaseResult {
        name: format!("gemm bf16 TN-transposed (grad_weight) {n}x{m}x{k}"),
        pass: e < 4e-3,
        worst: format!("rel err {e:.2e}"),
    });
    Ok(out)
}

/// Median milliseconds of `reps` runs of `f` on the GPU stream, timed with events after `warm` runs.
fn time_ms(
    gpu: &mut Gpu,
    warm: usize,
    reps: usize,
    mut f: impl FnMut(&mut Gpu) -> Result<()>,
) -> Result<f64> {
    for _ in 0..warm {
        f(gpu)?;
    }
    let mut t = Vec::with_capacity(reps);
    for _ in 0..reps {
        let start = gpu.ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        let end = gpu.ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        start.record(&gpu.stream)?;
        f(gpu)?;
        end.record(&gpu.stream)?;
        end.synchronize()?;
        t.push(start.elapsed_ms(&end)? as f64);
    }
    t.sort_by(f64::total_cmp);
    Ok(t[t.len() / 2])
}

/// Copy bandwidth, quantize throughput and GEMM rates, side by side in one run.
pub fn bench(gpu: &mut Gpu, gemm_shapes: &[(usize, usize, usize)]) -> Result<Vec<BenchRow>> {
    let mut rows = Vec::new();
    // Device-to-device copy of 256 MiB: the memory-bound floor.
    let (qr, qc) = (16384usize, 8192usize);
    let n = qr * qc;
    let src: CudaSlice<u16> = gpu.stream.clone_htod(&bf16_bits(&random_bf16(n, 1, 4.0)))?;
    let mut dst: CudaSlice<u16> = gpu.stream.alloc_zeros(n)?;
    let copy_ms = time_ms(gpu, 3, 20, |g| Ok(g.stream.memcpy_dtod(&src, &mut dst)?))?;
    let copy_gbs = (4 * n) as f64 / copy_ms / 1e6;
    rows.push(BenchRow {
        name: format!("copy d2d bf16 {qr}x{qc} (read+write)"),
        ms: copy_ms,
        rate: copy_gbs,
        unit: "GB/s",
        ratio: 1.0,
        vs: "copy".into(),
    });
    let mut qbuf = gpu.alloc_fp8(qr, qc, Format::E4M3)?;
    let q_ms = time_ms(gpu, 3, 20, |g| {
        g.quantize_tensorwise_into(&src, &mut qbuf, false)
    })?;
    drop(qbuf);
    let min_gbs = (4 * n) as f64 / q_ms / 1e6;
    let moved_gbs = (6 * n) as f64 / q_ms / 1e6;
    rows.push(BenchRow {
        name: format!(
            "quantize tensorwise bf16->e4m3 row+col {qr}x{qc}, on minimum bytes (4 B/elem)"
        ),
        ms: q_ms,
        rate: min_gbs,
        unit: "GB/s",
        ratio: min_gbs / copy_gbs,
        vs: "copy".into(),
    });
    rows.push(BenchRow {
        name: "same, on bytes moved (6 B/elem: amax read + cast read + 2 writes)".into(),
        ms: q_ms,
        rate: moved_gbs,
        unit: "GB/s",
        ratio: moved_gbs / copy_gbs,
        vs: "copy".into(),
    });
    // The two phases apart: amax (2 B/elem read) and cast + transpose (2 B read + 2 B written).
    let mut amax_bits = gpu.stream.alloc_zeros::<u32>(1)?;
    let mut flag = gpu.stream.alloc_zeros::<u32>(1)?;
    let a_ms = time_ms(gpu, 3, 20, |g| {
        g.launch_amax(&src, &mut amax_bits, &mut flag)
    })?;
    let a_gbs = (2 * n) as f64 / a_ms / 1e6;
    rows.push(BenchRow {
        name: "  phase 1: amax (2 B/elem)".into(),
        ms: a_ms,
        rate: a_gbs,
        unit: "GB/s",
        ratio: a_gbs / copy_gbs,
        vs: "copy".into(),
    });
    let mut qrow: CudaSlice<u8> = gpu.stream.alloc_zeros(n)?;
    let mut qcol: CudaSlice<u8> = gpu.stream.alloc_zeros(n)?;
    let mut si: CudaSlice<f32> = gpu.stream.alloc_zeros(1)?;
    let c_ms = time_ms(gpu, 3, 20, |g| {
        g.cast_only(&src, qr, qc, &amax_bits, &mut qrow, &mut qcol, &mut si)
    })?;
    let c_gbs = (4 * n) as f64 / c_ms / 1e6;
    rows.push(BenchRow {
        name: "  phase 2: cast + transpose (4 B/elem)".into(),
        ms: c_ms,
        rate: c_gbs,
        unit: "GB/s",
        ratio: c_gbs / copy_gbs,
        vs: "copy".into(),
    });
    drop((src, dst, qrow, qcol));
    for &(m, k, n) in gemm_shapes {
        let flops = 2.0 * (m * k * n) as f64;
        let (a, b) = (random_bf16(m * k, 2, 1.0), random_bf16(n * k, 3, 1.0));
        let (da, db) = (
            gpu.stream.clone_htod(&bf16_bits(&a))?,
            gpu.stream.clone_htod(&bf16_bits(&b))?,
        );
        drop((a, b));
        let mut d: CudaSlice<u16> = gpu.stream.alloc_zeros(m * n)?;
        let bf = time_ms(gpu, 3, 10, |g| g.blas.gemm_bf16(&da, &db, &mut d, m, n, k))?;
        let bf_t = flops / bf / 1e9;
        rows.push(BenchRow {
            name: format!("gemm bf16 {m}x{k}x{n}"),
            ms: bf,
            rate: bf_t,
            unit: "TFLOP/s",
            ratio: 1.0,
            vs: "bf16".into(),
        });
        let qa = gpu.quantize_tensorwise(&da, m, k, Format::E4M3, true)?;
        let qb = gpu.quantize_tensorwise(&db, n, k, Format::E4M3, true)?;
        drop((da, db));
        for fast in [false, true] {
            let ms = time_ms(gpu, 3, 10, |g| {
                g.blas.gemm_fp8(
                    &qa.rowwise,
                    Format::E4M3,
                    &qa.scale_inv,
                    &qb.rowwise,
                    Format::E4M3,
                    &qb.scale_inv,
                    &mut d,
                    (m, n, k),
                    fast,
                )
            })?;
            let t = flops / ms / 1e9;
            rows.push(BenchRow {
                name: format!(
                    "gemm fp8 e4m3 tensorwise{} {m}x{k}x{n}",
                    if fast { " fast-accum" } else { "" }
                ),
                ms,
                rate: t,
                unit: "TFLOP/s",
                ratio: t / bf_t,
                vs: "bf16".into(),
            });
        }
    }
    Ok(rows)
}

/// `Linear` forward + backward on the GPU, bf16 against FP8 tensorwise with the
/// quantized backward, in one run: bf16 is three cuBLASLt GEMMs (`output`,
/// `grad_input`, `grad_weight`); FP8 is three quantizes (input and weight
/// E4M3, grad_output E5M2, each row-wise + column-wise) and three FP8 GEMMs
/// on K-major operands (fast accumulation for `output` and `grad_input`,
/// not for `grad_weight`).
pub fn bench_linear(gpu: &mut Gpu, shapes: &[(usize, usize, usize)]) -> Result<Vec<BenchRow>> {
    let mut rows = Vec::new();
    for &(m, k, n) in shapes {
        let s = gpu.stream.clone();
        let x = s.clone_htod(&bf16_bits(&random_bf16(m * k, 11, 2.0)))?; // (M, K)
        let w = s.clone_htod(&bf16_bits(&random_bf16(n * k, 12, 0.05)))?; // (N, K)
        let dy = s.clone_htod(&bf16_bits(&random_bf16(m * n, 13, 0.01)))?; // (M, N)
        let mut y: CudaSlice<u16> = s.alloc_zeros(m * n)?;
        let mut dx: CudaSlice<u16> = s.alloc_zeros(m * k)?;
        let mut dw: CudaSlice<u16> = s.alloc_zeros(n * k)?;
        let flops = 6.0 * (m * k * n) as f64;
        let bf = time_ms(gpu, 3, 10, |g| {
            g.blas.gemm_bf16(&x, &w, &mut y, m, n, k)?; // output = input @ weight_t
            g.blas
                .gemm_bf16_op(&dy, false, &w, false, &mut dx, (m, k, n))?; // grad_input = grad_output @ weight
            g.blas
                .gemm_bf16_op(&dy, true, &x, false, &mut dw, (n, k, m)) // grad_weight = grad_output_t @ input
        })?;
        let shape = format!("{m}x{k}x{n}");
        rows.push(BenchRow {
            name: format!("linear fwd+bwd bf16 {shape}"),
            ms: bf,
            rate: flops / bf / 1e9,
            unit: "TFLOP/s",
            ratio: 1.0,
            vs: "bf16".into(),
        });
        let mut qx = gpu.alloc_fp8(m, k, Format::E4M3)?;
        let mut qw = gpu.alloc_fp8(n, k, Format::E4M3)?;
        let mut qdy = gpu.alloc_fp8(m, n, Format::E5M2)?;
        for (label, fast) in [("fast-accum fwd/dgrad", true), ("no fast-accum", false)] {
            let ms = time_ms(gpu, 3, 10, |g| {
                g.quantize_tensorwise_into(&x, &mut qx, false)?;
                g.quantize_tensorwise_into(&w, &mut qw, false)?;
                let (e4, e5) = (Format::E4M3, Format::E5M2);
                g.blas.gemm_fp8(
                    &qx.rowwise,
                    e4,
                    &qx.scale_inv,
                    &qw.rowwise,
                    e4,
                    &qw.scale_inv,
                    &mut y,
                    (m, n, k),
                    fast,
                )?;
                g.quantize_tensorwise_into(&dy, &mut qdy, false)?;
                g.blas.gemm_fp8(
                    &qdy.rowwise,
                    e5,
                    &qdy.scale_inv,
                    &qw.colwise,
                    e4,
                    &qw.scale_inv,
                    &mut dx,
                    (m, k, n),
                    fast,
                )?;
                g.blas.gemm_fp8(
                    &qdy.colwise,
                    e5,
                    &qdy.scale_inv,
                    &qx.colwise,
                    e4,
                    &qx.scale_inv,
                    &mut dw,
                    (n, k, m),
                    false,
                )
            })?;
            rows.push(BenchRow {
                name: format!("linear fwd+bwd fp8 tensorwise quantized ({label}) {shape}"),
                ms,
                rate: flops / ms / 1e9,
                unit: "TFLOP/s",
                ratio: bf / ms,
                vs: "bf16".into(),
            });
        }
    }
    Ok(rows)
}

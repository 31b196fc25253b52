//! Benchmarks, each next to its floor measured in the same run: memory-bound
//! kernels against a device-to-device copy, FP8 GEMMs against bf16 GEMMs of
//! the same shape. Times are medians of CUDA-event timings after warm-up.

use crate::testdata::{bf16_bits, random_bf16, random_f32};
use crate::{Error, Gpu, Result};
use cudarc::driver::{sys::CUevent_flags, CudaSlice};
use octet_fp8::Format;

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

/// Median milliseconds of `reps` runs of `f` on the GPU stream, timed with events after `warm` runs.
pub fn time_ms(
    gpu: &Gpu,
    warm: usize,
    reps: usize,
    mut f: impl FnMut(&Gpu) -> Result<()>,
) -> Result<f64> {
    let t = time_round_robin(gpu, warm, reps, &mut [&mut f])?;
    t.first()
        .copied()
        .ok_or_else(|| Error::Shape("no timing".into()))
}

/// Work enqueued on the GPU's stream, one contender of [`time_round_robin`].
pub type Enqueue<'a> = &'a mut dyn FnMut(&Gpu) -> Result<()>;

/// Median milliseconds of each of `fs`, timed in turn within every
/// repetition (round robin), so that a drift of the clocks over the run (an
/// H100 slows down as it heats under a long run of matrix products) touches
/// every contender alike and their ratios stay fair.
pub fn time_round_robin(
    gpu: &Gpu,
    warm: usize,
    reps: usize,
    fs: &mut [Enqueue<'_>],
) -> Result<Vec<f64>> {
    for f in fs.iter_mut() {
        for _ in 0..warm {
            f(gpu)?;
        }
    }
    let mut t: Vec<Vec<f64>> = fs.iter().map(|_| Vec::with_capacity(reps)).collect();
    for _ in 0..reps.max(1) {
        for (f, t) in fs.iter_mut().zip(t.iter_mut()) {
            let start = gpu.ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
            let end = gpu.ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
            start.record(&gpu.stream)?;
            f(gpu)?;
            end.record(&gpu.stream)?;
            end.synchronize()?;
            t.push(start.elapsed_ms(&end)? as f64);
        }
    }
    Ok(t.into_iter()
        .map(|mut t| {
            t.sort_by(f64::total_cmp);
            t[t.len() / 2]
        })
        .collect())
}

/// Median milliseconds of one replay of a CUDA graph holding what `f`
/// enqueues (captured once, after `f` ran eagerly once to load kernels and
/// plans): the device's time for that work without the host's launch cost
/// between kernels, as `octet generate` replays each decoding step.
pub fn time_graph_ms(
    gpu: &Gpu,
    warm: usize,
    reps: usize,
    mut f: impl FnMut(&Gpu) -> Result<()>,
) -> Result<f64> {
    use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
    f(gpu)?;
    gpu.stream
        .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
    let r = f(gpu);
    let graph = gpu.stream.end_capture(CUgraphInstantiate_flags(0))?;
    r?;
    let graph = graph.ok_or_else(|| Error::Shape("the captured graph is empty".into()))?;
    time_ms(gpu, warm, reps, |_| Ok(graph.launch()?))
}

fn gbs(bytes: usize, ms: f64) -> f64 {
    bytes as f64 / ms / 1e6
}

fn mem_row(name: String, ms: f64, bytes: usize, copy_gbs: f64) -> BenchRow {
    let rate = gbs(bytes, ms);
    BenchRow {
        name,
        ms,
        rate,
        unit: "GB/s",
        ratio: rate / copy_gbs,
        vs: "copy".into(),
    }
}

/// Copy bandwidth, quantize throughput (16384x8192) and GEMM rates for
/// `gemm_shapes` `(m, k, n)`, side by side in one run.
pub fn bench(gpu: &Gpu, gemm_shapes: &[(usize, usize, usize)]) -> Result<Vec<BenchRow>> {
    let mut rows = bench_quantize(gpu, 16384, 8192)?;
    rows.extend(bench_gemm(gpu, gemm_shapes)?);
    Ok(rows)
}

/// The memory-bound kernels on a `(r, c)` matrix against a device-to-device copy of its bf16 bytes.
pub fn bench_quantize(gpu: &Gpu, r: usize, c: usize) -> Result<Vec<BenchRow>> {
    let mut rows = Vec::new();
    let n = r * c;
    let src: CudaSlice<u16> = gpu.upload(&bf16_bits(&random_bf16(n, 1, 4.0)))?;
    let mut dst: CudaSlice<u16> = gpu.alloc_zeros(n, "copy destination")?;
    let copy_ms = time_ms(gpu, 5, 30, |g| Ok(g.stream.memcpy_dtod(&src, &mut dst)?))?;
    let copy_gbs = gbs(4 * n, copy_ms);
    rows.push(BenchRow {
        name: format!("copy d2d bf16 {r}x{c} (bytes read + written)"),
        ms: copy_ms,
        rate: copy_gbs,
        unit: "GB/s",
        ratio: 1.0,
        vs: "copy".into(),
    });
    drop(dst);
    // The byte transpose of FP8 codes (column-wise copies made locally).
    let codes: CudaSlice<u8> = gpu.upload(&vec![0x3cu8; n])?;
    let t_ms = time_ms(gpu, 5, 30, |g| g.transpose_u8(&codes, r, c).map(drop))?;
    rows.push(mem_row(
        format!("transpose_u8 {r}x{c} FP8 codes: on 2 B/elem (one read + one write)"),
        t_ms,
        2 * n,
        copy_gbs,
    ));
    drop(codes);
    // Per-tensor current scaling: amax pass + cast/transpose pass.
    let mut q = gpu.alloc_fp8(r, c, Format::E4M3)?;
    for reverse in [false, true] {
        let ms = time_ms(gpu, 5, 30, |g| {
            g.memset_quantize_state(&mut q)?;
            g.launch_amax(&src, &mut q.amax_bits, &mut q.nonfinite)?;
            g.launch_cast(
                &src,
                (r, c),
                Format::E4M3,
                &q.amax_bits,
                &mut q.rowwise,
                &mut q.colwise,
                &mut q.scale_inv,
                reverse,
            )
        })?;
        let order = if reverse {
            "reverse tile order"
        } else {
            "forward tile order"
        };
        rows.push(mem_row(
            format!("quantize tensorwise bf16->e4m3 row+col {r}x{c}, {order}: on 6 B/elem (2 reads + 2 writes)"),
            ms,
            6 * n,
            copy_gbs,
        ));
        rows.push(mem_row(
            "  same, on 4 B/elem (one read + 2 writes)".to_string(),
            ms,
            4 * n,
            copy_gbs,
        ));
    }
    let a_ms = time_ms(gpu, 5, 30, |g| {
        g.stream.memset_zeros(&mut q.amax_bits)?;
        g.launch_amax(&src, &mut q.amax_bits, &mut q.nonfinite)
    })?;
    rows.push(mem_row(
        "  phase 1 alone: amax bf16 (2 B/elem)".into(),
        a_ms,
        2 * n,
        copy_gbs,
    ));
    let c_ms = time_ms(gpu, 5, 30, |g| {
        g.launch_cast(
            &src,
            (r, c),
            Format::E4M3,
            &q.amax_bits,
            &mut q.rowwise,
            &mut q.colwise,
            &mut q.scale_inv,
            false,
        )
    })?;
    rows.push(mem_row(
        "  phase 2 alone: cast + transpose (4 B/elem)".into(),
        c_ms,
        4 * n,
        copy_gbs,
    ));
    // The production entry point (E5M2 too), allocation-free.
    let mut q5 = gpu.alloc_fp8(r, c, Format::E5M2)?;
    let ms = time_ms(gpu, 5, 30, |g| {
        g.quantize_tensorwise_into(&src, &mut q5, false)
    })?;
    rows.push(mem_row(
        format!(
            "quantize_tensorwise_into bf16->e5m2 {r}x{c} (reverse={}): on 6 B/elem",
            gpu.reverse_cast
        ),
        ms,
        6 * n,
        copy_gbs,
    ));
    drop(q5);
    // 1x128 blocks: one pass.
    let mut b = gpu.alloc_block_fp8(r, c, Format::E4M3)?;
    for rep in ["", " (repeat)"] {
        let ms = time_ms(gpu, 5, 30, |g| {
            g.quantize_block1x128_into(&src, &mut b, false, false)
        })?;
        rows.push(mem_row(
            format!("quantize 1x128 bf16->e4m3 row+col {r}x{c}: on 4 B/elem (one pass){rep}"),
            ms,
            4 * n,
            copy_gbs,
        ));
    }
    let ms = time_ms(gpu, 5, 30, |g| {
        g.quantize_block1x128_direct_into(&src, &mut b)
    })?;
    rows.push(mem_row(
        "  variant: column-wise codes stored from registers, not staged".into(),
        ms,
        4 * n,
        copy_gbs,
    ));
    // Delayed scaling: the scale is known before the pass, so one pass casts
    // both copies and records the amax: 4 B/elem, the true minimum.
    let dscale = gpu.upload(&[448.0f32 / 4.0])?;
    let ms = time_ms(gpu, 5, 30, |g| {
        g.quantize_given_scale_into(&src, &dscale, &mut q, false)
    })?;
    rows.push(mem_row(
        format!(
            "quantize given scale (delayed) bf16->e4m3 row+col {r}x{c}: on 4 B/elem (one pass)"
        ),
        ms,
        4 * n,
        copy_gbs,
    ));
    drop((b, q, src));
    // f32 input: 4 B read twice + 2 x 1 B written = 10 B/elem.
    let (fr, fc) = (r / 2, c);
    let nf = fr * fc;
    let srcf: CudaSlice<f32> = gpu.upload(&random_f32(nf, 2, 4.0))?;
    let mut qf = gpu.alloc_fp8(fr, fc, Format::E4M3)?;
    let ms = time_ms(gpu, 5, 30, |g| {
        g.quantize_tensorwise_into(&srcf, &mut qf, false)
    })?;
    rows.push(mem_row(
        format!("quantize tensorwise f32->e4m3 row+col {fr}x{fc}: on 10 B/elem"),
        ms,
        10 * nf,
        copy_gbs,
    ));
    Ok(rows)
}

/// bf16 and FP8 GEMMs (`(m, k, n)`, TN, bf16 output) in one run; FP8 ratios are against bf16.
pub fn bench_gemm(gpu: &Gpu, shapes: &[(usize, usize, usize)]) -> Result<Vec<BenchRow>> {
    let mut rows = Vec::new();
    for &(m, k, n) in shapes {
        let flops = 2.0 * (m * k * n) as f64;
        let (da, db) = (
            gpu.upload(&bf16_bits(&random_bf16(m * k, 2, 1.0)))?,
            gpu.upload(&bf16_bits(&random_bf16(n * k, 3, 1.0)))?,
        );
        let mut d: CudaSlice<u16> = gpu.alloc_zeros(m * n, "GEMM output")?;
        let bf = time_ms(gpu, 5, 20, |g| g.gemm_bf16(&da, &db, &mut d, (m, n, k)))?;
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
        let qa5 = gpu.quantize_tensorwise(&da, m, k, Format::E5M2, true)?;
        drop((da, db));
        for (label, a, fast) in [
            ("e4m3xe4m3", &qa, false),
            ("e4m3xe4m3 fast-accum", &qa, true),
            ("e5m2xe4m3", &qa5, false),
        ] {
            let ms = time_ms(gpu, 5, 20, |g| {
                g.gemm_fp8(
                    a.rowwise_operand(),
                    qb.rowwise_operand(),
                    &mut d,
                    (m, n, k),
                    fast,
                )
            })?;
            let t = flops / ms / 1e9;
            rows.push(BenchRow {
                name: format!("gemm fp8 {label} tensorwise {m}x{k}x{n}"),
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
/// on K-major operands (fast accumulation for `output` and `grad_input` in
/// the first variant, never for `grad_weight`). Shapes are `(M, K, N)`.
pub fn bench_linear(gpu: &Gpu, shapes: &[(usize, usize, usize)]) -> Result<Vec<BenchRow>> {
    let mut rows = Vec::new();
    for &(m, k, n) in shapes {
        let x = gpu.upload(&bf16_bits(&random_bf16(m * k, 11, 2.0)))?; // (M, K)
        let w = gpu.upload(&bf16_bits(&random_bf16(n * k, 12, 0.05)))?; // (N, K)
        let dy = gpu.upload(&bf16_bits(&random_bf16(m * n, 13, 0.01)))?; // (M, N)
        let mut y: CudaSlice<u16> = gpu.alloc_zeros(m * n, "y")?; // (M, N)
        let mut dx: CudaSlice<u16> = gpu.alloc_zeros(m * k, "dx")?; // (M, K)
        let mut dw: CudaSlice<u16> = gpu.alloc_zeros(n * k, "dw")?; // (N, K)
        let flops = 6.0 * (m * k * n) as f64;
        let bf = time_ms(gpu, 3, 10, |g| {
            g.gemm_bf16(&x, &w, &mut y, (m, n, k))?; // output = input @ weight_t
            g.gemm_bf16_op((&dy, false), (&w, false), &mut dx, (m, k, n))?; // grad_input = grad_output @ weight
            g.gemm_bf16_op((&dy, true), (&x, false), &mut dw, (n, k, m)) // grad_weight = grad_output_t @ input
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
        // The three FP8 GEMMs of the layer: output, grad_input, grad_weight
        // (fast accumulation never for the weight gradient).
        let gemms = |g: &Gpu,
                     (qx, qw, qdy): (&crate::DeviceFp8, &crate::DeviceFp8, &crate::DeviceFp8),
                     (y, dx, dw): (
            &mut CudaSlice<u16>,
            &mut CudaSlice<u16>,
            &mut CudaSlice<u16>,
        ),
                     fast: bool|
         -> Result<()> {
            g.gemm_fp8(
                qx.rowwise_operand(),
                qw.rowwise_operand(),
                y,
                (m, n, k),
                fast,
            )?;
            g.gemm_fp8(
                qdy.rowwise_operand(),
                qw.colwise_operand(),
                dx,
                (m, k, n),
                fast,
            )?;
            g.gemm_fp8(
                qdy.colwise_operand(),
                qx.colwise_operand(),
                dw,
                (n, k, m),
                false,
            )
        };
        for (label, fast) in [("fast-accum fwd/dgrad", true), ("no fast-accum", false)] {
            let ms = time_ms(gpu, 3, 10, |g| {
                g.quantize_tensorwise_into(&x, &mut qx, false)?;
                g.quantize_tensorwise_into(&w, &mut qw, false)?;
                g.quantize_tensorwise_into(&dy, &mut qdy, false)?;
                gemms(g, (&qx, &qw, &qdy), (&mut y, &mut dx, &mut dw), fast)
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
        // As the training step runs it: the kernels that write the input, the
        // weight (AdamW) and the output gradient also record their amax, so each
        // quantize is the cast + transpose pass alone. The amaxes come from one
        // untimed quantize of each tensor here.
        gpu.quantize_tensorwise_into(&x, &mut qx, false)?;
        gpu.quantize_tensorwise_into(&w, &mut qw, false)?;
        gpu.quantize_tensorwise_into(&dy, &mut qdy, false)?;
        let ms = time_ms(gpu, 3, 10, |g| {
            g.quantize_tensorwise_known_into(&x, &mut qx)?;
            g.quantize_tensorwise_known_into(&w, &mut qw)?;
            g.quantize_tensorwise_known_into(&dy, &mut qdy)?;
            gemms(g, (&qx, &qw, &qdy), (&mut y, &mut dx, &mut dw), true)
        })?;
        rows.push(BenchRow {
            name: format!(
                "linear fwd+bwd fp8 tensorwise quantized (fast-accum fwd/dgrad, amaxes from the producers) {shape}"
            ),
            ms,
            rate: flops / ms / 1e9,
            unit: "TFLOP/s",
            ratio: bf / ms,
            vs: "bf16".into(),
        });
        drop((qx, qw, qdy));
        // Row-wise scaling: each copy scaled per row, GEMMs with outer-vector scales.
        let mut rx = gpu.alloc_rowwise_fp8(m, k, Format::E4M3)?;
        let mut rw = gpu.alloc_rowwise_fp8(n, k, Format::E4M3)?;
        let mut rdy = gpu.alloc_rowwise_fp8(m, n, Format::E5M2)?;
        let (e4, e5) = (Format::E4M3, Format::E5M2);
        let ms = time_ms(gpu, 3, 10, |g| {
            g.quantize_rowwise_into(&x, &mut rx, false)?;
            g.quantize_rowwise_into(&w, &mut rw, false)?;
            g.gemm_fp8_rowwise(
                (&rx.rowwise, e4, &rx.row_scale_inv),
                (&rw.rowwise, e4, &rw.row_scale_inv),
                &mut y,
                (m, n, k),
            )?;
            g.quantize_rowwise_into(&dy, &mut rdy, false)?;
            g.gemm_fp8_rowwise(
                (&rdy.rowwise, e5, &rdy.row_scale_inv),
                (&rw.colwise, e4, &rw.col_scale_inv),
                &mut dx,
                (m, k, n),
            )?;
            g.gemm_fp8_rowwise(
                (&rdy.colwise, e5, &rdy.col_scale_inv),
                (&rx.colwise, e4, &rx.col_scale_inv),
                &mut dw,
                (n, k, m),
            )
        })?;
        drop((rx, rw, rdy));
        // Blockwise (DeepSeek-V3): 1x128 activations and gradients, 128x128 weights;
        // the 1x128 scale grids are transposed into cuBLASLt's layout each step.
        if m % 128 == 0 && n % 128 == 0 && k % 128 == 0 {
            let mut bx = gpu.alloc_block_fp8(m, k, Format::E4M3)?;
            let mut bw = gpu.alloc_block2d_fp8(n, k, Format::E4M3)?;
            let mut bdy = gpu.alloc_block_fp8(m, n, Format::E5M2)?;
            let mut xs_r: CudaSlice<f32> = gpu.alloc_zeros(m * k / 128, "scales")?;
            let mut xs_c: CudaSlice<f32> = gpu.alloc_zeros(m * k / 128, "scales")?;
            let mut gs_r: CudaSlice<f32> = gpu.alloc_zeros(m * n / 128, "scales")?;
            let mut gs_c: CudaSlice<f32> = gpu.alloc_zeros(m * n / 128, "scales")?;
            let ms = time_ms(gpu, 3, 10, |g| {
                g.quantize_block1x128_into(&x, &mut bx, false, false)?;
                g.quantize_block128x128_into(&w, &mut bw, false)?;
                g.transpose_f32(&bx.row_scale_inv, m, k / 128, &mut xs_r)?;
                g.transpose_f32(&bx.col_scale_inv, k, m / 128, &mut xs_c)?;
                g.gemm_fp8_block(
                    (&bx.rowwise, e4, &xs_r, false),
                    (&bw.rowwise, e4, &bw.row_scale_inv, true),
                    &mut y,
                    (m, n, k),
                )?;
                g.quantize_block1x128_into(&dy, &mut bdy, false, false)?;
                g.transpose_f32(&bdy.row_scale_inv, m, n / 128, &mut gs_r)?;
                g.transpose_f32(&bdy.col_scale_inv, n, m / 128, &mut gs_c)?;
                g.gemm_fp8_block(
                    (&bdy.rowwise, e5, &gs_r, false),
                    (&bw.colwise, e4, &bw.col_scale_inv, true),
                    &mut dx,
                    (m, k, n),
                )?;
                g.gemm_fp8_block(
                    (&bdy.colwise, e5, &gs_c, false),
                    (&bx.colwise, e4, &xs_c, false),
                    &mut dw,
                    (n, k, m),
                )
            })?;
            rows.push(BenchRow {
                name: format!("linear fwd+bwd fp8 blockwise (1x128 / 128x128) quantized {shape}"),
                ms,
                rate: flops / ms / 1e9,
                unit: "TFLOP/s",
                ratio: bf / ms,
                vs: "bf16".into(),
            });
        }
        rows.push(BenchRow {
            name: format!("linear fwd+bwd fp8 rowwise quantized {shape}"),
            ms,
            rate: flops / ms / 1e9,
            unit: "TFLOP/s",
            ratio: bf / ms,
            vs: "bf16".into(),
        });
    }
    Ok(rows)
}

/// Weight-only FP8 products (`Gpu::mixed_matmul`, E4M3 weights with
/// per-channel scales, and above 64 rows per-tensor and 128x128-block ones
/// too; bf16 activations and output) beside the cuBLASLt bf16 product of the
/// same shape, for each weight `(K, N)` and row count `M`. The weights' codes
/// are tiled, as `octet generate` uploads them; the rows marked "codes
/// row-major" time the per-channel product over row-major codes (the LoRA
/// base's layout) in the same round, and the rows marked "x f16" the
/// per-channel product with f16 activations (`Gpu::mixed_matmul_x`).
/// Weight GB/s counts the weight bytes once (the floor at small `M`); the
/// copy figure is read + write of a 1 GiB device-to-device copy.
///
/// Up to [`crate::mixed::SMALL_M`] rows, each product is also timed as a
/// decoder runs it: back to back over distinct copies of the weight that
/// together hold at least 256 MiB (five times the H100's L2, so every weight
/// comes from DRAM), captured in one CUDA graph (as `octet generate` replays
/// a step, so the host's launch cost is not in it) and divided by their
/// number, beside cuBLASLt's bf16 product timed the same way. A single
/// launch timed alone also pays the host's launch and the ramp of one small
/// kernel (and at small sizes reads a weight L2 still holds). The graph rows
/// are also set against a device-to-device copy of the same codes, back to
/// back over the same copies in a graph (read + written, as the 1 GiB
/// figure): what a copy moving this many bytes per launch reaches.
pub fn bench_mixed(gpu: &Gpu, ms: &[usize], kns: &[(usize, usize)]) -> Result<Vec<BenchRow>> {
    use octet_tensor::mixed::{Fp8Weight, WeightScaling};
    let mut rows = Vec::new();
    let n_copy = 1 << 29;
    let src: CudaSlice<u16> = gpu.alloc_zeros(n_copy, "copy source")?;
    let mut dst: CudaSlice<u16> = gpu.alloc_zeros(n_copy, "copy destination")?;
    let copy_ms = time_ms(gpu, 3, 20, |g| Ok(g.stream.memcpy_dtod(&src, &mut dst)?))?;
    let copy_gbs = gbs(4 * n_copy, copy_ms);
    drop((src, dst));
    rows.push(BenchRow {
        name: "copy d2d 1 GiB (bytes read + written)".into(),
        ms: copy_ms,
        rate: copy_gbs,
        unit: "GB/s",
        ratio: 1.0,
        vs: "copy".into(),
    });
    let l2_bytes = gpu
        .ctx
        .attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)?
        as usize;
    for &(k, n) in kns {
        let wf = random_f32(n * k, 11, 0.02);
        let w = Fp8Weight::quantize(&wf, n, k, Format::E4M3, WeightScaling::Channel)
            .map_err(|e| Error::Shape(e.to_string()))?;
        // Tiled codes, as `octet generate` uploads them; the per-channel
        // weight row-major too, for the layout's comparison rows.
        let dw = gpu.upload_fp8_weight_tiled(&w)?;
        let dwr = gpu.upload_fp8_weight(&w)?;
        let wt = Fp8Weight::quantize(&wf, n, k, Format::E4M3, WeightScaling::Tensor)
            .map_err(|e| Error::Shape(e.to_string()))?;
        let dwt = gpu.upload_fp8_weight_tiled(&wt)?;
        drop(wt);
        let wk = Fp8Weight::quantize(&wf, n, k, Format::E4M3, WeightScaling::Block128)
            .map_err(|e| Error::Shape(e.to_string()))?;
        let dwk = gpu.upload_fp8_weight_tiled(&wk)?;
        drop(wk);
        let wb: Vec<u16> = wf
            .iter()
            .map(|&v| half::bf16::from_f32(v).to_bits())
            .collect();
        drop(wf);
        let dwb = gpu.upload(&wb)?;
        // The copies for the back-to-back timing (only when a small M is asked).
        let copies = (256usize << 20).div_ceil(dwr.bytes()).max(2);
        let small = ms.iter().any(|&m| m <= crate::mixed::SMALL_M);
        let mut stream_w = Vec::new();
        let mut stream_wr = Vec::new();
        let mut stream_wb = Vec::new();
        for _ in 0..if small { copies } else { 0 } {
            stream_w.push(gpu.upload_fp8_weight_tiled(&w)?);
            stream_wr.push(gpu.upload_fp8_weight(&w)?);
            stream_wb.push(gpu.upload(&wb)?);
        }
        drop((w, wb));
        // The same-size copy floor: each weight's codes copied to one scratch
        // buffer, back to back.
        let same_copy_gbs = if small {
            let mut scratch: CudaSlice<u8> = gpu.alloc_zeros(dwr.codes.len(), "copy scratch")?;
            let t = time_graph_ms(gpu, 2, 10, |g| {
                for w in &stream_wr {
                    g.stream.memcpy_dtod(&w.codes, &mut scratch)?;
                }
                Ok(())
            })? / copies as f64;
            let r = gbs(2 * dwr.codes.len(), t);
            rows.push(BenchRow {
                name: format!(
                    "copy d2d of one weight's codes K={k} N={n}, {copies} back to back in a graph (read + written)"
                ),
                ms: t,
                rate: r,
                unit: "GB/s",
                ratio: r / copy_gbs,
                vs: "copy".into(),
            });
            r
        } else {
            f64::NAN
        };
        // What a kernel that only reads the same codes reaches, back to back.
        if small {
            let mut sink: CudaSlice<u32> = gpu.alloc_zeros(gpu.read_floor_sink(), "read sink")?;
            let t = time_graph_ms(gpu, 2, 10, |g| {
                stream_wr
                    .iter()
                    .try_for_each(|w| g.read_floor(&w.codes, &mut sink))
            })? / copies as f64;
            let r = gbs(dwr.codes.len(), t);
            rows.push(BenchRow {
                name: format!(
                    "read-only pass over one weight's codes K={k} N={n}, {copies} back to back in a graph"
                ),
                ms: t,
                rate: r,
                unit: "GB/s",
                ratio: r / copy_gbs,
                vs: "copy".into(),
            });
        }
        for &m in ms {
            let dx = gpu.upload(&bf16_bits(&random_bf16(m * k, 12, 1.0)))?;
            let dx16: CudaSlice<u16> = gpu.upload(
                &random_f32(m * k, 12, 1.0)
                    .iter()
                    .map(|&v| half::f16::from_f32(v).to_bits())
                    .collect::<Vec<u16>>(),
            )?;
            let f16x = crate::XType::F16;
            let mut y: CudaSlice<u16> = gpu.alloc_zeros(m * n, "y")?;
            // Every product of this M in turn within each repetition. Large
            // M: per-tensor and 128x128-block factors too (on the upcast path
            // the first applies in the epilogue, the second in the upcast).
            let large = m > crate::mixed::SMALL_M;
            let times = {
                // The contenders share one output buffer, each borrowing it
                // only while it enqueues.
                let y = std::cell::RefCell::new(&mut y);
                let mut ch = |g: &Gpu| g.mixed_matmul(&dx, m, &dw, *y.borrow_mut());
                let mut bf = |g: &Gpu| g.gemm_bf16(&dx, &dwb, *y.borrow_mut(), (m, n, k));
                let mut ten = |g: &Gpu| g.mixed_matmul(&dx, m, &dwt, *y.borrow_mut());
                let mut blk = |g: &Gpu| g.mixed_matmul(&dx, m, &dwk, *y.borrow_mut());
                let mut row = |g: &Gpu| g.mixed_matmul(&dx, m, &dwr, *y.borrow_mut());
                let mut x16 = |g: &Gpu| g.mixed_matmul_x(&dx16, f16x, m, &dw, *y.borrow_mut());
                let mut fs: Vec<Enqueue<'_>> = vec![&mut ch, &mut bf, &mut row, &mut x16];
                if large {
                    fs.push(&mut ten);
                    fs.push(&mut blk);
                }
                time_round_robin(gpu, 5, 30, &mut fs)?
            };
            let (mixed, bf) = (times[0], times[1]);
            let flops = |ms: f64| 2.0 * (m * n * k) as f64 / ms / 1e9;
            // The FP8 row (weight GB/s against copy at small M, TFLOP/s
            // above) and cuBLASLt's bf16 row beside it.
            let pair = |how: &str, mixed: f64, bf: f64| -> [BenchRow; 2] {
                let fp8 = if m > crate::mixed::SMALL_M {
                    BenchRow {
                        name: format!("mixed fp8 e4m3 per-channel K={k} N={n} M={m}{how}"),
                        ms: mixed,
                        rate: flops(mixed),
                        unit: "TFLOP/s",
                        ratio: bf / mixed,
                        vs: "mixed speedup".into(),
                    }
                } else {
                    let rate = gbs(dwr.bytes(), mixed);
                    BenchRow {
                        name: format!("mixed fp8 e4m3 per-channel K={k} N={n} M={m}{how}"),
                        ms: mixed,
                        rate,
                        unit: "weight GB/s",
                        ratio: rate / copy_gbs,
                        vs: "copy".into(),
                    }
                };
                let bf16 = BenchRow {
                    name: format!("gemm bf16 cuBLASLt K={k} N={n} M={m}{how}"),
                    ms: bf,
                    rate: gbs(2 * n * k, bf),
                    unit: "weight GB/s",
                    ratio: bf / mixed,
                    vs: "mixed speedup".into(),
                };
                [fp8, bf16]
            };
            rows.extend(pair("", mixed, bf));
            let [row_major, _] = pair(", codes row-major", times[2], bf);
            rows.push(row_major);
            let [x16, _] = pair(", x f16", times[3], bf);
            rows.push(x16);
            if m <= crate::mixed::SMALL_M {
                let per = |total: f64| total / copies as f64;
                let mixed = per(time_graph_ms(gpu, 2, 10, |g| {
                    stream_w
                        .iter()
                        .try_for_each(|w| g.mixed_matmul(&dx, m, w, &mut y))
                })?);
                let bf = per(time_graph_ms(gpu, 2, 10, |g| {
                    stream_wb
                        .iter()
                        .try_for_each(|w| g.gemm_bf16(&dx, w, &mut y, (m, n, k)))
                })?);
                rows.extend(pair(
                    &format!(", {copies} weights back to back in a graph"),
                    mixed,
                    bf,
                ));
                let row_major = per(time_graph_ms(gpu, 2, 10, |g| {
                    stream_wr
                        .iter()
                        .try_for_each(|w| g.mixed_matmul(&dx, m, w, &mut y))
                })?);
                let [row_major, _] = pair(
                    &format!(", codes row-major, {copies} weights back to back in a graph"),
                    row_major,
                    bf,
                );
                rows.push(row_major);
                let x16 = per(time_graph_ms(gpu, 2, 10, |g| {
                    stream_w
                        .iter()
                        .try_for_each(|w| g.mixed_matmul_x(&dx16, f16x, m, w, &mut y))
                })?);
                let [x16, _] = pair(
                    &format!(", x f16, {copies} weights back to back in a graph"),
                    x16,
                    bf,
                );
                rows.push(x16);
                // One weight over and over: where it fits in half of L2 the
                // codes stay there, and the time is what the kernel needs
                // without DRAM (on-chip traffic, instructions, launch gaps).
                if dw.bytes() <= l2_bytes / 2 {
                    let same = |x: &CudaSlice<u16>, t: crate::XType, y: &mut CudaSlice<u16>| {
                        time_graph_ms(gpu, 2, 10, |g| {
                            (0..copies).try_for_each(|_| g.mixed_matmul_x(x, t, m, &dw, y))
                        })
                        .map(per)
                    };
                    let hot = [
                        ("", same(&dx, crate::XType::Bf16, &mut y)?),
                        (", x f16", same(&dx16, f16x, &mut y)?),
                    ];
                    for (how, t) in hot {
                        let rate = gbs(dwr.bytes(), t);
                        rows.push(BenchRow {
                            name: format!(
                                "mixed fp8 e4m3 per-channel K={k} N={n} M={m}{how}, one weight {copies} times in a graph (L2-resident, {} MiB L2)",
                                l2_bytes >> 20
                            ),
                            ms: t,
                            rate,
                            unit: "weight GB/s",
                            ratio: rate / copy_gbs,
                            vs: "copy".into(),
                        });
                    }
                }
                let rate = gbs(dwr.bytes(), mixed);
                rows.push(BenchRow {
                    name: format!(
                        "mixed fp8 e4m3 per-channel K={k} N={n} M={m}, back to back in a graph, vs the same-size copy"
                    ),
                    ms: mixed,
                    rate,
                    unit: "weight GB/s",
                    ratio: rate / same_copy_gbs,
                    vs: "same-size copy".into(),
                });
            }
            if large {
                for (what, t) in [("per-tensor", times[4]), ("block128", times[5])] {
                    rows.push(BenchRow {
                        name: format!("mixed fp8 e4m3 {what} K={k} N={n} M={m}"),
                        ms: t,
                        rate: flops(t),
                        unit: "TFLOP/s",
                        ratio: bf / t,
                        vs: "mixed speedup".into(),
                    });
                }
            }
        }
    }
    Ok(rows)
}

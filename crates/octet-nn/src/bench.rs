//! Benchmarks of the layers on the GPU (the kernels' own benchmarks are in
//! `octet_cuda::bench`).

use octet_cuda::bench::{time_ms, BenchRow};
use octet_cuda::testdata::{bf16_bits, random_bf16};
use octet_cuda::{Gpu, Result};

/// Causal attention forward and backward (the kernels of the training model)
/// at `(batch, seq, heads, head_dim)` shapes, in TFLOP/s of the causal half:
/// forward 2 products of 2 B H T^2 D / 2 FLOPs each, backward 2.5x the
/// forward's (five products, as flash attention counts them, whatever the
/// kernels recompute).
pub fn bench_attention(
    gpu: &Gpu,
    shapes: &[(usize, usize, usize, usize)],
) -> Result<Vec<BenchRow>> {
    use crate::llama::cuda::GpuLlama;
    let mut rows = Vec::new();
    for &(b, t, h, d) in shapes {
        let cfg = crate::conformance::test_config(h * d, 64, 1, h, h, t);
        let w = crate::conformance::test_weights(&cfg, 5)?;
        let model = GpuLlama::new(gpu, &cfg, &w, None)?;
        let n = b * t * h * d;
        let q = gpu.upload(&bf16_bits(&random_bf16(n, 71, 2.0)))?;
        let k = gpu.upload(&bf16_bits(&random_bf16(n, 72, 2.0)))?;
        let v = gpu.upload(&bf16_bits(&random_bf16(n, 73, 1.0)))?;
        let go = gpu.upload(&bf16_bits(&random_bf16(n, 74, 1e-2)))?;
        let dims = (b, t, h, h, d);
        let fwd_flop = 2.0 * 2.0 * (b * h * d) as f64 * (t * t) as f64 / 2.0;
        let ms = time_ms(gpu, 3, 10, |_| {
            model.attention_forward_bench(&q, &k, &v, dims).map(|_| ())
        })?;
        let (out, lse) = model.attention_forward_bench(&q, &k, &v, dims)?;
        let bms = time_ms(gpu, 3, 10, |_| {
            model
                .attention_backward_bench(&q, &k, &v, &out, &go, &lse, dims)
                .map(|_| ())
        })?;
        // As the training step runs it: bf16 gradients with RoPE's backward
        // and amaxes (FP8 recipes), stored by the kernels on Hopper, else by
        // the f32 kernels and passes (the row above plus the passes).
        let mut amax = [
            Some(gpu.alloc_amax()?),
            Some(gpu.alloc_amax()?),
            Some(gpu.alloc_amax()?),
        ];
        let tms = time_ms(gpu, 3, 10, |_| {
            model
                .attention_backward_bf16_bench(&q, &k, &v, &out, &go, &lse, dims, &mut amax, true)
                .map(|_| ())
        })?;
        let train_bwd = if model.attention_fused_store() {
            "backward, bf16 + RoPE stored by the kernels (training)"
        } else {
            "backward, then RoPE and bf16 passes (training)"
        };
        for (what, ms, flop) in [
            ("forward", ms, fwd_flop),
            ("backward (f32 gradients)", bms, 2.5 * fwd_flop),
            (train_bwd, tms, 2.5 * fwd_flop),
        ] {
            rows.push(BenchRow {
                name: format!("attention {what} causal B={b} T={t} H={h} D={d}"),
                ms,
                rate: flop / ms / 1e9,
                unit: "TFLOP/s",
                ratio: flop / ms / 1e9 / 989.0,
                vs: "H100 dense bf16 peak (989)".into(),
            });
        }
    }
    Ok(rows)
}

//! `octet bench quantize|gemm|linear` on the CPU reference backend.
//!
//! Throughput is labelled honestly: GB/s counts the minimum bytes an op must
//! read and write, GFLOP/s counts 2 M K N per GEMM. Every figure is the
//! median of several timed runs after a warm-up.

use crate::util::{
    check_matrix, gaussian, median_secs, parse_attention_shapes, parse_dims2, parse_shapes,
    write_json, Table, MAX_ELEMENTS,
};
use anyhow::Context;
use half::bf16;
use octet_fp8::convert::{decode_slice, encode_slice};
use octet_fp8::{BackwardMode, Format, Layout, Overflow, Recipe, Role, Rounding, Usage};
use octet_nn::Linear;
use octet_tensor::{cpu, Tensor};
use serde_json::json;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct BenchArgs {
    /// What to measure.
    #[arg(value_enum)]
    op: Op,
    /// Write the results as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// GEMM/Linear shapes, MxKxN[,MxKxN...].
    #[arg(long)]
    shapes: Option<String>,
    /// Size of the quantize buffer in MiB of f32.
    #[arg(long, default_value_t = 64)]
    mib: usize,
    /// Tensor for `bench quantize`, RxC (default 4096x4096 on the CPU,
    /// 16384x8192 on the GPU).
    #[arg(long)]
    tensor: Option<String>,
    /// Timed repetitions per figure (the median is reported; at least 1). The
    /// CPU's full reference quantize of every recipe, the slowest table, takes
    /// at most 3.
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// `bench mixed`: rows of the activation, M[,M...].
    #[arg(long)]
    m: Option<String>,
    /// `bench mixed`: weight shapes, KxN[,KxN...].
    #[arg(long)]
    kn: Option<String>,
    /// `bench mixed` on the CPU: the widest instruction set the kernels may
    /// use (scalar, avx2, avx512; default: the widest this CPU has).
    #[arg(long)]
    cpu_simd: Option<String>,
    /// cpu, cuda or auto. On cuda, `gemm` runs the whole GPU suite (copy
    /// floor, fused quantizes, bf16 and FP8 cuBLASLt GEMMs, `Linear` forward +
    /// backward per recipe) in one run; `quantize` and `linear` run their part.
    #[arg(long, default_value = "cpu")]
    device: String,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum Op {
    Quantize,
    Gemm,
    Linear,
    /// Weight-only FP8 products (FP8 weights upcast in the kernel) beside bf16 and f32 weights.
    Mixed,
    /// The training model's causal attention kernels, forward and backward
    /// (GPU only; `--shapes BxTxHxD[,...]`, default 4x2048x16x128).
    Attention,
}

pub fn run(a: BenchArgs) -> anyhow::Result<()> {
    if let Some(p) = &a.json {
        crate::util::check_json_path(p)?;
    }
    if let Some(mut g) = crate::gpu::open(&a.device)? {
        if matches!(a.op, Op::Mixed) {
            let ms = parse_list(a.m.as_deref().unwrap_or("1,4,16,64,256,2048")).context("--m")?;
            let kns: Vec<(usize, usize)> =
                a.kn.as_deref()
                    .unwrap_or("4096x4096,4096x14336,8192x28672")
                    .split(',')
                    .map(parse_dims2)
                    .collect::<anyhow::Result<_>>()
                    .context("--kn")?;
            check_mixed(&ms, &kns)?;
            return crate::gpu::bench_mixed(&mut g, &ms, &kns, a.json.as_deref());
        }
        if matches!(a.op, Op::Attention) {
            let shapes = parse_attention_shapes(a.shapes.as_deref().unwrap_or("4x2048x16x128"))
                .context("--shapes")?;
            return crate::gpu::bench_attention(&mut g, &shapes, a.json.as_deref());
        }
        let part = match a.op {
            Op::Quantize => {
                let (r, c) = parse_dims2(a.tensor.as_deref().unwrap_or("16384x8192"))
                    .context("--tensor")?;
                crate::gpu::Suite::Quantize(r, c)
            }
            Op::Linear => crate::gpu::Suite::Linear(
                parse_shapes(a.shapes.as_deref().unwrap_or(
                    "16384x4096x14336,8192x8192x8192,4096x4096x4096,2048x4096x4096",
                ))
                .context("--shapes")?,
            ),
            _ => crate::gpu::Suite::All(parse_shapes(a.shapes.as_deref().unwrap_or("8192x8192x8192,4096x4096x4096,16384x4096x14336,16384x14336x4096,2048x4096x4096,128x4096x4096")).context("--shapes")?),
        };
        return crate::gpu::bench(&mut g, part, a.json.as_deref());
    }
    // `median_secs` times at least one run: a header saying "median of 0
    // runs" would not be what was measured.
    anyhow::ensure!(
        a.reps >= 1 || matches!(a.op, Op::Attention),
        "--reps {}: give at least 1 timed run",
        a.reps
    );
    let rows = match a.op {
        Op::Quantize => quantize(&a)?,
        Op::Gemm => gemm(&a)?,
        Op::Linear => linear(&a)?,
        Op::Mixed => mixed(&a)?,
        Op::Attention => anyhow::bail!(
            "`bench attention` measures the GPU kernels: pass --device cuda (or auto on a machine with a GPU)"
        ),
    };
    if let Some(p) = &a.json {
        write_json(p, &format!("octet bench {:?}", a.op).to_lowercase(), &rows)?;
    }
    Ok(())
}

fn quantize(a: &BenchArgs) -> anyhow::Result<serde_json::Value> {
    let (r, c) = parse_dims2(a.tensor.as_deref().unwrap_or("4096x4096")).context("--tensor")?;
    let max_mib = (MAX_ELEMENTS * 4) >> 20;
    anyhow::ensure!(
        (1..=max_mib).contains(&a.mib),
        "--mib {}: must be between 1 and {max_mib} (a buffer of at most {MAX_ELEMENTS} f32 values)",
        a.mib
    );
    let n = a.mib * (1 << 20) / 4;
    println!(
        "CPU, {} threads; buffer of {} MiB f32 ({} elements); median of {} runs\n",
        rayon::current_num_threads(),
        a.mib,
        n,
        a.reps
    );
    let x = gaussian(n, 1, 100.0);
    let xb: Vec<bf16> = x.iter().map(|&v| bf16::from_f32(v)).collect();
    let mut y = vec![0f32; n];
    let mut q = vec![0u8; n];
    let gb = |bytes: usize, s: f64| bytes as f64 / s / 1e9;
    let t_copy = median_secs(a.reps, || y.copy_from_slice(&x));
    let copy = gb(8 * n, t_copy);
    let mut out = Vec::new();
    let mut t = Table::new(&["op", "bytes moved", "ms", "GB/s", "vs copy"]);
    let mut push = |name: &str, bytes: usize, s: f64| {
        let g = gb(bytes, s);
        t.row(vec![
            name.into(),
            bytes.to_string(),
            format!("{:.2}", s * 1e3),
            format!("{g:.2}"),
            format!("{:.2}", g / copy),
        ]);
        out.push(json!({"op": name, "bytes": bytes, "ms": s * 1e3, "gb_s": g, "ratio_to_copy": g / copy}));
    };
    push("copy f32 -> f32", 8 * n, t_copy);
    let s = median_secs(a.reps, || {
        encode_slice(
            Format::E4M3,
            &x,
            1.0,
            &mut q,
            Overflow::Saturate,
            Rounding::NearestEven,
            0,
        )
    });
    push("encode f32 -> e4m3", 5 * n, s);
    let s = median_secs(a.reps, || {
        encode_slice(
            Format::E5M2,
            &x,
            1.0,
            &mut q,
            Overflow::Saturate,
            Rounding::NearestEven,
            0,
        )
    });
    push("encode f32 -> e5m2", 5 * n, s);
    let s = median_secs(a.reps, || {
        encode_slice(
            Format::E4M3,
            &xb,
            1.0,
            &mut q,
            Overflow::Saturate,
            Rounding::NearestEven,
            0,
        )
    });
    push("encode bf16 -> e4m3", 3 * n, s);
    let s = median_secs(a.reps, || decode_slice(Format::E4M3, &q, 1.0, &mut y));
    push("decode e4m3 -> f32", 5 * n, s);
    t.print();

    println!(
        "\nfull reference quantize of a {r}x{c} f32 tensor, row-wise + column-wise copies (amax, scales, cast, transpose); median of {} runs",
        a.reps.min(3)
    );
    let xt = gaussian(r * c, 2, 1.0);
    let mut t = Table::new(&["recipe", "ms", "GB/s (read 4 B, write 2 copies)"]);
    for name in Recipe::NAMES {
        let rec = Recipe::from_name(name)?;
        let ds = (name == "delayed").then_some(100.0);
        let rs = rec.spec(Role::Input, Layout::Rowwise, ds, 0)?;
        let cs = rec.spec(Role::Input, Layout::Colwise, ds, 0)?;
        let mut res = Ok(());
        let s = median_secs(a.reps.min(3), || {
            if let Err(e) = octet_fp8::quantize(&xt, r, c, &rs, &cs, Usage::BOTH, None) {
                res = Err(e);
            }
        });
        res?;
        let bytes = r * c * (4 + 2 * rec.format(Role::Input).bits() as usize / 8);
        t.row(vec![
            name.into(),
            format!("{:.1}", s * 1e3),
            format!("{:.2}", gb(bytes, s)),
        ]);
        out.push(json!({"op": format!("quantize {name} {r}x{c} both"), "bytes": bytes, "ms": s * 1e3, "gb_s": gb(bytes, s)}));
    }
    t.print();
    Ok(json!(out))
}

fn gemm(a: &BenchArgs) -> anyhow::Result<serde_json::Value> {
    let shapes = parse_shapes(a.shapes.as_deref().unwrap_or("512x512x512,1024x1024x1024"))
        .context("--shapes")?;
    println!("CPU, {} threads; FP8 GEMMs are emulated (decode to f32, f32 GEMM per scale block, scale)\n", rayon::current_num_threads());
    let mut t = Table::new(&["shape", "kernel", "ms", "GFLOP/s", "vs f32"]);
    let mut out = Vec::new();
    for (m, k, n) in shapes {
        let (x, w) = (gaussian(m * k, 1, 1.0), gaussian(n * k, 2, 1.0));
        let flops = 2.0 * (m * k * n) as f64;
        let base = median_secs(a.reps, || {
            std::hint::black_box(cpu::sgemm(m, n, k, &x, false, &w, true));
        });
        let shape = format!("{m}x{k}x{n}");
        t.row(vec![
            shape.clone(),
            "f32 sgemm".into(),
            format!("{:.2}", base * 1e3),
            format!("{:.1}", flops / base / 1e9),
            "1.00".into(),
        ]);
        out.push(json!({"shape": shape, "kernel": "f32", "ms": base * 1e3, "gflops": flops / base / 1e9}));
        for name in Recipe::NAMES {
            let r = Recipe::from_name(name)?;
            let ds = (name == "delayed").then_some(100.0);
            let si = r.spec(Role::Input, Layout::Rowwise, ds, 0)?;
            let sw = r.spec(Role::Weight, Layout::Rowwise, ds, 0)?;
            let qx = octet_fp8::quantize(&x, m, k, &si, &si, Usage::ROW, None)?;
            let qw = octet_fp8::quantize(&w, n, k, &sw, &sw, Usage::ROW, None)?;
            let (qa, qb) = (qx.get(Layout::Rowwise)?, qw.get(Layout::Rowwise)?);
            let s = median_secs(a.reps, || {
                std::hint::black_box(cpu::fp8_gemm(qa, qb).ok());
            });
            let label = format!("fp8 {name} (emulated)");
            t.row(vec![
                shape.clone(),
                label.clone(),
                format!("{:.2}", s * 1e3),
                format!("{:.1}", flops / s / 1e9),
                format!("{:.2}", base / s),
            ]);
            out.push(json!({"shape": shape, "kernel": label, "ms": s * 1e3, "gflops": flops / s / 1e9, "speed_vs_f32": base / s}));
        }
    }
    t.print();
    Ok(json!(out))
}

fn linear(a: &BenchArgs) -> anyhow::Result<serde_json::Value> {
    let shapes =
        parse_shapes(a.shapes.as_deref().unwrap_or("256x1024x1024")).context("--shapes")?;
    println!("CPU, {} threads; Linear forward + backward (trainable weight, input gradient), FP8 emulated\n", rayon::current_num_threads());
    let mut t = Table::new(&["shape", "layer", "ms", "vs f32 layer", "saved bytes"]);
    let mut out = Vec::new();
    for (m, k, n) in shapes {
        let x = Tensor::from_f32(&[m, k], gaussian(m * k, 1, 1.0))?;
        let w = gaussian(n * k, 2, 1.0 / (k as f32).sqrt());
        let dy = Tensor::from_f32(&[m, n], gaussian(m * n, 3, 1e-2))?;
        let shape = format!("{m}x{k}x{n}");
        let mut base = f64::NAN;
        let mut layers: Vec<(String, Option<Recipe>)> = vec![("f32 (no FP8)".into(), None)];
        for name in Recipe::NAMES {
            layers.push((format!("{name} quantized"), Some(Recipe::from_name(name)?)));
        }
        layers.push((
            "tensorwise dequantized".into(),
            Some(Recipe::from_name("tensorwise")?.with_backward(BackwardMode::Dequantized)?),
        ));
        for (label, recipe) in layers {
            let mut l = Linear::new(Tensor::from_f32(&[n, k], w.clone())?, None, recipe, true)?;
            let mut saved_bytes = 0;
            let mut res = Ok(());
            let s = median_secs(a.reps, || {
                let r = l.forward(&x, true).and_then(|(_, saved)| {
                    saved_bytes = saved.bytes();
                    l.backward(saved, &dy)
                });
                if let Err(e) = r {
                    res = Err(e);
                }
            });
            res?;
            if recipe.is_none() {
                base = s;
            }
            t.row(vec![
                shape.clone(),
                label.clone(),
                format!("{:.1}", s * 1e3),
                format!("{:.2}x", base / s),
                saved_bytes.to_string(),
            ]);
            out.push(json!({"shape": shape, "layer": label, "ms": s * 1e3, "speed_vs_f32": base / s, "saved_bytes": saved_bytes}));
        }
    }
    t.print();
    Ok(json!(out))
}

/// Each `--m` row count against each `--kn` weight: the activations
/// (M x K) and outputs (M x N) stay within [`MAX_ELEMENTS`].
fn check_mixed(ms: &[usize], kns: &[(usize, usize)]) -> anyhow::Result<()> {
    for &m in ms {
        for &(k, n) in kns {
            let what = format!("--m {m} with --kn {k}x{n}");
            check_matrix(m, k, &what)?;
            check_matrix(m, n, &what)?;
        }
    }
    Ok(())
}

/// Parse `1,4,16`.
fn parse_list(s: &str) -> anyhow::Result<Vec<usize>> {
    s.split(',')
        .map(|t| {
            t.trim()
                .parse::<usize>()
                .with_context(|| format!("'{t}' is not a count"))
        })
        .collect()
}

fn mixed(a: &BenchArgs) -> anyhow::Result<serde_json::Value> {
    use octet_tensor::mixed::{
        cpu_simd, limit_cpu_simd, matmul_weights, CpuSimd, Fp8Weight, WeightRef, WeightScaling,
    };
    if let Some(name) = &a.cpu_simd {
        limit_cpu_simd(CpuSimd::from_name(name)?).context("--cpu-simd")?;
    }
    let simd = cpu_simd();
    let reps = a.reps;
    let ms = parse_list(a.m.as_deref().unwrap_or("1,4,16,64")).context("--m")?;
    let kns: Vec<(usize, usize)> =
        a.kn.as_deref()
            .unwrap_or("4096x4096,4096x14336")
            .split(',')
            .map(parse_dims2)
            .collect::<anyhow::Result<_>>()
            .context("--kn")?;
    check_mixed(&ms, &kns)?;
    // The memory floor: a copy of a buffer well beyond the caches.
    let big = 64 << 20;
    let src = gaussian(big / 4, 5, 1.0);
    let mut dst = vec![0f32; big / 4];
    let copy_gb = 2.0 * big as f64 / median_secs(a.reps, || dst.copy_from_slice(&src)) / 1e9;
    println!(
        "CPU, {} threads, {} kernels; y (M, N) = x (M, K) f32 @ W^T; the same kernel over FP8 (E4M3, per-channel scales), bf16 and f32 weights; \
         weight GB/s counts the weight bytes read once; copy of 64 MiB: {copy_gb:.1} GB/s (read + write); \
         medians of {reps} rounds in which the three weight types take turns (the gemm crate's product after them)\n",
        rayon::current_num_threads(),
        simd.name(),
    );
    let mut t = Table::new(&[
        "KxN",
        "M",
        "weights",
        "ms",
        "weight GB/s",
        "vs copy",
        "fp8 speedup",
    ]);
    let mut out = Vec::new();
    for (k, n) in kns {
        let w = gaussian(n * k, 2, 1.0 / (k as f32).sqrt());
        let q = Fp8Weight::quantize(&w, n, k, Format::E4M3, WeightScaling::Channel)?;
        let wb: Vec<bf16> = w.iter().map(|&v| bf16::from_f32(v)).collect();
        for &m in &ms {
            let x = Tensor::from_f32(&[m, k], gaussian(m * k, 3, 1.0))?;
            let kinds: [(&str, WeightRef<'_>, usize); 3] = [
                ("fp8 e4m3", WeightRef::Fp8(&q), q.bytes()),
                ("bf16", WeightRef::Bf16(&wb, n, k), 2 * n * k),
                ("f32", WeightRef::F32(&w, n, k), 4 * n * k),
            ];
            // The three weight types take turns, one run each per round, so
            // that a slow phase of a shared machine lands on all of them
            // alike. The gemm crate's product, a reference only, runs after
            // them: run between them it slowed the FP8 product that followed
            // it in some rounds (its large packing buffers), and only FP8's.
            let xs = x.to_f32_vec();
            let mut secs = vec![Vec::with_capacity(reps); kinds.len() + 1];
            for round in 0..=reps {
                for (i, (_, wr, _)) in kinds.iter().enumerate() {
                    let s = std::time::Instant::now();
                    std::hint::black_box(matmul_weights(&x, wr)?);
                    if round > 0 {
                        secs[i].push(s.elapsed().as_secs_f64());
                    }
                }
            }
            for round in 0..=reps {
                let s = std::time::Instant::now();
                std::hint::black_box(cpu::sgemm(m, n, k, &xs, false, &w, true));
                if round > 0 {
                    secs[kinds.len()].push(s.elapsed().as_secs_f64());
                }
            }
            let times: Vec<f64> = secs
                .iter_mut()
                .map(|v| {
                    v.sort_by(f64::total_cmp);
                    v[v.len() / 2]
                })
                .collect();
            for ((label, _, bytes), &s) in kinds.iter().zip(&times) {
                let gbs = *bytes as f64 / s / 1e9;
                t.row(vec![
                    format!("{k}x{n}"),
                    m.to_string(),
                    label.to_string(),
                    format!("{:.3}", s * 1e3),
                    format!("{gbs:.1}"),
                    format!("{:.2}", gbs / (copy_gb / 2.0)),
                    if *label == "fp8 e4m3" {
                        "-".into()
                    } else {
                        format!("{:.2}x", s / times[0])
                    },
                ]);
                out.push(json!({"k": k, "n": n, "m": m, "weights": label, "ms": s * 1e3, "weight_gb_s": gbs, "copy_gb_s": copy_gb, "fp8_speedup": s / times[0], "cpu_simd": simd.name()}));
            }
            // The plain high-precision product (gemm crate, f32 weights) for reference.
            let s = times[kinds.len()];
            t.row(vec![
                format!("{k}x{n}"),
                m.to_string(),
                "f32 sgemm (gemm crate)".into(),
                format!("{:.3}", s * 1e3),
                format!("{:.1}", (4 * n * k) as f64 / s / 1e9),
                "-".into(),
                format!("{:.2}x", s / times[0]),
            ]);
            out.push(json!({"k": k, "n": n, "m": m, "weights": "f32 sgemm", "ms": s * 1e3, "fp8_speedup": s / times[0]}));
        }
    }
    t.print();
    println!("\nfp8 speedup = time of that row / time of the FP8 row at the same shape (>1: FP8 is faster)");
    Ok(json!(out))
}

//! The CUDA side of the CLI: `selftest --device cuda`, `bench ... --device cuda`, device listing.

use crate::util::{write_json, Table};
use octet_cuda::Gpu;
use octet_nn::conformance;
use serde_json::json;
use std::path::Path;

/// Open the GPU for `--device`: `cuda` must succeed, `auto` may fall back to the CPU.
pub fn open(device: &str) -> anyhow::Result<Option<Gpu>> {
    match device {
        "cpu" => Ok(None),
        "cuda" => Ok(Some(Gpu::open(0).map_err(|e| {
            let hint = match e {
                octet_cuda::Error::NoDevice(_) => "; --device cpu runs on the CPU",
                _ => "",
            };
            anyhow::anyhow!("--device cuda: {e}{hint}")
        })?)),
        // No driver or no GPU octet takes: the CPU, quietly. A GPU that is
        // there but cannot be used (a toolkit piece missing, the probe of
        // its FP8 conversions failing): the CPU, saying why.
        "auto" => match Gpu::open(0) {
            Ok(g) => Ok(Some(g)),
            Err(octet_cuda::Error::NoDevice(why)) => {
                tracing::debug!(%why, "--device auto: no GPU, running on the CPU");
                Ok(None)
            }
            Err(e) => {
                println!("--device auto: running on the CPU, the GPU cannot be used: {e}");
                Ok(None)
            }
        },
        other => anyhow::bail!("--device {other}: expected cpu, cuda or auto"),
    }
}

/// [`open`] for `octet selftest`, which compares a GPU with the CPU and so
/// has nothing to run on the CPU alone: no hint to use `--device cpu`.
pub fn open_for_selftest(device: &str) -> anyhow::Result<Option<Gpu>> {
    match device {
        "cpu" => Ok(None),
        "cuda" => Ok(Some(
            Gpu::open(0).map_err(|e| anyhow::anyhow!("--device cuda: {e}"))?,
        )),
        other => open(other),
    }
}

/// [`open`] for a run that multiplies in FP8 when `fp8_use` names the flag
/// that asks for it (e.g. `--recipe tensorwise`), on a GPU without FP8 GEMMs
/// (Ampere, or `OCTET_FP8_GEMM=off`): `--device cuda` is an error that says
/// what runs there instead (rather than one at step 1); `--device auto` runs
/// on the CPU, and says so.
pub fn open_for(device: &str, fp8_use: Option<&str>) -> anyhow::Result<Option<Gpu>> {
    fp8_gate(open(device)?, device, fp8_use)
}

/// The check of [`open_for`] on an opened GPU (or none).
pub fn fp8_gate(
    gpu: Option<Gpu>,
    device: &str,
    fp8_use: Option<&str>,
) -> anyhow::Result<Option<Gpu>> {
    if let (Some(g), Some(what)) = (&gpu, fp8_use) {
        let info = g.device_info()?;
        if !info.fp8_gemm {
            if device == "auto" {
                println!("--device auto: {what} runs on the CPU, because this GPU has no FP8 GEMMs ({info})");
                return Ok(None);
            }
            let (major, minor) = info.compute_capability;
            anyhow::bail!(
                "{what} multiplies in FP8, and this GPU (compute capability {major}.{minor}) has no FP8 \
                 GEMMs (FP8 tensor cores need 8.9 or later; or OCTET_FP8_GEMM=off is set). Here, \
                 train with --recipe bf16, fine-tune with --compute bf16 (the FP8 base upcast inside \
                 the kernel), or run on the CPU with --device cpu"
            );
        }
    }
    Ok(gpu)
}

/// The check of a model's shape on an opened GPU (or none): a config the GPU
/// training model (`decode` false: [`octet_nn::llama::cuda::unsupported_config`])
/// or the GPU decoder (`decode` true:
/// [`octet_nn::decode::cuda::unsupported_config`]) cannot run (a head width
/// past their attention kernels') is an error under `--device cuda` that says
/// the CPU runs it, and under `--device auto` runs on the CPU, saying so.
pub fn model_gate(
    gpu: Option<Gpu>,
    device: &str,
    cfg: &octet_nn::LlamaConfig,
    decode: bool,
) -> anyhow::Result<Option<Gpu>> {
    let why = match decode {
        true => octet_nn::decode::cuda::unsupported_config(cfg),
        false => octet_nn::llama::cuda::unsupported_config(cfg),
    };
    match (&gpu, why) {
        (Some(_), Some(why)) if device == "auto" => {
            println!("--device auto: running on the CPU: {why}");
            Ok(None)
        }
        (Some(_), Some(why)) => anyhow::bail!("--device {device}: {why}"),
        _ => Ok(gpu),
    }
}

/// One line about the GPU, or why there is none.
pub fn describe() -> String {
    match Gpu::open(0) {
        Ok(g) => format!(
            "cuda: {} (per recipe: see the recipes table)",
            g.info().unwrap_or_else(|e| e.to_string())
        ),
        Err(e) => format!("cuda: none ({e})"),
    }
}

/// What the CUDA backend of this build does for a recipe on a GPU with FP8
/// tensor cores (sm_89 and later; block-scaled MX/NVFP4 GEMMs would need
/// sm_100, and octet emulates them there too). Ampere GPUs refuse the native
/// ones ([`octet_cuda::recipe_uses_fp8_gemm`]).
/// Every recipe listed as native or emulated runs in `octet_nn::linear::cuda::GpuLinear`
/// with each backward mode it supports (checked by `octet selftest`).
pub fn recipe_support(name: &str) -> (&'static str, &'static str) {
    match name {
        "tensorwise" => ("FP8 GEMMs", "fused quantize + cuBLASLt FP8 GEMM"),
        "delayed" => ("FP8 GEMMs", "one-pass quantize with the given scale, amax history updated on the device, cuBLASLt FP8 GEMM"),
        "blockwise" => ("FP8 GEMMs", "1x128 and 128x128 quantize + cuBLASLt block-scaled FP8 GEMMs (widths multiples of 16; a reduction dim short of a multiple of 128 is zero-padded for the call)"),
        "rowwise" => ("FP8 GEMMs", "fused row-wise quantize (both copies) + cuBLASLt outer-vector FP8 GEMM"),
        "mxfp8" => ("emulated", "bit-exact MX quantize (E8M0 1x32), exact dequantize to bf16, bf16 GEMM (native MX GEMMs need sm_100, for which octet has no path yet)"),
        "nvfp4" => ("emulated", "bit-exact NVFP4 quantize (stochastic rounding included), exact dequantize to bf16, bf16 GEMM (native FP4 GEMMs need sm_100, for which octet has no path yet)"),
        _ => ("no", "CPU reference only"),
    }
}

pub fn selftest(gpu: &mut Gpu, scope: conformance::Scope) -> anyhow::Result<()> {
    println!("octet selftest on {}\n", gpu.info()?);
    let (cases, skipped) = conformance::selftest_groups(gpu, scope)?;
    let mut t = Table::new(&["case", "result", "worst"]);
    for c in &cases {
        t.row(vec![
            c.name.clone(),
            if c.pass { "pass" } else { "FAIL" }.into(),
            c.worst.clone(),
        ]);
    }
    t.print();
    let failed = cases.iter().filter(|c| !c.pass).count();
    anyhow::ensure!(
        failed == 0,
        "{failed} of {} conformance cases failed",
        cases.len()
    );
    println!("\nall {} cases pass", cases.len());
    if !skipped.is_empty() {
        println!(
            "{} cases or groups skipped: they need FP8 GEMMs, which this GPU lacks (or OCTET_FP8_GEMM=off):\n  {}",
            skipped.len(),
            skipped.join("\n  ")
        );
    }
    Ok(())
}

/// `bench mixed --device cuda`.
pub fn bench_mixed(
    gpu: &mut Gpu,
    ms: &[usize],
    kns: &[(usize, usize)],
    json_path: Option<&Path>,
) -> anyhow::Result<()> {
    println!(
        "octet bench mixed on {}: medians of CUDA-event timings\n",
        gpu.info()?
    );
    let rows = octet_cuda::bench::bench_mixed(gpu, ms, kns)?;
    print_rows(&rows, json_path, "octet bench mixed --device cuda")
}

/// `bench attention --device cuda`.
pub fn bench_attention(
    gpu: &mut Gpu,
    shapes: &[(usize, usize, usize, usize)],
    json_path: Option<&Path>,
) -> anyhow::Result<()> {
    println!(
        "octet bench attention on {}: medians of CUDA-event timings\n",
        gpu.info()?
    );
    let rows = octet_nn::bench::bench_attention(gpu, shapes)?;
    print_rows(&rows, json_path, "octet bench attention --device cuda")
}

fn print_rows(
    rows: &[octet_cuda::BenchRow],
    json_path: Option<&Path>,
    what: &str,
) -> anyhow::Result<()> {
    let mut t = Table::new(&["op", "ms", "rate", "unit", "ratio", "vs"]);
    for r in rows {
        t.row(vec![
            r.name.clone(),
            format!("{:.4}", r.ms),
            format!("{:.1}", r.rate),
            r.unit.into(),
            format!("{:.2}", r.ratio),
            r.vs.clone(),
        ]);
    }
    t.print();
    if let Some(p) = json_path {
        let v: Vec<_> = rows.iter().map(|r| json!({"op": r.name, "ms": r.ms, "rate": r.rate, "unit": r.unit, "ratio": r.ratio, "vs": r.vs})).collect();
        write_json(p, what, &json!(v))?;
    }
    Ok(())
}

/// Which part of the GPU benchmark suite [`bench()`] runs.
pub enum Suite {
    /// Copy floor, quantizes, GEMMs at these `(m, k, n)`, and `Linear` at four shapes.
    All(Vec<(usize, usize, usize)>),
    /// The quantize kernels on one `(rows, cols)` matrix, with the copy floor.
    Quantize(usize, usize),
    /// `Linear` forward + backward per recipe at these `(m, k, n)`.
    Linear(Vec<(usize, usize, usize)>),
}

/// Run `suite` on the GPU, print its table, and write it as JSON.
pub fn bench(gpu: &mut Gpu, suite: Suite, json_path: Option<&Path>) -> anyhow::Result<()> {
    println!(
        "octet bench on {}: medians of CUDA-event timings\n",
        gpu.info()?
    );
    let rows = match suite {
        Suite::All(shapes) => {
            let mut rows = octet_cuda::bench(gpu, &shapes)?;
            let linear = [
                (16384, 4096, 14336),
                (8192, 8192, 8192),
                (4096, 4096, 4096),
                (2048, 4096, 4096),
            ];
            rows.extend(octet_cuda::bench_linear(gpu, &linear)?);
            rows
        }
        Suite::Quantize(r, c) => octet_cuda::bench::bench_quantize(gpu, r, c)?,
        Suite::Linear(shapes) => octet_cuda::bench_linear(gpu, &shapes)?,
    };
    let mut t = Table::new(&["op", "ms", "rate", "unit", "ratio", "vs"]);
    for r in &rows {
        t.row(vec![
            r.name.clone(),
            format!("{:.3}", r.ms),
            format!("{:.1}", r.rate),
            r.unit.into(),
            format!("{:.2}", r.ratio),
            r.vs.clone(),
        ]);
    }
    t.print();
    if let Some(p) = json_path {
        let v: Vec<_> = rows.iter().map(|r| json!({"op": r.name, "ms": r.ms, "rate": r.rate, "unit": r.unit, "ratio": r.ratio, "vs": r.vs})).collect();
        write_json(p, "octet bench --device cuda", &json!(v))?;
    }
    Ok(())
}

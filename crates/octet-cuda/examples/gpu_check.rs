//! GPU check: the conformance suite, then the benchmarks, printed as tables
//! and written as JSON.
//!
//! ```text
//! cargo build --release -p octet-cuda --example gpu_check
//! gpu_check [OUT.json] [--quick]
//! ```
//! Exits non-zero when a case fails or no GPU can be opened.

use octet_cuda::{bench, BenchRow, CaseResult, Gpu};
use serde_json::json;

fn table(header: &[&str], rows: &[Vec<String>]) {
    let mut w: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            w[i] = w[i].max(c.len());
        }
    }
    let line = |cells: Vec<String>| {
        let s: Vec<String> = cells
            .iter()
            .enumerate()
            .map(|(i, c)| {
                if i == 0 {
                    format!("{c:<0$}", w[i])
                } else {
                    format!("{c:>0$}", w[i])
                }
            })
            .collect();
        println!("{}", s.join("  "));
    };
    line(header.iter().map(|s| s.to_string()).collect());
    line(w.iter().map(|&n| "-".repeat(n)).collect());
    for r in rows {
        line(r.clone());
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--quick");
    let json_path = args.iter().find(|a| !a.starts_with("--")).cloned();
    if let Err(e) = run(json_path.as_deref(), quick) {
        eprintln!("gpu_check: {e}");
        std::process::exit(1);
    }
}

fn run(json_path: Option<&str>, quick: bool) -> Result<(), Box<dyn std::error::Error>> {
    let t0 = std::time::Instant::now();
    let gpu = Gpu::open(0)?;
    let info = gpu.device_info()?;
    println!(
        "gpu_check on {info} (open + kernel compile/cache: {:.2} s)\n",
        t0.elapsed().as_secs_f64()
    );

    let t = std::time::Instant::now();
    let cases: Vec<CaseResult> = octet_cuda::selftest(&gpu)?;
    let rows: Vec<Vec<String>> = cases
        .iter()
        .map(|c| {
            vec![
                c.name.clone(),
                if c.pass { "pass" } else { "FAIL" }.into(),
                c.worst.clone(),
            ]
        })
        .collect();
    table(&["case", "result", "worst"], &rows);
    let failed = cases.iter().filter(|c| !c.pass).count();
    println!(
        "\nselftest: {} of {} pass ({:.1} s)\n",
        cases.len() - failed,
        cases.len(),
        t.elapsed().as_secs_f64()
    );

    let gemm_shapes: Vec<(usize, usize, usize)> = if quick {
        vec![(4096, 4096, 4096)]
    } else {
        vec![
            (8192, 8192, 8192),
            (4096, 4096, 4096),
            (16384, 4096, 14336),
            (16384, 14336, 4096),
            (2048, 4096, 4096),
            (128, 4096, 4096),
        ]
    };
    let linear: Vec<(usize, usize, usize)> = if quick {
        vec![(4096, 4096, 4096)]
    } else {
        vec![
            (16384, 4096, 14336),
            (8192, 8192, 8192),
            (4096, 4096, 4096),
            (2048, 4096, 4096),
        ]
    };
    let t = std::time::Instant::now();
    let mut bench_rows: Vec<BenchRow> = bench::bench(&gpu, &gemm_shapes)?;
    bench_rows.extend(bench::bench_linear(&gpu, &linear)?);
    let rows: Vec<Vec<String>> = bench_rows
        .iter()
        .map(|r| {
            vec![
                r.name.clone(),
                format!("{:.4}", r.ms),
                format!("{:.1}", r.rate),
                r.unit.into(),
                format!("{:.3}", r.ratio),
                r.vs.clone(),
            ]
        })
        .collect();
    println!(
        "bench: medians of CUDA-event timings ({:.1} s)\n",
        t.elapsed().as_secs_f64()
    );
    table(&["op", "ms", "rate", "unit", "ratio", "vs"], &rows);

    if let Some(p) = json_path {
        let v = json!({
            "device": info.to_string(),
            "selftest": cases.iter().map(|c| json!({"case": c.name, "pass": c.pass, "worst": c.worst})).collect::<Vec<_>>(),
            "bench": bench_rows.iter().map(|r| json!({"op": r.name, "ms": r.ms, "rate": r.rate, "unit": r.unit, "ratio": r.ratio, "vs": r.vs})).collect::<Vec<_>>(),
        });
        std::fs::write(p, serde_json::to_string_pretty(&v)?)?;
        println!("\nwrote {p}");
    }
    if failed > 0 {
        return Err(format!("{failed} conformance case(s) failed").into());
    }
    Ok(())
}

//! Small helpers: timing, tables, random data, dates, JSON output.

use anyhow::Context;
use rand::{Rng, SeedableRng};
use rand_distr::StandardNormal;
use std::path::Path;
use std::time::Instant;

/// Median seconds of `reps` runs of `f` after one warm-up run.
pub fn median_secs(reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    let mut t: Vec<f64> = (0..reps.max(1))
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed().as_secs_f64()
        })
        .collect();
    t.sort_by(f64::total_cmp);
    t[t.len() / 2]
}

/// Seeded Gaussian data (never zeros).
pub fn gaussian(n: usize, seed: u64, std: f32) -> Vec<f32> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..n)
        .map(|_| rng.sample::<f32, _>(StandardNormal) * std)
        .collect()
}

/// A plain-text table: the first column left-aligned, the others right-aligned
/// (numbers), or every column left-aligned ([`Table::text`]).
pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
    text: bool,
}

impl Table {
    pub fn new(header: &[&str]) -> Table {
        Table {
            header: header.iter().map(|s| s.to_string()).collect(),
            rows: Vec::new(),
            text: false,
        }
    }

    /// The same table with every column left-aligned, for words.
    pub fn text(mut self) -> Table {
        self.text = true;
        self
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    pub fn print(&self) {
        let n = self.header.len();
        let mut w = vec![0; n];
        for r in std::iter::once(&self.header).chain(&self.rows) {
            for (i, c) in r.iter().enumerate().take(n) {
                w[i] = w[i].max(c.chars().count());
            }
        }
        let line = |r: &Vec<String>| {
            let cells: Vec<String> = r
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    if i == 0 || self.text {
                        format!("{c:<width$}", width = w[i])
                    } else {
                        format!("{c:>width$}", width = w[i])
                    }
                })
                .collect();
            println!("{}", cells.join("  ").trim_end());
        };
        line(&self.header);
        println!(
            "{}",
            w.iter()
                .map(|&x| "-".repeat(x))
                .collect::<Vec<_>>()
                .join("  ")
        );
        self.rows.iter().for_each(line);
    }
}

/// Today's date (UTC) as YYYY-MM-DD, from the system clock.
pub fn today() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    date_from_unix(secs)
}

/// YYYY-MM-DD (UTC) of a Unix time in seconds.
fn date_from_unix(secs: u64) -> String {
    // Civil-from-days (Howard Hinnant's algorithm).
    let z = (secs / 86400) as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

/// The CPU model as Linux names it in /proc/cpuinfo.
fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into())
}

/// The machine as a JSON object: architecture, OS, worker threads, CPU model.
pub fn machine() -> serde_json::Value {
    serde_json::json!({
        "arch": std::env::consts::ARCH,
        "os": std::env::consts::OS,
        "threads": rayon::current_num_threads(),
        "cpu": cpu_model(),
    })
}

/// Write `rows` with run metadata (`date`, `machine`, `command`) as pretty JSON.
pub fn write_json(path: &Path, command: &str, rows: &serde_json::Value) -> anyhow::Result<()> {
    let doc = serde_json::json!({"date": today(), "machine": machine(), "command": command, "rows": rows});
    let text = serde_json::to_string_pretty(&doc)?;
    // The error names the path already ("writing PATH: ..."); it is no checkpoint's.
    octet_train::checkpoint::write_atomic(path, text.as_bytes()).map_err(|e| match e {
        octet_train::Error::Checkpoint(m) => anyhow::anyhow!(m),
        e => e.into(),
    })?;
    println!("wrote {}", path.display());
    Ok(())
}

/// An error now, not after a long benchmark, where `--json PATH` cannot be
/// written: a file beside it (`PATH.tmp`, as the atomic write makes) is
/// created and removed.
pub fn check_json_path(path: &Path) -> anyhow::Result<()> {
    let mut probe = path.as_os_str().to_owned();
    probe.push(".tmp");
    let probe = std::path::PathBuf::from(probe);
    std::fs::File::create(&probe)
        .map_err(|e| anyhow::anyhow!("--json {}: cannot write there ({e})", path.display()))?;
    let _ = std::fs::remove_file(&probe);
    Ok(())
}

/// Transpose of a row-major (rows, cols) matrix.
pub fn transpose(a: &[f64], rows: usize, cols: usize) -> Vec<f64> {
    let mut t = vec![0.0; a.len()];
    for r in 0..rows {
        for c in 0..cols {
            t[c * rows + r] = a[r * cols + c];
        }
    }
    t
}

/// `a (m, k) @ b^T` with `b` stored (n, k): a plain f64 triple loop, written
/// here rather than taken from octet-tensor so that the demo's reference does
/// not share code with the kernels it checks. Returns (m, n).
pub fn ref_matmul_nt(m: usize, k: usize, n: usize, a: &[f64], b: &[f64]) -> Vec<f64> {
    assert_eq!((a.len(), b.len()), (m * k, n * k), "ref_matmul_nt shapes");
    let mut c = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            let mut acc = 0.0;
            for p in 0..k {
                acc += a[i * k + p] * b[j * k + p];
            }
            c[i * n + j] = acc;
        }
    }
    c
}

/// Largest matrix the benchmarks and the demo take from the command line:
/// 2^31 elements per operand (8 GiB of f32; the default GPU shapes reach
/// 16384x14336, about 2^28). Bigger products overflow or exhaust memory.
pub const MAX_ELEMENTS: usize = 1 << 31;

/// Check a `rows x cols` matrix (named by `what` in the error) has at most
/// [`MAX_ELEMENTS`] elements, with an overflow-checked product.
pub fn check_matrix(rows: usize, cols: usize, what: &str) -> anyhow::Result<()> {
    anyhow::ensure!(
        rows.checked_mul(cols).is_some_and(|n| n <= MAX_ELEMENTS),
        "{what}: a {rows}x{cols} matrix exceeds the limit of {MAX_ELEMENTS} elements"
    );
    Ok(())
}

/// Parse `RxC` into a pair of positive sizes whose product is at most [`MAX_ELEMENTS`].
pub fn parse_dims2(s: &str) -> anyhow::Result<(usize, usize)> {
    let d: Vec<usize> = s
        .trim()
        .split('x')
        .map(|x| {
            x.parse::<usize>()
                .with_context(|| format!("'{s}': '{x}' is not a number"))
        })
        .collect::<anyhow::Result<_>>()?;
    match d[..] {
        [r, c] if r > 0 && c > 0 => {
            check_matrix(r, c, &format!("'{}'", s.trim()))?;
            Ok((r, c))
        }
        _ => anyhow::bail!("'{s}': expected RxC with two positive numbers"),
    }
}

/// Parse a comma-separated list of `n` positive numbers joined by `x`
/// (`form` names them in errors, e.g. `MxKxN`).
fn parse_dim_list(s: &str, n: usize, form: &str) -> anyhow::Result<Vec<Vec<usize>>> {
    s.split(',')
        .map(|item| {
            let d: Vec<usize> = item
                .trim()
                .split('x')
                .map(|x| {
                    x.parse::<usize>()
                        .with_context(|| format!("'{item}': '{x}' is not a number"))
                })
                .collect::<anyhow::Result<_>>()?;
            anyhow::ensure!(
                d.len() == n && d.iter().all(|&v| v > 0),
                "'{item}': expected {form} with {n} positive numbers"
            );
            Ok(d)
        })
        .collect()
}

/// Parse `MxKxN[,MxKxN...]`; each of the GEMM's matrices (M x K, K x N,
/// M x N) has at most [`MAX_ELEMENTS`] elements.
pub fn parse_shapes(s: &str) -> anyhow::Result<Vec<(usize, usize, usize)>> {
    parse_dim_list(s, 3, "MxKxN")?
        .into_iter()
        .map(|d| {
            let (m, k, n) = (d[0], d[1], d[2]);
            let what = format!("'{m}x{k}x{n}'");
            check_matrix(m, k, &what)?;
            check_matrix(k, n, &what)?;
            check_matrix(m, n, &what)?;
            Ok((m, k, n))
        })
        .collect()
}

/// Parse `BxTxHxD[,BxTxHxD...]` (attention shapes: batch, sequence, heads,
/// head dim); each `B*T*H*D` is at most [`MAX_ELEMENTS`].
pub fn parse_attention_shapes(s: &str) -> anyhow::Result<Vec<(usize, usize, usize, usize)>> {
    parse_dim_list(s, 4, "BxTxHxD")?
        .into_iter()
        .map(|d| {
            let (b, t, h, hd) = (d[0], d[1], d[2], d[3]);
            let what = format!("'{b}x{t}x{h}x{hd}'");
            let rows = b
                .checked_mul(t)
                .and_then(|n| n.checked_mul(h))
                .ok_or_else(|| anyhow::anyhow!("{what}: B*T*H overflows"))?;
            check_matrix(rows, hd, &what)?;
            Ok((b, t, h, hd))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_parse_and_reject() {
        assert_eq!(
            parse_shapes("512x256x128, 1x2x3").unwrap(),
            vec![(512, 256, 128), (1, 2, 3)]
        );
        for bad in ["", "512x512", "0x4x4", "4x4x4x4", "axbxc", "4x4x4,"] {
            assert!(parse_shapes(bad).is_err(), "{bad:?} should be rejected");
        }
        assert_eq!(parse_dims2("4096x2048").unwrap(), (4096, 2048));
        assert!(parse_dims2("4096").is_err());
    }

    #[test]
    fn shapes_whose_products_overflow_or_exceed_the_cap_are_errors() {
        let e = parse_dims2("4294967296x4294967296").unwrap_err();
        assert!(e.to_string().contains("limit"), "{e}");
        assert!(parse_dims2("65536x32769").is_err());
        assert!(parse_dims2("65536x32768").is_ok());
        for bad in [
            "4294967296x4294967296x1",
            "1x4294967296x4294967296",
            "4294967296x1x4294967296",
            "18446744073709551615x2x2",
        ] {
            let e = parse_shapes(bad).unwrap_err();
            assert!(e.to_string().contains("limit"), "{bad}: {e}");
        }
        assert!(parse_attention_shapes("65536x65536x65536x65536").is_err());
        assert!(parse_attention_shapes("4x2048x16x128").is_ok());
    }

    #[test]
    fn reference_gemm_and_transpose() {
        // (2, 3) @ ((2, 3))^T = (2, 2)
        let a = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        let b = [1.0, 0.0, -1.0, 2.0, 1.0, 0.5];
        assert_eq!(ref_matmul_nt(2, 3, 2, &a, &b), vec![-2.0, 5.5, -2.0, 16.0]);
        assert_eq!(transpose(&a, 2, 3), vec![1.0, 4.0, 2.0, 5.0, 3.0, 6.0]);
    }

    #[test]
    fn dates() {
        assert_eq!(date_from_unix(0), "1970-01-01");
        assert_eq!(date_from_unix(951_782_400), "2000-02-29");
        assert_eq!(date_from_unix(1_767_225_599), "2025-12-31");
    }
}

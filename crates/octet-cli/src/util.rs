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

/// A plain-text table with right-aligned numeric columns.
pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(header: &[&str]) -> Table {
        Table {
            header: header.iter().map(|s| s.to_string()).collect(),
            rows: Vec::new(),
        }
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
                    if i == 0 {
                        format!("{c:<width$}", width = w[i])
                    } else {
                        format!("{c:>width$}", width = w[i])
                    }
                })
                .collect();
            println!("{}", cells.join("  "));
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

/// The machine in a line: architecture, logical CPUs, and the CPU model where Linux says it.
pub fn machine() -> String {
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    format!(
        "{} {} ({} threads)",
        std::env::consts::ARCH,
        model,
        rayon::current_num_threads()
    )
}

/// Write `rows` with run metadata as pretty JSON.
pub fn write_json(path: &Path, command: &str, rows: &serde_json::Value) -> anyhow::Result<()> {
    let doc = serde_json::json!({"date": today(), "machine": machine(), "command": command, "rows": rows});
    let text = serde_json::to_string_pretty(&doc)?;
    octet_train::checkpoint::write_atomic(path, text.as_bytes())
        .with_context(|| format!("writing {}", path.display()))?;
    println!("wrote {}", path.display());
    Ok(())
}

/// Parse `MxKxN,...` into triples.
pub fn parse_shapes(s: &str) -> anyhow::Result<Vec<(usize, usize, usize)>> {
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
            match d[..] {
                [m, k, n] if m > 0 && k > 0 && n > 0 => Ok((m, k, n)),
                _ => anyhow::bail!("'{item}': expected MxKxN with three positive numbers"),
            }
        })
        .collect()
}

//! Metrics as JSON lines: one object per logged step or evaluation.

use crate::{Error, Result};
use std::io::Write;
use std::path::Path;

/// What one training step reports.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct StepMetrics {
    /// Step index (1-based: steps completed).
    pub step: u64,
    /// Mean training loss over the step's micro-batches.
    pub loss: f64,
    /// Validation loss, on evaluation steps.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub val_loss: Option<f64>,
    /// Learning rate used.
    pub lr: f32,
    /// Global gradient norm before clipping.
    pub grad_norm: f32,
    /// Tokens per second of this step.
    pub tokens_per_s: f64,
    /// Seconds since the run started.
    pub elapsed_s: f64,
    /// Bytes the forward kept for backward (summed over micro-batches' peak).
    pub saved_bytes: usize,
    /// Device memory in use at the step's peak (GPU runs: the driver's
    /// used bytes, which include memory the allocator keeps for reuse).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_bytes: Option<usize>,
    /// GPU: the most bytes allocations held at once so far (the memory pool's
    /// high-water mark, as PyTorch's `max_memory_allocated`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocated_bytes: Option<usize>,
    /// GPU: the most bytes the memory pool held from the driver at once so
    /// far, allocated or cached for reuse (PyTorch's `max_memory_reserved`).
    /// `device_bytes` is this plus what lies outside the pool (the context,
    /// kernel code, cuBLASLt's workspace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reserved_bytes: Option<usize>,
}

/// `(step, loss)` points of a curve, by step.
pub type Curve = Vec<(f64, f64)>;

/// The training and validation loss curves, `(step, loss)` by step, up to
/// step `upto` of the run that wrote the checkpoint `ckpt`
/// (`RUN/checkpoints/step_N`: the step records of `RUN/metrics.jsonl`): what
/// a resumed run's `loss.png` starts from, so that it shows the steps before
/// the checkpoint too, as the uninterrupted run's does. Where a step was
/// written more than once (a run repeated into the same directory) its last
/// record counts. Lines that are not step records (telemetry) are skipped; a
/// file that cannot be read gives no points.
pub fn curves_before(ckpt: &Path, upto: u64) -> (Curve, Curve) {
    match ckpt.parent().and_then(Path::parent) {
        Some(run) => curves_of_run(run, upto),
        None => (Vec::new(), Vec::new()),
    }
}

/// The training and validation loss curves of the run directory `run` up to
/// step `upto`, from its `metrics.jsonl`, as [`curves_before`] reads them.
pub fn curves_of_run(run: &Path, upto: u64) -> (Curve, Curve) {
    let text = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap_or_default();
    let mut steps = std::collections::BTreeMap::new();
    for m in text
        .lines()
        .filter_map(|l| serde_json::from_str::<StepMetrics>(l).ok())
        .filter(|m| m.step <= upto)
    {
        steps.insert(m.step, m);
    }
    let train = steps.values().map(|m| (m.step as f64, m.loss)).collect();
    let val = steps
        .values()
        .filter_map(|m| m.val_loss.map(|v| (m.step as f64, v)))
        .collect();
    (train, val)
}

/// The metrics line of one step's per-layer telemetry, `{"step", "telemetry":
/// [{"layer", "role", "amax", "saturated", "underflowed"}, ...]}`, as every
/// trainer writes it (one process, sharded, GPU); `None` without layers.
pub fn telemetry_record(
    step: u64,
    layers: Vec<(String, octet_fp8::Role, octet_fp8::Telemetry)>,
) -> Option<serde_json::Value> {
    let layers: Vec<serde_json::Value> = layers
        .into_iter()
        .map(|(name, role, t)| {
            serde_json::json!({"layer": name, "role": format!("{role:?}"), "amax": t.amax,
                "saturated": t.saturated, "underflowed": t.underflowed})
        })
        .collect();
    (!layers.is_empty()).then(|| serde_json::json!({"step": step, "telemetry": layers}))
}

/// Appends JSON lines to a file, one whole line per record.
///
/// Every trainer (CPU, GPU, sharded) opens its `metrics.jsonl` through
/// [`MetricsWriter::open`], so that a resumed run never appends after a torn
/// line.
pub struct MetricsWriter {
    file: std::fs::File,
    path: std::path::PathBuf,
}

impl MetricsWriter {
    /// Open (append) `path`, creating its directory; errors name the path.
    ///
    /// A last line without its newline (a kill or a full disk in the middle
    /// of an append) is cut off first, with a warning naming the file and the
    /// bytes dropped: a record appended after it would join it into one line
    /// that parses as neither.
    pub fn open(path: &Path) -> Result<MetricsWriter> {
        if let Some(d) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            crate::create_dir_all(d)?;
        }
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .read(true)
            .append(true)
            .open(path)
            .map_err(Error::file("opening", path))?;
        let dropped = cut_torn_line(&mut file).map_err(Error::file("repairing", path))?;
        if dropped > 0 {
            tracing::warn!(
                "{}: cut off a torn last line of {dropped} bytes (a record cut short by a kill \
                 or a full disk) before appending",
                path.display()
            );
        }
        Ok(MetricsWriter {
            file,
            path: path.to_path_buf(),
        })
    }

    /// Write one record as one line, in a single write of the whole line
    /// (record and newline), so that a kill leaves at most one torn line at
    /// the end, which the next [`MetricsWriter::open`] cuts off; an error
    /// names the file.
    pub fn write<T: serde::Serialize>(&mut self, record: &T) -> Result<()> {
        let mut line = serde_json::to_string(record).map_err(|e| Error::Train(e.to_string()))?;
        line.push('\n');
        self.file
            .write_all(line.as_bytes())
            .map_err(Error::file("writing", &self.path))
    }
}

/// Truncate `file` after its last newline; returns the bytes cut (0 where
/// the file is empty or ends in a newline). The tail is read backwards in
/// blocks, so a long file is not read whole.
fn cut_torn_line(file: &mut std::fs::File) -> std::io::Result<u64> {
    use std::io::{Read, Seek, SeekFrom};
    let len = file.metadata()?.len();
    let mut buf = vec![0u8; 64 * 1024];
    let mut end = len;
    while end > 0 {
        let start = end.saturating_sub(buf.len() as u64);
        let chunk = &mut buf[..(end - start) as usize];
        file.seek(SeekFrom::Start(start))?;
        file.read_exact(chunk)?;
        if let Some(i) = chunk.iter().rposition(|&b| b == b'\n') {
            end = start + i as u64 + 1;
            break;
        }
        end = start;
    }
    if end < len {
        file.set_len(end)?;
    }
    Ok(len - end)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(tag: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("octet-metrics-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d.join("metrics.jsonl")
    }

    #[test]
    fn reopening_cuts_a_torn_last_line_before_appending() {
        let p = tmp("torn");
        let whole = "{\"step\":1,\"loss\":2.0}\n";
        std::fs::write(&p, format!("{whole}{{\"step\":2,\"lo")).unwrap();
        let mut m = MetricsWriter::open(&p).unwrap();
        m.write(&serde_json::json!({"step": 2})).unwrap();
        let text = std::fs::read_to_string(&p).unwrap();
        assert_eq!(text, format!("{whole}{{\"step\":2}}\n"));
        for line in text.lines() {
            serde_json::from_str::<serde_json::Value>(line).expect(line);
        }
        let _ = std::fs::remove_dir_all(p.parent().unwrap());
    }

    #[test]
    fn a_torn_line_longer_than_a_read_block_is_cut_whole_and_whole_lines_are_kept() {
        let p = tmp("long");
        // No newline at all: the file is one torn record.
        std::fs::write(&p, vec![b'x'; 200_000]).unwrap();
        assert_eq!(cut_torn_line(&mut open_rw(&p)).unwrap(), 200_000);
        assert_eq!(std::fs::metadata(&p).unwrap().len(), 0);
        // A newline before a torn tail of several blocks.
        let mut bytes = b"{}\n".to_vec();
        bytes.extend(vec![b'y'; 150_000]);
        std::fs::write(&p, &bytes).unwrap();
        assert_eq!(cut_torn_line(&mut open_rw(&p)).unwrap(), 150_000);
        assert_eq!(std::fs::read(&p).unwrap(), b"{}\n");
        // A file that ends in a newline is left as it is.
        assert_eq!(cut_torn_line(&mut open_rw(&p)).unwrap(), 0);
        assert_eq!(std::fs::read(&p).unwrap(), b"{}\n");
        let _ = std::fs::remove_dir_all(p.parent().unwrap());
    }

    fn open_rw(p: &Path) -> std::fs::File {
        std::fs::OpenOptions::new()
            .read(true)
            .append(true)
            .open(p)
            .unwrap()
    }
}

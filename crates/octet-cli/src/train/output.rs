//! What a run prints: the progress bar, the summary table and the files written.

use super::*;

pub struct Bar {
    pub bar: ProgressBar,
}

impl Observer for Bar {
    fn step(&mut self, m: &StepMetrics, total: u64) {
        tracing::debug!(
            step = m.step,
            of = total,
            loss = m.loss,
            val_loss = m.val_loss,
            lr = m.lr,
            grad_norm = m.grad_norm,
            tokens_per_s = m.tokens_per_s,
            saved_bytes = m.saved_bytes,
            device_bytes = m.device_bytes,
            "step"
        );
        self.bar.set_length(total);
        self.bar.set_position(m.step);
        self.bar
            .set_message(format!("loss {:.4}  {:.0} tok/s", m.loss, m.tokens_per_s));
    }
    fn note(&mut self, msg: &str) {
        // A hidden bar (output not a terminal) drops println: print directly.
        if self.bar.is_hidden() {
            println!("{msg}");
        } else {
            self.bar.println(msg);
        }
    }
}

/// A progress bar for a run; hidden under `--verbose`, whose step lines
/// (tracing, on standard error) take its place.
pub fn bar(prefix: &str) -> Bar {
    let bar = if tracing::enabled!(tracing::Level::DEBUG) {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(1)
    };
    let style = ProgressStyle::with_template(
        "{prefix} [{elapsed_precise}] {bar:30} {pos}/{len} {msg} (eta {eta})",
    )
    .unwrap_or_else(|_| ProgressStyle::default_bar());
    bar.set_style(style);
    bar.set_prefix(prefix.to_string());
    Bar { bar }
}

pub fn summary_table(runs: &[RunSummary]) {
    let base = runs
        .iter()
        .find(|r| r.recipe == "bf16")
        .map(|r| r.final_val_loss);
    let mut t = Table::new(&[
        "recipe",
        "final train",
        "final val",
        "val vs bf16",
        "tokens/s",
        "peak saved MiB",
        "peak device GiB",
    ]);
    // No validation loss (`--eval-batches 0`): "-", not NaN.
    let val = |v: f64| v.is_finite().then_some(v);
    for r in runs {
        t.row(vec![
            r.recipe.clone(),
            format!("{:.4}", r.final_loss),
            val(r.final_val_loss).map_or("-".into(), |v| format!("{v:.4}")),
            match (base.and_then(val), val(r.final_val_loss)) {
                (Some(b), Some(v)) => format!("{:+.2}%", 100.0 * (v / b - 1.0)),
                _ => "-".into(),
            },
            format!("{:.0}", r.tokens_per_s),
            format!("{:.2}", r.peak_saved_bytes as f64 / (1 << 20) as f64),
            if r.peak_device_bytes > 0 {
                format!("{:.2}", r.peak_device_bytes as f64 / (1u64 << 30) as f64)
            } else {
                "-".into()
            },
        ]);
    }
    t.print();
}

/// What a finished run in `dir` wrote: the metrics, the plot, and the
/// checkpoints (`what` says more of them) unless `--no-save` left them out.
pub fn wrote(dir: &std::path::Path, save: bool, what: &str) -> String {
    match save {
        true => format!(
            "wrote {}/metrics.jsonl, loss.png, checkpoints/{what}",
            dir.display()
        ),
        false => format!(
            "wrote {}/metrics.jsonl, loss.png (no checkpoint: --no-save)",
            dir.display()
        ),
    }
}

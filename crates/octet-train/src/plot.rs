//! Loss curves as PNG (plotters, bitmap backend).
//!
//! Text is drawn with DejaVu Sans, embedded in the binary (the `dejavu`
//! crate), so that titles, axis labels and legends are there on any machine,
//! one without system fonts included.

use crate::{Error, Result};
use plotters::prelude::*;
use std::path::Path;
use std::sync::OnceLock;

/// Register the embedded sans-serif font once; whether plotters took it.
fn font_ready() -> bool {
    static READY: OnceLock<bool> = OnceLock::new();
    *READY.get_or_init(|| {
        plotters::style::register_font("sans-serif", FontStyle::Normal, dejavu::sans::regular())
            .is_ok()
    })
}

/// One named curve of `(x, y)` points.
pub struct Series {
    /// Legend label.
    pub name: String,
    /// Points, x ascending.
    pub points: Vec<(f64, f64)>,
}

/// Whether a point is drawn: both coordinates finite.
fn plottable(p: &(f64, f64)) -> bool {
    p.0.is_finite() && p.1.is_finite()
}

/// Draw `series` into a PNG at `path` (800x500) with a title and axis labels.
///
/// Points with a non-finite coordinate are left out; no point left, or values
/// whose span overflows f64, is an error naming the path.
pub fn line_plot(
    path: &Path,
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
) -> Result<()> {
    let err = |e: String| Error::Train(format!("plot {}: {e}", path.display()));
    let pts = series
        .iter()
        .flat_map(|s| s.points.iter())
        .filter(|p| plottable(p));
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for &(x, y) in pts {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y0 = y0.min(y);
        y1 = y1.max(y);
    }
    if x0 > x1 {
        return Err(err("no finite points to plot".into()));
    }
    if x1 == x0 {
        x1 = x0 + 1.0;
    }
    // Axes whose span overflows f64 make plotters' tick search loop forever.
    for (axis, lo, hi) in [("x", x0, x1), ("y", y0, y1)] {
        if !(hi - lo).is_finite() {
            return Err(err(format!(
                "{axis} values from {lo:e} to {hi:e} span more than an f64 holds"
            )));
        }
    }
    let pad = ((y1 - y0) * 0.05).max(1e-6);
    // The padding only where the padded span stays finite.
    let (y_lo, y_hi) = match (y0 - pad, y1 + pad) {
        (lo, hi) if (hi - lo).is_finite() => (lo, hi),
        _ => (y0, y1),
    };
    let text = font_ready();
    let root = BitMapBackend::new(path, (800, 500)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(e.to_string()))?;
    let mut builder = ChartBuilder::on(&root);
    builder.margin(15);
    if text {
        builder
            .caption(title, ("sans-serif", 22))
            .x_label_area_size(40)
            .y_label_area_size(60);
    }
    let mut chart = builder
        .build_cartesian_2d(x0..x1, y_lo..y_hi)
        .map_err(|e| err(e.to_string()))?;
    let mut mesh = chart.configure_mesh();
    if text {
        mesh.x_desc(x_label).y_desc(y_label);
    } else {
        mesh.disable_x_axis().disable_y_axis();
    }
    mesh.draw().map_err(|e| err(e.to_string()))?;
    for (i, s) in series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let line = chart
            .draw_series(LineSeries::new(
                s.points.iter().copied().filter(plottable),
                color.stroke_width(2),
            ))
            .map_err(|e| err(e.to_string()))?;
        if text {
            line.label(s.name.clone()).legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        }
    }
    if text {
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .label_font(("sans-serif", 14))
            .draw()
            .map_err(|e| err(e.to_string()))?;
    }
    root.present().map_err(|e| err(e.to_string()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The embedded font registers (without it plots lose their text), and a
    /// plot with a title, axis labels and a legend is written as a PNG.
    #[test]
    fn plots_carry_their_text_on_any_machine() {
        assert!(font_ready(), "the embedded DejaVu Sans did not register");
        let dir = std::env::temp_dir().join(format!("octet-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("p.png");
        let series = [Series {
            name: "curve".into(),
            points: vec![(1.0, 3.0), (2.0, 2.0), (3.0, 1.5)],
        }];
        line_plot(&path, "a title", "step", "loss", &series).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert!(bytes.starts_with(b"\x89PNG"), "not a PNG");
        std::fs::remove_dir_all(&dir).ok();
    }
}

//! `line_plot` on extreme values: an error or a figure, never a hang.

use octet_train::plot::{line_plot, Series};
use std::sync::mpsc;
use std::time::Duration;

/// `line_plot` of one series in a thread; its result as a string, or a panic
/// if it has not returned in 60 s.
fn plot_within_a_minute(name: &str, points: Vec<(f64, f64)>) -> Result<(), String> {
    let dir = std::env::temp_dir().join(format!("octet-plot-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join(format!("{name}.png"));
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let s = [Series {
            name: "loss".into(),
            points,
        }];
        let r = line_plot(&path, "t", "step", "loss", &s).map_err(|e| e.to_string());
        let _ = tx.send(r);
    });
    rx.recv_timeout(Duration::from_secs(60))
        .unwrap_or_else(|_| panic!("{name}: line_plot did not return in 60 s"))
}

#[test]
fn extreme_values_give_a_figure_or_an_error_not_a_hang() {
    // Padding the y range past f64::MAX.
    assert_eq!(
        plot_within_a_minute("to-max", vec![(1.0, 0.0), (2.0, f64::MAX)]),
        Ok(())
    );
    // A point at an infinite step is left out, as a non-finite loss is.
    assert_eq!(
        plot_within_a_minute("inf-step", vec![(1.0, 1.0), (f64::INFINITY, 2.0)]),
        Ok(())
    );
    // A span no f64 holds.
    let e = plot_within_a_minute("span", vec![(1.0, -1e308), (2.0, 1e308)]).unwrap_err();
    assert!(e.contains("span") && e.contains("1e308"), "{e}");
}

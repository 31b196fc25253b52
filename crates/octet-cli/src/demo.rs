//! `octet demo`: one linear layer under every recipe and backward mode, with
//! accuracy (SQNR in dB against f64) and the bytes saved for backward.

use crate::util::{gaussian, ref_matmul_nt, transpose, Table};
use anyhow::Context;
use octet_fp8::tolerance::sqnr_db;
use octet_fp8::{BackwardMode, Layout, Recipe, Role, Usage};
use octet_nn::Linear;
use octet_tensor::{DType, Tensor};

#[derive(clap::Args, Default)]
pub struct DemoArgs {
    /// Layer shape MxKxN (input rows, input features, output features).
    #[arg(long, default_value = "256x512x384")]
    shape: String,
}

fn f64s(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| x as f64).collect()
}

pub fn run(a: DemoArgs) -> anyhow::Result<()> {
    let (m, k, n) = match crate::util::parse_shapes(&a.shape).context("--shape")?[..] {
        [one] => one,
        _ => anyhow::bail!("--shape takes one MxKxN, got '{}'", a.shape),
    };
    let x = gaussian(m * k, 1, 1.0);
    let w = gaussian(n * k, 2, 1.0 / (k as f32).sqrt());
    let dy = gaussian(m * n, 3, 1e-2);
    // f64 references of the three GEMMs on the unquantized data, from the
    // CLI's own loops (not octet-tensor's kernels).
    let (x64, w64, dy64) = (f64s(&x), f64s(&w), f64s(&dy));
    let y_ref = ref_matmul_nt(m, k, n, &x64, &w64); // output = input @ weight_t: (m, n)
    let dx_ref = ref_matmul_nt(m, n, k, &dy64, &transpose(&w64, n, k)); // grad_input = grad_output @ weight: (m, k)
    let dw_ref = ref_matmul_nt(n, m, k, &transpose(&dy64, m, n), &transpose(&x64, m, k)); // grad_weight = grad_output_t @ input: (n, k)

    println!("octet demo: Linear {m}x{k} @ ({n}x{k})^T, Gaussian data, SQNR in dB against f64 (higher is better)\n");
    println!(
        "quantize -> dequantize, per role (row-wise copy), and bytes of FP8 data + scales vs bf16"
    );
    let mut t = Table::new(&[
        "recipe",
        "input dB",
        "weight dB",
        "grad dB",
        "input bytes",
        "vs bf16",
    ]);
    for name in Recipe::NAMES {
        let r = Recipe::from_name(name)?;
        let mut cells = vec![name.to_string()];
        let mut in_bytes = 0;
        for (role, data, rows, cols) in [
            (Role::Input, &x, m, k),
            (Role::Weight, &w, n, k),
            (Role::GradOutput, &dy, m, n),
        ] {
            let amax = data.iter().fold(0f32, |a, v| a.max(v.abs()));
            let ds = (name == "delayed")
                .then(|| octet_fp8::scale::scale_from_amax(amax, r.format(role), 0, false))
                .flatten();
            let s = r.spec(role, Layout::Rowwise, ds, 0)?;
            let q = octet_fp8::quantize(data, rows, cols, &s, &s, Usage::ROW, None)?;
            cells.push(format!(
                "{:.1}",
                sqnr_db(&f64s(data), &f64s(&q.dequantize()?))
            ));
            if role == Role::Input {
                in_bytes = q.bytes();
            }
        }
        cells.push(in_bytes.to_string());
        cells.push(format!("{:.3}x", in_bytes as f64 / (2 * m * k) as f64));
        t.row(cells);
    }
    t.print();

    println!("\nforward + backward (trainable weight, input needs a gradient)");
    let mut t = Table::new(&[
        "recipe",
        "backward",
        "output dB",
        "grad_input dB",
        "grad_weight dB",
        "saved bytes",
        "vs bf16 layer",
    ]);
    let bf16_saved = 2 * m * k; // a bf16 layer keeps its bf16 input for grad_weight
    let xt = Tensor::from_f32(&[m, k], x.clone())?;
    let dyt = Tensor::from_f32(&[m, n], dy.clone())?;
    let mut run_layer =
        |recipe: Option<Recipe>, dtype: DType, label: String, mode: &str| -> anyhow::Result<()> {
            let mut l = Linear::new(
                Tensor::from_f32_as(&[n, k], w.clone(), dtype)?,
                None,
                recipe,
                true,
            )?;
            let xi = xt.to_dtype(dtype);
            let (y, saved) = l.forward(&xi, true)?;
            let bytes = saved.bytes();
            let g = l.backward(saved, &dyt.to_dtype(dtype))?;
            let db = |t: &Option<Tensor>, r: &[f64]| {
                t.as_ref().map_or(f64::NAN, |t| sqnr_db(r, &t.to_f64_vec()))
            };
            t.row(vec![
                label,
                mode.into(),
                format!("{:.1}", sqnr_db(&y_ref, &y.to_f64_vec())),
                format!("{:.1}", db(&g.d_input, &dx_ref)),
                format!("{:.1}", db(&g.d_weight, &dw_ref)),
                bytes.to_string(),
                format!("{:.3}x", bytes as f64 / bf16_saved as f64),
            ]);
            Ok(())
        };
    run_layer(None, DType::F32, "f32 (no FP8)".into(), "-")?;
    run_layer(None, DType::Bf16, "bf16 (no FP8)".into(), "-")?;
    let mut skipped = Vec::new();
    for name in Recipe::NAMES {
        for mode in BackwardMode::ALL {
            match Recipe::from_name(name)?.with_backward(mode) {
                Ok(r) => run_layer(Some(r), DType::F32, r.to_string(), mode.name())?,
                Err(e) => skipped.push(format!("{name} + {}: n/a ({e})", mode.name())),
            }
        }
    }
    t.print();
    for s in skipped {
        println!("{s}");
    }
    println!(
        "\nquantized keeps FP8 column-wise copies of x and W; dequantized keeps the forward's FP8 row-wise copies;\n\
         high_precision keeps x itself. A frozen weight saves no x; an input without gradient saves no W."
    );
    Ok(())
}

//! The probe run when a GPU is opened without FP8 instructions: the
//! weight-only kernel must decode every E4M3 and E5M2 code exactly (see
//! `Gpu::open`). The conformance cases run it too.

use crate::{Error, Gpu, Result};
use octet_fp8::{Format, QuantData, Scales};

/// Equal values, or both NaN (an FP8 NaN's sign and payload are not part of
/// the contract).
pub fn same_value(a: f64, b: f64) -> bool {
    a == b || (a.is_nan() && b.is_nan())
}

/// The weight-only product of a weight whose 256 rows hold codes
/// `(j + p) % 256` at column `p` (every code at each of the 16 positions of a
/// 16-byte load; NaN codes and E5M2's infinities, which a weight may not
/// hold, replaced by zero; factors 1, per tensor or per 128x128 tile) with
/// `m` one-hot token rows (token `i` at column `i % 16`). Each output is one
/// decoded code, so it must equal the f64 product exactly.
/// Returns the outputs checked and, if any differs, a line on the first.
pub fn every_code_product(
    gpu: &Gpu,
    format: Format,
    block128: bool,
    m: usize,
) -> Result<(usize, Option<String>)> {
    use octet_tensor::mixed::Fp8Weight;
    let (n, k) = (256usize, 16usize);
    let mut w = vec![0u8; n * k];
    for j in 0..n {
        for p in 0..k {
            let c = ((j + p) % 256) as u8;
            let finite = !format.is_nan(c) && format.decode(c).is_finite();
            w[j * k + p] = if finite { c } else { 0 };
        }
    }
    let (block, nf) = if block128 {
        ((128, 128), n.div_ceil(128))
    } else {
        ((n, k), 1)
    };
    let wq = Fp8Weight::from_quant_data(QuantData {
        rows: n,
        cols: k,
        format,
        data: w.clone(),
        block,
        scales: Scales::F32(vec![1.0; nf]),
        saturated: 0,
        underflowed: 0,
    })
    .map_err(|e| Error::Shape(e.to_string()))?;
    let dw = gpu.upload_fp8_weight(&wq)?;
    let xb: Vec<u16> = (0..m * k)
        .map(|e| if e % k == (e / k) % k { 0x3f80 } else { 0 })
        .collect();
    let dx = gpu.upload(&xb)?;
    let mut y = gpu.upload(&vec![0f32; m * n])?;
    gpu.mixed_matmul(&dx, m, &dw, &mut y)?;
    let got = gpu.download(&y)?;
    let mut bad = 0usize;
    let mut first = None;
    for i in 0..m {
        for j in 0..n {
            let want: f64 = (0..k)
                .map(|p| {
                    let xv = if p == i % k { 1.0 } else { 0.0 };
                    xv * format.decode(w[j * k + p]) as f64
                })
                .sum();
            let g = got[i * n + j] as f64;
            if !same_value(g, want) {
                bad += 1;
                first.get_or_insert((i, j, g, want));
            }
        }
    }
    Ok((
        m * n,
        first.map(|(i, j, g, w)| format!("{bad} differ, first ({i}, {j}): {g} for {w}")),
    ))
}

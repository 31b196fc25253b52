//! The quantizer against a naive per-element reference loop, per recipe, role
//! and layout, on ragged shapes; accuracy floors; and bad input.

use octet_fp8::quant::transpose;
use octet_fp8::scale::{mx_exponent, pow2, scale_from_amax};
use octet_fp8::tolerance::{
    assert_bytes_eq, sqnr_db, SQNR_CAST_E2M1, SQNR_CAST_E4M3, SQNR_CAST_E5M2,
};
use octet_fp8::{
    quantize, Error, Format, Granularity, Layout, Overflow, QuantData, QuantSpec, Recipe, Role,
    Rounding, ScaleRule, Scales, Usage,
};
use rand::{Rng, SeedableRng};
use rand_distr::StandardNormal;

const SHAPES: [(usize, usize); 6] = [
    (1, 16),
    (5, 160),
    (217, 256),
    (37, 200),
    (128, 128),
    (130, 33),
];

fn gaussian(n: usize, seed: u64, std: f32) -> Vec<f32> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..n)
        .map(|_| rng.sample::<f32, _>(StandardNormal) * std)
        .collect()
}

/// The naive reference: element by element, each block's amax found by a full scan.
fn naive(
    x: &[f32],
    rows: usize,
    cols: usize,
    spec: &QuantSpec,
    tensor_amax: f32,
) -> (Vec<u8>, Vec<f32>) {
    let (br, bc) = spec.granularity.block_dims(rows, cols);
    let block_amax = |r: usize, c: usize| {
        let (r0, c0) = (r / br * br, c / bc * bc);
        let mut m = 0f32;
        for i in r0..(r0 + br).min(rows) {
            for j in c0..(c0 + bc).min(cols) {
                m = m.max(x[i * cols + j].abs());
            }
        }
        m
    };
    let global = (6.0 * 448.0 / tensor_amax as f64) as f32; // NVFP4; amax > 0 in these tests
    let mut codes = Vec::new();
    let mut factors = Vec::new();
    for r in 0..rows {
        for c in 0..cols {
            let a = if spec.granularity == octet_fp8::Granularity::Tensor {
                tensor_amax
            } else {
                block_amax(r, c)
            };
            let (mul, factor) = match spec.rule {
                ScaleRule::Amax { power_of_two } => {
                    let s = scale_from_amax(a, spec.format, 0, power_of_two).unwrap();
                    (s, 1.0 / s)
                }
                ScaleRule::Fixed(s) => (s, 1.0 / s),
                ScaleRule::E8M0 => {
                    let e = mx_exponent(a, spec.format).unwrap();
                    (pow2(-e), pow2(e))
                }
                ScaleRule::Nvfp4 => {
                    let code = Format::E4M3.encode_rne(a / 6.0 * global, Overflow::Saturate);
                    let d = Format::E4M3.decode(code);
                    (if d == 0.0 { 0.0 } else { global / d }, d)
                }
            };
            let i = (r * cols + c) as u64;
            codes.push(spec.format.encode(
                x[r * cols + c] * mul,
                Overflow::Saturate,
                spec.rounding,
                i,
            ));
            factors.push(factor);
        }
    }
    (codes, factors)
}

fn codes_of(q: &QuantData) -> Vec<u8> {
    (0..q.rows)
        .flat_map(|r| (0..q.cols).map(move |c| q.code(r, c)))
        .collect()
}

fn factors_of(q: &QuantData) -> Vec<f32> {
    (0..q.rows)
        .flat_map(|r| (0..q.cols).map(move |c| q.block_factor(r / q.block.0, c / q.block.1)))
        .collect()
}

fn recipes() -> Vec<Recipe> {
    Recipe::NAMES
        .iter()
        .map(|n| Recipe::from_name(n).unwrap())
        .collect()
}

fn delayed_scale(r: &Recipe, role: Role) -> Option<f32> {
    matches!(r.scaling(), octet_fp8::Scaling::Delayed { .. }).then_some(if role == Role::Weight {
        300.0
    } else {
        90.0
    })
}

#[test]
fn every_recipe_matches_the_naive_loop_on_ragged_shapes() {
    for (si, &(rows, cols)) in SHAPES.iter().enumerate() {
        let x = gaussian(rows * cols, 100 + si as u64, 3.0);
        let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        for recipe in recipes() {
            for role in Role::ALL {
                let ds = delayed_scale(&recipe, role);
                let rs = recipe.spec(role, Layout::Rowwise, ds, 9).unwrap();
                let cs = recipe.spec(role, Layout::Colwise, ds, 9).unwrap();
                let what = format!("{recipe} {role:?} {rows}x{cols}");
                let q = quantize(&x, rows, cols, &rs, &cs, Usage::BOTH, None).unwrap();
                assert_eq!(q.amax, amax, "{what}: amax");
                let row = q.get(Layout::Rowwise).unwrap();
                let (want, wantf) = naive(&x, rows, cols, &rs, amax);
                assert_bytes_eq(&codes_of(row), &want, &format!("{what} row-wise codes"));
                assert_eq!(factors_of(row), wantf, "{what}: row-wise scales");
                let (gr, gc) = row.grid();
                let (br, bc) = rs.granularity.block_dims(rows, cols);
                assert_eq!(
                    (gr, gc),
                    (rows.div_ceil(br), cols.div_ceil(bc)),
                    "{what}: grid"
                );
                let xt = transpose(&x, rows, cols);
                let col = q.get(Layout::Colwise).unwrap();
                assert_eq!((col.rows, col.cols), (cols, rows));
                let (want, wantf) = naive(&xt, cols, rows, &cs, amax);
                assert_bytes_eq(&codes_of(col), &want, &format!("{what} column-wise codes"));
                assert_eq!(factors_of(col), wantf, "{what}: column-wise scales");
            }
        }
    }
}

#[test]
fn symmetric_scalings_make_the_colwise_copy_a_transpose() {
    // Per-tensor scaling and square weight tiles (128x128, 16x16) give the same
    // blocks both ways, so the column-wise copy is the row-wise one transposed.
    let (rows, cols) = (217, 300);
    let x = gaussian(rows * cols, 5, 1.0);
    for name in ["tensorwise", "delayed", "blockwise", "nvfp4"] {
        let recipe = Recipe::from_name(name).unwrap();
        let ds = delayed_scale(&recipe, Role::Weight);
        let rs = recipe.spec(Role::Weight, Layout::Rowwise, ds, 0).unwrap();
        let cs = recipe.spec(Role::Weight, Layout::Colwise, ds, 0).unwrap();
        let q = quantize(&x, rows, cols, &rs, &cs, Usage::BOTH, None).unwrap();
        let (r, c) = (q.rowwise.as_ref().unwrap(), q.colwise.as_ref().unwrap());
        assert_bytes_eq(&transpose(&codes_of(r), rows, cols), &codes_of(c), name);
        assert_eq!(
            transpose(&factors_of(r), rows, cols),
            factors_of(c),
            "{name} scales"
        );
    }
}

#[test]
fn quantize_dequantize_accuracy_floors() {
    let (rows, cols) = (256, 512);
    for recipe in recipes() {
        for role in Role::ALL {
            // Gaussian data with a spread of row magnitudes, as activations have.
            let mut x = gaussian(rows * cols, 77, 1.0);
            for (r, row) in x.chunks_mut(cols).enumerate() {
                let s = 2f32.powf((r % 16) as f32 / 4.0 - 2.0);
                row.iter_mut().for_each(|v| *v *= s);
            }
            let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
            let f = recipe.format(role);
            let ds =
                delayed_scale(&recipe, role).map(|_| scale_from_amax(amax, f, 0, false).unwrap());
            let rs = recipe.spec(role, Layout::Rowwise, ds, 1).unwrap();
            let cs = recipe.spec(role, Layout::Colwise, ds, 1).unwrap();
            let q = quantize(&x, rows, cols, &rs, &cs, Usage::BOTH, None).unwrap();
            let xr: Vec<f64> = x.iter().map(|&v| v as f64).collect();
            let floor = match f {
                Format::E4M3 => SQNR_CAST_E4M3,
                Format::E5M2 => SQNR_CAST_E5M2,
                _ => SQNR_CAST_E2M1,
            };
            let dq_row: Vec<f64> = q
                .rowwise
                .as_ref()
                .unwrap()
                .dequantize()
                .unwrap()
                .into_iter()
                .map(f64::from)
                .collect();
            let dq_col = transpose(
                &q.colwise.as_ref().unwrap().dequantize().unwrap(),
                cols,
                rows,
            );
            let dq_col: Vec<f64> = dq_col.into_iter().map(f64::from).collect();
            for (which, dq) in [("row", dq_row), ("col", dq_col)] {
                let s = sqnr_db(&xr, &dq);
                eprintln!("sqnr {recipe} {role:?} {which}: {s:.2} dB");
                assert!(
                    s >= floor,
                    "{recipe} {role:?} {which}: SQNR {s:.1} dB < {floor}"
                );
            }
        }
    }
}

#[test]
fn mx_blocks_never_saturate() {
    let x = gaussian(64 * 256, 8, 50.0);
    let recipe = Recipe::from_name("mxfp8").unwrap();
    let rs = recipe.spec(Role::Input, Layout::Rowwise, None, 0).unwrap();
    let q = quantize(&x, 64, 256, &rs, &rs, Usage::ROW, None).unwrap();
    let row = q.rowwise.unwrap();
    let Scales::E8M0(ref codes) = row.scales else {
        panic!("MX scales are E8M0")
    };
    assert_eq!(codes.len(), 64 * 8);
    for (i, chunk) in x.chunks(32).enumerate() {
        let d = Format::E8M0.decode(codes[i]);
        for &v in chunk {
            assert!((v / d).abs() <= 448.0, "block {i}: {v} / {d} exceeds 448");
        }
    }
}

#[test]
fn stochastic_rounding_of_nvfp4_grads_is_seeded() {
    let x = gaussian(32 * 64, 9, 1.0);
    let recipe = Recipe::from_name("nvfp4").unwrap();
    let spec = |salt| {
        recipe
            .spec(Role::GradOutput, Layout::Rowwise, None, salt)
            .unwrap()
    };
    assert!(matches!(spec(1).rounding, Rounding::Stochastic { .. }));
    let q = |salt| quantize(&x, 32, 64, &spec(salt), &spec(salt), Usage::ROW, None).unwrap();
    assert_eq!(q(1), q(1), "same seed, same bytes");
    assert_ne!(
        q(1).rowwise.unwrap().data,
        q(2).rowwise.unwrap().data,
        "another salt draws other bits"
    );
}

#[test]
fn bad_input_is_an_error_not_a_panic() {
    let spec = Recipe::from_name("tensorwise")
        .unwrap()
        .spec(Role::Input, Layout::Rowwise, None, 0)
        .unwrap();
    let mut x = gaussian(6 * 8, 1, 1.0);
    assert_eq!(
        quantize(&x, 0, 8, &spec, &spec, Usage::ROW, None),
        Err(Error::Empty { rows: 0, cols: 8 })
    );
    assert!(matches!(
        quantize(&x, 5, 8, &spec, &spec, Usage::ROW, None),
        Err(Error::Shape(_))
    ));
    assert!(matches!(
        quantize(&x, 6, 8, &spec, &spec, Usage::default(), None),
        Err(Error::Shape(_))
    ));
    x[13] = f32::NAN;
    match quantize(&x, 6, 8, &spec, &spec, Usage::ROW, None) {
        Err(Error::NonFinite { index: 13, value }) => assert!(value.is_nan()),
        other => panic!("NaN input: {other:?}"),
    }
    x[13] = f32::NEG_INFINITY;
    assert!(matches!(
        quantize(&x, 6, 8, &spec, &spec, Usage::ROW, None),
        Err(Error::NonFinite { index: 13, .. })
    ));
    x[13] = 1.0;
    let q = quantize(&x, 6, 8, &spec, &spec, Usage::ROW, None).unwrap();
    assert_eq!(
        q.get(Layout::Colwise),
        Err(Error::MissingUsage(Layout::Colwise))
    );
    // A given (all-reduced) tensor amax must cover the local one and be finite.
    assert!(matches!(
        quantize(&x, 6, 8, &spec, &spec, Usage::ROW, Some(q.amax / 2.0)),
        Err(Error::BadAmax(_))
    ));
    assert!(matches!(
        quantize(&x, 6, 8, &spec, &spec, Usage::ROW, Some(f32::NAN)),
        Err(Error::BadAmax(_))
    ));
    let big = quantize(&x, 6, 8, &spec, &spec, Usage::ROW, Some(q.amax * 4.0)).unwrap();
    assert_eq!(
        big.rowwise.unwrap().scales,
        Scales::F32(vec![1.0 / (448.0 / (q.amax * 4.0))])
    );
    // Element formats only; FP4 only with NVFP4 scales.
    let mut bad = spec;
    bad.format = Format::E8M0;
    assert!(matches!(
        quantize(&x, 6, 8, &bad, &bad, Usage::ROW, None),
        Err(Error::Unsupported(_))
    ));
    bad.format = Format::E2M1;
    assert!(matches!(
        quantize(&x, 6, 8, &bad, &bad, Usage::ROW, None),
        Err(Error::Unsupported(_))
    ));
    let mut fixed = spec;
    fixed.rule = ScaleRule::Fixed(0.0);
    assert!(matches!(
        quantize(&x, 6, 8, &fixed, &fixed, Usage::ROW, None),
        Err(Error::BadScale(_))
    ));
}

#[test]
fn all_zero_tensor_quantizes_to_zeros_with_unit_scale() {
    // Zeros are an edge case of the scale rule (amax 0), not test data for accuracy.
    let x = vec![0f32; 4 * 32];
    for recipe in recipes() {
        let ds = delayed_scale(&recipe, Role::Input);
        let s = recipe.spec(Role::Input, Layout::Rowwise, ds, 0).unwrap();
        let q = quantize(&x, 4, 32, &s, &s, Usage::ROW, None).unwrap();
        let dq = q.dequantize().unwrap();
        assert!(dq.iter().all(|&v| v == 0.0), "{recipe}");
        assert!(
            factors_of(q.rowwise.as_ref().unwrap())
                .iter()
                .all(|f| f.is_finite()),
            "{recipe}"
        );
    }
}

#[test]
fn delayed_scale_saturates_out_of_range_values() {
    // A stale delayed scale can be too large for this step's data: values clamp to +-max.
    let x = vec![1.0f32, -2.0, 1000.0, -5000.0, 1e-6, 0.0];
    let spec = QuantSpec {
        format: Format::E4M3,
        granularity: octet_fp8::Granularity::Tensor,
        rule: ScaleRule::Fixed(1.0),
        rounding: Rounding::NearestEven,
    };
    let q = quantize(&x, 1, 6, &spec, &spec, Usage::ROW, None).unwrap();
    assert_eq!(
        q.dequantize().unwrap(),
        vec![1.0, -2.0, 448.0, -448.0, 0.0, 0.0]
    );
    // Telemetry counts the two clamped values and the one non-zero value flushed to zero.
    let row = q.rowwise.unwrap();
    assert_eq!((row.saturated, row.underflowed), (2, 1));
}

#[test]
fn current_scaling_never_saturates() {
    // The scale is fitted to the data, so at most rounding reaches the max: nothing is counted.
    let x = gaussian(300 * 257, 31, 7.0);
    for name in ["tensorwise", "rowwise", "blockwise", "mxfp8", "nvfp4"] {
        let r = Recipe::from_name(name).unwrap();
        for role in Role::ALL {
            let s = r.spec(role, Layout::Rowwise, None, 0).unwrap();
            let q = quantize(&x, 300, 257, &s, &s, Usage::ROW, None).unwrap();
            // NVFP4's E4M3-rounded block scales can round down and push a block's top value past 6.
            let limit = if name == "nvfp4" { 0.01 } else { 0.0 };
            assert!(
                q.telemetry().saturated <= limit,
                "{name} {role:?}: {:?}",
                q.telemetry()
            );
        }
    }
}

/// NVFP4 with a tensor amax so small that the per-tensor scale is capped: zeros
/// stay zero and nothing becomes NaN or saturates (the block multiplier
/// global / d overflowed to inf, and 0 * inf = NaN encoded as +-6).
#[test]
fn nvfp4_with_a_tiny_amax_keeps_zeros_and_stays_finite() {
    let spec = Recipe::from_name("nvfp4")
        .unwrap()
        .spec(Role::Input, Layout::Rowwise, None, 0)
        .unwrap();
    for tiny in [1e-39f32, 1e-36, 3e-33] {
        let mut x = vec![0f32; 32];
        x[0] = tiny;
        x[17] = -tiny / 2.0;
        let q = quantize(&x, 2, 16, &spec, &spec, Usage::ROW, None).unwrap();
        let y = q.dequantize().unwrap();
        for (i, (&a, &b)) in x.iter().zip(&y).enumerate() {
            assert!(b.is_finite(), "{tiny:e}: element {i} dequantized to {b}");
            if a == 0.0 {
                assert_eq!(b, 0.0, "{tiny:e}: zero element {i} dequantized to {b:e}");
            } else {
                // Below the grid a value may flush to zero, never flip sign.
                assert!(
                    b == 0.0 || b.signum() == a.signum(),
                    "{tiny:e}: element {i}: {a:e} -> {b:e}"
                );
            }
        }
    }
}

/// A given scale whose inverse is not a finite f32 is refused, not stored as inf.
#[test]
fn a_fixed_scale_without_a_finite_inverse_is_refused() {
    let x = [0f32, 1.0];
    for s in [1e-39f32, f32::MIN_POSITIVE / 4.0] {
        let spec = QuantSpec {
            format: Format::E4M3,
            granularity: Granularity::Tensor,
            rule: ScaleRule::Fixed(s),
            rounding: Rounding::NearestEven,
        };
        let r = quantize(&x, 1, 2, &spec, &spec, Usage::ROW, None);
        assert!(
            matches!(r, Err(octet_fp8::Error::BadScale(_))),
            "{s:e}: {r:?}"
        );
    }
}

/// An infinite or NaN amax (an overflow upstream) keeps the delayed scale
/// while it is in the window, as Transformer Engine does, instead of
/// resetting it to 1; once it leaves the window the scale follows the amax again.
#[test]
fn a_non_finite_amax_keeps_the_delayed_scale() {
    use octet_fp8::{AmaxAlgo, DelayedState};
    for bad in [f32::INFINITY, f32::NAN] {
        for algo in [AmaxAlgo::Max, AmaxAlgo::MostRecent] {
            let mut st = DelayedState::new(3, algo, 0, Format::E4M3);
            st.record(2.0);
            st.update();
            let before = st.scale();
            assert_eq!(before, 448.0 / 2.0);
            // The bad report poisons the step whatever comes after it.
            st.record(bad);
            st.record(1.0);
            st.update();
            assert_eq!(st.scale(), before, "{bad} {algo:?}");
            st.record(4.0);
            st.update();
            let want = match algo {
                AmaxAlgo::Max => before, // still in the window
                AmaxAlgo::MostRecent => 448.0 / 4.0,
            };
            assert_eq!(st.scale(), want, "{bad} {algo:?}");
            st.record(4.0);
            st.update();
            st.record(4.0);
            st.update();
            assert_eq!(st.scale(), 448.0 / 4.0, "{bad} {algo:?}: out of the window");
        }
    }
}

/// A state holding an inf and a NaN amax survives a JSON round trip (a
/// checkpoint), which plain JSON numbers cannot carry.
#[test]
fn a_delayed_state_with_non_finite_amaxes_round_trips_through_json() {
    use octet_fp8::{AmaxAlgo, DelayedState};
    let mut st = DelayedState::new(4, AmaxAlgo::Max, 0, Format::E4M3);
    for a in [3.0, f32::INFINITY, f32::NAN, 0.5] {
        st.record(a);
        st.update();
    }
    st.record(f32::NAN);
    let text = serde_json::to_string(&st).unwrap();
    let back: DelayedState = serde_json::from_str(&text).unwrap();
    let bits = |s: &DelayedState| -> Vec<u32> {
        s.history()
            .chain([s.pending(), s.scale()])
            .map(|v| if v.is_nan() { 0x7fc0_0000 } else { v.to_bits() })
            .collect()
    };
    assert_eq!(bits(&back), bits(&st), "{text}");
    assert_eq!(back.config(), st.config());
    // Old checkpoints (finite numbers only) still load.
    let mut fine = DelayedState::new(2, AmaxAlgo::Max, 0, Format::E4M3);
    fine.record(2.0);
    fine.update();
    let back: DelayedState = serde_json::from_str(&serde_json::to_string(&fine).unwrap()).unwrap();
    assert_eq!(back, fine);
    assert!(serde_json::from_str::<DelayedState>(&text.replace("\"nan\"", "\"nope\"")).is_err());
}

/// A step whose amax is 0 (a tensor of zeros, or no report at all) keeps the
/// delayed scale, as Transformer Engine's update does (`isfinite(amax) &&
/// amax > 0`, else the previous scale): a reset to 1 would flush the next step's
/// small values (gradients of 1e-6 are below E5M2's smallest subnormal at scale 1).
#[test]
fn a_zero_amax_keeps_the_delayed_scale() {
    use octet_fp8::{AmaxAlgo, DelayedState};
    for algo in [AmaxAlgo::Max, AmaxAlgo::MostRecent] {
        let mut st = DelayedState::new(1, algo, 0, Format::E5M2);
        st.record(1e-6);
        st.update();
        let before = st.scale();
        assert_eq!(before, 57344.0 / 1e-6);
        st.record(0.0);
        st.update();
        assert_eq!(st.scale(), before, "{algo:?}: recorded zero");
        st.update();
        assert_eq!(st.scale(), before, "{algo:?}: no report");
        st.record(2e-6);
        st.update();
        assert_eq!(st.scale(), 57344.0 / 2e-6, "{algo:?}");
    }
    // A fresh state still starts (and stays, without data) at 1.
    let mut st = DelayedState::new(4, AmaxAlgo::Max, 0, Format::E4M3);
    st.update();
    assert_eq!(st.scale(), 1.0);
}

/// The delayed margin survives a tiny amax. Transformer Engine divides
/// `max * 2^-margin` by the amax, so the scale only hits the f32 cap when
/// that quotient itself overflows; dividing `max / amax` first overflowed
/// for amaxes the margin brings back into range, and the cap then gave
/// `amax * scale` far above `max * 2^-margin`: values within the margin's
/// headroom saturated on the next step.
#[test]
fn a_margin_is_kept_when_max_over_amax_alone_overflows() {
    use octet_fp8::{AmaxAlgo, DelayedState};
    for (format, amax) in [(Format::E4M3, 5e-37f32), (Format::E5M2, 6e-35)] {
        let margin = 2;
        let want = format.max() * 0.25 / amax; // exact product, one rounding: TE's order
        assert!(want.is_finite() && (format.max() / amax).is_infinite());
        assert_eq!(scale_from_amax(amax, format, margin, false), Some(want));
        let mut st = DelayedState::new(1, AmaxAlgo::Max, margin, format);
        st.record(amax);
        st.update();
        assert_eq!(st.scale(), want, "{format}");
        // Values up to 2^margin x the amax fit without saturating.
        let x = vec![amax * 3.9, -amax, amax * 0.5, 0.0];
        let spec = QuantSpec {
            format,
            granularity: Granularity::Tensor,
            rule: ScaleRule::Fixed(st.scale()),
            rounding: Rounding::NearestEven,
        };
        let q = quantize(&x, 1, 4, &spec, &spec, Usage::ROW, None).unwrap();
        assert_eq!(q.rowwise.unwrap().saturated, 0, "{format}");
    }
    // Unchanged where no overflow is involved (power-of-two margins are exact).
    for amax in [1e-30f32, 3.0, 1e30] {
        for m in [1, 3] {
            let old = Format::E4M3.max() / amax * pow2(-m);
            assert_eq!(scale_from_amax(amax, Format::E4M3, m, false), Some(old));
        }
    }
}

/// The NVFP4 per-tensor encode scale is `6 * 448 / amax` rounded once, as
/// Transformer Engine computes it (`fp8_max * fp4_max / amax`). Rounding
/// `448 / amax` first and then multiplying by 6 is an ulp off for about a
/// quarter of amaxes (4.5 gave 597.3334 instead of 597.3333), and with it
/// every dequantized value of the tensor.
#[test]
fn nvfp4_global_scale_is_rounded_once() {
    let spec = Recipe::from_name("nvfp4")
        .unwrap()
        .spec(Role::Input, Layout::Rowwise, None, 0)
        .unwrap();
    for amax in [4.5f32, 1.7, 3.3, 5.9, 0.37, 1e-3, 2.5e4, 1e-37] {
        let x: Vec<f32> = (0..32).map(|i| amax * (1.0 - i as f32 / 40.0)).collect();
        let q = quantize(&x, 2, 16, &spec, &spec, Usage::ROW, None).unwrap();
        let Scales::Nvfp4 { global, .. } = q.rowwise.unwrap().scales else {
            panic!("NVFP4 scales")
        };
        // f64 has more than 2 * 24 + 2 bits: its quotient rounds to the f32 quotient.
        let want = ((6.0 * 448.0 / amax as f64) as f32).min(f32::MAX);
        assert_eq!(global, want, "amax {amax:e}");
    }
}

/// The NVFP4 scale rule with an 8-bit element format names what is wrong:
/// the rule needs E2M1 elements (it said 'E2M1 elements go with the NVFP4
/// scale rule only', about the other mistake).
#[test]
fn nvfp4_scales_with_fp8_elements_name_the_format() {
    let x = gaussian(4 * 32, 2, 1.0);
    for format in [Format::E4M3, Format::E5M2] {
        let spec = QuantSpec {
            format,
            granularity: Granularity::Tile { rows: 1, cols: 16 },
            rule: ScaleRule::Nvfp4,
            rounding: Rounding::NearestEven,
        };
        match quantize(&x, 4, 32, &spec, &spec, Usage::ROW, None) {
            Err(Error::Unsupported(m)) => {
                assert!(m.contains("NVFP4") && m.contains(format.name()), "{m}")
            }
            other => panic!("{format:?}: {other:?}"),
        }
    }
    // E2M1 elements under another rule: the other message.
    let spec = QuantSpec {
        format: Format::E2M1,
        granularity: Granularity::Tensor,
        rule: ScaleRule::Amax {
            power_of_two: false,
        },
        rounding: Rounding::NearestEven,
    };
    match quantize(&x, 4, 32, &spec, &spec, Usage::ROW, None) {
        Err(Error::Unsupported(m)) => assert!(m.contains("E2M1") && m.contains("NVFP4"), "{m}"),
        other => panic!("{other:?}"),
    }
}

/// A dequantized matrix the allocator cannot provide is an error naming the
/// bytes, from either copy. The copies declare a (2^30, 2^30) shape with no
/// codes: the 2^62-byte f32 matrix is reserved (and refused) before any
/// code is read, so nothing of that size is touched.
#[test]
fn a_dequantized_matrix_too_large_for_memory_is_an_error() {
    let (rows, cols) = (1usize << 30, 1usize << 30);
    let q = QuantData {
        rows,
        cols,
        format: Format::E4M3,
        data: Vec::new(),
        block: (rows, cols),
        scales: Scales::F32(vec![1.0]),
        saturated: 0,
        underflowed: 0,
    };
    let check = |e: Error| {
        let msg = e.to_string();
        assert!(
            matches!(e, Error::Alloc { bytes, .. } if bytes == 1 << 62),
            "{e:?}"
        );
        assert!(
            msg.starts_with("out of memory: cannot allocate 4611686018427387904 bytes (4.0 EiB)"),
            "{msg}"
        );
        assert!(
            msg.contains("dequantized (1073741824, 1073741824) e4m3 matrix"),
            "{msg}"
        );
        assert!(msg.ends_with("or use a smaller model"), "{msg}");
    };
    check(q.dequantize().unwrap_err());
    let t = octet_fp8::QuantizedTensor {
        rows,
        cols,
        amax: 0.0,
        rowwise: None,
        colwise: Some(q),
    };
    check(t.dequantize().unwrap_err());
}

/// The column-wise copy dequantizes (transposed) to what the row-wise one
/// does under a symmetric scaling, and to the transpose of its own matrix.
#[test]
fn a_column_wise_dequantization_is_the_transpose_of_its_copy() {
    let (rows, cols) = (37, 200);
    let x = gaussian(rows * cols, 5, 1.0);
    let spec = QuantSpec {
        format: Format::E4M3,
        granularity: Granularity::Tensor,
        rule: ScaleRule::Amax {
            power_of_two: false,
        },
        rounding: Rounding::NearestEven,
    };
    let q = quantize(&x, rows, cols, &spec, &spec, Usage::BOTH, None).unwrap();
    let col = q.colwise.clone().unwrap();
    let want = transpose(&col.dequantize().unwrap(), cols, rows);
    let only_col = q.clone().retain(Usage::COL);
    assert_eq!(only_col.dequantize().unwrap(), want);
    assert_eq!(q.dequantize().unwrap(), want);
}

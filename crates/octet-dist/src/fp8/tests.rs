use super::*;
use crate::spawn_ranks;
use octet_fp8::{Layout, Recipe, Role};

/// Deterministic test data: a smooth spread, a few outliers, some tiny values (underflow).
pub(crate) fn data(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|i| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let u = (s >> 11) as f64 / (1u64 << 53) as f64 - 0.5;
            let v = match i % 97 {
                0 => u * 40.0,
                1 => u * 1e-7,
                _ => u * (1.0 + (i % 13) as f64),
            };
            v as f32
        })
        .collect()
}

/// The weight specs of a recipe; delayed scaling gets a fixed scale that saturates the outliers.
fn specs(name: &str) -> (QuantSpec, QuantSpec) {
    let r = Recipe::from_name(name).unwrap();
    let scale = (name == "delayed").then_some(60.0);
    (
        r.spec(Role::Weight, Layout::Rowwise, scale, 0).unwrap(),
        r.spec(Role::Weight, Layout::Colwise, scale, 0).unwrap(),
    )
}

/// First differing byte of two copies, for a readable failure.
fn first_diff(a: &QuantData, b: &QuantData) -> Option<usize> {
    a.data.iter().zip(&b.data).position(|(x, y)| x != y)
}

#[test]
fn fp8_gather_is_byte_identical_to_quantizing_the_whole_weight() {
    let shapes = [(300, 160), (37, 64), (129, 256), (5, 48)];
    for name in Recipe::NAMES {
        let (row, col) = specs(name);
        for (si, &(r, k)) in shapes.iter().enumerate() {
            let w = data(r * k, si as u64 + 1);
            for usage in [Usage::BOTH, Usage::ROW] {
                let want = octet_fp8::quantize(&w, r, k, &row, &col, usage, None).unwrap();
                for n in [1, 2, 3, 4] {
                    let align = fp8_row_alignment(&row, &col, usage).unwrap();
                    let layout = ShardLayout::new(&[r, k], n, align).unwrap();
                    let got = spawn_ranks(n, |c| {
                        let shard = layout.shard(&w, c.rank(), 0.0)?;
                        let t = Tensor::from_f32(&[layout.shard_rows, k], shard)?;
                        gather_fp8_weight(c, &layout, &t, &row, &col, usage)
                    })
                    .unwrap();
                    for (rank, g) in got.iter().enumerate() {
                        let ctx = format!("{name} ({r}, {k}) n={n} rank {rank} {usage:?}");
                        for (a, b) in [(&g.rowwise, &want.rowwise), (&g.colwise, &want.colwise)] {
                            if let (Some(a), Some(b)) = (a, b) {
                                assert_eq!(
                                    first_diff(a, b),
                                    None,
                                    "{ctx}: first differing code byte"
                                );
                                assert_eq!(a.scales, b.scales, "{ctx}: scales");
                                assert_eq!(a.bytes(), b.bytes(), "{ctx}");
                            }
                        }
                        assert_eq!(g, &want, "{ctx}");
                        // The gathered per-tensor scale is the single-rank scale, bit for bit.
                        assert_eq!(g.amax.to_bits(), want.amax.to_bits(), "{ctx}");
                    }
                }
            }
        }
    }
}

#[test]
fn colwise_by_transposition_equals_quantizing_colwise() {
    // The transpose plan is the whole point of per-tensor scaling: check it against a direct column-wise quantization.
    for name in ["tensorwise", "delayed", "blockwise", "nvfp4"] {
        let (row, col) = specs(name);
        assert_eq!(
            ColwisePlan::for_spec(&col, Usage::BOTH).unwrap(),
            ColwisePlan::TransposeLocal,
            "{name}"
        );
        let (r, k) = (131, 96);
        let w = data(r * k, 9);
        let both = octet_fp8::quantize(&w, r, k, &row, &col, Usage::BOTH, None).unwrap();
        let built = transpose_copy(both.get(Layout::Rowwise).unwrap(), &col).unwrap();
        assert_eq!(Some(&built), both.colwise.as_ref(), "{name}");
    }
    let (_, col) = specs("rowwise");
    assert_eq!(
        ColwisePlan::for_spec(&col, Usage::BOTH).unwrap(),
        ColwisePlan::ColumnAmax
    );
    let (_, col) = specs("mxfp8");
    assert_eq!(
        ColwisePlan::for_spec(&col, Usage::BOTH).unwrap(),
        ColwisePlan::GatherShards
    );
    assert_eq!(
        ColwisePlan::for_spec(&col, Usage::ROW).unwrap(),
        ColwisePlan::None
    );
}

#[test]
fn fp8_gather_moves_about_half_the_bytes_of_bf16() {
    // Per-tensor scaling, column-wise copy by transposition: codes + 4 scale bytes + 16 telemetry bytes per rank.
    let (row, col) = specs("tensorwise");
    let (r, k) = (256, 128);
    let w = data(r * k, 3);
    let layout = ShardLayout::new(&[r, k], 4, 1).unwrap();
    let out = spawn_ranks(4, |c| {
        let shard = layout.shard(&w, c.rank(), 0.0)?;
        let t = Tensor::from_f32(&[layout.shard_rows, k], shard.clone())?;
        let before = c.stats();
        gather_fp8_weight(c, &layout, &t, &row, &col, Usage::BOTH)?;
        let fp8 = c.stats().since(&before);
        let bf: Vec<half::bf16> = shard.iter().map(|&v| half::bf16::from_f32(v)).collect();
        let before = c.stats();
        c.all_gather(&bf)?;
        let bf16 = c.stats().since(&before);
        Ok((fp8, bf16))
    })
    .unwrap();
    use crate::CollectiveKind::{AllGather, AllReduce};
    let (fp8, bf16) = out[0];
    assert_eq!(fp8.bytes(AllGather), (64 * 128 + 4 + 16) as u64);
    assert_eq!(fp8.bytes(AllReduce), 4);
    assert_eq!(bf16.bytes(AllGather), (64 * 128 * 2) as u64);
    let ratio = fp8.bytes(AllGather) as f64 / bf16.bytes(AllGather) as f64;
    assert!(ratio <= 0.502, "{ratio}"); // measured 0.5012
}

#[test]
fn bad_inputs_are_clear_errors() {
    let (row, col) = specs("blockwise");
    let (r, k) = (200, 128);
    let w = data(r * k, 4);
    // 200 rows over 2 ranks without alignment: 100-row shards cut a 128x128 tile.
    let layout = ShardLayout::new(&[r, k], 2, 1).unwrap();
    let e = spawn_ranks(2, |c| {
        let t = Tensor::from_f32(&[100, k], layout.shard(&w, c.rank(), 0.0)?)?;
        gather_fp8_weight(c, &layout, &t, &row, &col, Usage::BOTH)
    })
    .unwrap_err();
    assert!(
        matches!(&e, Error::Unsupported(m) if m.contains("128")),
        "{e}"
    );
    // A shard of the wrong shape.
    let e = spawn_ranks(2, |c| {
        let t = Tensor::from_f32(&[3, k], vec![0.0; 3 * k])?;
        gather_fp8_weight(c, &layout, &t, &row, &col, Usage::BOTH)
    })
    .unwrap_err();
    assert!(matches!(e, Error::Shape(_)), "{e}");
    // A NaN on rank 1: that rank names it, the other stops.
    let (row, col) = specs("tensorwise");
    let e = spawn_ranks(2, |c| {
        let mut shard = layout.shard(&w, c.rank(), 0.0)?;
        if c.rank() == 1 {
            shard[7] = f32::NAN;
        }
        let t = Tensor::from_f32(&[100, k], shard)?;
        gather_fp8_weight(c, &layout, &t, &row, &col, Usage::BOTH)
    })
    .unwrap_err();
    assert!(e.to_string().contains("non-finite"), "{e}");
}

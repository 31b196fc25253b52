use super::*;
use crate::{spawn_ranks, ThreadComm};
use octet_fp8::QuantizedTensor;
use octet_nn::LlamaConfig;
use octet_tensor::cpu;

const B: usize = 4; // global batch (sequences)
const T: usize = 16;
const LR: f32 = 3e-3;

fn model(preset: &str, recipe: Option<&str>, backward: BackwardMode, seed: u64) -> Llama {
    let cfg = LlamaConfig::preset(preset).unwrap();
    let r = recipe.map(|n| {
        Recipe::from_name(n)
            .unwrap()
            .with_backward(backward)
            .unwrap()
    });
    Llama::new_random(&cfg, DType::F32, r, seed).unwrap()
}

/// A deterministic global batch `(B, T)` per step: byte-like tokens with a little structure.
fn batch(step: u64) -> (Vec<u32>, Vec<u32>) {
    let mut s = step.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03;
    let mut seq = Vec::with_capacity(B * (T + 1));
    for _ in 0..B * (T + 1) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        seq.push((97 + (s >> 59) as u32 * 3) % 256);
    }
    let (mut x, mut y) = (Vec::new(), Vec::new());
    for b in 0..B {
        let w = &seq[b * (T + 1)..(b + 1) * (T + 1)];
        x.extend_from_slice(&w[..T]);
        y.extend_from_slice(&w[1..]);
    }
    (x, y)
}

fn adamw() -> AdamWConfig {
    AdamWConfig {
        grad_clip: 0.5, // the tiny model's norms are about 1-3 here: clipping is active
        ..AdamWConfig::default()
    }
}

/// What a run ends with: per-step losses and norms, and the final f32 masters.
#[derive(Debug, PartialEq)]
struct Run {
    losses: Vec<f64>,
    norms: Vec<f32>,
    masters: Vec<(String, Vec<f32>)>,
}

/// One process: each step accumulates gradients over `micro` micro-batches of
/// the global batch (in order), each times its share (`1/micro`: nothing is
/// masked), then AdamW, as `octet train --grad-accum` does.
fn reference(
    mut m: Llama,
    micro: usize,
    steps: u64,
    opt: Option<AdamW>,
    first: u64,
) -> (Run, AdamW) {
    let mut opt = opt.unwrap_or_else(|| AdamW::new(&m.params(), adamw()));
    opt.write_back(m.params_mut()).unwrap();
    let (mut losses, mut norms) = (Vec::new(), Vec::new());
    for step in first..first + steps {
        let (x, y) = batch(step);
        let mut acc: Option<Vec<(String, Tensor)>> = None;
        let mut loss_sum = 0.0;
        for r in 0..micro {
            let (xl, yl, bl) = local_batch(&x, &y, B, T, r, micro).unwrap();
            let (loss, saved) = m.forward(&xl, &yl, bl, T).unwrap();
            loss_sum += loss / micro as f64;
            let s = 1.0 / micro as f32;
            let g: Vec<(String, Tensor)> = m
                .backward(saved)
                .unwrap()
                .into_iter()
                .map(|(n, g)| {
                    let v = g.to_f32_vec().iter().map(|v| v * s).collect();
                    (n, Tensor::from_f32(g.shape(), v).unwrap())
                })
                .collect();
            acc = Some(match acc {
                None => g,
                Some(a) => a
                    .into_iter()
                    .zip(g)
                    .map(|((n, a), (_, b))| (n, cpu::add(&a, &b).unwrap()))
                    .collect(),
            });
        }
        let grads = acc.unwrap();
        norms.push(opt.step(&grads, LR).unwrap());
        opt.write_back(m.params_mut()).unwrap();
        m.update_scales();
        losses.push(loss_sum);
    }
    let masters = opt
        .states
        .iter()
        .map(|s| (s.name.clone(), s.master.clone()))
        .collect();
    (
        Run {
            losses,
            norms,
            masters,
        },
        opt,
    )
}

/// `steps` sharded steps on every rank; returns each rank's run and gathered optimizer.
fn sharded_steps(
    rank: &mut FsdpRank,
    c: &ThreadComm,
    steps: std::ops::Range<u64>,
) -> Result<(Run, AdamW)> {
    let n = c.world_size();
    let (mut losses, mut norms) = (Vec::new(), Vec::new());
    for step in steps {
        let (x, y) = batch(step);
        let (xl, yl, bl) = local_batch(&x, &y, B, T, c.rank(), n)?;
        let out = rank.step(c, &xl, &yl, bl, T, LR)?;
        losses.push(out.loss);
        norms.push(out.grad_norm);
    }
    let opt = rank.gather_optimizer(c)?;
    let masters = opt
        .states
        .iter()
        .map(|s| (s.name.clone(), s.master.clone()))
        .collect();
    Ok((
        Run {
            losses,
            norms,
            masters,
        },
        opt,
    ))
}

/// The FP8 weights each block linear was handed at the last gather.
fn gathered_fp8(rank: &mut FsdpRank) -> Vec<Option<QuantizedTensor>> {
    rank.model
        .linears_mut()
        .into_iter()
        .map(|(_, l)| l.quantized_weight().map(|q| (**q).clone()))
        .collect()
}

fn bits(run: &Run) -> Vec<(String, Vec<u32>)> {
    run.masters
        .iter()
        .map(|(n, v)| (n.clone(), v.iter().map(|x| x.to_bits()).collect()))
        .collect()
}

#[test]
fn n_ranks_match_gradient_accumulation_bit_for_bit() {
    let cases: [(Option<&str>, BackwardMode); 8] = [
        (None, BackwardMode::Quantized),
        (Some("tensorwise"), BackwardMode::Quantized),
        // The high-precision backward reads the layer's weight: gathered in f32, quantized locally.
        (Some("tensorwise"), BackwardMode::HighPrecision),
        (Some("delayed"), BackwardMode::Quantized),
        (Some("rowwise"), BackwardMode::Quantized),
        (Some("blockwise"), BackwardMode::Dequantized),
        (Some("mxfp8"), BackwardMode::Quantized),
        // Stochastic rounding of grad_output: each rank takes the salts of
        // its micro-batch in gradient accumulation, not all the same ones.
        (Some("nvfp4"), BackwardMode::Quantized),
    ];
    for (recipe, bwd) in cases {
        // Two ranks also with activation recomputation (of both blocks, and
        // of the first only): the same bits again.
        for (n, recompute) in [(1, 0), (2, 0), (4, 0), (2, usize::MAX), (2, 1)] {
            let ctx = format!("{recipe:?} {bwd:?} n={n} recompute={recompute}");
            let (want, _) = reference(model("tiny", recipe, bwd, 5), n, 3, None, 0);
            let out = spawn_ranks(n, |c| {
                let mut m = model("tiny", recipe, bwd, 5);
                m.set_recompute(recompute);
                let mut r = FsdpRank::new(
                    c,
                    m,
                    FsdpConfig {
                        adamw: adamw(),
                        ..FsdpConfig::default()
                    },
                )?;
                let (run, _) = sharded_steps(&mut r, c, 0..3)?;
                Ok((run, gathered_fp8(&mut r)))
            })
            .unwrap();
            for (rank, (run, q)) in out.iter().enumerate() {
                assert_eq!(run.losses, want.losses, "{ctx} rank {rank}: losses");
                assert_eq!(run.norms, want.norms, "{ctx} rank {rank}: norms");
                assert!(
                    bits(run) == bits(&want),
                    "{ctx} rank {rank}: masters differ"
                );
                // Every rank was handed byte-identical FP8 weights (and FP8 ones under FP8 recipes).
                assert_eq!(q, &out[0].1, "{ctx} rank {rank}: gathered FP8 weights");
                let fp8 = recipe.is_some() && bwd != BackwardMode::HighPrecision;
                assert_eq!(q.iter().all(Option::is_some), fp8, "{ctx}");
            }
        }
    }
}

#[test]
fn one_forward_on_the_whole_batch_differs_only_by_summation_order() {
    // f32 model: one process runs all B sequences in one forward; N ranks run B/N each.
    let (want, _) = reference(
        model("tiny", None, BackwardMode::Quantized, 6),
        1,
        3,
        None,
        0,
    );
    for n in [2, 4] {
        let out = spawn_ranks(n, |c| {
            let m = model("tiny", None, BackwardMode::Quantized, 6);
            let cfg = FsdpConfig {
                adamw: adamw(),
                ..FsdpConfig::default()
            };
            let mut r = FsdpRank::new(c, m, cfg)?;
            Ok(sharded_steps(&mut r, c, 0..3)?.0)
        })
        .unwrap();
        let run = &out[0];
        for (a, b) in run.losses.iter().zip(&want.losses) {
            // Measured: 4e-9 relative at most (f32 GEMM and loss sums in another order).
            assert!((a - b).abs() <= 1e-7 * b.abs(), "n={n}: loss {a} vs {b}");
        }
        for (a, b) in run.norms.iter().zip(&want.norms) {
            // Measured: one f32 ulp (1e-7 relative).
            assert!((a - b).abs() <= 1e-6 * b.abs(), "n={n}: norm {a} vs {b}");
        }
        // Each AdamW step moves a weight by at most about lr (|m/sqrt(v)| <= ~1), and
        // rounding-level gradient differences change a step by a small share of lr
        // (more where a gradient is near zero, hence a bound in units of lr, not of the weight).
        // Measured: 1.2e-6 (n=2) and 1.5e-6 (n=4) after 3 steps, i.e. 5e-4 lr; bound 1e-3 lr per step.
        let mut worst = 0f32;
        for ((_, a), (_, b)) in run.masters.iter().zip(&want.masters) {
            for (x, y) in a.iter().zip(b) {
                worst = worst.max((x - y).abs());
            }
        }
        assert!(
            worst <= 1e-3 * LR * 3.0,
            "n={n}: worst master difference {worst}"
        );
    }
}

#[test]
fn gathered_checkpoint_loads_into_another_rank_count() {
    let recipe = Some("tensorwise");
    let bwd = BackwardMode::Quantized;
    // Two steps on 2 ranks, gather the optimizer (an ordinary single-process state) ...
    let saved = spawn_ranks(2, |c| {
        let mut r = FsdpRank::new(
            c,
            model("tiny", recipe, bwd, 7),
            FsdpConfig {
                adamw: adamw(),
                ..FsdpConfig::default()
            },
        )?;
        Ok(sharded_steps(&mut r, c, 0..2)?.1)
    })
    .unwrap();
    assert!(saved
        .iter()
        .all(|o| o.states == saved[0].states && o.step == 2));
    let full = &saved[0];
    // ... and continue on 4 ranks from it.
    let resumed = spawn_ranks(4, |c| {
        let mut m = model("tiny", recipe, bwd, 7);
        let masters = full
            .states
            .iter()
            .map(|s| {
                Ok((
                    s.name.clone(),
                    Tensor::from_f32(&s.shape, s.master.clone())?,
                ))
            })
            .collect::<Result<HashMap<_, _>>>()?;
        m.load_params(masters)?;
        let mut r = FsdpRank::from_optimizer(
            c,
            m,
            full,
            FsdpConfig {
                adamw: adamw(),
                ..FsdpConfig::default()
            },
        )?;
        // Re-gathering before any step gives back exactly what was loaded.
        let again = r.gather_optimizer(c)?;
        if again.states != full.states || again.step != full.step {
            return Err(Error::Mismatch("reloaded state differs".into()));
        }
        let run = sharded_steps(&mut r, c, 2..3)?.0;
        Ok((run, r.gathered_model(c)?))
    })
    .unwrap();
    // The same as one process: 2 steps of 2 micro-batches, then 1 step of 4.
    let (_, opt) = reference(model("tiny", recipe, bwd, 7), 2, 2, None, 0);
    let (want, opt) = reference(model("tiny", recipe, bwd, 7), 4, 1, Some(opt), 2);
    let mut want_model = model("tiny", recipe, bwd, 7);
    opt.write_back(want_model.params_mut()).unwrap();
    for (run, m) in &resumed {
        assert_eq!(run.losses, want.losses);
        assert!(bits(run) == bits(&want), "resumed masters differ");
        // The gathered model is the single-process model, tensor for tensor.
        for ((n, a), (_, b)) in m.params().into_iter().zip(want_model.params()) {
            assert!(a == b, "gathered model: {n} differs");
        }
    }
}

#[test]
fn a_rank_failing_mid_step_ends_the_job_cleanly() {
    let t0 = std::time::Instant::now();
    let cfg = FsdpConfig {
        adamw: adamw(),
        ..FsdpConfig::default()
    };
    // Rank 1 gets a malformed batch at step 2: its forward fails, rank 0 stops at its next collective.
    let e = spawn_ranks(2, |c| {
        let mut r = FsdpRank::new(
            c,
            model("tiny", Some("tensorwise"), BackwardMode::Quantized, 8),
            cfg,
        )?;
        for step in 0..3u64 {
            let (x, y) = batch(step);
            let (mut xl, yl, bl) = local_batch(&x, &y, B, T, c.rank(), 2)?;
            if c.rank() == 1 && step == 1 {
                xl.pop();
            }
            r.step(c, &xl, &yl, bl, T, LR)?;
        }
        Ok(())
    })
    .unwrap_err();
    assert!(matches!(e, Error::Nn(_)), "{e}");
    // A rank that panics mid-step (a killed worker).
    let e = spawn_ranks(3, |c| {
        let m = model("tiny", None, BackwardMode::Quantized, 8);
        let mut r = FsdpRank::new(c, m, cfg)?;
        r.gather_weights(c)?;
        if c.rank() == 2 {
            panic!("rank 2 killed");
        }
        r.gather_weights(c)?;
        Ok(())
    })
    .unwrap_err();
    assert!(matches!(&e, Error::Panicked { rank: 2, .. }), "{e}");
    assert!(t0.elapsed().as_secs() < 20);
}

#[test]
fn mismatched_setups_are_errors() {
    // Ranks built from different seeds.
    let e = spawn_ranks(2, |c| {
        let m = model("tiny", None, BackwardMode::Quantized, 10 + c.rank() as u64);
        FsdpRank::new(c, m, FsdpConfig::default()).map(|_| ())
    })
    .unwrap_err();
    assert!(
        matches!(&e, Error::Mismatch(m) if m.contains("rank 1")),
        "{e}"
    );
    // A global batch that does not split over the ranks.
    let (x, y) = batch(0);
    assert!(matches!(
        local_batch(&x, &y, B, T, 0, 3),
        Err(Error::Config(_))
    ));
    assert!(local_batch(&x[1..], &y, B, T, 0, 2).is_err());
    // An optimizer state for another model.
    let e = spawn_ranks(1, |c| {
        let m = model("tiny", None, BackwardMode::Quantized, 1);
        let other = model("small", None, BackwardMode::Quantized, 1);
        let opt = AdamW::new(&other.params(), adamw());
        FsdpRank::from_optimizer(c, m, &opt, FsdpConfig::default()).map(|_| ())
    })
    .unwrap_err();
    assert!(matches!(e, Error::Shape(_)), "{e}");
}

/// Bytes of one gather of the block linears' weights, FP8 (given recipe) vs bf16.
fn block_gather_ratio(n: usize, recipe: &str, bwd: BackwardMode) -> f64 {
    let out = spawn_ranks(n, |c| {
        let fp8_cfg = FsdpConfig::default();
        let bf16_cfg = FsdpConfig {
            fp8_gather: false,
            weight_wire: Wire::Bf16,
            ..FsdpConfig::default()
        };
        let mut a = FsdpRank::new(c, model("small", Some(recipe), bwd, 2), fp8_cfg)?;
        let mut b = FsdpRank::new(c, model("small", Some(recipe), bwd, 2), bf16_cfg)?;
        Ok((a.gather_weights(c)?, b.gather_weights(c)?))
    })
    .unwrap();
    let (fp8, bf16) = out[0];
    assert!(out.iter().all(|&o| o == (fp8, bf16)));
    fp8 as f64 / bf16 as f64
}

#[test]
fn fp8_all_gather_of_block_weights_moves_at_most_0_52x_the_bf16_bytes() {
    for n in [2, 4] {
        // Per-tensor scaling: codes + one scale; the column-wise copy is a local transpose.
        // Measured on the small model: 0.5008 (n=2), 0.5015 (n=4).
        for recipe in ["tensorwise", "delayed"] {
            let r = block_gather_ratio(n, recipe, BackwardMode::Quantized);
            assert!(r <= 0.52, "{recipe} n={n}: {r}");
        }
        // Per-row scaling with the dequantized backward needs only the row-wise copy.
        // Measured 0.5138 (n=2), 0.5144 (n=4): one f32 scale per row.
        let r = block_gather_ratio(n, "rowwise", BackwardMode::Dequantized);
        assert!(r <= 0.52, "rowwise/dequantized n={n}: {r}");
        // With the quantized backward its column-wise copy (per-column scales) is gathered too:
        // about the bytes of bf16, still no more than gathering bf16 and quantizing locally.
        // Measured 1.0144 (n=2), 1.0156 (n=4).
        let r = block_gather_ratio(n, "rowwise", BackwardMode::Quantized);
        assert!(r <= 1.02, "rowwise/quantized n={n}: {r}");
    }
}

#[test]
fn bf16_gradient_wire_halves_reduce_scatter_bytes_and_stays_close() {
    let run = |wire: Wire| {
        spawn_ranks(2, |c| {
            let m = model("tiny", Some("tensorwise"), BackwardMode::Quantized, 9);
            let cfg = FsdpConfig {
                adamw: adamw(),
                grad_wire: wire,
                ..FsdpConfig::default()
            };
            let mut r = FsdpRank::new(c, m, cfg)?;
            let (x, y) = batch(0);
            let (xl, yl, bl) = local_batch(&x, &y, B, T, c.rank(), 2)?;
            let out = r.step(c, &xl, &yl, bl, T, LR)?;
            Ok((out, r.gather_optimizer(c)?))
        })
        .unwrap()
        .remove(0)
    };
    let (o32, a32) = run(Wire::F32);
    let (o16, a16) = run(Wire::Bf16);
    let rs = CollectiveKind::ReduceScatter;
    assert_eq!(2 * o16.comm.bytes(rs), o32.comm.bytes(rs));
    assert_eq!(o16.loss, o32.loss); // the forward is the same
                                    // bf16 gradients (8 significant bits) move the norm by well under 1% (measured 1.3e-4).
    assert!((o16.grad_norm - o32.grad_norm).abs() <= 1e-2 * o32.grad_norm);
    // AdamW's first step is about lr * sign(g): bf16 rounding changes it only where g is near 0,
    // where a sign can flip. Measured worst: 1.0 lr.
    let worst = a16
        .states
        .iter()
        .zip(&a32.states)
        .flat_map(|(a, b)| a.master.iter().zip(&b.master).map(|(x, y)| (x - y).abs()))
        .fold(0f32, f32::max);
    assert!(worst <= 2.0 * LR, "{worst}");
}

/// Targets masked unevenly over the ranks (three in four of rank 0's, none
/// of rank 1's): the ranks' step is the batch's mean over its counted
/// targets, one process's forward of the whole batch to f32 summation
/// order (loss and gradient norm), not the mean of the ranks' means.
#[test]
fn masked_targets_weigh_each_rank_by_its_share_of_the_counted_ones() {
    use octet_nn::loss::IGNORE;
    let (x, y) = batch(0);
    let masked: Vec<u32> = y
        .iter()
        .enumerate()
        .map(|(i, &t)| {
            if i < B * T / 2 && i % 4 != 0 {
                IGNORE
            } else {
                t
            }
        })
        .collect();
    let mut one = model("tiny", None, BackwardMode::Quantized, 7);
    let (want, saved) = one.forward(&x, &masked, B, T).unwrap();
    let grads = one.backward(saved).unwrap();
    let norm = grads
        .iter()
        .flat_map(|(_, g)| g.to_f32_vec())
        .map(|v| (v as f64) * (v as f64))
        .sum::<f64>()
        .sqrt();
    let half = B * T / 2;
    let mean_of_means = (0..2)
        .map(|r| {
            let rows = r * half..(r + 1) * half;
            one.forward(&x[rows.clone()], &masked[rows], B / 2, T)
                .unwrap()
                .0
        })
        .sum::<f64>()
        / 2.0;
    let out = spawn_ranks(2, |c| {
        let m = model("tiny", None, BackwardMode::Quantized, 7);
        let cfg = FsdpConfig {
            adamw: adamw(),
            ..FsdpConfig::default()
        };
        let mut r = FsdpRank::new(c, m, cfg)?;
        let (xl, yl, bl) = local_batch(&x, &masked, B, T, c.rank(), 2)?;
        let s = r.step(c, &xl, &yl, bl, T, LR)?;
        Ok((s.loss, s.grad_norm))
    })
    .unwrap();
    for (loss, g) in out {
        assert!((loss - want).abs() <= 1e-6 * want, "loss {loss} vs {want}");
        assert!(
            ((g as f64) - norm).abs() <= 1e-5 * norm,
            "norm {g} vs {norm}"
        );
    }
    assert!(
        (mean_of_means - want).abs() > 1e-4 * want,
        "the ranks' plain mean {mean_of_means} should differ from {want}"
    );
}

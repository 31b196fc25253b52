//! Sharded training (one rank on one GPU) against the unsharded model.

use super::*;

/// Sharded data parallel on one rank (an NCCL communicator of one): three
/// AdamW steps of the sharded model equal those of the plain model bit for
/// bit (losses, masters), in bf16 (bf16 gathers), in tensorwise with the
/// quantized backward (FP8 gathers with the all-reduced amax), in delayed
/// (FP8 gathers with the scale from the history) and in blockwise (FP8
/// gathers of 128x128-block codes and scale grids). With one rank
/// every collective is a copy, so any difference is a bug in the sharded
/// bookkeeping (offsets, padding, the gathered FP8 bytes and scale, the
/// locally transposed column-wise copy), with and without resharding after
/// forward (the weights gathered again for backward must be the same bytes),
/// and with the forward of every block, or of the first only, recomputed in
/// backward (the weights gathered again for it), with an evaluation forward
/// after each step. The collectives run on the
/// communicator's own stream, ordered with the compute stream by events, so
/// these cases also check that ordering (a missing wait reads stale or
/// half-written weights or gradients). Several ranks: `bench/multi-gpu.sh`.
pub fn sharded_cases(gpu: &Gpu, out: &mut Vec<CaseResult>) -> Result<()> {
    use crate::llama::cuda::GpuLlama;
    use octet_cuda::nccl::NcclComm;
    let (b, t) = (4, 64);
    let (toks, tgts) = (test_tokens(2201, b * t), test_tokens(2202, b * t));
    let p = TEST_ADAM;
    let comm = NcclComm::new(gpu, 0, 1, &NcclComm::unique_id()?)?;
    // The families add slots to each block (biases, q/k norm gains): the
    // shard layout and the flushes find them by name.
    let family = crate::llama::LlamaConfig {
        qkv_bias: true,
        o_bias: true,
        qk_norm: true,
        head_dim: Some(128),
        ..test_config(256, 512, 2, 4, 2, 64)
    };
    for (recipe_name, families) in [
        ("bf16", false),
        ("tensorwise", false),
        ("delayed", false),
        ("blockwise", false),
        ("bf16", true),
        ("tensorwise", true),
    ] {
        let recipe = match recipe_name {
            "bf16" => None,
            r => Some(octet_fp8::Recipe::from_name(r)?),
        };
        // 128x128 weight blocks: widths multiples of 128, shards of whole blocks.
        let cfg = match (recipe_name, families) {
            (_, true) => family.clone(),
            ("blockwise", _) => test_config(512, 1024, 2, 4, 4, 64),
            _ => test_config(256, 512, 2, 4, 2, 64),
        };
        let w = super::family::perturbed(test_weights(&cfg, 77)?, 2210)?;
        let what = match families {
            true => format!("{recipe_name}, q/k/v/o biases and q/k norms at head_dim 128"),
            false => recipe_name.to_string(),
        };
        let run = |model: &mut GpuLlama<'_>| -> Result<Vec<f64>> {
            let mut losses = Vec::new();
            for _ in 0..3 {
                model.zero_grad()?;
                let (loss, saved) = model.forward(&toks, &tgts, (b, t), 1.0, true)?;
                model.backward(saved.ok_or_else(|| Error::Shape("nothing kept".into()))?)?;
                model.adamw_step(p)?;
                losses.push(loss);
                // An evaluation forward (nothing kept, no backward) between
                // steps: the sharded model gathers and frees the weights itself.
                losses.push(model.forward(&toks, &tgts, (b, t), 1.0, false)?.0);
            }
            Ok(losses)
        };
        let mut plain = GpuLlama::new(gpu, &cfg, &w, recipe)?;
        let want = run(&mut plain)?;
        let want_w = plain.weights()?;
        drop(plain);
        // Recomputing every block (usize::MAX) or the first of the two only.
        for (reshard, recompute) in [
            (false, 0),
            (true, 0),
            (false, usize::MAX),
            (true, usize::MAX),
            (false, 1),
            (true, 1),
        ] {
            let mut sharded = GpuLlama::new_sharded(gpu, &cfg, &w, recipe, &comm)?;
            sharded.set_reshard_after_forward(reshard)?;
            sharded.set_recompute(recompute);
            let fp8 = sharded.fp8_gather();
            let got = run(&mut sharded)?;
            let got_w = sharded.weights()?;
            let same_w = want_w
                .iter()
                .zip(&got_w)
                .all(|((_, a), (_, b))| f32_bits_equal(&a.to_f32_vec(), &b.to_f32_vec()));
            let same_l = want
                .iter()
                .zip(&got)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            let gathered = sharded.comm_stats().all_gather_bytes;
            out.push(CaseResult {
            name: format!(
                "sharded model, 1 rank, {what} ({} gathers{}): 3 AdamW steps and evaluations equal the plain model's",
                if fp8 { "FP8" } else { "bf16" },
                match (reshard, recompute) {
                    (true, 0) => ", resharded after forward",
                    (true, 1) => ", resharded after forward, recomputing the first block in backward",
                    (true, _) => ", resharded after forward, recomputing each block in backward",
                    (false, 0) => "",
                    (false, 1) => ", recomputing the first block in backward",
                    (false, _) => ", recomputing each block in backward",
                }
            ),
            pass: same_w && same_l && (recipe.is_none() || fp8) && gathered > 0,
            worst: format!(
                "losses {:?} vs {:?}; masters equal: {same_w}; {gathered} bytes gathered",
                got, want
            ),
        });
        }
    }
    Ok(())
}

//! Helpers shared by the trainer's integration tests.

use octet_train::trainer::TrainConfig;

/// A quick CPU run of the tiny model: bf16, batch 2 x 16 tokens, `steps`
/// steps, no evaluation and no samples, writing to `out/name`.
pub fn quick_run(name: &str, out: &std::path::Path, steps: u64) -> TrainConfig {
    TrainConfig {
        name: name.into(),
        out_dir: out.to_path_buf(),
        model: "tiny".into(),
        recipe: "bf16".into(),
        batch: 2,
        seq: 16,
        steps,
        eval_batches: 0,
        sample_tokens: 0,
        ..Default::default()
    }
}

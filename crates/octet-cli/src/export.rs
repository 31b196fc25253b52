//! `octet export`: a checkpoint as an FP8 model folder a serving engine loads.

use octet_train::{checkpoint, export};
use std::path::PathBuf;

/// Flags of `octet export`.
#[derive(clap::Args)]
pub struct ExportArgs {
    /// The model to export: a checkpoint directory, a run directory (its
    /// latest checkpoint) or a Hugging Face model folder.
    #[arg(long)]
    checkpoint: PathBuf,
    /// The folder to write (must not exist yet, or be empty).
    #[arg(long)]
    out: PathBuf,
    /// Layout: `compressed-tensors` (vLLM's float-quantized format, one
    /// factor per output channel), `compressed-tensors-tensor` (one factor
    /// a matrix) or `fp8-block` (Hugging Face's fine-grained FP8, 128x128
    /// blocks).
    #[arg(long, default_value = "compressed-tensors")]
    format: String,
}

pub fn run(a: ExportArgs) -> anyhow::Result<()> {
    let layout = export::layout_from_name(&a.format)?;
    let src = checkpoint::resolve_checkpoint_dir(&a.checkpoint)?;
    let n = export::export(&src, &a.out, layout)?;
    println!(
        "exported {} to {} ({}: {n} matrices in E4M3, the rest in bf16)",
        src.display(),
        a.out.display(),
        a.format
    );
    Ok(())
}

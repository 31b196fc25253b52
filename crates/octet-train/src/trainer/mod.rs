//! The training loop: batches, forward, backward, AdamW, evaluation,
//! checkpoints, metrics and a final text sample.
//!
//! Determinism: batches come from `(seed, step)`, initialisation from `seed`,
//! and every kernel is deterministic on the CPU, so a run resumed from a
//! checkpoint reproduces the uninterrupted run's losses exactly.

mod cpu;
mod lora;
mod memory;
mod sample;

pub use cpu::*;
pub use lora::*;
pub use memory::*;
pub use sample::*;

use crate::checkpoint;
use crate::data::{Dataset, Split, Tokenizer};
use crate::metrics::StepMetrics;
use crate::optim::{AdamW, AdamWConfig};
use crate::plot::{line_plot, Series};
use crate::{Error, Result};
use octet_fp8::{BackwardMode, Recipe};
use octet_nn::decode::{DecodeModel, WeightStorage};
use octet_nn::llama::{Llama, LlamaConfig, LoraSpec};
use octet_nn::lora::{BaseFormat, Compute};
use octet_tensor::{DType, Tensor};
use rand::{Rng, SeedableRng};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Largest micro-batch [`TrainConfig::validate`] accepts: `batch * seq`
/// tokens, 2^24 (16,777,216). A micro-batch is held in memory at once
/// (tokens, activations, logits); the 1B preset's GPU runs use 16K.
pub const MAX_BATCH_TOKENS: usize = 1 << 24;

/// Largest optimizer step [`TrainConfig::validate`] accepts: `batch * seq *
/// grad_accum` tokens, 2^32 (Llama 3's global batch was 2^24).
pub const MAX_STEP_TOKENS: u64 = 1 << 32;

/// Most optimizer steps a run may have (`--steps`, and the `step` of a
/// checkpoint's optimizer state): `i32::MAX`, since AdamW's bias correction
/// raises `beta` to the step as a 32-bit power.
pub const MAX_STEPS: u64 = i32::MAX as u64;

/// Most tokens the end-of-run sample may have (`--sample-tokens`): a
/// million, some thousand pages of text. The CPU sampler re-runs the whole
/// context for each token, so a larger sample would run for days.
pub const MAX_SAMPLE_TOKENS: usize = 1_000_000;

/// Most validation batches an evaluation may take (`--eval-batches`):
/// 100,000, far past the few hundred that give a stable validation loss.
/// Every evaluation (and the final one) runs them all.
pub const MAX_EVAL_BATCHES: usize = 100_000;

/// Largest peak learning rate [`TrainConfig::validate`] accepts (`--lr`):
/// 10, far above any rate AdamW trains with (its updates are about `lr` per
/// step whatever the gradient's scale); a larger one only makes the loss
/// non-finite within a few steps.
pub const MAX_LR: f32 = 10.0;

/// The share of a data file's tokens held out for validation (the last ones).
pub const DATA_VAL_FRACTION: f64 = 0.1;

/// Everything a run is configured by (serialised into checkpoints). Read
/// from a file (`octet train --config`), a key it does not have is an error
/// that names the key: a misspelt setting is not silently left at its default.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TrainConfig {
    /// Run name: outputs go to `out_dir/name`.
    pub name: String,
    /// Parent directory of runs.
    pub out_dir: PathBuf,
    /// Model preset (`tiny`, `small`, `medium`, `1b`), unless `model_config` is given.
    pub model: String,
    /// Explicit model dimensions (overrides `model`).
    pub model_config: Option<LlamaConfig>,
    /// Blocks of the preset `model` in place of its own count (`--layers`),
    /// e.g. as many of the 8B shape's 32 as fit one GPU.
    pub layers: Option<usize>,
    /// Start from the weights of this checkpoint directory (`config.json` +
    /// `model.safetensors` with Hugging Face names, FP8 matrices
    /// dequantized; its dimensions override `model` and `model_config`)
    /// instead of a random model: a new run at step 0 with a fresh optimizer.
    pub init: Option<PathBuf>,
    /// A LoRA adapter (PEFT layout) merged onto `init`'s weights first.
    pub init_adapter: Option<PathBuf>,
    /// The base `init_adapter` was trained on (`octet lora --base-format`);
    /// `None`: what the adapter records, else `fp8-tensorwise`
    /// ([`merge_adapter`]).
    pub init_adapter_base_format: Option<String>,
    /// Training data: a text file, a directory of .txt, a .bin token file,
    /// or fine-tuning examples as `.jsonl` ([`crate::finetune`]); `None` =
    /// embedded corpus.
    pub data: Option<PathBuf>,
    /// Tokenizer of text data and samples: `byte` (256 ids), `gpt2`
    /// (GPT-2's BPE; a preset model gets 50,304 ids, an explicit or `init`
    /// model must have at least 50,257), or a `tokenizer.json` or a model
    /// folder holding one ([`crate::hf_tokenizer`]).
    pub tokenizer: String,
    /// Which tokens of `.jsonl` data the loss counts: `completion` (the
    /// completions and assistant messages) or `all` ([`crate::finetune::LossOn`]).
    pub loss_on: String,
    /// `bf16` (high precision, no FP8) or an FP8 recipe name (`Recipe::NAMES`).
    pub recipe: String,
    /// Backward mode of FP8 recipes.
    pub backward: String,
    /// Sequences per micro-batch.
    pub batch: usize,
    /// Tokens per sequence.
    pub seq: usize,
    /// Micro-batches per optimizer step.
    pub grad_accum: usize,
    /// Optimizer steps.
    pub steps: u64,
    /// Peak learning rate.
    pub lr: f32,
    /// Final learning rate of the cosine (at most `lr`).
    pub min_lr: f32,
    /// Warmup steps.
    pub warmup: u64,
    /// AdamW settings.
    pub adamw: AdamWConfig,
    /// Seed of initialisation and batches.
    pub seed: u64,
    /// Evaluate every this many steps (and at the end).
    pub eval_every: u64,
    /// Validation batches per evaluation.
    pub eval_batches: usize,
    /// Checkpoint every this many steps (0 = only at the end).
    pub ckpt_every: u64,
    /// Write checkpoints at all (false: none, not even the final one).
    pub save: bool,
    /// Tokens of generated text at the end (0 = none).
    pub sample_tokens: usize,
    /// Write per-layer amax / saturation / underflow telemetry every this many steps (0 = never).
    pub telemetry_every: u64,
    /// LoRA fine-tuning of a frozen base instead of full training.
    pub lora: Option<LoraSettings>,
    /// Sharded runs: gradients reduce-scattered in `f32` or `bf16`.
    pub grad_reduce: String,
    /// Sharded runs on GPUs: each block's weights gathered for its forward,
    /// freed, and gathered again for its backward (FSDP's `reshard_after_forward`).
    pub reshard_after_forward: bool,
    /// How the activations that only the norms', SwiGLU's and the attention's
    /// backward read are kept: `full` (f32 / bf16), `fp8` (E4M3 with a
    /// factor per row; GPU only, see `octet_nn::llama::cuda::SavedActivations`)
    /// or `auto` (the default: [`TrainConfig::fp8_saved_activations`]).
    pub saved_activations: String,
    /// Activation recomputation of every block: keep only each block's input
    /// for backward and run the block's forward again there (same results,
    /// less memory, one more forward of the blocks).
    pub recompute: bool,
    /// Activation recomputation of the first this many blocks only (0: as
    /// `recompute` says), a dial between memory and speed.
    pub recompute_blocks: usize,
    /// GPU: the per-tensor FP8 forward products (tensorwise and delayed
    /// recipes, LoRA's `--compute fp8` base) use cuBLASLt's fast
    /// accumulation, as Transformer Engine and torchao do by default; the
    /// gradients' products always promote to f32. The CPU accumulates in f32
    /// either way.
    pub fp8_fast_accum: bool,
}

/// `Err` naming the first tensor (by name order) holding a NaN or an infinity
/// and how many of its values are.
pub fn check_finite<'a>(
    weights: impl IntoIterator<Item = (&'a str, &'a Tensor)>,
) -> std::result::Result<(), String> {
    let mut sorted: Vec<(&str, &Tensor)> = weights.into_iter().collect();
    sorted.sort_by(|a, b| a.0.cmp(b.0));
    for (name, t) in sorted {
        let bad = t.to_f32_vec().iter().filter(|v| !v.is_finite()).count();
        if bad > 0 {
            return Err(format!("{name} holds {bad} non-finite values"));
        }
    }
    Ok(())
}

/// The `(peak lr, final lr, warmup steps)` of a model preset whose schedule
/// differs from the default's (3e-3 to 3e-4 after 30 steps, made for the
/// small models): the ~1B preset takes 3e-4 to 3e-5 after 100 steps, the
/// peak rate of published Llama-style runs of that size. (At 3e-3 its first
/// losses went 6.1, 6.8, 11.1, 4.8, 7.5 while the rate was still warming up.)
pub fn preset_schedule(model: &str) -> Option<(f32, f32, u64)> {
    match model {
        "1b" | "8b" => Some((3e-4, 3e-5, 100)),
        _ => None,
    }
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            name: "default".into(),
            out_dir: PathBuf::from("runs"),
            model: "small".into(),
            model_config: None,
            layers: None,
            init: None,
            init_adapter: None,
            init_adapter_base_format: None,
            data: None,
            tokenizer: "byte".into(),
            loss_on: "completion".into(),
            recipe: "tensorwise".into(),
            backward: "quantized".into(),
            batch: 8,
            seq: 128,
            grad_accum: 1,
            steps: 300,
            lr: 3e-3,
            min_lr: 3e-4,
            warmup: 30,
            adamw: AdamWConfig::default(),
            seed: 1337,
            eval_every: 50,
            eval_batches: 8,
            ckpt_every: 0,
            save: true,
            sample_tokens: 200,
            telemetry_every: 50,
            lora: None,
            grad_reduce: "f32".into(),
            reshard_after_forward: false,
            saved_activations: "auto".into(),
            recompute: false,
            recompute_blocks: 0,
            fp8_fast_accum: true,
        }
    }
}

impl TrainConfig {
    /// How many blocks (from the first) recompute their activations in
    /// backward: every one under `recompute` (`usize::MAX`, which the models
    /// read as all), else `recompute_blocks`.
    pub fn recomputed_blocks(&self) -> usize {
        match self.recompute {
            true => usize::MAX,
            false => self.recompute_blocks,
        }
    }

    /// Use the learning-rate schedule of model preset `model` (see
    /// [`preset_schedule`]) where it has one of its own.
    pub fn use_preset_schedule(&mut self, model: &str) {
        if let Some((lr, min_lr, warmup)) = preset_schedule(model) {
            self.lr = lr;
            self.min_lr = min_lr;
            self.warmup = warmup;
        }
    }

    /// The model dimensions this config asks for, with
    /// `max_position_embeddings` raised to `seq` where it is shorter;
    /// validated ([`LlamaConfig::validate`]), and `seq` may not exceed
    /// [`MAX_POSITIONS`](octet_nn::llama::MAX_POSITIONS).
    pub fn llama_config(&self) -> Result<LlamaConfig> {
        let max = octet_nn::llama::MAX_POSITIONS;
        if self.seq > max {
            return Err(Error::Train(format!(
                "--seq {} exceeds the limit of {max} positions",
                self.seq
            )));
        }
        if let Some(l) = self.layers {
            if self.init.is_some() || self.model_config.is_some() {
                return Err(Error::Train(format!(
                    "--layers {l} sets the blocks of a preset (--model); the checkpoint or model \
                     config of this run gives its own"
                )));
            }
        }
        let mut cfg = match (&self.init, &self.model_config) {
            (Some(dir), _) => checkpoint::load_config(dir)?,
            (None, Some(c)) => c.clone(),
            (None, None) => LlamaConfig::preset(&self.model)?,
        };
        if let Some(l) = self.layers {
            if !(1..=octet_nn::llama::MAX_LAYERS).contains(&l) {
                return Err(Error::Train(format!(
                    "--layers {l}: expected 1 to {}",
                    octet_nn::llama::MAX_LAYERS
                )));
            }
            cfg.num_hidden_layers = l;
        }
        let tok = self.tokenizer()?;
        if self.init.is_none() && self.model_config.is_none() {
            cfg.vocab_size = cfg.vocab_size.max(tok.model_vocab());
        } else {
            tok.check_fits(cfg.vocab_size)?;
        }
        let raised = self.seq > cfg.max_position_embeddings;
        cfg.max_position_embeddings = cfg.max_position_embeddings.max(self.seq);
        cfg.validate().map_err(|e| {
            if raised {
                Error::Train(format!(
                    "--seq {} (the model's max_position_embeddings is raised to it): {e}",
                    self.seq
                ))
            } else {
                e.into()
            }
        })?;
        Ok(cfg)
    }

    /// The model folder a new run starts from: `init`, or the LoRA base.
    pub fn model_folder(&self) -> Option<&Path> {
        self.init
            .as_deref()
            .or(self.lora.as_ref().and_then(|l| l.base.as_deref()))
    }

    /// Where the tokenizer is the default `byte` and the model folder holds
    /// a `tokenizer.json` (a model from Hugging Face), take the folder's (by
    /// its absolute path, so that a resumed run finds it from anywhere).
    /// Returns whether it did.
    pub fn use_model_tokenizer(&mut self) -> bool {
        let Some(dir) = self.model_folder() else {
            return false;
        };
        if self.tokenizer != "byte" || !dir.join("tokenizer.json").is_file() {
            return false;
        }
        let abs = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
        self.tokenizer = abs.display().to_string();
        true
    }

    /// The tokenizer (`tokenizer`, checked).
    pub fn tokenizer(&self) -> Result<Tokenizer> {
        Tokenizer::from_name(&self.tokenizer)
    }

    /// The `tokenizer.json` of a run on a Hugging Face tokenizer (the model
    /// folder's or `--tokenizer`'s), whose folder's tokenizer files every
    /// checkpoint of the run carries
    /// ([`checkpoint::copy_tokenizer_files`]); `None` for `byte` and `gpt2`.
    pub fn tokenizer_files(&self) -> Option<PathBuf> {
        match self.tokenizer.as_str() {
            "byte" | "gpt2" => None,
            path => crate::hf_tokenizer::tokenizer_json(Path::new(path)),
        }
    }

    /// The vocabulary of the model this run trains: a LoRA base's, else
    /// [`TrainConfig::llama_config`]'s.
    pub fn model_vocab(&self) -> Result<usize> {
        match self.lora.as_ref().and_then(|l| l.base.as_ref()) {
            Some(base) => Ok(checkpoint::load_config(base)?.vocab_size),
            None => Ok(self.llama_config()?.vocab_size),
        }
    }

    /// The run's data (`data`, or the embedded corpus) by its tokenizer, for
    /// a model of `vocab` ids. Checked here, before anything trains: a
    /// tokenizer with more ids than the model, and splits too short for a
    /// batch ([`TrainConfig::check_splits`]).
    pub fn dataset(&self, vocab: usize) -> Result<Dataset> {
        let tok = self.tokenizer()?;
        tok.check_fits(vocab)?;
        let loss_on = crate::finetune::LossOn::from_name(&self.loss_on)?;
        let data = match &self.data {
            Some(p) if crate::finetune::is_jsonl(p) => {
                Dataset::load_jsonl(p, &tok, loss_on, vocab, DATA_VAL_FRACTION)?
            }
            Some(p) => Dataset::load_with(p, &tok, vocab, DATA_VAL_FRACTION)?,
            None => Dataset::default_corpus_with(&tok),
        };
        self.check_splits(&data)?;
        Ok(data)
    }

    /// An error unless every split the run draws batches from holds a
    /// window of `seq + 2` tokens: the training split always, the validation
    /// split when the run evaluates (`eval_batches > 0`). Without this a
    /// short validation split would fail the run at its first evaluation,
    /// after the steps before it (and, at the end, before the final checkpoint).
    pub fn check_splits(&self, data: &Dataset) -> Result<()> {
        let need = self.seq.saturating_add(2);
        let source = self
            .data
            .as_ref()
            .map_or("the embedded corpus".to_string(), |p| {
                p.display().to_string()
            });
        if data.train.len() < need {
            return Err(Error::Data(format!(
                "{source}: the training split has {} tokens; batches of --seq {} need at least {need} (seq + 2); lower --seq or add data",
                data.train.len(),
                self.seq
            )));
        }
        if self.eval_batches > 0 && data.val.len() < need {
            return Err(Error::Data(format!(
                "{source}: the validation split (the last {:.0}% of the tokens) has {} tokens; evaluating batches of --seq {} needs at least {need} (seq + 2); lower --seq, add data, or give --eval-batches 0",
                100.0 * DATA_VAL_FRACTION,
                data.val.len(),
                self.seq
            )));
        }
        Ok(())
    }

    /// Check a run resumed from `resume` (a checkpoint directory) before
    /// anything loads: its `config.json` is valid, the tokenizer's ids and
    /// `seq` fit its dimensions (full training), it has steps left (the
    /// checkpoint's optimizer step must be below `steps`), and a LoRA run
    /// continues the adapter as it was trained ([`LoraSettings::check_resume`]).
    /// A resume also removes the temporary files that dead processes left in
    /// the run directory and its `checkpoints`
    /// ([`checkpoint::remove_stale_temp_files`]).
    pub fn check_resume(&self, resume: Option<&Path>) -> Result<()> {
        self.check_run_dir(resume)?;
        let Some(dir) = resume else {
            return Ok(());
        };
        // A kill in an earlier save may have left temporary files (a
        // `.latest.tmp.<pid>`) and directories: removed here, each file with
        // a trace line.
        let run = self.out_dir.join(&self.name);
        checkpoint::clean_killed_saves(&run.join("checkpoints"));
        for d in [run.join("checkpoints"), run] {
            checkpoint::remove_stale_temp_files(&d);
        }
        if self.lora.is_none() && checkpoint::is_adapter_only(dir) {
            return Err(Error::Train(format!(
                "{} is a LoRA adapter's checkpoint: continue it with `octet lora --resume`",
                dir.display()
            )));
        }
        let mcfg = checkpoint::load_config(dir)?;
        if self.lora.is_none() {
            // A resumed model keeps the checkpoint's dimensions (not
            // `--model`'s): the tokens and the sequence must fit them.
            self.check_fits(&mcfg, dir, "a resumed model")?;
        }
        if let Some(l) = &self.lora {
            l.check_resume(dir)?;
        }
        let step = checkpoint::read_step(dir)?;
        if step >= self.steps {
            return Err(Error::Train(format!(
                "checkpoint {} is at step {step}; --steps {} leaves nothing to train; raise --steps",
                dir.display(),
                self.steps
            )));
        }
        Ok(())
    }

    /// The run directory (`out_dir/name`) holds no other run: a new run
    /// there would append to its `metrics.jsonl` and replace its checkpoints
    /// at the same steps, next to the others it leaves. A run resumed from a
    /// checkpoint of that directory goes on in it.
    pub fn check_run_dir(&self, resume: Option<&Path>) -> Result<()> {
        let dir = self.out_dir.join(&self.name);
        if self.name.is_empty()
            || self.name.contains(['/', '\\'])
            || self.name == ".."
            || self.name == "."
        {
            return Err(Error::Train(format!(
                "--name {:?}: a run's name is one directory under --out-dir, not empty nor a path",
                self.name
            )));
        }
        let checkpoints = dir.join("checkpoints");
        let has_checkpoints = std::fs::read_dir(&checkpoints).is_ok_and(|mut d| d.next().is_some());
        if !has_checkpoints && !dir.join("metrics.jsonl").exists() {
            return Ok(());
        }
        let same = |a: &Path, b: &Path| match (a.canonicalize(), b.canonicalize()) {
            (Ok(a), Ok(b)) => a == b,
            _ => false,
        };
        let resumes_here = resume
            .and_then(|ck| ck.parent())
            .is_some_and(|p| same(p, &checkpoints));
        if resumes_here {
            return Ok(());
        }
        let d = dir.display();
        Err(Error::Train(if has_checkpoints {
            format!(
                "{d} already holds a run: resume it with --resume {d}, or give another --name \
                 or --out-dir, or remove the directory"
            )
        } else {
            format!(
                "{d} already holds the metrics.jsonl of a run with no checkpoint (--no-save, or \
                 stopped before its first): give another --name or --out-dir, or remove the directory"
            )
        }))
    }

    /// The tokenizer's ids and `seq` fit the dimensions of the checkpoint in
    /// `dir` (`config.json`), which `what` (a resumed model, one started from
    /// `--init`) keeps instead of `--model`'s.
    fn check_fits(&self, mcfg: &LlamaConfig, dir: &Path, what: &str) -> Result<()> {
        self.tokenizer()?.check_fits(mcfg.vocab_size)?;
        if self.seq > mcfg.max_position_embeddings {
            return Err(Error::Train(format!(
                "--seq {} exceeds the max_position_embeddings {} of the checkpoint {}; {what} keeps its dimensions",
                self.seq,
                mcfg.max_position_embeddings,
                dir.display()
            )));
        }
        Ok(())
    }

    /// Whether a GPU run keeps the activations only non-matrix backwards read
    /// in FP8: `fp8` yes, `full` no, and `auto` where that was measured to
    /// cost no speed and is checked by `octet selftest`: the `tensorwise`
    /// recipe (on the ~1B model, 0.728x bf16's peak memory against 0.955x at
    /// 0.99x the tokens/s, H100, batch 16 x 2048) and LoRA on an FP8 base.
    /// bf16 and the other recipes keep their activations whole unless asked.
    pub fn fp8_saved_activations(&self) -> Result<bool> {
        Ok(match self.saved_activations.as_str() {
            "fp8" => true,
            "full" => false,
            _ => match &self.lora {
                Some(l) => BaseFormat::from_name(&l.base_format)? != BaseFormat::Bf16,
                None => self.recipe == "tensorwise",
            },
        })
    }

    /// The recipe (`None` for the high-precision baseline), validated with the backward mode.
    pub fn recipe(&self) -> Result<Option<Recipe>> {
        // The mode is checked under bf16 too, which has no FP8 backward:
        // a misspelt `--backward` is an error, not a flag dropped unread.
        let backward = BackwardMode::from_name(&self.backward)?;
        if self.recipe == "bf16" || self.recipe == "hp" {
            return Ok(None);
        }
        let r = Recipe::from_name(&self.recipe).map_err(|e| {
            // The trainer's recipes are the FP8 ones plus the baseline.
            Error::Train(format!(
                "{e}; or bf16 (no FP8) for the high-precision baseline"
            ))
        })?;
        Ok(Some(r.with_backward(backward)?))
    }

    /// What the run trains with, for summaries and plots: the recipe's
    /// string (`bf16` for the baseline), or the LoRA settings with theirs.
    pub fn run_label(&self) -> Result<String> {
        Ok(match &self.lora {
            Some(l) => format!(
                "lora r={} base {} compute {} ({})",
                l.rank,
                l.base_format,
                l.compute,
                l.spec(&self.recipe, &self.backward, self.seed)?.recipe
            ),
            None => self.recipe()?.map_or("bf16".to_string(), |r| r.to_string()),
        })
    }

    /// The weights a new run starts from: `init`'s (with `init_adapter`
    /// merged in) with their dimensions, or `None` for a random model.
    pub fn init_weights(&self) -> Result<Option<(LlamaConfig, HashMap<String, Tensor>)>> {
        let Some(dir) = &self.init else {
            return Ok(None);
        };
        let (mcfg, w) = match &self.init_adapter {
            Some(adapter) => {
                let m = merge_adapter(dir, adapter, self.init_adapter_base_format.as_deref())?;
                // As `octet lora merge` and `octet generate --adapter` warn.
                if let Some(rec) = &m.recorded_other_base {
                    tracing::warn!(
                        "the adapter {} was trained on {rec}, not on {}; merging it anyway",
                        adapter.display(),
                        dir.display()
                    );
                }
                (m.cfg, m.weights)
            }
            None => checkpoint::load_model_folder(dir, DType::F32)?,
        };
        Ok(Some((mcfg, w)))
    }

    /// Check the numbers make sense.
    pub fn validate(&self) -> Result<()> {
        if self.init_adapter.is_some() && self.init.is_none() {
            return Err(Error::Train(
                "--init-adapter merges onto the checkpoint of --init; give both".into(),
            ));
        }
        if let Some(adapter) = &self.init_adapter {
            checkpoint::load_adapter_config(adapter)?;
        }
        if let Some(dir) = &self.init {
            self.check_fits(
                &checkpoint::load_config(dir)?,
                dir,
                "a model started from --init",
            )?;
        }
        if self.init.is_some() && self.lora.is_some() {
            return Err(Error::Train(
                "a LoRA run takes its base with --base, not --init".into(),
            ));
        }
        if self.batch == 0 || self.seq == 0 || self.grad_accum == 0 || self.steps == 0 {
            return Err(Error::Train(
                "batch, seq, grad_accum and steps must be at least 1".into(),
            ));
        }
        if self.steps > MAX_STEPS {
            return Err(Error::Train(format!(
                "--steps {} exceeds the limit of {MAX_STEPS}",
                self.steps
            )));
        }
        match self.batch.checked_mul(self.seq) {
            Some(n) if n <= MAX_BATCH_TOKENS => {}
            _ => {
                return Err(Error::Train(format!(
                    "--batch {} x --seq {} tokens per micro-batch exceed the limit of {MAX_BATCH_TOKENS}",
                    self.batch, self.seq
                )))
            }
        }
        let step_tokens = (self.batch as u128) * (self.seq as u128) * (self.grad_accum as u128);
        if step_tokens > u128::from(MAX_STEP_TOKENS) {
            return Err(Error::Train(format!(
                "--batch {} x --seq {} x --grad-accum {} = {step_tokens} tokens per step exceed the limit of {MAX_STEP_TOKENS}",
                self.batch, self.seq, self.grad_accum
            )));
        }
        if !(self.lr > 0.0 && self.lr.is_finite()) {
            return Err(Error::Train(format!(
                "--lr (lr) = {}: the learning rate must be a finite number above 0",
                self.lr
            )));
        }
        if self.lr > MAX_LR {
            return Err(Error::Train(format!(
                "--lr (lr) = {}: the learning rate must be at most {MAX_LR} (AdamW moves each \
                 weight by about lr a step; typical peaks are 1e-4 to 3e-3)",
                self.lr
            )));
        }
        if self.sample_tokens > MAX_SAMPLE_TOKENS {
            return Err(Error::Train(format!(
                "--sample-tokens (sample_tokens) = {} exceeds the limit of {MAX_SAMPLE_TOKENS} \
                 tokens; sample longer texts with `octet generate`",
                self.sample_tokens
            )));
        }
        if self.eval_batches > MAX_EVAL_BATCHES {
            return Err(Error::Train(format!(
                "--eval-batches (eval_batches) = {} exceeds the limit of {MAX_EVAL_BATCHES} \
                 batches per evaluation",
                self.eval_batches
            )));
        }
        if !(self.min_lr >= 0.0 && self.min_lr.is_finite()) {
            return Err(Error::Train(format!(
                "min_lr = {}: the final learning rate must be a finite number of at least 0",
                self.min_lr
            )));
        }
        if self.min_lr > self.lr {
            return Err(Error::Train(format!(
                "--lr (lr) = {} is below the final learning rate --min-lr (min_lr) = {}: the cosine would raise the rate past the peak; give --min-lr at most --lr",
                self.lr, self.min_lr
            )));
        }
        self.adamw.validate()?;
        self.tokenizer()?;
        crate::finetune::LossOn::from_name(&self.loss_on)?;
        if !matches!(self.saved_activations.as_str(), "auto" | "full" | "fp8") {
            return Err(Error::Train(format!(
                "--saved-activations {}: expected auto, full or fp8",
                self.saved_activations
            )));
        }
        if self.recompute && self.recompute_blocks > 0 {
            return Err(Error::Train(format!(
                "--recompute recomputes every block and --recompute-blocks {} the first ones: give one",
                self.recompute_blocks
            )));
        }
        if !matches!(self.grad_reduce.as_str(), "f32" | "bf16") {
            return Err(Error::Train(format!(
                "--grad-reduce {}: expected f32 or bf16",
                self.grad_reduce
            )));
        }
        match &self.lora {
            // LoRA quantizes with its own layer settings; the recipe names them.
            Some(l) => {
                l.spec(&self.recipe, &self.backward, self.seed)?;
            }
            None => {
                self.recipe()?;
            }
        }
        self.llama_config()?;
        Ok(())
    }
}

/// What the loop reports to its caller after each step (for a progress bar).
pub trait Observer {
    /// Called after every optimizer step.
    fn step(&mut self, m: &StepMetrics, total: u64);
    /// Free-form messages (evaluation, checkpoints).
    fn note(&mut self, msg: &str);
}

/// An observer that prints nothing.
pub struct Quiet;
impl Observer for Quiet {
    fn step(&mut self, _: &StepMetrics, _: u64) {}
    fn note(&mut self, _: &str) {}
}

/// Summary of a finished run.
#[derive(Clone, Debug, serde::Serialize)]
pub struct RunSummary {
    /// Output directory.
    pub dir: PathBuf,
    /// Recipe string (`bf16` or the recipe's display form).
    pub recipe: String,
    /// Final training loss (last step).
    pub final_loss: f64,
    /// Final validation loss.
    pub final_val_loss: f64,
    /// Mean tokens per second over the run (excluding evaluation).
    pub tokens_per_s: f64,
    /// Largest saved-for-backward bytes of a step: what the forward keeps
    /// until backward (under recomputation the block inputs, not the one
    /// block backward rebuilds at a time).
    pub peak_saved_bytes: usize,
    /// Every step's training loss (for resume checks and plots).
    pub losses: Vec<f64>,
    /// Generated sample text.
    pub sample: String,
    /// Parameters.
    pub params: usize,
    /// Peak device memory in use (GPU runs; 0 on the CPU).
    pub peak_device_bytes: usize,
    /// Sharded GPU runs: bytes and calls rank 0 handed to NCCL per step
    /// (the mean over the steps after the first).
    pub nccl_per_step: Option<octet_cuda::nccl::NcclStats>,
    /// Where the memory at the run's peak went, in bytes: the weights,
    /// gradients and optimizer state by kind, the saved activations (by kind
    /// on the GPU, at the micro-batch that kept the most), and on the GPU the
    /// rest of the peak (workspace, the allocator's cache, the CUDA context).
    pub memory: Vec<(String, usize)>,
}

/// `parts` (name, bytes) as one line: `total GiB: a 1.20, b 0.30, ...`, in
/// GiB from a total of 1 GiB up and in MiB below, two decimals, the zero
/// parts left out.
pub fn memory_line(parts: &[(String, usize)]) -> String {
    let total: usize = parts.iter().map(|(_, b)| b).sum();
    let (unit, div) = match total >= 1 << 30 {
        true => ("GiB", (1u64 << 30) as f64),
        false => ("MiB", (1u64 << 20) as f64),
    };
    let listed: Vec<String> = parts
        .iter()
        .filter(|(_, b)| *b > 0)
        .map(|(n, b)| format!("{n} {:.2}", *b as f64 / div))
        .collect();
    format!("{:.2} {unit}: {}", total as f64 / div, listed.join(", "))
}

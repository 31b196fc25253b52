//! The training loop: batches, forward, backward, AdamW, evaluation,
//! checkpoints, metrics and a final text sample.
//!
//! Determinism: batches come from `(seed, step)`, initialisation from `seed`,
//! and every kernel is deterministic on the CPU, so a run resumed from a
//! checkpoint reproduces the uninterrupted run's losses exactly.

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

/// What `octet lora` adds to a run: the base, the adapter, how the base is
/// stored and run (unknown keys are errors, as in [`TrainConfig`]).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LoraSettings {
    /// Base checkpoint directory; `None`: a random-initialised base of the run's model preset.
    pub base: Option<PathBuf>,
    /// Adapter rank.
    pub rank: usize,
    /// Adapter alpha.
    pub alpha: f64,
    /// Targeted projections: q, k, v, o, gate, up, down.
    pub targets: Vec<String>,
    /// `bf16`, `fp8-tensorwise`, `fp8-rowwise` or `fp8-block`.
    pub base_format: String,
    /// `fp8` (FP8 GEMMs) or `bf16` (weight-only products).
    pub compute: String,
    /// LoRA dropout on the adapters' inputs (PEFT's `lora_dropout`), in `[0, 1)`.
    pub dropout: f64,
}

impl Default for LoraSettings {
    fn default() -> Self {
        LoraSettings {
            base: None,
            rank: 16,
            alpha: 32.0,
            targets: ["q", "k", "v", "o", "gate", "up", "down"]
                .map(String::from)
                .to_vec(),
            base_format: "fp8-tensorwise".into(),
            compute: "fp8".into(),
            dropout: 0.0,
        }
    }
}

impl LoraSettings {
    /// The layer settings for [`Llama::into_lora`], with the run's recipe
    /// (`bf16` means the default `tensorwise` input quantization) and backward mode.
    pub fn spec(&self, recipe: &str, backward: &str, seed: u64) -> Result<LoraSpec> {
        let name = if recipe == "bf16" || recipe == "hp" {
            "tensorwise"
        } else {
            recipe
        };
        let recipe = Recipe::from_name(name)?.with_backward(BackwardMode::from_name(backward)?)?;
        let max = octet_nn::lora::MAX_LORA_RANK;
        if !(1..=max).contains(&self.rank) {
            return Err(Error::Train(format!(
                "--rank {}: a LoRA rank must be between 1 and {max}",
                self.rank
            )));
        }
        if !(self.alpha.is_finite() && self.alpha > 0.0) {
            return Err(Error::Train(format!(
                "--alpha (lora.alpha) = {}: a LoRA alpha must be a finite number above 0",
                self.alpha
            )));
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return Err(Error::Train(format!(
                "--lora-dropout {}: expected a probability in [0, 1)",
                self.dropout
            )));
        }
        Ok(LoraSpec {
            rank: self.rank,
            alpha: self.alpha,
            targets: self
                .targets
                .iter()
                .map(|t| t.trim_end_matches("_proj").to_string())
                .collect(),
            base: BaseFormat::from_name(&self.base_format)?,
            compute: Compute::from_name(&self.compute)?,
            recipe,
            seed,
            dropout: self.dropout,
        })
    }

    /// What the adapter's checkpoints record of these settings (the base
    /// format by its canonical name, `fp8-tensorwise` for `fp8`).
    pub fn record(&self) -> checkpoint::LoraRecord {
        checkpoint::LoraRecord {
            base_format: BaseFormat::from_name(&self.base_format)
                .map_or_else(|_| self.base_format.clone(), |b| b.name().to_string()),
            compute: self.compute.clone(),
        }
    }

    /// Check that a resume from the adapter checkpoint `ckpt` continues it as
    /// it was trained: the same rank, alpha and targets (`q` and `q_proj`
    /// alike, in any order) as its `adapter_config.json`, and the same base as
    /// it records (`base_model_name_or_path`: a directory, or
    /// [`checkpoint::RANDOM_BASE`]; a null record, from adapters saved before
    /// octet wrote it, is not checked). Errors name the setting, both values,
    /// and the flag that gives the checkpoint's.
    pub fn check_resume(&self, ckpt: &Path) -> Result<()> {
        let (r, alpha, targets) = checkpoint::load_adapter_config(ckpt)?;
        let ck = ckpt.display();
        if r != self.rank {
            return Err(Error::Train(format!(
                "--rank {}: the adapter of {ck} has rank {r}; a resumed adapter keeps it (give --rank {r})",
                self.rank
            )));
        }
        // JSON's parse of a float may be an ulp off the value written.
        if self.alpha.is_nan() || (alpha - self.alpha).abs() > 1e-12 * alpha.abs() {
            return Err(Error::Train(format!(
                "--alpha {}: the adapter of {ck} was trained with alpha {alpha}; a resumed adapter keeps it (give --alpha {alpha})",
                self.alpha
            )));
        }
        let norm = |t: &[String]| {
            let mut v: Vec<String> = t
                .iter()
                .map(|s| s.trim().trim_end_matches("_proj").to_string())
                .collect();
            v.sort();
            v.dedup();
            v
        };
        let (have, want) = (norm(&targets), norm(&self.targets));
        if have != want {
            return Err(Error::Train(format!(
                "--targets {}: the adapter of {ck} targets {}; a resumed adapter keeps them (give --targets {})",
                want.join(","),
                have.join(","),
                have.join(",")
            )));
        }
        if let Some(rec) = checkpoint::load_adapter_base(ckpt)? {
            if !checkpoint::same_base(&rec, self.base.as_deref()) {
                let this = match &self.base {
                    Some(p) => format!("this run's --base is {}", p.display()),
                    None => "this run has no --base (a random base)".to_string(),
                };
                let fix = if rec == checkpoint::RANDOM_BASE {
                    "resume without --base".to_string()
                } else {
                    format!("give --base {rec}")
                };
                let was = if rec == checkpoint::RANDOM_BASE {
                    "a random base".to_string()
                } else {
                    format!("the base {rec}")
                };
                return Err(Error::Train(format!(
                    "the adapter of {ck} was trained on {was}; {this}: an adapter resumed on another base trains something else ({fix})"
                )));
            }
        }
        // The dropout (PEFT's lora_dropout): another one draws other masks.
        if let Some(d) = checkpoint::load_adapter_dropout(ckpt)? {
            if d != self.dropout {
                return Err(Error::Train(format!(
                    "--lora-dropout {}: the adapter of {ck} was trained with lora_dropout {d}; a resumed adapter keeps it (give --lora-dropout {d})",
                    self.dropout
                )));
            }
        }
        // The base's stored form and the compute, where recorded (octet_lora.json).
        if let Some(rec) = checkpoint::load_lora_record(ckpt)? {
            let mine = self.record();
            let bad = |e: octet_nn::Error| {
                Error::Checkpoint(format!(
                    "{}: {e}",
                    ckpt.join(checkpoint::LORA_RECORD).display()
                ))
            };
            let recorded = BaseFormat::from_name(&rec.base_format).map_err(bad)?.name();
            Compute::from_name(&rec.compute).map_err(bad)?;
            // Over a base stored in FP8 every FP8 form trains on the stored
            // codes; earlier builds recorded the form asked for, not those.
            let stored_fp8 = match &self.base {
                Some(b) => checkpoint::stored_fp8_scaling(b)?.is_some(),
                None => false,
            };
            let fp8 = |f: &str| f.starts_with("fp8");
            for (flag, have, want) in [
                ("--base-format", recorded, mine.base_format.as_str()),
                ("--compute", rec.compute.as_str(), mine.compute.as_str()),
            ] {
                let same_codes = flag == "--base-format" && stored_fp8 && fp8(have) && fp8(want);
                if have != want && !same_codes {
                    return Err(Error::Train(format!(
                        "{flag} {want}: the adapter of {ck} was trained with {flag} {have}; a resumed adapter keeps it (give {flag} {have})"
                    )));
                }
            }
        }
        Ok(())
    }

    /// The frozen base model in LoRA mode, from the checkpoint or random.
    pub fn build(&self, cfg: &TrainConfig) -> Result<Llama> {
        let spec = self.spec(&cfg.recipe, &cfg.backward, cfg.seed)?;
        Ok(match &self.base {
            Some(dir) => {
                let mcfg = checkpoint::load_config(dir)?;
                let (w, mut stored) = checkpoint::load_weights_fp8(dir, DType::F32)?;
                Llama::from_weights(&mcfg, w, None)?.into_lora_with(&spec, &mut stored)?
            }
            None => Llama::new_random(&cfg.llama_config()?, DType::F32, None, cfg.seed)?
                .into_lora(&spec)?,
        })
    }
}

/// A base checkpoint with an adapter merged into it.
pub struct Merged {
    /// The model's dimensions.
    pub cfg: LlamaConfig,
    /// Every tensor, f32, the block matrices `W + (alpha/r) B A`.
    pub weights: HashMap<String, Tensor>,
    /// The adapter's rank.
    pub rank: usize,
    /// The adapter's alpha.
    pub alpha: f64,
    /// The form of the base the adapter was merged onto.
    pub base: BaseFormat,
    /// The base the adapter records (`base_model_name_or_path`) where that
    /// is not the one it was merged onto: for a warning (PEFT's hub names,
    /// moved directories and random bases are all possible).
    pub recorded_other_base: Option<String>,
}

/// Merge the PEFT adapter in `adapter` onto the checkpoint in `base`, stored
/// as `base_format` says (the base the adapter was trained on: the codes of
/// an FP8 base, as [`Llama::into_lora_with`] keeps or makes them). `None`
/// takes the form the adapter records (`octet_lora.json`), else
/// `fp8-tensorwise` (what `octet lora` trains on by default); a form given
/// overrides the record (for example `bf16`, to merge onto the unquantized
/// base).
pub fn merge_adapter(base: &Path, adapter: &Path, base_format: Option<&str>) -> Result<Merged> {
    let base_format = match base_format {
        Some(f) => f.to_string(),
        None => checkpoint::load_lora_record(adapter)?
            .map_or_else(|| "fp8-tensorwise".to_string(), |r| r.base_format),
    };
    let cfg = checkpoint::load_config(base)?;
    let (weights, mut stored) = checkpoint::load_weights_fp8(base, DType::F32)?;
    let (tensors, rank, alpha, targets) = checkpoint::load_adapter(adapter)?;
    let settings = LoraSettings {
        base: Some(base.to_path_buf()),
        rank,
        alpha,
        targets,
        base_format: base_format.clone(),
        compute: "bf16".into(),
        dropout: 0.0,
    };
    let spec = settings.spec("tensorwise", "dequantized", 0)?;
    let mut model = Llama::from_weights(&cfg, weights, None)?.into_lora_with(&spec, &mut stored)?;
    model
        .load_params(tensors)
        .map_err(|e| Error::Checkpoint(format!("adapter {}: {e}", adapter.display())))?;
    let weights: HashMap<String, Tensor> = model.merged_weights()?.into_iter().collect();
    check_finite(weights.iter().map(|(n, t)| (n.as_str(), t))).map_err(|m| {
        Error::NonFinite(format!(
            "merging {} (r={rank}, lora_alpha={alpha:?}) onto {}: {m}; nothing is written",
            adapter.display(),
            base.display()
        ))
    })?;
    let recorded_other_base =
        checkpoint::load_adapter_base(adapter)?.filter(|r| !checkpoint::same_base(r, Some(base)));
    Ok(Merged {
        cfg,
        weights,
        rank,
        alpha,
        base: spec.base,
        recorded_other_base,
    })
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

/// A floor of the host memory a CPU run takes at its peak, by part, in
/// bytes ([`TrainConfig::memory_plan`]). Each part counts only buffers the
/// run cannot do without, so a run refused for it cannot fit; the real peak
/// is higher (temporaries, the allocator's slack, the data).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryPlan {
    /// The model's weights: f32 for full training; a LoRA base at least a
    /// byte a parameter (FP8), two (bf16) where its base format is `bf16`.
    pub weights: u64,
    /// Full training: the gradients (f32) and AdamW's master copy and two
    /// moments (f32), 16 bytes a parameter; LoRA's adapters are not counted.
    pub optimizer: u64,
    /// What forward keeps for backward, `(B*T)` rows of f32: per block the
    /// norms' inputs, q, k, v, the attention output, SwiGLU's gate, up and
    /// product (`6 C + 2 C_kv + 3 I` a token); a recomputed block keeps its
    /// input (`C`), plus one block's full set while its backward runs.
    pub activations: u64,
    /// One chunk of the fused LM head and loss: logits and their gradient,
    /// at most [`octet_nn::llama::HEAD_CHUNK`] f32 each (`(B*T, V)` when
    /// that is less), and the head weight's gradient `(V, C)`.
    pub logits: u64,
}

impl MemoryPlan {
    /// The sum of the parts.
    pub fn total(&self) -> u64 {
        self.weights + self.optimizer + self.activations + self.logits
    }
}

/// GiB with two decimals, for the memory messages.
fn gib(bytes: u64) -> String {
    format!("{:.2} GiB", bytes as f64 / f64::from(1u32 << 30))
}

/// The memory the host can give a new allocation now: `MemAvailable` of
/// `/proc/meminfo`, in bytes; `None` where it cannot be read (not Linux, a
/// sandbox without `/proc`).
pub fn host_available_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kb.checked_mul(1024)
}

impl TrainConfig {
    /// A floor of a CPU run's peak host memory for the model `mcfg`
    /// ([`MemoryPlan`]), from `batch`, `seq`, the recomputed blocks and
    /// whether it trains LoRA adapters (and on which base format).
    pub fn memory_plan(&self, mcfg: &LlamaConfig) -> MemoryPlan {
        let p = mcfg.num_params() as u64;
        let (weights, optimizer) = match &self.lora {
            Some(l) if l.base_format == "bf16" => (2 * p, 0),
            Some(_) => (p, 0),
            None => (4 * p, 16 * p),
        };
        let tokens = (self.batch as u64).saturating_mul(self.seq as u64);
        let (c, i, layers) = (
            mcfg.hidden_size as u64,
            mcfg.intermediate_size as u64,
            mcfg.num_hidden_layers as u64,
        );
        let kv = (mcfg.num_key_value_heads * mcfg.head_dim()) as u64;
        let block = 6 * c + 2 * kv + 3 * i;
        let recomputed = (self.recomputed_blocks() as u64).min(layers);
        let per_token =
            (layers - recomputed) * block + recomputed * c + if recomputed > 0 { block } else { 0 };
        MemoryPlan {
            weights,
            optimizer,
            activations: tokens.saturating_mul(per_token).saturating_mul(4),
            logits: tokens
                .saturating_mul(mcfg.vocab_size as u64)
                .min(octet_nn::llama::HEAD_CHUNK as u64)
                .saturating_mul(8)
                .saturating_add(
                    (mcfg.vocab_size as u64).saturating_mul(mcfg.hidden_size as u64 * 4),
                ),
        }
    }

    /// The dimensions of the model this run trains: a resumed run's or a
    /// LoRA base's are its checkpoint's, an `--init`'s its folder's, else
    /// [`TrainConfig::llama_config`]'s. Read before anything is allocated.
    pub fn run_model_config(&self, resume: Option<&Path>) -> Result<LlamaConfig> {
        match (resume, self.lora.as_ref().and_then(|l| l.base.as_ref())) {
            (Some(ck), _) => checkpoint::load_config(ck),
            (None, Some(base)) => checkpoint::load_config(base),
            (None, None) => match &self.init {
                Some(init) => checkpoint::load_config(init),
                None => self.llama_config(),
            },
        }
    }

    /// A floor of a GPU run's peak device memory on each of `world` ranks
    /// ([`MemoryPlan`]): full training keeps f32 gradients, masters and two
    /// moments and a bf16 compute copy (18 bytes a parameter on one GPU; a
    /// sharded rank keeps its share of the masters and moments, 12 bytes a
    /// parameter over `world`), LoRA its base (a byte a parameter, two for
    /// a `bf16` base); every value forward keeps takes at least a byte (FP8)
    /// on the rank's tokens; and the GPU's LM head holds its `(B*T, V)` f32
    /// logits gradient whole.
    pub fn device_memory_plan(&self, mcfg: &LlamaConfig, world: usize) -> MemoryPlan {
        let host = self.memory_plan(mcfg);
        let p = mcfg.num_params() as u64;
        let (weights, optimizer) = match (&self.lora, world) {
            (Some(_), _) => (host.weights, 0),
            (None, 1) => (2 * p, 16 * p),
            (None, w) => (0, 12 * p / w as u64),
        };
        let world = world.max(1) as u64;
        let tokens = (self.batch as u64 / world).saturating_mul(self.seq as u64);
        MemoryPlan {
            weights,
            optimizer,
            activations: host.activations / 4 / world,
            logits: tokens
                .saturating_mul(mcfg.vocab_size as u64)
                .saturating_mul(4),
        }
    }

    /// An error where the GPU run's [`TrainConfig::device_memory_plan`]
    /// floor exceeds the `free` bytes of the device, naming both and the
    /// flags that lower it; `None` (not known) checks nothing.
    pub fn check_device_memory(
        &self,
        mcfg: &LlamaConfig,
        world: usize,
        free: Option<u64>,
    ) -> Result<()> {
        let plan = self.device_memory_plan(mcfg, world);
        let layers = mcfg.num_hidden_layers;
        self.refuse_past(&plan, free, ("device memory", "free on the GPU"), layers)
    }

    /// An error where the run's [`MemoryPlan`] floor exceeds `available`
    /// bytes, naming both and the flags that lower it; `None` (the host's
    /// memory unknown) checks nothing.
    pub fn check_memory(&self, mcfg: &LlamaConfig, available: Option<u64>) -> Result<()> {
        let plan = self.memory_plan(mcfg);
        let layers = mcfg.num_hidden_layers;
        self.refuse_past(
            &plan,
            available,
            ("host memory", "available (MemAvailable)"),
            layers,
        )
    }

    /// The error of [`TrainConfig::check_memory`] and
    /// [`TrainConfig::check_device_memory`]: `plan` against `available`
    /// (`what` memory, `limit` saying where the figure comes from), for a
    /// model of `layers` blocks.
    fn refuse_past(
        &self,
        plan: &MemoryPlan,
        available: Option<u64>,
        (what, limit): (&str, &str),
        layers: usize,
    ) -> Result<()> {
        let Some(avail) = available else {
            return Ok(());
        };
        tracing::debug!(?plan, available = avail, what, "memory plan");
        if plan.total() <= avail {
            return Ok(());
        }
        let recompute = if self.recomputed_blocks() >= layers {
            String::new()
        } else {
            ", or --recompute (keep only each block's input)".into()
        };
        Err(Error::Train(format!(
            "this run needs at least {} of {what} (weights {}, gradients and optimizer \
             state {}, saved activations {}, logits {}) and {} are {limit}: \
             lower --batch {} or --seq {}{recompute}",
            gib(plan.total()),
            gib(plan.weights),
            gib(plan.optimizer),
            gib(plan.activations),
            gib(plan.logits),
            gib(avail),
            self.batch,
            self.seq
        )))
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
}

/// Mean validation loss over `n` deterministic batches.
pub fn evaluate(model: &mut Llama, data: &Dataset, cfg: &TrainConfig, n: usize) -> Result<f64> {
    let mut total = 0.0;
    for i in 0..n {
        let (x, y) = data.batch(Split::Val, cfg.batch, cfg.seq, cfg.seed, i as u64)?;
        let logits = model.logits(&x, cfg.batch, cfg.seq)?;
        total += octet_nn::loss::cross_entropy(&logits, &y)?.0;
    }
    Ok(total / n.max(1) as f64)
}

/// Sample `n` tokens after `prompt` (temperature 0.8, top 40, `seed`) with
/// a KV-cache decoder over the model's weights in f32 ([`DecodeModel`], what
/// `octet generate --weights f32` runs): one step a token while the sequence
/// fits the model's positions, the window sliding past them.
pub fn sample(model: &Llama, prompt: &[u32], n: usize, seed: u64) -> Result<Vec<u32>> {
    if n == 0 {
        return Ok(Vec::new());
    }
    let weights: HashMap<String, Tensor> = model
        .params()
        .into_iter()
        .map(|(name, t)| (name, t.clone()))
        .collect();
    let mut dec = DecodeModel::new(&model.cfg, &weights, WeightStorage::F32)?;
    let v = model.cfg.vocab_size;
    let ctx = model.cfg.max_position_embeddings;
    sample_windowed(prompt, n, ctx, seed, |feed| {
        let logits = match feed {
            Feed::Step(t) => dec.forward(&[t])?,
            Feed::Fill(window) => {
                dec.reset();
                dec.forward(window)?
            }
        };
        Ok(logits[logits.len() - v..].to_vec())
    })
}

/// [`sample`] without a cache: the model runs over the last `ctx` tokens
/// again for every token (the reference the decoders are checked against).
#[cfg(test)]
pub(crate) fn sample_rerun(
    model: &mut Llama,
    prompt: &[u32],
    n: usize,
    seed: u64,
) -> Result<Vec<u32>> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut toks = prompt.to_vec();
    let ctx = model.cfg.max_position_embeddings;
    for _ in 0..n {
        let start = toks.len().saturating_sub(ctx);
        let window = &toks[start..];
        let logits = model.logits(window, 1, window.len())?;
        let v = model.cfg.vocab_size;
        let last: Vec<f32> = logits.to_f32_vec()[(window.len() - 1) * v..].to_vec();
        toks.push(pick_token(&last, 0.8, 40, &mut rng));
    }
    Ok(toks[prompt.len()..].to_vec())
}

/// What [`sample_windowed`] asks of a KV-cache decoder; either returns the
/// logits of the token it leaves last in the cache.
pub(crate) enum Feed<'a> {
    /// Append one token to the cache.
    Step(u32),
    /// Empty the cache and fill it with these tokens (positions from 0).
    Fill(&'a [u32]),
}

/// `n` tokens after `prompt`, each picked (temperature 0.8, top 40, `seed`)
/// from the logits of the last `ctx` tokens, as the CPU trainer's
/// [`sample_rerun`] picks them, on a decoder driven by `feed`:
/// while the sequence fits the `ctx` positions each token is one step;
/// past them the window slides, and the cache is filled with it again.
pub(crate) fn sample_windowed(
    prompt: &[u32],
    n: usize,
    ctx: usize,
    seed: u64,
    mut feed: impl FnMut(Feed<'_>) -> Result<Vec<f32>>,
) -> Result<Vec<u32>> {
    if n == 0 {
        return Ok(Vec::new());
    }
    if prompt.is_empty() || ctx == 0 {
        return Err(Error::Train(format!(
            "sampling needs a prompt and a context: {} prompt tokens, {ctx} positions",
            prompt.len()
        )));
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut toks = prompt.to_vec();
    let mut logits = Vec::new();
    if prompt.len() <= ctx {
        for &t in prompt {
            logits = feed(Feed::Step(t))?;
        }
    } else {
        logits = feed(Feed::Fill(&toks[toks.len() - ctx..]))?;
    }
    for i in 0..n {
        let t = pick_token(&logits, 0.8, 40, &mut rng);
        toks.push(t);
        if i + 1 < n {
            logits = match toks.len() <= ctx {
                true => feed(Feed::Step(t))?,
                false => feed(Feed::Fill(&toks[toks.len() - ctx..]))?,
            };
        }
    }
    Ok(toks.split_off(prompt.len()))
}

/// Write `dir/loss.png` with the training and validation curves (`y_label`:
/// [`Tokenizer::loss_label`]); a plot that cannot be drawn is a note, not a
/// failed run.
pub fn plot_losses(
    dir: &Path,
    train_name: &str,
    y_label: &str,
    curve: Vec<(f64, f64)>,
    val_curve: Vec<(f64, f64)>,
    obs: &mut dyn Observer,
) {
    let series = [
        Series {
            name: train_name.to_string(),
            points: curve,
        },
        Series {
            name: "validation".into(),
            points: val_curve,
        },
    ];
    if let Err(e) = line_plot(
        &dir.join("loss.png"),
        "octet training loss",
        "step",
        y_label,
        &series,
    ) {
        obs.note(&format!("no plot: {e}"));
    }
}

/// Draw a token from `logits` with `temperature` among the `top_k` most likely.
pub fn pick_token(logits: &[f32], temperature: f32, top_k: usize, rng: &mut impl Rng) -> u32 {
    let mut idx: Vec<usize> = (0..logits.len()).collect();
    idx.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
    idx.truncate(top_k.max(1));
    let t = temperature.max(1e-3);
    let m = logits[idx[0]];
    let w: Vec<f64> = idx
        .iter()
        .map(|&i| (((logits[i] - m) / t) as f64).exp())
        .collect();
    let mut r = rng.random::<f64>() * w.iter().sum::<f64>();
    for (&i, &wi) in idx.iter().zip(&w) {
        if r < wi {
            return i as u32;
        }
        r -= wi;
    }
    idx[0] as u32
}

fn add_grads(acc: &mut Option<Vec<(String, Tensor)>>, g: Vec<(String, Tensor)>) -> Result<()> {
    match acc {
        None => *acc = Some(g),
        Some(a) => {
            for ((_, x), (_, y)) in a.iter_mut().zip(g) {
                *x = octet_tensor::cpu::add(x, &y)?;
            }
        }
    }
    Ok(())
}

/// What a non-finite loss or gradient norm at learning rate `lr` suggests
/// (appended to the error, which names the step): a rate too high is the
/// usual cause of a loss that grows until it is NaN or inf.
pub fn lr_hint(lr: f32) -> String {
    format!(
        " (at learning rate {lr:e}; a loss that diverges to NaN/inf usually means the rate is \
         too high: lower --lr, or --warmup longer)"
    )
}

/// Whether a model error is a NaN or inf (a loss, or an FP8 cast's input).
fn is_non_finite(e: &octet_nn::Error) -> bool {
    use octet_fp8::Error::NonFinite as Cast;
    matches!(
        e,
        octet_nn::Error::NonFinite(_)
            | octet_nn::Error::Quant(Cast { .. })
            | octet_nn::Error::Tensor(octet_tensor::Error::Quant(Cast { .. }))
    )
}

/// What a run started with `init` says it starts from.
pub fn init_note(cfg: &TrainConfig) -> String {
    let dir = cfg
        .init
        .as_deref()
        .map(|d| d.display().to_string())
        .unwrap_or_default();
    match &cfg.init_adapter {
        Some(a) => format!("starting from {dir} with adapter {} merged", a.display()),
        None => format!("starting from {dir}"),
    }
}

/// Train from scratch (or from `cfg.init`'s weights), or resume from
/// `resume` (a checkpoint directory).
pub fn train(
    cfg: &TrainConfig,
    resume: Option<&Path>,
    obs: &mut dyn Observer,
) -> Result<RunSummary> {
    cfg.validate()?;
    if resume.is_some() && cfg.init.is_some() {
        return Err(Error::Train(
            "--resume continues a run; --init starts a new one from weights: give one".into(),
        ));
    }
    cfg.check_resume(resume)?;
    if cfg.saved_activations == "fp8" {
        return Err(Error::Train(format!(
            "--saved-activations {} is built for the GPU model (--device cuda); the CPU model keeps its activations in f32",
            cfg.saved_activations
        )));
    }
    let recipe = match &cfg.lora {
        Some(_) => None,
        None => cfg.recipe()?,
    };
    let recipe_name = cfg.run_label()?;
    // The model's dimensions (a resumed run's or a LoRA base's are its
    // checkpoint's), to refuse a run that cannot fit before allocating it.
    let mcfg = cfg.run_model_config(resume)?;
    cfg.check_memory(&mcfg, host_available_bytes())?;
    let data = cfg.dataset(cfg.model_vocab()?)?;
    let dir = cfg.out_dir.join(&cfg.name);
    crate::create_dir_all(&dir)?;
    let (mut model, opt) = match (resume, &cfg.lora) {
        (Some(ck), Some(l)) => {
            let mut model = l.build(cfg)?;
            let (adapter, ..) = checkpoint::load_adapter(ck)?;
            model.load_params(adapter)?;
            let (mut opt, _) = checkpoint::load_optimizer(ck, &mut model)?;
            // This run's AdamW settings, as the GPU and sharded trainers take them.
            opt.cfg = cfg.adamw;
            opt.write_back(model.params_mut())?;
            obs.note(&format!(
                "resumed LoRA from {} at step {}",
                ck.display(),
                opt.step
            ));
            (model, opt)
        }
        (None, Some(l)) => {
            let model = l.build(cfg)?;
            obs.note(&format!(
                "LoRA: base matrices {} bytes ({}), {} adapter tensors",
                model.matrix_bytes(),
                l.base_format,
                model.params().len()
            ));
            let opt = AdamW::new(&model.params(), cfg.adamw);
            (model, opt)
        }
        (Some(ck), None) => {
            let mcfg = checkpoint::load_config(ck)?;
            let weights = checkpoint::load_weights(ck, DType::F32)?;
            let mut model = Llama::from_weights(&mcfg, weights, recipe)?;
            let (mut opt, _) = checkpoint::load_optimizer(ck, &mut model)?;
            // This run's AdamW settings (`--weight-decay`, `--grad-clip`, the
            // config file's), as the GPU and sharded trainers take them.
            opt.cfg = cfg.adamw;
            opt.write_back(model.params_mut())?;
            obs.note(&format!(
                "resumed from {} at step {}",
                ck.display(),
                opt.step
            ));
            (model, opt)
        }
        (None, None) => {
            let model = match cfg.init_weights()? {
                Some((mcfg, w)) => {
                    let m = Llama::from_weights(&mcfg, w, recipe)?;
                    obs.note(&init_note(cfg));
                    m
                }
                None => Llama::new_random(&cfg.llama_config()?, DType::F32, recipe, cfg.seed)?,
            };
            let opt = AdamW::new(&model.params(), cfg.adamw);
            (model, opt)
        }
    };
    model.set_recompute(cfg.recomputed_blocks());
    let mut stepper = CpuStepper {
        model,
        opt,
        cfg,
        grads: None,
        peak_saved: 0,
    };
    crate::run::run(cfg, resume, &data, &dir, &recipe_name, &mut stepper, obs)
}

/// The CPU model and its AdamW under the one loop ([`crate::run::run`]):
/// gradients summed over the micro-batches on the host, the optimizer
/// stepping the f32 masters and writing them back into the model.
struct CpuStepper<'a> {
    model: Llama,
    opt: AdamW,
    cfg: &'a TrainConfig,
    /// The step's gradients so far (summed over its micro-batches).
    grads: Option<Vec<(String, Tensor)>>,
    peak_saved: usize,
}

impl crate::run::Stepper for CpuStepper<'_> {
    fn step(&self) -> u64 {
        self.opt.step
    }

    fn begin_step(&mut self, _telemetry: bool) -> Result<()> {
        self.grads = None;
        Ok(())
    }

    fn micro_batch(&mut self, x: &[u32], y: &[u32], round: u64, step: u64, lr: f32) -> Result<f64> {
        let cfg = self.cfg;
        self.model.set_dropout_round(round);
        // The salts of stochastic rounding follow the micro-step too (as
        // sharded data parallel sets them), also after a resume.
        self.model.set_grad_round(round);
        let (loss, saved) = self.model.forward(x, y, cfg.batch, cfg.seq).map_err(|e| {
            // The step and (inside `e`) the block; checkpoints already written stay as they are.
            let hint = if is_non_finite(&e) {
                lr_hint(lr)
            } else {
                String::new()
            };
            Error::Train(format!(
                "step {}: {e}{hint}; the last good checkpoint is kept",
                step + 1
            ))
        })?;
        self.peak_saved = self.peak_saved.max(saved.bytes());
        let g = self.model.backward(saved).map_err(|e| {
            // A gradient that overflowed stops FP8 recipes here (quantizing it).
            let hint = if is_non_finite(&e) {
                lr_hint(lr)
            } else {
                String::new()
            };
            Error::Train(format!(
                "step {}: backward: {e}{hint}; the last good checkpoint is kept",
                step + 1
            ))
        })?;
        add_grads(&mut self.grads, g)?;
        Ok(loss)
    }

    fn update(
        &mut self,
        lr: f32,
        step: u64,
        telemetry: bool,
    ) -> Result<(f32, crate::run::LayerTelemetry)> {
        let mut grads = self.grads.take().unwrap_or_default();
        let accum = self.cfg.grad_accum;
        if accum > 1 {
            let s = 1.0 / accum as f32;
            for (_, g) in grads.iter_mut() {
                *g = Tensor::from_f32(g.shape(), g.to_f32_vec().iter().map(|v| v * s).collect())?;
            }
        }
        let grad_norm = self.opt.step(&grads, lr).map_err(|e| match e {
            Error::NonFinite(m) => Error::NonFinite(format!(
                "step {}: {m}{}; the last good checkpoint is kept",
                step + 1,
                lr_hint(lr)
            )),
            e => e,
        })?;
        self.opt.write_back(self.model.params_mut())?;
        self.model.update_scales();
        let layers = match telemetry {
            true => self.model.telemetry(),
            false => Vec::new(),
        };
        Ok((grad_norm, layers))
    }

    fn memory(&self) -> Result<crate::run::StepMemory> {
        Ok(crate::run::StepMemory {
            saved: self.peak_saved,
            ..Default::default()
        })
    }

    fn evaluate(&mut self, data: &Dataset, cfg: &TrainConfig, n: usize) -> Result<f64> {
        evaluate(&mut self.model, data, cfg, n)
    }

    fn save(
        &self,
        dir: &Path,
        (trainer_json, tok): (&str, Option<&Path>),
    ) -> Result<Option<PathBuf>> {
        let (parent, name) = (
            dir.join("checkpoints"),
            format!("step_{:06}", self.opt.step),
        );
        let p = match &self.cfg.lora {
            Some(l) => checkpoint::save_lora_checkpoint(
                &parent,
                &name,
                &self.model,
                &self.opt,
                trainer_json,
                tok,
                (&checkpoint::base_record(l.base.as_deref()), &l.record()),
            )?,
            None => checkpoint::save_checkpoint(
                &parent,
                &name,
                &self.model,
                &self.opt,
                trainer_json,
                tok,
            )?,
        };
        Ok(Some(p))
    }

    fn sample(&mut self, prompt: &[u32], n: usize, seed: u64) -> Result<Vec<u32>> {
        sample(&self.model, prompt, n, seed)
    }

    fn finish(&mut self, _steps_run: usize, _obs: &mut dyn Observer) -> Result<RunSummary> {
        Ok(RunSummary {
            dir: PathBuf::new(),
            recipe: String::new(),
            final_loss: f64::NAN,
            final_val_loss: f64::NAN,
            tokens_per_s: 0.0,
            peak_saved_bytes: self.peak_saved,
            losses: Vec::new(),
            sample: String::new(),
            params: self.model.cfg.num_params(),
            peak_device_bytes: 0,
            nccl_per_step: None,
        })
    }
}

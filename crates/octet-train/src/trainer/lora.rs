//! LoRA settings of a run and merging an adapter into its base.

use super::*;

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

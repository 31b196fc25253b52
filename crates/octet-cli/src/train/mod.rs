//! `octet train` and `octet compare`.

use crate::util::Table;
use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use octet_train::metrics::StepMetrics;
use octet_train::plot::{line_plot, Series};
use octet_train::trainer::{train, Observer, RunSummary, TrainConfig};
use std::path::PathBuf;

mod compare;
mod output;

pub use compare::*;
pub use output::*;

/// Flags of `octet train`; each one given overrides the config file and the defaults.
#[derive(clap::Args, Clone)]
pub struct TrainArgs {
    /// A TOML file with any TrainConfig fields (flags override it); a key
    /// that is not one of them is an error.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Run name (outputs in `runs/NAME`).
    #[arg(long)]
    name: Option<String>,
    /// Parent directory of runs.
    #[arg(long)]
    out_dir: Option<PathBuf>,
    /// Model preset: tiny, small, medium, 1b, 8b (Llama 3 8B's shape) (default: small).
    #[arg(long)]
    model: Option<String>,
    /// Blocks of the preset in place of its own count, e.g. `--model 8b
    /// --layers 8` for as many of the 8B shape's blocks as fit one GPU.
    #[arg(long)]
    layers: Option<usize>,
    /// Training text file, directory of .txt files, .bin token file, or
    /// fine-tuning examples as .jsonl, one a line: {"text": ...},
    /// {"prompt": ..., "completion": ...} or {"messages": [{"role": ...,
    /// "content": ...}, ...]} (rendered by the model's chat template).
    /// Default: embedded Tiny Shakespeare.
    #[arg(long)]
    data: Option<PathBuf>,
    /// Tokenizer of text data and samples: `byte` (the default, 256 ids),
    /// `gpt2` (GPT-2's BPE, shipped by the tiktoken-rs crate; a preset model
    /// gets a vocabulary of 50304), or a tokenizer.json or a model folder
    /// holding one (with its tokenizer_config.json: special tokens and chat
    /// template). Without the flag, a --init or --base folder holding a
    /// tokenizer.json gives that one.
    #[arg(long)]
    tokenizer: Option<String>,
    /// Which tokens of .jsonl data the loss counts: `completion` (the
    /// default: the completions and the assistant messages, each with its
    /// EOS or end of turn; every token of a {"text"} line) or `all`. The
    /// examples are packed one after another (each ending in the EOS) and
    /// windows of --seq are drawn across them, every target keeping its
    /// mask; the mean is over the counted tokens. CPU only for now where
    /// tokens are masked.
    #[arg(long)]
    loss_on: Option<String>,
    /// bf16 (no FP8) or an FP8 recipe: delayed, tensorwise (the default), rowwise, blockwise, mxfp8, nvfp4.
    #[arg(long)]
    recipe: Option<String>,
    /// Backward of FP8 recipes: quantized, high_precision, dequantized.
    #[arg(long)]
    backward: Option<String>,
    /// Sequences per micro-batch (default: 8).
    #[arg(long)]
    batch: Option<usize>,
    /// Tokens per sequence (default: 128).
    #[arg(long)]
    seq: Option<usize>,
    /// Micro-batches per optimizer step.
    #[arg(long)]
    grad_accum: Option<usize>,
    /// Optimizer steps (default: 300; 200 for `octet lora`).
    #[arg(long)]
    steps: Option<u64>,
    /// Peak learning rate, above 0 and at most 10 (default 3e-3; 3e-4 for `--model 1b`; 1e-3 for
    /// `octet lora`, whatever the model).
    #[arg(long)]
    lr: Option<f32>,
    /// Final learning rate of the cosine decay, at most `--lr` (default
    /// 3e-4; 3e-5 for `--model 1b`; 1e-4 for `octet lora`, whatever the model).
    #[arg(long)]
    min_lr: Option<f32>,
    /// Warmup steps (default 30; 100 for `--model 1b`; 20 for `octet lora`,
    /// whatever the model).
    #[arg(long)]
    warmup: Option<u64>,
    /// AdamW weight decay (a finite number of at least 0).
    #[arg(long)]
    weight_decay: Option<f32>,
    /// Gradient clipping norm: a finite number of at least 0; 0 disables clipping.
    #[arg(long)]
    grad_clip: Option<f32>,
    /// Seed.
    #[arg(long)]
    seed: Option<u64>,
    /// Evaluate every N steps.
    #[arg(long)]
    eval_every: Option<u64>,
    /// Validation batches per evaluation (0: no evaluation; at most 100,000).
    #[arg(long)]
    eval_batches: Option<usize>,
    /// Checkpoint every N steps (0: only at the end).
    #[arg(long)]
    ckpt_every: Option<u64>,
    /// Tokens to generate at the end (0: none; at most 1,000,000).
    #[arg(long)]
    sample_tokens: Option<usize>,
    /// Write no checkpoint, not even the final one (benchmark runs).
    #[arg(long)]
    no_save: bool,
    /// Sharded runs (`--nproc`): gradients reduce-scattered in f32 or bf16 (half the bytes).
    #[arg(long)]
    grad_reduce: Option<String>,
    /// Sharded runs on GPUs: free each block's gathered weights after its
    /// forward and gather them again for its backward (less memory, one more
    /// all-gather of the block weights per step).
    #[arg(long)]
    reshard_after_forward: bool,
    /// GPU: keep the activations that only the norms', SwiGLU's and the
    /// attention's backward read in `fp8` (E4M3, a factor per row: norm
    /// inputs at 1/4 of f32, SwiGLU inputs at 1/2 of bf16; the attention
    /// output not at all where the o projection keeps an FP8 copy; in `octet
    /// lora` with the quantized backward, the adapters' inputs as the E4M3
    /// codes the base's product read), `full`, or `auto` (the default:
    /// `fp8` on the GPU under the tensorwise recipe and for LoRA on an FP8
    /// base, where it was measured to cost no speed; `full` elsewhere). The
    /// forward and loss are unchanged.
    #[arg(long)]
    saved_activations: Option<String>,
    /// Activation recomputation: keep only each block's input residual for
    /// backward and run the block's forward again there. The same losses and
    /// gradients, bit for bit; the activations held at the peak drop to one
    /// block's plus the inputs, for one more forward of the blocks.
    #[arg(long)]
    recompute: bool,
    /// Activation recomputation of the first N blocks only: memory and time
    /// in between keeping every block and `--recompute` (N at or above the
    /// model's depth recomputes every block; 0 none).
    #[arg(long, value_name = "N")]
    recompute_blocks: Option<usize>,
    /// GPU: the per-tensor FP8 forward products accumulate in f32 like the
    /// gradients' products, instead of cuBLASLt's fast accumulation (the
    /// default, as in Transformer Engine and torchao): slower, closer to the CPU.
    #[arg(long)]
    no_fast_accum: bool,
    /// Resume from a checkpoint directory (`runs/NAME/checkpoints/step_N`),
    /// or from a run directory's latest (`runs/NAME`). The run goes on in
    /// that run directory unless `--name`, `--out-dir` or the config file
    /// place it elsewhere.
    #[arg(long)]
    pub resume: Option<PathBuf>,
    /// Start a new run from the weights of a checkpoint directory
    /// (`config.json` + `model.safetensors` with Hugging Face names, bf16,
    /// f32 or FP8 with factors; its dimensions replace `--model`; or a run
    /// directory's latest checkpoint), with a fresh optimizer at step 0.
    #[arg(long)]
    init: Option<PathBuf>,
    /// A LoRA adapter (PEFT layout) merged onto the `--init` weights first.
    #[arg(long)]
    init_adapter: Option<PathBuf>,
    /// The base `--init-adapter` was trained on (`octet lora --base-format`);
    /// only with an adapter to merge (`--init-adapter` or the config file's).
    #[arg(long)]
    init_adapter_base_format: Option<String>,
    /// Ranks of sharded data parallel (FSDP-style; threads of this process on
    /// the CPU): parameters sharded, FP8 all-gather of block weights under FP8
    /// recipes, gradients reduce-scattered. `--batch` is the global batch.
    #[arg(long, default_value_t = 1)]
    pub nproc: usize,
    /// Machines of a multi-GPU job (`--nproc` GPUs each).
    #[arg(long, default_value_t = 1)]
    pub nnodes: usize,
    /// This machine's index among `--nnodes` (0 hosts the rendezvous).
    #[arg(long, default_value_t = 0)]
    pub node_rank: usize,
    /// Host of the rendezvous (node 0) for multi-GPU jobs.
    #[arg(long, default_value = "127.0.0.1")]
    pub master_addr: String,
    /// Port of the rendezvous (default: a free port on one machine, 29500 across machines).
    #[arg(long)]
    pub master_port: Option<u16>,
    /// Seconds a GPU rank may go without finishing a step (or joining)
    /// before it ends the job: a failed peer leaves the others waiting in a collective.
    #[arg(long, default_value_t = 600)]
    pub dist_timeout: u64,
    /// Device: cpu, cuda, or auto (the GPU when one is usable, else the CPU).
    #[arg(long, default_value = "auto")]
    pub device: String,
}

impl TrainArgs {
    /// The arguments of a bare `octet train`, with clap's defaults (`octet`
    /// without a subcommand runs it).
    pub fn bare() -> anyhow::Result<Self> {
        use clap::{Args, FromArgMatches};
        let matches =
            Self::augment_args(clap::Command::new("train")).try_get_matches_from(["train"])?;
        Ok(Self::from_arg_matches(&matches)?)
    }

    /// [`TrainArgs::bare`] named for the first of `default`, `default-2`, ...
    /// whose run directory holds no run: what `octet` without a subcommand
    /// trains, so that running it again starts a new run rather than being
    /// refused (a run directory takes one run, `check_run_dir`).
    pub fn bare_in_a_free_run_dir() -> anyhow::Result<Self> {
        let mut a = Self::bare()?;
        let base = a.config()?;
        for i in 1..10_000 {
            let name = if i == 1 {
                base.name.clone()
            } else {
                format!("{}-{i}", base.name)
            };
            let mut c = base.clone();
            c.name = name.clone();
            if c.check_run_dir(None).is_ok() {
                a.name = Some(name);
                return Ok(a);
            }
        }
        anyhow::bail!(
            "{} holds runs {0}/{1} to {0}/{1}-9999: name one with `octet train --name`",
            base.out_dir.display(),
            base.name
        )
    }

    /// An error unless the flags of sharded runs (`--nproc`, `--nnodes`,
    /// `--node-rank`, `--master-port`, `--reshard-after-forward`,
    /// `--grad-reduce`) are left unset: `cmd` runs one
    /// process and would otherwise drop them without a word.
    pub fn refuse_sharding(&self, cmd: &str) -> anyhow::Result<()> {
        for (flag, given) in [
            ("--nproc", self.nproc != 1),
            ("--nnodes", self.nnodes != 1),
            ("--node-rank", self.node_rank != 0),
            ("--master-port", self.master_port.is_some()),
            ("--reshard-after-forward", self.reshard_after_forward),
            ("--grad-reduce", self.grad_reduce.is_some()),
        ] {
            anyhow::ensure!(
                !given,
                "{flag} applies to sharded `octet train` runs; {cmd} runs one process"
            );
        }
        Ok(())
    }

    /// An error where a flag that only sharded runs read (`--grad-reduce`)
    /// is given to an `octet train` of one rank (`--nproc 1` on one
    /// machine), which would otherwise drop it without a word, as
    /// `--reshard-after-forward` is refused there.
    fn refuse_sharded_only_flags_on_one_rank(&self) -> anyhow::Result<()> {
        if self.nproc * self.nnodes > 1 {
            return Ok(());
        }
        if let Some(g) = &self.grad_reduce {
            anyhow::bail!("--grad-reduce {g} applies to sharded runs: give --nproc 2 or more");
        }
        Ok(())
    }

    fn config(&self) -> anyhow::Result<TrainConfig> {
        // The preset's own schedule (of `--model`, else of the config file's
        // `model`), under what the file and the flags give (`--lr`, ...).
        let model = match &self.model {
            Some(m) => Some(m.clone()),
            None => self.file_model()?,
        };
        let c = self.config_with(|c| {
            if let Some(m) = &model {
                c.use_preset_schedule(m);
            }
        })?;
        // A LoRA run's checkpoint (its recorded settings carry the adapter's).
        if let Some(ck) = self
            .resume
            .as_deref()
            .filter(|ck| octet_train::checkpoint::is_adapter_only(ck))
        {
            anyhow::bail!(
                "{} is a LoRA adapter's checkpoint: continue it with `octet lora --resume`",
                ck.display()
            );
        }
        anyhow::ensure!(
            c.lora.is_none(),
            "the config file's [lora] table configures `octet lora`, not `octet train`"
        );
        Ok(c)
    }

    /// The `model` key of the `--config` file, if there is a file and it has one.
    fn file_model(&self) -> anyhow::Result<Option<String>> {
        let Some(p) = &self.config else {
            return Ok(None);
        };
        let text =
            std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
        let file: toml::Table =
            toml::from_str(&text).with_context(|| format!("parsing {}", p.display()))?;
        Ok(match file.get("model") {
            Some(toml::Value::String(m)) => Some(m.clone()),
            _ => None,
        })
    }

    /// The config from the defaults changed by `defaults`, then the keys the
    /// file gives (a table such as `[adamw]` key by key), then the flags.
    pub fn config_with(
        &self,
        defaults: impl FnOnce(&mut TrainConfig),
    ) -> anyhow::Result<TrainConfig> {
        let mut c = TrainConfig::default();
        defaults(&mut c);
        // A resumed run starts from the settings its checkpoint records (the
        // tokenizer, data, batch, schedule, recipe, ...), not from the
        // defaults: the file and the flags change them from there.
        let recorded = self.recorded_settings()?;
        if let Some(r) = &recorded {
            c = r.clone();
            c.init = None;
            c.init_adapter = None;
            c.init_adapter_base_format = None;
            c.save = true;
        }
        // Whether the config file places the run (`name`, `out_dir`).
        let mut file_places_run = false;
        if let Some(p) = &self.config {
            let parsing = || format!("parsing {}", p.display());
            let text =
                std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
            let file: toml::Table = toml::from_str(&text).with_context(parsing)?;
            file_places_run = file.contains_key("name") || file.contains_key("out_dir");
            let mut merged = toml::Table::try_from(&c).context("the default config")?;
            overlay(&mut merged, file);
            c = toml::Value::Table(merged)
                .try_into()
                .with_context(parsing)?;
        }
        macro_rules! set {
            ($($f:ident),*) => { $(if let Some(v) = &self.$f { c.$f = v.clone(); })* };
        }
        set!(
            name,
            out_dir,
            model,
            recipe,
            backward,
            batch,
            seq,
            grad_accum,
            steps,
            lr,
            min_lr,
            warmup,
            seed,
            eval_every,
            eval_batches,
            ckpt_every,
            sample_tokens,
            grad_reduce,
            saved_activations,
            tokenizer,
            loss_on
        );
        // A resumed run goes on in its own run directory (`RUN` of
        // `RUN/checkpoints/step_N`) unless the flags or the file place it:
        // else it would write into `runs/default` (or `runs/lora`), replacing
        // the checkpoints of another run at the same steps and its `latest`.
        if self.name.is_none() && self.out_dir.is_none() && !file_places_run {
            if let Some((out_dir, name)) = self.resume.as_deref().and_then(run_of_checkpoint) {
                c.out_dir = out_dir;
                c.name = name;
            }
        }
        if let Some(l) = self.layers {
            c.layers = Some(l);
        }
        if let Some(d) = &self.data {
            c.data = Some(d.clone());
        }
        if let Some(d) = &self.init {
            c.init = Some(d.clone());
        }
        if let Some(d) = &self.init_adapter {
            c.init_adapter = Some(d.clone());
        }
        // Run directories (from the flags or the file) name their latest checkpoint.
        for p in [&mut c.init, &mut c.init_adapter].into_iter().flatten() {
            *p = octet_train::checkpoint::resolve_checkpoint_dir(p)?;
        }
        if let Some(f) = &self.init_adapter_base_format {
            // Without an adapter to merge the flag would be dropped unread.
            anyhow::ensure!(
                c.init_adapter.is_some(),
                "--init-adapter-base-format {f} applies to the adapter of --init-adapter; give one"
            );
            c.init_adapter_base_format = Some(f.clone());
        }
        if self.tokenizer.is_none() && recorded.is_none() {
            c.use_model_tokenizer();
        }
        if let Some(r) = &recorded {
            resumed_differences(r, &c)?;
        }
        if self.no_save {
            c.save = false;
        }
        if self.reshard_after_forward {
            c.reshard_after_forward = true;
        }
        if self.recompute {
            c.recompute = true;
        }
        if let Some(n) = self.recompute_blocks {
            c.recompute_blocks = n;
        }
        if self.no_fast_accum {
            c.fp8_fast_accum = false;
        }
        if let Some(w) = self.weight_decay {
            c.adamw.weight_decay = w;
        }
        if let Some(g) = self.grad_clip {
            c.adamw.grad_clip = g;
        }
        if !matches!(self.device.as_str(), "cpu" | "cuda" | "auto") {
            anyhow::bail!("--device {}: expected cpu, cuda or auto", self.device);
        }
        c.validate()?;
        Ok(c)
    }
}

/// Put the keys of `over` into `base`, a table into a table key by key.
fn overlay(base: &mut toml::Table, over: toml::Table) {
    for (k, v) in over {
        match (base.get_mut(&k), v) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => overlay(b, o),
            (_, v) => {
                base.insert(k, v);
            }
        }
    }
}

/// `(out_dir, name)` of the run that wrote the checkpoint `ck`
/// (`OUT/NAME/checkpoints/step_N`, as the trainers save them); `None` for a
/// checkpoint kept elsewhere.
fn run_of_checkpoint(ck: &std::path::Path) -> Option<(PathBuf, String)> {
    let parent = ck.parent()?;
    if parent.file_name()? != "checkpoints" {
        return None;
    }
    let run = parent.parent()?;
    let name = run.file_name()?.to_str()?.to_string();
    let out = run
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .map_or_else(|| PathBuf::from("."), std::path::Path::to_path_buf);
    Some((out, name))
}

/// A warning where the run ends inside its warmup: the learning rate never
/// reaches `--lr` (the default warmup of 30 steps under `--steps 5` peaked
/// at a sixth of it without a word).
pub fn warn_short_schedule(c: &TrainConfig) {
    if let Some(w) = short_schedule_warning(c) {
        eprintln!("{w}");
    }
}

/// The warning of [`warn_short_schedule`], if the run ends before its warmup
/// does. A warmup of exactly `--steps` steps reaches `--lr` at the last step.
fn short_schedule_warning(c: &TrainConfig) -> Option<String> {
    if c.warmup <= c.steps || c.steps == 0 {
        return None;
    }
    let peak = octet_train::optim::lr_at(c.steps - 1, c.warmup, c.steps, c.lr, c.min_lr);
    Some(format!(
        "warning: --warmup {} is longer than --steps {}: the learning rate peaks at {peak:.3e}, \
         not --lr {:.3e}",
        c.warmup, c.steps, c.lr
    ))
}

/// An error where `now` (the resumed run's settings) tokenizes its data
/// differently from `recorded` (the checkpoint's run): its ids would mean
/// other text to the trained embeddings. A warning for each setting that
/// changes the batches, the numerics or the schedule, after which the
/// resumed run no longer repeats the uninterrupted one bit for bit.
fn resumed_differences(recorded: &TrainConfig, now: &TrainConfig) -> anyhow::Result<()> {
    anyhow::ensure!(
        recorded.tokenizer == now.tokenizer,
        "--tokenizer {}: the checkpoint's run was trained with the {} tokenizer",
        now.tokenizer,
        recorded.tokenizer
    );
    for w in resume_warnings(recorded, now) {
        eprintln!("{w}");
    }
    Ok(())
}

/// The warnings of [`resumed_differences`]: one per setting of `now` that
/// differs from `recorded`'s, naming the flag and both values. A changed
/// `--steps`, `--warmup`, `--lr` or `--min-lr` refits the warmup and cosine
/// to the new values, so the rates from the checkpoint's step on are not the
/// ones the checkpoint's run would have used.
fn resume_warnings(recorded: &TrainConfig, now: &TrainConfig) -> Vec<String> {
    let show = |v: &dyn std::fmt::Debug| format!("{v:?}");
    let data = [
        ("--data", show(&recorded.data), show(&now.data)),
        ("--batch", show(&recorded.batch), show(&now.batch)),
        ("--seq", show(&recorded.seq), show(&now.seq)),
        (
            "--grad-accum",
            show(&recorded.grad_accum),
            show(&now.grad_accum),
        ),
        ("--recipe", show(&recorded.recipe), show(&now.recipe)),
        ("--backward", show(&recorded.backward), show(&now.backward)),
        ("--seed", show(&recorded.seed), show(&now.seed)),
    ];
    let schedule = [
        ("--steps", show(&recorded.steps), show(&now.steps)),
        ("--warmup", show(&recorded.warmup), show(&now.warmup)),
        ("--lr", show(&recorded.lr), show(&now.lr)),
        ("--min-lr", show(&recorded.min_lr), show(&now.min_lr)),
    ];
    let what = |is_schedule: bool| {
        if is_schedule {
            "the warmup and cosine schedule are refitted to it, and the resumed run will"
        } else {
            "the resumed run will"
        }
    };
    data.into_iter()
        .map(|d| (d, false))
        .chain(schedule.into_iter().map(|d| (d, true)))
        .filter(|((_, was, is), _)| was != is)
        .map(|((flag, was, is), sched)| {
            format!(
                "warning: {flag} {is} where the checkpoint's run had {was}: {} not repeat the \
                 uninterrupted one bit for bit",
                what(sched)
            )
        })
        .collect()
}

impl TrainArgs {
    /// Whether `--tokenizer` was given (else a model folder's own applies).
    pub fn tokenizer_given(&self) -> bool {
        self.tokenizer.is_some()
    }

    /// The settings recorded by the run whose checkpoint `--resume` names
    /// (already resolved to a checkpoint), if it names one that records them.
    /// A record this build cannot read (an older or newer octet's) is
    /// skipped with a warning: the defaults, the file and the flags apply.
    /// A Hugging Face tokenizer recorded by a path no longer there (a
    /// cleared cache, another machine) becomes the copy the checkpoint
    /// carries, where it has one and `--tokenizer` is not given.
    fn recorded_settings(&self) -> anyhow::Result<Option<TrainConfig>> {
        let Some(ck) = &self.resume else {
            return Ok(None);
        };
        let Some(text) = octet_train::checkpoint::read_trainer_settings(ck)? else {
            return Ok(None);
        };
        match serde_json::from_str::<TrainConfig>(&text) {
            Ok(mut c) => {
                let gone = !matches!(c.tokenizer.as_str(), "byte" | "gpt2")
                    && c.tokenizer_files().is_none();
                if gone && self.tokenizer.is_none() && ck.join("tokenizer.json").is_file() {
                    let own = std::fs::canonicalize(ck).unwrap_or_else(|_| ck.clone());
                    eprintln!(
                        "note: the run's tokenizer {} is gone; using the copy in {}",
                        c.tokenizer,
                        own.display()
                    );
                    c.tokenizer = own.display().to_string();
                }
                Ok(Some(c))
            }
            Err(e) => {
                eprintln!(
                    "warning: the settings recorded in {} do not parse ({e}); the resumed run \
                     takes the defaults and the flags",
                    ck.display()
                );
                Ok(None)
            }
        }
    }

    /// `--resume` given as a run directory (`runs/NAME`) becomes the
    /// checkpoint its `checkpoints/latest` names
    /// ([`octet_train::checkpoint::resolve_checkpoint_dir`]).
    pub fn resolve_resume(&mut self) -> anyhow::Result<()> {
        if let Some(p) = &mut self.resume {
            *p = octet_train::checkpoint::resolve_checkpoint_dir(p)?;
        }
        Ok(())
    }
}

pub fn run(mut a: TrainArgs) -> anyhow::Result<()> {
    a.resolve_resume()?;
    let cfg = a.config()?;
    cfg.check_resume(a.resume.as_deref())?;
    warn_short_schedule(&cfg);
    anyhow::ensure!(a.nproc >= 1, "--nproc must be at least 1");
    anyhow::ensure!(a.nnodes >= 1, "--nnodes must be at least 1");
    anyhow::ensure!(
        a.node_rank < a.nnodes,
        "--node-rank {} of --nnodes {}",
        a.node_rank,
        a.nnodes
    );
    a.refuse_sharded_only_flags_on_one_rank()?;
    if a.device == "cpu" {
        // The CPU's ranks are threads of this process: no machines to join,
        // no rendezvous. Refused rather than a GPU job started against `--device cpu`.
        for (flag, given) in [
            ("--nnodes", a.nnodes != 1),
            ("--master-port", a.master_port.is_some()),
        ] {
            anyhow::ensure!(
                !given,
                "{flag} joins GPU processes (--device cuda); with --device cpu the --nproc ranks are threads of this process: drop {flag}"
            );
        }
    }
    if let Some(local) = crate::dist_gpu::local_rank_from_env()? {
        return crate::dist_gpu::run_rank(&cfg, &a, local);
    }
    // An FP8 recipe on a GPU without FP8 GEMMs: stop (cuda) or use the CPU
    // (auto) before any rank starts, as for one process.
    let fp8_use =
        octet_cuda::recipe_uses_fp8_gemm(&cfg.recipe).then(|| format!("--recipe {}", cfg.recipe));
    let gpu_job = a.nnodes > 1
        || (a.nproc > 1
            && match a.device.as_str() {
                // A GPU that does not open is left to the ranks, which report it.
                "cuda" => {
                    let gpu = octet_cuda::Gpu::open(0).ok();
                    crate::gpu::fp8_gate(gpu, "cuda", fp8_use.as_deref())?;
                    true
                }
                "auto" => crate::gpu::open_for("auto", fp8_use.as_deref())?.is_some(),
                _ => false,
            });
    if gpu_job {
        return crate::dist_gpu::launch(&a);
    }
    anyhow::ensure!(
        !cfg.reshard_after_forward || a.nproc > 1,
        "--reshard-after-forward applies to sharded runs: give --nproc 2 or more"
    );
    if a.nproc > 1 {
        anyhow::ensure!(
            !cfg.reshard_after_forward,
            "--reshard-after-forward is built for the GPU ranks (--device cuda); the CPU ranks gather every weight once per step"
        );
        return crate::dist::run(&cfg, a.nproc, a.resume.as_deref());
    }
    // A resumed run trains the checkpoint's model, not `--model`'s.
    let (mcfg, label) = match a.resume.as_deref() {
        Some(ck) => (
            octet_train::checkpoint::load_config(ck)?,
            format!("model of {}", ck.display()),
        ),
        None if cfg.init.is_some() => (cfg.llama_config()?, "model of --init".to_string()),
        None => (cfg.llama_config()?, cfg.model.clone()),
    };
    let header = |device: String| {
        println!(
            "octet train: {} ({} params, d={} L={} H={}/{}), recipe {}, backward {}, batch {}x{} tokens, {} steps, device {device}",
            label,
            mcfg.num_params(),
            mcfg.hidden_size,
            mcfg.num_hidden_layers,
            mcfg.num_attention_heads,
            mcfg.num_key_value_heads,
            cfg.recipe,
            cfg.backward,
            cfg.batch,
            cfg.seq,
            cfg.steps,
        )
    };
    let gpu = crate::gpu::open_for(&a.device, fp8_use.as_deref())?;
    if let Some(gpu) = crate::gpu::model_gate(gpu, &a.device, &mcfg, false)? {
        header(gpu.info()?);
        let mut obs = bar("train");
        let s = octet_train::gpu::train_gpu(&cfg, a.resume.as_deref(), &mut obs, &gpu)?;
        obs.bar.finish();
        println!("\nsample:\n{}\n", s.sample);
        summary_table(std::slice::from_ref(&s));
        println!(
            "\npeak device memory {}",
            octet_train::trainer::memory_line(&s.memory)
        );
        println!("{}", wrote(&s.dir, cfg.save, ""));
        return Ok(());
    }
    header(format!("cpu ({} threads)", rayon::current_num_threads()));
    let mut obs = bar("train");
    let s = train(&cfg, a.resume.as_deref(), &mut obs)?;
    obs.bar.finish();
    println!("\nsample:\n{}\n", s.sample);
    summary_table(std::slice::from_ref(&s));
    println!(
        "\nmemory at the peak {}",
        octet_train::trainer::memory_line(&s.memory)
    );
    println!("{}", wrote(&s.dir, cfg.save, ""));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bare_arguments_give_the_default_config() {
        let c = TrainArgs::bare()
            .and_then(|a| a.config())
            .expect("bare config");
        let d = TrainConfig::default();
        assert_eq!(
            (c.model.as_str(), c.lr, c.warmup, c.steps),
            ("small", d.lr, d.warmup, d.steps)
        );
    }

    /// The short-schedule warning is for runs that end inside their warmup.
    /// A warmup of exactly `--steps` reaches `--lr` at the last step (a
    /// resumed GPU run of 30 steps under the tiny model's 30-step warmup was
    /// told its rate "peaks at 3.000e-3, not --lr 3.000e-3").
    #[test]
    fn short_schedule_warning_only_when_the_warmup_outlasts_the_run() {
        let mut c = TrainConfig {
            lr: 3e-3,
            min_lr: 3e-4,
            ..TrainConfig::default()
        };
        for (warmup, steps) in [(30, 30), (30, 31), (0, 5), (30, 0)] {
            (c.warmup, c.steps) = (warmup, steps);
            assert_eq!(
                short_schedule_warning(&c),
                None,
                "warmup {warmup}, steps {steps}"
            );
        }
        // The warmup's last step is at the peak.
        let top = octet_train::optim::lr_at(29, 30, 30, c.lr, c.min_lr);
        assert!((top - c.lr).abs() <= f32::EPSILON * c.lr, "{top}");
        (c.warmup, c.steps) = (30, 5);
        let w = short_schedule_warning(&c).expect("a warning");
        assert!(
            w.contains("peaks at 5.000e-4") && w.contains("--lr 3.000e-3"),
            "{w}"
        );
    }

    /// A resume with another `--steps`, `--warmup`, `--lr` or `--min-lr`
    /// refits the cosine: each is warned of with both values, as a changed
    /// `--batch` is; the same settings give no warning.
    #[test]
    fn a_resume_that_changes_the_schedule_warns_with_the_old_and_new_values() {
        let was = TrainConfig::default();
        assert!(resume_warnings(&was, &was.clone()).is_empty());
        let now = TrainConfig {
            steps: was.steps + 100,
            warmup: was.warmup + 1,
            lr: was.lr * 2.0,
            min_lr: was.min_lr / 2.0,
            ..was.clone()
        };
        let w = resume_warnings(&was, &now);
        for (flag, old, new) in [
            (
                "--steps",
                format!("{}", was.steps),
                format!("{}", now.steps),
            ),
            (
                "--warmup",
                format!("{}", was.warmup),
                format!("{}", now.warmup),
            ),
            ("--lr", format!("{:?}", was.lr), format!("{:?}", now.lr)),
            (
                "--min-lr",
                format!("{:?}", was.min_lr),
                format!("{:?}", now.min_lr),
            ),
        ] {
            let line = w
                .iter()
                .find(|l| l.starts_with(&format!("warning: {flag} ")))
                .unwrap_or_else(|| panic!("no warning for {flag}: {w:?}"));
            assert!(
                line.contains(&format!(
                    "{flag} {new} where the checkpoint's run had {old}"
                )) && line.contains("schedule")
                    && line.contains("bit for bit"),
                "{line}"
            );
        }
        assert_eq!(w.len(), 4, "{w:?}");
    }

    /// `octet compare --recipe R` (and `--sample-tokens N`) is an error:
    /// each run's recipe comes from `--recipes` and no run samples, so the
    /// flag was accepted and dropped (`--recipe rowwise --recipes bf16`
    /// trained bf16 alone).
    #[test]
    fn compare_refuses_the_flags_it_would_drop() {
        use clap::{Args, FromArgMatches};
        let out = std::env::temp_dir().join(format!("octet-compare-{}", std::process::id()));
        let out_s = out.display().to_string();
        for (flag, value) in [("--recipe", "rowwise"), ("--sample-tokens", "5")] {
            let argv = [
                "compare",
                "--recipes",
                "bf16",
                flag,
                value,
                "--model",
                "tiny",
                "--steps",
                "1",
                "--batch",
                "1",
                "--seq",
                "16",
                "--eval-batches",
                "0",
                "--no-save",
                "--device",
                "cpu",
                "--out-dir",
                &out_s,
            ];
            let m = CompareArgs::augment_args(clap::Command::new("compare"))
                .try_get_matches_from(argv)
                .expect("arguments");
            let a = CompareArgs::from_arg_matches(&m).expect("arguments");
            let e = compare(a).expect_err(flag).to_string();
            assert!(e.contains(flag), "{flag}: {e}");
        }
        let _ = std::fs::remove_dir_all(&out);
    }

    /// Every flag of sharded runs is refused by a one-process command:
    /// `octet lora --reshard-after-forward` (or `--grad-reduce bf16`) ran
    /// and dropped it, where `octet train` without `--nproc` refuses it.
    #[test]
    fn one_process_commands_refuse_every_sharding_flag() {
        use clap::{Args, FromArgMatches};
        for argv in [
            &["train", "--reshard-after-forward"][..],
            &["train", "--grad-reduce", "bf16"],
            &["train", "--nproc", "2"],
        ] {
            let m = TrainArgs::augment_args(clap::Command::new("train"))
                .try_get_matches_from(argv)
                .expect("arguments");
            let a = TrainArgs::from_arg_matches(&m).expect("arguments");
            let e = a
                .refuse_sharding("octet lora")
                .expect_err(argv[1])
                .to_string();
            assert!(e.contains(argv[1]), "{e}");
        }
        assert!(TrainArgs::bare()
            .expect("bare args")
            .refuse_sharding("octet lora")
            .is_ok());
    }

    #[test]
    fn grad_reduce_on_one_rank_is_an_error_naming_it() {
        use clap::{Args, FromArgMatches};
        let parse = |argv: &[&str]| -> TrainArgs {
            let m = TrainArgs::augment_args(clap::Command::new("train"))
                .try_get_matches_from(argv)
                .expect("arguments");
            TrainArgs::from_arg_matches(&m).expect("arguments")
        };
        let e = parse(&["train", "--grad-reduce", "bf16"])
            .refuse_sharded_only_flags_on_one_rank()
            .expect_err("--grad-reduce without --nproc")
            .to_string();
        assert!(
            e.contains("--grad-reduce bf16") && e.contains("--nproc"),
            "{e}"
        );
        for argv in [
            &["train", "--grad-reduce", "bf16", "--nproc", "2"][..],
            &["train", "--grad-reduce", "f32", "--nnodes", "2"],
            &["train"],
        ] {
            assert!(
                parse(argv).refuse_sharded_only_flags_on_one_rank().is_ok(),
                "{argv:?}"
            );
        }
    }

    #[test]
    fn fast_accumulation_is_on_unless_the_flag_turns_it_off() {
        use clap::{Args, FromArgMatches};
        let parse = |argv: &[&str]| -> TrainConfig {
            let m = TrainArgs::augment_args(clap::Command::new("train"))
                .try_get_matches_from(argv)
                .expect("arguments");
            let a = TrainArgs::from_arg_matches(&m).expect("arguments");
            a.config().expect("config")
        };
        assert!(parse(&["train"]).fp8_fast_accum);
        assert!(!parse(&["train", "--no-fast-accum"]).fp8_fast_accum);
    }

    #[test]
    fn a_config_file_with_an_unknown_key_or_a_bad_float_is_an_error_naming_it() {
        let path = std::env::temp_dir().join(format!("octet-config-{}.toml", std::process::id()));
        let adamw = "[adamw]\nbeta2 = 0.95\neps = 1e-8\nweight_decay = 0.1\ngrad_clip = 1.0\n";
        for (text, want) in [
            ("steps = 2\nstep = 2\n".to_string(), "unknown field `step`"),
            (
                "resume = \"runs/x\"\n".to_string(),
                "unknown field `resume`",
            ),
            ("min_lr = nan\n".to_string(), "min_lr = NaN"),
            (format!("{adamw}beta1 = 1.0\n"), "adamw.beta1 = 1"),
        ] {
            std::fs::write(&path, &text).expect("write the config");
            let mut a = TrainArgs::bare().expect("bare args");
            a.config = Some(path.clone());
            let e = format!("{:#}", a.config().expect_err(&text));
            assert!(e.contains(want), "{text}: {e}");
        }
        std::fs::write(&path, "steps = 2\n").expect("write the config");
        let mut a = TrainArgs::bare().expect("bare args");
        a.config = Some(path.clone());
        assert_eq!(a.config().expect("a good config").steps, 2);
        let _ = std::fs::remove_file(&path);
    }

    /// `--lr` below the default final rate is an error that names
    /// `--min-lr`, and `--min-lr` sets the final rate.
    #[test]
    fn a_peak_rate_below_the_final_one_needs_min_lr() {
        let mut a = TrainArgs::bare().expect("bare args");
        a.lr = Some(1e-4);
        let e = format!("{:#}", a.config().expect_err("--lr below min_lr"));
        assert!(e.contains("--min-lr"), "{e}");
        a.min_lr = Some(1e-5);
        let c = a.config().expect("--lr with --min-lr");
        assert_eq!((c.lr, c.min_lr), (1e-4, 1e-5));
    }

    /// A config file overrides the keys it gives and no others: `--model
    /// 1b` keeps its schedule under a file that sets none, and a file's
    /// `lr` replaces the preset's.
    #[test]
    fn a_config_file_keeps_the_presets_schedule_where_it_gives_none() {
        let path = std::env::temp_dir().join(format!("octet-sched-{}.toml", std::process::id()));
        let mut a = TrainArgs::bare().expect("bare args");
        a.model = Some("1b".into());
        a.config = Some(path.clone());
        std::fs::write(&path, "steps = 10\n").expect("write the config");
        let c = a.config().expect("1b config with a file");
        assert_eq!((c.lr, c.min_lr, c.warmup, c.steps), (3e-4, 3e-5, 100, 10));
        std::fs::write(&path, "lr = 1e-3\n[adamw]\nbeta2 = 0.99\n").expect("write");
        let c = a.config().expect("a file with lr");
        assert_eq!((c.lr, c.min_lr, c.warmup), (1e-3, 3e-5, 100));
        assert_eq!((c.adamw.beta1, c.adamw.beta2), (0.9, 0.99));
        // The file's own `model` picks the preset's schedule as `--model` does.
        a.model = None;
        std::fs::write(&path, "model = \"1b\"\nwarmup = 7\n").expect("write");
        let c = a.config().expect("a file with model 1b");
        assert_eq!(
            (c.model.as_str(), c.lr, c.min_lr, c.warmup),
            ("1b", 3e-4, 3e-5, 7)
        );
        let _ = std::fs::remove_file(&path);
    }

    /// `--init-adapter-base-format` with no adapter to merge is an error
    /// naming it (it was dropped without a word, a bad name included).
    #[test]
    fn an_init_adapter_base_format_without_an_adapter_is_an_error() {
        let mut a = TrainArgs::bare().expect("bare args");
        a.init_adapter_base_format = Some("bogus".into());
        let e = format!("{:#}", a.config().expect_err("no adapter to merge"));
        assert!(e.contains("--init-adapter-base-format bogus"), "{e}");
    }

    #[test]
    fn the_1b_preset_has_its_own_schedule_unless_flags_set_one() {
        let mut a = TrainArgs::bare().expect("bare args");
        a.model = Some("1b".into());
        let c = a.config().expect("1b config");
        assert_eq!((c.lr, c.min_lr, c.warmup), (3e-4, 3e-5, 100));
        a.lr = Some(1e-3);
        a.warmup = Some(5);
        let c = a.config().expect("1b config with flags");
        assert_eq!((c.lr, c.min_lr, c.warmup), (1e-3, 3e-5, 5));
        a.model = Some("small".into());
        a.lr = None;
        a.warmup = None;
        let c = a.config().expect("small config");
        assert_eq!(
            (c.lr, c.warmup),
            (TrainConfig::default().lr, TrainConfig::default().warmup)
        );
    }
}

//! The memory plan: what a run will hold at its peak, checked against the
//! host's or the GPU's free memory before the first allocation.

use super::*;

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
pub(super) fn gib(bytes: u64) -> String {
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
    /// on the rank's tokens; and the GPU's fused LM head holds one chunk of
    /// f32 logits and their bf16 gradient (at most
    /// [`octet_nn::llama::cuda::GPU_HEAD_CHUNK`] each) and the f32 gradient
    /// of its input, `(B*T, C)`.
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
                .min(octet_nn::llama::cuda::GPU_HEAD_CHUNK as u64)
                .saturating_mul(6)
                .saturating_add(tokens.saturating_mul(4 * mcfg.hidden_size as u64)),
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

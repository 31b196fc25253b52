//! `octet generate`: sample text from a trained model with a KV cache, its
//! block matrices stored as FP8 (upcast inside the product), bf16 or f32.

use anyhow::Context;
use octet_nn::decode::{check_logits, check_sampling, sample, DecodeModel, WeightStorage};
use octet_nn::llama::{Llama, LlamaConfig};
use octet_tensor::{DType, Tensor};
use octet_train::checkpoint;
use octet_train::data::{TextStream, Tokenizer};
use rand::{Rng, SeedableRng};
use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

#[derive(clap::Args)]
pub struct GenerateArgs {
    /// Checkpoint directory (config.json + model.safetensors), or a run
    /// directory (`runs/NAME`: its latest checkpoint). Default: the latest
    /// checkpoint of `runs/default` (what `octet train` writes).
    #[arg(long)]
    checkpoint: Option<PathBuf>,
    /// Use a randomly initialised model of this preset instead of a checkpoint
    /// (tiny, small, medium, 1b): for speed measurements only.
    #[arg(long, conflicts_with = "checkpoint")]
    random_model: Option<String>,
    /// A LoRA adapter (PEFT layout, as `octet lora` writes it) merged onto
    /// the checkpoint's weights before they are stored as `--weights`.
    #[arg(long)]
    adapter: Option<PathBuf>,
    /// The base the adapter was trained on (`octet lora --base-format`);
    /// only with `--adapter`. Default: what the adapter records
    /// (`octet_lora.json`), else fp8-tensorwise.
    #[arg(long, requires = "adapter")]
    adapter_base_format: Option<String>,
    /// Block matrices: fp8 (E4M3, per-channel scales), fp8-tensor, fp8-block, fp8-e5m2, bf16, f32.
    #[arg(long, default_value = "fp8")]
    weights: String,
    /// Also decode with these weights, same prompt and seed, and compare speed (e.g. bf16).
    #[arg(long)]
    compare: Option<String>,
    /// Text to continue.
    #[arg(long, default_value = "ROMEO:")]
    prompt: String,
    /// New tokens to generate.
    #[arg(long, default_value_t = 200)]
    max_tokens: usize,
    /// Softmax temperature (0 = greedy).
    #[arg(long, default_value_t = 0.8)]
    temperature: f32,
    /// Sample among the k most likely tokens (0 = all).
    #[arg(long, default_value_t = 40)]
    top_k: usize,
    /// Sampling seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// On the GPU, download every token's logits and sample on the host.
    /// Without it the GPU samples the next token itself (the same choice
    /// from the same seed) and queues steps with no host round trip a token,
    /// for vocabularies of up to 2048 tokens (larger ones sample on the host).
    #[arg(long)]
    host_sampling: bool,
    /// cpu, cuda or auto (the GPU when there is one).
    #[arg(long, default_value = "auto")]
    device: String,
    /// byte, gpt2, a tokenizer.json (or a model folder holding one), or
    /// auto: the checkpoint's own tokenizer.json where it has one (with
    /// --adapter: the adapter's, else the checkpoint's), else the Hugging
    /// Face tokenizer its run recorded, else the one `octet train` made the
    /// model's vocabulary for (256 ids: byte; 50257 to 50304: gpt2). Generation stops at the tokenizer's EOS
    /// (tokenizer_config.json's eos_token and generation_config.json's
    /// eos_token_id, any of them).
    #[arg(long, default_value = "auto")]
    tokenizer: String,
}

/// The tokenizer of `--tokenizer` for a model of `cfg`'s vocabulary, whose
/// own tokenizer (`None` for a random model, see
/// [`checkpoint::tokenizer_source`]) may be a `tokenizer.json`.
fn tokenizer(
    a: &GenerateArgs,
    cfg: &LlamaConfig,
    own: Option<&std::path::Path>,
) -> anyhow::Result<Tokenizer> {
    let own = own.and_then(octet_train::hf_tokenizer::tokenizer_json);
    let tok = match (a.tokenizer.as_str(), own) {
        ("auto", Some(d)) => Tokenizer::from_name(&d.display().to_string())?,
        ("auto", None) => Tokenizer::for_vocab(cfg.vocab_size)?,
        (name, _) => Tokenizer::from_name(name)?,
    };
    tok.check_fits(cfg.vocab_size)?;
    // A vocabulary `octet train` made for the other tokenizer: most sampled
    // ids would decode to nothing (byte on GPT-2's) or to other text.
    let preset = matches!(tok, Tokenizer::Byte | Tokenizer::Gpt2);
    if let Some(made) = Tokenizer::for_vocab(cfg.vocab_size).ok().filter(|_| preset) {
        anyhow::ensure!(
            made == tok,
            "--tokenizer {}: the model's {} ids are the {} tokenizer's; drop the flag or give {}",
            tok.name(),
            cfg.vocab_size,
            made.name(),
            made.name()
        );
    }
    Ok(tok)
}

fn gpu_weights(name: &str) -> anyhow::Result<octet_nn::decode::cuda::GpuWeights> {
    use octet_nn::decode::cuda::GpuWeights;
    Ok(match WeightStorage::from_name(name)? {
        WeightStorage::Fp8(f, s) => GpuWeights::Fp8(f, s),
        WeightStorage::Bf16 => GpuWeights::Bf16,
        WeightStorage::F32 => {
            anyhow::bail!("--weights f32 runs on the CPU only; use bf16 or fp8 on the GPU")
        }
    })
}

/// The prompt and `--max-tokens` must fit the model's positions (a sum
/// that overflows does not fit either).
fn check_positions(prompt: usize, max_tokens: usize, positions: usize) -> anyhow::Result<()> {
    anyhow::ensure!(
        max_tokens >= 1,
        "--max-tokens 0 generates nothing; give at least 1"
    );
    anyhow::ensure!(prompt > 0, "--prompt is empty");
    anyhow::ensure!(
        prompt
            .checked_add(max_tokens)
            .is_some_and(|n| n <= positions),
        "prompt ({prompt} tokens) + --max-tokens {max_tokens} exceed the model's {positions} positions"
    );
    Ok(())
}

/// Check the arguments that need no model, before anything loads or
/// decodes: the names of `--weights` and `--compare`, and a finite
/// `--temperature`.
fn check_args(a: &GenerateArgs) -> anyhow::Result<()> {
    WeightStorage::from_name(&a.weights).context("--weights")?;
    if let Some(other) = &a.compare {
        WeightStorage::from_name(other).context("--compare")?;
    }
    check_sampling(a.temperature).context("--temperature")?;
    Ok(())
}

/// Write `text` to stdout at once. An error (a closed pipe: `| head`) ends
/// the generation; `main` exits quietly on a broken pipe.
fn echo_text(text: &str) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())?;
    out.flush()
}

fn run_one_gpu(
    a: &GenerateArgs,
    gpu: &octet_cuda::Gpu,
    cfg: &LlamaConfig,
    w: &HashMap<String, Tensor>,
    (weights, tok): (&str, &Tokenizer),
    echo: bool,
) -> anyhow::Result<Run> {
    let mut dec = octet_nn::decode::cuda::GpuDecoder::new(gpu, cfg, w, gpu_weights(weights)?)?;
    let prompt = tok.encode(&a.prompt);
    check_positions(prompt.len(), a.max_tokens, cfg.max_position_embeddings)?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(a.seed);
    // Warm-up (kernel loading, cuBLASLt plans for the prompt's rows and for
    // one, the step's CUDA graph, captured at the second position), then a
    // fresh sequence. The step's warm-up needs a second position, and only a
    // run that decodes uses it (a model of one position decodes nothing).
    dec.prefill(&prompt)?;
    dec.reset();
    if a.max_tokens > 0 && cfg.max_position_embeddings >= 2 {
        dec.prefill(&prompt[..1])?;
        dec.step(prompt[0])?;
        dec.reset();
    }
    let t0 = Instant::now();
    let mut last = dec.prefill(&prompt)?;
    let prefill = t0.elapsed().as_secs_f64();
    let mut out = Vec::with_capacity(a.max_tokens);
    // Characters whose bytes span tokens are echoed once complete.
    let stream = std::cell::RefCell::new(TextStream::new(tok.clone()));
    let eos = tok.eos_ids();
    let show = |t: &[u32]| -> std::io::Result<()> {
        if echo {
            echo_text(&stream.borrow_mut().push(t))?;
        }
        Ok(())
    };
    let t1 = Instant::now();
    if a.max_tokens > 0 && !a.host_sampling && dec.samples_on_device() {
        // The first token from the prompt's logits here, the rest on the
        // device: step i samples token i + 1 with the seed's (i + 1)-th draw,
        // as the loop below would; the last step's token is not kept.
        // The device runs every step; the tokens after an EOS are dropped.
        check_logits(&last, 0)?;
        let first = sample(&last, a.temperature, a.top_k, rng.random::<f64>());
        show(&[first])?;
        out.push(first);
        let u: Vec<f64> = (0..a.max_tokens).map(|_| rng.random::<f64>()).collect();
        let mut left = if eos.contains(&first) {
            0
        } else {
            a.max_tokens - 1
        };
        let mut failed = None;
        let rest = dec
            .generate(first, &u, a.temperature, a.top_k, |t| {
                let mut keep = &t[..t.len().min(left)];
                if let Some(i) = keep.iter().position(|x| eos.contains(x)) {
                    keep = &keep[..=i];
                    left = keep.len();
                }
                left -= keep.len();
                if failed.is_none() {
                    failed = show(keep).err();
                }
            })
            // Its step i picks this run's token i + 1: numbered as the
            // host-sampling loop numbers them.
            .map_err(|e| match e {
                octet_cuda::Error::NonFiniteLogits { step } => {
                    octet_cuda::Error::NonFiniteLogits { step: step + 1 }
                }
                e => e,
            })?;
        if let Some(e) = failed {
            return Err(e.into());
        }
        if !eos.contains(&first) {
            let rest = &rest[..a.max_tokens - 1];
            let end = rest.iter().position(|x| eos.contains(x));
            out.extend(&rest[..end.map_or(rest.len(), |i| i + 1)]);
        }
    } else {
        for step in 0..a.max_tokens {
            check_logits(&last, step)?;
            let next = sample(&last, a.temperature, a.top_k, rng.random::<f64>());
            out.push(next);
            show(&[next])?;
            if eos.contains(&next) {
                break;
            }
            last = dec.step(next)?;
        }
    }
    let decode = t1.elapsed().as_secs_f64();
    if echo {
        echo_text(&stream.borrow_mut().finish())?;
    }
    Ok(Run {
        text: tok.decode(&out),
        prefill_tps: prompt.len() as f64 / prefill,
        decode_tps: out.len() as f64 / decode.max(1e-9),
        bytes: dec.matrix_bytes(),
    })
}

/// A model to sample from: its dimensions, weights, a description, and
/// where its own tokenizer files are (`None` for a random model or a run on
/// the byte or gpt2 tokenizer).
type Loaded = (
    LlamaConfig,
    HashMap<String, Tensor>,
    String,
    Option<PathBuf>,
);

fn load(a: &GenerateArgs) -> anyhow::Result<Loaded> {
    if let Some(preset) = &a.random_model {
        anyhow::ensure!(
            a.adapter.is_none(),
            "--adapter merges onto a checkpoint; it does not apply to --random-model"
        );
        let cfg = LlamaConfig::preset(preset)?;
        let m = Llama::new_random(&cfg, DType::F32, None, a.seed)?;
        let w = m
            .params()
            .into_iter()
            .map(|(n, t)| (n, t.clone()))
            .collect();
        return Ok((cfg, w, format!("random {preset} model"), None));
    }
    let dir = match &a.checkpoint {
        Some(d) => octet_train::checkpoint::resolve_checkpoint_dir(d)?,
        None => {
            let parent = PathBuf::from("runs/default/checkpoints");
            octet_train::checkpoint::latest_checkpoint(&parent)?.with_context(|| {
                "no --checkpoint given and runs/default/checkpoints/latest is missing: run `octet train` first, or pass --checkpoint DIR or --random-model PRESET"
            })?
        }
    };
    anyhow::ensure!(
        !octet_train::checkpoint::is_adapter_only(&dir),
        "{} is a LoRA adapter's checkpoint: give its base with --checkpoint BASE --adapter {}",
        dir.display(),
        dir.display()
    );
    if let Some(adapter) = &a.adapter {
        let adapter = &octet_train::checkpoint::resolve_checkpoint_dir(adapter)?;
        let m =
            octet_train::trainer::merge_adapter(&dir, adapter, a.adapter_base_format.as_deref())?;
        if let Some(rec) = &m.recorded_other_base {
            eprintln!(
                "warning: the adapter {} was trained on {rec}, not on {}; merging it anyway",
                adapter.display(),
                dir.display()
            );
        }
        let what = format!(
            "{} with adapter {} (r={}, alpha={}) merged onto its {} base",
            dir.display(),
            adapter.display(),
            m.rank,
            m.alpha,
            m.base.name()
        );
        checkpoint::check_finite(&m.weights, &what)?;
        let own = checkpoint::merged_tokenizer_source(&dir, adapter)?;
        return Ok((m.cfg, m.weights, what, own));
    }
    let cfg = checkpoint::load_config(&dir)?;
    let w = checkpoint::load_weights(&dir, DType::F32)?;
    let what = dir.display().to_string();
    checkpoint::check_finite(&w, &what)?;
    Ok((cfg, w, what, checkpoint::tokenizer_source(&dir)?))
}

struct Run {
    text: String,
    prefill_tps: f64,
    decode_tps: f64,
    bytes: usize,
}

fn run_one(
    a: &GenerateArgs,
    cfg: &LlamaConfig,
    w: &HashMap<String, Tensor>,
    (storage, tok): (WeightStorage, &Tokenizer),
    echo: bool,
) -> anyhow::Result<Run> {
    let mut model = DecodeModel::new(cfg, w, storage)?;
    let prompt = tok.encode(&a.prompt);
    check_positions(prompt.len(), a.max_tokens, cfg.max_position_embeddings)?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(a.seed);
    // Warm-up (the thread pool, first touches of the weights and the cache),
    // as on the GPU, then a fresh sequence: without it the first row of a
    // `--compare` read 20-40% lower prefill rates than the same weights in
    // the second row (a review, five runs).
    model.forward(&prompt)?;
    model.reset();
    let t0 = Instant::now();
    let logits = model.forward(&prompt)?;
    let prefill = t0.elapsed().as_secs_f64();
    let v = cfg.vocab_size;
    let mut last = logits[logits.len() - v..].to_vec();
    let mut out = Vec::with_capacity(a.max_tokens);
    // Characters whose bytes span tokens are echoed once complete.
    let mut stream = TextStream::new(tok.clone());
    let t1 = Instant::now();
    for step in 0..a.max_tokens {
        check_logits(&last, step)?;
        let next = sample(&last, a.temperature, a.top_k, rng.random::<f64>());
        out.push(next);
        if echo {
            echo_text(&stream.push(&[next]))?;
        }
        if tok.eos_ids().contains(&next) {
            break;
        }
        last = model.forward(&[next])?;
    }
    let decode = t1.elapsed().as_secs_f64();
    if echo {
        echo_text(&stream.finish())?;
    }
    Ok(Run {
        text: tok.decode(&out),
        prefill_tps: prompt.len() as f64 / prefill,
        decode_tps: out.len() as f64 / decode.max(1e-9),
        bytes: model.matrix_bytes(),
    })
}

pub fn run(a: GenerateArgs) -> anyhow::Result<()> {
    check_args(&a)?; // a bad argument is an error before anything loads
    let (cfg, w, source, own) = load(&a)?;
    let tok = tokenizer(&a, &cfg, own.as_deref())?;
    // The decoders build from these names; a config that disagrees with the
    // tensors (a dropped layer, a tied head with its own matrix) is an error
    // on the CPU and the GPU alike.
    Llama::check_weights(&cfg, &w).with_context(|| source.clone())?;
    check_positions(
        tok.encode(&a.prompt).len(),
        a.max_tokens,
        cfg.max_position_embeddings,
    )?;
    let gpu = crate::gpu::model_gate(crate::gpu::open(&a.device)?, &a.device, &cfg, true)?;
    let device = match &gpu {
        Some(g) => {
            // f32 weights run on the CPU only: refuse them before any decoding.
            gpu_weights(&a.weights).context("--weights")?;
            if let Some(other) = &a.compare {
                gpu_weights(other).context("--compare")?;
            }
            g.info()?
        }
        None => format!("CPU, {} threads", rayon::current_num_threads()),
    };
    echo_text(&format!(
        "{source}: {} parameters; block matrices as {}; {device}\n\n",
        cfg.num_params(),
        a.weights,
    ))?;
    let one = |name: &str, echo: bool| -> anyhow::Result<Run> {
        match &gpu {
            Some(g) => run_one_gpu(&a, g, &cfg, &w, (name, &tok), echo),
            None => run_one(&a, &cfg, &w, (WeightStorage::from_name(name)?, &tok), echo),
        }
    };
    echo_text(&a.prompt)?;
    let first = one(&a.weights, true)?;
    echo_text("\n\n")?;
    let mut rows = vec![(a.weights.clone(), first)];
    if let Some(other) = &a.compare {
        let r = one(other, false)?;
        if r.text != rows[0].1.text {
            echo_text(&format!(
                "(the {other} weights sampled a different continuation: {:?}...)\n\n",
                r.text.chars().take(60).collect::<String>()
            ))?;
        }
        rows.push((other.clone(), r));
    }
    let mut t =
        crate::util::Table::new(&["weights", "matrix bytes", "prefill tok/s", "decode tok/s"]);
    for (name, r) in &rows {
        t.row(vec![
            name.clone(),
            r.bytes.to_string(),
            format!("{:.1}", r.prefill_tps),
            format!("{:.1}", r.decode_tps),
        ]);
    }
    t.print();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{check_positions, GenerateArgs};

    /// `--checkpoint` and `--random-model` together are an error: the
    /// random model was sampled and the checkpoint silently ignored.
    #[test]
    fn a_checkpoint_and_a_random_model_together_are_an_error() {
        use clap::{Args, FromArgMatches};
        let parse = |argv: &[&str]| {
            GenerateArgs::augment_args(clap::Command::new("generate"))
                .try_get_matches_from(argv)
                .and_then(|m| GenerateArgs::from_arg_matches(&m))
        };
        assert!(parse(&["generate", "--random-model", "tiny"]).is_ok());
        assert!(parse(&["generate", "--checkpoint", "ck"]).is_ok());
        let e = parse(&["generate", "--checkpoint", "ck", "--random-model", "tiny"])
            .err()
            .expect("contradictory flags are refused");
        assert_eq!(e.kind(), clap::error::ErrorKind::ArgumentConflict);
    }

    /// `--adapter-base-format` without `--adapter` is an error: it was
    /// silently dropped (any name, even a bad one, was accepted).
    #[test]
    fn an_adapter_base_format_without_an_adapter_is_an_error() {
        use clap::{Args, FromArgMatches};
        let parse = |argv: &[&str]| {
            GenerateArgs::augment_args(clap::Command::new("generate"))
                .try_get_matches_from(argv)
                .and_then(|m| GenerateArgs::from_arg_matches(&m))
        };
        let with = [
            "generate",
            "--adapter",
            "ad",
            "--adapter-base-format",
            "bf16",
        ];
        assert!(parse(&with).is_ok());
        let e = parse(&["generate", "--adapter-base-format", "bf16"])
            .err()
            .expect("a base format with no adapter is refused");
        assert_eq!(e.kind(), clap::error::ErrorKind::MissingRequiredArgument);
    }

    #[test]
    fn a_token_budget_that_overflows_is_an_error() {
        assert!(check_positions(6, 58, 64).is_ok());
        assert!(check_positions(6, 59, 64).is_err());
        let e = check_positions(6, usize::MAX, 64).unwrap_err().to_string();
        assert!(
            e.contains("--max-tokens 18446744073709551615") && e.contains("64 positions"),
            "{e}"
        );
        assert!(check_positions(0, 1, 64).is_err());
        assert!(check_positions(6, 0, 64).is_err());
    }
}

//! `octet`: the command line of the FP8 training engine.
//!
//! `octet train` trains a Llama-style model (the embedded default runs on a
//! CPU in minutes), `octet demo` shows every recipe's accuracy and memory on
//! one linear layer, `octet bench` measures kernels, `octet info` lists what
//! this build supports.

mod bench;
mod demo;
mod dist;
mod dist_gpu;
mod export;
mod generate;
mod gpu;
mod info;
mod lora;
mod train;
mod util;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "octet",
    version,
    about = "FP8 mixed-precision training engine",
    after_help = "Without a subcommand, octet trains the default model as `octet train` with its \
                  defaults would, into runs/default (runs/default-2, -3, ... where that holds a run)."
)]
struct Cli {
    #[command(subcommand)]
    cmd: Option<Cmd>,
    /// Trace what octet does on standard error: `-v` device choice, kernel
    /// compiles and cache hits, data, checkpoints and every step (the
    /// progress bar gives way to a line a step); `-vv` more detail.
    /// `OCTET_LOG` (a tracing filter, e.g. `octet_cuda=debug`) overrides it.
    #[arg(short, long, global = true, action = clap::ArgAction::Count, display_order = 1000)]
    verbose: u8,
}

/// The tracing filter for `-v` counted `verbose` times, unless `OCTET_LOG`
/// gives one: without `-v`, warnings and the announcement of NVRTC compiles
/// (a first GPU run compiles for up to a minute); octet's own crates at
/// debug with one, at trace with two or more.
fn log_filter(verbose: u8, env: Option<&str>) -> tracing_subscriber::EnvFilter {
    use tracing_subscriber::EnvFilter;
    let octet = [
        "octet",
        "octet_fp8",
        "octet_tensor",
        "octet_nn",
        "octet_train",
        "octet_cuda",
        "octet_dist",
    ];
    let level = match verbose {
        // Kernel compiles (a first GPU run's wait) are announced.
        0 => {
            return env.map_or_else(
                || EnvFilter::new("warn,octet_cuda::nvrtc=info"),
                EnvFilter::new,
            )
        }
        1 => "debug",
        _ => "trace",
    };
    let directives: Vec<String> = std::iter::once("warn".to_string())
        .chain(octet.iter().map(|c| format!("{c}={level}")))
        .collect();
    env.map_or_else(|| EnvFilter::new(directives.join(",")), EnvFilter::new)
}

/// Send tracing events to standard error, with the time since start.
fn init_tracing(verbose: u8) {
    let env = std::env::var("OCTET_LOG").ok();
    let _ = tracing_subscriber::fmt()
        .with_env_filter(log_filter(verbose, env.as_deref()))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_timer(tracing_subscriber::fmt::time::uptime())
        .try_init();
}

#[derive(Subcommand)]
enum Cmd {
    /// Train a Llama-style model (default: a small model on Tiny Shakespeare).
    Train(train::TrainArgs),
    /// Train the same model under several recipes and plot their loss curves together.
    Compare(train::CompareArgs),
    /// Quantize, forward and backward one linear layer under every recipe: error and saved-bytes tables.
    Demo(demo::DemoArgs),
    /// LoRA fine-tuning on a frozen FP8 (or bf16) base; `octet lora merge` merges an adapter.
    Lora(Box<lora::LoraArgs>),
    /// Sample text from a trained model with a KV cache (FP8, bf16 or f32 weights).
    Generate(generate::GenerateArgs),
    /// Write a checkpoint as an FP8 model folder a serving engine loads (compressed-tensors or fine-grained FP8).
    Export(export::ExportArgs),
    /// Measure kernel throughput.
    Bench(bench::BenchArgs),
    /// Version, formats, recipes and devices.
    Info,
    /// Run the conformance suite (GPU against the CPU reference) on a device.
    Selftest {
        /// cuda or auto.
        #[arg(long, default_value = "cuda")]
        device: String,
        /// Run only these checks: `weight-only` (the FP8 conversions and the
        /// weight-only products).
        #[arg(long, value_parser = ["weight-only"])]
        only: Option<String>,
    },
}

/// Whether a panic message is the standard library's for a write to a
/// closed stdout (`println!` when the reader of a pipe has gone, as in
/// `octet info | head -1`).
fn is_broken_pipe_panic(msg: &str) -> bool {
    msg.starts_with("failed printing to stdout")
        && (msg.contains("Broken pipe") || msg.contains("os error 32)"))
}

/// Whether `e` comes from a write to a closed pipe.
fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// A closed stdout ends the program quietly with status 0, as a pipe into
/// `head` expects, wherever the output was printed: a `println!` that fails
/// panics (caught by this hook), a write that returns the error ends in
/// `main`. Every other panic goes to the default hook.
fn exit_quietly_on_broken_pipe() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let msg = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied());
        if msg.is_some_and(is_broken_pipe_panic) {
            std::process::exit(0);
        }
        default(info);
    }));
}

fn main() {
    exit_quietly_on_broken_pipe();
    let cli = Cli::parse();
    init_tracing(cli.verbose);
    let cmd = match cli.cmd {
        Some(c) => Ok(c),
        None => train::TrainArgs::bare_in_a_free_run_dir().map(Cmd::Train),
    };
    let result = cmd.and_then(|cmd| match cmd {
        Cmd::Train(a) => train::run(a),
        Cmd::Compare(a) => train::compare(a),
        Cmd::Demo(a) => demo::run(a),
        Cmd::Bench(a) => bench::run(a),
        Cmd::Generate(a) => generate::run(a),
        Cmd::Export(a) => export::run(a),
        Cmd::Lora(a) => lora::run(*a),
        Cmd::Info => info::run(),
        Cmd::Selftest { device, only } => match gpu::open_for_selftest(&device) {
            Ok(Some(mut g)) => {
                let scope = match only.as_deref() {
                    Some("weight-only") => octet_nn::conformance::Scope::WeightOnly,
                    _ => octet_nn::conformance::Scope::All,
                };
                gpu::selftest(&mut g, scope)
            }
            Ok(None) => Err(anyhow::anyhow!(
                "selftest compares a GPU with the CPU reference; no GPU is available (the CPU side runs in `cargo test`)"
            )),
            Err(e) => Err(e),
        },
    });
    if let Err(e) = result {
        if is_broken_pipe(&e) {
            return;
        }
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

#[cfg(test)]
mod tests {
    use super::{is_broken_pipe, is_broken_pipe_panic, log_filter};

    #[test]
    fn verbosity_sets_the_level_of_octets_crates_only() {
        let quiet = log_filter(0, None).to_string();
        assert!(
            quiet.contains("octet_cuda::nvrtc=info") && !quiet.contains("debug"),
            "{quiet}"
        );
        let one = log_filter(1, None).to_string();
        assert!(
            one.contains("octet_cuda=debug") && one.contains("octet_train=debug"),
            "{one}"
        );
        assert!(
            one.starts_with("warn") || one.contains(",warn") || one.contains("warn,"),
            "{one}"
        );
        assert!(log_filter(2, None).to_string().contains("octet_nn=trace"));
        // OCTET_LOG wins over -v.
        assert_eq!(
            log_filter(2, Some("octet_dist=info")).to_string(),
            "octet_dist=info"
        );
    }

    #[test]
    fn a_broken_pipe_is_recognised() {
        // The message `println!` panics with when stdout's reader has gone.
        let e = std::io::Error::from(std::io::ErrorKind::BrokenPipe);
        assert!(is_broken_pipe_panic(
            "failed printing to stdout: Broken pipe (os error 32)"
        ));
        #[cfg(target_os = "linux")]
        assert!(is_broken_pipe_panic(&format!(
            "failed printing to stdout: {}",
            std::io::Error::from_raw_os_error(32)
        )));
        assert!(!is_broken_pipe_panic(
            "failed printing to stdout: No space left on device"
        ));
        assert!(!is_broken_pipe_panic("index out of bounds"));
        let wrapped = anyhow::Error::from(e).context("writing the sample");
        assert!(is_broken_pipe(&wrapped));
        assert!(!is_broken_pipe(&anyhow::anyhow!("Broken pipe")));
    }
}

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
mod generate;
mod gpu;
mod info;
mod lora;
mod train;
mod util;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "octet", version, about = "FP8 mixed-precision training engine")]
struct Cli {
    #[command(subcommand)]
    cmd: Option<Cmd>,
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
    /// Measure kernel throughput.
    Bench(bench::BenchArgs),
    /// Version, formats, recipes and devices.
    Info,
    /// Run the conformance suite (GPU against the CPU reference) on a device.
    Selftest {
        /// cuda or auto.
        #[arg(long, default_value = "cuda")]
        device: String,
    },
}

fn main() {
    let cli = Cli::parse();
    let cmd = match cli.cmd {
        Some(c) => Ok(c),
        None => train::TrainArgs::bare().map(Cmd::Train),
    };
    let result = cmd.and_then(|cmd| match cmd {
        Cmd::Train(a) => train::run(a),
        Cmd::Compare(a) => train::compare(a),
        Cmd::Demo(a) => demo::run(a),
        Cmd::Bench(a) => bench::run(a),
        Cmd::Generate(a) => generate::run(a),
        Cmd::Lora(a) => lora::run(*a),
        Cmd::Info => info::run(),
        Cmd::Selftest { device } => match gpu::open(&device) {
            Ok(Some(mut g)) => gpu::selftest(&mut g),
            Ok(None) => Err(anyhow::anyhow!(
                "selftest compares a GPU with the CPU reference; no GPU is available (the CPU side runs in `cargo test`)"
            )),
            Err(e) => Err(e),
        },
    });
    if let Err(e) = result {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

//! `cargo xtask`: the project's own tools. `bench kernels` measures the GPU kernels against
//! the device's copy bandwidth; `bench model` measures whole models against llama.cpp's
//! llama-bench; `gen-model` writes synthetic GGUF files.
mod bench_kernels;
mod bench_model;
mod compare;
mod gen_model;
mod measure;
mod presets;
mod vocab;

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "xtask", about = "kiln developer tasks")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Measurement protocols.
    Bench {
        #[command(subcommand)]
        what: BenchWhat,
    },
    /// CPU vs CUDA logits on one model, teacher-forced on the CPU's greedy tokens.
    CompareBackends(compare::Args),
    /// Write a synthetic GGUF model (real shapes, random weights, embedded BPE vocabulary).
    GenModel(gen_model::Args),
}

#[derive(Subcommand)]
enum BenchWhat {
    /// Mat-vec and row kernels on the GPU: GB/s and % of measured copy bandwidth.
    Kernels(bench_kernels::Args),
    /// Whole models, kiln vs llama-bench interleaved: prefill, decode, decode at depth.
    Model(bench_model::Args),
}

fn main() {
    let cli = Cli::parse();
    let r: Result<()> = match cli.cmd {
        Cmd::Bench {
            what: BenchWhat::Kernels(a),
        } => bench_kernels::run(a),
        Cmd::Bench {
            what: BenchWhat::Model(a),
        } => bench_model::run(a),
        Cmd::GenModel(a) => gen_model::run(a),
        Cmd::CompareBackends(a) => compare::run(a),
    };
    if let Err(e) = r {
        eprintln!("xtask: {e:#}");
        std::process::exit(1);
    }
}

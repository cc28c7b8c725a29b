//! `cargo xtask <command>`: the project's own tasks (see `--help`).

mod commands;

use clap::{Parser, Subcommand};

/// Project tasks for stax-rs.
#[derive(Parser)]
#[command(name = "xtask", about = "stax-rs project tasks")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Build the embedded two-class Fashion-MNIST subset from Debian's IDX files.
    Data(commands::data::DataArgs),
    /// Build test binaries, the example and benches into bundle/ for the GPU machine.
    GpuBundle(commands::gpu_bundle::GpuBundleArgs),
    /// Add the JAX/PyTorch step comparison (bench.sh, compare.py, anchors) to the bundle.
    BenchGpu(commands::bench_gpu::BenchGpuArgs),
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Data(args) => commands::data::run(args),
        Command::GpuBundle(args) => commands::gpu_bundle::run(args),
        Command::BenchGpu(args) => commands::bench_gpu::run(args),
    };
    if let Err(e) = result {
        eprintln!("xtask: {e}");
        std::process::exit(1);
    }
}

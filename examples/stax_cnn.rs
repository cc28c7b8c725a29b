//! The seed's model and loop: a stax CNN trained with Adam on two classes of Fashion-MNIST.
//!
//! ```text
//! cargo run --example stax_cnn --release                 # CUDA if present, else the CPU
//! cargo run --example stax_cnn --release -- --device cpu --img 200 --epochs 1
//! ```
//!
//! Model (as the seed's JAX code): `Conv(64, (3, 3), (1, 1), SAME) Relu Conv(64, ...) Relu
//! Flatten Dense(128) Relu Dense(2)`, Adam(1e-3), batch 100, 2 epochs. Every step prints the
//! loss, the step time and the memory line: live, peak and workspace bytes, reserved bytes,
//! (on CUDA) the driver's used bytes, and host staging bytes; `--breakdown` prints the full
//! breakdown by category.
//!
//! Memory tools:
//! ```text
//! cargo run --example stax_cnn --release -- --plan --img 200 --batch 100   # the step's memory plan
//! cargo run --example stax_cnn --release -- --plan --budget 16GB           # ... and the largest batch
//! cargo run --example stax_cnn --release -- --batch auto                   # train at that batch
//! cargo run --example stax_cnn --release -- --trace run.json --plot step.svg --json steps.jsonl
//! ```
//! `--plan` prints every buffer of one step (name, shape, bytes, category, live range), the
//! peak and where it falls, and exits without allocating; it works without a GPU. `--trace`
//! writes every allocation and free as Chrome trace / Perfetto JSON (open it in
//! ui.perfetto.dev); `--plot` draws one step's memory stacked by category against its
//! allocation events (the plan's step with `--plan`, else the last step run). The flags and
//! the loop are `examples/support/example.rs`, shared with `resnet50`.

#[path = "support/example.rs"]
mod example;

use clap::Parser;
use example::{Common, Example, exit_code, run};
use stax::models::seed_cnn;

/// Train the seed's stax CNN and report exact memory every step.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    #[command(flatten)]
    common: Common,
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let example = Example {
        name: "stax_cnn",
        gpu_img: 200,
    };
    exit_code(run(&args.common, example, &|classes, _| {
        Ok(seed_cnn(classes))
    }))
}

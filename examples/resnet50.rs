//! stax's ResNet-50 (`examples/resnet50.py` of the JAX repository, NHWC), or a shallower or
//! narrower one of the same blocks, trained with Adam on the embedded two-class Fashion-MNIST
//! resized to `--img`, with the memory line of every step.
//!
//! ```text
//! cargo run --example resnet50 --release                                 # ResNet-50 at 224x224 on CUDA
//! cargo run --example resnet50 --release -- --batch 128 --classes 1000 --max-steps 20
//! cargo run --example resnet50 --release -- --batch auto                 # the largest batch that fits
//! cargo run --example resnet50 --release -- --plan --batch 128           # the step's memory plan
//! cargo run --example resnet50 --release -- --plan --batch 128 --remat   # the same, blocks recomputed
//! cargo run --example resnet50 --release -- --plan --batch 128 --remat 2 # only the first two stages'
//! cargo run --example resnet50 --release -- --plan --batch 128 --remat 1 --remat-bn # and the BatchNorms'
//! cargo run --example resnet50 --release -- --plan --batch 128 --remat-bn to-end # the last convs too
//! cargo run --example resnet50 --release -- --device cpu --blocks 1,1,1,1 --widths 8,16,16,16 --epochs 4
//! ```
//!
//! Model: `Conv(w0, (7, 7), (2, 2), SAME) BatchNorm Relu MaxPool((3, 3), (2, 2))`, four stages
//! of a `ConvBlock` and `blocks - 1` `IdentityBlock`s (filters `[w, w, 4w]`), `AvgPool` over
//! the final feature map (`(7, 7)` at 224, as stax's), `Flatten`, `Dense(classes)`
//! (`stax::models::ResNet`). stax's model ends in `LogSoftmax` and sums `-logits * targets`;
//! here the logits go to softmax cross-entropy (its mean): the same gradients up to the batch
//! size. BatchNorm normalizes with the batch's statistics in training and evaluation alike, as
//! stax's does. The flags, the loop and the exports (`--plan`, `--plot`, `--trace`, `--json`)
//! are `examples/support/example.rs`, shared with `stax_cnn`.

#[path = "support/example.rs"]
mod example;

use clap::Parser;
use example::{Common, Error, Example, exit_code, run};
use stax::models::{BnSpans, ResNet};

/// Train stax's ResNet-50 (or a shallower variant) and report exact memory every step.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    #[command(flatten)]
    common: Common,
    /// Blocks per stage (ResNet-50: 3,4,6,3; one ConvBlock and blocks - 1 IdentityBlocks).
    #[arg(long, default_value = "3,4,6,3")]
    blocks: String,
    /// Width of each stage (ResNet-50: 64,128,256,512; the blocks' last convs have 4x).
    #[arg(long, default_value = "64,128,256,512")]
    widths: String,
    /// Rematerialize the blocks of the first N stages (`jax.checkpoint`; `--remat` alone: all
    /// 4): keep only each such block's input between the passes and recompute the block in the
    /// backward pass; less memory, one more forward pass of those blocks, the same results.
    #[arg(long, value_name = "N", num_args = 0..=1, default_missing_value = "4", default_value_t = 0)]
    remat: usize,
    /// In every block, recompute the first two BatchNorm + ReLU outputs in the backward pass
    /// (`norms`, the default: each BatchNorm, its ReLU and the next conv a span saving the
    /// conv's output), or those and the block's last conv output (`to-end`: the second span
    /// reaches the block's end), or as `to-end` with the block's last BatchNorm folded into its
    /// 1x1 conv (`fold`: its backward pass from the conv's input, so that conv does not run
    /// again). They leave the peak (ResNet-50, batch 128: 10.37 -> 8.95 GB
    /// with `norms`; with --remat 1, 6.73 GB) for one more normalizing pass of those
    /// BatchNorms (`to-end`: and one more pass of each block's last conv); the same results
    /// where each conv gets the same workspace (as for --remat: a --workspace-limit both plans
    /// meet).
    #[arg(long, value_enum, value_name = "SPANS", num_args = 0..=1, default_missing_value = "norms")]
    remat_bn: Option<RematBn>,
}

/// `--remat-bn`'s spans ([`BnSpans`]).
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum RematBn {
    /// The first two BatchNorms of each block with their ReLU and next conv.
    Norms,
    /// Those, the second reaching the block's end.
    ToEnd,
    /// As `to-end`, the block's last BatchNorm folded into its conv (its backward pass from
    /// the conv's input: no conv recomputed).
    Fold,
}

/// Four comma-separated positive numbers.
fn four(flag: &str, s: &str) -> Result<[usize; 4], Error> {
    let v: Vec<usize> = s
        .split(',')
        .map(|p| p.trim().parse::<usize>())
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{flag} {s:?}: {e}"))?;
    v.try_into().map_err(|v: Vec<usize>| {
        format!("{flag} {s:?}: expected 4 numbers, got {}", v.len()).into()
    })
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let net = |classes: usize| -> Result<ResNet, Error> {
        Ok(ResNet {
            blocks: four("--blocks", &args.blocks)?,
            widths: four("--widths", &args.widths)?,
            classes,
            remat_stages: args.remat,
            bn_spans: match args.remat_bn {
                None => BnSpans::None,
                Some(RematBn::Norms) => BnSpans::Norms,
                Some(RematBn::ToEnd) => BnSpans::ToEnd,
                Some(RematBn::Fold) => BnSpans::Fold,
            },
        })
    };
    let example = Example {
        name: "resnet50",
        gpu_img: 224,
    };
    exit_code(run(&args.common, example, &|classes, image| {
        Ok(net(classes)?.build(image)?)
    }))
}

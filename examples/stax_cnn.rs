//! The seed's model and loop: a stax CNN trained with Adam on two classes of Fashion-MNIST.
//!
//! ```text
//! cargo run --example stax_cnn --release                 # CUDA if present, else the CPU
//! cargo run --example stax_cnn --release -- --device cpu --img 200 --epochs 1
//! ```
//!
//! Model (as the seed's JAX code): `Conv(64, (3, 3), (1, 1), SAME) Relu Conv(64, ...) Relu
//! Flatten Dense(128) Relu Dense(2)`, Adam(1e-3), batch 100, 2 epochs. Every step prints the
//! loss, the step time and the memory line: live, peak and workspace bytes, reserved bytes and
//! (on CUDA) the driver's used bytes.

use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};
use stax::train::data::{Dataset, Loader, fashion_mnist_2class};
use stax::train::{StepReport, Trainer, place_batch};
use stax::{Adam, BackendOptions, Conv, Dense, Device, Flatten, Precision, Relu, Shape, serial};
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

/// Train the seed's stax CNN and report exact memory every step.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// auto (CUDA device 0 if usable, else CPU), cpu, cuda or cuda:N.
    #[arg(long, default_value = "auto")]
    device: String,
    /// Examples per step.
    #[arg(long, default_value_t = 100)]
    batch: usize,
    /// Passes over the training set.
    #[arg(long, default_value_t = 2)]
    epochs: u64,
    /// Model input height and width; images are resized (bilinear). Default: 200 (the seed's
    /// shape) on CUDA, the native 28 on the CPU.
    #[arg(long)]
    img: Option<usize>,
    /// Adam learning rate.
    #[arg(long, default_value_t = 1e-3)]
    lr: f32,
    /// Seed for parameters and batch order.
    #[arg(long, default_value_t = 2793)]
    seed: u64,
    /// Training data as .npz (arrays x/y or images/labels); default: the embedded set.
    #[arg(long)]
    data: Option<PathBuf>,
    /// Test data as .npz; required with --data.
    #[arg(long)]
    test_data: Option<PathBuf>,
    /// tf32 (JAX's default on this GPU) or highest (full f32).
    #[arg(long, default_value = "tf32")]
    precision: String,
    /// Allocator strategy (overrides STAX_ALLOCATOR): caching, bfc[:fraction=F], platform, async.
    #[arg(long)]
    allocator: Option<String>,
    /// Stop after this many steps in total (for timing runs).
    #[arg(long)]
    max_steps: Option<u64>,
    /// Write one JSON object per step to this file.
    #[arg(long)]
    json: Option<PathBuf>,
}

type Error = Box<dyn std::error::Error>;

fn open_backend(args: &Args) -> Result<Arc<dyn stax::Backend>, Error> {
    let mut options = BackendOptions::from_env()?;
    if let Some(s) = &args.allocator {
        options.strategy = s.parse()?;
    }
    options.precision = args.precision.parse::<Precision>()?;
    if args.device != "auto" {
        return Ok(args.device.parse::<Device>()?.open(&options)?);
    }
    match Device::Cuda(0).open(&options) {
        Ok(b) => Ok(b),
        Err(e) => {
            eprintln!("note: CUDA not usable ({e}); training on the CPU");
            Ok(Device::Cpu.open(&options)?)
        }
    }
}

fn load(args: &Args) -> Result<(Dataset, Dataset), Error> {
    match (&args.data, &args.test_data) {
        (None, None) => Ok(fashion_mnist_2class()?),
        (Some(train), Some(test)) => Ok((
            Dataset::from_npz(train, None, None)?,
            Dataset::from_npz(test, None, None)?,
        )),
        _ => Err("--data and --test-data go together".into()),
    }
}

fn line(r: &StepReport, total: u64) -> String {
    format!(
        "step {:>4}/{total} loss {:.4} | {:>8.2} ms | {}",
        r.step, r.loss, r.step_ms, r.memory
    )
}

fn main() -> Result<(), Error> {
    let args = Args::parse();
    let backend = open_backend(&args)?;
    let (train, test) = load(&args)?;
    let img = args.img.unwrap_or(if backend.device() == Device::Cpu {
        28
    } else {
        200
    });
    let (_, _, c) = train.image_shape();
    let channels = c.max(3);
    let hwc = (img, img, channels);
    let model = serial![
        Conv::same(64, (3, 3)),
        Relu,
        Conv::same(64, (3, 3)),
        Relu,
        Flatten,
        Dense(128),
        Relu,
        Dense(train.num_classes())
    ];
    let input = Shape::new([args.batch, img, img, channels]);
    let mut trainer = Trainer::new(model, input, Adam::new(args.lr), &backend, args.seed)?;
    let loader = Loader::new(train.len(), args.batch, args.seed)?;
    let total = (loader.num_batches() as u64 * args.epochs).min(args.max_steps.unwrap_or(u64::MAX));
    println!(
        "stax_cnn: {} train / {} test images at {img}x{img}x{channels}, batch {}, {} steps on {} ({:?}, allocator {})",
        train.len(),
        test.len(),
        args.batch,
        total,
        backend.device(),
        backend.precision(),
        backend.allocator().strategy()
    );
    println!(
        "parameters: {} ({} bytes)",
        trainer.params().numel(),
        trainer.params().bytes()
    );
    let mut json = args.json.as_ref().map(std::fs::File::create).transpose()?;
    let bar = ProgressBar::new(total);
    bar.set_style(ProgressStyle::with_template(
        "{bar:40} {pos}/{len} {msg} [{elapsed}<{eta}]",
    )?);
    'epochs: for epoch in 0..args.epochs {
        for indices in loader.batches(epoch) {
            if trainer.steps() >= total {
                break 'epochs;
            }
            let (x, y) = place_batch(&backend, &train, &indices, hwc)?;
            let report = trainer.step(&x, &y)?;
            bar.println(line(&report, total));
            bar.set_message(format!("loss {:.4}", report.loss));
            bar.inc(1);
            if let Some(f) = json.as_mut() {
                writeln!(f, "{}", serde_json::to_string(&report)?)?;
            }
        }
    }
    bar.finish_and_clear();
    let eval = trainer.evaluate(&test, args.batch)?;
    println!(
        "test: loss {:.4}, accuracy {:.2}% ({} images)",
        eval.loss,
        eval.accuracy * 100.0,
        eval.examples
    );
    Ok(())
}

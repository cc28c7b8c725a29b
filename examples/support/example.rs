//! What the training examples share (`stax_cnn`, `resnet50`): the device, data and memory
//! flags ([`Common`]), the memory plan (`--plan`), `--batch auto`, the training loop with its
//! per-step memory line, the exports (`--trace`, `--plot`, `--json`) and the test evaluation.
//! Each example is its model and this; it includes the file with `#[path]`.

use indicatif::{ProgressBar, ProgressStyle};
use stax::alloc::{human_bytes, parse_size};
use stax::layers::{Mixed, Policy};
use stax::tensor::cuda::{ConvApis, DirectConvs, Fp32Convs};
use stax::train::data::Dataset;
use stax::train::export::XAxis;
use stax::train::plan::{Feed, MemoryPlan, NamedTrace};
use stax::train::{StepReport, TrainError};
use stax::{Adam, Device, Precision, Serial, Shape};
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

/// An example's error: printed with its full diagnosis.
pub type Error = Box<dyn std::error::Error>;

/// An example's model under the dtype policy of `--precision` (f32: the model as it is).
pub type Model = Mixed<Serial>;

/// The model of an example for `classes` classes and `(height, width, channels)` images.
pub type ModelFn<'a> = &'a dyn Fn(usize, (usize, usize, usize)) -> Result<Serial, Error>;

#[path = "resume.rs"]
mod resume;

#[path = "distributed.rs"]
mod distributed;

#[path = "data.rs"]
mod data;
use data::batch_loader;

#[path = "checks.rs"]
mod checks;
use checks::{
    check_flags, check_host_memory, conv_apis, device_flag, direct_convs, fp32_convs,
    learning_rate, svg_path, with_feed_hint,
};

#[path = "exports.rs"]
mod exports;

#[path = "backend.rs"]
mod backend;

#[path = "setup.rs"]
mod setup;
use exports::{export, last_step, record, show_plan};
use setup::{check_world, set_up};

/// The flags every training example takes.
#[derive(clap::Args, Debug, Clone)]
#[command(group(clap::ArgGroup::new("from").args(["resume", "init_from"])))]
pub struct Common {
    /// auto (CUDA device 0 if usable, else CPU), cpu, cuda or cuda:N.
    #[arg(long, default_value = "auto", value_parser = device_flag)]
    pub device: String,
    /// Examples per step, or `auto`: the largest batch whose memory plan fits the device's
    /// free memory (or --budget), at most the training set.
    #[arg(long, default_value = "100", allow_hyphen_values = true)]
    pub batch: String,
    /// Passes over the training set.
    #[arg(long, default_value_t = 2, allow_negative_numbers = true)]
    pub epochs: u64,
    /// Model input height and width; images are resized (bilinear). Default: the example's,
    /// the native 28 on the CPU.
    #[arg(long, allow_negative_numbers = true)]
    pub img: Option<usize>,
    /// Classes of the model's head (default: the data's); labels are one-hot over this many.
    #[arg(long, allow_negative_numbers = true)]
    pub classes: Option<usize>,
    /// Adam learning rate.
    #[arg(long, default_value_t = 1e-3, allow_negative_numbers = true, value_parser = learning_rate)]
    pub lr: f32,
    /// Seed for parameters and batch order.
    #[arg(long, default_value_t = 2793, allow_negative_numbers = true)]
    pub seed: u64,
    /// Training data as .npz (arrays x/y or images/labels); default: the embedded set.
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Test data as .npz; required with --data.
    #[arg(long)]
    pub test_data: Option<PathBuf>,
    /// tf32 (JAX's default on an NVIDIA GPU; plain f32 on the CPU), highest or f32 (full f32),
    /// bf16 (f32 master weights and loss, bf16 compute; f32 ops in tf32) or f16 (the same in
    /// f16, with a dynamic loss scale as jmp's: 2^15, period 2000, factor 2).
    #[arg(long, default_value = "tf32")]
    pub precision: String,
    /// Allocator strategy (overrides STAX_ALLOCATOR): caching, expandable, bfc[:fraction=F],
    /// platform, async[:release_threshold=SIZE]; expandable and async need a CUDA device, bfc on
    /// the CPU needs --budget (it takes a fraction of a capacity).
    #[arg(long)]
    pub allocator: Option<String>,
    /// Stop after this many steps in total (for timing runs).
    #[arg(long, allow_negative_numbers = true)]
    pub max_steps: Option<u64>,
    /// Write one JSON object per step to this file (with --profile, then a last line
    /// `{"profile": {"report", "phases", "layers", "by_kind"}}`; with --plan: the plan as JSON).
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Print the memory plan of one step (every buffer, the peak and where it falls) and exit
    /// without training; works without a GPU for any --img/--batch. It reads and writes no
    /// checkpoint (not with --save, --resume or --init-from). Not with --ranks or --gpus: a
    /// rank's plan adds its gradient bucket, which only a connected rank has (drop the flag to
    /// plan one rank without it).
    #[arg(long, conflicts_with_all = ["save", "resume", "init_from", "ranks", "gpus"])]
    pub plan: bool,
    /// Memory budget for "largest batch that fits" and `--batch auto` (bytes, or with
    /// KiB/MiB/GiB/TiB/KB/MB/GB/TB); default: the device's free memory. On the CPU it also caps the
    /// host memory the backend may use.
    #[arg(long, allow_hyphen_values = true)]
    pub budget: Option<String>,
    /// Write every allocation and free as Chrome trace / Perfetto JSON to this file (with
    /// --plan: the plan's step).
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Draw one step's memory, stacked by category, as SVG to this file, a name ending in .svg
    /// (with --plan: the plan's step; otherwise the last step run).
    #[arg(long, value_name = "FILE.svg", value_parser = svg_path)]
    pub plot: Option<PathBuf>,
    /// Print the full memory breakdown (by category, cache, outside the allocator, host) after
    /// every step.
    #[arg(long)]
    pub breakdown: bool,
    /// After the loop, the save and the test, one more training step (on the training set's
    /// first `--batch` images, in file order) with its phases and every layer's forward and
    /// backward pass timed (CUDA events; the host clock on the CPU): time by layer kind and
    /// the slowest layers. That step is neither saved nor evaluated. Not with --plan or
    /// --eval-only, which train no step.
    #[arg(long, conflicts_with_all = ["plan", "eval_only"])]
    pub profile: bool,
    /// Place each batch just before its step instead of prefetching it (the next batch's copy
    /// overlapping the current step): one batch fewer on the device, less overlap.
    #[arg(long)]
    pub no_prefetch: bool,
    /// How stored pixels become the model's inputs: `unit` divides 8-bit pixels by 255 (to
    /// [0, 1]), `raw` feeds them as stored. Default: `unit` for 8-bit data, `raw` for f32.
    #[arg(long)]
    pub pixel_scale: Option<String>,
    /// Record every allocation and free (the set-up and every step; with --plan: the planned
    /// set-up and step) as JSON lines to this file, the trace format `alloc_bench --trace`
    /// replays (stax-alloc's crate docs).
    #[arg(long)]
    pub record_trace: Option<PathBuf>,
    /// The most workspace one convolution pass may use (bytes, or with KiB/MiB/GiB/TiB/KB/MB/GB/TB):
    /// on CUDA what cuDNN's search may pick algorithms within (default 256 MiB), on the CPU the
    /// im2col column chunk (default 4 MiB). Without it a pass may also take what the step has
    /// free below its peak while it runs (the headroom rule); given, it caps that too.
    #[arg(long, allow_hyphen_values = true)]
    pub workspace_limit: Option<String>,
    /// Collect the dense weights' gradients for the one update after the backward pass (as
    /// JAX and PyTorch do) instead of applying Adam to them in their backward pass: more
    /// memory (the seed's 1.31 GB weight gradient), for comparison. Under `--precision f16`
    /// gradients are always collected (a loss-scaled update may have to be skipped).
    #[arg(long)]
    pub collect_grads: bool,
    /// Write a checkpoint (parameters, Adam's state, step, data position) here at the end.
    #[arg(long)]
    pub save: Option<PathBuf>,
    /// With --save: also save every N steps (N >= 1).
    #[arg(long, requires = "save", value_parser = clap::value_parser!(u64).range(1..))]
    pub save_every: Option<u64>,
    /// Resume from this checkpoint (its data order's seed overrides --seed; --epochs and
    /// --max-steps count the steps before it too).
    #[arg(long)]
    pub resume: Option<PathBuf>,
    /// Start from this checkpoint's parameters (a JAX one too) with a fresh optimizer.
    #[arg(long, conflicts_with = "resume")]
    pub init_from: Option<PathBuf>,
    /// Print the test loss and accuracy of the --resume or --init-from checkpoint and exit
    /// (not with --plan, which plans a training step, nor with the flags of training: --save,
    /// --epochs, --max-steps, --lr).
    #[arg(
        long,
        requires = "from",
        conflicts_with_all = ["plan", "save", "epochs", "max_steps", "lr"]
    )]
    pub eval_only: bool,
    /// CUDA: deterministic cuDNN algorithms (the first in cuDNN's heuristic order), untimed;
    /// legacy-API candidates only, so --conv-apis does not apply.
    #[arg(long)]
    pub deterministic: bool,
    /// CUDA: which cuDNN API's algorithms the conv search times: legacy (default), graph (the
    /// graph API's engines, as PyTorch and XLA run them) or both.
    #[arg(long, default_value = "legacy", value_parser = conv_apis)]
    pub conv_apis: ConvApis,
    /// CUDA, --precision highest: how the f32 convs run full fp32: fastest (default: cuDNN's
    /// FMA algorithms or 3xTF32, three TF32 tensor-core passes on the operands' high and low
    /// parts, or for the forward and backward-data passes one TF32 pass over the parts stacked
    /// along the summed channels, whichever the search times faster), fma, 3xtf32 (only the
    /// composites) or 3xtf32-stacked (only the stacked ones where a pass has them).
    #[arg(long, default_value = "fastest", value_parser = fp32_convs)]
    pub fp32_convs: Fp32Convs,
    /// CUDA: where our direct kernels run instead of cuDNN (convs of at most 32 taps, the first
    /// conv on RGB images; the wgmma kernels of a 3x3 conv from 64 to 64 channels): winning
    /// (default: always on the tensor cores for 32 to 128 outputs in bf16, f16 and TF32, and
    /// the small-tap f32 forward pass under --precision highest; elsewhere where timed faster
    /// than cuDNN's choice at calibration, not timed with --deterministic), all (every pass
    /// they take) or off.
    #[arg(long, default_value = "winning", value_parser = direct_convs)]
    pub direct_convs: DirectConvs,
    /// CUDA: run every dense layer's backward pass with Adam by chunks through cuBLAS, also
    /// for an f32 batch of at most 16 rows into at most 128 outputs, or under TF32 of 17 to 128
    /// rows into a multiple of 8 up to 128 outputs, which by default run as one pass over the
    /// weight (no workspace).
    #[arg(long)]
    pub no_dense_adam_rows: bool,
    #[command(flatten)]
    pub dist: distributed::Distributed,
}

/// What distinguishes one example: its name and input size on the GPU.
#[derive(Debug, Clone, Copy)]
pub struct Example {
    /// The example's name, for its header line.
    pub name: &'static str,
    /// The default `--img` on a GPU (on the CPU: 28).
    pub gpu_img: usize,
}

impl Common {
    /// Adam with `--lr`, updating dense weights in their backward pass unless
    /// `--collect-grads`.
    fn adam(&self) -> Adam {
        let adam = Adam::new(self.lr);
        if self.collect_grads {
            adam.collecting()
        } else {
            adam
        }
    }

    /// How the loop feeds batches.
    fn feed(&self) -> Feed {
        if self.no_prefetch {
            Feed::Placed
        } else {
            Feed::Prefetched
        }
    }

    fn budget(&self) -> Result<Option<u64>, Error> {
        size_flag("--budget", self.budget.as_deref())
    }
}

/// A size flag's value in bytes, `None` when not given.
fn size_flag(flag: &str, value: Option<&str>) -> Result<Option<u64>, Error> {
    match value {
        Some(b) => Ok(Some(parse_size(b).ok_or(format!(
            "{flag} {b:?}: expected bytes, or a number with KiB, MiB, GiB, TiB, KB, MB, GB or \
             TB, below 2^64 bytes"
        ))?)),
        None => Ok(None),
    }
}

impl Common {
    /// `--precision`: the backend's f32 matmul precision and the model's dtype policy.
    ///
    /// # Errors
    /// An unknown name.
    pub fn precision(&self) -> Result<(Precision, Policy), Error> {
        Ok(match self.precision.as_str() {
            "bf16" => (Precision::Tf32, Policy::BF16),
            "f16" => (Precision::Tf32, Policy::F16),
            other => (
                other.parse::<Precision>().map_err(|_| {
                    format!("--precision {other:?}: expected tf32, highest (or f32), bf16 or f16")
                })?,
                Policy::default(),
            ),
        })
    }
}

/// Prints above the progress bar, or plainly when the bar is hidden (output not a terminal).
fn say(bar: &ProgressBar, text: String) {
    if bar.is_hidden() {
        println!("{text}");
    } else {
        bar.println(text);
    }
}

fn line(r: &StepReport, total: u64) -> String {
    let scale = match r.loss_scale {
        Some(s) if s.skipped => format!(
            " | skipped: non-finite gradients, nothing updated; loss scale {} -> {}",
            s.scale, s.next_scale
        ),
        _ => String::new(),
    };
    format!(
        "step {:>4}/{total} loss {:.4} | {:>8.2} ms (loss at {:.2}, queued at {:.2}) | {}{scale}",
        r.step, r.loss, r.step_ms, r.loss_ms, r.queued_ms, r.memory
    )
}

/// Runs `run`, and prints an error with its full diagnosis (`Display`, not `Debug`).
pub fn exit_code(result: Result<(), Error>) -> std::process::ExitCode {
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            let train = e.downcast_ref::<TrainError>();
            if let Some(TrainError::InitOutOfMemory { .. }) = train {
                // the parameters grow with --img (the dense layer's inputs), not with the batch
                eprintln!("  (here: lower --img, or raise --budget; --plan shows every buffer)");
            } else if train
                .is_some_and(|t| matches!(t, TrainError::OutOfMemory(_)) || t.oom().is_some())
            {
                eprintln!(
                    "  (here: lower --batch or --img, or raise --budget; --plan shows every buffer)"
                );
            }
            std::process::ExitCode::FAILURE
        }
    }
}

/// `--plan`, or the training run of `example`'s `model`: the header, every step's loss, time
/// and memory line (each step's peak compared with the plan), the loop's summary, the
/// exports, and the test set's loss and accuracy.
pub fn run(args: &Common, example: Example, model: ModelFn<'_>) -> Result<(), Error> {
    let world = |rank0: &Common, n| check_world(rank0, (example, model), n);
    if distributed::launch_if_asked(args, check_flags, world)? {
        return Ok(());
    }
    let args = &distributed::for_rank(args)?;
    let s = set_up(args, (example, model), distributed::world()?)?;
    let (backend, (img, _, channels)) = (&s.backend, s.image);
    let make = || model(s.train.num_classes(), s.image).map(|m| Mixed::new(m, s.policy));
    let input = Shape::new([s.batch, img, img, channels]);
    let adam = args.adam();
    if args.plan {
        let model = &s.model;
        let at = |feed| MemoryPlan::with_feed(model, &input, &adam, backend, feed);
        let plan = at(args.feed())?;
        if !plan.exact {
            // the explicit step that allocates: cuDNN's algorithm search for each conv pass
            println!("calibrating the step's ops (cuDNN's algorithm search; scratch released)");
            plan.calibrate(backend)?;
        }
        // as the trainer does: each conv the workspace the step has free below its peak
        let widened = stax::train::plan::headroom_rule(backend, args.feed(), at)?;
        println!("workspace headroom: {widened} op(s) given more workspace below the peak");
        return show_plan(args, &at(args.feed())?, model, backend);
    }
    let data = (&s.train, &s.test);
    train_and_test(args, example, (s.model, &make, input), backend, data)
}

/// The training loop and the evaluation (see [`run`]) of `model` (`make` builds it again for
/// error hints).
fn train_and_test(
    args: &Common,
    example: Example,
    (model, make, input): (Model, &dyn Fn() -> Result<Model, Error>, Shape),
    backend: &Arc<dyn stax::Backend>,
    (train, test): (&Dataset, &Dataset),
) -> Result<(), Error> {
    let (batch, img, channels) = (input.dims()[0], input.dims()[1], input.dims()[3]);
    let adam = args.adam();
    let tracing = args.trace.is_some() || args.plot.is_some() || args.record_trace.is_some();
    if tracing {
        backend.allocator().start_trace();
    }
    if !args.eval_only {
        // before the trainer reserves the step's memory: a batch the training set cannot fill
        // is refused at once, not after a set-up that may not fit the machine
        batch_loader(train.len(), (batch, 1), args.seed)?;
        resume::check_position(args, (&model, batch), |seed| {
            batch_loader(train.len(), (batch, 1), seed)
        })?;
    }
    check_host_memory(args, (&model, &input), backend)?;
    let built = resume::build_trainer(args, (model, &input, adam), backend);
    let hint = |e| with_feed_hint(e, (args, train.len()), (make, &input), backend);
    let (trainer, position) = built.map_err(hint)?;
    let (mut trainer, rank, world) = distributed::join(&args.dist, trainer, backend)?;
    if args.eval_only {
        println!("test: {}", trainer.evaluate(test, batch)?);
        return Ok(());
    }
    let seed = position.map_or(args.seed, |p| p.seed);
    let loader = batch_loader(train.len(), (batch, world), seed)?;
    let start = position.unwrap_or(loader.start());
    let (first, total) = (trainer.steps(), loader.steps(args.epochs, args.max_steps)?);
    let saver = resume::Saver::new(args, &loader, start, first);
    let plan = trainer.plan_with_feed(batch, args.feed())?;
    // A prefetched loop's last step has no batch left to prefetch: it peaks as a placed one.
    let last_peak = match args.feed() {
        Feed::Prefetched => trainer.plan_with_feed(batch, Feed::Placed)?.peak.bytes,
        Feed::Placed | Feed::Accumulated(_) => plan.peak.bytes,
    };
    println!(
        "{}: {} train / {} test images at {img}x{img}x{channels}, {} classes, batch {batch}, {} step(s) on {} ({}, allocator {})",
        example.name,
        train.len(),
        test.len(),
        train.num_classes(),
        total,
        backend.device(),
        match (backend.device(), args.precision.as_str()) {
            (_, "bf16") => "bf16 compute, f32 master weights".to_string(),
            (_, "f16") => "f16 compute, f32 master weights, dynamic loss scale".to_string(),
            (Device::Cpu, _) => "f32".to_string(),
            _ => format!("{:?}", backend.precision()),
        },
        backend.allocator().strategy().in_effect()
    );
    println!(
        "pixels: training {}, test {} (--pixel-scale unit|raw)",
        train.scaling(),
        test.scaling()
    );
    println!(
        "parameters: {} ({} bytes)",
        trainer.params().numel(),
        trainer.params().bytes()
    );
    println!(
        "plan: peak {} = persistent {} + step {} (--plan for every buffer)",
        human_bytes(plan.peak.bytes),
        human_bytes(plan.persistent_bytes()),
        human_bytes(plan.peak.bytes - plan.persistent_bytes())
    );
    if let Some(comm) = &plan.comm {
        print!("{comm}");
    }
    let mut json = match &args.json {
        Some(p) => {
            Some(std::fs::File::create(p).map_err(|e| format!("--json {}: {e}", p.display()))?)
        }
        None => None,
    };
    let bar = ProgressBar::new(total.saturating_sub(first));
    bar.set_style(ProgressStyle::with_template(
        "{bar:40} {pos}/{len} {msg} [{elapsed}<{eta}]",
    )?);
    // Each step's peak against its plan, from the run's first step on (the trainer calibrated
    // at set-up): the count compared and the first that differs.
    let first_compared = first + 1;
    let planned = |step: u64| {
        if step < total {
            plan.peak.bytes
        } else {
            last_peak
        }
    };
    let mut compared = (0u64, None);
    let batches = loader
        .batches_from(start)
        .map_err(|e| resume::position_error(args, batch, e))?
        .take(total.saturating_sub(first) as usize)
        .map(move |ix| distributed::shard(ix, rank, batch));
    let started = Instant::now();
    let mut show = |report: StepReport| -> Result<(), Error> {
        say(&bar, line(&report, total));
        if args.breakdown {
            say(&bar, report.memory.breakdown());
        }
        if report.step >= first_compared {
            compared.0 += 1;
            if report.memory.peak != planned(report.step) && compared.1.is_none() {
                compared.1 = Some((report.step, report.memory.peak));
            }
        }
        bar.set_message(format!("loss {:.4}", report.loss));
        bar.inc(1);
        if let Some(f) = json.as_mut() {
            json_line(f, args, serde_json::to_string(&report)?)?;
        }
        Ok(())
    };
    if args.no_prefetch {
        for indices in batches {
            let (x, y) = trainer.place_batch(train, &indices)?;
            show(trainer.step(&x, &y)?)?;
            if let Some(line) = saver.maybe(&trainer, false)? {
                say(&bar, line);
            }
        }
    } else {
        let mut feed = trainer.prefetch(train, batches);
        while let Some(report) = trainer.step_prefetched(&mut feed)? {
            show(report)?;
            if let Some(line) = saver.maybe(&trainer, false)? {
                say(&bar, line);
            }
        }
    }
    let loop_s = started.elapsed().as_secs_f64();
    bar.finish_and_clear();
    match trainer.steps() - first {
        0 => println!(
            "loop: no step trained (the run starts at step {first}, and --max-steps / --epochs \
             end it at step {total})"
        ),
        n => println!(
            "loop: {n} step{} in {loop_s:.2} s, {:.2} ms a step with data ({})",
            if n == 1 { "" } else { "s" },
            loop_s * 1e3 / n as f64,
            match args.feed() {
                Feed::Prefetched => "next batch prefetched",
                Feed::Placed | Feed::Accumulated(_) => "each batch placed before its step",
            }
        ),
    }
    match compared {
        (0, _) => {}
        // one step is the loop's last: its plan is the last step's
        (1, None) => println!(
            "step peaks: measured = planned on the one step, step {first_compared} ({})",
            human_bytes(last_peak)
        ),
        (n, None) => println!(
            "step peaks: measured = planned on all {n} steps from step {first_compared} ({}; the \
             last step {})",
            human_bytes(plan.peak.bytes),
            human_bytes(last_peak)
        ),
        (_, Some((step, peak))) => println!(
            "step peaks: step {step} differs from its plan: measured {}, planned {}",
            human_bytes(peak),
            human_bytes(planned(step))
        ),
    }
    if tracing {
        let recorded = backend.allocator().stop_trace();
        record(args, &recorded)?;
        let named = NamedTrace::of(&recorded);
        let title = format!(
            "{} on {}, batch {batch}: step {}",
            example.name,
            backend.device(),
            named.step_starts.len()
        );
        let step = last_step(&named);
        let trace = (&named.timeline, &named.step_starts[..]);
        export(args, trace, (&step, XAxis::Events), &title)?;
    }
    if let Some(line) = saver.maybe(&trainer, true)? {
        println!("{line}");
    }
    println!("test: {}", trainer.evaluate(test, batch)?);
    if args.profile {
        // after the save and the test: the extra update reaches neither
        let first: Vec<usize> = (0..batch.min(train.len())).collect();
        let (x, y) = trainer.place_batch(train, &first)?;
        let profile = trainer.profile_step(&x, &y)?;
        if let Some(f) = json.as_mut() {
            let line = serde_json::json!({ "profile": &profile });
            json_line(f, args, serde_json::to_string(&line)?)?;
        }
        println!("profile (one more step, neither saved nor evaluated): {profile}");
    }
    Ok(())
}

/// One line of `--json`'s file; a failed write (a full disk) names the flag and the file.
fn json_line(f: &mut std::fs::File, args: &Common, line: String) -> Result<(), Error> {
    let path = args.json.as_deref().unwrap_or(std::path::Path::new("?"));
    writeln!(f, "{line}").map_err(|e| format!("--json {}: {e}", path.display()).into())
}

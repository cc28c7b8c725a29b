//! The examples' checks of what a run is given before it trains: `--batch` (or the largest batch
//! that fits), `--img` against the model, output paths, the set-up's out-of-memory hint for
//! the run's own feed, a CPU run's plan against the host's memory, and the value parsers of
//! `--lr`, `--device`, `--conv-apis`, `--direct-convs` and `--fp32-convs`.

use super::data::{self, smallest_img};
use super::{Common, Error, Model, ModelFn};
use stax::alloc::human_bytes;
use stax::tensor::cuda::{ConvApis, DirectConvs, Fp32Convs};
use stax::train::TrainError;
use stax::train::plan::{MemoryPlan, max_batch_that_fits};
use stax::{DType, Device, Shape};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A trainer is set up for placed batches (it rehearses their loop) before the loop says it
/// prefetches: an out-of-memory at set-up names the largest batch (at most the training set's
/// `examples`, as `--batch auto` takes) and the planned peak of this run's feed.
pub fn with_feed_hint(
    e: Error,
    (args, examples): (&Common, usize),
    (make, input): (&dyn Fn() -> Result<Model, Error>, &Shape),
    backend: &Arc<dyn stax::Backend>,
) -> Error {
    match e.downcast::<TrainError>() {
        Ok(t) => match *t {
            TrainError::OutOfMemory(mut oom) if oom.max_batch.is_some() => {
                let budget = args.budget().ok().flatten();
                let (adam, feed) = (args.adam(), args.feed());
                if let Ok(m) = make() {
                    let fits = max_batch_that_fits(&m, input, &adam, backend, feed, budget);
                    oom.max_batch = fits.ok().or(oom.max_batch).map(|n| n.min(examples));
                    let plan = MemoryPlan::with_feed(&m, input, &adam, backend, feed);
                    oom.planned_peak = plan.ok().map(|p| p.peak.bytes).or(oom.planned_peak);
                }
                TrainError::OutOfMemory(oom).into()
            }
            other => other.into(),
        },
        Err(e) => e,
    }
}

/// On the CPU without `--budget` (which caps the run), the step's planned peak against the
/// host's available memory (`MemAvailable` of `/proc/meminfo`; skipped where there is none): a
/// run the host cannot hold is refused before the set-up touches its memory, rather than killed
/// by the system part-way. A launcher checks the ranks that share this host together
/// ([`host_holds`], from `check_world`) before it starts them.
pub fn check_host_memory(
    args: &Common,
    (model, input): (&Model, &Shape),
    backend: &Arc<dyn stax::Backend>,
) -> Result<(), Error> {
    if backend.device() != Device::Cpu || args.budget()?.is_some() {
        return Ok(());
    }
    let plan = MemoryPlan::with_feed(model, input, &args.adam(), backend, args.feed())?;
    host_holds(&plan, input, (1, 0))
}

/// `ranks` steps of `plan` (each with a gradient `bucket` when there are several) against the
/// host's available memory (see [`check_host_memory`]; `input` names the batch and image).
pub fn host_holds(
    plan: &MemoryPlan,
    input: &Shape,
    (ranks, bucket): (usize, u64),
) -> Result<(), Error> {
    let Some(available) = host_available_bytes() else {
        return Ok(());
    };
    let each = plan.peak.bytes + if ranks <= 1 { 0 } else { bucket };
    let need = each.saturating_mul(ranks as u64);
    if need <= available {
        return Ok(());
    }
    let (b, i) = (input.dims()[0], input.dims()[1]);
    let peak = human_bytes(plan.peak.bytes);
    let (whose, lower) = match ranks {
        0 | 1 => (format!("peaks at {peak}"), "lower --batch or --img"),
        n => (
            format!(
                "peaks at {peak} and a {} gradient bucket on each of {n} ranks, {} together",
                human_bytes(bucket),
                human_bytes(need)
            ),
            "lower --ranks, --batch or --img",
        ),
    };
    Err(format!(
        "--batch {b} --img {i}: the step's plan {whose} on the CPU, more than the host's \
         available memory, {} (/proc/meminfo); {lower} (--plan shows every buffer)",
        human_bytes(available)
    )
    .into())
}

/// `MemAvailable` of `/proc/meminfo` in bytes, where the system reports it.
fn host_available_bytes() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// `--img` is checked against the model before anything is planned: an image the model's
/// shapes refuse names the flag, the layer's reason and the smallest `--img` that works.
pub fn check_img(
    model: ModelFn<'_>,
    (classes, c): (usize, usize),
    img: usize,
) -> Result<(), Error> {
    let Err(e) = data::takes(model, (classes, c), img) else {
        return Ok(());
    };
    // a model no image size builds is wrong for another reason: its own error says which
    let Some(n) = smallest_img(model, (classes, c), 4096)? else {
        return Err(e);
    };
    let hint = match img < n {
        true => format!("the smallest --img it takes is {n}"),
        false => format!("too large: it takes --img {n} and up, to what the memory holds"),
    };
    Err(format!("--img {img}: the model cannot take {img}x{img} images ({hint}): {e}").into())
}

/// The flags' checks that need no backend, run before one opens (a CUDA backend compiles the
/// kernels on a machine's first run, about half a minute): `--img 0`, `--batch N`,
/// `--budget`, `--precision` and its dtype policy, and the output files: each writable, no two
/// the same file and none the file of an input (`--data`, `--test-data`, `--init-from`,
/// `--resume`), but `--save` over `--resume`'s checkpoint, which continues a run in place.
pub fn check_flags(args: &Common) -> Result<(), Error> {
    if args.img == Some(0) {
        return Err("--img 0: the image size must be at least 1".into());
    }
    fixed_batch(args)?;
    args.budget()?;
    let policy = args.precision()?.1;
    // f16 compute trains with jmp's dynamic loss scale (the trainer's default for it)
    policy.check(policy.compute == DType::F16)?;
    let outputs = [
        ("--json", &args.json),
        ("--trace", &args.trace),
        ("--plot", &args.plot),
        ("--record-trace", &args.record_trace),
        ("--save", &args.save),
    ];
    let inputs = [
        ("--data", &args.data),
        ("--test-data", &args.test_data),
        ("--init-from", &args.init_from),
        ("--resume", &args.resume),
    ];
    let resolved = |paths: &[(&'static str, &Option<PathBuf>)]| -> Vec<(&str, FileKey)> {
        let given = paths.iter().filter_map(|(f, p)| Some((*f, p.as_deref()?)));
        given.map(|(f, p)| (f, FileKey::of(p))).collect()
    };
    let (outs, ins) = (resolved(&outputs), resolved(&inputs));
    // outs holds the given outputs in order, as the filter below
    let given = outputs.iter().filter_map(|(_, p)| p.as_deref());
    for ((flag, key), path) in outs.iter().zip(given) {
        check_path(flag, path, key)?;
    }
    for (i, (flag, key)) in outs.iter().enumerate() {
        if let Some((first, _)) = outs[..i].iter().find(|(_, k)| k == key) {
            let path = key.path.display();
            return Err(format!("{first} and {flag} both write {path}: one would be lost").into());
        }
        // a checkpoint saved over the one resumed from is the documented way to continue a run
        let clash = ins
            .iter()
            .find(|(f, k)| k == key && (*flag, *f) != ("--save", "--resume"));
        if let Some((input, _)) = clash {
            let path = key.path.display();
            return Err(format!("{flag} would overwrite {path}, the file {input} reads").into());
        }
    }
    Ok(())
}

/// A file as the file system knows it, so that two names of one file compare equal: the path
/// a write would reach (symbolic links followed, even to a file not there yet; the directory
/// canonical) and, for a file that exists, its device and inode (a hard link is the same file).
#[derive(Debug)]
struct FileKey {
    path: PathBuf,
    inode: Option<(u64, u64)>,
}

impl FileKey {
    fn of(path: &Path) -> FileKey {
        let mut p = path.to_path_buf();
        // a dangling link: the file a write through it would create (at most 40, as the kernel)
        for _ in 0..40 {
            let Ok(target) = std::fs::read_link(&p) else {
                break;
            };
            p = p.parent().unwrap_or(Path::new("")).join(target);
        }
        let dir = p.parent().filter(|d| !d.as_os_str().is_empty());
        let dir = dir.unwrap_or(Path::new(".")).canonicalize();
        let path = match (dir, p.file_name()) {
            (Ok(d), Some(name)) => d.join(name),
            _ => p,
        };
        let inode = std::fs::metadata(&path).ok().map(|m| {
            use std::os::unix::fs::MetadataExt;
            (m.dev(), m.ino())
        });
        FileKey { path, inode }
    }
}

impl PartialEq for FileKey {
    fn eq(&self, other: &FileKey) -> bool {
        match (self.inode, other.inode) {
            (Some(a), Some(b)) => a == b,
            _ => self.path == other.path,
        }
    }
}

/// An output file's flag (`path`, known to the file system as `key`) is checked before
/// training, not after it: the path must not be a directory or another file that is not a
/// regular one (`/dev/full`, a pipe), and its directory must exist and take the file (made and
/// removed at once where it is not there yet, else a probe beside it).
fn check_path(flag: &str, path: &Path, key: &FileKey) -> Result<(), Error> {
    if path.is_dir() {
        return Err(format!("{flag}: {} is a directory", path.display()).into());
    }
    // a checkpoint would be renamed over a device node or a pipe, another output written into it
    if path.exists() && !path.is_file() {
        let what = "exists and is not a regular file";
        return Err(format!("{flag}: {} {what}", path.display()).into());
    }
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    if !dir.is_dir() {
        return Err(format!("{flag}: {} is not a directory", dir.display()).into());
    }
    // a new file is made and removed under its own name (a name too long fails here, not
    // after training), through any symbolic link to it; beside an existing one, a short probe
    let probe = if key.path.exists() {
        dir.join(format!(".stax-write-probe-{}", std::process::id()))
    } else {
        key.path.clone()
    };
    std::fs::File::create(&probe)
        .and_then(|_| std::fs::remove_file(&probe))
        .map_err(|e| format!("{flag}: cannot write {}: {e}", probe.display()).into())
}

/// `--batch N`'s N, or `None` for `auto`.
pub fn fixed_batch(args: &Common) -> Result<Option<usize>, Error> {
    if args.batch == "auto" {
        return Ok(None);
    }
    match args.batch.parse() {
        Ok(0) => Err("--batch 0: a batch needs at least one example".into()),
        Ok(n) => Ok(Some(n)),
        Err(e) => {
            let what = "expected a positive whole number or auto";
            Err(format!("--batch {:?}: {what} ({e})", args.batch).into())
        }
    }
}

/// The batch size: `--batch N`, or with `auto` the largest whose plan fits (at most the
/// training set's size).
pub fn batch_size(
    args: &Common,
    model: &Model,
    image: (usize, usize, usize),
    backend: &Arc<dyn stax::Backend>,
    (set, world): (usize, usize),
) -> Result<usize, Error> {
    let examples = set / world.max(1);
    if let Some(n) = fixed_batch(args)? {
        return Ok(n);
    }
    let (h, w, c) = image;
    let adam = args.adam();
    let one = Shape::new([1, h, w, c]);
    let budget = args.budget()?;
    let n = match max_batch_that_fits(model, &one, &adam, backend, args.feed(), budget) {
        Err(TrainError::NoBudget { device }) => {
            let why = format!("the {device} backend has no memory size");
            return Err(format!("--batch auto: give --budget ({why})").into());
        }
        n => n?,
    };
    if n == 0 {
        let plan = MemoryPlan::with_feed(model, &one, &adam, backend, args.feed())?;
        let within = budget.map_or("the free device memory".into(), human_bytes);
        return Err(format!(
            "--batch auto: not even a batch of one fits {within}: a step of one example peaks \
             at {} (parameters and Adam's state included) and needs {} under the {} allocator",
            human_bytes(plan.peak.bytes),
            human_bytes(plan.min_budget()?),
            backend.allocator().strategy()
        )
        .into());
    }
    println!(
        "--batch auto: {n} fits {} (allocator {}){}",
        budget.map_or("the free device memory".into(), human_bytes),
        backend.allocator().strategy(),
        if n > examples && world > 1 {
            format!("; using {examples}, the training set's {set} over {world} ranks")
        } else if n > examples {
            format!("; using the training set's {examples}")
        } else {
            String::new()
        }
    );
    Ok(n.min(examples))
}

/// `--lr`: a finite number >= 0 that an f32 holds (1e300 would become infinity), as Adam takes.
pub fn learning_rate(s: &str) -> Result<f32, String> {
    let v: f64 = s.parse().map_err(|e| format!("expected a number ({e})"))?;
    match v as f32 {
        _ if !(v.is_finite() && v >= 0.0) => Err("Adam's learning rate: finite and >= 0".into()),
        lr if lr.is_finite() => Ok(lr),
        _ => Err(format!(
            "{s} is beyond f32's range (at most {:e})",
            f32::MAX
        )),
    }
}

/// `--plot`: a file name ending in `.svg` (any case), the format it writes; another extension
/// would hold SVG under a name that says otherwise.
pub fn svg_path(s: &str) -> Result<std::path::PathBuf, String> {
    let path = std::path::PathBuf::from(s);
    match path.extension().and_then(|e| e.to_str()) {
        Some(e) if e.eq_ignore_ascii_case("svg") => Ok(path),
        _ => Err("the plot is written as SVG: give a file name ending in .svg".into()),
    }
}

/// `--device`: `auto` or a device name ([`Device`]'s), kept as written.
pub fn device_flag(s: &str) -> Result<String, String> {
    match s {
        "auto" => Ok(s.into()),
        _ => s
            .parse::<Device>()
            .map(|_| s.into())
            .map_err(|_| "expected auto, cpu, cuda or cuda:N".to_string()),
    }
}

/// `--conv-apis`: the word parsed, or clap's error with the accepted words (once).
pub fn conv_apis(s: &str) -> Result<ConvApis, &'static str> {
    s.parse().map_err(|_| "expected legacy, graph or both")
}

/// `--direct-convs`: the word parsed, or clap's error with the accepted words (once).
pub fn direct_convs(s: &str) -> Result<DirectConvs, &'static str> {
    s.parse().map_err(|_| "expected winning, all or off")
}

/// `--fp32-convs`: the word parsed, or clap's error with the accepted words (once).
pub fn fp32_convs(s: &str) -> Result<Fp32Convs, &'static str> {
    s.parse()
        .map_err(|_| "expected fastest, fma, 3xtf32 or 3xtf32-stacked")
}

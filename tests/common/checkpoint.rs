//! Checkpoint helpers: the tiny model of JAX's fixture, scratch directories, archive surgery
//! for bad-input tests, the straight-versus-resumed run, and the example binary.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use stax::train::data::{Loader, fashion_mnist_2class};
use stax::train::{CheckpointProblem, TrainError, Trainer};
use stax::{Adam, Backend, Conv, Dense, Flatten, Relu, Serial, Shape, Tensor, serial};

use super::{host_values, small_model};

/// `tests/data/jax_tiny.npz`'s model: `scripts/jax_checkpoint.py`'s `tiny()`.
pub fn tiny() -> Serial {
    serial![
        Conv::same(4, (3, 3)),
        Relu,
        Flatten,
        Dense(8),
        Relu,
        Dense(2)
    ]
}

/// The fixture's batch shape.
pub const TINY_INPUT: [usize; 4] = [4, 6, 6, 3];

/// The fixture's Adam learning rate.
pub const TINY_LR: f32 = 1e-2;

/// `rel` under the repository root: where this test was built, else (a GPU bundle run from
/// the package folder, as `run.sh` runs it) relative to the current directory.
pub fn repo_file(rel: &str) -> PathBuf {
    let built = Path::new(env!("CARGO_MANIFEST_DIR")).join(rel);
    if built.exists() {
        built
    } else {
        PathBuf::from(rel)
    }
}

/// The JAX fixture (see `scripts/jax_checkpoint.py fixture`).
pub fn fixture() -> PathBuf {
    repo_file("tests/data/jax_tiny.npz")
}

/// The f32 array `name` of the `.npz` at `path`.
pub fn npz_f32(path: &Path, name: &str) -> Vec<f32> {
    let mut z = npyz::npz::NpzArchive::open(path).expect("open npz");
    let array = z.by_name(name).expect("read npz").expect("member");
    array.into_vec().expect("f32 data")
}

/// The batch of the fixture at `path` (`batch/x`, `batch/y`), placed on `be`.
pub fn fixture_batch(be: &Arc<dyn Backend>, path: &Path) -> (Tensor, Tensor) {
    let x = npz_f32(path, "batch/x");
    let y = npz_f32(path, "batch/y");
    let n = TINY_INPUT[0];
    let x = Tensor::from_slice(be, &x, TINY_INPUT, stax::Category::Input).unwrap();
    let y = Tensor::from_slice(be, &y, [n, 2], stax::Category::Input).unwrap();
    (x, y)
}

/// A fresh, empty directory for one test, removed when dropped.
pub struct Scratch(PathBuf);

impl std::ops::Deref for Scratch {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A fresh, empty directory for `test`.
pub fn scratch(test: &str) -> Scratch {
    let dir = std::env::temp_dir().join(format!("stax-ckpt-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch directory");
    Scratch(dir)
}

/// Copies the `.npz` at `src` to `dst` entry by entry, each `.npy` file's bytes through
/// `edit(array name, bytes)`: `None` drops the entry.
pub fn rewrite(src: &Path, dst: &Path, mut edit: impl FnMut(&str, Vec<u8>) -> Option<Vec<u8>>) {
    use npyz::zip::{ZipArchive, ZipWriter, write::FileOptions};
    use std::io::{Read, Write};
    let mut zin = ZipArchive::new(std::fs::File::open(src).unwrap()).unwrap();
    let mut out = ZipWriter::new(std::fs::File::create(dst).unwrap());
    let stored = FileOptions::default().compression_method(npyz::zip::CompressionMethod::Stored);
    for i in 0..zin.len() {
        let mut f = zin.by_index(i).unwrap();
        let name = f.name().trim_end_matches(".npy").to_owned();
        let mut bytes = Vec::new();
        f.read_to_end(&mut bytes).unwrap();
        if let Some(b) = edit(&name, bytes) {
            out.start_file(format!("{name}.npy"), stored).unwrap();
            out.write_all(&b).unwrap();
        }
    }
    out.finish().unwrap();
}

/// `src` written to `dst` with member `member`'s `.npy` bytes replaced by `with`.
pub fn replace(src: &Path, dst: &Path, member: &str, with: Vec<u8>) {
    rewrite(src, dst, |n, b| {
        Some(if n == member { with.clone() } else { b })
    });
}

/// A `.npy` file: an array of NumPy dtype `descr` and `shape` whose data bytes are `data`.
pub fn npy(descr: &str, shape: &[u64], data: &[u8]) -> Vec<u8> {
    use npyz::WriterBuilder;
    let mut out = Vec::new();
    let dtype = npyz::DType::Plain(descr.parse().unwrap());
    let w = npyz::WriteOptions::<u8>::new()
        .dtype(dtype)
        .shape(shape)
        .writer(&mut out)
        .write_header_only()
        .unwrap();
    std::io::Write::write_all(w, data).unwrap();
    out
}

/// The file, member and problem of a [`TrainError::Checkpoint`] (panics on another error).
pub fn problem(e: &TrainError) -> (&Path, Option<&str>, &CheckpointProblem) {
    match e {
        TrainError::Checkpoint {
            path,
            member,
            problem,
            ..
        } => (path, member.as_deref(), problem),
        other => panic!("expected a checkpoint error, got {other:?}"),
    }
}

fn bits(values: Vec<f32>) -> Vec<u32> {
    values.into_iter().map(f32::to_bits).collect()
}

/// Everything a trainer's future depends on, as bits: parameters, every state tensor, the
/// count and the step.
pub fn state_bits(t: &Trainer<Serial>) -> (Vec<u32>, Vec<u32>, u32, u64) {
    let params = bits(host_values(t.params().leaves()));
    let state = bits(host_values(t.state().tree.leaves()));
    (params, state, t.state().count, t.steps())
}

/// Trains `small_model` on `be` for `steps` batches straight, saving after `steps / 2`; then
/// loads that checkpoint into a fresh trainer on `be` and trains the rest from its data
/// position. Asserts that every loss, every parameter and state tensor, the count and the step
/// agree to the bit, and that both trainers then save byte-identical files.
pub fn assert_resume_is_exact(be: &Arc<dyn Backend>, dir: &Path, steps: usize) {
    let (train, _) = fashion_mnist_2class().unwrap();
    let loader = Loader::new(train.len(), 16, 3).unwrap();
    let input = Shape::new([16, 12, 12, 3]);
    let half = steps / 2;
    let path = dir.join("half.npz");
    let mut a = Trainer::new(small_model(), input.clone(), Adam::new(1e-2), be, 9).unwrap();
    let mut straight = Vec::new();
    for (i, ix) in loader
        .batches_from(loader.start())
        .unwrap()
        .take(steps)
        .enumerate()
    {
        let (x, y) = a.place_batch(&train, &ix).unwrap();
        straight.push(a.step(&x, &y).unwrap().loss.to_bits());
        if i + 1 == half {
            let at = loader.advance(loader.start(), half as u64);
            a.save(&path, Some(at)).unwrap();
        }
    }
    let (mut b, at) = Trainer::load(small_model(), input, Adam::new(1e-2), be, &path).unwrap();
    let at = at.expect("a data position");
    assert_eq!(at, loader.advance(loader.start(), half as u64));
    assert_eq!((b.steps(), b.state().count), (half as u64, half as u32));
    let mut resumed = straight[..half].to_vec();
    for ix in loader.batches_from(at).unwrap().take(steps - half) {
        let (x, y) = b.place_batch(&train, &ix).unwrap();
        resumed.push(b.step(&x, &y).unwrap().loss.to_bits());
    }
    assert_eq!(resumed, straight, "every loss, to the bit");
    assert_eq!(
        state_bits(&b),
        state_bits(&a),
        "parameters, mu, nu, count, step"
    );
    let end = loader.advance(loader.start(), steps as u64);
    a.save(&dir.join("a.npz"), Some(end)).unwrap();
    b.save(&dir.join("b.npz"), Some(end)).unwrap();
    let read = |f: &str| std::fs::read(dir.join(f)).unwrap();
    assert!(read("a.npz") == read("b.npz"), "the two checkpoints differ");
}

/// The `stax_cnn` example binary next to this test binary (`cargo test` builds examples), or
/// None after printing a skip notice.
pub fn example_binary() -> Option<PathBuf> {
    example_named("stax_cnn")
}

/// The example binary `name` next to this test binary, or None after printing a skip notice.
/// Under cargo (`CARGO` set, as `cargo test` sets it) the example is built first in this test
/// binary's profile and target folder, a no-op when it is current: `cargo test --test <name>`
/// alone builds no example, and would otherwise run a missing or stale one. A failed build
/// fails the test. In the GPU bundle (no cargo) the bundled example is taken as it is.
pub fn example_named(name: &str) -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let profile_dir = exe.parent()?.parent()?;
    let bin = profile_dir.join("examples").join(name);
    static BUILT: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    if let Some(cargo) = std::env::var_os("CARGO") {
        let mut built = BUILT
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if !built.iter().any(|b| b == name) {
            build_example(&cargo, name, profile_dir);
            built.push(name.to_string());
        }
    }
    if bin.is_file() {
        return Some(bin);
    }
    let test = std::thread::current().name().unwrap_or("?").to_string();
    let notice = format!(
        "{test}: skipped: no example binary at {} (run `cargo test`, which builds examples)",
        bin.display()
    );
    let _ = std::io::Write::write_all(&mut std::io::stderr(), (notice + "\n").as_bytes());
    None
}

/// `cargo build --example name` into the target folder above `profile_dir` (`target/debug` or
/// `target/release`, whose name gives the profile); panics with cargo's output if it fails.
fn build_example(cargo: &std::ffi::OsStr, name: &str, profile_dir: &Path) {
    let (Some(target), Some(profile)) = (profile_dir.parent(), profile_dir.file_name()) else {
        return;
    };
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "--quiet", "--example", name, "--target-dir"])
        .arg(target)
        .current_dir(env!("CARGO_MANIFEST_DIR"));
    if profile == "release" {
        cmd.arg("--release");
    }
    let out = cmd.output().expect("cargo runs");
    assert!(
        out.status.success(),
        "cargo build --example {name} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs the example in `dir` with `common` arguments: `steps` steps straight, then
/// `steps / 2`, then resumed from that checkpoint up to `steps`. Asserts that the step
/// numbers and losses of the two halves are the straight run's, to the bit, and that the
/// resumed run ends with a checkpoint byte-identical to the straight one's (`full.npz`).
pub fn assert_example_resumes(bin: &Path, dir: &Path, common: &[&str], steps: usize) {
    let run = |args: &[&str]| {
        let args: Vec<&str> = common.iter().chain(args).copied().collect();
        let (ok, out) = run_example(bin, dir, &args);
        assert!(ok, "stax_cnn {args:?} failed:\n{out}");
        out
    };
    let (all, half) = (steps.to_string(), (steps / 2).to_string());
    run(&[
        "--max-steps",
        &all,
        "--save",
        "full.npz",
        "--json",
        "full.jsonl",
    ]);
    run(&[
        "--max-steps",
        &half,
        "--save",
        "half.npz",
        "--json",
        "a.jsonl",
    ]);
    let resume = [
        "--resume", "half.npz", "--save", "res.npz", "--json", "b.jsonl",
    ];
    let out = run(&[&["--max-steps", &all][..], &resume].concat());
    assert!(
        out.contains(&format!("resumed: half.npz at step {half}")),
        "{out}"
    );
    let mut halves = json_losses(&dir.join("a.jsonl"));
    halves.extend(json_losses(&dir.join("b.jsonl")));
    assert_eq!(
        halves,
        json_losses(&dir.join("full.jsonl")),
        "steps and losses"
    );
    let read = |f: &str| std::fs::read(dir.join(f)).unwrap();
    let same = read("res.npz") == read("full.npz");
    assert!(same, "parameters, moments, step, data position");
}

/// Runs the example with `args` in `dir`; returns (success, stdout + stderr).
pub fn run_example(bin: &Path, dir: &Path, args: &[&str]) -> (bool, String) {
    let out = Command::new(bin)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", bin.display()));
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

/// The `loss` of every line of a `--json` file (its JSON number, as f64 bits) with its step.
pub fn json_losses(path: &Path) -> Vec<(u64, u64)> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            let loss = v["loss"].as_f64().unwrap();
            (v["step"].as_u64().unwrap(), loss.to_bits())
        })
        .collect()
}

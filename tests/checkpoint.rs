//! Checkpoints on the CPU: exact resume (in process and across processes), JAX's fixture and
//! JAX itself (where installed), NumPy's view of the members, the memory loading needs, and
//! every kind of bad input as a typed error naming the file and the member.

mod common;

use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use common::checkpoint::{
    TINY_INPUT, TINY_LR, assert_example_resumes, assert_resume_is_exact, example_binary, fixture,
    fixture_batch, npy, npz_f32, problem, replace, repo_file, rewrite, run_example, scratch,
    state_bits, tiny,
};
use common::{cpu, small_model};
use stax::layers::{Mixed, Policy};
use stax::train::data::DataPosition;
use stax::train::plan::MemoryPlan;
use stax::train::{Checkpoint, CheckpointProblem, TrainError, Trainer};
use stax::{Adam, Backend, Conv, Dense, Flatten, Layer, Relu, Serial, Shape, Tanh, serial};

/// Asserts that `e` is a checkpoint error about `member` whose problem matches `pattern`.
macro_rules! assert_problem {
    ($e:expr, $member:expr, $pattern:pat) => {{
        let e = &$e;
        let (_, member, p) = problem(e);
        assert_eq!(member, $member, "{e}");
        assert!(matches!(p, $pattern), "{e}");
    }};
}

fn tiny_input() -> Shape {
    Shape::new(TINY_INPUT)
}

/// Whether `python3 -c "import <module>"` works; prints a skip notice when not.
fn python_has(module: &str) -> bool {
    let ok = Command::new("python3")
        .args(["-c", &format!("import {module}")])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        let test = std::thread::current().name().unwrap_or("?").to_string();
        let notice = format!("{test}: skipped: python3 cannot import {module}\n");
        // straight to stderr: libtest captures `eprintln!`, and CI must show the skip
        let _ = std::io::Write::write_all(&mut std::io::stderr(), notice.as_bytes());
    }
    ok
}

/// Runs `scripts/jax_checkpoint.py` with `args` on JAX's CPU backend (on a GPU, JAX's default
/// matmul precision is TF32, 1e-5 away from f32); its stdout.
fn script(args: &[&str]) -> String {
    let script = repo_file("scripts/jax_checkpoint.py");
    let out = Command::new("python3")
        .arg(script)
        .args(args)
        .env("JAX_PLATFORMS", "cpu")
        .output()
        .expect("python3");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "jax_checkpoint.py {args:?}: {stderr}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The error loading the fixture with member `member` replaced by the `.npy` bytes `with`.
fn load_with(dir: &Path, member: &str, with: Vec<u8>) -> TrainError {
    let path = dir.join("edited.npz");
    replace(&fixture(), &path, member, with);
    Trainer::load(tiny(), tiny_input(), Adam::new(1e-2), &cpu(), &path).unwrap_err()
}

fn rel(a: f32, b: f32) -> f32 {
    (a - b).abs() / b.abs()
}

/// Loads the JAX checkpoint at `path` (made by `jax_checkpoint.py fixture`) and checks that
/// the loss of its batch is JAX's, and so is the loss after one more Adam step.
fn assert_gives_jax_loss(path: &Path) {
    let be = cpu();
    let (mut t, at) = Trainer::load(tiny(), tiny_input(), Adam::new(TINY_LR), &be, path)
        .expect("JAX's checkpoint loads");
    // JAX's file has no step or data members: the step is optax's count
    assert_eq!((t.steps(), t.state().count, at), (1, 1, None));
    let (x, y) = fixture_batch(&be, path);
    let jax_loss = npz_f32(path, "jax/loss")[0];
    let (loss, _) = t.eval_batch(&x, &y).unwrap();
    assert!(
        rel(loss, jax_loss) < 1e-6,
        "stax-rs {loss} vs JAX {jax_loss}"
    );
    // one more Adam step from the loaded moments and count is JAX's next step
    assert!(rel(t.step(&x, &y).unwrap().loss, jax_loss) < 1e-6);
    let next = npz_f32(path, "jax/loss_next")[0];
    let (after, _) = t.eval_batch(&x, &y).unwrap();
    assert!(
        rel(after, next) < 1e-5,
        "after a step: stax-rs {after} vs JAX {next}"
    );
}

#[test]
fn a_jax_checkpoint_loads_and_gives_jax_loss() {
    assert_gives_jax_loss(&fixture());
}

#[test]
fn jax_saves_with_the_documented_lines_a_checkpoint_that_loads_here() {
    if !python_has("jax") || !python_has("optax") {
        return;
    }
    let dir = scratch("jax-save");
    let path = dir.join("from_jax.npz");
    script(&["fixture", path.to_str().unwrap()]);
    assert_gives_jax_loss(&path);
}

#[test]
fn resume_is_bit_exact_in_a_fresh_trainer() {
    assert_resume_is_exact(&cpu(), &scratch("resume"), 6);
}

#[test]
fn the_example_resumes_bit_exactly_in_a_fresh_process() {
    let Some(bin) = example_binary() else { return };
    let dir = scratch("example");
    let common = ["--device", "cpu", "--img", "8", "--batch", "50"];
    assert_example_resumes(&bin, &dir, &common, 6);
    let run = |args: &[&str]| {
        let args: Vec<&str> = common.iter().chain(args).copied().collect();
        let (ok, out) = run_example(&bin, &dir, &args);
        assert!(ok, "stax_cnn {args:?} failed:\n{out}");
        out.lines()
            .find(|l| l.starts_with("test: "))
            .map(str::to_owned)
    };
    let eval = run(&["--eval-only", "--resume", "res.npz"]);
    assert!(
        eval.as_ref().is_some_and(|l| l.contains("accuracy")),
        "{eval:?}"
    );
    assert_eq!(eval, run(&["--eval-only", "--resume", "full.npz"]));
    // --init-from takes the parameters alone: the same test figures, a fresh optimizer
    assert_eq!(eval, run(&["--eval-only", "--init-from", "res.npz"]));
    run(&[
        "--max-steps",
        "1",
        "--init-from",
        "res.npz",
        "--save",
        "fresh.npz",
    ]);
    let mut c = Checkpoint::open(&dir.join("fresh.npz")).unwrap();
    assert_eq!(c.step().unwrap(), Some(1));
}

#[test]
fn a_save_killed_or_failing_midway_leaves_the_last_checkpoint() {
    let Some(bin) = example_binary() else { return };
    let dir = scratch("killed");
    let args = "--device cpu --img 8 --batch 50 --max-steps 2 --save ck.npz";
    let (ok, out) = run_example(&bin, &dir, &args.split(' ').collect::<Vec<_>>());
    assert!(ok, "{out}");
    let good = std::fs::read(dir.join("ck.npz")).unwrap();
    assert!(good.len() > 1 << 20, "the checkpoint is over a MiB");
    // The next run resumes and saves under a 256 KiB file size limit: the first save is
    // killed by SIGXFSZ mid-write; with the signal ignored, the write fails with EFBIG.
    let resume = format!(
        "{} --device cpu --img 8 --batch 50 --max-steps 4 --resume ck.npz --save ck.npz",
        bin.display()
    );
    for (trap, killed) in [("", true), ("trap '' XFSZ; ", false)] {
        let out = Command::new("bash")
            .args(["-c", &format!("{trap}ulimit -f 256; exec {resume}")])
            .current_dir(&*dir)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "the save should fail: {stderr}");
        assert_eq!(
            out.status.code().is_none(),
            killed,
            "{:?}: {stderr}",
            out.status
        );
        if !killed {
            assert!(
                stderr.contains("save_checkpoint: ck.npz member `params/"),
                "{stderr}"
            );
            assert!(
                stderr.contains("the previous file at this path is unchanged"),
                "{stderr}"
            );
        }
        assert!(
            std::fs::read(dir.join("ck.npz")).unwrap() == good,
            "the last checkpoint changed"
        );
        let (t, _) = Trainer::load(
            stax::models::seed_cnn(2),
            Shape::new([50, 8, 8, 3]),
            Adam::new(1e-3),
            &cpu(),
            &dir.join("ck.npz"),
        )
        .unwrap();
        assert_eq!(t.steps(), 2);
    }
}

#[test]
fn numpy_lists_the_documented_members() {
    if !python_has("numpy") {
        return;
    }
    let be = cpu();
    let dir = scratch("numpy");
    let t = Trainer::new(tiny(), tiny_input(), Adam::new(TINY_LR), &be, 0).unwrap();
    let at = DataPosition {
        seed: 5,
        epoch: 2,
        index: 8,
    };
    let path = dir.join("ck.npz");
    t.save(&path, Some(at)).unwrap();
    let listed: serde_json::Value =
        serde_json::from_str(&script(&["list", path.to_str().unwrap()])).unwrap();
    let meta_len = Checkpoint::open(&path).unwrap();
    let json = serde_json::to_vec(meta_len.meta().unwrap()).unwrap().len();
    let mut want = vec![("stax.json".to_string(), vec![], format!("|S{json}"))];
    let shapes: [(&str, Vec<u64>); 6] = [
        ("[0][0]", vec![3, 3, 3, 4]),
        ("[0][1]", vec![1, 1, 1, 4]),
        ("[3][0]", vec![144, 8]),
        ("[3][1]", vec![8]),
        ("[5][0]", vec![8, 2]),
        ("[5][1]", vec![2]),
    ];
    let f32s = |prefix: &str| -> Vec<(String, Vec<u64>, String)> {
        let f32 = |(k, s): &(&str, Vec<u64>)| (format!("{prefix}{k}"), s.clone(), "<f4".into());
        shapes.iter().map(f32).collect()
    };
    want.extend(f32s("params/"));
    want.push(("opt/[0].count".into(), vec![], "<i4".into()));
    want.extend(f32s("opt/[0].mu"));
    want.extend(f32s("opt/[0].nu"));
    for (name, dtype) in [
        ("step", "<i8"),
        ("seed", "<u8"),
        ("data/seed", "<u8"),
        ("data/epoch", "<u8"),
        ("data/index", "<u8"),
    ] {
        want.push((name.into(), vec![], dtype.into()));
    }
    let got: Vec<(String, Vec<u64>, String)> = serde_json::from_value(listed).unwrap();
    assert_eq!(got, want);
}

#[test]
fn jax_applies_a_checkpoint_written_here() {
    if !python_has("jax") || !python_has("optax") {
        return;
    }
    let be = cpu();
    let dir = scratch("jax");
    let (x, y) = fixture_batch(&be, &fixture());
    let mut t = Trainer::new(tiny(), tiny_input(), Adam::new(TINY_LR), &be, 4).unwrap();
    for _ in 0..3 {
        t.step(&x, &y).unwrap();
    }
    let path = dir.join("ck.npz");
    t.save(&path, None).unwrap();
    let (ckpt, batch) = (path.to_str().unwrap(), fixture());
    let out = script(&["apply", ckpt, batch.to_str().unwrap()]);
    let got: serde_json::Value = serde_json::from_str(&out).unwrap();
    let (loss, _) = t.eval_batch(&x, &y).unwrap();
    t.step(&x, &y).unwrap();
    let (next, _) = t.eval_batch(&x, &y).unwrap();
    let jax = |k: &str| got[k].as_f64().unwrap() as f32;
    assert!(
        rel(jax("loss"), loss) < 1e-6,
        "JAX {} vs stax-rs {loss}",
        jax("loss")
    );
    assert!(
        rel(jax("loss_next"), next) < 1e-5,
        "JAX {} vs {next}",
        jax("loss_next")
    );
    assert_eq!(got["count"], 4);
}

#[test]
fn loading_stages_one_array_at_a_time_as_planned() {
    let be = cpu();
    let dir = scratch("memory");
    let input = Shape::new([8, 12, 12, 3]);
    let t = Trainer::new(small_model(), input.clone(), Adam::new(1e-3), &be, 1).unwrap();
    let path = dir.join("ck.npz");
    t.save(&path, None).unwrap();
    let plan = MemoryPlan::new(&small_model(), &input, &Adam::new(1e-3), &be).unwrap();
    let largest = t
        .params()
        .leaves()
        .iter()
        .map(|p| p.bytes() as u64)
        .max()
        .unwrap();
    assert_eq!(plan.checkpoint_host_bytes(), largest);
    let saved = t.memory_report().unwrap();
    assert_eq!(
        saved.host.pageable.reserved, 0,
        "the staging buffer went back"
    );
    assert_eq!(
        saved.host.pageable.peak, largest,
        "saving stages one array at a time"
    );
    let fresh = cpu();
    let (loaded, _) = Trainer::load(small_model(), input, Adam::new(1e-3), &fresh, &path).unwrap();
    let report = loaded.memory_report().unwrap();
    assert_eq!(
        report.host.pageable.peak, largest,
        "loading stages one array at a time"
    );
    assert_eq!(report.host.pageable.live, 0);
    assert_eq!(
        report.host.pageable.reserved, 0,
        "the staging buffer went back"
    );
    // on the device: the parameters and both moments, nothing else
    assert_eq!(report.peak, plan.state_bytes());
    assert_eq!(report.live, plan.state_bytes());
    assert_eq!(state_bits(&loaded), state_bits(&t));
}

#[test]
fn another_model_is_refused_naming_the_first_member_that_differs() {
    let be = cpu();
    let wider = serial![
        Conv::same(4, (3, 3)),
        Relu,
        Flatten,
        Dense(16),
        Relu,
        Dense(2)
    ];
    let path = fixture();
    let e = Trainer::load(wider, tiny_input(), Adam::new(1e-2), &be, &path).unwrap_err();
    let (file, member, p) = problem(&e);
    assert_eq!((file, member), (path.as_path(), Some("params/[3][0]")));
    assert!(
        matches!(p, CheckpointProblem::Shape { expected, found } if expected == &[144, 16] && found == &[144, 8]),
        "{p}"
    );
    assert!(
        e.to_string()
            .contains("has shape [144, 8], expected [144, 16]"),
        "{e}"
    );
    // the same shapes in another model: stax.json says so
    let dir = scratch("model");
    let mine = dir.join("ck.npz");
    Trainer::new(tiny(), tiny_input(), Adam::new(1e-2), &be, 0)
        .unwrap()
        .save(&mine, None)
        .unwrap();
    let tanh = serial![
        Conv::same(4, (3, 3)),
        Tanh,
        Flatten,
        Dense(8),
        Relu,
        Dense(2)
    ];
    let e = Trainer::load(tanh, tiny_input(), Adam::new(1e-2), &be, &mine).unwrap_err();
    assert_problem!(e, Some("stax.json"), CheckpointProblem::Model { .. });
    // a layer under its own policy: what follows it is compared too, its policy is not
    let bf16 = |act: Box<dyn Layer>, policy| {
        let conv = Mixed::new(Conv::same(4, (3, 3)), policy);
        Serial(vec![
            Box::new(conv),
            act,
            Box::new(Flatten),
            Box::new(Dense(2)),
        ])
    };
    let mixed = dir.join("mixed.npz");
    let t = Trainer::new(
        bf16(Box::new(Relu), Policy::BF16),
        tiny_input(),
        Adam::new(1e-2),
        &be,
        0,
    );
    t.unwrap().save(&mixed, None).unwrap();
    let other = bf16(Box::new(Tanh), Policy::BF16);
    let e = Trainer::load(other, tiny_input(), Adam::new(1e-2), &be, &mixed).unwrap_err();
    assert_problem!(e, Some("stax.json"), CheckpointProblem::Model { .. });
    let f32 = bf16(Box::new(Relu), Policy::default());
    Trainer::load(f32, tiny_input(), Adam::new(1e-2), &be, &mixed).unwrap();
    // a model with fewer parameters: the checkpoint's extra ones are not part of it
    let shorter = serial![Conv::same(4, (3, 3)), Relu, Flatten, Dense(8)];
    let e = Checkpoint::open(&path)
        .unwrap()
        .params(&shorter, &tiny_input(), &be)
        .unwrap_err();
    assert_problem!(e, Some("params/[5][0]"), CheckpointProblem::Unexpected);
}

#[test]
fn missing_members_and_wrong_dtypes_are_named() {
    let be = cpu();
    let dir = scratch("members");
    let load = |p: &Path| Trainer::load(tiny(), tiny_input(), Adam::new(1e-2), &be, p);
    let cut = dir.join("cut.npz");
    rewrite(&fixture(), &cut, |n, b| {
        (n != "opt/[0].nu[3][1]").then_some(b)
    });
    let e = load(&cut).unwrap_err();
    assert_problem!(e, Some("opt/[0].nu[3][1]"), CheckpointProblem::Missing);
    let e = load_with(&dir, "params/[5][0]", npy("<f8", &[8, 2], &[0u8; 128]));
    assert_problem!(e, Some("params/[5][0]"), CheckpointProblem::DType { .. });
    assert!(
        e.to_string()
            .contains("has dtype <f8, expected <f4 (float32)"),
        "{e}"
    );
    let e = load_with(
        &dir,
        "opt/[0].count",
        npy("<i4", &[], &(-3i32).to_le_bytes()),
    );
    assert_problem!(e, Some("opt/[0].count"), CheckpointProblem::Value { .. });
    // big-endian f32 (NumPy's `>f4`) is read as the same values
    let swapped = dir.join("big.npz");
    let values = npz_f32(&fixture(), "params/[5][1]");
    let be_bytes: Vec<u8> = values.iter().flat_map(|x| x.to_be_bytes()).collect();
    replace(
        &fixture(),
        &swapped,
        "params/[5][1]",
        npy(">f4", &[2], &be_bytes),
    );
    let (a, _) = load(&swapped).unwrap();
    let (b, _) = load(&fixture()).unwrap();
    assert_eq!(state_bits(&a), state_bits(&b));
}

#[test]
fn truncated_and_damaged_files_are_typed_errors() {
    let be = cpu();
    let dir = scratch("damaged");
    // a directory is named as one (the zip reader alone said "Invalid argument")
    let e = Checkpoint::open(&dir).map(drop).unwrap_err();
    assert!(
        matches!(&e, TrainError::Io { path, .. } if path == &*dir)
            && e.to_string().contains("a directory"),
        "{e}"
    );
    let bytes = std::fs::read(fixture()).unwrap();
    let open = |p: &Path| -> Result<(), TrainError> {
        let mut c = Checkpoint::open(p)?;
        let params = c.params(&tiny(), &tiny_input(), &be)?;
        c.opt_state(&Adam::new(1e-2), &params).map(drop)
    };
    for len in [
        0,
        10,
        200,
        bytes.len() / 3,
        bytes.len() / 2,
        bytes.len() - 30,
        bytes.len() - 1,
    ] {
        let p = dir.join(format!("cut{len}.npz"));
        std::fs::write(&p, &bytes[..len]).unwrap();
        let e = open(&p).unwrap_err();
        let (file, member, problem) = problem(&e);
        assert_eq!(file, p, "{e}");
        assert!(
            matches!(problem, CheckpointProblem::NotAnArchive { .. }),
            "{len}: {e}"
        );
        if (1000..bytes.len() - 1000).contains(&len) {
            // cut inside an array: the message names it
            assert!(
                member.is_some_and(|m| m.starts_with("params/") || m.starts_with("opt/")),
                "{len}: {e}"
            );
            assert!(
                e.to_string().contains("the file ends inside this member"),
                "{e}"
            );
        }
    }
    // a flipped byte inside an array: its checksum fails, naming it
    let names = Checkpoint::open(&fixture()).unwrap().members().to_vec();
    let name = b"params/[3][0].npy";
    // past the local header's name, any extra field (under 100 bytes) and the 128-byte .npy header
    let at = bytes.windows(name.len()).position(|w| w == name).unwrap() + name.len() + 228;
    let mut flipped = bytes.clone();
    flipped[at] ^= 0x40;
    let p = dir.join("flipped.npz");
    std::fs::write(&p, &flipped).unwrap();
    let e = open(&p).unwrap_err();
    assert_problem!(e, Some("params/[3][0]"), CheckpointProblem::Corrupt { .. });
    assert!(e.to_string().contains("checksum"), "{e}");
    // a member whose data is shorter than its shape
    let e = load_with(&dir, "opt/[0].mu[3][0]", npy("<f4", &[144, 8], &[0u8; 64]));
    assert_problem!(
        e,
        Some("opt/[0].mu[3][0]"),
        CheckpointProblem::Corrupt { .. }
    );
    assert!(e.to_string().contains("the data ends before"), "{e}");
    assert!(names.len() > 19);
    // not a file at all, and a directory that does not exist for a save
    let missing = dir.join("none.npz");
    assert!(matches!(open(&missing).unwrap_err(), TrainError::Io { .. }));
    let t = Trainer::new(tiny(), tiny_input(), Adam::new(1e-2), &be, 0).unwrap();
    let e = t.save(&dir.join("no/such/dir/ck.npz"), None).unwrap_err();
    assert!(e.to_string().contains("no/such/dir/ck.npz"), "{e}");
}

#[test]
fn given_parameters_are_checked() {
    let (be, other) = (cpu(), cpu());
    let loaded = |be: &Arc<dyn Backend>| {
        let mut c = Checkpoint::open(&fixture()).unwrap();
        let params = c.params(&tiny(), &tiny_input(), be).unwrap();
        let state = c.opt_state(&Adam::new(1e-2), &params).unwrap();
        (params, state)
    };
    let given = |model, params| {
        let opt = Adam::new(1e-2);
        Trainer::from_params(model, tiny_input(), opt, &be, params, None).map(|t| t.steps())
    };
    let (params, state) = loaded(&be);
    // the same tree for another model: the first parameter that differs is named
    let nine = serial![
        Conv::same(4, (3, 3)),
        Relu,
        Flatten,
        Dense(9),
        Relu,
        Dense(2)
    ];
    let e = given(nine, params.clone()).unwrap_err();
    assert!(
        e.to_string()
            .contains("3.dense/w is f32 [144, 8], expected f32 [144, 9]"),
        "{e}"
    );
    // handles still held elsewhere cannot be trained in place
    let e = given(tiny(), params.clone()).unwrap_err().to_string();
    assert!(e.contains("0.conv/w") && e.contains("shared"), "{e}");
    // parameters of another backend
    let e = given(tiny(), loaded(&other).0).unwrap_err();
    assert!(e.to_string().contains("two backends"), "{e}");
    // a state for other parameters
    let opt = Adam::new(1e-2);
    let e = Trainer::from_params(
        tiny(),
        tiny_input(),
        opt,
        &be,
        loaded(&be).0,
        Some(loaded(&other).1),
    );
    assert!(e.unwrap_err().to_string().contains("two backends"));
    assert_eq!(given(tiny(), params).unwrap(), 0, "a fresh state: step 0");
    let (params, _) = loaded(&be);
    let t = Trainer::from_params(tiny(), tiny_input(), opt, &be, params, Some(state)).unwrap();
    assert_eq!(t.steps(), 1, "the step of a given state is its count");
}

/// A checkpoint saved in f32 resumes under the bf16 policy and back (the parameters are f32
/// masters under every policy; only the description's " under {policy}" differs): the loaded
/// parameters are the saved ones, bit for bit.
#[test]
fn a_checkpoint_resumes_under_another_compute_policy() {
    use stax::layers::{Mixed, Policy};
    let be = cpu();
    let dir = scratch("policy");
    let (f32_path, bf16_path) = (dir.join("f32.npz"), dir.join("bf16.npz"));
    let t = Trainer::new(tiny(), tiny_input(), Adam::new(1e-2), &be, 3).unwrap();
    t.save(&f32_path, None).unwrap();
    let bf16 = || Mixed::new(tiny(), Policy::BF16);
    let (loaded, _) = Trainer::load(bf16(), tiny_input(), Adam::new(1e-2), &be, &f32_path).unwrap();
    let bits = |ts: Vec<&stax::Tensor>| -> Vec<u32> {
        ts.iter()
            .flat_map(|t| t.to_vec().unwrap())
            .map(f32::to_bits)
            .collect()
    };
    assert_eq!(bits(loaded.params().leaves()), bits(t.params().leaves()));
    loaded.save(&bf16_path, None).unwrap();
    let (back, _) = Trainer::load(tiny(), tiny_input(), Adam::new(1e-2), &be, &bf16_path).unwrap();
    assert_eq!(bits(back.params().leaves()), bits(t.params().leaves()));
}

/// A saved step below the optimizer's count is refused naming `step`; one above it (the steps
/// an f16 loss scale skipped) is the resumed trainer's step.
#[test]
fn a_step_below_the_optimizers_count_is_refused() {
    let be = cpu();
    let dir = scratch("step-count");
    let load = |p: &Path| Trainer::load(tiny(), tiny_input(), Adam::new(1e-2), &be, p);
    let (mut t, _) = load(&fixture()).unwrap();
    let (x, y) = fixture_batch(&be, &fixture());
    t.step(&x, &y).unwrap();
    let saved = dir.join("saved.npz");
    t.save(&saved, None).unwrap();
    let count = t.steps();
    assert!(count >= 1);
    let edited = dir.join("edited.npz");
    let step = |s: i64| npy("<i8", &[], &s.to_le_bytes());
    replace(&saved, &edited, "step", step(count as i64 - 1));
    let e = load(&edited).unwrap_err();
    assert_problem!(e, Some("step"), CheckpointProblem::Value { .. });
    let expected = format!("step {} is below opt/[0].count {count}", count - 1);
    assert!(e.to_string().contains(&expected), "{e}");
    replace(&saved, &edited, "step", step(count as i64 + 2));
    let (resumed, _) = load(&edited).unwrap();
    assert_eq!(resumed.steps(), count + 2);
    let (same, _) = load(&saved).unwrap();
    assert_eq!(same.steps(), count);
}

/// A model with Dropout resumes to the bit: the checkpoint keeps the trainer's seed (each
/// step's masks are drawn from `fold_in(seed, step)`), whether or not a data position of
/// another seed is saved with it.
#[test]
fn a_dropout_model_resumes_with_its_masks() {
    let be = cpu();
    let dir = scratch("dropout");
    let model = || serial![Flatten, Dense(16), Relu, stax::Dropout::new(0.5), Dense(2)];
    let (x, y) = fixture_batch(&be, &repo_file("tests/data/jax_tiny.npz"));
    let other_seed = DataPosition {
        seed: 7,
        epoch: 0,
        index: 4,
    };
    for data in [None, Some(other_seed)] {
        let mut a = Trainer::new(model(), tiny_input(), Adam::new(TINY_LR), &be, 5).unwrap();
        a.step(&x, &y).unwrap();
        let path = dir.join("ck.npz");
        a.save(&path, data).unwrap();
        let (mut b, _) =
            Trainer::load(model(), tiny_input(), Adam::new(TINY_LR), &be, &path).unwrap();
        for _ in 0..3 {
            let (la, lb) = (a.step(&x, &y).unwrap().loss, b.step(&x, &y).unwrap().loss);
            assert_eq!(la.to_bits(), lb.to_bits(), "{data:?}: {la} vs {lb}");
        }
        assert_eq!(state_bits(&b), state_bits(&a), "{data:?}");
    }
}

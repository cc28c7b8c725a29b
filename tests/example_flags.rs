//! What the examples tell a user: flags their model or data cannot take are refused before
//! anything is planned, naming the flag and what would work (a `--classes` below the data's
//! class count, an `--img` the model's shapes refuse, `--img 0`, `--batch 0`, a batch larger
//! than the data (before the set-up reserves it), a ResNet of empty stages, a budget no batch
//! fits, an unknown `--conv-apis` or `--fp32-convs`, `--gpus` with `--device cpu`, `--batch
//! -5`, `--epochs -1`, an `--lr` below 0 or beyond f32's range, two output flags naming one
//! file (spelled two ways), an output over an input's file, `--plan` or `--eval-only` with a
//! flag it would ignore, a rank's renamed output over an input, a fraction of a byte, more
//! classes or ranks than there can be, more ranks than the data or the host's memory holds
//! (refused before any starts), a `--save` path that is a pipe, bfc on the CPU without a
//! budget, a missing `--data` file, a `--bucket` that is no size, a `--plot` file that is no
//! .svg), the flags that need no
//! backend before one opens; CUDA-only flags on the CPU are named as ignored; a resumed run
//! says what it continued; a set-up out-of-memory names the batch `--batch auto` would pick.

mod common;

use common::checkpoint::{example_binary, example_named, run_example};

/// One training step of the seed model on the CPU at 8x8, batch 50.
const TINY_RUN: [&str; 8] = [
    "--device",
    "cpu",
    "--img",
    "8",
    "--batch",
    "50",
    "--max-steps",
    "1",
];

#[test]
fn a_flag_the_model_or_data_cannot_take_names_itself_and_what_works() {
    let (Some(cnn), Some(resnet)) = (example_binary(), example_named("resnet50")) else {
        return;
    };
    let cpu = ["--device", "cpu", "--max-steps", "1"];
    let cases: [(&std::path::Path, &[&str], &str); 36] = [
        (
            &cnn,
            &["--classes", "1"],
            "--classes 1: the data has 2 classes (labels 0 to 1); give at least 2",
        ),
        (
            &resnet,
            &["--img", "4"],
            "--img 4: the model cannot take 4x4 images (the smallest --img it takes is 5)",
        ),
        (
            &resnet,
            &["--classes", "0"],
            "--classes 0: the data has 2 classes",
        ),
        (
            &cnn,
            &["--img", "0"],
            "--img 0: the image size must be at least 1",
        ),
        (&cnn, &["--batch", "0"], "--batch"),
        (
            &cnn,
            &["--batch", "-5"],
            "--batch \"-5\": expected a positive whole number or auto",
        ),
        (
            &cnn,
            &["--lr", "1e300"],
            "invalid value '1e300' for '--lr <LR>': 1e300 is beyond f32's range",
        ),
        (
            &cnn,
            &["--batch", "2001"],
            "--batch 2001: loader: batch size 2001 is larger",
        ),
        (
            // refused before the set-up reserves the step (which 100 MB could not hold)
            &cnn,
            &["--batch", "3000", "--budget", "100MB"],
            "--batch 3000: loader: batch size 3000 is larger",
        ),
        (
            &cnn,
            &["--batch", "auto", "--budget", "30MB"],
            "--batch auto: not even a batch of one fits 30.00 MB (30,000,000 bytes): a step of \
             one example peaks at",
        ),
        (
            &cnn,
            &["--conv-apis", "fastest"],
            "invalid value 'fastest' for '--conv-apis <CONV_APIS>': expected legacy, graph or both",
        ),
        (
            &cnn,
            &["--fp32-convs", "tf32"],
            "invalid value 'tf32' for '--fp32-convs <FP32_CONVS>': expected fastest, fma, 3xtf32 or 3xtf32-stacked",
        ),
        (
            &cnn,
            &["--lr", "-1"],
            "invalid value '-1' for '--lr <LR>': Adam's learning rate: finite and >= 0",
        ),
        (
            &cnn,
            &["--epochs", "-1"],
            "invalid value '-1' for '--epochs <EPOCHS>'",
        ),
        (
            // two spellings of one file
            &cnn,
            &["--json", "./same.out", "--trace", "same.out"],
            "same.out: one would be lost",
        ),
        (
            &cnn,
            &["--init-from", "ck.npz", "--record-trace", "ck.npz"],
            "--record-trace would overwrite",
        ),
        (
            &cnn,
            &["--plan", "--init-from", "missing.npz"],
            "the argument '--plan' cannot be used with '--init-from <INIT_FROM>'",
        ),
        (
            &cnn,
            &["--eval-only", "--init-from", "ck.npz", "--save", "e.npz"],
            // --max-steps (given to every case) trains too: the first conflict clap names
            "the argument '--max-steps <MAX_STEPS>' cannot be used with '--eval-only'",
        ),
        (
            &cnn,
            &["--budget", "1.5"],
            "--budget \"1.5\": expected bytes",
        ),
        (
            &cnn,
            &["--classes", "65537"],
            "--classes 65537: at most 65536 classes",
        ),
        (
            &cnn,
            &["--ranks", "70000"],
            "--ranks 70000: at most 65535 ranks",
        ),
        (
            // rank 1 writes ck.rank1.npz: refused by the launcher, before any rank starts
            &cnn,
            &[
                "--ranks",
                "2",
                "--init-from",
                "ck.rank1.npz",
                "--json",
                "ck.npz",
            ],
            "ck.rank1.npz, the file --init-from reads",
        ),
        (
            // refused by the launcher: 3 ranks of 1000 are more than the 2000 examples
            &cnn,
            &["--ranks", "3", "--batch", "1000"],
            "--batch 1000 on 3 ranks: ",
        ),
        (
            // refused by the launcher: 500 CPU ranks of this host, each with the seed's 3.9 GB
            // of parameters and Adam moments, are more than any host has
            &cnn,
            &["--ranks", "500", "--batch", "4", "--img", "200"],
            "on each of 500 ranks, ",
        ),
        (
            // a budget caps one process, not the ranks' sum
            &cnn,
            &[
                "--ranks", "500", "--batch", "4", "--img", "200", "--budget", "5GB",
            ],
            "on each of 500 ranks, ",
        ),
        (
            // refused by the launcher: a rank's plan cannot fit the budget
            &cnn,
            &["--ranks", "2", "--batch", "10", "--budget", "10MB"],
            "--budget 10.00 MB (10,000,000 bytes): a rank's step needs at least ",
        ),
        (
            &cnn,
            &["--plan", "--ranks", "2"],
            "the argument '--plan' cannot be used with '--ranks <RANKS>'",
        ),
        (
            &cnn,
            &["--data", "missing.npz", "--test-data", "missing.npz"],
            "--data missing.npz: ",
        ),
        (
            &cnn,
            &["--bucket", "bogus"],
            "invalid value 'bogus' for '--bucket <BUCKET>': expected bytes, or a number with KiB",
        ),
        (
            &cnn,
            &["--plot", "memory.png"],
            "invalid value 'memory.png' for '--plot <FILE.svg>': the plot is written as SVG: give \
             a file name ending in .svg",
        ),
        (
            &cnn,
            &["--budget", "1KB"],
            "before any step, more than the backend has",
        ),
        (
            &cnn,
            &["--allocator", "bfc"],
            "the bfc allocator on the CPU needs --budget",
        ),
        (
            &cnn,
            &["--plan", "--resume", "ck.npz"],
            "the argument '--plan' cannot be used with '--resume <RESUME>'",
        ),
        (
            &cnn,
            &["--plan", "--profile"],
            "the argument '--plan' cannot be used with '--profile'",
        ),
        (
            &cnn,
            &["--gpus", "2"],
            "--gpus runs its ranks on cuda, but --device cpu was given",
        ),
        (
            &resnet,
            &["--blocks", "0,0,0,0"],
            "got blocks [0, 0, 0, 0], widths [64, 128, 256, 512], 2 classes",
        ),
    ];
    let dir = std::env::temp_dir();
    for (bin, flags, want) in cases {
        let args: Vec<&str> = cpu.iter().chain(flags).copied().collect();
        let (ok, out) = run_example(bin, &dir, &args);
        assert!(!ok, "{args:?} should fail:\n{out}");
        assert!(out.contains(want), "{args:?}: expected {want:?} in:\n{out}");
        assert!(!out.contains("panicked"), "{args:?} panicked:\n{out}");
        // every refusal comes before a launcher starts any rank
        assert!(!out.contains("launching"), "{args:?} started ranks:\n{out}");
        // the parameters alone not fitting is not the batch's fault
        let init_oom = want.contains("before any step");
        let hint = "(here: lower --img, or raise --budget;";
        assert_eq!(out.contains(hint), init_oom, "{args:?}:\n{out}");
    }
}

/// A `--save` path that exists and is not a regular file (here a named pipe; `/dev/full` alike)
/// is refused before training, and the pipe is left as it was: a checkpoint is renamed over its
/// path, which would have replaced the pipe.
#[test]
fn a_save_path_that_is_no_regular_file_is_refused() {
    let Some(cnn) = example_binary() else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("stax-fifo-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let fifo = dir.join("pipe");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status();
    assert!(made.is_ok_and(|s| s.success()), "mkfifo {}", fifo.display());
    let args = [
        "--device",
        "cpu",
        "--img",
        "8",
        "--max-steps",
        "1",
        "--save",
        "pipe",
    ];
    let (ok, out) = run_example(&cnn, &dir, &args);
    assert!(!ok, "{out}");
    let want = "--save: pipe exists and is not a regular file";
    assert!(out.contains(want), "expected {want:?} in:\n{out}");
    assert!(
        !out.contains("step    1"),
        "refused before training:\n{out}"
    );
    let kind = std::fs::symlink_metadata(&fifo).unwrap().file_type();
    assert!(
        std::os::unix::fs::FileTypeExt::is_fifo(&kind),
        "the pipe is kept"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// An output reached through a link is the file the link names: a dangling symbolic link and
/// the file it points to are one output, a hard link to an input is that input (left as it
/// was); a name too long for the file system is refused before training, not at the save.
#[test]
fn outputs_through_links_and_names_too_long_are_refused_up_front() {
    let Some(cnn) = example_binary() else {
        return;
    };
    let dir = common::checkpoint::scratch("example-links");
    std::os::unix::fs::symlink("a.out", dir.join("link.out")).unwrap();
    std::fs::write(dir.join("in.npz"), b"an input").unwrap();
    std::fs::hard_link(dir.join("in.npz"), dir.join("hard.npz")).unwrap();
    let long = format!("{}.npz", "a".repeat(300));
    let cases: [(&[&str], &str); 3] = [
        (
            &["--json", "link.out", "--trace", "a.out"],
            "a.out: one would be lost",
        ),
        (
            &["--init-from", "in.npz", "--json", "hard.npz"],
            "the file --init-from reads",
        ),
        (&["--save", &long], "--save: cannot write"),
    ];
    for (flags, want) in cases {
        let args: Vec<&str> = TINY_RUN.iter().chain(flags).copied().collect();
        let (ok, out) = run_example(&cnn, &dir, &args);
        assert!(
            !ok && out.contains(want),
            "{flags:?}: expected {want:?} in:\n{out}"
        );
        assert!(
            !out.contains("test: loss"),
            "{flags:?} trained first:\n{out}"
        );
    }
    assert_eq!(std::fs::read(dir.join("in.npz")).unwrap(), b"an input");
    assert!(!dir.join("a.out").exists(), "the probe left a file behind");
}

/// What the example says about a resumed f16 run (its loss scale restored, or dropped under
/// another precision, which it notes), a resumed run with nothing left to train, the step
/// numbers its peak summary counts from, another batch that continues the data order (noted)
/// and one that cannot.
#[test]
fn a_resumed_run_says_what_it_continued() {
    let Some(cnn) = example_binary() else {
        return;
    };
    let dir = common::checkpoint::scratch("example-resume");
    let run = |flags: &[&str]| {
        let cpu = ["--device", "cpu", "--img", "8", "--batch", "50"];
        let args: Vec<&str> = cpu.iter().chain(flags).copied().collect();
        let (ok, out) = run_example(&cnn, &dir, &args);
        assert!(ok, "{args:?} failed:\n{out}");
        out
    };
    run(&[
        "--precision",
        "f16",
        "--max-steps",
        "3",
        "--save",
        "f16.npz",
    ]);
    let out = run(&[
        "--precision",
        "f16",
        "--max-steps",
        "5",
        "--resume",
        "f16.npz",
    ]);
    assert!(
        out.contains("resumed: f16.npz at step 3, loss scale 32768 (counter 3 of 2000)"),
        "{out}"
    );
    assert!(
        out.contains("measured = planned on all 2 steps from step 4"),
        "{out}"
    );
    let out = run(&[
        "--precision",
        "f16",
        "--max-steps",
        "4",
        "--resume",
        "f16.npz",
    ]);
    assert!(
        out.contains("measured = planned on the one step, step 4 ("),
        "{out}"
    );
    let out = run(&["--max-steps", "5", "--resume", "f16.npz"]);
    assert!(out.contains("its f16 loss scale (32768) dropped"), "{out}");
    let want = "note: saved under params=f32,compute=f16,output=f32, resumed under \
                params=f32,compute=f32,output=f32";
    assert!(out.contains(want), "{out}");
    assert!(!out.contains("note: saved at batch"), "{out}");
    // 150 examples used: a batch of 75 continues that order, in steps of 75
    let args = [
        "--device",
        "cpu",
        "--img",
        "8",
        "--batch",
        "75",
        "--max-steps",
        "4",
        "--precision",
        "f16",
        "--resume",
        "f16.npz",
    ];
    let (ok, out) = run_example(&cnn, &dir, &args);
    assert!(ok, "{out}");
    let want =
        "note: saved at batch 50, resumed at batch 75: the data order continues in steps of 75";
    assert!(
        out.contains(want) && !out.contains("note: saved under"),
        "{out}"
    );
    let out = run(&[
        "--precision",
        "f16",
        "--max-steps",
        "2",
        "--resume",
        "f16.npz",
    ]);
    assert!(
        out.contains("loop: no step trained (the run starts at step 3"),
        "{out}"
    );
    // 150 examples used: a batch of 40 cannot continue that order
    let args = [
        "--device", "cpu", "--img", "8", "--batch", "40", "--resume", "f16.npz",
    ];
    let (ok, out) = run_example(&cnn, &dir, &args);
    assert!(!ok, "{out}");
    let want = "--resume f16.npz with --batch 40: loader: cannot resume at epoch 0, example 150";
    assert!(
        out.contains(want) && !out.contains("DataPosition {"),
        "{out}"
    );
    // refused before the set-up: no trainer was resumed, no note about continuing the order
    assert!(
        !out.contains("resumed: ") && !out.contains("note: saved at batch"),
        "{out}"
    );
}

/// Resuming another model's checkpoint names the model mismatch, even at a batch that could
/// not continue the checkpoint's data order either (the model is checked first).
#[test]
fn resuming_another_models_checkpoint_names_the_model() {
    let (Some(cnn), Some(resnet)) = (example_binary(), example_named("resnet50")) else {
        return;
    };
    let dir = common::checkpoint::scratch("example-other-model");
    let tiny = [
        "--blocks", "1,1,1,1", "--widths", "8,8,8,8", "--save", "rn.npz",
    ];
    let args: Vec<&str> = [
        "--device",
        "cpu",
        "--img",
        "8",
        "--batch",
        "4",
        "--max-steps",
        "1",
    ]
    .iter()
    .chain(&tiny)
    .copied()
    .collect();
    let (ok, out) = run_example(&resnet, &dir, &args);
    assert!(ok, "{out}");
    // 4 examples used: a batch of 7 cannot continue them, but the model is the first problem
    let args = [
        "--device", "cpu", "--img", "8", "--batch", "7", "--resume", "rn.npz",
    ];
    let (ok, out) = run_example(&cnn, &dir, &args);
    assert!(!ok && out.contains("describes the model"), "{out}");
    assert!(!out.contains("with --batch 7"), "{out}");
}

/// A rank whose rendezvous variables are wrong names itself and what the variable takes: a
/// timeout of 0 seconds is a number, but not one a wait can use.
#[test]
fn a_bad_rendezvous_variable_names_the_rank_and_what_it_takes() {
    let Some(cnn) = example_binary() else {
        return;
    };
    let dir = common::checkpoint::scratch("example-rendezvous-env");
    let out = std::process::Command::new(&cnn)
        .args(TINY_RUN)
        .current_dir(&*dir)
        .env("STAX_WORLD_SIZE", "2")
        .env("STAX_RANK", "1")
        .env("STAX_RENDEZVOUS", dir.join("meet"))
        .env("STAX_TIMEOUT_S", "0")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "{text}");
    let want = "rank 1): STAX_TIMEOUT_S=\"0\": expected seconds, a finite number > 0";
    assert!(text.contains(want), "expected {want:?} in:\n{text}");
}

/// An out-of-memory at set-up names the largest batch of the run's own feed (prefetched by
/// default): the batch `--batch auto` picks for the same budget.
#[test]
fn the_set_up_out_of_memory_names_the_batch_auto_picks() {
    let Some(cnn) = example_binary() else {
        return;
    };
    let dir = std::env::temp_dir();
    let common = ["--device", "cpu", "--budget", "200MB", "--max-steps", "1"];
    let number_after = |out: &str, key: &str| -> usize {
        let at = out
            .find(key)
            .unwrap_or_else(|| panic!("no {key:?} in:\n{out}"))
            + key.len();
        let digits: String = out[at..].chars().take_while(char::is_ascii_digit).collect();
        digits.parse().unwrap()
    };
    let args: Vec<&str> = common.iter().chain(&["--batch", "auto"]).copied().collect();
    let (ok, auto) = run_example(&cnn, &dir, &args);
    assert!(ok, "{auto}");
    let picked = number_after(&auto, "--batch auto: ");
    let args: Vec<&str> = common.iter().chain(&["--batch", "500"]).copied().collect();
    let (ok, oom) = run_example(&cnn, &dir, &args);
    assert!(!ok, "batch 500 should not fit 200 MB:\n{oom}");
    let at_set_up = "train: set-up (reserving step 1's memory, batch 500) ran out of memory";
    assert!(oom.contains(at_set_up), "{oom}");
    assert_eq!(
        number_after(&oom, "the largest batch that fits is "),
        picked,
        "{oom}"
    );
}

/// `--profile`: one more step after the loop and the test (step 3 after two), its phases and the seed
/// model's leaf layers by kind: 2 convs (their ReLUs fused, in the convs' spans), 2 denses,
/// the one ReLU between them and the flatten; with `--json`, the same step as the file's last
/// line, `{"profile": ...}`, its kinds the table's.
#[test]
fn profile_prints_the_extra_step_by_phase_and_layer_kind() {
    let Some(cnn) = example_binary() else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("stax-profile-json-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("steps.jsonl");
    let json_arg = json.to_str().unwrap();
    let args = [
        "--device",
        "cpu",
        "--img",
        "12",
        "--batch",
        "20",
        "--max-steps",
        "2",
        "--profile",
        "--json",
        json_arg,
    ];
    let (ok, out) = run_example(&cnn, &dir, &args);
    assert!(ok, "{args:?} failed:\n{out}");
    let text = std::fs::read_to_string(&json).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 3, "two steps and the profile: {text}");
    let p = &lines[2]["profile"];
    assert_eq!(p["report"]["step"], 3, "{p}");
    let kinds: Vec<(&str, u64)> = p["by_kind"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| (k["kind"].as_str().unwrap(), k["count"].as_u64().unwrap()))
        .collect();
    for want in [("conv", 2), ("dense", 2), ("relu", 1), ("flatten", 1)] {
        assert!(kinds.contains(&want), "{want:?} in {kinds:?}");
    }
    let layers = p["layers"].as_array().unwrap();
    assert!(
        layers
            .iter()
            .all(|l| l["ms"].as_f64().is_some_and(|ms| ms >= 0.0)),
        "{p}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
    let profile = out
        .lines()
        .find(|l| l.starts_with("profile (one more step, neither saved nor evaluated): step 3: "))
        .unwrap_or_else(|| panic!("no profile of step 3:\n{out}"));
    for phase in [" forward ", " loss ", " backward ", " update "] {
        assert!(profile.contains(phase), "{phase:?} in {profile:?}");
    }
    let row = |kind: &str| {
        out.lines()
            .find(|l| l.split_whitespace().next() == Some(kind))
            .map(|l| l.split_whitespace().nth(1).unwrap_or("").to_string())
    };
    for (kind, count) in [
        ("conv", "2"),
        ("dense", "2"),
        ("relu", "1"),
        ("flatten", "1"),
    ] {
        assert_eq!(row(kind).as_deref(), Some(count), "{kind}: {out}");
    }
    assert!(out.contains("slowest layers:"), "{out}");
}

/// CUDA-only flags given on the CPU are named as ignored (the run goes on); none are named at
/// their defaults.
#[test]
fn cuda_only_flags_on_the_cpu_are_named_as_ignored() {
    let Some(cnn) = example_binary() else {
        return;
    };
    let dir = std::env::temp_dir();
    let base = TINY_RUN;
    let extra = [
        "--deterministic",
        "--direct-convs",
        "off",
        "--no-dense-adam-rows",
    ];
    let args: Vec<&str> = base.iter().chain(&extra).copied().collect();
    let (ok, out) = run_example(&cnn, &dir, &args);
    assert!(ok, "{out}");
    let want = "note: ignored on the CPU (CUDA only): --deterministic, --direct-convs, \
                --no-dense-adam-rows";
    assert!(out.contains(want), "{out}");
    let (ok, out) = run_example(&cnn, &dir, &base);
    assert!(ok && !out.contains("ignored on the CPU"), "{out}");
}

/// The run's first line names the classes its head has: the data's (2), or `--classes`.
#[test]
fn the_first_line_names_the_class_count() {
    let Some(cnn) = example_binary() else {
        return;
    };
    let dir = std::env::temp_dir();
    let base = TINY_RUN;
    for (extra, want) in [
        (&[][..], ", 2 classes, batch 50"),
        (&["--classes", "5"][..], ", 5 classes,"),
    ] {
        let args: Vec<&str> = base.iter().chain(extra).copied().collect();
        let (ok, out) = run_example(&cnn, &dir, &args);
        assert!(
            ok && out.contains(want),
            "{args:?}: expected {want:?} in:\n{out}"
        );
    }
}

/// An unknown `--device` is clap's error naming the flag and the accepted names (exit code 2,
/// as for every other malformed flag).
#[test]
fn an_unknown_device_names_the_flag() {
    let Some(cnn) = example_binary() else {
        return;
    };
    let (ok, out) = run_example(&cnn, &std::env::temp_dir(), &["--device", "tpu"]);
    assert!(!ok, "{out}");
    let want = "invalid value 'tpu' for '--device <DEVICE>': expected auto, cpu, cuda or cuda:N";
    assert!(out.contains(want), "{out}");
}

/// Flags that need no backend are refused before one opens (a CUDA backend compiles the kernels
/// on a machine's first run): asked for `--device cuda`, a machine without CUDA reports the
/// flag, not the missing driver, and one with CUDA compiles nothing first.
#[test]
fn flags_are_checked_before_a_backend_opens() {
    let Some(cnn) = example_binary() else {
        return;
    };
    let cases: [(&[&str], &str); 6] = [
        (
            &["--batch", "0"],
            "--batch 0: a batch needs at least one example",
        ),
        (&["--budget", "abc"], "--budget \"abc\": expected bytes"),
        (
            &["--precision", "fp8"],
            "--precision \"fp8\": expected tf32",
        ),
        (
            &["--img", "0"],
            "--img 0: the image size must be at least 1",
        ),
        (
            &["--json", "x.json", "--trace", "x.json"],
            "x.json: one would be lost",
        ),
        (
            &[
                "--data",
                "/nonexistent.npz",
                "--test-data",
                "/nonexistent.npz",
            ],
            "--data /nonexistent.npz: load_npz: cannot access /nonexistent.npz",
        ),
    ];
    for (flags, want) in cases {
        let args: Vec<&str> = ["--device", "cuda"].iter().chain(flags).copied().collect();
        let (ok, out) = run_example(&cnn, &std::env::temp_dir(), &args);
        assert!(!ok, "{args:?} should fail:\n{out}");
        assert!(out.contains(want), "{args:?}: expected {want:?} in:\n{out}");
        assert_eq!(
            out.lines().count(),
            1,
            "{args:?}: one line, nothing opened:\n{out}"
        );
    }
}

//! Data-parallel training on the CPU backend, several processes of this test binary started
//! by `stax::train::distributed::launch` (each runs the `rank` test below with the
//! rendezvous variables set): N = 2 and 3 ranks at batch B give the parameters of one
//! process at batch N x B (to reduction order), identical on every rank, each step's peak its
//! plan; one rank is bit-identical to the plain trainer; a rank that dies or hangs mid-run
//! makes the others fail with the collective's error within the timeout; ranks with
//! different models all fail with the mismatch at start; checkpoints are rank 0's.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{assert_rel_close, cpu, host_values};
use stax::train::distributed::{DataParallel, Rendezvous, launch};
use stax::train::{Checkpoint, Feed, Trainer};
use stax::{Adam, Backend, Category, Serial, Shape, Tensor, models::mlp};

const FEATURES: usize = 8;
const CLASSES: usize = 3;

/// Input row `row` of step `step`'s global batch, and its class.
fn example(step: u64, row: usize) -> ([f32; FEATURES], usize) {
    let mut x = [0.0; FEATURES];
    let mut s = step.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (row as u64 + 1);
    for v in &mut x {
        s = s
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        *v = ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0;
    }
    (x, (row * 7 + step as usize) % CLASSES)
}

/// Rows `rows` of step `step`'s global batch, placed on `be`.
fn batch(be: &Arc<dyn Backend>, step: u64, rows: std::ops::Range<usize>) -> (Tensor, Tensor) {
    let n = rows.len();
    let (mut xs, mut ys) = (Vec::new(), vec![0.0f32; n * CLASSES]);
    for (i, row) in rows.enumerate() {
        let (x, c) = example(step, row);
        xs.extend_from_slice(&x);
        ys[i * CLASSES + c] = 1.0;
    }
    let x = Tensor::from_slice(be, &xs, [n, FEATURES], Category::Input).unwrap();
    let y = Tensor::from_slice(be, &ys, [n, CLASSES], Category::Input).unwrap();
    (x, y)
}

fn adam(collecting: bool) -> Adam {
    let a = Adam::new(1e-2);
    if collecting { a.collecting() } else { a }
}

/// The plain trainer at batch `b` (seed 100, rank 0's), after `steps` steps of rows `0..b`.
fn plain(b: usize, steps: u64, collecting: bool) -> Vec<f32> {
    let be = cpu();
    let input = Shape::new([b, FEATURES]);
    let mut t = Trainer::new(mlp(&[16], CLASSES), input, adam(collecting), &be, 100).unwrap();
    for step in 1..=steps {
        let (x, y) = batch(&be, step, 0..b);
        t.step(&x, &y).unwrap();
    }
    host_values(t.params().leaves())
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

fn num(name: &str, default: usize) -> usize {
    env(name).map_or(default, |v| v.parse().unwrap())
}

/// One rank (run by [`run`]; a no-op in a plain `cargo test`): trains `DP_STEPS` steps of
/// its shard of each global batch, checks every step's peak against its plan, writes its
/// parameters to `DP_OUT/params.<rank>` or its error to `DP_OUT/error.<rank>`.
#[test]
fn rank() {
    let Some(out) = env("DP_OUT").map(PathBuf::from) else {
        return;
    };
    let rv = Rendezvous::from_env()
        .unwrap()
        .expect("launched with a rendezvous");
    let r = rv.rank;
    match train(&rv) {
        Ok(params) => {
            let bytes: Vec<u8> = params.iter().flat_map(|v| v.to_le_bytes()).collect();
            std::fs::write(out.join(format!("params.{r}")), bytes).unwrap();
        }
        Err(e) => {
            std::fs::write(out.join(format!("error.{r}")), e.to_string()).unwrap();
            std::process::exit(2);
        }
    }
}

fn train(rv: &Rendezvous) -> Result<Vec<f32>, stax::train::TrainError> {
    let be = cpu();
    let b = num("DP_BATCH", 4);
    let hidden = if env("DP_ODD_RANK").is_some_and(|v| v == rv.rank.to_string()) {
        17
    } else {
        16
    };
    let model: Serial = mlp(&[hidden], CLASSES);
    let input = Shape::new([b, FEATURES]);
    let opt = adam(env("DP_COLLECTING").is_some());
    // Every rank starts from its own random parameters: rank 0's are broadcast.
    let t = Trainer::new(model, input, opt, &be, 100 + rv.rank as u64)?;
    let dp = DataParallel::connect(rv, &be)?.with_bucket_bytes(num("DP_BUCKET", 256) as u64);
    let mut t = t.data_parallel(dp)?;
    let feed = match num("DP_MICRO", 1) {
        1 => Feed::Placed,
        m => Feed::Accumulated(m),
    };
    let plan = t.plan_with_feed(b / num("DP_MICRO", 1), feed)?;
    let comm = plan
        .comm
        .clone()
        .expect("a data-parallel plan shows its communication");
    assert_eq!(
        (comm.rank, comm.world, comm.library.as_str()),
        (rv.rank, rv.world, "tcp")
    );
    for step in 1..=num("DP_STEPS", 3) as u64 {
        if env("DP_DIE").is_some_and(|v| v == format!("{}@{step}", rv.rank)) {
            std::process::abort();
        }
        if env("DP_HANG").is_some_and(|v| v == format!("{}@{step}", rv.rank)) {
            std::thread::sleep(Duration::from_secs(600));
        }
        let rows = rv.rank * b..(rv.rank + 1) * b;
        let report = match num("DP_MICRO", 1) {
            1 => {
                let (x, y) = batch(&be, step, rows);
                t.step(&x, &y)?
            }
            // the shard as micro-batches of b / m rows: their sums are reduced once
            m => {
                let micro: Vec<(Tensor, Tensor)> = (0..m)
                    .map(|i| {
                        batch(
                            &be,
                            step,
                            rows.start + i * b / m..rows.start + (i + 1) * b / m,
                        )
                    })
                    .collect();
                let refs: Vec<(&Tensor, &Tensor)> = micro.iter().map(|(x, y)| (x, y)).collect();
                t.step_accumulated(&refs)?
            }
        };
        assert_eq!(
            report.memory.peak, plan.peak.bytes,
            "rank {} step {step}",
            rv.rank
        );
        let c = report
            .memory
            .comm
            .expect("the report shows the communication");
        assert_eq!(c.buckets, comm.buckets, "the plan's buckets are the step's");
    }
    if let Some(path) = env("DP_SAVE") {
        t.save(Path::new(&path), None)?;
        // every rank returns once rank 0's file is complete
        assert!(
            Path::new(&path).is_file(),
            "rank {}: no checkpoint yet",
            rv.rank
        );
    }
    Ok(host_values(t.params().leaves()))
}

/// The launcher's result, each rank's parameters or error, and how long it took.
type Launched = (Result<(), String>, Vec<Result<Vec<f32>, String>>, Duration);

/// Launches `world` ranks of the `rank` test with `vars`; the launcher's result, each rank's
/// parameters or error, and how long it took.
fn run(world: usize, vars: &[(&str, &str)]) -> Launched {
    // one directory per launch: tests run at once (two with the same vars and another world
    // shared one on a 16-core machine, and read each other's results)
    let out = std::env::temp_dir().join(format!(
        "stax-dp-test-{}-w{world}-{}",
        std::process::id(),
        vars.iter()
            .map(|(k, v)| format!("{k}{v}"))
            .collect::<String>()
            .replace(['/', '@', '.'], "_")
    ));
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out).unwrap();
    let mut env: Vec<(String, String)> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    env.push(("DP_OUT".into(), out.display().to_string()));
    env.push(("STAX_TIMEOUT_S".into(), "5".into()));
    let exe = std::env::current_exe().unwrap();
    let args: Vec<std::ffi::OsString> = ["rank", "--exact", "--nocapture", "--test-threads=1"]
        .iter()
        .map(Into::into)
        .collect();
    let start = Instant::now();
    let launched =
        launch(&exe, &args, world, &env, Duration::from_secs(10)).map_err(|e| e.to_string());
    let took = start.elapsed();
    let results = (0..world)
        .map(|r| match std::fs::read(out.join(format!("params.{r}"))) {
            Ok(b) => Ok(b
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect()),
            Err(_) => {
                Err(std::fs::read_to_string(out.join(format!("error.{r}"))).unwrap_or_default())
            }
        })
        .collect();
    let _ = std::fs::remove_dir_all(&out);
    (launched, results, took)
}

/// N ranks at batch 4 equal one process at batch 4N, and each other bit for bit.
fn equals_big_batch(world: usize, micro: &str) {
    let (launched, results, _) = run(world, &[("DP_COLLECTING", "1"), ("DP_MICRO", micro)]);
    assert_eq!(launched, Ok(()), "{results:?}");
    let params: Vec<Vec<f32>> = results.into_iter().map(Result::unwrap).collect();
    let reference = plain(4 * world, 3, true);
    assert_rel_close(&params[0], &reference, 1e-5, "rank 0 against batch 4N");
    let moved = params[0]
        .iter()
        .zip(&plain(4, 0, true))
        .any(|(a, b)| a != b);
    assert!(moved, "the parameters trained");
    for (r, p) in params.iter().enumerate() {
        assert!(
            p.iter()
                .zip(&params[0])
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "rank {r} differs from rank 0"
        );
    }
}

#[test]
fn two_ranks_equal_one_process_at_twice_the_batch() {
    equals_big_batch(2, "1");
}

#[test]
fn three_ranks_equal_one_process_at_three_times_the_batch() {
    equals_big_batch(3, "1");
}

#[test]
fn two_ranks_accumulating_two_micro_batches_equal_one_process_at_twice_the_batch() {
    equals_big_batch(2, "2");
}

#[test]
fn one_rank_is_bit_identical_to_the_plain_trainer() {
    for collecting in [false, true] {
        let vars: &[(&str, &str)] = if collecting {
            &[("DP_COLLECTING", "1")]
        } else {
            &[]
        };
        let (launched, results, _) = run(1, vars);
        assert_eq!(launched, Ok(()), "{results:?}");
        let got = results.into_iter().next().unwrap().unwrap();
        let want = plain(4, 3, collecting);
        let same = got.len() == want.len()
            && got
                .iter()
                .zip(&want)
                .all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(
            same,
            "collecting {collecting}: one rank differs from the plain trainer"
        );
    }
}

#[test]
fn a_rank_that_dies_mid_run_fails_the_others_within_the_timeout() {
    let (launched, results, took) = run(3, &[("DP_COLLECTING", "1"), ("DP_DIE", "1@2")]);
    let launched = launched.unwrap_err();
    assert!(launched.contains("rank"), "{launched}");
    for r in [0, 2] {
        let e = results[r].clone().unwrap_err();
        assert!(
            e.contains("collective") && e.contains(&format!("on rank {r}")),
            "rank {r}: {e}"
        );
    }
    assert!(
        took < Duration::from_secs(5),
        "took {took:?}, the timeout is 5 s"
    );
}

#[test]
fn a_rank_that_hangs_fails_the_others_at_the_timeout() {
    let (launched, results, took) = run(2, &[("DP_COLLECTING", "1"), ("DP_HANG", "1@2")]);
    assert!(launched.is_err());
    let e = results[0].clone().unwrap_err();
    assert!(e.contains("collective") && e.contains("timed out"), "{e}");
    // rank 0 times out after 5 s; the launcher ends rank 1 10 s later
    assert!(took < Duration::from_secs(30), "took {took:?}");
}

#[test]
fn a_rank_with_another_model_fails_every_rank_at_start() {
    let (launched, results, _) = run(2, &[("DP_ODD_RANK", "1")]);
    assert!(launched.is_err());
    for (r, other) in [(0, 1), (1, 0)] {
        let e = results[r].clone().unwrap_err();
        let said = format!("data parallel (rank {r}): rank {other} has another model");
        assert!(
            e.starts_with(&said) && e.contains("dense(16)") && e.contains("dense(17)"),
            "rank {r}: {e}"
        );
    }
}

#[test]
fn rank_zero_writes_the_checkpoint_a_single_process_reads() {
    let dir = std::env::temp_dir().join(format!("stax-dp-ckpt-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("dp.npz");
    let p = path.display().to_string();
    let (launched, results, _) = run(2, &[("DP_COLLECTING", "1"), ("DP_SAVE", &p)]);
    assert_eq!(launched, Ok(()), "{results:?}");
    let be = cpu();
    let input = Shape::new([8, FEATURES]);
    let params = Checkpoint::open(&path)
        .unwrap()
        .params(&mlp(&[16], CLASSES), &input, &be)
        .unwrap();
    assert_eq!(host_values(params.leaves()), *results[0].as_ref().unwrap());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_example_launches_its_ranks_and_each_step_peaks_at_its_plan() {
    let Some(bin) = common::checkpoint::example_binary() else {
        return;
    };
    let args = [
        "--ranks",
        "2",
        "--img",
        "8",
        "--batch",
        "4",
        "--max-steps",
        "2",
        "--no-prefetch",
        // a bucket per layer: each conv's gradients are reduced after its vjp returns
        "--bucket",
        "1KiB",
    ];
    let out = std::process::Command::new(&bin)
        .args(args)
        .env("STAX_TIMEOUT_S", "30")
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    let test_line = |r: usize| {
        let prefix = format!("[rank {r}] test: ");
        text.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .map(str::to_string)
    };
    for r in 0..2 {
        let peaks = format!("[rank {r}] step peaks: measured = planned on all 2 steps");
        assert!(text.contains(&peaks), "rank {r}:\n{text}");
        for bucket in 0..2 {
            assert!(
                text.contains(&format!("[rank {r}]     bucket {bucket}: ")),
                "rank {r} lists its buckets (more than one):\n{text}"
            );
        }
    }
    assert!(
        test_line(0).is_some() && test_line(0) == test_line(1),
        "the ranks end equal:\n{text}"
    );
}

/// A model computing in bf16, as a whole or in one layer inside, is refused by
/// `data_parallel` with the reason, before any exchange (the buckets all-reduce f32
/// gradients): one in-process rank of a world of one.
#[test]
fn a_bf16_model_is_refused_for_data_parallel_with_the_reason() {
    use stax::layers::{Mixed, Policy};
    use stax::{Dense, Layer, Relu, serial};
    fn refused<L: Layer>(model: L, name: &str) {
        let be = cpu();
        let dir = std::env::temp_dir().join(format!("stax-dp-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let rv = Rendezvous {
            rank: 0,
            world: 1,
            local_rank: 0,
            dir: dir.clone(),
            timeout: Duration::from_secs(5),
            host: "127.0.0.1".into(),
        };
        let t = Trainer::new(model, Shape::new([4, FEATURES]), Adam::new(1e-3), &be, 1).unwrap();
        let dp = DataParallel::connect(&rv, &be).unwrap();
        let e = t.data_parallel(dp).map(drop).unwrap_err().to_string();
        assert!(
            e.contains("f32 gradients only") && e.contains("bf16"),
            "{name}: {e}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
    refused(Mixed::new(mlp(&[16], CLASSES), Policy::BF16), "whole");
    let hidden = Mixed::new(serial![Dense(16), Relu], Policy::BF16);
    refused(serial![hidden, Dense(CLASSES)], "layer");
    let made = stax::ShapeDependent::new(|_| {
        Box::new(Mixed::new(serial![Dense(16), Relu], Policy::BF16)) as Box<dyn Layer>
    });
    refused(serial![made, Dense(CLASSES)], "made");
}

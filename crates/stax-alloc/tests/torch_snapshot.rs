//! `scripts/torch_snapshot_to_trace.py`: a synthetic PyTorch memory snapshot, pickled with
//! plain Python (no torch), converted to a stax_alloc trace and replayed. Skipped, with a
//! printed notice, where there is no `python3`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use stax_alloc::{Allocator, Category, SimMemory, Strategy, Trace, TraceOp, bench, replay};

/// A snapshot as `torch.cuda.memory._snapshot()` returns it, one device: a segment, blocks
/// allocated, freed (requested, then completed), an address reused on another stream, a
/// free of a block allocated before recording, a block left live, an `oom` entry.
const SNAPSHOT: &str = r#"
import pickle, sys
A, B, C = 0x7f0000000000, 0x7f0000200000, 0x7f0000600000
e = lambda action, addr, size, stream=0, t=None: dict(
    action=action, addr=addr, size=size, stream=stream, frames=[],
    **({} if t is None else {"time_us": t}))
trace = [
    e("segment_alloc", A, 20 << 20, t=1),
    e("alloc", A, 1024, t=10),
    e("alloc", B, 4 << 20, t=11),
    e("free_requested", A, 1024, t=12),
    e("free_completed", A, 1024, t=13),
    e("alloc", A, 2048, stream=140234, t=14),
    e("free_completed", C, 512, t=15),
    e("free_requested", B, 4 << 20, t=16),
    e("free_completed", B, 4 << 20, t=17),
    dict(action="oom", addr=0, size=1 << 40, stream=0, device_free=0, frames=[], time_us=18),
]
snapshot = {"segments": [{"address": A, "total_size": 20 << 20, "blocks": []}],
            "device_traces": [trace]}
with open(sys.argv[1], "wb") as f:
    pickle.dump(snapshot, f)
"#;

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/torch_snapshot_to_trace.py")
}

/// `python3`, or None after printing a skip notice.
fn python() -> Option<&'static str> {
    let ok = Command::new("python3")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        let test = std::thread::current().name().unwrap_or("?").to_string();
        let _ = writeln!(std::io::stderr(), "{test}: skipped: python3 not found");
    }
    ok.then_some("python3")
}

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("stax-torch-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// Runs Python `code` with `path` as its argument (it writes a pickle there).
fn write_pickle(py: &str, code: &str, path: &Path) {
    let made = Command::new(py)
        .args(["-c", code])
        .arg(path)
        .status()
        .unwrap();
    assert!(made.success(), "python -c failed");
}

/// Runs the converter on `pickle` into `out` with `args`: (succeeded, what it said).
fn convert(py: &str, pickle: &Path, out: &Path, args: &[&str]) -> (bool, String) {
    let run = Command::new(py)
        .arg(script())
        .arg(pickle)
        .arg(out)
        .args(args)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&run.stderr).into_owned();
    (run.status.success(), said)
}

#[test]
fn a_torch_snapshot_converts_and_replays() {
    let Some(py) = python() else { return };
    let (pickle, out) = (tmp("snapshot.pickle"), tmp("trace.jsonl"));
    write_pickle(py, SNAPSHOT, &pickle);
    let (ok, said) = convert(py, &pickle, &out, &[]);
    assert!(ok, "{said}");
    assert!(
        said.contains("5 events (3 allocations)") && said.contains("1 frees"),
        "{said}"
    );

    let text = std::fs::read_to_string(&out).unwrap();
    let first = text.lines().next().unwrap();
    assert_eq!(
        first,
        r#"{"op":"alloc","id":0,"bytes":1024,"category":"other","t_ns":10000,"stream":0,"addr":139637976727552}"#
    );
    let trace = Trace::read_jsonl(text.as_bytes()).unwrap();
    let ops: Vec<(TraceOp, u64, u64, u32)> = trace
        .events
        .iter()
        .map(|e| (e.op, e.id, e.bytes, e.stream))
        .collect();
    assert_eq!(
        ops,
        [
            (TraceOp::Alloc, 0, 1024, 0),
            (TraceOp::Alloc, 1, 4 << 20, 0),
            (TraceOp::Free, 0, 1024, 0),
            (TraceOp::Alloc, 2, 2048, 1),
            (TraceOp::Free, 1, 4 << 20, 0),
        ]
    );
    assert!(trace.events.iter().all(|e| e.category == Category::Other));
    assert_eq!(trace.peak_requested(), 2048 + (4 << 20));

    let sim = || Arc::new(SimMemory::new(1 << 30, 2 << 20));
    let alloc = Allocator::new(sim(), Strategy::Caching).unwrap();
    let r = replay(&trace, &alloc).unwrap();
    assert_eq!((r.peak_requested, r.live_at_end), (2048 + (4 << 20), 1));
    let alloc = Allocator::new(sim(), Strategy::Expandable).unwrap();
    let b = bench::bench(&trace, "torch", &alloc, 3).unwrap();
    assert_eq!(
        (b.failure, b.allocations, b.peak_live),
        (None, 9, 2048 + (4 << 20))
    );

    // --free-at requested ends B's life at free_requested (time 16 instead of 17)
    let (ok, said) = convert(py, &pickle, &out, &["--free-at", "requested"]);
    assert!(ok, "{said}");
    let trace = Trace::read_jsonl(&std::fs::read(&out).unwrap()[..]).unwrap();
    assert_eq!(
        trace.events.last().map(|e| (e.op, e.t_ns)),
        Some((TraceOp::Free, 16_000))
    );
}

#[test]
fn a_pickle_with_code_in_it_is_refused() {
    let Some(py) = python() else { return };
    let (pickle, out) = (tmp("evil.pickle"), tmp("evil.jsonl"));
    let evil = "import pickle, sys, collections\n\
                pickle.dump(collections.OrderedDict(device_traces=[[]]), open(sys.argv[1], 'wb'))";
    write_pickle(py, evil, &pickle);
    let (ok, said) = convert(py, &pickle, &out, &[]);
    assert!(
        !ok && said.contains("refusing collections.OrderedDict"),
        "{said}"
    );
    // not a snapshot at all
    write_pickle(
        py,
        "import pickle, sys\npickle.dump([1, 2], open(sys.argv[1], 'wb'))",
        &pickle,
    );
    let (ok, said) = convert(py, &pickle, &out, &[]);
    assert!(!ok && said.contains("no 'device_traces'"), "{said}");
}

//! A training run's recorded allocation trace (what `stax_cnn --record-trace FILE` writes)
//! round-trips through the JSON-lines format `alloc_bench --trace` reads, names and all, and its
//! replay on a fresh allocator reaches exactly the run's measured peak.

mod common;

use common::{batch, cpu, seed_model};
use stax::alloc::{Allocator, SimMemory, Strategy, Trace, TraceOp, replay};
use stax::train::Trainer;
use stax::{Adam, Shape};
use std::sync::Arc;

#[test]
fn a_recorded_run_replays_to_its_measured_peak() {
    let be = cpu();
    let input = Shape::new([4, 12, 12, 3]);
    be.allocator().start_trace();
    let mut trainer = Trainer::new(seed_model(), input.clone(), Adam::new(1e-3), &be, 3).unwrap();
    let (x, y) = batch(&be, &input, 2);
    let mut peak = 0;
    for _ in 0..2 {
        peak = peak.max(trainer.step(&x, &y).unwrap().memory.peak);
    }
    let recorded = be.allocator().stop_trace();

    let mut jsonl = Vec::new();
    recorded.write_jsonl(&mut jsonl).unwrap();
    let read = Trace::read_jsonl(&jsonl[..]).unwrap();
    assert_eq!(read.events.len(), recorded.events.len());
    let names: Vec<&str> = read.events.iter().map(|e| e.name.as_str()).collect();
    for name in [
        "0.conv/w",
        "5.dense/w/mu",
        "0.conv/output",
        "1.relu/mask",
        "5.dense/db",
    ] {
        assert!(names.contains(&name), "{name} missing from {names:?}");
    }
    let allocs = read
        .events
        .iter()
        .filter(|e| e.op == TraceOp::Alloc)
        .count();
    let frees = read.events.len() - allocs;
    // parameters, moments and the batch stay live at the end of the recording
    let live_at_end = 8 * 3 + 2;
    assert_eq!(allocs - frees, live_at_end);

    // Replayed from nothing on a fresh allocator: the peak live bytes are the run's peak, as
    // the trace holds the set-up too (every buffer live at the peak was allocated in it).
    let sim = Arc::new(SimMemory::new(1 << 30, 256));
    let fresh = Allocator::new(sim, Strategy::Platform).unwrap();
    let report = replay(&read, &fresh).unwrap();
    assert_eq!(report.peak_requested, peak);
}

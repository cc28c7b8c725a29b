//! Traces: record, JSON-lines round trip, deterministic replay, replay errors.

use std::sync::Arc;

use stax_alloc::{
    AllocError, Allocator, Category, SimMemory, Strategy, Trace, TraceBuilder, TraceOp, replay,
};

/// A workload with a little of everything: sizes small and large, interleaved frees.
fn record() -> Trace {
    let alloc = Allocator::new(
        Arc::new(SimMemory::new(1 << 30, 2 << 20)),
        Strategy::Caching,
    )
    .unwrap();
    alloc.start_trace();
    assert!(alloc.is_tracing());
    let mut live = Vec::new();
    let mut x: u64 = 12345;
    for i in 0..400 {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let bytes = match x >> 61 {
            0 => 0,
            1..=4 => (x >> 20) as usize % 65536,
            5 | 6 => (x >> 20) as usize % (2 << 20),
            _ => (x >> 20) as usize % (24 << 20),
        };
        let cat = Category::ALL[(x >> 40) as usize % 7];
        live.push(alloc.allocate_on(bytes, cat, (i % 2) as u32).unwrap());
        if (x >> 33) % 3 == 0 {
            let k = (x >> 45) as usize % live.len();
            live.swap_remove(k);
        }
    }
    drop(live);
    let trace = alloc.stop_trace();
    assert!(!alloc.is_tracing());
    assert_eq!(trace.events.len(), 800);
    assert!(trace.events.windows(2).all(|w| w[0].t_ns <= w[1].t_ns));
    trace
}

#[test]
fn replay_is_deterministic_for_every_strategy() {
    let trace = record();
    let mut buf = Vec::new();
    trace.write_jsonl(&mut buf).unwrap();
    let trace = Trace::read_jsonl(&buf[..]).unwrap();
    for strategy in [
        Strategy::Caching,
        Strategy::Bfc { fraction: 0.75 },
        Strategy::Platform,
    ] {
        let run = || {
            let sim = Arc::new(SimMemory::new(1 << 30, 2 << 20));
            let alloc = Allocator::new(sim, strategy.clone()).unwrap();
            replay(&trace, &alloc).unwrap()
        };
        let (a, b) = (run(), run());
        assert_eq!(a.placements.len(), 400);
        assert_eq!(
            a, b,
            "{strategy}: two replays must place every block identically"
        );
        assert_eq!(a.peak_requested, trace.peak_requested());
        assert!(a.peak_reserved >= a.peak_allocated && a.peak_allocated >= a.peak_requested);
        assert_eq!(a.live_at_end, 0);
    }
}

#[test]
fn replays_on_a_warm_cache_settle_to_zero_backend_calls() {
    // The cache only grows, and a replay that adds no segment leaves the same state behind,
    // so once one replay makes no backend call, none after it does either.
    let trace = record();
    let alloc = Allocator::new(
        Arc::new(SimMemory::new(1 << 30, 2 << 20)),
        Strategy::Caching,
    )
    .unwrap();
    let first = replay(&trace, &alloc).unwrap();
    assert!(first.backend_reserves > 0);
    let mut settled = None;
    for _ in 0..4 {
        let r = replay(&trace, &alloc).unwrap();
        if r.backend_calls() == 0 {
            settled = Some(r);
            break;
        }
    }
    let settled = settled.expect("settles within five replays");
    let again = replay(&trace, &alloc).unwrap();
    assert_eq!(again.backend_calls(), 0);
    assert_eq!(again.placements, settled.placements);
    assert!(again.overhead() >= 1.0);
}

#[test]
fn jsonl_is_one_object_per_line() {
    let mut b = TraceBuilder::new();
    let p = b.alloc(1_310_876_424, Category::Parameter);
    let g = b.alloc(1 << 20, Category::Gradient);
    b.free(g);
    b.free(g); // ignored: already freed
    let trace = b.finish();
    assert_eq!(trace.events.len(), 3);
    assert_eq!(trace.events[2].op, TraceOp::Free);
    let mut buf = Vec::new();
    trace.write_jsonl(&mut buf).unwrap();
    let text = String::from_utf8(buf).unwrap();
    let first = text.lines().next().unwrap();
    assert_eq!(
        first,
        format!(
            r#"{{"op":"alloc","id":{p},"bytes":1310876424,"category":"parameter","t_ns":0,"stream":0}}"#
        )
    );
    assert_eq!(text.lines().count(), 3);
    // A replay leaves nothing behind even when the trace does.
    let alloc = Allocator::new(
        Arc::new(SimMemory::new(4 << 30, 2 << 20)),
        Strategy::Caching,
    )
    .unwrap();
    let r = replay(&trace, &alloc).unwrap();
    assert_eq!((r.live_at_end, alloc.stats().requested), (1, 0));
}

#[test]
fn bad_traces_are_typed_errors() {
    let bad_json = "{\"op\":\"alloc\",\"id\":0,\"bytes\":8,\"category\":\"other\",\"t_ns\":0,\"stream\":0}\n\nnot json\n";
    match Trace::read_jsonl(bad_json.as_bytes()) {
        Err(AllocError::Trace {
            op: "read",
            line: 3,
            ..
        }) => {}
        other => panic!("expected a read error on line 3, got {other:?}"),
    }
    let bad_category =
        r#"{"op":"alloc","id":0,"bytes":8,"category":"weights","t_ns":0,"stream":0}"#;
    assert!(Trace::read_jsonl(bad_category.as_bytes()).is_err());

    let alloc = Allocator::new(
        Arc::new(SimMemory::new(1 << 30, 2 << 20)),
        Strategy::Caching,
    )
    .unwrap();
    let mut trace = TraceBuilder::new().finish();
    let ev = |op, id| stax_alloc::TraceEvent {
        op,
        id,
        bytes: 64,
        category: Category::Other,
        t_ns: 0,
        stream: 0,
        addr: 0,
        name: String::new(),
        shape: None,
        dtype: None,
    };
    trace.events.push(ev(TraceOp::Free, 7));
    let e = replay(&trace, &alloc).unwrap_err();
    assert!(e.to_string().contains("free of unknown id 7"), "{e}");
    trace.events = vec![ev(TraceOp::Alloc, 1), ev(TraceOp::Alloc, 1)];
    let e = replay(&trace, &alloc).unwrap_err();
    assert!(
        matches!(
            e,
            AllocError::Trace {
                op: "replay",
                line: 2,
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(
        alloc.stats().requested,
        0,
        "a failed replay frees what it allocated"
    );
    // Out of memory during a replay is the allocator's own error.
    trace.events = vec![stax_alloc::TraceEvent {
        bytes: 2 << 30,
        ..ev(TraceOp::Alloc, 0)
    }];
    assert!(matches!(
        replay(&trace, &alloc),
        Err(AllocError::OutOfMemory(_))
    ));
}

#[test]
fn recorded_events_carry_the_allocation_address() {
    let alloc = Allocator::new(
        Arc::new(SimMemory::new(1 << 30, 2 << 20)),
        Strategy::Caching,
    )
    .unwrap();
    alloc.start_trace();
    let a = alloc.allocate(3 << 20, Category::Activation).unwrap();
    let addr = a.addr();
    drop(a);
    let trace = alloc.stop_trace();
    assert_eq!(trace.events.len(), 2);
    assert!(trace.events.iter().all(|e| e.addr == addr && addr != 0));
    // traces written before the field existed still read (addr defaults to 0)
    let old = br#"{"op":"alloc","id":0,"bytes":8,"category":"other","t_ns":0,"stream":0}"#;
    let back = stax_alloc::Trace::read_jsonl(&old[..]).unwrap();
    assert_eq!(back.events[0].addr, 0);
}

#[test]
fn names_scopes_and_marks_travel_with_the_trace() {
    use stax_alloc::{Mark, Tag};
    let alloc = Allocator::new(
        Arc::new(SimMemory::new(64 << 20, 2 << 20)),
        Strategy::Caching,
    )
    .unwrap();
    alloc.start_trace();
    alloc.mark_step(1);
    let (x, ws) = {
        let _outer = alloc.scope("3.parallel");
        let _inner = alloc.scope("0.conv");
        assert_eq!(alloc.current_scope(), "3.parallel/0.conv");
        let x = alloc
            .allocate(100, Tag::new(Category::Activation, "output"))
            .unwrap();
        let ws = alloc.allocate(10, Category::Workspace).unwrap();
        (x, ws)
    };
    assert_eq!(alloc.current_scope(), "");
    assert_eq!(x.name().to_string(), "3.parallel/0.conv/output");
    assert_eq!(ws.name().to_string(), "3.parallel/0.conv/workspace");
    drop(ws);
    {
        let _relu = alloc.scope("4.relu");
        x.note_role("output");
    }
    let too_big = {
        let _s = alloc.scope("9.dense");
        alloc.allocate(128 << 20, Tag::new(Category::Gradient, "dw"))
    };
    let trace = alloc.stop_trace();
    let names: Vec<&str> = trace.events.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "3.parallel/0.conv/output",
            "3.parallel/0.conv/workspace",
            "3.parallel/0.conv/workspace"
        ]
    );
    assert_eq!(
        trace.marks,
        [
            Mark::Step { at: 0, step: 1 },
            Mark::Role {
                at: 3,
                id: x.id(),
                name: "4.relu/output".into()
            }
        ]
    );
    // names survive the JSON-lines round trip (the marks are in memory only)
    let mut jsonl = Vec::new();
    trace.write_jsonl(&mut jsonl).unwrap();
    let back = Trace::read_jsonl(&jsonl[..]).unwrap();
    assert_eq!(back.events, trace.events);
    // an out-of-memory names the request that failed
    let Err(AllocError::OutOfMemory(r)) = too_big else {
        panic!("expected out of memory")
    };
    assert_eq!(r.name, "9.dense/dw");
    assert!(r.to_string().contains("9.dense/dw"), "{r}");
}

/// A replay allocates under the recorded names (scope and role), so that an out-of-memory in a
/// replay (a trainer's rehearsal, a plan's fit test) names the buffer; an unnamed event takes
/// its category's name, as before names were recorded.
#[test]
fn a_replay_names_its_allocations_as_recorded() {
    use stax_alloc::Tag;
    let caching = |capacity| {
        Allocator::new(
            Arc::new(SimMemory::new(capacity, 2 << 20)),
            Strategy::Caching,
        )
        .unwrap()
    };
    let recorder = caching(64 << 20);
    recorder.start_trace();
    let kept = {
        let _s = recorder.scope("3.parallel/0.conv");
        let x = recorder.allocate(1 << 20, Tag::new(Category::Activation, "output"));
        let ws = recorder.allocate(8 << 20, Category::Workspace);
        (x.unwrap(), ws.unwrap())
    };
    drop(kept);
    let mut trace = recorder.stop_trace();
    let mut unnamed = TraceBuilder::new();
    unnamed.alloc(4 << 20, Category::Gradient);
    trace.events.extend(unnamed.finish().events);
    // room for the first allocation only: the workspace's replay fails
    let Err(AllocError::OutOfMemory(r)) = replay(&trace, &caching(2 << 20)) else {
        panic!("expected out of memory")
    };
    assert_eq!(r.name, "3.parallel/0.conv/workspace");
    let roomy = caching(64 << 20);
    roomy.start_trace();
    replay(&trace, &roomy).unwrap();
    let names: Vec<String> = (roomy.stop_trace().events.iter())
        .filter(|e| e.op == TraceOp::Alloc)
        .map(|e| e.name.clone())
        .collect();
    let want = [
        "3.parallel/0.conv/output",
        "3.parallel/0.conv/workspace",
        "gradient",
    ];
    assert_eq!(names, want);
}

/// A trace's ideal peak past `u64::MAX` saturates, and frees after it still count.
#[test]
fn the_ideal_peak_of_huge_requests_saturates() {
    let line = |op: &str, id: u64, bytes: u64| {
        format!(
            "{{\"op\":\"{op}\",\"id\":{id},\"bytes\":{bytes},\"category\":\"other\",\"t_ns\":0,\"stream\":0}}\n"
        )
    };
    let half = 1u64 << 63;
    let text = line("alloc", 0, half) + &line("alloc", 1, half) + &line("free", 1, half);
    let trace = Trace::read_jsonl(text.as_bytes()).unwrap();
    assert_eq!(trace.peak_requested(), u64::MAX);
    let text = line("alloc", 0, half) + &line("free", 0, half) + &line("alloc", 1, 7);
    assert_eq!(
        Trace::read_jsonl(text.as_bytes()).unwrap().peak_requested(),
        half
    );
}

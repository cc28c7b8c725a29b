//! The static memory plan equals what the step measures, to the byte, on the CPU: the peak,
//! the bytes per category at the peak, and every allocation and free of the step (names
//! included), for the seed model at two batch sizes and for two other models (other paddings,
//! strides, depths, a pointwise conv, chunked im2col workspaces). The exports are checked on the
//! same runs: the Perfetto JSON's counters replay to the measured peak, and the plot's series
//! is the timeline.

use std::sync::Arc;

mod common;

use common::{batch, deep_model, seed_model, strided_model};

use stax::alloc::{Category, TraceOp};
use stax::train::export::{XAxis, perfetto_json, stacked_series};
use stax::train::plan::{MemoryPlan, NamedTrace};
use stax::train::{StepReport, Trainer};
use stax::{
    Adam, Backend, BackendOptions, Conv, Dense, Device, Flatten, Layer, Relu, Serial, Shape,
};

fn cpu(workspace_limit: Option<usize>) -> Arc<dyn Backend> {
    let options = BackendOptions {
        workspace_limit,
        ..BackendOptions::default()
    };
    Device::Cpu.open(&options).unwrap()
}

fn assert_matches(plan: &MemoryPlan, r: &StepReport) {
    assert_eq!(r.memory.peak, plan.peak.bytes, "step {} peak", r.step);
    for c in Category::ALL {
        assert_eq!(
            r.memory.at_peak(c),
            plan.peak.by_category[c.index()],
            "step {}: {c} at the peak",
            r.step
        );
    }
    assert_eq!(
        r.memory.live,
        plan.persistent_bytes(),
        "live after the step"
    );
}

/// Plans, then trains two steps with a recorded trace; checks plan == measured and returns
/// the plan and the run's trace.
fn plan_and_measure(
    model: fn() -> Serial,
    input: Shape,
    be: &Arc<dyn Backend>,
) -> (MemoryPlan, stax::alloc::Trace, Vec<StepReport>) {
    let adam = Adam::new(1e-3);
    let plan = MemoryPlan::new(&model(), &input, &adam, be).unwrap();
    let classes = plan.labels.dims()[1];
    be.allocator().start_trace();
    let mut trainer = Trainer::new(model(), input.clone(), adam, be, 7).unwrap();
    let mut reports = Vec::new();
    for _ in 0..2 {
        let (x, y) = batch(be, &input, classes);
        let r = trainer.step(&x, &y).unwrap();
        assert_matches(&plan, &r);
        reports.push(r);
    }
    let trace = be.allocator().stop_trace();
    (plan, trace, reports)
}

/// The recorded step's events are the plan's, name for name.
fn assert_same_events(plan: &MemoryPlan, trace: &stax::alloc::Trace) {
    let named = NamedTrace::of(trace);
    assert_eq!(named.step_starts.len(), 2, "two steps found in the trace");
    for &start in &named.step_starts {
        let step = &named.timeline.events[start..][..plan.timeline.events.len()];
        for (got, want) in step.iter().zip(&plan.timeline.events) {
            assert_eq!(
                (got.op, got.category, got.bytes, &got.name),
                (want.op, want.category, want.bytes, &want.name)
            );
        }
    }
}

#[test]
fn seed_model_plan_is_exact_at_two_batch_sizes() {
    let be = cpu(None);
    for n in [2, 7] {
        let (plan, trace, _) = plan_and_measure(seed_model, Shape::new([n, 10, 10, 3]), &be);
        assert_same_events(&plan, &trace);
        let names: Vec<&str> = plan.buffers.iter().map(|b| b.name.as_str()).collect();
        for want in [
            "0.conv/w",
            "0.conv/w/mu",
            "7.dense/b/nu",
            "input/images",
            "0.conv/output",
            "1.relu/mask",
            "2.conv/workspace",
            "5.dense/workspace",
            "loss/dlogits",
        ] {
            assert!(names.contains(&want), "{want} missing from {names:?}");
        }
        // Adam updates the dense weights in their backward passes: no whole weight gradient,
        // one chunk of it as workspace; the biases' gradients are collected as before
        assert!(!names.contains(&"5.dense/dw"), "{names:?}");
        assert!(names.contains(&"5.dense/db"), "{names:?}");
        // ReLU runs in place and the gradient of conv2's input is written over it
        let conv1 = plan
            .buffers
            .iter()
            .find(|b| b.name == "0.conv/output")
            .unwrap();
        assert_eq!(conv1.reused_as, ["1.relu/output", "2.conv/dx", "1.relu/dx"]);
        assert_eq!(conv1.bytes, (n * 10 * 10 * 64 * 4) as u64);
        let mask = plan
            .buffers
            .iter()
            .find(|b| b.name == "1.relu/mask")
            .unwrap();
        assert_eq!(mask.bytes, ((n * 10 * 10 * 64).div_ceil(32) * 4) as u64);
        // the plan's table names the peak
        let table = plan.to_string();
        assert!(table.contains("peak"), "{table}");
        assert!(table.contains("2.conv/workspace"), "{table}");
    }
}

#[test]
fn other_models_plan_is_exact() {
    // a small im2col bound splits the convs into many chunks of a few rows
    let (plan, trace, _) =
        plan_and_measure(strided_model, Shape::new([3, 9, 9, 2]), &cpu(Some(512)));
    assert_same_events(&plan, &trace);
    let ws = plan.peak.by_category[Category::Workspace.index()];
    assert!(plan.buffers.iter().any(|b| b.name == "2.conv/workspace"));
    assert!(ws <= 512, "workspace at the peak {ws}");

    let (plan, trace, _) = plan_and_measure(deep_model, Shape::new([2, 11, 10, 3]), &cpu(None));
    assert_same_events(&plan, &trace);
    // the pointwise conv is a plain GEMM: no workspace
    assert!(!plan.buffers.iter().any(|b| b.name == "0.conv/workspace"));
    assert!(plan.buffers.iter().any(|b| b.name == "4.conv/workspace"));
}

#[test]
fn exports_replay_to_the_measured_peak() {
    let be = cpu(None);
    let (plan, trace, reports) = plan_and_measure(seed_model, Shape::new([4, 8, 8, 3]), &be);
    let named = NamedTrace::of(&trace);
    let json = perfetto_json(&named.timeline, &named.step_starts, "stax-rs test");
    // it is JSON text that parses back, with the Trace Event Format's fields
    let text = serde_json::to_string(&json).unwrap();
    let back: serde_json::Value = serde_json::from_str(&text).unwrap();
    let events = back["traceEvents"].as_array().unwrap();
    // replay the counters: the highest total is the highest step peak the reports measured
    let mut peak = 0u64;
    for e in events.iter().filter(|e| e["ph"] == "C") {
        let total: u64 = e["args"]
            .as_object()
            .unwrap()
            .values()
            .map(|v| v.as_u64().unwrap())
            .sum();
        peak = peak.max(total);
    }
    let measured = reports.iter().map(|r| r.memory.peak).max().unwrap();
    assert_eq!(peak, measured);
    let slices = events.iter().filter(|e| e["ph"] == "X").count();
    let allocs = trace
        .events
        .iter()
        .filter(|e| e.op == TraceOp::Alloc)
        .count();
    assert_eq!(slices, allocs + 2, "one slice per buffer and per step");
    assert!(
        events
            .iter()
            .any(|e| e["ph"] == "X" && e["name"] == "2.conv/output")
    );
    assert!(
        events
            .iter()
            .any(|e| e["ph"] == "i" && e["name"].as_str().unwrap().starts_with("peak"))
    );
    // timestamps never go backwards on a lane
    let mut last: std::collections::HashMap<u64, f64> = Default::default();
    for e in events.iter().filter(|e| e["ph"] == "X") {
        let (tid, ts, dur) = (
            e["tid"].as_u64().unwrap(),
            e["ts"].as_f64().unwrap(),
            e["dur"].as_f64().unwrap(),
        );
        let end = last.entry(tid).or_insert(f64::MIN);
        if tid > 0 {
            assert!(ts >= *end, "overlapping slices on lane {tid}");
        }
        *end = ts + dur;
    }

    // the plot's data: the plan's step, stacked
    let s = stacked_series(&plan.timeline, XAxis::Events);
    assert_eq!(s.peak.1, plan.peak.bytes);
    assert!(
        s.peak
            .2
            .contains(&plan.allocated_at(plan.peak.event.unwrap()).unwrap().name)
    );
    let cats: Vec<Category> = s.layers.iter().map(|l| l.0).collect();
    for c in [
        Category::Parameter,
        Category::OptimizerState,
        Category::Input,
        Category::Activation,
        Category::Gradient,
        Category::Workspace,
    ] {
        assert!(cats.contains(&c), "{c} not drawn");
    }
    let total = &s.layers.last().unwrap().1;
    assert_eq!(total.len(), s.x.len());
    assert_eq!(
        total.iter().cloned().fold(0.0, f64::max),
        plan.peak.bytes as f64
    );
    assert_eq!(total[0], plan.persistent_bytes() as f64);
    assert!(s.x.len() > 2 * plan.timeline.events.len());
    let dir = std::env::temp_dir().join(format!("stax-plot-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let svg = dir.join("step.svg");
    stax::train::export::write_svg(&s, "seed model, one step", &svg).unwrap();
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.starts_with("<svg") && text.contains("polygon") || text.contains("path"));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A model, its input shape and the CPU's workspace limit.
type PlanCase = (fn() -> Serial, Shape, Option<usize>);

/// Each workspace buffer's headroom ([`MemoryPlan::workspace_headroom`]) is what it could grow
/// by and leave the planned peak as it is: grown by it in the timeline, the peak stays; one
/// byte more raises it by one. On the seed model, where the dense update's chunk is at the
/// peak, and on two others (chunked im2col workspaces); the table sums it up in one line.
#[test]
fn workspace_headroom_leaves_the_peak_alone() {
    let cases: [PlanCase; 3] = [
        (seed_model, Shape::new([4, 10, 10, 3]), None),
        (strided_model, Shape::new([3, 9, 9, 2]), Some(512)),
        (deep_model, Shape::new([2, 11, 10, 3]), None),
    ];
    for (model, input, limit) in cases {
        let plan = MemoryPlan::new(&model(), &input, &Adam::new(1e-3), &cpu(limit)).unwrap();
        let rows = plan.workspace_headroom();
        assert!(!rows.is_empty(), "{plan}");
        let workspaces = plan
            .buffers
            .iter()
            .filter(|b| b.category == Category::Workspace && b.alloc.is_some());
        assert_eq!(rows.len(), workspaces.count());
        let peak = plan.peak.bytes;
        for (b, room) in &rows {
            let grown = |by: u64| {
                let mut t = plan.timeline.clone();
                t.events[b.alloc.unwrap()].bytes += by;
                if let Some(f) = b.free {
                    t.events[f].bytes += by;
                }
                t.peak().bytes
            };
            assert_eq!(grown(*room), peak, "{} grown by {room}", b.name);
            assert_eq!(grown(room + 1), peak + 1, "{} grown by {room} + 1", b.name);
        }
        let table = plan.to_string();
        let line = format!("workspace headroom: {} buffers", rows.len());
        assert!(table.contains(&line), "{table}");
    }
    // the seed's dense chunk is live at the peak (the dense update is the step's largest point)
    let plan = MemoryPlan::new(
        &seed_model(),
        &Shape::new([4, 10, 10, 3]),
        &Adam::new(1e-3),
        &cpu(None),
    )
    .unwrap();
    let dense = plan
        .workspace_headroom()
        .into_iter()
        .find(|(b, _)| b.name == "5.dense/workspace");
    assert_eq!(dense.map(|(_, room)| room), Some(0), "{plan}");
}

#[test]
fn headroom_rule_widens_workspace_at_the_same_peak() {
    // conv2's im2col columns (2,400 output pixels of 576 floats: 5.5 MB) exceed the CPU's
    // default 4 MiB bound; the rule grows them where the step has room below its peak. An
    // explicit 4 MiB limit caps them: the behaviour before the rule.
    let input = Shape::new([24, 10, 10, 3]);
    let adam = Adam::new(1e-3);
    let (capped, free) = (cpu(Some(4 << 20)), cpu(None));
    let before = MemoryPlan::new(&seed_model(), &input, &adam, &free).unwrap();
    let headroom = before.op_headroom();
    assert!(!headroom.is_empty());
    // an op's headroom is at most that of each of its workspace buffers, and below the peak
    let least_buffer = before.workspace_headroom().iter().map(|(_, h)| *h).min();
    assert!(headroom.iter().all(|(_, h)| *h < before.peak.bytes));
    assert!(headroom.iter().map(|(_, h)| *h).min() >= least_buffer);
    assert_eq!(before.allot_headroom(&capped).unwrap(), 0, "the limit caps");
    let workspace = |p: &MemoryPlan| {
        p.buffers
            .iter()
            .filter(|b| b.name == "2.conv/workspace")
            .map(|b| b.bytes)
            .max()
            .unwrap()
    };
    let classes = before.labels.dims()[1];
    let mut runs = Vec::new();
    for be in [&capped, &free] {
        // the trainer allots at set-up (`Trainer::calibrate`)
        let mut trainer = Trainer::new(seed_model(), input.clone(), adam, be, 7).unwrap();
        let plan = trainer.plan(24).unwrap();
        let mut losses = Vec::new();
        for _ in 0..2 {
            let (x, y) = batch(be, &input, classes);
            let r = trainer.step(&x, &y).unwrap();
            assert_matches(&plan, &r);
            losses.push(r.loss);
        }
        runs.push((plan, losses, common::host_values(trainer.params().leaves())));
    }
    let [(old, old_losses, old_params), (new, new_losses, new_params)] = &runs[..] else {
        unreachable!()
    };
    assert_eq!(old.peak.bytes, before.peak.bytes);
    assert_eq!(new.peak.bytes, before.peak.bytes, "{new}");
    // whole rows of 576 floats within 4 MiB
    assert_eq!(workspace(old), (4 << 20) / 2304 * 2304);
    assert!(workspace(new) > workspace(old), "{new}");
    // more pixels per chunk: the same sums in another order
    for (a, b) in old_losses.iter().zip(new_losses) {
        assert!((a - b).abs() <= 1e-5 * a.abs(), "loss {a} vs {b}");
    }
    common::assert_rel_close(new_params, old_params, 1e-5, "parameters after two steps");
}

/// 3x3 SAME convs of `widths` outputs, each with its ReLU, then Flatten and Dense(2).
fn convs(widths: &[usize]) -> Serial {
    let mut layers: Vec<Box<dyn Layer>> = Vec::new();
    for &w in widths {
        layers.push(Box::new(Conv::same(w, (3, 3))));
        layers.push(Box::new(Relu));
    }
    layers.push(Box::new(Flatten));
    layers.push(Box::new(Dense(2)));
    Serial(layers)
}

#[test]
fn trainers_sharing_a_backend_do_not_pay_for_each_others_headroom() {
    // both models start with the same conv on the same input (one key of the backend's
    // allowances); its im2col columns (12,544 pixels of 144 floats: 7.2 MB) exceed 4 MiB
    let input = Shape::new([16, 28, 28, 16]);
    let (a, b, c) = (|| convs(&[32]), || convs(&[32, 8]), || convs(&[32, 32, 8]));
    let adam = Adam::new(1e-3);
    let alone = MemoryPlan::new(&b(), &input, &adam, &cpu(None)).unwrap();
    let shared = cpu(None);
    let first = Trainer::new(a(), input.clone(), adam, &shared, 7).unwrap();
    let planned = first.plan(16).unwrap();
    let widened = |p: &MemoryPlan| {
        let conv = p.buffers.iter().find(|b| b.name == "0.conv/workspace");
        conv.map_or(0, |b| b.bytes)
    };
    assert!(
        widened(&planned) > 4 << 20,
        "the first trainer's conv was widened"
    );
    let second = Trainer::new(b(), input.clone(), adam, &shared, 7).unwrap();
    // the second plans as if alone at most: the conv the first widened went back to the
    // limit, so the first's plan is lower than before, never higher (each is exact on a
    // backend of its own; here the allocator counts both trainers' buffers)
    let second_plan = second.plan(16).unwrap();
    assert!(second_plan.peak.bytes <= alone.peak.bytes, "{second_plan}");
    let now = first.plan(16).unwrap();
    assert!(now.peak.bytes <= planned.peak.bytes, "{now}");
    assert!(widened(&now) <= 4 << 20, "{now}");
    // a third with more room there leaves the claimed conv alone too (a fresh user's finding:
    // the second's revoke had freed it for the third, which raised the first's peak)
    let third = Trainer::new(c(), input.clone(), adam, &shared, 7).unwrap();
    let alone = MemoryPlan::new(&c(), &input, &adam, &cpu(None)).unwrap();
    assert!(third.plan(16).unwrap().peak.bytes <= alone.peak.bytes);
    for plan in [first.plan(16).unwrap(), second.plan(16).unwrap()] {
        assert!(widened(&plan) <= 4 << 20, "{plan}");
    }
    assert!(first.plan(16).unwrap().peak.bytes <= planned.peak.bytes);
}

//! `Trainer::profile_step`: the same update as `Trainer::step`, with every phase and every
//! layer's forward and backward pass timed. On the CPU (host clock) and, where there is one,
//! on the GPU (CUDA events), on a residual network with nested combinators.

mod common;

use common::{batch, cpu, cuda_or_skip, host_values, with_precision};
use stax::train::{StepProfile, Trainer};
use stax::{
    Adam, Backend, Conv, Dense, FanInSum, FanOut, Flatten, Identity, Precision, Relu, Serial,
    Shape, parallel, serial,
};
use std::collections::BTreeSet;
use std::sync::Arc;

/// Leaf layers under a `serial` root: `FanOut` into a `parallel` of a `serial` and an
/// `Identity` (the combinators are not leaves).
fn model() -> Serial {
    serial![
        Conv::same(4, (3, 3)),
        Relu,
        FanOut(2),
        parallel![serial![Conv::same(4, (3, 3)), Relu], Identity],
        FanInSum,
        Relu,
        Flatten,
        Dense(3)
    ]
}

/// The spans with no span inside: every layer but the combinators, and but the ReLUs, which
/// run in the conv's epilogue or in the `FanInSum`'s add (one span, the layer's before them).
const LEAVES: [&str; 7] = [
    "0.conv",
    "2.fan_out",
    "3.parallel/0.serial/0.conv",
    "3.parallel/1.identity",
    "4.fan_in_sum",
    "6.flatten",
    "7.dense",
];

fn trainer(be: &Arc<dyn Backend>, input: &Shape) -> Trainer<Serial> {
    Trainer::new(model(), input.clone(), Adam::new(1e-3), be, 7).unwrap()
}

/// Checks the profile's structure: the four phases in order, each leaf once per pass and
/// nothing else a leaf, the combinators spanning their leaves, every time finite, the leaves'
/// sum within their phase's time.
fn check(p: &StepProfile) {
    let phases: Vec<&str> = p.profile.phases.iter().map(|x| x.0).collect();
    assert_eq!(phases, ["forward", "loss", "backward", "update"]);
    for pass in ["forward", "backward"] {
        let leaves: BTreeSet<String> = p
            .profile
            .layers
            .iter()
            .filter(|l| l.leaf && l.phase == pass)
            .map(|l| l.path.to_string())
            .collect();
        let want: BTreeSet<String> = LEAVES.iter().map(|s| s.to_string()).collect();
        assert_eq!(leaves, want, "{pass}");
        let inner: Vec<String> = p
            .profile
            .layers
            .iter()
            .filter(|l| !l.leaf && l.phase == pass)
            .map(|l| l.path.to_string())
            .collect();
        assert_eq!(inner, ["3.parallel/0.serial", "3.parallel"], "{pass}");
        let phase_ms = p.profile.phases.iter().find(|x| x.0 == pass).unwrap().1;
        let leaf_ms: f64 = p
            .profile
            .layers
            .iter()
            .filter(|l| l.leaf && l.phase == pass)
            .map(|l| l.ms)
            .sum();
        assert!(
            leaf_ms <= phase_ms * 1.001 + 1e-3,
            "{pass}: {leaf_ms} > {phase_ms}"
        );
    }
    assert!(
        p.profile
            .layers
            .iter()
            .all(|l| l.ms.is_finite() && l.ms >= 0.0)
    );
    let kinds = p.by_kind();
    let count = |k: &str| kinds.iter().find(|t| t.kind == k).map(|t| t.count);
    assert_eq!(count("conv"), Some(2));
    assert_eq!(count("fan_in_sum"), Some(1));
    assert_eq!(count("relu"), None, "every ReLU runs fused");
    assert_eq!(count("dense"), Some(1));
    let text = p.to_string();
    assert!(text.contains("slowest layers:"), "{text}");
}

/// A profiled step is the same step: after `step` then `profile_step` the parameters and
/// both Adam moments equal, bit for bit, those after two `step`s.
fn profile_changes_nothing(be: &Arc<dyn Backend>) {
    let input = Shape::new([6, 9, 9, 2]);
    let (mut plain, mut profiled) = (trainer(be, &input), trainer(be, &input));
    let (x, y) = batch(be, &input, 3);
    plain.step(&x, &y).unwrap();
    plain.step(&x, &y).unwrap();
    profiled.step(&x, &y).unwrap();
    let p = profiled.profile_step(&x, &y).unwrap();
    assert_eq!(p.report.step, 2);
    check(&p);
    assert_eq!(
        host_values(plain.params().leaves()),
        host_values(profiled.params().leaves())
    );
    for field in ["mu", "nu"] {
        assert_eq!(
            host_values(plain.state().field(field)),
            host_values(profiled.state().field(field)),
            "{field}"
        );
    }
}

#[test]
fn profiled_step_is_the_step_with_every_layer_timed_on_the_cpu() {
    profile_changes_nothing(&cpu());
}

#[test]
fn profiled_step_is_the_step_with_every_layer_timed_on_the_gpu() {
    let Some(gpu) = cuda_or_skip(&with_precision(Precision::Highest)) else {
        return;
    };
    profile_changes_nothing(&gpu);
}

//! Rematerialization (`Remat`, `jax.checkpoint`): a rematerialized model trains to the same
//! bits as the plain one (ResNet blocks with Adam's dense update in the backward pass; a
//! dropout and a dense layer inside, collected), keeps exactly its output between the passes
//! where the plain model keeps its masks and inputs too (from the plan, to the byte), lowers
//! the shallow ResNet's planned peak and trains it to 95% with every step at its plan. Saving
//! outputs (`Remat::saving`) recomputes only what lies between them, and saving nothing is a
//! typed error. On the GPU the rematerialized ResNet's two steps equal the CPU's.
//! `tests/conformance.rs` runs its finite differences, GPU = CPU and plan = measured.

mod common;

use std::sync::Arc;

use common::checkpoint::state_bits;
use common::{Rng, cpu, private_gpu_with, two_steps_match_cpu};
use stax::models::{BnSpans, ResNet};
use stax::train::plan::MemoryPlan;
use stax::train::{Phase, Trainer};
use stax::{
    Adam, Backend, Category, Dense, Dropout, Layer, Precision, Relu, Remat, Serial, Shape, Tensor,
    serial,
};

/// The shallow ResNet of `tests/resnet.rs` (blocks `[1, 1, 1, 1]`, widths `[8, 16, 16, 16]`)
/// for 28x28 images, its blocks rematerialized or not.
fn shallow(remat: bool) -> Serial {
    shallow_for(remat, 28)
}

/// [`shallow`] for `img`x`img` images.
fn shallow_for(remat: bool, img: usize) -> Serial {
    shallow_with(if remat { 4 } else { 0 }, BnSpans::None, img)
}

/// The shallow ResNet for `img`x`img` images, the blocks of its first `remat_stages` stages
/// rematerialized, with or without [`ResNet::bn_spans`].
fn shallow_with(remat_stages: usize, bn_spans: BnSpans, img: usize) -> Serial {
    let net = ResNet {
        blocks: [1, 1, 1, 1],
        widths: [8, 16, 16, 16],
        classes: 2,
        remat_stages,
        bn_spans,
    };
    net.build((img, img, 1)).unwrap()
}

/// A trainer's parameters and state as bits, its count and step (`state_bits`).
type StateBits = (Vec<u32>, Vec<u32>, u32, u64);

/// `steps` training steps of `model` on `be` from seed 5 with Adam `adam`, each on fresh
/// random images (uniform in [-1, 1), labels alternating): the losses' bits, then the
/// trainer's state as bits.
fn run(
    model: Serial,
    input: &Shape,
    adam: Adam,
    be: &Arc<dyn Backend>,
    steps: usize,
) -> (Vec<u32>, StateBits) {
    let mut t = Trainer::new(model, input.clone(), adam, be, 5).unwrap();
    let n = input.dims()[0];
    let mut rng = Rng::new(17);
    let labels: Vec<f32> = (0..n * 2)
        .map(|i| (i % 2 == (i / 2) % 2) as u8 as f32)
        .collect();
    let losses = (0..steps)
        .map(|_| {
            let images = rng.vec(input.numel(), -1.0, 1.0);
            let x = Tensor::from_slice(be, &images, input.clone(), Category::Input).unwrap();
            let y = Tensor::from_slice(be, &labels, [n, 2], Category::Input).unwrap();
            t.step(&x, &y).unwrap().loss.to_bits()
        })
        .collect();
    (losses, state_bits(&t))
}

#[test]
fn a_rematerialized_resnet_trains_to_the_same_bits() {
    let (be, input) = (cpu(), Shape::new([6, 28, 28, 1]));
    let adam = Adam::new(1e-3);
    let plain = run(shallow(false), &input, adam, &be, 3);
    let remat = run(shallow(true), &input, adam, &be, 3);
    assert_eq!(plain.0, remat.0, "losses");
    assert!(
        plain.1 == remat.1,
        "parameters, moments, count or step differ"
    );
}

/// Dense, ReLU, Dropout, Dense, ReLU, optionally rematerialized, then the head `Dense(2)`.
fn mlp(remat: bool) -> Serial {
    let body = serial![Dense(64), Relu, Dropout::new(0.6), Dense(32), Relu];
    match remat {
        true => serial![Remat::new(body), Dense(2)],
        false => serial![body, Dense(2)],
    }
}

#[test]
fn a_dropout_inside_draws_the_same_mask_again() {
    // the dense layers inside a Remat are collected, so the plain model collects them too
    let (be, input) = (cpu(), Shape::new([8, 16]));
    let adam = Adam::new(1e-3).collecting();
    let plain = run(mlp(false), &input, adam, &be, 4);
    let remat = run(mlp(true), &input, adam, &be, 4);
    assert_eq!(plain.0, remat.0, "losses");
    assert!(
        plain.1 == remat.1,
        "parameters, moments, count or step differ"
    );
}

/// What the plan keeps under `prefix` from the forward pass into the backward pass: `(name,
/// bytes)` of every buffer allocated before the backward pass starts and freed after.
fn kept_across(plan: &MemoryPlan, prefix: &str) -> Vec<(String, u64)> {
    let start = backward_start(plan);
    plan.buffers
        .iter()
        .filter(|b| b.name.starts_with(prefix))
        .filter(|b| b.alloc.is_some_and(|a| a < start) && b.free.is_none_or(|f| f > start))
        .map(|b| (b.name.clone(), b.bytes))
        .collect()
}

/// The plan's step event at which the backward pass starts.
fn backward_start(plan: &MemoryPlan) -> usize {
    let backward = plan.phases.iter().find(|(p, _)| *p == Phase::Backward);
    backward.expect("a backward phase").1
}

/// `(name, bytes)` of every buffer under `prefix` the backward pass allocates (what a
/// rematerialization makes again), sorted.
fn made_in_backward(plan: &MemoryPlan, prefix: &str) -> Vec<(String, u64)> {
    let start = backward_start(plan);
    let mut made: Vec<(String, u64)> = plan
        .buffers
        .iter()
        .filter(|b| b.name.starts_with(prefix) && b.alloc.is_some_and(|a| a > start))
        .map(|b| (b.name.clone(), b.bytes))
        .collect();
    made.sort();
    made
}

#[test]
fn only_the_output_is_kept_between_the_passes() {
    let (be, input) = (cpu(), Shape::new([8, 16]));
    let plan = |model: Serial| {
        let t = Trainer::new(model, input.clone(), Adam::new(1e-3), &be, 0).unwrap();
        t.plan(8).unwrap()
    };
    // plain: the first ReLU's output (8 x 64 f32, the second dense layer's input), the dropout's
    // and both ReLUs' masks (one bit an element, in 32-bit words), and the body's output (8 x
    // 32 f32, the head's input)
    let mut plain = kept_across(&plan(mlp(false)), "0.serial/");
    plain.sort();
    let want = [
        ("0.serial/0.dense/output", 8 * 64 * 4),
        ("0.serial/1.relu/mask", 8 * 64 / 8),
        ("0.serial/2.dropout/mask", 8 * 64 / 8),
        ("0.serial/3.dense/output", 8 * 32 * 4),
        ("0.serial/4.relu/mask", 8 * 32 / 8),
    ];
    let want: Vec<(String, u64)> = want.iter().map(|(n, b)| (n.to_string(), *b)).collect();
    assert_eq!(plain, want);
    // rematerialized: only the output (its input is the model's input, kept by the step)
    let remat_plan = plan(mlp(true));
    let remat = kept_across(&remat_plan, "0.serial/");
    assert_eq!(remat, [("0.serial/3.dense/output".to_string(), 8 * 32 * 4)]);
    // the backward pass makes them again, named under `remat`
    let again: Vec<(String, u64)> = made_in_backward(&remat_plan, "0.serial/remat/")
        .into_iter()
        .map(|(name, bytes)| (name.replace("/remat/", "/"), bytes))
        .collect();
    assert_eq!(again, want);
}

#[test]
fn rematerialized_blocks_lower_the_resnets_planned_peak() {
    // at 56x56 the blocks' activations, not the stem's workspace, set the peak
    let (be, input) = (cpu(), Shape::new([50, 56, 56, 1]));
    let peak = |model: Serial| {
        let t = Trainer::new(model, input.clone(), Adam::new(1e-3), &be, 0).unwrap();
        t.plan(50).unwrap().peak.bytes
    };
    let (plain, remat) = (peak(shallow_for(false, 56)), peak(shallow_for(true, 56)));
    println!("shallow resnet, batch 50, 56x56: planned peak {plain} plain, {remat} remat");
    assert!(remat < plain, "{remat} >= {plain}");
}

#[test]
fn a_rematerialized_resnet_trains_on_the_gpu_as_on_the_cpu() {
    let Some(gpu) = private_gpu_with(Precision::Highest) else {
        return;
    };
    two_steps_match_cpu(|| shallow(true), &Shape::new([50, 28, 28, 1]), &gpu, 1e-3);
    // the batch-norm spans, alone and inside rematerialized blocks
    for (stages, spans) in [
        (0, BnSpans::Norms),
        (4, BnSpans::Norms),
        (0, BnSpans::ToEnd),
    ] {
        let input = Shape::new([50, 28, 28, 1]);
        two_steps_match_cpu(|| bn_spanned(stages, spans), &input, &gpu, 1e-3);
    }
}

#[test]
fn remat_keeps_its_layers_parameters_and_description() {
    let (plain, remat) = (mlp(false), mlp(true));
    let paths = |m: &Serial| param_specs(m).0;
    assert_eq!(paths(&plain), paths(&remat));
    assert_eq!(
        paths(&remat),
        [
            "0.serial/0.dense/w",
            "0.serial/0.dense/b",
            "0.serial/3.dense/w",
            "0.serial/3.dense/b",
            "1.dense/w",
            "1.dense/b"
        ]
    );
    // only the head's weight is updated in the backward pass
    let in_backward = param_specs(&remat).1;
    assert_eq!(in_backward, [false, false, false, false, true, false]);
    assert!(
        remat
            .describe()
            .starts_with("serial[remat(serial[dense(64)"),
        "{}",
        remat.describe()
    );
}

#[test]
fn a_checkpoint_resumes_with_or_without_remat() {
    let dir = common::checkpoint::scratch("remat");
    let (be, input) = (cpu(), Shape::new([4, 16]));
    let adam = Adam::new(1e-3).collecting();
    for (saved, loaded) in [(true, false), (false, true)] {
        let t = Trainer::new(mlp(saved), input.clone(), adam, &be, 3).unwrap();
        let path = dir.join(format!("remat-{saved}.npz"));
        t.save(&path, None).unwrap();
        let (back, _) = Trainer::load(mlp(loaded), input.clone(), adam, &be, &path).unwrap();
        assert!(state_bits(&t) == state_bits(&back), "saved remat {saved}");
    }
    // what a Remat saves is not structure either
    let body = || serial![Dense(64), Relu, Dropout::new(0.6), Dense(32), Relu];
    let saving = serial![Remat::new(body()).saving(&["dense"]), Dense(2)];
    let t = Trainer::new(saving, input.clone(), adam, &be, 3).unwrap();
    let path = dir.join("saving.npz");
    t.save(&path, None).unwrap();
    let (back, _) = Trainer::load(mlp(false), input.clone(), adam, &be, &path).unwrap();
    assert!(
        state_bits(&t) == state_bits(&back),
        "saved with a saving Remat"
    );
    // the structure inside the wrapper still counts
    let other = serial![Remat::new(serial![Dense(65), Relu]), Dense(2)];
    let t = Trainer::new(mlp(true), input.clone(), adam, &be, 3).unwrap();
    let path = dir.join("remat.npz");
    t.save(&path, None).unwrap();
    let err = Trainer::load(other, input, adam, &be, &path)
        .map(|_| ())
        .unwrap_err();
    assert!(err.to_string().contains("dense(65)"), "{err}");
}

#[test]
fn remat_stages_wrap_the_blocks_of_the_first_stages() {
    // ResNet-50's stages have 3, 4, 6 and 3 blocks
    for (stages, blocks) in [(0, 0), (1, 3), (2, 7), (3, 13), (4, 16)] {
        let net = ResNet {
            remat_stages: stages,
            ..ResNet::resnet50(10)
        };
        let text = net.build((64, 64, 3)).unwrap().describe();
        assert_eq!(text.matches("remat(").count(), blocks, "{stages} stages");
    }
}

#[test]
fn residuals_of_another_layer_are_a_mismatch() {
    use stax::layers::{LayerError, Value};
    let be = cpu();
    let (inner, remat) = (serial![Dense(3), Relu], Remat::new(serial![Dense(3), Relu]));
    let input = Shape::new([2, 4]);
    let (_, params) = common::init(&remat, &input, &be, 1);
    let x = Tensor::from_slice(&be, &[0.5f32; 8], input, Category::Input).unwrap();
    let mut sink = stax::Collect::new();
    let mut cx = stax::Cx::train(&be, &mut sink);
    // the plain serial's residuals (a node per layer) handed to the Remat
    let (y, residuals) = inner.apply(&params, Value::leaf(x), &mut cx).unwrap();
    let err = remat.vjp(&params, residuals, y, &mut cx, true).unwrap_err();
    match &err {
        LayerError::Mismatch { what, reason, .. } => {
            assert_eq!(*what, "residuals", "{err}");
            assert!(reason.contains("unexpected `0.dense`"), "{err}");
        }
        other => panic!("not a mismatch: {other}"),
    }
}

#[test]
fn saving_the_dense_outputs_recomputes_only_the_gelus() {
    use stax::Gelu;
    let (be, input) = (cpu(), Shape::new([8, 16]));
    let body = || serial![Dense(64), Gelu, Dense(32), Gelu];
    let plan = |model: Serial| {
        let t = Trainer::new(model, input.clone(), Adam::new(1e-3), &be, 0).unwrap();
        t.plan(8).unwrap()
    };
    let f32s = |name: &str, n: u64| (name.to_string(), n * 4);
    // plain: each dense output (a GELU's input) and each GELU output (the next layer's input)
    let mut plain = kept_across(&plan(serial![body(), Dense(2)]), "0.serial/");
    plain.sort();
    let mut want = vec![
        f32s("0.serial/0.dense/output", 8 * 64),
        f32s("0.serial/1.gelu/output", 8 * 64),
        f32s("0.serial/2.dense/output", 8 * 32),
        f32s("0.serial/3.gelu/output", 8 * 32),
    ];
    assert_eq!(plain, want);
    // saving the dense outputs: the first GELU's output is not kept, and the recomputation
    // makes only the GELUs' outputs (the dense layers are not run again)
    let saving = Remat::new(body()).saving(&["dense"]);
    let p = plan(serial![saving, Dense(2)]);
    let mut kept = kept_across(&p, "0.serial/");
    kept.sort();
    want.remove(1);
    assert_eq!(kept, want);
    let again = made_in_backward(&p, "0.serial/remat/");
    let want = [
        f32s("0.serial/remat/1.gelu/output", 8 * 64),
        f32s("0.serial/remat/3.gelu/output", 8 * 32),
    ];
    assert_eq!(again, want);
    // and it trains to the plain model's bits (the dense layers collected in both)
    let adam = Adam::new(1e-3).collecting();
    let with = run(
        serial![Remat::new(body()).saving(&["dense"]), Dense(2)],
        &input,
        adam,
        &be,
        3,
    );
    let without = run(serial![body(), Dense(2)], &input, adam, &be, 3);
    assert_eq!(with.0, without.0, "losses");
    assert!(with.1 == without.1, "state");
}

#[test]
fn saving_outputs_an_in_place_relu_copies_costs_no_more_than_recomputing_them() {
    // the ReLUs copy the saved (shared) dense outputs; those copies are freed as soon as the
    // next layer has used them, so saving costs no more than recomputing everything
    let (be, input) = (cpu(), Shape::new([512, 64]));
    let body = || serial![Dense(64), Relu, Dense(64), Relu, Dense(64), Relu];
    let peak = |model: Serial| {
        let adam = Adam::new(1e-3).collecting();
        let t = Trainer::new(model, input.clone(), adam, &be, 0).unwrap();
        t.plan(512).unwrap().peak.bytes
    };
    let remat = peak(serial![Remat::new(body()), Dense(2)]);
    let saving = peak(serial![Remat::new(body()).saving(&["dense"]), Dense(2)]);
    assert!(saving <= remat, "saving {saving} > recomputing {remat}");
}

#[test]
fn saving_what_nothing_inside_can_save_is_a_config_error() {
    let input = Shape::new([4, 16]);
    // a kind that is not inside, and one whose layers keep more than their input
    let cases: [(Serial, &str); 2] = [
        (
            serial![
                Remat::new(serial![Dense(8), Relu]).saving(&["conv"]),
                Dense(2)
            ],
            "conv",
        ),
        (
            serial![
                Remat::new(serial![Relu, Dense(8)]).saving(&["relu"]),
                Dense(2)
            ],
            "relu",
        ),
    ];
    for (model, kind) in cases {
        assert_config_error(model, &input, &format!("saving {kind}"));
    }
}

#[test]
fn a_rematerialized_shallow_resnet_reaches_95_percent_with_exact_memory() {
    // common::train checks every step's peak and live bytes against the plan
    let (accuracy, _) = common::train(shallow(true), Shape::new([50, 28, 28, 1]), &cpu(), 4);
    assert!(accuracy >= 0.95, "test accuracy {accuracy}");
}

/// [`spanned_for`] 28x28 images.
fn spanned(remat_stages: usize, spans: bool) -> Serial {
    spanned_for(remat_stages, spans, 28)
}

/// `ResNet { blocks: [2, 2, 1, 1], widths: [8, 16, 16, 16], classes: 2, remat_stages }` for
/// `img`x`img` images, with (`spans`) each later stage of two blocks one span saving its convs'
/// outputs: the first block a `Remat::new(block).spanning(2).saving(&["conv"])`.
fn spanned_for(remat_stages: usize, spans: bool, img: usize) -> Serial {
    use stax::models::{conv_block, identity_block};
    let net = ResNet {
        blocks: [2, 2, 1, 1],
        widths: [8, 16, 16, 16],
        classes: 2,
        remat_stages,
        bn_spans: BnSpans::None,
    };
    let Serial(plain) = net.build((img, img, 1)).unwrap();
    let mut layers: Vec<Box<dyn Layer>> = plain;
    for (stage, first) in [(0, 4), (1, 6)] {
        if spans && stage >= remat_stages {
            let (w, strides) = (net.widths[stage], [(1, 1), (2, 2)][stage]);
            let block = conv_block(3, [w, w, 4 * w], strides);
            layers[first] = Box::new(Remat::new(block).spanning(2).saving(&["conv"]));
            layers[first + 1] = Box::new(identity_block(3, [w, w], 4 * w));
        }
    }
    Serial(layers)
}

#[test]
fn a_resnet_with_stage_spans_trains_to_the_plain_bits() {
    let (be, input) = (cpu(), Shape::new([6, 28, 28, 1]));
    let adam = Adam::new(1e-3);
    let plain = run(spanned(0, false), &input, adam, &be, 3);
    for stages in [0, 1] {
        let with = run(spanned(stages, true), &input, adam, &be, 3);
        assert_eq!(plain.0, with.0, "losses, {stages} stages of blocks");
        assert!(plain.1 == with.1, "state, {stages} stages of blocks");
    }
    // the two stages of two blocks are spans, nothing else is rematerialized
    let text = spanned(0, true).describe();
    let spans = text.matches("remat(spanning 2, saving conv: ").count();
    assert_eq!((spans, text.matches("remat(").count()), (2, 2), "{text}");
}

/// Two conv blocks (3x3 SAME conv of 3 channels, BatchNorm, ReLU), the first spanning both
/// and saving their convs' outputs, or plain; then `Flatten, Dense(2)`.
fn two_conv_blocks(span: bool) -> Serial {
    use stax::{BatchNorm, Conv, Flatten, Padding};
    let block = || {
        serial![
            Conv::new(3, (3, 3), (1, 1), Padding::Same),
            BatchNorm::new(),
            Relu
        ]
    };
    let first: Box<dyn Layer> = match span {
        true => Box::new(Remat::new(block()).spanning(2).saving(&["conv"])),
        false => Box::new(block()),
    };
    Serial(vec![
        first,
        Box::new(block()),
        Box::new(Flatten),
        Box::new(Dense(2)),
    ])
}

/// A span whose first layer is a conv it saves, an activation after it: the conv stays unfused
/// so that its output is saved, and the backward pass does not run it again (a span's first
/// BatchNorm, a kind it does not save, fuses with its ReLU: `a_span_fuses_its_batch_norm..`).
#[test]
fn a_spans_first_conv_of_a_saved_kind_is_saved_not_fused() {
    use stax::{BatchNorm, Conv, Flatten, Padding};
    let (be, input) = (cpu(), Shape::new([4, 6, 6, 2]));
    let model = |len: usize| {
        let first = Remat::new(Conv::new(3, (3, 3), (1, 1), Padding::Same));
        let mut layers: Vec<Box<dyn Layer>> = vec![Box::new(first.spanning(len).saving(&["conv"]))];
        layers.push(Box::new(Relu));
        if len == 4 {
            layers.push(Box::new(Conv::new(3, (3, 3), (1, 1), Padding::Same)));
        }
        layers.extend([
            Box::new(BatchNorm::new()) as Box<dyn Layer>,
            Box::new(Flatten),
            Box::new(Dense(2)),
        ]);
        Serial(layers)
    };
    for len in [3, 4] {
        let t = Trainer::new(model(len), input.clone(), Adam::new(1e-3), &be, 0).unwrap();
        let plan = t.plan(4).unwrap();
        let again = made_in_backward(&plan, "remat/");
        let convs: Vec<&String> = again
            .iter()
            .map(|(n, _)| n)
            .filter(|n| n.contains("conv"))
            .collect();
        assert!(
            convs.is_empty(),
            "span of {len}: convs run again: {convs:?}"
        );
    }
}

#[test]
fn a_span_keeps_only_its_convs_outputs_and_norm_statistics_between_the_passes() {
    let (be, input) = (cpu(), Shape::new([4, 6, 6, 2]));
    let plan = |model: Serial| {
        let t = Trainer::new(model, input.clone(), Adam::new(1e-3), &be, 0).unwrap();
        t.plan(4).unwrap()
    };
    let outputs = 4 * 6 * 6 * 3 * 4; // a conv's (and a BatchNorm's) [4, 6, 6, 3] f32 output
    let in_blocks = |p: &MemoryPlan| {
        let mut kept = kept_across(p, "0.serial/");
        kept.extend(kept_across(p, "1.serial/"));
        kept.sort();
        kept
    };
    // plain: each conv's output (its BatchNorm's input), each BatchNorm's statistics and
    // ReLU mask (fused), the first block's output (the second conv's input)
    let plain = in_blocks(&plan(two_conv_blocks(false)));
    assert!(plain.contains(&("0.serial/1.batch_norm/output".to_string(), outputs)));
    // the span: the two conv outputs, its BatchNorms' statistics (3 channels, f32), and its
    // output (the dense head's input)
    let p = plan(two_conv_blocks(true));
    let stats = 3 * 4;
    let kept = [
        ("0.serial/0.conv/output", outputs),
        ("0.serial/1.batch_norm/mean", stats),
        ("0.serial/1.batch_norm/rstd", stats),
        ("1.serial/0.conv/output", outputs),
        ("1.serial/1.batch_norm/mean", stats),
        ("1.serial/1.batch_norm/output", outputs),
        ("1.serial/1.batch_norm/rstd", stats),
    ];
    let want: Vec<(String, u64)> = kept.iter().map(|&(n, b)| (n.to_string(), b)).collect();
    assert_eq!(in_blocks(&p), want);
    // the backward pass makes the BatchNorms' outputs again, named under `remat`, and no conv
    let made = made_in_backward(&p, "remat/");
    let again: Vec<&str> = made.iter().map(|(name, _)| name.as_str()).collect();
    assert!(
        again.contains(&"remat/0.serial/1.batch_norm/output"),
        "{again:?}"
    );
    assert!(
        again.contains(&"remat/1.serial/1.batch_norm/output"),
        "{again:?}"
    );
    assert!(
        !again.iter().any(|n| n.contains("conv/output")),
        "{again:?}"
    );
}

#[test]
fn stage_spans_lower_the_resnets_planned_peak() {
    let (be, input) = (cpu(), Shape::new([50, 56, 56, 1]));
    let peak = |spans: bool| {
        let model = spanned_for(0, spans, 56);
        let t = Trainer::new(model, input.clone(), Adam::new(1e-3), &be, 0).unwrap();
        t.plan(50).unwrap().peak.bytes
    };
    let (plain, spans) = (peak(false), peak(true));
    println!("resnet [2, 2, 1, 1], batch 50, 56x56: planned peak {plain} plain, {spans} spans");
    assert!(spans < plain, "{spans} >= {plain}");
}

#[test]
fn a_span_keeps_the_parameter_tree_and_collects_what_it_covers() {
    let spanning = serial![
        Remat::new(Dense(8)).spanning(2).saving(&["dense"]),
        Dense(8),
        Dense(2)
    ];
    let plain = serial![Dense(8), Dense(8), Dense(2)];
    let (paths, in_backward) = param_specs(&spanning);
    assert_eq!(paths, param_specs(&plain).0);
    assert_eq!(in_backward, [false, false, false, false, true, false]);
    assert!(
        spanning
            .describe()
            .starts_with("serial[remat(spanning 2, saving dense: dense(8)), dense(8)"),
        "{}",
        spanning.describe()
    );
    // and trains to the bits of the plain model collecting its dense weights
    let (be, input) = (cpu(), Shape::new([8, 16]));
    let adam = Adam::new(1e-3).collecting();
    let with = run(spanning, &input, adam, &be, 3);
    let without = run(plain, &input, adam, &be, 3);
    assert_eq!(with.0, without.0, "losses");
    assert!(with.1 == without.1, "state");
}

#[test]
fn a_checkpoint_resumes_with_or_without_stage_spans() {
    let dir = common::checkpoint::scratch("remat-span");
    let (be, input) = (cpu(), Shape::new([2, 28, 28, 1]));
    let adam = Adam::new(1e-3);
    for (saved, loaded) in [(true, false), (false, true)] {
        let t = Trainer::new(spanned(0, saved), input.clone(), adam, &be, 3).unwrap();
        let path = dir.join(format!("span-{saved}.npz"));
        t.save(&path, None).unwrap();
        let model = spanned(0, loaded);
        let (back, _) = Trainer::load(model, input.clone(), adam, &be, &path).unwrap();
        assert!(
            state_bits(&t) == state_bits(&back),
            "saved with spans {saved}"
        );
    }
}

#[test]
fn spans_that_do_not_fit_are_config_errors() {
    use stax::{FanInSum, FanOut, parallel};
    let input = Shape::new([4, 16]);
    let cases: [(Serial, &str); 5] = [
        (
            serial![Remat::new(Dense(16)).spanning(3), Dense(2)],
            "spanning 3 layers",
        ),
        (
            serial![
                Dense(16),
                Remat::new(Dense(16)).spanning(usize::MAX),
                Dense(2)
            ],
            "from layer 1 of 3",
        ),
        (
            serial![Remat::new(Dense(16)).spanning(0), Dense(2)],
            "spanning 0 layers",
        ),
        (
            serial![
                Remat::new(Dense(16)).spanning(2),
                Remat::new(Dense(16)).spanning(2),
                Dense(2)
            ],
            "none of them spanning (layer 1 spans too)",
        ),
        (
            serial![
                FanOut(2),
                parallel![Remat::new(serial![Dense(16), Relu]).spanning(2), Dense(16)],
                FanInSum,
                Dense(2)
            ],
            "a span runs as a layer of a serial",
        ),
    ];
    for (model, want) in cases {
        assert_config_error(model, &input, want);
    }
}

#[test]
fn a_resnet_with_stage_spans_trains_on_the_gpu_as_on_the_cpu() {
    let Some(gpu) = private_gpu_with(Precision::Highest) else {
        return;
    };
    two_steps_match_cpu(
        || spanned(1, true),
        &Shape::new([20, 28, 28, 1]),
        &gpu,
        1e-3,
    );
}

#[test]
fn a_resnet_with_stage_spans_reaches_95_percent_with_exact_memory() {
    // common::train checks every step's peak and live bytes against the plan
    let model = spanned(1, true);
    let (accuracy, _) = common::train(model, Shape::new([50, 28, 28, 1]), &cpu(), 4);
    assert!(accuracy >= 0.95, "test accuracy {accuracy}");
}

/// A trainer of `model` for `input` on the CPU is refused with a [`LayerError::Config`] whose
/// message holds `want`.
fn assert_config_error(model: Serial, input: &Shape, want: &str) {
    use stax::layers::LayerError;
    let err = Trainer::new(model, input.clone(), Adam::new(1e-3), &cpu(), 0)
        .map(|_| ())
        .unwrap_err();
    let text = err.to_string();
    let config = matches!(
        err,
        stax::train::TrainError::Layer(LayerError::Config { .. })
    );
    assert!(config && text.contains(want), "{text}");
}

/// The paths of `model`'s parameters for a `[2, 16]` input, and whether each is updated in
/// the backward pass.
fn param_specs(model: &Serial) -> (Vec<String>, Vec<bool>) {
    let specs = model
        .param_specs(&stax::Tree::leaf(Shape::new([2, 16])))
        .unwrap();
    let paths = specs.paths().iter().map(|(p, _)| p.to_string()).collect();
    let in_backward = specs
        .leaves()
        .iter()
        .map(|s| s.update_in_backward)
        .collect();
    (paths, in_backward)
}

/// [`shallow`] with [`ResNet::bn_spans`] `spans`, its first `remat_stages` stages' blocks
/// rematerialized too.
fn bn_spanned(remat_stages: usize, spans: BnSpans) -> Serial {
    shallow_with(remat_stages, spans, 28)
}

#[test]
fn a_resnet_with_batch_norm_spans_trains_to_the_plain_bits() {
    let (be, input) = (cpu(), Shape::new([6, 28, 28, 1]));
    let adam = Adam::new(1e-3);
    let plain = run(shallow(false), &input, adam, &be, 3);
    for spans in [BnSpans::Norms, BnSpans::ToEnd] {
        for stages in [0, 1] {
            let with = run(bn_spanned(stages, spans), &input, adam, &be, 3);
            assert_eq!(plain.0, with.0, "losses, {spans:?}, {stages} remat stages");
            assert!(plain.1 == with.1, "state, {spans:?}, {stages} remat stages");
        }
    }
    // two spans in each of the 4 blocks, nothing else rematerialized
    let text = bn_spanned(0, BnSpans::Norms).describe();
    let spans = text
        .matches("remat(spanning 3, saving conv: batch_norm")
        .count();
    assert_eq!((spans, text.matches("remat(").count()), (8, 8), "{text}");
    // with ToEnd, the second one of each block spans to its end and saves nothing
    let text = bn_spanned(0, BnSpans::ToEnd).describe();
    let ends = text.matches("remat(spanning 4: batch_norm").count();
    let saving = text
        .matches("remat(spanning 3, saving conv: batch_norm")
        .count();
    assert_eq!((ends, saving), (4, 4), "{text}");
}

/// A span's first BatchNorm runs its ReLU in its own kernels, as the plain model's do: no
/// ReLU of the spanned models is a layer of its own (the blocks' last ones run in their sums).
#[test]
fn a_span_fuses_its_batch_norm_and_relu_as_the_plain_model() {
    let (be, input) = (cpu(), Shape::new([6, 28, 28, 1]));
    let mut rng = Rng::new(23);
    let x = rng.vec(input.numel(), -1.0, 1.0);
    let x = Tensor::from_slice(&be, &x, input.clone(), Category::Input).unwrap();
    let labels: Vec<f32> = (0..12).map(|i| (i % 2) as f32).collect();
    let y = Tensor::from_slice(&be, &labels, [6, 2], Category::Input).unwrap();
    for spans in [BnSpans::None, BnSpans::Norms, BnSpans::ToEnd] {
        let model = bn_spanned(0, spans);
        let mut t = Trainer::new(model, input.clone(), Adam::new(1e-3), &be, 5).unwrap();
        let profile = t.profile_step(&x, &y).unwrap().profile;
        let relus: Vec<String> = profile
            .layers
            .iter()
            .filter(|l| l.kind == "relu")
            .map(|l| l.path.to_string())
            .collect();
        assert!(relus.is_empty(), "{spans:?}: ReLUs run apart: {relus:?}");
        // inside a span a layer has two backward spans (run again, then its backward pass),
        // the block's first conv (outside any span) one
        let convs = |name: &str| {
            let backward = profile.layers.iter().filter(|l| l.phase == "backward");
            let path = format!("4.serial/1.parallel/0.serial/{name}");
            backward.filter(|l| l.path.to_string() == path).count()
        };
        let inside = if spans == BnSpans::None { 1 } else { 2 };
        assert_eq!((convs("0.conv"), convs("3.conv")), (1, inside), "{spans:?}");
        let norms = profile.layers.iter().filter(|l| l.kind == "batch_norm");
        assert!(norms.count() > 0, "{spans:?}: no BatchNorm timed");
    }
}

#[test]
fn a_resnet_with_batch_norm_spans_reaches_95_percent_with_exact_memory() {
    // common::train checks every step's peak and live bytes against the plan
    for spans in [BnSpans::Norms, BnSpans::ToEnd] {
        let model = bn_spanned(0, spans);
        let (accuracy, _) = common::train(model, Shape::new([50, 28, 28, 1]), &cpu(), 4);
        assert!(accuracy >= 0.95, "{spans:?}: test accuracy {accuracy}");
    }
}

/// ResNet-50's f32 CPU plan at batch 128, 224x224, 1000 classes: the batch-norm spans take
/// the BatchNorm outputs the blocks' second and third convs read off the peak, and with the
/// first stage rematerialized the step plans below 0.6x JAX's measured peak (issue 10's bar:
/// `jax_resnet50_anchor.py default 128`, 11,276,138,752 bytes, BENCHMARKS.md).
#[test]
fn batch_norm_spans_lower_resnet50s_planned_peak() {
    let be = cpu();
    let input = Shape::new([128, 224, 224, 3]);
    let peak = |remat_stages, bn_spans| {
        let net = ResNet {
            remat_stages,
            bn_spans,
            ..ResNet::resnet50(1000)
        };
        let model = net.build((224, 224, 3)).unwrap();
        let plan = MemoryPlan::new(&model, &input, &Adam::new(1e-3), &be).unwrap();
        plan.peak.bytes
    };
    let (plain, spans) = (peak(0, BnSpans::None), peak(0, BnSpans::Norms));
    // each block's first two BatchNorm outputs (f32): 16 blocks, 224 / 4 = 56 pixels a side in
    // the first stage, halved in each later one; at least the first stage's leave the peak
    let stage1: u64 = 3 * 2 * 128 * 56 * 56 * 64 * 4;
    assert!(spans + stage1 <= plain, "{spans} + {stage1} > {plain}");
    let bar = 11_276_138_752 * 6 / 10;
    let remat1 = peak(1, BnSpans::Norms);
    assert!(remat1 <= bar, "remat 1 with spans: {remat1} > {bar}");
    assert!(
        peak(1, BnSpans::None) > bar,
        "remat 1 alone already under the bar"
    );
    // spans to the blocks' ends: every block's last conv output (4x its width, f32) leaves
    // the peak but the one being recomputed, and with no stage rematerialized the step plans
    // under the bar
    let ends = peak(0, BnSpans::ToEnd);
    let last_convs: u64 = [
        (3u64, 56u64, 256u64),
        (4, 28, 512),
        (6, 14, 1024),
        (3, 7, 2048),
    ]
    .iter()
    .map(|&(blocks, side, c)| blocks * 128 * side * side * c * 4)
    .sum();
    let largest = 128 * 56 * 56 * 256 * 4;
    assert!(
        ends + last_convs - largest <= spans,
        "{ends} + {last_convs} - {largest} > {spans}"
    );
    assert!(ends <= bar, "spans to the blocks' ends: {ends} > {bar}");
}

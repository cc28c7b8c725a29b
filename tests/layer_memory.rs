//! What issue 10's layers keep, from the plan of a training step (which equals the measured
//! step: tests/conformance.rs): Dropout and the leaky ReLU a bit mask and nothing else,
//! Softmax and LogSoftmax nothing of their own (in place, their output kept), GELU one output
//! buffer (its input kept for its backward pass).

use stax::train::Trainer;
use stax::train::plan::MemoryPlan;
use stax::{
    Adam, BackendOptions, DType, Dense, Device, Dropout, Gelu, LeakyRelu, LogSoftmax,
    NegLogLikelihood, Shape, Softmax, serial,
};

fn plan(model: stax::Serial, input: [usize; 2]) -> MemoryPlan {
    let be = Device::Cpu.open(&BackendOptions::default()).unwrap();
    let loss = NegLogLikelihood;
    let t = Trainer::with_loss(model, Shape::new(input), Adam::new(1e-3), loss, &be, 0).unwrap();
    t.plan(input[0]).unwrap()
}

/// The buffers the plan allocates under a layer's path (`1.dropout/...`).
fn allocated<'p>(plan: &'p MemoryPlan, layer: &str) -> Vec<&'p str> {
    let prefix = format!("{layer}/");
    plan.buffers
        .iter()
        .filter(|b| b.name.starts_with(&prefix))
        .map(|b| b.name.as_str())
        .collect()
}

/// Whether some buffer is reused as `role` (an in-place layer's output or gradient).
fn reused_as(plan: &MemoryPlan, role: &str) -> bool {
    plan.buffers
        .iter()
        .any(|b| b.reused_as.iter().any(|r| r == role))
}

#[test]
fn dropout_and_leaky_relu_keep_one_bit_an_element() {
    let model = serial![
        Dense(50),
        Dropout::new(0.5),
        LeakyRelu,
        Dense(3),
        LogSoftmax
    ];
    let p = plan(model, [10, 8]);
    for (layer, mask) in [
        ("1.dropout", "1.dropout/mask"),
        ("2.leaky_relu", "2.leaky_relu/mask"),
    ] {
        assert_eq!(allocated(&p, layer), [mask], "{layer}");
        let m = p.buffers.iter().find(|b| b.name == mask).unwrap();
        // 500 elements: 16 words of 32 bits
        assert_eq!((m.bytes, m.dtype), (64, Some(DType::U32)), "{mask}");
        assert!(
            reused_as(&p, &format!("{layer}/output")),
            "{layer} runs in place"
        );
    }
}

#[test]
fn softmaxes_run_in_place_and_gelu_keeps_its_input() {
    let model = serial![Dense(6), Softmax, Gelu, Dense(3), LogSoftmax];
    let p = plan(model, [4, 5]);
    for layer in ["1.softmax", "4.log_softmax"] {
        assert!(
            allocated(&p, layer).is_empty(),
            "{layer}: {:?}",
            allocated(&p, layer)
        );
        assert!(
            reused_as(&p, &format!("{layer}/output")),
            "{layer} in place"
        );
        assert!(
            reused_as(&p, &format!("{layer}/dx")),
            "{layer} backward in place"
        );
    }
    assert_eq!(allocated(&p, "2.gelu"), ["2.gelu/output"]);
    let x = p
        .buffers
        .iter()
        .find(|b| b.name == "0.dense/output")
        .unwrap();
    let gelu = p
        .buffers
        .iter()
        .find(|b| b.name == "2.gelu/output")
        .unwrap();
    assert!(
        x.free > gelu.alloc,
        "GELU's input lives into the backward pass"
    );
}

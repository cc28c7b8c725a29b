//! What neighbours in a `serial` hand each other, each saving a pass over an activation or a
//! gradient: a `parallel` whose outputs a `FanInSum` and a ReLU sum runs its last branch first
//! and its first branch's `BatchNorm` adds that output in its own pass (ResNet's block ends);
//! the ReLU mask of a `FanInSum` that the next block's `FanOut` applies while it sums its
//! branches' gradients; the per-channel sums of a `BatchNorm`'s input gradient that the conv
//! before it takes as its bias gradient. Each model trains as the same model with the
//! hand-off refused: on the CPU the same losses, parameters and Adam moments bit for bit, on the
//! GPU where there is one the same losses (see `backend_pairs`); every step's peak the plan's.

mod common;

use common::{host_values, private_cuda_with, with_precision};
use stax::layers::{Cx, DySums, LayerError, ParamSpec, Residuals, Shapes, Value};
use stax::tensor::{Backend, BackendOptions, Device, Params, Tree};
use stax::train::Trainer;
use stax::train::data::{Loader, fashion_mnist_2class};
use stax::{
    BatchNorm, Conv, Dense, FanInSum, FanOut, Flatten, Identity, Layer, Precision, Relu, Remat,
    Serial, Shape, Tensor, parallel, serial,
};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// `layer` with the hand-offs it takes counted (`on`), or refused (the layer before or after
/// it then does that work itself).
#[derive(Debug)]
struct Counted<L> {
    layer: L,
    count: Arc<AtomicUsize>,
    on: bool,
}

impl<L: Layer> Layer for Counted<L> {
    fn kind(&self) -> &'static str {
        self.layer.kind()
    }
    fn output_shape(&self, input: &Shapes) -> Result<Shapes, LayerError> {
        self.layer.output_shape(input)
    }
    fn param_specs(&self, input: &Shapes) -> Result<Tree<ParamSpec>, LayerError> {
        self.layer.param_specs(input)
    }
    fn apply(
        &self,
        p: &Params,
        x: Value,
        cx: &mut Cx<'_>,
    ) -> Result<(Value, Residuals), LayerError> {
        self.layer.apply(p, x, cx)
    }
    fn vjp(
        &self,
        p: &Params,
        r: Residuals,
        dy: Value,
        cx: &mut Cx<'_>,
        need_dx: bool,
    ) -> Result<Option<Value>, LayerError> {
        self.layer.vjp(p, r, dy, cx, need_dx)
    }
    fn residuals_from_input(&self, x: &Value) -> Result<Option<Residuals>, LayerError> {
        self.layer.residuals_from_input(x)
    }
    fn masks_dx(&self) -> bool {
        self.on && self.layer.masks_dx()
    }
    fn vjp_masking_dx(
        &self,
        p: &Params,
        r: Residuals,
        dy: Value,
        cx: &mut Cx<'_>,
        mask: &Tensor,
    ) -> Result<Option<Value>, LayerError> {
        self.count.fetch_add(1, Ordering::Relaxed);
        self.layer.vjp_masking_dx(p, r, dy, cx, mask)
    }
    fn takes_dy_sums(&self) -> bool {
        self.on && self.layer.takes_dy_sums()
    }
    fn runs_summed(&self) -> bool {
        self.on && self.layer.runs_summed()
    }
    fn apply_summed(
        &self,
        p: &Params,
        x: Value,
        cx: &mut Cx<'_>,
        mask: &mut Tensor,
    ) -> Result<(Value, Residuals), LayerError> {
        self.count.fetch_add(1, Ordering::Relaxed);
        self.layer.apply_summed(p, x, cx, mask)
    }
    fn vjp_with_dy_sums(
        &self,
        p: &Params,
        r: Residuals,
        dy: Value,
        cx: &mut Cx<'_>,
        sums: (bool, DySums),
    ) -> Result<Option<Value>, LayerError> {
        self.count.fetch_add(1, Ordering::Relaxed);
        self.layer.vjp_with_dy_sums(p, r, dy, cx, sums)
    }
}

/// The hand-offs of `layer`, counted into `count` when `on`.
fn counted<L: Layer + 'static>(layer: L, count: &Arc<AtomicUsize>, on: bool) -> Box<dyn Layer> {
    let count = count.clone();
    Box::new(Counted { layer, count, on })
}

/// A workspace limit below every conv's headroom in these small models: on the CPU a model
/// and its twin with the hand-off refused (whose memory timelines differ) give their convs the
/// same workspace, and so add their filter gradients' chunks in the same order.
const WORKSPACE: usize = 1 << 16;

/// Two backends of one device, and whether their results are compared bit for bit.
type Pair = (Arc<dyn Backend>, Arc<dyn Backend>, bool);

/// The CPU backend under [`WORKSPACE`] (bit for bit), and where there is one the CUDA backend
/// with cuDNN's deterministic choices: cuDNN lists no deterministic algorithm for every pass
/// under so small a limit, and under the usual one twins with other memory timelines may get
/// other algorithms, so there the losses are compared, to 1e-5 (the kernels of each hand-off
/// are checked bit for bit against the unfused ones in `gpu_convs.rs` and `gpu_mixed.rs`).
fn backend_pairs() -> Vec<Pair> {
    let options = BackendOptions {
        workspace_limit: Some(WORKSPACE),
        ..with_precision(Precision::Highest)
    };
    let cpu = || Device::Cpu.open(&options).unwrap();
    let gpu = || {
        let be = private_cuda_with(Precision::Highest)?;
        be.set_deterministic(true);
        Some(be as Arc<dyn Backend>)
    };
    let gpus = gpu().zip(gpu()).map(|(a, b)| (a, b, false));
    [Some((cpu(), cpu(), true)), gpus]
        .into_iter()
        .flatten()
        .collect()
}

/// Three training steps of `make(true)` (hand-offs on) and `make(false)` on the CPU and on the
/// GPU: `per_step` hand-offs a step, every step's peak the plan's, and the losses, parameters
/// and Adam moments equal bit for bit (only the losses, to 1e-5, on the GPU: [`backend_pairs`]).
fn trains_as_without(make: impl Fn(bool, &Arc<AtomicUsize>) -> Serial, per_step: usize) {
    let (train_set, _) = fashion_mnist_2class().unwrap();
    let input = Shape::new([20, 28, 28, 1]);
    for (bf, ba, exact) in backend_pairs() {
        let count = Arc::new(AtomicUsize::new(0));
        let adam = stax::Adam::new(1e-3);
        let mut on = Trainer::new(make(true, &count), input.clone(), adam, &bf, 5).unwrap();
        let mut off = Trainer::new(make(false, &count), input.clone(), adam, &ba, 5).unwrap();
        let plan = on.plan(20).unwrap().peak.bytes;
        let plan_off = off.plan(20).unwrap().peak.bytes;
        let loader = Loader::new(train_set.len(), 20, 5).unwrap();
        let before = count.load(Ordering::Relaxed);
        let tol = if exact { 0.0 } else { 1e-5 };
        let close = |a: f32, b: f32| (a - b).abs() <= tol * a.abs().max(b.abs());
        let device = bf.device();
        for indices in loader.batches(0).take(3) {
            let (xf, yf) = on.place_batch(&train_set, &indices).unwrap();
            let (xa, ya) = off.place_batch(&train_set, &indices).unwrap();
            let (rf, ra) = (on.step(&xf, &yf).unwrap(), off.step(&xa, &ya).unwrap());
            let losses = (rf.loss, ra.loss);
            assert!(close(losses.0, losses.1), "{device} losses {losses:?}");
            let peaks = (rf.memory.peak, ra.memory.peak);
            assert_eq!(peaks, (plan, plan_off), "{device}");
        }
        let counted = count.load(Ordering::Relaxed) - before;
        assert_eq!(counted, 3 * per_step, "{device}");
        if !exact {
            continue;
        }
        let bits = |t: Vec<f32>| t.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        let values = |t: &Trainer<Serial>| bits(host_values(t.params().leaves()));
        assert_eq!(values(&on), values(&off), "{device} parameters");
        for field in ["mu", "nu"] {
            let (f, a) = (on.state().field(field), off.state().field(field));
            assert_eq!(
                bits(host_values(f)),
                bits(host_values(a)),
                "{device} {field}"
            );
        }
    }
}

/// A block as ResNet's: `fan_out parallel(serial(Conv, Relu, Conv), Identity) FanInSum Relu`.
fn block(fan_out: Box<dyn Layer>) -> Serial {
    let main = serial![Conv::same(8, (3, 3)), Relu, Conv::same(8, (3, 3))];
    Serial(vec![
        fan_out,
        Box::new(parallel![main, Identity]),
        Box::new(FanInSum),
        Box::new(Relu),
    ])
}

/// Between two blocks the second one's `FanOut` sums its gradients and applies the first
/// one's ReLU mask in one pass (`ops::binary_masked`): bit for bit the unfused blocks, where
/// the ReLU masks its gradient on its own.
#[test]
fn fan_out_masks_the_gradient_of_the_block_before_as_the_blocks_apart() {
    let make = |on: bool, count: &Arc<AtomicUsize>| {
        Serial(vec![
            Box::new(Conv::same(8, (3, 3))),
            Box::new(Relu),
            Box::new(block(Box::new(FanOut(2)))),
            Box::new(block(counted(FanOut(2), count, on))),
            Box::new(Flatten),
            Box::new(Dense(2)),
        ])
    };
    trains_as_without(make, 1);
}

/// A conv before a `BatchNorm` (fused with its ReLU, and alone) takes its bias gradient from
/// the norm's backward pass, which sums the input gradient it writes (8 channels: in the
/// vectorized kernel on the GPU; 12: after it): as the conv's own bias gradient.
#[test]
fn conv_takes_its_bias_gradient_from_the_batch_norm_after_it() {
    let make = |on: bool, count: &Arc<AtomicUsize>| {
        Serial(vec![
            counted(Conv::same(8, (3, 3)), count, on),
            Box::new(BatchNorm::new()),
            Box::new(Relu),
            counted(Conv::same(12, (3, 3)), count, on),
            Box::new(BatchNorm::new()),
            Box::new(Flatten),
            Box::new(Dense(2)),
        ])
    };
    trains_as_without(make, 2);
}

/// ResNet's blocks with `BatchNorm`s (an identity block, then a conv block of 12 channels):
/// each block's `parallel` runs its shortcut first and the main path's last `BatchNorm` adds
/// it, with the ReLU, in its own kernel (`ops::batch_norm_add_relu`): bit for bit the blocks
/// that sum and mask in their `FanInSum`.
#[test]
fn block_ends_add_in_the_batch_norm_as_in_the_sum() {
    let main = |c: usize| {
        serial![
            Conv::same(8, (1, 1)),
            BatchNorm::new(),
            Relu,
            Conv::same(c, (3, 3)),
            BatchNorm::new()
        ]
    };
    let make = |on: bool, count: &Arc<AtomicUsize>| {
        let end = |branches: Box<dyn Layer>| {
            Serial(vec![
                Box::new(FanOut(2)),
                branches,
                Box::new(FanInSum),
                Box::new(Relu),
            ])
        };
        let shortcut = serial![Conv::same(12, (1, 1)), BatchNorm::new()];
        Serial(vec![
            Box::new(Conv::same(8, (3, 3))),
            Box::new(Relu),
            Box::new(end(counted(parallel![main(8), Identity], count, on))),
            Box::new(end(counted(parallel![main(12), shortcut], count, on))),
            Box::new(Flatten),
            Box::new(Dense(2)),
        ])
    };
    trains_as_without(make, 2);
}

/// The same across the ends of a rematerialized span (`Remat::new(BatchNorm).spanning(3)`, as
/// ResNet's `--remat-bn`): the span's first `BatchNorm` sums for the conv before the span, and
/// the conv the span ends with takes its sums from the `BatchNorm` after it.
#[test]
fn conv_takes_its_bias_gradient_across_a_span() {
    let make = |on: bool, count: &Arc<AtomicUsize>| {
        let span = Remat::new(BatchNorm::new()).spanning(3).saving(&["conv"]);
        Serial(vec![
            counted(Conv::same(8, (3, 3)), count, on),
            Box::new(span),
            Box::new(Relu),
            counted(Conv::same(8, (3, 3)), count, on),
            Box::new(BatchNorm::new()),
            Box::new(Flatten),
            Box::new(Dense(2)),
        ])
    };
    trains_as_without(make, 2);
}

//! Helpers shared by the integration tests (the one allowed `mod.rs`: Cargo would otherwise
//! build it as a test of its own).
//!
//! - [`cuda_or_skip`]: the CUDA backend, or `None` with a printed skip notice on machines
//!   without a GPU; with `STAX_REQUIRE_GPU=1` a missing GPU fails the test instead.
//! - [`cpu`]: the CPU backend, the oracle GPU results are compared with.
//! - [`poison`]: fill an output with NaN (or a bit pattern) before an op writes it.
//! - [`assert_close`], [`assert_rel_close`]: comparisons that print the worst element.
//! - [`Rng`], [`random_tensor`]: seeded inputs, reproducible but different per seed.
//! - [`small_model`], [`strided_model`], [`deep_model`], [`batch`]: models for whole training
//!   steps (the seed's is `stax::models::seed_cnn`) and deterministic batches for them;
//!   [`host_values`], tensors as one host vector.
//! - [`init`], [`apply`], [`apply_train`], [`vjp`]: one layer's parameters, forward pass
//!   (evaluation or training mode) and backward pass (gradients collected into a tree like the
//!   parameters); [`layers`]: finite differences and GPU-vs-CPU for one layer.
//! - [`fixtures`]: the JAX fixtures agree with what their scripts write now.
//! - [`assert_workspace_is_the_schedule`], [`private_gpu_or_skip`]: an op's workspace
//!   allocations are its schedule, on a backend of its own.
//! - [`two_steps_match_cpu`]: two training steps on the GPU equal the CPU's; [`train`]: a
//!   model trained on the embedded data with every step's memory equal to the plan.
#![allow(dead_code)]

pub mod checkpoint;
pub mod fixtures;
pub mod layers;

use stax_tensor::cuda::CudaBackend;
use stax_tensor::{
    Backend, BackendOptions, Category, DType, Device, Precision, Shape, Strategy, Tensor,
};
use std::io::Write;
use std::sync::{Arc, Mutex};

/// `[n, h, w, 64]` NHWC inputs with a 3x3 HWIO kernel to 64 channels under `padding`: the
/// convolutions of the wgmma kernels (`gpu_wgmma_wgrad`, `gpu_wgmma_conv`).
pub fn conv3x3_c64(x: [usize; 4], padding: stax_tensor::Padding) -> stax_tensor::Conv2dGeometry {
    let spec = stax_tensor::ConvSpec {
        padding,
        ..stax_tensor::ConvSpec::default()
    };
    stax_tensor::Conv2dGeometry::with_spec(&x.into(), &[3, 3, 64, 64].into(), &spec).unwrap()
}

/// Calibrates `pass` of `g` (f32, with a bias) on `cuda` and checks the timed choice between
/// cuDNN and a direct kernel: exactly one direct candidate, timed; the plan's algorithm is
/// the kernel exactly when `conv_is_direct` says so, with the kernel's time, else no slower
/// than the kernel. Returns the plan.
pub fn assert_timed_choice(
    cuda: &CudaBackend,
    g: &stax_tensor::Conv2dGeometry,
    pass: stax_tensor::ConvPass,
) -> stax_tensor::cuda::ConvPlanInfo {
    let plan = calibrated_plan(cuda, g, pass);
    let is_direct = |name: &str| name.starts_with("stax direct");
    let direct: Vec<_> = plan
        .candidates
        .iter()
        .filter(|c| is_direct(&c.algorithm))
        .collect();
    assert_eq!(direct.len(), 1, "{plan:#}");
    let ms = direct[0].time_ms.expect("the kernel was timed");
    let chosen = is_direct(&plan.algorithm);
    assert_eq!(cuda.conv_is_direct(g, DType::F32, pass), chosen, "{plan:#}");
    match chosen {
        true => assert_eq!(plan.time_ms, ms, "{plan:#}"),
        false => assert!(plan.time_ms <= ms, "{plan:#}"),
    }
    plan
}

/// Whether `STAX_REQUIRE_GPU=1` is set (on the GPU machine: a missing GPU is a failure).
pub fn gpu_required() -> bool {
    std::env::var("STAX_REQUIRE_GPU").is_ok_and(|v| v == "1")
}

/// The CUDA backend on device 0 opened with `options`, or `None` after printing
/// `skipped: no CUDA device (<error>)`. Panics with the error instead when `STAX_REQUIRE_GPU=1`.
///
/// Backends with the default strategy and workspace limit are opened once per process and
/// precision and shared, so tests do not pay for handles and module loads again.
pub fn cuda_backend_or_skip(options: &BackendOptions) -> Option<Arc<CudaBackend>> {
    static SHARED: Mutex<Vec<(Precision, Arc<CudaBackend>)>> = Mutex::new(Vec::new());
    let shareable = options.strategy == Strategy::Caching && options.workspace_limit.is_none();
    let mut shared = SHARED.lock().unwrap_or_else(|p| p.into_inner());
    if shareable {
        if let Some((_, b)) = shared.iter().find(|(p, _)| *p == options.precision) {
            return Some(b.clone());
        }
    }
    match CudaBackend::new(0, options) {
        Ok(b) => {
            if shareable {
                shared.push((options.precision, b.clone()));
            }
            Some(b)
        }
        Err(e) if gpu_required() => panic!("STAX_REQUIRE_GPU=1 but cuda:0 cannot be opened: {e}"),
        Err(e) => {
            // Straight to stderr: libtest captures `eprintln!`, and CI must show the skip.
            let test = std::thread::current().name().unwrap_or("?").to_string();
            let _ = writeln!(std::io::stderr(), "{test}: skipped: no CUDA device ({e})");
            None
        }
    }
}

/// As [`cuda_backend_or_skip`], as a `dyn Backend`.
pub fn cuda_or_skip(options: &BackendOptions) -> Option<Arc<dyn Backend>> {
    cuda_backend_or_skip(options).map(|b| b as Arc<dyn Backend>)
}

/// Options with `precision` and otherwise the defaults (caching allocator).
pub fn with_precision(precision: Precision) -> BackendOptions {
    BackendOptions {
        strategy: Strategy::Caching,
        precision,
        workspace_limit: None,
    }
}

/// The CPU backend (the oracle), default options.
pub fn cpu() -> Arc<dyn Backend> {
    Device::Cpu
        .open(&BackendOptions::default())
        .expect("the CPU backend always opens")
}

/// Overwrites `t` so that an op that forgets an element fails the comparison: NaN for
/// floats, the word `0xDEAD_BEEF` for u32.
pub fn poison(t: &mut Tensor) {
    match t.dtype() {
        DType::U32 => {
            let words = vec![0xDEAD_BEEFu32; t.numel()];
            let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
            stax::tensor::ops::upload(&bytes, t).expect("poison: upload pattern");
        }
        _ => stax::tensor::ops::fill(t, f32::NAN).expect("poison: fill with NaN"),
    }
}

/// An output tensor of `shape` and `dtype` on `backend`, poisoned.
pub fn poisoned(backend: &Arc<dyn Backend>, shape: impl Into<Shape>, dtype: DType) -> Tensor {
    let mut t = Tensor::empty(backend, shape, dtype, Category::Other).expect("allocate output");
    poison(&mut t);
    t
}

/// The element where `|gpu - cpu| - (atol + rtol |cpu|)` is largest (NaN counts as worst).
fn worst(gpu: &[f32], cpu: &[f32], rtol: f64, atol: f64) -> Option<(usize, f64)> {
    let mut worst: Option<(usize, f64)> = None;
    for (i, (&g, &c)) in gpu.iter().zip(cpu).enumerate() {
        let excess = if g.is_nan() != c.is_nan() || g.is_infinite() != c.is_infinite() {
            f64::INFINITY
        } else if g.is_nan() || g == c {
            f64::NEG_INFINITY
        } else {
            (g as f64 - c as f64).abs() - (atol + rtol * (c as f64).abs())
        };
        if worst.is_none_or(|(_, w)| excess > w) {
            worst = Some((i, excess));
        }
    }
    worst
}

/// Asserts `|gpu[i] - cpu[i]| <= atol + rtol * |cpu[i]|` for every element (NaN only matches
/// NaN). On failure prints `what` (name the op and shape there), the worst index and both
/// values.
pub fn assert_close(gpu: &[f32], cpu: &[f32], rtol: f64, atol: f64, what: &str) {
    assert_eq!(gpu.len(), cpu.len(), "{what}: lengths differ");
    if let Some((i, excess)) = worst(gpu, cpu, rtol, atol) {
        assert!(
            excess <= 0.0,
            "{what}: element {i} of {}: gpu {} vs cpu {} (|diff| {:e} > atol {atol:e} + rtol {rtol:e} * |cpu|)",
            gpu.len(),
            gpu[i],
            cpu[i],
            (gpu[i] - cpu[i]).abs()
        );
    }
}

/// Norm-wise relative error `‖gpu − cpu‖ / ‖cpu‖` (f64 sums; 0 when both are zero).
pub fn rel_error(gpu: &[f32], cpu: &[f32]) -> f64 {
    let (mut diff, mut norm) = (0f64, 0f64);
    for (&g, &c) in gpu.iter().zip(cpu) {
        diff += (g as f64 - c as f64).powi(2);
        norm += (c as f64).powi(2);
    }
    if diff == 0.0 {
        0.0
    } else {
        (diff / norm).sqrt()
    }
}

/// Asserts the norm-wise relative error is at most `max_rel` and every element is within
/// `atol_scale * max_rel * max|cpu|` (plus `10 max_rel |cpu|`): the check for conv and matmul,
/// where single elements may cancel to near zero. Returns the norm-wise error.
pub fn assert_rel_close(gpu: &[f32], cpu: &[f32], max_rel: f64, what: &str) -> f64 {
    assert_eq!(gpu.len(), cpu.len(), "{what}: lengths differ");
    assert!(
        gpu.iter().all(|v| v.is_finite()),
        "{what}: gpu output has non-finite values"
    );
    let rel = rel_error(gpu, cpu);
    let scale = cpu.iter().fold(0f64, |m, &c| m.max((c as f64).abs()));
    assert_close(gpu, cpu, 10.0 * max_rel, 10.0 * max_rel * scale, what);
    assert!(
        rel <= max_rel,
        "{what}: norm-wise relative error {rel:e} > {max_rel:e}"
    );
    rel
}

/// A small seeded generator (SplitMix64): same seed, same numbers, on every machine.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Self {
        Rng(seed ^ 0x9E37_79B9_7F4A_7C15)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[lo, hi)`.
    pub fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        let u = (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32;
        lo + (hi - lo) * u
    }

    /// `n` values uniform in `[lo, hi)`.
    pub fn vec(&mut self, n: usize, lo: f32, hi: f32) -> Vec<f32> {
        (0..n).map(|_| self.uniform(lo, hi)).collect()
    }

    /// Uniform in `0..n`.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// A seed derived from a test name and a shape, so every shape gets its own inputs.
pub fn seed_for(test: &str, shape: &[usize]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for b in test
        .bytes()
        .chain(shape.iter().flat_map(|d| d.to_le_bytes()))
    {
        h = (h ^ b as u64).wrapping_mul(0x1000_0000_01b3);
    }
    h
}

/// A tensor of `shape` on `backend` with values uniform in `[-1, 1)` from `rng`, and the values.
pub fn random_tensor(
    backend: &Arc<dyn Backend>,
    shape: impl Into<Shape>,
    rng: &mut Rng,
) -> (Tensor, Vec<f32>) {
    let shape = shape.into();
    let data = rng.vec(shape.numel(), -1.0, 1.0);
    let t = Tensor::from_slice(backend, &data, shape, Category::Other).expect("upload input");
    (t, data)
}

/// The same host values placed on both backends: `(on_gpu, on_cpu)`.
pub fn on_both(
    gpu: &Arc<dyn Backend>,
    cpu: &Arc<dyn Backend>,
    data: &[f32],
    shape: impl Into<Shape>,
) -> (Tensor, Tensor) {
    let shape = shape.into();
    let g = Tensor::from_slice(gpu, data, shape.clone(), Category::Other).expect("upload");
    let c = Tensor::from_slice(cpu, data, shape, Category::Other).expect("host copy");
    (g, c)
}

/// A small two-class CNN with SAME and VALID padding, a stride-2 conv and two dense layers.
pub fn small_model() -> stax::Serial {
    use stax::{Conv, Dense, Flatten, Padding, Relu, serial};
    serial![
        Conv::same(4, (3, 3)),
        Relu,
        Conv::new(3, (3, 3), (2, 2), Padding::Valid),
        Relu,
        Flatten,
        Dense(8),
        Relu,
        Dense(2)
    ]
}

/// Strided SAME, an even VALID kernel.
pub fn strided_model() -> stax::Serial {
    use stax::{Conv, Dense, Flatten, Padding, Relu, serial};
    serial![
        Conv::new(8, (3, 3), (2, 2), Padding::Same),
        Relu,
        Conv::new(16, (2, 2), (1, 1), Padding::Valid),
        Relu,
        Flatten,
        Dense(10),
        Relu,
        Dense(3)
    ]
}

/// Deeper: a pointwise conv (no workspace), mixed strides, three convs.
pub fn deep_model() -> stax::Serial {
    use stax::{Conv, Dense, Flatten, Padding, Relu, serial};
    serial![
        Conv::new(4, (1, 1), (1, 1), Padding::Valid),
        Relu,
        Conv::new(6, (5, 5), (2, 1), Padding::Same),
        Relu,
        Conv::new(6, (3, 3), (1, 1), Padding::Valid),
        Relu,
        Flatten,
        Dense(16),
        Relu,
        Dense(3)
    ]
}

/// The seed's model with two classes.
pub fn seed_model() -> stax::Serial {
    stax::models::seed_cnn(2)
}

/// A placed batch of shape `input`: deterministic images, one-hot labels of `classes`.
pub fn batch(be: &Arc<dyn Backend>, input: &Shape, classes: usize) -> (Tensor, Tensor) {
    let n = input.dims()[0];
    let images: Vec<f32> = (0..input.numel())
        .map(|i| ((i * 7919 % 997) as f32 / 997.0) - 0.5)
        .collect();
    let mut labels = vec![0f32; n * classes];
    for i in 0..n {
        labels[i * classes + i % classes] = 1.0;
    }
    let x = Tensor::from_slice(be, &images, input.clone(), Category::Input).unwrap();
    let y = Tensor::from_slice(be, &labels, [n, classes], Category::Input).unwrap();
    (x, y)
}

/// Every tensor of `tensors` (a tree's leaves, an optimizer's state field), downloaded and
/// concatenated in order.
pub fn host_values<'a>(tensors: impl IntoIterator<Item = &'a Tensor>) -> Vec<f32> {
    tensors
        .into_iter()
        .flat_map(|t| t.to_vec().expect("download"))
        .collect()
}

/// `layer`'s output shape and parameters for a single-tensor `input`, drawn from
/// `stax::Rng::new(seed)` on `backend`.
pub fn init(
    layer: &dyn stax::Layer,
    input: &Shape,
    backend: &Arc<dyn Backend>,
    seed: u64,
) -> (stax::layers::Shapes, stax::Params) {
    let mut rng = stax::Rng::new(seed);
    let source = stax::ParamSource::Random(&mut rng);
    stax::init_params(layer, &stax::Tree::leaf(input.clone()), backend, source).expect("init")
}

/// `layer`'s forward pass on `x` in evaluation mode (nothing kept).
pub fn apply(
    layer: &dyn stax::Layer,
    params: &stax::Params,
    x: stax::layers::Value,
) -> stax::layers::Value {
    let be = x.leaves()[0].backend().clone();
    let mut cx = stax::Cx::eval(&be);
    layer.apply(params, x, &mut cx).expect("apply").0
}

/// The RNG key [`vjp`] and [`apply_train`] give the layer (what `Dropout` draws its mask from),
/// so that both see the same mask.
pub const STEP_KEY: u64 = 0x5eed;

/// `layer`'s forward pass on `x` in training mode, with the RNG key [`STEP_KEY`] (the
/// residuals dropped).
pub fn apply_train(
    layer: &dyn stax::Layer,
    params: &stax::Params,
    x: stax::layers::Value,
) -> stax::layers::Value {
    let be = x.leaves()[0].backend().clone();
    let mut sink = stax::Collect::new();
    let mut cx = stax::Cx::train(&be, &mut sink).with_rng(stax::Rng::new(STEP_KEY));
    layer.apply(params, x, &mut cx).expect("apply").0
}

/// `layer`'s forward pass on `x` in training mode (RNG key [`STEP_KEY`]), then its backward
/// pass with the output gradient `dy(y)`: the output, the input gradient and the parameter
/// gradients (a tree like `params`).
pub fn vjp(
    layer: &dyn stax::Layer,
    params: &stax::Params,
    x: stax::layers::Value,
    dy: impl FnOnce(&stax::layers::Value) -> stax::layers::Value,
) -> (stax::layers::Value, stax::layers::Value, stax::Params) {
    let be = x.leaves()[0].backend().clone();
    let mut sink = stax::Collect::new();
    let mut cx = stax::Cx::train(&be, &mut sink).with_rng(stax::Rng::new(STEP_KEY));
    let (y, residuals) = layer.apply(params, x, &mut cx).expect("apply");
    let dy = dy(&y);
    let dx = layer
        .vjp(params, residuals, dy, &mut cx, true)
        .expect("vjp")
        .expect("an input gradient");
    drop(cx);
    (
        y,
        dx,
        sink.finish(params).expect("every parameter has a gradient"),
    )
}

/// Calibrates `op` on `gpu` (a backend no other test uses: its allocator is traced), runs
/// `run` once to reach the steady state, then again under a trace, and checks that the second
/// run's workspace allocations and frees are `gpu.workspace_schedule(op)`, to the byte and in
/// order, that its workspace peak is the schedule's, and that the uncalibrated bound was at
/// least that.
pub fn assert_workspace_is_the_schedule(
    gpu: &Arc<dyn Backend>,
    what: &str,
    op: stax_tensor::OpDesc,
    run: &mut dyn FnMut(),
) {
    use stax_alloc::TraceOp;
    use stax_tensor::WorkspaceStep;
    let bound = gpu.workspace_bytes(&op).unwrap();
    gpu.calibrate(&op).unwrap();
    assert!(gpu.is_calibrated(&op), "{what}: calibrated");
    let predicted = gpu.workspace_schedule(&op).unwrap();
    assert!(
        WorkspaceStep::peak(&predicted) <= bound,
        "{what}: the uncalibrated bound {bound} is below the exact schedule {predicted:?}"
    );
    run(); // steady state: the algorithm is chosen, buffers are cached
    gpu.synchronize().unwrap();
    gpu.allocator().reset_peak();
    gpu.allocator().start_trace();
    run();
    gpu.synchronize().unwrap();
    let trace = gpu.allocator().stop_trace();
    let mut ids = Vec::new();
    let recorded: Vec<WorkspaceStep> = trace
        .events
        .iter()
        .filter(|e| e.category == Category::Workspace)
        .map(|e| match e.op {
            TraceOp::Alloc => {
                ids.push(e.id);
                WorkspaceStep::Alloc(e.bytes as usize)
            }
            TraceOp::Free => WorkspaceStep::Free(ids.iter().position(|&i| i == e.id).unwrap()),
        })
        .collect();
    assert_eq!(recorded, predicted, "{what}: workspace schedule");
    let peak = gpu.allocator().stats().by_category[Category::Workspace.index()].peak;
    assert_eq!(
        peak,
        gpu.workspace_bytes(&op).unwrap() as u64,
        "{what}: peak"
    );
    println!("workspace {what}: {predicted:?}");
}

/// Calibrates `pass` of `g` in f32 with a bias on `cuda` and returns its plan (the chosen
/// algorithm and every candidate timed).
pub fn calibrated_plan(
    cuda: &CudaBackend,
    g: &stax_tensor::Conv2dGeometry,
    pass: stax_tensor::ConvPass,
) -> stax_tensor::cuda::ConvPlanInfo {
    let op = stax_tensor::OpDesc::Conv {
        geometry: *g,
        pass,
        dtype: DType::F32,
        bias: true,
    };
    cuda.calibrate(&op).unwrap();
    cuda.conv_plans()
        .into_iter()
        .find(|p| p.geometry == *g && p.pass == pass)
        .expect("a plan for the calibrated pass")
}

/// A CUDA backend of the test's own (TF32, the default workspace limit), so that its
/// allocator's trace and counters see nothing but the test; `None` with a skip notice as
/// [`cuda_or_skip`].
pub fn private_gpu_or_skip() -> Option<Arc<dyn Backend>> {
    private_gpu_with(Precision::Tf32)
}

/// As [`private_gpu_or_skip`], in `precision`.
pub fn private_gpu_with(precision: Precision) -> Option<Arc<dyn Backend>> {
    Some(private_cuda_with(precision)?)
}

/// As [`private_gpu_with`], as the CUDA backend itself (its cuDNN settings reachable).
pub fn private_cuda_with(precision: Precision) -> Option<Arc<CudaBackend>> {
    cuda_or_skip(&with_precision(precision))?;
    let options = BackendOptions {
        workspace_limit: Some(stax_tensor::cuda::DEFAULT_WORKSPACE_LIMIT),
        ..with_precision(precision)
    };
    Some(CudaBackend::new(0, &options).expect("open a private backend"))
}

/// Two training steps of `make()` on the embedded data (batch `input[0]`, seed 5 for the
/// trainer and the batches) on `gpu` and on the CPU: the losses agree to 1e-4 relative, the
/// parameters to `param_tol` and both Adam moments to 1e-3 (norm-wise). A `param_tol` above
/// 1e-3 marks a bf16 model: the losses agree to `param_tol`, and the moments are not compared
/// (a BatchNorm network's bf16 gradients differ from its f32 ones by 30-60% per leaf after one
/// step, measured on the CPU for `tests/resnet.rs`'s shallow ResNet, as batch statistics'
/// backward pass subtracts most of the rounded `dy`; two backends rounding at other points
/// differ as much), while Adam's bounded steps keep the parameters comparable.
pub fn two_steps_match_cpu<L: stax::Layer>(
    make: impl Fn() -> L,
    input: &Shape,
    gpu: &Arc<dyn Backend>,
    param_tol: f64,
) {
    use stax::train::Trainer;
    use stax::train::data::{Loader, fashion_mnist_2class};
    let (train_set, _) = fashion_mnist_2class().unwrap();
    let cpu = cpu();
    let adam = stax::Adam::new(1e-3);
    let mut on_gpu = Trainer::new(make(), input.clone(), adam, gpu, 5).unwrap();
    let mut on_cpu = Trainer::new(make(), input.clone(), adam, &cpu, 5).unwrap();
    let loader = Loader::new(train_set.len(), input.dims()[0], 5).unwrap();
    for indices in loader.batches(0).take(2) {
        let (xg, yg) = on_gpu.place_batch(&train_set, &indices).unwrap();
        let (xc, yc) = on_cpu.place_batch(&train_set, &indices).unwrap();
        let (rg, rc) = (
            on_gpu.step(&xg, &yg).unwrap(),
            on_cpu.step(&xc, &yc).unwrap(),
        );
        let loss_tol = if param_tol > 1e-3 { param_tol } else { 1e-4 } as f32;
        assert!(
            (rg.loss - rc.loss).abs() <= loss_tol * rc.loss.abs().max(1.0),
            "loss {} vs {}",
            rg.loss,
            rc.loss
        );
    }
    let (pg, pc) = (
        host_values(on_gpu.params().leaves()),
        host_values(on_cpu.params().leaves()),
    );
    assert_rel_close(&pg, &pc, param_tol, "parameters after two steps");
    if param_tol > 1e-3 {
        return;
    }
    for field in ["mu", "nu"] {
        let (g, c) = (on_gpu.state().field(field), on_cpu.state().field(field));
        assert_rel_close(&host_values(g), &host_values(c), 1e-3, field);
    }
}

/// Trains `model` on the embedded two-class data for `epochs` (batch `input[0]`, seed 5),
/// checking every step's peak and live bytes against the plan; returns the test accuracy and
/// the losses.
pub fn train<L: stax::Layer>(
    model: L,
    input: Shape,
    be: &Arc<dyn Backend>,
    epochs: u64,
) -> (f32, Vec<f32>) {
    use stax::train::Trainer;
    use stax::train::data::{Loader, fashion_mnist_2class};
    let (train, test) = fashion_mnist_2class().unwrap();
    let batch = input.dims()[0];
    let mut trainer = Trainer::new(model, input, stax::Adam::new(1e-3), be, 5).unwrap();
    let plan = trainer.plan(batch).unwrap();
    assert!(plan.exact);
    let loader = Loader::new(train.len(), batch, 5).unwrap();
    let mut losses = Vec::new();
    for epoch in 0..epochs {
        for indices in loader.batches(epoch) {
            let (x, y) = trainer.place_batch(&train, &indices).unwrap();
            let r = trainer.step(&x, &y).unwrap();
            assert_eq!(r.memory.peak, plan.peak.bytes, "step {} peak", r.step);
            assert_eq!(
                r.memory.live,
                plan.persistent_bytes(),
                "step {} live",
                r.step
            );
            losses.push(r.loss);
        }
    }
    (trainer.evaluate(&test, batch).unwrap().accuracy, losses)
}

/// `data` rounded to `dtype` on `be` (through the CPU's cast: the oracle's rounding).
pub fn typed(be: &Arc<dyn Backend>, data: &[f32], shape: &[usize], dtype: DType) -> Tensor {
    let host = cpu();
    let wide = Tensor::from_slice(&host, data, shape.to_vec(), Category::Other).unwrap();
    let mut t = Tensor::empty(&host, shape.to_vec(), dtype, Category::Other).unwrap();
    stax_tensor::ops::cast(&wide, &mut t).unwrap();
    t.to(be).unwrap()
}

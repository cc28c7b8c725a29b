//! JAX parity: every layer's forward pass and VJP equal JAX's for the same inputs and
//! parameters (stax.py semantics, f32, `jax.default_matmul_precision('highest')`), to 1e-5
//! relative to each tensor's largest magnitude, on the CPU and (2e-5) on the GPU.
//!
//! JAX's numbers are fixtures in `tests/fixtures/jax/*.json`, written by
//! `scripts/jax_fixtures.py` with the local jax (its docstring gives the format); this test
//! needs no Python. A layer is one line in [`LAYERS`] whose name is a fixture's: its parameters
//! are loaded from the fixture by JAX key path (`Path::jax_keystr`), so the parameter trees must
//! line up with JAX's (their shapes may differ where ours drop JAX's unit axes: a conv bias is
//! `[c]` here and `(1, 1, 1, c)` in stax, so only element counts are compared).

mod common;

use std::sync::Arc;

use common::fixtures::{Leaf, find, leaf, leaves};
use common::{assert_close, cpu, cuda_or_skip, vjp, with_precision};
use serde_json::Value as Json;
use stax::layers::Loss;
use stax::layers::Value;
use stax::tensor::ops;
use stax::{
    Backend, Category, Conv, DType, Dense, Elementwise, Elu, Exp, FanInConcat, FanInSum, FanOut,
    Flatten, Gelu, Identity, Layer, LeakyRelu, LogSoftmax, MaxPool, NegLogLikelihood, Padding,
    ParamSource, Precision, Relu, Selu, ShapeDependent, Sigmoid, Softmax, SoftmaxCrossEntropy,
    SoftmaxCrossEntropyWithIntegerLabels, Softplus, Tanh, Tensor, Tree, init_params, parallel,
    serial,
};

/// One layer with a fixture: its fixture's name and our layer.
struct Entry {
    name: &'static str,
    layer: fn() -> Box<dyn Layer>,
}

macro_rules! entry {
    ($name:literal, $layer:expr) => {
        Entry {
            name: $name,
            layer: || Box::new($layer),
        }
    };
}

/// Our layer for each fixture of `scripts/jax_fixtures.py`'s `LAYERS`, in its order.
const LAYERS: &[Entry] = &[
    entry!("conv_same", Conv::same(4, (3, 3))),
    entry!(
        "conv_valid_stride2",
        Conv::new(3, (3, 2), (2, 2), Padding::Valid)
    ),
    entry!(
        "conv_same_asymmetric_batch1",
        Conv::new(2, (3, 3), (2, 1), Padding::Same)
    ),
    entry!("conv_1x1", Conv::new(5, (1, 1), (1, 1), Padding::Valid)),
    entry!("dense_rank2", Dense(5)),
    entry!("dense_rank3", Dense(2)),
    entry!("flatten", Flatten),
    entry!("identity", Identity),
    entry!("relu", Relu),
    entry!("tanh", Tanh),
    entry!("max_pool_valid", MaxPool::new((2, 2))),
    entry!(
        "max_pool_same_stride2",
        MaxPool::new((3, 3)).with((2, 2), Padding::Same)
    ),
    entry!("fan_out", FanOut(2)),
    entry!("fan_out_sum", serial![FanOut(3), FanInSum]),
    entry!(
        "residual_block",
        serial![
            FanOut(2),
            parallel![
                serial![Conv::same(3, (3, 3)), Relu, Conv::same(3, (3, 3))],
                Identity
            ],
            FanInSum,
            Relu
        ]
    ),
    entry!(
        "concat_of_two_convs",
        serial![
            FanOut(2),
            parallel![
                Conv::same(3, (3, 3)),
                Conv::new(2, (1, 1), (1, 1), Padding::Valid)
            ],
            FanInConcat(-1)
        ]
    ),
    entry!(
        "concat_axis1",
        serial![FanOut(2), parallel![Identity, Tanh], FanInConcat(1)]
    ),
    entry!(
        "small_cnn",
        serial![
            Conv::same(3, (3, 3)),
            Relu,
            Conv::new(2, (3, 3), (2, 2), Padding::Valid),
            Relu,
            Flatten,
            Dense(4),
            Relu,
            Dense(2)
        ]
    ),
    entry!("exp", Exp),
    entry!("softplus", Softplus),
    entry!("sigmoid", Sigmoid),
    entry!("elu", Elu),
    entry!("elu_alpha_0_5", Elementwise::elu(0.5)),
    entry!("leaky_relu", LeakyRelu),
    entry!("leaky_relu_slope_0_3", Elementwise::leaky_relu(0.3)),
    entry!("selu", Selu),
    entry!("gelu", Gelu),
    entry!("log_softmax", LogSoftmax),
    entry!("softmax", Softmax),
    entry!("softmax_axis1", Softmax.over(1)),
    entry!("log_softmax_axis0", LogSoftmax.over(0)),
    entry!(
        "shape_dependent_dense",
        ShapeDependent::new(|s| Box::new(Dense(s.as_leaf().map_or(1, |s| s.last()))))
    ),
    entry!(
        "mnist_classifier_small",
        serial![Dense(8), Relu, Dense(8), Relu, Dense(3), LogSoftmax]
    ),
];

/// The dropout fixtures (the op with the fixture's key: JAX's Bernoulli bits are threefry's,
/// ours SplitMix64's, which the script mirrors).
const DROPOUT: &[&str] = &["dropout_0_8", "dropout_0_5_batch1"];

/// Our loss for each loss fixture.
fn loss_for(name: &str) -> Option<&'static dyn Loss> {
    match name {
        "loss_softmax_xent_integer_labels" => Some(&SoftmaxCrossEntropyWithIntegerLabels),
        "loss_nll" => Some(&NegLogLikelihood),
        "loss_softmax_xent_one_hot" => Some(&SoftmaxCrossEntropy),
        _ => None,
    }
}

const LOSSES: &[&str] = &[
    "loss_softmax_xent_integer_labels",
    "loss_nll",
    "loss_softmax_xent_one_hot",
];

/// The fixtures, relative to the package root: where cargo runs the test, and where the GPU
/// bundle's `run.sh` runs it (the build machine's absolute path does not exist there).
fn fixtures_dir() -> std::path::PathBuf {
    std::path::PathBuf::from("tests/fixtures/jax")
}

fn fixture(name: &str) -> Json {
    common::fixtures::read(&fixtures_dir(), "scripts/jax_fixtures.py", name)
}

/// `got` equals JAX's `want` to `tol` relative to `want`'s largest magnitude.
fn same(got: &[f32], want: &Leaf, tol: f64, what: &str) {
    let scale = want
        .data
        .iter()
        .fold(0f64, |m, &v| m.max(f64::from(v).abs()));
    assert_close(got, &want.data, tol, tol * scale.max(1e-30), what);
}

/// Our tensors of a tree, by JAX key path.
fn by_path(t: &Tree<Tensor>) -> Vec<(String, Vec<f32>)> {
    t.paths()
        .into_iter()
        .map(|(p, t)| (p.jax_keystr(), t.to_vec().unwrap()))
        .collect()
}

fn compare(ours: &Tree<Tensor>, jax: &[Leaf], tol: f64, what: &str) {
    let ours = by_path(ours);
    assert_eq!(
        ours.len(),
        jax.len(),
        "{what}: {} leaves, JAX has {}",
        ours.len(),
        jax.len()
    );
    for (path, values) in &ours {
        same(
            values,
            find(jax, path, what),
            tol,
            &format!("{what} {path}"),
        );
    }
}

/// Our forward and backward passes of `entry` on `be` against its fixture.
fn check_layer(entry: &Entry, be: &Arc<dyn Backend>, tol: f64) {
    let (name, layer) = (entry.name, (entry.layer)());
    let f = fixture(name);
    let x = leaf(&f["input"]);
    let jax_params = leaves(&f["params"]);
    let mut load = |path: &stax::tensor::Path, spec: &stax::layers::ParamSpec| {
        let p = find(&jax_params, &path.jax_keystr(), name);
        let numel: usize = p.shape.iter().product();
        assert_eq!(
            numel,
            spec.shape.numel(),
            "{name}: {path} is {} here, {:?} in JAX",
            spec.shape,
            p.shape
        );
        Ok(p.data.clone())
    };
    let input = Tree::leaf(stax::Shape::new(x.shape.clone()));
    let (_, params) = init_params(&*layer, &input, be, ParamSource::Load(&mut load)).unwrap();
    assert_eq!(params.len(), jax_params.len(), "{name}: parameter count");
    let xt = Tensor::from_slice(be, &x.data, x.shape.clone(), Category::Input).unwrap();
    let dys = leaves(&f["dy"]);
    let (y, dx, grads) = vjp(&*layer, &params, Tree::leaf(xt), |y: &Value| {
        y.try_map(|p, t| {
            let d = find(&dys, &p.jax_keystr(), name);
            Tensor::from_slice(be, &d.data, t.shape().clone(), Category::Gradient)
        })
        .unwrap()
    });
    compare(&y, &leaves(&f["output"]), tol, &format!("{name}: output"));
    compare(&dx, &leaves(&f["dx"]), tol, &format!("{name}: dx"));
    compare(&grads, &leaves(&f["grads"]), tol, &format!("{name}: grads"));
}

/// Our dropout op with the fixture's key against JAX's `jnp.where(keep, x / rate, 0)` VJP.
fn check_dropout(name: &str, be: &Arc<dyn Backend>, tol: f64) {
    let f = fixture(name);
    let rate = f["rate"].as_f64().unwrap() as f32;
    let key: u64 = f["key"].as_str().unwrap().parse().unwrap();
    let x = leaf(&f["input"]);
    let mut y = Tensor::from_slice(be, &x.data, x.shape.clone(), Category::Input).unwrap();
    let words = x.data.len().div_ceil(32);
    let mut mask = Tensor::empty(be, [words], DType::U32, Category::Activation).unwrap();
    ops::dropout(rate, key, &mut y, &mut mask).unwrap();
    same(
        &y.to_vec().unwrap(),
        &leaves(&f["output"])[0],
        tol,
        &format!("{name}: output"),
    );
    let dy = &leaves(&f["dy"])[0];
    let mut g = Tensor::from_slice(be, &dy.data, dy.shape.clone(), Category::Gradient).unwrap();
    ops::dropout_bwd(rate, &mask, &mut g).unwrap();
    same(
        &g.to_vec().unwrap(),
        &leaves(&f["dx"])[0],
        tol,
        &format!("{name}: dx"),
    );
}

/// Our loss against optax's (or stax's examples') value and gradient.
fn check_loss(name: &str, be: &Arc<dyn Backend>, tol: f64) {
    let f = fixture(name);
    let loss = loss_for(name).unwrap_or_else(|| panic!("no loss for {name}"));
    let z = leaf(&f["logits"]);
    let logits = Tensor::from_slice(be, &z.data, z.shape.clone(), Category::Activation).unwrap();
    let l = leaf(&f["labels"]);
    let labels = match loss.labels_dtype() {
        DType::U32 => {
            let ints: Vec<u32> = l.data.iter().map(|&v| v as u32).collect();
            let mut t = Tensor::empty(be, l.shape.clone(), DType::U32, Category::Input).unwrap();
            ops::upload(bytemuck::cast_slice(&ints), &mut t).unwrap();
            t
        }
        _ => Tensor::from_slice(be, &l.data, l.shape.clone(), Category::Input).unwrap(),
    };
    let (value, d) = loss.value_and_grad(&logits, &labels).unwrap();
    let want = f["loss"].as_f64().unwrap();
    assert!(
        (f64::from(value) - want).abs() <= tol * want.abs(),
        "{name}: loss {value}, JAX {want}"
    );
    same(
        &d.to_vec().unwrap(),
        &leaf(&f["dlogits"]),
        tol,
        &format!("{name}: dlogits"),
    );
}

fn check_all(be: &Arc<dyn Backend>, tol: f64) {
    for entry in LAYERS {
        check_layer(entry, be, tol);
    }
    for name in DROPOUT {
        check_dropout(name, be, tol);
    }
    for name in LOSSES {
        check_loss(name, be, tol);
    }
}

#[test]
fn cpu_matches_jax() {
    check_all(&cpu(), 1e-5);
}

#[test]
fn gpu_matches_jax() {
    let Some(gpu) = cuda_or_skip(&with_precision(Precision::Highest)) else {
        return;
    };
    check_all(&gpu, 2e-5);
}

/// Every fixture is checked and every entry has its fixture.
#[test]
fn every_fixture_has_an_entry() {
    let mut files: Vec<String> = std::fs::read_dir(fixtures_dir())
        .unwrap()
        .filter_map(|e| {
            let name = e.unwrap().file_name().into_string().unwrap();
            name.strip_suffix(".json").map(str::to_string)
        })
        .collect();
    let mut names: Vec<String> = LAYERS
        .iter()
        .map(|e| e.name)
        .chain(DROPOUT.iter().copied())
        .chain(LOSSES.iter().copied())
        .map(String::from)
        .collect();
    files.sort();
    names.sort();
    assert_eq!(files, names, "fixtures and entries differ");
}

/// The mask bits are `scripts/jax_fixtures.py`'s: kept elements are exactly the non-zero
/// outputs of the fixture (its inputs are never 0).
#[test]
fn dropout_masks_are_the_scripts() {
    for name in DROPOUT {
        let f = fixture(name);
        let rate = f["rate"].as_f64().unwrap() as f32;
        let key: u64 = f["key"].as_str().unwrap().parse().unwrap();
        let y = &leaves(&f["output"])[0];
        for (i, &v) in y.data.iter().enumerate() {
            let keep = u64::from(ops::dropout_bits(key, i as u64)) < ops::keep_threshold(rate);
            assert_eq!(keep, v != 0.0, "{name}: element {i}");
        }
    }
}

/// Where `python3` with jax runs, `scripts/jax_fixtures.py` writes the committed fixtures
/// again (they are JAX's numbers, not edited ones); skipped with a notice elsewhere.
#[test]
fn fixtures_are_what_the_script_writes() {
    common::fixtures::regenerated_fixtures_agree("scripts/jax_fixtures.py", &fixtures_dir());
}

//! JAX parity of the convolution, normalization and pooling layers of issue 10 and of stax's
//! ResNet blocks: forward outputs, input gradients and parameter gradients equal JAX's for the
//! same inputs and parameters (stax.py semantics, f32, `jax.default_matmul_precision
//! ('highest')`), to 1e-5 relative to each tensor's largest magnitude on the CPU, 2e-5 on the
//! GPU. Parameter shapes equal stax's exactly (conv biases `[1, 1, 1, c]`, BatchNorm's
//! `(beta, gamma)`, absent ones keeping their place).
//!
//! JAX's numbers are `tests/fixtures/jax_convs/*.json`, written by
//! `scripts/jax_fixtures_convs.py` (the format of `scripts/jax_fixtures.py` on the `layers`
//! branch; once both are on one branch these entries join its list). Parameters are loaded by
//! JAX key path (`Path::jax_keystr`).

mod common;

use std::sync::Arc;

use common::fixtures::{Leaf, find, leaf, leaves};
use common::{assert_close, cpu, cuda_or_skip, vjp, with_precision};
use serde_json::Value as Json;
use stax::layers::{ParamSpec, Value};
use stax::models::{conv_block, identity_block};
use stax::{
    AvgPool, Backend, BatchNorm, Category, Conv, ConvDims, ConvTranspose, GeneralConv,
    GeneralConvTranspose, Layer, Padding, ParamSource, Precision, SumPool, Tensor, Tree,
    init_params, models::ResNet,
};

/// One layer with a fixture: its fixture's name, our layer, and how much looser than the
/// default tolerance its comparison is (1 for every layer).
struct Entry {
    name: &'static str,
    layer: fn() -> Box<dyn Layer>,
    looser: f64,
}

macro_rules! entry {
    ($name:literal, $layer:expr) => {
        entry!($name, $layer, 1.0)
    };
    ($name:literal, $layer:expr, $looser:expr) => {
        Entry {
            name: $name,
            layer: || Box::new($layer),
            looser: $looser,
        }
    };
}

fn dims(lhs: &str, rhs: &str) -> ConvDims {
    ConvDims::parse(lhs, rhs, lhs).unwrap()
}

/// Our layer for each entry of `scripts/jax_fixtures_convs.py`'s `LAYERS`, in its order.
const LAYERS: &[Entry] = &[
    entry!(
        "general_conv_nchw_dilated",
        GeneralConv::general(ConvDims::NCHW, 3, (3, 2), (2, 1), Padding::Same).dilated((2, 1))
    ),
    entry!(
        "conv_explicit_dilated_batch1",
        Conv::new(3, (2, 3), (1, 2), Padding::Explicit([(2, 0), (1, 3)])).dilated((1, 2))
    ),
    entry!(
        "general_conv_nhwc_oihw_valid",
        GeneralConv::general(dims("NHWC", "OIHW"), 4, (2, 2), (2, 2), Padding::Valid)
    ),
    entry!(
        "general_conv_1d_nch",
        GeneralConv::general(dims("NCH", "OIH"), 4, (3, 1), (2, 1), Padding::Same)
    ),
    entry!(
        "conv_transpose_same_stride2",
        ConvTranspose::new(3, (3, 3), (2, 2), Padding::Same)
    ),
    entry!(
        "conv_transpose_valid_batch1",
        ConvTranspose::new(2, (3, 2), (2, 3), Padding::Valid)
    ),
    entry!(
        "conv_transpose_explicit_dilated",
        ConvTranspose::new(2, (2, 2), (1, 2), Padding::Explicit([(1, 0), (0, 1)])).dilated((2, 1))
    ),
    entry!(
        "conv_transpose_nchw",
        GeneralConvTranspose::general(ConvDims::NCHW, 3, (3, 3), (2, 2), Padding::Same)
    ),
    entry!(
        "conv1d_transpose_valid",
        ConvTranspose::one_d(3, 4, 2, Padding::Valid)
    ),
    entry!("batch_norm", BatchNorm::new()),
    entry!(
        "batch_norm_nchw_no_center",
        BatchNorm::new()
            .with_axis(&[0, 2, 3])
            .with(1e-3, false, true)
    ),
    entry!(
        "batch_norm_dense_no_scale",
        BatchNorm::new().with_axis(&[0]).with(1e-5, true, false)
    ),
    entry!("sum_pool_valid", SumPool::new((2, 2))),
    entry!(
        "sum_pool_same_stride2",
        SumPool::new((3, 3)).with((2, 2), Padding::Same)
    ),
    entry!(
        "avg_pool_same_stride2",
        AvgPool::new((3, 3)).with((2, 2), Padding::Same)
    ),
    entry!(
        "avg_pool_valid_stride2",
        AvgPool::new((2, 2)).with((2, 2), Padding::Valid)
    ),
    entry!("resnet_conv_block", conv_block(3, [2, 3, 4], (2, 2))),
    entry!("resnet_identity_block", identity_block(3, [2, 3], 4)),
    // A whole network: its input gradient comes out of five BatchNorm backward passes, each
    // cancelling most of its input (`dy - mean(dy) - z mean(dy z)`), so f32 rounding grows: at
    // the element of `dx` where ours and JAX's differ most (5.6e-4 of its largest magnitude),
    // JAX in float64 gives -2.679720e-5, JAX in f32 -2.680934e-5 and we -2.679423e-5 (our
    // statistics are summed in f64). Compared at 1e-3.
    entry!(
        "resnet_shallow",
        ResNet {
            blocks: [1, 2, 1, 1],
            widths: [2, 2, 4, 4],
            classes: 3,
            remat_stages: 0,
            bn_spans: Default::default(),
        }
        .build((16, 16, 3))
        .unwrap(),
        100.0
    ),
];

fn fixtures_dir() -> std::path::PathBuf {
    std::path::PathBuf::from("tests/fixtures/jax_convs")
}

fn fixture(name: &str) -> Json {
    common::fixtures::read(&fixtures_dir(), "scripts/jax_fixtures_convs.py", name)
}

/// The largest magnitude of a leaf.
fn magnitude(l: &Leaf) -> f64 {
    l.data.iter().fold(0f64, |m, &v| m.max(f64::from(v).abs()))
}

/// Our tree against JAX's leaves, by key path, to `tol` of each JAX tensor's largest magnitude,
/// at least 10% of the whole tree's (a conv bias before a BatchNorm has the exact gradient 0, of
/// which both computations give rounding noise); shapes equal.
fn compare(ours: &Tree<Tensor>, jax: &[Leaf], tol: f64, what: &str) {
    let ours = ours.paths();
    assert_eq!(ours.len(), jax.len(), "{what}: leaf count");
    let tree_scale = jax.iter().map(magnitude).fold(0f64, f64::max);
    for (path, t) in ours {
        let (path, want) = (path.jax_keystr(), find(jax, &path.jax_keystr(), what));
        assert_eq!(t.dims(), &want.shape[..], "{what} {path}: shape");
        let scale = magnitude(want).max(tree_scale * 0.1);
        let got = t.to_vec().unwrap();
        assert_close(
            &got,
            &want.data,
            tol,
            tol * scale.max(1e-30),
            &format!("{what} {path}"),
        );
    }
}

/// Our forward and backward passes of `entry` on `be` against its fixture.
fn check_layer(entry: &Entry, be: &Arc<dyn Backend>, tol: f64) {
    let (name, layer, tol) = (entry.name, (entry.layer)(), tol * entry.looser);
    let f = fixture(name);
    let x = leaf(&f["input"]);
    let jax_params = leaves(&f["params"]);
    let mut load = |path: &stax::tensor::Path, spec: &ParamSpec| {
        let p = find(&jax_params, &path.jax_keystr(), name);
        assert_eq!(spec.shape.dims(), &p.shape[..], "{name}: {path}'s shape");
        Ok(p.data.clone())
    };
    let input = Tree::leaf(stax::Shape::new(x.shape.clone()));
    let (_, params) = init_params(&*layer, &input, be, ParamSource::Load(&mut load)).unwrap();
    assert_eq!(
        params.leaves().len(),
        jax_params.len(),
        "{name}: parameter count"
    );
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

#[test]
fn cpu_matches_jax() {
    let be = cpu();
    for entry in LAYERS {
        check_layer(entry, &be, 1e-5);
    }
}

#[test]
fn gpu_matches_jax() {
    let Some(gpu) = cuda_or_skip(&with_precision(Precision::Highest)) else {
        return;
    };
    for entry in LAYERS {
        check_layer(entry, &gpu, 2e-5);
    }
}

/// Every fixture has an entry and every entry its fixture.
#[test]
fn every_fixture_has_an_entry() {
    let mut files: Vec<String> = std::fs::read_dir(fixtures_dir())
        .unwrap()
        .filter_map(|e| {
            let name = e.unwrap().file_name().into_string().unwrap();
            name.strip_suffix(".json").map(str::to_string)
        })
        .collect();
    let mut names: Vec<String> = LAYERS.iter().map(|e| e.name.to_string()).collect();
    files.sort();
    names.sort();
    assert_eq!(files, names, "fixtures and entries differ");
}

/// Where `python3` with jax runs, `scripts/jax_fixtures_convs.py` writes the committed
/// fixtures again (they are JAX's numbers, not edited ones); skipped with a notice elsewhere.
#[test]
fn fixtures_are_what_the_script_writes() {
    common::fixtures::regenerated_fixtures_agree("scripts/jax_fixtures_convs.py", &fixtures_dir());
}

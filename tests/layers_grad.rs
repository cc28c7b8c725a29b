//! Every layer's backward pass against central finite differences, on the CPU backend.
//!
//! Loss: `L = sum(apply(params, x) * r)` for a fixed random `r`, so `dL/dy = r`. The analytic
//! gradients from `vjp` are compared with `(L(θ + h) - L(θ - h)) / 2h` at sampled coordinates
//! of the input and of every parameter tensor.

mod common;

use stax::{
    Backend, BackendOptions, Category, Conv, Dense, Device, Flatten, Layer, Padding, Params, Relu,
    Rng, Shape, Tensor, Tree, serial,
};
use std::sync::Arc;

fn cpu() -> Arc<dyn Backend> {
    Device::Cpu.open(&BackendOptions::default()).unwrap()
}

/// Values in ±[0.1, 1.1] (away from ReLU's kink at 0, so finite differences are smooth).
fn random_vec(rng: &mut Rng, n: usize) -> Vec<f32> {
    (0..n)
        .map(|_| {
            let z = rng.normal();
            (z.signum() * (0.1 + z.abs().min(1.0))) as f32
        })
        .collect()
}

fn host_params(p: &Params) -> Vec<Vec<f32>> {
    p.leaves().iter().map(|t| t.to_vec().unwrap()).collect()
}

fn rebuild(be: &Arc<dyn Backend>, like: &Params, values: &[Vec<f32>]) -> Params {
    let mut it = values.iter();
    like.try_map(|_, t: &Tensor| {
        Tensor::from_slice(
            be,
            it.next().unwrap(),
            t.shape().clone(),
            Category::Parameter,
        )
    })
    .unwrap()
}

fn loss(
    layer: &dyn Layer,
    be: &Arc<dyn Backend>,
    like: &Params,
    p: &[Vec<f32>],
    x: &[f32],
    xs: &Shape,
    r: &[f32],
) -> f64 {
    let params = rebuild(be, like, p);
    let xt = Tensor::from_slice(be, x, xs.clone(), Category::Input).unwrap();
    let y = common::apply(layer, &params, Tree::leaf(xt)).leaves()[0]
        .to_vec()
        .unwrap();
    y.iter().zip(r).map(|(a, b)| *a as f64 * *b as f64).sum()
}

/// Checks the input gradient and every parameter gradient at up to 12 coordinates each.
fn check(layer: &dyn Layer, input: Shape, seed: u64) {
    let be = cpu();
    let mut rng = Rng::new(seed);
    let (out, params) = common::init(layer, &input, &be, seed + 1000);
    let out = out.as_leaf().unwrap().clone();
    let x = random_vec(&mut rng, input.numel());
    let r = random_vec(&mut rng, out.numel());
    let p = host_params(&params);

    let xt = Tensor::from_slice(&be, &x, input.clone(), Category::Input).unwrap();
    let live = be.allocator().stats().requested;
    let (y, dx, grads) = common::vjp(layer, &params, Tree::leaf(xt), |y| {
        let dy = Tensor::from_slice(&be, &r, out.clone(), Category::Gradient).unwrap();
        assert_eq!(
            y.as_leaf().unwrap().shape(),
            &out,
            "{}: apply's shape differs from init's",
            layer.describe()
        );
        Tree::leaf(dy)
    });
    drop(y);
    let dx = dx.into_leaf().unwrap().to_vec().unwrap();
    let g = host_params(&grads);
    drop(grads);
    assert!(
        be.allocator().stats().requested <= live,
        "{}: the backward pass left buffers behind",
        layer.describe()
    );

    let h = 1e-3f32;
    let tol =
        |analytic: f64, numeric: f64| (analytic - numeric).abs() <= 2e-3 + 2e-3 * numeric.abs();
    let f = |p: &[Vec<f32>], x: &[f32]| loss(layer, &be, &params, p, x, &input, &r);
    let coords = |n: usize, rng: &mut Rng| -> Vec<usize> {
        (0..n.min(12))
            .map(|_| ((rng.normal().abs() * 1e6) as usize) % n)
            .collect()
    };
    for i in coords(x.len(), &mut rng) {
        let (mut xp, mut xm) = (x.clone(), x.clone());
        xp[i] += h;
        xm[i] -= h;
        let numeric = (f(&p, &xp) - f(&p, &xm)) / (2.0 * h as f64);
        assert!(
            tol(dx[i] as f64, numeric),
            "{}: dx[{i}] = {} but finite difference {numeric}",
            layer.describe(),
            dx[i]
        );
    }
    for (k, pk) in p.iter().enumerate() {
        for i in coords(pk.len(), &mut rng) {
            let (mut pp, mut pm) = (p.clone(), p.clone());
            pp[k][i] += h;
            pm[k][i] -= h;
            let numeric = (f(&pp, &x) - f(&pm, &x)) / (2.0 * h as f64);
            assert!(
                tol(g[k][i] as f64, numeric),
                "{}: dparam{k}[{i}] = {} but finite difference {numeric}",
                layer.describe(),
                g[k][i]
            );
        }
    }
}

#[test]
fn conv_same_stride1() {
    check(&Conv::same(4, (3, 3)), Shape::new([2, 6, 5, 3]), 1);
}

#[test]
fn conv_valid_stride2_odd() {
    check(
        &Conv::new(3, (3, 2), (2, 2), Padding::Valid),
        Shape::new([2, 7, 5, 2]),
        2,
    );
}

#[test]
fn conv_same_stride2_asymmetric_batch1() {
    check(
        &Conv::new(2, (3, 3), (2, 1), Padding::Same),
        Shape::new([1, 8, 6, 3]),
        3,
    );
}

#[test]
fn conv_1x1_and_even_kernel() {
    check(&Conv::same(5, (1, 1)), Shape::new([3, 4, 4, 2]), 4);
    check(&Conv::same(2, (2, 2)), Shape::new([1, 5, 5, 1]), 5);
}

#[test]
fn dense_rank2_and_rank3() {
    check(&Dense(5), Shape::new([3, 7]), 6);
    check(&Dense(2), Shape::new([2, 3, 4]), 7);
    check(&Dense(3), Shape::new([1, 1]), 8);
}

#[test]
fn relu_and_flatten() {
    check(&Relu, Shape::new([2, 3, 3, 2]), 9);
    check(&Flatten, Shape::new([2, 3, 3, 2]), 10);
}

#[test]
fn serial_small_cnn() {
    let model = serial![
        Conv::same(3, (3, 3)),
        Relu,
        Conv::new(2, (3, 3), (2, 2), Padding::Valid),
        Relu,
        Flatten,
        Dense(4),
        Relu,
        Dense(2)
    ];
    check(&model, Shape::new([2, 7, 7, 2]), 11);
}

//! One layer under test: finite differences of its backward pass, and its forward and
//! backward passes on two backends compared (the conformance list's checks).

use super::{Rng, assert_rel_close, init, vjp};
use stax::{Backend, Category, Layer, Params, Shape, Tensor, Tree};
use std::sync::Arc;

/// Values in ±[0.1, 1.1] (away from a ReLU's kink at 0, so finite differences are smooth).
pub fn away_from_zero(rng: &mut Rng, n: usize) -> Vec<f32> {
    (0..n)
        .map(|_| {
            let z = rng.uniform(-1.0, 1.0);
            z.signum() * (0.1 + z.abs())
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

/// `sum(apply(params, x) * r)` in training mode (the mask of a dropout the one `vjp` sees), in
/// f64.
fn loss(
    layer: &dyn Layer,
    be: &Arc<dyn Backend>,
    p: &Params,
    x: &[f32],
    xs: &Shape,
    r: &[f32],
) -> f64 {
    let xt = Tensor::from_slice(be, x, xs.clone(), Category::Input).unwrap();
    let y = super::apply_train(layer, p, Tree::leaf(xt));
    let y: Vec<f32> = y
        .leaves()
        .iter()
        .flat_map(|t| t.to_vec().unwrap())
        .collect();
    y.iter().zip(r).map(|(a, b)| *a as f64 * *b as f64).sum()
}

/// Checks `layer`'s input gradient and every parameter gradient at up to 12 coordinates each
/// against central finite differences of `L = sum(apply(params, x) * r)` (so `dL/dy = r`),
/// on the CPU, and that the backward pass leaves no buffer behind. A coordinate where `L` has
/// a kink within the step (a ReLU's input crossing 0: the one-sided slopes disagree at both
/// steps tried) is not compared; at most a quarter of those compared may be such.
pub fn finite_differences(layer: &dyn Layer, input: &Shape, seed: u64) {
    let be = super::cpu();
    let name = layer.describe();
    let mut rng = Rng::new(seed);
    let (out, params) = init(layer, input, &be, seed + 1000);
    let out: Vec<Shape> = out.leaves().into_iter().cloned().collect();
    let x = away_from_zero(&mut rng, input.numel());
    let r = away_from_zero(&mut rng, out.iter().map(Shape::numel).sum());
    let p = host_params(&params);
    let xt = Tensor::from_slice(&be, &x, input.clone(), Category::Input).unwrap();
    let live = be.allocator().stats().requested;
    let (y, dx, grads) = vjp(layer, &params, Tree::leaf(xt), |y| {
        let shapes: Vec<Shape> = y.leaves().iter().map(|t| t.shape().clone()).collect();
        assert_eq!(shapes, out, "{name}: apply's shapes differ from init's");
        let mut at = 0;
        y.map(|t| {
            let n = t.numel();
            at += n;
            Tensor::from_slice(&be, &r[at - n..at], t.shape().clone(), Category::Gradient).unwrap()
        })
    });
    drop(y);
    let dx = dx.into_leaf().unwrap().to_vec().unwrap();
    let g = host_params(&grads);
    drop(grads);
    assert!(
        be.allocator().stats().requested <= live,
        "{name}: the backward pass left buffers behind"
    );
    let tol = |a: f64, b: f64| (a - b).abs() <= 2e-3 + 2e-3 * b.abs();
    let f = |q: &[Vec<f32>], x: &[f32]| loss(layer, &be, &rebuild(&be, &params, q), x, input, &r);
    let f0 = f(&p, &x);
    // The central difference at step h, or None where L is not smooth within h (a ReLU kink
    // crossed: the one-sided slopes disagree), tried at h = 1e-3 and then 1e-4.
    let numeric = |at: &dyn Fn(f32) -> f64| {
        [1e-3f32, 1e-4].into_iter().find_map(|h| {
            let (up, down) = (at(h), at(-h));
            let smooth = tol((up - f0) / h as f64, (f0 - down) / h as f64);
            smooth.then(|| (up - down) / (2.0 * h as f64))
        })
    };
    let coords =
        |n: usize, rng: &mut Rng| -> Vec<usize> { (0..n.min(12)).map(|_| rng.below(n)).collect() };
    let (mut checked, mut kinks) = (0, 0);
    let mut check = |what: String, analytic: f32, numeric: Option<f64>| match numeric {
        Some(n) => {
            checked += 1;
            assert!(
                tol(analytic as f64, n),
                "{name}: {what} = {analytic} but finite difference {n}"
            );
        }
        None => kinks += 1,
    };
    for i in coords(x.len(), &mut rng) {
        let at = |h: f32| {
            let mut xh = x.clone();
            xh[i] += h;
            f(&p, &xh)
        };
        check(format!("dx[{i}]"), dx[i], numeric(&at));
    }
    for (k, pk) in p.iter().enumerate() {
        for i in coords(pk.len(), &mut rng) {
            let at = |h: f32| {
                let mut ph = p.clone();
                ph[k][i] += h;
                f(&ph, &x)
            };
            check(format!("dparam{k}[{i}]"), g[k][i], numeric(&at));
        }
    }
    assert!(
        kinks <= checked / 4,
        "{name}: {kinks} coordinates at kinks, {checked} checked"
    );
}

/// `layer`'s forward pass, input gradient and parameter gradients on `gpu` equal the CPU's on
/// fresh random inputs and parameters, within `max_rel` (norm-wise; see `assert_rel_close`).
pub fn gpu_matches_cpu(
    layer: &dyn Layer,
    input: &Shape,
    seed: u64,
    gpu: &Arc<dyn Backend>,
    max_rel: f64,
) {
    let cpu = super::cpu();
    let name = layer.describe();
    let mut rng = Rng::new(seed);
    let (_, on_cpu) = init(layer, input, &cpu, seed);
    let on_gpu = on_cpu.try_map(|_, t| t.to(gpu)).unwrap();
    let x = rng.vec(input.numel(), -1.0, 1.0);
    let run = |be: &Arc<dyn Backend>, params: &Params, dy_seed: u64| {
        let xt = Tensor::from_slice(be, &x, input.clone(), Category::Input).unwrap();
        let (y, dx, g) = vjp(layer, params, Tree::leaf(xt), |y| {
            let mut r = Rng::new(dy_seed);
            y.map(|t| {
                let v = r.vec(t.numel(), -1.0, 1.0);
                Tensor::from_slice(be, &v, t.shape().clone(), Category::Gradient).unwrap()
            })
        });
        let values = |v: &Tree<Tensor>| -> Vec<Vec<f32>> {
            v.leaves().iter().map(|t| t.to_vec().unwrap()).collect()
        };
        (values(&y), values(&dx), values(&g))
    };
    let (yc, dxc, gc) = run(&cpu, &on_cpu, seed + 1);
    let (yg, dxg, gg) = run(gpu, &on_gpu, seed + 1);
    for (what, (g, c)) in [("output", (yg, yc)), ("dx", (dxg, dxc))] {
        assert_eq!(g.len(), c.len(), "{name}: {what} structure");
        for (i, (a, b)) in g.iter().zip(&c).enumerate() {
            assert_rel_close(a, b, max_rel, &format!("{name}: {what} {i}"));
        }
    }
    // The parameter gradients as one vector: a leaf that is mathematically zero (a conv's
    // bias before a BatchNorm, which removes any per-channel constant) holds only rounding
    // noise, comparable at the scale of the whole gradient, not of its own.
    assert_eq!(gg.len(), gc.len(), "{name}: grads structure");
    assert_rel_close(
        &gg.concat(),
        &gc.concat(),
        max_rel,
        &format!("{name}: grads (every leaf, in order, as one vector)"),
    );
}

/// `Remat::new(serial![layer])` gives the bits of `serial![layer]` (`make` builds the layer
/// twice): its output, input gradient and every parameter gradient, on the CPU, from the
/// same parameters, input and output gradient (RNG key [`super::STEP_KEY`] for both).
pub fn remat_is_the_same_bits(make: fn() -> Box<dyn Layer>, input: &Shape, seed: u64) {
    let plain = stax::Serial(vec![make()]);
    let remat = stax::Remat::new(stax::Serial(vec![make()]));
    same_bits(&plain, &remat, input, seed);
    let saving = stax::Remat::new(stax::Serial(vec![make()])).saving(&["conv", "dense"]);
    if saves_an_output(&saving, input, seed) {
        same_bits(&plain, &saving, input, seed);
    }
}

/// Whether a saving `Remat` finds an output to save inside (else its forward pass is the
/// typed error that says so).
fn saves_an_output(remat: &dyn Layer, input: &Shape, seed: u64) -> bool {
    let be = super::cpu();
    let (_, params) = init(remat, input, &be, seed);
    let x = Tensor::from_slice(
        &be,
        &vec![0.5f32; input.numel()],
        input.clone(),
        Category::Input,
    );
    let mut sink = stax::Collect::new();
    let mut cx = stax::Cx::train(&be, &mut sink).with_rng(stax::Rng::new(super::STEP_KEY));
    match remat.apply(&params, Tree::leaf(x.unwrap()), &mut cx) {
        Ok(_) => true,
        Err(stax::layers::LayerError::Config { reason, .. })
            if reason.contains("could be saved") =>
        {
            false
        }
        Err(e) => panic!("{}: {e}", remat.describe()),
    }
}

/// `a` and `b` (of one parameter tree) give the same output, input gradient and parameter
/// gradients on the CPU, bit for bit, from the same random inputs (see
/// [`remat_is_the_same_bits`]).
fn same_bits(plain: &dyn Layer, remat: &dyn Layer, input: &Shape, seed: u64) {
    let be = super::cpu();
    let name = remat.describe();
    let mut rng = Rng::new(seed);
    let (out, params) = init(plain, input, &be, seed + 1000);
    let x = rng.vec(input.numel(), -1.0, 1.0);
    let r = rng.vec(out.leaves().iter().map(|s| s.numel()).sum(), -1.0, 1.0);
    let run = |layer: &dyn Layer| {
        let xt = Tensor::from_slice(&be, &x, input.clone(), Category::Input).unwrap();
        let (y, dx, grads) = vjp(layer, &params, Tree::leaf(xt), |y| {
            let mut at = 0;
            y.map(|t| {
                at += t.numel();
                let values = &r[at - t.numel()..at];
                Tensor::from_slice(&be, values, t.shape().clone(), Category::Gradient).unwrap()
            })
        });
        let bits = |v: &Tree<Tensor>| -> Vec<u32> {
            let host = super::host_values(v.leaves());
            host.into_iter().map(f32::to_bits).collect()
        };
        (bits(&y), bits(&dx), bits(&grads))
    };
    let (a, b) = (run(plain), run(remat));
    assert!(a.0 == b.0, "{name}: outputs differ");
    assert!(a.1 == b.1, "{name}: input gradients differ");
    assert!(a.2 == b.2, "{name}: parameter gradients differ");
}

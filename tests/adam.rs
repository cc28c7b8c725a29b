//! Adam against values computed by hand from optax's formula (f64, then compared in f32).

use stax::optim::{OptState, OptimError};
use stax::{Adam, BackendOptions, Category, Device, Optimizer, Params, Tensor, Tree};

fn tensor(be: &std::sync::Arc<dyn stax::Backend>, v: &[f32], c: Category) -> Tensor {
    Tensor::from_slice(be, v, [v.len()], c).unwrap()
}

/// A one-tensor parameter tree `w`.
fn one(t: Tensor) -> Params {
    Tree::fields([("w", t)])
}

#[test]
fn two_steps_match_hand_computed_optax_values() {
    let be = Device::Cpu.open(&BackendOptions::default()).unwrap();
    let adam = Adam {
        lr: 0.1,
        ..Adam::new(0.1)
    };
    let mut params = one(tensor(&be, &[1.0, -2.0, 0.5], Category::Parameter));
    let mut state = adam.init(&params).unwrap();
    // t = 1: m = 0.1 g, v = 0.001 g², m̂ = g, v̂ = g², p -= 0.1 * g / (|g| + 1e-8)
    let g1 = one(tensor(&be, &[0.1, -0.2, 0.3], Category::Gradient));
    adam.update(&mut state, &g1, &mut params).unwrap();
    let expected1 = [0.900000009999999, -1.9000000049999997, 0.4000000033333332];
    // t = 2, second gradient
    let g2 = one(tensor(&be, &[-0.5, 0.4, 0.0], Category::Gradient));
    let p1 = params.leaves()[0].to_vec().unwrap();
    adam.update(&mut state, &g2, &mut params).unwrap();
    let expected2 = [0.9598354265523341, -1.9366103565460366, 0.33299418107915446];
    let p2 = params.leaves()[0].to_vec().unwrap();
    for i in 0..3 {
        assert!(
            (p1[i] as f64 - expected1[i]).abs() < 1e-6,
            "step 1 p[{i}] = {}",
            p1[i]
        );
        assert!(
            (p2[i] as f64 - expected2[i]).abs() < 1e-6,
            "step 2 p[{i}] = {}",
            p2[i]
        );
    }
    assert_eq!(state.count, 2);
    let m = state.field("mu")[0].to_vec().unwrap();
    let v = state.field("nu")[0].to_vec().unwrap();
    let (em, ev) = ([-0.041, 0.022, 0.027], [0.00025999, 0.00019996, 8.991e-05]);
    for i in 0..3 {
        assert!((m[i] as f64 - em[i]).abs() < 1e-7, "m[{i}] = {}", m[i]);
        assert!(
            (v[i] as f64 - ev[i]).abs() < 1e-4 * ev[i],
            "v[{i}] = {}",
            v[i]
        );
    }
    assert_eq!(state.field("mu")[0].category(), Category::OptimizerState);
}

#[test]
fn mismatched_gradients_leave_state_unchanged() {
    let be = Device::Cpu.open(&BackendOptions::default()).unwrap();
    let adam = Adam::new(1e-3);
    let mut params = one(tensor(&be, &[1.0, 2.0], Category::Parameter));
    let mut state = adam.init(&params).unwrap();
    let wrong = one(tensor(&be, &[1.0, 2.0, 3.0], Category::Gradient));
    let err = adam.update(&mut state, &wrong, &mut params).unwrap_err();
    assert!(
        matches!(&err, OptimError::Leaf { path, .. } if path == "w"),
        "{err}"
    );
    assert!(err.to_string().contains("expected shape [2]"), "{err}");
    let other = Tree::fields([("b", tensor(&be, &[1.0, 2.0], Category::Gradient))]);
    let err = adam.update(&mut state, &other, &mut params).unwrap_err();
    assert!(
        matches!(
            err,
            OptimError::Structure {
                what: "gradients",
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(state.count, 0);
    assert_eq!(params.leaves()[0].to_vec().unwrap(), vec![1.0, 2.0]);
}

#[test]
fn bad_hyper_parameters_and_shared_params_are_errors() {
    let be = Device::Cpu.open(&BackendOptions::default()).unwrap();
    let params = one(tensor(&be, &[1.0], Category::Parameter));
    let bad = Adam {
        b1: 1.0,
        ..Adam::new(1e-3)
    };
    assert!(matches!(
        bad.init(&params),
        Err(OptimError::Hyper { name: "b1", .. })
    ));
    let adam = Adam::new(1e-3);
    let mut state = adam.init(&params).unwrap();
    let mut shared = params.clone();
    let g = one(tensor(&be, &[1.0], Category::Gradient));
    let err = adam.update(&mut state, &g, &mut shared).unwrap_err();
    assert!(err.to_string().contains("shared"), "{err}");
    assert_eq!(state.count, 0);
}

#[test]
fn a_bad_later_parameter_is_refused_before_any_write() {
    // Two parameters; the second one's moments share one buffer. The update must refuse before
    // it writes the first parameter (everything is checked first).
    let be = Device::Cpu.open(&BackendOptions::default()).unwrap();
    let adam = Adam::new(0.1);
    let mut params = Tree::fields([
        ("w", tensor(&be, &[1.0, 2.0], Category::Parameter)),
        ("b", tensor(&be, &[3.0], Category::Parameter)),
    ]);
    let fresh = adam.init(&params).unwrap();
    let shared = fresh.field("mu")[1].clone();
    let w = Tree::fields([
        ("mu", fresh.field("mu")[0].duplicate().unwrap()),
        ("nu", fresh.field("nu")[0].duplicate().unwrap()),
    ]);
    let b = Tree::fields([("mu", shared.clone()), ("nu", shared)]);
    let tree = Tree::node([
        (stax::tensor::Key::Field("w"), w),
        (stax::tensor::Key::Field("b"), b),
    ]);
    let mut state = OptState { count: 0, tree };
    let g = Tree::fields([
        ("w", tensor(&be, &[0.5, 0.5], Category::Gradient)),
        ("b", tensor(&be, &[0.5], Category::Gradient)),
    ]);
    let err = adam.update(&mut state, &g, &mut params).unwrap_err();
    assert!(
        matches!(&err, OptimError::Leaf { path, .. } if path == "b"),
        "{err}"
    );
    assert!(err.to_string().contains("shared"), "{err}");
    assert_eq!(state.count, 0);
    assert_eq!(params.leaves()[0].to_vec().unwrap(), vec![1.0, 2.0]);
    assert_eq!(state.field("mu")[0].to_vec().unwrap(), vec![0.0, 0.0]);
}

//! The parameters of GeneralConv, GeneralConvTranspose and BatchNorm as stax makes them:
//! shapes, tree order and initializer statistics (mean, standard deviation, truncation).
//! Reference values from JAX 0.10.2 (`init_fun(PRNGKey(0), shape)` of the same stax layer):
//! kernel standard deviations 0.048585 (the two convs below) and 0.046111 (the transposed
//! one), largest magnitudes 0.109364 and 0.103728, bias standard deviation 1.06e-6.

use stax::{
    BackendOptions, BatchNorm, ConvDims, ConvTranspose, Device, GeneralConv, Layer, Padding,
    ParamSource, Params, Rng, Shape, Tree, init_params,
};

/// Standard deviation of a unit normal truncated to [-2, 2] (jax.nn.initializers).
const TRUNCATED: f64 = 0.879_625_661_034_239_8;

fn draw(layer: &dyn Layer, input: &[usize], seed: u64) -> Params {
    let be = Device::Cpu.open(&BackendOptions::default()).unwrap();
    let mut rng = Rng::new(seed);
    let input = Tree::leaf(Shape::new(input));
    init_params(layer, &input, &be, ParamSource::Random(&mut rng))
        .unwrap()
        .1
}

fn stats(v: &[f32]) -> (f64, f64, f64) {
    let n = v.len() as f64;
    let mean = v.iter().map(|&x| f64::from(x)).sum::<f64>() / n;
    let var = v
        .iter()
        .map(|&x| (f64::from(x) - mean).powi(2))
        .sum::<f64>()
        / n;
    let max = v.iter().fold(0f64, |m, &x| m.max(f64::from(x).abs()));
    (mean, var.sqrt(), max)
}

/// A glorot-normal kernel of fans `(fan_in, fan_out)`: mean 0, standard deviation
/// `sqrt(2 / (fan_in + fan_out))` within 3% (as JAX's own draw is), every value within the
/// truncation bound `2 · std / 0.8796`; and a `normal(1e-6)` bias.
fn check_conv(params: &Params, shapes: [&[usize]; 2], fans: (usize, usize), jax_std: f64) {
    let leaves = params.leaves();
    assert_eq!(leaves.len(), 2);
    assert_eq!(leaves[0].dims(), shapes[0], "kernel shape");
    assert_eq!(leaves[1].dims(), shapes[1], "bias shape");
    let target = (2.0 / (fans.0 + fans.1) as f64).sqrt();
    assert!(
        (jax_std / target - 1.0).abs() < 0.03,
        "the JAX reference {jax_std} vs {target}"
    );
    let (mean, std, max) = stats(&leaves[0].to_vec().unwrap());
    assert!(mean.abs() < 0.05 * target, "kernel mean {mean}");
    assert!(
        (std / target - 1.0).abs() < 0.03,
        "kernel std {std} vs {target}"
    );
    assert!(max <= 2.0 * target / TRUNCATED + 1e-7, "kernel max {max}");
    assert!(
        max > 1.8 * target,
        "kernel max {max}: not a truncated normal"
    );
    let (_, bstd, _) = stats(&leaves[1].to_vec().unwrap());
    assert!((bstd / 1e-6 - 1.0).abs() < 0.35, "bias std {bstd}");
}

#[test]
fn conv_kernels_and_biases_follow_stax_in_every_layout() {
    // stax: GeneralConv(dn, 64, (3, 3)) on 32 input channels
    let nchw = GeneralConv::general(ConvDims::NCHW, 64, (3, 3), (1, 1), Padding::Valid);
    let p = draw(&nchw, &[2, 32, 8, 8], 1);
    check_conv(
        &p,
        [&[64, 32, 3, 3], &[1, 64, 1, 1]],
        (32 * 9, 64 * 9),
        0.048585,
    );
    let nhwc = GeneralConv::new(64, (3, 3), (1, 1), Padding::Valid);
    let p = draw(&nhwc, &[2, 8, 8, 32], 2);
    check_conv(
        &p,
        [&[3, 3, 32, 64], &[1, 1, 1, 64]],
        (32 * 9, 64 * 9),
        0.048585,
    );
    let paths: Vec<String> = p.paths().iter().map(|(p, _)| p.jax_keystr()).collect();
    assert_eq!(paths, ["[0]", "[1]"], "stax's (W, b)");
}

#[test]
fn transposed_kernels_follow_stax() {
    // stax: ConvTranspose(48, (5, 3)) on 16 channels: HWIO (5, 3, 16, 48)
    let t = ConvTranspose::new(48, (5, 3), (2, 2), Padding::Same);
    let p = draw(&t, &[2, 8, 8, 16], 3);
    check_conv(
        &p,
        [&[5, 3, 16, 48], &[1, 1, 1, 48]],
        (16 * 15, 48 * 15),
        0.046111,
    );
    let one_d = ConvTranspose::one_d(4, 3, 1, Padding::Valid);
    let p = draw(&one_d, &[2, 9, 5], 4);
    let shapes: Vec<&[usize]> = p.leaves().iter().map(|t| t.dims()).collect();
    assert_eq!(
        shapes,
        [&[3, 5, 4][..], &[1, 1, 4][..]],
        "stax's Conv1DTranspose"
    );
}

#[test]
fn batch_norm_is_beta_zeros_then_gamma_ones() {
    let p = draw(&BatchNorm::new(), &[2, 4, 4, 8], 5);
    let paths: Vec<String> = p.paths().iter().map(|(p, _)| p.to_string()).collect();
    assert_eq!(paths, ["beta", "gamma"]);
    let values: Vec<Vec<f32>> = p.leaves().iter().map(|t| t.to_vec().unwrap()).collect();
    assert_eq!(values, [vec![0.0; 8], vec![1.0; 8]]);
    // center=False: beta is stax's `()`, gamma keeps its place ([1])
    let p = draw(&BatchNorm::new().with(1e-5, false, true), &[2, 4, 4, 8], 5);
    let keys: Vec<String> = p.paths().iter().map(|(p, _)| p.jax_keystr()).collect();
    assert_eq!(keys, ["[1]"]);
    // the parameters have the input's shape without the normalized axes
    let p = draw(&BatchNorm::new().with_axis(&[0]), &[3, 4, 5], 5);
    assert_eq!(p.leaves()[0].dims(), &[4, 5]);
}

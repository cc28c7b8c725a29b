//! The scalar formulas of the activations that take more than one line, in f32: what the CPU
//! backend computes ([`crate::Activation::apply`], [`crate::Activation::grad`]) and what
//! `kernels/activation.cu` computes the same way, operation for operation.

/// `jax.nn.selu`'s scale λ (Klambauer et al. 2017), rounded to f32 as JAX rounds it.
pub const SELU_SCALE: f32 = 1.050_701;
/// `jax.nn.selu`'s α, rounded to f32.
pub const SELU_ALPHA: f32 = 1.673_263_2;
/// `sqrt(2 / π)` in f32, as `jax.nn.gelu` casts `np.sqrt(2 / np.pi)`.
const SQRT_2_OVER_PI: f32 = 0.797_884_6;
/// The cubic coefficient of the tanh approximation of GELU.
const GELU_CUBIC: f32 = 0.044_715;

/// `logaddexp(x, 0) = max(x, 0) + log1p(exp(-|x|))` (`jax.nn.softplus`); NaN propagates.
pub fn softplus(x: f32) -> f32 {
    x.max(0.0) + (-x.abs()).exp().ln_1p()
}

/// `1 / (1 + exp(-x))`, without overflow for large `|x|` (`lax.logistic`).
pub fn sigmoid(x: f32) -> f32 {
    if x >= 0.0 {
        1.0 / (1.0 + (-x).exp())
    } else {
        let e = x.exp();
        e / (1.0 + e)
    }
}

/// `x` if `x > 0` else `alpha · expm1(x)` (`jax.nn.elu`).
pub fn elu(x: f32, alpha: f32) -> f32 {
    if x > 0.0 { x } else { alpha * x.exp_m1() }
}

/// The gradient of `scale · elu(x, alpha)` from its output `y` (for `alpha >= 0`, `y > 0`
/// exactly where `x > 0`): `dy · scale` there, else `dy · (y + scale · alpha)`
/// (`= dy · scale · alpha · exp(x)`); `offset` is `scale · alpha`.
pub fn elu_grad(y: f32, dy: f32, scale: f32, offset: f32) -> f32 {
    if y > 0.0 {
        dy * scale
    } else {
        dy * (y + offset)
    }
}

/// `u = sqrt(2/π) (x + 0.044715 x³)`, as `jax.nn.gelu` computes it.
fn gelu_inner(x: f32) -> f32 {
    SQRT_2_OVER_PI * (x + GELU_CUBIC * (x * x * x))
}

/// `x · 0.5 (1 + tanh(u))` (`jax.nn.gelu(x, approximate=True)`), computed as the identical
/// `x · s` with `s = 1 / (1 + exp(-2u))`: no cancellation where `tanh(u)` nears -1, so the
/// result keeps f32's relative precision for negative `x` too.
pub fn gelu(x: f32) -> f32 {
    x * gelu_gate(x)
}

/// `s = 0.5 (1 + tanh(u)) = 1 / (1 + exp(-2u))`.
fn gelu_gate(x: f32) -> f32 {
    1.0 / (1.0 + (-2.0 * gelu_inner(x)).exp())
}

/// `dy · d gelu / dx` from the input: `0.5 (1 + t) + x · 0.5 (1 - t²) · sqrt(2/π)
/// (1 + 3 · 0.044715 x²)` with `t = tanh(u)`, the derivative JAX's autodiff takes, computed
/// through `s` of [`gelu`]: `0.5 (1 + t) = s` and `0.5 (1 - t²) = 2 s (1 - s)`.
pub fn gelu_grad(x: f32, dy: f32) -> f32 {
    let s = gelu_gate(x);
    let du = SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_CUBIC * (x * x));
    dy * (s + x * (2.0 * s * (1.0 - s)) * du)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Activation, Alpha, Saves};

    /// Values from JAX 0.10.2 (CPU, f32): `jax.nn.gelu(1.0)`, `softplus(-3.0)`, `elu(-1.0)`,
    /// `selu(-1.0)`, `sigmoid(-20.0)`, and `jax.grad(jax.nn.gelu)(1.0)`.
    #[test]
    fn match_jax() {
        let close = |a: f32, b: f32| (a - b).abs() <= 2e-7 * b.abs().max(1e-30);
        assert!(close(gelu(1.0), 0.841_192), "{}", gelu(1.0));
        assert!(close(softplus(-3.0), 0.048_587_35), "{}", softplus(-3.0));
        assert!(close(elu(-1.0, 1.0), -0.632_120_56));
        assert!(close(SELU_SCALE * elu(-1.0, SELU_ALPHA), -1.111_330_7));
        assert!(close(sigmoid(-20.0), 2.061_153_7e-9), "{}", sigmoid(-20.0));
        assert!(
            close(gelu_grad(1.0, 1.0), 1.082_964),
            "{}",
            gelu_grad(1.0, 1.0)
        );
        assert!(softplus(f32::NAN).is_nan() && softplus(f32::INFINITY) == f32::INFINITY);
        assert_eq!(softplus(f32::NEG_INFINITY), 0.0);
    }

    /// Every activation's `grad`, from what it saves, is the derivative of its `apply`
    /// (central differences in f64 of the f32 formula, away from kinks).
    #[test]
    fn every_gradient_is_the_derivative() {
        let all = [
            Activation::Relu,
            Activation::Tanh,
            Activation::Exp,
            Activation::Softplus,
            Activation::Sigmoid,
            Activation::Elu(Alpha::new(0.7)),
            Activation::LeakyRelu(Alpha::new(0.01)),
            Activation::Selu,
            Activation::Gelu,
        ];
        for act in all {
            for x in [-3.1f32, -1.3, -0.4, 0.3, 0.9, 2.7] {
                let saved = match act.saves() {
                    Saves::Mask => f32::from(u8::from(act.mask_bit(x))),
                    Saves::Output => act.apply(x),
                    Saves::Input => x,
                };
                let h = 1e-3f32;
                let fd = (f64::from(act.apply(x + h)) - f64::from(act.apply(x - h))) / 2e-3;
                let g = f64::from(act.grad(saved, 1.5));
                assert!(
                    (g - 1.5 * fd).abs() <= 2e-3 * (1.0 + fd.abs()),
                    "{act:?} at {x}: {g} vs {fd}"
                );
            }
        }
        // the leaky ReLU's gradient at 0 is 1 (jnp.where(x >= 0, ..)); the ReLU's is 0
        let leaky = Activation::LeakyRelu(Alpha::new(0.01));
        assert!(leaky.mask_bit(0.0) && !Activation::Relu.mask_bit(0.0));
        assert!(Activation::Elu(Alpha::new(-1.0)).check().is_err());
        assert!(
            leaky.check().is_ok() && Activation::LeakyRelu(Alpha::new(f32::NAN)).check().is_err()
        );
    }
}

//! Adam, with optax's semantics and defaults.

use crate::{OptimError, Optimizer};
use stax_tensor::{AdamHyper, DType, Tensor};

/// Adam (Kingma & Ba 2014, Algorithm 1), exactly as `optax.adam(learning_rate, b1, b2, eps)`:
///
/// ```text
/// t   = count + 1
/// m   = b1 · m + (1 - b1) · g
/// v   = b2 · v + (1 - b2) · g²
/// m̂   = m / (1 - b1^t),   v̂ = v / (1 - b2^t)
/// p   = p - lr · m̂ / (sqrt(v̂ + eps_root) + eps)
/// ```
///
/// `eps` sits outside the square root and `eps_root = 0`, optax's defaults. The state per
/// parameter is `mu` (m) and `nu` (v), as optax's `ScaleByAdamState` names them; one fused
/// kernel per parameter reads `p, g, m, v` and writes `p, m, v` in place.
///
/// With `update_in_backward` (the default) a dense layer's weight is updated in its own
/// backward pass, chunk by chunk as its gradient is made (`stax_tensor::ops::dense_adam`): the
/// same arithmetic, without the weight gradient ever existing whole (1.31 GB of the seed
/// model's peak).
///
/// `mu_dtype` is optax's `adam(mu_dtype=..)`: the first moment stored in that float dtype
/// (bf16 halves it), read as f32, the step computed in f32 and the new moment rounded once
/// (`optax.scale_by_adam` casts `mu` to `mu_dtype` after `update_moment`; `nu` stays f32).
/// A first moment of another dtype than f32 is updated after the backward pass (the fused
/// dense update keeps f32 moments).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Adam {
    /// Learning rate.
    pub lr: f32,
    /// First-moment decay (default 0.9).
    pub b1: f32,
    /// Second-moment decay (default 0.999).
    pub b2: f32,
    /// Denominator term outside the square root (default 1e-8).
    pub eps: f32,
    /// Term inside the square root (default 0).
    pub eps_root: f32,
    /// Whether dense weights are updated in their layers' backward passes (default true).
    pub update_in_backward: bool,
    /// The first moment's dtype (default f32; bf16 or f16: optax's `mu_dtype`).
    pub mu_dtype: DType,
}

impl Adam {
    /// Adam with optax's defaults: `b1 = 0.9`, `b2 = 0.999`, `eps = 1e-8`, `eps_root = 0`.
    pub fn new(lr: f32) -> Self {
        Adam {
            lr,
            b1: 0.9,
            b2: 0.999,
            eps: 1e-8,
            eps_root: 0.0,
            update_in_backward: true,
            mu_dtype: DType::F32,
        }
    }

    /// This Adam with its first moment `mu` stored in `dtype` (optax's `mu_dtype`; see the
    /// type's docs). [`Optimizer::validate`] refuses a dtype that is not a float.
    pub fn with_mu_dtype(self, dtype: DType) -> Self {
        Adam {
            mu_dtype: dtype,
            ..self
        }
    }

    /// This Adam with the weight gradients of dense layers collected for the one update after
    /// the backward pass, as every other gradient (`update_in_backward = false`).
    pub fn collecting(self) -> Self {
        Adam {
            update_in_backward: false,
            ..self
        }
    }

    /// The kernel's hyper-parameters at step `t >= 1`, bias corrections computed in f64, the
    /// gradient taken as it is (`grad_scale` 1).
    pub fn hyper(&self, t: u32) -> AdamHyper {
        let bc = |b: f32| (1.0 - (b as f64).powi(t.min(i32::MAX as u32) as i32)) as f32;
        AdamHyper {
            lr: self.lr,
            b1: self.b1,
            b2: self.b2,
            eps: self.eps,
            eps_root: self.eps_root,
            bias_correction1: bc(self.b1),
            bias_correction2: bc(self.b2),
            grad_scale: 1.0,
        }
    }
}

impl Optimizer for Adam {
    fn name(&self) -> &'static str {
        "adam"
    }

    fn state_fields(&self) -> &'static [&'static str] {
        &["mu", "nu"]
    }

    fn validate(&self) -> Result<(), OptimError> {
        let nonneg = |v: f32| v.is_finite() && v >= 0.0;
        let checks = [
            ("lr", self.lr, nonneg(self.lr), "finite and >= 0"),
            ("b1", self.b1, (0.0..1.0).contains(&self.b1), "in [0, 1)"),
            ("b2", self.b2, (0.0..1.0).contains(&self.b2), "in [0, 1)"),
            ("eps", self.eps, nonneg(self.eps), "finite and >= 0"),
            (
                "eps_root",
                self.eps_root,
                nonneg(self.eps_root),
                "finite and >= 0",
            ),
        ];
        if !self.mu_dtype.is_float() {
            return Err(OptimError::Hyper {
                optimizer: self.name(),
                name: "mu_dtype",
                value: f32::NAN,
                reason: "a float dtype (f32, bf16, f16)",
            });
        }
        match checks.into_iter().find(|c| !c.2) {
            Some((name, value, _, reason)) => Err(OptimError::Hyper {
                optimizer: self.name(),
                name,
                value,
                reason,
            }),
            None => Ok(()),
        }
    }

    fn state_dtype(&self, field: &str, param: DType) -> DType {
        match field {
            "mu" => self.mu_dtype,
            _ => param,
        }
    }

    fn in_backward(&self, t: u32) -> Option<AdamHyper> {
        let fused = self.update_in_backward && self.mu_dtype == DType::F32;
        fused.then(|| self.hyper(t))
    }

    fn update_leaf(
        &self,
        t: u32,
        p: &mut Tensor,
        g: &Tensor,
        state: &mut [&mut Tensor],
        grad_scale: f32,
    ) -> Result<(), OptimError> {
        let [m, v] = state else {
            return Err(OptimError::Tensor(
                stax_tensor::TensorError::InvalidArgument {
                    op: "adam_update",
                    reason: format!(
                        "expected the two moments mu and nu, got {} tensors",
                        state.len()
                    ),
                },
            ));
        };
        let h = AdamHyper {
            grad_scale,
            ..self.hyper(t)
        };
        Ok(stax_tensor::ops::adam(p, g, m, v, &h)?)
    }
}

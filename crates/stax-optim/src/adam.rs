//! Adam, with optax's semantics and defaults.

use crate::OptimError;
use stax_layers::{Grads, Params};
use stax_tensor::{AdamHyper, Category, Tensor};

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
/// `eps` sits outside the square root and `eps_root = 0`, optax's defaults.
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
}

/// Adam's state: step count and the two moments, shaped like the parameters and tagged
/// [`Category::OptimizerState`] (optax's `ScaleByAdamState(count, mu, nu)`).
#[derive(Debug)]
pub struct AdamState {
    /// Number of updates applied so far.
    pub count: u32,
    /// First moment `m`.
    pub mu: Params,
    /// Second moment `v`.
    pub nu: Params,
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
        }
    }

    fn validate(&self) -> Result<(), OptimError> {
        let checks = [
            (
                "lr",
                self.lr,
                self.lr.is_finite() && self.lr >= 0.0,
                "finite and >= 0",
            ),
            ("b1", self.b1, (0.0..1.0).contains(&self.b1), "in [0, 1)"),
            ("b2", self.b2, (0.0..1.0).contains(&self.b2), "in [0, 1)"),
            (
                "eps",
                self.eps,
                self.eps.is_finite() && self.eps >= 0.0,
                "finite and >= 0",
            ),
            (
                "eps_root",
                self.eps_root,
                self.eps_root.is_finite() && self.eps_root >= 0.0,
                "finite and >= 0",
            ),
        ];
        match checks.into_iter().find(|c| !c.2) {
            Some((name, value, _, reason)) => Err(OptimError::Hyper {
                name,
                value,
                reason,
            }),
            None => Ok(()),
        }
    }

    /// optax's `init`: zero moments shaped like `params`, on the parameters' devices.
    ///
    /// # Errors
    /// Invalid hyper-parameters; allocation errors (`2 ×` the parameters' bytes are needed).
    pub fn init(&self, params: &Params) -> Result<AdamState, OptimError> {
        self.validate()?;
        let zeros =
            |t: &Tensor| Tensor::zeros(t.backend(), t.shape().clone(), Category::OptimizerState);
        Ok(AdamState {
            count: 0,
            mu: params.try_map(&mut &zeros)?,
            nu: params.try_map(&mut &zeros)?,
        })
    }

    /// optax's `update` followed by `apply_updates`, in place: one fused kernel per tensor reads
    /// `p, g, m, v` and writes `p, m, v`.
    ///
    /// Structure, shapes and hyper-parameters are checked before anything is written, so on
    /// those errors `state` and `params` are unchanged.
    ///
    /// # Errors
    /// [`OptimError::Structure`] on mismatched trees; [`OptimError::Tensor`] for device
    /// mismatches, shared parameter buffers ([`stax_tensor::TensorError::Aliased`]) or kernel
    /// failures.
    pub fn update(
        &self,
        state: &mut AdamState,
        grads: &Grads,
        params: &mut Params,
    ) -> Result<(), OptimError> {
        self.validate()?;
        if !params.same_structure(grads) {
            return Err(OptimError::Structure { what: "gradients" });
        }
        if !params.same_structure(&state.mu) || !params.same_structure(&state.nu) {
            return Err(OptimError::Structure {
                what: "optimizer state",
            });
        }
        let t = state
            .count
            .checked_add(1)
            .ok_or(OptimError::CountOverflow)?;
        let h = self.hyper(t);
        let mut ps = params.leaves_mut();
        for p in ps.iter() {
            p.expect_unique("adam_update")?;
        }
        let gs = grads.leaves();
        let mut ms = state.mu.leaves_mut();
        let mut vs = state.nu.leaves_mut();
        for (((p, g), m), v) in ps.iter_mut().zip(gs).zip(ms.iter_mut()).zip(vs.iter_mut()) {
            p.backend().clone().adam_update(p, g, m, v, &h)?;
        }
        state.count = t;
        Ok(())
    }

    /// The kernel's hyper-parameters at step `t >= 1`, bias corrections computed in f64.
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
        }
    }
}

//! Dynamic loss scaling for f16 training, with jmp's `DynamicLossScale` semantics
//! (`jmp/_src/loss_scale.py`): the loss gradient is multiplied by the scale before the
//! backward pass, the gradients are unscaled (multiplied by `1 / scale`, in f32, as the
//! optimizer reads them: [`stax_optim::Optimizer::update_unscaled`]) and a step whose
//! gradients are not all finite ([`stax_tensor::ops::all_finite`]) is skipped: parameters and
//! optimizer state unchanged, the scale divided by `factor` (not below `min_scale`). After
//! `period` finite steps in a row the scale is multiplied by `factor` (unless that is not
//! finite). A trainer of a model whose policy computes in f16 starts with jmp's defaults.

use serde::{Deserialize, Serialize};
use stax_layers::Layer;
use stax_optim::Optimizer;
use stax_tensor::{DType, Shape, Tree};

use crate::{TrainError, Trainer};

/// The state of jmp's `DynamicLossScale`: the scale, the count of finite steps since it last
/// changed, and its settings.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct DynamicLossScale {
    /// The factor the loss gradient is multiplied by (jmp's `loss_scale`; default 2^15).
    pub scale: f32,
    /// Finite steps in a row since the scale last grew or fell, in `[0, period)` (jmp's
    /// `counter`).
    pub counter: u32,
    /// Finite steps in a row after which the scale grows (default 2000).
    pub period: u32,
    /// What the scale is multiplied by after `period` finite steps and divided by after a
    /// non-finite one (default 2).
    pub factor: f32,
    /// The scale's floor (jmp's `min_loss_scale`, default 1).
    pub min_scale: f32,
}

impl Default for DynamicLossScale {
    /// jmp's defaults: `DynamicLossScale(loss_scale=2**15, period=2000, factor=2)`, minimum 1.
    fn default() -> Self {
        DynamicLossScale::new(32768.0)
    }
}

impl DynamicLossScale {
    /// A scale of `initial` with jmp's other defaults (period 2000, factor 2, minimum 1).
    pub fn new(initial: f32) -> Self {
        DynamicLossScale {
            scale: initial,
            counter: 0,
            period: 2000,
            factor: 2.0,
            min_scale: 1.0,
        }
    }

    /// The next state after a step whose gradients were all finite (`grads_finite`) or not
    /// (jmp's `DynamicLossScale.adjust`): finite, the counter counts up and at `period` the
    /// scale is multiplied by `factor` (kept when the product is not finite) and the counter
    /// restarts; not finite, the scale is divided by `factor`, not below `min_scale`, and the
    /// counter restarts.
    pub fn adjust(self, grads_finite: bool) -> Self {
        let scale = match grads_finite {
            true if self.counter == self.period - 1 => {
                let grown = self.scale * self.factor;
                if grown.is_finite() { grown } else { self.scale }
            }
            true => self.scale,
            false => (self.scale / self.factor).max(self.min_scale),
        };
        let counter = match grads_finite {
            true => (self.counter + 1) % self.period,
            false => 0,
        };
        DynamicLossScale {
            scale,
            counter,
            ..self
        }
    }

    /// Checks the settings.
    ///
    /// # Errors
    /// [`TrainError::LossScale`] naming the first setting that cannot work: `scale` and
    /// `min_scale` finite and positive, `period >= 1`, `counter < period`, `factor` finite
    /// and `>= 1`.
    pub fn validate(&self) -> Result<(), TrainError> {
        let positive = |v: f32| v.is_finite() && v > 0.0;
        let checks = [
            (
                "scale",
                self.scale as f64,
                positive(self.scale),
                "finite and > 0",
            ),
            (
                "min_scale",
                self.min_scale as f64,
                positive(self.min_scale),
                "finite and > 0",
            ),
            ("period", self.period as f64, self.period >= 1, ">= 1"),
            (
                "counter",
                self.counter as f64,
                self.counter < self.period,
                "below period",
            ),
            (
                "factor",
                self.factor as f64,
                self.factor.is_finite() && self.factor >= 1.0,
                "finite and >= 1",
            ),
        ];
        match checks.into_iter().find(|c| !c.2) {
            Some((name, value, _, expected)) => Err(TrainError::LossScale {
                name,
                value,
                expected,
            }),
            None => Ok(()),
        }
    }

    /// The loss scale a model's training on inputs of shape `input` starts with: jmp's
    /// default when a policy it or a layer inside it runs under computes in f16
    /// ([`Layer::policies`]), else none.
    pub fn for_model(model: &dyn Layer, input: &Shape) -> Option<DynamicLossScale> {
        let policies = model.policies(&Tree::leaf(input.clone()));
        let f16 = policies.iter().any(|p| p.compute == DType::F16);
        f16.then(DynamicLossScale::default)
    }
}

/// What one loss-scaled step did, in its [`crate::StepReport`].
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct LossScaleStep {
    /// The scale the step's loss gradient was multiplied by.
    pub scale: f32,
    /// Whether its gradients were not all finite, so that nothing was updated.
    pub skipped: bool,
    /// The scale of the next step ([`DynamicLossScale::adjust`]).
    pub next_scale: f32,
}

impl<L: Layer, O: Optimizer, F: stax_layers::Loss> Trainer<L, O, F> {
    /// The dynamic loss scale of the next step (`None`: the loss is not scaled).
    pub fn loss_scale(&self) -> Option<DynamicLossScale> {
        self.loss_scale
    }

    /// Sets the dynamic loss scale of the next steps (`None`: no loss scaling, refused by an
    /// f16 policy's check at the next step). With a scale, every gradient is collected for one
    /// update after the backward pass (a fused in-backward update cannot be skipped).
    ///
    /// # Errors
    /// [`DynamicLossScale::validate`]'s.
    pub fn set_loss_scale(&mut self, scale: Option<DynamicLossScale>) -> Result<(), TrainError> {
        if let Some(s) = &scale {
            s.validate()?;
        }
        self.loss_scale = scale;
        Ok(())
    }

    /// Adjusts the loss scale after a step whose gradients were finite or not, and says what
    /// the step did (`None` without loss scaling).
    pub(crate) fn adjust_loss_scale(&mut self, grads_finite: bool) -> Option<LossScaleStep> {
        let before = self.loss_scale?;
        let next = before.adjust(grads_finite);
        self.loss_scale = Some(next);
        Some(LossScaleStep {
            scale: before.scale,
            skipped: !grads_finite,
            next_scale: next.scale,
        })
    }
}

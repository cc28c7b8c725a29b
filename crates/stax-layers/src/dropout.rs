//! stax's `Dropout(rate, mode)`.
//!
//! `rate` is the KEEP probability, as in stax (not the drop probability of Keras and PyTorch):
//! in training each element is kept with probability `rate` and scaled by `1 / rate`,
//! `jnp.where(keep, x / rate, 0)`. The mask comes from the context's RNG key ([`Cx`]; stax's
//! `apply_fun(.., rng=key)`, split per layer by [`crate::Serial`] as stax's `serial` splits
//! it): one `u64` drawn from it keys a counter-based generator
//! ([`stax_tensor::ops::dropout_bits`]), so the mask is the same on every backend for one seed.
//! The layer runs in place and keeps only the mask's bits (1/32 of an f32 activation).
//!
//! The mode is fixed at construction, as stax's: [`Mode::Eval`] (stax's `'test'`) is the
//! identity. An evaluation context ([`Cx::eval`], what `Trainer::predict` runs) is the identity
//! too: it stands for stax's second, `mode='test'` copy of the model, so one model serves both.
//! Unlike stax, an identity dropout needs no RNG key.
//!
//! ```
//! use stax_layers::{Dropout, Layer, Mode};
//! use stax_tensor::{Shape, Tree};
//! let x = Tree::leaf(Shape::new([8, 3]));
//! assert_eq!(Dropout::new(0.9).output_shape(&x).unwrap(), x);
//! assert_eq!(Dropout::new(0.5).with_mode(Mode::Eval).describe(), "dropout(0.5, test)");
//! assert!(Dropout::new(0.0).output_shape(&x).is_err()); // the keep rate is in (0, 1]
//! ```

use stax_alloc::Tag;
use stax_tensor::{Category, DType, Params, Tensor, Tree, ops};

use crate::layer::{expect_params, one_shape, one_tensor, residuals, saved_tensor};
use crate::{Cx, Layer, LayerError, Mode, ParamSpec, Residuals, Saved, Shapes, Value};

/// stax's `Dropout(rate, mode='train')` (see the module docs): any shape and float dtype, no
/// parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Dropout {
    rate: f32,
    mode: Mode,
}

impl Dropout {
    /// Keeps each element with probability `rate` in training (stax's default mode,
    /// `'train'`). A rate outside (0, 1] is a [`LayerError::Config`] at init.
    pub fn new(rate: f32) -> Dropout {
        Dropout {
            rate,
            mode: Mode::Train,
        }
    }

    /// The same layer in `mode` ([`Mode::Eval`]: stax's `mode='test'`, the identity).
    pub fn with_mode(self, mode: Mode) -> Dropout {
        Dropout { mode, ..self }
    }

    /// The keep probability.
    pub fn rate(&self) -> f32 {
        self.rate
    }

    fn check(&self) -> Result<(), LayerError> {
        ops::check_keep_rate("dropout", self.rate).map_err(|e| self.config(e.to_string()))
    }
}

impl Layer for Dropout {
    fn kind(&self) -> &'static str {
        "dropout"
    }

    fn describe(&self) -> String {
        match self.mode {
            Mode::Train => format!("dropout({})", self.rate),
            Mode::Eval => format!("dropout({}, test)", self.rate),
        }
    }

    fn output_shape(&self, input: &Shapes) -> Result<Shapes, LayerError> {
        self.check()?;
        Ok(Tree::leaf(one_shape(self, input)?.clone()))
    }

    fn param_specs(&self, input: &Shapes) -> Result<Tree<ParamSpec>, LayerError> {
        self.output_shape(input)?;
        Ok(Tree::empty())
    }

    /// # Errors
    /// [`LayerError::Config`] in training without an RNG key (stax's `ValueError`).
    fn apply(
        &self,
        params: &Params,
        x: Value,
        cx: &mut Cx<'_>,
    ) -> Result<(Value, Residuals), LayerError> {
        expect_params(params, self, &Tree::empty())?;
        let x = one_tensor(self, x)?;
        self.check()?;
        if self.mode == Mode::Eval || !cx.is_training() {
            return Ok((Tree::leaf(x), Tree::empty()));
        }
        let Some(mut rng) = cx.take_rng() else {
            let reason = "a training step needs an RNG key: give the context one (Cx::with_rng)";
            return Err(self.config(reason.into()));
        };
        let words = x.numel().div_ceil(32);
        let tag = Tag::new(Category::Activation, "mask");
        let mut mask = Tensor::empty(x.backend(), [words], DType::U32, tag)?;
        let mut y = x.into_unique_as("output")?;
        ops::dropout(self.rate, rng.bits(), &mut y, &mut mask)?;
        Ok((Tree::leaf(y), residuals([("mask", Saved::Tensor(mask))])))
    }

    /// `dx = keep ? dy / rate : 0` over `dy`'s buffer (the identity in [`Mode::Eval`]).
    fn vjp(
        &self,
        params: &Params,
        mut residuals: Residuals,
        dy: Value,
        _cx: &mut Cx<'_>,
        need_dx: bool,
    ) -> Result<Option<Value>, LayerError> {
        expect_params(params, self, &Tree::empty())?;
        if self.mode == Mode::Eval {
            return Ok(need_dx.then_some(dy));
        }
        let mask = saved_tensor(self, &mut residuals, "mask")?;
        if !need_dx {
            return Ok(None);
        }
        let mut dx = one_tensor(self, dy)?.into_unique_as("dx")?;
        ops::dropout_bwd(self.rate, &mask, &mut dx)?;
        Ok(Some(Tree::leaf(dx)))
    }
}

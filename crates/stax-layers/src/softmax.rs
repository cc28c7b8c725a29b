//! stax's `Softmax` and `LogSoftmax`: `elementwise(softmax, axis=-1)` and
//! `elementwise(log_softmax, axis=-1)`, normalizations along one axis. They run in place on
//! their input's buffer and keep only their output, from which both backward passes are
//! computed ([`SoftmaxKind`]).
//!
//! ```
//! use stax_layers::{Layer, LogSoftmax, Softmax};
//! use stax_tensor::{Shape, Tree};
//! let x = Tree::leaf(Shape::new([4, 10]));
//! assert_eq!(LogSoftmax.output_shape(&x).unwrap(), x);
//! assert_eq!(Softmax.over(0).describe(), "softmax(axis=0)");
//! assert!(Softmax.over(2).output_shape(&x).is_err());
//! ```

use stax_tensor::{Params, Tree, ops};

pub use stax_tensor::SoftmaxKind;

use crate::layer::{expect_params, one_shape, one_tensor, residuals, saved_tensor};
use crate::{Cx, Layer, LayerError, ParamSpec, Residuals, Saved, Shapes, Value};

/// A softmax or log-softmax along `axis` (negative counts from the end), any shape and float
/// dtype, no parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AxisSoftmax {
    /// Which function.
    pub kind: SoftmaxKind,
    /// The axis (stax's default: -1).
    pub axis: isize,
}

/// stax's `Softmax`: `jax.nn.softmax(x, axis=-1)`.
#[allow(non_upper_case_globals)]
pub const Softmax: AxisSoftmax = AxisSoftmax {
    kind: SoftmaxKind::Softmax,
    axis: -1,
};

/// stax's `LogSoftmax`: `jax.nn.log_softmax(x, axis=-1)`.
#[allow(non_upper_case_globals)]
pub const LogSoftmax: AxisSoftmax = AxisSoftmax {
    kind: SoftmaxKind::LogSoftmax,
    axis: -1,
};

impl AxisSoftmax {
    /// The same function along `axis` (`elementwise(softmax, axis=axis)`).
    pub fn over(self, axis: isize) -> AxisSoftmax {
        AxisSoftmax { axis, ..self }
    }

    /// The axis for an input of `rank`.
    fn axis_for(&self, input: &Shapes) -> Result<usize, LayerError> {
        let rank = one_shape(self, input)?.rank();
        ops::axis_of(self.kind.name(), self.axis, rank).map_err(|e| match e {
            stax_tensor::TensorError::InvalidArgument { reason, .. } => {
                self.shape_error(reason, input)
            }
            other => other.into(),
        })
    }
}

impl Layer for AxisSoftmax {
    fn kind(&self) -> &'static str {
        self.kind.name()
    }

    fn describe(&self) -> String {
        format!("{}(axis={})", self.kind.name(), self.axis)
    }

    fn output_shape(&self, input: &Shapes) -> Result<Shapes, LayerError> {
        self.axis_for(input)?;
        Ok(input.clone())
    }

    fn param_specs(&self, input: &Shapes) -> Result<Tree<ParamSpec>, LayerError> {
        self.output_shape(input)?;
        Ok(Tree::empty())
    }

    fn apply(
        &self,
        params: &Params,
        x: Value,
        cx: &mut Cx<'_>,
    ) -> Result<(Value, Residuals), LayerError> {
        expect_params(params, self, &Tree::empty())?;
        let x = one_tensor(self, x)?;
        let axis = self.axis_for(&Tree::leaf(x.shape().clone()))?;
        let mut y = x.into_unique_as("output")?;
        ops::softmax(self.kind, axis, &mut y)?;
        let kept = match cx.is_training() {
            true => residuals([("y", Saved::Tensor(y.clone()))]),
            false => Tree::empty(),
        };
        Ok((Tree::leaf(y), kept))
    }

    /// `dx` over `dy`'s buffer, from the saved output.
    fn vjp(
        &self,
        params: &Params,
        mut residuals: Residuals,
        dy: Value,
        _cx: &mut Cx<'_>,
        need_dx: bool,
    ) -> Result<Option<Value>, LayerError> {
        expect_params(params, self, &Tree::empty())?;
        let y = saved_tensor(self, &mut residuals, "y")?;
        if !need_dx {
            return Ok(None);
        }
        let axis = self.axis_for(&Tree::leaf(y.shape().clone()))?;
        let mut dx = one_tensor(self, dy)?.into_unique_as("dx")?;
        ops::softmax_bwd(self.kind, axis, &y, &mut dx)?;
        Ok(Some(Tree::leaf(dx)))
    }
}

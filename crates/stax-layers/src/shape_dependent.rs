//! `ShapeDependent`: stax's `shape_dependent(make_layer)`, a layer built from its input's
//! shapes. ResNet-50's `IdentityBlock` uses it to give its last 1x1 convolution as many
//! channels as its input has.
//!
//! Like stax's, it is transparent: its parameters are the made layer's, and the layer is made
//! again from the shapes each time it is asked anything (shapes, specs, apply, vjp), so one
//! closure decides them all consistently. The backward pass makes it from the input shapes its
//! forward pass kept.
//!
//! ```
//! use stax_layers::{Dense, Layer, ShapeDependent};
//! use stax_tensor::{Shape, Tree};
//! // a Dense as wide as its input
//! let same_width = ShapeDependent::new(|s| {
//!     let width = s.as_leaf().map_or(1, |s| s.last());
//!     Box::new(Dense(width))
//! });
//! let out = same_width.output_shape(&Tree::leaf(Shape::new([2, 7]))).unwrap();
//! assert_eq!(out, Tree::leaf(Shape::new([2, 7])));
//! ```

use std::fmt;

use stax_tensor::{Key, Params, Tree};

use crate::layer::shapes_of;
use crate::{Cx, Layer, LayerError, ParamSpec, Residuals, Saved, Shapes, Value};

/// The function that makes the layer for an input's shapes.
type Make = dyn Fn(&Shapes) -> Box<dyn Layer> + Send + Sync;

/// stax's `shape_dependent(make_layer)` (see the module docs).
pub struct ShapeDependent(Box<Make>);

impl fmt::Debug for ShapeDependent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ShapeDependent(..)")
    }
}

impl ShapeDependent {
    /// The layer `make(input_shapes)` returns.
    pub fn new(make: impl Fn(&Shapes) -> Box<dyn Layer> + Send + Sync + 'static) -> Self {
        ShapeDependent(Box::new(make))
    }

    /// The layer for `input`.
    pub fn layer(&self, input: &Shapes) -> Box<dyn Layer> {
        (self.0)(input)
    }
}

/// The input shapes a forward pass keeps, and back.
fn kept(shapes: &Shapes) -> Residuals {
    shapes.map(|s| Saved::Shape(s.clone()))
}

fn restored(saved: &Residuals) -> Option<Shapes> {
    saved
        .try_map(|_, s| match s {
            Saved::Shape(s) => Ok(s.clone()),
            _ => Err(()),
        })
        .ok()
}

impl Layer for ShapeDependent {
    fn kind(&self) -> &'static str {
        "shape_dependent"
    }

    fn output_shape(&self, input: &Shapes) -> Result<Shapes, LayerError> {
        self.layer(input).output_shape(input)
    }

    fn param_specs(&self, input: &Shapes) -> Result<Tree<ParamSpec>, LayerError> {
        self.layer(input).param_specs(input)
    }

    fn policies(&self, input: &Shapes) -> Vec<crate::Policy> {
        self.layer(input).policies(input)
    }

    fn apply(
        &self,
        params: &Params,
        x: Value,
        cx: &mut Cx<'_>,
    ) -> Result<(Value, Residuals), LayerError> {
        let shapes = shapes_of(&x);
        let (y, r) = self.layer(&shapes).apply(params, x, cx)?;
        if !cx.is_training() {
            return Ok((y, r));
        }
        let saved = Tree::node([
            (Key::Field("input"), kept(&shapes)),
            (Key::Field("layer"), r),
        ]);
        Ok((y, saved))
    }

    fn vjp(
        &self,
        params: &Params,
        residuals: Residuals,
        dy: Value,
        cx: &mut Cx<'_>,
        need_dx: bool,
    ) -> Result<Option<Value>, LayerError> {
        let mut parts = residuals.into_children().into_iter();
        let (input, layer) = match (parts.next(), parts.next(), parts.next()) {
            (Some((Key::Field("input"), i)), Some((Key::Field("layer"), l)), None) => (i, l),
            _ => return Err(self.mismatch("residuals", "expected `input` and `layer`".into())),
        };
        let shapes = restored(&input)
            .ok_or_else(|| self.mismatch("residuals", "`input` holds a tensor".into()))?;
        self.layer(&shapes).vjp(params, layer, dy, cx, need_dx)
    }
}

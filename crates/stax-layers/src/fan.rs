//! stax's fan combinators: `FanOut` (one input to many branches), `FanInSum` and
//! `FanInConcat` (many branches to one).

use stax_alloc::Tag;
use stax_tensor::ops::{self, axis_of, concat_shape};
use stax_tensor::{BinaryOp, Category, Key, Params, Shape, Tensor, Tree};

use crate::layer::{expect_params, one_tensor, saved_tensor, shapes_of};
use crate::{
    Activation, Cx, Layer, LayerError, ParamSpec, Residuals, Saved, Shapes, Value, activation,
};

/// Branches as one node keyed by position.
fn indexed<T>(items: impl IntoIterator<Item = Tree<T>>) -> Tree<T> {
    Tree::node(
        items
            .into_iter()
            .enumerate()
            .map(|(i, t)| (Key::Index(i), t)),
    )
}

/// The branches of a node input (at least one), each a single tensor.
fn branches<T: Clone>(
    layer: &dyn Layer,
    input: &Tree<T>,
    shapes: &Shapes,
) -> Result<Vec<T>, LayerError> {
    let leaves: Option<Vec<T>> = input
        .children()
        .iter()
        .map(|(_, t)| t.as_leaf().cloned())
        .collect();
    match leaves {
        Some(v) if !v.is_empty() && matches!(input, Tree::Node(_)) => Ok(v),
        _ => Err(layer.shape_error("expected a node of one or more tensors".into(), shapes)),
    }
}

/// stax's `FanOut(num)`: `num` copies of its input (handles: nothing is copied), as a node
/// keyed by position. The backward pass sums the branches' gradients (in place, in the first
/// branch's buffer when nothing else holds it); the ReLU mask of a `FanInSum` before it
/// ([`Layer::masks_dx`]: ResNet's blocks one after another) is applied in the last add.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FanOut(pub usize);

impl Layer for FanOut {
    fn kind(&self) -> &'static str {
        "fan_out"
    }

    fn describe(&self) -> String {
        format!("fan_out({})", self.0)
    }

    fn output_shape(&self, input: &Shapes) -> Result<Shapes, LayerError> {
        if self.0 == 0 {
            return Err(self.config("num must be at least 1".into()));
        }
        Ok(indexed((0..self.0).map(|_| input.clone())))
    }

    fn param_specs(&self, input: &Shapes) -> Result<Tree<ParamSpec>, LayerError> {
        self.output_shape(input)?;
        Ok(Tree::empty())
    }

    fn apply(
        &self,
        params: &Params,
        x: Value,
        _cx: &mut Cx<'_>,
    ) -> Result<(Value, Residuals), LayerError> {
        expect_params(params, self, &Tree::empty())?;
        self.output_shape(&shapes_of(&x))?;
        Ok((indexed((0..self.0).map(|_| x.clone())), Tree::empty()))
    }

    fn vjp(
        &self,
        params: &Params,
        _residuals: Residuals,
        dy: Value,
        _cx: &mut Cx<'_>,
        need_dx: bool,
    ) -> Result<Option<Value>, LayerError> {
        self.sum_grads(params, dy, need_dx, None)
    }

    fn masks_dx(&self) -> bool {
        true
    }

    fn vjp_masking_dx(
        &self,
        params: &Params,
        _residuals: Residuals,
        dy: Value,
        _cx: &mut Cx<'_>,
        mask: &Tensor,
    ) -> Result<Option<Value>, LayerError> {
        self.sum_grads(params, dy, true, Some(mask))
    }
}

impl FanOut {
    /// The branches' gradients `dy` summed when `need_dx`, then masked by a ReLU's `mask` when
    /// given (in the last add's pass; one tensor a branch, so each is a leaf).
    fn sum_grads(
        &self,
        params: &Params,
        dy: Value,
        need_dx: bool,
        mask: Option<&Tensor>,
    ) -> Result<Option<Value>, LayerError> {
        expect_params(params, self, &Tree::empty())?;
        let shapes = shapes_of(&dy);
        let mut parts = dy.into_children().into_iter().map(|(_, t)| t);
        let first = parts
            .next()
            .filter(|_| shapes.children().len() == self.0)
            .ok_or_else(|| {
                self.mismatch("output gradients", format!("expected {} branches", self.0))
            })?;
        if !need_dx {
            return Ok(None);
        }
        let mut acc = first.try_map_into(|_, t| t.into_unique_as("dx"))?;
        let last = parts.len();
        for (i, part) in parts.enumerate() {
            if let Some(e) = part.structure_differs(&acc) {
                return Err(self.mismatch("output gradients", e.to_string()));
            }
            for (a, b) in acc.leaves_mut().into_iter().zip(part.leaves()) {
                match mask.filter(|_| i + 1 == last) {
                    Some(m) => ops::binary_masked(BinaryOp::Add, a, b, m)?,
                    None => ops::binary(BinaryOp::Add, a, b)?,
                }
            }
        }
        if let (Some(m), 0) = (mask, last) {
            let mut leaves = acc.leaves_mut().into_iter();
            match (leaves.next(), leaves.next()) {
                (Some(a), None) => ops::unary_bwd(Activation::Relu, m, a)?,
                _ => {
                    return Err(self.mismatch("output gradients", "a mask needs one tensor".into()));
                }
            }
        }
        Ok(Some(acc))
    }
}

/// stax's `FanInSum`: the sum of its input's branches (a node of tensors of one shape; in
/// place, in the first branch's buffer when nothing else holds it). The backward pass hands
/// every branch the same gradient (handles: nothing is copied). A ReLU after it (ResNet's
/// blocks) runs in the last add's kernel ([`Layer::fuses`], [`ops::binary_relu`]): one pass
/// over the sum fewer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FanInSum;

impl FanInSum {
    /// The sum of the branches of `x`, followed by a ReLU writing `relu` when given; the
    /// residuals: one empty child per branch, and the ReLU's mask.
    fn sum(
        &self,
        params: &Params,
        x: Value,
        mut relu: Option<Tensor>,
    ) -> Result<(Value, Residuals), LayerError> {
        expect_params(params, self, &Tree::empty())?;
        let shapes = shapes_of(&x);
        self.output_shape(&shapes)?;
        let parts = branches(self, &x, &shapes)?;
        drop(x);
        let n = parts.len();
        let mut parts = parts.into_iter();
        let mut acc = parts
            .next()
            .ok_or_else(|| self.shape_error("no branches".into(), &shapes))?
            .into_unique_as("output")?;
        let last = parts.len();
        for (i, b) in parts.enumerate() {
            match relu.as_mut().filter(|_| i + 1 == last) {
                Some(mask) => ops::binary_relu(BinaryOp::Add, &mut acc, &b, mask)?,
                None => ops::binary(BinaryOp::Add, &mut acc, &b)?,
            }
        }
        if let (Some(mask), 0) = (relu.as_mut(), last) {
            ops::unary(Activation::Relu, &mut acc, Some(mask))?;
        }
        Ok((Tree::leaf(acc), sum_residuals(n, relu)))
    }
}

/// A `FanInSum`'s residuals: one empty child per branch, and a fused ReLU's mask.
fn sum_residuals(branches: usize, relu: Option<Tensor>) -> Residuals {
    let mut residuals = indexed((0..branches).map(|_| Tree::empty()));
    if let (Tree::Node(children), Some(mask)) = (&mut residuals, relu) {
        let key = activation::saved_key(Activation::Relu);
        children.push((Key::Field(key), Tree::leaf(Saved::Tensor(mask))));
    }
    residuals
}

/// The branches a `FanInSum`'s residuals count (the children keyed by position).
fn branch_count(residuals: &Residuals) -> usize {
    let children = residuals.children();
    children
        .iter()
        .filter(|(k, _)| matches!(k, Key::Index(_)))
        .count()
}

impl Layer for FanInSum {
    fn kind(&self) -> &'static str {
        "fan_in_sum"
    }

    fn output_shape(&self, input: &Shapes) -> Result<Shapes, LayerError> {
        let shapes = branches(self, input, input)?;
        if let Some((i, s)) = shapes.iter().enumerate().find(|(_, s)| *s != &shapes[0]) {
            let reason = format!("branch {i} has shape {s} but branch 0 has {}", shapes[0]);
            return Err(self.shape_error(reason, input));
        }
        Ok(Tree::leaf(shapes[0].clone()))
    }

    fn param_specs(&self, input: &Shapes) -> Result<Tree<ParamSpec>, LayerError> {
        self.output_shape(input)?;
        Ok(Tree::empty())
    }

    fn apply(
        &self,
        params: &Params,
        x: Value,
        _cx: &mut Cx<'_>,
    ) -> Result<(Value, Residuals), LayerError> {
        self.sum(params, x, None)
    }

    fn vjp(
        &self,
        params: &Params,
        residuals: Residuals,
        dy: Value,
        _cx: &mut Cx<'_>,
        need_dx: bool,
    ) -> Result<Option<Value>, LayerError> {
        expect_params(params, self, &Tree::empty())?;
        let dy = one_tensor(self, dy)?;
        let n = branch_count(&residuals);
        Ok(need_dx.then(|| indexed((0..n).map(|_| Tree::leaf(dy.clone())))))
    }

    /// A ReLU, its mask written by the last add's kernel.
    fn fuses(&self, act: Activation) -> bool {
        act == Activation::Relu
    }

    fn apply_fused(
        &self,
        params: &Params,
        x: Value,
        _cx: &mut Cx<'_>,
        act: Activation,
        aux: Option<Tensor>,
    ) -> Result<(Value, Residuals), LayerError> {
        match (act, aux) {
            (Activation::Relu, Some(mask)) => self.sum(params, x, Some(mask)),
            _ => Err(self.config(format!("fuses a ReLU with its mask, not {act:?}"))),
        }
    }

    /// `dy` masked by the ReLU's saved mask (in place), then handed to every branch.
    fn vjp_fused(
        &self,
        params: &Params,
        mut residuals: Residuals,
        dy: Value,
        cx: &mut Cx<'_>,
        act: Activation,
        need_dx: bool,
    ) -> Result<Option<Value>, LayerError> {
        if act != Activation::Relu {
            return Err(self.config(format!("fuses a ReLU, not {act:?}")));
        }
        let mask = relu_mask(self, &mut residuals)?;
        let mut dy = one_tensor(self, dy)?.into_unique_as("dx")?;
        if let Some(mask) = mask {
            ops::unary_bwd(act, &mask, &mut dy)?;
        }
        self.vjp(params, residuals, Tree::leaf(dy), cx, need_dx)
    }

    fn sums_branches(&self) -> bool {
        true
    }

    fn summed_residuals(&self, branches: usize, mask: Tensor) -> Residuals {
        sum_residuals(branches, Some(mask))
    }

    /// The fused ReLU's mask, when this sum was fused with one and it is still there.
    fn take_dy_mask(&self, residuals: &mut Residuals) -> Option<Tensor> {
        relu_mask(self, residuals).ok().flatten()
    }
}

/// A `FanInSum`'s fused ReLU mask taken out of its residuals: `None` when its slot is empty
/// (the layer after the sum in a serial applied it, [`Layer::take_dy_mask`]).
///
/// # Errors
/// [`LayerError::Mismatch`] when there is no slot (the sum was not fused with a ReLU).
fn relu_mask(layer: &FanInSum, residuals: &mut Residuals) -> Result<Option<Tensor>, LayerError> {
    let key = activation::saved_key(Activation::Relu);
    let taken = residuals
        .children()
        .iter()
        .any(|(k, t)| *k == Key::Field(key) && matches!(t, Tree::Node(c) if c.is_empty()));
    match taken {
        true => Ok(None),
        false => saved_tensor(layer, residuals, key).map(Some),
    }
}

/// stax's `FanInConcat(axis)`: its input's branches (a node of tensors) concatenated along
/// `axis` (negative counts from the end; stax's default is -1, the channels of NHWC). The
/// backward pass splits the gradient back into the branches' shapes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FanInConcat(pub isize);

impl Default for FanInConcat {
    /// The last axis, as stax's `FanInConcat()`.
    fn default() -> Self {
        FanInConcat(-1)
    }
}

impl FanInConcat {
    /// The axis and the output shape for branches of `shapes`.
    fn plan(&self, input: &Shapes) -> Result<(usize, Shape), LayerError> {
        let shapes = branches(self, input, input)?;
        let bad = |e: stax_tensor::TensorError| {
            let reason = match e {
                stax_tensor::TensorError::Shape { reason, .. }
                | stax_tensor::TensorError::InvalidArgument { reason, .. } => reason,
                other => other.to_string(),
            };
            self.shape_error(reason, input)
        };
        let axis = axis_of("fan_in_concat", self.0, shapes[0].rank()).map_err(bad)?;
        let refs: Vec<&Shape> = shapes.iter().collect();
        let out = concat_shape("fan_in_concat", axis, &refs).map_err(bad)?;
        Ok((axis, out))
    }
}

impl Layer for FanInConcat {
    fn kind(&self) -> &'static str {
        "fan_in_concat"
    }

    fn describe(&self) -> String {
        format!("fan_in_concat(axis={})", self.0)
    }

    fn output_shape(&self, input: &Shapes) -> Result<Shapes, LayerError> {
        Ok(Tree::leaf(self.plan(input)?.1))
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
        let shapes = shapes_of(&x);
        let (axis, out) = self.plan(&shapes)?;
        let parts = branches(self, &x, &shapes)?;
        let dtype = parts[0].dtype();
        let tag = Tag::new(Category::Activation, "output");
        let mut y = Tensor::empty(cx.backend(), out, dtype, tag)?;
        let refs: Vec<&Tensor> = parts.iter().collect();
        ops::concat(axis, &refs, &mut y)?;
        let kept = match cx.is_training() {
            true => indexed(
                parts
                    .iter()
                    .map(|t| Tree::leaf(Saved::Shape(t.shape().clone()))),
            ),
            false => Tree::empty(),
        };
        Ok((Tree::leaf(y), kept))
    }

    fn vjp(
        &self,
        params: &Params,
        residuals: Residuals,
        dy: Value,
        _cx: &mut Cx<'_>,
        need_dx: bool,
    ) -> Result<Option<Value>, LayerError> {
        expect_params(params, self, &Tree::empty())?;
        let dy = one_tensor(self, dy)?;
        let shapes: Option<Vec<Shape>> = residuals
            .leaves()
            .into_iter()
            .map(|s| match s {
                Saved::Shape(s) => Some(s.clone()),
                _ => None,
            })
            .collect();
        let shapes = shapes.ok_or_else(|| self.mismatch("residuals", "expected shapes".into()))?;
        if !need_dx {
            return Ok(None);
        }
        let node = indexed(shapes.iter().map(|s| Tree::leaf(s.clone())));
        let (axis, _) = self.plan(&node)?;
        let tag = Tag::new(Category::Gradient, "dx");
        let mut outs = shapes
            .into_iter()
            .map(|s| Tensor::empty(dy.backend(), s, dy.dtype(), tag))
            .collect::<Result<Vec<_>, _>>()?;
        ops::split(axis, &dy, &mut outs)?;
        Ok(Some(indexed(outs.into_iter().map(Tree::leaf))))
    }
}

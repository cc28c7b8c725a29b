//! `Dense`: fully connected layer (stax's `Dense`).

use stax_alloc::Tag;
use stax_tensor::{Category, DType, Key, Params, Shape, Tensor, Tree, ops};

use crate::layer::{expect_params, one_shape, one_tensor, residuals, saved_tensor};
use crate::{Cx, Init, Layer, LayerError, ParamSpec, Residuals, Saved, Shapes, Value};

/// stax's `Dense(out_dim)`: `y = x · w + b` over the last axis.
///
/// x `[..., in]`, w `[in, out_dim]` initialized with `glorot_normal()`, b `[out_dim]` with
/// `normal(1e-2)`; y `[..., out_dim]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dense(pub usize);

/// `(rows, in)`: the input seen as a matrix.
fn as_matrix(input: &Shape) -> (usize, usize) {
    let k = input.last();
    (input.numel() / k.max(1), k)
}

fn with_last(shape: &Shape, last: usize) -> Shape {
    let mut d = shape.dims().to_vec();
    if let Some(l) = d.last_mut() {
        *l = last;
    }
    Shape::new(d)
}

impl Dense {
    fn check(&self, input: &Shape) -> Result<Shape, LayerError> {
        let bad = |reason: &str| self.shape_error(reason.into(), &Tree::leaf(input.clone()));
        if self.0 == 0 {
            return Err(self.config("out_dim must be positive".into()));
        }
        if input.rank() == 0 || input.last() == 0 {
            return Err(bad(
                "expected an input [..., features] with a non-empty last (feature) axis",
            ));
        }
        Ok(with_last(input, self.0))
    }

    fn specs(&self, input: &Shape) -> Tree<ParamSpec> {
        let glorot = Init::GlorotNormal {
            in_axis: 0,
            out_axis: 1,
        };
        Tree::node([
            (
                Key::Field("w"),
                Tree::leaf(ParamSpec::f32([input.last(), self.0], glorot)),
            ),
            (
                Key::Field("b"),
                Tree::leaf(ParamSpec::f32([self.0], Init::Normal(1e-2))),
            ),
        ])
    }
}

impl Layer for Dense {
    fn kind(&self) -> &'static str {
        "dense"
    }

    fn describe(&self) -> String {
        format!("dense({})", self.0)
    }

    fn output_shape(&self, input: &Shapes) -> Result<Shapes, LayerError> {
        Ok(Tree::leaf(self.check(one_shape(self, input)?)?))
    }

    fn param_specs(&self, input: &Shapes) -> Result<Tree<ParamSpec>, LayerError> {
        let input = one_shape(self, input)?;
        self.check(input)?;
        Ok(self.specs(input))
    }

    fn apply(
        &self,
        params: &Params,
        x: Value,
        cx: &mut Cx<'_>,
    ) -> Result<(Value, Residuals), LayerError> {
        let x = one_tensor(self, x)?;
        let out_shape = self.check(x.shape())?;
        let wb = expect_params(params, self, &self.specs(x.shape()))?;
        let (rows, k) = as_matrix(x.shape());
        let x2 = x.reshape([rows, k])?;
        drop(x);
        let be = x2.backend().clone();
        let tag = Tag::new(Category::Activation, "output");
        let mut y = Tensor::empty(&be, [rows, self.0], DType::F32, tag)?;
        ops::matmul(&x2, wb[0], false, false, &mut y)?;
        ops::bias_add(&mut y, wb[1])?;
        let saved = match cx.is_training() {
            true => residuals([("x", Saved::Tensor(x2))]),
            false => Tree::empty(),
        };
        Ok((Tree::leaf(y.reshape(out_shape)?), saved))
    }

    /// Backward: `dw = xᵀ·dy`, `db = Σ dy`, then `dx = dy·wᵀ` written over `x`'s buffer when
    /// nothing else holds it.
    fn vjp(
        &self,
        params: &Params,
        mut residuals: Residuals,
        dy: Value,
        cx: &mut Cx<'_>,
        need_dx: bool,
    ) -> Result<Option<Value>, LayerError> {
        let x2 = saved_tensor(self, &mut residuals, "x")?;
        let wb = expect_params(params, self, &self.specs(x2.shape()))?;
        let dy = one_tensor(self, dy)?;
        let in_shape = with_last(dy.shape(), x2.shape().last());
        let dy2 = dy.reshape([x2.dims()[0], self.0])?;
        drop(dy);
        let be = dy2.backend().clone();
        let grad = |role| Tag::new(Category::Gradient, role);
        let mut dw = Tensor::empty(&be, wb[0].shape().clone(), DType::F32, grad("dw"))?;
        let mut db = Tensor::empty(&be, [self.0], DType::F32, grad("db"))?;
        ops::matmul(&x2, &dy2, true, false, &mut dw)?;
        ops::bias_grad(&dy2, &mut db)?;
        let dx = if need_dx {
            let mut dx = if x2.is_unique() {
                x2.note_role("dx");
                x2
            } else {
                drop(x2);
                let (rows, k) = as_matrix(&in_shape);
                Tensor::empty(&be, [rows, k], DType::F32, grad("dx"))?
            };
            ops::matmul(&dy2, wb[0], false, true, &mut dx)?;
            Some(Tree::leaf(dx.reshape(in_shape)?))
        } else {
            None
        };
        cx.gradients(Tree::fields([("w", dw), ("b", db)]))?;
        Ok(dx)
    }
}

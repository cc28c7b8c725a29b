//! `Dense`: fully connected layer (stax's `Dense`).

use stax_alloc::Tag;
use stax_tensor::backend::DenseDx;
use stax_tensor::{Category, DType, Key, Params, Path, Shape, Tensor, Tree, ops};

use crate::layer::{expect_params, one_shape, one_tensor, residuals, saved_tensor};
use crate::{
    Cx, InBackward, Init, Layer, LayerError, ParamSpec, Residuals, Saved, Shapes, Value,
    compute_copy,
};

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
                Tree::leaf(ParamSpec::f32([input.last(), self.0], glorot).updated_in_backward()),
            ),
            (
                Key::Field("b"),
                Tree::leaf(ParamSpec::f32([self.0], Init::Normal(1e-2))),
            ),
        ])
    }
}

impl Dense {
    /// The backward pass in the dtype of `dy2`: `dw = x2ᵀ · dy2`, `db`, and with `need_dx`
    /// `dx = dy2 · wᵀ` (over `x2`'s buffer when nothing else holds it), reading `w` cast to
    /// that dtype.
    fn backward(
        &self,
        w: &Tensor,
        (x2, dy2, in_shape): (Tensor, Tensor, Shape),
        need_dx: bool,
    ) -> Result<(Tensor, Tensor, Option<Value>), LayerError> {
        let (be, dtype) = (dy2.backend().clone(), dy2.dtype());
        let grad = |role| Tag::new(Category::Gradient, role);
        let mut dw = Tensor::empty(&be, w.shape().clone(), dtype, grad("dw"))?;
        let mut db = Tensor::empty(&be, [self.0], dtype, grad("db"))?;
        ops::matmul(&x2, &dy2, true, false, &mut dw)?;
        ops::bias_grad(&dy2, &mut db)?;
        let dx = if need_dx {
            let mut dx = if x2.is_unique() {
                x2.note_role("dx");
                x2
            } else {
                drop(x2);
                let (rows, k) = as_matrix(&in_shape);
                Tensor::empty(&be, [rows, k], dtype, grad("dx"))?
            };
            ops::matmul(
                &dy2,
                &compute_copy(w, dtype, "cast_w")?,
                false,
                true,
                &mut dx,
            )?;
            Some(Tree::leaf(dx.reshape(in_shape)?))
        } else {
            None
        };
        Ok((dw, db, dx))
    }

    /// The backward pass with Adam applied to `w` as its gradient is made (the step took `w`
    /// out of `params`, which hold only `b` here): `db = Σ dy` (in dy's dtype) to the sink,
    /// then [`ops::dense_adam`] writes `dx` in dy's dtype (over `x` when nothing else holds
    /// it) and updates the f32 `w` and its moments chunk by chunk, from a weight gradient in
    /// dy's dtype (f32 sums rounded once, as the unfused backward's `dw`; no whole gradient,
    /// no cast of `w`). The slot goes back to `cx` in every case.
    fn vjp_updating(
        &self,
        params: &Params,
        (x2, dy2, in_shape): (Tensor, Tensor, Shape),
        mut slot: InBackward,
        cx: &mut Cx<'_>,
        need_dx: bool,
    ) -> Result<Option<Value>, LayerError> {
        let run = |slot: &mut InBackward| -> Result<(Option<Value>, Tensor), LayerError> {
            let mut specs = self.specs(x2.shape());
            let w = specs.remove(&Path::root().child(Key::Field("w"), 0));
            if let Some(w) = w
                .as_ref()
                .and_then(Tree::as_leaf)
                .filter(|w| slot.p.shape() != &w.shape)
            {
                let reason = format!("w is {}, expected {}", slot.p.shape(), w.shape);
                return Err(self.mismatch("parameters", reason));
            }
            expect_params(params, self, &specs)?;
            let (be, dtype) = (dy2.backend().clone(), dy2.dtype());
            let grad = |role| Tag::new(Category::Gradient, role);
            let mut db = Tensor::empty(&be, [self.0], dtype, grad("db"))?;
            ops::bias_grad(&dy2, &mut db)?;
            let (mut x2, mut dx) = (x2, None);
            let mode = match (need_dx, x2.is_unique()) {
                (false, _) => DenseDx::Skip,
                (true, true) => {
                    x2.note_role("dx");
                    DenseDx::InPlace
                }
                (true, false) => {
                    let t = dx.insert(Tensor::empty(&be, x2.shape().clone(), dtype, grad("dx"))?);
                    DenseDx::Into(t)
                }
            };
            let InBackward { p, mu, nu, h, .. } = slot;
            ops::dense_adam(&mut x2, &dy2, p, mu, nu, mode, h)?;
            let dx = match (need_dx, dx) {
                (false, _) => None,
                (true, Some(d)) => Some(Tree::leaf(d.reshape(in_shape.clone())?)),
                (true, None) => Some(Tree::leaf(x2.reshape(in_shape.clone())?)),
            };
            Ok((dx, db))
        };
        let out = run(&mut slot);
        cx.give_back("w", 0, slot, out.is_ok());
        let (dx, db) = out?;
        cx.gradients(Tree::fields([("b", db)]))?;
        Ok(dx)
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

    /// `x` as [`Dense::apply`] keeps it: viewed as `[rows, features]`.
    fn residuals_from_input(&self, x: &Value) -> Result<Option<Residuals>, LayerError> {
        let x = one_tensor(self, x.clone())?;
        self.check(x.shape())?;
        let (rows, k) = as_matrix(x.shape());
        Ok(Some(residuals([(
            "x",
            Saved::Tensor(x.reshape([rows, k])?),
        )])))
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
        let dtype = x2.dtype();
        let tag = Tag::new(Category::Activation, "output");
        let mut y = Tensor::empty(&be, [rows, self.0], dtype, tag)?;
        // an f32 weight is read rounded to the compute dtype: no cast_w (ops::matmul)
        let w = match wb[0].dtype() {
            DType::F32 => wb[0].clone(),
            _ => compute_copy(wb[0], dtype, "cast_w")?,
        };
        ops::matmul(&x2, &w, false, false, &mut y)?;
        drop(w);
        ops::bias_add(&mut y, &compute_copy(wb[1], dtype, "cast_b")?)?;
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
        let dy = one_tensor(self, dy)?;
        let in_shape = with_last(dy.shape(), x2.shape().last());
        let dy2 = dy.reshape([x2.dims()[0], self.0])?;
        drop(dy);
        if let Some(slot) = cx.take_update("w", 0) {
            return self.vjp_updating(params, (x2, dy2, in_shape), slot, cx, need_dx);
        }
        let wb = expect_params(params, self, &self.specs(x2.shape()))?;
        let (dw, db, dx) = self.backward(wb[0], (x2, dy2, in_shape), need_dx)?;
        cx.gradients(Tree::fields([("w", dw), ("b", db)]))?;
        Ok(dx)
    }
}

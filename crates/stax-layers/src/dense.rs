//! `Dense`: fully connected layer (stax's `Dense`).

use crate::layer::{Init, ParamSpec, Saved, expect_fields};
use crate::{Grads, Layer, LayerError, Params, StepContext};
use stax_tensor::{Category, DType, Shape, Tensor, Tree};

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
    fn weights<'p>(
        &self,
        params: &'p Params,
        input: &Shape,
    ) -> Result<Vec<&'p Tensor>, LayerError> {
        expect_fields(params, self, &self.param_specs(input)?)
    }
}

impl Layer for Dense {
    fn kind(&self) -> &'static str {
        "dense"
    }

    fn name(&self) -> String {
        format!("dense({})", self.0)
    }

    fn output_shape(&self, input: &Shape) -> Result<Shape, LayerError> {
        let bad = |reason: &str| LayerError::Shape {
            layer: self.name(),
            reason: reason.into(),
            input: input.clone(),
        };
        if self.0 == 0 {
            return Err(bad("out_dim must be positive"));
        }
        if input.rank() == 0 || input.last() == 0 {
            return Err(bad(
                "expected an input with a non-empty last (feature) axis",
            ));
        }
        Ok(with_last(input, self.0))
    }

    fn param_specs(&self, input: &Shape) -> Result<Vec<ParamSpec>, LayerError> {
        self.output_shape(input)?;
        let glorot = Init::GlorotNormal {
            in_axis: 0,
            out_axis: 1,
        };
        Ok(vec![
            ParamSpec {
                name: "w",
                shape: Shape::new([input.last(), self.0]),
                init: glorot,
            },
            ParamSpec {
                name: "b",
                shape: Shape::new([self.0]),
                init: Init::Normal(1e-2),
            },
        ])
    }

    fn apply(
        &self,
        params: &Params,
        x: Tensor,
        cx: &mut StepContext,
    ) -> Result<Tensor, LayerError> {
        let out_shape = self.output_shape(x.shape())?;
        let wb = self.weights(params, x.shape())?;
        let (rows, k) = as_matrix(x.shape());
        let x2 = x.reshape([rows, k])?;
        drop(x);
        let be = x2.backend().clone();
        let mut y = Tensor::empty(&be, [rows, self.0], DType::F32, Category::Activation)?;
        be.matmul(&x2, wb[0], false, false, &mut y)?;
        be.bias_add(&mut y, wb[1])?;
        cx.save(Saved::Tensor(x2));
        Ok(y.reshape(out_shape)?)
    }

    /// Backward: `dw = xᵀ·dy`, `db = Σ dy`, then `dx = dy·wᵀ` written over `x`'s buffer when
    /// nothing else holds it.
    fn vjp(
        &self,
        params: &Params,
        dy: Tensor,
        cx: &mut StepContext,
        need_dx: bool,
    ) -> Result<(Option<Tensor>, Grads), LayerError> {
        let x2 = cx.take_tensor(self)?;
        let wb = self.weights(params, x2.shape())?;
        let in_shape = with_last(dy.shape(), x2.shape().last());
        let dy2 = dy.reshape([x2.dims()[0], self.0])?;
        drop(dy);
        let be = dy2.backend().clone();
        let mut dw = Tensor::empty(&be, wb[0].shape().clone(), DType::F32, Category::Gradient)?;
        let mut db = Tensor::empty(&be, [self.0], DType::F32, Category::Gradient)?;
        be.matmul(&x2, &dy2, true, false, &mut dw)?;
        be.bias_grad(&dy2, &mut db)?;
        let dx = if need_dx {
            let mut dx = if x2.is_unique() {
                x2
            } else {
                drop(x2);
                let (rows, k) = as_matrix(&in_shape);
                Tensor::empty(&be, [rows, k], DType::F32, Category::Gradient)?
            };
            be.matmul(&dy2, wb[0], false, true, &mut dx)?;
            Some(dx.reshape(in_shape)?)
        } else {
            None
        };
        Ok((dx, Tree::fields([("w", dw), ("b", db)])))
    }
}

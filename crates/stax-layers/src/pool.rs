//! `MaxPool`, `SumPool`, `AvgPool`: stax's 2-D poolings, NHWC, one generic layer.

use std::marker::PhantomData;

use stax_alloc::Tag;
use stax_tensor::{
    Category, Conv2dGeometry, DType, Padding, Params, PoolKind, Shape, Tensor, Tree, ops,
};

use crate::conv_dims::reason;
use crate::layer::{expect_params, one_shape, one_tensor, residuals, saved_shape, saved_tensor};
use crate::{Cx, Layer, LayerError, ParamSpec, Residuals, Saved, Shapes, Value};

/// How a pooling layer combines its window (the marker types [`Max`], [`Sum`], [`Avg`]).
pub trait PoolKindOf: std::fmt::Debug + Clone + Copy + PartialEq + Eq + Send + Sync {
    /// The op's pooling.
    const KIND: PoolKind;
}

/// Max pooling's marker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Max;
/// Sum pooling's marker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sum;
/// Average pooling's marker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Avg;

impl PoolKindOf for Max {
    const KIND: PoolKind = PoolKind::Max;
}
impl PoolKindOf for Sum {
    const KIND: PoolKind = PoolKind::Sum;
}
impl PoolKindOf for Avg {
    const KIND: PoolKind = PoolKind::Avg;
}

/// stax's pooling layers, `Pooling(window_shape, strides=None, padding='VALID')` on NHWC input
/// (stax's default `spec`): each `window` (spatial only) moved by `strides` (stax's default: 1,
/// not the window) and combined as `K` says:
/// - [`MaxPool`]: the maximum, SAME padding reading -inf; the gradient goes to each window's
///   first maximum (XLA's select-and-scatter). Keeps its input for the backward pass (a handle).
/// - [`SumPool`]: the sum, padding reading 0 (`lax.reduce_window(add, 0.)`).
/// - [`AvgPool`]: the sum divided by the window's positions inside the input: stax divides by
///   `reduce_window(add)` of ones over the same windows, so under SAME a border window does not
///   count the padding (PyTorch's `count_include_pad=False`); under VALID it is the mean.
///
/// Sum and average pooling keep nothing but the input's shape: their gradient spreads `dy` over
/// the windows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pool<K: PoolKindOf> {
    /// Window `(height, width)`.
    pub window: (usize, usize),
    /// Strides `(height, width)`.
    pub strides: (usize, usize),
    /// SAME, VALID or explicit.
    pub padding: Padding,
    kind: PhantomData<K>,
}

/// stax's `MaxPool`.
pub type MaxPool = Pool<Max>;
/// stax's `SumPool`.
pub type SumPool = Pool<Sum>;
/// stax's `AvgPool`.
pub type AvgPool = Pool<Avg>;

impl<K: PoolKindOf> Pool<K> {
    /// stax's `MaxPool(window)` (or `SumPool`, `AvgPool`): stride 1, VALID.
    pub fn new(window: (usize, usize)) -> Self {
        Pool {
            window,
            strides: (1, 1),
            padding: Padding::Valid,
            kind: PhantomData,
        }
    }

    /// This pooling with `strides` and `padding`.
    pub fn with(self, strides: (usize, usize), padding: Padding) -> Self {
        Pool {
            strides,
            padding,
            ..self
        }
    }

    fn geometry(&self, input: &Shape) -> Result<Conv2dGeometry, LayerError> {
        let shapes = Tree::leaf(input.clone());
        let &[_, _, _, c] = input.dims() else {
            let reason = "expected an NHWC input [n, h, w, c] of rank 4".into();
            return Err(self.shape_error(reason, &shapes));
        };
        let (kh, kw) = self.window;
        let w = Shape::new([kh, kw, c, c]);
        Conv2dGeometry::new(input, &w, self.strides, self.padding)
            .and_then(|g| ops::check_pool_padding(K::KIND.name(), K::KIND, &g).map(|()| g))
            .map_err(|e| self.shape_error(reason(e), &shapes))
    }
}

impl<K: PoolKindOf> Layer for Pool<K> {
    fn kind(&self) -> &'static str {
        K::KIND.name()
    }

    fn describe(&self) -> String {
        let ((kh, kw), (sh, sw)) = (self.window, self.strides);
        let name = K::KIND.name();
        format!("{name}({kh}x{kw}, stride {sh}x{sw}, {})", self.padding)
    }

    fn output_shape(&self, input: &Shapes) -> Result<Shapes, LayerError> {
        Ok(Tree::leaf(
            self.geometry(one_shape(self, input)?)?.output_shape(),
        ))
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
        let g = self.geometry(x.shape())?;
        let tag = Tag::new(Category::Activation, "output");
        let mut y = Tensor::empty(x.backend(), g.output_shape(), x.dtype(), tag)?;
        let shape = Saved::Shape(x.shape().clone());
        let kept = match (cx.is_training(), K::KIND) {
            (true, PoolKind::Max) if keeps_argmax(&g, &x) => {
                let tag = Tag::new(Category::Activation, "argmax");
                let mut arg = Tensor::empty(x.backend(), g.output_shape(), DType::U32, tag)?;
                ops::max_pool2d_argmax(&g, &x, &mut y, &mut arg)?;
                return Ok((
                    Tree::leaf(y),
                    residuals([("x", shape), ("argmax", Saved::Tensor(arg))]),
                ));
            }
            (false, _) => Tree::empty(),
            (true, PoolKind::Max) => residuals([("x", Saved::Tensor(x.clone()))]),
            (true, _) => residuals([("x", shape)]),
        };
        ops::pool2d(K::KIND, &g, &x, &mut y)?;
        Ok((Tree::leaf(y), kept))
    }

    fn vjp(
        &self,
        params: &Params,
        mut residuals: Residuals,
        dy: Value,
        _cx: &mut Cx<'_>,
        need_dx: bool,
    ) -> Result<Option<Value>, LayerError> {
        expect_params(params, self, &Tree::empty())?;
        let arg = match K::KIND {
            PoolKind::Max => saved_tensor(self, &mut residuals, "argmax").ok(),
            _ => None,
        };
        let x = match (K::KIND, &arg) {
            (PoolKind::Max, None) => Some(saved_tensor(self, &mut residuals, "x")?),
            _ => None,
        };
        let shape = match &x {
            Some(x) => x.shape().clone(),
            None => saved_shape(self, &mut residuals, "x")?,
        };
        if !need_dx {
            return Ok(None);
        }
        let dy = one_tensor(self, dy)?;
        let g = self.geometry(&shape)?;
        let tag = Tag::new(Category::Gradient, "dx");
        let mut dx = Tensor::empty(dy.backend(), g.input_shape(), dy.dtype(), tag)?;
        match &arg {
            Some(arg) => ops::max_pool2d_bwd_argmax(&g, arg, &dy, &mut dx)?,
            None => ops::pool2d_bwd(K::KIND, &g, x.as_ref(), &dy, &mut dx)?,
        }
        Ok(Some(Tree::leaf(dx)))
    }
}

/// Whether max pooling keeps its windows' argmax offsets (a u32 per output) rather than its
/// input: when nothing else holds the input (keeping it would then cost nothing) and the
/// offsets take fewer bytes (under a 3x3 window of stride 2, a quarter of an f32 input).
fn keeps_argmax(g: &Conv2dGeometry, x: &Tensor) -> bool {
    x.is_unique() && g.output_shape().numel() * 4 < x.bytes()
}

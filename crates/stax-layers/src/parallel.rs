//! `Parallel`: layers applied to the branches of a tree input (stax's `parallel`), and
//! `Identity`.

use stax_tensor::{Key, Params, Tensor, Tree};

use crate::layer::children_of;
use crate::{Cx, Layer, LayerError, ParamSpec, Residuals, Shapes, Value};

/// stax's `parallel(*layers)`: layer `i` is applied to branch `i` of the input (a node of as
/// many branches, such as `FanOut`'s), and the outputs are the branches of the output, keyed
/// by position. Parameters: one child per layer keyed `{index}.{kind}`; an RNG key is split
/// per layer.
#[derive(Debug)]
pub struct Parallel(pub Vec<Box<dyn Layer>>);

/// `parallel![a, b]` builds a [`Parallel`] from layer values, like `stax.parallel(a, b)`.
#[macro_export]
macro_rules! parallel {
    ($($layer:expr),* $(,)?) => {
        $crate::Parallel(vec![$(Box::new($layer) as Box<dyn $crate::Layer>),*])
    };
}

impl Parallel {
    fn keys(&self) -> Vec<Key> {
        self.0
            .iter()
            .enumerate()
            .map(|(i, l)| Key::Layer(i, l.kind()))
            .collect()
    }

    /// The input's branches, one per layer.
    fn branches<T: Clone>(
        &self,
        input: &Tree<T>,
        shapes: &Shapes,
    ) -> Result<Vec<Tree<T>>, LayerError> {
        if matches!(input, Tree::Leaf(_)) || input.children().len() != self.0.len() {
            let reason = format!("expected a node of {} branches", self.0.len());
            return Err(self.shape_error(reason, shapes));
        }
        Ok(input.children().iter().map(|(_, t)| t.clone()).collect())
    }
}

/// Branch outputs as one node keyed by position.
fn indexed<T>(items: impl IntoIterator<Item = Tree<T>>) -> Tree<T> {
    Tree::node(
        items
            .into_iter()
            .enumerate()
            .map(|(i, t)| (Key::Index(i), t)),
    )
}

impl Layer for Parallel {
    fn kind(&self) -> &'static str {
        "parallel"
    }

    fn describe(&self) -> String {
        let names: Vec<String> = self.0.iter().map(|l| l.describe()).collect();
        format!("parallel[{}]", names.join(", "))
    }

    fn policies(&self, input: &Shapes) -> Vec<crate::Policy> {
        let branches = self.branches(input, input).unwrap_or_default();
        let layers = self.0.iter().zip(&branches);
        layers.flat_map(|(l, s)| l.policies(s)).collect()
    }

    fn output_shape(&self, input: &Shapes) -> Result<Shapes, LayerError> {
        let branches = self.branches(input, input)?;
        let outs = self
            .0
            .iter()
            .zip(self.keys())
            .zip(&branches)
            .map(|((l, k), s)| l.output_shape(s).map_err(|e| e.at(k)));
        Ok(indexed(outs.collect::<Result<Vec<_>, _>>()?))
    }

    fn param_specs(&self, input: &Shapes) -> Result<Tree<ParamSpec>, LayerError> {
        let branches = self.branches(input, input)?;
        let specs = self
            .0
            .iter()
            .zip(self.keys())
            .zip(&branches)
            .map(|((l, k), s)| Ok((k, l.param_specs(s).map_err(|e| e.at(k))?)));
        Ok(Tree::Node(specs.collect::<Result<_, LayerError>>()?))
    }

    fn apply(
        &self,
        params: &Params,
        x: Value,
        cx: &mut Cx<'_>,
    ) -> Result<(Value, Residuals), LayerError> {
        let keys = self.keys();
        let children = children_of(self, params, &keys, "parameters")?;
        let shapes = x.map(|t| t.shape().clone());
        self.branches(&x, &shapes)?;
        let rngs = cx.split_rng(self.0.len());
        let (mut outs, mut saved) = (Vec::new(), Vec::new());
        let branches = x.into_children().into_iter().zip(rngs);
        for (i, ((_, branch), rng)) in branches.enumerate() {
            let layer = &*self.0[i];
            let (y, r) = cx.apply_child((keys[i], i), rng, layer, children[i], branch)?;
            outs.push(y);
            saved.push((keys[i], cx.kept(r)));
        }
        Ok((indexed(outs), Tree::Node(saved)))
    }

    fn runs_summed(&self) -> bool {
        self.0.len() == 2 && self.0[0].adds()
    }

    /// Branch 1 first, then branch 0 adding its output in its last pass.
    fn apply_summed(
        &self,
        params: &Params,
        x: Value,
        cx: &mut Cx<'_>,
        mask: &mut Tensor,
    ) -> Result<(Value, Residuals), LayerError> {
        let keys = self.keys();
        let children = children_of(self, params, &keys, "parameters")?;
        let shapes = x.map(|t| t.shape().clone());
        self.branches(&x, &shapes)?;
        if !self.runs_summed() {
            return Err(self.config("runs summed with two branches, the first adding".into()));
        }
        let mut rngs = cx.split_rng(2);
        let mut inputs = x.into_children().into_iter().map(|c| c.1);
        let (x0, x1) = (inputs.next(), inputs.next());
        let (x0, x1) = x0
            .zip(x1)
            .ok_or_else(|| self.shape_error("two branches".into(), &shapes))?;
        let (b0, b1) = (&*self.0[0], &*self.0[1]);
        let (s, r1) = cx.apply_child((keys[1], 1), rngs[1].take(), b1, children[1], x1)?;
        let add = match s {
            Tree::Leaf(t) => t,
            other => {
                let reason = "branch 1 gives no single tensor to add".into();
                return Err(self.shape_error(reason, &other.map(|t| t.shape().clone())));
            }
        };
        let (y, r0) = cx.child(keys[0], 0, rngs[0].take(), |cx| {
            b0.apply_adding(children[0], x0, cx, (&add, mask))
        })?;
        let saved = vec![(keys[0], cx.kept(r0)), (keys[1], cx.kept(r1))];
        Ok((y, Tree::Node(saved)))
    }

    fn vjp(
        &self,
        params: &Params,
        residuals: Residuals,
        dy: Value,
        cx: &mut Cx<'_>,
        need_dx: bool,
    ) -> Result<Option<Value>, LayerError> {
        let keys = self.keys();
        let children = children_of(self, params, &keys, "parameters")?;
        children_of(self, &residuals, &keys, "residuals")?;
        let shapes = dy.map(|t| t.shape().clone());
        self.branches(&dy, &shapes)?;
        let pairs = residuals
            .into_children()
            .into_iter()
            .zip(dy.into_children());
        let mut dxs = Vec::new();
        for (i, ((_, r), (_, d))) in pairs.enumerate() {
            let layer = &*self.0[i];
            let dx = cx.child(keys[i], i, None, |cx| {
                layer.vjp(children[i], r, d, cx, need_dx)
            })?;
            dxs.push(dx);
        }
        Ok(dxs.into_iter().collect::<Option<Vec<_>>>().map(indexed))
    }
}

/// stax's `Identity`: returns its input, whatever its structure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Identity;

impl Layer for Identity {
    fn kind(&self) -> &'static str {
        "identity"
    }

    fn output_shape(&self, input: &Shapes) -> Result<Shapes, LayerError> {
        Ok(input.clone())
    }

    fn param_specs(&self, _input: &Shapes) -> Result<Tree<ParamSpec>, LayerError> {
        Ok(Tree::empty())
    }

    fn apply(
        &self,
        params: &Params,
        x: Value,
        _cx: &mut Cx<'_>,
    ) -> Result<(Value, Residuals), LayerError> {
        crate::layer::expect_params(params, self, &Tree::empty())?;
        Ok((x, Tree::empty()))
    }

    fn vjp(
        &self,
        params: &Params,
        _residuals: Residuals,
        dy: Value,
        _cx: &mut Cx<'_>,
        need_dx: bool,
    ) -> Result<Option<Value>, LayerError> {
        crate::layer::expect_params(params, self, &Tree::empty())?;
        Ok(need_dx.then_some(dy))
    }
}

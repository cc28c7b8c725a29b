//! `Serial`: layers applied one after another (stax's `serial`).

use stax_tensor::{Key, Params, Tree};

use crate::fuse::{apply_pair, fused_at, vjp_pair};
use crate::{Cx, Layer, LayerError, ParamSpec, Residuals, Shapes, Value};

/// stax's `serial(*layers)`: composes layers; itself a [`Layer`], whose parameters are a node
/// with one child per layer, keyed `{index}.{kind}` (`2.conv`; parameter-free layers keep
/// their place with an empty node, as stax's `()`). An RNG key given to `apply` is split into
/// one key per layer, as stax's `serial` splits it.
#[derive(Debug)]
pub struct Serial(pub Vec<Box<dyn Layer>>);

/// `serial![a, b, c]` builds a [`Serial`] from layer values, like `stax.serial(a, b, c)`.
#[macro_export]
macro_rules! serial {
    ($($layer:expr),* $(,)?) => {
        $crate::Serial(vec![$(Box::new($layer) as Box<dyn $crate::Layer>),*])
    };
}

impl Serial {
    fn key(&self, i: usize) -> Key {
        Key::Layer(i, self.0[i].kind())
    }

    /// The input shapes of every layer plus the final output shapes (`len + 1` entries).
    ///
    /// # Errors
    /// The first layer whose input does not fit, with its path.
    pub fn shapes(&self, input: &Shapes) -> Result<Vec<Shapes>, LayerError> {
        let mut shapes = vec![input.clone()];
        for (i, layer) in self.0.iter().enumerate() {
            let next = layer
                .output_shape(&shapes[i])
                .map_err(|e| e.at(self.key(i)))?;
            shapes.push(next);
        }
        Ok(shapes)
    }

    /// Each layer's parameters, checked to be keyed as [`Serial`] keys them.
    fn children<'p>(&self, params: &'p Params) -> Result<Vec<&'p Params>, LayerError> {
        let keys: Vec<Key> = (0..self.0.len()).map(|i| self.key(i)).collect();
        children_of(self, params, &keys, "parameters")
    }
}

/// The children of a combinator's node (its parameters or residuals), checked to carry
/// `keys` in order.
pub(crate) fn children_of<'p, T>(
    layer: &dyn Layer,
    node: &'p Tree<T>,
    keys: &[Key],
    what: &'static str,
) -> Result<Vec<&'p Tree<T>>, LayerError> {
    let children = node.children();
    if matches!(node, Tree::Leaf(_)) || children.len() != keys.len() {
        let reason = format!(
            "expected {} per-layer entries, got {}",
            keys.len(),
            children.len()
        );
        return Err(layer.mismatch(what, reason));
    }
    keys.iter()
        .zip(children)
        .map(|(want, (key, t))| match key == want {
            true => Ok(t),
            false => Err(layer.mismatch(what, format!("entry `{key}` where `{want}` belongs"))),
        })
        .collect()
}

impl Layer for Serial {
    fn kind(&self) -> &'static str {
        "serial"
    }

    fn describe(&self) -> String {
        let names: Vec<String> = self.0.iter().map(|l| l.describe()).collect();
        format!("serial[{}]", names.join(", "))
    }

    fn policies(&self, input: &Shapes) -> Vec<crate::Policy> {
        let shapes = self.shapes(input).unwrap_or_default();
        let layers = self.0.iter().zip(&shapes);
        layers.flat_map(|(l, s)| l.policies(s)).collect()
    }

    fn output_shape(&self, input: &Shapes) -> Result<Shapes, LayerError> {
        Ok(self.shapes(input)?.pop().unwrap_or_else(|| input.clone()))
    }

    fn param_specs(&self, input: &Shapes) -> Result<Tree<ParamSpec>, LayerError> {
        let shapes = self.shapes(input)?;
        let specs = self
            .0
            .iter()
            .zip(&shapes)
            .enumerate()
            .map(|(i, (layer, s))| {
                let key = self.key(i);
                Ok((key, layer.param_specs(s).map_err(|e| e.at(key))?))
            });
        Ok(Tree::Node(specs.collect::<Result<_, LayerError>>()?))
    }

    fn apply(
        &self,
        params: &Params,
        x: Value,
        cx: &mut Cx<'_>,
    ) -> Result<(Value, Residuals), LayerError> {
        let children = self.children(params)?;
        let n = self.0.len();
        let mut rngs = cx.take_rng().map(|mut r| r.split(n).into_iter());
        let mut next_rng = || rngs.as_mut().and_then(Iterator::next);
        let (mut x, mut saved, mut i) = (x, Vec::with_capacity(n), 0);
        while i < n {
            let (layer, key) = (&*self.0[i], self.key(i));
            let rng = next_rng();
            match fused_at(&self.0, &children, i).filter(|_| cx.is_training()) {
                Some(act) => {
                    let act_key = self.key(i + 1);
                    let (y, r) =
                        apply_pair((layer, key, i), (act, act_key), children[i], x, cx, rng)?;
                    next_rng();
                    saved.push((key, cx.kept(r)));
                    saved.push((act_key, Tree::empty()));
                    x = y;
                    i += 2;
                }
                None => {
                    let (y, r) = cx.apply_child((key, i), rng, layer, children[i], x)?;
                    saved.push((key, cx.kept(r)));
                    x = y;
                    i += 1;
                }
            }
        }
        Ok((x, Tree::Node(saved)))
    }

    /// Backward through the layers in reverse; only the first layer's `need_dx` is the
    /// caller's, so no gradient is computed for the model's input unless asked for.
    fn vjp(
        &self,
        params: &Params,
        residuals: Residuals,
        dy: Value,
        cx: &mut Cx<'_>,
        need_dx: bool,
    ) -> Result<Option<Value>, LayerError> {
        let children = self.children(params)?;
        let keys: Vec<Key> = (0..self.0.len()).map(|i| self.key(i)).collect();
        children_of(self, &residuals, &keys, "residuals")?;
        let mut saved: Vec<Residuals> =
            residuals.into_children().into_iter().map(|c| c.1).collect();
        let (mut dy, mut end) = (Some(dy), self.0.len());
        while end > 0 {
            let i = end - 1;
            let d = dy.take().ok_or_else(|| {
                self.mismatch("output gradients", format!("layer {i} got no gradient"))
            })?;
            let r = std::mem::take(&mut saved[i]);
            // A fused pair left the activation's residuals empty (see `fuse`).
            let fused = i > 0 && r.children().is_empty() && matches!(r, Tree::Node(_));
            let act = if fused {
                fused_at(&self.0, &children, i - 1)
            } else {
                None
            };
            match act {
                Some(act) => {
                    let (j, layer) = (i - 1, &*self.0[i - 1]);
                    let r = std::mem::take(&mut saved[j]);
                    let want_dx = j > 0 || need_dx;
                    let pair = ((layer, keys[j], j), (act, keys[i]));
                    dy = vjp_pair(pair.0, pair.1, children[j], r, d, cx, want_dx)?;
                    end -= 2;
                }
                None => {
                    let layer = &*self.0[i];
                    let want_dx = i > 0 || need_dx;
                    dy = cx.child(keys[i], i, None, |cx| {
                        layer.vjp(children[i], r, d, cx, want_dx)
                    })?;
                    end -= 1;
                }
            }
        }
        Ok(dy)
    }
}

//! Making parameters: one walk over a layer's parameter specs ([`crate::Layer::param_specs`])
//! that draws them (stax's `init_fun`), only allocates them (for memory plans), or fills them
//! with given values (a checkpoint's).

use std::sync::Arc;

use stax_alloc::Tag;
use stax_tensor::{Backend, Key, Params, Path, Shape, Tensor, TensorError, Tree};

use crate::{Layer, LayerError, ParamSpec, Rng, Shapes};

/// Values of one parameter, given its path and spec: row-major f32, `spec.shape.numel()`.
pub type Values<'a> = dyn FnMut(&Path, &ParamSpec) -> Result<Vec<f32>, LayerError> + 'a;

/// Where parameter values come from.
pub enum ParamSource<'a> {
    /// Drawn from each spec's initializer. The key is split at every node of the spec tree,
    /// one key per child (as stax's `serial` splits its key per layer and a layer per
    /// parameter), and each parameter draws from its own key.
    Random(&'a mut Rng),
    /// Allocated only, contents unspecified ([`Tensor::empty`]): what a memory plan needs.
    Empty,
    /// Given: `values(path, spec)` returns the row-major f32 values of the parameter at `path`
    /// (a checkpoint's), `spec.shape.numel()` of them.
    Load(&'a mut Values<'a>),
}

impl std::fmt::Debug for ParamSource<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ParamSource::Random(_) => "Random",
            ParamSource::Empty => "Empty",
            ParamSource::Load(_) => "Load",
        })
    }
}

/// `layer`'s output shapes and parameters for `input`, on `backend`, tagged
/// [`stax_alloc::Category::Parameter`] and named by their paths (`2.conv/w`). Tensors are
/// allocated in the specs' order, each before its values are made, so a parameter too large
/// for the backend is its typed out-of-memory error before host memory is spent on it.
///
/// # Errors
/// Shape errors before any allocation; allocation and copy errors; the source's errors.
pub fn init_params(
    layer: &dyn Layer,
    input: &Shapes,
    backend: &Arc<dyn Backend>,
    source: ParamSource<'_>,
) -> Result<(Shapes, Params), LayerError> {
    let out = layer.output_shape(input)?;
    let specs = layer.param_specs(input)?;
    let mut fill = match source {
        ParamSource::Random(rng) => Fill::Random(rng),
        ParamSource::Empty => Fill::Empty,
        ParamSource::Load(f) => Fill::Load(f),
    };
    let params = walk(&specs, &Path::root(), &mut fill, backend)?;
    Ok((out, params))
}

/// The source of one subtree's values: a random source carries the subtree's key.
enum Fill<'r, 'a> {
    Random(&'r mut Rng),
    Empty,
    Load(&'r mut Values<'a>),
}

fn walk(
    specs: &Tree<ParamSpec>,
    at: &Path,
    fill: &mut Fill<'_, '_>,
    backend: &Arc<dyn Backend>,
) -> Result<Params, LayerError> {
    let spec = match specs {
        Tree::Leaf(spec) => spec,
        Tree::Node(children) => {
            let mut keys = match fill {
                Fill::Random(rng) => rng.split(children.len()),
                _ => Vec::new(),
            };
            let mut out = Vec::with_capacity(children.len());
            for (i, (k, child)) in children.iter().enumerate() {
                let _scope = match k {
                    Key::Field(_) => None,
                    _ => Some(backend.allocator().scope(&k.to_string())),
                };
                let mut sub = match (&mut *fill, keys.get_mut(i)) {
                    (Fill::Random(_), Some(key)) => Fill::Random(key),
                    (Fill::Load(f), _) => Fill::Load(&mut **f),
                    _ => Fill::Empty,
                };
                out.push((*k, walk(child, &at.child(*k, i), &mut sub, backend)?));
            }
            return Ok(Tree::Node(out));
        }
    };
    let role = match at.last() {
        Some(Key::Field(name)) => name,
        _ => "param",
    };
    let tag = Tag::new(stax_alloc::Category::Parameter, role);
    let mut t = Tensor::empty(backend, spec.shape.clone(), spec.dtype, tag)?;
    let values = match fill {
        Fill::Empty => return Ok(Tree::leaf(t)),
        Fill::Random(rng) => rng.sample(at, spec)?,
        Fill::Load(f) => f(at, spec)?,
    };
    check_len(at, &spec.shape, values.len())?;
    stax_tensor::ops::upload(bytemuck::cast_slice(&values), &mut t)?;
    Ok(Tree::leaf(t))
}

fn check_len(at: &Path, shape: &Shape, got: usize) -> Result<(), LayerError> {
    if got == shape.numel() {
        return Ok(());
    }
    Err(LayerError::Tensor {
        path: at.to_string(),
        source: TensorError::HostLength {
            op: "init_params",
            expected: shape.numel().saturating_mul(4),
            got: got.saturating_mul(4),
            shape: shape.clone(),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Conv, Dense, Flatten, Relu, serial};
    use stax_tensor::{BackendOptions, Device};

    #[test]
    fn load_empty_and_random_walk_the_same_specs() {
        let be = Device::Cpu.open(&BackendOptions::default()).unwrap();
        let model = serial![Conv::same(2, (3, 3)), Relu, Flatten, Dense(3)];
        let input = Tree::leaf(Shape::new([1, 4, 4, 1]));
        let mut seen = Vec::new();
        let mut values = |p: &Path, s: &ParamSpec| {
            seen.push(p.to_string());
            Ok(vec![seen.len() as f32; s.shape.numel()])
        };
        let (out, loaded) =
            init_params(&model, &input, &be, ParamSource::Load(&mut values)).unwrap();
        assert_eq!(out, Tree::leaf(Shape::new([1, 3])));
        assert_eq!(seen, ["0.conv/w", "0.conv/b", "3.dense/w", "3.dense/b"]);
        let firsts: Vec<f32> = loaded
            .leaves()
            .iter()
            .map(|t| t.to_vec().unwrap()[0])
            .collect();
        assert_eq!(firsts, [1.0, 2.0, 3.0, 4.0]);
        assert_eq!(loaded.leaves()[2].name().to_string(), "3.dense/w");
        let (_, empty) = init_params(&model, &input, &be, ParamSource::Empty).unwrap();
        assert!(empty.structure_differs(&loaded).is_none());
        let (_, a) =
            init_params(&model, &input, &be, ParamSource::Random(&mut Rng::new(3))).unwrap();
        let (_, b) =
            init_params(&model, &input, &be, ParamSource::Random(&mut Rng::new(3))).unwrap();
        assert_eq!(
            a.leaves()[0].to_vec().unwrap(),
            b.leaves()[0].to_vec().unwrap()
        );
        // a source giving the wrong number of values is a typed error naming the parameter
        let mut short = |_: &Path, _: &ParamSpec| Ok(vec![0.0; 2]);
        let e = init_params(&model, &input, &be, ParamSource::Load(&mut short)).unwrap_err();
        assert_eq!(e.path(), "0.conv/w");
        assert!(e.to_string().contains("holds 8 bytes"), "{e}");
    }
}

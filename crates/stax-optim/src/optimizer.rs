//! The [`Optimizer`] trait: an update written for one parameter tensor, lifted to whole
//! parameter trees by its provided methods, as `jax.example_libraries.optimizers`'s
//! `@optimizer` lifts a per-array `(init, update)` with `tree_flatten`.

use std::fmt;

use stax_tensor::{
    AdamHyper, Category, DType, Grads, Params, Path, Tag, Tensor, TensorError, Tree, ops,
};

use crate::OptimError;

/// An optimizer's state: the step count and, for every parameter, its state tensors.
///
/// `tree` has the parameters' structure with each parameter's leaf replaced by a node of its
/// state fields, so `2.conv/w`'s Adam moments are `2.conv/w/mu` and `2.conv/w/nu` (optax's
/// `ScaleByAdamState(count, mu, nu)`, kept per parameter). State tensors are tagged
/// [`Category::OptimizerState`] and named by their paths (`2.conv/w/mu`).
#[derive(Debug)]
pub struct OptState {
    /// Updates applied so far.
    pub count: u32,
    /// The state tensors, per parameter (see above).
    pub tree: Tree<Tensor>,
}

impl OptState {
    /// The state tensor `field` (Adam: `mu`, `nu`) of every parameter, in parameter order.
    pub fn field(&self, field: &str) -> Vec<&Tensor> {
        self.tree
            .paths()
            .into_iter()
            .filter(|(p, _)| p.last().is_some_and(|k| k.to_string() == field))
            .map(|(_, t)| t)
            .collect()
    }

    /// Total bytes of the state tensors.
    pub fn bytes(&self) -> usize {
        self.tree.bytes()
    }
}

/// An optimizer written per parameter tensor.
///
/// Implementors give the update of one parameter from its gradient and its state tensors;
/// [`Optimizer::init`] and [`Optimizer::update`] lift it to parameter trees.
pub trait Optimizer: fmt::Debug + Send + Sync {
    /// A short name for messages (`adam`).
    fn name(&self) -> &'static str;

    /// The names of the state tensors kept per parameter, each of the parameter's shape and
    /// of [`Optimizer::state_dtype`], zero at the start (Adam: `["mu", "nu"]`).
    fn state_fields(&self) -> &'static [&'static str];

    /// The dtype of state field `field` of a parameter of dtype `param`: the parameter's
    /// by default (Adam: `mu` in its `mu_dtype`, optax's option).
    fn state_dtype(&self, _field: &str, param: DType) -> DType {
        param
    }

    /// Checks the hyper-parameters.
    ///
    /// # Errors
    /// [`OptimError::Hyper`] naming the first invalid one.
    fn validate(&self) -> Result<(), OptimError>;

    /// Updates parameter `p` in place at step `t >= 1` from its gradient `g` times
    /// `grad_scale` (1, or `1 / loss_scale` under loss scaling: the gradient unscaled in f32)
    /// and its state tensors (in [`Optimizer::state_fields`] order), also updated in place.
    /// The caller has checked shapes, devices and sole ownership ([`Optimizer::update`] does).
    ///
    /// # Errors
    /// Tensor errors from the backend's kernels.
    fn update_leaf(
        &self,
        t: u32,
        p: &mut Tensor,
        g: &Tensor,
        state: &mut [&mut Tensor],
        grad_scale: f32,
    ) -> Result<(), OptimError>;

    /// The Adam hyper-parameters of step `t` when this optimizer is Adam applied during the
    /// backward pass to the parameters whose layers can take it (those whose `ParamSpec` in
    /// stax-layers says `update_in_backward`; `stax_tensor::ops::dense_adam`). `None` (the
    /// default): every gradient is collected for one update after the pass.
    fn in_backward(&self, _t: u32) -> Option<AdamHyper> {
        None
    }

    /// The state for `params`: count 0 and zero state tensors on each parameter's backend.
    /// They are allocated field by field (every parameter's `mu`, then every `nu`), as optax
    /// builds `mu` and then `nu`.
    ///
    /// # Errors
    /// Invalid hyper-parameters; allocation errors.
    fn init(&self, params: &Params) -> Result<OptState, OptimError> {
        self.validate()?;
        let zeros = |field: &'static str| {
            move |path: &Path, p: &Tensor| {
                let _scope = p.backend().allocator().scope(&path.to_string());
                let tag = Tag::new(Category::OptimizerState, field);
                let dtype = self.state_dtype(field, p.dtype());
                let mut t = Tensor::empty(p.backend(), p.shape().clone(), dtype, tag)?;
                ops::fill(&mut t, 0.0)?;
                Ok(t)
            }
        };
        let per_field = self
            .state_fields()
            .iter()
            .map(|f| params.try_map(zeros(f)))
            .collect::<Result<Vec<_>, TensorError>>()?;
        let tree = params.try_map(|path, _| {
            let fields = self.state_fields().iter().zip(&per_field);
            let leaf = |t: &Tree<Tensor>| t.get(path).cloned();
            let node = fields
                .map(|(f, t)| Some((*f, leaf(t)?)))
                .collect::<Option<Vec<_>>>();
            node.map(Tree::fields).ok_or(path.clone())
        });
        let tree = tree.map_err(|path| OptimError::Leaf {
            optimizer: self.name(),
            path: path.to_string(),
            source: TensorError::InvalidArgument {
                op: "init",
                reason: "a state tensor is missing".into(),
            },
        })?;
        Ok(OptState {
            count: 0,
            tree: tree.flatten(),
        })
    }

    /// One update of every parameter, in place, in parameter order.
    ///
    /// Everything is checked before anything is written: hyper-parameters, the trees'
    /// structures, and for every parameter the gradient's and the state's shapes, dtypes and
    /// devices and that the parameter and its state tensors are each the only handle to their
    /// buffers. On those errors `state` and `params` are unchanged.
    ///
    /// # Errors
    /// [`OptimError::Structure`], [`OptimError::Leaf`] (naming the parameter),
    /// [`OptimError::Hyper`], [`OptimError::CountOverflow`]; kernel failures.
    fn update(
        &self,
        state: &mut OptState,
        grads: &Grads,
        params: &mut Params,
    ) -> Result<(), OptimError> {
        self.update_unscaled(state, grads, params, 1.0)
    }

    /// [`Optimizer::update`] from `grads` times `grad_scale`, applied in f32 as each gradient
    /// is read (jmp's `loss_scale.unscale(grads)` fused into the update: `1 / loss_scale`).
    ///
    /// # Errors
    /// As [`Optimizer::update`].
    fn update_unscaled(
        &self,
        state: &mut OptState,
        grads: &Grads,
        params: &mut Params,
        grad_scale: f32,
    ) -> Result<(), OptimError> {
        self.validate()?;
        if let Some(e) = params.structure_differs(grads) {
            return Err(OptimError::Structure {
                optimizer: self.name(),
                what: "gradients",
                source: e,
            });
        }
        self.check_state(state, params)?;
        let t = state
            .count
            .checked_add(1)
            .ok_or(OptimError::CountOverflow {
                optimizer: self.name(),
            })?;
        for ((path, p), g) in params.paths().into_iter().zip(grads.leaves()) {
            check_grad(p, g).map_err(|source| OptimError::Leaf {
                optimizer: self.name(),
                path: path.to_string(),
                source,
            })?;
        }
        let k = self.state_fields().len();
        let mut states = state.tree.leaves_mut().into_iter();
        for (p, g) in params.leaves_mut().into_iter().zip(grads.leaves()) {
            let mut s: Vec<&mut Tensor> = states.by_ref().take(k).collect();
            self.update_leaf(t, p, g, &mut s, grad_scale)?;
        }
        state.count = t;
        Ok(())
    }

    /// Checks that `state` can be this optimizer's state for `params`: the parameters' tree
    /// with each leaf a node of [`Optimizer::state_fields`], every state tensor of its
    /// parameter's shape, dtype and backend and the only handle to its buffer.
    ///
    /// # Errors
    /// [`OptimError::Structure`]; [`OptimError::Leaf`] naming the first parameter whose state
    /// does not fit.
    fn check_state(&self, state: &OptState, params: &Params) -> Result<(), OptimError> {
        let fields = self.state_fields();
        let expected = params
            .map(|_| Tree::fields(fields.iter().map(|f| (*f, ()))))
            .flatten();
        if let Some(e) = expected.structure_differs(&state.tree) {
            return Err(OptimError::Structure {
                optimizer: self.name(),
                what: "optimizer state",
                source: e,
            });
        }
        let (k, states) = (fields.len(), state.tree.leaves());
        for (i, (path, p)) in params.paths().into_iter().enumerate() {
            let dtypes = fields.iter().map(|f| self.state_dtype(f, p.dtype()));
            check_state_leaf(p, &states[i * k..(i + 1) * k], dtypes).map_err(|source| {
                OptimError::Leaf {
                    optimizer: self.name(),
                    path: path.to_string(),
                    source,
                }
            })?;
        }
        Ok(())
    }
}

/// The checks of [`Optimizer::update`] for one parameter and its gradient (a float of any
/// dtype: a mixed-precision step's gradients are in its compute dtype, read at the update).
fn check_grad(p: &Tensor, g: &Tensor) -> Result<(), TensorError> {
    const OP: &str = "update";
    p.expect_unique(OP)?;
    g.expect_shape(OP, p.shape())?;
    if !g.dtype().is_float() {
        g.expect_dtype(OP, p.dtype())?;
    }
    g.expect_backend(OP, p)
}

/// The checks of [`Optimizer::check_state`] for one parameter's state tensors, of `dtypes`.
fn check_state_leaf(
    p: &Tensor,
    state: &[&Tensor],
    dtypes: impl Iterator<Item = DType>,
) -> Result<(), TensorError> {
    const OP: &str = "update";
    for (t, dtype) in state.iter().zip(dtypes) {
        t.expect_shape(OP, p.shape())?;
        t.expect_dtype(OP, dtype)?;
        t.expect_backend(OP, p)?;
        t.expect_unique(OP)?;
    }
    Ok(())
}

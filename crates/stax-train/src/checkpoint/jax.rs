//! JAX's names and shapes for checkpoint members, so that the same `.npz` is a stax-rs
//! checkpoint and a JAX one (`../shared/stax-surface.md` section 10; checked against JAX 0.10
//! and optax 0.2.8 by `scripts/jax_checkpoint.py`).
//!
//! - A parameter is `params/` + its JAX key path, `jax.tree_util.keystr` of stax's nested
//!   lists and tuples: `params/[2][0]` for `2.conv/w` ([`stax_tensor::Path::jax_keystr`]).
//! - Its optimizer state is optax's: `optax.adam`'s state is `(ScaleByAdamState(count, mu,
//!   nu), EmptyState())`, so the count is `opt/[0].count` and the moments of `2.conv/w` are
//!   `opt/[0].mu[2][0]` and `opt/[0].nu[2][0]` (a state field `f` in general:
//!   `opt/[0].f[2][0]`).
//! - Shapes are JAX's: stax's `Conv` keeps its bias as `(1, 1, 1, C)` (ones where its NHWC
//!   output spec is not `C`); every other parameter has the shape stax-rs gives it.
//!
//! ```
//! use stax_tensor::{Key, Path, Shape};
//! use stax_train::checkpoint::jax;
//! let b = Path::root().child(Key::Layer(2, "conv"), 2).child(Key::Field("b"), 1);
//! assert_eq!(jax::param_member(&b), "params/[2][1]");
//! assert_eq!(jax::state_member("mu", &b), "opt/[0].mu[2][1]");
//! assert_eq!(jax::shape(&b, &Shape::new([64])), [1, 1, 1, 64]);
//! ```

use stax_tensor::{Key, Path, Shape};

/// The member of optax's step count: `opt/[0].count` (int32 in JAX).
pub const COUNT: &str = "opt/[0].count";

/// The member of the parameter at `path`: `params/[2][0]`.
pub fn param_member(path: &Path) -> String {
    format!("params/{}", path.jax_keystr())
}

/// The member of state field `field` (Adam: `mu`, `nu`) of the parameter at `path`:
/// `opt/[0].mu[2][0]`.
pub fn state_member(field: &str, path: &Path) -> String {
    format!("opt/[0].{field}{}", path.jax_keystr())
}

/// JAX's shape of the parameter at `path` whose stax-rs shape is `shape` (the same elements
/// in the same row-major order): a `Conv` bias `[C]` is `(1, 1, 1, C)`, anything else as is.
pub fn shape(path: &Path, shape: &Shape) -> Vec<u64> {
    let keys: Vec<Key> = path.keys().collect();
    let dims = shape.dims().iter().map(|&d| d as u64);
    match keys[..] {
        [.., Key::Layer(_, "conv"), Key::Field("b")] if shape.rank() == 1 => {
            [1, 1, 1].into_iter().chain(dims).collect()
        }
        _ => dims.collect(),
    }
}

//! Pytrees: nested containers of leaves with key paths, after JAX's `tree_flatten` and
//! `tree_flatten_with_path`.
//!
//! Parameters, gradients, optimizer state, parameter specs, shapes and layer inputs and
//! outputs are all [`Tree`]s. A leaf's [`Path`] names it everywhere in stax-rs: in memory
//! plans, reports, traces, out-of-memory errors and checkpoints. A path is its keys joined by
//! `/`: the weight of the third layer of a `serial` is `2.conv/w` ([`Key::Layer`] `2.conv`,
//! then [`Key::Field`] `w`). Leaves are visited depth first, children in order, as JAX flattens
//! lists and tuples; a node without leaves (a parameter-free layer) keeps its place, so a
//! leaf's position in its parents is its JAX key path (`[2][0]` for `2.conv/w`).
//!
//! ```
//! use stax_tensor::tree::{Key, Tree};
//! let conv = Tree::node([(Key::Field("w"), Tree::leaf(27)), (Key::Field("b"), Tree::leaf(3))]);
//! let model = Tree::node([(Key::Layer(0, "conv"), conv), (Key::Layer(1, "relu"), Tree::empty())]);
//! let paths: Vec<String> = model.paths().iter().map(|(p, _)| p.to_string()).collect();
//! assert_eq!(paths, ["0.conv/w", "0.conv/b"]);
//! assert_eq!(model.paths()[1].0.jax_keystr(), "[0][1]");
//! assert_eq!(model.leaves(), [&27, &3]);
//! assert_eq!(model.map(|&n| n * 2).into_leaves(), [54, 6]);
//! ```

use std::fmt;

/// One step of a key path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Key {
    /// A layer of a combinator: its position among its siblings and its kind; shown `2.conv`.
    Layer(usize, &'static str),
    /// A named field (a parameter `w`, an optimizer moment `mu`); shown as the name.
    Field(&'static str),
    /// A position in a sequence (a `FanOut` branch); shown as the number.
    Index(usize),
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Key::Layer(i, kind) => write!(f, "{i}.{kind}"),
            Key::Field(name) => f.write_str(name),
            Key::Index(i) => write!(f, "{i}"),
        }
    }
}

/// A leaf's address in a tree: its keys from the root, each with the position it has among
/// its siblings.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Path(Vec<(Key, usize)>);

impl Path {
    /// The root (no keys); shown as the empty string.
    pub fn root() -> Path {
        Path(Vec::new())
    }

    /// This path extended by `key`, the `position`-th child of its node.
    pub fn child(&self, key: Key, position: usize) -> Path {
        let mut keys = self.0.clone();
        keys.push((key, position));
        Path(keys)
    }

    /// This path followed by `rest` (a path relative to it).
    pub fn join(&self, rest: &Path) -> Path {
        let mut keys = self.0.clone();
        keys.extend(rest.0.iter().copied());
        Path(keys)
    }

    /// The keys, outermost first.
    pub fn keys(&self) -> impl Iterator<Item = Key> + '_ {
        self.0.iter().map(|(k, _)| *k)
    }

    /// The last key, if any.
    pub fn last(&self) -> Option<Key> {
        self.0.last().map(|(k, _)| *k)
    }

    /// Whether this is the root.
    pub fn is_root(&self) -> bool {
        self.0.is_empty()
    }

    /// The JAX key path of the same leaf, as `jax.tree_util.keystr` prints it for stax's
    /// nested lists and tuples: each key replaced by its position, `[2][0]` for `2.conv/w`.
    pub fn jax_keystr(&self) -> String {
        self.0.iter().map(|(_, i)| format!("[{i}]")).collect()
    }
}

impl fmt::Display for Path {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (k, _)) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("/")?;
            }
            write!(f, "{k}")?;
        }
        Ok(())
    }
}

/// A pytree: a leaf, or a node of keyed children.
#[derive(Debug, Clone, PartialEq)]
pub enum Tree<T> {
    /// One value.
    Leaf(T),
    /// Children in order, each under its key.
    Node(Vec<(Key, Tree<T>)>),
}

/// Where two trees that must have one structure differ (see [`Tree::zip`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("tree structures differ at `{path}`: {reason}")]
pub struct StructureError {
    /// The path of the first difference (`""` for the root).
    pub path: String,
    /// What differs there.
    pub reason: String,
}

impl<T> Default for Tree<T> {
    fn default() -> Self {
        Tree::empty()
    }
}

impl<T> Tree<T> {
    /// A leaf.
    pub fn leaf(value: T) -> Tree<T> {
        Tree::Leaf(value)
    }

    /// A node of `children`, in order.
    pub fn node(children: impl IntoIterator<Item = (Key, Tree<T>)>) -> Tree<T> {
        Tree::Node(children.into_iter().collect())
    }

    /// A node of fields: `[("w", leaf), ("b", leaf)]`.
    pub fn fields(children: impl IntoIterator<Item = (&'static str, T)>) -> Tree<T> {
        Tree::node(
            children
                .into_iter()
                .map(|(k, v)| (Key::Field(k), Tree::leaf(v))),
        )
    }

    /// A node with no children (stax's `()`: no leaves).
    pub fn empty() -> Tree<T> {
        Tree::Node(Vec::new())
    }

    /// The value of a leaf; None for a node.
    pub fn as_leaf(&self) -> Option<&T> {
        match self {
            Tree::Leaf(v) => Some(v),
            Tree::Node(_) => None,
        }
    }

    /// The value of a leaf, taken; None for a node.
    pub fn into_leaf(self) -> Option<T> {
        match self {
            Tree::Leaf(v) => Some(v),
            Tree::Node(_) => None,
        }
    }

    /// The children of a node (none for a leaf).
    pub fn children(&self) -> &[(Key, Tree<T>)] {
        match self {
            Tree::Leaf(_) => &[],
            Tree::Node(c) => c,
        }
    }

    /// The children of a node, taken (none for a leaf).
    pub fn into_children(self) -> Vec<(Key, Tree<T>)> {
        match self {
            Tree::Leaf(_) => Vec::new(),
            Tree::Node(c) => c,
        }
    }

    /// The child under `key`, if any.
    pub fn child(&self, key: Key) -> Option<&Tree<T>> {
        self.children()
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, t)| t)
    }

    /// Removes and returns the subtree at `path` (found by its keys); `None` when there is
    /// none. [`Tree::insert`] with the same path puts it back where it was.
    pub fn remove(&mut self, path: &Path) -> Option<Tree<T>> {
        let (last, parent) = path.0.split_last()?;
        let mut node = self;
        for (k, _) in parent {
            node = node.child_mut(*k)?;
        }
        match node {
            Tree::Node(children) => {
                let i = children.iter().position(|(k, _)| *k == last.0)?;
                Some(children.remove(i).1)
            }
            Tree::Leaf(_) => None,
        }
    }

    /// Inserts `sub` at `path`: under the node its keys lead to, as the child at the position
    /// the path records (the end if there are fewer children), under its last key.
    ///
    /// # Errors
    /// [`StructureError`] when `path` is the root, its parent is missing or a leaf, or the
    /// key is taken.
    pub fn insert(&mut self, path: &Path, sub: Tree<T>) -> Result<(), StructureError> {
        let err = |reason: &str| StructureError {
            path: path.to_string(),
            reason: reason.into(),
        };
        let ((key, position), parent) = path.0.split_last().ok_or_else(|| err("the root"))?;
        let mut node = self;
        for (k, _) in parent {
            node = node.child_mut(*k).ok_or_else(|| err("no such parent"))?;
        }
        let Tree::Node(children) = node else {
            return Err(err("the parent is a leaf"));
        };
        if children.iter().any(|(k, _)| k == key) {
            return Err(err("the key is taken"));
        }
        children.insert((*position).min(children.len()), (*key, sub));
        Ok(())
    }

    fn child_mut(&mut self, key: Key) -> Option<&mut Tree<T>> {
        match self {
            Tree::Node(children) => children.iter_mut().find(|(k, _)| *k == key).map(|(_, t)| t),
            Tree::Leaf(_) => None,
        }
    }

    /// The leaf at `path`, if there is one.
    pub fn get(&self, path: &Path) -> Option<&T> {
        path.keys()
            .try_fold(self, |t, k| t.child(k))
            .and_then(Tree::as_leaf)
    }

    /// Every leaf, depth first (JAX's `tree_leaves` order).
    pub fn leaves(&self) -> Vec<&T> {
        let mut out = Vec::new();
        self.visit(&mut |v| out.push(v));
        out
    }

    fn visit<'a>(&'a self, f: &mut impl FnMut(&'a T)) {
        match self {
            Tree::Leaf(v) => f(v),
            Tree::Node(c) => c.iter().for_each(|(_, t)| t.visit(f)),
        }
    }

    /// Every leaf, depth first, mutably.
    pub fn leaves_mut(&mut self) -> Vec<&mut T> {
        let mut out = Vec::new();
        self.visit_mut(&mut out);
        out
    }

    fn visit_mut<'a>(&'a mut self, out: &mut Vec<&'a mut T>) {
        match self {
            Tree::Leaf(v) => out.push(v),
            Tree::Node(c) => c.iter_mut().for_each(|(_, t)| t.visit_mut(out)),
        }
    }

    /// Every leaf, depth first, taken.
    pub fn into_leaves(self) -> Vec<T> {
        match self {
            Tree::Leaf(v) => vec![v],
            Tree::Node(c) => c.into_iter().flat_map(|(_, t)| t.into_leaves()).collect(),
        }
    }

    /// Number of leaves.
    pub fn len(&self) -> usize {
        match self {
            Tree::Leaf(_) => 1,
            Tree::Node(c) => c.iter().map(|(_, t)| t.len()).sum(),
        }
    }

    /// Whether the tree has no leaves.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every leaf with its path, depth first.
    pub fn paths(&self) -> Vec<(Path, &T)> {
        let mut out = Vec::new();
        self.visit_paths(&Path::root(), &mut out);
        out
    }

    fn visit_paths<'a>(&'a self, at: &Path, out: &mut Vec<(Path, &'a T)>) {
        match self {
            Tree::Leaf(v) => out.push((at.clone(), v)),
            Tree::Node(c) => {
                for (i, (k, t)) in c.iter().enumerate() {
                    t.visit_paths(&at.child(*k, i), out);
                }
            }
        }
    }

    /// A tree of the same structure with `f` applied to every leaf.
    pub fn map<U>(&self, mut f: impl FnMut(&T) -> U) -> Tree<U> {
        let ok: Result<Tree<U>, std::convert::Infallible> = self.try_map(|_, v| Ok(f(v)));
        match ok {
            Ok(t) => t,
            Err(never) => match never {},
        }
    }

    /// A tree of the same structure with `f(path, leaf)` at every leaf, depth first; the first
    /// error stops the walk.
    ///
    /// # Errors
    /// The first error `f` returns.
    pub fn try_map<U, E>(
        &self,
        mut f: impl FnMut(&Path, &T) -> Result<U, E>,
    ) -> Result<Tree<U>, E> {
        self.try_map_at(&Path::root(), &mut f)
    }

    fn try_map_at<U, E>(
        &self,
        at: &Path,
        f: &mut impl FnMut(&Path, &T) -> Result<U, E>,
    ) -> Result<Tree<U>, E> {
        Ok(match self {
            Tree::Leaf(v) => Tree::Leaf(f(at, v)?),
            Tree::Node(c) => Tree::Node(
                c.iter()
                    .enumerate()
                    .map(|(i, (k, t))| Ok((*k, t.try_map_at(&at.child(*k, i), f)?)))
                    .collect::<Result<_, E>>()?,
            ),
        })
    }

    /// As [`Tree::try_map`], consuming the tree.
    ///
    /// # Errors
    /// The first error `f` returns.
    pub fn try_map_into<U, E>(
        self,
        mut f: impl FnMut(&Path, T) -> Result<U, E>,
    ) -> Result<Tree<U>, E> {
        self.try_map_into_at(&Path::root(), &mut f)
    }

    fn try_map_into_at<U, E>(
        self,
        at: &Path,
        f: &mut impl FnMut(&Path, T) -> Result<U, E>,
    ) -> Result<Tree<U>, E> {
        Ok(match self {
            Tree::Leaf(v) => Tree::Leaf(f(at, v)?),
            Tree::Node(c) => Tree::Node(
                c.into_iter()
                    .enumerate()
                    .map(|(i, (k, t))| Ok((k, t.try_map_into_at(&at.child(k, i), f)?)))
                    .collect::<Result<_, E>>()?,
            ),
        })
    }

    /// The first place where `other` has another structure (other keys, a leaf for a node),
    /// or None when the two have one structure. Leaf values are not compared.
    pub fn structure_differs<U>(&self, other: &Tree<U>) -> Option<StructureError> {
        self.differs_at(other, &Path::root())
    }

    fn differs_at<U>(&self, other: &Tree<U>, at: &Path) -> Option<StructureError> {
        let here = |reason: String| {
            Some(StructureError {
                path: at.to_string(),
                reason,
            })
        };
        match (self, other) {
            (Tree::Leaf(_), Tree::Leaf(_)) => None,
            (Tree::Leaf(_), Tree::Node(_)) => here("expected a leaf, found a node".into()),
            (Tree::Node(_), Tree::Leaf(_)) => here("expected a node, found a leaf".into()),
            (Tree::Node(a), Tree::Node(b)) if a.len() != b.len() => {
                here(format!("expected {} children, found {}", a.len(), b.len()))
            }
            (Tree::Node(a), Tree::Node(b)) => {
                a.iter()
                    .zip(b)
                    .enumerate()
                    .find_map(|(i, ((ka, ta), (kb, tb)))| {
                        if ka != kb {
                            here(format!("child {i}: expected key `{ka}`, found `{kb}`"))
                        } else {
                            ta.differs_at(tb, &at.child(*ka, i))
                        }
                    })
            }
        }
    }

    /// The leaves of two trees of one structure, paired, with their paths.
    ///
    /// # Errors
    /// [`StructureError`] naming the first place the structures differ.
    pub fn zip<'a, U>(
        &'a self,
        other: &'a Tree<U>,
    ) -> Result<Vec<(Path, &'a T, &'a U)>, StructureError> {
        if let Some(e) = self.structure_differs(other) {
            return Err(e);
        }
        Ok(self
            .paths()
            .into_iter()
            .zip(other.leaves())
            .map(|((p, a), b)| (p, a, b))
            .collect())
    }
}

impl<T> Tree<Tree<T>> {
    /// The tree with every leaf's subtree put in the leaf's place: a tree of per-leaf nodes
    /// becomes one tree (JAX's `tree_map` returning trees, then read as one tree).
    pub fn flatten(self) -> Tree<T> {
        match self {
            Tree::Leaf(t) => t,
            Tree::Node(c) => Tree::Node(c.into_iter().map(|(k, t)| (k, t.flatten())).collect()),
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn remove_then_insert_restores_the_tree() {
        let mut t = Tree::node([(Key::Layer(0, "dense"), Tree::fields([("w", 1), ("b", 2)]))]);
        let before = t.clone();
        let w = t.paths()[0].0.clone();
        assert_eq!(w.to_string(), "0.dense/w");
        let sub = t.remove(&w).unwrap();
        assert_eq!(t.leaves(), [&2]);
        assert_eq!(
            t.paths()[0].0.jax_keystr(),
            "[0][0]",
            "b moves up while w is out"
        );
        assert!(t.remove(&w).is_none());
        t.insert(&w, sub).unwrap();
        assert_eq!(t, before);
        assert!(t.insert(&w, Tree::leaf(9)).is_err(), "the key is taken");
        assert!(t.insert(&Path::root(), Tree::leaf(9)).is_err());
    }

    use super::*;

    fn model() -> Tree<u32> {
        let dense = Tree::fields([("w", 1), ("b", 2)]);
        Tree::node([
            (Key::Layer(0, "dense"), dense),
            (Key::Layer(1, "relu"), Tree::empty()),
            (
                Key::Layer(2, "parallel"),
                Tree::node([
                    (Key::Index(0), Tree::fields([("w", 3)])),
                    (Key::Index(1), Tree::leaf(4)),
                ]),
            ),
        ])
    }

    #[test]
    fn paths_follow_jax_order_and_positions() {
        let t = model();
        let got: Vec<(String, String, u32)> = t
            .paths()
            .into_iter()
            .map(|(p, v)| (p.to_string(), p.jax_keystr(), *v))
            .collect();
        let want = [
            ("0.dense/w", "[0][0]", 1),
            ("0.dense/b", "[0][1]", 2),
            ("2.parallel/0/w", "[2][0][0]", 3),
            ("2.parallel/1", "[2][1]", 4),
        ];
        let want: Vec<(String, String, u32)> = want
            .iter()
            .map(|(a, b, c)| (a.to_string(), b.to_string(), *c))
            .collect();
        assert_eq!(got, want);
        assert_eq!(t.len(), 4);
        let p = &t.paths()[2].0;
        assert_eq!(t.get(p), Some(&3));
        assert!(t.child(Key::Layer(1, "relu")).unwrap().is_empty());
    }

    #[test]
    fn map_mutate_and_zip() {
        let mut t = model();
        for v in t.leaves_mut() {
            *v += 10;
        }
        assert_eq!(t.clone().into_leaves(), [11, 12, 13, 14]);
        let s = t.map(|v| v.to_string());
        let pairs = t.zip(&s).unwrap();
        assert_eq!(pairs[3].2, "14");
        let r: Result<Tree<u32>, String> =
            t.try_map(|p, &v| if v == 13 { Err(p.to_string()) } else { Ok(v) });
        assert_eq!(r.unwrap_err(), "2.parallel/0/w");
        let moved = t.try_map_into(|_, v| Ok::<_, ()>(v * 2)).unwrap();
        assert_eq!(moved.leaves(), [&22, &24, &26, &28]);
        let nested = moved
            .map(|&v| Tree::fields([("mu", v), ("nu", v + 1)]))
            .flatten();
        let paths: Vec<String> = nested.paths().iter().map(|(p, _)| p.to_string()).collect();
        assert_eq!(paths[..2], ["0.dense/w/mu", "0.dense/w/nu"]);
        assert_eq!(nested.len(), 8);
    }

    #[test]
    fn structure_differences_are_named() {
        let a = model();
        let mut b = model();
        if let Tree::Node(c) = &mut b {
            c[2].1 = Tree::leaf(0);
        }
        let e = a.zip(&b).unwrap_err();
        assert_eq!(e.path, "2.parallel");
        assert_eq!(
            e.to_string(),
            "tree structures differ at `2.parallel`: expected a node, found a leaf"
        );
        let c = Tree::node([(Key::Layer(0, "conv"), Tree::fields([("w", 1)]))]);
        let e = a.structure_differs(&c).unwrap();
        assert_eq!(e.reason, "expected 3 children, found 1");
        let d: Tree<u32> = Tree::fields([("b", 1)]);
        let e = Tree::fields([("w", 1)]).structure_differs(&d).unwrap();
        assert_eq!(e.reason, "child 0: expected key `w`, found `b`");
    }
}

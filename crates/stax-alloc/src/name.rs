//! Names that travel with allocations: what a buffer is (its category and role) and where it
//! was made (the allocator's current scope, a layer path such as `2.conv`).
//!
//! Code that allocates says what the buffer is for (a [`Tag`]: category and role, `output`,
//! `dw`, `mask`, `workspace`); whoever knows where the work happens sets the scope
//! ([`crate::Allocator::scope`]: the combinators push each child's path). The allocation's
//! [`Name`] is the two together, `2.conv/workspace`, and is read back from the allocation, its
//! trace events and an out-of-memory report: nothing is inferred afterwards.
//!
//! ```
//! use std::sync::Arc;
//! use stax_alloc::{Allocator, Category, SimMemory, Strategy, Tag};
//! let alloc = Allocator::new(Arc::new(SimMemory::new(1 << 30, 2 << 20)), Strategy::Caching)?;
//! let w = {
//!     let _layer = alloc.scope("2.conv");
//!     alloc.allocate(4096, Tag::new(Category::Parameter, "w"))?
//! };
//! assert_eq!(w.name().to_string(), "2.conv/w");
//! let ws = alloc.allocate(256, Category::Workspace)?; // the category's own name as role
//! assert_eq!(ws.name().to_string(), "workspace");
//! # Ok::<(), stax_alloc::AllocError>(())
//! ```

use std::collections::HashSet;
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};

use crate::Category;

/// What an allocation is for: its category and its role in the code that made it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Tag {
    /// The accounting category.
    pub category: Category,
    /// The role (`output`, `dw`, `mask`, `workspace`, `mu`).
    pub role: &'static str,
}

impl Tag {
    /// A tag of `category` playing `role`.
    pub fn new(category: Category, role: &'static str) -> Tag {
        Tag { category, role }
    }
}

/// Distinct roles [`interned_role`] keeps: the roles of this workspace's code are a few dozen.
const MAX_ROLES: usize = 1024;

/// `role` as a `&'static str`, interned once per distinct role: a replayed trace names its
/// allocations with the roles it recorded. At most [`MAX_ROLES`] are kept (a trace from
/// elsewhere may hold any number of them); past that, None.
pub(crate) fn interned_role(role: &str) -> Option<&'static str> {
    static ROLES: OnceLock<Mutex<HashSet<&'static str>>> = OnceLock::new();
    let mut roles = ROLES
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if let Some(&r) = roles.get(role) {
        return Some(r);
    }
    if roles.len() >= MAX_ROLES {
        return None;
    }
    let r: &'static str = Box::leak(role.to_owned().into_boxed_str());
    roles.insert(r);
    Some(r)
}

impl From<Category> for Tag {
    /// The category alone: its name is the role (`workspace`, `activation`).
    fn from(category: Category) -> Tag {
        Tag {
            category,
            role: category.name(),
        }
    }
}

/// An allocation's name: the scope it was made in and its role, shown `scope/role` (just the
/// role when made outside any scope).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Name {
    scope: Arc<str>,
    role: &'static str,
}

impl Name {
    /// A name from a scope path (`2.conv`, empty for none) and a role.
    pub fn new(scope: impl Into<Arc<str>>, role: &'static str) -> Name {
        Name {
            scope: scope.into(),
            role,
        }
    }

    /// The scope path (`2.conv`; empty outside any scope).
    pub fn scope(&self) -> &str {
        &self.scope
    }

    /// The role (`workspace`).
    pub fn role(&self) -> &'static str {
        self.role
    }
}

impl fmt::Display for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.scope.is_empty() {
            f.write_str(self.role)
        } else {
            write!(f, "{}/{}", self.scope, self.role)
        }
    }
}

/// The allocator's stack of scopes, each entry the full path (`3.parallel/0.serial`).
#[derive(Debug, Default)]
pub(crate) struct Scopes(Vec<Arc<str>>);

impl Scopes {
    /// The current scope path (empty outside any scope).
    pub(crate) fn current(&self) -> Arc<str> {
        self.0.last().cloned().unwrap_or_else(|| Arc::from(""))
    }

    /// Enters `segment` below the current scope (`segment` may itself hold `/`).
    pub(crate) fn push(&mut self, segment: &str) {
        let path = match self.0.last() {
            Some(top) if !top.is_empty() && !segment.is_empty() => format!("{top}/{segment}"),
            Some(top) if segment.is_empty() => top.to_string(),
            _ => segment.to_string(),
        };
        self.0.push(Arc::from(path));
    }

    /// Leaves the innermost scope.
    pub(crate) fn pop(&mut self) {
        self.0.pop();
    }
}

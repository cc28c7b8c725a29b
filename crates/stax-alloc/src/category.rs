//! Allocation categories: what a block of memory is for.
//!
//! Every allocation carries one [`Category`], and the allocator keeps live and peak bytes per
//! category, so a memory report can say to the byte how much of the device is parameters,
//! optimizer state, gradients, activations, inputs or workspace.
//!
//! ```
//! use stax_alloc::Category;
//! assert_eq!(Category::OptimizerState.to_string(), "optimizer_state");
//! assert_eq!(Category::ALL[Category::Gradient.index()], Category::Gradient);
//! assert_eq!("activation".parse::<Category>().unwrap(), Category::Activation);
//! ```

use std::fmt;
use std::str::FromStr;

use crate::AllocError;

/// What an allocation is for. The tag is carried by every allocation; the allocator keeps
/// requested, allocated and peak bytes per category (see [`crate::Stats::by_category`]).
///
/// Serialized (serde) and displayed in lower snake case: `parameter`, `optimizer_state`, ...
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Category {
    /// Model parameters (weights and biases).
    Parameter,
    /// Optimizer state, e.g. Adam's first and second moments `m` and `v`.
    OptimizerState,
    /// Gradients of the loss with respect to parameters or activations.
    Gradient,
    /// Activations saved by the forward pass (and their temporaries).
    Activation,
    /// Input batches (images, labels).
    Input,
    /// Scratch space for libraries and kernels (cuDNN/cuBLAS workspaces, reductions).
    Workspace,
    /// Anything else.
    Other,
}

impl Category {
    /// All categories, in [`Category::index`] order.
    pub const ALL: [Category; 7] = [
        Category::Parameter,
        Category::OptimizerState,
        Category::Gradient,
        Category::Activation,
        Category::Input,
        Category::Workspace,
        Category::Other,
    ];

    /// Position of the category in [`Category::ALL`] and in every per-category array
    /// (`[u64; 7]`) of this crate: 0 for `Parameter` up to 6 for `Other`.
    pub fn index(self) -> usize {
        self as usize
    }

    /// The lower snake case name, as printed by `Display` (`"optimizer_state"`).
    pub fn name(self) -> &'static str {
        match self {
            Category::Parameter => "parameter",
            Category::OptimizerState => "optimizer_state",
            Category::Gradient => "gradient",
            Category::Activation => "activation",
            Category::Input => "input",
            Category::Workspace => "workspace",
            Category::Other => "other",
        }
    }
}

impl fmt::Display for Category {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.name())
    }
}

impl FromStr for Category {
    type Err = AllocError;

    /// Parses the `Display` form (`"optimizer_state"`), case-insensitively.
    ///
    /// # Errors
    /// [`AllocError::InvalidCategory`] when the text names no category.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        Category::ALL
            .into_iter()
            .find(|c| c.name().eq_ignore_ascii_case(t))
            .ok_or_else(|| AllocError::InvalidCategory {
                value: s.to_string(),
            })
    }
}

//! Element types.

use std::fmt;

/// The element type of a tensor.
///
/// `F32` is the only arithmetic type today (bf16/f16 via `half` are planned); `U32` holds packed
/// bit masks (32 elements a word), such as the ReLU masks kept for the backward pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    /// IEEE-754 binary32, 4 bytes.
    F32,
    /// Unsigned 32-bit word, 4 bytes; used for packed bit masks.
    U32,
}

impl DType {
    /// Size of one element in bytes.
    pub fn size_bytes(self) -> usize {
        match self {
            DType::F32 | DType::U32 => 4,
        }
    }
}

impl DType {
    /// The name (`f32`), as NumPy and JAX spell it.
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::U32 => "u32",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for DType {
    type Err = crate::TensorError;

    /// Parses a dtype's name (`f32`).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [DType::F32, DType::U32]
            .into_iter()
            .find(|d| d.name() == s)
            .ok_or_else(|| crate::TensorError::InvalidArgument {
                op: "parse dtype",
                reason: format!("{s:?} is not a dtype; expected f32 or u32"),
            })
    }
}

//! Element types: [`DType`] names them at run time, [`Element`] ties a Rust type to one, and
//! [`Float`] is what the CPU kernels are written once over (f32, bf16, f16: computed in f32,
//! stored in their own type, as CUDA's half-precision kernels do).

use std::fmt;

pub use half::{bf16, f16};

/// The element type of a tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    /// IEEE-754 binary32, 4 bytes.
    F32,
    /// bfloat16 (8-bit exponent, 7-bit mantissa), 2 bytes.
    BF16,
    /// IEEE-754 binary16, 2 bytes.
    F16,
    /// Unsigned 32-bit word, 4 bytes; packed bit masks (the ReLU's, 32 elements a word).
    U32,
}

impl DType {
    /// Every dtype.
    pub const ALL: [DType; 4] = [DType::F32, DType::BF16, DType::F16, DType::U32];

    /// The floating-point dtypes.
    pub const FLOATS: [DType; 3] = [DType::F32, DType::BF16, DType::F16];

    /// Size of one element in bytes.
    pub fn size_bytes(self) -> usize {
        match self {
            DType::F32 | DType::U32 => 4,
            DType::BF16 | DType::F16 => 2,
        }
    }

    /// The name (`f32`, `bf16`), as JAX spells it; also the suffix of its CUDA kernels.
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::BF16 => "bf16",
            DType::F16 => "f16",
            DType::U32 => "u32",
        }
    }

    /// Whether it is a floating-point type.
    pub fn is_float(self) -> bool {
        self != DType::U32
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for DType {
    type Err = crate::TensorError;

    /// Parses a dtype's name (`f32`, `bf16`, `f16`, `u32`).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        DType::ALL
            .into_iter()
            .find(|d| d.name() == s)
            .ok_or_else(|| crate::TensorError::InvalidArgument {
                op: "parse dtype",
                reason: format!("{s:?} is not a dtype; expected f32, bf16, f16 or u32"),
            })
    }
}

/// A Rust type that is a tensor's element type.
pub trait Element: bytemuck::Pod + Send + Sync + fmt::Debug + PartialEq {
    /// Its dtype.
    const DTYPE: DType;
}

impl Element for f32 {
    const DTYPE: DType = DType::F32;
}

impl Element for bf16 {
    const DTYPE: DType = DType::BF16;
}

impl Element for f16 {
    const DTYPE: DType = DType::F16;
}

impl Element for u32 {
    const DTYPE: DType = DType::U32;
}

/// A floating-point element: read as f32, computed on in f32, written back rounded to its own
/// precision (round to nearest even, as `half` and CUDA's `__float2bfloat16_rn` do).
pub trait Float: Element + Copy {
    /// The value as f32 (exact).
    fn to_f32(self) -> f32;
    /// `v` rounded to this type.
    fn from_f32(v: f32) -> Self;
}

impl Float for f32 {
    fn to_f32(self) -> f32 {
        self
    }
    fn from_f32(v: f32) -> Self {
        v
    }
}

impl Float for bf16 {
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    fn from_f32(v: f32) -> Self {
        bf16::from_f32(v)
    }
}

impl Float for f16 {
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    fn from_f32(v: f32) -> Self {
        f16::from_f32(v)
    }
}

/// Runs `$body` with `$t` bound to the Rust type of the float dtype `$dtype`; `$other` is
/// evaluated for U32.
#[macro_export]
macro_rules! with_float {
    ($dtype:expr, $t:ident => $body:expr, $other:expr) => {
        match $dtype {
            $crate::DType::F32 => {
                type $t = f32;
                $body
            }
            $crate::DType::BF16 => {
                type $t = $crate::dtype::bf16;
                $body
            }
            $crate::DType::F16 => {
                type $t = $crate::dtype::f16;
                $body
            }
            $crate::DType::U32 => $other,
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_sizes_and_rounding() {
        for d in DType::ALL {
            assert_eq!(d.name().parse::<DType>().unwrap(), d);
        }
        assert_eq!(DType::BF16.size_bytes(), 2);
        assert!("f64".parse::<DType>().is_err());
        // bf16 keeps 8 bits of mantissa: 1 + 2^-8 rounds to even (1.0), 1 + 3 * 2^-8 up
        assert_eq!(<bf16 as Float>::from_f32(1.0 + 1.0 / 256.0).to_f32(), 1.0);
        assert_eq!(
            <bf16 as Float>::from_f32(1.0 + 3.0 / 256.0).to_f32(),
            1.0 + 4.0 / 256.0
        );
        assert_eq!(<f16 as Float>::from_f32(65520.0).to_f32(), f32::INFINITY);
        let t: f32 = with_float!(DType::F16, T => T::from_f32(0.5).to_f32(), 0.0);
        assert_eq!(t, 0.5);
    }
}

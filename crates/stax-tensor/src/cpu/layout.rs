//! Concatenation and splitting along an axis on the host: block copies of row-major
//! `[outer, inner]` matrices (see [`crate::backend::Concat::blocks`]).

use super::host::{bytes_of, bytes_of_mut};
use crate::TensorError;
use crate::backend::{Concat, Split};

/// `out` = the inputs side by side as `[outer, inner_i]` blocks of `[outer, total]`.
pub(super) fn concat(c: Concat<'_>) -> Result<(), TensorError> {
    const OP: &str = "concat";
    let (outer, inners, total) = c.blocks();
    let size = c.out.dtype().size_bytes();
    let out = bytes_of_mut(OP, c.out)?;
    let mut off = 0;
    for (t, inner) in c.inputs.iter().zip(inners) {
        let src = bytes_of(OP, t)?;
        for r in 0..outer {
            let dst = (r * total + off) * size;
            out[dst..dst + inner * size].copy_from_slice(&src[r * inner * size..][..inner * size]);
        }
        off += inner;
    }
    Ok(())
}

/// The reverse of [`concat`].
pub(super) fn split(c: Split<'_>) -> Result<(), TensorError> {
    const OP: &str = "split";
    let (outer, inners, total) = c.blocks();
    let size = c.src.dtype().size_bytes();
    let src = bytes_of(OP, c.src)?;
    let mut off = 0;
    for (t, inner) in c.outs.iter_mut().zip(inners) {
        let dst = bytes_of_mut(OP, t)?;
        for r in 0..outer {
            let from = (r * total + off) * size;
            dst[r * inner * size..][..inner * size]
                .copy_from_slice(&src[from..from + inner * size]);
        }
        off += inner;
    }
    Ok(())
}

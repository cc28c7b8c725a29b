//! A dense layer's backward pass with Adam on its weight, chunk by chunk (see
//! [`crate::ops::dense_adam`]): the chunk of `dw` lives in one workspace buffer, so the whole
//! weight gradient never exists.
//!
//! A bf16 or f16 call runs the f32 loop on f32 copies of `x` and `dy` (workspace, as
//! `promote.rs` makes them for the other low-precision ops): `dw` from the widened inputs is
//! summed in f32 and rounded once to the dtype (held as f32), `dx` is computed over the copy
//! of `x` from the old weight rounded to the dtype (a second workspace chunk, held as f32) and
//! rounded once into `x` or the given tensor at the end.

use super::conv::floats;
use super::elementwise::not_float;
use super::matmul::{MatMut, MatRef, gemm};
use super::promote::{narrow, widen};
use super::{CpuBackend, adam, data, data_mut};
use crate::backend::{Call, DenseAdam, DenseDx, Scratch};
use crate::{
    AdamHyper, DType, Float, OpDesc, TensorError, WorkspaceStep, dense_chunk_rows, with_float,
};

#[cfg(test)]
mod tests;

const OP: &str = "dense_adam";

/// Chunk rows of the weight the CPU processes at a time: its workspace bound of gradient.
pub(super) fn chunk_rows(be: &CpuBackend, k: usize, n: usize) -> usize {
    dense_chunk_rows(k, n, be.workspace_bytes)
}

/// The workspace of the chunk loop for a `[k, n]` weight (inside the f32 copies of a
/// low-precision call, [`super::promote::copies`]): one f32 chunk of `dw`, then, when `dx` is
/// computed from the old weight `rounded` to a low-precision dtype, a chunk of that rounded
/// weight (held as f32, as many bytes); none for an empty weight.
pub(super) fn schedule(be: &CpuBackend, k: usize, n: usize, rounded: bool) -> Vec<WorkspaceStep> {
    use WorkspaceStep::{Alloc, Free};
    let chunk = chunk_rows(be, k, n) * n * 4;
    match rounded && chunk > 0 {
        true => vec![Alloc(chunk), Alloc(chunk), Free(1), Free(0)],
        false => WorkspaceStep::single(chunk),
    }
}

/// See the module docs. Nothing is written when the workspace cannot be had.
pub(super) fn dense_adam(be: &CpuBackend, c: DenseAdam<'_>) -> Result<(), TensorError> {
    let OpDesc::DenseAdam {
        m,
        n,
        k,
        dtype,
        input_grad,
    } = c.desc()
    else {
        unreachable!("DenseAdam describes itself as OpDesc::DenseAdam")
    };
    if dtype != DType::F32 {
        return low_precision(be, c, (m, n, k), (dtype, input_grad));
    }
    let DenseAdam {
        x,
        dy,
        w,
        mu,
        nu,
        dx,
        h,
    } = c;
    // x is written only in place (then it is solely owned: checked by the front end)
    let (x, into) = match dx {
        DenseDx::InPlace => (X::Write(data_mut(OP, x)?), None),
        DenseDx::Into(t) => (X::Read(data(OP, x)?), Some(data_mut(OP, t)?)),
        DenseDx::Skip => (X::Read(data(OP, x)?), None),
    };
    let o = Operands {
        x,
        dy: data(OP, dy)?,
        into,
        w: data_mut(OP, w)?,
        mu: data_mut(OP, mu)?,
        nu: data_mut(OP, nu)?,
    };
    chunks(be, (m, n, k), o, None, &h)
}

/// A bf16 or f16 call of `dtype` (see the module docs): the f32 copies of `x` and `dy` are
/// taken first, `x`'s copy receives `dx` when it is computed (`input_grad`), which is rounded
/// into its destination last; the copies are freed `dy`'s first.
fn low_precision(
    be: &CpuBackend,
    c: DenseAdam<'_>,
    dims: (usize, usize, usize),
    (dtype, input_grad): (DType, bool),
) -> Result<(), TensorError> {
    let DenseAdam {
        x,
        dy,
        w,
        mu,
        nu,
        dx,
        h,
    } = c;
    let (mut x32, dy32) = (widen(x, true)?, widen(dy, true)?);
    let x_view = match input_grad {
        true => X::Write(data_mut(OP, &mut x32)?),
        false => X::Read(data(OP, &x32)?),
    };
    let o = Operands {
        x: x_view,
        dy: data(OP, &dy32)?,
        into: None,
        w: data_mut(OP, w)?,
        mu: data_mut(OP, mu)?,
        nu: data_mut(OP, nu)?,
    };
    chunks(be, dims, o, Some(dtype), &h)?;
    match dx {
        DenseDx::InPlace => narrow(&x32, x)?,
        DenseDx::Into(t) => narrow(&x32, t)?,
        DenseDx::Skip => {}
    }
    drop((dy32, x32));
    Ok(())
}

/// The chunk loop's operands, as f32 views: `x` `[m, k]` (written with `dx` when it is the
/// destination), `dy` `[m, n]`, `into` (`dx` `[m, k]`, when it goes elsewhere), and the
/// weight and its moments `[k, n]`.
struct Operands<'a> {
    x: X<'a>,
    dy: &'a [f32],
    into: Option<&'a mut [f32]>,
    w: &'a mut [f32],
    mu: &'a mut [f32],
    nu: &'a mut [f32],
}

/// Takes the workspace of [`schedule`], then per chunk of `rows` weight rows: `dw_chunk`
/// (rounded to `low` when given), `dx`'s columns from the old weight (rounded to `low`), the
/// Adam step.
fn chunks(
    be: &CpuBackend,
    (m, n, k): (usize, usize, usize),
    o: Operands<'_>,
    low: Option<DType>,
    h: &AdamHyper,
) -> Result<(), TensorError> {
    let writes_dx = o.into.is_some() || matches!(o.x, X::Write(_));
    let round = low.filter(|_| writes_dx);
    let mut ws = Scratch::new(OP, &be.allocator, schedule(be, k, n, round.is_some()));
    let gi = (k > 0 && n > 0).then(|| ws.alloc()).transpose()?;
    let ri = gi.and(round).map(|_| ws.alloc()).transpose()?;
    let Operands {
        x: mut xs,
        dy,
        mut into,
        w,
        mu,
        nu,
    } = o;
    let rows = chunk_rows(be, k, n).max(1);
    for r0 in (0..k).step_by(rows) {
        let rc = rows.min(k - r0);
        let (g, wr) = buffers(&mut ws, (gi.is_some(), ri.is_some()), rc * n)?;
        // dw_chunk [rc, n] = x[:, r0..r0 + rc]ᵀ · dy; x's and dx's columns from r0 (none
        // without rows: an empty batch holds no element at r0)
        let xc = MatRef::strided(xs.read().get(r0..).unwrap_or_default(), m, rc, (k, 1)).t();
        let dy_m = MatRef::row_major(dy, m, n);
        gemm(OP, 1.0, xc, dy_m, 0.0, MatMut::row_major(g, rc, n))?;
        if let Some(d) = low {
            round_in_place(d, g)?;
        }
        let span = r0 * n..(r0 + rc) * n;
        let target = match (&mut into, &mut xs) {
            (Some(d), _) => Some(d.get_mut(r0..).unwrap_or_default()),
            (None, X::Write(x)) => Some(x.get_mut(r0..).unwrap_or_default()),
            (None, X::Read(_)) => None,
        };
        if let Some(t) = target {
            // dx[:, r0..r0 + rc] = dy · w_chunkᵀ, from the old weight (rounded)
            let old = match round {
                Some(d) => {
                    wr.copy_from_slice(&w[span.clone()]);
                    round_in_place(d, wr)?;
                    &*wr
                }
                None => &w[span.clone()],
            };
            let wc = MatRef::row_major(old, rc, n).t();
            gemm(OP, 1.0, dy_m, wc, 0.0, MatMut::strided(t, m, rc, (k, 1)))?;
        }
        let (w, mu, nu) = (&mut w[span.clone()], &mut mu[span.clone()], &mut nu[span]);
        adam::step(w, &*g, mu, nu, h);
    }
    for i in [ri, gi].into_iter().flatten() {
        ws.free(i)?;
    }
    ws.finish()
}

/// The held chunk buffers as `len` floats each: `dw`'s (when `held.0`) and the rounded old
/// weight's (when `held.1`), empty when not held.
fn buffers(
    ws: &mut Scratch,
    held: (bool, bool),
    len: usize,
) -> Result<(&mut [f32], &mut [f32]), TensorError> {
    Ok(match held {
        (true, true) => {
            let (g, wr) = ws.host_pair_mut(0, 1)?;
            (&mut floats(g)?[..len], &mut floats(wr)?[..len])
        }
        (true, false) => (&mut floats(ws.host_mut(0)?)?[..len], &mut []),
        _ => (&mut [], &mut []),
    })
}

/// Every element of `v` rounded to `dtype` (and read back as f32).
fn round_in_place(dtype: DType, v: &mut [f32]) -> Result<(), TensorError> {
    with_float!(dtype, T => {
        v.iter_mut().for_each(|x| *x = T::from_f32(*x).to_f32());
        Ok(())
    }, Err(not_float(OP, dtype)))
}

/// The layer input: read, or read then overwritten by `dx` chunk by chunk.
enum X<'a> {
    Read(&'a [f32]),
    Write(&'a mut [f32]),
}

impl X<'_> {
    fn read(&self) -> &[f32] {
        match self {
            X::Read(x) => x,
            X::Write(x) => x,
        }
    }
}

//! The host's bf16 and f16 convolutions, GEMMs, poolings and batch normalizations: computed by
//! their f32 bodies on f32 copies of the operands, each output rounded once to its dtype (the
//! fused dense update, `dense_adam.rs`, widens its `x` and `dy` with the same copies).
//!
//! This is what cuDNN and cuBLAS do with low-precision data and an f32 compute type (every
//! product and sum in f32, one rounding at the end), so the CPU stays the GPU's oracle and
//! agrees with "the f32 op on the widened inputs, rounded". The copies are workspace: allocated
//! as [`Category::Workspace`] in the order [`copies`] lists them (inputs, then outputs), the f32
//! body's own workspace inside them, freed last first ([`around`]), so a plan replays them as
//! the op allocates them. The host pays for them (the oracle's simplicity over its memory); the
//! CUDA backend computes in place in the low-precision buffers.

use super::elementwise::{cast, round_through, unary, unary_bwd};
use super::{CpuBackend, conv, matmul, norm, pool};
use crate::backend::{
    BatchNorm, BatchNormBwd, Cast, Conv2d, Conv2dBwdData, Conv2dBwdFilter, Matmul, MaxFrom, Pool2d,
    Pool2dBwd, Unary, UnaryBwd,
};
use crate::{ConvPass, DType, OpDesc, PoolKind, Tensor, TensorError, WorkspaceStep};
use stax_alloc::Category;

/// Elements of the f32 copies a low-precision call of `op` makes, in allocation order (its
/// float inputs, then its outputs); empty for an f32 call and for ops computed natively in
/// every dtype.
pub(super) fn copies(op: &OpDesc) -> Vec<usize> {
    match *op {
        OpDesc::Conv {
            geometry: g,
            pass,
            dtype,
            bias,
        } if dtype != DType::F32 => {
            let (x, w, y) = (
                g.input_shape().numel(),
                g.filter_shape().numel(),
                g.output_shape().numel(),
            );
            let b = bias.then_some(g.c_out);
            match pass {
                ConvPass::Forward => [Some(x), Some(w), b, Some(y)]
                    .into_iter()
                    .flatten()
                    .collect(),
                ConvPass::BackwardData => vec![y, w, x],
                ConvPass::BackwardFilter => [Some(x), Some(y), Some(w), b]
                    .into_iter()
                    .flatten()
                    .collect(),
            }
        }
        OpDesc::Matmul { m, n, k, dtype, .. } if dtype != DType::F32 => vec![m * k, k * n, m * n],
        // x, then y (forward) or dy, which the backward pass overwrites with dx
        OpDesc::BatchNorm {
            geometry, dtype, ..
        } if dtype != DType::F32 => vec![geometry.numel(); 2],
        // x (which receives dx) and dy; dw and the weight are f32 already
        OpDesc::DenseAdam { m, n, k, dtype, .. } if dtype != DType::F32 => vec![m * k, m * n],
        OpDesc::Pool {
            kind,
            geometry: g,
            backward,
            dtype,
            argmax,
        } if dtype != DType::F32 => {
            let (x, y) = (g.input_shape().numel(), g.output_shape().numel());
            match (backward, kind, argmax) {
                (false, _, _) => vec![x, y],
                (true, PoolKind::Max, false) => vec![x, y, x],
                (true, _, _) => vec![y, x],
            }
        }
        _ => Vec::new(),
    }
}

/// The schedule of a call with f32 copies of `elements`: the copies allocated, then `inner`
/// (the f32 body's schedule, its buffer indices moved past the copies), then the copies freed,
/// last first.
pub(super) fn around(elements: Vec<usize>, inner: Vec<WorkspaceStep>) -> Vec<WorkspaceStep> {
    let k = elements.len();
    let mut steps: Vec<WorkspaceStep> = elements
        .iter()
        .map(|&n| WorkspaceStep::Alloc(n * 4))
        .collect();
    steps.extend(inner.into_iter().map(|s| match s {
        WorkspaceStep::Free(i) => WorkspaceStep::Free(i + k),
        alloc => alloc,
    }));
    steps.extend((0..k).rev().map(WorkspaceStep::Free));
    steps
}

/// An f32 workspace copy of `t` (its values when `read`).
pub(super) fn widen(t: &Tensor, read: bool) -> Result<Tensor, TensorError> {
    let mut w = Tensor::empty(
        t.backend(),
        t.shape().clone(),
        DType::F32,
        Category::Workspace,
    )?;
    if read {
        cast(Cast {
            src: t,
            dst: &mut w,
        })?;
    }
    Ok(w)
}

/// `t = wide` rounded to `t`'s dtype.
pub(super) fn narrow(wide: &Tensor, t: &mut Tensor) -> Result<(), TensorError> {
    cast(Cast { src: wide, dst: t })
}

/// A low-precision forward convolution: the f32 convolution and bias, rounded, then the
/// activation on the rounded output (as the GPU applies it).
pub(super) fn conv2d(be: &CpuBackend, c: Conv2d<'_>) -> Result<(), TensorError> {
    let Conv2d {
        g,
        x,
        w,
        b,
        y,
        act,
        aux,
    } = c;
    let (x32, w32) = (widen(x, true)?, widen(w, true)?);
    let b32 = b.map(|b| widen(b, true)).transpose()?;
    let mut y32 = widen(y, false)?;
    let wide = Conv2d {
        g,
        x: &x32,
        w: &w32,
        b: b32.as_ref(),
        y: &mut y32,
        act: None,
        aux: None,
    };
    conv::forward(be, wide)?;
    narrow(&y32, y)?;
    drop((y32, b32, w32, x32));
    match act {
        Some(act) => unary(Unary { act, y, aux }),
        None => Ok(()),
    }
}

/// A low-precision input gradient of a convolution.
pub(super) fn conv2d_bwd_data(be: &CpuBackend, c: Conv2dBwdData<'_>) -> Result<(), TensorError> {
    let Conv2dBwdData { g, dy, w, dx } = c;
    let (dy32, w32) = (widen(dy, true)?, widen(w, true)?);
    let mut dx32 = widen(dx, false)?;
    let wide = Conv2dBwdData {
        g,
        dy: &dy32,
        w: &w32,
        dx: &mut dx32,
    };
    conv::backward_data(be, wide)?;
    narrow(&dx32, dx)?;
    drop((dx32, w32, dy32));
    Ok(())
}

/// Low-precision kernel and bias gradients of a convolution (the activation's gradient first,
/// in `dy`'s dtype, as the GPU computes it).
pub(super) fn conv2d_bwd_filter(
    be: &CpuBackend,
    c: Conv2dBwdFilter<'_>,
) -> Result<(), TensorError> {
    let Conv2dBwdFilter {
        g,
        x,
        dy,
        dw,
        db,
        act,
        keep_dy: _,
    } = c;
    if let Some((act, saved)) = act {
        unary_bwd(UnaryBwd {
            act,
            saved,
            dy: &mut *dy,
        })?;
    }
    let (x32, mut dy32) = (widen(x, true)?, widen(dy, true)?);
    let mut dw32 = widen(dw, false)?;
    let mut db32 = db.as_deref().map(|d| widen(d, false)).transpose()?;
    let wide = Conv2dBwdFilter {
        g,
        x: &x32,
        dy: &mut dy32,
        dw: &mut dw32,
        db: db32.as_mut(),
        act: None,
        keep_dy: false,
    };
    conv::backward_filter(be, wide)?;
    narrow(&dw32, dw)?;
    if let (Some(db), Some(db32)) = (db, &db32) {
        narrow(db32, db)?;
    }
    drop((db32, dw32, dy32, x32));
    Ok(())
}

/// A low-precision matrix product; an f32 `b` (the mixed dense product) is copied rounded to
/// `a`'s dtype.
pub(super) fn matmul(c: Matmul<'_>) -> Result<(), TensorError> {
    let (a32, mut b32) = (widen(c.a, true)?, widen(c.b, true)?);
    if c.b.dtype() == DType::F32 {
        round_through(&mut b32, c.a.dtype())?;
    }
    let mut c32 = widen(c.c, c.accumulate)?;
    matmul::matmul(Matmul {
        a: &a32,
        b: &b32,
        c: &mut c32,
        ..c
    })?;
    narrow(&c32, c.c)?;
    drop((c32, b32, a32));
    Ok(())
}

/// A low-precision pooling.
pub(super) fn pool2d(c: Pool2d<'_>) -> Result<(), TensorError> {
    let Pool2d {
        kind,
        g,
        x,
        y,
        argmax,
    } = c;
    let x32 = widen(x, true)?;
    let mut y32 = widen(y, false)?;
    pool::forward(Pool2d {
        kind,
        g,
        x: &x32,
        y: &mut y32,
        argmax,
    })?;
    narrow(&y32, y)?;
    drop((y32, x32));
    Ok(())
}

/// A low-precision pooling's input gradient.
pub(super) fn pool2d_bwd(c: Pool2dBwd<'_>) -> Result<(), TensorError> {
    let Pool2dBwd {
        kind,
        g,
        from,
        dy,
        dx,
    } = c;
    let x32 = match from {
        Some(MaxFrom::Input(x)) if kind == PoolKind::Max => Some(widen(x, true)?),
        _ => None,
    };
    let dy32 = widen(dy, true)?;
    let mut dx32 = widen(dx, false)?;
    let from = match (from, &x32) {
        (Some(MaxFrom::Argmax(a)), _) => Some(MaxFrom::Argmax(a)),
        (_, Some(x)) => Some(MaxFrom::Input(x)),
        _ => None,
    };
    pool::backward(Pool2dBwd {
        kind,
        g,
        from,
        dy: &dy32,
        dx: &mut dx32,
    })?;
    narrow(&dx32, dx)?;
    drop((dx32, dy32, x32));
    Ok(())
}

/// A low-precision batch normalization: the f32 body on the widened input (its ReLU mask from
/// the f32 output, as the GPU's kernel), the output rounded once.
pub(super) fn batch_norm(c: BatchNorm<'_>) -> Result<(), TensorError> {
    let BatchNorm { x, y, .. } = c;
    let x32 = widen(x, true)?;
    let mut y32 = widen(y, false)?;
    norm::batch_norm(BatchNorm {
        x: &x32,
        y: &mut y32,
        ..c
    })?;
    narrow(&y32, y)?;
    drop((y32, x32));
    Ok(())
}

/// A low-precision batch normalization's backward pass: the f32 body on the widened input and
/// output gradient, which it overwrites with the (masked) input gradient, rounded once.
pub(super) fn batch_norm_bwd(c: BatchNormBwd<'_>) -> Result<(), TensorError> {
    let BatchNormBwd { x, dy, .. } = c;
    let written = c.need_dx || c.relu.is_some();
    let (x32, mut dy32) = (widen(x, true)?, widen(dy, true)?);
    norm::batch_norm_bwd(BatchNormBwd {
        x: &x32,
        dy: &mut dy32,
        ..c
    })?;
    if written {
        narrow(&dy32, dy)?;
    }
    drop((dy32, x32));
    Ok(())
}

//! 2-D convolution on the host by im2col + GEMM: forward, backward data, backward filter.
//!
//! Layouts are stax's: input NHWC `[n, h, w, c_in]`, kernel HWIO `[kh, kw, c_in, c_out]`,
//! output NHWC `[n, out_h, out_w, c_out]`, cross-correlation as `lax.conv_general_dilated`:
//! `y[i, oy, ox, o] = b[o] + sum_{ky, kx, c} x[i, oy·sh + ky - pad_top, ox·sw + kx - pad_left, c]
//! · w[ky, kx, c, o]`, input positions outside the image reading zero.
//!
//! Every output pixel `p` (all images, row-major) has a patch row `col[p, :]` of
//! `K = kh · kw · c_in` values laid out `[ky, kx, c]`, the same order as the kernel seen as a
//! `[K, c_out]` matrix `W`. Then, with `Y` and `dY` the outputs as `[P, c_out]` matrices:
//! - forward: `Y = col · W + b`;
//! - backward data: `dcol = dY · Wᵀ`, scattered back and summed into `dx` (col2im);
//! - backward filter: `dW = colᵀ · dY`, `db = sum over rows of dY`.
//!
//! The patch matrix is never built for the whole batch (100 images of 200x200 with a 3x3x64
//! kernel would take 9 GB): output pixels are processed in chunks of rows whose column buffer
//! fits the backend's workspace bound, allocated as [`stax_alloc::Category::Workspace`] and freed
//! before the op returns. A 1x1 kernel with stride 1 and no padding is a plain GEMM on `x`.

use super::elementwise::{column_sums, unary, unary_bwd};
use super::matmul::{MatMut, MatRef, gemm};
use super::{CpuBackend, data, data_mut};
use crate::backend::{Conv2d, Conv2dBwdData, Conv2dBwdFilter, Scratch, Unary, UnaryBwd};
use crate::{Backend, Conv2dGeometry, ConvPass, DType, OpDesc, TensorError};
use std::ops::Range;

#[cfg(test)]
mod tests;

const FWD: &str = "conv2d";
const BWD_DATA: &str = "conv2d_bwd_data";
const BWD_FILTER: &str = "conv2d_bwd_filter";

/// Patch length `K = kh · kw · c_in`.
fn patch_len(g: &Conv2dGeometry) -> usize {
    g.kh * g.kw * g.c_in
}

/// Number of output pixels `P = n · out_h · out_w`.
fn pixels(g: &Conv2dGeometry) -> usize {
    g.n * g.out_h * g.out_w
}

/// Whether the conv is a plain GEMM over pixels: 1x1 kernel, stride 1, no padding.
fn is_pointwise(g: &Conv2dGeometry) -> bool {
    (g.kh, g.kw, g.stride_h, g.stride_w) == (1, 1, 1, 1)
        && [g.pad_top, g.pad_bottom, g.pad_left, g.pad_right] == [0; 4]
}

/// Where output pixel `p`'s patch lies in its image: the image index, the output row, and the
/// `kx` range `lo..hi` that falls inside the image with `ix0`, the input column of `kx = lo`.
struct Patch {
    image: usize,
    oy: usize,
    kx: Range<usize>,
    ix0: usize,
}

impl Patch {
    fn of(g: &Conv2dGeometry, p: usize) -> Patch {
        let per_image = g.out_h * g.out_w;
        let (image, rem) = (p / per_image, p % per_image);
        let (oy, ox) = (rem / g.out_w, rem % g.out_w);
        // Input column of kx is base + kx - pad_left; it is inside when in [0, w).
        let base = ox * g.stride_w;
        let lo = g.pad_left.saturating_sub(base).min(g.kw);
        let hi = (g.pad_left + g.w).saturating_sub(base).min(g.kw).max(lo);
        // An empty range gets column 0, so slicing at it stays inside the image.
        let ix0 = if hi > lo { base + lo - g.pad_left } else { 0 };
        Patch {
            image,
            oy,
            kx: lo..hi,
            ix0,
        }
    }

    /// Input row read by kernel row `ky`, or `None` in the padding.
    fn iy(&self, g: &Conv2dGeometry, ky: usize) -> Option<usize> {
        (self.oy * g.stride_h + ky)
            .checked_sub(g.pad_top)
            .filter(|&iy| iy < g.h)
    }
}

/// Fills `col` (`[rows, K]`, row-major) with the patches of output pixels `p0..p0 + rows`.
fn im2col(g: &Conv2dGeometry, x: &[f32], p0: usize, col: &mut [f32]) {
    let (c, image_len) = (g.c_in, g.h * g.w * g.c_in);
    for (i, row) in col.chunks_exact_mut(patch_len(g)).enumerate() {
        let patch = Patch::of(g, p0 + i);
        let image = &x[patch.image * image_len..][..image_len];
        let (lo, hi) = (patch.kx.start * c, patch.kx.end * c);
        for (ky, dst) in row.chunks_exact_mut(g.kw * c).enumerate() {
            let Some(iy) = patch.iy(g, ky) else {
                dst.fill(0.0);
                continue;
            };
            dst[..lo].fill(0.0);
            dst[lo..hi].copy_from_slice(&image[(iy * g.w + patch.ix0) * c..][..hi - lo]);
            dst[hi..].fill(0.0);
        }
    }
}

/// Adds the patch gradients `dcol` (`[rows, K]`) of output pixels `p0..p0 + rows` into `dx`.
fn col2im(g: &Conv2dGeometry, dcol: &[f32], p0: usize, dx: &mut [f32]) {
    let (c, image_len) = (g.c_in, g.h * g.w * g.c_in);
    for (i, row) in dcol.chunks_exact(patch_len(g)).enumerate() {
        let patch = Patch::of(g, p0 + i);
        let image = &mut dx[patch.image * image_len..][..image_len];
        let (lo, hi) = (patch.kx.start * c, patch.kx.end * c);
        for (ky, src) in row.chunks_exact(g.kw * c).enumerate() {
            if let Some(iy) = patch.iy(g, ky) {
                let dst = &mut image[(iy * g.w + patch.ix0) * c..][..hi - lo];
                for (d, s) in dst.iter_mut().zip(&src[lo..hi]) {
                    *d += s;
                }
            }
        }
    }
}

/// Floats of the im2col column buffer one call of any pass allocates: none for a pointwise conv
/// (a plain GEMM on `x` or into `dx`), else a chunk of rows of `K` floats within the backend's
/// workspace bound (at least one row, at most every output pixel).
fn column_floats(be: &CpuBackend, g: &Conv2dGeometry) -> usize {
    if is_pointwise(g) {
        0
    } else {
        let k = patch_len(g);
        be.workspace_rows(k).min(pixels(g)) * k
    }
}

/// Workspace bytes one call of `pass` allocates (and frees before returning): the column buffer
/// of [`column_floats`], the same for the three passes. What [`crate::Backend::workspace_bytes`]
/// answers on the CPU.
///
/// # Errors
/// [`TensorError::InvalidArgument`] for an inconsistent geometry or a size that overflows.
pub(crate) fn workspace_bytes(
    be: &CpuBackend,
    g: &Conv2dGeometry,
    pass: ConvPass,
) -> Result<usize, TensorError> {
    let op = match pass {
        ConvPass::Forward => FWD,
        ConvPass::BackwardData => BWD_DATA,
        ConvPass::BackwardFilter => BWD_FILTER,
    };
    g.validate(op)?;
    column_floats(be, g)
        .checked_mul(4)
        .ok_or_else(|| TensorError::InvalidArgument {
            op,
            reason: format!("the column buffer of {g:?} overflows the address space"),
        })
}

/// The column buffer of one pass, allocated by the pass's workspace schedule.
fn columns(
    be: &CpuBackend,
    op: &'static str,
    g: &Conv2dGeometry,
    pass: ConvPass,
) -> Result<(Scratch, usize), TensorError> {
    let desc = OpDesc::Conv {
        geometry: *g,
        pass,
        dtype: DType::F32,
    };
    let mut ws = Scratch::new(op, be.allocator(), be.workspace_schedule(&desc)?);
    let i = ws.alloc()?;
    Ok((ws, i))
}

/// The f32 view of workspace buffer `i`.
pub(super) fn floats(ws: &mut Scratch, i: usize) -> Result<&mut [f32], TensorError> {
    bytemuck::try_cast_slice_mut(ws.host_mut(i)?).map_err(|e| TensorError::InvalidArgument {
        op: "workspace",
        reason: format!("workspace buffer {i} is not an f32 array: {e}"),
    })
}

/// Calls `f(rows, col)` for consecutive chunks of output pixels, `col` being their patch matrix
/// `[rows.len(), K]`. Pointwise convs pass `x` itself as one chunk; otherwise the column buffer
/// is one workspace allocation of at most the backend's workspace bound (at least one row).
fn for_each_chunk(
    be: &CpuBackend,
    (op, pass): (&'static str, ConvPass),
    g: &Conv2dGeometry,
    x: &[f32],
    mut f: impl FnMut(Range<usize>, MatRef<'_>) -> Result<(), TensorError>,
) -> Result<(), TensorError> {
    let (total, k) = (pixels(g), patch_len(g));
    if is_pointwise(g) {
        return f(0..total, MatRef::row_major(x, total, k));
    }
    let chunk = column_floats(be, g) / k;
    let (mut ws, i) = columns(be, op, g, pass)?;
    let buf = floats(&mut ws, i)?;
    for start in (0..total).step_by(chunk) {
        let rows = start..(start + chunk).min(total);
        let col = &mut buf[..rows.len() * k];
        im2col(g, x, start, col);
        f(rows.clone(), MatRef::row_major(col, rows.len(), k))?;
    }
    ws.free(i)?;
    ws.finish()
}

/// Forward convolution `y = act(conv(x, w) + b)` (see the module doc); `y` is overwritten,
/// the activation (and its mask) after the bias, as a separate pass.
pub(crate) fn forward(be: &CpuBackend, c: Conv2d<'_>) -> Result<(), TensorError> {
    let Conv2d {
        g,
        x,
        w,
        b,
        y,
        act,
        aux,
    } = c;
    let (xs, bias) = (data(FWD, x)?, data(FWD, b)?);
    let wm = MatRef::row_major(data(FWD, w)?, patch_len(&g), g.c_out);
    let ys = data_mut(FWD, y)?;
    let co = g.c_out;
    for_each_chunk(be, (FWD, ConvPass::Forward), &g, xs, |rows, col| {
        let out = &mut ys[rows.start * co..rows.end * co];
        for row in out.chunks_exact_mut(co) {
            row.copy_from_slice(bias);
        }
        gemm(
            FWD,
            1.0,
            col,
            wm,
            1.0,
            MatMut::row_major(out, rows.len(), co),
        )
    })?;
    match act {
        Some(act) => unary(Unary { act, y, aux }),
        None => Ok(()),
    }
}

/// Gradient with respect to the input, `dx = conv_transpose(dy, w)`; `dx` is overwritten.
pub(crate) fn backward_data(be: &CpuBackend, c: Conv2dBwdData<'_>) -> Result<(), TensorError> {
    let Conv2dBwdData { g, dy, w, dx } = c;
    let g = &g;
    let (total, k, co) = (pixels(g), patch_len(g), g.c_out);
    let dys = data(BWD_DATA, dy)?;
    let wt = MatRef::row_major(data(BWD_DATA, w)?, k, co).t();
    let dxs = data_mut(BWD_DATA, dx)?;
    if is_pointwise(g) {
        let dym = MatRef::row_major(dys, total, co);
        return gemm(
            BWD_DATA,
            1.0,
            dym,
            wt,
            0.0,
            MatMut::row_major(dxs, total, k),
        );
    }
    dxs.fill(0.0);
    let chunk = column_floats(be, g) / k;
    let (mut ws, i) = columns(be, BWD_DATA, g, ConvPass::BackwardData)?;
    let buf = floats(&mut ws, i)?;
    for start in (0..total).step_by(chunk) {
        let rows = (start + chunk).min(total) - start;
        let dcol = &mut buf[..rows * k];
        let dym = MatRef::row_major(&dys[start * co..][..rows * co], rows, co);
        gemm(
            BWD_DATA,
            1.0,
            dym,
            wt,
            0.0,
            MatMut::row_major(dcol, rows, k),
        )?;
        col2im(g, dcol, start, dxs);
    }
    ws.free(i)?;
    ws.finish()
}

/// Gradients with respect to kernel and bias: `dw = colᵀ · dy` (HWIO `g.filter_shape()`) and
/// `db[o] = sum of dy[..., o]` (`[c_out]`, summed in f64); both overwritten. With an
/// activation, `dy` is first turned in place into the gradient before it.
pub(crate) fn backward_filter(be: &CpuBackend, c: Conv2dBwdFilter<'_>) -> Result<(), TensorError> {
    let Conv2dBwdFilter {
        g,
        x,
        dy,
        dw,
        db,
        act,
    } = c;
    if let Some((act, saved)) = act {
        unary_bwd(UnaryBwd {
            act,
            saved,
            dy: &mut *dy,
        })?;
    }
    let g = &g;
    let (xs, dys) = (data(BWD_FILTER, x)?, data(BWD_FILTER, dy)?);
    let (k, co) = (patch_len(g), g.c_out);
    let dws = data_mut(BWD_FILTER, dw)?;
    let dbs = data_mut(BWD_FILTER, db)?;
    let mut beta = 0.0;
    for_each_chunk(
        be,
        (BWD_FILTER, ConvPass::BackwardFilter),
        g,
        xs,
        |rows, col| {
            let dym = MatRef::row_major(&dys[rows.start * co..rows.end * co], rows.len(), co);
            gemm(
                BWD_FILTER,
                1.0,
                col.t(),
                dym,
                beta,
                MatMut::row_major(&mut *dws, k, co),
            )?;
            beta = 1.0;
            Ok(())
        },
    )?;
    column_sums(dys, dbs);
    Ok(())
}

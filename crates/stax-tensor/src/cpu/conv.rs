//! 2-D convolution on the host by im2col + GEMM: forward, backward data, backward filter.
//!
//! Cross-correlation with kernel dilation, as `lax.conv_general_dilated`:
//! `y[i, oy, ox, o] = b[o] + sum_{ky, kx, c} x[i, oy·sh + ky·dh - pad_top, ox·sw + kx·dw -
//! pad_left, c] · K[ky, kx, c, o]`, input positions outside the image reading zero. The
//! activations are NHWC or NCHW and the kernel any [`crate::FilterLayout`]: im2col reads the
//! input through its layout's strides, the GEMM writes the output through its strides, and a
//! kernel not stored as HWIO is first copied to HWIO (`K`) in a workspace buffer (its
//! gradient computed there and copied back).
//!
//! Every output pixel `p` (all images, row-major) has a patch row `col[p, :]` of
//! `K = kh · kw · c_in` values laid out `[ky, kx, c]`, the same order as the HWIO kernel seen
//! as a `[K, c_out]` matrix `W`. Then, with `Y` and `dY` the outputs as `[P, c_out]` matrices:
//! - forward: `Y = col · W + b`;
//! - backward data: `dcol = dY · Wᵀ`, scattered back and summed into `dx` (col2im);
//! - backward filter: `dW = colᵀ · dY`, `db = sum over rows of dY`.
//!
//! The patch matrix is never built for the whole batch (100 images of 200x200 with a 3x3x64
//! kernel would take 9 GB): output pixels are processed in chunks of rows whose column buffer
//! fits the backend's workspace bound, allocated as [`stax_alloc::Category::Workspace`] and freed
//! before the op returns. An NHWC 1x1 kernel with stride 1 and no padding is a plain GEMM on `x`.

use super::elementwise::{unary, unary_bwd};
use super::matmul::{MatMut, MatRef, gemm};
use super::norm::channel_sums;
use super::{CpuBackend, data, data_mut};
use crate::backend::{
    Conv2d, Conv2dBwdData, Conv2dBwdFilter, Scratch, Unary, UnaryBwd, least_headroom,
};
use crate::{Conv2dGeometry, ConvPass, FilterLayout, Layout, OpDesc, TensorError, WorkspaceStep};
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

/// Whether the conv is a plain GEMM over pixels: NHWC, 1x1 kernel, stride 1, no padding.
fn is_pointwise(g: &Conv2dGeometry) -> bool {
    (g.kh, g.kw, g.stride_h, g.stride_w) == (1, 1, 1, 1)
        && [g.pad_top, g.pad_bottom, g.pad_left, g.pad_right] == [0; 4]
        && g.layout == Layout::Nhwc
}

/// Element strides of an image of the input `(image, channel, row, column)`.
fn input_strides(g: &Conv2dGeometry) -> (usize, usize, usize, usize) {
    g.layout.strides(g.h, g.w, g.c_in)
}

/// The kernel taps `lo..hi` along one axis whose input index `o·s + t·d - pad` lies in
/// `0..len`, for output index `o` and `k` taps.
fn taps(o: usize, (s, d, pad): (usize, usize, usize), len: usize, k: usize) -> Range<usize> {
    let base = o * s;
    let lo = pad.saturating_sub(base).div_ceil(d).min(k);
    let hi = (len + pad).saturating_sub(base).div_ceil(d).min(k).max(lo);
    lo..hi
}

/// Image, output row and output column of output pixel `p`.
fn pixel(g: &Conv2dGeometry, p: usize) -> (usize, usize, usize) {
    let per_image = g.out_h * g.out_w;
    let rem = p % per_image;
    (p / per_image, rem / g.out_w, rem % g.out_w)
}

/// Calls `f(patch_offset, image_offset, len, image_stride)` for every run of patch row `p`
/// that reads the input: `len` elements of the patch from `patch_offset`, read from its image
/// at `image_offset` with stride `image_stride` (a channel run, or, NHWC without column
/// dilation, a whole run of kernel columns). What no run covers lies in the padding.
fn patch_runs(g: &Conv2dGeometry, p: usize, mut f: impl FnMut(usize, usize, usize, usize)) {
    let (_, oy, ox) = pixel(g, p);
    let (_, sc, sr, scol) = input_strides(g);
    let c = g.c_in;
    let ky = taps(oy, (g.stride_h, g.dilation_h, g.pad_top), g.h, g.kh);
    let kx = taps(ox, (g.stride_w, g.dilation_w, g.pad_left), g.w, g.kw);
    let contiguous = sc == 1 && scol == c && g.dilation_w == 1;
    let ix = |u: usize| ox * g.stride_w + u * g.dilation_w - g.pad_left;
    for t in ky {
        let iy = oy * g.stride_h + t * g.dilation_h - g.pad_top;
        let row = t * g.kw * c;
        if contiguous && !kx.is_empty() {
            f(
                row + kx.start * c,
                iy * sr + ix(kx.start) * scol,
                kx.len() * c,
                1,
            );
            continue;
        }
        for u in kx.clone() {
            f(row + u * c, iy * sr + ix(u) * scol, c, sc);
        }
    }
}

/// Fills `col` (`[rows, K]`, row-major) with the patches of output pixels `p0..p0 + rows`.
fn im2col(g: &Conv2dGeometry, x: &[f32], p0: usize, col: &mut [f32]) {
    let image_len = input_strides(g).0;
    for (i, row) in col.chunks_exact_mut(patch_len(g)).enumerate() {
        row.fill(0.0);
        let img = &x[pixel(g, p0 + i).0 * image_len..][..image_len];
        patch_runs(g, p0 + i, |at, from, len, stride| {
            let dst = &mut row[at..at + len];
            if stride == 1 {
                dst.copy_from_slice(&img[from..from + len]);
            } else {
                for (j, d) in dst.iter_mut().enumerate() {
                    *d = img[from + j * stride];
                }
            }
        });
    }
}

/// Adds the patch gradients `dcol` (`[rows, K]`) of output pixels `p0..p0 + rows` into `dx`.
fn col2im(g: &Conv2dGeometry, dcol: &[f32], p0: usize, dx: &mut [f32]) {
    let image_len = input_strides(g).0;
    for (i, row) in dcol.chunks_exact(patch_len(g)).enumerate() {
        let img = &mut dx[pixel(g, p0 + i).0 * image_len..][..image_len];
        patch_runs(g, p0 + i, |at, from, len, stride| {
            for (j, s) in row[at..at + len].iter().enumerate() {
                img[from + j * stride] += s;
            }
        });
    }
}

/// The output pixels `rows` as blocks of the output seen as a `[pixels, c_out]` matrix: each
/// `(pixels, offset, (rs, cs))`. NHWC is one row-major block; NCHW one block per image, of
/// strides `(1, out_h · out_w)`.
fn out_blocks(
    g: &Conv2dGeometry,
    rows: Range<usize>,
) -> Vec<(Range<usize>, usize, (usize, usize))> {
    let (co, per_image) = (g.c_out, g.out_h * g.out_w);
    match g.layout {
        Layout::Nhwc => vec![(rows.clone(), rows.start * co, (co, 1))],
        Layout::Nchw => {
            let mut out = Vec::new();
            let mut p = rows.start;
            while p < rows.end {
                let image = p / per_image;
                let end = rows.end.min((image + 1) * per_image);
                let offset = image * co * per_image + p - image * per_image;
                out.push((p..end, offset, (1, per_image)));
                p = end;
            }
            out
        }
    }
}

/// Floats of the im2col column buffer one call of `pass` allocates: none for a pointwise conv
/// (a plain GEMM on `x` or into `dx`), else a chunk of rows of `K` floats within the pass's
/// workspace bound (the backend's, or the allowance [`allot`] gave it; at least one row, at
/// most every output pixel).
fn column_floats(be: &CpuBackend, g: &Conv2dGeometry, pass: ConvPass) -> usize {
    if is_pointwise(g) {
        0
    } else {
        let k = patch_len(g);
        be.workspace_rows(k, (*g, pass)).min(pixels(g)) * k
    }
}

/// The key of `op`'s column-buffer bound if it is a convolution pass.
pub(crate) fn key(op: &OpDesc) -> Option<(Conv2dGeometry, ConvPass)> {
    match *op {
        OpDesc::Conv { geometry, pass, .. } => Some((geometry, pass)),
        _ => None,
    }
}

/// The headroom rule on the CPU (see [`crate::Backend::allot_workspace`]): every geometry is
/// checked first (a bad op fails before anything changes), then each convolution pass's
/// column buffer may grow by the least headroom of its ops (at most the user's limit), which
/// takes more output pixels per chunk; returns how many entries of `headroom` changed
/// schedule.
///
/// # Errors
/// As [`schedule`].
pub(crate) fn allot(be: &CpuBackend, headroom: &[(OpDesc, usize)]) -> Result<usize, TensorError> {
    for (g, _) in headroom.iter().filter_map(|(op, _)| key(op)) {
        g.validate("allot_workspace")?;
    }
    let least = least_headroom(headroom, key);
    let columns = |op: &OpDesc| key(op).map_or(0, |(g, pass)| column_floats(be, &g, pass));
    let before: Vec<usize> = headroom.iter().map(|(op, _)| columns(op)).collect();
    for ((g, pass), bytes) in least {
        let now = column_floats(be, &g, pass) * 4;
        be.allow_columns((g, pass), now.saturating_add(bytes));
    }
    let after = headroom.iter().map(|(op, _)| columns(op));
    Ok(before.iter().zip(after).filter(|(b, a)| **b != *a).count())
}

/// The workspace one call of any pass allocates and frees, in order (what
/// [`crate::Backend::workspace_schedule`] answers on the CPU): the HWIO kernel (or its
/// gradient) when the kernel is stored otherwise, then the column buffer of [`column_floats`];
/// the column buffer is freed first.
///
/// # Errors
/// [`TensorError::InvalidArgument`] for an inconsistent geometry or a size that overflows.
pub(crate) fn schedule(
    be: &CpuBackend,
    g: &Conv2dGeometry,
    pass: ConvPass,
) -> Result<Vec<WorkspaceStep>, TensorError> {
    g.validate("workspace_schedule")?;
    let overflow = || TensorError::InvalidArgument {
        op: "workspace_schedule",
        reason: format!("the workspace of {g:?} overflows the address space"),
    };
    let filter = match g.filter {
        FilterLayout::Hwio => 0,
        _ => g
            .filter_shape()
            .numel()
            .checked_mul(4)
            .ok_or_else(overflow)?,
    };
    let columns = column_floats(be, g, pass)
        .checked_mul(4)
        .ok_or_else(overflow)?;
    let sizes: Vec<usize> = [filter, columns].into_iter().filter(|&b| b > 0).collect();
    let mut steps: Vec<WorkspaceStep> = sizes.iter().map(|&b| WorkspaceStep::Alloc(b)).collect();
    steps.extend((0..sizes.len()).rev().map(WorkspaceStep::Free));
    Ok(steps)
}

/// Copies the kernel between its stored layout `g.filter` and HWIO: `to_hwio` reads `src`
/// stored and writes `dst` HWIO, otherwise the reverse.
fn permute_filter(g: &Conv2dGeometry, src: &[f32], dst: &mut [f32], to_hwio: bool) {
    let dims = (g.kh, g.kw, g.c_in, g.c_out);
    let mut hwio = 0;
    for ky in 0..g.kh {
        for kx in 0..g.kw {
            for c in 0..g.c_in {
                for o in 0..g.c_out {
                    let stored = g.filter.index(dims, [ky, kx, c, o]);
                    match to_hwio {
                        true => dst[hwio] = src[stored],
                        false => dst[stored] = src[hwio],
                    }
                    hwio += 1;
                }
            }
        }
    }
}

/// Workspace bytes as f32.
pub(super) fn floats(b: &mut [u8]) -> Result<&mut [f32], TensorError> {
    bytemuck::try_cast_slice_mut(b).map_err(|e| TensorError::InvalidArgument {
        op: "workspace",
        reason: format!("a workspace buffer is not an f32 array: {e}"),
    })
}

/// The HWIO kernel buffer and the column buffer of a pass, each when it has one.
type Views<'a> = (Option<&'a mut [f32]>, Option<&'a mut [f32]>);

/// A pass's workspace, allocated by its schedule: the HWIO kernel buffer (when the kernel is
/// stored otherwise) and the column buffer (unless pointwise).
struct Work {
    ws: Scratch,
    filter: Option<usize>,
    col: Option<usize>,
}

impl Work {
    fn new(
        be: &CpuBackend,
        (op, pass): (&'static str, ConvPass),
        g: &Conv2dGeometry,
    ) -> Result<Work, TensorError> {
        let mut ws = Scratch::new(op, crate::Backend::allocator(be), schedule(be, g, pass)?);
        let filter = (g.filter != FilterLayout::Hwio)
            .then(|| ws.alloc())
            .transpose()?;
        let col = (!is_pointwise(g)).then(|| ws.alloc()).transpose()?;
        Ok(Work { ws, filter, col })
    }

    /// The two buffers as f32 slices (each when held).
    fn views(&mut self) -> Result<Views<'_>, TensorError> {
        Ok(match (self.filter, self.col) {
            (Some(f), Some(c)) => {
                let (a, b) = self.ws.host_pair_mut(f, c)?;
                (Some(floats(a)?), Some(floats(b)?))
            }
            (Some(f), None) => (Some(floats(self.ws.host_mut(f)?)?), None),
            (None, Some(c)) => (None, Some(floats(self.ws.host_mut(c)?)?)),
            (None, None) => (None, None),
        })
    }

    fn finish(mut self) -> Result<(), TensorError> {
        for i in [self.col, self.filter].into_iter().flatten() {
            self.ws.free(i)?;
        }
        self.ws.finish()
    }
}

/// Calls `f(rows, col)` for consecutive chunks of output pixels, `col` being their patch matrix
/// `[rows.len(), K]` (row-major). Pointwise convs pass `x` itself as one chunk; otherwise `buf`
/// is the column buffer (at most the backend's workspace bound, at least one row).
fn for_each_chunk(
    g: &Conv2dGeometry,
    x: &[f32],
    buf: Option<&mut [f32]>,
    mut f: impl FnMut(Range<usize>, &[f32]) -> Result<(), TensorError>,
) -> Result<(), TensorError> {
    let (total, k) = (pixels(g), patch_len(g));
    let Some(buf) = buf else {
        return f(0..total, x);
    };
    let chunk = buf.len() / k;
    for start in (0..total).step_by(chunk) {
        let rows = start..(start + chunk).min(total);
        let col = &mut buf[..rows.len() * k];
        im2col(g, x, start, col);
        f(rows, col)?;
    }
    Ok(())
}

/// The patch rows of `block` (a part of the chunk `rows`) in the chunk's patch matrix `col`.
fn block_rows<'a>(
    g: &Conv2dGeometry,
    col: &'a [f32],
    rows: &Range<usize>,
    block: &Range<usize>,
) -> MatRef<'a> {
    let k = patch_len(g);
    MatRef::row_major(
        &col[(block.start - rows.start) * k..][..block.len() * k],
        block.len(),
        k,
    )
}

/// The kernel as HWIO: `w` itself, or `buf` filled from it.
fn hwio<'a>(g: &Conv2dGeometry, w: &'a [f32], buf: Option<&'a mut [f32]>) -> &'a [f32] {
    match buf {
        Some(buf) => {
            permute_filter(g, w, buf, true);
            buf
        }
        None => w,
    }
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
    let xs = data(FWD, x)?;
    let bias = b.map(|b| data(FWD, b)).transpose()?;
    let mut work = Work::new(be, (FWD, ConvPass::Forward), &g)?;
    let (fbuf, cbuf) = work.views()?;
    let wm = MatRef::row_major(hwio(&g, data(FWD, w)?, fbuf), patch_len(&g), g.c_out);
    let ys = data_mut(FWD, y)?;
    for_each_chunk(&g, xs, cbuf, |rows, col| {
        for (block, offset, strides) in out_blocks(&g, rows.clone()) {
            let cols = block_rows(&g, col, &rows, &block);
            let mut out = MatMut::strided(&mut ys[offset..], block.len(), g.c_out, strides);
            let beta = match bias {
                Some(bias) => {
                    out.fill_rows(bias);
                    1.0
                }
                None => 0.0,
            };
            gemm(FWD, 1.0, cols, wm, beta, out)?;
        }
        Ok(())
    })?;
    work.finish()?;
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
    let mut work = Work::new(be, (BWD_DATA, ConvPass::BackwardData), g)?;
    let (fbuf, cbuf) = work.views()?;
    let wt = MatRef::row_major(hwio(g, data(BWD_DATA, w)?, fbuf), k, co).t();
    let dxs = data_mut(BWD_DATA, dx)?;
    let Some(buf) = cbuf else {
        let dym = MatRef::row_major(dys, total, co);
        gemm(
            BWD_DATA,
            1.0,
            dym,
            wt,
            0.0,
            MatMut::row_major(dxs, total, k),
        )?;
        return work.finish();
    };
    dxs.fill(0.0);
    let chunk = buf.len() / k;
    for start in (0..total).step_by(chunk) {
        let rows = start..(start + chunk).min(total);
        let dcol = &mut buf[..rows.len() * k];
        for (block, offset, strides) in out_blocks(g, rows.clone()) {
            let dym = MatRef::strided(&dys[offset..], block.len(), co, strides);
            let at = (block.start - start) * k;
            let out = MatMut::row_major(&mut dcol[at..][..block.len() * k], block.len(), k);
            gemm(BWD_DATA, 1.0, dym, wt, 0.0, out)?;
        }
        col2im(g, dcol, start, dxs);
    }
    work.finish()
}

/// `dw` (HWIO, overwritten) `= colᵀ · dy`, over chunks of the column buffer `cbuf`.
fn filter_gradient(
    g: &Conv2dGeometry,
    (xs, dys): (&[f32], &[f32]),
    cbuf: Option<&mut [f32]>,
    dw: &mut [f32],
) -> Result<(), TensorError> {
    let (k, co) = (patch_len(g), g.c_out);
    let mut beta = 0.0;
    for_each_chunk(g, xs, cbuf, |rows, col| {
        for (block, offset, strides) in out_blocks(g, rows.clone()) {
            let cols = block_rows(g, col, &rows, &block).t();
            let dym = MatRef::strided(&dys[offset..], block.len(), co, strides);
            gemm(
                BWD_FILTER,
                1.0,
                cols,
                dym,
                beta,
                MatMut::row_major(&mut *dw, k, co),
            )?;
            beta = 1.0;
        }
        Ok(())
    })
}

/// Gradients with respect to kernel and bias: `dw = colᵀ · dy` (`g.filter_shape()`) and, when
/// given, `db[o] = sum of dy[..., o, ...]` (`[c_out]`, summed in f64); both overwritten. With
/// an activation, `dy` is first turned in place into the gradient before it.
pub(crate) fn backward_filter(be: &CpuBackend, c: Conv2dBwdFilter<'_>) -> Result<(), TensorError> {
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
    let g = &g;
    let (xs, dys) = (data(BWD_FILTER, x)?, data(BWD_FILTER, dy)?);
    let mut work = Work::new(be, (BWD_FILTER, ConvPass::BackwardFilter), g)?;
    let (fbuf, cbuf) = work.views()?;
    let dws = data_mut(BWD_FILTER, dw)?;
    match fbuf {
        Some(buf) => {
            filter_gradient(g, (xs, dys), cbuf, buf)?;
            permute_filter(g, buf, dws, false);
        }
        None => filter_gradient(g, (xs, dys), cbuf, dws)?,
    }
    work.finish()?;
    match db {
        Some(db) => channel_sums(&g.output_channels(), dy, db),
        None => Ok(()),
    }
}

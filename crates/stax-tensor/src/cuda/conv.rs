//! The three convolution passes of [`CudaBackend`]: layout changes around cuDNN.
//!
//! Our kernels are HWIO and cuDNN's NHWC filters are KRSC (= OHWI), so the filter is
//! transposed into a workspace buffer (and the filter gradient back). cuDNN wants symmetric
//! padding: with padding `(top, bottom)` it is given `min(top, bottom)` on both sides of an
//! input extended by explicit zero rows (`top - min` above, `bottom - min` below; the same for
//! columns), a copy made only when the padding is asymmetric (SAME with stride 2 on an even
//! size, or an even kernel). Every temporary comes from the allocator tagged `Workspace` and is
//! freed when the call returns (in stream order, so reuse is safe).

use super::CudaBackend;
use super::cudnn::{ConvPass, CudnnConv, Operands};
use crate::{Conv2dGeometry, Tensor, TensorError};
use stax_alloc::{Allocation, Category};

/// An input extended with explicit zeros: its size and where the real input sits in it.
#[derive(Debug, Clone, Copy)]
struct Extended {
    h: usize,
    w: usize,
    top: usize,
    left: usize,
}

const F32: usize = 4;

/// What cuDNN computes for `g` and `pass`, and the extended input if one is needed.
fn layout(g: &Conv2dGeometry, pass: ConvPass, rows_bytes: usize) -> (CudnnConv, Option<Extended>) {
    let ph = g.pad_top.min(g.pad_bottom);
    let pw = g.pad_left.min(g.pad_right);
    let ext = (!g.symmetric_padding()).then(|| Extended {
        h: g.h + g.pad_top + g.pad_bottom - 2 * ph,
        w: g.w + g.pad_left + g.pad_right - 2 * pw,
        top: g.pad_top - ph,
        left: g.pad_left - pw,
    });
    let (h, w) = ext.map_or((g.h, g.w), |e| (e.h, e.w));
    let filter = g.kh * g.kw * g.c_in * g.c_out * F32;
    let ext_bytes = ext.map_or(0, |e| g.n * e.h * e.w * g.c_in * F32);
    let layout_bytes = match pass {
        ConvPass::Forward | ConvPass::BackwardData => filter + ext_bytes,
        ConvPass::BackwardFilter => filter + ext_bytes + rows_bytes,
    };
    (
        CudnnConv {
            geometry: *g,
            h,
            w,
            pad_h: ph,
            pad_w: pw,
            layout_bytes,
        },
        ext,
    )
}

impl CudaBackend {
    fn scratch(&self, bytes: usize) -> Result<Allocation, TensorError> {
        Ok(self.allocator.allocate(bytes.max(1), Category::Workspace)?)
    }

    /// The filter `w` (HWIO) copied to OHWI in a workspace buffer.
    fn filter_ohwi(&self, w: &Tensor, g: &Conv2dGeometry) -> Result<Allocation, TensorError> {
        let t = self.scratch(w.bytes())?;
        self.kernels
            .transpose_filter(w.addr(), t.addr(), g.kh * g.kw, g.c_in, g.c_out, true)?;
        Ok(t)
    }

    /// `x` embedded in its extended zero-padded buffer, when `ext` asks for one.
    fn extend(
        &self,
        x: &Tensor,
        g: &Conv2dGeometry,
        ext: Option<Extended>,
    ) -> Result<Option<Allocation>, TensorError> {
        let Some(e) = ext else { return Ok(None) };
        let buf = self.scratch(g.n * e.h * e.w * g.c_in * F32)?;
        self.kernels.pad_or_crop(
            true,
            x.addr(),
            buf.addr(),
            [g.n, g.h, g.w, g.c_in],
            [e.h, e.w],
            [e.top, e.left],
        )?;
        Ok(Some(buf))
    }

    fn run_cudnn(
        &self,
        pass: ConvPass,
        conv: &CudnnConv,
        ops: Operands,
    ) -> Result<(), TensorError> {
        self.dnn.run(
            pass,
            conv,
            self.precision,
            ops,
            self.workspace_limit,
            &self.allocator,
        )
    }

    /// Forward pass; see [`crate::Backend::conv2d`].
    pub(super) fn conv_forward(
        &self,
        x: &Tensor,
        w: &Tensor,
        b: &Tensor,
        g: &Conv2dGeometry,
        y: &mut Tensor,
    ) -> Result<(), TensorError> {
        const OP: &str = "conv2d";
        self.check_input(OP, x, &g.input_shape())?;
        self.check_input(OP, w, &g.filter_shape())?;
        self.check_input(OP, b, &[g.c_out].into())?;
        self.check_output(OP, y, &g.output_shape())?;
        self.bind()?;
        let (conv, ext) = layout(g, ConvPass::Forward, 0);
        let w_t = self.filter_ohwi(w, g)?;
        let x_ext = self.extend(x, g, ext)?;
        let xp = x_ext.as_ref().map_or(x.addr(), Allocation::addr);
        self.run_cudnn(
            ConvPass::Forward,
            &conv,
            Operands {
                x: xp,
                w: w_t.addr(),
                y: y.addr(),
            },
        )?;
        self.kernels
            .bias_add(y.addr(), b.addr(), y.numel(), g.c_out)
    }

    /// Input gradient; see [`crate::Backend::conv2d_bwd_data`].
    pub(super) fn conv_backward_data(
        &self,
        dy: &Tensor,
        w: &Tensor,
        g: &Conv2dGeometry,
        dx: &mut Tensor,
    ) -> Result<(), TensorError> {
        const OP: &str = "conv2d_bwd_data";
        self.check_input(OP, dy, &g.output_shape())?;
        self.check_input(OP, w, &g.filter_shape())?;
        self.check_output(OP, dx, &g.input_shape())?;
        self.bind()?;
        let (conv, ext) = layout(g, ConvPass::BackwardData, 0);
        let w_t = self.filter_ohwi(w, g)?;
        let dx_ext = match ext {
            Some(e) => Some(self.scratch(g.n * e.h * e.w * g.c_in * F32)?),
            None => None,
        };
        let xp = dx_ext.as_ref().map_or(dx.addr(), Allocation::addr);
        let ops = Operands {
            x: xp,
            w: w_t.addr(),
            y: dy.addr(),
        };
        self.run_cudnn(ConvPass::BackwardData, &conv, ops)?;
        if let (Some(e), Some(buf)) = (ext, &dx_ext) {
            self.kernels.pad_or_crop(
                false,
                dx.addr(),
                buf.addr(),
                [g.n, g.h, g.w, g.c_in],
                [e.h, e.w],
                [e.top, e.left],
            )?;
        }
        Ok(())
    }

    /// Filter and bias gradients; see [`crate::Backend::conv2d_bwd_filter`].
    pub(super) fn conv_backward_filter(
        &self,
        x: &Tensor,
        dy: &Tensor,
        g: &Conv2dGeometry,
        dw: &mut Tensor,
        db: &mut Tensor,
    ) -> Result<(), TensorError> {
        const OP: &str = "conv2d_bwd_filter";
        self.check_input(OP, x, &g.input_shape())?;
        self.check_input(OP, dy, &g.output_shape())?;
        self.check_output(OP, dw, &g.filter_shape())?;
        self.check_output(OP, db, &[g.c_out].into())?;
        self.bind()?;
        let rows = g.n * g.out_h * g.out_w;
        let partial_bytes = self.kernels.bias_grad_splits(rows) * g.c_out * 8;
        let (conv, ext) = layout(g, ConvPass::BackwardFilter, partial_bytes);
        let x_ext = self.extend(x, g, ext)?;
        let xp = x_ext.as_ref().map_or(x.addr(), Allocation::addr);
        let dw_t = self.scratch(dw.bytes())?;
        let ops = Operands {
            x: xp,
            w: dw_t.addr(),
            y: dy.addr(),
        };
        self.run_cudnn(ConvPass::BackwardFilter, &conv, ops)?;
        drop(x_ext);
        self.kernels.transpose_filter(
            dw_t.addr(),
            dw.addr(),
            g.kh * g.kw,
            g.c_in,
            g.c_out,
            false,
        )?;
        let partial = self.scratch(partial_bytes)?;
        self.kernels
            .bias_grad(dy.addr(), partial.addr(), db.addr(), rows, g.c_out)
    }
}

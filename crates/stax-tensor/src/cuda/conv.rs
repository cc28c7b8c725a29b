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
use super::cudnn::{CudnnConv, Epilogue, Operands};
use super::workspace::Schedule;
use crate::{Conv2dGeometry, ConvPass, Tensor, TensorError, WorkspaceStep};
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

/// What cuDNN computes for `g`, and the extended input if one is needed.
fn layout(g: &Conv2dGeometry) -> (CudnnConv, Option<Extended>) {
    let ph = g.pad_top.min(g.pad_bottom);
    let pw = g.pad_left.min(g.pad_right);
    let ext = (!g.symmetric_padding()).then(|| Extended {
        h: g.h + g.pad_top + g.pad_bottom - 2 * ph,
        w: g.w + g.pad_left + g.pad_right - 2 * pw,
        top: g.pad_top - ph,
        left: g.pad_left - pw,
    });
    let (h, w) = ext.map_or((g.h, g.w), |e| (e.h, e.w));
    let conv = CudnnConv {
        geometry: *g,
        h,
        w,
        pad_h: ph,
        pad_w: pw,
        layout_bytes: 0,
    };
    (
        CudnnConv {
            layout_bytes: layout_bytes(g, &conv),
            ..conv
        },
        ext,
    )
}

/// Bytes held beside cuDNN's workspace during a pass: the OHWI filter (or its gradient)
/// and, for asymmetric padding, the extended input (or its gradient).
fn layout_bytes(g: &Conv2dGeometry, conv: &CudnnConv) -> usize {
    let ext = if g.symmetric_padding() {
        0
    } else {
        g.n * conv.h * conv.w * g.c_in * F32
    };
    g.kh * g.kw * g.c_in * g.c_out * F32 + ext
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

    /// Forward pass; see [`crate::Backend::conv2d`], and with `relu_mask`
    /// [`crate::Backend::conv2d_relu`]. The bias (and the ReLU) run in cuDNN's epilogue where
    /// it fuses them, else as our own passes over `y`; with a fused ReLU the mask is one
    /// read-only pass.
    pub(super) fn conv_forward(
        &self,
        x: &Tensor,
        w: &Tensor,
        b: &Tensor,
        g: &Conv2dGeometry,
        y: &mut Tensor,
        relu_mask: Option<&mut Tensor>,
    ) -> Result<(), TensorError> {
        const OP: &str = "conv2d";
        self.check_input(OP, x, &g.input_shape())?;
        self.check_input(OP, w, &g.filter_shape())?;
        self.check_input(OP, b, &[g.c_out].into())?;
        self.check_output(OP, y, &g.output_shape())?;
        if let Some(m) = &relu_mask {
            self.check_mask(OP, m, y.numel())?;
            m.expect_unique(OP)?;
        }
        self.bind()?;
        let (conv, ext) = layout(g);
        let w_t = self.filter_ohwi(w, g)?;
        let x_ext = self.extend(x, g, ext)?;
        let xp = x_ext.as_ref().map_or(x.addr(), Allocation::addr);
        let ops = Operands {
            x: xp,
            w: w_t.addr(),
            y: y.addr(),
        };
        let epi = Epilogue {
            bias: b.addr(),
            relu: relu_mask.is_some(),
        };
        let fused = if self.fused_epilogues() {
            self.dnn.run_forward(
                &conv,
                self.precision,
                ops,
                epi,
                self.workspace_limit,
                &self.allocator,
            )?
        } else {
            self.run_cudnn(ConvPass::Forward, &conv, ops)?;
            false
        };
        drop((w_t, x_ext));
        if !fused {
            self.kernels
                .bias_add(y.addr(), b.addr(), y.numel(), g.c_out)?;
        }
        match relu_mask {
            Some(m) => self.kernels.relu(y.addr(), m.addr(), y.numel(), !fused),
            None => Ok(()),
        }
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
        let (conv, ext) = layout(g);
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

    /// Filter and bias gradients; see [`crate::Backend::conv2d_bwd_filter`], and with
    /// `relu_mask` [`crate::Backend::conv2d_bwd_filter_relu`] (dy masked in place first).
    ///
    /// The bias gradient runs first, so that with a mask it is fused with the masking (one
    /// pass over dy) where the kernels vectorize; then the filter gradient. The partials are
    /// freed before the rest is allocated ([`Self::conv_workspace_schedule`]).
    pub(super) fn conv_backward_filter(
        &self,
        x: &Tensor,
        dy: &Tensor,
        g: &Conv2dGeometry,
        dw: &mut Tensor,
        db: &mut Tensor,
        relu_mask: Option<&Tensor>,
    ) -> Result<(), TensorError> {
        const OP: &str = "conv2d_bwd_filter";
        self.check_input(OP, x, &g.input_shape())?;
        self.check_input(OP, dy, &g.output_shape())?;
        self.check_output(OP, dw, &g.filter_shape())?;
        self.check_output(OP, db, &[g.c_out].into())?;
        if let Some(m) = relu_mask {
            self.check_mask(OP, m, dy.numel())?;
        }
        self.bind()?;
        let (hw, ci, co) = (g.kh * g.kw, g.c_in, g.c_out);
        let rows = g.n * g.out_h * g.out_w;
        let mut mask = relu_mask.map_or(0, Tensor::addr);
        if mask != 0
            && !(self.fused_epilogues() && self.kernels.bias_grad_vectorizes(co, dy.addr()))
        {
            self.kernels.relu_bwd(dy.addr(), mask, dy.numel())?;
            mask = 0;
        }
        let partial = self.scratch(self.bias_grad_bytes(rows, co))?;
        self.kernels
            .bias_grad(dy.addr(), mask, partial.addr(), db.addr(), rows, co)?;
        drop(partial);
        let (conv, ext) = layout(g);
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
        self.kernels
            .transpose_filter(dw_t.addr(), dw.addr(), hw, ci, co, false)
    }

    /// The workspace one call of `pass` allocates and frees, in order, in steady state (see
    /// [`crate::Backend::workspace_schedule`]), mirroring the three passes above: the OHWI
    /// filter (or its gradient), the extended input for asymmetric padding, cuDNN's workspace,
    /// and for the filter gradient first the bias-gradient partials. If the pass's algorithm
    /// has not been chosen yet, it is chosen now, by timing the candidates on temporary buffers
    /// of the pass's shapes.
    pub(super) fn conv_workspace_schedule(
        &self,
        g: &Conv2dGeometry,
        pass: ConvPass,
    ) -> Result<Vec<WorkspaceStep>, TensorError> {
        let (conv, ext) = layout(g);
        let cudnn = match self.dnn.chosen_workspace(g, self.precision, pass) {
            Some(bytes) => bytes,
            None => self.choose_algorithm(g, pass, &conv)?,
        };
        let filter = g.filter_shape().numel() * F32;
        let ext_bytes = ext.map(|e| g.n * e.h * e.w * g.c_in * F32);
        let mut s = Schedule::default();
        match pass {
            ConvPass::Forward => {
                let f = s.alloc(filter);
                let e = ext_bytes.map(|b| s.alloc(b));
                s.scoped(cudnn);
                s.free(f);
                if let Some(e) = e {
                    s.free(e);
                }
            }
            ConvPass::BackwardData => {
                let f = s.alloc(filter);
                let e = ext_bytes.map(|b| s.alloc(b));
                s.scoped(cudnn);
                if let Some(e) = e {
                    s.free(e);
                }
                s.free(f);
            }
            ConvPass::BackwardFilter => {
                let rows = g.n * g.out_h * g.out_w;
                let p = s.alloc(self.bias_grad_bytes(rows, g.c_out).max(1));
                s.free(p);
                let e = ext_bytes.map(|b| s.alloc(b));
                let d = s.alloc(filter);
                s.scoped(cudnn);
                if let Some(e) = e {
                    s.free(e);
                }
                s.free(d);
            }
        }
        Ok(s.finish())
    }

    /// Chooses the algorithm of `pass` for `conv` by timing the candidates on temporary
    /// buffers of its shapes, then releases them; returns its cuDNN workspace bytes.
    fn choose_algorithm(
        &self,
        g: &Conv2dGeometry,
        pass: ConvPass,
        conv: &CudnnConv,
    ) -> Result<usize, TensorError> {
        self.bind()?;
        let x = self.scratch(g.n * conv.h * conv.w * g.c_in * F32)?;
        let w = self.scratch(g.filter_shape().numel() * F32)?;
        let y = self.scratch(g.output_shape().numel() * F32)?;
        let ops = Operands {
            x: x.addr(),
            w: w.addr(),
            y: y.addr(),
        };
        let limit = self.workspace_limit;
        let bytes = self
            .dnn
            .prepare(pass, conv, self.precision, ops, limit, &self.allocator)?;
        drop((x, w, y));
        super::cudnn::release_search(&self.allocator)?;
        Ok(bytes)
    }
}

//! The convolution passes of [`CudaBackend`]: layout changes around cuDNN (the poolings are in
//! `pool.rs`, the direct kernels of convs with few taps in `direct.rs`).
//!
//! Every pass runs in its operands' dtype: f32, or bf16 and f16 with f32 accumulation (cuDNN's
//! pseudo configurations, see `cudnn.rs`); the kernel copy, the padded input, the bias and its
//! gradient (summed in f64, rounded once) are in that dtype too.
//!
//! cuDNN reads NHWC tensors with KRSC (= OHWI) filters and NCHW tensors with KCRS (= OIHW)
//! filters. A kernel stored otherwise (HWIO, OIHW beside NHWC tensors, or a transposed
//! convolution's kernel, see [`crate::FilterLayout`]) is permuted into a workspace buffer (and
//! the filter gradient back); an OIHW kernel of an NCHW convolution is read as it is. cuDNN wants
//! symmetric padding: with padding `(top, bottom)` it is given `min(top, bottom)` on both sides
//! of an input extended by explicit zero rows (`top - min` above, `bottom - min` below; the same
//! for columns), a copy made only when the padding is asymmetric (SAME with stride 2 on an even
//! size, or an even kernel). A bf16 or f16 NHWC input's channels are padded with zeros to a
//! multiple of 8 in that copy, and its kernel's in the kernel copy ([`cudnn_channels`]): cuDNN's
//! tensor-core kernels need it (the filter gradient of the padded taps is dropped). Every temporary is a step of the pass's workspace schedule
//! ([`CudaBackend::conv_schedule`], taken through a [`Scratch`]) and is freed when the call
//! returns (in stream order, so reuse is safe).

use super::CudaBackend;
use super::cudnn::{CudnnConv, Epilogue, Operands};
use super::kernels::OHWI;
use crate::backend::{Conv2d, Conv2dBwdData, Conv2dBwdFilter, Pool2d, Pool2dBwd, Scratch};
use crate::{
    Activation, Checked, Conv2dGeometry, ConvOps, ConvPass, DType, FilterLayout, Layout, Saves,
    TensorError,
};

/// An input extended with explicit zeros: its size (height, width, channels) and where the
/// real input sits in it (from channel 0).
#[derive(Debug, Clone, Copy)]
pub(super) struct Extended {
    pub h: usize,
    pub w: usize,
    pub c: usize,
    pub top: usize,
    pub left: usize,
}

/// The input channels cuDNN is given for `g` in `dtype`: a bf16 or f16 NHWC input's channels
/// padded with zeros to a multiple of 8 (16 bytes), else `g.c_in`. cuDNN's tensor-core kernels
/// need that alignment (NVIDIA's convolution performance guide asks for channels divisible by
/// 8 in 16-bit types; XLA's `CudnnPadForConvolutions` pads the same way): without it the
/// seed's 3-channel conv1 ran cuDNN's FFMA kernels in bf16, 1.59 ms forward and 4.06 ms filter
/// gradient (ncu, H200, 2026-12-01).
pub(super) fn cudnn_channels(g: &Conv2dGeometry, dtype: DType) -> usize {
    match dtype.size_bytes() == 2 && g.layout == Layout::Nhwc {
        true => g.c_in.next_multiple_of(8),
        false => g.c_in,
    }
}

/// What cuDNN computes for `g` in `dtype`, and the extended input if one is needed: for
/// asymmetric padding, or channels padded by [`cudnn_channels`].
pub(super) fn layout(g: &Conv2dGeometry, dtype: DType) -> (CudnnConv, Option<Extended>) {
    let ph = g.pad_top.min(g.pad_bottom);
    let pw = g.pad_left.min(g.pad_right);
    let c = cudnn_channels(g, dtype);
    let ext = (!g.symmetric_padding() || c != g.c_in).then(|| Extended {
        h: g.h + g.pad_top + g.pad_bottom - 2 * ph,
        w: g.w + g.pad_left + g.pad_right - 2 * pw,
        c,
        top: g.pad_top - ph,
        left: g.pad_left - pw,
    });
    let (h, w) = ext.map_or((g.h, g.w), |e| (e.h, e.w));
    let conv = CudnnConv {
        geometry: *g,
        dtype,
        h,
        w,
        c,
        pad_h: ph,
        pad_w: pw,
        layout_bytes: filter_copy_bytes(g, dtype) + ext.map_or(0, |e| extended_bytes(g, &e, dtype)),
    };
    (conv, ext)
}

/// Bytes of the extended input (or its gradient), in `dtype`.
pub(super) fn extended_bytes(g: &Conv2dGeometry, e: &Extended, dtype: DType) -> usize {
    g.n * e.h * e.w * e.c * dtype.size_bytes()
}

/// The code of the filter layout cuDNN reads beside `g`'s tensors (OHWI or OIHW).
fn cudnn_filter(g: &Conv2dGeometry) -> i32 {
    match g.layout {
        Layout::Nhwc => OHWI,
        Layout::Nchw => FilterLayout::Oihw.code(),
    }
}

/// Bytes of the kernel's copy in cuDNN's layout (with [`cudnn_channels`] input channels), in
/// `dtype`: none when it is stored so already.
pub(super) fn filter_copy_bytes(g: &Conv2dGeometry, dtype: DType) -> usize {
    let c = cudnn_channels(g, dtype);
    if cudnn_filter(g) == g.filter.code() && c == g.c_in {
        0
    } else {
        g.kh * g.kw * c * g.c_out * dtype.size_bytes()
    }
}

/// `g`'s input and its extension `e` as the NHWC images `pad_or_crop` copies between: NCHW
/// `[n, c, h, w]` is `[n · c, h, w, 1]` (its channels are never padded).
fn pad_dims(g: &Conv2dGeometry, e: &Extended) -> ([usize; 4], [usize; 3]) {
    match g.layout {
        Layout::Nhwc => ([g.n, g.h, g.w, g.c_in], [e.h, e.w, e.c]),
        Layout::Nchw => ([g.n * g.c_in, g.h, g.w, 1], [e.h, e.w, 1]),
    }
}

/// Whether the filter gradient of `g` is one cuBLAS GEMM instead of a cuDNN pass: a 1x1
/// kernel, stride 1, no padding, an NHWC input and an HWIO kernel, where `dW [c_in, c_out] =
/// xᵀ · dy` over the `n·h·w` positions (at most `i32::MAX` of them, cuBLAS's limit). For
/// ResNet-50's 1x1 convs in TF32 cuDNN's timed search picks its FFMA `wgrad_alg0` kernels
/// (about 0.8 ms each at batch 128 on the H200, measured with ncu, 2026-12-01); a
/// tensor-core GEMM runs at about the bandwidth of reading x and dy.
pub(super) fn filter_grad_is_gemm(g: &Conv2dGeometry) -> bool {
    (g.kh, g.kw, g.stride_h, g.stride_w) == (1, 1, 1, 1)
        && (g.pad_top, g.pad_bottom, g.pad_left, g.pad_right) == (0, 0, 0, 0)
        && g.layout == Layout::Nhwc
        && g.filter == FilterLayout::Hwio
        && g.n * g.h * g.w <= i32::MAX as usize
}

/// The buffers of one pass taken from its schedule: the kernel copy when the kernel is not
/// stored as cuDNN reads it, the extended input when the padding is asymmetric, and cuDNN's
/// workspace when it has one (in the schedule's order).
struct PassBuffers {
    filter: Option<usize>,
    ext: Option<usize>,
    cudnn: Option<usize>,
}

impl CudaBackend {
    /// Runs `pass` of `conv` with the buffers of `ops` and the workspace in `ws[i]`.
    fn run_cudnn(
        &self,
        pass: ConvPass,
        conv: &CudnnConv,
        ops: Operands,
        ws: (&Scratch, Option<usize>),
    ) -> Result<(), TensorError> {
        let workspace = ws.1.and_then(|i| ws.0.allocation(i));
        let key = (pass, conv, self.precision);
        self.dnn.run(key, ops, workspace, &self.kernels)
    }

    /// The extended input of an asymmetrically padded conv (`ext`) in `dtype`, the schedule's
    /// next allocation, with `pad_from` (the input, if given) padded into it; `None` without
    /// one.
    fn extended_input(
        &self,
        ws: &mut Scratch,
        (g, dtype): (&Conv2dGeometry, DType),
        ext: Option<Extended>,
        pad_from: Option<u64>,
    ) -> Result<Option<usize>, TensorError> {
        let Some(e) = ext else {
            return Ok(None);
        };
        let i = ws.alloc()?;
        if let Some(x) = pad_from {
            let (small, big) = pad_dims(g, &e);
            let offset = [e.top, e.left];
            self.kernels
                .pad_or_crop(dtype, true, x, ws.addr(i), small, big, offset)?;
        }
        Ok(Some(i))
    }

    /// The kernel copy (when cuDNN cannot read the stored kernel), then the extended input
    /// (pad x into it when given), then cuDNN's workspace: the schedule's allocations, in
    /// order.
    fn pass_buffers(
        &self,
        ws: &mut Scratch,
        (g, dtype): (&Conv2dGeometry, DType),
        ext: Option<Extended>,
        pad_from: Option<u64>,
        pass: ConvPass,
    ) -> Result<PassBuffers, TensorError> {
        let filter = (filter_copy_bytes(g, dtype) > 0)
            .then(|| ws.alloc())
            .transpose()?;
        let ext_i = self.extended_input(ws, (g, dtype), ext, pad_from)?;
        let cudnn = match self.cudnn_workspace(g, dtype, pass)? {
            0 => None,
            _ => Some(ws.alloc()?),
        };
        Ok(PassBuffers {
            filter,
            ext: ext_i,
            cudnn,
        })
    }

    /// The kernel as cuDNN reads it: `w` itself, or its copy in buffer `copy` (made here;
    /// zeros in the taps of padded input channels).
    fn cudnn_kernel(
        &self,
        ws: &Scratch,
        (g, dtype): (&Conv2dGeometry, DType),
        copy: Option<usize>,
        w: u64,
    ) -> Result<u64, TensorError> {
        let Some(i) = copy else {
            return Ok(w);
        };
        let (dims, c) = ((g.kh, g.kw, g.c_in, g.c_out), cudnn_channels(g, dtype));
        let codes = (g.filter.code(), cudnn_filter(g));
        if c != g.c_in {
            self.kernels
                .zero(ws.addr(i), dtype, g.kh * g.kw * c * g.c_out)?;
        }
        let addrs = (w, ws.addr(i));
        self.kernels
            .permute_filter(dtype, addrs, dims, codes, (g.c_in, c))?;
        Ok(ws.addr(i))
    }

    /// The bias (of `y`'s dtype) added to `y` by our own kernels, along `g`'s channel axis.
    pub(super) fn add_bias(
        &self,
        g: &Conv2dGeometry,
        y: &crate::Tensor,
        b: u64,
    ) -> Result<(), TensorError> {
        let dtype = y.dtype();
        match g.layout {
            Layout::Nhwc => self
                .kernels
                .bias_add(dtype, y.addr(), b, y.numel(), g.c_out),
            Layout::Nchw => self
                .kernels
                .channel_bias_add(dtype, &g.output_channels(), y.addr(), b),
        }
    }

    /// The forward pass (see [`crate::ops::conv2d`]). The bias (and a ReLU) run in cuDNN's
    /// epilogue where it fuses them, else as our own passes over `y`; with a fused ReLU the
    /// mask is one read-only pass.
    fn conv_forward(&self, c: Conv2d<'_>) -> Result<(), TensorError> {
        const OP: &str = "conv2d";
        let Conv2d {
            g,
            x,
            w,
            b,
            y,
            act,
            aux,
        } = c;
        let (pass, dtype) = (ConvPass::Forward, x.dtype());
        let (conv, ext) = layout(&g, dtype);
        let bias = b.is_some();
        let schedule = self.conv_schedule(&g, dtype, pass, bias)?;
        let mut ws = Scratch::new(OP, &self.allocator, schedule);
        let bufs = self.pass_buffers(&mut ws, (&g, dtype), ext, Some(x.addr()), pass)?;
        let ops = Operands {
            x: bufs.ext.map_or(x.addr(), |i| ws.addr(i)),
            w: self.cudnn_kernel(&ws, (&g, dtype), bufs.filter, w.addr())?,
            y: y.addr(),
        };
        let relu = act == Some(Activation::Relu);
        let fused = match b {
            Some(b) if self.fused_epilogues() => {
                let epi = Epilogue {
                    bias: b.addr(),
                    relu,
                };
                let workspace = bufs.cudnn.and_then(|i| ws.allocation(i));
                let key = (&conv, self.precision);
                self.dnn
                    .run_forward(key, ops, epi, workspace, &self.kernels)?
            }
            _ => {
                self.run_cudnn(pass, &conv, ops, (&ws, bufs.cudnn))?;
                false
            }
        };
        for i in [bufs.cudnn, bufs.filter, bufs.ext].into_iter().flatten() {
            ws.free(i)?;
        }
        ws.finish()?;
        if let (Some(b), false) = (b, fused) {
            self.add_bias(&g, y, b.addr())?;
        }
        let mask = aux.map_or(0, |m| m.addr());
        match act {
            // cuDNN applied a fused ReLU: the mask is one read-only pass over the output (in
            // bf16 and f16 too: the rounded output is > 0 exactly where the CPU's ReLU of the
            // rounded pre-activation keeps it)
            Some(Activation::Relu) if fused && mask == 0 => Ok(()),
            Some(Activation::Relu) => self
                .kernels
                .relu(dtype, y.addr(), (mask, y.numel()), !fused),
            Some(act) => self.activate(act, mask, y),
            None => Ok(()),
        }
    }

    /// Input gradient (see [`crate::ops::conv2d_bwd_data`]).
    fn conv_backward_data(&self, c: Conv2dBwdData<'_>) -> Result<(), TensorError> {
        const OP: &str = "conv2d_bwd_data";
        let Conv2dBwdData { g, dy, w, dx } = c;
        self.bind()?;
        let (pass, dtype) = (ConvPass::BackwardData, dy.dtype());
        self.calibrate_conv((&g, dtype, pass), false)?;
        let (conv, ext) = layout(&g, dtype);
        let schedule = self.conv_schedule(&g, dtype, pass, false)?;
        let mut ws = Scratch::new(OP, &self.allocator, schedule);
        let bufs = self.pass_buffers(&mut ws, (&g, dtype), ext, None, pass)?;
        let ops = Operands {
            x: bufs.ext.map_or(dx.addr(), |i| ws.addr(i)),
            w: self.cudnn_kernel(&ws, (&g, dtype), bufs.filter, w.addr())?,
            y: dy.addr(),
        };
        self.run_cudnn(pass, &conv, ops, (&ws, bufs.cudnn))?;
        if let Some(i) = bufs.cudnn {
            ws.free(i)?;
        }
        if let (Some(e), Some(i)) = (ext, bufs.ext) {
            let (small, big) = pad_dims(&g, &e);
            let offset = [e.top, e.left];
            self.kernels
                .pad_or_crop(dtype, false, dx.addr(), ws.addr(i), small, big, offset)?;
            ws.free(i)?;
        }
        if let Some(i) = bufs.filter {
            ws.free(i)?;
        }
        ws.finish()
    }

    /// The bias gradient `db` of `dy` (both of `dtype`; summed in f64 through the partials
    /// buffer `partial`, rounded once); with `mask` (NHWC only, where the kernels vectorize),
    /// `dy` is masked by the ReLU backward in the same pass.
    fn conv_bias_grad(
        &self,
        (g, dtype): (&Conv2dGeometry, DType),
        (dy, mask): (u64, u64),
        partial: u64,
        db: u64,
    ) -> Result<(), TensorError> {
        let ch = g.output_channels();
        match g.layout {
            Layout::Nhwc => self
                .kernels
                .bias_grad(dtype, dy, mask, partial, db, ch.outer, ch.c),
            Layout::Nchw => {
                let moments = (dy, 0, 0, 0);
                let splits = self.kernels.channel_moments(dtype, &ch, moments, partial)?;
                self.kernels
                    .channel_sum_finish(dtype, partial, splits, ch.c, db)
            }
        }
    }

    /// Filter and bias gradients (see [`crate::ops::conv2d_bwd_filter`]).
    ///
    /// The bias gradient runs first, so that with a ReLU it is fused with the masking (one
    /// pass over dy) where the kernels vectorize; then the filter gradient. The partials are
    /// freed before the rest is allocated ([`CudaBackend::conv_schedule`]).
    fn conv_backward_filter(&self, c: Conv2dBwdFilter<'_>) -> Result<(), TensorError> {
        const OP: &str = "conv2d_bwd_filter";
        let Conv2dBwdFilter {
            g,
            x,
            dy,
            dw,
            db,
            act,
            keep_dy: _,
        } = c;
        let (pass, dtype) = (ConvPass::BackwardFilter, x.dtype());
        let gemm = filter_grad_is_gemm(&g);
        let mut mask = 0;
        let fuse_mask = db.is_some()
            && g.layout == Layout::Nhwc
            && self.fused_epilogues()
            && self.kernels.bias_grad_vectorizes(g.c_out, dy.addr());
        match act {
            Some((Activation::Relu, m)) if fuse_mask => mask = m.addr(),
            Some((a, saved)) => self.activate_bwd(a, saved, dy)?,
            None => {}
        }
        let bias = db.is_some();
        let schedule = self.conv_schedule(&g, dtype, pass, bias)?;
        let mut ws = Scratch::new(OP, &self.allocator, schedule);
        if let Some(db) = db {
            let partial = ws.alloc()?;
            let (d, p) = ((dy.addr(), mask), ws.addr(partial));
            self.conv_bias_grad((&g, dtype), d, p, db.addr())?;
            ws.free(partial)?;
        }
        let addrs = (x.addr(), dy.addr(), dw.addr());
        if gemm {
            return self.filter_grad_gemm((&g, dtype), addrs, ws);
        }
        if self.filter_grad_is_im2col(&g, dtype) {
            return self.filter_grad_im2col((&g, dtype), addrs, ws);
        }
        let (conv, ext) = layout(&g, dtype);
        let ext_i = self.extended_input(&mut ws, (&g, dtype), ext, Some(x.addr()))?;
        let filter = (filter_copy_bytes(&g, dtype) > 0)
            .then(|| ws.alloc())
            .transpose()?;
        let cudnn = match self.cudnn_workspace(&g, dtype, pass)? {
            0 => None,
            _ => Some(ws.alloc()?),
        };
        let ops = Operands {
            x: ext_i.map_or(x.addr(), |i| ws.addr(i)),
            w: filter.map_or(dw.addr(), |i| ws.addr(i)),
            y: dy.addr(),
        };
        self.run_cudnn(pass, &conv, ops, (&ws, cudnn))?;
        for i in [cudnn, ext_i].into_iter().flatten() {
            ws.free(i)?;
        }
        if let Some(i) = filter {
            let dims = (g.kh, g.kw, g.c_in, g.c_out);
            let codes = (cudnn_filter(&g), g.filter.code());
            let channels = (cudnn_channels(&g, dtype), g.c_in);
            self.kernels
                .permute_filter(dtype, (ws.addr(i), dw.addr()), dims, codes, channels)?;
            ws.free(i)?;
        }
        ws.finish()
    }

    /// `dw = xᵀ · dy` in `dtype` (f32 accumulation) for a conv of [`filter_grad_is_gemm`],
    /// with cuBLAS's workspace the schedule's next block.
    fn filter_grad_gemm(
        &self,
        (g, dtype): (&Conv2dGeometry, DType),
        (x, dy, dw): (u64, u64, u64),
        mut ws: Scratch,
    ) -> Result<(), TensorError> {
        let positions = g.n * g.h * g.w;
        let bytes = self.matmul_bytes(g.c_in, g.c_out, positions);
        let i = (bytes > 0).then(|| ws.alloc()).transpose()?;
        let gemm = super::cublas::Gemm::new(g.c_in, g.c_out, positions, true, false);
        let at = i.map_or(0, |i| ws.addr(i));
        self.blas
            .gemm(gemm, (dtype, dtype), (x, dy, dw), at, bytes)?;
        if let Some(i) = i {
            ws.free(i)?;
        }
        ws.finish()
    }

    /// An activation in place on `y` (its mask to `mask`, 0 for none), by our kernels.
    pub(super) fn activate(
        &self,
        act: Activation,
        mask: u64,
        y: &crate::Tensor,
    ) -> Result<(), TensorError> {
        let (n, code, alpha) = (y.numel(), act.code(), act.alpha());
        if act == Activation::Relu {
            return self.kernels.relu(y.dtype(), y.addr(), (mask, n), true);
        }
        self.kernels
            .unary(y.dtype(), y.addr(), mask, n, code, alpha)
    }

    /// An activation's backward pass in place on `dy`, from what it saved.
    pub(super) fn activate_bwd(
        &self,
        act: Activation,
        saved: &crate::Tensor,
        dy: &crate::Tensor,
    ) -> Result<(), TensorError> {
        let (n, code, alpha) = (dy.numel(), act.code(), act.alpha());
        let (s, m) = match act.saves() {
            Saves::Mask => (0, saved.addr()),
            Saves::Output | Saves::Input => (saved.addr(), 0),
        };
        if act == Activation::Relu {
            return self.kernels.relu_bwd(dy.dtype(), dy.addr(), m, n);
        }
        self.kernels
            .unary_bwd(dy.dtype(), dy.addr(), s, m, n, code, alpha)
    }

    /// Whether `pass` of `g` in `dtype` runs the direct kernels, once it is calibrated here if
    /// it was not yet: calibration may hand a pass to them, so choose first, then dispatch.
    fn runs_direct(
        &self,
        g: &Conv2dGeometry,
        dtype: DType,
        pass: ConvPass,
    ) -> Result<bool, TensorError> {
        self.bind()?;
        self.calibrate_conv((g, dtype, pass), false)?;
        Ok(self.conv_is_direct(g, dtype, pass))
    }
}

impl ConvOps for CudaBackend {
    fn conv2d(&self, c: Checked<Conv2d<'_>>) -> Result<(), TensorError> {
        let c = c.into_inner();
        match self.runs_direct(&c.g, c.x.dtype(), ConvPass::Forward)? {
            true => self.direct_forward(c),
            false => self.conv_forward(c),
        }
    }

    fn conv2d_bwd_data(&self, c: Checked<Conv2dBwdData<'_>>) -> Result<(), TensorError> {
        let c = c.into_inner();
        match self.runs_direct(&c.g, c.dy.dtype(), ConvPass::BackwardData)? {
            true => self.direct_backward_data(c),
            false => self.conv_backward_data(c),
        }
    }

    fn conv2d_bwd_filter(&self, c: Checked<Conv2dBwdFilter<'_>>) -> Result<(), TensorError> {
        let c = c.into_inner();
        match self.runs_direct(&c.g, c.x.dtype(), ConvPass::BackwardFilter)? {
            true => self.direct_filter_grad(c),
            false => self.conv_backward_filter(c),
        }
    }

    fn pool2d(&self, c: Checked<Pool2d<'_>>) -> Result<(), TensorError> {
        self.pool_forward(c.into_inner())
    }

    fn pool2d_bwd(&self, c: Checked<Pool2dBwd<'_>>) -> Result<(), TensorError> {
        self.pool_backward(c.into_inner())
    }
}

//! The filter gradient of a bf16 or f16 convolution with few input channels as im2col and
//! GEMMs: per image `b`, `P_b [taps, c_out] = col_bᵀ · dy_b` over its output positions, `col_b`
//! its im2col matrix (`kernels/layout.cu`'s `im2col_nhwc_{dtype}`, taps in HWIO order), made for
//! a chunk of images at a time and multiplied by one strided batched GEMM (one product per
//! image, so the long reduction over positions is spread over as many GEMMs as images), then
//! `dW = Σ_b P_b` by the bias-gradient kernels (f64 sums of the f32 partials), rounded once into
//! `dw`.
//!
//! cuDNN's legacy algorithms have no tensor-core filter gradient for such inputs: the seed's
//! conv1 (3 channels, padded to 8 for the forward pass) ran its FFMA `wgrad_alg0` kernel, 4.06
//! ms in bf16 and 5.80 ms with the channels padded (ncu, H200, 2026-12-01). f32 stays on
//! cuDNN: one GEMM over all positions (this path's first form) ran the seed's TF32 conv1
//! filter gradient in 2.90 ms against cuDNN's 1.2 ms (`step_profile`, device call 4).

use super::{CudaBackend, cublas::Gemm};
use crate::backend::Scratch;
use crate::{Conv2dGeometry, DType, FilterLayout, Layout, TensorError};

/// Columns of the im2col matrix: the taps, padded to a multiple of 8 (16-byte aligned rows).
fn columns(g: &Conv2dGeometry) -> usize {
    (g.kh * g.kw * g.c_in).next_multiple_of(8)
}

impl CudaBackend {
    /// Whether the filter gradient of `g` in `dtype` takes this path: bf16 or f16, an NHWC
    /// input with an HWIO kernel, fewer than 8 input channels (a network's first layer on RGB
    /// images), at most 256 taps (`kh · kw · c_in`), a non-empty output, and one image's im2col
    /// matrix within half the workspace limit (positions below 2^31).
    pub(super) fn filter_grad_is_im2col(&self, g: &Conv2dGeometry, dtype: DType) -> bool {
        let image = g.out_h * g.out_w;
        dtype.size_bytes() == 2
            && g.layout == Layout::Nhwc
            && g.filter == FilterLayout::Hwio
            && g.c_in < 8
            && g.kh * g.kw * g.c_in <= 256
            && g.n * image > 0
            && g.n * image <= i32::MAX as usize
            && image * columns(g) * 2 <= self.workspace_limit / 2
    }

    /// Images per im2col chunk: as many as fit in half the workspace limit.
    fn im2col_images(&self, g: &Conv2dGeometry, dtype: DType) -> usize {
        let image = g.out_h * g.out_w * columns(g) * dtype.size_bytes();
        (self.workspace_limit / 2 / image).clamp(1, g.n)
    }

    /// The workspace of [`Self::filter_grad_im2col`], in its order: the per-image f32 partials
    /// `[n, columns · c_out]`, the im2col chunk, cuBLAS's workspace (freed at once), the chunk
    /// freed, the bias-gradient kernels' f64 partials, the f32 sum `[columns · c_out]`, then
    /// those two and the per-image partials freed.
    pub(super) fn im2col_schedule(
        &self,
        g: &Conv2dGeometry,
        dtype: DType,
        s: &mut super::workspace::Schedule,
    ) {
        let (kp, images) = (columns(g), self.im2col_images(g, dtype));
        let (image, cols) = (g.out_h * g.out_w, kp * g.c_out);
        let partials = s.alloc(g.n * cols * 4);
        let col = s.alloc(images * image * kp * dtype.size_bytes());
        s.scoped(self.matmul_bytes(kp, g.c_out, image));
        s.free(col);
        let sums = s.alloc(self.bias_grad_bytes(g.n, cols));
        let acc = s.alloc(cols * 4);
        s.free(sums);
        s.free(acc);
        s.free(partials);
    }

    /// `dw` (HWIO, `dtype`) of `g` from its input `x` and output gradient `dy` (NHWC, `dtype`),
    /// see the module docs; the workspace is the schedule's next blocks
    /// ([`Self::im2col_schedule`]).
    pub(super) fn filter_grad_im2col(
        &self,
        (g, dtype): (&Conv2dGeometry, DType),
        (x, dy, dw): (u64, u64, u64),
        mut ws: Scratch,
    ) -> Result<(), TensorError> {
        let (kp, images) = (columns(g), self.im2col_images(g, dtype));
        let (image, cols, size) = (g.out_h * g.out_w, kp * g.c_out, dtype.size_bytes());
        let (partials, col) = (ws.alloc()?, ws.alloc()?);
        let blas_bytes = self.matmul_bytes(kp, g.c_out, image);
        let blas = (blas_bytes > 0).then(|| ws.alloc()).transpose()?;
        let blas_addr = blas.map_or(0, |i| ws.addr(i));
        for b0 in (0..g.n).step_by(images) {
            let count = images.min(g.n - b0);
            let rows = (b0 * image, count * image);
            self.kernels
                .im2col((g, dtype), (x, ws.addr(col)), (rows.0, rows.1, kp))?;
            // partials[b] [kp, c_out] = col_bᵀ · dy_b for the chunk's images
            let mut gemm = Gemm::new(kp, g.c_out, image, true, false);
            gemm.batch = (count, [image * kp, image * g.c_out, cols]);
            let dy_b = dy + (rows.0 * g.c_out * size) as u64;
            let out = ws.addr(partials) + (b0 * cols * 4) as u64;
            let operands = (ws.addr(col), dy_b, out);
            self.blas
                .gemm(gemm, (dtype, DType::F32), operands, blas_addr, blas_bytes)?;
        }
        if let Some(i) = blas {
            ws.free(i)?;
        }
        ws.free(col)?;
        let (sums, acc) = (ws.alloc()?, ws.alloc()?);
        let (p, s, a) = (ws.addr(partials), ws.addr(sums), ws.addr(acc));
        self.kernels.bias_grad(DType::F32, p, 0, s, a, g.n, cols)?;
        ws.free(sums)?;
        // the first kh·kw·c_in rows of the sum are dw in HWIO order
        let n = g.kh * g.kw * g.c_in * g.c_out;
        self.kernels.cast((DType::F32, dtype), a, dw, n)?;
        ws.free(acc)?;
        ws.free(partials)?;
        ws.finish()
    }
}

//! The filter gradient of a convolution with few input channels as im2col and a GEMM: `dW
//! [taps, c_out] = colᵀ · dy` over the output positions, `col` the im2col matrix (`kernels/
//! layout.cu`'s `im2col_nhwc_{dtype}`, taps in HWIO order), made and multiplied chunk by chunk
//! of positions into one f32 accumulator (cuBLAS's beta = 1 after the first chunk), then
//! rounded once into `dw`.
//!
//! cuDNN's legacy algorithms have no tensor-core filter gradient for such inputs: the seed's
//! conv1 (3 channels, padded to 8 in bf16) ran its FFMA `wgrad_alg0` kernel, 4.06 ms in bf16
//! and 5.80 ms with the channels padded (ncu, H200, 2026-12-01). The GEMM runs on the tensor
//! cores at about the bandwidth of reading `dy`.

use super::{CudaBackend, cublas::Gemm};
use crate::backend::Scratch;
use crate::{Conv2dGeometry, DType, FilterLayout, Layout, TensorError};

/// Whether the filter gradient of `g` in `dtype` is im2col and a GEMM: an NHWC input with an
/// HWIO kernel and input channels narrower than 16 bytes (fewer than 4 in f32, 8 in bf16/f16:
/// a network's first layer on RGB images), at most 256 taps (`kh · kw · c_in`), at most
/// `i32::MAX` output positions (cuBLAS's limit).
pub(super) fn filter_grad_is_im2col(g: &Conv2dGeometry, dtype: DType) -> bool {
    g.layout == Layout::Nhwc
        && g.filter == FilterLayout::Hwio
        && g.c_in * dtype.size_bytes() < 16
        && g.kh * g.kw * g.c_in <= 256
        && g.n * g.out_h * g.out_w <= i32::MAX as usize
}

/// Columns of the im2col matrix: the taps, padded to a multiple of 8 (16-byte aligned rows).
fn columns(g: &Conv2dGeometry) -> usize {
    (g.kh * g.kw * g.c_in).next_multiple_of(8)
}

impl CudaBackend {
    /// Output positions per im2col chunk: the chunk takes at most half the workspace limit.
    fn im2col_rows(&self, g: &Conv2dGeometry, dtype: DType) -> usize {
        let positions = g.n * g.out_h * g.out_w;
        let row = columns(g) * dtype.size_bytes();
        (self.workspace_limit / 2 / row).clamp(1, positions.max(1))
    }

    /// The workspace of [`Self::filter_grad_im2col`], in its order: the f32 accumulator
    /// `[columns, c_out]`, the im2col chunk, cuBLAS's workspace (freed at once), then the chunk
    /// and the accumulator freed.
    pub(super) fn im2col_schedule(
        &self,
        g: &Conv2dGeometry,
        dtype: DType,
        s: &mut super::workspace::Schedule,
    ) {
        let (kp, rows) = (columns(g), self.im2col_rows(g, dtype));
        let acc = s.alloc(kp * g.c_out * 4);
        let col = s.alloc(rows * kp * dtype.size_bytes());
        s.scoped(self.matmul_bytes(kp, g.c_out, rows));
        s.free(col);
        s.free(acc);
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
        let (kp, rows, taps) = (columns(g), self.im2col_rows(g, dtype), g.kh * g.kw * g.c_in);
        let positions = g.n * g.out_h * g.out_w;
        let (acc, col) = (ws.alloc()?, ws.alloc()?);
        let blas_bytes = self.matmul_bytes(kp, g.c_out, rows);
        let blas = (blas_bytes > 0).then(|| ws.alloc()).transpose()?;
        let blas_addr = blas.map_or(0, |i| ws.addr(i));
        if positions == 0 {
            self.kernels.zero(ws.addr(acc), DType::F32, kp * g.c_out)?;
        }
        for (i, p0) in (0..positions).step_by(rows).enumerate() {
            let r = rows.min(positions - p0);
            self.kernels
                .im2col((g, dtype), (x, ws.addr(col)), (p0, r, kp))?;
            // acc [kp, c_out] (+)= col[r, kp]ᵀ · dy[p0 .. p0 + r, c_out]
            let mut gemm = Gemm::new(kp, g.c_out, r, true, false);
            gemm.accumulate = i > 0;
            let dy_rows = dy + (p0 * g.c_out * dtype.size_bytes()) as u64;
            let operands = (ws.addr(col), dy_rows, ws.addr(acc));
            self.blas
                .gemm(gemm, (dtype, DType::F32), operands, blas_addr, blas_bytes)?;
        }
        if let Some(i) = blas {
            ws.free(i)?;
        }
        ws.free(col)?;
        // the first `taps` rows of acc are dw in HWIO order
        let n = taps * g.c_out;
        match dtype {
            DType::F32 => {
                self.kernels
                    .copy_block(dtype, ws.addr(acc), dw, (1, n, (n, 0), (n, 0)))?
            }
            _ => self
                .kernels
                .cast((DType::F32, dtype), ws.addr(acc), dw, n)?,
        }
        ws.free(acc)?;
        ws.finish()
    }
}

//! A dense layer's backward pass with Adam on its weight, chunk by chunk, on the device (see
//! [`crate::ops::dense_adam`]): per chunk of the weight's rows two cuBLAS GEMMs on strided
//! views (`dw_chunk = x[:, chunk]ᵀ · dy` into the workspace, `dx[:, chunk] = dy · w_chunkᵀ`)
//! and the Adam kernel on the chunk. A chunk holds a quarter of the workspace limit of
//! gradient (64 MiB by default).

use super::{CudaBackend, cublas::Gemm};
use crate::backend::{Call, DenseAdam, DenseDx, Scratch};
use crate::{Backend, DType, OpDesc, TensorError, dense_chunk_rows};

const OP: &str = "dense_adam";

impl CudaBackend {
    /// Rows of the weight per chunk: a quarter of the workspace limit of gradient.
    pub(super) fn dense_chunk_rows(&self, k: usize, n: usize) -> usize {
        dense_chunk_rows(k, n, self.workspace_limit / 4)
    }

    /// See the module docs: the chunk of `dw`, then cuBLAS's workspace, are taken before
    /// anything is written.
    pub(super) fn dense_adam_chunks(&self, c: DenseAdam<'_>) -> Result<(), TensorError> {
        let desc = c.desc();
        let OpDesc::DenseAdam { m, n, k } = desc else {
            unreachable!("DenseAdam describes itself as OpDesc::DenseAdam")
        };
        self.bind()?;
        let mut ws = Scratch::new(OP, &self.allocator, self.workspace_schedule(&desc)?);
        let dx = match c.dx {
            DenseDx::Skip => None,
            DenseDx::InPlace => Some(c.x.addr()),
            DenseDx::Into(ref t) => Some(t.addr()),
        };
        if k == 0 || n == 0 {
            // no weight to update; dx = dy · wᵀ over no features is zero
            if let Some(d) = dx.filter(|_| m * k > 0) {
                self.kernels.fill_u32(d, 0, m * k)?;
            }
            return ws.finish();
        }
        let g = ws.alloc()?;
        let blas_bytes = self.matmul_bytes(m.max(1), n, k);
        let blas = (blas_bytes > 0).then(|| ws.alloc()).transpose()?;
        let (x, dy, g_addr, blas_addr) = (
            c.x.addr(),
            c.dy.addr(),
            ws.addr(g),
            blas.map_or(0, |i| ws.addr(i)),
        );
        let (w, mu, nu) = (c.w.addr(), c.mu.addr(), c.nu.addr());
        let rows = self.dense_chunk_rows(k, n);
        for r0 in (0..k).step_by(rows) {
            let r = rows.min(k - r0);
            let (col, off) = (4 * r0 as u64, 4 * (r0 * n) as u64);
            if m == 0 {
                self.kernels.fill_u32(g_addr, 0, r * n)?;
            } else {
                // dw_chunk [r, n] = x[:, r0..r0 + r]ᵀ · dy; x's rows are k apart
                let mut dw = Gemm::new(r, n, m, true, false);
                dw.row_strides[0] = k;
                self.blas
                    .gemm(dw, DType::F32, (x + col, dy, g_addr), blas_addr, blas_bytes)?;
            }
            if let Some(d) = dx.filter(|_| m > 0) {
                // dx[:, r0..r0 + r] = dy · w_chunkᵀ from the old weight; dx's rows are k apart
                let mut dxg = Gemm::new(m, r, n, false, true);
                dxg.row_strides[2] = k;
                self.blas.gemm(
                    dxg,
                    DType::F32,
                    (dy, w + off, d + col),
                    blas_addr,
                    blas_bytes,
                )?;
            }
            let h = &c.h;
            self.kernels.adam(
                w + off,
                (g_addr, DType::F32),
                (mu + off, DType::F32),
                nu + off,
                h,
                r * n,
            )?;
        }
        if let Some(i) = blas {
            ws.free(i)?;
        }
        ws.free(g)?;
        ws.finish()
    }
}

//! The matrix product on [`CudaBackend`]: cuBLAS's GEMM in one dtype, and the mixed dense
//! product (a bf16 or f16 `a` times an f32 `b` read rounded to `a`'s dtype, see
//! [`crate::ops::matmul`]) by our tensor-core kernel where it fits
//! ([`Kernels::gemm_wf32_fits`]), else by rounding `b` into the workspace for cuBLAS.

use super::kernels::Kernels;
use super::workspace::Schedule;
use super::{CudaBackend, cublas};
use crate::backend::{Call, Matmul, Scratch};
use crate::{Backend, Checked, DType, MatmulOps, TensorError, WorkspaceStep};

const OP: &str = "matmul";

impl CudaBackend {
    /// The workspace of `[m, k] · [k, n]` with `b` of `b_dtype`: cuBLAS's (one dtype); the
    /// kernel's f32 partials (mixed, where it fits); `b` rounded, then cuBLAS's (mixed, else).
    pub(super) fn matmul_schedule(
        &self,
        (m, n, k): (usize, usize, usize),
        (dtype, b_dtype): (DType, DType),
    ) -> Vec<WorkspaceStep> {
        if dtype == b_dtype || m == 0 || n == 0 || k == 0 {
            return WorkspaceStep::single(self.matmul_bytes(m, n, k));
        }
        if Kernels::gemm_wf32_fits(m, n, k) {
            return WorkspaceStep::single(self.kernels.gemm_wf32_splits(n, k) * m * n * 4);
        }
        let mut s = Schedule::default();
        let rounded = s.alloc(k * n * dtype.size_bytes());
        s.scoped(self.matmul_bytes(m, n, k));
        s.free(rounded);
        s.finish()
    }
}

impl MatmulOps for CudaBackend {
    fn matmul(&self, c: Checked<Matmul<'_>>) -> Result<(), TensorError> {
        let desc = c.get().desc();
        let Matmul {
            m,
            n,
            k,
            a,
            b,
            transpose_a,
            transpose_b,
            c,
            accumulate,
        } = c.into_inner();
        self.bind()?;
        if m == 0 || n == 0 {
            return Ok(());
        }
        if k == 0 {
            return match accumulate {
                true => Ok(()),
                false => self.kernels.zero(c.addr(), c.dtype(), m * n),
            };
        }
        let mut ws = Scratch::new(OP, &self.allocator, self.workspace_schedule(&desc)?);
        let (dtype, mixed) = (c.dtype(), b.dtype() != c.dtype());
        if mixed && Kernels::gemm_wf32_fits(m, n, k) {
            let part = ws.alloc()?;
            let ops = (a.addr(), b.addr(), c.addr());
            self.kernels
                .gemm_wf32(dtype, ops, ws.addr(part), (m, n, k))?;
            ws.free(part)?;
            return ws.finish();
        }
        // else a mixed product reads b rounded into the workspace
        let rounded = mixed.then(|| ws.alloc()).transpose()?;
        let b_addr = match rounded {
            Some(i) => {
                self.kernels
                    .cast((DType::F32, dtype), b.addr(), ws.addr(i), k * n)?;
                ws.addr(i)
            }
            None => b.addr(),
        };
        let bytes = self.matmul_bytes(m, n, k);
        let i = (bytes > 0).then(|| ws.alloc()).transpose()?;
        let gemm = cublas::Gemm {
            accumulate,
            ..cublas::Gemm::new(m, n, k, transpose_a, transpose_b)
        };
        let ws_addr = i.map_or(0, |i| ws.addr(i));
        let ops = (a.addr(), b_addr, c.addr());
        self.blas.gemm(gemm, (dtype, dtype), ops, ws_addr, bytes)?;
        for i in [i, rounded].into_iter().flatten() {
            ws.free(i)?;
        }
        ws.finish()
    }
}

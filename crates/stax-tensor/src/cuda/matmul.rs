//! The matrix product on [`CudaBackend`]: cuBLAS's GEMM in one dtype, and two products by our
//! split-K tensor-core kernel where it fits (`Kernels::gemm_wf32_fits`): the mixed dense
//! product (a bf16 or f16 `a` times an f32 `b` read rounded to `a`'s dtype, see
//! [`crate::ops::matmul`]; where it does not fit, `b` is rounded into the workspace for
//! cuBLAS), and under [`Precision::Highest`] the plain f32 product (no transpose, `c`
//! overwritten) in 3xTF32 ([`CudaBackend::set_fp32_gemm_3xtf32`]; on by default).

use super::workspace::Schedule;
use super::{CudaBackend, cublas};
use crate::backend::{Call, Matmul, Scratch};
use crate::{Backend, Checked, DType, MatmulOps, OpDesc, Precision, TensorError, WorkspaceStep};
use std::sync::atomic::Ordering;

const OP: &str = "matmul";

impl CudaBackend {
    /// Turns full fp32's dense product on our kernel on (the default) or off: under [`Precision::Highest`] an f32 `[m, k] · [k, n]` with neither operand
    /// transposed and `c` overwritten, `m <= 128`, `k % 4 == 0`, `n % 4 == 0` (the seed's
    /// Dense(128) forward) runs as 3xTF32 on the tensor cores (`kernels/gemm.cu`,
    /// `gemm_wf32_f32x3`: each operand split into its TF32 rounding and the rounded rest, three
    /// mmas a product, f32's accuracy) split over k into f32 partials in the workspace; off,
    /// cuBLAS's f32 GEMM (`CUBLAS_DEFAULT_MATH`) runs it. At the seed's `[100, 2,560,000] ·
    /// [2,560,000, 128]` the kernel took 1.542 ms against cuBLAS's 1.731 and agreed with the
    /// CPU's f32 product within 1e-5 norm-wise (H100, 2026-12-07, BENCHMARKS.md). The workspace
    /// differs, so set it before a memory plan is made. For A/B timing and tests.
    pub fn set_fp32_gemm_3xtf32(&self, on: bool) {
        self.gemm_x3.store(on, Ordering::Relaxed);
    }

    /// Whether full fp32's dense product runs our 3xTF32 kernel
    /// ([`CudaBackend::set_fp32_gemm_3xtf32`]).
    pub fn fp32_gemm_3xtf32(&self) -> bool {
        self.gemm_x3.load(Ordering::Relaxed)
    }

    /// Whether our kernel runs the matmul `op` describes (an [`OpDesc::Matmul`]): the mixed
    /// product where it fits, full fp32's plain f32 product (neither operand transposed, `c`
    /// overwritten) where it fits and the setting is on.
    fn gemm_kernel_runs(&self, op: &OpDesc) -> bool {
        let OpDesc::Matmul {
            m,
            n,
            k,
            dtype,
            b_dtype,
            transpose_a,
            transpose_b,
            accumulate,
        } = *op
        else {
            return false;
        };
        let fits = self.kernels.gemm_wf32_fits(dtype, m, n, k);
        match (dtype, b_dtype) {
            (a, b) if a != b => fits,
            (DType::F32, _) => {
                fits && !(transpose_a || transpose_b || accumulate)
                    && self.precision == Precision::Highest
                    && self.gemm_x3.load(Ordering::Relaxed)
            }
            _ => false,
        }
    }

    /// The workspace of the matmul `op` describes, `[m, k] · [k, n]` with `b` of `b_dtype`:
    /// the kernel's f32 partials (where [`CudaBackend::gemm_kernel_runs`]); else cuBLAS's (one
    /// dtype), or `b` rounded, then cuBLAS's (mixed).
    pub(super) fn matmul_schedule(&self, op: &OpDesc) -> Vec<WorkspaceStep> {
        let OpDesc::Matmul {
            m,
            n,
            k,
            dtype,
            b_dtype,
            ..
        } = *op
        else {
            return Vec::new();
        };
        if self.gemm_kernel_runs(op) {
            return WorkspaceStep::single(self.kernels.gemm_wf32_splits(n, k) * m * n * 4);
        }
        if dtype == b_dtype || m == 0 || n == 0 || k == 0 {
            return WorkspaceStep::single(self.matmul_bytes(m, n, k));
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
        if self.gemm_kernel_runs(&desc) {
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

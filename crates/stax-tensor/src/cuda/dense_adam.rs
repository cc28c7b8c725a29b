//! A dense layer's backward pass with Adam on its weight, chunk by chunk, on the device (see
//! [`crate::ops::dense_adam`]). Per chunk of the weight's rows, in f32: the dw GEMM
//! (`dw_chunk = x[:, chunk]ᵀ · dy`, into the workspace), the dx GEMM (`dx[:, chunk] =
//! dy · w_chunkᵀ`, from the old weight), then the Adam kernel on the chunk. In bf16 or f16
//! (x, dy, dx of that dtype): the dw GEMM (`cublasGemmEx`, f32 sums rounded once to the
//! dtype), the Adam kernel that reads that gradient and also writes the old chunk rounded to
//! the dtype into a second workspace buffer, then the dx GEMM from that copy. Both orders read
//! x's chunk columns before dx overwrites them in place. Under [`Precision::Highest`] with
//! [`CudaBackend::set_fp32_dense_chunks_3xtf32`] on, f32 chunks of a batch of up to 128 rows
//! into a multiple of 8 up to 128 outputs (17 to 128 rows while the one-pass rows kernel takes
//! the smaller batches) have both products in one 3xTF32 kernel instead of cuBLAS's f32 GEMMs
//! ([`CudaBackend::dense_chunks_x3`]). A chunk holds a quarter of the
//! workspace limit's bytes in f32 gradient rows (64 MiB by default; half that in bf16).
//!
//! An f32 batch of 1 to 16 rows into at most 128 outputs (the seed's Dense(128) at batch 10)
//! runs as one kernel instead, and so does, under [`Precision::Tf32`], an f32 batch of 17 to
//! 128 rows into a multiple of 8 up to 128 outputs (the seed at batch 100) on the tensor cores
//! ([`CudaBackend::dense_adam_is_rows`]): no workspace, and the weight, its moments, x and dx
//! cross memory once.

use super::kernels::dense_rows_apply;
use super::workspace::Schedule;
use super::{CudaBackend, cublas::Gemm};
use crate::backend::{Call, DenseAdam, DenseDx, Scratch};
use crate::{
    AdamHyper, Backend, DType, OpDesc, Precision, TensorError, WorkspaceStep, dense_chunk_rows,
};
use std::sync::atomic::Ordering;

const OP: &str = "dense_adam";

/// The one-pass kernel of a dense update ([`CudaBackend::dense_adam_is_rows`]).
#[derive(Debug, Clone, Copy)]
enum OnePass {
    /// `dense_adam_rows_m<m>`: f32 FMAs, a batch of 1 to 16 rows (under TF32
    /// `dense_adam_rows_tf32_m<m>`: the same sums, Adam's step as the tensor-core pass takes it).
    Rows,
    /// `dense_adam_mma_mb<mb>`: the TF32 tensor cores, 17 to 128 rows.
    Mma,
}

/// One call's device addresses: the operands, the workspace, and its sizes.
struct Addrs {
    /// `[x, dy, w, mu, nu]`.
    operands: [u64; 5],
    /// Where dx goes (none: not computed, or no rows).
    dx: Option<u64>,
    /// The chunk of `dw`, in the call's dtype.
    g: u64,
    /// The old weight's chunk in `dtype`, when dx reads it (bf16, f16).
    old: Option<u64>,
    /// cuBLAS's workspace (0: none) and its bytes.
    blas: (u64, usize),
    /// Whether the products run the 3xTF32 kernel ([`CudaBackend::dense_chunks_x3`]).
    x3: bool,
}

impl CudaBackend {
    /// Turns the one-pass dense updates on (the default) or off: an f32
    /// [`crate::ops::dense_adam`] of a batch of 1 to 16 rows and at most 128 outputs (the seed's
    /// Dense(128) at batch 10), or under [`Precision::Tf32`] of 17 to 128 rows and a multiple
    /// of 8 up to 128 outputs (the seed at batch 100, on the TF32 tensor cores), then runs as
    /// one kernel that reads each weight row, computes its gradient in registers, its input
    /// gradient from the old row and Adam's step, with no workspace; off, it runs chunk by
    /// chunk through cuBLAS. The workspace differs, so set it before a memory plan is made
    /// (before training starts). For A/B timing and tests.
    pub fn set_dense_adam_rows(&self, on: bool) {
        self.dense_rows.store(on, Ordering::Relaxed);
    }

    /// Whether an f32 dense update of `m` batch rows and `n` outputs runs in one pass (see
    /// [`CudaBackend::set_dense_adam_rows`]): a function of the shape, the precision and the
    /// setting, so a memory plan made on it holds.
    pub fn dense_adam_is_rows(&self, m: usize, n: usize, dtype: DType) -> bool {
        self.dense_one_pass(m, n, dtype).is_some()
    }

    /// The one-pass kernel of a dense update, if one runs it: in f32 FMAs for a small batch,
    /// else on the TF32 tensor cores under TF32 for the shapes that kernel takes within the
    /// device's shared memory.
    fn dense_one_pass(&self, m: usize, n: usize, dtype: DType) -> Option<OnePass> {
        if !self.dense_rows.load(Ordering::Relaxed) || dtype != DType::F32 {
            None
        } else if dense_rows_apply(m, n) {
            Some(OnePass::Rows)
        } else if self.precision == Precision::Tf32 && self.kernels.dense_mma_fits(m, n) {
            Some(OnePass::Mma)
        } else {
            None
        }
    }

    /// Turns full fp32's dense update by chunks on our 3xTF32 kernel on or off (the default):
    /// under [`Precision::Highest`] an f32 [`crate::ops::dense_adam`] of 1 to 128 rows into a
    /// multiple of 8 up to 128 outputs that runs by chunks then takes both products of a chunk
    /// (`dw = xᵀ·dy` and `dx = dy·wᵀ` from the old weight) from `kernels/dense_mma.cu`'s
    /// `dense_grads_x3` (each operand split into its TF32 rounding and the rounded rest, three
    /// mmas a product, f32's accuracy; no cuBLAS workspace) instead of cuBLAS's f32 GEMMs. At
    /// the seed's batch 100 the chunks with Adam took 6.717 ms against 7.463 with cuBLAS, the
    /// kernel's dw within 1.6e-6 of f64 sums (harness, H100, 2026-12-08, BENCHMARKS.md). Off by
    /// default until `tests/fused_dense.rs`'s `gpu_fp32_chunks_in_3xtf32_match_cpu` has run on
    /// a GPU (no device came to this session again). The workspace differs, so set it before a
    /// memory plan is made. For A/B timing and tests.
    pub fn set_fp32_dense_chunks_3xtf32(&self, on: bool) {
        self.dense_x3.store(on, Ordering::Relaxed);
    }

    /// Whether the chunks of an f32 dense update of `m` batch rows and `n` outputs take both
    /// products from the 3xTF32 kernel ([`CudaBackend::set_fp32_dense_chunks_3xtf32`]): under
    /// [`Precision::Highest`] with the setting on, for 1 to 128 rows and a multiple of 8 up to
    /// 128 outputs within the device's shared memory a block (every such shape on Hopper and
    /// the A100). A function of the shape, the precision, the device and the setting, so a plan
    /// made on it holds.
    pub fn dense_chunks_x3(&self, m: usize, n: usize, dtype: DType) -> bool {
        dtype == DType::F32
            && self.precision == Precision::Highest
            && self.dense_x3.load(Ordering::Relaxed)
            && self.kernels.dense_grads_x3_fits(m, n)
    }

    /// Rows of the weight per chunk: a quarter of the workspace limit of f32 gradient.
    pub(super) fn dense_chunk_rows(&self, k: usize, n: usize) -> usize {
        dense_chunk_rows(k, n, self.workspace_limit / 4)
    }

    /// The workspace of a call for a `[k, n]` weight and `m` rows of `dtype`: the chunk of
    /// `dw` in `dtype`, then (when the input gradient reads the old weight rounded to bf16 or
    /// f16) that chunk in 2-byte elements, then cuBLAS's workspace (none where
    /// [`CudaBackend::dense_chunks_x3`]); freed in reverse. None for an empty weight or the
    /// one-pass kernel ([`CudaBackend::dense_adam_is_rows`]).
    pub(super) fn dense_adam_schedule(
        &self,
        (m, n, k): (usize, usize, usize),
        dtype: DType,
        input_grad: bool,
    ) -> Vec<WorkspaceStep> {
        if k == 0 || n == 0 || self.dense_adam_is_rows(m, n, dtype) {
            return Vec::new();
        }
        let rounded = input_grad && dtype != DType::F32;
        let rows = self.dense_chunk_rows(k, n);
        let mut s = Schedule::default();
        let g = s.alloc(rows * n * dtype.size_bytes());
        let old = rounded.then(|| s.alloc(rows * n * 2));
        let blas = match self.dense_blas_bytes(m, n, k, dtype) {
            0 => None,
            bytes => Some(s.alloc(bytes)),
        };
        [blas, old, Some(g)]
            .into_iter()
            .flatten()
            .for_each(|i| s.free(i));
        s.finish()
    }

    /// See the module docs: the workspace of [`CudaBackend::dense_adam_schedule`] is taken
    /// before anything is written.
    pub(super) fn dense_adam_chunks(&self, c: DenseAdam<'_>) -> Result<(), TensorError> {
        let desc = c.desc();
        let OpDesc::DenseAdam {
            m,
            n,
            k,
            dtype,
            input_grad,
        } = desc
        else {
            unreachable!("DenseAdam describes itself as OpDesc::DenseAdam")
        };
        self.bind()?;
        let mut ws = Scratch::new(OP, &self.allocator, self.workspace_schedule(&desc)?);
        let dx = match c.dx {
            DenseDx::Skip => None,
            DenseDx::InPlace => Some(c.x.addr()),
            DenseDx::Into(ref t) => Some(t.addr()),
        };
        if let Some(pass) = self.dense_one_pass(m, n, dtype).filter(|_| k > 0 && n > 0) {
            let ops = (c.x.addr(), c.dy.addr(), dx.unwrap_or(0));
            let state = [c.w, c.mu, c.nu].map(|t| t.addr());
            match pass {
                OnePass::Mma => self.kernels.dense_adam_mma(ops, state, (m, n, k), &c.h)?,
                OnePass::Rows => {
                    let fast = self.precision == Precision::Tf32;
                    self.kernels
                        .dense_adam_rows(ops, state, (m, n, k), &c.h, fast)?
                }
            }
            return ws.finish();
        }
        if k == 0 || n == 0 {
            // no weight to update; dx = dy · wᵀ over no features is zero
            if let Some(d) = dx {
                self.kernels.zero(d, dtype, m * k)?;
            }
            return ws.finish();
        }
        let g = ws.alloc()?;
        let old = (dtype != DType::F32 && input_grad)
            .then(|| ws.alloc())
            .transpose()?;
        let blas_bytes = self.dense_blas_bytes(m, n, k, dtype);
        let blas = (blas_bytes > 0).then(|| ws.alloc()).transpose()?;
        let a = Addrs {
            operands: [c.x, c.dy, c.w, c.mu, c.nu].map(|t| t.addr()),
            dx: dx.filter(|_| m > 0),
            g: ws.addr(g),
            old: old.map(|i| ws.addr(i)),
            blas: (blas.map_or(0, |i| ws.addr(i)), blas_bytes),
            x3: self.dense_chunks_x3(m, n, dtype),
        };
        let rows = self.dense_chunk_rows(k, n);
        for r0 in (0..k).step_by(rows) {
            self.dense_adam_chunk(&a, (m, n, k), dtype, (r0, rows.min(k - r0)), &c.h)?;
        }
        for i in [blas, old, Some(g)].into_iter().flatten() {
            ws.free(i)?;
        }
        ws.finish()
    }

    /// cuBLAS's workspace bytes for the chunks' GEMMs (0 where they run our 3xTF32 kernel).
    fn dense_blas_bytes(&self, m: usize, n: usize, k: usize, dtype: DType) -> usize {
        if self.dense_chunks_x3(m, n, dtype) {
            0
        } else {
            self.matmul_bytes(m.max(1), n, k)
        }
    }

    /// The `r` weight rows from `r0`, in the order of the module docs.
    fn dense_adam_chunk(
        &self,
        a: &Addrs,
        (m, n, k): (usize, usize, usize),
        dtype: DType,
        (r0, r): (usize, usize),
        h: &AdamHyper,
    ) -> Result<(), TensorError> {
        let [x, dy, w, mu, nu] = a.operands;
        let (col, off) = ((dtype.size_bytes() * r0) as u64, 4 * (r0 * n) as u64);
        let (blas, blas_bytes) = a.blas;
        // dx[:, r0..r0 + r] = dy · w_oldᵀ in `dtype`, from `w_old`; dx's rows are k apart
        let dx_gemm = |w_old: u64, d: u64| {
            let mut dxg = Gemm::new(m, r, n, false, true);
            dxg.row_strides[2] = k;
            let ops = (dy, w_old, d + col);
            self.blas.gemm(dxg, (dtype, dtype), ops, blas, blas_bytes)
        };
        let chunk = [w + off, a.g, mu + off, nu + off];
        if m == 0 {
            self.kernels.zero(a.g, dtype, r * n)?;
        } else if a.x3 {
            // dw_chunk and (from the old weight) dx[:, r0..r0 + r] in 3xTF32, f32 only
            let dx = a.dx.map_or(0, |d| d + col);
            self.kernels
                .dense_grads_x3((x + col, dy, chunk[0]), (a.g, dx), (m, n, r, k))?;
        } else {
            // dw_chunk [r, n] = x[:, r0..r0 + r]ᵀ · dy, f32 sums stored in `dtype`; x's rows
            // are k apart
            let mut dw = Gemm::new(r, n, m, true, false);
            dw.row_strides[0] = k;
            let ops = (x + col, dy, a.g);
            self.blas.gemm(dw, (dtype, dtype), ops, blas, blas_bytes)?;
        }
        if dtype == DType::F32 {
            if let Some(d) = a.dx.filter(|_| !a.x3) {
                dx_gemm(w + off, d)?;
            }
            let (g, mu) = ((a.g, dtype), (chunk[2], dtype));
            return self.kernels.adam(chunk[0], g, mu, chunk[3], h, r * n);
        }
        // bf16, f16: the step from the gradient in `dtype`, the old chunk kept when dx reads it
        self.kernels
            .adam_old(chunk, (a.old.unwrap_or(0), dtype), h, r * n)?;
        match (a.old, a.dx) {
            (Some(old), Some(d)) => dx_gemm(old, d),
            _ => Ok(()),
        }
    }
}

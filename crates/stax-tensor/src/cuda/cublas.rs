//! Row-major GEMM through column-major cuBLAS: f32 with TF32 or full-f32 math, bf16 and f16
//! with f32 accumulation.
//!
//! A row-major matrix `X [r, c]` is, to cuBLAS, the column-major matrix `Xᵀ [c, r]` with
//! leading dimension `c`. So `C = op(A) · op(B)` (row-major) is computed as the column-major
//! product `Cᵀ = op(B)ᵀ · op(A)ᵀ`: cuBLAS's first operand is our B, its second our A, with
//! `m' = n`, `n' = m`, and each transpose flag carried over unchanged.
//!
//! cuBLAS gets its workspace from our allocator on every call (`cublasSetWorkspace_v2`), so it
//! never allocates device memory behind the allocator's back.

use crate::{DType, Precision, TensorError};
use cudarc::cublas::{result, sys};
use cudarc::driver::CudaStream;
use std::ffi::{c_int, c_void};
use std::sync::{Arc, Mutex};

/// Workspace bytes handed to cuBLAS per GEMM (what NVIDIA recommends for Hopper), unless the
/// backend's workspace limit is lower.
pub const CUBLAS_WORKSPACE_BYTES: usize = 32 << 20;

/// A cuBLAS handle bound to the compute stream, used under a lock (handles are not reentrant).
#[derive(Debug)]
pub(crate) struct Blas {
    handle: Mutex<Handle>,
}

#[derive(Debug)]
struct Handle(sys::cublasHandle_t);

// SAFETY: a cuBLAS handle may be used from any thread as long as calls do not overlap, which
// the Mutex in `Blas` guarantees.
unsafe impl Send for Handle {}

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: the handle was created by `Blas::new` and is destroyed once, here.
        let _ = unsafe { result::destroy_handle(self.0) };
    }
}

fn cublas(op: &'static str) -> impl FnOnce(result::CublasError) -> TensorError {
    move |source| TensorError::Cublas { op, source }
}

/// The shape of one row-major GEMM `c [m, n] = op(a) · op(b)`, `op(a) [m, k]`, `op(b) [k, n]`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Gemm {
    /// Rows of `op(a)` and `c`.
    pub m: usize,
    /// Columns of `op(b)` and `c`.
    pub n: usize,
    /// The contracted dimension.
    pub k: usize,
    /// `a` is stored `[k, m]`.
    pub transpose_a: bool,
    /// `b` is stored `[n, k]`.
    pub transpose_b: bool,
    /// Elements between rows of the stored `a`, `b` and `c` (at least their widths): a block
    /// of columns of a wider matrix has its matrix's row length here.
    pub row_strides: [usize; 3],
    /// Whether the product is added to `c` (`beta = 1`) rather than written over it.
    pub accumulate: bool,
    /// Independent GEMMs of this shape (cuBLAS's strided batched GEMM), and the elements
    /// between consecutive matrices of `a`, `b` and `c`; 1 for one GEMM. Batches take bf16 or
    /// f16 inputs (their one caller is the im2col filter gradient, `im2col.rs`).
    pub batch: (usize, [usize; 3]),
}

impl Gemm {
    /// Contiguous row-major operands.
    pub(crate) fn new(m: usize, n: usize, k: usize, transpose_a: bool, transpose_b: bool) -> Gemm {
        let a = if transpose_a { m } else { k };
        let b = if transpose_b { k } else { n };
        Gemm {
            m,
            n,
            k,
            transpose_a,
            transpose_b,
            row_strides: [a, b, n],
            accumulate: false,
            batch: (1, [0; 3]),
        }
    }
}

impl Blas {
    /// A handle on `stream` with the math mode of `precision`: TF32 tensor ops for
    /// [`Precision::Tf32`], plain f32 (`CUBLAS_DEFAULT_MATH`) for [`Precision::Highest`].
    ///
    /// # Errors
    /// [`TensorError::Cublas`] naming the failed call.
    pub(crate) fn new(stream: &Arc<CudaStream>, precision: Precision) -> Result<Blas, TensorError> {
        stream
            .context()
            .bind_to_thread()
            .map_err(|source| TensorError::Driver {
                op: "cuCtxSetCurrent",
                source,
            })?;
        let handle = Handle(result::create_handle().map_err(cublas("cublasCreate"))?);
        // SAFETY: valid handle and live stream (the backend keeps the stream alive).
        unsafe { result::set_stream(handle.0, stream.cu_stream() as sys::cudaStream_t) }
            .map_err(cublas("cublasSetStream"))?;
        let mode = match precision {
            Precision::Tf32 => sys::cublasMath_t::CUBLAS_TF32_TENSOR_OP_MATH,
            Precision::Highest => sys::cublasMath_t::CUBLAS_DEFAULT_MATH,
        };
        // SAFETY: valid handle.
        unsafe { sys::cublasSetMathMode(handle.0, mode) }
            .result()
            .map_err(cublas("cublasSetMathMode"))?;
        Ok(Blas {
            handle: Mutex::new(handle),
        })
    }

    /// Runs `c = op(a) · op(b)` (row-major; a and b of `dtype`, c of `out`, overwritten) on the
    /// compute stream, with `workspace` (`workspace_bytes` bytes of device memory, alive until
    /// the GEMM completed in stream order) as cuBLAS's workspace. All-f32 is `cublasSgemm` in
    /// the handle's math mode (TF32 or full f32); bf16 and f16 inputs are `cublasGemmEx` with
    /// `CUBLAS_COMPUTE_32F` (f32 products and sums, one rounding to `out`, as cuBLAS
    /// documents for these types), `out` their own dtype or f32.
    ///
    /// # Errors
    /// [`TensorError::InvalidArgument`] when a dimension exceeds `i32`, and for a batch of f32
    /// GEMMs;
    /// [`TensorError::UnsupportedDType`] for U32, and for f32 inputs with a low-precision
    /// `out` or low-precision inputs with an `out` of the other one; [`TensorError::Cublas`]
    /// when cuBLAS fails.
    pub(crate) fn gemm(
        &self,
        g: Gemm,
        (dtype, out): (DType, DType),
        (a, b, c): (u64, u64, u64),
        workspace: u64,
        workspace_bytes: usize,
    ) -> Result<(), TensorError> {
        let int = |v: usize| {
            c_int::try_from(v).map_err(|_| TensorError::InvalidArgument {
                op: "matmul",
                reason: format!("dimension {v} exceeds cuBLAS's 32-bit limit"),
            })
        };
        let (m, n, k) = (int(g.m)?, int(g.n)?, int(g.k)?);
        let data = types(dtype, out)?;
        let op = |t: bool| {
            if t {
                sys::cublasOperation_t::CUBLAS_OP_T
            } else {
                sys::cublasOperation_t::CUBLAS_OP_N
            }
        };
        // cuBLAS's A' is our b: column-major [n, k] when b is [k, n] row-major, or the transpose
        // of column-major [k, n] when b is stored [n, k]; its leading dimension is b's row
        // stride. Likewise cuBLAS's B' is our a, and C' is our c.
        let [lda, ldb, ldc] = [
            int(g.row_strides[0])?,
            int(g.row_strides[1])?,
            int(g.row_strides[2])?,
        ];
        let (alpha, beta) = (1.0f32, if g.accumulate { 1.0f32 } else { 0.0 });
        let (count, [sa, sb, sc]) = g.batch;
        let (count, [sa, sb, sc]) = (int(count)?, [sa as i64, sb as i64, sc as i64]);
        if count > 1 && data.is_none() {
            return Err(TensorError::InvalidArgument {
                op: "matmul",
                reason: "batched GEMMs take bf16 or f16 inputs".into(),
            });
        }
        let handle = self.handle.lock().unwrap_or_else(|p| p.into_inner());
        // SAFETY: `workspace` is device memory of `workspace_bytes` bytes owned by the caller
        // until this GEMM has run in stream order; every GEMM sets its own workspace first.
        unsafe { sys::cublasSetWorkspace_v2(handle.0, workspace as *mut _, workspace_bytes) }
            .result()
            .map_err(cublas("cublasSetWorkspace"))?;
        if let Some((t, tc)) = data {
            // SAFETY: a, b, c are device buffers holding [m,k]/[k,m] and [k,n]/[n,k] elements
            // of `dtype` and [m,n] of `out` at their row strides (checked by the caller); the
            // type pair is one cuBLAS supports with CUBLAS_COMPUTE_32F; alpha and beta
            // are host f32 scalars, as CUBLAS_COMPUTE_32F takes them (the default pointer mode);
            // the leading dimensions follow the mapping above.
            if count > 1 {
                // SAFETY: as below, for `count` matrices of each operand `sa`, `sb`, `sc`
                // elements apart (checked by the caller).
                return unsafe {
                    result::gemm_strided_batched_ex(
                        handle.0,
                        op(g.transpose_b),
                        op(g.transpose_a),
                        n,
                        m,
                        k,
                        (&alpha as *const f32).cast(),
                        b as *const c_void,
                        t,
                        ldb,
                        sb,
                        a as *const c_void,
                        t,
                        lda,
                        sa,
                        (&beta as *const f32).cast(),
                        c as *mut c_void,
                        tc,
                        ldc,
                        sc,
                        count,
                        sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                        sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
                    )
                }
                .map_err(cublas("cublasGemmStridedBatchedEx"));
            }
            return unsafe {
                result::gemm_ex(
                    handle.0,
                    op(g.transpose_b),
                    op(g.transpose_a),
                    n,
                    m,
                    k,
                    (&alpha as *const f32).cast(),
                    b as *const c_void,
                    t,
                    ldb,
                    a as *const c_void,
                    t,
                    lda,
                    (&beta as *const f32).cast(),
                    c as *mut c_void,
                    tc,
                    ldc,
                    sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                    sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
                )
            }
            .map_err(cublas("cublasGemmEx"));
        }
        // SAFETY: a, b, c are device buffers holding [m,k]/[k,m], [k,n]/[n,k] and [m,n] f32 at
        // their row strides (checked by the caller); alpha and beta are host scalars (the
        // default pointer mode); the leading dimensions follow the mapping above.
        unsafe {
            result::sgemm(
                handle.0,
                op(g.transpose_b),
                op(g.transpose_a),
                n,
                m,
                k,
                &alpha,
                b as *const f32,
                ldb,
                a as *const f32,
                lda,
                &beta,
                c as *mut f32,
                ldc,
            )
        }
        .map_err(cublas("cublasSgemm"))
    }
}

/// cuBLAS's data types of a GEMM's inputs and output of `(dtype, out)`: `None` for all-f32
/// (`cublasSgemm`), else the `cublasGemmEx` pair (bf16 or f16 inputs; output of their dtype or
/// f32).
///
/// # Errors
/// [`TensorError::UnsupportedDType`] for any other pair, naming the dtype that is refused.
fn types(
    dtype: DType,
    out: DType,
) -> Result<Option<(sys::cudaDataType, sys::cudaDataType)>, TensorError> {
    use sys::cudaDataType_t::{CUDA_R_16BF, CUDA_R_16F, CUDA_R_32F};
    let low = match dtype {
        DType::F32 if out == DType::F32 => return Ok(None),
        DType::BF16 => CUDA_R_16BF,
        DType::F16 => CUDA_R_16F,
        DType::F32 => {
            return Err(TensorError::UnsupportedDType {
                op: "matmul",
                dtype: out,
                supported: "f32 (the output of f32 inputs)",
            });
        }
        DType::U32 => {
            return Err(TensorError::UnsupportedDType {
                op: "matmul",
                dtype,
                supported: "f32, bf16, f16",
            });
        }
    };
    match out {
        DType::F32 => Ok(Some((low, CUDA_R_32F))),
        d if d == dtype => Ok(Some((low, low))),
        _ => Err(TensorError::UnsupportedDType {
            op: "matmul",
            dtype: out,
            supported: "f32 or the inputs' dtype",
        }),
    }
}

//! The CPU backend: exact f32 on the host, the test oracle for the CUDA backend.
//!
//! Convolutions are im2col + GEMM and dense layers plain GEMM, both through the
//! [`matrixmultiply`] crate (`sgemm` with strides, so transposes cost no copies); everything
//! else is a simple loop. Buffers come from the backend's own [`Allocator`] over host memory, so
//! host tensors are accounted like device ones, and the im2col column buffers are allocated as
//! [`Category::Workspace`](crate::Category::Workspace) and freed before the op returns.
//!
//! Each op family lives in its own file under `cpu/`: `conv.rs` (forward, backward data,
//! backward filter, any layout and dilation), `pool.rs` (max, sum and average pooling),
//! `norm.rs` (batch normalization, channel bias), `matmul.rs` (strided GEMM views shared with the
//! convs), `elementwise.rs` (fill, activations, binary ops, bias; generic over f32, bf16, f16),
//! `softmax.rs` (softmax cross-entropy), `rows.rs` (softmax over an axis, losses with integer
//! labels, dropout), `adam.rs` (the fused optimizer step) and `host.rs`
//! (the slice views of tensor buffers: the only place addresses become slices, each view
//! checked for device, dtype, length and alignment).
//!
//! ```
//! use stax_tensor::{ops, Activation, Backend, BackendOptions, Category, Tensor};
//! use stax_tensor::cpu::CpuBackend;
//! use std::sync::Arc;
//! let cpu: Arc<dyn Backend> = CpuBackend::new(&BackendOptions::default()).unwrap();
//! let mut x = Tensor::from_slice(&cpu, &[1.0f32, -2.0, 3.0], [3], Category::Activation).unwrap();
//! ops::unary(Activation::Relu, &mut x, None).unwrap();
//! assert_eq!(x.to_vec().unwrap(), vec![1.0, 0.0, 3.0]);
//! ```

mod adam;
mod conv;
mod dense_adam;
mod elementwise;
mod host;
mod layout;
mod matmul;
mod norm;
mod pool;
mod promote;
mod rows;
mod softmax;
#[cfg(test)]
mod testing;

use crate::backend::{
    Adam, AllFinite, BatchNorm, BatchNormBwd, BatchNormFold, BiasAdd, BiasGrad, Binary, Cast,
    ChannelBiasAdd, ChannelBiasGrad, Concat, Conv2d, Conv2dBwdData, Conv2dBwdFilter, Copy, CopyIn,
    CopyOut, DenseAdam, Fill, Matmul, Pool2d, Pool2dBwd, SoftmaxXent, Split, Unary, UnaryBwd,
};
use crate::backend::{Dropout, DropoutBwd, IndexLossCall, Softmax, SoftmaxBwd};
use crate::{
    Backend, BackendId, BackendOptions, Checked, Conv2dGeometry, ConvOps, ConvPass, DType, Device,
    ElementwiseOps, LossOps, MatmulOps, MemoryOps, NormOps, OpDesc, OptimOps, Precision,
    TensorError, WorkspaceStep,
};
use host::{bytes_of, bytes_of_mut, data, data_mut};
use stax_alloc::{Allocator, HostMemory};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Default bound on one im2col column buffer: 4 MiB of f32 (it stays in the last-level cache).
const DEFAULT_WORKSPACE_BYTES: usize = 4 << 20;

/// The host backend: exact f32 (and bf16/f16 elementwise ops, computed in f32), NHWC/HWIO
/// convolutions by im2col + GEMM.
///
/// It owns an [`Allocator`] over [`HostMemory`] with the strategy of the [`BackendOptions`] it
/// was opened with. [`BackendOptions::workspace_limit`] bounds the bytes of one im2col column
/// buffer (default 4 MiB); the buffer always holds at least one output pixel's patch, so a limit
/// smaller than `kh * kw * c_in * 4` bytes is raised to that. Without a limit, a pass may be
/// allotted more where its step has room below its peak ([`Backend::allot_workspace`]); a
/// limit given caps that too.
#[derive(Debug)]
pub struct CpuBackend {
    id: BackendId,
    allocator: Arc<Allocator>,
    precision: Precision,
    workspace_bytes: usize,
    /// The user's explicit workspace limit, which caps allotted headroom too (`usize::MAX`
    /// when none was given).
    workspace_cap: usize,
    /// The convolution passes an allotment claimed ([`Backend::workspace_allotted`]), each
    /// with its column-buffer bound (bytes; at least `workspace_bytes`).
    allowances: Mutex<HashMap<(Conv2dGeometry, ConvPass), usize>>,
}

impl CpuBackend {
    /// Opens a CPU backend with a fresh host allocator using `options.strategy`.
    ///
    /// `options.precision` is only reported back by [`Backend::precision`]: the CPU always
    /// computes in exact f32.
    ///
    /// # Errors
    /// [`TensorError::Alloc`] if the allocator rejects the strategy.
    pub fn new(options: &BackendOptions) -> Result<Arc<CpuBackend>, TensorError> {
        Self::over(HostMemory::new(), options)
    }

    /// As [`CpuBackend::new`], but the allocator's host memory holds at most `capacity` bytes
    /// ([`HostMemory::with_capacity`]): a CPU stand-in for a device of that size, so a step can
    /// be run under a memory budget (`bfc` then reserves `fraction x capacity` up front).
    ///
    /// # Errors
    /// As [`CpuBackend::new`]; [`TensorError::Alloc`] when a `bfc` arena cannot be reserved.
    pub fn with_capacity(
        options: &BackendOptions,
        capacity: u64,
    ) -> Result<Arc<CpuBackend>, TensorError> {
        Self::over(HostMemory::with_capacity(capacity), options)
    }

    fn over(memory: HostMemory, options: &BackendOptions) -> Result<Arc<CpuBackend>, TensorError> {
        let allocator = Allocator::new(Arc::new(memory), options.strategy.clone())?;
        Ok(Arc::new(CpuBackend {
            id: BackendId::fresh(),
            allocator,
            precision: options.precision,
            workspace_bytes: options.workspace_limit.unwrap_or(DEFAULT_WORKSPACE_BYTES),
            workspace_cap: options.workspace_limit.unwrap_or(usize::MAX),
            allowances: Mutex::default(),
        }))
    }

    /// How many im2col rows of `row_len` floats fit in the workspace bound of conv pass
    /// `key` (its allowance, else the backend's; at least one).
    fn workspace_rows(&self, row_len: usize, key: (Conv2dGeometry, ConvPass)) -> usize {
        let allowances = self.allowances.lock().unwrap_or_else(|p| p.into_inner());
        let bound = allowances
            .get(&key)
            .copied()
            .unwrap_or(self.workspace_bytes);
        (bound / 4 / row_len.max(1)).max(1)
    }

    /// Raises the column-buffer bound of conv pass `key` to `bytes` (at most the user's
    /// limit; never lowers it).
    fn allow_columns(&self, key: (Conv2dGeometry, ConvPass), bytes: usize) {
        let bytes = bytes.min(self.workspace_cap);
        let mut allowances = self.allowances.lock().unwrap_or_else(|p| p.into_inner());
        let bound = allowances.entry(key).or_insert(self.workspace_bytes);
        *bound = (*bound).max(bytes);
    }
}

impl Backend for CpuBackend {
    fn id(&self) -> BackendId {
        self.id
    }

    fn device(&self) -> Device {
        Device::Cpu
    }

    fn allocator(&self) -> &Arc<Allocator> {
        &self.allocator
    }

    fn precision(&self) -> Precision {
        self.precision
    }

    fn synchronize(&self) -> Result<(), TensorError> {
        Ok(())
    }

    fn driver_memory(&self) -> Result<Option<(u64, u64)>, TensorError> {
        Ok(None)
    }

    /// Convolutions allocate one im2col column buffer per call (none when pointwise), after
    /// an HWIO copy of a kernel stored otherwise; no other op allocates.
    /// The fused dense update allocates a chunk of its weight gradient (and of the rounded
    /// old weight for a bf16 or f16 input gradient). A bf16 or f16 convolution, GEMM, pooling,
    /// batch normalization or fused dense update first allocates f32 copies of its operands
    /// (`promote.rs`), around the f32 body's workspace.
    fn workspace_schedule(&self, op: &OpDesc) -> Result<Vec<WorkspaceStep>, TensorError> {
        let inner = match op {
            OpDesc::Conv { geometry, pass, .. } => conv::schedule(self, geometry, *pass)?,
            OpDesc::DenseAdam {
                n,
                k,
                dtype,
                input_grad,
                ..
            } => dense_adam::schedule(self, *k, *n, *input_grad && *dtype != DType::F32),
            _ => Vec::new(),
        };
        Ok(promote::around(promote::copies(op), inner))
    }

    /// Grows convolutions' im2col column buffers within their headroom (see `conv.rs`).
    fn allot_workspace(&self, headroom: &[(OpDesc, usize)]) -> Result<usize, TensorError> {
        conv::allot(self, headroom)
    }

    fn workspace_allotted(&self, op: &OpDesc) -> bool {
        let allowances = self.allowances.lock().unwrap_or_else(|p| p.into_inner());
        conv::key(op).is_some_and(|key| allowances.contains_key(&key))
    }

    fn revoke_workspace(&self, ops: &[OpDesc]) -> Result<(), TensorError> {
        let mut allowances = self.allowances.lock().unwrap_or_else(|p| p.into_inner());
        for key in ops.iter().filter_map(conv::key) {
            if let Some(bound) = allowances.get_mut(&key) {
                *bound = self.workspace_bytes;
            }
        }
        Ok(())
    }
}

impl MemoryOps for CpuBackend {
    fn upload(&self, c: Checked<CopyIn<'_>>) -> Result<(), TensorError> {
        let CopyIn { src, dst } = c.into_inner();
        bytes_of_mut("upload", dst)?.copy_from_slice(src);
        Ok(())
    }

    fn download(&self, c: Checked<CopyOut<'_>>) -> Result<(), TensorError> {
        let CopyOut { src, dst } = c.into_inner();
        dst.copy_from_slice(bytes_of("download", src)?);
        Ok(())
    }

    fn copy(&self, c: Checked<Copy<'_>>) -> Result<(), TensorError> {
        const OP: &str = "copy";
        let Copy { src, dst } = c.into_inner();
        bytes_of_mut(OP, dst)?.copy_from_slice(bytes_of(OP, src)?);
        Ok(())
    }

    fn fill(&self, c: Checked<Fill<'_>>) -> Result<(), TensorError> {
        elementwise::fill(c.into_inner())
    }

    fn concat(&self, c: Checked<Concat<'_>>) -> Result<(), TensorError> {
        layout::concat(c.into_inner())
    }

    fn split(&self, c: Checked<Split<'_>>) -> Result<(), TensorError> {
        layout::split(c.into_inner())
    }

    fn cast(&self, c: Checked<Cast<'_>>) -> Result<(), TensorError> {
        elementwise::cast(c.into_inner())
    }
}

impl ConvOps for CpuBackend {
    fn conv2d(&self, c: Checked<Conv2d<'_>>) -> Result<(), TensorError> {
        let c = c.into_inner();
        match c.x.dtype() {
            DType::F32 => conv::forward(self, c),
            _ => promote::conv2d(self, c),
        }
    }

    fn conv2d_bwd_data(&self, c: Checked<Conv2dBwdData<'_>>) -> Result<(), TensorError> {
        let c = c.into_inner();
        match c.dy.dtype() {
            DType::F32 => conv::backward_data(self, c),
            _ => promote::conv2d_bwd_data(self, c),
        }
    }

    fn conv2d_bwd_filter(&self, c: Checked<Conv2dBwdFilter<'_>>) -> Result<(), TensorError> {
        let c = c.into_inner();
        match c.x.dtype() {
            DType::F32 => conv::backward_filter(self, c),
            _ => promote::conv2d_bwd_filter(self, c),
        }
    }

    fn pool2d(&self, c: Checked<Pool2d<'_>>) -> Result<(), TensorError> {
        let c = c.into_inner();
        match c.x.dtype() {
            DType::F32 => pool::forward(c),
            _ => promote::pool2d(c),
        }
    }

    fn pool2d_bwd(&self, c: Checked<Pool2dBwd<'_>>) -> Result<(), TensorError> {
        let c = c.into_inner();
        match c.dy.dtype() {
            DType::F32 => pool::backward(c),
            _ => promote::pool2d_bwd(c),
        }
    }
}

impl MatmulOps for CpuBackend {
    fn matmul(&self, c: Checked<Matmul<'_>>) -> Result<(), TensorError> {
        let c = c.into_inner();
        match c.a.dtype() {
            DType::F32 => matmul::matmul(c),
            _ => promote::matmul(c),
        }
    }
}

impl ElementwiseOps for CpuBackend {
    fn unary(&self, c: Checked<Unary<'_>>) -> Result<(), TensorError> {
        elementwise::unary(c.into_inner())
    }

    fn unary_bwd(&self, c: Checked<UnaryBwd<'_>>) -> Result<(), TensorError> {
        elementwise::unary_bwd(c.into_inner())
    }

    fn binary(&self, c: Checked<Binary<'_>>) -> Result<(), TensorError> {
        elementwise::binary(c.into_inner())
    }

    fn bias_add(&self, c: Checked<BiasAdd<'_>>) -> Result<(), TensorError> {
        elementwise::bias_add(c.into_inner())
    }

    fn bias_grad(&self, c: Checked<BiasGrad<'_>>) -> Result<(), TensorError> {
        elementwise::bias_grad(c.into_inner())
    }

    fn softmax(&self, c: Checked<Softmax<'_>>) -> Result<(), TensorError> {
        rows::softmax(c.into_inner())
    }

    fn softmax_bwd(&self, c: Checked<SoftmaxBwd<'_>>) -> Result<(), TensorError> {
        rows::softmax_bwd(c.into_inner())
    }

    fn dropout(&self, c: Checked<Dropout<'_>>) -> Result<(), TensorError> {
        rows::dropout(c.into_inner())
    }

    fn dropout_bwd(&self, c: Checked<DropoutBwd<'_>>) -> Result<(), TensorError> {
        rows::dropout_bwd(c.into_inner())
    }
}

impl LossOps for CpuBackend {
    fn softmax_xent(&self, c: Checked<SoftmaxXent<'_>>) -> Result<f32, TensorError> {
        softmax::softmax_xent(c.into_inner())
    }

    fn index_loss(&self, c: Checked<IndexLossCall<'_>>) -> Result<f32, TensorError> {
        rows::index_loss(c.into_inner())
    }
}

impl NormOps for CpuBackend {
    /// The body (f32, or on f32 copies); with `add`, then the sum and its ReLU as
    /// `ops::binary_relu` computes them.
    fn batch_norm(&self, c: Checked<BatchNorm<'_>>) -> Result<(), TensorError> {
        let mut c = c.into_inner();
        let Some(b) = c.add.take() else {
            return batch_norm_body(c);
        };
        let (y, relu) = (c.y, c.relu.take());
        batch_norm_body(BatchNorm { y: &mut *y, ..c })?;
        elementwise::binary(Binary {
            op: crate::BinaryOp::Add,
            a: y,
            b,
            relu,
            masked_by: None,
        })
    }

    /// The body (f32, or on f32 copies), then the sums of the dx it wrote, when asked for.
    fn batch_norm_bwd(&self, c: Checked<BatchNormBwd<'_>>) -> Result<(), TensorError> {
        let mut c = c.into_inner();
        let (g, dx_sum, dy) = (c.g, c.dx_sum.take(), c.dy);
        let c = BatchNormBwd {
            dy: &mut *dy,
            dx_sum: None,
            ..c
        };
        match c.x.dtype() {
            DType::F32 => norm::batch_norm_bwd(c)?,
            _ => promote::batch_norm_bwd(c)?,
        }
        match dx_sum {
            Some(db) => norm::channel_sums(&g, dy, db),
            None => Ok(()),
        }
    }

    fn channel_bias_add(&self, c: Checked<ChannelBiasAdd<'_>>) -> Result<(), TensorError> {
        norm::channel_bias_add(c.into_inner())
    }

    fn channel_bias_grad(&self, c: Checked<ChannelBiasGrad<'_>>) -> Result<(), TensorError> {
        norm::channel_bias_grad(c.into_inner())
    }

    fn batch_norm_fold(&self, c: Checked<BatchNormFold<'_>>) -> Result<(), TensorError> {
        norm::batch_norm_fold(c.into_inner())
    }
}

impl OptimOps for CpuBackend {
    fn adam(&self, c: Checked<Adam<'_>>) -> Result<(), TensorError> {
        adam::adam_update(c.into_inner())
    }

    fn dense_adam(&self, c: Checked<DenseAdam<'_>>) -> Result<(), TensorError> {
        dense_adam::dense_adam(self, c.into_inner())
    }

    fn all_finite(&self, c: Checked<AllFinite<'_>>) -> Result<(), TensorError> {
        adam::all_finite(c.into_inner())
    }
}

/// Batch normalization forward on the host: in f32, or on f32 copies.
fn batch_norm_body(c: BatchNorm<'_>) -> Result<(), TensorError> {
    match c.x.dtype() {
        DType::F32 => norm::batch_norm(c),
        _ => promote::batch_norm(c),
    }
}

#[cfg(test)]
mod tests;

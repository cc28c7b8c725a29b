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
    Adam, AllFinite, BatchNorm, BatchNormBwd, BiasAdd, BiasGrad, Binary, Cast, ChannelBiasAdd,
    ChannelBiasGrad, Concat, Conv2d, Conv2dBwdData, Conv2dBwdFilter, Copy, CopyIn, CopyOut,
    DenseAdam, Fill, Matmul, Pool2d, Pool2dBwd, SoftmaxXent, Split, Unary, UnaryBwd,
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
/// smaller than `kh * kw * c_in * 4` bytes is raised to that.
#[derive(Debug)]
pub struct CpuBackend {
    id: BackendId,
    allocator: Arc<Allocator>,
    precision: Precision,
    workspace_bytes: usize,
    /// The user's explicit workspace limit, which caps allotted headroom too (`usize::MAX`
    /// when none was given).
    workspace_cap: usize,
    /// Column-buffer bounds (bytes) of the convolution passes given headroom
    /// ([`Backend::allot_workspace`]).
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
            allowances.remove(&key);
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
    fn batch_norm(&self, c: Checked<BatchNorm<'_>>) -> Result<(), TensorError> {
        match c.get().x.dtype() {
            DType::F32 => norm::batch_norm(c.into_inner()),
            _ => promote::batch_norm(c.into_inner()),
        }
    }

    fn batch_norm_bwd(&self, c: Checked<BatchNormBwd<'_>>) -> Result<(), TensorError> {
        match c.get().x.dtype() {
            DType::F32 => norm::batch_norm_bwd(c.into_inner()),
            _ => promote::batch_norm_bwd(c.into_inner()),
        }
    }

    fn channel_bias_add(&self, c: Checked<ChannelBiasAdd<'_>>) -> Result<(), TensorError> {
        norm::channel_bias_add(c.into_inner())
    }

    fn channel_bias_grad(&self, c: Checked<ChannelBiasGrad<'_>>) -> Result<(), TensorError> {
        norm::channel_bias_grad(c.into_inner())
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

#[cfg(test)]
mod tests {
    use super::testing::{backend, tensor};
    use super::*;
    use crate::ops;
    use crate::{Category, Conv2dGeometry, DType, Tensor};

    #[test]
    fn reports_host_device_and_precision() {
        let opts = BackendOptions {
            precision: Precision::Highest,
            ..Default::default()
        };
        let be = CpuBackend::new(&opts).unwrap();
        assert_eq!(be.device(), Device::Cpu);
        assert_eq!(be.precision(), Precision::Highest);
        assert_eq!(be.driver_memory().unwrap(), None);
        be.synchronize().unwrap();
    }

    #[test]
    fn upload_download_round_trip_and_lengths() {
        let be = backend();
        let mut t = Tensor::empty(&be, [2, 3], DType::U32, Category::Other).unwrap();
        let src: Vec<u8> = (0..24).collect();
        ops::upload(&src, &mut t).unwrap();
        let mut back = vec![0u8; 24];
        ops::download(&t, &mut back).unwrap();
        assert_eq!(back, src);
        let e = ops::upload(&src[..20], &mut t).unwrap_err();
        assert!(
            matches!(
                e,
                TensorError::HostLength {
                    expected: 24,
                    got: 20,
                    ..
                }
            ),
            "{e}"
        );
        let e = ops::download(&t, &mut [0u8; 28]).unwrap_err();
        assert!(
            matches!(
                e,
                TensorError::HostLength {
                    expected: 24,
                    got: 28,
                    ..
                }
            ),
            "{e}"
        );
        let _view = t.clone();
        assert!(matches!(
            ops::upload(&src, &mut t),
            Err(TensorError::Aliased { op: "upload", .. })
        ));
    }

    #[test]
    fn copy_and_duplicate() {
        let be = backend();
        let src = tensor(&be, &[1.0, 2.0, 3.0, 4.0], [2, 2]);
        let mut dst = tensor(&be, &[0.0; 4], [2, 2]);
        ops::copy(&src, &mut dst).unwrap();
        assert_eq!(dst.to_vec().unwrap(), vec![1.0, 2.0, 3.0, 4.0]);
        let dup = src.duplicate().unwrap();
        assert!(!dup.same_buffer(&src));
        assert_eq!(dup.to_vec().unwrap(), vec![1.0, 2.0, 3.0, 4.0]);
        let mut wrong = tensor(&be, &[0.0; 4], [4]);
        assert!(matches!(
            ops::copy(&src, &mut wrong),
            Err(TensorError::Shape { .. })
        ));
        let mut words = Tensor::empty(&be, [2, 2], DType::U32, Category::Other).unwrap();
        assert!(matches!(
            ops::copy(&src, &mut words),
            Err(TensorError::DType { .. })
        ));
        let _view = dst.clone();
        assert!(matches!(
            ops::copy(&src, &mut dst),
            Err(TensorError::Aliased { op: "copy", .. })
        ));
    }

    #[test]
    fn empty_tensors_are_fine() {
        let be = backend();
        let mut t = Tensor::empty(&be, [0, 4], DType::F32, Category::Other).unwrap();
        ops::upload(&[], &mut t).unwrap();
        ops::fill(&mut t, 1.0).unwrap();
        assert_eq!(t.to_vec().unwrap(), Vec::<f32>::new());
    }

    /// 2 images of 5x5x3 into 4 channels by a 3x3 kernel, SAME: 50 output pixels with
    /// 27-float patches (108 bytes a row).
    fn five_by_five() -> Conv2dGeometry {
        Conv2dGeometry::new(
            &[2, 5, 5, 3].into(),
            &[3, 3, 3, 4].into(),
            (1, 1),
            crate::Padding::Same,
        )
        .unwrap()
    }

    /// A 4x4x4 f32 matmul: no workspace on the CPU.
    fn small_matmul() -> OpDesc {
        OpDesc::Matmul {
            m: 4,
            n: 4,
            k: 4,
            dtype: DType::F32,
            b_dtype: DType::F32,
        }
    }

    #[test]
    fn workspace_is_bounded_and_freed_after_conv() {
        // 50 output pixels with 27-float patches: a whole-batch im2col would take 5400 bytes;
        // a 1 KiB bound gives chunks of 9 rows (972 bytes).
        let be = super::testing::backend_with_workspace(1024);
        let g = five_by_five();
        let x = tensor(&be, &[0.5; 150], [2, 5, 5, 3]);
        let w = tensor(&be, &[0.25; 108], [3, 3, 3, 4]);
        let b = tensor(&be, &[0.0; 4], [4]);
        let mut y = Tensor::empty(&be, g.output_shape(), DType::F32, Category::Activation).unwrap();
        ops::conv2d(&x, &w, &b, &g, &mut y, Default::default()).unwrap();
        let mut dx = Tensor::empty(&be, g.input_shape(), DType::F32, Category::Other).unwrap();
        ops::conv2d_bwd_data(&y, &w, &g, &mut dx).unwrap();
        let stats = be.allocator().stats();
        let ws = Category::Workspace.index();
        assert_eq!(
            stats.by_category[ws].live, 0,
            "workspace still live after the convs"
        );
        let peak = stats.peak_by_category[ws];
        assert!(peak > 0 && peak <= 2048, "workspace peak {peak} bytes");
        // the planner's query says exactly what each pass allocated: 9 rows of 27 floats
        for pass in [
            crate::ConvPass::Forward,
            crate::ConvPass::BackwardData,
            crate::ConvPass::BackwardFilter,
        ] {
            let q = OpDesc::Conv {
                geometry: g,
                pass,
                dtype: DType::F32,
                bias: true,
            };
            assert_eq!(be.workspace_bytes(&q).unwrap(), 9 * 27 * 4);
        }
        assert_eq!(stats.by_category[ws].peak, 9 * 27 * 4);
        let mm = small_matmul();
        assert_eq!(be.workspace_bytes(&mm).unwrap(), 0);
    }

    #[test]
    fn allotted_headroom_grows_column_buffers_within_the_cap() {
        // 50 output pixels with 27-float patches (108 bytes a row); a 1 KiB bound: 9 rows
        let open = |cap| CpuBackend {
            workspace_bytes: 1024,
            workspace_cap: cap,
            ..Arc::into_inner(CpuBackend::new(&BackendOptions::default()).unwrap()).unwrap()
        };
        let g = five_by_five();
        let conv = |pass, bias| OpDesc::Conv {
            geometry: g,
            pass,
            dtype: DType::F32,
            bias,
        };
        let (fwd, fwd_plain) = (
            conv(ConvPass::Forward, true),
            conv(ConvPass::Forward, false),
        );
        let (bwd_filter, bwd_data) = (
            conv(ConvPass::BackwardFilter, true),
            conv(ConvPass::BackwardData, false),
        );
        let mm = small_matmul();
        let be = open(usize::MAX);
        // the forward pass takes its two ops' least headroom (300: 972 + 300 bytes hold 11
        // rows); 10 more bytes are no row for the filter gradient; a matmul has no columns
        let headroom = [(fwd, 500), (fwd_plain, 300), (bwd_filter, 10), (mm, 1000)];
        assert_eq!(be.allot_workspace(&headroom).unwrap(), 2);
        let bytes = |op| be.workspace_bytes(&op).unwrap();
        assert_eq!([bytes(fwd), bytes(fwd_plain)], [11 * 108; 2]);
        assert_eq!([bytes(bwd_filter), bytes(bwd_data)], [9 * 108; 2]);
        // never shrinks; at most every pixel
        assert_eq!(be.allot_workspace(&[(fwd, 0)]).unwrap(), 0);
        assert_eq!(bytes(fwd), 11 * 108);
        assert_eq!(be.allot_workspace(&[(fwd, 1 << 30)]).unwrap(), 1);
        assert_eq!(bytes(fwd), 50 * 108);
        // the pass allocates what its schedule says, and computes the same
        let be: Arc<dyn Backend> = Arc::new(be);
        let x = tensor(
            &be,
            &(0..150).map(|i| i as f32 / 150.0).collect::<Vec<_>>(),
            [2, 5, 5, 3],
        );
        let w = tensor(
            &be,
            &(0..108).map(|i| 0.5 - i as f32 / 108.0).collect::<Vec<_>>(),
            [3, 3, 3, 4],
        );
        let b = tensor(&be, &[0.0; 4], [4]);
        let run = |be: &Arc<dyn Backend>| {
            let (x, w, b) = (x.to(be).unwrap(), w.to(be).unwrap(), b.to(be).unwrap());
            let mut y = Tensor::empty(be, g.output_shape(), DType::F32, Category::Other).unwrap();
            ops::conv2d(&x, &w, &b, &g, &mut y, Default::default()).unwrap();
            let ws = be.allocator().stats().by_category[Category::Workspace.index()].peak;
            (y.to_vec().unwrap(), ws)
        };
        let (wide, ws) = run(&be);
        assert_eq!(ws, 50 * 108);
        let (narrow, ws) = run(&super::testing::backend_with_workspace(1024));
        assert_eq!(ws, 9 * 108);
        for (a, b) in wide.iter().zip(&narrow) {
            assert!((a - b).abs() <= 1e-6 * b.abs().max(1.0), "{a} vs {b}");
        }
        // an explicit limit caps the allowance: 1,100 bytes hold 10 rows
        let capped = open(1100);
        assert_eq!(capped.allot_workspace(&[(fwd, 500)]).unwrap(), 1);
        assert_eq!(capped.workspace_bytes(&fwd).unwrap(), 10 * 108);
        // revoked: back to the backend's bound, the forward pass with and without a bias
        assert!(capped.workspace_allotted(&fwd_plain) && !capped.workspace_allotted(&bwd_data));
        capped.revoke_workspace(&[fwd_plain, mm]).unwrap();
        assert_eq!(capped.workspace_bytes(&fwd).unwrap(), 9 * 108);
        assert!(!capped.workspace_allotted(&fwd));
        // a bad op fails before anything changes (no overflow panic on huge fields)
        let mut huge = g;
        huge.n = usize::MAX / 2;
        let bad = OpDesc::Conv {
            geometry: huge,
            pass: ConvPass::Forward,
            dtype: DType::F32,
            bias: true,
        };
        let r = capped.allot_workspace(&[(fwd, 500), (bad, 1)]);
        assert!(
            matches!(r, Err(TensorError::InvalidArgument { .. })),
            "{r:?}"
        );
        assert_eq!(capped.workspace_bytes(&fwd).unwrap(), 9 * 108);
    }

    #[test]
    fn pointwise_convs_need_no_workspace_and_capacity_caps_memory() {
        let be = CpuBackend::with_capacity(&BackendOptions::default(), 4 << 20).unwrap();
        let g = Conv2dGeometry::new(
            &[2, 5, 5, 3].into(),
            &[1, 1, 3, 4].into(),
            (1, 1),
            crate::Padding::Valid,
        )
        .unwrap();
        let q = OpDesc::Conv {
            geometry: g,
            pass: crate::ConvPass::BackwardFilter,
            dtype: DType::F32,
            bias: true,
        };
        assert_eq!(be.workspace_bytes(&q).unwrap(), 0);
        let be: Arc<dyn Backend> = be;
        let e = Tensor::empty(&be, [2 << 20], DType::F32, Category::Other).unwrap_err();
        assert!(matches!(e, TensorError::Alloc(_)), "{e}");
    }
}

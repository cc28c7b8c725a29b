//! The CPU backend: exact f32 on the host, the test oracle for the CUDA backend.
//!
//! Convolutions are im2col + GEMM and dense layers plain GEMM, both through the
//! [`matrixmultiply`] crate (`sgemm` with strides, so transposes cost no copies); everything
//! else is a simple loop. Buffers come from the backend's own [`Allocator`] over host memory, so
//! host tensors are accounted like device ones, and the im2col column buffers are allocated as
//! [`Category::Workspace`] and freed before the op returns.
//!
//! Each op family lives in its own file under `cpu/`: `conv.rs` (forward, backward data,
//! backward filter), `matmul.rs` (strided GEMM views shared with the convs), `elementwise.rs`
//! (fill, bias, ReLU), `softmax.rs` (softmax cross-entropy), `adam.rs` (the fused optimizer
//! step) and `host.rs` (the checked slice views of tensor buffers).
//!
//! ```
//! use stax_tensor::{Backend, BackendOptions, Category, Tensor};
//! use stax_tensor::cpu::CpuBackend;
//! use std::sync::Arc;
//! let cpu: Arc<dyn Backend> = CpuBackend::new(&BackendOptions::default()).unwrap();
//! let mut x = Tensor::from_slice(&cpu, &[1.0, -2.0, 3.0], [3], Category::Activation).unwrap();
//! cpu.relu(&mut x, None).unwrap();
//! assert_eq!(x.to_vec().unwrap(), vec![1.0, 0.0, 3.0]);
//! ```

mod adam;
mod conv;
mod elementwise;
mod host;
mod matmul;
mod softmax;
#[cfg(test)]
mod testing;

use crate::{
    AdamHyper, Backend, BackendId, BackendOptions, Conv2dGeometry, Device, Precision, WorkspaceOp,
    WorkspaceStep,
};
use crate::{Tensor, TensorError};
use host::{Workspace, bytes_of, bytes_of_mut, data, data_mut, words, words_mut};
use stax_alloc::{Allocator, Category, HostMemory};
use std::sync::Arc;

/// Default bound on one im2col column buffer: 4 MiB of f32 (it stays in the last-level cache).
const DEFAULT_WORKSPACE_BYTES: usize = 4 << 20;

/// The host backend: exact f32, NHWC/HWIO convolutions by im2col + GEMM.
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
        }))
    }

    /// How many im2col rows of `row_len` floats fit in the workspace bound (at least one).
    fn workspace_rows(&self, row_len: usize) -> usize {
        (self.workspace_bytes / 4 / row_len.max(1)).max(1)
    }

    /// A scratch buffer of `floats` f32, tagged [`Category::Workspace`], freed when dropped.
    fn workspace(&self, floats: usize) -> Result<Workspace, TensorError> {
        let bytes = floats
            .checked_mul(4)
            .ok_or_else(|| TensorError::InvalidArgument {
                op: "workspace",
                reason: format!("{floats} f32 overflow the address space"),
            })?;
        Workspace::new(self.allocator.allocate(bytes, Category::Workspace)?, floats)
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

    fn upload(&self, src: &[u8], dst: &mut Tensor) -> Result<(), TensorError> {
        const OP: &str = "upload";
        if src.len() != dst.bytes() {
            return Err(TensorError::HostLength {
                op: OP,
                expected: dst.bytes(),
                got: src.len(),
                shape: dst.shape().clone(),
            });
        }
        bytes_of_mut(OP, dst)?.copy_from_slice(src);
        Ok(())
    }

    fn download(&self, src: &Tensor, dst: &mut [u8]) -> Result<(), TensorError> {
        const OP: &str = "download";
        if dst.len() != src.bytes() {
            return Err(TensorError::HostLength {
                op: OP,
                expected: src.bytes(),
                got: dst.len(),
                shape: src.shape().clone(),
            });
        }
        dst.copy_from_slice(bytes_of(OP, src)?);
        Ok(())
    }

    /// A direct host copy (no staging buffer); same checks as the trait's default.
    fn copy(&self, src: &Tensor, dst: &mut Tensor) -> Result<(), TensorError> {
        const OP: &str = "copy";
        dst.expect_dtype(OP, src.dtype())?;
        dst.expect_shape(OP, src.shape())?;
        // Same shape and dtype, and both views check `bytes == numel * size`: equal lengths.
        bytes_of_mut(OP, dst)?.copy_from_slice(bytes_of(OP, src)?);
        Ok(())
    }

    fn fill(&self, t: &mut Tensor, value: f32) -> Result<(), TensorError> {
        elementwise::fill(t, value)
    }

    fn conv2d(
        &self,
        x: &Tensor,
        w: &Tensor,
        b: &Tensor,
        g: &Conv2dGeometry,
        y: &mut Tensor,
    ) -> Result<(), TensorError> {
        conv::forward(self, x, w, b, g, y)
    }

    fn conv2d_bwd_data(
        &self,
        dy: &Tensor,
        w: &Tensor,
        g: &Conv2dGeometry,
        dx: &mut Tensor,
    ) -> Result<(), TensorError> {
        conv::backward_data(self, dy, w, g, dx)
    }

    fn conv2d_bwd_filter(
        &self,
        x: &Tensor,
        dy: &Tensor,
        g: &Conv2dGeometry,
        dw: &mut Tensor,
        db: &mut Tensor,
    ) -> Result<(), TensorError> {
        conv::backward_filter(self, x, dy, g, dw, db)
    }

    fn matmul(
        &self,
        a: &Tensor,
        b: &Tensor,
        transpose_a: bool,
        transpose_b: bool,
        c: &mut Tensor,
    ) -> Result<(), TensorError> {
        matmul::matmul(a, b, transpose_a, transpose_b, c)
    }

    fn bias_add(&self, y: &mut Tensor, b: &Tensor) -> Result<(), TensorError> {
        elementwise::bias_add(y, b)
    }

    fn bias_grad(&self, dy: &Tensor, db: &mut Tensor) -> Result<(), TensorError> {
        elementwise::bias_grad(dy, db)
    }

    fn relu(&self, x: &mut Tensor, mask: Option<&mut Tensor>) -> Result<(), TensorError> {
        elementwise::relu(x, mask)
    }

    fn relu_bwd(&self, dy: &mut Tensor, mask: &Tensor) -> Result<(), TensorError> {
        elementwise::relu_bwd(dy, mask)
    }

    fn softmax_xent(
        &self,
        logits: &Tensor,
        labels: &Tensor,
        dlogits: &mut Tensor,
    ) -> Result<f32, TensorError> {
        softmax::softmax_xent(logits, labels, dlogits)
    }

    fn adam_update(
        &self,
        p: &mut Tensor,
        g: &Tensor,
        m: &mut Tensor,
        v: &mut Tensor,
        h: &AdamHyper,
    ) -> Result<(), TensorError> {
        adam::adam_update(p, g, m, v, h)
    }

    fn synchronize(&self) -> Result<(), TensorError> {
        Ok(())
    }

    fn driver_memory(&self) -> Result<Option<(u64, u64)>, TensorError> {
        Ok(None)
    }

    /// Convolutions allocate one im2col column buffer per call (none when pointwise); no other
    /// op allocates.
    fn workspace_schedule(&self, op: &WorkspaceOp) -> Result<Vec<WorkspaceStep>, TensorError> {
        Ok(WorkspaceStep::single(match op {
            WorkspaceOp::Conv { geometry, pass } => conv::workspace_bytes(self, geometry, *pass)?,
            WorkspaceOp::Matmul { .. }
            | WorkspaceOp::BiasGrad { .. }
            | WorkspaceOp::SoftmaxXent { .. } => 0,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::testing::{backend, tensor};
    use super::*;
    use crate::DType;

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
        be.upload(&src, &mut t).unwrap();
        let mut back = vec![0u8; 24];
        be.download(&t, &mut back).unwrap();
        assert_eq!(back, src);
        let e = be.upload(&src[..20], &mut t).unwrap_err();
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
        let e = be.download(&t, &mut [0u8; 28]).unwrap_err();
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
            be.upload(&src, &mut t),
            Err(TensorError::Aliased { op: "upload" })
        ));
    }

    #[test]
    fn copy_and_duplicate() {
        let be = backend();
        let src = tensor(&be, &[1.0, 2.0, 3.0, 4.0], [2, 2]);
        let mut dst = tensor(&be, &[0.0; 4], [2, 2]);
        be.copy(&src, &mut dst).unwrap();
        assert_eq!(dst.to_vec().unwrap(), vec![1.0, 2.0, 3.0, 4.0]);
        let dup = src.duplicate().unwrap();
        assert!(!dup.same_buffer(&src));
        assert_eq!(dup.to_vec().unwrap(), vec![1.0, 2.0, 3.0, 4.0]);
        let mut wrong = tensor(&be, &[0.0; 4], [4]);
        assert!(matches!(
            be.copy(&src, &mut wrong),
            Err(TensorError::Shape { .. })
        ));
        let mut words = Tensor::empty(&be, [2, 2], DType::U32, Category::Other).unwrap();
        assert!(matches!(
            be.copy(&src, &mut words),
            Err(TensorError::DType { .. })
        ));
        let _view = dst.clone();
        assert!(matches!(
            be.copy(&src, &mut dst),
            Err(TensorError::Aliased { op: "copy" })
        ));
    }

    #[test]
    fn empty_tensors_are_fine() {
        let be = backend();
        let mut t = Tensor::empty(&be, [0, 4], DType::F32, Category::Other).unwrap();
        be.upload(&[], &mut t).unwrap();
        be.fill(&mut t, 1.0).unwrap();
        assert_eq!(t.to_vec().unwrap(), Vec::<f32>::new());
    }

    #[test]
    fn workspace_is_bounded_and_freed_after_conv() {
        // 50 output pixels with 27-float patches: a whole-batch im2col would take 5400 bytes;
        // a 1 KiB bound gives chunks of 9 rows (972 bytes).
        let be = super::testing::backend_with_workspace(1024);
        let g = Conv2dGeometry::new(
            &[2, 5, 5, 3].into(),
            &[3, 3, 3, 4].into(),
            (1, 1),
            crate::Padding::Same,
        )
        .unwrap();
        let x = tensor(&be, &[0.5; 150], [2, 5, 5, 3]);
        let w = tensor(&be, &[0.25; 108], [3, 3, 3, 4]);
        let b = tensor(&be, &[0.0; 4], [4]);
        let mut y = Tensor::empty(&be, g.output_shape(), DType::F32, Category::Activation).unwrap();
        be.conv2d(&x, &w, &b, &g, &mut y).unwrap();
        let mut dx = Tensor::empty(&be, g.input_shape(), DType::F32, Category::Other).unwrap();
        be.conv2d_bwd_data(&y, &w, &g, &mut dx).unwrap();
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
            let q = WorkspaceOp::Conv { geometry: g, pass };
            assert_eq!(be.workspace_bytes(&q).unwrap(), 9 * 27 * 4);
        }
        assert_eq!(stats.by_category[ws].peak, 9 * 27 * 4);
        let mm = WorkspaceOp::Matmul { m: 4, n: 4, k: 4 };
        assert_eq!(be.workspace_bytes(&mm).unwrap(), 0);
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
        let q = WorkspaceOp::Conv {
            geometry: g,
            pass: crate::ConvPass::BackwardFilter,
        };
        assert_eq!(be.workspace_bytes(&q).unwrap(), 0);
        let be: Arc<dyn Backend> = be;
        let e = Tensor::empty(&be, [2 << 20], DType::F32, Category::Other).unwrap_err();
        assert!(matches!(e, TensorError::Alloc(_)), "{e}");
    }
}

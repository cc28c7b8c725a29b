//! The planning backend: runs the real step code without computing anything.
//!
//! [`PlanBackend`] implements [`Backend`] over an [`Allocator`] on a [`SimMemory`] of practically
//! unlimited capacity (virtual addresses, never dereferenced), `platform` strategy, with a trace
//! recording from the start. Ops check their outputs as the real backends do (shape, sole
//! ownership), allocate around themselves exactly the workspace blocks the *target* backend
//! says it would, in its order ([`Backend::workspace_schedule`]), and compute nothing:
//! `softmax_xent` returns a loss of 0, downloads give zeros. So a dry run of `apply`, the loss,
//! `vjp` and the optimizer's update on it allocates and frees, in the same order, exactly what
//! the real step on the target does, and every buffer is named as the real step names it
//! (its allocation's scope and role).

use std::sync::Arc;

use stax_alloc::{Allocator, Category, SimMemory, Strategy, Trace};
use stax_tensor::{
    AdamHyper, Backend, BackendId, Conv2dGeometry, ConvPass, Device, Precision, Shape, Tensor,
    TensorError, WorkspaceOp, WorkspaceStep,
};

/// The planning backend (see the module docs).
#[derive(Debug)]
pub(crate) struct PlanBackend {
    id: BackendId,
    target: Arc<dyn Backend>,
    allocator: Arc<Allocator>,
}

impl PlanBackend {
    /// A planning backend for `target`, recording from its first allocation.
    pub(crate) fn new(target: &Arc<dyn Backend>) -> Result<Arc<PlanBackend>, TensorError> {
        let sim = SimMemory::new(u64::MAX / 4, 256);
        let allocator = Allocator::new(Arc::new(sim), Strategy::Platform)?;
        allocator.start_trace();
        Ok(Arc::new(PlanBackend {
            id: BackendId::fresh(),
            target: target.clone(),
            allocator,
        }))
    }

    /// Number of trace events (allocations and frees) so far.
    pub(crate) fn events(&self) -> usize {
        let s = self.allocator.stats();
        (s.allocs + s.frees) as usize
    }

    /// Stops recording: the trace.
    pub(crate) fn finish(&self) -> Trace {
        self.allocator.stop_trace()
    }

    /// Allocates and frees the workspace the target uses for `op`, in the target's order
    /// ([`Backend::workspace_schedule`]), in the current scope (`2.conv/workspace`).
    fn workspace(&self, op: WorkspaceOp) -> Result<(), TensorError> {
        let mut held = Vec::new();
        for step in self.target.workspace_schedule(&op)? {
            match step {
                WorkspaceStep::Alloc(bytes) => {
                    held.push(Some(self.allocator.allocate(bytes, Category::Workspace)?));
                }
                WorkspaceStep::Free(i) => drop(held.get_mut(i).and_then(Option::take)),
            }
        }
        Ok(())
    }
}

fn output(op: &'static str, t: &Tensor, shape: &Shape) -> Result<(), TensorError> {
    t.expect_shape(op, shape)?;
    t.expect_unique(op)
}

impl Backend for PlanBackend {
    fn id(&self) -> BackendId {
        self.id
    }

    fn device(&self) -> Device {
        self.target.device()
    }

    fn allocator(&self) -> &Arc<Allocator> {
        &self.allocator
    }

    fn precision(&self) -> Precision {
        self.target.precision()
    }

    fn upload(&self, _src: &[u8], dst: &mut Tensor) -> Result<(), TensorError> {
        dst.expect_unique("upload")
    }

    fn download(&self, _src: &Tensor, dst: &mut [u8]) -> Result<(), TensorError> {
        dst.fill(0);
        Ok(())
    }

    fn copy(&self, src: &Tensor, dst: &mut Tensor) -> Result<(), TensorError> {
        output("copy", dst, src.shape())
    }

    fn fill(&self, t: &mut Tensor, _value: f32) -> Result<(), TensorError> {
        t.expect_unique("fill")
    }

    fn conv2d(
        &self,
        x: &Tensor,
        w: &Tensor,
        _b: &Tensor,
        g: &Conv2dGeometry,
        y: &mut Tensor,
    ) -> Result<(), TensorError> {
        const OP: &str = "conv2d";
        x.expect_shape(OP, &g.input_shape())?;
        w.expect_shape(OP, &g.filter_shape())?;
        output(OP, y, &g.output_shape())?;
        let pass = ConvPass::Forward;
        self.workspace(WorkspaceOp::Conv { geometry: *g, pass })
    }

    fn conv2d_bwd_data(
        &self,
        dy: &Tensor,
        _w: &Tensor,
        g: &Conv2dGeometry,
        dx: &mut Tensor,
    ) -> Result<(), TensorError> {
        const OP: &str = "conv2d_bwd_data";
        dy.expect_shape(OP, &g.output_shape())?;
        output(OP, dx, &g.input_shape())?;
        let pass = ConvPass::BackwardData;
        self.workspace(WorkspaceOp::Conv { geometry: *g, pass })
    }

    fn conv2d_bwd_filter(
        &self,
        x: &Tensor,
        dy: &Tensor,
        g: &Conv2dGeometry,
        dw: &mut Tensor,
        db: &mut Tensor,
    ) -> Result<(), TensorError> {
        const OP: &str = "conv2d_bwd_filter";
        x.expect_shape(OP, &g.input_shape())?;
        dy.expect_shape(OP, &g.output_shape())?;
        output(OP, dw, &g.filter_shape())?;
        output(OP, db, &Shape::new([g.c_out]))?;
        let pass = ConvPass::BackwardFilter;
        self.workspace(WorkspaceOp::Conv { geometry: *g, pass })
    }

    fn matmul(
        &self,
        a: &Tensor,
        b: &Tensor,
        transpose_a: bool,
        transpose_b: bool,
        c: &mut Tensor,
    ) -> Result<(), TensorError> {
        const OP: &str = "matmul";
        let (m, n, k) =
            stax_tensor::matmul_dims(OP, a.shape(), b.shape(), transpose_a, transpose_b)?;
        output(OP, c, &Shape::new([m, n]))?;
        self.workspace(WorkspaceOp::Matmul { m, n, k })
    }

    fn bias_add(&self, y: &mut Tensor, _b: &Tensor) -> Result<(), TensorError> {
        y.expect_unique("bias_add")
    }

    fn bias_grad(&self, dy: &Tensor, db: &mut Tensor) -> Result<(), TensorError> {
        let cols = dy.shape().last();
        output("bias_grad", db, &Shape::new([cols]))?;
        let rows = dy.numel().checked_div(cols).unwrap_or(0);
        self.workspace(WorkspaceOp::BiasGrad { rows, cols })
    }

    fn relu(&self, x: &mut Tensor, mask: Option<&mut Tensor>) -> Result<(), TensorError> {
        x.expect_unique("relu")?;
        match mask {
            Some(mask) => output("relu", mask, &Shape::new([x.numel().div_ceil(32)])),
            None => Ok(()),
        }
    }

    fn relu_bwd(&self, dy: &mut Tensor, _mask: &Tensor) -> Result<(), TensorError> {
        dy.expect_unique("relu_bwd")
    }

    fn softmax_xent(
        &self,
        logits: &Tensor,
        labels: &Tensor,
        dlogits: &mut Tensor,
    ) -> Result<f32, TensorError> {
        const OP: &str = "softmax_xent";
        let (rows, classes) = stax_tensor::backend::softmax_xent_dims(logits.shape())?;
        labels.expect_shape(OP, logits.shape())?;
        output(OP, dlogits, logits.shape())?;
        self.workspace(WorkspaceOp::SoftmaxXent { rows, classes })?;
        Ok(0.0)
    }

    fn adam_update(
        &self,
        p: &mut Tensor,
        g: &Tensor,
        m: &mut Tensor,
        v: &mut Tensor,
        _h: &AdamHyper,
    ) -> Result<(), TensorError> {
        const OP: &str = "adam_update";
        let shape = p.shape().clone();
        output(OP, p, &shape)?;
        g.expect_shape(OP, &shape)?;
        output(OP, m, &shape)?;
        output(OP, v, &shape)
    }

    fn synchronize(&self) -> Result<(), TensorError> {
        Ok(())
    }

    fn driver_memory(&self) -> Result<Option<(u64, u64)>, TensorError> {
        Ok(None)
    }

    fn workspace_schedule(&self, op: &WorkspaceOp) -> Result<Vec<WorkspaceStep>, TensorError> {
        self.target.workspace_schedule(op)
    }
}

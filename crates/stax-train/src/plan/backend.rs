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

use std::sync::{Arc, Mutex};

use stax_alloc::{Allocator, Category, SimMemory, Strategy, Trace};
use stax_tensor::backend::{
    Adam, AllFinite, BatchNorm, BatchNormBwd, BatchNormFold, BiasAdd, BiasGrad, Binary, Call, Cast,
    ChannelBiasAdd, ChannelBiasGrad, Concat, Conv2d, Conv2dBwdData, Conv2dBwdFilter, Copy, CopyIn,
    CopyOut, DenseAdam, Fill, Matmul, Pool2d, Pool2dBwd, SoftmaxXent, Split, Unary, UnaryBwd,
};
use stax_tensor::backend::{Dropout, DropoutBwd, IndexLossCall, Softmax, SoftmaxBwd};
use stax_tensor::{
    Backend, BackendId, Checked, ConvOps, Device, ElementwiseOps, LossOps, MatmulOps, MemoryOps,
    NormOps, OpDesc, OptimOps, Precision, TensorError, WorkspaceStep,
};

/// The planning backend (see the module docs).
#[derive(Debug)]
pub(crate) struct PlanBackend {
    id: BackendId,
    target: Arc<dyn Backend>,
    allocator: Arc<Allocator>,
    /// Every op the dry run met, in order of first appearance.
    ops: Mutex<Vec<OpDesc>>,
    /// Each call that allocated workspace: its op (an index into `ops`) and its events.
    spans: Mutex<Vec<OpSpan>>,
}

/// One op call's workspace in a trace: the op (an index into the plan's ops) and the events
/// (allocations and frees, numbered as the trace's) from its first workspace allocation to
/// its last free.
pub(crate) type OpSpan = (usize, std::ops::Range<usize>);

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
            ops: Mutex::new(Vec::new()),
            spans: Mutex::new(Vec::new()),
        }))
    }

    /// Number of trace events (allocations and frees) so far.
    pub(crate) fn events(&self) -> usize {
        let s = self.allocator.stats();
        (s.allocs + s.frees) as usize
    }

    /// Stops recording: the trace, every op the run met (in order of first appearance) and
    /// the spans of the calls that allocated workspace.
    pub(crate) fn finish(&self) -> (Trace, Vec<OpDesc>, Vec<OpSpan>) {
        let ops = std::mem::take(&mut *self.ops.lock().unwrap_or_else(|p| p.into_inner()));
        let spans = std::mem::take(&mut *self.spans.lock().unwrap_or_else(|p| p.into_inner()));
        (self.allocator.stop_trace(), ops, spans)
    }

    /// Allocates and frees the workspace the target uses for the op of `call`, in the
    /// target's order ([`Backend::workspace_schedule`]), in the current scope
    /// (`2.conv/workspace`), and notes the op and the call's span.
    fn replay<T: Call>(&self, call: &Checked<T>) -> Result<(), TensorError> {
        let op = call.get().desc();
        let index = {
            let mut ops = self.ops.lock().unwrap_or_else(|p| p.into_inner());
            match ops.iter().position(|o| *o == op) {
                Some(i) => i,
                None if op == OpDesc::Memory => usize::MAX,
                None => {
                    ops.push(op);
                    ops.len() - 1
                }
            }
        };
        let start = self.events();
        let mut held = Vec::new();
        for step in self.target.workspace_schedule(&op)? {
            match step {
                WorkspaceStep::Alloc(bytes) => {
                    held.push(Some(self.allocator.allocate(bytes, Category::Workspace)?));
                }
                WorkspaceStep::Free(i) => drop(held.get_mut(i).and_then(Option::take)),
            }
        }
        drop(held);
        let end = self.events();
        if end > start {
            let mut spans = self.spans.lock().unwrap_or_else(|p| p.into_inner());
            spans.push((index, start..end));
        }
        Ok(())
    }
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

    fn synchronize(&self) -> Result<(), TensorError> {
        Ok(())
    }

    fn driver_memory(&self) -> Result<Option<(u64, u64)>, TensorError> {
        Ok(None)
    }

    fn workspace_schedule(&self, op: &OpDesc) -> Result<Vec<WorkspaceStep>, TensorError> {
        self.target.workspace_schedule(op)
    }
}

/// The planning backend computes nothing: every op replays its target's workspace schedule;
/// downloads read zeros and the loss is 0.
macro_rules! replay_ops {
    ($($family:ident { $($op:ident($call:ident)),* })*) => {$(
        impl $family for PlanBackend {
            $(fn $op(&self, c: Checked<$call<'_>>) -> Result<(), TensorError> {
                self.replay(&c)
            })*
        }
    )*};
}

replay_ops! {
    ConvOps {
        conv2d(Conv2d),
        conv2d_bwd_data(Conv2dBwdData),
        conv2d_bwd_filter(Conv2dBwdFilter),
        pool2d(Pool2d),
        pool2d_bwd(Pool2dBwd)
    }
    MatmulOps { matmul(Matmul) }
    ElementwiseOps {
        unary(Unary),
        unary_bwd(UnaryBwd),
        binary(Binary),
        bias_add(BiasAdd),
        bias_grad(BiasGrad),
        softmax(Softmax),
        softmax_bwd(SoftmaxBwd),
        dropout(Dropout),
        dropout_bwd(DropoutBwd)
    }
    OptimOps { adam(Adam), dense_adam(DenseAdam), all_finite(AllFinite) }
    NormOps {
        batch_norm(BatchNorm),
        batch_norm_bwd(BatchNormBwd),
        channel_bias_add(ChannelBiasAdd),
        channel_bias_grad(ChannelBiasGrad),
        batch_norm_fold(BatchNormFold)
    }
}

impl MemoryOps for PlanBackend {
    fn upload(&self, c: Checked<CopyIn<'_>>) -> Result<(), TensorError> {
        self.replay(&c)
    }

    fn download(&self, c: Checked<CopyOut<'_>>) -> Result<(), TensorError> {
        c.into_inner().dst.fill(0);
        Ok(())
    }

    fn copy(&self, c: Checked<Copy<'_>>) -> Result<(), TensorError> {
        self.replay(&c)
    }

    fn fill(&self, c: Checked<Fill<'_>>) -> Result<(), TensorError> {
        self.replay(&c)
    }

    fn concat(&self, c: Checked<Concat<'_>>) -> Result<(), TensorError> {
        self.replay(&c)
    }

    fn split(&self, c: Checked<Split<'_>>) -> Result<(), TensorError> {
        self.replay(&c)
    }

    fn cast(&self, c: Checked<Cast<'_>>) -> Result<(), TensorError> {
        self.replay(&c)
    }
}

impl LossOps for PlanBackend {
    fn softmax_xent(&self, c: Checked<SoftmaxXent<'_>>) -> Result<f32, TensorError> {
        self.replay(&c)?;
        Ok(0.0)
    }

    fn index_loss(&self, c: Checked<IndexLossCall<'_>>) -> Result<f32, TensorError> {
        self.replay(&c)?;
        Ok(0.0)
    }
}

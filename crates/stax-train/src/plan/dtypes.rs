//! Exact bytes by element type: at the plan's peak ([`MemoryPlan::by_dtype`]), of its
//! parameters and optimizer state ([`MemoryPlan::state_by_dtype`]), and of a trainer's
//! (measured, every step: [`crate::StepReport::state_by_dtype`]).

use serde::Serialize;
use stax_layers::{Layer, Loss};
use stax_optim::Optimizer;
use stax_tensor::{Category, DType, Tensor};

use super::{MemoryPlan, PlannedBuffer};
use crate::Trainer;

/// Requested bytes by element type; `untyped` is workspace (raw bytes an op holds).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct DTypeBytes {
    /// f32 tensors.
    pub f32: u64,
    /// bf16 tensors.
    pub bf16: u64,
    /// f16 tensors.
    pub f16: u64,
    /// u32 tensors (bit masks, argmax indices, class labels).
    pub u32: u64,
    /// Workspace: buffers of no dtype.
    pub untyped: u64,
}

impl DTypeBytes {
    /// Counts `bytes` of `dtype` (`None`: untyped).
    pub fn add(&mut self, dtype: Option<DType>, bytes: u64) {
        let slot = match dtype {
            Some(DType::F32) => &mut self.f32,
            Some(DType::BF16) => &mut self.bf16,
            Some(DType::F16) => &mut self.f16,
            Some(DType::U32) => &mut self.u32,
            None => &mut self.untyped,
        };
        *slot += bytes;
    }

    /// Every dtype's bytes together.
    pub fn total(&self) -> u64 {
        self.f32 + self.bf16 + self.f16 + self.u32 + self.untyped
    }

    /// The bytes of `tensors`, by dtype.
    pub fn of_tensors<'a>(tensors: impl IntoIterator<Item = &'a Tensor>) -> DTypeBytes {
        let mut b = DTypeBytes::default();
        for t in tensors {
            b.add(Some(t.dtype()), t.bytes() as u64);
        }
        b
    }

    /// The bytes of `buffers`, by dtype.
    pub(crate) fn of_buffers<'a>(buffers: impl IntoIterator<Item = &'a PlannedBuffer>) -> Self {
        let mut b = DTypeBytes::default();
        for buf in buffers {
            b.add(buf.dtype, buf.bytes);
        }
        b
    }
}

impl MemoryPlan {
    /// The buffers live at step event `event` (`None`: before the step's first event).
    fn live_at(&self, event: Option<usize>) -> impl Iterator<Item = &PlannedBuffer> {
        self.buffers.iter().filter(move |b| match event {
            Some(e) => b.alloc.is_none_or(|a| a <= e) && b.free.is_none_or(|f| f > e),
            None => b.alloc.is_none(),
        })
    }

    /// Bytes by dtype of the buffers live at the peak: they sum to `peak.bytes`.
    pub fn by_dtype(&self) -> DTypeBytes {
        DTypeBytes::of_buffers(self.live_at(self.peak.event))
    }

    /// Bytes by dtype of the parameters and the optimizer's state: they sum to
    /// [`MemoryPlan::state_bytes`].
    pub fn state_by_dtype(&self) -> DTypeBytes {
        let state = [Category::Parameter, Category::OptimizerState];
        DTypeBytes::of_buffers(self.live_at(None).filter(|b| state.contains(&b.category)))
    }
}

impl<L: Layer, O: Optimizer, F: Loss> Trainer<L, O, F> {
    /// Bytes by dtype of the parameters and the optimizer's state, as they are now.
    pub fn state_by_dtype(&self) -> DTypeBytes {
        let params = self.params().leaves();
        DTypeBytes::of_tensors(params.into_iter().chain(self.state().tree.leaves()))
    }
}

//! Calibration at set-up: cuDNN's algorithm choice for every conv pass of the step, then the
//! headroom rule ("workspace that costs no peak", issue 12), kept only where the run still
//! fits the device.

use super::Trainer;
use crate::TrainError;
use crate::plan::{self, Feed};
use stax_layers::{Layer, Loss};
use stax_optim::Optimizer;

impl<L: Layer, O: Optimizer, F: Loss> Trainer<L, O, F> {
    /// Makes the ops of a step with batch size `batch` exact on this trainer's backend
    /// ([`crate::MemoryPlan::calibrate`]: on CUDA, cuDNN's algorithm search for every
    /// convolution pass not chosen yet; it allocates scratch buffers on the device and releases
    /// them before it returns), then gives each op the workspace the step has free below its
    /// peak while the op runs ([`crate::MemoryPlan::allot_headroom`]: a faster cuDNN algorithm
    /// where it costs no peak; an explicit workspace limit of the backend caps it). The step's
    /// planned peak stays what it was. A larger block can still grow what a caching allocator
    /// reserves: where the step, placed or prefetched, fitted the device's memory
    /// ([`plan::default_budget`]) before the allotment and no longer does, the allotment is
    /// revoked ([`stax_tensor::Backend::revoke_workspace`]). A step of a batch size not
    /// calibrated calibrates itself first (without the allotment).
    ///
    /// # Errors
    /// Planning errors; the device's errors (out of memory for the search's buffers).
    pub fn calibrate(&self, batch: usize) -> Result<(), TrainError> {
        self.plan(batch)?.calibrate(self.backend())?;
        let fitted = self.fitting(batch)?;
        if self.plan(batch)?.allot_headroom(self.backend())? > 0 {
            let fits = self.fitting(batch)?;
            let lost = fitted.iter().zip(&fits).any(|(was, is)| *was && !*is);
            if lost {
                self.backend().revoke_workspace()?;
            }
        }
        Ok(())
    }

    /// Whether the step at `batch`, fed as this trainer is and prefetched (as the loop may
    /// be later), fits the device's memory; nothing when the backend has no memory size.
    fn fitting(&self, batch: usize) -> Result<Vec<bool>, TrainError> {
        let budget = match plan::default_budget(self.backend().as_ref()) {
            Ok(budget) => budget,
            Err(TrainError::NoBudget { .. }) => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        [self.feed(), Feed::Prefetched]
            .into_iter()
            .map(|feed| self.plan_with_feed(batch, feed)?.fits(budget))
            .collect()
    }
}

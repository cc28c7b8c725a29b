//! A training loop's batches, prefetched: while the device runs step k, batch k + 1 is being
//! copied on a second stream and batch k + 2 is gathered on the host, as PyTorch's
//! `DataLoader(pin_memory=True)` with `.to(device, non_blocking=True)` does.
//!
//! Batch k + 1's device buffers are allocated and its copy started just before step k is
//! queued (from pinned memory on CUDA, [`crate::HostBatch::upload`]), so they are live during
//! step k: the plan of a prefetched loop ([`crate::plan::Feed::Prefetched`]) counts two
//! batches, and its peak is one batch above [`crate::plan::Feed::Placed`]'s.
//!
//! ```
//! use stax_train::{Trainer, data::{Loader, fashion_mnist_2class}, plan::Feed};
//! use stax_layers::{serial, Conv, Dense, Flatten, Relu};
//! use stax_tensor::{BackendOptions, Device, Shape};
//! use stax_optim::Adam;
//! let cpu = Device::Cpu.open(&BackendOptions::default())?;
//! let (train, _) = fashion_mnist_2class()?;
//! let model = serial![Conv::same(4, (3, 3)), Relu, Flatten, Dense(2)];
//! let mut trainer = Trainer::new(model, Shape::new([8, 12, 12, 3]), Adam::new(1e-3), &cpu, 0)?;
//! let loader = Loader::new(train.len(), 8, 0)?;
//! let mut feed = trainer.prefetch(&train, loader.batches(0).take(3));
//! let plan = trainer.plan(8)?; // now for Feed::Prefetched
//! let mut peaks = Vec::new();
//! while let Some(report) = trainer.step_prefetched(&mut feed)? {
//!     peaks.push(report.memory.peak);
//! }
//! // steps 1 and 2 ran with the next batch already placed, as planned; step 3 had none
//! assert_eq!(peaks[..2], [plan.peak.bytes; 2]);
//! assert_eq!(peaks[2], plan.peak.bytes - 4 * 8 * (12 * 12 * 3 + 2));
//! assert_eq!((trainer.steps(), trainer.feed()), (3, Feed::Prefetched));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::sync::Arc;

use stax_layers::{Layer, Loss};
use stax_optim::Optimizer;
use stax_tensor::{Backend, Upload};

use crate::data::Dataset;
use crate::plan::Feed;
use crate::report::StepReport;
use crate::staging::{HostBatch, HostStaging, Labels, Layout};
use crate::{TrainError, Trainer};

/// The batches of a prefetched loop (see the module docs), made by [`Trainer::prefetch`].
pub struct Prefetcher<'d> {
    dataset: &'d Dataset,
    batches: Box<dyn Iterator<Item = Vec<usize>> + 'd>,
    staging: HostStaging,
    backend: Arc<dyn Backend>,
    input: stax_tensor::Shape,
    /// The labels the trainer's loss reads.
    labels: Labels,
    /// The next batch, placed (its copy may be running).
    placed: Option<(Upload, Upload)>,
    /// The batch after it, gathered on the host (or the error gathering it gave).
    gathered: Option<Result<HostBatch, TrainError>>,
}

impl std::fmt::Debug for Prefetcher<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prefetcher")
            .field("input", &self.input)
            .field("placed", &self.placed)
            .field("gathered", &self.gathered)
            .finish_non_exhaustive()
    }
}

impl Prefetcher<'_> {
    /// Gathers the iterator's next batch on the host; None at the end.
    fn gather_next(&mut self) -> Option<Result<HostBatch, TrainError>> {
        let indices = self.batches.next()?;
        let layout = match Layout::for_input(&self.input, self.dataset) {
            Ok(l) => l.with_labels(self.labels),
            Err(e) => return Some(Err(e)),
        };
        Some(
            self.staging
                .gather(&self.backend, self.dataset, &indices, layout),
        )
    }

    /// The next batch placed (its copy started): the one placed already, else the one
    /// gathered, else the iterator's next (gathered now). None at the end.
    fn take_placed(&mut self) -> Result<Option<(Upload, Upload)>, TrainError> {
        if let Some(placed) = self.placed.take() {
            return Ok(Some(placed));
        }
        match self.gathered.take().or_else(|| self.gather_next()) {
            Some(batch) => Ok(Some(batch?.upload(&self.backend)?)),
            None => Ok(None),
        }
    }
}

impl<L: Layer, O: Optimizer, F: Loss> Trainer<L, O, F> {
    /// A prefetched loop over `batches` (example indices of `dataset`, one `Vec` per step) for
    /// [`Trainer::step_prefetched`]. From now on this trainer's plans count the prefetched
    /// batch ([`Feed::Prefetched`]). Nothing is gathered until the first step.
    pub fn prefetch<'d>(
        &mut self,
        dataset: &'d Dataset,
        batches: impl IntoIterator<Item = Vec<usize>> + 'd,
    ) -> Prefetcher<'d> {
        self.set_feed(Feed::Prefetched);
        Prefetcher {
            dataset,
            batches: Box::new(batches.into_iter()),
            staging: self.staging().clone(),
            backend: self.backend().clone(),
            input: self.input_shape().clone(),
            labels: Labels::for_dtype(self.loss().labels_dtype()),
            placed: None,
            gathered: None,
        }
    }

    /// One training step ([`Trainer::step`]) on `feed`'s next batch, with the batch after it
    /// placed before the step starts (its copy overlapping the step) and the one after that
    /// gathered on the host while the device computes. `Ok(None)` when `feed` is exhausted.
    ///
    /// An error gathering a later batch (bad data) is returned by the step that would use it.
    /// A failed step (bad data, out of memory, non-finite loss) skips its batch: the next call
    /// trains on the batch after it.
    ///
    /// # Errors
    /// As [`Trainer::step`]; data errors from [`HostStaging::gather`]; copy errors.
    pub fn step_prefetched(
        &mut self,
        feed: &mut Prefetcher<'_>,
    ) -> Result<Option<StepReport>, TrainError> {
        // before any batch of the feed is placed: the rehearsal replays the loop's placements
        self.rehearse()?;
        let Some((x, y)) = feed.take_placed()? else {
            return Ok(None);
        };
        let (x, y) = (x.wait()?, y.wait()?);
        match feed.take_placed() {
            Ok(next) => feed.placed = next,
            Err(e) => feed.gathered = Some(Err(e)), // the next call reports it
        }
        let mut gather = || {
            if feed.gathered.is_none() {
                feed.gathered = feed.gather_next();
            }
        };
        let report = self.step_with(&[(&x, &y)], &mut gather, None)?;
        Ok(Some(report))
    }
}

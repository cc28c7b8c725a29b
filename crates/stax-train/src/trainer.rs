//! The trainer: a model, its parameters and optimizer state on one backend, stepped with an
//! exact memory report.
//!
//! The step's computation is [`crate::step`]'s, the same function the memory plan's dry run
//! runs ([`crate::plan::MemoryPlan`]), so the plan allocates exactly what the step does.

use std::sync::Arc;
use std::time::Instant;

use stax_layers::layer::expect_params;
use stax_layers::{
    Layer, LayerError, Loss, ParamSource, Profiler, Rng, SoftmaxCrossEntropy, init_params,
};
use stax_optim::{Adam, OptState, Optimizer};
use stax_tensor::{Backend, Params, Shape, Strategy, Tensor, TensorError, Tree};

use crate::plan::{self, Feed, MemoryPlan};
use crate::report::{MemoryReport, StepOom, StepReport};
use crate::staging::{HostStaging, Labels, Layout};
use crate::step::{Parts, check_input_shape, output_shape, run_step};
use crate::{Phase, TrainError};

mod calibrate;
mod eval;
mod profile;
pub use eval::summarize;
pub use profile::{KindTime, StepProfile};

/// A model, its parameters, loss and optimizer state on one backend.
///
/// The step is `value_and_grad` of `loss(apply(params, x), y)` followed by the optimizer's
/// update, as in the seed's JAX loop, but with parameters and state updated in place (what
/// `donate_argnums` buys in JAX) and every buffer freed at its last use. Inputs are any
/// `[batch, ...]` shape: NHWC images for a CNN, `[batch, features]` for an MLP.
#[derive(Debug)]
pub struct Trainer<L: Layer, O: Optimizer = Adam, F: Loss = SoftmaxCrossEntropy> {
    model: L,
    pub(crate) params: Params,
    opt: O,
    pub(crate) state: OptState,
    loss: F,
    backend: Arc<dyn Backend>,
    input: Shape,
    pub(crate) steps: u64,
    pub(crate) staging: HostStaging,
    feed: Feed,
    /// The feed whose loop memory the allocator holds ([`MemoryPlan::rehearse`]).
    rehearsed: Option<Feed>,
    /// The seed of the parameters and of every step's RNG key.
    pub(crate) seed: u64,
    /// This rank's part in data-parallel training ([`Trainer::data_parallel`]).
    pub(crate) dp: Option<crate::DataParallel>,
    /// The dynamic loss scale of the next step ([`crate::loss_scale`]).
    pub(crate) loss_scale: Option<crate::DynamicLossScale>,
}

impl<L: Layer, O: Optimizer> Trainer<L, O> {
    /// [`Trainer::with_loss`] with softmax cross-entropy, the seed's loss.
    ///
    /// # Errors
    /// As [`Trainer::with_loss`].
    pub fn new(
        model: L,
        input: Shape,
        opt: O,
        backend: &Arc<dyn Backend>,
        seed: u64,
    ) -> Result<Self, TrainError> {
        Trainer::with_loss(model, input, opt, SoftmaxCrossEntropy, backend, seed)
    }

    /// [`Trainer::from_params_with_loss`] with softmax cross-entropy, the seed's loss.
    ///
    /// # Errors
    /// As [`Trainer::from_params_with_loss`].
    pub fn from_params(
        model: L,
        input: Shape,
        opt: O,
        backend: &Arc<dyn Backend>,
        params: Params,
        state: Option<OptState>,
    ) -> Result<Self, TrainError> {
        let loss = SoftmaxCrossEntropy;
        Trainer::from_params_with_loss(model, input, opt, loss, backend, params, state)
    }
}

impl<L: Layer, O: Optimizer, F: Loss> Trainer<L, O, F> {
    /// Initializes parameters (stax's `init_fun` with `Rng::new(seed)`) for inputs of shape
    /// `input` (`[batch, ...]`), and the optimizer's state, on `backend` (step `k`'s RNG key,
    /// for `Dropout`, is `Rng::fold_in(seed, k)`); then calibrates the
    /// step's ops at that batch size ([`Trainer::calibrate`]), so that plans and steps are
    /// exact from the first step on.
    ///
    /// # Errors
    /// Shape errors before any allocation; [`TrainError::InitOutOfMemory`] when the parameters
    /// and the optimizer's state do not fit; calibration errors.
    pub fn with_loss(
        model: L,
        input: Shape,
        opt: O,
        loss: F,
        backend: &Arc<dyn Backend>,
        seed: u64,
    ) -> Result<Self, TrainError> {
        check_input_shape(&input)?;
        output_shape(&model, &input)?;
        let explain = |e: TrainError| match e.oom() {
            Some(request) => TrainError::InitOutOfMemory {
                state_bytes: MemoryPlan::new(&model, &input, &opt, backend)
                    .map_or(0, |p| p.state_bytes()),
                request: Box::new(request.clone()),
            },
            None => e,
        };
        let source = ParamSource::Random(&mut Rng::new(seed));
        let (_, params) = init_params(&model, &Tree::leaf(input.clone()), backend, source)
            .map_err(|e| explain(e.into()))?;
        let state = opt.init(&params).map_err(|e| explain(e.into()))?;
        let mut trainer =
            Trainer::from_params_with_loss(model, input, opt, loss, backend, params, Some(state))?;
        trainer.seed = seed;
        Ok(trainer)
    }

    /// A trainer of `model` for inputs `input` (`[batch, ...]`) from given parameters (a
    /// tree as [`init_params`] makes: the model's paths, shapes and dtypes, on `backend`, each
    /// the only handle to its buffer) and optimizer state (`None`: a fresh
    /// [`Optimizer::init`]); its step count is the state's count, its steps' RNG seed 0.
    /// Calibrates as [`Trainer::with_loss`] does.
    ///
    /// # Errors
    /// Shape errors; [`stax_layers::LayerError::Mismatch`] naming the first parameter whose
    /// path, shape or dtype is not the model's; [`stax_layers::LayerError::Tensor`] naming a
    /// parameter on another backend or shared with another tensor; the optimizer's
    /// [`Optimizer::check_state`] errors; calibration errors.
    pub fn from_params_with_loss(
        model: L,
        input: Shape,
        opt: O,
        loss: F,
        backend: &Arc<dyn Backend>,
        params: Params,
        state: Option<OptState>,
    ) -> Result<Self, TrainError> {
        check_input_shape(&input)?;
        output_shape(&model, &input)?;
        let specs = model.param_specs(&Tree::leaf(input.clone()))?;
        expect_params(&params, &model, &specs)?;
        for (path, t) in params.paths() {
            let owned = t.expect_on("from_params", backend);
            owned
                .and_then(|()| t.expect_unique("from_params"))
                .map_err(|source| LayerError::Tensor {
                    path: path.to_string(),
                    source,
                })?;
        }
        let state = match state {
            Some(s) => {
                opt.check_state(&s, &params)?;
                s
            }
            None => opt.init(&params)?,
        };
        let trainer = Trainer {
            loss_scale: crate::DynamicLossScale::for_model(&model, &input),
            rehearsed: None,
            model,
            params,
            opt,
            steps: u64::from(state.count),
            state,
            loss,
            backend: backend.clone(),
            input,
            staging: HostStaging::new()?,
            feed: Feed::Placed,
            seed: 0,
            dp: None,
        };
        let mut trainer = trainer;
        trainer.calibrate(trainer.input.dims()[0])?;
        trainer.rehearse()?;
        Ok(trainer)
    }

    /// With an optimizer applied in the backward pass, reserves the loop's memory for the
    /// current feed before its first step ([`MemoryPlan::rehearse`]), so that no step can run
    /// out of memory after a parameter was updated: the one way a failed step could otherwise
    /// leave state changed. A rehearsal for another feed first returns the cached segments of
    /// the last one, so the allocator holds what the set-up left, as the plan's replay assumes.
    /// Running out of memory is [`TrainError::OutOfMemory`] with the largest batch that fits.
    pub(crate) fn rehearse(&mut self) -> Result<(), TrainError> {
        // `bfc` holds its whole arena from the start: nothing to reserve
        let arena = matches!(self.backend.allocator().strategy(), Strategy::Bfc { .. });
        // accumulated steps update nothing in the backward pass
        let accumulated = self.feed.micro_batches() > 1;
        if arena
            || accumulated
            || self.opt.in_backward(1).is_none()
            || self.rehearsed == Some(self.feed)
        {
            return Ok(());
        }
        let batch = self.input.dims()[0];
        let plan = self.plan(batch)?;
        if self.rehearsed.is_some() {
            self.backend
                .allocator()
                .empty_cache()
                .map_err(TensorError::from)?;
        }
        plan.rehearse(self.backend.allocator())
            .map_err(|e| match self.explain(e, batch) {
                TrainError::OutOfMemory(mut oom) => {
                    oom.at_set_up = true;
                    TrainError::OutOfMemory(oom)
                }
                e => e,
            })?;
        self.rehearsed = Some(self.feed);
        Ok(())
    }

    fn parts(&self) -> Parts<'_> {
        Parts {
            dp: self.dp.as_ref(),
            loss_scale: self.loss_scale.map(|s| s.scale),
            ..Parts::new(&self.model, &self.input, &self.loss, &self.opt)
        }
    }

    /// The parts of a step of `batch` examples: a batch larger than the one this trainer was
    /// set up for (whose memory [`Trainer::rehearse`] reserved) collects every gradient and
    /// updates after the backward pass, so that running out of memory changes nothing.
    pub(crate) fn parts_for(&self, batch: usize) -> Parts<'_> {
        Parts {
            in_backward: self.in_backward_for(batch),
            ..self.parts()
        }
    }

    /// See [`Trainer::parts_for`].
    fn in_backward_for(&self, batch: usize) -> bool {
        batch <= self.input.dims()[0]
    }

    /// The model.
    pub fn model(&self) -> &L {
        &self.model
    }

    /// Current parameters.
    pub fn params(&self) -> &Params {
        &self.params
    }

    /// Current optimizer state.
    pub fn state(&self) -> &OptState {
        &self.state
    }

    /// The optimizer.
    pub fn optimizer(&self) -> &O {
        &self.opt
    }

    /// The loss.
    pub fn loss(&self) -> &F {
        &self.loss
    }

    /// The backend everything lives on.
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.backend
    }

    /// Steps taken so far.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// The input shape `[batch, ...]` the trainer was built for.
    pub fn input_shape(&self) -> &Shape {
        &self.input
    }

    fn check_batch(&self, x: &Tensor, y: &Tensor) -> Result<(), TrainError> {
        self.check_inputs(x)?;
        let labels = self
            .loss
            .labels_shape(&output_shape(&self.model, x.shape())?);
        let dtype = self.loss.labels_dtype();
        if y.shape() != &labels || y.dtype() != dtype {
            return Err(TrainError::BatchShape {
                what: "labels",
                expected: format!("{dtype} {labels} for {}", self.loss.name()),
                got: y.shape().clone(),
            });
        }
        Ok(())
    }

    /// Checks a batch of inputs: f32, `[n, ..]` with n > 0 and the trainer's example shape.
    fn check_inputs(&self, x: &Tensor) -> Result<(), TrainError> {
        // inputs are staged in f32; a model computing in bf16 casts them itself (`Mixed`)
        if x.dtype() != stax_tensor::DType::F32 {
            return Err(stax_tensor::TensorError::DType {
                op: "trainer inputs",
                operand: Some("x"),
                expected: stax_tensor::DType::F32,
                got: x.dtype(),
            }
            .into());
        }
        let want = &self.input.dims()[1..];
        if x.dims().first().is_none_or(|&n| n == 0) || &x.dims()[1..] != want {
            return Err(TrainError::BatchShape {
                what: "inputs",
                expected: format!("[n, {}] with n > 0", dims(want)),
                got: x.shape().clone(),
            });
        }
        Ok(())
    }

    /// One training step on a placed batch: inputs `[n, ...]` as the trainer's input shape
    /// (any batch size `n`) and labels as the loss reads them (one-hot `[n, k]` for softmax
    /// cross-entropy), both on this trainer's backend.
    ///
    /// The allocator's peak is reset at the start, so the report's `peak` is this step's.
    /// Nothing is updated unless the forward and backward passes succeed and the loss is finite:
    /// on error (out of memory, non-finite loss) parameters and optimizer state are those of the
    /// last finished step, and the allocator is coalesced ([`stax_alloc::Allocator::coalesce`]).
    ///
    /// # Errors
    /// [`TrainError::OutOfMemory`] when any allocation of the step fails, with the breakdown,
    /// the failed request and its name (`2.conv/workspace`), and the largest batch that fits;
    /// [`TrainError::BatchShape`], [`TrainError::NonFiniteLoss`] and other tensor errors.
    pub fn step(&mut self, x: &Tensor, y: &Tensor) -> Result<StepReport, TrainError> {
        self.step_with(&[(x, y)], &mut || {}, None)
    }

    /// One update from several micro-batches (gradient accumulation, optax's `MultiSteps`):
    /// each one's forward and backward pass in turn, their gradients summed in place in one
    /// buffer per parameter (the first micro-batch's), the mean taken by scaling each loss
    /// gradient by `1 / n`, then one optimizer step. With equal micro-batches this is the
    /// step of their concatenation, up to f32 summation order, in the memory of one
    /// micro-batch's activations plus one set of gradients. The report's loss is the mean of
    /// the micro-batches' losses. From now on this trainer's plans are of this feed
    /// ([`Feed::Accumulated`]: every micro-batch placed before the step).
    ///
    /// # Errors
    /// [`TrainError::ZeroBatchSize`] for no micro-batches; as [`Trainer::step`] for each one.
    pub fn step_accumulated(
        &mut self,
        micro: &[(&Tensor, &Tensor)],
    ) -> Result<StepReport, TrainError> {
        if micro.len() > 1 {
            self.set_feed(Feed::Accumulated(micro.len()));
        }
        self.step_with(micro, &mut || {}, None)
    }

    /// [`Trainer::step`] of `batches` (several: accumulated), running `meanwhile` on the host
    /// after the step's work is queued and before waiting for the device (where the next
    /// batch is gathered), its phases and layers timed into `profiler` if given.
    pub(crate) fn step_with(
        &mut self,
        batches: &[(&Tensor, &Tensor)],
        meanwhile: &mut dyn FnMut(),
        profiler: Option<&Profiler>,
    ) -> Result<StepReport, TrainError> {
        let Some(&(x, _)) = batches.first() else {
            return Err(TrainError::ZeroBatchSize { op: "step" });
        };
        for &(x, y) in batches {
            self.check_batch(x, y)?;
        }
        self.rehearse()?;
        let allocator = self.backend.allocator().clone();
        allocator.reset_peak();
        let start = Instant::now();
        let step = self.steps + 1;
        let (mut loss_at, mut marked) = (None, Ok(()));
        let be = &*self.backend;
        let run = run_step(
            Parts {
                in_backward: self.in_backward_for(x.dims()[0]),
                loss_scale: self.loss_scale.map(|s| s.scale),
                dp: self.dp.as_ref(),
                profiler,
                ..Parts::new(&self.model, &self.input, &self.loss, &self.opt)
            },
            &mut self.params,
            &mut self.state,
            batches,
            (step, self.seed),
            &mut |phase| {
                if phase == Phase::Backward && loss_at.is_none() {
                    loss_at = Some(start.elapsed());
                }
                if let (Some(p), Ok(())) = (profiler, &marked) {
                    marked = p.set_phase(be, phase.name());
                }
            },
        );
        let marked = marked.and_then(|()| profiler.map_or(Ok(()), |p| p.stop(be)));
        let queued = start.elapsed();
        let (loss, finite) = run.map_err(|e| {
            // The failed step's buffers are freed; start the next one from the state its live
            // buffers define, not from the order the unwinding freed them in.
            allocator.coalesce();
            self.explain(e, x.dims()[0])
        })?;
        marked?;
        meanwhile();
        self.backend.synchronize()?;
        let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
        let step_ms = ms(start.elapsed());
        self.steps = step;
        Ok(StepReport {
            step,
            loss,
            step_ms,
            loss_ms: loss_at.map_or(ms(queued), ms),
            queued_ms: ms(queued),
            memory: self.memory_report()?,
            state_by_dtype: self.state_by_dtype(),
            loss_scale: self.adjust_loss_scale(finite),
        })
    }

    /// Marks this trainer as fed by [`Trainer::step_prefetched`], so that its plans
    /// ([`Trainer::plan`], [`Trainer::max_batch_that_fits`], out-of-memory diagnoses) count the
    /// prefetched batch.
    pub(crate) fn set_feed(&mut self, feed: Feed) {
        self.feed = feed;
    }

    /// How batches reach this trainer's steps (what its plans assume).
    pub fn feed(&self) -> Feed {
        self.feed
    }

    /// The memory report now: the backend's allocator (peaks since the step started), its
    /// pinned staging if any, and this trainer's host staging. Host peaks are reset after
    /// reading, so each report covers the placements since the previous one.
    ///
    /// # Errors
    /// Driver errors from [`Backend::driver_memory`].
    pub fn memory_report(&self) -> Result<MemoryReport, TrainError> {
        let report = MemoryReport::read(&*self.backend)?.with_host(self.staging.allocator());
        let report = MemoryReport {
            comm: self.dp.as_ref().map(crate::DataParallel::report),
            ..report
        };
        self.staging.allocator().reset_peak();
        if let Some(pinned) = self.backend.staging_allocator() {
            pinned.reset_peak();
        }
        Ok(report)
    }

    /// Turns an out-of-memory inside step `self.steps + 1` into [`TrainError::OutOfMemory`]
    /// (the failed request names its buffer itself); other errors pass through.
    fn explain(&self, e: TrainError, batch: usize) -> TrainError {
        if let TrainError::UpdatedBeforeFailure { applied, source } = e {
            let source = Box::new(self.explain(*source, batch));
            return TrainError::UpdatedBeforeFailure { applied, source };
        }
        let Some(request) = e.oom().cloned() else {
            return e;
        };
        let memory = MemoryReport::read(&*self.backend)
            .map(|m| m.with_host(self.staging.allocator()))
            .unwrap_or_default();
        let planned_peak = self.plan(batch).ok().map(|p| p.peak.bytes);
        let max_batch = plan::default_budget(&*self.backend)
            .ok()
            .and_then(|b| self.max_batch_that_fits(Some(b)).ok());
        let buffer = (!request.name.is_empty()).then(|| request.name.clone());
        TrainError::OutOfMemory(Box::new(StepOom {
            step: self.steps + 1,
            batch,
            request,
            buffer,
            memory,
            planned_peak,
            max_batch,
            last_finished_step: self.steps,
            at_set_up: false,
        }))
    }

    /// The trainer's input shape with batch size `batch`.
    fn input_with(&self, batch: usize) -> Shape {
        let mut d = self.input.dims().to_vec();
        d[0] = batch;
        Shape::new(d)
    }

    /// The memory plan of one step with batch size `batch` on this trainer's backend, fed as
    /// [`Trainer::feed`] says (a dry run on a planning backend: nothing is allocated here).
    ///
    /// # Errors
    /// Shape errors; [`stax_tensor::TensorError`]s when the backend cannot size a workspace.
    pub fn plan(&self, batch: usize) -> Result<MemoryPlan, TrainError> {
        let input = self.input_with(batch);
        MemoryPlan::of(self.parts_for(batch), &input, &self.backend, self.feed)
    }

    /// The largest batch whose step fits `budget` bytes of this backend's memory (by the
    /// plan for [`Trainer::feed`], replayed on an allocator like this one's; see
    /// [`plan::max_batch_that_fits`]). `None`: the backend's free memory plus what its
    /// allocator holds ([`plan::default_budget`]). The plans include the workspace the
    /// headroom rule gave this trainer's batch size at set-up ([`Trainer::calibrate`]),
    /// checked against the backend's own memory then: on a backend of no memory size (a
    /// plain CPU backend) a smaller `budget` given here may hold a batch or two less than
    /// with an explicit workspace limit.
    ///
    /// # Errors
    /// [`TrainError::NoBudget`] when `budget` is None and the backend reports no memory size;
    /// planning errors.
    pub fn max_batch_that_fits(&self, budget: Option<u64>) -> Result<usize, TrainError> {
        plan::fit::largest_batch(self.parts(), &self.input, &self.backend, self.feed, budget)
    }

    /// Places a batch of `dataset` for this trainer (its [`Trainer::layout`]: one-hot or index
    /// labels as its loss reads them), staged through the trainer's host allocator so host
    /// bytes show in the reports.
    ///
    /// # Errors
    /// As [`HostStaging::place_batch`]; [`TrainError::BatchShape`] when the trainer's input
    /// cannot take the data set's images ([`Layout::for_input`]).
    pub fn place_batch(
        &self,
        dataset: &crate::data::Dataset,
        indices: &[usize],
    ) -> Result<(Tensor, Tensor), TrainError> {
        let layout = self.layout(dataset)?;
        self.staging
            .place_batch(&self.backend, dataset, indices, layout)
    }

    /// How this trainer's batches of `dataset` are laid out: its input's images
    /// ([`Layout::for_input`]) and the labels its loss reads ([`Labels::for_dtype`]).
    ///
    /// # Errors
    /// As [`Layout::for_input`].
    pub fn layout(&self, dataset: &crate::data::Dataset) -> Result<Layout, TrainError> {
        let labels = Labels::for_dtype(self.loss.labels_dtype());
        Ok(Layout::for_input(&self.input, dataset)?.with_labels(labels))
    }

    /// The host staging the trainer places batches through.
    pub fn staging(&self) -> &HostStaging {
        &self.staging
    }
}

/// `"28, 28, 3"`: dimensions for messages.
fn dims(d: &[usize]) -> String {
    let parts: Vec<String> = d.iter().map(|v| v.to_string()).collect();
    parts.join(", ")
}

/// Gathers the examples `indices` of `dataset` on the host (as `layout` says: an `(h, w, c)`
/// tuple for NHWC images; labels one-hot) and places them on `backend`, tagged
/// [`stax_tensor::Category::Input`]. The host buffers come from a throwaway [`HostStaging`];
/// use [`Trainer::place_batch`] (or keep a `HostStaging`) to have them counted.
///
/// # Errors
/// Data errors from [`crate::data::loader::fill_batch`]; allocation and copy errors.
pub fn place_batch(
    backend: &Arc<dyn Backend>,
    dataset: &crate::data::Dataset,
    indices: &[usize],
    layout: impl Into<Layout>,
) -> Result<(Tensor, Tensor), TrainError> {
    HostStaging::new()?.place_batch(backend, dataset, indices, layout)
}

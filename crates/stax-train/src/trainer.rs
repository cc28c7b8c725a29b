//! The training step: forward, loss, backward, Adam, with an exact memory report.

use crate::TrainError;
use crate::report::{EvalReport, MemoryReport, StepReport};
use stax_layers::{Layer, Params, Rng, StepContext, softmax_cross_entropy};
use stax_optim::{Adam, AdamState};
use stax_tensor::{Backend, Shape, Tensor};
use std::sync::Arc;
use std::time::Instant;

/// A model, its parameters and Adam state on one backend.
///
/// The step is `value_and_grad` of `mean(softmax_cross_entropy(apply(params, x), y))` followed
/// by the Adam update, as in the seed's JAX loop, but with parameters and moments updated in
/// place (what `donate_argnums` buys in JAX) and every buffer freed at its last use.
#[derive(Debug)]
pub struct Trainer<L: Layer> {
    model: L,
    params: Params,
    adam: Adam,
    state: AdamState,
    backend: Arc<dyn Backend>,
    input: Shape,
    steps: u64,
}

impl<L: Layer> Trainer<L> {
    /// Initializes parameters (stax's `init_fun` with `Rng::new(seed)`) for inputs of shape
    /// `input` (NHWC with the batch axis) and Adam's state, on `backend`.
    ///
    /// # Errors
    /// Shape errors before any allocation; out of memory.
    pub fn new(
        model: L,
        input: Shape,
        adam: Adam,
        backend: &Arc<dyn Backend>,
        seed: u64,
    ) -> Result<Self, TrainError> {
        if input.rank() != 4 || input.dims().contains(&0) {
            return Err(TrainError::BatchShape {
                what: "input shape",
                expected: "NHWC [batch, height, width, channels], all positive".into(),
                got: input,
            });
        }
        let (_, params) = model.init(&mut Rng::new(seed), &input, backend)?;
        let state = adam.init(&params)?;
        Ok(Trainer {
            model,
            params,
            adam,
            state,
            backend: backend.clone(),
            input,
            steps: 0,
        })
    }

    /// The model.
    pub fn model(&self) -> &L {
        &self.model
    }

    /// Current parameters.
    pub fn params(&self) -> &Params {
        &self.params
    }

    /// Current Adam state.
    pub fn state(&self) -> &AdamState {
        &self.state
    }

    /// The backend everything lives on.
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.backend
    }

    /// Steps taken so far.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    fn check_batch(&self, x: &Tensor, y: &Tensor) -> Result<Shape, TrainError> {
        let want = &self.input.dims()[1..];
        if x.dims().first().is_none_or(|&n| n == 0) || &x.dims()[1..] != want {
            return Err(TrainError::BatchShape {
                what: "images",
                expected: format!("[n, {}, {}, {}] with n > 0", want[0], want[1], want[2]),
                got: x.shape().clone(),
            });
        }
        let out = self.model.output_shape(x.shape())?;
        if y.shape() != &out {
            return Err(TrainError::BatchShape {
                what: "labels",
                expected: format!("one-hot {out}"),
                got: y.shape().clone(),
            });
        }
        Ok(out)
    }

    /// One training step on a placed batch: x NHWC `[n, h, w, c]` and one-hot labels `[n, k]`,
    /// both on this trainer's backend.
    ///
    /// The allocator's peak is reset at the start, so the report's `peak` is this step's.
    /// Nothing is updated unless the forward and backward passes succeed and the loss is finite:
    /// on error (out of memory, non-finite loss) parameters and Adam state are those of the last
    /// finished step.
    ///
    /// # Errors
    /// [`TrainError::BatchShape`], [`TrainError::NonFiniteLoss`], out of memory and other
    /// tensor errors.
    pub fn step(&mut self, x: &Tensor, y: &Tensor) -> Result<StepReport, TrainError> {
        self.check_batch(x, y)?;
        self.backend.allocator().reset_peak();
        let start = Instant::now();
        let (loss, grads) = {
            let mut cx = StepContext::training();
            let logits = self.model.apply(&self.params, x.clone(), &mut cx)?;
            let (loss, dlogits) = softmax_cross_entropy(&logits, y)?;
            drop(logits);
            let (_, grads) = self.model.vjp(&self.params, dlogits, &mut cx, false)?;
            (loss, grads)
        };
        if !loss.is_finite() {
            return Err(TrainError::NonFiniteLoss {
                step: self.steps + 1,
                loss,
            });
        }
        self.adam
            .update(&mut self.state, &grads, &mut self.params)?;
        drop(grads);
        self.backend.synchronize()?;
        let step_ms = start.elapsed().as_secs_f64() * 1e3;
        self.steps += 1;
        Ok(StepReport {
            step: self.steps,
            loss,
            step_ms,
            memory: MemoryReport::read(&*self.backend)?,
        })
    }

    /// Logits for a placed batch, in inference mode (nothing saved for a backward pass).
    ///
    /// # Errors
    /// Shape, device and allocation errors.
    pub fn predict(&self, x: &Tensor) -> Result<Tensor, TrainError> {
        let mut cx = StepContext::inference();
        Ok(self.model.apply(&self.params, x.clone(), &mut cx)?)
    }

    /// Mean loss and accuracy of one placed batch: `(loss, correct)`.
    ///
    /// # Errors
    /// As [`Trainer::step`]'s checks and [`Trainer::predict`].
    pub fn eval_batch(&self, x: &Tensor, y: &Tensor) -> Result<(f32, usize), TrainError> {
        self.check_batch(x, y)?;
        let logits = self.predict(x)?;
        let (loss, _) = softmax_cross_entropy(&logits, y)?;
        let k = logits.shape().last();
        let (l, t) = (logits.to_vec()?, y.to_vec()?);
        let argmax = |row: &[f32]| {
            row.iter()
                .enumerate()
                .fold(0, |best, (i, &v)| if v > row[best] { i } else { best })
        };
        let correct = l
            .chunks_exact(k)
            .zip(t.chunks_exact(k))
            .filter(|(a, b)| argmax(a) == argmax(b))
            .count();
        Ok((loss, correct))
    }
}

/// Combines per-batch `(loss, correct, size)` into an [`EvalReport`] (loss weighted by size).
pub fn summarize(batches: &[(f32, usize, usize)]) -> EvalReport {
    let examples: usize = batches.iter().map(|b| b.2).sum();
    let loss_sum: f64 = batches.iter().map(|b| b.0 as f64 * b.2 as f64).sum();
    let correct: usize = batches.iter().map(|b| b.1).sum();
    let n = examples.max(1) as f64;
    EvalReport {
        loss: (loss_sum / n) as f32,
        accuracy: (correct as f64 / n) as f32,
        examples,
    }
}

/// Gathers the examples `indices` of `dataset` on the host (resized to `hwc`, labels one-hot)
/// and places them on `backend`, tagged [`stax_tensor::Category::Input`]: images NHWC
/// `[len, h, w, c]`, labels `[len, num_classes]`.
///
/// # Errors
/// Data errors from [`crate::data::loader::fill_batch`]; allocation and copy errors.
pub fn place_batch(
    backend: &Arc<dyn Backend>,
    dataset: &crate::data::Dataset,
    indices: &[usize],
    hwc: (usize, usize, usize),
) -> Result<(Tensor, Tensor), TrainError> {
    let (h, w, c) = hwc;
    let (n, k) = (indices.len(), dataset.num_classes());
    let mut images = vec![0f32; n * h * w * c];
    let mut labels = vec![0f32; n * k];
    crate::data::loader::fill_batch(dataset, indices, hwc, &mut images, &mut labels)?;
    let input = stax_tensor::Category::Input;
    let x = Tensor::from_slice(backend, &images, [n, h, w, c], input)?;
    let y = Tensor::from_slice(backend, &labels, [n, k], input)?;
    Ok((x, y))
}

impl<L: Layer> Trainer<L> {
    /// Loss and accuracy over every example of `dataset`, in batches of at most `batch_size`.
    ///
    /// # Errors
    /// Data, shape and tensor errors.
    pub fn evaluate(
        &self,
        dataset: &crate::data::Dataset,
        batch_size: usize,
    ) -> Result<EvalReport, TrainError> {
        let loader = crate::data::Loader::new(dataset.len(), batch_size.min(dataset.len()), 0)?;
        let d = self.input.dims();
        let hwc = (d[1], d[2], d[3]);
        let mut parts = Vec::new();
        for indices in loader.eval_batches() {
            let (x, y) = place_batch(&self.backend, dataset, &indices, hwc)?;
            let (loss, correct) = self.eval_batch(&x, &y)?;
            parts.push((loss, correct, indices.len()));
        }
        Ok(summarize(&parts))
    }

    /// The input shape `[batch, h, w, c]` the trainer was built for.
    pub fn input_shape(&self) -> &Shape {
        &self.input
    }
}

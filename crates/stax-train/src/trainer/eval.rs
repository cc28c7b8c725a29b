//! Evaluation without training: predictions, one batch's loss and accuracy, a whole dataset's.

use stax_layers::{Cx, Layer, Loss};
use stax_optim::Optimizer;
use stax_tensor::{Tensor, Tree};

use super::Trainer;
use crate::TrainError;
use crate::report::EvalReport;
use crate::step::one_output;

impl<L: Layer, O: Optimizer, F: Loss> Trainer<L, O, F> {
    /// The model's output for a placed batch, in evaluation mode (nothing kept for a backward
    /// pass): x f32 `[n, ..]`, n > 0, of the trainer's example shape.
    ///
    /// # Errors
    /// [`TrainError::BatchShape`] for another example shape or an empty batch, a dtype error
    /// for non-f32 inputs; device and allocation errors.
    pub fn predict(&self, x: &Tensor) -> Result<Tensor, TrainError> {
        self.check_inputs(x)?;
        self.forward(x)
    }

    /// The model's output for a checked batch, in evaluation mode.
    fn forward(&self, x: &Tensor) -> Result<Tensor, TrainError> {
        let mut cx = Cx::eval(&self.backend);
        let (y, _) = self
            .model
            .apply(&self.params, Tree::leaf(x.clone()), &mut cx)?;
        one_output(&self.model, y)
    }

    /// Mean loss and accuracy of one placed batch: `(loss, correct)` (a prediction is correct
    /// when its arg-max is the label row's, or the class index for integer labels).
    ///
    /// # Errors
    /// As [`Trainer::step`]'s checks and [`Trainer::predict`].
    pub fn eval_batch(&self, x: &Tensor, y: &Tensor) -> Result<(f32, usize), TrainError> {
        self.check_batch(x, y)?;
        let logits = self.forward(x)?;
        let (loss, _) = self.loss.value_and_grad(&logits, y)?;
        let k = logits.shape().last();
        let argmax = |row: &[f32]| {
            row.iter()
                .enumerate()
                .fold(0, |best, (i, &v)| if v > row[best] { i } else { best })
        };
        let predicted: Vec<usize> = logits.to_vec()?.chunks_exact(k).map(argmax).collect();
        let truth: Vec<usize> = match y.dtype() {
            stax_tensor::DType::U32 => y.to_vec_u32()?.into_iter().map(|c| c as usize).collect(),
            _ => y.to_vec()?.chunks_exact(k).map(argmax).collect(),
        };
        let correct = predicted.iter().zip(&truth).filter(|(a, b)| a == b).count();
        Ok((loss, correct))
    }

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
        let mut parts = Vec::new();
        for indices in loader.eval_batches() {
            let (x, y) = self.place_batch(dataset, &indices)?;
            let (loss, correct) = self.eval_batch(&x, &y)?;
            parts.push((loss, correct, indices.len()));
        }
        Ok(summarize(&parts))
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

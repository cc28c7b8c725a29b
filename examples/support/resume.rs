//! Checkpoints in the training examples: `--resume` (the run continues to the bit),
//! `--init-from` (parameters only, a fresh Adam), `--save` at the end and every
//! `--save-every` steps, with the loop's data position (`stax::train::data::DataPosition`).

use std::cell::Cell;
use std::sync::Arc;

use stax::train::data::{DataPosition, Loader};
use stax::train::{Checkpoint, TrainError, Trainer};
use stax::{Adam, Shape};

use super::{Common, Error};

/// The trainer: resumed (`--resume`), from given parameters (`--init-from`) or fresh; with
/// the data position a resumed run continues from.
pub fn build_trainer(
    args: &Common,
    (model, input, adam): (super::Model, &Shape, Adam),
    backend: &Arc<dyn stax::Backend>,
) -> Result<(Trainer<super::Model>, Option<DataPosition>), Error> {
    let input = input.clone();
    if let Some(path) = &args.resume {
        let policy = stax::Layer::policy(&model).unwrap_or_default();
        let (trainer, at) = Trainer::load(model, input.clone(), adam, backend, path)?;
        let checkpoint = Checkpoint::open(path)?;
        let meta = checkpoint.meta();
        if let Some(m) = meta.filter(|_| !args.eval_only) {
            changed(m, input.dims(), policy);
        }
        let saved = meta.and_then(|m| m.loss_scale);
        let scale = match (trainer.loss_scale(), saved) {
            (Some(s), Some(_)) => {
                format!(
                    ", loss scale {} (counter {} of {})",
                    s.scale, s.counter, s.period
                )
            }
            (None, Some(s)) => format!(
                ", its f16 loss scale ({}) dropped: this run's precision scales no loss",
                s.scale
            ),
            _ => String::new(),
        };
        println!(
            "resumed: {} at step {}{scale}",
            path.display(),
            trainer.steps()
        );
        return Ok((trainer, at));
    }
    if let Some(path) = &args.init_from {
        let params = Checkpoint::open(path)?.params(&model, &input, backend)?;
        println!("parameters: from {}", path.display());
        let trainer = Trainer::from_params(model, input, adam, backend, params, None)?;
        return Ok((trainer, None));
    }
    // The trainer calibrates the step's ops, so its plans are exact from step 1 on.
    Ok((Trainer::new(model, input, adam, backend, args.seed)?, None))
}

/// `--resume`'s checkpoint checked before the set-up: first that it is `model`'s (another
/// model's is named as such), then its data position against this run's batch (a batch that
/// does not divide the examples the checkpoint's run used fails here, not after the trainer
/// reserved its memory); `loader` makes this run's loader for a seed.
pub fn check_position(
    args: &Common,
    (model, batch): (&super::Model, usize),
    loader: impl Fn(u64) -> Result<Loader, Error>,
) -> Result<(), Error> {
    let Some(path) = &args.resume else {
        return Ok(());
    };
    let mut checkpoint = Checkpoint::open(path)?;
    checkpoint.check_model(model)?;
    let Some(at) = checkpoint.data_position()? else {
        return Ok(());
    };
    let checked = loader(at.seed)?.batches_from(at).map(drop);
    checked.map_err(|e| position_error(args, batch, e))
}

/// A data position this run's loader cannot continue from, naming `--resume` and `--batch`.
pub fn position_error(args: &Common, batch: usize, e: TrainError) -> Error {
    match (&e, &args.resume) {
        (TrainError::DataPosition { .. }, Some(path)) => format!(
            "--resume {} with --batch {batch}: {e} (resume with the batch the checkpoint's run \
             used)",
            path.display()
        )
        .into(),
        _ => e.into(),
    }
}

/// Notes what a resumed run changes from its checkpoint's run: the batch (the data order
/// continues, in steps of another size) or the dtype policy (the f32 master weights and Adam's
/// state carry over; the steps round elsewhere). Either way it no longer equals the saved run.
fn changed(saved: &stax::train::checkpoint::Meta, now: &[usize], policy: stax::layers::Policy) {
    if saved.input.first() != now.first() {
        let (a, b) = (saved.input.first().unwrap_or(&0), now.first().unwrap_or(&0));
        println!(
            "note: saved at batch {a}, resumed at batch {b}: the data order continues in steps of {b}"
        );
    }
    let now = stax::train::checkpoint::Policy::from(policy);
    if saved.policy != now {
        println!("note: saved under {}, resumed under {now}", saved.policy);
    }
}

/// `--save` and `--save-every`: where the loop stands in its data order, and the last step
/// saved (each step is saved once).
pub struct Saver<'a> {
    args: &'a Common,
    loader: &'a Loader,
    /// The position the run started from, and the trainer's step count then.
    start: (DataPosition, u64),
    saved: Cell<Option<u64>>,
}

impl<'a> Saver<'a> {
    /// A saver for a loop over `loader` from `start`, after `first` steps.
    pub fn new(args: &'a Common, loader: &'a Loader, start: DataPosition, first: u64) -> Self {
        Saver {
            args,
            loader,
            start: (start, first),
            saved: Cell::new(None),
        }
    }

    /// Saves `t` when due (`end`, or a multiple of `--save-every` steps), returning the line
    /// to print.
    pub fn maybe(&self, t: &Trainer<super::Model>, end: bool) -> Result<Option<String>, Error> {
        let every = self.args.save_every;
        let due = end || every.is_some_and(|n| n > 0 && t.steps() % n == 0);
        let Some(path) = self
            .args
            .save
            .as_ref()
            .filter(|_| due && self.saved.get() != Some(t.steps()))
        else {
            return Ok(None);
        };
        let (from, first) = self.start;
        t.save(path, Some(self.loader.advance(from, t.steps() - first)))?;
        self.saved.set(Some(t.steps()));
        let line = format!("checkpoint: {} (step {})", path.display(), t.steps());
        Ok(Some(line))
    }
}

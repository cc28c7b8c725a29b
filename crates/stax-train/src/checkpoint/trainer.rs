//! Saving a trainer to a checkpoint and resuming one from it (the members and their order
//! are the module docs' of [`crate::checkpoint`]).

use std::path::Path;
use std::sync::Arc;

use stax_layers::{Layer, Loss};
use stax_optim::{OptState, Optimizer};
use stax_tensor::{Backend, Params, Shape, Tensor};

use super::npz::{self, Members, SAVE, problem};
use super::{Checkpoint, FORMAT_VERSION, META, Meta, Policy, host_bytes, jax, release, stage};
use crate::data::DataPosition;
use crate::error::CheckpointProblem;
use crate::{HostStaging, TrainError, Trainer};

/// What a checkpoint holds, borrowed from a trainer.
struct Contents<'a> {
    meta: Meta,
    params: &'a Params,
    state: &'a OptState,
    fields: &'static [&'static str],
    step: u64,
    /// The trainer's seed (its steps' RNG keys).
    seed: u64,
    data: Option<DataPosition>,
    staging: &'a HostStaging,
}

impl Contents<'_> {
    /// Writes every member, in the order of the module docs, to `out`.
    fn write<W: std::io::Write + std::io::Seek>(
        &self,
        out: W,
        path: &Path,
    ) -> Result<(), TrainError> {
        let mut m = Members::new(out, path);
        let json = serde_json::to_vec(&self.meta).map_err(|e| {
            let source = std::io::Error::other(e);
            problem(SAVE, path, Some(META), CheckpointProblem::Write { source })
        })?;
        m.array(META, &format!("|S{}", json.len()), &[], &json)?;
        for (p, t) in self.params.paths() {
            self.tensor(
                &mut m,
                path,
                &jax::param_member(&p),
                jax::shape(&p, t.shape()),
                t,
            )?;
        }
        // optax's int32 count; a count past i32::MAX as int64 rather than wrapped
        match i32::try_from(self.state.count) {
            Ok(c) => m.array(jax::COUNT, "<i4", &[], &c.to_le_bytes())?,
            Err(_) => m.array(
                jax::COUNT,
                "<i8",
                &[],
                &i64::from(self.state.count).to_le_bytes(),
            )?,
        }
        let k = self.fields.len();
        let states = self.state.tree.leaves();
        for (f, field) in self.fields.iter().enumerate() {
            for (i, (p, t)) in self.params.paths().into_iter().enumerate() {
                let name = jax::state_member(field, &p);
                self.tensor(
                    &mut m,
                    path,
                    &name,
                    jax::shape(&p, t.shape()),
                    states[i * k + f],
                )?;
            }
        }
        let step = i64::try_from(self.step).unwrap_or(i64::MAX);
        m.array("step", "<i8", &[], &step.to_le_bytes())?;
        m.array("seed", "<u8", &[], &self.seed.to_le_bytes())?;
        if let Some(d) = self.data {
            m.array("data/seed", "<u8", &[], &d.seed.to_le_bytes())?;
            m.array("data/epoch", "<u8", &[], &d.epoch.to_le_bytes())?;
            m.array("data/index", "<u8", &[], &d.index.to_le_bytes())?;
        }
        m.finish()
    }

    /// Writes tensor `t` as member `name` of JAX shape `shape`, downloaded through one host
    /// buffer of its size from the staging allocator.
    fn tensor<W: std::io::Write + std::io::Seek>(
        &self,
        m: &mut Members<'_, W>,
        path: &Path,
        name: &str,
        shape: Vec<u64>,
        t: &Tensor,
    ) -> Result<(), TrainError> {
        if t.dtype() != stax_tensor::DType::F32 {
            let p = CheckpointProblem::Unsupported { dtype: t.dtype() };
            return Err(problem(SAVE, path, Some(name), p));
        }
        let mut host = stage(self.staging, t)?;
        let bytes = host_bytes(&mut host)?;
        stax_tensor::ops::download(t, bytes)?;
        m.array(name, "<f4", &shape, bytes)
    }
}

impl<L: Layer, O: Optimizer, F: Loss> Trainer<L, O, F> {
    /// Saves parameters, optimizer state, the step count and, when given, the loop's data
    /// position to `path` (the members of the module docs), atomically: until the new file
    /// is complete and synced, `path` keeps its previous contents. Arrays are staged through
    /// this trainer's host staging one at a time. In a data-parallel run
    /// ([`Trainer::data_parallel`]) rank 0 writes it (the file a single process writes) and
    /// every rank returns once it is complete (a barrier).
    ///
    /// # Errors
    /// [`TrainError::Io`] when the directory cannot take the file;
    /// [`CheckpointProblem::Write`] naming the member being written when writing fails (a
    /// full disk); [`CheckpointProblem::Unsupported`] for a non-f32 tensor; copy errors.
    pub fn save(&self, path: &Path, data: Option<DataPosition>) -> Result<(), TrainError> {
        let contents = Contents {
            meta: self.meta(),
            params: self.params(),
            state: self.state(),
            fields: self.optimizer().state_fields(),
            step: self.steps(),
            seed: self.seed,
            data,
            staging: self.staging(),
        };
        // Data parallel: every rank holds the same state; rank 0 writes it, and no rank goes
        // on before the file is complete.
        let Some(dp) = self.data_parallel_rank() else {
            npz::write_atomic(path, |out| contents.write(out, path))?;
            return release(self.staging());
        };
        let written = match dp.rank() {
            0 => npz::write_atomic(path, |out| contents.write(out, path))
                .and_then(|()| release(self.staging())),
            _ => Ok(()),
        };
        dp.collective().barrier()?;
        written
    }

    /// The description written as `stax.json`.
    fn meta(&self) -> Meta {
        // the model's own policy (a Mixed model's), else full f32
        let policy = self.model().policy().unwrap_or_default();
        Meta {
            format: "stax-rs checkpoint".into(),
            version: FORMAT_VERSION,
            library: format!("stax-rs {}", env!("CARGO_PKG_VERSION")),
            model: self.model().describe(),
            input: self.input_shape().dims().to_vec(),
            policy: Policy::from(policy),
            optimizer: format!("{:?}", self.optimizer()),
            loss: self.loss().name().into(),
            paths: (self.params().paths().iter())
                .map(|(p, _)| (p.jax_keystr(), p.to_string()))
                .collect(),
            loss_scale: self.loss_scale(),
        }
    }

    /// A trainer of `model` for inputs `input` with `opt` and `loss` on `backend`, resumed
    /// from the checkpoint at `path`: its parameters, optimizer state and step count, with
    /// the loop's data position if the checkpoint has one, and the dynamic loss scale the
    /// saved run would have used next when both it and this trainer scale their loss (f16;
    /// resumed under a policy without one, the scale is dropped). The load is staged through
    /// the trainer's host staging, so its first [`Trainer::memory_report`] shows it.
    ///
    /// # Errors
    /// As [`Checkpoint::open`], [`Checkpoint::params`], [`Checkpoint::opt_state`],
    /// [`Checkpoint::step_of`] and [`Trainer::from_params_with_loss`]; a saved loss scale that
    /// cannot work is [`DynamicLossScale::validate`]'s error.
    ///
    /// [`DynamicLossScale::validate`]: crate::DynamicLossScale::validate
    pub fn load_with_loss(
        model: L,
        input: Shape,
        opt: O,
        loss: F,
        backend: &Arc<dyn Backend>,
        path: &Path,
    ) -> Result<(Self, Option<DataPosition>), TrainError> {
        let mut ckpt = Checkpoint::open(path)?;
        let params = ckpt.params(&model, &input, backend)?;
        let state = ckpt.opt_state(&opt, &params)?;
        let step = ckpt.step_of(state.count)?;
        let data = ckpt.data_position()?;
        let seed = ckpt.seed()?;
        let mut trainer =
            Trainer::from_params_with_loss(model, input, opt, loss, backend, params, Some(state))?;
        trainer.steps = step;
        let saved_scale = ckpt.meta().and_then(|m| m.loss_scale);
        if let (Some(_), Some(s)) = (trainer.loss_scale(), saved_scale) {
            trainer.set_loss_scale(Some(s))?;
        }
        trainer.staging = ckpt.staging;
        // the steps' RNG keys continue from the run's seed (a file without one: the data
        // order's, which a run given one seed shares, else 0)
        if let Some(seed) = seed.or(data.map(|d| d.seed)) {
            trainer.seed = seed;
        }
        Ok((trainer, data))
    }
}

impl<L: Layer, O: Optimizer> Trainer<L, O> {
    /// [`Trainer::load_with_loss`] with softmax cross-entropy, the seed's loss.
    ///
    /// # Errors
    /// As [`Trainer::load_with_loss`].
    pub fn load(
        model: L,
        input: Shape,
        opt: O,
        backend: &Arc<dyn Backend>,
        path: &Path,
    ) -> Result<(Self, Option<DataPosition>), TrainError> {
        let loss = stax_layers::SoftmaxCrossEntropy;
        Trainer::load_with_loss(model, input, opt, loss, backend, path)
    }
}

//! Checkpoints: one `.npz` file that `numpy.load` reads with no custom code, whose members
//! carry JAX's names and shapes ([`jax`]), for exact resume and for moving trained weights
//! between stax-rs and JAX.
//!
//! | member | dtype | shape | holds |
//! | --- | --- | --- | --- |
//! | `stax.json` | `\|S<n>` | `()` | JSON: format version, library, model, input shape, policy, optimizer, loss, each parameter's stax-rs path by its key path, and an f16 run's dynamic loss scale |
//! | `params/[i][j]` | `<f4` | JAX's (a conv bias `(1, 1, 1, C)`) | the parameter at JAX key path `[i][j]` |
//! | `opt/[0].count` | `<i4` (`<i8` past `i32::MAX`) | `()` | optax's step count |
//! | `opt/[0].mu[i][j]`, `opt/[0].nu[i][j]` | `<f4` | as the parameter | Adam's moments (optax's `ScaleByAdamState`) |
//! | `step` | `<i8` | `()` | [`crate::Trainer::steps`] |
//! | `seed` | `<u8` | `()` | the trainer's seed: each step's RNG key is `Rng::fold_in(seed, step)` (Dropout's masks) |
//! | `data/seed`, `data/epoch`, `data/index` | `<u8` | `()` | where the loop is in its data order ([`DataPosition`]), when given (files before `seed` existed wrote epoch and index as `<i8`; both read) |
//!
//! With `seed` and `step`, that position is the whole state of the run's randomness: after
//! initialisation the loop draws random numbers for the data order, whose generator is seeded
//! per epoch from `(seed, epoch)`, and each step draws its layers' (Dropout's) from its key. A
//! file without `seed` (an older one, or JAX's) resumes with the data order's seed, or 0. The
//! members of the optimizer state follow its [`Optimizer::state_fields`]; every member is
//! written in the order of this table, moments field by field (every `mu`, then every `nu`)
//! as optax flattens them. `scripts/jax_checkpoint.py` holds the Python lines that save and
//! load the same members from JAX (also in the README); a file they write has no `stax.json`,
//! `step`, `seed` or `data/*`, and loads here with the step taken from the count. A `step` below the count is
//! refused ([`Checkpoint::step_of`]): a run's steps include every update it applied.
//!
//! Writing ([`crate::Trainer::save`]) is atomic: the file is written beside its target, `fsync`ed and
//! renamed over it, so a crash or a full disk mid-write leaves the previous checkpoint intact.
//! Reading ([`Checkpoint`]) checks every member's header (name, dtype, shape) before reading
//! any data, and a checkpoint of another model, shape or dtype is refused with a
//! [`TrainError::Checkpoint`] naming the file, the first member that does not fit and what
//! was expected and found; a truncated or damaged file is the same typed error, never a
//! panic. Arrays are streamed one at a time: each goes through one host buffer of its own
//! size (from the [`HostStaging`] allocator, so reports count it) straight into its device
//! tensor, so the host holds at most the largest array
//! ([`crate::MemoryPlan::checkpoint_host_bytes`]) and a checkpoint larger than host memory
//! loads. Saving stages the same way.
//!
//! ```
//! use stax_layers::{serial, Conv, Dense, Flatten, Relu};
//! use stax_optim::Adam;
//! use stax_tensor::{BackendOptions, Device, Shape, Tensor, Category};
//! use stax_train::{Trainer, data::Loader};
//! let cpu = Device::Cpu.open(&BackendOptions::default())?;
//! let model = || serial![Conv::same(2, (3, 3)), Relu, Flatten, Dense(2)];
//! let input = Shape::new([2, 4, 4, 1]);
//! let x = Tensor::from_slice(&cpu, &[0.5f32; 32], [2, 4, 4, 1], Category::Input)?;
//! let y = Tensor::from_slice(&cpu, &[1.0f32, 0.0, 0.0, 1.0], [2, 2], Category::Input)?;
//! let mut a = Trainer::new(model(), input.clone(), Adam::new(1e-2), &cpu, 0)?;
//! a.step(&x, &y)?;
//! let path = std::env::temp_dir().join(format!("stax-doc-{}.npz", std::process::id()));
//! let at = Loader::new(10, 2, 0)?.start();
//! a.save(&path, Some(at))?;
//! let (mut b, position) = Trainer::load(model(), input, Adam::new(1e-2), &cpu, &path)?;
//! assert_eq!((b.steps(), position), (1, Some(at)));
//! // the next step of the loaded trainer is the next step of the original, to the bit
//! assert_eq!(a.step(&x, &y)?.loss.to_bits(), b.step(&x, &y)?.loss.to_bits());
//! # std::fs::remove_file(&path)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod jax;
mod npz;
mod trainer;

use std::path::Path;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use stax_alloc::Tag;
use stax_layers::{Layer, ParamSource, init_params};
use stax_optim::{OptState, Optimizer};
use stax_tensor::{Backend, Params, Shape, Tensor, TensorError, Tree};

use crate::data::DataPosition;
use crate::error::CheckpointProblem;
use crate::{HostStaging, TrainError};
use npz::{Archive, LOAD, problem};

/// The member holding [`Meta`] as JSON.
pub const META: &str = "stax.json";
/// The checkpoint format version this library writes and reads.
pub const FORMAT_VERSION: u32 = 1;

/// What `stax.json` says about a checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Meta {
    /// `"stax-rs checkpoint"`.
    pub format: String,
    /// [`FORMAT_VERSION`] of the writer.
    pub version: u32,
    /// The writing library and its version: `stax-rs 0.1.0`.
    pub library: String,
    /// The model, described ([`Layer::describe`]).
    pub model: String,
    /// The input shape `[batch, ...]` the trainer was built for.
    pub input: Vec<usize>,
    /// The dtype policy the model trained under: parameter, compute and output dtypes (the
    /// model's [`stax_layers::Layer::policy`], full f32 for a model that chooses none).
    pub policy: Policy,
    /// The optimizer and its hyper-parameters, as `Debug` prints them.
    pub optimizer: String,
    /// The loss ([`stax_layers::Loss::name`]).
    pub loss: String,
    /// Every parameter's stax-rs path (`0.conv/w`) by its JAX key path (`[0][0]`), in order.
    pub paths: Vec<(String, String)>,
    /// The dynamic loss scale of the next step (an f16 policy's; jmp's `DynamicLossScale`
    /// state), absent without one. A resumed f16 trainer continues with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss_scale: Option<crate::DynamicLossScale>,
}

/// The dtypes a checkpoint's model computes in (stax-layers' `Policy`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Policy {
    /// Parameter storage dtype.
    pub param: String,
    /// Compute dtype.
    pub compute: String,
    /// Output dtype.
    pub output: String,
}

impl From<stax_layers::Policy> for Policy {
    /// The dtypes by name (`f32`, `bf16`, `f16`).
    fn from(p: stax_layers::Policy) -> Policy {
        Policy {
            param: p.param.to_string(),
            compute: p.compute.to_string(),
            output: p.output.to_string(),
        }
    }
}

impl std::fmt::Display for Policy {
    /// jmp's spelling, as stax-layers' `Policy`: `params=f32,compute=bf16,output=f32`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "params={},compute={},output={}",
            self.param, self.compute, self.output
        )
    }
}

/// A checkpoint opened for reading: its directory and description, read when opened; arrays
/// are read, checked and streamed by [`Checkpoint::params`] and [`Checkpoint::opt_state`].
pub struct Checkpoint {
    archive: Archive,
    meta: Option<Meta>,
    staging: HostStaging,
}

impl std::fmt::Debug for Checkpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Checkpoint")
            .field("members", &self.archive.names())
            .field("meta", &self.meta)
            .finish_non_exhaustive()
    }
}

impl Checkpoint {
    /// Opens the checkpoint at `path`: reads its directory and `stax.json` (if any), no array.
    ///
    /// # Errors
    /// [`TrainError::Io`] when the file cannot be opened; [`TrainError::Checkpoint`] for a
    /// file that is not an `.npz` archive (truncated: naming the member it ends in) or a
    /// malformed `stax.json`, or one written by a newer format.
    pub fn open(path: &Path) -> Result<Checkpoint, TrainError> {
        let mut archive = Archive::open(path)?;
        let bad =
            |reason: String| problem(LOAD, path, Some(META), CheckpointProblem::Value { reason });
        let meta = match archive.read_text(META)? {
            Some(text) => {
                Some(serde_json::from_slice::<Meta>(&text).map_err(|e| bad(e.to_string()))?)
            }
            None => None,
        };
        if let Some(m) = &meta
            && m.version > FORMAT_VERSION
        {
            return Err(bad(format!(
                "format version {} (this library reads up to {FORMAT_VERSION})",
                m.version
            )));
        }
        Ok(Checkpoint {
            archive,
            meta,
            staging: HostStaging::new()?,
        })
    }

    /// This checkpoint, staging arrays through `staging` (a trainer's, so that its reports
    /// count the load).
    pub fn with_staging(mut self, staging: HostStaging) -> Checkpoint {
        self.staging = staging;
        self
    }

    /// The host staging arrays go through.
    pub fn staging(&self) -> &HostStaging {
        &self.staging
    }

    /// The array names, in the file's order (`np.load(path).files`).
    pub fn members(&self) -> &[String] {
        self.archive.names()
    }

    /// The description in `stax.json`; None for a file without one (JAX's).
    pub fn meta(&self) -> Option<&Meta> {
        self.meta.as_ref()
    }

    fn fail(&self, member: &str, p: CheckpointProblem) -> TrainError {
        problem(LOAD, self.archive_path(), Some(member), p)
    }

    fn archive_path(&self) -> &Path {
        self.archive.path()
    }

    /// Checks `stax.json` (when present) against `model`: the same model description, up to
    /// the compute policy (parameters are f32 masters under every policy, so a checkpoint
    /// saved in f32 resumes in bf16 and back) and rematerialization (`remat(..)`, which
    /// changes no parameter). (The input shape may differ: the parameters' shapes say whether
    /// they fit.)
    ///
    /// # Errors
    /// [`CheckpointProblem::Model`] naming `stax.json`, with both descriptions.
    pub fn check_model(&self, model: &dyn Layer) -> Result<(), TrainError> {
        let Some(meta) = &self.meta else {
            return Ok(());
        };
        let expected = model.describe();
        if structure(&expected) != structure(&meta.model) {
            let found = meta.model.clone();
            return Err(self.fail(META, CheckpointProblem::Model { expected, found }));
        }
        Ok(())
    }

    /// Every member under `prefix` must be one of `expected`, each of which must hold f32 of
    /// its shape: checked from the headers before any data is read.
    fn expect(&mut self, prefix: &str, expected: &[(String, Vec<u64>)]) -> Result<(), TrainError> {
        for (name, shape) in expected {
            self.archive.expect_f32(name, shape)?;
        }
        let stray = self.archive.names().iter().find(|n| {
            n.starts_with(prefix) && !expected.iter().any(|(e, _)| e == *n) && *n != jax::COUNT
        });
        match stray {
            Some(n) => Err(self.fail(&n.clone(), CheckpointProblem::Unexpected)),
            None => Ok(()),
        }
    }

    /// Reads member `name` (of JAX shape `shape`) into `t` through one host buffer of
    /// `t.bytes()` from the staging allocator, tagged with `t`'s category.
    fn read_into(&mut self, name: &str, shape: &[u64], t: &mut Tensor) -> Result<(), TrainError> {
        if t.dtype() != stax_tensor::DType::F32 {
            let dtype = t.dtype();
            return Err(self.fail(name, CheckpointProblem::Unsupported { dtype }));
        }
        let mut host = stage(&self.staging, t)?;
        let bytes = host_bytes(&mut host)?;
        self.archive.read_f32(name, shape, bytes)?;
        stax_tensor::ops::upload(bytes, t)?;
        Ok(())
    }

    /// `model`'s parameters for inputs `input` on `backend`, from the checkpoint: allocated
    /// as a fresh trainer allocates them (same order, names and categories), then filled one
    /// member at a time.
    ///
    /// # Errors
    /// [`CheckpointProblem::Model`] when `stax.json` describes another model;
    /// [`CheckpointProblem::Missing`], [`CheckpointProblem::Shape`],
    /// [`CheckpointProblem::DType`] (each naming the first member that does not fit) and
    /// [`CheckpointProblem::Unexpected`] (a parameter the model does not have), all before
    /// any data is read; [`CheckpointProblem::Corrupt`]; allocation and copy errors.
    pub fn params(
        &mut self,
        model: &dyn Layer,
        input: &Shape,
        backend: &Arc<dyn Backend>,
    ) -> Result<Params, TrainError> {
        self.check_model(model)?;
        let inputs = Tree::leaf(input.clone());
        let specs = model.param_specs(&inputs)?;
        let expected: Vec<(String, Vec<u64>)> = specs
            .paths()
            .iter()
            .map(|(p, s)| (jax::param_member(p), jax::shape(p, &s.shape)))
            .collect();
        self.expect("params/", &expected)?;
        let (_, mut params) = init_params(model, &inputs, backend, ParamSource::Empty)?;
        for ((name, shape), t) in expected.iter().zip(params.leaves_mut()) {
            self.read_into(name, shape, t)?;
        }
        release(&self.staging)?;
        Ok(params)
    }

    /// `opt`'s state for `params` from the checkpoint: allocated as [`Optimizer::init`] does,
    /// then the count and every state tensor read.
    ///
    /// # Errors
    /// As [`Checkpoint::params`], for the `opt/` members; [`CheckpointProblem::Value`] for a
    /// count past `u32::MAX`.
    pub fn opt_state(
        &mut self,
        opt: &dyn Optimizer,
        params: &Params,
    ) -> Result<OptState, TrainError> {
        let fields = opt.state_fields();
        let members: Vec<Vec<(String, Vec<u64>)>> = params
            .paths()
            .iter()
            .map(|(p, t)| {
                let shape = jax::shape(p, t.shape());
                let member = |f: &&str| (jax::state_member(f, p), shape.clone());
                fields.iter().map(member).collect()
            })
            .collect();
        let by_field: Vec<(String, Vec<u64>)> = (0..fields.len())
            .flat_map(|f| members.iter().map(move |m| m[f].clone()))
            .collect();
        self.expect("opt/", &by_field)?;
        let count = self
            .archive
            .read_u64(jax::COUNT)?
            .ok_or_else(|| self.fail(jax::COUNT, CheckpointProblem::Missing))?;
        let count = u32::try_from(count).map_err(|_| {
            let reason = format!("a count of {count}, past u32::MAX");
            self.fail(jax::COUNT, CheckpointProblem::Value { reason })
        })?;
        let mut state = opt.init(params)?;
        state.count = count;
        let flat = members.into_iter().flatten();
        for ((name, shape), t) in flat.zip(state.tree.leaves_mut()) {
            self.read_into(&name, &shape, t)?;
        }
        release(&self.staging)?;
        Ok(state)
    }

    /// The `step` member; None in a file without one (JAX's: the count is its step).
    ///
    /// # Errors
    /// As for any scalar member: dtype, shape, a negative value, corruption.
    pub fn step(&mut self) -> Result<Option<u64>, TrainError> {
        self.archive.read_u64("step")
    }

    /// The run's step for an optimizer state of `count` updates: the `step` member, or
    /// `count` in a file without one (JAX's). A step above the count is a run whose f16 loss
    /// scale skipped updates.
    ///
    /// # Errors
    /// As [`Checkpoint::step`]; [`CheckpointProblem::Value`] naming `step` when it is below
    /// `count` (no run applies more updates than it takes steps).
    pub fn step_of(&mut self, count: u32) -> Result<u64, TrainError> {
        match self.step()? {
            None => Ok(u64::from(count)),
            Some(step) if step >= u64::from(count) => Ok(step),
            Some(step) => {
                let reason = format!("step {step} is below {} {count}", jax::COUNT);
                Err(self.fail("step", CheckpointProblem::Value { reason }))
            }
        }
    }

    /// The trainer's seed (`seed`); None in a file without one (JAX's, or one written before
    /// the member existed).
    ///
    /// # Errors
    /// As [`Checkpoint::step`].
    pub fn seed(&mut self) -> Result<Option<u64>, TrainError> {
        self.archive.read_u64("seed")
    }

    /// The data position (`data/seed`, `data/epoch`, `data/index`); None when the file has
    /// none of them.
    ///
    /// # Errors
    /// [`CheckpointProblem::Missing`] when it has some but not all; as [`Checkpoint::step`].
    pub fn data_position(&mut self) -> Result<Option<DataPosition>, TrainError> {
        let names = ["data/seed", "data/epoch", "data/index"];
        let mut values = Vec::new();
        for n in names {
            values.push(self.archive.read_u64(n)?);
        }
        match values[..] {
            [None, None, None] => Ok(None),
            [Some(seed), Some(epoch), Some(index)] => Ok(Some(DataPosition { seed, epoch, index })),
            _ => {
                let missing = names.iter().zip(&values).find(|(_, v)| v.is_none());
                let name = missing.map_or(names[0], |(n, _)| n);
                Err(self.fail(name, CheckpointProblem::Missing))
            }
        }
    }
}

/// A host buffer of `t.bytes()` from `staging`, tagged with `t`'s category: where one array
/// of a checkpoint goes through host memory.
fn stage(staging: &HostStaging, t: &Tensor) -> Result<stax_alloc::Allocation, TrainError> {
    let tag = Tag::new(t.category(), "checkpoint");
    let host = staging.allocator().allocate(t.bytes(), tag);
    Ok(host.map_err(TensorError::from)?)
}

/// Returns the staging allocator's cached buffers to the system: a checkpoint's arrays are
/// large and staged once, so host memory does not stay reserved after a load or a save.
fn release(staging: &HostStaging) -> Result<(), TrainError> {
    Ok(staging
        .allocator()
        .empty_cache()
        .map_err(TensorError::from)?)
}

/// A staging buffer's bytes.
fn host_bytes(a: &mut stax_alloc::Allocation) -> Result<&mut [u8], TrainError> {
    a.host_bytes_mut().ok_or_else(|| {
        TrainError::from(TensorError::InvalidArgument {
            op: "checkpoint",
            reason: "the staging allocator does not hand out host memory".into(),
        })
    })
}

/// A model description without what changes no parameter: every policy of a `Mixed` layer
/// (`Mixed::describe` appends ` under params=f32,compute=bf16,output=f32` to its layer's
/// description, at any depth), every `remat(..)` wrapper and a BatchNorm's `, folded`.
fn structure(description: &str) -> String {
    const MARK: &str = " under params=";
    const OUTPUT: &str = "output=";
    let mut out = String::with_capacity(description.len());
    let mut rest = description;
    while let Some(at) = rest.find(MARK) {
        out.push_str(&rest[..at]);
        let tail = &rest[at..];
        // the policy ends with its output dtype's name
        let end = tail.find(OUTPUT).map_or(tail.len(), |o| {
            let name = &tail[o + OUTPUT.len()..];
            let len = name.find(|c: char| !c.is_ascii_alphanumeric());
            o + OUTPUT.len() + len.unwrap_or(name.len())
        });
        rest = &tail[end..];
    }
    out.push_str(rest);
    // a folded BatchNorm (`BatchNorm::folded`) has the parameters of an unfolded one
    without_remat(&out).replace(", folded)", ")")
}

/// A model description without its `remat(..)` wrappers ([`stax_layers::Remat`]'s
/// description, with the layers it spans and what it saves): `serial[remat(serial[dense(4)]),
/// remat(spanning 2, saving conv: conv(..)), relu, dense(2)]` is `serial[serial[dense(4)],
/// conv(..), relu, dense(2)]`.
fn without_remat(description: &str) -> String {
    let mut out = String::with_capacity(description.len());
    // for each open parenthesis: whether it opened a remat wrapper
    let mut open = Vec::new();
    let mut rest = description;
    while let Some(c) = rest.chars().next() {
        if let Some(inner) = rest.strip_prefix("remat(") {
            open.push(true);
            // `remat(spanning 3, saving conv, dense: ...)`: how many layers it covers (they
            // keep their places) and what it saves are not structure either
            let how = inner.starts_with("saving ") || inner.starts_with("spanning ");
            rest = match how {
                true => inner.split_once(": ").map_or(inner, |(_, layer)| layer),
                false => inner,
            };
            continue;
        }
        let wrapper_closes = c == ')' && open.pop() == Some(true);
        if c == '(' {
            open.push(false);
        }
        if !wrapper_closes {
            out.push(c);
        }
        rest = &rest[c.len_utf8()..];
    }
    out
}

//! Data-parallel training, one process per device (as `torchrun` and multi-host JAX run it):
//! each rank holds the whole model, steps on its own shard of every batch, and the ranks'
//! gradients are averaged before identical updates, so every rank holds the same parameters.
//!
//! Set-up, on every rank: [`Rendezvous::from_env`] (`STAX_RANK`, `STAX_WORLD_SIZE`,
//! `STAX_RENDEZVOUS`, a directory every rank can read), [`DataParallel::connect`] (NCCL on a
//! CUDA backend, its unique id through the directory; [`TcpCollective`] on the CPU backend,
//! rank 0's address through it), then [`crate::Trainer::data_parallel`]: the ranks compare
//! their models (paths, shapes and dtypes of every parameter, the model, the input, the
//! optimizer and the step; a difference is [`TrainError::ModelMismatch`] on every rank) and
//! rank 0's parameters and optimizer state are broadcast. In each step the gradients are
//! all-reduced in buckets as the backward pass makes them (the step's `ReduceSink`); with
//! more than one rank nothing is updated inside the backward pass (Adam's dense-weight
//! update waits for the reduced gradient). [`launch`] starts the ranks of one host.
//!
//! Memory: the all-reduce is in place, so a rank's plan and measured peak are those of a
//! single process at its batch with its gradients collected; what the library holds outside
//! the allocator (NCCL's buffers, measured from the driver's free memory at set-up; the TCP
//! collective's receive chunk) is in [`CommReport`], beside the buckets, in every
//! [`crate::MemoryReport`] and [`crate::MemoryPlan`] of the rank.

mod launch;
pub mod rendezvous;
pub(crate) mod sink;

pub use launch::launch;
pub use rendezvous::Rendezvous;

use std::sync::{Arc, Mutex};

use serde::Serialize;
use stax_layers::Layer;
use stax_optim::Optimizer;
use stax_tensor::collective::{TcpCollective, TcpRoot};
use stax_tensor::cuda::nccl::{NcclCollective, NcclId};
use stax_tensor::{Backend, Collective, DType, Tensor};

use crate::{TrainError, Trainer};

/// The bucket size at which gradients are reduced during the backward pass: 25 MiB, as
/// PyTorch DDP's `bucket_cap_mb`.
pub const DEFAULT_BUCKET_BYTES: u64 = 25 << 20;

/// Gradients reduced together, in the order the backward pass made them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Bucket {
    /// Bytes reduced (in place: no buffer of this size is allocated).
    pub bytes: u64,
    /// The parameters' paths (`5.dense/w`).
    pub tensors: Vec<String>,
}

/// A rank's communication, for reports and plans.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CommReport {
    /// The collective library (`nccl`, `tcp`).
    pub library: String,
    /// This rank.
    pub rank: usize,
    /// The number of ranks.
    pub world: usize,
    /// The bucket size (bytes) at which a bucket is reduced.
    pub bucket_bytes: u64,
    /// The last step's buckets (a plan's: its step's).
    pub buckets: Vec<Bucket>,
    /// Device bytes the library holds outside the allocator (NCCL, measured); `None` on the
    /// host.
    pub device_bytes: Option<u64>,
    /// Host bytes the collective holds (the TCP collective's receive chunk on rank 0).
    pub host_bytes: u64,
}

/// One rank's part in data-parallel training (see the module docs).
#[derive(Debug)]
pub struct DataParallel {
    comm: Arc<dyn Collective>,
    rendezvous: Rendezvous,
    bucket_bytes: u64,
    buckets: Mutex<Vec<Bucket>>,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    let s = s.trim();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

impl DataParallel {
    /// Connects this rank to the others of `rendezvous` for tensors of `backend`: NCCL on a
    /// CUDA backend (rank 0 publishes the unique id as the key `nccl`), the TCP collective
    /// on the others (rank 0 listens on `rendezvous.host`, any port, and publishes the
    /// address as `tcp`). Every wait has the rendezvous' timeout.
    ///
    /// # Errors
    /// [`TrainError::Rendezvous`] (a key not published in time, a used directory);
    /// [`stax_tensor::TensorError::CudaUnavailable`] without NCCL; the collective's errors.
    pub fn connect(
        rendezvous: &Rendezvous,
        backend: &Arc<dyn Backend>,
    ) -> Result<DataParallel, TrainError> {
        let rv = rendezvous;
        let (rank, world, timeout) = (rv.rank, rv.world, rv.timeout);
        let comm: Arc<dyn Collective> = if backend.as_cuda().is_some() {
            let id = if rank == 0 {
                let id = NcclId::new()?;
                rv.put("nccl", hex(&id.0).as_bytes())?;
                id
            } else {
                let text = String::from_utf8_lossy(&rv.get("nccl", 0)?).into_owned();
                let bytes = unhex(&text).and_then(|b| <[u8; 128]>::try_from(b).ok());
                NcclId(bytes.ok_or_else(|| TrainError::Rendezvous {
                    rank,
                    reason: "the key nccl does not hold a 128-byte NCCL id".into(),
                })?)
            };
            Arc::new(NcclCollective::new(backend, rank, world, id, timeout)?)
        } else if rank == 0 {
            let root = TcpRoot::bind(&format!("{}:0", rv.host))?;
            rv.put("tcp", root.local_addr()?.as_bytes())?;
            Arc::new(root.accept(backend, world, timeout)?)
        } else {
            let addr = String::from_utf8_lossy(&rv.get("tcp", 0)?).into_owned();
            Arc::new(TcpCollective::connect(
                backend, rank, world, &addr, timeout,
            )?)
        };
        Ok(DataParallel {
            comm,
            rendezvous: rv.clone(),
            bucket_bytes: DEFAULT_BUCKET_BYTES,
            buckets: Mutex::new(Vec::new()),
        })
    }

    /// With buckets reduced at `bytes` (at least one tensor each; 0: every layer's gradients
    /// reduced as they come).
    pub fn with_bucket_bytes(mut self, bytes: u64) -> DataParallel {
        self.bucket_bytes = bytes;
        self
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.comm.rank()
    }

    /// The number of ranks.
    pub fn world(&self) -> usize {
        self.comm.world()
    }

    /// The bucket size.
    pub fn bucket_bytes(&self) -> u64 {
        self.bucket_bytes
    }

    /// The collective.
    pub fn collective(&self) -> &dyn Collective {
        &*self.comm
    }

    /// The rendezvous this rank joined.
    pub fn rendezvous(&self) -> &Rendezvous {
        &self.rendezvous
    }

    pub(crate) fn record_buckets(&self, buckets: Vec<Bucket>) {
        *self.buckets.lock().unwrap_or_else(|p| p.into_inner()) = buckets;
    }

    /// The communication report now (buckets of the last step or plan).
    pub fn report(&self) -> CommReport {
        let outside = self.comm.outside_bytes();
        CommReport {
            library: self.comm.library().into(),
            rank: self.rank(),
            world: self.world(),
            bucket_bytes: self.bucket_bytes,
            buckets: self
                .buckets
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
            device_bytes: outside.device,
            host_bytes: outside.host,
        }
    }

    /// Checks that every rank describes the same model as rank 0 (see the module docs):
    /// each rank publishes its description as `model.<rank>` and reads all of them.
    fn check_models(&self, mine: &str) -> Result<(), TrainError> {
        let rv = &self.rendezvous;
        rv.put(&format!("model.{}", rv.rank), mine.as_bytes())?;
        let all = (0..rv.world)
            .map(|r| Ok(String::from_utf8_lossy(&rv.get(&format!("model.{r}"), r)?).into_owned()))
            .collect::<Result<Vec<String>, TrainError>>()?;
        let Some(first) = all.iter().position(|d| d != &all[0]) else {
            return Ok(());
        };
        let other = if mine == all[0] { first } else { 0 };
        let theirs = &all[other];
        let difference = mine
            .lines()
            .zip(theirs.lines())
            .find(|(a, b)| a != b)
            .map_or_else(
                || "one lists more parameters".to_string(),
                |(a, b)| format!("here: {a} / there: {b}"),
            );
        Err(TrainError::ModelMismatch {
            rank: rv.rank,
            other,
            difference,
            this_hash: fnv1a(mine.as_bytes()),
            other_hash: fnv1a(theirs.as_bytes()),
        })
    }
}

/// FNV-1a, 64 bits: a hash that is the same in every process and build.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

impl<L: Layer, O: Optimizer, F: stax_layers::Loss> Trainer<L, O, F> {
    /// Makes this trainer rank `dp.rank()` of a data-parallel run: checks that every rank
    /// trains the same model, broadcasts rank 0's parameters and optimizer state to every
    /// rank, and from now on reduces every step's gradients across the ranks (see the module
    /// docs). Each rank then steps on its own shard of each batch; with equal shards the
    /// update is that of one process on their concatenation, up to the reduction's order.
    ///
    /// # Errors
    /// [`TrainError::ModelMismatch`] on every rank when a rank's model differs;
    /// [`TrainError::Rendezvous`]; the collective's errors (a peer died or timed out); a
    /// [`stax_layers::LayerError::Config`] for a model computing in bf16 or f16 (the buckets
    /// all-reduce f32 gradients; low-precision ones are not written yet), before any exchange.
    pub fn data_parallel(mut self, dp: DataParallel) -> Result<Self, TrainError> {
        let input = stax_tensor::Tree::leaf(self.input_shape().clone());
        let policies = self.model().policies(&input);
        let low = policies.into_iter().find(|p| p.compute != DType::F32);
        if let Some(p) = low {
            return Err(stax_layers::LayerError::Config {
                path: String::new(),
                layer: format!("policy {p}"),
                reason: "data parallel all-reduces f32 gradients only: train this policy in one \
                         process, or in f32 (--precision tf32|highest) across ranks"
                    .into(),
            }
            .into());
        }
        let mut mine = format!(
            "model: {}\ninput: {:?} (batch excluded)\noptimizer: {:?}\nloss: {}\nstep: {}\n",
            self.model().describe(),
            &self.input_shape().dims()[1..],
            self.optimizer(),
            self.loss().name(),
            self.state().count
        );
        for (path, t) in self.params().paths() {
            mine.push_str(&format!("{path}: {} {}\n", t.shape(), t.dtype()));
        }
        dp.check_models(&mine)?;
        let mut leaves: Vec<&mut Tensor> = self.params.leaves_mut();
        leaves.extend(self.state.tree.leaves_mut());
        dp.collective().broadcast(&mut leaves)?;
        dp.collective().wait()?;
        self.dp = Some(dp);
        self.backend().synchronize()?;
        Ok(self)
    }

    /// This trainer's data-parallel rank, if it is one.
    pub fn data_parallel_rank(&self) -> Option<&DataParallel> {
        self.dp.as_ref()
    }
}

impl std::fmt::Display for CommReport {
    /// One line for the communicator, one per bucket.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let outside = self.device_bytes.map_or_else(
            || format!("{} host bytes", self.host_bytes),
            |d| {
                format!(
                    "{d} device bytes (measured), {} host bytes",
                    self.host_bytes
                )
            },
        );
        writeln!(
            f,
            "  data parallel: rank {} of {} on {}, gradients all-reduced (mean) in place in \
             buckets of {} bytes; the library holds {outside} outside the allocator",
            self.rank, self.world, self.library, self.bucket_bytes
        )?;
        for (i, b) in self.buckets.iter().enumerate() {
            writeln!(
                f,
                "    bucket {i}: {} bytes: {}",
                b.bytes,
                b.tensors.join(", ")
            )?;
        }
        Ok(())
    }
}

impl<L: Layer, O: Optimizer, F: stax_layers::Loss> Trainer<L, O, F> {
    /// The memory plan of this trainer's step (a data-parallel rank's included: its buckets
    /// and no update in the backward pass with more than one rank) at batch `batch`, fed as
    /// `feed` says, whatever feed the trainer has run with so far.
    ///
    /// # Errors
    /// As [`Trainer::plan`].
    pub fn plan_with_feed(
        &self,
        batch: usize,
        feed: crate::Feed,
    ) -> Result<crate::MemoryPlan, TrainError> {
        let parts = self.parts_for(batch);
        let mut dims = self.input_shape().dims().to_vec();
        dims[0] = batch;
        let input = stax_tensor::Shape::new(dims);
        crate::MemoryPlan::of(parts, &input, self.backend(), feed)
    }
}

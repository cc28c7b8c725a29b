//! The rendezvous: where the ranks of a run find each other, from environment variables and
//! a directory every rank can read (one host, or a filesystem the hosts share), as
//! `torch.distributed`'s `FileStore` does.
//!
//! Rank 0 writes a key as a file atomically (a temporary beside it, then a rename), the others
//! poll for it until the timeout. Keys: `tcp` (rank 0's address, CPU backend), `nccl` (the
//! NCCL unique id, CUDA), `model.<rank>` (each rank's model description, for the mismatch
//! check).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::TrainError;

/// This process's rank: `STAX_RANK`.
pub const RANK: &str = "STAX_RANK";
/// The number of ranks: `STAX_WORLD_SIZE` (unset: not data parallel).
pub const WORLD_SIZE: &str = "STAX_WORLD_SIZE";
/// The rendezvous directory: `STAX_RENDEZVOUS` (a fresh one per run).
pub const RENDEZVOUS: &str = "STAX_RENDEZVOUS";
/// The device of this rank on its host: `STAX_LOCAL_RANK` (default: the rank).
pub const LOCAL_RANK: &str = "STAX_LOCAL_RANK";
/// Seconds any wait may take before it fails: `STAX_TIMEOUT_S` (default [`DEFAULT_TIMEOUT`]).
pub const TIMEOUT: &str = "STAX_TIMEOUT_S";
/// The address rank 0 listens on for the CPU backend's TCP collective: `STAX_HOST` (default
/// `127.0.0.1`; `0.0.0.0` with peers on other hosts).
pub const HOST: &str = "STAX_HOST";

/// The default deadline of every wait.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);

/// Where and who this rank is (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rendezvous {
    /// This process's rank, `0..world`.
    pub rank: usize,
    /// The number of ranks.
    pub world: usize,
    /// This rank's device on its host (`Device::Cuda(local_rank)`).
    pub local_rank: usize,
    /// The directory the ranks exchange keys through.
    pub dir: PathBuf,
    /// The deadline of every wait (rendezvous and collectives).
    pub timeout: Duration,
    /// The address rank 0's TCP collective listens on (host only, the port is chosen).
    pub host: String,
}

fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

impl Rendezvous {
    /// The rendezvous the environment describes, `None` when `STAX_WORLD_SIZE` is unset (a
    /// plain single-process run).
    ///
    /// # Errors
    /// [`TrainError::Rendezvous`] for a variable that is not a whole number (a timeout not a
    /// finite number of seconds > 0), a rank outside the world, or a missing
    /// `STAX_RENDEZVOUS`; it names this process's rank once `STAX_RANK` is read.
    pub fn from_env() -> Result<Option<Rendezvous>, TrainError> {
        let Some(world) = var(WORLD_SIZE) else {
            return Ok(None);
        };
        // the rank the error names: this process's, once it is known
        let bad = |rank: usize, what: &str, v: &str, want: &str| TrainError::Rendezvous {
            rank,
            reason: format!("{what}={v:?}: expected {want}"),
        };
        let whole = "a whole number";
        let world: usize = world
            .parse()
            .map_err(|_| bad(0, WORLD_SIZE, &world, whole))?;
        let rank = var(RANK).unwrap_or_else(|| "0".into());
        let rank: usize = rank.parse().map_err(|_| bad(0, RANK, &rank, whole))?;
        let local = var(LOCAL_RANK).unwrap_or_else(|| rank.to_string());
        let local_rank: usize = local
            .parse()
            .map_err(|_| bad(rank, LOCAL_RANK, &local, whole))?;
        let timeout = match var(TIMEOUT) {
            Some(t) => Duration::from_secs_f64(
                t.parse::<f64>()
                    .ok()
                    .filter(|s| s.is_finite() && *s > 0.0)
                    .ok_or_else(|| bad(rank, TIMEOUT, &t, "seconds, a finite number > 0"))?,
            ),
            None => DEFAULT_TIMEOUT,
        };
        let dir = var(RENDEZVOUS).ok_or_else(|| TrainError::Rendezvous {
            rank,
            reason: format!("{WORLD_SIZE} is set but {RENDEZVOUS} (a directory) is not"),
        })?;
        let host = var(HOST).unwrap_or_else(|| "127.0.0.1".into());
        let rv = Rendezvous::new(rank, world, dir.into(), timeout)?;
        Ok(Some(Rendezvous {
            local_rank,
            host,
            ..rv
        }))
    }

    /// Rank `rank` of `world` meeting in `dir` (created if absent), waits at most `timeout`;
    /// its device is `Cuda(rank)`, its TCP address `127.0.0.1`.
    ///
    /// # Errors
    /// [`TrainError::Rendezvous`] for a rank outside the world or a directory that cannot be
    /// made.
    pub fn new(
        rank: usize,
        world: usize,
        dir: PathBuf,
        timeout: Duration,
    ) -> Result<Rendezvous, TrainError> {
        if world == 0 || rank >= world {
            return Err(TrainError::Rendezvous {
                rank,
                reason: format!("rank {rank} of a world of {world}"),
            });
        }
        std::fs::create_dir_all(&dir).map_err(|e| TrainError::Rendezvous {
            rank,
            reason: format!("cannot make {}: {e}", dir.display()),
        })?;
        Ok(Rendezvous {
            rank,
            world,
            local_rank: rank,
            dir,
            timeout,
            host: "127.0.0.1".into(),
        })
    }

    fn path(&self, key: &str) -> PathBuf {
        self.dir.join(key)
    }

    fn error(&self, reason: String) -> TrainError {
        TrainError::Rendezvous {
            rank: self.rank,
            reason,
        }
    }

    /// Publishes `value` under `key`, atomically (readers see all of it or nothing).
    ///
    /// # Errors
    /// [`TrainError::Rendezvous`] when the key exists already (the directory holds another
    /// run's keys: give each run a fresh one) or cannot be written.
    pub fn put(&self, key: &str, value: &[u8]) -> Result<(), TrainError> {
        let path = self.path(key);
        if path.exists() {
            return Err(self.error(format!(
                "{} exists already: the directory holds another run's keys; give each run a \
                 fresh {RENDEZVOUS} directory",
                path.display()
            )));
        }
        let tmp = self.path(&format!(".{key}.{}.tmp", std::process::id()));
        let write = std::fs::write(&tmp, value).and_then(|()| std::fs::rename(&tmp, &path));
        write.map_err(|e| {
            // the temporary may not exist
            let _ = std::fs::remove_file(&tmp);
            self.error(format!("cannot write {}: {e}", path.display()))
        })
    }

    /// The value of `key`, waiting for it until the timeout.
    ///
    /// # Errors
    /// [`TrainError::Rendezvous`] naming the key and its rank when it did not appear in time.
    pub fn get(&self, key: &str, from_rank: usize) -> Result<Vec<u8>, TrainError> {
        let path = self.path(key);
        let deadline = Instant::now() + self.timeout;
        loop {
            match std::fs::read(&path) {
                Ok(v) => return Ok(v),
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(self.error(format!("cannot read {}: {e}", path.display())));
                }
                Err(_) if Instant::now() >= deadline => {
                    return Err(self.error(format!(
                        "rank {from_rank} did not publish {} within {:?} (did it start, and \
                         with the same {RENDEZVOUS}?)",
                        path.display(),
                        self.timeout
                    )));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(10)),
            }
        }
    }

    /// The rendezvous directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

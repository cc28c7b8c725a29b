//! Data parallel in the training examples: `--ranks N` (CPU backend) or `--gpus N` (rank r
//! on `cuda:r`, NCCL) starts N processes of the example on this host
//! (`stax::train::distributed::launch`, output prefixed `[rank r]`), each with the
//! rendezvous variables set; a process started with them (by the launcher, or by hand on
//! several hosts: `STAX_RANK`, `STAX_WORLD_SIZE`, `STAX_RENDEZVOUS`) joins the run, trains on
//! its shard of each global batch of `--batch` x N examples and writes its exports
//! (`--json`, `--trace`, `--plot`, `--record-trace`) with `.rankR` before the extension;
//! rank 0 alone writes `--save`.

use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use stax::alloc::parse_size;
use stax::tensor::collective::MAX_WORLD;
use stax::train::distributed::{DataParallel, Rendezvous, launch, rendezvous::LOCAL_RANK};
use stax::train::{TrainError, Trainer};

use super::{Common, Error};

/// The data-parallel flags.
#[derive(clap::Args, Debug, Clone)]
pub struct Distributed {
    /// Data parallel on this host's CPU: start N processes of this example (ranks), each on
    /// the CPU backend with `--batch` examples of every global batch.
    #[arg(long, conflicts_with = "gpus")]
    pub ranks: Option<usize>,
    /// Data parallel on N GPUs of this host: rank r trains on cuda:r, gradients all-reduced
    /// through NCCL.
    #[arg(long)]
    pub gpus: Option<usize>,
    /// With --ranks or --gpus: gradients are all-reduced in buckets of this size (bytes, or
    /// with KiB/MiB/GiB/TiB/KB/MB/GB/TB) during the backward pass.
    #[arg(long, default_value = "25MiB", value_parser = bucket_bytes)]
    pub bucket: u64,
}

/// `--bucket`: a size in bytes, checked when the flags are parsed (in the launcher too).
fn bucket_bytes(s: &str) -> Result<u64, String> {
    parse_size(s).ok_or_else(|| {
        "expected bytes, or a number with KiB, MiB, GiB, TiB, KB, MB, GB or TB".to_string()
    })
}

/// Starts the ranks when `--ranks` or `--gpus` asks and this process is not a rank itself:
/// true once they all finished (the first failure is the error). `--device` (`args.device`):
/// `auto` lets the ranks' device stand, another one must agree with it. Before any rank
/// starts, each rank's flags, its export paths renamed, pass `check`, and `world` checks what
/// the ranks share, given rank 0's flags with their device and the number of ranks.
pub fn launch_if_asked(
    args: &Common,
    check: impl Fn(&Common) -> Result<(), Error>,
    world: impl Fn(&Common, usize) -> Result<(), Error>,
) -> Result<bool, Error> {
    let (d, asked) = (&args.dist, args.device.as_str());
    let (n, device) = match (d.ranks, d.gpus) {
        (Some(n), _) => (n, "cpu"),
        (None, Some(n)) => (n, "cuda"),
        (None, None) => return Ok(false),
    };
    if Rendezvous::from_env()?.is_some() {
        return Ok(false);
    }
    if n == 0 {
        return Err("--ranks / --gpus: at least one".into());
    }
    if device == "cpu" && n > MAX_WORLD {
        let why = "the CPU ranks' TCP collective";
        return Err(format!("--ranks {n}: at most {MAX_WORLD} ranks ({why})").into());
    }
    for rank in 0..n {
        check(&ranked(args, rank))?;
    }
    // the same arguments, less the launcher's own, with the device of the ranks
    if asked != "auto" && !asked.starts_with(device) {
        let flag = if device == "cpu" { "--ranks" } else { "--gpus" };
        return Err(format!(
            "{flag} runs its ranks on {device}, but --device {asked} was given \
             (--ranks N: CPU processes; --gpus N: one GPU each)"
        )
        .into());
    }
    let mut rank0 = ranked(args, 0);
    rank0.device = device.into();
    world(&rank0, n)?;
    let mut args: Vec<OsString> = Vec::new();
    let mut given = std::env::args_os().skip(1);
    while let Some(a) = given.next() {
        match a.to_str() {
            Some("--ranks" | "--gpus" | "--device") => {
                given.next();
            }
            Some(s)
                if ["--ranks=", "--gpus=", "--device="]
                    .iter()
                    .any(|p| s.starts_with(p)) => {}
            _ => args.push(a),
        }
    }
    args.extend(["--device".into(), device.into()]);
    let me = std::env::current_exe()?;
    println!("launching {n} rank(s) of {} on {device}", me.display());
    launch(&me, &args, n, &[], Duration::from_secs(30))?;
    Ok(true)
}

/// The number of ranks of the data-parallel run this process is a rank of (1 when it is none).
pub fn world() -> Result<usize, Error> {
    Ok(Rendezvous::from_env()?.map_or(1, |rv| rv.world))
}

/// The CUDA ordinal of this process: its local rank in a data-parallel run, else `asked`.
pub fn ordinal(asked: usize) -> usize {
    std::env::var(LOCAL_RANK)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(asked)
}

/// `args` with this rank's export paths (`steps.jsonl` -> `steps.rank1.jsonl`) in a
/// data-parallel run.
pub fn for_rank(args: &Common) -> Result<Common, Error> {
    match Rendezvous::from_env()? {
        Some(rv) => Ok(ranked(args, rv.rank)),
        None => Ok(args.clone()),
    }
}

/// `args` with rank `rank`'s export paths.
fn ranked(args: &Common, rank: usize) -> Common {
    let mut args = args.clone();
    let paths = [
        &mut args.json,
        &mut args.trace,
        &mut args.plot,
        &mut args.record_trace,
    ];
    for path in paths.into_iter().flatten() {
        let ext = path.extension().map(|e| e.to_string_lossy().into_owned());
        let stem = path
            .file_stem()
            .map_or_else(String::new, |s| s.to_string_lossy().into_owned());
        let name = match ext {
            Some(e) => format!("{stem}.rank{rank}.{e}"),
            None => format!("{stem}.rank{rank}"),
        };
        *path = path.with_file_name(PathBuf::from(name));
    }
    args
}

/// Joins the data-parallel run the environment describes, if any: `(trainer, rank, world)`.
pub fn join(
    d: &Distributed,
    trainer: Trainer<super::Model>,
    backend: &Arc<dyn stax::Backend>,
) -> Result<(Trainer<super::Model>, usize, usize), Error> {
    let Some(rv) = Rendezvous::from_env()? else {
        return Ok((trainer, 0, 1));
    };
    let dp = DataParallel::connect(&rv, backend)?.with_bucket_bytes(d.bucket);
    let lib = dp.collective().library();
    println!(
        "data parallel: rank {} of {} on {} ({lib})",
        rv.rank,
        rv.world,
        backend.device()
    );
    let trainer = trainer
        .data_parallel(dp)
        .map_err(|e: TrainError| Box::new(e) as Error)?;
    Ok((trainer, rv.rank, rv.world))
}

/// This rank's part of a global batch of `world` x `batch` examples.
pub fn shard(indices: Vec<usize>, rank: usize, batch: usize) -> Vec<usize> {
    indices.into_iter().skip(rank * batch).take(batch).collect()
}

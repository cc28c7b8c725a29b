//! The one-host launcher (`torchrun --nproc-per-node N`): starts `world` processes of a
//! program with the rendezvous variables set, forwards their output line by line prefixed
//! `[rank r] `, and returns the first failure.

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::rendezvous::{LOCAL_RANK, RANK, RENDEZVOUS, WORLD_SIZE};
use crate::TrainError;

/// Forwards `from` to stdout (or stderr) line by line, each prefixed `[rank r] `.
fn forward(
    from: impl Read + Send + 'static,
    rank: usize,
    to_stderr: bool,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        for line in BufReader::new(from).lines() {
            let Ok(line) = line else { break };
            // a closed terminal is no reason to stop the ranks
            let _ = if to_stderr {
                writeln!(std::io::stderr(), "[rank {rank}] {line}")
            } else {
                writeln!(std::io::stdout(), "[rank {rank}] {line}")
            };
        }
    })
}

/// Runs `program args` as ranks `0..world` of one run on this host and waits for all of
/// them. Each gets `STAX_RANK`, `STAX_LOCAL_RANK` (= its rank: its device),
/// `STAX_WORLD_SIZE`, `STAX_RENDEZVOUS` (a fresh directory under the system's temporary
/// directory, removed at the end), `NCCL_NVLS_ENABLE=0` (NVLink multicast stays off) and
/// `env`. Once a rank fails, the others get `grace` to fail on their own (their collectives
/// time out or see the dead peer), then are killed.
///
/// # Errors
/// [`TrainError::RankFailed`] naming the first rank to fail (to start, or with a non-zero
/// exit status); [`TrainError::Io`] when the directory cannot be made.
pub fn launch(
    program: &Path,
    args: &[OsString],
    world: usize,
    env: &[(String, String)],
    grace: Duration,
) -> Result<(), TrainError> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let dir = std::env::temp_dir().join(format!("stax-rendezvous-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|source| TrainError::Io {
        op: "launch",
        path: dir.clone(),
        source,
    })?;
    let mut children: Vec<(usize, Child)> = Vec::new();
    let mut pipes = Vec::new();
    let mut first: Option<(usize, String)> = None;
    for rank in 0..world {
        let mut cmd = Command::new(program);
        cmd.args(args)
            .env(RANK, rank.to_string())
            .env(LOCAL_RANK, rank.to_string())
            .env(WORLD_SIZE, world.to_string())
            .env(RENDEZVOUS, &dir)
            .env("NCCL_NVLS_ENABLE", "0")
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        match cmd.spawn() {
            Ok(mut child) => {
                if let Some(out) = child.stdout.take() {
                    pipes.push(forward(out, rank, false));
                }
                if let Some(err) = child.stderr.take() {
                    pipes.push(forward(err, rank, true));
                }
                children.push((rank, child));
            }
            Err(e) => {
                first = Some((rank, format!("could not start {}: {e}", program.display())));
                break;
            }
        }
    }
    let mut failed_at = first.as_ref().map(|_| Instant::now());
    while !children.is_empty() {
        let mut still = Vec::new();
        for (rank, mut child) in children {
            match child.try_wait() {
                Ok(Some(status)) if status.success() => {}
                Ok(Some(status)) => {
                    first.get_or_insert((rank, status.to_string()));
                    failed_at.get_or_insert_with(Instant::now);
                }
                Ok(None) if failed_at.is_some_and(|t| t.elapsed() > grace) => {
                    // ours to end: it outlived the grace after another rank failed
                    let _ = child.kill();
                    let _ = child.wait();
                }
                Ok(None) => still.push((rank, child)),
                Err(e) => {
                    first.get_or_insert((rank, e.to_string()));
                    failed_at.get_or_insert_with(Instant::now);
                }
            }
        }
        children = still;
        std::thread::sleep(Duration::from_millis(20));
    }
    for p in pipes {
        // a forwarding thread only ends with its pipe
        let _ = p.join();
    }
    // best effort: the run is over
    let _ = std::fs::remove_dir_all(&dir);
    match first {
        Some((rank, status)) => Err(TrainError::RankFailed { rank, status }),
        None => Ok(()),
    }
}

//! The CPU backend's collective: std's TCP, a star around rank 0.
//!
//! Rank 0 listens ([`TcpRoot::bind`]; its address reaches the others out of band, through the
//! rendezvous), every other rank connects ([`TcpCollective::connect`]) and says its rank. An
//! all-reduce sends each rank's bytes to rank 0, which sums them in rank order
//! (`((x0 + x1) + x2) ...`, then divides by the world size) into its own tensors through one
//! receive chunk ([`CHUNK_BYTES`]) and sends the result back: every rank gets rank 0's bits.
//! Every message starts with a header (collective, sequence number, byte count) that the
//! receiver checks; every collective starts with each rank's header to rank 0, so ranks
//! calling different collectives (or the same one on other sizes) fail at once, on rank 0
//! with both named, instead of misreading or waiting.
//! Reads and writes time out ([`TcpStream::set_read_timeout`]); a dead peer is an
//! end-of-stream at once. Any failure shuts every connection of the rank down, so its peers
//! fail at their next read instead of waiting out the timeout, and makes every later call
//! fail.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{Collective, CommMemory, check_tensors, failed};
use crate::{Backend, BackendId, Tensor, TensorError};

/// Rank 0's receive chunk for summing: the host memory the collective holds.
pub const CHUNK_BYTES: usize = 1 << 20;

const MAGIC: u32 = 0x5354_4158; // "STAX"
const REDUCE: u32 = 1;
const BROADCAST: u32 = 2;
const BARRIER: u32 = 3;
const HELLO: u32 = 4;

fn op_name(op: u32) -> &'static str {
    match op {
        REDUCE => "all_reduce_mean",
        BROADCAST => "broadcast",
        BARRIER => "barrier",
        HELLO => "connect",
        _ => "an unknown message",
    }
}

/// The most ranks a TCP world holds: a connecting rank's hello packs its rank and the world's
/// size in 16 bits each.
pub const MAX_WORLD: usize = 0xffff;

/// Rank 0 before its peers connect: a bound listener whose address the others need.
#[derive(Debug)]
pub struct TcpRoot {
    listener: TcpListener,
}

impl TcpRoot {
    /// Listens on `addr` (`127.0.0.1:0`: any free port of this host; `0.0.0.0:0` for peers on
    /// other hosts).
    ///
    /// # Errors
    /// [`TensorError::Collective`] when the address cannot be bound.
    pub fn bind(addr: &str) -> Result<TcpRoot, TensorError> {
        let listener = TcpListener::bind(addr)
            .map_err(|e| failed("connect", 0, format!("cannot listen on {addr}: {e}")))?;
        Ok(TcpRoot { listener })
    }

    /// The address peers connect to (`host:port`).
    ///
    /// # Errors
    /// [`TensorError::Collective`] when the socket has no address.
    pub fn local_addr(&self) -> Result<String, TensorError> {
        let a = self.listener.local_addr();
        a.map(|a| a.to_string())
            .map_err(|e| failed("connect", 0, e.to_string()))
    }

    /// Waits for ranks `1..world` to connect (each once), within `timeout`: rank 0's
    /// collective for tensors of `backend`.
    ///
    /// # Errors
    /// [`TensorError::InvalidArgument`] for a world of 0 or over [`MAX_WORLD`];
    /// [`TensorError::Collective`] naming the ranks missing at the deadline, or a peer that
    /// said a wrong rank or world size.
    pub fn accept(
        self,
        backend: &Arc<dyn Backend>,
        world: usize,
        timeout: Duration,
    ) -> Result<TcpCollective, TensorError> {
        if world == 0 || world > MAX_WORLD {
            return Err(TensorError::InvalidArgument {
                op: "accept",
                reason: format!("a world of {world}: from 1 to {MAX_WORLD} ranks"),
            });
        }
        let deadline = Instant::now() + timeout;
        let mut peers: Vec<Option<TcpStream>> = (1..world).map(|_| None).collect();
        let io = |e: std::io::Error| failed("connect", 0, e.to_string());
        self.listener.set_nonblocking(true).map_err(io)?;
        while peers.iter().any(Option::is_none) {
            match self.listener.accept() {
                Ok((stream, _)) => {
                    stream.set_nonblocking(false).map_err(io)?;
                    configure(&stream, timeout).map_err(io)?;
                    let h = read_header(&stream, 0).map_err(|e| failed("connect", 0, e))?;
                    let (rank, their_world) = ((h.1 >> 16) as usize, (h.1 & 0xffff) as usize);
                    if h.0 != HELLO || their_world != world || rank == 0 || rank >= world {
                        return Err(failed(
                            "connect",
                            0,
                            format!(
                                "a peer said rank {rank} of {their_world}, expected 1..{world}"
                            ),
                        ));
                    }
                    if peers[rank - 1].is_some() {
                        return Err(failed("connect", 0, format!("rank {rank} connected twice")));
                    }
                    write_header(&stream, (HELLO, 0, 0)).map_err(|e| failed("connect", 0, e))?;
                    peers[rank - 1] = Some(stream);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if Instant::now() >= deadline {
                        let missing: Vec<String> = (1..world)
                            .filter(|r| peers[r - 1].is_none())
                            .map(|r| r.to_string())
                            .collect();
                        return Err(failed(
                            "connect",
                            0,
                            format!(
                                "rank(s) {} did not connect within {timeout:?}",
                                missing.join(", ")
                            ),
                        ));
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(e) => return Err(io(e)),
            }
        }
        let peers = peers.into_iter().flatten().collect();
        Ok(TcpCollective::new(backend, 0, world, peers, timeout))
    }
}

/// Reads and writes of a peer connection time out after `timeout`; no Nagle delay.
fn configure(stream: &TcpStream, timeout: Duration) -> std::io::Result<()> {
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    stream.set_nodelay(true)
}

/// A rank of the TCP collective (see the module docs).
#[derive(Debug)]
pub struct TcpCollective {
    rank: usize,
    world: usize,
    backend: Arc<dyn Backend>,
    /// Rank 0: ranks `1..world`, in order; another rank: rank 0 alone.
    peers: Vec<TcpStream>,
    timeout: Duration,
    /// The sequence number of the next collective, and rank 0's receive chunk.
    state: Mutex<(u32, Vec<u8>)>,
    broken: AtomicBool,
}

impl TcpCollective {
    fn new(
        backend: &Arc<dyn Backend>,
        rank: usize,
        world: usize,
        peers: Vec<TcpStream>,
        timeout: Duration,
    ) -> TcpCollective {
        let chunk = if rank == 0 && world > 1 {
            vec![0; CHUNK_BYTES]
        } else {
            Vec::new()
        };
        TcpCollective {
            rank,
            world,
            backend: backend.clone(),
            peers,
            timeout,
            state: Mutex::new((0, chunk)),
            broken: AtomicBool::new(false),
        }
    }

    /// A world of one: every collective is the identity, nothing is connected.
    pub fn single(backend: &Arc<dyn Backend>) -> TcpCollective {
        TcpCollective::new(backend, 0, 1, Vec::new(), Duration::from_secs(1))
    }

    /// Rank `rank` (`1..world`) of `world`, connecting to rank 0 at `addr` (retried until
    /// `timeout`; later reads and writes time out after it too), for tensors of `backend`.
    ///
    /// # Errors
    /// [`TensorError::InvalidArgument`] for a rank outside `1..world` or a world over
    /// [`MAX_WORLD`]; [`TensorError::Collective`] when rank 0 cannot be reached or does not
    /// answer in time.
    pub fn connect(
        backend: &Arc<dyn Backend>,
        rank: usize,
        world: usize,
        addr: &str,
        timeout: Duration,
    ) -> Result<TcpCollective, TensorError> {
        if rank == 0 || rank >= world || world > MAX_WORLD {
            let reason = format!(
                "rank {rank} of {world}: a connecting rank is 1..world, in a world of at most \
                 {MAX_WORLD}"
            );
            return Err(TensorError::InvalidArgument {
                op: "connect",
                reason,
            });
        }
        let deadline = Instant::now() + timeout;
        let fail = |e: String| failed("connect", rank, format!("rank 0 at {addr}: {e}"));
        let target = addr
            .to_socket_addrs()
            .map_err(|e| fail(e.to_string()))?
            .next()
            .ok_or_else(|| fail("no address".into()))?;
        let stream = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match TcpStream::connect_timeout(&target, left.max(Duration::from_millis(1))) {
                Ok(s) => break s,
                Err(e) if Instant::now() >= deadline => return Err(fail(e.to_string())),
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        };
        configure(&stream, timeout).map_err(|e| fail(e.to_string()))?;
        let hello = (HELLO, ((rank as u32) << 16) | world as u32, 0);
        write_header(&stream, hello).map_err(fail)?;
        let ack = read_header(&stream, 0).map_err(fail)?;
        if ack.0 != HELLO {
            return Err(fail("answered with something else than a welcome".into()));
        }
        Ok(TcpCollective::new(
            backend,
            rank,
            world,
            vec![stream],
            timeout,
        ))
    }

    /// Runs one collective: fails at once after an earlier failure, and on failure shuts
    /// every connection down (see the module docs).
    fn run(
        &self,
        op: &'static str,
        body: impl FnOnce(&mut (u32, Vec<u8>)) -> Result<(), String>,
    ) -> Result<(), TensorError> {
        if self.broken.load(Ordering::SeqCst) {
            return Err(failed(op, self.rank, "the communicator failed earlier"));
        }
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let result = body(&mut state);
        state.0 = state.0.wrapping_add(1);
        result.map_err(|reason| {
            self.broken.store(true, Ordering::SeqCst);
            for p in &self.peers {
                // the peer may be gone already
                let _ = p.shutdown(Shutdown::Both);
            }
            failed(op, self.rank, reason)
        })
    }
}

/// A message header: collective, sequence number (or the hello's rank and world), bytes.
type Header = (u32, u32, u64);

fn write_header(s: &TcpStream, (op, seq, len): Header) -> Result<(), String> {
    let mut b = [0u8; 20];
    b[..4].copy_from_slice(&MAGIC.to_le_bytes());
    b[4..8].copy_from_slice(&op.to_le_bytes());
    b[8..12].copy_from_slice(&seq.to_le_bytes());
    b[12..].copy_from_slice(&len.to_le_bytes());
    let mut s = s;
    s.write_all(&b).map_err(|e| io_reason("sending to", e))
}

fn read_header(s: &TcpStream, peer: usize) -> Result<Header, String> {
    let mut b = [0u8; 20];
    let mut s = s;
    s.read_exact(&mut b)
        .map_err(|e| format!("rank {peer}: {}", io_reason("reading from", e)))?;
    let word = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
    if word(0) != MAGIC {
        return Err(format!(
            "rank {peer} sent something that is not a stax message"
        ));
    }
    let mut len = [0u8; 8];
    len.copy_from_slice(&b[12..]);
    Ok((word(4), word(8), u64::from_le_bytes(len)))
}

/// Why a read or write failed, in words: a dead peer or a timeout.
fn io_reason(what: &str, e: std::io::Error) -> String {
    use std::io::ErrorKind::*;
    match e.kind() {
        UnexpectedEof | ConnectionReset | ConnectionAborted | BrokenPipe => {
            format!("{what} a peer failed: the peer's process exited or failed ({e})")
        }
        WouldBlock | TimedOut => format!("{what} a peer timed out: no answer in time ({e})"),
        _ => format!("{what} a peer failed: {e}"),
    }
}

/// Reads a header from `peer` and checks it is `want`.
fn expect(s: &TcpStream, peer: usize, want: Header) -> Result<(), String> {
    let got = read_header(s, peer)?;
    if got == want {
        return Ok(());
    }
    Err(format!(
        "rank {peer} called {} #{} of {} bytes where this rank called {} #{} of {} bytes",
        op_name(got.0),
        got.1,
        got.2,
        op_name(want.0),
        want.1,
        want.2
    ))
}

fn bytes_mut<'a>(op: &'static str, t: &'a mut Tensor) -> Result<&'a mut [u8], String> {
    t.host_bytes_mut()
        .ok_or_else(|| format!("{op}: the tensor is not in host memory (the CPU backend's)"))
}

fn send_all(s: &TcpStream, tensors: &mut [&mut Tensor], op: &'static str) -> Result<(), String> {
    let mut s = s;
    for t in tensors.iter_mut() {
        s.write_all(bytes_mut(op, t)?)
            .map_err(|e| io_reason("sending to", e))?;
    }
    Ok(())
}

fn recv_all(s: &TcpStream, tensors: &mut [&mut Tensor], op: &'static str) -> Result<(), String> {
    let mut s = s;
    for t in tensors.iter_mut() {
        s.read_exact(bytes_mut(op, t)?)
            .map_err(|e| io_reason("reading from", e))?;
    }
    Ok(())
}

/// Rank 0: adds `peer`'s tensors (f32, as many bytes as its own) into its own, through
/// `chunk`.
fn add_from(s: &TcpStream, tensors: &mut [&mut Tensor], chunk: &mut [u8]) -> Result<(), String> {
    let mut s = s;
    for t in tensors.iter_mut() {
        let own = bytes_mut("all_reduce_mean", t)?;
        let own: &mut [f32] = bytemuck::try_cast_slice_mut(own).map_err(|e| e.to_string())?;
        for part in own.chunks_mut(chunk.len() / 4) {
            let buf = &mut chunk[..part.len() * 4];
            s.read_exact(buf)
                .map_err(|e| io_reason("reading from", e))?;
            for (a, b) in part.iter_mut().zip(buf.chunks_exact(4)) {
                *a += f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
    }
    Ok(())
}

fn total_bytes(tensors: &[&mut Tensor]) -> u64 {
    tensors.iter().map(|t| t.bytes() as u64).sum()
}

impl Collective for TcpCollective {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world(&self) -> usize {
        self.world
    }

    fn library(&self) -> &'static str {
        "tcp"
    }

    fn backend(&self) -> BackendId {
        self.backend.id()
    }

    fn all_reduce_mean(&self, tensors: &mut [&mut Tensor]) -> Result<(), TensorError> {
        const OP: &str = "all_reduce_mean";
        check_tensors(OP, &self.backend, tensors, false)?;
        if self.world == 1 {
            return Ok(());
        }
        let len = total_bytes(tensors);
        let world = self.world as f32;
        self.run(OP, |(seq, chunk)| {
            let header = (REDUCE, *seq, len);
            if self.rank != 0 {
                write_header(&self.peers[0], header)?;
                send_all(&self.peers[0], tensors, OP)?;
                expect(&self.peers[0], 0, header)?;
                return recv_all(&self.peers[0], tensors, OP);
            }
            for (i, p) in self.peers.iter().enumerate() {
                expect(p, i + 1, header)?;
                add_from(p, tensors, chunk)?;
            }
            for t in tensors.iter_mut() {
                let own = bytes_mut(OP, t)?;
                let own: &mut [f32] =
                    bytemuck::try_cast_slice_mut(own).map_err(|e| e.to_string())?;
                own.iter_mut().for_each(|v| *v /= world);
            }
            for p in &self.peers {
                write_header(p, header)?;
                send_all(p, tensors, OP)?;
            }
            Ok(())
        })
    }

    fn broadcast(&self, tensors: &mut [&mut Tensor]) -> Result<(), TensorError> {
        const OP: &str = "broadcast";
        check_tensors(OP, &self.backend, tensors, true)?;
        if self.world == 1 {
            return Ok(());
        }
        let len = total_bytes(tensors);
        self.run(OP, |(seq, _)| {
            let header = (BROADCAST, *seq, len);
            if self.rank != 0 {
                write_header(&self.peers[0], header)?;
                expect(&self.peers[0], 0, header)?;
                return recv_all(&self.peers[0], tensors, OP);
            }
            for (i, p) in self.peers.iter().enumerate() {
                expect(p, i + 1, header)?;
            }
            for p in &self.peers {
                write_header(p, header)?;
                send_all(p, tensors, OP)?;
            }
            Ok(())
        })
    }

    fn barrier(&self) -> Result<(), TensorError> {
        if self.world == 1 {
            return Ok(());
        }
        self.run("barrier", |(seq, _)| {
            let header = (BARRIER, *seq, 0);
            if self.rank != 0 {
                write_header(&self.peers[0], header)?;
                return expect(&self.peers[0], 0, header);
            }
            for (i, p) in self.peers.iter().enumerate() {
                expect(p, i + 1, header)?;
            }
            self.peers.iter().try_for_each(|p| write_header(p, header))
        })
    }

    fn wait(&self) -> Result<(), TensorError> {
        Ok(())
    }

    fn outside_bytes(&self) -> CommMemory {
        let chunk = self.state.lock().unwrap_or_else(|p| p.into_inner());
        CommMemory {
            device: None,
            host: chunk.1.len() as u64,
        }
    }

    fn timeout(&self) -> Duration {
        self.timeout
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{BackendOptions, Category, Device};

    /// Rank 0 and rank 1 of a TCP collective in this process (rank 1 on a thread's end).
    fn pair(timeout: Duration) -> (TcpCollective, TcpCollective) {
        let be = Device::Cpu.open(&BackendOptions::default()).unwrap();
        let root = TcpRoot::bind("127.0.0.1:0").unwrap();
        let addr = root.local_addr().unwrap();
        let other = be.clone();
        let peer = std::thread::spawn(move || TcpCollective::connect(&other, 1, 2, &addr, timeout));
        let zero = root.accept(&be, 2, timeout).unwrap();
        (zero, peer.join().unwrap().unwrap())
    }

    fn tensor(c: &TcpCollective, v: &[f32]) -> Tensor {
        Tensor::from_slice(&c.backend, v, [v.len()], Category::Gradient).unwrap()
    }

    #[test]
    fn the_mean_and_the_broadcast_reach_both_ranks() {
        let (zero, one) = pair(Duration::from_secs(5));
        let (mut a, mut b) = (
            tensor(&zero, &[1.0, 2.0, 3.0]),
            tensor(&one, &[3.0, 6.0, -1.0]),
        );
        let t = std::thread::spawn(move || {
            one.all_reduce_mean(&mut [&mut b]).unwrap();
            one.broadcast(&mut [&mut b]).unwrap();
            one.barrier().unwrap();
            b.to_vec().unwrap()
        });
        zero.all_reduce_mean(&mut [&mut a]).unwrap();
        assert_eq!(a.to_vec().unwrap(), [2.0, 4.0, 1.0]);
        let mut c = tensor(&zero, &[7.0, 8.0, 9.0]);
        zero.broadcast(&mut [&mut c]).unwrap();
        zero.barrier().unwrap();
        assert_eq!(t.join().unwrap(), [7.0, 8.0, 9.0]);
        assert_eq!(zero.outside_bytes().host, CHUNK_BYTES as u64);
    }

    #[test]
    fn ranks_calling_different_collectives_both_fail_naming_them() {
        let (zero, one) = pair(Duration::from_secs(5));
        let mut b = tensor(&one, &[1.0; 4]);
        let t = std::thread::spawn(move || one.broadcast(&mut [&mut b]).unwrap_err().to_string());
        let mut a = tensor(&zero, &[1.0; 2]);
        let e = zero.all_reduce_mean(&mut [&mut a]).unwrap_err().to_string();
        let said = "rank 1 called broadcast #0 of 16 bytes where this rank called all_reduce_mean #0 of 8 bytes";
        assert!(e.contains(said), "{e}");
        let theirs = t.join().unwrap();
        assert!(
            theirs.starts_with("collective broadcast on rank 1:")
                && theirs.contains("exited or failed"),
            "{theirs}"
        );
        // the communicator stays failed
        let later = zero.barrier().unwrap_err().to_string();
        assert!(later.contains("failed earlier"), "{later}");
    }

    #[test]
    fn a_silent_peer_is_a_timeout() {
        let (zero, _one) = pair(Duration::from_millis(300));
        let start = Instant::now();
        let e = zero.barrier().unwrap_err().to_string();
        assert!(e.contains("timed out"), "{e}");
        assert!(start.elapsed() < Duration::from_secs(3));
    }
}

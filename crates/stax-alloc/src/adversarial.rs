//! Hostile allocation traces, by name: sequences that break allocators, each with the device
//! size that makes it hostile. The adversarial suite (`tests/adversarial.rs`, in CI on the
//! simulated backend) replays every one against `caching`, `expandable`, `bfc` and `platform`
//! and checks each strategy's stated bound after every event; `alloc_bench` replays them by
//! name (`--builtin NAME`).
//!
//! | name | device | what it does | what it breaks |
//! | --- | --- | --- | --- |
//! | `pytorch-35901` | 2 GiB | 1.2 GiB allocated and freed, ten 20 MiB blocks kept, 1.2 GiB again | small blocks carved out of the large cached segment (pytorch#35901) |
//! | `rmm-35` | 143,771 MiB | 20 rounds: two blocks of 512 MiB + 24 MiB x round, both freed | freed segments never merged or given back: 29.8 GiB reserved for 1.94 GiB live (rmm#35, rmm#1957) |
//! | `pinned-holes` | 1.5 GiB | 32 x (24 MiB block, 1.5 MiB pin), the blocks freed, then 16 x 40 MiB | holes between live pins too small for what comes next (a non-moving allocator's worst case) |
//! | `ping-pong` | 2 GiB | 8 rounds: 1.3 GiB alone, then two 0.7 GiB together | a large free block split for the first half of a pair, the second half finds no room |
//! | `growing-buffer` | 2 GiB | a buffer grown 40 times by 16 MiB (new one allocated, old one freed) | every size is new: each growth misses the cache (KV caches, `realloc`) |
//! | `random-mixed` | 8 GiB | 4,000 seeded steps (then every block freed): log-uniform sizes from 256 bytes to 256 MiB, random lifetimes, at most about 3 GiB live | general fragmentation |
//! | `many-small` | 1 GiB | 4,000 seeded steps (then every block freed) of 256 bytes to 64 KiB, at most about 64 MiB live | the small pool and the hot path |
//!
//! ```
//! let s = stax_alloc::adversarial::scenario("pytorch-35901").unwrap();
//! assert_eq!(s.capacity, 2 << 30);
//! assert_eq!(s.trace.events.len(), 24);
//! assert!(stax_alloc::adversarial::scenario("nope").is_none());
//! ```

use crate::{Category, Trace, TraceBuilder};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// One hostile trace and the simulated device it is meant for.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// Its name (`--builtin NAME`).
    pub name: &'static str,
    /// What it does, in a line.
    pub about: &'static str,
    /// Bytes of the device that makes it hostile.
    pub capacity: u64,
    /// The events.
    pub trace: Trace,
}

/// The names of every scenario, in the order [`scenarios`] returns them.
pub const NAMES: [&str; 7] = [
    "pytorch-35901",
    "rmm-35",
    "pinned-holes",
    "ping-pong",
    "growing-buffer",
    "random-mixed",
    "many-small",
];

/// Every scenario (see the module docs).
pub fn scenarios() -> Vec<Scenario> {
    NAMES.iter().filter_map(|n| scenario(n)).collect()
}

/// The scenario called `name`, or None.
pub fn scenario(name: &str) -> Option<Scenario> {
    let (name, about, capacity, trace) = match name {
        "pytorch-35901" => (
            NAMES[0],
            "1.2 GiB freed, ten 20 MiB kept, 1.2 GiB again, on 2 GiB",
            2 * GIB,
            pytorch_35901(),
        ),
        "rmm-35" => (
            NAMES[1],
            "20 rounds of two rising blocks (at most 1.94 GiB live), both freed",
            143_771 * MIB,
            rmm_35(),
        ),
        "pinned-holes" => (
            NAMES[2],
            "32 x (24 MiB, 1.5 MiB pin), the 24 MiB freed, then 16 x 40 MiB, on 1.5 GiB",
            3 * GIB / 2,
            pinned_holes(),
        ),
        "ping-pong" => (
            NAMES[3],
            "8 rounds of 1.3 GiB alone then 2 x 0.7 GiB together, on 2 GiB",
            2 * GIB,
            ping_pong(),
        ),
        "growing-buffer" => (
            NAMES[4],
            "a buffer grown 40 times by 16 MiB (allocate new, free old), on 2 GiB",
            2 * GIB,
            growing_buffer(),
        ),
        "random-mixed" => (
            NAMES[5],
            "4,000 seeded steps, log-uniform 256 B to 256 MiB, random lifetimes, on 8 GiB",
            8 * GIB,
            random(0x5EED_0001, 4_000, (8, 27), 3 * GIB),
        ),
        "many-small" => (
            NAMES[6],
            "4,000 seeded steps of 256 B to 64 KiB, random lifetimes, on 1 GiB",
            GIB,
            random(0x5EED_0002, 4_000, (8, 15), 64 * MIB),
        ),
        _ => return None,
    };
    Some(Scenario {
        name,
        about,
        capacity,
        trace,
    })
}

/// 1.2 GiB (1,288,490,189 bytes) allocated and freed; ten 20 MiB blocks allocated and kept;
/// 1.2 GiB again; then everything freed.
fn pytorch_35901() -> Trace {
    let big = 1_288_490_189;
    let mut b = TraceBuilder::new();
    let first = b.alloc(big, Category::Activation);
    b.free(first);
    let small: Vec<u64> = (0..10)
        .map(|_| b.alloc(20 * MIB, Category::Activation))
        .collect();
    let second = b.alloc(big, Category::Activation);
    b.free(second);
    small.into_iter().for_each(|id| b.free(id));
    b.finish()
}

/// Round `i` of 1..=20: two blocks of 512 MiB + 24 MiB x i, then both freed.
fn rmm_35() -> Trace {
    let mut b = TraceBuilder::new();
    for i in 1..=20 {
        let bytes = 512 * MIB + 24 * MIB * i;
        let x = b.alloc(bytes, Category::Activation);
        let y = b.alloc(bytes, Category::Gradient);
        b.free(x);
        b.free(y);
    }
    b.finish()
}

fn pinned_holes() -> Trace {
    let mut b = TraceBuilder::new();
    let mut holes = Vec::new();
    let mut pins = Vec::new();
    for _ in 0..32 {
        holes.push(b.alloc(24 * MIB, Category::Activation));
        pins.push(b.alloc(3 * MIB / 2, Category::Parameter));
    }
    holes.into_iter().for_each(|id| b.free(id));
    let big: Vec<u64> = (0..16)
        .map(|_| b.alloc(40 * MIB, Category::Activation))
        .collect();
    big.into_iter().chain(pins).for_each(|id| b.free(id));
    b.finish()
}

fn ping_pong() -> Trace {
    let mut b = TraceBuilder::new();
    for _ in 0..8 {
        let a = b.alloc(13 * GIB / 10, Category::Activation);
        b.free(a);
        let x = b.alloc(7 * GIB / 10, Category::Activation);
        let y = b.alloc(7 * GIB / 10, Category::Gradient);
        b.free(x);
        b.free(y);
    }
    b.finish()
}

fn growing_buffer() -> Trace {
    let mut b = TraceBuilder::new();
    let mut old = b.alloc(16 * MIB, Category::Other);
    for i in 2..=40 {
        let new = b.alloc(16 * MIB * i, Category::Other);
        b.free(old);
        old = new;
    }
    b.free(old);
    b.finish()
}

/// `steps` seeded random steps, then every block freed. A step allocates with probability 3/5
/// while fewer than `live_cap` bytes are live (always when nothing is), else frees a random
/// live block; sizes are uniform in `[2^k, 2^(k + 1))` with `k` uniform in `log2` (inclusive).
fn random(seed: u64, steps: usize, log2: (u32, u32), live_cap: u64) -> Trace {
    let mut x = seed;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut b = TraceBuilder::new();
    let mut live: Vec<(u64, u64)> = Vec::new();
    let mut live_bytes = 0u64;
    for _ in 0..steps {
        let r = next();
        let grow = live.is_empty() || (live_bytes < live_cap && r % 5 < 3);
        if grow {
            let k = log2.0 + (next() % u64::from(log2.1 - log2.0 + 1)) as u32;
            let bytes = (1u64 << k) + next() % (1u64 << k);
            let cat = Category::ALL[(next() % 7) as usize];
            live.push((b.alloc(bytes, cat), bytes));
            live_bytes += bytes;
        } else {
            let (id, bytes) = live.swap_remove((next() % live.len() as u64) as usize);
            b.free(id);
            live_bytes -= bytes;
        }
    }
    live.into_iter().for_each(|(id, _)| b.free(id));
    b.finish()
}

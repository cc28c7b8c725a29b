//! Allocator benchmarking: replay allocation traces against each strategy and compare what
//! they reserve, how they fragment, how often they call the driver and how fast they are.
//!
//! ```text
//! cargo run --release --example alloc_bench                        # every built-in trace, sim
//! cargo run --release --example alloc_bench -- --builtin rmm-35 --builtin ping-pong
//! cargo run --release --example alloc_bench -- --seed-step --replays 100 --csv
//! cargo run --release --example alloc_bench -- --trace run.jsonl --strategy caching,bfc:fraction=0.5
//! cargo run --release --example alloc_bench -- --backend cuda --json   # the GPU, async included
//! python3 scripts/torch_snapshot_to_trace.py snapshot.pickle run.jsonl  # a PyTorch workload
//! ```
//!
//! Traces: `--trace FILE` (stax_alloc's JSON-lines format, see its crate docs), `--builtin
//! NAME` (the adversarial traces of `stax_alloc::adversarial`, `all` for every one; `--list`
//! names them), `--seed-step` (the seed model's set-up and two training steps at
//! `--seed-batch`, 200x200x3, recorded from the trainer's code through the memory plan, with
//! the CPU's workspace sizes on `sim` and cuDNN's on `cuda`). Without any: every built-in
//! trace and the seed step.
//!
//! Backends: `sim` (a simulated device: the built-in traces bring the device size that makes
//! them hostile, the others use `--capacity`) or `cuda` (device 0's memory through stax-tensor:
//! `cuMemAlloc`, virtual memory for `expandable`, the stream-ordered pool for `async`; the
//! whole device, whatever the trace's simulated size). Strategies: `--strategy` (comma-separated
//! strategy strings), default caching, expandable, bfc, platform, and async on cuda.
//!
//! Columns: peak live (requested) bytes, peak reserved bytes, their ratio, the largest free
//! block when live bytes peaked, backend (driver) calls, and nanoseconds per allocation (p50,
//! p99, each timed alone, clock overhead subtracted). `--json` and `--csv` print the same
//! rows with exact byte counts for scripts.

use clap::{Parser, ValueEnum};
use stax::alloc::bench::{BenchResult, bench};
use stax::alloc::{Allocator, RawMemory, SimMemory, Strategy, Trace, adversarial, parse_size};
use stax::train::seed::seed_step_trace;
use stax::{Backend, BackendOptions, Device};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Replay allocation traces against allocator strategies and print the comparison.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// A trace in stax_alloc's JSON-lines format (repeatable).
    #[arg(long = "trace", value_name = "FILE")]
    traces: Vec<PathBuf>,
    /// A built-in adversarial trace by name, or `all` (repeatable; --list names them).
    #[arg(long = "builtin", value_name = "NAME")]
    builtins: Vec<String>,
    /// The seed model's set-up and two training steps (200x200x3, batch --seed-batch).
    #[arg(long)]
    seed_step: bool,
    /// Batch size of --seed-step.
    #[arg(long, default_value_t = 100)]
    seed_batch: usize,
    /// Strategies to compare, comma-separated (e.g. caching,bfc:fraction=0.5). Default:
    /// caching, expandable, bfc, platform, and on cuda async.
    #[arg(long, value_delimiter = ',')]
    strategy: Vec<Strategy>,
    /// Where the memory comes from.
    #[arg(long, value_enum, default_value_t = BackendKind::Sim)]
    backend: BackendKind,
    /// Simulated device size for --trace and --seed-step (the built-in traces bring theirs).
    #[arg(long, default_value = "143771MiB", value_parser = size)]
    capacity: u64,
    /// Simulated segment and page granularity.
    #[arg(long, default_value = "2MiB", value_parser = size)]
    granularity: u64,
    /// Simulated cost of one driver call, in nanoseconds (busy-wait; 0: free).
    #[arg(long, default_value_t = 0)]
    sim_call_ns: u64,
    /// Replays of each trace on one allocator (the first one cold, the others warm).
    #[arg(long, default_value_t = 1)]
    replays: usize,
    /// Print the rows as a JSON array.
    #[arg(long)]
    json: bool,
    /// Print the rows as CSV.
    #[arg(long, conflicts_with = "json")]
    csv: bool,
    /// List the built-in traces and exit.
    #[arg(long)]
    list: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, ValueEnum)]
enum BackendKind {
    /// A simulated device (no GPU needed).
    Sim,
    /// CUDA device 0.
    Cuda,
}

fn size(s: &str) -> Result<u64, String> {
    parse_size(s).ok_or_else(|| format!("{s:?} is not a size (bytes, or KiB, MiB, GiB, MB...)"))
}

/// A trace to replay, and the simulated device size it asks for (None: --capacity).
struct Job {
    name: String,
    capacity: Option<u64>,
    trace: Trace,
}

fn main() {
    let args = Args::parse();
    if args.list {
        for s in adversarial::scenarios() {
            println!("{:<16} {:>10}  {}", s.name, short(s.capacity), s.about);
        }
        return;
    }
    if let Err(e) = run(&args) {
        eprintln!("alloc_bench: {e}");
        std::process::exit(1);
    }
}

fn run(args: &Args) -> Result<(), String> {
    // On cuda: device 0's memory, and its stream-ordered pool when async is asked for. The
    // backends stay open (their contexts) while the allocators run on their memory.
    let cuda = match args.backend {
        BackendKind::Sim => None,
        BackendKind::Cuda => Some(open_cuda(false)?),
    };
    let strategies = if args.strategy.is_empty() {
        let mut v = vec![
            Strategy::Caching,
            Strategy::Expandable,
            Strategy::Bfc { fraction: 0.75 },
            Strategy::Platform,
        ];
        if cuda.is_some() {
            v.push(Strategy::Async {
                release_threshold: u64::MAX,
            });
        }
        v
    } else {
        args.strategy.clone()
    };
    let pool = match (
        &cuda,
        strategies
            .iter()
            .any(|s| matches!(s, Strategy::Async { .. })),
    ) {
        (Some(_), true) => Some(open_cuda(true)?),
        _ => None,
    };
    let jobs = jobs(args, cuda.as_ref())?;
    if cuda.is_some() && jobs.iter().any(|j| j.capacity.is_some()) {
        eprintln!("alloc_bench: note: on cuda the built-in traces run on the whole device");
    }
    let mut rows = Vec::new();
    for job in &jobs {
        for strategy in &strategies {
            let stream_ordered = matches!(strategy, Strategy::Async { .. });
            let raw: Arc<dyn RawMemory> = match (&cuda, &pool) {
                (Some(_), Some(p)) if stream_ordered => p.allocator().backend().clone(),
                (Some(c), _) => c.allocator().backend().clone(),
                (None, _) => {
                    let bytes = usize::try_from(args.granularity).unwrap_or(2 << 20);
                    let sim = SimMemory::new(job.capacity.unwrap_or(args.capacity), bytes)
                        .with_stream_ordered(stream_ordered)
                        .with_call_cost(Duration::from_nanos(args.sim_call_ns));
                    Arc::new(sim)
                }
            };
            let events = job.trace.events.len();
            let row = match Allocator::new(raw.clone(), strategy.clone()) {
                Ok(alloc) => bench(&job.trace, &job.name, &alloc, args.replays)
                    .map_err(|e| format!("{}: {e}", job.name))?,
                Err(e) => BenchResult::not_started(&job.name, strategy, &*raw, events, &e),
            };
            if !args.json && !args.csv {
                eprint!(".");
            }
            rows.push(row);
        }
    }
    if !args.json && !args.csv {
        eprintln!();
    }
    print!("{}", render(args, &rows)?);
    Ok(())
}

/// Opens CUDA device 0 (with the async strategy: its stream-ordered pool), or says why not.
fn open_cuda(stream_ordered: bool) -> Result<Arc<dyn Backend>, String> {
    let strategy = if stream_ordered {
        Strategy::Async {
            release_threshold: u64::MAX,
        }
    } else {
        Strategy::Caching
    };
    let options = BackendOptions {
        strategy,
        ..BackendOptions::default()
    };
    Device::Cuda(0)
        .open(&options)
        .map_err(|e| format!("--backend cuda needs a CUDA device: {e}"))
}

/// The traces asked for (every built-in and the seed step when none is).
fn jobs(args: &Args, cuda: Option<&Arc<dyn Backend>>) -> Result<Vec<Job>, String> {
    let mut jobs = Vec::new();
    for path in &args.traces {
        let file =
            std::fs::File::open(path).map_err(|e| format!("--trace {}: {e}", path.display()))?;
        let trace = Trace::read_jsonl(std::io::BufReader::new(file))
            .map_err(|e| format!("--trace {}: {e}", path.display()))?;
        let name = path
            .file_name()
            .map_or("trace".into(), |n| n.to_string_lossy().into_owned());
        jobs.push(Job {
            name,
            capacity: None,
            trace,
        });
    }
    let everything = args.traces.is_empty() && args.builtins.is_empty() && !args.seed_step;
    let mut names: Vec<&str> = Vec::new();
    for b in &args.builtins {
        match b.as_str() {
            "all" => names.extend(adversarial::NAMES),
            n if adversarial::NAMES.contains(&n) => names.push(n),
            n => {
                return Err(format!(
                    "--builtin {n:?}: no such trace; the built-in traces are all, {}",
                    adversarial::NAMES.join(", ")
                ));
            }
        }
    }
    if everything {
        names.extend(adversarial::NAMES);
    }
    for n in names {
        let s = adversarial::scenario(n).expect("a listed name");
        jobs.push(Job {
            name: s.name.to_string(),
            capacity: Some(s.capacity),
            trace: s.trace,
        });
    }
    if args.seed_step || everything {
        let cpu;
        let target = match cuda {
            Some(c) => c,
            None => {
                cpu = Device::Cpu
                    .open(&BackendOptions::default())
                    .map_err(|e| e.to_string())?;
                &cpu
            }
        };
        let trace =
            seed_step_trace(target, args.seed_batch, (200, 200, 3)).map_err(|e| e.to_string())?;
        jobs.push(Job {
            name: format!("seed-step-b{}", args.seed_batch),
            capacity: None,
            trace,
        });
    }
    Ok(jobs)
}

/// The rows as a table, JSON or CSV.
fn render(args: &Args, rows: &[BenchResult]) -> Result<String, String> {
    if args.json {
        return serde_json::to_string_pretty(rows)
            .map(|s| s + "\n")
            .map_err(|e| e.to_string());
    }
    let fields = |r: &BenchResult| {
        [
            r.peak_live.to_string(),
            r.peak_reserved.to_string(),
            format!("{:.4}", r.reserved_per_peak),
            r.largest_free_at_peak.to_string(),
            r.backend_calls.to_string(),
            r.alloc_ns_p50.to_string(),
            r.alloc_ns_p99.to_string(),
        ]
    };
    let mut out = String::new();
    if args.csv {
        out.push_str("trace,strategy,backend,events,replays,allocations,result,peak_live,");
        out.push_str("peak_reserved,reserved_per_peak,largest_free_at_peak,backend_calls,");
        out.push_str("alloc_ns_p50,alloc_ns_p99\n");
        for r in rows {
            let result = r.failure.as_deref().unwrap_or("ok").replace('"', "'");
            out.push_str(&format!(
                "{},{},{},{},{},{},\"{result}\",{}\n",
                r.trace,
                r.strategy,
                r.backend,
                r.events,
                r.replays,
                r.allocations,
                fields(r).join(",")
            ));
        }
        return Ok(out);
    }
    out.push_str(&format!(
        "{:<18} {:<34} {:<6} {:>10} {:>10} {:>9} {:>12} {:>9} {:>8} {:>8}\n",
        "trace",
        "strategy",
        "result",
        "peak live",
        "reserved",
        "res/peak",
        "free@peak",
        "calls",
        "p50 ns",
        "p99 ns"
    ));
    for r in rows {
        let result = if r.failure.is_some() { "OOM" } else { "ok" };
        out.push_str(&format!(
            "{:<18} {:<34} {:<6} {:>10} {:>10} {:>9.4} {:>12} {:>9} {:>8} {:>8}\n",
            r.trace,
            r.strategy,
            result,
            short(r.peak_live),
            short(r.peak_reserved),
            r.reserved_per_peak,
            short(r.largest_free_at_peak),
            r.backend_calls,
            r.alloc_ns_p50,
            r.alloc_ns_p99
        ));
    }
    for r in rows.iter().filter(|r| r.failure.is_some()) {
        let why = r.failure.as_deref().unwrap_or_default();
        out.push_str(&format!("{} under {}: {why}\n", r.trace, r.strategy));
    }
    Ok(out)
}

/// `"1.31 GB"`: decimal units, two decimals.
fn short(b: u64) -> String {
    let h = stax::alloc::human_bytes(b);
    h.split(" (").next().unwrap_or_default().to_string()
}

//! What the examples write besides their step lines: `--plan`'s table and largest batch,
//! `--json`, `--record-trace`, `--trace` and `--plot`.

use super::{Common, Error, Model};
use stax::alloc::human_bytes;
use stax::train::TrainError;
use stax::train::export::{XAxis, stacked_series, write_perfetto, write_svg};
use stax::train::plan::{MemoryPlan, NamedTrace, Timeline, max_batch_that_fits};
use std::path::Path;
use std::sync::Arc;

/// `--plan`: the table, the largest batch for the budget, and the plan's exports.
pub fn show_plan(
    args: &Common,
    plan: &MemoryPlan,
    model: &Model,
    backend: &Arc<dyn stax::Backend>,
) -> Result<(), Error> {
    println!("{plan}");
    if let Some(gpu) = backend.as_cuda() {
        // cuDNN's choice per conv pass, what a larger allowance would buy (the search times
        // candidates over the limit where the device has room), and every candidate
        for conv in gpu.conv_plans() {
            println!("{conv:#}");
        }
    }
    println!(
        "memory the run needs under the {} allocator (rounding, granules, fragmentation): {}",
        backend.allocator().strategy(),
        human_bytes(plan.min_budget()?)
    );
    let budget = args.budget()?;
    let adam = args.adam();
    match max_batch_that_fits(model, &plan.input, &adam, backend, args.feed(), budget) {
        Ok(n) => println!(
            "largest batch that fits {}: {n} (allocator {})",
            budget.map_or("the free device memory".into(), human_bytes),
            backend.allocator().strategy()
        ),
        Err(TrainError::NoBudget { device }) => {
            println!(
                "largest batch that fits: give --budget (the {device} backend has no memory size)"
            )
        }
        Err(e) => return Err(e.into()),
    }
    if let Some(path) = &args.json {
        written(
            "--json",
            path,
            std::fs::write(path, serde_json::to_string_pretty(plan)?),
        )?;
    }
    let title = format!(
        "memory plan: one step, batch {}, input {}",
        plan.batch(),
        plan.input
    );
    record(args, plan.trace())?;
    let t = &plan.timeline;
    export(args, (t, &[]), (t, XAxis::Events), &title)
}

/// Writes `--record-trace`: `trace` as JSON lines.
pub fn record(args: &Common, trace: &stax::alloc::Trace) -> Result<(), Error> {
    if let Some(path) = &args.record_trace {
        let file = written("--record-trace", path, std::fs::File::create(path))?;
        let wrote = trace.write_jsonl(std::io::BufWriter::new(file));
        written("--record-trace", path, wrote)?;
        println!(
            "allocation trace: {} ({} events; replay it with alloc_bench --trace)",
            path.display(),
            trace.events.len()
        );
    }
    Ok(())
}

/// Writes `--trace` (a timeline and its step starts) and `--plot` (one step's timeline).
pub fn export(
    args: &Common,
    (trace, steps): (&Timeline, &[usize]),
    (step, axis): (&Timeline, XAxis),
    title: &str,
) -> Result<(), Error> {
    if let Some(path) = &args.trace {
        written("--trace", path, write_perfetto(trace, steps, title, path))?;
        println!("trace: {} (open in ui.perfetto.dev)", path.display());
    }
    if let Some(path) = &args.plot {
        written(
            "--plot",
            path,
            write_svg(&stacked_series(step, axis), title, path),
        )?;
        println!("plot: {}", path.display());
    }
    Ok(())
}

/// An output flag's write: a failure (a full disk, say) names the flag and the file, and the
/// partly written file is removed rather than left looking like a result.
fn written<T, E: std::fmt::Display>(flag: &str, path: &Path, r: Result<T, E>) -> Result<T, Error> {
    r.map_err(|e| {
        let _ = std::fs::remove_file(path);
        format!("{flag} {}: {e}", path.display()).into()
    })
}

/// The last step of a named run, with the bytes live before it as baseline.
pub fn last_step(named: &NamedTrace) -> Timeline {
    let events = &named.timeline.events;
    let start = named.step_starts.last().copied().unwrap_or(0);
    let before = Timeline {
        baseline: [0; 7],
        events: events[..start].to_vec(),
    };
    Timeline {
        baseline: before.live_by_category().last().copied().unwrap_or([0; 7]),
        events: events[start..].to_vec(),
    }
}

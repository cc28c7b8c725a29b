#!/usr/bin/env python3
"""Convert a PyTorch CUDA memory snapshot into a stax_alloc trace (JSON lines).

A snapshot is what ``torch.cuda.memory._snapshot()`` returns, pickled to a file, e.g.::

    torch.cuda.memory._record_memory_history(max_entries=1_000_000)
    ...  # run the workload
    with open("snapshot.pickle", "wb") as f:
        pickle.dump(torch.cuda.memory._snapshot(), f)

Its ``device_traces[device]`` list holds one entry per allocator event, each a dict with
``action``, ``addr``, ``size`` and ``stream`` (and, in recent versions, ``time_us``). This
script turns ``alloc`` into an ``alloc`` event and the end of a block's life into a ``free``
event: ``free_completed`` by default (when PyTorch's allocator really took the block back, after
the streams that used it), or ``free_requested`` with ``--free-at requested`` (when the program
dropped the tensor). Segment events, ``snapshot`` and ``oom`` entries are skipped, and so is a
free of a block allocated before recording started. Blocks still live at the end stay live (a
replay frees them). Every event gets category ``other`` (a snapshot has no categories), streams
are numbered 0, 1, ... in order of appearance, and ``t_ns`` is ``time_us * 1000`` (or 1 us per
event when the snapshot has no times). The output is stax_alloc's trace format (see the
stax-alloc crate docs), ready for::

    cargo run --release --example alloc_bench -- --trace run.jsonl

Usage: ``torch_snapshot_to_trace.py SNAPSHOT.pickle OUT.jsonl [--device N] [--free-at
requested|completed]``. Needs only Python 3 (no torch). The pickle is read with every class
lookup refused, so a file holding anything but plain data (dicts, lists, numbers, strings) is
rejected instead of running code.
"""

import argparse
import json
import pickle
import sys


class PlainUnpickler(pickle.Unpickler):
    """Reads plain data only: any class or function reference is an error."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(
            f"refusing {module}.{name}: a memory snapshot holds only plain data"
        )


def convert(snapshot, device=0, free_at="completed"):
    """Returns (events, skipped): the stax_alloc trace events of one device, and how many
    snapshot entries were skipped because they free a block the trace never saw allocated."""
    traces = snapshot.get("device_traces") if isinstance(snapshot, dict) else None
    if traces is None:
        raise ValueError("not a memory snapshot: no 'device_traces' (record with "
                         "torch.cuda.memory._record_memory_history first)")
    if device >= len(traces):
        raise ValueError(f"the snapshot has {len(traces)} device(s), not device {device}")
    free_action = "free_" + free_at
    events, live, streams = [], {}, {}
    skipped, next_id = 0, 0

    def emit(op, ident, size, stream, t_ns, addr):
        events.append({"op": op, "id": ident, "bytes": size, "category": "other",
                       "t_ns": t_ns, "stream": stream, "addr": addr})

    for i, entry in enumerate(traces[device]):
        action = entry.get("action")
        addr = int(entry.get("addr", 0))
        t_ns = int(entry["time_us"]) * 1000 if "time_us" in entry else i * 1000
        if action == "alloc":
            stream = streams.setdefault(entry.get("stream", 0), len(streams))
            if addr in live:  # its free was not recorded: the block was reused, so it ended
                old, size, old_stream = live.pop(addr)
                emit("free", old, size, old_stream, t_ns, addr)
            size = int(entry["size"])
            live[addr] = (next_id, size, stream)
            emit("alloc", next_id, size, stream, t_ns, addr)
            next_id += 1
        elif action == free_action:
            if addr in live:
                ident, size, stream = live.pop(addr)
                emit("free", ident, size, stream, t_ns, addr)
            else:
                skipped += 1
    return events, skipped


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("snapshot", help="pickled torch.cuda.memory._snapshot()")
    p.add_argument("out", help="JSON-lines trace to write")
    p.add_argument("--device", type=int, default=0, help="device index (default 0)")
    p.add_argument("--free-at", choices=["completed", "requested"], default="completed",
                   help="which action ends a block's life (default: free_completed)")
    args = p.parse_args(argv)
    try:
        with open(args.snapshot, "rb") as f:
            snapshot = PlainUnpickler(f).load()
        events, skipped = convert(snapshot, args.device, args.free_at)
    except (OSError, pickle.UnpicklingError, ValueError, KeyError, TypeError) as e:
        print(f"torch_snapshot_to_trace: {args.snapshot}: {e}", file=sys.stderr)
        return 1
    with open(args.out, "w") as f:
        for e in events:
            f.write(json.dumps(e, separators=(",", ":")) + "\n")
    allocs = sum(1 for e in events if e["op"] == "alloc")
    print(f"torch_snapshot_to_trace: {len(events)} events ({allocs} allocations) written to "
          f"{args.out}; {skipped} frees of blocks allocated before recording skipped",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

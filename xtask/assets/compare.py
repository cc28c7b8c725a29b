"""Ratios of stax-rs against the JAX and PyTorch anchors from one device run.

usage: python3 compare.py DIR   (DIR holds stax.jsonl, jax_default.json, jax_donate.json, torch.json)
"""
import json, os, statistics, sys

d = sys.argv[1]
def load(name):
    try:
        with open(os.path.join(d, name)) as f:
            return json.loads(f.read().strip().splitlines()[-1])
    except Exception as e:
        print(f"{name}: unavailable ({e})")
        return None

steps = []
try:
    with open(os.path.join(d, "stax.jsonl")) as f:
        steps = [json.loads(l) for l in f if l.strip()]
except Exception as e:
    print(f"stax.jsonl: unavailable ({e})")
ours = None
if len(steps) > 3:
    ms = [s["step_ms"] for s in steps[3:]]
    ours = {"step_ms_median": statistics.median(ms), "step_ms_min": min(ms),
            "peak": max(s["memory"]["peak"] for s in steps),
            "driver_used": max((s["memory"].get("driver_used") or 0) for s in steps),
            "loss_last": steps[-1]["loss"], "steps": len(steps)}
rows = [("stax-rs", ours and ours["step_ms_median"], ours and ours["peak"], "peak requested")]
for name, key in (("jax default", "jax_default.json"), ("jax donate", "jax_donate.json")):
    j = load(key)
    if j:
        rows.append((name, j["step_ms_median"], j["peak_bytes_in_use"], "peak_bytes_in_use"))
t = load("torch.json")
if t:
    rows.append(("torch", t["step_ms_median"], t["max_allocated"], "max_allocated"))
print(json.dumps({"stax": ours}, indent=None))
print(f"{'run':<14}{'step ms (median)':>18}{'peak bytes':>18}  {'x ours time':>12}{'x ours peak':>12}  measure")
for name, ms, peak, what in rows:
    rt = f"{ms / ours['step_ms_median']:.2f}" if ours and ms else "-"
    rp = f"{peak / ours['peak']:.2f}" if ours and peak else "-"
    print(f"{name:<14}{(ms or 0):>18.3f}{(peak or 0):>18,}  {rt:>12}{rp:>12}  {what}")

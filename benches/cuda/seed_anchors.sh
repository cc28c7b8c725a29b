#!/bin/bash
# One device call for the seed step against the JAX and PyTorch anchors (issues 11 and 12;
# `bash benches/cuda/seed_anchors.sh` from the repo root): bf16 at batch 100 three times,
# interleaved with JAX bf16 (twice) and PyTorch bf16 compiled, and once with a 512 MiB
# workspace limit (dense chunks of twice the rows); TF32 at batch 100 against JAX
# default; TF32 at batch 10 against JAX donated. Ours: `stax_cnn --device cuda --img 200
# --max-steps 30`, the median (min-max) of steps 11-30 and the first line on peaks against the
# plan; the anchors print their own JSON. Then `ncu` times the kernels named in NCU_KERNELS
# (a regex) over two bf16 steps. Build first: `cargo xtask gpu-bundle && cargo xtask bench-gpu`.
cd "$(dirname "$0")/../.."
B=bundle
python3 -c 'import sys,tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' $B/bins.tar.xz $B
. $B/env.sh
export STAX_REQUIRE_GPU=1 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/stax-seed}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
ours() { # label, args...
  local l=$1; shift
  timeout 150 $B/examples/stax_cnn --device cuda --img 200 "$@" > "$OUT/$l.log" 2>&1
  echo "$l rc=$?: $(awk '$1=="step" && $2+0>=11 {print $6}' "$OUT/$l.log" | sort -n | awk '{a[NR]=$1} END {printf "median %.2f (%.2f-%.2f)", a[int((NR+1)/2)], a[1], a[NR]}') $(grep -m1 'step peaks' "$OUT/$l.log" | cut -c1-140)"
}
anchor() { # label, script, args...
  local l=$1 s=$2; shift 2
  timeout 200 python3 $B/anchors/$s "$@" > "$OUT/$l.json" 2> "$OUT/$l.err"
  echo "$l rc=$?: $(tail -c 400 "$OUT/$l.json")"
}
ours warm --batch 100 --precision bf16 --max-steps 3
ours bf16_a --batch 100 --precision bf16 --max-steps 30
anchor jax_bf16_a jax_stax_anchor.py bf16 100 30
anchor torch_bf16 torch_anchor.py bf16 100 30
ours bf16_b --batch 100 --precision bf16 --max-steps 30
anchor jax_bf16_b jax_stax_anchor.py bf16 100 30
ours bf16_c --batch 100 --precision bf16 --max-steps 30
ours bf16_ws512 --batch 100 --precision bf16 --max-steps 30 --workspace-limit 512MiB
ours tf32 --batch 100 --max-steps 30
anchor jax_tf32 jax_stax_anchor.py default 100 30
ours b10 --batch 10 --max-steps 30
anchor jax_b10 jax_stax_anchor.py donate 10 30
if [ -n "${NCU_KERNELS:-}" ] && command -v ncu > /dev/null; then
  timeout 240 ncu --clock-control none --metrics gpu__time_duration.sum --csv \
    --kernel-name "regex:$NCU_KERNELS" $B/examples/stax_cnn --device cuda --img 200 --batch 100 \
    --precision bf16 --max-steps 2 > "$OUT/ncu.csv" 2> "$OUT/ncu.err"
  echo "ncu rc=$?"
  python3 - "$OUT/ncu.csv" <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
head = rows[0]; k, v, u = head.index("Kernel Name"), head.index("Metric Value"), head.index("Metric Unit")
print("unit", rows[1][u], "(shown as us assuming ns)")
t = collections.defaultdict(list)
for r in rows[1:]:
    t[r[k][:60]].append(float(r[v].replace(",", "")) / 1e3)
for name, us in sorted(t.items()):
    print(f"{name:60s} n={len(us):4d} last-step-ish median {sorted(us)[len(us)//2]:8.1f} us  sum/2 {sum(us)/2:9.1f} us")
PY
fi

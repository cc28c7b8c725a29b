#!/bin/bash
# One device call for ResNet-50's memory/time trade-offs (issue 10; `bash
# benches/cuda/resnet_remat_ab.sh` from the repo root): TF32, batch 128, 224x224x3, 1000 classes,
# plain, `--remat 1`, `--remat 2`, `--remat-bn` and `--remat 1 --remat-bn`, each step's peak
# against its plan, then JAX's stax ResNet50 anchor in the same call. Build first: `cargo xtask
# gpu-bundle && cargo xtask bench-gpu` (the latter copies ../shared/anchors/*.py into
# bundle/anchors/). (On 2026-12-05 it also ran `--remat-saving-convs`, a flag of commit 9afcb17
# since removed: BENCHMARKS.md.)
cd "$(dirname "$0")/../.."
B=bundle
python3 -c 'import sys,tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' $B/bins.tar.xz $B
. $B/env.sh
export STAX_REQUIRE_GPU=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
run() { # label, args...
  local l=$1; shift
  timeout 150 $B/examples/resnet50 --device cuda --batch 128 --classes 1000 "$@" > $OUT/$l.log 2>&1
  echo "$l rc=$?: $(awk '$1=="step" && $2+0>=6 {print $6}' $OUT/$l.log | sort -n | awk '{a[NR]=$1} END {printf "median %.2f (%.2f-%.2f)", a[int((NR+1)/2)], a[1], a[NR]}') $(grep -m1 'step peaks' $OUT/$l.log | cut -c1-120)"
}
run warm --max-steps 3
run plain --max-steps 20
run remat1 --remat 1 --max-steps 20
run remat2 --remat 2 --max-steps 20
run bn --remat-bn --max-steps 20
run remat1_bn --remat 1 --remat-bn --max-steps 20
timeout 150 python3 $B/anchors/jax_resnet50_anchor.py default 128 20 2>&1 | tail -1
run plain_b --max-steps 20
run remat2_b --remat 2 --max-steps 20

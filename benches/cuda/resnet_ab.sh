#!/bin/bash
# ResNet-50's step, this bundle's `resnet50` against another build's in the same device call
# (issue 10): `bash benches/cuda/resnet_ab.sh BASELINE_BINARY [STEPS]` from the repo root on the
# GPU machine, after `cargo xtask gpu-bundle && cargo xtask bench-gpu` here (carry `bundle`, and
# the baseline: for example `cargo build --release --example resnet50` of an older commit in a
# worktree, stripped and xz-compressed under the ignored `out/`). Batch 128, 224x224x3, 1000
# classes, TF32: new, baseline, JAX's stax ResNet50 anchor, new, baseline, each the median
# (min-max) of steps 6..STEPS and its line on peaks against the plan; then each of VARIANTS
# (new binary, `;`-separated flag sets, e.g. VARIANTS="--remat-bn to-end;--remat-bn") and,
# with TORCH=1, PyTorch's compiled torchvision anchor (issue 10's bar names both anchors). Logs
# go to $OUT.
cd "$(dirname "$0")/../.."
B=bundle BASE=$1 STEPS=${2:-20}
python3 -c 'import sys,tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' $B/bins.tar.xz $B
case "$BASE" in *.xz) xz -dc "$BASE" > /tmp/resnet50_base && chmod +x /tmp/resnet50_base && BASE=/tmp/resnet50_base ;; esac
. $B/env.sh
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/stax-resnet-ab}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
run() { # label, binary, args...
  local l=$1 bin=$2; shift 2
  timeout 100 $bin --device cuda --batch 128 --classes 1000 --max-steps $STEPS "$@" > $OUT/$l.log 2>&1
  echo "$l rc=$?: $(awk '$1=="step" && $2+0>=6 {print $6}' $OUT/$l.log | sort -n | awk '{a[NR]=$1} END {printf "median %.2f (%.2f-%.2f)", a[int((NR+1)/2)], a[1], a[NR]}') $(grep -m1 'step peaks' $OUT/$l.log | cut -c1-140)"
}
run new_a $B/examples/resnet50
run base_a "$BASE"
timeout 120 python3 $B/anchors/jax_resnet50_anchor.py default 128 $STEPS > $OUT/jax.log 2>&1
tail -c 300 $OUT/jax.log; echo
run new_b $B/examples/resnet50
run base_b "$BASE"
IFS=';' read -ra variants <<< "${VARIANTS:-}"
for i in "${!variants[@]}"; do
  # shellcheck disable=SC2086 # each variant is a flag list
  run "variant_$i" $B/examples/resnet50 ${variants[$i]}
  echo "  variant_$i: ${variants[$i]}"
done
if [ "${TORCH:-0}" = 1 ]; then
  timeout 240 python3 $B/anchors/torch_resnet50_anchor.py compiled 128 $STEPS > $OUT/torch.log 2>&1
  tail -c 300 $OUT/torch.log; echo
fi

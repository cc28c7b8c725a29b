#!/usr/bin/env bash
# Runs on the GPU machine, from the bundle: our seed step, then the JAX and PyTorch anchors, on
# the same GPU in one call; compare.py prints the ratios. Usage: bash bundle/bench.sh [BATCH] [STEPS]
set -u
cd "$(dirname "$0")"
python3 -c 'import tarfile; tarfile.open("bins.tar.xz").extractall(".")' || exit 1
. ./env.sh
B=${1:-100}; STEPS=${2:-30}
OUTDIR=${OUT:-/tmp/stax-bench}; mkdir -p "$OUTDIR"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv,noheader
EX=examples/stax_cnn
timeout 300 ./$EX --device cuda --img 200 --batch "$B" --epochs 2 --json "$OUTDIR/stax.jsonl" ${STAX_ARGS:-} > "$OUTDIR/stax.log" 2>&1
echo "stax_cnn exit $?"; grep -E "^(stax_cnn|parameters|test)" "$OUTDIR/stax.log"; tail -n 3 "$OUTDIR/stax.log"
for mode in default donate; do
  timeout 300 python3 anchors/jax_stax_anchor.py $mode "$B" "$STEPS" > "$OUTDIR/jax_$mode.json" 2> "$OUTDIR/jax_$mode.err"
  echo "jax $mode exit $?"; tail -n 2 "$OUTDIR/jax_$mode.err" | grep -i error
done
timeout 300 python3 anchors/torch_anchor.py default "$B" "$STEPS" > "$OUTDIR/torch.json" 2> "$OUTDIR/torch.err"
echo "torch exit $?"
python3 compare.py "$OUTDIR"

#!/usr/bin/env bash
# Runs on the GPU machine, from the bundle: ResNet-50 (batch 128, 224x224x3, 1000 classes) in
# TF32 and bf16 with --profile (every layer's time by CUDA events), then the JAX and PyTorch
# ResNet-50 anchors in the same modes, then JAX's largest batch in 80 GB of the H200's memory.
# Each part prints as it ends, so a call cut short keeps what ran. Logs go to $OUT.
# Usage: bash bundle/resnet.sh [BATCH] [STEPS] [JAX_BATCHES]   (defaults 128 15 "1024 1536 2048")
set -u
cd "$(dirname "$0")"
python3 -c 'import tarfile; tarfile.open("bins.tar.xz").extractall(".")' || exit 1
. ./env.sh
B=${1:-128}; STEPS=${2:-15}; JAX_BATCHES=${3:-1024 1536 2048}
OUTDIR=${OUT:-/tmp/stax-resnet}; mkdir -p "$OUTDIR"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv,noheader
for p in tf32 bf16; do
  timeout 240 ./examples/resnet50 --device cuda --batch "$B" --classes 1000 --max-steps "$STEPS" \
    --precision $p --profile ${STAX_ARGS:-} > "$OUTDIR/resnet_$p.log" 2>&1
  echo "== stax-rs resnet50 $p: exit $?"
  grep -E "^step +[0-9]+/" "$OUTDIR/resnet_$p.log" | tail -n 3
  sed -n '/^step peaks/p;/^profile:/,/^test:/p' "$OUTDIR/resnet_$p.log"
done
for mode in default bf16; do
  timeout 300 python3 anchors/jax_resnet50_anchor.py $mode "$B" "$STEPS" > "$OUTDIR/jax_$mode.json" 2> "$OUTDIR/jax_$mode.err"
  echo "== jax $mode: exit $?"; tail -n 1 "$OUTDIR/jax_$mode.json"
done
for mode in compiled bf16; do
  timeout 300 python3 anchors/torch_resnet50_anchor.py $mode "$B" "$STEPS" > "$OUTDIR/torch_$mode.json" 2> "$OUTDIR/torch_$mode.err"
  echo "== torch $mode: exit $?"; tail -n 1 "$OUTDIR/torch_$mode.json"
done
# 80 GB of the H200's 143,771 MiB: 0.556 of it (the anchor needs at least 4 steps: times[3:])
for jb in $JAX_BATCHES; do
  XLA_PYTHON_CLIENT_MEM_FRACTION=0.556 timeout 300 python3 anchors/jax_resnet50_anchor.py default "$jb" 5 \
    > "$OUTDIR/jax_max_$jb.json" 2> "$OUTDIR/jax_max_$jb.err"
  echo "== jax default batch $jb in 80 GB: exit $?"
  tail -n 1 "$OUTDIR/jax_max_$jb.json"; grep -iE "resource_exhausted|out of memory" "$OUTDIR/jax_max_$jb.err" | head -n 2
done

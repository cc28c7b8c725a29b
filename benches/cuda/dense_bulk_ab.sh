#!/bin/bash
# One device call that decides whether the bulk dense update (`--dense-bulk`,
# kernels/dense_bulk.cu) replaces the default kernels (`bash benches/cuda/dense_bulk_ab.sh` from
# the repo root): its correctness tests (the gate), the seed step with and without it in bf16
# and TF32 at batch 100 and TF32 at batch 10, beside the bf16 and batch-10 anchors, then the
# kernel alone (benches/cuda/dense_bulk.sh). Build first: `cargo xtask gpu-bundle`, then copy
# ../shared/anchors/*.py into bundle/.
cd "$(dirname "$0")/../.."
B=bundle
python3 -c 'import sys,tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' $B/bins.tar.xz $B
. $B/env.sh
export STAX_REQUIRE_GPU=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
echo "== fused_dense"
timeout 200 $B/tests/fused_dense-* --nocapture > $OUT/fused.log 2>&1; rc=$?
echo "rc=$rc"; grep -E "^test |test result|panicked|assert" $OUT/fused.log | head -30
if [ $rc -ne 0 ]; then
  echo "fused_dense failed: the kernel alone only"; tail -30 $OUT/fused.log
  timeout 120 bash benches/cuda/dense_bulk.sh 2>&1 | tail -14; exit 1
fi
run() { # label, binary, args...
  local l=$1 bin=$2; shift 2
  timeout 100 $bin --device cuda --img 200 "$@" > $OUT/$l.log 2>&1
  echo "$l rc=$?: $(awk '$1=="step" && $2+0>=11 {print $6}' $OUT/$l.log | sort -n | awk '{a[NR]=$1} END {printf "median %.3f (%.3f-%.3f)", a[int((NR+1)/2)], a[1], a[NR]}') $(grep -m1 'step peaks' $OUT/$l.log | cut -c1-110)"
}
S=$B/examples/stax_cnn
run warm $S --batch 100 --precision bf16 --max-steps 3
for r in a b; do
  run bulk_bf16_$r $S --dense-bulk --batch 100 --precision bf16 --max-steps 30
  run base_bf16_$r $S --batch 100 --precision bf16 --max-steps 30
  run bulk_tf32_$r $S --dense-bulk --batch 100 --max-steps 30
  run base_tf32_$r $S --batch 100 --max-steps 30
  run bulk_b10_$r $S --dense-bulk --batch 10 --max-steps 30
  run base_b10_$r $S --batch 10 --max-steps 30
done
echo "== anchors"
timeout 120 python3 $B/jax_stax_anchor.py bf16 100 30 2>&1 | tail -1
timeout 120 python3 $B/torch_anchor.py bf16 100 30 2>&1 | tail -1
timeout 120 python3 $B/jax_stax_anchor.py donate 10 30 2>&1 | tail -1
run bulk_bf16_c $S --dense-bulk --batch 100 --precision bf16 --max-steps 30
run bulk_b10_c $S --dense-bulk --batch 10 --max-steps 30
echo "== harness"; timeout 120 bash benches/cuda/dense_bulk.sh > $OUT/harness.log 2>&1; echo "rc=$?"; tail -12 $OUT/harness.log

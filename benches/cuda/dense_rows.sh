# Times kernels/adam.cu's one-pass dense update for small batches (dense_adam_rows_t, with
# adam_one's exact step and with adam_tf32's) alone at batches 10, 1 and 16 (10 again, for the
# spread), and prints each run's hash of the results
# (BENCHMARKS.md: "The batch-10 dense update is at its floor on the H100"). On the GPU machine,
# from the repo root: bash benches/cuda/dense_rows.sh
set -eu
out=$(mktemp -d)
cp kernels/common.cuh benches/cuda/dense_rows.cu benches/cuda/harness.cuh "$out/"
(echo '#include "common.cuh"'; grep -v '^DENSE_ADAM_ROWS(' kernels/adam.cu) > "$out/src.cu"
nvcc -O3 -gencode=arch=compute_90,code=sm_90 -std=c++17 -Xptxas -v \
    -o "$out/dense_rows" "$out/dense_rows.cu" 2> "$out/ptxas.txt" ||
    { cat "$out/ptxas.txt"; exit 1; }
for m in 10 1 16 10; do "$out/dense_rows" "$m"; done

# Checks and times kernels/dense_mma.cu's dense_grads_x3 alone against cuBLAS's f32 GEMMs
# (BENCHMARKS.md: "full fp32's dense update by chunks in 3xTF32"). On the GPU machine, from the
# repo root: bash benches/cuda/dense_x3.sh [batch]
set -eu
out=$(mktemp -d)
nvcc -O3 -gencode arch=compute_90a,code=sm_90a -std=c++17 -Xptxas -v -lcublas \
  -o "$out/dense_x3" benches/cuda/dense_x3_harness.cu 2> "$out/ptxas.txt" \
  || { cat "$out/ptxas.txt"; exit 1; }
grep -A2 "dense_grads_x3_mb13" "$out/ptxas.txt" | grep -o "Used [0-9]* registers\|[0-9]* bytes spill stores" || true
"$out/dense_x3" "${1:-100}"

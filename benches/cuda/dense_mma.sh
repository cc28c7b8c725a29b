# Times kernels/dense_mma.cu's tensor-core dense update alone (BENCHMARKS.md: "The dense update
# in one pass on the TF32 tensor cores"). On the GPU machine, from the repo root:
#   bash benches/cuda/dense_mma.sh
set -eu
out=$(mktemp -d)
cp kernels/common.cuh benches/cuda/dense_mma.cu "$out/"
# the kernels' templates without their extern "C" instantiations (the harness makes its own)
(echo '#include "common.cuh"'; grep -v '^DENSE_ADAM_ROWS(' kernels/adam.cu
 grep -v '^DENSE_ADAM_MMA(' kernels/dense_mma.cu) > "$out/src.cu"
nvcc -O3 -gencode=arch=compute_90,code=sm_90 -std=c++17 -DDM_BLOCKS=1 -Xptxas -v \
  -o "$out/dense_mma" "$out/dense_mma.cu" 2> "$out/ptxas.txt" || { cat "$out/ptxas.txt"; exit 1; }
for m in 100 128 64 17; do "$out/dense_mma" "$m"; done

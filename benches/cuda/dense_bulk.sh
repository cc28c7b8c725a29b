# Times kernels/dense_bulk.cu's one-pass dense update alone against adam_vec_f32 over a weight
# of the same size (its results go into BENCHMARKS.md). On the GPU
# machine, from the repo root:
#   bash benches/cuda/dense_bulk.sh
set -eu
out=$(mktemp -d)
cp benches/cuda/dense_bulk.cu "$out/"
cat kernels/common.cuh kernels/adam.cu kernels/dense_bulk.cu > "$out/src.cu"
nvcc -O3 -gencode=arch=compute_90,code=sm_90 -std=c++17 -Xptxas -v \
  -o "$out/dense_bulk" "$out/dense_bulk.cu" 2> "$out/ptxas.txt" || { cat "$out/ptxas.txt"; exit 1; }
for args in "bf16 100 0 1 15 check" "bf16 100 0 0" "f32 100 0 1 15 check" "f32 100 0 0" \
  "f32 10 0 1 15 check" "f32 10 0 0" "bf16 10" "bf16 128" "bf16 100 3" "bf16 100 4"; do
  "$out/dense_bulk" $args
done

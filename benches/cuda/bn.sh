# Times kernels/norm.cu's vectorized batch-normalization passes at ResNet-50's batch-128
# shapes (benches/cuda/bn.cu) and prints their hashes. Arguments: versions of norm.cu to time
# one after the other, twice round, so that all come from one call (default kernels/norm.cu).
# On the GPU machine, from the repo root: bash benches/cuda/bn.sh [norm.cu ...]
set -eu
out=$(mktemp -d)
cp kernels/common.cuh "$out/"
[ $# -gt 0 ] || set -- kernels/norm.cu
k=0
for src in "$@"; do
    k=$((k + 1))
    mkdir -p "$out/$k"
    (echo '#include "../common.cuh"'; cat "$src") > "$out/$k/src.cu"
    cp benches/cuda/bn.cu benches/cuda/harness.cuh "$out/$k/"
    nvcc -O3 -gencode=arch=compute_90,code=sm_90 -std=c++17 -Xptxas -v -o "$out/$k/bn" \
        "$out/$k/bn.cu" 2> "$out/$k/ptxas.txt" || { cat "$out/$k/ptxas.txt"; exit 1; }
    echo "$src: registers of the f32 kernels:"
    grep -A2 "_vec_f32' for" "$out/$k/ptxas.txt" |
        grep -oE "function '[a-z_0-9]+'|Used [0-9]+ registers|[0-9]+ bytes spill stores" |
        paste -sd' ' || true
done
for run in 1 2; do
    k=0
    for src in "$@"; do
        k=$((k + 1))
        echo "== $src (round $run)"
        "$out/$k/bn"
    done
done

# Times variants of kernels/adam.cu's one-pass dense update for small batches at the seed's
# batch-10 shape (benches/cuda/dense_rows_variants.cuh: prefetch distance, blocks a
# multiprocessor, the next row loaded ahead, Adam's step, the dx sums by shuffles or through
# shared memory) beside the committed kernel and the one of an older adam.cu (its rows kernel
# wrapped in a namespace), with each variant's hash of w, mu, nu and dx's largest difference
# from the committed kernel's. BENCHMARKS.md: "The batch-10 dense update: dx's sums through
# shared memory". The older adam.cu is the first argument: on the build machine
#   git show 916c275:kernels/adam.cu > old_adam.cu
# (an ignored or untracked file travels with the checkout), then on the GPU machine, from the
# repo root: bash benches/cuda/dense_rows_variants.sh old_adam.cu
# REPS (at least 1) and PASSES set the runs per variant (15) and the passes over the list (2).
set -eu
out=$(mktemp -d)
cp kernels/common.cuh benches/cuda/harness.cuh benches/cuda/dense_rows_variants.cu \
    benches/cuda/dense_rows_variants.cuh "$out/"
(echo '#include "common.cuh"'; grep -v '^DENSE_ADAM_ROWS(' kernels/adam.cu) > "$out/src.cu"
python3 - "$1" > "$out/old.cuh" <<'PY'
import sys
s = open(sys.argv[1]).read()
a, b = s.index("#define DENSE_ROWS_WARPS 4"), s.index("// dense_adam_rows_m<M> (adam_one)")
print("namespace old {\n" + s[a:b].replace("#define DENSE_ROWS_WARPS 4", "").replace("#define DENSE_ROWS_PREFETCH", "#undef DENSE_ROWS_PREFETCH\n#define DENSE_ROWS_PREFETCH") + "}")
PY
nvcc -O3 -gencode=arch=compute_90,code=sm_90 -std=c++17 -Xptxas -v \
    -o "$out/variants" "$out/dense_rows_variants.cu" 2> "$out/ptxas.txt" ||
    { cat "$out/ptxas.txt"; exit 1; }
awk '/entry function/ { keep = $0 !~ /(adam|all_finite|_Z)/; name = $(NF - 2) }
    keep && /Used|spill/ && !/ 0 bytes spill stores/ { print name, $0 }' "$out/ptxas.txt"
"$out/variants"

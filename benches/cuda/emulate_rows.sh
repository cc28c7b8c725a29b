# Checks kernels/adam.cu's one-pass dense update for small batches (dense_adam_rows_t) on the
# CPU, without a GPU: its source (with the pieces of common.cuh and adam.cu it uses) compiled by
# the host's C++20 compiler (GCC 11 or later: <barrier>), a grid of two blocks of 128 threads
# run one block after the other, each thread a std::thread and __syncwarp a barrier of each
# warp's 32 (benches/cuda/emulate_rows.cpp). Against a per-element reference (the same gradient
# sums and Adam step, dx in f64): w, mu and nu must match bit for bit and dx within 1e-5 of its
# largest value, at every batch 1 to 16, 1 to 128 outputs, fewer weight rows than a group and
# partial groups, both Adam steps, 16-byte and misaligned 4-byte accesses, dx in its own array,
# in place of x and not computed. Threads run freely between barriers, so a missing __syncwarp
# may pass here: compute-sanitizer's racecheck on the GPU is the check for that. From the repo
# root: bash benches/cuda/emulate_rows.sh
set -eu
out=$(mktemp -d)
python3 - kernels/common.cuh kernels/adam.cu > "$out/kern.inc" <<'PY'
import sys
common, adam = (open(p).read() for p in sys.argv[1:3])
def take(s, start, end):
    i = s.index(start)
    return s[i:s.index(end, i)]
print("\n".join([
    take(common, "#define WARP_STRIDE", "__device__ __forceinline__ double warp_sum_f64"),
    take(common, "struct AdamHyper {", "// v rounded to TF32"),
    take(adam, "__device__ __forceinline__ float div_rn", "// One element per thread and iteration"),
    take(adam, "#define DENSE_ROWS_WARPS 4", "// dense_adam_rows_m<M> (adam_one) and"),
]).replace("asm volatile(", "ASMV("))
PY
cp benches/cuda/emulate_rows.cpp "$out/"
${CXX:-c++} -O2 -std=c++20 -pthread -o "$out/emulate_rows" "$out/emulate_rows.cpp"
"$out/emulate_rows"

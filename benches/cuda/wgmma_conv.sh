# Checks and times kernels/conv_wgmma.cu alone (BENCHMARKS.md: "conv2's forward and backward
# data in full fp32 on wgmma"): the forward pass (bias, ReLU, mask) and the backward-data pass
# against an f64 reference of the f32 operands on 7 geometries, then both at the seed's conv2
# (batch 100, 200x200x64 -> 64, SAME), median of 10 runs. On the GPU machine, from the repo
# root: bash benches/cuda/wgmma_conv.sh [batch]
set -eu
out=$(mktemp -d)
nvcc -O3 -gencode arch=compute_90a,code=sm_90a -o "$out/wgmma_conv" \
  benches/cuda/wgmma_conv_harness.cu
"$out/wgmma_conv" "${1:-100}"

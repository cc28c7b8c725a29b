# Checks and times kernels/wgrad_wgmma.cu alone (BENCHMARKS.md: "conv2's filter gradient on
# Hopper's warpgroup tensor cores"): 8 geometries against an f64 reference of TF32-rounded
# operands, the seed's conv2 (batch 100, 200x200x64 -> 64, ReLU mask) with and without dy's
# write-back, the products alone; then PyTorch's cuDNN in the same role. On the GPU machine,
# from the repo root: bash benches/cuda/wgmma_wgrad.sh
set -eu
out=$(mktemp -d)
nvcc -O3 -gencode arch=compute_90a,code=sm_90a -o "$out/wgmma_wgrad" \
  benches/cuda/wgmma_wgrad_harness.cu
"$out/wgmma_wgrad"
python3 benches/cuda/torch_conv2_wgrad.py

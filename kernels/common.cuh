// common.cuh: prepended (as text, not #include) to every kernel source by
// crates/stax-tensor/src/cuda/kernels.rs before NVRTC compiles it.
//
// Conventions: element counts and indices are size_t (tensors exceed 2^31 elements); every
// kernel walks its index space with a grid-stride loop, so any grid size is correct and the
// launcher only picks one for occupancy. Symbols are extern "C" and named <op>_<dtype>.

typedef unsigned int u32;
typedef unsigned long long u64;

#define FULL_MASK 0xffffffffu

// Grid-stride loop over [0, n).
#define GRID_STRIDE(i, n)                                                                      \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                   \
         i += (size_t)blockDim.x * gridDim.x)

__device__ __forceinline__ double warp_sum_f64(double v) {
    for (int offset = 16; offset > 0; offset >>= 1) {
        v += __shfl_down_sync(FULL_MASK, v, offset);
    }
    return v;
}

__device__ __forceinline__ float warp_max_f32(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) {
        v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, offset));
    }
    return v;
}

__device__ __forceinline__ double warp_allsum_f64(double v) {
    for (int offset = 16; offset > 0; offset >>= 1) {
        v += __shfl_xor_sync(FULL_MASK, v, offset);
    }
    return v;
}

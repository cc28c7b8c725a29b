// activation.cu: elementwise activations, their backward passes, binary ops and bias add and
// gradient, in every float dtype: one template each, instantiated per dtype as <op>_<dtype>
// (f32, bf16, f16) by FOR_FLOATS. An element is read as f32, computed on in f32 and rounded to
// its dtype once, as the CPU backend computes them.

// Activation codes: must match `Activation::code` in crates/stax-tensor/src/op.rs. A new
// activation is one case in each of the two switches below.
#define ACT_RELU 0
#define ACT_TANH 1
#define ACT_EXP 2
#define ACT_SOFTPLUS 3
#define ACT_SIGMOID 4
#define ACT_ELU 5
#define ACT_LEAKY_RELU 6
#define ACT_SELU 7
#define ACT_GELU 8

// The constants of crates/stax-tensor/src/scalar.rs, in f32.
#define SELU_SCALE 1.050701f
#define SELU_ALPHA 1.6732632f
#define SQRT_2_OVER_PI 0.7978846f
#define GELU_CUBIC 0.044715f

__device__ __forceinline__ float elu_f(float x, float alpha) {
    return x > 0.0f ? x : alpha * expm1f(x);
}

// scale * elu(x, alpha)'s gradient from its output y; offset = scale * alpha.
__device__ __forceinline__ float elu_grad(float y, float dy, float scale, float offset) {
    return y > 0.0f ? dy * scale : dy * (y + offset);
}

__device__ __forceinline__ float gelu_inner(float x) {
    return SQRT_2_OVER_PI * (x + GELU_CUBIC * (x * x * x));
}

// 0.5 (1 + tanh(u)) as the identical 1 / (1 + exp(-2u)): no cancellation near tanh(u) = -1.
__device__ __forceinline__ float gelu_gate(float x) {
    return 1.0f / (1.0f + expf(-2.0f * gelu_inner(x)));
}

// f(x), as `Activation::apply`. The ReLU propagates NaN (NaN <= 0 is false), as
// jnp.maximum(x, 0); alpha is Elu's alpha or LeakyRelu's negative slope.
__device__ __forceinline__ float act_forward(int op, float x, float alpha) {
    switch (op) {
    case ACT_RELU: return x <= 0.0f ? 0.0f : x;
    case ACT_TANH: return tanhf(x);
    case ACT_EXP: return expf(x);
    case ACT_SOFTPLUS: return fmaxf(x, 0.0f) + log1pf(expf(-fabsf(x)));
    case ACT_SIGMOID: {
        if (x >= 0.0f) return 1.0f / (1.0f + expf(-x));
        float e = expf(x);
        return e / (1.0f + e);
    }
    case ACT_ELU: return elu_f(x, alpha);
    case ACT_LEAKY_RELU: return x >= 0.0f ? x : alpha * x;
    case ACT_SELU: return SELU_SCALE * elu_f(x, SELU_ALPHA);
    case ACT_GELU: return x * gelu_gate(x);
    }
    return x;
}

// The bit a mask-saving activation keeps for x (`Activation::mask_bit`).
__device__ __forceinline__ bool act_mask(int op, float x) {
    return op == ACT_LEAKY_RELU ? x >= 0.0f : x > 0.0f;
}

// dy * f'(.) from what the forward pass saved (`Saves`, `Activation::grad`): the mask bit as
// 1 or 0 (ReLU, leaky ReLU), the output y, or the input x (GELU).
__device__ __forceinline__ float act_backward(int op, float saved, float dy, float alpha) {
    switch (op) {
    case ACT_RELU: return saved > 0.0f ? dy : 0.0f;
    case ACT_TANH: return dy * (1.0f - saved * saved);
    case ACT_EXP: return dy * saved;
    case ACT_SOFTPLUS: return dy * -expm1f(-saved);
    case ACT_SIGMOID: return dy * saved * (1.0f - saved);
    case ACT_ELU: return elu_grad(saved, dy, 1.0f, alpha);
    case ACT_LEAKY_RELU: return saved > 0.0f ? dy : alpha * dy;
    case ACT_SELU: return elu_grad(saved, dy, SELU_SCALE, SELU_SCALE * SELU_ALPHA);
    case ACT_GELU: {
        float s = gelu_gate(saved);
        float du = SQRT_2_OVER_PI * (1.0f + 3.0f * GELU_CUBIC * (saved * saved));
        return dy * (s + saved * (2.0f * s * (1.0f - s)) * du);
    }
    }
    return dy;
}

// In place y = f(y); when mask is not null, bit i%32 of mask[i/32] = act_mask(y[i]) before f
// (the ReLU's y[i] > 0; bits past n are 0). One warp ballot per 32 elements; warp-uniform
// loop bound.
template <typename T>
__device__ void unary_impl(T *y, u32 *mask, size_t n, int op, float alpha) {
    size_t lane = threadIdx.x & 31;
    size_t warp = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    size_t warps = ((size_t)blockDim.x * gridDim.x) >> 5;
    for (size_t base = warp * 32; base < n; base += warps * 32) {
        size_t i = base + lane;
        float v = i < n ? to_f32(y[i]) : 0.0f;
        u32 bits = __ballot_sync(FULL_MASK, i < n && act_mask(op, v));
        if (i < n) y[i] = from_f32<T>(act_forward(op, v, alpha));
        if (mask != 0 && lane == 0) mask[base >> 5] = bits;
    }
}

// In place dy = dy * f'(.): from bit i of the mask when it is not null, else from saved[i].
template <typename T>
__device__ void unary_bwd_impl(T *dy, const T *saved, const u32 *mask, size_t n, int op,
                               float alpha) {
    GRID_STRIDE(i, n) {
        float s = mask != 0 ? (float)((mask[i >> 5] >> (i & 31)) & 1u) : to_f32(saved[i]);
        dy[i] = from_f32<T>(act_backward(op, s, to_f32(dy[i]), alpha));
    }
}

// The random bits of element `index` under `key`: the high half of output index + 1 of
// SplitMix64 seeded with key (`ops::dropout_bits` in crates/stax-tensor/src/ops/rows.rs).
__device__ __forceinline__ u32 dropout_bits(u64 key, u64 index) {
    u64 z = key + (index + 1ull) * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return (u32)((z ^ (z >> 31)) >> 32);
}

// In place y = keep ? y / rate : 0 with keep = dropout_bits(key, i) < threshold; bit i%32 of
// mask[i/32] = keep (bits past n are 0). One warp ballot per 32 elements, as unary_impl.
template <typename T>
__device__ void dropout_impl(T *y, u32 *mask, size_t n, u64 key, u64 threshold, float rate) {
    size_t lane = threadIdx.x & 31;
    size_t warp = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    size_t warps = ((size_t)blockDim.x * gridDim.x) >> 5;
    for (size_t base = warp * 32; base < n; base += warps * 32) {
        size_t i = base + lane;
        bool keep = i < n && (u64)dropout_bits(key, (u64)i) < threshold;
        u32 bits = __ballot_sync(FULL_MASK, keep);
        if (i < n) y[i] = from_f32<T>(keep ? to_f32(y[i]) / rate : 0.0f);
        if (lane == 0) mask[base >> 5] = bits;
    }
}

// In place dy = keep ? dy / rate : 0 from the mask.
template <typename T>
__device__ void dropout_bwd_impl(T *dy, const u32 *mask, size_t n, float rate) {
    GRID_STRIDE(i, n) {
        bool keep = ((mask[i >> 5] >> (i & 31)) & 1u) != 0u;
        dy[i] = from_f32<T>(keep ? to_f32(dy[i]) / rate : 0.0f);
    }
}

// Binary op codes: must match `BinaryOp::code` in crates/stax-tensor/src/op.rs.
#define BIN_ADD 0
#define BIN_MUL 1

// In place a = a op b, n elements each.
template <typename T> __device__ void binary_impl(T *a, const T *b, size_t n, int op) {
    GRID_STRIDE(i, n) {
        float x = to_f32(a[i]), z = to_f32(b[i]);
        a[i] = from_f32<T>(op == BIN_MUL ? x * z : x + z);
    }
}

// y[r, j] += b[j] for y of n elements viewed as rows of c.
template <typename T> __device__ void bias_add_impl(T *y, const T *b, size_t n, size_t c) {
    GRID_STRIDE(i, n) { y[i] = from_f32<T>(to_f32(y[i]) + to_f32(b[i % c])); }
}

// Stage 1 of db[j] = sum_r dy[r, j]: block (x, s) sums rows s*rows_per_split .. of columns
// 32x .. 32x+31 into partial[s, j] (f64). Block is 32 x 8 threads.
template <typename T>
__device__ void bias_grad_partial_impl(const T *dy, double *partial, size_t rows, size_t c,
                                       size_t rows_per_split) {
    __shared__ double acc[8][33];
    size_t col = (size_t)blockIdx.x * 32 + threadIdx.x;
    size_t begin = (size_t)blockIdx.y * rows_per_split;
    size_t end = begin + rows_per_split < rows ? begin + rows_per_split : rows;
    double s = 0.0;
    if (col < c) {
        for (size_t r = begin + threadIdx.y; r < end; r += 8) {
            s += (double)to_f32(dy[r * c + col]);
        }
    }
    acc[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && col < c) {
        double t = 0.0;
        for (int k = 0; k < 8; ++k) t += acc[k][threadIdx.x];
        partial[(size_t)blockIdx.y * c + col] = t;
    }
}

// Stage 2: db[j] = sum_s partial[s, j] (blocks of 32 x 32 threads: column_sums).
template <typename T>
__device__ void bias_grad_finish_impl(const double *partial, T *db, size_t splits, size_t c) {
    size_t j;
    double t[1];
    if (column_sums<1>(partial, splits, c, &j, t)) db[j] = from_f32<T>((float)t[0]);
}

#define INSTANTIATE(T, S)                                                                      \
    extern "C" __global__ void unary_##S(T *y, u32 *mask, size_t n, int op, float alpha) {    \
        unary_impl<T>(y, mask, n, op, alpha);                                                  \
    }                                                                                          \
    extern "C" __global__ void unary_bwd_##S(T *dy, const T *saved, const u32 *mask, size_t n, \
                                             int op, float alpha) {                            \
        unary_bwd_impl<T>(dy, saved, mask, n, op, alpha);                                      \
    }                                                                                          \
    extern "C" __global__ void binary_##S(T *a, const T *b, size_t n, int op) {               \
        binary_impl<T>(a, b, n, op);                                                           \
    }                                                                                          \
    extern "C" __global__ void bias_add_##S(T *y, const T *b, size_t n, size_t c) {           \
        bias_add_impl<T>(y, b, n, c);                                                          \
    }                                                                                          \
    extern "C" __global__ void bias_grad_partial_##S(const T *dy, double *partial, size_t rows, \
                                                     size_t c, size_t rows_per_split) {        \
        bias_grad_partial_impl<T>(dy, partial, rows, c, rows_per_split);                       \
    }                                                                                          \
    extern "C" __global__ void bias_grad_finish_##S(const double *partial, T *db, size_t splits, \
                                                    size_t c) {                                \
        bias_grad_finish_impl<T>(partial, db, splits, c);                                      \
    }                                                                                          \
    extern "C" __global__ void dropout_##S(T *y, u32 *mask, size_t n, u64 key, u64 threshold,  \
                                           float rate) {                                       \
        dropout_impl<T>(y, mask, n, key, threshold, rate);                                     \
    }                                                                                          \
    extern "C" __global__ void dropout_bwd_##S(T *dy, const u32 *mask, size_t n, float rate) { \
        dropout_bwd_impl<T>(dy, mask, n, rate);                                                \
    }

FOR_FLOATS(INSTANTIATE)

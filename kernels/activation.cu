// activation.cu: elementwise activations, their backward passes, binary ops and bias add and
// gradient, in every float dtype: one template each, instantiated per dtype as <op>_<dtype>
// (f32, bf16, f16) by FOR_FLOATS. An element is read as f32, computed on in f32 and rounded to
// its dtype once, as the CPU backend computes them.

// Activation codes: must match `Activation::code` in crates/stax-tensor/src/op.rs. A new
// activation is one case in each of the two switches below.
#define ACT_RELU 0
#define ACT_TANH 1

// f(x). The ReLU propagates NaN (NaN <= 0 is false), as jnp.maximum(x, 0).
__device__ __forceinline__ float act_forward(int op, float x, float alpha) {
    switch (op) {
    case ACT_RELU: return x <= 0.0f ? 0.0f : x;
    case ACT_TANH: return tanhf(x);
    }
    return x;
}

// dy * f'(.) from what the forward pass saved (`Saves`): tanh saves its output y.
__device__ __forceinline__ float act_backward(int op, float saved, float dy, float alpha) {
    switch (op) {
    case ACT_TANH: return dy * (1.0f - saved * saved);
    }
    return dy;
}

// In place y = f(y); when mask is not null, bit i%32 of mask[i/32] = (y[i] > 0) before f (the
// ReLU's mask; bits past n are 0). One warp ballot per 32 elements; warp-uniform loop bound.
template <typename T>
__device__ void unary_impl(T *y, u32 *mask, size_t n, int op, float alpha) {
    size_t lane = threadIdx.x & 31;
    size_t warp = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    size_t warps = ((size_t)blockDim.x * gridDim.x) >> 5;
    for (size_t base = warp * 32; base < n; base += warps * 32) {
        size_t i = base + lane;
        float v = i < n ? to_f32(y[i]) : 0.0f;
        u32 bits = __ballot_sync(FULL_MASK, v > 0.0f);
        if (i < n) y[i] = from_f32<T>(act_forward(op, v, alpha));
        if (mask != 0 && lane == 0) mask[base >> 5] = bits;
    }
}

// In place dy = dy * f'(.): from the mask (dy = 0 where bit i is clear) when it is not null,
// else from saved[i].
template <typename T>
__device__ void unary_bwd_impl(T *dy, const T *saved, const u32 *mask, size_t n, int op,
                               float alpha) {
    GRID_STRIDE(i, n) {
        if (mask != 0) {
            if (((mask[i >> 5] >> (i & 31)) & 1u) == 0u) dy[i] = from_f32<T>(0.0f);
        } else {
            dy[i] = from_f32<T>(act_backward(op, to_f32(saved[i]), to_f32(dy[i]), alpha));
        }
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

// Stage 2: db[j] = sum_s partial[s, j].
template <typename T>
__device__ void bias_grad_finish_impl(const double *partial, T *db, size_t splits, size_t c) {
    GRID_STRIDE(j, c) {
        double t = 0.0;
        for (size_t s = 0; s < splits; ++s) t += partial[s * c + j];
        db[j] = from_f32<T>((float)t);
    }
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
    }

FOR_FLOATS(INSTANTIATE)

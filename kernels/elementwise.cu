// elementwise.cu: fill, bias add and its gradient, ReLU forward (with a packed bit mask) and
// backward. All tensors are row-major f32 unless noted; see Backend's docs for the semantics.

// p[i] = value for i < n (32-bit words: an f32 bit pattern or a u32).
extern "C" __global__ void fill_u32(u32 *p, u32 value, size_t n) {
    GRID_STRIDE(i, n) { p[i] = value; }
}

// y[r, j] += b[j] for y of n elements viewed as rows of c.
extern "C" __global__ void bias_add_f32(float *y, const float *b, size_t n, size_t c) {
    GRID_STRIDE(i, n) { y[i] += b[i % c]; }
}

// Stage 1 of db[j] = sum_r dy[r, j]: block (x, s) sums rows s*rows_per_split .. of columns
// 32x .. 32x+31 into partial[s, j] (f64). Block is 32 x 8 threads.
extern "C" __global__ void bias_grad_partial_f32(const float *dy, double *partial, size_t rows,
                                                 size_t c, size_t rows_per_split) {
    __shared__ double acc[8][33];
    size_t col = (size_t)blockIdx.x * 32 + threadIdx.x;
    size_t begin = (size_t)blockIdx.y * rows_per_split;
    size_t end = begin + rows_per_split < rows ? begin + rows_per_split : rows;
    double s = 0.0;
    if (col < c) {
        for (size_t r = begin + threadIdx.y; r < end; r += 8) {
            s += (double)dy[r * c + col];
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
extern "C" __global__ void bias_grad_finish_f32(const double *partial, float *db, size_t splits,
                                                size_t c) {
    GRID_STRIDE(j, c) {
        double t = 0.0;
        for (size_t s = 0; s < splits; ++s) t += partial[s * c + j];
        db[j] = (float)t;
    }
}

// In-place x = max(x, 0) (NaN -> 0); when mask is not null, bit i%32 of mask[i/32] = x[i] > 0
// (bits past n are 0). One warp ballot per 32 elements; the loop bound is warp-uniform.
extern "C" __global__ void relu_f32(float *x, u32 *mask, size_t n) {
    size_t lane = threadIdx.x & 31;
    size_t warp = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    size_t warps = ((size_t)blockDim.x * gridDim.x) >> 5;
    for (size_t base = warp * 32; base < n; base += warps * 32) {
        size_t i = base + lane;
        float v = i < n ? x[i] : 0.0f;
        bool pos = v > 0.0f;
        u32 bits = __ballot_sync(FULL_MASK, pos);
        // NaN propagates, as jnp.maximum(x, 0): the trainer must see it in the loss.
        if (i < n) x[i] = (pos || v != v) ? v : 0.0f;
        if (mask != 0 && lane == 0) mask[base >> 5] = bits;
    }
}

// In-place dy[i] = 0 where bit i%32 of mask[i/32] is clear.
extern "C" __global__ void relu_bwd_f32(float *dy, const u32 *mask, size_t n) {
    GRID_STRIDE(i, n) {
        if (((mask[i >> 5] >> (i & 31)) & 1u) == 0u) dy[i] = 0.0f;
    }
}

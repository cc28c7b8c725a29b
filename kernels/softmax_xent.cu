// softmax_xent.cu: softmax cross-entropy fused with its gradient (optax semantics).
// logits, labels, dlogits: [n, k] row-major f32.

// One warp per row i, in f64 like the CPU oracle: m = max_j z, s = sum_j exp(z - m),
// row_loss[i] = -sum_j labels[i, j] (z_j - m - log s),
// dlogits[i, j] = (exp(z_j - m) / s - labels[i, j]) / n.
extern "C" __global__ void softmax_xent_f32(const float *logits, const float *labels,
                                            float *dlogits, double *row_loss, size_t n,
                                            size_t k) {
    size_t lane = threadIdx.x & 31;
    size_t warp = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    size_t warps = ((size_t)blockDim.x * gridDim.x) >> 5;
    double inv_n = 1.0 / (double)n;
    for (size_t i = warp; i < n; i += warps) {
        const float *z = logits + i * k;
        const float *y = labels + i * k;
        float *dz = dlogits + i * k;
        float mf = __int_as_float(0xff800000);  // -inf
        for (size_t j = lane; j < k; j += 32) mf = fmaxf(mf, z[j]);
        double m = (double)warp_max_f32(mf);
        double s = 0.0;
        for (size_t j = lane; j < k; j += 32) s += exp((double)z[j] - m);
        s = warp_allsum_f64(s);
        double log_s = log(s);
        double loss = 0.0;
        for (size_t j = lane; j < k; j += 32) {
            double shifted = (double)z[j] - m;
            loss -= (double)y[j] * (shifted - log_s);
            dz[j] = (float)((exp(shifted) / s - (double)y[j]) * inv_n);
        }
        loss = warp_sum_f64(loss);
        if (lane == 0) row_loss[i] = loss;
    }
}

// out[0] = sum_i v[i] / n, as f32, in one block of 256 threads.
extern "C" __global__ void mean_f64_to_f32(const double *v, float *out, size_t n) {
    __shared__ double part[8];
    double s = 0.0;
    for (size_t i = threadIdx.x; i < n; i += blockDim.x) s += v[i];
    s = warp_sum_f64(s);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
        double t = 0.0;
        for (int w = 0; w < (int)(blockDim.x >> 5); ++w) t += part[w];
        out[0] = (float)(t / (double)n);
    }
}

// Softmax codes: must match `SoftmaxKind::code` in crates/stax-tensor/src/codes.rs.
#define SOFTMAX 0
#define LOG_SOFTMAX 1

// Row r of a tensor seen as [outer, len, inner] starts at (r / inner) * len * inner + r % inner
// and its elements are `inner` apart (`AxisDims` in crates/stax-tensor/src/backend/rows.rs).
__device__ __forceinline__ size_t row_start(size_t r, size_t len, size_t inner) {
    return (r / inner) * len * inner + r % inner;
}

// In place softmax or log-softmax along the axis, one warp per row, in f64 like the CPU
// oracle: m = max_j x, s = sum_j exp(x_j - m); y_j = exp(x_j - m) / s or x_j - m - log s.
// Each lane reads, then writes, only its own elements (j = lane mod 32): in place is exact.
template <typename T>
__device__ void softmax_impl(T *y, size_t rows, size_t len, size_t inner, int kind) {
    size_t lane = threadIdx.x & 31;
    WARP_STRIDE(r, rows) {
        T *row = y + row_start(r, len, inner);
        float mf = __int_as_float(0xff800000); // -inf
        for (size_t j = lane; j < len; j += 32) mf = fmaxf(mf, to_f32(row[j * inner]));
        double m = (double)warp_max_f32(mf);
        double s = 0.0;
        for (size_t j = lane; j < len; j += 32) s += exp((double)to_f32(row[j * inner]) - m);
        s = warp_allsum_f64(s);
        double log_s = log(s);
        for (size_t j = lane; j < len; j += 32) {
            double v = (double)to_f32(row[j * inner]) - m;
            row[j * inner] = from_f32<T>((float)(kind == SOFTMAX ? exp(v) / s : v - log_s));
        }
    }
}

// In place dy = dL/dx from the output y: y (dy - sum(y dy)) for the softmax, dy - exp(y)
// sum(dy) for the log-softmax; one warp per row, in f64.
template <typename T>
__device__ void softmax_bwd_impl(const T *y, T *dy, size_t rows, size_t len, size_t inner,
                                 int kind) {
    size_t lane = threadIdx.x & 31;
    WARP_STRIDE(r, rows) {
        size_t start = row_start(r, len, inner);
        const T *yr = y + start;
        T *g = dy + start;
        double s = 0.0;
        for (size_t j = lane; j < len; j += 32) {
            double gv = (double)to_f32(g[j * inner]);
            s += kind == SOFTMAX ? gv * (double)to_f32(yr[j * inner]) : gv;
        }
        s = warp_allsum_f64(s);
        for (size_t j = lane; j < len; j += 32) {
            double gv = (double)to_f32(g[j * inner]), yv = (double)to_f32(yr[j * inner]);
            g[j * inner] = from_f32<T>((float)(kind == SOFTMAX ? yv * (gv - s) : gv - exp(yv) * s));
        }
    }
}

#define INSTANTIATE_SOFTMAX(T, S)                                                              \
    extern "C" __global__ void softmax_##S(T *y, size_t rows, size_t len, size_t inner,        \
                                           int kind) {                                         \
        softmax_impl<T>(y, rows, len, inner, kind);                                            \
    }                                                                                          \
    extern "C" __global__ void softmax_bwd_##S(const T *y, T *dy, size_t rows, size_t len,     \
                                               size_t inner, int kind) {                       \
        softmax_bwd_impl<T>(y, dy, rows, len, inner, kind);                                    \
    }

FOR_FLOATS(INSTANTIATE_SOFTMAX)

// Index-loss codes: must match `IndexLoss::code` in crates/stax-tensor/src/codes.rs.
#define LOSS_SOFTMAX_XENT 0
#define LOSS_NLL 1

// A loss of z [n, k] against u32 labels [n], one warp per row, in f64 like the CPU oracle:
// softmax cross-entropy row_loss[i] = m + log s - z[label], dz = (softmax(z) - one_hot) / n;
// NLL row_loss[i] = -z[label], dz = -one_hot / n. A label >= k makes its row NaN and lowers
// *bad (initialized to all ones) to the row's index, for the launcher to report.
extern "C" __global__ void index_loss_f32(const float *logits, const u32 *labels,
                                          float *dlogits, double *row_loss, u64 *bad, size_t n,
                                          size_t k, int loss) {
    size_t lane = threadIdx.x & 31;
    double inv_n = 1.0 / (double)n;
    WARP_STRIDE(i, n) {
        const float *z = logits + i * k;
        float *dz = dlogits + i * k;
        size_t label = (size_t)labels[i];
        if (label >= k) {
            for (size_t j = lane; j < k; j += 32) dz[j] = __int_as_float(0x7fc00000);
            if (lane == 0) {
                row_loss[i] = __longlong_as_double(0x7ff8000000000000ll);
                atomicMin(bad, (u64)i);
            }
            continue;
        }
        double m = 0.0, s = 1.0;
        if (loss == LOSS_SOFTMAX_XENT) {
            float mf = __int_as_float(0xff800000);
            for (size_t j = lane; j < k; j += 32) mf = fmaxf(mf, z[j]);
            m = (double)warp_max_f32(mf);
            s = 0.0;
            for (size_t j = lane; j < k; j += 32) s += exp((double)z[j] - m);
            s = warp_allsum_f64(s);
        }
        for (size_t j = lane; j < k; j += 32) {
            double hot = j == label ? 1.0 : 0.0;
            double p = loss == LOSS_SOFTMAX_XENT ? exp((double)z[j] - m) / s : 0.0;
            dz[j] = (float)((p - hot) * inv_n);
        }
        if (lane == 0) {
            double zl = (double)z[label];
            row_loss[i] = loss == LOSS_SOFTMAX_XENT ? m + log(s) - zl : -zl;
        }
    }
}

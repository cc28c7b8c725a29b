// norm.cu: per-channel reductions on a [outer, c, inner] view (element (o, j, i) at
// (o * c + j) * inner + i): batch normalization forward and backward and a channel bias, in
// every float dtype (templates instantiated per dtype as <op>_<dtype> by FOR_FLOATS, elements
// read as f32 and rounded once; batch normalization's statistics, parameters and coefficients
// are f32), f64 statistics. See
// crates/stax-tensor/src/cpu/norm.rs for the formulas.
//
// A reduction runs in two kernels: channel_moments_<dtype> writes per-split partial sums (grid
// (ceil(c / 32), splits), blocks of 32 x 8 threads: x over channels, y over the reduced
// elements, so an NHWC view with inner == 1 reads coalesced rows), then a finish kernel adds
// the splits per channel. Deterministic: no atomics.

// Whether bit e of a ReLU mask is set (no mask: every bit is).
__device__ __forceinline__ bool kept(const u32 *mask, size_t e) {
    return !mask || ((mask[e >> 5] >> (e & 31)) & 1u);
}

// partial[(split * c + j) * 2 + {0, 1}] = (sum a, sum a * (b - shift[j])) over split `split` of
// channel j's outer * inner elements (b null: the second is 0; shift null: 0), a taken as 0
// where a non-null mask's bit is clear (a fused ReLU's backward).
template <typename T>
__device__ void channel_moments_impl(const T *a, const T *b, const float *shift, const u32 *mask,
                                     double *partial, size_t outer, size_t c, size_t inner,
                                     size_t per_split) {
    __shared__ double ss[8][32];
    __shared__ double tt[8][32];
    size_t j = (size_t)blockIdx.x * 32 + threadIdx.x;
    size_t total = outer * inner;
    size_t r0 = (size_t)blockIdx.y * per_split;
    size_t r1 = r0 + per_split < total ? r0 + per_split : total;
    double s = 0.0, t = 0.0;
    if (j < c) {
        double sh = shift ? (double)shift[j] : 0.0;
        for (size_t r = r0 + threadIdx.y; r < r1; r += 8) {
            // NHWC (inner == 1) needs no 64-bit division
            size_t e = inner == 1 ? r * c + j : ((r / inner) * c + j) * inner + r % inner;
            double v = kept(mask, e) ? (double)to_f32(a[e]) : 0.0;
            s += v;
            if (b) t += v * ((double)to_f32(b[e]) - sh);
        }
    }
    ss[threadIdx.y][threadIdx.x] = s;
    tt[threadIdx.y][threadIdx.x] = t;
    __syncthreads();
    if (threadIdx.y == 0 && j < c) {
        for (int k = 1; k < 8; ++k) {
            s += ss[k][threadIdx.x];
            t += tt[k][threadIdx.x];
        }
        partial[((size_t)blockIdx.y * c + j) * 2] = s;
        partial[((size_t)blockIdx.y * c + j) * 2 + 1] = t;
    }
}

// The finishing kernels run in blocks of 32 x 32 threads, each block adding the splits of 32
// channels (column_sums).

// out[j] = sum of a over channel j (from channel_moments with b null), rounded once to T.
template <typename T>
__device__ void channel_sum_finish_impl(const double *partial, size_t splits, size_t c, T *out) {
    size_t j;
    double st[2];
    if (column_sums<2>(partial, splits, c, &j, st)) out[j] = from_f32<T>((float)st[0]);
}

// Forward statistics from the sums of x and x * x over m elements per channel:
// mean = s / m, var = max(t / m - mean^2, 0), rstd = 1 / sqrt(var + eps),
// scale = gamma * rstd (gamma null: 1).
extern "C" __global__ void bn_finish_f32(const double *partial, size_t splits, size_t c, double m,
                                         float eps, const float *gamma, float *mean, float *rstd,
                                         float *scale) {
    size_t j;
    double st[2];
    if (column_sums<2>(partial, splits, c, &j, st)) {
        double s = st[0], t = st[1];
        double mu = s / m;
        double var = t / m - mu * mu;
        if (var < 0.0) var = 0.0;
        double r = 1.0 / sqrt(var + (double)eps);
        mean[j] = (float)mu;
        rstd[j] = (float)r;
        scale[j] = (float)((gamma ? (double)gamma[j] : 1.0) * (double)rstd[j]);
    }
}

// scale = gamma * rstd per channel (gamma null: 1) from statistics given (a rematerialized
// batch norm's, saved by its first run): bn_finish_f32's scale from the same rstd, bit for bit.
extern "C" __global__ void bn_scale_f32(const float *gamma, const float *rstd, float *scale,
                                        size_t c) {
    size_t j = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (j < c) scale[j] = (float)((gamma ? (double)gamma[j] : 1.0) * (double)rstd[j]);
}

// Walks element indices i of a [outer, c, inner] view in a grid-stride loop with j, the
// channel of i: with inner == 1 (NHWC) j advances by the stride modulo c, no division per
// element; otherwise j = (i / inner) % c.
#define CHANNEL_STRIDE(i, j, n, c, inner)                                                      \
    size_t stride_##i = (size_t)blockDim.x * gridDim.x;                                        \
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;                                  \
    size_t j = (i / (inner)) % (c), step_##j = stride_##i % (c);                               \
    for (; i < (n); i += stride_##i,                                                           \
                    j = (inner) == 1 ? (j + step_##j >= (c) ? j + step_##j - (c) : j + step_##j) \
                                     : (i / (inner)) % (c))

// The normalized value (x - mean) * scale + beta, rounded once (an explicit fma, so that every
// apply kernel rounds alike whatever the compiler contracts: measured 1 ulp apart between
// bn_apply_<dtype> and bn_apply_relu_<dtype> at 10 channels on the H100 before).
__device__ __forceinline__ float bn_value(float x, float mean, float scale, float beta) {
    return __fmaf_rn(x - mean, scale, beta);
}

// v, the normalized value, plus a (a residual's element) when there is one: v rounded to T,
// then the sum (binary_<dtype>'s add after bn_apply_<dtype>, bit for bit), rounded to T.
template <typename T> __device__ __forceinline__ float plus_add(float v, bool add, float a) {
    return add ? to_f32(from_f32<T>(to_f32(from_f32<T>(v)) + a)) : v;
}

// y = (x - mean) * scale + beta over the view (beta null: 0), plus add (null: none).
template <typename T>
__device__ void bn_apply_impl(const T *x, T *y, const float *mean, const float *scale,
                              const float *beta, const T *add, size_t n, size_t c,
                              size_t inner) {
    CHANNEL_STRIDE(i, j, n, c, inner) {
        float v = bn_value(to_f32(x[i]), mean[j], scale[j], beta ? beta[j] : 0.0f);
        y[i] = from_f32<T>(plus_add<T>(v, add != 0, add ? to_f32(add[i]) : 0.0f));
    }
}

// The channel of element base + lane of an NHWC view (inner == 1), jb < c being base's.
__device__ __forceinline__ size_t lane_channel(size_t jb, size_t lane, size_t c) {
    size_t j = jb + lane;  // < c + 31
    if (j < c) return j;
    return c >= 32 ? j - c : (size_t)((unsigned)j % (unsigned)c);
}

// bn_apply followed by a ReLU (relu_<dtype>'s: NaN stays, its bit clear), mask[w] receiving
// bit i % 32 = (v > 0) of elements 32 w .. 32 w + 31 (v the f32 value before rounding, or with
// add the rounded sum): one warp ballot per 32 elements; the loop bound is warp-uniform, so
// blocks must be whole warps.
template <typename T>
__device__ void bn_apply_relu_impl(const T *x, T *y, const float *mean, const float *scale,
                                   const float *beta, const T *add, u32 *mask, size_t n,
                                   size_t c, size_t inner) {
    size_t lane = threadIdx.x & 31;
    size_t warp = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    size_t warps = ((size_t)blockDim.x * gridDim.x) >> 5;
    // with inner == 1 (NHWC), jb is the channel of base, advanced without a division
    size_t jb = (warp * 32) % c, step = (warps * 32) % c;
    for (size_t base = warp * 32; base < n;
         base += warps * 32, jb = jb + step >= c ? jb + step - c : jb + step) {
        size_t i = base + lane;
        float v = 0.0f;
        if (i < n) {
            size_t j = inner == 1 ? lane_channel(jb, lane, c) : (i / inner) % c;
            v = bn_value(to_f32(x[i]), mean[j], scale[j], beta ? beta[j] : 0.0f);
            v = plus_add<T>(v, add != 0, add ? to_f32(add[i]) : 0.0f);
        }
        u32 bits = __ballot_sync(FULL_MASK, v > 0.0f);
        if (i < n) y[i] = from_f32<T>(v <= 0.0f ? 0.0f : v);
        if (lane == 0) mask[base >> 5] = bits;
    }
}

// Backward per-channel values from s = sum dy and t = sum dy * (x - mean) over m elements:
// dgamma = rstd * t, dbeta = s (each written when non-null), and coef[3 j ..] = (gamma * rstd,
// s / m, rstd * dgamma / m), the dx kernel's coefficients.
extern "C" __global__ void bn_bwd_finish_f32(const double *partial, size_t splits, size_t c,
                                             double m, const float *gamma, const float *rstd,
                                             float *dgamma, float *dbeta, float *coef) {
    size_t j;
    double st[2];
    if (column_sums<2>(partial, splits, c, &j, st)) {
        double s = st[0], t = st[1];
        double r = (double)rstd[j];
        double dg = r * t;
        if (dgamma) dgamma[j] = (float)dg;
        if (dbeta) dbeta[j] = (float)s;
        coef[3 * j] = (float)((gamma ? (double)gamma[j] : 1.0) * r);
        coef[3 * j + 1] = (float)(s / m);
        coef[3 * j + 2] = (float)(r * dg / m);
    }
}

// The per-channel part of a batch norm's backward pass through the pointwise conv before it
// (ops::batch_norm_fold; x = h w + b0, h [count, k], w [k, c]), blocks of 32 channels x 8 row
// groups. Per channel j, in f64: xw = sum_r w gt, hw = sum_r sh w; t = rstd (xw + (b0 - mean)
// sd) (the sum of dy xhat), a = gamma rstd, cz = -a rstd t / count, bp = -a sd / count +
// cz (b0 - mean); dgamma = t, dbeta = sd (each when non-null), db0 = a sd + count bp + cz hw.
// Then per element: dw = a gt + sh bp + cz dw (dw holds h^T h w on entry), w_a = a w,
// w_c = cz w.
extern "C" __global__ void bn_fold_f32(const float *w, const float *b0, const float *gamma,
                                       const float *mean, const float *rstd, const float *gt,
                                       const float *sh, const float *sd, size_t k, size_t c,
                                       double count, float *dw, float *w_a, float *w_c,
                                       float *bp, float *db0, float *dgamma, float *dbeta) {
    __shared__ double part[2][8][33];
    __shared__ double coef[3][32];
    unsigned tx = threadIdx.x, ty = threadIdx.y;
    size_t j = (size_t)blockIdx.x * 32 + tx;
    double xw = 0.0, hw = 0.0;
    for (size_t r = ty; j < c && r < k; r += 8) {
        double wv = w[r * c + j];
        xw += wv * gt[r * c + j];
        hw += wv * sh[r];
    }
    part[0][ty][tx] = xw;
    part[1][ty][tx] = hw;
    __syncthreads();
    if (ty == 0 && j < c) {
        for (int y = 1; y < 8; ++y) {
            xw += part[0][y][tx];
            hw += part[1][y][tx];
        }
        double s = sd[j], r = rstd[j], m = mean[j], b = b0[j];
        double t = r * (xw + (b - m) * s);
        double a = (gamma ? (double)gamma[j] : 1.0) * r;
        double cz = -a * r * t / count;
        double bpj = -a * s / count + cz * (b - m);
        if (dgamma) dgamma[j] = (float)t;
        if (dbeta) dbeta[j] = sd[j];
        db0[j] = (float)(a * s + count * bpj + cz * hw);
        bp[j] = (float)bpj;
        coef[0][tx] = a;
        coef[1][tx] = bpj;
        coef[2][tx] = cz;
    }
    __syncthreads();
    for (size_t r = ty; j < c && r < k; r += 8) {
        size_t i = r * c + j;
        double a = coef[0][tx], bpj = coef[1][tx], cz = coef[2][tx];
        dw[i] = (float)(a * gt[i] + (double)sh[r] * bpj + cz * dw[i]);
        w_a[i] = (float)(a * w[i]);
        w_c[i] = (float)(cz * w[i]);
    }
}

// dy = a * (dy - b - (x - mean) * cz) in place, (a, b, cz) = coef[3 j ..], dy taken as 0
// where a non-null mask's bit is clear (a fused ReLU's backward).
template <typename T>
__device__ void bn_bwd_apply_impl(const T *x, T *dy, const float *mean, const float *coef,
                                  const u32 *mask, size_t n, size_t c, size_t inner) {
    CHANNEL_STRIDE(i, j, n, c, inner) {
        float d = kept(mask, i) ? to_f32(dy[i]) : 0.0f;
        float z = (to_f32(x[i]) - mean[j]) * coef[3 * j + 2];
        dy[i] = from_f32<T>(coef[3 * j] * (d - coef[3 * j + 1] - z));
    }
}

// y[i] += b[(i / inner) % c], in f32, rounded once to T.
template <typename T>
__device__ void channel_bias_add_impl(T *y, const T *b, size_t n, size_t c, size_t inner) {
    GRID_STRIDE(i, n) {
        y[i] = from_f32<T>(to_f32(y[i]) + to_f32(b[(i / inner) % c]));
    }
}

// The vectorized forms of an NHWC view (inner == 1) with c = 8 c8 channels: group i is
// elements 8 i .. 8 i + 7, channels 8 (i % c8) .. 8 (i % c8) + 7 of one row, moved with
// 16-byte accesses (load8/store8: every tensor 16-byte aligned). Each element gets the same
// arithmetic as in the scalar kernels above.

// Group i of a (and, for a CROSS reduction, of b) as f32 with its 8 mask bits (all set
// without a mask). Loaded whole, masked-out elements included (they are zeroed when added), so
// that every load of a thread's groups is issued before any is used.
enum MomentKind { SUM, SQUARE, CROSS };  // b null, b == a, b distinct
template <int K> struct MomentGroup {
    float a[8], b[8];  // b unused unless CROSS
    u32 bits;
};
template <int K, typename T>
__device__ __forceinline__ void moments_load(const T *a, const T *b, const u32 *mask, size_t i,
                                             MomentGroup<K> &g) {
    g.bits = group_bits(mask, i);
    load8(a + 8 * i, g.a);
    if constexpr (K == CROSS) load8(b + 8 * i, g.b);
}

// A loaded group added to the sums s (of a, where bits are set) and q (of a * (b - sh)).
template <int K>
__device__ __forceinline__ void moments_add(const MomentGroup<K> &g, const float (&sh)[8],
                                            double (&s)[8], double (&q)[8]) {
#pragma unroll
    for (int k = 0; k < 8; ++k) {
        double v = (g.bits >> k) & 1u ? (double)g.a[k] : 0.0;
        s[k] += v;
        float b = K == CROSS ? g.b[k] : g.a[k];
        if (K != SUM) q[k] += v * ((double)b - (double)sh[k]);
    }
}

// Thread t's sums over groups i, i + stride, ... < n8, in that order: MOMENTS_AHEAD groups'
// loads issued before the first of them is added.
#define MOMENTS_AHEAD 4
template <int K, typename T>
__device__ void moments_run(const T *a, const T *b, const u32 *mask, size_t i, size_t stride,
                            size_t n8, const float (&sh)[8], double (&s)[8], double (&q)[8]) {
    MomentGroup<K> g[MOMENTS_AHEAD];
    for (; i + (MOMENTS_AHEAD - 1) * stride < n8; i += MOMENTS_AHEAD * stride) {
#pragma unroll
        for (int u = 0; u < MOMENTS_AHEAD; ++u) moments_load<K>(a, b, mask, i + u * stride, g[u]);
#pragma unroll
        for (int u = 0; u < MOMENTS_AHEAD; ++u) moments_add<K>(g[u], sh, s, q);
    }
    for (; i < n8; i += stride) {
        moments_load<K>(a, b, mask, i, g[0]);
        moments_add<K>(g[0], sh, s, q);
    }
}

// The block's per-channel sums (s, q) of thread t's channel group t % c8 (blockDim.x == 256, c8
// = c / 8 dividing 256) added over its threads in thread order: partial[(blockIdx.x * c + j) * 2
// + {0, 1}] for the finishing kernels (column_sums).
__device__ __forceinline__ void block_pairs(double (&s)[8], double (&q)[8], double *partial,
                                            size_t c) {
    __shared__ double acc[16][256];
    unsigned t = threadIdx.x, c8 = (unsigned)(c / 8);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
        acc[k][t] = s[k];
        acc[8 + k][t] = q[k];
    }
    __syncthreads();
    if (t < c8) {
        for (unsigned u = t + c8; u < 256; u += c8) {
#pragma unroll
            for (int k = 0; k < 8; ++k) {
                s[k] += acc[k][u];
                q[k] += acc[8 + k][u];
            }
        }
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            size_t j = (size_t)blockIdx.x * c + 8 * t + k;
            partial[j * 2] = s[k];
            partial[j * 2 + 1] = q[k];
        }
    }
}

// channel_moments_<dtype> on n8 groups: block `split` writes the same partial[(split * c + j)
// * 2 + {0, 1}]. Needs blockDim.x == 256 and c8 dividing 256, so that thread t of every block
// always sees channel group t % c8.
template <typename T>
__device__ void channel_moments_vec_impl(const T *a, const T *b, const float *shift,
                                         const u32 *mask, double *partial, size_t n8,
                                         size_t c) {
    const size_t stride = (size_t)gridDim.x * 256;
    unsigned t = threadIdx.x, c8 = (unsigned)(c / 8), col = t % c8;
    double s[8] = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0};
    double q[8] = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0};
    float sh[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) sh[k] = shift ? shift[8 * col + k] : 0.0f;
    size_t i = (size_t)blockIdx.x * 256 + t;
    if (!b) moments_run<SUM>(a, b, mask, i, stride, n8, sh, s, q);
    else if (b == a) moments_run<SQUARE>(a, b, mask, i, stride, n8, sh, s, q);
    else moments_run<CROSS>(a, b, mask, i, stride, n8, sh, s, q);
    block_pairs(s, q, partial, c);
}

// The W f32 values per channel of channels 8 col .. 8 col + 7 of p (p[W j + w] for channel j),
// into v[w][k]; zeros for a null p.
template <int W>
__device__ __forceinline__ void channel_values(const float *p, size_t col, float (&v)[W][8]) {
#pragma unroll
    for (int k = 0; k < 8; ++k) {
#pragma unroll
        for (int w = 0; w < W; ++w) v[w][k] = p ? p[W * (8 * col + k) + w] : 0.0f;
    }
}

// bn_apply_<dtype> (mask null) or bn_apply_relu_<dtype> on n8 groups (add as they take it),
// mask byte i % 4 of word i / 4 receiving group i's 8 bits (the 4 lanes of a word OR their
// bytes). A thread loads its channels' values again only when its channel group changes: never
// when the grid's stride is a multiple of c8 (the launcher's grid). The loop bound is
// warp-uniform, so blocks must be whole warps.
template <typename T>
__device__ void bn_apply_vec_impl(const T *x, T *y, const float *mean, const float *scale,
                                  const float *beta, const T *add, u32 *mask, size_t n8,
                                  size_t c8) {
    const size_t stride = (size_t)blockDim.x * gridDim.x;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t lane = threadIdx.x & 31, col = i % c8, step = stride % c8;
    float mu[1][8], sc[1][8], bt[1][8];
    channel_values<1>(mean, col, mu);
    channel_values<1>(scale, col, sc);
    channel_values<1>(beta, col, bt);
    for (size_t base = i - lane; base < n8; base += stride, i += stride) {
        u32 byte = 0;
        if (i < n8) {
            float f[8], a[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
            load8(x + 8 * i, f);
            if (add) load8(add + 8 * i, a);
#pragma unroll
            for (int k = 0; k < 8; ++k) {
                float v = bn_value(f[k], mu[0][k], sc[0][k], bt[0][k]);
                v = plus_add<T>(v, add != 0, a[k]);
                byte |= (u32)(v > 0.0f) << k;
                f[k] = mask && v <= 0.0f ? 0.0f : v;
            }
            store8(y + 8 * i, f);
        }
        if (mask) {
            u32 word = quad_or(byte << (8 * (lane & 3)));
            if ((lane & 3) == 0 && i < n8) mask[i >> 2] = word;
        }
        if (step) {
            col += step;
            if (col >= c8) col -= c8;
            channel_values<1>(mean, col, mu);
            channel_values<1>(scale, col, sc);
            channel_values<1>(beta, col, bt);
        }
    }
}

// Group i of bn_bwd_apply (dy not read when no mask bit of the group is set): dx written over
// dy and left in d.
template <typename T>
__device__ __forceinline__ void bn_bwd_group(const T *x, T *dy, const u32 *mask, size_t i,
                                             const float (&mu)[1][8], const float (&k3)[3][8],
                                             float (&d)[8]) {
    u32 bits = group_bits(mask, i);
    float f[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) d[k] = 0.0f;
    load8(x + 8 * i, f);
    if (bits) load8(dy + 8 * i, d);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
        float dk = (bits >> k) & 1u ? d[k] : 0.0f;
        float z = (f[k] - mu[0][k]) * k3[2][k];
        d[k] = k3[0][k] * (dk - k3[1][k] - z);
    }
    store8(dy + 8 * i, d);
}

// bn_bwd_apply_<dtype> on n8 groups, the channels' values loaded as in bn_apply_vec_impl.
template <typename T>
__device__ void bn_bwd_apply_vec_impl(const T *x, T *dy, const float *mean, const float *coef,
                                      const u32 *mask, size_t n8, size_t c8) {
    const size_t stride = (size_t)blockDim.x * gridDim.x;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t col = i % c8, step = stride % c8;
    float mu[1][8], k3[3][8], d[8];
    channel_values<1>(mean, col, mu);
    channel_values<3>(coef, col, k3);
    for (; i < n8; i += stride) {
        bn_bwd_group<T>(x, dy, mask, i, mu, k3, d);
        if (step) {
            col += step;
            if (col >= c8) col -= c8;
            channel_values<1>(mean, col, mu);
            channel_values<3>(coef, col, k3);
        }
    }
}

// bn_bwd_apply_vec that also sums per channel, in f64, the dx it writes (rounded to T): the
// gradient of a bias the norm's input had (a conv's), block `split` writing partial[(split * c
// + j) * 2] (0 at + 1) for channel_sum_finish. Needs blockDim.x == 256 and c8 dividing 256, so
// that thread t of every block always sees channel group t % c8.
template <typename T>
__device__ void bn_bwd_apply_sum_vec_impl(const T *x, T *dy, const float *mean, const float *coef,
                                          const u32 *mask, double *partial, size_t n8,
                                          size_t c8) {
    const size_t stride = (size_t)gridDim.x * 256;
    unsigned t = threadIdx.x, col = t % (unsigned)c8;
    float mu[1][8], k3[3][8], d[8];
    channel_values<1>(mean, col, mu);
    channel_values<3>(coef, col, k3);
    double s[8] = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0};
    double q[8] = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0};
    for (size_t i = (size_t)blockIdx.x * 256 + t; i < n8; i += stride) {
        bn_bwd_group<T>(x, dy, mask, i, mu, k3, d);
#pragma unroll
        for (int k = 0; k < 8; ++k) s[k] += (double)to_f32(from_f32<T>(d[k]));
    }
    block_pairs(s, q, partial, 8 * c8);
}

#define CHANNEL_KERNELS(T, S)                                                                  \
    extern "C" __global__ void channel_moments_##S(const T *a, const T *b, const float *shift,  \
                                                   const u32 *mask, double *partial,            \
                                                   size_t outer, size_t c, size_t inner,        \
                                                   size_t per_split) {                          \
        channel_moments_impl<T>(a, b, shift, mask, partial, outer, c, inner, per_split);        \
    }                                                                                          \
    extern "C" __global__ void channel_sum_finish_##S(const double *partial, size_t splits,    \
                                                      size_t c, T *out) {                      \
        channel_sum_finish_impl<T>(partial, splits, c, out);                                   \
    }                                                                                          \
    extern "C" __global__ void channel_bias_add_##S(T *y, const T *b, size_t n, size_t c,      \
                                                    size_t inner) {                            \
        channel_bias_add_impl<T>(y, b, n, c, inner);                                           \
    }                                                                                          \
    extern "C" __global__ void bn_apply_##S(const T *x, T *y, const float *mean,               \
                                            const float *scale, const float *beta,             \
                                            const T *add, size_t n, size_t c, size_t inner) {  \
        bn_apply_impl<T>(x, y, mean, scale, beta, add, n, c, inner);                           \
    }                                                                                          \
    extern "C" __global__ void bn_apply_relu_##S(const T *x, T *y, const float *mean,          \
                                                 const float *scale, const float *beta,        \
                                                 const T *add, u32 *mask, size_t n, size_t c,  \
                                                 size_t inner) {                               \
        bn_apply_relu_impl<T>(x, y, mean, scale, beta, add, mask, n, c, inner);                \
    }                                                                                          \
    extern "C" __global__ void bn_bwd_apply_##S(const T *x, T *dy, const float *mean,          \
                                                const float *coef, const u32 *mask, size_t n,  \
                                                size_t c, size_t inner) {                      \
        bn_bwd_apply_impl<T>(x, dy, mean, coef, mask, n, c, inner);                            \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(256, 2)                                       \
        channel_moments_vec_##S(const T *a, const T *b, const float *shift, const u32 *mask,   \
                                double *partial, size_t n8, size_t c) {                        \
        channel_moments_vec_impl<T>(a, b, shift, mask, partial, n8, c);                        \
    }                                                                                          \
    extern "C" __global__ void bn_apply_vec_##S(const T *x, T *y, const float *mean,           \
                                                const float *scale, const float *beta,         \
                                                const T *add, u32 *mask, size_t n8,            \
                                                size_t c8) {                                   \
        bn_apply_vec_impl<T>(x, y, mean, scale, beta, add, mask, n8, c8);                      \
    }                                                                                          \
    extern "C" __global__ void bn_bwd_apply_vec_##S(const T *x, T *dy, const float *mean,      \
                                                    const float *coef, const u32 *mask,        \
                                                    size_t n8, size_t c8) {                    \
        bn_bwd_apply_vec_impl<T>(x, dy, mean, coef, mask, n8, c8);                             \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(256)                                          \
        bn_bwd_apply_sum_vec_##S(const T *x, T *dy, const float *mean, const float *coef,      \
                                 const u32 *mask, double *partial, size_t n8, size_t c8) {     \
        bn_bwd_apply_sum_vec_impl<T>(x, dy, mean, coef, mask, partial, n8, c8);                \
    }
FOR_FLOATS(CHANNEL_KERNELS)

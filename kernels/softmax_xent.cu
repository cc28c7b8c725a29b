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

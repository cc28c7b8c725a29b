// What the CUDA timing harnesses share (benches/cuda/dense_rows.cu, dense_rows_variants.cu,
// bn.cu): a checked CUDA call, a seeded fill, an FNV-1a hash of device bytes and the dense
// update's arrays (held for the process's life). Included after kernels/common.cuh
// (GRID_STRIDE).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>
#include <vector>
#define CK(x)                                                                                  \
    do {                                                                                       \
        cudaError_t e = (x);                                                                   \
        if (e != cudaSuccess) {                                                                \
            printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e));                   \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)

// p[i] uniform in [lo, hi) from a hash of (i, seed); with seed 1 a quarter of the entries are
// zero, as after a ReLU half are.
__global__ void fill(float *p, size_t n, unsigned seed, float lo, float hi) {
    GRID_STRIDE(i, n) {
        unsigned h = (unsigned)(i * 2654435761u) ^ seed;
        h ^= h >> 13;
        h *= 0x5bd1e995u;
        h ^= h >> 15;
        p[i] = (seed == 1 && (h & 3) == 0) ? 0.0f : lo + (hi - lo) * (h & 0xffffff) / 16777216.0f;
    }
}

// h folded with the FNV-1a hash of `bytes` bytes (a multiple of 4) at device address d.
static unsigned long long fnv(const void *d, size_t bytes, unsigned long long h) {
    std::vector<unsigned> v(bytes / 4);
    CK(cudaMemcpy(v.data(), d, bytes, cudaMemcpyDeviceToHost));
    for (unsigned u : v) h = (h ^ u) * 1099511628211ull;
    return h;
}

// The times in ms, sorted, of `reps` runs of `run` after `warm` untimed ones, each alone
// between two CUDA events; `before` runs ahead of each, outside the timing (an L2 flush, or
// nothing).
template <typename F, typename G>
static std::vector<float> timed_ms(F run, int reps, int warm, G before) {
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    std::vector<float> t;
    for (int r = 0; r < warm + reps; ++r) {
        before();
        CK(cudaEventRecord(a));
        run();
        CK(cudaEventRecord(b));
        CK(cudaEventSynchronize(b));
        float ms;
        CK(cudaEventElapsedTime(&ms, a, b));
        if (r >= warm) t.push_back(ms);
    }
    CK(cudaGetLastError());
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    std::sort(t.begin(), t.end());
    return t;
}

// The dense update's arrays (benches/cuda/dense_rows*.cu): x and dx [m, k], dy [m, n], w, mu,
// nu and a gradient g [k, n]; seed() fills them from fixed seeds (x a quarter zeros).
struct DenseArrays {
    int m, n;
    size_t k;
    float *x, *dy, *w, *mu, *nu, *g, *dx;
    DenseArrays(int m_, int n_, size_t k_) : m(m_), n(n_), k(k_) {
        for (float **p : {&x, &dx}) CK(cudaMalloc(p, m * k * 4));
        CK(cudaMalloc(&dy, m * n * 4));
        for (float **p : {&w, &mu, &nu, &g}) CK(cudaMalloc(p, k * n * 4));
    }
    void seed() {
        fill<<<1024, 256>>>(x, m * k, 1, 0, 1);
        fill<<<1024, 256>>>(dy, m * n, 2, -1, 1);
        fill<<<1024, 256>>>(w, k * n, 3, -0.1f, 0.1f);
        fill<<<1024, 256>>>(mu, k * n, 4, -0.01f, 0.01f);
        fill<<<1024, 256>>>(nu, k * n, 5, 0, 0.01f);
        fill<<<1024, 256>>>(g, k * n, 6, -1, 1);
        CK(cudaDeviceSynchronize());
    }
    // FNV-1a of w, mu and nu
    unsigned long long hash_wmv() const {
        unsigned long long h = 1469598103934665603ull;
        for (const float *p : {(const float *)w, (const float *)mu, (const float *)nu})
            h = fnv(p, (k * n) * 4, h);
        return h;
    }
};

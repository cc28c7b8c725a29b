// kernels/adam.cu's rows kernel on the CPU (benches/cuda/emulate_rows.sh): kern.inc is its
// source, with what it uses of common.cuh and adam.cu; here the CUDA names it needs, one block
// of 128 threads (4 warps) as std::threads, __syncwarp as a barrier of each warp's 32 threads,
// __shared__ arrays as function statics (one block shares them).
#include <barrier>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <random>
#include <thread>
#include <vector>
#include <algorithm>
struct float4 { float x, y, z, w; };
static inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
struct Dim { unsigned x; };
thread_local Dim threadIdx;
Dim blockIdx{0}, blockDim{128}, gridDim{1};
#define __device__
#define __forceinline__ inline
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
#define __restrict__
#define ASMV(...) ((void)0)
static std::barrier<> *warp_bar[4];
static inline void __syncwarp() { warp_bar[threadIdx.x >> 5]->arrive_and_wait(); }
template <typename A, typename B> static inline auto min(A a, B b) { return a < b ? a : b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline float __fsqrt_rn(float a) { return std::sqrt(a); }
static inline float __fdividef(float a, float b) { return a / b; }
#include "kern.inc"
// The kernel's dense_adam_rows_t<M, fast> run by one block of 128 threads.
template <int M>
void run_block(bool fast, const float *x, const float *dy, float *w, float *mu, float *nu,
               float *dx, AdamHyper h, int n, size_t k) {
    std::barrier<> b0(32), b1(32), b2(32), b3(32);
    warp_bar[0] = &b0, warp_bar[1] = &b1, warp_bar[2] = &b2, warp_bar[3] = &b3;
    std::vector<std::thread> ts;
    for (unsigned t = 0; t < 128; ++t)
        ts.emplace_back([&, t] {
            threadIdx.x = t;
            if (fast)
                dense_adam_rows_t<M, true>(x, dy, w, mu, nu, dx, h, n, k);
            else
                dense_adam_rows_t<M, false>(x, dy, w, mu, nu, dx, h, n, k);
        });
    for (auto &t : ts) t.join();
}

// The reference: dx = dy w_old^T in f64 ([M, k]); each element's gradient (the kernel's fmaf
// order over b) and the same Adam step on wr, mr, vr.
template <int M>
std::vector<double> reference(bool fast, const std::vector<float> &x, const float *dy,
                              std::vector<float> &wr, std::vector<float> &mr,
                              std::vector<float> &vr, const AdamHyper &h, int n, size_t k) {
    std::vector<double> dx(M * k);
    for (int b = 0; b < M; ++b)
        for (size_t i = 0; i < k; ++i)
            for (int j = 0; j < n; ++j) dx[b * k + i] += (double)dy[b * n + j] * wr[i * n + j];
    const float inv[2] = {1.0f / h.bias_correction1, 1.0f / h.bias_correction2};
    for (size_t i = 0; i < k; ++i)
        for (int j = 0; j < n; ++j) {
            float g = 0;
            for (int b = 0; b < M; ++b) g = fmaf(x[b * k + i], dy[b * n + j], g);
            const size_t e = i * n + j;
            if (fast)
                adam_tf32(wr[e], g, mr[e], vr[e], h, inv[0], inv[1]);
            else
                adam_one(wr[e], g, mr[e], vr[e], h);
        }
    return dx;
}

// One case: w, mu, nu and dy `misalign` floats past a 16-byte boundary; 0 when the kernel
// matches the reference (w, mu, nu bit for bit, dx within 1e-5 of its largest value).
template <int M>
int check(int n, size_t k, bool fast, int misalign) {
    std::mt19937 rng(n * 1000 + M + k);
    std::uniform_real_distribution<float> u(-1, 1);
    std::vector<float> buf(4 * k * n + 64 + M * n + 16);
    float *w = buf.data() + misalign, *mu = w + k * n, *nu = mu + k * n, *dy = nu + k * n + 4;
    std::vector<float> x(M * k), dx(M * k);
    for (auto &v : x) v = u(rng) > 0.5f ? 0 : u(rng);
    for (size_t i = 0; i < k * n; ++i)
        w[i] = u(rng) * 0.1f, mu[i] = u(rng) * 0.01f, nu[i] = std::fabs(u(rng)) * 0.01f;
    for (int i = 0; i < M * n; ++i) dy[i] = u(rng);
    std::vector<float> wr(w, w + k * n), mr(mu, mu + k * n), vr(nu, nu + k * n);
    const AdamHyper h = {1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f, 0.19f, 0.002f, 1.0f};
    const std::vector<double> dxr = reference<M>(fast, x, dy, wr, mr, vr, h, n, k);
    run_block<M>(fast, x.data(), dy, w, mu, nu, dx.data(), h, n, k);
    int bad = 0;
    for (size_t e = 0; e < k * n; ++e) bad += w[e] != wr[e] || mu[e] != mr[e] || nu[e] != vr[e];
    double err = 0, scale = 0;
    for (size_t i = 0; i < M * k; ++i) {
        err = std::max(err, std::fabs(dx[i] - dxr[i]));
        scale = std::max(scale, std::fabs(dxr[i]));
    }
    printf("M=%2d n=%3d k=%5zu fast=%d misalign=%d: w/mu/nu mismatches %d, dx rel err %.2e\n", M,
           n, k, fast, misalign, bad, err / scale);
    return bad == 0 && err / scale < 1e-5 ? 0 : 1;
}

int main() {
    int f = 0;
    f += check<10>(128, 4000, true, 0);
    f += check<10>(128, 4001, false, 0);
    f += check<1>(3, 100, true, 0);
    f += check<1>(128, 97, false, 0);
    f += check<16>(128, 3001, true, 0);
    f += check<16>(128, 65, false, 1);
    f += check<7>(100, 65, false, 0);
    f += check<7>(100, 65, true, 2);
    f += check<3>(5, 77, true, 0);
    f += check<11>(64, 300, true, 0);
    f += check<5>(128, 33, false, 0);
    printf("%d failed\n", f);
    return f;
}

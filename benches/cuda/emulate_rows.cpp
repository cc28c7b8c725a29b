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
Dim blockIdx{0}, blockDim{128}, gridDim{2};
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
// The kernel's dense_adam_rows_t<M, fast> on a grid of two blocks of 128 threads, one block
// after the other (a schedule the GPU may take too; the function statics are one block's
// shared memory at a time).
template <int M>
void run_grid(bool fast, const float *x, const float *dy, float *w, float *mu, float *nu,
              float *dx, AdamHyper h, int n, size_t k) {
    for (unsigned block = 0; block < gridDim.x; ++block) {
        blockIdx.x = block;
        std::barrier<> b0(32), b1(32), b2(32), b3(32);
        warp_bar[0] = &b0, warp_bar[1] = &b1, warp_bar[2] = &b2, warp_bar[3] = &b3;
        std::vector<std::thread> ts;
        for (unsigned t = 0; t < blockDim.x; ++t)
            ts.emplace_back([&, t] {
                threadIdx.x = t;
                if (fast)
                    dense_adam_rows_t<M, true>(x, dy, w, mu, nu, dx, h, n, k);
                else
                    dense_adam_rows_t<M, false>(x, dy, w, mu, nu, dx, h, n, k);
            });
        for (auto &t : ts) t.join();
    }
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

enum Dx { OWN, IN_PLACE, NONE };

// One case: w, mu, nu and dy `misalign` floats past a 16-byte boundary, dx into its own array,
// into x or not computed; 0 when the kernel matches the reference (w, mu, nu bit for bit, dx
// within 1e-5 of its largest value).
template <int M>
int check(int n, size_t k, bool fast, int misalign, Dx mode = OWN) {
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
    std::vector<float> xk(x);
    float *out = mode == OWN ? dx.data() : mode == IN_PLACE ? xk.data() : nullptr;
    run_grid<M>(fast, xk.data(), dy, w, mu, nu, out, h, n, k);
    if (mode == IN_PLACE) dx = xk;
    int bad = 0;
    for (size_t e = 0; e < k * n; ++e) bad += w[e] != wr[e] || mu[e] != mr[e] || nu[e] != vr[e];
    double err = 0, scale = 1e-30;
    for (size_t i = 0; mode != NONE && i < M * k; ++i) {
        err = std::max(err, std::fabs(dx[i] - dxr[i]));
        scale = std::max(scale, std::fabs(dxr[i]));
    }
    printf("M=%2d n=%3d k=%5zu fast=%d misalign=%d dx=%s: w/mu/nu mismatches %d, dx rel err "
           "%.2e\n",
           M, n, k, fast, misalign, mode == OWN ? "own" : mode == IN_PLACE ? "x" : "none", bad,
           err / scale);
    return bad == 0 && err / scale < 1e-5 ? 0 : 1;
}

// Every batch at the seed's 128 outputs (the last with TF32's step) and an odd count, then the
// edges: one output, k below a group, dx in place and not computed, misaligned arrays.
template <int M> int batch() {
    return check<M>(128, 700 + M, M % 2 == 0, 0) + check<M>(3 + 2 * M, 97, M % 2 == 1, M % 4);
}

int main() {
    int f = 0;
    f += batch<1>() + batch<2>() + batch<3>() + batch<4>() + batch<5>() + batch<6>() + batch<7>() +
         batch<8>() + batch<9>() + batch<10>() + batch<11>() + batch<12>() + batch<13>() +
         batch<14>() + batch<15>() + batch<16>();
    f += check<10>(128, 4001, true, 0);
    f += check<10>(128, 40, true, 0, IN_PLACE);
    f += check<10>(128, 40, false, 0, NONE);
    f += check<16>(1, 33, true, 1, IN_PLACE);
    f += check<1>(2, 1, false, 0);
    f += check<7>(100, 31, true, 2);
    f += check<3>(4, 5, true, 3, IN_PLACE);
    printf("%d failed\n", f);
    return f;
}

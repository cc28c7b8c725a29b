// benches/cuda/wgmma_conv.sh's harness for kernels/conv_wgmma.cu (3xTF32, full fp32): the
// forward pass (bias, ReLU, mask) and the backward-data pass (flipped kernel, mirrored padding)
// against an f64 reference of the f32 operands on 7 geometries, then both passes' times at the
// seed's conv2 (100 x 200 x 200 x 64 -> 64, SAME), median of 10 runs.
#include "../../kernels/common.cuh"
#include "harness.cuh"
#include "../../kernels/conv_wgmma.cu"
#include <cmath>
#include <random>

// y[p, co] (forward) or dx[p, ci] (data) in f64: out has g's output shape, in the input's.
// Forward: sum over (r, kx, ci) of in[oy + r - pt, ox + kx - pl, ci] w[r, kx, ci, co] + b[co];
// data: sum over (r, kx, co) of in[iy + pt - r, ix + pl - kx, co] w[r, kx, ci, co], with pt,
// pl the forward pass's padding (in = dy [n, oh, ow, 64], out = dx [n, h, w, 64]).
__global__ void reference(const float *in, const float *w, const float *b, size_t n, size_t ih,
                          size_t iw, size_t oh, size_t ow, long pt, long pl, int data,
                          double *out) {
    GRID_STRIDE(i, n * oh * ow * 64) {
        const int co = (int)(i & 63);
        const size_t p = i >> 6, ox = p % ow, oy = p / ow % oh, b0 = p / ow / oh;
        double s = b ? (double)b[co] : 0.0;
        for (int r = 0; r < 3; ++r)
            for (int kx = 0; kx < 3; ++kx) {
                const long iy = data ? (long)oy + pt - r : (long)oy + r - pt;
                const long ix = data ? (long)ox + pl - kx : (long)ox + kx - pl;
                if (iy < 0 || iy >= (long)ih || ix < 0 || ix >= (long)iw) continue;
                const float *v = in + ((b0 * ih + iy) * iw + ix) * 64;
                for (int c = 0; c < 64; ++c) {
                    const float wv = data ? w[((r * 3 + kx) * 64 + co) * 64 + c]
                                          : w[((r * 3 + kx) * 64 + c) * 64 + co];
                    s += (double)v[c] * wv;
                }
            }
        out[i] = s;
    }
}

struct Case {
    size_t n, h, w;
    long pt, pl, pb, pr;
};

// Runs one pass of the kernel: packs w (flip for data), launches on `in` with g.
static void pass(const float *in, const float *w, const float *b, float *out, u32 *mask,
                 u32 *packed, const WindowGeometry &g, int data, int sms) {
    conv_wgmma_pack<<<144, 256>>>(w, packed, data);
    const size_t tiles = (g.n * g.out_h * g.out_w + CW_TILE - 1) / CW_TILE;
    const int blocks = (int)std::min<size_t>(tiles, sms);
    conv_wgmma_3x3_c64_f32x3<<<blocks, CW_THREADS, CW_SMEM>>>(in, packed, b, out, mask, g,
                                                             data ? 0 : 1);
}

// Checks one geometry in both passes; whether both passed.
static bool check(const Case &c, int sms, std::mt19937 &rng) {
    std::uniform_real_distribution<float> U(-1.f, 1.f);
    const size_t oh = c.h + c.pt + c.pb - 2, ow = c.w + c.pl + c.pr - 2;
    const size_t xe = c.n * c.h * c.w * 64, ye = c.n * oh * ow * 64;
    std::vector<float> hx(xe), hy(ye), hw(9 * 64 * 64), hb(64);
    for (auto &v : hx) v = U(rng);
    for (auto &v : hy) v = U(rng);
    for (auto &v : hw) v = U(rng) * 0.1f;
    for (auto &v : hb) v = U(rng);
    float *x, *dy, *w, *b, *y, *dx;
    u32 *mask, *packed;
    double *ref;
    CK(cudaMalloc(&x, xe * 4)); CK(cudaMalloc(&dy, ye * 4)); CK(cudaMalloc(&y, ye * 4));
    CK(cudaMalloc(&dx, xe * 4)); CK(cudaMalloc(&w, hw.size() * 4)); CK(cudaMalloc(&b, 256));
    CK(cudaMalloc(&mask, ye / 8 + 4)); CK(cudaMalloc(&packed, 9 * 8192 * 4));
    CK(cudaMalloc(&ref, std::max(xe, ye) * 8));
    CK(cudaMemcpy(x, hx.data(), xe * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dy, hy.data(), ye * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(w, hw.data(), hw.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(b, hb.data(), 256, cudaMemcpyHostToDevice));
    bool all = true;
    for (int data = 0; data < 2; ++data) {
        const size_t oe = data ? xe : ye;
        WindowGeometry g = data
            ? WindowGeometry{c.n, oh, ow, 64, 3, 3, 1, 1, (size_t)(2 - c.pt), (size_t)(2 - c.pl),
                             c.h, c.w, 1, 1}
            : WindowGeometry{c.n, c.h, c.w, 64, 3, 3, 1, 1, (size_t)c.pt, (size_t)c.pl, oh, ow,
                             1, 1};
        float *out = data ? dx : y;
        CK(cudaMemset(out, 0xff, oe * 4)); // NaN: every output must be written
        CK(cudaMemset(mask, 0xa5, ye / 8 + 4));
        pass(data ? dy : x, w, data ? nullptr : b, out, data ? nullptr : mask, packed, g, data,
             sms);
        CK(cudaGetLastError());
        reference<<<1024, 256>>>(data ? dy : x, w, data ? nullptr : b, c.n,
                                 data ? oh : c.h, data ? ow : c.w, data ? c.h : oh,
                                 data ? c.w : ow, c.pt, c.pl, data, ref);
        CK(cudaDeviceSynchronize());
        std::vector<float> ho(oe);
        std::vector<double> hr(oe);
        std::vector<u32> hm(ye / 32);
        CK(cudaMemcpy(ho.data(), out, oe * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(hr.data(), ref, oe * 8, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(hm.data(), mask, ye / 8, cudaMemcpyDeviceToHost));
        double err = 0, mx = 0;
        size_t bad_mask = 0;
        for (size_t i = 0; i < oe; ++i) {
            const double want = data ? hr[i] : std::max(hr[i], 0.0);
            const double e = std::isfinite(ho[i]) ? fabs(ho[i] - want) : INFINITY;
            err = std::max(err, e), mx = std::max(mx, fabs(hr[i]));
            if (!data) bad_mask += ((hm[i >> 5] >> (i & 31)) & 1) != (ho[i] > 0.0f);
        }
        const bool ok = err <= 1e-5 * std::max(mx, 1.0) && bad_mask == 0;
        all &= ok;
        printf("%s n%zu h%zu w%zu pads %ld %ld %ld %ld: max err %.3e (max |ref| %.3e, %.2e of "
               "it), mask mismatches %zu: %s\n", data ? "data" : "fwd ", c.n, c.h, c.w, c.pt,
               c.pl, c.pb, c.pr, err, mx, err / std::max(mx, 1e-30), bad_mask,
               ok ? "ok" : "FAIL");
    }
    for (void *p : {(void *)x, (void *)dy, (void *)y, (void *)dx, (void *)w, (void *)b,
                    (void *)mask, (void *)packed, (void *)ref})
        cudaFree(p);
    return all;
}

int main(int argc, char **argv) {
    int sms;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    CK(cudaFuncSetAttribute(conv_wgmma_3x3_c64_f32x3,
                            cudaFuncAttributeMaxDynamicSharedMemorySize, CW_SMEM));
    const size_t seed_n = argc > 1 ? atoi(argv[1]) : 100;
    std::vector<Case> cases = {{2, 20, 20, 1, 1, 1, 1},  {1, 18, 37, 0, 0, 0, 0},
                               {3, 15, 15, 1, 1, 1, 1},  {1, 9, 130, 2, 2, 2, 2},
                               {2, 33, 64, 1, 0, 1, 2},  {1, 1, 200, 1, 1, 1, 1},
                               {2, 56, 56, 1, 1, 1, 1}};
    std::mt19937 rng(11);
    bool all = true;
    for (const Case &c : cases) all &= check(c, sms, rng);
    // the seed's conv2 at batch seed_n: forward with bias, ReLU and mask; backward data
    const size_t elems = seed_n * 200 * 200 * 64;
    float *x, *y, *w, *b;
    u32 *mask, *packed;
    CK(cudaMalloc(&x, elems * 4)); CK(cudaMalloc(&y, elems * 4)); CK(cudaMalloc(&w, 9 * 4096 * 4));
    CK(cudaMalloc(&b, 256)); CK(cudaMalloc(&mask, elems / 8));
    CK(cudaMalloc(&packed, 9 * 8192 * 4));
    fill<<<1024, 256>>>(x, elems, 1, 0, 1);
    fill<<<64, 256>>>(w, 9 * 4096, 3, -0.1f, 0.1f);
    fill<<<1, 64>>>(b, 64, 4, -0.1f, 0.1f);
    const WindowGeometry g{seed_n, 200, 200, 64, 3, 3, 1, 1, 1, 1, 200, 200, 1, 1};
    const double flop = 2.0 * elems * 576;
    for (int data = 0; data < 2; ++data) {
        auto t = timed_ms([&] { pass(x, w, data ? nullptr : b, y, data ? nullptr : mask, packed,
                                     g, data, sms); },
                          10, 2, [] {});
        printf("seed conv2 %s n=%zu: median %.3f ms (min %.3f, max %.3f), %.1f TFLOP/s of the "
               "convolution's\n", data ? "backward data" : "forward + bias + relu + mask",
               seed_n, t[t.size() / 2], t[0], t.back(), flop / (t[t.size() / 2] * 1e9));
    }
    printf(all ? "ALL OK\n" : "SOME FAILED\n");
    return all ? 0 : 1;
}

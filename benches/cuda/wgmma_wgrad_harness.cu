// benches/cuda/wgmma_wgrad.sh's harness, for each kernel of kernels/wgrad_wgmma.cu (TF32:
// wgmma_wgrad_3x3_c64_f32; 3xTF32: wgmma_wgrad_3x3_c64_f32x3): against an f64 reference on 8
// geometries (of TF32-rounded operands for TF32, of the f32 operands for 3xTF32), its time at
// the seed's conv2 (100 x 200 x 200 x 64, with a ReLU mask, dy written back or not), and the
// time of its products alone (tst).
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <vector>
#include <random>
#include <cuda_runtime.h>
#include "../../kernels/common.cuh"
#include "../../kernels/wgrad_wgmma.cu"

#define CK(e) do { cudaError_t r = (e); if (r != cudaSuccess) { \
  printf("CUDA %s at %d: %s\n", #e, __LINE__, cudaGetErrorString(r)); exit(1);} } while (0)

__device__ double rt(float v) { return (double)__uint_as_float(tf32_bits(v)); }

// rt: operands rounded to TF32 (else exact f32)
__global__ void ref_kernel(const float *x, const float *dy, const u32 *mask, WindowGeometry g,
                           double *ref, int round) {
  int o = blockIdx.x * blockDim.x + threadIdx.x;
  if (o >= 577 * 64) return;
  int k = o / 64, co = o % 64;
  double s = 0;
  for (size_t n = 0; n < g.n; ++n)
    for (size_t oy = 0; oy < g.out_h; ++oy)
      for (size_t ox = 0; ox < g.out_w; ++ox) {
        size_t pos = (n * g.out_h + oy) * g.out_w + ox;
        size_t e = pos * 64 + co;
        float d = dy[e];
        if (mask && !((mask[e >> 5] >> (e & 31)) & 1)) d = 0.0f;
        if (k == 576) { s += d; continue; }
        int tap = k / 64, ci = k % 64, ky = tap / 3, kx = tap % 3;
        long iy = (long)oy + ky - (long)g.pad_top, ix = (long)ox + kx - (long)g.pad_left;
        if (iy < 0 || iy >= (long)g.h || ix < 0 || ix >= (long)g.w) continue;
        const float v = x[((n * g.h + iy) * g.w + ix) * 64 + ci];
        s += round ? rt(d) * rt(v) : (double)d * v;
      }
  ref[o] = s;
}

__global__ void finish(const double *partial, int blocks, double *out) {
  int o = blockIdx.x * blockDim.x + threadIdx.x;
  if (o >= 577 * 64) return;
  double s = 0;
  for (int b = 0; b < blocks; ++b) s += partial[(size_t)b * 577 * 64 + o];
  out[o] = s;
}

template <int X3>
__global__ void __launch_bounds__(WG_THREADS, 1) tst(double *partial, int ks, int iters) {
  using S = WgSizes<X3>;
  extern __shared__ __align__(128) unsigned char smem[];
  const u32 xs = (u32)__cvta_generic_to_shared(smem), ds = xs + WG_XSLOTS * S::xslot;
  const int r = threadIdx.x >> 7;
  float d[96];
  for (int i = 0; i < 96; ++i) d[i] = 0.0f;
  for (int j = threadIdx.x; j < S::smem / 4; j += WG_THREADS) ((float *)smem)[j] = 0.0f;
  wg_fence_async();
  __syncthreads();
  for (int u = 0; u < iters; ++u) {
    wg_products<X3>(d, ds + u % WG_DSLOTS * S::dslot, xs + (u + r) % WG_XSLOTS * S::xslot, ks);
    wg_wait_prev();
    __syncthreads();
  }
  wg_wait_all(d);
  float db[4] = {0, 0, 0, 0};
  wg_partials(d, db, partial + (size_t)blockIdx.x * 577 * 64, smem);
}

// wgmma_tile_width of crates/stax-tensor/src/cuda/kernels/direct.rs
int pick_tw(int ow, int most) {
  int best = 0, bc = 1 << 30;
  for (int nt = (ow + 8 * most - 1) / (8 * most), n0 = nt; nt <= n0 + 4; ++nt) {
    int tw = (ow + nt - 1) / nt, q = (tw + 3) / 4, ks = (q + 1) / 2;
    if (ks > most) continue;
    if (nt * ks < bc) bc = nt * ks, best = tw;
  }
  return best;
}

struct Case { size_t n, h, w, pad; };

// The kernel of arithmetic X3: checks, then times; whether every check passed.
template <int X3> bool run(int sms, size_t seed_n) {
  using S = WgSizes<X3>;
  const char *name = X3 ? "3xTF32" : "TF32";
  auto kernel = X3 ? wgmma_wgrad_3x3_c64_f32x3 : wgmma_wgrad_3x3_c64_f32;
  const int smem = S::smem;
  CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  std::vector<Case> cases = {{2, 9, 40, 1}, {1, 7, 61, 1}, {3, 5, 13, 0}, {2, 12, 200, 1},
                             {1, 1, 1, 1}, {2, 56, 56, 1}, {1, 4, 97, 0}, {2, 6, 5, 1}};
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> U(-1.f, 1.f);
  bool all = true;
  for (auto c : cases) {
    WindowGeometry g{c.n, c.h, c.w, 64, 3, 3, 1, 1, c.pad, c.pad, c.h + 2 * c.pad - 2,
                     c.w + 2 * c.pad - 2, 1, 1};
    size_t xe = c.n * c.h * c.w * 64, de = g.n * g.out_h * g.out_w * 64, mw = (de + 31) / 32;
    std::vector<float> hx(xe), hd(de);
    std::vector<u32> hm(mw);
    for (auto &v : hx) v = U(rng);
    for (auto &v : hd) v = U(rng);
    for (auto &v : hm) v = rng();
    float *x, *dy, *dy0; u32 *mask; double *part, *out, *ref;
    int tw = pick_tw((int)g.out_w, S::ksteps);
    int strips = ((int)g.out_w + tw - 1) / tw;
    size_t units = g.n * g.out_h * strips;
    int blocks = (int)std::min<size_t>(units, sms);
    CK(cudaMalloc(&x, xe * 4)); CK(cudaMalloc(&dy, de * 4)); CK(cudaMalloc(&dy0, de * 4));
    CK(cudaMalloc(&mask, mw * 4)); CK(cudaMalloc(&part, (size_t)blocks * 577 * 64 * 8));
    CK(cudaMalloc(&out, 577 * 64 * 8)); CK(cudaMalloc(&ref, 577 * 64 * 8));
    CK(cudaMemcpy(x, hx.data(), xe * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dy, hd.data(), de * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dy0, hd.data(), de * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(mask, hm.data(), mw * 4, cudaMemcpyHostToDevice));
    ref_kernel<<<(577 * 64 + 127) / 128, 128>>>(x, dy0, mask, g, ref, !X3);
    kernel<<<blocks, WG_THREADS, smem>>>(x, dy, mask, 1, part, g, tw);
    CK(cudaGetLastError());
    finish<<<(577 * 64 + 127) / 128, 128>>>(part, blocks, out);
    CK(cudaDeviceSynchronize());
    std::vector<double> ho(577 * 64), hr(577 * 64);
    std::vector<float> hdy(de);
    CK(cudaMemcpy(ho.data(), out, 577 * 64 * 8, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hr.data(), ref, 577 * 64 * 8, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hdy.data(), dy, de * 4, cudaMemcpyDeviceToHost));
    double err = 0, mx = 0, dberr = 0;
    for (int i = 0; i < 576 * 64; ++i) {
      err = fmax(err, fabs(ho[i] - hr[i])), mx = fmax(mx, fabs(hr[i]));
    }
    for (int i = 576 * 64; i < 577 * 64; ++i) {
      dberr = fmax(dberr, fabs(ho[i] - hr[i]) / (1 + fabs(hr[i])));
    }
    size_t bad = 0;
    for (size_t e = 0; e < de; ++e) {
      float want = ((hm[e >> 5] >> (e & 31)) & 1) ? hd[e] : 0.0f;
      bad += hdy[e] != want;
    }
    bool ok = err <= (X3 ? 1e-5 : 1e-4) * fmax(mx, 1.0) && dberr < 1e-5 && bad == 0;
    all &= ok;
    printf("%s case n%zu h%zu w%zu pad%zu tw%d blocks%d: max err %.3e (max |ref| %.3e), db err %.3e, "
           "dy mismatches %zu: %s\n", name, c.n, c.h, c.w, c.pad, tw, blocks, err, mx, dberr, bad,
           ok ? "ok" : "FAIL");
    cudaFree(x); cudaFree(dy); cudaFree(dy0); cudaFree(mask); cudaFree(part); cudaFree(out);
    cudaFree(ref);
  }
  // timing at the seed's conv2
  {
    size_t n = seed_n;
    WindowGeometry g{n, 200, 200, 64, 3, 3, 1, 1, 1, 1, 200, 200, 1, 1};
    size_t e = n * 200 * 200 * 64;
    float *x, *dy; u32 *mask; double *part;
    int tw = pick_tw(200, S::ksteps);
    int blocks = sms;
    CK(cudaMalloc(&x, e * 4)); CK(cudaMalloc(&dy, e * 4)); CK(cudaMalloc(&mask, e / 8));
    CK(cudaMalloc(&part, (size_t)blocks * 577 * 64 * 8));
    CK(cudaMemset(x, 0x3c, e * 4)); CK(cudaMemset(dy, 0x3c, e * 4));
    CK(cudaMemset(mask, 0x5a, e / 8));
    cudaEvent_t a, b;
    cudaEventCreate(&a); cudaEventCreate(&b);
    for (int keep = 1; keep >= 0; --keep) {
      for (int rep = 0; rep < 3; ++rep) {
        kernel<<<blocks, WG_THREADS, smem>>>(x, dy, mask, keep, part, g, tw);
        CK(cudaEventRecord(a));
        for (int i = 0; i < 10; ++i)
          kernel<<<blocks, WG_THREADS, smem>>>(x, dy, mask, keep, part, g, tw);
        CK(cudaEventRecord(b));
        CK(cudaEventSynchronize(b));
        float ms;
        cudaEventElapsedTime(&ms, a, b);
        printf("%s seed conv2 wgrad n=%zu tw=%d keep=%d: %.3f ms a run (%.1f TFLOP/s)\n", name, n,
               tw, keep, ms / 10,
               2.0 * n * 200 * 200 * 64 * 576 / (ms / 10 * 1e9));
      }
    }
  }
  {
    CK(cudaFuncSetAttribute(tst<X3>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    double *part;
    CK(cudaMalloc(&part, (size_t)sms * 577 * 64 * 8));
    cudaEvent_t a, b;
    cudaEventCreate(&a); cudaEventCreate(&b);
    for (int rep = 0; rep < 2; ++rep) {
      tst<X3><<<sms, WG_THREADS, smem>>>(part, S::ksteps, 758);
      CK(cudaEventRecord(a));
      tst<X3><<<sms, WG_THREADS, smem>>>(part, S::ksteps, 758);
      CK(cudaEventRecord(b));
      CK(cudaEventSynchronize(b));
      float ms;
      cudaEventElapsedTime(&ms, a, b);
      printf("%s products only (SBO %d), 758 tiles of %d k-steps a block: %.3f ms (%.1f TFLOP/s "
             "of the convolution's)\n", name, WG_SBO, S::ksteps, ms,
             2.0 * sms * 758 * S::ksteps * 3 * 64 * 192 * 8 / (ms * 1e9));
    }
  }
  return all;
}

int main(int argc, char **argv) {
  int sms;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const size_t n = argc > 1 ? atoi(argv[1]) : 100;
  const bool all = run<0>(sms, n) & run<1>(sms, n);
  printf(all ? "ALL OK\n" : "SOME FAILED\n");
  return all ? 0 : 1;
}

// layout.cu: layout changes for cuDNN. Our kernels are stored HWIO, OIHW or as a transposed
// conv's kernel; cuDNN's filter layout is KRSC = OHWI [co, kh, kw, ci] for NHWC tensors and
// KCRS = OIHW for NCHW ones. cuDNN needs symmetric padding, so asymmetric cases are computed on
// an input embedded in a larger zero-padded buffer (an NCHW tensor [n, c, h, w] is padded as
// the NHWC tensor [n * c, h, w, 1]); a bf16 or f16 NHWC input's channels are padded with zeros
// to a multiple of 8 the same way (and its kernel's), as cuDNN's tensor-core kernels need.

// Where kernel tap (ky, kx, c, o) of a (kh, kw, ci, co) kernel is stored, by layout (the codes
// of FilterLayout::code in crates/stax-tensor/src/geometry/layout.rs, plus cuDNN's NHWC
// filter layout KRSC = OHWI).
#define FILTER_HWIO 0
#define FILTER_OIHW 1
#define FILTER_T_HWIO 2 // a transposed conv's HWIO kernel: [kh, kw, co, ci], flipped
#define FILTER_T_OIHW 3 // a transposed conv's OIHW kernel: [ci, co, kh, kw], flipped
#define FILTER_OHWI 4

__device__ size_t filter_index(int layout, size_t kh, size_t kw, size_t ci, size_t co, size_t ky,
                               size_t kx, size_t c, size_t o) {
    size_t fy = kh - 1 - ky, fx = kw - 1 - kx;
    switch (layout) {
    case FILTER_HWIO: return ((ky * kw + kx) * ci + c) * co + o;
    case FILTER_OIHW: return ((o * ci + c) * kh + ky) * kw + kx;
    case FILTER_T_HWIO: return ((fy * kw + fx) * co + o) * ci + c;
    case FILTER_T_OIHW: return ((c * co + o) * kh + fy) * kw + fx;
    default: return ((o * kh + ky) * kw + kx) * ci + c;
    }
}

// dst (layout `to`, ci_to input channels) = src (layout `from`, ci_from input channels), the
// taps of a (kh, kw, ci, co) kernel; one thread per tap. With ci_to > ci (cuDNN's kernel of a
// channel-padded input) the padded taps are not written; with ci_from > ci they are not read.
template <typename T>
__device__ void filter_permute_impl(const T *src, T *dst, size_t kh, size_t kw, size_t ci,
                                    size_t co, int from, int to, size_t ci_from, size_t ci_to) {
    size_t n = kh * kw * ci * co;
    GRID_STRIDE(i, n) {  // i enumerates the taps in HWIO order
        size_t o = i % co, c = (i / co) % ci, kx = (i / (co * ci)) % kw, ky = i / (co * ci * kw);
        dst[filter_index(to, kh, kw, ci_to, co, ky, kx, c, o)] =
            src[filter_index(from, kh, kw, ci_from, co, ky, kx, c, o)];
    }
}

// dst [cols, rows] = src [rows, cols] transposed: a kernel between HWIO ([kh kw ci, co]) and
// OHWI ([co, kh kw ci]) without padded channels, through 32 x 32 tiles of shared memory, so
// that each warp reads and writes 32 consecutive elements (filter_permute writes with a stride
// and divides per element). Blocks of 32 x 8 threads, a grid-stride loop over the tiles.
template <typename T>
__device__ void filter_transpose_impl(const T *src, T *dst, size_t rows, size_t cols) {
    __shared__ T tile[32][33];
    size_t tc = (cols + 31) / 32, tiles = tc * ((rows + 31) / 32);
    for (size_t t = blockIdx.x; t < tiles; t += gridDim.x) {
        size_t r0 = t / tc * 32, c0 = t % tc * 32;
        for (unsigned k = threadIdx.y; k < 32; k += 8) {
            size_t r = r0 + k, c = c0 + threadIdx.x;
            if (r < rows && c < cols) tile[k][threadIdx.x] = src[r * cols + c];
        }
        __syncthreads();
        for (unsigned k = threadIdx.y; k < 32; k += 8) {
            size_t c = c0 + k, r = r0 + threadIdx.x;
            if (r < rows && c < cols) dst[c * rows + r] = tile[threadIdx.x][k];
        }
        __syncthreads();
    }
}

// dst NHWC [nb, hd, wd, cd] = src NHWC [nb, hs, ws, cs] placed at row top, column left and
// channel 0; zeros elsewhere (hd >= top + hs, wd >= left + ws, cd >= cs: spatial padding and
// channels padded for cuDNN's tensor cores).
// One thread per destination pixel (its position divided out once, in I: 32-bit when the
// pixels fit in 2^31); a pixel of 16 bytes (8 channels of bf16 or f16: cuDNN's channel
// padding) gathered in registers and stored at once. src and dst never overlap.
template <typename T, typename I>
__device__ void pad_nhwc_loop(const T *__restrict__ src, T *__restrict__ dst, I nb, I hs, I ws,
                              I cs, I hd, I wd, I cd, I top, I left) {
    const int lanes = 16 / sizeof(T);
    bool vec = cd == lanes && ((size_t)dst & 15) == 0;
    for (I i = blockIdx.x * blockDim.x + threadIdx.x; i < nb * hd * wd;
         i += blockDim.x * gridDim.x) {
        I x = i % wd, r = i / wd, y = r % hd, b = r / hd;
        bool in = y >= top && y < top + hs && x >= left && x < left + ws;
        size_t pixel = ((size_t)b * hs + (in ? y - top : 0)) * ws + (in ? x - left : 0);
        const T *from = src + pixel * cs;
        T *to = dst + (size_t)i * cd;
        if (vec) {
            union {
                uint4 u;
                T e[lanes];
            } v;
#pragma unroll
            for (int ch = 0; ch < lanes; ++ch) {
                v.e[ch] = in && ch < cs ? from[ch] : from_f32<T>(0.0f);
            }
            *(uint4 *)to = v.u;
        } else {
            for (I ch = 0; ch < cd; ++ch) to[ch] = in && ch < cs ? from[ch] : from_f32<T>(0.0f);
        }
    }
}

template <typename T>
__device__ void pad_nhwc_impl(const T *src, T *dst, size_t nb, size_t hs, size_t ws, size_t cs,
                              size_t hd, size_t wd, size_t cd, size_t top, size_t left) {
    if (nb * hd * wd <= (1u << 31)) {
        pad_nhwc_loop<T, unsigned>(src, dst, nb, hs, ws, cs, hd, wd, cd, top, left);
    } else {
        pad_nhwc_loop<T, size_t>(src, dst, nb, hs, ws, cs, hd, wd, cd, top, left);
    }
}

// dst NHWC [nb, hd, wd, cd] = the window of src NHWC [nb, hs, ws, cs] at row top, column left
// and its first cd channels.
template <typename T>
__device__ void crop_nhwc_impl(const T *src, T *dst, size_t nb, size_t hs, size_t ws, size_t cs,
                               size_t hd, size_t wd, size_t cd, size_t top, size_t left) {
    size_t n = nb * hd * wd;
    GRID_STRIDE(i, n) {  // one thread per destination pixel, as pad_nhwc
        size_t x = i % wd, y = (i / wd) % hd, b = i / (wd * hd);
        const T *from = src + ((b * hs + (y + top)) * ws + (x + left)) * cs;
        for (size_t ch = 0; ch < cd; ++ch) dst[i * cd + ch] = from[ch];
    }
}

// The im2col matrix of an NHWC convolution, rows p0 .. p0 + rows of it: col[r, k] for r < rows
// and k < kp = the input value under tap k = (ky * kw + kx) * c + ch (HWIO's order) at output
// position p0 + r = (b, oy, ox), 0 in the padding and for k >= kh * kw * c (columns padded to
// kp, a multiple of 8, for aligned GEMM rows). One thread per 8 consecutive columns of a row
// (the row's position divided out once, the taps advanced without division), stored as one
// 16-byte write for 16-bit T; 32-bit index math (positions below 2^31).
template <typename T>
__device__ void im2col_nhwc_impl(const T *x, T *col, WindowGeometry g, size_t p0, size_t rows,
                                 size_t kp) {
    unsigned h = g.h, w = g.w, c = g.c, kw = g.kw, oh = g.out_h, ow = g.out_w;
    unsigned taps = g.kh * kw * c, groups = (unsigned)(kp / 8);
    GRID_STRIDE(i, rows * groups) {
        unsigned r = (unsigned)(i / groups), k = (unsigned)(i % groups) * 8;
        unsigned p = (unsigned)p0 + r, ox = p % ow, oy = (p / ow) % oh, b = p / (ow * oh);
        unsigned ch = k % c, t = k / c, kx = t % kw, ky = t / kw;
        T v[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            v[e] = from_f32<T>(0.0f);
            if (k + e < taps) {
                int iy = (int)(oy * g.sh + ky * g.dh) - (int)g.pad_top;
                int ix = (int)(ox * g.sw + kx * g.dw) - (int)g.pad_left;
                if (iy >= 0 && iy < (int)h && ix >= 0 && ix < (int)w) {
                    v[e] = x[(((size_t)b * h + iy) * w + ix) * c + ch];
                }
            }
            if (++ch == c) {
                ch = 0;
                if (++kx == kw) kx = 0, ++ky;
            }
        }
        T *out = col + (size_t)r * kp + k;
#pragma unroll
        for (int e = 0; e < 8; ++e) out[e] = v[e];
    }
}

// The three layout kernels in element type T, named <op>_<suffix>: elements are copied, never
// converted, so every float dtype moves bit for bit.
#define LAYOUT_KERNELS(T, S)                                                                   \
    extern "C" __global__ void filter_permute_##S(const T *src, T *dst, size_t kh, size_t kw,  \
                                                  size_t ci, size_t co, int from, int to,      \
                                                  size_t ci_from, size_t ci_to) {              \
        filter_permute_impl<T>(src, dst, kh, kw, ci, co, from, to, ci_from, ci_to);            \
    }                                                                                          \
    extern "C" __global__ void filter_transpose_##S(const T *src, T *dst, size_t rows,         \
                                                    size_t cols) {                             \
        filter_transpose_impl<T>(src, dst, rows, cols);                                        \
    }                                                                                          \
    extern "C" __global__ void pad_nhwc_##S(const T *src, T *dst, size_t nb, size_t hs,        \
                                            size_t ws, size_t cs, size_t hd, size_t wd,        \
                                            size_t cd, size_t top, size_t left) {              \
        pad_nhwc_impl<T>(src, dst, nb, hs, ws, cs, hd, wd, cd, top, left);                     \
    }                                                                                          \
    extern "C" __global__ void crop_nhwc_##S(const T *src, T *dst, size_t nb, size_t hs,       \
                                             size_t ws, size_t cs, size_t hd, size_t wd,       \
                                             size_t cd, size_t top, size_t left) {             \
        crop_nhwc_impl<T>(src, dst, nb, hs, ws, cs, hd, wd, cd, top, left);                    \
    }                                                                                          \
    extern "C" __global__ void im2col_nhwc_##S(const T *x, T *col, WindowGeometry g,           \
                                               size_t p0, size_t rows, size_t kp) {            \
        im2col_nhwc_impl<T>(x, col, g, p0, rows, kp);                                          \
    }
FOR_FLOATS(LAYOUT_KERNELS)

// Block copy between row-major matrices of 32-bit (u32) or 16-bit (u16) words: dst[r *
// dst_pitch + dst_off + j] = src[r * src_pitch + src_off + j] for r < rows, j < width (pitches
// and offsets in words). A concatenation along an axis copies each input this way into its
// column block of the output, and a split the reverse.
#define COPY_BLOCK(T, S)                                                                       \
    extern "C" __global__ void copy_block_##S(const T *src, T *dst, size_t rows, size_t width,  \
                                              size_t src_pitch, size_t src_off,                 \
                                              size_t dst_pitch, size_t dst_off) {               \
        size_t n = rows * width;                                                               \
        GRID_STRIDE(i, n) {                                                                    \
            size_t r = i / width, j = i % width;                                               \
            dst[r * dst_pitch + dst_off + j] = src[r * src_pitch + src_off + j];               \
        }                                                                                      \
    }
COPY_BLOCK(u32, u32)
COPY_BLOCK(unsigned short, u16)

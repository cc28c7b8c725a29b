// layout.cu: layout changes for cuDNN. Our conv kernels are HWIO [kh, kw, ci, co]; cuDNN's
// NHWC filter layout is KRSC = OHWI [co, kh, kw, ci]. cuDNN needs symmetric padding, so
// asymmetric cases are computed on an input embedded in a larger zero-padded buffer.

// dst OHWI [co, kh, kw, ci] from src HWIO [kh, kw, ci, co]; n = kh*kw*ci*co.
extern "C" __global__ void hwio_to_ohwi_f32(const float *src, float *dst, size_t hw, size_t ci,
                                            size_t co) {
    size_t n = hw * ci * co;
    GRID_STRIDE(i, n) {  // i indexes dst
        size_t c = i % ci;
        size_t s = (i / ci) % hw;
        size_t o = i / (ci * hw);
        dst[i] = src[(s * ci + c) * co + o];
    }
}

// dst HWIO [kh, kw, ci, co] from src OHWI [co, kh, kw, ci].
extern "C" __global__ void ohwi_to_hwio_f32(const float *src, float *dst, size_t hw, size_t ci,
                                            size_t co) {
    size_t n = hw * ci * co;
    GRID_STRIDE(i, n) {  // i indexes dst
        size_t o = i % co;
        size_t c = (i / co) % ci;
        size_t s = i / (co * ci);
        dst[i] = src[(o * hw + s) * ci + c];
    }
}

// dst NHWC [nb, hd, wd, c] = src NHWC [nb, hs, ws, c] placed at row top, column left; zeros
// elsewhere (hd >= top + hs, wd >= left + ws).
extern "C" __global__ void pad_nhwc_f32(const float *src, float *dst, size_t nb, size_t hs,
                                        size_t ws, size_t c, size_t hd, size_t wd, size_t top,
                                        size_t left) {
    size_t n = nb * hd * wd * c;
    GRID_STRIDE(i, n) {
        size_t ch = i % c;
        size_t x = (i / c) % wd;
        size_t y = (i / (c * wd)) % hd;
        size_t b = i / (c * wd * hd);
        float v = 0.0f;
        if (y >= top && y < top + hs && x >= left && x < left + ws) {
            v = src[((b * hs + (y - top)) * ws + (x - left)) * c + ch];
        }
        dst[i] = v;
    }
}

// dst NHWC [nb, hd, wd, c] = the window of src NHWC [nb, hs, ws, c] at row top, column left.
extern "C" __global__ void crop_nhwc_f32(const float *src, float *dst, size_t nb, size_t hs,
                                         size_t ws, size_t c, size_t hd, size_t wd, size_t top,
                                         size_t left) {
    size_t n = nb * hd * wd * c;
    GRID_STRIDE(i, n) {
        size_t ch = i % c;
        size_t x = (i / c) % wd;
        size_t y = (i / (c * wd)) % hd;
        size_t b = i / (c * wd * hd);
        dst[i] = src[((b * hs + (y + top)) * ws + (x + left)) * c + ch];
    }
}

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

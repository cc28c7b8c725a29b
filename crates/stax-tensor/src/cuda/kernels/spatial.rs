//! Launchers of the spatial and update kernels: filter permutations and padding copies around
//! cuDNN, pooling, softmax cross-entropy and Adam.

use super::{Kernels, aligned16, driver};
use crate::{AdamHyper, Conv2dGeometry, DType, PoolKind, TensorError};
use cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};

/// `kernels/layout.cu`'s code of cuDNN's NHWC filter layout KRSC = OHWI `[co, kh, kw, ci]`.
pub(crate) const OHWI: i32 = 4;

/// A pooling's or an im2col's window as `kernels/common.cuh`'s `struct WindowGeometry`
/// (fourteen `size_t`).
#[derive(Debug, Clone, Copy)]
#[repr(C)]
pub(crate) struct WindowGeometry {
    n: usize,
    h: usize,
    w: usize,
    c: usize,
    kh: usize,
    kw: usize,
    sh: usize,
    sw: usize,
    pad_top: usize,
    pad_left: usize,
    out_h: usize,
    out_w: usize,
    dh: usize,
    dw: usize,
}

// SAFETY: `WindowGeometry` is `#[repr(C)]` with fourteen usize (size_t on the 64-bit targets
// CUDA supports) in the order of `struct WindowGeometry` in kernels/common.cuh, and holds no
// pointers.
unsafe impl DeviceRepr for WindowGeometry {}

impl WindowGeometry {
    /// `g`'s window, input channels as the image's.
    pub(super) fn of(g: &Conv2dGeometry) -> WindowGeometry {
        WindowGeometry {
            n: g.n,
            h: g.h,
            w: g.w,
            c: g.c_in,
            kh: g.kh,
            kw: g.kw,
            sh: g.stride_h,
            sw: g.stride_w,
            pad_top: g.pad_top,
            pad_left: g.pad_left,
            out_h: g.out_h,
            out_w: g.out_w,
            dh: g.dilation_h,
            dw: g.dilation_w,
        }
    }

    /// The backward-data pass of `g` (stride 1, undilated, `pad_top < kh`, `pad_left < kw`) as
    /// a forward pass over dy: dy's rows to dx's, padded by `k - 1 - pad` at the top and left,
    /// the kernel flipped in both axes (the caller's).
    pub(super) fn transposed(g: &Conv2dGeometry) -> WindowGeometry {
        WindowGeometry {
            h: g.out_h,
            w: g.out_w,
            c: g.c_out,
            pad_top: g.kh - 1 - g.pad_top,
            pad_left: g.kw - 1 - g.pad_left,
            out_h: g.h,
            out_w: g.w,
            ..WindowGeometry::of(g)
        }
    }
}

impl Kernels {
    /// Softmax cross-entropy of `[n, k]` logits and labels: writes `dlogits` and the mean loss
    /// (one f32) to `loss`, through `row_loss`, a workspace of `n` doubles.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn softmax_xent(
        &self,
        logits: u64,
        labels: u64,
        dlogits: u64,
        row_loss: u64,
        loss: u64,
        n: usize,
        k: usize,
    ) -> Result<(), TensorError> {
        let kern = "softmax_xent_f32";
        // One warp per row.
        // SAFETY: `softmax_xent_f32(const float *logits, const float *labels, float *dlogits,
        // double *row_loss, size_t n, size_t k)`; the three matrices hold n*k floats,
        // row_loss n doubles; blocks are whole warps.
        unsafe { launch!(self.stream, self.function(kern)?, self.grid(n.saturating_mul(32)); &logits, &labels, &dlogits, &row_loss, &n, &k) }
        .map_err(driver(kern))?;
        self.mean_f64(row_loss, loss, n)
    }

    /// `out[0] = sum(v) / n` as one f32, for `n` doubles at `v` (a loss' row losses).
    pub(crate) fn mean_f64(&self, v: u64, out: u64, n: usize) -> Result<(), TensorError> {
        let kern = "mean_f64_to_f32";
        let cfg = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: `mean_f64_to_f32(const double *v, float *out, size_t n)`; v holds n doubles,
        // out one float; one block of 256 threads (8 warps, the size of its shared array).
        unsafe { launch!(self.stream, self.function(kern)?, cfg; &v, &out, &n).map(drop) }
            .map_err(driver(kern))
    }

    /// One Adam step over `n` elements of p, v (f32), g (`g_dtype`) and m (`m_dtype`, optax's
    /// `mu_dtype`).
    pub(crate) fn adam(
        &self,
        p: u64,
        (g, g_dtype): (u64, DType),
        (m, m_dtype): (u64, DType),
        v: u64,
        h: &AdamHyper,
        n: usize,
    ) -> Result<(), TensorError> {
        if n == 0 {
            return Ok(());
        }
        let plain = g_dtype == DType::F32 && m_dtype == DType::F32;
        let (f, k, threads) = if plain && aligned16(&[p, g, m, v]) {
            let k = "adam_vec_f32";
            (self.function(k)?, k, (n / 4).max(n % 4))
        } else {
            let root = match m_dtype {
                DType::BF16 => "adam_mu_bf16",
                DType::F16 => "adam_mu_f16",
                _ => "adam",
            };
            (self.typed(root, g_dtype)?, root, n)
        };
        // SAFETY: `adam_<g dtype>(float *p, const G *g, float *m, float *v, AdamHyper h,
        // size_t n)`, `adam_mu_<m dtype>_<g dtype>` (the same with `M *m`) / `adam_vec_f32`
        // (f32 g and m); p, v hold n floats, g n elements of `g_dtype` and m n of `m_dtype`
        // (the front end checked both float dtypes; 16-byte aligned for the vector kernel,
        // whose grid has at least n % 4 threads in block 0 for the tail); AdamHyper's layout
        // matches (see the DeviceRepr impl above).
        unsafe { launch!(self.stream, f, self.grid(threads); &p, &g, &m, &v, h, &n).map(drop) }
            .map_err(driver(k))
    }

    /// One Adam step over `n` elements of `[p, g, m, v]` (a dense weight's f32 chunk, its
    /// gradient in `dtype`, bf16 or f16, and its f32 moments) that also writes the old `p`,
    /// rounded to `dtype`, to the `n` elements at `old` (0: not written).
    pub(crate) fn adam_old(
        &self,
        [p, g, m, v]: [u64; 4],
        (old, dtype): (u64, DType),
        h: &AdamHyper,
        n: usize,
    ) -> Result<(), TensorError> {
        if n == 0 {
            return Ok(());
        }
        let vector = aligned16(&[p, g, m, v]) && old % 8 == 0;
        let (root, threads) = match vector {
            true => ("adam_old_vec", (n / 4).max(n % 4)),
            false => ("adam_old", n),
        };
        let f = self.typed(root, dtype)?;
        // SAFETY: `adam_old[_vec]_<dtype>(float *p, const T *g, float *m, float *v, T *old,
        // AdamHyper h, size_t n)`, loaded for bf16 and f16 only (another dtype is refused by
        // `typed`); p, m, v hold n floats, g n 16-bit elements and old (null or) n of them;
        // the vector kernel gets 16-byte aligned p, g, m, v and an 8-byte aligned old, and a
        // grid with at least n % 4 threads in block 0 for the tail; AdamHyper's layout
        // matches.
        unsafe {
            launch!(self.stream, f, self.grid(threads); &p, &g, &m, &v, &old, h, &n).map(drop)
        }
        .map_err(driver(root))
    }

    /// Sets the u32 at `flag` to 1 when one of the `n` elements of `dtype` at `x` is NaN or
    /// infinite.
    pub(crate) fn all_finite(
        &self,
        (x, dtype): (u64, DType),
        flag: u64,
        n: usize,
    ) -> Result<(), TensorError> {
        if n == 0 {
            return Ok(());
        }
        let f = self.typed("all_finite", dtype)?;
        // SAFETY: `all_finite_<dtype>(const T *x, unsigned *nonfinite, size_t n)`; x holds n
        // elements of `dtype` (a float dtype, checked by the front end), flag one u32.
        unsafe { launch!(self.stream, f, self.grid(n); &x, &flag, &n).map(drop) }
            .map_err(driver("all_finite"))
    }

    /// A `(kh, kw, ci, co)` kernel copied from layout `from` to layout `to` (the codes of
    /// `kernels/layout.cu`'s `filter_index`: [`crate::FilterLayout::code`], and
    /// [`OHWI`] for cuDNN's NHWC filters), elements of `dtype` moved bit for bit.
    /// `(ci_from, ci_to)`: the input channels each layout is stored with (at least `ci`; more
    /// for cuDNN's kernel of a channel-padded input, whose padded taps are neither read nor
    /// written).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn permute_filter(
        &self,
        dtype: DType,
        (src, dst): (u64, u64),
        (kh, kw, ci, co): (usize, usize, usize, usize),
        (from, to): (i32, i32),
        (ci_from, ci_to): (usize, usize),
    ) -> Result<(), TensorError> {
        let n = kh * kw * ci * co;
        if n == 0 {
            return Ok(());
        }
        // HWIO and OHWI without padded channels: a transpose of [kh kw ci, co]
        let (hwio, taps) = (crate::FilterLayout::Hwio.code(), kh * kw * ci);
        let transpose = match (from, to) {
            _ if (ci_from, ci_to) != (ci, ci) => None,
            _ if (from, to) == (hwio, OHWI) => Some((taps, co)),
            _ if (from, to) == (OHWI, hwio) => Some((co, taps)),
            _ => None,
        };
        if let Some((rows, cols)) = transpose {
            let (f, k) = (self.typed("filter_transpose", dtype)?, "filter_transpose");
            let tiles = rows.div_ceil(32) * cols.div_ceil(32);
            let cfg = LaunchConfig {
                grid_dim: (tiles.min(self.max_blocks as usize) as u32, 1, 1),
                block_dim: (32, 8, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: `filter_transpose_<dtype>(const T *src, T *dst, size_t rows, size_t
            // cols)`; src and dst hold rows*cols = n elements of `dtype` each (no padded
            // channels), distinct buffers; blocks of 32 x 8 threads, as the kernel's tiles need.
            return unsafe { launch!(self.stream, f, cfg; &src, &dst, &rows, &cols).map(drop) }
                .map_err(driver(k));
        }
        let (f, k) = (self.typed("filter_permute", dtype)?, "filter_permute");
        // SAFETY: `filter_permute_<dtype>(const T *src, T *dst, size_t kh, size_t kw, size_t
        // ci, size_t co, int from, int to, size_t ci_from, size_t ci_to)`; src holds
        // kh*kw*ci_from*co elements of `dtype` and dst kh*kw*ci_to*co, distinct buffers;
        // ci <= ci_from, ci_to, and every layout code stores each tap at a distinct index below
        // its buffer's count.
        unsafe {
            launch!(self.stream, f, self.grid(n); &src, &dst, &kh, &kw, &ci, &co, &from, &to, &ci_from, &ci_to)
                .map(drop)
        }
        .map_err(driver(k))
    }

    /// Rows `p0 .. p0 + rows` of the im2col matrix of `g` (NHWC input `x` of `dtype`) into
    /// `col` `[rows, kp]`: row `p` holds the input under each kernel tap at output position `p`
    /// in HWIO order (`(ky · kw + kx) · c_in + c`), zeros in the padding and in the columns past
    /// `kh · kw · c_in` (up to `kp`).
    pub(crate) fn im2col(
        &self,
        (g, dtype): (&Conv2dGeometry, DType),
        (x, col): (u64, u64),
        (p0, rows, kp): (usize, usize, usize),
    ) -> Result<(), TensorError> {
        if rows == 0 {
            return Ok(());
        }
        let (f, k) = (self.typed("im2col_nhwc", dtype)?, "im2col_nhwc");
        let geometry = WindowGeometry::of(g);
        // SAFETY: `im2col_nhwc_<dtype>(const T *x, T *col, WindowGeometry g, size_t p0, size_t
        // rows, size_t kp)`; x holds g's NHWC input of `dtype`, col rows*kp elements with kp >=
        // kh*kw*c_in, and rows p0 .. p0 + rows are output positions of g; WindowGeometry's
        // layout matches (see the DeviceRepr impl above).
        unsafe {
            launch!(self.stream, f, self.grid(rows * kp / 8); &x, &col, &geometry, &p0, &rows, &kp)
                .map(drop)
        }
        .map_err(driver(k))
    }

    /// Copies between an NHWC image `small` `[nb, h, w, c]` and a larger one `big`
    /// `[nb, big_h, big_w, big_c]` at offset `(top, left)` and channel 0: `pad` writes all of
    /// `big` (zeros around and in the channels past `c`), otherwise the window of `big` is
    /// cropped into `small`; elements of `dtype`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn pad_or_crop(
        &self,
        dtype: DType,
        pad: bool,
        small: u64,
        big: u64,
        [nb, h, w, c]: [usize; 4],
        [big_h, big_w, big_c]: [usize; 3],
        [top, left]: [usize; 2],
    ) -> Result<(), TensorError> {
        let (k, src, dst, [hs, ws, cs], [hd, wd, cd]) = if pad {
            ("pad_nhwc", small, big, [h, w, c], [big_h, big_w, big_c])
        } else {
            ("crop_nhwc", big, small, [big_h, big_w, big_c], [h, w, c])
        };
        let n = nb * hd * wd;
        if n * cd == 0 {
            return Ok(());
        }
        let f = self.typed(k, dtype)?;
        // SAFETY: `pad_nhwc_<dtype>` / `crop_nhwc_<dtype>(const T *src, T *dst, size_t nb,
        // size_t hs, size_t ws, size_t cs, size_t hd, size_t wd, size_t cd, size_t top, size_t
        // left)`; src holds nb*hs*ws*cs elements of `dtype` and dst nb*hd*wd*cd; the caller
        // ensures big_h >= top + h, big_w >= left + w and big_c >= c.
        unsafe { launch!(self.stream, f, self.grid(n); &src, &dst, &nb, &hs, &ws, &cs, &hd, &wd, &cd, &top, &left).map(drop) }
        .map_err(driver(k))
    }

    /// Copies a `[rows, width]` block of elements of `dtype` (2 or 4 bytes) from `src`
    /// (row pitch and column offset in elements) into `dst`:
    /// `block = (rows, width, (src_pitch, src_off), (dst_pitch, dst_off))`.
    pub(crate) fn copy_block(
        &self,
        dtype: crate::DType,
        src: u64,
        dst: u64,
        block: (usize, usize, (usize, usize), (usize, usize)),
    ) -> Result<(), TensorError> {
        let (rows, width, (sp, so), (dp, doff)) = block;
        let n = rows * width;
        if n == 0 {
            return Ok(());
        }
        let k = match dtype.size_bytes() {
            2 => "copy_block_u16",
            _ => "copy_block_u32",
        };
        // SAFETY: `copy_block_<u32|u16>(const T *src, T *dst, size_t rows, size_t width, size_t
        // src_pitch, size_t src_off, size_t dst_pitch, size_t dst_off)` with T the dtype's
        // word; src holds rows x src_pitch words with src_off + width <= src_pitch, dst rows x
        // dst_pitch with dst_off + width <= dst_pitch (the caller's block geometry).
        unsafe { launch!(self.stream, self.function(k)?, self.grid(n); &src, &dst, &rows, &width, &sp, &so, &dp, &doff).map(drop) }
        .map_err(driver(k))
    }

    /// Max pooling of x (NHWC `g.input_shape()`): each window's maximum into y (NHWC
    /// `g.output_shape()`, `dtype` as x) and the window offset of its first maximum into `arg`
    /// (one u32 per element of `g.output_shape()`), each when not 0. One pass, 8 channels a
    /// thread where [`pool_vectorizes`].
    pub(crate) fn max_pool(
        &self,
        dtype: DType,
        g: &Conv2dGeometry,
        (x, y, arg): (u64, u64, u64),
    ) -> Result<(), TensorError> {
        let n = g.output_shape().numel();
        if n == 0 {
            return Ok(());
        }
        let vec = pool_vectorizes(g, &[x, y, arg]);
        let k = if vec { "max_pool_vec" } else { "max_pool" };
        let (f, pg) = (self.typed(k, dtype)?, WindowGeometry::of(g));
        let threads = if vec { n / 8 } else { n };
        // SAFETY: `max_pool[_vec]_<dtype>(const T *x, T *y, unsigned *arg, WindowGeometry g)`;
        // x holds g.input_shape() elements of `dtype`, y (unless null) g.output_shape(), arg
        // (unless null) g.output_shape() u32 words; WindowGeometry's layout matches; the
        // vectorized kernel's c % 8 == 0 and 16-byte alignment hold (pool_vectorizes).
        unsafe { launch!(self.stream, f, self.grid(threads); &x, &y, &arg, &pg).map(drop) }
            .map_err(driver(k))
    }

    /// The input gradient dx (NHWC `g.input_shape()`, overwritten) of max pooling from the
    /// windows' argmax offsets `arg` ([`Self::max_pool`]) and dy (NHWC `g.output_shape()`), dx
    /// and dy of `dtype`: each input gathers dy over the windows whose maximum it is, summed
    /// in f32 (no atomics); 8 channels a thread where [`pool_vectorizes`].
    pub(crate) fn max_pool_gather(
        &self,
        dtype: DType,
        g: &Conv2dGeometry,
        (arg, dy, dx): (u64, u64, u64),
    ) -> Result<(), TensorError> {
        let n = g.input_shape().numel();
        if n == 0 {
            return Ok(());
        }
        let vec = pool_vectorizes(g, &[arg, dy, dx]);
        let k = if vec {
            "max_pool_bwd_vec"
        } else {
            "max_pool_bwd"
        };
        let (f, pg) = (self.typed(k, dtype)?, WindowGeometry::of(g));
        let threads = if vec { n / 8 } else { n };
        // SAFETY: `max_pool_bwd[_vec]_<dtype>(const unsigned *arg, const T *dy, T *dx,
        // WindowGeometry g)`; arg and dy hold g.output_shape() elements, dx g.input_shape()
        // elements of `dtype`; distinct buffers; the vectorized kernel's c % 8 == 0 and
        // 16-byte alignment hold (pool_vectorizes).
        unsafe { launch!(self.stream, f, self.grid(threads); &arg, &dy, &dx, &pg).map(drop) }
            .map_err(driver(k))
    }
}

/// Whether max pooling over `g` with the buffers at `addrs` takes the vectorized kernels (8
/// channels a thread, 16-byte accesses): a multiple of 8 channels, every buffer 16-byte aligned.
fn pool_vectorizes(g: &Conv2dGeometry, addrs: &[u64]) -> bool {
    g.c_in % 8 == 0 && aligned16(addrs)
}

/// Workspace bytes of max pooling's backward pass: one u32 argmax offset per output element.
pub(crate) fn max_pool_bwd_bytes(g: &Conv2dGeometry) -> usize {
    g.output_shape().numel() * 4
}

impl Kernels {
    /// Sum (`kind` Sum) or average (Avg) pooling of x NHWC `g.input_shape()` into y NHWC
    /// `g.output_shape()`, both of `dtype` (summed in f64, rounded once).
    pub(crate) fn sum_pool(
        &self,
        dtype: DType,
        kind: PoolKind,
        g: &Conv2dGeometry,
        x: u64,
        y: u64,
    ) -> Result<(), TensorError> {
        let n = g.output_shape().numel();
        if n == 0 {
            return Ok(());
        }
        let (k, pg, avg) = (
            "sum_pool",
            WindowGeometry::of(g),
            i32::from(kind == PoolKind::Avg),
        );
        let f = self.typed(k, dtype)?;
        // SAFETY: `sum_pool_<dtype>(const T *x, T *y, WindowGeometry g, int avg)`; x holds
        // g.input_shape() elements of `dtype`, y g.output_shape(); WindowGeometry's layout
        // matches.
        unsafe { launch!(self.stream, f, self.grid(n); &x, &y, &pg, &avg).map(drop) }
            .map_err(driver(k))
    }

    /// The input gradient dx (NHWC `g.input_shape()`, overwritten) of sum or average pooling
    /// from dy (NHWC `g.output_shape()`), both of `dtype` (summed in f32, rounded once).
    pub(crate) fn sum_pool_bwd(
        &self,
        dtype: DType,
        kind: PoolKind,
        g: &Conv2dGeometry,
        dy: u64,
        dx: u64,
    ) -> Result<(), TensorError> {
        let n = g.input_shape().numel();
        if n == 0 {
            return Ok(());
        }
        let (k, pg) = ("sum_pool_bwd", WindowGeometry::of(g));
        let (f, avg) = (self.typed(k, dtype)?, i32::from(kind == PoolKind::Avg));
        // SAFETY: `sum_pool_bwd_<dtype>(const T *dy, T *dx, WindowGeometry g, int avg)`; dx
        // holds g.input_shape() elements of `dtype`, dy g.output_shape(); distinct buffers.
        unsafe { launch!(self.stream, f, self.grid(n); &dy, &dx, &pg, &avg).map(drop) }
            .map_err(driver(k))
    }
}

//! Launchers of `kernels/norm.cu`: per-channel moments with their finishing kernels (batch
//! normalization forward and backward, a channel bias's gradient), the elementwise passes
//! that apply them, and the channel bias.

use super::{BLOCK, Kernels, aligned16, driver};
use crate::{ChannelGeometry, DType, TensorError};
use cudarc::driver::{LaunchConfig, PushKernelArg};

/// Blocks of 32 channels x 8 reducing threads (`channel_moments_<dtype>`'s shared arrays).
const MOMENT_BLOCK: (u32, u32, u32) = (32, 8, 1);

/// Whether the elementwise passes over `g` take the vectorized kernels (`bn_apply_vec`,
/// `bn_bwd_apply_vec`: 8 channels a thread, 16-byte accesses, given aligned tensors): an NHWC
/// view (`inner == 1`) of a multiple of 8 channels.
fn apply_vectorizes(g: &ChannelGeometry) -> bool {
    g.inner == 1 && g.c % 8 == 0 && g.c > 0
}

/// Whether the reduction over `g` takes `channel_moments_vec` (given aligned tensors):
/// [`apply_vectorizes`], and `c` divides 2048 so that one block of 256 threads covers whole
/// rows.
fn moments_vectorize(g: &ChannelGeometry) -> bool {
    apply_vectorizes(g) && 2048 % g.c == 0
}

impl Kernels {
    /// The launch of a vectorized elementwise pass over `n8` groups of a view of `c8` channel
    /// groups: the 1-D grid, its block count rounded up to a multiple of the channel groups'
    /// period, so that the stride (blocks · 256 threads) is a multiple of `c8` and each thread
    /// keeps its channels' values for the whole pass (where that period is at most 64 blocks;
    /// otherwise a thread loads them again at each step).
    fn channel_grid(&self, n8: usize, c8: usize) -> LaunchConfig {
        let mut cfg = self.grid(n8);
        let period = c8 >> c8.trailing_zeros().min(BLOCK.trailing_zeros());
        if period <= 64 {
            cfg.grid_dim.0 = (cfg.grid_dim.0 as usize).next_multiple_of(period) as u32;
        }
        cfg
    }

    /// How many splits the reduction of `g` uses: the partial sums workspace holds
    /// `splits · c` pairs of doubles ([`Kernels::moments_bytes`]). A view the vectorized kernel
    /// takes ([`moments_vectorize`]) gets one block of 256 threads per split, at most 4 per
    /// multiprocessor and at most 4 MiB of partials; any other view enough blocks of 32
    /// channels for one wave of at most 4 per multiprocessor, each split at least 256 elements.
    /// The count depends on the geometry alone, so a plan made before the buffers exist
    /// holds.
    pub(crate) fn moment_splits(&self, g: &ChannelGeometry) -> usize {
        let wave = 4 * self.sms as usize;
        if moments_vectorize(g) {
            let cap = ((4 << 20) / (16 * g.c)).max(1);
            return (g.numel() / 8).div_ceil(256).clamp(1, wave.min(cap));
        }
        let blocks_x = g.c.div_ceil(32).max(1);
        let want = wave.div_ceil(blocks_x).max(1);
        g.per_channel().div_ceil(256).clamp(1, want)
    }

    /// Bytes of the partial sums of `g`'s reduction.
    pub(crate) fn moments_bytes(&self, g: &ChannelGeometry) -> usize {
        self.moment_splits(g) * g.c * 16
    }

    /// Per-split `(sum a, sum a · (b - shift))` of every channel of the view into `partial`
    /// (`b` and `shift` 0 for none), `a` taken as 0 where the bit of `mask` (a ReLU's; 0 for
    /// none) is clear; `a` and `b` of `dtype`, `shift` f32, the sums f64.
    pub(crate) fn channel_moments(
        &self,
        dtype: DType,
        g: &ChannelGeometry,
        (a, b, shift, mask): (u64, u64, u64, u64),
        partial: u64,
    ) -> Result<usize, TensorError> {
        let splits = self.moment_splits(g);
        if moments_vectorize(g) && aligned16(&[a, b]) {
            let (f, sym) = (
                self.typed("channel_moments_vec", dtype)?,
                "channel_moments_vec",
            );
            let (n8, c) = (g.numel() / 8, g.c);
            let cfg = LaunchConfig {
                grid_dim: (splits as u32, 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: `channel_moments_vec_<dtype>(const T *a, const T *b, const float *shift,
            // const u32 *mask, double *partial, size_t n8, size_t c)`; a (and b unless null)
            // hold 8 n8 = outer*c elements of `dtype`, 16-byte aligned, shift is null or holds
            // c floats, mask null or ceil(8 n8 / 32) words, partial splits*c*2 doubles; blocks
            // of 256 threads and c / 8 dividing 256 (moments_vectorize), as the kernel needs.
            unsafe { launch!(self.stream, f, cfg; &a, &b, &shift, &mask, &partial, &n8, &c) }
                .map_err(driver(sym))?;
            return Ok(splits);
        }
        let per_split = g.per_channel().div_ceil(splits).max(1);
        let (outer, c, inner) = (g.outer, g.c, g.inner);
        let (f, sym) = (self.typed("channel_moments", dtype)?, "channel_moments");
        let cfg = LaunchConfig {
            grid_dim: (c.div_ceil(32) as u32, splits as u32, 1),
            block_dim: MOMENT_BLOCK,
            shared_mem_bytes: 0,
        };
        // SAFETY: `channel_moments_<dtype>(const T *a, const T *b, const float *shift, const
        // u32 *mask, double *partial, size_t outer, size_t c, size_t inner, size_t per_split)`;
        // a (and b unless null) hold outer*c*inner elements of `dtype`, shift is null or holds
        // c floats, mask null or ceil(outer*c*inner / 32) words, partial splits*c*2 doubles; the grid
        // has `splits` rows of blocks of 32 x 8 threads, as the kernel's shared arrays need,
        // and splits * per_split covers outer * inner.
        unsafe {
            launch!(self.stream, f, cfg; &a, &b, &shift, &mask, &partial, &outer, &c, &inner, &per_split)
        }
        .map_err(driver(sym))?;
        Ok(splits)
    }

    /// `out[j]` = the first sum of channel `j` over `splits` partials, rounded once to `dtype`.
    pub(crate) fn channel_sum_finish(
        &self,
        dtype: DType,
        partial: u64,
        splits: usize,
        c: usize,
        out: u64,
    ) -> Result<(), TensorError> {
        let (f, sym) = (
            self.typed("channel_sum_finish", dtype)?,
            "channel_sum_finish",
        );
        // SAFETY: `channel_sum_finish_<dtype>(const double *partial, size_t splits, size_t c, T
        // *out)`; partial holds splits*c*2 doubles, out c elements of `dtype`; blocks of 32 x
        // 32 threads (finish_grid), as column_sums needs.
        unsafe {
            launch!(self.stream, f, Self::finish_grid(c); &partial, &splits, &c, &out).map(drop)
        }
        .map_err(driver(sym))
    }

    /// Batch normalization statistics of `m` elements per channel: mean, rstd and
    /// `scale = gamma · rstd` (`gamma` 0: 1), `[c]` each.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn bn_finish(
        &self,
        (partial, splits): (u64, usize),
        c: usize,
        m: f64,
        eps: f32,
        gamma: u64,
        (mean, rstd, scale): (u64, u64, u64),
    ) -> Result<(), TensorError> {
        let sym = "bn_finish_f32";
        // SAFETY: `bn_finish_f32(const double *partial, size_t splits, size_t c, double m,
        // float eps, const float *gamma, float *mean, float *rstd, float *scale)`; partial holds
        // splits*c*2 doubles, gamma is null or holds c floats, mean, rstd and scale c floats;
        // blocks of 32 x 32 threads (finish_grid), as column_sums needs.
        unsafe {
            launch!(self.stream, self.function(sym)?, Self::finish_grid(c); &partial, &splits, &c, &m, &eps, &gamma, &mean, &rstd, &scale)
                .map(drop)
        }
        .map_err(driver(sym))
    }

    /// `scale = gamma · rstd` (`gamma` 0: 1), `[c]` each, from statistics given: what
    /// [`Self::bn_finish`] writes from the same `rstd`, bit for bit.
    pub(crate) fn bn_scale(
        &self,
        c: usize,
        (gamma, rstd, scale): (u64, u64, u64),
    ) -> Result<(), TensorError> {
        let sym = "bn_scale_f32";
        // SAFETY: `bn_scale_f32(const float *gamma, const float *rstd, float *scale, size_t c)`;
        // gamma null or c floats, rstd and scale c floats; one thread a channel.
        unsafe {
            launch!(self.stream, self.function(sym)?, self.grid(c); &gamma, &rstd, &scale, &c)
                .map(drop)
        }
        .map_err(driver(sym))
    }

    /// `y = (x - mean) · scale + beta` over the view (`beta` 0: none), plus `add` (0 for none:
    /// `y` rounded to `dtype`, then the sum), then, with `mask` (0 for none), a ReLU writing its
    /// bit mask; x, y and add of `dtype`, the per-channel values f32.
    pub(crate) fn bn_apply(
        &self,
        (g, dtype): (&ChannelGeometry, DType),
        (x, y, add, mask): (u64, u64, u64, u64),
        (mean, scale, beta): (u64, u64, u64),
    ) -> Result<(), TensorError> {
        let (n, c, inner) = (g.numel(), g.c, g.inner);
        let add_aligned = add == 0 || aligned16(&[add]);
        if apply_vectorizes(g) && aligned16(&[x, y]) && add_aligned {
            let (f, sym) = (self.typed("bn_apply_vec", dtype)?, "bn_apply_vec");
            let (n8, c8) = (n / 8, c / 8);
            // SAFETY: `bn_apply_vec_<dtype>(const T *x, T *y, const float *mean, const float
            // *scale, const float *beta, const T *add, u32 *mask, size_t n8, size_t c8)`; x, y and
            // add (or null) hold 8 n8 = outer*c elements of `dtype` (16-byte aligned; x and y the
            // same buffer or distinct), mean and scale c = 8 c8 floats, beta null or c, mask null
            // or ceil(8 n8 / 32) words; blocks are whole warps (256 threads), as its shuffles
            // need.
            return unsafe {
                launch!(self.stream, f, self.channel_grid(n8, c8); &x, &y, &mean, &scale, &beta, &add, &mask, &n8, &c8)
                    .map(drop)
            }
            .map_err(driver(sym));
        }
        if mask != 0 {
            let (f, sym) = (self.typed("bn_apply_relu", dtype)?, "bn_apply_relu");
            // SAFETY: `bn_apply_relu_<dtype>(const T *x, T *y, const float *mean, const float
            // *scale, const float *beta, const T *add, u32 *mask, size_t n, size_t c, size_t
            // inner)`; x, y and add (or null) hold n = outer*c*inner elements of `dtype` (x and y
            // distinct buffers), mean and scale c floats, beta null or c, mask ceil(n/32) words;
            // blocks are whole warps (256 threads), as the ballot needs.
            return unsafe {
                launch!(self.stream, f, self.grid(n); &x, &y, &mean, &scale, &beta, &add, &mask, &n, &c, &inner)
                    .map(drop)
            }
            .map_err(driver(sym));
        }
        let (f, sym) = (self.typed("bn_apply", dtype)?, "bn_apply");
        // SAFETY: `bn_apply_<dtype>(const T *x, T *y, const float *mean, const float *scale,
        // const float *beta, const T *add, size_t n, size_t c, size_t inner)`; x, y and add (or
        // null) hold n = outer*c*inner elements of `dtype` (possibly the same buffer:
        // elementwise), mean and scale c floats, beta null or c.
        unsafe {
            launch!(self.stream, f, self.grid(n); &x, &y, &mean, &scale, &beta, &add, &n, &c, &inner)
                .map(drop)
        }
        .map_err(driver(sym))
    }

    /// Batch normalization backward per channel: dgamma, dbeta (each 0 for not wanted) and the
    /// dx coefficients `coef` (`3 c` floats), from the partial sums of dy and dy · (x - mean).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn bn_bwd_finish(
        &self,
        (partial, splits): (u64, usize),
        c: usize,
        m: f64,
        (gamma, rstd): (u64, u64),
        (dgamma, dbeta): (u64, u64),
        coef: u64,
    ) -> Result<(), TensorError> {
        let sym = "bn_bwd_finish_f32";
        // SAFETY: `bn_bwd_finish_f32(const double *partial, size_t splits, size_t c, double m,
        // const float *gamma, const float *rstd, float *dgamma, float *dbeta, float *coef)`;
        // partial holds splits*c*2 doubles, gamma, dgamma, dbeta are null or hold c floats,
        // rstd c floats, coef 3c floats; blocks of 32 x 32 threads (finish_grid), as
        // column_sums needs.
        unsafe {
            launch!(self.stream, self.function(sym)?, Self::finish_grid(c); &partial, &splits, &c, &m, &gamma, &rstd, &dgamma, &dbeta, &coef)
                .map(drop)
        }
        .map_err(driver(sym))
    }

    /// The per-channel part of a batch norm's backward pass through the pointwise conv before
    /// it ([`crate::ops::batch_norm_fold`]): `ins` = (w, b0, gamma or 0, mean, rstd, gt, sh,
    /// sd), `outs` = (dw, w_a, w_c, bp, db0, dgamma or 0, dbeta or 0), every one f32.
    pub(crate) fn bn_fold(
        &self,
        (k, c, count): (usize, usize, usize),
        ins: [u64; 8],
        outs: [u64; 7],
    ) -> Result<(), TensorError> {
        let sym = "bn_fold_f32";
        let [w, b0, gamma, mean, rstd, gt, sh, sd] = ins;
        let [dw, w_a, w_c, bp, db0, dgamma, dbeta] = outs;
        let count = count as f64;
        let cfg = LaunchConfig {
            grid_dim: (c.div_ceil(32).max(1) as u32, 1, 1),
            block_dim: MOMENT_BLOCK,
            shared_mem_bytes: 0,
        };
        // SAFETY: `bn_fold_f32(const float *w, const float *b0, const float *gamma, const float
        // *mean, const float *rstd, const float *gt, const float *sh, const float *sd, size_t k,
        // size_t c, double count, float *dw, float *w_a, float *w_c, float *bp, float *db0,
        // float *dgamma, float *dbeta)`; w, gt, dw, w_a and w_c hold k c floats (the outputs
        // distinct buffers), sh k, the rest c (gamma, dgamma and dbeta may be null); blocks of
        // 32 x 8 threads, as its shared arrays need.
        unsafe {
            launch!(self.stream, self.function(sym)?, cfg; &w, &b0, &gamma, &mean, &rstd, &gt, &sh, &sd, &k, &c, &count, &dw, &w_a, &w_c, &bp, &db0, &dgamma, &dbeta)
                .map(drop)
        }
        .map_err(driver(sym))
    }

    /// `dy = a · (dy - b - (x - mean) · cz)` in place over the view, `(a, b, cz)` from `coef`,
    /// `dy` taken as 0 where the bit of `mask` (a ReLU's; 0 for none) is clear; x and dy of
    /// `dtype`, mean and coef f32.
    pub(crate) fn bn_bwd_apply(
        &self,
        (g, dtype): (&ChannelGeometry, DType),
        (x, dy, mask): (u64, u64, u64),
        (mean, coef): (u64, u64),
    ) -> Result<(), TensorError> {
        let (n, c, inner) = (g.numel(), g.c, g.inner);
        if apply_vectorizes(g) && aligned16(&[x, dy]) {
            let (f, sym) = (self.typed("bn_bwd_apply_vec", dtype)?, "bn_bwd_apply_vec");
            let (n8, c8) = (n / 8, c / 8);
            // SAFETY: `bn_bwd_apply_vec_<dtype>(const T *x, T *dy, const float *mean, const
            // float *coef, const u32 *mask, size_t n8, size_t c8)`; x and dy hold 8 n8 =
            // outer*c elements of `dtype` (distinct buffers, 16-byte aligned), mean c = 8 c8
            // floats, coef 3c floats, mask null or ceil(8 n8 / 32) words.
            return unsafe {
                launch!(self.stream, f, self.channel_grid(n8, c8); &x, &dy, &mean, &coef, &mask, &n8, &c8)
                    .map(drop)
            }
            .map_err(driver(sym));
        }
        let (f, sym) = (self.typed("bn_bwd_apply", dtype)?, "bn_bwd_apply");
        // SAFETY: `bn_bwd_apply_<dtype>(const T *x, T *dy, const float *mean, const float
        // *coef, const u32 *mask, size_t n, size_t c, size_t inner)`; x and dy hold n =
        // outer*c*inner elements of `dtype` (distinct buffers), mean c floats, coef 3c floats,
        // mask null or ceil(n/32) words.
        unsafe {
            launch!(self.stream, f, self.grid(n); &x, &dy, &mean, &coef, &mask, &n, &c, &inner)
                .map(drop)
        }
        .map_err(driver(sym))
    }

    /// [`Kernels::bn_bwd_apply`] that also sums, per channel, the dx it writes into
    /// `partial` (`splits · c` pairs of doubles, [`Kernels::moments_bytes`]), for
    /// [`Kernels::channel_sum_finish`]: the splits, or `None` (nothing launched) where the view
    /// or the tensors do not take the vectorized kernel (an NHWC view of `c` dividing 2048, a
    /// multiple of 8; 16-byte aligned tensors).
    pub(crate) fn bn_bwd_apply_sum(
        &self,
        (g, dtype): (&ChannelGeometry, DType),
        (x, dy, mask): (u64, u64, u64),
        (mean, coef): (u64, u64),
        partial: u64,
    ) -> Result<Option<usize>, TensorError> {
        if !moments_vectorize(g) || !aligned16(&[x, dy]) {
            return Ok(None);
        }
        let (f, sym) = (
            self.typed("bn_bwd_apply_sum_vec", dtype)?,
            "bn_bwd_apply_sum_vec",
        );
        let (n8, c8, splits) = (g.numel() / 8, g.c / 8, self.moment_splits(g));
        let cfg = LaunchConfig {
            grid_dim: (splits as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: `bn_bwd_apply_sum_vec_<dtype>(const T *x, T *dy, const float *mean, const
        // float *coef, const u32 *mask, double *partial, size_t n8, size_t c8)`; x and dy hold 8
        // n8 = outer*c elements of `dtype` (distinct buffers, 16-byte aligned), mean c = 8 c8
        // floats, coef 3c floats, mask null or ceil(8 n8 / 32) words, partial 2 splits c
        // doubles; blocks of 256 threads and c8 dividing 256, as the kernel needs.
        unsafe { launch!(self.stream, f, cfg; &x, &dy, &mean, &coef, &mask, &partial, &n8, &c8) }
            .map_err(driver(sym))?;
        Ok(Some(splits))
    }

    /// `y[o, j, i] += b[j]` over the view, `y` and `b` of `dtype` (added in f32, rounded once).
    pub(crate) fn channel_bias_add(
        &self,
        dtype: DType,
        g: &ChannelGeometry,
        y: u64,
        b: u64,
    ) -> Result<(), TensorError> {
        let (n, c, inner) = (g.numel(), g.c, g.inner);
        if n == 0 {
            return Ok(());
        }
        let (f, sym) = (self.typed("channel_bias_add", dtype)?, "channel_bias_add");
        // SAFETY: `channel_bias_add_<dtype>(T *y, const T *b, size_t n, size_t c, size_t
        // inner)`; y holds n = outer*c*inner elements of `dtype`, b c.
        unsafe { launch!(self.stream, f, self.grid(n); &y, &b, &n, &c, &inner).map(drop) }
            .map_err(driver(sym))
    }
}

//! Launchers of the elementwise kernels: fills, casts, bias add and gradient, activations (the
//! ReLU's vectorized path and every dtype's generic kernels) and binary ops.

use super::{Kernels, aligned16, driver};
use crate::{DType, TensorError};
use cudarc::driver::{LaunchConfig, PushKernelArg};

impl Kernels {
    /// `p[i] = value` for `n` 32-bit words at `p`.
    pub(crate) fn fill_u32(&self, p: u64, value: u32, n: usize) -> Result<(), TensorError> {
        if n == 0 {
            return Ok(());
        }
        let sym = "fill_u32";
        // SAFETY: `fill_u32(u32 *p, u32 value, size_t n)`; p holds n words.
        unsafe { launch!(self.stream, self.function(sym)?, self.grid(n); &p, &value, &n).map(drop) }
            .map_err(driver(sym))
    }

    /// `p[i] = value` for `n` 16-bit words at `p` (a bf16 or f16 bit pattern).
    pub(crate) fn fill_u16(&self, p: u64, value: u16, n: usize) -> Result<(), TensorError> {
        if n == 0 {
            return Ok(());
        }
        let sym = "fill_u16";
        // SAFETY: `fill_u16(unsigned short *p, unsigned short value, size_t n)`; p holds n
        // 16-bit words.
        unsafe { launch!(self.stream, self.function(sym)?, self.grid(n); &p, &value, &n).map(drop) }
            .map_err(driver(sym))
    }

    /// Zeroes `n` float elements of `dtype` at `p` (+0.0 is all bits clear in every float
    /// dtype).
    pub(crate) fn zero(&self, p: u64, dtype: DType, n: usize) -> Result<(), TensorError> {
        match dtype.size_bytes() {
            4 => self.fill_u32(p, 0, n),
            _ => self.fill_u16(p, 0, n),
        }
    }

    /// Splits `n` f32 elements at `x` into their TF32 roundings at `hi` and the rests `x - hi`
    /// at `lo` (3xTF32's operands; see `tf32_split` in kernels/elementwise.cu).
    pub(crate) fn tf32_split(&self, x: u64, hi: u64, lo: u64, n: usize) -> Result<(), TensorError> {
        if n == 0 {
            return Ok(());
        }
        // SAFETY: `tf32_split(const float *x, float *hi, float *lo, size_t n)`; x, hi and lo
        // hold n f32 each (hi and lo distinct from x and each other).
        unsafe {
            launch!(self.stream, self.function("tf32_split")?, self.grid(n); &x, &hi, &lo, &n)
                .map(drop)
        }
        .map_err(driver("tf32_split"))
    }

    /// Stacks the 3xTF32 parts of `rows` rows of `c` f32 at `x` into `rows` rows of `3 c` at
    /// `out`: in each, segment `lo_seg` (0..3) the rests `x - hi`, the other two the TF32
    /// roundings `hi` (`tf32_stack` in kernels/elementwise.cu).
    pub(crate) fn tf32_stack(
        &self,
        (x, out): (u64, u64),
        (rows, c): (usize, usize),
        lo_seg: i32,
    ) -> Result<(), TensorError> {
        let n = rows * c;
        if n == 0 {
            return Ok(());
        }
        if u32::try_from(c).is_err() {
            // the kernel divides by c in 32 bits
            return Err(TensorError::InvalidArgument {
                op: "tf32_stack",
                reason: format!("rows of {c} elements, over 2^32 - 1"),
            });
        }
        // SAFETY: `tf32_stack(const float *x, float *out, size_t rows, size_t c, int lo_seg)`;
        // x holds rows * c f32, out (distinct) 3 rows * c.
        unsafe {
            launch!(self.stream, self.function("tf32_stack")?, self.grid(n); &x, &out, &rows, &c, &lo_seg)
                .map(drop)
        }
        .map_err(driver("tf32_stack"))
    }

    /// `dst[i] = src[i]` converted from `from` to `to` (distinct float dtypes), `n` elements
    /// (8 per thread with 16-byte accesses where both are 16-byte aligned).
    pub(crate) fn cast(
        &self,
        (from, to): (DType, DType),
        src: u64,
        dst: u64,
        n: usize,
    ) -> Result<(), TensorError> {
        if n == 0 {
            return Ok(());
        }
        let pair = format!("{}_{}", from.name(), to.name());
        let n8 = if aligned16(&[src, dst]) { n / 8 } else { 0 };
        if n8 > 0 {
            let sym = format!("cast_vec_{pair}");
            // SAFETY: `cast_vec_<from>_<to>(const S *src, D *dst, size_t n8)`; src holds at
            // least 8 n8 elements of `from`, dst of `to` (distinct buffers), both 16-byte
            // aligned.
            unsafe {
                launch!(self.stream, self.function(&sym)?, self.grid(n8); &src, &dst, &n8).map(drop)
            }
            .map_err(driver("cast"))?;
        }
        let done = 8 * n8;
        if done == n {
            return Ok(());
        }
        let (st, dt, nt) = (
            src + (done * from.size_bytes()) as u64,
            dst + (done * to.size_bytes()) as u64,
            n - done,
        );
        let sym = format!("cast_{pair}");
        // SAFETY: `cast_<from>_<to>(const S *src, D *dst, size_t n)`; from element `done` on,
        // src holds nt elements of `from`, dst nt elements of `to` (distinct buffers).
        unsafe {
            launch!(self.stream, self.function(&sym)?, self.grid(nt); &st, &dt, &nt).map(drop)
        }
        .map_err(driver("cast"))
    }

    /// `y[i] += b[i % c]` over `n` elements at `y`, `c` at `b`, of `dtype` (8 elements per
    /// thread when `c % 8 == 0` and both are 16-byte aligned).
    pub(crate) fn bias_add(
        &self,
        dtype: DType,
        y: u64,
        b: u64,
        n: usize,
        c: usize,
    ) -> Result<(), TensorError> {
        if n == 0 {
            return Ok(());
        }
        if c % 8 == 0 && n % 8 == 0 && aligned16(&[y, b]) {
            let (n8, c8) = (n / 8, c / 8);
            let (f, sym) = (self.typed("bias_add_vec", dtype)?, "bias_add_vec");
            // SAFETY: `bias_add_vec_<dtype>(T *y, const T *b, size_t n8, size_t c8)`; y holds
            // 8 n8 elements and b 8 c8 >= 8, both 16-byte aligned.
            return unsafe { launch!(self.stream, f, self.grid(n8); &y, &b, &n8, &c8).map(drop) }
                .map_err(driver(sym));
        }
        let (f, sym) = (self.typed("bias_add", dtype)?, "bias_add");
        // SAFETY: `bias_add_<dtype>(T *y, const T *b, size_t n, size_t c)`; y holds n
        // elements of `dtype`, b holds c >= 1.
        unsafe { launch!(self.stream, f, self.grid(n); &y, &b, &n, &c).map(drop) }
            .map_err(driver(sym))
    }

    /// How many row splits `bias_grad` uses for `rows` rows: the size, in `c` doubles each, of
    /// the partial-sum workspace it needs. At most 4 blocks of 256 threads per multiprocessor,
    /// so the vectorized kernel runs as one wave.
    pub(crate) fn bias_grad_splits(&self, rows: usize) -> usize {
        rows.div_ceil(256).clamp(1, 4 * self.sms as usize)
    }

    /// Whether `bias_grad` of `c` columns at `dy` takes the vectorized path (any float
    /// dtype), the one that fuses the ReLU backward (`mask`) into its one pass: `c` a multiple
    /// of 8 dividing 2048, `dy` 16-byte aligned.
    pub(crate) fn bias_grad_vectorizes(&self, c: usize, dy: u64) -> bool {
        c % 8 == 0 && c > 0 && 2048 % c == 0 && aligned16(&[dy])
    }

    /// `db[j] = sum_r dy[r, j]` for dy `[rows, c]` of `dtype`, through `partial`, a workspace
    /// of `bias_grad_splits(rows) * c` doubles. With `mask != 0`, `dy` is first masked in
    /// place as the ReLU's backward does: in the same pass where
    /// [`Self::bias_grad_vectorizes`], else by [`Self::relu_bwd`] first.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn bias_grad(
        &self,
        dtype: DType,
        dy: u64,
        mask: u64,
        partial: u64,
        db: u64,
        rows: usize,
        c: usize,
    ) -> Result<(), TensorError> {
        if c == 0 {
            return Ok(());
        }
        let splits = self.bias_grad_splits(rows);
        if self.bias_grad_vectorizes(c, dy) {
            let n8 = rows * c / 8;
            let (f, sym) = (self.typed("bias_grad_vec", dtype)?, "bias_grad_vec");
            let cfg = LaunchConfig {
                grid_dim: (splits as u32, 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: `bias_grad_vec_<dtype>(T *dy, const u32 *mask, double *partial, size_t
            // n8, size_t c)`; dy holds 8 n8 = rows*c elements (16-byte aligned), mask is null
            // or holds ceil(rows*c / 32) words, partial splits*c doubles; blocks of 256 threads
            // and c divides 2048 (bias_grad_vectorizes), as the kernel needs.
            unsafe { launch!(self.stream, f, cfg; &dy, &mask, &partial, &n8, &c) }
                .map_err(driver(sym))?;
        } else {
            if mask != 0 {
                self.relu_bwd(dtype, dy, mask, rows * c)?;
            }
            let rows_per_split = rows.div_ceil(splits).max(1);
            let (f, sym) = (self.typed("bias_grad_partial", dtype)?, "bias_grad_partial");
            let cfg = LaunchConfig {
                grid_dim: (c.div_ceil(32) as u32, splits as u32, 1),
                block_dim: (32, 8, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: `bias_grad_partial_<dtype>(const T *dy, double *partial, size_t rows,
            // size_t c, size_t rows_per_split)`; dy holds rows*c elements of `dtype`, partial
            // splits*c doubles, and the grid has exactly `splits` rows of blocks of 32x8
            // threads.
            unsafe { launch!(self.stream, f, cfg; &dy, &partial, &rows, &c, &rows_per_split) }
                .map_err(driver(sym))?;
        }
        let (f, sym) = (self.typed("bias_grad_finish", dtype)?, "bias_grad_finish");
        // SAFETY: `bias_grad_finish_<dtype>(const double *partial, T *db, size_t splits,
        // size_t c)`; partial holds splits*c doubles, db holds c elements of `dtype`; blocks
        // of 32 x 32 threads (finish_grid), as column_sums needs.
        unsafe {
            launch!(self.stream, f, Self::finish_grid(c); &partial, &db, &splits, &c).map(drop)
        }
        .map_err(driver(sym))
    }

    /// In-place ReLU on `n` elements of `dtype` at `x`; `mask` (0 for none) receives
    /// `ceil(n/32)` words. With `apply == false` `x` is only read: the mask of an `x` that is
    /// already ReLU'd.
    pub(crate) fn relu(
        &self,
        dtype: DType,
        x: u64,
        (mask, n): (u64, usize),
        apply: bool,
    ) -> Result<(), TensorError> {
        if n == 0 {
            return Ok(());
        }
        let apply = i32::from(apply);
        // Whole chunks of 256 elements (32 lanes x 8, 8 mask words) vectorized.
        let chunks = if aligned16(&[x]) { n / 256 } else { 0 };
        if chunks > 0 {
            let (f, sym) = (self.typed("relu_vec", dtype)?, "relu_vec");
            // SAFETY: `relu_vec_<dtype>(T *x, u32 *mask, size_t chunks, int apply)`; x holds
            // at least 256 chunks elements, 16-byte aligned; mask is null or holds at least
            // 8 chunks words; blocks are whole warps (256 threads), as the shuffles need.
            unsafe { launch!(self.stream, f, self.grid(chunks * 32); &x, &mask, &chunks, &apply) }
                .map_err(driver(sym))?;
        }
        let done = chunks * 256;
        if done == n {
            return Ok(());
        }
        let (xt, nt) = (x + (done * dtype.size_bytes()) as u64, n - done);
        let mt = if mask == 0 {
            0
        } else {
            mask + 4 * (done / 32) as u64
        };
        let (f, sym) = (self.typed("relu", dtype)?, "relu");
        // SAFETY: `relu_<dtype>(T *x, u32 *mask, size_t n, int apply)`; the tail of x from
        // element `done` (a multiple of 32) holds nt elements, the mask from word done/32 holds
        // ceil(nt/32) words or is null. Blocks are whole warps (256 threads), as the ballot needs.
        unsafe { launch!(self.stream, f, self.grid(nt); &xt, &mt, &nt, &apply).map(drop) }
            .map_err(driver(sym))
    }

    /// `dy[i] = 0` where mask bit `i` is clear, for `n` elements of `dtype` at `dy`.
    pub(crate) fn relu_bwd(
        &self,
        dtype: DType,
        dy: u64,
        mask: u64,
        n: usize,
    ) -> Result<(), TensorError> {
        if n == 0 {
            return Ok(());
        }
        // Whole groups of 32 elements (4 groups of 8, one mask word) vectorized.
        let n8 = if aligned16(&[dy]) { n / 32 * 4 } else { 0 };
        if n8 > 0 {
            let (f, sym) = (self.typed("relu_bwd_vec", dtype)?, "relu_bwd_vec");
            // SAFETY: `relu_bwd_vec_<dtype>(T *dy, const u32 *mask, size_t n8)`; dy holds at
            // least 8 n8 elements, 16-byte aligned; mask at least n8/4 words.
            unsafe { launch!(self.stream, f, self.grid(n8); &dy, &mask, &n8) }
                .map_err(driver(sym))?;
        }
        let done = n8 * 8;
        if done == n {
            return Ok(());
        }
        let dt = dy + (done * dtype.size_bytes()) as u64;
        let mt = mask + 4 * (done / 32) as u64;
        let relu = crate::Activation::Relu;
        self.unary_bwd(dtype, dt, 0, mt, n - done, relu.code(), relu.alpha())
    }

    /// In place `y = act(y)` on `n` elements of `dtype`, `op` the activation's code; `mask`
    /// (0 for none) receives the ReLU's `ceil(n/32)` words.
    pub(crate) fn unary(
        &self,
        dtype: DType,
        y: u64,
        mask: u64,
        n: usize,
        op: i32,
        alpha: f32,
    ) -> Result<(), TensorError> {
        if n == 0 {
            return Ok(());
        }
        let (f, sym) = (self.typed("unary", dtype)?, "unary");
        // SAFETY: `unary_<dtype>(T *y, u32 *mask, size_t n, int op, float alpha)`; y holds n
        // elements of `dtype`; mask is null or holds ceil(n/32) words; blocks are whole warps
        // (256 threads), as the ballot needs.
        unsafe { launch!(self.stream, f, self.grid(n); &y, &mask, &n, &op, &alpha).map(drop) }
            .map_err(driver(sym))
    }

    /// In place `dy = dy · act'` on `n` elements of `dtype`, from `mask` (ReLU; `saved` 0) or
    /// from `saved` (the output; `mask` 0).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn unary_bwd(
        &self,
        dtype: DType,
        dy: u64,
        saved: u64,
        mask: u64,
        n: usize,
        op: i32,
        alpha: f32,
    ) -> Result<(), TensorError> {
        if n == 0 {
            return Ok(());
        }
        let (f, sym) = (self.typed("unary_bwd", dtype)?, "unary_bwd");
        // SAFETY: `unary_bwd_<dtype>(T *dy, const T *saved, const u32 *mask, size_t n, int op,
        // float alpha)`; dy holds n elements of `dtype`; exactly one of saved (n elements) and
        // mask (ceil(n/32) words) is non-null.
        unsafe {
            launch!(self.stream, f, self.grid(n); &dy, &saved, &mask, &n, &op, &alpha).map(drop)
        }
        .map_err(driver(sym))
    }

    /// In place `a = a op b` on `n` elements of `dtype`, `op` the binary op's code; with
    /// `mask` (0 for none), then a ReLU writing its `ceil(n/32)` mask words, in the same pass
    /// over whole vector groups (8 elements a thread; 256 a warp with a mask).
    pub(crate) fn binary(
        &self,
        dtype: DType,
        (a, b, mask): (u64, u64, u64),
        n: usize,
        op: i32,
    ) -> Result<(), TensorError> {
        if n == 0 {
            return Ok(());
        }
        // with a mask, whole warps' chunks of 256 elements (8 mask words each)
        let group = if mask == 0 { 8 } else { 256 };
        let groups = if aligned16(&[a, b]) { n / group } else { 0 };
        if groups > 0 {
            let (f, sym) = (self.typed("binary_vec", dtype)?, "binary_vec");
            let n8 = groups * group / 8;
            // SAFETY: `binary_vec_<dtype>(T *a, const T *b, u32 *mask, size_t n8, int op)`; a
            // and b hold at least 8 n8 elements of `dtype` each, 16-byte aligned; mask is null
            // or holds n8 / 4 words, n8 a multiple of 32 (whole warps' words); blocks are whole
            // warps (256 threads), as its shuffles need.
            unsafe { launch!(self.stream, f, self.grid(n8); &a, &b, &mask, &n8, &op).map(drop) }
                .map_err(driver(sym))?;
        }
        let (done, size) = (groups * group, dtype.size_bytes() as u64);
        if done == n {
            return Ok(());
        }
        let (at, bt, nt) = (a + done as u64 * size, b + done as u64 * size, n - done);
        let (f, sym) = (self.typed("binary", dtype)?, "binary");
        // SAFETY: `binary_<dtype>(T *a, const T *b, size_t n, int op)`; from element `done`,
        // a and b hold nt elements of `dtype` each.
        unsafe { launch!(self.stream, f, self.grid(nt); &at, &bt, &nt, &op).map(drop) }
            .map_err(driver(sym))?;
        if mask == 0 {
            return Ok(());
        }
        // the tail's ReLU: `done` is a multiple of 256, so its mask starts at word done / 32
        self.relu(dtype, at, (mask + 4 * (done / 32) as u64, nt), true)
    }

    /// In place `a = a op b` on `n` elements of `dtype`, `op` the binary op's code, then
    /// `a[i] = 0` where bit `i` of the saved ReLU `mask` (`ceil(n/32)` words) is clear: one pass
    /// over whole mask words' groups (32 elements), [`Self::binary`] and [`Self::relu_bwd`] on
    /// the tail.
    pub(crate) fn binary_masked(
        &self,
        dtype: DType,
        ((a, b), mask): ((u64, u64), u64),
        n: usize,
        op: i32,
    ) -> Result<(), TensorError> {
        let n8 = if aligned16(&[a, b]) { n / 32 * 4 } else { 0 };
        if n8 > 0 {
            let (f, sym) = (self.typed("binary_masked_vec", dtype)?, "binary_masked_vec");
            // SAFETY: `binary_masked_vec_<dtype>(T *a, const T *b, const u32 *mask, size_t n8,
            // int op)`; a and b hold at least 8 n8 elements of `dtype` each, 16-byte aligned;
            // mask holds at least n8 / 4 words.
            unsafe { launch!(self.stream, f, self.grid(n8); &a, &b, &mask, &n8, &op) }
                .map_err(driver(sym))?;
        }
        let (done, size) = (n8 * 8, dtype.size_bytes() as u64);
        if done == n {
            return Ok(());
        }
        let (at, bt) = (a + done as u64 * size, b + done as u64 * size);
        self.binary(dtype, (at, bt, 0), n - done, op)?;
        // `done` is a multiple of 32, so the tail's mask starts at word done / 32
        self.relu_bwd(dtype, at, mask + 4 * (done / 32) as u64, n - done)
    }
}

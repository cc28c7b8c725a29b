//! Launchers of `kernels/gemm.cu`: the mixed-precision dense product `c = a · round(b)` (a and
//! c bf16 or f16, b f32) on tensor cores, split over k into f32 partials, and their reduction.

use super::{Kernels, aligned16, driver};
use crate::{DType, TensorError};
use cudarc::driver::{LaunchConfig, PushKernelArg};

/// Rows of `a` a block holds in registers (two warps of 8 tiles of 8).
const MAX_ROWS: usize = 128;
/// Columns of `b` per block (4 warps of 32, twice: one per half of the rows).
const BLOCK_COLS: usize = 128;
/// Values of k per step of a block.
const STEP_K: usize = 32;
/// Dynamic shared memory of a block: 3 stages of 17,408 bytes of b and 8,192 of a
/// (`GS_STAGES * GS_STAGE` in kernels/gemm.cu).
pub(super) const SHARED_BYTES: usize = 3 * (17_408 + 8_192);
/// The kernels that take [`SHARED_BYTES`] of dynamic shared memory.
pub(super) const SHARED_KERNELS: [&str; 2] = ["gemm_wf32_bf16", "gemm_wf32_f16"];

impl Kernels {
    /// Whether [`Kernels::gemm_wf32`] takes `[m, k] · [k, n]`: `1 <= m <= 128`, `k % 8 == 0`,
    /// `n % 4 == 0` (its 16-byte loads of a's rows and b's), and n's blocks of 128 columns
    /// within a grid's 65,535 rows.
    pub(crate) fn gemm_wf32_fits(m: usize, n: usize, k: usize) -> bool {
        let rows_ok = (1..=MAX_ROWS).contains(&m);
        let cols_ok = n % 4 == 0 && n > 0 && n.div_ceil(BLOCK_COLS) <= 65_535;
        rows_ok && cols_ok && k % 8 == 0 && k > 0
    }

    /// How many splits of k `gemm_wf32` uses: two blocks per multiprocessor in all, at most
    /// one per 32 values of k. Its workspace is `splits * m * n` f32 partials.
    pub(crate) fn gemm_wf32_splits(&self, n: usize, k: usize) -> usize {
        let col_blocks = n.div_ceil(BLOCK_COLS);
        (2 * self.sms as usize)
            .div_ceil(col_blocks)
            .clamp(1, k.div_ceil(STEP_K).max(1))
    }

    /// `c [m, n] = a [m, k] · b [k, n]` rounded to `dtype` (bf16 or f16) as read, for shapes
    /// where [`Kernels::gemm_wf32_fits`]: the split-K tensor-core kernel into `part` (a
    /// workspace of `gemm_wf32_splits(n, k) * m * n` f32), then the reduction into `c`.
    ///
    /// # Errors
    /// [`TensorError::InvalidArgument`] for another dtype, unaligned operands or a shape that
    /// does not fit; driver errors.
    pub(crate) fn gemm_wf32(
        &self,
        dtype: DType,
        (a, b, c): (u64, u64, u64),
        part: u64,
        (m, n, k): (usize, usize, usize),
    ) -> Result<(), TensorError> {
        const OP: &str = "gemm_wf32";
        if !matches!(dtype, DType::BF16 | DType::F16) {
            return Err(TensorError::UnsupportedDType {
                op: OP,
                dtype,
                supported: "bf16, f16",
            });
        }
        if !Self::gemm_wf32_fits(m, n, k) || !aligned16(&[a, b, part]) {
            return Err(TensorError::InvalidArgument {
                op: OP,
                reason: format!("[{m}, {k}] · [{k}, {n}] does not fit the kernel or is unaligned"),
            });
        }
        let splits = self.gemm_wf32_splits(n, k);
        let k_per_split = k.div_ceil(STEP_K).div_ceil(splits) * STEP_K;
        let cfg = LaunchConfig {
            grid_dim: (splits as u32, n.div_ceil(BLOCK_COLS) as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: SHARED_BYTES as u32,
        };
        let (mu, nu, ku, kps) = (m as u32, n as u32, k as u64, k_per_split as u64);
        let sym = format!("gemm_wf32_{}", dtype.name());
        // SAFETY: `gemm_wf32_<dtype>(const unsigned short *a, const float *b, float *part, u32
        // m, u64 k, u32 n, u64 k_per_split)`; a holds m*k 16-bit elements, b k*n f32, part
        // splits*m*n f32 (the grid has `splits` columns of blocks, k_per_split * splits >= k,
        // a multiple of 32), all 16-byte aligned; m <= 128, k % 8 == 0, n % 4 == 0; blocks of
        // 256 threads as the kernel's launch bounds say, with the SHARED_BYTES of dynamic
        // shared memory its stages take (allowed at load: allow_shared).
        unsafe {
            launch!(self.stream, self.function(&sym)?, cfg; &a, &b, &part, &mu, &ku, &nu, &kps)
        }
        .map_err(driver(OP))?;
        let mn = m * n;
        let sym = format!("gemm_wf32_reduce_{}", dtype.name());
        let cfg = LaunchConfig {
            grid_dim: (mn.div_ceil(32) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: `gemm_wf32_reduce_<dtype>(const float *part, T *c, size_t mn, size_t
        // splits)`; part holds splits*mn f32, c holds mn elements of `dtype`; ceil(mn / 32)
        // blocks of 256 threads, as the kernel needs (mn <= 128 n fits the grid).
        unsafe { launch!(self.stream, self.function(&sym)?, cfg; &part, &c, &mn, &splits) }
            .map(drop)
            .map_err(driver(OP))
    }
}

#[cfg(test)]
mod tests {
    use super::Kernels;

    #[test]
    fn the_kernel_takes_the_shapes_its_loads_and_grid_allow() {
        for (m, n, k) in [(100, 128, 2_560_000), (1, 4, 8), (128, 260, 2056)] {
            assert!(Kernels::gemm_wf32_fits(m, n, k), "{m} {n} {k}");
        }
        let refused = [
            (0, 128, 64),
            (129, 128, 64),
            (16, 130, 64),
            (16, 0, 64),
            (16, 128, 1001),
            (16, 128, 0),
            (16, 128 * 65_536, 64),
        ];
        for (m, n, k) in refused {
            assert!(!Kernels::gemm_wf32_fits(m, n, k), "{m} {n} {k}");
        }
    }
}

//! Launchers of `kernels/gemm.cu`: the mixed-precision dense product `c = a · round(b)` (a and
//! c bf16 or f16, b f32) on tensor cores, and the f32 product `c = a · b` in 3xTF32 (full
//! fp32's), split over k into f32 partials, and their reduction.

use super::{Kernels, aligned16, driver};
use crate::{DType, TensorError};
use cudarc::driver::{LaunchConfig, PushKernelArg};

/// Rows of `a` a block holds in registers (two warps of 8 tiles of 8).
const MAX_ROWS: usize = 128;
/// Columns of `b` per block (4 warps of 32, twice: one per half of the rows).
const BLOCK_COLS: usize = 128;
/// Values of k per step of a block.
const STEP_K: usize = 32;
/// The split-K kernels and their dynamic shared memory: 3 stages of 17,408 bytes of b and
/// 128 rows of 32 k of a, 64 bytes a row of 16-bit a, 144 of f32 a (`GS_STAGES *
/// GemmStage<A>::bytes` in kernels/gemm.cu).
pub(super) const SHARED_KERNELS: [(&str, usize); 3] = [
    ("gemm_wf32_bf16", 3 * (17_408 + 128 * 64)),
    ("gemm_wf32_f16", 3 * (17_408 + 128 * 64)),
    ("gemm_wf32_f32x3", 3 * (17_408 + 128 * 144)),
];

/// Whether the split-K kernel's layout takes `[m, k] · [k, n]` with `a` of `dtype`:
/// `1 <= m <= 128`, `n % 4 == 0`, `k` a multiple of 16 bytes of `a` (8 for bf16 and f16, 4 for
/// f32: its 16-byte loads of a's rows and b's), and n's blocks of 128 columns within a grid's
/// 65,535 rows.
fn gemm_wf32_takes(dtype: DType, m: usize, n: usize, k: usize) -> bool {
    let rows_ok = (1..=MAX_ROWS).contains(&m);
    let cols_ok = n % 4 == 0 && n > 0 && n.div_ceil(BLOCK_COLS) <= 65_535;
    rows_ok && cols_ok && k % (16 / dtype.size_bytes()) == 0 && k > 0
}

/// The kernel of `a`'s dtype and its dynamic shared memory (none for another dtype).
fn kernel_of(dtype: DType) -> Option<(&'static str, usize)> {
    let name = match dtype {
        DType::BF16 => "gemm_wf32_bf16",
        DType::F16 => "gemm_wf32_f16",
        DType::F32 => "gemm_wf32_f32x3",
        _ => return None,
    };
    SHARED_KERNELS.into_iter().find(|k| k.0 == name)
}

impl Kernels {
    /// Whether [`Kernels::gemm_wf32`] takes `[m, k] · [k, n]` with `a` of `dtype` on this
    /// device: the layout's shapes (`1 <= m <= 128`, `n % 4 == 0`, `k` a multiple of 16 bytes
    /// of `a`) and the kernel's shared memory within what a block may have here (the f32
    /// kernel's 107,520 bytes are over the 101,376 of sm_86 and sm_89). A function of the
    /// shape and the device, so a plan made on it holds.
    pub(crate) fn gemm_wf32_fits(&self, dtype: DType, m: usize, n: usize, k: usize) -> bool {
        let shared_ok = kernel_of(dtype).is_some_and(|(_, bytes)| bytes <= self.shared_optin);
        shared_ok && gemm_wf32_takes(dtype, m, n, k)
    }

    /// How many splits of k `gemm_wf32` uses: two blocks per multiprocessor in all, at most
    /// one per 32 values of k. Its workspace is `splits * m * n` f32 partials.
    pub(crate) fn gemm_wf32_splits(&self, n: usize, k: usize) -> usize {
        let col_blocks = n.div_ceil(BLOCK_COLS);
        (2 * self.sms as usize)
            .div_ceil(col_blocks)
            .clamp(1, k.div_ceil(STEP_K).max(1))
    }

    /// `c [m, n] = a [m, k] · b [k, n]` with `b` rounded to `dtype` (bf16 or f16) as read, or
    /// for f32 in 3xTF32 (`gemm_wf32_f32x3`: each operand split into its TF32 rounding and the
    /// rounded rest, three mmas a product, small terms first; NVIDIA's 3xTF32, CUTLASS's
    /// `OpMultiplyAddFastF32`), for shapes where [`Kernels::gemm_wf32_fits`]: the split-K
    /// tensor-core kernel into `part` (a workspace of `gemm_wf32_splits(n, k) * m * n` f32),
    /// then the reduction into `c` (the splits added in order).
    ///
    /// # Errors
    /// [`TensorError::UnsupportedDType`] for another dtype; [`TensorError::InvalidArgument`]
    /// for unaligned operands or a shape that does not fit; driver errors.
    pub(crate) fn gemm_wf32(
        &self,
        dtype: DType,
        (a, b, c): (u64, u64, u64),
        part: u64,
        (m, n, k): (usize, usize, usize),
    ) -> Result<(), TensorError> {
        const OP: &str = "gemm_wf32";
        let Some((sym, shared)) = kernel_of(dtype) else {
            return Err(TensorError::UnsupportedDType {
                op: OP,
                dtype,
                supported: "bf16, f16, f32",
            });
        };
        if !self.gemm_wf32_fits(dtype, m, n, k) || !aligned16(&[a, b, part]) {
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
            shared_mem_bytes: shared as u32,
        };
        let (mu, nu, ku, kps) = (m as u32, n as u32, k as u64, k_per_split as u64);
        // SAFETY: `gemm_wf32_<kernel>(const T *a, const float *b, float *part, u32 m, u64 k,
        // u32 n, u64 k_per_split)`, T of `dtype`; a holds m*k elements of it, b k*n f32, part
        // splits*m*n f32 (the grid has `splits` columns of blocks, k_per_split * splits >= k,
        // a multiple of 32), all 16-byte aligned; m <= 128, k a multiple of 16 bytes of a,
        // n % 4 == 0; blocks of 256 threads as the kernel's launch bounds say, with the dynamic
        // shared memory its stages take (allowed at load: allow_shared).
        unsafe {
            launch!(self.stream, self.function(sym)?, cfg; &a, &b, &part, &mu, &ku, &nu, &kps)
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
    use super::{DType, SHARED_KERNELS, gemm_wf32_takes};

    #[test]
    fn the_kernel_takes_the_shapes_its_loads_and_grid_allow() {
        for (m, n, k) in [(100, 128, 2_560_000), (1, 4, 8), (128, 260, 2056)] {
            for dtype in [DType::BF16, DType::F16, DType::F32] {
                assert!(gemm_wf32_takes(dtype, m, n, k), "{m} {n} {k}");
            }
        }
        // f32 rows are 16 bytes at 4 values of k
        assert!(gemm_wf32_takes(DType::F32, 16, 128, 1004));
        assert!(!gemm_wf32_takes(DType::BF16, 16, 128, 1004));
        assert!(!gemm_wf32_takes(DType::F32, 16, 128, 1002));
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
            assert!(!gemm_wf32_takes(DType::BF16, m, n, k), "{m} {n} {k}");
        }
        // 3 stages of b's 17,408 bytes and a's 128 rows: 76,800 bytes, 107,520 for f32
        assert_eq!(SHARED_KERNELS.map(|k| k.1), [76_800, 76_800, 107_520]);
    }
}

//! The launcher of the bulk dense update (`kernels/dense_bulk.cu`'s `dense_adam_bulk_<dtype>`):
//! a dense layer's backward pass with Adam on its f32 weight in one pass, a batch of up to 128
//! rows on the tensor cores (bf16 and f16 products, TF32 for f32), the weight and its moments
//! streamed through shared memory by the bulk-copy engine (sm_90 and later). Not yet measured on
//! a device: [`crate::CudaBackend::set_dense_adam_bulk`] turns it on (off by default).

use super::dense::{DENSE_MAX_OUT, not_taken};
use super::{Kernels, aligned16, driver};
use crate::{AdamHyper, DType, TensorError};
use cudarc::driver::{LaunchConfig, PushKernelArg};

/// The largest batch of [`Kernels::dense_adam_bulk`]: one 16-row mma tile a warp for dx.
pub(crate) const DENSE_BULK_MAX_BATCH: usize = 128;
/// Warps per block of the bulk kernel (`DB_WARPS` in kernels/dense_bulk.cu).
const BULK_WARPS: usize = 8;
/// Weight rows of one tile of the bulk kernel (`DB_ROWS`).
const BULK_ROWS: usize = 16;
/// Pitch of a staged x segment, in elements (`Db<T>::XP`).
const BULK_XP: usize = 24;
/// How the bulk kernel loads x's tile segments (its `x_threads`): 1, every thread's 16-byte
/// `cp.async`, each thread arriving on the stage's mbarrier; 0, one bulk copy a batch row
/// (32 bytes of bf16 at a 16-row tile: many small copies for the copy engine).
const BULK_X_BY_THREADS: i32 = 1;
/// The most stages of the bulk kernel's pipeline (more buy no bandwidth) and the fewest (one
/// tile computed, one stored, one arriving).
const BULK_STAGES: std::ops::RangeInclusive<usize> = 3..=8;

/// Whether the bulk kernel's layout takes a batch of `m` rows of `dtype`, `n` outputs and `k`
/// inputs: 1 to 128 rows, `n` a multiple of 8 from 8 to 128 (its 8-column mma slices), `k` a
/// multiple of 16 bytes of `dtype` (each batch row's tile segment is a 16-byte bulk copy).
/// [`Kernels::dense_bulk_fits`] adds the device.
fn dense_bulk_apply(m: usize, n: usize, k: usize, dtype: DType) -> bool {
    (1..=DENSE_BULK_MAX_BATCH).contains(&m)
        && n % 8 == 0
        && (8..=DENSE_MAX_OUT).contains(&n)
        && (k * dtype.size_bytes()) % 16 == 0
}

/// The bulk kernel's shared memory for `m` rows of `dtype` and `n` outputs, in bytes: the fixed
/// part (dy staged as `[mp][n + 8]`, mp = m rounded up to 16; the tile's dw `[16][n + 8]` f32;
/// the old weight `[16][n + 8]`; elements of `dtype`'s size, TF32 words for f32) and one stage
/// (w, mu, nu `[16][n]` f32, x's segments `[mp][24]`, its 8-byte mbarrier).
const fn bulk_shared_bytes(m: usize, n: usize, elem: usize) -> (usize, usize) {
    let mp = m.next_multiple_of(16);
    let fixed = (mp + BULK_ROWS) * (n + 8) * elem + BULK_ROWS * (n + 8) * 4;
    let stage = 3 * BULK_ROWS * n * 4 + mp * BULK_XP * elem + 8;
    (fixed, stage)
}

/// The bulk kernel's stages within `optin` bytes of shared memory a block, with the bytes they
/// take: as many as fit up to 8, none under 3.
fn bulk_stages(m: usize, n: usize, elem: usize, optin: usize) -> Option<(usize, usize)> {
    let (fixed, stage) = bulk_shared_bytes(m, n, elem);
    let stages = optin.saturating_sub(fixed) / stage;
    (stages >= *BULK_STAGES.start()).then(|| {
        let stages = stages.min(*BULK_STAGES.end());
        (stages, fixed + stages * stage)
    })
}

/// Whether `symbol` is a bulk kernel (it takes up to the device's shared memory a block).
pub(super) fn is_bulk(symbol: &str) -> bool {
    symbol.starts_with("dense_adam_bulk_")
}

impl Kernels {
    /// Whether [`Kernels::dense_adam_bulk`] takes a batch of `m` rows of `dtype`, `n` outputs
    /// and `k` inputs on this device: [`dense_bulk_apply`], a device with the bulk-copy engine
    /// (sm_90 and later) and at least three stages within its shared memory a block (every
    /// shape on Hopper). A function of the shape and the device, so a plan made on it holds.
    pub(crate) fn dense_bulk_fits(&self, m: usize, n: usize, k: usize, dtype: DType) -> bool {
        self.bulk_copies
            && dense_bulk_apply(m, n, k, dtype)
            && bulk_stages(m, n, dtype.size_bytes(), self.shared_optin).is_some()
    }

    /// The same pass on the tensor cores (`kernels/dense_bulk.cu`'s `dense_adam_bulk_<dtype>`):
    /// x `[m, k]`, dy `[m, n]` and dx `[m, k]` (0: not computed; may be x) of `dtype`, dw and dx
    /// summed in f32 from bf16 or f16 products (exact) or TF32 ones (f32 operands rounded by
    /// `cvt.rna`), dx rounded to `dtype` once; Adam's exact step (`adam_one`) on `[w, mu, nu]`
    /// `[k, n]` f32. Every address 16-byte aligned (allocations are). For shapes where
    /// [`Kernels::dense_bulk_fits`] only (else an invalid-argument error); nothing to do for
    /// `k == 0`.
    pub(crate) fn dense_adam_bulk(
        &self,
        (x, dy, dx): (u64, u64, u64),
        [w, mu, nu]: [u64; 3],
        (m, n, k): (usize, usize, usize),
        dtype: DType,
        h: &AdamHyper,
    ) -> Result<(), TensorError> {
        const OP: &str = "dense_adam_bulk";
        let elem = dtype.size_bytes();
        let stages = bulk_stages(m, n, elem, self.shared_optin);
        let Some((stages, bytes)) = stages.filter(|_| self.dense_bulk_fits(m, n, k, dtype)) else {
            let takes = "1 to 128 rows, a multiple of 8 up to 128 outputs and inputs of a \
                         multiple of 16 bytes, on a device with bulk copies (sm_90)";
            return Err(not_taken(OP, m, n, takes));
        };
        if !aligned16(&[x, dy, w, mu, nu, dx]) {
            return Err(TensorError::InvalidArgument {
                op: OP,
                reason: "x, dy, dx, w, mu and nu must be 16-byte aligned".into(),
            });
        }
        if k == 0 {
            return Ok(());
        }
        let f = self.function(&format!("dense_adam_bulk_{}", dtype.name()))?;
        let cfg = LaunchConfig {
            grid_dim: (k.div_ceil(BULK_ROWS).min(self.sms as usize) as u32, 1, 1),
            block_dim: (32 * BULK_WARPS as u32, 1, 1),
            shared_mem_bytes: bytes as u32,
        };
        let (m32, n32, s32, xt) = (m as i32, n as i32, stages as i32, BULK_X_BY_THREADS);
        // SAFETY: `dense_adam_bulk_<dtype>(const T *x, const T *dy, float *w, float *mu, float
        // *nu, T *dx, AdamHyper h, int m, int n, size_t k, int stages, int x_threads)` with
        // blocks of exactly
        // DB_WARPS (8) warps and the dynamic shared memory of `stages` stages for these m, n
        // (bulk_shared_bytes mirrors the kernel's layout; allowed at load up to the device's
        // most: dense_bulk_fits); x holds m k elements of dtype, dy m n, w, mu, nu k n f32
        // each (the front end's shapes), dx m k or is null; every address 16-byte aligned and
        // k a multiple of 16 bytes, so every bulk copy's address and size are 16-byte
        // multiples; m, n <= 128 and stages <= 8 fit an int; AdamHyper's layout matches.
        unsafe {
            launch!(self.stream, f, cfg; &x, &dy, &w, &mu, &nu, &dx, h, &m32, &n32, &k, &s32, &xt)
                .map(drop)
        }
        .map_err(driver(OP))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernel_takes_the_shapes_its_layout_allows() {
        let bf16 = |m, n, k| dense_bulk_apply(m, n, k, DType::BF16);
        assert!(bf16(1, 8, 8) && bf16(100, 128, 2_560_000) && bf16(128, 64, 16));
        assert!(!bf16(0, 8, 8) && !bf16(129, 128, 8) && !bf16(100, 124, 8));
        assert!(!bf16(100, 136, 8) && !bf16(100, 0, 8) && !bf16(100, 128, 12));
        // f32 x segments are 16 bytes every 4 inputs
        assert!(dense_bulk_apply(100, 128, 12, DType::F32));
        assert!(!dense_bulk_apply(100, 128, 10, DType::F32));
        // the seed's batch 100 in bf16: dy [112][136] and the old weight [16][136] of 2 bytes,
        // dw [16][136] f32; a stage: 3 x 16 x 128 f32, x [112][24] of 2 bytes, a mbarrier
        let (fixed, stage) = bulk_shared_bytes(100, 128, 2);
        assert_eq!(fixed, (112 + 16) * 136 * 2 + 16 * 136 * 4);
        assert_eq!(stage, 3 * 16 * 128 * 4 + 112 * 24 * 2 + 8);
        // Hopper's 232,448 bytes a block hold 6 stages of it (43,520 + 6 x 29,960), of f32 at
        // batch 100 4, at 128 rows 3; 99 KiB a block (sm_86, sm_89) 3 of 16 bf16 rows
        assert_eq!(
            bulk_stages(100, 128, 2, 232_448),
            Some((6, 43_520 + 6 * 29_960))
        );
        assert_eq!(bulk_stages(100, 128, 4, 232_448).map(|s| s.0), Some(4));
        assert_eq!(bulk_stages(128, 128, 4, 232_448).map(|s| s.0), Some(3));
        assert_eq!(bulk_stages(1, 8, 2, 232_448).map(|s| s.0), Some(8));
        assert_eq!(bulk_stages(16, 128, 2, 101_376).map(|s| s.0), Some(3));
        assert!(bulk_stages(16, 128, 4, 101_376).is_none());
        assert!(is_bulk("dense_adam_bulk_bf16") && !is_bulk("dense_adam_rows_m3"));
    }
}

//! Launchers of the dense update's kernels. The one-pass kernels: a dense layer's backward pass
//! with Adam on its f32 weight, in which the weight and its moments cross memory once and the
//! weight gradient never does. `dense_adam_rows_m<m>` (`kernels/adam.cu`) takes a small batch in f32
//! FMAs (exact f32, any precision); `dense_adam_mma_mb<mb>` (`kernels/dense_mma.cu`) a batch of
//! up to 128 rows on the TF32 tensor cores (`Precision::Tf32` only). And, for the update by
//! chunks under `Precision::Highest`, `dense_grads_x3_mb<mb>` (`kernels/dense_mma.cu`): a
//! chunk's weight and input gradients in 3xTF32.

use super::source::KernelModule;
use super::{Kernels, aligned16, driver};
use crate::{AdamHyper, TensorError};
use cudarc::driver::{LaunchConfig, PushKernelArg};

/// The largest batch (rows of x) of [`Kernels::dense_adam_rows`]: dy's rows live in registers.
pub(crate) const DENSE_ROWS_MAX_BATCH: usize = 16;
/// The most output features of both one-pass kernels: four columns a lane, or 16 slices of 8.
pub(crate) const DENSE_MAX_OUT: usize = 128;
/// The largest batch of [`Kernels::dense_adam_mma`]: 16 mma steps of 8 rows.
pub(crate) const DENSE_MMA_MAX_BATCH: usize = 128;
/// Warps per block of the tensor-core kernel (`DM_WARPS` in kernels/dense_mma.cu).
const MMA_WARPS: usize = 8;
/// Shared-memory words of a warp's two stages of w, mu and nu (`2 DM_STAGE`: 3 arrays of 16
/// rows of 32 columns, 40 words apart).
const MMA_STAGE_WORDS: usize = 2 * 3 * 16 * 40;

/// Warps per block of the 3xTF32 gradients kernel (`DG_WARPS` in kernels/dense_mma.cu).
const GRADS_WARPS: usize = 8;

/// Whether [`Kernels::dense_adam_rows`] takes a batch of `m` rows and `n` outputs.
pub(crate) fn dense_rows_apply(m: usize, n: usize) -> bool {
    (1..=DENSE_ROWS_MAX_BATCH).contains(&m) && n <= DENSE_MAX_OUT
}

/// Whether the tensor-core kernel's layout takes a batch of `m` rows and `n` outputs: past the
/// rows kernel's batches up to 128 rows, `n` a multiple of 8 (its 8-column slices, and 16-byte
/// copies of a row's columns) from 8 to 128. [`Kernels::dense_mma_fits`] adds the device's
/// shared memory.
fn dense_mma_apply(m: usize, n: usize) -> bool {
    (DENSE_ROWS_MAX_BATCH + 1..=DENSE_MMA_MAX_BATCH).contains(&m)
        && n % 8 == 0
        && (8..=DENSE_MAX_OUT).contains(&n)
}

/// The tensor-core kernel's dynamic shared memory for `m` rows and `n` outputs, in bytes: each
/// warp's two stages, then dy rounded to TF32, `[8 ceil(m / 8)][roundup(n, 32) + 8]` words. One
/// block fits a multiprocessor (its 8 warps hide the latencies with up to 255 registers each).
const fn mma_shared_bytes(m: usize, n: usize) -> usize {
    4 * (MMA_WARPS * MMA_STAGE_WORDS + 8 * m.div_ceil(8) * (n.next_multiple_of(32) + 8))
}

/// The most dynamic shared memory a tensor-core kernel takes (128 rows, 128 outputs: 192,512
/// bytes), allowed once at load.
pub(super) const MMA_SHARED_MAX: usize = mma_shared_bytes(DENSE_MMA_MAX_BATCH, DENSE_MAX_OUT);

/// Whether the 3xTF32 gradients kernel's layout takes a batch of `m` rows and `n` outputs: 1
/// to 128 rows (16 mma steps of 8), `n` a multiple of 8 (its 8-column slices) from 8 to 128.
/// [`Kernels::dense_grads_x3_fits`] adds the device's shared memory.
fn dense_grads_x3_apply(m: usize, n: usize) -> bool {
    (1..=DENSE_MMA_MAX_BATCH).contains(&m) && n % 8 == 0 && (8..=DENSE_MAX_OUT).contains(&n)
}

/// The 3xTF32 gradients kernel's dynamic shared memory for `m` rows and `n` outputs, in bytes:
/// dy's TF32 rounding and rounded rest, `[8 ceil(m / 8)][roundup(n, 32) + 8]` words each (at
/// most 139,264 bytes). Two blocks share a Hopper multiprocessor (233,472 bytes, 1 KiB
/// reserved a block) up to 115,712 bytes: 104 rows into more than 96 outputs (the seed's batch
/// 100); past that, one.
const fn grads_x3_shared_bytes(m: usize, n: usize) -> usize {
    2 * 4 * 8 * m.div_ceil(8) * (n.next_multiple_of(32) + 8)
}

/// The dense kernels `module` defines: `adam.cu`'s `dense_adam_rows_m1..16` and
/// `dense_adam_rows_tf32_m1..16`, `dense_mma.cu`'s `dense_adam_mma_mb3..16` and
/// `dense_grads_x3_mb1..16`.
pub(super) fn symbols(module: KernelModule) -> Vec<String> {
    match module {
        KernelModule::Adam => ["rows", "rows_tf32"]
            .iter()
            .flat_map(|kind| {
                (1..=DENSE_ROWS_MAX_BATCH).map(move |m| format!("dense_adam_{kind}_m{m}"))
            })
            .collect(),
        KernelModule::DenseMma => (DENSE_ROWS_MAX_BATCH.div_ceil(8) + 1..=DENSE_MMA_MAX_BATCH / 8)
            .map(|mb| format!("dense_adam_mma_mb{mb}"))
            .chain((1..=DENSE_MMA_MAX_BATCH / 8).map(|mb| format!("dense_grads_x3_mb{mb}")))
            .collect(),
        _ => Vec::new(),
    }
}

/// Whether `symbol` is one of `dense_mma.cu`'s tensor-core kernels (each takes
/// [`MMA_SHARED_MAX`] at most).
pub(super) fn is_mma(symbol: &str) -> bool {
    symbol.starts_with("dense_adam_mma_") || symbol.starts_with("dense_grads_x3_")
}

/// The error of a launcher given a shape its kernel does not take.
fn not_taken(op: &'static str, m: usize, n: usize, takes: &str) -> TensorError {
    TensorError::InvalidArgument {
        op,
        reason: format!("a batch of {m} rows and {n} outputs: it takes {takes}"),
    }
}

impl Kernels {
    /// Whether [`Kernels::dense_adam_mma`] takes a batch of `m` rows and `n` outputs on this
    /// device: [`dense_mma_apply`], and the shared memory it takes is within what a block may
    /// have here (all shapes on Hopper; on the A100's 163 KiB up to 80 rows into 128 outputs;
    /// none on 99 KiB devices). A function of the shape and the device, so a plan made on it
    /// holds.
    pub(crate) fn dense_mma_fits(&self, m: usize, n: usize) -> bool {
        dense_mma_apply(m, n) && mma_shared_bytes(m, n) <= self.shared_optin
    }

    /// A dense layer's backward pass with Adam on its f32 weight in one pass over the weight
    /// (`kernels/adam.cu`'s `dense_adam_rows_m<m>`): x `[m, k]`, dy `[m, n]`, `[w, mu, nu]`
    /// `[k, n]` updated in place, dx `[m, k]` (0: not computed; may be x). Any alignment. dw and
    /// dx are exact f32 sums; with `fast` (under TF32) Adam's step is `adam_tf32`'s
    /// (`dense_adam_rows_tf32_m<m>`: contractions and a fast division, within a few ulp of the
    /// IEEE-rounded `adam_one`, as the tensor-core pass takes it).
    /// For `1 <= m <=` [`DENSE_ROWS_MAX_BATCH`] and `n <=` [`DENSE_MAX_OUT`] only (else an
    /// invalid-argument error); nothing to do for `k == 0`.
    pub(crate) fn dense_adam_rows(
        &self,
        (x, dy, dx): (u64, u64, u64),
        [w, mu, nu]: [u64; 3],
        (m, n, k): (usize, usize, usize),
        h: &AdamHyper,
        fast: bool,
    ) -> Result<(), TensorError> {
        if !dense_rows_apply(m, n) {
            return Err(not_taken(
                "dense_adam_rows",
                m,
                n,
                "1 to 16 rows and at most 128 outputs",
            ));
        }
        if k == 0 {
            return Ok(());
        }
        let symbol = format!("dense_adam_rows{}_m{m}", if fast { "_tf32" } else { "" });
        let f = self.function(&symbol)?;
        const WARPS: usize = 4;
        let blocks = k.div_ceil(32 * WARPS).clamp(1, self.max_blocks as usize) as u32;
        let cfg = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (32 * WARPS as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let n32 = n as i32;
        // SAFETY: `dense_adam_rows_m<m>(const float *x, const float *dy, float *w, float *mu,
        // float *nu, float *dx, AdamHyper h, int n, size_t k)` with blocks of 4 warps (its
        // shared arrays' size); x holds m k floats, dy m n, w, mu, nu k n each (the front
        // end's shapes), dx m k or is null; n <= 128 fits an int; AdamHyper's layout matches.
        unsafe { launch!(self.stream, f, cfg; &x, &dy, &w, &mu, &nu, &dx, h, &n32, &k).map(drop) }
            .map_err(driver("dense_adam_rows"))
    }

    /// The same pass on the TF32 tensor cores (`kernels/dense_mma.cu`'s
    /// `dense_adam_mma_mb<mb>`, mb = ceil(m / 8)): dw and dx from operands rounded to TF32 and
    /// summed in f32, Adam's step in f32 with a fast division (`adam_tf32`: within a few ulp of
    /// `adam_one`'s). `[w, mu, nu]` 16-byte aligned (its 16-byte copies; allocations are). For
    /// shapes where [`Kernels::dense_mma_fits`] only (else an invalid-argument error); nothing to
    /// do for `k == 0`.
    pub(crate) fn dense_adam_mma(
        &self,
        (x, dy, dx): (u64, u64, u64),
        [w, mu, nu]: [u64; 3],
        (m, n, k): (usize, usize, usize),
        h: &AdamHyper,
    ) -> Result<(), TensorError> {
        if !self.dense_mma_fits(m, n) {
            let takes = "17 to 128 rows and a multiple of 8 up to 128 outputs, within the \
                         device's shared memory a block";
            return Err(not_taken("dense_adam_mma", m, n, takes));
        }
        if !aligned16(&[w, mu, nu]) {
            return Err(TensorError::InvalidArgument {
                op: "dense_adam_mma",
                reason: "w, mu and nu must be 16-byte aligned".into(),
            });
        }
        if k == 0 {
            return Ok(());
        }
        let f = self.function(&format!("dense_adam_mma_mb{}", m.div_ceil(8)))?;
        let strips = k.div_ceil(16);
        let most = self.sms as usize;
        let cfg = LaunchConfig {
            grid_dim: (strips.div_ceil(MMA_WARPS).clamp(1, most) as u32, 1, 1),
            block_dim: (32 * MMA_WARPS as u32, 1, 1),
            shared_mem_bytes: mma_shared_bytes(m, n) as u32,
        };
        let (m32, n32) = (m as i32, n as i32);
        // SAFETY: `dense_adam_mma_mb<mb>(const float *x, const float *dy, float *w, float *mu,
        // float *nu, float *dx, AdamHyper h, int m, int n, size_t k)` with blocks of exactly
        // DM_WARPS (8) warps (each warp's stages are its slice of the shared memory) and the
        // dynamic shared memory its stages and staged dy take for 8 mb >= m rows (allowed at
        // load up to this size: dense_mma_fits); x holds m k floats, dy m n, w, mu, nu k n each
        // (the front end's shapes; 16-byte aligned, n a multiple of 8, so every 16-byte copy of
        // a row's columns is aligned), dx m k or is null; m, n <= 128 fit an int; AdamHyper's
        // layout matches.
        unsafe {
            launch!(self.stream, f, cfg; &x, &dy, &w, &mu, &nu, &dx, h, &m32, &n32, &k).map(drop)
        }
        .map_err(driver("dense_adam_mma"))
    }
    /// Whether [`Kernels::dense_grads_x3`] takes a batch of `m` rows and `n` outputs on this
    /// device: 1 to 128 rows, `n` a multiple of 8 up to 128, within the shared memory a block
    /// may have here (every such shape on Hopper and the A100; on 99 KiB devices, sm_86 and
    /// sm_89, up to 88 rows into more than 96 outputs). A function of the shape and the device,
    /// so a plan made on it holds.
    pub(crate) fn dense_grads_x3_fits(&self, m: usize, n: usize) -> bool {
        dense_grads_x3_apply(m, n) && grads_x3_shared_bytes(m, n) <= self.shared_optin
    }

    /// Full fp32's dense gradients of a chunk of `rows` weight rows in 3xTF32
    /// (`kernels/dense_mma.cu`'s `dense_grads_x3_mb<mb>`, mb = ceil(m / 8)): `g = x[:, chunk]ᵀ
    /// · dy` (`[rows, n]`, written) and, unless `dx` is 0, `dx[:, chunk] = dy · wᵀ` from the
    /// chunk's weight `w` (`[rows, n]`), each operand split into its TF32 rounding and the
    /// rounded rest, three mmas a product, f32 sums (f32's accuracy). x and dx are `[m, ldx]`
    /// with the chunk's first column at their addresses; dx may be x. `w` and `g` 8-byte
    /// aligned (float2 accesses). For shapes where [`Kernels::dense_grads_x3_fits`] only (else
    /// an invalid-argument error); nothing to do for no rows.
    pub(crate) fn dense_grads_x3(
        &self,
        (x, dy, w): (u64, u64, u64),
        (g, dx): (u64, u64),
        (m, n, rows, ldx): (usize, usize, usize, usize),
    ) -> Result<(), TensorError> {
        if !self.dense_grads_x3_fits(m, n) {
            let takes = "1 to 128 rows and a multiple of 8 up to 128 outputs";
            return Err(not_taken("dense_grads_x3", m, n, takes));
        }
        if w % 8 != 0 || g % 8 != 0 {
            return Err(TensorError::InvalidArgument {
                op: "dense_grads_x3",
                reason: "w and g must be 8-byte aligned".into(),
            });
        }
        if rows == 0 {
            return Ok(());
        }
        let f = self.function(&format!("dense_grads_x3_mb{}", m.div_ceil(8)))?;
        let strips = rows.div_ceil(16);
        let most = 2 * self.sms as usize;
        let cfg = LaunchConfig {
            grid_dim: (strips.div_ceil(GRADS_WARPS).clamp(1, most) as u32, 1, 1),
            block_dim: (32 * GRADS_WARPS as u32, 1, 1),
            shared_mem_bytes: grads_x3_shared_bytes(m, n) as u32,
        };
        let (m32, n32) = (m as i32, n as i32);
        // SAFETY: `dense_grads_x3_mb<mb>(const float *x, const float *dy, const float *w,
        // float *g, float *dx, int m, int n, size_t rows, size_t ldx)` with blocks of DG_WARPS
        // (8) warps and the dynamic shared memory its staged dy takes for 8 mb >= m rows
        // (allowed at load up to MMA_SHARED_MAX >= this: dense_grads_x3_fits); x and dx are
        // m rows ldx floats apart, each with the chunk's `rows` columns from the address (all
        // the kernel touches); dy m n floats, w and g rows n (8-byte aligned, n even: aligned
        // float2s); m, n <= 128 fit an int.
        unsafe {
            launch!(self.stream, f, cfg; &x, &dy, &w, &g, &dx, &m32, &n32, &rows, &ldx).map(drop)
        }
        .map_err(driver("dense_grads_x3"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernels_take_the_shapes_their_layouts_allow() {
        assert!(dense_rows_apply(16, 128) && !dense_rows_apply(17, 128));
        assert!(!dense_rows_apply(0, 1) && !dense_rows_apply(1, 129));
        assert!(dense_mma_apply(17, 128) && dense_mma_apply(100, 8) && dense_mma_apply(128, 64));
        assert!(!dense_mma_apply(16, 128) && !dense_mma_apply(129, 128));
        assert!(!dense_mma_apply(100, 120 + 4) && !dense_mma_apply(100, 136));
        assert!(!dense_mma_apply(100, 0));
        // the seed's batch 100: 8 warps' 2 stages of 3 x 16 x 40 words, then 13 steps of 8 rows
        // of 128 + 8 words (the 179,456 bytes the harness launched)
        assert_eq!(mma_shared_bytes(100, 128), 4 * (8 * 3840 + 104 * 136));
        assert_eq!(mma_shared_bytes(100, 128), 179_456);
        assert_eq!(mma_shared_bytes(17, 8), 4 * (8 * 3840 + 24 * 40));
        assert_eq!(mma_shared_bytes(128, 128), MMA_SHARED_MAX);
        // within the A100's 166,912 bytes a block up to 80 rows into 128 outputs; the stages
        // alone (122,880 bytes) are over the 101,376 of sm_86 and sm_89
        assert!(mma_shared_bytes(80, 128) <= 166_912 && mma_shared_bytes(81, 128) > 166_912);
        assert!(mma_shared_bytes(17, 8) > 101_376);
        let rows = symbols(KernelModule::Adam);
        assert_eq!(rows.len(), 32);
        assert_eq!(
            (rows[0].as_str(), rows[16].as_str()),
            ("dense_adam_rows_m1", "dense_adam_rows_tf32_m1")
        );
        let mma = symbols(KernelModule::DenseMma);
        assert_eq!(mma.len(), 14 + 16);
        assert_eq!(mma[0], "dense_adam_mma_mb3");
        assert_eq!(mma[13], "dense_adam_mma_mb16");
        assert_eq!(mma[14], "dense_grads_x3_mb1");
        assert_eq!(mma.last().unwrap(), "dense_grads_x3_mb16");
        assert!(mma.iter().all(|s| is_mma(s)));
        assert!(symbols(KernelModule::Norm).is_empty());
    }

    #[test]
    fn the_3xtf32_gradients_kernel_takes_its_shapes_within_the_shared_memory() {
        assert!(dense_grads_x3_apply(1, 8) && dense_grads_x3_apply(100, 128));
        assert!(dense_grads_x3_apply(128, 120) && !dense_grads_x3_apply(129, 128));
        assert!(!dense_grads_x3_apply(0, 8) && !dense_grads_x3_apply(100, 124));
        assert!(!dense_grads_x3_apply(100, 136) && !dense_grads_x3_apply(100, 0));
        // the seed at batch 100: 13 steps of 8 rows of 128 + 8 words, twice
        assert_eq!(grads_x3_shared_bytes(100, 128), 2 * 4 * 104 * 136);
        assert_eq!(grads_x3_shared_bytes(128, 128), 139_264);
        assert!(grads_x3_shared_bytes(128, 128) <= MMA_SHARED_MAX);
        // two blocks within Hopper's 233,472 bytes a multiprocessor (1 KiB reserved a block) up
        // to 104 rows into 128 outputs; one past that
        assert!(2 * (grads_x3_shared_bytes(104, 128) + 1024) <= 233_472);
        assert!(2 * (grads_x3_shared_bytes(105, 128) + 1024) > 233_472);
        // the 101,376 bytes a block of sm_86 and sm_89: 88 rows into 128 outputs, not 89
        assert!(grads_x3_shared_bytes(88, 128) <= 101_376);
        assert!(grads_x3_shared_bytes(89, 128) > 101_376);
        assert_eq!(grads_x3_shared_bytes(1, 8), 2 * 4 * 8 * 40);
    }
}

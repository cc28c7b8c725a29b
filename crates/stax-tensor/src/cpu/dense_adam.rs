//! A dense layer's backward pass with Adam on its weight, chunk by chunk (see
//! [`crate::ops::dense_adam`]): the chunk of `dw` lives in the one workspace buffer, so the
//! whole weight gradient never exists.

use super::conv::floats;
use super::matmul::{MatMut, MatRef, gemm};
use super::{CpuBackend, adam, data, data_mut};
use crate::backend::{Call, DenseAdam, DenseDx, Scratch};
use crate::{Backend, OpDesc, TensorError, dense_chunk_rows};

const OP: &str = "dense_adam";

/// Chunk rows of the weight the CPU processes at a time: its workspace bound of gradient.
pub(super) fn chunk_rows(be: &CpuBackend, k: usize, n: usize) -> usize {
    dense_chunk_rows(k, n, be.workspace_bytes)
}

/// See the module docs. Nothing is written when the workspace cannot be had.
pub(super) fn dense_adam(be: &CpuBackend, c: DenseAdam<'_>) -> Result<(), TensorError> {
    let desc = c.desc();
    let OpDesc::DenseAdam { m, n, k } = desc else {
        unreachable!("DenseAdam describes itself as OpDesc::DenseAdam")
    };
    let mut ws = Scratch::new(OP, be.allocator(), be.workspace_schedule(&desc)?);
    let buffer = (k > 0 && n > 0).then(|| ws.alloc()).transpose()?;
    let DenseAdam {
        x,
        dy,
        w,
        mu,
        nu,
        dx,
        h,
    } = c;
    let dy = data(OP, dy)?;
    let (w, mu, nu) = (data_mut(OP, w)?, data_mut(OP, mu)?, data_mut(OP, nu)?);
    // x is written only in place (then it is solely owned: checked by the front end)
    let (mut xs, mut into) = match dx {
        DenseDx::InPlace => (X::Write(data_mut(OP, x)?), None),
        DenseDx::Into(t) => (X::Read(data(OP, x)?), Some(data_mut(OP, t)?)),
        DenseDx::Skip => (X::Read(data(OP, x)?), None),
    };
    let rows = chunk_rows(be, k, n).max(1);
    for r0 in (0..k).step_by(rows) {
        let r = rows.min(k - r0);
        let g = match buffer {
            Some(i) => &mut floats(ws.host_mut(i)?)?[..r * n],
            None => &mut [][..],
        };
        // dw_chunk [r, n] = x[:, r0..r0 + r]ᵀ · dy
        let xc = MatRef::strided(&xs.read()[r0..], m, r, (k, 1)).t();
        gemm(
            OP,
            1.0,
            xc,
            MatRef::row_major(dy, m, n),
            0.0,
            MatMut::row_major(g, r, n),
        )?;
        // dx[:, r0..r0 + r] = dy · w_chunkᵀ, from the old weight
        let wc = MatRef::row_major(&w[r0 * n..(r0 + r) * n], r, n).t();
        let target = match (&mut into, &mut xs) {
            (Some(d), _) => Some(&mut d[r0..]),
            (None, X::Write(x)) => Some(&mut x[r0..]),
            (None, X::Read(_)) => None,
        };
        if let Some(t) = target {
            gemm(
                OP,
                1.0,
                MatRef::row_major(dy, m, n),
                wc,
                0.0,
                MatMut::strided(t, m, r, (k, 1)),
            )?;
        }
        let span = r0 * n..(r0 + r) * n;
        adam::step(
            &mut w[span.clone()],
            g,
            &mut mu[span.clone()],
            &mut nu[span],
            &h,
        );
    }
    if let Some(i) = buffer {
        ws.free(i)?;
    }
    ws.finish()
}

/// The layer input: read, or read then overwritten by `dx` chunk by chunk.
enum X<'a> {
    Read(&'a [f32]),
    Write(&'a mut [f32]),
}

impl X<'_> {
    fn read(&self) -> &[f32] {
        match self {
            X::Read(x) => x,
            X::Write(x) => x,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{assert_close, backend_with_workspace, random_vec, rng, tensor};
    use crate::backend::DenseDx;
    use crate::{AdamHyper, Backend, Tensor, TensorError, ops};
    use std::sync::Arc;

    fn hyper() -> AdamHyper {
        let (b1, b2, t) = (0.9f32, 0.999f32, 3);
        AdamHyper {
            lr: 1e-2,
            b1,
            b2,
            eps: 1e-8,
            eps_root: 0.0,
            bias_correction1: 1.0 - b1.powi(t),
            bias_correction2: 1.0 - b2.powi(t),
            grad_scale: 1.0,
        }
    }

    /// x [m, k], dy [m, n], w, mu (random), nu (random, positive) [k, n].
    fn operands(be: &Arc<dyn Backend>, (m, n, k): (usize, usize, usize), seed: u64) -> [Tensor; 5] {
        let mut r = rng(seed);
        let nu: Vec<f32> = random_vec(&mut r, k * n).iter().map(|v| v.abs()).collect();
        [
            tensor(be, &random_vec(&mut r, m * k), [m, k]),
            tensor(be, &random_vec(&mut r, m * n), [m, n]),
            tensor(be, &random_vec(&mut r, k * n), [k, n]),
            tensor(be, &random_vec(&mut r, k * n), [k, n]),
            tensor(be, &nu, [k, n]),
        ]
    }

    /// The unfused reference: dw = xᵀ·dy, dx = dy·wᵀ, then Adam with dw.
    fn unfused(
        be: &Arc<dyn Backend>,
        [x, dy, mut w, mut mu, mut nu]: [Tensor; 5],
    ) -> [Vec<f32>; 4] {
        let (m, k, n) = (x.dims()[0], x.dims()[1], dy.dims()[1]);
        let mut dw = tensor(be, &vec![0.0; k * n], [k, n]);
        let mut dx = tensor(be, &vec![0.0; m * k], [m, k]);
        ops::matmul(&x, &dy, true, false, &mut dw).unwrap();
        ops::matmul(&dy, &w, false, true, &mut dx).unwrap();
        ops::adam(&mut w, &dw, &mut mu, &mut nu, &hyper()).unwrap();
        [dx, w, mu, nu].map(|t| t.to_vec().unwrap())
    }

    /// Chunks of 64 rows, a last partial chunk, each way of writing dx: equal to matmul then
    /// adam.
    #[test]
    fn fused_equals_matmul_then_adam_over_partial_chunks() {
        // room for 64 rows of 3 columns: k = 150 is 64 + 64 + 22 rows
        let be = backend_with_workspace(64 * 3 * 4);
        for (dims, mode) in [
            ((5, 3, 150), 0),
            ((5, 3, 150), 1),
            ((1, 3, 150), 2),
            ((4, 7, 9), 0),
        ] {
            let want = unfused(&be, operands(&be, dims, 11));
            let [mut x, dy, mut w, mut mu, mut nu] = operands(&be, dims, 11);
            let mut into = tensor(&be, &vec![f32::NAN; dims.0 * dims.2], [dims.0, dims.2]);
            let dx = match mode {
                0 => DenseDx::InPlace,
                1 => DenseDx::Into(&mut into),
                _ => DenseDx::Skip,
            };
            ops::dense_adam(&mut x, &dy, &mut w, &mut mu, &mut nu, dx, &hyper()).unwrap();
            let got_dx = if mode == 1 { into.to_vec() } else { x.to_vec() }.unwrap();
            if mode != 2 {
                assert_close(&got_dx, &want[0], 1e-6, 1e-7, "dx");
            }
            for (t, (want, what)) in [w, mu, nu]
                .iter()
                .zip(want[1..].iter().zip(["w", "mu", "nu"]))
            {
                assert_close(&t.to_vec().unwrap(), want, 1e-6, 1e-7, what);
            }
        }
    }

    /// Bad operands are typed errors and nothing is written.
    #[test]
    fn bad_operands_are_errors_and_change_nothing() {
        let be = backend_with_workspace(1 << 20);
        let [mut x, dy, mut w, mut mu, nu] = operands(&be, (4, 3, 10), 5);
        let before = w.to_vec().unwrap();
        let shared = nu.clone();
        let mut nu2 = nu;
        let e = ops::dense_adam(
            &mut x,
            &dy,
            &mut w,
            &mut mu,
            &mut nu2,
            DenseDx::InPlace,
            &hyper(),
        );
        assert!(matches!(e, Err(TensorError::Aliased { .. })), "{e:?}");
        drop(shared);
        let mut short = tensor(&be, &[0.0; 6], [2, 3]);
        let e = ops::dense_adam(
            &mut x,
            &short.clone(),
            &mut w,
            &mut mu,
            &mut nu2,
            DenseDx::Skip,
            &hyper(),
        );
        assert!(matches!(e, Err(TensorError::Shape { .. })), "{e:?}");
        let e = ops::dense_adam(
            &mut x,
            &dy,
            &mut short,
            &mut mu,
            &mut nu2,
            DenseDx::Skip,
            &hyper(),
        );
        assert!(matches!(e, Err(TensorError::Shape { .. })), "{e:?}");
        let mut flat = tensor(&be, &[0.0; 40], [40]);
        let e = ops::dense_adam(
            &mut flat,
            &dy,
            &mut w,
            &mut mu,
            &mut nu2,
            DenseDx::Skip,
            &hyper(),
        );
        assert!(matches!(e, Err(TensorError::Shape { .. })), "{e:?}");
        let bad = AdamHyper {
            bias_correction1: 0.0,
            ..hyper()
        };
        let e = ops::dense_adam(&mut x, &dy, &mut w, &mut mu, &mut nu2, DenseDx::Skip, &bad);
        assert!(
            matches!(e, Err(TensorError::InvalidArgument { .. })),
            "{e:?}"
        );
        assert_eq!(w.to_vec().unwrap(), before);
    }
}

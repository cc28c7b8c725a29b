//! The fused, in-place Adam step on the host.
//!
//! Mirrors `optax.adam` = `scale_by_adam` then `scale_by_learning_rate` (Algorithm 1 of
//! Kingma & Ba 2014, `eps` outside the square root), operation for operation in f32:
//! `m = (1 - b1) g + b1 m`, `v = (1 - b2) g² + b2 v` (optax's `update_moment` and
//! `update_moment_per_elem_norm`), `m̂ = m / (1 - b1^t)`, `v̂ = v / (1 - b2^t)`,
//! `p = p + (-lr) · m̂ / (sqrt(v̂ + eps_root) + eps)` (`apply_updates`). The caller passes the
//! bias corrections in [`AdamHyper`].

use super::data_mut;
use super::elementwise::not_float;
use super::host::{view, view_mut, words_mut};
use crate::backend::{Adam, AllFinite};
use crate::{AdamHyper, Float, TensorError, with_float};

const OP: &str = "adam_update";

/// One Adam step in place: reads `p`, `g`, `m`, `v` (all the same shape; `p`, `v` f32, `g`
/// any float dtype, read as f32 and multiplied by `h.grad_scale`, `m` any float dtype: optax's
/// `mu_dtype`, read as f32 and rounded once when written) and writes `p`, `m`, `v` (see the
/// module doc for the formula).
///
/// Nothing is written when an error is returned.
///
/// # Errors
/// [`TensorError::Shape`] if the shapes differ, [`TensorError::InvalidArgument`] for a
/// non-finite hyper-parameter or a bias correction `<= 0`, [`TensorError::Aliased`] if `p`, `m`
/// or `v` shares its buffer; dtype and device errors.
pub(crate) fn adam_update(c: Adam<'_>) -> Result<(), TensorError> {
    let Adam { p, g, m, v, h } = c;
    let (gd, md) = (g.dtype(), m.dtype());
    let (p, v) = (data_mut(OP, p)?, data_mut(OP, v)?);
    with_float!(gd, G => with_float!(md, M => {
        step(p, view::<G>(OP, g)?, view_mut::<M>(OP, m)?, v, &h);
        Ok(())
    }, Err(not_float(OP, md))), Err(not_float(OP, gd)))
}

/// The Adam step of the module doc over equal-length slices, the gradient read as f32 (times
/// `h.grad_scale`), the first moment read as f32 and rounded to `M` once written.
pub(crate) fn step<G: Float, M: Float>(
    p: &mut [f32],
    g: &[G],
    m: &mut [M],
    v: &mut [f32],
    h: &AdamHyper,
) {
    let lr = -h.lr;
    for (((p, g), m), v) in p.iter_mut().zip(g).zip(m.iter_mut()).zip(v.iter_mut()) {
        let g = g.to_f32() * h.grad_scale;
        let mi = (1.0 - h.b1) * g + h.b1 * m.to_f32();
        *v = (1.0 - h.b2) * (g * g) + h.b2 * *v;
        // optax computes the update from the f32 moment, then stores it in mu_dtype
        *m = M::from_f32(mi);
        let m_hat = mi / h.bias_correction1;
        let v_hat = *v / h.bias_correction2;
        *p += lr * (m_hat / ((v_hat + h.eps_root).sqrt() + h.eps));
    }
}

/// `nonfinite[0] = 1` when an element of `x` is NaN or infinite (see [`crate::ops::all_finite`]).
pub(crate) fn all_finite(c: AllFinite<'_>) -> Result<(), TensorError> {
    const OP: &str = "all_finite";
    let AllFinite { x, nonfinite } = c;
    let dtype = x.dtype();
    let finite = with_float!(dtype, T => view::<T>(OP, x)?.iter().all(|v| v.to_f32().is_finite()),
        return Err(not_float(OP, dtype)));
    if !finite {
        words_mut(OP, nonfinite)?.fill(1);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::testing::{assert_close, backend, tensor};
    use crate::ops;
    use crate::{AdamHyper, TensorError};

    fn hyper(t: i32) -> AdamHyper {
        super::super::testing::adam_hyper(0.1, t)
    }

    /// Two steps vs optax's formula evaluated by hand in f64 (lr 0.1, b1 0.9, b2 0.999, eps 1e-8).
    #[test]
    fn two_steps_match_optax_by_hand() {
        let be = backend();
        let mut p = tensor(&be, &[1.0, -0.5, 2.0], [3]);
        let mut m = tensor(&be, &[0.0; 3], [3]);
        let mut v = tensor(&be, &[0.0; 3], [3]);
        let g1 = tensor(&be, &[0.1, -0.2, 0.3], [3]);
        ops::adam(&mut p, &g1, &mut m, &mut v, &hyper(1)).unwrap();
        // Step 1: m = 0.1 g, v = 0.001 g², so m̂ / sqrt(v̂) = sign(g) and p moves by lr (minus eps).
        let p1 = [
            0.900_000_009_999_999,
            -0.400_000_004_999_999_7,
            1.900_000_003_333_333_3,
        ];
        assert_close(&p.to_vec().unwrap(), &p1, 1e-6, 0.0, "p after step 1");
        assert_close(
            &m.to_vec().unwrap(),
            &[0.01, -0.02, 0.03],
            1e-6,
            0.0,
            "m after step 1",
        );
        // 0.999 is not exact in f32: 1 - b2 is off by 1.3e-5 relative, and so is v.
        assert_close(
            &v.to_vec().unwrap(),
            &[1e-5, 4e-5, 9e-5],
            3e-5,
            0.0,
            "v after step 1",
        );

        let g2 = tensor(&be, &[0.5, 0.0, -1.0], [3]);
        ops::adam(&mut p, &g2, &mut m, &mut v, &hyper(2)).unwrap();
        let p2 = [
            0.813_895_386_180_784_9,
            -0.332_994_184_325_558_4,
            1.952_033_178_918_833_2,
        ];
        assert_close(&p.to_vec().unwrap(), &p2, 1e-6, 0.0, "p after step 2");
        assert_close(
            &m.to_vec().unwrap(),
            &[0.059, -0.018, -0.073],
            1e-6,
            0.0,
            "m after step 2",
        );
        let v2 = [2.599_9e-4, 3.996e-5, 1.089_91e-3];
        assert_close(&v.to_vec().unwrap(), &v2, 3e-5, 0.0, "v after step 2");
    }

    #[test]
    fn errors_leave_state_unchanged() {
        let be = backend();
        let mut p = tensor(&be, &[1.0, 2.0], [2]);
        let mut m = tensor(&be, &[0.0; 2], [2]);
        let mut v = tensor(&be, &[0.0; 2], [2]);
        let g = tensor(&be, &[1.0; 2], [2]);
        let bad = AdamHyper {
            bias_correction1: 0.0,
            ..hyper(1)
        };
        let e = ops::adam(&mut p, &g, &mut m, &mut v, &bad).unwrap_err();
        assert!(matches!(e, TensorError::InvalidArgument { .. }), "{e}");
        let bad = AdamHyper {
            lr: f32::NAN,
            ..hyper(1)
        };
        assert!(ops::adam(&mut p, &g, &mut m, &mut v, &bad).is_err());
        let g3 = tensor(&be, &[1.0; 3], [3]);
        let e = ops::adam(&mut p, &g3, &mut m, &mut v, &hyper(1)).unwrap_err();
        assert!(matches!(e, TensorError::Shape { .. }), "{e}");
        let _alias = v.clone();
        let e = ops::adam(&mut p, &g, &mut m, &mut v, &hyper(1)).unwrap_err();
        assert!(matches!(e, TensorError::Aliased { .. }), "{e}");
        assert_eq!(p.to_vec().unwrap(), vec![1.0, 2.0]);
        assert_eq!(m.to_vec().unwrap(), vec![0.0; 2]);
    }
}

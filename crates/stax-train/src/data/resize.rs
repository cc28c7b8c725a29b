//! Bilinear image resize with half-pixel centers, and gray-to-color channel replication.
//!
//! For an input axis of size `n` and an output axis of size `m`, output index `i` samples the
//! input at
//!
//! ```text
//! x = (i + 0.5) * n / m - 0.5,   clamped to [0, n - 1]
//! i0 = floor(x), i1 = min(i0 + 1, n - 1), t = x - i0
//! value = (1 - t) * in[i0] + t * in[i1]          (separably along h, then w)
//! ```
//!
//! This is `jax.image.resize(image, shape, method="bilinear")` for upsampling: JAX
//! (`jax/_src/image/scale.py`, `_compute_spans` with the triangle kernel) places samples at
//! `(i + 0.5) / scale - 0.5` and renormalises the kernel weights over the pixels inside the
//! image, which at the borders is the same as clamping. For downsampling it equals JAX with
//! `antialias=False` (JAX's default `antialias=True` widens the kernel instead). The unit tests
//! hold values computed with JAX 0.10.2 for both cases.
//!
//! ```
//! use stax_train::data::resize::resize_bilinear;
//!
//! // 1x2 gray [0, 1] to 1x4 RGB: samples at x = -0.25, 0.25, 0.75, 1.25, clamped.
//! let mut dst = [0.0f32; 12];
//! resize_bilinear(&[0.0, 1.0], (1, 2, 1), &mut dst, (1, 4, 3))?;
//! assert_eq!(dst[..3], [0.0; 3]);
//! assert_eq!(dst[3..6], [0.25; 3]);
//! assert_eq!(dst[9..], [1.0; 3]);
//! # Ok::<(), stax_train::TrainError>(())
//! ```

use crate::error::TrainError;

const OP: &str = "resize_bilinear";

/// One output position along an axis: the two input indices and the weight of the second.
#[derive(Debug, Clone, Copy)]
struct Tap {
    i0: usize,
    i1: usize,
    t: f32,
}

/// The taps for resizing an axis of `n` samples to `m` (half-pixel centers, clamped).
fn taps(n: usize, m: usize) -> Vec<Tap> {
    let scale = n as f64 / m as f64;
    (0..m)
        .map(|i| {
            let x = ((i as f64 + 0.5) * scale - 0.5).clamp(0.0, (n - 1) as f64);
            let i0 = x.floor() as usize;
            Tap {
                i0,
                i1: (i0 + 1).min(n - 1),
                t: (x - i0 as f64) as f32,
            }
        })
        .collect()
}

/// Resizes one HWC image `src` of shape `(h, w, c)` into `dst` of shape `(oh, ow, oc)` by
/// bilinear interpolation with half-pixel centers and edge clamping (see the module doc for
/// the formula and its JAX source). Channels are either kept (`oc == c`) or, for a gray
/// source (`c == 1`), replicated to every output channel. Equal sizes copy exactly.
///
/// # Errors
/// [`TrainError::BadShape`] when an extent is zero; [`TrainError::ShapeMismatch`] when
/// `src` or `dst` does not hold its shape's volume; [`TrainError::BadChannels`] when
/// `oc != c` and `c != 1`.
pub fn resize_bilinear(
    src: &[f32],
    (h, w, c): (usize, usize, usize),
    dst: &mut [f32],
    (oh, ow, oc): (usize, usize, usize),
) -> Result<(), TrainError> {
    check_resizable(OP, (h, w, c), (oh, ow, oc))?;
    check_len("source buffer", src.len(), [h, w, c])?;
    check_len("destination buffer", dst.len(), [oh, ow, oc])?;

    // Source channel for output channel `k`: itself, or 0 when replicating gray.
    let src_ch = |k: usize| if c == 1 { 0 } else { k };
    if (h, w) == (oh, ow) {
        for (p, out) in dst.chunks_exact_mut(oc).enumerate() {
            for (k, o) in out.iter_mut().enumerate() {
                *o = src[p * c + src_ch(k)];
            }
        }
        return Ok(());
    }
    let (ty, tx) = (taps(h, oh), taps(w, ow));
    let at = |y: usize, x: usize, k: usize| src[(y * w + x) * c + k];
    for (oy, ry) in ty.iter().enumerate() {
        for (ox, rx) in tx.iter().enumerate() {
            let out = &mut dst[(oy * ow + ox) * oc..(oy * ow + ox + 1) * oc];
            for (k, o) in out.iter_mut().enumerate() {
                let k = src_ch(k);
                let top = lerp(at(ry.i0, rx.i0, k), at(ry.i0, rx.i1, k), rx.t);
                let bottom = lerp(at(ry.i1, rx.i0, k), at(ry.i1, rx.i1, k), rx.t);
                *o = lerp(top, bottom, ry.t);
            }
        }
    }
    Ok(())
}

/// `(1 - t) * a + t * b`, written as `a + t * (b - a)` so that equal neighbours give
/// exactly their value (a constant image stays constant in f32).
fn lerp(a: f32, b: f32, t: f32) -> f32 {
    a + t * (b - a)
}

/// Checks that an image shape `(h, w, c)` (`what`, for the message) has no zero extent.
///
/// # Errors
/// [`TrainError::BadShape`] naming `what` and the shape.
pub(crate) fn check_extents(
    op: &'static str,
    what: &str,
    (h, w, c): (usize, usize, usize),
) -> Result<(), TrainError> {
    if h == 0 || w == 0 || c == 0 {
        return Err(TrainError::BadShape {
            op,
            what: what.into(),
            shape: vec![h as u64, w as u64, c as u64],
            expected: "every extent must be at least 1",
        });
    }
    Ok(())
}

/// Checks that an image of shape `from` can be resized to `to` by [`resize_bilinear`]: no
/// zero extent, and channels kept (`c == oc`) or replicated from gray (`c == 1`).
///
/// # Errors
/// [`TrainError::BadShape`] for a zero extent; [`TrainError::BadChannels`].
pub(crate) fn check_resizable(
    op: &'static str,
    from: (usize, usize, usize),
    to: (usize, usize, usize),
) -> Result<(), TrainError> {
    check_extents(op, "source image", from)?;
    check_extents(op, "destination image", to)?;
    if from.2 != to.2 && from.2 != 1 {
        return Err(TrainError::BadChannels {
            op,
            from: from.2,
            to: to.2,
        });
    }
    Ok(())
}

fn check_len(what: &'static str, len: usize, shape: [usize; 3]) -> Result<(), TrainError> {
    let volume = super::checked_volume(&shape);
    if volume != Some(len) {
        return Err(TrainError::ShapeMismatch {
            op: OP,
            what,
            expected: shape.to_vec(),
            found: vec![len],
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resize(src: &[f32], from: (usize, usize, usize), to: (usize, usize, usize)) -> Vec<f32> {
        let mut dst = vec![f32::NAN; to.0 * to.1 * to.2];
        resize_bilinear(src, from, &mut dst, to).unwrap();
        dst
    }

    /// `want` holds JAX's f32 results as printed (up to 9 digits), kept as f64 literals.
    fn assert_close(got: &[f32], want: &[f64]) {
        assert_eq!(got.len(), want.len());
        for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
            let g = f64::from(g);
            assert!(
                (g - w).abs() <= 1e-6 + 1e-5 * w.abs(),
                "index {i}: got {g}, want {w}"
            );
        }
    }

    #[test]
    fn two_by_two_to_four_by_four_by_hand() {
        // Samples at -0.25, 0.25, 0.75, 1.25 -> clamped 0, 0.25, 0.75, 1 on both axes, and
        // the image is 2 * y + x, so out[r][c] = 2 * s[r] + s[c].
        let s = [0.0, 0.25, 0.75, 1.0];
        let want: Vec<f32> = s
            .iter()
            .flat_map(|&r| s.iter().map(move |&c| 2.0 * r + c))
            .collect();
        let got = resize(&[0.0, 1.0, 2.0, 3.0], (2, 2, 1), (4, 4, 1));
        assert_eq!(got, want);
        // The same values jax.image.resize(x, (4, 4, 1), "bilinear") prints.
        assert_eq!(got[4..8], [0.5, 0.75, 1.25, 1.5]);
    }

    #[test]
    fn matches_jax_for_non_integer_upsampling() {
        // src = arange(6).reshape(3, 2, 1) ** 2 / 7; jax.image.resize(src, (5, 7, 1), "bilinear").
        let src: Vec<f32> = (0..6).map(|i| (i * i) as f32 / 7.0).collect();
        #[rustfmt::skip]
        let want: [f64; 35] = [
            0.0, 0.0, 0.030612249, 0.071428575, 0.11224492, 0.14285713, 0.14285715, 0.22857146,
            0.22857146, 0.3081633, 0.41428578, 0.52040827, 0.6, 0.6000001, 0.5714286, 0.5714286,
            0.72448987, 0.92857146, 1.1326532, 1.2857143, 1.2857144, 1.6000003, 1.6000003,
            1.826531, 2.1285717, 2.4306128, 2.657143, 2.6571434, 2.2857144, 2.2857144, 2.5612247,
            2.9285717, 3.2959187, 3.5714285, 3.5714288,
        ];
        assert_close(&resize(&src, (3, 2, 1), (5, 7, 1)), &want);
    }

    #[test]
    fn matches_jax_without_antialias_when_downsampling() {
        // d = (arange(48).reshape(4, 6, 2) % 5) / 4;
        // jax.image.resize(d, (3, 4, 2), "bilinear", antialias=False).
        let src: Vec<f32> = (0..48).map(|i| (i % 5) as f32 / 4.0).collect();
        let want: [f64; 24] = [
            0.20833334, 0.40625, 0.80208337, 0.21875, 0.40625, 0.65625, 0.21875, 0.46875, 0.71875,
            0.34375, 0.53125, 0.625, 0.34375, 0.59375, 0.625, 0.40625, 0.4479166, 0.54166675,
            0.2604166, 0.5104166, 0.54166675, 0.53125, 0.5104166, 0.34375003,
        ];
        assert_close(&resize(&src, (4, 6, 2), (3, 4, 2)), &want);
    }

    #[test]
    fn equal_sizes_are_the_identity() {
        let src: Vec<f32> = (0..30).map(|i| (i as f32).sin()).collect();
        assert_eq!(resize(&src, (2, 5, 3), (2, 5, 3)), src);
    }

    #[test]
    fn constant_image_stays_constant() {
        let src = vec![0.375f32; 7 * 5];
        for to in [(13, 11, 1), (3, 2, 1), (200, 200, 1)] {
            assert!(
                resize(&src, (7, 5, 1), to).iter().all(|&v| v == 0.375),
                "{to:?}"
            );
        }
    }

    #[test]
    fn gray_is_replicated_to_three_channels() {
        let src = [0.0, 1.0, 2.0, 3.0];
        let rgb = resize(&src, (2, 2, 1), (4, 4, 3));
        let gray = resize(&src, (2, 2, 1), (4, 4, 1));
        for (p, g) in gray.iter().enumerate() {
            assert_eq!(rgb[3 * p..3 * p + 3], [*g; 3]);
        }
        assert_eq!(resize(&src, (2, 2, 1), (2, 2, 3))[9..], [3.0; 3]);
    }

    #[test]
    fn bad_shapes_and_channels_are_errors() {
        let mut dst = [0.0f32; 12];
        let e = resize_bilinear(&[0.0; 8], (2, 2, 2), &mut dst, (2, 2, 3)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "resize_bilinear: cannot map 2 channels to 3 (channels must match, or the source \
             must have 1 to be replicated)"
        );
        let e = resize_bilinear(&[0.0; 3], (2, 2, 1), &mut dst, (2, 2, 3)).unwrap_err();
        assert!(
            matches!(
                e,
                TrainError::ShapeMismatch {
                    what: "source buffer",
                    ..
                }
            ),
            "{e}"
        );
        let e = resize_bilinear(&[0.0; 4], (2, 2, 1), &mut dst, (3, 2, 3)).unwrap_err();
        assert!(matches!(
            e,
            TrainError::ShapeMismatch {
                what: "destination buffer",
                ..
            }
        ));
        let e = resize_bilinear(&[], (0, 2, 1), &mut dst, (2, 2, 3)).unwrap_err();
        assert!(matches!(e, TrainError::BadShape { .. }), "{e}");
    }
}

//! Strided GEMM over host slices ([`matrixmultiply::sgemm`]) and the 2-D `matmul` op.
//!
//! A [`MatRef`] is a matrix seen through row and column strides, so a transpose is a swap of
//! strides and never a copy (the BLAS convention, as `matrixmultiply` takes it). [`gemm`] checks
//! every view against its slice before calling the unsafe kernel, so no stride error can read
//! or write out of bounds.

use super::{data, data_mut};
use crate::TensorError;
use crate::backend::Matmul;

/// A read-only strided matrix view: element `(i, j)` is `data[i * rs + j * cs]`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct MatRef<'a> {
    data: &'a [f32],
    rows: usize,
    cols: usize,
    rs: usize,
    cs: usize,
}

impl<'a> MatRef<'a> {
    /// `data` as a row-major `[rows, cols]` matrix.
    pub(crate) fn row_major(data: &'a [f32], rows: usize, cols: usize) -> Self {
        MatRef {
            data,
            rows,
            cols,
            rs: cols,
            cs: 1,
        }
    }

    /// `data` as a `[rows, cols]` matrix with strides `(rs, cs)`.
    pub(crate) fn strided(
        data: &'a [f32],
        rows: usize,
        cols: usize,
        (rs, cs): (usize, usize),
    ) -> Self {
        MatRef {
            data,
            rows,
            cols,
            rs,
            cs,
        }
    }

    /// The transpose, `[cols, rows]`, sharing the data.
    pub(crate) fn t(self) -> Self {
        MatRef {
            rows: self.cols,
            cols: self.rows,
            rs: self.cs,
            cs: self.rs,
            ..self
        }
    }
}

/// A mutable strided `[rows, cols]` matrix view: element `(i, j)` is `data[i * rs + j * cs]`.
#[derive(Debug)]
pub(crate) struct MatMut<'a> {
    data: &'a mut [f32],
    rows: usize,
    cols: usize,
    rs: usize,
    cs: usize,
}

impl<'a> MatMut<'a> {
    /// `data` as a row-major `[rows, cols]` matrix.
    pub(crate) fn row_major(data: &'a mut [f32], rows: usize, cols: usize) -> Self {
        MatMut::strided(data, rows, cols, (cols, 1))
    }

    /// `data` as a `[rows, cols]` matrix with strides `(rs, cs)` (an NCHW output seen as
    /// `[pixels, channels]` is `(1, pixels)`); [`gemm`] refuses views whose elements overlap.
    pub(crate) fn strided(
        data: &'a mut [f32],
        rows: usize,
        cols: usize,
        (rs, cs): (usize, usize),
    ) -> Self {
        MatMut {
            data,
            rows,
            cols,
            rs,
            cs,
        }
    }

    /// Sets every row to `row` (`cols` values; a view that does not fit its slice is left
    /// as it is, and [`gemm`] then refuses it).
    pub(crate) fn fill_rows(&mut self, row: &[f32]) {
        if !in_bounds(self.data.len(), self.rows, self.cols, self.rs, self.cs) {
            return;
        }
        for i in 0..self.rows {
            for (j, &v) in row.iter().enumerate().take(self.cols) {
                self.data[i * self.rs + j * self.cs] = v;
            }
        }
    }

    /// Whether no two elements of the view are the same memory: one stride spans the whole
    /// extent of the other axis (row-major, column-major, or a single row or column).
    fn injective(&self) -> bool {
        let spans = |outer: usize, inner: usize, inner_len: usize| {
            inner
                .checked_mul(inner_len)
                .is_some_and(|span| outer >= span)
        };
        self.rows <= 1
            || self.cols <= 1
            || spans(self.rs, self.cs, self.cols)
            || spans(self.cs, self.rs, self.rows)
    }
}

/// Whether every element of a `rows x cols` view with strides `(rs, cs)` lies inside `len`.
fn in_bounds(len: usize, rows: usize, cols: usize, rs: usize, cs: usize) -> bool {
    if rows == 0 || cols == 0 {
        return true;
    }
    let last = (rows - 1)
        .checked_mul(rs)
        .zip((cols - 1).checked_mul(cs))
        .and_then(|(r, c)| r.checked_add(c));
    matches!(last, Some(l) if l < len)
}

/// Checked stride as `isize` for the kernel.
fn stride(s: usize) -> Option<isize> {
    isize::try_from(s).ok()
}

/// `c = alpha · a · b + beta · c` (`c` is not read when `beta == 0`).
///
/// # Errors
/// [`TensorError::InvalidArgument`] naming `op` if the inner dimensions disagree or a view does
/// not fit its slice: an internal error of the caller, reported instead of a panic.
pub(crate) fn gemm(
    op: &'static str,
    alpha: f32,
    a: MatRef<'_>,
    b: MatRef<'_>,
    beta: f32,
    c: MatMut<'_>,
) -> Result<(), TensorError> {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    let strides = [a.rs, a.cs, b.rs, b.cs, c.rs, c.cs].map(stride);
    let [
        Some(rsa),
        Some(csa),
        Some(rsb),
        Some(csb),
        Some(rsc),
        Some(csc),
    ] = strides
    else {
        return Err(gemm_error(op, m, k, n));
    };
    let fits = b.rows == k
        && c.rows == m
        && c.cols == n
        && c.injective()
        && in_bounds(a.data.len(), m, k, a.rs, a.cs)
        && in_bounds(b.data.len(), k, n, b.rs, b.cs)
        && in_bounds(c.data.len(), m, n, c.rs, c.cs);
    if !fits {
        return Err(gemm_error(op, m, k, n));
    }
    // SAFETY: every element of the three views lies inside its slice (checked above, strides
    // non-negative); no two elements of C alias (`injective`, checked above); `c` is a `&mut`
    // slice, so it overlaps neither `a` nor `b`. `matrixmultiply` does not read C when beta
    // is 0.
    unsafe {
        matrixmultiply::sgemm(
            m,
            k,
            n,
            alpha,
            a.data.as_ptr(),
            rsa,
            csa,
            b.data.as_ptr(),
            rsb,
            csb,
            beta,
            c.data.as_mut_ptr(),
            rsc,
            csc,
        );
    }
    Ok(())
}

fn gemm_error(op: &'static str, m: usize, k: usize, n: usize) -> TensorError {
    TensorError::InvalidArgument {
        op,
        reason: format!("internal: gemm views do not fit their buffers (m {m}, k {k}, n {n})"),
    }
}

const OP: &str = "matmul";

/// `c = op(a) · op(b)` for row-major 2-D f32 tensors (see [`crate::Backend::matmul`]):
/// `op(a)` is `[m, k]`, `op(b)` `[k, n]`, `c` `[m, n]`, overwritten (zeros when `k == 0`), or
/// added to with `accumulate`.
///
/// # Errors
/// [`TensorError::Shape`] for a non-matrix operand or disagreeing dimensions,
/// [`TensorError::DType`] / [`TensorError::DeviceMismatch`] for a non-f32 or non-CPU operand,
/// [`TensorError::Aliased`] if `c` shares its buffer.
pub(crate) fn matmul(call: Matmul<'_>) -> Result<(), TensorError> {
    let Matmul {
        m,
        n,
        a,
        b,
        transpose_a,
        transpose_b,
        c,
        accumulate,
        ..
    } = call;
    let ((ra, ca), (rb, cb)) = ((a.dims()[0], a.dims()[1]), (b.dims()[0], b.dims()[1]));
    let mut av = MatRef::row_major(data(OP, a)?, ra, ca);
    let mut bv = MatRef::row_major(data(OP, b)?, rb, cb);
    if transpose_a {
        av = av.t();
    }
    if transpose_b {
        bv = bv.t();
    }
    gemm(
        OP,
        1.0,
        av,
        bv,
        if accumulate { 1.0 } else { 0.0 },
        MatMut::row_major(data_mut(OP, c)?, m, n),
    )
}

#[cfg(test)]
mod tests {
    use super::super::testing::{assert_close, backend, random_vec, rng, tensor};
    use crate::ops;
    use crate::{Category, DType, Tensor, TensorError};

    /// Naive `op(a) · op(b)` in f64.
    fn naive(a: &[f32], b: &[f32], dims: (usize, usize, usize), ta: bool, tb: bool) -> Vec<f32> {
        let (m, k, n) = dims;
        let at = |i: usize, p: usize| if ta { a[p * m + i] } else { a[i * k + p] };
        let bt = |p: usize, j: usize| if tb { b[j * k + p] } else { b[p * n + j] };
        let mut c = vec![0f32; m * n];
        for i in 0..m {
            for j in 0..n {
                c[i * n + j] = (0..k)
                    .map(|p| f64::from(at(i, p)) * f64::from(bt(p, j)))
                    .sum::<f64>() as f32;
            }
        }
        c
    }

    #[test]
    fn all_transpose_combinations_match_naive() {
        let be = backend();
        let mut r = rng(1);
        for &(m, k, n) in &[(1, 1, 1), (3, 5, 4), (7, 1, 9), (17, 33, 5), (64, 70, 3)] {
            for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
                let av = random_vec(&mut r, m * k);
                let bv = random_vec(&mut r, k * n);
                let a = tensor(&be, &av, if ta { [k, m] } else { [m, k] });
                let b = tensor(&be, &bv, if tb { [n, k] } else { [k, n] });
                let mut c = Tensor::empty(&be, [m, n], DType::F32, Category::Other).unwrap();
                ops::fill(&mut c, f32::NAN).unwrap();
                ops::matmul(&a, &b, ta, tb, &mut c).unwrap();
                let want = naive(&av, &bv, (m, k, n), ta, tb);
                assert_close(&c.to_vec().unwrap(), &want, 1e-5, 1e-5, "matmul");
            }
        }
    }

    #[test]
    fn empty_inner_dimension_gives_zeros() {
        let be = backend();
        let a = Tensor::empty(&be, [3, 0], DType::F32, Category::Other).unwrap();
        let b = Tensor::empty(&be, [0, 2], DType::F32, Category::Other).unwrap();
        let mut c = tensor(&be, &[f32::NAN; 6], [3, 2]);
        ops::matmul(&a, &b, false, false, &mut c).unwrap();
        assert_eq!(c.to_vec().unwrap(), vec![0.0; 6]);
    }

    #[test]
    fn bad_shapes_dtypes_and_aliases_are_errors() {
        let be = backend();
        let a = tensor(&be, &[1.0; 6], [2, 3]);
        let b = tensor(&be, &[1.0; 6], [2, 3]);
        let mut c = tensor(&be, &[0.0; 4], [2, 2]);
        let e = ops::matmul(&a, &b, false, false, &mut c).unwrap_err();
        assert_eq!(
            e.to_string(),
            "matmul: op(a) is [2, 3] but op(b) is [2, 3] (got [2, 3])"
        );
        ops::matmul(&a, &b, false, true, &mut c).unwrap();
        assert_eq!(c.to_vec().unwrap(), vec![3.0; 4]);
        let mut c3 = tensor(&be, &[0.0; 6], [2, 3]);
        assert!(matches!(
            ops::matmul(&a, &b, false, true, &mut c3),
            Err(TensorError::Shape { .. })
        ));
        let v = tensor(&be, &[1.0; 6], [6]);
        assert!(matches!(
            ops::matmul(&v, &b, false, true, &mut c),
            Err(TensorError::Shape { .. })
        ));
        let u = Tensor::empty(&be, [2, 3], DType::U32, Category::Other).unwrap();
        assert!(matches!(
            ops::matmul(&u, &b, false, true, &mut c),
            Err(TensorError::UnsupportedDType { .. })
        ));
        // an f32 matmul given a bf16 b: refused naming both dtypes
        let h = Tensor::empty(&be, [2, 3], DType::BF16, Category::Other).unwrap();
        assert!(matches!(
            ops::matmul(&a, &h, false, true, &mut c),
            Err(TensorError::InvalidArgument { reason, .. })
                if reason == "b is bf16: with an f32 a, b must be f32"
        ));
        let _alias = c.clone();
        assert!(matches!(
            ops::matmul(&a, &b, false, true, &mut c),
            Err(TensorError::Aliased { .. })
        ));
    }
}

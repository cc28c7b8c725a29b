//! Elementwise ops (activations, binary ops, bias) and the matrix product.

use crate::backend::{BiasAdd, BiasGrad, Binary, Matmul, Unary, UnaryBwd};
use crate::{Activation, BinaryOp, Checked, DType, Shape, Tensor, TensorError, matmul_dims};

use super::conv::{check_aux, check_saved};
use super::{FLOATS, backend_of, input, output, rows_cols, supports};

/// In place `y = act(y)`, any shape, any float dtype. `aux` receives, for an activation that
/// keeps one ([`crate::Saves::Mask`]: the ReLU), its bit mask: U32 of `ceil(numel / 32)`
/// words, bit `i % 32` of word `i / 32` set to `y[i] > 0` (the bits past `numel` clear).
///
/// # Errors
/// [`TensorError::UnsupportedDType`] for U32; [`TensorError::InvalidArgument`] for a mask
/// given to an activation that keeps none, or a bad parameter ([`Activation::check`]); mask
/// shape, device and alias errors.
pub fn unary(act: Activation, y: &mut Tensor, aux: Option<&mut Tensor>) -> Result<(), TensorError> {
    const OP: &str = "unary";
    let be = backend_of(y);
    act.check()?;
    supports(OP, y.dtype(), FLOATS)?;
    output(OP, &be, y, "y", y.dtype(), None)?;
    if let Some(m) = &aux {
        check_aux(OP, Some(act), m, y)?;
    }
    be.unary(Checked::new(Unary { act, y, aux }))
}

/// In place `dy = dy · act'`, from what `act`'s forward pass saved: its mask (see [`unary`]),
/// its output or its input (a tensor of `dy`'s shape and dtype).
///
/// # Errors
/// As [`unary`].
pub fn unary_bwd(act: Activation, saved: &Tensor, dy: &mut Tensor) -> Result<(), TensorError> {
    const OP: &str = "unary_bwd";
    let be = backend_of(dy);
    supports(OP, dy.dtype(), FLOATS)?;
    output(OP, &be, dy, "dy", dy.dtype(), None)?;
    check_saved(OP, act, saved, dy)?;
    be.unary_bwd(Checked::new(UnaryBwd { act, saved, dy }))
}

/// In place `a = a op b`, same shape and float dtype (`FanInSum`'s sum, gradients summed).
///
/// # Errors
/// Shape, dtype, device and alias errors.
pub fn binary(op: BinaryOp, a: &mut Tensor, b: &Tensor) -> Result<(), TensorError> {
    const OP: &str = "binary";
    let be = backend_of(a);
    supports(OP, a.dtype(), FLOATS)?;
    output(OP, &be, a, "a", a.dtype(), None)?;
    input(OP, &be, b, "b", a.dtype(), Some(a.shape()))?;
    be.binary(Checked::new(Binary {
        op,
        a,
        b,
        relu: None,
        masked_by: None,
    }))
}

/// In place `a = relu(a op b)`, same shape and float dtype, `mask` receiving the ReLU's bit
/// mask as [`unary`] writes it: [`binary`] then [`unary`] with [`Activation::Relu`], bit for
/// bit (the ReLU reads the sum rounded to the dtype), in one pass where the backend fuses
/// them (`FanInSum` followed by `Relu`, as in ResNet's blocks).
///
/// # Errors
/// As [`binary`]; mask shape, dtype, device and alias errors as [`unary`].
pub fn binary_relu(
    op: BinaryOp,
    a: &mut Tensor,
    b: &Tensor,
    mask: &mut Tensor,
) -> Result<(), TensorError> {
    const OP: &str = "binary_relu";
    let be = backend_of(a);
    supports(OP, a.dtype(), FLOATS)?;
    output(OP, &be, a, "a", a.dtype(), None)?;
    input(OP, &be, b, "b", a.dtype(), Some(a.shape()))?;
    check_aux(OP, Some(Activation::Relu), mask, a)?;
    be.binary(Checked::new(Binary {
        op,
        a,
        b,
        relu: Some(mask),
        masked_by: None,
    }))
}

/// In place `a = (a op b) · relu'`, same shape and float dtype, from a ReLU's saved bit mask
/// (see [`unary`]): [`binary`] then [`unary_bwd`] with [`Activation::Relu`], bit for bit, in
/// one pass where the backend fuses them (`FanOut`'s gradients summed into the gradient of the
/// ReLU before it, as between ResNet's blocks).
///
/// # Errors
/// As [`binary`]; mask shape, dtype and device errors as [`unary_bwd`].
pub fn binary_masked(
    op: BinaryOp,
    a: &mut Tensor,
    b: &Tensor,
    mask: &Tensor,
) -> Result<(), TensorError> {
    const OP: &str = "binary_masked";
    let be = backend_of(a);
    supports(OP, a.dtype(), FLOATS)?;
    output(OP, &be, a, "a", a.dtype(), None)?;
    input(OP, &be, b, "b", a.dtype(), Some(a.shape()))?;
    check_saved(OP, Activation::Relu, mask, a)?;
    be.binary(Checked::new(Binary {
        op,
        a,
        b,
        relu: None,
        masked_by: Some(mask),
    }))
}

/// `y[..., j] += b[j]`, `b` of shape `[y.shape().last()]` (a scalar `y` counts as `[1]`).
///
/// # Errors
/// Shape, dtype, device and alias errors.
pub fn bias_add(y: &mut Tensor, b: &Tensor) -> Result<(), TensorError> {
    const OP: &str = "bias_add";
    let be = backend_of(y);
    supports(OP, y.dtype(), FLOATS)?;
    output(OP, &be, y, "y", y.dtype(), None)?;
    let (rows, cols) = rows_cols(y.shape());
    input(OP, &be, b, "b", y.dtype(), Some(&Shape::new([cols])))?;
    be.bias_add(Checked::new(BiasAdd { rows, cols, y, b }))
}

/// `db[j] = sum of dy[..., j]` over all leading dimensions, `db` `[dy.shape().last()]`
/// (overwritten), accumulated in f64.
///
/// # Errors
/// Shape, dtype, device and alias errors; workspace allocation errors.
pub fn bias_grad(dy: &Tensor, db: &mut Tensor) -> Result<(), TensorError> {
    const OP: &str = "bias_grad";
    let be = backend_of(dy);
    supports(OP, dy.dtype(), FLOATS)?;
    let (rows, cols) = rows_cols(dy.shape());
    output(OP, &be, db, "db", dy.dtype(), Some(&Shape::new([cols])))?;
    be.bias_grad(Checked::new(BiasGrad { rows, cols, dy, db }))
}

/// `c = op(a) · op(b)` for 2-D row-major matrices of one float dtype (products
/// summed in f32, rounded once), where `op` transposes when its flag is
/// set: `op(a)` is `[m, k]`, `op(b)` is `[k, n]`, `c` is `[m, n]` (overwritten).
///
/// A mixed-precision dense layer's product: with `a` and `c` in bf16 or f16, `b` may be f32
/// (neither transposed); it is read rounded to `a`'s dtype, as `a @ b.astype(a.dtype)` in
/// JAX, without a rounded copy of `b` (the CUDA backend rounds it as it reads it where
/// `m <= 128`, `k % 8 == 0` and `n % 4 == 0`, else into its workspace).
///
/// # Errors
/// Shape, dtype, device and alias errors; [`TensorError::InvalidArgument`] for an f32 `b`
/// with a transpose, and for a float `b` of neither `a`'s dtype nor (with a bf16 or f16 `a`)
/// f32, naming both; workspace allocation and library errors.
pub fn matmul(
    a: &Tensor,
    b: &Tensor,
    transpose_a: bool,
    transpose_b: bool,
    c: &mut Tensor,
) -> Result<(), TensorError> {
    matmul_into("matmul", (a, b), (transpose_a, transpose_b), c, false)
}

/// `c += op(a) · op(b)`: [`matmul`] adding to `c` (cuBLAS's `beta = 1`), one dtype for every
/// operand (no mixed product).
///
/// # Errors
/// As [`matmul`]; [`TensorError::DType`] for a `b` of another dtype than `a`'s.
pub fn matmul_add(
    a: &Tensor,
    b: &Tensor,
    transpose_a: bool,
    transpose_b: bool,
    c: &mut Tensor,
) -> Result<(), TensorError> {
    let be = backend_of(a);
    input("matmul_add", &be, b, "b", a.dtype(), None)?;
    matmul_into("matmul_add", (a, b), (transpose_a, transpose_b), c, true)
}

/// [`matmul`] and [`matmul_add`].
fn matmul_into(
    op: &'static str,
    (a, b): (&Tensor, &Tensor),
    (transpose_a, transpose_b): (bool, bool),
    c: &mut Tensor,
    accumulate: bool,
) -> Result<(), TensorError> {
    let be = backend_of(a);
    supports(op, a.dtype(), FLOATS)?;
    let (m, n, k) = matmul_dims(op, a.shape(), b.shape(), transpose_a, transpose_b)?;
    input(op, &be, a, "a", a.dtype(), None)?;
    let b_dtype = matmul_b_dtype(a.dtype(), b.dtype(), transpose_a || transpose_b)?;
    input(op, &be, b, "b", b_dtype, None)?;
    output(op, &be, c, "c", a.dtype(), Some(&Shape::new([m, n])))?;
    let call = Matmul {
        m,
        n,
        k,
        a,
        b,
        transpose_a,
        transpose_b,
        c,
        accumulate,
    };
    be.matmul(Checked::new(call))
}

/// The dtype `matmul` expects of `b` for an `a` of `a_dtype`: `a`'s, or f32 (read rounded)
/// for a bf16 or f16 `a` without transposes; a float `b` of neither is refused naming both.
fn matmul_b_dtype(a_dtype: DType, b_dtype: DType, transposed: bool) -> Result<DType, TensorError> {
    let (a_name, b_name) = (a_dtype.name(), b_dtype.name());
    let an_a = format!(
        "{} {a_name} a",
        if a_name.starts_with('f') { "an" } else { "a" }
    );
    let refuse = |reason| {
        Err(TensorError::InvalidArgument {
            op: "matmul",
            reason,
        })
    };
    match (a_dtype, b_dtype) {
        (a, b) if a == b || !b.is_float() => Ok(a),
        (DType::F32, _) => refuse(format!("b is {b_name}: with {an_a}, b must be f32")),
        (_, DType::F32) if transposed => refuse(format!("an f32 b with {an_a} takes no transpose")),
        (_, DType::F32) => Ok(DType::F32),
        _ => refuse(format!(
            "b is {b_name}: with {an_a}, b must be {a_name} or f32 (read rounded)"
        )),
    }
}

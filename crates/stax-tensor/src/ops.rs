//! The checked front end: one function per op. Each checks its operands once (all on one
//! backend, by identity; dtypes; shapes; outputs not shared), builds the op's [`Checked`](crate::Checked)
//! call and hands it to the backend of its first operand. Layers, optimizers and the trainer
//! call these, never a backend directly.
//!
//! ```
//! use stax_tensor::{ops, Activation, BackendOptions, Category, Device, Tensor};
//! let cpu = Device::Cpu.open(&BackendOptions::default())?;
//! let mut y = Tensor::from_slice(&cpu, &[1.0, -2.0, 3.0], [3], Category::Activation)?;
//! ops::unary(Activation::Relu, &mut y, None)?;
//! assert_eq!(y.to_vec()?, vec![1.0, 0.0, 3.0]);
//! // a shared output is refused, not raced
//! let alias = y.clone();
//! assert!(ops::unary(Activation::Tanh, &mut y, None).is_err());
//! # drop(alias);
//! # Ok::<(), stax_tensor::TensorError>(())
//! ```

mod conv;
mod elementwise;
mod fold;
mod memory;
mod norm;
mod rows;
mod update;

pub use crate::backend::{FoldInputs, FoldOutputs};
pub use conv::{
    Epilogue, check_pool_padding, conv2d, conv2d_bwd_data, conv2d_bwd_filter,
    conv2d_bwd_filter_consuming, max_pool2d_argmax, max_pool2d_bwd_argmax, pool2d, pool2d_bwd,
};
pub use elementwise::{
    bias_add, bias_grad, binary, binary_masked, binary_relu, matmul, matmul_add, unary, unary_bwd,
};
pub use fold::batch_norm_fold;
pub use memory::{
    axis_of, cast, concat, concat_shape, copy, download, fill, split, upload, upload_async,
};
pub use norm::{
    Affine, AffineGrads, NormSaved, batch_norm, batch_norm_add_relu, batch_norm_bwd,
    batch_norm_given, bias_add_channels, bias_grad_channels,
};
pub use rows::{
    check_keep_rate, dropout, dropout_bits, dropout_bwd, index_loss, keep_threshold,
    label_out_of_range, mix64, softmax, softmax_bwd,
};
pub use update::{adam, all_finite, dense_adam, softmax_xent};

use crate::{Backend, DType, Shape, Tensor, TensorError};
use std::sync::Arc;

/// `f32` alone.
const F32: (&[DType], &str) = (&[DType::F32], "f32");
/// Every float dtype.
const FLOATS: (&[DType], &str) = (&DType::FLOATS, "f32, bf16, f16");

/// The backend an op runs on: its first operand's.
fn backend_of(t: &Tensor) -> Arc<dyn Backend> {
    t.backend().clone()
}

/// An input of `op` named `name` (in its signature): on `be`, of `dtype`, of `shape` (when
/// given); a shape, dtype or alias error names it.
fn input(
    op: &'static str,
    be: &Arc<dyn Backend>,
    t: &Tensor,
    name: &'static str,
    dtype: DType,
    shape: Option<&Shape>,
) -> Result<(), TensorError> {
    t.expect_on(op, be)?;
    let checks = t.expect_dtype(op, dtype).and_then(|()| match shape {
        Some(s) => t.expect_shape(op, s),
        None => Ok(()),
    });
    checks.map_err(|e| e.for_operand(name))
}

/// As [`input`], for a tensor the op writes: also the only handle to its buffer.
fn output(
    op: &'static str,
    be: &Arc<dyn Backend>,
    t: &Tensor,
    name: &'static str,
    dtype: DType,
    shape: Option<&Shape>,
) -> Result<(), TensorError> {
    input(op, be, t, name, dtype, shape)?;
    t.expect_unique(op).map_err(|e| e.for_operand(name))
}

/// A loss's operands `[logits, labels, dlogits]`: labels of `labels` (dtype, shape), dlogits
/// written, of the logits' dtype and shape; all on the logits' backend.
fn loss_operands(
    op: &'static str,
    [logits, labels, dlogits]: [&Tensor; 3],
    (label_dtype, label_shape): (DType, &Shape),
) -> Result<(), TensorError> {
    let be = backend_of(logits);
    input(op, &be, logits, "logits", logits.dtype(), None)?;
    input(op, &be, labels, "labels", label_dtype, Some(label_shape))?;
    output(
        op,
        &be,
        dlogits,
        "dlogits",
        logits.dtype(),
        Some(logits.shape()),
    )
}

/// Fails with [`TensorError::UnsupportedDType`] unless `dtype` is one of `supported`.
fn supports(
    op: &'static str,
    dtype: DType,
    (supported, words): (&[DType], &'static str),
) -> Result<(), TensorError> {
    if supported.contains(&dtype) {
        Ok(())
    } else {
        Err(TensorError::UnsupportedDType {
            op,
            dtype,
            supported: words,
        })
    }
}

/// A bit mask for `numel` elements: U32 of `ceil(numel / 32)` words on `be`.
fn mask(
    op: &'static str,
    be: &Arc<dyn Backend>,
    t: &Tensor,
    numel: usize,
) -> Result<(), TensorError> {
    t.expect_on(op, be)?;
    t.expect_dtype(op, DType::U32)?;
    let want = numel.div_ceil(32);
    if t.numel() != want {
        return Err(TensorError::Shape {
            op,
            reason: format!(
                "a mask for {numel} elements needs {want} u32 word{}",
                if want == 1 { "" } else { "s" }
            ),
            got: t.shape().clone(),
        });
    }
    Ok(())
}

/// `(rows, cols)` of `shape` seen as a matrix over its last axis (`cols` 1 for a scalar).
fn rows_cols(shape: &Shape) -> (usize, usize) {
    let cols = shape.last();
    (shape.numel().checked_div(cols).unwrap_or(0), cols)
}

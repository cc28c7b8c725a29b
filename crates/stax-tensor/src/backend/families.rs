//! The op families a [`crate::Backend`] implements, one trait each (after burn's split of its
//! backend into op traits). Every method takes a [`Checked`] call: the front end
//! ([`crate::ops`]) has checked its operands, and a backend computes without checking again.

use crate::upload::{Upload, host_source};
use crate::{Checked, TensorError};

use super::call::{
    Adam, AllFinite, BatchNorm, BatchNormBwd, BatchNormFold, BiasAdd, BiasGrad, Binary, Cast,
    ChannelBiasAdd, ChannelBiasGrad, Concat, Conv2d, Conv2dBwdData, Conv2dBwdFilter, Copy, CopyIn,
    CopyInAsync, CopyOut, DenseAdam, Fill, Matmul, Pool2d, Pool2dBwd, SoftmaxXent, Split, Unary,
    UnaryBwd,
};
use super::rows::{Dropout, DropoutBwd, IndexLossCall, Softmax, SoftmaxBwd};

/// Copies between host and device, device copies and fills.
pub trait MemoryOps {
    /// Host bytes into a tensor.
    ///
    /// # Errors
    /// The device's copy errors.
    fn upload(&self, c: Checked<CopyIn<'_>>) -> Result<(), TensorError>;

    /// Starts copying host memory into a tensor and returns the copy in flight, which owns
    /// both until it is done: the non-blocking `.to(device, non_blocking=True)` of a pinned
    /// PyTorch tensor. The copy is ordered after all work queued before the call (the
    /// destination may reuse memory that work freed) and overlaps work queued after it;
    /// [`Upload::wait`] returns the destination filled. The CUDA backend copies on a second
    /// stream; the default copies synchronously.
    ///
    /// # Errors
    /// The device's copy errors.
    fn upload_async(&self, c: Checked<CopyInAsync>) -> Result<Upload, TensorError> {
        let CopyInAsync { src, mut dst } = c.into_inner();
        let bytes = host_source("upload_async", &src, &dst)?;
        self.upload(Checked::new(CopyIn {
            src: bytes,
            dst: &mut dst,
        }))?;
        Ok(Upload::done(dst))
    }

    /// A tensor's bytes to the host (waits for the work that writes it).
    ///
    /// # Errors
    /// The device's copy errors.
    fn download(&self, c: Checked<CopyOut<'_>>) -> Result<(), TensorError>;

    /// A device copy.
    ///
    /// # Errors
    /// The device's errors.
    fn copy(&self, c: Checked<Copy<'_>>) -> Result<(), TensorError>;

    /// Sets every element to a value.
    ///
    /// # Errors
    /// The device's errors.
    fn fill(&self, c: Checked<Fill<'_>>) -> Result<(), TensorError>;

    /// Concatenates along an axis.
    ///
    /// # Errors
    /// The device's errors.
    fn concat(&self, c: Checked<Concat<'_>>) -> Result<(), TensorError>;

    /// Splits along an axis.
    ///
    /// # Errors
    /// The device's errors.
    fn split(&self, c: Checked<Split<'_>>) -> Result<(), TensorError>;

    /// Converts between float dtypes.
    ///
    /// # Errors
    /// The device's errors.
    fn cast(&self, c: Checked<Cast<'_>>) -> Result<(), TensorError>;
}

/// Convolutions and pooling.
pub trait ConvOps {
    /// The forward convolution, with its bias and activation epilogue.
    ///
    /// # Errors
    /// Workspace allocation and library errors.
    fn conv2d(&self, c: Checked<Conv2d<'_>>) -> Result<(), TensorError>;

    /// The convolution's input gradient.
    ///
    /// # Errors
    /// As [`ConvOps::conv2d`].
    fn conv2d_bwd_data(&self, c: Checked<Conv2dBwdData<'_>>) -> Result<(), TensorError>;

    /// The convolution's kernel and bias gradients (with the epilogue's activation backward).
    ///
    /// # Errors
    /// As [`ConvOps::conv2d`].
    fn conv2d_bwd_filter(&self, c: Checked<Conv2dBwdFilter<'_>>) -> Result<(), TensorError>;

    /// A 2-D pooling.
    ///
    /// # Errors
    /// Kernel errors.
    fn pool2d(&self, c: Checked<Pool2d<'_>>) -> Result<(), TensorError>;

    /// A pooling's input gradient.
    ///
    /// # Errors
    /// Kernel errors.
    fn pool2d_bwd(&self, c: Checked<Pool2dBwd<'_>>) -> Result<(), TensorError>;
}

/// Matrix products.
pub trait MatmulOps {
    /// `c = op(a) · op(b)`.
    ///
    /// # Errors
    /// Workspace allocation and library errors.
    fn matmul(&self, c: Checked<Matmul<'_>>) -> Result<(), TensorError>;
}

/// Elementwise ops: one entry for every activation, one for every binary op, and the bias.
pub trait ElementwiseOps {
    /// An activation, in place.
    ///
    /// # Errors
    /// Kernel errors.
    fn unary(&self, c: Checked<Unary<'_>>) -> Result<(), TensorError>;

    /// An activation's backward pass, in place on the gradient.
    ///
    /// # Errors
    /// Kernel errors.
    fn unary_bwd(&self, c: Checked<UnaryBwd<'_>>) -> Result<(), TensorError>;

    /// A binary op, in place on its left operand.
    ///
    /// # Errors
    /// Kernel errors.
    fn binary(&self, c: Checked<Binary<'_>>) -> Result<(), TensorError>;

    /// The bias added along the last axis.
    ///
    /// # Errors
    /// Kernel errors.
    fn bias_add(&self, c: Checked<BiasAdd<'_>>) -> Result<(), TensorError>;

    /// The bias gradient: sums over all leading axes.
    ///
    /// # Errors
    /// Workspace allocation and kernel errors.
    fn bias_grad(&self, c: Checked<BiasGrad<'_>>) -> Result<(), TensorError>;

    /// Softmax or log-softmax along an axis, in place.
    ///
    /// # Errors
    /// Kernel errors.
    fn softmax(&self, c: Checked<Softmax<'_>>) -> Result<(), TensorError>;

    /// Its backward pass from the output, in place on the gradient.
    ///
    /// # Errors
    /// Kernel errors.
    fn softmax_bwd(&self, c: Checked<SoftmaxBwd<'_>>) -> Result<(), TensorError>;

    /// Dropout in place, its keep bits into a mask.
    ///
    /// # Errors
    /// Kernel errors.
    fn dropout(&self, c: Checked<Dropout<'_>>) -> Result<(), TensorError>;

    /// Dropout's backward pass from the mask, in place on the gradient.
    ///
    /// # Errors
    /// Kernel errors.
    fn dropout_bwd(&self, c: Checked<DropoutBwd<'_>>) -> Result<(), TensorError>;
}

/// Losses.
pub trait LossOps {
    /// Softmax cross-entropy fused with its gradient; returns the mean loss.
    ///
    /// # Errors
    /// Workspace allocation and kernel errors.
    fn softmax_xent(&self, c: Checked<SoftmaxXent<'_>>) -> Result<f32, TensorError>;

    /// A loss with integer labels fused with its gradient; returns the mean loss.
    ///
    /// # Errors
    /// [`TensorError::InvalidArgument`] for a label out of range; workspace allocation and
    /// kernel errors.
    fn index_loss(&self, c: Checked<IndexLossCall<'_>>) -> Result<f32, TensorError>;
}

/// Optimizer updates.
pub trait OptimOps {
    /// One fused, in-place Adam step.
    ///
    /// # Errors
    /// Kernel errors.
    fn adam(&self, c: Checked<Adam<'_>>) -> Result<(), TensorError>;

    /// A dense layer's backward pass with Adam applied to its weight as the gradient is made,
    /// chunk by chunk, so the whole gradient never exists (see [`crate::ops::dense_adam`]).
    ///
    /// # Errors
    /// Workspace allocation (before anything is written) and kernel errors.
    fn dense_adam(&self, c: Checked<DenseAdam<'_>>) -> Result<(), TensorError>;

    /// Sets a flag when a tensor has a non-finite element (see [`crate::ops::all_finite`]).
    ///
    /// # Errors
    /// Kernel errors.
    fn all_finite(&self, c: Checked<AllFinite<'_>>) -> Result<(), TensorError>;
}

/// Per-channel ops on a `[outer, c, inner]` view: batch normalization and a channel bias.
pub trait NormOps {
    /// Batch normalization forward, writing the per-channel statistics.
    ///
    /// # Errors
    /// Workspace allocation and kernel errors.
    fn batch_norm(&self, c: Checked<BatchNorm<'_>>) -> Result<(), TensorError>;

    /// Batch normalization backward.
    ///
    /// # Errors
    /// Workspace allocation and kernel errors.
    fn batch_norm_bwd(&self, c: Checked<BatchNormBwd<'_>>) -> Result<(), TensorError>;

    /// A bias along the channel axis of the view.
    ///
    /// # Errors
    /// Kernel errors.
    fn channel_bias_add(&self, c: Checked<ChannelBiasAdd<'_>>) -> Result<(), TensorError>;

    /// The gradient of a channel bias.
    ///
    /// # Errors
    /// Workspace allocation and kernel errors.
    fn channel_bias_grad(&self, c: Checked<ChannelBiasGrad<'_>>) -> Result<(), TensorError>;

    /// The per-channel part of a batch norm's backward pass through the pointwise conv before
    /// it ([`crate::ops::batch_norm_fold`]).
    ///
    /// # Errors
    /// Kernel errors.
    fn batch_norm_fold(&self, c: Checked<BatchNormFold<'_>>) -> Result<(), TensorError>;
}

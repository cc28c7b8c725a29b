//! stax's ResNet-50 (`examples/resnet50.py` in the JAX repository), NHWC, with its depth and
//! width as parameters so that the same blocks build shallow variants.
//!
//! ```
//! use stax_layers::models::ResNet;
//! use stax_layers::Layer;
//! use stax_tensor::{Shape, Tree};
//! let model = ResNet::resnet50(1000).build((224, 224, 3)).unwrap();
//! let out = model.output_shape(&Tree::leaf(Shape::new([2, 224, 224, 3]))).unwrap();
//! assert_eq!(out, Tree::leaf(Shape::new([2, 1000])));
//! // the parameter count of stax's ResNet50(1000) in JAX 0.10.2 (its convs have biases)
//! let specs = model.param_specs(&Tree::leaf(Shape::new([2, 224, 224, 3]))).unwrap();
//! let n: usize = specs.leaves().iter().map(|s| s.shape.numel()).sum();
//! assert_eq!(n, 25_583_592);
//! // BatchNorm spans to the blocks' ends (less memory, the same parameter tree)
//! use stax_layers::models::BnSpans;
//! let spanned = ResNet { bn_spans: BnSpans::ToEnd, ..ResNet::resnet50(1000) };
//! let spanned = spanned.build((224, 224, 3)).unwrap();
//! assert_eq!(spanned.param_specs(&Tree::leaf(Shape::new([2, 224, 224, 3]))).unwrap(), specs);
//! ```

use crate::{
    AvgPool, BatchNorm, Conv, Dense, FanInSum, FanOut, Flatten, Identity, Layer, LayerError,
    MaxPool, Padding, Relu, Remat, Serial, parallel, serial,
};
use stax_tensor::{Shape, Tree};

/// stax's `ConvBlock(kernel_size, filters, strides)`: `FanOut(2)`, `parallel(Main,
/// Shortcut)`, `FanInSum`, `Relu`, with `Main = Conv(f1, (1, 1), strides) BatchNorm Relu
/// Conv(f2, (k, k), SAME) BatchNorm Relu Conv(f3, (1, 1)) BatchNorm` and `Shortcut =
/// Conv(f3, (1, 1), strides) BatchNorm` (1x1 convs VALID, as stax's default).
pub fn conv_block(kernel: usize, [f1, f2, f3]: [usize; 3], strides: (usize, usize)) -> Serial {
    conv_block_with(kernel, [f1, f2, f3], strides, BnSpans::None)
}

/// [`conv_block`], its main path's BatchNorms spanned as `bn_spans` says
/// ([`ResNet::bn_spans`]).
fn conv_block_with(
    kernel: usize,
    [f1, f2, f3]: [usize; 3],
    strides: (usize, usize),
    bn_spans: BnSpans,
) -> Serial {
    let main = main_path(
        [
            Conv::new(f1, (1, 1), strides, Padding::Valid),
            Conv::new(f2, (kernel, kernel), (1, 1), Padding::Same),
            Conv::new(f3, (1, 1), (1, 1), Padding::Valid),
        ],
        bn_spans,
    );
    let norm = match bn_spans {
        BnSpans::Fold if strides == (1, 1) => BatchNorm::new().folded(),
        _ => BatchNorm::new(),
    };
    let shortcut = serial![Conv::new(f3, (1, 1), strides, Padding::Valid), norm];
    serial![FanOut(2), parallel![main, shortcut], FanInSum, Relu]
}

/// Which BatchNorms of every block a [`ResNet`] runs in [`Remat`] spans, whose backward pass
/// recomputes what they do not keep: the same layers, parameter tree and results, less memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BnSpans {
    /// None: every output the backward pass reads is kept.
    #[default]
    None,
    /// Each of the main path's first two BatchNorms spans its ReLU and the next conv, saving
    /// that conv's output (`Remat::new(BatchNorm).spanning(3).saving(&["conv"])`): the
    /// BatchNorm outputs those convs read are recomputed from the conv outputs the
    /// BatchNorms keep anyway, one more normalizing pass each (their statistics are kept).
    Norms,
    /// As [`BnSpans::Norms`], the second span reaching the block's end (`BatchNorm Relu Conv
    /// BatchNorm`, `spanning(4)`, saving nothing): the output of the block's last conv, the
    /// widest tensor of its main path, is recomputed too (a 1x1 conv), and its BatchNorm's
    /// statistics are kept instead.
    ToEnd,
    /// As [`BnSpans::ToEnd`], the block's last BatchNorm (and a stride-1 shortcut's)
    /// [`BatchNorm::folded`] into its pointwise conv: its backward pass works from the conv's
    /// input, so the conv's output is neither kept nor recomputed. The least memory of the
    /// three at about the time of [`BnSpans::Norms`]; the same results to rounding.
    Fold,
}

/// A block's main path `Conv BatchNorm Relu Conv BatchNorm Relu Conv BatchNorm` of `convs`,
/// its BatchNorms spanned as `bn_spans` says (the same layers and parameter tree).
fn main_path([c1, c2, c3]: [Conv; 3], bn_spans: BnSpans) -> Serial {
    let bn = |second: bool| -> Box<dyn Layer> {
        let saving = Remat::new(BatchNorm::new()).spanning(3).saving(&["conv"]);
        match bn_spans {
            BnSpans::None => Box::new(BatchNorm::new()),
            BnSpans::ToEnd | BnSpans::Fold if second => {
                Box::new(Remat::new(BatchNorm::new()).spanning(4))
            }
            BnSpans::Norms | BnSpans::ToEnd | BnSpans::Fold => Box::new(saving),
        }
    };
    let last = match bn_spans {
        BnSpans::Fold => BatchNorm::new().folded(),
        _ => BatchNorm::new(),
    };
    Serial(vec![
        Box::new(c1),
        bn(false),
        Box::new(Relu),
        Box::new(c2),
        bn(true),
        Box::new(Relu),
        Box::new(c3),
        Box::new(last),
    ])
}

/// stax's `IdentityBlock(kernel_size, filters)` for an input of `channels` channels:
/// `FanOut(2)`, `parallel(Main, Identity)`, `FanInSum`, `Relu`, with `Main = Conv(f1, (1, 1))
/// BatchNorm Relu Conv(f2, (k, k), SAME) BatchNorm Relu Conv(channels, (1, 1)) BatchNorm`.
/// stax builds `Main` with `shape_dependent` so that its last conv outputs the input's
/// channels; here the caller passes them (the parameters and computation are the same).
pub fn identity_block(kernel: usize, [f1, f2]: [usize; 2], channels: usize) -> Serial {
    identity_block_with(kernel, [f1, f2], channels, BnSpans::None)
}

/// [`identity_block`], its main path's BatchNorms spanned as `bn_spans` says
/// ([`ResNet::bn_spans`]).
fn identity_block_with(
    kernel: usize,
    [f1, f2]: [usize; 2],
    channels: usize,
    bn_spans: BnSpans,
) -> Serial {
    let main = main_path(
        [
            Conv::new(f1, (1, 1), (1, 1), Padding::Valid),
            Conv::new(f2, (kernel, kernel), (1, 1), Padding::Same),
            Conv::new(channels, (1, 1), (1, 1), Padding::Valid),
        ],
        bn_spans,
    );
    serial![FanOut(2), parallel![main, Identity], FanInSum, Relu]
}

/// A ResNet of stax's blocks: the stem `Conv(w0, (7, 7), (2, 2), SAME) BatchNorm Relu
/// MaxPool((3, 3), (2, 2))`, four stages of one [`conv_block`] (stride 1 in the first stage, 2
/// after; filters `[w, w, 4w]`) and `blocks - 1` [`identity_block`]s each, then
/// `AvgPool(window) Flatten Dense(classes)`.
///
/// stax's model ends in `LogSoftmax`; this one ends on the logits, which
/// [`crate::SoftmaxCrossEntropy`] turns into the same loss (`-sum(one_hot · log_softmax)`, its
/// mean over the batch: stax's example sums instead).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResNet {
    /// Blocks per stage (ResNet-50: `[3, 4, 6, 3]`).
    pub blocks: [usize; 4],
    /// Width `w` of each stage (ResNet-50: `[64, 128, 256, 512]`); the stem has `widths[0]`.
    pub widths: [usize; 4],
    /// Classes of the dense head.
    pub classes: usize,
    /// How many stages, from the first, have every block a [`Remat`] (`jax.checkpoint` of
    /// each `ConvBlock` and `IdentityBlock`; 0 to 4): the forward pass keeps only each such
    /// block's input, the backward pass recomputes one block at a time. The same parameters and
    /// results, less memory, one more forward pass of those blocks. The first stages hold the
    /// most activation bytes per FLOP (ResNet-50 at batch 128, 224x224, f32 plan: 10.37 GB
    /// with none, 7.54 with one, 5.65 with two, 4.09 with all four).
    pub remat_stages: usize,
    /// Which BatchNorms of every block run in [`Remat`] spans ([`BnSpans`]): the BatchNorm
    /// outputs the blocks' second and third convs read leave the step's peak
    /// ([`BnSpans::Norms`]), and the blocks' last conv outputs too ([`BnSpans::ToEnd`]). The
    /// same parameters and results, less memory, one more normalizing pass of those
    /// BatchNorms (and with `ToEnd` one more forward pass of each block's last conv).
    /// ResNet-50 at batch 128, 224x224, f32 CPU plan: 10.37 GB with none, 8.95 with `Norms`
    /// (with one rematerialized stage 7.54 to 6.73).
    pub bn_spans: BnSpans,
}

impl ResNet {
    /// stax's `ResNet50(num_classes)`.
    pub fn resnet50(classes: usize) -> ResNet {
        ResNet {
            blocks: [3, 4, 6, 3],
            widths: [64, 128, 256, 512],
            classes,
            remat_stages: 0,
            bn_spans: BnSpans::None,
        }
    }

    /// The model for `(height, width, channels)` images. The average pooling's window is the
    /// final feature map (`(7, 7)` for 224x224, as stax's), so any image size that survives
    /// the strides works.
    ///
    /// # Errors
    /// [`LayerError::Config`] for a stage of no blocks or a zero width; the shape errors of an
    /// image too small for the stem.
    pub fn build(&self, (h, w, c): (usize, usize, usize)) -> Result<Serial, LayerError> {
        if self.remat_stages > 4 {
            return Err(LayerError::Config {
                path: String::new(),
                layer: "resnet".into(),
                reason: format!(
                    "remat_stages is {}: at most the 4 stages",
                    self.remat_stages
                ),
            });
        }
        if self.blocks.contains(&0) || self.widths.contains(&0) || self.classes == 0 {
            return Err(LayerError::Config {
                path: String::new(),
                layer: "resnet".into(),
                reason: format!(
                    "every stage needs a block and a width, and a class is needed: got blocks \
                     {:?}, widths {:?}, {} classes",
                    self.blocks, self.widths, self.classes
                ),
            });
        }
        let mut layers: Vec<Box<dyn Layer>> = vec![
            Box::new(Conv::new(self.widths[0], (7, 7), (2, 2), Padding::Same)),
            Box::new(BatchNorm::new()),
            Box::new(Relu),
            Box::new(MaxPool::new((3, 3)).with((2, 2), Padding::Valid)),
        ];
        for (stage, (&n, &width)) in self.blocks.iter().zip(&self.widths).enumerate() {
            let strides = if stage == 0 { (1, 1) } else { (2, 2) };
            let (filters, spans) = ([width, width, 4 * width], self.bn_spans);
            layers.push(self.block(stage, conv_block_with(3, filters, strides, spans)));
            for _ in 1..n {
                let block = identity_block_with(3, [width, width], 4 * width, spans);
                layers.push(self.block(stage, block));
            }
        }
        let trunk = Serial(layers);
        let features = trunk.output_shape(&Tree::leaf(Shape::new([1, h, w, c])))?;
        let window = match features.as_leaf().map(Shape::dims) {
            Some(&[_, fh, fw, _]) => (fh, fw),
            _ => unreachable_shape(&features)?,
        };
        let Serial(mut layers) = trunk;
        layers.push(Box::new(AvgPool::new(window)));
        layers.push(Box::new(Flatten));
        layers.push(Box::new(Dense(self.classes)));
        Ok(Serial(layers))
    }

    /// A block of stage `stage` as this model holds it: itself, or rematerialized
    /// ([`ResNet::remat_stages`]).
    fn block(&self, stage: usize, block: Serial) -> Box<dyn Layer> {
        match stage < self.remat_stages {
            true => Box::new(Remat::new(block)),
            false => Box::new(block),
        }
    }
}

/// The trunk's output is one NHWC tensor; anything else is a configuration error.
fn unreachable_shape(features: &Tree<Shape>) -> Result<(usize, usize), LayerError> {
    Err(LayerError::Config {
        path: String::new(),
        layer: "resnet".into(),
        reason: format!("the trunk gives {features:?}, not one NHWC tensor"),
    })
}

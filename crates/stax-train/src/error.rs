//! [`TrainError`], the one error enum of `stax-train`.
//!
//! Variants carry data, not preformatted strings, and every message is lowercase with the
//! operation first, e.g. `"load_npy: images.npy has dtype <u2 but only u8 and f32 are
//! accepted"`. Variants are grouped by banners, as in candle's `error.rs`.

use std::path::PathBuf;

/// Everything that can go wrong in `stax-train`: reading and validating data, batching, and
/// (later) training.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TrainError {
    // ---- data: files ----
    /// A file could not be read or written (missing, permissions, disk full...).
    #[error("{op}: cannot access {}: {source}", path.display())]
    Io {
        /// The operation, e.g. `"load_idx"`.
        op: &'static str,
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },

    /// A file was read but its contents are malformed or truncated.
    #[error("{op}: {} is corrupt: {reason}", path.display())]
    Corrupt {
        /// The operation, e.g. `"load_idx"`.
        op: &'static str,
        /// The file (for embedded data, `embedded:<name>`).
        path: PathBuf,
        /// What is wrong with it.
        reason: Corruption,
    },

    /// An `.npz` archive has no array of the requested name(s).
    #[error("load_npz: {} has no array named any of {tried:?} (it holds {available:?})", path.display())]
    MissingArray {
        /// The archive.
        path: PathBuf,
        /// The array names looked for, in the order tried.
        tried: Vec<String>,
        /// The array names the archive does hold.
        available: Vec<String>,
    },

    /// An array's element type is not one this loader accepts.
    #[error("{op}: {} has dtype {found} but only {accepted} are accepted", path.display())]
    BadDtype {
        /// The operation, e.g. `"load_npy"`.
        op: &'static str,
        /// The file.
        path: PathBuf,
        /// The dtype found, as NumPy writes it (`<u2`, `<f8`) or the IDX type code (`idx 0x0d`).
        found: String,
        /// The accepted dtypes, in words.
        accepted: &'static str,
    },

    // ---- data: shapes and values ----
    /// An array or image shape is not one the operation accepts (wrong rank, a zero extent,
    /// a size that overflows `usize`).
    #[error("{op}: {what} has shape {shape:?} but {expected}")]
    BadShape {
        /// The operation, e.g. `"dataset"` or `"resize_bilinear"`.
        op: &'static str,
        /// What has the shape: a file name or a role such as `"images"`.
        what: String,
        /// The shape found.
        shape: Vec<u64>,
        /// What was expected, in words (e.g. `"images must be [n, h, w, c]"`).
        expected: &'static str,
    },

    /// Two things that must agree in shape or length do not (images and labels, a buffer and
    /// the batch it should hold).
    #[error("{op}: {what} has shape {found:?} but {expected:?} is required")]
    ShapeMismatch {
        /// The operation, e.g. `"fill_batch"`.
        op: &'static str,
        /// What has the wrong shape, e.g. `"labels"` or `"images buffer"`.
        what: &'static str,
        /// The shape required.
        expected: Vec<usize>,
        /// The shape found.
        found: Vec<usize>,
    },

    /// Channel counts that cannot be mapped onto each other (only `c == oc` and gray to any
    /// count by replication are supported).
    #[error(
        "{op}: cannot map {from} channels to {to} (channels must match, or the source must have 1 \
         to be replicated)"
    )]
    BadChannels {
        /// The operation, e.g. `"resize_bilinear"`.
        op: &'static str,
        /// Source channels.
        from: usize,
        /// Destination channels.
        to: usize,
    },

    /// A label is negative or not below the number of classes.
    #[error(
        "{op}: {}label {label} of example {index} is out of range for {num_classes} classes",
        in_file(.path)
    )]
    LabelOutOfRange {
        /// The operation, e.g. `"dataset"`.
        op: &'static str,
        /// The labels' file (inside an `.npz`: `archive.npz/key.npy`), None for data made in
        /// memory.
        path: Option<PathBuf>,
        /// The example's index (the first bad one).
        index: usize,
        /// The label found (signed: `.npy` labels may be negative).
        label: i64,
        /// The number of classes.
        num_classes: usize,
    },

    /// A row of one-hot labels is not one-hot (exactly one 1, zeros elsewhere).
    #[error(
        "{op}: {}label row {index} is not one-hot (it needs exactly one 1 and zeros elsewhere)",
        in_file(.path)
    )]
    NotOneHot {
        /// The operation, e.g. `"load_npy"`.
        op: &'static str,
        /// The labels' file (inside an `.npz`: `archive.npz/key.npy`).
        path: Option<PathBuf>,
        /// The row's index (the first bad one).
        index: usize,
    },

    /// A data set (or a subset of one) has no examples.
    #[error("{op}: {}the data set is empty", in_file(.path))]
    EmptyDataset {
        /// The operation, e.g. `"dataset"` or `"subset"`.
        op: &'static str,
        /// The images' file it was read from, None for data made in memory.
        path: Option<PathBuf>,
    },

    /// A NaN or infinity in the images: reported, never trained on silently.
    #[error(
        "{op}: {}image {index} holds {value_kind} at element {element} (h, w, c flattened)",
        in_file(.path)
    )]
    NonFinite {
        /// The operation, e.g. `"dataset"`.
        op: &'static str,
        /// The images' file (inside an `.npz`: `archive.npz/key.npy`), None for data made in
        /// memory.
        path: Option<PathBuf>,
        /// The image's index in the data set (the first bad one).
        index: usize,
        /// The offset of the first bad value inside that image, `(y * w + x) * c + ch`.
        element: usize,
        /// Which kind of bad value.
        value_kind: NonFiniteKind,
    },

    /// An example index past the end of the data set.
    #[error("{op}: example index {index} is out of range for a data set of {len}")]
    IndexOutOfRange {
        /// The operation, e.g. `"fill_batch"`.
        op: &'static str,
        /// The index found.
        index: usize,
        /// The data set's length.
        len: usize,
    },

    // ---- data: batching ----
    /// A batch size of zero.
    #[error("{op}: batch size must be at least 1")]
    ZeroBatchSize {
        /// The operation, e.g. `"loader"`.
        op: &'static str,
    },

    /// A step count (epochs times steps per epoch) that overflows.
    #[error("loader: {epochs} epochs of {per_epoch} steps each overflow a 64-bit step count")]
    TooManySteps {
        /// The epochs asked for.
        epochs: u64,
        /// Steps per epoch.
        per_epoch: u64,
    },

    /// A batch size larger than the data set, so an epoch would hold no full batch.
    #[error("loader: batch size {batch} is larger than the data set ({len} examples)")]
    BatchTooLarge {
        /// The batch size asked for.
        batch: usize,
        /// The data set's length.
        len: usize,
    },
    // ---- training ----
    /// A batch or the model's input shape does not fit the trainer.
    #[error("train: {what} should be {expected}, got {got}")]
    BatchShape {
        /// What was checked (`images`, `labels`, `input shape`).
        what: &'static str,
        /// What was expected, in words.
        expected: String,
        /// The shape given.
        got: stax_tensor::Shape,
    },
    /// The loss was NaN or infinite; the update was not applied.
    #[error(
        "train: step {step} gave a non-finite loss ({loss}); parameters and optimizer state are unchanged"
    )]
    NonFiniteLoss {
        /// The step that failed, from 1.
        step: u64,
        /// The loss value.
        loss: f32,
    },
    /// A dynamic loss scale's settings cannot work (see [`crate::DynamicLossScale`]).
    #[error("loss scale: {name} = {value} must be {expected}")]
    LossScale {
        /// The setting (`scale`, `period`, `factor`, `min_scale`).
        name: &'static str,
        /// Its value.
        value: f64,
        /// What it must be.
        expected: &'static str,
    },
    /// A step ran out of memory: the breakdown, the request that failed and the largest batch
    /// that fits (see [`crate::report::StepOom`]); parameters and optimizer state are those of
    /// the last finished step.
    #[error("{0}")]
    OutOfMemory(Box<crate::report::StepOom>),
    /// Setting up a trainer (parameters, Adam's moments) ran out of memory: no batch size can
    /// help, the persistent state alone does not fit.
    #[error(
        "trainer: the parameters and Adam's m and v need {} before any \
         step, more than the backend has:\n{request}",
        stax_alloc::human_bytes(*state_bytes)
    )]
    InitOutOfMemory {
        /// Bytes of the parameters and both Adam moments (from the memory plan).
        state_bytes: u64,
        /// The allocator's diagnosis of the request that failed.
        request: Box<stax_alloc::OomReport>,
    },
    /// A memory budget was needed (to find the largest batch that fits) but none was given and
    /// the backend reports no memory size (the host, unless capped).
    #[error(
        "plan: the {device} backend reports no memory size; give a budget in bytes \
         (e.g. max_batch_that_fits(Some(8 << 30)))"
    )]
    NoBudget {
        /// The device planned for.
        device: stax_tensor::Device,
    },
    /// A step failed after Adam had already updated some parameters in the backward pass
    /// (the one exception to "a failed step changes nothing", which the trainer's set-up
    /// rules out for running out of memory: [`crate::plan::MemoryPlan::rehearse`]). The
    /// updated parameters are named; everything else is as the last finished step left it.
    #[error("{source}\n(the step had already updated {} in its backward pass)", applied.join(", "))]
    UpdatedBeforeFailure {
        /// Paths of the parameters (and their moments) already updated.
        applied: Vec<String>,
        /// What failed.
        source: Box<TrainError>,
    },
    /// A layer failed (shapes, parameters, tensor ops).
    #[error(transparent)]
    Layer(#[from] stax_layers::LayerError),
    /// The optimizer failed.
    #[error(transparent)]
    Optim(#[from] stax_optim::OptimError),
    /// A tensor op or placement failed (out of memory carries the allocator's diagnosis).
    #[error(transparent)]
    Tensor(#[from] stax_tensor::TensorError),

    // ---- data parallel ----
    /// The data-parallel set-up is wrong or could not finish: a bad or missing environment
    /// variable, a rendezvous directory already used, a peer that did not publish in time.
    #[error("rendezvous (rank {rank}): {reason}")]
    Rendezvous {
        /// The rank that reports it.
        rank: usize,
        /// What is wrong.
        reason: String,
    },
    /// The ranks of a data-parallel run do not train the same model: every rank reports it,
    /// with the first line where its description and rank `other`'s differ.
    #[error(
        "data parallel (rank {rank}): rank {other} has another model: {difference} (model hashes {this_hash:016x} here, {other_hash:016x} there)"
    )]
    ModelMismatch {
        /// The rank that reports it.
        rank: usize,
        /// The first rank whose model differs from rank 0's (or rank 0, on a rank that differs).
        other: usize,
        /// `here: ... / there: ...`, the first differing line (path, shape, dtype, model,
        /// optimizer or input).
        difference: String,
        /// FNV-1a of this rank's description.
        this_hash: u64,
        /// FNV-1a of the other rank's description.
        other_hash: u64,
    },
    /// A rank started by [`crate::distributed::launch`] failed (the first to fail).
    #[error("launch: rank {rank} failed ({status})")]
    RankFailed {
        /// The rank.
        rank: usize,
        /// Its exit status, or why it could not start.
        status: String,
    },

    // ---- checkpoints ----
    /// A checkpoint could not be read, written or used: the file, the member (the array's
    /// name in the `.npz`, when the problem is one member's) and what is wrong.
    #[error("{op}: {}{}: {problem}", path.display(), member_of(.member))]
    Checkpoint {
        /// The operation: `load_checkpoint` or `save_checkpoint`.
        op: &'static str,
        /// The checkpoint file.
        path: PathBuf,
        /// The member, e.g. `params/[0][1]` or `opt/[0].mu[3][0]`.
        member: Option<String>,
        /// What is wrong.
        problem: Box<CheckpointProblem>,
    },
    /// A data position that does not belong to a loader (another seed, past the epoch's end).
    #[error("loader: cannot resume at {position}: {reason}")]
    DataPosition {
        /// The position given.
        position: crate::data::DataPosition,
        /// Why it does not fit.
        reason: String,
    },
}

/// What is wrong inside a corrupt file (see [`TrainError::Corrupt`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Corruption {
    /// The IDX magic number's first two bytes are not zero.
    #[error("bad idx magic {found:02x?} (expected [00, 00, type, ndims])")]
    BadMagic {
        /// The first four bytes of the (decompressed) file.
        found: [u8; 4],
    },
    /// The IDX header declares zero dimensions.
    #[error("idx header declares 0 dimensions")]
    ZeroDims,
    /// The file ends inside its header.
    #[error("truncated header: {expected} bytes needed, {found} present")]
    TruncatedHeader {
        /// Header bytes needed.
        expected: usize,
        /// Header bytes present.
        found: usize,
    },
    /// The file ends before all the elements its header declares.
    #[error("truncated data: {expected} bytes declared, {found} present")]
    TruncatedData {
        /// Data bytes the header declares.
        expected: u64,
        /// Data bytes present.
        found: u64,
    },
    /// Bytes follow the last element the header declares.
    #[error("trailing bytes after the {expected} declared data bytes")]
    TrailingData {
        /// Data bytes the header declares.
        expected: u64,
    },
    /// The declared dimensions multiply to more than memory can address.
    #[error("dimensions {dims:?} overflow usize")]
    SizeOverflow {
        /// The declared dimensions.
        dims: Vec<u64>,
    },
    /// The gzip stream is invalid or truncated.
    #[error("bad gzip stream: {source}")]
    Gzip {
        /// The decoder's error.
        source: std::io::Error,
    },
    /// The `.npy` header or data could not be parsed.
    #[error("bad npy data: {source}")]
    Npy {
        /// `npyz`'s error.
        source: std::io::Error,
    },
    /// The `.npz` (zip) archive could not be read.
    #[error("bad npz archive: {source}")]
    Zip {
        /// `npyz`'s (zip's) error.
        source: std::io::Error,
    },
}

/// What is wrong with a checkpoint or one of its members (see [`TrainError::Checkpoint`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CheckpointProblem {
    /// The file is not a readable `.npz` (zip) archive: truncated, overwritten or not a
    /// checkpoint. When its entries can be read from the start, the error names the member
    /// the file ends in.
    #[error("not a readable .npz archive ({source}){}", if *.truncated { "; the file ends inside this member (truncated?)" } else { "" })]
    NotAnArchive {
        /// The zip reader's error.
        source: std::io::Error,
        /// Whether the file was found to end inside the member named.
        truncated: bool,
    },
    /// The model has this array but the checkpoint does not.
    #[error("missing (the model has this array, the checkpoint does not)")]
    Missing,
    /// The checkpoint has an array the model does not (another model's checkpoint).
    #[error("not part of this model (the checkpoint is another model's)")]
    Unexpected,
    /// The array's shape is not the model's.
    #[error("has shape {found:?}, expected {expected:?}")]
    Shape {
        /// The shape the model needs (JAX's, as the member is stored).
        expected: Vec<u64>,
        /// The shape stored.
        found: Vec<u64>,
    },
    /// The array's dtype is not the one expected.
    #[error("has dtype {found}, expected {expected}")]
    DType {
        /// The dtype needed, as NumPy writes it (`<f4`, or a kind: `an integer`).
        expected: &'static str,
        /// The dtype stored, as NumPy writes it.
        found: String,
    },
    /// The array is stored in Fortran (column-major) order, which a checkpoint never is.
    #[error("is stored in Fortran order; save it in C order (np.ascontiguousarray)")]
    FortranOrder,
    /// The member's bytes are damaged: a bad `.npy` header, data shorter than its shape, or
    /// a checksum that does not match.
    #[error("is corrupt: {source}")]
    Corrupt {
        /// The reader's error.
        source: std::io::Error,
    },
    /// The checkpoint's description (`stax.json`) is of another model.
    #[error("describes the model {found}, but this one is {expected}")]
    Model {
        /// This model, described.
        expected: String,
        /// What the checkpoint describes.
        found: String,
    },
    /// A value that cannot be right (a negative count, malformed JSON).
    #[error("holds an invalid value: {reason}")]
    Value {
        /// What is wrong.
        reason: String,
    },
    /// Writing failed (a full disk, a file size limit); the previous checkpoint is intact.
    #[error("could not be written ({source}); the previous file at this path is unchanged")]
    Write {
        /// The operating system's error.
        source: std::io::Error,
    },
    /// A tensor of a dtype checkpoints do not store (the trainer's tensors are f32).
    #[error("is a {dtype} tensor; checkpoints store f32 tensors")]
    Unsupported {
        /// Its dtype.
        dtype: stax_tensor::DType,
    },
}

/// `" member `name`"` for an error about one member, `""` for the whole file.
fn member_of(member: &Option<String>) -> String {
    member
        .as_ref()
        .map_or(String::new(), |m| format!(" member `{m}`"))
}

/// `"path: "` for an error about a file, `""` for data made in memory.
fn in_file(path: &Option<PathBuf>) -> String {
    path.as_ref()
        .map_or(String::new(), |p| format!("{}: ", p.display()))
}

/// The kind of a non-finite value (see [`TrainError::NonFinite`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NonFiniteKind {
    /// Not a number.
    NaN,
    /// Positive infinity.
    PosInf,
    /// Negative infinity.
    NegInf,
}

impl NonFiniteKind {
    /// The kind of `x`, or `None` when `x` is finite.
    pub fn of(x: f32) -> Option<Self> {
        if x.is_nan() {
            Some(Self::NaN)
        } else if x == f32::INFINITY {
            Some(Self::PosInf)
        } else if x == f32::NEG_INFINITY {
            Some(Self::NegInf)
        } else {
            None
        }
    }
}

impl std::fmt::Display for NonFiniteKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::NaN => "NaN",
            Self::PosInf => "+inf",
            Self::NegInf => "-inf",
        })
    }
}

impl TrainError {
    /// The allocator's diagnosis inside, if this error is (or wraps) an out-of-memory.
    pub fn oom(&self) -> Option<&stax_alloc::OomReport> {
        match self {
            TrainError::Tensor(t) => t.oom(),
            TrainError::Layer(l) => l.tensor()?.oom(),
            TrainError::Optim(o) => o.tensor()?.oom(),
            TrainError::UpdatedBeforeFailure { source, .. } => source.oom(),
            _ => None,
        }
    }
}

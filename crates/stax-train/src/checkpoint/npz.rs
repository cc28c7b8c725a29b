//! The `.npz` layer of checkpoints: members written as `np.savez` writes them (an uncompressed
//! zip of `name.npy` files), the file replaced atomically, and members read one at a time
//! with every header checked before its data is read.

use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Seek, Write};
use std::path::{Path, PathBuf};

use npyz::zip::result::ZipError;
use npyz::zip::write::FileOptions;
use npyz::zip::{CompressionMethod, DateTime, ZipArchive, ZipWriter};
use npyz::{Endianness, NpyHeader, Order, TypeChar, WriterBuilder};

use crate::TrainError;
use crate::error::CheckpointProblem;

/// The operation named by errors while saving.
pub(super) const SAVE: &str = "save_checkpoint";
/// The operation named by errors while loading.
pub(super) const LOAD: &str = "load_checkpoint";

/// Longest `.npy` header read (NumPy's own limit for format 1.0 is 65535 bytes).
const MAX_HEADER: usize = 1 << 20;

/// A [`TrainError::Checkpoint`] about `member` of `path`.
pub(super) fn problem(
    op: &'static str,
    path: &Path,
    member: Option<&str>,
    problem: CheckpointProblem,
) -> TrainError {
    TrainError::Checkpoint {
        op,
        path: path.to_path_buf(),
        member: member.map(str::to_owned),
        problem: Box::new(problem),
    }
}

fn io_error<'p>(op: &'static str, path: &'p Path) -> impl Fn(io::Error) -> TrainError + 'p {
    move |source| TrainError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

// ---- writing ----

/// Replaces `path` atomically with what `body` writes: into a temporary file in the same
/// directory (`.NAME.PID.tmp`), flushed and `fsync`ed, renamed over `path`, then the
/// directory `fsync`ed so the rename itself is durable. Until the rename `path` is untouched;
/// on any error the temporary file is removed. A process killed mid-write leaves `path` as
/// it was and the temporary file behind.
///
/// # Errors
/// [`TrainError::Io`] when the temporary file cannot be created or renamed; `body`'s errors;
/// [`CheckpointProblem::Write`] when flushing or syncing fails (a full disk).
pub(super) fn write_atomic(
    path: &Path,
    body: impl FnOnce(&mut BufWriter<File>) -> Result<(), TrainError>,
) -> Result<(), TrainError> {
    let io = io_error(SAVE, path);
    let name = path.file_name().ok_or_else(|| {
        io(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a file name",
        ))
    })?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let tmp = dir.join(format!(
        ".{}.{}.tmp",
        name.to_string_lossy(),
        std::process::id()
    ));
    let written = (|| {
        let mut out = BufWriter::new(File::create(&tmp).map_err(&io)?);
        body(&mut out)?;
        let write = |source| problem(SAVE, path, None, CheckpointProblem::Write { source });
        let file = out.into_inner().map_err(|e| write(e.into_error()))?;
        file.sync_all().map_err(write)?;
        std::fs::rename(&tmp, path).map_err(&io)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
        return written;
    }
    File::open(dir).and_then(|d| d.sync_all()).map_err(io)
}

/// Members of an archive being written, each a `.npy` file as `np.savez` stores it.
pub(super) struct Members<'p, W: Write + Seek> {
    zip: ZipWriter<W>,
    path: &'p Path,
}

impl<'p, W: Write + Seek> Members<'p, W> {
    /// An empty archive written to `out`, for the checkpoint at `path` (for errors).
    pub(super) fn new(out: W, path: &'p Path) -> Self {
        Members {
            zip: ZipWriter::new(out),
            path,
        }
    }

    /// Writes member `name`: an array of NumPy dtype `descr` (`<f4`, `<i8`, `|S12`) and
    /// `shape` whose row-major bytes are `data`.
    ///
    /// # Errors
    /// [`CheckpointProblem::Write`] naming the member.
    pub(super) fn array(
        &mut self,
        name: &str,
        descr: &str,
        shape: &[u64],
        data: &[u8],
    ) -> Result<(), TrainError> {
        let fail = |source| {
            problem(
                SAVE,
                self.path,
                Some(name),
                CheckpointProblem::Write { source },
            )
        };
        let dtype = descr
            .parse()
            .map(npyz::DType::Plain)
            .map_err(|e| fail(io::Error::new(io::ErrorKind::InvalidInput, e)))?;
        let options = FileOptions::default()
            .compression_method(CompressionMethod::Stored)
            .last_modified_time(DateTime::default())
            .large_file(data.len() as u64 >= u64::from(u32::MAX) - MAX_HEADER as u64);
        self.zip
            .start_file(npyz::npz::file_name_from_array_name(name), options)
            .map_err(|e| fail(e.into()))?;
        npyz::WriteOptions::<u8>::new()
            .dtype(dtype)
            .shape(shape)
            .writer(&mut self.zip)
            .write_header_only()
            .and_then(|w| w.write_all(data))
            .map_err(fail)
    }

    /// Writes the archive's directory; the archive is complete.
    ///
    /// # Errors
    /// [`CheckpointProblem::Write`].
    pub(super) fn finish(mut self) -> Result<(), TrainError> {
        let path = self.path;
        self.zip.finish().map(drop).map_err(|e| {
            problem(
                SAVE,
                path,
                None,
                CheckpointProblem::Write { source: e.into() },
            )
        })
    }
}

// ---- reading ----

/// How a member's elements are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// IEEE float of this many bytes, big-endian or not.
    Float(u64, bool),
    /// Integer (`signed`) of this many bytes, big-endian or not.
    Int(bool, u64, bool),
    /// Byte string of this length (`|S12`), or one byte (`|u1`).
    Bytes(u64),
    /// Anything else.
    Other,
}

fn kind(header: &NpyHeader) -> Kind {
    let npyz::DType::Plain(t) = header.dtype() else {
        return Kind::Other;
    };
    let big = t.endianness() == Endianness::Big;
    match (t.type_char(), t.size_field()) {
        (TypeChar::Float, n) => Kind::Float(n, big),
        (TypeChar::Int, n @ 1..=8) => Kind::Int(true, n, big),
        (TypeChar::Uint, n @ 1..=8) => Kind::Int(false, n, big),
        (TypeChar::ByteStr, n) => Kind::Bytes(n),
        _ => Kind::Other,
    }
}

/// An archive opened for reading: its members by array name.
pub(super) struct Archive {
    path: PathBuf,
    zip: ZipArchive<BufReader<File>>,
    names: Vec<String>,
}

impl Archive {
    /// Opens `path` and reads its directory (no array is read).
    ///
    /// # Errors
    /// [`TrainError::Io`] when the file cannot be opened; [`CheckpointProblem::NotAnArchive`]
    /// (naming the member the file ends in, when it is truncated inside one).
    pub(super) fn open(path: &Path) -> Result<Archive, TrainError> {
        let file = File::open(path).map_err(io_error(LOAD, path))?;
        let zip = ZipArchive::new(BufReader::new(file)).map_err(|e| not_an_archive(path, e))?;
        let names = zip
            .file_names()
            .filter_map(npyz::npz::array_name_from_file_name)
            .map(str::to_owned)
            .collect();
        Ok(Archive {
            path: path.to_path_buf(),
            zip,
            names,
        })
    }

    /// The file.
    pub(super) fn path(&self) -> &Path {
        &self.path
    }

    /// The array names, in the archive's order.
    pub(super) fn names(&self) -> &[String] {
        &self.names
    }

    /// Whether the archive has array `name`.
    pub(super) fn has(&self, name: &str) -> bool {
        self.names.iter().any(|n| n == name)
    }

    fn fail(&self, name: &str, p: CheckpointProblem) -> TrainError {
        problem(LOAD, &self.path, Some(name), p)
    }

    /// Checks that member `name` holds f32 (`<f4` or `>f4`) in C order of `shape`, reading its
    /// header only.
    ///
    /// # Errors
    /// [`CheckpointProblem::Missing`], [`CheckpointProblem::Shape`],
    /// [`CheckpointProblem::DType`], [`CheckpointProblem::FortranOrder`],
    /// [`CheckpointProblem::Corrupt`], each naming the member.
    pub(super) fn expect_f32(&mut self, name: &str, shape: &[u64]) -> Result<(), TrainError> {
        let path = self.path.clone();
        let (header, _) = self.member(name)?;
        check_f32(&header, shape).map_err(|p| problem(LOAD, &path, Some(name), p))
    }

    /// Reads member `name`, checked as by [`Archive::expect_f32`], into `out` (its row-major
    /// little-endian bytes, `out.len()` of them), streaming from the file.
    ///
    /// # Errors
    /// As [`Archive::expect_f32`]; [`CheckpointProblem::Corrupt`] when the data is short, too
    /// long, or fails its checksum.
    pub(super) fn read_f32(
        &mut self,
        name: &str,
        shape: &[u64],
        out: &mut [u8],
    ) -> Result<(), TrainError> {
        let path = self.path.clone();
        let fail = |p| problem(LOAD, &path, Some(name), p);
        let (header, mut data) = self.member(name)?;
        check_f32(&header, shape).map_err(fail)?;
        read_all(&mut data, out).map_err(|source| fail(CheckpointProblem::Corrupt { source }))?;
        if kind(&header) == Kind::Float(4, true) {
            for word in out.chunks_exact_mut(4) {
                word.reverse();
            }
        }
        Ok(())
    }

    /// The value of scalar integer member `name` (any NumPy integer dtype), or None when the
    /// archive has no such member.
    ///
    /// # Errors
    /// [`CheckpointProblem::Shape`] unless it is a scalar `()`; [`CheckpointProblem::DType`]
    /// unless it is an integer; [`CheckpointProblem::Value`] when it is negative;
    /// [`CheckpointProblem::Corrupt`].
    pub(super) fn read_u64(&mut self, name: &str) -> Result<Option<u64>, TrainError> {
        if !self.has(name) {
            return Ok(None);
        }
        let path = self.path.clone();
        let fail = |p| problem(LOAD, &path, Some(name), p);
        let (header, mut data) = self.member(name)?;
        let Kind::Int(signed, size, big) = kind(&header) else {
            return Err(fail(dtype_problem("an integer", &header)));
        };
        if !header.shape().is_empty() {
            return Err(fail(shape_problem(&[], &header)));
        }
        let mut bytes = vec![0u8; size as usize];
        read_all(&mut data, &mut bytes)
            .map_err(|source| fail(CheckpointProblem::Corrupt { source }))?;
        if !big {
            bytes.reverse();
        }
        let negative = signed && bytes[0] & 0x80 != 0;
        if negative {
            return Err(fail(CheckpointProblem::Value {
                reason: "a negative count".into(),
            }));
        }
        Ok(Some(bytes.iter().fold(0u64, |v, &b| v << 8 | u64::from(b))))
    }

    /// The bytes of text member `name` (a scalar byte string `|S<n>`, as
    /// `np.array(b"...")` stores it), or None when the archive has no such member.
    ///
    /// # Errors
    /// [`CheckpointProblem::DType`] or [`CheckpointProblem::Shape`] for another array;
    /// [`CheckpointProblem::Corrupt`]; a text over 1 MiB is [`CheckpointProblem::Value`].
    pub(super) fn read_text(&mut self, name: &str) -> Result<Option<Vec<u8>>, TrainError> {
        if !self.has(name) {
            return Ok(None);
        }
        let path = self.path.clone();
        let fail = |p| problem(LOAD, &path, Some(name), p);
        let (header, mut data) = self.member(name)?;
        let Kind::Bytes(len) = kind(&header) else {
            return Err(fail(dtype_problem("a byte string (|S)", &header)));
        };
        if !header.shape().is_empty() {
            return Err(fail(shape_problem(&[], &header)));
        }
        if len > MAX_HEADER as u64 {
            return Err(fail(CheckpointProblem::Value {
                reason: format!("a text of {len} bytes (at most {MAX_HEADER})"),
            }));
        }
        let mut bytes = vec![0u8; len as usize];
        read_all(&mut data, &mut bytes)
            .map_err(|source| fail(CheckpointProblem::Corrupt { source }))?;
        // NumPy strips trailing NULs from byte strings; so does this.
        while bytes.last() == Some(&0) {
            bytes.pop();
        }
        Ok(Some(bytes))
    }

    /// Member `name`'s parsed header and a reader at its first data byte.
    fn member(&mut self, name: &str) -> Result<(NpyHeader, impl Read + '_), TrainError> {
        if !self.has(name) {
            return Err(self.fail(name, CheckpointProblem::Missing));
        }
        let path = &self.path;
        let corrupt = |source| {
            problem(
                LOAD,
                path,
                Some(name),
                CheckpointProblem::Corrupt { source },
            )
        };
        let mut entry = self
            .zip
            .by_name(&npyz::npz::file_name_from_array_name(name))
            .map_err(|e| corrupt(e.into()))?;
        let head = read_header_bytes(&mut entry).map_err(corrupt)?;
        if let Some(dims) = crate::data::npy::overflowing_shape(&head) {
            let reason = format!("shape {dims:?} overflows");
            return Err(corrupt(io::Error::new(io::ErrorKind::InvalidData, reason)));
        }
        let header = NpyHeader::from_reader(&head[..]).map_err(corrupt)?;
        Ok((header, entry))
    }
}

fn check_f32(header: &NpyHeader, shape: &[u64]) -> Result<(), CheckpointProblem> {
    if !matches!(kind(header), Kind::Float(4, _)) {
        return Err(dtype_problem("<f4 (float32)", header));
    }
    if header.shape() != shape {
        return Err(shape_problem(shape, header));
    }
    if header.order() == Order::Fortran && shape.iter().filter(|&&d| d > 1).count() > 1 {
        return Err(CheckpointProblem::FortranOrder);
    }
    Ok(())
}

fn dtype_problem(expected: &'static str, header: &NpyHeader) -> CheckpointProblem {
    CheckpointProblem::DType {
        expected,
        found: header.dtype().descr(),
    }
}

fn shape_problem(expected: &[u64], header: &NpyHeader) -> CheckpointProblem {
    CheckpointProblem::Shape {
        expected: expected.to_vec(),
        found: header.shape().to_vec(),
    }
}

/// The magic, version, length and text of a `.npy` header, read from `r`.
fn read_header_bytes(r: &mut impl Read) -> io::Result<Vec<u8>> {
    let mut head = vec![0u8; 8];
    r.read_exact(&mut head)?;
    if &head[..6] != b"\x93NUMPY" {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "not a .npy member (bad magic)",
        ));
    }
    let len_bytes = if head[6] == 1 { 2 } else { 4 };
    let mut len = vec![0u8; len_bytes];
    r.read_exact(&mut len)?;
    let text_len = len
        .iter()
        .rev()
        .fold(0usize, |v, &b| v << 8 | usize::from(b));
    if text_len > MAX_HEADER {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "header over 1 MiB",
        ));
    }
    head.extend_from_slice(&len);
    let start = head.len();
    head.resize(start + text_len, 0);
    r.read_exact(&mut head[start..])?;
    Ok(head)
}

/// Fills `out` from `r`, then checks that `r` ends there (reading to the end also checks the
/// zip entry's CRC).
fn read_all(r: &mut impl Read, out: &mut [u8]) -> io::Result<()> {
    r.read_exact(out).map_err(|e| match e.kind() {
        io::ErrorKind::UnexpectedEof => io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!(
                "the data ends before the {} bytes its shape needs",
                out.len()
            ),
        ),
        _ => e,
    })?;
    match r.read(&mut [0u8; 1])? {
        0 => Ok(()),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "bytes follow the data its shape needs",
        )),
    }
}

/// [`CheckpointProblem::NotAnArchive`] for `path`, naming the member the file ends inside
/// when its entries can be read from the start that far (a truncated file).
fn not_an_archive(path: &Path, e: ZipError) -> TrainError {
    let inside = ends_inside(path);
    let p = CheckpointProblem::NotAnArchive {
        source: e.into(),
        truncated: inside.is_some(),
    };
    problem(LOAD, path, inside.as_deref(), p)
}

/// The array whose entry is cut short, reading `path`'s entries in order from the start.
fn ends_inside(path: &Path) -> Option<String> {
    let mut r = BufReader::new(File::open(path).ok()?);
    loop {
        let mut entry = npyz::zip::read::read_zipfile_from_stream(&mut r).ok()??;
        let name = entry.name().to_owned();
        if io::copy(&mut entry, &mut io::sink()).is_err() {
            return npyz::npz::array_name_from_file_name(&name).map(str::to_owned);
        }
    }
}

//! The `.npz` layer of checkpoints: members written as `np.savez` writes them (an uncompressed
//! zip of `name.npy` files), the file replaced atomically, and members read one at a time
//! with every header checked before its data is read.

use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Seek, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

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
/// directory (`.stax-save.PID.N.tmp`), flushed and `fsync`ed, renamed over `path`, then the
/// directory `fsync`ed so the rename itself is durable. Until the rename `path` is untouched;
/// on any error the temporary file is removed. A process killed mid-write leaves `path` as
/// it was and the temporary file behind.
///
/// # Errors
/// [`TrainError::Io`] when `path` exists and is not a regular file (a directory, a device node,
/// a pipe), or when the temporary file cannot be created or renamed; `body`'s errors;
/// [`CheckpointProblem::Write`] when flushing or syncing fails (a full disk).
pub(super) fn write_atomic(
    path: &Path,
    body: impl FnOnce(&mut BufWriter<File>) -> Result<(), TrainError>,
) -> Result<(), TrainError> {
    let io = io_error(SAVE, path);
    if path.file_name().is_none() {
        let what = "not a file name";
        return Err(io(io::Error::new(io::ErrorKind::InvalidInput, what)));
    }
    // the rename would replace a device node or a pipe (`/dev/full`) with the checkpoint
    if std::fs::metadata(path).is_ok_and(|m| !m.is_file()) {
        let what = "exists and is not a regular file";
        return Err(io(io::Error::new(io::ErrorKind::InvalidInput, what)));
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    // a short name of its own: the checkpoint's name may be as long as a name can be
    static SAVES: AtomicU64 = AtomicU64::new(0);
    let n = SAVES.fetch_add(1, Ordering::Relaxed);
    let tmp = dir.join(format!(".stax-save.{}.{n}.tmp", std::process::id()));
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
///
/// An archive dropped before [`Members::finish`] (a write failed) is abandoned as it is: the
/// zip writer is not dropped, since its `Drop` would try to finish the archive in the failing
/// file and print to stderr (its few bytes of bookkeeping are leaked).
pub(super) struct Members<'p, W: Write + Seek> {
    zip: std::mem::ManuallyDrop<ZipWriter<W>>,
    path: &'p Path,
}

impl<'p, W: Write + Seek> Members<'p, W> {
    /// An empty archive written to `out`, for the checkpoint at `path` (for errors).
    pub(super) fn new(out: W, path: &'p Path) -> Self {
        Members {
            zip: std::mem::ManuallyDrop::new(ZipWriter::new(out)),
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
            .writer(&mut *self.zip)
            .write_header_only()
            .and_then(|w| w.write_all(data))
            .map_err(fail)
    }

    /// Writes the archive's directory; the archive is complete.
    ///
    /// # Errors
    /// [`CheckpointProblem::Write`].
    pub(super) fn finish(self) -> Result<(), TrainError> {
        let Members { zip, path } = self;
        let written = std::mem::ManuallyDrop::into_inner(zip).finish().map(drop);
        written.map_err(|e| {
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
        if path.is_dir() {
            // opening succeeds on Linux; the zip reader's seek would say "Invalid argument"
            let e = io::Error::new(
                io::ErrorKind::IsADirectory,
                "a directory, not a checkpoint file (.npz)",
            );
            return Err(io_error(LOAD, path)(e));
        }
        let file = File::open(path).map_err(io_error(LOAD, path))?;
        let mut zip = ZipArchive::new(BufReader::new(file)).map_err(|e| not_an_archive(path, e))?;
        // in the archive's order (zip's `file_names` is a hash map's)
        let mut names = Vec::with_capacity(zip.len());
        for i in 0..zip.len() {
            let entry = zip.by_index_raw(i).map_err(|e| not_an_archive(path, e))?;
            if let Some(name) = npyz::npz::array_name_from_file_name(entry.name()) {
                names.push(name.to_owned());
            }
        }
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
                reason: "a negative value where a count or step is stored".into(),
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
    let found = match header.dtype() {
        npyz::DType::Plain(t) => t.to_string(),
        other => other.descr(),
    };
    CheckpointProblem::DType { expected, found }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("stax-npz-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// Writes `members` (name, descr, shape, data) to `path` atomically.
    fn write(path: &Path, members: &[(&str, &str, &[u64], &[u8])]) -> Result<(), TrainError> {
        write_atomic(path, |out| {
            let mut m = Members::new(out, path);
            for (name, descr, shape, data) in members {
                m.array(name, descr, shape, data)?;
            }
            m.finish()
        })
    }

    #[test]
    fn a_failed_write_leaves_the_previous_file_and_no_temporary() {
        let dir = scratch("atomic");
        let path = dir.join("ck.npz");
        write(&path, &[("a", "<f4", &[2], &[0, 0, 128, 63, 0, 0, 0, 64])]).unwrap();
        let before = std::fs::read(&path).unwrap();
        // half of a new archive is written, then the disk is full
        let e = write_atomic(&path, |out| {
            let mut m = Members::new(out, &path);
            m.array("a", "<f4", &[2], &[0; 8])?;
            out_of_space(&path)
        })
        .unwrap_err();
        assert!(e.to_string().contains("member `b`"), "{e}");
        assert_eq!(std::fs::read(&path).unwrap(), before);
        let left: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
        assert_eq!(left.len(), 1, "the temporary file is removed");
        let mut a = Archive::open(&path).unwrap();
        let mut out = [0u8; 8];
        a.read_f32("a", &[2], &mut out).unwrap();
        assert_eq!(bytemuck::cast_slice::<u8, f32>(&out), [1.0, 2.0]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn out_of_space(path: &Path) -> Result<(), TrainError> {
        let source = io::Error::new(io::ErrorKind::StorageFull, "no space left on device");
        Err(problem(
            SAVE,
            path,
            Some("b"),
            CheckpointProblem::Write { source },
        ))
    }

    #[test]
    fn scalars_of_any_integer_dtype_and_texts_read_back() {
        let dir = scratch("scalars");
        let path = dir.join("s.npz");
        let big: &[u8] = &[0, 0, 0, 0, 0, 0, 1, 2];
        let members: &[(&str, &str, &[u64], &[u8])] = &[
            ("le", "<u8", &[], &258u64.to_le_bytes()),
            ("be", ">i8", &[], big),
            ("i1", "|i1", &[], &[7]),
            ("neg", "<i4", &[], &(-1i32).to_le_bytes()),
            ("vec", "<i4", &[1], &[1, 0, 0, 0]),
            ("float", "<f4", &[], &[0; 4]),
            ("text", "|S5", &[], b"hi\0\0\0"),
        ];
        write(&path, members).unwrap();
        let mut a = Archive::open(&path).unwrap();
        assert_eq!(a.read_u64("le").unwrap(), Some(258));
        assert_eq!(a.read_u64("be").unwrap(), Some(258));
        assert_eq!(a.read_u64("i1").unwrap(), Some(7));
        assert_eq!(a.read_u64("absent").unwrap(), None);
        assert_eq!(a.read_text("text").unwrap().as_deref(), Some(&b"hi"[..]));
        let msg = |r: Result<Option<u64>, TrainError>| r.unwrap_err().to_string();
        assert!(msg(a.read_u64("neg")).contains("member `neg`: holds an invalid value"));
        assert!(msg(a.read_u64("vec")).contains("has shape [1], expected []"));
        assert!(msg(a.read_u64("float")).contains("has dtype <f4, expected an integer"));
        let e = a.read_f32("float", &[2], &mut [0; 8]).unwrap_err();
        assert!(e.to_string().contains("has shape [], expected [2]"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

//! The on-disk cache of compiled kernel modules. NVRTC takes seconds for some modules
//! (`kernels/dense_mma.cu` 16.3 s, `direct_conv.cu` 7.1 s, `direct_mma.cu` 5.0 s on one core,
//! NVRTC 13.5, 2026-12-04), and every process that opens a CUDA backend compiled all of them
//! (in parallel, so as long as the slowest); the CUBIN (the device's machine code, which the
//! driver loads as it is) is now kept in a file named by a hash of everything that made it (the
//! source with its headers, the options, the architecture, NVRTC's version), so a later process
//! on the machine loads it instead.
//!
//! The cache is best effort: a file that cannot be read, or that the driver refuses to load
//! (`Kernels::load` then compiles the module again and stores it over the file), is compiled
//! again, and a write that fails leaves no file and no error (the run does not depend on it).
//! Files of older sources or NVRTC versions stay until removed: `STAX_KERNEL_CACHE=` (set and
//! empty) turns the cache off; deleting the directory empties it.

use std::ffi::OsString;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// The environment variable naming the cache directory; set and empty, there is no cache.
const CACHE_ENV: &str = "STAX_KERNEL_CACHE";

/// The cache directory: [`CACHE_ENV`] if set (empty: none), else
/// `$XDG_CACHE_HOME/stax-rs/kernels`, else `$HOME/.cache/stax-rs/kernels`; none if none of the
/// three is set.
pub(super) fn dir() -> Option<PathBuf> {
    let var = std::env::var_os;
    dir_from(var(CACHE_ENV), var("XDG_CACHE_HOME"), var("HOME"))
}

/// [`dir`] from the values of [`CACHE_ENV`], `XDG_CACHE_HOME` and `HOME` (an empty
/// `XDG_CACHE_HOME` or `HOME` counts as unset).
fn dir_from(
    cache: Option<OsString>,
    xdg: Option<OsString>,
    home: Option<OsString>,
) -> Option<PathBuf> {
    let set = |v: Option<OsString>| v.filter(|v| !v.is_empty()).map(PathBuf::from);
    match cache {
        Some(v) => set(Some(v)),
        None => set(xdg)
            .or_else(|| set(home).map(|h| h.join(".cache")))
            .map(|c| c.join("stax-rs").join("kernels")),
    }
}

/// The key of a compilation: a 64-bit hash of the source, the options and NVRTC's version
/// (`(major, minor)`). Equal inputs give equal keys within one build of this crate.
pub(super) fn key(src: &str, options: &[String], nvrtc: (i32, i32)) -> u64 {
    let mut h = DefaultHasher::new();
    (src, options, nvrtc).hash(&mut h);
    h.finish()
}

/// The file of `module`'s CUBIN under `key` in `dir`.
fn path(dir: &Path, module: &str, key: u64) -> PathBuf {
    dir.join(format!("{module}-{key:016x}.cubin"))
}

/// The CUBIN cached for `module` under `key`, if a whole file is there (an unreadable or empty
/// file is a miss).
pub(super) fn read(dir: &Path, module: &str, key: u64) -> Option<Vec<u8>> {
    std::fs::read(path(dir, module, key))
        .ok()
        .filter(|cubin| !cubin.is_empty())
}

/// Stores `cubin` for `module` under `key`: written to a file of this call alone (process id
/// and a counter), then renamed, so a reader sees the whole file or none. Errors are ignored
/// (the temporary file removed).
pub(super) fn write(dir: &Path, module: &str, key: u64, cubin: &[u8]) {
    static CALLS: AtomicU64 = AtomicU64::new(0);
    let call = CALLS.fetch_add(1, Ordering::Relaxed);
    let tmp = dir.join(format!(
        "{module}-{key:016x}.{}-{call}.tmp",
        std::process::id()
    ));
    let stored = std::fs::create_dir_all(dir)
        .and_then(|()| std::fs::write(&tmp, cubin))
        .and_then(|()| std::fs::rename(&tmp, path(dir, module, key)));
    if stored.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh directory under the system's temporary one.
    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("stax-kcache-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn a_stored_module_is_read_back_under_its_key_only() {
        let dir = scratch("roundtrip");
        let options = vec!["--gpu-architecture=sm_90".to_string()];
        let k = key("src", &options, (13, 0));
        assert_eq!(
            read(&dir, "a.cu", k),
            None,
            "nothing before the first write"
        );
        write(&dir, "a.cu", k, b"\x7fELF cubin");
        assert_eq!(
            read(&dir, "a.cu", k).as_deref(),
            Some(&b"\x7fELF cubin"[..])
        );
        // another source, option set or NVRTC version is another key: a miss
        for other in [
            key("src ", &options, (13, 0)),
            key("src", &["--gpu-architecture=sm_80".to_string()], (13, 0)),
            key("src", &options, (13, 1)),
        ] {
            assert_ne!(other, k);
            assert_eq!(read(&dir, "a.cu", other), None);
        }
        assert_eq!(read(&dir, "b.cu", k), None, "another module");
        // only the file itself is left: no temporary files
        let files: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
        assert_eq!(files.len(), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_directory_follows_the_variables() {
        let s = |v: &str| Some(OsString::from(v));
        let kernels = |p: &str| Some(Path::new(p).join("stax-rs").join("kernels"));
        assert_eq!(
            dir_from(s("/c"), s("/x"), s("/h")),
            Some(PathBuf::from("/c"))
        );
        assert_eq!(
            dir_from(s(""), s("/x"), s("/h")),
            None,
            "set and empty: off"
        );
        assert_eq!(dir_from(None, s("/x"), s("/h")), kernels("/x"));
        assert_eq!(dir_from(None, s(""), s("/h")), kernels("/h/.cache"));
        assert_eq!(dir_from(None, None, s("/h")), kernels("/h/.cache"));
        assert_eq!(dir_from(None, None, None), None);
    }

    #[test]
    fn an_unwritable_cache_is_a_miss_not_an_error() {
        let dir = scratch("unwritable");
        // a file where the directory should be: create_dir_all fails
        std::fs::write(&dir, "not a directory").unwrap();
        write(&dir, "a.cu", 1, b"cubin");
        assert_eq!(read(&dir, "a.cu", 1), None);
        std::fs::remove_file(&dir).unwrap();
        // an empty file (a cache emptied by hand) is a miss too
        let dir = scratch("empty");
        write(&dir, "a.cu", 2, b"");
        assert_eq!(read(&dir, "a.cu", 2), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

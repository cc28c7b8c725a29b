//! The CUDA backend: one context, one stream, cuBLAS and cuDNN handles, NVRTC-compiled kernels
//! and an allocator over device memory.
//!
//! Work in progress: `CudaBackend::new` probes the CUDA libraries and reports which is missing.

use crate::{BackendOptions, TensorError};
use std::sync::Arc;

/// A CUDA device opened for computing (see the module docs).
#[derive(Debug)]
pub struct CudaBackend {
    _private: (),
}

/// The libraries the backend loads at run time, with a probe for each.
const LIBRARIES: [(&str, unsafe fn() -> bool); 4] = [
    ("libcuda.so (the NVIDIA driver)", cudarc::driver::sys::is_culib_present),
    ("libnvrtc.so (CUDA 13 NVRTC)", cudarc::nvrtc::sys::is_culib_present),
    ("libcublas.so (CUDA 13 cuBLAS)", cudarc::cublas::sys::is_culib_present),
    ("libcudnn.so (cuDNN 9)", cudarc::cudnn::sys::is_culib_present),
];

/// Fails with [`TensorError::CudaUnavailable`] naming the first library that cannot be loaded.
pub(crate) fn probe_libraries() -> Result<(), TensorError> {
    for (library, present) in LIBRARIES {
        // SAFETY: the probe only tries `dlopen` on candidate names and drops the handle.
        if !unsafe { present() } {
            return Err(TensorError::CudaUnavailable {
                library,
                hint: "put the CUDA 13 libraries on the loader path: `source env.sh` on the GPU \
                       machine, or add their directories to LD_LIBRARY_PATH"
                    .into(),
            });
        }
    }
    Ok(())
}

impl CudaBackend {
    /// Opens device `ordinal`.
    ///
    /// # Errors
    /// [`TensorError::CudaUnavailable`] when a CUDA library is missing.
    pub fn new(ordinal: usize, options: &BackendOptions) -> Result<Arc<CudaBackend>, TensorError> {
        let _ = (ordinal, options);
        probe_libraries()?;
        Err(TensorError::CudaUnavailable {
            library: "stax cuda backend",
            hint: "the CUDA backend is being implemented".into(),
        })
    }
}

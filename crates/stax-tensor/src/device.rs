//! Device labels and opening a backend on one.

use crate::{Backend, BackendOptions, TensorError};
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

/// Where a tensor lives: the host, or a CUDA device by ordinal.
///
/// Parsed from `cpu`, `cuda` (device 0) or `cuda:N`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Device {
    /// Host memory, computed on by the CPU backend.
    Cpu,
    /// CUDA device with this ordinal.
    Cuda(usize),
}

impl Device {
    /// Opens a backend on this device: a fresh allocator with `options.strategy`, and on CUDA a
    /// context, stream, library handles and compiled kernels.
    ///
    /// Open each device once per process and share the `Arc`: every open makes a new allocator.
    ///
    /// # Errors
    /// [`TensorError::CudaUnavailable`] when the CUDA libraries cannot be loaded,
    /// [`TensorError::NoSuchDevice`] for a bad ordinal, [`TensorError::Alloc`] for a bad strategy.
    pub fn open(&self, options: &BackendOptions) -> Result<Arc<dyn Backend>, TensorError> {
        Ok(match *self {
            Device::Cpu => crate::cpu::CpuBackend::new(options)? as Arc<dyn Backend>,
            Device::Cuda(ordinal) => {
                crate::cuda::CudaBackend::new(ordinal, options)? as Arc<dyn Backend>
            }
        })
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

impl FromStr for Device {
    type Err = TensorError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || TensorError::InvalidArgument {
            op: "parse device",
            reason: format!("{s:?} is not a device; expected cpu, cuda or cuda:N"),
        };
        match s {
            "cpu" => Ok(Device::Cpu),
            "cuda" => Ok(Device::Cuda(0)),
            _ => s
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(Device::Cuda)
                .ok_or_else(bad),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_devices() {
        assert_eq!("cpu".parse::<Device>().unwrap(), Device::Cpu);
        assert_eq!("cuda".parse::<Device>().unwrap(), Device::Cuda(0));
        assert_eq!("cuda:3".parse::<Device>().unwrap(), Device::Cuda(3));
        assert!("gpu".parse::<Device>().is_err());
        assert!("cuda:x".parse::<Device>().is_err());
        assert_eq!(Device::Cuda(1).to_string(), "cuda:1");
    }
}

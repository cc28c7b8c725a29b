//! The kernel sources and their compilation: one [`KernelModule`] per `kernels/*.cu` file,
//! `kernels/common.cuh` prepended as text, NVRTC for the device's architecture, and a
//! process-wide cache of the PTX.

use crate::TensorError;
use cudarc::nvrtc::CompileOptions;
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

const COMMON: &str = include_str!("../../../../../kernels/common.cuh");

/// One `.cu` file: a module loaded once per backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KernelModule {
    /// `kernels/elementwise.cu`: fill, bias add and gradient, ReLU forward and backward.
    Elementwise,
    /// `kernels/softmax_xent.cu`: softmax cross-entropy with its gradient, and a mean.
    SoftmaxXent,
    /// `kernels/adam.cu`: the fused Adam step.
    Adam,
    /// `kernels/layout.cu`: filter transposes and padding copies for cuDNN.
    Layout,
}

impl KernelModule {
    /// Every module, in index order.
    pub const ALL: [KernelModule; 4] = [
        KernelModule::Elementwise,
        KernelModule::SoftmaxXent,
        KernelModule::Adam,
        KernelModule::Layout,
    ];

    /// The file name, for messages.
    pub fn file(self) -> &'static str {
        match self {
            KernelModule::Elementwise => "elementwise.cu",
            KernelModule::SoftmaxXent => "softmax_xent.cu",
            KernelModule::Adam => "adam.cu",
            KernelModule::Layout => "layout.cu",
        }
    }

    fn source(self) -> &'static str {
        match self {
            KernelModule::Elementwise => include_str!("../../../../../kernels/elementwise.cu"),
            KernelModule::SoftmaxXent => include_str!("../../../../../kernels/softmax_xent.cu"),
            KernelModule::Adam => include_str!("../../../../../kernels/adam.cu"),
            KernelModule::Layout => include_str!("../../../../../kernels/layout.cu"),
        }
    }
}

/// PTX per (module, architecture), shared by every backend of the process.
fn ptx_cache() -> &'static Mutex<HashMap<(KernelModule, String), String>> {
    static CACHE: OnceLock<Mutex<HashMap<(KernelModule, String), String>>> = OnceLock::new();
    CACHE.get_or_init(Default::default)
}

/// Compiles `module` for `arch` (e.g. `sm_90`), or returns the cached PTX.
pub(super) fn compile(module: KernelModule, arch: &str) -> Result<String, TensorError> {
    let key = (module, arch.to_string());
    if let Some(ptx) = ptx_cache()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(&key)
    {
        return Ok(ptx.clone());
    }
    let src = format!(
        "{COMMON}\n#line 1 \"{}\"\n{}",
        module.file(),
        module.source()
    );
    let opts = CompileOptions {
        options: vec![format!("--gpu-architecture={arch}"), "--std=c++17".into()],
        name: Some(module.file().into()),
        ..Default::default()
    };
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(src, opts)
        .map_err(|e| TensorError::Compile {
            kernel: module.file(),
            log: compile_log(e),
        })?
        .to_src();
    ptx_cache()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(key, ptx.clone());
    Ok(ptx)
}

fn compile_log(e: cudarc::nvrtc::CompileError) -> String {
    match e {
        cudarc::nvrtc::CompileError::CompileError { nvrtc, log, .. } => {
            format!("{nvrtc:?}: {}", log.to_string_lossy())
        }
        other => format!("{other:?}"),
    }
}

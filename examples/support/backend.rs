//! The examples' backend: `--device` (CPU, CUDA, or `auto`), `--allocator` (or
//! `STAX_ALLOCATOR`), `--precision`'s matmul precision, `--workspace-limit`, `--budget` on the
//! CPU, and the CUDA-only choices (`--deterministic`, `--conv-apis`, `--fp32-convs`,
//! `--direct-convs`, `--no-dense-adam-rows`), which the CPU names as ignored.

use std::sync::Arc;

use stax::alloc::human_bytes;
use stax::tensor::cpu::CpuBackend;
use stax::tensor::cuda::{ConvApis, CudaBackend, DirectConvs, Fp32Convs};
use stax::{BackendOptions, Device};

use super::{Common, Error, distributed, size_flag};

/// The backend the flags ask for (see the module docs); with `--device auto`, CUDA device 0
/// when it opens, else the CPU with a note.
pub(super) fn open_backend(args: &Common) -> Result<Arc<dyn stax::Backend>, Error> {
    // --allocator overrides STAX_ALLOCATOR, which is then not read at all
    let mut options = match &args.allocator {
        Some(s) => BackendOptions {
            strategy: s.parse().map_err(|e| format!("--allocator: {e}"))?,
            ..BackendOptions::default()
        },
        None => BackendOptions::from_env()?,
    };
    options.precision = args.precision()?.0;
    let given = args.workspace_limit.as_deref();
    let limit = size_flag("--workspace-limit", given)?;
    let flag = given.unwrap_or_default();
    options.workspace_limit = limit
        .map(|b| match usize::try_from(b) {
            // below a MiB the CPU's im2col runs a few columns at a time (hundreds of times
            // slower) and cuDNN has almost nothing to choose from
            Ok(b) if b < 1 << 20 => Err(format!(
                "--workspace-limit {flag}: at least 1MiB (1,048,576 bytes; {} given)",
                human_bytes(b as u64)
            )),
            Ok(b) => Ok(b),
            Err(_) => Err(format!("--workspace-limit {flag}: too large")),
        })
        .transpose()?;
    if args.device != "auto" {
        return match args.device.parse::<Device>()? {
            Device::Cpu => open_cpu(args, &options),
            Device::Cuda(n) => open_cuda(args, distributed::ordinal(n), &options),
        };
    }
    match open_cuda(args, distributed::ordinal(0), &options) {
        Ok(b) => Ok(b),
        Err(e) => {
            eprintln!("note: CUDA not usable ({e}); training on the CPU");
            open_cpu(args, &options)
        }
    }
}

/// The CPU backend; with `--budget`, over host memory capped at the budget (a stand-in for a
/// device of that size: `bfc` works, and running out of memory is the real, typed error).
fn open_cpu(args: &Common, options: &BackendOptions) -> Result<Arc<dyn stax::Backend>, Error> {
    let bfc = matches!(options.strategy, stax::alloc::Strategy::Bfc { .. });
    if bfc && args.budget.is_none() {
        return Err(
            "the bfc allocator on the CPU needs --budget (bfc takes a fraction of a \
                    capacity, and the host reports none)"
                .into(),
        );
    }
    let cuda_only = cuda_only_flags(args);
    if !cuda_only.is_empty() {
        eprintln!(
            "note: ignored on the CPU (CUDA only): {}",
            cuda_only.join(", ")
        );
    }
    Ok(match args.budget()? {
        Some(b) => CpuBackend::with_capacity(options, b)?,
        None => Device::Cpu.open(options)?,
    })
}

/// The CUDA-only flags given away from their defaults (`--deterministic`, `--conv-apis`,
/// `--fp32-convs`, `--direct-convs`, `--no-dense-adam-rows`), as written.
fn cuda_only_flags(args: &Common) -> Vec<&'static str> {
    [
        ("--deterministic", args.deterministic),
        ("--conv-apis", args.conv_apis != ConvApis::default()),
        ("--fp32-convs", args.fp32_convs != Fp32Convs::default()),
        (
            "--direct-convs",
            args.direct_convs != DirectConvs::default(),
        ),
        ("--no-dense-adam-rows", args.no_dense_adam_rows),
    ]
    .into_iter()
    .filter_map(|(flag, given)| given.then_some(flag))
    .collect()
}

/// CUDA device `ordinal`, with the `--deterministic`, `--conv-apis`, `--fp32-convs`,
/// `--direct-convs` and `--no-dense-adam-rows` choices.
fn open_cuda(
    args: &Common,
    ordinal: usize,
    options: &BackendOptions,
) -> Result<Arc<dyn stax::Backend>, Error> {
    let cuda = CudaBackend::new(ordinal, options)?;
    cuda.set_deterministic(args.deterministic);
    cuda.set_conv_apis(args.conv_apis);
    cuda.set_fp32_convs(args.fp32_convs);
    cuda.set_direct_convs(args.direct_convs);
    cuda.set_dense_adam_rows(!args.no_dense_adam_rows);
    Ok(cuda)
}

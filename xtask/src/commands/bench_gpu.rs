//! `cargo xtask bench-gpu`: adds the JAX/PyTorch comparison to a GPU bundle.
//!
//! Copies `../shared/anchors/*.py` into `bundle/anchors/` and writes `bundle/bench.sh` and
//! `bundle/compare.py`. On the GPU machine, `bash bundle/bench.sh` runs our seed step
//! (`stax_cnn --img 200 --batch 100`), `jax_stax_anchor.py` (default and donate) and
//! `torch_anchor.py` one after another on the same GPU and prints the ratios of median step time
//! and peak bytes. `bash bundle/resnet.sh` runs ResNet-50 (batch 128) in TF32 and bf16 with
//! `--profile` (each layer's time), the ResNet-50 anchors in the same modes, and JAX's largest
//! batch in 80 GB. Run `cargo xtask gpu-bundle` first (it builds the examples).

use clap::Args;
use std::fs;
use std::path::PathBuf;

/// Arguments of `cargo xtask bench-gpu`.
#[derive(Debug, Args)]
pub struct BenchGpuArgs {
    /// Folder with the anchor scripts (default: ../shared/anchors relative to the repo root).
    #[arg(long)]
    anchors: Option<PathBuf>,
    /// The bundle folder, relative to the repo root.
    #[arg(long, default_value = "bundle")]
    out: PathBuf,
}

/// Writes the benchmark scripts into the bundle.
///
/// # Errors
/// Missing anchors folder or bundle example, file system errors (with the path).
pub fn run(args: BenchGpuArgs) -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let anchors = args
        .anchors
        .unwrap_or_else(|| root.join("../shared/anchors"));
    let out = root.join(&args.out);
    if !out.join("bins.tar.xz").exists() {
        return Err(format!(
            "bench-gpu: {} has no bins.tar.xz; run `cargo xtask gpu-bundle` first",
            out.display()
        )
        .into());
    }
    let dest = out.join("anchors");
    fs::create_dir_all(&dest)?;
    let names = [
        "jax_stax_anchor.py",
        "torch_anchor.py",
        "jax_resnet50_anchor.py",
        "torch_resnet50_anchor.py",
    ];
    for name in names {
        let src = anchors.join(name);
        fs::copy(&src, dest.join(name))
            .map_err(|e| format!("bench-gpu: {}: {e}", src.display()))?;
    }
    fs::write(out.join("bench.sh"), include_str!("../../assets/bench.sh"))?;
    fs::write(
        out.join("resnet.sh"),
        include_str!("../../assets/resnet.sh"),
    )?;
    fs::write(
        out.join("compare.py"),
        include_str!("../../assets/compare.py"),
    )?;
    println!(
        "bench-gpu: wrote {0}/bench.sh and {0}/resnet.sh; on the device: run with carry [\"{0}\"] and command `bash {0}/bench.sh` (the seed) or `bash {0}/resnet.sh` (ResNet-50)",
        args.out.display()
    );
    Ok(())
}

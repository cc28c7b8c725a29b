//! `cargo xtask gpu-bundle`: build the test binaries, the example and the benches here, and
//! pack them with `env.sh` and a `run.sh` into `bundle/` for the GPU machine (which has no
//! Rust toolchain).
//!
//! The bundle holds `bins.tar.xz` (`tests/`, `examples/`, `benches/`, stripped of debug info
//! and symbols when `strip` or `objcopy` is found, then packed with `tar -J`: about an eighth
//! of their size; run.sh unpacks it with Python's `tarfile`, which every image has),
//! `env.sh` (puts the CUDA 13 libraries on the loader path), `packages` (each test binary's
//! package folder, where cargo would run it) and `run.sh`, which unpacks the binaries, runs
//! every test binary with `STAX_REQUIRE_GPU=1` from its package folder, logs everything to one
//! file, runs the backend life-cycle test again under `compute-sanitizer --tool memcheck
//! --leak-check full` where the sanitizer exists, and ends with `N passed, N failed`. The
//! bundle must stay under [`CARRY_LIMIT`], what the device tool carries beside the working
//! tree; the command fails loudly otherwise.

use clap::Args;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The most the bundle may hold, in bytes: the device tool carries 64 MiB in all, the working
/// tree (about 2 MiB) included.
const CARRY_LIMIT: u64 = 56 << 20;

/// Arguments of `cargo xtask gpu-bundle`.
#[derive(Debug, Args)]
pub struct GpuBundleArgs {
    /// The env.sh to copy (default: ../shared/device/env.sh relative to the repo root).
    #[arg(long)]
    env_sh: Option<PathBuf>,
    /// Output folder, relative to the repo root (ignored by git).
    #[arg(long, default_value = "bundle")]
    out: PathBuf,
    /// Skip the example and the benches (test binaries only).
    #[arg(long)]
    tests_only: bool,
}

/// What can go wrong while bundling.
#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    /// A build (cargo) or pack (tar) command failed.
    #[error("gpu-bundle: `{0}` failed")]
    Command(String),
    /// The bundle is larger than the device tool carries.
    #[error(
        "gpu-bundle: bundle is {bytes} bytes, over the {limit}-byte carry limit; drop targets or strip harder"
    )]
    TooLarge {
        /// Bundle size.
        bytes: u64,
        /// The limit.
        limit: u64,
    },
    /// File system errors, with the path.
    #[error("gpu-bundle: {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> BundleError + '_ {
    move |source| BundleError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// One built executable: where it is, what kind, and its package folder (relative to root).
#[derive(Debug)]
struct Artifact {
    exe: PathBuf,
    kind: &'static str,
    package_dir: String,
}

/// Runs `cargo <args> --message-format=json` in `root`, returning the executables it built
/// whose target kind is `target_kind` (`example`, `bench`), or the test harnesses when `None`
/// (`cargo test` builds examples too, and `cargo bench` the libraries' bench harnesses).
fn build(
    root: &Path,
    args: &[&str],
    kind: &'static str,
    target_kind: Option<&str>,
) -> Result<Vec<Artifact>, BundleError> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let shown = format!("cargo {}", args.join(" "));
    eprintln!("gpu-bundle: {shown}");
    let out = Command::new(&cargo)
        .args(args)
        .arg("--message-format=json")
        .current_dir(root)
        .stderr(Stdio::inherit())
        .output()
        .map_err(|_| BundleError::Command(shown.clone()))?;
    if !out.status.success() {
        return Err(BundleError::Command(shown));
    }
    let mut found = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if msg["reason"] != "compiler-artifact" {
            continue;
        }
        let Some(exe) = msg["executable"].as_str() else {
            continue;
        };
        let wanted = match target_kind {
            None => msg["profile"]["test"] == true,
            Some(k) => msg["target"]["kind"]
                .as_array()
                .is_some_and(|kinds| kinds.iter().any(|v| v.as_str() == Some(k))),
        };
        if !wanted {
            continue;
        }
        let manifest = msg["manifest_path"].as_str().unwrap_or_default();
        let dir = Path::new(manifest).parent().unwrap_or(root);
        let package_dir = dir
            .strip_prefix(root)
            .unwrap_or(Path::new(""))
            .to_string_lossy();
        found.push(Artifact {
            exe: PathBuf::from(exe),
            kind,
            package_dir: if package_dir.is_empty() {
                ".".into()
            } else {
                package_dir.into()
            },
        });
    }
    Ok(found)
}

/// Copies `src` to `dst` and strips its debug info and symbols when a strip tool is available.
fn copy_stripped(src: &Path, dst: &Path) -> Result<(), BundleError> {
    fs::copy(src, dst).map_err(io(dst))?;
    for (tool, flag) in [("strip", "--strip-all"), ("objcopy", "--strip-all")] {
        let ok = Command::new(tool)
            .arg(flag)
            .arg(dst)
            .stderr(Stdio::null())
            .status();
        if ok.is_ok_and(|s| s.success()) {
            return Ok(());
        }
    }
    eprintln!(
        "gpu-bundle: no strip/objcopy found; {} copied as is",
        dst.display()
    );
    Ok(())
}

const RUN_SH: &str = r#"#!/bin/bash
# Generated by `cargo xtask gpu-bundle`. Runs every test binary of the bundle on the GPU
# machine with STAX_REQUIRE_GPU=1, each from its package folder (as cargo test would).
# Usage (repo root): bash bundle/run.sh [args for every test binary, e.g. a test-name filter]
# Env: STAX_BUNDLE_ONLY=<substring> runs only matching binaries; the log goes to
# $STAX_LOG_DIR, else $OUT, else bundle/logs (one file, gpu-tests.log).
BUNDLE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(dirname "$BUNDLE")"
python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
  "$BUNDLE/bins.tar.xz" "$BUNDLE" || exit 1
. "$BUNDLE/env.sh"
export STAX_REQUIRE_GPU=1
LOG_DIR="${STAX_LOG_DIR:-${OUT:-$BUNDLE/logs}}"
mkdir -p "$LOG_DIR"
LOG="$LOG_DIR/gpu-tests.log"
: >"$LOG"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >>"$LOG" 2>&1
passed=0; failed=0; failures=""
while read -r name dir; do
  [ -n "${STAX_BUNDLE_ONLY:-}" ] && [[ "$name" != *"$STAX_BUNDLE_ONLY"* ]] && continue
  echo "==== $name (in $dir)" >>"$LOG"
  start=$(date +%s%N)
  if (cd "$ROOT/$dir" && "$BUNDLE/tests/$name" --nocapture "$@") >>"$LOG" 2>&1; then
    passed=$((passed + 1)); status=ok
  else
    failed=$((failed + 1)); status=FAIL; failures="$failures $name"
  fi
  printf '%-4s %-48s %6d ms\n' "$status" "$name" $(( ($(date +%s%N) - start) / 1000000 ))
done <"$BUNDLE/packages"
# The backend life-cycle test once more under compute-sanitizer's memcheck with a full leak
# check: every device allocation of every backend it opens must be freed by the time it ends.
if command -v compute-sanitizer >/dev/null && [ -z "${STAX_BUNDLE_ONLY:-}" ]; then
  for exe in "$BUNDLE"/tests/gpu_lifecycle-*; do
    name="memcheck:$(basename "$exe")"
    echo "==== $name (in .)" >>"$LOG"
    start=$(date +%s%N)
    if (cd "$ROOT" && compute-sanitizer --tool memcheck --leak-check full --error-exitcode 1 \
        "$exe" --nocapture) >>"$LOG" 2>&1; then
      passed=$((passed + 1)); status=ok
    else
      failed=$((failed + 1)); status=FAIL; failures="$failures $name"
    fi
    printf '%-4s %-48s %6d ms\n' "$status" "$name" $(( ($(date +%s%N) - start) / 1000000 ))
  done
fi
for name in $failures; do
  echo "---- tail of $name"
  awk -v n="==== $name " 'index($0, n) == 1 {p = 1; next} /^==== / {p = 0} p' "$LOG" | tail -n 60
done
echo "gpu-bundle: $passed passed, $failed failed (log: $LOG)"
[ "$failed" -eq 0 ]
"#;

/// Runs the command (see the module docs).
///
/// # Errors
/// A failed build, an I/O error, or a bundle over the carry limit.
pub fn run(args: GpuBundleArgs) -> Result<(), Box<dyn std::error::Error>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap_or(Path::new("."))
        .to_path_buf();
    let out = root.join(&args.out);
    let tests = build(
        &root,
        &["test", "--release", "--no-run", "--workspace"],
        "tests",
        None,
    )?;
    let mut others = Vec::new();
    if !args.tests_only {
        if root.join("examples/stax_cnn.rs").exists() {
            let mut cmd = vec!["build", "--release", "--example", "stax_cnn"];
            if root.join("examples/step_profile.rs").exists() {
                cmd.extend(["--example", "step_profile"]);
            }
            if root.join("examples/alloc_bench.rs").exists() {
                cmd.extend(["--example", "alloc_bench"]);
            }
            if root.join("examples/resnet50.rs").exists() {
                cmd.extend(["--example", "resnet50"]);
            }
            others.extend(build(&root, &cmd, "examples", Some("example"))?);
        } else {
            eprintln!("gpu-bundle: examples/stax_cnn.rs does not exist yet; no example bundled");
        }
        if fs::read_dir(root.join("benches")).is_ok_and(|mut d| d.next().is_some()) {
            others.extend(build(
                &root,
                &["bench", "--no-run", "--workspace"],
                "benches",
                Some("bench"),
            )?);
        } else {
            eprintln!("gpu-bundle: no benches to bundle");
        }
    }
    if out.exists() {
        fs::remove_dir_all(&out).map_err(io(&out))?;
    }
    let mut packages = String::new();
    for a in tests.iter().chain(&others) {
        let dir = out.join(a.kind);
        fs::create_dir_all(&dir).map_err(io(&dir))?;
        let name = a
            .exe
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        copy_stripped(&a.exe, &dir.join(&name))?;
        if a.kind == "tests" {
            packages.push_str(&format!("{name} {}\n", a.package_dir));
        }
    }
    let pkg = out.join("packages");
    fs::write(&pkg, packages).map_err(io(&pkg))?;
    pack(&out)?;
    let env_src = args
        .env_sh
        .unwrap_or_else(|| root.join("../shared/device/env.sh"));
    fs::copy(&env_src, out.join("env.sh")).map_err(io(&env_src))?;
    let run_sh = out.join("run.sh");
    fs::write(&run_sh, RUN_SH).map_err(io(&run_sh))?;
    let bytes = dir_bytes(&out)?;
    eprintln!(
        "gpu-bundle: {} test binaries, {} others, {:.1} MiB in {}",
        tests.len(),
        others.len(),
        bytes as f64 / (1u64 << 20) as f64,
        out.display()
    );
    if bytes > CARRY_LIMIT {
        return Err(BundleError::TooLarge {
            bytes,
            limit: CARRY_LIMIT,
        }
        .into());
    }
    println!(
        "device command: run with carry [\"{}\"] and command \"bash {}/run.sh\"",
        args.out.display(),
        args.out.display()
    );
    Ok(())
}

/// Packs the binary folders of `out` into `out/bins.tar.xz` and removes them (xz: the test
/// binaries share most of their code, which its window finds; a third of gzip's size).
fn pack(out: &Path) -> Result<(), BundleError> {
    let dirs: Vec<&str> = ["tests", "examples", "benches"]
        .into_iter()
        .filter(|d| out.join(d).is_dir())
        .collect();
    let status = Command::new("tar")
        .arg("-cJf")
        .arg(out.join("bins.tar.xz"))
        .arg("-C")
        .arg(out)
        .args(&dirs)
        .status()
        .map_err(io(Path::new("tar")))?;
    if !status.success() {
        return Err(BundleError::Command(format!(
            "tar -cJf bins.tar.xz ({status})"
        )));
    }
    for d in dirs {
        fs::remove_dir_all(out.join(d)).map_err(io(&out.join(d)))?;
    }
    Ok(())
}

/// Total bytes of the files under `dir`.
fn dir_bytes(dir: &Path) -> Result<u64, BundleError> {
    let mut total = 0;
    for entry in fs::read_dir(dir).map_err(io(dir))? {
        let entry = entry.map_err(io(dir))?;
        let meta = entry.metadata().map_err(io(&entry.path()))?;
        total += if meta.is_dir() {
            dir_bytes(&entry.path())?
        } else {
            meta.len()
        };
    }
    Ok(total)
}

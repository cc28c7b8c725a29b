//! One module per `cargo xtask` subcommand.

pub mod bench_gpu;
pub mod data;
pub mod gpu_bundle;

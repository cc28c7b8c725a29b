//! One module per `cargo xtask` subcommand.

pub mod data;
pub mod gpu_bundle;

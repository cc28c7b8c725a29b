//! One module per `cargo xtask` subcommand.

pub mod data;

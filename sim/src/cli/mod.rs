//! The commands of the `cancelsim` binary, one file each; `main.rs` is only the clap grammar.

pub mod check;
pub mod replay;
pub mod run;
pub mod sweep;

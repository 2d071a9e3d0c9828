//! Everything a run leaves for people: the text report, the run directory with its files, the
//! trace and its structural checker, and the plots. It reads the simulation's results
//! (`run::Report`, `record::*`) and nothing else of it.

mod charts;
mod files;
pub mod plots;
mod pools_plot;
mod render;
mod rundir;
pub mod search_plot;
pub mod trace_check;
mod trace_json;

pub use render::render;
pub use rundir::{run_dir, Finished, RunDir, Written};

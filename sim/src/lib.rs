//! cancelsim: a deterministic discrete-event simulator of cancellation in batched LLM inference.
//!
//! See ARCHITECTURE.md at the repository root for the map. In short: `kernel` is the clock, the
//! queue, the random streams, the run hash and the limits; `world` wires the models of the
//! `cancelsim-models` crate through one closed `Event` enum; `scenario` loads RON files;
//! `report` prints and writes results; `replay` runs op logs through the ownership controller.

pub mod capacity;
pub mod check;
pub mod coverage;
pub mod diff;
pub mod dist;
pub mod input;
pub mod kernel;
mod locate;
pub mod metrics;
pub mod output;
pub mod record;
pub mod replay;
pub mod run;
pub mod scenario;
pub mod search;
pub mod stats;
pub mod step_table;
pub mod sweep;
pub mod workload;
pub mod world;

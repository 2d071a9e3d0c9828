//! One replica: either scheduler kind behind the `Scheduler` trait, so the world wires them alike.

use crate::batcher::{Batcher, BatcherConfig};
use crate::engine::{Engine, EngineConfig};
use crate::protocol::Scheduler;

/// A replica's scheduler. A handful live for a whole run; the dynamic call per step is noise
/// beside the step's own work.
pub type Replica = Box<dyn Scheduler>;

/// A continuous-batching (vLLM-like) replica.
pub fn continuous(cfg: EngineConfig) -> Replica {
    Box::new(Engine::new(cfg))
}

/// A dynamic-batching (Triton-like) replica.
pub fn dynamic(cfg: BatcherConfig) -> Replica {
    Box::new(Batcher::new(cfg))
}

//! One replica: either scheduler kind behind one interface, so the world wires them alike.

use crate::batcher::{Batcher, BatcherConfig};
use crate::engine::{Engine, EngineConfig};
use crate::kv::KvPool;
use crate::protocol::{
    Abort, CheckpointReport, Dispatch, NewRequest, Observed, Rejection, Released, StepOutput,
    StepReport,
};

/// Counters common to both kinds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReplicaStats {
    pub steps: u64,
    pub busy_ns: u64,
    pub preemptions: u64,
    pub tokens_delivered: u64,
    /// Tokens sampled and thrown away (in-flight window overshoot, preempted in-flight samples).
    pub tokens_discarded: u64,
    /// Finished members' slots computed in a shared batch.
    pub padding_token_steps: u64,
    pub rejected: u64,
    pub batches: u64,
    pub aborts_handled: u64,
    pub aborts_unknown: u64,
    pub aborts_unobserved: u64,
    pub faults: u64,
    pub corrupted_allocations: u64,
    pub admission_stalls: u64,
    pub marked_blocks_peak: u64,
}

impl ReplicaStats {
    /// Sum another replica's counters into these (peaks take the larger).
    pub fn add(&mut self, s: &ReplicaStats) {
        self.steps += s.steps;
        self.busy_ns += s.busy_ns;
        self.preemptions += s.preemptions;
        self.tokens_delivered += s.tokens_delivered;
        self.tokens_discarded += s.tokens_discarded;
        self.padding_token_steps += s.padding_token_steps;
        self.rejected += s.rejected;
        self.batches += s.batches;
        self.aborts_handled += s.aborts_handled;
        self.aborts_unknown += s.aborts_unknown;
        self.aborts_unobserved += s.aborts_unobserved;
        self.faults += s.faults;
        self.corrupted_allocations += s.corrupted_allocations;
        self.admission_stalls += s.admission_stalls;
        self.marked_blocks_peak = self.marked_blocks_peak.max(s.marked_blocks_peak);
    }
}

// A handful of replicas live in one Vec for the whole run; boxing the larger variant would only
// add an indirection on the per-step path.
#[allow(clippy::large_enum_variant)]
pub enum Replica {
    Continuous(Engine),
    Dynamic(Batcher),
}

impl Replica {
    pub fn continuous(cfg: EngineConfig) -> Self {
        Replica::Continuous(Engine::new(cfg))
    }

    pub fn dynamic(cfg: BatcherConfig) -> Self {
        Replica::Dynamic(Batcher::new(cfg))
    }

    pub fn enqueue(&mut self, now_ns: u64, r: NewRequest) -> Result<(), Rejection> {
        match self {
            Replica::Continuous(e) => e.enqueue(now_ns, r),
            Replica::Dynamic(b) => b.enqueue(now_ns, r),
        }
    }

    pub fn dispatch(&mut self, now_ns: u64) -> Option<Dispatch> {
        match self {
            Replica::Continuous(e) => e.dispatch(now_ns),
            Replica::Dynamic(b) => b.dispatch(now_ns),
        }
    }

    pub fn step_done(
        &mut self,
        now_ns: u64,
        step: u64,
        outputs: &mut Vec<StepOutput>,
        released: &mut Vec<Released>,
    ) -> StepReport {
        match self {
            Replica::Continuous(e) => e.step_done(now_ns, step, outputs, released),
            Replica::Dynamic(b) => b.step_done(now_ns, step, outputs, released),
        }
    }

    pub fn mark_intent(&mut self, now_ns: u64, tag: u32) {
        if let Replica::Continuous(e) = self {
            e.mark_intent(now_ns, tag);
        }
    }

    pub fn take_started(&mut self, into: &mut Vec<u32>) {
        match self {
            Replica::Continuous(e) => e.take_started(into),
            Replica::Dynamic(b) => b.take_started(into),
        }
    }

    pub fn abort(&mut self, a: Abort) {
        match self {
            Replica::Continuous(e) => e.abort(a),
            Replica::Dynamic(b) => b.abort(a),
        }
    }

    pub fn checkpoint(
        &mut self,
        now_ns: u64,
        observed: &mut Vec<Observed>,
        released: &mut Vec<Released>,
    ) -> CheckpointReport {
        match self {
            Replica::Continuous(e) => e.checkpoint(now_ns, observed, released),
            Replica::Dynamic(b) => b.checkpoint(now_ns, observed, released),
        }
    }

    /// When the replica wants a scheduling pass without any other event (a batch timeout).
    pub fn timer_ns(&self) -> Option<u64> {
        match self {
            Replica::Continuous(_) => None,
            Replica::Dynamic(b) => b.timer_ns(),
        }
    }

    /// (waiting, running, KV blocks in use, KV blocks retained by cancelled requests) now.
    pub fn gauges(&self) -> (u64, u64, u64, u64) {
        match self {
            Replica::Continuous(e) => (
                e.waiting_len() as u64,
                e.running_len() as u64,
                e.kv().in_use(),
                e.marked_blocks(),
            ),
            Replica::Dynamic(b) => {
                let (queued, batch) = b.lens();
                (queued as u64, batch as u64, b.kv().in_use(), 0)
            }
        }
    }

    pub fn load(&self) -> u64 {
        match self {
            Replica::Continuous(e) => e.load(),
            Replica::Dynamic(b) => b.load(),
        }
    }

    pub fn is_idle(&self) -> bool {
        match self {
            Replica::Continuous(e) => e.is_idle(),
            Replica::Dynamic(b) => b.is_idle(),
        }
    }

    pub fn kv(&self) -> &KvPool {
        match self {
            Replica::Continuous(e) => e.kv(),
            Replica::Dynamic(b) => b.kv(),
        }
    }

    pub fn stats(&self) -> ReplicaStats {
        match self {
            Replica::Continuous(e) => {
                let s = e.stats();
                ReplicaStats {
                    steps: s.steps,
                    busy_ns: s.busy_ns,
                    preemptions: s.preemptions,
                    tokens_delivered: s.tokens_delivered,
                    tokens_discarded: s.tokens_discarded,
                    padding_token_steps: 0,
                    rejected: s.rejected,
                    batches: 0,
                    aborts_handled: s.aborts_handled,
                    aborts_unknown: s.aborts_unknown + s.aborts_tombstoned,
                    aborts_unobserved: s.aborts_unobserved,
                    faults: s.faults,
                    corrupted_allocations: s.corrupted_allocations,
                    admission_stalls: s.admission_stalls,
                    marked_blocks_peak: s.marked_blocks_peak,
                }
            }
            Replica::Dynamic(b) => {
                let s = b.stats();
                ReplicaStats {
                    steps: s.steps,
                    busy_ns: s.busy_ns,
                    preemptions: 0,
                    tokens_delivered: s.tokens_delivered,
                    tokens_discarded: 0,
                    padding_token_steps: s.padding_token_steps,
                    rejected: s.rejected,
                    batches: s.batches,
                    aborts_handled: s.aborts_handled,
                    aborts_unknown: s.aborts_unknown,
                    aborts_unobserved: s.aborts_unobserved,
                    faults: 0,
                    corrupted_allocations: 0,
                    admission_stalls: 0,
                    marked_blocks_peak: 0,
                }
            }
        }
    }
}

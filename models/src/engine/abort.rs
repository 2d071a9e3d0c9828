//! The engine's cancel side: aborts wait for a checkpoint at a step boundary, reach requests by
//! their handle's scope, may fault with a blast radius, and release blocks fenced or at once.

use super::{free_blocks, Engine, Phase};
use crate::protocol::{
    Abort, BlastRadius, Checkpoint, CheckpointReport, Observed, ReleaseMode, Released, Scope,
    UnknownAbort,
};

impl Engine {
    /// The caller's cancel intent for request `tag` happened now: from here on its blocks count as
    /// retained. Does nothing if the request is not here (or already gone).
    pub fn mark_intent(&mut self, now_ns: u64, tag: u32) {
        let Some(&Some(slot)) = self.slot_of_tag.get(tag as usize) else {
            return;
        };
        let seq = &mut self.seqs[slot as usize];
        if seq.marked || seq.tag != tag {
            return;
        }
        seq.touch(now_ns);
        seq.marked = true;
        self.marked_blocks += seq.blocks + seq.fenced_blocks;
        self.stats.marked_blocks_peak = self.stats.marked_blocks_peak.max(self.marked_blocks);
    }

    /// An abort arrives at the engine. It takes effect at the next checkpoint.
    pub fn abort(&mut self, a: Abort) {
        self.pending_aborts.push(a);
    }

    /// A scheduler pass begins: if it is a checkpoint, handle the pending aborts. Every request
    /// an abort reaches leaves the waiting queue or the running set now; a step already in
    /// flight keeps it (its output will be discarded). Call before `dispatch`.
    ///
    /// The engine loop looks at aborts between steps, never during one: a pass is a checkpoint
    /// only right after a step ended, or while nothing is in flight. With `EveryPasses(k)`, only
    /// every k-th such boundary is.
    pub fn checkpoint(
        &mut self,
        now_ns: u64,
        observed: &mut Vec<Observed>,
        released: &mut Vec<Released>,
    ) -> CheckpointReport {
        let mut report = CheckpointReport::default();
        if !self.is_checkpoint() {
            return report;
        }
        let mut aborts = std::mem::take(&mut self.pending_aborts);
        for a in &aborts {
            self.handle_abort(a, now_ns, &mut report, observed, released);
        }
        let seqs = &self.seqs;
        self.running
            .retain(|&slot| seqs[slot as usize].phase == Phase::Running);
        self.waiting
            .retain(|&slot| seqs[slot as usize].phase == Phase::Waiting);
        aborts.clear();
        if self.pending_aborts.is_empty() {
            self.pending_aborts = aborts;
        }
        report
    }

    /// Whether this pass handles the pending aborts. Every pass consumes the step boundary,
    /// whether or not aborts are pending; a backend that never checks drops them unobserved.
    fn is_checkpoint(&mut self) -> bool {
        let boundary = self.at_boundary || self.inflight.is_empty();
        self.at_boundary = false;
        if self.pending_aborts.is_empty() {
            return false;
        }
        let k = match self.cfg.checkpoint {
            Checkpoint::Never => {
                self.stats.aborts_unobserved += self.pending_aborts.len() as u64;
                self.pending_aborts.clear();
                return false;
            }
            Checkpoint::EveryPasses(k) => k.max(1) as u64,
        };
        if !boundary {
            return false;
        }
        self.passes += 1;
        self.passes % k == 0
    }

    fn handle_abort(
        &mut self,
        a: &Abort,
        now_ns: u64,
        report: &mut CheckpointReport,
        observed: &mut Vec<Observed>,
        released: &mut Vec<Released>,
    ) {
        report.aborts += 1;
        self.stats.aborts_handled += 1;
        let mut reached = 0u32;
        for slot in self.live_slots() {
            if a.scope.reaches(&self.seqs[slot as usize].handle) {
                self.abort_seq(slot, now_ns, true, observed, released);
                reached += 1;
            }
        }
        let mut fault = a.fault;
        if reached == 0 {
            if let Scope::Request(rid) = a.scope {
                if self.cfg.tombstones && self.tombstones.contains(rid) {
                    report.tombstoned += 1;
                    self.stats.aborts_tombstoned += 1;
                    return;
                }
            }
            report.unknown += 1;
            self.stats.aborts_unknown += 1;
            if let UnknownAbort::Fault(radius) = self.cfg.unknown_abort {
                fault = Some(radius);
            }
        }
        if let Some(radius) = fault {
            report.faults += 1;
            self.stats.faults += 1;
            let victims: Vec<u32> = match radius {
                BlastRadius::Request => Vec::new(),
                BlastRadius::Batch => self.running.clone(),
                BlastRadius::Engine => self.live_slots(),
            };
            for slot in victims {
                self.abort_seq(slot, now_ns, false, observed, released);
            }
        }
    }

    /// Slots of requests still waiting or running, in a fixed order (running, then waiting).
    fn live_slots(&self) -> Vec<u32> {
        let seqs = &self.seqs;
        self.running
            .iter()
            .chain(self.waiting.iter())
            .copied()
            .filter(|&s| matches!(seqs[s as usize].phase, Phase::Running | Phase::Waiting))
            .collect()
    }

    fn abort_seq(
        &mut self,
        slot: u32,
        now_ns: u64,
        in_scope: bool,
        observed: &mut Vec<Observed>,
        released: &mut Vec<Released>,
    ) {
        let seq = &mut self.seqs[slot as usize];
        if !matches!(seq.phase, Phase::Running | Phase::Waiting) {
            return; // already removed by an earlier abort of this checkpoint
        }
        seq.phase = Phase::Aborted;
        seq.touch(now_ns);
        let blocks = seq.blocks + seq.fenced_blocks;
        observed.push(Observed {
            id: seq.id,
            tag: seq.tag,
            in_scope,
        });
        match self.cfg.release {
            ReleaseMode::Fenced => {
                seq.fenced_blocks = blocks;
                seq.blocks = 0;
                if seq.inflight == 0 {
                    free_blocks(&mut self.kv, &mut self.marked_blocks, seq.marked, blocks);
                    seq.fenced_blocks = 0;
                }
            }
            ReleaseMode::Immediate => {
                seq.blocks = 0;
                seq.fenced_blocks = 0;
                free_blocks(&mut self.kv, &mut self.marked_blocks, seq.marked, blocks);
                if seq.inflight > 0 && blocks > 0 {
                    // The newest dispatched step is the last that can still write them.
                    self.taint.push(blocks, self.step_next - 1);
                }
                // The blocks are back in the pool now: that is the release, whatever still runs.
                seq.released_sent = true;
                released.push(seq.released());
            }
        }
        self.try_retire(slot, released);
    }
}

//! The engine's cancel side: aborts wait for a checkpoint at a step boundary, reach requests by
//! their handle's scope, may fault with a blast radius, and release blocks fenced or at once.
//! (`abort`, `checkpoint` and `mark_intent` themselves are the `Scheduler` methods in `mod.rs`.)

use super::{Engine, Phase};
use crate::protocol::{
    Abort, BlastRadius, Checkpoint, CheckpointReport, Observed, Outbox, ReleaseMode, Scope,
    UnknownAbort,
};

impl Engine {
    /// Whether this pass handles the pending aborts. Every pass consumes the step boundary,
    /// whether or not aborts are pending; a backend that never checks drops them unobserved.
    pub(super) fn is_checkpoint(&mut self) -> bool {
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

    /// The ideal cancel's aborts take effect now, whatever the checkpoint: the baseline every
    /// real policy is measured against.
    pub(super) fn handle_ideal(
        &mut self,
        now_ns: u64,
        report: &mut CheckpointReport,
        out: &mut Outbox,
    ) {
        let (ideal, rest): (Vec<Abort>, Vec<Abort>) =
            self.pending_aborts.drain(..).partition(|a| a.ideal);
        self.pending_aborts = rest;
        self.ideal_pending = 0;
        for a in &ideal {
            self.handle_abort(a, now_ns, report, out);
        }
        let seqs = &self.seqs;
        self.running
            .retain(|&slot| seqs[slot as usize].phase == Phase::Running);
        self.waiting.compact(&self.seqs);
    }

    pub(super) fn handle_abort(
        &mut self,
        a: &Abort,
        now_ns: u64,
        report: &mut CheckpointReport,
        out: &mut Outbox,
    ) {
        report.aborts += 1;
        self.stats.aborts_handled += 1;
        if !self.abort_keys.insert(a.key) {
            // The same cancel delivered again (a duplicate or a retry): idempotent.
            report.duplicates += 1;
            self.stats.aborts_duplicate += 1;
            return;
        }
        let mut reached = 0u32;
        for slot in self.reached_by(a.scope) {
            self.abort_seq(slot, now_ns, (true, a.ideal), out);
            reached += 1;
        }
        let mut fault = a.fault;
        if reached == 0 {
            if let Scope::Request(rid) = a.scope {
                if self.cfg.tombstones && self.tombstones.contains(&rid) {
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
                self.abort_seq(slot, now_ns, (false, false), out);
            }
        }
    }

    /// The live requests `scope` reaches, in a fixed order (running, then waiting). A request
    /// scope looks its id up, so a per-request abort costs O(1); only when several live
    /// requests share the id (a reused client id) does it scan, for the same order.
    fn reached_by(&self, scope: Scope) -> Vec<u32> {
        if let Scope::Request(rid) = scope {
            let live = |s: &&u32| {
                matches!(
                    self.seqs[**s as usize].phase,
                    Phase::Running | Phase::Waiting
                )
            };
            let slots = self.by_runtime.slots(rid);
            if slots.iter().filter(live).count() <= 1 {
                return slots.iter().filter(live).copied().collect();
            }
        }
        let seqs = &self.seqs;
        self.live_slots()
            .into_iter()
            .filter(|&s| scope.reaches(&seqs[s as usize].handle))
            .collect()
    }

    /// Slots of requests still waiting or running, in a fixed order (running, then waiting).
    fn live_slots(&self) -> Vec<u32> {
        let seqs = &self.seqs;
        let waiting = self.waiting.iter(seqs);
        self.running
            .iter()
            .copied()
            .chain(waiting)
            .filter(|&s| matches!(seqs[s as usize].phase, Phase::Running | Phase::Waiting))
            .collect()
    }

    /// Remove the request in `slot`: `in_scope` (reached by the abort's scope, not collateral),
    /// and `ideal` (the ideal cancel: blocks back at once, with no hazard).
    fn abort_seq(
        &mut self,
        slot: u32,
        now_ns: u64,
        (in_scope, ideal): (bool, bool),
        out: &mut Outbox,
    ) {
        if !matches!(
            self.seqs[slot as usize].phase,
            Phase::Running | Phase::Waiting
        ) {
            return; // already removed by an earlier abort of this checkpoint
        }
        if self.is_member(slot) {
            self.eject(slot, &mut out.implicit);
        }
        let seq = &mut self.seqs[slot as usize];
        if seq.phase == Phase::Waiting {
            self.waiting.left();
        }
        seq.phase = Phase::Aborted;
        seq.touch(now_ns);
        let blocks = seq.blocks + seq.fenced_blocks;
        out.observed.push(Observed {
            id: seq.id,
            tag: seq.tag,
            in_scope,
        });
        let release = if ideal {
            ReleaseMode::Immediate
        } else {
            self.cfg.release
        };
        match release {
            ReleaseMode::Fenced => {
                self.pool.fence(seq.blocks);
                seq.fence();
                self.pool.release_fenced(seq);
            }
            ReleaseMode::Immediate => {
                self.pool.unfence(seq.fenced_blocks);
                seq.fence();
                seq.fenced_blocks = 0;
                let cached = std::mem::take(&mut seq.fenced_cached);
                self.pool.free(seq, blocks, &cached);
                if seq.inflight > 0 && blocks > 0 && !ideal {
                    // The newest dispatched step is the last that can still write them.
                    self.taint.push(blocks, self.step_next - 1);
                }
                // The blocks are back in the pool now: that is the release, whatever still runs.
                seq.released_sent = true;
                out.released.push(seq.released());
            }
        }
        self.try_retire(slot, out);
    }
}

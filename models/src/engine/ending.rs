//! The end of a step: each entry's share of it (its outcome, and its fenced blocks back once no
//! step in flight holds them), the streak's extras among the entries in running order, and the
//! requests that leave the engine then.

use super::seq::{Ended, Entry, Phase, Step};
use super::streak::Extra;
use super::{Engine, NO_SLOT};
use crate::protocol::{Outbox, Outcome, Retired, StepOutput};

impl Engine {
    /// One request's share of a processed step: its outcome, and its fenced blocks back to the
    /// pool once no step in flight uses them. Whether it finished with this token, and whether
    /// it may leave now (finished or aborted, and in no step in flight): `try_retire`'s own
    /// test, made here while the request is at hand, as most entries' requests stay.
    #[inline]
    fn process_entry(
        &mut self,
        e: &Entry,
        now_ns: u64,
        outputs: &mut Vec<StepOutput>,
    ) -> (bool, bool) {
        let seq = &mut self.seqs[e.slot as usize];
        let Ended {
            outcome,
            inflight,
            fenced_before,
            fenced,
        } = seq.step_ended(e, now_ns);
        if fenced != fenced_before {
            self.pool.fence(fenced - fenced_before);
        }
        match outcome {
            Outcome::Token { .. } => self.stats.tokens_delivered += 1,
            Outcome::Discarded { sampled: true } => self.stats.tokens_discarded += 1,
            _ => {}
        }
        outputs.push(StepOutput {
            id: seq.id,
            tag: seq.tag,
            corrupted: seq.corrupted,
            tokens: e.tokens,
            outcome,
        });
        if inflight == 0 && fenced > 0 {
            seq.touch(now_ns);
            self.pool.release_fenced(seq);
        }
        let leaves = inflight == 0 && matches!(seq.phase, Phase::Finished | Phase::Aborted);
        (matches!(outcome, Outcome::Token { last: true, .. }), leaves)
    }

    /// The entries of step `s` and its streak's extras, in running order (both are sorted):
    /// the tokens of its entries, and whether a request finished.
    pub(super) fn process_step(
        &mut self,
        s: &Step,
        extra: &[Extra],
        now_ns: u64,
        out: &mut Outbox,
    ) -> (u64, bool) {
        let (mut tokens, mut finished_any) = (0, false);
        let (mut i, mut j) = (0, 0);
        while i < s.entries.len() || j < extra.len() {
            let e = match extra.get(j) {
                Some(&x)
                    if i == s.entries.len()
                        || self.run_order(x.slot()) < self.run_order(s.entries[i].slot) =>
                {
                    j += 1;
                    match x {
                        Extra::Drain(e) => e,
                        Extra::Note { slot, index } => {
                            self.note(slot, index, &mut out.outputs);
                            continue;
                        }
                    }
                }
                _ => {
                    i += 1;
                    tokens += s.entries[i - 1].tokens as u64;
                    s.entries[i - 1]
                }
            };
            let (finished, leaves) = self.process_entry(&e, now_ns, &mut out.outputs);
            finished_any |= finished;
            // A request appears at most once per step, so it is retired at most once here.
            if leaves {
                self.try_retire(e.slot, out);
            }
        }
        (tokens, finished_any)
    }

    /// The running order of a request (`Run::run_order`).
    #[inline]
    fn run_order(&self, slot: u32) -> u64 {
        self.seqs[slot as usize].run_order
    }

    /// A streak member's token `index` comes out as an output (`streak.rs`: its notes).
    fn note(&self, slot: u32, index: u32, outputs: &mut Vec<StepOutput>) {
        let seq = &self.seqs[slot as usize];
        debug_assert!(index < seq.output && !seq.corrupted);
        outputs.push(StepOutput {
            id: seq.id,
            tag: seq.tag,
            corrupted: false,
            tokens: 1,
            outcome: Outcome::Token { index, last: false },
        });
    }

    /// Leave the engine once finished or aborted and no step in flight uses the request.
    pub(super) fn try_retire(&mut self, slot: u32, out: &mut Outbox) {
        let seq = &mut self.seqs[slot as usize];
        if !matches!(seq.phase, Phase::Finished | Phase::Aborted) || seq.inflight > 0 {
            return;
        }
        debug_assert_eq!(seq.blocks + seq.fenced_blocks, 0);
        if !seq.released_sent {
            seq.released_sent = true;
            out.released.push(seq.released());
        }
        out.retired.push(Retired {
            id: seq.id,
            tag: seq.tag,
        });
        if self.slot_of_tag.get(seq.tag as usize) == Some(&slot) {
            self.slot_of_tag[seq.tag as usize] = NO_SLOT;
        }
        if self.cfg.tombstones {
            self.tombstones.insert(seq.handle.runtime_id);
        }
        let rid = seq.handle.runtime_id;
        self.by_runtime.remove(rid, slot);
        self.streak_forget(slot);
        self.seqs[slot as usize].retire();
        self.free_slots.push(slot);
        self.live -= 1;
    }
}

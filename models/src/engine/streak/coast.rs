//! Coasting: the quiet turns a replica takes if nothing reaches it, found before they come.
//!
//! A turn (`Engine::turn`) is quiet for reasons of two kinds: what only something from outside
//! changes (a request waiting, an abort pending, a drain, tainted blocks, the window's fill),
//! and what the streak itself reaches at a known step (a member's last token, an output by
//! phase, a block boundary that needs blocks). With nothing from outside, the first kind stays
//! as it is and the second is read off by step number, so the turns ahead, and the times their
//! steps end, are known now: the caller may take them later, together, at the same times
//! (`Engine::coast_ends`). A prediction may stop short (it is then merely shorter), never run
//! long: each turn it names is one that `turn` takes.

use super::super::seq::Step;
use super::super::Engine;
use crate::gpu::StepShape;
use crate::protocol::{Dispatch, StepReport};

/// The steps a coast found ahead (`Engine::coast_ends`), each a streak step of `decode_seqs`
/// members and no entry: its KV read and its time, in order; those before `next` are taken.
#[derive(Debug, Default)]
pub(in super::super) struct Ahead {
    decode_seqs: u64,
    steps: Vec<(u64, u64)>,
    next: usize,
}

impl Ahead {
    fn start(&mut self, decode_seqs: u64) {
        (self.decode_seqs, self.next) = (decode_seqs, 0);
        self.steps.clear();
    }

    /// The time of the next step found, if it has this shape (the same time: `step_ns` is a
    /// function of the shape). One that does not ends what was found.
    #[inline(always)]
    fn take(&mut self, shape: StepShape) -> Option<u64> {
        let &(kv, ns) = self.steps.get(self.next)?;
        let found = StepShape::decode_only(self.decode_seqs, kv);
        if shape != found {
            self.start(0);
            return None;
        }
        self.next += 1;
        Some(ns)
    }
}

impl Engine {
    /// What keeps a turn quiet that only something from outside the streak changes: the step
    /// in flight, `s`, holds the streak and nothing else, and so would the next one.
    #[inline(always)]
    pub(super) fn turn_still(&self, s: &Step) -> bool {
        let members = self.streak.members;
        s.entries.is_empty()
            && s.streak > 0
            && self.streak.drains.is_empty()
            && self.pending_aborts.is_empty()
            && self.ideal_pending == 0
            && self.inflight.len() as u32 == self.cfg.window
            && self.cfg.chunked_prefill
            && self.waiting.len() == 0
            && self.taint.blocks() == 0
            && self.running.len() == members as usize
            && members <= self.cfg.max_num_batched_tokens
    }

    /// Whether the streak step's `growth` blocks can be taken in its order (the `planned`
    /// entries, then the members in the boundary bucket) to the same effect as in the running
    /// order. Either every allocation takes a block with no content, evicting nothing; or, with
    /// no entry planned (so nothing is cached between the allocations), every allocation
    /// succeeds and the cache evicts its oldest blocks: the same ones in the same order
    /// whichever member asks first (blocks are counts: which request holds which is not kept).
    /// A planned entry could cache a block that an earlier allocation, one at a time, would
    /// have evicted first.
    pub(super) fn streak_fits(&self, growth: u64, planned: bool) -> bool {
        growth <= self.pool.clean_blocks() || (!planned && growth <= self.pool.free_blocks())
    }

    /// Whether no member's token of streak step `j` can come out as an output.
    pub(super) fn no_notes(&self, j: u64) -> bool {
        let k = self.cfg.lazy_output_every as u64;
        k == 0
            || self
                .streak
                .notes
                .get((j % k) as usize)
                .is_none_or(Vec::is_empty)
    }

    /// The turns ahead, if nothing from outside reaches this engine: into `ends`, the end of
    /// the step in flight, then the end of each step launched by a quiet turn, at most
    /// `turns_max` of them. So `ends[i]`, for `i < ends.len() - 1`, is when the `i`-th turn
    /// ahead comes and is quiet, and launches the step that ends at `ends[i + 1]`; the last end
    /// is a step's whose turn may not be quiet. Empty where not even the next turn is known
    /// to be. One step in flight at a time only (`window` 1), whose start is its predecessor's
    /// end; and only growth that takes blocks with no content, which no turn ahead can change.
    pub fn coast_ends(&mut self, turns_max: u32, ends: &mut Vec<u64>) {
        ends.clear();
        let mut ahead = std::mem::take(&mut self.streak.ahead);
        ahead.start(self.streak.members as u64);
        self.find_ends(turns_max, ends, &mut ahead);
        self.streak.ahead = ahead;
    }

    /// Whether `coast_ends` can ever name a turn: with one step in flight at a time only, as
    /// `find_ends` asks.
    pub fn may_coast(&self) -> bool {
        self.cfg.window == 1
    }

    /// The time of a step a turn launches: found by the coast ahead where it has this shape
    /// (the same time: `costing.step_ns` is a function of the shape), worked out otherwise.
    #[inline(always)]
    pub(super) fn step_ns_ahead(&mut self, shape: StepShape) -> u64 {
        match self.streak.ahead.take(shape) {
            Some(ns) => ns,
            None => self.costing.step_ns(shape),
        }
    }

    /// The turns at `at` in one call, as `turn` takes them one by one: step `step`, in flight,
    /// ends at `at[0]`, and each turn's step at the next tick. Each turn's report and dispatch
    /// go into `out`, up to the first turn that is not quiet. After one turn (this call's
    /// first, or the caller's last call, `after_turn`), what only something from outside
    /// changes still holds and no one waits, so each turn checks only what the streak reaches
    /// and does only what changes (`turns_again`).
    pub fn turns_at(
        &mut self,
        step: u64,
        at: &[u64],
        after_turn: bool,
        out: &mut Vec<(StepReport, Dispatch)>,
    ) {
        out.clear();
        let mut at = at;
        if !after_turn {
            let Some((&now_ns, rest)) = at.split_first() else {
                return;
            };
            let Some((report, d)) = self.turn(now_ns, step) else {
                return;
            };
            out.push((report, d));
            at = rest;
        }
        let step = out.last().map_or(step, |(_, d)| d.step);
        self.turns_again(step, at, out);
    }

    /// `turn` at each tick of `at`, right after a quiet `turn` with nothing from outside
    /// since: the conditions `turn_still` checks still hold, and the pass's `admit_waiting`,
    /// with no one waiting and the waiting front's run forgotten, changes nothing. So: the
    /// streak's own checks, the step in flight's end, and the next streak step in its place
    /// (the same step `launch` would put there: no entries, the streak's members). The step in
    /// flight is kept in locals between turns and put back once.
    fn turns_again(&mut self, step: u64, at: &[u64], out: &mut Vec<(StepReport, Dispatch)>) {
        let Some(s) = self.inflight.front() else {
            return;
        };
        debug_assert!(self.turn_still(s));
        let mut step = step;
        let (mut id, mut end_ns, mut duration_ns) = (s.id, s.end_ns, s.duration_ns);
        let (mut streak_step, mut tokens) = (s.streak_step, s.streak as u64);
        let members = self.streak.members;
        let mut taken = false;
        for &now_ns in at {
            let d = self.streak.dispatched;
            let bucket = self.streak.bucket;
            let growth = self.streak.boundary.get(bucket).map_or(0, Vec::len) as u64;
            let quiet = id == step
                && end_ns == now_ns
                && self.streak.ends.peek().is_none_or(|e| e.0 .0 > d)
                && self.no_notes(streak_step)
                && self.streak_fits(growth, false);
            if !quiet {
                break;
            }
            assert_eq!(
                streak_step, self.streak.processed,
                "streak steps end in order"
            );
            self.streak.processed += 1;
            self.stats.tokens_delivered += tokens;
            self.taint.step_ended(step);
            debug_assert!(!self.at_boundary, "the turn before left no boundary");
            let report = StepReport {
                step,
                duration_ns,
                tokens,
                streak: Some(streak_step),
            };
            if growth > 0 {
                self.streak_grow(bucket, now_ns);
            }
            let kv = self.streak_kv(d).expect("the streak reads a negative KV");
            let shape = StepShape::decode_only(members as u64, kv);
            duration_ns = self.step_ns_ahead(shape);
            let (dispatch, launched) = self.clock(now_ns, duration_ns, 0, members);
            (id, end_ns, streak_step, tokens) =
                (dispatch.step, dispatch.end_ns, launched, members as u64);
            (step, taken) = (dispatch.step, true);
            out.push((report, dispatch));
        }
        if taken {
            let s = self.inflight.front_mut().expect("a step in flight");
            (s.id, s.end_ns, s.duration_ns) = (id, end_ns, duration_ns);
            (s.streak, s.streak_step) = (members, streak_step);
        }
    }

    fn find_ends(&self, turns_max: u32, ends: &mut Vec<u64>, ahead: &mut Ahead) {
        let Some(s) = self.inflight.front() else {
            return;
        };
        let k = &self.streak;
        let members = k.members as u64;
        if !self.may_coast()
            || !self.turn_still(s)
            || s.streak_step != k.processed
            || s.end_ns != self.gpu_free_ns
        {
            return;
        }
        // A left member's entry may head `ends` still: an earlier stop, never a later one.
        let last_from = k.ends.peek().map_or(u64::MAX, |e| e.0 .0);
        let block_tokens = self.cfg.block_tokens as usize;
        let mut clean = self.pool.clean_blocks();
        let mut end_ns = s.end_ns;
        ends.push(end_ns);
        let Some(kv0) = self.streak_kv(k.dispatched) else {
            ends.clear();
            return;
        };
        // The KV read grows by one token a member each step (`streak_kv`).
        let mut times = self.costing.streak_times(members, kv0, turns_max as u64);
        for i in 0..turns_max as u64 {
            let d = k.dispatched + i;
            let bucket = (k.bucket + i as usize) % block_tokens;
            let growth = k.boundary.get(bucket).map_or(0, Vec::len) as u64;
            if d >= last_from || !self.no_notes(k.processed + i) || growth > clean {
                break;
            }
            clean -= growth;
            let Some(kv) = self.streak_kv(d) else {
                break;
            };
            let duration_ns = times.next_ns();
            debug_assert_eq!(
                duration_ns,
                self.costing.step_ns(StepShape::decode_only(members, kv))
            );
            let Some(next_ns) = end_ns.checked_add(duration_ns) else {
                break;
            };
            ahead.steps.push((kv, duration_ns));
            end_ns = next_ns;
            ends.push(end_ns);
        }
        if ends.len() == 1 {
            ends.clear();
            ahead.start(0);
        }
    }
}

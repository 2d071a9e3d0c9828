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
        self.find_ends(turns_max, ends);
    }

    /// Whether `coast_ends` can ever name a turn: with one step in flight at a time only, as
    /// `find_ends` asks.
    pub fn may_coast(&self) -> bool {
        self.cfg.window == 1
    }

    /// The turns at `ends` in one call, as `turn` takes them one by one: step `step`, in
    /// flight, ends at `ends[0]`, and the step each turn launches at the next tick. `ends` is
    /// a run of what `coast_ends` found, and nothing has called in since: each step's time is
    /// the span between its ticks (checked against the step's shape with debug assertions).
    /// Each turn's report and dispatch go into `out`, up to the first turn that is not quiet.
    /// After one turn (this call's first, or the caller's last call, `after_turn`), what only
    /// something from outside changes still holds and no one waits, so each turn checks only
    /// what the streak reaches and does only what changes (`turns_again`).
    pub fn turns_at(
        &mut self,
        step: u64,
        ends: &[u64],
        after_turn: bool,
        out: &mut Vec<(StepReport, Dispatch)>,
    ) {
        out.clear();
        let mut ends = ends;
        if !after_turn {
            let [now_ns, ref rest @ ..] = *ends else {
                return;
            };
            if rest.is_empty() {
                return;
            }
            let Some((report, d)) = self.turn(now_ns, step) else {
                return;
            };
            debug_assert_eq!(d.end_ns, rest[0], "the turn launched the step found");
            out.push((report, d));
            ends = rest;
        }
        let step = out.last().map_or(step, |(_, d)| d.step);
        self.turns_again(step, ends, out);
    }

    /// `turn` at each tick of `ends` but the last, right after a quiet `turn` with nothing
    /// from outside since: the conditions `turn_still` checks still hold, and the pass's
    /// `admit_waiting`, with no one waiting and the waiting front's run forgotten, changes
    /// nothing. So: the streak's own checks, the step in flight's end, and the next streak
    /// step in its place (the same step `launch` would put there: no entries, the streak's
    /// members), which ends at the next tick. The step in flight is kept in locals between
    /// turns and put back once.
    fn turns_again(&mut self, step: u64, ends: &[u64], out: &mut Vec<(StepReport, Dispatch)>) {
        let Some(s) = self.inflight.front() else {
            return;
        };
        debug_assert!(self.turn_still(s));
        let mut step = step;
        let (mut id, mut end_ns, mut duration_ns) = (s.id, s.end_ns, s.duration_ns);
        let (mut streak_step, mut tokens) = (s.streak_step, s.streak as u64);
        let members = self.streak.members;
        // No turn here changes where the first member to leave does.
        let last_from = self.streak.ends.peek().map_or(u64::MAX, |e| e.0 .0);
        let mut taken = false;
        for tick in ends.windows(2) {
            let (now_ns, next_ns) = (tick[0], tick[1]);
            let d = self.streak.dispatched;
            let bucket = self.streak.bucket;
            let growth = self.streak.boundary.get(bucket).map_or(0, Vec::len) as u64;
            let quiet = id == step
                && end_ns == now_ns
                && next_ns >= now_ns
                && d < last_from
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
            // The GPU is free from now (the step in flight ended), so the next step starts now.
            duration_ns = next_ns - now_ns;
            debug_assert_eq!(
                Some(duration_ns),
                (self.streak_kv(d)).map(|kv| self
                    .costing
                    .step_ns(StepShape::decode_only(members as u64, kv))),
                "the step found"
            );
            let (dispatch, launched) = self.clock(now_ns, duration_ns, 0, members);
            debug_assert_eq!(dispatch.end_ns, next_ns);
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

    fn find_ends(&self, turns_max: u32, ends: &mut Vec<u64>) {
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
            end_ns = next_ns;
            ends.push(end_ns);
        }
        if ends.len() == 1 {
            ends.clear();
        }
    }
}

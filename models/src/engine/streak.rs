//! The streak: running requests that only decode, each advanced one token a step with no entry
//! and no output of its own, so that a step costs what changes in it, not its batch.
//!
//! A running request joins as it is composed, when nothing about its next tokens needs a
//! record one by one: its caller said so (`NewRequest::lazy`), it decodes, has sampled a token
//! and its next one is not its last, holds the blocks its context needs and no fenced ones, is
//! neither marked nor corrupted, and puts no more blocks in the prefix cache. From then on
//! every step with the streak in it (a streak step, numbered from 0) gives each member one
//! decode token. A member's counts are its `Run`'s as of its first streak step, plus the
//! streak steps since, added when it leaves (`eject`). What still happens to a member on its
//! own is found by step number, never by looking at every member:
//! - a new block when its context reaches a block boundary (`boundary`, by the boundary's
//!   phase in the block);
//! - its last token, composed as an entry again (`ends`), so it finishes as any request does;
//! - a token whose index is a multiple of `lazy_output_every` (`notes`, by that phase), which
//!   comes out as an output all the same, after a hand-over of the tokens before it.
//!
//! A streak step is the step that composing one request at a time would make: the same
//! requests, tokens, blocks and shape, so the same time. Where that cannot be shown cheaply
//! (the budget runs out before the last member, the step's growth might not fit the blocks
//! free without evicting a cached one, tainted blocks wait to be reused), every member leaves
//! and the step is composed one request at a time (`compose_running`).
//!
//! A member that leaves while streak steps that hold it are in flight drains: its token in
//! each is processed as an entry (`Drain`), in running order among the step's entries. Its
//! tokens that came out without an output are handed over as one `Implicit` as it leaves,
//! before any output or record of it that follows them.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

mod coast;
mod growth;

use super::compose::{Compose, Decided};
use super::seq::{Entry, Phase, Run, Step};
use super::Engine;
use crate::gpu::StepShape;
use crate::protocol::{Dispatch, Implicit, StepReport};

/// `Streak::flags` bits.
const LAZY: u8 = 1;
const MEMBER: u8 = 2;

/// A member that left with a streak step holding it still in flight: its token there, as the
/// entry composing it one at a time would have made.
#[derive(Clone, Copy, Debug)]
struct Drain {
    step: u64,
    entry: Entry,
}

/// In C order, what every streak step reads first (`Engine`'s layout).
#[derive(Default)]
#[repr(C)]
pub(super) struct Streak {
    /// Streak steps dispatched, and processed.
    dispatched: u64,
    processed: u64,
    /// Σ over members of (context at its first streak step − that step's number): the KV a
    /// streak step `d` reads is this plus members × (d + 1).
    kv_base: i64,
    /// `dispatched` modulo the block size: the boundary bucket of the next streak step.
    bucket: usize,
    members: u32,
    drains: Vec<Drain>,
    /// (streak step of its last token, slot, its join's stamp): out of the streak at that
    /// step's composing. An entry whose member left since is skipped.
    ends: BinaryHeap<Reverse<(u64, u32, u64)>>,
    /// Members by the phase of their block boundaries: bucket `b` holds those that need a new
    /// block at streak steps ≡ b (mod block size).
    boundary: Vec<Vec<u32>>,
    /// With `lazy_output_every` k: members by the phase of their tokens that come out as
    /// outputs, bucket `b` those whose token of streak steps ≡ b (mod k) is one.
    notes: Vec<Vec<u32>>,
    /// `LAZY` and `MEMBER`, by slot.
    flags: Vec<u8>,
    /// Live requests whose caller lets them ride the streak.
    lazy_live: u64,
    /// Joins so far: each member's stamp.
    joins: u64,
    /// Scratch: the entries a streak step composes, in running order.
    plan: Vec<(u32, Decided)>,
    extra: Vec<Extra>,
    /// The blocks members took at their boundaries, not yet theirs (`growth.rs`).
    growth: growth::Growth,
}

impl Streak {
    /// The blocks boundary bucket `bucket` takes at its boundary: one a member in it.
    #[inline(always)]
    fn boundary_blocks(&self, bucket: usize) -> u64 {
        self.boundary.get(bucket).map_or(0, Vec::len) as u64
    }
}

/// What a streak step's end does for a member beyond its quiet token, by running order
/// (`Engine::streak_done`).
#[derive(Clone, Copy, Debug)]
pub(super) enum Extra {
    /// A member that left while the step was in flight: its token there is an entry.
    Drain(Entry),
    /// A member's token that comes out as an output: token `index`.
    Note { slot: u32, index: u32 },
}

impl Extra {
    pub(super) fn slot(&self) -> u32 {
        match *self {
            Extra::Drain(e) => e.slot,
            Extra::Note { slot, .. } => slot,
        }
    }
}

impl Engine {
    #[inline]
    fn flags(&self, slot: u32) -> u8 {
        self.streak.flags[slot as usize]
    }

    /// Whether `slot` is in the streak.
    #[inline]
    pub(super) fn is_member(&self, slot: u32) -> bool {
        self.flags(slot) & MEMBER != 0
    }

    /// A request enters `slot`: whether its caller lets it ride the streak.
    pub(super) fn streak_enter(&mut self, slot: u32, lazy: bool) {
        let s = &mut self.streak;
        if s.flags.len() <= slot as usize {
            s.flags.resize(slot as usize + 1, 0);
        }
        assert_eq!(s.flags[slot as usize] & MEMBER, 0, "a member's slot reused");
        s.flags[slot as usize] = if lazy { LAZY } else { 0 };
        s.lazy_live += lazy as u64;
    }

    /// The request in `slot` leaves the engine (or needs its outputs from now on).
    pub(super) fn streak_forget(&mut self, slot: u32) {
        assert!(!self.is_member(slot), "a streak member left the engine");
        let f = &mut self.streak.flags[slot as usize];
        self.streak.lazy_live -= (*f & LAZY != 0) as u64;
        *f = 0;
    }

    /// Compose the running requests with the streak; false, with every member gone and nothing
    /// composed, if the caller must compose them one at a time.
    pub(super) fn compose_running_any(
        &mut self,
        now_ns: u64,
        c: &mut Compose,
        implicit: &mut Vec<Implicit>,
    ) {
        if self.streak.lazy_live == 0 || self.taint.blocks() > 0 {
            debug_assert!(self.streak.lazy_live > 0 || self.streak.members == 0);
            self.eject_all(implicit);
            return self.compose_running(now_ns, c);
        }
        self.eject_ending(implicit);
        if !self.compose_streak(now_ns, c) {
            self.eject_all(implicit);
            self.compose_running(now_ns, c);
        }
    }

    /// Members whose last token this streak step samples leave, to be composed as entries.
    fn eject_ending(&mut self, implicit: &mut Vec<Implicit>) {
        let d = self.streak.dispatched;
        while let Some(&Reverse((end, slot, from))) = self.streak.ends.peek() {
            if end > d {
                break;
            }
            self.streak.ends.pop();
            if self.is_member(slot) && self.seqs[slot as usize].streak_stamp == from {
                assert_eq!(end, d, "a member's last token went by");
                self.eject(slot, implicit);
            }
        }
    }

    /// The streak step: plan the running requests in order (members and those joining take a
    /// token each, the others what `decide` gives them), check it is the step composing one
    /// at a time would make, then place it. False, with nothing placed, if it is not.
    fn compose_streak(&mut self, now_ns: u64, c: &mut Compose) -> bool {
        let Some((budget, growth)) = self.plan_streak(c.budget) else {
            return false;
        };
        let bucket = self.streak.bucket;
        let growth = growth + self.streak.boundary_blocks(bucket);
        if !self.streak_fits(growth, !self.streak.plan.is_empty()) {
            return false;
        }
        let plan = std::mem::take(&mut self.streak.plan);
        for &(slot, d) in &plan {
            let Decided::Take {
                prefill,
                tokens,
                grow,
            } = d
            else {
                unreachable!("planned entries take tokens")
            };
            let taken = self.pool.take(grow);
            assert!(taken, "the clean blocks were counted");
            self.place(slot, now_ns, grow, prefill, tokens, c);
        }
        self.streak.plan = plan;
        self.streak_grow(bucket, now_ns);
        let s = &self.streak;
        let kv = self.streak_kv(s.dispatched);
        c.shape.decode_seqs += s.members as u64;
        c.shape.kv_tokens_read += kv.expect("the streak reads a negative KV");
        c.budget = budget;
        c.streak = s.members;
        true
    }

    /// The running requests in order, with `budget` tokens: the entries of the streak step in
    /// `streak.plan`, the budget left and the blocks the entries grow by. `None` if a member
    /// would get no token.
    fn plan_streak(&mut self, mut budget: u32) -> Option<(u32, u64)> {
        self.streak.plan.clear();
        let members = self.streak.members;
        // Every running request a member (most steps): a token each, if the budget holds them.
        if self.running.len() == members as usize {
            return budget.checked_sub(members).map(|b| (b, 0));
        }
        let mut growth = 0;
        for i in 0..self.running.len() {
            let slot = self.running[i];
            if budget == 0 {
                // The pass stops here, as one at a time: no member may be left without a token.
                let stranded = self.running[i..].iter().any(|&s| self.is_member(s));
                return (!stranded).then_some((0, growth));
            }
            if self.is_member(slot) || self.may_join(slot) {
                if !self.is_member(slot) {
                    self.join(slot);
                }
                budget -= 1;
                continue;
            }
            if let d @ Decided::Take { tokens, grow, .. } = self.decide(slot, budget) {
                growth += grow;
                budget -= tokens;
                self.streak.plan.push((slot, d));
            }
        }
        Some((budget, growth))
    }

    /// Step `step`, in flight, a streak step with nothing else in it, ends now, and the pass
    /// right after it composes the next streak step the same way: what `step_done`,
    /// `checkpoint` and `dispatch` would do in turn, when they give the caller nothing but that
    /// step's dispatch (no output, release, hand-over or start). `None`, and nothing done,
    /// where that is not plain at once (then the caller goes the long way).
    pub(super) fn turn(&mut self, now_ns: u64, step: u64) -> Option<(StepReport, Dispatch)> {
        let s = self.inflight.front()?;
        let members = self.streak.members;
        let d = self.streak.dispatched;
        let quiet = s.id == step
            && s.end_ns == now_ns
            && self.turn_still(s)
            && self.streak.ends.peek().is_none_or(|e| e.0 .0 > d)
            && self.no_notes(s.streak_step);
        let bucket = self.streak.bucket;
        let growth = self.streak.boundary_blocks(bucket);
        if !quiet || !self.streak_fits(growth, false) {
            return None;
        }
        let s = self.inflight.pop_front().expect("a step in flight");
        assert_eq!(
            s.streak_step, self.streak.processed,
            "streak steps end in order"
        );
        self.streak.processed += 1;
        self.stats.tokens_delivered += s.streak as u64;
        self.taint.step_ended(step);
        // `step_done` marks a boundary; the pass's checkpoint, with no abort pending, takes it.
        self.at_boundary = false;
        let report = StepReport {
            step,
            duration_ns: s.duration_ns,
            tokens: s.streak as u64,
            streak: Some(s.streak_step),
        };
        self.streak_grow(bucket, now_ns);
        let kv = self.streak_kv(d).expect("the streak reads a negative KV");
        let mut c = Compose {
            entries: s.entries,
            shape: StepShape::decode_only(members as u64, kv),
            budget: self.cfg.max_num_batched_tokens - members,
            preempted: false,
            streak: members,
        };
        // No one waits: this only forgets the waiting front's run, as the pass's does, and
        // drops dead entries; with neither, it changes nothing.
        if !self.waiting.is_void() || self.run_remembered() {
            self.admit_waiting(now_ns, &mut c);
        }
        debug_assert!(c.entries.is_empty() && self.started.is_empty());
        let duration_ns = self.costing.step_ns(c.shape);
        Some((report, self.launch_timed(now_ns, c, duration_ns)))
    }

    /// The KV its members read in streak step `d`: each its context then (`kv_base`). `None`
    /// if that is negative, which a broken count would make.
    #[inline]
    pub(super) fn streak_kv(&self, d: u64) -> Option<u64> {
        let s = &self.streak;
        u64::try_from(s.kv_base + (s.members as u64 * (d + 1)) as i64).ok()
    }

    /// Whether the running request in `slot` may join the streak now.
    fn may_join(&self, slot: u32) -> bool {
        if self.flags(slot) & (LAZY | MEMBER) != LAZY {
            return false;
        }
        let seq = &self.seqs[slot as usize];
        let run: &Run = seq;
        seq.phase == Phase::Running
            && !seq.marked
            && !seq.corrupted
            && run.ctx >= seq.need
            && run.sched_out >= 1
            && run.sched_out + 1 < seq.output
            && run.fenced_blocks == 0
            && run.blocks == self.pool.blocks_for(run.ctx as u64)
            && !self.registers(seq)
    }

    /// Whether a decoding request would still put blocks it fills in the prefix cache: only
    /// while its next block is shared (a conversation's stream carried on). A trace's shared
    /// prompt blocks are all in the cache, or no longer can be, by the end of its prefill.
    fn registers(&self, seq: &super::seq::Seq) -> bool {
        let bt = self.cfg.block_tokens as u64;
        self.pool.has_cache()
            && seq.content.may_share()
            && seq.caching
            && seq.content.is_shared(bt, seq.cached as u64)
    }

    /// The running request in `slot` joins: its first streak step is the next one dispatched.
    fn join(&mut self, slot: u32) {
        let d = self.streak.dispatched;
        let bt = self.cfg.block_tokens as u64;
        let seq = &mut self.seqs[slot as usize];
        let output = seq.output;
        let run = &mut **seq;
        let (ctx, sched_out) = (run.ctx as u64, run.sched_out);
        let bucket = growth::boundary_bucket(d, ctx, bt);
        run.streak_from = d;
        run.lazy_from = d;
        run.streak_stamp = self.streak.joins;
        run.streak_ticks_ns = self.streak.growth.ticks_ns(bucket, bt as usize);
        let last = d + (output - sched_out - 1) as u64;
        let note = self.note_bucket(d, sched_out);
        let s = &mut self.streak;
        if s.boundary.len() < bt as usize {
            s.boundary.resize_with(bt as usize, Vec::new);
        }
        s.boundary[bucket].push(slot);
        if let Some(b) = note {
            if s.notes.len() <= b {
                s.notes
                    .resize_with(self.cfg.lazy_output_every as usize, Vec::new);
            }
            s.notes[b].push(slot);
        }
        s.ends.push(Reverse((last, slot, s.joins)));
        s.joins += 1;
        s.kv_base += ctx as i64 - d as i64;
        s.members += 1;
        s.flags[slot as usize] |= MEMBER;
    }

    /// The notes bucket of a member joining at streak step `from` with `sched_out` tokens
    /// sampled: its token of streak step `j` is token `sched_out + j − from + 1`, an output when
    /// that is a multiple of k. `None` without `lazy_output_every`.
    fn note_bucket(&self, from: u64, sched_out: u32) -> Option<usize> {
        let k = self.cfg.lazy_output_every as u64;
        (k > 0).then(|| ((from % k + k - (sched_out as u64 + 1) % k) % k) as usize)
    }

    /// The member in `slot` leaves the streak: its counts take in the streak steps since it
    /// joined, its tokens there that were processed are handed over, and those in flight drain.
    pub(super) fn eject(&mut self, slot: u32, implicit: &mut Vec<Implicit>) {
        assert!(
            self.is_member(slot),
            "a request left a streak it was not in"
        );
        let (dispatched, processed) = (self.streak.dispatched, self.streak.processed);
        let bt = self.cfg.block_tokens as u64;
        let seq = &mut self.seqs[slot as usize];
        let (id, tag) = (seq.id, seq.tag);
        let run = &mut **seq;
        let from = run.streak_from;
        let ctx = run.ctx as u64;
        let d = dispatched - from;
        let p = processed.saturating_sub(from).min(d);
        let (lazy_from, sched0) = (run.lazy_from, run.sched_out);
        for k in p..d {
            let entry = Entry {
                slot,
                incarnation: run.incarnation,
                tokens: 1,
                sample: run.sched_out + k as u32 + 1,
            };
            let step = from + k;
            self.streak.drains.push(Drain { step, entry });
        }
        run.ctx += d as u32;
        run.sched_out += d as u32;
        run.done_out += p as u32;
        run.inflight += (d - p) as u32;
        // Its processed tokens since the last one handed over (or came out as an output).
        let count = (from + p - lazy_from) as u32;
        if count > 0 {
            implicit.push(Implicit {
                id,
                tag,
                from: lazy_from,
                count,
            });
        }
        if let Some(b) = self.note_bucket(from, sched0) {
            let notes = &mut self.streak.notes[b];
            let at = notes.iter().position(|&x| x == slot);
            notes.swap_remove(at.expect("a member is in its notes bucket"));
        }
        let b = growth::boundary_bucket(from, ctx, bt);
        let grown = self.streak_grown(slot, b, ctx + d);
        debug_assert_eq!(
            grown,
            growth::steps_in_phase(from, dispatched, b as u64, bt),
            "a member's new blocks are its bucket's boundaries since it joined"
        );
        let s = &mut self.streak;
        let bucket = &mut s.boundary[b];
        let at = bucket.iter().position(|&x| x == slot);
        bucket.swap_remove(at.expect("a member is in its boundary bucket"));
        s.kv_base -= ctx as i64 - from as i64;
        s.members -= 1;
        s.flags[slot as usize] &= !MEMBER;
    }

    /// Every member leaves.
    pub(super) fn eject_all(&mut self, implicit: &mut Vec<Implicit>) {
        if self.streak.members == 0 {
            return;
        }
        for i in 0..self.running.len() {
            let slot = self.running[i];
            if self.is_member(slot) {
                self.eject(slot, implicit);
            }
        }
        assert_eq!(self.streak.members, 0, "a member was not running");
    }

    /// A step goes in flight with `streak` members in it, if any: returns its streak step's
    /// number.
    pub(super) fn streak_launch(&mut self, streak: u32) -> u64 {
        let s = &mut self.streak;
        let step = s.dispatched;
        if streak > 0 {
            s.dispatched += 1;
            s.bucket += 1;
            if s.bucket == self.cfg.block_tokens as usize {
                s.bucket = 0;
            }
        }
        debug_assert_eq!(s.bucket as u64, s.dispatched % self.cfg.block_tokens as u64);
        step
    }

    /// Step `s` ended: its members' tokens are processed. Returns how many need nothing more,
    /// and the rest by running order (`Extra`): the drained members' entries, and the tokens
    /// that come out as outputs, each after its member's hand-over (into `implicit`).
    pub(super) fn streak_done(
        &mut self,
        s: &Step,
        implicit: &mut Vec<Implicit>,
    ) -> (u32, Vec<Extra>) {
        let mut extra = std::mem::take(&mut self.streak.extra);
        extra.clear();
        if s.streak == 0 {
            return (0, extra);
        }
        let j = s.streak_step;
        assert_eq!(j, self.streak.processed, "streak steps end in order");
        self.streak.processed += 1;
        if !self.streak.drains.is_empty() {
            self.streak.drains.retain(|d| {
                if d.step == j {
                    extra.push(Extra::Drain(d.entry));
                }
                d.step != j
            });
        }
        let drained = extra.len() as u32;
        self.notes_done(j, &mut extra, implicit);
        if extra.len() > 1 {
            let seqs = &self.seqs;
            extra.sort_by_key(|x| seqs[x.slot() as usize].run_order);
        }
        (s.streak - drained, extra)
    }

    /// The members whose token of streak step `j` comes out as an output: each hands over
    /// what it had not, then its token goes into `extra`.
    fn notes_done(&mut self, j: u64, extra: &mut Vec<Extra>, implicit: &mut Vec<Implicit>) {
        let k = self.cfg.lazy_output_every as u64;
        if k == 0 {
            return;
        }
        let Some(notes) = self.streak.notes.get((j % k) as usize) else {
            return;
        };
        for &slot in notes {
            let seq = &mut self.seqs[slot as usize];
            let (id, tag) = (seq.id, seq.tag);
            let run = &mut **seq;
            if run.streak_from > j {
                continue; // it joined after this step was dispatched
            }
            let index = run.sched_out + (j - run.streak_from) as u32 + 1;
            debug_assert_eq!(index as u64 % k, 0);
            let count = (j - run.lazy_from) as u32;
            if count > 0 {
                let from = run.lazy_from;
                implicit.push(Implicit {
                    id,
                    tag,
                    from,
                    count,
                });
            }
            run.lazy_from = j + 1;
            extra.push(Extra::Note { slot, index });
        }
    }

    /// Give the scratch back.
    pub(super) fn streak_recycle(&mut self, extra: Vec<Extra>) {
        self.streak.extra = extra;
    }

    /// The caller needs every output of the request in `slot` from now on.
    pub(super) fn streak_explicit(&mut self, slot: u32) -> Option<Implicit> {
        let mut implicit = Vec::new();
        if self.is_member(slot) {
            self.eject(slot, &mut implicit);
        }
        let f = &mut self.streak.flags[slot as usize];
        self.streak.lazy_live -= (*f & LAZY != 0) as u64;
        *f &= !LAZY;
        implicit.pop()
    }

    /// The earliest streak step whose tokens a member may still hand over.
    pub(super) fn streak_floor(&self) -> u64 {
        let seqs = &self.seqs;
        (self.running.iter())
            .filter(|&&s| self.is_member(s))
            .map(|&s| seqs[s as usize].lazy_from)
            .min()
            .unwrap_or(self.streak.dispatched)
    }
}

//! An engine's per-request and per-step records, its counters, and the blocks released while a
//! step still wrote them (the runtime ids' ledgers are `ids.rs`).

use std::collections::VecDeque;

use crate::prefix::Content;
use crate::protocol::{Handle, NewRequest, Outcome, Released};
use crate::sparse::Sparse;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Phase {
    Waiting,
    Running,
    /// End of sequence delivered; waiting for in-flight steps to drain.
    Finished,
    /// Removed by an abort; waiting for in-flight steps to drain.
    Aborted,
}

/// A request in the engine. What a request that has not run yet needs is here; what only
/// running makes (its progress, its blocks, its incarnations) is `Run`, boxed at its first
/// change and read through `Deref` (zero until then), so a million waiting requests hold
/// 112 bytes each instead of 224.
#[derive(Clone, Debug)]
pub(super) struct Seq {
    pub(super) id: u64,
    pub(super) tag: u32,
    pub(super) handle: Handle,
    pub(super) corrupted: bool,
    pub(super) released_sent: bool,
    /// The prompt's KV came from a prefill stage: the first admission skips the prefill.
    pub(super) kv_ready: bool,
    /// Its end is its `max_tokens`, known to the scheduler.
    pub(super) length_capped: bool,
    pub(super) marked: bool,
    /// This incarnation may still register its blocks: it stops at the first whose content
    /// another request cached first.
    pub(super) caching: bool,
    pub(super) phase: Phase,
    pub(super) prompt: u32,
    pub(super) output: u32,
    /// Tokens to compute before the next sample: the prompt, or prompt + delivered tokens after a
    /// preemption (recompute).
    pub(super) need: u32,
    /// Unique per enqueue: tells this request's waiting entries from a former occupant's.
    pub(super) serial: u64,
    /// Since when the block-time of its blocks is not counted yet (`kv_block_ns`). Whatever
    /// changes its blocks, fenced blocks or `marked` counts it first (`touch`), so the count is
    /// whole whenever it is read, at its release.
    pub(super) blocks_since_ns: u64,
    /// What its tokens are, for the prefix cache.
    pub(super) content: Content,
    run: Sparse<Run>,
}

/// What running makes of a request.
#[derive(Clone, Debug, Default)]
pub(super) struct Run {
    /// Tokens whose KV is computed or scheduled.
    pub(super) ctx: u32,
    /// Output tokens sampled by dispatched steps of this incarnation.
    pub(super) sched_out: u32,
    /// Output tokens delivered.
    pub(super) done_out: u32,
    pub(super) inflight: u32,
    pub(super) incarnation: u32,
    /// Leading blocks of `blocks` held through the prefix cache (hits and registered blocks).
    pub(super) cached: u32,
    pub(super) blocks: u64,
    /// Blocks of a finished or preempted incarnation, returned once no step in flight uses them.
    pub(super) fenced_blocks: u64,
    pub(super) kv_block_ns: u128,
    pub(super) kv_block_ns_marked: u128,
    /// Leading blocks of `fenced_blocks` held through the cache, one count per incarnation.
    pub(super) fenced_cached: Vec<u32>,
    /// Its place in the running order: given as it joins the running requests, so the
    /// running list, and the entries of a step, are sorted by it.
    pub(super) run_order: u64,
    /// In the streak: its first streak step. `ctx`, `sched_out`, `done_out` and `inflight`
    /// are its counts as of then; the streak steps since are added when it leaves
    /// (`Engine::eject`).
    pub(super) streak_from: u64,
    /// Which of its joins of the streak this is (the streak's join count then), so an end
    /// planned for an earlier one is told apart.
    pub(super) streak_stamp: u64,
    /// In the streak: its tokens of streak steps from this one on are not handed over yet.
    pub(super) lazy_from: u64,
    /// In the streak: the Σ of its boundary bucket's ticks as it joined, so that as it leaves
    /// the block-time of its boundaries since is the bucket's Σ now less this
    /// (`streak/growth.rs`).
    pub(super) streak_ticks_ns: u128,
}

impl Run {
    /// Its blocks were held `elapsed_ns` more (and retained, if `marked`).
    #[inline(always)]
    fn hold(&mut self, elapsed_ns: u128, marked: bool) {
        let area = (self.blocks + self.fenced_blocks) as u128 * elapsed_ns;
        self.kv_block_ns += area;
        if marked {
            self.kv_block_ns_marked += area;
        }
    }
}

/// What a request that has not run reads.
static RUN_NONE: Run = Run {
    ctx: 0,
    sched_out: 0,
    done_out: 0,
    inflight: 0,
    incarnation: 0,
    cached: 0,
    blocks: 0,
    fenced_blocks: 0,
    kv_block_ns: 0,
    kv_block_ns_marked: 0,
    fenced_cached: Vec::new(),
    run_order: 0,
    streak_from: 0,
    streak_stamp: 0,
    lazy_from: 0,
    streak_ticks_ns: 0,
};

impl std::ops::Deref for Seq {
    type Target = Run;
    #[inline(always)]
    fn deref(&self) -> &Run {
        self.run.get(&RUN_NONE)
    }
}

impl std::ops::DerefMut for Seq {
    #[inline(always)]
    fn deref_mut(&mut self) -> &mut Run {
        self.run.get_mut()
    }
}

impl Seq {
    #[inline]
    pub(super) fn touch(&mut self, now_ns: u64) {
        debug_assert!(now_ns >= self.blocks_since_ns);
        let held = self.blocks + self.fenced_blocks;
        let elapsed = (now_ns - self.blocks_since_ns) as u128;
        self.blocks_since_ns = now_ns;
        if held == 0 {
            return; // no area: a request that has not run stays unboxed
        }
        let marked = self.marked;
        (**self).hold(elapsed, marked);
    }

    pub(super) fn new(r: &NewRequest, now_ns: u64) -> Seq {
        Seq {
            id: r.id,
            tag: r.tag,
            handle: r.handle,
            corrupted: false,
            released_sent: false,
            kv_ready: r.kv_ready,
            length_capped: r.length_capped,
            marked: false,
            caching: true,
            phase: Phase::Waiting,
            prompt: r.prompt_tokens,
            output: r.output_tokens,
            need: r.prompt_tokens,
            serial: 0,
            blocks_since_ns: now_ns,
            content: Content {
                prompt_tokens: r.prompt_tokens as u64,
                ..Content::default()
            },
            run: Sparse::default(),
        }
    }

    /// It left the engine: what running made of it goes now, not when its slot is reused, so
    /// memory follows the requests here, not those that were.
    pub(super) fn retire(&mut self) {
        debug_assert_eq!(self.blocks + self.fenced_blocks, 0);
        debug_assert_eq!(self.inflight, 0);
        self.run.clear();
        self.content = Content::default();
    }

    /// Its blocks of this incarnation become fenced: back in the pool once no step in flight
    /// uses them.
    pub(super) fn fence(&mut self) {
        self.caching = true;
        let Some(run) = self.run.if_any() else {
            return; // it never ran: nothing to fence
        };
        run.fenced_blocks += run.blocks;
        run.blocks = 0;
        if run.cached > 0 {
            run.fenced_cached.push(run.cached);
        }
        run.cached = 0;
    }

    /// Into a step at `now_ns` with `blocks` more and `tokens` scheduled: its context after
    /// them, its incarnation, and the output index the step samples (0 if none). The step is in
    /// flight from here on (counted now, while its run is at hand, not in a second pass).
    #[inline]
    pub(super) fn advance(&mut self, now_ns: u64, blocks: u64, tokens: u32) -> (u32, u32, u32) {
        debug_assert!(now_ns >= self.blocks_since_ns);
        let (need, marked, since_ns) = (self.need, self.marked, self.blocks_since_ns);
        // `touch`, with its run borrowed once (it is boxed here in any case). A step that adds
        // no block (most decode tokens) leaves the area to the next touch: held blocks × the
        // time since is the same sum, in whole numbers, as a term per step.
        if blocks > 0 {
            self.blocks_since_ns = now_ns;
        }
        let run = &mut **self;
        if blocks > 0 {
            run.hold((now_ns - since_ns) as u128, marked);
        }
        run.blocks += blocks;
        run.ctx += tokens;
        run.inflight += 1;
        let sample = if run.ctx >= need {
            run.sched_out += 1;
            run.sched_out
        } else {
            0
        };
        (run.ctx, run.incarnation, sample)
    }

    /// A block more at each of `boundaries` ticks, whose sum is `ticks_ns` and the last
    /// `last_ns`: a streak member's, given as it leaves (`streak/growth.rs`). The same block-time
    /// as a `touch` and a block at each, in whole numbers: with b blocks held since `since`,
    /// Σ (b + i − 1)(tᵢ − tᵢ₋₁) over i = 1..n, t₀ = since, is b (tₙ − since) + n tₙ − Σ tᵢ.
    pub(super) fn grown(&mut self, boundaries: u64, ticks_ns: u128, last_ns: u64) {
        assert!(!self.marked, "a streak member marked");
        debug_assert!(boundaries > 0 && last_ns >= self.blocks_since_ns);
        let since_ns = self.blocks_since_ns;
        self.blocks_since_ns = last_ns;
        let run = &mut **self;
        assert_eq!(run.fenced_blocks, 0, "a streak member with fenced blocks");
        let n = boundaries as u128;
        debug_assert!(n * last_ns as u128 >= ticks_ns && ticks_ns >= n * since_ns as u128);
        let area =
            run.blocks as u128 * (last_ns - since_ns) as u128 + n * last_ns as u128 - ticks_ns;
        run.kv_block_ns += area;
        run.blocks += boundaries;
    }

    /// Preempted: a new incarnation recomputes the prompt and the tokens delivered so far.
    pub(super) fn restart(&mut self) {
        self.incarnation += 1;
        self.need = self.prompt + self.done_out;
        self.ctx = 0;
        self.sched_out = self.done_out;
        self.phase = Phase::Waiting;
    }

    /// The step of entry `e` ends now: one step fewer in flight, and what the entry did for
    /// this request. A token of an old incarnation, or past the end or an abort, is discarded.
    /// With its steps still in flight, and its fenced blocks before and after (its run is
    /// reached once, as this is every token of every step).
    #[inline]
    pub(super) fn step_ended(&mut self, e: &Entry, now_ns: u64) -> Ended {
        let (phase, output) = (self.phase, self.output);
        let run = &mut **self; // once: it is in a step, so it ran
        run.inflight -= 1;
        let fenced_before = run.fenced_blocks;
        let mut ended = Ended {
            outcome: Outcome::Prefill,
            inflight: run.inflight,
            fenced_before,
            fenced: fenced_before,
        };
        if e.incarnation != run.incarnation || phase == Phase::Finished || phase == Phase::Aborted {
            ended.outcome = Outcome::Discarded {
                sampled: e.sample > 0,
            };
            return ended;
        }
        if e.sample == 0 {
            return ended;
        }
        debug_assert_eq!(e.sample, run.done_out + 1);
        debug_assert!(e.sample <= output);
        run.done_out += 1;
        let last = run.done_out == output;
        ended.outcome = Outcome::Token {
            index: e.sample,
            last,
        };
        if last {
            self.phase = Phase::Finished;
            self.touch(now_ns);
            self.fence();
            ended.fenced = self.fenced_blocks;
        }
        ended
    }

    /// The record of its blocks going back to the pool.
    pub(super) fn released(&self) -> Released {
        Released {
            id: self.id,
            tag: self.tag,
            kv_block_ns: self.kv_block_ns,
            kv_block_ns_marked: self.kv_block_ns_marked,
            restarts: self.incarnation,
        }
    }
}

/// What the end of a step did for one of its requests (`Seq::step_ended`).
pub(super) struct Ended {
    pub(super) outcome: Outcome,
    /// Its steps still in flight.
    pub(super) inflight: u32,
    /// Its fenced blocks before the step ended, and after.
    pub(super) fenced_before: u64,
    pub(super) fenced: u64,
}

#[derive(Clone, Copy, Debug)]
pub(super) struct Entry {
    pub(super) slot: u32,
    pub(super) incarnation: u32,
    pub(super) tokens: u32,
    /// The output index this entry samples, 0 if none (a non-final prefill chunk).
    pub(super) sample: u32,
}

#[derive(Debug)]
pub(super) struct Step {
    pub(super) id: u64,
    pub(super) end_ns: u64,
    pub(super) duration_ns: u64,
    pub(super) entries: Vec<Entry>,
    /// Streak members in it, one decode token each and no entry, and its streak step.
    pub(super) streak: u32,
    pub(super) streak_step: u64,
}

/// Counters of one engine, for reports and conservation checks.
/// In C order: a step adds to the first six.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct EngineStats {
    pub steps: u64,
    pub busy_ns: u64,
    pub preemptions: u64,
    pub tokens_delivered: u64,
    pub tokens_discarded: u64,
    pub prefill_tokens: u64,
    pub rejected: u64,
    pub aborts_handled: u64,
    pub aborts_unknown: u64,
    pub aborts_tombstoned: u64,
    /// Deliveries of an abort already handled (same idempotency key), ignored.
    pub aborts_duplicate: u64,
    /// Aborts dropped unobserved (a backend that never checks).
    pub aborts_unobserved: u64,
    pub faults: u64,
    /// Allocations that reused blocks a step in flight still wrote.
    pub corrupted_allocations: u64,
    /// Admissions refused for want of blocks while requests with a cancel intent held some.
    pub admission_stalls: u64,
    /// Admissions refused for want of blocks while blocks were pinned for work outside the
    /// engine (KV transfers).
    pub stalls_pinned: u64,
    /// Most blocks held at once by requests with a cancel intent.
    pub marked_blocks_peak: u64,
    /// Prompt tokens looked up in the prefix cache at admission, and those found there.
    pub prefix_query_tokens: u64,
    pub prefix_hit_tokens: u64,
    /// Cache keys looked up to find waiting requests' cached runs (the work of admission).
    pub prefix_lookups: u64,
}

/// Blocks released while a step in flight still wrote them, each batch with the id of the last
/// step that can write it. Freed blocks are reused first (a LIFO free list), so an allocation
/// takes tainted blocks before clean ones: that is what makes an immediate release a hazard.
#[derive(Default)]
pub(super) struct Taint {
    batches: VecDeque<(u64, u64)>,
    blocks: u64,
}

impl Taint {
    /// Blocks released while a step still wrote them, not reused yet.
    pub(super) fn blocks(&self) -> u64 {
        self.blocks
    }

    pub(super) fn push(&mut self, blocks: u64, fence_step: u64) {
        self.batches.push_back((blocks, fence_step));
        self.blocks += blocks;
    }

    /// Step `step` ended: blocks fenced by it or earlier are clean again.
    pub(super) fn step_ended(&mut self, step: u64) {
        while self
            .batches
            .front()
            .is_some_and(|&(_, fence)| fence <= step)
        {
            let (blocks, _) = self.batches.pop_front().expect("front exists");
            self.blocks -= blocks;
        }
    }

    /// An allocation of `blocks` takes the most recently freed blocks first. Returns whether it
    /// got any tainted block.
    pub(super) fn allocate(&mut self, blocks: u64) -> bool {
        if blocks == 0 || self.blocks == 0 {
            return false;
        }
        let mut need = blocks;
        while need > 0 {
            let Some(last) = self.batches.back_mut() else {
                break;
            };
            let taken = last.0.min(need);
            last.0 -= taken;
            need -= taken;
            self.blocks -= taken;
            if last.0 == 0 {
                self.batches.pop_back();
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_waiting_request_stays_small() {
        // One per request waiting here: a million of them fit their bound only at this size.
        use std::mem::size_of;
        assert!(size_of::<Seq>() <= 104, "Seq is {} bytes", size_of::<Seq>());
        assert_eq!(size_of::<Content>(), 24, "sharing is boxed");
    }

    #[test]
    fn a_request_that_never_ran_has_no_run() {
        let r = NewRequest {
            id: 1,
            tag: 0,
            handle: Handle::default(),
            prompt_tokens: 100,
            output_tokens: 10,
            kv_ready: false,
            length_capped: false,
            lazy: false,
        };
        let mut seq = Seq::new(&r, 5);
        seq.touch(9); // nothing held: no area, no run
        seq.fence();
        assert!(!seq.run.is_made());
        assert_eq!((seq.ctx, seq.blocks, seq.blocks_since_ns), (0, 0, 9));
        let (ctx, incarnation, sample) = seq.advance(10, 7, 100);
        assert_eq!((ctx, incarnation, sample), (100, 0, 1));
        assert!(seq.run.is_made());
        assert_eq!(
            (seq.blocks, seq.inflight),
            (7, 1),
            "in flight from its step's composing"
        );
    }
}

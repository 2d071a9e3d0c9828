//! The continuous-batching engine of one replica (vLLM-like), as a sans-IO state machine.
//!
//! - A waiting queue and a running set bounded by `max_num_seqs`.
//! - A token budget per step (`max_num_batched_tokens`), with optional chunked prefill.
//! - A paged KV allocator: a request is admitted only when the blocks for its first chunk are
//!   free, leaving the watermark free while others run; a running request that cannot grow
//!   preempts the newest running request (vLLM's victim order), which is recomputed later
//!   (preemption by recompute).
//! - Without chunked prefill, vLLM v0's rule: new prompts run in prefill-only steps, and the
//!   running requests decode in steps of their own.
//! - An in-flight window `W`: up to `W` dispatched steps whose outputs are not yet processed.
//!   A dispatched step runs with exactly the requests it was dispatched with. The scheduler
//!   advances progress optimistically at dispatch, and learns that a request hit its end of
//!   sequence only when the step that sampled that token is processed, so with `W` > 1 a finished
//!   request can still be in the next, already dispatched step: that token-step is discarded.
//! - Blocks are returned to the pool only when no dispatched step still uses them (fenced).
//!
//! The world calls `enqueue`, `dispatch` and `step_done` with the current time; the engine
//! answers with what to schedule (a step's end time) and what came out (tokens, releases). The
//! cancel side (`abort`, `checkpoint`, `mark_intent`) is in `abort.rs`.

mod abort;
mod compose;
mod ending;
mod ids;
mod pool;
mod run;
mod seq;
mod streak;
mod waiting;

use std::collections::VecDeque;

use crate::gpu::{Costing, StepModel, StepShape};
use crate::kv::KvPool;
use crate::prefix::PrefixCache;
use crate::protocol::{
    fits, Abort, Checkpoint, CheckpointReport, Dispatch, Gauges, Implicit, NewRequest, Outbox,
    Rejection, ReleaseMode, ReplicaStats, Scheduler, StepReport, Turned, UnknownAbort,
};
use crate::recent::Recent;

use compose::Compose;
use ids::RuntimeIndex;
pub use ids::TOMBSTONES_MAX;
use pool::Pool;
pub use seq::EngineStats;
use seq::{Entry, Phase, Seq, Step, Taint};
use streak::Streak;
use waiting::Waiting;

#[derive(Clone, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct EngineConfig {
    pub max_num_seqs: u32,
    pub max_num_batched_tokens: u32,
    pub chunked_prefill: bool,
    pub block_tokens: u32,
    pub kv_blocks: u64,
    /// Blocks an admission leaves free while other requests run (vLLM's watermark).
    pub watermark_blocks: u64,
    /// Automatic prefix caching (vLLM V1's default): full blocks keep their content after
    /// release, and a request admitted later reuses the cached blocks of its prefix.
    pub prefix_caching: bool,
    /// In-flight window W: 1 for a synchronous loop, 2 for async scheduling, or the pipeline
    /// depth.
    pub window: u32,
    /// Where pending aborts are observed.
    pub checkpoint: Checkpoint,
    /// How an aborted request's blocks go back to the pool.
    pub release: ReleaseMode,
    /// What an abort for an id with no live request does.
    pub unknown_abort: UnknownAbort,
    /// Whether the runtime generates ids and tombstones terminated ones (TensorRT-LLM), so a late
    /// abort for a finished id is recognised and ignored. Without, ids are the client's and may be
    /// reused (vLLM, SGLang).
    pub tombstones: bool,
    /// A lazy request's output tokens whose index is a multiple of this still come out as
    /// outputs in the streak, each after a hand-over of those before it (its caller makes
    /// something of every such token: an audio chunk that waits for its writer); 0 for none.
    pub lazy_output_every: u32,
    /// Last: a step reads some of the fields above, none of this (`Engine`'s layout).
    pub cost: StepModel,
}

/// In C order, what a streak step reads (`turn`, `launch`, `admit_waiting`) first, each part's
/// hottest fields at its head: a fleet's thousand replicas do not fit a core's caches, so each
/// cache line a step touches is a miss. Fewer lines, not one: the config, the rates and the
/// pool's counts lie further on.
#[repr(C, align(64))]
pub struct Engine {
    gpu_free_ns: u64,
    step_next: u64,
    inflight: VecDeque<Step>,
    pending_aborts: Vec<Abort>,
    running: Vec<u32>,
    /// Pending aborts of the ideal cancel (handled at once): counted, so a pass with none
    /// pending never scans the pending aborts (a backend that rarely checks piles them up).
    ideal_pending: u32,
    /// A step ended since the last checkpoint: the engine loop is between steps.
    at_boundary: bool,
    /// Without chunked prefill: the last step of running requests preempted one, and none has
    /// run since without. New prompts wait until one does, or the preempted request would be
    /// admitted again at once, and preempted again, for ever.
    preempted_last: bool,
    waiting: Waiting,
    taint: Taint,
    /// Decoding requests advanced without an entry each (`streak.rs`).
    streak: Streak,
    stats: EngineStats,
    cfg: EngineConfig,
    /// `cfg.cost`, ready to cost steps.
    costing: Costing,
    /// The KV blocks, the prefix cache and the counts that follow the blocks.
    pool: Pool,
    seqs: Vec<Seq>,
    /// The waiting front's cached run, kept between steps (`run.rs`).
    run_memo: run::RunMemo,
    free_slots: Vec<u32>,
    /// The serial of the next request enqueued.
    serial_next: u64,
    /// Slots not yet freed, by runtime id: a request-scope abort finds its request here.
    by_runtime: RuntimeIndex,
    spare_entries: Vec<Vec<Entry>>,
    live: u64,
    passes: u64,
    /// Terminated runtime ids (with `tombstones`).
    tombstones: Recent<u64>,
    /// Idempotency keys of the aborts handled so far.
    abort_keys: Recent<u64>,
    /// Engine slot of each caller tag, for `mark_intent`.
    slot_of_tag: Vec<u32>,
    /// Blocks taken from the pool for work outside the engine (a KV transfer's buffers).
    pinned_blocks: u64,
    /// Tags of requests dispatched for the first time, drained by `take_started`.
    started: Vec<u32>,
    /// The running order the next request to run takes (`Run::run_order`).
    run_order_next: u64,
}

/// `slot_of_tag` of a tag with no request here (not an `Option`: 4 bytes a tag, not 8).
const NO_SLOT: u32 = u32::MAX;

impl Engine {
    /// The slot of the request the caller knows by `tag`, if it is here.
    fn slot_of(&self, tag: u32) -> Option<u32> {
        let slot = *self.slot_of_tag.get(tag as usize)?;
        (slot != NO_SLOT).then_some(slot)
    }

    pub fn new(cfg: EngineConfig) -> Self {
        let prefix_caching = cfg.prefix_caching;
        assert!(cfg.max_num_seqs > 0 && cfg.max_num_batched_tokens > 0 && cfg.window > 0);
        Engine {
            costing: Costing::new(&cfg.cost),
            pool: Pool::new(
                KvPool::new(cfg.kv_blocks, cfg.block_tokens),
                prefix_caching.then(PrefixCache::default),
                cfg.block_tokens as u64,
            ),
            cfg,
            seqs: Vec::new(),
            free_slots: Vec::new(),
            waiting: Waiting::default(),
            serial_next: 0,
            by_runtime: RuntimeIndex::default(),
            running: Vec::new(),
            inflight: VecDeque::new(),
            spare_entries: Vec::new(),
            gpu_free_ns: 0,
            step_next: 0,
            live: 0,
            stats: EngineStats::default(),
            pending_aborts: Vec::new(),
            passes: 0,
            at_boundary: false,
            taint: Taint::default(),
            tombstones: Recent::new(TOMBSTONES_MAX),
            abort_keys: Recent::new(TOMBSTONES_MAX),
            slot_of_tag: Vec::new(),
            pinned_blocks: 0,
            started: Vec::new(),
            preempted_last: false,
            ideal_pending: 0,
            run_memo: run::RunMemo::default(),
            streak: Streak::default(),
            run_order_next: 0,
        }
    }

    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    /// A request whose blocks were just allocated: if the pool handed out blocks that a step in
    /// flight still writes (an immediate release), its output is corrupted from now on.
    pub(super) fn on_alloc(&mut self, slot: u32, blocks: u64) {
        if self.seqs[slot as usize].marked {
            self.pool.mark(blocks);
        }
        if self.taint.allocate(blocks) {
            self.seqs[slot as usize].corrupted = true;
            self.stats.corrupted_allocations += 1;
        }
    }
}

impl Scheduler for Engine {
    /// Accept a request into the waiting queue, or refuse it if it can never run here.
    fn enqueue(&mut self, now_ns: u64, r: NewRequest) -> Result<(), Rejection> {
        self.accepts(&r).inspect_err(|_| self.stats.rejected += 1)?;
        let mut seq = Seq::new(&r, now_ns);
        seq.serial = self.serial_next;
        // Its own tokens are unique to this enqueue: a client may reuse an id for new content.
        seq.content.own = self.serial_next;
        self.serial_next += 1;
        let slot = match self.free_slots.pop() {
            Some(s) => {
                self.seqs[s as usize] = seq;
                s
            }
            None => {
                self.seqs.push(seq);
                (self.seqs.len() - 1) as u32
            }
        };
        self.waiting.push_back(slot, &self.seqs);
        self.streak_enter(slot, r.lazy);
        self.by_runtime.insert(r.handle.runtime_id, slot);
        self.live += 1;
        let t = r.tag as usize;
        if self.slot_of_tag.len() <= t {
            self.slot_of_tag.resize(t + 1, NO_SLOT);
        }
        assert!(slot != NO_SLOT, "more requests than slots");
        self.slot_of_tag[t] = slot;
        Ok(())
    }

    /// Compose and dispatch the next step if the window has room and there is work.
    fn dispatch(&mut self, now_ns: u64, out: &mut Outbox) -> Option<Dispatch> {
        if self.inflight.len() as u32 >= self.cfg.window {
            return None;
        }
        let entries = self.spare_entries.pop().unwrap_or_default();
        debug_assert!(entries.is_empty());
        let mut c = Compose {
            entries,
            shape: StepShape::default(),
            budget: self.cfg.max_num_batched_tokens,
            preempted: false,
            streak: 0,
        };
        if self.cfg.chunked_prefill {
            self.compose_running_any(now_ns, &mut c, &mut out.implicit);
            self.admit_waiting(now_ns, &mut c);
        } else {
            // vLLM v0 without chunked prefill: a step of new prompts whenever one can start,
            // else a step of the running requests' decodes. The two never share a step.
            if !self.preempted_last || self.running.is_empty() {
                self.admit_waiting(now_ns, &mut c);
            }
            if c.entries.is_empty() {
                self.compose_running_any(now_ns, &mut c, &mut out.implicit);
                self.preempted_last = c.preempted;
            }
        }
        out.started.append(&mut self.started);
        if c.entries.is_empty() && c.streak == 0 {
            self.spare_entries.push(c.entries);
            return None;
        }
        Some(self.launch(now_ns, c))
    }

    /// Process the oldest dispatched step, which ends now. Pushes one `StepOutput` per entry and
    /// one `Released` per request that left the engine.
    fn step_done(&mut self, now_ns: u64, step: u64, out: &mut Outbox) -> StepReport {
        let s = self.inflight.pop_front().expect("a step in flight");
        assert_eq!(s.id, step, "steps complete in dispatch order");
        self.at_boundary = true;
        assert_eq!(s.end_ns, now_ns, "step processed at its end time");
        let (quiet, extra) = self.streak_done(&s, &mut out.implicit);
        self.stats.tokens_delivered += quiet as u64;
        let (tokens, finished_any) = self.process_step(&s, &extra, now_ns, out);
        let tokens_total = tokens + s.streak as u64;
        self.streak_recycle(extra);
        self.taint.step_ended(step);
        if finished_any {
            let seqs = &self.seqs;
            self.running
                .retain(|&slot| seqs[slot as usize].phase == Phase::Running);
        }
        let mut entries = s.entries;
        entries.clear();
        self.spare_entries.push(entries);
        StepReport {
            step,
            duration_ns: s.duration_ns,
            tokens: tokens_total,
            streak: (s.streak > 0).then_some(s.streak_step),
        }
    }

    /// An abort arrives at the engine. It takes effect at the next checkpoint.
    fn abort(&mut self, a: Abort) {
        self.ideal_pending += a.ideal as u32;
        self.pending_aborts.push(a);
    }

    /// A scheduler pass begins: if it is a checkpoint, handle the pending aborts. Every request
    /// an abort reaches leaves the waiting queue or the running set now; a step already in
    /// flight keeps it (its output will be discarded). Call before `dispatch`.
    ///
    /// The engine loop looks at aborts between steps, never during one: a pass is a checkpoint
    /// only right after a step ended, or while nothing is in flight. With `EveryPasses(k)`, only
    /// every k-th such boundary is.
    fn checkpoint(&mut self, now_ns: u64, out: &mut Outbox) -> CheckpointReport {
        let mut report = CheckpointReport::default();
        if self.ideal_pending > 0 {
            self.handle_ideal(now_ns, &mut report, out);
        }
        if !self.is_checkpoint() {
            return report;
        }
        let mut aborts = std::mem::take(&mut self.pending_aborts);
        for a in &aborts {
            self.handle_abort(a, now_ns, &mut report, out);
        }
        let seqs = &self.seqs;
        self.running
            .retain(|&slot| seqs[slot as usize].phase == Phase::Running);
        self.waiting.compact(&self.seqs);
        aborts.clear();
        if self.pending_aborts.is_empty() {
            self.pending_aborts = aborts;
        }
        report
    }

    /// The caller's cancel intent for request `tag` happened now: from here on its blocks count as
    /// retained. Does nothing if the request is not here (or already gone).
    fn mark_intent(&mut self, now_ns: u64, tag: u32) {
        let Some(slot) = self.slot_of(tag) else {
            return;
        };
        assert!(
            !self.is_member(slot),
            "a streak member marked: its caller makes it explicit first"
        );
        let seq = &mut self.seqs[slot as usize];
        if seq.marked || seq.tag != tag {
            return;
        }
        seq.touch(now_ns);
        seq.marked = true;
        self.pool.mark(seq.blocks + seq.fenced_blocks);
    }

    fn timer_ns(&self) -> Option<u64> {
        None
    }

    fn gauges(&self) -> Gauges {
        Gauges {
            waiting: self.waiting.len(),
            running: self.running.len() as u64,
            kv_blocks: self.pool.kv().in_use(),
            kv_retained: self.pool.marked(),
            kv_pinned: self.pinned_blocks,
        }
    }

    /// Requests waiting, running or draining here: what a least-loaded router compares.
    fn load(&self) -> u64 {
        self.live
    }

    fn is_idle(&self) -> bool {
        self.live == 0 && self.inflight.is_empty()
    }

    fn kv(&self) -> &KvPool {
        self.pool.kv()
    }

    fn accepts(&self, r: &NewRequest) -> Result<(), Rejection> {
        let total = fits(self.pool.kv(), r)?;
        if !self.cfg.chunked_prefill && total > self.cfg.max_num_batched_tokens as u64 {
            return Err(Rejection::TooLongForBudget);
        }
        Ok(())
    }

    fn pin(&mut self, blocks: u64) -> bool {
        Engine::pin(self, blocks)
    }

    fn unpin(&mut self, blocks: u64) {
        Engine::unpin(self, blocks)
    }

    fn pin_cached(&mut self, keys: &[u64], blocks: u64) -> Option<u64> {
        Engine::pin_cached(self, keys, blocks)
    }

    fn unpin_cached(&mut self, held: &[u64], blocks: u64) {
        Engine::unpin_cached(self, held, blocks)
    }

    fn share_prefix(&mut self, tag: u32, ids: &[u64], tokens_per_id: u64) {
        let Some(slot) = self.slot_of(tag) else {
            return;
        };
        let seq = &mut self.seqs[slot as usize];
        if seq.tag == tag && seq.ctx == 0 {
            let sh = seq.content.sharing_mut();
            sh.set_ids(ids);
            sh.shared_tokens = tokens_per_id;
        }
    }

    fn share_stream(&mut self, tag: u32, key: crate::prefix::StreamKey) {
        let Some(slot) = self.slot_of(tag) else {
            return;
        };
        let seq = &mut self.seqs[slot as usize];
        if seq.tag == tag && seq.ctx == 0 {
            seq.content.sharing_mut().stream = Some(key);
        }
    }

    fn publish_cache(&mut self) -> bool {
        match self.pool.cache() {
            Some(c) => {
                c.publish();
                true
            }
            None => false,
        }
    }

    fn take_published(&mut self, into: &mut Vec<(u64, bool)>) {
        if let Some(c) = self.pool.cache() {
            c.take_published(into);
        }
    }

    fn cache_block_tokens(&self) -> Option<u64> {
        self.pool
            .has_cache()
            .then_some(self.cfg.block_tokens as u64)
    }

    fn cache_contains(&self, key: u64) -> bool {
        self.pool.cache_contains(key)
    }

    fn make_explicit(&mut self, tag: u32) -> Option<Implicit> {
        let slot = self.slot_of(tag)?;
        (self.seqs[slot as usize].tag == tag)
            .then(|| self.streak_explicit(slot))
            .flatten()
    }

    fn turn(&mut self, now_ns: u64, step: u64) -> Option<(StepReport, Dispatch)> {
        Engine::turn(self, now_ns, step)
    }

    fn streak_floor(&self) -> Option<u64> {
        Some(Engine::streak_floor(self))
    }

    fn coast_ends(&mut self, turns_max: u32, ends: &mut Vec<u64>) {
        Engine::coast_ends(self, turns_max, ends)
    }

    fn may_coast(&self) -> bool {
        Engine::may_coast(self)
    }

    fn turns_at(&mut self, step: u64, ends: &[u64], after_turn: bool) -> Turned {
        Engine::turns_at(self, step, ends, after_turn)
    }

    fn totals(&self) -> ReplicaStats {
        let s = self.stats();
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
            stalls_pinned: s.stalls_pinned,
            marked_blocks_peak: s.marked_blocks_peak,
            prefix_query_tokens: s.prefix_query_tokens,
            prefix_hit_tokens: s.prefix_hit_tokens,
        }
    }
}

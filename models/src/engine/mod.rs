//! The continuous-batching engine of one replica (vLLM-like), as a sans-IO state machine.
//!
//! - A waiting queue and a running set bounded by `max_num_seqs`.
//! - A token budget per step (`max_num_batched_tokens`), with optional chunked prefill.
//! - A paged KV allocator: a request is admitted only when the blocks for its first chunk are
//!   free; a running request that cannot grow preempts the newest running request, which is
//!   recomputed later (preemption by recompute).
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

#[macro_use]
mod books;
mod abort;
mod seq;
mod waiting;

use std::collections::VecDeque;

use std::collections::hash_map::Entry as MapEntry;

use rustc_hash::FxHashMap;

use crate::gpu::{StepCost, StepShape};
use crate::kv::KvPool;
use crate::protocol::{
    fits, Abort, Checkpoint, CheckpointReport, Dispatch, Gauges, NewRequest, Outbox, Outcome,
    Rejection, ReleaseMode, ReplicaStats, Retired, Scheduler, StepOutput, StepReport, UnknownAbort,
};

use books::{free_blocks, release_fenced, Books};
use seq::{BoundedIds, Entry, Phase, Seq, Slots, Step, Taint};
pub use seq::{EngineStats, TOMBSTONES_MAX};
use waiting::Waiting;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EngineConfig {
    pub max_num_seqs: u32,
    pub max_num_batched_tokens: u32,
    pub chunked_prefill: bool,
    pub block_tokens: u32,
    pub kv_blocks: u64,
    /// In-flight window W: 1 for a synchronous loop, 2 for async scheduling, or the pipeline
    /// depth.
    pub window: u32,
    pub cost: StepCost,
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
}

pub struct Engine {
    cfg: EngineConfig,
    kv: KvPool,
    seqs: Vec<Seq>,
    free_slots: Vec<u32>,
    waiting: Waiting,
    /// The serial of the next request enqueued.
    serial_next: u64,
    /// Slots not yet freed, by runtime id: a request-scope abort finds its request here.
    by_runtime: FxHashMap<u64, Slots>,
    /// Sum of the fenced blocks of all requests (blocks on their way back to the pool).
    fenced_total: u64,
    running: Vec<u32>,
    inflight: VecDeque<Step>,
    spare_entries: Vec<Vec<Entry>>,
    gpu_free_ns: u64,
    step_next: u64,
    live: u64,
    stats: EngineStats,
    pending_aborts: Vec<Abort>,
    passes: u64,
    /// A step ended since the last checkpoint: the engine loop is between steps.
    at_boundary: bool,
    taint: Taint,
    /// Terminated runtime ids (with `tombstones`).
    tombstones: BoundedIds,
    /// Idempotency keys of the aborts handled so far.
    abort_keys: BoundedIds,
    /// Engine slot of each caller tag, for `mark_intent`.
    slot_of_tag: Vec<Option<u32>>,
    /// Blocks held by marked requests, now.
    marked_blocks: u64,
    /// Blocks taken from the pool for work outside the engine (a KV transfer's buffers).
    pinned_blocks: u64,
    /// Tags of requests dispatched for the first time, drained by `take_started`.
    started: Vec<u32>,
}

/// The step being composed.
struct Compose {
    entries: Vec<Entry>,
    shape: StepShape,
    budget: u32,
    /// A request was preempted for room in this step.
    preempted: bool,
}

impl Engine {
    pub fn new(cfg: EngineConfig) -> Self {
        assert!(cfg.max_num_seqs > 0 && cfg.max_num_batched_tokens > 0 && cfg.window > 0);
        Engine {
            kv: KvPool::new(cfg.kv_blocks, cfg.block_tokens),
            cfg,
            seqs: Vec::new(),
            free_slots: Vec::new(),
            waiting: Waiting::default(),
            serial_next: 0,
            by_runtime: FxHashMap::default(),
            fenced_total: 0,
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
            tombstones: BoundedIds::default(),
            abort_keys: BoundedIds::default(),
            slot_of_tag: Vec::new(),
            marked_blocks: 0,
            pinned_blocks: 0,
            started: Vec::new(),
        }
    }

    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    /// Running requests first, oldest first: a prefill chunk or one decode token each.
    fn compose_running(&mut self, now_ns: u64, c: &mut Compose) {
        let mut i = 0;
        while i < self.running.len() && c.budget > 0 {
            let slot = self.running[i];
            let seq = &self.seqs[slot as usize];
            let prefill = seq.ctx < seq.need;
            if !prefill && seq.length_capped && seq.sched_out >= seq.output {
                i += 1; // its last token is in flight, and the scheduler knows it is the last
                continue;
            }
            let tokens = if prefill {
                let rem = seq.need - seq.ctx;
                if self.cfg.chunked_prefill {
                    rem.min(c.budget)
                } else if rem <= c.budget {
                    rem
                } else {
                    i += 1;
                    continue;
                }
            } else {
                1
            };
            let grow = self.kv.blocks_for((seq.ctx + tokens) as u64) - seq.blocks;
            if !self.make_room(i, grow, now_ns, c) {
                break;
            }
            self.place(slot, now_ns, grow, prefill, tokens, c);
            c.budget -= tokens;
            i += 1;
        }
    }

    /// Allocate `grow` blocks for the running request at index `i`, preempting the newest running
    /// requests (those after it) until they fit. Never the requester itself: with steps in
    /// flight a preempted request's blocks come back only when they end, so preempting the
    /// requester too would free nothing now and throw its in-flight work away, again and again.
    /// False if the requester must wait: for blocks already on their way back, or because no
    /// newer request is left to preempt (an older one will finish, or preempt it).
    fn make_room(&mut self, i: usize, grow: u64, now_ns: u64, c: &mut Compose) -> bool {
        loop {
            if self.kv.try_alloc(grow) {
                return true;
            }
            if self.kv.free_blocks() + self.fenced_pending() >= grow {
                return false;
            }
            if self.running.len() <= i + 1 {
                return false;
            }
            let victim = *self.running.last().expect("a newer running request");
            self.preempt(victim, now_ns);
            c.preempted = true;
        }
    }

    /// Then waiting requests, in order, while nothing was preempted this step (vLLM's rule),
    /// unless the step would otherwise be empty.
    fn admit_waiting(&mut self, now_ns: u64, c: &mut Compose) {
        while (!c.preempted || c.entries.is_empty())
            && c.budget > 0
            && (self.running.len() as u32) < self.cfg.max_num_seqs
        {
            let Some(slot) = self.waiting.front(&self.seqs) else {
                break;
            };
            let seq = &self.seqs[slot as usize];
            debug_assert_eq!(seq.ctx, 0);
            // A prompt whose KV arrived from a prefill stage starts with a decode token.
            let kv_ready = seq.kv_ready && seq.incarnation == 0;
            let rem = if kv_ready { 1 } else { seq.need };
            let tokens = if self.cfg.chunked_prefill {
                rem.min(c.budget)
            } else if rem <= c.budget {
                rem
            } else {
                break;
            };
            let held = if kv_ready { seq.need } else { 0 };
            let blocks = self.kv.blocks_for((held + tokens) as u64);
            if !self.kv.try_alloc(blocks) {
                if self.marked_blocks > 0 {
                    self.stats.admission_stalls += 1;
                }
                if self.pinned_blocks > 0 {
                    self.stats.stalls_pinned += 1;
                }
                break; // admission only when the blocks are there
            }
            if seq.incarnation == 0 {
                self.started.push(seq.tag);
            }
            self.waiting.pop_front();
            self.running.push(slot);
            self.seqs[slot as usize].phase = Phase::Running;
            self.seqs[slot as usize].ctx = held;
            self.place(slot, now_ns, blocks, !kv_ready, tokens, c);
            c.budget -= tokens;
        }
    }

    /// Put the composed step in flight: it ends when the GPU is free plus its duration.
    fn launch(&mut self, now_ns: u64, c: Compose) -> Dispatch {
        for e in &c.entries {
            self.seqs[e.slot as usize].inflight += 1;
        }
        let duration_ns = self.cfg.cost.step_ns(c.shape);
        let start_ns = now_ns.max(self.gpu_free_ns);
        let end_ns = start_ns + duration_ns;
        self.gpu_free_ns = end_ns;
        let step = self.step_next;
        self.step_next += 1;
        self.stats.steps += 1;
        self.stats.busy_ns += duration_ns;
        self.stats.prefill_tokens += c.shape.prefill_tokens;
        self.inflight.push_back(Step {
            id: step,
            end_ns,
            duration_ns,
            entries: c.entries,
        });
        Dispatch {
            step,
            start_ns,
            end_ns,
        }
    }

    /// Put `tokens` of a request into the step being composed, with `blocks` newly allocated
    /// for them: the one path for running and newly admitted requests alike.
    fn place(
        &mut self,
        slot: u32,
        now_ns: u64,
        blocks: u64,
        prefill: bool,
        tokens: u32,
        c: &mut Compose,
    ) {
        self.on_alloc(slot, blocks);
        let seq = &mut self.seqs[slot as usize];
        seq.touch(now_ns);
        seq.blocks += blocks;
        let sample = seq.advance(tokens);
        if prefill {
            c.shape.prefill_tokens += tokens as u64;
        } else {
            c.shape.decode_seqs += 1;
            c.shape.kv_tokens_read += seq.ctx as u64;
        }
        c.entries.push(Entry {
            slot,
            incarnation: seq.incarnation,
            tokens,
            sample,
        });
    }

    fn preempt(&mut self, slot: u32, now_ns: u64) {
        let last = self.running.pop();
        debug_assert_eq!(last, Some(slot));
        let seq = &mut self.seqs[slot as usize];
        seq.touch(now_ns);
        seq.fenced_blocks += seq.blocks;
        self.fenced_total += seq.blocks;
        seq.blocks = 0;
        release_fenced(books!(self), seq);
        seq.restart();
        self.waiting.push_front(slot, &self.seqs);
        self.stats.preemptions += 1;
    }

    /// One request's share of a processed step: its outcome, and its fenced blocks back to the
    /// pool once no step in flight uses them. True if it finished with this token.
    fn process_entry(&mut self, e: &Entry, now_ns: u64, outputs: &mut Vec<StepOutput>) -> bool {
        let seq = &mut self.seqs[e.slot as usize];
        seq.inflight -= 1;
        let fenced_before = seq.fenced_blocks;
        let outcome = seq.outcome(e, now_ns);
        self.fenced_total += seq.fenced_blocks - fenced_before;
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
        if seq.inflight == 0 && seq.fenced_blocks > 0 {
            seq.touch(now_ns);
            release_fenced(books!(self), seq);
        }
        matches!(outcome, Outcome::Token { last: true, .. })
    }

    /// A request whose blocks were just allocated: if the pool handed out blocks that a step in
    /// flight still writes (an immediate release), its output is corrupted from now on.
    fn on_alloc(&mut self, slot: u32, blocks: u64) {
        if self.seqs[slot as usize].marked {
            self.marked_blocks += blocks;
            self.stats.marked_blocks_peak = self.stats.marked_blocks_peak.max(self.marked_blocks);
        }
        if self.taint.allocate(blocks) {
            self.seqs[slot as usize].corrupted = true;
            self.stats.corrupted_allocations += 1;
        }
    }

    /// Leave the engine once finished or aborted and no step in flight uses the request.
    fn try_retire(&mut self, slot: u32, out: &mut Outbox) {
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
        if self.slot_of_tag.get(seq.tag as usize) == Some(&Some(slot)) {
            self.slot_of_tag[seq.tag as usize] = None;
        }
        if self.cfg.tombstones {
            self.tombstones.insert(seq.handle.runtime_id);
        }
        let rid = seq.handle.runtime_id;
        if self
            .by_runtime
            .get_mut(&rid)
            .is_some_and(|s| s.remove(slot))
        {
            self.by_runtime.remove(&rid);
        }
        self.free_slots.push(slot);
        self.live -= 1;
    }
}

impl Scheduler for Engine {
    /// Accept a request into the waiting queue, or refuse it if it can never run here.
    fn enqueue(&mut self, now_ns: u64, r: NewRequest) -> Result<(), Rejection> {
        self.accepts(&r).inspect_err(|_| self.stats.rejected += 1)?;
        let mut seq = Seq::new(&r, now_ns);
        seq.serial = self.serial_next;
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
        match self.by_runtime.entry(r.handle.runtime_id) {
            MapEntry::Occupied(mut o) => o.get_mut().push(slot),
            MapEntry::Vacant(v) => {
                v.insert(Slots::One(slot));
            }
        }
        self.live += 1;
        let t = r.tag as usize;
        if self.slot_of_tag.len() <= t {
            self.slot_of_tag.resize(t + 1, None);
        }
        self.slot_of_tag[t] = Some(slot);
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
        };
        self.compose_running(now_ns, &mut c);
        self.admit_waiting(now_ns, &mut c);
        out.started.append(&mut self.started);
        if c.entries.is_empty() {
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
        let mut tokens_total = 0u64;
        let mut finished_any = false;
        for e in &s.entries {
            tokens_total += e.tokens as u64;
            finished_any |= self.process_entry(e, now_ns, &mut out.outputs);
            // A request appears at most once per step, so it is retired at most once here.
            self.try_retire(e.slot, out);
        }
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
        }
    }

    /// An abort arrives at the engine. It takes effect at the next checkpoint.
    fn abort(&mut self, a: Abort) {
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

    fn timer_ns(&self) -> Option<u64> {
        None
    }

    fn gauges(&self) -> Gauges {
        Gauges {
            waiting: self.waiting.len(),
            running: self.running.len() as u64,
            kv_blocks: self.kv.in_use(),
            kv_retained: self.marked_blocks,
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
        &self.kv
    }

    fn accepts(&self, r: &NewRequest) -> Result<(), Rejection> {
        let total = fits(&self.kv, r)?;
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

    fn totals(&self) -> ReplicaStats {
        let s = &self.stats;
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
        }
    }
}

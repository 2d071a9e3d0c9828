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
//! answers with what to schedule (a step's end time) and what came out (tokens, releases).

use std::collections::VecDeque;

use crate::gpu::{StepCost, StepShape};
use crate::kv::KvPool;

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

/// How a request can be named by an abort.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Handle {
    /// The id the runtime knows the request by (possibly reused by the client).
    pub runtime_id: u64,
    /// The shared connection (stream) the request travels on.
    pub stream: u64,
    /// The sequence (stateful session) the request belongs to.
    pub sequence: u64,
}

/// What an abort reaches. A group abort is an abort through a wider scope, not another path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// Live requests with this runtime id.
    Request(u64),
    /// Every live request on this stream.
    Stream(u64),
    /// Every live request of this sequence.
    Sequence(u64),
    /// Every live request whose decimal runtime id starts with this one's (SGLang's `startswith`).
    Prefix(u64),
    /// Every live request of the engine.
    Engine,
}

impl Scope {
    pub fn reaches(self, h: &Handle) -> bool {
        match self {
            Scope::Request(id) => h.runtime_id == id,
            Scope::Stream(s) => h.stream == s,
            Scope::Sequence(q) => h.sequence == q,
            Scope::Prefix(p) => decimal_prefix(p, h.runtime_id),
            Scope::Engine => true,
        }
    }
}

/// Whether the decimal digits of `p` are a prefix of those of `x`.
fn decimal_prefix(p: u64, mut x: u64) -> bool {
    while x > p {
        x /= 10;
    }
    x == p
}

/// When the engine looks at pending aborts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Checkpoint {
    /// At every k-th scheduler pass (k = 1: every step boundary).
    EveryPasses(u32),
    /// Never: a backend that ignores the cancel flag.
    Never,
}

/// How an aborted request's KV blocks return to the pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReleaseMode {
    /// After every dispatched step that uses them has ended (vLLM #45357's fix).
    Fenced,
    /// At once, even while a dispatched step still writes them: the next owner of those blocks
    /// gets corrupted output.
    Immediate,
}

/// How far a fault on the abort path reaches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlastRadius {
    /// Only the addressed request.
    Request,
    /// Every running request (TGI discards the whole batch).
    Batch,
    /// Every live request of the engine (an engine-fatal assert).
    Engine,
}

/// What an abort for a runtime id with no live request does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnknownAbort {
    Ignore,
    Fault(BlastRadius),
}

/// One abort delivered to the engine. `fault` is decided by the caller (who owns the
/// randomness): whether handling this abort fails, and how far.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Abort {
    pub scope: Scope,
    pub fault: Option<BlastRadius>,
}

/// A request removed by an abort at a checkpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Observed {
    pub id: u64,
    pub tag: u32,
    /// Reached by the abort's scope; false when removed as collateral of a fault.
    pub in_scope: bool,
}

/// What one checkpoint did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CheckpointReport {
    /// Aborts handled at this checkpoint.
    pub aborts: u32,
    /// Of those, aborts that reached no live request.
    pub unknown: u32,
    /// Of those, aborts ignored because their id was tombstoned.
    pub tombstoned: u32,
    /// Faults raised while handling them.
    pub faults: u32,
}

/// A request as the engine receives it. `output_tokens` is where the model emits its end of
/// sequence; the scheduler does not use it to decide, it only discovers it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NewRequest {
    pub id: u64,
    /// The caller's handle (a slab index): echoed in every output and release, never read.
    pub tag: u32,
    pub handle: Handle,
    pub prompt_tokens: u32,
    pub output_tokens: u32,
}

/// A step was dispatched: the world schedules its end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dispatch {
    pub step: u64,
    pub start_ns: u64,
    pub end_ns: u64,
}

/// What a step did for one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// A prefill chunk that did not finish the prompt: progress, no token.
    Prefill,
    /// Output token number `index` (1-based) was produced; `last` is the end of sequence.
    Token { index: u32, last: bool },
    /// Work whose result is thrown away: a token past the end of sequence (in-flight window), or
    /// the output of an incarnation that was preempted while the step was in flight.
    Discarded,
    /// A finished member's slot in a shared (static) batch: computed, never meaningful.
    Padding,
}

/// One request's share of a processed step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepOutput {
    pub id: u64,
    pub tag: u32,
    /// The request's KV was reused while a step still wrote it: its output is corrupted.
    pub corrupted: bool,
    /// Tokens this request had in the step (prefill chunk length, or 1 for a decode slot).
    pub tokens: u32,
    pub outcome: Outcome,
}

/// A processed step, for accounting: its duration is shared among its outputs by tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepReport {
    pub step: u64,
    pub duration_ns: u64,
    pub tokens: u64,
}

/// A request left the engine: its blocks are back in the pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Released {
    pub id: u64,
    pub tag: u32,
    /// Integral of the blocks it held over time, in block·ns.
    pub kv_block_ns: u128,
    /// The part of that integral after `mark_intent` (retained after the cancel intent).
    pub kv_block_ns_marked: u128,
}

/// Why a request was refused at enqueue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rejection {
    /// Prompt plus output would need more KV blocks than the replica has.
    TooLongForKv,
    /// Without chunked prefill, the prompt plus output must fit one step's token budget.
    TooLongForBudget,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Waiting,
    Running,
    /// End of sequence delivered; waiting for in-flight steps to drain.
    Finished,
    /// Removed by an abort; waiting for in-flight steps to drain.
    Aborted,
}

#[derive(Clone, Debug)]
struct Seq {
    id: u64,
    tag: u32,
    handle: Handle,
    corrupted: bool,
    released_sent: bool,
    prompt: u32,
    output: u32,
    /// Tokens to compute before the next sample: the prompt, or prompt + delivered tokens after a
    /// preemption (recompute).
    need: u32,
    /// Tokens whose KV is computed or scheduled.
    ctx: u32,
    /// Output tokens sampled by dispatched steps of this incarnation.
    sched_out: u32,
    /// Output tokens delivered.
    done_out: u32,
    blocks: u64,
    /// Blocks of a finished or preempted incarnation, returned once no step in flight uses them.
    fenced_blocks: u64,
    inflight: u32,
    incarnation: u32,
    phase: Phase,
    kv_block_ns: u128,
    blocks_since_ns: u64,
    marked: bool,
    kv_block_ns_marked: u128,
}

impl Seq {
    fn touch(&mut self, now_ns: u64) {
        debug_assert!(now_ns >= self.blocks_since_ns);
        let held = (self.blocks + self.fenced_blocks) as u128;
        let area = held * (now_ns - self.blocks_since_ns) as u128;
        self.kv_block_ns += area;
        if self.marked {
            self.kv_block_ns_marked += area;
        }
        self.blocks_since_ns = now_ns;
    }
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    slot: u32,
    incarnation: u32,
    tokens: u32,
    /// The output index this entry samples, 0 if none (a non-final prefill chunk).
    sample: u32,
}

#[derive(Debug)]
struct Step {
    id: u64,
    end_ns: u64,
    duration_ns: u64,
    entries: Vec<Entry>,
}

/// Counters of one engine, for reports and conservation checks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
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
    /// Aborts dropped unobserved (a backend that never checks).
    pub aborts_unobserved: u64,
    pub faults: u64,
    /// Allocations that reused blocks a step in flight still wrote.
    pub corrupted_allocations: u64,
    /// Admissions refused for want of blocks while requests with a cancel intent held some.
    pub admission_stalls: u64,
    /// Most blocks held at once by requests with a cancel intent.
    pub marked_blocks_peak: u64,
}

pub struct Engine {
    cfg: EngineConfig,
    kv: KvPool,
    seqs: Vec<Seq>,
    free_slots: Vec<u32>,
    waiting: VecDeque<u32>,
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
    /// Blocks released while a step in flight still wrote them, with that step's id.
    tainted: VecDeque<(u64, u64)>,
    tainted_blocks: u64,
    /// Terminated runtime ids (with `tombstones`), oldest first, bounded by `TOMBSTONES_MAX`.
    tombstone_order: VecDeque<u64>,
    tombstone_set: crate::fxhash::FxHashSet<u64>,
    /// Engine slot of each caller tag (u32::MAX: none), for `mark_intent`.
    slot_of_tag: Vec<u32>,
    /// Blocks held by marked requests, now.
    marked_blocks: u64,
    /// Tags of requests dispatched for the first time, drained by `take_started`.
    started: Vec<u32>,
}

/// Terminated runtime ids remembered at most per engine (the runtime's tombstone retention). A late
/// abort comes seconds after its request ended; at a few hundred requests per second per replica
/// this covers many minutes, and memory stays bounded however long the run.
pub const TOMBSTONES_MAX: usize = 1 << 13;

impl Engine {
    pub fn new(cfg: EngineConfig) -> Self {
        assert!(cfg.max_num_seqs > 0 && cfg.max_num_batched_tokens > 0 && cfg.window > 0);
        Engine {
            kv: KvPool::new(cfg.kv_blocks, cfg.block_tokens),
            cfg,
            seqs: Vec::new(),
            free_slots: Vec::new(),
            waiting: VecDeque::new(),
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
            tainted: VecDeque::new(),
            tainted_blocks: 0,
            tombstone_order: VecDeque::new(),
            tombstone_set: crate::fxhash::FxHashSet::default(),
            slot_of_tag: Vec::new(),
            marked_blocks: 0,
            started: Vec::new(),
        }
    }

    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    /// Accept a request into the waiting queue, or refuse it if it can never run here.
    pub fn enqueue(&mut self, now_ns: u64, r: NewRequest) -> Result<(), Rejection> {
        assert!(
            r.prompt_tokens > 0 && r.output_tokens > 0,
            "empty request {r:?}"
        );
        let total = r.prompt_tokens as u64 + r.output_tokens as u64;
        if self.kv.blocks_for(total) > self.kv.capacity_blocks() {
            self.stats.rejected += 1;
            return Err(Rejection::TooLongForKv);
        }
        if !self.cfg.chunked_prefill && total > self.cfg.max_num_batched_tokens as u64 {
            self.stats.rejected += 1;
            return Err(Rejection::TooLongForBudget);
        }
        let seq = Seq {
            id: r.id,
            tag: r.tag,
            handle: r.handle,
            corrupted: false,
            released_sent: false,
            prompt: r.prompt_tokens,
            output: r.output_tokens,
            need: r.prompt_tokens,
            ctx: 0,
            sched_out: 0,
            done_out: 0,
            blocks: 0,
            fenced_blocks: 0,
            inflight: 0,
            incarnation: 0,
            phase: Phase::Waiting,
            kv_block_ns: 0,
            blocks_since_ns: now_ns,
            marked: false,
            kv_block_ns_marked: 0,
        };
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
        self.waiting.push_back(slot);
        self.live += 1;
        let t = r.tag as usize;
        if self.slot_of_tag.len() <= t {
            self.slot_of_tag.resize(t + 1, u32::MAX);
        }
        self.slot_of_tag[t] = slot;
        Ok(())
    }

    /// Compose and dispatch the next step if the window has room and there is work.
    pub fn dispatch(&mut self, now_ns: u64) -> Option<Dispatch> {
        if self.inflight.len() as u32 >= self.cfg.window {
            return None;
        }
        let mut entries = self.spare_entries.pop().unwrap_or_default();
        debug_assert!(entries.is_empty());
        let mut shape = StepShape::default();
        let mut budget = self.cfg.max_num_batched_tokens;
        let mut preempted = false;

        // Running requests first, oldest first.
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let slot = self.running[i];
            let seq = &self.seqs[slot as usize];
            let prefill = seq.ctx < seq.need;
            let tokens = if prefill {
                let rem = seq.need - seq.ctx;
                if self.cfg.chunked_prefill {
                    rem.min(budget)
                } else if rem <= budget {
                    rem
                } else {
                    i += 1;
                    continue;
                }
            } else {
                1
            };
            let grow = self.kv.blocks_for((seq.ctx + tokens) as u64) - seq.blocks;
            // Make room by preempting the newest running request, possibly this one.
            let mut self_preempted = false;
            while !self.kv.try_alloc(grow) {
                let victim = *self.running.last().expect("running is not empty");
                self.preempt(victim, now_ns);
                preempted = true;
                if victim == slot {
                    self_preempted = true;
                    break;
                }
            }
            if self_preempted {
                break;
            }
            self.place(
                slot,
                now_ns,
                grow,
                prefill,
                tokens,
                &mut shape,
                &mut entries,
            );
            budget -= tokens;
            i += 1;
        }

        // Then waiting requests, in order, while nothing was preempted this step (vLLM's rule),
        // unless the step would otherwise be empty: a lone request that preempted itself has
        // freed everything and must be readmitted, or nothing would ever dispatch again.
        while (!preempted || entries.is_empty())
            && budget > 0
            && (self.running.len() as u32) < self.cfg.max_num_seqs
        {
            let Some(&slot) = self.waiting.front() else {
                break;
            };
            let seq = &self.seqs[slot as usize];
            debug_assert_eq!(seq.ctx, 0);
            let rem = seq.need;
            let tokens = if self.cfg.chunked_prefill {
                rem.min(budget)
            } else if rem <= budget {
                rem
            } else {
                break;
            };
            let blocks = self.kv.blocks_for(tokens as u64);
            if !self.kv.try_alloc(blocks) {
                if self.marked_blocks > 0 {
                    self.stats.admission_stalls += 1;
                }
                break; // admission only when the blocks are there
            }
            if seq.incarnation == 0 {
                self.started.push(seq.tag);
            }
            self.waiting.pop_front();
            self.running.push(slot);
            self.seqs[slot as usize].phase = Phase::Running;
            self.place(slot, now_ns, blocks, true, tokens, &mut shape, &mut entries);
            budget -= tokens;
        }

        if entries.is_empty() {
            self.spare_entries.push(entries);
            return None;
        }
        for e in &entries {
            self.seqs[e.slot as usize].inflight += 1;
        }
        let duration_ns = self.cfg.cost.step_ns(shape);
        let start_ns = now_ns.max(self.gpu_free_ns);
        let end_ns = start_ns + duration_ns;
        self.gpu_free_ns = end_ns;
        let step = self.step_next;
        self.step_next += 1;
        self.stats.steps += 1;
        self.stats.busy_ns += duration_ns;
        self.stats.prefill_tokens += shape.prefill_tokens;
        self.inflight.push_back(Step {
            id: step,
            end_ns,
            duration_ns,
            entries,
        });
        Some(Dispatch {
            step,
            start_ns,
            end_ns,
        })
    }

    /// Put `tokens` of a request into the step being composed, with `blocks` newly allocated
    /// for them: the one path for running and newly admitted requests alike.
    #[allow(clippy::too_many_arguments)]
    fn place(
        &mut self,
        slot: u32,
        now_ns: u64,
        blocks: u64,
        prefill: bool,
        tokens: u32,
        shape: &mut StepShape,
        entries: &mut Vec<Entry>,
    ) {
        self.on_alloc(slot, blocks);
        let seq = &mut self.seqs[slot as usize];
        seq.touch(now_ns);
        seq.blocks += blocks;
        let sample = Self::advance(seq, tokens);
        Self::shape_add(shape, seq, prefill, tokens);
        entries.push(Entry {
            slot,
            incarnation: seq.incarnation,
            tokens,
            sample,
        });
    }

    /// Advance a sequence by `tokens` scheduled tokens; returns the output index sampled, or 0.
    fn advance(seq: &mut Seq, tokens: u32) -> u32 {
        seq.ctx += tokens;
        if seq.ctx >= seq.need {
            seq.sched_out += 1;
            seq.sched_out
        } else {
            0
        }
    }

    fn shape_add(shape: &mut StepShape, seq: &Seq, prefill: bool, tokens: u32) {
        if prefill {
            shape.prefill_tokens += tokens as u64;
        } else {
            shape.decode_seqs += 1;
            shape.kv_tokens_read += seq.ctx as u64;
        }
    }

    fn preempt(&mut self, slot: u32, now_ns: u64) {
        let last = self.running.pop();
        debug_assert_eq!(last, Some(slot));
        let seq = &mut self.seqs[slot as usize];
        seq.touch(now_ns);
        seq.fenced_blocks += seq.blocks;
        seq.blocks = 0;
        if seq.inflight == 0 {
            self.kv.free(seq.fenced_blocks);
            if seq.marked {
                self.marked_blocks -= seq.fenced_blocks;
            }
            seq.fenced_blocks = 0;
        }
        seq.incarnation += 1;
        seq.need = seq.prompt + seq.done_out;
        seq.ctx = 0;
        seq.sched_out = seq.done_out;
        seq.phase = Phase::Waiting;
        self.waiting.push_front(slot);
        self.stats.preemptions += 1;
    }

    /// Process the oldest dispatched step, which ends now. Pushes one `StepOutput` per entry and
    /// one `Released` per request that left the engine.
    pub fn step_done(
        &mut self,
        now_ns: u64,
        step: u64,
        outputs: &mut Vec<StepOutput>,
        released: &mut Vec<Released>,
    ) -> StepReport {
        let s = self.inflight.pop_front().expect("a step in flight");
        assert_eq!(s.id, step, "steps complete in dispatch order");
        self.at_boundary = true;
        assert_eq!(s.end_ns, now_ns, "step processed at its end time");
        let mut tokens_total = 0u64;
        let mut finished_any = false;
        for e in &s.entries {
            tokens_total += e.tokens as u64;
            let seq = &mut self.seqs[e.slot as usize];
            seq.inflight -= 1;
            let outcome = if e.incarnation != seq.incarnation
                || seq.phase == Phase::Finished
                || seq.phase == Phase::Aborted
            {
                Outcome::Discarded
            } else if e.sample == 0 {
                Outcome::Prefill
            } else {
                debug_assert_eq!(e.sample, seq.done_out + 1);
                debug_assert!(e.sample <= seq.output);
                seq.done_out += 1;
                let last = seq.done_out == seq.output;
                if last {
                    seq.phase = Phase::Finished;
                    seq.touch(now_ns);
                    seq.fenced_blocks += seq.blocks;
                    seq.blocks = 0;
                    finished_any = true;
                }
                Outcome::Token {
                    index: e.sample,
                    last,
                }
            };
            match outcome {
                Outcome::Token { .. } => self.stats.tokens_delivered += 1,
                Outcome::Discarded => {
                    if e.sample > 0 {
                        self.stats.tokens_discarded += 1;
                    }
                }
                Outcome::Prefill | Outcome::Padding => {}
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
                self.kv.free(seq.fenced_blocks);
                if seq.marked {
                    self.marked_blocks -= seq.fenced_blocks;
                }
                seq.fenced_blocks = 0;
            }
            // A request appears at most once per step, so it is retired at most once here.
            self.try_retire(e.slot, released);
        }
        while self
            .tainted
            .front()
            .is_some_and(|&(_, fence)| fence <= step)
        {
            let (blocks, _) = self.tainted.pop_front().expect("front exists");
            self.tainted_blocks -= blocks;
        }
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

    /// A request whose blocks were just allocated: if the pool handed out blocks that a step in
    /// flight still writes (an immediate release), its output is corrupted from now on. Freed
    /// blocks are reused first (a LIFO free list), which is what makes the hazard real.
    fn on_alloc(&mut self, slot: u32, blocks: u64) {
        if self.seqs[slot as usize].marked {
            self.marked_blocks += blocks;
            self.stats.marked_blocks_peak = self.stats.marked_blocks_peak.max(self.marked_blocks);
        }
        if blocks == 0 || self.tainted_blocks == 0 {
            return;
        }
        // Last freed, first reused.
        let mut need = blocks;
        while need > 0 {
            let Some(last) = self.tainted.back_mut() else {
                break;
            };
            let taken = last.0.min(need);
            last.0 -= taken;
            need -= taken;
            self.tainted_blocks -= taken;
            if last.0 == 0 {
                self.tainted.pop_back();
            }
        }
        self.seqs[slot as usize].corrupted = true;
        self.stats.corrupted_allocations += 1;
    }

    /// Leave the engine once finished or aborted and no step in flight uses the request.
    fn try_retire(&mut self, slot: u32, released: &mut Vec<Released>) {
        let seq = &mut self.seqs[slot as usize];
        if !matches!(seq.phase, Phase::Finished | Phase::Aborted) || seq.inflight > 0 {
            return;
        }
        debug_assert_eq!(seq.blocks + seq.fenced_blocks, 0);
        if !seq.released_sent {
            seq.released_sent = true;
            released.push(Released {
                id: seq.id,
                tag: seq.tag,
                kv_block_ns: seq.kv_block_ns,
                kv_block_ns_marked: seq.kv_block_ns_marked,
            });
        }
        if self.slot_of_tag.get(seq.tag as usize) == Some(&slot) {
            self.slot_of_tag[seq.tag as usize] = u32::MAX;
        }
        if self.cfg.tombstones {
            let rid = seq.handle.runtime_id;
            if self.tombstone_set.insert(rid) {
                self.tombstone_order.push_back(rid);
                if self.tombstone_order.len() > TOMBSTONES_MAX {
                    let old = self.tombstone_order.pop_front().expect("non-empty");
                    self.tombstone_set.remove(&old);
                }
            }
        }
        self.free_slots.push(slot);
        self.live -= 1;
    }

    /// The caller's cancel intent for request `tag` happened now: from here on its blocks count as
    /// retained. Does nothing if the request is not here (or already gone).
    pub fn mark_intent(&mut self, now_ns: u64, tag: u32) {
        let Some(&slot) = self.slot_of_tag.get(tag as usize) else {
            return;
        };
        if slot == u32::MAX {
            return;
        }
        let seq = &mut self.seqs[slot as usize];
        if seq.marked || seq.tag != tag {
            return;
        }
        seq.touch(now_ns);
        seq.marked = true;
        self.marked_blocks += seq.blocks + seq.fenced_blocks;
        self.stats.marked_blocks_peak = self.stats.marked_blocks_peak.max(self.marked_blocks);
    }

    /// Tags of requests dispatched for the first time since the last call.
    pub fn take_started(&mut self, into: &mut Vec<u32>) {
        into.append(&mut self.started);
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
        // Every pass consumes the boundary, whether or not aborts are pending.
        let boundary = self.at_boundary || self.inflight.is_empty();
        self.at_boundary = false;
        if self.pending_aborts.is_empty() {
            return report;
        }
        let k = match self.cfg.checkpoint {
            Checkpoint::Never => {
                self.stats.aborts_unobserved += self.pending_aborts.len() as u64;
                self.pending_aborts.clear();
                return report;
            }
            Checkpoint::EveryPasses(k) => k.max(1) as u64,
        };
        if !boundary {
            return report;
        }
        self.passes += 1;
        if self.passes % k != 0 {
            return report;
        }
        let aborts = std::mem::take(&mut self.pending_aborts);
        for a in &aborts {
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
                    if self.cfg.tombstones && self.tombstone_set.contains(&rid) {
                        report.tombstoned += 1;
                        self.stats.aborts_tombstoned += 1;
                        continue;
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
        let seqs = &self.seqs;
        self.running
            .retain(|&slot| seqs[slot as usize].phase == Phase::Running);
        self.waiting
            .retain(|&slot| seqs[slot as usize].phase == Phase::Waiting);
        let mut aborts = aborts;
        aborts.clear();
        if self.pending_aborts.is_empty() {
            self.pending_aborts = aborts;
        }
        report
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
                    self.kv.free(blocks);
                    if seq.marked {
                        self.marked_blocks -= blocks;
                    }
                    seq.fenced_blocks = 0;
                }
            }
            ReleaseMode::Immediate => {
                seq.blocks = 0;
                seq.fenced_blocks = 0;
                self.kv.free(blocks);
                if seq.marked {
                    self.marked_blocks -= blocks;
                }
                if seq.inflight > 0 && blocks > 0 {
                    // The newest dispatched step is the last that can still write them.
                    let fence = self.step_next - 1;
                    self.tainted.push_back((blocks, fence));
                    self.tainted_blocks += blocks;
                }
                // The blocks are back in the pool now: that is the release, whatever still runs.
                seq.released_sent = true;
                released.push(Released {
                    id: seq.id,
                    tag: seq.tag,
                    kv_block_ns: seq.kv_block_ns,
                    kv_block_ns_marked: seq.kv_block_ns_marked,
                });
            }
        }
        self.try_retire(slot, released);
    }

    /// Requests waiting, running or draining here: what a least-loaded router compares.
    pub fn load(&self) -> u64 {
        self.live
    }

    /// Blocks held now by requests with a cancel intent (retained).
    pub fn marked_blocks(&self) -> u64 {
        self.marked_blocks
    }

    pub fn waiting_len(&self) -> usize {
        self.waiting.len()
    }

    pub fn running_len(&self) -> usize {
        self.running.len()
    }

    pub fn inflight_len(&self) -> usize {
        self.inflight.len()
    }

    pub fn is_idle(&self) -> bool {
        self.live == 0 && self.inflight.is_empty()
    }

    pub fn kv(&self) -> &KvPool {
        &self.kv
    }

    pub fn stats(&self) -> EngineStats {
        self.stats
    }
}

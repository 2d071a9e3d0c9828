//! The protocol between the world and a replica's scheduler (the continuous engine or the
//! dynamic batcher): how a request is named, what an abort reaches, what a step produced, and
//! what left. Both schedulers implement `Scheduler`, so the world wires them alike.

use crate::kv::KvPool;

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
    /// The sender's idempotency key (its request's identity): a second delivery of a key the
    /// engine already handled is a duplicate, and changes nothing.
    pub key: u64,
    /// The ideal cancel's, a baseline rather than a runtime: handled at once whatever the
    /// checkpoint, the request's blocks back at once and safely (no later step includes it; the
    /// step already in flight runs on, as a kernel cannot be recalled).
    pub ideal: bool,
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
    /// Of those, duplicates of an abort already handled (ignored).
    pub duplicates: u32,
}

/// A request as the engine receives it. `output_tokens` is where its output ends. For a stop
/// token (the model's end of sequence) the scheduler does not know it in advance, it discovers it
/// when the token comes out; for `length_capped` (the request's `max_tokens`) it does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NewRequest {
    pub id: u64,
    /// The caller's handle (a slab index): echoed in every output and release, never read.
    pub tag: u32,
    pub handle: Handle,
    pub prompt_tokens: u32,
    pub output_tokens: u32,
    /// The prompt's KV is already here (sent by a prefill stage): admission allocates its blocks
    /// and the first step is a decode. The continuous engine only; after a preemption the prompt
    /// is recomputed.
    pub kv_ready: bool,
    /// The output ends at the request's `max_tokens`, which the scheduler knows: with steps in
    /// flight it schedules no step past the end (a stop-token finish costs one, discarded).
    pub length_capped: bool,
    /// The caller needs no record of its output tokens one by one while nothing can observe
    /// them: while it only decodes, the engine may advance it a token a step without an output
    /// each (its streak), and hands the tokens over in order (`Implicit`) before anything else
    /// is said of it. The continuous engine only.
    pub lazy: bool,
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
    /// Work whose result is thrown away: a token past the end of sequence (in-flight window), the
    /// output of an incarnation that was preempted while the step was in flight, or of a request
    /// aborted while the step was in flight. `sampled`: the work included sampling a token.
    Discarded { sampled: bool },
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
    /// The streak step this was (`Implicit`), if the streak had members in it: each of them
    /// got one of `tokens` without an output of its own.
    pub streak: Option<u64>,
}

/// The turns `Scheduler::turns_at` took: `count` of them. The first's report is `first`; each
/// later one's is implied by it and the ticks (`Turned::report`), so none is built or kept a
/// turn. With `count` 0, `first` and `tokens_after` mean nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Turned {
    pub count: usize,
    pub first: StepReport,
    /// The tokens of each step after the first: a streak step's members.
    pub tokens_after: u64,
}

impl Turned {
    /// No turn taken.
    pub const NONE: Turned = Turned {
        count: 0,
        first: StepReport {
            step: 0,
            duration_ns: 0,
            tokens: 0,
            streak: None,
        },
        tokens_after: 0,
    };

    /// The report of turn `i`, below `count`, of a call with these `ends`: the first's, then
    /// the step the turn before launched, the next step, which ran from that turn's tick to
    /// this one's, with `tokens_after` tokens, the next streak step.
    #[inline]
    pub fn report(&self, i: usize, ends: &[u64]) -> StepReport {
        debug_assert!(i < self.count, "a turn not taken");
        if i == 0 {
            return self.first;
        }
        StepReport {
            step: self.first.step + i as u64,
            duration_ns: ends[i] - ends[i - 1],
            tokens: self.tokens_after,
            streak: self.first.streak.map(|s| s + i as u64),
        }
    }
}

/// A lazy request's output tokens that came out without an output each (`NewRequest::lazy`):
/// one in each of its replica's streak steps `from..from + count`, in order, all processed.
/// Handed over before any output or record that follows them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Implicit {
    pub id: u64,
    pub tag: u32,
    pub from: u64,
    pub count: u32,
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
    /// Times it was preempted and recomputed on this replica (vidur's restarts).
    pub restarts: u32,
}

/// Why a request was refused at enqueue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rejection {
    /// Prompt plus output would need more KV blocks than the replica has.
    TooLongForKv,
    /// Without chunked prefill, the prompt plus output must fit one step's token budget.
    TooLongForBudget,
}

/// What a scheduler produced since its caller last drained it. One convention for every model:
/// `dispatch`, `step_done` and `checkpoint` append here, and the caller drains.
#[derive(Debug, Default)]
pub struct Outbox {
    /// Lazy requests' tokens without outputs, handed over: read these first.
    pub implicit: Vec<Implicit>,
    /// One per request of each processed step (but the streak's).
    pub outputs: Vec<StepOutput>,
    /// Requests whose blocks are back in the pool.
    pub released: Vec<Released>,
    /// Requests an abort removed at a checkpoint.
    pub observed: Vec<Observed>,
    /// Tags of requests dispatched for the first time.
    pub started: Vec<u32>,
    /// Requests that left the scheduler: no step in flight holds them any more, so their tag may
    /// be reused. With a fenced release this is the moment of `released`; with an immediate
    /// one it can come later.
    pub retired: Vec<Retired>,
}

/// A request left the scheduler for good.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retired {
    pub id: u64,
    pub tag: u32,
}

impl Outbox {
    pub fn clear(&mut self) {
        self.implicit.clear();
        self.outputs.clear();
        self.released.clear();
        self.observed.clear();
        self.started.clear();
        self.retired.clear();
    }
}

/// What a replica holds at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Gauges {
    pub waiting: u64,
    pub running: u64,
    pub kv_blocks: u64,
    /// KV blocks held by requests with a cancel intent.
    pub kv_retained: u64,
    /// KV blocks lent out of the pool (`pin`): kept for a transfer, or a receive buffer.
    pub kv_pinned: u64,
}

/// Counters common to both kinds of scheduler.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReplicaStats {
    pub steps: u64,
    pub busy_ns: u64,
    pub preemptions: u64,
    pub tokens_delivered: u64,
    /// Tokens sampled and thrown away (in-flight window overshoot, preempted in-flight samples).
    pub tokens_discarded: u64,
    /// Finished members' slots computed in a shared batch.
    pub padding_token_steps: u64,
    pub rejected: u64,
    pub batches: u64,
    pub aborts_handled: u64,
    pub aborts_unknown: u64,
    pub aborts_unobserved: u64,
    pub faults: u64,
    pub corrupted_allocations: u64,
    pub admission_stalls: u64,
    /// Admissions refused for want of blocks while blocks were pinned for a handoff.
    pub stalls_pinned: u64,
    pub marked_blocks_peak: u64,
    /// Prompt tokens looked up in the prefix cache at admission, and those found there.
    pub prefix_query_tokens: u64,
    pub prefix_hit_tokens: u64,
}

impl ReplicaStats {
    /// Sum another replica's counters into these (peaks take the larger).
    pub fn add(&mut self, s: &ReplicaStats) {
        self.steps += s.steps;
        self.busy_ns += s.busy_ns;
        self.preemptions += s.preemptions;
        self.tokens_delivered += s.tokens_delivered;
        self.tokens_discarded += s.tokens_discarded;
        self.padding_token_steps += s.padding_token_steps;
        self.rejected += s.rejected;
        self.batches += s.batches;
        self.aborts_handled += s.aborts_handled;
        self.aborts_unknown += s.aborts_unknown;
        self.aborts_unobserved += s.aborts_unobserved;
        self.faults += s.faults;
        self.corrupted_allocations += s.corrupted_allocations;
        self.admission_stalls += s.admission_stalls;
        self.stalls_pinned += s.stalls_pinned;
        self.marked_blocks_peak = self.marked_blocks_peak.max(s.marked_blocks_peak);
        self.prefix_query_tokens += s.prefix_query_tokens;
        self.prefix_hit_tokens += s.prefix_hit_tokens;
    }
}

/// One replica's scheduler, as the world drives it: the continuous engine or the dynamic
/// batcher. Sans-IO: every call takes `now`, and what follows comes back as a return value or in
/// the outbox.
pub trait Scheduler {
    /// Accept a request, or refuse it if it can never run here.
    fn enqueue(&mut self, now_ns: u64, r: NewRequest) -> Result<(), Rejection>;
    /// Compose and dispatch the next step, if there is room and work.
    fn dispatch(&mut self, now_ns: u64, out: &mut Outbox) -> Option<Dispatch>;
    /// Process the oldest dispatched step, which ends now.
    fn step_done(&mut self, now_ns: u64, step: u64, out: &mut Outbox) -> StepReport;
    /// An abort arrives; it takes effect at the next checkpoint.
    fn abort(&mut self, a: Abort);
    /// A scheduler pass begins: maybe a checkpoint, where pending aborts take effect.
    fn checkpoint(&mut self, now_ns: u64, out: &mut Outbox) -> CheckpointReport;
    /// The caller's cancel intent for request `tag` happened now (retained-KV accounting).
    fn mark_intent(&mut self, now_ns: u64, tag: u32);
    /// When the scheduler wants a pass without any other event (a batch timeout).
    fn timer_ns(&self) -> Option<u64>;
    fn gauges(&self) -> Gauges;
    /// Requests waiting, running or draining: what a least-loaded router compares.
    fn load(&self) -> u64;
    fn is_idle(&self) -> bool;
    fn kv(&self) -> &KvPool;
    fn totals(&self) -> ReplicaStats;
    /// Whether `enqueue` would take `r` (it can ever run here), without taking it.
    fn accepts(&self, r: &NewRequest) -> Result<(), Rejection> {
        fits(self.kv(), r).map(|_| ())
    }
    /// Take `blocks` from the pool for work outside the scheduler (a prefill node's blocks kept
    /// for a transfer, a decode node's receive buffer). False, and nothing taken, if they are not
    /// free or the scheduler cannot lend blocks.
    fn pin(&mut self, _blocks: u64) -> bool {
        false
    }
    /// Give back blocks taken by `pin`.
    fn unpin(&mut self, blocks: u64) {
        assert_eq!(blocks, 0, "this scheduler lends no blocks");
    }
    /// `pin` for a prompt whose leading blocks may be cached: the longest leading run of `keys`
    /// the prefix cache holds is referenced (a block someone else holds costs no free block),
    /// and the rest of `blocks` taken new. The run's length, or `None` and nothing taken if the
    /// blocks are not free. Without a prefix cache, `pin`.
    fn pin_cached(&mut self, _keys: &[u64], blocks: u64) -> Option<u64> {
        self.pin(blocks).then_some(0)
    }
    /// Give back `blocks` taken by `pin_cached`, of which `held` were its cached run.
    fn unpin_cached(&mut self, held: &[u64], blocks: u64) {
        assert!(held.is_empty(), "this scheduler has no prefix cache");
        self.unpin(blocks);
    }
    /// Request `tag`, just enqueued, shares a prompt prefix with others: `ids` are its chained
    /// block ids, one per `tokens_per_id` tokens (a trace's block hashes). Only a scheduler with
    /// a prefix cache reads them.
    fn share_prefix(&mut self, _tag: u32, _ids: &[u64], _tokens_per_id: u64) {}
    /// Request `tag`, just enqueued, continues a conversation's token stream. Only a scheduler
    /// with a prefix cache reads it.
    fn share_stream(&mut self, _tag: u32, _key: crate::prefix::StreamKey) {}
    /// Publish the prefix cache's stored and evicted blocks from now on (a KV-aware router
    /// reads them); false if this scheduler has no prefix cache.
    fn publish_cache(&mut self) -> bool {
        false
    }
    /// The blocks stored (`true`) and evicted (`false`) since the last call, appended to
    /// `into`, oldest first.
    fn take_published(&mut self, _into: &mut Vec<(u64, bool)>) {}
    /// The prefix cache's block size in tokens, if it has one.
    fn cache_block_tokens(&self) -> Option<u64> {
        None
    }
    /// Whether the prefix cache holds a block of content `key` now (the truth a router's
    /// published view lags).
    fn cache_contains(&self, _key: u64) -> bool {
        false
    }
    /// The caller needs every output of lazy request `tag` from now on (it got a cancel
    /// intent, say): it leaves the streak, and its tokens not handed over yet come back here.
    fn make_explicit(&mut self, _tag: u32) -> Option<Implicit> {
        None
    }
    /// Process step `step`, which ends now, and run the pass right after it at once, if that
    /// step and pass would give the caller nothing but the next step's dispatch (a streak step
    /// after a streak step, with nothing else in either): `step_done`, `checkpoint` and
    /// `dispatch` in one. `None`, and nothing done, otherwise. Either way it admits and retires
    /// nothing: `load` is the same after (the caller does not read it again).
    fn turn(&mut self, _now_ns: u64, _step: u64) -> Option<(StepReport, Dispatch)> {
        None
    }
    /// `turn` at each tick of `ends` but the last: step `step` ends at the first, and the step
    /// each turn launches, the next step (numbered one more than the one that ended), starts
    /// then and ends at the next tick. Counts the turns up to the first `turn` that is `None`,
    /// launches another step, or reports other than `Turned::report` implies; each launch is
    /// implied too (step, start and end). A coast's turns (`coast_ends`, whose ends these are:
    /// a run of them, in order), taken together; by default one by one (`turns_one_by_one`).
    /// `after_turn`: the caller's last call into this scheduler was a `turn` that gave `Some`
    /// (so a turn may skip what that one left done).
    fn turns_at(&mut self, step: u64, ends: &[u64], _after_turn: bool) -> Turned {
        turns_one_by_one(self, step, ends)
    }
    /// The earliest streak step whose tokens are not handed over yet (the caller may forget the
    /// shares of those before), if the scheduler has a streak.
    fn streak_floor(&self) -> Option<u64> {
        None
    }
    /// The turns ahead if nothing reaches the scheduler: the end of the step in flight, then
    /// of each step a quiet `turn` launches, at most `turns_max` turns (`Engine::coast_ends`).
    /// Empty where none is known to be quiet.
    fn coast_ends(&mut self, _turns_max: u32, ends: &mut Vec<u64>) {
        ends.clear();
    }
    /// Whether `coast_ends` can ever name a turn: false lets a world whose replicas never coast
    /// skip what coasting costs every event (the kernel's count of pending ticks).
    fn may_coast(&self) -> bool {
        false
    }
}

/// `Scheduler::turns_at` as the trait has it, for any scheduler: each turn taken by `turn`, one
/// by one, counted while it launches the step `ends` implies and reports what `Turned::report`
/// implies. A turn that does either otherwise is taken but not counted (the caller then finds
/// a turn that was not quiet).
pub fn turns_one_by_one<S: Scheduler + ?Sized>(s: &mut S, step: u64, ends: &[u64]) -> Turned {
    let mut turned = Turned::NONE;
    let mut step = step;
    for (i, tick) in ends.windows(2).enumerate() {
        let Some((report, d)) = s.turn(tick[0], step) else {
            break;
        };
        if (d.step, d.start_ns, d.end_ns) != (step + 1, tick[0], tick[1]) {
            break;
        }
        if i == 0 {
            turned.first = report;
        } else if i == 1 {
            turned.tokens_after = report.tokens;
        }
        turned.count = i + 1;
        if report != turned.report(i, ends) {
            turned.count = i;
            break;
        }
        step = d.step;
    }
    turned
}

/// Whether a request can ever fit a pool of `kv`: its prompt plus output in blocks. Returns the
/// request's total tokens.
pub fn fits(kv: &KvPool, r: &NewRequest) -> Result<u64, Rejection> {
    assert!(
        r.prompt_tokens > 0 && r.output_tokens > 0,
        "empty request {r:?}"
    );
    let total = r.prompt_tokens as u64 + r.output_tokens as u64;
    if kv.blocks_for(total) > kv.capacity_blocks() {
        return Err(Rejection::TooLongForKv);
    }
    Ok(total)
}

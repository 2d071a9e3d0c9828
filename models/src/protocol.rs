//! The protocol between the world and a replica's scheduler (the continuous engine or the
//! dynamic batcher): how a request is named, what an abort reaches, what a step produced, and
//! what left. Both schedulers speak it, so the world wires them alike.

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

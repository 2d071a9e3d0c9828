//! The world: wires the workload, the router, the replicas, the adapter's cancel path, the
//! ownership controller and the playback sink through one closed `Event` enum and one exhaustive
//! `match`.
//!
//! A scenario is run once as the counterfactual (no cancel intents at all) and once per policy,
//! all on the same seed, so every run sees the same workload (common random numbers). The
//! counterfactual leaves one small record per request, against which each policy run compares its
//! siblings.
//!
//! Per-request state lives in a slab only while the request is in the system. Results are folded
//! into histograms and running sums as requests leave.

use std::collections::BTreeMap;

use cancelsim_models::fxhash::FxHashMap;

use cancelsim_models::batcher::BatcherConfig;
use cancelsim_models::engine::{
    Abort, BlastRadius, Checkpoint, EngineConfig, Handle, NewRequest, Observed, Outcome,
    ReleaseMode, Released, Scope, StepOutput, UnknownAbort,
};
use cancelsim_models::gpu::{self, Profile, StepCost};
use cancelsim_models::ownership::{
    Admission, ClockDomain, Disposition, EvidenceLevel, Owners, Retention, State, Ticket,
    Timestamp, UpdateClass,
};
use cancelsim_models::replica::{Replica, ReplicaStats};

use crate::dist::{ms_to_ns, round_ns};
use crate::kernel::rng::{Purpose, Stream};
use crate::kernel::{Class, Kernel, LimitError, Traced, NS_PER_S};
use crate::metrics::*;
use crate::scenario::{
    AfterCompletion, CheckpointConfig, GroupScope, IdentityMode, Policy, ProfileRef, Radius,
    Release, Router, Scenario, Scheduler, Source, Stage,
};
use crate::workload::{self, Arrival, OpenLoop};

/// Why a request got a cancel intent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cause {
    Storm,
    Deadline,
    Disconnect,
    Interruption,
    /// The playback sink expired a held chunk, or gave up on a blocked one.
    Playback,
}

/// Every event of a run. Closed: adding a variant forces every `match` to say what it does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// The pending open-loop arrival (request `request`) enters.
    Arrival {
        request: u64,
    },
    ConversationStart {
        conv: u64,
    },
    TurnStart {
        conv: u64,
    },
    /// The user of `conv` barges in on generation `generation`.
    BargeIn {
        conv: u64,
        generation: u32,
    },
    /// Step `step` of `replica` ends; its outputs are processed.
    StepDone {
        replica: u32,
        step: u64,
    },
    /// The scheduler of `replica` checks for aborts, then composes and dispatches steps.
    SchedulePass {
        replica: u32,
    },
    BatcherTimer {
        replica: u32,
    },
    Deadline {
        request: u64,
        tag: u32,
    },
    Disconnect {
        request: u64,
        tag: u32,
    },
    /// A storm target reaches the moment of its cancel intent.
    Intent {
        request: u64,
        tag: u32,
    },
    /// The adapter submits cancel attempt `attempt`.
    CancelSubmit {
        request: u64,
        tag: u32,
        attempt: u8,
    },
    /// A cancel attempt reaches the backend of `replica`.
    CancelDeliver {
        request: u64,
        replica: u32,
        scope: Scope,
        attempt: u8,
    },
    CancelTimeout {
        request: u64,
        tag: u32,
        attempt: u8,
    },
    /// The backend's acknowledgement of an observed cancel reaches the adapter.
    CancelAck {
        request: u64,
        tag: u32,
    },
    /// The fallback bound of `PerRequestWithFallback` runs out.
    Fallback {
        request: u64,
        tag: u32,
    },
    /// A held chunk's writer wait is over: check its admission.
    ChunkAdmit {
        request: u64,
        tag: u32,
        born_ns: u64,
        epoch: u64,
        retry: u8,
    },
    /// A playback clear of `owner`'s sink is acknowledged.
    BarrierAck {
        owner: u64,
        epoch: u64,
    },
}

impl Traced for Event {
    fn kind_code(&self) -> u8 {
        match self {
            Event::Arrival { .. } => 1,
            Event::ConversationStart { .. } => 2,
            Event::TurnStart { .. } => 3,
            Event::BargeIn { .. } => 4,
            Event::StepDone { .. } => 5,
            Event::SchedulePass { .. } => 6,
            Event::BatcherTimer { .. } => 7,
            Event::Deadline { .. } => 8,
            Event::Disconnect { .. } => 9,
            Event::Intent { .. } => 10,
            Event::CancelSubmit { .. } => 11,
            Event::CancelDeliver { .. } => 12,
            Event::CancelTimeout { .. } => 13,
            Event::CancelAck { .. } => 14,
            Event::Fallback { .. } => 15,
            Event::ChunkAdmit { .. } => 16,
            Event::BarrierAck { .. } => 17,
        }
    }

    fn entity(&self) -> u64 {
        match *self {
            Event::Arrival { request } => request,
            Event::ConversationStart { conv } | Event::TurnStart { conv } => conv,
            Event::BargeIn { conv, generation } => (conv << 16) | generation as u64,
            Event::StepDone { replica, step } => ((replica as u64) << 48) | step,
            Event::SchedulePass { replica } | Event::BatcherTimer { replica } => replica as u64,
            Event::Deadline { request, .. }
            | Event::Disconnect { request, .. }
            | Event::Intent { request, .. }
            | Event::CancelSubmit { request, .. }
            | Event::CancelDeliver { request, .. }
            | Event::CancelTimeout { request, .. }
            | Event::CancelAck { request, .. }
            | Event::Fallback { request, .. }
            | Event::ChunkAdmit { request, .. } => request,
            Event::BarrierAck { owner, .. } => owner,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum RunError {
    Limit(LimitError),
    /// A trace could not be read mid-run (file:line: message).
    Input(String),
    /// A simulator invariant broke: a bug in cancelsim.
    Invariant {
        seed: u64,
        policy: String,
        event: u64,
        requests: Vec<u64>,
        what: String,
    },
}

impl std::fmt::Display for RunError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RunError::Limit(e) => e.fmt(f),
            RunError::Input(e) => f.write_str(e),
            RunError::Invariant { seed, policy, event, requests, what } => write!(
                f,
                "invariant violated (a cancelsim bug): {what}; seed {seed}, policy {policy}, event #{event}, requests {requests:?}"
            ),
        }
    }
}

impl std::error::Error for RunError {}

impl From<LimitError> for RunError {
    fn from(e: LimitError) -> Self {
        RunError::Limit(e)
    }
}

/// What the counterfactual run remembers of each request, to judge siblings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CfRecord {
    pub state: State,
    pub digest: u64,
    pub ttft_ns: u64,
    pub e2e_ns: u64,
}

/// Counterfactual records by request id: a dense vector for open-loop ids, a map otherwise.
#[derive(Default)]
pub struct CfTable {
    dense: Vec<Option<CfRecord>>,
    sparse: FxHashMap<u64, CfRecord>,
}

impl CfTable {
    const DENSE_MAX: u64 = 1 << 27;

    fn insert(&mut self, id: u64, r: CfRecord) {
        if id < Self::DENSE_MAX {
            let i = id as usize;
            if self.dense.len() <= i {
                self.dense.resize(i + 1, None);
            }
            self.dense[i] = Some(r);
        } else {
            self.sparse.insert(id, r);
        }
    }

    fn get(&self, id: u64) -> Option<CfRecord> {
        if id < Self::DENSE_MAX {
            self.dense.get(id as usize).copied().flatten()
        } else {
            self.sparse.get(&id).copied()
        }
    }
}

/// One sample of the system's gauges, on the virtual clock (summed over replicas).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct Sample {
    pub t_s: f64,
    pub kv_blocks: u64,
    /// Blocks held by requests with a cancel intent.
    pub kv_retained: u64,
    pub queue: u64,
    pub running: u64,
    /// Cancels whose backend has neither observed them nor released the request.
    pub cancels_in_flight: u64,
}

/// One request's record, as `requests.csv` writes it. Times are virtual milliseconds from the
/// start of the run; an empty cell is unknown, never zero.
#[derive(Clone, Debug, serde::Serialize)]
pub struct RequestRow {
    pub policy: String,
    pub id: u64,
    pub owner: u64,
    pub generation: u32,
    pub replica: u32,
    pub runtime_id: u64,
    pub disposition: &'static str,
    pub target: bool,
    pub sibling: bool,
    pub survived: Option<bool>,
    pub collateral: bool,
    pub output_tokens: u32,
    pub tokens_generated: u32,
    pub chunks_played: u32,
    pub arrival_ms: f64,
    pub ttft_ms: Option<f64>,
    pub e2e_ms: Option<f64>,
    pub intent_ms: Option<f64>,
    pub local_invalidation_ms: Option<f64>,
    pub cancel_submission_ms: Option<f64>,
    pub backend_observation_ms: Option<f64>,
    pub final_callback_ms: Option<f64>,
    pub resource_release_ms: Option<f64>,
    pub leaked_gpu_ms: f64,
    pub late_discards: u32,
    /// GPU time shared to this request (each step's time split by tokens), in ms.
    pub gpu_ms: f64,
    pub token_steps: u64,
    /// KV blocks held over time, in block-seconds.
    pub kv_block_s: f64,
}

/// Where a run streams its per-request rows (a CSV file, say). Rows arrive as requests leave.
pub trait RequestSink {
    fn row(&mut self, row: &RequestRow);
    /// Flush, and report any write error held back so far.
    fn finish(&mut self) -> Result<(), String> {
        Ok(())
    }
}

/// Chrome Trace Event records of one run: steps as slices per replica, requests as async tracks,
/// cancels as flows from intent to observation to release. Integer microseconds.
#[derive(Default)]
pub struct TraceLog {
    pub events: Vec<serde_json::Value>,
    /// Events dropped past `TRACE_EVENTS_MAX`.
    pub dropped: u64,
}

/// Trace events kept per run at most.
pub const TRACE_EVENTS_MAX: usize = 400_000;

/// What a run gives besides its summary, for files and plots.
#[derive(Default)]
pub struct Extras {
    pub timeseries: Vec<Sample>,
    /// (counterfactual TTFT, this run's TTFT) of siblings, in ms (the first `PAIRS_MAX`).
    pub sibling_ttft_ms: Vec<(f64, f64)>,
    /// Per evidence level, (latency ms, cumulative fraction) points of the cleanup-latency CDF.
    pub cleanup_cdf_ms: BTreeMap<String, Vec<(f64, f64)>>,
    pub trace: Option<TraceLog>,
    /// The request sink, handed back so the next run can continue writing to it.
    pub sink: Option<Box<dyn RequestSink>>,
}

/// Sibling pairs kept per run for plots, at most.
pub const PAIRS_MAX: usize = 50_000;
/// Time-series samples kept per run, at most (sampling stops there).
pub const SAMPLES_MAX: usize = 100_000;

/// Recording options of a run.
#[derive(Default)]
pub struct Recording {
    /// Sample the gauges every this many virtual ns (0: never).
    pub sample_ns: u64,
    pub sink: Option<Box<dyn RequestSink>>,
    pub trace: bool,
    /// Process id of this run in a shared trace.
    pub trace_pid: u32,
}

/// Deliberately broken variants, to show that `check --swarm` catches real bugs. Only the library
/// API sets them (tests); no scenario file or command-line flag can.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Hooks {
    pub controller_bug: Option<cancelsim_models::ownership::ControllerBug>,
    /// The adapter aborts the whole engine under the per-request policy.
    pub adapter_aborts_batch: bool,
}

/// The run's role.
#[derive(Clone, Copy)]
pub enum Mode<'a> {
    /// No cancel intents: the reference the siblings are compared with.
    Counterfactual,
    Policy(&'a Policy, &'a CfTable),
}

const NONE: u64 = u64::MAX;
/// Evidence levels whose latency from intent is reported.
const CLEANUP_LEVELS: [EvidenceLevel; 5] = [
    EvidenceLevel::LocalInvalidation,
    EvidenceLevel::CancelSubmission,
    EvidenceLevel::BackendObservation,
    EvidenceLevel::FinalCallback,
    EvidenceLevel::ResourceRelease,
];

/// A request in the system.
#[derive(Clone, Debug)]
struct Req {
    id: u64,
    live: bool,
    arrival_ns: u64,
    output: u32,
    replica: u32,
    owner: u64,
    generation: u32,
    handle: Handle,
    conv: Option<(u64, u32)>,
    enqueued: bool,
    started: bool,
    engine_released: bool,
    rejected: bool,
    first_token_ns: u64,
    last_token_ns: u64,
    tokens: u32,
    gpu_ns: f64,
    // Playback.
    chunk_fill: u32,
    chunks_made: u32,
    /// Chunks made but not yet held for admission (the sink writes a request's chunks in order).
    chunks_queued: u32,
    chunk_in_flight: bool,
    chunks_admitted: u32,
    first_corrupt_chunk: u32,
    digest: u64,
    corrupted_seen: bool,
    /// The request's playback draws (writer waits), in chunk order; made at its first chunk.
    playback_stream: Option<Box<Stream>>,
    /// Mirror of the controller's state being terminal, so a token need not look it up.
    terminal: bool,
    // Cancel path.
    plan: Option<(Stage, u64)>,
    intent_pending: bool,
    intent_ns: u64,
    attempts: u8,
    acked: bool,
    exhausted: bool,
    fallback: bool,
    observed_ns: u64,
    collateral: bool,
    sibling: bool,
    evidence_ns: [u64; 6],
    /// When the engine returned the request's blocks (whether or not it had an intent).
    released_ns: u64,
    /// The replica's intent epoch when the request reached it.
    epoch_at_enqueue: u64,
    leak_pre_ns: f64,
    leak_post_ns: f64,
    late_tokens: u32,
    /// Counted in `cancels_in_flight` (an intent the backend has not acted on yet).
    cancel_in_flight: bool,
    /// Tokens this request had in steps (prefill chunks and decode slots, discarded ones too).
    token_steps: u64,
    kv_block_ns: u128,
}

/// A conversation in progress.
struct Conv {
    turns: u32,
    turn: u32,
    outstanding: u32,
    /// (request id, tag) of the current turn's requests.
    members: Vec<(u64, u32)>,
    /// Cancel intents of this owner's requests so far: its own requests are then its group, not
    /// siblings (a sibling belongs to another owner).
    intents: u32,
}

enum ReplicaConfig {
    Continuous(EngineConfig),
    Dynamic(BatcherConfig),
}

fn radius(r: Radius) -> BlastRadius {
    match r {
        Radius::Request => BlastRadius::Request,
        Radius::Batch => BlastRadius::Batch,
        Radius::Engine => BlastRadius::Engine,
    }
}

fn replica_config(s: &Scenario) -> ReplicaConfig {
    let (cost, kv_blocks_16, profile): (StepCost, u64, Option<Profile>) = match &s.cluster.profile {
        ProfileRef::Named(name) => {
            let p = gpu::profile(name).expect("validated profile name");
            (p.cost, p.kv_blocks_16, Some(p))
        }
        ProfileRef::Custom {
            c0_ms,
            prefill_tokens_per_s,
            per_seq_us,
            per_kv_token_ns,
            kv_blocks_16,
        } => (
            StepCost {
                c0_ns: ms_to_ns(*c0_ms),
                prefill_tokens_per_s: prefill_tokens_per_s.round() as u64,
                per_seq_ns: (per_seq_us * 1e3).round() as u64,
                per_kv_token_ps: (per_kv_token_ns * 1e3).round() as u64,
            },
            *kv_blocks_16,
            None,
        ),
    };
    let blocks = |block_tokens: u32, explicit: Option<u64>| {
        explicit.unwrap_or_else(|| (kv_blocks_16 * 16 / block_tokens as u64).max(1))
    };
    let b = &s.backend;
    match &s.cluster.scheduler {
        Scheduler::Continuous {
            max_num_seqs,
            max_num_batched_tokens,
            chunked_prefill,
            block_tokens,
            kv_blocks,
            window,
        } => ReplicaConfig::Continuous(EngineConfig {
            max_num_seqs: max_num_seqs
                .or(profile.map(|p| p.max_num_seqs))
                .unwrap_or(256),
            max_num_batched_tokens: max_num_batched_tokens
                .or(profile.map(|p| p.max_num_batched_tokens))
                .unwrap_or(2048),
            chunked_prefill: *chunked_prefill,
            block_tokens: *block_tokens,
            kv_blocks: blocks(*block_tokens, *kv_blocks),
            window: *window,
            cost,
            checkpoint: match b.checkpoint {
                CheckpointConfig::EveryStep => Checkpoint::EveryPasses(1),
                CheckpointConfig::EveryKSteps(k) => Checkpoint::EveryPasses(k),
                CheckpointConfig::Never => Checkpoint::Never,
            },
            release: match b.release {
                Release::Fenced => ReleaseMode::Fenced,
                Release::Immediate => ReleaseMode::Immediate,
            },
            unknown_abort: match b.cancel_after_completion {
                AfterCompletion::Ignore => UnknownAbort::Ignore,
                AfterCompletion::Fault(r) => UnknownAbort::Fault(radius(r)),
            },
            tombstones: s.adapter.identity == IdentityMode::ServerGenerated,
        }),
        Scheduler::Dynamic {
            max_batch_size,
            max_queue_delay_ms,
            block_tokens,
            kv_blocks,
        } => ReplicaConfig::Dynamic(BatcherConfig {
            max_batch_size: *max_batch_size,
            max_queue_delay_ns: ms_to_ns(*max_queue_delay_ms),
            block_tokens: *block_tokens,
            kv_blocks: blocks(*block_tokens, *kv_blocks),
            cost,
        }),
    }
}

/// The synthetic payload marker of chunk `chunk` of request `id`: 16 bytes a consumer can check
/// byte for byte. A corrupted chunk (KV reused while still written) has its check word flipped.
fn marker(id: u64, chunk: u32, corrupted: bool) -> [u8; 16] {
    let mut m = [0u8; 16];
    m[..8].copy_from_slice(&id.to_le_bytes());
    m[8..12].copy_from_slice(&chunk.to_le_bytes());
    let check = check_word(id, chunk);
    m[12..16].copy_from_slice(&(if corrupted { !check } else { check }).to_le_bytes());
    m
}

fn check_word(id: u64, chunk: u32) -> u32 {
    let x = (id ^ ((chunk as u64) << 32)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (x >> 32) as u32
}

/// FNV-1a over bytes, folded into a running digest (a request's delivered output).
fn fold_digest(mut h: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

const DIGEST_SEED: u64 = 0xcbf2_9ce4_8422_2325;

/// One run of one scenario in one mode.
pub struct World<'s> {
    scenario: &'s Scenario,
    seed: u64,
    mode: Mode<'s>,
    policy_label: String,
    kernel: Kernel<Event>,
    replicas: Vec<Replica>,
    pass_pending: Vec<bool>,
    timer_at: Vec<Option<u64>>,
    rr_next: u32,
    open: Option<OpenLoop>,
    pending: Option<Arrival>,
    conv_starts: Stream,
    convs: FxHashMap<u64, Conv>,
    conv_started: u64,
    owners: Owners<u64>,
    reqs: Vec<Req>,
    free_tags: Vec<u32>,
    outputs: Vec<StepOutput>,
    released: Vec<Released>,
    observed: Vec<Observed>,
    started: Vec<u32>,
    workload_hasher: blake3::Hasher,
    /// Every request's outcome `(id, state, output digest, tokens, chunks played)` in the order
    /// requests leave: folded into the run hash, so two runs whose events coincide but whose
    /// outcomes differ (a killed sibling under a flat step cost) never share a hash.
    outcome_hasher: blake3::Hasher,
    counts: RequestCounts,
    events: WorkloadEvents,
    playback: Playback,
    rpc: CancelRpc,
    in_system: u64,
    area_in_system: u128,
    sojourn_sum_ns: u128,
    sojourn_count: u64,
    last_change_ns: u64,
    ttft: LatencyStats,
    tpot: LatencyStats,
    e2e: LatencyStats,
    token_steps: u64,
    gpu_ns_requests: f64,
    gpu_ns_discarded: f64,
    gpu_ns_padding: f64,
    kv_block_ns: u128,
    kv_block_ns_retained: u128,
    last_completion_ns: u64,
    leaked: LeakedWork,
    late_output_discards: u64,
    late_outputs_admitted: u64,
    siblings: u64,
    survived: u64,
    ttft_deltas: Vec<i64>,
    e2e_deltas: Vec<i64>,
    cleanup: Vec<LatencyStats>,
    cleanup_unknown: [u64; 5],
    cf_out: Option<&'s mut CfTable>,
    coverage: BTreeMap<&'static str, u64>,
    targets: Targets,
    /// Test-only deliberate bugs (see `Hooks`).
    hooks: Hooks,
    recording: Recording,
    extras: Extras,
    next_sample_ns: u64,
    cancels_in_flight: u64,
    /// Flows drawn so far: flow ids are global in a trace, so each is `pid << 32 | counter`.
    flows: u32,
    /// Cancel intents so far per replica: a request that sees this move while it is on the
    /// replica shared its engine with a cancelled request (a sibling).
    intent_epoch: Vec<u64>,
    clock_offset_ns: u64,
    zero_writer_wait: bool,
}

impl<'s> World<'s> {
    pub fn new(
        scenario: &'s Scenario,
        seed: u64,
        mode: Mode<'s>,
        cf_out: Option<&'s mut CfTable>,
    ) -> Result<Self, RunError> {
        debug_assert!(scenario.validate().is_ok());
        let n = scenario.cluster.replicas as usize;
        let replicas = (0..n)
            .map(|_| match replica_config(scenario) {
                ReplicaConfig::Continuous(c) => Replica::continuous(c),
                ReplicaConfig::Dynamic(c) => Replica::dynamic(c),
            })
            .collect();
        let policy_label = match mode {
            Mode::Counterfactual => "counterfactual".to_string(),
            Mode::Policy(p, _) => p.label(),
        };
        Ok(World {
            scenario,
            seed,
            mode,
            policy_label,
            kernel: Kernel::new(scenario.limits()),
            replicas,
            pass_pending: vec![false; n],
            timer_at: vec![None; n],
            rr_next: 0,
            open: OpenLoop::new(scenario, seed).map_err(RunError::Input)?,
            pending: None,
            conv_starts: Stream::new(seed, Purpose::Arrival, 1),
            convs: FxHashMap::default(),
            conv_started: 0,
            // Request ids are unique by construction and the world ignores events for requests it
            // has finalized, so a small retention serves; memory stays with requests in flight.
            owners: Owners::new(Retention {
                tombstones_max: 4096,
                tombstone_age_ns_max: None,
                evicted_max: 4096,
            }),
            reqs: Vec::new(),
            free_tags: Vec::new(),
            outputs: Vec::new(),
            released: Vec::new(),
            observed: Vec::new(),
            started: Vec::new(),
            workload_hasher: blake3::Hasher::new(),
            outcome_hasher: blake3::Hasher::new(),
            counts: RequestCounts::default(),
            events: WorkloadEvents::default(),
            playback: Playback::default(),
            rpc: CancelRpc::default(),
            in_system: 0,
            area_in_system: 0,
            sojourn_sum_ns: 0,
            sojourn_count: 0,
            last_change_ns: 0,
            ttft: LatencyStats::new(),
            tpot: LatencyStats::new(),
            e2e: LatencyStats::new(),
            token_steps: 0,
            gpu_ns_requests: 0.0,
            gpu_ns_discarded: 0.0,
            gpu_ns_padding: 0.0,
            kv_block_ns: 0,
            kv_block_ns_retained: 0,
            last_completion_ns: 0,
            leaked: LeakedWork::default(),
            late_output_discards: 0,
            late_outputs_admitted: 0,
            siblings: 0,
            survived: 0,
            ttft_deltas: Vec::new(),
            e2e_deltas: Vec::new(),
            cleanup: (0..CLEANUP_LEVELS.len())
                .map(|_| LatencyStats::new())
                .collect(),
            cleanup_unknown: [0; 5],
            cf_out,
            intent_epoch: vec![0; n],
            coverage: BTreeMap::new(),
            targets: Targets::default(),
            hooks: Hooks::default(),
            recording: Recording::default(),
            extras: Extras::default(),
            next_sample_ns: 0,
            cancels_in_flight: 0,
            flows: 0,
            clock_offset_ns: ms_to_ns(scenario.backend.clock_offset_ms),
            zero_writer_wait: scenario.playback.writer_wait_ms == crate::dist::Dist::Constant(0.0),
        })
    }

    /// Turn on deliberately broken variants (tests of the checker only).
    pub fn with_hooks(mut self, hooks: Hooks) -> Self {
        self.hooks = hooks;
        self.owners.set_bug(hooks.controller_bug);
        self
    }

    /// Record samples, rows or a trace while running.
    pub fn with_recording(mut self, r: Recording) -> Self {
        if r.trace {
            self.extras.trace = Some(TraceLog::default());
        }
        self.recording = r;
        self
    }

    fn trace(&mut self, ev: serde_json::Value) {
        if let Some(t) = &mut self.extras.trace {
            if t.events.len() < TRACE_EVENTS_MAX {
                t.events.push(ev);
            } else {
                t.dropped += 1;
            }
        }
    }

    /// Samples of the gauges at every boundary before `now_ns`: the state between events, so
    /// sampling adds no event and cannot change a run.
    fn sample_until(&mut self, now_ns: u64) {
        let step = self.recording.sample_ns;
        if step == 0 {
            return;
        }
        while self.next_sample_ns < now_ns && self.extras.timeseries.len() < SAMPLES_MAX {
            let mut s = Sample {
                t_s: self.next_sample_ns as f64 / NS_PER_S as f64,
                kv_blocks: 0,
                kv_retained: 0,
                queue: 0,
                running: 0,
                cancels_in_flight: self.cancels_in_flight,
            };
            for r in &self.replicas {
                let (q, run, kv, kept) = r.gauges();
                s.queue += q;
                s.running += run;
                s.kv_blocks += kv;
                s.kv_retained += kept;
            }
            self.extras.timeseries.push(s);
            self.next_sample_ns += step;
        }
    }

    /// Count a rare path.
    fn mark(&mut self, m: &'static str) {
        *self.coverage.entry(m).or_insert(0) += 1;
    }

    fn policy(&self) -> Option<&'s Policy> {
        match self.mode {
            Mode::Counterfactual => None,
            Mode::Policy(p, _) => Some(p),
        }
    }

    /// Run to completion and summarise.
    pub fn run(self) -> Result<Summary, RunError> {
        self.run_recorded().map(|(s, _)| s)
    }

    /// Run to completion; the summary and what was recorded.
    pub fn run_recorded(mut self) -> Result<(Summary, Extras), RunError> {
        if self.open.is_some() {
            self.pull_arrival()?;
        } else {
            self.kernel
                .schedule_at(0, Class::Arrival, Event::ConversationStart { conv: 0 })?;
        }
        while let Some(event) = self.kernel.next_event()? {
            self.sample_until(self.kernel.now_ns());
            self.dispatch(event)?;
        }
        let now = self.kernel.now_ns();
        self.sample_until(now.saturating_add(1));
        self.finish()
    }

    fn violation(&self, requests: Vec<u64>, what: impl Into<String>) -> RunError {
        RunError::Invariant {
            seed: self.seed,
            policy: self.policy_label.clone(),
            event: self.kernel.events_dispatched(),
            requests,
            what: what.into(),
        }
    }

    fn pull_arrival(&mut self) -> Result<(), RunError> {
        let open = self.open.as_mut().expect("open-loop source");
        if let Some(a) = open
            .next(&self.scenario.workload)
            .map_err(RunError::Input)?
        {
            self.pending = Some(a);
            self.kernel
                .schedule_at(a.time_ns, Class::Arrival, Event::Arrival { request: a.id })?;
        }
        Ok(())
    }

    /// The live request behind `(id, tag)`, if that request is still here.
    fn live(&self, id: u64, tag: u32) -> bool {
        self.reqs
            .get(tag as usize)
            .is_some_and(|q| q.live && q.id == id)
    }

    fn dispatch(&mut self, event: Event) -> Result<(), RunError> {
        let now_ns = self.kernel.now_ns();
        match event {
            Event::Arrival { request } => {
                let a = self.pending.take().expect("an arrival is pending");
                debug_assert_eq!(a.id, request);
                self.arrive(a, None)?;
                self.pull_arrival()?;
            }
            Event::ConversationStart { conv } => {
                let Source::Conversations {
                    conversations,
                    start_rate_per_s,
                    ..
                } = &self.scenario.workload.source
                else {
                    unreachable!("conversation events need a conversation source")
                };
                self.events.conversations += 1;
                self.conv_started += 1;
                if self.conv_started < *conversations {
                    let gap = self
                        .conv_starts
                        .exponential(NS_PER_S as f64 / start_rate_per_s);
                    self.kernel.schedule_in(
                        round_ns(gap),
                        Class::Arrival,
                        Event::ConversationStart { conv: conv + 1 },
                    )?;
                }
                let turns = workload::conversation_turns(&self.scenario.workload, self.seed, conv);
                if turns > 0 {
                    self.convs.insert(
                        conv,
                        Conv {
                            turns,
                            turn: 0,
                            outstanding: 0,
                            members: Vec::new(),
                            intents: 0,
                        },
                    );
                    self.kernel
                        .schedule_at(now_ns, Class::Arrival, Event::TurnStart { conv })?;
                }
            }
            Event::TurnStart { conv } => {
                let Source::Conversations {
                    requests_per_turn, ..
                } = &self.scenario.workload.source
                else {
                    unreachable!("conversation events need a conversation source")
                };
                let per_turn = *requests_per_turn;
                let turn = self.convs[&conv].turn;
                self.events.turns += 1;
                let draws = workload::turn_draws(&self.scenario.workload, self.seed, conv, turn);
                if let (Some(after), Some(_)) = (draws.barge_in_after_ns, self.policy()) {
                    self.kernel.schedule_in(
                        after,
                        Class::Control,
                        Event::BargeIn {
                            conv,
                            generation: turn,
                        },
                    )?;
                }
                let c = self.convs.get_mut(&conv).expect("live conversation");
                c.outstanding = per_turn;
                c.members.clear();
                for k in 0..per_turn {
                    let id = workload::conversation_request_id(conv, turn, k);
                    let (p, o) = workload::shape(&self.scenario.workload, self.seed, id);
                    let a = Arrival {
                        id,
                        time_ns: now_ns,
                        prompt_tokens: p,
                        output_tokens: o,
                    };
                    self.arrive(a, Some((conv, turn)))?;
                }
            }
            Event::BargeIn { conv, generation } => {
                let Some(c) = self.convs.get_mut(&conv) else {
                    return Ok(());
                };
                if c.turn == generation && c.outstanding > 0 {
                    // The interruption: generation `generation` of owner `conv` is superseded.
                    self.events.interruptions += 1;
                    self.events.superseded_requests += c.outstanding as u64;
                    c.outstanding = 0;
                    let members = std::mem::take(&mut c.members);
                    // Playback: a clear operation starts on the owner's sink.
                    let owner = conv;
                    let epoch = self.owners.barrier_advance_on(owner + 1);
                    self.owners.set_clear_on(owner + 1, false);
                    let mut s = Stream::keyed(self.seed, Purpose::Playback, owner, epoch);
                    let ack = ms_to_ns(self.scenario.playback.clear_ack_ms.sample(&mut s));
                    self.kernel.schedule_in(
                        ack,
                        Class::Control,
                        Event::BarrierAck { owner, epoch },
                    )?;
                    for (id, tag) in members {
                        if self.live(id, tag) {
                            self.intent(tag, Cause::Interruption)?;
                        }
                    }
                    self.next_turn(conv, 0)?;
                }
            }
            Event::StepDone { replica, step } => self.step_done(replica, step)?,
            Event::SchedulePass { replica } => self.schedule_pass(replica)?,
            Event::BatcherTimer { replica } => {
                // A stale timer (the batch formed earlier) costs one empty pass.
                let r = replica as usize;
                if self.timer_at[r].is_some_and(|t| t <= now_ns) {
                    self.timer_at[r] = None;
                }
                self.request_pass(replica)?;
            }
            Event::Deadline { request, tag } => {
                if self.live(request, tag) && !self.is_done(tag) {
                    self.events.deadlines_missed += 1;
                    self.intent(tag, Cause::Deadline)?;
                }
            }
            Event::Disconnect { request, tag } => {
                if self.live(request, tag) && !self.is_done(tag) {
                    self.events.disconnects += 1;
                    self.intent(tag, Cause::Disconnect)?;
                }
            }
            Event::Intent { request, tag } => {
                if self.live(request, tag) {
                    self.reqs[tag as usize].intent_pending = false;
                    self.intent(tag, Cause::Storm)?;
                    self.try_finalize(tag)?;
                }
            }
            Event::CancelSubmit {
                request,
                tag,
                attempt,
            } => self.cancel_submit(request, tag, attempt)?,
            Event::CancelDeliver {
                request,
                replica,
                scope,
                attempt,
            } => {
                let p = self.scenario.backend.abort_fault_probability;
                let fault = (p > 0.0
                    && Stream::keyed(self.seed, Purpose::AbortFault, request, attempt as u64 + 1)
                        .uniform_open01()
                        < p)
                    .then(|| radius(self.scenario.backend.abort_fault_radius));
                self.mark(match scope {
                    Scope::Request(_) => "scope.request",
                    Scope::Stream(_) => "scope.stream",
                    Scope::Sequence(_) => "scope.sequence",
                    Scope::Prefix(_) => "scope.prefix",
                    Scope::Engine => "scope.engine",
                });
                self.replicas[replica as usize].abort(Abort { scope, fault });
                self.request_pass(replica)?;
            }
            Event::CancelTimeout {
                request,
                tag,
                attempt,
            } => {
                if !self.live(request, tag) {
                    return Ok(());
                }
                let q = &self.reqs[tag as usize];
                if q.acked || q.exhausted || q.fallback || q.attempts != attempt + 1 {
                    return Ok(());
                }
                if (q.attempts as u32) < self.scenario.adapter.max_attempts {
                    self.kernel.schedule_in(
                        0,
                        Class::Control,
                        Event::CancelSubmit {
                            request,
                            tag,
                            attempt: attempt + 1,
                        },
                    )?;
                } else {
                    self.reqs[tag as usize].exhausted = true;
                    self.rpc.budget_exhausted += 1;
                    if matches!(self.policy(), Some(Policy::PerRequestWithFallback { .. })) {
                        self.reqs[tag as usize].fallback = true;
                        self.rpc.fallbacks += 1;
                    }
                    self.try_finalize(tag)?;
                }
            }
            Event::CancelAck { request, tag } => {
                if !self.live(request, tag) {
                    self.rpc.late_callbacks += 1;
                    return Ok(());
                }
                let q = &mut self.reqs[tag as usize];
                if q.exhausted || q.fallback {
                    // After the retry budget: late evidence, never reopening anything.
                    self.rpc.late_callbacks += 1;
                } else if !q.acked {
                    q.acked = true;
                    self.rpc.acks += 1;
                    self.evidence(tag, EvidenceLevel::FinalCallback, ClockDomain::Local)?;
                }
                self.try_finalize(tag)?;
            }
            Event::Fallback { request, tag } => {
                if self.live(request, tag) {
                    let q = &mut self.reqs[tag as usize];
                    if q.observed_ns == NONE && !q.acked && !q.fallback {
                        q.fallback = true;
                        self.rpc.fallbacks += 1;
                        self.try_finalize(tag)?;
                    }
                }
            }
            Event::ChunkAdmit {
                request,
                tag,
                born_ns,
                epoch,
                retry,
            } => {
                if self.live(request, tag) {
                    let q = &self.reqs[tag as usize];
                    let ticket = Ticket {
                        request,
                        generation: q.generation as i128,
                        born: born_ns as f64,
                        max_age: self.scenario.playback.max_age_ms * 1e6,
                        barrier: q.owner + 1,
                        epoch,
                    };
                    self.admit_chunk(tag, ticket, retry)?;
                }
            }
            Event::BarrierAck { owner, epoch } => {
                if self.owners.barrier_state(owner + 1).0 == epoch {
                    self.owners.set_clear_on(owner + 1, true);
                }
            }
        }
        Ok(())
    }

    fn is_done(&self, tag: u32) -> bool {
        let q = &self.reqs[tag as usize];
        self.owners.state(&q.id).is_none_or(State::is_terminal) || q.tokens == q.output
    }

    /// A request arrives: start it in the controller, maybe plan its cancel, route and enqueue it.
    fn arrive(&mut self, a: Arrival, conv: Option<(u64, u32)>) -> Result<(), RunError> {
        let now_ns = self.kernel.now_ns();
        self.workload_hasher.update(&a.id.to_le_bytes());
        self.workload_hasher.update(&a.time_ns.to_le_bytes());
        self.workload_hasher.update(&a.prompt_tokens.to_le_bytes());
        self.workload_hasher.update(&a.output_tokens.to_le_bytes());
        self.counts.scheduled += 1;
        let (owner, generation) = match conv {
            Some((c, g)) => (c, g),
            None => (a.id, 0),
        };
        let adapter = &self.scenario.adapter;
        let runtime_id = match adapter.identity {
            IdentityMode::ServerGenerated => a.id.wrapping_add(1),
            IdentityMode::ClientReused { pool } => a.id % pool + 1,
        };
        let handle = Handle {
            runtime_id,
            stream: if adapter.streams == 0 {
                owner
            } else {
                owner % adapter.streams
            },
            sequence: owner,
        };
        let replica = self.route();
        let plan = match (&self.scenario.cancellation, self.policy()) {
            (Some(c), Some(_)) => {
                let mut s = Stream::new(self.seed, Purpose::CancelPlan, a.id);
                let draw = s.uniform_open01();
                let hit = if c.requests.is_empty() {
                    draw < c.fraction
                } else {
                    c.requests.contains(&a.id)
                };
                let pick = s.below(Stage::LIFECYCLE.len() as u64);
                let delay = ms_to_ns(c.delay_ms.sample(&mut s));
                hit.then(|| {
                    let stage = match c.stage {
                        Stage::Random => Stage::LIFECYCLE[pick as usize],
                        s => s,
                    };
                    (stage, delay)
                })
            }
            _ => None,
        };
        if plan.is_some() {
            self.events.storm_targets += 1;
        }
        let req = Req {
            id: a.id,
            live: true,
            arrival_ns: now_ns,
            output: a.output_tokens,
            replica,
            owner,
            generation,
            handle,
            conv,
            enqueued: false,
            started: false,
            engine_released: false,
            rejected: false,
            first_token_ns: 0,
            last_token_ns: 0,
            tokens: 0,
            gpu_ns: 0.0,
            chunk_fill: 0,
            chunks_made: 0,
            chunks_queued: 0,
            chunk_in_flight: false,
            chunks_admitted: 0,
            first_corrupt_chunk: u32::MAX,
            digest: DIGEST_SEED,
            corrupted_seen: false,
            playback_stream: None,
            terminal: false,
            plan,
            intent_pending: false,
            intent_ns: NONE,
            attempts: 0,
            acked: false,
            exhausted: false,
            fallback: false,
            observed_ns: NONE,
            collateral: false,
            sibling: false,
            evidence_ns: [NONE; 6],
            released_ns: NONE,
            epoch_at_enqueue: 0,
            leak_pre_ns: 0.0,
            leak_post_ns: 0.0,
            late_tokens: 0,
            cancel_in_flight: false,
            token_steps: 0,
            kv_block_ns: 0,
        };
        let tag = match self.free_tags.pop() {
            Some(t) => {
                self.reqs[t as usize] = req;
                t
            }
            None => {
                self.reqs.push(req);
                (self.reqs.len() - 1) as u32
            }
        };
        if let Some((c, _)) = conv {
            if let Some(cv) = self.convs.get_mut(&c) {
                cv.members.push((a.id, tag));
            }
        }
        self.integrate(now_ns);
        self.in_system += 1;
        if self.owners.start(a.id, generation as u64).is_err() {
            return Err(self.violation(vec![a.id], "a request identity was reused"));
        }
        match plan {
            Some((Stage::BeforeAdmission, _)) => {
                // Cancelled before it reaches a replica: nothing to clean up on a backend.
                self.intent(tag, Cause::Storm)?;
                if let Some((c, g)) = conv {
                    self.turn_request_done(c, g)?;
                }
                return self.try_finalize(tag);
            }
            Some((Stage::AfterArrival, delay)) => self.plan_intent(tag, delay)?,
            _ => {}
        }
        let new = NewRequest {
            id: a.id,
            tag,
            handle,
            prompt_tokens: a.prompt_tokens,
            output_tokens: a.output_tokens,
        };
        if self.replicas[replica as usize]
            .enqueue(now_ns, new)
            .is_err()
        {
            let q = &mut self.reqs[tag as usize];
            q.rejected = true;
            q.engine_released = true;
            self.owners
                .finish(&a.id, Disposition::Cancelled)
                .map_err(|e| self.violation(vec![a.id], e.to_string()))?;
            self.reqs[tag as usize].terminal = true;
            if let Some((c, g)) = conv {
                self.turn_request_done(c, g)?;
            }
            return self.try_finalize(tag);
        }
        self.reqs[tag as usize].enqueued = true;
        self.reqs[tag as usize].epoch_at_enqueue = self.intent_epoch[replica as usize];
        self.counts.admitted += 1;
        if let Some(p) = self.policy() {
            let _ = p;
            let (deadline, disconnect) = workload::timing(&self.scenario.workload, self.seed, a.id);
            if let Some(d) = deadline {
                self.kernel.schedule_in(
                    d,
                    Class::Control,
                    Event::Deadline { request: a.id, tag },
                )?;
            }
            if let Some(d) = disconnect {
                self.kernel.schedule_in(
                    d,
                    Class::Control,
                    Event::Disconnect { request: a.id, tag },
                )?;
            }
        }
        if let Some((Stage::Queued, delay)) = plan {
            self.plan_intent(tag, delay)?;
        }
        self.request_pass(replica)
    }

    /// Schedule a storm target's intent `delay_ns` from now.
    fn plan_intent(&mut self, tag: u32, delay_ns: u64) -> Result<(), RunError> {
        let q = &mut self.reqs[tag as usize];
        if q.intent_pending || q.intent_ns != NONE {
            return Ok(());
        }
        q.intent_pending = true;
        let id = q.id;
        self.kernel
            .schedule_in(delay_ns, Class::Control, Event::Intent { request: id, tag })?;
        Ok(())
    }

    /// If the request's storm stage is `stage`, its intent is planned now.
    fn stage_reached(&mut self, tag: u32, stage: Stage) -> Result<(), RunError> {
        if let Some((s, delay)) = self.reqs[tag as usize].plan {
            if s == stage {
                self.plan_intent(tag, delay)?;
            }
        }
        Ok(())
    }

    /// A cancel intent: the controller makes the request terminal at once (local invalidation);
    /// then the adapter acts by policy.
    fn intent(&mut self, tag: u32, cause: Cause) -> Result<(), RunError> {
        let now_ns = self.kernel.now_ns();
        let q = &self.reqs[tag as usize];
        if q.intent_ns != NONE {
            return Ok(()); // one intent per request: the first
        }
        let id = q.id;
        let (tokens, output, plan, conv) = (q.tokens, q.output, q.plan, q.conv);
        if let Some(c) = conv.and_then(|(c, _)| self.convs.get_mut(&c)) {
            c.intents += 1;
        }
        self.reqs[tag as usize].intent_ns = now_ns;
        self.rpc.intents += 1;
        if cause == Cause::Storm {
            if let Some((stage, _)) = plan {
                self.mark(match stage {
                    Stage::BeforeAdmission => "stage.before_admission",
                    Stage::Queued => "stage.queued",
                    Stage::Prefill => "stage.prefill",
                    Stage::Decode => "stage.decode",
                    Stage::AfterFinalOutput => "stage.after_final_output",
                    Stage::AfterCompletion => "stage.after_completion",
                    Stage::AfterArrival | Stage::Random => "stage.after_arrival",
                });
            }
        }
        if self.owners.state(&id) == Some(State::Completed) {
            self.mark("race.completion_won");
        } else if tokens == output && output > 0 {
            self.mark("race.cancel_won");
        }
        self.evidence(tag, EvidenceLevel::Intent, ClockDomain::Local)?;
        let disposition = match cause {
            Cause::Deadline | Cause::Playback => Disposition::Expired,
            Cause::Storm | Cause::Disconnect | Cause::Interruption => Disposition::Cancelled,
        };
        let before = self.owners.state(&id);
        let after = self
            .owners
            .finish(&id, disposition)
            .map_err(|e| self.violation(vec![id], e.to_string()))?;
        self.reqs[tag as usize].terminal = true;
        if let (Some(b), Some(a)) = (before, after) {
            if b.is_terminal() && a != b {
                return Err(self.violation(vec![id], "a terminal disposition changed"));
            }
        }
        // The sink expires a request itself (the controller did it in admit_end): that is this
        // intent's local invalidation too.
        let invalidated_now = before == Some(State::Running) || cause == Cause::Playback;
        if invalidated_now && after.is_some_and(State::is_terminal) {
            self.evidence(tag, EvidenceLevel::LocalInvalidation, ClockDomain::Local)?;
        }
        let q = &self.reqs[tag as usize];
        let (enqueued, released, replica) = (q.enqueued, q.engine_released, q.replica);
        if enqueued && !released {
            self.intent_epoch[replica as usize] += 1;
            self.replicas[replica as usize].mark_intent(now_ns, tag);
        }
        let Some(policy) = self.policy() else {
            return Ok(());
        };
        if !enqueued {
            return Ok(()); // never reached a backend
        }
        match policy {
            Policy::FinishAndDiscard => {}
            Policy::PerRequest | Policy::GroupAbort(_) | Policy::PerRequestWithFallback { .. } => {
                if !released {
                    self.reqs[tag as usize].cancel_in_flight = true;
                    self.cancels_in_flight += 1;
                }
                let mut s = Stream::keyed(self.seed, Purpose::CancelRpc, id, 1 << 20);
                let delay = ms_to_ns(self.scenario.adapter.submit_delay_ms.sample(&mut s));
                self.kernel.schedule_in(
                    delay,
                    Class::Control,
                    Event::CancelSubmit {
                        request: id,
                        tag,
                        attempt: 0,
                    },
                )?;
                if let Policy::PerRequestWithFallback { fallback_after_ms } = policy {
                    self.kernel.schedule_in(
                        ms_to_ns(*fallback_after_ms),
                        Class::Control,
                        Event::Fallback { request: id, tag },
                    )?;
                }
            }
        }
        Ok(())
    }

    fn cancel_submit(&mut self, request: u64, tag: u32, attempt: u8) -> Result<(), RunError> {
        if !self.live(request, tag) {
            return Ok(());
        }
        let q = &self.reqs[tag as usize];
        if q.acked || q.exhausted || q.fallback {
            return Ok(());
        }
        let policy = self.policy().expect("cancels only in policy runs");
        if attempt == 0 {
            self.evidence(tag, EvidenceLevel::CancelSubmission, ClockDomain::Local)?;
            if matches!(policy, Policy::PerRequestWithFallback { .. })
                && self.scenario.backend.checkpoint == CheckpointConfig::Never
            {
                // The backend cannot observe: fall back to finish-and-discard, and never touch
                // the abort path.
                self.reqs[tag as usize].fallback = true;
                self.rpc.fallbacks += 1;
                return self.try_finalize(tag);
            }
        }
        let q = &self.reqs[tag as usize];
        let scope = match policy {
            Policy::GroupAbort(GroupScope::Stream) => Scope::Stream(q.handle.stream),
            Policy::GroupAbort(GroupScope::Sequence) => Scope::Sequence(q.handle.sequence),
            Policy::GroupAbort(GroupScope::Prefix) => Scope::Prefix(q.handle.runtime_id),
            Policy::GroupAbort(GroupScope::Engine) => Scope::Engine,
            // The deliberately broken adapter: "per-request" through the engine's handle.
            _ if self.hooks.adapter_aborts_batch => Scope::Engine,
            _ => Scope::Request(q.handle.runtime_id),
        };
        let replica = q.replica;
        self.reqs[tag as usize].attempts = attempt + 1;
        self.rpc.attempts += 1;
        let a = &self.scenario.adapter;
        let mut s = Stream::keyed(self.seed, Purpose::CancelRpc, request, attempt as u64 + 1);
        let lost = s.uniform_open01() < a.loss;
        let latency = ms_to_ns(a.rpc_latency_ms.sample(&mut s));
        let dup = s.uniform_open01() < a.duplicate;
        let dup_latency = ms_to_ns(a.rpc_latency_ms.sample(&mut s));
        if lost {
            self.rpc.lost += 1;
        } else {
            let deliver = Event::CancelDeliver {
                request,
                replica,
                scope,
                attempt,
            };
            self.kernel.schedule_in(latency, Class::Control, deliver)?;
            if dup {
                // The same attempt delivered twice: the backend must treat it idempotently.
                self.rpc.duplicates += 1;
                self.kernel
                    .schedule_in(dup_latency, Class::Control, deliver)?;
            }
        }
        self.kernel.schedule_in(
            ms_to_ns(a.timeout_ms),
            Class::Control,
            Event::CancelTimeout {
                request,
                tag,
                attempt,
            },
        )?;
        Ok(())
    }

    fn route(&mut self) -> u32 {
        let n = self.replicas.len() as u32;
        match self.scenario.cluster.router {
            Router::RoundRobin => {
                let r = self.rr_next;
                self.rr_next = (r + 1) % n;
                r
            }
            Router::LeastLoaded => (0..n)
                .min_by_key(|&r| (self.replicas[r as usize].load(), r))
                .expect("at least one replica"),
        }
    }

    fn request_pass(&mut self, replica: u32) -> Result<(), RunError> {
        if !self.pass_pending[replica as usize] {
            self.pass_pending[replica as usize] = true;
            self.kernel
                .schedule_in(0, Class::Schedule, Event::SchedulePass { replica })?;
        }
        Ok(())
    }

    fn schedule_pass(&mut self, replica: u32) -> Result<(), RunError> {
        let now_ns = self.kernel.now_ns();
        let r = replica as usize;
        self.pass_pending[r] = false;
        let report = self.replicas[r].checkpoint(now_ns, &mut self.observed, &mut self.released);
        self.rpc.unknown_aborts += report.unknown as u64;
        self.rpc.faults += report.faults as u64;
        let observed = std::mem::take(&mut self.observed);
        for o in &observed {
            self.on_observed(*o)?;
        }
        self.observed = observed;
        self.observed.clear();
        self.drain_released()?;
        while let Some(d) = self.replicas[r].dispatch(now_ns) {
            if self.extras.trace.is_some() {
                let pid = self.recording.trace_pid;
                self.trace(serde_json::json!({"name": "step", "cat": "gpu", "ph": "X", "pid": pid, "tid": replica,
                    "ts": d.start_ns / 1000, "dur": d.end_ns / 1000 - d.start_ns / 1000, "args": {"step": d.step}}));
            }
            self.kernel.schedule_at(
                d.end_ns,
                Class::Completion,
                Event::StepDone {
                    replica,
                    step: d.step,
                },
            )?;
        }
        let mut started = std::mem::take(&mut self.started);
        self.replicas[r].take_started(&mut started);
        for tag in started.drain(..) {
            if !self.reqs[tag as usize].started {
                self.reqs[tag as usize].started = true;
                self.counts.started += 1;
                self.stage_reached(tag, Stage::Prefill)?;
            }
        }
        self.started = started;
        let timer = self.replicas[r].timer_ns();
        if let Some(at) = timer.filter(|_| timer != self.timer_at[r]) {
            self.timer_at[r] = Some(at.max(now_ns));
            self.kernel.schedule_at(
                at.max(now_ns),
                Class::Schedule,
                Event::BatcherTimer { replica },
            )?;
        }
        Ok(())
    }

    /// The backend removed a request at a checkpoint.
    fn on_observed(&mut self, o: Observed) -> Result<(), RunError> {
        let now_ns = self.kernel.now_ns();
        if !self.live(o.id, o.tag) {
            return Ok(());
        }
        self.reqs[o.tag as usize].observed_ns = now_ns;
        if std::mem::take(&mut self.reqs[o.tag as usize].cancel_in_flight) {
            self.cancels_in_flight -= 1;
        }
        self.evidence(
            o.tag,
            EvidenceLevel::BackendObservation,
            ClockDomain::Backend,
        )?;
        let (has_intent, conv) = (
            self.reqs[o.tag as usize].intent_ns != NONE,
            self.reqs[o.tag as usize].conv,
        );
        if has_intent {
            let mut s = Stream::keyed(self.seed, Purpose::CancelRpc, o.id, 1 << 21);
            let latency = ms_to_ns(self.scenario.adapter.rpc_latency_ms.sample(&mut s));
            self.kernel.schedule_in(
                latency,
                Class::Control,
                Event::CancelAck {
                    request: o.id,
                    tag: o.tag,
                },
            )?;
        } else {
            // Terminated by the backend without an intent of its own: a group scope, a fault, or a
            // reused id. The adapter sees the request fail.
            self.reqs[o.tag as usize].collateral = true;
            self.reqs[o.tag as usize].sibling = !self.own_group_hit(o.tag);
            self.rpc.collateral_kills += 1;
            let before = self.owners.state(&o.id);
            let after = self
                .owners
                .finish(&o.id, Disposition::Cancelled)
                .map_err(|e| self.violation(vec![o.id], e.to_string()))?;
            self.reqs[o.tag as usize].terminal = true;
            if before.is_some_and(State::is_terminal) && after != before {
                return Err(self.violation(vec![o.id], "a terminal disposition changed"));
            }
            if let Some((c, g)) = conv {
                self.turn_request_done(c, g)?;
            }
        }
        Ok(())
    }

    fn drain_released(&mut self) -> Result<(), RunError> {
        let mut released = std::mem::take(&mut self.released);
        for rel in released.drain(..) {
            self.on_released(rel)?;
        }
        self.released = released;
        Ok(())
    }

    fn step_done(&mut self, replica: u32, step: u64) -> Result<(), RunError> {
        let now_ns = self.kernel.now_ns();
        let r = replica as usize;
        let report =
            self.replicas[r].step_done(now_ns, step, &mut self.outputs, &mut self.released);
        let total = report.tokens.max(1) as f64;
        let start_ns = now_ns - report.duration_ns;
        let mut outputs = std::mem::take(&mut self.outputs);
        for o in outputs.drain(..) {
            self.token_steps += o.tokens as u64;
            let share = report.duration_ns as f64 * o.tokens as f64 / total;
            let q = &mut self.reqs[o.tag as usize];
            q.token_steps += o.tokens as u64;
            if q.intent_ns != NONE && now_ns > q.intent_ns && report.duration_ns > 0 {
                // GPU work after the intent: the part of this step that ran after it.
                let after = now_ns - q.intent_ns.max(start_ns);
                let leak = share * after as f64 / report.duration_ns as f64;
                self.leaked.token_steps += o.tokens as u64;
                if q.observed_ns == NONE {
                    q.leak_pre_ns += leak;
                } else {
                    q.leak_post_ns += leak;
                }
            }
            match o.outcome {
                Outcome::Discarded => self.gpu_ns_discarded += share,
                Outcome::Padding => self.gpu_ns_padding += share,
                Outcome::Prefill => q.gpu_ns += share,
                Outcome::Token { index, last } => {
                    q.gpu_ns += share;
                    self.on_token(o.tag, index, last, o.corrupted)?;
                }
            }
        }
        self.outputs = outputs;
        self.drain_released()?;
        self.request_pass(replica)
    }

    fn on_token(
        &mut self,
        tag: u32,
        index: u32,
        last: bool,
        corrupted: bool,
    ) -> Result<(), RunError> {
        let now_ns = self.kernel.now_ns();
        let q = &mut self.reqs[tag as usize];
        debug_assert_eq!(index, q.tokens + 1);
        q.tokens = index;
        if index == 1 {
            q.first_token_ns = now_ns;
        }
        if corrupted && q.first_corrupt_chunk == u32::MAX {
            q.first_corrupt_chunk = q.chunks_made;
            // Blocks released unsafely by someone's cancel: a sibling harmed by it.
            if q.intent_ns == NONE {
                q.sibling = true;
            }
        }
        let id = q.id;
        if index == 1 {
            self.stage_reached(tag, Stage::Decode)?;
        }
        if last {
            let q = &mut self.reqs[tag as usize];
            q.last_token_ns = now_ns;
            self.last_completion_ns = now_ns;
            if q.intent_ns != NONE && q.evidence_ns[EvidenceLevel::FinalCallback as usize] == NONE {
                self.evidence(tag, EvidenceLevel::FinalCallback, ClockDomain::Local)?;
            }
            self.stage_reached(tag, Stage::AfterFinalOutput)?;
        }
        // Every output passes the controller: after the terminal transition it is a late output,
        // discarded here and never chunked.
        if self.reqs[tag as usize].terminal {
            debug_assert!(self.owners.state(&id).is_none_or(State::is_terminal));
            self.late_output_discards += 1;
            self.reqs[tag as usize].late_tokens += 1;
            return Ok(());
        }
        let q = &mut self.reqs[tag as usize];
        q.chunk_fill += 1;
        if q.chunk_fill == self.scenario.playback.chunk_tokens || last {
            q.chunk_fill = 0;
            q.chunks_made += 1;
            q.chunks_queued += 1;
            self.playback.chunks += 1;
            if !q.chunk_in_flight {
                self.hold_next_chunk(tag)?;
            }
        }
        Ok(())
    }

    /// The sink takes the request's next chunk: its output evidence goes to the controller, and
    /// its admission begins (two-phase: the writer wait comes between).
    fn hold_next_chunk(&mut self, tag: u32) -> Result<(), RunError> {
        let now_ns = self.kernel.now_ns();
        let q = &mut self.reqs[tag as usize];
        debug_assert!(!q.chunk_in_flight && q.chunks_queued > 0);
        let chunk = q.chunks_admitted;
        let is_final = q.tokens == q.output && chunk + 1 == q.chunks_made;
        q.chunks_queued -= 1;
        q.chunk_in_flight = true;
        let (id, owner, generation) = (q.id, q.owner, q.generation);
        let payload = marker(id, chunk, chunk >= q.first_corrupt_chunk);
        match self.owners.update(&id, chunk as u64, &payload, is_final) {
            Ok(UpdateClass::Accepted) => {}
            Ok(UpdateClass::Conflict) | Ok(UpdateClass::Late) => {
                // Terminal since the chunk was made: it is suppressed.
                self.playback.suppressed += 1;
                return self.chunk_settled(tag);
            }
            Ok(c) => {
                return Err(self.violation(vec![id], format!("chunk {chunk} classified {c:?}")))
            }
            Err(e) => return Err(self.violation(vec![id], e.to_string())),
        }
        let max_age = self.scenario.playback.max_age_ms * 1e6;
        let ticket = self
            .owners
            .admit_begin_on(owner + 1, id, generation as i128, now_ns as f64, max_age)
            .map_err(|e| self.violation(vec![id], e.to_string()))?;
        if self.zero_writer_wait {
            return self.admit_chunk(tag, ticket, 0);
        }
        let seed = self.seed;
        let q = &mut self.reqs[tag as usize];
        let stream = q
            .playback_stream
            .get_or_insert_with(|| Box::new(Stream::new(seed, Purpose::Playback, id)));
        let wait = ms_to_ns(self.scenario.playback.writer_wait_ms.sample(stream));
        self.kernel.schedule_in(
            wait,
            Class::Control,
            Event::ChunkAdmit {
                request: id,
                tag,
                born_ns: now_ns,
                epoch: ticket.epoch,
                retry: 0,
            },
        )?;
        Ok(())
    }

    /// After the wait: the post-wait admission check, against the state at this moment.
    fn admit_chunk(&mut self, tag: u32, ticket: Ticket<u64>, retry: u8) -> Result<(), RunError> {
        let now_ns = self.kernel.now_ns();
        let id = ticket.request;
        let result = self
            .owners
            .admit_end(&ticket, now_ns as f64)
            .map_err(|e| self.violation(vec![id], e.to_string()))?;
        match result {
            Admission::Submitted(payload) => {
                // Invariant 1: nothing is admitted after the first terminal transition. The
                // controller guarantees it; the world checks it.
                if self.owners.state(&id) != Some(State::Running) {
                    self.late_outputs_admitted += 1;
                    return Err(
                        self.violation(vec![id], "output admitted after a terminal transition")
                    );
                }
                self.playback.submitted += 1;
                let q = &mut self.reqs[tag as usize];
                let chunk = q.chunks_admitted;
                // Property 3: the consumer checks, byte for byte, that this is its own marker.
                let expect = marker(id, chunk, false);
                if payload[..12] != expect[..12] {
                    self.playback.routing_violations += 1;
                }
                if payload[12..16] != expect[12..16] && !q.corrupted_seen {
                    q.corrupted_seen = true;
                    self.playback.corrupted_requests += 1;
                }
                q.digest = fold_digest(q.digest, &payload);
                q.chunks_admitted += 1;
                let final_chunk = q.tokens == q.output
                    && q.chunks_admitted == q.chunks_made
                    && q.chunks_queued == 0;
                q.chunk_in_flight = false;
                if final_chunk {
                    // The application's completion boundary: the last chunk was played.
                    self.owners
                        .finish(&id, Disposition::Completed)
                        .map_err(|e| self.violation(vec![id], e.to_string()))?;
                    self.reqs[tag as usize].terminal = true;
                    if let Some((c, g)) = self.reqs[tag as usize].conv {
                        self.turn_request_done(c, g)?;
                    }
                    self.stage_reached(tag, Stage::AfterCompletion)?;
                }
                self.chunk_next(tag)
            }
            Admission::Terminal(_) | Admission::Stale | Admission::Late | Admission::Empty => {
                self.playback.suppressed += 1;
                self.chunk_settled(tag)
            }
            Admission::Expired => {
                self.playback.expired += 1;
                self.intent(tag, Cause::Playback)?;
                self.chunk_settled(tag)
            }
            Admission::Blocked => {
                self.playback.blocked += 1;
                if (retry as u32) < self.scenario.playback.admit_retries {
                    // Wait for the current barrier, then check again (a bounded retry).
                    let ticket = self
                        .owners
                        .admit_begin_on(
                            ticket.barrier,
                            id,
                            ticket.generation,
                            ticket.born,
                            ticket.max_age,
                        )
                        .map_err(|e| self.violation(vec![id], e.to_string()))?;
                    let mut s = Stream::keyed(
                        self.seed,
                        Purpose::Playback,
                        id ^ (1 << 63),
                        retry as u64 + 1,
                    );
                    let wait = ms_to_ns(self.scenario.playback.clear_ack_ms.sample(&mut s)).max(1);
                    self.kernel.schedule_in(
                        wait,
                        Class::Control,
                        Event::ChunkAdmit {
                            request: id,
                            tag,
                            born_ns: ticket.born as u64,
                            epoch: ticket.epoch,
                            retry: retry + 1,
                        },
                    )?;
                    Ok(())
                } else {
                    self.playback.gave_up += 1;
                    self.intent(tag, Cause::Playback)?;
                    self.chunk_settled(tag)
                }
            }
        }
    }

    /// The chunk in flight is done with; the request is terminal, so the rest is suppressed.
    fn chunk_settled(&mut self, tag: u32) -> Result<(), RunError> {
        let q = &mut self.reqs[tag as usize];
        q.chunk_in_flight = false;
        self.playback.suppressed += q.chunks_queued as u64;
        q.chunks_admitted += q.chunks_queued;
        q.chunks_queued = 0;
        self.try_finalize(tag)
    }

    fn chunk_next(&mut self, tag: u32) -> Result<(), RunError> {
        if self.reqs[tag as usize].chunks_queued > 0 {
            self.hold_next_chunk(tag)
        } else {
            self.try_finalize(tag)
        }
    }

    fn on_released(&mut self, rel: Released) -> Result<(), RunError> {
        if !self.live(rel.id, rel.tag) {
            return Err(self.violation(vec![rel.id], "release of a request that is not here"));
        }
        self.kv_block_ns += rel.kv_block_ns;
        self.reqs[rel.tag as usize].kv_block_ns = rel.kv_block_ns;
        self.kv_block_ns_retained += rel.kv_block_ns_marked;
        self.reqs[rel.tag as usize].engine_released = true;
        if std::mem::take(&mut self.reqs[rel.tag as usize].cancel_in_flight) {
            self.cancels_in_flight -= 1;
        }
        self.reqs[rel.tag as usize].released_ns = self.kernel.now_ns();
        if self.reqs[rel.tag as usize].intent_ns != NONE {
            self.evidence(
                rel.tag,
                EvidenceLevel::ResourceRelease,
                ClockDomain::Backend,
            )?;
        }
        self.try_finalize(rel.tag)
    }

    /// Record one evidence level: in the request's own timeline (virtual ns, for latencies) and
    /// in the controller's ledger (with its clock domain), which refuses out-of-order evidence.
    fn evidence(
        &mut self,
        tag: u32,
        level: EvidenceLevel,
        domain: ClockDomain,
    ) -> Result<(), RunError> {
        let now_ns = self.kernel.now_ns();
        let q = &mut self.reqs[tag as usize];
        if q.evidence_ns[level as usize] != NONE {
            return Ok(());
        }
        q.evidence_ns[level as usize] = now_ns;
        let id = q.id;
        self.mark(match level {
            EvidenceLevel::Intent => "evidence.intent",
            EvidenceLevel::LocalInvalidation => "evidence.local_invalidation",
            EvidenceLevel::CancelSubmission => "evidence.cancel_submission",
            EvidenceLevel::BackendObservation => "evidence.backend_observation",
            EvidenceLevel::FinalCallback => "evidence.final_callback",
            EvidenceLevel::ResourceRelease => "evidence.resource_release",
        });
        let ns = if domain == ClockDomain::Backend {
            now_ns + self.clock_offset_ns
        } else {
            now_ns
        };
        match self
            .owners
            .record_evidence(&id, level, Timestamp { domain, ns })
        {
            Ok(()) => Ok(()),
            // An evicted tombstone has no ledger any more: the timeline above still has it.
            Err(cancelsim_models::ownership::OwnershipError::UnknownRequest)
                if self.owners.is_evicted(&id) =>
            {
                Ok(())
            }
            Err(e) => Err(self.violation(vec![id], format!("evidence: {e}"))),
        }
    }

    /// Leave the system once nothing more can happen to the request.
    fn try_finalize(&mut self, tag: u32) -> Result<(), RunError> {
        let q = &self.reqs[tag as usize];
        if !q.live {
            return Ok(());
        }
        let state = self.owners.state(&q.id);
        let terminal = state.is_none_or(State::is_terminal);
        let engine_done = q.engine_released || !q.enqueued;
        let cancel_settled = q.intent_ns == NONE
            || !q.enqueued
            || matches!(self.policy(), Some(Policy::FinishAndDiscard) | None)
            || q.acked
            || q.exhausted
            || q.fallback;
        if !terminal
            || !engine_done
            || q.chunk_in_flight
            || q.chunks_queued > 0
            || q.intent_pending
            || !cancel_settled
        {
            return Ok(());
        }
        let now_ns = self.kernel.now_ns();
        self.reqs[tag as usize].playback_stream = None;
        let q = self.reqs[tag as usize].clone();
        let state = state.unwrap_or(State::Cancelled);
        if q.plan.is_some() {
            match state {
                State::Completed => self.targets.completed += 1,
                State::Cancelled => self.targets.cancelled += 1,
                State::Expired => self.targets.expired += 1,
                State::Running => {}
            }
        }
        if q.observed_ns != NONE && q.released_ns != NONE && q.released_ns > q.observed_ns {
            self.mark("release.after_fence");
        }
        // Dispositions with their denominators.
        if q.rejected {
            self.counts.rejected += 1;
        } else {
            match state {
                State::Completed => self.counts.completed += 1,
                State::Cancelled => self.counts.cancelled += 1,
                State::Expired => self.counts.expired += 1,
                State::Running => unreachable!("finalized while running"),
            }
        }
        if state == State::Completed && !q.rejected {
            self.ttft.record(q.first_token_ns - q.arrival_ns);
            self.e2e.record(q.last_token_ns - q.arrival_ns);
            if q.output > 1 {
                self.tpot
                    .record((q.last_token_ns - q.first_token_ns) / (q.output as u64 - 1));
            }
        }
        self.gpu_ns_requests += q.gpu_ns;
        if q.intent_ns != NONE {
            // Cleanup pending: the backend still held the request at the intent, and never
            // observed the cancel (its work ran on, and nobody confirmed that it stopped).
            let held_at_intent = q.released_ns == NONE || q.released_ns > q.intent_ns;
            if q.enqueued && q.observed_ns == NONE && held_at_intent && state != State::Completed {
                self.counts.cleanup_pending += 1;
            }
            for (i, level) in CLEANUP_LEVELS.iter().enumerate() {
                let at = q.evidence_ns[*level as usize];
                if at == NONE {
                    self.cleanup_unknown[i] += 1;
                } else {
                    // Evidence from before the intent (killed as someone else's collateral first):
                    // the request was already clean when its own intent came.
                    self.cleanup[i].record(at.saturating_sub(q.intent_ns));
                }
            }
            let fd = matches!(self.policy(), Some(Policy::FinishAndDiscard));
            let c = &mut self.leaked.by_cause;
            if fd {
                c.finish_and_discard += q.leak_pre_ns + q.leak_post_ns;
            } else if q.fallback && q.observed_ns == NONE {
                c.finish_and_discard += q.leak_pre_ns;
                c.in_flight_window += q.leak_post_ns;
            } else if q.observed_ns != NONE {
                c.checkpoint_delay += q.leak_pre_ns;
                c.in_flight_window += q.leak_post_ns;
            } else {
                c.unobserved_or_lost += q.leak_pre_ns + q.leak_post_ns;
            }
            self.leaked.gpu_s += q.leak_pre_ns + q.leak_post_ns;
        }
        let (mut is_sibling, mut survived) = (false, None);
        match self.mode {
            Mode::Counterfactual => {
                if let Some(table) = self.cf_out.as_deref_mut() {
                    table.insert(
                        q.id,
                        CfRecord {
                            state,
                            digest: q.digest,
                            ttft_ns: q.first_token_ns.saturating_sub(q.arrival_ns),
                            e2e_ns: q.last_token_ns.saturating_sub(q.arrival_ns),
                        },
                    );
                }
            }
            Mode::Policy(_, cf) => {
                // A sibling: no intent of its own, but it shared a replica with a request that
                // got one while it was there, or it was killed or corrupted by someone's cancel.
                let shared = q.enqueued
                    && self.intent_epoch[q.replica as usize] > q.epoch_at_enqueue
                    && !self.own_group_hit(tag);
                if q.intent_ns == NONE && (q.sibling || shared) {
                    is_sibling = true;
                    self.siblings += 1;
                    if let Some(base) = cf.get(q.id) {
                        survived = Some(base.state == state && base.digest == q.digest);
                        if survived == Some(true) {
                            self.survived += 1;
                        }
                        if base.state == State::Completed && state == State::Completed {
                            if self.extras.sibling_ttft_ms.len() < PAIRS_MAX {
                                self.extras.sibling_ttft_ms.push((
                                    base.ttft_ns as f64 / 1e6,
                                    (q.first_token_ns - q.arrival_ns) as f64 / 1e6,
                                ));
                            }
                            self.ttft_deltas.push(
                                (q.first_token_ns - q.arrival_ns) as i64 - base.ttft_ns as i64,
                            );
                            self.e2e_deltas
                                .push((q.last_token_ns - q.arrival_ns) as i64 - base.e2e_ns as i64);
                        }
                    }
                }
            }
        }
        self.record_request(&q, state, is_sibling, survived, now_ns);
        self.outcome_hasher.update(&q.id.to_le_bytes());
        self.outcome_hasher.update(&[state as u8]);
        self.outcome_hasher.update(&q.digest.to_le_bytes());
        self.outcome_hasher.update(&q.tokens.to_le_bytes());
        self.outcome_hasher.update(&q.chunks_admitted.to_le_bytes());
        self.integrate(now_ns);
        self.in_system -= 1;
        self.sojourn_sum_ns += (now_ns - q.arrival_ns) as u128;
        self.sojourn_count += 1;
        self.reqs[tag as usize].live = false;
        self.free_tags.push(tag);
        Ok(())
    }

    /// A request leaves: its row to the sink, its track and cancel flow to the trace.
    fn record_request(
        &mut self,
        q: &Req,
        state: State,
        sibling: bool,
        survived: Option<bool>,
        now_ns: u64,
    ) {
        let ms = |ns: u64| ns as f64 / 1e6;
        let opt = |ns: u64| (ns != NONE).then(|| ms(ns));
        let disposition = if q.rejected {
            "rejected"
        } else {
            match state {
                State::Completed => "completed",
                State::Cancelled => "cancelled",
                State::Expired => "expired",
                State::Running => "running",
            }
        };
        if let Some(sink) = self.recording.sink.as_deref_mut() {
            let ev = |l: EvidenceLevel| opt(q.evidence_ns[l as usize]);
            let completed = state == State::Completed && !q.rejected;
            sink.row(&RequestRow {
                policy: self.policy_label.clone(),
                id: q.id,
                owner: q.owner,
                generation: q.generation,
                replica: q.replica,
                runtime_id: q.handle.runtime_id,
                disposition,
                target: q.plan.is_some(),
                sibling,
                survived,
                collateral: q.collateral,
                output_tokens: q.output,
                tokens_generated: q.tokens,
                chunks_played: q.chunks_admitted,
                arrival_ms: ms(q.arrival_ns),
                ttft_ms: completed.then(|| ms(q.first_token_ns - q.arrival_ns)),
                e2e_ms: completed.then(|| ms(q.last_token_ns - q.arrival_ns)),
                intent_ms: opt(q.intent_ns),
                local_invalidation_ms: ev(EvidenceLevel::LocalInvalidation),
                cancel_submission_ms: ev(EvidenceLevel::CancelSubmission),
                backend_observation_ms: ev(EvidenceLevel::BackendObservation),
                final_callback_ms: ev(EvidenceLevel::FinalCallback),
                resource_release_ms: ev(EvidenceLevel::ResourceRelease),
                leaked_gpu_ms: (q.leak_pre_ns + q.leak_post_ns) / 1e6,
                late_discards: q.late_tokens,
                gpu_ms: q.gpu_ns / 1e6,
                token_steps: q.token_steps,
                kv_block_s: q.kv_block_ns as f64 / NS_PER_S as f64,
            });
        }
        if self.extras.trace.is_none() {
            return;
        }
        let pid = self.recording.trace_pid;
        let us = |ns: u64| ns / 1000;
        let name = format!("request {}", q.id);
        self.trace(serde_json::json!({"name": name, "cat": "request", "ph": "b", "id": q.id, "pid": pid, "tid": 0, "ts": us(q.arrival_ns)}));
        self.trace(serde_json::json!({"name": name, "cat": "request", "ph": "e", "id": q.id, "pid": pid, "tid": 0, "ts": us(now_ns),
            "args": {"disposition": disposition, "sibling": sibling, "survived": survived}}));
        if q.intent_ns == NONE {
            return;
        }
        // The cancel as a flow: intent, then backend observation, then resource release, each a
        // 1 µs marker slice on the "cancels" thread that the flow binds to.
        let mut points: Vec<(&str, u64)> = vec![("intent", q.intent_ns)];
        for (label, l) in [
            ("backend_observation", EvidenceLevel::BackendObservation),
            ("resource_release", EvidenceLevel::ResourceRelease),
        ] {
            let at = q.evidence_ns[l as usize];
            if at != NONE && at >= q.intent_ns {
                points.push((label, at));
            }
        }
        for (label, at) in &points {
            self.trace(serde_json::json!({"name": label, "cat": "cancel", "ph": "X", "pid": pid, "tid": CANCELS_TID,
                "ts": us(*at), "dur": 1, "args": {"request": q.id}}));
        }
        if points.len() >= 2 {
            let last = points.len() - 1;
            self.flows += 1;
            let flow_id = ((pid as u64) << 32) | self.flows as u64;
            for (i, (_, at)) in points.iter().enumerate() {
                let ph = if i == 0 {
                    "s"
                } else if i == last {
                    "f"
                } else {
                    "t"
                };
                let mut ev = serde_json::json!({"name": "cancel", "cat": "cancel", "ph": ph, "id": flow_id, "pid": pid, "tid": CANCELS_TID, "ts": us(*at), "args": {"request": q.id}});
                if ph == "f" {
                    ev["bp"] = serde_json::json!("e");
                }
                self.trace(ev);
            }
        }
    }

    /// Whether the request's own owner (its conversation) has had a cancel intent: then the owner's
    /// group was hit, and the request is part of that group, not a sibling of it.
    fn own_group_hit(&self, tag: u32) -> bool {
        self.reqs[tag as usize]
            .conv
            .and_then(|(c, _)| self.convs.get(&c))
            .is_some_and(|c| c.intents > 0)
    }

    /// A request of generation `g` of conversation `c` is done (or refused, or gone).
    fn turn_request_done(&mut self, c: u64, g: u32) -> Result<(), RunError> {
        let Some(conv) = self.convs.get_mut(&c) else {
            return Ok(());
        };
        if conv.turn != g || conv.outstanding == 0 {
            return Ok(()); // a superseded generation no longer drives the turn
        }
        conv.outstanding -= 1;
        if conv.outstanding == 0 {
            let think = workload::turn_draws(&self.scenario.workload, self.seed, c, g).think_ns;
            self.next_turn(c, think)?;
        }
        Ok(())
    }

    fn next_turn(&mut self, c: u64, delay_ns: u64) -> Result<(), RunError> {
        let conv = self.convs.get_mut(&c).expect("live conversation");
        conv.turn += 1;
        if conv.turn >= conv.turns {
            self.convs.remove(&c);
            self.owners.drop_barrier(c + 1);
            return Ok(());
        }
        self.kernel
            .schedule_in(delay_ns, Class::Arrival, Event::TurnStart { conv: c })?;
        Ok(())
    }

    fn integrate(&mut self, now_ns: u64) {
        self.area_in_system += (now_ns - self.last_change_ns) as u128 * self.in_system as u128;
        self.last_change_ns = now_ns;
    }

    fn finish(mut self) -> Result<(Summary, Extras), RunError> {
        let end_ns = self.kernel.now_ns();
        self.integrate(end_ns);
        // Conservation, checked on every run (invariant 5): everyone who arrived ended in exactly
        // one disposition and left, every replica drained, every block allocated was freed, and
        // every token generated was delivered or discarded.
        let c = &self.counts;
        let live: Vec<u64> = self
            .reqs
            .iter()
            .filter(|q| q.live)
            .map(|q| q.id)
            .take(8)
            .collect();
        if !live.is_empty() || self.in_system != 0 {
            return Err(self.violation(live, "requests never reached a terminal disposition"));
        }
        if c.completed + c.cancelled + c.expired + c.rejected != c.scheduled {
            return Err(self.violation(
                vec![],
                "dispositions do not add up to the requests scheduled",
            ));
        }
        if !self.convs.is_empty() {
            return Err(self.violation(vec![], "a conversation never ended"));
        }
        let mut stats = ReplicaStats::default();
        let (mut allocated, mut freed, mut peak) = (0, 0, 0);
        for r in &self.replicas {
            let kv = r.kv();
            if !r.is_idle() || kv.allocated_total() != kv.freed_total() || kv.in_use() != 0 {
                return Err(self.violation(vec![], "a replica did not drain, or KV blocks leaked"));
            }
            allocated += kv.allocated_total();
            freed += kv.freed_total();
            peak = peak.max(kv.in_use_max());
            let s = r.stats();
            stats.steps += s.steps;
            stats.busy_ns += s.busy_ns;
            stats.preemptions += s.preemptions;
            stats.tokens_delivered += s.tokens_delivered;
            stats.tokens_discarded += s.tokens_discarded;
            stats.padding_token_steps += s.padding_token_steps;
            stats.admission_stalls += s.admission_stalls;
            stats.marked_blocks_peak = stats.marked_blocks_peak.max(s.marked_blocks_peak);
        }
        let end_s = end_ns as f64 / NS_PER_S as f64;
        let n_replicas = self.replicas.len() as f64;
        let lambda_per_s = if end_s > 0.0 {
            self.sojourn_count as f64 / end_s
        } else {
            0.0
        };
        let mean_in_system = if end_ns > 0 {
            self.area_in_system as f64 / end_ns as f64
        } else {
            0.0
        };
        let mean_sojourn_s =
            self.sojourn_sum_ns as f64 / self.sojourn_count.max(1) as f64 / NS_PER_S as f64;
        let lw = lambda_per_s * mean_sojourn_s;
        let makespan_s = self.last_completion_ns as f64 / NS_PER_S as f64;
        let mut cleanup = BTreeMap::new();
        for (i, level) in CLEANUP_LEVELS.iter().enumerate() {
            let cdf = self.cleanup[i].cdf_ms(50);
            if !cdf.is_empty() {
                self.extras
                    .cleanup_cdf_ms
                    .insert(level.as_str().to_string(), cdf);
            }
            let l = self.cleanup[i].summary();
            cleanup.insert(
                level.as_str().to_string(),
                LevelLatencyMs {
                    count: l.count,
                    p50: l.p50,
                    p99: l.p99,
                    max: l.max,
                    unknown: self.cleanup_unknown[i],
                },
            );
        }
        self.ttft_deltas.sort_unstable();
        self.e2e_deltas.sort_unstable();
        let ms = |ns: i64| ns as f64 / 1e6;
        let leaked = LeakedWork {
            token_steps: self.leaked.token_steps,
            gpu_s: self.leaked.gpu_s / NS_PER_S as f64,
            by_cause: LeakCauses {
                in_flight_window: self.leaked.by_cause.in_flight_window / NS_PER_S as f64,
                checkpoint_delay: self.leaked.by_cause.checkpoint_delay / NS_PER_S as f64,
                unobserved_or_lost: self.leaked.by_cause.unobserved_or_lost / NS_PER_S as f64,
                finish_and_discard: self.leaked.by_cause.finish_and_discard / NS_PER_S as f64,
            },
        };
        let derived: [(&'static str, u64); 14] = [
            (
                "rpc.retry",
                self.rpc
                    .attempts
                    .saturating_sub(self.rpc.intents.min(self.rpc.attempts)),
            ),
            ("rpc.lost", self.rpc.lost),
            ("rpc.duplicate", self.rpc.duplicates),
            ("rpc.late_callback", self.rpc.late_callbacks),
            ("rpc.budget_exhausted", self.rpc.budget_exhausted),
            ("rpc.unknown_abort", self.rpc.unknown_aborts),
            ("rpc.fallback", self.rpc.fallbacks),
            ("fault", self.rpc.faults),
            ("collateral_kill", self.rpc.collateral_kills),
            ("preemption", stats.preemptions),
            ("playback.blocked", self.playback.blocked),
            ("playback.expired", self.playback.expired),
            ("playback.suppressed", self.playback.suppressed),
            (
                "release.corrupted_next_owner",
                self.playback.corrupted_requests,
            ),
        ];
        for (m, n) in derived {
            if n > 0 {
                *self.coverage.entry(m).or_insert(0) += n;
            }
        }
        let summary = Summary {
            scenario: self.scenario.name.clone(),
            scenario_hash: self.scenario.hash(),
            seed: self.seed,
            version: env!("CARGO_PKG_VERSION").to_string(),
            policy: self.policy_label.clone(),
            requests: self.counts.clone(),
            leaked_work: leaked,
            late_output_discards: self.late_output_discards,
            late_outputs_admitted: self.late_outputs_admitted,
            sibling_survival: SiblingSurvival {
                siblings: self.siblings,
                survived: self.survived,
                rate: if self.siblings > 0 {
                    self.survived as f64 / self.siblings as f64
                } else {
                    1.0
                },
            },
            sibling_latency_delta_ms: LatencyDeltaMs {
                ttft_p50: ms(quantile_sorted(&self.ttft_deltas, 0.5)),
                ttft_p99: ms(quantile_sorted(&self.ttft_deltas, 0.99)),
                e2e_p50: ms(quantile_sorted(&self.e2e_deltas, 0.5)),
                e2e_p99: ms(quantile_sorted(&self.e2e_deltas, 0.99)),
                pairs: self.e2e_deltas.len() as u64,
            },
            retained: Retained {
                kv_block_s: self.kv_block_ns_retained as f64 / NS_PER_S as f64,
                peak_blocks: stats.marked_blocks_peak,
                admission_stalls: stats.admission_stalls,
            },
            cleanup_latency_ms: cleanup,
            ttft_ms: self.ttft.summary(),
            tpot_ms: self.tpot.summary(),
            e2e_ms: self.e2e.summary(),
            throughput_rps: if makespan_s > 0.0 {
                self.counts.completed as f64 / makespan_s
            } else {
                0.0
            },
            output_tokens_per_s: if makespan_s > 0.0 {
                stats.tokens_delivered as f64 / makespan_s
            } else {
                0.0
            },
            gpu: Gpu {
                steps: stats.steps,
                busy_s: stats.busy_ns as f64 / NS_PER_S as f64,
                utilisation: if end_ns > 0 {
                    stats.busy_ns as f64 / (end_ns as f64 * n_replicas)
                } else {
                    0.0
                },
                token_steps: self.token_steps,
                gpu_s_requests: self.gpu_ns_requests / NS_PER_S as f64,
                gpu_s_discarded: self.gpu_ns_discarded / NS_PER_S as f64,
                gpu_s_padding: self.gpu_ns_padding / NS_PER_S as f64,
                tokens_generated: stats.tokens_delivered,
                tokens_discarded: stats.tokens_discarded,
                padding_token_steps: stats.padding_token_steps,
                preemptions: stats.preemptions,
            },
            kv: Kv {
                block_s: self.kv_block_ns as f64 / NS_PER_S as f64,
                peak_blocks: peak,
                allocated_blocks: allocated,
                freed_blocks: freed,
            },
            workload: self.events.clone(),
            playback: self.playback.clone(),
            cancel_rpc: self.rpc.clone(),
            targets: self.targets.clone(),
            coverage: self
                .coverage
                .iter()
                .map(|(k, v)| (k.to_string(), *v))
                .collect(),
            littles_law: LittlesLaw {
                lambda_per_s,
                mean_in_system,
                mean_e2e_s: mean_sojourn_s,
                relative_gap: if mean_in_system > 0.0 {
                    (mean_in_system - lw).abs() / mean_in_system
                } else {
                    0.0
                },
            },
            events: self.kernel.events_dispatched(),
            virtual_time_s: end_s,
            workload_hash: self.workload_hasher.finalize().to_hex().to_string(),
            run_hash: {
                let mut h = blake3::Hasher::new();
                h.update(self.kernel.run_hash().as_bytes());
                h.update(self.outcome_hasher.finalize().as_bytes());
                h.finalize().to_hex().to_string()
            },
        };
        let mut extras = std::mem::take(&mut self.extras);
        extras.sink = self.recording.sink.take();
        Ok((summary, extras))
    }
}

/// The counterfactual and one run per policy, on one seed.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Report {
    pub scenario: String,
    pub scenario_hash: String,
    pub seed: u64,
    pub version: String,
    /// The git commit cancelsim was built from.
    pub commit: String,
    pub counterfactual: Summary,
    pub policies: Vec<Summary>,
    /// BLAKE3 over the counterfactual's and every policy run's hash, in order.
    pub run_hash: String,
}

/// Run the counterfactual, then every policy of the scenario, on `seed`.
pub fn run(scenario: &Scenario, seed: u64) -> Result<Report, RunError> {
    run_with(scenario, seed, Hooks::default())
}

/// The trace thread of the cancel flows' marker slices.
pub const CANCELS_TID: u32 = 1_000_000;

/// `run`, streaming per-request rows into `sink`, sampling gauges every `sample_ns` and, if
/// asked, keeping a trace. Returns the report and each run's extras (the counterfactual's
/// first, which also hands the sink back).
pub fn run_recorded(
    scenario: &Scenario,
    seed: u64,
    sample_ns: u64,
    mut sink: Option<Box<dyn RequestSink>>,
    trace: bool,
) -> Result<(Report, Vec<Extras>), RunError> {
    let mut table = CfTable::default();
    let intents = has_intent_sources(scenario);
    let mut extras = Vec::new();
    let rec = |pid: u32, sink: Option<Box<dyn RequestSink>>| Recording {
        sample_ns,
        sink,
        trace,
        trace_pid: pid,
    };
    let (counterfactual, mut e) = World::new(
        scenario,
        seed,
        Mode::Counterfactual,
        intents.then_some(&mut table),
    )?
    .with_recording(rec(0, sink.take()))
    .run_recorded()?;
    sink = e.sink.take();
    extras.push(e);
    let mut policies = Vec::with_capacity(scenario.policies.len());
    for (i, p) in scenario.policies.iter().enumerate() {
        if intents {
            let (summary, mut e) = World::new(scenario, seed, Mode::Policy(p, &table), None)?
                .with_recording(rec(i as u32 + 1, sink.take()))
                .run_recorded()?;
            sink = e.sink.take();
            policies.push(summary);
            extras.push(e);
        } else {
            let mut same = counterfactual.clone();
            same.policy = p.label();
            policies.push(same);
            extras.push(Extras::default());
        }
    }
    extras[0].sink = sink;
    Ok((assemble(scenario, seed, counterfactual, policies), extras))
}

fn assemble(
    scenario: &Scenario,
    seed: u64,
    counterfactual: Summary,
    policies: Vec<Summary>,
) -> Report {
    let mut h = blake3::Hasher::new();
    h.update(counterfactual.run_hash.as_bytes());
    for p in &policies {
        h.update(p.run_hash.as_bytes());
    }
    Report {
        scenario: scenario.name.clone(),
        scenario_hash: scenario.hash(),
        seed,
        version: env!("CARGO_PKG_VERSION").to_string(),
        commit: env!("CANCELSIM_COMMIT").to_string(),
        counterfactual,
        policies,
        run_hash: h.finalize().to_hex().to_string(),
    }
}

/// `run` with deliberately broken variants turned on (tests of the checker only).
pub fn run_with(scenario: &Scenario, seed: u64, hooks: Hooks) -> Result<Report, RunError> {
    let mut table = CfTable::default();
    let intents = has_intent_sources(scenario);
    let counterfactual = World::new(
        scenario,
        seed,
        Mode::Counterfactual,
        intents.then_some(&mut table),
    )?
    .run()?;
    let mut policies = Vec::with_capacity(scenario.policies.len());
    for p in &scenario.policies {
        if intents {
            policies.push(
                World::new(scenario, seed, Mode::Policy(p, &table), None)?
                    .with_hooks(hooks)
                    .run()?,
            );
        } else {
            // Without any source of cancel intents a policy run is the counterfactual event for
            // event (the same run hash; a test shows it), so it is not simulated again.
            let mut same = counterfactual.clone();
            same.policy = p.label();
            policies.push(same);
        }
    }
    Ok(assemble(scenario, seed, counterfactual, policies))
}

/// Whether anything in the scenario can produce a cancel intent.
pub fn has_intent_sources(s: &Scenario) -> bool {
    let barge_in = matches!(
        &s.workload.source,
        Source::Conversations {
            barge_in: Some(_),
            ..
        }
    );
    s.cancellation.is_some()
        || s.workload.deadline_ms.is_some()
        || s.workload.disconnect_ms.is_some()
        || barge_in
}

/// Run only the counterfactual (no cancel intents): the runtime alone.
pub fn run_counterfactual(scenario: &Scenario, seed: u64) -> Result<Summary, RunError> {
    World::new(scenario, seed, Mode::Counterfactual, None)?.run()
}

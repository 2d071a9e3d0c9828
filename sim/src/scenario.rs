//! Scenario files: RON, strict, validated.
//!
//! Every config type denies unknown fields. A parse error names the file, `line:column` and the
//! field path; a semantic error (a negative rate, NaN, an empty pool) names the file and the field
//! path, and the line of that field when it can be found. Nothing here panics on user input.

use std::fmt;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::dist::Dist;
use crate::kernel::{Limits, NS_PER_S};

/// The scenario `cancelsim` runs when given no file.
pub const DEFAULT_SCENARIO: &str = include_str!("../../scenarios/default.ron");
/// The name shown for the embedded default in messages.
pub const DEFAULT_SCENARIO_PATH: &str = "<embedded>/scenarios/default.ron";

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// Used for the output directory; letters, digits, `-` and `_`.
    pub name: String,
    #[serde(default)]
    pub description: String,
    /// Run seed. `--seed` overrides it.
    #[serde(default = "default_seed")]
    pub seed: u64,
    #[serde(default)]
    pub limits: LimitsConfig,
    pub workload: Workload,
    pub cluster: Cluster,
    /// Which requests get a cancel intent, and when. None: no storm (intents can still come
    /// from deadlines, disconnects and barge-ins).
    #[serde(default)]
    pub cancellation: Option<Cancellation>,
    /// The policies to compare, one run each against one shared counterfactual.
    #[serde(default = "default_policies")]
    pub policies: Vec<Policy>,
    #[serde(default)]
    pub adapter: AdapterConfig,
    #[serde(default)]
    pub backend: BackendConfig,
    #[serde(default)]
    pub playback: PlaybackConfig,
    /// What `cancelsim check` expects of each policy's run.
    #[serde(default)]
    pub expect: Vec<Expect>,
    /// Where the system properties must hold (checked in every run, swarm included).
    #[serde(default)]
    pub properties: Properties,
    /// Rare paths this scenario must reach (see `COVERAGE_MARKS`).
    #[serde(default)]
    pub coverage: Vec<String>,
    /// Ranges `check --swarm` draws this scenario's parameters from, per seed.
    #[serde(default)]
    pub swarm: Option<SwarmRanges>,
    /// The directory relative paths (traces) resolve against: the scenario file's directory, or
    /// the repository's `scenarios/` for the embedded default.
    #[serde(skip)]
    pub base_dir: std::path::PathBuf,
}

fn default_seed() -> u64 {
    1
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsConfig {
    pub max_events: u64,
    pub max_time_s: f64,
    pub max_queue_len: u64,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        let d = Limits::default();
        LimitsConfig {
            max_events: d.events_max,
            max_time_s: (d.time_ns_max / NS_PER_S) as f64,
            max_queue_len: d.queue_len_max,
        }
    }
}

/// What arrives, and what each request asks for.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Workload {
    pub source: Source,
    /// Prompt length in tokens, for synthetic sources (traces carry their own).
    #[serde(default = "default_prompt")]
    pub prompt_tokens: Dist,
    /// Output length in tokens (where the model emits end of sequence), for synthetic sources.
    #[serde(default = "default_output")]
    pub output_tokens: Dist,
    /// Deadline from acceptance, per request. None: no deadline.
    #[serde(default)]
    pub deadline_ms: Option<Dist>,
    /// Time from acceptance until the client disconnects, per request. None: clients stay.
    #[serde(default)]
    pub disconnect_ms: Option<Dist>,
}

fn default_prompt() -> Dist {
    Dist::LogNormal {
        median: 1000.0,
        sigma: 0.8,
    }
}

fn default_output() -> Dist {
    Dist::LogNormal {
        median: 130.0,
        sigma: 0.8,
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub enum Source {
    /// Open-loop Poisson arrivals.
    Poisson { rate_per_s: f64, requests: u64 },
    /// Open-loop bursty arrivals: a two-state Markov-modulated Poisson process. The source
    /// alternates between an on period (rate `rate_on_per_s`) and an off period
    /// (`rate_off_per_s`, possibly 0), with durations drawn from `on_ms` and `off_ms`.
    OnOff {
        rate_on_per_s: f64,
        rate_off_per_s: f64,
        on_ms: Dist,
        off_ms: Dist,
        requests: u64,
    },
    /// Closed-loop conversations. Conversations start as a Poisson process; each issues `turns`
    /// turns; a turn is one generation of `requests_per_turn` requests; the next turn starts
    /// `think_ms` after the turn's last request completes. With `barge_in`, the user interrupts
    /// a turn in progress, which supersedes its generation and starts the next turn at once.
    Conversations {
        conversations: u64,
        start_rate_per_s: f64,
        turns: Dist,
        think_ms: Dist,
        #[serde(default = "one")]
        requests_per_turn: u32,
        #[serde(default)]
        barge_in: Option<BargeIn>,
    },
    /// Replay of a real trace. `path` is relative to the scenario file.
    Trace {
        path: String,
        format: TraceFormat,
        /// Time scaling: 2.0 replays twice as fast.
        #[serde(default = "one_f64")]
        speedup: f64,
        /// First data row to replay (0-based).
        #[serde(default)]
        first_row: u64,
        /// How many rows from `first_row`; None: to the end.
        #[serde(default)]
        rows: Option<u64>,
        /// Keep each row with this probability (an independent draw per row).
        #[serde(default = "one_f64")]
        sample_fraction: f64,
    },
}

fn one() -> u32 {
    1
}

fn one_f64() -> f64 {
    1.0
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BargeIn {
    /// Probability that a turn is interrupted.
    pub probability: f64,
    /// When, from the turn's start.
    pub after_ms: Dist,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TraceFormat {
    /// Azure LLM inference trace 2023: `TIMESTAMP,ContextTokens,GeneratedTokens`.
    AzureCsv,
    /// Mooncake JSON Lines: `timestamp` (ms), `input_length`, `output_length`.
    MooncakeJsonl,
}

/// The serving side: replicas behind a router, each one engine on one GPU profile.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cluster {
    #[serde(default = "one")]
    pub replicas: u32,
    #[serde(default)]
    pub router: Router,
    pub profile: ProfileRef,
    pub scheduler: Scheduler,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Router {
    #[default]
    RoundRobin,
    /// Fewest requests waiting, running or draining; ties go to the lowest index.
    LeastLoaded,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub enum ProfileRef {
    /// One of `llama-3.1-8b-h100`, `llama-3.1-70b-tp4-h100`, `llama-2-7b-a100`.
    Named(String),
    /// Your own step costs (see ARCHITECTURE.md for the formula).
    Custom {
        c0_ms: f64,
        #[serde(default)]
        prefill_tokens_per_s: f64,
        #[serde(default)]
        per_seq_us: f64,
        #[serde(default)]
        per_kv_token_ns: f64,
        kv_blocks_16: u64,
    },
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub enum Scheduler {
    /// vLLM-like continuous batching. Unset limits take the profile's vLLM defaults.
    Continuous {
        #[serde(default)]
        max_num_seqs: Option<u32>,
        #[serde(default)]
        max_num_batched_tokens: Option<u32>,
        #[serde(default = "yes")]
        chunked_prefill: bool,
        #[serde(default = "sixteen")]
        block_tokens: u32,
        /// KV capacity in blocks; None: the profile's capacity.
        #[serde(default)]
        kv_blocks: Option<u64>,
        /// In-flight window W.
        #[serde(default = "one")]
        window: u32,
    },
    /// Triton-like dynamic batching: each batch is one shared execution.
    Dynamic {
        max_batch_size: u32,
        max_queue_delay_ms: f64,
        #[serde(default = "sixteen")]
        block_tokens: u32,
        #[serde(default)]
        kv_blocks: Option<u64>,
    },
}

fn yes() -> bool {
    true
}

/// Expectations of one policy's run (`policy` is a label such as `per_request`, or `*`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Expect {
    pub policy: String,
    /// Every storm target ends in this disposition.
    pub targets: Option<TargetDisposition>,
    pub sibling_survival_min: Option<f64>,
    pub sibling_survival_max: Option<f64>,
    pub leaked_gpu_s_min: Option<f64>,
    pub leaked_gpu_s_max: Option<f64>,
    pub late_discards_max: Option<u64>,
    pub retained_peak_blocks_max: Option<u64>,
    pub cleanup_pending_min: Option<u64>,
    pub cleanup_pending_max: Option<u64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TargetDisposition {
    Completed,
    Cancelled,
    Expired,
}

/// The system properties a configuration must keep. Routing (each consumer receives only its own
/// request's markers) is required everywhere unless turned off; sibling isolation (survival 1.0)
/// is required for the listed policy labels.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Properties {
    pub routing: bool,
    pub sibling_isolation: Vec<String>,
}

impl Default for Properties {
    fn default() -> Self {
        Properties {
            routing: true,
            sibling_isolation: Vec::new(),
        }
    }
}

/// Inclusive ranges for swarm testing. Unset: the scenario's own value.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SwarmRanges {
    /// Requests (Poisson, OnOff), conversations, or trace rows.
    pub requests: Option<(u64, u64)>,
    pub fraction: Option<(f64, f64)>,
    /// Draw the storm stage at random per request.
    pub random_stage: bool,
    pub window: Option<(u32, u32)>,
    pub max_num_seqs: Option<(u32, u32)>,
    pub loss: Option<(f64, f64)>,
    pub writer_wait_ms: Option<(f64, f64)>,
}

/// The coverage marks a scenario can declare.
pub const COVERAGE_MARKS: &[&str] = &[
    "stage.before_admission",
    "stage.queued",
    "stage.prefill",
    "stage.decode",
    "stage.after_final_output",
    "stage.after_completion",
    "stage.after_arrival",
    "race.cancel_won",
    "race.completion_won",
    "scope.request",
    "scope.stream",
    "scope.sequence",
    "scope.prefix",
    "scope.engine",
    "evidence.intent",
    "evidence.local_invalidation",
    "evidence.cancel_submission",
    "evidence.backend_observation",
    "evidence.final_callback",
    "evidence.resource_release",
    "release.after_fence",
    "release.corrupted_next_owner",
    "rpc.retry",
    "rpc.lost",
    "rpc.duplicate",
    "rpc.late_callback",
    "rpc.budget_exhausted",
    "rpc.unknown_abort",
    "rpc.fallback",
    "fault",
    "collateral_kill",
    "preemption",
    "playback.blocked",
    "playback.expired",
    "playback.suppressed",
];

fn default_policies() -> Vec<Policy> {
    vec![Policy::PerRequest]
}

fn zero_ms() -> Dist {
    Dist::Constant(0.0)
}

/// A cancellation storm: each request is a target with probability `fraction`; its intent fires
/// when it reaches `stage`, plus `delay_ms`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cancellation {
    /// Probability that a request is a target (ignored when `requests` names them).
    #[serde(default)]
    pub fraction: f64,
    /// Exactly these request ids are targets (the seed protocol's single target, say).
    #[serde(default)]
    pub requests: Vec<u64>,
    #[serde(default)]
    pub stage: Stage,
    #[serde(default = "zero_ms")]
    pub delay_ms: Dist,
}

/// Where in a request's life its cancel intent fires.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Stage {
    /// One of the six lifecycle stages below, uniformly, per request.
    #[default]
    Random,
    /// At arrival, before the request reaches a replica.
    BeforeAdmission,
    /// On entering a replica's waiting queue.
    Queued,
    /// When its first step is dispatched.
    Prefill,
    /// When its first token is out.
    Decode,
    /// When its last token is out, before it is played.
    AfterFinalOutput,
    /// After local completion (its last chunk was played).
    AfterCompletion,
    /// `delay_ms` after arrival, whatever the request is doing then.
    AfterArrival,
}

impl Stage {
    /// The six lifecycle stages of the contract's protocol, in order; `Random` picks among them.
    pub const LIFECYCLE: [Stage; 6] = [
        Stage::BeforeAdmission,
        Stage::Queued,
        Stage::Prefill,
        Stage::Decode,
        Stage::AfterFinalOutput,
        Stage::AfterCompletion,
    ];
}

/// What the adapter does with a cancel intent. Local invalidation is immediate under every
/// policy; they differ in what they ask of the backend.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub enum Policy {
    /// No backend cancel: the work runs to completion and its output is discarded.
    FinishAndDiscard,
    /// A cooperative cancel through the request's own handle.
    PerRequest,
    /// An abort through a wider handle: everything the scope reaches is aborted.
    GroupAbort(GroupScope),
    /// Per-request cancel, falling back to finish-and-discard when the backend cannot observe
    /// (it never checks) or has not observed within `fallback_after_ms` of the intent.
    PerRequestWithFallback { fallback_after_ms: f64 },
}

impl Policy {
    pub fn label(&self) -> String {
        match self {
            Policy::FinishAndDiscard => "finish_and_discard".into(),
            Policy::PerRequest => "per_request".into(),
            Policy::GroupAbort(s) => format!("group_abort_{}", s.label()),
            Policy::PerRequestWithFallback { .. } => "per_request_fallback".into(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum GroupScope {
    /// The shared connection the request travels on.
    Stream,
    /// The request's sequence (its owner's stateful session).
    Sequence,
    /// Every request whose runtime id starts with the target's (SGLang's prefix match).
    Prefix,
    /// The whole engine.
    Engine,
}

impl GroupScope {
    pub fn label(self) -> &'static str {
        match self {
            GroupScope::Stream => "stream",
            GroupScope::Sequence => "sequence",
            GroupScope::Prefix => "prefix",
            GroupScope::Engine => "engine",
        }
    }
}

/// The adapter between the application and the runtime: its cancel RPC and its handles.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdapterConfig {
    /// From intent to the first cancel submission (SGLang's streaming path waits 2 s).
    pub submit_delay_ms: Dist,
    /// One-way latency of a cancel RPC and of its acknowledgement.
    pub rpc_latency_ms: Dist,
    /// Probability that one attempt is lost.
    pub loss: f64,
    /// Probability that one attempt is delivered twice.
    pub duplicate: f64,
    /// An attempt unacknowledged after this long is retried.
    pub timeout_ms: f64,
    /// Attempts at most, all to the same identity (idempotent).
    pub max_attempts: u32,
    /// Shared connections: a request travels on stream `owner % streams`. 0: one per owner.
    pub streams: u64,
    pub identity: IdentityMode,
}

impl Default for AdapterConfig {
    fn default() -> Self {
        AdapterConfig {
            submit_delay_ms: Dist::Constant(0.0),
            rpc_latency_ms: Dist::Constant(0.2),
            loss: 0.0,
            duplicate: 0.0,
            timeout_ms: 50.0,
            max_attempts: 3,
            streams: 0,
            identity: IdentityMode::ServerGenerated,
        }
    }
}

/// Runtime request ids.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum IdentityMode {
    /// Unique, generated by the runtime, tombstoned when terminated (TensorRT-LLM).
    ServerGenerated,
    /// Chosen by the client from a pool of `pool` ids, so they are reused (vLLM, SGLang).
    ClientReused { pool: u64 },
}

/// How the backend observes and cleans up.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BackendConfig {
    pub checkpoint: CheckpointConfig,
    pub release: Release,
    /// What an abort for a request the runtime no longer has does.
    pub cancel_after_completion: AfterCompletion,
    /// Probability that handling one abort faults, and how far the fault reaches.
    pub abort_fault_probability: f64,
    pub abort_fault_radius: Radius,
    /// Offset of the backend's clock from the local one (evidence timestamps carry it).
    pub clock_offset_ms: f64,
}

impl Default for BackendConfig {
    fn default() -> Self {
        BackendConfig {
            checkpoint: CheckpointConfig::EveryStep,
            release: Release::Fenced,
            cancel_after_completion: AfterCompletion::Ignore,
            abort_fault_probability: 0.0,
            abort_fault_radius: Radius::Batch,
            clock_offset_ms: 0.0,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CheckpointConfig {
    EveryStep,
    EveryKSteps(u32),
    Never,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Release {
    Fenced,
    /// Unsafe: blocks return while a dispatched step still writes them.
    Immediate,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum AfterCompletion {
    Ignore,
    Fault(Radius),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Radius {
    Request,
    Batch,
    Engine,
}

/// The playback sink: outputs become audio chunks that pass a clear barrier and a post-wait
/// admission check.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PlaybackConfig {
    /// Tokens per audio chunk.
    pub chunk_tokens: u32,
    /// The writer wait between a chunk being ready and its admission check.
    pub writer_wait_ms: Dist,
    /// From a clear operation to its acknowledgement (the barrier is not clear until then).
    pub clear_ack_ms: Dist,
    /// A held chunk older than this expires its request.
    pub max_age_ms: f64,
    /// Admission retries of a blocked chunk before the sink gives up on the request.
    pub admit_retries: u32,
}

impl Default for PlaybackConfig {
    fn default() -> Self {
        PlaybackConfig {
            chunk_tokens: 8,
            writer_wait_ms: Dist::Constant(0.0),
            clear_ack_ms: Dist::Constant(50.0),
            max_age_ms: 60_000.0,
            admit_retries: 5,
        }
    }
}

fn sixteen() -> u32 {
    16
}

/// Upper bound on the requests of one scenario, so a typo cannot ask for 10^18.
pub const REQUESTS_MAX: u64 = 100_000_000;
pub const REPLICAS_MAX: u32 = 1024;

type Invalid = Result<(), (String, String)>;

fn positive(field: &str, x: f64) -> Invalid {
    if !x.is_finite() || x <= 0.0 {
        return Err((
            field.into(),
            format!("must be a finite number > 0 (got {x})"),
        ));
    }
    Ok(())
}

fn non_negative(field: &str, x: f64) -> Invalid {
    if !x.is_finite() || x < 0.0 {
        return Err((
            field.into(),
            format!("must be a finite number >= 0 (got {x})"),
        ));
    }
    Ok(())
}

fn probability(field: &str, p: f64) -> Invalid {
    if !(0.0..=1.0).contains(&p) {
        return Err((
            field.into(),
            format!("must be a probability in [0, 1] (got {p})"),
        ));
    }
    Ok(())
}

fn in_range(field: &str, x: u64, lo: u64, hi: u64) -> Invalid {
    if x < lo || x > hi {
        return Err((
            field.into(),
            format!("must be between {lo} and {hi} (got {x})"),
        ));
    }
    Ok(())
}

/// A scenario that failed to load: one line, naming the file and where.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadError(pub String);

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for LoadError {}

impl Scenario {
    /// Read and parse a scenario file.
    pub fn load(path: &Path) -> Result<Scenario, LoadError> {
        let shown = path.display().to_string();
        let bytes = std::fs::read(path)
            .map_err(|e| LoadError(format!("{shown}: cannot read scenario: {}", io_reason(&e))))?;
        let text = String::from_utf8(bytes).map_err(|e| {
            LoadError(format!(
                "{shown}: not UTF-8 text (byte {})",
                e.utf8_error().valid_up_to()
            ))
        })?;
        let mut scenario = Scenario::parse(&text, &shown)?;
        scenario.base_dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
        scenario.check_files(&text, &shown)?;
        Ok(scenario)
    }

    /// Files the scenario refers to must exist and be readable.
    fn check_files(&self, text: &str, shown: &str) -> Result<(), LoadError> {
        if let Source::Trace { path, .. } = &self.workload.source {
            let full = self.base_dir.join(path);
            if let Err(e) = std::fs::metadata(&full).and_then(|m| {
                if m.is_file() {
                    Ok(())
                } else {
                    Err(std::io::Error::other("not a file"))
                }
            }) {
                let field = "workload.source.Trace.path";
                let at = locate_field(text, field)
                    .map(|(l, c)| format!(":{l}:{c}"))
                    .unwrap_or_default();
                return Err(LoadError(format!(
                    "{shown}{at}: field `{field}`: cannot read trace {}: {}",
                    full.display(),
                    io_reason(&e)
                )));
            }
        }
        Ok(())
    }

    /// Parse scenario text; `shown` names its origin in messages.
    pub fn parse(text: &str, shown: &str) -> Result<Scenario, LoadError> {
        if text.trim().is_empty() {
            return Err(LoadError(format!("{shown}:1:1: empty scenario file")));
        }
        // Implicit `Some`: optional fields are written as plain values.
        let options = ron::Options::default()
            .with_default_extension(ron::extensions::Extensions::IMPLICIT_SOME);
        let mut de = ron::Deserializer::from_str_with_options(text, &options)
            .map_err(|e| LoadError(format!("{shown}:{}: {}", e.span.start, e.code)))?;
        let parsed: Result<Scenario, _> = serde_path_to_error::deserialize(&mut de);
        let scenario = match parsed {
            Ok(s) => s,
            Err(e) => {
                let path = e.path().to_string();
                let spanned = de.span_error(e.into_inner());
                let field = if path == "." || path == "?" {
                    String::new()
                } else {
                    format!(" (field `{path}`)")
                };
                return Err(LoadError(format!(
                    "{shown}:{}: {}{field}",
                    spanned.span.start, spanned.code
                )));
            }
        };
        de.end().map_err(|e| {
            let spanned = de.span_error(e);
            LoadError(format!("{shown}:{}: {}", spanned.span.start, spanned.code))
        })?;
        scenario.validate().map_err(|(field, msg)| {
            let at = locate_field(text, &field)
                .map(|(l, c)| format!(":{l}:{c}"))
                .unwrap_or_default();
            LoadError(format!("{shown}{at}: field `{field}` {msg}"))
        })?;
        Ok(scenario)
    }

    /// The embedded default scenario.
    pub fn default_embedded() -> Scenario {
        Scenario::parse(DEFAULT_SCENARIO, DEFAULT_SCENARIO_PATH)
            .expect("the embedded default scenario is valid (tested)")
    }

    /// Semantic validation: `(field path, message)` of the first problem.
    pub fn validate(&self) -> Result<(), (String, String)> {
        let err = |f: &str, m: String| Err((f.to_string(), m));
        if self.name.is_empty()
            || !self
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return err(
                "name",
                format!(
                    "must be non-empty and use only letters, digits, '-' and '_' (got {:?})",
                    self.name
                ),
            );
        }
        let l = &self.limits;
        if l.max_events == 0 {
            return err("limits.max_events", "must be > 0".into());
        }
        if l.max_queue_len == 0 {
            return err("limits.max_queue_len", "must be > 0".into());
        }
        if !l.max_time_s.is_finite() || l.max_time_s <= 0.0 {
            return err(
                "limits.max_time_s",
                format!("must be a finite number > 0 (got {})", l.max_time_s),
            );
        }
        if l.max_time_s > 1e9 {
            return err(
                "limits.max_time_s",
                format!("must be <= 1e9 s (got {})", l.max_time_s),
            );
        }
        let w = &self.workload;
        let count = |f: &str, n: u64| {
            if n == 0 || n > REQUESTS_MAX {
                Err((
                    f.to_string(),
                    format!("must be between 1 and {REQUESTS_MAX} (got {n})"),
                ))
            } else {
                Ok(())
            }
        };
        let dist = |f: &str, d: &Dist| d.validate().map_err(|(g, m)| (format!("{f}.{g}"), m));
        match &w.source {
            Source::Poisson {
                rate_per_s,
                requests,
            } => {
                positive("workload.source.Poisson.rate_per_s", *rate_per_s)?;
                count("workload.source.Poisson.requests", *requests)?;
            }
            Source::OnOff {
                rate_on_per_s,
                rate_off_per_s,
                on_ms,
                off_ms,
                requests,
            } => {
                positive("workload.source.OnOff.rate_on_per_s", *rate_on_per_s)?;
                non_negative("workload.source.OnOff.rate_off_per_s", *rate_off_per_s)?;
                dist("workload.source.OnOff.on_ms", on_ms)?;
                dist("workload.source.OnOff.off_ms", off_ms)?;
                if on_ms.mean() <= 0.0 {
                    return err("workload.source.OnOff.on_ms", "must have a mean > 0".into());
                }
                count("workload.source.OnOff.requests", *requests)?;
            }
            Source::Conversations {
                conversations,
                start_rate_per_s,
                turns,
                think_ms,
                requests_per_turn,
                barge_in,
            } => {
                count(
                    "workload.source.Conversations.conversations",
                    *conversations,
                )?;
                positive(
                    "workload.source.Conversations.start_rate_per_s",
                    *start_rate_per_s,
                )?;
                dist("workload.source.Conversations.turns", turns)?;
                dist("workload.source.Conversations.think_ms", think_ms)?;
                if *requests_per_turn == 0 || *requests_per_turn > 64 {
                    return err(
                        "workload.source.Conversations.requests_per_turn",
                        format!("must be between 1 and 64 (got {requests_per_turn})"),
                    );
                }
                if let Some(b) = barge_in {
                    probability(
                        "workload.source.Conversations.barge_in.probability",
                        b.probability,
                    )?;
                    dist(
                        "workload.source.Conversations.barge_in.after_ms",
                        &b.after_ms,
                    )?;
                }
            }
            Source::Trace {
                path,
                speedup,
                sample_fraction,
                ..
            } => {
                if path.is_empty() {
                    return err("workload.source.Trace.path", "must not be empty".into());
                }
                positive("workload.source.Trace.speedup", *speedup)?;
                probability("workload.source.Trace.sample_fraction", *sample_fraction)?;
                if *sample_fraction == 0.0 {
                    return err(
                        "workload.source.Trace.sample_fraction",
                        "must be > 0".into(),
                    );
                }
            }
        }
        dist("workload.prompt_tokens", &w.prompt_tokens)?;
        dist("workload.output_tokens", &w.output_tokens)?;
        if let Some(d) = &w.deadline_ms {
            dist("workload.deadline_ms", d)?;
        }
        if let Some(d) = &w.disconnect_ms {
            dist("workload.disconnect_ms", d)?;
        }
        let c = &self.cluster;
        if c.replicas == 0 || c.replicas > REPLICAS_MAX {
            return err(
                "cluster.replicas",
                format!("must be between 1 and {REPLICAS_MAX} (got {})", c.replicas),
            );
        }
        match &c.profile {
            ProfileRef::Named(name) => {
                if cancelsim_models::gpu::profile(name).is_none() {
                    let known: Vec<&str> = cancelsim_models::gpu::PROFILES
                        .iter()
                        .map(|p| p.name)
                        .collect();
                    return err(
                        "cluster.profile.Named",
                        format!("unknown profile {name:?}; known: {}", known.join(", ")),
                    );
                }
            }
            ProfileRef::Custom {
                c0_ms,
                prefill_tokens_per_s,
                per_seq_us,
                per_kv_token_ns,
                kv_blocks_16,
            } => {
                positive("cluster.profile.Custom.c0_ms", *c0_ms)?;
                non_negative(
                    "cluster.profile.Custom.prefill_tokens_per_s",
                    *prefill_tokens_per_s,
                )?;
                non_negative("cluster.profile.Custom.per_seq_us", *per_seq_us)?;
                non_negative("cluster.profile.Custom.per_kv_token_ns", *per_kv_token_ns)?;
                if *kv_blocks_16 == 0 {
                    return err("cluster.profile.Custom.kv_blocks_16", "must be > 0".into());
                }
            }
        }
        match &c.scheduler {
            Scheduler::Continuous {
                max_num_seqs,
                max_num_batched_tokens,
                block_tokens,
                kv_blocks,
                window,
                ..
            } => {
                let f = "cluster.scheduler.Continuous";
                in_range(
                    &format!("{f}.max_num_seqs"),
                    max_num_seqs.unwrap_or(1) as u64,
                    1,
                    1 << 20,
                )?;
                in_range(
                    &format!("{f}.max_num_batched_tokens"),
                    max_num_batched_tokens.unwrap_or(1) as u64,
                    1,
                    1 << 24,
                )?;
                in_range(&format!("{f}.block_tokens"), *block_tokens as u64, 1, 4096)?;
                in_range(
                    &format!("{f}.kv_blocks"),
                    kv_blocks.unwrap_or(1),
                    1,
                    1 << 32,
                )?;
                in_range(&format!("{f}.window"), *window as u64, 1, 64)?;
            }
            Scheduler::Dynamic {
                max_batch_size,
                max_queue_delay_ms,
                block_tokens,
                kv_blocks,
            } => {
                let f = "cluster.scheduler.Dynamic";
                in_range(
                    &format!("{f}.max_batch_size"),
                    *max_batch_size as u64,
                    1,
                    1 << 16,
                )?;
                non_negative(&format!("{f}.max_queue_delay_ms"), *max_queue_delay_ms)?;
                in_range(&format!("{f}.block_tokens"), *block_tokens as u64, 1, 4096)?;
                in_range(
                    &format!("{f}.kv_blocks"),
                    kv_blocks.unwrap_or(1),
                    1,
                    1 << 32,
                )?;
            }
        }
        if let Some(c) = &self.cancellation {
            probability("cancellation.fraction", c.fraction)?;
            dist("cancellation.delay_ms", &c.delay_ms)?;
        }
        if self.policies.is_empty() {
            return err("policies", "needs at least one policy".into());
        }
        if self.policies.len() > 16 {
            return err(
                "policies",
                format!("at most 16 policies (got {})", self.policies.len()),
            );
        }
        for (i, p) in self.policies.iter().enumerate() {
            if let Policy::PerRequestWithFallback { fallback_after_ms } = p {
                non_negative(
                    &format!("policies[{i}].PerRequestWithFallback.fallback_after_ms"),
                    *fallback_after_ms,
                )?;
            }
        }
        let a = &self.adapter;
        dist("adapter.submit_delay_ms", &a.submit_delay_ms)?;
        dist("adapter.rpc_latency_ms", &a.rpc_latency_ms)?;
        probability("adapter.loss", a.loss)?;
        probability("adapter.duplicate", a.duplicate)?;
        positive("adapter.timeout_ms", a.timeout_ms)?;
        in_range("adapter.max_attempts", a.max_attempts as u64, 1, 100)?;
        if let IdentityMode::ClientReused { pool } = a.identity {
            in_range("adapter.identity.ClientReused.pool", pool, 1, u64::MAX)?;
        }
        let b = &self.backend;
        if let CheckpointConfig::EveryKSteps(k) = b.checkpoint {
            in_range("backend.checkpoint.EveryKSteps", k as u64, 1, 1_000_000)?;
        }
        probability("backend.abort_fault_probability", b.abort_fault_probability)?;
        non_negative("backend.clock_offset_ms", b.clock_offset_ms)?;
        let labels: Vec<String> = self.policies.iter().map(Policy::label).collect();
        for (i, e) in self.expect.iter().enumerate() {
            if e.policy != "*" && !labels.contains(&e.policy) {
                return err(
                    &format!("expect[{i}].policy"),
                    format!(
                        "names no policy of this scenario (got {:?}; have {})",
                        e.policy,
                        labels.join(", ")
                    ),
                );
            }
        }
        for (i, l) in self.properties.sibling_isolation.iter().enumerate() {
            if !labels.contains(l) {
                return err(
                    &format!("properties.sibling_isolation[{i}]"),
                    format!("names no policy of this scenario (got {l:?})"),
                );
            }
        }
        for (i, m) in self.coverage.iter().enumerate() {
            if !COVERAGE_MARKS.contains(&m.as_str()) {
                return err(
                    &format!("coverage[{i}]"),
                    format!("unknown mark {m:?}; known: {}", COVERAGE_MARKS.join(", ")),
                );
            }
        }
        if let Some(r) = &self.swarm {
            let ordered = |f: &str, lo: f64, hi: f64| {
                if !(lo.is_finite() && hi.is_finite() && lo <= hi && lo >= 0.0) {
                    Err((
                        f.to_string(),
                        format!(
                            "must be a range (low, high) with 0 <= low <= high (got ({lo}, {hi}))"
                        ),
                    ))
                } else {
                    Ok(())
                }
            };
            if let Some((a, b)) = r.requests {
                ordered("swarm.requests", a as f64, b as f64)?;
                in_range("swarm.requests", a, 1, REQUESTS_MAX)?;
            }
            if let Some((a, b)) = r.fraction {
                ordered("swarm.fraction", a, b)?;
                probability("swarm.fraction", b)?;
            }
            if let Some((a, b)) = r.window {
                ordered("swarm.window", a as f64, b as f64)?;
                in_range("swarm.window", a as u64, 1, 64)?;
            }
            if let Some((a, b)) = r.max_num_seqs {
                ordered("swarm.max_num_seqs", a as f64, b as f64)?;
                in_range("swarm.max_num_seqs", a as u64, 1, 1 << 20)?;
            }
            if let Some((a, b)) = r.loss {
                ordered("swarm.loss", a, b)?;
                probability("swarm.loss", b)?;
            }
            if let Some((a, b)) = r.writer_wait_ms {
                ordered("swarm.writer_wait_ms", a, b)?;
            }
        }
        let pb = &self.playback;
        in_range("playback.chunk_tokens", pb.chunk_tokens as u64, 1, 1 << 20)?;
        dist("playback.writer_wait_ms", &pb.writer_wait_ms)?;
        dist("playback.clear_ack_ms", &pb.clear_ack_ms)?;
        non_negative("playback.max_age_ms", pb.max_age_ms)?;
        in_range("playback.admit_retries", pb.admit_retries as u64, 0, 1000)?;
        Ok(())
    }

    pub fn limits(&self) -> Limits {
        Limits {
            events_max: self.limits.max_events,
            time_ns_max: crate::dist::ms_to_ns(self.limits.max_time_s * 1000.0),
            queue_len_max: self.limits.max_queue_len,
        }
    }

    /// BLAKE3 of the scenario's canonical RON form (after defaults, before `--seed`), so
    /// formatting and comments do not change it.
    pub fn hash(&self) -> String {
        let canonical = ron::to_string(self).expect("scenario serialises");
        blake3::hash(canonical.as_bytes()).to_hex().to_string()
    }
}

fn io_reason(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::NotFound => "no such file".into(),
        std::io::ErrorKind::PermissionDenied => "permission denied".into(),
        _ => e.to_string(),
    }
}

/// Best-effort `line:column` of a dotted field path in RON text: walks the path, finding each
/// segment's `name:` after the previous one. Enum variant segments (`Poisson`) match `Poisson(`.
fn locate_field(text: &str, field: &str) -> Option<(usize, usize)> {
    let mut from = 0usize;
    let mut found = None;
    for seg in field.split('.') {
        let seg = seg.split('[').next().unwrap_or(seg);
        let pos = find_ident(&text[from..], seg)? + from;
        found = Some(pos);
        from = pos + seg.len();
    }
    let pos = found?;
    let line = text[..pos].matches('\n').count() + 1;
    let col = pos - text[..pos].rfind('\n').map(|i| i + 1).unwrap_or(0) + 1;
    Some((line, col))
}

/// Position of `ident` used as a field name (`ident:`) or variant (`ident(`), as a whole word.
fn find_ident(hay: &str, ident: &str) -> Option<usize> {
    let mut start = 0;
    while let Some(i) = hay[start..].find(ident) {
        let at = start + i;
        let before_ok = at == 0
            || !hay[..at]
                .chars()
                .next_back()
                .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
        let rest = hay[at + ident.len()..].trim_start();
        if before_ok && (rest.starts_with(':') || rest.starts_with('(')) {
            return Some(at);
        }
        start = at + ident.len();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_default_parses_and_validates() {
        let s = Scenario::default_embedded();
        assert!(s.validate().is_ok());
    }

    #[test]
    fn hash_ignores_formatting_but_not_content() {
        let a = Scenario::default_embedded();
        let reformatted = ron::ser::to_string_pretty(&a, Default::default()).unwrap();
        let b = Scenario::parse(&reformatted, "b").unwrap();
        assert_eq!(a.hash(), b.hash());
        let mut c = a.clone();
        c.seed += 1;
        assert_ne!(a.hash(), c.hash());
    }

    #[test]
    fn locate_field_walks_the_path() {
        let text = "S(\n  workload: (\n    arrivals: Poisson(rate_per_s: -1.0),\n  ),\n)";
        assert_eq!(
            locate_field(text, "workload.arrivals.Poisson.rate_per_s"),
            Some((3, 23))
        );
        assert_eq!(locate_field(text, "nope"), None);
    }
}

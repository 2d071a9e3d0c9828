//! The scenario's cancellation sections: the storm, the policies, the adapter, the backend and
//! the playback sink.

use serde::{Deserialize, Serialize};

use super::validate::{self as v, Check};
use crate::dist::Dist;

pub(super) fn default_policies() -> Vec<Policy> {
    vec![Policy::PerRequest]
}

fn zero_ms() -> Dist {
    Dist::Constant(0.0)
}

/// A cancellation storm: each request is a target with probability `fraction`; its intent fires
/// when it reaches `stage`, plus `delay_ms`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
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
    /// A storm in time: only requests arriving in `[from_s, to_s)` are targets. The summary
    /// then says how long admission took to recover from it (`recovery`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_s: Option<(f64, f64)>,
    /// Also run the ideal cancel on the same intents, the baseline of each policy's
    /// `capacity_cost` (one more run per report).
    #[serde(default = "yes", skip_serializing_if = "is_yes")]
    pub ideal_baseline: bool,
    /// NVIDIA AIPerf's `--request-cancellation-rate`: the percentage (0 to 100) of requests
    /// cancelled. Read at load as `fraction: rate / 100, stage: AfterArrival`, so the two
    /// spellings are one scenario (one hash). Not with `fraction`, `requests`, `stage` or
    /// `delay_ms`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_cancellation_rate: Option<f64>,
    /// AIPerf's `--request-cancellation-delay`, in seconds: from the moment the request was fully
    /// sent (its arrival: the simulator sends a request in no time) to its cancel. Default 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_cancellation_delay: Option<f64>,
}

impl Cancellation {
    /// AIPerf's cancel knobs: a percentage and a delay in seconds, instead of the storm's own terms.
    pub(super) fn validate_aiperf(&self) -> Check {
        let c = self;
        let f = "cancellation.request_cancellation_rate";
        match (c.request_cancellation_rate, c.request_cancellation_delay) {
            (None, None) => return Ok(()),
            (None, Some(_)) => {
                let m = "needs `request_cancellation_rate` (AIPerf's delay applies to its rate)";
                return v::err("cancellation.request_cancellation_delay", m.into());
            }
            (Some(rate), delay) => {
                if !(rate.is_finite() && (0.0..=100.0).contains(&rate)) {
                    return v::err(f, format!("must be a percentage in [0, 100] (got {rate})"));
                }
                if let Some(d) = delay {
                    v::non_negative("cancellation.request_cancellation_delay", d)?;
                }
            }
        }
        let own = c.fraction != 0.0
            || !c.requests.is_empty()
            || c.stage != Stage::Random
            || c.delay_ms != Dist::Constant(0.0);
        if own {
            let m =
                "AIPerf's knobs replace `fraction`, `requests`, `stage` and `delay_ms`: use one \
                 spelling or the other";
            return v::err(f, m.into());
        }
        Ok(())
    }

    /// AIPerf's two knobs in the storm's own terms (after validation).
    pub(super) fn normalize(&mut self) {
        if let Some(rate) = self.request_cancellation_rate.take() {
            let delay_s = self.request_cancellation_delay.take().unwrap_or(0.0);
            self.fraction = rate / 100.0;
            self.stage = Stage::AfterArrival;
            self.delay_ms = Dist::Constant(delay_s * 1000.0);
        }
    }
}

fn yes() -> bool {
    true
}

fn is_yes(x: &bool) -> bool {
    *x
}

/// Where in a request's life its cancel intent fires.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
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
    /// A prefill/decode graph only: its prefill is done and its KV handoff to the decode stage
    /// began (the P-to-D gap, before the decode stage knows of it).
    KvTransfer,
    /// A prefill/decode graph only: the decode stage took the request and waits for its KV.
    AwaitingRemoteKv,
}

impl Stage {
    /// The lifecycle of a prefill/decode graph: the six, then the two places of the handoff.
    pub const LIFECYCLE_DISAGGREGATED: [Stage; 8] = [
        Stage::BeforeAdmission,
        Stage::Queued,
        Stage::Prefill,
        Stage::Decode,
        Stage::AfterFinalOutput,
        Stage::AfterCompletion,
        Stage::KvTransfer,
        Stage::AwaitingRemoteKv,
    ];

    pub fn is_handoff(self) -> bool {
        matches!(self, Stage::KvTransfer | Stage::AwaitingRemoteKv)
    }

    /// The six lifecycle stages of the contract's protocol, in order; `Random` picks among them.
    pub const LIFECYCLE: &[Stage] = Stage::LIFECYCLE_DISAGGREGATED.split_at(6).0;
}

/// What the adapter does with a cancel intent. Local invalidation is immediate under every
/// policy; they differ in what they ask of the backend.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
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
    /// The ideal cancel, a reference rather than a runtime: each intent reaches the backend at
    /// once and is applied at once, whatever the adapter, the transport and the checkpoints; the
    /// request's blocks come back at once and no later step includes it. Every report with
    /// cancel intents also runs it as a baseline (see `capacity_cost`).
    Ideal,
}

impl Policy {
    pub fn label(&self) -> String {
        match self {
            Policy::FinishAndDiscard => "finish_and_discard".into(),
            Policy::PerRequest => "per_request".into(),
            Policy::GroupAbort(s) => format!("group_abort_{}", s.label()),
            Policy::PerRequestWithFallback { .. } => "per_request_fallback".into(),
            Policy::Ideal => "ideal".into(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
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
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
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
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub enum IdentityMode {
    /// Unique, generated by the runtime, tombstoned when terminated (TensorRT-LLM).
    ServerGenerated,
    /// Chosen by the client from a pool of `pool` ids, so they are reused (vLLM, SGLang).
    ClientReused { pool: u64 },
}

/// How the backend observes and cleans up.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
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

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub enum CheckpointConfig {
    EveryStep,
    EveryKSteps(u32),
    Never,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub enum Release {
    Fenced,
    /// Unsafe: blocks return while a dispatched step still writes them.
    Immediate,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub enum AfterCompletion {
    Ignore,
    Fault(Radius),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub enum Radius {
    Request,
    Batch,
    Engine,
}

/// The playback sink: outputs become audio chunks that pass a clear barrier and a post-wait
/// admission check.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
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

//! What a run records besides its summary, for files and plots: per-request rows, gauge samples,
//! Chrome trace events and CDF points. A leaf: the output side (`report`, `plots`) reads these
//! types and never the simulation's.

use std::collections::BTreeMap;

use serde::Serialize;

/// One sample of the system's gauges, on the virtual clock (summed over replicas).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Sample {
    pub t_s: f64,
    pub kv_blocks: u64,
    /// Blocks held by requests with a cancel intent.
    pub kv_retained: u64,
    pub queue: u64,
    pub running: u64,
    /// Cancels whose backend has neither observed them nor released the request.
    pub cancels_in_flight: u64,
    /// Blocks pinned for the handoff on the prefill and on the decode replicas (0 when
    /// colocated).
    pub kv_pinned_prefill: u64,
    pub kv_pinned_decode: u64,
}

/// One pool's gauges at a sample of a prefill/decode graph (summed over its replicas), in
/// `pools.csv`: `pool` indexes the summary's `pools`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct PoolSample {
    pub t_s: f64,
    pub pool: u32,
    pub kv_blocks: u64,
    pub kv_retained: u64,
    /// Blocks pinned for the handoff: kept for transfers (prefill), receiving (decode).
    pub kv_pinned: u64,
    pub queue: u64,
    pub running: u64,
}

/// One request's record, as `requests.csv` writes it. Times are virtual milliseconds from the
/// start of the run; an empty cell is unknown, never zero.
#[derive(Clone, Debug, Serialize)]
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
    /// The prompt, a conversation's history included.
    pub prompt_tokens: u32,
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
    /// From arrival to the first step that included it (vidur's scheduling delay); empty if
    /// no step ever did.
    pub scheduling_delay_ms: Option<f64>,
    /// Times it was preempted and its context recomputed.
    pub restarts: u32,
}

/// One durable agent job's status as it left, as `jobs.csv` writes it: what the job reported
/// (its usage metadata) beside the truth. Times are virtual ms from the start of the run; an
/// empty cell is none (a job without a cleanup has no cleanup figures).
#[derive(Clone, Debug, Serialize)]
pub struct JobRow {
    pub policy: String,
    pub job: u64,
    /// `completed`, `cancelled`, `expired` or `failed`.
    pub status: &'static str,
    pub accepted_ms: f64,
    /// Its terminal decision, or its completion.
    pub ended_ms: f64,
    pub deadline_ms: f64,
    pub provider_attempts: u32,
    /// What the job observed (its reported usage: a lower bound unless `usage_complete`).
    pub observed_input_tokens: u64,
    pub observed_output_tokens: u64,
    pub true_input_tokens: u64,
    pub true_output_tokens: u64,
    pub usage_complete: bool,
    /// With prices in the job spec: its cost as reported (a lower bound unless
    /// `cost_complete`), and as the GPUs computed it. Empty: unavailable.
    pub reported_cost_usd: Option<f64>,
    pub true_cost_usd: Option<f64>,
    pub cost_complete: Option<bool>,
    pub effects_completed: u64,
    pub effects_unknown: u64,
    /// Effects of developer-hosted tools whose results came after the decision (rejected).
    pub effects_awaiting_external: u64,
    /// Its worker's cleanup, if it had one: whether it was complete (`false` asks for an
    /// operator), its reason (`run_cancelled`, `run_expired`), and why it fell short:
    /// `allowances_exceeded` (it needed more than it had) or `gave_up` (its worker ran out of
    /// time).
    pub cleanup_complete: Option<bool>,
    pub cleanup_reason: Option<&'static str>,
    pub cleanup_shortfall: Option<&'static str>,
    pub cleanup_ms: Option<f64>,
    pub allowances_used: Option<u32>,
    /// GPU work of its calls after its decision.
    pub leaked_gpu_ms: f64,
}

/// Where a run streams its per-request rows (a CSV file, say). Rows arrive as requests leave,
/// and, with durable agent jobs, a job's row as it leaves.
pub trait RequestSink {
    fn row(&mut self, row: &RequestRow);
    fn job(&mut self, _row: &JobRow) {}
    /// Flush, and report any write error held back so far.
    fn finish(&mut self) -> Result<(), String> {
        Ok(())
    }
}

/// The arguments of a trace event, as Perfetto shows them.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(untagged)]
pub enum TraceArgs {
    Step {
        step: u64,
    },
    Request {
        request: u64,
    },
    /// A request's async track ends: how it ended.
    Outcome {
        disposition: &'static str,
        sibling: bool,
        survived: Option<bool>,
    },
    Name {
        name: String,
    },
    SortIndex {
        sort_index: u32,
    },
}

/// One Chrome Trace Event. Integer microseconds; absent fields are not written.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TraceEvent {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cat: Option<&'static str>,
    pub ph: &'static str,
    pub pid: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tid: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ts: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dur: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<u64>,
    /// Flow binding point (`"e"`: the enclosing slice).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bp: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub args: Option<TraceArgs>,
}

impl TraceEvent {
    /// An event of phase `ph` at `ts_us` on thread `tid` of process `pid`, nothing else set.
    pub fn at(ph: &'static str, name: impl Into<String>, pid: u32, tid: u32, ts_us: u64) -> Self {
        TraceEvent {
            name: name.into(),
            cat: None,
            ph,
            pid,
            tid: Some(tid),
            ts: Some(ts_us),
            dur: None,
            id: None,
            bp: None,
            args: None,
        }
    }

    /// A metadata record (`ph: "M"`) naming or ordering a process or thread.
    pub fn meta(name: &'static str, pid: u32, tid: Option<u32>, args: TraceArgs) -> Self {
        TraceEvent {
            tid,
            ts: None,
            args: Some(args),
            ..TraceEvent::at("M", name, pid, 0, 0)
        }
    }
}

/// Where runs stream their Chrome trace events (a file, say), in the order recorded. Events
/// are not held in memory.
pub trait TraceSink {
    fn event(&mut self, ev: &TraceEvent);
    /// End the trace: name each run's process (`(pid, name)`) and add `other` as its
    /// `otherData`. Reports any write error held back, or a malformed trace.
    fn close(&mut self, runs: &[(u32, String)], other: serde_json::Value) -> Result<(), String>;
}

/// What one run's trace kept: events are kept whole per step and per request, in recording
/// order, until `TRACE_EVENTS_MAX`; everything after is dropped and counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TraceLog {
    pub kept: u64,
    pub dropped: u64,
    /// Virtual time of the first event dropped, in µs: the trace covers the run up to it.
    pub cut_at_us: Option<u64>,
}

/// Trace events kept per run by default: about 40 MB of `trace.json` per run, which Perfetto
/// opens.
pub const TRACE_EVENTS_MAX: usize = 400_000;
/// The trace thread of the cancel flows' marker slices.
pub const CANCELS_TID: u32 = 1_000_000;
/// Sibling pairs kept per run for plots, at most.
pub const PAIRS_MAX: usize = 50_000;
/// Time-series samples kept per run, at most (sampling stops there).
pub const SAMPLES_MAX: usize = 100_000;
/// Pool samples (`pools.csv` rows) kept per run, at most: 56 MB. Sampling the pools stops
/// where the next sample's pools would not fit (a graph has at most 62 pools).
pub const POOL_SAMPLES_MAX: usize = 1_000_000;

/// What a run gives besides its summary, for files and plots.
#[derive(Default)]
pub struct Extras {
    pub timeseries: Vec<Sample>,
    /// On a prefill/decode graph, each pool's gauges at every sample of `timeseries`, pool by
    /// pool within a sample.
    pub pool_timeseries: Vec<PoolSample>,
    /// (counterfactual TTFT, this run's TTFT) of siblings, in ms (the first `PAIRS_MAX`).
    pub sibling_ttft_ms: Vec<(f64, f64)>,
    /// Per evidence level, (latency ms, cumulative fraction) points of the cleanup-latency CDF.
    pub cleanup_cdf_ms: BTreeMap<String, Vec<(f64, f64)>>,
    /// With a storm in time: (arrival second, mean admission latency ms) per bin with
    /// admissions, in order, for the recovery plot.
    pub admission_bins_ms: Vec<(f64, f64)>,
    /// What the trace kept, when a trace was recorded.
    pub trace: Option<TraceLog>,
    /// What rode the replicas' streaks: how fast, never what (no answer depends on it).
    pub streak: StreakCounts,
}

/// Tokens a replica advanced in its streak and handed over later (`Implicit`), rather than
/// one output each. A check that the fast path ran, never part of a summary.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StreakCounts {
    /// Tokens handed over, all hand-overs together.
    pub tokens: u64,
    /// Of those, tokens handed over because a cancel intent asked for them.
    pub tokens_at_intent: u64,
}

/// Recording options of a run. The sinks are borrowed: whoever opened them closes them.
#[derive(Default)]
pub struct Recording<'r> {
    /// Sample the gauges every this many virtual ns (0: never).
    pub sample_ns: u64,
    pub sink: Option<&'r mut (dyn RequestSink + 'static)>,
    /// Where trace events go; none, no trace.
    pub trace: Option<&'r mut (dyn TraceSink + 'static)>,
    /// Trace events kept per run, at most (`TRACE_EVENTS_MAX` unless asked otherwise).
    pub trace_events_max: u64,
    /// Process id of this run in a shared trace.
    pub trace_pid: u32,
    /// Told, now and then, how many requests have arrived in this run (a progress bar). It only
    /// observes: a run is the same with it or without it.
    pub progress: Option<Progress>,
}

/// A progress callback: (this run's index in the report, requests arrived so far in it).
pub type Progress = std::sync::Arc<dyn Fn(u32, u64) + Send + Sync>;

/// Events between two progress calls.
pub const PROGRESS_EVERY_EVENTS: u64 = 1 << 14;

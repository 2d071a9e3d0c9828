//! What a run reports: the summary types (the `summary.json` keys). The accumulators behind
//! them are in `stats`.

use std::collections::BTreeMap;

use serde::Serialize;

pub use crate::stats::LatencyMs;

/// A policy's run against the ideal cancel's, in the same report (`capacity::CapacityCost::of`
/// computes it): what the policy costs the system beyond cancelling perfectly.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct CapacityCost {
    /// GPU busy time beyond the ideal's, over all replicas.
    pub gpu_busy_s: f64,
    /// Time to the last completion beyond the ideal's.
    pub makespan_s: f64,
    /// Completed requests per second short of the ideal's.
    pub goodput_rps: f64,
    /// Delivered output tokens per second short of the ideal's.
    pub output_tokens_per_s: f64,
    /// Siblings' TTFT and E2E p99 beyond the ideal's (both as deltas from the counterfactual,
    /// so their difference is the quantiles' difference).
    pub sibling_ttft_p99_ms: f64,
    pub sibling_e2e_p99_ms: f64,
}

/// Little's law, measured two ways: L as the time average of the requests in the world's slab
/// (integrated event by event by the run loop), and λ·W from the books' arrival count and each
/// request's time in system (taken when it left).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LittlesLaw {
    pub lambda_per_s: f64,
    pub mean_in_system: f64,
    pub mean_e2e_s: f64,
    /// |L − λW| / L.
    pub relative_gap: f64,
}

/// Dispositions with their denominators. `completed + cancelled + expired + rejected =
/// scheduled`.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct RequestCounts {
    /// Arrived.
    pub scheduled: u64,
    /// Accepted by a replica.
    pub admitted: u64,
    /// Dispatched on a GPU at least once.
    pub started: u64,
    pub completed: u64,
    pub cancelled: u64,
    pub expired: u64,
    /// Requests whose resources were not confirmed released at the end of the run: held at
    /// their intent with no release evidence when they left, or KV blocks of theirs that a
    /// prefill/decode handoff still held with no lease to return them.
    pub cleanup_pending: u64,
    /// Requests with an intent, held by a backend at it, whose cancel the backend never
    /// observed (lost, unobservable, out of retries, or never sent: finish-and-discard). Their
    /// work may have run on and been released at its end.
    pub never_observed: u64,
    /// Refused by a replica (could never fit).
    pub rejected: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct LeakCauses {
    /// Steps already dispatched when the backend observed the cancel.
    pub in_flight_window: f64,
    /// Work between the intent and the backend's observation: transport, submission delay and
    /// checkpoints that did not look.
    pub checkpoint_delay: f64,
    /// Work of a cancel the backend never observed (lost, unobservable, after the retry budget).
    pub unobserved_or_lost: f64,
    /// Work the policy chose to let run.
    pub finish_and_discard: f64,
}

/// GPU work spent for a request after its cancel intent.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct LeakedWork {
    /// Tokens computed in steps that ended after the intent.
    pub token_steps: u64,
    /// The time share of those steps after the intent, in GPU-seconds.
    pub gpu_s: f64,
    /// `gpu_s` split by cause (GPU-seconds).
    pub by_cause: LeakCauses,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct SiblingSurvival {
    /// Requests without an intent of their own that shared a step, a handle scope or a fault
    /// with a request that had one.
    pub siblings: u64,
    /// Of those, the ones with the same disposition and byte-identical output as in the
    /// counterfactual run.
    pub survived: u64,
    pub rate: f64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct LatencyDeltaMs {
    pub ttft_p50: f64,
    pub ttft_p99: f64,
    pub e2e_p50: f64,
    pub e2e_p99: f64,
    /// Siblings compared (completed in both runs).
    pub pairs: u64,
}

/// Resources held after intent.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Retained {
    pub kv_block_s: f64,
    /// Most blocks held at once on one replica by requests with an intent.
    pub peak_blocks: u64,
    /// Admissions refused for want of blocks while requests with an intent held some.
    pub admission_stalls: u64,
}

/// Cleanup latency from intent to one evidence level, over requests with an intent.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct LevelLatencyMs {
    pub count: u64,
    pub p50: f64,
    pub p99: f64,
    pub max: f64,
    /// Requests with an intent for which this level never happened (unknown, never zero).
    pub unknown: u64,
    /// Requests whose intent came after they completed, for which this level did not happen:
    /// there was nothing left to cancel, so it is not missing evidence.
    pub not_applicable: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Gpu {
    pub steps: u64,
    pub busy_s: f64,
    /// Busy time over (replicas × virtual time).
    pub utilisation: f64,
    /// Tokens computed, summed over steps (prefill chunk tokens + decode slots).
    pub token_steps: u64,
    /// GPU-seconds shared to requests' own steps (each step's time split by tokens).
    pub gpu_s_requests: f64,
    /// GPU-seconds of discarded work (window overshoot, preempted in-flight samples, aborted
    /// requests' in-flight steps).
    pub gpu_s_discarded: f64,
    /// GPU-seconds of padding in shared batches.
    pub gpu_s_padding: f64,
    pub tokens_generated: u64,
    pub tokens_discarded: u64,
    pub padding_token_steps: u64,
    pub preemptions: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Kv {
    pub block_s: f64,
    /// Largest number of blocks in use at once on any replica.
    pub peak_blocks: u64,
    pub allocated_blocks: u64,
    pub freed_blocks: u64,
    /// Prompt tokens looked up in the prefix cache at admission (recomputes included), and
    /// those found cached; the hit rate is their ratio (0 without lookups).
    pub prefix_query_tokens: u64,
    pub prefix_hit_tokens: u64,
    pub prefix_hit_rate: f64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct WorkloadEvents {
    pub conversations: u64,
    pub turns: u64,
    /// Barge-ins that superseded a generation still in progress.
    pub interruptions: u64,
    /// Requests whose generation was superseded before they completed.
    pub superseded_requests: u64,
    /// Requests whose deadline fired before they completed.
    pub deadlines_missed: u64,
    /// Clients that disconnected before their request completed.
    pub disconnects: u64,
    /// Requests the storm picked as targets.
    pub storm_targets: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Playback {
    pub chunks: u64,
    pub submitted: u64,
    /// Chunks whose request became terminal during the writer wait.
    pub suppressed: u64,
    pub blocked: u64,
    /// Requests the sink gave up on after `admit_retries` blocked admissions.
    pub gave_up: u64,
    /// Chunks whose age exceeded `max_age_ms` at admission (the request expired).
    pub expired: u64,
    /// Chunks delivered to a consumer that were not its own request's markers (property 3).
    pub routing_violations: u64,
    /// Requests that delivered a corrupted marker (reuse of blocks still being written).
    pub corrupted_requests: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct CancelRpc {
    pub intents: u64,
    pub attempts: u64,
    pub lost: u64,
    pub duplicates: u64,
    pub acks: u64,
    /// Acknowledgements after the retry budget: recorded as late evidence, never reopening.
    pub late_callbacks: u64,
    pub budget_exhausted: u64,
    pub fallbacks: u64,
    /// Aborts that reached no live request (after completion, or lost to id reuse).
    pub unknown_aborts: u64,
    pub faults: u64,
    /// Requests terminated by the backend without an intent of their own (group scope, faults,
    /// reused ids).
    pub collateral_kills: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Targets {
    pub completed: u64,
    pub cancelled: u64,
    pub expired: u64,
    /// Refused at arrival (a prompt no replica's pool can ever hold): never cancelled, since
    /// nothing ran.
    pub rejected: u64,
}

/// One side's books in `summary.json`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct SideStats {
    /// Blocks × seconds held by the cleanup owner after the stage's own work ended.
    pub retained_block_s: f64,
    pub retained_blocks_peak: u64,
    /// Blocks still held when the run ended: never returned.
    pub blocks_never_returned: u64,
    pub returned_completed: u64,
    pub returned_cancelled: u64,
    pub returned_lease: u64,
    /// Admissions refused for want of blocks while blocks were pinned for the handoff, on this
    /// stage's replicas.
    pub admission_stalls: u64,
}

/// One pool (a Prefill or Decode stage) of a prefill/decode graph, in `summary.json`.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct PoolSummary {
    pub name: String,
    /// `prefill` or `decode`.
    pub role: &'static str,
    pub replicas: u32,
    pub gpu_busy_s: f64,
    pub steps: u64,
    pub preemptions: u64,
    pub tokens_delivered: u64,
    pub prefix_query_tokens: u64,
    pub prefix_hit_tokens: u64,
    /// Admissions refused for want of blocks while blocks were pinned for the handoff.
    pub admission_stalls: u64,
    /// KV bytes its transfers carried: sent by a prefill pool, received by a decode pool.
    pub transfer_bytes: u64,
}

/// The handoff's books in `summary.json`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct HandoffStats {
    pub transfers_started: u64,
    pub transfers_done: u64,
    pub transfers_cancelled: u64,
    /// Failed transfers: the decode side computed the prompt again.
    pub transfers_failed: u64,
    /// Requests whose prompt KV the prefill side gave back (its lease ran out) before their
    /// transfer could start: the decode side computed the prompt again, with no transfer.
    pub kv_released_before_transfer: u64,
    pub transfer_bytes: u64,
    /// Prompt tokens whose KV the decode side had cached already: not sent.
    pub transfer_tokens_cached: u64,
    /// Requests prefilled on their decode replica (`handoff.conditional`): no transfer.
    pub local_prefills: u64,
    pub transfer_wait_s: f64,
    /// Cancelled in the final prefill step, and aborted at its boundary.
    pub aborted_at_boundary: u64,
    /// Dropped by the router after prefill (cancelled before the decode stage took it): the
    /// prefill side's blocks wait for a notice that never comes.
    pub stranded: u64,
    /// Took a decode-side abort while its KV was on the way.
    pub aborted_awaiting_kv: u64,
    pub notices_lost: u64,
    /// Second completions that faulted a decode engine.
    pub second_completion_faults: u64,
    pub receive_waits: u64,
    /// Prefill engines wedged by a cancelled transfer, killed by the hang detector, and the
    /// time they spent wedged in all (to the end of the run for one never killed).
    pub wedges: u64,
    pub hang_kills: u64,
    pub wedge_s: f64,
    pub prefill: SideStats,
    pub decode: SideStats,
}

/// Time to recover from a storm in time (`cancellation.window_s`); the definition is in
/// ARCHITECTURE.md ("Time to recover").
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Recovery {
    pub storm_from_s: f64,
    pub storm_to_s: f64,
    /// Mean admission latency of the requests that arrived before the storm.
    pub level_ms: f64,
    /// A one-second arrival bin above this is degraded: the worst pre-storm bin + 10 %, at
    /// least the level + 1 ms.
    pub threshold_ms: f64,
    /// The worst bin's mean admission latency from the storm's start on.
    pub worst_bin_ms: f64,
    /// A bin after the last degraded one had arrivals, and was not degraded.
    pub recovered: bool,
    /// From the storm's start to the end of the last degraded bin (0: none was).
    pub time_to_recover_s: f64,
}

/// Outputs that end at a stop string (`workload.stop_strings`; catalogue S14).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct StopStats {
    /// Requests whose output ended at a stop string.
    pub requests: u64,
    /// Tokens the engine delivered past a stop string before the frontend's abort stopped it
    /// (discarded; the steps already in flight then are in `gpu.gpu_s_discarded`).
    pub overrun_tokens: u64,
    /// The frontend's aborts that an engine observed (the rest came after it had finished).
    pub aborts_observed: u64,
}

/// Everything one run of one policy reports.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Summary {
    pub scenario: String,
    pub scenario_hash: String,
    pub seed: u64,
    pub version: String,
    /// The policy of this run, or `counterfactual` for the run without cancellations.
    pub policy: String,
    pub requests: RequestCounts,
    pub leaked_work: LeakedWork,
    pub late_output_discards: u64,
    pub late_outputs_admitted: u64,
    pub sibling_survival: SiblingSurvival,
    pub sibling_latency_delta_ms: LatencyDeltaMs,
    pub retained: Retained,
    pub cleanup_latency_ms: BTreeMap<String, LevelLatencyMs>,
    pub ttft_ms: LatencyMs,
    pub tpot_ms: LatencyMs,
    pub e2e_ms: LatencyMs,
    pub throughput_rps: f64,
    pub output_tokens_per_s: f64,
    /// Time to the last completion.
    pub makespan_s: f64,
    /// Against the ideal cancel (policy runs of a report with intents only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capacity_cost: Option<CapacityCost>,
    pub gpu: Gpu,
    pub kv: Kv,
    pub workload: WorkloadEvents,
    pub playback: Playback,
    pub cancel_rpc: CancelRpc,
    /// Storm targets by final disposition.
    pub targets: Targets,
    /// How often each rare path was hit (`check` fails a scenario whose declared marks stay 0).
    pub coverage: BTreeMap<String, u64>,
    pub littles_law: LittlesLaw,
    /// Durable agent jobs, with a `Jobs` source only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub jobs: Option<JobsSummary>,
    /// The prefill-to-decode handoff, in a disaggregated graph only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub handoff: Option<HandoffStats>,
    /// Each pool of a prefill/decode graph: its stage's replicas' books.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub pools: Vec<PoolSummary>,
    /// Outputs that end at a stop string, when the workload has them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stop_strings: Option<StopStats>,
    /// Time to recover from a storm in time, when the scenario has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recovery: Option<Recovery>,
    /// The KV-aware router's books, with a `KvAware` router only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub router: Option<crate::world::KvRouterStats>,
    /// The same router's books at a prefill/decode graph's decode stage, when it scores the
    /// decode replicas (their pools cache prefixes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub router_decode: Option<crate::world::KvRouterStats>,
    pub events: u64,
    pub virtual_time_s: f64,
    /// BLAKE3 of every arrival `(id, time, prompt, output)` in order: equal across runs that
    /// share a workload (common random numbers), whatever the scheduler or policy.
    pub workload_hash: String,
    pub run_hash: String,
}

/// The `jobs` section of `summary.json`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct JobsSummary {
    pub accepted: u64,
    pub completed: u64,
    pub cancelled: u64,
    pub expired: u64,
    /// A provider call ran out of attempts.
    pub failed: u64,
    /// Cancels that found the job already completed: the completion won the race.
    pub completion_won: u64,
    /// Cancels sent again with the same idempotency key (each changed nothing).
    pub cancel_duplicates: u64,
    /// Observers that left a running job; of those, the jobs run inline that it cancelled (a
    /// durable job runs on).
    pub observers_left: u64,
    pub observer_cancels: u64,
    /// Provider attempts journalled before dispatch, every job's.
    pub provider_attempts: u64,
    pub notifications_lost: u64,
    /// Decisions the worker's poll found before the notification came.
    pub poll_first: u64,
    pub cleanups: u64,
    /// Cleanups that ran out of allowances: they keep their dispatch fence.
    pub cleanup_incomplete: u64,
    /// From the terminal decision to the end of a complete cleanup.
    pub cleanup_ms: LatencyMs,
    pub allowances_used_p99: u32,
    /// GPU work of the jobs' calls after their jobs' terminal decisions.
    pub leaked_gpu_s: f64,
    pub effects_completed: u64,
    pub effects_unknown: u64,
    /// Results (a provider call's, a tool's) that came after the decision: journalled, never
    /// admitted.
    pub late_observations: u64,
    /// Every job's input and output tokens: what the GPUs computed for it, and what it reported.
    pub true_tokens: u64,
    pub reported_tokens: u64,
    /// True minus reported tokens, over cancelled and expired jobs.
    pub usage_gap_tokens: u64,
    /// Jobs whose usage is complete (reported equals true).
    pub usage_complete: u64,
    /// With developer-hosted tools in the plan only: effects whose results came as submissions
    /// after the decision (rejected; the external system holds the truth), and those
    /// submissions.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub effects_awaiting_external: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rejected_submissions: Option<u64>,
    /// With `prices` in the job spec only: every job's cost as it reported it (a lower bound for
    /// the jobs whose usage is incomplete) and as the GPUs computed it, and the jobs whose cost
    /// is complete.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reported_cost_usd: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub true_cost_usd: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost_complete: Option<u64>,
    /// What the observers that left saw again, with an `observer` in the job spec.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub observers: Option<ObserversSummary>,
}

/// The `jobs.observers` section: observers that left and came back (a GET of the job's
/// events), what the retained events gave them, and the results nobody observed.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ObserversSummary {
    /// Observers that reconnected (or will, after their job left: the retained events answer).
    pub reconnects: u64,
    /// Of those, the ones that found their job still running and followed it on.
    pub resumed_live: u64,
    /// The ones replayed the job's terminal result from its retained events; of those, the
    /// results that were an interruption (cancelled, expired, failed).
    pub replays: u64,
    pub replayed_interruptions: u64,
    /// Reconnects later than the retention: the events were gone.
    pub too_late: u64,
    /// Jobs whose terminal result no observer saw (the observer left and never came back in
    /// time).
    pub results_unobserved: u64,
}

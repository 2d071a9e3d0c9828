//! What a run reports: the summary types (the `summary.json` keys) and the streaming
//! accumulators behind them.

use std::collections::BTreeMap;

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::kernel::{NS_PER_MS, NS_PER_S};

/// Quantiles of a latency, in milliseconds.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LatencyMs {
    pub count: u64,
    pub mean: f64,
    /// Half-width of a 95 % confidence interval on the mean, by batch means over completion
    /// order (NaN with too few samples).
    pub mean_ci95: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
}

/// Values kept for exact quantiles, per statistic (2 MB of `u64`s at most each); past this, the
/// 3-significant-digit histogram answers (within 0.1 %).
pub const EXACT_MAX: usize = 1 << 18;

/// Number of batches for batch-means confidence intervals.
const BATCHES: usize = 32;

/// Running statistics of one latency. Batch k holds completions k·B .. (k+1)·B−1, where B doubles
/// (merging batches pairwise) whenever the batches fill, so the batch count stays bounded without
/// knowing the run length.
pub struct LatencyStats {
    /// Every value, while there are at most `EXACT_MAX`: quantiles are then exact.
    exact: Option<Vec<u64>>,
    /// Beyond that, quantiles come from here (3 significant digits).
    hist: Histogram<u64>,
    pub sum_ns: u128,
    pub count: u64,
    batch_sum_ns: [u128; BATCHES],
    batch_len: u64,
    filled: usize,
    current_n: u64,
}

impl Default for LatencyStats {
    fn default() -> Self {
        Self::new()
    }
}

impl LatencyStats {
    pub fn new() -> Self {
        LatencyStats {
            exact: Some(Vec::new()),
            hist: Histogram::new_with_bounds(1, 10_000_000 * NS_PER_S, 3).expect("valid bounds"),
            sum_ns: 0,
            count: 0,
            batch_sum_ns: [0; BATCHES],
            batch_len: 1,
            filled: 0,
            current_n: 0,
        }
    }

    pub fn record(&mut self, value_ns: u64) {
        self.hist.saturating_record(value_ns.max(1));
        if let Some(v) = &mut self.exact {
            match v.len() < EXACT_MAX {
                true => v.push(value_ns),
                false => self.exact = None,
            }
        }
        self.sum_ns += value_ns as u128;
        self.count += 1;
        self.batch_sum_ns[self.filled] += value_ns as u128;
        self.current_n += 1;
        if self.current_n == self.batch_len {
            self.filled += 1;
            self.current_n = 0;
            if self.filled == BATCHES {
                for k in 0..BATCHES / 2 {
                    self.batch_sum_ns[k] = self.batch_sum_ns[2 * k] + self.batch_sum_ns[2 * k + 1];
                }
                self.batch_sum_ns[BATCHES / 2..].fill(0);
                self.filled = BATCHES / 2;
                self.batch_len *= 2;
            }
        }
    }

    /// `points` + 1 points (value ms, cumulative fraction) of the distribution, from 0 to 1.
    pub fn cdf_ms(&self, points: u32) -> Vec<(f64, f64)> {
        if self.count == 0 {
            return Vec::new();
        }
        let sorted = self.sorted();
        (0..=points)
            .map(|i| {
                let q = i as f64 / points as f64;
                (
                    self.quantile_ns(sorted.as_deref(), q) as f64 / NS_PER_MS as f64,
                    q,
                )
            })
            .collect()
    }

    /// The values in order, if every one was kept.
    fn sorted(&self) -> Option<Vec<u64>> {
        let mut v = self.exact.clone()?;
        v.sort_unstable();
        Some(v)
    }

    /// Quantile `q`: nearest rank over every value if kept, else the histogram's.
    fn quantile_ns(&self, sorted: Option<&[u64]>, q: f64) -> u64 {
        match sorted {
            Some(xs) if !xs.is_empty() => {
                let rank = ((q * xs.len() as f64).ceil() as usize).clamp(1, xs.len());
                xs[rank - 1]
            }
            _ => self.hist.value_at_quantile(q),
        }
    }

    pub fn summary(&self) -> LatencyMs {
        let ms = |ns: f64| ns / NS_PER_MS as f64;
        if self.count == 0 {
            return LatencyMs {
                count: 0,
                mean: 0.0,
                mean_ci95: 0.0,
                p50: 0.0,
                p90: 0.0,
                p99: 0.0,
                max: 0.0,
            };
        }
        let mean_ns = self.sum_ns as f64 / self.count as f64;
        let means: Vec<f64> = (0..self.filled)
            .map(|b| self.batch_sum_ns[b] as f64 / self.batch_len as f64)
            .collect();
        let ci95_ns = if means.len() >= 8 {
            let k = means.len() as f64;
            let m = means.iter().sum::<f64>() / k;
            let var = means.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / (k - 1.0);
            t95(means.len() - 1) * (var / k).sqrt()
        } else {
            f64::NAN
        };
        let sorted = self.sorted();
        let q = |p: f64| ms(self.quantile_ns(sorted.as_deref(), p) as f64);
        LatencyMs {
            count: self.count,
            mean: ms(mean_ns),
            mean_ci95: ms(ci95_ns),
            p50: q(0.50),
            p90: q(0.90),
            p99: q(0.99),
            max: q(1.0),
        }
    }
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
    pub capacity_cost: Option<crate::capacity::CapacityCost>,
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
    /// The prefill-to-decode handoff, in a disaggregated graph only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub handoff: Option<HandoffStats>,
    /// Outputs that end at a stop string, when the workload has them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stop_strings: Option<StopStats>,
    /// Time to recover from a storm in time, when the scenario has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recovery: Option<Recovery>,
    pub events: u64,
    pub virtual_time_s: f64,
    /// BLAKE3 of every arrival `(id, time, prompt, output)` in order: equal across runs that
    /// share a workload (common random numbers), whatever the scheduler or policy.
    pub workload_hash: String,
    pub run_hash: String,
}

/// Quantile of a sorted slice (nearest rank).
pub fn quantile_sorted(xs: &[i64], q: f64) -> i64 {
    if xs.is_empty() {
        return 0;
    }
    let rank = ((q * xs.len() as f64).ceil() as usize).clamp(1, xs.len());
    xs[rank - 1]
}

/// Two-sided 95 % Student t quantile with `df` degrees of freedom (NaN for 0): the table up to
/// 30, then the Cornish–Fisher expansion around the normal quantile, within 1e-4 of the exact
/// value from there on. The one t quantile of the project: batch-means intervals and `compare`
/// both use it.
pub fn t95(df: usize) -> f64 {
    const T: [f64; 30] = [
        12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
        2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
        2.052, 2.048, 2.045, 2.042,
    ];
    const Z: f64 = 1.959_963_984_540_054;
    match df {
        0 => f64::NAN,
        1..=30 => T[df - 1],
        _ => {
            let v = df as f64;
            let (z3, z5) = (Z * Z * Z, Z * Z * Z * Z * Z);
            Z + (z3 + Z) / (4.0 * v) + (5.0 * z5 + 16.0 * z3 + 3.0 * Z) / (96.0 * v * v)
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn quantiles_are_exact_and_zero_is_zero_up_to_exact_max() {
        let mut l = LatencyStats::new();
        for v in [0, 0, 45_000_000, 7, 45_000_000] {
            l.record(v);
        }
        let s = l.summary();
        // Nearest rank over 0, 0, 7, 45 ms, 45 ms.
        assert_eq!((s.p50, s.p90, s.max), (7e-6, 45.0, 45.0), "{s:?}");
        let mut z = LatencyStats::new();
        z.record(0);
        assert_eq!(z.summary().p99, 0.0);
        // Past the cap the histogram answers, within its 3 significant digits.
        let mut big = LatencyStats::new();
        for i in 0..EXACT_MAX as u64 + 10 {
            big.record(1_000_000 + i % 1000);
        }
        assert!(big.exact.is_none());
        let p50 = big.summary().p50;
        assert!((p50 - 1.0005).abs() < 0.002, "{p50}");
    }

    use super::*;

    #[test]
    fn t95_matches_published_quantiles() {
        // t(0.975, df) from standard tables.
        for (df, t) in [
            (1, 12.706),
            (10, 2.228),
            (30, 2.042),
            (40, 2.021),
            (60, 2.000),
        ] {
            assert!((t95(df) - t).abs() < 6e-4, "df {df}: {} vs {t}", t95(df));
        }
        assert!((t95(120) - 1.980).abs() < 6e-4);
        assert!((t95(1_000_000) - 1.960).abs() < 1e-3);
        assert!(t95(0).is_nan());
        // Monotone down towards the normal quantile.
        assert!((1..200).all(|d| t95(d) > t95(d + 1)));
    }

    #[test]
    fn batch_means_interval_uses_the_t_quantile_of_its_batches() {
        // 16 batches of one sample each: 0, 1, 0, 1, ... (mean 0.5, sample sd 0.5164).
        let mut l = LatencyStats::new();
        for i in 0..16u64 {
            l.record((i % 2) * 1_000_000);
        }
        let s = l.summary();
        let half = t95(15) * (0.516_397_779_494_322_2 / 4.0) * 1.0;
        assert!(
            (s.mean_ci95 - half).abs() < 1e-9,
            "{} vs {half}",
            s.mean_ci95
        );
    }
}

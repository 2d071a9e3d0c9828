//! The end of a run: conservation checked (invariant 5), then the summary assembled from every
//! component's books.

use std::collections::BTreeMap;

use super::accounts::{Tally, CLEANUP_LEVELS};
use super::baseline::Siblings;
use super::cluster::Drained;
use crate::coverage::{Coverage, Mark};
use crate::kernel::NS_PER_S;
use crate::metrics::*;
use crate::record::Extras;
use crate::scenario::Scenario;
use crate::stats::quantile_sorted;

/// Everything the summary reads, borrowed from the world's components at the end of a run.
pub(crate) struct Books<'a> {
    pub scenario: &'a Scenario,
    pub seed: u64,
    pub policy: &'a str,
    pub accounts: &'a Tally,
    pub drained: Drained,
    pub replicas: usize,
    pub conversations: &'a WorkloadEvents,
    pub jobs: Option<JobsSummary>,
    pub playback: &'a Playback,
    pub late_admitted: u64,
    pub rpc: &'a CancelRpc,
    pub siblings: Option<&'a Siblings>,
    pub events: u64,
    pub end_ns: u64,
    pub handoff: Option<HandoffStats>,
    pub pools: Vec<crate::metrics::PoolSummary>,
    pub recovery: Option<Recovery>,
    pub router: Option<super::kv_router::KvRouterStats>,
    pub router_decode: Option<super::kv_router::KvRouterStats>,
    /// The slab's occupancy integrated over the run (request-ns).
    pub occupancy_area_ns: u128,
    pub workload_hash: String,
    pub run_hash: String,
}

fn s(ns: f64) -> f64 {
    ns / NS_PER_S as f64
}

fn ratio(x: f64, over: f64) -> f64 {
    if over > 0.0 {
        x / over
    } else {
        0.0
    }
}

/// Coverage counted at the end, from the run's counters.
fn derived_marks(cov: &mut Coverage, rpc: &CancelRpc, preemptions: u64, pb: &Playback) {
    let retries = rpc.attempts.saturating_sub(rpc.intents.min(rpc.attempts));
    for (m, n) in [
        (Mark::RpcRetry, retries),
        (Mark::RpcLost, rpc.lost),
        (Mark::RpcDuplicate, rpc.duplicates),
        (Mark::RpcLateCallback, rpc.late_callbacks),
        (Mark::RpcBudgetExhausted, rpc.budget_exhausted),
        (Mark::RpcUnknownAbort, rpc.unknown_aborts),
        (Mark::RpcFallback, rpc.fallbacks),
        (Mark::Fault, rpc.faults),
        (Mark::CollateralKill, rpc.collateral_kills),
        (Mark::Preemption, preemptions),
        (Mark::PlaybackBlocked, pb.blocked),
        (Mark::PlaybackExpired, pb.expired),
        (Mark::PlaybackSuppressed, pb.suppressed),
        (Mark::ReleaseCorruptedNextOwner, pb.corrupted_requests),
    ] {
        cov.add(m, n);
    }
}

/// Cleanup latency per evidence level; their CDFs go to the extras for the plot.
fn cleanup(a: &Tally, extras: &mut Extras) -> BTreeMap<String, LevelLatencyMs> {
    let mut out = BTreeMap::new();
    for (i, level) in CLEANUP_LEVELS.iter().enumerate() {
        let cdf = a.cleanup[i].cdf_ms(50);
        if !cdf.is_empty() {
            extras
                .cleanup_cdf_ms
                .insert(level.as_str().to_string(), cdf);
        }
        let l = a.cleanup[i].summary();
        let unknown = a.cleanup_unknown[i];
        let level = LevelLatencyMs {
            count: l.count,
            p50: l.p50,
            p99: l.p99,
            max: l.max,
            unknown,
            not_applicable: a.cleanup_not_applicable[i],
        };
        out.insert(CLEANUP_LEVELS[i].as_str().to_string(), level);
    }
    out
}

fn sibling_survival(sib: Option<&Siblings>) -> (SiblingSurvival, LatencyDeltaMs) {
    let Some(sib) = sib else {
        let none = SiblingSurvival {
            rate: 1.0,
            ..SiblingSurvival::default()
        };
        return (none, LatencyDeltaMs::default());
    };
    let mut ttft = sib.ttft_deltas_ns.clone();
    let mut e2e = sib.e2e_deltas_ns.clone();
    ttft.sort_unstable();
    e2e.sort_unstable();
    let ms = |ns: i64| ns as f64 / 1e6;
    let survival = SiblingSurvival {
        siblings: sib.siblings,
        survived: sib.survived,
        rate: if sib.siblings > 0 {
            sib.survived as f64 / sib.siblings as f64
        } else {
            1.0
        },
    };
    let delta = LatencyDeltaMs {
        ttft_p50: ms(quantile_sorted(&ttft, 0.5)),
        ttft_p99: ms(quantile_sorted(&ttft, 0.99)),
        e2e_p50: ms(quantile_sorted(&e2e, 0.5)),
        e2e_p99: ms(quantile_sorted(&e2e, 0.99)),
        pairs: e2e.len() as u64,
    };
    (survival, delta)
}

/// L from the slab's occupancy, integrated by the run loop event by event; λ and W from the
/// books (arrivals counted, each request's time in system when it left). Two separate
/// bookkeepings: a request the books lose or count twice, or one that stays in the slab,
/// opens a gap.
fn littles_law(a: &Tally, end_ns: u64, occupancy_area_ns: u128) -> LittlesLaw {
    let l = &a.little;
    let lambda_per_s = ratio(a.counts.scheduled as f64, end_ns as f64 / NS_PER_S as f64);
    let mean_in_system = ratio(occupancy_area_ns as f64, end_ns as f64);
    let mean_e2e_s = l.sojourn_sum_ns as f64 / l.sojourns.max(1) as f64 / NS_PER_S as f64;
    let lw = lambda_per_s * mean_e2e_s;
    LittlesLaw {
        lambda_per_s,
        mean_in_system,
        mean_e2e_s,
        relative_gap: ratio((mean_in_system - lw).abs(), mean_in_system),
    }
}

fn gpu(b: &Books) -> Gpu {
    let st = &b.drained.stats;
    let g = &b.accounts.gpu;
    Gpu {
        steps: st.steps,
        busy_s: st.busy_ns as f64 / NS_PER_S as f64,
        utilisation: ratio(st.busy_ns as f64, b.end_ns as f64 * b.replicas as f64),
        token_steps: g.token_steps,
        gpu_s_requests: s(g.requests_ns),
        gpu_s_discarded: s(g.discarded_ns),
        gpu_s_padding: s(g.padding_ns),
        tokens_generated: st.tokens_delivered,
        tokens_discarded: st.tokens_discarded,
        padding_token_steps: st.padding_token_steps,
        preemptions: st.preemptions,
    }
}

fn workload(b: &Books) -> WorkloadEvents {
    WorkloadEvents {
        deadlines_missed: b.accounts.deadlines_missed,
        disconnects: b.accounts.disconnects,
        storm_targets: b.accounts.storm_targets,
        ..b.conversations.clone()
    }
}

/// The summary of one run.
pub(crate) fn summary(b: Books, extras: &mut Extras) -> Summary {
    let st = b.drained.stats;
    let mut coverage = b.accounts.coverage.clone();
    derived_marks(&mut coverage, b.rpc, st.preemptions, b.playback);
    let cleanup = cleanup(b.accounts, extras);
    let (sibling_survival, sibling_latency_delta_ms) = sibling_survival(b.siblings);
    let makespan_s = b.accounts.last_completion_ns as f64 / NS_PER_S as f64;
    let a = b.accounts;
    Summary {
        scenario: b.scenario.name.clone(),
        scenario_hash: b.scenario.hash(),
        seed: b.seed,
        version: env!("CARGO_PKG_VERSION").to_string(),
        policy: b.policy.to_string(),
        requests: a.counts.clone(),
        leaked_work: a.leaked_s(),
        late_output_discards: a.late_output_discards,
        late_outputs_admitted: b.late_admitted,
        sibling_survival,
        sibling_latency_delta_ms,
        retained: Retained {
            kv_block_s: a.kv_block_ns_retained as f64 / NS_PER_S as f64,
            peak_blocks: st.marked_blocks_peak,
            admission_stalls: st.admission_stalls,
        },
        cleanup_latency_ms: cleanup,
        ttft_ms: a.ttft.summary(),
        tpot_ms: a.tpot.summary(),
        e2e_ms: a.e2e.summary(),
        throughput_rps: ratio(a.counts.completed as f64, makespan_s),
        output_tokens_per_s: ratio(st.tokens_delivered as f64, makespan_s),
        makespan_s,
        capacity_cost: None,
        gpu: gpu(&b),
        kv: Kv {
            block_s: a.kv_block_ns as f64 / NS_PER_S as f64,
            peak_blocks: b.drained.kv_peak,
            allocated_blocks: b.drained.kv_allocated,
            freed_blocks: b.drained.kv_freed,
            prefix_query_tokens: st.prefix_query_tokens,
            prefix_hit_tokens: st.prefix_hit_tokens,
            prefix_hit_rate: ratio(st.prefix_hit_tokens as f64, st.prefix_query_tokens as f64),
        },
        workload: workload(&b),
        playback: b.playback.clone(),
        cancel_rpc: b.rpc.clone(),
        targets: a.targets.clone(),
        coverage: coverage.into_map(),
        littles_law: littles_law(a, b.end_ns, b.occupancy_area_ns),
        jobs: b.jobs,
        handoff: b.handoff,
        pools: b.pools,
        recovery: b.recovery,
        router: b.router,
        router_decode: b.router_decode,
        stop_strings: b
            .scenario
            .workload
            .stop_strings
            .as_ref()
            .map(|_| StopStats {
                requests: a.stop_requests,
                overrun_tokens: a.tokens_overrun,
                aborts_observed: a.stop_aborts_observed,
            }),
        events: b.events,
        virtual_time_s: b.end_ns as f64 / NS_PER_S as f64,
        workload_hash: b.workload_hash.clone(),
        run_hash: b.run_hash.clone(),
    }
}

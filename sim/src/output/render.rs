//! The human report on stdout: one column per policy, beside the counterfactual (and the ideal
//! cancel, last). Its last line
//! is always `run_hash=<hex>`.

use std::fmt::Write as _;

use crate::metrics::{CapacityCost, HandoffStats, Recovery, Summary};
use crate::run::Report;

fn int(x: u64) -> String {
    x.to_string()
}

/// Three decimals; a value that rounds to zero prints as 0.000, not -0.000, so a difference of
/// a few microseconds does not read as a sign.
fn f3(x: f64) -> String {
    if !x.is_finite() {
        return "-".into();
    }
    let s = format!("{x:.3}");
    match s.strip_prefix('-') {
        Some(rest) if rest.bytes().all(|b| b == b'0' || b == b'.') => rest.to_string(),
        _ => s,
    }
}

type Cell = fn(&Summary) -> String;

/// The report's rows before the cleanup latencies: label and value, in one table.
const HEAD_ROWS: &[(&str, Cell)] = &[
    ("requests.completed", |s| int(s.requests.completed)),
    ("requests.cancelled", |s| int(s.requests.cancelled)),
    ("requests.expired", |s| int(s.requests.expired)),
    ("requests.cleanup_pending", |s| {
        int(s.requests.cleanup_pending)
    }),
    ("requests.never_observed", |s| {
        int(s.requests.never_observed)
    }),
    ("requests.rejected", |s| int(s.requests.rejected)),
    ("leaked_work.gpu_s", |s| f3(s.leaked_work.gpu_s)),
    ("leaked_work.token_steps", |s| {
        int(s.leaked_work.token_steps)
    }),
    ("  by_cause.in_flight_window", |s| {
        f3(s.leaked_work.by_cause.in_flight_window)
    }),
    ("  by_cause.checkpoint_delay", |s| {
        f3(s.leaked_work.by_cause.checkpoint_delay)
    }),
    ("  by_cause.unobserved_or_lost", |s| {
        f3(s.leaked_work.by_cause.unobserved_or_lost)
    }),
    ("  by_cause.finish_and_discard", |s| {
        f3(s.leaked_work.by_cause.finish_and_discard)
    }),
    ("late_output_discards", |s| int(s.late_output_discards)),
    ("late_outputs_admitted", |s| int(s.late_outputs_admitted)),
    ("sibling_survival", |s| {
        let ss = &s.sibling_survival;
        format!("{}/{}", ss.survived, ss.siblings)
    }),
    ("sibling_survival.rate", |s| f3(s.sibling_survival.rate)),
    ("sibling_latency_delta_ms.ttft_p50", |s| {
        f3(s.sibling_latency_delta_ms.ttft_p50)
    }),
    ("sibling_latency_delta_ms.ttft_p99", |s| {
        f3(s.sibling_latency_delta_ms.ttft_p99)
    }),
    ("sibling_latency_delta_ms.e2e_p99", |s| {
        f3(s.sibling_latency_delta_ms.e2e_p99)
    }),
    ("retained.kv_block_s", |s| f3(s.retained.kv_block_s)),
    ("retained.peak_blocks", |s| int(s.retained.peak_blocks)),
    ("retained.admission_stalls", |s| {
        int(s.retained.admission_stalls)
    }),
];

/// The rows after them.
const TAIL_ROWS: &[(&str, Cell)] = &[
    ("playback.routing_violations", |s| {
        int(s.playback.routing_violations)
    }),
    ("playback.corrupted_requests", |s| {
        int(s.playback.corrupted_requests)
    }),
    ("ttft_ms.p50", |s| f3(s.ttft_ms.p50)),
    ("ttft_ms.p99", |s| f3(s.ttft_ms.p99)),
    ("tpot_ms.p50", |s| f3(s.tpot_ms.p50)),
    ("e2e_ms.p50", |s| f3(s.e2e_ms.p50)),
    ("e2e_ms.p99", |s| f3(s.e2e_ms.p99)),
    ("gpu.busy_s", |s| f3(s.gpu.busy_s)),
    ("run_hash", |s| s.run_hash[..12].to_string()),
];

/// The rows of durable agent jobs, after the head rows.
const JOB_ROWS: &[(&str, Cell)] = &[
    ("jobs.completed", |s| job(s, |j| int(j.completed))),
    ("jobs.cancelled", |s| job(s, |j| int(j.cancelled))),
    ("jobs.expired", |s| job(s, |j| int(j.expired))),
    ("jobs.failed", |s| job(s, |j| int(j.failed))),
    ("jobs.completion_won", |s| job(s, |j| int(j.completion_won))),
    ("jobs.cleanup_ms.p50", |s| job(s, |j| f3(j.cleanup_ms.p50))),
    ("jobs.cleanup_ms.p99", |s| job(s, |j| f3(j.cleanup_ms.p99))),
    ("jobs.cleanup_incomplete", |s| {
        job(s, |j| int(j.cleanup_incomplete))
    }),
    ("jobs.allowances_used.p99", |s| {
        job(s, |j| int(j.allowances_used_p99 as u64))
    }),
    ("jobs.leaked_gpu_s", |s| job(s, |j| f3(j.leaked_gpu_s))),
    ("jobs.effects_unknown", |s| {
        job(s, |j| int(j.effects_unknown))
    }),
    ("jobs.late_observations", |s| {
        job(s, |j| int(j.late_observations))
    }),
    ("jobs.usage_gap_tokens", |s| {
        job(s, |j| int(j.usage_gap_tokens))
    }),
];

/// The rows of the jobs' observers that left and came back, after the job rows.
const OBSERVER_ROWS: &[(&str, Cell)] = &[
    ("jobs.observers.reconnects", |s| {
        obs(s, |o| int(o.reconnects))
    }),
    ("jobs.observers.replayed_interruptions", |s| {
        obs(s, |o| int(o.replayed_interruptions))
    }),
    ("jobs.observers.too_late", |s| obs(s, |o| int(o.too_late))),
    ("jobs.observers.results_unobserved", |s| {
        obs(s, |o| int(o.results_unobserved))
    }),
];

fn obs(s: &Summary, f: fn(&crate::metrics::ObserversSummary) -> String) -> String {
    let o = s.jobs.as_ref().and_then(|j| j.observers.as_ref());
    o.map_or("-".into(), f)
}

/// The rows of a prefill/decode graph's handoff, after the head rows.
const HANDOFF_ROWS: &[(&str, Cell)] = &[
    ("handoff.transfers", |s| {
        hand(s, |h| int(h.transfers_started))
    }),
    ("handoff.local_prefills", |s| {
        hand(s, |h| int(h.local_prefills))
    }),
    ("handoff.transfer_tokens_cached", |s| {
        hand(s, |h| int(h.transfer_tokens_cached))
    }),
    ("handoff.transfers_cancelled", |s| {
        hand(s, |h| int(h.transfers_cancelled))
    }),
    ("handoff.transfers_failed", |s| {
        hand(s, |h| int(h.transfers_failed))
    }),
    ("handoff.kv_released_before_transfer", |s| {
        hand(s, |h| int(h.kv_released_before_transfer))
    }),
    ("handoff.aborted_at_boundary", |s| {
        hand(s, |h| int(h.aborted_at_boundary))
    }),
    ("handoff.stranded", |s| hand(s, |h| int(h.stranded))),
    ("handoff.aborted_awaiting_kv", |s| {
        hand(s, |h| int(h.aborted_awaiting_kv))
    }),
    ("handoff.notices_lost", |s| hand(s, |h| int(h.notices_lost))),
    ("handoff.second_completion_faults", |s| {
        hand(s, |h| int(h.second_completion_faults))
    }),
    ("handoff.wedges", |s| hand(s, |h| int(h.wedges))),
    ("handoff.hang_kills", |s| hand(s, |h| int(h.hang_kills))),
    ("handoff.wedge_s", |s| hand(s, |h| f3(h.wedge_s))),
    ("prefill.retained_block_s", |s| {
        hand(s, |h| f3(h.prefill.retained_block_s))
    }),
    ("prefill.retained_blocks_peak", |s| {
        hand(s, |h| int(h.prefill.retained_blocks_peak))
    }),
    ("prefill.blocks_never_returned", |s| {
        hand(s, |h| int(h.prefill.blocks_never_returned))
    }),
    ("prefill.admission_stalls", |s| {
        hand(s, |h| int(h.prefill.admission_stalls))
    }),
    ("decode.retained_block_s", |s| {
        hand(s, |h| f3(h.decode.retained_block_s))
    }),
    ("decode.retained_blocks_peak", |s| {
        hand(s, |h| int(h.decode.retained_blocks_peak))
    }),
    ("decode.blocks_never_returned", |s| {
        hand(s, |h| int(h.decode.blocks_never_returned))
    }),
    ("decode.admission_stalls", |s| {
        hand(s, |h| int(h.decode.admission_stalls))
    }),
];

/// The rows of a storm in time.
/// Each policy against the ideal cancel (`-` for the counterfactual and the ideal itself).
const CAPACITY_ROWS: &[(&str, Cell)] = &[
    ("capacity_cost.gpu_busy_s", |s| cap(s, |c| f3(c.gpu_busy_s))),
    ("capacity_cost.makespan_s", |s| cap(s, |c| f3(c.makespan_s))),
    ("capacity_cost.goodput_rps", |s| {
        cap(s, |c| f3(c.goodput_rps))
    }),
    ("capacity_cost.sibling_ttft_p99_ms", |s| {
        cap(s, |c| f3(c.sibling_ttft_p99_ms))
    }),
    ("capacity_cost.sibling_e2e_p99_ms", |s| {
        cap(s, |c| f3(c.sibling_e2e_p99_ms))
    }),
];

fn cap(s: &Summary, f: fn(&CapacityCost) -> String) -> String {
    s.capacity_cost.as_ref().map_or("-".into(), f)
}

const RECOVERY_ROWS: &[(&str, Cell)] = &[
    ("recovery.level_ms", |s| rec(s, |r| f3(r.level_ms))),
    ("recovery.worst_bin_ms", |s| rec(s, |r| f3(r.worst_bin_ms))),
    ("recovery.time_to_recover_s", |s| {
        rec(s, |r| match r.recovered {
            true => f3(r.time_to_recover_s),
            false => format!(">{}", f3(r.time_to_recover_s)),
        })
    }),
];

fn rec(s: &Summary, f: fn(&Recovery) -> String) -> String {
    s.recovery.as_ref().map_or("-".into(), f)
}

fn job(s: &Summary, f: fn(&crate::metrics::JobsSummary) -> String) -> String {
    s.jobs.as_ref().map_or("-".into(), f)
}

fn hand(s: &Summary, f: fn(&HandoffStats) -> String) -> String {
    s.handoff.as_ref().map_or("-".into(), f)
}

/// Evidence levels whose cleanup latency the report shows.
const LEVELS: [&str; 5] = [
    "local_invalidation",
    "cancel_submission",
    "backend_observation",
    "final_callback",
    "resource_release",
];

/// The columns: the counterfactual, then each policy.
struct Table<'a> {
    cols: Vec<&'a Summary>,
    width: usize,
    /// The longest row name, so every value column lines up.
    label_width: usize,
}

impl Table<'_> {
    fn row(&self, w: &mut String, name: &str, f: &dyn Fn(&Summary) -> String) {
        let _ = write!(w, "{name:<width$}", width = self.label_width);
        for s in &self.cols {
            let _ = write!(w, " {:>width$}", f(s), width = self.width);
        }
        let _ = writeln!(w);
    }

    fn cleanup_rows(&self, w: &mut String) {
        for level in LEVELS {
            self.row(w, &format!("cleanup_ms.{level}.p99"), &|s| {
                s.cleanup_latency_ms.get(level).map_or("-".into(), |l| {
                    if l.count > 0 {
                        f3(l.p99)
                    } else {
                        "-".into()
                    }
                })
            });
            self.row(w, &format!("cleanup_ms.{level}.unknown"), &|s| {
                s.cleanup_latency_ms
                    .get(level)
                    .map_or("-".into(), |l| int(l.unknown))
            });
            self.row(w, &format!("cleanup_ms.{level}.not_applicable"), &|s| {
                s.cleanup_latency_ms
                    .get(level)
                    .map_or("-".into(), |l| int(l.not_applicable))
            });
        }
    }
}

/// The human report of a run.
pub fn render(r: &Report) -> String {
    let mut out = String::new();
    let w = &mut out;
    let cf = &r.counterfactual;
    let hash = &r.scenario_hash[..16];
    let _ = writeln!(
        w,
        "scenario {}  seed {}  (scenario_hash {hash})",
        r.scenario, r.seed
    );
    let _ = writeln!(
        w,
        "{} requests over {:.1} s of virtual time; counterfactual: {} completed, {:.2} req/s, {:.0} output tokens/s, GPU busy fraction {:.3}",
        cf.requests.scheduled, cf.virtual_time_s, cf.requests.completed, cf.throughput_rps, cf.output_tokens_per_s, cf.gpu.utilisation
    );
    let cols: Vec<&Summary> = std::iter::once(cf)
        .chain(r.policies.iter())
        .chain(r.ideal.iter())
        .collect();
    let width = cols
        .iter()
        .map(|s| s.policy.len())
        .max()
        .unwrap_or(10)
        .max(12);
    // The sections this run has, in print order; the cleanup rows go between them and the tail.
    let shown = [
        (true, HEAD_ROWS),
        (r.ideal.is_some(), CAPACITY_ROWS),
        (cf.jobs.is_some(), JOB_ROWS),
        (
            cf.jobs.as_ref().is_some_and(|j| j.observers.is_some()),
            OBSERVER_ROWS,
        ),
        (cf.handoff.is_some(), HANDOFF_ROWS),
        (cf.recovery.is_some(), RECOVERY_ROWS),
    ];
    let sections: Vec<&[(&str, Cell)]> = shown.iter().filter(|(on, _)| *on).map(|s| s.1).collect();
    let cleanup = LEVELS.map(|level| "cleanup_ms..not_applicable".len() + level.len());
    let label_width = sections
        .iter()
        .chain([&TAIL_ROWS])
        .flat_map(|rows| rows.iter().map(|(name, _)| name.len()))
        .chain(cleanup)
        .max()
        .unwrap_or(0);
    let t = Table {
        cols,
        width,
        label_width,
    };
    t.row(w, "", &|s| s.policy.clone());
    for rows in sections {
        for (name, cell) in rows {
            t.row(w, name, cell);
        }
    }
    t.cleanup_rows(w);
    for (name, cell) in TAIL_ROWS {
        t.row(w, name, cell);
    }
    let _ = writeln!(w, "run_hash={}", r.run_hash);
    out
}

#[cfg(test)]
mod tests {
    use super::f3;

    #[test]
    fn a_value_that_rounds_to_zero_has_no_sign() {
        assert_eq!(f3(-0.0004), "0.000");
        assert_eq!(f3(-0.0), "0.000");
        assert_eq!(f3(-0.0006), "-0.001");
        assert_eq!(f3(-1.5), "-1.500");
        assert_eq!(f3(2.0), "2.000");
        assert_eq!(f3(f64::NAN), "-");
    }
}

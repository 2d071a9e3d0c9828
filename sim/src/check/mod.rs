//! `cancelsim check`: run scenarios and judge them. A run can fail in four ways:
//! - a simulator invariant breaks (a cancelsim bug);
//! - a declared system property fails (routing, sibling isolation);
//! - an expectation of a policy is not met;
//! - a declared coverage mark is never reached.
//!
//! `swarm` runs many seeds, each drawing the scenario's parameters from its declared ranges;
//! `shrink` reduces a failing one to a minimal scenario that still fails.

mod draw;
pub mod fuzz;
mod fuzz_jobs;
mod fuzz_router;
mod sense;
mod shrink;
mod swarm;

pub use shrink::{shrink, to_ron};
pub use swarm::{randomise, requests, set_requests, swarm, swarm_with, SeedResult};

use crate::metrics::Summary;
use crate::run::{self, Report};
use crate::scenario::{Expect, Policy, Scenario, TargetDisposition};
use crate::world::RunError;

/// Judge one report against the scenario: properties always; expectations and coverage only for
/// the scenario as written (`full`), not for swarm variants whose parameters moved.
pub fn judge(s: &Scenario, report: &Report, full: bool) -> Vec<String> {
    let mut out = Vec::new();
    for p in &report.policies {
        if p.late_outputs_admitted > 0 {
            out.push(format!(
                "{}: {} late outputs admitted",
                p.policy, p.late_outputs_admitted
            ));
        }
        if s.properties.routing && p.playback.routing_violations > 0 {
            out.push(format!(
                "{}: routing property: {} chunks reached the wrong consumer",
                p.policy, p.playback.routing_violations
            ));
        }
        if s.properties.sibling_isolation.contains(&p.policy)
            && p.sibling_survival.survived != p.sibling_survival.siblings
        {
            out.push(format!(
                "{}: sibling isolation property: {} of {} siblings survived",
                p.policy, p.sibling_survival.survived, p.sibling_survival.siblings
            ));
        }
    }
    if !full {
        return out;
    }
    for e in &s.expect {
        for p in report
            .policies
            .iter()
            .filter(|p| e.policy == "*" || p.policy == e.policy)
        {
            expect_one(e, p, &mut out);
        }
    }
    for m in &s.coverage {
        let hits: u64 = report
            .policies
            .iter()
            .map(|p| p.coverage.get(m).copied().unwrap_or(0))
            .sum();
        if hits == 0 {
            out.push(format!("coverage: declared path {m:?} was never reached"));
        }
    }
    out
}

/// One bound of an expectation: a failure line if `value` is below `min` or above `max`.
fn bound<T: PartialOrd + std::fmt::Display + Copy>(
    out: &mut Vec<String>,
    what: String,
    value: T,
    (min, max): (Option<T>, Option<T>),
) {
    if let Some(m) = min.filter(|m| value < *m) {
        out.push(format!("{what} < {m}"));
    }
    if let Some(m) = max.filter(|m| value > *m) {
        out.push(format!("{what} > {m}"));
    }
}

fn expect_one(e: &Expect, p: &Summary, out: &mut Vec<String>) {
    let name = &p.policy;
    if let Some(t) = e.targets {
        let (want, got) = match t {
            TargetDisposition::Completed => ("completed", p.targets.completed),
            TargetDisposition::Cancelled => ("cancelled", p.targets.cancelled),
            TargetDisposition::Expired => ("expired", p.targets.expired),
            TargetDisposition::Rejected => ("rejected", p.targets.rejected),
        };
        let t = &p.targets;
        let all = t.completed + t.cancelled + t.expired + t.rejected;
        if got != all || all == 0 {
            out.push(format!(
                "{name}: expected every target {want}, got {got} of {all}"
            ));
        }
    }
    let rate = p.sibling_survival.rate;
    let survival = (e.sibling_survival_min, e.sibling_survival_max);
    bound(
        out,
        format!("{name}: sibling survival {rate:.3}"),
        rate,
        survival,
    );
    let leak = p.leaked_work.gpu_s;
    let leaked = (e.leaked_gpu_s_min, e.leaked_gpu_s_max);
    bound(out, format!("{name}: leaked {leak:.6} GPU-s"), leak, leaked);
    let late = p.late_output_discards;
    let what = format!("{name}: {late} late discards");
    bound(out, what, late, (None, e.late_discards_max));
    let peak = p.retained.peak_blocks;
    let what = format!("{name}: retained peak {peak} blocks");
    bound(out, what, peak, (None, e.retained_peak_blocks_max));
    let pending = p.requests.cleanup_pending;
    let what = format!("{name}: cleanup pending {pending}");
    bound(
        out,
        what,
        pending,
        (e.cleanup_pending_min, e.cleanup_pending_max),
    );
    if !e.metrics.is_empty() {
        let v = serde_json::to_value(p).expect("a summary serialises");
        for m in &e.metrics {
            let found = m.metric.split('.').try_fold(&v, |v, k| v.get(k));
            match found.and_then(|x| x.as_f64()) {
                Some(x) => bound(
                    out,
                    format!("{name}: {} = {x}", m.metric),
                    x,
                    (m.min, m.max),
                ),
                None => out.push(format!("{name}: summary.json has no number `{}`", m.metric)),
            }
        }
    }
}

/// How a check runs a scenario on a seed: the simulator itself, or (tests of the checker) a
/// deliberately broken variant of it.
pub type Runner<'a> = &'a (dyn Fn(&Scenario, u64) -> Result<Report, RunError> + Sync);

/// Run and judge. `Err` carries the failure messages.
pub fn check_one(s: &Scenario, seed: u64, full: bool) -> Result<Report, Vec<String>> {
    check_with(&run::report, s, seed, full)
}

/// `check_one` with another runner.
pub fn check_with(
    runner: Runner,
    s: &Scenario,
    seed: u64,
    full: bool,
) -> Result<Report, Vec<String>> {
    match runner(s, seed) {
        Err(e) => Err(vec![e.to_string()]),
        Ok(report) => {
            let failures = judge(s, &report, full);
            if failures.is_empty() {
                Ok(report)
            } else {
                Err(failures)
            }
        }
    }
}

/// Policies a scenario runs, by label.
pub fn labels(s: &Scenario) -> Vec<String> {
    s.policies.iter().map(Policy::label).collect()
}

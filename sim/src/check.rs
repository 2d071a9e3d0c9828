//! `cancelsim check`: run scenarios and judge them. A run can fail in four ways:
//! - a simulator invariant breaks (a cancelsim bug);
//! - a declared system property fails (routing, sibling isolation);
//! - an expectation of a policy is not met;
//! - a declared coverage mark is never reached.
//!
//! Swarm testing runs many seeds, each drawing the scenario's parameters from its declared ranges.
//! Seeds run in parallel across cores, and results are collected in seed order, so they are the
//! same whatever the thread count. A failing seed is shrunk to a minimal scenario (fewest
//! requests, fewest cancels, one policy) that still fails, and written as a RON file.

use rayon::prelude::*;

use crate::kernel::rng::{Purpose, Stream};
use crate::metrics::Summary;
use crate::run::{self, Report, RunOptions};
use crate::scenario::{
    Cancellation, Policy, Scenario, Scheduler, Source, Stage, TargetDisposition,
};
use crate::world::Hooks;

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

fn expect_one(e: &crate::scenario::Expect, p: &Summary, out: &mut Vec<String>) {
    let name = &p.policy;
    if let Some(t) = e.targets {
        let (want, got) = match t {
            TargetDisposition::Completed => ("completed", p.targets.completed),
            TargetDisposition::Cancelled => ("cancelled", p.targets.cancelled),
            TargetDisposition::Expired => ("expired", p.targets.expired),
        };
        let all = p.targets.completed + p.targets.cancelled + p.targets.expired;
        if got != all || all == 0 {
            out.push(format!(
                "{name}: expected every target {want}, got {got} of {all}"
            ));
        }
    }
    let rate = p.sibling_survival.rate;
    if e.sibling_survival_min.is_some_and(|m| rate < m) {
        out.push(format!(
            "{name}: sibling survival {rate:.3} < {}",
            e.sibling_survival_min.unwrap_or_default()
        ));
    }
    if e.sibling_survival_max.is_some_and(|m| rate > m) {
        out.push(format!(
            "{name}: sibling survival {rate:.3} > {}",
            e.sibling_survival_max.unwrap_or_default()
        ));
    }
    let leak = p.leaked_work.gpu_s;
    if e.leaked_gpu_s_max.is_some_and(|m| leak > m) {
        out.push(format!(
            "{name}: leaked {leak:.6} GPU-s > {}",
            e.leaked_gpu_s_max.unwrap_or_default()
        ));
    }
    if e.leaked_gpu_s_min.is_some_and(|m| leak < m) {
        out.push(format!(
            "{name}: leaked {leak:.6} GPU-s < {}",
            e.leaked_gpu_s_min.unwrap_or_default()
        ));
    }
    if e.late_discards_max
        .is_some_and(|m| p.late_output_discards > m)
    {
        out.push(format!(
            "{name}: {} late discards > {}",
            p.late_output_discards,
            e.late_discards_max.unwrap_or_default()
        ));
    }
    if e.retained_peak_blocks_max
        .is_some_and(|m| p.retained.peak_blocks > m)
    {
        out.push(format!(
            "{name}: retained peak {} blocks > {}",
            p.retained.peak_blocks,
            e.retained_peak_blocks_max.unwrap_or_default()
        ));
    }
    let pending = p.requests.cleanup_pending;
    if e.cleanup_pending_max.is_some_and(|m| pending > m) {
        out.push(format!(
            "{name}: cleanup pending {pending} > {}",
            e.cleanup_pending_max.unwrap_or_default()
        ));
    }
    if e.cleanup_pending_min.is_some_and(|m| pending < m) {
        out.push(format!(
            "{name}: cleanup pending {pending} < {}",
            e.cleanup_pending_min.unwrap_or_default()
        ));
    }
}

/// Run and judge. `Err` carries the failure messages.
pub fn check_one(s: &Scenario, seed: u64, hooks: Hooks, full: bool) -> Result<Report, Vec<String>> {
    let opts = RunOptions {
        hooks,
        ..RunOptions::default()
    };
    match run::run(s, seed, opts).map(|(r, _)| r) {
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

/// The scenario with its swarm parameters drawn for `seed` (a keyed stream: the draws depend
/// only on the seed).
pub fn randomise(base: &Scenario, seed: u64) -> Scenario {
    let mut s = base.clone();
    s.seed = seed;
    let Some(r) = base.swarm.clone() else {
        return s;
    };
    let mut g = Stream::new(seed, Purpose::Swarm, 0);
    let int = |g: &mut Stream, (lo, hi): (u64, u64)| lo + g.below(hi - lo + 1);
    let real = |g: &mut Stream, (lo, hi): (f64, f64)| lo + (hi - lo) * g.uniform_open01();
    if let Some(range) = r.requests {
        set_requests(&mut s, int(&mut g, range));
    }
    if let Some(range) = r.fraction {
        let f = real(&mut g, range);
        let c = s.cancellation.get_or_insert(Cancellation {
            fraction: 0.0,
            requests: Vec::new(),
            stage: Stage::Random,
            delay_ms: crate::dist::Dist::Constant(0.0),
        });
        c.fraction = f;
        c.requests.clear();
    }
    if r.random_stage {
        if let Some(c) = &mut s.cancellation {
            c.stage = Stage::Random;
        }
    }
    if let Scheduler::Continuous {
        window,
        max_num_seqs,
        ..
    } = &mut s.cluster.scheduler
    {
        if let Some((lo, hi)) = r.window {
            *window = int(&mut g, (lo as u64, hi as u64)) as u32;
        }
        if let Some((lo, hi)) = r.max_num_seqs {
            *max_num_seqs = Some(int(&mut g, (lo as u64, hi as u64)) as u32);
        }
    }
    if let Some(range) = r.loss {
        s.adapter.loss = real(&mut g, range);
    }
    if let Some(range) = r.writer_wait_ms {
        let hi = real(&mut g, range);
        s.playback.writer_wait_ms = crate::dist::Dist::Uniform { low: 0.0, high: hi };
    }
    debug_assert!(s.validate().is_ok(), "swarm ranges are validated");
    s
}

/// Requests of the scenario: open-loop count, conversations, or trace rows (None: to the end).
pub fn requests(s: &Scenario) -> Option<u64> {
    match &s.workload.source {
        Source::Poisson { requests, .. } | Source::OnOff { requests, .. } => Some(*requests),
        Source::Conversations { conversations, .. } => Some(*conversations),
        Source::Trace { rows, .. } => *rows,
    }
}

pub fn set_requests(s: &mut Scenario, n: u64) {
    match &mut s.workload.source {
        Source::Poisson { requests, .. } | Source::OnOff { requests, .. } => *requests = n,
        Source::Conversations { conversations, .. } => *conversations = n,
        Source::Trace { rows, .. } => *rows = Some(n),
    }
}

/// One swarm seed's outcome.
#[derive(Clone, Debug, PartialEq)]
pub struct SeedResult {
    pub seed: u64,
    pub failures: Vec<String>,
    pub run_hash: Option<String>,
}

/// Run seeds `first..first + n` of `base` in parallel, collected in seed order.
pub fn swarm(base: &Scenario, first: u64, n: u64, hooks: Hooks) -> Vec<SeedResult> {
    (first..first + n)
        .into_par_iter()
        .map(|seed| {
            let s = randomise(base, seed);
            match check_one(&s, seed, hooks, false) {
                Ok(r) => SeedResult {
                    seed,
                    failures: Vec::new(),
                    run_hash: Some(r.run_hash),
                },
                Err(f) => SeedResult {
                    seed,
                    failures: f,
                    run_hash: None,
                },
            }
        })
        .collect()
}

/// The storm targets of `s` among its first `n` requests, as the run would pick them. Lets the
/// shrinker replace a fraction with an explicit list without changing who is cancelled.
fn explicit_targets(s: &Scenario, seed: u64, n: u64) -> Vec<u64> {
    let Some(c) = &s.cancellation else {
        return Vec::new();
    };
    if !c.requests.is_empty() {
        return c.requests.iter().copied().filter(|&i| i < n).collect();
    }
    (0..n)
        .filter(|&id| Stream::new(seed, Purpose::CancelPlan, id).uniform_open01() < c.fraction)
        .collect()
}

/// Shrink a failing scenario: one failing policy, an explicit target list, fewest requests, then
/// fewest targets. `fails` must be true for `s` itself. At most `budget` runs.
pub fn shrink(s: &Scenario, seed: u64, budget: u32, fails: &dyn Fn(&Scenario) -> bool) -> Scenario {
    let mut best = s.clone();
    best.seed = seed;
    best.swarm = None;
    best.expect.clear();
    best.coverage.clear();
    let mut runs = 0u32;
    let try_it = |cand: &Scenario, runs: &mut u32| -> bool {
        if *runs >= budget {
            return false;
        }
        *runs += 1;
        cand.validate().is_ok() && fails(cand)
    };
    // One policy.
    if best.policies.len() > 1 {
        for p in best.policies.clone() {
            let mut c = best.clone();
            c.policies = vec![p.clone()];
            c.properties.sibling_isolation.retain(|l| *l == p.label());
            if try_it(&c, &mut runs) {
                best = c;
                break;
            }
        }
    }
    // Tiny worlds first: 1 to 3 requests, every target subset, every stage, the rest of the
    // variant's parameters unchanged. A bug that needs one target and one sibling is found here
    // in a few dozen small runs, whatever request of the big run first showed it.
    if let (Some(_), Some(c)) = (requests(&best), best.cancellation.clone()) {
        let stages: Vec<Stage> = std::iter::once(c.stage).chain(Stage::LIFECYCLE).collect();
        // The variant's delay, and none: an intent in the very tick a stage is reached is the
        // sharpest race (a chunk made in that tick is still waiting for the writer).
        let delays = [c.delay_ms.clone(), crate::dist::Dist::Constant(0.0)];
        for n in 1..=3u64 {
            for delay in &delays {
                for &stage in &stages {
                    for mask in 1u64..(1 << n) {
                        let mut cand = best.clone();
                        set_requests(&mut cand, n);
                        let cc = cand.cancellation.as_mut().expect("cloned above");
                        cc.stage = stage;
                        cc.delay_ms = delay.clone();
                        cc.requests = (0..n).filter(|i| mask & (1 << i) != 0).collect();
                        if try_it(&cand, &mut runs) {
                            return cand;
                        }
                    }
                }
            }
        }
    }
    // Explicit targets.
    if let (Some(n), Some(_)) = (requests(&best), best.cancellation.as_ref()) {
        let mut c = best.clone();
        let targets = explicit_targets(&best, seed, n);
        if !targets.is_empty() {
            if let Some(cc) = &mut c.cancellation {
                cc.requests = targets;
            }
            if try_it(&c, &mut runs) {
                best = c;
            }
        }
    }
    // Fewest requests: halve while it fails, then step down.
    if let Some(mut n) = requests(&best) {
        while n > 1 {
            let half = n / 2;
            let mut c = best.clone();
            set_requests(&mut c, half);
            if let Some(cc) = &mut c.cancellation {
                cc.requests.retain(|&i| i < half);
                if cc.requests.is_empty()
                    && !best
                        .cancellation
                        .as_ref()
                        .is_some_and(|b| b.requests.is_empty())
                {
                    break;
                }
            }
            if try_it(&c, &mut runs) {
                best = c;
                n = half;
            } else {
                break;
            }
        }
        while n > 1 {
            let mut c = best.clone();
            set_requests(&mut c, n - 1);
            if let Some(cc) = &mut c.cancellation {
                cc.requests.retain(|&i| i < n - 1);
            }
            if try_it(&c, &mut runs) {
                best = c;
                n -= 1;
            } else {
                break;
            }
        }
    }
    // Fewest targets: drop them one at a time while it still fails.
    if let Some(targets) = best.cancellation.as_ref().map(|c| c.requests.clone()) {
        for t in targets {
            let mut c = best.clone();
            if let Some(cc) = &mut c.cancellation {
                cc.requests.retain(|&i| i != t);
                if cc.requests.is_empty() {
                    continue;
                }
            }
            if try_it(&c, &mut runs) {
                best = c;
            }
        }
    }
    best
}

/// A shrunk scenario as RON text: paths made absolute so it runs from anywhere.
pub fn to_ron(s: &Scenario) -> String {
    let mut s = s.clone();
    if let Source::Trace { path, .. } = &mut s.workload.source {
        let abs = s.base_dir.join(&*path);
        *path = abs.canonicalize().unwrap_or(abs).display().to_string();
    }
    let pretty = ron::ser::PrettyConfig::default().struct_names(true);
    let body = ron::ser::to_string_pretty(&s, pretty).expect("scenario serialises");
    format!("// Shrunk by `cancelsim check --swarm`: run it with `cancelsim run <this file>`.\n{body}\n")
}

/// Policies a scenario runs, by label.
pub fn labels(s: &Scenario) -> Vec<String> {
    s.policies.iter().map(Policy::label).collect()
}

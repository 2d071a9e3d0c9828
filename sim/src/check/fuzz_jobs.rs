//! The fuzzer's durable agent jobs: a third tier of small worlds whose source is a `Jobs` one,
//! every field of the plan, the cancel and the worker drawn at its edges. A tier of its own (its
//! own streams), so the two older tiers draw what they always drew.

use std::collections::BTreeMap;

use super::draw::Draw;
use crate::dist::Dist;
use crate::scenario::{JobCancel, JobSpec, Observer, PlanStep, Source, Worker};

/// A duration that can last: a drawn distribution, or 1 ms where it would always be 0.
fn lasting(d: &mut Draw, typical: f64) -> Dist {
    let x = d.dist(typical, 1.0);
    if x.mean() > 0.0 {
        x
    } else {
        Dist::Constant(1.0)
    }
}

fn step(d: &mut Draw, agents: &[String], depth: u32) -> PlanStep {
    match d.s.below(if depth > 1 { 3 } else { 6 }) {
        0 => PlanStep::Call,
        1 => PlanStep::Tools {
            tools: d.int(1, 8) as u32,
            duration_ms: lasting(d, 300.0),
            effect_probability: d.real(0.0, 1.0),
            developer_hosted: d.chance(0.25),
        },
        2 => PlanStep::Approval {
            wait_ms: lasting(d, 500.0),
        },
        3 if !agents.is_empty() => PlanStep::Subagent(d.pick(agents)),
        4 => PlanStep::Repeat {
            times: d.int(1, 3) as u32,
            steps: plan(d, agents, depth + 1),
        },
        _ => PlanStep::Parallel(
            (0..d.int(1, 3))
                .map(|_| plan(d, agents, depth + 1))
                .collect(),
        ),
    }
}

fn plan(d: &mut Draw, agents: &[String], depth: u32) -> Vec<PlanStep> {
    let n = d.int(1, 4);
    (0..n).map(|_| step(d, agents, depth)).collect()
}

/// A `Jobs` source of about `requests` provider calls at about `rate` calls per second.
pub(super) fn source(d: &mut Draw, requests: u64, rate: f64) -> Source {
    // One agent, which runs only plans without subagents: no cycle, by construction.
    let mut agents = BTreeMap::new();
    if d.chance(0.5) {
        agents.insert("helper".to_string(), plan(d, &[], 1));
    }
    let names: Vec<String> = agents.keys().cloned().collect();
    let mut job = JobSpec {
        prices: d.chance(0.3).then(|| crate::scenario::Prices {
            input_usd_per_mtok: d.real(0.0, 10.0),
            output_usd_per_mtok: d.real(0.0, 40.0),
        }),
        deadline_ms: lasting(d, 20_000.0),
        plan: plan(d, &names, 0),
        agents,
        call_attempts: d.int(1, 3) as u32,
        cancel: d.chance(0.8).then(|| JobCancel {
            fraction: d.real(0.0, 1.0),
            jobs: Vec::new(),
            delay_ms: d.dist(3_000.0, 1.0),
            duplicates: d.int(0, 3) as u32,
        }),
        worker: Worker {
            poll_ms: d.scale(1.0, 1_000.0),
            notify_ms: d.real(0.0, 50.0),
            notify_loss: d.real(0.0, 1.0),
            allowance_ms: d.scale(10.0, 5_000.0),
            allowances_max: d.int(1, 8) as u32,
            sandbox_kill_ms: d.dist(500.0, 1.0),
        },
        observer: d.chance(0.4).then(|| Observer {
            disconnect_ms: d.dist(3_000.0, 1.0),
            durable: d.chance(0.5),
            reconnect_ms: d.chance(0.5).then(|| d.dist(2_000.0, 1.0)),
            retention_ms: d.chance(0.3).then(|| d.real(0.0, 5_000.0)),
        }),
    };
    let calls = job.bounds().calls.max(1);
    if calls * job.call_attempts as u64 > crate::scenario::PROVIDER_ATTEMPTS_MAX as u64 {
        job.call_attempts = 1;
    }
    Source::Jobs {
        jobs: (requests / calls).clamp(1, 100),
        rate_per_s: (rate / calls as f64).max(1e-3),
        job,
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use crate::check::fuzz::{scenario, Tier};

    #[test]
    fn the_jobs_tier_draws_worlds_that_reach_every_ending() {
        let base = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scenarios");
        let mut seen = [0u64; 5];
        for seed in 1..=60 {
            let s = scenario(seed, Tier::Jobs, base.clone());
            let r = crate::run::report(&s, seed).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
            for p in std::iter::once(&r.counterfactual).chain(&r.policies) {
                let j = p.jobs.as_ref().expect("a jobs section");
                seen[0] += j.completed;
                seen[1] += j.cancelled;
                seen[2] += j.expired;
                seen[3] += j.failed;
                seen[4] += p.requests.scheduled;
            }
        }
        assert!(
            seen.iter().all(|&n| n > 0),
            "completed, cancelled, expired, failed, calls: {seen:?}"
        );
    }
}

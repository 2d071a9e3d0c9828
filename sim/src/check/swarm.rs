//! Swarm testing: many seeds of one scenario, each drawing the scenario's parameters from its
//! declared ranges. Seeds run in parallel across cores and are collected in seed order, so the
//! result is the same whatever the thread count.

use rayon::prelude::*;

use super::{check_with, Runner};
use crate::kernel::rng::{Purpose, Stream};
use crate::run;
use crate::scenario::{Cancellation, RoleSpec, Scenario, Scheduler, Source, Stage, SwarmRanges};

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
            window_s: None,
            request_cancellation_rate: None,
            request_cancellation_delay: None,
            ideal_baseline: true,
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
    graph(&mut s, &r, &mut g);
    debug_assert!(s.validate().is_ok(), "swarm ranges are validated");
    s
}

/// A prefill/decode graph's swarm draws: replicas per stage (`cluster.replicas` follows) and the
/// KV link's loss. Drawn after every other range, so older scenarios draw as they did.
fn graph(s: &mut Scenario, r: &SwarmRanges, g: &mut Stream) {
    let int = |g: &mut Stream, (lo, hi): (u64, u64)| lo + g.below(hi - lo + 1);
    let real = |g: &mut Stream, (lo, hi): (f64, f64)| lo + (hi - lo) * g.uniform_open01();
    let Some(t) = &mut s.cluster.topology else {
        return;
    };
    let mut draw = |role: RoleSpec, range: Option<(u32, u32)>| {
        let Some((lo, hi)) = range else { return 0 };
        let n = int(g, (lo as u64, hi as u64)) as u32;
        for st in t.stages.iter_mut().filter(|st| st.role == role) {
            st.replicas = n;
        }
        n
    };
    let p = draw(RoleSpec::Prefill, r.prefill_replicas);
    let d = draw(RoleSpec::Decode, r.decode_replicas);
    if p + d > 0 {
        let serving = t.stages.iter().filter(|st| st.role != RoleSpec::Router);
        s.cluster.replicas = serving
            .filter(|st| st.role != RoleSpec::Playback)
            .map(|st| st.replicas)
            .sum();
    }
    if let Some(range) = r.link_loss {
        let loss = real(g, range);
        for l in &mut t.links {
            if l.latency_ms > 0.0 || l.bandwidth_gbps.is_some() || l.loss > 0.0 {
                l.loss = loss;
            }
        }
    }
}

/// Requests of the scenario: open-loop count, conversations, or trace rows (None: to the end).
pub fn requests(s: &Scenario) -> Option<u64> {
    match &s.workload.source {
        Source::Poisson { requests, .. }
        | Source::Gamma { requests, .. }
        | Source::OnOff { requests, .. } => Some(*requests),
        Source::Conversations { conversations, .. } => Some(*conversations),
        Source::Jobs { jobs, .. } => Some(*jobs),
        Source::Trace { rows, .. } => *rows,
        Source::AgentTrace { .. } => None,
    }
}

pub fn set_requests(s: &mut Scenario, n: u64) {
    match &mut s.workload.source {
        Source::Poisson { requests, .. }
        | Source::Gamma { requests, .. }
        | Source::OnOff { requests, .. } => *requests = n,
        Source::Conversations { conversations, .. } => *conversations = n,
        Source::Jobs { jobs, .. } => *jobs = n,
        Source::Trace { rows, .. } => *rows = Some(n),
        // A recorded trace's sessions are what they are.
        Source::AgentTrace { .. } => {}
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
pub fn swarm(base: &Scenario, first: u64, n: u64) -> Vec<SeedResult> {
    swarm_with(&run::report, base, first, n)
}

/// `swarm` with another runner.
pub fn swarm_with(runner: Runner, base: &Scenario, first: u64, n: u64) -> Vec<SeedResult> {
    (first..first + n)
        .into_par_iter()
        .map(|seed| {
            let s = randomise(base, seed);
            let (failures, run_hash) = match check_with(runner, &s, seed, false) {
                Ok(r) => (Vec::new(), Some(r.run_hash)),
                Err(f) => (f, None),
            };
            SeedResult {
                seed,
                failures,
                run_hash,
            }
        })
        .collect()
}

//! Capacity search: per policy, the largest arrival rate (or the fewest replicas) at which a
//! scenario meets a latency and sibling-survival SLO, at its cancel rate. Each candidate runs on
//! several seeds, and passes only if the 95 % bound of each metric's mean over them meets the SLO
//! (the upper bound for latency, the lower for survival), so the answer holds with confidence,
//! not on one lucky seed. Rates are found by bisection, replicas by a scan upwards; both assume
//! more load (or fewer replicas) never helps.

use crate::metrics::Summary;
use crate::run;
use crate::scenario::{Policy, Scenario, Source};
use crate::stats::t95;

/// What must hold at a candidate, per policy.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct Slo {
    pub ttft_p99_ms: f64,
    pub e2e_p99_ms: f64,
    pub sibling_survival_min: f64,
}

/// What is searched.
#[derive(Clone, Copy, Debug)]
pub enum Knob {
    /// The open-loop arrival rate, between these bounds (req/s), to this relative precision.
    Rate { low: f64, high: f64, precision: f64 },
    /// The replica count, from 1 up to this: `cluster.replicas`, or on a prefill/decode graph
    /// the replicas of the serving stage at this index of `cluster.topology.stages` (the others
    /// keep theirs).
    Replicas { max: u32, stage: Option<usize> },
}

/// A run holds a steady state when it has at least this many times the requests that are in the
/// system at once (N ≥ 10 L, so that its ramp-up and drain are a small part of it).
pub const STEADY_TURNOVER_MIN: f64 = 10.0;

/// One candidate tried: its value, whether it passed, and the bounds it was judged on.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Probe {
    pub value: f64,
    pub passed: bool,
    pub ttft_p99_ms_upper: f64,
    pub e2e_p99_ms_upper: f64,
    pub sibling_survival_lower: f64,
    /// Requests per run, and the mean number in the system at once (Little's L), over the seeds.
    pub requests_mean: f64,
    pub in_system_mean: f64,
}

impl Probe {
    /// Whether its runs hold a steady state: N ≥ `STEADY_TURNOVER_MIN` × L.
    pub fn steady(&self) -> bool {
        self.requests_mean >= STEADY_TURNOVER_MIN * self.in_system_mean
    }
}

/// A policy's answer: the best value that meets the SLO (None: not even the easiest candidate
/// does), and every probe in the order tried.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Answer {
    pub policy: String,
    pub best: Option<f64>,
    /// The answer is the search's own bound, not the system's: the highest rate passed (the
    /// capacity is at least `best`), or even `max` replicas failed (more are needed).
    pub at_ceiling: bool,
    /// Even the lowest rate failed: the capacity is below it.
    pub at_floor: bool,
    /// The runs at `best` (or, with none, at the last candidate) hold a steady state; if not,
    /// the scenario is too short for the rates probed, and the answer measures a ramp-up.
    pub steady: bool,
    pub probes: Vec<Probe>,
}

/// The 95 % upper (`upper`) or lower bound of the mean of `xs`.
fn bound(xs: &[f64], upper: bool) -> f64 {
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    if xs.len() < 2 {
        return mean;
    }
    let var = xs.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / (n - 1.0);
    let half = t95(xs.len() - 1) * (var / n).sqrt();
    if upper {
        mean + half
    } else {
        mean - half
    }
}

/// The open-loop rate of `s` (the on rate of an on/off source); None for a closed loop or a trace.
pub fn rate_of(s: &Scenario) -> Option<f64> {
    match &s.workload.source {
        Source::Poisson { rate_per_s, .. } | Source::Gamma { rate_per_s, .. } => Some(*rate_per_s),
        Source::OnOff { rate_on_per_s, .. } => Some(*rate_on_per_s),
        _ => None,
    }
}

/// Set the open-loop rate of `s` (the on rate of an on/off source).
pub fn set_rate(s: &mut Scenario, rate: f64) -> Result<(), String> {
    match &mut s.workload.source {
        Source::Poisson { rate_per_s, .. } | Source::Gamma { rate_per_s, .. } => *rate_per_s = rate,
        Source::OnOff { rate_on_per_s, .. } => *rate_on_per_s = rate,
        _ => {
            return Err("a rate search needs an open-loop source (Poisson, Gamma or OnOff)".into())
        }
    }
    Ok(())
}

/// Give the serving stage at index `i` of `s`'s graph `n` replicas, and `cluster.replicas` the
/// serving stages' new sum.
pub fn set_stage_replicas(s: &mut Scenario, i: usize, n: u32) -> Result<(), String> {
    use crate::scenario::RoleSpec::{Colocated, Decode, Prefill};
    let t = (s.cluster.topology.as_mut()).ok_or("a stage's replicas need a stage graph")?;
    let stage = t.stages.get_mut(i).ok_or("no such stage")?;
    if !matches!(stage.role, Colocated | Prefill | Decode) {
        return Err(format!("stage `{}` runs no replicas", stage.name));
    }
    stage.replicas = n;
    let serving = t
        .stages
        .iter()
        .filter(|s| matches!(s.role, Colocated | Prefill | Decode));
    s.cluster.replicas = serving.map(|s| s.replicas).sum();
    Ok(())
}

/// Run `policy` on `s` with its knob at `value`, on `seeds`, and judge it.
fn probe(
    s: &Scenario,
    policy: &Policy,
    knob: Knob,
    value: f64,
    seeds: &[u64],
    slo: Slo,
) -> Result<Probe, String> {
    let mut s = s.clone();
    s.policies = vec![policy.clone()];
    s.expect.clear();
    // Properties may name the other policies, which this copy does not run.
    s.properties
        .sibling_isolation
        .retain(|p| *p == policy.label());
    match knob {
        Knob::Rate { .. } => set_rate(&mut s, value)?,
        Knob::Replicas { stage: None, .. } => s.cluster.replicas = value as u32,
        Knob::Replicas { stage: Some(i), .. } => set_stage_replicas(&mut s, i, value as u32)?,
    }
    s.validate()
        .map_err(|e| format!("field `{}` {}", e.field, e.message))?;
    let mut runs: Vec<Summary> = Vec::with_capacity(seeds.len());
    for &seed in seeds {
        let r = run::report(&s, seed).map_err(|e| format!("{value}, seed {seed}: {e}"))?;
        runs.push(r.policies.into_iter().next().expect("one policy"));
    }
    let of = |f: fn(&Summary) -> f64| runs.iter().map(f).collect::<Vec<f64>>();
    let ttft = bound(&of(|p| p.ttft_ms.p99), true);
    let e2e = bound(&of(|p| p.e2e_ms.p99), true);
    // A rate lies in [0, 1], and so does any bound that means something for it (so a survival
    // SLO of 0 always holds).
    let survival = bound(&of(|p| p.sibling_survival.rate), false).clamp(0.0, 1.0);
    let mean = |xs: Vec<f64>| xs.iter().sum::<f64>() / xs.len() as f64;
    Ok(Probe {
        requests_mean: mean(of(|p| p.requests.scheduled as f64)),
        in_system_mean: mean(of(|p| p.littles_law.mean_in_system)),
        value,
        passed: ttft <= slo.ttft_p99_ms
            && e2e <= slo.e2e_p99_ms
            && survival >= slo.sibling_survival_min,
        ttft_p99_ms_upper: ttft,
        e2e_p99_ms_upper: e2e,
        sibling_survival_lower: survival,
    })
}

/// Search each policy of `s`, on `seeds` seeds per candidate.
pub fn search(s: &Scenario, knob: Knob, seeds: &[u64], slo: Slo) -> Result<Vec<Answer>, String> {
    assert!(!seeds.is_empty(), "at least one seed");
    s.policies
        .iter()
        .map(|policy| {
            let mut probes = Vec::new();
            let mut try_at = |v: f64| -> Result<bool, String> {
                let p = probe(s, policy, knob, v, seeds, slo)?;
                let passed = p.passed;
                probes.push(p);
                Ok(passed)
            };
            let (best, at_ceiling, at_floor) = match knob {
                Knob::Rate {
                    low,
                    high,
                    precision,
                } => {
                    let best = bisect(&mut try_at, low, high, precision)?;
                    (best, best == Some(high), best.is_none())
                }
                Knob::Replicas { max, .. } => {
                    let best = scan(&mut try_at, max)?;
                    (best, best.is_none(), false)
                }
            };
            let at_best = probes.iter().rev().find(|p| Some(p.value) == best);
            let steady = at_best.or(probes.last()).is_none_or(Probe::steady);
            Ok(Answer {
                policy: policy.label(),
                best,
                at_ceiling,
                at_floor,
                steady,
                probes,
            })
        })
        .collect()
}

/// The largest rate in [low, high] that passes, to `precision` of it; None if `low` fails.
fn bisect(
    try_at: &mut impl FnMut(f64) -> Result<bool, String>,
    low: f64,
    high: f64,
    precision: f64,
) -> Result<Option<f64>, String> {
    if !try_at(low)? {
        return Ok(None);
    }
    if try_at(high)? {
        return Ok(Some(high));
    }
    let (mut ok, mut bad) = (low, high);
    // At most 60 halvings: past them the interval is below a double's resolution.
    for _ in 0..60 {
        if bad - ok <= precision * ok {
            break;
        }
        let mid = (ok + bad) / 2.0;
        if try_at(mid)? {
            ok = mid;
        } else {
            bad = mid;
        }
    }
    Ok(Some(ok))
}

/// The fewest replicas up to `max` that pass; None if even `max` fails.
fn scan(
    try_at: &mut impl FnMut(f64) -> Result<bool, String>,
    max: u32,
) -> Result<Option<f64>, String> {
    for n in 1..=max {
        if try_at(n as f64)? {
            return Ok(Some(n as f64));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bisection_finds_the_threshold_of_a_monotone_test() {
        let mut tried = Vec::new();
        let mut t = |v: f64| -> Result<bool, String> {
            tried.push(v);
            Ok(v <= 37.3)
        };
        let best = bisect(&mut t, 1.0, 100.0, 0.001).unwrap().unwrap();
        assert!(best <= 37.3 && best > 37.3 * 0.998, "{best}");
        assert!(tried.len() < 20, "{} probes", tried.len());
        let mut never = |_: f64| -> Result<bool, String> { Ok(false) };
        assert_eq!(bisect(&mut never, 1.0, 100.0, 0.01).unwrap(), None);
        let mut from3 = |v: f64| -> Result<bool, String> { Ok(v >= 3.0) };
        assert_eq!(scan(&mut from3, 8).unwrap(), Some(3.0));
    }

    #[test]
    fn bounds_are_the_ends_of_the_95_percent_interval_of_the_mean() {
        let xs = [1.0, 2.0, 3.0];
        assert!((bound(&xs, true) - (2.0 + 4.303 / 3f64.sqrt())).abs() < 1e-12);
        assert!((bound(&xs, false) - (2.0 - 4.303 / 3f64.sqrt())).abs() < 1e-12);
    }
}

//! `cancelsim sweep`, `merge` and `compare`: grids of runs that survive `kill -9`, split across
//! machines, and compare by paired seeds.
//!
//! A sweep is a list of tasks: every point of the grid (the product of its axes, in order) times
//! every seed. Each task is one whole deterministic run, written as its own part file
//! (`parts/<task>.csv`, temp file then rename). A sweep therefore resumes by skipping the parts
//! that exist, a shard runs the tasks whose index falls to it, and the final `results.csv` is the
//! header plus every part in task order: byte-identical however the work was split, resumed or
//! threaded.

mod compare;
mod execute;
mod forest;
mod plots;
mod summary;

pub use compare::{compare, comparison, Comparison, Pairing};
pub use execute::{assemble, run};
pub use plots::draw as draw_plots;
pub use summary::summarise;

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::scenario::{Policy, Scenario, Scheduler, Source};

/// Why a sweep, a merge or a comparison stopped: its input is wrong, or an output could not be
/// written. The command line turns them into different exit codes.
#[derive(Debug, Clone, PartialEq)]
pub enum SweepError {
    Input(String),
    Io(String),
}

impl std::fmt::Display for SweepError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SweepError::Input(m) | SweepError::Io(m) => f.write_str(m),
        }
    }
}

/// A sweep file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Sweep {
    pub name: String,
    /// The base scenario, relative to the sweep file.
    pub scenario: String,
    #[serde(default = "one")]
    pub first_seed: u64,
    pub seeds: u64,
    pub grid: Vec<Axis>,
}

fn one() -> u64 {
    1
}

/// One axis of the grid: a parameter and its values.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub enum Axis {
    /// `cancellation.fraction`.
    Fraction(Vec<f64>),
    /// The continuous scheduler's in-flight window.
    Window(Vec<u32>),
    Replicas(Vec<u32>),
    /// One policy per point.
    Policy(Vec<Policy>),
    /// The Poisson or on/off source's (on) rate.
    Rate(Vec<f64>),
    Requests(Vec<u64>),
    /// `adapter.loss`.
    Loss(Vec<f64>),
    /// `cluster.roofline.mfu_attn_pct`: attention's share of peak FLOP/s, in whole percent
    /// (FlashAttention-2 against FlashAttention-3, say).
    AttentionShare(Vec<u64>),
    /// A `Jobs` source's `job.cancel.fraction`: the share of jobs cancelled.
    JobCancelFraction(Vec<f64>),
    /// A `Jobs` source's `job.worker.poll_ms`: how often workers poll the committed state.
    PollMs(Vec<f64>),
}

impl Axis {
    /// Why this axis cannot change `base`, when the reason is its shape (else empty).
    fn why_inert(&self, base: &Scenario) -> &'static str {
        let continuous = matches!(base.cluster.scheduler, Scheduler::Continuous { .. });
        let jobs = matches!(
            base.workload.source,
            Source::Jobs { .. } | Source::AgentTrace { .. }
        );
        let rated = matches!(
            base.workload.source,
            Source::Poisson { .. } | Source::Gamma { .. } | Source::OnOff { .. }
        );
        match self {
            Axis::Fraction(_) if base.cancellation.is_none() => {
                ": the base scenario has no `cancellation` section to set the fraction of"
            }
            Axis::Window(_) if !continuous => {
                ": the base scenario's scheduler is not `Continuous`, which alone has a window"
            }
            Axis::Rate(_) if !rated => {
                ": the base scenario's source has no rate (a Poisson, Gamma or OnOff source has)"
            }
            Axis::PollMs(_) if !jobs => ": the base scenario's source is not `Jobs`",
            Axis::JobCancelFraction(_) if !jobs => ": the base scenario's source is not `Jobs`",
            Axis::JobCancelFraction(_) => {
                ": the base scenario's jobs have no `cancel` to set the fraction of"
            }
            _ => " (a value is repeated)",
        }
    }

    pub(crate) fn name(&self) -> &'static str {
        match self {
            Axis::Fraction(_) => "fraction",
            Axis::Window(_) => "window",
            Axis::Replicas(_) => "replicas",
            Axis::Policy(_) => "policy",
            Axis::Rate(_) => "rate",
            Axis::Requests(_) => "requests",
            Axis::Loss(_) => "loss",
            Axis::AttentionShare(_) => "mfu_attn_pct",
            Axis::JobCancelFraction(_) => "job_cancel_fraction",
            Axis::PollMs(_) => "poll_ms",
        }
    }

    fn len(&self) -> usize {
        match self {
            Axis::Fraction(v) | Axis::Rate(v) | Axis::Loss(v) => v.len(),
            Axis::JobCancelFraction(v) | Axis::PollMs(v) => v.len(),
            Axis::Window(v) | Axis::Replicas(v) => v.len(),
            Axis::Policy(v) => v.len(),
            Axis::Requests(v) | Axis::AttentionShare(v) => v.len(),
        }
    }

    /// Set value `i` on the scenario; returns it as text for the CSV.
    fn apply(&self, i: usize, s: &mut Scenario) -> String {
        match self {
            Axis::Fraction(v) => {
                if let Some(c) = &mut s.cancellation {
                    c.fraction = v[i];
                    c.requests.clear();
                }
                v[i].to_string()
            }
            Axis::Window(v) => {
                if let Scheduler::Continuous { window, .. } = &mut s.cluster.scheduler {
                    *window = v[i];
                }
                v[i].to_string()
            }
            Axis::Replicas(v) => {
                s.cluster.replicas = v[i];
                v[i].to_string()
            }
            Axis::Policy(v) => {
                s.policies = vec![v[i].clone()];
                s.properties.sibling_isolation.clear();
                s.expect.clear();
                v[i].label()
            }
            Axis::Rate(v) => {
                match &mut s.workload.source {
                    Source::Poisson { rate_per_s, .. } | Source::Gamma { rate_per_s, .. } => {
                        *rate_per_s = v[i]
                    }
                    Source::OnOff { rate_on_per_s, .. } => *rate_on_per_s = v[i],
                    _ => {}
                }
                v[i].to_string()
            }
            Axis::Requests(v) => {
                crate::check::set_requests(s, v[i]);
                v[i].to_string()
            }
            Axis::Loss(v) => {
                s.adapter.loss = v[i];
                v[i].to_string()
            }
            Axis::AttentionShare(v) => {
                s.cluster.roofline.get_or_insert_default().mfu_attn_pct = Some(v[i]);
                v[i].to_string()
            }
            Axis::JobCancelFraction(v) => {
                if let Source::Jobs { job, .. } | Source::AgentTrace { job, .. } =
                    &mut s.workload.source
                {
                    if let Some(c) = &mut job.cancel {
                        c.fraction = v[i];
                        c.jobs.clear();
                    }
                }
                v[i].to_string()
            }
            Axis::PollMs(v) => {
                if let Source::Jobs { job, .. } | Source::AgentTrace { job, .. } =
                    &mut s.workload.source
                {
                    job.worker.poll_ms = v[i];
                }
                v[i].to_string()
            }
        }
    }
}

/// The grid's point count, if the axes, seeds and tasks are within bounds and the last seed
/// exists.
fn counts(sweep: &Sweep) -> Result<usize, String> {
    if sweep.seeds == 0 || sweep.seeds > 1_000_000 {
        return Err(format!(
            "field `seeds` must be between 1 and 1000000 (got {})",
            sweep.seeds
        ));
    }
    if sweep.first_seed.checked_add(sweep.seeds - 1).is_none() {
        return Err(format!(
            "field `first_seed`: {} plus {} seeds is past the last seed (2^64 - 1)",
            sweep.first_seed, sweep.seeds
        ));
    }
    if let Some(a) = sweep.grid.iter().find(|a| a.len() == 0) {
        return Err(format!("grid axis {} has no values", a.name()));
    }
    let points = sweep
        .grid
        .iter()
        .try_fold(1u64, |n, a| n.checked_mul(a.len() as u64));
    match points {
        Some(p) if p.checked_mul(sweep.seeds).is_some_and(|t| t <= TASKS_MAX) => Ok(p as usize),
        _ => Err(format!(
            "the grid's points x {} seeds are more than {TASKS_MAX} tasks",
            sweep.seeds
        )),
    }
}

/// The base scenario a sweep names, relative to the sweep file and under the data root.
fn base_scenario(path: &Path, sweep: &Sweep) -> Result<Scenario, String> {
    let base_path = path
        .parent()
        .unwrap_or(Path::new("."))
        .join(&sweep.scenario);
    let outside = base_path
        .is_file()
        .then(|| crate::scenario::outside_data_root(&base_path))
        .flatten();
    if let Some(root) = outside {
        return Err(format!(
            "{}: field `scenario`: {} is outside the data root {}; pass --data-root to widen it",
            crate::input::shown(path),
            crate::input::shown(&base_path),
            root.display()
        ));
    }
    Scenario::load(&base_path)
        .map_err(|e| format!("{}: field `scenario`: {e}", crate::input::shown(path)))
}

/// A loaded sweep: its base scenario and tasks.
pub struct Plan {
    pub sweep: Sweep,
    pub base: Scenario,
    pub points: usize,
    pub sweep_hash: String,
}

/// Grid points whose scenarios are each validated at load; past it, each axis value alone is.
const POINTS_VALIDATED_MAX: usize = 100_000;
/// Tasks (points x seeds) of one sweep, at most.
const TASKS_MAX: u64 = 10_000_000;

impl Plan {
    pub fn load(path: &Path) -> Result<Plan, String> {
        let shown = crate::input::shown(path);
        let text = crate::input::read_text(path, crate::input::CONFIG_BYTES_MAX)
            .map_err(|e| format!("{shown}: cannot read sweep: {e}"))?;
        let sweep: Sweep = ron::Options::default()
            .with_default_extension(ron::extensions::Extensions::IMPLICIT_SOME)
            .from_str(&text)
            .map_err(|e| {
                let comma = matches!(e.code, ron::Error::ExpectedComma);
                let fraction = comma
                    .then(|| crate::scenario::fraction_for_whole(&text, e.span.start, ""))
                    .flatten();
                format!(
                    "{shown}:{}: {}",
                    e.span.start,
                    fraction.unwrap_or(e.code.to_string())
                )
            })?;
        let points = counts(&sweep).map_err(|e| format!("{shown}: {e}"))?;
        let base = base_scenario(path, &sweep)?;
        let canonical = ron::to_string(&sweep).expect("sweep serialises") + &base.hash();
        let plan = Plan {
            sweep,
            base,
            points,
            sweep_hash: blake3::hash(canonical.as_bytes()).to_hex().to_string(),
        };
        plan.validate_grid(&text)
            .map_err(|e| format!("{shown}{e}"))?;
        Ok(plan)
    }

    /// Every grid value makes a valid scenario, checked before any task runs: each value alone
    /// on the base (reported at its `line:column`), then every point (up to
    /// `POINTS_VALIDATED_MAX`), since values can clash only together.
    fn validate_grid(&self, text: &str) -> Result<(), String> {
        for (k, axis) in self.sweep.grid.iter().enumerate() {
            // Each value's scenario, by hash: two values giving one scenario would make points
            // that differ only in name, and a planner would read "no effect" into them.
            let mut seen: Vec<(String, String)> = Vec::new();
            for i in 0..axis.len() {
                let mut s = self.base.clone();
                let value = axis.apply(i, &mut s);
                let at = crate::locate::grid_value(text, k, i)
                    .map_or_else(String::new, |(l, c)| format!(":{l}:{c}"));
                let name = axis.name();
                if let Err(e) = s.validate() {
                    return Err(format!(
                        "{at}: grid axis {name}, value {value}: field `{}` {}",
                        e.field, e.message
                    ));
                }
                let hash = s.hash();
                if let Some((other, _)) = seen.iter().find(|(_, h)| *h == hash) {
                    return Err(format!(
                        "{at}: grid axis {name}, value {value}: the same scenario as value \
                         {other}, so the axis would change nothing{}",
                        axis.why_inert(&self.base)
                    ));
                }
                seen.push((value, hash));
            }
        }
        if self.points <= POINTS_VALIDATED_MAX {
            for point in 0..self.points as u64 {
                let (s, values, _) = self.task(point * self.sweep.seeds);
                if let Err(e) = s.validate() {
                    return Err(format!(
                        ": grid point {point} ({}): field `{}` {}",
                        values.join(", "),
                        e.field,
                        e.message
                    ));
                }
            }
        }
        Ok(())
    }

    pub fn tasks(&self) -> u64 {
        self.points as u64 * self.sweep.seeds
    }

    /// Task `t`: its point's scenario, parameter values and seed.
    pub fn task(&self, t: u64) -> (Scenario, Vec<String>, u64) {
        let point = (t / self.sweep.seeds) as usize;
        let seed = self.sweep.first_seed + t % self.sweep.seeds;
        let mut s = self.base.clone();
        let mut rest = point;
        let mut values = Vec::new();
        // The last axis varies fastest.
        let mut idx = vec![0; self.sweep.grid.len()];
        for (k, axis) in self.sweep.grid.iter().enumerate().rev() {
            idx[k] = rest % axis.len();
            rest /= axis.len();
        }
        for (k, axis) in self.sweep.grid.iter().enumerate() {
            values.push(axis.apply(idx[k], &mut s));
        }
        (s, values, seed)
    }

    pub fn header(&self) -> Vec<String> {
        let mut h = vec!["task".to_string(), "point".into(), "seed".into()];
        h.extend(self.sweep.grid.iter().map(|a| a.name().to_string()));
        h.extend(METRICS.iter().map(|(name, _)| name.to_string()));
        h
    }
}

/// The metric columns of a sweep row: name and value, in one table so they cannot drift apart.
pub(crate) type Column = (
    &'static str,
    fn(&crate::run::Report, &crate::metrics::Summary) -> String,
);
pub(crate) const METRICS: [Column; 45] = [
    ("run_policy", |_, p| p.policy.clone()),
    ("scenario_hash", |r, _| r.scenario_hash.clone()),
    ("report_run_hash", |r, _| r.run_hash.clone()),
    ("run_hash", |_, p| p.run_hash.clone()),
    ("completed", |_, p| p.requests.completed.to_string()),
    ("cancelled", |_, p| p.requests.cancelled.to_string()),
    ("expired", |_, p| p.requests.expired.to_string()),
    ("cleanup_pending", |_, p| {
        p.requests.cleanup_pending.to_string()
    }),
    ("never_observed", |_, p| {
        p.requests.never_observed.to_string()
    }),
    ("leaked_gpu_s", |_, p| p.leaked_work.gpu_s.to_string()),
    ("leaked_token_steps", |_, p| {
        p.leaked_work.token_steps.to_string()
    }),
    ("late_output_discards", |_, p| {
        p.late_output_discards.to_string()
    }),
    ("late_outputs_admitted", |_, p| {
        p.late_outputs_admitted.to_string()
    }),
    ("siblings", |_, p| p.sibling_survival.siblings.to_string()),
    ("sibling_survival_rate", |_, p| {
        p.sibling_survival.rate.to_string()
    }),
    ("sibling_ttft_delta_p99_ms", |_, p| {
        p.sibling_latency_delta_ms.ttft_p99.to_string()
    }),
    ("retained_kv_block_s", |_, p| {
        p.retained.kv_block_s.to_string()
    }),
    ("ttft_p99_ms", |_, p| p.ttft_ms.p99.to_string()),
    ("e2e_p50_ms", |_, p| p.e2e_ms.p50.to_string()),
    ("e2e_p99_ms", |_, p| p.e2e_ms.p99.to_string()),
    // Against the ideal cancel; empty without one (no intents, or `ideal_baseline: false`).
    ("capacity_cost_gpu_busy_s", |_, p| cost(p, |c| c.gpu_busy_s)),
    ("capacity_cost_makespan_s", |_, p| cost(p, |c| c.makespan_s)),
    ("capacity_cost_goodput_rps", |_, p| {
        cost(p, |c| c.goodput_rps)
    }),
    // What a planner plots against load: throughput, delivered tokens, the latency quantiles,
    // stalls and preemptions, and the counterfactual's values beside them.
    ("throughput_rps", |_, p| p.throughput_rps.to_string()),
    ("output_tokens_per_s", |_, p| {
        p.output_tokens_per_s.to_string()
    }),
    ("ttft_p50_ms", |_, p| p.ttft_ms.p50.to_string()),
    ("tpot_p50_ms", |_, p| p.tpot_ms.p50.to_string()),
    ("tpot_p99_ms", |_, p| p.tpot_ms.p99.to_string()),
    ("admission_stalls", |_, p| {
        p.retained.admission_stalls.to_string()
    }),
    ("preemptions", |_, p| p.gpu.preemptions.to_string()),
    ("cf_throughput_rps", |r, _| {
        r.counterfactual.throughput_rps.to_string()
    }),
    ("cf_ttft_p50_ms", |r, _| {
        r.counterfactual.ttft_ms.p50.to_string()
    }),
    ("cf_ttft_p99_ms", |r, _| {
        r.counterfactual.ttft_ms.p99.to_string()
    }),
    ("cf_e2e_p50_ms", |r, _| {
        r.counterfactual.e2e_ms.p50.to_string()
    }),
    ("cf_e2e_p99_ms", |r, _| {
        r.counterfactual.e2e_ms.p99.to_string()
    }),
    // Durable agent jobs; empty without a `Jobs` source.
    ("jobs_completed", |_, p| job(p, |j| j.completed.to_string())),
    ("jobs_cancelled", |_, p| job(p, |j| j.cancelled.to_string())),
    ("jobs_expired", |_, p| job(p, |j| j.expired.to_string())),
    ("jobs_completion_won", |_, p| {
        job(p, |j| j.completion_won.to_string())
    }),
    ("jobs_cleanup_p50_ms", |_, p| {
        job(p, |j| j.cleanup_ms.p50.to_string())
    }),
    ("jobs_cleanup_p99_ms", |_, p| {
        job(p, |j| j.cleanup_ms.p99.to_string())
    }),
    ("jobs_cleanup_incomplete", |_, p| {
        job(p, |j| j.cleanup_incomplete.to_string())
    }),
    ("jobs_leaked_gpu_s", |_, p| {
        job(p, |j| j.leaked_gpu_s.to_string())
    }),
    ("jobs_late_observations", |_, p| {
        job(p, |j| j.late_observations.to_string())
    }),
    ("jobs_usage_gap_tokens", |_, p| {
        job(p, |j| j.usage_gap_tokens.to_string())
    }),
];

fn job(p: &crate::metrics::Summary, f: fn(&crate::metrics::JobsSummary) -> String) -> String {
    p.jobs.as_ref().map_or(String::new(), f)
}

fn cost(p: &crate::metrics::Summary, f: fn(&crate::metrics::CapacityCost) -> f64) -> String {
    p.capacity_cost
        .as_ref()
        .map_or(String::new(), |c| f(c).to_string())
}

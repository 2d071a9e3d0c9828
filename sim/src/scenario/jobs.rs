//! Durable agent jobs (a product's cancellation and deadline semantics, `docs/agent-jobs.md`):
//! the plan grammar, the job-level cancel and the worker's cleanup rules, and their checks at
//! load.
//!
//! A plan is a list of steps run in order: a provider call (one request into the cluster, its
//! prompt carrying the job's history), a wave of parallel tools, an approval wait, a named
//! subagent (a nested plan under the same deadline), a repeat of steps, or branches that run
//! side by side.

use std::collections::BTreeMap;

use petgraph::algo::toposort;
use petgraph::graph::DiGraph;
use serde::{Deserialize, Serialize};

use super::validate::{self as v, Check};
use crate::dist::Dist;

/// Provider attempts a job may journal (the product's limit per run).
pub const PROVIDER_ATTEMPTS_MAX: u32 = 4096;
/// Subagents nest at most this deep; a plan unrolled past it is refused.
pub const NESTING_MAX: u32 = 16;
/// Tools in one wave.
pub const TOOLS_PER_WAVE_MAX: u32 = 256;
/// Steps of a plan with its subagents and repeats unrolled (each run unrolls it once).
pub const STEPS_MAX: u64 = 1 << 16;
/// Branches of one `Parallel` step.
pub const BRANCHES_MAX: u64 = 64;

/// What every job of a `Jobs` source does, and how its cancel and cleanup behave.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct JobSpec {
    /// One deadline from acceptance, drawn per job: it covers queueing, retries and approval
    /// waits, and every child inherits what is left of it.
    pub deadline_ms: Dist,
    /// The steps every job runs, in order (empty with an `AgentTrace` source: the trace is the
    /// plan).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub plan: Vec<PlanStep>,
    /// Named plans that `Subagent` steps run.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub agents: BTreeMap<String, Vec<PlanStep>>,
    /// Attempts of a provider call that ended without its output (a sibling's group abort, a
    /// request deadline) before the job gives up on it and fails.
    #[serde(default = "one")]
    pub call_attempts: u32,
    /// Job-level cancels (policy runs only; the counterfactual has none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cancel: Option<JobCancel>,
    #[serde(default)]
    pub worker: Worker,
    /// The job's observer (the client reading its stream), if it leaves: `disconnect_ms` after
    /// acceptance. A durable job runs on without it; a job run inline (`durable: false`, the
    /// legacy inline execution) is cancelled with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observer: Option<Observer>,
    /// The provider's prices, if known: then each job reports its cost (a lower bound until
    /// its usage is complete), beside the true cost of what the GPUs computed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prices: Option<Prices>,
}

/// A provider's list prices, in US dollars per million tokens.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Prices {
    pub input_usd_per_mtok: f64,
    pub output_usd_per_mtok: f64,
}

impl Prices {
    /// The cost of `input` and `output` tokens.
    pub fn usd(&self, input: u64, output: u64) -> f64 {
        (input as f64 * self.input_usd_per_mtok + output as f64 * self.output_usd_per_mtok) / 1e6
    }
}

/// A job's observer, and whether the job outlives it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Observer {
    /// From the job's acceptance to the observer's disconnect (an SDK observation timeout,
    /// say).
    pub disconnect_ms: Dist,
    #[serde(default = "yes")]
    pub durable: bool,
    /// From the disconnect to the observer's reconnect (a GET of the job's events), if it comes
    /// back: it is replayed the events it missed, the interruption result included, and never
    /// restarts generation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reconnect_ms: Option<Dist>,
    /// How long a job's events are retained after its terminal result (default 300,000 ms): a
    /// reconnect later than that finds nothing, and the result goes unobserved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention_ms: Option<f64>,
}

/// Retention of a job's events after its terminal result, unless the scenario says.
pub const RETENTION_MS_DEFAULT: f64 = 300_000.0;

fn yes() -> bool {
    true
}

fn one() -> u32 {
    1
}

/// One step of a plan.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub enum PlanStep {
    /// A provider call: one request, its message and output drawn like any request's, its
    /// prompt the job's history so far plus the message.
    Call,
    /// `tools` tools in parallel, each running for a draw of `duration_ms`; each has an external
    /// effect (a committed write) with `effect_probability`. `developer_hosted` tools run in the
    /// developer's own system, not the job's sandbox: their results come back as submissions,
    /// which a terminal job rejects, and no cleanup can drain them.
    Tools {
        tools: u32,
        duration_ms: Dist,
        #[serde(default)]
        effect_probability: f64,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        developer_hosted: bool,
    },
    /// A wait for a human's approval.
    Approval { wait_ms: Dist },
    /// The plan named in `agents`, nested under the same deadline.
    Subagent(String),
    /// `steps`, `times` times over.
    Repeat { times: u32, steps: Vec<PlanStep> },
    /// Branches that run side by side (subagents fanned out, say), each its own list of steps;
    /// the step after waits for all of them.
    Parallel(Vec<Vec<PlanStep>>),
}

/// Which jobs get a cancel, and when.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct JobCancel {
    /// Probability that a job is cancelled (ignored when `jobs` names them).
    #[serde(default)]
    pub fraction: f64,
    /// Exactly these job numbers (0-based, in order of acceptance) are cancelled.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub jobs: Vec<u64>,
    /// From the job's acceptance to its cancel request.
    pub delay_ms: Dist,
    /// The client sends the cancel this many more times, with the same idempotency key, 1 ms
    /// apart: each duplicate must change nothing.
    #[serde(default)]
    pub duplicates: u32,
}

/// The workers that run a job's steps, and how they clean up after its terminal decision.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Worker {
    /// Workers observe the committed terminal state this often, as a fallback to the
    /// notification (the product's 250 ms).
    #[serde(default = "poll_default")]
    pub poll_ms: f64,
    /// The notification's latency.
    #[serde(default = "notify_default")]
    pub notify_ms: f64,
    /// Probability that the notification is lost (then only the poll tells the worker).
    #[serde(default)]
    pub notify_loss: f64,
    /// Each cleanup wait's allowance (the product's two seconds); a resource that needs longer
    /// takes more than one.
    #[serde(default = "allowance_default")]
    pub allowance_ms: f64,
    /// Allowances a job's cleanup may use in all; past them it reports itself incomplete and
    /// keeps its dispatch fence.
    #[serde(default = "allowances_default")]
    pub allowances_max: u32,
    /// Terminating the job's owned sandbox (its process group), once it ran a tool.
    #[serde(default = "kill_default")]
    pub sandbox_kill_ms: Dist,
}

fn poll_default() -> f64 {
    250.0
}
fn notify_default() -> f64 {
    5.0
}
fn allowance_default() -> f64 {
    2000.0
}
fn allowances_default() -> u32 {
    4
}
fn kill_default() -> Dist {
    Dist::Constant(50.0)
}

impl Default for Worker {
    fn default() -> Self {
        Worker {
            poll_ms: poll_default(),
            notify_ms: notify_default(),
            notify_loss: 0.0,
            allowance_ms: allowance_default(),
            allowances_max: allowances_default(),
            sandbox_kill_ms: kill_default(),
        }
    }
}

/// The most of each kind a plan can do, its subagents and repeats unrolled.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PlanBounds {
    pub calls: u64,
    /// Steps unrolled (a subagent's start and end count as one each).
    pub steps: u64,
}

impl JobSpec {
    /// Whether a step of the plan (or of an agent) runs developer-hosted tools.
    pub fn has_hosted_tools(&self) -> bool {
        fn any(plan: &[PlanStep]) -> bool {
            plan.iter().any(|s| match s {
                PlanStep::Tools {
                    developer_hosted, ..
                } => *developer_hosted,
                PlanStep::Repeat { steps, .. } => any(steps),
                PlanStep::Parallel(b) => b.iter().any(|x| any(x)),
                _ => false,
            })
        }
        any(&self.plan) || self.agents.values().any(|p| any(p))
    }

    /// The plan's bounds, its subagents unrolled (after `validate`: no cycle, names known).
    pub fn bounds(&self) -> PlanBounds {
        bounds_of(&self.plan, &self.agents, 0)
    }

    /// The checks of a trace's jobs: every field but the plan, which the trace gives.
    pub(super) fn validate_traced(&self, f: &str) -> Check {
        if !self.plan.is_empty() || !self.agents.is_empty() {
            let m = "must be empty with an `AgentTrace` source: the trace is the plan";
            return v::err(&format!("{f}.plan"), m.into());
        }
        self.validate_rest(f)
    }

    pub(super) fn validate(&self, f: &str) -> Check {
        if self.plan.is_empty() {
            return v::err(&format!("{f}.plan"), "must hold at least one step".into());
        }
        self.validate_rest(f)
    }

    fn validate_rest(&self, f: &str) -> Check {
        v::dist(&format!("{f}.deadline_ms"), &self.deadline_ms)?;
        if self.deadline_ms.mean() == 0.0 {
            return v::err(
                &format!("{f}.deadline_ms"),
                "a deadline of 0: no job can run".into(),
            );
        }
        steps(&format!("{f}.plan"), &self.plan, &self.agents)?;
        for (name, plan) in &self.agents {
            steps(&format!("{f}.agents.{name}"), plan, &self.agents)?;
        }
        self.acyclic(f)?;
        v::in_range(
            &format!("{f}.call_attempts"),
            self.call_attempts as u64,
            1,
            16,
        )?;
        let b = self.bounds();
        let attempts = b.calls.saturating_mul(self.call_attempts as u64);
        if attempts > PROVIDER_ATTEMPTS_MAX as u64 {
            let m = format!(
                "the plan can journal {attempts} provider attempts ({} calls x {} attempts); a \
                 job may journal at most {PROVIDER_ATTEMPTS_MAX}",
                b.calls, self.call_attempts
            );
            return v::err(&format!("{f}.plan"), m);
        }
        if b.steps > STEPS_MAX {
            let m = format!(
                "the plan unrolls to {} steps, its subagents and repeats counted; at most \
                 {STEPS_MAX}",
                b.steps
            );
            return v::err(&format!("{f}.plan"), m);
        }
        self.validate_sides(f)
    }

    /// The cancel, the observer, the prices and the worker.
    fn validate_sides(&self, f: &str) -> Check {
        if let Some(c) = &self.cancel {
            v::probability(&format!("{f}.cancel.fraction"), c.fraction)?;
            v::dist(&format!("{f}.cancel.delay_ms"), &c.delay_ms)?;
            v::in_range(
                &format!("{f}.cancel.duplicates"),
                c.duplicates as u64,
                0,
                16,
            )?;
        }
        if let Some(o) = &self.observer {
            v::dist(&format!("{f}.observer.disconnect_ms"), &o.disconnect_ms)?;
            if let Some(r) = &o.reconnect_ms {
                v::dist(&format!("{f}.observer.reconnect_ms"), r)?;
            }
            if let Some(r) = o.retention_ms {
                v::non_negative(&format!("{f}.observer.retention_ms"), r)?;
            }
        }
        if let Some(p) = &self.prices {
            v::non_negative(
                &format!("{f}.prices.input_usd_per_mtok"),
                p.input_usd_per_mtok,
            )?;
            v::non_negative(
                &format!("{f}.prices.output_usd_per_mtok"),
                p.output_usd_per_mtok,
            )?;
        }
        let w = &self.worker;
        v::positive(&format!("{f}.worker.poll_ms"), w.poll_ms)?;
        v::non_negative(&format!("{f}.worker.notify_ms"), w.notify_ms)?;
        v::probability(&format!("{f}.worker.notify_loss"), w.notify_loss)?;
        v::positive(&format!("{f}.worker.allowance_ms"), w.allowance_ms)?;
        v::in_range(
            &format!("{f}.worker.allowances_max"),
            w.allowances_max as u64,
            1,
            1000,
        )?;
        v::dist(&format!("{f}.worker.sandbox_kill_ms"), &w.sandbox_kill_ms)
    }

    /// Subagents that run each other, however indirectly, never end: refused by a topological
    /// sort of the graph of who runs whom.
    fn acyclic(&self, f: &str) -> Check {
        let mut g: DiGraph<&str, ()> = DiGraph::new();
        let nodes: BTreeMap<&str, _> = self
            .agents
            .keys()
            .map(|k| (k.as_str(), g.add_node(k.as_str())))
            .collect();
        for (name, plan) in &self.agents {
            let mut called = Vec::new();
            subagents(plan, &mut called);
            for c in called {
                g.add_edge(nodes[name.as_str()], nodes[c], ());
            }
        }
        match toposort(&g, None) {
            Ok(_) => Ok(()),
            Err(cycle) => {
                let name = g[cycle.node_id()];
                let m = format!("subagent {name:?} runs itself, through a cycle of subagents");
                v::err(&format!("{f}.agents.{name}"), m)
            }
        }
    }
}

fn steps(f: &str, plan: &[PlanStep], agents: &BTreeMap<String, Vec<PlanStep>>) -> Check {
    for (i, s) in plan.iter().enumerate() {
        let f = format!("{f}[{i}]");
        match s {
            PlanStep::Call => {}
            PlanStep::Tools {
                tools,
                duration_ms,
                effect_probability,
                ..
            } => {
                v::in_range(
                    &format!("{f}.Tools.tools"),
                    *tools as u64,
                    1,
                    TOOLS_PER_WAVE_MAX as u64,
                )?;
                duration(&format!("{f}.Tools.duration_ms"), duration_ms)?;
                v::probability(
                    &format!("{f}.Tools.effect_probability"),
                    *effect_probability,
                )?;
            }
            PlanStep::Approval { wait_ms } => duration(&format!("{f}.Approval.wait_ms"), wait_ms)?,
            PlanStep::Subagent(name) if !agents.contains_key(name) => {
                let known: Vec<&str> = agents.keys().map(String::as_str).collect();
                let m = format!("no agent named {name:?} (agents: {known:?})");
                return v::err(&format!("{f}.Subagent"), m);
            }
            PlanStep::Subagent(_) => {}
            PlanStep::Repeat {
                times,
                steps: inner,
            } => {
                v::in_range(&format!("{f}.Repeat.times"), *times as u64, 1, 4096)?;
                if inner.is_empty() {
                    return v::err(&format!("{f}.Repeat.steps"), "must hold a step".into());
                }
                steps(&format!("{f}.Repeat.steps"), inner, agents)?;
            }
            PlanStep::Parallel(branches) => {
                let n = branches.len() as u64;
                v::in_range(&format!("{f}.Parallel"), n, 1, BRANCHES_MAX)?;
                for (k, b) in branches.iter().enumerate() {
                    let f = format!("{f}.Parallel[{k}]");
                    if b.is_empty() {
                        return v::err(&f, "a branch must hold a step".into());
                    }
                    steps(&f, b, agents)?;
                }
            }
        }
    }
    Ok(())
}

/// A step's duration: a valid distribution that is not always zero (a step with no duration).
fn duration(f: &str, d: &Dist) -> Check {
    v::dist(f, d)?;
    if d.mean() == 0.0 {
        return v::err(
            f,
            "a step with no duration: must be able to last > 0 ms".into(),
        );
    }
    Ok(())
}

fn subagents<'a>(plan: &'a [PlanStep], out: &mut Vec<&'a str>) {
    for s in plan {
        match s {
            PlanStep::Subagent(n) => out.push(n),
            PlanStep::Repeat { steps, .. } => subagents(steps, out),
            PlanStep::Parallel(branches) => branches.iter().for_each(|b| subagents(b, out)),
            _ => {}
        }
    }
}

fn bounds_of(
    plan: &[PlanStep],
    agents: &BTreeMap<String, Vec<PlanStep>>,
    depth: u32,
) -> PlanBounds {
    let past = PlanBounds {
        calls: u64::MAX,
        steps: u64::MAX,
    };
    if depth > NESTING_MAX {
        // Deeper than any plan may nest: counted as past every limit.
        return past;
    }
    let mut b = PlanBounds::default();
    for s in plan {
        let one = |calls| PlanBounds { calls, steps: 1 };
        let inner = match s {
            PlanStep::Call => one(1),
            PlanStep::Tools { .. } => one(0),
            PlanStep::Approval { .. } => one(0),
            PlanStep::Subagent(n) => {
                let a = agents
                    .get(n)
                    .map_or_else(PlanBounds::default, |p| bounds_of(p, agents, depth + 1));
                PlanBounds {
                    steps: a.steps.saturating_add(2),
                    ..a
                }
            }
            PlanStep::Repeat { times, steps } => {
                let r = bounds_of(steps, agents, depth);
                let t = *times as u64;
                PlanBounds {
                    calls: r.calls.saturating_mul(t),
                    steps: r.steps.saturating_mul(t),
                }
            }
            PlanStep::Parallel(branches) => {
                let each = branches.iter().map(|b| bounds_of(b, agents, depth));
                each.fold(PlanBounds::default(), |a, r| PlanBounds {
                    calls: a.calls.saturating_add(r.calls),
                    steps: a.steps.saturating_add(r.steps),
                })
            }
        };
        b.calls = b.calls.saturating_add(inner.calls);
        b.steps = b.steps.saturating_add(inner.steps);
    }
    b
}

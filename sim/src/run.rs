//! The one entry point of a simulation: the counterfactual, then one run per policy, on one
//! seed. `main`, `check` and `sweep` all come through `run`.

use std::sync::Arc;

use cancelsim_models::gpu::StepTable;

use crate::metrics::{CapacityCost, Summary};
use crate::record::{Extras, Recording, RequestSink, TraceSink};
use crate::scenario::{Policy, ProfileRef, Scenario, Source, TraceFormat};
use crate::workload::TraceReader;
#[cfg(feature = "broken-variants")]
use crate::world::Hooks;
use crate::world::{CfTable, Inputs, Mode, RunError, World};

/// The counterfactual and one run per policy, on one seed.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Report {
    pub scenario: String,
    pub scenario_hash: String,
    pub seed: u64,
    pub version: String,
    /// The git commit cancelsim was built from.
    pub commit: String,
    pub counterfactual: Summary,
    pub policies: Vec<Summary>,
    /// The ideal cancel on the same intents: the baseline of each policy's `capacity_cost`. Run
    /// when the scenario has cancel intents and `cancellation.ideal_baseline` is on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ideal: Option<Summary>,
    /// BLAKE3 over the counterfactual's, every policy run's and the ideal's hash, in order.
    pub run_hash: String,
}

/// How to run: what to record, and (tests only) deliberately broken variants. The sinks are
/// borrowed for the report's runs: the caller opened them, and closes them after.
#[derive(Default)]
pub struct RunOptions<'a> {
    /// Sample the gauges every this many virtual ns (0: never).
    pub sample_ns: u64,
    /// Where per-request rows stream, across all the runs of the report.
    pub sink: Option<&'a mut (dyn RequestSink + 'static)>,
    /// Where the runs' Chrome trace events stream, if anywhere.
    pub trace: Option<&'a mut (dyn TraceSink + 'static)>,
    /// Trace events kept per run, at most.
    pub trace_events_max: u64,
    /// Told how many requests have arrived, per run (a progress bar); never changes a run.
    pub progress: Option<crate::record::Progress>,
    /// No request rides a replica's streak: every token is an output of its step, as before
    /// the streak. The same answers and run hashes, slower: a check of the fast path.
    pub no_streak: bool,
    /// Broken variants of the policy runs (never set by a scenario or a flag).
    #[cfg(feature = "broken-variants")]
    pub hooks: Hooks,
}

/// What run `pid` of a report records: the options' sinks, reborrowed for it.
fn recording<'b>(pid: u32, opts: &'b mut RunOptions<'_>) -> Recording<'b> {
    Recording {
        sample_ns: opts.sample_ns,
        sink: opts.sink.as_deref_mut(),
        trace: opts.trace.as_deref_mut(),
        trace_events_max: opts.trace_events_max,
        trace_pid: pid,
        progress: opts.progress.clone(),
    }
}

/// Run the counterfactual, then every policy of the scenario, on `seed`. Returns the report and
/// each run's extras (the counterfactual's first).
pub fn run(
    scenario: &Scenario,
    seed: u64,
    mut opts: RunOptions<'_>,
) -> Result<(Report, Vec<Extras>), RunError> {
    let mut table = CfTable::default();
    let intents = has_intent_sources(scenario);
    let steps = read_once(scenario)?;
    let cf_table = intents.then_some(&mut table);
    let no_streak = opts.no_streak;
    let world = World::new(
        scenario,
        seed,
        Mode::Counterfactual,
        cf_table,
        inputs(scenario, &steps)?,
    )?;
    let (counterfactual, first) = with_streak(world, no_streak)
        .with_recording(recording(0, &mut opts))
        .run_recorded()?;
    let mut extras = vec![first];
    let mut policies = Vec::with_capacity(scenario.policies.len());
    for (i, p) in scenario.policies.iter().enumerate() {
        if !intents {
            // Without any source of cancel intents a policy run is the counterfactual event for
            // event (the same run hash; a test shows it), so it is not simulated again.
            let mut same = counterfactual.clone();
            same.policy = p.label();
            policies.push(same);
            extras.push(Extras::default());
            continue;
        }
        let world = World::new(
            scenario,
            seed,
            Mode::Policy(p, &table),
            None,
            inputs(scenario, &steps)?,
        )?;
        let world = with_streak(world, no_streak);
        #[cfg(feature = "broken-variants")]
        let world = world.with_hooks(opts.hooks);
        let world = world.with_recording(recording(i as u32 + 1, &mut opts));
        let (summary, e) = world.run_recorded()?;
        policies.push(summary);
        extras.push(e);
    }
    let ideal = if intents && ideal_baseline(scenario) {
        let mode = Mode::Policy(&Policy::Ideal, &table);
        let world = World::new(scenario, seed, mode, None, inputs(scenario, &steps)?)?;
        let ideal = with_streak(world, no_streak).run()?;
        for p in &mut policies {
            p.capacity_cost = Some(CapacityCost::of(p, &ideal));
        }
        Some(ideal)
    } else {
        None
    };
    Ok((
        assemble(scenario, seed, counterfactual, policies, ideal),
        extras,
    ))
}

/// `world`, with no streak if `no_streak` (`RunOptions::no_streak`).
fn with_streak(world: World<'_>, no_streak: bool) -> World<'_> {
    if no_streak {
        world.without_streak()
    } else {
        world
    }
}

/// Whether the report runs the ideal cancel as a baseline.
fn ideal_baseline(s: &Scenario) -> bool {
    s.cancellation.as_ref().is_none_or(|c| c.ideal_baseline)
}

/// `run` with nothing recorded: the report alone.
pub fn report(scenario: &Scenario, seed: u64) -> Result<Report, RunError> {
    run(scenario, seed, RunOptions::default()).map(|(r, _)| r)
}

/// `report` with deliberately broken variants (tests of the checker only).
#[cfg(feature = "broken-variants")]
pub fn report_with(scenario: &Scenario, seed: u64, hooks: Hooks) -> Result<Report, RunError> {
    let opts = RunOptions {
        hooks,
        ..RunOptions::default()
    };
    run(scenario, seed, opts).map(|(r, _)| r)
}

/// Run only the counterfactual (no cancel intents): the runtime alone.
pub fn counterfactual(scenario: &Scenario, seed: u64) -> Result<Summary, RunError> {
    let inputs = inputs(scenario, &read_once(scenario)?)?;
    World::new(scenario, seed, Mode::Counterfactual, None, inputs)?.run()
}

fn assemble(
    scenario: &Scenario,
    seed: u64,
    counterfactual: Summary,
    policies: Vec<Summary>,
    ideal: Option<Summary>,
) -> Report {
    let mut h = blake3::Hasher::new();
    h.update(counterfactual.run_hash.as_bytes());
    for p in policies.iter().chain(&ideal) {
        h.update(p.run_hash.as_bytes());
    }
    Report {
        scenario: scenario.name.clone(),
        scenario_hash: scenario.hash(),
        seed,
        version: env!("CARGO_PKG_VERSION").to_string(),
        commit: env!("CANCELSIM_COMMIT").to_string(),
        counterfactual,
        policies,
        ideal,
        run_hash: h.finalize().to_hex().to_string(),
    }
}

/// The measured step times of a `Table` profile, read once for all the runs of a report.
fn step_table(s: &Scenario) -> Result<Option<Arc<StepTable>>, RunError> {
    match &s.cluster.profile {
        ProfileRef::Table { path, .. } => crate::step_table::load(&s.base_dir.join(path))
            .map(Some)
            .map_err(RunError::Input),
        _ => Ok(None),
    }
}

/// What one run reads from outside: the step table, shared, and its own reader of the trace
/// (each run replays it from the first row).
fn inputs(s: &Scenario, read: &Read) -> Result<Inputs, RunError> {
    let trace = match &s.workload.source {
        Source::Trace { path, format, .. } => {
            let path = s.base_dir.join(path);
            if matches!(s.cluster.router, crate::scenario::Router::KvAware { .. }) {
                kv_router_has_hashes(&path, *format)?;
            }
            Some(TraceReader::open(&path, *format).map_err(RunError::Input)?)
        }
        _ => None,
    };
    Ok(Inputs {
        step_table: read.0.clone(),
        trace,
        sessions: read.1.clone(),
    })
}

/// A KV-aware router scores replicas by a trace's block hashes: a trace whose first row has
/// none gives it nothing to score (validation let only a Mooncake trace through).
fn kv_router_has_hashes(path: &std::path::Path, format: TraceFormat) -> Result<(), RunError> {
    let mut r = TraceReader::open(path, format).map_err(RunError::Input)?;
    let first = r.next_row().map_err(RunError::Input)?;
    if first.is_some() && r.prefix_ids().is_empty() {
        return Err(RunError::Input(format!(
            "{}:1: field `cluster.router.KvAware` needs the trace's block hashes, and its first \
             row has no `hash_ids` (nothing to score the replicas by)",
            crate::input::shown(path)
        )));
    }
    Ok(())
}

/// What every run of a report reads, read once: the step table, and an agent trace's sessions.
type Read = (
    Option<Arc<StepTable>>,
    Option<Arc<crate::workload::agentic::AgentSessions>>,
);

fn read_once(s: &Scenario) -> Result<Read, RunError> {
    let sessions = match &s.workload.source {
        Source::AgentTrace { path, .. } => Some(Arc::new(
            crate::workload::agentic::load(&s.base_dir.join(path)).map_err(RunError::Input)?,
        )),
        _ => None,
    };
    Ok((step_table(s)?, sessions))
}

/// Whether anything in the scenario can produce a cancel intent.
pub fn has_intent_sources(s: &Scenario) -> bool {
    let barge_in = matches!(
        &s.workload.source,
        Source::Conversations {
            barge_in: Some(_),
            ..
        }
    );
    // A job always has its deadline, and maybe cancels.
    let jobs = matches!(
        &s.workload.source,
        Source::Jobs { .. } | Source::AgentTrace { .. }
    );
    s.cancellation.is_some()
        || jobs
        || s.workload.deadline_ms.is_some()
        || s.workload.disconnect_ms.is_some()
        || barge_in
}

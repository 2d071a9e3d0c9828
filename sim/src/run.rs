//! The one entry point of a simulation: the counterfactual, then one run per policy, on one
//! seed. `main`, `check` and `sweep` all come through `run`.

use crate::metrics::CapacityCost;
use crate::metrics::Summary;
use crate::record::{Extras, Recording, RequestSink, TraceSink};
use crate::scenario::{Policy, Scenario, Source};
#[cfg(feature = "broken-variants")]
use crate::world::Hooks;
use crate::world::{CfTable, Mode, RunError, World};

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

/// How to run: what to record, and (tests only) deliberately broken variants.
#[derive(Default)]
pub struct RunOptions {
    /// Sample the gauges every this many virtual ns (0: never).
    pub sample_ns: u64,
    /// Where per-request rows stream, across all the runs of the report.
    pub sink: Option<Box<dyn RequestSink>>,
    /// Where the runs' Chrome trace events stream, if anywhere.
    pub trace: Option<Box<dyn TraceSink>>,
    /// Trace events kept per run, at most.
    pub trace_events_max: u64,
    /// Told how many requests have arrived, per run (a progress bar); never changes a run.
    pub progress: Option<crate::record::Progress>,
    /// Broken variants of the policy runs (never set by a scenario or a flag).
    #[cfg(feature = "broken-variants")]
    pub hooks: Hooks,
}

/// Run the counterfactual, then every policy of the scenario, on `seed`. Returns the report and
/// each run's extras (the counterfactual's first, which also hands the sink back).
pub fn run(
    scenario: &Scenario,
    seed: u64,
    mut opts: RunOptions,
) -> Result<(Report, Vec<Extras>), RunError> {
    let mut table = CfTable::default();
    let intents = has_intent_sources(scenario);
    let rec = |pid: u32, opts: &mut RunOptions| Recording {
        sample_ns: opts.sample_ns,
        sink: opts.sink.take(),
        trace: opts.trace.take(),
        trace_events_max: opts.trace_events_max,
        trace_pid: pid,
        progress: opts.progress.clone(),
    };
    let cf_table = intents.then_some(&mut table);
    let world = World::new(scenario, seed, Mode::Counterfactual, cf_table)?;
    let (counterfactual, mut first) = world.with_recording(rec(0, &mut opts)).run_recorded()?;
    opts.sink = first.sink.take();
    opts.trace = first.trace_sink.take();
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
        let world = World::new(scenario, seed, Mode::Policy(p, &table), None)?;
        let recording = rec(i as u32 + 1, &mut opts);
        #[cfg(feature = "broken-variants")]
        let world = world.with_hooks(opts.hooks);
        let world = world.with_recording(recording);
        let (summary, mut e) = world.run_recorded()?;
        opts.sink = e.sink.take();
        opts.trace = e.trace_sink.take();
        policies.push(summary);
        extras.push(e);
    }
    let ideal = if intents && ideal_baseline(scenario) {
        let world = World::new(scenario, seed, Mode::Policy(&Policy::Ideal, &table), None)?;
        let ideal = world.run()?;
        for p in &mut policies {
            p.capacity_cost = Some(CapacityCost::of(p, &ideal));
        }
        Some(ideal)
    } else {
        None
    };
    extras[0].sink = opts.sink;
    extras[0].trace_sink = opts.trace;
    Ok((
        assemble(scenario, seed, counterfactual, policies, ideal),
        extras,
    ))
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
    World::new(scenario, seed, Mode::Counterfactual, None)?.run()
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

/// Whether anything in the scenario can produce a cancel intent.
pub fn has_intent_sources(s: &Scenario) -> bool {
    let barge_in = matches!(
        &s.workload.source,
        Source::Conversations {
            barge_in: Some(_),
            ..
        }
    );
    s.cancellation.is_some()
        || s.workload.deadline_ms.is_some()
        || s.workload.disconnect_ms.is_some()
        || barge_in
}

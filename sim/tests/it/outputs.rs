//! What a run leaves on disk: every file is there, `trace.json` passes the structural checker,
//! `requests.csv` has one row per request and run, and the plots are byte-identical across runs.

use crate::scratch::Scratch;
use std::path::Path;

use cancelsim::output::{trace_check, Finished, RunDir, Written};
use cancelsim::record::TRACE_EVENTS_MAX;
use cancelsim::run::{self, Report, RunOptions};
use cancelsim::scenario::Scenario;

fn scratch(name: &str) -> Scratch {
    Scratch::new("out", name, false)
}

fn write(root: &Path, scenario: &Scenario, force: bool) -> (Written, Report) {
    let (done, report) = write_cut(root, scenario, force, TRACE_EVENTS_MAX as u64);
    assert!(done.warnings.is_empty(), "{:?}", done.warnings);
    (done.written, report)
}

fn write_cut(
    root: &Path,
    scenario: &Scenario,
    force: bool,
    trace_events_max: u64,
) -> (Finished, Report) {
    let dir = RunDir::begin(root, &scenario.name).unwrap();
    let (mut sink, mut trace) = (dir.requests_sink().unwrap(), dir.trace_sink().unwrap());
    let opts = RunOptions {
        sample_ns: 100_000_000,
        sink: Some(sink.as_mut()),
        trace: Some(trace.as_mut()),
        trace_events_max,
        ..RunOptions::default()
    };
    let (report, extras) = run::run(scenario, scenario.seed, opts).unwrap();
    let done = dir
        .finish(&report, extras, (Some(sink), Some(trace)), force)
        .unwrap();
    if !matches!(done.written, Written::Kept(_)) {
        assert_eq!(done.plots.len(), 4);
    }
    (done, report)
}

#[test]
fn a_trace_cut_by_its_limit_is_well_formed_and_says_so() {
    let root = scratch("cut");
    let scenario = Scenario::default_embedded();
    let (done, report) = write_cut(&root, &scenario, false, 2_000);
    // One warning per run (the counterfactual and four policies), each naming its run.
    assert_eq!(done.warnings.len(), 5, "{:?}", done.warnings);
    for (w, p) in done
        .warnings
        .iter()
        .zip(std::iter::once(&report.counterfactual).chain(&report.policies))
    {
        assert!(
            w.contains(&format!("run {} kept its first", p.policy)),
            "{w}"
        );
        assert!(w.contains("raise --trace-events"), "{w}");
    }
    let Written::New(dir) = done.written else {
        panic!("{:?}", done.written)
    };
    check_trace(&dir);
    let trace: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("trace.json")).unwrap()).unwrap();
    let events = trace["traceEvents"].as_array().unwrap();
    let kept = events.iter().filter(|e| e["ph"] != "M").count();
    assert!(kept <= 5 * 2_000, "{kept} events kept");
    assert!(trace["otherData"]["events_dropped"].as_u64().unwrap() > 0);
}

#[test]
fn a_run_directory_has_every_output_and_a_valid_trace() {
    let root = scratch("all");
    let scenario = Scenario::default_embedded();
    let (written, report) = write(&root, &scenario, false);
    let Written::New(dir) = written else {
        panic!("{written:?}")
    };
    for f in [
        "summary.json",
        "requests.csv",
        "timeseries.csv",
        "trace.json",
        "plots/policies.png",
        "plots/policies.svg",
        "plots/cleanup_cdf.png",
        "plots/kv_retained.png",
        "plots/sibling_ttft.png",
    ] {
        assert!(dir.join(f).is_file(), "missing {f}");
    }
    for f in ["pools.csv", "plots/pools.png", "plots/handoff_pinned.png"] {
        assert!(!dir.join(f).exists(), "colocated, yet {f}");
    }
    check_trace(&dir);
    check_requests_csv(&dir, &report);
    check_summary_json(&dir);
    // Nothing temporary is left.
    let leftovers: Vec<_> = std::fs::read_dir(root.join("default"))
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

/// The trace opens in Perfetto: known phases, balanced and nested slices, paired flows.
fn check_trace(dir: &Path) {
    let trace: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("trace.json")).unwrap()).unwrap();
    assert_eq!(trace_check::check(&trace), Vec::<String>::new());
    let events = trace["traceEvents"].as_array().unwrap();
    assert!(
        events.iter().any(|e| e["ph"] == "s") && events.iter().any(|e| e["ph"] == "f"),
        "cancel flows"
    );
    assert!(
        events.iter().all(|e| e["ph"] == "M" || e["ts"].is_u64()),
        "integer µs timestamps"
    );
}

fn check_requests_csv(dir: &Path, report: &Report) {
    // One row per request per run (the counterfactual and each policy).
    let rows = std::fs::read_to_string(dir.join("requests.csv"))
        .unwrap()
        .lines()
        .count()
        - 1;
    let runs = 1 + report.policies.len() as u64;
    assert_eq!(rows as u64, runs * report.counterfactual.requests.scheduled);
    // Per request: token-steps and KV block-seconds add up to the run's totals.
    let mut r = csv::Reader::from_path(dir.join("requests.csv")).unwrap();
    let (mut steps, mut block_s) = (0u64, 0f64);
    for row in r.deserialize::<std::collections::BTreeMap<String, String>>() {
        let row = row.unwrap();
        if row["policy"] == "counterfactual" {
            steps += row["token_steps"].parse::<u64>().unwrap();
            block_s += row["kv_block_s"].parse::<f64>().unwrap();
        }
    }
    assert_eq!(steps, report.counterfactual.gpu.token_steps);
    assert!((block_s - report.counterfactual.kv.block_s).abs() < 1e-6 * block_s.max(1.0));
}

fn check_summary_json(dir: &Path) {
    // summary.json carries what reproduces the run.
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("summary.json")).unwrap()).unwrap();
    for key in ["scenario_hash", "seed", "run_hash", "version", "commit"] {
        assert!(!summary[key].is_null(), "summary.json lacks {key}");
    }
    // The DESIGN keys, per policy.
    for key in [
        "requests",
        "leaked_work",
        "late_output_discards",
        "late_outputs_admitted",
        "sibling_survival",
        "sibling_latency_delta_ms",
        "retained",
        "cleanup_latency_ms",
        "ttft_ms",
        "tpot_ms",
        "e2e_ms",
    ] {
        assert!(
            !summary["policies"][1][key].is_null(),
            "policy summary lacks {key}"
        );
    }
}

#[test]
fn an_existing_run_is_kept_unless_forced_and_plots_are_reproducible() {
    let root = scratch("again");
    let scenario = Scenario::default_embedded();
    let (first, _) = write(&root, &scenario, false);
    let Written::New(dir) = first else { panic!() };
    let png = std::fs::read(dir.join("plots/policies.png")).unwrap();
    let (second, _) = write(&root, &scenario, false);
    assert_eq!(second, Written::Kept(dir.clone()));
    let (third, _) = write(&root, &scenario, true);
    assert_eq!(third, Written::Replaced(dir.clone()));
    assert_eq!(
        std::fs::read(dir.join("plots/policies.png")).unwrap(),
        png,
        "plots are byte-identical"
    );
}

#[test]
fn a_failed_run_leaves_no_partial_directory() {
    let root = scratch("failed");
    let mut scenario = Scenario::default_embedded();
    scenario.limits.max_events = 500;
    let dir = RunDir::begin(&root, &scenario.name).unwrap();
    let mut sink = dir.requests_sink().unwrap();
    assert!(run::run(
        &scenario,
        1,
        RunOptions {
            sink: Some(sink.as_mut()),
            ..RunOptions::default()
        }
    )
    .is_err());
    drop(dir);
    // Not even the scenario's directory, which this run created.
    assert!(!root.join("default").exists());
}

//! The run directory's data files besides `summary.json` and `requests.csv`: the gauge time
//! series and the Chrome trace, which must pass its structural check before it is written.

use std::path::Path;

use crate::record::{Extras, TraceArgs, TraceEvent, CANCELS_TID};
use crate::run::Report;

pub(super) fn write_timeseries(
    path: &Path,
    report: &Report,
    extras: &[Extras],
) -> Result<(), String> {
    let err = |e: csv::Error| format!("{}: {e}", path.display());
    let mut w = csv::Writer::from_path(path).map_err(err)?;
    w.write_record([
        "policy",
        "t_s",
        "kv_blocks",
        "kv_retained",
        "queue",
        "running",
        "cancels_in_flight",
    ])
    .map_err(err)?;
    let names = std::iter::once(&report.counterfactual)
        .chain(&report.policies)
        .map(|s| s.policy.clone());
    for (name, e) in names.zip(extras) {
        for s in &e.timeseries {
            w.write_record([
                name.clone(),
                format!("{}", s.t_s),
                s.kv_blocks.to_string(),
                s.kv_retained.to_string(),
                s.queue.to_string(),
                s.running.to_string(),
                s.cancels_in_flight.to_string(),
            ])
            .map_err(err)?;
        }
    }
    w.flush().map_err(|e| format!("{}: {e}", path.display()))
}

/// All runs in one Chrome trace: one process per run (the counterfactual first), a thread per
/// replica, the requests' async tracks and a "cancels" thread with the flows.
pub(super) fn write_trace(path: &Path, report: &Report, extras: &[Extras]) -> Result<(), String> {
    let mut events: Vec<TraceEvent> = Vec::new();
    let names = std::iter::once(&report.counterfactual)
        .chain(&report.policies)
        .map(|s| s.policy.clone());
    let mut dropped = 0;
    for (pid, (name, e)) in names.zip(extras).enumerate() {
        let Some(t) = &e.trace else { continue };
        let pid = pid as u32;
        let thread = |tid: u32, name: String| {
            TraceEvent::meta("thread_name", pid, Some(tid), TraceArgs::Name { name })
        };
        events.push(TraceEvent::meta(
            "process_name",
            pid,
            None,
            TraceArgs::Name { name },
        ));
        let sort = TraceArgs::SortIndex { sort_index: pid };
        events.push(TraceEvent::meta("process_sort_index", pid, None, sort));
        events.push(thread(CANCELS_TID, "cancels".into()));
        let replicas: std::collections::BTreeSet<u32> = t
            .events
            .iter()
            .filter(|e| e.cat == Some("gpu"))
            .filter_map(|e| e.tid)
            .collect();
        for r in replicas {
            events.push(thread(r, format!("replica {r}")));
        }
        events.push(thread(0, "replica 0 / requests".into()));
        events.extend(t.events.iter().cloned());
        dropped += t.dropped;
    }
    let doc = serde_json::json!({
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"scenario": report.scenario, "seed": report.seed, "run_hash": report.run_hash, "events_dropped": dropped},
    });
    let problems = super::trace_check::check(&doc);
    if !problems.is_empty() {
        return Err(format!(
            "trace.json failed its structural check (a cancelsim bug): {}",
            problems[0]
        ));
    }
    let f = std::fs::File::create(path).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_json::to_writer(std::io::BufWriter::new(f), &doc)
        .map_err(|e| format!("{}: {e}", path.display()))
}

//! The run directory's data files besides `summary.json` and `requests.csv`: the gauge time
//! series and the Chrome trace, which must pass its structural check before it is written.

use std::collections::BTreeSet;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use super::trace_check::Streaming;
use crate::record::{Extras, TraceArgs, TraceEvent, TraceSink, CANCELS_TID};
use crate::run::Report;

/// Each run's policy label, the counterfactual first (as `extras` are).
fn run_names(report: &Report) -> impl Iterator<Item = String> + '_ {
    std::iter::once(&report.counterfactual)
        .chain(&report.policies)
        .map(|s| s.policy.clone())
}

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
        "kv_pinned_prefill",
        "kv_pinned_decode",
    ])
    .map_err(err)?;
    for (name, e) in run_names(report).zip(extras) {
        for s in &e.timeseries {
            w.write_record([
                name.clone(),
                format!("{}", s.t_s),
                s.kv_blocks.to_string(),
                s.kv_retained.to_string(),
                s.queue.to_string(),
                s.running.to_string(),
                s.cancels_in_flight.to_string(),
                s.kv_pinned_prefill.to_string(),
                s.kv_pinned_decode.to_string(),
            ])
            .map_err(err)?;
        }
    }
    w.flush().map_err(|e| format!("{}: {e}", path.display()))
}

/// `pools.csv`, on a prefill/decode graph only: each pool's gauges at every sample, named as
/// in the summary's `pools`.
pub(super) fn write_pool_timeseries(
    path: &Path,
    report: &Report,
    extras: &[Extras],
) -> Result<(), String> {
    let pools = &report.counterfactual.pools;
    if pools.is_empty() {
        return Ok(());
    }
    let err = |e: csv::Error| format!("{}: {e}", path.display());
    let mut w = csv::Writer::from_path(path).map_err(err)?;
    w.write_record([
        "policy",
        "t_s",
        "pool",
        "role",
        "kv_blocks",
        "kv_retained",
        "kv_pinned",
        "queue",
        "running",
    ])
    .map_err(err)?;
    for (name, e) in run_names(report).zip(extras) {
        for s in &e.pool_timeseries {
            let pool = &pools[s.pool as usize];
            w.write_record([
                name.clone(),
                format!("{}", s.t_s),
                pool.name.clone(),
                pool.role.to_string(),
                s.kv_blocks.to_string(),
                s.kv_retained.to_string(),
                s.kv_pinned.to_string(),
                s.queue.to_string(),
                s.running.to_string(),
            ])
            .map_err(err)?;
        }
    }
    w.flush().map_err(|e| format!("{}: {e}", path.display()))
}

/// `trace.json`, streamed: events go to disk as runs record them, through a bounded buffer and
/// the structural checker, so memory does not grow with the trace. All runs share one file: one
/// process per run (the counterfactual first), a thread per replica, the requests' async tracks
/// and a "cancels" thread with the flows. The metadata naming them is written at the end.
pub(super) struct TraceFile {
    path: PathBuf,
    w: BufWriter<File>,
    checker: Streaming,
    events: u64,
    /// (pid, tid) of every replica thread that ran a step, to name them.
    replicas: BTreeSet<(u32, u32)>,
    error: Option<String>,
}

impl TraceFile {
    pub(super) fn create(path: &Path) -> Result<TraceFile, String> {
        let f = File::create(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let mut w = BufWriter::with_capacity(1 << 16, f);
        w.write_all(b"{\"traceEvents\":[\n")
            .map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(TraceFile {
            path: path.to_path_buf(),
            w,
            checker: Streaming::default(),
            events: 0,
            replicas: BTreeSet::new(),
            error: None,
        })
    }

    fn write(&mut self, ev: &TraceEvent) {
        if self.error.is_some() {
            return;
        }
        self.checker.event(ev);
        let sep: &[u8] = if self.events == 0 { b"" } else { b",\n" };
        let written = self
            .w
            .write_all(sep)
            .and_then(|()| super::trace_json::write_event(&mut self.w, ev));
        if let Err(e) = written {
            self.error = Some(format!("{}: {e}", self.path.display()));
        }
        self.events += 1;
    }
}

impl TraceSink for TraceFile {
    fn event(&mut self, ev: &TraceEvent) {
        if ev.cat == Some("gpu") {
            if let Some(tid) = ev.tid {
                self.replicas.insert((ev.pid, tid));
            }
        }
        self.write(ev);
    }

    /// The metadata, the closing brackets and `otherData`; then the checker's verdict.
    fn close(&mut self, runs: &[(u32, String)], other: serde_json::Value) -> Result<(), String> {
        for (pid, name) in runs {
            for ev in run_metadata(*pid, name.clone(), &self.replicas) {
                self.write(&ev);
            }
        }
        let tail = format!("\n],\"displayTimeUnit\":\"ms\",\"otherData\":{other}}}\n");
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        let path = self.path.display().to_string();
        let io = |e: std::io::Error| format!("{path}: {e}");
        self.w.write_all(tail.as_bytes()).map_err(io)?;
        self.w.flush().map_err(io)?;
        let problems = std::mem::take(&mut self.checker).finish();
        if let Some(p) = problems.first() {
            return Err(format!(
                "trace.json failed its structural check (a cancelsim bug): {p}"
            ));
        }
        Ok(())
    }
}

/// The metadata of run `pid`: its process's name and order, and its threads' names.
fn run_metadata(pid: u32, name: String, replicas: &BTreeSet<(u32, u32)>) -> Vec<TraceEvent> {
    let thread = |tid: u32, name: String| {
        TraceEvent::meta("thread_name", pid, Some(tid), TraceArgs::Name { name })
    };
    let mut out = vec![
        TraceEvent::meta("process_name", pid, None, TraceArgs::Name { name }),
        TraceEvent::meta(
            "process_sort_index",
            pid,
            None,
            TraceArgs::SortIndex { sort_index: pid },
        ),
        thread(CANCELS_TID, "cancels".into()),
    ];
    for &(_, r) in replicas.range((pid, 0)..=(pid, u32::MAX)) {
        out.push(thread(r, format!("replica {r}")));
    }
    out.push(thread(0, "replica 0 / requests".into()));
    out
}

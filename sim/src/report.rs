//! What a run shows and leaves behind: the summary table on stdout and `summary.json` in a run
//! directory, written atomically.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::metrics::Summary;
use crate::record::{Extras, RequestRow, RequestSink, TraceArgs, TraceEvent, CANCELS_TID};
use crate::run::Report;

/// The human report: one column per policy, beside the counterfactual. Its last line is always
/// `run_hash=<hex>`.
pub fn render(r: &Report) -> String {
    let mut out = String::new();
    let w = &mut out;
    let cf = &r.counterfactual;
    let _ = writeln!(
        w,
        "scenario {}  seed {}  (scenario_hash {})",
        r.scenario,
        r.seed,
        &r.scenario_hash[..16]
    );
    let _ = writeln!(
        w,
        "{} requests over {:.1} s of virtual time; counterfactual: {} completed, {:.2} req/s, {:.0} output tokens/s, GPU utilisation {:.3}",
        cf.requests.scheduled, cf.virtual_time_s, cf.requests.completed, cf.throughput_rps, cf.output_tokens_per_s, cf.gpu.utilisation
    );
    let cols: Vec<&Summary> = std::iter::once(cf).chain(r.policies.iter()).collect();
    let width = cols
        .iter()
        .map(|s| s.policy.len())
        .max()
        .unwrap_or(10)
        .max(12);
    let row = |w: &mut String, name: &str, f: &dyn Fn(&Summary) -> String| {
        let _ = write!(w, "{name:<34}");
        for s in &cols {
            let _ = write!(w, " {:>width$}", f(s));
        }
        let _ = writeln!(w);
    };
    row(w, "", &|s| s.policy.clone());
    let int = |x: u64| x.to_string();
    let f3 = |x: f64| {
        if x.is_finite() {
            format!("{x:.3}")
        } else {
            "-".into()
        }
    };
    row(w, "requests.completed", &|s| int(s.requests.completed));
    row(w, "requests.cancelled", &|s| int(s.requests.cancelled));
    row(w, "requests.expired", &|s| int(s.requests.expired));
    row(w, "requests.cleanup_pending", &|s| {
        int(s.requests.cleanup_pending)
    });
    row(w, "requests.rejected", &|s| int(s.requests.rejected));
    row(w, "leaked_work.gpu_s", &|s| f3(s.leaked_work.gpu_s));
    row(w, "leaked_work.token_steps", &|s| {
        int(s.leaked_work.token_steps)
    });
    row(w, "  by_cause.in_flight_window", &|s| {
        f3(s.leaked_work.by_cause.in_flight_window)
    });
    row(w, "  by_cause.checkpoint_delay", &|s| {
        f3(s.leaked_work.by_cause.checkpoint_delay)
    });
    row(w, "  by_cause.unobserved_or_lost", &|s| {
        f3(s.leaked_work.by_cause.unobserved_or_lost)
    });
    row(w, "  by_cause.finish_and_discard", &|s| {
        f3(s.leaked_work.by_cause.finish_and_discard)
    });
    row(w, "late_output_discards", &|s| int(s.late_output_discards));
    row(
        w,
        "late_outputs_admitted",
        &|s| int(s.late_outputs_admitted),
    );
    row(w, "sibling_survival", &|s| {
        format!(
            "{}/{}",
            s.sibling_survival.survived, s.sibling_survival.siblings
        )
    });
    row(w, "sibling_survival.rate", &|s| f3(s.sibling_survival.rate));
    row(w, "sibling_latency_delta_ms.ttft_p50", &|s| {
        f3(s.sibling_latency_delta_ms.ttft_p50)
    });
    row(w, "sibling_latency_delta_ms.ttft_p99", &|s| {
        f3(s.sibling_latency_delta_ms.ttft_p99)
    });
    row(w, "sibling_latency_delta_ms.e2e_p99", &|s| {
        f3(s.sibling_latency_delta_ms.e2e_p99)
    });
    row(w, "retained.kv_block_s", &|s| f3(s.retained.kv_block_s));
    row(w, "retained.peak_blocks", &|s| int(s.retained.peak_blocks));
    row(w, "retained.admission_stalls", &|s| {
        int(s.retained.admission_stalls)
    });
    for level in [
        "local_invalidation",
        "cancel_submission",
        "backend_observation",
        "final_callback",
        "resource_release",
    ] {
        row(w, &format!("cleanup_ms.{level}.p99"), &|s| {
            s.cleanup_latency_ms.get(level).map_or("-".into(), |l| {
                if l.count > 0 {
                    f3(l.p99)
                } else {
                    "-".into()
                }
            })
        });
        row(w, &format!("cleanup_ms.{level}.unknown"), &|s| {
            s.cleanup_latency_ms
                .get(level)
                .map_or("-".into(), |l| int(l.unknown))
        });
    }
    row(w, "playback.routing_violations", &|s| {
        int(s.playback.routing_violations)
    });
    row(w, "playback.corrupted_requests", &|s| {
        int(s.playback.corrupted_requests)
    });
    row(w, "ttft_ms.p50", &|s| f3(s.ttft_ms.p50));
    row(w, "ttft_ms.p99", &|s| f3(s.ttft_ms.p99));
    row(w, "tpot_ms.p50", &|s| f3(s.tpot_ms.p50));
    row(w, "e2e_ms.p50", &|s| f3(s.e2e_ms.p50));
    row(w, "e2e_ms.p99", &|s| f3(s.e2e_ms.p99));
    row(w, "gpu.busy_s", &|s| f3(s.gpu.busy_s));
    row(w, "run_hash", &|s| s.run_hash[..12].to_string());
    let _ = writeln!(w, "run_hash={}", r.run_hash);
    out
}

/// Where a run's files go: `<root>/<scenario>/seed<seed>-<run_hash[..12]>/`. The name is derived
/// from the run hash, so an existing directory of that name holds the same run.
pub fn run_dir(root: &Path, s: &Report) -> PathBuf {
    root.join(&s.scenario)
        .join(format!("seed{}-{}", s.seed, &s.run_hash[..12]))
}

/// What finishing a run directory did.
#[derive(Debug, PartialEq, Eq)]
pub enum Written {
    New(PathBuf),
    /// The directory already held this run (same run hash) and `force` was off.
    Kept(PathBuf),
    Replaced(PathBuf),
}

/// `requests.csv`, written row by row as requests leave.
struct CsvSink {
    w: csv::Writer<std::io::BufWriter<std::fs::File>>,
    error: Option<String>,
}

impl RequestSink for CsvSink {
    fn row(&mut self, row: &RequestRow) {
        if self.error.is_none() {
            if let Err(e) = self.w.serialize(row) {
                self.error = Some(e.to_string());
            }
        }
    }

    fn finish(&mut self) -> Result<(), String> {
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        self.w.flush().map_err(|e| e.to_string())
    }
}

/// A run directory being written. Everything goes to a hidden temporary directory next to the
/// final one and is renamed into place by `finish`; if the run fails or is interrupted, nothing
/// but that temporary directory can be left, and `Drop` removes it.
pub struct RunDir {
    parent: PathBuf,
    tmp: PathBuf,
    done: bool,
}

impl RunDir {
    pub fn begin(root: &Path, scenario: &str) -> Result<RunDir, String> {
        let parent = root.join(scenario);
        std::fs::create_dir_all(&parent)
            .map_err(|e| format!("{}: cannot create: {e}", parent.display()))?;
        let tmp = parent.join(format!(".tmp-run-{}", std::process::id()));
        if tmp.exists() {
            std::fs::remove_dir_all(&tmp)
                .map_err(|e| format!("{}: cannot clear: {e}", tmp.display()))?;
        }
        std::fs::create_dir(&tmp).map_err(|e| format!("{}: cannot create: {e}", tmp.display()))?;
        Ok(RunDir {
            parent,
            tmp,
            done: false,
        })
    }

    /// The sink that streams `requests.csv` into the directory.
    pub fn requests_sink(&self) -> Result<Box<dyn RequestSink>, String> {
        let path = self.tmp.join("requests.csv");
        let f = std::fs::File::create(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(Box::new(CsvSink {
            w: csv::Writer::from_writer(std::io::BufWriter::new(f)),
            error: None,
        }))
    }

    /// Write the summary, time series, trace and plots, then move the directory into place.
    pub fn finish(
        mut self,
        report: &Report,
        mut extras: Vec<Extras>,
        force: bool,
    ) -> Result<(Written, Vec<PathBuf>), String> {
        if let Some(mut sink) = extras.first_mut().and_then(|e| e.sink.take()) {
            sink.finish().map_err(|e| format!("requests.csv: {e}"))?;
        }
        let file = |name: &str| self.tmp.join(name);
        let json = serde_json::to_string_pretty(report).expect("report serialises") + "\n";
        std::fs::write(file("summary.json"), json).map_err(|e| format!("summary.json: {e}"))?;
        write_timeseries(&file("timeseries.csv"), report, &extras)?;
        if extras.iter().any(|e| e.trace.is_some()) {
            write_trace(&file("trace.json"), report, &extras)?;
        }
        let plots = crate::plots::draw_all(&file("plots"), report, &extras)?;
        let dir = run_dir(self.parent.parent().unwrap_or(Path::new(".")), report);
        let exists = dir.exists();
        let written = if exists && !force {
            std::fs::remove_dir_all(&self.tmp)
                .map_err(|e| format!("{}: {e}", self.tmp.display()))?;
            Written::Kept(dir.clone())
        } else {
            if exists {
                std::fs::remove_dir_all(&dir)
                    .map_err(|e| format!("{}: cannot replace: {e}", dir.display()))?;
            }
            std::fs::rename(&self.tmp, &dir)
                .map_err(|e| format!("{}: cannot move into place: {e}", dir.display()))?;
            if exists {
                Written::Replaced(dir.clone())
            } else {
                Written::New(dir.clone())
            }
        };
        self.done = true;
        let plots = plots
            .iter()
            .filter_map(|p| p.file_name())
            .map(|n| dir.join("plots").join(n))
            .collect();
        Ok((written, plots))
    }
}

impl Drop for RunDir {
    fn drop(&mut self) {
        if !self.done {
            let _ = std::fs::remove_dir_all(&self.tmp);
        }
    }
}

fn write_timeseries(path: &Path, report: &Report, extras: &[Extras]) -> Result<(), String> {
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
fn write_trace(path: &Path, report: &Report, extras: &[Extras]) -> Result<(), String> {
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
    let problems = crate::trace_check::check(&doc);
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

//! A run directory: everything is written into a hidden temporary directory, then renamed into
//! place, so a failed or interrupted run leaves nothing half-written.

use std::path::{Path, PathBuf};

use super::files::{write_pool_timeseries, write_timeseries, TraceFile};
use crate::record::{
    Extras, JobRow, RequestRow, RequestSink, TraceSink, PAIRS_MAX, POOL_SAMPLES_MAX, SAMPLES_MAX,
};
use crate::run::Report;

/// The sinks a run directory's runs stream into: `requests.csv`, and the trace if asked.
pub type Sinks = (Option<Box<dyn RequestSink>>, Option<Box<dyn TraceSink>>);
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

type CsvFile = csv::Writer<std::io::BufWriter<std::fs::File>>;

fn csv_file(path: &Path) -> Result<CsvFile, String> {
    let f = std::fs::File::create(path).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(csv::Writer::from_writer(std::io::BufWriter::new(f)))
}

/// `requests.csv`, written row by row as requests leave, and `jobs.csv` (made at the first
/// job's row: only runs of agent jobs have one).
struct CsvSink {
    w: CsvFile,
    jobs_path: PathBuf,
    jobs: Option<CsvFile>,
    error: Option<String>,
}

impl CsvSink {
    fn hold(&mut self, r: Result<(), String>) {
        if let (Err(e), None) = (r, &self.error) {
            self.error = Some(e);
        }
    }
}

impl RequestSink for CsvSink {
    fn row(&mut self, row: &RequestRow) {
        if self.error.is_none() {
            let r = self.w.serialize(row).map_err(|e| e.to_string());
            self.hold(r);
        }
    }

    fn job(&mut self, row: &JobRow) {
        if self.error.is_some() {
            return;
        }
        if self.jobs.is_none() {
            match csv_file(&self.jobs_path) {
                Ok(w) => self.jobs = Some(w),
                Err(e) => return self.hold(Err(e)),
            }
        }
        let w = self.jobs.as_mut().expect("jobs.csv open");
        let r = w.serialize(row).map_err(|e| format!("jobs.csv: {e}"));
        self.hold(r);
    }

    fn finish(&mut self) -> Result<(), String> {
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        if let Some(j) = self.jobs.as_mut() {
            j.flush().map_err(|e| format!("jobs.csv: {e}"))?;
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
        remove_stale(&parent);
        let tmp = parent.join(format!("{TMP_PREFIX}{}", std::process::id()));
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
        Ok(Box::new(CsvSink {
            w: csv_file(&self.tmp.join("requests.csv"))?,
            jobs_path: self.tmp.join("jobs.csv"),
            jobs: None,
            error: None,
        }))
    }

    /// A file of the run besides the ones `finish` writes (the stage graph's `graph.dot`).
    pub fn add_file(&self, name: &str, text: &str) -> Result<(), String> {
        let path = self.tmp.join(name);
        std::fs::write(&path, text).map_err(|e| format!("{name}: {e}"))
    }

    /// The sink that streams `trace.json` into the directory.
    pub fn trace_sink(&self) -> Result<Box<dyn TraceSink>, String> {
        Ok(Box::new(TraceFile::create(&self.tmp.join("trace.json"))?))
    }

    /// Close the sinks the runs wrote to, write the summary, time series, trace and plots, then
    /// move the directory into place.
    pub fn finish(
        mut self,
        report: &Report,
        extras: Vec<Extras>,
        (sink, trace): Sinks,
        force: bool,
    ) -> Result<Finished, String> {
        if let Some(mut sink) = sink {
            sink.finish().map_err(|e| format!("requests.csv: {e}"))?;
        }
        let mut warnings = Vec::new();
        if let Some(mut trace) = trace {
            warnings = close_trace(trace.as_mut(), report, &extras)?;
        }
        warnings.extend(cut_warnings(report, &extras));
        let file = |name: &str| self.tmp.join(name);
        let json = serde_json::to_string_pretty(report).expect("report serialises") + "\n";
        std::fs::write(file("summary.json"), json).map_err(|e| format!("summary.json: {e}"))?;
        write_timeseries(&file("timeseries.csv"), report, &extras)?;
        write_pool_timeseries(&file("pools.csv"), report, &extras)?;
        let plots = super::plots::draw_all(&file("plots"), report, &extras)?;
        let dir = run_dir(self.parent.parent().unwrap_or(Path::new(".")), report);
        let written = if dir.exists() && !force {
            std::fs::remove_dir_all(&self.tmp)
                .map_err(|e| format!("{}: {e}", self.tmp.display()))?;
            Written::Kept(dir.clone())
        } else if self.put_in_place(&dir)? {
            Written::Replaced(dir.clone())
        } else {
            Written::New(dir.clone())
        };
        self.done = true;
        let plots = plots
            .iter()
            .filter_map(|p| p.file_name())
            .map(|n| dir.join("plots").join(n))
            .collect();
        Ok(Finished {
            written,
            plots,
            warnings,
        })
    }
}

/// What finishing a run directory did, and what it had to cut.
pub struct Finished {
    pub written: Written,
    pub plots: Vec<PathBuf>,
    /// One line per output cut short by a limit, for standard error.
    pub warnings: Vec<String>,
}

/// The other outputs a limit cut: the time series (`SAMPLES_MAX`), the pools' samples
/// (`POOL_SAMPLES_MAX`) and the sibling plot (`PAIRS_MAX`).
fn cut_warnings(report: &Report, extras: &[Extras]) -> Vec<String> {
    let mut out = Vec::new();
    let summaries = std::iter::once(&report.counterfactual).chain(&report.policies);
    for (s, e) in summaries.zip(extras) {
        if e.timeseries.len() >= SAMPLES_MAX {
            let last = e.timeseries.last().map_or(0.0, |x| x.t_s);
            out.push(format!(
                "timeseries.csv: run {} stopped sampling at {SAMPLES_MAX} samples, {last:.1} s of {:.1} s (raise --sample-ms)",
                s.policy, s.virtual_time_s
            ));
        }
        let pools = s.pools.len();
        if pools > 0 && e.pool_timeseries.len() < pools * e.timeseries.len() {
            let kept = e.pool_timeseries.len() / pools;
            let last = e.pool_timeseries.last().map_or(0.0, |x| x.t_s);
            out.push(format!(
                "pools.csv: run {} stopped sampling its {pools} pools at {kept} samples ({POOL_SAMPLES_MAX} rows), {last:.1} s of {:.1} s (raise --sample-ms)",
                s.policy, s.virtual_time_s
            ));
        }
        let pairs = s.sibling_latency_delta_ms.pairs;
        if pairs > e.sibling_ttft_ms.len() as u64 && e.sibling_ttft_ms.len() >= PAIRS_MAX {
            out.push(format!(
                "plots/sibling_ttft: run {} draws the first {PAIRS_MAX} of {pairs} sibling pairs",
                s.policy
            ));
        }
    }
    out
}

/// Close `trace.json`: name the runs' processes, and say which runs' traces were cut.
fn close_trace(
    trace: &mut dyn TraceSink,
    report: &Report,
    extras: &[Extras],
) -> Result<Vec<String>, String> {
    let summaries = std::iter::once(&report.counterfactual).chain(&report.policies);
    let mut runs = Vec::new();
    let mut warnings = Vec::new();
    let mut dropped = 0;
    for (pid, (s, e)) in summaries.zip(extras).enumerate() {
        let Some(log) = &e.trace else { continue };
        runs.push((pid as u32, s.policy.clone()));
        dropped += log.dropped;
        if let Some(cut_us) = log.cut_at_us.filter(|_| log.dropped > 0) {
            warnings.push(format!(
                "trace.json: run {} kept its first {} events and dropped {}; it covers 0-{:.1} s of {:.1} s (raise --trace-events)",
                s.policy,
                log.kept,
                log.dropped,
                cut_us as f64 / 1e6,
                s.virtual_time_s
            ));
        }
    }
    let other = serde_json::json!({"scenario": report.scenario, "seed": report.seed,
        "run_hash": report.run_hash, "events_dropped": dropped});
    trace.close(&runs, other)?;
    Ok(warnings)
}

impl RunDir {
    /// Rename the temporary directory to `dir`. An existing `dir` is first renamed aside, so
    /// `dir` is always either the old run or the new one, never half of each; a concurrent run
    /// putting the same run there between the two renames is moved aside likewise, a bounded
    /// number of times. Returns whether a directory was replaced.
    fn put_in_place(&self, dir: &Path) -> Result<bool, String> {
        let aside = self
            .parent
            .join(format!("{TMP_PREFIX}{}-old", std::process::id()));
        let mut replaced = false;
        let mut last = None;
        for _ in 0..PLACE_ATTEMPTS_MAX {
            if std::fs::rename(dir, &aside).is_ok() {
                replaced = true;
                let _ = std::fs::remove_dir_all(&aside);
            }
            match std::fs::rename(&self.tmp, dir) {
                Ok(()) => return Ok(replaced),
                Err(e) => last = Some(e),
            }
        }
        let e = last.map_or_else(String::new, |e| e.to_string());
        Err(format!("{}: cannot move into place: {e}", dir.display()))
    }
}

/// Temporary run directories are named this plus the writing process's id.
const TMP_PREFIX: &str = ".tmp-run-";
/// Renames tried when concurrent runs race for one run directory.
const PLACE_ATTEMPTS_MAX: u32 = 16;
/// A temporary directory this old is stale even where liveness cannot be checked.
const STALE_AGE_S: u64 = 24 * 3600;

/// Remove the temporary directories that processes killed mid-run (`kill -9`) left in `parent`:
/// those of a process that no longer exists, or, where that cannot be known, a day old.
fn remove_stale(parent: &Path) {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(TMP_PREFIX)) else {
            continue;
        };
        let pid = rest.split('-').next().and_then(|p| p.parse::<u32>().ok());
        let stale = match pid {
            Some(p) if p == std::process::id() => false,
            Some(p) if Path::new("/proc/self").exists() => {
                !Path::new(&format!("/proc/{p}")).exists()
            }
            _ => entry
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age.as_secs() > STALE_AGE_S),
        };
        if stale {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

impl Drop for RunDir {
    fn drop(&mut self) {
        if !self.done {
            let _ = std::fs::remove_dir_all(&self.tmp);
            // The scenario's directory, if this run created it and nothing else is in it.
            let _ = std::fs::remove_dir(&self.parent);
        }
    }
}

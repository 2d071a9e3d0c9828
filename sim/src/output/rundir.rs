//! A run directory: everything is written into a hidden temporary directory, then renamed into
//! place, so a failed or interrupted run leaves nothing half-written.

use std::path::{Path, PathBuf};

use super::files::{write_timeseries, write_trace};
use crate::record::{Extras, RequestRow, RequestSink};
use crate::run::Report;

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
        let plots = super::plots::draw_all(&file("plots"), report, &extras)?;
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

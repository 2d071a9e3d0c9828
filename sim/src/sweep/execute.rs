//! Running a sweep's tasks: each one whole run, written as its own part file atomically, so a
//! sweep resumes, shards and merges by file operations alone.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use rayon::prelude::*;

use super::{Plan, SweepError, METRICS};
use crate::run;

/// Run one task and render its rows (one per policy) as CSV text.
fn run_task(plan: &Plan, t: u64) -> Result<String, String> {
    let (s, values, seed) = plan.task(t);
    s.validate()
        .map_err(|e| format!("task {t}: field `{}` {}", e.field, e.message))?;
    let report = run::report(&s, seed).map_err(|e| format!("task {t} (seed {seed}): {e}"))?;
    let mut w = csv::Writer::from_writer(Vec::new());
    let point = t / plan.sweep.seeds;
    for p in &report.policies {
        let mut row = vec![t.to_string(), point.to_string(), seed.to_string()];
        row.extend(values.iter().cloned());
        row.extend(METRICS.iter().map(|(_, value)| value(&report, p)));
        w.write_record(&row).map_err(|e| e.to_string())?;
    }
    String::from_utf8(w.into_inner().map_err(|e| e.to_string())?).map_err(|e| e.to_string())
}

pub(super) fn atomic_write(path: &Path, bytes: &[u8]) -> Result<(), SweepError> {
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let io = |p: &Path, e: std::io::Error| SweepError::Io(format!("{}: {e}", p.display()));
    std::fs::write(&tmp, bytes).map_err(|e| io(&tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| io(path, e))
}

fn part_path(out: &Path, t: u64) -> PathBuf {
    out.join("parts").join(format!("{t:08}.csv"))
}

/// Run the sweep's tasks of shard `shard` (1-based) of `shards` that have no part yet; then, if
/// every task has its part, assemble `results.csv`. Returns (tasks run now, tasks done in all).
pub fn run(
    plan: &Plan,
    out: &Path,
    shard: (u64, u64),
    progress: bool,
) -> Result<(u64, u64), SweepError> {
    let (i, n) = shard;
    if n == 0 || i == 0 || i > n {
        return Err(SweepError::Input(format!(
            "--shard {i}/{n}: expected i/n with 1 <= i <= n"
        )));
    }
    refuse_orphan_parts(out)?;
    std::fs::create_dir_all(out.join("parts"))
        .map_err(|e| SweepError::Io(format!("{}: {e}", out.display())))?;
    write_manifest(plan, out)?;
    let mine: Vec<u64> = (0..plan.tasks()).filter(|t| t % n == i - 1).collect();
    let pending: Vec<u64> = mine
        .iter()
        .copied()
        .filter(|&t| !part_path(out, t).exists())
        .collect();
    let show = progress && std::io::stderr().is_terminal() && std::env::var_os("CI").is_none();
    let bar = if show {
        let style = indicatif::ProgressStyle::with_template(
            "{bar:30} {pos}/{len} tasks, {per_sec}, {elapsed} elapsed, ETA {eta}",
        )
        .expect("a valid template");
        indicatif::ProgressBar::new(mine.len() as u64).with_style(style)
    } else {
        indicatif::ProgressBar::hidden()
    };
    bar.set_position((mine.len() - pending.len()) as u64);
    let results: Vec<Result<(), SweepError>> = pending
        .par_iter()
        .map(|&t| {
            let text = run_task(plan, t).map_err(SweepError::Input)?;
            atomic_write(&part_path(out, t), text.as_bytes())?;
            bar.inc(1);
            Ok(())
        })
        .collect();
    bar.finish_and_clear();
    if let Some(Err(e)) = results.into_iter().find(|r| r.is_err()) {
        return Err(e);
    }
    let done = (0..plan.tasks())
        .filter(|&t| part_path(out, t).exists())
        .count() as u64;
    if done == plan.tasks() {
        assemble(plan, &[out.to_path_buf()], out)?;
    }
    Ok((pending.len() as u64, done))
}

/// Parts in a directory without a manifest were not written by this sweep: refuse to resume
/// over them.
fn refuse_orphan_parts(out: &Path) -> Result<(), SweepError> {
    let parts = out.join("parts");
    let has_parts = std::fs::read_dir(&parts).is_ok_and(|mut d| d.next().is_some());
    if has_parts && !out.join("manifest.json").exists() {
        return Err(SweepError::Input(format!(
            "{}: has part files but no manifest.json, so they are not this sweep's; use a fresh --out",
            out.display()
        )));
    }
    Ok(())
}

fn write_manifest(plan: &Plan, out: &Path) -> Result<(), SweepError> {
    let manifest = serde_json::json!({
        "sweep": plan.sweep,
        "sweep_hash": plan.sweep_hash,
        "scenario_hash": plan.base.hash(),
        "points": plan.points,
        "tasks": plan.tasks(),
        "version": env!("CARGO_PKG_VERSION"),
        "commit": env!("CANCELSIM_COMMIT"),
        "columns": plan.header(),
    });
    let path = out.join("manifest.json");
    if let Ok(old) = crate::input::read_limited(&path, crate::input::CONFIG_BYTES_MAX) {
        let old: serde_json::Value = serde_json::from_slice(&old)
            .map_err(|e| SweepError::Input(format!("{}: {e}", path.display())))?;
        if old["sweep_hash"] != manifest["sweep_hash"] {
            return Err(SweepError::Input(format!(
                "{}: holds another sweep (sweep_hash {}); use a fresh --out",
                out.display(),
                old["sweep_hash"]
            )));
        }
        return Ok(());
    }
    atomic_write(
        &path,
        (serde_json::to_string_pretty(&manifest).expect("json") + "\n").as_bytes(),
    )
}

/// The manifest of a sweep directory, which must exist and name this sweep: a part file in a
/// directory without one, or from another sweep, is never mixed in.
fn check_manifest(plan: &Plan, dir: &Path) -> Result<(), SweepError> {
    let path = dir.join("manifest.json");
    let bad = |m: String| SweepError::Input(format!("{}: {m}", path.display()));
    let bytes = crate::input::read_limited(&path, crate::input::CONFIG_BYTES_MAX).map_err(|e| {
        bad(format!(
            "cannot read the sweep manifest ({e}); only a directory written by `cancelsim sweep` is read"
        ))
    })?;
    let v: serde_json::Value = serde_json::from_slice(&bytes).map_err(|e| bad(e.to_string()))?;
    if v["sweep_hash"].as_str() != Some(plan.sweep_hash.as_str()) {
        return Err(bad(format!(
            "belongs to another sweep (sweep_hash {}, this sweep's is {})",
            v["sweep_hash"], plan.sweep_hash
        )));
    }
    Ok(())
}

/// A part's text, checked: every row is task `t` with its seed and the header's column count.
fn read_part(plan: &Plan, t: u64, path: &Path) -> Result<String, SweepError> {
    let bad = |m: String| SweepError::Input(format!("{}: {m}", path.display()));
    let text = crate::input::read_text(path, crate::input::CONFIG_BYTES_MAX)
        .map_err(|e| bad(e.to_string()))?;
    let seed = plan.sweep.first_seed + t % plan.sweep.seeds;
    let columns = plan.header().len();
    let mut r = csv::ReaderBuilder::new()
        .has_headers(false)
        .from_reader(text.as_bytes());
    let mut rows = 0usize;
    for rec in r.records() {
        let rec = rec.map_err(|e| bad(e.to_string()))?;
        let ok = rec.len() == columns
            && rec.get(0) == Some(t.to_string().as_str())
            && rec.get(2) == Some(seed.to_string().as_str());
        if !ok {
            return Err(bad(format!(
                "row {} is not a row of task {t} (seed {seed}, {columns} columns)",
                rows + 1
            )));
        }
        rows += 1;
    }
    if rows == 0 {
        return Err(bad("no rows".into()));
    }
    Ok(text)
}

/// `results.csv` from the parts found in `dirs`, in task order, into `out`. Every directory must
/// hold this sweep's manifest, each task's part must be in exactly one of them, and every part
/// must be a part of its task.
pub fn assemble(plan: &Plan, dirs: &[PathBuf], out: &Path) -> Result<(), SweepError> {
    if dirs.is_empty() {
        return Err(SweepError::Input("no shard directories given".into()));
    }
    for d in dirs {
        check_manifest(plan, d)?;
    }
    let mut w = csv::Writer::from_writer(Vec::new());
    w.write_record(plan.header())
        .map_err(|e| SweepError::Io(e.to_string()))?;
    let mut text = String::from_utf8(w.into_inner().map_err(|e| SweepError::Io(e.to_string()))?)
        .map_err(|e| SweepError::Io(e.to_string()))?;
    for t in 0..plan.tasks() {
        let found: Vec<PathBuf> = dirs
            .iter()
            .map(|d| part_path(d, t))
            .filter(|p| p.exists())
            .collect();
        match found.as_slice() {
            [] => {
                return Err(SweepError::Input(format!(
                    "task {t} has no part in {dirs:?}: run the missing shard or resume the sweep"
                )))
            }
            [p] => text += &read_part(plan, t, p)?,
            [p, q, ..] => {
                return Err(SweepError::Input(format!(
                    "task {t} has a part in two shards ({} and {}): shards must be disjoint",
                    p.display(),
                    q.display()
                )))
            }
        }
    }
    std::fs::create_dir_all(out).map_err(|e| SweepError::Io(format!("{}: {e}", out.display())))?;
    atomic_write(&out.join("results.csv"), text.as_bytes())
}

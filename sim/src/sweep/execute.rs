//! Running a sweep's tasks: each one whole run, written as its own part file atomically, so a
//! sweep resumes, shards and merges by file operations alone.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use rayon::prelude::*;

use super::{Plan, METRICS};
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

fn atomic_write(path: &Path, bytes: &[u8]) -> Result<(), String> {
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, bytes).map_err(|e| format!("{}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, path).map_err(|e| format!("{}: {e}", path.display()))
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
) -> Result<(u64, u64), String> {
    let (i, n) = shard;
    if n == 0 || i == 0 || i > n {
        return Err(format!("--shard {i}/{n}: expected i/n with 1 <= i <= n"));
    }
    std::fs::create_dir_all(out.join("parts")).map_err(|e| format!("{}: {e}", out.display()))?;
    write_manifest(plan, out)?;
    let mine: Vec<u64> = (0..plan.tasks()).filter(|t| t % n == i - 1).collect();
    let pending: Vec<u64> = mine
        .iter()
        .copied()
        .filter(|&t| !part_path(out, t).exists())
        .collect();
    let show = progress && std::io::stderr().is_terminal() && std::env::var_os("CI").is_none();
    let bar = if show {
        indicatif::ProgressBar::new(mine.len() as u64)
    } else {
        indicatif::ProgressBar::hidden()
    };
    bar.set_position((mine.len() - pending.len()) as u64);
    let results: Vec<Result<(), String>> = pending
        .par_iter()
        .map(|&t| {
            let text = run_task(plan, t)?;
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

fn write_manifest(plan: &Plan, out: &Path) -> Result<(), String> {
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
    if let Ok(old) = std::fs::read(&path) {
        let old: serde_json::Value =
            serde_json::from_slice(&old).map_err(|e| format!("{}: {e}", path.display()))?;
        if old["sweep_hash"] != manifest["sweep_hash"] {
            return Err(format!(
                "{}: holds another sweep (sweep_hash {}); use a fresh --out",
                out.display(),
                old["sweep_hash"]
            ));
        }
        return Ok(());
    }
    atomic_write(
        &path,
        (serde_json::to_string_pretty(&manifest).expect("json") + "\n").as_bytes(),
    )
}

/// `results.csv` from the parts found in `dirs`, in task order, into `out`.
pub fn assemble(plan: &Plan, dirs: &[PathBuf], out: &Path) -> Result<(), String> {
    let mut text = {
        let mut w = csv::Writer::from_writer(Vec::new());
        w.write_record(plan.header()).map_err(|e| e.to_string())?;
        String::from_utf8(w.into_inner().map_err(|e| e.to_string())?).map_err(|e| e.to_string())?
    };
    for t in 0..plan.tasks() {
        let found = dirs.iter().map(|d| part_path(d, t)).find(|p| p.exists());
        let Some(p) = found else {
            return Err(format!(
                "task {t} has no part in {dirs:?}: run the missing shard or resume the sweep"
            ));
        };
        text += &std::fs::read_to_string(&p).map_err(|e| format!("{}: {e}", p.display()))?;
    }
    std::fs::create_dir_all(out).map_err(|e| format!("{}: {e}", out.display()))?;
    atomic_write(&out.join("results.csv"), text.as_bytes())
}

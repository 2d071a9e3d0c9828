//! `cancelsim sweep`, `merge` and `compare`: grids of runs that survive `kill -9`, split across
//! machines, and compare by paired seeds.
//!
//! A sweep is a list of tasks: every point of the grid (the product of its axes, in order) times
//! every seed. Each task is one whole deterministic run, written as its own part file
//! (`parts/<task>.csv`, temp file then rename). A sweep therefore resumes by skipping the parts
//! that exist, a shard runs the tasks whose index falls to it, and the final `results.csv` is the
//! header plus every part in task order: byte-identical however the work was split, resumed or
//! threaded.

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::run;
use crate::scenario::{Policy, Scenario, Scheduler, Source};

/// A sweep file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Sweep {
    pub name: String,
    /// The base scenario, relative to the sweep file.
    pub scenario: String,
    #[serde(default = "one")]
    pub first_seed: u64,
    pub seeds: u64,
    pub grid: Vec<Axis>,
}

fn one() -> u64 {
    1
}

/// One axis of the grid: a parameter and its values.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub enum Axis {
    /// `cancellation.fraction`.
    Fraction(Vec<f64>),
    /// The continuous scheduler's in-flight window.
    Window(Vec<u32>),
    Replicas(Vec<u32>),
    /// One policy per point.
    Policy(Vec<Policy>),
    /// The Poisson or on/off source's (on) rate.
    Rate(Vec<f64>),
    Requests(Vec<u64>),
    /// `adapter.loss`.
    Loss(Vec<f64>),
}

impl Axis {
    fn name(&self) -> &'static str {
        match self {
            Axis::Fraction(_) => "fraction",
            Axis::Window(_) => "window",
            Axis::Replicas(_) => "replicas",
            Axis::Policy(_) => "policy",
            Axis::Rate(_) => "rate",
            Axis::Requests(_) => "requests",
            Axis::Loss(_) => "loss",
        }
    }

    fn len(&self) -> usize {
        match self {
            Axis::Fraction(v) | Axis::Rate(v) | Axis::Loss(v) => v.len(),
            Axis::Window(v) | Axis::Replicas(v) => v.len(),
            Axis::Policy(v) => v.len(),
            Axis::Requests(v) => v.len(),
        }
    }

    /// Set value `i` on the scenario; returns it as text for the CSV.
    fn apply(&self, i: usize, s: &mut Scenario) -> String {
        match self {
            Axis::Fraction(v) => {
                if let Some(c) = &mut s.cancellation {
                    c.fraction = v[i];
                    c.requests.clear();
                }
                v[i].to_string()
            }
            Axis::Window(v) => {
                if let Scheduler::Continuous { window, .. } = &mut s.cluster.scheduler {
                    *window = v[i];
                }
                v[i].to_string()
            }
            Axis::Replicas(v) => {
                s.cluster.replicas = v[i];
                v[i].to_string()
            }
            Axis::Policy(v) => {
                s.policies = vec![v[i].clone()];
                s.properties.sibling_isolation.clear();
                s.expect.clear();
                v[i].label()
            }
            Axis::Rate(v) => {
                match &mut s.workload.source {
                    Source::Poisson { rate_per_s, .. } => *rate_per_s = v[i],
                    Source::OnOff { rate_on_per_s, .. } => *rate_on_per_s = v[i],
                    _ => {}
                }
                v[i].to_string()
            }
            Axis::Requests(v) => {
                crate::check::set_requests(s, v[i]);
                v[i].to_string()
            }
            Axis::Loss(v) => {
                s.adapter.loss = v[i];
                v[i].to_string()
            }
        }
    }
}

/// A loaded sweep: its base scenario and tasks.
pub struct Plan {
    pub sweep: Sweep,
    pub base: Scenario,
    pub points: usize,
    pub sweep_hash: String,
}

impl Plan {
    pub fn load(path: &Path) -> Result<Plan, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("{}: cannot read sweep: {e}", path.display()))?;
        let sweep: Sweep = ron::Options::default()
            .with_default_extension(ron::extensions::Extensions::IMPLICIT_SOME)
            .from_str(&text)
            .map_err(|e| format!("{}:{}: {}", path.display(), e.span.start, e.code))?;
        if sweep.seeds == 0 || sweep.seeds > 1_000_000 {
            return Err(format!(
                "{}: field `seeds` must be between 1 and 1000000 (got {})",
                path.display(),
                sweep.seeds
            ));
        }
        if let Some(a) = sweep.grid.iter().find(|a| a.len() == 0) {
            return Err(format!(
                "{}: grid axis {} has no values",
                path.display(),
                a.name()
            ));
        }
        let base_path = path
            .parent()
            .unwrap_or(Path::new("."))
            .join(&sweep.scenario);
        let base = Scenario::load(&base_path).map_err(|e| e.to_string())?;
        let points = sweep.grid.iter().map(Axis::len).product::<usize>();
        if points == 0 || points as u64 * sweep.seeds > 10_000_000 {
            return Err(format!(
                "{}: the grid has {points} points x {} seeds: too many",
                path.display(),
                sweep.seeds
            ));
        }
        let canonical = ron::to_string(&sweep).expect("sweep serialises") + &base.hash();
        Ok(Plan {
            sweep,
            base,
            points,
            sweep_hash: blake3::hash(canonical.as_bytes()).to_hex().to_string(),
        })
    }

    pub fn tasks(&self) -> u64 {
        self.points as u64 * self.sweep.seeds
    }

    /// Task `t`: its point's scenario, parameter values and seed.
    pub fn task(&self, t: u64) -> (Scenario, Vec<String>, u64) {
        let point = (t / self.sweep.seeds) as usize;
        let seed = self.sweep.first_seed + t % self.sweep.seeds;
        let mut s = self.base.clone();
        let mut rest = point;
        let mut values = Vec::new();
        // The last axis varies fastest.
        let mut idx = vec![0; self.sweep.grid.len()];
        for (k, axis) in self.sweep.grid.iter().enumerate().rev() {
            idx[k] = rest % axis.len();
            rest /= axis.len();
        }
        for (k, axis) in self.sweep.grid.iter().enumerate() {
            values.push(axis.apply(idx[k], &mut s));
        }
        (s, values, seed)
    }

    pub fn header(&self) -> Vec<String> {
        let mut h = vec!["task".to_string(), "point".into(), "seed".into()];
        h.extend(self.sweep.grid.iter().map(|a| a.name().to_string()));
        h.extend(METRICS.iter().map(|(name, _)| name.to_string()));
        h
    }
}

/// The metric columns of a sweep row: name and value, in one table so they cannot drift apart.
type Column = (
    &'static str,
    fn(&crate::run::Report, &crate::metrics::Summary) -> String,
);
const METRICS: [Column; 19] = [
    ("run_policy", |_, p| p.policy.clone()),
    ("scenario_hash", |r, _| r.scenario_hash.clone()),
    ("report_run_hash", |r, _| r.run_hash.clone()),
    ("run_hash", |_, p| p.run_hash.clone()),
    ("completed", |_, p| p.requests.completed.to_string()),
    ("cancelled", |_, p| p.requests.cancelled.to_string()),
    ("expired", |_, p| p.requests.expired.to_string()),
    ("cleanup_pending", |_, p| {
        p.requests.cleanup_pending.to_string()
    }),
    ("leaked_gpu_s", |_, p| p.leaked_work.gpu_s.to_string()),
    ("leaked_token_steps", |_, p| {
        p.leaked_work.token_steps.to_string()
    }),
    ("late_output_discards", |_, p| {
        p.late_output_discards.to_string()
    }),
    ("late_outputs_admitted", |_, p| {
        p.late_outputs_admitted.to_string()
    }),
    ("siblings", |_, p| p.sibling_survival.siblings.to_string()),
    ("sibling_survival_rate", |_, p| {
        p.sibling_survival.rate.to_string()
    }),
    ("sibling_ttft_delta_p99_ms", |_, p| {
        p.sibling_latency_delta_ms.ttft_p99.to_string()
    }),
    ("retained_kv_block_s", |_, p| {
        p.retained.kv_block_s.to_string()
    }),
    ("ttft_p99_ms", |_, p| p.ttft_ms.p99.to_string()),
    ("e2e_p50_ms", |_, p| p.e2e_ms.p50.to_string()),
    ("e2e_p99_ms", |_, p| p.e2e_ms.p99.to_string()),
];

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

/// `cancelsim compare A B`: two sweeps' results (or two run directories' summaries), paired by
/// point, policy and seed; for each metric the mean difference B − A with a 95 % confidence
/// interval, marked significant when the interval excludes 0.
pub fn compare(a: &Path, b: &Path) -> Result<String, String> {
    let load = |p: &Path| -> Result<Vec<BTreeMap<String, String>>, String> {
        let f = if p.is_dir() && p.join("results.csv").exists() {
            p.join("results.csv")
        } else if p.is_dir() && p.join("summary.json").exists() {
            return summary_rows(&p.join("summary.json"));
        } else {
            p.to_path_buf()
        };
        let mut r = csv::Reader::from_path(&f).map_err(|e| format!("{}: {e}", f.display()))?;
        let headers = r.headers().map_err(|e| e.to_string())?.clone();
        r.records()
            .map(|rec| {
                let rec = rec.map_err(|e| e.to_string())?;
                Ok(headers
                    .iter()
                    .zip(rec.iter())
                    .map(|(h, v)| (h.to_string(), v.to_string()))
                    .collect())
            })
            .collect()
    };
    let (ra, rb) = (load(a)?, load(b)?);
    let key_cols = |row: &BTreeMap<String, String>| -> String {
        row.iter()
            .filter(|(k, _)| !METRICS.iter().any(|(m, _)| m == k) || *k == "run_policy")
            .filter(|(k, _)| *k != "task" && *k != "seed" && *k != "point")
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let index = |rows: &[BTreeMap<String, String>]| -> BTreeMap<(String, String), BTreeMap<String, String>> {
        rows.iter().map(|r| ((key_cols(r), r.get("seed").cloned().unwrap_or_default()), r.clone())).collect()
    };
    let (ia, ib) = (index(&ra), index(&rb));
    let numeric = [
        "leaked_gpu_s",
        "late_output_discards",
        "sibling_survival_rate",
        "cleanup_pending",
        "retained_kv_block_s",
        "ttft_p99_ms",
        "e2e_p99_ms",
    ];
    // Differences per (group, metric), paired by seed.
    let mut diffs: BTreeMap<(String, &str), Vec<f64>> = BTreeMap::new();
    for ((group, seed), row_a) in &ia {
        let Some(row_b) = ib.get(&(group.clone(), seed.clone())) else {
            continue;
        };
        for m in numeric {
            if let (Some(x), Some(y)) = (
                row_a.get(m).and_then(|v| v.parse::<f64>().ok()),
                row_b.get(m).and_then(|v| v.parse::<f64>().ok()),
            ) {
                diffs.entry((group.clone(), m)).or_default().push(y - x);
            }
        }
    }
    if diffs.is_empty() {
        return Err("no rows pair up (same points, policies and seeds are needed)".into());
    }
    let mut out = format!(
        "{:<60} {:<26} {:>5} {:>14} {:>14} {:>14}  {}\n",
        "group", "metric", "pairs", "mean B-A", "ci95 low", "ci95 high", "significant"
    );
    for ((group, metric), d) in &diffs {
        let n = d.len();
        let mean = d.iter().sum::<f64>() / n as f64;
        let (lo, hi) = if n >= 2 {
            let var = d.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / (n - 1) as f64;
            let half = t95(n - 1) * (var / n as f64).sqrt();
            (mean - half, mean + half)
        } else {
            (f64::NAN, f64::NAN)
        };
        let sig = if n < 2 {
            "n/a (one pair)"
        } else if lo > 0.0 || hi < 0.0 {
            "yes"
        } else {
            "no"
        };
        let g = if group.len() > 60 {
            &group[..60]
        } else {
            group
        };
        out += &format!("{g:<60} {metric:<26} {n:>5} {mean:>14.6} {lo:>14.6} {hi:>14.6}  {sig}\n");
    }
    Ok(out)
}

/// A run directory's summary.json as rows like a sweep's (one per policy, seed from the report).
fn summary_rows(path: &Path) -> Result<Vec<BTreeMap<String, String>>, String> {
    let v: serde_json::Value = serde_json::from_slice(
        &std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?,
    )
    .map_err(|e| format!("{}: {e}", path.display()))?;
    let seed = v["seed"].to_string();
    Ok(v["policies"]
        .as_array()
        .map(|ps| {
            ps.iter()
                .map(|p| {
                    let mut r = BTreeMap::new();
                    r.insert("seed".into(), seed.clone());
                    r.insert(
                        "run_policy".into(),
                        p["policy"].as_str().unwrap_or("").to_string(),
                    );
                    r.insert("leaked_gpu_s".into(), p["leaked_work"]["gpu_s"].to_string());
                    r.insert(
                        "late_output_discards".into(),
                        p["late_output_discards"].to_string(),
                    );
                    r.insert(
                        "sibling_survival_rate".into(),
                        p["sibling_survival"]["rate"].to_string(),
                    );
                    r.insert(
                        "cleanup_pending".into(),
                        p["requests"]["cleanup_pending"].to_string(),
                    );
                    r.insert(
                        "retained_kv_block_s".into(),
                        p["retained"]["kv_block_s"].to_string(),
                    );
                    r.insert("ttft_p99_ms".into(), p["ttft_ms"]["p99"].to_string());
                    r.insert("e2e_p99_ms".into(), p["e2e_ms"]["p99"].to_string());
                    r
                })
                .collect()
        })
        .unwrap_or_default())
}

/// Two-sided 95 % Student t quantile.
fn t95(df: usize) -> f64 {
    const T: [f64; 30] = [
        12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
        2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
        2.052, 2.048, 2.045, 2.042,
    ];
    if df == 0 {
        f64::NAN
    } else if df <= 30 {
        T[df - 1]
    } else {
        1.96
    }
}

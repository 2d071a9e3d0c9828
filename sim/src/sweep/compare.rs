//! `cancelsim compare`: two sweeps (or run directories) paired by point, policy and seed.

use std::collections::BTreeMap;
use std::path::Path;

use super::METRICS;
use crate::metrics::t95;

type Row = BTreeMap<String, String>;

/// The metrics `compare` tests, as sweep columns.
const COMPARED: [&str; 7] = [
    "leaked_gpu_s",
    "late_output_discards",
    "sibling_survival_rate",
    "cleanup_pending",
    "retained_kv_block_s",
    "ttft_p99_ms",
    "e2e_p99_ms",
];

/// The rows of a sweep's `results.csv`, a run directory's `summary.json`, or a CSV file.
fn load(p: &Path) -> Result<Vec<Row>, String> {
    let f = if p.is_dir() && p.join("results.csv").exists() {
        p.join("results.csv")
    } else if p.is_dir() && p.join("summary.json").exists() {
        return summary_rows(&p.join("summary.json"));
    } else {
        p.to_path_buf()
    };
    let file = std::fs::File::open(&f).map_err(|e| format!("{}: {e}", f.display()))?;
    let limited = std::io::Read::take(file, crate::input::TABLE_BYTES_MAX);
    let mut r = csv::Reader::from_reader(crate::input::LineLimit::new(limited, 1 << 20));
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
}

/// Rows by (group, seed): the group is every column that is not a metric (the point's axis
/// values and the policy), so rows pair by point, policy and seed.
fn index(rows: &[Row]) -> BTreeMap<(String, String), &Row> {
    let group = |row: &Row| -> String {
        row.iter()
            .filter(|(k, _)| !METRICS.iter().any(|(m, _)| m == k) || *k == "run_policy")
            .filter(|(k, _)| *k != "task" && *k != "seed" && *k != "point")
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let seed = |row: &Row| row.get("seed").cloned().unwrap_or_default();
    rows.iter().map(|r| ((group(r), seed(r)), r)).collect()
}

/// Differences B − A per (group, metric), paired by seed.
fn paired(ra: &[Row], rb: &[Row]) -> BTreeMap<(String, &'static str), Vec<f64>> {
    let (ia, ib) = (index(ra), index(rb));
    let mut diffs: BTreeMap<(String, &str), Vec<f64>> = BTreeMap::new();
    for ((group, seed), row_a) in &ia {
        let Some(row_b) = ib.get(&(group.clone(), seed.clone())) else {
            continue;
        };
        for m in COMPARED {
            let value = |row: &Row| row.get(m).and_then(|v| v.parse::<f64>().ok());
            if let (Some(x), Some(y)) = (value(row_a), value(row_b)) {
                diffs.entry((group.clone(), m)).or_default().push(y - x);
            }
        }
    }
    diffs
}

/// One line of the table: mean difference, its 95 % t interval, and whether it excludes 0.
fn line(group: &str, metric: &str, d: &[f64]) -> String {
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
    format!("{g:<60} {metric:<26} {n:>5} {mean:>14.6} {lo:>14.6} {hi:>14.6}  {sig}\n")
}

/// `cancelsim compare A B`: two sweeps' results (or two run directories' summaries), paired by
/// point, policy and seed; for each metric the mean difference B − A with a 95 % confidence
/// interval, marked significant when the interval excludes 0.
pub fn compare(a: &Path, b: &Path) -> Result<String, String> {
    let (ra, rb) = (load(a)?, load(b)?);
    let diffs = paired(&ra, &rb);
    if diffs.is_empty() {
        return Err("no rows pair up (same points, policies and seeds are needed)".into());
    }
    let mut out = format!(
        "{:<60} {:<26} {:>5} {:>14} {:>14} {:>14}  {}\n",
        "group", "metric", "pairs", "mean B-A", "ci95 low", "ci95 high", "significant"
    );
    for ((group, metric), d) in &diffs {
        out += &line(group, metric, d);
    }
    Ok(out)
}

/// A run directory's summary.json as rows like a sweep's (one per policy, seed from the report).
fn summary_rows(path: &Path) -> Result<Vec<BTreeMap<String, String>>, String> {
    let v: serde_json::Value = serde_json::from_slice(
        &crate::input::read_limited(path, crate::input::TABLE_BYTES_MAX)
            .map_err(|e| format!("{}: {e}", path.display()))?,
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

//! What a sweep answers: for each point and policy, the mean and 95 % interval over its seeds of
//! every numeric column of `results.csv`, written as `summary.csv`, and the headline metrics
//! beside the counterfactual's printed as a table that fits 100 columns.

use std::collections::BTreeMap;
use std::path::Path;

use super::{Plan, SweepError};
use crate::stats::t95;

/// The metrics the printed table shows: (column, heading), and the counterfactual's column
/// printed beside the TTFT.
const HEADLINE: [(&str, &str); 4] = [
    ("leaked_gpu_s", "leaked GPU-s"),
    ("sibling_survival_rate", "sibling surv."),
    ("ttft_p99_ms", "TTFT p99 ms"),
    ("e2e_p99_ms", "E2E p99 ms"),
];
const CF_TTFT: &str = "cf_ttft_p99_ms";

/// One (point, policy): its axis values, its seeds, and each numeric column's values.
pub(super) struct Group {
    pub(super) axes: Vec<String>,
    pub(super) policy: String,
    seeds: usize,
    pub(super) values: Vec<Vec<f64>>,
}

/// Mean and 95 % half-width (t with n − 1 degrees of freedom). One value has no interval: its
/// half-width is NaN, shown as `n/a` and written empty, never as a misleading 0.
pub(super) fn mean_ci(xs: &[f64]) -> (f64, f64) {
    let n = xs.len();
    if n == 0 {
        return (f64::NAN, f64::NAN);
    }
    let mean = xs.iter().sum::<f64>() / n as f64;
    if n == 1 {
        return (mean, f64::NAN);
    }
    let var = xs.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / (n - 1) as f64;
    (mean, t95(n - 1) * (var / n as f64).sqrt())
}

/// Read `results.csv` of `out` into groups, and the names of its numeric metric columns.
pub(super) fn groups_of(plan: &Plan, out: &Path) -> Result<(Vec<String>, Vec<Group>), SweepError> {
    let path = out.join("results.csv");
    let bad = |e: String| SweepError::Input(format!("{}: {e}", path.display()));
    let mut r = csv::Reader::from_path(&path).map_err(|e| bad(e.to_string()))?;
    let header: Vec<String> = r
        .headers()
        .map_err(|e| bad(e.to_string()))?
        .iter()
        .map(String::from)
        .collect();
    let axes = plan.sweep.grid.len();
    let first_metric = 3 + axes;
    let policy_col = header
        .iter()
        .position(|h| h == "run_policy")
        .ok_or_else(|| bad("no run_policy column".into()))?;
    let rows: Vec<csv::StringRecord> = r
        .records()
        .collect::<Result<_, _>>()
        .map_err(|e| bad(e.to_string()))?;
    if rows.is_empty() {
        return Err(bad("no rows".into()));
    }
    // Numeric columns: every non-empty cell parses as a number.
    let numeric: Vec<usize> = (first_metric..header.len())
        .filter(|&c| {
            rows.iter()
                .all(|row| row[c].is_empty() || row[c].parse::<f64>().is_ok())
        })
        .filter(|&c| rows.iter().any(|row| !row[c].is_empty()))
        .collect();
    let mut by_key: BTreeMap<(u64, usize), Group> = BTreeMap::new();
    let mut policy_order: Vec<String> = Vec::new();
    for row in &rows {
        let point: u64 = row[1]
            .parse()
            .map_err(|_| bad(format!("point {:?}", &row[1])))?;
        let policy = row[policy_col].to_string();
        let order = match policy_order.iter().position(|p| *p == policy) {
            Some(i) => i,
            None => {
                policy_order.push(policy.clone());
                policy_order.len() - 1
            }
        };
        let g = by_key.entry((point, order)).or_insert_with(|| Group {
            axes: (3..first_metric).map(|c| row[c].to_string()).collect(),
            policy,
            seeds: 0,
            values: vec![Vec::new(); numeric.len()],
        });
        g.seeds += 1;
        for (k, &c) in numeric.iter().enumerate() {
            if let Ok(x) = row[c].parse::<f64>() {
                g.values[k].push(x);
            }
        }
    }
    let names = numeric.iter().map(|&c| header[c].clone()).collect();
    Ok((names, by_key.into_values().collect()))
}

/// Write `summary.csv` and return the table to print.
pub fn summarise(plan: &Plan, out: &Path) -> Result<String, SweepError> {
    let (names, groups) = groups_of(plan, out)?;
    let axis_names: Vec<&str> = plan.sweep.grid.iter().map(|a| a.name()).collect();
    let mut w = csv::Writer::from_writer(Vec::new());
    let mut head: Vec<String> = axis_names.iter().map(|s| s.to_string()).collect();
    head.extend(["run_policy".to_string(), "seeds".to_string()]);
    for n in &names {
        head.push(format!("{n}_mean"));
        head.push(format!("{n}_ci95"));
    }
    let io = |e: String| SweepError::Io(format!("{}: {e}", out.join("summary.csv").display()));
    w.write_record(&head).map_err(|e| io(e.to_string()))?;
    for g in &groups {
        let mut row = g.axes.clone();
        row.extend([g.policy.clone(), g.seeds.to_string()]);
        for v in &g.values {
            let (m, h) = mean_ci(v);
            let cell = |x: f64| {
                if x.is_nan() {
                    String::new()
                } else {
                    x.to_string()
                }
            };
            row.extend([cell(m), cell(h)]);
        }
        w.write_record(&row).map_err(|e| io(e.to_string()))?;
    }
    let bytes = w.into_inner().map_err(|e| io(e.to_string()))?;
    super::execute::atomic_write(&out.join("summary.csv"), &bytes)?;
    Ok(table(&axis_names, &names, &groups))
}

/// The headline table: axis values (but the policy, which has its own column), the policy, each
/// headline metric as mean ± half-width, and the counterfactual's TTFT p99.
fn table(axis_names: &[&str], names: &[String], groups: &[Group]) -> String {
    let col = |n: &str| names.iter().position(|x| x == n);
    let shown_axes: Vec<usize> = (0..axis_names.len())
        .filter(|&i| axis_names[i] != "policy")
        .collect();
    let mut t = String::new();
    for &i in &shown_axes {
        t += &format!("{:>9} ", axis_names[i]);
    }
    t += &format!("{:<22}", "policy");
    for (_, heading) in HEADLINE {
        t += &format!("{heading:>14}");
    }
    t += &format!("{:>12}\n", "cf TTFT p99");
    for g in groups {
        for &i in &shown_axes {
            t += &format!("{:>9} ", g.axes[i]);
        }
        let policy: String = g.policy.chars().take(21).collect();
        t += &format!("{policy:<22}");
        for (name, _) in HEADLINE {
            let cell = col(name).map_or("-".to_string(), |k| {
                let (m, h) = mean_ci(&g.values[k]);
                if m.is_nan() {
                    "-".into()
                } else if h.is_nan() {
                    format!("{}±n/a", short(m))
                } else {
                    format!("{}±{}", short(m), short(h))
                }
            });
            t += &format!("{cell:>14}");
        }
        let cf = col(CF_TTFT).map_or(f64::NAN, |k| mean_ci(&g.values[k]).0);
        t += &format!("{:>12}\n", short(cf));
    }
    t
}

/// A number in at most 6 characters' worth of precision that still reads.
fn short(x: f64) -> String {
    let a = x.abs();
    if x.is_nan() {
        "-".into()
    } else if a >= 1000.0 {
        format!("{x:.0}")
    } else if a >= 10.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.3}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mean_and_interval_use_the_t_quantile() {
        let (m, h) = mean_ci(&[1.0, 2.0, 3.0]);
        assert_eq!(m, 2.0);
        // s = 1, n = 3: t(2) = 4.303, half-width 4.303 / sqrt 3.
        assert!((h - 4.303 / 3f64.sqrt()).abs() < 1e-12);
        let (m, h) = mean_ci(&[5.0]);
        assert!(m == 5.0 && h.is_nan(), "one value has no interval");
        assert!(mean_ci(&[]).0.is_nan());
    }
}

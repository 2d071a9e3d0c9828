//! `cancelsim compare`: two sweeps (or run directories) paired by point, policy and seed, or two
//! policies within one sweep paired by point and seed. For each metric: the mean difference
//! B − A with a 95 % t interval, a paired t test's p-value, and Holm's correction over all the
//! tests of the comparison, as a table, as JSON, or as a forest plot.

use std::collections::BTreeMap;
use std::path::Path;

use super::METRICS;
use crate::stats::t95;

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

/// What a compared path holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// A sweep directory (`results.csv`) or a sweep's CSV file.
    Sweep,
    /// A run directory (`summary.json`).
    Run,
}

/// The rows of a sweep's `results.csv`, a run directory's `summary.json`, or a CSV file.
fn load(p: &Path) -> Result<Vec<Row>, String> {
    load_kind(p).map(|(_, rows)| rows)
}

/// `load`, and what the path held.
fn load_kind(p: &Path) -> Result<(Kind, Vec<Row>), String> {
    let f = if p.is_dir() && p.join("results.csv").exists() {
        p.join("results.csv")
    } else if p.is_dir() && p.join("summary.json").exists() {
        return Ok((Kind::Run, summary_rows(&p.join("summary.json"))?));
    } else if p.is_dir() {
        return Err(format!(
            "{}: neither a sweep (no results.csv) nor a run directory (no summary.json)",
            p.display()
        ));
    } else {
        p.to_path_buf()
    };
    Ok((Kind::Sweep, csv_rows(&f)?))
}

/// The rows of a CSV table (a sweep's results).
fn csv_rows(f: &Path) -> Result<Vec<Row>, String> {
    let file = std::fs::File::open(f).map_err(|e| format!("{}: {e}", f.display()))?;
    let limited = std::io::Read::take(file, crate::input::TABLE_BYTES_MAX);
    let mut r = csv::Reader::from_reader(crate::input::LineLimit::new(limited, 1 << 20));
    let at = |e: csv::Error| format!("{}: {e}", f.display());
    let headers = r.headers().map_err(at)?.clone();
    r.records()
        .map(|rec| {
            let rec = rec.map_err(at)?;
            Ok(headers
                .iter()
                .zip(rec.iter())
                .map(|(h, v)| (h.to_string(), v.to_string()))
                .collect())
        })
        .collect()
}

/// Rows by (group, seed): the group is every column that is not a metric (the point's axis
/// values, and the policy unless `drop_policy`), so rows pair by point, policy and seed.
fn index(rows: &[Row], drop_policy: bool) -> BTreeMap<(String, String), &Row> {
    let group = |row: &Row| -> String {
        row.iter()
            .filter(|(k, _)| !METRICS.iter().any(|(m, _)| m == k) || *k == "run_policy")
            .filter(|(k, _)| *k != "task" && *k != "seed" && *k != "point")
            .filter(|(k, _)| !(drop_policy && (*k == "run_policy" || *k == "policy")))
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let seed = |row: &Row| row.get("seed").cloned().unwrap_or_default();
    rows.iter().map(|r| ((group(r), seed(r)), r)).collect()
}

/// What is compared with what.
pub enum Pairing<'a> {
    /// Two sweeps (or run directories): B − A, paired by point, policy and seed.
    Sweeps(&'a Path, &'a Path),
    /// Two policies of one sweep: policy B − policy A, paired by point and seed.
    Policies(&'a Path, &'a str, &'a str),
}

/// One test: a metric of one group, over its paired seeds.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Test {
    pub group: String,
    pub metric: &'static str,
    pub pairs: usize,
    pub mean: f64,
    pub ci95_low: f64,
    pub ci95_high: f64,
    /// Two-sided paired t test of a zero mean difference.
    pub p: f64,
    /// Holm's step-down adjustment over every test of the comparison.
    pub p_holm: f64,
    /// `p_holm` below 0.05.
    pub significant: bool,
}

/// A whole comparison: its two sides, named, and its tests in group then metric order.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Comparison {
    pub a: String,
    pub b: String,
    pub tests: Vec<Test>,
}

/// Differences B − A per (group, metric), paired by seed.
fn paired(
    ia: &BTreeMap<(String, String), &Row>,
    ib: &BTreeMap<(String, String), &Row>,
) -> BTreeMap<(String, &'static str), Vec<f64>> {
    let mut diffs: BTreeMap<(String, &str), Vec<f64>> = BTreeMap::new();
    for ((group, seed), row_a) in ia {
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

/// The seeds of some rows, as "1–10" or a list, for a message.
fn seeds_of(rows: &[Row]) -> String {
    let mut seeds: Vec<u64> = rows
        .iter()
        .filter_map(|r| r.get("seed")?.parse().ok())
        .collect();
    seeds.sort_unstable();
    seeds.dedup();
    match (seeds.first(), seeds.last()) {
        (Some(lo), Some(hi)) if hi - lo + 1 == seeds.len() as u64 => format!("{lo}–{hi}"),
        (Some(_), Some(_)) => format!("{} seeds from {}", seeds.len(), seeds[0]),
        _ => "no seeds".into(),
    }
}

/// Why nothing paired up, with what pairing needs.
fn no_pairs(ra: &[Row], rb: &[Row], within: bool) -> String {
    let (sa, sb) = (seeds_of(ra), seeds_of(rb));
    if within {
        return format!(
            "no rows pair up: both policies must be in the sweep, at the same points and seeds \
             (seeds {sa})"
        );
    }
    let hint = if sa != sb {
        format!("A has seeds {sa} and B has {sb}: run both with the same first_seed and seeds")
    } else {
        "the seeds match, so the points or policies differ: compare sweeps of the same grid".into()
    };
    format!("no rows pair up: pairing needs the same points, policies and seeds; {hint}")
}

/// Compare as `pairing` says.
pub fn comparison(pairing: Pairing) -> Result<Comparison, String> {
    let (a_name, b_name, diffs) = match pairing {
        Pairing::Sweeps(a, b) => {
            let ((ka, ra), (kb, rb)) = (load_kind(a)?, load_kind(b)?);
            if ka != kb {
                let what = |k| match k {
                    Kind::Sweep => "a sweep",
                    Kind::Run => "a run directory",
                };
                return Err(format!(
                    "{} is {} and {} is {}: compare two sweeps, or two run directories",
                    a.display(),
                    what(ka),
                    b.display(),
                    what(kb)
                ));
            }
            let diffs = paired(&index(&ra, false), &index(&rb, false));
            if diffs.is_empty() {
                return Err(no_pairs(&ra, &rb, false));
            }
            (a.display().to_string(), b.display().to_string(), diffs)
        }
        Pairing::Policies(dir, pa, pb) => {
            let rows = load(dir)?;
            let of = |p: &str| -> Vec<Row> {
                rows.iter()
                    .filter(|r| r.get("run_policy").is_some_and(|x| x == p))
                    .cloned()
                    .collect()
            };
            let (ra, rb) = (of(pa), of(pb));
            let known: Vec<String> = {
                let mut k: Vec<String> = rows
                    .iter()
                    .filter_map(|r| r.get("run_policy").cloned())
                    .collect();
                k.sort();
                k.dedup();
                k
            };
            for (p, r) in [(pa, &ra), (pb, &rb)] {
                if r.is_empty() {
                    return Err(format!(
                        "{}: no policy {p:?}; the sweep has {}",
                        dir.display(),
                        known.join(", ")
                    ));
                }
            }
            let diffs = paired(&index(&ra, true), &index(&rb, true));
            if diffs.is_empty() {
                return Err(no_pairs(&ra, &rb, true));
            }
            (pa.to_string(), pb.to_string(), diffs)
        }
    };
    Ok(Comparison {
        a: a_name,
        b: b_name,
        tests: holm(tests(&diffs)),
    })
}

/// `cancelsim compare A B`: the table of `comparison(Pairing::Sweeps(a, b))`.
pub fn compare(a: &Path, b: &Path) -> Result<String, String> {
    comparison(Pairing::Sweeps(a, b)).map(|c| c.table())
}

/// The tests, before Holm's adjustment.
fn tests(diffs: &BTreeMap<(String, &'static str), Vec<f64>>) -> Vec<Test> {
    diffs
        .iter()
        .map(|((group, metric), d)| {
            let n = d.len();
            let mean = d.iter().sum::<f64>() / n as f64;
            let (half, p) = if n >= 2 {
                let var = d.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / (n - 1) as f64;
                let se = (var / n as f64).sqrt();
                let p = if se == 0.0 {
                    if mean == 0.0 {
                        1.0
                    } else {
                        0.0
                    }
                } else {
                    t_two_sided_p(mean / se, (n - 1) as f64)
                };
                (t95(n - 1) * se, p)
            } else {
                (f64::NAN, f64::NAN)
            };
            Test {
                group: group.clone(),
                metric,
                pairs: n,
                mean,
                ci95_low: mean - half,
                ci95_high: mean + half,
                p,
                p_holm: f64::NAN,
                significant: false,
            }
        })
        .collect()
}

/// Holm's step-down adjustment over the tests that have a p-value: the i-th smallest of m is
/// multiplied by m − i, and kept monotone.
fn holm(mut tests: Vec<Test>) -> Vec<Test> {
    let mut order: Vec<usize> = (0..tests.len()).filter(|&i| !tests[i].p.is_nan()).collect();
    order.sort_by(|&i, &j| tests[i].p.total_cmp(&tests[j].p).then(i.cmp(&j)));
    let m = order.len();
    let mut running = 0.0f64;
    for (rank, &i) in order.iter().enumerate() {
        running = running.max(((m - rank) as f64 * tests[i].p).min(1.0));
        tests[i].p_holm = running;
        tests[i].significant = running < 0.05;
    }
    tests
}

/// Two-sided p-value of Student's t with `df` degrees of freedom: I_{df/(df+t²)}(df/2, 1/2).
pub fn t_two_sided_p(t: f64, df: f64) -> f64 {
    incomplete_beta(df / 2.0, 0.5, df / (df + t * t)).clamp(0.0, 1.0)
}

/// The regularised incomplete beta I_x(a, b), by its continued fraction (modified Lentz), on
/// the side where it converges fast.
fn incomplete_beta(a: f64, b: f64, x: f64) -> f64 {
    if x <= 0.0 {
        return 0.0;
    }
    if x >= 1.0 {
        return 1.0;
    }
    let ln_front = libm::lgamma(a + b) - libm::lgamma(a) - libm::lgamma(b)
        + a * libm::log(x)
        + b * libm::log(1.0 - x);
    if x < (a + 1.0) / (a + b + 2.0) {
        libm::exp(ln_front) * beta_fraction(a, b, x) / a
    } else {
        1.0 - libm::exp(ln_front) * beta_fraction(b, a, 1.0 - x) / b
    }
}

fn beta_fraction(a: f64, b: f64, x: f64) -> f64 {
    const TINY: f64 = 1e-300;
    let (qab, qap, qam) = (a + b, a + 1.0, a - 1.0);
    let mut c = 1.0;
    let mut d = 1.0 - qab * x / qap;
    d = if d.abs() < TINY { TINY } else { d };
    d = 1.0 / d;
    let mut h = d;
    for m in 1..=300 {
        let m = m as f64;
        let m2 = 2.0 * m;
        for aa in [
            m * (b - m) * x / ((qam + m2) * (a + m2)),
            -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2)),
        ] {
            d = 1.0 + aa * d;
            d = if d.abs() < TINY { TINY } else { d };
            c = 1.0 + aa / c;
            c = if c.abs() < TINY { TINY } else { c };
            d = 1.0 / d;
            h *= d * c;
        }
        if (d * c - 1.0).abs() < 1e-15 {
            break;
        }
    }
    h
}

impl Comparison {
    /// The table: a line per group, then a row per metric, within 100 columns.
    pub fn table(&self) -> String {
        let m = self.tests.iter().filter(|t| !t.p.is_nan()).count();
        let mut out = format!(
            "B - A, A = {}, B = {}\npaired by seed; 95 % t intervals; p: paired t test, Holm-adjusted over {m} tests\n",
            self.a, self.b
        );
        let mut group = None;
        for t in &self.tests {
            if group != Some(&t.group) {
                group = Some(&t.group);
                let name = if t.group.is_empty() {
                    "(all)"
                } else {
                    t.group.as_str()
                };
                out += &format!("\n{name}\n");
                out += &format!(
                    "  {:<24} {:>5} {:>12} {:>12} {:>12} {:>9}  {}\n",
                    "metric",
                    "pairs",
                    "mean B-A",
                    "ci95 low",
                    "ci95 high",
                    "p (Holm)",
                    "significant"
                );
            }
            let sig = if t.pairs < 2 {
                "n/a (one pair)"
            } else if t.significant {
                "yes"
            } else {
                "no"
            };
            out += &format!(
                "  {:<24} {:>5} {:>12} {:>12} {:>12} {:>9}  {sig}\n",
                t.metric,
                t.pairs,
                num(t.mean),
                num(t.ci95_low),
                num(t.ci95_high),
                num(t.p_holm)
            );
        }
        out
    }

    pub fn json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a comparison serialises")
    }
}

/// A number in 12 characters at most.
fn num(x: f64) -> String {
    if x.is_nan() {
        "-".into()
    } else if x != 0.0 && (x.abs() >= 1e7 || x.abs() < 1e-4) {
        format!("{x:.3e}")
    } else {
        format!("{x:.4}")
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn student_t_p_values_match_the_tables() {
        // Two-sided 5 % critical values: t(1) = 12.706, t(10) = 2.228, t(30) = 2.042.
        for (t, df) in [(12.706, 1.0), (2.228, 10.0), (2.042, 30.0)] {
            let p = t_two_sided_p(t, df);
            assert!((p - 0.05).abs() < 2e-4, "t {t} df {df}: p {p}");
        }
        assert!((t_two_sided_p(0.0, 5.0) - 1.0).abs() < 1e-12);
        // t(4) = 4.604 is the 1 % point.
        assert!((t_two_sided_p(4.604, 4.0) - 0.01).abs() < 1e-4);
    }

    #[test]
    fn holm_multiplies_the_smallest_by_m_and_stays_monotone() {
        let t = |p: f64| Test {
            group: String::new(),
            metric: "m",
            pairs: 5,
            mean: 0.0,
            ci95_low: 0.0,
            ci95_high: 0.0,
            p,
            p_holm: f64::NAN,
            significant: false,
        };
        let out = holm(vec![t(0.04), t(0.01), t(0.03), t(f64::NAN)]);
        // Sorted 0.01, 0.03, 0.04 with m = 3: 0.03, max(0.03, 0.06) = 0.06, max(0.06, 0.04).
        assert!((out[1].p_holm - 0.03).abs() < 1e-12 && out[1].significant);
        assert!((out[2].p_holm - 0.06).abs() < 1e-12 && !out[2].significant);
        assert!((out[0].p_holm - 0.06).abs() < 1e-12);
        assert!(out[3].p_holm.is_nan());
    }
}

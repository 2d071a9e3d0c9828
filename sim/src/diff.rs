//! `cancelsim diff`: where two runs, or two sweeps, first diverge. Two run directories are
//! compared file by file (`summary.json` field by field, `requests.csv`, `jobs.csv`,
//! `timeseries.csv` and `pools.csv` row by row, streamed), two sweeps by their `results.csv`. What names the build (`commit`,
//! `version`) and the run hashes are left out: two builds that agree on every answer agree here,
//! and the run hashes are reported apart (an event stream may change by design while no answer
//! does).
//!
//! A file that one side lacks, or that cannot be read as what it should be (an empty CSV, JSON
//! that does not parse), is an error, never an agreement.

use std::path::{Path, PathBuf};

use serde_json::Value;

/// Fields left out of the comparison: the build's identity and the run hashes.
pub const IGNORED: [&str; 4] = ["commit", "version", "run_hash", "report_run_hash"];

/// Every run's hash out of a report (the top level's, each policy's and baseline's), at any
/// depth: what it answers, for a change of the event stream by design.
pub fn strip_run_hashes(v: &mut Value) {
    match v {
        Value::Object(o) => {
            o.remove("run_hash");
            o.values_mut().for_each(strip_run_hashes);
        }
        Value::Array(a) => a.iter_mut().for_each(strip_run_hashes),
        _ => {}
    }
}

/// One file compared.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Compared {
    pub file: &'static str,
    /// Fields (JSON) or data rows (CSV) compared.
    pub items: u64,
    /// Of those, the ones that differ.
    pub differing: u64,
    /// Where it first differs.
    pub first: Option<Divergence>,
}

/// The first place two files differ.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Divergence {
    /// A JSON path (`policies[1](per_request).ttft_ms.p99`) or a CSV line and the row's
    /// request (`line 57 (policy per_request, id 41)`).
    pub at: String,
    /// The field or column that differs.
    pub field: String,
    pub a: String,
    pub b: String,
}

/// Two directories compared.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Diff {
    pub files: Vec<Compared>,
    /// The report run hashes of two runs (or of the first rows of two sweeps), if they differ.
    pub hashes: Option<(String, String)>,
}

impl Diff {
    pub fn agree(&self) -> bool {
        self.files.iter().all(|f| f.differing == 0)
    }
}

/// What a directory is.
enum Kind {
    Run,
    Sweep,
}

fn kind(dir: &Path) -> Result<Kind, String> {
    if dir.join("summary.json").is_file() {
        Ok(Kind::Run)
    } else if dir.join("results.csv").is_file() {
        Ok(Kind::Sweep)
    } else {
        Err(format!(
            "{}: neither a run directory (no summary.json) nor a sweep (no results.csv)",
            dir.display()
        ))
    }
}

/// Compare run directory (or sweep) `a` with `b`.
pub fn dirs(a: &Path, b: &Path) -> Result<Diff, String> {
    match (kind(a)?, kind(b)?) {
        (Kind::Run, Kind::Run) => runs(a, b),
        (Kind::Sweep, Kind::Sweep) => {
            let (results, hashes) = csv_file("results.csv", a, b)?;
            Ok(Diff {
                files: vec![results],
                hashes,
            })
        }
        _ => Err(format!(
            "{} and {}: one is a run directory and the other a sweep",
            a.display(),
            b.display()
        )),
    }
}

fn runs(a: &Path, b: &Path) -> Result<Diff, String> {
    let read = |d: &Path| -> Result<Value, String> {
        let p = d.join("summary.json");
        let text = std::fs::read_to_string(&p).map_err(|e| format!("{}: {e}", p.display()))?;
        serde_json::from_str(&text).map_err(|e| format!("{}: not JSON: {e}", p.display()))
    };
    let (ja, jb) = (read(a)?, read(b)?);
    let mut summary = Compared::new("summary.json");
    json(&mut summary, "", &ja, &jb);
    let hash = |v: &Value| {
        let h = v.get("run_hash").and_then(Value::as_str);
        h.unwrap_or_default().to_string()
    };
    let hashes = (hash(&ja) != hash(&jb)).then(|| (hash(&ja), hash(&jb)));
    let mut files = vec![summary];
    for name in ["requests.csv", "jobs.csv", "timeseries.csv", "pools.csv"] {
        match (a.join(name).is_file(), b.join(name).is_file()) {
            (false, false) => {}
            (true, true) => files.push(csv_file(name, a, b)?.0),
            (has_a, _) => {
                let lacks = if has_a { b } else { a };
                return Err(format!(
                    "{}: no {name}, which the other has",
                    lacks.display()
                ));
            }
        }
    }
    Ok(Diff { files, hashes })
}

impl Compared {
    fn new(file: &'static str) -> Compared {
        Compared {
            file,
            items: 0,
            differing: 0,
            first: None,
        }
    }

    fn differs(&mut self, at: impl FnOnce() -> (String, String), a: String, b: String) {
        self.differing += 1;
        if self.first.is_none() {
            let (at, field) = at();
            self.first = Some(Divergence { at, field, a, b });
        }
    }
}

/// Walk two JSON values in the order of their keys (serde_json keeps maps sorted).
fn json(c: &mut Compared, path: &str, a: &Value, b: &Value) {
    match (a, b) {
        (Value::Object(ma), Value::Object(mb)) => {
            let keys: std::collections::BTreeSet<&String> = ma.keys().chain(mb.keys()).collect();
            for k in keys.into_iter().filter(|k| !IGNORED.contains(&k.as_str())) {
                let here = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                match (ma.get(k), mb.get(k)) {
                    (Some(x), Some(y)) => json(c, &here, x, y),
                    (x, y) => {
                        c.items += 1;
                        c.differs(|| split(&here), shown(x), shown(y));
                    }
                }
            }
        }
        (Value::Array(xa), Value::Array(xb)) if xa.len() == xb.len() => {
            for (i, (x, y)) in xa.iter().zip(xb).enumerate() {
                let label = x.get("policy").and_then(Value::as_str);
                let here = match label {
                    Some(p) => format!("{path}[{i}]({p})"),
                    None => format!("{path}[{i}]"),
                };
                json(c, &here, x, y);
            }
        }
        _ => {
            c.items += 1;
            if a != b {
                c.differs(|| split(path), a.to_string(), b.to_string());
            }
        }
    }
}

/// A JSON path as (where, field): the last key is the field.
fn split(path: &str) -> (String, String) {
    match path.rsplit_once('.') {
        Some((at, field)) => (at.to_string(), field.to_string()),
        None => (String::new(), path.to_string()),
    }
}

fn shown(v: Option<&Value>) -> String {
    v.map_or_else(|| "(absent)".to_string(), Value::to_string)
}

fn reader(dir: &Path, name: &str) -> Result<(csv::Reader<std::fs::File>, PathBuf), String> {
    let p = dir.join(name);
    let r = csv::ReaderBuilder::new()
        .has_headers(false)
        .flexible(true)
        .from_path(&p)
        .map_err(|e| format!("{}: {e}", p.display()))?;
    Ok((r, p))
}

/// One CSV row, or the end; a file that ends before its header is corrupt.
fn next(r: &mut csv::Reader<std::fs::File>, p: &Path) -> Result<Option<csv::StringRecord>, String> {
    let mut rec = csv::StringRecord::new();
    match r.read_record(&mut rec) {
        Ok(true) => Ok(Some(rec)),
        Ok(false) => Ok(None),
        Err(e) => Err(format!("{}: {e}", p.display())),
    }
}

/// Compare `name` in `a` and `b` row by row, streaming. Also returns the first data rows' report
/// run hashes where they differ (a sweep's).
fn csv_file(
    name: &'static str,
    a: &Path,
    b: &Path,
) -> Result<(Compared, Option<(String, String)>), String> {
    let ((mut ra, pa), (mut rb, pb)) = (reader(a, name)?, reader(b, name)?);
    let header = |r: &mut _, p: &Path| {
        next(r, p)?.ok_or_else(|| format!("{}: empty, not even a header", p.display()))
    };
    let (ha, hb) = (header(&mut ra, &pa)?, header(&mut rb, &pb)?);
    let mut c = Compared::new(name);
    if ha != hb {
        let (x, y) = (ha.iter().collect::<Vec<_>>(), hb.iter().collect::<Vec<_>>());
        c.differs(
            || ("line 1".into(), "header".into()),
            x.join(","),
            y.join(","),
        );
        return Ok((c, None));
    }
    let col = |n: &str| ha.iter().position(|h| h == n);
    let (policy, id, hash) = (
        col("policy"),
        col("id").or(col("job")),
        col("report_run_hash"),
    );
    let mut hashes = None;
    for line in 2u64.. {
        let (x, y) = (next(&mut ra, &pa)?, next(&mut rb, &pb)?);
        let (x, y) = match (x, y) {
            (None, None) => break,
            (x, y) => (x.unwrap_or_default(), y.unwrap_or_default()),
        };
        c.items += 1;
        if line == 2 {
            let h = |r: &csv::StringRecord| hash.and_then(|i| r.get(i)).unwrap_or("").to_string();
            hashes = (h(&x) != h(&y)).then(|| (h(&x), h(&y)));
        }
        row(&mut c, &ha, (line, policy, id), &x, &y);
    }
    Ok((c, hashes))
}

/// Compare one row pair; a row one side lacks differs in its first column.
fn row(
    c: &mut Compared,
    header: &csv::StringRecord,
    (line, policy, id): (u64, Option<usize>, Option<usize>),
    x: &csv::StringRecord,
    y: &csv::StringRecord,
) {
    let width = header.len().max(x.len()).max(y.len());
    let Some(i) = (0..width).find(|&i| {
        let name = header.get(i).unwrap_or("");
        !IGNORED.contains(&name) && x.get(i) != y.get(i)
    }) else {
        return;
    };
    let at = || {
        let who = |r: &csv::StringRecord| {
            let get = |k: Option<usize>| k.and_then(|k| r.get(k)).filter(|v| !v.is_empty());
            match (get(policy), get(id)) {
                (Some(p), Some(i)) => format!(" (policy {p}, id {i})"),
                (None, Some(i)) => format!(" (id {i})"),
                _ => String::new(),
            }
        };
        let who = if x.is_empty() { who(y) } else { who(x) };
        let field = header.get(i).unwrap_or("?").to_string();
        (format!("line {line}{who}"), field)
    };
    let value = |r: &csv::StringRecord| match r.is_empty() {
        true => "(no row)".to_string(),
        false => r.get(i).unwrap_or("(absent)").to_string(),
    };
    c.differs(at, value(x), value(y));
}

/// The verdict for people: one line per file, then the run hashes.
pub fn render(d: &Diff, a: &Path, b: &Path) -> String {
    let mut out = String::new();
    for f in &d.files {
        match &f.first {
            None => out.push_str(&format!("{}: the same ({} compared)\n", f.file, f.items)),
            Some(v) => {
                let at = match (v.at.is_empty(), v.at.starts_with("line ")) {
                    (true, _) => v.field.clone(),
                    (false, true) => format!("{}, {}", v.at, v.field),
                    (false, false) => format!("{}.{}", v.at, v.field),
                };
                out.push_str(&format!(
                    "{}: {} of {} differ; first at {at}: {} (A) vs {} (B)\n",
                    f.file,
                    f.differing,
                    f.items,
                    clip(&v.a),
                    clip(&v.b)
                ));
            }
        }
    }
    match &d.hashes {
        None => out.push_str("run hashes: the same\n"),
        Some((x, y)) => out.push_str(&format!("run hashes: {x} (A) vs {y} (B)\n")),
    }
    let verdict = match d.agree() {
        true => "agree",
        false => "differ",
    };
    out.push_str(&format!(
        "diff: A {} and B {} {verdict}\n",
        a.display(),
        b.display()
    ));
    out
}

/// A value as shown: long ones (a whole array) cut to their start.
fn clip(v: &str) -> String {
    const SHOWN_MAX: usize = 120;
    match v.char_indices().nth(SHOWN_MAX) {
        Some((i, _)) => format!("{}...", &v[..i]),
        None => v.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_run_hash_goes_and_nothing_else() {
        let mut v = serde_json::json!({
            "run_hash": "a", "seed": 1,
            "counterfactual": {"run_hash": "b", "ttft_ms": 2.0},
            "policies": [{"run_hash": "c", "label": "x"}, {"ttft_ms": 3.0}],
        });
        strip_run_hashes(&mut v);
        let want = serde_json::json!({
            "seed": 1,
            "counterfactual": {"ttft_ms": 2.0},
            "policies": [{"label": "x"}, {"ttft_ms": 3.0}],
        });
        assert_eq!(v, want);
    }
}

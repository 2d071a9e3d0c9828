//! The differential corpus: what the build before the speed work (issue #30) answered, held
//! against what this build answers. Every library scenario, the five benchmarks at 1,500
//! requests, and fuzzer-drawn scenarios over every option (prefill/decode graphs included): for
//! each, the BLAKE3 of `requests.csv`, of the report as `summary.json` holds it (less its
//! commit and every run hash), and, for the library and the benchmarks, of each field of the report's
//! second level (`policies[1].ttft_ms`, say), so a change names the field it reached. The run
//! hash is held apart: a change of the event stream by design may change it, once, in a commit
//! that says so; the answers may not change.
//!
//! `sim/tests/data/differential.txt` holds the expected lines. `CANCELSIM_BLESS=1` writes it
//! anew (for a change of answers by design, which its commit must say); a corpus entry missing
//! from it, an extra one, or an empty file fails.
//!
//! The README's test command runs the library and the benchmarks; `.ci/run` runs the whole
//! corpus in release: `cargo test --release --test differential -- --include-ignored`. (A
//! binary of its own, so that release build is small.)

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use cancelsim::check::fuzz::{self, Tier};
use cancelsim::record::{RequestRow, RequestSink};
use cancelsim::run::{Report, RunOptions};
use cancelsim::scenario::{Scenario, Source};
use rayon::prelude::*;

#[path = "it/library.rs"]
mod library;

const DATA: &str = "tests/data/differential.txt";
/// Requests each benchmark is cut to.
const BENCH_REQUESTS: u64 = 1_500;
/// Fuzzer-drawn scenarios in the whole corpus: small and big tiers.
const FUZZ_SMALL: u64 = 300;
const FUZZ_BIG: u64 = 6;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `requests.csv` as the run directory writes it, hashed as it streams.
struct CsvHash {
    w: csv::Writer<Vec<u8>>,
}

impl RequestSink for CsvHash {
    fn row(&mut self, row: &RequestRow) {
        self.w.serialize(row).expect("a row serialises");
    }
}

/// The corpus: (name, scenario, seed).
fn corpus(whole: bool) -> Vec<(String, Scenario, u64)> {
    let mut out = Vec::new();
    for p in library::files() {
        let s = Scenario::load(&p).unwrap_or_else(|e| panic!("{e}"));
        let name = format!("library/{}", p.file_name().unwrap().to_string_lossy());
        out.push((name, s.clone(), s.seed));
    }
    for b in [
        "bench-poisson-100k",
        "bench-poisson-1m",
        "bench-storm-1m",
        "bench-storm-1m-1p1d",
        "bench-storm-1m-4pools",
    ] {
        let mut s = Scenario::load(&repo().join(format!("scenarios/{b}.ron"))).unwrap();
        match &mut s.workload.source {
            Source::Poisson { requests, .. } => *requests = BENCH_REQUESTS,
            other => panic!("{b}: a Poisson benchmark, not {other:?}"),
        }
        out.push((format!("{b}@{BENCH_REQUESTS}"), s.clone(), s.seed));
    }
    if whole {
        let base = repo().join("scenarios");
        for (tier, n) in [(Tier::Small, FUZZ_SMALL), (Tier::Big, FUZZ_BIG)] {
            for seed in 1..=n {
                let s = fuzz::scenario(seed, tier, base.clone());
                out.push((format!("fuzz-{tier:?}/{seed}"), s, seed));
            }
        }
    }
    out
}

fn digest(bytes: &[u8]) -> String {
    blake3::hash(bytes).to_hex()[..16].to_string()
}

/// The second-level fields of a report, each as its JSON text: `counterfactual.requests`,
/// `policies[0].ttft_ms`, or a top-level field that is not an object or a list of objects.
fn fields(v: &serde_json::Value) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let top = v.as_object().expect("a report is an object");
    for (k, v) in top {
        match v {
            serde_json::Value::Object(m) => {
                for (sub, x) in m {
                    out.insert(format!("{k}.{sub}"), x.to_string());
                }
            }
            serde_json::Value::Array(a) if a.iter().all(|x| x.is_object()) && !a.is_empty() => {
                for (i, x) in a.iter().enumerate() {
                    for (sub, y) in x.as_object().unwrap() {
                        out.insert(format!("{k}[{i}].{sub}"), y.to_string());
                    }
                }
            }
            other => {
                out.insert(k.clone(), other.to_string());
            }
        }
    }
    out
}

/// What one corpus entry answers, as `name key digest` lines.
fn answers(name: &str, s: &Scenario, seed: u64, by_field: bool) -> Vec<String> {
    let mut sink = CsvHash {
        w: csv::Writer::from_writer(Vec::new()),
    };
    let opts = RunOptions {
        sink: Some(&mut sink),
        ..RunOptions::default()
    };
    let r: Report = match cancelsim::run::run(s, seed, opts) {
        Ok((r, _)) => r,
        Err(e) => return vec![format!("{name} error {}", digest(e.to_string().as_bytes()))],
    };
    let csv = sink.w.into_inner().expect("an in-memory writer");
    let mut v = serde_json::to_value(&r).expect("a report serialises");
    v.as_object_mut().unwrap().remove("commit");
    cancelsim::diff::strip_run_hashes(&mut v);
    let mut lines = vec![
        format!("{name} run_hash {}", &r.run_hash[..16]),
        format!("{name} requests.csv {}", digest(&csv)),
        format!("{name} summary {}", digest(v.to_string().as_bytes())),
    ];
    if by_field {
        for (k, text) in fields(&v) {
            lines.push(format!("{name} {k} {}", digest(text.as_bytes())));
        }
    }
    lines
}

fn expected() -> Vec<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(DATA);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (CANCELSIM_BLESS=1 writes it)", path.display()));
    let lines: Vec<String> = text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(str::to_string)
        .collect();
    assert!(
        lines.len() > 100,
        "{}: {} lines",
        path.display(),
        lines.len()
    );
    lines
}

fn check(whole: bool) {
    let entries = corpus(whole);
    let got: Vec<String> = entries
        .par_iter()
        .map(|(n, s, seed)| answers(n, s, *seed, !n.starts_with("fuzz")))
        .collect::<Vec<_>>()
        .concat();
    if std::env::var_os("CANCELSIM_BLESS").is_some() && whole {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(DATA);
        let head = "# The differential corpus (tests/it/differential.rs): `name key digest`.\n";
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, format!("{head}{}\n", got.join("\n"))).unwrap();
        return;
    }
    let want = expected();
    let names: std::collections::BTreeSet<&str> =
        entries.iter().map(|(n, _, _)| n.as_str()).collect();
    // Only the entries this check ran: the README's command runs part of the corpus.
    let want: Vec<&String> = want
        .iter()
        .filter(|l| names.contains(l.split(' ').next().unwrap()))
        .collect();
    let entries_in_file: std::collections::BTreeSet<&str> =
        want.iter().map(|l| l.split(' ').next().unwrap()).collect();
    let missing: Vec<&&str> = names
        .iter()
        .filter(|n| !entries_in_file.contains(*n))
        .collect();
    assert!(missing.is_empty(), "not in {DATA}: {missing:?}");
    let mut first = None;
    let mut changed = 0;
    let got_set: std::collections::BTreeSet<&str> = got.iter().map(String::as_str).collect();
    for w in &want {
        if !got_set.contains(w.as_str()) {
            changed += 1;
            let key: Vec<&str> = w.splitn(3, ' ').collect();
            if first.is_none() && key[1] != "run_hash" {
                first = Some(format!("{} {}", key[0], key[1]));
            }
        }
    }
    let run_hash_only = want
        .iter()
        .filter(|w| !got_set.contains(w.as_str()))
        .all(|w| w.split(' ').nth(1) == Some("run_hash"));
    assert!(
        changed == 0 || run_hash_only,
        "{changed} answers differ from {DATA}; the first field: {}. `cancelsim run` it at both \
         commits and `cancelsim diff A B` names the request and the value",
        first.unwrap_or_default()
    );
    assert_eq!(
        changed, 0,
        "only run hashes differ: the event stream changed and no answer did; if that is by \
         design, CANCELSIM_BLESS=1 and a commit that says so"
    );
}

#[test]
fn the_library_and_the_benchmarks_answer_as_before() {
    check(false);
}

#[test]
#[ignore = "the whole corpus: run in release by .ci/run"]
fn the_whole_corpus_answers_as_before() {
    check(true);
}

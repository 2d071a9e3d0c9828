//! Fuzz the readers of user text: the scenario loader (RON and JSON), the sweep loader and
//! `replay`.
//!
//! Inputs are random bytes, and the library's own files mutated byte-wise (truncated, cut,
//! duplicated, flipped) and structurally (a number swapped for an edge value, deep nesting, a
//! multi-megabyte line, another field's name). Each input must give a result or exactly one
//! error line naming its file, without a panic, and allocate at most `PEAK_BYTES_MAX` beyond
//! what was live before it.
//!
//! It runs for `CANCELSIM_FUZZ_S` seconds (default 3; `.ci/run` gives it 60). A long local run:
//! `CANCELSIM_FUZZ_S=600 cargo test --release --test loader_fuzz -- --nocapture`. A failing
//! input is written to the temp directory and named in the failure.

use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use rand_chacha::rand_core::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use cancelsim::replay::Replayer;
use cancelsim::scenario::Scenario;
use cancelsim::sweep::Plan;

/// Counts live and peak heap bytes, so each input's peak can be bounded.
mod counting;
use counting::{LIVE, PEAK};

/// Heap one input may take beyond what was live before it.
const PEAK_BYTES_MAX: usize = 256 << 20;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The library's scenario, sweep and op-log files: the seeds of the mutations.
fn corpus() -> Vec<(Kind, Vec<u8>)> {
    let mut out = Vec::new();
    for (dir, kind) in [
        ("scenarios/library", Kind::Scenario),
        ("scenarios", Kind::Scenario),
        ("scenarios/sweeps", Kind::Sweep),
        ("scenarios/oplogs", Kind::OpLog),
    ] {
        let mut files: Vec<PathBuf> = std::fs::read_dir(repo().join(dir))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.is_file())
            .collect();
        files.sort();
        for f in files {
            let ext = f.extension().and_then(|e| e.to_str()).unwrap_or("");
            let fits = match kind {
                Kind::OpLog => ext == "jsonl",
                _ => ext == "ron",
            };
            let text = std::fs::read(&f).unwrap();
            let sweep =
                text.starts_with(b"//") && String::from_utf8_lossy(&text).contains("Sweep(");
            let kind = if kind == Kind::Sweep || sweep {
                Kind::Sweep
            } else {
                kind
            };
            if fits && text.len() < 1 << 20 {
                out.push((kind, text));
            }
        }
    }
    // Every scenario again as JSON, the other syntax the scenario loader reads.
    let json: Vec<(Kind, Vec<u8>)> = out
        .iter()
        .filter(|(k, _)| *k == Kind::Scenario)
        .filter_map(|(_, text)| {
            let mut s = Scenario::parse(std::str::from_utf8(text).ok()?, "corpus").ok()?;
            s.base_dir = PathBuf::new();
            Some((Kind::JsonScenario, serde_json::to_vec_pretty(&s).unwrap()))
        })
        .collect();
    assert!(json.len() >= 20, "{} JSON scenarios", json.len());
    out.extend(json);
    // The stage graph has no library scenario that runs it yet: two written here.
    for graph in [TOPOLOGY_COLOCATED, TOPOLOGY_1P1D] {
        out.push((
            Kind::Scenario,
            format!("{SCENARIO_HEAD}{graph}\n    ),\n)\n").into_bytes(),
        ));
    }
    assert!(
        out.len() >= 20,
        "the corpus is the library: {} files",
        out.len()
    );
    out
}

const SCENARIO_HEAD: &str = r#"Scenario(
    name: "graph",
    workload: (source: Poisson(rate_per_s: 20.0, requests: 30)),
    cluster: (
        replicas: 2,
        profile: Named("llama-3.1-8b-h100"),
        scheduler: Continuous(),
        topology: "#;

const TOPOLOGY_COLOCATED: &str = include_str!("fixtures/graph-colocated.ron");

const TOPOLOGY_1P1D: &str = include_str!("fixtures/graph-1p1d.ron");

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Scenario,
    JsonScenario,
    Sweep,
    OpLog,
}

/// Tokens a mutation may insert: edge numbers, nesting, names, junk.
fn token(r: &mut ChaCha8Rng) -> Vec<u8> {
    const WORDS: [&str; 24] = [
        "1e308",
        "-1",
        "NaN",
        "inf",
        "-inf",
        "0",
        "18446744073709551616",
        "-9223372036854775809",
        "1e-320",
        "0.0000001",
        "4294967296",
        "\"\"",
        "\"\\u{0}\"",
        "Some(",
        ")",
        "[",
        "]",
        ",",
        "requests:",
        "seed:",
        "policies: [],",
        "Poisson(rate_per_s: 1e9, requests: 1000000000)",
        "\u{feff}",
        "r#\"",
    ];
    match r.next_u32() % 10 {
        0 => b"(".repeat(1 + (r.next_u32() % 20_000) as usize),
        1 => b"[".repeat(1 + (r.next_u32() % 20_000) as usize),
        2 => vec![b'a'; 1 + (r.next_u32() % (3 << 20)) as usize],
        3 => (0..1 + r.next_u32() % 16)
            .map(|_| r.next_u32() as u8)
            .collect(),
        _ => WORDS[(r.next_u32() as usize) % WORDS.len()]
            .as_bytes()
            .to_vec(),
    }
}

/// One to four mutations of `text`.
fn mutate(r: &mut ChaCha8Rng, mut text: Vec<u8>) -> Vec<u8> {
    for _ in 0..1 + r.next_u32() % 4 {
        let n = text.len();
        let at = if n == 0 {
            0
        } else {
            (r.next_u32() as usize) % (n + 1)
        };
        match r.next_u32() % 6 {
            0 => text.truncate(at),
            1 => {
                let end = (at + (r.next_u32() % 200) as usize).min(n);
                text.drain(at..end);
            }
            2 => {
                let end = (at + (r.next_u32() % 200) as usize).min(n);
                let piece = text[at..end].to_vec();
                text.splice(at..at, piece);
            }
            3 if n > 0 => text[at.min(n - 1)] ^= 1 << (r.next_u32() % 8),
            4 => {
                // A number swapped for an edge value: find the next digit after `at`.
                if let Some(d) = text[at..].iter().position(u8::is_ascii_digit) {
                    let s = at + d;
                    let e = s + text[s..]
                        .iter()
                        .position(|c| !(c.is_ascii_digit() || *c == b'.' || *c == b'e'))
                        .unwrap_or(text.len() - s);
                    let t = token(r);
                    text.splice(s..e, t);
                }
            }
            _ => {
                let t = token(r);
                text.splice(at..at, t);
            }
        }
    }
    text
}

/// Exactly one line naming `shown`, or a result.
fn one_line(kind: Kind, shown: &str, result: Result<(), String>) -> Result<(), String> {
    match result {
        Ok(()) => Ok(()),
        Err(e) if e.contains('\n') => Err(format!("{kind:?}: a multi-line error: {e}")),
        Err(e) if !e.contains(shown) => Err(format!("{kind:?}: the error names no file: {e}")),
        Err(_) => Ok(()),
    }
}

/// Feed one input to its reader; what is wrong with the outcome, if anything.
fn feed(kind: Kind, bytes: &[u8], scratch: &Path) -> Result<(), String> {
    match kind {
        Kind::Scenario => {
            let path = scratch.join("fuzz.ron");
            std::fs::write(&path, bytes).unwrap();
            let r = Scenario::load(&path).map(|_| ()).map_err(|e| e.to_string());
            one_line(kind, "fuzz.ron", r)
        }
        Kind::JsonScenario => {
            let path = scratch.join("fuzz.json");
            std::fs::write(&path, bytes).unwrap();
            let r = Scenario::load(&path).map(|_| ()).map_err(|e| e.to_string());
            one_line(kind, "fuzz.json", r)
        }
        Kind::Sweep => {
            let path = scratch.join("fuzz-sweep.ron");
            std::fs::write(&path, bytes).unwrap();
            let r = Plan::load(&path).map(|_| ());
            one_line(kind, "fuzz-sweep.ron", r)
        }
        Kind::OpLog => {
            let mut out = Vec::new();
            cancelsim::replay::replay(bytes, &mut out).map_err(|e| format!("{e:?}"))?;
            let lines = out.iter().filter(|&&b| b == b'\n').count();
            let expected = bytes.split(|&b| b == b'\n').count()
                - usize::from(bytes.is_empty() || bytes.ends_with(b"\n"));
            if lines != expected {
                return Err(format!("{lines} result lines for {expected} op lines"));
            }
            let mut r = Replayer::default();
            for l in String::from_utf8_lossy(bytes).lines().take(50) {
                let one = r.line(l);
                if one.contains('\n') {
                    return Err(format!("a multi-line result: {one}"));
                }
            }
            Ok(())
        }
    }
}

#[test]
fn loaders_give_a_result_or_one_error_line_without_panics_in_bounded_memory() {
    let budget_s: u64 = std::env::var("CANCELSIM_FUZZ_S")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let scratch =
        std::env::temp_dir().join(format!("cancelsim-loader-fuzz-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).unwrap();
    // Sweeps name their base scenario next to them.
    std::fs::copy(
        repo().join("scenarios/sweeps/tiny-storm.ron"),
        scratch.join("tiny-storm.ron"),
    )
    .unwrap();
    let corpus = corpus();
    let until = Instant::now() + Duration::from_secs(budget_s);
    let mut n = 0u64;
    while Instant::now() < until {
        let mut r = ChaCha8Rng::seed_from_u64(n);
        let (kind, input) = if r.next_u32() % 8 == 0 {
            let kinds = [Kind::Scenario, Kind::JsonScenario, Kind::Sweep, Kind::OpLog];
            let kind = kinds[(r.next_u32() % 4) as usize];
            let len = (r.next_u32() % 4096) as usize;
            (kind, (0..len).map(|_| r.next_u32() as u8).collect())
        } else {
            let (kind, text) = &corpus[(r.next_u32() as usize) % corpus.len()];
            (*kind, mutate(&mut r, text.clone()))
        };
        let before = LIVE.load(Ordering::Relaxed);
        PEAK.store(before, Ordering::Relaxed);
        let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| feed(kind, &input, &scratch)));
        let peak = PEAK.load(Ordering::Relaxed).saturating_sub(before);
        let problem = match outcome {
            Err(_) => Some("panicked".to_string()),
            Ok(Err(e)) => Some(e),
            Ok(Ok(())) if peak > PEAK_BYTES_MAX => Some(format!("allocated {peak} bytes")),
            Ok(Ok(())) => None,
        };
        if let Some(p) = problem {
            let saved = std::env::temp_dir().join(format!("cancelsim-fuzz-input-{n}"));
            std::fs::write(&saved, &input).unwrap();
            panic!("input {n} ({kind:?}, saved to {}): {p}", saved.display());
        }
        n += 1;
    }
    println!("loader fuzz: {n} inputs in {budget_s} s, no failure");
    assert!(n > 0);
    let _ = std::fs::remove_dir_all(&scratch);
}

//! The streak changes how fast, never what: every library scenario, and the storms cut short,
//! give the same report (but its run hashes: coasting, which needs the streak, dispatches fewer
//! events) and the same `requests.csv` with every request
//! stepping one output a token (`RunOptions::no_streak`) as with lazy requests riding their
//! replicas' streaks. Storm targets and requests with client timers ride it too, until their
//! intent asks for their tokens; the counts show that the fast path ran, so a corpus that never
//! took it fails.

use std::path::{Path, PathBuf};

use cancelsim::record::{RequestRow, RequestSink, StreakCounts};
use cancelsim::run::{self, RunOptions};
use cancelsim::scenario::{Scenario, Source};

/// `requests.csv`'s rows, as the run directory would write them.
struct Rows(csv::Writer<Vec<u8>>);

impl RequestSink for Rows {
    fn row(&mut self, row: &RequestRow) {
        self.0.serialize(row).expect("a row serialises");
    }
}

/// The report as JSON, the rows, and the streak's counts over every run of the report.
fn answers(s: &Scenario, no_streak: bool) -> (String, Vec<u8>, StreakCounts) {
    let mut rows = Rows(csv::Writer::from_writer(Vec::new()));
    let opts = RunOptions {
        sink: Some(&mut rows),
        no_streak,
        ..RunOptions::default()
    };
    let (report, extras) = match run::run(s, s.seed, opts) {
        Ok(r) => r,
        Err(e) => return (format!("error: {e}"), Vec::new(), StreakCounts::default()),
    };
    let mut json = serde_json::to_value(&report).expect("a report serialises");
    cancelsim::diff::strip_run_hashes(&mut json);
    let json = json.to_string();
    let counts = extras
        .iter()
        .fold(StreakCounts::default(), |a, e| StreakCounts {
            tokens: a.tokens + e.streak.tokens,
            tokens_at_intent: a.tokens_at_intent + e.streak.tokens_at_intent,
        });
    (json, rows.0.into_inner().expect("in memory"), counts)
}

/// The same answers both ways; the streak's counts with it.
fn same_both_ways(name: &str, s: &Scenario) -> StreakCounts {
    let (json, csv, counts) = answers(s, false);
    let (json_off, csv_off, off) = answers(s, true);
    assert_eq!(
        off,
        StreakCounts::default(),
        "{name}: no streak, yet tokens rode one"
    );
    assert!(!json.starts_with("error"), "{name}: {json}");
    assert_eq!(json, json_off, "{name}: the report changed with the streak");
    assert!(
        csv == csv_off,
        "{name}: requests.csv changed with the streak"
    );
    counts
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

#[test]
fn every_library_scenario_answers_the_same_without_the_streak() {
    let mut total = StreakCounts::default();
    for p in &crate::library::files() {
        let s = Scenario::load(p).unwrap_or_else(|e| panic!("{e}"));
        let c = same_both_ways(&p.display().to_string(), &s);
        total.tokens += c.tokens;
        total.tokens_at_intent += c.tokens_at_intent;
    }
    assert!(total.tokens > 0, "no library scenario rode a streak");
    assert!(
        total.tokens_at_intent > 0,
        "no intent asked for a lazy request's tokens"
    );
}

#[test]
fn storm_targets_ride_the_streak_until_their_intent_with_the_same_answers() {
    for b in ["bench-storm-1m", "bench-storm-1m-1p1d"] {
        let mut s = Scenario::load(&repo().join(format!("scenarios/{b}.ron"))).unwrap();
        match &mut s.workload.source {
            Source::Poisson { requests, .. } => *requests = 600,
            other => panic!("{b}: a Poisson benchmark, not {other:?}"),
        }
        let c = same_both_ways(b, &s);
        assert!(c.tokens > 0, "{b}: no token rode a streak");
        assert!(
            c.tokens_at_intent > 0,
            "{b}: no target was lazy at its intent"
        );
    }
}

/// A fleet of 1,000 alike replicas coasts through ticks that other coasts and events share:
/// where each coast stops is in the run hash (its wake-up is an event), so a coasts' tick map
/// that holds a tick too long or lets it go too soon moves it. Pinned to the hash 9f6038a gave;
/// change it only in a commit that says why coasting changed (a tick map that lost live ticks,
/// tried in 066f6f2's sweeps, gave `0f0decfbd218…`).
#[test]
fn a_fleet_of_alike_replicas_coasts_to_the_same_run_hash() {
    let mut s = Scenario::load(&repo().join("scenarios/bench-fleet-day.ron")).unwrap();
    match &mut s.workload.source {
        Source::Poisson { requests, .. } => *requests = 3000,
        other => panic!("a Poisson benchmark, not {other:?}"),
    }
    let (report, _) = run::run(&s, s.seed, RunOptions::default()).expect("the fleet runs");
    assert_eq!(
        report.run_hash,
        "bcca18d6eaabf0e9b17183e486122a4f1a19a99a07e5d51e54bd1d297f9e7ab9"
    );
}

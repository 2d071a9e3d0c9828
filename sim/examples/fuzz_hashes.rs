//! Prints `tier seed run_hash summary_hash answers_hash` (or the run's error) for the fuzzer's
//! drawn scenarios: the corpus of a differential check. `summary_hash` is the BLAKE3 of the
//! whole report as `summary.json` holds it, less the commit it was built from, so a summary
//! field that changes while the event stream does not still shows; `answers_hash` the same
//! less every run hash in it, for a change of the event stream by design (coasting). Build it at two commits and `diff` the
//! outputs; a refactor that claims "hashes unchanged" must print the same lines.
//!
//!     cargo run --release --example fuzz_hashes -- SMALL_SEEDS BIG_SEEDS > hashes.txt
//!
//! Run it from the repository root.

use cancelsim::check::fuzz::{self, Tier};
use rayon::prelude::*;

fn line(tier: Tier, seed: u64) -> String {
    // As `check --fuzz` does: trace paths resolve under `scenarios/`.
    let base = std::path::PathBuf::from("scenarios");
    let s = fuzz::scenario(seed, tier, base);
    match cancelsim::run::report(&s, seed) {
        Ok(mut r) => {
            r.commit.clear();
            let json = serde_json::to_string(&r).expect("a report serialises");
            let summary = blake3::hash(json.as_bytes()).to_hex();
            let mut v = serde_json::to_value(&r).expect("a report serialises");
            cancelsim::diff::strip_run_hashes(&mut v);
            let answers = blake3::hash(v.to_string().as_bytes()).to_hex();
            format!("{tier:?} {seed} {} {summary} {answers}", r.run_hash)
        }
        Err(e) => format!("{tier:?} {seed} error: {e}"),
    }
}

fn main() {
    let arg = |i: usize, default: u64| {
        std::env::args()
            .nth(i)
            .map_or(default, |a| a.parse().expect("a seed count"))
    };
    let (small, big) = (arg(1, 300), arg(2, 10));
    let mut jobs: Vec<(Tier, u64)> = (1..=small).map(|s| (Tier::Small, s)).collect();
    jobs.extend((1..=big).map(|s| (Tier::Big, s)));
    let lines: Vec<String> = jobs.par_iter().map(|&(t, s)| line(t, s)).collect();
    for l in lines {
        println!("{l}");
    }
}

//! Time to recover from a storm in time (`cancellation.window_s`): how long after the storm's
//! start admission latency (arrival to the first step dispatched) went back to its level before
//! the storm.
//!
//! - Requests are binned by arrival second; a bin's value is the mean admission latency of the
//!   requests that arrived in it and were admitted. A request that failed before admission
//!   without a cancel of its own (its engine was killed) counts with its wait until it failed;
//!   one cancelled before admission does not count.
//! - The level is the mean over every request that arrived before the storm's start; the normal
//!   range is up to the worst pre-storm bin.
//! - A bin is degraded if its mean exceeds the threshold: the worst pre-storm bin + 10 %, and at
//!   least the level + 1 ms (so a near-zero level does not flag noise).
//! - Recovery is the start of the first run of 5 bins with arrivals, none degraded, after the
//!   first degraded bin from the storm's start on. The time to recover runs from the storm's
//!   start to there: 0 if no bin was degraded; if no such run came before the arrivals ended, it
//!   is not recovered, and the time runs to the end of the last bin.

use std::collections::BTreeMap;

use crate::metrics::Recovery;

const BIN_NS: u64 = 1_000_000_000;
const TOLERANCE: f64 = 0.10;
const FLOOR_NS: f64 = 1e6;
/// Bins in a row back in the normal range that make a recovery.
const SUSTAIN_BINS: usize = 5;

pub(crate) struct Recover {
    /// The storm's window, in ns.
    window_ns: Option<(u64, u64)>,
    /// Before the storm, by arrival bin: (sum of admission latencies in ns, requests).
    before: BTreeMap<u64, (u128, u64)>,
    /// From the storm's start on, by arrival bin.
    bins: BTreeMap<u64, (u128, u64)>,
}

impl Recover {
    pub fn new(window_s: Option<(f64, f64)>) -> Recover {
        Recover {
            window_ns: window_s.map(|(a, b)| ((a * 1e9) as u64, (b * 1e9) as u64)),
            before: BTreeMap::new(),
            bins: BTreeMap::new(),
        }
    }

    /// A request that arrived at `arrival_ns` was admitted now.
    pub fn admitted(&mut self, arrival_ns: u64, now_ns: u64) {
        assert!(now_ns >= arrival_ns, "a request admitted before it arrived");
        let Some((from_ns, _)) = self.window_ns else {
            return;
        };
        let wait = (now_ns - arrival_ns) as u128;
        let bins = match arrival_ns < from_ns {
            true => &mut self.before,
            false => &mut self.bins,
        };
        let slot = bins.entry(arrival_ns / BIN_NS).or_default();
        slot.0 += wait;
        slot.1 += 1;
    }

    /// (arrival second, mean admission latency ms) of every bin, before the storm and after,
    /// in order: what the recovery plot draws.
    pub fn bins_ms(&self) -> Vec<(f64, f64)> {
        let mean = |&(sum, n): &(u128, u64)| sum as f64 / n as f64 / 1e6;
        let all = self.before.iter().chain(&self.bins);
        all.map(|(&b, v)| ((b * BIN_NS) as f64 / 1e9, mean(v)))
            .collect()
    }

    pub fn summary(&self) -> Option<Recovery> {
        let (from_ns, to_ns) = self.window_ns?;
        let mean = |&(sum, n): &(u128, u64)| sum as f64 / n as f64;
        let (sum, n) = self
            .before
            .values()
            .fold((0u128, 0u64), |(s, n), &(a, b)| (s + a, n + b));
        let level_ns = if n == 0 { 0.0 } else { sum as f64 / n as f64 };
        let normal_ns = self.before.values().map(mean).fold(0.0, f64::max);
        let threshold_ns = (normal_ns * (1.0 + TOLERANCE)).max(level_ns + FLOOR_NS);
        let bins: Vec<(u64, bool)> = self
            .bins
            .iter()
            .map(|(&b, v)| (b, mean(v) > threshold_ns))
            .collect();
        let worst_ns = self.bins.values().map(mean).fold(0.0, f64::max);
        let first_bad = bins.iter().position(|&(_, bad)| bad);
        let back = first_bad.and_then(|i| {
            (i + 1..bins.len())
                .find(|&j| bins[j..].iter().take(SUSTAIN_BINS).all(|&(_, bad)| !bad))
                .filter(|&j| bins.len() - j >= SUSTAIN_BINS)
        });
        let (recovered, until_ns) = match (first_bad, back) {
            (None, _) => (true, from_ns),
            (Some(_), Some(j)) => (true, bins[j].0 * BIN_NS),
            (Some(_), None) => (false, (bins[bins.len() - 1].0 + 1) * BIN_NS),
        };
        Some(Recovery {
            storm_from_s: from_ns as f64 / 1e9,
            storm_to_s: to_ns as f64 / 1e9,
            level_ms: level_ns / 1e6,
            threshold_ms: threshold_ns / 1e6,
            worst_bin_ms: worst_ns / 1e6,
            recovered,
            time_to_recover_s: until_ns.saturating_sub(from_ns) as f64 / 1e9,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = BIN_NS;

    fn admit(r: &mut Recover, t: u64, wait_ms: u64) {
        r.admitted(t * S, t * S + wait_ms * 1_000_000);
    }

    #[test]
    #[should_panic(expected = "admitted before it arrived")]
    fn admitted_before_arrival() {
        Recover::new(None).admitted(5, 4);
    }

    #[test]
    fn recovery_is_the_start_of_five_normal_bins_after_the_first_degraded_one() {
        let mut r = Recover::new(Some((10.0, 12.0)));
        for t in 0..10 {
            admit(&mut r, t, 10 + t % 2 * 10); // level 15 ms, normal up to 20 ms
        }
        admit(&mut r, 10, 21); // within 22 ms: not degraded
        admit(&mut r, 11, 500);
        admit(&mut r, 12, 30);
        admit(&mut r, 13, 20);
        admit(&mut r, 14, 40); // breaks the run that began at 13
        for t in 15..20 {
            admit(&mut r, t, 12);
        }
        admit(&mut r, 30, 90); // late noise after the recovery does not count
        let x = r.summary().unwrap();
        assert!((x.level_ms - 15.0).abs() < 1e-9 && (x.threshold_ms - 22.0).abs() < 1e-9);
        assert!(x.recovered, "{x:?}");
        assert!((x.time_to_recover_s - 5.0).abs() < 1e-9, "{x:?}");
        assert!((x.worst_bin_ms - 500.0).abs() < 1e-9);
    }

    #[test]
    fn no_five_normal_bins_before_the_end_is_not_recovered() {
        let mut r = Recover::new(Some((2.0, 3.0)));
        admit(&mut r, 0, 10);
        admit(&mut r, 2, 100);
        for t in 3..6 {
            admit(&mut r, t, 10);
        }
        let x = r.summary().unwrap();
        assert!(
            !x.recovered && (x.time_to_recover_s - 4.0).abs() < 1e-9,
            "{x:?}"
        );
    }

    #[test]
    fn no_degraded_bin_is_an_immediate_recovery_and_no_window_no_summary() {
        let mut r = Recover::new(Some((1.0, 2.0)));
        r.admitted(0, 100);
        r.admitted(S, S + 900_000); // under the 1 ms floor
        let x = r.summary().unwrap();
        assert!(x.recovered && x.time_to_recover_s == 0.0, "{x:?}");
        assert!(Recover::new(None).summary().is_none());
    }
}

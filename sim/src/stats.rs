//! The statistics behind a run's figures: a latency's streaming accumulator (exact quantiles up
//! to a bound, a histogram past it, batch-means intervals), nearest-rank quantiles and the one
//! Student t quantile of the project. It depends on nothing of the summary's.

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::kernel::{NS_PER_MS, NS_PER_S};

/// Quantiles of a latency, in milliseconds.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LatencyMs {
    pub count: u64,
    pub mean: f64,
    /// Half-width of a 95 % confidence interval on the mean, by batch means over completion
    /// order (NaN with too few samples).
    pub mean_ci95: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
}

/// Values kept for exact quantiles, per statistic (2 MB of `u64`s at most each); past this, the
/// 3-significant-digit histogram answers (within 0.1 %).
pub const EXACT_MAX: usize = 1 << 18;

/// Number of batches for batch-means confidence intervals.
const BATCHES: usize = 32;

/// Running statistics of one latency. Batch k holds completions k·B .. (k+1)·B−1, where B doubles
/// (merging batches pairwise) whenever the batches fill, so the batch count stays bounded without
/// knowing the run length.
pub struct LatencyStats {
    /// Every value, while there are at most `EXACT_MAX`: quantiles are then exact.
    exact: Option<Vec<u64>>,
    /// Beyond that, quantiles come from here (3 significant digits).
    hist: Histogram<u64>,
    pub sum_ns: u128,
    pub count: u64,
    batch_sum_ns: [u128; BATCHES],
    batch_len: u64,
    filled: usize,
    current_n: u64,
}

impl Default for LatencyStats {
    fn default() -> Self {
        Self::new()
    }
}

impl LatencyStats {
    pub fn new() -> Self {
        LatencyStats {
            exact: Some(Vec::new()),
            hist: Histogram::new_with_bounds(1, 10_000_000 * NS_PER_S, 3).expect("valid bounds"),
            sum_ns: 0,
            count: 0,
            batch_sum_ns: [0; BATCHES],
            batch_len: 1,
            filled: 0,
            current_n: 0,
        }
    }

    pub fn record(&mut self, value_ns: u64) {
        self.hist.saturating_record(value_ns.max(1));
        if let Some(v) = &mut self.exact {
            match v.len() < EXACT_MAX {
                true => v.push(value_ns),
                false => self.exact = None,
            }
        }
        self.sum_ns += value_ns as u128;
        self.count += 1;
        self.batch_sum_ns[self.filled] += value_ns as u128;
        self.current_n += 1;
        if self.current_n == self.batch_len {
            self.filled += 1;
            self.current_n = 0;
            if self.filled == BATCHES {
                for k in 0..BATCHES / 2 {
                    self.batch_sum_ns[k] = self.batch_sum_ns[2 * k] + self.batch_sum_ns[2 * k + 1];
                }
                self.batch_sum_ns[BATCHES / 2..].fill(0);
                self.filled = BATCHES / 2;
                self.batch_len *= 2;
            }
        }
    }

    /// `points` + 1 points (value ms, cumulative fraction) of the distribution, from 0 to 1.
    pub fn cdf_ms(&self, points: u32) -> Vec<(f64, f64)> {
        if self.count == 0 {
            return Vec::new();
        }
        let sorted = self.sorted();
        (0..=points)
            .map(|i| {
                let q = i as f64 / points as f64;
                (
                    self.quantile_ns(sorted.as_deref(), q) as f64 / NS_PER_MS as f64,
                    q,
                )
            })
            .collect()
    }

    /// The values in order, if every one was kept.
    fn sorted(&self) -> Option<Vec<u64>> {
        let mut v = self.exact.clone()?;
        v.sort_unstable();
        Some(v)
    }

    /// Quantile `q`: nearest rank over every value if kept, else the histogram's.
    fn quantile_ns(&self, sorted: Option<&[u64]>, q: f64) -> u64 {
        match sorted {
            Some(xs) if !xs.is_empty() => xs[nearest_rank(q, xs.len()) - 1],
            _ => self.hist.value_at_quantile(q),
        }
    }

    /// `quantile_ns` of each of `qs`, with no sort: each value kept at its rank is the one a
    /// sort would put there, found by selection (linear, where the sort of 20,000 values was a
    /// few percent of a run).
    fn quantiles_ns<const N: usize>(&self, qs: [f64; N]) -> [u64; N] {
        let mut kept = self.exact.clone().filter(|xs| !xs.is_empty());
        qs.map(|q| match kept.as_mut() {
            Some(xs) => {
                let at = nearest_rank(q, xs.len()) - 1;
                *xs.select_nth_unstable(at).1
            }
            None => self.hist.value_at_quantile(q),
        })
    }

    pub fn summary(&self) -> LatencyMs {
        let ms = |ns: f64| ns / NS_PER_MS as f64;
        if self.count == 0 {
            return LatencyMs {
                count: 0,
                mean: 0.0,
                mean_ci95: 0.0,
                p50: 0.0,
                p90: 0.0,
                p99: 0.0,
                max: 0.0,
            };
        }
        let mean_ns = self.sum_ns as f64 / self.count as f64;
        let means: Vec<f64> = (0..self.filled)
            .map(|b| self.batch_sum_ns[b] as f64 / self.batch_len as f64)
            .collect();
        let ci95_ns = if means.len() >= 8 {
            let k = means.len() as f64;
            let m = means.iter().sum::<f64>() / k;
            let var = means.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / (k - 1.0);
            t95(means.len() - 1) * (var / k).sqrt()
        } else {
            f64::NAN
        };
        let [p50, p90, p99, max] = self
            .quantiles_ns([0.50, 0.90, 0.99, 1.0])
            .map(|ns| ms(ns as f64));
        LatencyMs {
            count: self.count,
            mean: ms(mean_ns),
            mean_ci95: ms(ci95_ns),
            p50,
            p90,
            p99,
            max,
        }
    }
}

/// The 1-based nearest rank of quantile `q` among `len` values.
fn nearest_rank(q: f64, len: usize) -> usize {
    ((q * len as f64).ceil() as usize).clamp(1, len)
}

/// Quantile of a sorted slice (nearest rank).
pub fn quantile_sorted(xs: &[i64], q: f64) -> i64 {
    if xs.is_empty() {
        return 0;
    }
    let rank = ((q * xs.len() as f64).ceil() as usize).clamp(1, xs.len());
    xs[rank - 1]
}

/// Two-sided 95 % Student t quantile with `df` degrees of freedom (NaN for 0): the table up to
/// 30, then the Cornish–Fisher expansion around the normal quantile, within 1e-4 of the exact
/// value from there on. The one t quantile of the project: batch-means intervals and `compare`
/// both use it.
pub fn t95(df: usize) -> f64 {
    const T: [f64; 30] = [
        12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
        2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
        2.052, 2.048, 2.045, 2.042,
    ];
    const Z: f64 = 1.959_963_984_540_054;
    match df {
        0 => f64::NAN,
        1..=30 => T[df - 1],
        _ => {
            let v = df as f64;
            let (z3, z5) = (Z * Z * Z, Z * Z * Z * Z * Z);
            Z + (z3 + Z) / (4.0 * v) + (5.0 * z5 + 16.0 * z3 + 3.0 * Z) / (96.0 * v * v)
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn quantiles_are_exact_and_zero_is_zero_up_to_exact_max() {
        let mut l = LatencyStats::new();
        for v in [0, 0, 45_000_000, 7, 45_000_000] {
            l.record(v);
        }
        let s = l.summary();
        // Nearest rank over 0, 0, 7, 45 ms, 45 ms.
        assert_eq!((s.p50, s.p90, s.max), (7e-6, 45.0, 45.0), "{s:?}");
        let mut z = LatencyStats::new();
        z.record(0);
        assert_eq!(z.summary().p99, 0.0);
        // Past the cap the histogram answers, within its 3 significant digits.
        let mut big = LatencyStats::new();
        for i in 0..EXACT_MAX as u64 + 10 {
            big.record(1_000_000 + i % 1000);
        }
        assert!(big.exact.is_none());
        let p50 = big.summary().p50;
        assert!((p50 - 1.0005).abs() < 0.002, "{p50}");
    }

    use super::*;

    #[test]
    fn selected_quantiles_are_the_sorted_ones() {
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for n in [1, 2, 3, 10, 99, 100, 101, 1000, 4097] {
            let mut l = LatencyStats::new();
            for _ in 0..n {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                l.record(x % 1000); // ties, and many
            }
            let sorted = l.sorted();
            let qs = [0.0, 0.01, 0.5, 0.9, 0.99, 0.999, 1.0];
            let want = qs.map(|q| l.quantile_ns(sorted.as_deref(), q));
            assert_eq!(l.quantiles_ns(qs), want, "{n}");
        }
    }

    #[test]
    fn t95_matches_published_quantiles() {
        // t(0.975, df) from standard tables.
        for (df, t) in [
            (1, 12.706),
            (10, 2.228),
            (30, 2.042),
            (40, 2.021),
            (60, 2.000),
        ] {
            assert!((t95(df) - t).abs() < 6e-4, "df {df}: {} vs {t}", t95(df));
        }
        assert!((t95(120) - 1.980).abs() < 6e-4);
        assert!((t95(1_000_000) - 1.960).abs() < 1e-3);
        assert!(t95(0).is_nan());
        // Monotone down towards the normal quantile.
        assert!((1..200).all(|d| t95(d) > t95(d + 1)));
    }

    #[test]
    fn batch_means_interval_uses_the_t_quantile_of_its_batches() {
        // 16 batches of one sample each: 0, 1, 0, 1, ... (mean 0.5, sample sd 0.5164).
        let mut l = LatencyStats::new();
        for i in 0..16u64 {
            l.record((i % 2) * 1_000_000);
        }
        let s = l.summary();
        let half = t95(15) * (0.516_397_779_494_322_2 / 4.0) * 1.0;
        assert!(
            (s.mean_ci95 - half).abs() < 1e-9,
            "{} vs {half}",
            s.mean_ci95
        );
    }
}

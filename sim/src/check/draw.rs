//! The fuzzer's draws: uniform, with a bias to the edges of each range, so a drawn world hits
//! the boundaries of every field as often as its middle.

use crate::dist::Dist;
use crate::kernel::rng::Stream;

/// Draws, with a bias to the edges of each range.
pub(super) struct Draw {
    pub s: Stream,
}

impl Draw {
    pub fn chance(&mut self, p: f64) -> bool {
        self.s.uniform_open01() < p
    }

    pub fn int(&mut self, lo: u64, hi: u64) -> u64 {
        match self.s.below(8) {
            0 => lo,
            1 => hi,
            _ => lo + self.s.below(hi - lo + 1),
        }
    }

    pub fn real(&mut self, lo: f64, hi: f64) -> f64 {
        match self.s.below(8) {
            0 => lo,
            1 => hi,
            _ => lo + (hi - lo) * self.s.uniform_open01(),
        }
    }

    /// Log-uniform in `[lo, hi]`, `lo > 0`, with the edges.
    pub fn scale(&mut self, lo: f64, hi: f64) -> f64 {
        match self.s.below(8) {
            0 => lo,
            1 => hi,
            _ => lo * libm::exp(libm::log(hi / lo) * self.s.uniform_open01()),
        }
    }

    pub fn pick<T: Clone>(&mut self, xs: &[T]) -> T {
        xs[self.s.below(xs.len() as u64) as usize].clone()
    }

    /// A distribution of non-negative values around `typical`, of every kind.
    pub fn dist(&mut self, typical: f64, sigma_max: f64) -> Dist {
        match self.s.below(5) {
            0 => Dist::Constant(self.real(0.0, 2.0 * typical)),
            1 => Dist::Exponential {
                mean: self.scale(typical * 1e-3 + 1e-9, typical * 2.0 + 1e-9),
            },
            2 => {
                let low = self.real(0.0, typical);
                Dist::Uniform {
                    low,
                    high: low + self.real(0.0, typical),
                }
            }
            3 if self.chance(0.5) => Dist::Gamma {
                mean: self.real(0.0, typical),
                cv: self.real(0.0, (2.0 * sigma_max).min(10.0)),
            },
            3 => Dist::LogNormal {
                median: self.real(0.0, typical),
                sigma: self.real(0.0, sigma_max),
            },
            _ => {
                let n = self.int(1, 5) as usize;
                Dist::Empirical((0..n).map(|_| self.real(0.0, 2.0 * typical)).collect())
            }
        }
    }
}

//! Shrinking: a failing scenario reduced to a minimal one that still fails (tiny worlds first,
//! then one policy, explicit targets, fewest requests, fewest targets), written as RON that
//! `cancelsim run` takes as it is.

use super::swarm::{requests, set_requests};
use crate::dist::Dist;
use crate::kernel::rng::{Purpose, Stream};
use crate::scenario::{Scenario, Source, Stage};

/// The storm targets of `s` among its first `n` requests, as the run would pick them. Lets the
/// shrinker replace a fraction with an explicit list without changing who is cancelled.
fn explicit_targets(s: &Scenario, seed: u64, n: u64) -> Vec<u64> {
    let Some(c) = &s.cancellation else {
        return Vec::new();
    };
    if !c.requests.is_empty() {
        return c.requests.iter().copied().filter(|&i| i < n).collect();
    }
    (0..n)
        .filter(|&id| Stream::new(seed, Purpose::CancelPlan, id).uniform_open01() < c.fraction)
        .collect()
}

/// A shrinking in progress: the smallest failing scenario so far, and the run budget.
struct Shrinker<'a> {
    best: Scenario,
    runs: u32,
    budget: u32,
    fails: &'a dyn Fn(&Scenario) -> bool,
}

impl Shrinker<'_> {
    /// Whether `cand` still fails (within the budget); if so it becomes the best.
    fn try_it(&mut self, cand: Scenario) -> bool {
        if self.runs >= self.budget {
            return false;
        }
        self.runs += 1;
        let failed = cand.validate().is_ok() && (self.fails)(&cand);
        if failed {
            self.best = cand;
        }
        failed
    }

    fn one_policy(&mut self) {
        if self.best.policies.len() <= 1 {
            return;
        }
        for p in self.best.policies.clone() {
            let mut c = self.best.clone();
            c.policies = vec![p.clone()];
            c.properties.sibling_isolation.retain(|l| *l == p.label());
            if self.try_it(c) {
                return;
            }
        }
    }

    /// Tiny worlds first: 1 to 3 requests, every target subset, every stage, the rest of the
    /// variant's parameters unchanged. A bug that needs one target and one sibling is found here
    /// in a few dozen small runs, whatever request of the big run first showed it.
    fn tiny_world(&mut self) -> bool {
        let (Some(_), Some(c)) = (requests(&self.best), self.best.cancellation.clone()) else {
            return false;
        };
        let stages: Vec<Stage> = std::iter::once(c.stage)
            .chain(Stage::LIFECYCLE.iter().copied())
            .collect();
        // The variant's delay, and none: an intent in the very tick a stage is reached is the
        // sharpest race (a chunk made in that tick is still waiting for the writer).
        let delays = [c.delay_ms.clone(), Dist::Constant(0.0)];
        let base = self.best.clone();
        for n in 1..=3u64 {
            for delay in &delays {
                for &stage in &stages {
                    for mask in 1u64..(1 << n) {
                        let mut cand = base.clone();
                        set_requests(&mut cand, n);
                        let cc = cand.cancellation.as_mut().expect("cloned above");
                        cc.stage = stage;
                        cc.delay_ms = delay.clone();
                        cc.requests = (0..n).filter(|i| mask & (1 << i) != 0).collect();
                        if self.try_it(cand) {
                            return true;
                        }
                    }
                }
            }
        }
        false
    }

    /// The storm's fraction replaced by the targets it picked.
    fn explicit(&mut self, seed: u64) {
        let (Some(n), Some(_)) = (requests(&self.best), self.best.cancellation.as_ref()) else {
            return;
        };
        let targets = explicit_targets(&self.best, seed, n);
        if targets.is_empty() {
            return;
        }
        let mut c = self.best.clone();
        if let Some(cc) = &mut c.cancellation {
            cc.requests = targets;
        }
        self.try_it(c);
    }

    /// `best` with only its first `n` requests (and the targets among them); `None` if that
    /// would leave a target list empty.
    fn first(&self, n: u64) -> Option<Scenario> {
        let mut c = self.best.clone();
        set_requests(&mut c, n);
        let had_targets = self
            .best
            .cancellation
            .as_ref()
            .is_some_and(|b| !b.requests.is_empty());
        if let Some(cc) = &mut c.cancellation {
            cc.requests.retain(|&i| i < n);
            if cc.requests.is_empty() && had_targets {
                return None;
            }
        }
        Some(c)
    }

    /// Fewest requests: halve while it fails, then step down.
    fn fewest_requests(&mut self) {
        let Some(mut n) = requests(&self.best) else {
            return;
        };
        while n > 1 {
            let Some(c) = self.first(n / 2) else {
                break;
            };
            if !self.try_it(c) {
                break;
            }
            n /= 2;
        }
        while n > 1 {
            let mut c = self.best.clone();
            set_requests(&mut c, n - 1);
            if let Some(cc) = &mut c.cancellation {
                cc.requests.retain(|&i| i < n - 1);
            }
            if !self.try_it(c) {
                break;
            }
            n -= 1;
        }
    }

    /// Fewest targets: drop them one at a time while it still fails.
    fn fewest_targets(&mut self) {
        let Some(targets) = self.best.cancellation.as_ref().map(|c| c.requests.clone()) else {
            return;
        };
        for t in targets {
            let mut c = self.best.clone();
            if let Some(cc) = &mut c.cancellation {
                cc.requests.retain(|&i| i != t);
                if cc.requests.is_empty() {
                    continue;
                }
            }
            self.try_it(c);
        }
    }
}

/// Shrink a failing scenario: one failing policy, tiny worlds, an explicit target list, fewest
/// requests, then fewest targets. `fails` must be true for `s` itself. At most `budget` runs.
pub fn shrink(s: &Scenario, seed: u64, budget: u32, fails: &dyn Fn(&Scenario) -> bool) -> Scenario {
    let mut best = s.clone();
    best.seed = seed;
    best.swarm = None;
    best.expect.clear();
    best.coverage.clear();
    let mut sh = Shrinker {
        best,
        runs: 0,
        budget,
        fails,
    };
    sh.one_policy();
    if sh.tiny_world() {
        return sh.best;
    }
    sh.explicit(seed);
    sh.fewest_requests();
    sh.fewest_targets();
    sh.best
}

/// A shrunk scenario as RON text: paths made absolute so it runs from anywhere.
pub fn to_ron(s: &Scenario) -> String {
    let mut s = s.clone();
    if let Source::Trace { path, .. } = &mut s.workload.source {
        let abs = s.base_dir.join(&*path);
        *path = abs.canonicalize().unwrap_or(abs).display().to_string();
    }
    let pretty = ron::ser::PrettyConfig::default().struct_names(true);
    let body = ron::ser::to_string_pretty(&s, pretty).expect("scenario serialises");
    format!("// Shrunk by `cancelsim check --swarm`: run it with `cancelsim run <this file>`.\n{body}\n")
}

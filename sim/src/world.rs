//! The world: wires the workload and the server through one closed `Event` enum and one
//! exhaustive `match`.
//!
//! This is the first end-to-end path: open-loop Poisson arrivals into a FIFO server with `slots`
//! parallel slots and drawn service times. Per-request results are folded into histograms and
//! running sums as requests finish, so memory grows with requests in flight, not with requests
//! completed.

use std::collections::VecDeque;

use hdrhistogram::Histogram;

use crate::dist::{ms_to_ns, round_ns, Dist};
use crate::kernel::rng::{Purpose, Stream};
use crate::kernel::{Class, Kernel, LimitError, Traced, NS_PER_MS, NS_PER_S};
use crate::scenario::{Arrivals, Scenario};

/// Every event of a run. Closed: adding a variant forces every `match` to say what it does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// Request `request` arrives.
    Arrival { request: u64 },
    /// Request `request` finishes service; it arrived at `arrival_ns` and started at `start_ns`.
    ServiceDone {
        request: u64,
        arrival_ns: u64,
        start_ns: u64,
    },
}

impl Traced for Event {
    fn kind_code(&self) -> u8 {
        match self {
            Event::Arrival { .. } => 1,
            Event::ServiceDone { .. } => 2,
        }
    }
    fn entity(&self) -> u64 {
        match *self {
            Event::Arrival { request } | Event::ServiceDone { request, .. } => request,
        }
    }
}

/// Number of batches for the batch-means standard error of the mean wait.
const BATCHES: usize = 32;

/// Quantiles of a latency, in milliseconds.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct LatencyMs {
    pub mean: f64,
    /// Half-width of a 95 % confidence interval on the mean, by batch means over request ids.
    pub mean_ci95: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
}

/// Little's law, measured two ways: L as the time average of the number in the system, and
/// λ·W from the arrival rate and the mean time in system.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct LittlesLaw {
    pub lambda_per_s: f64,
    pub mean_in_system: f64,
    pub mean_e2e_s: f64,
    /// |L − λW| / L.
    pub relative_gap: f64,
}

#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct RequestCounts {
    pub scheduled: u64,
    pub completed: u64,
}

/// Everything one run reports.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Summary {
    pub scenario: String,
    pub scenario_hash: String,
    pub seed: u64,
    pub version: String,
    pub requests: RequestCounts,
    pub wait_ms: LatencyMs,
    pub e2e_ms: LatencyMs,
    pub throughput_rps: f64,
    pub utilisation: f64,
    pub littles_law: LittlesLaw,
    pub events: u64,
    pub virtual_time_s: f64,
    pub run_hash: String,
}

#[derive(Debug, Clone, PartialEq)]
pub enum RunError {
    Limit(LimitError),
}

impl std::fmt::Display for RunError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RunError::Limit(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for RunError {}

impl From<LimitError> for RunError {
    fn from(e: LimitError) -> Self {
        RunError::Limit(e)
    }
}

/// Running statistics of one latency.
struct LatencyStats {
    hist: Histogram<u64>,
    sum_ns: u128,
    count: u64,
    batch_sum_ns: [u128; BATCHES],
    batch_count: [u64; BATCHES],
}

impl LatencyStats {
    fn new() -> Self {
        LatencyStats {
            // 1 ns .. 10^7 s at 3 significant figures (0.1 % relative error).
            hist: Histogram::new_with_bounds(1, 10_000_000 * NS_PER_S, 3).expect("valid bounds"),
            sum_ns: 0,
            count: 0,
            batch_sum_ns: [0; BATCHES],
            batch_count: [0; BATCHES],
        }
    }

    fn record(&mut self, value_ns: u64, batch: usize) {
        self.hist.saturating_record(value_ns.max(1));
        self.sum_ns += value_ns as u128;
        self.count += 1;
        self.batch_sum_ns[batch] += value_ns as u128;
        self.batch_count[batch] += 1;
    }

    fn summary(&self) -> LatencyMs {
        let ms = |ns: f64| ns / NS_PER_MS as f64;
        if self.count == 0 {
            return LatencyMs {
                mean: 0.0,
                mean_ci95: 0.0,
                p50: 0.0,
                p90: 0.0,
                p99: 0.0,
                max: 0.0,
            };
        }
        let mean_ns = self.sum_ns as f64 / self.count as f64;
        // Batch means: the batches are contiguous ranges of request ids, so each batch mean
        // averages many consecutive (correlated) requests and the batch means are close to
        // independent. Fixed order, sequential reduction.
        let means: Vec<f64> = (0..BATCHES)
            .filter(|&b| self.batch_count[b] > 0)
            .map(|b| self.batch_sum_ns[b] as f64 / self.batch_count[b] as f64)
            .collect();
        let k = means.len() as f64;
        let ci95_ns = if means.len() > 1 {
            let m = means.iter().sum::<f64>() / k;
            let var = means.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / (k - 1.0);
            // t quantile for 31 degrees of freedom is 2.04; for fewer batches be conservative.
            let t = if means.len() == BATCHES { 2.04 } else { 2.6 };
            t * (var / k).sqrt()
        } else {
            f64::INFINITY
        };
        LatencyMs {
            mean: ms(mean_ns),
            mean_ci95: ms(ci95_ns),
            p50: ms(self.hist.value_at_quantile(0.50) as f64),
            p90: ms(self.hist.value_at_quantile(0.90) as f64),
            p99: ms(self.hist.value_at_quantile(0.99) as f64),
            max: ms(self.hist.max() as f64),
        }
    }
}

/// One run of one scenario.
pub struct World<'s> {
    scenario: &'s Scenario,
    seed: u64,
    kernel: Kernel<Event>,
    arrivals: Stream,
    interarrival_mean_ns: f64,
    slots_free: u32,
    waiting: VecDeque<(u64, u64)>,
    scheduled: u64,
    completed: u64,
    in_system: u64,
    // Time integrals for Little's law and utilisation, in count·ns.
    area_in_system: u128,
    area_busy: u128,
    last_change_ns: u64,
    wait: LatencyStats,
    e2e: LatencyStats,
}

impl<'s> World<'s> {
    pub fn new(scenario: &'s Scenario, seed: u64) -> Self {
        debug_assert!(scenario.validate().is_ok());
        let Arrivals::Poisson { rate_per_s } = scenario.workload.arrivals;
        World {
            scenario,
            seed,
            kernel: Kernel::new(scenario.limits()),
            arrivals: Stream::new(seed, Purpose::Arrival, 0),
            interarrival_mean_ns: NS_PER_S as f64 / rate_per_s,
            slots_free: scenario.server.slots,
            waiting: VecDeque::new(),
            scheduled: 0,
            completed: 0,
            in_system: 0,
            area_in_system: 0,
            area_busy: 0,
            last_change_ns: 0,
            wait: LatencyStats::new(),
            e2e: LatencyStats::new(),
        }
    }

    /// Run to completion and summarise.
    pub fn run(mut self) -> Result<Summary, RunError> {
        self.kernel
            .schedule_at(0, Class::Arrival, Event::Arrival { request: 0 })?;
        while let Some(event) = self.kernel.next_event()? {
            self.dispatch(event)?;
        }
        Ok(self.finish())
    }

    fn dispatch(&mut self, event: Event) -> Result<(), RunError> {
        let now_ns = self.kernel.now_ns();
        match event {
            Event::Arrival { request } => {
                debug_assert_eq!(request, self.scheduled, "arrivals come in id order");
                self.integrate(now_ns);
                self.scheduled += 1;
                self.in_system += 1;
                if self.scheduled < self.scenario.workload.requests {
                    let gap_ns = round_ns(self.arrivals.exponential(self.interarrival_mean_ns));
                    self.kernel.schedule_in(
                        gap_ns,
                        Class::Arrival,
                        Event::Arrival {
                            request: request + 1,
                        },
                    )?;
                }
                if self.slots_free > 0 {
                    self.start_service(request, now_ns)?;
                } else {
                    self.waiting.push_back((request, now_ns));
                }
            }
            Event::ServiceDone {
                request,
                arrival_ns,
                start_ns,
            } => {
                self.integrate(now_ns);
                self.in_system -= 1;
                self.completed += 1;
                self.slots_free += 1;
                let batch = (request as u128 * BATCHES as u128
                    / self.scenario.workload.requests as u128) as usize;
                self.wait.record(start_ns - arrival_ns, batch);
                self.e2e.record(now_ns - arrival_ns, batch);
                if let Some((next, next_arrival_ns)) = self.waiting.pop_front() {
                    self.start_service(next, next_arrival_ns)?;
                }
            }
        }
        debug_assert!(self.slots_free <= self.scenario.server.slots);
        debug_assert_eq!(
            self.in_system,
            self.waiting.len() as u64 + (self.scenario.server.slots - self.slots_free) as u64
        );
        Ok(())
    }

    fn start_service(&mut self, request: u64, arrival_ns: u64) -> Result<(), RunError> {
        assert!(self.slots_free > 0);
        self.slots_free -= 1;
        // The request's own stream: its service time does not depend on anyone else's draws.
        let mut shape = Stream::new(self.seed, Purpose::RequestShape, request);
        let service_ns = ms_to_ns(Dist::sample(&self.scenario.server.service_ms, &mut shape));
        let start_ns = self.kernel.now_ns();
        self.kernel.schedule_in(
            service_ns,
            Class::Completion,
            Event::ServiceDone {
                request,
                arrival_ns,
                start_ns,
            },
        )?;
        Ok(())
    }

    fn integrate(&mut self, now_ns: u64) {
        let dt = (now_ns - self.last_change_ns) as u128;
        self.area_in_system += dt * self.in_system as u128;
        self.area_busy += dt * (self.scenario.server.slots - self.slots_free) as u128;
        self.last_change_ns = now_ns;
    }

    fn finish(mut self) -> Summary {
        let end_ns = self.kernel.now_ns();
        self.integrate(end_ns);
        // Conservation: every request that arrived has left.
        assert_eq!(self.scheduled, self.scenario.workload.requests);
        assert_eq!(self.completed, self.scheduled);
        assert_eq!(self.in_system, 0);
        assert!(self.waiting.is_empty());
        let end_s = end_ns as f64 / NS_PER_S as f64;
        let e2e = self.e2e.summary();
        let lambda_per_s = if end_s > 0.0 {
            self.scheduled as f64 / end_s
        } else {
            0.0
        };
        let mean_in_system = if end_ns > 0 {
            self.area_in_system as f64 / end_ns as f64
        } else {
            0.0
        };
        let mean_e2e_s = self.e2e.sum_ns as f64 / self.e2e.count.max(1) as f64 / NS_PER_S as f64;
        let lw = lambda_per_s * mean_e2e_s;
        Summary {
            scenario: self.scenario.name.clone(),
            scenario_hash: self.scenario.hash(),
            seed: self.seed,
            version: env!("CARGO_PKG_VERSION").to_string(),
            requests: RequestCounts {
                scheduled: self.scheduled,
                completed: self.completed,
            },
            wait_ms: self.wait.summary(),
            e2e_ms: e2e,
            throughput_rps: lambda_per_s,
            utilisation: if end_ns > 0 {
                self.area_busy as f64 / (end_ns as f64 * self.scenario.server.slots as f64)
            } else {
                0.0
            },
            littles_law: LittlesLaw {
                lambda_per_s,
                mean_in_system,
                mean_e2e_s,
                relative_gap: if mean_in_system > 0.0 {
                    (mean_in_system - lw).abs() / mean_in_system
                } else {
                    0.0
                },
            },
            events: self.kernel.events_dispatched(),
            virtual_time_s: end_s,
            run_hash: self.kernel.run_hash(),
        }
    }
}

/// Run `scenario` with `seed`.
pub fn run(scenario: &Scenario, seed: u64) -> Result<Summary, RunError> {
    World::new(scenario, seed).run()
}

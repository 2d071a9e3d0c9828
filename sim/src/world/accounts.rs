//! The run's books: dispositions, latencies, GPU time and KV shares, leaked work by cause,
//! cleanup latencies, Little's law, coverage marks and the outcome hash. Requests are folded in
//! as they leave, so memory does not grow with the run.

use cancelsim_models::ownership::{EvidenceLevel, State};
use cancelsim_models::protocol::{Outcome, ReplicaStats, StepOutput, StepReport};

use super::error::Stop;

use super::cancel::CancelState;
use super::requests::{Cost, Req};
use crate::coverage::{Coverage, Mark};
use crate::metrics::{LeakCauses, LeakedWork, RequestCounts, Targets};
use crate::stats::LatencyStats;

/// Evidence levels whose latency from intent is reported.
pub(crate) const CLEANUP_LEVELS: [EvidenceLevel; 5] = [
    EvidenceLevel::LocalInvalidation,
    EvidenceLevel::CancelSubmission,
    EvidenceLevel::BackendObservation,
    EvidenceLevel::FinalCallback,
    EvidenceLevel::ResourceRelease,
];

/// The books' side of Little's law: requests in the system, and their times in it as they
/// left (λ·W); L is measured apart, from the slab (`World::occupancy`).
#[derive(Clone, Debug, Default)]
pub(crate) struct Little {
    pub in_system: u64,
    pub sojourn_sum_ns: u128,
    pub sojourns: u64,
}

/// GPU time by where it went, in ns (reduced in dispatch order).
#[derive(Clone, Debug, Default)]
pub(crate) struct GpuTime {
    pub token_steps: u64,
    pub requests_ns: f64,
    pub discarded_ns: f64,
    pub padding_ns: f64,
}

pub(crate) struct Accounts {
    pub counts: RequestCounts,
    pub targets: Targets,
    pub little: Little,
    pub ttft: LatencyStats,
    pub tpot: LatencyStats,
    pub e2e: LatencyStats,
    pub gpu: GpuTime,
    pub kv_block_ns: u128,
    pub kv_block_ns_retained: u128,
    pub last_completion_ns: u64,
    /// Leaked work with `gpu_s` and the causes still in ns.
    pub leaked: LeakedWork,
    pub late_output_discards: u64,
    pub cleanup: Vec<LatencyStats>,
    pub cleanup_unknown: [u64; 5],
    /// The same, for requests that had completed: not applicable rather than unknown.
    pub cleanup_not_applicable: [u64; 5],
    pub deadlines_missed: u64,
    pub disconnects: u64,
    pub storm_targets: u64,
    pub coverage: Coverage,
    /// Output tokens and token-steps of the requests that left, for conservation.
    pub tokens_left: u64,
    /// The one token each prefill replica's request samples, which the decode stage samples
    /// again: it never reaches a client.
    pub tokens_prefill: u64,
    /// Tokens generated past a stop string before the frontend's abort stopped the engine.
    pub tokens_overrun: u64,
    /// Those aborts, observed by an engine.
    pub stop_aborts_observed: u64,
    /// Requests whose output ends at a stop string.
    pub stop_requests: u64,
    pub token_steps_left: u64,
    /// Every request's outcome `(id, state, output digest, tokens, chunks played)` in the order
    /// requests leave: folded into the run hash, so two runs whose events coincide but whose
    /// outcomes differ (a killed sibling under a flat step cost) never share a hash.
    outcomes: blake3::Hasher,
}

impl Accounts {
    pub fn new() -> Accounts {
        Accounts {
            counts: RequestCounts::default(),
            targets: Targets::default(),
            little: Little::default(),
            ttft: LatencyStats::new(),
            tpot: LatencyStats::new(),
            e2e: LatencyStats::new(),
            gpu: GpuTime::default(),
            kv_block_ns: 0,
            kv_block_ns_retained: 0,
            last_completion_ns: 0,
            leaked: LeakedWork::default(),
            late_output_discards: 0,
            cleanup: (0..CLEANUP_LEVELS.len())
                .map(|_| LatencyStats::new())
                .collect(),
            cleanup_unknown: [0; 5],
            cleanup_not_applicable: [0; 5],
            deadlines_missed: 0,
            disconnects: 0,
            storm_targets: 0,
            coverage: Coverage::default(),
            tokens_left: 0,
            tokens_prefill: 0,
            tokens_overrun: 0,
            stop_aborts_observed: 0,
            stop_requests: 0,
            token_steps_left: 0,
            outcomes: blake3::Hasher::new(),
        }
    }

    /// A request enters the system.
    pub fn arrived(&mut self) {
        self.little.in_system += 1;
    }

    /// One request's share of a processed step: GPU time split by tokens, and the part after
    /// its intent as leaked work.
    pub fn step_share(
        &mut self,
        cost: &mut Cost,
        cancel: &CancelState,
        o: &StepOutput,
        step: &StepReport,
        now_ns: u64,
    ) {
        let total = step.tokens.max(1) as f64;
        let start_ns = now_ns - step.duration_ns;
        self.gpu.token_steps += o.tokens as u64;
        let share = step.duration_ns as f64 * o.tokens as f64 / total;
        cost.token_steps += o.tokens as u64;
        if let Some(intent_ns) = cancel.intent_ns {
            if now_ns > intent_ns && step.duration_ns > 0 {
                // GPU work after the intent: the part of this step that ran after it.
                let after = now_ns - intent_ns.max(start_ns);
                let leak = share * after as f64 / step.duration_ns as f64;
                self.leaked.token_steps += o.tokens as u64;
                if cancel.observed_ns.is_none() {
                    cost.leak_pre_ns += leak;
                } else {
                    cost.leak_post_ns += leak;
                }
            }
        }
        match o.outcome {
            Outcome::Discarded { .. } => self.gpu.discarded_ns += share,
            Outcome::Padding => self.gpu.padding_ns += share,
            Outcome::Prefill | Outcome::Token { .. } => cost.gpu_ns += share,
        }
    }

    /// A token came out after the request's terminal transition.
    pub fn late_token(&mut self, cost: &mut Cost) {
        self.late_output_discards += 1;
        cost.late_tokens += 1;
    }

    /// A request leaves in `state`: its disposition, latencies and costs are folded in.
    pub fn left(&mut self, q: &Req, state: State, finish_and_discard: bool, now_ns: u64) {
        if q.cancel.plan.is_some() {
            match state {
                // Refused at arrival: finished `Cancelled` in the controller, but never cancelled.
                _ if q.life.rejected => self.targets.rejected += 1,
                State::Completed => self.targets.completed += 1,
                State::Cancelled => self.targets.cancelled += 1,
                State::Expired => self.targets.expired += 1,
                State::Running => {}
            }
        }
        if let (Some(o), Some(r)) = (q.cancel.observed_ns, q.life.released_ns) {
            if r > o {
                self.coverage.hit(Mark::ReleaseAfterFence);
            }
        }
        self.disposition(q, state);
        self.gpu.requests_ns += q.cost.gpu_ns;
        self.tokens_left += q.life.tokens as u64;
        self.token_steps_left += q.cost.token_steps;
        if let Some(intent_ns) = q.cancel.intent_ns {
            self.cancelled_left(q, state, intent_ns, finish_and_discard);
        }
        self.outcomes.update(&q.id.to_le_bytes());
        self.outcomes.update(&[state as u8]);
        self.outcomes.update(&q.chunks.digest.to_le_bytes());
        self.outcomes.update(&q.life.tokens.to_le_bytes());
        self.outcomes.update(&q.chunks.admitted.to_le_bytes());
        self.little.in_system -= 1;
        self.little.sojourn_sum_ns += (now_ns - q.arrival_ns) as u128;
        self.little.sojourns += 1;
    }

    /// Dispositions with their denominators, and latencies of completed requests.
    fn disposition(&mut self, q: &Req, state: State) {
        if q.life.rejected {
            self.counts.rejected += 1;
            return;
        }
        match state {
            State::Completed => self.counts.completed += 1,
            State::Cancelled => self.counts.cancelled += 1,
            State::Expired => self.counts.expired += 1,
            State::Running => unreachable!("finalized while running"),
        }
        if state == State::Completed {
            let l = &q.life;
            self.ttft.record(l.first_token_ns - q.arrival_ns);
            self.e2e.record(l.last_token_ns - q.arrival_ns);
            if q.output > 1 {
                let tpot = (l.last_token_ns - l.first_token_ns) / (q.output as u64 - 1);
                self.tpot.record(tpot);
            }
        }
    }

    /// A request with an intent leaves: cleanup evidence and leaked work by cause.
    fn cancelled_left(&mut self, q: &Req, state: State, intent_ns: u64, fd: bool) {
        let c = &q.cancel;
        // Never observed: the backend still held the request at the intent, and never observed
        // the cancel (its work ran on, and nobody confirmed that it stopped). Cleanup pending:
        // held at the intent and no release confirmed by the time it leaves.
        let held_at_intent = q.life.released_ns.is_none_or(|r| r > intent_ns);
        let held = q.life.enqueued && held_at_intent && state != State::Completed;
        if held && c.observed_ns.is_none() {
            self.counts.never_observed += 1;
        }
        if held && c.evidence(EvidenceLevel::ResourceRelease).is_none() {
            self.counts.cleanup_pending += 1;
        }
        for (i, level) in CLEANUP_LEVELS.iter().enumerate() {
            match c.evidence(*level) {
                None if state == State::Completed => self.cleanup_not_applicable[i] += 1,
                None => self.cleanup_unknown[i] += 1,
                // Evidence from before the intent (killed as someone else's collateral first):
                // the request was already clean when its own intent came.
                Some(at) => self.cleanup[i].record(at.saturating_sub(intent_ns)),
            }
        }
        let (pre, post) = (q.cost.leak_pre_ns, q.cost.leak_post_ns);
        let by = &mut self.leaked.by_cause;
        if fd {
            by.finish_and_discard += pre + post;
        } else if c.fallback && c.observed_ns.is_none() {
            by.finish_and_discard += pre;
            by.in_flight_window += post;
        } else if c.observed_ns.is_some() {
            by.checkpoint_delay += pre;
            by.in_flight_window += post;
        } else {
            by.unobserved_or_lost += pre + post;
        }
        self.leaked.gpu_s += pre + post;
    }

    /// Leaked work in GPU-seconds (the books keep ns).
    pub fn leaked_s(&self) -> LeakedWork {
        let s = |ns: f64| ns / crate::kernel::NS_PER_S as f64;
        let by = &self.leaked.by_cause;
        LeakedWork {
            token_steps: self.leaked.token_steps,
            gpu_s: s(self.leaked.gpu_s),
            by_cause: LeakCauses {
                in_flight_window: s(by.in_flight_window),
                checkpoint_delay: s(by.checkpoint_delay),
                unobserved_or_lost: s(by.unobserved_or_lost),
                finish_and_discard: s(by.finish_and_discard),
            },
        }
    }

    /// Conservation at the end of a run (invariant 5): every output token a replica delivered
    /// reached its request (which then played it or discarded it as late), every token-step was
    /// shared to a request, and GPU time split into requests', discarded and padding work adds
    /// up to the replicas' busy time.
    pub fn conserved(&self, replicas: &ReplicaStats) -> Result<(), Stop> {
        let received = self.tokens_left + self.tokens_prefill + self.tokens_overrun;
        if received != replicas.tokens_delivered {
            let what = format!(
                "tokens not conserved: replicas delivered {}, requests received {} (and {} \
                 prefill tokens)",
                replicas.tokens_delivered, self.tokens_left, self.tokens_prefill
            );
            return Err(Stop::broken(vec![], what));
        }
        if self.token_steps_left != self.gpu.token_steps {
            let what = format!(
                "token-steps not conserved: steps computed {}, requests were charged {}",
                self.gpu.token_steps, self.token_steps_left
            );
            return Err(Stop::broken(vec![], what));
        }
        let g = &self.gpu;
        let shared_ns = g.requests_ns + g.discarded_ns + g.padding_ns;
        let busy_ns = replicas.busy_ns as f64;
        if (shared_ns - busy_ns).abs() > 1e-9 * busy_ns + 1.0 {
            let what = format!("GPU time not conserved: busy {busy_ns} ns, shared {shared_ns} ns");
            return Err(Stop::broken(vec![], what));
        }
        Ok(())
    }

    pub fn outcome_hash(&self) -> blake3::Hash {
        self.outcomes.finalize()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conservation_catches_a_lost_token_a_lost_token_step_and_lost_gpu_time() {
        let mut a = Accounts::new();
        a.tokens_left = 10;
        a.gpu.token_steps = 40;
        a.token_steps_left = 40;
        a.gpu.requests_ns = 900.0;
        a.gpu.discarded_ns = 100.0;
        let mut r = ReplicaStats {
            tokens_delivered: 10,
            busy_ns: 1000,
            ..ReplicaStats::default()
        };
        assert_eq!(a.conserved(&r), Ok(()));
        r.tokens_delivered = 11;
        assert!(matches!(a.conserved(&r), Err(Stop::Broken { .. })));
        r.tokens_delivered = 10;
        a.token_steps_left = 39;
        assert!(a.conserved(&r).is_err());
        a.token_steps_left = 40;
        r.busy_ns = 1_100;
        assert!(a.conserved(&r).is_err());
    }
}

//! The run's books: dispositions, latencies, GPU time and KV shares, leaked work by cause,
//! cleanup latencies, Little's law, coverage marks and the outcome hash. Requests are folded in
//! as they leave, so memory does not grow with the run.

use cancelsim_models::ownership::{EvidenceLevel, State};
use cancelsim_models::protocol::{Outcome, ReplicaStats, StepOutput, StepReport};

use super::digest::{Outcomes, Run, OUTCOME_LEN};
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

/// The books' figures. Read through `Accounts::tally`; written only by `Accounts`.
pub(crate) struct Tally {
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
}

impl Tally {
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
}

/// The books, changed only through their named transitions.
pub(crate) struct Accounts {
    t: Tally,
    /// Every request's outcome `(id, state, output digest, tokens, chunks played)` in the order
    /// requests leave: folded into the run hash, so two runs whose events coincide but whose
    /// outcomes differ (a killed sibling under a flat step cost) never share a hash.
    outcomes: Outcomes,
}

impl Accounts {
    pub fn new() -> Accounts {
        Accounts {
            t: Tally {
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
            },
            outcomes: Outcomes::default(),
        }
    }

    /// The figures, read-only.
    pub fn tally(&self) -> &Tally {
        &self.t
    }

    /// A request enters the system: a storm's target or not, ending at a stop string or not.
    pub fn arrived(&mut self, storm_target: bool, stop_string: bool) {
        self.t.counts.scheduled += 1;
        self.t.storm_targets += storm_target as u64;
        self.t.stop_requests += stop_string as u64;
        self.t.little.in_system += 1;
    }

    /// Into a replica's queue (once per request).
    pub fn admitted(&mut self) {
        let c = &mut self.t.counts;
        assert!(
            c.admitted < c.scheduled,
            "more requests admitted than arrived"
        );
        c.admitted += 1;
    }

    /// In a replica's step for the first time.
    pub fn started(&mut self) {
        let c = &mut self.t.counts;
        assert!(
            c.started < c.admitted,
            "more requests started than were admitted"
        );
        c.started += 1;
    }

    /// A client's timer fired on a request still in progress: its deadline, or a disconnect.
    pub fn timer(&mut self, deadline: bool) {
        let t = &mut self.t;
        assert!(
            t.deadlines_missed + t.disconnects < t.counts.scheduled,
            "more client timers fired than requests arrived"
        );
        match deadline {
            true => t.deadlines_missed += 1,
            false => t.disconnects += 1,
        }
    }

    /// An engine observed the frontend's abort after a stop string.
    pub fn stop_abort_observed(&mut self) {
        let t = &mut self.t;
        assert!(
            t.stop_aborts_observed < t.stop_requests,
            "more stop-string aborts observed than requests that end at one"
        );
        t.stop_aborts_observed += 1;
    }

    /// A token generated past a stop string.
    pub fn token_overrun(&mut self) {
        assert!(
            self.t.stop_requests > 0,
            "a token past a stop string no request has"
        );
        self.t.tokens_overrun += 1;
    }

    /// The one token a prefill replica samples for a request (the decode stage samples it again).
    pub fn prefill_token(&mut self) {
        let t = &mut self.t;
        assert!(
            t.tokens_prefill < t.counts.admitted,
            "more prefill tokens than requests admitted"
        );
        t.tokens_prefill += 1;
    }

    /// A request's blocks came back: `block_ns` held in all, `retained_ns` of it after a cancel.
    pub fn released(&mut self, cost: &mut Cost, block_ns: u128, retained_ns: u128) {
        assert!(
            retained_ns <= block_ns,
            "more block-time retained than held"
        );
        self.t.kv_block_ns += block_ns;
        self.t.kv_block_ns_retained += retained_ns;
        cost.released(block_ns);
    }

    /// A request's last output token came out at `now_ns`.
    pub fn completion_at(&mut self, now_ns: u64) {
        assert!(
            now_ns >= self.t.last_completion_ns,
            "a completion went back in time"
        );
        self.t.last_completion_ns = now_ns;
    }

    /// Requests whose blocks no lease returned by the end of the run.
    pub fn cleanups_pending(&mut self, n: u64) {
        assert!(
            n <= self.t.counts.scheduled,
            "more cleanups pending than requests"
        );
        self.t.counts.cleanup_pending += n;
    }

    /// A coverage mark was hit (`n` times).
    pub fn hit(&mut self, mark: Mark) {
        self.t.coverage.hit(mark);
    }

    pub fn hit_n(&mut self, mark: Mark, n: u64) {
        self.t.coverage.add(mark, n);
    }

    /// One request's share of a processed step: GPU time split by tokens, and the part after
    /// its intent as leaked work.
    #[inline(always)]
    pub fn step_share(
        &mut self,
        cost: &mut Cost,
        cancel: &CancelState,
        o: &StepOutput,
        s: &Shares,
    ) {
        self.t.gpu.token_steps += o.tokens as u64;
        let share = s.duration_f * o.tokens as f64 / s.total_f;
        if let Some(intent_ns) = cancel.intent_ns() {
            if s.end_ns > intent_ns && s.duration_ns > 0 {
                // GPU work after the intent: the part of this step that ran after it.
                let after = s.end_ns - intent_ns.max(s.end_ns - s.duration_ns);
                let leak = share * after as f64 / s.duration_f;
                self.t.leaked.token_steps += o.tokens as u64;
                cost.leak(leak, cancel.observed_ns().is_some());
            }
        }
        // Adding 0 leaves a request's GPU time bit for bit as it was.
        let own_ns = match o.outcome {
            Outcome::Discarded { .. } => {
                self.t.gpu.discarded_ns += share;
                0.0
            }
            Outcome::Padding => {
                self.t.gpu.padding_ns += share;
                0.0
            }
            Outcome::Prefill | Outcome::Token { .. } => share,
        };
        cost.stepped(o.tokens, own_ns);
    }

    /// A lazy request's `tokens` that came out in streak steps with no output each
    /// (`lazy.rs`): `step_share`'s count of token-steps (the request's own shares go to its
    /// cost, `Cost::stepped_each`).
    #[inline]
    pub fn implicit_tokens(&mut self, tokens: u32) {
        self.t.gpu.token_steps += tokens as u64;
    }

    /// A token came out after the request's terminal transition.
    pub fn late_token(&mut self, cost: &mut Cost) {
        self.t.late_output_discards += 1;
        cost.late_token();
    }

    /// A request leaves in `state`: its disposition, latencies and costs are folded in, and its
    /// outcome, with its output `digest` if it was read already, is held to be hashed.
    pub fn left(
        &mut self,
        q: &Req,
        state: State,
        finish_and_discard: bool,
        now_ns: u64,
        digest: Option<u64>,
    ) {
        assert!(
            self.t.little.in_system > 0,
            "a request left that never arrived"
        );
        assert!(now_ns >= q.arrival_ns, "a request left before it arrived");
        if q.cancel().plan().is_some() {
            match state {
                // Refused at arrival: finished `Cancelled` in the controller, but never cancelled.
                _ if q.life.rejected() => self.t.targets.rejected += 1,
                State::Completed => self.t.targets.completed += 1,
                State::Cancelled => self.t.targets.cancelled += 1,
                State::Expired => self.t.targets.expired += 1,
                State::Running => {}
            }
        }
        if let (Some(o), Some(r)) = (q.cancel().observed_ns(), q.life.released_ns()) {
            if r > o {
                self.t.coverage.hit(Mark::ReleaseAfterFence);
            }
        }
        self.disposition(q, state);
        self.t.gpu.requests_ns += q.cost.gpu_ns();
        self.t.tokens_left += q.life.tokens() as u64;
        self.t.token_steps_left += q.cost.token_steps();
        if let Some(intent_ns) = q.cancel().intent_ns() {
            self.cancelled_left(q, state, intent_ns, finish_and_discard);
        }
        let mut outcome = [0u8; OUTCOME_LEN];
        outcome[..8].copy_from_slice(&q.id.to_le_bytes());
        outcome[8] = state as u8;
        // The output digest's bytes (`OUTCOME_DIGEST`) come when it is folded.
        outcome[17..21].copy_from_slice(&q.life.tokens().to_le_bytes());
        outcome[21..].copy_from_slice(&q.chunks.admitted().to_le_bytes());
        let digest = match digest {
            Some(h) => Run::folded(h),
            None => q.chunks.digest_run(q.id),
        };
        self.outcomes.push(outcome, digest);
        self.t.little.in_system -= 1;
        self.t.little.sojourn_sum_ns += (now_ns - q.arrival_ns) as u128;
        self.t.little.sojourns += 1;
    }

    /// Dispositions with their denominators, and latencies of completed requests.
    fn disposition(&mut self, q: &Req, state: State) {
        if q.life.rejected() {
            self.t.counts.rejected += 1;
            return;
        }
        match state {
            State::Completed => self.t.counts.completed += 1,
            State::Cancelled => self.t.counts.cancelled += 1,
            State::Expired => self.t.counts.expired += 1,
            State::Running => unreachable!("finalized while running"),
        }
        if state == State::Completed {
            let l = &q.life;
            self.t.ttft.record(l.first_token_ns() - q.arrival_ns);
            self.t.e2e.record(l.last_token_ns() - q.arrival_ns);
            if q.output > 1 {
                let tpot = (l.last_token_ns() - l.first_token_ns()) / (q.output as u64 - 1);
                self.t.tpot.record(tpot);
            }
        }
    }

    /// A request with an intent leaves: cleanup evidence and leaked work by cause.
    fn cancelled_left(&mut self, q: &Req, state: State, intent_ns: u64, fd: bool) {
        let c = q.cancel();
        // Never observed: the backend still held the request at the intent, and never observed
        // the cancel (its work ran on, and nobody confirmed that it stopped). Cleanup pending:
        // held at the intent and no release confirmed by the time it leaves.
        let held_at_intent = q.life.released_ns().is_none_or(|r| r > intent_ns);
        let held = q.life.enqueued() && held_at_intent && state != State::Completed;
        if held && c.observed_ns().is_none() {
            self.t.counts.never_observed += 1;
        }
        if held && c.evidence(EvidenceLevel::ResourceRelease).is_none() {
            self.t.counts.cleanup_pending += 1;
        }
        for (i, level) in CLEANUP_LEVELS.iter().enumerate() {
            match c.evidence(*level) {
                None if state == State::Completed => self.t.cleanup_not_applicable[i] += 1,
                None => self.t.cleanup_unknown[i] += 1,
                // Evidence from before the intent (killed as someone else's collateral first):
                // the request was already clean when its own intent came.
                Some(at) => self.t.cleanup[i].record(at.saturating_sub(intent_ns)),
            }
        }
        let (pre, post) = (q.cost.leak_pre_ns(), q.cost.leak_post_ns());
        let by = &mut self.t.leaked.by_cause;
        if fd {
            by.finish_and_discard += pre + post;
        } else if c.fallback() && c.observed_ns().is_none() {
            by.finish_and_discard += pre;
            by.in_flight_window += post;
        } else if c.observed_ns().is_some() {
            by.checkpoint_delay += pre;
            by.in_flight_window += post;
        } else {
            by.unobserved_or_lost += pre + post;
        }
        self.t.leaked.gpu_s += pre + post;
    }

    /// Conservation at the end of a run (invariant 5): every output token a replica delivered
    /// reached its request (which then played it or discarded it as late), every token-step was
    /// shared to a request, and GPU time split into requests', discarded and padding work adds
    /// up to the replicas' busy time.
    pub fn conserved(&self, replicas: &ReplicaStats) -> Result<(), Stop> {
        let received = self.t.tokens_left + self.t.tokens_prefill + self.t.tokens_overrun;
        if received != replicas.tokens_delivered {
            let what = format!(
                "tokens not conserved: replicas delivered {}, requests received {} (and {} \
                 prefill tokens)",
                replicas.tokens_delivered, self.t.tokens_left, self.t.tokens_prefill
            );
            return Err(Stop::broken(vec![], what));
        }
        if self.t.token_steps_left != self.t.gpu.token_steps {
            let what = format!(
                "token-steps not conserved: steps computed {}, requests were charged {}",
                self.t.gpu.token_steps, self.t.token_steps_left
            );
            return Err(Stop::broken(vec![], what));
        }
        let g = &self.t.gpu;
        let shared_ns = g.requests_ns + g.discarded_ns + g.padding_ns;
        let busy_ns = replicas.busy_ns as f64;
        if (shared_ns - busy_ns).abs() > 1e-9 * busy_ns + 1.0 {
            let what = format!("GPU time not conserved: busy {busy_ns} ns, shared {shared_ns} ns");
            return Err(Stop::broken(vec![], what));
        }
        Ok(())
    }

    pub fn outcome_hash(&self) -> blake3::Hash {
        self.outcomes.hash()
    }
}

/// A processed step as its outputs' shares read it: its floats converted once a step, not once
/// a request (the same numbers, so the same sums).
pub(crate) struct Shares {
    end_ns: u64,
    duration_ns: u64,
    duration_f: f64,
    total_f: f64,
}

impl Shares {
    pub fn of(step: &StepReport, end_ns: u64) -> Shares {
        Shares {
            end_ns,
            duration_ns: step.duration_ns,
            duration_f: step.duration_ns as f64,
            total_f: step.tokens.max(1) as f64,
        }
    }

    /// `unit` of `step`'s shares, wherever it ended.
    pub fn unit_of(step: &StepReport) -> f64 {
        Shares::of(step, 0).unit()
    }

    /// The share of one token of the step, as `Accounts::step_share` computes it.
    pub fn unit(&self) -> f64 {
        self.duration_f * 1.0 / self.total_f
    }
}

#[cfg(test)]
mod tests;

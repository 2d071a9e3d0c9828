//! The jobs' books: one job's usage and cleanup while it runs, and the run's tallies once jobs
//! leave (folded in as they go, so memory follows the jobs in flight).

use super::job_audit::{JobState, Tokens};
use super::job_observer::ObserverBooks;
use crate::kernel::NS_PER_S;
use crate::metrics::JobsSummary;
use crate::record::JobRow;
use crate::scenario::{JobSpec, Observer};

/// A job's cost, with prices: reported, true (USD), and whether complete.
pub(crate) type Cost = Option<(f64, f64, bool)>;

impl JobRow {
    /// Its cost, with prices.
    pub(crate) fn cost(&self) -> Cost {
        let (r, t, c) = (
            self.reported_cost_usd,
            self.true_cost_usd,
            self.cost_complete,
        );
        Some((r?, t?, c?))
    }
}
use crate::stats::LatencyStats;

/// One job's usage: the truth (what the GPUs computed for it), what it reported, and the GPU
/// work its calls did after its terminal decision.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Usage {
    pub truth: Tokens,
    pub reported: Tokens,
    pub leaked_ns: f64,
}

/// What a job's tool waves in flight at its decision came to, as it leaves.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Settled {
    pub done: u64,
    pub late: u64,
    pub unknown: u64,
    pub awaiting: u64,
    pub rejected: u64,
}

impl Usage {
    /// Whether the job's reported usage is complete: it completed, and reported the truth.
    pub fn complete(&self, state: JobState) -> bool {
        self.truth == self.reported && state == JobState::Completed
    }
}

/// One job's cleanup, from the worker's observation of the decision. Each wait (the provider
/// stream's close, the tools' drain, the sandbox's termination) is charged its allowances:
/// `ceil(wait / allowance)`, at least one.
#[derive(Clone, Debug)]
pub(crate) struct Cleanup {
    decided_ns: u64,
    observed_ns: u64,
    /// The provider streams it closes (a job's parallel calls), those still open, and when the
    /// last one closed.
    streams: u32,
    streams_open: u32,
    stream_end_ns: u64,
    draining: bool,
    drain_end_ns: u64,
    kill_ns: u64,
    local_done: bool,
    gave_up: bool,
    done: bool,
    complete: bool,
    allowances: u32,
    ended_ns: u64,
}

impl Cleanup {
    pub fn new(
        at: (u64, u64),
        streams: u32,
        draining: bool,
        drain_end_ns: u64,
        kill_ns: u64,
    ) -> Self {
        let (decided_ns, observed_ns) = at;
        Cleanup {
            decided_ns,
            observed_ns,
            streams,
            streams_open: streams,
            stream_end_ns: observed_ns,
            draining,
            drain_end_ns,
            kill_ns,
            local_done: false,
            gave_up: false,
            done: false,
            complete: false,
            allowances: 0,
            ended_ns: 0,
        }
    }

    pub fn done(&self) -> bool {
        self.done
    }

    /// How a settled cleanup ended: complete or not (and why not), its time from the decision,
    /// and the allowances it used.
    pub fn outcome(&self) -> (bool, Option<&'static str>, u64, u32) {
        debug_assert!(self.done, "an unsettled cleanup");
        let short = match (self.complete, self.gave_up) {
            (true, _) => None,
            (false, true) => Some("gave_up"),
            (false, false) => Some("allowances_exceeded"),
        };
        let took_ns = self.ended_ns - self.decided_ns;
        (self.complete, short, took_ns, self.allowances)
    }

    pub fn local_done(&mut self) {
        self.local_done = true;
    }

    pub fn give_up(&mut self) {
        self.gave_up = true;
    }

    pub fn stream_closed(&mut self, now_ns: u64) {
        assert!(self.streams_open > 0, "a stream closed twice");
        self.streams_open -= 1;
        self.stream_end_ns = now_ns;
    }

    /// Tools that ended by this time were resolved; past it (the worker gave up), unknown.
    pub fn resolved_until_ns(&self) -> u64 {
        match self.gave_up {
            true => self.ended_ns,
            false => u64::MAX,
        }
    }

    /// Whether the cleanup is over now, and if so, how it ended. True the first time.
    pub fn settle(&mut self, now_ns: u64, allowance_ns: u64, allowances_max: u32) -> bool {
        if self.done || (!self.gave_up && (!self.local_done || self.streams_open > 0)) {
            return false;
        }
        self.done = true;
        self.ended_ns = now_ns;
        if self.gave_up {
            self.allowances = allowances_max;
            return true;
        }
        let charge = |wait_ns: u64| {
            let n = wait_ns.div_ceil(allowance_ns.max(1)).max(1);
            u32::try_from(n).unwrap_or(u32::MAX)
        };
        let mut used = 0u32;
        if self.streams > 0 {
            used = used.saturating_add(charge(self.stream_end_ns - self.observed_ns));
        }
        if self.draining {
            used = used.saturating_add(charge(self.drain_end_ns - self.observed_ns));
        }
        if self.kill_ns > 0 {
            used = used.saturating_add(charge(self.kill_ns));
        }
        self.allowances = used;
        self.complete = used <= allowances_max;
        true
    }
}

/// The run's tallies of jobs.
pub(crate) struct JobBooks {
    pub accepted: u64,
    pub completed: u64,
    pub cancelled: u64,
    pub expired: u64,
    pub failed: u64,
    pub completion_won: u64,
    pub cancel_duplicates: u64,
    pub observers_left: u64,
    pub observer_cancels: u64,
    pub provider_attempts: u64,
    pub notifications_lost: u64,
    /// Decisions the 250 ms poll told the worker of before the notification did.
    pub poll_first: u64,
    pub cleanups: u64,
    pub cleanup_incomplete: u64,
    cleanup: LatencyStats,
    /// Cleanups by allowances used (the last bucket: that many or more).
    allowances: Vec<u64>,
    pub effects_completed: u64,
    pub effects_unknown: u64,
    pub late_observations: u64,
    pub leaked_ns: f64,
    pub truth: Tokens,
    pub reported: Tokens,
    /// True minus reported tokens, over cancelled and expired jobs.
    pub usage_gap_tokens: u64,
    pub usage_complete: u64,
    pub observers: ObserverBooks,
    /// With developer-hosted tools only: effects awaiting the external system, and rejected
    /// submissions.
    hosted: Option<(u64, u64)>,
    /// With prices only: the cost reported and true (summed from the jobs' rows), and the jobs
    /// whose cost is complete.
    cost: Option<(f64, f64, u64)>,
}

impl JobBooks {
    pub fn new(spec: &JobSpec, observer: Option<&Observer>) -> JobBooks {
        let allowances_max = spec.worker.allowances_max;
        JobBooks {
            accepted: 0,
            completed: 0,
            cancelled: 0,
            expired: 0,
            failed: 0,
            completion_won: 0,
            cancel_duplicates: 0,
            observers_left: 0,
            observer_cancels: 0,
            provider_attempts: 0,
            notifications_lost: 0,
            poll_first: 0,
            cleanups: 0,
            cleanup_incomplete: 0,
            cleanup: LatencyStats::new(),
            allowances: vec![0; allowances_max as usize * 4 + 2],
            effects_completed: 0,
            effects_unknown: 0,
            late_observations: 0,
            leaked_ns: 0.0,
            truth: Tokens::default(),
            reported: Tokens::default(),
            usage_gap_tokens: 0,
            usage_complete: 0,
            observers: ObserverBooks::new(observer),
            hosted: spec.has_hosted_tools().then_some((0, 0)),
            cost: spec.prices.map(|_| (0.0, 0.0, 0)),
        }
    }

    /// The waves a job had in flight at its decision, settled as it leaves.
    pub fn settled(&mut self, s: Settled) {
        self.effects_completed += s.done;
        self.late_observations += s.late;
        self.effects_unknown += s.unknown;
        if let Some((awaiting, rejected)) = self.hosted.as_mut() {
            *awaiting += s.awaiting;
            *rejected += s.rejected;
        }
    }

    /// A job leaves in `state`, with its usage, its cleanup if it had one, and (with prices) its
    /// cost as its row gives it: reported, true, and whether complete.
    pub fn left(&mut self, state: JobState, u: &Usage, c: Option<&Cleanup>, cost: Cost) {
        match state {
            JobState::Running => unreachable!("a running job left"),
            JobState::Completed => self.completed += 1,
            JobState::Cancelled => self.cancelled += 1,
            JobState::Expired => self.expired += 1,
            JobState::Failed => self.failed += 1,
        }
        self.truth.input += u.truth.input;
        self.truth.output += u.truth.output;
        self.reported.input += u.reported.input;
        self.reported.output += u.reported.output;
        self.leaked_ns += u.leaked_ns;
        if matches!(state, JobState::Cancelled | JobState::Expired) {
            self.usage_gap_tokens += u.truth.total() - u.reported.total();
        }
        self.usage_complete += u.complete(state) as u64;
        if let (Some(sum), Some((reported, truth, complete))) = (self.cost.as_mut(), cost) {
            sum.0 += reported;
            sum.1 += truth;
            sum.2 += complete as u64;
        }
        let Some(c) = c else {
            return;
        };
        debug_assert!(c.done);
        self.cleanups += 1;
        let bucket = (c.allowances as usize).min(self.allowances.len() - 1);
        self.allowances[bucket] += 1;
        match c.complete {
            true => self.cleanup.record(c.ended_ns - c.decided_ns),
            false => self.cleanup_incomplete += 1,
        }
    }

    pub fn summary(&self) -> JobsSummary {
        JobsSummary {
            accepted: self.accepted,
            completed: self.completed,
            cancelled: self.cancelled,
            expired: self.expired,
            failed: self.failed,
            completion_won: self.completion_won,
            cancel_duplicates: self.cancel_duplicates,
            observers_left: self.observers_left,
            observer_cancels: self.observer_cancels,
            provider_attempts: self.provider_attempts,
            notifications_lost: self.notifications_lost,
            poll_first: self.poll_first,
            cleanups: self.cleanups,
            cleanup_incomplete: self.cleanup_incomplete,
            cleanup_ms: self.cleanup.summary(),
            allowances_used_p99: self.allowances_p(0.99),
            leaked_gpu_s: self.leaked_ns / NS_PER_S as f64,
            effects_completed: self.effects_completed,
            effects_unknown: self.effects_unknown,
            late_observations: self.late_observations,
            true_tokens: self.truth.total(),
            reported_tokens: self.reported.total(),
            usage_gap_tokens: self.usage_gap_tokens,
            usage_complete: self.usage_complete,
            observers: self.observers.summary(),
            reported_cost_usd: self.cost.map(|c| c.0),
            true_cost_usd: self.cost.map(|c| c.1),
            cost_complete: self.cost.map(|c| c.2),
            effects_awaiting_external: self.hosted.map(|h| h.0),
            rejected_submissions: self.hosted.map(|h| h.1),
        }
    }

    /// Nearest-rank quantile of the allowances used per cleanup.
    fn allowances_p(&self, q: f64) -> u32 {
        let n: u64 = self.allowances.iter().sum();
        if n == 0 {
            return 0;
        }
        let rank = ((q * n as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (k, &c) in self.allowances.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return k as u32;
            }
        }
        unreachable!("the ranks add up to the count")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn each_wait_takes_its_allowances_and_too_many_make_the_cleanup_incomplete() {
        // Observed at 0: the stream closes at 10 ms (one allowance), the tools drain until
        // 2.5 s (two), the sandbox takes 4.5 s (three): six in all.
        let mut c = Cleanup::new((0, 0), 1, true, 2500 * MS, 4500 * MS);
        c.stream_closed(10 * MS);
        assert!(
            !c.settle(10 * MS, 2000 * MS, 8),
            "the local resources still run"
        );
        c.local_done();
        assert!(c.settle(7000 * MS, 2000 * MS, 8));
        assert_eq!((c.allowances, c.complete), (6, true));
        let mut tight = Cleanup::new((0, 0), 1, true, 2500 * MS, 4500 * MS);
        tight.stream_closed(10 * MS);
        tight.local_done();
        assert!(tight.settle(7000 * MS, 2000 * MS, 5));
        assert!(!tight.complete, "six allowances of five: incomplete");
        // A worker that gives up has spent them all; tools still running then stay unknown.
        let mut gave_up = Cleanup::new((0, 0), 0, true, 9000 * MS, 0);
        gave_up.give_up();
        assert!(gave_up.settle(8000 * MS, 2000 * MS, 4));
        assert_eq!((gave_up.allowances, gave_up.complete), (4, false));
        assert_eq!(gave_up.resolved_until_ns(), 8000 * MS);
    }

    #[test]
    fn the_books_count_each_state_and_the_gap_only_of_decided_jobs() {
        let spec: JobSpec = ron::from_str(
            "(deadline_ms: Constant(1.0), plan: [Call], worker: (allowances_max: 4))",
        )
        .unwrap();
        let mut b = JobBooks::new(&spec, None);
        let truth = Tokens {
            input: 100,
            output: 30,
        };
        let reported = Tokens {
            input: 100,
            output: 10,
        };
        let u = Usage {
            truth,
            reported,
            leaked_ns: 0.0,
        };
        b.left(JobState::Failed, &u, None, None);
        b.left(JobState::Cancelled, &u, None, None);
        let same = Usage {
            reported: truth,
            ..u
        };
        b.left(JobState::Completed, &same, None, None);
        assert_eq!((b.failed, b.cancelled, b.completed), (1, 1, 1));
        assert_eq!(
            b.usage_gap_tokens, 20,
            "the failed job's gap is not a cancel's"
        );
        assert_eq!(b.usage_complete, 1);
        assert_eq!(b.summary().allowances_used_p99, 0);
    }
}

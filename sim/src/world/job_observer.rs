//! A job's observer is not its owner (seed 003): the client reading a job's events may leave
//! and come back. A durable job runs on without it; a job run inline is cancelled with it. A
//! reconnect (a GET of the job's events) is replayed what the job retained, the interruption
//! result included, and never restarts generation: it only reads. A job's events are retained
//! for a while after its terminal result; a reconnect later than that finds nothing, and the
//! result goes unobserved.

use super::job_audit::JobState;
use crate::dist::ms_to_ns;
use crate::kernel::rng::{key, Purpose, Stream};
use crate::metrics::ObserversSummary;
use crate::scenario::{Observer, RETENTION_MS_DEFAULT};

/// Where a job's observer is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Watch {
    /// It never left, or left a job already decided (it had seen the result).
    Watching,
    /// Away since its disconnect; back at this time, if it comes back.
    Away(Option<u64>),
    /// Back, reading the job's events again.
    Back,
    /// Back too late: the job's events were gone.
    Gone,
}

pub(crate) struct ObserverBooks {
    spec: Option<Observer>,
    retention_ns: u64,
    tally: ObserversSummary,
}

impl ObserverBooks {
    pub fn new(spec: Option<&Observer>) -> ObserverBooks {
        let retention_ms = spec.and_then(|o| o.retention_ms);
        ObserverBooks {
            spec: spec.cloned(),
            retention_ns: ms_to_ns(retention_ms.unwrap_or(RETENTION_MS_DEFAULT)),
            tally: ObserversSummary::default(),
        }
    }

    /// Job `job`'s observer leaves now: when it comes back, if it does.
    pub fn back_ns(&self, seed: u64, job: u64, now_ns: u64) -> Option<u64> {
        let back = self.spec.as_ref().and_then(|o| o.reconnect_ms.as_ref())?;
        let mut s = Stream::keyed(seed, Purpose::Job, job, key::JOB_RECONNECT);
        Some(now_ns.saturating_add(ms_to_ns(back.sample(&mut s))))
    }

    /// The observer is back now, its job still in the world in `state` (decided at
    /// `decided_ns` if terminal): it follows the job on, or is replayed its result.
    pub fn back(&mut self, state: JobState, decided_ns: u64, now_ns: u64) -> Watch {
        self.tally.reconnects += 1;
        if !state.is_terminal() {
            self.tally.resumed_live += 1;
            return Watch::Back;
        }
        self.replay(state, decided_ns, now_ns)
    }

    fn replay(&mut self, state: JobState, decided_ns: u64, at_ns: u64) -> Watch {
        debug_assert!(at_ns >= decided_ns, "a replay before the result");
        if at_ns - decided_ns > self.retention_ns {
            self.tally.too_late += 1;
            return Watch::Gone;
        }
        self.tally.replays += 1;
        self.tally.replayed_interruptions += (state != JobState::Completed) as u64;
        Watch::Back
    }

    /// The job leaves, its observer where `w` says. An observer still away is settled now: the
    /// retained events answer its reconnect whenever it comes.
    pub fn job_left(&mut self, w: Watch, state: JobState, decided_ns: u64) {
        let seen = match w {
            Watch::Watching | Watch::Back => true,
            Watch::Gone | Watch::Away(None) => false,
            Watch::Away(Some(back_ns)) => {
                self.tally.reconnects += 1;
                self.replay(state, decided_ns, back_ns.max(decided_ns)) == Watch::Back
            }
        };
        self.tally.results_unobserved += (!seen) as u64;
    }

    /// The section, with an observer in the job spec.
    pub fn summary(&self) -> Option<ObserversSummary> {
        self.spec.as_ref().map(|_| self.tally.clone())
    }
}

impl super::jobs::Jobs {
    /// The job's observer left now: whether that cancels the job (it runs inline, not
    /// durably), and when the observer comes back, if it does.
    pub fn observer_left(&mut self, job: u64, now_ns: u64) -> (bool, Option<u64>) {
        let seed = self.seed;
        let Some(j) = self.live.get_mut(&job) else {
            return (false, None);
        };
        if j.state.is_terminal() {
            return (false, None);
        }
        self.books.observers_left += 1;
        let durable = self.spec.observer.as_ref().is_none_or(|o| o.durable);
        if !durable {
            self.books.observer_cancels += 1;
        }
        let back_ns = self.books.observers.back_ns(seed, job, now_ns);
        j.watch = Watch::Away(back_ns);
        (!durable, back_ns)
    }

    /// The job's observer reconnects now. A job that already left was settled as it left.
    pub fn observer_back(&mut self, job: u64, now_ns: u64) {
        let Some(j) = self.live.get_mut(&job) else {
            return;
        };
        if matches!(j.watch, Watch::Away(Some(_))) {
            j.watch = self.books.observers.back(j.state, j.decided_ns, now_ns);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dist::Dist;

    const MS: u64 = 1_000_000;

    fn books(reconnect_ms: Option<f64>, retention_ms: f64) -> ObserverBooks {
        ObserverBooks::new(Some(&Observer {
            disconnect_ms: Dist::Constant(1.0),
            durable: true,
            reconnect_ms: reconnect_ms.map(Dist::Constant),
            retention_ms: Some(retention_ms),
        }))
    }

    #[test]
    fn a_reconnect_follows_a_live_job_or_replays_its_result_while_retained() {
        let mut b = books(Some(100.0), 1000.0);
        assert_eq!(b.back_ns(1, 0, 50 * MS), Some(150 * MS));
        assert_eq!(books(None, 1000.0).back_ns(1, 0, 50 * MS), None);
        assert_eq!(b.back(JobState::Running, 0, 150 * MS), Watch::Back);
        // Cancelled at 200 ms: back at 1,100 ms it is replayed the interruption; at 1,300 ms,
        // past the 1,000 ms of retention, it finds nothing.
        assert_eq!(
            b.back(JobState::Cancelled, 200 * MS, 1100 * MS),
            Watch::Back
        );
        assert_eq!(
            b.back(JobState::Cancelled, 200 * MS, 1300 * MS),
            Watch::Gone
        );
        b.job_left(Watch::Gone, JobState::Cancelled, 200 * MS);
        // Settled as its job leaves: a completed job's result replayed, no interruption.
        b.job_left(Watch::Away(Some(900 * MS)), JobState::Completed, 500 * MS);
        b.job_left(Watch::Away(None), JobState::Completed, 500 * MS);
        b.job_left(Watch::Watching, JobState::Completed, 500 * MS);
        let s = b.summary().unwrap();
        assert_eq!((s.reconnects, s.resumed_live, s.replays), (4, 1, 2));
        assert_eq!((s.replayed_interruptions, s.too_late), (1, 1));
        assert_eq!(
            s.results_unobserved, 2,
            "the one too late, the one never back"
        );
        assert!(ObserverBooks::new(None).summary().is_none());
    }
}

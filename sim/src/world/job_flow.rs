//! The world's side of durable agent jobs: a job's calls arrive as requests, its decisions
//! (cancel, expiry) fence it at once, and its worker's cleanup closes the call in progress
//! through the adapter's policy, like any cancel intent. The job's own calls are its group: a
//! cancel of one job counts only other jobs' requests as siblings.

use super::error::Step;
use super::event::{Cause, Event};
use super::job_audit::JobState;
use super::jobs::Next;
use super::leave::broken;
use super::requests::Tag;
use super::World;

impl World<'_> {
    pub(super) fn on_job_start(&mut self, job: u64) -> Step {
        let policy_run = self.cancel.policy().is_some();
        let f = &mut self.follow;
        self.jobs.as_mut().expect("jobs").start(f, job, policy_run);
        self.job_step(job)
    }

    /// Run the job on: admit its next calls (its strands run side by side), or wait, or end it.
    fn job_step(&mut self, job: u64) -> Step {
        loop {
            let w = &self.scenario.workload;
            let jobs = self.jobs.as_mut().expect("jobs");
            match jobs.advance(&mut self.follow, w, job).map_err(broken)? {
                Next::Call(a, serial, prefix) => {
                    // A recorded call's block ids, for the prefix cache, as a trace row's are.
                    if !prefix.is_empty() {
                        self.arrivals.give_prefix(a.id, prefix);
                    }
                    self.arrive(a, Some((job, serial)))?;
                }
                Next::Completed => {
                    let now_ns = self.kernel.now_ns();
                    let jobs = self.jobs_mut();
                    jobs.end(job, JobState::Completed, now_ns).map_err(broken)?;
                    return self.job_try_leave(job);
                }
                Next::Waiting | Next::Nothing => return Ok(()),
            }
        }
    }

    pub(super) fn on_job_timer(&mut self, job: u64, serial: u32) -> Step {
        if self.jobs_mut().timer(job, serial) {
            return self.job_step(job);
        }
        Ok(())
    }

    /// The world admitted request `tag` as the job's call `id`.
    pub(super) fn job_joined(&mut self, job: u64, id: u64, tag: Tag) {
        self.jobs_mut().joined(job, id, tag);
    }

    pub(super) fn on_job_cancel(&mut self, job: u64, copy: u8) -> Step {
        if !self.jobs_mut().cancel_arrives(job, copy) {
            return Ok(());
        }
        self.job_decide(job, JobState::Cancelled)
    }

    /// A durable job runs on when its observer leaves (its work is not leaked); a job run
    /// inline is cancelled with it.
    pub(super) fn on_job_observer_left(&mut self, job: u64) -> Step {
        let now_ns = self.kernel.now_ns();
        let (cancels, back_ns) = self.jobs_mut().observer_left(job, now_ns);
        if let Some(at_ns) = back_ns {
            // Weak: a reconnect alone does not keep the run going (one after its job left is
            // settled as the job leaves).
            self.follow
                .weak_after(at_ns - now_ns, Event::JobObserverBack { job });
        }
        if cancels {
            return self.job_decide(job, JobState::Cancelled);
        }
        Ok(())
    }

    /// The observer reconnects: it reads the job's retained events, and starts nothing.
    pub(super) fn on_job_observer_back(&mut self, job: u64) -> Step {
        let now_ns = self.kernel.now_ns();
        self.jobs_mut().observer_back(job, now_ns);
        Ok(())
    }

    pub(super) fn on_job_deadline(&mut self, job: u64) -> Step {
        self.job_decide(job, JobState::Expired)
    }

    /// The terminal decision: recorded now, dispatch fenced; the worker learns of it later.
    fn job_decide(&mut self, job: u64, to: JobState) -> Step {
        let now_ns = self.kernel.now_ns();
        let requests = &self.requests;
        let at = |tag: Tag| {
            let q = &requests[tag];
            (q.life.tokens().min(q.output), q.cost.gpu_ns())
        };
        let jobs = self.jobs.as_mut().expect("jobs");
        let observe = jobs.decide((job, to), now_ns, at).map_err(broken)?;
        if let Some(at_ns) = observe {
            self.follow.at(at_ns, Event::JobObserve { job });
        }
        Ok(())
    }

    /// The worker begins the cleanup: the calls in progress are closed by the adapter's policy,
    /// the tools drain, the sandbox is terminated, each within its allowances.
    pub(super) fn on_job_observe(&mut self, job: u64) -> Step {
        let now_ns = self.kernel.now_ns();
        let requests = &self.requests;
        let gpu_ns = |t: Tag| requests[t].cost.gpu_ns();
        let jobs = self.jobs.as_mut().expect("jobs");
        let (streams, local_end_ns, give_up_ns) = jobs.observe(job, now_ns, gpu_ns);
        let f = &mut self.follow;
        f.weak_after(
            give_up_ns - now_ns,
            Event::JobCleanup { job, give_up: true },
        );
        if local_end_ns > now_ns {
            f.at(
                local_end_ns,
                Event::JobCleanup {
                    job,
                    give_up: false,
                },
            );
        } else {
            self.jobs_mut().cleanup_event(job, now_ns, false);
        }
        let cause = match self.jobs_mut().get(job).map(|j| j.state) {
            Some(JobState::Expired) => Cause::Deadline,
            _ => Cause::Job,
        };
        for tag in streams {
            self.intent(tag, cause)?;
            self.try_finalize(tag)?;
        }
        self.job_try_leave(job)
    }

    pub(super) fn on_job_cleanup(&mut self, job: u64, give_up: bool) -> Step {
        let now_ns = self.kernel.now_ns();
        if self.jobs_mut().cleanup_event(job, now_ns, give_up) {
            return self.job_try_leave(job);
        }
        Ok(())
    }
}

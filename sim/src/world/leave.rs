//! The end of a request: its turn moves on (once, however it ended), and it leaves the system
//! once nothing more can happen to it, into the books, against the baseline, to the recorder.
//! The bottom of the world's route: every handler ends here, and it calls no handler back.

use super::conversations::TurnEnd;
use super::error::{Step, Stop};
use super::job_audit::JobState;
use super::jobs::CallLeft;
use super::recorder::Left;
use super::requests::{Req, Tag};
use super::World;
use crate::workload::{self};
use cancelsim_models::ownership::State;

impl World<'_> {
    /// Leave the system once nothing more can happen to the request.
    pub(super) fn try_finalize(&mut self, tag: Tag) -> Step {
        let q = &self.requests[tag];
        if !q.live {
            return Ok(());
        }
        let state = self.state_of(tag);
        let terminal = state.is_none_or(State::is_terminal);
        // Not before its replica is done with it: a step in flight still holds its tag, and its
        // output must be charged to this request, not to the next owner of the tag.
        let engine_done = (q.life.engine_retired() || !q.life.enqueued()) && !q.life.in_handoff();
        let settled = self.cancel.settled(q.cancel(), q.life.enqueued());
        if !terminal || !engine_done || q.chunks.busy() || q.cancel().intent_pending() || !settled {
            return Ok(());
        }
        // The world never substitutes a state the controller did not give: a record of a
        // request still in the world is never evicted (`Retention::until_retired`).
        let Some(state) = state else {
            let what = "the controller lost the record of a request still in the world";
            return Err(Stop::broken(vec![q.id], what));
        };
        let id = q.id;
        self.owners_for(tag)?
            .retire(&id)
            .map_err(Stop::controller(id))?;
        self.leave(tag, state)
    }

    /// The request leaves: into the books, against the baseline, to the recorder.
    pub(super) fn leave(&mut self, tag: Tag, state: State) -> Step {
        let now_ns = self.kernel.now_ns();
        if let Some(h) = self.handoff.as_mut() {
            h.take_abort_seen(self.requests[tag].id);
        }
        debug_assert!(
            !self.requests[tag].cancel().awaiting() || self.cancel.policy().is_none(),
            "a request leaves once its cancel settled"
        );
        if let Some(st) = self.requests[tag].cancel_if_any() {
            self.cancel.settle(st);
        }
        let q = &self.requests[tag];
        // Failed before admission without a cancel of its own (a killed engine, say): it waited
        // for admission until now, and the time to recover must see it.
        if !q.life.started() && q.cancel().intent_ns().is_none() {
            self.recover.admitted(q.arrival_ns, now_ns);
        }
        // A sibling: no intent of its own, but it shared a replica with a request that got one
        // while it was there, or it was killed or corrupted by someone's cancel.
        let shared = q.life.enqueued()
            && self.cluster.intent_epoch(q.replica) > q.life.epoch_at_enqueue()
            && !self.group_hit(q);
        let sibling = q.cancel().intent_ns().is_none() && (q.cancel().sibling() || shared);
        let judged = self.baseline.left(q, state, sibling);
        let fd = self.cancel.finish_and_discard();
        self.accounts.left(q, state, fd, now_ns, judged.digest);
        let how = Left {
            state,
            sibling: judged.sibling,
            survived: judged.survived,
            now_ns,
            runtime_id: self.cancel.handle(q.id, q.owner()).runtime_id,
        };
        self.recorder.left(q, &self.label, how);
        let job = q.conv().filter(|_| self.jobs.is_some());
        if let Some((job, _)) = job {
            // Its job's books read it before it goes.
            self.job_call_left(tag, job)?;
        }
        if let Some(h) = self.handoff.as_mut() {
            h.forget_sharing(self.requests[tag].id);
        }
        self.requests.remove(tag);
        Ok(())
    }

    /// The request became terminal (completed, cancelled, expired or refused): its turn has one
    /// request fewer out. Once per request, however it ended.
    pub(super) fn turn_over(&mut self, tag: Tag) -> Step {
        let q = &mut self.requests[tag];
        if !q.life.end_turn() {
            return Ok(());
        }
        let Some((c, g)) = q.conv() else {
            return Ok(());
        };
        if self.jobs.is_some() {
            return self.job_call_over(tag, c);
        }
        if workload::conversation_request_index(q.id) == 0 {
            self.conversations.seen(c, g, q.life.tokens().min(q.output));
        }
        let w = &self.scenario.workload;
        let end = self.conversations.request_done(&mut self.follow, w, c, g);
        self.turn_ended(c, end);
        Ok(())
    }

    pub(super) fn turn_ended(&mut self, conv: u64, end: TurnEnd) {
        if end == TurnEnd::Over {
            self.sink.owner_gone(&mut self.owners, conv);
        }
    }

    /// Whether the request's own owner (its conversation) has had a cancel intent: then the
    /// owner's group was hit, and the request is part of that group, not a sibling of it.
    pub(super) fn group_hit(&self, q: &Req) -> bool {
        q.conv().is_some_and(|(c, _)| match &self.jobs {
            Some(jobs) => jobs.group_hit(c),
            None => self.conversations.group_hit(c),
        })
    }

    /// The request `tag` of a job became terminal: the job moves on, tries again, or fails.
    pub(super) fn job_call_over(&mut self, tag: Tag, job: u64) -> Step {
        let completed = self.state_of(tag) == Some(State::Completed);
        let id = self.requests[tag].id;
        let jobs = self.jobs.as_mut().expect("jobs");
        match jobs.call_ended(&mut self.follow, job, id, completed) {
            Some(JobState::Failed) => {
                let now_ns = self.kernel.now_ns();
                self.jobs_mut()
                    .end(job, JobState::Failed, now_ns)
                    .map_err(broken)?;
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// A job's call leaves the world: its usage into the job's books.
    pub(super) fn job_call_left(&mut self, tag: Tag, job: u64) -> Step {
        let now_ns = self.kernel.now_ns();
        let q = &self.requests[tag];
        let left = CallLeft {
            started: q.life.started(),
            prompt: q.prompt,
            received: q.life.tokens().min(q.output),
            late: q.cost.late_discards(),
            gpu_ns: q.cost.gpu_ns(),
            leaked_ns: q.cost.leak_pre_ns() + q.cost.leak_post_ns(),
        };
        let id = q.id;
        self.jobs_mut().call_left(job, id, now_ns, left);
        self.job_try_leave(job)
    }

    pub(super) fn job_try_leave(&mut self, job: u64) -> Step {
        if let Some(row) = self.jobs_mut().try_leave(job).map_err(broken)? {
            self.recorder.job_left(row, &self.label);
            self.sink.owner_gone(&mut self.owners, job);
        }
        Ok(())
    }

    pub(super) fn jobs_mut(&mut self) -> &mut super::jobs::Jobs {
        self.jobs.as_mut().expect("job events need a jobs source")
    }
}

pub(super) fn broken(what: String) -> Stop {
    Stop::broken(vec![], what)
}

//! Durable agent jobs: each job walks its plan (provider calls, tool waves, approval waits,
//! subagents) under one deadline from acceptance; a cancel or an expiry is a recorded decision
//! that fences dispatch at once, and the job's worker, once it learns of it (notification or
//! poll), closes the job's provider stream, drains its tools and terminates its sandbox, each
//! wait within its allowances. The job keeps two books of its usage: the truth and what it saw.
//!
//! Sans-IO like the other components: it takes `now` and what happened, and says what follows
//! (a call to admit, a timer); the world (`job_flow.rs`) does the rest.

use std::sync::Arc;

use rustc_hash::FxHashMap;

use super::event::{Event, Tag};
use super::follow::Follow;
pub(crate) use super::job::CallLeft;
use super::job::{Job, Wait};
use super::job_audit::{self as audit, JobState};
use super::job_books::{Cleanup, JobBooks};
use super::job_plan::{Op, Plan};
use crate::dist::{ms_to_ns, round_ns};
use crate::kernel::rng::{key, Purpose, Stream};
use crate::kernel::NS_PER_S;
use crate::record::JobRow;
use crate::scenario::{JobSpec, Source, Workload};
use crate::workload::agentic::AgentSessions;
use crate::workload::{Arrival, TOKENS_MAX};

/// What a job does next.
#[derive(Debug, PartialEq)]
pub(crate) enum Next {
    /// Admit this provider call (its serial within the job, its prompt's block ids).
    Call(Arrival, u32, Box<[u64]>),
    /// Wait on the timer scheduled.
    Waiting,
    /// Its plan is done: it completed.
    Completed,
    /// Nothing: it is terminal, or waits already.
    Nothing,
}

/// A deliberately broken job model, one per rule, to show the run catches each (tests only).
#[cfg(feature = "broken-variants")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JobBug {
    /// A timer runs the plan on after the decision.
    IgnoresFence,
    /// A second decision overwrites the first.
    RedecidesTerminal,
    /// Every call reports one output token more than it computed.
    OverReports,
    /// A subagent gets a millisecond more than its parent has left.
    ChildOutlivesParent,
    /// Every journalled attempt counts as 4,096.
    AttemptsUnbounded,
}

pub(crate) struct Jobs {
    #[cfg(feature = "broken-variants")]
    pub bug: Option<JobBug>,
    pub(super) seed: u64,
    pub(super) spec: JobSpec,
    plan: Plan,
    /// A trace's sessions as plans, one per job, and when each job is accepted.
    recorded: Vec<Plan>,
    starts_ns: Option<Vec<u64>>,
    /// Ids each job's calls may take: every attempt it may journal.
    per_job: u64,
    total: u64,
    rate_per_s: f64,
    started: u64,
    starts: Stream,
    pub(super) live: FxHashMap<u64, Job>,
    /// Terminal jobs that left with cancels still to come: what those cancels find.
    gone: FxHashMap<u64, (JobState, u32)>,
    pub books: JobBooks,
}

impl Jobs {
    /// The jobs of a `Jobs` source (`sessions` none), or of an `AgentTrace` one (its sessions).
    pub fn new(seed: u64, w: &Workload, sessions: Option<&Arc<AgentSessions>>) -> Option<Jobs> {
        let (total, rate_per_s, job) = match &w.source {
            Source::Jobs {
                jobs,
                rate_per_s,
                job,
            } => (*jobs, *rate_per_s, job),
            Source::AgentTrace { job, .. } => {
                let s = sessions.expect("an agent trace's sessions, read at the edge");
                (s.sessions.len() as u64, 0.0, job)
            }
            _ => return None,
        };
        let recorded: Vec<Plan> = sessions.map_or_else(Vec::new, |s| {
            s.sessions
                .iter()
                .map(|x| Plan::recorded(&x.calls))
                .collect()
        });
        let calls = match sessions {
            Some(s) => s
                .sessions
                .iter()
                .map(|x| x.calls.len() as u64)
                .max()
                .unwrap_or(1),
            None => job.bounds().calls,
        };
        Some(Jobs {
            #[cfg(feature = "broken-variants")]
            bug: None,
            seed,
            spec: job.clone(),
            plan: Plan::drawn(&job.plan, job),
            recorded,
            starts_ns: sessions.map(|s| s.sessions.iter().map(|x| x.start_ns).collect()),
            per_job: (calls * job.call_attempts as u64).max(1),
            total,
            rate_per_s,
            started: 0,
            starts: Stream::new(seed, Purpose::Arrival, key::JOB_STARTS),
            live: FxHashMap::default(),
            gone: FxHashMap::default(),
            books: JobBooks::new(job, job.observer.as_ref()),
        })
    }

    /// When the first job is accepted.
    pub fn first_start_ns(&self) -> u64 {
        self.starts_ns
            .as_ref()
            .and_then(|s| s.first().copied())
            .unwrap_or(0)
    }

    pub fn get(&self, job: u64) -> Option<&Job> {
        self.live.get(&job)
    }

    fn bug(&self, b: u8) -> bool {
        #[cfg(feature = "broken-variants")]
        {
            self.bug.is_some_and(|x| x as u8 == b)
        }
        #[cfg(not(feature = "broken-variants"))]
        {
            let _ = b;
            false
        }
    }

    fn job(&mut self, job: u64) -> &mut Job {
        self.live.get_mut(&job).expect("a live job")
    }

    /// Job `job` is accepted now: the next acceptance, its deadline and (in policy runs) its
    /// cancels are scheduled.
    pub fn start(&mut self, f: &mut Follow, job: u64, policy_run: bool) {
        assert_eq!(job, self.started, "jobs accepted out of order");
        self.started += 1;
        if self.started < self.total {
            let next = Event::JobStart { job: job + 1 };
            match &self.starts_ns {
                Some(at) => f.at(at[self.started as usize], next),
                None => {
                    let gap = self.starts.exponential(NS_PER_S as f64 / self.rate_per_s);
                    f.after(round_ns(gap), next);
                }
            }
        }
        let now_ns = f.now_ns();
        let mut d = Stream::keyed(self.seed, Purpose::Job, job, key::JOB_DEADLINE);
        let deadline_ns = now_ns.saturating_add(ms_to_ns(self.spec.deadline_ms.sample(&mut d)));
        let mut cancels = 0;
        if policy_run {
            if let Some(delay_ns) = self.cancel_delay(job) {
                cancels = 1 + self.spec.cancel.as_ref().map_or(0, |c| c.duplicates);
                for copy in 0..cancels {
                    let at = delay_ns.saturating_add(copy as u64 * crate::kernel::NS_PER_MS);
                    f.after(
                        at,
                        Event::JobCancel {
                            job,
                            copy: copy as u8,
                        },
                    );
                }
            }
            // Weak: a job that ended does not keep the run alive with its deadline.
            f.weak_after(deadline_ns - now_ns, Event::JobDeadline { job });
            if let Some(o) = &self.spec.observer {
                let mut s = Stream::keyed(self.seed, Purpose::Job, job, key::JOB_OBSERVER);
                let at = ms_to_ns(o.disconnect_ms.sample(&mut s));
                f.weak_after(at, Event::JobObserverLeft { job });
            }
        }
        self.books.accepted += 1;
        let plan = self.recorded.get(job as usize).unwrap_or(&self.plan);
        let j = Job::new((now_ns, deadline_ns), cancels, plan);
        self.live.insert(job, j);
    }

    /// When job `job`'s cancel is requested, from its acceptance, if it is a target.
    fn cancel_delay(&self, job: u64) -> Option<u64> {
        let c = self.spec.cancel.as_ref()?;
        let mut s = Stream::keyed(self.seed, Purpose::Job, job, key::JOB_CANCEL);
        let target = match c.jobs.is_empty() {
            true => s.uniform_open01() < c.fraction,
            false => c.jobs.contains(&job),
        };
        target.then(|| ms_to_ns(c.delay_ms.sample(&mut s)))
    }

    /// Run the job's strands on until each must wait: a call to admit (one per call; the world
    /// asks again), a timer, or the plan's end.
    pub fn advance(&mut self, f: &mut Follow, w: &Workload, job: u64) -> Result<Next, String> {
        let now_ns = f.now_ns();
        let seed = self.seed;
        let plan = self.recorded.get(job as usize).unwrap_or(&self.plan);
        let per_job = self.per_job;
        let ignores_fence = self.bug(0);
        let child_bonus_ns = self.bug(3) as u64 * crate::kernel::NS_PER_MS;
        let attempts_each = if self.bug(4) {
            crate::scenario::PROVIDER_ATTEMPTS_MAX
        } else {
            1
        };
        // A call just admitted may have ended the job already (refused, out of attempts).
        let Some(j) = self.live.get_mut(&job) else {
            return Ok(Next::Nothing);
        };
        if j.state.is_terminal() && !ignores_fence {
            return Ok(Next::Nothing);
        }
        while let Some(s) = j.next_ready() {
            loop {
                let st = &j.strands[s];
                if st.at_end() {
                    j.finish(s, plan);
                    break;
                }
                audit::dispatch(job, j.state)?;
                let pc = st.pc;
                match &plan.ops[pc as usize] {
                    op @ (Op::Call | Op::Fixed { .. }) => {
                        j.attempts += attempts_each - 1;
                        let (fixed, prefix) = match op {
                            Op::Fixed {
                                input,
                                output,
                                prefix,
                            } => (Some((*input, *output)), prefix.clone()),
                            _ => (None, Box::default()),
                        };
                        let (a, serial) = j.call((s, w, seed), (job, per_job), (now_ns, fixed))?;
                        return Ok(Next::Call(a, serial, prefix));
                    }
                    Op::Tools {
                        tools,
                        duration_ms,
                        effect_p,
                        hosted,
                    } => {
                        let t = (*tools, duration_ms, *effect_p, *hosted);
                        let end_ns = j.wave((s, seed, job), now_ns, t);
                        j.timer(s, f, job, end_ns);
                        break;
                    }
                    Op::Approval { wait_ms } => {
                        let mut r = Stream::keyed(seed, Purpose::Job, job, pc as u64);
                        let at = now_ns.saturating_add(ms_to_ns(wait_ms.sample(&mut r)));
                        j.timer(s, f, job, at);
                        break;
                    }
                    Op::Enter => {
                        // A subagent runs under what is left of its parent's deadline, never more.
                        let left_ns = j.deadline_ns.saturating_sub(now_ns);
                        audit::child_deadline(job, left_ns + child_bonus_ns, left_ns)?;
                    }
                    // The subagent's end: its parent's steps go on under the same deadline.
                    Op::Exit => {}
                }
                j.strands[s].pc += 1;
            }
        }
        Ok(match j.all_finished() {
            true => Next::Completed,
            false => Next::Waiting,
        })
    }

    /// The world admitted call `id` as `tag`.
    pub fn joined(&mut self, job: u64, id: u64, tag: Tag) {
        let j = self.job(job);
        j.calls_out += 1;
        if let Some(s) = j.strand_of_call(id) {
            j.call_mut(s).tag = Some(tag);
        }
    }

    /// Call `id` ended (`completed`, or not). Its strand moves on, tries again, or fails the job.
    pub fn call_ended(
        &mut self,
        f: &mut Follow,
        job: u64,
        id: u64,
        completed: bool,
    ) -> Option<JobState> {
        let attempts_max = self.spec.call_attempts;
        let j = self.live.get_mut(&job)?;
        let s = j.strand_of_call(id)?;
        if j.state.is_terminal() {
            if completed {
                // A provider result after the decision: journalled, never admitted.
                self.books.late_observations += 1;
            }
            return None;
        }
        let c = *j.call_mut(s);
        j.clear_wait(s, false);
        let st = &mut j.strands[s];
        if completed {
            j.history = (j.history + c.message as u64 + c.output as u64).min(TOKENS_MAX as u64);
            st.pc += 1;
            st.tries = 0;
        } else {
            j.interrupted = true;
            if st.tries >= attempts_max {
                return Some(JobState::Failed);
            }
        }
        let serial = j.timers;
        j.timers += 1;
        j.set_wait(s, Wait::Resume(serial));
        f.at(f.now_ns(), Event::JobTimer { job, serial });
        Some(JobState::Running)
    }

    /// A tool wave's or approval's timer, or a call's resume: true if a strand waits on it.
    pub fn timer(&mut self, job: u64, serial: u32) -> bool {
        let ignores_fence = self.bug(0);
        let Some(j) = self.live.get_mut(&job) else {
            return false;
        };
        if j.state.is_terminal() && !ignores_fence {
            return false;
        }
        if let Some(s) = j.find(|w| *w == Wait::Resume(serial)) {
            j.clear_wait(s, true);
            return true;
        }
        let Some(s) = j.find(|w| *w == Wait::Timer(serial)) else {
            return false;
        };
        j.clear_wait(s, true);
        let st = &mut j.strands[s];
        if std::mem::take(&mut st.wave_open) {
            let done = st.wave.iter().filter(|t| t.1).count() as u64;
            self.books.effects_completed += done;
            j.effects_done += done;
        }
        st.pc += 1;
        true
    }

    /// The plan is done (`Completed`) or a call ran out of attempts (`Failed`): terminal now,
    /// with nothing left to clean up.
    pub fn end(&mut self, job: u64, to: JobState, now_ns: u64) -> Result<(), String> {
        let j = self.job(job);
        audit::transition(job, j.state, to)?;
        j.state = to;
        j.decided_ns = now_ns;
        Ok(())
    }

    /// The terminal decision, now: the state is recorded and dispatch fenced. Returns when the
    /// worker learns of it, if this decided (not a duplicate, nor a job already terminal).
    /// `at` says what the job had seen of an admitted call, and its GPU ns.
    pub fn decide(
        &mut self,
        (job, to): (u64, JobState),
        now_ns: u64,
        at: impl Fn(Tag) -> (u32, f64),
    ) -> Result<Option<u64>, String> {
        let redecides = self.bug(1);
        let Some(j) = self.live.get_mut(&job) else {
            return Ok(None);
        };
        if j.state.is_terminal() && !(redecides && j.state != to) {
            if j.state == JobState::Completed && to == JobState::Cancelled {
                self.books.completion_won += 1;
            }
            return Ok(None);
        }
        audit::transition(job, j.state, to)?;
        j.state = to;
        j.decided_ns = now_ns;
        for s in j.call_strands() {
            let c = j.call_mut(s);
            if let Some(tag) = c.tag {
                let (seen, gpu_ns) = at(tag);
                c.seen_at_decision = Some(seen);
                c.gpu_ns_at_decision = gpu_ns;
            }
        }
        let w = &self.spec.worker;
        let mut s = Stream::keyed(self.seed, Purpose::Job, job, key::JOB_CLEANUP);
        let lost = s.uniform_open01() < w.notify_loss;
        let poll_ns = ms_to_ns(w.poll_ms).max(1);
        let since = now_ns - j.accepted_ns;
        let poll_at = j
            .accepted_ns
            .saturating_add(since.div_ceil(poll_ns).saturating_mul(poll_ns));
        let notified = now_ns.saturating_add(ms_to_ns(w.notify_ms));
        if lost {
            self.books.notifications_lost += 1;
        }
        let observe_at = if lost { poll_at } else { poll_at.min(notified) };
        if !lost && notified > poll_at {
            self.books.poll_first += 1;
        }
        Ok(Some(observe_at))
    }

    /// The worker learns of the decision now and begins the cleanup. Returns the calls to close
    /// (their streams: `gpu_ns` says each one's GPU ns now), when the local resources are done,
    /// and when the worker gives up.
    pub fn observe(
        &mut self,
        job: u64,
        now_ns: u64,
        gpu_ns: impl Fn(Tag) -> f64,
    ) -> (Vec<Tag>, u64, u64) {
        let w = self.spec.worker.clone();
        let seed = self.seed;
        let j = self.job(job);
        let mut streams = Vec::new();
        for s in j.call_strands() {
            let c = j.call_mut(s);
            if let Some(tag) = c.tag {
                c.gpu_ns_at_close = Some(gpu_ns(tag));
                streams.push(tag);
            }
        }
        let waves_end_ns = j.waves_end_ns();
        let draining = waves_end_ns.is_some();
        let drain_end_ns = waves_end_ns.map_or(now_ns, |e| e.max(now_ns));
        let kill_ns = match j.sandbox {
            true => {
                let mut s = Stream::keyed(seed, Purpose::Job, job, key::JOB_CLEANUP);
                s.uniform_open01();
                ms_to_ns(w.sandbox_kill_ms.sample(&mut s))
            }
            false => 0,
        };
        let local_end_ns = drain_end_ns.saturating_add(kill_ns);
        let give_up_ns =
            now_ns.saturating_add(ms_to_ns(w.allowance_ms).saturating_mul(w.allowances_max as u64));
        let at = (j.decided_ns, now_ns);
        let n = streams.len() as u32;
        j.cleanup = Some(Cleanup::new(at, n, draining, drain_end_ns, kill_ns));
        (streams, local_end_ns, give_up_ns)
    }

    /// The job's local resources (tools drained, sandbox terminated) are done, or its worker
    /// gives up (`give_up`). True if that ended its cleanup.
    pub fn cleanup_event(&mut self, job: u64, now_ns: u64, give_up: bool) -> bool {
        let w = &self.spec.worker;
        let allowance_ns = ms_to_ns(w.allowance_ms);
        let Some(j) = self.live.get_mut(&job) else {
            return false;
        };
        let Some(c) = j.cleanup.as_mut() else {
            return false;
        };
        if c.done() {
            return false;
        }
        match give_up {
            false => c.local_done(),
            true => c.give_up(),
        }
        c.settle(now_ns, allowance_ns, w.allowances_max)
    }

    /// The job's call left the world, with its true and seen usage. True if its stream was a
    /// cleanup resource and that ended the cleanup.
    pub fn call_left(&mut self, job: u64, id: u64, now_ns: u64, left: CallLeft) -> bool {
        let allowance_ns = ms_to_ns(self.spec.worker.allowance_ms);
        let max = self.spec.worker.allowances_max;
        let over = self.bug(2) as u64;
        let j = self.job(job);
        j.calls_out -= 1;
        j.usage.reported.output += over;
        // Still its strand's call: the job was decided while it ran (else it ended before).
        let current = j.strand_of_call(id);
        let (seen, gpu_at_decision, gpu_at_close) = match current {
            Some(s) => {
                let c = j.call_mut(s);
                (c.seen_at_decision, c.gpu_ns_at_decision, c.gpu_ns_at_close)
            }
            None => (None, left.gpu_ns, None),
        };
        let seen_out = seen.unwrap_or(left.received).min(left.received);
        j.usage.truth.input += if left.started { left.prompt as u64 } else { 0 };
        j.usage.truth.output += (left.received + left.late) as u64;
        j.usage.reported.input += if seen_out > 0 { left.prompt as u64 } else { 0 };
        j.usage.reported.output += seen_out as u64;
        if seen.is_some() {
            let until_close = gpu_at_close.unwrap_or(left.gpu_ns);
            j.usage.leaked_ns += (until_close - gpu_at_decision).max(0.0) + left.leaked_ns;
        }
        if let Some(s) = current.filter(|_| j.state.is_terminal()) {
            j.clear_wait(s, false);
        }
        let Some(c) = j.cleanup.as_mut() else {
            return false;
        };
        // Only a stream the worker closed is a cleanup resource.
        if c.done() || gpu_at_close.is_none() {
            return false;
        }
        c.stream_closed(now_ns);
        c.settle(now_ns, allowance_ns, max)
    }

    /// The job is over (terminal, every call gone, its cleanup settled): into the books, and out,
    /// with its status row (the policy left for the recorder). None if it is not over yet.
    pub fn try_leave(&mut self, job: u64) -> Result<Option<JobRow>, String> {
        let Some(j) = self.live.get(&job) else {
            return Ok(None);
        };
        let settled = j.cleanup.as_ref().is_none_or(Cleanup::done);
        let decided = matches!(j.state, JobState::Cancelled | JobState::Expired);
        if !j.state.is_terminal() || j.calls_out > 0 || !settled || (decided && j.cleanup.is_none())
        {
            return Ok(None);
        }
        let j = self.live.remove(&job).expect("a live job");
        let complete = j.state == JobState::Completed && !j.interrupted;
        audit::usage(job, j.usage.truth, j.usage.reported, complete)?;
        audit::attempts(job, j.attempts)?;
        self.books.provider_attempts += j.attempts as u64;
        let settled = j.settle_waves();
        self.books.settled(settled);
        let row = j.row(job, settled, self.spec.prices.as_ref());
        (self.books).left(j.state, &j.usage, j.cleanup.as_ref(), row.cost());
        (self.books.observers).job_left(j.watch, j.state, j.decided_ns);
        if j.cancels_pending > 0 {
            self.gone.insert(job, (j.state, j.cancels_pending));
        }
        Ok(Some(row))
    }

    /// A cancel for job `job` arrives (copy `copy` of its idempotency key): whether to decide.
    pub fn cancel_arrives(&mut self, job: u64, copy: u8) -> bool {
        if copy > 0 {
            self.books.cancel_duplicates += 1;
        }
        if let Some(j) = self.live.get_mut(&job) {
            j.cancels_pending -= 1;
            return copy == 0;
        }
        let Some((state, pending)) = self.gone.get_mut(&job) else {
            return false;
        };
        if copy == 0 && *state == JobState::Completed {
            self.books.completion_won += 1;
        }
        *pending -= 1;
        if *pending == 0 {
            self.gone.remove(&job);
        }
        false
    }

    pub fn note_intent(&mut self, job: u64) {
        if let Some(j) = self.live.get_mut(&job) {
            j.intents += 1;
        }
    }

    pub fn group_hit(&self, job: u64) -> bool {
        self.live.get(&job).is_some_and(|j| j.intents > 0)
    }

    pub fn all_ended(&self) -> bool {
        self.live.is_empty()
    }
}

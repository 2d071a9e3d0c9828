//! One durable agent job's own state: where each strand of its plan is, what it waits on (a
//! call, a timer), its tool waves and its books. `jobs.rs` drives it.

use super::event::{Event, Tag};
use super::follow::Follow;
use super::job_audit::{self as audit, JobState};
use super::job_books::{Cleanup, Settled, Usage};
use super::job_observer::Watch;
use super::job_plan::Plan;
use crate::dist::{ms_to_ns, Dist};
use crate::kernel::rng::{Purpose, Stream};
use crate::record::JobRow;
use crate::scenario::{Prices, Workload};
use crate::workload::{self, Arrival, TOKENS_MAX};

/// A provider call's request id: the job's block of `per_job` ids (the attempts it may journal),
/// then the call's serial within it. Dense, like an open-loop source's ids, so the
/// counterfactual's table of a million calls is a vector, not a map (a run has one source, so
/// no other id can collide).
pub(crate) fn call_id(job: u64, serial: u32, per_job: u64) -> u64 {
    debug_assert!((serial as u64) < per_job);
    job * per_job + serial as u64
}

/// What a strand of a job waits on.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Wait {
    Nothing,
    Call(Call),
    /// A tool wave or an approval, ended by the timer of this serial.
    Timer(u32),
    /// The step after a call, at once (an event of its own: a request's end never runs the
    /// next request's arrival inside it).
    Resume(u32),
}

/// A provider call in progress.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Call {
    pub(super) id: u64,
    pub(super) tag: Option<Tag>,
    pub(super) message: u32,
    pub(super) output: u32,
    /// Output tokens the job had seen, and the call's GPU ns, at the decision.
    pub(super) seen_at_decision: Option<u32>,
    pub(super) gpu_ns_at_decision: f64,
    /// Its GPU ns when the worker closed its stream, if it did: then it is a cleanup resource.
    pub(super) gpu_ns_at_close: Option<f64>,
}

/// A run of a job's plan: its place, what it waits on, its tool wave. A drawn plan has one; a
/// recorded session one per call, started once the strands it waits for finished.
#[derive(Clone, Debug)]
pub(super) struct Strand {
    pub(super) pc: u32,
    end: u32,
    /// Strands it still waits for.
    waits: u32,
    finished: bool,
    /// The current call's attempts.
    pub(super) tries: u32,
    pub(super) wait: Wait,
    /// The current or last tool wave: each tool's end and whether it has an external effect.
    pub(super) wave: Vec<(u64, bool)>,
    /// The wave is in flight (its timer has not ended it).
    pub(super) wave_open: bool,
    /// Its tools are developer-hosted: outside the sandbox, their results submissions.
    wave_hosted: bool,
}

impl Strand {
    pub(super) fn at_end(&self) -> bool {
        self.pc >= self.end
    }

    fn wave_end_ns(&self) -> u64 {
        self.wave.iter().map(|t| t.0).max().unwrap_or(0)
    }
}

pub(crate) struct Job {
    pub(super) accepted_ns: u64,
    pub(super) deadline_ns: u64,
    pub(super) state: JobState,
    pub(super) decided_ns: u64,
    pub(super) history: u64,
    /// Provider attempts journalled.
    pub(super) attempts: u32,
    pub(super) serial: u32,
    pub(super) timers: u32,
    pub(super) strands: Vec<Strand>,
    /// Strands that wait on something (a call, a timer), and those free to run on, in order.
    active: Vec<u32>,
    ready: std::collections::VecDeque<u32>,
    finished: u32,
    pub(super) sandbox: bool,
    /// Calls admitted that have not left the world.
    pub(super) calls_out: u32,
    /// Its own calls' cancel intents: they are its group, not siblings of it.
    pub(super) intents: u32,
    pub(super) interrupted: bool,
    pub(super) usage: Usage,
    pub(super) cleanup: Option<Cleanup>,
    pub(super) cancels_pending: u32,
    pub(super) watch: Watch,
    /// External effects its finished tool waves committed.
    pub(super) effects_done: u64,
}

/// What the world knows of a call as it leaves.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct CallLeft {
    pub started: bool,
    pub prompt: u32,
    /// Output tokens it received (up to its output; late ones too), and the late ones its
    /// replica sampled and threw away itself.
    pub received: u32,
    pub late: u32,
    pub gpu_ns: f64,
    /// GPU work after its own cancel intent.
    pub leaked_ns: f64,
}

impl Job {
    pub(super) fn new(at_ns: (u64, u64), cancels_pending: u32, plan: &Plan) -> Job {
        let (accepted_ns, deadline_ns) = at_ns;
        let strands: Vec<Strand> = plan
            .strands
            .iter()
            .zip(&plan.waits)
            .map(|(&(pc, end), &waits)| Strand {
                pc,
                end,
                waits,
                finished: false,
                tries: 0,
                wait: Wait::Nothing,
                wave: Vec::new(),
                wave_open: false,
                wave_hosted: false,
            })
            .collect();
        let ready = (0..strands.len() as u32)
            .filter(|&s| strands[s as usize].waits == 0)
            .collect();
        Job {
            accepted_ns,
            deadline_ns,
            state: JobState::Running,
            decided_ns: 0,
            history: 0,
            attempts: 0,
            serial: 0,
            timers: 0,
            strands,
            active: Vec::new(),
            ready,
            finished: 0,
            sandbox: false,
            calls_out: 0,
            intents: 0,
            interrupted: false,
            usage: Usage::default(),
            cleanup: None,
            cancels_pending,
            watch: Watch::Watching,
            effects_done: 0,
        }
    }

    /// The next strand free to run on, if any.
    pub(super) fn next_ready(&mut self) -> Option<usize> {
        self.ready.pop_front().map(|s| s as usize)
    }

    /// Every strand finished: the plan is done.
    pub(super) fn all_finished(&self) -> bool {
        self.finished as usize == self.strands.len()
    }

    /// Strand `s` reached its end: the strands that wait for it, once free, run on in order.
    pub(super) fn finish(&mut self, s: usize, plan: &Plan) {
        let st = &mut self.strands[s];
        assert!(st.at_end() && !st.finished, "a strand finished twice");
        st.finished = true;
        self.finished += 1;
        for &t in &plan.then[s] {
            let w = &mut self.strands[t as usize];
            w.waits -= 1;
            if w.waits == 0 {
                self.ready.push_back(t);
            }
        }
    }

    pub(super) fn set_wait(&mut self, s: usize, w: Wait) {
        debug_assert!(w != Wait::Nothing);
        if self.strands[s].wait == Wait::Nothing {
            self.active.push(s as u32);
        }
        self.strands[s].wait = w;
    }

    /// Strand `s` waits on nothing now; `run_on`: it is free to run on.
    pub(super) fn clear_wait(&mut self, s: usize, run_on: bool) {
        self.strands[s].wait = Wait::Nothing;
        self.active.retain(|&a| a as usize != s);
        if run_on {
            self.ready.push_back(s as u32);
        }
    }

    /// The strand whose wait `hit` matches.
    pub(super) fn find(&self, hit: impl Fn(&Wait) -> bool) -> Option<usize> {
        let a = self
            .active
            .iter()
            .find(|&&a| hit(&self.strands[a as usize].wait))?;
        Some(*a as usize)
    }

    /// The strand waiting on call `id`.
    pub(super) fn strand_of_call(&self, id: u64) -> Option<usize> {
        self.find(|w| matches!(w, Wait::Call(c) if c.id == id))
    }

    /// The strands with a call in progress, in the order their calls were dispatched.
    pub(super) fn call_strands(&self) -> Vec<usize> {
        let mut v: Vec<(u64, usize)> = (self.active.iter())
            .filter_map(|&a| match self.strands[a as usize].wait {
                Wait::Call(c) => Some((c.id, a as usize)),
                _ => None,
            })
            .collect();
        v.sort_unstable();
        v.into_iter().map(|x| x.1).collect()
    }

    pub(super) fn call_mut(&mut self, s: usize) -> &mut Call {
        match &mut self.strands[s].wait {
            Wait::Call(c) => c,
            w => panic!("strand {s} waits on {w:?}, not a call"),
        }
    }

    /// Journal a provider attempt, then the call to admit, for strand `s`.
    pub(super) fn call(
        &mut self,
        (s, w, seed): (usize, &Workload, u64),
        (job, per_job): (u64, u64),
        (now_ns, fixed): (u64, Option<(u32, u32)>),
    ) -> Result<(Arrival, u32), String> {
        self.attempts += 1;
        audit::attempts(job, self.attempts)?;
        self.strands[s].tries += 1;
        let serial = self.serial;
        let id = call_id(job, serial, per_job);
        self.serial += 1;
        let (message, output) = fixed.unwrap_or_else(|| workload::shape(w, seed, id));
        let prompt = match fixed {
            // A recorded prompt holds its context already.
            Some((input, _)) => input,
            None => (self.history + message as u64).clamp(1, TOKENS_MAX as u64) as u32,
        };
        let call = Call {
            id,
            tag: None,
            message,
            output,
            seen_at_decision: None,
            gpu_ns_at_decision: 0.0,
            gpu_ns_at_close: None,
        };
        self.set_wait(s, Wait::Call(call));
        let a = Arrival {
            id,
            time_ns: now_ns,
            prompt_tokens: prompt,
            output_tokens: output,
        };
        Ok((a, serial))
    }

    /// Strand `s` starts a tool wave; returns when its last tool ends.
    pub(super) fn wave(
        &mut self,
        (s, seed, job): (usize, u64, u64),
        now_ns: u64,
        (tools, d, effect_p, hosted): (u32, &Dist, f64, bool),
    ) -> u64 {
        let st = &mut self.strands[s];
        let mut r = Stream::keyed(seed, Purpose::Job, job, st.pc as u64);
        st.wave.clear();
        for _ in 0..tools {
            let end = now_ns.saturating_add(ms_to_ns(d.sample(&mut r)));
            let effect = r.uniform_open01() < effect_p;
            st.wave.push((end, effect));
        }
        st.wave_open = true;
        st.wave_hosted = hosted;
        // Developer-hosted tools run in the developer's system: the job owns no sandbox for them.
        self.sandbox |= !hosted;
        st.wave_end_ns()
    }

    /// When the tool waves in flight that a cleanup drains end (`None`: none is). Developer-
    /// hosted tools are not the worker's to drain.
    pub(super) fn waves_end_ns(&self) -> Option<u64> {
        let open = self
            .strands
            .iter()
            .filter(|st| st.wave_open && !st.wave_hosted);
        open.map(Strand::wave_end_ns).max()
    }

    /// Strand `s` waits on a timer at `at_ns` (a tool wave's end, an approval's).
    pub(super) fn timer(&mut self, s: usize, f: &mut Follow, job: u64, at_ns: u64) {
        let serial = self.timers;
        self.timers += 1;
        self.set_wait(s, Wait::Timer(serial));
        f.at(at_ns, Event::JobTimer { job, serial });
    }

    /// The waves in flight at the decision, once the cleanup settled. A sandboxed tool's
    /// result after the decision is journalled, never admitted; one past the cleanup's end
    /// leaves its effect unknown. A developer-hosted tool's result after the decision is a
    /// submission the terminal job rejects: its effect awaits the external system.
    pub(super) fn settle_waves(&self) -> Settled {
        let resolved_ns = self
            .cleanup
            .as_ref()
            .map_or(u64::MAX, Cleanup::resolved_until_ns);
        let mut out = Settled::default();
        let open = self.strands.iter().filter(|st| st.wave_open);
        for st in open {
            for &(end_ns, effect) in &st.wave {
                let after = end_ns > self.decided_ns;
                if st.wave_hosted && after {
                    out.rejected += 1;
                    out.awaiting += effect as u64;
                } else if end_ns > resolved_ns {
                    out.unknown += effect as u64;
                } else {
                    out.done += effect as u64;
                    out.late += after as u64;
                }
            }
        }
        out
    }
}

impl Job {
    /// Its status row as it leaves (`policy` left for the recorder to fill), with the effects
    /// its last waves settled.
    pub(super) fn row(&self, job: u64, settled: Settled, prices: Option<&Prices>) -> JobRow {
        let ms = |ns: u64| ns as f64 / 1e6;
        let cleanup = self.cleanup.as_ref().map(Cleanup::outcome);
        let (u, state) = (&self.usage, self.state);
        let usage_complete = u.complete(state);
        JobRow {
            policy: String::new(),
            job,
            status: state.as_str(),
            accepted_ms: ms(self.accepted_ns),
            ended_ms: ms(self.decided_ns),
            deadline_ms: ms(self.deadline_ns),
            provider_attempts: self.attempts,
            observed_input_tokens: u.reported.input,
            observed_output_tokens: u.reported.output,
            true_input_tokens: u.truth.input,
            true_output_tokens: u.truth.output,
            usage_complete,
            reported_cost_usd: prices.map(|p| p.usd(u.reported.input, u.reported.output)),
            true_cost_usd: prices.map(|p| p.usd(u.truth.input, u.truth.output)),
            cost_complete: prices.map(|_| usage_complete),
            effects_completed: self.effects_done + settled.done,
            effects_unknown: settled.unknown,
            effects_awaiting_external: settled.awaiting,
            cleanup_complete: cleanup.map(|c| c.0),
            cleanup_reason: cleanup.map(|_| match state {
                JobState::Expired => "run_expired",
                _ => "run_cancelled",
            }),
            cleanup_shortfall: cleanup.and_then(|c| c.1),
            cleanup_ms: cleanup.map(|c| ms(c.2)),
            allowances_used: cleanup.map(|c| c.3),
            leaked_gpu_ms: u.leaked_ns / 1e6,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn call_ids_are_dense_and_one_per_attempt() {
        let ids: std::collections::BTreeSet<u64> = (0..4u64)
            .flat_map(|job| (0..3u32).map(move |k| call_id(job, k, 3)))
            .collect();
        assert_eq!(ids, (0..12).collect(), "12 attempts, 12 ids, no gap");
    }
}

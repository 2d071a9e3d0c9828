//! One durable agent job's own state: where it is in its plan (unrolled once per run), what it
//! waits on, its current call, its tool wave and its books. `jobs.rs` drives it.

use super::event::{Event, Tag};
use super::follow::Follow;
use super::job_audit::{self as audit, JobState};
use super::job_books::{Cleanup, Usage};
use super::jobs::Next;
use crate::dist::{ms_to_ns, Dist};
use crate::kernel::rng::{Purpose, Stream};
use crate::scenario::{JobSpec, PlanStep, Workload};
use crate::workload::{self, Arrival, TOKENS_MAX};

/// One step of a plan, subagents and repeats unrolled (once per run, shared by every job).
#[derive(Clone, Debug)]
pub(super) enum Op {
    Call,
    /// A recorded call: its prompt (its context included) and output lengths.
    Fixed {
        input: u32,
        output: u32,
    },
    Tools {
        tools: u32,
        duration_ms: Dist,
        effect_p: f64,
    },
    Approval {
        wait_ms: Dist,
    },
    /// A subagent starts (`Enter`) or ends (`Exit`): the child inherits the remaining deadline.
    Enter,
    Exit,
}

/// Unrolled steps a plan may have (a plan past it is refused at load).
pub(crate) const OPS_MAX: usize = crate::scenario::STEPS_MAX as usize;

pub(super) fn unroll(plan: &[PlanStep], spec: &JobSpec, out: &mut Vec<Op>) {
    for s in plan {
        assert!(out.len() <= OPS_MAX, "a plan unrolled past its bound");
        match s {
            PlanStep::Call => out.push(Op::Call),
            PlanStep::Tools {
                tools,
                duration_ms,
                effect_probability,
            } => out.push(Op::Tools {
                tools: *tools,
                duration_ms: duration_ms.clone(),
                effect_p: *effect_probability,
            }),
            PlanStep::Approval { wait_ms } => out.push(Op::Approval {
                wait_ms: wait_ms.clone(),
            }),
            PlanStep::Subagent(name) => {
                out.push(Op::Enter);
                unroll(&spec.agents[name], spec, out);
                out.push(Op::Exit);
            }
            PlanStep::Repeat { times, steps } => {
                for _ in 0..*times {
                    unroll(steps, spec, out);
                }
            }
        }
    }
}

/// A recorded session's calls as a plan: before each call after the first, its tool work (a
/// one-tool wave, in the job's sandbox) and the client's own wait.
pub(super) fn recorded(calls: &[crate::workload::agentic::TraceCall]) -> Vec<Op> {
    let ms = |ns: u64| Dist::Constant(ns as f64 / 1e6);
    let mut ops = Vec::with_capacity(calls.len());
    for c in calls {
        if c.tool_ns > 0 {
            ops.push(Op::Tools {
                tools: 1,
                duration_ms: ms(c.tool_ns),
                effect_p: 0.0,
            });
        }
        if c.wait_ns > 0 {
            ops.push(Op::Approval {
                wait_ms: ms(c.wait_ns),
            });
        }
        ops.push(Op::Fixed {
            input: c.input_tokens,
            output: c.output_tokens,
        });
    }
    ops
}

/// A provider call's request id: the job's block of `per_job` ids (the attempts it may journal),
/// then the call's serial within it. Dense, like an open-loop source's ids, so the
/// counterfactual's table of a million calls is a vector, not a map (a run has one source, so
/// no other id can collide).
pub(crate) fn call_id(job: u64, serial: u32, per_job: u64) -> u64 {
    debug_assert!((serial as u64) < per_job);
    job * per_job + serial as u64
}

/// What a job waits on.
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

/// The provider call in progress.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Call {
    pub(super) id: u64,
    pub(super) tag: Option<Tag>,
    pub(super) message: u32,
    pub(super) output: u32,
    /// Output tokens the job had seen, and the call's GPU ns, at the decision.
    pub(super) seen_at_decision: Option<u32>,
    pub(super) gpu_ns_at_decision: f64,
    /// Its GPU ns when the worker closed its stream, if it did.
    pub(super) gpu_ns_at_close: Option<f64>,
}

pub(crate) struct Job {
    pub(super) accepted_ns: u64,
    pub(super) deadline_ns: u64,
    pub(super) state: JobState,
    pub(super) decided_ns: u64,
    pub(super) pc: u32,
    pub(super) history: u64,
    /// Provider attempts journalled, and the current call's attempts.
    pub(super) attempts: u32,
    pub(super) tries: u32,
    pub(super) serial: u32,
    pub(super) wait: Wait,
    pub(super) timers: u32,
    /// The current or last tool wave: each tool's end and whether it has an external effect.
    pub(super) wave: Vec<(u64, bool)>,
    /// The wave is in flight (its timer has not ended it).
    pub(super) wave_open: bool,
    pub(super) sandbox: bool,
    /// Calls admitted that have not left the world.
    pub(super) calls_out: u32,
    /// Its own calls' cancel intents: they are its group, not siblings of it.
    pub(super) intents: u32,
    pub(super) interrupted: bool,
    pub(super) usage: Usage,
    pub(super) cleanup: Option<Cleanup>,
    pub(super) cancels_pending: u32,
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
    pub(super) fn new(accepted_ns: u64, deadline_ns: u64, cancels_pending: u32) -> Job {
        Job {
            accepted_ns,
            deadline_ns,
            state: JobState::Running,
            decided_ns: 0,
            pc: 0,
            history: 0,
            attempts: 0,
            tries: 0,
            serial: 0,
            wait: Wait::Nothing,
            timers: 0,
            wave: Vec::new(),
            wave_open: false,
            sandbox: false,
            calls_out: 0,
            intents: 0,
            interrupted: false,
            usage: Usage::default(),
            cleanup: None,
            cancels_pending,
        }
    }

    /// Journal a provider attempt, then the call to admit.
    pub(super) fn call(
        &mut self,
        w: &Workload,
        seed: u64,
        (job, per_job): (u64, u64),
        (now_ns, fixed): (u64, Option<(u32, u32)>),
    ) -> Result<(Arrival, u32), String> {
        self.attempts += 1;
        audit::attempts(job, self.attempts)?;
        self.tries += 1;
        let serial = self.serial;
        let id = call_id(job, serial, per_job);
        self.serial += 1;
        let (message, output) = fixed.unwrap_or_else(|| workload::shape(w, seed, id));
        let prompt = match fixed {
            // A recorded prompt holds its context already.
            Some((input, _)) => input,
            None => (self.history + message as u64).clamp(1, TOKENS_MAX as u64) as u32,
        };
        self.wait = Wait::Call(Call {
            id,
            tag: None,
            message,
            output,
            seen_at_decision: None,
            gpu_ns_at_decision: 0.0,
            gpu_ns_at_close: None,
        });
        let a = Arrival {
            id,
            time_ns: now_ns,
            prompt_tokens: prompt,
            output_tokens: output,
        };
        Ok((a, serial))
    }

    pub(super) fn wave(
        &mut self,
        seed: u64,
        job: u64,
        now_ns: u64,
        (tools, d, effect_p): (u32, &Dist, f64),
    ) {
        let mut s = Stream::keyed(seed, Purpose::Job, job, self.pc as u64);
        self.wave.clear();
        for _ in 0..tools {
            let end = now_ns.saturating_add(ms_to_ns(d.sample(&mut s)));
            let effect = s.uniform_open01() < effect_p;
            self.wave.push((end, effect));
        }
        self.wave_open = true;
        self.sandbox = true;
    }

    pub(super) fn wave_end_ns(&self) -> u64 {
        self.wave.iter().map(|t| t.0).max().unwrap_or(0)
    }

    pub(super) fn timer(&mut self, f: &mut Follow, job: u64, at_ns: u64) -> Next {
        let serial = self.timers;
        self.timers += 1;
        self.wait = Wait::Timer(serial);
        f.at(at_ns, Event::JobTimer { job, serial });
        Next::Waiting
    }

    /// The wave in flight at the decision, once the cleanup settled: effects completed, results
    /// that came after the decision (journalled, never admitted), effects left unknown.
    pub(super) fn settle_wave(&self) -> (u64, u64, u64) {
        if !self.wave_open {
            return (0, 0, 0);
        }
        let resolved_ns = self
            .cleanup
            .as_ref()
            .map_or(u64::MAX, Cleanup::resolved_until_ns);
        let (mut done, mut late, mut unknown) = (0, 0, 0);
        for &(end_ns, effect) in &self.wave {
            if end_ns > resolved_ns {
                unknown += effect as u64;
                continue;
            }
            done += effect as u64;
            late += (end_ns > self.decided_ns) as u64;
        }
        (done, late, unknown)
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

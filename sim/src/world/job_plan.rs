//! A job's plan, unrolled once per run and shared by every job: its steps (subagents and
//! repeats unrolled) in strands. A drawn plan is one strand. A recorded session has a strand
//! per call (its tool work, its client's wait, then the call), each starting once the calls it
//! waits for completed, so the branches of one job run side by side.

use crate::dist::Dist;
use crate::scenario::{JobSpec, PlanStep};
use crate::workload::agentic::TraceCall;

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

fn unroll(plan: &[PlanStep], spec: &JobSpec, out: &mut Vec<Op>) {
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

/// A plan: its steps, and its strands, each a run of them.
#[derive(Clone, Debug)]
pub(super) struct Plan {
    pub ops: Vec<Op>,
    /// Each strand's steps, `ops[start..end]`.
    pub strands: Vec<(u32, u32)>,
    /// The strands each strand waits for (a count), and those that wait for each.
    pub waits: Vec<u32>,
    pub then: Vec<Vec<u32>>,
}

impl Plan {
    /// A drawn plan: one strand.
    pub fn drawn(plan: &[PlanStep], spec: &JobSpec) -> Plan {
        let mut ops = Vec::new();
        unroll(plan, spec, &mut ops);
        Plan {
            strands: vec![(0, ops.len() as u32)],
            ops,
            waits: vec![0],
            then: vec![Vec::new()],
        }
    }

    /// A recorded session: a strand per call.
    pub fn recorded(calls: &[TraceCall]) -> Plan {
        let mut ops = Vec::with_capacity(calls.len());
        let mut strands = Vec::with_capacity(calls.len());
        let mut then = vec![Vec::new(); calls.len()];
        for (k, c) in calls.iter().enumerate() {
            let start = ops.len() as u32;
            recorded_call(c, &mut ops);
            strands.push((start, ops.len() as u32));
            for &d in &c.after {
                assert!((d as usize) < k, "a call waits for a later one");
                then[d as usize].push(k as u32);
            }
        }
        let waits = calls.iter().map(|c| c.after.len() as u32).collect();
        Plan {
            ops,
            strands,
            waits,
            then,
        }
    }
}

/// A recorded call's steps: its tool work (a one-tool wave, in the job's sandbox), the client's
/// own wait, then the call.
fn recorded_call(c: &TraceCall, ops: &mut Vec<Op>) {
    let ms = |ns: u64| Dist::Constant(ns as f64 / 1e6);
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

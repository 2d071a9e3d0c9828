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
    /// A recorded call: its prompt (its context included) and output lengths, and its
    /// prompt's block ids for the prefix cache (none: the cache keys nothing for it).
    Fixed {
        input: u32,
        output: u32,
        prefix: Box<[u64]>,
    },
    Tools {
        tools: u32,
        duration_ms: Dist,
        effect_p: f64,
        hosted: bool,
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

/// A drawn plan as it unrolls: steps go into the open strand; a `Parallel` step closes it,
/// opens a strand per branch (each waiting for it), then a strand that waits for every branch.
struct Unroll<'a> {
    spec: &'a JobSpec,
    ops: Vec<Op>,
    strands: Vec<(u32, u32)>,
    after: Vec<Vec<u32>>,
}

impl Unroll<'_> {
    /// Open a strand after `after`; its steps start here.
    fn open(&mut self, after: Vec<u32>) -> u32 {
        let at = self.ops.len() as u32;
        self.strands.push((at, at));
        self.after.push(after);
        self.strands.len() as u32 - 1
    }

    /// Unroll `plan` into strand `cur`; returns the strand open at its end.
    fn steps(&mut self, plan: &[PlanStep], mut cur: u32) -> u32 {
        for s in plan {
            assert!(self.ops.len() <= OPS_MAX, "a plan unrolled past its bound");
            match s {
                PlanStep::Call => self.ops.push(Op::Call),
                PlanStep::Tools {
                    tools,
                    duration_ms,
                    effect_probability,
                    developer_hosted,
                } => self.ops.push(Op::Tools {
                    tools: *tools,
                    duration_ms: duration_ms.clone(),
                    effect_p: *effect_probability,
                    hosted: *developer_hosted,
                }),
                PlanStep::Approval { wait_ms } => self.ops.push(Op::Approval {
                    wait_ms: wait_ms.clone(),
                }),
                PlanStep::Subagent(name) => {
                    self.ops.push(Op::Enter);
                    cur = self.steps(&self.spec.agents[name], cur);
                    self.ops.push(Op::Exit);
                }
                PlanStep::Repeat { times, steps } => {
                    for _ in 0..*times {
                        cur = self.steps(steps, cur);
                    }
                }
                PlanStep::Parallel(branches) => cur = self.fork(branches, cur),
            }
            self.strands[cur as usize].1 = self.ops.len() as u32;
        }
        cur
    }

    fn fork(&mut self, branches: &[Vec<PlanStep>], before: u32) -> u32 {
        self.strands[before as usize].1 = self.ops.len() as u32;
        let mut tails = Vec::with_capacity(branches.len());
        for b in branches {
            let first = self.open(vec![before]);
            let tail = self.steps(b, first);
            self.strands[tail as usize].1 = self.ops.len() as u32;
            tails.push(tail);
        }
        self.open(tails)
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
    /// A drawn plan: one strand, and one more per branch and join of its `Parallel` steps.
    pub fn drawn(plan: &[PlanStep], spec: &JobSpec) -> Plan {
        let mut u = Unroll {
            spec,
            ops: Vec::new(),
            strands: Vec::new(),
            after: Vec::new(),
        };
        let first = u.open(Vec::new());
        u.steps(plan, first);
        Plan::new(u.ops, u.strands, &u.after)
    }

    fn new(ops: Vec<Op>, strands: Vec<(u32, u32)>, after: &[Vec<u32>]) -> Plan {
        let mut then = vec![Vec::new(); strands.len()];
        for (k, a) in after.iter().enumerate() {
            for &d in a {
                assert!((d as usize) < k, "a strand waits for a later one");
                then[d as usize].push(k as u32);
            }
        }
        let waits = after.iter().map(|a| a.len() as u32).collect();
        Plan {
            ops,
            strands,
            waits,
            then,
        }
    }

    /// A recorded session: a strand per call.
    pub fn recorded(calls: &[TraceCall]) -> Plan {
        let mut ops = Vec::with_capacity(calls.len());
        let mut strands = Vec::with_capacity(calls.len());
        for c in calls {
            let start = ops.len() as u32;
            recorded_call(c, &mut ops);
            strands.push((start, ops.len() as u32));
        }
        let after: Vec<Vec<u32>> = calls.iter().map(|c| c.after.clone()).collect();
        Plan::new(ops, strands, &after)
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
            hosted: false,
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
        prefix: c.hash_ids.clone(),
    });
}

//! What a run records while it runs, if asked: gauge samples on the virtual clock, one row per
//! request to a streaming sink, and Chrome trace events. Recording adds no event, so it cannot
//! change a run.

use cancelsim_models::ownership::{EvidenceLevel, State};
use cancelsim_models::protocol::{Dispatch, Gauges};

use super::cluster::Cluster;
use super::requests::Req;
use crate::kernel::NS_PER_S;
use crate::record::{
    Extras, JobRow, PoolSample, Recording, RequestRow, Sample, TraceArgs, TraceEvent, TraceLog,
    CANCELS_TID, POOL_SAMPLES_MAX, SAMPLES_MAX,
};

pub(crate) struct Recorder<'r> {
    opts: Recording<'r>,
    extras: Extras,
    next_sample_ns: u64,
    /// Flows drawn so far: flow ids are global in a trace, so each is `pid << 32 | counter`.
    flows: u32,
    /// Scratch for a sample's pool gauges.
    pools: Vec<Gauges>,
}

/// How a request left, for its row and its track.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Left {
    pub state: State,
    pub sibling: bool,
    pub survived: Option<bool>,
    pub now_ns: u64,
    /// The id its runtime knew it by.
    pub runtime_id: u64,
}

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

impl<'r> Recorder<'r> {
    pub fn new(opts: Recording<'r>) -> Recorder<'r> {
        let trace = opts.trace.is_some().then(TraceLog::default);
        Recorder {
            opts,
            extras: Extras {
                trace,
                ..Extras::default()
            },
            next_sample_ns: 0,
            flows: 0,
            pools: Vec::new(),
        }
    }

    /// Tell the progress callback, if any, how many requests have arrived in this run.
    pub fn progress(&self, arrived: u64) {
        if let Some(p) = &self.opts.progress {
            p(self.opts.trace_pid, arrived);
        }
    }

    /// Whether samples are taken at all (the per-event check is this cheap).
    pub fn sampling(&self) -> bool {
        self.opts.sample_ns > 0
    }

    /// Whether `sample_until(now_ns)` would take a sample.
    pub fn sample_due(&self, now_ns: u64) -> bool {
        self.sampling()
            && self.next_sample_ns < now_ns
            && self.extras.timeseries.len() < SAMPLES_MAX
    }

    /// The boundary the next sample is taken at.
    pub fn next_sample_ns(&self) -> u64 {
        self.next_sample_ns
    }

    /// The sample at the next boundary (`sample_due`), of the gauges as they are: the state
    /// between the events before the boundary and those after.
    pub fn sample_once(&mut self, cluster: &Cluster, in_flight: u64) {
        debug_assert!(self.sampling());
        let step = self.opts.sample_ns;
        let (g, [pinned_prefill, pinned_decode]) = cluster.gauges();
        let t_s = self.next_sample_ns as f64 / NS_PER_S as f64;
        self.pools.clear();
        cluster.pool_gauges(&mut self.pools);
        if self.extras.pool_timeseries.len() + self.pools.len() > POOL_SAMPLES_MAX {
            self.pools.clear(); // whole samples or none: `pools.csv` stops here
        }
        let pools = self.pools.iter().enumerate();
        self.extras
            .pool_timeseries
            .extend(pools.map(|(i, p)| PoolSample {
                t_s,
                pool: i as u32,
                kv_blocks: p.kv_blocks,
                kv_retained: p.kv_retained,
                kv_pinned: p.kv_pinned,
                queue: p.waiting,
                running: p.running,
            }));
        self.extras.timeseries.push(Sample {
            kv_pinned_prefill: pinned_prefill,
            kv_pinned_decode: pinned_decode,
            t_s,
            kv_blocks: g.kv_blocks,
            kv_retained: g.kv_retained,
            queue: g.waiting,
            running: g.running,
            cancels_in_flight: in_flight,
        });
        self.next_sample_ns += step;
    }

    /// Send a group of events (a step, or a request's track and flow) whole or not at all, so a
    /// cut trace stays well formed; after the first group dropped, every later one is dropped
    /// too, so the trace is a prefix of the run in recording order.
    fn trace(&mut self, group: &[TraceEvent]) {
        let (Some(log), Some(sink)) = (&mut self.extras.trace, self.opts.trace.as_deref_mut())
        else {
            return;
        };
        let n = group.len() as u64;
        if log.dropped == 0 && log.kept + n <= self.opts.trace_events_max {
            for ev in group {
                sink.event(ev);
            }
            log.kept += n;
            return;
        }
        if log.cut_at_us.is_none() {
            log.cut_at_us = group.iter().filter_map(|e| e.ts).min();
        }
        log.dropped += n;
    }

    /// Whether a trace is being written: a step has a slice there.
    pub fn traces(&self) -> bool {
        self.extras.trace.is_some()
    }

    /// A step was dispatched on `replica`: a slice on its thread.
    pub fn step(&mut self, replica: u32, d: &Dispatch) {
        if !self.traces() {
            return;
        }
        let pid = self.opts.trace_pid;
        let (start, end) = (d.start_ns / 1000, d.end_ns / 1000);
        self.trace(&[TraceEvent {
            cat: Some("gpu"),
            dur: Some(end - start),
            args: Some(TraceArgs::Step { step: d.step }),
            ..TraceEvent::at("X", "step", pid, replica, start)
        }]);
    }

    /// A request leaves: its row to the sink, its track and cancel flow to the trace.
    pub fn left(&mut self, q: &Req, policy: &str, how: Left) {
        let disposition = if q.life.rejected() {
            "rejected"
        } else {
            how.state.as_str()
        };
        if let Some(sink) = self.opts.sink.as_deref_mut() {
            sink.row(&row(q, policy, disposition, how));
        }
        if self.extras.trace.is_none() {
            return;
        }
        let pid = self.opts.trace_pid;
        let name = format!("request {}", q.id);
        let track = |ph, ts_ns: u64| TraceEvent {
            cat: Some("request"),
            id: Some(q.id),
            ..TraceEvent::at(ph, name.clone(), pid, 0, ts_ns / 1000)
        };
        let begin = track("b", q.arrival_ns);
        let end = TraceEvent {
            args: Some(TraceArgs::Outcome {
                disposition,
                sibling: how.sibling,
                survived: how.survived,
            }),
            ..track("e", how.now_ns)
        };
        let mut group = vec![begin, end];
        self.cancel_flow(q, &mut group);
        self.trace(&group);
    }

    /// A durable agent job leaves: its status row to the sink.
    pub fn job_left(&mut self, mut row: JobRow, policy: &str) {
        if let Some(sink) = self.opts.sink.as_deref_mut() {
            row.policy = policy.to_string();
            sink.job(&row);
        }
    }

    /// The cancel as a flow: intent, then backend observation, then resource release, each a
    /// 1 µs marker slice on the "cancels" thread that the flow binds to.
    fn cancel_flow(&mut self, q: &Req, group: &mut Vec<TraceEvent>) {
        let Some(intent_ns) = q.cancel().intent_ns() else {
            return;
        };
        let pid = self.opts.trace_pid;
        let mut points: Vec<(&str, u64)> = vec![("intent", intent_ns)];
        for (label, l) in [
            ("backend_observation", EvidenceLevel::BackendObservation),
            ("resource_release", EvidenceLevel::ResourceRelease),
        ] {
            if let Some(at) = q.evidence_ns(l).filter(|&at| at >= intent_ns) {
                points.push((label, at));
            }
        }
        let args = Some(TraceArgs::Request { request: q.id });
        for (label, at) in &points {
            group.push(TraceEvent {
                cat: Some("cancel"),
                dur: Some(1),
                args: args.clone(),
                ..TraceEvent::at("X", *label, pid, CANCELS_TID, at / 1000)
            });
        }
        if points.len() < 2 {
            return;
        }
        let last = points.len() - 1;
        self.flows += 1;
        let flow_id = ((pid as u64) << 32) | self.flows as u64;
        for (i, (_, at)) in points.iter().enumerate() {
            let ph = match i {
                0 => "s",
                _ if i == last => "f",
                _ => "t",
            };
            group.push(TraceEvent {
                cat: Some("cancel"),
                id: Some(flow_id),
                bp: (ph == "f").then_some("e"),
                args: args.clone(),
                ..TraceEvent::at(ph, "cancel", pid, CANCELS_TID, at / 1000)
            });
        }
    }

    /// What was recorded (the sinks stay with their owner).
    pub fn finish(self) -> Extras {
        self.extras
    }
}

/// A request's row of `requests.csv`.
fn row(q: &Req, policy: &str, disposition: &'static str, how: Left) -> RequestRow {
    let ev = |l: EvidenceLevel| q.evidence_ns(l).map(ms);
    let completed = how.state == State::Completed && !q.life.rejected();
    let l = &q.life;
    RequestRow {
        policy: policy.to_string(),
        id: q.id,
        owner: q.owner(),
        generation: q.generation(),
        replica: q.replica,
        runtime_id: how.runtime_id,
        disposition,
        target: q.cancel().plan().is_some(),
        sibling: how.sibling,
        survived: how.survived,
        collateral: q.cancel().collateral(),
        prompt_tokens: q.prompt,
        output_tokens: q.output,
        tokens_generated: l.tokens(),
        chunks_played: q.chunks.admitted(),
        arrival_ms: ms(q.arrival_ns),
        ttft_ms: completed.then(|| ms(l.first_token_ns() - q.arrival_ns)),
        e2e_ms: completed.then(|| ms(l.last_token_ns() - q.arrival_ns)),
        intent_ms: q.cancel().intent_ns().map(ms),
        local_invalidation_ms: ev(EvidenceLevel::LocalInvalidation),
        cancel_submission_ms: ev(EvidenceLevel::CancelSubmission),
        backend_observation_ms: ev(EvidenceLevel::BackendObservation),
        final_callback_ms: ev(EvidenceLevel::FinalCallback),
        resource_release_ms: ev(EvidenceLevel::ResourceRelease),
        leaked_gpu_ms: (q.cost.leak_pre_ns() + q.cost.leak_post_ns()) / 1e6,
        late_discards: q.cost.late_tokens(),
        gpu_ms: q.cost.gpu_ns() / 1e6,
        token_steps: q.cost.token_steps(),
        kv_block_s: q.cost.kv_block_ns() as f64 / NS_PER_S as f64,
        scheduling_delay_ms: l.started().then(|| ms(l.started_ns() - q.arrival_ns)),
        restarts: l.restarts(),
    }
}

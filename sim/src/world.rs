//! The world: wires the workload, the router and the replicas through one closed `Event` enum and
//! one exhaustive `match`.
//!
//! Per-request state lives in a slab only while the request is in the system. Results are folded
//! into histograms and running sums as requests leave, so memory grows with requests in flight,
//! not with requests completed.

use std::collections::HashMap;

use hdrhistogram::Histogram;

use cancelsim_models::batcher::BatcherConfig;
use cancelsim_models::engine::{EngineConfig, NewRequest, Outcome, Released, StepOutput};
use cancelsim_models::gpu::{self, Profile, StepCost};
use cancelsim_models::replica::{Replica, ReplicaStats};

use crate::dist::ms_to_ns;
use crate::kernel::rng::{Purpose, Stream};
use crate::kernel::{Class, Kernel, LimitError, Traced, NS_PER_MS, NS_PER_S};
use crate::scenario::{ProfileRef, Router, Scenario, Scheduler, Source};
use crate::workload::{self, Arrival, OpenLoop};

/// Every event of a run. Closed: adding a variant forces every `match` to say what it does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// The pending open-loop arrival (request `request`) enters.
    Arrival { request: u64 },
    /// Conversation `conv` begins.
    ConversationStart { conv: u64 },
    /// Conversation `conv` issues its next turn.
    TurnStart { conv: u64 },
    /// The user of `conv` barges in on generation `generation`. If that generation is still in
    /// progress it is superseded: this is the interruption the cancel path acts on.
    BargeIn { conv: u64, generation: u32 },
    /// Step `step` of `replica` ends; its outputs are processed.
    StepDone { replica: u32, step: u64 },
    /// The scheduler of `replica` composes and dispatches steps.
    SchedulePass { replica: u32 },
    /// A dynamic batcher's queue delay ran out.
    BatcherTimer { replica: u32 },
    /// Request `request` reaches its deadline (from acceptance).
    Deadline { request: u64, tag: u32 },
    /// The client of request `request` disconnects.
    Disconnect { request: u64, tag: u32 },
}

impl Traced for Event {
    fn kind_code(&self) -> u8 {
        match self {
            Event::Arrival { .. } => 1,
            Event::ConversationStart { .. } => 2,
            Event::TurnStart { .. } => 3,
            Event::BargeIn { .. } => 4,
            Event::StepDone { .. } => 5,
            Event::SchedulePass { .. } => 6,
            Event::BatcherTimer { .. } => 7,
            Event::Deadline { .. } => 8,
            Event::Disconnect { .. } => 9,
        }
    }

    fn entity(&self) -> u64 {
        match *self {
            Event::Arrival { request } => request,
            Event::ConversationStart { conv } | Event::TurnStart { conv } => conv,
            Event::BargeIn { conv, generation } => (conv << 16) | generation as u64,
            Event::StepDone { replica, step } => ((replica as u64) << 48) | step,
            Event::SchedulePass { replica } | Event::BatcherTimer { replica } => replica as u64,
            Event::Deadline { request, .. } | Event::Disconnect { request, .. } => request,
        }
    }
}

/// Quantiles of a latency, in milliseconds.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct LatencyMs {
    pub count: u64,
    pub mean: f64,
    /// Half-width of a 95 % confidence interval on the mean, by batch means over completion
    /// order.
    pub mean_ci95: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
}

/// Little's law, measured two ways: L as the time average of the number in the system, and
/// λ·W from the arrival rate and the mean time in system.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct LittlesLaw {
    pub lambda_per_s: f64,
    pub mean_in_system: f64,
    pub mean_e2e_s: f64,
    /// |L − λW| / L.
    pub relative_gap: f64,
}

#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct RequestCounts {
    /// Arrived.
    pub scheduled: u64,
    /// Accepted by a replica.
    pub admitted: u64,
    /// Refused by a replica (could never fit).
    pub rejected: u64,
    pub completed: u64,
}

#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Gpu {
    pub steps: u64,
    pub busy_s: f64,
    /// Busy time over (replicas × virtual time).
    pub utilisation: f64,
    /// Token-steps: tokens computed, summed over steps (prefill chunk tokens + decode slots).
    pub token_steps: u64,
    /// GPU-seconds shared to requests that completed (each step's time split by tokens).
    pub gpu_s_completed: f64,
    /// GPU-seconds of discarded work (window overshoot, preempted in-flight samples).
    pub gpu_s_discarded: f64,
    /// GPU-seconds of padding in shared batches.
    pub gpu_s_padding: f64,
    pub tokens_delivered: u64,
    pub tokens_discarded: u64,
    pub padding_token_steps: u64,
    pub preemptions: u64,
}

#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Kv {
    pub block_s: f64,
    /// Largest number of blocks in use at once on any replica.
    pub peak_blocks: u64,
    pub allocated_blocks: u64,
    pub freed_blocks: u64,
}

#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct WorkloadEvents {
    pub conversations: u64,
    pub turns: u64,
    /// Barge-ins that superseded a generation still in progress.
    pub interruptions: u64,
    /// Requests whose generation was superseded before they completed.
    pub superseded_requests: u64,
    /// Deadlines that fired before the request completed.
    pub deadlines_missed: u64,
    /// Clients that disconnected before their request completed.
    pub disconnects: u64,
}

/// Everything one run reports.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Summary {
    pub scenario: String,
    pub scenario_hash: String,
    pub seed: u64,
    pub version: String,
    pub requests: RequestCounts,
    pub ttft_ms: LatencyMs,
    pub tpot_ms: LatencyMs,
    pub e2e_ms: LatencyMs,
    pub throughput_rps: f64,
    pub output_tokens_per_s: f64,
    pub gpu: Gpu,
    pub kv: Kv,
    pub workload: WorkloadEvents,
    pub littles_law: LittlesLaw,
    pub events: u64,
    pub virtual_time_s: f64,
    /// BLAKE3 of every arrival `(id, time, prompt, output)` in order: equal across runs that
    /// share a workload (common random numbers), whatever the scheduler.
    pub workload_hash: String,
    pub run_hash: String,
}

#[derive(Debug, Clone, PartialEq)]
pub enum RunError {
    Limit(LimitError),
    /// A trace could not be read mid-run (file:line: message).
    Input(String),
}

impl std::fmt::Display for RunError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RunError::Limit(e) => e.fmt(f),
            RunError::Input(e) => f.write_str(e),
        }
    }
}

impl std::error::Error for RunError {}

impl From<LimitError> for RunError {
    fn from(e: LimitError) -> Self {
        RunError::Limit(e)
    }
}

/// Number of batches for batch-means confidence intervals.
const BATCHES: usize = 32;

/// Running statistics of one latency. Batch k holds completions k·B .. (k+1)·B−1, where B doubles
/// (merging batches pairwise) whenever the batches fill, so the batch count stays fixed without
/// knowing the run length.
struct LatencyStats {
    hist: Histogram<u64>,
    sum_ns: u128,
    count: u64,
    batch_sum_ns: [u128; BATCHES],
    batch_len: u64,
    filled: usize,
    current_n: u64,
}

impl LatencyStats {
    fn new() -> Self {
        LatencyStats {
            hist: Histogram::new_with_bounds(1, 10_000_000 * NS_PER_S, 3).expect("valid bounds"),
            sum_ns: 0,
            count: 0,
            batch_sum_ns: [0; BATCHES],
            batch_len: 1,
            filled: 0,
            current_n: 0,
        }
    }

    fn record(&mut self, value_ns: u64) {
        self.hist.saturating_record(value_ns.max(1));
        self.sum_ns += value_ns as u128;
        self.count += 1;
        self.batch_sum_ns[self.filled] += value_ns as u128;
        self.current_n += 1;
        if self.current_n == self.batch_len {
            self.filled += 1;
            self.current_n = 0;
            if self.filled == BATCHES {
                for k in 0..BATCHES / 2 {
                    self.batch_sum_ns[k] = self.batch_sum_ns[2 * k] + self.batch_sum_ns[2 * k + 1];
                }
                self.batch_sum_ns[BATCHES / 2..].fill(0);
                self.filled = BATCHES / 2;
                self.batch_len *= 2;
            }
        }
    }

    fn summary(&self) -> LatencyMs {
        let ms = |ns: f64| ns / NS_PER_MS as f64;
        if self.count == 0 {
            return LatencyMs {
                count: 0,
                mean: 0.0,
                mean_ci95: 0.0,
                p50: 0.0,
                p90: 0.0,
                p99: 0.0,
                max: 0.0,
            };
        }
        let mean_ns = self.sum_ns as f64 / self.count as f64;
        let means: Vec<f64> = (0..self.filled)
            .map(|b| self.batch_sum_ns[b] as f64 / self.batch_len as f64)
            .collect();
        let ci95_ns = if means.len() >= 8 {
            let k = means.len() as f64;
            let m = means.iter().sum::<f64>() / k;
            let var = means.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / (k - 1.0);
            // t quantile, 95 % two-sided, for 15..31 degrees of freedom is 2.04..2.13.
            2.13 * (var / k).sqrt()
        } else {
            f64::NAN
        };
        LatencyMs {
            count: self.count,
            mean: ms(mean_ns),
            mean_ci95: ms(ci95_ns),
            p50: ms(self.hist.value_at_quantile(0.50) as f64),
            p90: ms(self.hist.value_at_quantile(0.90) as f64),
            p99: ms(self.hist.value_at_quantile(0.99) as f64),
            max: ms(self.hist.max() as f64),
        }
    }
}

/// A request in the system.
#[derive(Clone, Debug)]
struct Req {
    id: u64,
    arrival_ns: u64,
    output: u32,
    first_token_ns: u64,
    tokens: u32,
    done: bool,
    /// (conversation, generation) for closed-loop requests.
    conv: Option<(u64, u32)>,
    gpu_ns: f64,
    live: bool,
}

/// A conversation in progress.
struct Conv {
    turns: u32,
    /// The current generation (turn index).
    turn: u32,
    /// Requests of the current turn not yet complete.
    outstanding: u32,
}

/// The replica configuration, resolved from the scenario and the profile.
enum ReplicaConfig {
    Continuous(EngineConfig),
    Dynamic(BatcherConfig),
}

fn replica_config(s: &Scenario) -> ReplicaConfig {
    let (cost, kv_blocks_16, profile): (StepCost, u64, Option<Profile>) = match &s.cluster.profile {
        ProfileRef::Named(name) => {
            let p = gpu::profile(name).expect("validated profile name");
            (p.cost, p.kv_blocks_16, Some(p))
        }
        ProfileRef::Custom {
            c0_ms,
            prefill_tokens_per_s,
            per_seq_us,
            per_kv_token_ns,
            kv_blocks_16,
        } => (
            StepCost {
                c0_ns: ms_to_ns(*c0_ms),
                prefill_tokens_per_s: prefill_tokens_per_s.round() as u64,
                per_seq_ns: (per_seq_us * 1e3).round() as u64,
                per_kv_token_ps: (per_kv_token_ns * 1e3).round() as u64,
            },
            *kv_blocks_16,
            None,
        ),
    };
    let blocks = |block_tokens: u32, explicit: Option<u64>| {
        explicit.unwrap_or_else(|| (kv_blocks_16 * 16 / block_tokens as u64).max(1))
    };
    match &s.cluster.scheduler {
        Scheduler::Continuous {
            max_num_seqs,
            max_num_batched_tokens,
            chunked_prefill,
            block_tokens,
            kv_blocks,
            window,
        } => ReplicaConfig::Continuous(EngineConfig {
            max_num_seqs: max_num_seqs
                .or(profile.map(|p| p.max_num_seqs))
                .unwrap_or(256),
            max_num_batched_tokens: max_num_batched_tokens
                .or(profile.map(|p| p.max_num_batched_tokens))
                .unwrap_or(2048),
            chunked_prefill: *chunked_prefill,
            block_tokens: *block_tokens,
            kv_blocks: blocks(*block_tokens, *kv_blocks),
            window: *window,
            cost,
        }),
        Scheduler::Dynamic {
            max_batch_size,
            max_queue_delay_ms,
            block_tokens,
            kv_blocks,
        } => ReplicaConfig::Dynamic(BatcherConfig {
            max_batch_size: *max_batch_size,
            max_queue_delay_ns: ms_to_ns(*max_queue_delay_ms),
            block_tokens: *block_tokens,
            kv_blocks: blocks(*block_tokens, *kv_blocks),
            cost,
        }),
    }
}

/// One run of one scenario.
pub struct World<'s> {
    scenario: &'s Scenario,
    seed: u64,
    kernel: Kernel<Event>,
    replicas: Vec<Replica>,
    pass_pending: Vec<bool>,
    timer_at: Vec<Option<u64>>,
    rr_next: u32,
    open: Option<OpenLoop>,
    pending: Option<Arrival>,
    conv_starts: Stream,
    convs: HashMap<u64, Conv>,
    conv_started: u64,
    reqs: Vec<Req>,
    free_tags: Vec<u32>,
    outputs: Vec<StepOutput>,
    released: Vec<Released>,
    workload_hasher: blake3::Hasher,
    counts: RequestCounts,
    events: WorkloadEvents,
    in_system: u64,
    area_in_system: u128,
    last_change_ns: u64,
    ttft: LatencyStats,
    tpot: LatencyStats,
    e2e: LatencyStats,
    token_steps: u64,
    gpu_ns_completed: f64,
    gpu_ns_discarded: f64,
    gpu_ns_padding: f64,
    kv_block_ns: u128,
    last_completion_ns: u64,
}

impl<'s> World<'s> {
    pub fn new(scenario: &'s Scenario, seed: u64) -> Result<Self, RunError> {
        debug_assert!(scenario.validate().is_ok());
        let n = scenario.cluster.replicas as usize;
        let replicas = (0..n)
            .map(|_| match replica_config(scenario) {
                ReplicaConfig::Continuous(c) => Replica::continuous(c),
                ReplicaConfig::Dynamic(c) => Replica::dynamic(c),
            })
            .collect();
        Ok(World {
            scenario,
            seed,
            kernel: Kernel::new(scenario.limits()),
            replicas,
            pass_pending: vec![false; n],
            timer_at: vec![None; n],
            rr_next: 0,
            open: OpenLoop::new(scenario, seed).map_err(RunError::Input)?,
            pending: None,
            conv_starts: Stream::new(seed, Purpose::Arrival, 1),
            convs: HashMap::new(),
            conv_started: 0,
            reqs: Vec::new(),
            free_tags: Vec::new(),
            outputs: Vec::new(),
            released: Vec::new(),
            workload_hasher: blake3::Hasher::new(),
            counts: RequestCounts {
                scheduled: 0,
                admitted: 0,
                rejected: 0,
                completed: 0,
            },
            events: WorkloadEvents {
                conversations: 0,
                turns: 0,
                interruptions: 0,
                superseded_requests: 0,
                deadlines_missed: 0,
                disconnects: 0,
            },
            in_system: 0,
            area_in_system: 0,
            last_change_ns: 0,
            ttft: LatencyStats::new(),
            tpot: LatencyStats::new(),
            e2e: LatencyStats::new(),
            token_steps: 0,
            gpu_ns_completed: 0.0,
            gpu_ns_discarded: 0.0,
            gpu_ns_padding: 0.0,
            kv_block_ns: 0,
            last_completion_ns: 0,
        })
    }

    /// Run to completion and summarise.
    pub fn run(mut self) -> Result<Summary, RunError> {
        self.start()?;
        while let Some(event) = self.kernel.next_event()? {
            self.dispatch(event)?;
        }
        Ok(self.finish())
    }

    fn start(&mut self) -> Result<(), RunError> {
        if self.open.is_some() {
            self.pull_arrival()?;
        } else {
            self.kernel
                .schedule_at(0, Class::Arrival, Event::ConversationStart { conv: 0 })?;
        }
        Ok(())
    }

    fn pull_arrival(&mut self) -> Result<(), RunError> {
        let open = self.open.as_mut().expect("open-loop source");
        if let Some(a) = open
            .next(&self.scenario.workload)
            .map_err(RunError::Input)?
        {
            self.pending = Some(a);
            self.kernel
                .schedule_at(a.time_ns, Class::Arrival, Event::Arrival { request: a.id })?;
        }
        Ok(())
    }

    fn dispatch(&mut self, event: Event) -> Result<(), RunError> {
        let now_ns = self.kernel.now_ns();
        match event {
            Event::Arrival { request } => {
                let a = self.pending.take().expect("an arrival is pending");
                debug_assert_eq!(a.id, request);
                self.admit(a, None)?;
                self.pull_arrival()?;
            }
            Event::ConversationStart { conv } => {
                let Source::Conversations {
                    conversations,
                    start_rate_per_s,
                    ..
                } = &self.scenario.workload.source
                else {
                    unreachable!("conversation events need a conversation source")
                };
                self.events.conversations += 1;
                self.conv_started += 1;
                if self.conv_started < *conversations {
                    let gap = self
                        .conv_starts
                        .exponential(NS_PER_S as f64 / start_rate_per_s);
                    self.kernel.schedule_in(
                        crate::dist::round_ns(gap),
                        Class::Arrival,
                        Event::ConversationStart { conv: conv + 1 },
                    )?;
                }
                let turns = workload::conversation_turns(&self.scenario.workload, self.seed, conv);
                if turns > 0 {
                    self.convs.insert(
                        conv,
                        Conv {
                            turns,
                            turn: 0,
                            outstanding: 0,
                        },
                    );
                    self.kernel
                        .schedule_at(now_ns, Class::Arrival, Event::TurnStart { conv })?;
                }
            }
            Event::TurnStart { conv } => {
                let Source::Conversations {
                    requests_per_turn, ..
                } = &self.scenario.workload.source
                else {
                    unreachable!("conversation events need a conversation source")
                };
                let per_turn = *requests_per_turn;
                let turn = self.convs[&conv].turn;
                self.events.turns += 1;
                let draws = workload::turn_draws(&self.scenario.workload, self.seed, conv, turn);
                if let Some(after) = draws.barge_in_after_ns {
                    self.kernel.schedule_in(
                        after,
                        Class::Control,
                        Event::BargeIn {
                            conv,
                            generation: turn,
                        },
                    )?;
                }
                self.convs
                    .get_mut(&conv)
                    .expect("live conversation")
                    .outstanding = per_turn;
                for k in 0..per_turn {
                    let id = workload::conversation_request_id(conv, turn, k);
                    let (p, o) = workload::shape(&self.scenario.workload, self.seed, id);
                    let a = Arrival {
                        id,
                        time_ns: now_ns,
                        prompt_tokens: p,
                        output_tokens: o,
                    };
                    self.admit(a, Some((conv, turn)))?;
                }
            }
            Event::BargeIn { conv, generation } => {
                let Some(c) = self.convs.get_mut(&conv) else {
                    return Ok(());
                };
                if c.turn == generation && c.outstanding > 0 {
                    // The interruption: generation `generation` of owner `conv` is superseded.
                    // Its requests keep running (no cancel path yet); their output no longer
                    // belongs to the conversation.
                    self.events.interruptions += 1;
                    self.events.superseded_requests += c.outstanding as u64;
                    c.outstanding = 0;
                    self.next_turn(conv, 0)?;
                }
            }
            Event::StepDone { replica, step } => {
                let r = replica as usize;
                let report =
                    self.replicas[r].step_done(now_ns, step, &mut self.outputs, &mut self.released);
                let total = report.tokens.max(1) as f64;
                let mut outputs = std::mem::take(&mut self.outputs);
                for o in outputs.drain(..) {
                    self.token_steps += o.tokens as u64;
                    let share = report.duration_ns as f64 * o.tokens as f64 / total;
                    match o.outcome {
                        Outcome::Discarded => self.gpu_ns_discarded += share,
                        Outcome::Padding => self.gpu_ns_padding += share,
                        Outcome::Prefill => self.reqs[o.tag as usize].gpu_ns += share,
                        Outcome::Token { index, last } => {
                            self.reqs[o.tag as usize].gpu_ns += share;
                            self.on_token(o.tag, index, last)?;
                        }
                    }
                }
                self.outputs = outputs;
                let mut released = std::mem::take(&mut self.released);
                for rel in released.drain(..) {
                    self.on_released(rel);
                }
                self.released = released;
                self.request_pass(replica)?;
            }
            Event::SchedulePass { replica } => {
                let r = replica as usize;
                self.pass_pending[r] = false;
                while let Some(d) = self.replicas[r].dispatch(now_ns) {
                    self.kernel.schedule_at(
                        d.end_ns,
                        Class::Completion,
                        Event::StepDone {
                            replica,
                            step: d.step,
                        },
                    )?;
                }
                let timer = self.replicas[r].timer_ns();
                if let Some(at) = timer.filter(|_| timer != self.timer_at[r]) {
                    self.timer_at[r] = Some(at.max(now_ns));
                    self.kernel.schedule_at(
                        at.max(now_ns),
                        Class::Schedule,
                        Event::BatcherTimer { replica },
                    )?;
                }
            }
            Event::BatcherTimer { replica } => {
                // A stale timer (the batch formed earlier) costs one empty pass; a live one lets
                // the batcher form its batch on timeout.
                let r = replica as usize;
                if self.timer_at[r].is_some_and(|t| t <= now_ns) {
                    self.timer_at[r] = None;
                }
                self.request_pass(replica)?;
            }
            Event::Deadline { request, tag } => {
                let q = &self.reqs[tag as usize];
                if q.live && q.id == request && !q.done {
                    self.events.deadlines_missed += 1;
                }
            }
            Event::Disconnect { request, tag } => {
                let q = &self.reqs[tag as usize];
                if q.live && q.id == request && !q.done {
                    self.events.disconnects += 1;
                }
            }
        }
        Ok(())
    }

    /// A request arrives: record it, route it, enqueue it.
    fn admit(&mut self, a: Arrival, conv: Option<(u64, u32)>) -> Result<(), RunError> {
        let now_ns = self.kernel.now_ns();
        self.workload_hasher.update(&a.id.to_le_bytes());
        self.workload_hasher.update(&a.time_ns.to_le_bytes());
        self.workload_hasher.update(&a.prompt_tokens.to_le_bytes());
        self.workload_hasher.update(&a.output_tokens.to_le_bytes());
        self.counts.scheduled += 1;
        let replica = self.route();
        let req = Req {
            id: a.id,
            arrival_ns: now_ns,
            output: a.output_tokens,
            first_token_ns: 0,
            tokens: 0,
            done: false,
            conv,
            gpu_ns: 0.0,
            live: true,
        };
        let tag = match self.free_tags.pop() {
            Some(t) => {
                self.reqs[t as usize] = req;
                t
            }
            None => {
                self.reqs.push(req);
                (self.reqs.len() - 1) as u32
            }
        };
        let new = NewRequest {
            id: a.id,
            tag,
            prompt_tokens: a.prompt_tokens,
            output_tokens: a.output_tokens,
        };
        if self.replicas[replica as usize]
            .enqueue(now_ns, new)
            .is_err()
        {
            self.counts.rejected += 1;
            self.reqs[tag as usize].live = false;
            self.free_tags.push(tag);
            if let Some((c, g)) = conv {
                self.turn_request_done(c, g)?;
            }
            return Ok(());
        }
        self.counts.admitted += 1;
        self.integrate(now_ns);
        self.in_system += 1;
        let (deadline, disconnect) = workload::timing(&self.scenario.workload, self.seed, a.id);
        if let Some(d) = deadline {
            self.kernel
                .schedule_in(d, Class::Control, Event::Deadline { request: a.id, tag })?;
        }
        if let Some(d) = disconnect {
            self.kernel
                .schedule_in(d, Class::Control, Event::Disconnect { request: a.id, tag })?;
        }
        self.request_pass(replica)
    }

    fn route(&mut self) -> u32 {
        let n = self.replicas.len() as u32;
        match self.scenario.cluster.router {
            Router::RoundRobin => {
                let r = self.rr_next;
                self.rr_next = (r + 1) % n;
                r
            }
            Router::LeastLoaded => (0..n)
                .min_by_key(|&r| (self.replicas[r as usize].load(), r))
                .expect("at least one replica"),
        }
    }

    fn request_pass(&mut self, replica: u32) -> Result<(), RunError> {
        if !self.pass_pending[replica as usize] {
            self.pass_pending[replica as usize] = true;
            self.kernel
                .schedule_in(0, Class::Schedule, Event::SchedulePass { replica })?;
        }
        Ok(())
    }

    fn on_token(&mut self, tag: u32, index: u32, last: bool) -> Result<(), RunError> {
        let now_ns = self.kernel.now_ns();
        let q = &mut self.reqs[tag as usize];
        debug_assert!(q.live && !q.done);
        debug_assert_eq!(index, q.tokens + 1);
        q.tokens = index;
        if index == 1 {
            q.first_token_ns = now_ns;
            self.ttft.record(now_ns - q.arrival_ns);
        }
        if last {
            debug_assert_eq!(index, q.output);
            q.done = true;
            let (arrival, first, output, conv) = (q.arrival_ns, q.first_token_ns, q.output, q.conv);
            self.e2e.record(now_ns - arrival);
            if output > 1 {
                self.tpot.record((now_ns - first) / (output as u64 - 1));
            }
            self.counts.completed += 1;
            self.integrate(now_ns);
            self.in_system -= 1;
            self.last_completion_ns = now_ns;
            if let Some((c, g)) = conv {
                self.turn_request_done(c, g)?;
            }
        }
        Ok(())
    }

    fn on_released(&mut self, rel: Released) {
        let q = &mut self.reqs[rel.tag as usize];
        debug_assert!(q.live && q.id == rel.id && q.done);
        self.kv_block_ns += rel.kv_block_ns;
        self.gpu_ns_completed += q.gpu_ns;
        q.live = false;
        self.free_tags.push(rel.tag);
    }

    /// A request of generation `g` of conversation `c` is done (or refused).
    fn turn_request_done(&mut self, c: u64, g: u32) -> Result<(), RunError> {
        let Some(conv) = self.convs.get_mut(&c) else {
            return Ok(());
        };
        if conv.turn != g || conv.outstanding == 0 {
            return Ok(()); // a superseded generation: its completion no longer drives the turn
        }
        conv.outstanding -= 1;
        if conv.outstanding == 0 {
            let think = workload::turn_draws(&self.scenario.workload, self.seed, c, g).think_ns;
            self.next_turn(c, think)?;
        }
        Ok(())
    }

    fn next_turn(&mut self, c: u64, delay_ns: u64) -> Result<(), RunError> {
        let conv = self.convs.get_mut(&c).expect("live conversation");
        conv.turn += 1;
        if conv.turn >= conv.turns {
            self.convs.remove(&c);
            return Ok(());
        }
        self.kernel
            .schedule_in(delay_ns, Class::Arrival, Event::TurnStart { conv: c })?;
        Ok(())
    }

    fn integrate(&mut self, now_ns: u64) {
        self.area_in_system += (now_ns - self.last_change_ns) as u128 * self.in_system as u128;
        self.last_change_ns = now_ns;
    }

    fn finish(mut self) -> Summary {
        let end_ns = self.kernel.now_ns();
        self.integrate(end_ns);
        // Conservation, checked on every run: everyone admitted completed and left, every replica
        // drained, every block allocated was freed, every token sampled was delivered or
        // discarded.
        assert_eq!(self.in_system, 0, "requests left in the system");
        assert_eq!(self.counts.completed, self.counts.admitted);
        assert_eq!(
            self.counts.admitted + self.counts.rejected,
            self.counts.scheduled
        );
        assert!(
            self.reqs.iter().all(|q| !q.live),
            "a request was never released"
        );
        assert!(self.convs.is_empty(), "a conversation never ended");
        let mut stats = ReplicaStats::default();
        let (mut allocated, mut freed, mut peak) = (0, 0, 0);
        for r in &self.replicas {
            assert!(r.is_idle(), "a replica did not drain");
            let kv = r.kv();
            assert_eq!(kv.allocated_total(), kv.freed_total(), "KV blocks leaked");
            assert_eq!(kv.in_use(), 0);
            allocated += kv.allocated_total();
            freed += kv.freed_total();
            peak = peak.max(kv.in_use_max());
            let s = r.stats();
            stats.steps += s.steps;
            stats.busy_ns += s.busy_ns;
            stats.preemptions += s.preemptions;
            stats.tokens_delivered += s.tokens_delivered;
            stats.tokens_discarded += s.tokens_discarded;
            stats.padding_token_steps += s.padding_token_steps;
        }
        let end_s = end_ns as f64 / NS_PER_S as f64;
        let n_replicas = self.replicas.len() as f64;
        let lambda_per_s = if end_s > 0.0 {
            self.counts.admitted as f64 / end_s
        } else {
            0.0
        };
        let mean_in_system = if end_ns > 0 {
            self.area_in_system as f64 / end_ns as f64
        } else {
            0.0
        };
        let mean_e2e_s = self.e2e.sum_ns as f64 / self.e2e.count.max(1) as f64 / NS_PER_S as f64;
        let lw = lambda_per_s * mean_e2e_s;
        let makespan_s = self.last_completion_ns as f64 / NS_PER_S as f64;
        Summary {
            scenario: self.scenario.name.clone(),
            scenario_hash: self.scenario.hash(),
            seed: self.seed,
            version: env!("CARGO_PKG_VERSION").to_string(),
            requests: self.counts.clone(),
            ttft_ms: self.ttft.summary(),
            tpot_ms: self.tpot.summary(),
            e2e_ms: self.e2e.summary(),
            throughput_rps: if makespan_s > 0.0 {
                self.counts.completed as f64 / makespan_s
            } else {
                0.0
            },
            output_tokens_per_s: if makespan_s > 0.0 {
                stats.tokens_delivered as f64 / makespan_s
            } else {
                0.0
            },
            gpu: Gpu {
                steps: stats.steps,
                busy_s: stats.busy_ns as f64 / NS_PER_S as f64,
                utilisation: if end_ns > 0 {
                    stats.busy_ns as f64 / (end_ns as f64 * n_replicas)
                } else {
                    0.0
                },
                token_steps: self.token_steps,
                gpu_s_completed: self.gpu_ns_completed / NS_PER_S as f64,
                gpu_s_discarded: self.gpu_ns_discarded / NS_PER_S as f64,
                gpu_s_padding: self.gpu_ns_padding / NS_PER_S as f64,
                tokens_delivered: stats.tokens_delivered,
                tokens_discarded: stats.tokens_discarded,
                padding_token_steps: stats.padding_token_steps,
                preemptions: stats.preemptions,
            },
            kv: Kv {
                block_s: self.kv_block_ns as f64 / NS_PER_S as f64,
                peak_blocks: peak,
                allocated_blocks: allocated,
                freed_blocks: freed,
            },
            workload: self.events.clone(),
            littles_law: LittlesLaw {
                lambda_per_s,
                mean_in_system,
                mean_e2e_s,
                relative_gap: if mean_in_system > 0.0 {
                    (mean_in_system - lw).abs() / mean_in_system
                } else {
                    0.0
                },
            },
            events: self.kernel.events_dispatched(),
            virtual_time_s: end_s,
            workload_hash: self.workload_hasher.finalize().to_hex().to_string(),
            run_hash: self.kernel.run_hash(),
        }
    }
}

/// Run `scenario` with `seed`.
pub fn run(scenario: &Scenario, seed: u64) -> Result<Summary, RunError> {
    World::new(scenario, seed)?.run()
}

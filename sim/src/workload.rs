//! Workload generation: open-loop arrival processes, trace replay, and the per-request draws.
//!
//! Every draw is keyed. Arrival gaps come from the arrival process's own stream; a request's
//! lengths, deadline and disconnect time come from streams keyed by its id; a conversation's
//! per-turn draws come from streams keyed by (conversation, turn). Nothing a scheduler does can
//! shift them, so two runs that differ only in scheduling, policy or cancellation see the same
//! workload (common random numbers).

use crate::dist::{ms_to_ns, round_ns, Dist};
use crate::kernel::rng::{Purpose, Stream};
use crate::kernel::NS_PER_S;
use crate::scenario::{Scenario, Source, Workload};
use crate::trace::TraceReader;

/// Longest request the generator issues, in tokens (prompt or output).
pub const TOKENS_MAX: u32 = 1 << 20;
/// Turns of one conversation, at most.
pub const TURNS_MAX: u32 = 1 << 16;

/// One request entering the system.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Arrival {
    pub id: u64,
    pub time_ns: u64,
    pub prompt_tokens: u32,
    pub output_tokens: u32,
}

/// A draw from a token-count distribution: rounded, at least 1, at most `TOKENS_MAX`.
pub fn tokens(d: &Dist, s: &mut Stream) -> u32 {
    let x = d.sample(s).round();
    if x < 1.0 {
        1
    } else if x > TOKENS_MAX as f64 {
        TOKENS_MAX
    } else {
        x as u32
    }
}

/// Lengths of a synthetic request, from its own stream.
pub fn shape(w: &Workload, seed: u64, id: u64) -> (u32, u32) {
    let mut s = Stream::new(seed, Purpose::RequestShape, id);
    let prompt = tokens(&w.prompt_tokens, &mut s);
    let output = tokens(&w.output_tokens, &mut s);
    (prompt, output)
}

/// Deadline and disconnect offsets from acceptance, from the request's timing stream.
pub fn timing(w: &Workload, seed: u64, id: u64) -> (Option<u64>, Option<u64>) {
    if w.deadline_ms.is_none() && w.disconnect_ms.is_none() {
        return (None, None);
    }
    let mut s = Stream::new(seed, Purpose::RequestTiming, id);
    // Both are drawn whenever either is configured, in a fixed order, so adding one does not
    // shift the other.
    let deadline = w.deadline_ms.as_ref().map(|d| d.sample(&mut s));
    let disconnect = w.disconnect_ms.as_ref().map(|d| d.sample(&mut s));
    (deadline.map(ms_to_ns), disconnect.map(ms_to_ns))
}

enum Process {
    Poisson {
        gap_mean_ns: f64,
    },
    OnOff {
        gap_on_ns: f64,
        gap_off_ns: Option<f64>,
        on_ms: Dist,
        off_ms: Dist,
        on: bool,
        period_end_ns: u64,
    },
    Trace {
        reader: Box<TraceReader>,
        speedup: f64,
        first_row: u64,
        end_row: u64,
        sample_fraction: f64,
    },
}

/// An open-loop source: Poisson, on/off, or a trace. Produces arrivals in time order.
pub struct OpenLoop {
    process: Process,
    stream: Stream,
    seed: u64,
    issued: u64,
    limit: u64,
    t_ns: u64,
}

impl OpenLoop {
    /// `None` for closed-loop sources.
    pub fn new(scenario: &Scenario, seed: u64) -> Result<Option<OpenLoop>, String> {
        let stream = Stream::new(seed, Purpose::Arrival, 0);
        let (process, limit) = match &scenario.workload.source {
            Source::Poisson {
                rate_per_s,
                requests,
            } => (
                Process::Poisson {
                    gap_mean_ns: NS_PER_S as f64 / rate_per_s,
                },
                *requests,
            ),
            Source::OnOff {
                rate_on_per_s,
                rate_off_per_s,
                on_ms,
                off_ms,
                requests,
            } => (
                Process::OnOff {
                    gap_on_ns: NS_PER_S as f64 / rate_on_per_s,
                    gap_off_ns: (*rate_off_per_s > 0.0).then(|| NS_PER_S as f64 / rate_off_per_s),
                    on_ms: on_ms.clone(),
                    off_ms: off_ms.clone(),
                    on: true,
                    period_end_ns: 0,
                },
                *requests,
            ),
            Source::Trace {
                path,
                format,
                speedup,
                first_row,
                rows,
                sample_fraction,
            } => {
                let reader = TraceReader::open(&scenario.base_dir.join(path), *format)?;
                (
                    Process::Trace {
                        reader: Box::new(reader),
                        speedup: *speedup,
                        first_row: *first_row,
                        end_row: rows.map_or(u64::MAX, |r| first_row.saturating_add(r)),
                        sample_fraction: *sample_fraction,
                    },
                    u64::MAX,
                )
            }
            Source::Conversations { .. } => return Ok(None),
        };
        let mut open = OpenLoop {
            process,
            stream,
            seed,
            issued: 0,
            limit,
            t_ns: 0,
        };
        if let Process::OnOff {
            on_ms,
            period_end_ns,
            ..
        } = &mut open.process
        {
            *period_end_ns = ms_to_ns(on_ms.sample(&mut open.stream)).max(1);
        }
        Ok(Some(open))
    }

    /// The next arrival, or `None` when the source is exhausted.
    pub fn next(&mut self, w: &Workload) -> Result<Option<Arrival>, String> {
        if self.issued >= self.limit {
            return Ok(None);
        }
        let arrival = match &mut self.process {
            Process::Poisson { gap_mean_ns } => {
                // The first request arrives at 0; then exponential gaps.
                if self.issued > 0 {
                    self.t_ns += round_ns(self.stream.exponential(*gap_mean_ns));
                }
                let id = self.issued;
                let (p, o) = shape(w, self.seed, id);
                Arrival {
                    id,
                    time_ns: self.t_ns,
                    prompt_tokens: p,
                    output_tokens: o,
                }
            }
            Process::OnOff {
                gap_on_ns,
                gap_off_ns,
                on_ms,
                off_ms,
                on,
                period_end_ns,
            } => {
                // Memoryless within a period: a gap that crosses the period's end restarts at
                // the boundary with the other state's rate.
                loop {
                    let gap_mean = if *on { Some(*gap_on_ns) } else { *gap_off_ns };
                    if let Some(mean) = gap_mean {
                        let t = self
                            .t_ns
                            .saturating_add(round_ns(self.stream.exponential(mean)));
                        if t < *period_end_ns {
                            self.t_ns = t;
                            break;
                        }
                    }
                    self.t_ns = *period_end_ns;
                    *on = !*on;
                    let d = if *on { &*on_ms } else { &*off_ms };
                    *period_end_ns = self.t_ns + ms_to_ns(d.sample(&mut self.stream)).max(1);
                }
                let id = self.issued;
                let (p, o) = shape(w, self.seed, id);
                Arrival {
                    id,
                    time_ns: self.t_ns,
                    prompt_tokens: p,
                    output_tokens: o,
                }
            }
            Process::Trace {
                reader,
                speedup,
                first_row,
                end_row,
                sample_fraction,
            } => loop {
                let Some(row) = reader.next_row()? else {
                    return Ok(None);
                };
                if row.row < *first_row {
                    continue;
                }
                if row.row >= *end_row {
                    return Ok(None);
                }
                if *sample_fraction < 1.0 {
                    let mut s = Stream::new(self.seed, Purpose::TraceSample, row.row);
                    if s.uniform_open01() >= *sample_fraction {
                        continue;
                    }
                }
                let clamp = |x: u32| x.clamp(1, TOKENS_MAX);
                break Arrival {
                    id: row.row,
                    time_ns: round_ns(row.offset_ns as f64 / *speedup),
                    prompt_tokens: clamp(row.prompt_tokens),
                    output_tokens: clamp(row.output_tokens),
                };
            },
        };
        self.issued += 1;
        Ok(Some(arrival))
    }
}

/// Request ids of conversation turns: disjoint from open-loop ids (bit 62), and stable across
/// runs because they name (conversation, turn, request in turn), not an arrival order.
pub fn conversation_request_id(conv: u64, turn: u32, k: u32) -> u64 {
    debug_assert!(conv < 1 << 38 && turn < TURNS_MAX && k < 256);
    (1 << 62) | (conv << 24) | ((turn as u64) << 8) | k as u64
}

/// The draws of one turn, from the (conversation, turn) stream.
pub struct TurnDraws {
    pub barge_in_after_ns: Option<u64>,
    pub think_ns: u64,
}

pub fn turn_draws(w: &Workload, seed: u64, conv: u64, turn: u32) -> TurnDraws {
    let Source::Conversations {
        think_ms, barge_in, ..
    } = &w.source
    else {
        unreachable!("turn draws of a closed-loop source only")
    };
    let mut s = Stream::new(seed, Purpose::Conversation, (conv << 20) | turn as u64);
    let think_ns = ms_to_ns(think_ms.sample(&mut s));
    let barge_in_after_ns = barge_in.as_ref().and_then(|b| {
        let hit = s.uniform_open01() < b.probability;
        let after = ms_to_ns(b.after_ms.sample(&mut s));
        hit.then_some(after)
    });
    TurnDraws {
        barge_in_after_ns,
        think_ns,
    }
}

/// How many turns a conversation has, from its own stream.
pub fn conversation_turns(w: &Workload, seed: u64, conv: u64) -> u32 {
    let Source::Conversations { turns, .. } = &w.source else {
        unreachable!("turns of a closed-loop source only")
    };
    let mut s = Stream::new(seed, Purpose::Conversation, (conv << 20) | 0xF_FFFF);
    tokens(turns, &mut s).min(TURNS_MAX - 1)
}

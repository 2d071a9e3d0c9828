//! Open-loop arrival processes: Poisson, gamma renewals, on/off (a two-state MMPP) and trace replay. Each
//! produces arrivals in time order, one at a time, from its own keyed stream.

use super::trace::TraceReader;
use super::{shape, Arrival, TOKENS_MAX};
use crate::dist::{ms_to_ns, round_ns, Dist};
use crate::kernel::rng::{key, Purpose, Stream};
use crate::kernel::NS_PER_S;
use crate::scenario::{Scenario, Source, Workload};

/// The on/off process's state.
struct OnOff {
    gap_on_ns: f64,
    gap_off_ns: Option<f64>,
    on_ms: Dist,
    off_ms: Dist,
    on: bool,
    period_end_ns: u64,
}

/// A trace being replayed.
struct Replay {
    reader: Box<TraceReader>,
    speedup: f64,
    first_row: u64,
    end_row: u64,
    sample_fraction: f64,
    max_total_tokens: u32,
    /// Data rows read so far, and whether any fell in the window: an empty window is an error,
    /// as `requests: 0` is, not a run of nothing.
    rows_read: u64,
    in_window: bool,
    path: String,
}

enum Process {
    Poisson { gap_mean_ns: f64 },
    Gamma { gap_mean_ns: f64, cv: f64 },
    OnOff(OnOff),
    Trace(Replay),
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

/// The scenario's process and how many arrivals it may issue; `None` for closed-loop sources.
fn process(
    scenario: &Scenario,
    trace: Option<TraceReader>,
) -> Result<Option<(Process, u64)>, String> {
    let p = match &scenario.workload.source {
        Source::Poisson {
            rate_per_s,
            requests,
        } => {
            let gap_mean_ns = NS_PER_S as f64 / rate_per_s;
            (Process::Poisson { gap_mean_ns }, *requests)
        }
        Source::Gamma {
            rate_per_s,
            cv,
            requests,
        } => {
            let gap_mean_ns = NS_PER_S as f64 / rate_per_s;
            (
                Process::Gamma {
                    gap_mean_ns,
                    cv: *cv,
                },
                *requests,
            )
        }
        Source::OnOff {
            rate_on_per_s,
            rate_off_per_s,
            on_ms,
            off_ms,
            requests,
        } => {
            let p = OnOff {
                gap_on_ns: NS_PER_S as f64 / rate_on_per_s,
                gap_off_ns: (*rate_off_per_s > 0.0).then(|| NS_PER_S as f64 / rate_off_per_s),
                on_ms: on_ms.clone(),
                off_ms: off_ms.clone(),
                on: true,
                period_end_ns: 0,
            };
            (Process::OnOff(p), *requests)
        }
        Source::Trace {
            path,
            format: _,
            speedup,
            first_row,
            rows,
            sample_fraction,
            max_total_tokens,
        } => {
            let shown = crate::input::shown(&scenario.base_dir.join(path));
            let reader = trace.ok_or_else(|| format!("{shown}: the trace was not opened"))?;
            let r = Replay {
                reader: Box::new(reader),
                speedup: *speedup,
                first_row: *first_row,
                end_row: rows.map_or(u64::MAX, |r| first_row.saturating_add(r)),
                sample_fraction: *sample_fraction,
                max_total_tokens: max_total_tokens.unwrap_or(u32::MAX),
                rows_read: 0,
                in_window: false,
                path: shown,
            };
            (Process::Trace(r), u64::MAX)
        }
        Source::Conversations { .. } | Source::Jobs { .. } | Source::AgentTrace { .. } => {
            return Ok(None)
        }
    };
    Ok(Some(p))
}

impl OpenLoop {
    /// `None` for closed-loop sources. A `Trace` source replays `trace`, opened by the caller.
    pub fn new(
        scenario: &Scenario,
        seed: u64,
        trace: Option<TraceReader>,
    ) -> Result<Option<OpenLoop>, String> {
        let Some((process, limit)) = process(scenario, trace)? else {
            return Ok(None);
        };
        let mut open = OpenLoop {
            process,
            stream: Stream::new(seed, Purpose::Arrival, key::OPEN_LOOP),
            seed,
            issued: 0,
            limit,
            t_ns: 0,
        };
        if let Process::OnOff(p) = &mut open.process {
            p.period_end_ns = ms_to_ns(p.on_ms.sample(&mut open.stream)).max(1);
        }
        Ok(Some(open))
    }

    /// The shared-prefix block ids of the arrival `next` returned last (a trace's block hashes);
    /// empty if it has none.
    pub fn prefix_ids(&self) -> &[u64] {
        match &self.process {
            Process::Trace(r) => r.reader.prefix_ids(),
            _ => &[],
        }
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
                synthetic(w, self.seed, self.issued, self.t_ns)
            }
            Process::Gamma { gap_mean_ns, cv } => {
                if self.issued > 0 {
                    self.t_ns += round_ns(self.stream.gamma(*gap_mean_ns, *cv));
                }
                synthetic(w, self.seed, self.issued, self.t_ns)
            }
            Process::OnOff(p) => {
                self.t_ns = p.next_ns(self.t_ns, &mut self.stream);
                synthetic(w, self.seed, self.issued, self.t_ns)
            }
            Process::Trace(r) => match r.next(self.seed)? {
                Some(a) => a,
                None => return Ok(None),
            },
        };
        self.issued += 1;
        Ok(Some(arrival))
    }
}

/// Arrival number `id` of a synthetic process, at `time_ns`, with lengths from its own stream.
fn synthetic(w: &Workload, seed: u64, id: u64, time_ns: u64) -> Arrival {
    let (prompt_tokens, output_tokens) = shape(w, seed, id);
    Arrival {
        id,
        time_ns,
        prompt_tokens,
        output_tokens,
    }
}

impl OnOff {
    /// The next arrival time after `t_ns`. Memoryless within a period: a gap that crosses the
    /// period's end restarts at the boundary with the other state's rate.
    fn next_ns(&mut self, mut t_ns: u64, stream: &mut Stream) -> u64 {
        loop {
            let gap_mean = if self.on {
                Some(self.gap_on_ns)
            } else {
                self.gap_off_ns
            };
            if let Some(mean) = gap_mean {
                let t = t_ns.saturating_add(round_ns(stream.exponential(mean)));
                if t < self.period_end_ns {
                    return t;
                }
            }
            t_ns = self.period_end_ns;
            self.on = !self.on;
            let d = if self.on { &self.on_ms } else { &self.off_ms };
            self.period_end_ns = t_ns + ms_to_ns(d.sample(stream)).max(1);
        }
    }
}

impl Replay {
    /// The next row in the window that the sample keeps, as an arrival.
    fn next(&mut self, seed: u64) -> Result<Option<Arrival>, String> {
        loop {
            let Some(row) = self.reader.next_row()? else {
                if !self.in_window {
                    return Err(format!(
                        "{}: no data row from first_row {} on (the trace has {} data rows)",
                        self.path, self.first_row, self.rows_read
                    ));
                }
                return Ok(None);
            };
            self.rows_read += 1;
            if row.row < self.first_row {
                continue;
            }
            self.in_window = true;
            if row.row >= self.end_row {
                return Ok(None);
            }
            if self.sample_fraction < 1.0 {
                let mut s = Stream::new(seed, Purpose::TraceSample, row.row);
                if s.uniform_open01() >= self.sample_fraction {
                    continue;
                }
            }
            let clamp = |x: u32| x.clamp(1, TOKENS_MAX);
            let (prompt, output) = (clamp(row.prompt_tokens), clamp(row.output_tokens));
            let max = self.max_total_tokens;
            let output = output.min(max.saturating_sub(1).max(1));
            let prompt = prompt.min(max.saturating_sub(output).max(1));
            return Ok(Some(Arrival {
                id: row.row,
                time_ns: round_ns(row.offset_ns as f64 / self.speedup),
                prompt_tokens: prompt,
                output_tokens: output,
            }));
        }
    }
}

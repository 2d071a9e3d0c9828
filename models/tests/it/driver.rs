//! The tiny loop that drives a replica's scheduler alone (no kernel): arrivals, aborts and
//! hand-overs at given times, steps at their ends, a pass after every tick, and what each
//! request saw. The engine's tests use it, and the streak's property test runs it twice.

use std::collections::BTreeMap;

use cancelsim_models::engine::EngineConfig;
use cancelsim_models::gpu::{StepCost, StepModel};
use cancelsim_models::protocol::{
    Abort, Checkpoint, Dispatch, Handle, NewRequest, Outbox, Outcome, ReleaseMode, Scheduler,
    UnknownAbort,
};

pub(crate) const MS: u64 = 1_000_000;

pub(crate) fn flat(c0_ns: u64) -> StepModel {
    StepModel::Linear(StepCost {
        c0_ns,
        prefill_tokens_per_s: 0,
        per_seq_ns: 0,
        per_kv_token_ps: 0,
    })
}

pub(crate) fn cfg(window: u32) -> EngineConfig {
    EngineConfig {
        max_num_seqs: 8,
        max_num_batched_tokens: 64,
        chunked_prefill: true,
        block_tokens: 16,
        kv_blocks: 1000,
        watermark_blocks: 0,
        prefix_caching: false,
        window,
        cost: flat(10 * MS),
        checkpoint: Checkpoint::EveryPasses(1),
        release: ReleaseMode::Fenced,
        unknown_abort: UnknownAbort::Ignore,
        tombstones: false,
        lazy_output_every: 0,
    }
}

/// Per request: token times, discarded tokens, release and its block-time.
#[derive(Default, Debug, PartialEq)]
pub(crate) struct Trace {
    pub(crate) tokens_ns: Vec<u64>,
    pub(crate) discarded: u32,
    pub(crate) padding: u32,
    pub(crate) released_ns: Option<u64>,
    /// Its blocks' block-time at its release, and the part retained after its cancel intent.
    pub(crate) kv_block_ns: (u128, u128),
    pub(crate) observed_ns: Option<u64>,
    pub(crate) corrupted_tokens: u32,
}

/// Feed `(time, request)` arrivals, run to idle, return what each request saw.
pub(crate) fn drive(
    rep: &mut impl Scheduler,
    arrivals: &[(u64, NewRequest)],
) -> BTreeMap<u64, Trace> {
    drive_aborts(rep, arrivals, &[])
}

/// The same, with aborts delivered at given times (arrivals first at a tie).
pub(crate) fn drive_aborts(
    rep: &mut impl Scheduler,
    arrivals: &[(u64, NewRequest)],
    aborts: &[(u64, Abort)],
) -> BTreeMap<u64, Trace> {
    drive_full(rep, arrivals, aborts, &[])
}

/// The same, where the caller also needs every output of request `tag` from time `t` on, for
/// each `(t, tag)` of `explicit` (as a cancel intent makes it), delivered with the aborts.
pub(crate) fn drive_full(
    rep: &mut impl Scheduler,
    arrivals: &[(u64, NewRequest)],
    aborts: &[(u64, Abort)],
    explicit: &[(u64, u32)],
) -> BTreeMap<u64, Trace> {
    let mut next_explicit = 0;
    let mut next_abort = 0;
    let mut traces: BTreeMap<u64, Trace> = BTreeMap::new();
    let mut inflight: Vec<Dispatch> = Vec::new();
    let mut next_arrival = 0;
    let mut out = Outbox::default();
    // When each streak step ended: a lazy request's tokens without outputs came out then.
    let mut streak_ns: Vec<u64> = Vec::new();
    for _ in 0..1_000_000 {
        let t_arr = arrivals.get(next_arrival).map(|a| a.0);
        let t_step = inflight.first().map(|d| d.end_ns);
        let t_timer = rep.timer_ns();
        let t_abort = aborts.get(next_abort).map(|a| a.0);
        let t_explicit = explicit.get(next_explicit).map(|a| a.0);
        let now = [t_arr, t_step, t_timer, t_abort, t_explicit]
            .into_iter()
            .flatten()
            .min();
        let Some(now) = now else { return traces };
        if t_step == Some(now) {
            let d = inflight.remove(0);
            let alone = ![t_arr, t_abort, t_explicit].contains(&Some(now))
                && inflight.first().is_none_or(|x| x.end_ns != now);
            if alone && turned(rep, (now, d.step), &mut inflight, &mut streak_ns) {
                continue;
            }
            let report = rep.step_done(now, d.step, &mut out);
            if let Some(j) = report.streak {
                assert_eq!(j as usize, streak_ns.len(), "streak steps in order");
                streak_ns.push(now);
            }
            implicit(&mut traces, &mut out, &streak_ns);
            outputs(&mut traces, &mut out, now);
            released(&mut traces, &mut out, now);
        } else if t_explicit == Some(now) && t_arr != Some(now) {
            let tag = explicit[next_explicit].1;
            next_explicit += 1;
            out.implicit.extend(rep.make_explicit(tag));
            implicit(&mut traces, &mut out, &streak_ns);
        } else if t_abort == Some(now) && t_arr != Some(now) {
            rep.abort(aborts[next_abort].1);
            next_abort += 1;
        } else if t_arr == Some(now) {
            let (_, r) = arrivals[next_arrival];
            next_arrival += 1;
            if rep.enqueue(now, r).is_err() {
                traces.entry(r.id).or_default();
            }
        }
        // Like the world's Schedule class: the scheduler runs after every event of the tick.
        let more_now = arrivals.get(next_arrival).is_some_and(|a| a.0 == now)
            || aborts.get(next_abort).is_some_and(|a| a.0 == now)
            || explicit.get(next_explicit).is_some_and(|a| a.0 == now)
            || inflight.first().is_some_and(|d| d.end_ns == now);
        if !more_now {
            rep.checkpoint(now, &mut out);
            implicit(&mut traces, &mut out, &streak_ns);
            for o in out.observed.drain(..) {
                let t = traces.entry(o.id).or_default();
                assert!(t.observed_ns.is_none(), "observed twice");
                t.observed_ns = Some(now);
            }
            released(&mut traces, &mut out, now);
            while let Some(d) = rep.dispatch(now, &mut out) {
                inflight.push(d);
            }
            implicit(&mut traces, &mut out, &streak_ns);
        }
    }
    panic!("did not go idle");
}

/// Alone at its tick, a step and the pass after it may be one call (`turn`): true if they were.
fn turned(
    rep: &mut impl Scheduler,
    (now, step): (u64, u64),
    inflight: &mut Vec<Dispatch>,
    streak_ns: &mut Vec<u64>,
) -> bool {
    let Some((report, next)) = rep.turn(now, step) else {
        return false;
    };
    let j = report.streak.expect("a turn is a streak step's");
    assert_eq!(j as usize, streak_ns.len(), "streak steps in order");
    streak_ns.push(now);
    inflight.push(next);
    true
}

/// A step's outputs, at its end `now`.
fn outputs(traces: &mut BTreeMap<u64, Trace>, out: &mut Outbox, now: u64) {
    for o in out.outputs.drain(..) {
        let t = traces.entry(o.id).or_default();
        match o.outcome {
            Outcome::Token { index, .. } => {
                assert_eq!(index as usize, t.tokens_ns.len() + 1, "tokens in order");
                t.tokens_ns.push(now);
                t.corrupted_tokens += o.corrupted as u32;
            }
            Outcome::Discarded { .. } => t.discarded += 1,
            Outcome::Padding => t.padding += 1,
            Outcome::Prefill => {}
        }
    }
}

/// Tokens handed over without outputs: one at the end of each of their streak steps.
fn implicit(traces: &mut BTreeMap<u64, Trace>, out: &mut Outbox, streak_ns: &[u64]) {
    for i in out.implicit.drain(..) {
        let t = traces.entry(i.id).or_default();
        assert!(i.count > 0, "an empty hand-over");
        let steps = i.from as usize..(i.from + i.count as u64) as usize;
        t.tokens_ns.extend_from_slice(&streak_ns[steps]);
    }
}

/// Requests whose blocks came back now, each once.
fn released(traces: &mut BTreeMap<u64, Trace>, out: &mut Outbox, now: u64) {
    for r in out.released.drain(..) {
        let t = traces.entry(r.id).or_default();
        assert!(t.released_ns.is_none(), "released twice");
        t.released_ns = Some(now);
        t.kv_block_ns = (r.kv_block_ns, r.kv_block_ns_marked);
    }
}

pub(crate) fn req(id: u64, prompt: u32, output: u32) -> NewRequest {
    NewRequest {
        kv_ready: false,
        length_capped: false,
        lazy: false,
        tag: id as u32,
        handle: Handle {
            runtime_id: id,
            stream: id % 2,
            sequence: id / 10,
        },
        id,
        prompt_tokens: prompt,
        output_tokens: output,
    }
}

//! Workload generation: open-loop arrival processes, trace replay, and the per-request draws.
//!
//! Every draw is keyed. Arrival gaps come from the arrival process's own stream; a request's
//! lengths, deadline and disconnect time come from streams keyed by its id; a conversation's
//! per-turn draws come from streams keyed by (conversation, turn). Nothing a scheduler does can
//! shift them, so two runs that differ only in scheduling, policy or cancellation see the same
//! workload (common random numbers).

pub mod agentic;
mod open_loop;
pub mod trace;

pub use open_loop::OpenLoop;
pub use trace::TraceReader;

use crate::dist::{ms_to_ns, Dist};
use crate::kernel::rng::{key, Purpose, Stream};
use crate::scenario::{Source, Workload};

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

/// Whether request `id`'s output ends at its `max_tokens` (known to the scheduler) rather than at
/// a stop token; from a stream of its own, drawn only when some requests are capped.
pub fn length_capped(w: &Workload, seed: u64, id: u64) -> bool {
    w.length_capped > 0.0
        && Stream::keyed(seed, Purpose::RequestShape, id, key::FINISH_KIND).uniform_open01()
            < w.length_capped
}

/// Tokens an engine may generate past a stop string before the frontend's abort stops it: the
/// request's `max_tokens` beyond its natural end, as the engine sees it.
pub const STOP_OVERRUN_MAX: u32 = 256;

/// If request `id`'s output ends at a stop string, the delay from its last token out to the
/// frontend's abort reaching the engine; from a stream of its own.
pub fn stop_string(w: &Workload, seed: u64, id: u64) -> Option<u64> {
    let st = w.stop_strings.as_ref()?;
    let mut s = Stream::keyed(seed, Purpose::RequestShape, id, key::STOP_STRING);
    let hit = s.uniform_open01() < st.probability;
    let delay_ns = ms_to_ns(st.detect_ms.sample(&mut s));
    hit.then_some(delay_ns)
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

/// Request ids of conversation turns: disjoint from open-loop ids (bit 62), and stable across
/// runs because they name (conversation, turn, request in turn), not an arrival order.
pub fn conversation_request_id(conv: u64, turn: u32, k: u32) -> u64 {
    debug_assert!(conv < 1 << 38 && turn < TURNS_MAX && k < 256);
    (1 << 62) | (conv << 24) | ((turn as u64) << 8) | k as u64
}

/// Which request of its turn `id` is (0 for the first), from a conversation request id.
pub fn conversation_request_index(id: u64) -> u32 {
    (id & 0xff) as u32
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
    let mut s = Stream::new(
        seed,
        Purpose::Conversation,
        (conv << key::TURN_SHIFT) | turn as u64,
    );
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
    let mut s = Stream::new(
        seed,
        Purpose::Conversation,
        (conv << key::TURN_SHIFT) | key::TURN_COUNT,
    );
    tokens(turns, &mut s).min(TURNS_MAX - 1)
}

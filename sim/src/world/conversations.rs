//! Closed-loop conversations: starts, turns, barge-ins, and which turn drives the next.

use rustc_hash::FxHashMap;

use super::event::Event;
use super::event::Tag;
use super::follow::Follow;
use crate::dist::round_ns;
use crate::kernel::rng::{key, Purpose, Stream};
use crate::kernel::NS_PER_S;
use crate::metrics::WorkloadEvents;
use crate::scenario::{Source, Workload};
use crate::workload::{self, Arrival, TOKENS_MAX};
use cancelsim_models::prefix::StreamKey;

/// A conversation in progress.
struct Conv {
    turns: u32,
    turn: u32,
    outstanding: u32,
    /// (request id, tag) of the current turn's requests.
    members: Vec<(u64, Tag)>,
    /// Cancel intents of this owner's requests so far: its own requests are then its group, not
    /// siblings (a sibling belongs to another owner).
    intents: u32,
    /// With history: the history's length at the start of each turn after the first, and the
    /// same as the current turn's requests share it.
    bounds: Vec<u64>,
    shared_bounds: std::sync::Arc<[u64]>,
    /// The current turn's first request: its prompt (history included), and the output tokens
    /// its user saw, once known (it ended, or the user barged in).
    first_prompt: u32,
    first_seen: Option<u32>,
}

/// What happened to a conversation when one of its turns ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TurnEnd {
    /// Nothing: the turn still has requests out, or a superseded generation ended.
    Pending,
    /// The next turn is scheduled.
    Next,
    /// That was its last turn: the conversation is over.
    Over,
}

pub(crate) struct Conversations {
    seed: u64,
    /// Turns carry the conversation's history in their prompts.
    history: bool,
    convs: FxHashMap<u64, Conv>,
    started: u64,
    starts: Stream,
    events: WorkloadEvents,
}

impl Conversations {
    pub fn new(seed: u64, w: &Workload) -> Conversations {
        Conversations {
            seed,
            history: matches!(w.source, Source::Conversations { history: true, .. }),
            convs: FxHashMap::default(),
            started: 0,
            starts: Stream::new(seed, Purpose::Arrival, key::CONVERSATION_STARTS),
            events: WorkloadEvents::default(),
        }
    }

    /// Conversation `conv` starts: the next start is scheduled, and its first turn now.
    pub fn start(&mut self, f: &mut Follow, w: &Workload, conv: u64) {
        let Source::Conversations {
            conversations,
            start_rate_per_s,
            ..
        } = &w.source
        else {
            unreachable!("conversation events need a conversation source")
        };
        assert_eq!(conv, self.started, "conversations started out of order");
        self.events.conversations += 1;
        self.started += 1;
        if self.started < *conversations {
            let gap = self.starts.exponential(NS_PER_S as f64 / start_rate_per_s);
            let next = Event::ConversationStart { conv: conv + 1 };
            f.after(round_ns(gap), next);
        }
        let turns = workload::conversation_turns(w, self.seed, conv);
        if turns > 0 {
            let c = Conv {
                turns,
                turn: 0,
                outstanding: 0,
                members: Vec::new(),
                intents: 0,
                bounds: Vec::new(),
                shared_bounds: std::sync::Arc::new([]),
                first_prompt: 0,
                first_seen: None,
            };
            self.convs.insert(conv, c);
            f.after(0, Event::TurnStart { conv });
        }
    }

    /// A turn starts: its barge-in (in policy runs) is scheduled, and its generation and
    /// requests are returned in order, for the world to admit.
    pub fn turn_start(
        &mut self,
        f: &mut Follow,
        w: &Workload,
        conv: u64,
        barge_ins: bool,
    ) -> (u32, Vec<Arrival>) {
        let Source::Conversations {
            requests_per_turn, ..
        } = &w.source
        else {
            unreachable!("conversation events need a conversation source")
        };
        let per_turn = *requests_per_turn;
        let turn = self.convs[&conv].turn;
        self.events.turns += 1;
        let draws = workload::turn_draws(w, self.seed, conv, turn);
        if let (Some(after), true) = (draws.barge_in_after_ns, barge_ins) {
            let generation = turn;
            f.after(after, Event::BargeIn { conv, generation });
        }
        let c = self.convs.get_mut(&conv).expect("live conversation");
        c.outstanding = per_turn;
        c.members.clear();
        c.first_seen = None;
        if self.history && c.shared_bounds.len() != c.bounds.len() {
            c.shared_bounds = c.bounds.as_slice().into();
        }
        let history = c.bounds.last().copied().unwrap_or(0);
        let now_ns = f.now_ns();
        let arrivals: Vec<Arrival> = (0..per_turn)
            .map(|i| {
                let id = workload::conversation_request_id(conv, turn, i);
                let (message, output_tokens) = workload::shape(w, self.seed, id);
                let prompt_tokens = (history + message as u64).min(TOKENS_MAX as u64) as u32;
                Arrival {
                    id,
                    time_ns: now_ns,
                    prompt_tokens,
                    output_tokens,
                }
            })
            .collect();
        c.first_prompt = arrivals.first().map_or(0, |a| a.prompt_tokens);
        (turn, arrivals)
    }

    /// The token stream request `id` of `conv`'s current turn continues, if turns carry their
    /// history: the first request carries it on past the history, the others share only that.
    pub fn stream_key(&self, conv: u64, id: u64) -> Option<StreamKey> {
        let c = self.convs.get(&conv).filter(|_| self.history)?;
        Some(StreamKey {
            id: conv,
            bounds: c.shared_bounds.clone(),
            whole: workload::conversation_request_index(id) == 0,
        })
    }

    /// The user of `conv` has seen `tokens` of generation `g`'s first request, all it will see:
    /// the request ended, or the user barged in. The first word stands.
    pub fn seen(&mut self, conv: u64, g: u32, tokens: u32) {
        if let Some(c) = self.convs.get_mut(&conv) {
            if c.turn == g && c.first_seen.is_none() {
                c.first_seen = Some(tokens);
            }
        }
    }

    /// The world admitted request `(id, tag)` of conversation `conv`'s current turn.
    pub fn joined(&mut self, conv: u64, id: u64, tag: Tag) {
        if let Some(c) = self.convs.get_mut(&conv) {
            c.members.push((id, tag));
        }
    }

    /// The user barges in on `generation`: if it is still in progress it is superseded, and its
    /// requests are returned for the world to cancel.
    pub fn barge_in(&mut self, conv: u64, generation: u32) -> Option<Vec<(u64, Tag)>> {
        let c = self.convs.get_mut(&conv)?;
        if c.turn != generation || c.outstanding == 0 {
            return None;
        }
        self.events.interruptions += 1;
        self.events.superseded_requests += c.outstanding as u64;
        c.outstanding = 0;
        Some(std::mem::take(&mut c.members))
    }

    /// A request of `conv` got a cancel intent.
    pub fn note_intent(&mut self, conv: u64) {
        if let Some(c) = self.convs.get_mut(&conv) {
            c.intents += 1;
        }
    }

    /// Whether `conv`'s own requests have had a cancel intent: then the owner's group was hit, and
    /// its requests are part of that group, not siblings of it.
    pub fn group_hit(&self, conv: u64) -> bool {
        self.convs.get(&conv).is_some_and(|c| c.intents > 0)
    }

    /// A request of generation `g` of `conv` is done (or refused, or gone).
    pub fn request_done(&mut self, f: &mut Follow, w: &Workload, conv: u64, g: u32) -> TurnEnd {
        let Some(c) = self.convs.get_mut(&conv) else {
            return TurnEnd::Pending;
        };
        if c.turn != g || c.outstanding == 0 {
            return TurnEnd::Pending; // a superseded generation no longer drives the turn
        }
        c.outstanding -= 1;
        if c.outstanding > 0 {
            return TurnEnd::Pending;
        }
        let think = workload::turn_draws(w, self.seed, conv, g).think_ns;
        self.next_turn(f, conv, think)
    }

    /// The next turn of `conv` starts `delay_ns` from now, unless that was the last one.
    pub fn next_turn(&mut self, f: &mut Follow, conv: u64, delay_ns: u64) -> TurnEnd {
        let history = self.history;
        let c = self.convs.get_mut(&conv).expect("live conversation");
        if history {
            // The next prompt holds this one and the output its user saw.
            let seen = c.first_seen.unwrap_or(0) as u64;
            let last = c.bounds.last().copied().unwrap_or(0);
            let next = (c.first_prompt as u64 + seen).min(TOKENS_MAX as u64);
            c.bounds.push(next.max(last));
        }
        c.turn += 1;
        if c.turn >= c.turns {
            self.convs.remove(&conv);
            return TurnEnd::Over;
        }
        f.after(delay_ns, Event::TurnStart { conv });
        TurnEnd::Next
    }

    /// Every conversation ended (conservation).
    pub fn all_ended(&self) -> bool {
        self.convs.is_empty()
    }

    /// Counters of conversations, turns and interruptions.
    pub fn events(&self) -> &WorkloadEvents {
        &self.events
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::Scenario;

    fn workload() -> Workload {
        let text = r#"Scenario(name: "c", seed: 1,
            workload: (source: Conversations(conversations: 3, start_rate_per_s: 1.0,
                turns: Constant(2.0), think_ms: Constant(10.0))),
            cluster: (profile: Named("llama-3.1-8b-h100"), scheduler: Continuous()))"#;
        Scenario::parse(text, "<conversations>").unwrap().workload
    }

    /// Conversation 0, then conversation `next`.
    fn start_two(next: u64) -> Conversations {
        let w = workload();
        let mut c = Conversations::new(1, &w);
        let mut f = Follow::default();
        c.start(&mut f, &w, 0);
        c.start(&mut f, &w, next);
        c
    }

    #[test]
    fn conversations_start_in_order() {
        assert_eq!(start_two(1).events().conversations, 2);
    }

    #[test]
    #[should_panic(expected = "out of order")]
    fn a_conversation_started_twice() {
        start_two(0);
    }
}

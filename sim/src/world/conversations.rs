//! Closed-loop conversations: starts, turns, barge-ins, and which turn drives the next.

use rustc_hash::FxHashMap;

use super::error::Scheduled;
use super::event::Event;
use super::requests::Tag;
use crate::dist::round_ns;
use crate::kernel::rng::{key, Purpose, Stream};
use crate::kernel::{Class, Kernel, LimitError, NS_PER_S};
use crate::metrics::WorkloadEvents;
use crate::scenario::{Source, Workload};
use crate::workload::{self, Arrival};

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
    convs: FxHashMap<u64, Conv>,
    started: u64,
    starts: Stream,
    events: WorkloadEvents,
}

impl Conversations {
    pub fn new(seed: u64) -> Conversations {
        Conversations {
            seed,
            convs: FxHashMap::default(),
            started: 0,
            starts: Stream::new(seed, Purpose::Arrival, key::CONVERSATION_STARTS),
            events: WorkloadEvents::default(),
        }
    }

    /// Conversation `conv` starts: the next start is scheduled, and its first turn now.
    pub fn start(&mut self, k: &mut Kernel<Event>, w: &Workload, conv: u64) -> Scheduled {
        let Source::Conversations {
            conversations,
            start_rate_per_s,
            ..
        } = &w.source
        else {
            unreachable!("conversation events need a conversation source")
        };
        self.events.conversations += 1;
        self.started += 1;
        if self.started < *conversations {
            let gap = self.starts.exponential(NS_PER_S as f64 / start_rate_per_s);
            let next = Event::ConversationStart { conv: conv + 1 };
            k.schedule_in(round_ns(gap), Class::Arrival, next)?;
        }
        let turns = workload::conversation_turns(w, self.seed, conv);
        if turns > 0 {
            let c = Conv {
                turns,
                turn: 0,
                outstanding: 0,
                members: Vec::new(),
                intents: 0,
            };
            self.convs.insert(conv, c);
            k.schedule_at(k.now_ns(), Class::Arrival, Event::TurnStart { conv })?;
        }
        Ok(())
    }

    /// A turn starts: its barge-in (in policy runs) is scheduled, and its generation and
    /// requests are returned in order, for the world to admit.
    pub fn turn_start(
        &mut self,
        k: &mut Kernel<Event>,
        w: &Workload,
        conv: u64,
        barge_ins: bool,
    ) -> Result<(u32, Vec<Arrival>), LimitError> {
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
            k.schedule_in(after, Class::Control, Event::BargeIn { conv, generation })?;
        }
        let c = self.convs.get_mut(&conv).expect("live conversation");
        c.outstanding = per_turn;
        c.members.clear();
        let now_ns = k.now_ns();
        let arrivals = (0..per_turn)
            .map(|i| {
                let id = workload::conversation_request_id(conv, turn, i);
                let (prompt_tokens, output_tokens) = workload::shape(w, self.seed, id);
                Arrival {
                    id,
                    time_ns: now_ns,
                    prompt_tokens,
                    output_tokens,
                }
            })
            .collect();
        Ok((turn, arrivals))
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
    pub fn request_done(
        &mut self,
        k: &mut Kernel<Event>,
        w: &Workload,
        conv: u64,
        g: u32,
    ) -> Result<TurnEnd, LimitError> {
        let Some(c) = self.convs.get_mut(&conv) else {
            return Ok(TurnEnd::Pending);
        };
        if c.turn != g || c.outstanding == 0 {
            return Ok(TurnEnd::Pending); // a superseded generation no longer drives the turn
        }
        c.outstanding -= 1;
        if c.outstanding > 0 {
            return Ok(TurnEnd::Pending);
        }
        let think = workload::turn_draws(w, self.seed, conv, g).think_ns;
        self.next_turn(k, conv, think)
    }

    /// The next turn of `conv` starts `delay_ns` from now, unless that was the last one.
    pub fn next_turn(
        &mut self,
        k: &mut Kernel<Event>,
        conv: u64,
        delay_ns: u64,
    ) -> Result<TurnEnd, LimitError> {
        let c = self.convs.get_mut(&conv).expect("live conversation");
        c.turn += 1;
        if c.turn >= c.turns {
            self.convs.remove(&conv);
            return Ok(TurnEnd::Over);
        }
        k.schedule_in(delay_ns, Class::Arrival, Event::TurnStart { conv })?;
        Ok(TurnEnd::Next)
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

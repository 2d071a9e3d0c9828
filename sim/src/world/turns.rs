//! The world's side of closed-loop conversations: a turn's requests arrive, a barge-in cancels
//! a generation, and a request's end moves its turn on (with the output its user saw, for the
//! next turn's history).

use super::conversations::TurnEnd;
use super::error::Step;
use super::event::Cause;
use super::requests::{Req, Tag};
use super::World;
use crate::workload;

impl World<'_> {
    pub(super) fn on_turn_start(&mut self, conv: u64) -> Step {
        let barge_ins = self.cancel.policy().is_some();
        let w = &self.scenario.workload;
        let (turn, arrivals) = self
            .conversations
            .turn_start(&mut self.follow, w, conv, barge_ins);
        for a in arrivals {
            self.arrive(a, Some((conv, turn)))?;
        }
        Ok(())
    }

    /// The user of `conv` interrupts `generation`: the owner's sink is cleared, the generation's
    /// requests get intents, and the next turn starts at once.
    pub(super) fn on_barge_in(&mut self, conv: u64, generation: u32) -> Step {
        let Some(members) = self.conversations.barge_in(conv, generation) else {
            return Ok(());
        };
        self.sink.clear(&mut self.follow, &mut self.owners, conv);
        for &(id, tag) in &members {
            if workload::conversation_request_index(id) == 0 && self.requests.live(id, tag) {
                let seen = self.requests[tag].life.tokens();
                self.conversations.seen(conv, generation, seen);
            }
        }
        for (id, tag) in members {
            if self.requests.live(id, tag) {
                self.intent(tag, Cause::Interruption)?;
            }
        }
        let end = self.conversations.next_turn(&mut self.follow, conv, 0);
        self.turn_ended(conv, end);
        Ok(())
    }

    /// The request became terminal (completed, cancelled, expired or refused): its turn has one
    /// request fewer out. Once per request, however it ended.
    pub(super) fn turn_over(&mut self, tag: Tag) -> Step {
        let q = &mut self.requests[tag];
        if !q.life.end_turn() {
            return Ok(());
        }
        let Some((c, g)) = q.conv else {
            return Ok(());
        };
        if workload::conversation_request_index(q.id) == 0 {
            self.conversations.seen(c, g, q.life.tokens().min(q.output));
        }
        let w = &self.scenario.workload;
        let end = self.conversations.request_done(&mut self.follow, w, c, g);
        self.turn_ended(c, end);
        Ok(())
    }

    fn turn_ended(&mut self, conv: u64, end: TurnEnd) {
        if end == TurnEnd::Over {
            self.sink.owner_gone(&mut self.owners, conv);
        }
    }

    /// Whether the request's own owner (its conversation) has had a cancel intent: then the
    /// owner's group was hit, and the request is part of that group, not a sibling of it.
    pub(super) fn group_hit(&self, q: &Req) -> bool {
        q.conv.is_some_and(|(c, _)| self.conversations.group_hit(c))
    }
}

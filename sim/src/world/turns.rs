//! The world's side of closed-loop conversations: a turn's requests arrive, a barge-in cancels
//! a generation, and a request's end moves its turn on (with the output its user saw, for the
//! next turn's history).

use super::error::Step;
use super::event::Cause;
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
}

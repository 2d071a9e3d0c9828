//! What follows for a request's output at the sink: its chunks held, admitted after the
//! writer's wait, played or suppressed, and the completion boundary when the last one plays.

use cancelsim_models::ownership::Ticket;

use super::error::Step;
use super::event::Cause;
use super::event::Tag;
use super::playback::{self, Admitted, Hold};
use super::World;
use crate::scenario::Stage;

impl World<'_> {
    pub(super) fn on_chunk_admit(
        &mut self,
        request: u64,
        tag: Tag,
        (born_ns, epoch): (u64, u64),
        retry: u8,
    ) -> Step {
        if !self.requests.live(request, tag) {
            return Ok(());
        }
        let ticket = self
            .sink
            .ticket(self.requests[tag].chunk_owner(), born_ns, epoch);
        self.admit_chunk(tag, &ticket, retry)
    }

    /// The sink takes the request's next chunk.
    pub(super) fn hold_next_chunk(&mut self, tag: Tag) -> Step {
        let who = self.requests[tag].chunk_owner();
        let (f, owners) = (&mut self.follow, &mut self.owners);
        let chunks = &mut self.requests[tag].chunks;
        match self.sink.hold(f, owners, who, tag, chunks)? {
            Hold::Settle => self.chunk_settled(tag),
            Hold::Now(ticket) => self.admit_chunk(tag, &ticket, 0),
            Hold::Waiting => Ok(()),
        }
    }

    /// After the wait: the post-wait admission check, against the state at this moment.
    fn admit_chunk(&mut self, tag: Tag, ticket: &Ticket<u64>, retry: u8) -> Step {
        let who = self.requests[tag].chunk_owner();
        let (f, owners) = (&mut self.follow, &mut self.owners);
        let chunks = &mut self.requests[tag].chunks;
        match self
            .sink
            .admit(f, owners, (who, tag), chunks, (ticket, retry))?
        {
            Admitted::Played { final_chunk } => {
                if final_chunk {
                    self.complete(tag)?;
                }
                if self.sink.has_next(&self.requests[tag].chunks) {
                    self.hold_next_chunk(tag)
                } else {
                    self.try_finalize(tag)
                }
            }
            Admitted::Suppressed => self.chunk_settled(tag),
            Admitted::Expired | Admitted::GaveUp => {
                self.intent(tag, Cause::Playback)?;
                self.chunk_settled(tag)
            }
            Admitted::Retrying => Ok(()),
        }
    }

    /// The application's completion boundary: the last chunk was played.
    fn complete(&mut self, tag: Tag) -> Step {
        let q = &mut self.requests[tag];
        playback::complete(&mut self.owners, q.id)?;
        q.life.terminate();
        self.turn_over(tag)?;
        self.stage_reached(tag, Stage::AfterCompletion)
    }

    /// The chunk held is done with, and the request is terminal: the rest is suppressed.
    fn chunk_settled(&mut self, tag: Tag) -> Step {
        self.sink.settle(&mut self.requests[tag].chunks);
        self.try_finalize(tag)
    }
}

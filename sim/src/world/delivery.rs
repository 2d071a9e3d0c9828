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
        self.deliver(tag, Some((ticket, retry)))
    }

    /// The sink takes the request's next chunk.
    pub(super) fn hold_next_chunk(&mut self, tag: Tag) -> Step {
        self.deliver(tag, None)
    }

    /// Chunks through the sink, in order: the one held whose writer's wait is over (`held`),
    /// or else the next one, held now; each admitted against the state at this moment. It goes
    /// on to the next chunk while one passes at once (no writer's wait), and stops at the first
    /// that waits, retries or ends the request's output.
    fn deliver(&mut self, tag: Tag, mut held: Option<(Ticket<u64>, u8)>) -> Step {
        self.owners_for(tag)?;
        loop {
            let who = self.requests[tag].chunk_owner();
            let (f, owners) = (&mut self.follow, &mut self.owners);
            let chunks = &mut self.requests[tag].chunks;
            let (ticket, retry) = match held.take() {
                Some(h) => h,
                None => match self.sink.hold(f, owners, who, tag, chunks)? {
                    Hold::Settle => return self.chunk_settled(tag),
                    Hold::Now(ticket) => (ticket, 0),
                    Hold::Waiting => return Ok(()),
                },
            };
            let (f, owners) = (&mut self.follow, &mut self.owners);
            let chunks = &mut self.requests[tag].chunks;
            match self
                .sink
                .admit(f, owners, (who, tag), chunks, (&ticket, retry))?
            {
                Admitted::Played { final_chunk } => {
                    if final_chunk {
                        self.complete(tag)?;
                    }
                    if !self.sink.has_next(&self.requests[tag].chunks) {
                        return self.try_finalize(tag);
                    }
                }
                Admitted::Suppressed => return self.chunk_settled(tag),
                Admitted::Expired | Admitted::GaveUp => {
                    self.intent(tag, Cause::Playback)?;
                    return self.chunk_settled(tag);
                }
                Admitted::Retrying => return Ok(()),
            }
        }
    }

    /// The application's completion boundary: the last chunk was played.
    fn complete(&mut self, tag: Tag) -> Step {
        let id = self.requests[tag].id;
        playback::complete(self.owners_for(tag)?, id)?;
        self.requests[tag].life.terminate();
        self.turn_over(tag)?;
        self.stage_reached(tag, Stage::AfterCompletion)
    }

    /// The chunk held is done with, and the request is terminal: the rest is suppressed.
    fn chunk_settled(&mut self, tag: Tag) -> Step {
        self.sink.settle(&mut self.requests[tag].chunks);
        self.try_finalize(tag)
    }
}

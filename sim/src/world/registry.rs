//! A request's record in the ownership controller, made at the first call about it. Until
//! then it is implied: every request arrives `Running`, with no output and no evidence, so a
//! million waiting requests need no million records (the controller's table was 255 MB of the
//! 1M burst's 871). The identities are the world's own, unique by construction, so a record
//! made late answers every call as the one made at arrival would have: the first call finds
//! the same fresh record, and the tombstones, which only terminal records join, keep their
//! order.
//!
//! Every call the world makes about one request goes through `owners_for` or `state_of`.

use cancelsim_models::ownership::{Owners, State};

use super::error::{Step, Stop};
use super::requests::Tag;
use super::World;

impl World<'_> {
    /// The controller, with request `tag`'s record made if it had none.
    #[inline]
    pub(super) fn owners_for(&mut self, tag: Tag) -> Step<&mut Owners<u64>> {
        let q = &mut self.requests[tag];
        if !q.registered() {
            if self.owners.start(q.id, q.generation() as u64).is_err() {
                return Err(Stop::broken(vec![q.id], "a request identity was reused"));
            }
            q.register();
        }
        Ok(&mut self.owners)
    }

    /// Its record's state (`Running` while implied).
    #[inline]
    pub(super) fn state_of(&self, tag: Tag) -> Option<State> {
        let q = &self.requests[tag];
        match q.registered() {
            true => self.owners.state(&q.id),
            false => Some(State::Running),
        }
    }
}

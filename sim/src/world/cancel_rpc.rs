//! The cancel RPC's events, handled for the world: a cancel submitted (the first attempt's
//! evidence, or the fallback a policy takes at once), delivered to its replica or to the
//! handoff, timed out, acknowledged, and the fallback's timer. What each does to the request's
//! cancel state is `cancel.rs`'s; here the world sends, reaches the replica and lets the
//! request leave (`leave.rs`) when its cancel settles.

use cancelsim_models::ownership::{ClockDomain, EvidenceLevel};
use cancelsim_models::protocol::Scope;

use super::cancel::{scope_mark, Ack};
use super::error::Step;
use super::requests::Tag;
use super::World;

impl World<'_> {
    pub(super) fn on_cancel_submit(&mut self, request: u64, tag: Tag, attempt: u8) -> Step {
        if !self.requests.live(request, tag) || self.requests[tag].cancel().done() {
            return Ok(());
        }
        debug_assert!(
            self.cancel.policy().is_some(),
            "cancels only in policy runs"
        );
        if attempt == 0 {
            self.evidence(tag, EvidenceLevel::CancelSubmission, ClockDomain::Local)?;
            if self.cancel.falls_back_at_submit() {
                self.cancel.fall_back(self.requests[tag].cancel_mut());
                return self.try_finalize(tag);
            }
        }
        let handle = self.handle(tag);
        let q = &mut self.requests[tag];
        let replica = q.replica;
        let f = &mut self.follow;
        let to = (replica, &handle);
        self.cancel
            .send(f, q.cancel_mut(), (request, tag), to, attempt);
        Ok(())
    }

    pub(super) fn on_cancel_deliver(
        &mut self,
        request: u64,
        replica: u32,
        scope: Scope,
        attempt: u8,
    ) -> Step {
        let abort = self.cancel.abort(request, scope, attempt);
        self.accounts.hit(scope_mark(scope));
        if self.handoff_abort(request, replica, &abort)? {
            return Ok(());
        }
        self.reach(replica)?;
        self.cluster.abort(&mut self.follow, replica, abort);
        Ok(())
    }

    pub(super) fn on_cancel_timeout(&mut self, request: u64, tag: Tag, attempt: u8) -> Step {
        if !self.requests.live(request, tag) {
            return Ok(());
        }
        let st = self.requests[tag].cancel_mut();
        let gave_up = self
            .cancel
            .timeout(&mut self.follow, st, (request, tag), attempt);
        if gave_up == Some(true) {
            return self.try_finalize(tag);
        }
        Ok(())
    }

    pub(super) fn on_cancel_ack(&mut self, request: u64, tag: Tag) -> Step {
        if !self.requests.live(request, tag) {
            self.cancel.late_ack();
            return Ok(());
        }
        if self.cancel.ack(self.requests[tag].cancel_mut()) == Ack::First {
            self.evidence(tag, EvidenceLevel::FinalCallback, ClockDomain::Local)?;
        }
        self.try_finalize(tag)
    }

    pub(super) fn on_fallback(&mut self, request: u64, tag: Tag) -> Step {
        if self.requests.live(request, tag)
            && self.cancel.fallback_timer(self.requests[tag].cancel_mut())
        {
            return self.try_finalize(tag);
        }
        Ok(())
    }
}

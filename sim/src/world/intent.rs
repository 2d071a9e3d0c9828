//! A request's cancel path inside the world: its storm intent planned at its stage, the intent
//! itself (the controller's local invalidation, then the adapter by policy), the backend's
//! observation, and the evidence of each step. Called by the event handlers above it
//! (`flow.rs`, `turns.rs`, `disagg.rs`, `delivery.rs`); it calls only `leave.rs` below.

use super::cancel::{evidence_mark, stage_mark};
use super::error::{Step, Stop};
use super::event::{Cause, Event};
use super::requests::Tag;
use super::World;
use crate::coverage::Mark;
use crate::dist::ms_to_ns;
use crate::scenario::Stage;
use cancelsim_models::ownership::{ClockDomain, Disposition, EvidenceLevel};
use cancelsim_models::ownership::{State, Timestamp};
use cancelsim_models::protocol::Observed;

impl World<'_> {
    /// Schedule a storm target's intent `delay_ns` from now (once).
    pub(super) fn plan_intent(&mut self, tag: Tag, delay_ns: u64) -> Step {
        let q = &mut self.requests[tag];
        if !q.cancel_mut().schedule_intent() {
            return Ok(());
        }
        let ev = Event::Intent { request: q.id, tag };
        self.follow.after(delay_ns, ev);
        Ok(())
    }

    /// If the request's storm stage is `stage`, its intent is planned now.
    pub(super) fn stage_reached(&mut self, tag: Tag, stage: Stage) -> Step {
        match self.requests[tag].cancel().plan() {
            Some((s, delay)) if s == stage => self.plan_intent(tag, delay),
            _ => Ok(()),
        }
    }

    /// A cancel intent: the controller makes the request terminal at once (local invalidation);
    /// then the adapter acts by policy. One intent per request: the first.
    pub(super) fn intent(&mut self, tag: Tag, cause: Cause) -> Step {
        // Its tokens so far first, and every output from here on (`lazy.rs`).
        self.make_explicit(tag)?;
        let now_ns = self.kernel.now_ns();
        let q = &mut self.requests[tag];
        if !q.cancel_mut().intent_at(now_ns) {
            return Ok(());
        }
        let (id, plan, conv, cancel_won) = (q.id, q.cancel().plan(), q.conv(), q.output_done());
        match (conv, self.jobs.as_mut()) {
            (Some((job, _)), Some(jobs)) => jobs.note_intent(job),
            (Some((c, _)), None) => self.conversations.note_intent(c),
            (None, _) => {}
        }
        self.cancel.count_intent();
        if let (Cause::Storm, Some((stage, _))) = (cause, plan) {
            self.accounts.hit(stage_mark(stage));
        }
        if self.state_of(tag) == Some(State::Completed) {
            self.accounts.hit(Mark::RaceCompletionWon);
        } else if cancel_won && self.requests[tag].output > 0 {
            self.accounts.hit(Mark::RaceCancelWon);
        }
        self.evidence(tag, EvidenceLevel::Intent, ClockDomain::Local)?;
        if self.invalidate(tag, cause)? {
            self.turn_over(tag)?;
        }
        let q = &self.requests[tag];
        if q.life.enqueued() && !q.life.engine_released() {
            let replica = q.replica;
            self.reach(replica)?; // a coasting replica comes up to now first
        }
        let q = &mut self.requests[tag];
        if !q.life.enqueued() {
            // Never reached a backend; if it waits in the router's queue, it leaves it now.
            if self.cluster.unhold(tag) {
                let id = self.requests[tag].id;
                self.arrivals.release_prefix(id);
                return self.try_finalize(tag);
            }
            return Ok(());
        }
        let holds = !q.life.engine_released();
        if holds {
            self.cluster.intent(q.replica, now_ns, tag);
        } else if q.life.in_handoff() {
            // Between the stages: the stage it is at shares its blocks and link with others.
            self.cluster.intent_between(q.replica);
        }
        let f = &mut self.follow;
        self.cancel.on_intent(f, q.cancel_mut(), id, tag, holds);
        Ok(())
    }

    /// The local invalidation: the first terminal transition wins, and never changes after.
    /// True if this intent ended the request (it was running, or the sink just expired it).
    pub(super) fn invalidate(&mut self, tag: Tag, cause: Cause) -> Step<bool> {
        let disposition = match cause {
            Cause::Deadline | Cause::Playback => Disposition::Expired,
            Cause::Storm | Cause::Disconnect | Cause::Interruption | Cause::Job => {
                Disposition::Cancelled
            }
        };
        let before = self.state_of(tag);
        let after = self.terminate(tag, disposition)?;
        // The sink expires a request itself (the controller did it in admit_end): that is this
        // intent's local invalidation too.
        let invalidated_now = before == Some(State::Running) || cause == Cause::Playback;
        let ended_now = invalidated_now && after.is_some_and(State::is_terminal);
        if ended_now {
            self.evidence(tag, EvidenceLevel::LocalInvalidation, ClockDomain::Local)?;
        }
        Ok(ended_now)
    }

    /// `finish` in the controller, checking that a terminal disposition never changes.
    pub(super) fn terminate(&mut self, tag: Tag, d: Disposition) -> Step<Option<State>> {
        let id = self.requests[tag].id;
        let before = self.state_of(tag);
        let after = self.owners_for(tag)?.finish(&id, d);
        let after = after.map_err(Stop::controller(id))?;
        self.requests[tag].life.terminate();
        if before.is_some_and(State::is_terminal) && after.is_some() && after != before {
            return Err(Stop::broken(vec![id], "a terminal disposition changed"));
        }
        Ok(after)
    }

    /// The backend removed a request at a checkpoint.
    pub(super) fn on_observed(&mut self, o: Observed) -> Step {
        if !self.requests.live(o.id, o.tag) {
            return Ok(());
        }
        if self.requests[o.tag].stop_abort {
            // The frontend's own abort after a stop string: the request completed; no cancel.
            self.accounts.stop_abort_observed();
            return Ok(());
        }
        let q = &mut self.requests[o.tag];
        q.cancel_mut().observed_at(self.kernel.now_ns());
        self.cancel.backend_acted(q.cancel_mut());
        let domain = ClockDomain::Backend;
        self.evidence(o.tag, EvidenceLevel::BackendObservation, domain)?;
        if self.requests[o.tag].cancel().intent_ns().is_some() {
            self.cancel.send_ack(&mut self.follow, o.id, o.tag);
            return Ok(());
        }
        // Terminated by the backend without an intent of its own: a group scope, a fault, or a
        // reused id. The adapter sees the request fail. Whoever's cancel it was, even its own
        // owner's (a stale abort of a reused id killing the next turn), it is a loss.
        let q = &mut self.requests[o.tag];
        q.cancel_mut().killed_as_collateral();
        self.cancel.collateral_kill();
        self.terminate(o.tag, Disposition::Cancelled)?;
        self.turn_over(o.tag)?;
        Ok(())
    }

    /// Record one evidence level: in the request's own timeline (virtual ns, for latencies) and
    /// in the controller's ledger (with its clock domain), which refuses out-of-order evidence.
    pub(super) fn evidence(&mut self, tag: Tag, level: EvidenceLevel, domain: ClockDomain) -> Step {
        let now_ns = self.kernel.now_ns();
        let offset_ns = ms_to_ns(self.scenario.backend.clock_offset_ms);
        let ns = match domain {
            ClockDomain::Backend => now_ns + offset_ns,
            _ => now_ns,
        };
        self.owners_for(tag)?;
        let q = &mut self.requests[tag];
        let at = Timestamp { domain, ns };
        let owners = &mut self.owners;
        let id = q.id;
        if q.cancel_mut().record(owners, id, (level, at), now_ns)? {
            self.accounts.hit(evidence_mark(level));
        }
        Ok(())
    }
}

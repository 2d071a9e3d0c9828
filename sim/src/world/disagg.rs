//! What follows each event of a prefill/decode handoff. A request's prefill runs on a prefill
//! replica as a one-token request; once its blocks are back in that pool they are pinned again
//! for the transfer, and the request crosses the link to the decode stage. The decode stage
//! reserves blocks to receive the KV into, the KV crosses the wire, and the request joins a
//! decode engine with its prompt's KV ready. The decode side's completion notice frees the
//! prefill side's blocks; a notice that never comes leaves them to the cleanup owner's reclaim.
//!
//! Cancels: an abort sent to a prefill replica reaches its engine, and, once the prefill is done,
//! its connector (which frees only with `notify_prefill`). An abort sent to a decode replica for
//! a request awaiting its KV is observed by the decode stage, which keeps the receive blocks
//! until the transfer's completion arrives. The router drops a request cancelled before the
//! decode stage took it.

use cancelsim_models::cleanup::{Notice, ReadDone, Returned};
use cancelsim_models::protocol::{Abort, BlastRadius, NewRequest, Observed, Scope};
use cancelsim_models::transfer::End;

use super::accounts::Accounts;
use super::error::{Step, Stop};
use super::event::Event;
use super::event::Tag;
use super::handoff::{Count, Flight, Handoff, Phase};
use super::World;
use crate::coverage::Mark;
use crate::dist::ms_to_ns;
use crate::kernel::rng::{key, Purpose, Stream};
use crate::metrics::HandoffStats;
use crate::scenario::{CheckpointConfig, Policy, Stage};
use crate::workload;
use cancelsim_models::ownership::State;

impl World<'_> {
    /// The final prefill step of a request is done on `prefill`. An abort delivered meanwhile
    /// aborts it at the boundary if the node handles aborts first; otherwise its blocks will be
    /// kept for the decode stage.
    pub(super) fn prefill_done(&mut self, tag: Tag, prefill: u32) -> Step {
        let id = self.requests[tag].id;
        self.accounts.prefill_token();
        let h = self.handoff.as_mut().expect("a prefill/decode world");
        // A backend that never checks for aborts has no order to handle them in.
        let checks = self.scenario.backend.checkpoint != CheckpointConfig::Never;
        let seen = h.take_abort_seen(id) && checks;
        if seen && h.aborts_first() {
            h.count(Count::AbortedAtBoundary);
            self.accounts.hit(Mark::HandoffAbortAtBoundary);
            let o = Observed {
                id,
                tag,
                in_scope: true,
            };
            return self.on_observed(o);
        }
        if seen {
            self.accounts.hit(Mark::HandoffPinnedForNobody);
        }
        h.prefilled(id, prefill);
        self.requests[tag].life.enter_handoff();
        Ok(())
    }

    /// The prefilled request's blocks are back in its prefill pool: pin them again for the
    /// transfer, and send the request across the link.
    pub(super) fn handoff_begin(&mut self, tag: Tag, prefill: u32) -> Step {
        let now_ns = self.kernel.now_ns();
        let q = &self.requests[tag];
        let (id, prompt) = (q.id, q.prompt as u64);
        if q.cancel().intent_ns().is_some() && self.cancel.policy() == Some(&Policy::Ideal) {
            // The ideal aborts at once, so its final prefill step's output is discarded.
            let what = "the ideal cancel left a cancelled request's blocks pinned for its transfer";
            return Err(Stop::broken(vec![id], what));
        }
        let blocks = self.cluster.blocks_for(prefill, prompt);
        if self.pin_prompt(prefill, tag, blocks).is_none() {
            let what = "a prefilled request's blocks were not free to keep for its transfer";
            return Err(Stop::broken(vec![id], what));
        }
        let h = self.handoff.as_mut().expect("a prefill/decode world");
        h.owner(prefill).hold(now_ns, id, blocks, 1);
        let flight = Flight {
            tag,
            prefill,
            decode: prefill,
            phase: Phase::Gap,
            blocks_prefill: blocks,
            bytes: prompt.saturating_mul(h.kv_bytes_per_token()),
            blocks_decode: 0,
            aborted: false,
        };
        h.fly(id, flight);
        let latency_ns = h.link(prefill, None).latency_ns;
        self.lease_timer(prefill, id)?;
        let ev = Event::Handoff { request: id, tag };
        self.follow.after(latency_ns, ev);
        self.stage_reached(tag, Stage::KvTransfer)
    }

    /// The request reaches the decode stage. The router drops it if its client is gone: the
    /// prefill side's blocks then wait for a notice that never comes, unless the router tells it.
    pub(super) fn on_handoff(&mut self, request: u64, tag: Tag) -> Step {
        let h = self.handoff.as_mut().expect("a prefill/decode world");
        if h.flight(request).is_none() {
            return Ok(()); // the ideal cancel took it back in its gap
        }
        debug_assert!(
            self.requests.live(request, tag),
            "in handoff, so in the world"
        );
        if self.state_of(tag) != Some(State::Running) {
            let h = self.handoff.as_mut().expect("a prefill/decode world");
            let f = h.land(request).expect("a flight in its gap");
            h.count(Count::Stranded);
            self.accounts.hit(Mark::HandoffStranded);
            if h.cfg().notify_prefill {
                self.notice(request, f.prefill, key::NOTICE_CANCEL, true, &f)?;
            }
            self.requests[tag].life.leave_handoff();
            return self.try_finalize(tag);
        }
        let prefill = self.handoff.as_ref().and_then(|h| h.flight(request));
        let prefill = prefill.expect("a flight in its gap").prefill;
        let whole = self.decode_request(tag, true);
        let prompt = self.requests[tag].prompt as u64;
        let content = (self.cluster.kv_aware())
            .then(|| self.content_of(request, prompt, self.requests[tag].conv()));
        let kv = content.as_ref().map(|c| (self.kernel.now_ns(), c));
        let decode = self.cluster.route_decode(Some(prefill), Some(&whole), kv);
        let (decode, scored) = decode.expect("enqueued only where a linked decode pool takes it");
        if let Some(s) = scored {
            self.cluster.book_kv(s);
        }
        let blocks = self.cluster.blocks_for(decode, prompt);
        let h = self.handoff.as_mut().expect("a prefill/decode world");
        h.receive(request, decode, blocks);
        self.requests[tag].hand_to_decode(decode);
        self.stage_reached(tag, Stage::AwaitingRemoteKv)?;
        self.try_receive(decode)
    }

    /// After a pass or a step of `replica`: if it decodes for a prefill stage, blocks may have
    /// come back for requests waiting to receive their KV.
    pub(super) fn receive_on(&mut self, replica: u32) -> Step {
        if self.cluster.is_decode(replica) {
            return self.try_receive(replica);
        }
        Ok(())
    }

    /// Requests waiting at `decode` get receive blocks in arrival order, while there are free
    /// blocks; each one's KV then goes on its prefill replica's wire.
    pub(super) fn try_receive(&mut self, decode: u32) -> Step {
        let now_ns = self.kernel.now_ns();
        loop {
            let h = self.handoff.as_mut().expect("a prefill/decode world");
            let Some(id) = h.next_receiving(decode) else {
                return Ok(());
            };
            let f = h.flight(id).expect("waiting to receive, so flying");
            if !h.owner(f.prefill).holds(id) {
                // The prefill side gave the KV back (its lease ran out while this request waited
                // for receive blocks): there is nothing to read, so the decode side computes it.
                h.pop_receiving(decode, false);
                h.land(id);
                h.count(Count::KvReleasedBeforeTransfer);
                self.accounts.hit(Mark::HandoffKvReleasedEarly);
                self.decode_admit(f, false)?;
                continue;
            }
            // A full wire (a million transfers queued on one sender) waits like a full pool.
            let cached = match h.wire(f.prefill, decode).is_full() {
                true => None,
                false => self.pin_prompt(decode, f.tag, f.blocks_decode),
            };
            let h = self.handoff.as_mut().expect("a prefill/decode world");
            let Some(cached) = cached else {
                h.count(Count::ReceiveWait);
                self.accounts.hit(Mark::HandoffReceiveWait);
                return Ok(());
            };
            h.pop_receiving(decode, true);
            // What the decode side has cached does not cross the wire.
            let bytes = h.cached_at_decode(id, cached);
            // Its blocks are read from now: no lease frees them under the transfer.
            h.owner(f.prefill).reading(id);
            let p = h.cfg().transfer_failure;
            let draw = || Stream::keyed(h.seed(), Purpose::Handoff, id, key::TRANSFER_FAILS);
            let fails = p > 0.0 && draw().uniform_open01() < p;
            let lands_ns =
                h.wire(f.prefill, decode)
                    .start(now_ns, id, bytes, f.blocks_prefill, fails);
            let ev = Event::KvLanded {
                request: id,
                prefill: f.prefill,
            };
            self.follow.at(lands_ns, ev);
        }
    }

    /// Transfers on `prefill`'s wire end: the KV is there, or the transfer was cancelled.
    pub(super) fn on_kv_landed(&mut self, prefill: u32) -> Step {
        let now_ns = self.kernel.now_ns();
        let h = self.handoff.as_mut().expect("a prefill/decode world");
        // Each of its wires (one per decode pool): an event's transfer may have been stopped.
        let mut was_full = false;
        let mut ended = Vec::new();
        for wire in h.wires_of(prefill) {
            was_full |= wire.is_full();
            ended.extend(wire.land(now_ns));
        }
        for ended in ended {
            self.transfer_ended(ended.id, ended.end == End::Failed)?;
        }
        if was_full {
            // Requests of every decode replica may have waited for room on this wire.
            let decodes = self.cluster.decode_range();
            for decode in decodes {
                self.try_receive(decode)?;
            }
        }
        Ok(())
    }

    /// A transfer reached its end. A request the decode stage still has joins a decode engine
    /// (which computes its prompt again if the transfer `failed`) and the prefill side is told;
    /// an aborted one's completions go to the decode side's owner.
    fn transfer_ended(&mut self, id: u64, failed: bool) -> Step {
        let now_ns = self.kernel.now_ns();
        let h = self.handoff.as_mut().expect("a prefill/decode world");
        let f = h.land(id).expect("a transfer has its flight");
        // Both sides' leases run again, whole, from the transfer's end; a cancel that came
        // during it frees now.
        for side in [f.prefill, f.decode] {
            let h = self.handoff.as_mut().expect("a prefill/decode world");
            match h.owner(side).read_done(now_ns, id) {
                ReadDone::Nothing => {}
                ReadDone::Resumed => self.lease_timer(side, id)?,
                ReadDone::Returned(r) => self.give_back(side, r)?,
            }
        }
        if f.aborted {
            self.notice(id, f.decode, key::NOTICE_RECEIVED, false, &f)?;
            let h = self.handoff.as_mut().expect("a prefill/decode world");
            if h.second_completion() {
                self.notice(id, f.decode, key::NOTICE_SENT, false, &f)?;
            }
            // The read completed: its completion notice reaches the prefill side too, unless
            // the connector has none for an aborted request.
            let h = self.handoff.as_mut().expect("a prefill/decode world");
            if h.notifies_aborted_transfer() && !h.stops_on_the_wire() {
                self.notice(id, f.prefill, key::NOTICE_TO_PREFILL, false, &f)?;
            }
            return Ok(());
        }
        self.unpin_prompt(f.decode, id, f.blocks_decode);
        self.notice(id, f.prefill, key::NOTICE_TO_PREFILL, false, &f)?;
        if failed {
            self.accounts.hit(Mark::TransferFailed);
        }
        self.decode_admit(f, !failed)
    }

    /// Into the decode engine's waiting queue, with its prompt's KV ready, or to compute it again
    /// (vLLM's `kv_load_failure_policy: recompute`).
    fn decode_admit(&mut self, f: Flight, kv_ready: bool) -> Step {
        let now_ns = self.kernel.now_ns();
        let epoch = self.cluster.intent_epoch(f.decode);
        self.requests[f.tag].life.decode_enqueue(epoch);
        let new = self.decode_request(f.tag, kv_ready);
        if self.cluster.enqueue(f.decode, now_ns, new).is_err() {
            let what = "a decode replica refused a request its prefill replica took";
            return Err(Stop::broken(vec![new.id], what));
        }
        self.share_content(f.decode, f.tag);
        self.cluster.request_pass(&mut self.follow, f.decode);
        self.try_receive(f.decode)
    }

    /// Request `tag` as its decode replica takes it: its whole output, its prompt's KV ready
    /// (or to compute again).
    fn decode_request(&self, tag: Tag, kv_ready: bool) -> NewRequest {
        let q = &self.requests[tag];
        NewRequest {
            id: q.id,
            tag,
            handle: self.handle(tag),
            prompt_tokens: q.prompt,
            output_tokens: q.engine_output(),
            kv_ready,
            length_capped: q.stop_detect_ns().is_none()
                && workload::length_capped(&self.scenario.workload, self.seed, q.id),
            lazy: self.lazy_ok(tag),
        }
    }

    /// A handoff message leaves for `replica`'s cleanup owner, and may be lost on the link.
    fn notice(&mut self, id: u64, replica: u32, sub: u64, cancel: bool, f: &Flight) -> Step {
        let h = self.handoff.as_mut().expect("a prefill/decode world");
        // Between the request's two replicas, or, before it had a decode one, from the router.
        let link = h.link(f.prefill, (f.phase != Phase::Gap).then_some(f.decode));
        if h.lost(id, sub, link) {
            self.accounts.hit(Mark::HandoffNoticeLost);
            return Ok(());
        }
        // The receive completion is the decode node's own; every other message crosses the link.
        let delay_ns = match sub {
            key::NOTICE_RECEIVED => 0,
            _ => link.latency_ns,
        };
        let ev = Event::Notice {
            request: id,
            replica,
            cancel,
        };
        self.follow.after(delay_ns, ev);
        Ok(())
    }

    /// A handoff message reaches `replica`'s cleanup owner.
    pub(super) fn on_notice(&mut self, request: u64, replica: u32, cancel: bool) -> Step {
        let now_ns = self.kernel.now_ns();
        let h = self.handoff.as_mut().expect("a prefill/decode world");
        let owner = h.owner(replica);
        if cancel {
            return match owner.cancel(now_ns, request) {
                Some(r) => self.give_back(replica, r),
                None => Ok(()),
            };
        }
        match owner.notice(now_ns, request) {
            Notice::Returned(r) => self.give_back(replica, r),
            Notice::Pending | Notice::Ignored => Ok(()),
            Notice::Fault => {
                h.count(Count::SecondCompletionFault);
                self.accounts.hit(Mark::HandoffSecondCompletion);
                let abort = Abort {
                    scope: Scope::Engine,
                    fault: Some(BlastRadius::Engine),
                    key: u64::MAX - request,
                    ideal: false,
                };
                self.cluster.abort(&mut self.follow, replica, abort);
                Ok(())
            }
        }
    }

    /// A cleanup owner gave blocks back: into the pool, where waiting work may take them.
    fn give_back(&mut self, replica: u32, r: Returned) -> Step {
        let h = self.handoff.as_mut().expect("a prefill/decode world");
        h.returned(replica, &r);
        self.unpin_prompt(replica, r.id, r.blocks);
        self.cluster.request_pass(&mut self.follow, replica);
        if self.cluster.is_prefill(replica) {
            return Ok(());
        }
        self.try_receive(replica)
    }

    /// Leases of `replica`'s cleanup owner run out now.
    pub(super) fn on_lease_check(&mut self, replica: u32) -> Step {
        let now_ns = self.kernel.now_ns();
        let h = self.handoff.as_mut().expect("a prefill/decode world");
        let expired = h.owner(replica).expire(now_ns);
        for r in expired {
            self.accounts.hit(Mark::HandoffLeaseExpired);
            self.give_back(replica, r)?;
        }
        Ok(())
    }

    /// A hold of `id` just began on `replica`: its lease, if any, gets a check when it runs out.
    fn lease_timer(&mut self, replica: u32, id: u64) -> Step {
        let h = self.handoff.as_mut().expect("a prefill/decode world");
        if let Some(at_ns) = h.owner(replica).deadline_ns(id) {
            // Weak: a lease check keeps no run alive by itself. The run goes on through leases
            // while work waits (`World::waits_on_leases`); at its end, leases left are settled.
            let ev = Event::LeaseCheck { replica };
            let delay_ns = at_ns - self.kernel.now_ns();
            self.follow.weak_after(delay_ns, ev);
        }
        Ok(())
    }

    /// An abort for `request` reaches `replica`. True if the handoff took it (the request is
    /// between the stages); false if it goes to the replica's engine as usual.
    pub(super) fn handoff_abort(
        &mut self,
        request: u64,
        replica: u32,
        abort: &Abort,
    ) -> Step<bool> {
        let now_ns = self.kernel.now_ns();
        let Some(h) = self.handoff.as_mut() else {
            return Ok(false);
        };
        if abort.ideal {
            return self.ideal_handoff_abort(request);
        }
        let scope = abort.scope;
        let Some(f) = h.flight(request) else {
            if self.cluster.is_prefill(replica) {
                // Maybe still on the engine: whether it gets there before its last step ends
                // decides the abort order's case. Maybe its blocks are kept: the connector sees it.
                h.abort_seen(request);
                if let Some(r) = h.owner(replica).cancel(now_ns, request) {
                    self.give_back(replica, r)?;
                }
            }
            return Ok(false);
        };
        let tag = f.tag;
        let q = &self.requests[tag];
        let own = scope.reaches(&self.cancel.handle(q.id, q.owner()));
        if !own || replica != f.decode || f.phase == Phase::Gap {
            // The prefill connector frees blocks not on the wire, if it frees on a cancel.
            if own && replica == f.prefill && f.phase != Phase::OnWire {
                if let Some(r) = h.owner(replica).cancel(now_ns, request) {
                    self.give_back(replica, r)?;
                }
            }
            return Ok(false);
        }
        if !f.aborted {
            self.decode_abort(request, f)?;
        }
        Ok(true) // a second delivery of an abort the decode stage handled changes nothing
    }

    /// The ideal cancel of `request`: every block it holds for the handoff, on either side,
    /// comes back now, and its transfer stops; nothing waits for a notice or a lease, and no
    /// sender wedges. True if the request was between the stages (no engine has it); false if
    /// an engine does, which handles the abort at once too.
    fn ideal_handoff_abort(&mut self, request: u64) -> Step<bool> {
        let now_ns = self.kernel.now_ns();
        // A hold may outlive its flight: a completion notice still on its way to the prefill.
        for replica in 0..self.cluster.len() as u32 {
            let h = self.handoff.as_mut().expect("a prefill/decode world");
            if let Some(r) = h.owner(replica).release(now_ns, request) {
                self.accounts.hit(Mark::HandoffIdealRelease);
                self.give_back(replica, r)?;
            }
        }
        let h = self.handoff.as_mut().expect("a prefill/decode world");
        let Some(f) = h.land(request) else {
            return Ok(false);
        };
        match f.phase {
            Phase::Gap => {}
            Phase::Receiving => h.drop_receiving(f.decode, request),
            Phase::OnWire => {
                let stopped = h.wire(f.prefill, f.decode).stop(now_ns, request);
                debug_assert!(stopped.is_some(), "a flight on the wire has its transfer");
                self.accounts.hit(Mark::TransferCancelled);
                self.unpin_prompt(f.decode, request, f.blocks_decode);
                self.cluster.request_pass(&mut self.follow, f.decode);
            }
        }
        if f.phase != Phase::Gap {
            let h = self.handoff.as_mut().expect("a prefill/decode world");
            h.count(Count::AbortedAwaitingKv);
        }
        self.observed_between(request, f.tag)?;
        if f.phase != Phase::Gap {
            self.try_receive(f.decode)?;
        }
        self.try_finalize(f.tag)?;
        Ok(true)
    }

    /// A request between the stages is no longer in the handoff, and its abort is observed.
    fn observed_between(&mut self, request: u64, tag: Tag) -> Step {
        self.requests[tag].life.leave_handoff();
        let o = Observed {
            id: request,
            tag,
            in_scope: true,
        };
        self.on_observed(o)
    }

    /// The decode stage aborts a request awaiting its KV: it keeps the receive blocks until
    /// the transfer's completion, or its lease, returns them.
    fn decode_abort(&mut self, request: u64, f: Flight) -> Step {
        let now_ns = self.kernel.now_ns();
        let h = self.handoff.as_mut().expect("a prefill/decode world");
        h.count(Count::AbortedAwaitingKv);
        match f.phase {
            Phase::Receiving => {
                h.drop_receiving(f.decode, request);
                h.land(request);
            }
            _ => {
                let pending = if h.second_completion() { 2 } else { 1 };
                h.owner(f.decode)
                    .hold(now_ns, request, f.blocks_decode, pending);
                h.abort_on_wire(request);
                // The decode side no longer holds them as the request's own: its owner does.
                let ended = h
                    .wire(f.prefill, f.decode)
                    .cancel(now_ns, request)
                    .is_some();
                if !ended {
                    // A late write can still land in them: no lease frees them until it ends.
                    h.owner(f.decode).reading(request);
                }
                self.accounts.hit(Mark::TransferCancelled);
                if ended {
                    // Stopped on the wire, which may wedge the sender.
                    self.maybe_wedge(f.prefill, request)?;
                    self.transfer_ended(request, false)?;
                }
                self.lease_timer(f.decode, request)?;
            }
        }
        if self
            .handoff
            .as_ref()
            .is_some_and(|h| h.cfg().notify_prefill)
        {
            self.notice(request, f.prefill, key::NOTICE_CANCEL, true, &f)?;
        }
        self.observed_between(request, f.tag)?;
        self.try_finalize(f.tag)
    }

    /// Cancelling `request`'s transfer on the wire may wedge its sender, `prefill`: alive, but
    /// making no progress until a hang detector, if any, kills it.
    fn maybe_wedge(&mut self, prefill: u32, request: u64) -> Step {
        let now_ns = self.kernel.now_ns();
        let h = self.handoff.as_mut().expect("a prefill/decode world");
        let p = h.cfg().wedge_probability;
        let draw = || Stream::keyed(h.seed(), Purpose::Handoff, request, key::WEDGE);
        if p == 0.0 || draw().uniform_open01() >= p || !self.cluster.wedge(prefill, now_ns) {
            return Ok(());
        }
        h.count(Count::Wedge);
        self.accounts.hit(Mark::HandoffWedge);
        if let Some(ms) = h.cfg().hang_detector_ms {
            let ev = Event::HangCheck {
                replica: prefill,
                since_ns: now_ns,
            };
            self.follow.after(ms_to_ns(ms), ev);
        }
        Ok(())
    }

    /// The hang detector finds `replica` still wedged since `since_ns`: it kills the engine
    /// (every request on it fails) and the engine starts again.
    pub(super) fn on_hang_check(&mut self, replica: u32, since_ns: u64) -> Step {
        if !self.cluster.unwedge(replica, since_ns) {
            return Ok(());
        }
        let h = self.handoff.as_mut().expect("a prefill/decode world");
        h.hang_killed((self.kernel.now_ns() - since_ns) as f64 / 1e9);
        let abort = Abort {
            scope: Scope::Engine,
            fault: Some(BlastRadius::Engine),
            key: u64::MAX - (1 << 32) - replica as u64,
            ideal: false,
        };
        self.cluster.abort(&mut self.follow, replica, abort);
        Ok(())
    }

    /// The run is over: leases left are settled, blocks held with none are never returned; both
    /// go back to their pools so the pools' conservation can be checked. The handoff's books,
    /// with each stage's stalls.
    pub(super) fn handoff_finish(&mut self, now_ns: u64) -> Option<HandoffStats> {
        for (replica, r) in self.handoff.as_mut()?.finish(now_ns) {
            self.unpin_prompt(replica, r.id, r.blocks);
        }
        let h = self.handoff.as_mut().expect("a prefill/decode world");
        self.accounts.cleanups_pending(h.abandoned());
        let (by_lease, given_up) = h.settled();
        self.accounts.hit_n(Mark::HandoffLeaseExpired, by_lease);
        self.accounts.hit_n(Mark::HandoffNeverReturned, given_up);
        let mut stats = h.stats();
        for (_, since_ns) in self.cluster.wedged() {
            stats.wedge_s += (now_ns - since_ns) as f64 / 1e9;
        }
        stats.prefill.admission_stalls = self.cluster.stage_totals(true).stalls_pinned;
        stats.decode.admission_stalls = self.cluster.stage_totals(false).stalls_pinned;
        Some(stats)
    }
}

/// Whether the run must go on through weak events: requests are still in the system and
/// cleanup owners hold blocks a lease may return (work may be waiting for them). Asked only when
/// nothing but weak events is left.
#[cold]
pub(super) fn waits_on_leases(accounts: &Accounts, handoff: Option<&Handoff>) -> bool {
    accounts.tally().little.in_system > 0 && handoff.is_some_and(|h| h.holds_leases())
}

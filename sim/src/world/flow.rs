//! What follows each event: the world's routing between its components, one handler per event
//! and one per transition of a request's life (arrive, intent, token, chunk, release, leave).
//! The state and the rules live in the components; this file only says who is told what, in
//! which order (the order is part of the run hash).

use cancelsim_models::ownership::State;
use cancelsim_models::ownership::{ClockDomain, Disposition, EvidenceLevel};

use cancelsim_models::protocol::{Abort, NewRequest, Outcome, Released, Retired, Scope};

use super::accounts::Shares;
use super::error::{Step, Stop};
use super::event::{Cause, Event};
use super::handoff::Count;
use super::requests::{Arriving, Req, Tag, TurnRef};
use super::{arrivals, World};
use crate::kernel::LimitError;
use crate::scenario::Stage;
use crate::workload::{self, Arrival};

impl World<'_> {
    pub(super) fn on_arrival(&mut self, request: u64) -> Step {
        let a = self.arrivals.take(request);
        self.arrive(a, None)?;
        self.arrivals.pull(&mut self.follow, self.scenario)
    }

    /// A deadline or a disconnect of a request still in progress.
    pub(super) fn on_timer(&mut self, request: u64, tag: Tag, cause: Cause) -> Step {
        if !self.requests.live(request, tag) || self.is_done(tag) {
            return Ok(());
        }
        self.accounts.timer(cause == Cause::Deadline);
        self.intent(tag, cause)
    }

    /// The frontend's abort after a stop string reaches the engine, if it still has the request.
    pub(super) fn on_stop_abort(&mut self, request: u64, tag: Tag) -> Step {
        if !self.requests.live(request, tag) || self.requests[tag].life.engine_released() {
            return Ok(());
        }
        let runtime_id = self.handle(tag).runtime_id;
        let q = &mut self.requests[tag];
        q.abort_at_stop();
        let replica = q.replica;
        self.reach(replica)?;
        let abort = Abort {
            scope: Scope::Request(runtime_id),
            fault: None,
            key: request | 1 << 63,
            ideal: false,
        };
        self.cluster.abort(&mut self.follow, replica, abort);
        Ok(())
    }

    pub(super) fn on_storm_intent(&mut self, request: u64, tag: Tag) -> Step {
        if !self.requests.live(request, tag) {
            return Ok(());
        }
        self.requests[tag].cancel_mut().intent_fired();
        self.intent(tag, Cause::Storm)?;
        self.try_finalize(tag)
    }

    /// A step ends: each output is costed, tokens go on to the sink, and released requests may
    /// leave.
    pub(super) fn on_step_done(&mut self, replica: u32, step: u64) -> Step {
        self.reach(replica)?; // a coast's wake-up: its turns first
        if self.turned(replica, step)? {
            return Ok(());
        }
        let now_ns = self.kernel.now_ns();
        let (report, mut out) = self.cluster.step_done(replica, step, now_ns);
        let prefill = self.cluster.is_prefill(replica);
        let shares = Shares::of(&report, now_ns);
        // The share first (the hand-overs of this step may count it), the log's trim after them.
        self.implicit_all_with(&mut out.implicit, (replica, report.streak, shares.unit()))?;
        for &o in &out.outputs {
            let (cost, cancel) = self.requests[o.tag].cost_and_cancel();
            self.accounts.step_share(cost, cancel, &o, &shares);
            match o.outcome {
                Outcome::Token { last: true, .. } if prefill => {
                    self.prefill_done(o.tag, replica)?
                }
                Outcome::Token { index, last } => self.on_token(o.tag, index, last, o.corrupted)?,
                Outcome::Discarded { sampled: true } => self.discarded_token(o.tag),
                _ => {}
            }
        }
        for &rel in &out.released {
            self.on_released(rel)?;
        }
        for &r in &out.retired {
            self.on_retired(r)?;
        }
        self.cluster.recycle(out);
        self.cluster.request_pass(&mut self.follow, replica);
        self.receive_on(replica)
    }

    /// A streak step that changes nothing outside its replica ended, and the pass right after
    /// it would run at once (nothing else is due at this tick) and only dispatch the next one:
    /// the replica does both in one call (`Cluster::turn`), and the kernel dispatches the pass
    /// as it would have (`Kernel::dispatch_now`). False, with nothing done, if not.
    fn turned(&mut self, replica: u32, step: u64) -> Step<bool> {
        if self.kernel.pending_now() || !self.cluster.turns(replica) {
            return Ok(false);
        }
        // Requests waiting to receive on a decode replica may get blocks after its step and
        // after its pass (`receive_on`): the long way. With none waiting, both are no-ops.
        if let Some(h) = self.handoff.as_mut() {
            if self.cluster.is_decode(replica) && h.next_receiving(replica).is_some() {
                return Ok(false);
            }
        }
        let now_ns = self.kernel.now_ns();
        let Some((report, d)) = self.cluster.turn(replica, step, now_ns) else {
            return Ok(false);
        };
        let streak_step = report.streak.expect("a turn is a streak step's");
        self.streak_step(replica, streak_step, Shares::of(&report, now_ns).unit());
        let pass = Event::SchedulePass { replica };
        self.kernel.dispatch_now(pass.class(), pass)?;
        self.progress();
        self.recorder.step(replica, &d);
        if !self.coasts.on() || !self.coast_from(replica, &d) {
            let done = Event::StepDone {
                replica,
                step: d.step,
            };
            self.follow.at(d.end_ns, done);
        }
        Ok(true)
    }

    /// A scheduler pass: the checkpoint's observations and releases, then steps dispatched until
    /// the window is full, then the requests that started.
    pub(super) fn on_schedule_pass(&mut self, replica: u32) -> Step {
        debug_assert!(!self.coasting(replica), "a pass of a coasting replica");
        let now_ns = self.kernel.now_ns();
        let (report, mut out) = self.cluster.checkpoint(replica, now_ns);
        self.cancel.checkpoint_report(report.unknown, report.faults);
        self.implicit_all(&mut out.implicit)?;
        for &o in &out.observed {
            self.on_observed(o)?;
        }
        for &rel in &out.released {
            self.on_released(rel)?;
        }
        for &r in &out.retired {
            self.on_retired(r)?;
        }
        self.receive_on(replica)?;
        while let Some(d) = self.cluster.dispatch(replica, now_ns, &mut out) {
            self.recorder.step(replica, &d);
            let done = Event::StepDone {
                replica,
                step: d.step,
            };
            self.follow.at(d.end_ns, done);
        }
        self.implicit_all(&mut out.implicit)?;
        for &tag in &out.started {
            if self.requests[tag].life.start(now_ns) {
                self.recover.admitted(self.requests[tag].arrival_ns, now_ns);
                self.accounts.started();
                self.stage_reached(tag, Stage::Prefill)?;
            }
        }
        self.cluster.recycle(out);
        self.cluster.arm_timer(&mut self.follow, replica, now_ns);
        Ok(())
    }

    fn is_done(&self, tag: Tag) -> bool {
        self.state_of(tag).is_none_or(State::is_terminal) || self.requests[tag].output_done()
    }

    /// A request arrives: it starts in the controller, may get a storm plan, and is routed.
    pub(super) fn arrive(&mut self, a: Arrival, conv: Option<TurnRef>) -> Step {
        let now_ns = self.kernel.now_ns();
        let limit = self.scenario.limits.max_in_system;
        if self.requests.live_count() >= limit {
            return Err(LimitError::InSystem {
                limit,
                time_ns: now_ns,
            }
            .into());
        }
        self.arrivals.hash(&a);
        let session = match conv {
            Some((c, _)) => Some(c),
            // A trace's second prefix block: its first is a system prompt that every row of a
            // Mooncake trace shares (id 0), so it would send them all to one replica.
            None => self.arrivals.prefix_of(a.id).get(1).copied(),
        };
        // A shared queue routes once the request is past its arrival (it may wait there).
        let early = (!self.cluster.shares_queue()).then(|| match self.prefill_locally(&a, conv) {
            Some(local) => local,
            None if self.cluster.kv_aware() => {
                let content = self.content_of(a.id, a.prompt_tokens as u64, conv);
                self.cluster.route_kv(now_ns, &content)
            }
            None => self.cluster.route(session),
        });
        let plan = self.cancel.plan(a.id, now_ns);
        let arriving = Arriving {
            replica: early.unwrap_or(0),
            conv,
            stop_detect_ns: workload::stop_string(&self.scenario.workload, self.seed, a.id),
            plan,
        };
        let q = Req::arriving(&a, now_ns, arriving);
        let tag = self.requests.insert(q);
        match (conv, self.jobs.is_some()) {
            (Some((job, _)), true) => self.job_joined(job, a.id, tag),
            (Some((c, _)), false) => self.conversations.joined(c, a.id, tag),
            (None, _) => {}
        }
        let stop_string = self.requests[tag].stop_detect_ns().is_some();
        self.accounts.arrived(plan.is_some(), stop_string);
        match plan {
            Some((Stage::BeforeAdmission, _)) => {
                // Cancelled before it reaches a replica: nothing to clean up on a backend.
                self.intent(tag, Cause::Storm)?;
                return self.try_finalize(tag);
            }
            Some((Stage::AfterArrival, delay)) => self.plan_intent(tag, delay)?,
            _ => {}
        }
        if early.is_none() {
            match self.cluster.route_or_hold(tag, session, now_ns)? {
                Some(r) => self.requests[tag].route(r),
                None => {
                    self.arrivals.hold_prefix(a.id);
                    return Ok(()); // waits in the router's queue
                }
            }
        }
        self.enqueue(tag, a)
    }

    /// Replicas fell below a shared queue's bound: the requests waiting there go, in order.
    fn dispatch_held(&mut self) -> Step {
        while let Some((tag, r)) = self.cluster.next_held() {
            let q = &mut self.requests[tag];
            q.route(r);
            let a = Arrival {
                id: q.id,
                time_ns: q.arrival_ns,
                prompt_tokens: q.prompt,
                output_tokens: q.output,
            };
            let entered = self.enqueue(tag, a);
            self.arrivals.release_prefix(a.id);
            entered?;
        }
        Ok(())
    }

    /// Into its replica's waiting queue, or refused if it can never fit there.
    fn enqueue(&mut self, tag: Tag, a: Arrival) -> Step {
        let now_ns = self.kernel.now_ns();
        let handle = self.handle(tag);
        let q = &self.requests[tag];
        let (replica, plan) = (q.replica, q.cancel().plan());
        // On a prefill replica, or prefilled where it decodes (a colocated replica, or a decode
        // replica under conditional disaggregation).
        let prefill = self.cluster.disaggregated() && self.cluster.is_prefill(replica);
        let new = NewRequest {
            id: a.id,
            tag,
            handle,
            prompt_tokens: a.prompt_tokens,
            // A prefill replica computes the prompt and samples one token, which it keeps.
            output_tokens: match prefill {
                true => 1,
                false => q.engine_output(),
            },
            kv_ready: false,
            // A prefill replica's request is capped at one token (`max_tokens: 1`).
            length_capped: prefill
                || (q.stop_detect_ns().is_none()
                    && workload::length_capped(&self.scenario.workload, self.seed, a.id)),
            lazy: self.lazy_ok(tag),
        };
        // A prefill replica takes the prompt and one token; the decode stage must take it all.
        let whole = NewRequest {
            output_tokens: self.requests[tag].engine_output(),
            kv_ready: true,
            length_capped: false,
            lazy: false,
            ..new
        };
        self.reach(replica)?;
        let fits = !prefill || self.cluster.decode_accepts(replica, &whole);
        if !fits || self.cluster.enqueue(replica, now_ns, new).is_err() {
            return self.reject(tag);
        }
        if let Some(h) = self.handoff.as_mut().filter(|_| !prefill) {
            h.count(Count::LocalPrefill); // conditional disaggregation kept it where it decodes
        }
        // On a prefill replica too: its transfer keeps the cached prefix through the cache.
        self.share_content(replica, tag);
        let epoch = self.cluster.intent_epoch(replica);
        self.requests[tag].life.enqueue(epoch);
        self.accounts.admitted();
        if self.cancel.policy().is_some() {
            let w = &self.scenario.workload;
            arrivals::client_timers(&mut self.follow, w, self.seed, (a.id, tag));
        }
        if let Some((Stage::Queued, delay)) = plan {
            self.plan_intent(tag, delay)?;
        }
        self.cluster.request_pass(&mut self.follow, replica);
        Ok(())
    }

    fn reject(&mut self, tag: Tag) -> Step {
        let q = &mut self.requests[tag];
        q.life.reject();
        let id = q.id;
        let cancelled = self.owners_for(tag)?.finish(&id, Disposition::Cancelled);
        cancelled.map_err(Stop::controller(id))?;
        self.requests[tag].life.terminate();
        self.turn_over(tag)?;
        self.try_finalize(tag)
    }

    /// A request's blocks are back in its replica's pool.
    fn on_released(&mut self, rel: Released) -> Step {
        if !self.requests.live(rel.id, rel.tag) {
            let what = "release of a request that is not here";
            return Err(Stop::broken(vec![rel.id], what));
        }
        let q = &mut self.requests[rel.tag];
        let (held, retained) = (rel.kv_block_ns, rel.kv_block_ns_marked);
        self.accounts.released(&mut q.cost, held, retained);
        q.life.release(rel.restarts, self.kernel.now_ns());
        if let Some(st) = q.cancel_if_any() {
            self.cancel.backend_acted(st);
        }
        if q.cancel().intent_ns().is_some() {
            let domain = ClockDomain::Backend;
            self.evidence(rel.tag, EvidenceLevel::ResourceRelease, domain)?;
        }
        if let Some(p) = self.handoff.as_mut().and_then(|h| h.take_prefilled(rel.id)) {
            self.handoff_begin(rel.tag, p)?;
        }
        self.try_finalize(rel.tag)
    }

    /// A request left its replica: no step in flight holds it any more.
    fn on_retired(&mut self, r: Retired) -> Step {
        if !self.requests.live(r.id, r.tag) {
            let what = "a replica retired a request that is not here";
            return Err(Stop::broken(vec![r.id], what));
        }
        self.requests[r.tag].life.retire();
        self.try_finalize(r.tag)?;
        self.dispatch_held()
    }

    /// Output token `index` of a request: the lifecycle moves on, then the token passes the
    /// controller. After the terminal transition it is a late output, discarded here.
    pub(super) fn on_token(&mut self, tag: Tag, index: u32, last: bool, corrupted: bool) -> Step {
        let now_ns = self.kernel.now_ns();
        let q = &mut self.requests[tag];
        if index > q.output {
            // Past a stop string: the engine does not know the output ended. Discarded.
            self.accounts.token_overrun();
            return Ok(());
        }
        let stop_ns = q.stop_detect_ns().filter(|_| index == q.output);
        let last = last || stop_ns.is_some();
        if let Some(delay_ns) = stop_ns {
            let ev = Event::StopAbort { request: q.id, tag };
            self.follow.after(delay_ns, ev);
        }
        let q = &mut self.requests[tag];
        q.life.token(index, now_ns);
        // Blocks released unsafely by someone's cancel: a sibling harmed by it.
        if corrupted && q.chunks.corrupted() && q.cancel().intent_ns().is_none() {
            q.cancel_mut().harmed();
        }
        if index == 1 {
            self.stage_reached(tag, Stage::Decode)?;
        }
        if last {
            self.last_token(tag)?;
        }
        debug_assert!(
            !self.requests[tag].life.terminal()
                || self.state_of(tag).is_none_or(State::is_terminal)
        );
        let q = &mut self.requests[tag];
        if q.life.terminal() {
            self.accounts.late_token(&mut q.cost);
            return Ok(());
        }
        if self.sink.token(&mut q.chunks, last) {
            self.hold_next_chunk(tag)?;
        }
        Ok(())
    }

    /// A token sampled by a step in flight and thrown away by the replica (the request was
    /// aborted, preempted, or past its end). If the request was already cancelled or expired,
    /// it is a late output like any other: every token produced after the terminal transition
    /// is a discard, whichever step it came from. (A completed request's overshoot past its end
    /// is the window's waste, not a late output.)
    fn discarded_token(&mut self, tag: Tag) {
        let state = self.state_of(tag);
        let q = &mut self.requests[tag];
        if q.life.terminal() && state != Some(State::Completed) {
            self.accounts.late_token(&mut q.cost);
            q.cost.late_discard();
        }
    }

    fn last_token(&mut self, tag: Tag) -> Step {
        let now_ns = self.kernel.now_ns();
        let q = &mut self.requests[tag];
        q.life.last_token(now_ns);
        self.accounts.completion_at(now_ns);
        let c = q.cancel();
        if c.intent_ns().is_some() && c.evidence(EvidenceLevel::FinalCallback).is_none() {
            self.evidence(tag, EvidenceLevel::FinalCallback, ClockDomain::Local)?;
        }
        self.stage_reached(tag, Stage::AfterFinalOutput)
    }
}

//! The adapter's cancel client: which requests a storm targets, the handle each request is named
//! by, and the cancel RPC (submission delay, attempts with loss, duplicates and timeouts, bounded
//! retries, acknowledgements, the finish-and-discard fallback). Its random draws come from
//! streams keyed by the request, so nothing here can shift anyone else's workload.

use cancelsim_models::ownership::EvidenceLevel;
use cancelsim_models::protocol::{Abort, Handle, Scope};

pub(crate) use super::cancel_state::CancelState;
use super::cluster::radius;
use super::event::Event;
use super::event::Tag;
use super::follow::Follow;
use crate::coverage::Mark;
use crate::dist::ms_to_ns;
use crate::kernel::rng::{key, Purpose, Stream};
use crate::metrics::CancelRpc;
use crate::scenario::{CheckpointConfig, GroupScope, IdentityMode, Policy, Scenario, Stage};

/// What the adapter does with an acknowledgement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ack {
    /// After the retry budget or the fallback: late evidence, reopening nothing.
    Late,
    /// The first acknowledgement: final-callback evidence.
    First,
    Repeat,
}

pub(crate) struct CancelClient<'s> {
    seed: u64,
    scenario: &'s Scenario,
    /// None in the counterfactual run, which has no intents.
    policy: Option<&'s Policy>,
    /// Test-only broken variant: "per-request" through the engine's handle.
    aborts_batch: bool,
    rpc: CancelRpc,
    /// Intents the backend has neither observed nor released yet.
    in_flight: u64,
    /// Cancels awaiting an attempt's outcome (`CancelState::awaiting`).
    awaiting: u64,
    /// The stages a `Random` storm picks from: a prefill/decode graph has two more places, and
    /// the colocated draws stay as they were.
    lifecycle: &'static [Stage],
}

impl<'s> CancelClient<'s> {
    pub fn new(
        scenario: &'s Scenario,
        seed: u64,
        policy: Option<&'s Policy>,
        aborts_batch: bool,
    ) -> Self {
        CancelClient {
            seed,
            scenario,
            policy,
            aborts_batch,
            rpc: CancelRpc::default(),
            in_flight: 0,
            awaiting: 0,
            lifecycle: match scenario.prefill_decode() {
                Some(_) => &Stage::LIFECYCLE_DISAGGREGATED,
                None => Stage::LIFECYCLE,
            },
        }
    }

    pub fn policy(&self) -> Option<&'s Policy> {
        self.policy
    }

    pub fn finish_and_discard(&self) -> bool {
        matches!(self.policy, Some(Policy::FinishAndDiscard))
    }

    /// The storm's plan for request `id`: whether it is a target, at which stage, after which
    /// delay. All three draws are made for every request, so the plan of one never shifts another.
    pub fn plan(&self, id: u64, now_ns: u64) -> Option<(Stage, u64)> {
        let c = self.scenario.cancellation.as_ref()?;
        self.policy?;
        let mut s = Stream::new(self.seed, Purpose::CancelPlan, id);
        let draw = s.uniform_open01();
        let hit = if c.requests.is_empty() {
            draw < c.fraction
        } else {
            c.requests.contains(&id)
        };
        let now_s = now_ns as f64 / 1e9;
        let hit = hit
            && c.window_s
                .is_none_or(|(from, to)| (from..to).contains(&now_s));
        let lifecycle = self.lifecycle;
        let pick = s.below(lifecycle.len() as u64);
        let delay = ms_to_ns(c.delay_ms.sample(&mut s));
        hit.then(|| {
            let stage = match c.stage {
                Stage::Random => lifecycle[pick as usize],
                s => s,
            };
            (stage, delay)
        })
    }

    /// How the runtime names request `id` of `owner`.
    pub fn handle(&self, id: u64, owner: u64) -> Handle {
        let a = &self.scenario.adapter;
        let runtime_id = match a.identity {
            IdentityMode::ServerGenerated => id.wrapping_add(1),
            IdentityMode::ClientReused { pool } => id % pool + 1,
        };
        Handle {
            runtime_id,
            stream: if a.streams == 0 {
                owner
            } else {
                owner % a.streams
            },
            sequence: owner,
        }
    }

    pub fn count_intent(&mut self) {
        self.rpc.intents += 1;
    }

    /// After the local invalidation: ask the backend by policy. `holds` says whether the backend
    /// still holds the request; a request that never reached a backend gets nothing.
    pub fn on_intent(
        &mut self,
        f: &mut Follow,
        st: &mut CancelState,
        id: u64,
        tag: Tag,
        holds: bool,
    ) {
        let Some(policy) = self.policy else {
            return;
        };
        if matches!(policy, Policy::FinishAndDiscard) {
            return;
        }
        if st.begin(holds) {
            self.in_flight += 1;
        }
        let mut s = Stream::keyed(self.seed, Purpose::CancelRpc, id, key::SUBMIT_DELAY);
        let delay = ms_to_ns(self.scenario.adapter.submit_delay_ms.sample(&mut s));
        let delay = if matches!(policy, Policy::Ideal) {
            0
        } else {
            delay
        };
        let submit = Event::CancelSubmit {
            request: id,
            tag,
            attempt: 0,
        };
        f.after(delay, submit);
        if let Policy::PerRequestWithFallback { fallback_after_ms } = policy {
            // Weak, as the timeout: it matters only while an attempt is awaited.
            let at = ms_to_ns(*fallback_after_ms);
            f.weak_after(at, Event::Fallback { request: id, tag });
        }
    }

    /// At the first submission under `PerRequestWithFallback`, a backend that cannot observe
    /// means falling back to finish-and-discard at once, never touching the abort path.
    pub fn falls_back_at_submit(&self) -> bool {
        matches!(self.policy, Some(Policy::PerRequestWithFallback { .. }))
            && self.scenario.backend.checkpoint == CheckpointConfig::Never
    }

    pub fn fall_back(&mut self, st: &mut CancelState) {
        st.fall_back();
        self.settle(st);
        self.rpc.fallbacks += 1;
    }

    /// No attempt of this request's cancel is awaited any more: its timers change nothing now.
    /// Also as the request leaves, so the count follows the requests in the world.
    pub fn settle(&mut self, st: &mut CancelState) {
        if st.settle() {
            assert!(self.awaiting > 0, "an awaited cancel was counted");
            self.awaiting -= 1;
        }
    }

    /// Cancels awaiting an attempt's outcome: while any is, its timeout or fallback timer can
    /// still change the run, so the run goes on through them.
    pub fn awaiting(&self) -> u64 {
        self.awaiting
    }

    /// The scope the adapter's cancel goes through, by policy.
    fn scope(&self, h: &Handle) -> Scope {
        match self.policy {
            Some(Policy::GroupAbort(GroupScope::Stream)) => Scope::Stream(h.stream),
            Some(Policy::GroupAbort(GroupScope::Sequence)) => Scope::Sequence(h.sequence),
            Some(Policy::GroupAbort(GroupScope::Prefix)) => Scope::Prefix(h.runtime_id),
            Some(Policy::GroupAbort(GroupScope::Engine)) => Scope::Engine,
            Some(Policy::Ideal) => Scope::Request(h.runtime_id),
            _ if self.aborts_batch => Scope::Engine,
            _ => Scope::Request(h.runtime_id),
        }
    }

    /// Send cancel attempt `attempt` of request `(request, tag)` on `replica`: it may be lost or
    /// duplicated, and it times out unless acknowledged.
    pub fn send(
        &mut self,
        f: &mut Follow,
        st: &mut CancelState,
        (request, tag): (u64, Tag),
        (replica, handle): (u32, &Handle),
        attempt: u8,
    ) {
        let scope = self.scope(handle);
        if st.send(attempt) {
            self.awaiting += 1;
        }
        self.rpc.attempts += 1;
        let a = &self.scenario.adapter;
        let mut s = Stream::keyed(self.seed, Purpose::CancelRpc, request, attempt as u64 + 1);
        // The ideal cancel's transport is perfect: nothing lost, nothing late, no duplicate.
        let ideal = self.policy == Some(&Policy::Ideal);
        let lost = s.uniform_open01() < a.loss && !ideal;
        let latency = ms_to_ns(a.rpc_latency_ms.sample(&mut s)) * !ideal as u64;
        let dup = s.uniform_open01() < a.duplicate && !ideal;
        let dup_latency = ms_to_ns(a.rpc_latency_ms.sample(&mut s));
        if lost {
            self.rpc.lost += 1;
        } else {
            let deliver = Event::CancelDeliver {
                request,
                replica,
                scope,
                attempt,
            };
            f.after(latency, deliver);
            if dup {
                // The same attempt delivered twice: the backend must treat it idempotently.
                self.rpc.duplicates += 1;
                f.after(dup_latency, deliver);
            }
        }
        let timeout = Event::CancelTimeout {
            request,
            tag,
            attempt,
        };
        // Weak: once the attempt is acknowledged the timeout changes nothing, and a timeout
        // longer than the run (`timeout_ms: 1e9`) must not keep a finished run alive. While the
        // attempt is awaited, the run goes on through it (`awaiting`).
        f.weak_after(ms_to_ns(a.timeout_ms), timeout);
    }

    /// The abort a delivered attempt makes, with its fault drawn (the backend's randomness is
    /// keyed by the request and attempt too).
    pub fn abort(&self, request: u64, scope: Scope, attempt: u8) -> Abort {
        let b = &self.scenario.backend;
        let p = b.abort_fault_probability;
        let ideal = self.policy == Some(&Policy::Ideal);
        let fault = (p > 0.0
            && !ideal
            && Stream::keyed(self.seed, Purpose::AbortFault, request, attempt as u64 + 1)
                .uniform_open01()
                < p)
            .then(|| radius(b.abort_fault_radius));
        Abort {
            scope,
            fault,
            key: request,
            ideal,
        }
    }

    /// Attempt `attempt` timed out. Returns `Some(true)` if the client gave up now (the request
    /// may settle), `Some(false)` if it retries, `None` if the timeout is stale.
    pub fn timeout(
        &mut self,
        f: &mut Follow,
        st: &mut CancelState,
        (request, tag): (u64, Tag),
        attempt: u8,
    ) -> Option<bool> {
        if st.done() || st.attempts() != attempt + 1 {
            return None;
        }
        if (st.attempts() as u32) < self.scenario.adapter.max_attempts {
            let attempt = attempt + 1;
            let retry = Event::CancelSubmit {
                request,
                tag,
                attempt,
            };
            f.after(0, retry);
            return Some(false);
        }
        st.exhaust();
        self.settle(st);
        self.rpc.budget_exhausted += 1;
        if matches!(self.policy, Some(Policy::PerRequestWithFallback { .. })) {
            self.fall_back(st);
        }
        Some(true)
    }

    /// An acknowledgement reaches the adapter.
    pub fn ack(&mut self, st: &mut CancelState) -> Ack {
        if st.exhausted() || st.fallback() {
            self.rpc.late_callbacks += 1;
            Ack::Late
        } else if st.ack() {
            self.settle(st);
            self.rpc.acks += 1;
            Ack::First
        } else {
            Ack::Repeat
        }
    }

    /// An acknowledgement for a request that already left: late evidence.
    pub fn late_ack(&mut self) {
        self.rpc.late_callbacks += 1;
    }

    /// The fallback bound ran out. True if the client falls back now.
    pub fn fallback_timer(&mut self, st: &mut CancelState) -> bool {
        if st.observed_ns().is_some() || st.acked() || st.fallback() {
            return false;
        }
        self.fall_back(st);
        true
    }

    /// The backend removed the request (observed an abort) or returned its blocks: the cancel is
    /// no longer in flight.
    pub fn backend_acted(&mut self, st: &mut CancelState) {
        if st.acted() {
            assert!(self.in_flight > 0, "a cancel in flight was counted");
            self.in_flight -= 1;
        }
    }

    /// The backend observed the cancel of `(id, tag)`: its acknowledgement travels back.
    pub fn send_ack(&self, f: &mut Follow, id: u64, tag: Tag) {
        let mut s = Stream::keyed(self.seed, Purpose::CancelRpc, id, key::ACK_LATENCY);
        let latency = ms_to_ns(self.scenario.adapter.rpc_latency_ms.sample(&mut s));
        let ack = Event::CancelAck { request: id, tag };
        f.after(latency, ack);
    }

    /// A request terminated by the backend without an intent of its own.
    pub fn collateral_kill(&mut self) {
        self.rpc.collateral_kills += 1;
    }

    /// Aborts that reached nobody, and faults, as a checkpoint reported them.
    pub fn checkpoint_report(&mut self, unknown: u32, faults: u32) {
        self.rpc.unknown_aborts += unknown as u64;
        self.rpc.faults += faults as u64;
    }

    /// Nothing more of the cancel path can happen to a request with this state.
    pub fn settled(&self, st: &CancelState, enqueued: bool) -> bool {
        st.intent_ns().is_none()
            || !enqueued
            || matches!(self.policy, Some(Policy::FinishAndDiscard) | None)
            || st.done()
    }

    pub fn in_flight(&self) -> u64 {
        self.in_flight
    }

    pub fn rpc(&self) -> &CancelRpc {
        &self.rpc
    }
}

/// The coverage mark of an abort's scope.
pub(crate) fn scope_mark(scope: Scope) -> Mark {
    match scope {
        Scope::Request(_) => Mark::ScopeRequest,
        Scope::Stream(_) => Mark::ScopeStream,
        Scope::Sequence(_) => Mark::ScopeSequence,
        Scope::Prefix(_) => Mark::ScopePrefix,
        Scope::Engine => Mark::ScopeEngine,
    }
}

/// The coverage mark of a storm stage.
pub(crate) fn stage_mark(stage: Stage) -> Mark {
    match stage {
        Stage::BeforeAdmission => Mark::StageBeforeAdmission,
        Stage::Queued => Mark::StageQueued,
        Stage::Prefill => Mark::StagePrefill,
        Stage::Decode => Mark::StageDecode,
        Stage::AfterFinalOutput => Mark::StageAfterFinalOutput,
        Stage::AfterCompletion => Mark::StageAfterCompletion,
        Stage::AfterArrival | Stage::Random => Mark::StageAfterArrival,
        Stage::KvTransfer => Mark::StageKvTransfer,
        Stage::AwaitingRemoteKv => Mark::StageAwaitingRemoteKv,
    }
}

/// The coverage mark of an evidence level.
pub(crate) fn evidence_mark(level: EvidenceLevel) -> Mark {
    match level {
        EvidenceLevel::Intent => Mark::EvidenceIntent,
        EvidenceLevel::LocalInvalidation => Mark::EvidenceLocalInvalidation,
        EvidenceLevel::CancelSubmission => Mark::EvidenceCancelSubmission,
        EvidenceLevel::BackendObservation => Mark::EvidenceBackendObservation,
        EvidenceLevel::FinalCallback => Mark::EvidenceFinalCallback,
        EvidenceLevel::ResourceRelease => Mark::EvidenceResourceRelease,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::world::cancel_state::tests::intended;

    /// Two clients of one scenario: a cancel counted by one and settled by the other.
    fn two(s: &Scenario) -> (CancelClient<'_>, CancelClient<'_>) {
        let c = || CancelClient::new(s, 1, Some(&Policy::PerRequest), false);
        (c(), c())
    }

    #[test]
    fn the_client_counts_what_its_requests_await() {
        let s = Scenario::default_embedded();
        let mut c = CancelClient::new(&s, 1, Some(&Policy::PerRequest), false);
        let (mut f, mut st) = (Follow::default(), intended());
        c.on_intent(&mut f, &mut st, 7, 0, true);
        c.send(&mut f, &mut st, (7, 0), (0, &Handle::default()), 0);
        assert_eq!((c.in_flight(), c.awaiting()), (1, 1));
        c.backend_acted(&mut st);
        assert_eq!(c.ack(&mut st), Ack::First);
        assert_eq!((c.in_flight(), c.awaiting()), (0, 0));
    }

    #[test]
    #[should_panic(expected = "an awaited cancel was counted")]
    fn settled_by_a_client_that_never_sent_it() {
        let s = Scenario::default_embedded();
        let (mut a, mut b) = two(&s);
        let (mut f, mut st) = (Follow::default(), intended());
        a.send(&mut f, &mut st, (7, 0), (0, &Handle::default()), 0);
        b.settle(&mut st);
    }

    #[test]
    #[should_panic(expected = "a cancel in flight was counted")]
    fn acted_on_by_a_client_that_never_began_it() {
        let s = Scenario::default_embedded();
        let (mut a, mut b) = two(&s);
        let (mut f, mut st) = (Follow::default(), intended());
        a.on_intent(&mut f, &mut st, 7, 0, true);
        b.backend_acted(&mut st);
    }
}

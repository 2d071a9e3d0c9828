//! One request's cancel path, as the adapter sees it: the storm's plan, the intent, the
//! attempts and their outcome, the backend's observation, and the evidence timeline. The client
//! (`cancel.rs`) keeps the counts across requests; each request's state changes only through the
//! transitions here, which assert the order of the cancel protocol.

use cancelsim_models::ownership::{EvidenceLevel, Owners, Timestamp};

use super::error::Stop;
use crate::scenario::Stage;

/// One request's cancel path. Times are virtual ns; `None` is unknown.
#[derive(Clone, Debug, Default)]
pub(crate) struct CancelState {
    /// The storm's plan for it: the stage its intent waits for, and the delay after it.
    plan: Option<(Stage, u64)>,
    /// An `Intent` event is scheduled and has not fired yet.
    intent_pending: bool,
    intent_ns: Option<u64>,
    attempts: u8,
    acked: bool,
    exhausted: bool,
    fallback: bool,
    observed_ns: Option<u64>,
    /// Terminated by the backend without an intent of its own.
    collateral: bool,
    /// Harmed by someone else's cancel (killed or corrupted): a sibling.
    sibling: bool,
    /// Its evidence timeline, by level (`u64::MAX`: unknown), boxed at its first evidence:
    /// most requests have none.
    evidence_ns: Option<Box<[u64; 6]>>,
    /// Counted in the client's cancels in flight (an intent the backend has not acted on yet).
    in_flight: bool,
    /// Counted in the client's cancels awaiting an attempt's outcome: sent, and not yet
    /// acknowledged, out of budget or fallen back. Only these make a timeout matter.
    awaiting: bool,
}

impl CancelState {
    /// No plan, no intent, nothing sent.
    pub const NEW: CancelState = CancelState {
        plan: None,
        intent_pending: false,
        intent_ns: None,
        attempts: 0,
        acked: false,
        exhausted: false,
        fallback: false,
        observed_ns: None,
        collateral: false,
        sibling: false,
        evidence_ns: None,
        in_flight: false,
        awaiting: false,
    };

    pub fn new(plan: Option<(Stage, u64)>) -> CancelState {
        CancelState {
            plan,
            ..CancelState::default()
        }
    }

    /// Its storm intent is scheduled now. False if one already is, or it has had its intent.
    pub fn schedule_intent(&mut self) -> bool {
        if self.intent_pending || self.intent_ns.is_some() {
            return false;
        }
        self.intent_pending = true;
        true
    }

    /// The scheduled storm intent fires.
    pub fn intent_fired(&mut self) {
        assert!(
            self.intent_pending,
            "a storm intent fired that was never scheduled"
        );
        self.intent_pending = false;
    }

    /// Its cancel intent, at `now_ns`. False if it already had one: the first intent is the one.
    pub fn intent_at(&mut self, now_ns: u64) -> bool {
        if self.intent_ns.is_some() {
            return false;
        }
        self.intent_ns = Some(now_ns);
        true
    }

    /// The backend removed it at `now_ns` (again, for a request a second stage held).
    pub fn observed_at(&mut self, now_ns: u64) {
        assert!(
            self.observed_ns.is_none_or(|o| o <= now_ns),
            "a backend observation went back in time"
        );
        self.observed_ns = Some(now_ns);
    }

    /// Terminated by the backend without an intent of its own: a sibling killed.
    pub fn killed_as_collateral(&mut self) {
        assert!(
            self.intent_ns.is_none(),
            "a cancelled request counted as collateral"
        );
        self.collateral = true;
        self.sibling = true;
    }

    /// Harmed by someone else's cancel (its blocks were released under it).
    pub fn harmed(&mut self) {
        assert!(
            self.intent_ns.is_none(),
            "a cancelled request counted as harmed"
        );
        self.sibling = true;
    }

    pub fn plan(&self) -> Option<(Stage, u64)> {
        self.plan
    }
    pub fn intent_pending(&self) -> bool {
        self.intent_pending
    }
    pub fn intent_ns(&self) -> Option<u64> {
        self.intent_ns
    }
    pub fn observed_ns(&self) -> Option<u64> {
        self.observed_ns
    }
    pub fn fallback(&self) -> bool {
        self.fallback
    }
    pub fn collateral(&self) -> bool {
        self.collateral
    }
    pub fn sibling(&self) -> bool {
        self.sibling
    }
    pub fn awaiting(&self) -> bool {
        self.awaiting
    }

    /// The adapter takes up its cancel: true if the backend still holds the request, so the
    /// cancel is now in flight there.
    pub fn begin(&mut self, holds: bool) -> bool {
        assert!(
            self.intent_ns.is_some(),
            "a cancel path began without an intent"
        );
        if holds {
            assert!(!self.in_flight, "a cancel counted in flight twice");
            self.in_flight = true;
        }
        holds
    }

    /// The backend acted on it (observed or released): true if it was in flight until now.
    pub fn acted(&mut self) -> bool {
        std::mem::take(&mut self.in_flight)
    }

    /// Attempt `attempt` is sent: true if an attempt is awaited from now and was not before.
    pub fn send(&mut self, attempt: u8) -> bool {
        assert!(
            self.intent_ns.is_some(),
            "a cancel was sent without an intent"
        );
        assert!(
            !self.done(),
            "a cancel was sent after its client was done with it"
        );
        assert_eq!(attempt, self.attempts, "cancel attempts out of order");
        self.attempts = attempt + 1;
        !std::mem::replace(&mut self.awaiting, true)
    }

    /// No attempt is awaited any more: true if one was.
    pub fn settle(&mut self) -> bool {
        std::mem::take(&mut self.awaiting)
    }

    /// An acknowledgement: true if it is the first (it may come before any attempt of its own,
    /// when someone else's abort took the request first).
    pub fn ack(&mut self) -> bool {
        !std::mem::replace(&mut self.acked, true)
    }

    /// Every attempt timed out.
    pub fn exhaust(&mut self) {
        assert!(!self.exhausted, "a cancel ran out of attempts twice");
        self.exhausted = true;
    }

    /// Finish and discard from now on.
    pub fn fall_back(&mut self) {
        assert!(!self.fallback, "a cancel fell back twice");
        self.fallback = true;
    }

    pub fn attempts(&self) -> u8 {
        self.attempts
    }
    pub fn acked(&self) -> bool {
        self.acked
    }
    pub fn exhausted(&self) -> bool {
        self.exhausted
    }

    /// No more attempts will be made: acknowledged, out of budget, or fallen back.
    pub fn done(&self) -> bool {
        self.acked || self.exhausted || self.fallback
    }

    pub fn evidence(&self, level: EvidenceLevel) -> Option<u64> {
        let at = self.evidence_ns.as_ref()?[level as usize];
        (at != u64::MAX).then_some(at)
    }

    /// Record one evidence level of request `id` at virtual time `now_ns`: in its own timeline
    /// (for latencies) and in the controller's ledger (with its clock domain), which refuses
    /// evidence out of order. Each level once: false if it was already there.
    pub fn record(
        &mut self,
        owners: &mut Owners<u64>,
        id: u64,
        (level, at): (EvidenceLevel, Timestamp),
        now_ns: u64,
    ) -> Result<bool, Stop> {
        assert!(now_ns != u64::MAX, "the end of time is no evidence");
        let slot = &mut self
            .evidence_ns
            .get_or_insert_with(|| Box::new([u64::MAX; 6]))[level as usize];
        if *slot != u64::MAX {
            return Ok(false);
        }
        *slot = now_ns;
        // The record of a request in the world is never evicted, so its ledger is always there.
        match owners.record_evidence(&id, level, at) {
            Ok(()) => Ok(true),
            Err(e) => Err(Stop::broken(vec![id], format!("evidence: {e}"))),
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A cancel path with its intent (at 5 ns).
    pub(in crate::world) fn intended() -> CancelState {
        let mut st = CancelState::new(None);
        assert!(st.intent_at(5));
        st
    }

    #[test]
    fn a_cancel_path_in_order_passes_every_assertion() {
        let mut st = CancelState::new(Some((Stage::Decode, 1)));
        assert!(st.schedule_intent() && !st.schedule_intent());
        st.intent_fired();
        assert!(st.intent_at(5) && !st.intent_at(6));
        assert!(!st.schedule_intent(), "no second intent once it had one");
        assert!(st.begin(true) && st.send(0) && !st.send(1));
        assert!(st.settle() && !st.settle());
        st.observed_at(7);
        st.observed_at(7);
        assert!(st.acted() && !st.acted());
        assert!(st.ack() && !st.ack());
        assert_eq!(
            (st.attempts(), st.intent_ns(), st.observed_ns()),
            (2, Some(5), Some(7))
        );
    }

    #[test]
    #[should_panic(expected = "never scheduled")]
    fn an_intent_fired_unscheduled() {
        CancelState::new(None).intent_fired();
    }

    #[test]
    #[should_panic(expected = "went back in time")]
    fn observed_back_in_time() {
        let mut st = intended();
        st.observed_at(9);
        st.observed_at(8);
    }

    #[test]
    #[should_panic(expected = "counted as collateral")]
    fn collateral_with_an_intent() {
        intended().killed_as_collateral();
    }

    #[test]
    #[should_panic(expected = "counted as harmed")]
    fn harmed_with_an_intent() {
        intended().harmed();
    }

    #[test]
    #[should_panic(expected = "began without an intent")]
    fn begun_without_an_intent() {
        CancelState::new(None).begin(true);
    }

    #[test]
    #[should_panic(expected = "in flight twice")]
    fn in_flight_twice() {
        let mut st = intended();
        st.begin(true);
        st.begin(true);
    }

    #[test]
    #[should_panic(expected = "sent without an intent")]
    fn sent_without_an_intent() {
        CancelState::new(None).send(0);
    }

    #[test]
    #[should_panic(expected = "after its client was done")]
    fn sent_after_the_ack() {
        let mut st = intended();
        st.send(0);
        st.ack();
        st.send(1);
    }

    #[test]
    #[should_panic(expected = "attempts out of order")]
    fn an_attempt_skipped() {
        intended().send(1);
    }

    #[test]
    #[should_panic(expected = "out of attempts twice")]
    fn exhausted_twice() {
        let mut st = intended();
        st.exhaust();
        st.exhaust();
    }

    #[test]
    #[should_panic(expected = "fell back twice")]
    fn fell_back_twice() {
        let mut st = intended();
        st.fall_back();
        st.fall_back();
    }

    #[test]
    #[should_panic(expected = "end of time")]
    fn evidence_at_the_end_of_time() {
        let mut owners = Owners::new(cancelsim_models::ownership::Retention::default());
        let at = Timestamp {
            domain: cancelsim_models::ownership::ClockDomain::Local,
            ns: 0,
        };
        let _ = intended().record(&mut owners, 1, (EvidenceLevel::Intent, at), u64::MAX);
    }
}

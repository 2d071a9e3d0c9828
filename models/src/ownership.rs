//! The per-request ownership controller.
//!
//! This implements the contract of the reference in `shared/seeds/000_…` ("Preserve terminal
//! state and revisions", "Run a local ownership reference", "Check admission after every wait"),
//! with its classifications and its order of checks, plus what the article asks for beyond the
//! reference: an evidence ledger per request, bounded tombstones, and a registry that hands out
//! snapshots rather than mutable rows.
//!
//! It is sans-IO: no clock, no queue, no I/O. Admission is split into `admit_begin` (before the
//! wait) and `admit_end` (after it), and the caller decides what happens in between.
//!
//! Invalid input is rejected with nothing changed: every method validates and looks up before it
//! mutates.

use std::collections::VecDeque;

use crate::fxhash::{FxHashMap, FxHashSet};
use std::fmt;
use std::hash::Hash;
use std::sync::Arc;

/// A request identity. The reference accepts any non-empty string.
pub trait Identity: Clone + Eq + Hash + fmt::Debug {
    fn is_valid(&self) -> bool;
}

impl Identity for String {
    fn is_valid(&self) -> bool {
        !self.is_empty()
    }
}

impl Identity for u64 {
    fn is_valid(&self) -> bool {
        true
    }
}

/// Where a request's lifecycle stands. `Running` until the first terminal transition.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum State {
    Running,
    Completed,
    Cancelled,
    Expired,
}

impl State {
    pub fn is_terminal(self) -> bool {
        self != State::Running
    }

    pub fn as_str(self) -> &'static str {
        match self {
            State::Running => "running",
            State::Completed => "completed",
            State::Cancelled => "cancelled",
            State::Expired => "expired",
        }
    }
}

/// A terminal disposition, the argument of `finish`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Disposition {
    Completed,
    Cancelled,
    Expired,
}

impl Disposition {
    pub fn parse(s: &str) -> Option<Disposition> {
        match s {
            "completed" => Some(Disposition::Completed),
            "cancelled" => Some(Disposition::Cancelled),
            "expired" => Some(Disposition::Expired),
            _ => None,
        }
    }

    pub fn state(self) -> State {
        match self {
            Disposition::Completed => State::Completed,
            Disposition::Cancelled => State::Cancelled,
            Disposition::Expired => State::Expired,
        }
    }
}

/// How `update` classified a piece of output evidence.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UpdateClass {
    Accepted,
    Stale,
    Duplicate,
    Conflict,
    /// The identity's record was evicted from the tombstones: the evidence is late, and rejected.
    Late,
}

impl UpdateClass {
    pub fn as_str(self) -> &'static str {
        match self {
            UpdateClass::Accepted => "accepted",
            UpdateClass::Stale => "stale",
            UpdateClass::Duplicate => "duplicate",
            UpdateClass::Conflict => "conflict",
            UpdateClass::Late => "late",
        }
    }
}

/// Owned, immutable payload bytes. Small payloads (up to 30 bytes, the simulator's per-token
/// markers) are stored inline, larger ones shared; either way cloning never lets anyone mutate
/// the bytes, and there is no allocation per token.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Payload(PayloadRepr);

#[derive(Clone, PartialEq, Eq, Hash)]
enum PayloadRepr {
    Inline {
        len: u8,
        bytes: [u8; Payload::INLINE_MAX],
    },
    Shared(Arc<[u8]>),
}

impl Payload {
    pub const INLINE_MAX: usize = 30;

    pub fn empty() -> Payload {
        Payload(PayloadRepr::Inline {
            len: 0,
            bytes: [0; Self::INLINE_MAX],
        })
    }
}

impl From<&[u8]> for Payload {
    fn from(b: &[u8]) -> Payload {
        if b.len() <= Self::INLINE_MAX {
            let mut bytes = [0; Self::INLINE_MAX];
            bytes[..b.len()].copy_from_slice(b);
            Payload(PayloadRepr::Inline {
                len: b.len() as u8,
                bytes,
            })
        } else {
            Payload(PayloadRepr::Shared(Arc::from(b)))
        }
    }
}

impl std::ops::Deref for Payload {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.0 {
            PayloadRepr::Inline { len, bytes } => &bytes[..*len as usize],
            PayloadRepr::Shared(b) => b,
        }
    }
}

impl fmt::Debug for Payload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Payload({:?})", String::from_utf8_lossy(self))
    }
}

/// The result of `admit_end`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Admission {
    /// The current payload may go to the consumer.
    Submitted(Payload),
    /// The admission was for an obsolete generation.
    Stale,
    /// The request is terminal (that state); its output is never admitted again.
    Terminal(State),
    /// The clear barrier is not clear, or its epoch changed during the wait. Retryable.
    Blocked,
    /// The age budget was exceeded: the request is now `expired`.
    Expired,
    /// No output yet.
    Empty,
    /// The request's record was evicted from the tombstones.
    Late,
}

impl Admission {
    pub fn as_str(&self) -> &'static str {
        match self {
            Admission::Submitted(_) => "submitted",
            Admission::Stale => "stale",
            Admission::Terminal(s) => s.as_str(),
            Admission::Blocked => "blocked",
            Admission::Expired => "expired",
            Admission::Empty => "empty",
            Admission::Late => "late",
        }
    }
}

/// Why an operation was rejected. A rejected operation changed nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OwnershipError {
    InvalidIdentity,
    ReusedIdentity,
    UnknownRequest,
    InvalidAgeInputs,
    InvalidClock,
    EvidenceOutOfOrder {
        level: EvidenceLevel,
        after: EvidenceLevel,
    },
    EvidenceAlreadyRecorded(EvidenceLevel),
}

impl fmt::Display for OwnershipError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OwnershipError::InvalidIdentity => f.write_str("invalid request identity"),
            OwnershipError::ReusedIdentity => f.write_str("reused request identity"),
            OwnershipError::UnknownRequest => f.write_str("unknown request"),
            OwnershipError::InvalidAgeInputs => f.write_str("invalid age inputs"),
            OwnershipError::InvalidClock => f.write_str("invalid local clock"),
            OwnershipError::EvidenceOutOfOrder { level, after } => write!(
                f,
                "{} evidence earlier than {} in the same clock domain",
                level.as_str(),
                after.as_str()
            ),
            OwnershipError::EvidenceAlreadyRecorded(level) => {
                write!(f, "{} evidence already recorded", level.as_str())
            }
        }
    }
}

impl std::error::Error for OwnershipError {}

/// The evidence levels of a cancellation, in their nominal order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum EvidenceLevel {
    Intent = 0,
    LocalInvalidation = 1,
    CancelSubmission = 2,
    BackendObservation = 3,
    FinalCallback = 4,
    ResourceRelease = 5,
}

impl EvidenceLevel {
    pub const ALL: [EvidenceLevel; 6] = [
        EvidenceLevel::Intent,
        EvidenceLevel::LocalInvalidation,
        EvidenceLevel::CancelSubmission,
        EvidenceLevel::BackendObservation,
        EvidenceLevel::FinalCallback,
        EvidenceLevel::ResourceRelease,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            EvidenceLevel::Intent => "intent",
            EvidenceLevel::LocalInvalidation => "local_invalidation",
            EvidenceLevel::CancelSubmission => "cancel_submission",
            EvidenceLevel::BackendObservation => "backend_observation",
            EvidenceLevel::FinalCallback => "final_callback",
            EvidenceLevel::ResourceRelease => "resource_release",
        }
    }

    /// Whether the level is on the cancel chain intent → local invalidation → cancel submission
    /// → backend observation → resource release, whose timestamps are ordered within a clock
    /// domain. The final callback is not: a completion can come before any intent.
    pub fn in_chain(self) -> bool {
        self != EvidenceLevel::FinalCallback
    }
}

/// The clock a timestamp was read from. Timestamps of different domains are never compared.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ClockDomain {
    /// The controller's own monotonic clock.
    Local,
    /// The serving backend's clock.
    Backend,
    /// The playback sink's clock.
    Playback,
}

/// One piece of evidence: when, and by which clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Timestamp {
    pub domain: ClockDomain,
    pub ns: u64,
}

/// Evidence per level. `None` is unknown, never zero.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Ledger {
    pub levels: [Option<Timestamp>; 6],
}

impl Ledger {
    pub fn get(&self, level: EvidenceLevel) -> Option<Timestamp> {
        self.levels[level as usize]
    }
}

/// A read-only copy of one request's record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestSnapshot {
    pub generation: u64,
    pub state: State,
    /// `None` until the first accepted output (the reference's revision −1).
    pub revision: Option<u64>,
    pub payload: Payload,
    pub final_output: bool,
    pub ledger: Ledger,
}

#[derive(Clone, Debug)]
struct Row {
    generation: u64,
    state: State,
    revision: Option<u64>,
    payload: Payload,
    final_output: bool,
    ledger: Ledger,
}

/// Deliberately broken variants of the controller, for testing checkers (never on by default).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ControllerBug {
    /// Admission trusts the state it saw before the wait: the terminal check is not repeated
    /// after it, so a request cancelled during the wait still gets its output admitted.
    TerminalCheckedBeforeWait,
}

/// How long terminal records stay to answer late evidence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retention {
    /// Terminal records kept at most; the oldest terminal record is evicted beyond it.
    pub tombstones_max: usize,
    /// Terminal records older than this (from their terminal transition, by the times passed to
    /// `expire_tombstones`) are evicted. `None`: no age bound.
    pub tombstone_age_ns_max: Option<u64>,
    /// Evicted identities remembered at most (oldest forgotten first). Within the bound, late
    /// evidence is classified `late` and a reused identity is refused; beyond it, the identity
    /// is forgotten altogether. Callers whose identities are unique by construction can keep it
    /// small; the reference's behaviour needs it unbounded.
    pub evicted_max: usize,
}

impl Retention {
    /// Keep every terminal record (the reference's behaviour). Use for bounded inputs only.
    pub const UNBOUNDED: Retention = Retention {
        tombstones_max: usize::MAX,
        tombstone_age_ns_max: None,
        evicted_max: usize::MAX,
    };
}

impl Default for Retention {
    fn default() -> Self {
        Retention {
            tombstones_max: 1 << 20,
            tombstone_age_ns_max: None,
            evicted_max: 1 << 22,
        }
    }
}

/// What `admit_begin` captured before the wait.
#[derive(Clone, Debug, PartialEq)]
pub struct Ticket<K> {
    pub request: K,
    /// Signed and wide: the reference does not validate an admission's generation, so a negative
    /// one is legal and simply never matches a record (whose generation is >= 0).
    pub generation: i128,
    pub born: f64,
    pub max_age: f64,
    /// The clear barrier this admission waits on (0: the reference's single barrier).
    pub barrier: u64,
    pub epoch: u64,
}

/// The ownership controller: the registry of request records, the clear barrier and the
/// tombstone retention.
pub struct Owners<K: Identity> {
    rows: FxHashMap<K, Row>,
    barrier_epoch: u64,
    clear: bool,
    /// Barriers other than 0, one per playback sink (owner), created on first use.
    barriers: FxHashMap<u64, (u64, bool)>,
    retention: Retention,
    /// Terminal records in order of their terminal transition, with that time.
    tombstones: VecDeque<(K, u64)>,
    /// Identities whose records were evicted. Only the identity is kept, so it is never reused and
    /// late evidence for it is recognised.
    evicted: FxHashSet<K>,
    evicted_order: VecDeque<K>,
    evictions: u64,
    terminal_clock_ns: u64,
    submitted: u64,
    bug: Option<ControllerBug>,
}

impl<K: Identity> Default for Owners<K> {
    fn default() -> Self {
        Self::new(Retention::default())
    }
}

impl<K: Identity> Owners<K> {
    pub fn new(retention: Retention) -> Self {
        assert!(
            retention.tombstones_max > 0,
            "retention must keep at least one tombstone"
        );
        Owners {
            rows: FxHashMap::default(),
            barrier_epoch: 0,
            clear: true,
            barriers: FxHashMap::default(),
            retention,
            tombstones: VecDeque::new(),
            evicted: FxHashSet::default(),
            evicted_order: VecDeque::new(),
            evictions: 0,
            terminal_clock_ns: 0,
            submitted: 0,
            bug: None,
        }
    }

    /// Turn a deliberately broken variant on (tests of checkers only).
    pub fn set_bug(&mut self, bug: Option<ControllerBug>) {
        self.bug = bug;
    }

    /// Register a new request. Rejects an invalid or reused identity (including an evicted one).
    pub fn start(&mut self, identity: K, generation: u64) -> Result<(), OwnershipError> {
        if !identity.is_valid() {
            return Err(OwnershipError::InvalidIdentity);
        }
        if self.rows.contains_key(&identity) || self.evicted.contains(&identity) {
            return Err(OwnershipError::ReusedIdentity);
        }
        self.rows.insert(
            identity,
            Row {
                generation,
                state: State::Running,
                revision: None,
                payload: Payload::empty(),
                final_output: false,
                ledger: Ledger::default(),
            },
        );
        Ok(())
    }

    /// First terminal disposition wins. Returns the state after the call, or `Ok(None)` when the
    /// record was evicted (the call is late and changes nothing).
    pub fn finish(
        &mut self,
        identity: &K,
        disposition: Disposition,
    ) -> Result<Option<State>, OwnershipError> {
        let Some(row) = self.rows.get_mut(identity) else {
            return if self.evicted.contains(identity) {
                Ok(None)
            } else {
                Err(OwnershipError::UnknownRequest)
            };
        };
        if row.state == State::Running {
            row.state = disposition.state();
            self.tombstones
                .push_back((identity.clone(), self.terminal_clock_ns));
            self.evict_over_count();
            // The record just finished is the newest tombstone; eviction by count only removes it
            // if the bound is 1 and it is alone, in which case it is gone and late from now on.
            return Ok(Some(disposition.state()));
        }
        Ok(Some(row.state))
    }

    /// Classify a piece of output evidence. Validation (the caller's types) comes first, then the
    /// lookup, then: strictly older revision → stale (even on a final or terminal record); equal
    /// revision → duplicate if payload and final flag are identical, else conflict; greater
    /// revision → conflict on a terminal or finalized record, else accepted.
    pub fn update(
        &mut self,
        identity: &K,
        revision: u64,
        payload: &[u8],
        final_output: bool,
    ) -> Result<UpdateClass, OwnershipError> {
        let Some(row) = self.rows.get_mut(identity) else {
            return if self.evicted.contains(identity) {
                Ok(UpdateClass::Late)
            } else {
                Err(OwnershipError::UnknownRequest)
            };
        };
        if let Some(current) = row.revision {
            if revision < current {
                return Ok(UpdateClass::Stale);
            }
            if revision == current {
                return Ok(
                    if *row.payload == *payload && row.final_output == final_output {
                        UpdateClass::Duplicate
                    } else {
                        UpdateClass::Conflict
                    },
                );
            }
        }
        if row.state != State::Running || row.final_output {
            return Ok(UpdateClass::Conflict);
        }
        debug_assert!(row.revision.is_none_or(|r| revision > r));
        row.revision = Some(revision);
        row.payload = Payload::from(payload);
        row.final_output = final_output;
        Ok(UpdateClass::Accepted)
    }

    /// Phase one of admission: validate the age inputs and capture the barrier epoch. Looks at
    /// nothing else; the request need not exist yet.
    pub fn admit_begin(
        &self,
        request: K,
        generation: i128,
        born: f64,
        max_age: f64,
    ) -> Result<Ticket<K>, OwnershipError> {
        self.admit_begin_on(0, request, generation, born, max_age)
    }

    /// `admit_begin` against the clear barrier of sink `barrier`.
    pub fn admit_begin_on(
        &self,
        barrier: u64,
        request: K,
        generation: i128,
        born: f64,
        max_age: f64,
    ) -> Result<Ticket<K>, OwnershipError> {
        if !born.is_finite() || !max_age.is_finite() || max_age < 0.0 {
            return Err(OwnershipError::InvalidAgeInputs);
        }
        Ok(Ticket {
            request,
            generation,
            born,
            max_age,
            barrier,
            epoch: self.barrier_state(barrier).0,
        })
    }

    /// `(epoch, clear)` of a barrier.
    pub fn barrier_state(&self, barrier: u64) -> (u64, bool) {
        if barrier == 0 {
            (self.barrier_epoch, self.clear)
        } else {
            self.barriers.get(&barrier).copied().unwrap_or((0, true))
        }
    }

    /// A new clear operation on sink `barrier`: its epoch goes up by one.
    pub fn barrier_advance_on(&mut self, barrier: u64) -> u64 {
        if barrier == 0 {
            return self.barrier_advance();
        }
        let b = self.barriers.entry(barrier).or_insert((0, true));
        b.0 += 1;
        b.0
    }

    pub fn set_clear_on(&mut self, barrier: u64, clear: bool) {
        if barrier == 0 {
            self.set_clear(clear);
        } else {
            self.barriers.entry(barrier).or_insert((0, true)).1 = clear;
        }
    }

    /// Forget a sink's barrier (its owner is gone). Nothing waits on it any more.
    pub fn drop_barrier(&mut self, barrier: u64) {
        if barrier != 0 {
            self.barriers.remove(&barrier);
        }
    }

    /// Phase two, after the wait, against the state at this moment. The order of checks is the
    /// contract's: unknown request (error), obsolete generation (stale, no side effect), terminal
    /// state (that state), clock validity (error), barrier clear and epoch unchanged (else
    /// blocked), age (> max_age expires the request; equal is allowed), no output (empty), else
    /// submitted. An error changes nothing, so the same ticket can be ended again later.
    pub fn admit_end(&mut self, ticket: &Ticket<K>, now: f64) -> Result<Admission, OwnershipError> {
        let Some(row) = self.rows.get(&ticket.request) else {
            return if self.evicted.contains(&ticket.request) {
                Ok(Admission::Late)
            } else {
                Err(OwnershipError::UnknownRequest)
            };
        };
        if row.generation as i128 != ticket.generation {
            return Ok(Admission::Stale);
        }
        if row.state != State::Running && self.bug != Some(ControllerBug::TerminalCheckedBeforeWait)
        {
            return Ok(Admission::Terminal(row.state));
        }
        if !now.is_finite() || now < ticket.born {
            return Err(OwnershipError::InvalidClock);
        }
        let (epoch, clear) = self.barrier_state(ticket.barrier);
        if !clear || ticket.epoch != epoch {
            return Ok(Admission::Blocked);
        }
        if now - ticket.born > ticket.max_age {
            let state = self.finish(&ticket.request, Disposition::Expired)?;
            debug_assert_eq!(state, Some(State::Expired));
            return Ok(Admission::Expired);
        }
        if row.revision.is_none() {
            return Ok(Admission::Empty);
        }
        self.submitted += 1;
        Ok(Admission::Submitted(row.payload.clone()))
    }

    /// Begin and end with no wait in between.
    pub fn admit(
        &mut self,
        request: K,
        generation: i128,
        born: f64,
        max_age: f64,
        now: f64,
    ) -> Result<Admission, OwnershipError> {
        let ticket = self.admit_begin(request, generation, born, max_age)?;
        self.admit_end(&ticket, now)
    }

    /// A new clear operation: the barrier epoch goes up by one.
    pub fn barrier_advance(&mut self) -> u64 {
        self.barrier_epoch += 1;
        self.barrier_epoch
    }

    pub fn set_clear(&mut self, clear: bool) {
        self.clear = clear;
    }

    pub fn barrier_epoch(&self) -> u64 {
        self.barrier_epoch
    }

    pub fn is_clear(&self) -> bool {
        self.clear
    }

    /// Record evidence for a request. Each level is recorded once; within a clock domain, a level
    /// is never earlier than its predecessor in the cancel chain.
    pub fn record_evidence(
        &mut self,
        identity: &K,
        level: EvidenceLevel,
        at: Timestamp,
    ) -> Result<(), OwnershipError> {
        let row = self
            .rows
            .get_mut(identity)
            .ok_or(OwnershipError::UnknownRequest)?;
        if row.ledger.get(level).is_some() {
            return Err(OwnershipError::EvidenceAlreadyRecorded(level));
        }
        // The cancel chain is linear in declaration order; the final callback stands outside it.
        if level.in_chain() {
            for other in EvidenceLevel::ALL {
                let Some(t) = row.ledger.get(other) else {
                    continue;
                };
                if !other.in_chain() || t.domain != at.domain || other == level {
                    continue;
                }
                if other < level && at.ns < t.ns {
                    return Err(OwnershipError::EvidenceOutOfOrder {
                        level,
                        after: other,
                    });
                }
                if other > level && t.ns < at.ns {
                    return Err(OwnershipError::EvidenceOutOfOrder {
                        level: other,
                        after: level,
                    });
                }
            }
        }
        row.ledger.levels[level as usize] = Some(at);
        Ok(())
    }

    /// Advance the retention clock to `now_ns` and evict terminal records older than the age bound.
    /// Returns how many were evicted.
    pub fn expire_tombstones(&mut self, now_ns: u64) -> u64 {
        assert!(
            now_ns >= self.terminal_clock_ns,
            "retention clock went backwards"
        );
        self.terminal_clock_ns = now_ns;
        let Some(age_max) = self.retention.tombstone_age_ns_max else {
            return 0;
        };
        let before = self.evictions;
        while let Some((_, at)) = self.tombstones.front() {
            if now_ns - at <= age_max {
                break;
            }
            self.evict_oldest();
        }
        self.evictions - before
    }

    fn evict_over_count(&mut self) {
        while self.tombstones.len() > self.retention.tombstones_max {
            self.evict_oldest();
        }
    }

    fn evict_oldest(&mut self) {
        let (id, _) = self.tombstones.pop_front().expect("a tombstone to evict");
        let row = self.rows.remove(&id).expect("tombstones point at rows");
        debug_assert!(row.state.is_terminal());
        if self.retention.evicted_max > 0 {
            if self.evicted.len() >= self.retention.evicted_max {
                let old = self
                    .evicted_order
                    .pop_front()
                    .expect("order tracks the set");
                self.evicted.remove(&old);
            }
            self.evicted.insert(id.clone());
            self.evicted_order.push_back(id);
        }
        self.evictions += 1;
    }

    /// A copy of one record.
    pub fn snapshot(&self, identity: &K) -> Option<RequestSnapshot> {
        self.rows.get(identity).map(|r| RequestSnapshot {
            generation: r.generation,
            state: r.state,
            revision: r.revision,
            payload: r.payload.clone(),
            final_output: r.final_output,
            ledger: r.ledger,
        })
    }

    /// The state of a live record.
    pub fn state(&self, identity: &K) -> Option<State> {
        self.rows.get(identity).map(|r| r.state)
    }

    pub fn is_evicted(&self, identity: &K) -> bool {
        self.evicted.contains(identity)
    }

    /// Live records (running and retained terminal).
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    pub fn tombstones(&self) -> usize {
        self.tombstones.len()
    }

    pub fn evictions(&self) -> u64 {
        self.evictions
    }

    /// How many admissions returned `Submitted`.
    pub fn submitted(&self) -> u64 {
        self.submitted
    }
}

impl<K: Identity + Ord> Owners<K> {
    /// Identities of the live records, sorted (never in hash order).
    pub fn identities(&self) -> Vec<K> {
        let mut ids: Vec<K> = self.rows.keys().cloned().collect();
        ids.sort();
        ids
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn local(ns: u64) -> Timestamp {
        Timestamp {
            domain: ClockDomain::Local,
            ns,
        }
    }

    #[test]
    fn ledger_keeps_unknown_as_none_and_orders_within_a_domain() {
        let mut o: Owners<u64> = Owners::default();
        o.start(1, 0).unwrap();
        let ledger = o.snapshot(&1).unwrap().ledger;
        assert!(
            ledger.levels.iter().all(Option::is_none),
            "missing evidence is unknown, not 0"
        );
        o.record_evidence(&1, EvidenceLevel::Intent, local(100))
            .unwrap();
        o.record_evidence(&1, EvidenceLevel::CancelSubmission, local(150))
            .unwrap();
        // Local invalidation between intent and submission: fine; before intent or after the
        // submission: out of order, and nothing recorded.
        assert_eq!(
            o.record_evidence(&1, EvidenceLevel::LocalInvalidation, local(99)),
            Err(OwnershipError::EvidenceOutOfOrder {
                level: EvidenceLevel::LocalInvalidation,
                after: EvidenceLevel::Intent
            })
        );
        assert_eq!(
            o.record_evidence(&1, EvidenceLevel::LocalInvalidation, local(151)),
            Err(OwnershipError::EvidenceOutOfOrder {
                level: EvidenceLevel::CancelSubmission,
                after: EvidenceLevel::LocalInvalidation
            })
        );
        assert_eq!(
            o.snapshot(&1)
                .unwrap()
                .ledger
                .get(EvidenceLevel::LocalInvalidation),
            None
        );
        o.record_evidence(&1, EvidenceLevel::LocalInvalidation, local(100))
            .unwrap();
        // Another clock domain is never compared with the local one.
        let backend = Timestamp {
            domain: ClockDomain::Backend,
            ns: 5,
        };
        o.record_evidence(&1, EvidenceLevel::BackendObservation, backend)
            .unwrap();
        // The final callback stands outside the chain: it may precede the intent.
        o.record_evidence(&1, EvidenceLevel::FinalCallback, local(1))
            .unwrap();
        assert_eq!(
            o.record_evidence(&1, EvidenceLevel::Intent, local(100)),
            Err(OwnershipError::EvidenceAlreadyRecorded(
                EvidenceLevel::Intent
            ))
        );
        let ledger = o.snapshot(&1).unwrap().ledger;
        assert_eq!(ledger.get(EvidenceLevel::ResourceRelease), None);
        assert_eq!(ledger.get(EvidenceLevel::BackendObservation), Some(backend));
    }

    #[test]
    fn tombstones_are_bounded_by_count_and_late_evidence_is_rejected() {
        let mut o: Owners<u64> = Owners::new(Retention {
            tombstones_max: 2,
            tombstone_age_ns_max: None,
            evicted_max: usize::MAX,
        });
        for id in 0..5 {
            o.start(id, 0).unwrap();
            o.update(&id, 0, b"x", false).unwrap();
        }
        for id in 0..4 {
            o.finish(&id, Disposition::Cancelled).unwrap();
        }
        assert_eq!(o.tombstones(), 2);
        assert_eq!(o.evictions(), 2);
        assert!(o.is_evicted(&0) && o.is_evicted(&1));
        assert_eq!(o.snapshot(&0), None);
        // Late evidence for an evicted identity: classified late, never treated as new.
        assert_eq!(o.update(&0, 7, b"late", true), Ok(UpdateClass::Late));
        assert_eq!(o.finish(&0, Disposition::Completed), Ok(None));
        assert_eq!(o.admit(0, 0, 0.0, 1.0, 0.0), Ok(Admission::Late));
        assert_eq!(o.start(0, 1), Err(OwnershipError::ReusedIdentity));
        // Retained tombstones still answer with their state; running records are never evicted.
        assert_eq!(
            o.finish(&3, Disposition::Completed),
            Ok(Some(State::Cancelled))
        );
        assert_eq!(o.state(&4), Some(State::Running));
    }

    #[test]
    fn tombstones_are_bounded_by_age() {
        let mut o: Owners<u64> = Owners::new(Retention {
            tombstones_max: usize::MAX,
            tombstone_age_ns_max: Some(1_000),
            evicted_max: usize::MAX,
        });
        o.start(1, 0).unwrap();
        o.start(2, 0).unwrap();
        o.expire_tombstones(100);
        o.finish(&1, Disposition::Expired).unwrap(); // terminal at 100
        o.expire_tombstones(600);
        o.finish(&2, Disposition::Completed).unwrap(); // terminal at 600
        assert_eq!(o.expire_tombstones(1_100), 0, "age exactly 1000 is kept");
        assert_eq!(o.expire_tombstones(1_101), 1);
        assert!(o.is_evicted(&1) && !o.is_evicted(&2));
        assert_eq!(o.expire_tombstones(1_601), 1);
        assert_eq!(o.evictions(), 2);
        assert!(o.is_empty());
    }
}

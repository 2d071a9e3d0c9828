//! The per-request ownership controller.
//!
//! It implements the ownership contract (see `docs/ownership-contract.md` at the repository root)
//! with its classifications and its order of checks, plus what the contract asks for beyond its
//! reference: an evidence ledger per request, bounded tombstones, one clear barrier per playback
//! sink, and a registry that hands out snapshots rather than mutable rows.
//!
//! It is sans-IO: no clock, no queue, no I/O. Admission is split into `admit_begin` (before the
//! wait) and `admit_end` (after it), and the caller decides what happens in between.
//!
//! Invalid input is rejected with nothing changed: every method validates and looks up before it
//! mutates.

mod barrier;
mod evidence;
mod retention;
#[cfg(test)]
mod tests;
mod types;

use std::collections::hash_map::Entry;
use std::fmt;
use std::hash::Hash;

use rustc_hash::FxHashMap;

pub use barrier::BarrierId;
pub use evidence::{ClockDomain, EvidenceError, EvidenceLevel, Ledger, Timestamp};
pub use retention::Retention;
#[cfg(feature = "broken-variants")]
pub use types::ControllerBug;
pub use types::{
    Admission, Disposition, OwnershipError, Payload, RequestSnapshot, State, Ticket, UpdateClass,
};

use barrier::Barriers;
use retention::Tombstones;
use types::Row;

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

/// The ownership controller: the registry of request records, the clear barriers and the
/// tombstone retention.
pub struct Owners<K: Identity> {
    rows: FxHashMap<K, Row>,
    barriers: Barriers,
    tombstones: Tombstones<K>,
    submitted: u64,
    #[cfg(feature = "broken-variants")]
    bug: Option<ControllerBug>,
}

impl<K: Identity> Default for Owners<K> {
    fn default() -> Self {
        Self::new(Retention::default())
    }
}

impl<K: Identity> Owners<K> {
    pub fn new(retention: Retention) -> Self {
        Owners {
            rows: FxHashMap::default(),
            barriers: Barriers::default(),
            tombstones: Tombstones::new(retention),
            submitted: 0,
            #[cfg(feature = "broken-variants")]
            bug: None,
        }
    }

    /// Turn a deliberately broken variant on (tests of checkers only).
    #[cfg(feature = "broken-variants")]
    pub fn set_bug(&mut self, bug: Option<ControllerBug>) {
        self.bug = bug;
    }

    /// What a call about an identity with no record answers: `late` if its record was evicted,
    /// else an error.
    fn missing<T>(&self, identity: &K, late: T) -> Result<T, OwnershipError> {
        if self.tombstones.is_evicted(identity) {
            Ok(late)
        } else {
            Err(OwnershipError::UnknownRequest)
        }
    }

    /// Register a new request. Rejects an invalid or reused identity (including an evicted one).
    pub fn start(&mut self, identity: K, generation: u64) -> Result<(), OwnershipError> {
        if !identity.is_valid() {
            return Err(OwnershipError::InvalidIdentity);
        }
        if self.tombstones.is_evicted(&identity) {
            return Err(OwnershipError::ReusedIdentity);
        }
        match self.rows.entry(identity) {
            Entry::Occupied(_) => Err(OwnershipError::ReusedIdentity),
            Entry::Vacant(row) => {
                row.insert(Row::new(generation));
                Ok(())
            }
        }
    }

    /// First terminal disposition wins. Returns the state after the call, or `Ok(None)` when the
    /// record was evicted (the call is late and changes nothing).
    pub fn finish(
        &mut self,
        identity: &K,
        disposition: Disposition,
    ) -> Result<Option<State>, OwnershipError> {
        let Some(row) = self.rows.get_mut(identity) else {
            return self.missing(identity, None);
        };
        if row.state != State::Running {
            return Ok(Some(row.state));
        }
        row.state = disposition.state();
        if !self.tombstones.retention.until_retired {
            self.entomb(identity);
        }
        Ok(Some(disposition.state()))
    }

    /// The record becomes the newest tombstone. Eviction by count only removes it if the bound
    /// is 1 and it is alone, in which case it is gone and late from now on.
    fn entomb(&mut self, identity: &K) {
        let rows = &mut self.rows;
        self.tombstones.push(identity.clone(), &mut |id| {
            let row = rows.remove(&id).expect("tombstones point at rows");
            debug_assert!(row.state.is_terminal());
        });
    }

    /// The caller no longer needs a terminal record (with `Retention::until_retired`): it joins
    /// the tombstones now. A record that is still running is an error, and nothing changes.
    pub fn retire(&mut self, identity: &K) -> Result<(), OwnershipError> {
        let Some(row) = self.rows.get(identity) else {
            return self.missing(identity, ());
        };
        if !row.state.is_terminal() {
            return Err(OwnershipError::StillRunning);
        }
        if self.tombstones.retention.until_retired {
            self.entomb(identity);
        }
        Ok(())
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
            return self.missing(identity, UpdateClass::Late);
        };
        if let Some(current) = row.revision() {
            if revision < current {
                return Ok(UpdateClass::Stale);
            }
            if revision == current {
                let same = row.payload() == payload && row.final_output == final_output;
                return Ok(if same {
                    UpdateClass::Duplicate
                } else {
                    UpdateClass::Conflict
                });
            }
        }
        if row.state != State::Running || row.final_output {
            return Ok(UpdateClass::Conflict);
        }
        row.accept(revision, payload, final_output);
        Ok(UpdateClass::Accepted)
    }

    /// Phase one of admission: validate the age inputs and capture the reference barrier's epoch.
    /// Looks at nothing else; the request need not exist yet.
    pub fn admit_begin(
        &self,
        request: K,
        generation: i128,
        born: f64,
        max_age: f64,
    ) -> Result<Ticket<K>, OwnershipError> {
        self.admit_begin_on(BarrierId::REFERENCE, request, generation, born, max_age)
    }

    /// `admit_begin` against the clear barrier `barrier`.
    pub fn admit_begin_on(
        &self,
        barrier: BarrierId,
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

    /// Phase two, after the wait, against the state at this moment. The order of checks is the
    /// contract's: unknown request (error), obsolete generation (stale, no side effect), terminal
    /// state (that state), clock validity (error), barrier clear and epoch unchanged (else
    /// blocked), age (> max_age expires the request; equal is allowed), no output (empty), else
    /// submitted. An error changes nothing, so the same ticket can be ended again later.
    pub fn admit_end(&mut self, ticket: &Ticket<K>, now: f64) -> Result<Admission, OwnershipError> {
        let Some(row) = self.rows.get(&ticket.request) else {
            return self.missing(&ticket.request, Admission::Late);
        };
        if row.generation as i128 != ticket.generation {
            return Ok(Admission::Stale);
        }
        if row.state != State::Running && self.rechecks_terminal() {
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
        if row.revision().is_none() {
            return Ok(Admission::Empty);
        }
        self.submitted += 1;
        Ok(Admission::Submitted(row.payload_held()))
    }

    /// Outputs at revisions `first..first + n`, each updated and then admitted at once on
    /// `barrier` (no wait in between, so no age): what `update` with `payload` (the last one's;
    /// the others' are replaced), then `admit_begin_on` and `admit_end` at one instant would
    /// do for each in turn, when each would be `Accepted` then `Submitted`. False, and nothing
    /// changed, if any would be anything else: the caller then goes one by one.
    pub fn admit_run(
        &mut self,
        identity: &K,
        (generation, barrier): (i128, BarrierId),
        first: u64,
        n: u64,
        payload: &[u8],
    ) -> bool {
        assert!(n > 0, "an empty run of outputs");
        let (_, clear) = self.barrier_state(barrier);
        let Some(row) = self.rows.get_mut(identity) else {
            return false;
        };
        // `update`: a newer revision of a running, unfinalized record is accepted; `admit_end`:
        // the same generation, still running, the barrier clear at the epoch just captured.
        let accepted = row.revision().is_none_or(|r| r < first)
            && row.state == State::Running
            && !row.final_output;
        if !accepted || row.generation as i128 != generation || !clear {
            return false;
        }
        row.accept(first + n - 1, payload, false);
        self.submitted += n;
        true
    }

    /// Whether admission rechecks the terminal state after the wait (always, but in a
    /// deliberately broken variant).
    fn rechecks_terminal(&self) -> bool {
        #[cfg(feature = "broken-variants")]
        if self.bug == Some(ControllerBug::TerminalCheckedBeforeWait) {
            return false;
        }
        true
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

    /// `(epoch, clear)` of a barrier.
    pub fn barrier_state(&self, barrier: BarrierId) -> (u64, bool) {
        self.barriers.state(barrier)
    }

    /// A new clear operation on `barrier`: its epoch goes up by one. Returns the new epoch.
    pub fn barrier_advance_on(&mut self, barrier: BarrierId) -> u64 {
        self.barriers.advance(barrier)
    }

    pub fn set_clear_on(&mut self, barrier: BarrierId, clear: bool) {
        self.barriers.set_clear(barrier, clear);
    }

    /// Forget a sink's barrier (its owner is gone). Nothing waits on it any more.
    pub fn drop_barrier(&mut self, barrier: BarrierId) {
        self.barriers.drop_sink(barrier);
    }

    /// A new clear operation on the reference barrier.
    pub fn barrier_advance(&mut self) -> u64 {
        self.barrier_advance_on(BarrierId::REFERENCE)
    }

    pub fn set_clear(&mut self, clear: bool) {
        self.set_clear_on(BarrierId::REFERENCE, clear);
    }

    pub fn barrier_epoch(&self) -> u64 {
        self.barrier_state(BarrierId::REFERENCE).0
    }

    pub fn is_clear(&self) -> bool {
        self.barrier_state(BarrierId::REFERENCE).1
    }

    /// Record evidence for a request (see `Ledger::record`).
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
        // Validate on a copy, then keep it: a rejected record changes nothing, not even the box.
        let mut ledger = row.ledger();
        ledger.record(level, at)?;
        row.set_ledger(ledger);
        Ok(())
    }

    /// Advance the retention clock to `now_ns` and evict terminal records older than the age bound.
    /// Returns how many were evicted.
    pub fn expire_tombstones(&mut self, now_ns: u64) -> u64 {
        let rows = &mut self.rows;
        self.tombstones.expire(now_ns, &mut |id| {
            rows.remove(&id);
        })
    }

    /// A copy of one record.
    pub fn snapshot(&self, identity: &K) -> Option<RequestSnapshot> {
        self.rows.get(identity).map(Row::snapshot)
    }

    /// The state of a live record.
    pub fn state(&self, identity: &K) -> Option<State> {
        self.rows.get(identity).map(|r| r.state)
    }

    pub fn is_evicted(&self, identity: &K) -> bool {
        self.tombstones.is_evicted(identity)
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
        self.tombstones.evictions
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

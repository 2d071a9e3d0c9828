//! Unit tests of the controller's ledger and retention.

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
        Err(OwnershipError::Evidence(EvidenceError::OutOfOrder {
            level: EvidenceLevel::LocalInvalidation,
            after: EvidenceLevel::Intent
        }))
    );
    assert_eq!(
        o.record_evidence(&1, EvidenceLevel::LocalInvalidation, local(151)),
        Err(OwnershipError::Evidence(EvidenceError::OutOfOrder {
            level: EvidenceLevel::CancelSubmission,
            after: EvidenceLevel::LocalInvalidation
        }))
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
        Err(OwnershipError::Evidence(EvidenceError::AlreadyRecorded(
            EvidenceLevel::Intent
        )))
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
        until_retired: false,
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
        until_retired: false,
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

#[test]
fn with_until_retired_a_terminal_record_stays_until_its_caller_retires_it() {
    let mut o: Owners<u64> = Owners::new(Retention {
        tombstones_max: 1,
        tombstone_age_ns_max: None,
        evicted_max: usize::MAX,
        until_retired: true,
    });
    for id in 0..4 {
        o.start(id, 0).unwrap();
        o.finish(&id, Disposition::Cancelled).unwrap();
    }
    // Terminal, not retired: all four records are still there, whatever the bound.
    assert_eq!(o.len(), 4);
    assert_eq!(o.state(&0), Some(State::Cancelled));
    o.start(9, 0).unwrap();
    assert_eq!(o.retire(&9), Err(OwnershipError::StillRunning));
    assert_eq!(o.retire(&0), Ok(()));
    assert_eq!(o.retire(&1), Ok(()));
    // Retired records are tombstones under the bound: the older one is evicted, and late.
    assert!(o.is_evicted(&0) && !o.is_evicted(&1));
    assert_eq!(o.finish(&0, Disposition::Completed), Ok(None));
    assert_eq!(
        o.retire(&0),
        Ok(()),
        "retiring an evicted record is late, not an error"
    );
    assert_eq!(o.retire(&42), Err(OwnershipError::UnknownRequest));
}

#[test]
fn a_fresh_record_stays_small_and_boxes_its_output_and_evidence_at_the_first() {
    // A record is kept for every request in the system, most of them waiting with neither.
    assert!(std::mem::size_of::<types::Row>() <= 24);
    let mut o: Owners<u64> = Owners::default();
    o.start(1, 0).unwrap();
    let fresh = o.snapshot(&1).unwrap();
    assert_eq!((fresh.revision, &fresh.payload[..]), (None, &[][..]));
    assert_eq!(fresh.ledger, Ledger::default());
    assert_eq!(o.update(&1, 0, b"a", false), Ok(UpdateClass::Accepted));
    assert_eq!(o.update(&1, 0, b"a", false), Ok(UpdateClass::Duplicate));
    assert_eq!(o.update(&1, 0, b"b", false), Ok(UpdateClass::Conflict));
    let s = o.snapshot(&1).unwrap();
    assert_eq!((s.revision, &s.payload[..]), (Some(0), &b"a"[..]));
    assert_eq!(
        s.ledger,
        Ledger::default(),
        "output alone records no evidence"
    );
}

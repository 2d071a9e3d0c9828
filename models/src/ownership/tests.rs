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

/// `admit_run` against the calls it stands for, from records in every state that matters: it
/// changes a record exactly as `update`, `admit_begin_on` and `admit_end` at one instant would for
/// each output, when each would be `Accepted` then `Submitted`, and nothing otherwise.
#[test]
fn a_run_of_admissions_is_each_admission_or_nothing() {
    let barrier = BarrierId::of_owner(7);
    // (what is done to record 1 first, the run's first revision, its generation, whether each
    // of its outputs passes)
    type Setup = fn(&mut Owners<u64>);
    let cases: [(&str, Setup, u64, i128, bool); 7] = [
        ("fresh", |_| {}, 0, 0, true),
        ("after revision 3", |o| up(o, 3, false), 4, 0, true),
        ("a stale revision", |o| up(o, 3, false), 3, 0, false),
        ("finalized", |o| up(o, 3, true), 4, 0, false),
        (
            "terminal",
            |o| drop(o.finish(&1, Disposition::Cancelled)),
            0,
            0,
            false,
        ),
        (
            "barrier closed",
            |o| o.set_clear_on(BarrierId::of_owner(7), false),
            0,
            0,
            false,
        ),
        ("another generation", |_| {}, 0, 1, false),
    ];
    for (name, setup, first, generation, passes) in cases {
        let fresh = || {
            let mut o: Owners<u64> = Owners::new(Retention::default());
            o.start(1, 0).unwrap();
            setup(&mut o);
            o
        };
        let (mut one, mut run) = (fresh(), fresh());
        let mut each = true;
        for rev in first..first + 3 {
            let payload = [rev as u8; 16];
            each &= one.update(&1, rev, &payload, false) == Ok(UpdateClass::Accepted);
            let t = one
                .admit_begin_on(barrier, 1, generation, 5.0, 10.0)
                .unwrap();
            each &= matches!(one.admit_end(&t, 5.0), Ok(Admission::Submitted(_)));
        }
        let before = run.snapshot(&1);
        let did = run.admit_run(
            &1,
            (generation, barrier),
            first,
            3,
            &[(first + 2) as u8; 16],
        );
        assert_eq!((did, each), (passes, passes), "{name}");
        if did {
            assert_eq!(run.snapshot(&1), one.snapshot(&1), "{name}");
            assert_eq!(run.submitted(), one.submitted(), "{name}");
        } else {
            assert_eq!(
                run.snapshot(&1),
                before,
                "{name}: a refused run changed the record"
            );
            assert_eq!(run.submitted(), 0, "{name}");
        }
    }
    assert!(
        !Owners::<u64>::default().admit_run(&9, (0, barrier), 0, 1, &[0; 16]),
        "no record, no run"
    );
}

fn up(o: &mut Owners<u64>, rev: u64, fin: bool) {
    assert_eq!(
        o.update(&1, rev, &[rev as u8; 16], fin),
        Ok(UpdateClass::Accepted)
    );
}

#[test]
fn evicted_identities_are_forgotten_oldest_first() {
    // Against a queue of tombstones and a queue of remembered identities: ids drawn from a
    // small range come back while remembered (refused) and after they were forgotten
    // (started again), across many sweeps of the remembered ones.
    use std::collections::VecDeque;
    let (tombstones_max, evicted_max) = (3, 7);
    let mut o: Owners<u64> = Owners::new(Retention {
        tombstones_max,
        tombstone_age_ns_max: None,
        evicted_max,
        until_retired: false,
    });
    let (mut tombs, mut evicted) = (VecDeque::new(), VecDeque::new());
    let mut x = 0x2545_f491_4f6c_dd1du64;
    for _ in 0..20_000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let id = x % 24;
        let fresh = !tombs.contains(&id) && !evicted.contains(&id);
        assert_eq!(o.start(id, 0).is_ok(), fresh, "start {id}");
        if fresh {
            o.finish(&id, Disposition::Completed).unwrap();
            tombs.push_back(id);
            if tombs.len() > tombstones_max {
                if evicted.len() == evicted_max {
                    evicted.pop_front();
                }
                evicted.push_back(tombs.pop_front().unwrap());
            }
        }
        let probe = (x >> 32) % 24;
        assert_eq!(o.is_evicted(&probe), evicted.contains(&probe), "{probe}");
    }
}

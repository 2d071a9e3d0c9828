//! Every assertion of the reference's `tests()` (shared/seeds/000_…, "Run a local ownership
//! reference"), in order. The reference's `await owners.admit(..., wait)` becomes `admit_begin`,
//! then whatever the wait does, then `admit_end` with the clock read after the wait.
//!
//! Assertions about Python types that Rust's signatures rule out (a bool generation, a bool
//! revision, a bytearray payload) are checked where they can still happen: in the JSON op-log
//! replay (`sim/tests/replay.rs` and the committed fixture).

use cancelsim_models::ownership::{
    Admission, Disposition, Owners, OwnershipError, Retention, State, UpdateClass,
};

type O = Owners<String>;

fn id(s: &str) -> String {
    s.to_string()
}

fn update(o: &mut O, r: &str, rev: u64, payload: &[u8], fin: bool) -> UpdateClass {
    o.update(&id(r), rev, payload, fin).unwrap()
}

fn finish(o: &mut O, r: &str, d: Disposition) -> State {
    o.finish(&id(r), d).unwrap().unwrap()
}

/// `await owners.admit(r, generation, born, now, max_age, wait)`: `wait` runs between the two
/// phases, and `now` is read after it.
fn admit(
    o: &mut O,
    sent: &mut Vec<(String, u64, Vec<u8>)>,
    r: &str,
    generation: u64,
    born: f64,
    max_age: f64,
    wait: impl FnOnce(&mut O) -> f64,
) -> Admission {
    let ticket = o
        .admit_begin(id(r), generation as i128, born, max_age)
        .unwrap();
    let now = wait(o);
    let result = o.admit_end(&ticket, now).unwrap();
    if let Admission::Submitted(payload) = &result {
        sent.push((id(r), generation, payload.to_vec()));
    }
    result
}

#[test]
fn reference_fixtures() {
    let mut owners = O::new(Retention::UNBOUNDED);
    let mut sent = Vec::new();
    terminal_state_and_revisions(&mut owners, &mut sent);
    admission_after_every_wait(&mut owners, &mut sent);
}

type Sent = Vec<(String, u64, Vec<u8>)>;

/// The reference's fixtures for requests "a" and "b": revisions, terminal state, duplicates.
fn terminal_state_and_revisions(o: &mut O, sent: &mut Sent) {
    use Disposition::*;
    o.start(id("a"), 1).unwrap();
    o.start(id("b"), 1).unwrap();
    assert_eq!(
        update(o, "a", 2, b"old answer", true),
        UpdateClass::Accepted
    );
    assert_eq!(update(o, "a", 1, b"older", false), UpdateClass::Stale);
    assert_eq!(update(o, "a", 2, b"changed", true), UpdateClass::Conflict);
    assert_eq!(update(o, "a", 3, b"later", false), UpdateClass::Conflict);
    assert_eq!(finish(o, "a", Cancelled), State::Cancelled);
    assert_eq!(finish(o, "a", Completed), State::Cancelled);
    assert_eq!(
        update(o, "a", 2, b"old answer", true),
        UpdateClass::Duplicate
    );
    assert_eq!(o.snapshot(&id("a")).unwrap().state, State::Cancelled);
    assert_eq!(update(o, "a", 1, b"older", false), UpdateClass::Stale);
    // rejected(lambda: setattr(owners.rows["a"], "state", "running")): a snapshot is a copy;
    // changing it changes nothing in the registry.
    let mut snap = o.snapshot(&id("a")).unwrap();
    snap.state = State::Running;
    assert_eq!(o.snapshot(&id("a")).unwrap().state, State::Cancelled);
    assert_eq!(
        admit(o, sent, "a", 1, 0.0, 1.0, |_| 0.0),
        Admission::Terminal(State::Cancelled)
    );
    assert_eq!(update(o, "b", 0, b"sibling", false), UpdateClass::Accepted);
    assert_eq!(
        admit(o, sent, "b", 1, 0.0, 1.0, |_| 1.0),
        Admission::Submitted(b"sibling"[..].into())
    );
    assert_eq!(*sent, [(id("b"), 1, b"sibling".to_vec())]);
    assert_eq!(finish(o, "b", Completed), State::Completed);
    assert_eq!(finish(o, "b", Cancelled), State::Completed);
    // rejected(lambda: owners.start("b", 2))
    assert_eq!(o.start(id("b"), 2), Err(OwnershipError::ReusedIdentity));
    assert_eq!(
        o.snapshot(&id("b")).unwrap().generation,
        1,
        "rejected start changed nothing"
    );
}

/// The reference's fixtures for "c" to "empty": the post-wait checks, in the contract's order.
fn admission_after_every_wait(o: &mut O, sent: &mut Sent) {
    use Disposition::*;
    o.start(id("c"), 2).unwrap();
    update(o, "c", 0, b"current", false);
    assert_eq!(admit(o, sent, "c", 1, 0.0, 1.0, |_| 99.0), Admission::Stale);
    assert_eq!(o.snapshot(&id("c")).unwrap().state, State::Running);
    let cancel_during_wait = |o: &mut O| {
        o.finish(&id("c"), Cancelled).unwrap();
        0.0
    };
    assert_eq!(
        admit(o, sent, "c", 2, 0.0, 1.0, cancel_during_wait),
        Admission::Terminal(State::Cancelled)
    );
    o.start(id("d"), 1).unwrap();
    update(o, "d", 0, b"held", false);
    let age_during_wait = |_: &mut O| 2.0; // the clock moves from 0 to 2 during the wait
    assert_eq!(
        admit(o, sent, "d", 1, 0.0, 1.0, age_during_wait),
        Admission::Expired
    );
    assert_eq!(finish(o, "d", Completed), State::Expired);
    o.start(id("e"), 1).unwrap();
    update(o, "e", 0, b"barrier", false);
    let changed_barrier = |o: &mut O| {
        o.barrier_advance();
        0.0
    };
    assert_eq!(
        admit(o, sent, "e", 1, 0.0, 1.0, changed_barrier),
        Admission::Blocked
    );
    o.set_clear(false);
    assert_eq!(
        admit(o, sent, "e", 1, 0.0, 1.0, |_| 0.0),
        Admission::Blocked
    );
    o.set_clear(true);
    o.start(id("empty"), 1).unwrap();
    assert_eq!(
        admit(o, sent, "empty", 1, 0.0, 1.0, |_| 0.0),
        Admission::Empty
    );
    assert_eq!(sent.len(), 1);
}

#[test]
fn invalid_input_changes_nothing() {
    let mut o = O::new(Retention::UNBOUNDED);
    assert_eq!(o.start(id(""), 1), Err(OwnershipError::InvalidIdentity));
    assert!(o.is_empty());
    assert_eq!(
        o.finish(&id("x"), Disposition::Cancelled),
        Err(OwnershipError::UnknownRequest)
    );
    assert_eq!(
        o.update(&id("x"), 0, b"p", false),
        Err(OwnershipError::UnknownRequest)
    );
    assert!(o.is_empty());
    for (born, max_age) in [
        (f64::NAN, 1.0),
        (0.0, -1.0),
        (f64::INFINITY, 1.0),
        (0.0, f64::NAN),
    ] {
        assert_eq!(
            o.admit_begin(id("x"), 1, born, max_age),
            Err(OwnershipError::InvalidAgeInputs)
        );
    }
    // Unknown request at the end, and a clock before `born`: errors, nothing changed, the ticket
    // can be ended again once the request exists and the clock is valid.
    let ticket = o.admit_begin(id("later"), 1, 10.0, 5.0).unwrap();
    assert_eq!(
        o.admit_end(&ticket, 12.0),
        Err(OwnershipError::UnknownRequest)
    );
    o.start(id("later"), 1).unwrap();
    o.update(&id("later"), 0, b"x", false).unwrap();
    assert_eq!(o.admit_end(&ticket, 9.0), Err(OwnershipError::InvalidClock));
    assert_eq!(
        o.admit_end(&ticket, f64::NAN),
        Err(OwnershipError::InvalidClock)
    );
    assert_eq!(o.snapshot(&id("later")).unwrap().state, State::Running);
    assert_eq!(
        o.admit_end(&ticket, 15.0),
        Ok(Admission::Submitted(b"x"[..].into())),
        "age == max_age is allowed"
    );
}

#[test]
fn obsolete_generation_is_checked_before_expiry() {
    // "Check obsolete generation before applying expiry side effects so an old continuation
    // cannot expire the newer work that now owns the conversation."
    let mut o = O::new(Retention::UNBOUNDED);
    o.start(id("r"), 5).unwrap();
    assert_eq!(o.admit(id("r"), 4, 0.0, 1.0, 1000.0), Ok(Admission::Stale));
    assert_eq!(o.state(&id("r")), Some(State::Running));
    // Terminal is checked before the clock: a cancelled request answers cancelled even with a
    // clock that would be invalid.
    o.finish(&id("r"), Disposition::Cancelled).unwrap();
    assert_eq!(
        o.admit(id("r"), 5, 10.0, 1.0, 0.0),
        Ok(Admission::Terminal(State::Cancelled))
    );
    // Blocked comes before age: a blocked old chunk stays retryable, not expired.
    o.start(id("s"), 1).unwrap();
    o.update(&id("s"), 0, b"x", false).unwrap();
    o.set_clear(false);
    assert_eq!(o.admit(id("s"), 1, 0.0, 1.0, 50.0), Ok(Admission::Blocked));
    assert_eq!(o.state(&id("s")), Some(State::Running));
}

//! Property tests of the ownership controller over random operation sequences, with small
//! identity and revision spaces so that collisions, races and evictions are common.
//! 4 properties × 3,000 cases.

// Requests are indices 0..4 into several parallel arrays; index loops read best.
#![allow(clippy::needless_range_loop)]

use cancelsim_models::ownership::{
    Admission, Disposition, Owners, Retention, State, Ticket, UpdateClass,
};
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Op {
    Start {
        r: u64,
        generation: u64,
    },
    Finish {
        r: u64,
        d: Disposition,
    },
    Update {
        r: u64,
        revision: u64,
        payload: u8,
        fin: bool,
    },
    Admit {
        r: u64,
        generation: u64,
        born: u8,
        max_age: u8,
        now: u8,
    },
    Begin {
        slot: usize,
        r: u64,
        generation: u64,
        born: u8,
        max_age: u8,
    },
    End {
        slot: usize,
        now: u8,
    },
    BarrierAdvance,
    SetClear(bool),
    Expire {
        dt: u8,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let r = 0u64..4;
    let g = 0u64..3;
    let d = prop_oneof![
        Just(Disposition::Completed),
        Just(Disposition::Cancelled),
        Just(Disposition::Expired)
    ];
    prop_oneof![
        3 => (r.clone(), g.clone()).prop_map(|(r, generation)| Op::Start { r, generation }),
        2 => (r.clone(), d).prop_map(|(r, d)| Op::Finish { r, d }),
        5 => (r.clone(), 0u64..5, 0u8..3, any::<bool>())
            .prop_map(|(r, revision, payload, fin)| Op::Update { r, revision, payload, fin }),
        3 => (r.clone(), g.clone(), 0u8..5, 0u8..4, 0u8..10)
            .prop_map(|(r, generation, born, max_age, now)| Op::Admit { r, generation, born, max_age, now }),
        2 => (0usize..3, r, g, 0u8..5, 0u8..4)
            .prop_map(|(slot, r, generation, born, max_age)| Op::Begin { slot, r, generation, born, max_age }),
        2 => (0usize..3, 0u8..10).prop_map(|(slot, now)| Op::End { slot, now }),
        1 => Just(Op::BarrierAdvance),
        1 => any::<bool>().prop_map(Op::SetClear),
        1 => (0u8..4).prop_map(|dt| Op::Expire { dt }),
    ]
}

fn scenario() -> impl Strategy<Value = (Retention, Vec<Op>)> {
    let retention = prop_oneof![
        Just(Retention::UNBOUNDED),
        (1usize..4).prop_map(|n| Retention {
            tombstones_max: n,
            tombstone_age_ns_max: None,
            evicted_max: usize::MAX,
            until_retired: false,
        }),
        (0u64..3).prop_map(|a| Retention {
            tombstones_max: usize::MAX,
            tombstone_age_ns_max: Some(a),
            evicted_max: usize::MAX,
            until_retired: false,
        }),
    ];
    (retention, prop::collection::vec(op(), 1..60))
}

/// What one step did to one request, as seen from outside.
struct Step {
    op: Op,
    /// Every request's record before and after (None: absent or evicted).
    before: Vec<Option<cancelsim_models::ownership::RequestSnapshot>>,
    after: Vec<Option<cancelsim_models::ownership::RequestSnapshot>>,
    evicted_after: Vec<bool>,
    update: Option<UpdateClass>,
    admission: Option<Admission>,
    /// The request the op addressed, if any.
    target: Option<u64>,
}

/// What one op did: its classification or admission, the request it addressed, and whether it
/// was rejected.
#[derive(Default)]
struct Did {
    update: Option<UpdateClass>,
    admission: Option<Admission>,
    target: Option<u64>,
    failed: bool,
}

/// The controller under test, with the tickets held between begin and end and the retention
/// clock.
struct Driver {
    o: Owners<u64>,
    slots: [Option<Ticket<u64>>; 3],
    clock: u64,
}

impl Driver {
    fn apply(&mut self, op: &Op) -> Did {
        let o = &mut self.o;
        let mut did = Did::default();
        match *op {
            Op::Start { r, generation } => {
                did.target = Some(r);
                did.failed = o.start(r, generation).is_err();
            }
            Op::Finish { r, d } => {
                did.target = Some(r);
                did.failed = o.finish(&r, d).is_err();
            }
            Op::Update {
                r,
                revision,
                payload,
                fin,
            } => {
                did.target = Some(r);
                match o.update(&r, revision, &[payload; 2], fin) {
                    Ok(c) => did.update = Some(c),
                    Err(_) => did.failed = true,
                }
            }
            Op::Admit {
                r,
                generation,
                born,
                max_age,
                now,
            } => {
                did.target = Some(r);
                let (g, b, m, n) = (generation as i128, born as f64, max_age as f64, now as f64);
                match o.admit(r, g, b, m, n) {
                    Ok(a) => did.admission = Some(a),
                    Err(_) => did.failed = true,
                }
            }
            _ => return self.apply_rest(op),
        }
        did
    }

    /// Two-phase admissions, barriers and the retention clock.
    fn apply_rest(&mut self, op: &Op) -> Did {
        let o = &mut self.o;
        let mut did = Did::default();
        match *op {
            Op::Begin {
                slot,
                r,
                generation,
                born,
                max_age,
            } => {
                let (g, b, m) = (generation as i128, born as f64, max_age as f64);
                self.slots[slot] = Some(o.admit_begin(r, g, b, m).unwrap());
            }
            Op::End { slot, now } => {
                if let Some(t) = self.slots[slot].clone() {
                    did.target = Some(t.request);
                    match o.admit_end(&t, now as f64) {
                        Ok(a) => {
                            did.admission = Some(a);
                            self.slots[slot] = None;
                        }
                        Err(_) => did.failed = true,
                    }
                }
            }
            Op::BarrierAdvance => {
                o.barrier_advance();
            }
            Op::SetClear(c) => o.set_clear(c),
            Op::Expire { dt } => {
                self.clock += dt as u64;
                o.expire_tombstones(self.clock);
            }
            _ => unreachable!("handled by apply"),
        }
        did
    }
}

/// Run the ops, recording every step. Errors are fine (random ops are often invalid); they must
/// leave everything unchanged, which `after == before` checks for them.
fn run(retention: Retention, ops: &[Op]) -> Vec<Step> {
    let mut d = Driver {
        o: Owners::new(retention),
        slots: [None, None, None],
        clock: 0,
    };
    let snap = |o: &Owners<u64>| (0..4).map(|r| o.snapshot(&r)).collect::<Vec<_>>();
    let mut steps = Vec::new();
    for op in ops {
        let before = snap(&d.o);
        let did = d.apply(op);
        let after = snap(&d.o);
        if did.failed {
            assert_eq!(before, after, "a rejected {op:?} changed state");
        }
        steps.push(Step {
            op: op.clone(),
            before,
            after,
            evicted_after: (0..4).map(|r| d.o.is_evicted(&r)).collect(),
            update: did.update,
            admission: did.admission,
            target: did.target,
        });
    }
    steps
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3000))]

    /// A terminal state never changes; an evicted record never comes back.
    #[test]
    fn terminal_monotonicity((retention, ops) in scenario()) {
        let steps = run(retention, &ops);
        let mut terminal: [Option<State>; 4] = [None; 4];
        let mut gone = [false; 4];
        for s in &steps {
            for r in 0..4 {
                match &s.after[r] {
                    Some(snap) => {
                        prop_assert!(!gone[r], "request {r} came back after eviction");
                        if let Some(t) = terminal[r] {
                            prop_assert_eq!(snap.state, t, "terminal state changed by {:?}", s.op);
                        }
                        if snap.state.is_terminal() {
                            terminal[r] = Some(snap.state);
                        }
                    }
                    None => {
                        if terminal[r].is_some() {
                            prop_assert!(s.evicted_after[r], "terminal record vanished without eviction");
                            gone[r] = true;
                        }
                    }
                }
            }
        }
    }

    /// Nothing is submitted for a request that is terminal (or evicted), before or after.
    #[test]
    fn no_output_admitted_after_terminal((retention, ops) in scenario()) {
        let steps = run(retention, &ops);
        let mut ever_terminal = [false; 4];
        for s in &steps {
            if let (Some(Admission::Submitted(payload)), Some(r)) = (&s.admission, s.target) {
                let r = r as usize;
                prop_assert!(!ever_terminal[r], "request {r} submitted after its terminal transition");
                let before = s.before[r].as_ref().expect("submitted for a live record");
                let after = s.after[r].as_ref().expect("still live");
                prop_assert_eq!(before.state, State::Running);
                prop_assert_eq!(after.state, State::Running);
                prop_assert!(before.revision.is_some());
                prop_assert_eq!(payload, &before.payload, "submitted the current payload");
            }
            for r in 0..4 {
                if s.after[r].as_ref().is_some_and(|x| x.state.is_terminal()) || s.evicted_after[r] {
                    ever_terminal[r] = true;
                }
            }
        }
    }

    /// The stored revision never decreases, and update classifications follow the contract.
    #[test]
    fn revision_ordering((retention, ops) in scenario()) {
        let steps = run(retention, &ops);
        for s in &steps {
            for r in 0..4 {
                if let (Some(b), Some(a)) = (&s.before[r], &s.after[r]) {
                    prop_assert!(a.revision >= b.revision, "revision went back");
                }
            }
            let (Op::Update { r, revision, payload, fin }, Some(class)) = (&s.op, s.update) else { continue };
            let r = *r as usize;
            let Some(b) = &s.before[r] else {
                prop_assert_eq!(class, UpdateClass::Late);
                continue;
            };
            let expected = match b.revision {
                Some(cur) if *revision < cur => UpdateClass::Stale,
                Some(cur) if *revision == cur => {
                    if *b.payload == [*payload; 2] && b.final_output == *fin {
                        UpdateClass::Duplicate
                    } else {
                        UpdateClass::Conflict
                    }
                }
                _ if b.state.is_terminal() || b.final_output => UpdateClass::Conflict,
                _ => UpdateClass::Accepted,
            };
            prop_assert_eq!(class, expected, "{:?} on {:?}", s.op, b);
            let a = s.after[r].as_ref().unwrap();
            if class == UpdateClass::Accepted {
                prop_assert_eq!(a.revision, Some(*revision));
                prop_assert_eq!(&*a.payload, &[*payload; 2][..]);
            } else {
                prop_assert_eq!(a, b, "a non-accepted update changed the record");
            }
        }
    }

    /// An operation on one request never changes another's record. The only cross-request
    /// effect allowed is the retention policy evicting an older terminal record.
    #[test]
    fn operations_are_isolated((retention, ops) in scenario()) {
        let steps = run(retention, &ops);
        for s in &steps {
            let Some(t) = s.target else { continue };
            for r in 0..4u64 {
                if r == t {
                    continue;
                }
                let (b, a) = (&s.before[r as usize], &s.after[r as usize]);
                if a.is_none() && b.is_some() {
                    prop_assert!(s.evicted_after[r as usize], "{r} vanished");
                    prop_assert!(b.as_ref().unwrap().state.is_terminal(), "evicted a running record");
                    continue;
                }
                prop_assert_eq!(a, b, "{:?} on {} changed {}", s.op, t, r);
            }
        }
    }
}

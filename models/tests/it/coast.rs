//! Coasting (`Engine::coast_ends`) against the engine's own turns. After every event the driver
//! asks for the turns ahead and holds the engine to them: until something from outside comes
//! (an arrival, an abort, a hand-over, a timer) at or before a promised turn, each promised turn
//! must be taken, quiet (`turn` gives `Some`), at its time, and launch the step that ends at
//! the next promised time. The streak's random worlds run it.
//!
//! Taken together (`Scheduler::turns_at`), the promised turns must be the turns taken one by
//! one: the same reports, dispatches and everything after.

use std::collections::VecDeque;

use cancelsim_models::engine::Engine;
use cancelsim_models::protocol::{Dispatch, NewRequest, Outbox, Scheduler};
use proptest::prelude::*;

use crate::driver::{cfg, req};
use crate::streak::{world, Sharing, World};

/// Turns taken, how many of them were promised, and what the engine gave, in order.
#[derive(Debug, Default, PartialEq)]
struct Turns {
    taken: u64,
    promised: u64,
    /// Calls of `turns_at` that took two turns or more.
    together: u64,
    log: Vec<String>,
}

/// Ask for the turns ahead, unless a promise still stands.
fn promise_more(e: &mut impl Scheduler, inflight: &[Dispatch], promise: &mut VecDeque<u64>) {
    if !promise.is_empty() {
        return;
    }
    let mut ends = Vec::new();
    e.coast_ends(64, &mut ends);
    if let Some(&first) = ends.first() {
        assert!(ends.len() >= 2, "a coast names at least one turn");
        assert_eq!(Some(first), inflight.first().map(|d| d.end_ns));
        assert!(ends.windows(2).all(|w| w[0] < w[1]), "ends rise: {ends:?}");
        promise.extend(ends);
    }
}

/// Where no input comes before a promise's last turn, take its turns in one call (`turned`:
/// the engine's last call was a turn). Returns the last turn's dispatch.
fn take_together(
    e: &mut impl Scheduler,
    step: u64,
    turned: bool,
    promise: &mut VecDeque<u64>,
    t: &mut Turns,
) -> Dispatch {
    let at: Vec<u64> = promise.iter().take(promise.len() - 1).copied().collect();
    let mut out = Vec::new();
    e.turns_at(step, &at, turned, &mut out);
    assert_eq!(out.len(), at.len(), "a promised turn was not quiet");
    for (&now, (report, next)) in at.iter().zip(&out) {
        t.log.push(format!("{now} {report:?} {next:?}"));
    }
    assert_eq!(promise.back(), out.last().map(|(_, d)| &d.end_ns));
    t.taken += at.len() as u64;
    t.promised += at.len() as u64;
    t.together += u64::from(at.len() >= 2);
    promise.clear();
    out.last().expect("a turn").1
}

/// Drive `e` through `w`'s inputs, holding it to every promise; the turns it took. With
/// `together`, a promise that nothing from outside reaches is taken in one call.
fn drive(e: &mut impl Scheduler, w: &World, together: bool) -> Turns {
    let arrivals: Vec<(u64, NewRequest)> = (w.arrivals.iter())
        .map(|&(t, r)| (t, NewRequest { lazy: true, ..r }))
        .collect();
    let (mut na, mut nb, mut nx) = (0, 0, 0);
    let mut inflight: Vec<Dispatch> = Vec::new();
    let mut out = Outbox::default();
    let mut promise: VecDeque<u64> = VecDeque::new();
    let mut turns = Turns::default();
    // Whether the engine's last call was a turn that gave one.
    let mut turned = false;
    for _ in 0..1_000_000 {
        let t_arr = arrivals.get(na).map(|a| a.0);
        let t_abort = w.aborts.get(nb).map(|a| a.0);
        let t_explicit = w.explicit.get(nx).map(|a| a.0);
        let t_step = inflight.first().map(|d| d.end_ns);
        let input = [t_arr, e.timer_ns(), t_abort, t_explicit]
            .into_iter()
            .flatten()
            .min();
        // Something from outside at or before a promised turn: the promise no longer holds.
        if input.is_some_and(|t| promise.front().is_some_and(|&p| t <= p)) {
            promise.clear();
        }
        let Some(now) = [input, t_step].into_iter().flatten().min() else {
            return turns;
        };
        if t_step == Some(now) {
            let d = inflight.remove(0);
            let alone = input != Some(now) && inflight.first().is_none_or(|x| x.end_ns != now);
            let last_turn = promise.len().checked_sub(2).map(|i| promise[i]);
            if together
                && alone
                && promise.front() == Some(&now)
                && input.is_none_or(|t| last_turn.is_some_and(|l| t > l))
            {
                inflight.push(take_together(e, d.step, turned, &mut promise, &mut turns));
                turned = true;
                promise_more(e, &inflight, &mut promise);
                continue;
            }
            if let Some((report, next)) = alone.then(|| e.turn(now, d.step)).flatten() {
                turns.log.push(format!("{now} {report:?} {next:?}"));
                turns.taken += 1;
                if promise.front() == Some(&now) {
                    promise.pop_front();
                    assert_eq!(promise.front(), Some(&next.end_ns), "the promised step");
                    turns.promised += 1;
                    if promise.len() == 1 {
                        promise.clear();
                    }
                }
                inflight.push(next);
                turned = true;
                promise_more(e, &inflight, &mut promise);
                continue;
            }
            turned = false;
            assert_ne!(promise.front(), Some(&now), "a promised turn was not quiet");
            let report = e.step_done(now, d.step, &mut out);
            turns.log.push(format!("{now} done {report:?}"));
        } else if t_explicit == Some(now) && t_arr != Some(now) {
            turned = false;
            e.make_explicit(w.explicit[nx].1);
            nx += 1;
        } else if t_abort == Some(now) && t_arr != Some(now) {
            turned = false;
            e.abort(w.aborts[nb].1);
            nb += 1;
        } else if t_arr == Some(now) {
            turned = false;
            let _ = e.enqueue(now, arrivals[na].1);
            na += 1;
        }
        turns.log.push(format!("{now} {out:?}"));
        out.clear();
        let more_now = arrivals.get(na).is_some_and(|a| a.0 == now)
            || w.aborts.get(nb).is_some_and(|a| a.0 == now)
            || w.explicit.get(nx).is_some_and(|a| a.0 == now)
            || inflight.first().is_some_and(|d| d.end_ns == now);
        if !more_now {
            turned = false;
            e.checkpoint(now, &mut out);
            while let Some(d) = e.dispatch(now, &mut out) {
                inflight.push(d);
            }
            turns.log.push(format!("{now} {out:?} {inflight:?}"));
            out.clear();
        }
        promise_more(e, &inflight, &mut promise);
    }
    panic!("did not go idle");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2_000, ..ProptestConfig::default() })]

    #[test]
    fn every_promised_turn_is_taken_quiet_at_its_time(w in world()) {
        let mut one = Sharing(Engine::new(w.cfg.clone()));
        let mut together = Sharing(Engine::new(w.cfg.clone()));
        let (a, b) = (drive(&mut one, &w, false), drive(&mut together, &w, true));
        prop_assert_eq!(&a.log, &b.log);
        prop_assert_eq!((a.taken, a.promised), (b.taken, b.promised));
        prop_assert_eq!(one.totals(), together.totals());
        prop_assert_eq!(format!("{:?}", one.0.stats()), format!("{:?}", together.0.stats()));
    }
}

/// With nothing from outside after they start, every turn of a few decodes is promised ahead,
/// over block boundaries and members' last tokens: a prediction that stopped early, or never
/// started, fails here.
#[test]
fn decodes_left_alone_are_promised_every_turn() {
    let w = World {
        cfg: cfg(1),
        arrivals: (0..5)
            .map(|i| (0, req(i, 10 + 7 * i as u32, 20 + 30 * i as u32)))
            .collect(),
        aborts: Vec::new(),
        explicit: Vec::new(),
    };
    let turns = drive(&mut Engine::new(w.cfg.clone()), &w, false);
    assert!(turns.taken > 100, "{turns:?}");
    assert_eq!(turns.promised, turns.taken);
    let together = drive(&mut Engine::new(w.cfg.clone()), &w, true);
    assert!(together.together >= 3, "{}", together.together);
    assert_eq!(together.log, turns.log);
}

/// A second step in flight (`window` 2) is beyond a coast: nothing is promised, and the turns
/// go on as before.
#[test]
fn two_steps_in_flight_promise_nothing() {
    let w = World {
        cfg: cfg(2),
        arrivals: vec![(0, req(1, 20, 80))],
        aborts: Vec::new(),
        explicit: Vec::new(),
    };
    let turns = drive(&mut Engine::new(w.cfg.clone()), &w, true);
    assert!(turns.taken > 10, "{turns:?}");
    assert_eq!(turns.promised, 0);
}

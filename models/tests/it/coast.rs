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
    let ends: Vec<u64> = promise.iter().copied().collect();
    let at = &ends[..ends.len() - 1];
    let taken = e.turns_at(step, &ends, turned);
    assert_eq!(taken.count, at.len(), "a promised turn was not quiet");
    // Each report and launch as `turns_at` implies them (`Turned::report`): the next step,
    // from this tick to the next. The log holds them beside what `turn`, one by one, gave.
    let launched = |i: usize| Dispatch {
        step: taken.report(i, &ends).step + 1,
        start_ns: ends[i],
        end_ns: ends[i + 1],
    };
    for (i, &now) in at.iter().enumerate() {
        let report = taken.report(i, &ends);
        t.log.push(format!("{now} {report:?} {:?}", launched(i)));
    }
    t.taken += at.len() as u64;
    t.promised += at.len() as u64;
    t.together += u64::from(at.len() >= 2);
    promise.clear();
    launched(at.len() - 1)
}

/// What the driver holds between events.
#[derive(Default)]
struct Drive {
    inflight: Vec<Dispatch>,
    promise: VecDeque<u64>,
    turns: Turns,
    /// Whether the engine's last call was a turn that gave one.
    turned: bool,
    /// Whether a promise that nothing from outside reaches is taken in one call.
    together: bool,
}

impl Drive {
    /// Step `d` ends at `now`, alone: a turn, or with `together` the promise's turns in one
    /// call where no input (`input`: the next) comes before their last. True if it turned.
    fn turn(&mut self, e: &mut impl Scheduler, d: Dispatch, now: u64, input: Option<u64>) -> bool {
        let p = &mut self.promise;
        let last_turn = p.len().checked_sub(2).map(|i| p[i]);
        if self.together
            && p.front() == Some(&now)
            && input.is_none_or(|t| last_turn.is_some_and(|l| t > l))
        {
            let next = take_together(e, d.step, self.turned, p, &mut self.turns);
            self.inflight.push(next);
        } else {
            let Some((report, next)) = e.turn(now, d.step) else {
                return false;
            };
            let t = &mut self.turns;
            t.log.push(format!("{now} {report:?} {next:?}"));
            t.taken += 1;
            if p.front() == Some(&now) {
                p.pop_front();
                assert_eq!(p.front(), Some(&next.end_ns), "the promised step");
                t.promised += 1;
                if p.len() == 1 {
                    p.clear();
                }
            }
            self.inflight.push(next);
        }
        self.turned = true;
        promise_more(e, &self.inflight, &mut self.promise);
        true
    }
}

/// Drive `e` through `w`'s inputs, holding it to every promise; the turns it took. With
/// `together`, a promise that nothing from outside reaches is taken in one call.
fn drive(e: &mut impl Scheduler, w: &World, together: bool) -> Turns {
    let arrivals: Vec<(u64, NewRequest)> = (w.arrivals.iter())
        .map(|&(t, r)| (t, NewRequest { lazy: true, ..r }))
        .collect();
    let (mut na, mut nb, mut nx) = (0, 0, 0);
    let mut out = Outbox::default();
    let mut st = Drive {
        together,
        ..Drive::default()
    };
    for _ in 0..1_000_000 {
        let t_arr = arrivals.get(na).map(|a| a.0);
        let t_abort = w.aborts.get(nb).map(|a| a.0);
        let t_explicit = w.explicit.get(nx).map(|a| a.0);
        let t_step = st.inflight.first().map(|d| d.end_ns);
        let input = [t_arr, e.timer_ns(), t_abort, t_explicit]
            .into_iter()
            .flatten()
            .min();
        // Something from outside at or before a promised turn: the promise no longer holds.
        if input.is_some_and(|t| st.promise.front().is_some_and(|&p| t <= p)) {
            st.promise.clear();
        }
        let Some(now) = [input, t_step].into_iter().flatten().min() else {
            return st.turns;
        };
        // Any call but a turn: the engine's last call is no longer one.
        let turned_before = std::mem::replace(&mut st.turned, false);
        if t_step == Some(now) {
            let d = st.inflight.remove(0);
            let alone = input != Some(now) && st.inflight.first().is_none_or(|x| x.end_ns != now);
            st.turned = turned_before;
            if alone && st.turn(e, d, now, input) {
                continue;
            }
            st.turned = false;
            assert_ne!(
                st.promise.front(),
                Some(&now),
                "a promised turn was not quiet"
            );
            let report = e.step_done(now, d.step, &mut out);
            st.turns.log.push(format!("{now} done {report:?}"));
        } else if t_explicit == Some(now) && t_arr != Some(now) {
            e.make_explicit(w.explicit[nx].1);
            nx += 1;
        } else if t_abort == Some(now) && t_arr != Some(now) {
            e.abort(w.aborts[nb].1);
            nb += 1;
        } else if t_arr == Some(now) {
            let _ = e.enqueue(now, arrivals[na].1);
            na += 1;
        }
        st.turns.log.push(format!("{now} {out:?}"));
        out.clear();
        let more_now = arrivals.get(na).is_some_and(|a| a.0 == now)
            || w.aborts.get(nb).is_some_and(|a| a.0 == now)
            || w.explicit.get(nx).is_some_and(|a| a.0 == now)
            || st.inflight.first().is_some_and(|d| d.end_ns == now);
        if !more_now {
            e.checkpoint(now, &mut out);
            while let Some(d) = e.dispatch(now, &mut out) {
                st.inflight.push(d);
            }
            st.turns
                .log
                .push(format!("{now} {out:?} {:?}", st.inflight));
            out.clear();
        }
        promise_more(e, &st.inflight, &mut st.promise);
    }
    panic!("did not go idle");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2_000, ..ProptestConfig::default() })]

    #[test]
    fn every_promised_turn_is_taken_quiet_at_its_time(w in world()) {
        let mut one = Sharing(Engine::new(w.cfg.clone()), false);
        let mut together = Sharing(Engine::new(w.cfg.clone()), false);
        let mut by_turn = Sharing(Engine::new(w.cfg.clone()), true);
        let (a, b) = (drive(&mut one, &w, false), drive(&mut together, &w, true));
        prop_assert_eq!(&a.log, &b.log);
        prop_assert_eq!((a.taken, a.promised), (b.taken, b.promised));
        prop_assert_eq!(one.totals(), together.totals());
        prop_assert_eq!(format!("{:?}", one.0.stats()), format!("{:?}", together.0.stats()));
        // The trait's own `turns_at`, taken together, gives the same turns.
        let c = drive(&mut by_turn, &w, true);
        prop_assert_eq!(&a.log, &c.log);
        prop_assert_eq!(b.together, c.together);
        prop_assert_eq!(format!("{:?}", one.0.stats()), format!("{:?}", by_turn.0.stats()));
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

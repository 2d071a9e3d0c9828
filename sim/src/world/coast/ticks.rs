//! The ticks coasted turns hold (`Coasts::ticks`): which replica's coast holds a tick, if any.
//!
//! A fleet's coasts hold tens of thousands of ticks at once, each found at random among the
//! others, so nearly every insert misses the cache; a map that also removes each tick as its
//! coast ends misses twice a tick. Here nothing is removed. An entry is only a hint that its
//! owner holds its tick: whoever reads it asks the owner's coast (`live`), which holds exactly
//! the ticks the map of old held. And since no event is ever asked for before now, an entry for
//! a tick already passed is free to take. So a tick costs one line: four slots, one cache line,
//! found by a multiplicative hash, with a small map for the ticks of a full line.

use rustc_hash::FxHashMap;

/// Home lines, at least and at most, as a power of two.
const LINES_LOG2_MIN: u32 = 4;
const LINES_LOG2_MAX: u32 = 20;
/// A slot never taken. A tick of `u64::MAX` is never in a line: the small map holds it.
const FREE: u64 = u64::MAX;
/// The small map is swept of the entries no coast holds once it has this many more than after
/// its last sweep.
const SPILL_SWEEP_AFTER: usize = 1024;

/// Four ticks and their owners: one cache line.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line {
    ticks: [u64; 4],
    owners: [u32; 4],
}

const EMPTY_LINE: Line = Line {
    ticks: [FREE; 4],
    owners: [0; 4],
};

pub(super) struct Ticks {
    lines: Vec<Line>,
    shift: u32,
    /// Ticks whose home line was full when they came.
    spill: FxHashMap<u64, u32>,
    spill_sweep_at: usize,
}

impl Default for Ticks {
    fn default() -> Ticks {
        Ticks::with_capacity(0)
    }
}

impl Ticks {
    /// Room for about `ticks` held at once, within the bounds.
    pub(super) fn with_capacity(ticks: u64) -> Ticks {
        let lines = (ticks / 2).max(1).next_power_of_two();
        let log2 = lines.trailing_zeros().clamp(LINES_LOG2_MIN, LINES_LOG2_MAX);
        Ticks {
            lines: vec![EMPTY_LINE; 1 << log2],
            shift: 64 - log2,
            spill: FxHashMap::default(),
            spill_sweep_at: SPILL_SWEEP_AFTER,
        }
    }

    #[inline(always)]
    fn home(&self, tick: u64) -> usize {
        (tick.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> self.shift) as usize
    }

    /// Read the home lines of `ticks` ahead of their inserts, each on its own, so that their
    /// misses overlap rather than come one after another (a hint: no effect on answers).
    #[inline]
    pub(super) fn warm(&self, ticks: &[u64]) {
        for &t in ticks {
            std::hint::black_box(self.lines[self.home(t)].ticks[0]);
        }
    }

    /// The replica whose coast holds `tick`, by `live(owner, tick)`: whether `owner`'s coast
    /// holds `tick` now. At most one does.
    #[inline]
    pub(super) fn holds(&self, tick: u64, live: impl Fn(u32, u64) -> bool) -> Option<u32> {
        let line = &self.lines[self.home(tick)];
        for (&t, &owner) in line.ticks.iter().zip(&line.owners) {
            if t == tick && tick != FREE && live(owner, tick) {
                return Some(owner);
            }
        }
        if self.spill.is_empty() {
            return None;
        }
        self.spill.get(&tick).copied().filter(|&o| live(o, tick))
    }

    /// Holds `tick`, at or after `now_ns`, for `replica`'s coast if no coast holds it (`live`):
    /// whether it did. A slot whose tick is passed, or is `tick` (no coast holds it), is taken.
    #[inline]
    pub(super) fn hold(
        &mut self,
        tick: u64,
        replica: u32,
        now_ns: u64,
        live: impl Fn(u32, u64) -> bool,
    ) -> bool {
        debug_assert!(tick >= now_ns, "a tick held before now");
        if self.holds(tick, &live).is_some() {
            return false;
        }
        let h = self.home(tick);
        let line = &mut self.lines[h];
        let free = |t: u64| t == FREE || t < now_ns || t == tick;
        match line.ticks.iter().position(|&t| free(t)) {
            Some(j) if tick != FREE => (line.ticks[j], line.owners[j]) = (tick, replica),
            _ => {
                self.spill.insert(tick, replica);
            }
        }
        true
    }

    /// Forget the small map's entries that no coast holds (`live`) or that are passed, once it
    /// has grown enough since the last time. Not while a coast is being held: its own ticks
    /// are not live yet.
    pub(super) fn sweep(&mut self, now_ns: u64, live: impl Fn(u32, u64) -> bool) {
        if self.spill.len() >= self.spill_sweep_at {
            self.spill.retain(|&t, &mut o| t >= now_ns && live(o, t));
            self.spill_sweep_at = self.spill.len() + SPILL_SWEEP_AFTER;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Five ticks from `from` on that share a home line: more than the line holds.
    fn same_line(t: &Ticks, from: u64) -> Vec<u64> {
        let home = t.home(from);
        (from..).filter(|&x| t.home(x) == home).take(5).collect()
    }

    #[test]
    fn a_tick_is_found_while_its_owner_holds_it_and_not_after() {
        let mut t = Ticks::default();
        let held = std::cell::RefCell::new(vec![(7_u32, 100_u64)]);
        let live = |o: u32, x: u64| held.borrow().contains(&(o, x));
        assert!(t.hold(100, 7, 50, live));
        assert_eq!(t.holds(100, live), Some(7));
        assert!(!t.hold(100, 8, 60, live), "another coast holds it");
        assert_eq!(t.holds(101, live), None);
        held.borrow_mut().clear(); // the coast ended: nothing was removed from the table
        assert_eq!(t.holds(100, live), None);
        assert!(t.hold(100, 8, 60, |o, x| o == 8 && x == 100));
        assert_eq!(t.holds(100, |o, x| o == 8 && x == 100), Some(8));
    }

    #[test]
    fn a_full_line_spills_and_a_passed_slot_is_taken_again() {
        let mut t = Ticks::default();
        let ticks = same_line(&t, 1_000);
        let live = |_: u32, x: u64| ticks.contains(&x);
        for (i, &x) in ticks.iter().enumerate() {
            assert!(t.hold(x, i as u32, 0, live));
        }
        assert_eq!(t.spill.len(), 1, "four slots a line, the fifth spilled");
        for (i, &x) in ticks.iter().enumerate() {
            assert_eq!(t.holds(x, live), Some(i as u32));
        }
        // Once the first tick has passed, its slot holds a new tick of the same line.
        let later = same_line(&t, ticks[4] + 1)[0];
        assert!(t.hold(later, 9, ticks[0] + 1, |_, x| x == later));
        assert_eq!(
            t.spill.len(),
            1,
            "the passed slot was taken, nothing spilled"
        );
        assert_eq!(t.holds(later, |_, x| x == later), Some(9));
    }

    #[test]
    fn a_sweep_keeps_what_a_coast_holds_and_drops_the_rest() {
        let mut t = Ticks {
            spill_sweep_at: 0,
            ..Ticks::default()
        };
        let (live_tick, dead_tick, passed_tick) = (500, 600, 10);
        for (x, o) in [(live_tick, 1), (dead_tick, 2), (passed_tick, 3)] {
            t.spill.insert(x, o);
        }
        let live = |o: u32, x: u64| (o, x) == (1, live_tick) || (o, x) == (3, passed_tick);
        t.sweep(100, live);
        assert_eq!(t.spill.len(), 1);
        assert_eq!(t.holds(live_tick, live), Some(1));
        assert_eq!(t.spill_sweep_at, 1 + SPILL_SWEEP_AFTER);
    }
}

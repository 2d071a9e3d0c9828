//! How many events are pending at each tick: whether one waits at a given tick, in one lookup,
//! for a replica about to coast past it (`world/coast.rs`). Kept only where a world coasts
//! (`Kernel::track_times`): it costs two map updates an event, and a filter of counts answers
//! most ticks asked about with no lookup.

use rustc_hash::FxHashMap;

/// Slots of the filter before the map: 2^14 counts of 2 bytes, 32 KB (2^16 ran no faster).
const FILTER_BITS: u32 = 14;
/// A slot's count that no longer moves: it says "maybe" for good, and the map answers.
const STUCK: u16 = u16::MAX;

#[derive(Debug)]
pub struct PendingTimes {
    /// Tick → events pending at it; a tick with none is not a key.
    counts: FxHashMap<u64, u32>,
    /// Events pending at the ticks that hash to each slot (`slot`), or `STUCK`: a slot at 0 has
    /// none, so most ticks asked about (a coast's, which almost never hold an event) are
    /// answered without a map lookup. The map alone answers a slot that is not 0.
    filter: Box<[u16]>,
}

impl Default for PendingTimes {
    fn default() -> Self {
        PendingTimes {
            counts: FxHashMap::default(),
            filter: vec![0; 1 << FILTER_BITS].into_boxed_slice(),
        }
    }
}

/// The filter's slot of a tick: the high bits of a multiplicative hash.
#[inline(always)]
fn slot(time_ns: u64) -> usize {
    (time_ns.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - FILTER_BITS)) as usize
}

impl PendingTimes {
    pub fn add(&mut self, time_ns: u64) {
        *self.counts.entry(time_ns).or_insert(0) += 1;
        let f = &mut self.filter[slot(time_ns)];
        if *f != STUCK {
            *f += 1;
        }
    }

    pub fn remove(&mut self, time_ns: u64) {
        match self.counts.get_mut(&time_ns) {
            Some(n) if *n > 1 => *n -= 1,
            Some(_) => {
                self.counts.remove(&time_ns);
            }
            None => panic!("no event was pending at {time_ns} ns"),
        }
        let f = &mut self.filter[slot(time_ns)];
        assert!(*f > 0, "the filter counts every pending event");
        if *f != STUCK {
            *f -= 1;
        }
    }

    #[inline]
    pub fn any_at(&self, time_ns: u64) -> bool {
        self.filter[slot(time_ns)] != 0 && self.counts.contains_key(&time_ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tick_is_pending_until_its_last_event_goes() {
        let mut p = PendingTimes::default();
        p.add(5);
        p.add(5);
        p.add(7);
        p.remove(5);
        assert!(p.any_at(5) && p.any_at(7) && !p.any_at(6));
        p.remove(5);
        p.remove(7);
        assert!(!p.any_at(5) && !p.any_at(7));
    }

    #[test]
    fn ticks_that_share_a_slot_are_told_apart() {
        let mut p = PendingTimes::default();
        // Two ticks of one slot: the filter says maybe for both, the map tells them apart.
        let a = 12_345u64;
        let b = (a + 1..)
            .find(|&t| slot(t) == slot(a))
            .expect("a tick of the same slot");
        p.add(a);
        assert!(p.any_at(a) && !p.any_at(b));
        p.add(b);
        p.remove(a);
        assert!(!p.any_at(a) && p.any_at(b));
        p.remove(b);
        assert!(!p.any_at(a) && !p.any_at(b));
        assert_eq!(p.filter[slot(a)], 0);
    }

    #[test]
    fn a_full_slot_sticks_and_the_map_answers() {
        let mut p = PendingTimes::default();
        for _ in 0..u16::MAX as u32 + 5 {
            p.add(7);
        }
        assert_eq!(p.filter[slot(7)], STUCK);
        for _ in 0..u16::MAX as u32 + 5 {
            assert!(p.any_at(7));
            p.remove(7);
        }
        assert!(!p.any_at(7));
        assert_eq!(p.filter[slot(7)], STUCK, "a stuck slot stays");
    }
}

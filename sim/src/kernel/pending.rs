//! How many events are pending at each tick: whether one waits at a given tick, in one lookup,
//! for a replica about to coast past it (`world/coast.rs`). Kept only where a world coasts
//! (`Kernel::track_times`): it costs two map updates an event.

use rustc_hash::FxHashMap;

#[derive(Debug, Default)]
pub struct PendingTimes {
    /// Tick → events pending at it; a tick with none is not a key.
    counts: FxHashMap<u64, u32>,
}

impl PendingTimes {
    pub fn add(&mut self, time_ns: u64) {
        *self.counts.entry(time_ns).or_insert(0) += 1;
    }

    pub fn remove(&mut self, time_ns: u64) {
        match self.counts.get_mut(&time_ns) {
            Some(n) if *n > 1 => *n -= 1,
            Some(_) => {
                self.counts.remove(&time_ns);
            }
            None => panic!("no event was pending at {time_ns} ns"),
        }
    }

    pub fn any_at(&self, time_ns: u64) -> bool {
        self.counts.contains_key(&time_ns)
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
}

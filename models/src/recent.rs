//! A bounded memory of ids: the last so many inserted, the oldest forgotten first. The engine
//! keeps its terminated runtime ids and its handled abort keys in one, the ownership controller
//! the identities whose records it evicted.

use std::collections::hash_map::Entry;
use std::hash::Hash;

use rustc_hash::FxHashMap;

/// The ids among the last `bound` insertions, as a queue of them beside a set would hold them.
///
/// Each id maps to the number of its insertion, and it is a member while that number is among
/// the last `bound`. The forgotten ones are swept out together when the map passes one and a
/// half times the bound (for the engine's 8,192 a map of as many buckets as that queue and set
/// had): one map operation an insertion instead of two (the insertion, and the removal of the
/// id it pushes out), where each is a cache miss in a map of thousands (every request that
/// leaves inserts).
#[derive(Clone, Debug)]
pub struct Recent<K> {
    numbers: FxHashMap<K, u64>,
    /// Insertions so far: the next one's number.
    inserted: u64,
    bound: u64,
}

impl<K: Eq + Hash> Recent<K> {
    /// Remember at most the last `bound` ids inserted (`usize::MAX`: all of them).
    pub fn new(bound: usize) -> Recent<K> {
        Recent {
            numbers: FxHashMap::default(),
            inserted: 0,
            bound: bound as u64,
        }
    }

    /// Whether the insertion numbered `n` is among the last `bound` of `inserted`: the one
    /// rule of membership, for a lookup, a refusal and a sweep alike.
    fn kept(inserted: u64, n: u64, bound: u64) -> bool {
        inserted - n <= bound
    }

    /// Remember `id`; false, and nothing changed, if it is remembered already.
    pub fn insert(&mut self, id: K) -> bool {
        let n = self.inserted;
        match self.numbers.entry(id) {
            Entry::Occupied(mut e) => {
                if Self::kept(n, *e.get(), self.bound) {
                    return false;
                }
                e.insert(n);
            }
            Entry::Vacant(e) => {
                e.insert(n);
            }
        }
        self.inserted = n + 1;
        if self.numbers.len() as u64 > self.bound.saturating_add(self.bound / 2) {
            let (inserted, bound) = (self.inserted, self.bound);
            self.numbers.retain(|_, n| Self::kept(inserted, *n, bound));
            debug_assert_eq!(self.numbers.len() as u64, bound);
        }
        true
    }

    pub fn contains(&self, id: &K) -> bool {
        let (inserted, bound) = (self.inserted, self.bound);
        self.numbers
            .get(id)
            .is_some_and(|&n| Self::kept(inserted, n, bound))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{HashSet, VecDeque};

    use super::*;

    #[test]
    fn the_oldest_insertions_are_forgotten_first() {
        // Against the queue and set it stands for: ids drawn from a range twice the bound, so
        // some come back while remembered (refused), some after they were forgotten (taken
        // again), across many sweeps of the map.
        for bound in [1, 2, 64, 1000] {
            let mut ids = Recent::new(bound);
            let (mut order, mut set) = (VecDeque::new(), HashSet::new());
            let (mut x, mut sweeps) = (0x9e37_79b9_7f4a_7c15u64, 0);
            let range = 2 * bound as u64;
            for _ in 0..100 * bound {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let id = x % range;
                let fresh = set.insert(id);
                if fresh {
                    order.push_back(id);
                    if order.len() > bound {
                        set.remove(&order.pop_front().unwrap());
                    }
                }
                let len = ids.numbers.len() + !ids.numbers.contains_key(&id) as usize;
                assert_eq!(ids.insert(id), fresh, "insert {id}");
                if ids.numbers.len() < len {
                    // A sweep keeps exactly the remembered ones.
                    sweeps += 1;
                    assert_eq!(ids.numbers.len(), order.len());
                    assert!(order.iter().all(|id| ids.contains(id)));
                }
                let probe = (x >> 20) % range;
                assert_eq!(ids.contains(&probe), set.contains(&probe), "{probe}");
            }
            assert!(ids.numbers.len() as u64 <= bound as u64 * 3 / 2 + 1);
            assert!(sweeps > 3, "bound {bound}: {sweeps} sweeps");
        }
    }

    #[test]
    fn with_no_bound_nothing_is_forgotten_and_with_zero_nothing_is_kept() {
        let (mut all, mut none) = (Recent::new(usize::MAX), Recent::new(0));
        for id in 0..10_000u64 {
            assert!(all.insert(id) && none.insert(id));
        }
        assert!((0..10_000u64).all(|id| all.contains(&id) && !none.contains(&id)));
        assert!(!all.insert(0) && none.insert(0));
    }
}

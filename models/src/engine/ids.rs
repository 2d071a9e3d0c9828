//! Runtime ids: the slots each live one names (a request-scope abort finds its requests
//! there), and bounded memories of ids that are gone (terminated ones, aborts handled).

use std::collections::hash_map::Entry as MapEntry;

use rustc_hash::FxHashMap;

/// Terminated runtime ids remembered at most per engine (the runtime's tombstone retention). A late
/// abort comes seconds after its request ended; at a few hundred requests per second per replica
/// this covers many minutes, and memory stays bounded however long the run.
pub const TOMBSTONES_MAX: usize = 1 << 13;

/// A bounded set of ids, oldest forgotten first (at most `TOMBSTONES_MAX`): terminated runtime
/// ids, or the idempotency keys of aborts already handled.
///
/// Each id maps to the number of its insertion; it is in the set while that number is among the
/// last `TOMBSTONES_MAX` insertions, the order a queue of them would forget it in. The forgotten
/// ones are swept out when the map passes one and a half times the bound (a map of as many
/// buckets as the queue and set it replaces, 16,384), all at once: one map operation an
/// insertion instead of two (the insertion, and the removal of the id it pushes out), where
/// each is a cache miss in a map of thousands (every request's retirement inserts).
#[derive(Default)]
pub(super) struct BoundedIds {
    numbers: FxHashMap<u64, u64>,
    /// Insertions so far: the next one's number.
    inserted: u64,
}

impl BoundedIds {
    /// Whether an insertion numbered `n` is among the last `TOMBSTONES_MAX`.
    fn recent(&self, n: u64) -> bool {
        self.inserted - n <= TOMBSTONES_MAX as u64
    }

    /// Remember `id`; false if it was there already.
    pub(super) fn insert(&mut self, id: u64) -> bool {
        let n = self.inserted;
        match self.numbers.entry(id) {
            MapEntry::Occupied(mut e) => {
                if n - *e.get() <= TOMBSTONES_MAX as u64 {
                    return false;
                }
                e.insert(n);
            }
            MapEntry::Vacant(e) => {
                e.insert(n);
            }
        }
        self.inserted = n + 1;
        if self.numbers.len() > TOMBSTONES_MAX + TOMBSTONES_MAX / 2 {
            let inserted = self.inserted;
            self.numbers
                .retain(|_, n| inserted - *n <= TOMBSTONES_MAX as u64);
            debug_assert_eq!(self.numbers.len(), TOMBSTONES_MAX);
        }
        true
    }

    pub(super) fn contains(&self, id: u64) -> bool {
        self.numbers.get(&id).is_some_and(|&n| self.recent(n))
    }
}

/// Slots not yet freed, by runtime id: a request-scope abort finds its request here. An id of
/// one live request is in `one` (16 bytes an entry: every waiting request has one); an id that
/// several share (a client's reused ids) is in `many`, its slots in the order they came.
#[derive(Default)]
pub(super) struct RuntimeIndex {
    one: FxHashMap<u64, u32>,
    many: FxHashMap<u64, Vec<u32>>,
}

impl RuntimeIndex {
    pub(super) fn insert(&mut self, rid: u64, slot: u32) {
        if let Some(v) = self.many.get_mut(&rid) {
            v.push(slot);
            return;
        }
        match self.one.entry(rid) {
            MapEntry::Vacant(v) => {
                v.insert(slot);
            }
            MapEntry::Occupied(o) => {
                let first = o.remove();
                self.many.insert(rid, vec![first, slot]);
            }
        }
    }

    pub(super) fn remove(&mut self, rid: u64, slot: u32) {
        if let MapEntry::Occupied(o) = self.one.entry(rid) {
            if *o.get() == slot {
                o.remove();
            }
            return;
        }
        if let Some(v) = self.many.get_mut(&rid) {
            v.retain(|&s| s != slot);
            if v.is_empty() {
                self.many.remove(&rid);
            }
        }
    }

    /// The slots of `rid`, in the order they came.
    pub(super) fn slots(&self, rid: u64) -> &[u32] {
        match self.one.get(&rid) {
            Some(s) => std::slice::from_ref(s),
            None => self.many.get(&rid).map_or(&[], |v| v),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use super::*;

    #[test]
    fn bounded_ids_forget_the_oldest_insertions_first() {
        // Against the queue and set it stands for: ids drawn from a range twice the bound, so
        // some come back while remembered (refused), some after they were forgotten (taken
        // again), across several sweeps of the map.
        let mut ids = BoundedIds::default();
        let (mut order, mut set) = (VecDeque::new(), rustc_hash::FxHashSet::default());
        let (mut x, mut sweeps) = (0x9e37_79b9_7f4a_7c15u64, 0);
        for _ in 0..20 * TOMBSTONES_MAX {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let id = x % (2 * TOMBSTONES_MAX as u64);
            let fresh = set.insert(id);
            if fresh {
                order.push_back(id);
                if order.len() > TOMBSTONES_MAX {
                    set.remove(&order.pop_front().unwrap());
                }
            }
            let len = ids.numbers.len();
            assert_eq!(ids.insert(id), fresh, "insert {id}");
            if ids.numbers.len() < len {
                // A sweep keeps exactly the remembered ones.
                sweeps += 1;
                assert_eq!(ids.numbers.len(), order.len());
                assert!(order.iter().all(|&id| ids.contains(id)));
            }
            let probe = (x >> 20) % (2 * TOMBSTONES_MAX as u64);
            assert_eq!(
                ids.contains(probe),
                set.contains(&probe),
                "contains {probe}"
            );
        }
        assert!(ids.numbers.len() <= TOMBSTONES_MAX + TOMBSTONES_MAX / 2);
        assert!(sweeps > 3, "{sweeps} sweeps");
    }

    #[test]
    fn a_runtime_id_shared_keeps_its_slots_in_order() {
        let mut ix = RuntimeIndex::default();
        ix.insert(7, 1);
        assert_eq!(ix.slots(7), &[1]);
        ix.insert(7, 4);
        ix.insert(7, 2);
        assert_eq!(ix.slots(7), &[1, 4, 2]);
        ix.remove(7, 4);
        assert_eq!(ix.slots(7), &[1, 2]);
        ix.remove(7, 9); // not there: nothing changes
        ix.remove(7, 1);
        ix.remove(7, 2);
        assert!(ix.slots(7).is_empty());
        ix.insert(7, 3);
        ix.remove(7, 5);
        assert_eq!(ix.slots(7), &[3], "another slot's removal leaves it");
    }
}

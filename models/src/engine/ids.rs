//! Runtime ids: the slots each live one names (a request-scope abort finds its requests
//! there), and how many terminated ones an engine remembers.

use std::collections::hash_map::Entry as MapEntry;

use rustc_hash::FxHashMap;

/// Terminated runtime ids remembered at most per engine (the runtime's tombstone retention). A late
/// abort comes seconds after its request ended; at a few hundred requests per second per replica
/// this covers many minutes, and memory stays bounded however long the run.
pub const TOMBSTONES_MAX: usize = 1 << 13;

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
    use super::*;

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

//! Clear barriers: one per playback sink. A clear operation advances a barrier's epoch and makes
//! it not clear until its acknowledgement; an admission captured at one epoch is blocked if the
//! epoch moved during its wait.

use rustc_hash::FxHashMap;

/// Which clear barrier an admission waits on. `REFERENCE` is the contract's single barrier; the
/// simulator gives each owner (conversation) a sink of its own with `BarrierId::of_owner`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BarrierId(u64);

impl BarrierId {
    /// The reference's one barrier, as `barrier_advance` and `set_clear` use it.
    pub const REFERENCE: BarrierId = BarrierId(0);

    /// The barrier of owner `owner`'s playback sink. Distinct from `REFERENCE` for every owner.
    pub fn of_owner(owner: u64) -> BarrierId {
        debug_assert!(owner < u64::MAX, "owner ids stop below u64::MAX");
        BarrierId(owner + 1)
    }
}

/// `(epoch, clear)` of every barrier; a barrier not yet used is at epoch 0 and clear.
#[derive(Debug)]
pub(super) struct Barriers {
    reference: (u64, bool),
    /// The others, created on first use and dropped when their sink is gone.
    sinks: FxHashMap<BarrierId, (u64, bool)>,
}

impl Default for Barriers {
    fn default() -> Self {
        Barriers {
            reference: (0, true),
            sinks: FxHashMap::default(),
        }
    }
}

impl Barriers {
    pub(super) fn state(&self, b: BarrierId) -> (u64, bool) {
        if b == BarrierId::REFERENCE {
            self.reference
        } else {
            self.sinks.get(&b).copied().unwrap_or((0, true))
        }
    }

    fn entry(&mut self, b: BarrierId) -> &mut (u64, bool) {
        if b == BarrierId::REFERENCE {
            &mut self.reference
        } else {
            self.sinks.entry(b).or_insert((0, true))
        }
    }

    /// A new clear operation: the epoch goes up by one. Returns the new epoch.
    pub(super) fn advance(&mut self, b: BarrierId) -> u64 {
        let e = self.entry(b);
        e.0 += 1;
        e.0
    }

    pub(super) fn set_clear(&mut self, b: BarrierId, clear: bool) {
        self.entry(b).1 = clear;
    }

    /// Forget a sink's barrier (its owner is gone). The reference barrier is never dropped.
    pub(super) fn drop_sink(&mut self, b: BarrierId) {
        if b != BarrierId::REFERENCE {
            self.sinks.remove(&b);
        }
    }
}

//! Tombstone retention: how long terminal records stay to answer late evidence, and which
//! identities are remembered after their records are evicted.

use std::collections::VecDeque;
use std::hash::Hash;

use crate::recent::Recent;

/// How long terminal records stay to answer late evidence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retention {
    /// Terminal records kept at most; the oldest terminal record is evicted beyond it.
    pub tombstones_max: usize,
    /// Terminal records older than this (from their terminal transition, by the times passed to
    /// `expire_tombstones`) are evicted. `None`: no age bound.
    pub tombstone_age_ns_max: Option<u64>,
    /// Evicted identities remembered at most (oldest forgotten first). Within the bound, late
    /// evidence is classified `late` and a reused identity is refused; beyond it, the identity
    /// is forgotten altogether. Callers whose identities are unique by construction can keep it
    /// small; the reference's behaviour needs it unbounded.
    pub evicted_max: usize,
    /// A terminal record joins the tombstones when the caller retires it (`Owners::retire`),
    /// not at its terminal transition: for a caller that still needs the record after the
    /// request is terminal, until nothing can refer to it any more. Memory then follows the
    /// records not yet retired, plus the tombstones.
    pub until_retired: bool,
}

impl Retention {
    /// Keep every terminal record (the reference's behaviour). Use for bounded inputs only.
    pub const UNBOUNDED: Retention = Retention {
        tombstones_max: usize::MAX,
        tombstone_age_ns_max: None,
        evicted_max: usize::MAX,
        until_retired: false,
    };
}

impl Default for Retention {
    fn default() -> Self {
        Retention {
            tombstones_max: 1 << 20,
            tombstone_age_ns_max: None,
            evicted_max: 1 << 22,
            until_retired: false,
        }
    }
}

/// Terminal records in the order of their terminal transition, and the identities evicted so far.
#[derive(Debug)]
pub(super) struct Tombstones<K> {
    pub(super) retention: Retention,
    /// Terminal records with the retention clock at their transition.
    order: VecDeque<(K, u64)>,
    /// Identities whose records were evicted, the last `evicted_max` of them. Only the identity
    /// is kept, so it is never reused and late evidence for it is recognised.
    evicted: Recent<K>,
    pub(super) evictions: u64,
    pub(super) clock_ns: u64,
}

impl<K: Clone + Eq + Hash> Tombstones<K> {
    pub(super) fn new(retention: Retention) -> Self {
        assert!(
            retention.tombstones_max > 0,
            "retention must keep at least one tombstone"
        );
        Tombstones {
            retention,
            order: VecDeque::new(),
            evicted: Recent::new(retention.evicted_max),
            evictions: 0,
            clock_ns: 0,
        }
    }

    pub(super) fn len(&self) -> usize {
        self.order.len()
    }

    pub(super) fn is_evicted(&self, id: &K) -> bool {
        self.evicted.contains(id)
    }

    /// `id` became terminal now. Returns the identities whose records must go (count bound).
    pub(super) fn push(&mut self, id: K, evict: &mut impl FnMut(K)) {
        self.order.push_back((id, self.clock_ns));
        while self.order.len() > self.retention.tombstones_max {
            self.evict_oldest(evict);
        }
    }

    /// Advance the clock and evict records older than the age bound. Returns how many went.
    pub(super) fn expire(&mut self, now_ns: u64, evict: &mut impl FnMut(K)) -> u64 {
        assert!(now_ns >= self.clock_ns, "retention clock went backwards");
        self.clock_ns = now_ns;
        let Some(age_max) = self.retention.tombstone_age_ns_max else {
            return 0;
        };
        let before = self.evictions;
        while let Some((_, at)) = self.order.front() {
            if now_ns - at <= age_max {
                break;
            }
            self.evict_oldest(evict);
        }
        self.evictions - before
    }

    fn evict_oldest(&mut self, evict: &mut impl FnMut(K)) {
        let (id, _) = self.order.pop_front().expect("a tombstone to evict");
        let fresh = self.evicted.insert(id.clone());
        debug_assert!(fresh, "an identity remembered is never reused");
        self.evictions += 1;
        evict(id);
    }
}

//! The replicas' loads as the router reads them, and the least loaded of a range of them.
//!
//! A least-loaded router reads every replica's load per arrival: a thousand replicas were a
//! thousand reads and compares a request, 8 % of a fleet's run. The loads change far less
//! often than that matters: so a tournament tree keeps, at each node, the least
//! `(load, replica)` beneath it, and a range's least is found in O(log n) nodes. The least
//! `(load, replica)`, so ties go to the lowest numbered replica, as a scan in order gives.
//! A few replicas are read faster than a tree is kept: below `TREE_FROM`, a scan.

use std::ops::Range;

/// A leaf past the last replica: never the least of a range that holds a replica.
const NONE: (u64, u32) = (u64::MAX, u32::MAX);

/// Replicas from which a tree is kept. Of 16 replicas, keeping one cost 1 % more instructions
/// than scanning; of 1,000, scanning cost 9 % more (docs/performance.md).
const TREE_FROM: usize = 64;

pub(super) struct Loads {
    /// Each replica's load, as of the last `set`.
    by_replica: Vec<u64>,
    /// The tree, its root at 1 and the leaves from `leaves` on: node `i` holds the least
    /// `(load, replica)` of nodes `2i` and `2i + 1`. Empty below `TREE_FROM` replicas.
    tree: Vec<(u64, u32)>,
    leaves: usize,
}

impl Loads {
    pub fn new(loads: impl Iterator<Item = u64>) -> Loads {
        let by_replica: Vec<u64> = loads.collect();
        assert!(by_replica.len() < u32::MAX as usize, "replicas fit a u32");
        let leaves = by_replica.len().next_power_of_two();
        if by_replica.len() < TREE_FROM {
            return Loads {
                by_replica,
                tree: Vec::new(),
                leaves,
            };
        }
        let mut tree = vec![NONE; 2 * leaves];
        for (r, &load) in by_replica.iter().enumerate() {
            tree[leaves + r] = (load, r as u32);
        }
        for i in (1..leaves).rev() {
            tree[i] = tree[2 * i].min(tree[2 * i + 1]);
        }
        Loads {
            by_replica,
            tree,
            leaves,
        }
    }

    pub fn as_slice(&self) -> &[u64] {
        &self.by_replica
    }

    pub fn get(&self, replica: u32) -> u64 {
        self.by_replica[replica as usize]
    }

    /// `replica`'s load is `load` now.
    #[inline]
    pub fn set(&mut self, replica: u32, load: u64) {
        let r = replica as usize;
        if self.by_replica[r] == load {
            return;
        }
        self.by_replica[r] = load;
        if self.tree.is_empty() {
            return;
        }
        let mut i = self.leaves + r;
        self.tree[i] = (load, replica);
        while i > 1 {
            i /= 2;
            let least = self.tree[2 * i].min(self.tree[2 * i + 1]);
            if self.tree[i] == least {
                break; // and so every node above
            }
            self.tree[i] = least;
        }
    }

    /// The replica of least load in `range`, the lowest numbered of those; `None` for an
    /// empty range. The nodes that cover the range exactly, from both ends inwards.
    pub fn least(&self, range: Range<u32>) -> Option<u32> {
        assert!(
            range.end as usize <= self.by_replica.len(),
            "replicas {range:?}"
        );
        if self.tree.is_empty() {
            return self.least_by_scan(range);
        }
        let (mut lo, mut hi) = (
            self.leaves + range.start as usize,
            self.leaves + range.end as usize,
        );
        let mut least = NONE;
        while lo < hi {
            if lo % 2 == 1 {
                least = least.min(self.tree[lo]);
                lo += 1;
            }
            if hi % 2 == 1 {
                hi -= 1;
                least = least.min(self.tree[hi]);
            }
            (lo, hi) = (lo / 2, hi / 2);
        }
        let found = (least != NONE).then_some(least.1);
        debug_assert_eq!(found, self.least_by_scan(range));
        found
    }

    /// `least`, by reading every load in the range.
    pub fn least_by_scan(&self, range: Range<u32>) -> Option<u32> {
        least_loaded(&self.by_replica, range)
    }
}

/// The candidate of least load, the lowest numbered of those: the least `(load, replica)`;
/// `None` if there is no candidate. A thousand replicas are a thousand reads of one array and a
/// compare each.
pub(super) fn least_loaded(loads: &[u64], candidates: impl Iterator<Item = u32>) -> Option<u32> {
    let mut least: Option<(u64, u32)> = None;
    for r in candidates {
        let l = loads[r as usize];
        if least.is_none_or(|m| (l, r) < m) {
            least = Some((l, r));
        }
    }
    least.map(|(_, r)| r)
}

#[cfg(test)]
mod tests {
    use super::Loads;
    use proptest::prelude::*;

    proptest! {
        /// After any loads are set, each range's least is the scan's.
        #[test]
        fn the_least_of_a_range_is_the_scans(
            initial in prop::collection::vec(0u64..6, 1..300),
            sets in prop::collection::vec((0usize..300, 0u64..6), 0..400),
            ranges in prop::collection::vec((0usize..301, 0usize..301), 1..40),
        ) {
            let n = initial.len();
            let mut loads = Loads::new(initial.into_iter());
            for (r, load) in sets {
                loads.set((r % n) as u32, load);
            }
            for (a, b) in ranges {
                let (a, b) = ((a % (n + 1)) as u32, (b % (n + 1)) as u32);
                let range = a.min(b)..a.max(b);
                prop_assert_eq!(loads.least(range.clone()), loads.least_by_scan(range));
            }
        }
    }
}

//! The cached run of the waiting front: how many of its leading blocks the prefix cache holds,
//! and how many of those no request holds (taking them back needs a free block each).
//!
//! The front that cannot be admitted is looked at again at every step. Scanning its run each time
//! cost O(blocks held) per step: a preempted 300k-token request re-read its 18,750 cached blocks
//! every step, and three such took 16 s where no caching took 0.05 s. So the run is remembered,
//! and at each look only the keys the cache journaled as changed since (evicted, cached, taken or
//! let go) are looked at again: O(blocks changed) per step. A look at the front of another request
//! (or incarnation) scans it once.

use rustc_hash::FxHashMap;

use super::Engine;

/// The front's run, as of the last look.
#[derive(Default)]
pub(super) struct RunMemo {
    /// Whose run: its serial and incarnation.
    owner: Option<(u64, u32)>,
    /// Each key looked at, by block index: the run and its first miss.
    index: FxHashMap<u64, u64>,
    /// Whether each block of the run is free in the pool (no holder); its length is the run's.
    free: Vec<bool>,
    taking: u64,
    changes: Vec<u64>,
    /// Looks at this owner's run so far.
    looks: u64,
}

impl Engine {
    /// The cached run of the waiting request in `slot`: leading blocks cached, short of its last
    /// prompt token (one token is always computed, to sample from), and how many of them are
    /// free. The same answer as a scan, in O(blocks changed) when `slot` was the front already.
    pub(super) fn cached_run(&mut self, slot: u32) -> (u64, u64) {
        let Some(cache) = self.pool.cache() else {
            return (0, 0);
        };
        let seq = &self.seqs[slot as usize];
        let bt = self.cfg.block_tokens as u64;
        let max = (seq.need as u64 - 1) / bt;
        let m = &mut self.run_memo;
        let owner = Some((seq.serial, seq.incarnation));
        let journaled = cache.take_changes(&mut m.changes).is_some();
        if m.owner != owner || !journaled {
            *m = RunMemo {
                owner,
                changes: std::mem::take(&mut m.changes),
                ..RunMemo::default()
            };
            cache.watch(true);
        }
        // Every block looked at whose key changed: gone (the run ends before it), or taken or
        // let go (its freeness). Then the run goes on from its end, where a key may have come.
        // Lookups: each change, and each block the run is extended by (and its first miss).
        let mut lookups = m.changes.len() as u64;
        for &key in &m.changes {
            let Some(&i) = m.index.get(&key) else {
                continue;
            };
            if i as usize >= m.free.len() {
                continue;
            }
            if !cache.contains(key) {
                let cut = m.free.drain(i as usize..).filter(|&f| f).count() as u64;
                m.taking -= cut;
            } else if cache.is_free(key) != m.free[i as usize] {
                m.free[i as usize] = !m.free[i as usize];
                m.taking = if m.free[i as usize] {
                    m.taking + 1
                } else {
                    m.taking - 1
                };
            }
        }
        while (m.free.len() as u64) < max {
            let i = m.free.len() as u64;
            lookups += 1;
            let key = seq.content.key(bt, i);
            m.index.insert(key, i);
            if !cache.contains(key) {
                break;
            }
            let free = cache.is_free(key);
            m.free.push(free);
            m.taking += free as u64;
        }
        m.looks += 1;
        let found = (m.free.len() as u64, m.taking);
        // The memo is checked against a scan at an owner's first looks, then ever more rarely
        // (the 2^k-th), so that the check does not cost what the memo saves.
        let check = m.looks <= 8 || m.looks.is_power_of_two();
        debug_assert!(!check || found == scan(cache, &seq.content, bt, max));
        self.stats.prefix_lookups += lookups;
        found
    }

    /// No request waits: the front's run is forgotten, and the cache stops journaling.
    /// Whether a run is remembered: `forget_run` would forget it.
    pub(super) fn run_remembered(&self) -> bool {
        self.run_memo.owner.is_some()
    }

    pub(super) fn forget_run(&mut self) {
        if let Some(cache) = self.pool.cache() {
            if self.run_memo.owner.is_some() {
                cache.watch(false);
                self.run_memo.owner = None;
            }
        }
    }
}

/// The cached run by a scan of every block: what `cached_run` must answer.
fn scan(
    cache: &crate::prefix::PrefixCache,
    c: &crate::prefix::Content,
    bt: u64,
    max: u64,
) -> (u64, u64) {
    let (mut hit, mut taking) = (0, 0);
    while hit < max && cache.contains(c.key(bt, hit)) {
        taking += cache.is_free(c.key(bt, hit)) as u64;
        hit += 1;
    }
    (hit, taking)
}

//! Prefix caching (vLLM V1's automatic prefix caching), over the count-based KV pool.
//!
//! A full block of computed tokens is known by a content hash. While a request holds it, the
//! block is referenced; when no request does, it stays in the pool's free blocks with its
//! content, evictable, oldest first. A request admitted later finds the longest run of its
//! leading blocks still cached and skips computing them: a preempted request's recompute finds
//! its own blocks, and requests that share a prompt prefix (a trace's block hashes) find each
//! other's.
//!
//! The pool stays the one count of physical blocks: a cached block with no reference is free
//! there, and taking it back (a hit) allocates it again. Allocation takes blocks with no content
//! first and evicts cached ones only when those run out, oldest first.

use std::collections::hash_map::Entry;
use std::collections::VecDeque;

use rustc_hash::FxHashMap;

use crate::kv::KvPool;

/// Where a request's content comes from: its own tokens, unique to it (`own`), and a shared
/// prompt prefix given as chained block ids (an id stands for all the tokens before it, as
/// Mooncake's `hash_ids` do), one per `shared_tokens` tokens.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Content {
    pub own: u64,
    /// The prompt's length: a block past it holds output tokens, the request's own.
    pub prompt_tokens: u64,
    /// What it shares with other requests, boxed: most share nothing, and an engine keeps a
    /// `Content` for every request waiting there (24 bytes, not 48).
    pub sharing: Option<Box<Sharing>>,
}

/// The shared part of a request's content.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Sharing {
    /// The trace's block ids it shares (`ids`), one per `shared_tokens` tokens.
    ids: Box<[u64]>,
    /// Each id as a block's key starts from it (`mix` of the shared namespace and the id),
    /// worked out once here, not at every key: a long prompt's blocks are keyed thousands of
    /// times in its life (cached, looked up, released), and a key is then one finaliser, not
    /// two in a row (a tenth of a prefix-caching run's time).
    id_keys: Box<[u64]>,
    pub shared_tokens: u64,
    /// A conversation's token stream that the request continues (its history), if any.
    pub stream: Option<StreamKey>,
}

/// A conversation's tokens as one append-only stream: turn `t`'s prompt is the history (every
/// earlier turn's prompt and the output its user saw) and a new message. A block is known by the
/// stream, its index, and the turn that wrote its last token, so a turn finds the blocks earlier
/// turns computed, and never a block whose tokens an earlier turn had differently (output the
/// user never saw, cut by a barge-in).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StreamKey {
    pub id: u64,
    /// `bounds[k]`: the history's length when turn `k + 1` started, never decreasing; one per
    /// earlier turn. Shared by the turn's requests.
    pub bounds: std::sync::Arc<[u64]>,
    /// The request carries the stream on past its history (the turn's first request, whose
    /// output the next turn's history holds); the others' own tokens are their own.
    pub whole: bool,
}

impl Sharing {
    pub fn new(ids: &[u64], shared_tokens: u64, stream: Option<StreamKey>) -> Sharing {
        let mut s = Sharing {
            shared_tokens,
            stream,
            ..Sharing::default()
        };
        s.set_ids(ids);
        s
    }

    /// The trace's block ids it shares.
    pub fn ids(&self) -> &[u64] {
        &self.ids
    }

    pub fn set_ids(&mut self, ids: &[u64]) {
        self.ids = ids.into();
        self.id_keys = ids.iter().map(|&id| mix(SHARED_NAMESPACE, id)).collect();
    }
}

/// What a block key in a trace's shared prefix, or in a request's own tokens, starts from.
const SHARED_NAMESPACE: u64 = 0x5348_4152;
const OWN_NAMESPACE: u64 = 0x4f57_4e00;

impl StreamKey {
    fn in_stream(&self, end: u64) -> bool {
        self.whole || end <= self.bounds.last().copied().unwrap_or(0)
    }

    /// The key of the block of `block_tokens` ending at token `end`, if it lies in the stream.
    fn key(&self, block_tokens: u64, end: u64) -> Option<u64> {
        if !self.in_stream(end) {
            return None;
        }
        let turn = self.bounds.partition_point(|&h| h < end) as u64;
        let index = end / block_tokens - 1;
        Some(mix(mix(mix(0x5354_524d, self.id), turn), index))
    }
}

impl Content {
    /// Whether block `index` lies in the shared prefix: another request may ask for it.
    /// It may share some block with another request (no block of one that does not is shared).
    #[inline]
    pub fn may_share(&self) -> bool {
        self.sharing.is_some()
    }

    pub fn is_shared(&self, block_tokens: u64, index: u64) -> bool {
        let Some(sh) = self.sharing.as_deref() else {
            return false;
        };
        let end = (index + 1) * block_tokens;
        if sh.stream.as_ref().is_some_and(|s| s.in_stream(end)) {
            return true;
        }
        end <= self.prompt_tokens && (end - 1) / sh.shared_tokens.max(1) < sh.ids.len() as u64
    }

    /// Its shared part, made empty if it had none.
    pub fn sharing_mut(&mut self) -> &mut Sharing {
        self.sharing.get_or_insert_with(Box::default)
    }

    /// The content key of block `index` of `block_tokens` tokens.
    pub fn key(&self, block_tokens: u64, index: u64) -> u64 {
        let end = (index + 1) * block_tokens;
        let sh = self.sharing.as_deref();
        if let Some(key) = sh
            .and_then(|sh| sh.stream.as_ref())
            .and_then(|s| s.key(block_tokens, end))
        {
            return key;
        }
        let id_key = sh.and_then(|sh| {
            sh.id_keys
                .get(((end - 1) / sh.shared_tokens.max(1)) as usize)
        });
        match id_key {
            Some(&k) if end <= self.prompt_tokens => mix(k, index),
            _ => mix(mix(OWN_NAMESPACE, self.own), index),
        }
    }
}

/// SplitMix64's finaliser over a combination: a fixed, portable hash.
fn mix(a: u64, b: u64) -> u64 {
    let mut z = a ^ b.wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(17);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[derive(Clone, Copy, Debug)]
struct Cached {
    refs: u32,
    /// Its place in the eviction order while `refs` is 0: the `Lru` entry with this stamp.
    /// 32 bits, so that an entry of the map is 16 bytes, not 24: the map is larger than a
    /// core's cache on a long trace, and its lookups are most of a prefix-caching run's time
    /// (a third less memory was 0.86 of the time on the Mooncake trace).
    stamp: u32,
}

/// Cached blocks no request holds, oldest first, as `(stamp, key)` in a ring: a block freed
/// goes to the back with the next stamp, so the ring is in stamp order, and eviction takes the
/// front. A block taken back (a hit) leaves its entry behind, stale: an entry is live while its
/// block is cached, unheld and still has its stamp (a block freed again gets a new one). Stale
/// entries are skipped at the front and swept out once they outnumber the live ones. Stamps are
/// 32 bits: when they run out, the live entries are stamped again from 0 in their order.
///
/// Why not an ordered map by stamp: every free and every hit of a block then walked a tree, a
/// third of the instructions of a prefix-caching run (Mooncake's trace frees 9 M blocks).
/// The live entries, so the eviction order, are the same.
#[derive(Default)]
struct Lru {
    ring: VecDeque<(u32, u64)>,
    /// Live entries.
    live: u64,
    stamp_next: u32,
}

/// Stale entries a ring may hold beyond its live ones before a hit sweeps it. Only a hit makes
/// an entry stale, so the stale entries are at most the live ones at the last hit and this,
/// and the ring at most twice the pool's blocks and this; a sweep costs one pass per that many
/// hits.
const LRU_STALE_SLACK: u64 = 64;

impl Lru {
    fn is_live(blocks: &FxHashMap<u64, Cached>, (stamp, key): (u32, u64)) -> bool {
        blocks
            .get(&key)
            .is_some_and(|c| c.refs == 0 && c.stamp == stamp)
    }

    /// `key`'s block was freed: it goes to the back. Its stamp.
    fn push(&mut self, key: u64) -> u32 {
        let stamp = self.stamp_next;
        assert!(stamp < u32::MAX, "stamps run out: renumber first");
        debug_assert!(self.ring.back().is_none_or(|&(s, _)| s < stamp));
        self.stamp_next += 1;
        self.ring.push_back((stamp, key));
        self.live += 1;
        stamp
    }

    /// Stamp the live entries again from 0, in their order, if the stamps have run out (once in
    /// four billion frees): the order stays, and no stale entry is left to match a new stamp.
    fn renumber_if_out(&mut self, blocks: &mut FxHashMap<u64, Cached>) {
        if self.stamp_next < u32::MAX {
            return;
        }
        self.ring.retain(|&e| Self::is_live(blocks, e));
        assert_eq!(self.ring.len() as u64, self.live, "live entries lost");
        assert!(
            self.live < u32::MAX as u64,
            "more free cached blocks than stamps"
        );
        for (stamp, (s, key)) in (0..).zip(self.ring.iter_mut()) {
            *s = stamp;
            blocks.get_mut(key).expect("a live entry's block").stamp = stamp;
        }
        self.stamp_next = self.live as u32;
    }

    /// A live entry went stale (its block was taken back).
    fn stale(&mut self, blocks: &FxHashMap<u64, Cached>) {
        assert!(self.live > 0, "a stale entry with no live one");
        self.live -= 1;
        if self.ring.len() as u64 > 2 * self.live + LRU_STALE_SLACK {
            self.ring.retain(|&e| Self::is_live(blocks, e));
            assert_eq!(self.ring.len() as u64, self.live, "live entries lost");
        }
    }

    /// The key of the oldest live entry, its entry gone.
    fn pop_oldest(&mut self, blocks: &FxHashMap<u64, Cached>) -> Option<u64> {
        while let Some(e) = self.ring.pop_front() {
            if Self::is_live(blocks, e) {
                self.live -= 1;
                return Some(e.1);
            }
        }
        None
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrefixStats {
    /// Prompt tokens looked up at admission, and those found cached.
    pub query_tokens: u64,
    pub hit_tokens: u64,
    pub evictions: u64,
}

#[derive(Default)]
pub struct PrefixCache {
    blocks: FxHashMap<u64, Cached>,
    /// Cached blocks no request holds, oldest first: free in the pool, evictable.
    lru: Lru,
    pub stats: PrefixStats,
    /// While watched, every key whose presence or freeness changed, in order: what a reader of
    /// an earlier lookup must look at again (the engine's waiting front, `engine::run`).
    changes: Vec<u64>,
    watched: bool,
    /// While published, every block stored (`true`) or evicted (`false`), in order: the events a
    /// KV-aware router builds its view from, as a worker publishes them.
    published: Vec<(u64, bool)>,
    publishing: bool,
}

/// Changes kept for a watcher, at most: past them it looks everything up again.
pub const CHANGES_MAX: usize = 1 << 16;

impl PrefixCache {
    /// Cached blocks free in the pool.
    pub fn evictable(&self) -> u64 {
        self.lru.live
    }

    /// Journal the keys that change from now on (`take_changes`), or stop.
    pub fn watch(&mut self, on: bool) {
        self.watched = on;
        if !on {
            self.changes.clear();
        }
    }

    /// The keys whose presence or freeness changed since the last call, in order; `None` if
    /// more than `CHANGES_MAX` did (look everything up again).
    pub fn take_changes(&mut self, into: &mut Vec<u64>) -> Option<()> {
        into.clear();
        let overflow = self.changes.len() > CHANGES_MAX;
        std::mem::swap(into, &mut self.changes);
        (!overflow).then_some(())
    }

    /// Publish the blocks stored and evicted from now on (`take_published`).
    pub fn publish(&mut self) {
        self.publishing = true;
    }

    /// The blocks stored (`true`) and evicted (`false`) since the last call, oldest first.
    pub fn take_published(&mut self, into: &mut Vec<(u64, bool)>) {
        into.append(&mut self.published);
    }

    fn changed(&mut self, key: u64) {
        if self.watched && self.changes.len() <= CHANGES_MAX {
            self.changes.push(key);
        }
    }

    pub fn contains(&self, key: u64) -> bool {
        self.blocks.contains_key(&key)
    }

    /// Whether taking `key` back needs a free block (no request holds it now).
    pub fn is_free(&self, key: u64) -> bool {
        self.blocks.get(&key).is_some_and(|c| c.refs == 0)
    }

    /// Take `n` blocks from the pool for new content: blocks without content first, then the
    /// oldest cached ones. False, and nothing taken, if the pool has fewer than `n` free.
    pub fn alloc(&mut self, kv: &mut KvPool, n: u64) -> bool {
        if kv.free_blocks() < n {
            return false;
        }
        let clean = kv.free_blocks() - self.evictable();
        for _ in clean..n {
            let key = self
                .lru
                .pop_oldest(&self.blocks)
                .expect("an evictable block");
            self.blocks.remove(&key);
            self.stats.evictions += 1;
            self.changed(key);
            if self.publishing {
                self.published.push((key, false));
            }
        }
        let ok = kv.try_alloc(n);
        debug_assert!(ok);
        ok
    }

    /// Reference the cached block `key` for a request (a hit). Its block leaves the free pool
    /// if no one held it.
    pub fn hit(&mut self, kv: &mut KvPool, key: u64) {
        let c = self.blocks.get_mut(&key).expect("a cached block");
        c.refs += 1;
        if c.refs == 1 {
            self.lru.stale(&self.blocks);
            let ok = kv.try_alloc(1);
            assert!(ok, "an evictable block is free in the pool");
            self.changed(key);
        }
    }

    /// A request computed block `key` in a block it holds: cache it, referenced once. False if
    /// that content is cached already (the request's block then stays its own).
    pub fn register(&mut self, key: u64) -> bool {
        match self.blocks.entry(key) {
            Entry::Occupied(_) => return false,
            Entry::Vacant(v) => v.insert(Cached { refs: 1, stamp: 0 }),
        };
        self.changed(key);
        if self.publishing {
            self.published.push((key, true));
        }
        true
    }

    /// A request lets go of cached block `key`: with no holder left, the block goes back to the
    /// free pool, content kept, youngest in the eviction order.
    pub fn release(&mut self, kv: &mut KvPool, key: u64) {
        self.lru.renumber_if_out(&mut self.blocks);
        let c = self.blocks.get_mut(&key).expect("a cached block held");
        assert!(c.refs > 0, "releasing a cached block nobody holds");
        c.refs -= 1;
        if c.refs == 0 {
            c.stamp = self.lru.push(key);
            kv.free(1);
            self.changed(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_turn_finds_the_blocks_of_the_history_and_only_those() {
        let turn = |bounds: &[u64], whole: bool, own: u64, prompt: u64| Content {
            own,
            prompt_tokens: prompt,
            sharing: Some(Box::new(Sharing {
                stream: Some(StreamKey {
                    id: 7,
                    bounds: bounds.into(),
                    whole,
                }),
                ..Sharing::default()
            })),
        };
        // Turn 0: a 40-token prompt and output; the user saw 30 tokens of output, so turn 1's
        // history is 70 tokens: blocks 0..4 of 16 (end 64) are history, block 4 (64..80) is not.
        let t0 = turn(&[], true, 1, 40);
        let t1 = turn(&[70], true, 2, 90);
        for i in 0..4 {
            assert_eq!(t0.key(16, i), t1.key(16, i), "history block {i}");
            assert!(t0.is_shared(16, i) && t1.is_shared(16, i));
        }
        assert_ne!(
            t0.key(16, 4),
            t1.key(16, 4),
            "turn 0 had other tokens past 70"
        );
        // Turn 1's own message and output are the stream's too, for turn 2 to find.
        let t2 = turn(&[70, 150], true, 3, 170);
        for i in 0..9 {
            assert_eq!(t1.key(16, i), t2.key(16, i), "block {i}");
        }
        // A second request of turn 1 shares the history only; past it its tokens are its own.
        let sibling = turn(&[70], false, 4, 90);
        assert_eq!(sibling.key(16, 3), t1.key(16, 3));
        assert_ne!(sibling.key(16, 4), t1.key(16, 4));
        assert!(sibling.is_shared(16, 3) && !sibling.is_shared(16, 4));
        // Another conversation with the same lengths shares nothing.
        let mut other = t1.clone();
        other.sharing_mut().stream = Some(StreamKey {
            id: 8,
            bounds: [70].into(),
            whole: true,
        });
        assert!((0..6).all(|i| other.key(16, i) != t1.key(16, i)));
    }

    #[test]
    fn released_blocks_stay_cached_until_clean_blocks_run_out_then_oldest_go_first() {
        let mut kv = KvPool::new(4, 16);
        let mut c = PrefixCache::default();
        assert!(c.alloc(&mut kv, 2));
        assert!(c.register(10) && c.register(11));
        assert!(!c.register(10), "content cached once");
        c.release(&mut kv, 10);
        c.release(&mut kv, 11);
        assert_eq!((kv.free_blocks(), c.evictable()), (4, 2));
        // Two clean blocks are taken before any cached one.
        assert!(c.alloc(&mut kv, 2));
        assert!(c.contains(10) && c.contains(11));
        // The next takes the oldest cached block (10).
        assert!(c.alloc(&mut kv, 1));
        assert!(!c.contains(10) && c.contains(11));
        assert_eq!(c.stats.evictions, 1);
        // A hit on 11 takes its block back from the free pool.
        assert!(c.is_free(11));
        c.hit(&mut kv, 11);
        assert_eq!((kv.free_blocks(), c.evictable()), (0, 0));
        assert!(!c.alloc(&mut kv, 1));
        // A second holder shares it without a new block.
        c.hit(&mut kv, 11);
        c.release(&mut kv, 11);
        assert_eq!(kv.free_blocks(), 0);
        c.release(&mut kv, 11);
        assert_eq!((kv.free_blocks(), c.evictable()), (1, 1));
        assert_eq!(kv.allocated_total(), kv.freed_total() + kv.in_use());
    }

    #[test]
    fn when_stamps_run_out_the_free_blocks_are_stamped_again_in_their_order() {
        let mut kv = KvPool::new(8, 16);
        let mut c = PrefixCache::default();
        assert!(c.alloc(&mut kv, 6));
        for key in 1..=6 {
            assert!(c.register(key));
        }
        c.lru.stamp_next = u32::MAX - 2;
        c.release(&mut kv, 1);
        c.release(&mut kv, 2);
        c.hit(&mut kv, 1); // its entry, stamped u32::MAX - 2, goes stale
        assert_eq!(c.lru.stamp_next, u32::MAX);
        c.release(&mut kv, 3); // renumbers: 2 is stamped 0, then 3 takes 1
        assert_eq!((c.lru.stamp_next, c.lru.ring.len()), (2, 2));
        c.release(&mut kv, 1);
        c.release(&mut kv, 4);
        assert_eq!((kv.free_blocks(), c.evictable()), (6, 4));
        // Two clean blocks first, then the free cached blocks in the order they were freed.
        assert!(c.alloc(&mut kv, 2));
        let mut evicted = Vec::new();
        for _ in 0..4 {
            assert!(c.alloc(&mut kv, 1));
            let gone: Vec<u64> = (1..=4)
                .filter(|&k| !c.contains(k) && !evicted.contains(&k))
                .collect();
            evicted.extend(gone);
        }
        assert_eq!(evicted, [2, 3, 1, 4]);
    }

    #[test]
    fn shared_ids_key_the_blocks_inside_the_shared_prefix_only() {
        // 512-token shared blocks [7, 8]; 16-token blocks 0..32 lie in the first, 32..64 in the
        // second, and block 64 on is the request's own.
        let content = |own, shared: &[u64], prompt| Content {
            own,
            prompt_tokens: prompt,
            sharing: Some(Box::new(Sharing::new(shared, 512, None))),
        };
        let k = |own, shared: &[u64], i| content(own, shared, 4096).key(16, i);
        assert_eq!(
            k(1, &[7, 8], 3),
            k(2, &[7, 9], 3),
            "same first shared block"
        );
        assert_ne!(k(1, &[7, 8], 40), k(2, &[7, 9], 40), "different second");
        assert_ne!(
            k(1, &[7, 8], 64),
            k(2, &[7, 8], 64),
            "own tokens past the prefix"
        );
        assert_eq!(k(1, &[], 5), k(1, &[], 5));
        assert_ne!(k(1, &[], 5), k(1, &[], 6));
        // A 24-token block that straddles two shared blocks takes the later one's id.
        assert_eq!(
            content(1, &[7, 8], 4096).key(24, 21),
            content(2, &[3, 8], 4096).key(24, 21)
        );
        // Past the prompt, a block is the request's own even inside the shared ids' span.
        assert_ne!(
            content(1, &[7], 100).key(16, 6),
            content(2, &[7], 100).key(16, 6)
        );
        assert_eq!(
            content(1, &[7], 100).key(16, 5),
            content(2, &[7], 100).key(16, 5)
        );
    }
}

//! The engine's pool: the paged KV blocks, the prefix cache over them, and the counts that
//! follow blocks as they move (blocks retained by requests with a cancel intent, and the most
//! at once; blocks fenced by steps in flight). One owner, so the counts move with the blocks in
//! one place.

use super::seq::Seq;
use super::Engine;
use crate::kv::KvPool;
use crate::prefix::PrefixCache;

/// In C order, the counts a step reads before the cache (`Engine`'s layout).
#[repr(C)]
pub(super) struct Pool {
    kv: KvPool,
    block_tokens: u64,
    /// Blocks held by marked requests, now, and the most at once.
    marked: u64,
    marked_peak: u64,
    /// Sum of the fenced blocks of all requests (blocks on their way back to the pool).
    fenced: u64,
    /// With `prefix_caching`.
    cache: Option<PrefixCache>,
}

impl Pool {
    pub fn new(kv: KvPool, cache: Option<PrefixCache>, block_tokens: u64) -> Pool {
        Pool {
            kv,
            cache,
            block_tokens,
            marked: 0,
            marked_peak: 0,
            fenced: 0,
        }
    }

    pub fn kv(&self) -> &KvPool {
        &self.kv
    }

    pub fn free_blocks(&self) -> u64 {
        self.kv.free_blocks()
    }

    /// Free blocks with no cached content: taking up to these evicts nothing.
    pub fn clean_blocks(&self) -> u64 {
        self.kv.free_blocks() - self.cache.as_ref().map_or(0, |c| c.evictable())
    }

    pub fn blocks_for(&self, tokens: u64) -> u64 {
        self.kv.blocks_for(tokens)
    }

    pub fn has_cache(&self) -> bool {
        self.cache.is_some()
    }

    pub fn cache_contains(&self, key: u64) -> bool {
        self.cache.as_ref().is_some_and(|c| c.contains(key))
    }

    pub fn cache(&mut self) -> Option<&mut PrefixCache> {
        self.cache.as_mut()
    }

    /// Take `blocks` for new content (evicting cached blocks no one holds, oldest first, once
    /// the blocks without content run out), or nothing.
    #[inline]
    pub fn take(&mut self, blocks: u64) -> bool {
        // Most decode tokens need no new block; taking none changes nothing (the pool's peak
        // is kept at every real allocation).
        if blocks == 0 {
            return true;
        }
        match &mut self.cache {
            Some(cache) => cache.alloc(&mut self.kv, blocks),
            None => self.kv.try_alloc(blocks),
        }
    }

    /// A cached block with content `key` is held once less; with no holder left it is free,
    /// content kept.
    pub fn release(&mut self, key: u64) {
        let cache = self
            .cache
            .as_mut()
            .expect("a release needs the prefix cache");
        cache.release(&mut self.kv, key);
    }

    /// A cached block with content `key` is held once more (a prefix hit).
    pub fn hit(&mut self, key: u64) {
        let cache = self.cache.as_mut().expect("a hit needs the prefix cache");
        cache.hit(&mut self.kv, key);
    }

    /// Blocks taken for work outside the engine come back.
    pub fn give_back(&mut self, blocks: u64) {
        self.kv.free(blocks);
    }

    /// Give `blocks` of `seq` back: the leading blocks it holds through the prefix cache
    /// (`cached`, one count per incarnation) go back through the cache, which keeps their
    /// content; the rest go to the pool. The retained count follows if the owner is marked.
    pub fn free(&mut self, seq: &Seq, blocks: u64, cached: &[u32]) {
        let through_cache = match self.cache {
            Some(_) => cached.iter().map(|&n| n as u64).sum(),
            None => 0,
        };
        assert!(
            through_cache <= blocks,
            "more blocks back through the cache than freed"
        );
        if let Some(cache) = self.cache.as_mut() {
            for &n in cached {
                // Tail first, so the tail is evicted first and the prefix survives longest
                // (vLLM frees a request's blocks in reverse for the same reason).
                for i in (0..n as u64).rev() {
                    cache.release(&mut self.kv, seq.content.key(self.block_tokens, i));
                }
            }
        }
        self.kv.free(blocks - through_cache);
        if seq.marked {
            assert!(
                blocks <= self.marked,
                "more retained blocks freed than held"
            );
            self.marked -= blocks;
        }
    }

    /// A sequence's fenced blocks go back to the pool once no step in flight uses them.
    pub fn release_fenced(&mut self, seq: &mut Seq) {
        if seq.inflight == 0 {
            let cached = std::mem::take(&mut seq.fenced_cached);
            self.free(seq, seq.fenced_blocks, &cached);
            self.unfence(seq.fenced_blocks);
            seq.fenced_blocks = 0;
        }
    }

    /// `blocks` more are held by requests with a cancel intent.
    pub fn mark(&mut self, blocks: u64) {
        self.marked += blocks;
        self.marked_peak = self.marked_peak.max(self.marked);
    }

    /// `blocks` more are fenced by steps in flight.
    pub fn fence(&mut self, blocks: u64) {
        self.fenced += blocks;
    }

    /// `blocks` fenced are not any more.
    pub fn unfence(&mut self, blocks: u64) {
        assert!(blocks <= self.fenced, "more blocks unfenced than fenced");
        self.fenced -= blocks;
    }

    pub fn marked(&self) -> u64 {
        self.marked
    }

    pub fn marked_peak(&self) -> u64 {
        self.marked_peak
    }

    pub fn fenced(&self) -> u64 {
        self.fenced
    }
}

impl Engine {
    /// Blocks fenced by steps in flight: back in the pool when those steps end.
    pub(super) fn fenced_pending(&self) -> u64 {
        // The count is kept as blocks move; check it against the requests now and then.
        debug_assert!(
            self.step_next % 64 != 0
                || self.pool.fenced() == self.seqs.iter().map(|s| s.fenced_blocks).sum::<u64>()
        );
        self.pool.fenced()
    }

    /// Take `blocks` from the pool for use outside the engine (a prefill node's blocks kept for
    /// a transfer, a decode node's receive buffer). False, and nothing taken, if they are not
    /// free.
    pub fn pin(&mut self, blocks: u64) -> bool {
        let ok = self.pool.take(blocks);
        if ok {
            self.pinned_blocks += blocks;
        }
        ok
    }

    /// Give back `blocks` taken by `pin`.
    pub fn unpin(&mut self, blocks: u64) {
        assert!(
            blocks <= self.pinned_blocks,
            "unpinning blocks never pinned"
        );
        self.pinned_blocks -= blocks;
        self.pool.give_back(blocks);
    }

    /// `pin` for a prompt kept or received with its leading blocks maybe cached: the longest
    /// leading run of `keys` the cache holds is referenced, so no eviction takes it while the
    /// KV is read or written, and the rest of `blocks` is taken new. Validate, then mutate: the
    /// run's length, or `None` and nothing taken.
    pub fn pin_cached(&mut self, keys: &[u64], blocks: u64) -> Option<u64> {
        let Some(cache) = self.pool.cache() else {
            return self.pin(blocks).then_some(0);
        };
        let run = keys.iter().take_while(|&&k| cache.contains(k)).count() as u64;
        assert!(run <= blocks, "a cached run longer than the blocks kept");
        let free_taken = keys[..run as usize]
            .iter()
            .filter(|&&k| cache.is_free(k))
            .count() as u64;
        if self.pool.free_blocks() < free_taken + (blocks - run) {
            return None;
        }
        // The run first: taking new blocks may evict cached ones no one holds.
        for &k in &keys[..run as usize] {
            self.pool.hit(k);
        }
        let taken = self.pool.take(blocks - run);
        assert!(taken, "the free blocks were counted");
        self.pinned_blocks += blocks;
        Some(run)
    }

    /// Give back `blocks` taken by `pin_cached`: `held`, its cached run, through the cache,
    /// which keeps their content; the rest to the pool.
    pub fn unpin_cached(&mut self, held: &[u64], blocks: u64) {
        assert!(held.len() as u64 <= blocks, "more blocks held than pinned");
        assert!(
            blocks <= self.pinned_blocks,
            "unpinning blocks never pinned"
        );
        // Tail first, as a request frees its blocks: the prefix is evicted last.
        for &k in held.iter().rev() {
            self.pool.release(k);
        }
        self.pinned_blocks -= blocks;
        self.pool.give_back(blocks - held.len() as u64);
    }

    /// Blocks held now by requests with a cancel intent (retained).
    pub fn marked_blocks(&self) -> u64 {
        self.pool.marked()
    }

    pub fn waiting_len(&self) -> usize {
        self.waiting.len() as usize
    }

    pub fn running_len(&self) -> usize {
        self.running.len()
    }

    pub fn stats(&self) -> super::EngineStats {
        super::EngineStats {
            marked_blocks_peak: self.pool.marked_peak(),
            ..self.stats
        }
    }

    pub fn pinned_blocks(&self) -> u64 {
        self.pinned_blocks
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{Handle, NewRequest};

    fn pool(cache: bool) -> Pool {
        Pool::new(KvPool::new(10, 16), cache.then(PrefixCache::default), 16)
    }

    fn seq(marked: bool) -> Seq {
        let r = NewRequest {
            id: 1,
            tag: 0,
            handle: Handle::default(),
            prompt_tokens: 16,
            output_tokens: 1,
            kv_ready: false,
            length_capped: false,
            lazy: false,
        };
        let mut s = Seq::new(&r, 0);
        s.marked = marked;
        s
    }

    #[test]
    fn the_counts_follow_the_blocks() {
        let mut p = pool(false);
        assert!(p.take(4));
        p.mark(4);
        p.mark(2);
        p.free(&seq(true), 4, &[]);
        assert_eq!((p.marked(), p.marked_peak(), p.free_blocks()), (2, 6, 10));
        p.fence(3);
        p.unfence(3);
        assert_eq!(p.fenced(), 0);
        assert!(!p.take(11), "no more than the pool holds");
    }

    #[test]
    #[should_panic(expected = "more retained blocks freed than held")]
    fn retained_blocks_freed_twice() {
        let mut p = pool(false);
        assert!(p.take(2));
        p.mark(1);
        p.free(&seq(true), 2, &[]);
    }

    #[test]
    #[should_panic(expected = "more blocks unfenced than fenced")]
    fn unfenced_more_than_fenced() {
        let mut p = pool(false);
        p.fence(1);
        p.unfence(2);
    }

    #[test]
    #[should_panic(expected = "through the cache than freed")]
    fn more_cached_than_freed() {
        let mut p = pool(true);
        assert!(p.take(1));
        p.free(&seq(false), 1, &[2]);
    }

    #[test]
    #[should_panic(expected = "needs the prefix cache")]
    fn a_hit_without_a_cache() {
        pool(false).hit(7);
    }
}

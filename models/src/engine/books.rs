//! The pool's books: blocks go back to the pool, and the counts that follow them (retained
//! blocks, fenced blocks) move with them in one place.

use super::seq::Seq;
use super::Engine;
use crate::kv::KvPool;
use crate::prefix::PrefixCache;

/// Give `blocks` of `seq` back: the leading blocks it holds through the prefix cache (`cached`,
/// one count per incarnation) go back through the cache, which keeps their content; the rest
/// go to the pool. The retained count follows if the owner is marked.
pub(super) fn free_blocks(b: &mut Books, seq: &Seq, blocks: u64, cached: &[u32]) {
    let mut through_cache = 0;
    if let Some(cache) = b.cache.as_mut() {
        for &n in cached {
            // Tail first, so the tail is evicted first and the prefix survives longest
            // (vLLM frees a request's blocks in reverse for the same reason).
            for i in (0..n as u64).rev() {
                cache.release(b.kv, seq.content.key(b.block_tokens, i));
            }
            through_cache += n as u64;
        }
    }
    debug_assert!(through_cache <= blocks);
    b.kv.free(blocks - through_cache);
    if seq.marked {
        *b.marked_blocks -= blocks;
    }
}

/// The pool and its counters, borrowed field by field so the requests stay borrowable.
macro_rules! books {
    ($e:expr) => {
        Books {
            kv: &mut $e.kv,
            marked_blocks: &mut $e.marked_blocks,
            fenced_total: &mut $e.fenced_total,
            cache: &mut $e.cache,
            block_tokens: $e.cfg.block_tokens as u64,
        }
    };
}

/// The pool and the counters that follow it, borrowed apart from the requests.
pub(super) struct Books<'a> {
    pub kv: &'a mut KvPool,
    pub marked_blocks: &'a mut u64,
    pub fenced_total: &'a mut u64,
    pub cache: &'a mut Option<PrefixCache>,
    pub block_tokens: u64,
}

/// A sequence's fenced blocks go back to the pool once no step in flight uses them.
pub(super) fn release_fenced(mut b: Books, seq: &mut Seq) {
    if seq.inflight == 0 {
        let cached = std::mem::take(&mut seq.fenced_cached);
        free_blocks(&mut b, seq, seq.fenced_blocks, &cached);
        *b.fenced_total -= seq.fenced_blocks;
        seq.fenced_blocks = 0;
    }
}

impl Engine {
    /// Blocks fenced by steps in flight: back in the pool when those steps end.
    pub(super) fn fenced_pending(&self) -> u64 {
        // The count is kept as blocks move; check it against the requests now and then.
        debug_assert!(
            self.step_next % 64 != 0
                || self.fenced_total == self.seqs.iter().map(|s| s.fenced_blocks).sum::<u64>()
        );
        self.fenced_total
    }

    /// Take `blocks` from the pool for use outside the engine (a prefill node's blocks kept for
    /// a transfer, a decode node's receive buffer). False, and nothing taken, if they are not
    /// free.
    pub fn pin(&mut self, blocks: u64) -> bool {
        let ok = self.take_blocks(blocks);
        if ok {
            self.pinned_blocks += blocks;
        }
        ok
    }

    /// Take `blocks` from the pool for new content (evicting cached blocks no one holds, oldest
    /// first, once the blocks without content run out), or nothing.
    pub(super) fn take_blocks(&mut self, blocks: u64) -> bool {
        match &mut self.cache {
            Some(cache) => cache.alloc(&mut self.kv, blocks),
            None => self.kv.try_alloc(blocks),
        }
    }

    /// Give back `blocks` taken by `pin`.
    pub fn unpin(&mut self, blocks: u64) {
        assert!(
            blocks <= self.pinned_blocks,
            "unpinning blocks never pinned"
        );
        self.pinned_blocks -= blocks;
        self.kv.free(blocks);
    }

    /// Blocks held now by requests with a cancel intent (retained).
    pub fn marked_blocks(&self) -> u64 {
        self.marked_blocks
    }

    pub fn waiting_len(&self) -> usize {
        self.waiting.len() as usize
    }

    pub fn running_len(&self) -> usize {
        self.running.len()
    }

    pub fn stats(&self) -> super::EngineStats {
        self.stats
    }

    pub fn pinned_blocks(&self) -> u64 {
        self.pinned_blocks
    }
}

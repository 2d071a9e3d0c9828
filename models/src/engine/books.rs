//! The pool's books: blocks go back to the pool, and the counts that follow them (retained
//! blocks, fenced blocks) move with them in one place.

use super::seq::Seq;
use super::Engine;
use crate::kv::KvPool;

/// Give `blocks` back to the pool; the retained count follows if the owner is marked.
pub(super) fn free_blocks(kv: &mut KvPool, marked_blocks: &mut u64, marked: bool, blocks: u64) {
    kv.free(blocks);
    if marked {
        *marked_blocks -= blocks;
    }
}

/// The pool and its counters, borrowed field by field so the requests stay borrowable.
macro_rules! books {
    ($e:expr) => {
        Books {
            kv: &mut $e.kv,
            marked_blocks: &mut $e.marked_blocks,
            fenced_total: &mut $e.fenced_total,
        }
    };
}

/// The pool and the counters that follow it, borrowed apart from the requests.
pub(super) struct Books<'a> {
    pub kv: &'a mut KvPool,
    pub marked_blocks: &'a mut u64,
    pub fenced_total: &'a mut u64,
}

/// A sequence's fenced blocks go back to the pool once no step in flight uses them.
pub(super) fn release_fenced(b: Books, seq: &mut Seq) {
    if seq.inflight == 0 {
        free_blocks(b.kv, b.marked_blocks, seq.marked, seq.fenced_blocks);
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
        let ok = self.kv.try_alloc(blocks);
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

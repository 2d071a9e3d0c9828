//! The pool's books: blocks go back to the pool, and the counts that follow them (retained
//! blocks, fenced blocks) move with them in one place.

use super::seq::Seq;
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

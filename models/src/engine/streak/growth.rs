//! A member's new blocks at its block boundaries, counted by bucket and given to it when it
//! leaves the streak.
//!
//! Every member of a boundary bucket takes one clean block at each of the bucket's boundaries
//! (`Streak::boundary`). Taking them one member at a time read each member's `Seq` and boxed
//! `Run`, cold, every block's worth of tokens. Instead the pool gives the bucket's blocks in
//! one take, and the bucket sums its boundaries' ticks. A member notes the bucket's sum as it
//! joins (`Run::streak_ticks_ns`, in the box that joining writes anyway); as it leaves
//! (`Engine::eject`) its blocks and their block-time are brought up to date in one go
//! (`Seq::grown`), with the same whole numbers. Its boundaries since it joined are the blocks
//! its context has grown by, and their last tick is the bucket's last.
//!
//! Why it is the same:
//! - One take of n blocks is n takes of one: the pool counts, and the prefix cache, where it
//!   must evict, evicts the same oldest blocks in the same order.
//! - A member is never marked or fenced, and no block is tainted while the streak composes
//!   (`compose_running_any` and `turn_still` see to it), so a member's allocation does
//!   nothing but count.
//! - Nothing reads a member's blocks or block-time before it leaves: whatever does (an abort,
//!   a preemption, a mark, its end) makes it leave first.

use super::super::Engine;

/// One boundary bucket's boundaries so far.
#[derive(Clone, Copy, Debug, Default)]
struct Boundaries {
    /// Σ of their ticks.
    ticks_ns: u128,
    last_ns: u64,
}

/// The boundaries of every bucket.
#[derive(Default)]
pub(super) struct Growth {
    buckets: Vec<Boundaries>,
}

impl Growth {
    /// The Σ of `bucket`'s boundary ticks so far (of `buckets`): a member joining notes it.
    pub(super) fn ticks_ns(&mut self, bucket: usize, buckets: usize) -> u128 {
        if self.buckets.len() < buckets {
            self.buckets.resize(buckets, Boundaries::default());
        }
        self.buckets[bucket].ticks_ns
    }
}

impl Engine {
    /// The members of boundary bucket `bucket` each take a block for this step's token. Most
    /// steps' buckets are empty: that test is inlined where a coast takes its steps, the
    /// taking not.
    #[inline(always)]
    pub(super) fn streak_grow(&mut self, bucket: usize, now_ns: u64) {
        let members = self.streak.boundary_blocks(bucket);
        if members > 0 {
            self.boundary_take(bucket, members, now_ns);
        }
    }

    #[inline(never)]
    fn boundary_take(&mut self, bucket: usize, members: u64, now_ns: u64) {
        assert_eq!(self.taint.blocks(), 0, "a streak step with tainted blocks");
        let taken = self.pool.take(members);
        assert!(taken, "the clean blocks were counted");
        let b = &mut self.streak.growth.buckets[bucket];
        debug_assert!(now_ns >= b.last_ns);
        b.ticks_ns += now_ns as u128;
        b.last_ns = now_ns;
    }

    /// The member in `slot`, of boundary bucket `bucket`, leaves with a context of `ctx`
    /// tokens: the blocks of the bucket's boundaries since it joined, one for each block its
    /// context grew by, are its own, held since each boundary. Returns how many.
    pub(super) fn streak_grown(&mut self, slot: u32, bucket: usize, ctx: u64) -> u64 {
        let now = self.streak.growth.buckets[bucket];
        let seq = &mut self.seqs[slot as usize];
        let boundaries = self
            .pool
            .blocks_for(ctx)
            .checked_sub(seq.blocks)
            .expect("a member holds no block past its context");
        if boundaries > 0 {
            let ticks_ns = now.ticks_ns - seq.streak_ticks_ns;
            seq.grown(boundaries, ticks_ns, now.last_ns);
        } else {
            debug_assert_eq!(
                now.ticks_ns, seq.streak_ticks_ns,
                "a boundary left no block"
            );
        }
        boundaries
    }
}

/// The boundary bucket of a member whose first streak step is `first` with a context of `ctx`
/// tokens then: its streak step `j` reads a context of ctx + (j − first) before its token,
/// which needs a block when that is a whole number of `block_tokens`.
pub(super) fn boundary_bucket(first: u64, ctx: u64, block_tokens: u64) -> usize {
    let bt = block_tokens;
    ((first % bt + bt - ctx % bt) % bt) as usize
}

/// The steps of `from..to` that are ≡ `phase` (mod `every`): a bucket's boundaries over them.
pub(super) fn steps_in_phase(from: u64, to: u64, phase: u64, every: u64) -> u64 {
    let first = from + (phase + every - from % every) % every;
    if first >= to {
        0
    } else {
        (to - 1 - first) / every + 1
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn steps_in_phase_counts_as_a_walk_does() {
        for (from, to, every) in [
            (0, 0, 16),
            (3, 40, 16),
            (17, 18, 16),
            (5, 100, 7),
            (9, 9, 1),
        ] {
            for phase in 0..every {
                let walked = (from..to).filter(|j| j % every == phase).count() as u64;
                assert_eq!(super::steps_in_phase(from, to, phase, every), walked);
            }
        }
    }
}

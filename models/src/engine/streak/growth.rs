//! A member's new blocks at its block boundaries, counted by bucket and given to it when it
//! leaves the streak.
//!
//! Every member of a boundary bucket takes one clean block at each of the bucket's boundaries
//! (`Streak::boundary`). Taking them one member at a time read each member's `Seq` and boxed
//! `Run`, cold, every block's worth of tokens. Instead the pool gives the bucket's blocks in
//! one take, and the bucket counts its boundaries and the sum of their ticks. A member notes
//! the bucket's counts as it joins; as it leaves (`Engine::eject`) its blocks and their
//! block-time are brought up to date in one go (`Seq::grown`), with the same whole numbers.
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
pub(super) struct Boundaries {
    count: u64,
    /// Σ of their ticks.
    ticks_ns: u128,
    last_ns: u64,
}

/// The boundaries of every bucket, and where each member's began.
#[derive(Default)]
pub(super) struct Growth {
    buckets: Vec<Boundaries>,
    /// By bucket, beside `Streak::boundary`'s members in the same order: each one's bucket's
    /// boundaries as it joined. Kept with the members, not by slot, so that its size follows
    /// the members, not the most requests a replica ever held.
    joined: Vec<Vec<Boundaries>>,
}

impl Growth {
    /// A member joins `bucket` (of `buckets`), after those in it: its growth counts from here.
    pub(super) fn join(&mut self, bucket: usize, buckets: usize) {
        if self.buckets.len() < buckets {
            self.buckets.resize(buckets, Boundaries::default());
            self.joined.resize_with(buckets, Vec::new);
        }
        self.joined[bucket].push(self.buckets[bucket]);
    }
}

impl Engine {
    /// The members of boundary bucket `bucket` each take a block for this step's token.
    pub(super) fn streak_grow(&mut self, bucket: usize, now_ns: u64) {
        let members = match self.streak.boundary.get(bucket) {
            Some(slots) if !slots.is_empty() => slots.len() as u64,
            _ => return,
        };
        assert_eq!(self.taint.blocks(), 0, "a streak step with tainted blocks");
        let taken = self.pool.take(members);
        assert!(taken, "the clean blocks were counted");
        let b = &mut self.streak.growth.buckets[bucket];
        debug_assert!(now_ns >= b.last_ns);
        b.count += 1;
        b.ticks_ns += now_ns as u128;
        b.last_ns = now_ns;
    }

    /// The member in `slot`, at `at` in boundary bucket `bucket`, leaves: the blocks of the
    /// bucket's boundaries since it joined are its own, held since each boundary. The caller
    /// takes it out of `Streak::boundary` the same way (`swap_remove(at)`).
    pub(super) fn streak_grown(&mut self, slot: u32, bucket: usize, at: usize) {
        let g = &mut self.streak.growth;
        debug_assert_eq!(g.joined[bucket].len(), self.streak.boundary[bucket].len());
        let (now, then) = (g.buckets[bucket], g.joined[bucket].swap_remove(at));
        let boundaries = now.count - then.count;
        if boundaries > 0 {
            let ticks_ns = now.ticks_ns - then.ticks_ns;
            self.seqs[slot as usize].grown(boundaries, ticks_ns, now.last_ns);
        }
    }
}

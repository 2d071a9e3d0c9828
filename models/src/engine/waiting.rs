//! The waiting queue, with O(1) removal: an aborted request's entry stays where it is, dead,
//! until it reaches the front or the queue is compacted, so an abort never scans the queue.

use std::collections::VecDeque;

use super::seq::{Phase, Seq};

/// Waiting requests in order, as (slot, serial). An entry is alive while its slot holds the
/// request with that serial and the request is waiting; a slot reused by a later request has
/// another serial, so an old entry never stands for it.
#[derive(Default)]
pub(super) struct Waiting {
    queue: VecDeque<(u32, u64)>,
    /// Live entries.
    live: u64,
}

fn alive(seqs: &[Seq], (slot, serial): (u32, u64)) -> bool {
    let seq = &seqs[slot as usize];
    seq.serial == serial && seq.phase == Phase::Waiting
}

/// Dead entries kept at most: twice the live ones, plus this.
const DEAD_SLACK: u64 = 64;

impl Waiting {
    pub fn push_back(&mut self, slot: u32, seqs: &[Seq]) {
        debug_assert_eq!(seqs[slot as usize].phase, Phase::Waiting);
        self.queue.push_back((slot, seqs[slot as usize].serial));
        self.live += 1;
    }

    /// A preempted request goes back to the front.
    pub fn push_front(&mut self, slot: u32, seqs: &[Seq]) {
        debug_assert_eq!(seqs[slot as usize].phase, Phase::Waiting);
        self.queue.push_front((slot, seqs[slot as usize].serial));
        self.live += 1;
    }

    /// The first live request, dead entries dropped on the way.
    pub fn front(&mut self, seqs: &[Seq]) -> Option<u32> {
        while let Some(&entry) = self.queue.front() {
            if alive(seqs, entry) {
                return Some(entry.0);
            }
            self.queue.pop_front();
        }
        None
    }

    /// Remove the front, which `front` returned (it is about to run).
    pub fn pop_front(&mut self) {
        self.queue.pop_front().expect("a waiting request");
        self.live -= 1;
    }

    /// A waiting request left the queue in place (it was aborted): its entry is dead now.
    pub fn left(&mut self) {
        self.live -= 1;
    }

    /// Whether no entry is left, live or dead: `front` would change nothing.
    pub fn is_void(&self) -> bool {
        self.queue.is_empty()
    }

    pub fn len(&self) -> u64 {
        self.live
    }

    /// The live requests, in order.
    pub fn iter<'a>(&'a self, seqs: &'a [Seq]) -> impl Iterator<Item = u32> + 'a {
        self.queue
            .iter()
            .filter(|&&e| seqs[e.0 as usize].serial == e.1)
            .map(|&(slot, _)| slot)
    }

    /// Drop the dead entries once they outnumber the live ones: O(1) per abort, amortised.
    pub fn compact(&mut self, seqs: &[Seq]) {
        if self.queue.len() as u64 > 2 * self.live + DEAD_SLACK {
            self.queue.retain(|&e| alive(seqs, e));
            debug_assert_eq!(self.queue.len() as u64, self.live);
        }
        debug_assert!(self.live <= self.queue.len() as u64);
    }
}

//! The one event queue of a run.
//!
//! Events are totally ordered by `(time_ns, class, seq)`. `seq` is the insertion sequence, so two
//! events at the same tick and class run in the order they were scheduled. The class is a
//! documented priority band at the same tick (see `Class` and ARCHITECTURE.md); it is packed with
//! the sequence into one `u64` so the key is two words, like a bare `(u64, u64)` heap.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

/// Priority band of an event among events of the same tick. Lower runs first.
///
/// Why bands at all: "does a cancel that lands on the tick a step ends see that step's output?"
/// must have one answer, decided here and not by whichever model scheduled first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub enum Class {
    /// Work finishing: a GPU step's output, a service completion. Runs first, so output produced
    /// at tick t exists before anything else at t looks at it.
    Completion = 0,
    /// Control traffic: cancel intents, RPC deliveries, timers.
    Control = 1,
    /// New work entering the system.
    Arrival = 2,
    /// Scheduler passes run last at a tick, so they see every arrival and cancel of that tick.
    Schedule = 3,
}

const CLASS_SHIFT: u32 = 56;
/// Sequence numbers must fit below the class bits.
pub const SEQ_MAX: u64 = (1 << CLASS_SHIFT) - 1;

/// Sort key of a scheduled event. Public so that tests and the run hash can see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Key {
    pub time_ns: u64,
    /// `class << 56 | seq`.
    pub order: u64,
}

impl Key {
    pub fn seq(self) -> u64 {
        self.order & SEQ_MAX
    }
}

struct Entry<E> {
    key: Key,
    event: E,
    /// A weak event does not keep the run alive (see `EventQueue::push_weak`).
    weak: bool,
}

impl<E> PartialEq for Entry<E> {
    fn eq(&self, other: &Self) -> bool {
        self.key == other.key
    }
}
impl<E> Eq for Entry<E> {}
impl<E> PartialOrd for Entry<E> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl<E> Ord for Entry<E> {
    // BinaryHeap is a max-heap; reverse so the smallest key pops first.
    fn cmp(&self, other: &Self) -> Ordering {
        other.key.cmp(&self.key)
    }
}

/// A min-queue of events keyed by `(time_ns, class, seq)`.
pub struct EventQueue<E> {
    heap: BinaryHeap<Entry<E>>,
    seq_next: u64,
    /// Events pending that are not weak.
    strong: usize,
}

impl<E> Default for EventQueue<E> {
    fn default() -> Self {
        Self::new()
    }
}

impl<E> EventQueue<E> {
    pub fn new() -> Self {
        Self::with_capacity(0)
    }

    pub fn with_capacity(capacity: usize) -> Self {
        EventQueue {
            heap: BinaryHeap::with_capacity(capacity),
            seq_next: 0,
            strong: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.heap.len()
    }

    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }

    /// Insert an event; returns its key.
    #[inline]
    pub fn push(&mut self, time_ns: u64, class: Class, event: E) -> Key {
        self.insert(time_ns, class, event, false)
    }

    /// Insert a weak event: one that does not keep the run alive. Once only weak events are
    /// pending, nothing they could do matters (a timer of a request that already left), and the
    /// run is over. Ordered like any other event while it lasts.
    #[inline]
    pub fn push_weak(&mut self, time_ns: u64, class: Class, event: E) -> Key {
        self.insert(time_ns, class, event, true)
    }

    fn insert(&mut self, time_ns: u64, class: Class, event: E, weak: bool) -> Key {
        let seq = self.seq_next;
        assert!(seq <= SEQ_MAX, "event sequence space exhausted");
        self.seq_next = seq + 1;
        let key = Key {
            time_ns,
            order: ((class as u64) << CLASS_SHIFT) | seq,
        };
        self.heap.push(Entry { key, event, weak });
        self.strong += !weak as usize;
        key
    }

    #[inline]
    pub fn pop(&mut self) -> Option<(Key, E)> {
        let e = self.heap.pop()?;
        self.strong -= !e.weak as usize;
        Some((e.key, e.event))
    }

    /// Events pending that are not weak.
    pub fn strong_len(&self) -> usize {
        self.strong
    }

    pub fn peek_time_ns(&self) -> Option<u64> {
        self.heap.peek().map(|e| e.key.time_ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ties_run_in_insertion_order() {
        let mut q = EventQueue::new();
        for i in 0..100u32 {
            q.push(5, Class::Control, i);
        }
        q.push(4, Class::Control, 1000);
        assert_eq!(q.pop().map(|(_, e)| e), Some(1000));
        for i in 0..100u32 {
            let (key, e) = q.pop().unwrap();
            assert_eq!(e, i);
            assert_eq!(key.time_ns, 5);
        }
        assert!(q.pop().is_none());
    }

    #[test]
    fn class_orders_within_a_tick_but_never_across_ticks() {
        let mut q = EventQueue::new();
        q.push(10, Class::Schedule, "sched@10");
        q.push(10, Class::Arrival, "arrival@10");
        q.push(10, Class::Control, "cancel@10");
        q.push(10, Class::Completion, "step_end@10");
        q.push(9, Class::Schedule, "sched@9");
        let order: Vec<_> = std::iter::from_fn(|| q.pop().map(|(_, e)| e)).collect();
        assert_eq!(
            order,
            [
                "sched@9",
                "step_end@10",
                "cancel@10",
                "arrival@10",
                "sched@10"
            ]
        );
    }
}

//! The one event queue of a run.
//!
//! Events are totally ordered by `(time_ns, class, seq)`. `seq` is the insertion sequence, so two
//! events at the same tick and class run in the order they were scheduled. The class is a
//! documented priority band at the same tick (see `Class` and ARCHITECTURE.md); it is packed with
//! the sequence into one `u64` so the key is two words, like a bare `(u64, u64)` heap, and the heap
//! compares them as one `u128`.

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
/// Sequence numbers must fit below the class bits, with the weak bit (`Entry::rank`) below them.
pub const SEQ_MAX: u64 = (1 << (CLASS_SHIFT - 1)) - 1;

/// Sort key of a scheduled event. Public so that tests and the run hash can see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Key {
    pub time_ns: u64,
    /// `class << 56 | seq`.
    pub order: u64,
}

impl Key {
    /// The key of an entry's rank (`Entry::rank`), its weak bit dropped.
    fn of(rank: u128) -> Key {
        let low = rank as u64;
        let class = low >> CLASS_SHIFT;
        let seq = (low & ((1 << CLASS_SHIFT) - 1)) >> 1;
        Key {
            time_ns: (rank >> 64) as u64,
            order: (class << CLASS_SHIFT) | seq,
        }
    }

    /// The rank an entry with this key sorts by: `time_ns << 64 | class << 56 | seq << 1 | weak`.
    /// Seqs are unique, so the weak bit never decides an order; it rides in the rank so that an
    /// entry is its rank and its event (48 bytes, not 64: a sift moves a quarter less).
    fn rank(self, weak: bool) -> u128 {
        let class = self.order >> CLASS_SHIFT;
        let low = (class << CLASS_SHIFT) | (self.seq() << 1) | weak as u64;
        (self.time_ns as u128) << 64 | low as u128
    }

    pub fn seq(self) -> u64 {
        self.order & SEQ_MAX
    }
}

#[derive(Clone, Copy)]
struct Entry<E> {
    /// The key as one number (`Key::rank`): one comparison, not two. Its lowest bit says the
    /// event is weak: it does not keep the run alive (see `EventQueue::push_weak`).
    rank: u128,
    event: E,
}

impl<E> Entry<E> {
    fn weak(&self) -> bool {
        self.rank & 1 == 1
    }
}

/// A min-heap of entries by rank, four children a node: half the levels of a binary heap, so a
/// pop moves an entry half as often, and a node's children share a cache line or two. On the
/// kernel's hold model (`benches/kernel.rs`) it matched `std::collections::BinaryHeap` at 1,000
/// events and was a third faster at 100,000. Ranks are unique (`seq` is), so any correct heap
/// pops the same order: the run is the same.
///
/// The earliest entry may wait beside the heap, in `front`: an event asked for before every
/// pending one (a scheduler pass at the tick of the step that just ended, half of a run's
/// events) is popped next without a sift either way.
struct Heap<E> {
    v: Vec<Entry<E>>,
    /// Earlier than every entry in `v`, if any.
    front: Option<Entry<E>>,
}

const ARITY: usize = 4;

impl<E: Copy> Heap<E> {
    fn with_capacity(n: usize) -> Self {
        Heap {
            v: Vec::with_capacity(n),
            front: None,
        }
    }

    #[inline]
    fn push(&mut self, e: Entry<E>) {
        let earliest = match &self.front {
            Some(f) => e.rank < f.rank,
            None => self.v.first().is_none_or(|m| e.rank < m.rank),
        };
        if !earliest {
            return self.push_heap(e);
        }
        if let Some(f) = self.front.replace(e) {
            self.push_heap(f); // still earlier than all in `v`
        }
    }

    /// Up from the end: the entry moves once, to where it belongs, and the parents it passes
    /// move down one place each (a hole, not a swap a level).
    fn push_heap(&mut self, e: Entry<E>) {
        let mut i = self.v.len();
        self.v.push(e);
        while i > 0 {
            let parent = (i - 1) / ARITY;
            if self.v[parent].rank <= e.rank {
                break;
            }
            self.v[i] = self.v[parent];
            i = parent;
        }
        self.v[i] = e;
    }

    #[inline]
    fn pop(&mut self) -> Option<Entry<E>> {
        if let Some(f) = self.front.take() {
            return Some(f);
        }
        self.pop_heap()
    }

    fn pop_heap(&mut self) -> Option<Entry<E>> {
        let last = self.v.pop()?;
        if self.v.is_empty() {
            return Some(last);
        }
        let top = std::mem::replace(&mut self.v[0], last);
        self.sift_down(0);
        Some(top)
    }

    /// The entry at `i` moves down to where its key belongs; the children it passes move up
    /// one place each.
    fn sift_down(&mut self, mut i: usize) {
        let n = self.v.len();
        let moving = self.v[i];
        loop {
            let first = i * ARITY + 1;
            if first >= n {
                break;
            }
            let mut min = first;
            let mut rank = self.v[first].rank;
            for c in first + 1..(first + ARITY).min(n) {
                let r = self.v[c].rank;
                if r < rank {
                    (min, rank) = (c, r);
                }
            }
            if moving.rank <= rank {
                break;
            }
            self.v[i] = self.v[min];
            i = min;
        }
        self.v[i] = moving;
    }

    fn peek(&self) -> Option<&Entry<E>> {
        self.front.as_ref().or(self.v.first())
    }

    fn len(&self) -> usize {
        self.v.len() + self.front.is_some() as usize
    }
}

/// Bits of a time a radix digit holds: a byte, so a run's spread of pending times (microseconds
/// to seconds) spans two or three positions.
const DIGIT_BITS: u32 = 8;
/// Buckets a position: one a digit value.
const DIGITS: usize = 1 << DIGIT_BITS;
/// Words of a position's occupancy bitmap.
const WORDS: usize = DIGITS / 64;
/// Digit positions in a `u64` time.
const POSITIONS: usize = 64_usize.div_ceil(DIGIT_BITS as usize);
/// Entries' room a bucket keeps once emptied: 2,048 buckets of 32 entries of 48 bytes are 3 MB
/// at most, whatever the run's length; a bucket that held more gives the rest back.
const BUCKET_KEPT: usize = 32;

/// A monotone radix queue on `time_ns` (a radix heap, after Ahuja, Mehlhorn, Orlin and Tarjan,
/// with 8-bit digits), with the current tick's entries in a heap by rank.
///
/// Why a radix queue: the kernel's times never go back (`Kernel::schedule_at` asserts
/// `time_ns >= now`), so an entry can be filed by the highest digit in which its time differs
/// from the last popped time, `last_ns`, and by its value there. Every entry of a lower
/// (position, value) bucket is earlier than every entry of a higher one. A push is a bit scan and
/// an append; a pop that finds the current tick empty takes the lowest occupied bucket, moves
/// `last_ns` to its earliest time and refiles its entries, each at a lower position than before:
/// at most 11 moves an entry in its life, and two or three in a run's spread of times, where a
/// binary heap of a thousand entries moves one ten times a pop.
///
/// The tie order lives in `now`: every entry whose time equals `last_ns` is there, ordered by its
/// whole rank (class, then seq). A heap, not a queue, because an event of a lower class can be
/// pushed at the current tick after one of a higher class was popped there (a step that ends at
/// the tick of the scheduler pass that started it). Ranks are unique, so this pops exactly the
/// order of any heap over `(time_ns, class, seq)`: the run is the same.
struct Radix<E> {
    /// Entries at `last_ns`.
    now: Heap<E>,
    /// `buckets[p][d]`: entries whose highest digit that differs from `last_ns` is at position
    /// `p`, where their digit is `d`.
    buckets: Box<[[Vec<Entry<E>>; DIGITS]; POSITIONS]>,
    /// Bit `d % 64` of `occupied[p][d / 64]`: `buckets[p][d]` is not empty.
    occupied: [[u64; WORDS]; POSITIONS],
    /// Bit `p`: `occupied[p]` is not all zero.
    positions: u16,
    last_ns: u64,
    len: usize,
}

impl<E: Copy> Radix<E> {
    fn with_capacity(n: usize) -> Self {
        Radix {
            now: Heap::with_capacity(n.min(64)),
            buckets: Box::new(std::array::from_fn(|_| std::array::from_fn(|_| Vec::new()))),
            occupied: [[0; WORDS]; POSITIONS],
            positions: 0,
            last_ns: 0,
            len: 0,
        }
    }

    fn time_ns(e: &Entry<E>) -> u64 {
        (e.rank >> 64) as u64
    }

    #[inline]
    fn push(&mut self, e: Entry<E>) {
        debug_assert!(
            Self::time_ns(&e) >= self.last_ns,
            "radix queue: a push before the last pop"
        );
        self.len += 1;
        self.file(e);
    }

    #[inline]
    fn file(&mut self, e: Entry<E>) {
        let t = Self::time_ns(&e);
        let diff = t ^ self.last_ns;
        if diff == 0 {
            return self.now.push(e);
        }
        let p = ((63 - diff.leading_zeros()) / DIGIT_BITS) as usize;
        let d = ((t >> (p as u32 * DIGIT_BITS)) as usize) & (DIGITS - 1);
        self.buckets[p][d].push(e);
        self.occupied[p][d / 64] |= 1 << (d % 64);
        self.positions |= 1 << p;
    }

    #[inline]
    fn pop(&mut self) -> Option<Entry<E>> {
        if self.now.len() == 0 {
            self.refill()?;
        }
        self.len -= 1;
        self.now.pop()
    }

    /// The current tick is empty: move `last_ns` to the earliest pending time and refile the
    /// lowest bucket, whose entries all lie before every other bucket's. `None`: nothing pending.
    fn refill(&mut self) -> Option<()> {
        if self.positions == 0 {
            return None;
        }
        let p = self.positions.trailing_zeros() as usize;
        let words = &mut self.occupied[p];
        let w = words
            .iter()
            .position(|&w| w != 0)
            .expect("an occupied position");
        let d = w * 64 + words[w].trailing_zeros() as usize;
        words[w] &= words[w] - 1;
        if words.iter().all(|&w| w == 0) {
            self.positions &= !(1 << p);
        }
        if let [only] = self.buckets[p][d][..] {
            // The usual case near the front: one entry, which is the next tick.
            self.buckets[p][d].clear();
            self.last_ns = Self::time_ns(&only);
            self.now.push(only);
            return Some(());
        }
        let mut entries = std::mem::take(&mut self.buckets[p][d]);
        let earliest = entries.iter().map(Self::time_ns).min();
        self.last_ns = earliest.expect("an occupied bucket holds an entry");
        // Every entry agrees with the new `last_ns` down to digit `p`: each goes lower.
        for e in entries.drain(..) {
            self.file(e);
        }
        // The emptied vector keeps a little room for the bucket's next entries, not all of it:
        // each of the 2,048 buckets would otherwise keep the most it ever held, and a long run's
        // clock walks ever more of them (11.6 MB of a fleet-day slice's 51 MB peak).
        entries.shrink_to(BUCKET_KEPT);
        self.buckets[p][d] = entries;
        debug_assert!(self.now.len() > 0);
        Some(())
    }

    fn peek(&mut self) -> Option<&Entry<E>> {
        if self.now.len() == 0 {
            self.refill()?;
        }
        self.now.peek()
    }

    /// The earliest pending time, leaving `last_ns` where it is (`peek` may move it up to that
    /// time, after which nothing earlier may be pushed): the current tick, or the earliest
    /// time in the lowest occupied bucket.
    fn min_time_ns(&self) -> Option<u64> {
        if self.now.len() > 0 {
            return Some(self.last_ns);
        }
        if self.positions == 0 {
            return None;
        }
        let p = self.positions.trailing_zeros() as usize;
        let words = &self.occupied[p];
        let w = words.iter().position(|&w| w != 0)?;
        let d = w * 64 + words[w].trailing_zeros() as usize;
        self.buckets[p][d].iter().map(Self::time_ns).min()
    }

    fn len(&self) -> usize {
        self.len
    }
}

/// A min-queue of events keyed by `(time_ns, class, seq)`.
pub struct EventQueue<E> {
    heap: Radix<E>,
    seq_next: u64,
    /// Events pending that are not weak.
    strong: usize,
}

impl<E: Copy> Default for EventQueue<E> {
    fn default() -> Self {
        Self::new()
    }
}

impl<E: Copy> EventQueue<E> {
    pub fn new() -> Self {
        Self::with_capacity(0)
    }

    pub fn with_capacity(capacity: usize) -> Self {
        EventQueue {
            heap: Radix::with_capacity(capacity),
            seq_next: 0,
            strong: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.heap.len()
    }

    pub fn is_empty(&self) -> bool {
        self.heap.len() == 0
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
        let key = self.key(time_ns, class);
        let rank = key.rank(weak);
        self.heap.push(Entry { rank, event });
        self.strong += !weak as usize;
        key
    }

    /// Whether an event is pending at the tick of the last one popped. (Unlike `peek_time_ns`,
    /// this moves nothing: an event may still be pushed at that tick after it.)
    #[inline]
    pub fn pending_at_last_tick(&self) -> bool {
        self.heap.now.len() > 0
    }

    /// The key of an event scheduled now at `time_ns`: the next sequence number is its.
    #[inline]
    pub fn key(&mut self, time_ns: u64, class: Class) -> Key {
        let seq = self.seq_next;
        assert!(seq <= SEQ_MAX, "event sequence space exhausted");
        self.seq_next = seq + 1;
        Key {
            time_ns,
            order: ((class as u64) << CLASS_SHIFT) | seq,
        }
    }

    #[inline]
    pub fn pop(&mut self) -> Option<(Key, E)> {
        let e = self.heap.pop()?;
        self.strong -= !e.weak() as usize;
        Some((Key::of(e.rank), e.event))
    }

    /// Events pending that are not weak.
    pub fn strong_len(&self) -> usize {
        self.strong
    }

    pub fn peek_time_ns(&mut self) -> Option<u64> {
        self.heap.peek().map(|e| Key::of(e.rank).time_ns)
    }

    /// The earliest pending time, where a push at any time from the last popped one on stays
    /// allowed (unlike after `peek_time_ns`).
    pub fn min_time_ns(&self) -> Option<u64> {
        self.heap.min_time_ns()
    }
}

#[cfg(test)]
mod tests;

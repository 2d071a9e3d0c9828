//! The kernel: virtual clock, the one event queue, the run hash and the run limits.
//!
//! It knows nothing of requests or GPUs. The world hands it events of its own closed enum and
//! gets them back in `(time, class, seq)` order, with the clock advanced and every dispatch
//! folded into the run hash.

mod pending;
pub mod queue;
pub mod rng;

use pending::PendingTimes;

use std::fmt;

pub use queue::{Class, EventQueue, Key};

/// Nanoseconds per second of virtual time.
pub const NS_PER_S: u64 = 1_000_000_000;
/// Nanoseconds per millisecond of virtual time.
pub const NS_PER_MS: u64 = 1_000_000;

/// What the run hash sees of an event: a small kind code and the entity it concerns.
pub trait Traced {
    fn kind_code(&self) -> u8;
    fn entity(&self) -> u64;
}

/// Bounds on one run. Reaching one is an error naming it, never a hang.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Events dispatched, at most.
    pub events_max: u64,
    /// Virtual time of any dispatched event, at most.
    pub time_ns_max: u64,
    /// Events pending in the queue at once, at most.
    pub queue_len_max: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            events_max: 200_000_000,
            time_ns_max: 7 * 24 * 3600 * NS_PER_S,
            queue_len_max: 10_000_000,
        }
    }
}

/// A limit was reached.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LimitError {
    Events {
        limit: u64,
        time_ns: u64,
    },
    Time {
        limit_ns: u64,
        event_number: u64,
    },
    QueueLen {
        limit: u64,
        time_ns: u64,
    },
    /// The router's shared queue held `limits.max_queue_len` requests.
    RouterQueue {
        limit: u64,
        time_ns: u64,
    },
    /// `limits.max_in_system` requests were in the system when another arrived.
    InSystem {
        limit: u64,
        time_ns: u64,
    },
}

impl fmt::Display for LimitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            LimitError::Events { limit, time_ns } => write!(
                f,
                "run reached limits.max_events = {limit} at virtual time {} s; raise it in the scenario if the run is meant to be this long",
                fmt_s(time_ns)
            ),
            LimitError::Time { limit_ns, event_number } => write!(
                f,
                "run reached limits.max_time_s = {} at event #{event_number}; raise it in the scenario if the run is meant to be this long",
                fmt_s(limit_ns)
            ),
            LimitError::QueueLen { limit, time_ns } => write!(
                f,
                "event queue reached limits.max_queue_len = {limit} at virtual time {} s",
                fmt_s(time_ns)
            ),
            LimitError::InSystem { limit, time_ns } => write!(
                f,
                "run reached limits.max_in_system = {limit} requests in the system at once at \
                 virtual time {} s: arrivals outrun service; raise the limit if the machine has \
                 the memory (about 0.8 KB a request)",
                fmt_s(time_ns)
            ),
            LimitError::RouterQueue { limit, time_ns } => write!(
                f,
                "the router's shared queue reached limits.max_queue_len = {limit} requests at \
                 virtual time {} s",
                fmt_s(time_ns)
            ),
        }
    }
}

impl std::error::Error for LimitError {}

fn fmt_s(ns: u64) -> String {
    format!("{}.{:09}", ns / NS_PER_S, ns % NS_PER_S)
}

/// BLAKE3 over the canonical stream of dispatched events: 25 bytes each,
/// `time_ns u64 LE | seq u64 LE | kind u8 | entity u64 LE`. Buffered, because hashing 25 bytes at a
/// time costs more than the queue operation it records.
///
/// The buffer is handed to BLAKE3 only when full, a record split across two buffers if it must
/// be: 16 KiB is 16 of BLAKE3's 1 KiB chunks, which it hashes side by side, and a buffer that
/// ended on a whole record (16,375 bytes) left its chunks out of step, for a third of the
/// speed. The bytes hashed, so the digest, are the same either way.
pub struct RunHasher {
    b: BufferedHasher,
}

impl Default for RunHasher {
    fn default() -> Self {
        Self::new()
    }
}

impl RunHasher {
    const RECORD_LEN: usize = 25;

    pub fn new() -> Self {
        RunHasher {
            b: BufferedHasher::default(),
        }
    }

    #[inline]
    pub fn record(&mut self, time_ns: u64, seq: u64, kind: u8, entity: u64) {
        let b = &mut self.b;
        let end = b.len + Self::RECORD_LEN;
        if end >= BufferedHasher::BUF_LEN {
            return self.record_across(time_ns, seq, kind, entity);
        }
        // Straight into the buffer: a record built on the stack and copied was read back
        // before its narrow stores had landed, a stall of a tenth of the kernel's time.
        let r = &mut b.buf[b.len..end];
        r[0..8].copy_from_slice(&time_ns.to_le_bytes());
        r[8..16].copy_from_slice(&seq.to_le_bytes());
        r[16] = kind;
        r[17..25].copy_from_slice(&entity.to_le_bytes());
        b.len = end;
    }

    /// The record fills the buffer: what fits ends it, the buffer is hashed, the rest begins
    /// the next.
    #[cold]
    fn record_across(&mut self, time_ns: u64, seq: u64, kind: u8, entity: u64) {
        let mut rec = [0u8; Self::RECORD_LEN];
        rec[0..8].copy_from_slice(&time_ns.to_le_bytes());
        rec[8..16].copy_from_slice(&seq.to_le_bytes());
        rec[16] = kind;
        rec[17..25].copy_from_slice(&entity.to_le_bytes());
        self.b.update(&rec);
        debug_assert!(self.b.len < BufferedHasher::BUF_LEN);
    }

    /// Hex digest of everything recorded so far (more may follow).
    pub fn hex(&mut self) -> String {
        self.b.finalize().to_hex().to_string()
    }
}

/// BLAKE3 over bytes given a few at a time (a request's outcome, an arrival): gathered into
/// whole 16 KiB buffers first, as `RunHasher` does, since BLAKE3's own `update` costs more than
/// hashing a few bytes. The bytes hashed, so the digest, are the same as `update` on each.
pub struct BufferedHasher {
    hasher: blake3::Hasher,
    buf: Box<[u8; BufferedHasher::BUF_LEN]>,
    len: usize,
}

impl Default for BufferedHasher {
    fn default() -> Self {
        BufferedHasher {
            hasher: blake3::Hasher::new(),
            buf: Box::new([0; Self::BUF_LEN]),
            len: 0,
        }
    }
}

impl BufferedHasher {
    const BUF_LEN: usize = 16 * 1024;

    #[inline]
    pub fn update(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            let n = bytes.len().min(Self::BUF_LEN - self.len);
            self.buf[self.len..self.len + n].copy_from_slice(&bytes[..n]);
            self.len += n;
            bytes = &bytes[n..];
            if self.len == Self::BUF_LEN {
                self.hasher.update(&self.buf[..]);
                self.len = 0;
            }
        }
    }

    /// The digest of everything given so far (more may follow).
    pub fn finalize(&self) -> blake3::Hash {
        self.finalize_after(&[])
    }

    /// The digest of everything given so far and then `more`, which is not kept: what follows
    /// is hashed after what was given, not after `more`.
    pub fn finalize_after(&self, more: &[u8]) -> blake3::Hash {
        let mut h = self.hasher.clone();
        h.update(&self.buf[..self.len]);
        h.update(more);
        h.finalize()
    }
}

/// Clock + queue + hash + limits.
pub struct Kernel<E> {
    now_ns: u64,
    queue: EventQueue<E>,
    hasher: RunHasher,
    limits: Limits,
    events_dispatched: u64,
    /// The ticks of the pending events, where a world coasts (`track_times`).
    pending: Option<PendingTimes>,
}

impl<E: Traced + Copy> Kernel<E> {
    pub fn new(limits: Limits) -> Self {
        assert!(limits.events_max > 0 && limits.queue_len_max > 0);
        Kernel {
            now_ns: 0,
            queue: EventQueue::with_capacity(1024),
            hasher: RunHasher::new(),
            limits,
            events_dispatched: 0,
            pending: None,
        }
    }

    /// Count the pending events' ticks from now on (`pending_at`); before anything is pushed.
    pub fn track_times(&mut self) {
        assert!(self.queue.is_empty(), "times tracked from the start");
        self.pending = Some(PendingTimes::default());
    }

    /// Whether an event is pending at `time_ns` (`track_times` first).
    pub fn pending_at(&self, time_ns: u64) -> bool {
        let p = self
            .pending
            .as_ref()
            .expect("the pending ticks are counted");
        p.any_at(time_ns)
    }

    /// The tick of the next event, if any; events may still be pushed from now on.
    pub fn next_time_ns(&self) -> Option<u64> {
        self.queue.min_time_ns()
    }

    /// `n` events dispatched without the queue (a coast's steps and passes, `world/coast.rs`):
    /// counted toward the limit as if each had been popped.
    pub fn count_dispatched(&mut self, n: u64) -> Result<(), LimitError> {
        let events = self.events_dispatched.saturating_add(n);
        if events > self.limits.events_max {
            return Err(LimitError::Events {
                limit: self.limits.events_max,
                time_ns: self.now_ns,
            });
        }
        self.events_dispatched = events;
        Ok(())
    }

    #[inline]
    pub fn now_ns(&self) -> u64 {
        self.now_ns
    }

    pub fn events_dispatched(&self) -> u64 {
        self.events_dispatched
    }

    pub fn queue_len(&self) -> usize {
        self.queue.len()
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Schedule `event` at absolute virtual time `time_ns`, which must not be in the past.
    #[inline]
    pub fn schedule_at(&mut self, time_ns: u64, class: Class, event: E) -> Result<(), LimitError> {
        assert!(
            time_ns >= self.now_ns,
            "event scheduled in the past: {time_ns} < now {}",
            self.now_ns
        );
        self.check_room()?;
        self.queue.push(time_ns, class, event);
        if let Some(p) = self.pending.as_mut() {
            p.add(time_ns);
        }
        Ok(())
    }

    /// Schedule a weak event `delay_ns` after now: one that does not keep the run alive (a client's
    /// timer, say). The run ends when only weak events are left; until then they are dispatched
    /// like any other.
    pub fn schedule_weak_in(
        &mut self,
        delay_ns: u64,
        class: Class,
        event: E,
    ) -> Result<(), LimitError> {
        self.check_room()?;
        let at = self.now_ns.saturating_add(delay_ns);
        self.queue.push_weak(at, class, event);
        if let Some(p) = self.pending.as_mut() {
            p.add(at);
        }
        Ok(())
    }

    fn check_room(&self) -> Result<(), LimitError> {
        if self.queue.len() as u64 >= self.limits.queue_len_max {
            return Err(LimitError::QueueLen {
                limit: self.limits.queue_len_max,
                time_ns: self.now_ns,
            });
        }
        Ok(())
    }

    /// Schedule `event` `delay_ns` after now. Saturates rather than wrapping: a delay past the end
    /// of time is caught by the time limit when it would be dispatched.
    #[inline]
    pub fn schedule_in(&mut self, delay_ns: u64, class: Class, event: E) -> Result<(), LimitError> {
        self.schedule_at(self.now_ns.saturating_add(delay_ns), class, event)
    }

    /// Pop the next event, advance the clock to it and record it in the run hash.
    /// `Ok(None)` means no event but weak ones is pending: the run is over.
    #[inline]
    pub fn next_event(&mut self) -> Result<Option<E>, LimitError> {
        self.next_event_or(|| false)
    }

    /// `next_event`, except that when only weak events are left, `go_on` decides whether the
    /// run goes on through them (work waits for something a weak event brings). `Ok(None)`: the
    /// run is over. One call site of the heap's pop, so that it is inlined into the run loop
    /// (with two, it was not, for 7 % more instructions in a storm).
    #[inline]
    pub fn next_event_or(&mut self, go_on: impl FnOnce() -> bool) -> Result<Option<E>, LimitError> {
        if self.queue.strong_len() == 0 && !go_on() {
            return Ok(None);
        }
        let Some((key, event)) = self.queue.pop() else {
            return Ok(None);
        };
        if let Some(p) = self.pending.as_mut() {
            p.remove(key.time_ns);
        }
        self.advance(key, event).map(Some)
    }

    /// Whether another event is pending at this tick.
    #[inline]
    pub fn pending_now(&self) -> bool {
        self.queue.pending_at_last_tick()
    }

    /// Dispatch `event`, asked for now, at once: what `schedule_in(0, class, event)` and then
    /// `next_event` would do when nothing else is pending at this tick (`pending_now` is
    /// false), so that the next event is this one. The same sequence number, limits and run
    /// hash record; no trip through the queue.
    #[inline]
    pub fn dispatch_now(&mut self, class: Class, event: E) -> Result<E, LimitError> {
        assert!(
            !self.pending_now(),
            "an event dispatched past one due first"
        );
        self.check_room()?;
        let key = self.queue.key(self.now_ns, class);
        self.advance(key, event)
    }

    /// The clock moves to a popped event, within the limits, and the run hash records it.
    #[inline(always)]
    fn advance(&mut self, key: Key, event: E) -> Result<E, LimitError> {
        debug_assert!(
            key.time_ns >= self.now_ns,
            "queue returned an event from the past"
        );
        if self.events_dispatched >= self.limits.events_max {
            return Err(LimitError::Events {
                limit: self.limits.events_max,
                time_ns: self.now_ns,
            });
        }
        if key.time_ns > self.limits.time_ns_max {
            return Err(LimitError::Time {
                limit_ns: self.limits.time_ns_max,
                event_number: self.events_dispatched,
            });
        }
        self.now_ns = key.time_ns;
        self.events_dispatched += 1;
        self.hasher
            .record(key.time_ns, key.seq(), event.kind_code(), event.entity());
        Ok(event)
    }

    /// The run hash so far.
    pub fn run_hash(&mut self) -> String {
        self.hasher.hex()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Copy, Debug, PartialEq)]
    struct Ping(u64);
    impl Traced for Ping {
        fn kind_code(&self) -> u8 {
            1
        }
        fn entity(&self) -> u64 {
            self.0
        }
    }

    /// A self-perpetuating event chain: each dispatch schedules the next.
    fn chain(limits: Limits) -> Result<u64, LimitError> {
        let mut k = Kernel::new(limits);
        k.schedule_at(0, Class::Control, Ping(0))?;
        while let Some(Ping(n)) = k.next_event()? {
            k.schedule_in(1_000, Class::Control, Ping(n + 1))?;
        }
        unreachable!("the chain never drains");
    }

    #[test]
    fn event_limit_is_an_error_naming_it() {
        let limits = Limits {
            events_max: 500,
            ..Limits::default()
        };
        let err = chain(limits).unwrap_err();
        assert_eq!(
            err,
            LimitError::Events {
                limit: 500,
                time_ns: 499_000
            }
        );
        assert!(err.to_string().contains("limits.max_events = 500"));
    }

    #[test]
    fn time_limit_is_an_error_naming_it() {
        let limits = Limits {
            time_ns_max: 1_000_000,
            ..Limits::default()
        };
        let err = chain(limits).unwrap_err();
        assert_eq!(
            err,
            LimitError::Time {
                limit_ns: 1_000_000,
                event_number: 1001
            }
        );
        assert!(err.to_string().contains("limits.max_time_s = 0.001000000"));
    }

    #[test]
    fn queue_limit_is_an_error_naming_it() {
        let mut k = Kernel::new(Limits {
            queue_len_max: 3,
            ..Limits::default()
        });
        for i in 0..3 {
            k.schedule_at(i, Class::Arrival, Ping(i)).unwrap();
        }
        let err = k.schedule_at(9, Class::Arrival, Ping(9)).unwrap_err();
        assert!(err.to_string().contains("limits.max_queue_len = 3"));
    }

    #[test]
    fn hash_covers_time_seq_kind_and_entity() {
        let hash_of = |events: &[(u64, u64)]| {
            let mut k = Kernel::new(Limits::default());
            for &(t, e) in events {
                k.schedule_at(t, Class::Control, Ping(e)).unwrap();
            }
            while k.next_event().unwrap().is_some() {}
            k.run_hash()
        };
        let base = hash_of(&[(1, 1), (2, 2)]);
        assert_eq!(base, hash_of(&[(1, 1), (2, 2)]));
        assert_ne!(base, hash_of(&[(1, 1), (3, 2)]), "time");
        assert_ne!(base, hash_of(&[(1, 1), (2, 3)]), "entity");
        assert_ne!(base, hash_of(&[(1, 1)]), "count");
        // Same events dispatched in the same order but scheduled in another order: the
        // sequence numbers differ, and the hash says so.
        assert_ne!(base, hash_of(&[(2, 2), (1, 1)]), "seq");
    }

    #[test]
    fn a_buffered_hasher_equals_blake3_on_each_update() {
        let mut b = BufferedHasher::default();
        let mut direct = blake3::Hasher::new();
        for i in 0..7_000u64 {
            // Updates of every length from 0 to 12 bytes, across many buffer flushes.
            let bytes = &i.wrapping_mul(0x9e37_79b9_7f4a_7c15).to_le_bytes()[..(i % 9) as usize];
            b.update(bytes);
            direct.update(bytes);
            if i % 1_000 == 0 {
                assert_eq!(b.finalize(), direct.finalize(), "at update {i}");
            }
        }
        b.update(&[7; 40_000]);
        direct.update(&[7; 40_000]);
        assert_eq!(b.finalize(), direct.finalize());
    }

    #[test]
    fn buffered_hash_equals_direct_hash() {
        // Across several buffer flushes the digest must equal hashing the records in one go.
        let mut h = RunHasher::new();
        let mut direct = blake3::Hasher::new();
        for i in 0..5_000u64 {
            h.record(i * 3, i, (i % 7) as u8, i ^ 0xdead);
            direct.update(&(i * 3).to_le_bytes());
            direct.update(&i.to_le_bytes());
            direct.update(&[(i % 7) as u8]);
            direct.update(&(i ^ 0xdead).to_le_bytes());
        }
        assert_eq!(h.hex(), direct.finalize().to_hex().to_string());
    }
}

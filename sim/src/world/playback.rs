//! The playback sink: tokens become audio chunks, and each chunk passes the ownership controller
//! twice, the contract's two-phase admission. `update` records it as output evidence, then
//! `admit_begin` on the owner's clear barrier, the writer wait, and `admit_end` against the state
//! at that moment. A request's chunks are held one at a time, in order.

use cancelsim_models::ownership::{
    Admission, BarrierId, Disposition, Owners, State, Ticket, UpdateClass,
};

use cancelsim_models::sparse::Sparse;

use super::digest::{marker, Digest, Run};
use super::error::{Step, Stop};
use super::event::Event;
use super::event::Tag;
use super::follow::Follow;
use crate::dist::{ms_to_ns, Dist};
use crate::kernel::rng::{key, Purpose, Stream};
use crate::metrics::Playback;
use crate::scenario::PlaybackConfig;

/// One request's chunks: nothing until its first token, so a waiting request holds only the
/// pointer (8 bytes instead of 48).
#[derive(Clone, Debug, Default)]
pub(crate) struct Chunks(Sparse<ChunkState>);

#[derive(Clone, Debug)]
struct ChunkState {
    /// Tokens in the chunk being filled.
    fill: u32,
    made: u32,
    /// Chunks made but not yet held for admission.
    queued: u32,
    /// A chunk is held (between `update` and the end of its admission).
    in_flight: bool,
    /// Chunks done with: played, or suppressed.
    admitted: u32,
    /// From this chunk on, its blocks were reused while still written: corrupted markers.
    first_corrupt: Option<u32>,
    /// FNV-1a of the markers played, in order.
    digest: Digest,
    corrupted_seen: bool,
    /// The request's writer-wait draws, in chunk order; made at its first held chunk.
    stream: Option<Box<Stream>>,
}

/// What a request's chunks read before its first token.
static CHUNKS_NEW: ChunkState = ChunkState::NEW;

impl Default for ChunkState {
    fn default() -> Self {
        ChunkState::NEW
    }
}

impl ChunkState {
    const NEW: ChunkState = ChunkState {
        fill: 0,
        made: 0,
        queued: 0,
        in_flight: false,
        admitted: 0,
        first_corrupt: None,
        digest: Digest::NEW,
        corrupted_seen: false,
        stream: None,
    };
}

impl Chunks {
    fn get(&self) -> &ChunkState {
        self.0.get(&CHUNKS_NEW)
    }

    #[inline(always)]
    fn get_mut(&mut self) -> &mut ChunkState {
        self.0.get_mut()
    }

    /// Chunks done with: played, or suppressed.
    pub fn admitted(&self) -> u32 {
        self.get().admitted
    }

    /// FNV-1a of the markers request `id` played, in order: what its user heard.
    pub fn digest(&self, id: u64) -> u64 {
        self.get().digest.value(id)
    }

    /// Request `id`'s digest, with what it still owes to fold (`digest.rs`).
    pub fn digest_run(&self, id: u64) -> Run {
        self.get().digest.run(id)
    }

    /// Chunks are still held or waiting: the request cannot leave yet.
    pub fn busy(&self) -> bool {
        let c = self.get();
        c.in_flight || c.queued > 0
    }

    /// A token came out corrupted: from the next chunk on, markers are corrupted. True the first
    /// time.
    pub fn corrupted(&mut self) -> bool {
        let c = self.get_mut();
        if c.first_corrupt.is_some() {
            return false;
        }
        c.first_corrupt = Some(c.made);
        true
    }
}

/// Who a chunk belongs to.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Owner {
    pub id: u64,
    pub owner: u64,
    pub generation: u32,
    /// Every output token of the request is out.
    pub output_done: bool,
}

/// What holding the next chunk led to.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Hold {
    /// The request went terminal since the chunk was made: it and the rest are suppressed.
    Settle,
    /// No writer wait: admit it now with this ticket.
    Now(Ticket<u64>),
    /// Its admission check is scheduled after the writer wait.
    Waiting,
}

/// What an admission check decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Admitted {
    /// Played; `final_chunk` if it was the request's last (its completion boundary).
    Played {
        final_chunk: bool,
    },
    Suppressed,
    /// Too old: the controller expired the request.
    Expired,
    /// Blocked by the barrier; the check is retried after the current clear.
    Retrying,
    /// Blocked too often: the sink gives up on the request.
    GaveUp,
}

pub(crate) struct PlaybackSink {
    seed: u64,
    cfg: PlaybackConfig,
    max_age_ns: f64,
    zero_writer_wait: bool,
    counts: Playback,
    /// Outputs admitted after a terminal transition (invariant 1: the run stops at the first).
    late_admitted: u64,
}

impl PlaybackSink {
    pub fn new(cfg: &PlaybackConfig, seed: u64) -> PlaybackSink {
        PlaybackSink {
            seed,
            cfg: cfg.clone(),
            // A valid age bound in ms can overflow to infinity in ns (1e308 ms): the largest
            // finite bound is the same bound, and the controller takes only finite ones.
            max_age_ns: (cfg.max_age_ms * 1e6).min(f64::MAX),
            zero_writer_wait: cfg.writer_wait_ms == Dist::Constant(0.0),
            counts: Playback::default(),
            late_admitted: 0,
        }
    }

    /// A live token enters the sink. True if a chunk is ready and none is held: hold it now.
    pub fn token(&mut self, c: &mut Chunks, last: bool) -> bool {
        let c = c.get_mut();
        c.fill += 1;
        if c.fill != self.cfg.chunk_tokens && !last {
            return false;
        }
        c.fill = 0;
        c.made += 1;
        c.queued += 1;
        self.counts.chunks += 1;
        !c.in_flight
    }

    /// Whether a chunk is admitted as it is made, with no writer's wait.
    pub fn admits_at_once(&self) -> bool {
        self.zero_writer_wait
    }

    /// `tokens` live tokens, none the last, enter the sink at once: the chunks they fill are
    /// made and queued. How many.
    pub fn tokens(&mut self, c: &mut Chunks, tokens: u32) -> u32 {
        let c = c.get_mut();
        let filled = c.fill + tokens;
        let made = filled / self.cfg.chunk_tokens;
        c.fill = filled % self.cfg.chunk_tokens;
        c.made += made;
        c.queued += made;
        self.counts.chunks += made as u64;
        made
    }

    /// The chunks queued, all at once, where each would be held and admitted at once and
    /// played (a lazy request's, `lazy.rs`): one call to the controller for the run. False, and
    /// nothing changed, if one of them would do anything else; the caller holds them one by one.
    pub fn play_run(&mut self, owners: &mut Owners<u64>, who: Owner, c: &mut Chunks) -> bool {
        let c = c.get_mut();
        let n = c.queued;
        if !self.zero_writer_wait || c.in_flight || n == 0 || who.output_done {
            return false;
        }
        if c.first_corrupt.is_some() {
            return false;
        }
        let (first, last) = (c.admitted, c.admitted + n - 1);
        let payload = marker(who.id, last, false);
        let owner = (who.generation as i128, BarrierId::of_owner(who.owner));
        if !owners.admit_run(&who.id, owner, first as u64, n as u64, &payload) {
            return false;
        }
        // What `play` does with each: its own marker, uncorrupted, into the digest.
        c.digest.owe(who.id, first, n);
        c.admitted += n;
        c.queued = 0;
        self.counts.submitted += n as u64;
        true
    }

    /// Whether a chunk waits behind the one just done with.
    pub fn has_next(&self, c: &Chunks) -> bool {
        c.get().queued > 0
    }

    /// Hold the next chunk: record it as output evidence, then begin its admission.
    pub fn hold(
        &mut self,
        f: &mut Follow,
        owners: &mut Owners<u64>,
        who: Owner,
        tag: Tag,
        c: &mut Chunks,
    ) -> Step<Hold> {
        let c = c.get_mut();
        assert!(!c.in_flight, "a chunk was held while another one was");
        assert!(c.queued > 0, "a chunk was held that was never made");
        let chunk = c.admitted;
        let is_final = who.output_done && chunk + 1 == c.made;
        c.queued -= 1;
        c.in_flight = true;
        let corrupt = c.first_corrupt.is_some_and(|f| chunk >= f);
        let payload = marker(who.id, chunk, corrupt);
        let class = owners.update(&who.id, chunk as u64, &payload, is_final);
        match class.map_err(Stop::controller(who.id))? {
            UpdateClass::Accepted => {}
            UpdateClass::Conflict | UpdateClass::Late => {
                // Terminal since the chunk was made: it is suppressed.
                self.counts.suppressed += 1;
                return Ok(Hold::Settle);
            }
            other => {
                let what = format!("chunk {chunk} classified {other:?}");
                return Err(Stop::broken(vec![who.id], what));
            }
        }
        let now_ns = f.now_ns();
        let ticket = self.begin(owners, who, now_ns as f64)?;
        if self.zero_writer_wait {
            return Ok(Hold::Now(ticket));
        }
        let seed = self.seed;
        let stream = c
            .stream
            .get_or_insert_with(|| Box::new(Stream::new(seed, Purpose::Playback, who.id)));
        let wait = ms_to_ns(self.cfg.writer_wait_ms.sample(stream));
        let admit = Event::ChunkAdmit {
            request: who.id,
            tag,
            born_ns: now_ns,
            epoch: ticket.epoch,
            retry: 0,
        };
        f.after(wait, admit);
        Ok(Hold::Waiting)
    }

    /// Phase one of an admission, on the owner's barrier.
    fn begin(&self, owners: &Owners<u64>, who: Owner, born: f64) -> Step<Ticket<u64>> {
        let barrier = BarrierId::of_owner(who.owner);
        owners
            .admit_begin_on(
                barrier,
                who.id,
                who.generation as i128,
                born,
                self.max_age_ns,
            )
            .map_err(Stop::controller(who.id))
    }

    /// The ticket a scheduled admission check carries (its phase one, captured at `epoch`).
    pub fn ticket(&self, who: Owner, born_ns: u64, epoch: u64) -> Ticket<u64> {
        Ticket {
            request: who.id,
            generation: who.generation as i128,
            born: born_ns as f64,
            max_age: self.max_age_ns,
            barrier: BarrierId::of_owner(who.owner),
            epoch,
        }
    }

    /// Phase two, after the wait, against the state at this moment.
    pub fn admit(
        &mut self,
        f: &mut Follow,
        owners: &mut Owners<u64>,
        (who, tag): (Owner, Tag),
        c: &mut Chunks,
        (ticket, retry): (&Ticket<u64>, u8),
    ) -> Step<Admitted> {
        let id = who.id;
        let now = f.now_ns() as f64;
        let result = owners
            .admit_end(ticket, now)
            .map_err(Stop::controller(id))?;
        match result {
            Admission::Submitted(payload) => {
                // Invariant 1: nothing is admitted after the first terminal transition. The
                // controller guarantees it; the sink checks it.
                if owners.state(&id) != Some(State::Running) {
                    self.late_admitted += 1;
                    let what = "output admitted after a terminal transition";
                    return Err(Stop::broken(vec![id], what));
                }
                Ok(self.play(c, who, &payload))
            }
            Admission::Terminal(_) | Admission::Stale | Admission::Late | Admission::Empty => {
                self.counts.suppressed += 1;
                Ok(Admitted::Suppressed)
            }
            Admission::Expired => {
                self.counts.expired += 1;
                Ok(Admitted::Expired)
            }
            Admission::Blocked => self.blocked(f, owners, (who, tag), ticket, retry),
        }
    }

    /// The consumer takes a chunk: it checks, byte for byte, that the marker is its own
    /// (property 3), and folds it into the request's digest.
    fn play(&mut self, c: &mut Chunks, who: Owner, payload: &[u8]) -> Admitted {
        let c = c.get_mut();
        self.counts.submitted += 1;
        let chunk = c.admitted;
        let expect = marker(who.id, chunk, false);
        if payload[..12] != expect[..12] {
            self.counts.routing_violations += 1;
        }
        if payload[12..16] != expect[12..16] && !c.corrupted_seen {
            c.corrupted_seen = true;
            self.counts.corrupted_requests += 1;
        }
        c.digest.play(who.id, chunk, payload);
        c.admitted += 1;
        let final_chunk = who.output_done && c.admitted == c.made && c.queued == 0;
        c.in_flight = false;
        Admitted::Played { final_chunk }
    }

    /// Blocked by the barrier: wait for the current clear and check again, a bounded number of
    /// times.
    fn blocked(
        &mut self,
        f: &mut Follow,
        owners: &Owners<u64>,
        (who, tag): (Owner, Tag),
        ticket: &Ticket<u64>,
        retry: u8,
    ) -> Step<Admitted> {
        self.counts.blocked += 1;
        if retry as u32 >= self.cfg.admit_retries {
            self.counts.gave_up += 1;
            return Ok(Admitted::GaveUp);
        }
        let again = self.begin(owners, who, ticket.born)?;
        let entity = who.id ^ key::RETRY_FLAG;
        let mut s = Stream::keyed(self.seed, Purpose::Playback, entity, retry as u64 + 1);
        let wait = ms_to_ns(self.cfg.clear_ack_ms.sample(&mut s)).max(1);
        let admit = Event::ChunkAdmit {
            request: who.id,
            tag,
            born_ns: ticket.born as u64,
            epoch: again.epoch,
            retry: retry + 1,
        };
        f.after(wait, admit);
        Ok(Admitted::Retrying)
    }

    /// The held chunk is done with and the request is terminal: the rest is suppressed.
    pub fn settle(&mut self, c: &mut Chunks) {
        let c = c.get_mut();
        c.in_flight = false;
        self.counts.suppressed += c.queued as u64;
        c.admitted += c.queued;
        c.queued = 0;
    }

    /// An interruption: a clear operation starts on `owner`'s sink, acknowledged later.
    pub fn clear(&mut self, f: &mut Follow, owners: &mut Owners<u64>, owner: u64) {
        let barrier = BarrierId::of_owner(owner);
        let epoch = owners.barrier_advance_on(barrier);
        owners.set_clear_on(barrier, false);
        let mut s = Stream::keyed(self.seed, Purpose::Playback, owner, epoch);
        let ack = ms_to_ns(self.cfg.clear_ack_ms.sample(&mut s));
        f.after(ack, Event::BarrierAck { owner, epoch });
    }

    /// A clear is acknowledged: the barrier is clear again, unless a newer clear started.
    pub fn cleared(&mut self, owners: &mut Owners<u64>, owner: u64, epoch: u64) {
        let barrier = BarrierId::of_owner(owner);
        if owners.barrier_state(barrier).0 == epoch {
            owners.set_clear_on(barrier, true);
        }
    }

    /// The owner is gone: nothing waits on its barrier any more.
    pub fn owner_gone(&mut self, owners: &mut Owners<u64>, owner: u64) {
        owners.drop_barrier(BarrierId::of_owner(owner));
    }

    pub fn counts(&self) -> &Playback {
        &self.counts
    }

    pub fn late_admitted(&self) -> u64 {
        self.late_admitted
    }
}

/// The request completes at the sink: its last chunk was played.
pub(crate) fn complete(owners: &mut Owners<u64>, id: u64) -> Step {
    owners
        .finish(&id, Disposition::Completed)
        .map_err(Stop::controller(id))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chunk_is_ready_every_chunk_tokens_and_at_the_last_token() {
        let cfg = PlaybackConfig {
            chunk_tokens: 3,
            ..PlaybackConfig::default()
        };
        let mut sink = PlaybackSink::new(&cfg, 1);
        let mut c = Chunks::default();
        let ready: Vec<bool> = (1..=7).map(|i| sink.token(&mut c, i == 7)).collect();
        assert_eq!(ready, [false, false, true, false, false, true, true]);
        assert_eq!(sink.counts().chunks, 3);
        sink.settle(&mut c);
        assert_eq!((c.admitted(), sink.counts().suppressed), (3, 3));
        assert!(!c.busy());
    }

    fn who() -> Owner {
        Owner {
            id: 1,
            owner: 1,
            generation: 0,
            output_done: false,
        }
    }

    #[test]
    #[should_panic(expected = "never made")]
    fn a_chunk_held_before_it_was_made() {
        let mut sink = PlaybackSink::new(&PlaybackConfig::default(), 1);
        let (mut f, mut owners) = (Follow::default(), Owners::default());
        let _ = sink.hold(&mut f, &mut owners, who(), 0, &mut Chunks::default());
    }

    #[test]
    #[should_panic(expected = "while another one was")]
    fn two_chunks_held_at_once() {
        let cfg = PlaybackConfig {
            chunk_tokens: 1,
            ..PlaybackConfig::default()
        };
        let mut sink = PlaybackSink::new(&cfg, 1);
        let (mut f, mut owners) = (Follow::default(), Owners::default());
        owners.start(1, 0).unwrap();
        let mut c = Chunks::default();
        assert!(sink.token(&mut c, false));
        let held = sink.hold(&mut f, &mut owners, who(), 0, &mut c);
        assert!(matches!(held, Ok(Hold::Waiting | Hold::Now(_))));
        sink.token(&mut c, false);
        let _ = sink.hold(&mut f, &mut owners, who(), 0, &mut c);
    }
}

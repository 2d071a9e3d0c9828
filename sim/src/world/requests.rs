//! The requests in the system: a slab indexed by the `tag` the replicas echo back, so no hash
//! lookup happens per token. A request's record is split by the component that owns each part:
//! its lifecycle and costs in `life`, its chunks in `playback`, its cancel path in
//! `cancel_state` (boxed at its first change).

use cancelsim_models::ownership::EvidenceLevel;
use cancelsim_models::sparse::Sparse;

use super::cancel::CancelState;
use super::playback::{Chunks, Owner};
use crate::scenario::Stage;
use crate::workload::{Arrival, STOP_OVERRUN_MAX, TOKENS_MAX};

pub(crate) use super::event::Tag;
pub(crate) use super::life::{Cost, Life};

/// The conversation turn a request belongs to: (conversation, generation).
pub(crate) type TurnRef = (u64, u32);

/// A request in the system.
#[derive(Clone, Debug)]
pub(crate) struct Req {
    pub id: u64,
    pub live: bool,
    /// The controller has its record (`registry`): until then the record is implied.
    registered: bool,
    pub arrival_ns: u64,
    pub prompt: u32,
    pub output: u32,
    /// The output ends at a stop string: the frontend's abort reaches the engine this long
    /// after the last token comes out (`NO_STOP`: it has none).
    stop_detect_ns: u64,
    /// That abort was sent: the engine's observation of it is no one's cancel.
    pub stop_abort: bool,
    pub replica: u32,
    /// Its conversation turn, if it has one (`conv()`): its owner and generation follow from
    /// it, and its handle from those (`CancelClient::handle`), so none is stored twice. Not an
    /// `Option<(u64, u32)>`, which takes 24 bytes.
    in_conv: bool,
    conv_id: u64,
    conv_generation: u32,
    pub life: Life,
    pub chunks: Chunks,
    pub cost: Cost,
    /// Its cancel path, boxed at its first change: most requests never have one, and a
    /// waiting request reads as `CancelState::NEW` until then.
    cancel: Sparse<CancelState>,
}

/// `stop_detect_ns` of a request without a stop string (no delay is that long: it is added to
/// the clock).
const NO_STOP: u64 = u64::MAX;

/// What every request without a cancel path of its own reads.
static CANCEL_NEW: CancelState = CancelState::NEW;

impl Req {
    /// A request just arrived at `now_ns`, with nothing decided about it yet.
    pub fn new(a: &Arrival, now_ns: u64) -> Req {
        Req {
            id: a.id,
            live: true,
            registered: false,
            arrival_ns: now_ns,
            prompt: a.prompt_tokens,
            output: a.output_tokens,
            stop_detect_ns: NO_STOP,
            stop_abort: false,
            replica: 0,
            in_conv: false,
            conv_id: 0,
            conv_generation: 0,
            life: Life::default(),
            chunks: Chunks::default(),
            cost: Cost::default(),
            cancel: Sparse::default(),
        }
    }

    /// A request arriving at `now_ns`, with what the world decided about it at once.
    pub fn arriving(a: &Arrival, now_ns: u64, d: Arriving) -> Req {
        assert!(
            d.stop_detect_ns != Some(NO_STOP),
            "a stop string detected never"
        );
        let mut q = Req {
            replica: d.replica,
            in_conv: d.conv.is_some(),
            conv_id: d.conv.map_or(0, |(c, _)| c),
            conv_generation: d.conv.map_or(0, |(_, g)| g),
            stop_detect_ns: d.stop_detect_ns.unwrap_or(NO_STOP),
            ..Req::new(a, now_ns)
        };
        if d.plan.is_some() {
            // A storm's target: its plan is its cancel path's first state.
            *q.cancel_mut() = CancelState::new(d.plan);
        }
        q
    }

    pub fn registered(&self) -> bool {
        self.registered
    }

    /// The controller made its record.
    pub fn register(&mut self) {
        assert!(!self.registered, "a request registered twice");
        self.registered = true;
    }

    /// Its conversation turn: (conversation, generation).
    pub fn conv(&self) -> Option<TurnRef> {
        self.in_conv.then_some((self.conv_id, self.conv_generation))
    }

    /// Who its output belongs to: its conversation, or itself.
    pub fn owner(&self) -> u64 {
        self.conv().map_or(self.id, |(c, _)| c)
    }

    /// Its conversation's generation when it started (0 outside a conversation).
    pub fn generation(&self) -> u32 {
        self.conv().map_or(0, |(_, g)| g)
    }

    /// The stop string's detection delay, if its output ends at one.
    pub fn stop_detect_ns(&self) -> Option<u64> {
        (self.stop_detect_ns != NO_STOP).then_some(self.stop_detect_ns)
    }

    pub fn cancel(&self) -> &CancelState {
        self.cancel.get(&CANCEL_NEW)
    }

    pub fn cancel_mut(&mut self) -> &mut CancelState {
        self.cancel.get_mut()
    }

    /// Its costs to charge a step to, and its cancel path, which decides what is leaked.
    pub fn cost_and_cancel(&mut self) -> (&mut Cost, &CancelState) {
        let cancel = self.cancel.get(&CANCEL_NEW);
        (&mut self.cost, cancel)
    }

    /// Its cancel path, if anything ever happened on it: for the transitions that change
    /// nothing on a fresh one (settling, the backend acting), which need not box one.
    pub fn cancel_if_any(&mut self) -> Option<&mut CancelState> {
        self.cancel.if_any()
    }

    /// It left: only its tag's slot remains, for the next arrival.
    fn leave(&mut self) {
        self.live = false;
        self.cancel.clear();
        self.chunks = Chunks::default();
        self.cost = Cost::default();
        self.life.forget_times();
    }

    /// Routed to `replica` (a shared queue routes once it is past its arrival).
    pub fn route(&mut self, replica: u32) {
        assert!(
            !self.life.enqueued(),
            "a request was routed after it was enqueued"
        );
        self.replica = replica;
    }

    /// Across the link: the decode replica `decode` has it from now.
    pub fn hand_to_decode(&mut self, decode: u32) {
        assert!(
            self.life.in_handoff(),
            "a request went to a decode stage outside a handoff"
        );
        self.replica = decode;
    }

    /// The frontend sent the abort that ends its output at a stop string.
    pub fn abort_at_stop(&mut self) {
        assert!(
            self.stop_detect_ns().is_some(),
            "a stop-string abort without a stop string"
        );
        self.stop_abort = true;
    }

    /// Its evidence timeline in virtual ns (unknown: `None`).
    pub fn evidence_ns(&self, level: EvidenceLevel) -> Option<u64> {
        self.cancel().evidence(level)
    }

    /// Who its chunks belong to, as the playback sink needs it.
    pub fn chunk_owner(&self) -> Owner {
        Owner {
            id: self.id,
            owner: self.owner(),
            generation: self.generation(),
            output_done: self.output_done(),
        }
    }

    /// Output tokens the engine is asked for: past a stop string it does not know the end, and
    /// would run to the request's `max_tokens`.
    pub fn engine_output(&self) -> u32 {
        match self.stop_detect_ns() {
            Some(_) => self.output.saturating_add(STOP_OVERRUN_MAX).min(TOKENS_MAX),
            None => self.output,
        }
    }

    /// All its output tokens are out.
    pub fn output_done(&self) -> bool {
        self.life.tokens() == self.output
    }
}

/// What the world decides about a request as it arrives.
pub(crate) struct Arriving {
    /// Its replica, if routed at once (else 0 until a shared queue routes it).
    pub replica: u32,
    pub conv: Option<TurnRef>,
    pub stop_detect_ns: Option<u64>,
    /// The storm's plan for it, if it is a target.
    pub plan: Option<(Stage, u64)>,
}

/// The slab: live requests by tag, and the tags free for reuse. Paged, so a million waiting
/// requests cost what they hold.
#[derive(Default)]
pub(crate) struct Requests {
    slab: Vec<Req>,
    free: Vec<Tag>,
    /// Live entries, counted by the slab itself (Little's law integrates it).
    live: u64,
}

impl Requests {
    pub fn insert(&mut self, req: Req) -> Tag {
        self.live += 1;
        match self.free.pop() {
            Some(t) => {
                self[t] = req;
                t
            }
            None => {
                self.slab.push(req);
                (self.slab.len() - 1) as Tag
            }
        }
    }

    /// The live request behind `(id, tag)`, if that request is still here.
    pub fn live(&self, id: u64, tag: Tag) -> bool {
        self.slab
            .get(tag as usize)
            .is_some_and(|q| q.live && q.id == id)
    }

    /// The request leaves: its tag is free for the next arrival.
    pub fn remove(&mut self, tag: Tag) {
        assert!(self[tag].live, "a request left twice");
        // Its boxed part goes now, not when the tag is reused: memory follows the requests in
        // the system, not those that left.
        self[tag].leave();
        self.free.push(tag);
        self.live -= 1;
    }

    pub fn live_count(&self) -> u64 {
        self.live
    }

    /// Ids of requests still live (at most `n`), for a conservation report.
    pub fn live_ids(&self, n: usize) -> Vec<u64> {
        self.slab
            .iter()
            .filter(|q| q.live)
            .map(|q| q.id)
            .take(n)
            .collect()
    }
}

impl std::ops::Index<Tag> for Requests {
    type Output = Req;
    fn index(&self, tag: Tag) -> &Req {
        &self.slab[tag as usize]
    }
}

impl std::ops::IndexMut<Tag> for Requests {
    fn index_mut(&mut self, tag: Tag) -> &mut Req {
        &mut self.slab[tag as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req() -> Req {
        let a = Arrival {
            id: 1,
            time_ns: 0,
            prompt_tokens: 1,
            output_tokens: 1,
        };
        Req::new(&a, 0)
    }

    #[test]
    fn a_waiting_request_stays_small() {
        // Every request in the system has one: a million waiting ones fit 300 MB only if each
        // part stays this size (`tests/backlog.rs` measures the whole).
        use std::mem::size_of;
        assert!(size_of::<Req>() <= 104, "Req is {} bytes", size_of::<Req>());
        assert!(
            size_of::<Life>() <= 24,
            "Life is {} bytes",
            size_of::<Life>()
        );
        assert_eq!(
            size_of::<Chunks>(),
            8,
            "chunks are boxed at the first token"
        );
        assert_eq!(size_of::<Cost>(), 8, "costs are boxed at the first");
    }

    #[test]
    #[should_panic(expected = "routed after it was enqueued")]
    fn routed_once_enqueued() {
        let mut q = req();
        q.route(1);
        q.life.enqueue(0);
        q.route(2);
    }

    #[test]
    #[should_panic(expected = "outside a handoff")]
    fn to_a_decode_stage_without_a_handoff() {
        req().hand_to_decode(1);
    }

    #[test]
    #[should_panic(expected = "without a stop string")]
    fn a_stop_abort_without_a_stop_string() {
        req().abort_at_stop();
    }

    #[test]
    #[should_panic(expected = "registered twice")]
    fn a_record_made_twice() {
        let mut q = req();
        q.register();
        q.register();
    }

    #[test]
    #[should_panic(expected = "left twice")]
    fn a_tag_removed_twice() {
        let mut r = Requests::default();
        let t = r.insert(req());
        r.remove(t);
        r.remove(t);
    }
}

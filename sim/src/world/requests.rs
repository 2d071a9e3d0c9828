//! The requests in the system: a slab indexed by the `tag` the replicas echo back, so no hash
//! lookup happens per token. A request's record is split by the component that owns each part:
//! its lifecycle and costs in `life`, its chunks in `playback`, its cancel path in `cancel`.

use cancelsim_models::ownership::EvidenceLevel;
use cancelsim_models::protocol::Handle;

use super::cancel::CancelState;
use super::playback::{Chunks, Owner};
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
    pub arrival_ns: u64,
    pub prompt: u32,
    pub output: u32,
    /// The output ends at a stop string: the frontend's abort reaches the engine this long
    /// after the last token comes out.
    pub stop_detect_ns: Option<u64>,
    /// That abort was sent: the engine's observation of it is no one's cancel.
    pub stop_abort: bool,
    pub replica: u32,
    pub owner: u64,
    pub generation: u32,
    pub handle: Handle,
    pub conv: Option<TurnRef>,
    pub life: Life,
    pub chunks: Chunks,
    pub cancel: CancelState,
    pub cost: Cost,
}

impl Req {
    /// A request just arrived at `now_ns`, with nothing decided about it yet.
    pub fn new(a: &Arrival, now_ns: u64, owner: u64, generation: u32) -> Req {
        Req {
            id: a.id,
            live: true,
            arrival_ns: now_ns,
            prompt: a.prompt_tokens,
            output: a.output_tokens,
            stop_detect_ns: None,
            stop_abort: false,
            replica: 0,
            owner,
            generation,
            handle: Handle::default(),
            conv: None,
            life: Life::default(),
            chunks: Chunks::default(),
            cancel: CancelState::default(),
            cost: Cost::default(),
        }
    }

    /// Its evidence timeline in virtual ns (unknown: `None`).
    pub fn evidence_ns(&self, level: EvidenceLevel) -> Option<u64> {
        self.cancel.evidence(level)
    }

    /// Who its chunks belong to, as the playback sink needs it.
    pub fn chunk_owner(&self) -> Owner {
        Owner {
            id: self.id,
            owner: self.owner,
            generation: self.generation,
            output_done: self.output_done(),
        }
    }

    /// All its output tokens are out.
    /// Output tokens the engine is asked for: past a stop string it does not know the end, and
    /// would run to the request's `max_tokens`.
    pub fn engine_output(&self) -> u32 {
        match self.stop_detect_ns {
            Some(_) => self.output.saturating_add(STOP_OVERRUN_MAX).min(TOKENS_MAX),
            None => self.output,
        }
    }

    pub fn output_done(&self) -> bool {
        self.life.tokens() == self.output
    }
}

/// The slab: live requests by tag, and the tags free for reuse.
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
                self.slab[t as usize] = req;
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
        debug_assert!(self.slab[tag as usize].live);
        self.slab[tag as usize].live = false;
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

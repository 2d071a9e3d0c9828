//! A stage's cleanup owner: KV blocks that a stage keeps for a request after its own work on it
//! ended (a prefill node's blocks waiting to be sent, a decode node's blocks waiting for a
//! remote write), and the only ways they come back.
//!
//! Blocks are held until one of:
//! - every pending completion notice has arrived (a send, a receive);
//! - an observed cancel, if the stage may release on one (a decode node may not while a remote
//!   write can still land: vLLM #32255);
//! - the lease runs out (`Reclaim::Lease`: vLLM's NIXL abort timeout, 120 s or 480 s, or a
//!   30 s lease).
//!
//! A lease never frees blocks under a live transfer: while a transfer reads or writes a hold's
//! blocks (`reading`) its lease is suspended, and when the transfer ends (`read_done`) the lease
//! runs again, whole, from there. So a lease shorter than the transfer cannot hand a block that
//! is still being read, or still being written into, to another request (vLLM #32255).
//!
//! With `Reclaim::Never`, a lost notice leaks the blocks until the end of the run (vLLM
//! #46283). With `Completions::FirstFrees`, the first of two pending notices frees the request
//! and the second finds nothing, which faults the engine (vLLM #46240).
//!
//! Sans-IO: every call takes `now` and returns what happened; `timer_ns` says when to call
//! `expire` next. It keeps its own books: blocks held, their peak, and block-nanoseconds.

use std::collections::{BTreeMap, BTreeSet};

/// When held blocks come back without their completion notices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reclaim {
    /// Never: a lost notice leaks the blocks until the end of the run.
    Never,
    /// `lease_ns` after the hold began, plus `grace_ns`.
    Lease { lease_ns: u64, grace_ns: u64 },
}

/// How pending completion notices are counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Completions {
    /// The last pending notice frees the request; a notice for a request not held is ignored.
    Counted,
    /// The first notice frees the request; a later one for it faults the engine.
    FirstFrees,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CleanupConfig {
    pub reclaim: Reclaim,
    pub completions: Completions,
    /// Whether an observed cancel releases the blocks at once.
    pub release_on_cancel: bool,
}

/// Why blocks came back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Why {
    Completed,
    Cancelled,
    LeaseExpired,
    /// Still held when the run ended.
    Abandoned,
}

/// Blocks handed back to the pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Returned {
    pub id: u64,
    pub blocks: u64,
    pub why: Why,
}

/// What a completion notice did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Notice {
    /// One of several pending notices: the blocks stay.
    Pending,
    Returned(Returned),
    /// For a request not held here (already freed, never held): ignored.
    Ignored,
    /// For a request the first notice already freed, under `FirstFrees`: the engine dies.
    Fault,
}

#[derive(Clone, Copy, Debug)]
struct Hold {
    blocks: u64,
    pending: u32,
    deadline_ns: Option<u64>,
    /// A transfer reads or writes the blocks now: no lease runs, and a cancel waits for its end.
    busy: bool,
    /// A cancel came while `busy`.
    cancelled: bool,
}

/// What the end of a transfer over a hold's blocks did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadDone {
    /// Nothing: the request is not held here, or no transfer was reading its blocks.
    Nothing,
    /// Its lease (if the stage has leases) runs again, whole, from now.
    Resumed,
    /// A cancel came while the transfer ran: the blocks come back now.
    Returned(Returned),
}

/// Requests freed by a first notice with another still due, kept to recognise it, at most.
pub const FREED_KEPT_MAX: usize = 1 << 16;

/// The blocks one stage holds for requests, and how they come back.
pub struct CleanupOwner {
    cfg: CleanupConfig,
    holds: BTreeMap<u64, Hold>,
    /// (deadline, id) of every hold with a lease, earliest first.
    deadlines: BTreeSet<(u64, u64)>,
    /// Under `FirstFrees`: requests freed with notices still due (bounded, oldest dropped).
    freed_early: BTreeSet<u64>,
    blocks_held: u64,
    blocks_peak: u64,
    /// Integral of blocks held over time, and when it was last brought up to date.
    block_ns: u128,
    since_ns: u64,
}

impl CleanupOwner {
    pub fn new(cfg: CleanupConfig) -> Self {
        CleanupOwner {
            cfg,
            holds: BTreeMap::new(),
            deadlines: BTreeSet::new(),
            freed_early: BTreeSet::new(),
            blocks_held: 0,
            blocks_peak: 0,
            block_ns: 0,
            since_ns: 0,
        }
    }

    /// Bring the block-time integral up to `now`.
    fn advance(&mut self, now_ns: u64) {
        assert!(now_ns >= self.since_ns, "time goes forward");
        self.block_ns += self.blocks_held as u128 * (now_ns - self.since_ns) as u128;
        self.since_ns = now_ns;
    }

    /// Start holding `blocks` for request `id` until `pending` completion notices arrive (or a
    /// cancel, or the lease). A request is held once.
    pub fn hold(&mut self, now_ns: u64, id: u64, blocks: u64, pending: u32) {
        assert!(pending > 0, "a hold waits for at least one notice");
        assert!(!self.holds.contains_key(&id), "request {id} held twice");
        self.advance(now_ns);
        let deadline_ns = self.lease_from(now_ns);
        if let Some(d) = deadline_ns {
            self.deadlines.insert((d, id));
        }
        self.holds.insert(
            id,
            Hold {
                blocks,
                pending,
                deadline_ns,
                busy: false,
                cancelled: false,
            },
        );
        self.blocks_held += blocks;
        self.blocks_peak = self.blocks_peak.max(self.blocks_held);
        debug_assert!(
            self.deadlines.len() <= self.holds.len(),
            "one deadline per hold, at most"
        );
    }

    /// When a lease that starts at `now` runs out, under a lease.
    fn lease_from(&self, now_ns: u64) -> Option<u64> {
        match self.cfg.reclaim {
            Reclaim::Never => None,
            Reclaim::Lease { lease_ns, grace_ns } => {
                Some(now_ns.saturating_add(lease_ns).saturating_add(grace_ns))
            }
        }
    }

    /// Whether request `id` is held here.
    pub fn holds(&self, id: u64) -> bool {
        self.holds.contains_key(&id)
    }

    /// A transfer reads or writes `id`'s held blocks from now: its lease stops until the
    /// transfer ends. Nothing for a request not held.
    pub fn reading(&mut self, id: u64) {
        let Some(h) = self.holds.get_mut(&id) else {
            return;
        };
        assert!(
            !h.busy,
            "request {id}'s blocks are under one transfer at a time"
        );
        h.busy = true;
        if let Some(d) = h.deadline_ns.take() {
            let had = self.deadlines.remove(&(d, id));
            debug_assert!(had, "a deadline is indexed");
        }
    }

    /// The transfer over `id`'s blocks ended now: a cancel that came meanwhile frees them now;
    /// otherwise their lease, if any, runs again from here.
    pub fn read_done(&mut self, now_ns: u64, id: u64) -> ReadDone {
        let deadline_ns = self.lease_from(now_ns);
        let Some(h) = self.holds.get_mut(&id).filter(|h| h.busy) else {
            return ReadDone::Nothing;
        };
        h.busy = false;
        debug_assert!(h.deadline_ns.is_none(), "no lease runs under a transfer");
        if h.cancelled {
            self.advance(now_ns);
            return ReadDone::Returned(self.take(id, Why::Cancelled).expect("held"));
        }
        h.deadline_ns = deadline_ns;
        if let Some(d) = deadline_ns {
            self.deadlines.insert((d, id));
        }
        ReadDone::Resumed
    }

    fn take(&mut self, id: u64, why: Why) -> Option<Returned> {
        let h = self.holds.remove(&id)?;
        if let Some(d) = h.deadline_ns {
            self.deadlines.remove(&(d, id));
        }
        self.blocks_held -= h.blocks;
        Some(Returned {
            id,
            blocks: h.blocks,
            why,
        })
    }

    /// A completion notice for `id` arrived.
    pub fn notice(&mut self, now_ns: u64, id: u64) -> Notice {
        self.advance(now_ns);
        let Some(h) = self.holds.get_mut(&id) else {
            if self.cfg.completions == Completions::FirstFrees && self.freed_early.remove(&id) {
                return Notice::Fault;
            }
            return Notice::Ignored;
        };
        debug_assert!(
            !h.busy,
            "a completion notice comes after its transfer ended"
        );
        h.pending -= 1;
        let more = h.pending;
        match self.cfg.completions {
            Completions::Counted if more > 0 => return Notice::Pending,
            Completions::FirstFrees if more > 0 => {
                if self.freed_early.len() >= FREED_KEPT_MAX {
                    self.freed_early.pop_first();
                }
                self.freed_early.insert(id);
            }
            _ => {}
        }
        Notice::Returned(self.take(id, Why::Completed).expect("held"))
    }

    /// The stage observed a cancel of `id`: its blocks come back if the stage may release on
    /// one. Blocks under a live transfer come back only when it ends (`read_done`).
    pub fn cancel(&mut self, now_ns: u64, id: u64) -> Option<Returned> {
        self.advance(now_ns);
        if !self.cfg.release_on_cancel {
            return None;
        }
        if let Some(h) = self.holds.get_mut(&id).filter(|h| h.busy) {
            h.cancelled = true;
            return None;
        }
        self.take(id, Why::Cancelled)
    }

    /// The ideal cancel: `id`'s blocks come back now, whatever the stage's rules and whatever
    /// notices are still due. `None` if it is not held.
    pub fn release(&mut self, now_ns: u64, id: u64) -> Option<Returned> {
        self.advance(now_ns);
        self.take(id, Why::Cancelled)
    }

    /// When the lease of `id`'s hold runs out, if it is held under a lease.
    pub fn deadline_ns(&self, id: u64) -> Option<u64> {
        self.holds.get(&id).and_then(|h| h.deadline_ns)
    }

    /// When `expire` must next be called, if ever.
    pub fn timer_ns(&self) -> Option<u64> {
        self.deadlines.first().map(|&(d, _)| d)
    }

    /// Leases that ran out by `now`, in deadline order.
    pub fn expire(&mut self, now_ns: u64) -> Vec<Returned> {
        let mut out = Vec::new();
        while let Some(&(d, id)) = self.deadlines.first() {
            if d > now_ns {
                break;
            }
            // Each expiry is accounted at its own deadline.
            self.advance(d.max(self.since_ns));
            debug_assert!(!self.holds[&id].busy, "no lease runs under a transfer");
            out.push(
                self.take(id, Why::LeaseExpired)
                    .expect("a deadline has its hold"),
            );
        }
        self.advance(now_ns);
        out
    }

    /// The run is over. A hold under a lease is settled as if the lease ran out: its block-ns run
    /// to its deadline, and it comes back `LeaseExpired` (nothing else could have happened to it:
    /// no event is left). A hold without one is given up, `Abandoned`: never returned. (A hold
    /// under a transfer has its lease from now: no transfer outlives a run that ends normally.)
    pub fn release_all(&mut self, now_ns: u64) -> Vec<Returned> {
        self.advance(now_ns);
        let ids: Vec<u64> = self.holds.keys().copied().collect();
        let out = ids
            .into_iter()
            .map(|id| {
                let h = self.holds[&id];
                let deadline_ns = match h.busy {
                    true => self.lease_from(now_ns),
                    false => h.deadline_ns,
                };
                let why = match deadline_ns {
                    Some(d) => {
                        let rest_ns = d.saturating_sub(now_ns) as u128;
                        self.block_ns += h.blocks as u128 * rest_ns;
                        Why::LeaseExpired
                    }
                    None => Why::Abandoned,
                };
                self.take(id, why).expect("held")
            })
            .collect();
        debug_assert_eq!(self.blocks_held, 0);
        out
    }

    pub fn blocks_held(&self) -> u64 {
        self.blocks_held
    }

    pub fn blocks_peak(&self) -> u64 {
        self.blocks_peak
    }

    /// Block-nanoseconds held up to `now`, exactly.
    pub fn block_ns(&mut self, now_ns: u64) -> u128 {
        self.advance(now_ns);
        self.block_ns
    }

    /// Block-seconds held up to `now`.
    pub fn block_s(&mut self, now_ns: u64) -> f64 {
        self.block_ns(now_ns) as f64 / 1e9
    }

    /// Requests still held (at the end of a run: never returned).
    pub fn held(&self) -> usize {
        self.holds.len()
    }
}

#[cfg(test)]
mod tests;

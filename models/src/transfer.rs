//! KV transfers over one link, from a prefill stage to a decode stage: one wire, first come
//! first served. A transfer's time on the wire is its bytes at the link's bandwidth; it starts
//! when the wire is free and lands `latency` after it leaves. Until a transfer is terminal
//! (done, failed or cancelled) its blocks are held on both sides: the sender's because they
//! are being read, the receiver's because a write can still land.
//!
//! A cancel either ends a transfer at once (`CancelMode::AtOnce`, the wire time already
//! posted stays spent) or marks it and lets it end, as cancelled, when it would have landed
//! (`CancelMode::AtTransferEnd`: release KV only once the transfer is terminal, the
//! TensorRT-LLM #13713 fix).
//!
//! Sans-IO: calls take `now`; `timer_ns` says when to call `land` next. Whether a transfer
//! fails (the link's loss) is drawn by the caller, which owns the random streams.

use std::collections::{BTreeMap, BTreeSet};

use crate::topology::Link;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CancelMode {
    AtOnce,
    AtTransferEnd,
}

/// How a transfer ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    Done,
    Failed,
    Cancelled,
}

/// A terminal transfer: both sides may return its blocks now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ended {
    pub id: u64,
    pub end: End,
    pub blocks: u64,
    /// Time from `start` to the end.
    pub took_ns: u64,
}

#[derive(Clone, Copy, Debug)]
struct Flight {
    started_ns: u64,
    lands_ns: u64,
    blocks: u64,
    fails: bool,
    cancelled: bool,
}

/// Counts of one link's transfers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TransferStats {
    pub started: u64,
    pub done: u64,
    pub failed: u64,
    pub cancelled: u64,
    pub bytes: u128,
    /// Time transfers waited for the wire, summed.
    pub wait_ns: u128,
}

/// Transfers in flight on one link, at most.
impl TransferStats {
    /// Sum another link's counters into these.
    pub fn add(&mut self, s: &TransferStats) {
        self.started += s.started;
        self.done += s.done;
        self.failed += s.failed;
        self.cancelled += s.cancelled;
        self.bytes += s.bytes;
        self.wait_ns += s.wait_ns;
    }
}

pub const IN_FLIGHT_MAX: usize = 1 << 20;

/// The transfers of one link.
pub struct Transfers {
    link: Link,
    mode: CancelMode,
    /// When the wire is free to send the next transfer's first byte.
    wire_free_ns: u64,
    flights: BTreeMap<u64, Flight>,
    /// (lands, id), earliest first.
    landing: BTreeSet<(u64, u64)>,
    stats: TransferStats,
}

impl Transfers {
    pub fn new(link: Link, mode: CancelMode) -> Self {
        Transfers {
            link,
            mode,
            wire_free_ns: 0,
            flights: BTreeMap::new(),
            landing: BTreeSet::new(),
            stats: TransferStats::default(),
        }
    }

    /// Queue transfer `id` of `bytes` (holding `blocks` on each side). `fails`: the caller's
    /// draw of the link's loss; a failed transfer ends, failed, when it would have landed.
    /// Returns when it lands.
    pub fn start(&mut self, now_ns: u64, id: u64, bytes: u64, blocks: u64, fails: bool) -> u64 {
        assert!(
            !self.flights.contains_key(&id),
            "transfer {id} started twice"
        );
        assert!(
            self.flights.len() < IN_FLIGHT_MAX,
            "a link's transfers are bounded"
        );
        let leaves_ns = self.wire_free_ns.max(now_ns);
        let wire = Link {
            latency_ns: 0,
            ..self.link
        };
        self.wire_free_ns = leaves_ns.saturating_add(wire.transfer_ns(bytes));
        let lands_ns = self.wire_free_ns.saturating_add(self.link.latency_ns);
        self.stats.started += 1;
        self.stats.bytes += bytes as u128;
        self.stats.wait_ns += (leaves_ns - now_ns) as u128;
        self.flights.insert(
            id,
            Flight {
                started_ns: now_ns,
                lands_ns,
                blocks,
                fails,
                cancelled: false,
            },
        );
        self.landing.insert((lands_ns, id));
        lands_ns
    }

    fn end(&mut self, now_ns: u64, id: u64, end: End) -> Ended {
        let f = self.flights.remove(&id).expect("a transfer in flight");
        self.landing.remove(&(f.lands_ns, id));
        match end {
            End::Done => self.stats.done += 1,
            End::Failed => self.stats.failed += 1,
            End::Cancelled => self.stats.cancelled += 1,
        }
        Ended {
            id,
            end,
            blocks: f.blocks,
            took_ns: now_ns - f.started_ns,
        }
    }

    /// Cancel transfer `id`: ended now (`AtOnce`), or marked to end cancelled when it lands.
    /// Nothing for a transfer not in flight.
    pub fn cancel(&mut self, now_ns: u64, id: u64) -> Option<Ended> {
        let f = self.flights.get_mut(&id)?;
        match self.mode {
            CancelMode::AtOnce => Some(self.end(now_ns, id, End::Cancelled)),
            CancelMode::AtTransferEnd => {
                f.cancelled = true;
                None
            }
        }
    }

    /// The ideal cancel: transfer `id` ends now, cancelled, whatever the mode (the wire time
    /// already posted stays spent, as with `AtOnce`). Nothing for a transfer not in flight.
    pub fn stop(&mut self, now_ns: u64, id: u64) -> Option<Ended> {
        self.flights
            .contains_key(&id)
            .then(|| self.end(now_ns, id, End::Cancelled))
    }

    /// Whether transfer `id` is in flight (not yet terminal).
    pub fn in_flight(&self, id: u64) -> bool {
        self.flights.contains_key(&id)
    }

    /// Whether the wire holds `IN_FLIGHT_MAX` transfers: `start` would refuse another.
    pub fn is_full(&self) -> bool {
        self.flights.len() >= IN_FLIGHT_MAX
    }

    /// When `land` must next be called, if ever.
    pub fn timer_ns(&self) -> Option<u64> {
        self.landing.first().map(|&(t, _)| t)
    }

    /// The transfers that end by `now`, in landing order.
    pub fn land(&mut self, now_ns: u64) -> Vec<Ended> {
        let mut out = Vec::new();
        while let Some(&(t, id)) = self.landing.first() {
            if t > now_ns {
                break;
            }
            let f = self.flights[&id];
            let end = if f.cancelled {
                End::Cancelled
            } else if f.fails {
                End::Failed
            } else {
                End::Done
            };
            out.push(self.end(t, id, end));
        }
        out
    }

    /// Blocks held for transfers not yet terminal (on each side).
    pub fn blocks_in_flight(&self) -> u64 {
        self.flights.values().map(|f| f.blocks).sum()
    }

    pub fn stats(&self) -> TransferStats {
        self.stats
    }
}

#[cfg(test)]
mod tests;

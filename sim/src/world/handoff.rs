//! The handoff between a prefill stage and a decode stage: the requests between them, the KV
//! transfers on each prefill replica's wire, and each side's cleanup owner. The rules live in
//! the models (`cleanup`, `transfer`); this component holds their instances, keyed by replica,
//! and the books of the handoff. `disagg.rs` says what follows each event.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use cancelsim_models::cleanup::{CleanupOwner, Returned, Why};
use cancelsim_models::topology::{Link, PrefillDecode};
use cancelsim_models::transfer::{CancelMode, TransferStats, Transfers};

use super::event::Tag;
use crate::kernel::rng::{Purpose, Stream};
use crate::metrics::{HandoffStats, SideStats};
use crate::scenario::{AbortOrder, CompletionsSpec, HandoffSpec, Scenario, TransferCancel};

/// KV bytes per token of a `Custom` profile's model, unless the handoff says: Llama-3.1-8B's
/// (32 layers × 8 KV heads × 128 dims × 2 (K and V) × 2 bytes).
const KV_BYTES_PER_TOKEN_CUSTOM: u64 = 131_072;

/// Where a request between the stages is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Its prefill is done and its blocks kept; it crosses the link to the decode stage.
    Gap,
    /// The decode stage took it and waits for blocks to receive its KV into.
    Receiving,
    /// Its KV is on the wire (or queued for it).
    OnWire,
}

/// A request between the prefill and the decode stage.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Flight {
    pub tag: Tag,
    pub prefill: u32,
    pub decode: u32,
    pub phase: Phase,
    /// Its prompt's KV blocks on the prefill side, and their bytes.
    pub blocks_prefill: u64,
    pub bytes: u64,
    pub blocks_decode: u64,
    /// The decode side aborted it while its KV was on the way.
    pub aborted: bool,
}

pub(crate) struct Handoff {
    pub cfg: HandoffSpec,
    pub link: Link,
    pub kv_bytes_per_token: u64,
    seed: u64,
    prefill_n: u32,
    /// One wire per prefill replica (its NIC): transfers leave it first come, first served.
    wires: Vec<Transfers>,
    /// Indexed by replica: the prefill replicas' owners first, then the decode replicas'.
    owners: Vec<CleanupOwner>,
    pub flights: BTreeMap<u64, Flight>,
    /// Per decode replica: requests waiting for receive blocks, first come first served.
    receiving: Vec<VecDeque<u64>>,
    /// Prefill replicas' requests whose final prefill step is done, until their blocks are back.
    pub prefilled: BTreeMap<u64, u32>,
    /// Requests to which an abort was delivered while they were still on a prefill engine.
    pub aborts_seen: BTreeSet<u64>,
    pub stats: HandoffStats,
    /// Holds settled at the end of the run: by their lease, and given up.
    pub settled: (u64, u64),
    /// Requests with blocks given up at the end of the run: cleanup pending.
    pub abandoned: BTreeSet<u64>,
}

impl Handoff {
    pub fn new(s: &Scenario, seed: u64, pd: PrefillDecode) -> Handoff {
        let cfg = s
            .cluster
            .topology
            .as_ref()
            .map(|t| t.handoff.clone())
            .unwrap_or_default();
        let mode = match cfg.transfer_cancel {
            TransferCancel::AtOnce => CancelMode::AtOnce,
            TransferCancel::AtTransferEnd | TransferCancel::AtTransferEndNoNotice => {
                CancelMode::AtTransferEnd
            }
        };
        let (p, d) = (pd.prefill_replicas, pd.decode_replicas);
        let owners = (0..p + d)
            .map(|r| CleanupOwner::new(cfg.cleanup(r >= p)))
            .collect();
        let kv_bytes_per_token = cfg.kv_bytes_per_token.unwrap_or_else(|| {
            let profile = s.cluster.profile.named();
            profile.map_or(KV_BYTES_PER_TOKEN_CUSTOM, |p| p.kv_bytes_per_token)
        });
        Handoff {
            link: pd.link,
            kv_bytes_per_token,
            seed,
            prefill_n: p,
            wires: (0..p).map(|_| Transfers::new(pd.link, mode)).collect(),
            owners,
            flights: BTreeMap::new(),
            receiving: vec![VecDeque::new(); d as usize],
            prefilled: BTreeMap::new(),
            aborts_seen: BTreeSet::new(),
            stats: HandoffStats::default(),
            settled: (0, 0),
            abandoned: BTreeSet::new(),
            cfg,
        }
    }

    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Whether a decode-side hold waits for two completions and faults on the second.
    pub fn second_completion(&self) -> bool {
        self.cfg.decode_completions == CompletionsSpec::FirstFrees
    }

    /// Whether the end of a transfer the decode side aborted notifies the prefill side.
    pub fn notifies_aborted_transfer(&self) -> bool {
        self.cfg.transfer_cancel != TransferCancel::AtTransferEndNoNotice
    }

    /// Whether a cancel stops a transfer on the wire (and so may wedge its sender).
    pub fn stops_on_the_wire(&self) -> bool {
        self.cfg.transfer_cancel == TransferCancel::AtOnce
    }

    pub fn aborts_first(&self) -> bool {
        self.cfg.abort_order == AbortOrder::BeforeOutput
    }

    /// Whether the handoff message `sub` of request `id` is lost on the link.
    pub fn lost(&mut self, id: u64, sub: u64) -> bool {
        let loss = self.link.loss;
        let lost = loss > 0.0
            && Stream::keyed(self.seed, Purpose::Handoff, id, sub).uniform_open01() < loss;
        self.stats.notices_lost += lost as u64;
        lost
    }

    pub fn owner(&mut self, replica: u32) -> &mut CleanupOwner {
        &mut self.owners[replica as usize]
    }

    /// Books blocks a cleanup owner gave back.
    pub fn returned(&mut self, replica: u32, r: &Returned) {
        let side = self.side(replica);
        match r.why {
            Why::Completed => side.returned_completed += 1,
            Why::Cancelled => side.returned_cancelled += 1,
            Why::LeaseExpired => side.returned_lease += 1,
            Why::Abandoned => side.blocks_never_returned += r.blocks,
        }
    }

    fn side(&mut self, replica: u32) -> &mut SideStats {
        match replica < self.prefill_n {
            true => &mut self.stats.prefill,
            false => &mut self.stats.decode,
        }
    }

    pub fn wire(&mut self, prefill: u32) -> &mut Transfers {
        &mut self.wires[prefill as usize]
    }

    pub fn queue(&mut self, decode: u32) -> &mut VecDeque<u64> {
        &mut self.receiving[(decode - self.prefill_n) as usize]
    }

    /// Whether some owner holds blocks under a lease.
    pub fn holds_leases(&self) -> bool {
        self.owners.iter().any(|o| o.timer_ns().is_some())
    }

    /// Why requests may never finish: blocks held for good by a cleanup owner. `None` if no
    /// owner holds any.
    pub fn stall(&self) -> Option<String> {
        let held: u64 = self.owners.iter().map(|o| o.blocks_held()).sum();
        (held > 0).then(|| {
            format!(
                "{held} KV blocks are held for notices that never came and no lease returns \
                 them (reclaim `Never`), so the work that needs them waits for good"
            )
        })
    }

    /// The run is over: what every owner still holds is never returned. Returns, per replica,
    /// the blocks to give back to its pool.
    pub fn finish(&mut self, now_ns: u64) -> Vec<(u32, u64)> {
        let mut back = Vec::new();
        for r in 0..self.owners.len() as u32 {
            let left = self.owners[r as usize].release_all(now_ns);
            for x in &left {
                self.returned(r, x);
                match x.why {
                    Why::LeaseExpired => self.settled.0 += 1,
                    _ => {
                        self.settled.1 += 1;
                        self.abandoned.insert(x.id);
                    }
                }
            }
            let blocks: u64 = left.iter().map(|x| x.blocks).sum();
            let (block_s, peak) = {
                let o = &mut self.owners[r as usize];
                (o.block_s(now_ns), o.blocks_peak())
            };
            let side = self.side(r);
            side.retained_block_s += block_s;
            side.retained_blocks_peak = side.retained_blocks_peak.max(peak);
            back.push((r, blocks));
        }
        let mut t = TransferStats::default();
        self.wires.iter().for_each(|w| t.add(&w.stats()));
        self.stats.transfers_started = t.started;
        self.stats.transfers_done = t.done;
        self.stats.transfers_cancelled = t.cancelled;
        self.stats.transfers_failed = t.failed;
        self.stats.transfer_bytes = t.bytes.min(u64::MAX as u128) as u64;
        self.stats.transfer_wait_s = t.wait_ns as f64 / 1e9;
        back
    }
}

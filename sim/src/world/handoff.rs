//! The handoff between a prefill stage and a decode stage: the requests between them, the KV
//! transfers on each prefill replica's wire, and each side's cleanup owner. The rules live in
//! the models (`cleanup`, `transfer`); this component holds their instances, keyed by replica,
//! and the books of the handoff. `disagg.rs` says what follows each event.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::ops::Range;

use cancelsim_models::cleanup::{CleanupOwner, Returned, Why};
use cancelsim_models::prefix::Sharing;
use cancelsim_models::protocol::ReplicaStats;
use cancelsim_models::topology::{Link, PrefillDecode, Role};
use cancelsim_models::transfer::{CancelMode, TransferStats, Transfers};

use super::event::Tag;
use crate::kernel::rng::{Purpose, Stream};
use crate::metrics::{HandoffStats, PoolSummary, SideStats};
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

/// What the handoff counts, one at a time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Count {
    AbortedAtBoundary,
    Stranded,
    KvReleasedBeforeTransfer,
    ReceiveWait,
    SecondCompletionFault,
    AbortedAwaitingKv,
    Wedge,
    LocalPrefill,
}

pub(crate) struct Handoff {
    cfg: HandoffSpec,
    /// The pools and the links between them.
    pd: PrefillDecode,
    /// Decode pools: each prefill replica has a wire to each. The first's index in the pools.
    decode_pools: usize,
    first_decode: usize,
    kv_bytes_per_token: u64,
    seed: u64,
    prefill_n: u32,
    /// One wire per prefill replica and decode pool (`wire_index`): transfers leave it first
    /// come, first served. With one decode pool, one per prefill replica (its NIC).
    wires: Vec<Transfers>,
    /// Indexed by replica: the prefill replicas' owners first, then the decode replicas'.
    owners: Vec<CleanupOwner>,
    flights: BTreeMap<u64, Flight>,
    /// Per decode replica: requests waiting for receive blocks, first come first served.
    receiving: Vec<VecDeque<u64>>,
    /// Prefill replicas' requests whose final prefill step is done, until their blocks are back.
    prefilled: BTreeMap<u64, u32>,
    /// Requests to which an abort was delivered while they were still on a prefill engine.
    aborts_seen: BTreeSet<u64>,
    stats: HandoffStats,
    /// Holds settled at the end of the run: by their lease, and given up.
    settled: (u64, u64),
    /// Requests with blocks given up at the end of the run: cleanup pending.
    abandoned: BTreeSet<u64>,
    /// Per (replica, request): the cached blocks its kept or receive blocks hold through the
    /// prefix cache (`pin_cached`), to give back the same way.
    kept: BTreeMap<(u32, u64), Box<[u64]>>,
    /// Per request in the system on a replica with a prefix cache: what its prompt shares,
    /// as its prefill engine keyed it (`remember_sharing`).
    sharing: BTreeMap<u64, Sharing>,
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
        let of = |role: Role| pd.pools.iter().filter(|x| x.role == role).count();
        let (first_decode, decode_pools) = (of(Role::Prefill), of(Role::Decode));
        let wire = |r: u32, j: usize| {
            // A pair with no link carries nothing: the router sends no request there.
            let link = pd.link(pd.pool_of(r), first_decode + j);
            Transfers::new(link.unwrap_or(Link::LOCAL), mode)
        };
        let wires = (0..p)
            .flat_map(|r| (0..decode_pools).map(move |j| (r, j)))
            .map(|(r, j)| wire(r, j))
            .collect();
        // Colocated replicas beside the pools hold nothing, but every replica index has one.
        let owners = (0..p + d + pd.colocated_replicas)
            .map(|r| CleanupOwner::new(cfg.cleanup(r >= p)))
            .collect();
        let kv_bytes_per_token = cfg.kv_bytes_per_token.unwrap_or_else(|| {
            let profile = s.cluster.profile.named();
            profile.map_or(KV_BYTES_PER_TOKEN_CUSTOM, |p| p.kv_bytes_per_token)
        });
        Handoff {
            decode_pools,
            first_decode,
            kv_bytes_per_token,
            seed,
            prefill_n: p,
            wires,
            pd,
            owners,
            flights: BTreeMap::new(),
            receiving: vec![VecDeque::new(); d as usize],
            prefilled: BTreeMap::new(),
            aborts_seen: BTreeSet::new(),
            stats: HandoffStats::default(),
            settled: (0, 0),
            abandoned: BTreeSet::new(),
            kept: BTreeMap::new(),
            sharing: BTreeMap::new(),
            cfg,
        }
    }

    pub fn seed(&self) -> u64 {
        self.seed
    }

    pub fn cfg(&self) -> &HandoffSpec {
        &self.cfg
    }

    /// The link between `prefill` and `decode`, or, before the decode replica is chosen,
    /// the prefill pool's nearest one (the lowest latency; the first written at a tie): the
    /// P-to-D gap crosses it, and so does a message the router sends the prefill side.
    pub fn link(&self, prefill: u32, decode: Option<u32>) -> Link {
        let p = self.pd.pool_of(prefill);
        if let Some(d) = decode {
            let link = self.pd.link(p, self.pd.pool_of(d));
            return link.expect("a request goes only where its prefill pool has a link");
        }
        let nearest = self.pd.decodes_of(p).filter_map(|d| self.pd.link(p, d));
        let link = nearest.min_by_key(|l| l.latency_ns);
        link.expect("validation: every prefill pool has a decode pool")
    }

    pub fn kv_bytes_per_token(&self) -> u64 {
        self.kv_bytes_per_token
    }

    pub fn count(&mut self, c: Count) {
        let s = &mut self.stats;
        match c {
            Count::AbortedAtBoundary => s.aborted_at_boundary += 1,
            Count::Stranded => s.stranded += 1,
            Count::KvReleasedBeforeTransfer => s.kv_released_before_transfer += 1,
            Count::ReceiveWait => s.receive_waits += 1,
            Count::SecondCompletionFault => s.second_completion_faults += 1,
            Count::AbortedAwaitingKv => s.aborted_awaiting_kv += 1,
            Count::Wedge => s.wedges += 1,
            Count::LocalPrefill => s.local_prefills += 1,
        }
    }

    /// The hang detector killed a sender wedged for `wedge_s`.
    pub fn hang_killed(&mut self, wedge_s: f64) {
        assert!(wedge_s >= 0.0, "a wedge of negative length: {wedge_s}");
        self.stats.hang_kills += 1;
        self.stats.wedge_s += wedge_s;
    }

    /// An abort reached request `id` on a prefill engine (it may still finish its prefill).
    pub fn abort_seen(&mut self, id: u64) {
        self.aborts_seen.insert(id);
    }

    /// Whether an abort reached `id` on its prefill engine; forgotten from now.
    pub fn take_abort_seen(&mut self, id: u64) -> bool {
        self.aborts_seen.remove(&id)
    }

    /// Request `id`'s final prefill step is done on `prefill`: its blocks come back next.
    pub fn prefilled(&mut self, id: u64, prefill: u32) {
        let before = self.prefilled.insert(id, prefill);
        assert!(before.is_none(), "a request was prefilled twice");
    }

    /// The prefill replica of `id`, if its blocks were awaited for a handoff.
    pub fn take_prefilled(&mut self, id: u64) -> Option<u32> {
        self.prefilled.remove(&id)
    }

    /// Request `id` leaves its prefill replica for the link.
    pub fn fly(&mut self, id: u64, f: Flight) {
        assert_eq!(f.phase, Phase::Gap, "a flight starts in the gap");
        let before = self.flights.insert(id, f);
        assert!(before.is_none(), "a request was between the stages twice");
    }

    pub fn flight(&self, id: u64) -> Option<Flight> {
        self.flights.get(&id).copied()
    }

    /// Request `id` is no longer between the stages: its flight, if it had one.
    pub fn land(&mut self, id: u64) -> Option<Flight> {
        self.flights.remove(&id)
    }

    /// The decode replica `decode` took request `id`; it waits there for `blocks` to receive.
    pub fn receive(&mut self, id: u64, decode: u32, blocks: u64) {
        let f = self.flights.get_mut(&id).expect("a flight in its gap");
        assert_eq!(
            f.phase,
            Phase::Gap,
            "a request was taken by two decode replicas"
        );
        f.decode = decode;
        f.phase = Phase::Receiving;
        f.blocks_decode = blocks;
        self.queue(decode).push_back(id);
    }

    /// The first request waiting at `decode` for receive blocks.
    pub fn next_receiving(&mut self, decode: u32) -> Option<u64> {
        self.queue(decode).front().copied()
    }

    /// That request stops waiting: its KV goes on the wire (`on_wire`), or needs none.
    pub fn pop_receiving(&mut self, decode: u32, on_wire: bool) {
        let id = self
            .queue(decode)
            .pop_front()
            .expect("a request waits to receive");
        if on_wire {
            let f = self.flights.get_mut(&id).expect("queued, so flying");
            f.phase = Phase::OnWire;
        }
    }

    /// What request `id`'s prompt shares, as its prefill engine was told, for as long as it is
    /// in the system: the keys of its blocks on both sides follow from it.
    pub fn remember_sharing(&mut self, id: u64, sharing: Sharing) {
        let before = self.sharing.insert(id, sharing);
        assert!(before.is_none(), "a request's sharing remembered twice");
    }

    pub fn sharing(&self, id: u64) -> Option<&Sharing> {
        self.sharing.get(&id)
    }

    /// Request `id` left the system.
    pub fn forget_sharing(&mut self, id: u64) {
        self.sharing.remove(&id);
    }

    /// Request `id`'s blocks on `replica` hold `keys` through the prefix cache.
    pub fn keep(&mut self, replica: u32, id: u64, keys: &[u64]) {
        if !keys.is_empty() {
            let before = self.kept.insert((replica, id), keys.into());
            assert!(
                before.is_none(),
                "a request's blocks kept twice on a replica"
            );
        }
    }

    /// The cached blocks request `id`'s blocks on `replica` held, forgotten from now.
    pub fn take_kept(&mut self, replica: u32, id: u64) -> Box<[u64]> {
        self.kept.remove(&(replica, id)).unwrap_or_default()
    }

    /// The decode side of request `id` holds the first `tokens` of its prompt cached: only the
    /// rest crosses the wire. The bytes that do.
    pub fn cached_at_decode(&mut self, id: u64, tokens: u64) -> u64 {
        let f = self.flights.get_mut(&id).expect("a flight to receive");
        let skipped = tokens.saturating_mul(self.kv_bytes_per_token).min(f.bytes);
        f.bytes -= skipped;
        self.stats.transfer_tokens_cached += tokens;
        f.bytes
    }

    /// Request `id`, waiting at `decode`, waits no more.
    pub fn drop_receiving(&mut self, decode: u32, id: u64) {
        self.queue(decode).retain(|&x| x != id);
    }

    /// The decode side aborted request `id` while its KV is on the wire.
    pub fn abort_on_wire(&mut self, id: u64) {
        let f = self.flights.get_mut(&id).expect("on the wire");
        assert_eq!(
            f.phase,
            Phase::OnWire,
            "an abort on the wire of a request not on it"
        );
        f.aborted = true;
    }

    /// Holds settled at the end of the run: (by their lease, given up).
    pub fn settled(&self) -> (u64, u64) {
        self.settled
    }

    /// Requests with blocks given up at the end of the run.
    pub fn abandoned(&self) -> u64 {
        self.abandoned.len() as u64
    }

    pub fn stats(&self) -> HandoffStats {
        self.stats
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

    /// Whether the handoff message `sub` of request `id` is lost on `link`.
    pub fn lost(&mut self, id: u64, sub: u64, link: Link) -> bool {
        let loss = link.loss;
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

    /// Each pool's books, from its replicas' totals (`totals`) and its wires.
    pub fn pool_summaries(&self, totals: impl Fn(Range<u32>) -> ReplicaStats) -> Vec<PoolSummary> {
        let first_decode = self.first_decode;
        let mut bytes = vec![0u128; self.pd.pools.len()];
        for (i, w) in self.wires.iter().enumerate() {
            let b = w.stats().bytes;
            let prefill = (i / self.decode_pools) as u32;
            bytes[self.pd.pool_of(prefill)] += b;
            bytes[first_decode + i % self.decode_pools] += b;
        }
        let pools = self.pd.pools.iter().enumerate();
        pools
            .map(|(i, p)| {
                let t = totals(self.pd.replicas_of(i));
                PoolSummary {
                    name: p.name.clone(),
                    role: match p.role {
                        Role::Prefill => "prefill",
                        Role::Decode => "decode",
                        _ => "colocated",
                    },
                    replicas: p.replicas,
                    gpu_busy_s: t.busy_ns as f64 / 1e9,
                    steps: t.steps,
                    preemptions: t.preemptions,
                    tokens_delivered: t.tokens_delivered,
                    prefix_query_tokens: t.prefix_query_tokens,
                    prefix_hit_tokens: t.prefix_hit_tokens,
                    admission_stalls: t.stalls_pinned,
                    transfer_bytes: bytes[i].min(u64::MAX as u128) as u64,
                }
            })
            .collect()
    }

    /// The wire from `prefill` to `decode`'s pool.
    pub fn wire(&mut self, prefill: u32, decode: u32) -> &mut Transfers {
        let i = self.wire_index(prefill, decode);
        &mut self.wires[i]
    }

    /// The wires of `prefill`, one per decode pool.
    pub fn wires_of(&mut self, prefill: u32) -> &mut [Transfers] {
        let n = self.decode_pools;
        &mut self.wires[prefill as usize * n..(prefill as usize + 1) * n]
    }

    fn wire_index(&self, prefill: u32, decode: u32) -> usize {
        assert!(prefill < self.prefill_n && decode >= self.prefill_n);
        let j = self.pd.pool_of(decode) - self.first_decode;
        assert!(j < self.decode_pools, "a wire to a decode pool");
        prefill as usize * self.decode_pools + j
    }

    fn queue(&mut self, decode: u32) -> &mut VecDeque<u64> {
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
    /// per replica and request, the blocks to give back to its pool.
    pub fn finish(&mut self, now_ns: u64) -> Vec<(u32, Returned)> {
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
            let (block_s, peak) = {
                let o = &mut self.owners[r as usize];
                (o.block_s(now_ns), o.blocks_peak())
            };
            let side = self.side(r);
            side.retained_block_s += block_s;
            side.retained_blocks_peak = side.retained_blocks_peak.max(peak);
            back.extend(left.into_iter().map(|x| (r, x)));
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

#[cfg(test)]
mod tests {
    use super::*;

    fn handoff() -> Handoff {
        let path = "storm-disaggregated.ron";
        let text = include_str!("../../../scenarios/library/storm-disaggregated.ron");
        let s = Scenario::parse(text, path).expect("a library scenario");
        let pd = s.prefill_decode().expect("a prefill/decode graph");
        Handoff::new(&s, 1, pd)
    }

    fn flight(phase: Phase) -> Flight {
        Flight {
            tag: 0,
            prefill: 0,
            decode: 0,
            phase,
            blocks_prefill: 1,
            bytes: 1,
            blocks_decode: 0,
            aborted: false,
        }
    }

    #[test]
    fn a_flight_in_order_passes_every_assertion() {
        let mut h = handoff();
        let d = h.prefill_n;
        h.prefilled(7, 0);
        assert_eq!((h.take_prefilled(7), h.take_prefilled(7)), (Some(0), None));
        h.fly(7, flight(Phase::Gap));
        h.receive(7, d, 2);
        assert_eq!(h.next_receiving(d), Some(7));
        h.pop_receiving(d, true);
        h.abort_on_wire(7);
        let f = h.land(7).expect("its flight");
        assert!(f.aborted && f.phase == Phase::OnWire && f.blocks_decode == 2);
        h.hang_killed(0.5);
        assert_eq!((h.stats().hang_kills, h.stats().wedge_s), (1, 0.5));
    }

    #[test]
    #[should_panic(expected = "prefilled twice")]
    fn prefilled_twice() {
        let mut h = handoff();
        h.prefilled(7, 0);
        h.prefilled(7, 0);
    }

    #[test]
    #[should_panic(expected = "between the stages twice")]
    fn flying_twice() {
        let mut h = handoff();
        h.fly(7, flight(Phase::Gap));
        h.fly(7, flight(Phase::Gap));
    }

    #[test]
    #[should_panic(expected = "starts in the gap")]
    fn flying_from_the_wire() {
        handoff().fly(7, flight(Phase::OnWire));
    }

    #[test]
    #[should_panic(expected = "two decode replicas")]
    fn received_twice() {
        let mut h = handoff();
        let d = h.prefill_n;
        h.fly(7, flight(Phase::Gap));
        h.receive(7, d, 1);
        h.receive(7, d, 1);
    }

    #[test]
    #[should_panic(expected = "waits to receive")]
    fn popped_from_an_empty_queue() {
        let mut h = handoff();
        let d = h.prefill_n;
        h.pop_receiving(d, true);
    }

    #[test]
    #[should_panic(expected = "not on it")]
    fn aborted_on_the_wire_while_receiving() {
        let mut h = handoff();
        let d = h.prefill_n;
        h.fly(7, flight(Phase::Gap));
        h.receive(7, d, 1);
        h.abort_on_wire(7);
    }

    #[test]
    #[should_panic(expected = "negative length")]
    fn a_negative_wedge() {
        handoff().hang_killed(-1.0);
    }
}

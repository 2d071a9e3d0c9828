//! The serving side: replicas behind a router, each with its scheduler pass and batcher timer.
//! It holds the scratch buffers a replica fills, so a pass allocates nothing.

mod configure;
mod kv;
mod loads;
mod routing;

use configure::configured;
pub(crate) use configure::radius;
use loads::Loads;

use std::collections::VecDeque;
use std::sync::Arc;

use cancelsim_models::gpu::StepTable;
use cancelsim_models::protocol::{
    Abort, CheckpointReport, Dispatch, Gauges, Implicit, NewRequest, Outbox, Rejection,
    ReplicaStats, StepReport, Turned,
};
use cancelsim_models::replica::Replica;
use cancelsim_models::topology::PrefillDecode;

use super::event::Event;
use super::follow::Follow;
use super::kv_router::{KvRouter, KvRouterStats, Scored};
use crate::scenario::{Router, Scenario};
use cancelsim_models::prefix::Content;

/// The replicas a KV-aware router scores: every colocated one; on a prefill/decode graph, the
/// entry's (prefill, and colocated beside), and the decode ones if their pools cache prefixes
/// (validation: all of them or none, with the entry's block size).
fn kv_scored(pd: Option<&PrefillDecode>, replicas: &[Replica]) -> Vec<bool> {
    let Some(pd) = pd else {
        return vec![true; replicas.len()];
    };
    let decode = pd.prefill_replicas..pd.prefill_replicas + pd.decode_replicas;
    let decode_caches = decode
        .clone()
        .all(|r| replicas[r as usize].cache_block_tokens().is_some());
    (0..replicas.len() as u32)
        .map(|r| !decode.contains(&r) || decode_caches)
        .collect()
}

/// The replicas' totals at the end of a run, once every one drained.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Drained {
    pub stats: ReplicaStats,
    pub kv_allocated: u64,
    pub kv_freed: u64,
    pub kv_peak: u64,
}

pub(crate) struct Cluster {
    replicas: Vec<Replica>,
    /// Each replica's `load()`, as of the last call that could change it (`settle`): the
    /// router reads them from one array and the least of them from a tree, not through a
    /// thousand boxes.
    loads: Loads,
    router: Router,
    rr_next: u32,
    /// In a prefill/decode graph, replicas `0..prefill_n` prefill and the rest decode; 0 when
    /// colocated.
    prefill_n: u32,
    /// The pools of a prefill/decode graph, and the links between them.
    pools: Option<PrefillDecode>,
    /// With Colocated pools beside a prefill/decode graph: where a new request may go (every
    /// prefill replica, then every colocated one).
    entry_beside: Option<Vec<u32>>,
    rr_decode: u32,
    /// Since when each replica is wedged: alive, but dispatching nothing.
    wedged_since: Vec<Option<u64>>,
    pass_pending: Vec<bool>,
    timer_at: Vec<Option<u64>>,
    /// Cancel intents so far per replica: a request that sees this move while it is on the
    /// replica shared its engine with a cancelled request (a sibling).
    intent_epoch: Vec<u64>,
    /// The replicas' outbox, lent to the world while it drains one pass or step (`None` while
    /// lent: nothing is made or dropped per event). Boxed, so lending it and taking it back
    /// move a pointer, not its five vectors, twice a step.
    outbox: Option<Box<Outbox>>,
    /// Requests waiting at a `SharedQueue` router, first come first served, and at most how
    /// many.
    held: VecDeque<u32>,
    held_max: u64,
    /// With a `KvAware` router: its view of the replicas' caches.
    kv: Option<KvRouter>,
    /// Replicas coasting (`world/coast.rs`): behind now, so nothing may call into them.
    coasting: Vec<bool>,
}

impl Cluster {
    /// `table`: the measured step times of a `Table` profile, loaded with the run.
    /// `late_aborts`: an abort by request id may reach a replica (a cancel in a policy run, or
    /// the frontend's abort after a stop string), so a replica that generates ids keeps its
    /// tombstones to know a late one. No other abort reads them.
    pub fn new(s: &Scenario, table: Option<&Arc<StepTable>>, late_aborts: bool) -> Cluster {
        let n = s.cluster.replicas as usize;
        // Pool by pool on a prefill/decode graph, each with its stage's profile and scheduler.
        let mut replicas: Vec<Replica> = match s.prefill_decode() {
            Some(pd) => (pd.pools.iter())
                .flat_map(|p| {
                    let c = s.stage_cluster(&p.name);
                    (0..p.replicas)
                        .map(|_| configured(s, &c, table, late_aborts))
                        .collect::<Vec<_>>()
                })
                .collect(),
            None => (0..n)
                .map(|_| configured(s, &s.cluster, table, late_aborts))
                .collect(),
        };
        assert_eq!(
            replicas.len(),
            n,
            "validation: the pools add up to `cluster.replicas`"
        );
        let kv = match s.cluster.router {
            Router::KvAware {
                overlap_weight,
                load_weight,
                lag_us,
            } => {
                let weights = (overlap_weight, load_weight);
                let lag_ns = lag_us as u64 * 1_000;
                let scored = kv_scored(s.prefill_decode().as_ref(), &replicas);
                let kv = KvRouter::new(weights, lag_ns, &mut replicas, scored);
                Some(kv.expect("validation: a KV-aware router's replicas cache prefixes"))
            }
            _ => None,
        };
        Cluster {
            loads: Loads::new(replicas.iter().map(|r| r.load())),
            replicas,
            kv,
            router: s.cluster.router,
            rr_next: 0,
            prefill_n: s.prefill_decode().map_or(0, |pd| pd.prefill_replicas),
            pools: s.prefill_decode(),
            entry_beside: s
                .prefill_decode()
                .filter(|pd| pd.colocated_replicas > 0)
                .map(|pd| {
                    let colocated = pd.prefill_replicas + pd.decode_replicas..n as u32;
                    (0..pd.prefill_replicas).chain(colocated).collect()
                }),
            rr_decode: 0,
            wedged_since: vec![None; n],
            pass_pending: vec![false; n],
            timer_at: vec![None; n],
            intent_epoch: vec![0; n],
            outbox: Some(Box::default()),
            held: VecDeque::new(),
            held_max: s.limits.max_queue_len,
            coasting: vec![false; n],
        }
    }

    /// `replica` may have taken or let go of a request: its load as the router reads it.
    #[inline]
    fn settle(&mut self, replica: u32) {
        let r = replica as usize;
        assert!(!self.coasting[r], "a call into coasting replica {replica}");
        let load = self.replicas[r].load();
        self.loads.set(replica, load);
    }

    /// `replica` coasts from now, or no longer: the world brought it up to now first.
    pub fn set_coasting(&mut self, replica: u32, coasting: bool) {
        self.coasting[replica as usize] = coasting;
    }

    /// The turns ahead of `replica` if nothing reaches it (`Scheduler::coast_ends`).
    pub fn coast_ends(&mut self, replica: u32, turns_max: u32, ends: &mut Vec<u64>) {
        self.replicas[replica as usize].coast_ends(turns_max, ends);
    }

    /// Whether any replica can ever coast (`Scheduler::may_coast`).
    pub fn may_coast(&self) -> bool {
        self.replicas.iter().any(|r| r.may_coast())
    }

    /// With debug assertions: the loads the router reads are the replicas' own.
    #[inline]
    pub(super) fn assert_loads(&self) {
        debug_assert!(
            (self.loads.as_slice().iter().zip(&self.replicas)).all(|(&l, r)| l == r.load()),
            "a replica's load changed with no `settle`"
        );
    }

    /// Whether `replica` is a decode replica of a prefill/decode graph (not a prefill one, nor
    /// one of a Colocated pool beside them).
    pub fn is_decode(&self, replica: u32) -> bool {
        self.pools.as_ref().is_some_and(|pd| {
            (pd.prefill_replicas..pd.prefill_replicas + pd.decode_replicas).contains(&replica)
        })
    }

    /// The decode replicas of a prefill/decode graph.
    pub fn decode_range(&self) -> std::ops::Range<u32> {
        let pd = self.pools.as_ref().expect("a prefill/decode graph");
        pd.prefill_replicas..pd.prefill_replicas + pd.decode_replicas
    }

    /// Whether `replica` is a prefill replica of a prefill/decode graph.
    pub fn is_prefill(&self, replica: u32) -> bool {
        replica < self.prefill_n
    }

    pub fn disaggregated(&self) -> bool {
        self.prefill_n > 0
    }

    /// Blocks of `replica`'s pool that `tokens` of KV fill.
    pub fn blocks_for(&self, replica: u32, tokens: u64) -> u64 {
        self.replicas[replica as usize].kv().blocks_for(tokens)
    }

    /// Whether a decode pool that prefill replica `from` links to would ever take `r` (a
    /// pool's replicas are alike).
    pub fn decode_accepts(&self, from: u32, r: &NewRequest) -> bool {
        !self.decode_candidates(Some(from), Some(r)).is_empty()
    }

    /// Take blocks of `replica`'s pool for a handoff, holding the leading run of `keys` that its
    /// prefix cache has: the run's length, or `None` if the blocks are not free.
    pub fn pin_cached(&mut self, replica: u32, keys: &[u64], blocks: u64) -> Option<u64> {
        let held = self.replicas[replica as usize].pin_cached(keys, blocks);
        self.settle(replica);
        held
    }

    pub fn unpin_cached(&mut self, replica: u32, held: &[u64], blocks: u64) {
        self.replicas[replica as usize].unpin_cached(held, blocks);
        self.settle(replica);
    }

    /// Whether `replica`'s prefix cache holds a block of content `key` now.
    pub fn cache_contains(&self, replica: u32, key: u64) -> bool {
        self.replicas[replica as usize].cache_contains(key)
    }

    /// The requests on the least loaded prefill replica: how long the prefill stage's queue is.
    pub fn prefill_queue(&self) -> u64 {
        let p = self.prefill_n as usize;
        self.assert_loads();
        let least = self.loads.as_slice()[..p].iter().copied().min();
        least.expect("a prefill stage")
    }

    /// The block size of `replica`'s prefix cache, if it has one.
    pub fn cache_block_tokens(&self, replica: u32) -> Option<u64> {
        self.replicas[replica as usize].cache_block_tokens()
    }

    /// The totals of the prefill replicas (`prefill`) or of the others.
    pub fn stage_totals(&self, prefill: bool) -> ReplicaStats {
        match prefill {
            true => self.totals_of(0..self.prefill_n),
            false => self.totals_of(self.decode_range()),
        }
    }

    /// The totals of replicas `range` (a pool).
    pub fn totals_of(&self, range: std::ops::Range<u32>) -> ReplicaStats {
        let mut t = ReplicaStats::default();
        for r in &self.replicas[range.start as usize..range.end as usize] {
            t.add(&r.totals());
        }
        t
    }

    pub fn enqueue(&mut self, replica: u32, now_ns: u64, r: NewRequest) -> Result<(), Rejection> {
        let taken = self.replicas[replica as usize].enqueue(now_ns, r);
        self.settle(replica);
        taken
    }

    /// Request `tag`, just enqueued on `replica`, continues a conversation's token stream.
    pub fn share_stream(
        &mut self,
        replica: u32,
        tag: u32,
        key: cancelsim_models::prefix::StreamKey,
    ) {
        self.replicas[replica as usize].share_stream(tag, key);
        self.settle(replica);
    }

    /// Request `tag`, just enqueued on `replica`, shares a prompt prefix: `ids` are a trace's
    /// block hashes, one per `MOONCAKE_BLOCK_TOKENS` tokens (none: nothing shared).
    pub fn share_prefix(&mut self, replica: u32, tag: u32, ids: &[u64]) {
        if !ids.is_empty() {
            let tokens = crate::workload::trace::MOONCAKE_BLOCK_TOKENS;
            self.replicas[replica as usize].share_prefix(tag, ids, tokens);
            self.settle(replica);
        }
    }

    /// Ask for a scheduler pass of `replica` at this tick, once.
    pub fn request_pass(&mut self, f: &mut Follow, replica: u32) {
        if !self.pass_pending[replica as usize] {
            self.pass_pending[replica as usize] = true;
            f.after(0, Event::SchedulePass { replica });
        }
    }

    /// A batcher timer fired: a stale one (the batch formed earlier) costs one empty pass.
    pub fn timer_fired(&mut self, replica: u32, now_ns: u64) {
        let r = replica as usize;
        if self.timer_at[r].is_some_and(|t| t <= now_ns) {
            self.timer_at[r] = None;
        }
    }

    /// A pass begins: the replica's checkpoint. The outbox comes out with who was observed and
    /// released; give it back with `recycle`.
    pub fn checkpoint(&mut self, replica: u32, now_ns: u64) -> (CheckpointReport, Box<Outbox>) {
        let r = replica as usize;
        assert!(self.pass_pending[r], "a scheduler pass no one asked for");
        self.pass_pending[r] = false;
        let mut out = self.lend();
        let report = self.replicas[r].checkpoint(now_ns, &mut out);
        self.settle(replica);
        self.publish(replica, now_ns);
        (report, out)
    }

    /// A step of `replica` ends: its outputs and releases, in the outbox.
    pub fn step_done(&mut self, replica: u32, step: u64, now_ns: u64) -> (StepReport, Box<Outbox>) {
        let mut out = self.lend();
        let report = self.replicas[replica as usize].step_done(now_ns, step, &mut out);
        self.settle(replica);
        self.publish(replica, now_ns);
        (report, out)
    }

    /// Whether a step of `replica` and the pass after it may be one call (`turn`): nothing of
    /// the cluster's own waits on the pass (no pass already asked for, no KV-aware router to
    /// publish to, no wedge). A decode replica's receiving is the world's (`World::turned`).
    #[inline]
    pub fn turns(&self, replica: u32) -> bool {
        self.kv.is_none()
            && !self.pass_pending[replica as usize]
            && self.wedged_since[replica as usize].is_none()
    }

    /// Step `step` of `replica` ends now and its pass runs at once, in one call, if the two
    /// would give the world nothing but the next step (`Scheduler::turn`).
    #[inline]
    pub fn turn(&mut self, replica: u32, step: u64, now_ns: u64) -> Option<(StepReport, Dispatch)> {
        let r = &mut self.replicas[replica as usize];
        let turned = r.turn(now_ns, step);
        // No `settle`: a turn admits and retires nothing, so the load stays (`Scheduler::turn`).
        debug_assert_eq!(r.load(), self.loads.get(replica), "a turn moved a load");
        turned
    }

    /// `turn` at each tick of `ends` but the last, in one call (`Scheduler::turns_at`): a
    /// coast's turns.
    #[inline]
    pub fn turns_at(&mut self, replica: u32, step: u64, ends: &[u64], after_turn: bool) -> Turned {
        let r = &mut self.replicas[replica as usize];
        let turned = r.turns_at(step, ends, after_turn);
        debug_assert_eq!(r.load(), self.loads.get(replica), "a turn moved a load");
        turned
    }

    fn lend(&mut self) -> Box<Outbox> {
        self.outbox.take().unwrap_or_default()
    }

    pub fn recycle(&mut self, mut out: Box<Outbox>) {
        out.clear();
        self.outbox = Some(out);
    }

    /// The next step of `replica`, if it has room and work; first dispatches go to `out.started`.
    pub fn dispatch(&mut self, replica: u32, now_ns: u64, out: &mut Outbox) -> Option<Dispatch> {
        if self.wedged_since[replica as usize].is_some() {
            return None;
        }
        let d = self.replicas[replica as usize].dispatch(now_ns, out);
        self.settle(replica);
        self.publish(replica, now_ns);
        d
    }

    /// `replica` wedges now, unless it already is. True if it just wedged.
    pub fn wedge(&mut self, replica: u32, now_ns: u64) -> bool {
        assert!(
            !self.coasting[replica as usize],
            "a coasting replica wedged"
        );
        let w = &mut self.wedged_since[replica as usize];
        w.is_none() && w.replace(now_ns).is_none()
    }

    /// `replica` was wedged since `since_ns` and is not any more; it dispatches again.
    pub fn unwedge(&mut self, replica: u32, since_ns: u64) -> bool {
        let w = &mut self.wedged_since[replica as usize];
        w.take_if(|s| *s == since_ns).is_some()
    }

    /// Replicas wedged now, and since when.
    pub fn wedged(&self) -> impl Iterator<Item = (u32, u64)> + '_ {
        let all = self.wedged_since.iter().enumerate();
        all.filter_map(|(r, s)| s.map(|s| (r as u32, s)))
    }

    /// After a pass: schedule the batcher's timer if it wants one it does not have yet.
    pub fn arm_timer(&mut self, f: &mut Follow, replica: u32, now_ns: u64) {
        let r = replica as usize;
        let timer = self.replicas[r].timer_ns();
        if let Some(at) = timer.filter(|_| timer != self.timer_at[r]) {
            self.timer_at[r] = Some(at.max(now_ns));
            f.at(at.max(now_ns), Event::BatcherTimer { replica });
        }
    }

    /// An abort reaches `replica`'s backend; it acts at its next checkpoint.
    pub fn abort(&mut self, f: &mut Follow, replica: u32, abort: Abort) {
        self.replicas[replica as usize].abort(abort);
        self.settle(replica);
        self.request_pass(f, replica)
    }

    /// The world needs every output of lazy request `tag` on `replica` from now on: its tokens
    /// not handed over yet, if any.
    pub fn make_explicit(&mut self, replica: u32, tag: u32) -> Option<Implicit> {
        let handed = self.replicas[replica as usize].make_explicit(tag);
        self.settle(replica);
        handed
    }

    /// The earliest streak step of `replica` whose tokens may still be handed over.
    pub fn streak_floor(&self, replica: u32) -> Option<u64> {
        self.replicas[replica as usize].streak_floor()
    }

    /// A request on `replica` got a cancel intent now: its blocks count as retained from here.
    pub fn intent(&mut self, replica: u32, now_ns: u64, tag: u32) {
        self.intent_epoch[replica as usize] += 1;
        self.replicas[replica as usize].mark_intent(now_ns, tag);
        self.settle(replica);
    }

    /// A request between a prefill and a decode stage, last at `replica`, got a cancel intent:
    /// the requests there are its siblings (it holds no blocks in the engine itself).
    pub fn intent_between(&mut self, replica: u32) {
        self.intent_epoch[replica as usize] += 1;
    }

    pub fn intent_epoch(&self, replica: u32) -> u64 {
        self.intent_epoch[replica as usize]
    }

    /// The replicas' gauges summed, and the blocks pinned on the prefill and on the decode
    /// replicas of a prefill/decode graph.
    pub fn gauges(&self) -> (Gauges, [u64; 2]) {
        let mut g = Gauges::default();
        let mut pinned = [0; 2];
        for (i, r) in self.replicas.iter().enumerate() {
            let x = r.gauges();
            g.waiting += x.waiting;
            g.running += x.running;
            g.kv_blocks += x.kv_blocks;
            g.kv_retained += x.kv_retained;
            g.kv_pinned += x.kv_pinned;
            pinned[!self.is_prefill(i as u32) as usize] += x.kv_pinned;
        }
        (g, pinned)
    }

    /// Each pool's gauges summed, pool by pool, into `out` (nothing when colocated).
    pub fn pool_gauges(&self, out: &mut Vec<Gauges>) {
        let Some(pd) = &self.pools else {
            return;
        };
        for i in 0..pd.pools.len() {
            let mut g = Gauges::default();
            for r in pd.replicas_of(i) {
                let x = self.replicas[r as usize].gauges();
                g.waiting += x.waiting;
                g.running += x.running;
                g.kv_blocks += x.kv_blocks;
                g.kv_retained += x.kv_retained;
                g.kv_pinned += x.kv_pinned;
            }
            out.push(g);
        }
    }

    /// The replicas' totals, or `None` if one did not drain or leaked KV blocks (conservation).
    pub fn drained(&self) -> Option<Drained> {
        let mut d = Drained::default();
        for r in &self.replicas {
            let kv = r.kv();
            if !r.is_idle() || kv.allocated_total() != kv.freed_total() || kv.in_use() != 0 {
                return None;
            }
            d.kv_allocated += kv.allocated_total();
            d.kv_freed += kv.freed_total();
            d.kv_peak = d.kv_peak.max(kv.in_use_max());
            d.stats.add(&r.totals());
        }
        Some(d)
    }

    pub fn len(&self) -> usize {
        self.replicas.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[should_panic(expected = "no one asked for")]
    fn a_pass_nobody_asked_for() {
        let s = Scenario::default_embedded();
        let mut c = Cluster::new(&s, None, true);
        c.checkpoint(0, 0);
    }

    #[test]
    fn a_pass_is_asked_for_once_until_it_runs() {
        let s = Scenario::default_embedded();
        let mut c = Cluster::new(&s, None, true);
        let mut f = Follow::default();
        c.request_pass(&mut f, 0);
        c.request_pass(&mut f, 0);
        let mut k = crate::kernel::Kernel::new(s.limits());
        f.schedule(&mut k).unwrap();
        assert_eq!(
            k.next_event().unwrap(),
            Some(Event::SchedulePass { replica: 0 })
        );
        assert_eq!(k.next_event().unwrap(), None, "asked for once");
        let (_, out) = c.checkpoint(0, 0);
        c.recycle(out);
    }
}

//! The KV-aware router (NVIDIA Dynamo's KV router, llm-d's prefix-cache scorer, SGLang's
//! cache-aware router): it scores each replica by the prompt's leading blocks that replica
//! already caches against its load, and sends the request to the cheapest. On a prefill/decode
//! graph it scores the entry (prefill replicas, and colocated ones beside them) and, when the
//! decode pools cache prefixes, the decode replicas by the blocks they would have to receive.
//!
//! Its view of the caches is built from the blocks each replica publishes as it stores and
//! evicts them, `lag_ns` late, as a worker's KV events reach a router over the network. A block
//! evicted after a cancel freed it stays in the view until its event arrives. Each decision is
//! also scored against the caches as they are, so the lag's cost is counted: the decisions it
//! changed (misroutes) and the cached tokens the router expected against those it would have
//! found.
//!
//! Architecture Invariant: the router reads the replicas' caches only through what they
//! publish, except for the counting, which never decides.

use std::collections::VecDeque;

use cancelsim_models::prefix::Content;
use cancelsim_models::replica::Replica;
use rustc_hash::FxHashSet;
use serde::Serialize;

/// Published blocks waiting out the lag, at most; past it the oldest is seen early, and counted.
pub const PENDING_MAX: usize = 1 << 22;

/// The `router` section of `summary.json`, with a `KvAware` router only.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct KvRouterStats {
    /// Requests the router placed by score.
    pub decisions: u64,
    /// Their prompt tokens, and those the router's view said the chosen replica caches.
    pub prompt_tokens: u64,
    pub expected_hit_tokens: u64,
    /// The chosen replica's cached prompt tokens as its cache was when the router chose.
    pub present_hit_tokens: u64,
    /// Decisions that the caches as they were would have sent elsewhere.
    pub misroutes: u64,
    /// Published blocks seen before their lag ran out, because more than `PENDING_MAX` waited.
    pub early_views: u64,
}

pub(crate) struct KvRouter {
    overlap_weight: u64,
    load_weight: u64,
    lag_ns: u64,
    block_tokens: u64,
    /// Per replica: the blocks it published as stored and not yet as evicted (none for a
    /// replica it does not score).
    views: Vec<FxHashSet<u64>>,
    scored: Vec<bool>,
    /// `(visible at, replica, block, stored)`, in publication order (so in time order: one lag).
    pending: VecDeque<(u64, u32, u64, bool)>,
    scratch: Vec<(u64, bool)>,
    keys: Vec<u64>,
    /// Its decisions at the entry (colocated or prefill replicas), and, once it has scored one,
    /// at a graph's decode stage.
    pub stats: KvRouterStats,
    pub decode_stats: Option<KvRouterStats>,
}

/// One decision as scored, before it is booked: a router that only asks (where would a request
/// prefill locally?) books nothing.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Scored {
    pub replica: u32,
    prompt_tokens: u64,
    /// The chosen replica's leading blocks in the router's view, and in its cache.
    view_blocks: u64,
    held_blocks: u64,
    misroute: bool,
}

impl KvRouter {
    /// A router over the replicas marked in `scored`, which start publishing their caches;
    /// `None` if one has no prefix cache or another block size (the scenario's validation
    /// refuses that).
    pub fn new(
        weights: (u32, u32),
        lag_ns: u64,
        replicas: &mut [Replica],
        scored: Vec<bool>,
    ) -> Option<KvRouter> {
        assert_eq!(scored.len(), replicas.len(), "a mark per replica");
        let first = scored.iter().position(|&s| s)?;
        let block_tokens = replicas[first].cache_block_tokens()?;
        for (r, _) in replicas.iter_mut().zip(&scored).filter(|(_, &s)| s) {
            if !r.publish_cache() || r.cache_block_tokens() != Some(block_tokens) {
                return None;
            }
        }
        Some(KvRouter {
            overlap_weight: weights.0 as u64,
            load_weight: weights.1 as u64,
            lag_ns,
            block_tokens,
            views: vec![FxHashSet::default(); replicas.len()],
            scored,
            pending: VecDeque::new(),
            scratch: Vec::new(),
            keys: Vec::new(),
            stats: KvRouterStats::default(),
            decode_stats: None,
        })
    }

    /// Whether it has a view of `replica` (one it scores).
    pub fn views(&self, replica: u32) -> bool {
        self.scored[replica as usize]
    }

    /// What `replica` published since the last call, all of it at `now_ns`: it becomes visible
    /// `lag_ns` later.
    pub fn collect(&mut self, replica: u32, r: &mut Replica, now_ns: u64) {
        r.take_published(&mut self.scratch);
        let due = now_ns.saturating_add(self.lag_ns);
        for (key, stored) in self.scratch.drain(..) {
            self.pending.push_back((due, replica, key, stored));
        }
        while self.pending.len() > PENDING_MAX {
            self.stats.early_views += 1;
            self.apply_oldest();
        }
    }

    fn apply_oldest(&mut self) {
        let Some((_, replica, key, stored)) = self.pending.pop_front() else {
            return;
        };
        let view = &mut self.views[replica as usize];
        if stored {
            view.insert(key);
        } else {
            view.remove(&key);
        }
    }

    /// The replica among `candidates` with the least cost for a request of `content`: the
    /// weighted prompt blocks it would compute (or, on a decode replica, receive), plus the
    /// weighted requests it holds. Ties go to the first candidate. Nothing is booked.
    pub fn score(
        &mut self,
        now_ns: u64,
        content: &Content,
        replicas: &[Replica],
        candidates: impl IntoIterator<Item = u32>,
    ) -> Scored {
        while self.pending.front().is_some_and(|p| p.0 <= now_ns) {
            self.apply_oldest();
        }
        self.leading_keys(content);
        let blocks = content.prompt_tokens.div_ceil(self.block_tokens);
        // Per replica, once: the leading blocks its view holds and those its cache holds. The
        // decision is the least cost by the view; the ideal, by the caches.
        // (view cost, replica, blocks in its view, blocks in its cache, true cost)
        let mut chosen = (u64::MAX, u32::MAX, 0u64, 0u64, 0u64);
        let mut ideal = u64::MAX;
        for r in candidates {
            debug_assert!(self.scored[r as usize], "replica {r} is scored");
            let view = run(&self.keys, |k| self.views[r as usize].contains(&k));
            let held = run(&self.keys, |k| replicas[r as usize].cache_contains(k));
            let load = self.load_weight * replicas[r as usize].load();
            let cost = |hit: u64| self.overlap_weight * (blocks - hit) + load;
            ideal = ideal.min(cost(held));
            if cost(view) < chosen.0 {
                chosen = (cost(view), r, view, held, cost(held));
            }
        }
        let (_, replica, view_blocks, held_blocks, true_cost) = chosen;
        assert!(replica != u32::MAX, "at least one candidate");
        Scored {
            replica,
            prompt_tokens: content.prompt_tokens,
            view_blocks,
            held_blocks,
            misroute: ideal < true_cost,
        }
    }

    /// Book a decision taken: in the entry's books, or the decode stage's.
    pub fn book(&mut self, s: Scored, decode: bool) {
        let bt = self.block_tokens;
        let b = match decode {
            true => self.decode_stats.get_or_insert_with(KvRouterStats::default),
            false => &mut self.stats,
        };
        b.decisions += 1;
        b.prompt_tokens += s.prompt_tokens;
        b.expected_hit_tokens += s.view_blocks * bt;
        b.present_hit_tokens += s.held_blocks * bt;
        b.misroutes += u64::from(s.misroute);
    }

    /// The keys of the prompt's leading shared blocks, as the engine's admission looks them up:
    /// at most all but the prompt's last token, and only blocks other requests may have made.
    fn leading_keys(&mut self, content: &Content) {
        let bt = self.block_tokens;
        let max = content.prompt_tokens.saturating_sub(1) / bt;
        self.keys.clear();
        self.keys.extend(
            (0..max)
                .take_while(|&i| content.is_shared(bt, i))
                .map(|i| content.key(bt, i)),
        );
    }
}

/// How many of `keys`, from the first, `cached` holds without a gap.
fn run(keys: &[u64], cached: impl Fn(u64) -> bool) -> u64 {
    keys.iter().take_while(|&&k| cached(k)).count() as u64
}

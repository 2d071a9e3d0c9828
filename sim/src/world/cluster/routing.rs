//! The router's choices: where a new request goes (a replica, or the shared queue), and which
//! decode replica a prefilled request goes to.

use cancelsim_models::protocol::NewRequest;
use cancelsim_models::topology::Role;

use super::loads::least_loaded;
use super::{Cluster, Scored};
use crate::kernel::LimitError;
use crate::scenario::Router;
use cancelsim_models::prefix::Content;

impl Cluster {
    /// Whether the router holds requests in a shared queue.
    pub fn shares_queue(&self) -> bool {
        matches!(self.router, Router::SharedQueue { .. })
    }

    /// The replicas a new request may go to: the colocated ones, or the prefill ones.
    fn entry(&self) -> std::ops::Range<u32> {
        match self.prefill_n {
            0 => 0..self.replicas.len() as u32,
            p => 0..p,
        }
    }

    /// The least loaded entry replica below a shared queue's bound, if any (always the least
    /// loaded for other routers).
    fn below_bound(&self) -> Option<u32> {
        self.assert_loads();
        let r = match &self.entry_beside {
            Some(list) => least_loaded(self.loads.as_slice(), list.iter().copied())?,
            None => self.loads.least(self.entry())?,
        };
        match self.router {
            Router::SharedQueue { max_outstanding } => {
                (self.loads.get(r) < max_outstanding as u64).then_some(r)
            }
            _ => Some(r),
        }
    }

    /// Where a new request goes now: a replica, or `None` to wait in the router's shared queue
    /// (behind the others there).
    pub fn route_or_hold(
        &mut self,
        tag: u32,
        session: Option<u64>,
        now_ns: u64,
    ) -> Result<Option<u32>, LimitError> {
        if !matches!(self.router, Router::SharedQueue { .. }) {
            return Ok(Some(self.route(session)));
        }
        if self.held.is_empty() {
            if let Some(r) = self.below_bound() {
                return Ok(Some(r));
            }
        }
        if self.held.len() as u64 >= self.held_max {
            let limit = self.held_max;
            return Err(LimitError::RouterQueue {
                limit,
                time_ns: now_ns,
            });
        }
        self.held.push_back(tag);
        Ok(None)
    }

    /// The request at the head of the router's shared queue and the replica it may go to now,
    /// if a replica is below the bound.
    pub fn next_held(&mut self) -> Option<(u32, u32)> {
        if self.held.is_empty() {
            return None;
        }
        let r = self.below_bound()?;
        self.held.pop_front().map(|tag| (tag, r))
    }

    /// Take `tag` out of the router's shared queue (cancelled while waiting); false if it is
    /// not there.
    pub fn unhold(&mut self, tag: u32) -> bool {
        match self.held.iter().position(|&t| t == tag) {
            Some(i) => self.held.remove(i).is_some(),
            None => false,
        }
    }

    /// The replica a new request goes to: a colocated one, or a prefill one. `session`: the
    /// request's affinity key (its conversation, or its trace prefix), if it has one.
    pub fn route(&mut self, session: Option<u64>) -> u32 {
        if let Some(list) = &self.entry_beside {
            if let (Router::Session, Some(key)) = (self.router, session) {
                return list[rendezvous(key, 0..list.len() as u32) as usize];
            }
            self.assert_loads();
            return pick(
                self.router,
                self.loads.as_slice(),
                list.iter().copied(),
                &mut self.rr_next,
            );
        }
        let n = match self.prefill_n {
            0 => self.replicas.len() as u32,
            p => p,
        };
        if let (Router::Session, Some(key)) = (self.router, session) {
            return rendezvous(key, 0..n);
        }
        self.assert_loads();
        match self.router {
            Router::RoundRobin => pick(self.router, self.loads.as_slice(), 0..n, &mut self.rr_next),
            // `pick`'s least loaded, from the tree: a range of replicas.
            _ => self.loads.least(0..n).expect("at least one replica"),
        }
    }

    /// The decode replica a prefilled request goes to, chosen when it reaches the decode stage:
    /// among the pools that `from`'s pool links to (every decode pool without `from`) and, with
    /// `r`, that would take it; `None` if none would. A KV-aware router that views the decode
    /// replicas scores them by the prompt (`kv`: now, and the request's content), and gives its
    /// score to book if the world takes the choice.
    pub fn route_decode(
        &mut self,
        from: Option<u32>,
        r: Option<&NewRequest>,
        kv: Option<(u64, &Content)>,
    ) -> Option<(u32, Option<Scored>)> {
        let candidates = self.decode_candidates(from, r);
        self.choose(candidates, kv)
    }

    /// A replica of the Colocated pools beside a prefill/decode graph, by the router, for a
    /// request kept off the prefill stage; `None` without one. As `route_decode` for `kv`.
    pub fn route_colocated(
        &mut self,
        kv: Option<(u64, &Content)>,
    ) -> Option<(u32, Option<Scored>)> {
        let pd = self.pools.as_ref()?;
        // The colocated pools' replicas come last, in one run.
        let colocated = pd.prefill_replicas + pd.decode_replicas..self.replicas.len() as u32;
        self.choose(colocated, kv)
    }

    /// The router's choice among `candidates` past the entry: by score if it scores them, else
    /// by `pick` (round robin over the stage's own counter).
    fn choose<C>(
        &mut self,
        candidates: C,
        kv: Option<(u64, &Content)>,
    ) -> Option<(u32, Option<Scored>)>
    where
        C: IntoIterator<Item = u32>,
        C::IntoIter: ExactSizeIterator + Clone,
    {
        let candidates = candidates.into_iter();
        if candidates.len() == 0 {
            return None;
        }
        if let Some((now_ns, content)) = kv {
            if let Some(s) = self.score_kv(now_ns, content, candidates.clone()) {
                return Some((s.replica, Some(s)));
            }
        }
        self.assert_loads();
        let r = pick(
            self.router,
            self.loads.as_slice(),
            candidates,
            &mut self.rr_decode,
        );
        Some((r, None))
    }

    pub(super) fn decode_candidates(&self, from: Option<u32>, r: Option<&NewRequest>) -> Vec<u32> {
        let pd = self.pools.as_ref().expect("a prefill/decode graph");
        let linked = |d: usize| match from {
            Some(p) => pd.link(pd.pool_of(p), d).is_some(),
            None => true,
        };
        let takes = |d: usize| match r {
            Some(r) => self.replicas[pd.pools[d].first as usize].accepts(r).is_ok(),
            None => true,
        };
        (0..pd.pools.len())
            .filter(|&d| pd.pools[d].role == Role::Decode && linked(d) && takes(d))
            .flat_map(|d| pd.replicas_of(d))
            .collect()
    }
}

/// The router's choice among `candidates`: a range of replicas, or a list (the decode pools a
/// request may go to).
fn pick<C>(router: Router, loads: &[u64], candidates: C, rr: &mut u32) -> u32
where
    C: IntoIterator<Item = u32>,
    C::IntoIter: ExactSizeIterator + Clone,
{
    let mut candidates = candidates.into_iter();
    let n = candidates.len() as u32;
    assert!(n > 0, "at least one replica");
    match router {
        Router::RoundRobin => {
            // Modulo the candidates now: a request that fits fewer pools has fewer.
            let r = candidates.nth((*rr % n) as usize).expect("in range");
            *rr = (*rr + 1) % n;
            r
        }
        // A request without a session key goes where the load is least; a shared queue's
        // request goes where it may (see `route_or_hold`).
        Router::LeastLoaded
        | Router::Session
        | Router::SharedQueue { .. }
        | Router::KvAware { .. } => least_loaded(loads, candidates).expect("at least one replica"),
    }
}

/// Rendezvous (highest random weight) hashing: the replica whose hash with `key` is highest. A
/// key keeps its replica when replicas are added elsewhere, and keys spread evenly.
fn rendezvous(key: u64, range: std::ops::Range<u32>) -> u32 {
    let weight = |r: u32| {
        let mut z = key ^ (r as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    range
        .max_by_key(|&r| (weight(r), r))
        .expect("at least one replica")
}

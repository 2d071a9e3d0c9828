//! The cluster's side of a KV-aware router: what each replica's cache stored and evicted goes
//! out to it, and where it sends a request.

use super::{Cluster, Content, KvRouterStats, Scored};

impl Cluster {
    /// What `replica`'s cache stored and evicted just now goes out to a KV-aware router.
    #[inline(always)]
    pub(super) fn publish(&mut self, replica: u32, now_ns: u64) {
        if self.kv.is_some() {
            self.publish_kv(replica, now_ns);
        }
    }

    fn publish_kv(&mut self, replica: u32, now_ns: u64) {
        // Only the replicas it scores publish.
        if let Some(kv) = self.kv.as_mut().filter(|kv| kv.views(replica)) {
            kv.collect(replica, &mut self.replicas[replica as usize], now_ns);
            self.settle(replica);
        }
    }

    /// Whether the router is KV-aware: it routes by `route_kv`.
    pub fn kv_aware(&self) -> bool {
        self.kv.is_some()
    }

    /// The replica a KV-aware router sends a request of `content` to now, among the entry's.
    pub fn route_kv(&mut self, now_ns: u64, content: &Content) -> u32 {
        let kv = self.kv.as_mut().expect("a KV-aware router");
        let scored = match &self.entry_beside {
            Some(list) => kv.score(now_ns, content, &self.replicas, list.iter().copied()),
            None => {
                let n = match self.prefill_n {
                    0 => self.replicas.len() as u32,
                    p => p,
                };
                kv.score(now_ns, content, &self.replicas, 0..n)
            }
        };
        kv.book(scored, false);
        scored.replica
    }

    /// A KV-aware router's score among `candidates`, if it views them (the decode replicas of
    /// a graph whose decode pools cache prefixes; the colocated ones beside it); nothing booked.
    pub(super) fn score_kv(
        &mut self,
        now_ns: u64,
        content: &Content,
        mut candidates: impl Iterator<Item = u32> + Clone,
    ) -> Option<Scored> {
        let kv = self.kv.as_mut()?;
        let first = candidates.clone().next()?;
        // A stage is viewed whole or not at all (`kv_scored`).
        kv.views(first)
            .then(|| kv.score(now_ns, content, &self.replicas, &mut candidates))
    }

    /// Book a decision `score_kv` scored and the world took.
    pub fn book_kv(&mut self, s: Scored) {
        let decode = self.is_decode(s.replica);
        self.kv.as_mut().expect("scored by one").book(s, decode);
    }

    /// The KV-aware router's books, with one: the entry's, and the decode stage's.
    pub fn kv_stats(&self) -> (Option<KvRouterStats>, Option<KvRouterStats>) {
        match &self.kv {
            Some(kv) => (Some(kv.stats), kv.decode_stats),
            None => (None, None),
        }
    }
}

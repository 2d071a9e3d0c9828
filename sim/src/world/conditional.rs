//! Conditional disaggregation (Dynamo's rule, `handoff.conditional`): when a request arrives,
//! the router picks the decode replica it would go to, and that replica prefills it itself
//! unless the part of its prompt it has not cached is longer than a threshold, or prefills it
//! anyway when every prefill replica is busy. A request prefilled locally runs there as on a
//! colocated replica: no handoff, no transfer, and its cancel reaches one engine. A graph with a
//! Colocated pool beside its prefill and decode pools keeps such requests there instead. The others
//! take the prefill stage and the handoff; the router picks their decode replica again when
//! their KV is ready (it may have changed its mind meanwhile). A KV-aware router picks the
//! local replica by its score, as Dynamo's KV router picks the decode worker, and books the
//! decision only when the request stays there.

use super::requests::TurnRef;
use super::World;
use crate::workload::Arrival;

impl World<'_> {
    /// The replica that serves request `a` whole, off the prefill stage, if the rule says so:
    /// a Colocated one beside the graph, or the decode replica the router picks.
    pub(super) fn prefill_locally(&mut self, a: &Arrival, conv: Option<TurnRef>) -> Option<u32> {
        let c = self.handoff.as_ref()?.cfg().conditional?;
        let prompt = a.prompt_tokens as u64;
        let now_ns = self.kernel.now_ns();
        let content = (self.cluster.kv_aware()).then(|| self.content_of(a.id, prompt, conv));
        let kv = content.as_ref().map(|c| (now_ns, c));
        // A Colocated pool beside the graph takes what is kept off the prefill stage; without
        // one, the decode replica the router would pick (a KV-aware one by its score).
        let (local, scored) = match self.cluster.route_colocated(kv) {
            Some(choice) => choice,
            None => self.cluster.route_decode(None, None, kv)?,
        };
        let uncached = prompt - self.cached_on(local, a, conv);
        let busy = c
            .max_prefill_queue
            .is_some_and(|m| self.cluster.prefill_queue() >= m as u64);
        if uncached > c.max_local_prefill_tokens as u64 && !busy {
            return None; // the router asked, and goes on to the prefill stage
        }
        if let Some(s) = scored {
            self.cluster.book_kv(s);
        }
        Some(local)
    }

    /// The tokens of `a`'s prompt in the leading run of blocks `replica` has cached, short of
    /// its last token (an engine always computes that one).
    fn cached_on(&self, replica: u32, a: &Arrival, conv: Option<TurnRef>) -> u64 {
        let Some(bt) = self.cluster.cache_block_tokens(replica) else {
            return 0;
        };
        let prompt = a.prompt_tokens as u64;
        let content = self.content_of(a.id, prompt, conv);
        let run = (0..prompt.saturating_sub(1) / bt)
            .take_while(|&i| content.is_shared(bt, i))
            .take_while(|&i| self.cluster.cache_contains(replica, content.key(bt, i)))
            .count() as u64;
        run * bt
    }
}

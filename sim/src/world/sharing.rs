//! What a request's prompt shares with others (a trace's block hashes, a conversation's
//! stream), told to the engine that runs it, and prefix sharing across a prefill/decode
//! handoff. A prefill replica's requests find each other's cached prefixes as on a colocated
//! replica; once a request's prefill is done, the blocks kept for its transfer hold its cached
//! prefix through the prefix cache (shared with the requests that hold it too, and safe from
//! eviction) and take new blocks only for the rest. A decode replica that has the prompt's
//! leading blocks cached (an earlier turn of the same conversation, a shared system prompt)
//! holds them the same way and receives only the rest of the KV; its engine then reuses them,
//! and caches what it received for the next request.
//!
//! On a graph, what a request shares is fixed when its prefill replica takes it and kept in the
//! handoff until it leaves, so both sides key its blocks as that engine did (a barge-in moves a
//! conversation's stream on while a superseded turn is still in the handoff). Each block held
//! through the cache is given back by the key it was held with.

use cancelsim_models::prefix::{Content, Sharing, StreamKey};

use super::event::Tag;
use super::requests::TurnRef;
use super::World;

impl World<'_> {
    /// What request `id`'s prompt shares: as its prefill engine was told, on a graph; else as
    /// it stands now (a trace's block hashes are known at its arrival only).
    fn sharing_of(&self, id: u64, conv: Option<TurnRef>) -> Sharing {
        if let Some(sh) = self.handoff.as_ref().and_then(|h| h.sharing(id)) {
            return sh.clone();
        }
        Sharing::new(
            self.arrivals.prefix_of(id),
            crate::workload::trace::MOONCAKE_BLOCK_TOKENS,
            self.stream_of(id, conv),
        )
    }

    /// The conversation stream request `id` continues, if its turns carry their history (a
    /// job's calls share none this way).
    fn stream_of(&self, id: u64, conv: Option<TurnRef>) -> Option<StreamKey> {
        let c = conv.filter(|_| self.jobs.is_none())?.0;
        self.conversations.stream_key(c, id)
    }

    /// What a KV-aware router knows of a request's prompt: the blocks it may share, as its
    /// replica's engine will key them (its own tokens aside).
    pub(super) fn content_of(&self, id: u64, prompt_tokens: u64, conv: Option<TurnRef>) -> Content {
        Content {
            own: 0,
            prompt_tokens,
            sharing: Some(Box::new(self.sharing_of(id, conv))),
        }
    }

    /// Request `tag`, just enqueued on `replica`, shares its prompt's prefix there. On a graph
    /// whose replicas cache, what it shares is kept from its prefill replica on.
    pub(super) fn share_content(&mut self, replica: u32, tag: Tag) {
        let q = &self.requests[tag];
        let (id, conv) = (q.id, q.conv());
        if self.handoff.is_none() {
            // Colocated: told as it stands, with nothing to keep (no copy of the hashes made).
            self.cluster
                .share_prefix(replica, tag, self.arrivals.prefix_of(id));
            if let Some(key) = self.stream_of(id, conv) {
                self.cluster.share_stream(replica, tag, key);
            }
            return;
        }
        let sh = self.sharing_of(id, conv);
        let keeps = self.cluster.cache_block_tokens(replica).is_some();
        if let Some(h) = self
            .handoff
            .as_mut()
            .filter(|h| keeps && h.sharing(id).is_none())
        {
            if !sh.ids().is_empty() || sh.stream.is_some() {
                h.remember_sharing(id, sh.clone());
            }
        }
        self.cluster.share_prefix(replica, tag, sh.ids());
        if let Some(key) = sh.stream {
            self.cluster.share_stream(replica, tag, key);
        }
    }

    /// The keys of the prompt's leading shared blocks on `replica`, short of its last token (an
    /// engine computes that one, to sample from); none without a prefix cache.
    fn prompt_keys(&self, replica: u32, tag: Tag) -> Vec<u64> {
        let Some(bt) = self.cluster.cache_block_tokens(replica) else {
            return Vec::new();
        };
        let q = &self.requests[tag];
        let prompt = q.prompt as u64;
        let content = self.content_of(q.id, prompt, q.conv());
        (0..prompt.saturating_sub(1) / bt)
            .take_while(|&i| content.is_shared(bt, i))
            .map(|i| content.key(bt, i))
            .collect()
    }

    /// Take `blocks` of `replica` for request `tag`'s prompt KV (kept for its transfer, or to
    /// receive it into), its cached leading run held through the prefix cache: the tokens that
    /// run covers, or `None` (nothing taken) if the blocks are not free.
    pub(super) fn pin_prompt(&mut self, replica: u32, tag: Tag, blocks: u64) -> Option<u64> {
        let keys = self.prompt_keys(replica, tag);
        let run = self.cluster.pin_cached(replica, &keys, blocks)?;
        let id = self.requests[tag].id;
        let h = self.handoff.as_mut().expect("a prefill/decode world");
        h.keep(replica, id, &keys[..run as usize]);
        let bt = self.cluster.cache_block_tokens(replica).unwrap_or(0);
        Some(run * bt)
    }

    /// Request `id`'s `blocks` on `replica`, taken by `pin_prompt`, go back.
    pub(super) fn unpin_prompt(&mut self, replica: u32, id: u64, blocks: u64) {
        let h = self.handoff.as_mut().expect("a prefill/decode world");
        let held = h.take_kept(replica, id);
        self.cluster.unpin_cached(replica, &held, blocks);
    }
}

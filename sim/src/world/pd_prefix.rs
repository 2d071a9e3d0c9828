//! Prefix sharing on both sides of a prefill/decode handoff. A prefill replica's requests find
//! each other's cached prefixes as on a colocated replica; once a request's prefill is done,
//! the blocks kept for its transfer hold its cached prefix through the prefix cache (shared with
//! the requests that hold it too, and safe from eviction) and take new blocks only for the rest.
//! A decode replica that has the prompt's leading blocks cached (an earlier turn of the same
//! conversation, a shared system prompt) holds them the same way and receives only the rest of
//! the KV; its engine then reuses them, and caches what it received for the next request.
//!
//! The world names the blocks by the keys the engines give them (`World::content_of`): a key it
//! gets wrong is a block not found, never a block lost, since each block held is given back by
//! the key it was held with.

use super::event::Tag;
use super::World;

impl World<'_> {
    /// Request `tag`, just enqueued on `replica`, shares its prompt's prefix there: the trace's
    /// block hashes, and its conversation's stream.
    pub(super) fn share_content(&mut self, replica: u32, tag: Tag) {
        let q = &self.requests[tag];
        let (id, conv) = (q.id, q.conv());
        let mut ids = self.arrivals.prefix_of(id);
        if let (true, Some(h)) = (ids.is_empty(), self.handoff.as_ref()) {
            ids = h.prefix(id); // a decode replica's, past its arrival
        }
        self.cluster.share_prefix(replica, tag, ids);
        let stream = conv
            .filter(|_| self.jobs.is_none())
            .and_then(|(c, _)| self.conversations.stream_key(c, id));
        if let Some(key) = stream {
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
        eprintln!(
            "DBG r{replica} id{} prompt{} keys{} run{run} blocks{blocks}",
            self.requests[tag].id,
            self.requests[tag].prompt,
            keys.len()
        );
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

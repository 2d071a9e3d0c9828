//! Composing a step: the running requests first, then admissions, with preemption when a running
//! request cannot grow; and putting the composed step in flight.

use crate::gpu::StepShape;
use crate::protocol::Dispatch;

use super::seq::{Entry, Phase, Run, Step};
use super::Engine;

/// What admitting a waiting request takes (see `Engine::admission`).
struct Admission {
    kv_ready: bool,
    held: u32,
    tokens: u32,
    hit_blocks: u64,
    taking: u64,
    new_blocks: u64,
}

/// What a step does with one running request (`Engine::decide`).
#[derive(Clone, Copy, Debug)]
pub(super) enum Decided {
    Skip,
    Take {
        prefill: bool,
        tokens: u32,
        grow: u64,
    },
}

/// The step being composed.
pub(super) struct Compose {
    pub(super) entries: Vec<Entry>,
    pub(super) shape: StepShape,
    pub(super) budget: u32,
    /// A request was preempted for room in this step.
    pub(super) preempted: bool,
    /// Streak members in this step, each with one decode token and no entry (`streak.rs`).
    pub(super) streak: u32,
}

impl Engine {
    /// Running requests first, oldest first: a prefill chunk or one decode token each.
    pub(super) fn compose_running(&mut self, now_ns: u64, c: &mut Compose) {
        let mut i = 0;
        while i < self.running.len() && c.budget > 0 {
            let slot = self.running[i];
            let Decided::Take {
                prefill,
                tokens,
                grow,
            } = self.decide(slot, c.budget)
            else {
                i += 1;
                continue;
            };
            if !self.make_room(i, grow, now_ns, c) {
                break;
            }
            self.place(slot, now_ns, grow, prefill, tokens, c);
            c.budget -= tokens;
            i += 1;
        }
    }

    /// What this step does with the running request in `slot`, with `budget` tokens left: a
    /// prefill chunk or one decode token, and the blocks that takes; or nothing (its last token
    /// is in flight and the scheduler knows it is the last, or, without chunked prefill, its
    /// prompt does not fit what is left). The one rule of `compose_running` and the streak's.
    #[inline]
    pub(super) fn decide(&self, slot: u32, budget: u32) -> Decided {
        let seq = &self.seqs[slot as usize];
        let run: &Run = seq; // read once: a running request has its own
        let prefill = run.ctx < seq.need;
        if !prefill && seq.length_capped && run.sched_out >= seq.output {
            return Decided::Skip;
        }
        let tokens = if prefill {
            let rem = seq.need - run.ctx;
            if self.cfg.chunked_prefill {
                rem.min(budget)
            } else if rem <= budget {
                rem
            } else {
                return Decided::Skip;
            }
        } else {
            1
        };
        Decided::Take {
            prefill,
            tokens,
            grow: self.growth(run.ctx + tokens, run.blocks),
        }
    }

    /// Allocate `grow` blocks for the running request at index `i`, preempting the newest running
    /// requests (those after it) until they fit. Never the requester itself: with steps in
    /// flight a preempted request's blocks come back only when they end, so preempting the
    /// requester too would free nothing now and throw its in-flight work away, again and again.
    /// False if the requester must wait: for blocks already on their way back, or because no
    /// newer request is left to preempt (an older one will finish, or preempt it).
    ///
    /// Nor anyone, when no preemption can ever make the room: the free blocks, those on their
    /// way back and every other running request's together fall short (the rest of the pool is
    /// pinned outside the engine, for a transfer or for good). Preempting would throw work away
    /// for nothing; with a window of 2 it did so for ever, as the victim, admitted again into
    /// the other slot, was preempted in flight each time, and the replica stepped on instead of
    /// stalling. Without pinned blocks this never holds: every request fits the pool alone.
    fn make_room(&mut self, i: usize, grow: u64, now_ns: u64, c: &mut Compose) -> bool {
        if self.pool.take(grow) {
            return true;
        }
        if self.pinned_blocks > 0 {
            let (seqs, me) = (&self.seqs, self.running[i]);
            let others: u64 = self
                .running
                .iter()
                .filter(|&&s| s != me)
                .map(|&s| seqs[s as usize].blocks)
                .sum();
            if self.pool.free_blocks() + self.fenced_pending() + others < grow {
                return false;
            }
        }
        loop {
            if self.pool.take(grow) {
                return true;
            }
            if self.pool.free_blocks() + self.fenced_pending() >= grow {
                return false;
            }
            if self.running.len() <= i + 1 {
                return false;
            }
            let victim = *self.running.last().expect("a newer running request");
            self.preempt(victim, now_ns);
            c.preempted = true;
        }
    }

    /// What admitting the request in `slot` now would take: its tokens this step, the context
    /// it starts from (its remote KV, or its prefix found cached), the cached blocks it reuses
    /// and how many of those no one holds (they leave the free pool), and its new blocks.
    /// `None` if its prompt does not fit the step's budget (without chunked prefill).
    fn admission(&mut self, slot: u32, budget: u32) -> Option<Admission> {
        let seq = &self.seqs[slot as usize];
        debug_assert_eq!(seq.ctx, 0);
        // A prompt whose KV arrived from a prefill stage starts with a decode token.
        let kv_ready = seq.kv_ready && seq.incarnation == 0;
        let bt = self.cfg.block_tokens as u64;
        // The longest cached run of leading blocks (`run.rs`). A prompt whose KV arrived reuses
        // it too: only the rest was sent (`pin_cached` held it while the KV was written).
        let (hit_blocks, taking) = self.cached_run(slot);
        let seq = &self.seqs[slot as usize];
        let held = if kv_ready {
            seq.need
        } else {
            (hit_blocks * bt) as u32
        };
        let rem = if kv_ready { 1 } else { seq.need - held };
        let tokens = if self.cfg.chunked_prefill {
            rem.min(budget)
        } else if rem <= budget {
            rem
        } else {
            return None;
        };
        let new_blocks = self.pool.blocks_for((held + tokens) as u64) - hit_blocks;
        Some(Admission {
            kv_ready,
            held,
            tokens,
            hit_blocks,
            taking,
            new_blocks,
        })
    }

    /// Then waiting requests, in order, while nothing was preempted this step (vLLM's rule),
    /// unless the step would otherwise be empty.
    pub(super) fn admit_waiting(&mut self, now_ns: u64, c: &mut Compose) {
        while (!c.preempted || c.entries.is_empty())
            && c.budget > 0
            && (self.running.len() as u32) < self.cfg.max_num_seqs
        {
            let Some(slot) = self.waiting.front(&self.seqs) else {
                self.forget_run();
                break;
            };
            let Some(a) = self.admission(slot, c.budget) else {
                break;
            };
            // The watermark keeps room for the running requests to grow; alone, a request may
            // use the whole pool, so nothing waits for good.
            let reserve = if self.running.is_empty() {
                0
            } else {
                self.cfg.watermark_blocks
            };
            if self.pool.free_blocks() < a.new_blocks + a.taking + reserve {
                if self.pool.marked() > 0 {
                    self.stats.admission_stalls += 1;
                }
                if self.pinned_blocks > 0 {
                    self.stats.stalls_pinned += 1;
                }
                break; // admission only when the blocks are there
            }
            self.reuse_cached(slot, now_ns, &a);
            let taken = self.pool.take(a.new_blocks);
            assert!(taken, "the free blocks were counted");
            let seq = &mut self.seqs[slot as usize];
            if seq.incarnation == 0 {
                self.started.push(seq.tag);
            }
            seq.phase = Phase::Running;
            seq.ctx = a.held;
            seq.run_order = self.run_order_next;
            self.run_order_next += 1;
            self.waiting.pop_front();
            self.running.push(slot);
            self.place(slot, now_ns, a.new_blocks, !a.kv_ready, a.tokens, c);
            c.budget -= a.tokens;
        }
    }

    /// The request in `slot` takes the cached blocks its admission found: they are its leading
    /// blocks, and it skips computing their tokens.
    fn reuse_cached(&mut self, slot: u32, now_ns: u64, a: &Admission) {
        let seq = &mut self.seqs[slot as usize];
        if self.pool.cache().is_some() {
            if !a.kv_ready {
                self.stats.prefix_query_tokens += seq.need as u64;
                self.stats.prefix_hit_tokens += a.held as u64;
            }
            for i in 0..a.hit_blocks {
                self.pool
                    .hit(seq.content.key(self.cfg.block_tokens as u64, i));
            }
        }
        seq.touch(now_ns);
        seq.blocks += a.hit_blocks;
        seq.cached = a.hit_blocks as u32;
        if seq.marked {
            self.pool.mark(a.hit_blocks);
        }
    }

    /// Put the composed step in flight: it ends when the GPU is free plus its duration.
    pub(super) fn launch(&mut self, now_ns: u64, c: Compose) -> Dispatch {
        let duration_ns = self.costing.step_ns(c.shape);
        self.launch_timed(now_ns, c, duration_ns)
    }

    /// `launch`, with the step's time (`costing.step_ns` of its shape) known.
    #[inline]
    pub(super) fn launch_timed(&mut self, now_ns: u64, c: Compose, duration_ns: u64) -> Dispatch {
        let (d, streak_step) = self.clock(now_ns, duration_ns, c.shape.prefill_tokens, c.streak);
        self.inflight.push_back(Step {
            id: d.step,
            end_ns: d.end_ns,
            duration_ns,
            entries: c.entries,
            streak: c.streak,
            streak_step,
        });
        d
    }

    /// What a step of `duration_ns` going in flight changes but the steps in flight: the GPU's
    /// time, the step's number, the counts and the streak's. Returns its dispatch and its
    /// streak step's number.
    #[inline(always)]
    pub(super) fn clock(
        &mut self,
        now_ns: u64,
        duration_ns: u64,
        prefill_tokens: u64,
        streak: u32,
    ) -> (Dispatch, u64) {
        let start_ns = now_ns.max(self.gpu_free_ns);
        let end_ns = start_ns + duration_ns;
        self.gpu_free_ns = end_ns;
        let step = self.step_next;
        self.step_next += 1;
        self.stats.steps += 1;
        self.stats.busy_ns += duration_ns;
        self.stats.prefill_tokens += prefill_tokens;
        let streak_step = self.streak_launch(streak);
        let d = Dispatch {
            step,
            start_ns,
            end_ns,
        };
        (d, streak_step)
    }

    /// Put `tokens` of a request into the step being composed, with `blocks` newly allocated
    /// for them: the one path for running and newly admitted requests alike.
    #[inline(always)]
    pub(super) fn place(
        &mut self,
        slot: u32,
        now_ns: u64,
        blocks: u64,
        prefill: bool,
        tokens: u32,
        c: &mut Compose,
    ) {
        if blocks > 0 {
            self.on_alloc(slot, blocks); // allocating none marks and taints nothing
        }
        let (ctx, incarnation, sample) = self.seqs[slot as usize].advance(now_ns, blocks, tokens);
        if prefill {
            c.shape.add_prefill((ctx - tokens) as u64, tokens as u64);
        } else {
            c.shape.add_decode(ctx as u64);
        }
        c.entries.push(Entry {
            slot,
            incarnation,
            tokens,
            sample,
        });
        self.register_full_blocks(slot, false);
    }

    /// The blocks a request holding `blocks` needs more for a context of `ctx` tokens. Most
    /// decode tokens still fit the last block: that is a multiplication, not a division.
    #[inline]
    fn growth(&self, ctx: u32, blocks: u64) -> u64 {
        // A request never holds more blocks than its context needs.
        debug_assert!(blocks <= self.pool.blocks_for(ctx as u64));
        if ctx as u64 <= blocks * self.cfg.block_tokens as u64 {
            return 0;
        }
        self.pool.blocks_for(ctx as u64) - blocks
    }

    /// Blocks of a shared prefix whose tokens are all scheduled now are cached (vLLM V1 caches
    /// at scheduling): a request admitted after this step finds them. With `own_too`, the
    /// request's own blocks as well: only its own recompute can ever ask for those, so they are
    /// cached when it is preempted, and a finished request's own blocks go back without content
    /// (vLLM keeps them, but nothing can hit them; here they do not crowd the eviction order).
    #[inline(always)]
    fn register_full_blocks(&mut self, slot: u32, own_too: bool) {
        if self.pool.cache().is_none() {
            return;
        }
        let bt = self.cfg.block_tokens as u64;
        let seq = &self.seqs[slot as usize];
        // Nothing to register until the next block is full (most tokens stop here), nor, but
        // for its own recompute, in a request that shares nothing.
        let wanted = own_too || seq.content.may_share();
        if wanted && seq.caching && (seq.cached as u64 + 1) * bt <= seq.ctx as u64 {
            self.register_blocks(slot, own_too);
        }
    }

    fn register_blocks(&mut self, slot: u32, own_too: bool) {
        let bt = self.cfg.block_tokens as u64;
        let cache = self.pool.cache().expect("a prefix cache");
        let seq = &mut self.seqs[slot as usize];
        let full = (seq.ctx as u64 / bt).min(seq.blocks);
        while seq.caching && (seq.cached as u64) < full {
            let i = seq.cached as u64;
            if !own_too && !seq.content.is_shared(bt, i) {
                break;
            }
            if cache.register(seq.content.key(bt, i)) {
                seq.cached += 1;
            } else {
                seq.caching = false;
            }
        }
    }

    fn preempt(&mut self, slot: u32, now_ns: u64) {
        let last = self.running.pop();
        debug_assert_eq!(last, Some(slot));
        self.register_full_blocks(slot, true);
        let seq = &mut self.seqs[slot as usize];
        seq.touch(now_ns);
        self.pool.fence(seq.blocks);
        seq.fence();
        self.pool.release_fenced(seq);
        seq.restart();
        self.waiting.push_front(slot, &self.seqs);
        self.stats.preemptions += 1;
    }
}

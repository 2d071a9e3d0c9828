//! The dynamic batcher of one replica (Triton-like), as a sans-IO state machine.
//!
//! Requests queue until `max_batch_size` are waiting or the oldest has waited
//! `max_queue_delay`. The batch then runs as **one shared execution** to completion: a prefill
//! step over every prompt, then decode steps over every member until the longest output is done.
//! Members that finish early keep their slot as padding, and the batch's KV blocks (reserved for
//! prompt + output at formation) return to the pool only when the whole batch ends. This is the
//! contract's "shared execution frame".
//!
//! It implements the same `Scheduler` as the continuous engine. It runs one step at a time
//! (W = 1).

use std::collections::VecDeque;

use crate::gpu::{StepModel, StepShape};
use crate::kv::KvPool;
use crate::protocol::{
    fits, Abort, CheckpointReport, Dispatch, Gauges, NewRequest, Observed, Outbox, Outcome,
    Rejection, Released, ReplicaStats, Retired, Scheduler, StepOutput, StepReport,
};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BatcherConfig {
    pub max_batch_size: u32,
    pub max_queue_delay_ns: u64,
    pub block_tokens: u32,
    pub kv_blocks: u64,
    pub cost: StepModel,
}

#[derive(Clone, Copy, Debug)]
struct Member {
    req: NewRequest,
    blocks: u64,
    /// Output tokens delivered so far.
    done_out: u32,
    /// Since when its blocks count as retained (its cancel intent, or the batch's start if the
    /// intent came while it queued).
    marked_ns: Option<u64>,
}

#[derive(Clone, Copy, Debug)]
struct Queued {
    req: NewRequest,
    enqueued_ns: u64,
    /// A cancel intent came while it queued.
    marked: bool,
}

pub struct Batcher {
    cfg: BatcherConfig,
    kv: KvPool,
    queue: VecDeque<Queued>,
    batch: Vec<Member>,
    batch_started_ns: u64,
    /// The step in flight: its id, end time and duration.
    inflight: Option<(u64, u64, u64)>,
    step_next: u64,
    /// Its counters are the replica counters (padding and batches; no preemption, no fault).
    /// Aborts for members of a running batch count as unobserved: a shared execution frame
    /// observes none.
    stats: ReplicaStats,
    pending_aborts: Vec<Abort>,
    /// Blocks held now by members with a cancel intent (retained).
    marked_blocks: u64,
}

impl Batcher {
    pub fn new(cfg: BatcherConfig) -> Self {
        assert!(cfg.max_batch_size > 0);
        Batcher {
            kv: KvPool::new(cfg.kv_blocks, cfg.block_tokens),
            cfg,
            queue: VecDeque::new(),
            batch: Vec::new(),
            batch_started_ns: 0,
            inflight: None,
            step_next: 0,
            stats: ReplicaStats::default(),
            pending_aborts: Vec::new(),
            marked_blocks: 0,
        }
    }

    pub fn stats(&self) -> ReplicaStats {
        self.stats
    }
}

impl Batcher {
    /// `blocks` more count as retained.
    fn retain(&mut self, blocks: u64) {
        self.marked_blocks += blocks;
        let peak = &mut self.stats.marked_blocks_peak;
        *peak = (*peak).max(self.marked_blocks);
    }
}

impl Scheduler for Batcher {
    /// A request with `kv_ready` is taken as a whole prompt: the batcher has no remote KV.
    fn enqueue(&mut self, now_ns: u64, r: NewRequest) -> Result<(), Rejection> {
        fits(&self.kv, &r).inspect_err(|_| self.stats.rejected += 1)?;
        self.queue.push_back(Queued {
            req: r,
            enqueued_ns: now_ns,
            marked: false,
        });
        Ok(())
    }

    fn dispatch(&mut self, now_ns: u64, out: &mut Outbox) -> Option<Dispatch> {
        if self.inflight.is_some() {
            return None;
        }
        let mut shape = StepShape::default();
        if self.batch.is_empty() {
            let full = self.queue.len() as u32 >= self.cfg.max_batch_size;
            let timed_out = self
                .queue
                .front()
                .is_some_and(|q| now_ns >= q.enqueued_ns + self.cfg.max_queue_delay_ns);
            if !full && !timed_out {
                return None;
            }
            while (self.batch.len() as u32) < self.cfg.max_batch_size {
                let Some(q) = self.queue.front() else { break };
                let total = q.req.prompt_tokens as u64 + q.req.output_tokens as u64;
                let blocks = self.kv.blocks_for(total);
                if !self.kv.try_alloc(blocks) {
                    break;
                }
                let q = self.queue.pop_front().expect("front exists");
                out.started.push(q.req.tag);
                let marked_ns = q.marked.then_some(now_ns);
                if q.marked {
                    self.retain(blocks);
                }
                self.batch.push(Member {
                    req: q.req,
                    blocks,
                    done_out: 0,
                    marked_ns,
                });
                shape.add_prefill(0, q.req.prompt_tokens as u64);
            }
            assert!(
                !self.batch.is_empty(),
                "an idle batcher always fits one request"
            );
            self.batch_started_ns = now_ns;
            self.stats.batches += 1;
        } else {
            // A decode step over every member, finished ones as padding.
            for m in &self.batch {
                shape
                    .add_decode((m.req.prompt_tokens + m.done_out.min(m.req.output_tokens)) as u64);
            }
        }
        let duration_ns = self.cfg.cost.step_ns(shape);
        let step = self.step_next;
        self.step_next += 1;
        self.stats.steps += 1;
        self.stats.busy_ns += duration_ns;
        let end_ns = now_ns + duration_ns;
        self.inflight = Some((step, end_ns, duration_ns));
        Some(Dispatch {
            step,
            start_ns: now_ns,
            end_ns,
        })
    }

    fn step_done(&mut self, now_ns: u64, step: u64, out: &mut Outbox) -> StepReport {
        let (id, end_ns, duration_ns) = self.inflight.take().expect("a step in flight");
        assert_eq!((id, end_ns), (step, now_ns));
        let prefill = self.batch.iter().all(|m| m.done_out == 0);
        let mut tokens = 0u64;
        let mut all_done = true;
        for m in &mut self.batch {
            let t = if prefill { m.req.prompt_tokens } else { 1 };
            tokens += t as u64;
            let outcome = if m.done_out < m.req.output_tokens {
                m.done_out += 1;
                self.stats.tokens_delivered += 1;
                Outcome::Token {
                    index: m.done_out,
                    last: m.done_out == m.req.output_tokens,
                }
            } else {
                self.stats.padding_token_steps += 1;
                Outcome::Padding
            };
            all_done &= m.done_out == m.req.output_tokens;
            out.outputs.push(StepOutput {
                id: m.req.id,
                tag: m.req.tag,
                corrupted: false,
                tokens: t,
                outcome,
            });
        }
        if all_done {
            let held_ns = (now_ns - self.batch_started_ns) as u128;
            for m in self.batch.drain(..) {
                self.kv.free(m.blocks);
                let marked_ns = m.marked_ns.map_or(0, |at| now_ns - at);
                if m.marked_ns.is_some() {
                    self.marked_blocks -= m.blocks;
                }
                out.released.push(Released {
                    id: m.req.id,
                    tag: m.req.tag,
                    kv_block_ns: m.blocks as u128 * held_ns,
                    kv_block_ns_marked: m.blocks as u128 * marked_ns as u128,
                    restarts: 0,
                });
                out.retired.push(Retired {
                    id: m.req.id,
                    tag: m.req.tag,
                });
            }
        }
        StepReport {
            step,
            duration_ns,
            tokens,
            streak: None,
        }
    }

    /// An abort arrives; it takes effect at the next scheduling pass.
    fn abort(&mut self, a: Abort) {
        self.pending_aborts.push(a);
    }

    /// Triton's core checks for cancelled requests when it forms a batch: aborts reach queued
    /// requests, which leave now with nothing allocated. A member of a running batch is inside a
    /// shared execution frame that observes nothing (a backend that does not poll); its output is
    /// discarded by the owner, and its blocks return when the batch ends. Abort-path faults are
    /// not modelled here: the core path has none.
    fn checkpoint(&mut self, _now_ns: u64, out: &mut Outbox) -> CheckpointReport {
        let mut report = CheckpointReport::default();
        for a in std::mem::take(&mut self.pending_aborts) {
            report.aborts += 1;
            self.stats.aborts_handled += 1;
            let before = self.queue.len();
            let mut kept = VecDeque::with_capacity(before);
            for q in self.queue.drain(..) {
                if a.scope.reaches(&q.req.handle) {
                    out.observed.push(Observed {
                        id: q.req.id,
                        tag: q.req.tag,
                        in_scope: true,
                    });
                    out.released.push(Released {
                        id: q.req.id,
                        tag: q.req.tag,
                        kv_block_ns: 0,
                        kv_block_ns_marked: 0,
                        restarts: 0,
                    });
                    out.retired.push(Retired {
                        id: q.req.id,
                        tag: q.req.tag,
                    });
                } else {
                    kept.push_back(q);
                }
            }
            self.queue = kept;
            let in_batch = self.batch.iter().any(|m| a.scope.reaches(&m.req.handle));
            if in_batch {
                self.stats.aborts_unobserved += 1;
            } else if self.queue.len() == before {
                report.unknown += 1;
                self.stats.aborts_unknown += 1;
            }
        }
        report
    }

    /// A member's blocks are held until its batch ends whatever its intent: from the intent on,
    /// they count as retained. A queued request's count from its batch's start.
    fn mark_intent(&mut self, now_ns: u64, tag: u32) {
        if let Some(m) = self
            .batch
            .iter_mut()
            .find(|m| m.req.tag == tag && m.marked_ns.is_none())
        {
            m.marked_ns = Some(now_ns);
            let blocks = m.blocks;
            self.retain(blocks);
        } else if let Some(q) = self.queue.iter_mut().find(|q| q.req.tag == tag) {
            q.marked = true;
        }
    }

    /// When the batcher wants to be woken to form a batch by timeout, if ever.
    fn timer_ns(&self) -> Option<u64> {
        if !self.batch.is_empty() || self.queue.len() as u32 >= self.cfg.max_batch_size {
            return None;
        }
        self.queue
            .front()
            .map(|q| q.enqueued_ns + self.cfg.max_queue_delay_ns)
    }

    fn gauges(&self) -> Gauges {
        Gauges {
            waiting: self.queue.len() as u64,
            running: self.batch.len() as u64,
            kv_blocks: self.kv.in_use(),
            kv_retained: self.marked_blocks,
            kv_pinned: 0,
        }
    }

    fn load(&self) -> u64 {
        (self.queue.len() + self.batch.len()) as u64
    }

    fn is_idle(&self) -> bool {
        self.queue.is_empty() && self.batch.is_empty() && self.inflight.is_none()
    }

    fn kv(&self) -> &KvPool {
        &self.kv
    }

    fn totals(&self) -> ReplicaStats {
        self.stats
    }
}

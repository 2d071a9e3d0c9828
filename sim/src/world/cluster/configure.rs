//! A replica as the scenario configures it: its scheduler, its limits and step model (from its
//! profile, or the scenario's own), its KV capacity, and the backend's cancel behaviour.

use std::sync::Arc;

use cancelsim_models::batcher::BatcherConfig;
use cancelsim_models::engine::EngineConfig;
use cancelsim_models::gpu::StepTable;
use cancelsim_models::protocol::{BlastRadius, Checkpoint, ReleaseMode, UnknownAbort};
use cancelsim_models::replica::{self, Replica};

use crate::dist::ms_to_ns;
use crate::scenario::{
    AfterCompletion, CheckpointConfig, Cluster as ClusterSpec, IdentityMode, Radius, Release,
    Scenario, Scheduler,
};

pub(crate) fn radius(r: Radius) -> BlastRadius {
    match r {
        Radius::Request => BlastRadius::Request,
        Radius::Batch => BlastRadius::Batch,
        Radius::Engine => BlastRadius::Engine,
    }
}

/// One replica as the scenario configures it. `late_aborts`: an abort may name a request the
/// replica retired (see `Cluster::new`).
pub(super) fn configured(
    s: &Scenario,
    c: &ClusterSpec,
    table: Option<&Arc<StepTable>>,
    late_aborts: bool,
) -> Replica {
    let batched = match &c.scheduler {
        Scheduler::Continuous {
            max_num_batched_tokens,
            ..
        } => *max_num_batched_tokens,
        Scheduler::Dynamic { .. } => None,
    };
    let (cost, kv_tokens, profile) = c.step_costs(batched, table);
    let blocks = |block_tokens: u32, explicit: Option<u64>| {
        explicit.unwrap_or_else(|| (kv_tokens / block_tokens as u64).max(1))
    };
    let b = &s.backend;
    match &c.scheduler {
        Scheduler::Continuous {
            max_num_seqs,
            max_num_batched_tokens,
            chunked_prefill,
            block_tokens,
            kv_blocks,
            window,
            watermark,
            prefix_caching,
        } => replica::continuous(EngineConfig {
            max_num_seqs: max_num_seqs
                .or(profile.map(|p| p.max_num_seqs))
                .unwrap_or(256),
            max_num_batched_tokens: max_num_batched_tokens
                .or(profile.map(|p| p.max_num_batched_tokens))
                .unwrap_or(2048),
            chunked_prefill: *chunked_prefill,
            block_tokens: *block_tokens,
            kv_blocks: blocks(*block_tokens, *kv_blocks),
            watermark_blocks: (blocks(*block_tokens, *kv_blocks) as f64 * watermark) as u64,
            prefix_caching: *prefix_caching,
            window: *window,
            cost,
            checkpoint: match b.checkpoint {
                CheckpointConfig::EveryStep => Checkpoint::EveryPasses(1),
                CheckpointConfig::EveryKSteps(f) => Checkpoint::EveryPasses(f),
                CheckpointConfig::Never => Checkpoint::Never,
            },
            release: match b.release {
                Release::Fenced => ReleaseMode::Fenced,
                Release::Immediate => ReleaseMode::Immediate,
            },
            unknown_abort: match b.cancel_after_completion {
                AfterCompletion::Ignore => UnknownAbort::Ignore,
                AfterCompletion::Fault(r) => UnknownAbort::Fault(radius(r)),
            },
            // Only an abort by id ever reads the tombstones: where none can come, keeping them
            // is an insertion into a map of thousands for every request that leaves.
            tombstones: late_aborts && s.adapter.identity == IdentityMode::ServerGenerated,
            // A chunk that waits for its writer is an event of the run: the token that makes
            // it comes out as an output (`lazy.rs`).
            lazy_output_every: match s.playback.writer_wait_ms == crate::dist::Dist::Constant(0.0) {
                true => 0,
                false => s.playback.chunk_tokens,
            },
        }),
        Scheduler::Dynamic {
            max_batch_size,
            max_queue_delay_ms,
            block_tokens,
            kv_blocks,
        } => replica::dynamic(BatcherConfig {
            max_batch_size: *max_batch_size,
            max_queue_delay_ns: ms_to_ns(*max_queue_delay_ms),
            block_tokens: *block_tokens,
            kv_blocks: blocks(*block_tokens, *kv_blocks),
            cost,
        }),
    }
}

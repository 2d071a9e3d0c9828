//! The fuzzer's shared prefixes and KV-aware routers: drawn last, each from a stream of its
//! own, onto worlds whose caches can share blocks.

use super::draw::Draw;
use super::fuzz::Tier;
use crate::kernel::rng::{Purpose, Stream};
use crate::scenario::{ConditionalSpec, Router, Scenario, Scheduler, Source, TraceFormat};

/// A fifth of the worlds with prefix caching replay the Mooncake trace instead, whose block
/// hashes share prefixes between requests (on colocated and prefill/decode graphs alike). Its
/// own stream, so every world it leaves alone stays what it was.
pub(super) fn shared_prefixes(s: &mut Scenario, tier: Tier) {
    let caching = matches!(
        s.cluster.scheduler,
        Scheduler::Continuous {
            prefix_caching: true,
            ..
        }
    );
    if !caching {
        return;
    }
    let requests = match s.workload.source {
        Source::Poisson { requests, .. }
        | Source::Gamma { requests, .. }
        | Source::OnOff { requests, .. } => requests,
        Source::Trace { rows, .. } => rows.unwrap_or(100),
        _ => return,
    };
    let mut d = Draw {
        s: Stream::new(s.seed, Purpose::Fuzz, PREFIX_SUBKEY + tier as u64),
    };
    if !d.chance(0.2) {
        return;
    }
    let was = s.workload.source.clone();
    s.workload.source = Source::Trace {
        path: "traces/mooncake_conversation_trace.jsonl".into(),
        format: TraceFormat::MooncakeJsonl,
        speedup: d.scale(0.01, 20.0),
        first_row: d.int(0, 11_000),
        rows: Some(requests.min(12_031)),
        sample_fraction: 1.0,
        max_total_tokens: d.chance(0.5).then(|| d.int(64, 65_536) as u32),
    };
    if s.validate().is_err() {
        s.workload.source = was;
    }
}

/// Half the worlds whose caches a router can look into get a KV-aware router. Its draws come
/// from a stream of their own, so every world drawn before it existed stays what it was.
pub(super) fn kv_router(s: &mut Scenario, tier: Tier) {
    if matches!(s.cluster.router, Router::SharedQueue { .. }) {
        return;
    }
    let mut d = Draw {
        s: Stream::new(s.seed, Purpose::Fuzz, KV_ROUTER_SUBKEY + tier as u64),
    };
    if !d.chance(0.5) {
        return;
    }
    let was = s.cluster.router;
    let (overlap_weight, load_weight) = (d.int(0, 8) as u32, d.int(0, 400) as u32);
    let some_lag = d.int(1, 1_000_000) as u32;
    s.cluster.router = Router::KvAware {
        overlap_weight,
        load_weight,
        lag_us: d.pick(&[0, some_lag]),
    };
    if s.validate().is_err() {
        s.cluster.router = was;
    }
}

/// Half the prefill/decode graphs disaggregate conditionally: a threshold from none to every
/// prompt, and maybe a prefill queue bound. Its own stream, as above.
pub(super) fn conditional(s: &mut Scenario, tier: Tier) {
    let Some(t) = s.cluster.topology.as_mut() else {
        return;
    };
    let mut d = Draw {
        s: Stream::new(s.seed, Purpose::Fuzz, CONDITIONAL_SUBKEY + tier as u64),
    };
    if !d.chance(0.5) {
        return;
    }
    let some = d.int(1, 20_000) as u32;
    let queue = d.int(1, 16) as u32;
    t.handoff.conditional = Some(ConditionalSpec {
        max_local_prefill_tokens: d.pick(&[0, some, u32::MAX]),
        max_prefill_queue: d.chance(0.5).then_some(queue),
    });
    if s.validate().is_err() {
        if let Some(t) = s.cluster.topology.as_mut() {
            t.handoff.conditional = None;
        }
    }
}

/// The KV router's draw stream: `Purpose::Fuzz` with this plus the tier.
const KV_ROUTER_SUBKEY: u64 = 0x4b56_0000;
/// The shared prefixes' draw stream.
const PREFIX_SUBKEY: u64 = 0x5046_0000;
/// Conditional disaggregation's draw stream.
const CONDITIONAL_SUBKEY: u64 = 0x4344_0000;

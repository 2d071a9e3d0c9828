//! The fuzzer's shared prefixes and KV-aware routers: drawn last, each from a stream of its
//! own, onto worlds whose caches can share blocks.

use super::draw::Draw;
use super::fuzz::Tier;
use crate::kernel::rng::{Purpose, Stream};
use crate::scenario::{
    ConditionalSpec, LinkRon, ProfileRef, RoleSpec, Router, Scenario, Scheduler, Source,
    TopologySpec, TraceFormat,
};

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

/// Two fifths of the prefill/decode graphs split a stage in two pools: the second its own GPU
/// of the same model and its own pool size, and every prefill-to-decode pair its own link (some
/// pairs left out, so a decode pool hears from one prefill pool only). Its own stream.
pub(super) fn pools(s: &mut Scenario, tier: Tier) {
    let Some(t) = s.cluster.topology.as_ref() else {
        return;
    };
    let mut d = Draw {
        s: Stream::new(s.seed, Purpose::Fuzz, POOLS_SUBKEY + tier as u64),
    };
    if !d.chance(0.4) {
        return;
    }
    let was = t.clone();
    let mut t = was.clone();
    split(s, &mut t, RoleSpec::Prefill, &mut d);
    split(s, &mut t, RoleSpec::Decode, &mut d);
    let kv = t
        .links
        .iter()
        .find(|l| l.from == "prefill" && l.to == "decode");
    let Some(kv) = kv.cloned() else {
        return;
    };
    t.links = pool_links(&t, &kv, &mut d);
    s.cluster.topology = Some(t);
    if s.validate().is_err() {
        s.cluster.topology = Some(was);
    }
}

/// The first stage of `role` in two pools, if it has two replicas or more.
fn split(s: &Scenario, t: &mut TopologySpec, role: RoleSpec, d: &mut Draw) {
    let Some(i) = t.stages.iter().position(|st| st.role == role) else {
        return;
    };
    let n = t.stages[i].replicas;
    if n < 2 {
        return;
    }
    let k = d.int(1, n as u64 - 1) as u32;
    t.stages[i].replicas = k;
    let mut other = t.stages[i].clone();
    other.name = format!("{}-b", other.name);
    other.replicas = n - k;
    other.profile = other_gpu(s, d);
    other.scheduler = other_pool(s, d);
    t.stages.push(other);
}

/// The router to every prefill pool, prefill pools to decode pools (each pair its own draw of
/// `kv`'s latency and bandwidth), decode pools to playback.
fn pool_links(t: &TopologySpec, kv: &LinkRon, d: &mut Draw) -> Vec<LinkRon> {
    let names = |role| -> Vec<String> {
        let of = t.stages.iter().filter(|st| st.role == role);
        of.map(|st| st.name.clone()).collect()
    };
    let (prefills, decodes) = (names(RoleSpec::Prefill), names(RoleSpec::Decode));
    let link = |from: &str, to: &str| LinkRon {
        from: from.into(),
        to: to.into(),
        ..kv.clone()
    };
    let free = |from: &str, to: &str| LinkRon {
        latency_ms: 0.0,
        bandwidth_gbps: None,
        loss: 0.0,
        ..link(from, to)
    };
    let mut links: Vec<LinkRon> = prefills.iter().map(|p| free("router", p)).collect();
    for (i, p) in prefills.iter().enumerate() {
        for (j, q) in decodes.iter().enumerate() {
            // The first prefill pool feeds every decode pool; another, each but maybe one.
            if i > 0 && j > 0 && d.chance(0.3) {
                continue;
            }
            links.push(LinkRon {
                latency_ms: d.real(0.0, 5.0),
                bandwidth_gbps: d.chance(0.8).then(|| d.scale(1.0, 800.0)),
                ..link(p, q)
            });
        }
    }
    links.extend(decodes.iter().map(|q| free(q, "playback")));
    links
}

/// A fifth of the prefill/decode graphs get a Colocated pool beside them, taken from their
/// decode replicas (so `cluster.replicas` stays). Its own stream.
pub(super) fn beside(s: &mut Scenario, tier: Tier) {
    let Some(t) = s.cluster.topology.as_ref() else {
        return;
    };
    let mut d = Draw {
        s: Stream::new(s.seed, Purpose::Fuzz, BESIDE_SUBKEY + tier as u64),
    };
    let decode = t.stages.iter().position(|st| st.role == RoleSpec::Decode);
    let Some(i) = decode.filter(|&i| t.stages[i].replicas >= 2) else {
        return;
    };
    if !d.chance(0.2) {
        return;
    }
    let was = t.clone();
    let mut t = was.clone();
    let n = t.stages[i].replicas;
    let k = d.int(1, n as u64 - 1) as u32;
    t.stages[i].replicas = n - k;
    let mut side = t.stages[i].clone();
    side.name = "side".into();
    side.role = RoleSpec::Colocated;
    side.replicas = k;
    t.stages.push(side);
    let free = |from: &str, to: &str| LinkRon {
        from: from.into(),
        to: to.into(),
        latency_ms: 0.0,
        bandwidth_gbps: None,
        loss: 0.0,
    };
    t.links.push(free("router", "side"));
    t.links.push(free("side", "playback"));
    s.cluster.topology = Some(t);
    if s.validate().is_err() {
        s.cluster.topology = Some(was);
    }
}

/// Another GPU for the same model, sometimes: the named 8B profiles' siblings.
fn other_gpu(s: &Scenario, d: &mut Draw) -> Option<ProfileRef> {
    let ProfileRef::Named(name) = &s.cluster.profile else {
        return None;
    };
    let gpus = ["h100", "a100", "h200", "b200"];
    let model = name.strip_prefix("llama-3.1-8b-")?;
    (gpus.contains(&model) && d.chance(0.5))
        .then(|| ProfileRef::Named(format!("llama-3.1-8b-{}", d.pick(&gpus))))
}

/// Another pool size, sometimes: the cluster's scheduler with other `kv_blocks`.
fn other_pool(s: &Scenario, d: &mut Draw) -> Option<Scheduler> {
    let mut sch = s.cluster.scheduler.clone();
    let Scheduler::Continuous { kv_blocks, .. } = &mut sch else {
        return None;
    };
    if !d.chance(0.5) {
        return None;
    }
    *kv_blocks = Some(d.scale(64.0, 200_000.0) as u64);
    Some(sch)
}

/// The KV router's draw stream: `Purpose::Fuzz` with this plus the tier.
const KV_ROUTER_SUBKEY: u64 = 0x4b56_0000;
/// The shared prefixes' draw stream.
const PREFIX_SUBKEY: u64 = 0x5046_0000;
/// Conditional disaggregation's draw stream.
const CONDITIONAL_SUBKEY: u64 = 0x4344_0000;
/// The pools' draw stream.
const POOLS_SUBKEY: u64 = 0x504c_0000;
/// The Colocated pool beside's draw stream.
const BESIDE_SUBKEY: u64 = 0x4253_0000;

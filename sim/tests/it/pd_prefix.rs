//! Prefix sharing on a prefill/decode graph against closed forms: the prefill replica finds the
//! shared prefix it computed before, the decode replica that cached it receives only the rest,
//! and every block comes back (the run's own conservation check) through cancels on both sides.

use std::path::Path;

use cancelsim::metrics::Summary;
use cancelsim::run;
use cancelsim::scenario::Scenario;

use super::kv_routing::trace;
use crate::scratch::Scratch;

/// KV bytes per token of a `Custom` profile (Llama-3.1-8B's).
const KV_BYTES: u64 = 131_072;

fn pd(dir: &Path, prefill: u32, decode: u32, extra: &str) -> Summary {
    let ron = format!(
        "Scenario(name: \"pd-prefix\", seed: 1, workload: (source: Trace(path: \"t.jsonl\", \
         format: MooncakeJsonl)), cluster: (replicas: {n}{extra}, \
         profile: Custom(c0_ms: 10.0, prefill_tokens_per_s: 20000.0, kv_blocks_16: 5000), \
         scheduler: Continuous(window: 1), topology: Some((stages: [\
         (name: \"router\", role: Router), (name: \"prefill\", role: Prefill, replicas: {prefill}), \
         (name: \"decode\", role: Decode, replicas: {decode}), (name: \"playback\", role: Playback)], links: [\
         (from: \"router\", to: \"prefill\"), \
         (from: \"prefill\", to: \"decode\", latency_ms: 1.0, bandwidth_gbps: 100.0), \
         (from: \"decode\", to: \"playback\")]))))",
        n = prefill + decode,
    );
    let mut s = Scenario::parse(&ron, "<inline>").unwrap();
    s.base_dir = dir.to_path_buf();
    run::counterfactual(&s, 1).unwrap()
}

#[test]
fn one_prefill_one_decode_compute_and_send_the_shared_prefix_once() {
    let dir = Scratch::new("pd-prefix", "closed-form", true);
    // Six requests a second apart, each done before the next: 2,048-token prompts whose first
    // 1,024 tokens are the shared blocks 7 and 8 (64 blocks of 16 tokens).
    let rows: Vec<(u64, u32)> = (0..6).map(|i| (i * 1000, 4)).collect();
    trace(&dir, &rows);
    let (prompt, shared) = (2048, 1024);
    let s = pd(&dir, 1, 1, "");
    // The prefill replica computes the prefix once; the five after find it.
    assert_eq!(s.kv.prefix_query_tokens, 6 * prompt);
    assert_eq!(s.kv.prefix_hit_tokens, 5 * shared);
    // The decode replica cached the first request's prefix as it received it: the five after
    // send only their own half.
    let h = s.handoff.expect("a handoff section");
    assert_eq!(h.transfers_done, 6);
    assert_eq!(h.transfer_tokens_cached, 5 * shared);
    assert_eq!(h.transfer_bytes, (6 * prompt - 5 * shared) * KV_BYTES);
    assert_eq!(s.requests.completed, 6);
}

#[test]
fn two_prefill_replicas_each_compute_the_prefix_once() {
    let dir = Scratch::new("pd-prefix", "two-prefill", true);
    let rows: Vec<(u64, u32)> = (0..6).map(|i| (i * 1000, 4)).collect();
    trace(&dir, &rows);
    // Round robin over two prefill replicas: each computes the prefix for its first request;
    // the one decode replica still sends it once.
    let s = pd(&dir, 2, 1, ", router: RoundRobin");
    assert_eq!(s.kv.prefix_hit_tokens, 4 * 1024);
    assert_eq!(s.handoff.unwrap().transfer_tokens_cached, 5 * 1024);
}

/// The first `rows` rows of the Mooncake trace, `speedup` times as fast, on `prefill` +
/// `decode` replicas of the 8B/H100, with `rest` at the scenario's level.
pub(crate) fn mooncake_pd(
    rows: u64,
    speedup: f64,
    prefill: u32,
    decode: u32,
    kv: &str,
    rest: &str,
) -> Scenario {
    mooncake_pd_with(rows, speedup, (prefill, decode), kv, "", rest)
}

/// The same, with `handoff` added to the handoff's section.
pub(crate) fn mooncake_pd_with(
    rows: u64,
    speedup: f64,
    (prefill, decode): (u32, u32),
    kv: &str,
    handoff: &str,
    rest: &str,
) -> Scenario {
    let trace = super::prefix::TRACE;
    let ron = format!(
        "Scenario(name: \"pd-mooncake\", seed: 1, workload: (source: Trace(path: \"{trace}\", \
         format: MooncakeJsonl, rows: Some({rows}), speedup: {speedup})), \
         cluster: (replicas: {n}, profile: Named(\"llama-3.1-8b-h100\"), \
         scheduler: Continuous(window: 1, {kv}), topology: Some((stages: [\
         (name: \"router\", role: Router), (name: \"prefill\", role: Prefill, replicas: {prefill}), \
         (name: \"decode\", role: Decode, replicas: {decode}), (name: \"playback\", role: Playback)], links: [\
         (from: \"router\", to: \"prefill\"), \
         (from: \"prefill\", to: \"decode\", latency_ms: 1.0, bandwidth_gbps: 100.0, loss: 0.05), \
         (from: \"decode\", to: \"playback\")], \
         handoff: (prefill_reclaim: Lease(lease_ms: 2000.0, grace_ms: 500.0), \
         decode_reclaim: Lease(lease_ms: 1000.0, grace_ms: 0.0), {handoff})))){rest})",
        n = prefill + decode,
    );
    let mut s = Scenario::parse(&ron, "<inline>").unwrap();
    s.base_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios");
    s
}

#[test]
fn on_the_mooncake_trace_both_sides_find_what_one_unbounded_cache_would() {
    // Requests a thousand times further apart than in the trace, and caches that never evict:
    // the prefill replica finds the trace's own reuse, and the decode replica, which cached
    // every prompt it received, is sent none of it again.
    let s = mooncake_pd(300, 0.001, 1, 1, "kv_blocks: Some(3000000)", "");
    let s = run::counterfactual(&s, 1).unwrap();
    let (query, hit) = super::prefix::ideal_hits(300);
    assert_eq!(
        (s.kv.prefix_query_tokens, s.kv.prefix_hit_tokens),
        (query, hit)
    );
    let h = s.handoff.unwrap();
    assert_eq!(h.transfer_tokens_cached, hit);
    assert_eq!(h.transfer_bytes, (query - hit) * KV_BYTES);
}

#[test]
fn a_cancel_storm_on_shared_prefixes_gives_every_block_back_on_both_sides() {
    // The trace at its own pace on small pools (prefixes evicted and found again), 30 % of the
    // requests cancelled at every stage, the handoff's included, with lossy notices and leases:
    // each run ends with every pool's blocks allocated equal to those freed, or fails.
    let rest = ", cancellation: (fraction: 0.3, stage: Random, delay_ms: Uniform(low: 0.0, \
                high: 30.0)), policies: [PerRequest, FinishAndDiscard, Ideal, GroupAbort(Engine)]";
    let s = mooncake_pd(400, 1.0, 2, 2, "kv_blocks: Some(6000)", rest);
    let opts = run::RunOptions::default();
    let (report, _) = run::run(&s, 1, opts).unwrap();
    assert_eq!(report.policies.len(), 4);
    for p in report.policies.iter().chain([&report.counterfactual]) {
        assert!(p.kv.prefix_hit_tokens > 0, "{}: {:?}", p.policy, p.kv);
        let h = p.handoff.unwrap();
        assert!(h.transfer_tokens_cached > 0, "{}: {h:?}", p.policy);
    }
}

#[test]
fn a_kv_aware_router_keeps_a_shared_prefix_on_one_prefill_replica() {
    let dir = Scratch::new("pd-prefix", "kv-router", true);
    let rows: Vec<(u64, u32)> = (0..6).map(|i| (i * 1000, 4)).collect();
    trace(&dir, &rows);
    // Two prefill replicas: by their published caches, the five after the first go where the
    // prefix is (round robin computed it on each: 4 x 1,024 found).
    let s = pd(
        &dir,
        2,
        1,
        ", router: KvAware(overlap_weight: 1, load_weight: 1)",
    );
    assert_eq!(s.kv.prefix_hit_tokens, 5 * 1024);
    let r = s.router.expect("a router section");
    assert_eq!(
        (r.decisions, r.present_hit_tokens, r.misroutes),
        (6, 5 * 1024, 0)
    );
}

//! The KV-aware router against truths computed here: two workers and one shared prefix in
//! closed form, the lag's misroute, and the Mooncake trace's own hit rate.

use std::path::Path;

use cancelsim::run;
use cancelsim::scenario::Scenario;

use crate::scratch::Scratch;

/// A Mooncake trace of `rows` `(timestamp_ms, output_tokens)`: each prompt is 2,048 tokens, its
/// first 1,024 the shared blocks 7 and 8, its second half its own.
pub(crate) fn trace(dir: &Path, rows: &[(u64, u32)]) {
    let lines: Vec<String> = rows
        .iter()
        .enumerate()
        .map(|(i, (t, out))| {
            let own = [100 + 2 * i as u64, 101 + 2 * i as u64];
            format!(
                "{{\"timestamp\": {t}, \"input_length\": 2048, \"output_length\": {out}, \
                 \"hash_ids\": [7, 8, {}, {}]}}",
                own[0], own[1]
            )
        })
        .collect();
    std::fs::write(dir.join("t.jsonl"), lines.join("\n") + "\n").unwrap();
}

pub(crate) fn scenario(dir: &Path, router: &str) -> cancelsim::metrics::Summary {
    let ron = format!(
        "Scenario(name: \"kv\", seed: 1, workload: (source: Trace(path: \"t.jsonl\", \
         format: MooncakeJsonl)), cluster: (replicas: 2, router: {router}, \
         profile: Custom(c0_ms: 10.0, prefill_tokens_per_s: 20000.0, kv_blocks_16: 5000), \
         scheduler: Continuous(window: 1)))"
    );
    let mut s = Scenario::parse(&ron, "<inline>").unwrap();
    s.base_dir = dir.to_path_buf();
    run::counterfactual(&s, 1).unwrap()
}

#[test]
fn two_workers_one_shared_prefix_the_router_keeps_it_on_one() {
    let dir = Scratch::new("kv", "closed-form", true);
    // Six requests a second apart: each is done before the next, so load never decides.
    let rows: Vec<(u64, u32)> = (0..6).map(|i| (i * 1000, 4)).collect();
    trace(&dir, &rows);
    let shared = 1024; // blocks 7 and 8: 64 blocks of 16 tokens
    let kv = scenario(&dir, "KvAware(overlap_weight: 1, load_weight: 1)");
    // The first computes the prefix; the five after it find it on the same worker.
    assert_eq!(kv.kv.prefix_query_tokens, 6 * 2048);
    assert_eq!(kv.kv.prefix_hit_tokens, 5 * shared);
    let r = kv.router.expect("a router section");
    assert_eq!((r.decisions, r.prompt_tokens), (6, 6 * 2048));
    assert_eq!(r.expected_hit_tokens, 5 * shared);
    assert_eq!(r.present_hit_tokens, 5 * shared);
    assert_eq!(r.misroutes, 0);
    // Round robin computes it once on each worker.
    let rr = scenario(&dir, "RoundRobin");
    assert_eq!(rr.kv.prefix_hit_tokens, 4 * shared);
    assert!(rr.router.is_none());
}

#[test]
fn a_lagging_view_misroutes_the_request_the_cache_would_have_kept() {
    let dir = Scratch::new("kv", "lag", true);
    // The first request decodes for long; the second comes after its prefix is cached. The
    // truth: worker 0 costs 64 blocks + 1 request, worker 1 128 blocks, so worker 0.
    trace(&dir, &[(0, 2000), (500, 4)]);
    let fresh = scenario(&dir, "KvAware(overlap_weight: 1, load_weight: 1)");
    let r = fresh.router.unwrap();
    assert_eq!((r.misroutes, r.expected_hit_tokens), (0, 1024));
    assert_eq!(fresh.kv.prefix_hit_tokens, 1024);
    // Two seconds late, the router sees no cache anywhere: worker 1 is the less loaded.
    let late = scenario(
        &dir,
        "KvAware(overlap_weight: 1, load_weight: 1, lag_us: 2000000)",
    );
    let r = late.router.unwrap();
    assert_eq!(r.misroutes, 1);
    assert_eq!((r.expected_hit_tokens, r.present_hit_tokens), (0, 0));
    assert_eq!(late.kv.prefix_hit_tokens, 0);
}

#[test]
fn on_the_mooncake_trace_with_room_for_everything_one_worker_holds_every_prefix() {
    // Requests far apart and caches that never evict: with load weighing nothing, every
    // request goes where its prefix is, so two workers find what one cache would.
    let s = super::prefix::run_trace(
        300,
        0.001,
        2,
        "kv_blocks: Some(3000000),",
        true,
        "KvAware(overlap_weight: 1, load_weight: 0)",
    );
    let (query, hit) = super::prefix::ideal_hits(300);
    assert_eq!(
        (s.kv.prefix_query_tokens, s.kv.prefix_hit_tokens),
        (query, hit)
    );
    let rr = super::prefix::run_trace(
        300,
        0.001,
        2,
        "kv_blocks: Some(3000000),",
        true,
        "RoundRobin",
    );
    assert!(rr.kv.prefix_hit_tokens < hit, "{:?}", rr.kv);
}

#[test]
fn a_kv_router_with_nothing_to_look_at_is_refused_naming_the_field() {
    let base = "Scenario(name: \"kv\", seed: 1, workload: (source: Trace(path: \"t.jsonl\", \
                format: MooncakeJsonl)), cluster: (replicas: 2, router: ROUTER, \
                profile: Custom(c0_ms: 10.0, prefill_tokens_per_s: 20000.0, kv_blocks_16: 5000), \
                scheduler: SCHED))";
    let cases = [
        (
            "KvAware(overlap_weight: 0, load_weight: 0)",
            "Continuous(window: 1)",
            "both 0",
        ),
        (
            "KvAware(overlap_weight: 1, load_weight: 1, lag_us: 20000000)",
            "Continuous(window: 1)",
            "lag_us",
        ),
        (
            "KvAware(overlap_weight: 1, load_weight: 1)",
            "Continuous(window: 1, prefix_caching: false)",
            "prefix_caching",
        ),
        (
            "KvAware(overlap_weight: 1, load_weight: 1)",
            "Dynamic(max_batch_size: 4, max_queue_delay_ms: 1.0)",
            "prefix_caching",
        ),
    ];
    for (router, sched, want) in cases {
        let ron = base.replace("ROUTER", router).replace("SCHED", sched);
        let e = Scenario::parse(&ron, "<inline>").unwrap_err().to_string();
        assert!(
            e.contains("cluster.router.KvAware") && e.contains(want),
            "{e}"
        );
        assert_eq!(e.trim_end().lines().count(), 1, "{e}");
    }
    let azure = base
        .replace("ROUTER", "KvAware(overlap_weight: 1, load_weight: 1)")
        .replace("SCHED", "Continuous(window: 1)")
        .replace("MooncakeJsonl", "AzureCsv");
    let e = Scenario::parse(&azure, "<inline>").unwrap_err().to_string();
    assert!(e.contains("shares no prompt blocks"), "{e}");
}

#[test]
fn a_kv_router_on_a_trace_without_block_hashes_stops_before_running() {
    let dir = Scratch::new("kv", "no-hashes", true);
    let rows = "{\"timestamp\": 0, \"input_length\": 600, \"output_length\": 4}\n";
    std::fs::write(dir.join("t.jsonl"), rows).unwrap();
    let ron = "Scenario(name: \"kv\", seed: 1, workload: (source: Trace(path: \"t.jsonl\", \
               format: MooncakeJsonl)), cluster: (replicas: 2, \
               router: KvAware(overlap_weight: 1, load_weight: 1), \
               profile: Custom(c0_ms: 10.0, prefill_tokens_per_s: 20000.0, kv_blocks_16: 5000), \
               scheduler: Continuous(window: 1)))";
    let mut s = Scenario::parse(ron, "<inline>").unwrap();
    s.base_dir = dir.to_path_buf();
    let e = run::counterfactual(&s, 1).unwrap_err().to_string();
    assert!(
        e.contains("t.jsonl:1:") && e.contains("cluster.router.KvAware") && e.contains("hash_ids"),
        "{e}"
    );
    assert_eq!(e.trim_end().lines().count(), 1, "{e}");
    // With the hashes, it runs.
    trace(&dir, &[(0, 4)]);
    assert_eq!(run::counterfactual(&s, 1).unwrap().requests.completed, 1);
}

/// A request that waits in a shared queue at the router keeps its trace block ids until it
/// reaches a replica (before, only the latest arrival's were known, so a request dispatched
/// later shared nothing).
#[test]
fn a_request_held_at_the_router_still_shares_its_prefix() {
    let dir = Scratch::new("kv", "held", true);
    // Six at once, one at a time per worker: the first two compute the prefix, one on each
    // worker; the four held behind them find it on whichever frees first.
    let rows: Vec<(u64, u32)> = (0..6).map(|_| (0, 4)).collect();
    trace(&dir, &rows);
    let s = scenario(&dir, "SharedQueue(max_outstanding: 1)");
    assert_eq!(s.requests.completed, 6);
    assert_eq!(s.kv.prefix_query_tokens, 6 * 2048);
    assert_eq!(s.kv.prefix_hit_tokens, 4 * 1024);
}

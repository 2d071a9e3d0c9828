//! The KV-aware router past a prefill/decode graph's entry, against closed forms: it scores the
//! decode replicas by the prompt blocks they would receive when their pools cache prefixes, the
//! local replica of conditional disaggregation, and a Colocated pool beside the graph.

use std::path::Path;

use cancelsim::metrics::Summary;
use cancelsim::run;
use cancelsim::scenario::Scenario;

use super::kv_routing::trace;
use crate::scratch::Scratch;

/// A graph on the trace in `dir`: `stages` between the router and playback, `links` from the
/// router on, `handoff` in its section.
fn graph(dir: &Path, router: &str, (stages, links): (&str, &str), handoff: &str) -> Summary {
    let ron = format!(
        "Scenario(name: \"kv-decode\", seed: 1, workload: (source: Trace(path: \"t.jsonl\", \
         format: MooncakeJsonl)), cluster: (replicas: 3, router: {router}, \
         profile: Custom(c0_ms: 10.0, prefill_tokens_per_s: 20000.0, kv_blocks_16: 5000), \
         scheduler: Continuous(window: 1), topology: Some((stages: [\
         (name: \"router\", role: Router), {stages}, (name: \"playback\", role: Playback)], \
         links: [{links}], handoff: ({handoff})))))"
    );
    let mut s = Scenario::parse(&ron, "<inline>").unwrap();
    s.base_dir = dir.to_path_buf();
    run::counterfactual(&s, 1).unwrap()
}

const ONE_P_TWO_D: (&str, &str) = (
    "(name: \"prefill\", role: Prefill), (name: \"decode\", role: Decode, replicas: 2)",
    "(from: \"router\", to: \"prefill\"), \
     (from: \"prefill\", to: \"decode\", latency_ms: 1.0, bandwidth_gbps: 100.0), \
     (from: \"decode\", to: \"playback\")",
);

/// The first request decodes 2,000 tokens (20 s on its replica); five more follow a second
/// apart, short. All six share their first 1,024 tokens (64 blocks of 16).
fn rows() -> Vec<(u64, u32)> {
    std::iter::once((0, 2000))
        .chain((1..6).map(|i| (i * 1000, 4)))
        .collect()
}

#[test]
fn the_decode_replica_is_scored_by_the_prefix_it_would_not_receive() {
    let dir = Scratch::new("kv-decode", "decode", true);
    trace(&dir, &rows());
    // By the prefix: the long request holds decode 0, whose cache has the prefix; 64 blocks
    // not sent outweigh one request of load (64 x 8 > 1), so all five go there and are sent
    // their own half only.
    let s = graph(
        &dir,
        "KvAware(overlap_weight: 8, load_weight: 1)",
        ONE_P_TWO_D,
        "",
    );
    let h = s.handoff.unwrap();
    assert_eq!(h.transfer_tokens_cached, 5 * 1024);
    let d = s.router_decode.expect("the decode stage's books");
    assert_eq!(
        (d.decisions, d.prompt_tokens, d.expected_hit_tokens),
        (6, 6 * 2048, 5 * 1024)
    );
    assert_eq!((d.present_hit_tokens, d.misroutes), (5 * 1024, 0));
    // By load alone: the second goes to the idle decode 1 and is sent whole; the four after
    // find the prefix there.
    let s = graph(
        &dir,
        "KvAware(overlap_weight: 0, load_weight: 1)",
        ONE_P_TWO_D,
        "",
    );
    assert_eq!(s.handoff.unwrap().transfer_tokens_cached, 4 * 1024);
    let d = s.router_decode.unwrap();
    assert_eq!((d.decisions, d.present_hit_tokens), (6, 4 * 1024));
    // Decode pools without a prefix cache are picked by load, with no decode books.
    let plain = ONE_P_TWO_D.0.replace(
        "replicas: 2)",
        "replicas: 2, scheduler: Some(Continuous(window: 1, prefix_caching: false)))",
    );
    let s = graph(
        &dir,
        "KvAware(overlap_weight: 8, load_weight: 1)",
        (&plain, ONE_P_TWO_D.1),
        "",
    );
    assert_eq!(s.router_decode, None);
    assert_eq!(s.handoff.unwrap().transfer_tokens_cached, 0);
    assert_eq!(s.router.unwrap().decisions, 6);
}

#[test]
fn conditional_disaggregation_keeps_a_request_where_the_router_scores_its_prefix() {
    let dir = Scratch::new("kv-decode", "conditional", true);
    trace(&dir, &rows());
    // The first request lacks its whole prompt everywhere: prefilled remotely, decoded on
    // decode 0 (the tie's first). The five after lack 1,024 tokens on decode 0, at the
    // threshold: prefilled there, locally. One entry decision, six at the decode stage.
    let s = graph(
        &dir,
        "KvAware(overlap_weight: 8, load_weight: 1)",
        ONE_P_TWO_D,
        "conditional: Some((max_local_prefill_tokens: 1024))",
    );
    let h = s.handoff.unwrap();
    assert_eq!((h.local_prefills, h.transfers_done), (5, 1));
    assert_eq!(s.router.unwrap().decisions, 1);
    let d = s.router_decode.unwrap();
    assert_eq!(
        (d.decisions, d.present_hit_tokens, d.misroutes),
        (6, 5 * 1024, 0)
    );
    assert_eq!(s.requests.completed, 6);
    // By load alone the second goes to decode 1, which lacks it all: remote. The four after
    // go to decode 1 again (idle), which then holds the prefix: local.
    let s = graph(
        &dir,
        "KvAware(overlap_weight: 0, load_weight: 1)",
        ONE_P_TWO_D,
        "conditional: Some((max_local_prefill_tokens: 1024))",
    );
    let h = s.handoff.unwrap();
    assert_eq!((h.local_prefills, h.transfers_done), (4, 2));
}

#[test]
fn a_colocated_pool_beside_the_graph_is_scored_with_the_prefill_pool() {
    let dir = Scratch::new("kv-decode", "beside", true);
    trace(&dir, &rows());
    let beside = (
        "(name: \"prefill\", role: Prefill), (name: \"decode\", role: Decode), \
         (name: \"side\", role: Colocated)",
        "(from: \"router\", to: \"prefill\"), (from: \"router\", to: \"side\"), \
         (from: \"prefill\", to: \"decode\", latency_ms: 1.0, bandwidth_gbps: 100.0), \
         (from: \"decode\", to: \"playback\"), (from: \"side\", to: \"playback\")",
    );
    // The entry is the prefill replica and the colocated one. The first request ties (the
    // prefill replica, first); the long one then decodes on the decode replica, so the five
    // after find the prefix on the idle prefill replica: 5 x 1,024 found there, none beside.
    let s = graph(
        &dir,
        "KvAware(overlap_weight: 8, load_weight: 1)",
        beside,
        "",
    );
    let r = s.router.unwrap();
    assert_eq!(
        (r.decisions, r.present_hit_tokens, r.misroutes),
        (6, 5 * 1024, 0)
    );
    assert_eq!(s.pools[0].prefix_hit_tokens, 5 * 1024);
    assert_eq!(s.pools[2].prefix_query_tokens, 0, "nothing beside");
    assert_eq!(s.handoff.unwrap().transfers_done, 6);
}

#[test]
fn decode_pools_that_cache_with_another_block_size_are_refused() {
    let dir = Scratch::new("kv-decode", "refused", true);
    trace(&dir, &rows());
    let other = ONE_P_TWO_D.0.replace(
        "replicas: 2)",
        "replicas: 2, scheduler: Some(Continuous(window: 1, block_tokens: 32)))",
    );
    let ron = format!(
        "Scenario(name: \"x\", seed: 1, workload: (source: Trace(path: \"t.jsonl\", \
         format: MooncakeJsonl)), cluster: (replicas: 3, \
         router: KvAware(overlap_weight: 1, load_weight: 1), \
         profile: Custom(c0_ms: 10.0, prefill_tokens_per_s: 20000.0, kv_blocks_16: 5000), \
         scheduler: Continuous(window: 1), topology: Some((stages: [\
         (name: \"router\", role: Router), {other}, (name: \"playback\", role: Playback)], \
         links: [{}]))))",
        ONE_P_TWO_D.1
    );
    let e = Scenario::parse(&ron, "<inline>").unwrap_err().to_string();
    assert!(
        e.contains("cluster.router.KvAware") && e.contains("decode pool"),
        "{e}"
    );
}

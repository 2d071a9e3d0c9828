//! Conditional disaggregation against closed forms: which requests a decode replica prefills
//! itself, from what it has cached and how busy the prefill stage is, and what then crosses
//! the wire.

use std::path::Path;

use cancelsim::metrics::Summary;
use cancelsim::run;
use cancelsim::scenario::Scenario;

use super::kv_routing::trace;
use crate::scratch::Scratch;

/// KV bytes per token of a `Custom` profile (Llama-3.1-8B's).
const KV_BYTES: u64 = 131_072;

fn text(conditional: &str, router: &str) -> String {
    format!(
        "Scenario(name: \"conditional\", seed: 1, workload: (source: Trace(path: \"t.jsonl\", \
         format: MooncakeJsonl)), cluster: (replicas: 2, router: {router}, \
         profile: Custom(c0_ms: 10.0, prefill_tokens_per_s: 20000.0, kv_blocks_16: 5000), \
         scheduler: Continuous(window: 1), topology: Some((stages: [\
         (name: \"router\", role: Router), (name: \"prefill\", role: Prefill), \
         (name: \"decode\", role: Decode), (name: \"playback\", role: Playback)], links: [\
         (from: \"router\", to: \"prefill\"), \
         (from: \"prefill\", to: \"decode\", latency_ms: 1.0, bandwidth_gbps: 100.0), \
         (from: \"decode\", to: \"playback\")], handoff: (conditional: {conditional})))))"
    )
}

fn run_with(dir: &Path, conditional: &str) -> Summary {
    let mut s = Scenario::parse(&text(conditional, "LeastLoaded"), "<inline>").unwrap();
    s.base_dir = dir.to_path_buf();
    run::counterfactual(&s, 1).unwrap()
}

#[test]
fn the_decode_replica_prefills_what_it_has_mostly_cached() {
    let dir = Scratch::new("conditional", "threshold", true);
    // Six requests a second apart, 2,048-token prompts whose first 1,024 tokens are shared.
    let rows: Vec<(u64, u32)> = (0..6).map(|i| (i * 1000, 4)).collect();
    trace(&dir, &rows);
    let (prompt, shared) = (2048, 1024);
    // At 1,024: the first goes to the prefill stage (nothing cached where it decodes); the
    // decode replica caches the prefix it receives, so the five after it miss only 1,024
    // tokens each and are prefilled there, finding the prefix.
    let s = run_with(&dir, "Some((max_local_prefill_tokens: 1024))");
    let h = s.handoff.unwrap();
    assert_eq!((h.local_prefills, h.transfers_done), (5, 1));
    assert_eq!(h.transfer_bytes, prompt * KV_BYTES);
    assert_eq!(s.kv.prefix_query_tokens, 6 * prompt);
    assert_eq!(s.kv.prefix_hit_tokens, 5 * shared);
    assert_eq!(s.requests.completed, 6);
    // One token less, and each goes through the prefill stage, sending only its own half.
    let s = run_with(&dir, "Some((max_local_prefill_tokens: 1023))");
    let h = s.handoff.unwrap();
    assert_eq!((h.local_prefills, h.transfers_done), (0, 6));
    assert_eq!(h.transfer_tokens_cached, 5 * shared);
    // Every prompt local: the decode replica serves alone, as a colocated one.
    let s = run_with(&dir, "Some((max_local_prefill_tokens: 4294967295))");
    let h = s.handoff.unwrap();
    assert_eq!((h.local_prefills, h.transfers_started), (6, 0));
    assert_eq!(s.kv.prefix_hit_tokens, 5 * shared);
    // Unset: the prefill stage takes every request.
    let s = run_with(&dir, "None");
    assert_eq!(s.handoff.unwrap().local_prefills, 0);
}

#[test]
fn a_busy_prefill_stage_sends_the_next_request_to_its_decode_replica() {
    let dir = Scratch::new("conditional", "queue", true);
    // Three at once: the prefill replica holds the first when the second arrives, and both
    // when the third does; a bound of 1 keeps the second and third where they decode.
    trace(&dir, &[(0, 4), (0, 4), (0, 4)]);
    let s = run_with(
        &dir,
        "Some((max_local_prefill_tokens: 0, max_prefill_queue: 1))",
    );
    let h = s.handoff.unwrap();
    assert_eq!((h.local_prefills, h.transfers_done), (2, 1));
    // A bound of 2: only the third.
    let s = run_with(
        &dir,
        "Some((max_local_prefill_tokens: 0, max_prefill_queue: 2))",
    );
    let h = s.handoff.unwrap();
    assert_eq!((h.local_prefills, h.transfers_done), (1, 2));
}

#[test]
fn a_cancel_storm_with_both_paths_gives_every_block_back() {
    // The Mooncake trace at its own pace on 2P2D, half the prompts local by length, a busy
    // prefill stage sending more; 30 % cancelled at every stage, the handoff's included.
    let rest = ", cancellation: (fraction: 0.3, stage: Random, delay_ms: Uniform(low: 0.0, \
                high: 30.0)), policies: [PerRequest, FinishAndDiscard, Ideal, GroupAbort(Engine)]";
    let s = super::pd_prefix::mooncake_pd_with(
        400,
        1.0,
        (2, 2),
        "kv_blocks: Some(6000)",
        "conditional: Some((max_local_prefill_tokens: 4000, max_prefill_queue: 3))",
        rest,
    );
    let (report, _) = run::run(&s, 1, run::RunOptions::default()).unwrap();
    // Without cancels, each request takes one path: prefilled where it decodes, or sent, or
    // computed again on the decode side after the prefill side's lease gave its KV back.
    let c = &report.counterfactual;
    let h = c.handoff.unwrap();
    let paths = h.local_prefills + h.transfers_started + h.kv_released_before_transfer;
    assert_eq!(paths, c.requests.completed, "{h:?}");
    assert!(c.requests.completed > 390, "{:?}", c.requests);
    for p in report.policies.iter().chain([&report.counterfactual]) {
        let h = p.handoff.unwrap();
        assert!(
            h.local_prefills > 0 && h.transfers_started > 0,
            "{}: {h:?}",
            p.policy
        );
    }
}

#[test]
fn conditional_disaggregation_that_cannot_apply_is_refused() {
    let bad = [
        (
            text(
                "Some((max_local_prefill_tokens: 10, max_prefill_queue: 0))",
                "LeastLoaded",
            ),
            "cluster.topology.handoff.conditional.max_prefill_queue",
        ),
        (
            text(
                "Some((max_local_prefill_tokens: 10))",
                "SharedQueue(max_outstanding: 4)",
            ),
            "cluster.topology.handoff.conditional",
        ),
        (
            text(
                "Some((max_local_prefill_tokens: 10, max_local: 3))",
                "LeastLoaded",
            ),
            "max_local",
        ),
    ];
    for (ron, field) in bad {
        let e = Scenario::parse(&ron, "<inline>").unwrap_err().to_string();
        assert!(e.contains(field), "{e}");
        assert_eq!(e.lines().count(), 1, "{e}");
    }
}

//! Prefix caching against truths computed here from the trace itself.

use std::collections::HashSet;
use std::path::Path;

use cancelsim::run;
use cancelsim::scenario::Scenario;

pub(crate) const TRACE: &str = "traces/mooncake_conversation_trace.jsonl";

/// Prompt tokens and cached prompt tokens over the first `rows` rows of the Mooncake trace with
/// an unbounded cache and one request at a time: a request reuses its longest run of leading
/// 16-token blocks, short of its last token, that lie in a 512-token block whose hash id an
/// earlier request had.
pub(crate) fn ideal_hits(rows: usize) -> (u64, u64) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../scenarios")
        .join(TRACE);
    let text = std::fs::read_to_string(path).unwrap();
    let mut seen = HashSet::new();
    let (mut query, mut hit) = (0, 0);
    for line in text.lines().take(rows) {
        let r: serde_json::Value = serde_json::from_str(line).unwrap();
        let n = r["input_length"].as_u64().unwrap();
        let ids: Vec<u64> = r["hash_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap())
            .collect();
        let mut k = 0;
        while k < (n - 1) / 16 {
            let end = (k + 1) * 16;
            match ids.get(((end - 1) / 512) as usize) {
                Some(id) if seen.contains(id) => k += 1,
                _ => break,
            }
        }
        query += n;
        hit += k * 16;
        seen.extend(ids);
    }
    (query, hit)
}

pub(crate) fn run_trace(
    rows: u64,
    speedup: f64,
    replicas: u32,
    kv: &str,
    caching: bool,
    router: &str,
) -> cancelsim::metrics::Summary {
    let ron = format!(
        "Scenario(name: \"mooncake\", seed: 1, workload: (source: Trace(path: \"{TRACE}\", \
         format: MooncakeJsonl, rows: Some({rows}), speedup: {speedup})), \
         cluster: (replicas: {replicas}, router: {router}, profile: Named(\"llama-3.1-8b-h100\"), \
         scheduler: Continuous(window: 1, {kv} prefix_caching: {caching})))"
    );
    let mut s = Scenario::parse(&ron, "<inline>").unwrap();
    s.base_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios");
    run::counterfactual(&s, 1).unwrap()
}

#[test]
fn mooncake_hit_rate_equals_the_traces_own_with_an_unbounded_cache() {
    // Requests a thousand times further apart than in the trace, so each finishes before the
    // next; blocks enough that nothing is evicted.
    let s = run_trace(
        300,
        0.001,
        1,
        "kv_blocks: Some(3000000),",
        true,
        "RoundRobin",
    );
    let (query, hit) = ideal_hits(300);
    assert_eq!(s.kv.prefix_query_tokens, query);
    assert_eq!(s.kv.prefix_hit_tokens, hit);
    assert!(hit > 0 && s.kv.prefix_hit_rate > 0.05, "{:?}", s.kv);
    // Without the cache, no lookups and nothing found.
    let off = run_trace(
        300,
        0.001,
        1,
        "kv_blocks: Some(3000000),",
        false,
        "RoundRobin",
    );
    assert_eq!(
        (off.kv.prefix_query_tokens, off.kv.prefix_hit_tokens),
        (0, 0)
    );
    // The same trace at its own speed on one replica: concurrency and evictions can only lose
    // hits.
    let busy = run_trace(300, 1.0, 1, "", true, "RoundRobin");
    assert!(busy.kv.prefix_hit_tokens <= hit + busy.gpu.preemptions * 8192);
}

#[test]
fn a_preempted_request_finds_its_own_blocks_and_skips_recomputing_them() {
    // Llama-2-7B's 512 KiB per token fill an A100's 7,300 blocks: under overload requests are
    // preempted, and their recompute reads their own blocks back from the cache.
    let ron = |caching: bool| {
        format!(
            "Scenario(name: \"p\", seed: 3, workload: (source: Poisson(rate_per_s: 5.0, \
             requests: 1500), prompt_tokens: LogNormal(median: 1000.0, sigma: 0.8), \
             output_tokens: LogNormal(median: 400.0, sigma: 0.8)), cluster: \
             (profile: Named(\"llama-2-7b-a100\"), scheduler: Continuous(window: 2, \
             prefix_caching: {caching})))"
        )
    };
    let run = |caching| {
        run::counterfactual(&Scenario::parse(&ron(caching), "<inline>").unwrap(), 3).unwrap()
    };
    let (on, off) = (run(true), run(false));
    assert!(off.gpu.preemptions > 100, "{}", off.gpu.preemptions);
    assert!(on.gpu.preemptions > 100, "{}", on.gpu.preemptions);
    // Unique prompts: every hit is a recompute finding its own blocks. (The time it saves is
    // the engine test's: this run is bound by decode's memory traffic, where skipped prefill
    // tokens hardly show.)
    assert!(on.kv.prefix_hit_tokens > 0);
    assert!(on.kv.prefix_hit_rate < 0.5, "{:?}", on.kv);
    assert_eq!(
        (off.kv.prefix_query_tokens, off.kv.prefix_hit_tokens),
        (0, 0)
    );
    assert_eq!(on.requests.completed, off.requests.completed);
}

/// Conversations whose turns carry their history, `replicas` replicas behind `router`.
fn conversations(replicas: u32, router: &str, history: bool) -> String {
    format!(
        "Scenario(name: \"h\", seed: 5, workload: (source: Conversations(conversations: 60, \
         start_rate_per_s: 2.0, turns: Constant(5.0), think_ms: Constant(2000.0), \
         history: {history}), prompt_tokens: LogNormal(median: 200.0, sigma: 0.6), \
         output_tokens: LogNormal(median: 120.0, sigma: 0.6)), cluster: (replicas: {replicas}, \
         router: {router}, profile: Named(\"llama-3.1-8b-h100\"), scheduler: Continuous()))"
    )
}

/// The truth from the rows themselves: turn t's history H is turn t − 1's prompt plus the
/// output its user saw, and turn t finds every 16-token block of it that turn t − 1 had in its
/// cache: those ending by H − 1 (the last token sampled is never computed into the cache).
#[test]
fn conversation_turns_find_their_history_in_the_cache() {
    let (s, mut rows) = crate::queueing::rows_of(&conversations(1, "RoundRobin", true));
    rows.sort_by_key(|r| (r.owner, r.generation));
    let (mut query, mut hit) = (0u64, 0u64);
    for pair in rows.windows(2) {
        let (before, now) = (&pair[0], &pair[1]);
        if now.owner != before.owner {
            continue;
        }
        let prompt_before = before.prompt_tokens as u64;
        let history = prompt_before + before.tokens_generated as u64;
        assert!(
            now.prompt_tokens as u64 > history,
            "the prompt holds the history and more"
        );
        hit += (history - 1) / 16 * 16;
    }
    for r in &rows {
        query += r.prompt_tokens as u64;
    }
    assert_eq!(rows.len(), 300);
    assert_eq!(s.kv.prefix_query_tokens, query);
    assert_eq!(s.kv.prefix_hit_tokens, hit);
    assert!(s.kv.prefix_hit_rate > 0.5, "{:?}", s.kv);
    // Without history, prompts are the message alone and nothing is shared.
    let (plain, _) = crate::queueing::rows_of(&conversations(1, "RoundRobin", false));
    assert_eq!(plain.kv.prefix_hit_tokens, 0);
    // Over four replicas, session affinity keeps each conversation on one replica and finds it
    // all; round robin scatters the turns, and a turn finds only the part of its history that
    // an earlier turn left on its replica (0.45 of it here).
    let (session, _) = crate::queueing::rows_of(&conversations(4, "Session", true));
    let (scattered, _) = crate::queueing::rows_of(&conversations(4, "RoundRobin", true));
    eprintln!(
        "history: {hit} of {query} prompt tokens cached (rate {:.3}); 4 replicas: session {}, \
         round robin {}",
        s.kv.prefix_hit_rate, session.kv.prefix_hit_tokens, scattered.kv.prefix_hit_tokens
    );
    assert_eq!(session.kv.prefix_hit_tokens, hit);
    assert!(
        scattered.kv.prefix_hit_tokens < hit * 3 / 5,
        "{} of {hit}",
        scattered.kv.prefix_hit_tokens
    );
}

//! Prefill/decode graphs of several pools against closed forms: each pool runs its own profile,
//! each prefill-to-decode pair its own link, and the books follow pool by pool.

use std::path::Path;

use cancelsim::metrics::Summary;
use cancelsim::run;
use cancelsim::scenario::Scenario;

use crate::scratch::Scratch;

/// A Mooncake trace of `rows` `(timestamp_ms, output_tokens)`, 2,000-token prompts that share
/// nothing.
fn trace(dir: &Path, rows: &[(u64, u32)]) {
    let lines: Vec<String> = (rows.iter().enumerate())
        .map(|(i, (t, out))| {
            let ids: Vec<String> = (0..4).map(|k| (1000 * i + k).to_string()).collect();
            format!(
                "{{\"timestamp\": {t}, \"input_length\": 2000, \"output_length\": {out}, \
                 \"hash_ids\": [{}]}}",
                ids.join(", ")
            )
        })
        .collect();
    std::fs::write(dir.join("t.jsonl"), lines.join("\n") + "\n").unwrap();
}

fn custom(prefill_tokens_per_s: f64) -> String {
    format!("Custom(c0_ms: 10.0, prefill_tokens_per_s: {prefill_tokens_per_s}, kv_blocks_16: 5000)")
}

fn scenario(stages: &str, links: &str, replicas: u32, extra: &str) -> String {
    format!(
        "Scenario(name: \"pools\", seed: 1, workload: (source: Trace(path: \"t.jsonl\", \
         format: MooncakeJsonl)), cluster: (replicas: {replicas}, router: RoundRobin, \
         profile: {}, scheduler: Continuous(window: 1, prefix_caching: false), \
         topology: Some((stages: [(name: \"router\", role: Router), {stages}, \
         (name: \"playback\", role: Playback)], links: [{links}]{extra}))))",
        custom(20000.0)
    )
}

fn run_in(dir: &Path, text: &str) -> Summary {
    let mut s = Scenario::parse(text, "<inline>").unwrap();
    s.base_dir = dir.to_path_buf();
    run::counterfactual(&s, 1).unwrap()
}

#[test]
fn two_prefill_pools_each_compute_at_their_own_rate() {
    let dir = Scratch::new("pools", "profiles", true);
    // Four requests a second apart, round robin over the two prefill pools: each prefills two,
    // one step of 2,000 tokens each: 10 ms + 2,000 / rate.
    trace(&dir, &[(0, 4), (1000, 4), (2000, 4), (3000, 4)]);
    let stages = format!(
        "(name: \"fast\", role: Prefill, profile: Some({})), \
         (name: \"slow\", role: Prefill, profile: Some({})), (name: \"decode\", role: Decode)",
        custom(40000.0),
        custom(10000.0)
    );
    let links = "(from: \"router\", to: \"fast\"), (from: \"router\", to: \"slow\"), \
                 (from: \"fast\", to: \"decode\", latency_ms: 1.0), \
                 (from: \"slow\", to: \"decode\", latency_ms: 1.0), \
                 (from: \"decode\", to: \"playback\")";
    let s = run_in(&dir, &scenario(&stages, links, 3, ""));
    assert_eq!(s.requests.completed, 4);
    let names: Vec<(&str, &str, u32)> = (s.pools.iter())
        .map(|p| (p.name.as_str(), p.role, p.replicas))
        .collect();
    assert_eq!(
        names,
        [
            ("fast", "prefill", 1),
            ("slow", "prefill", 1),
            ("decode", "decode", 1)
        ]
    );
    let busy = |i: usize| s.pools[i].gpu_busy_s;
    assert!((busy(0) - 2.0 * 0.060).abs() < 1e-6, "{}", busy(0));
    assert!((busy(1) - 2.0 * 0.210).abs() < 1e-6, "{}", busy(1));
    assert_eq!((s.pools[0].steps, s.pools[1].steps), (2, 2));
    // The decode pool received every prompt's KV, as the two prefill pools sent it.
    let kv = 2000 * 131_072;
    assert_eq!(
        s.pools[0].transfer_bytes + s.pools[1].transfer_bytes,
        4 * kv
    );
    assert_eq!(s.pools[2].transfer_bytes, 4 * kv);
}

#[test]
fn each_prefill_to_decode_pair_has_its_own_link() {
    let dir = Scratch::new("pools", "links", true);
    let stages = "(name: \"prefill\", role: Prefill), (name: \"near\", role: Decode), \
                  (name: \"far\", role: Decode)";
    // To `far`: a thousandth of the bandwidth (1 MB/s: 262.144 s for a prompt's KV), and every
    // notice lost, so the prefill side's blocks come back by their 1 s lease instead.
    let links = "(from: \"router\", to: \"prefill\"), \
                 (from: \"prefill\", to: \"near\", latency_ms: 1.0, bandwidth_gbps: 8.0), \
                 (from: \"prefill\", to: \"far\", latency_ms: 1.0, bandwidth_gbps: 0.008, \
                  loss: 1.0), \
                 (from: \"near\", to: \"playback\"), (from: \"far\", to: \"playback\")";
    let lease = ", handoff: (prefill_reclaim: Lease(lease_ms: 1000.0, grace_ms: 0.0))";
    // Two at once: round robin sends the first to `near`, the second to `far`.
    trace(&dir, &[(0, 4), (0, 4)]);
    let s = run_in(&dir, &scenario(stages, links, 3, lease));
    assert_eq!(s.requests.completed, 2);
    let kv = 2000 * 131_072;
    assert_eq!(
        (s.pools[1].transfer_bytes, s.pools[2].transfer_bytes),
        (kv, kv)
    );
    let h = s.handoff.unwrap();
    assert_eq!(
        (h.prefill.returned_completed, h.prefill.returned_lease),
        (1, 1)
    );
    // The far request's KV is on the slow wire for 262.144 s; nothing else takes a second.
    let wire_s = kv as f64 / 1e6;
    assert!(
        s.makespan_s > wire_s && s.makespan_s < wire_s + 1.0,
        "{}",
        s.makespan_s
    );
}

#[test]
fn pools_the_world_cannot_run_are_refused_naming_the_field() {
    let fine =
        "(from: \"router\", to: \"p\"), (from: \"p\", to: \"d\"), (from: \"d\", to: \"playback\")";
    let cases = [
        (
            "(name: \"p\", role: Prefill), (name: \"q\", role: Prefill), (name: \"d\", role: Decode)"
                .to_string(),
            "(from: \"router\", to: \"p\"), (from: \"p\", to: \"q\"), (from: \"q\", to: \"d\"), \
             (from: \"d\", to: \"playback\")"
                .to_string(),
            3,
            "cluster.topology.links[1]",
        ),
        (
            "(name: \"p\", role: Prefill, profile: Some(Named(\"llama-3.1-70b-tp4-h100\"))), \
             (name: \"d\", role: Decode)"
                .to_string(),
            fine.to_string(),
            2,
            "cluster.topology.stages[1].profile",
        ),
        (
            "(name: \"p\", role: Prefill, profile: Some(Table(path: \"x.csv\", kv_blocks_16: 9))), \
             (name: \"d\", role: Decode)"
                .to_string(),
            fine.to_string(),
            2,
            "cluster.topology.stages[1].profile",
        ),
        (
            "(name: \"p\", role: Prefill), (name: \"d\", role: Decode, \
             scheduler: Some(Continuous(window: 0)))"
                .to_string(),
            fine.to_string(),
            2,
            "cluster.topology.stages[2].scheduler",
        ),
    ];
    for (stages, links, n, field) in cases {
        let e = Scenario::parse(&scenario(&stages, &links, n, ""), "<inline>")
            .unwrap_err()
            .to_string();
        assert!(e.contains(field), "{field}: {e}");
        assert_eq!(e.lines().count(), 1, "{e}");
    }
}

#[test]
fn the_heterogeneous_library_graph_keeps_its_books_pool_by_pool() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../scenarios/library/pd-heterogeneous-storm.ron");
    let s = Scenario::load(&path).unwrap();
    let (report, _) = run::run(&s, 1, run::RunOptions::default()).unwrap();
    for p in report.policies.iter().chain([&report.counterfactual]) {
        let [h100, a100, decode] = &p.pools[..] else {
            panic!("{}: three pools, got {:?}", p.policy, p.pools);
        };
        // What the two prefill pools sent is what the decode pool received.
        assert_eq!(
            h100.transfer_bytes + a100.transfer_bytes,
            decode.transfer_bytes,
            "{}",
            p.policy
        );
        // Every prompt prefilled once, on one pool or the other (no preemption here).
        let prompts = h100.prefix_query_tokens + a100.prefix_query_tokens;
        assert!(
            prompts > 0 && decode.prefix_query_tokens == 0,
            "{}",
            p.policy
        );
        // The A100 takes longer per prompt token than the H100.
        let per_token =
            |q: &cancelsim::metrics::PoolSummary| q.gpu_busy_s / q.prefix_query_tokens as f64;
        assert!(per_token(a100) > 2.0 * per_token(h100), "{}", p.policy);
    }
}

#[test]
fn a_colocated_pool_beside_the_pair_takes_what_the_prefill_stage_cannot() {
    let dir = Scratch::new("pools", "colocated", true);
    let stages = "(name: \"prefill\", role: Prefill), (name: \"decode\", role: Decode), \
                  (name: \"side\", role: Colocated)";
    let links = "(from: \"router\", to: \"prefill\"), (from: \"router\", to: \"side\"), \
                 (from: \"prefill\", to: \"decode\", latency_ms: 1.0), \
                 (from: \"decode\", to: \"playback\"), (from: \"side\", to: \"playback\")";
    // Three at once. With the prefill stage's queue bounded at one request, the first takes the
    // pair and the two after it the colocated pool, whole.
    trace(&dir, &[(0, 4), (0, 4), (0, 4)]);
    let fallback = ", handoff: (conditional: Some((max_local_prefill_tokens: 0, \
                    max_prefill_queue: 1)))";
    let s = run_in(&dir, &scenario(stages, links, 3, fallback));
    assert_eq!(s.requests.completed, 3);
    let h = s.handoff.unwrap();
    assert_eq!((h.local_prefills, h.transfers_done), (2, 1));
    let roles: Vec<&str> = s.pools.iter().map(|p| p.role).collect();
    assert_eq!(roles, ["prefill", "decode", "colocated"]);
    assert!(s.pools[2].gpu_busy_s > 0.0 && s.pools[0].steps == 1);
    assert_eq!(s.pools[2].tokens_delivered, 2 * 4);
    assert_eq!(s.pools[2].transfer_bytes, 0);
    // Without the rule, the router balances the prefill and the colocated replicas: the least
    // loaded, the lower index at a tie (prefill, colocated, prefill).
    let s = run_in(&dir, &scenario(stages, links, 3, ""));
    let h = s.handoff.unwrap();
    assert_eq!((h.local_prefills, h.transfers_done), (1, 2));
}

/// `pools.csv`'s samples: each pool's gauges add up to the totals at every sample, and a decode
/// pool holds receive blocks exactly while its transfer is on the wire: 262.144 s on a 1 MB/s
/// link, 0.262 s on a 1 GB/s one (2,000 tokens of KV at 131,072 bytes a token).
#[test]
fn each_pool_is_sampled_and_the_pools_add_up_to_the_totals() {
    let dir = Scratch::new("pools", "samples", true);
    let stages = "(name: \"prefill\", role: Prefill), (name: \"near\", role: Decode), \
                  (name: \"far\", role: Decode)";
    let links = "(from: \"router\", to: \"prefill\"), \
                 (from: \"prefill\", to: \"near\", latency_ms: 1.0, bandwidth_gbps: 8.0), \
                 (from: \"prefill\", to: \"far\", latency_ms: 1.0, bandwidth_gbps: 0.008), \
                 (from: \"near\", to: \"playback\"), (from: \"far\", to: \"playback\")";
    trace(&dir, &[(0, 4), (0, 4)]);
    let mut s = Scenario::parse(&scenario(stages, links, 3, ""), "<inline>").unwrap();
    s.base_dir = dir.to_path_buf();
    let every_s = 0.01;
    let opts = run::RunOptions {
        sample_ns: (every_s * 1e9) as u64,
        ..Default::default()
    };
    let (report, extras) = run::run(&s, 1, opts).unwrap();
    let pools = &report.counterfactual.pools;
    assert_eq!(pools.len(), 3);
    // Without cancel intents, the policy runs are the counterfactual's and record nothing.
    assert!(!extras[0].timeseries.is_empty(), "sampled");
    for e in &extras {
        assert_eq!(e.pool_timeseries.len(), 3 * e.timeseries.len());
        for (total, mine) in e.timeseries.iter().zip(e.pool_timeseries.chunks(3)) {
            let sum =
                |f: fn(&cancelsim::record::PoolSample) -> u64| mine.iter().map(f).sum::<u64>();
            assert!(mine.iter().all(|p| p.t_s == total.t_s));
            assert_eq!(sum(|p| p.kv_blocks), total.kv_blocks, "at {} s", total.t_s);
            assert_eq!(sum(|p| p.kv_retained), total.kv_retained);
            assert_eq!(sum(|p| p.queue), total.queue);
            assert_eq!(sum(|p| p.running), total.running);
            assert_eq!(mine[0].kv_pinned, total.kv_pinned_prefill);
            assert_eq!(
                mine[1].kv_pinned + mine[2].kv_pinned,
                total.kv_pinned_decode
            );
        }
    }
    let pinned_s = |pool: u32| {
        let e = &extras[0].pool_timeseries;
        let n = e
            .iter()
            .filter(|p| p.pool == pool && p.kv_pinned > 0)
            .count();
        n as f64 * every_s
    };
    let kv = 2000.0 * 131_072.0;
    let (near, far) = (pinned_s(1), pinned_s(2));
    assert!((far - kv / 1e6).abs() <= 2.0 * every_s, "far: {far} s");
    assert!((near - kv / 1e9).abs() <= 2.0 * every_s, "near: {near} s");
}

/// Twelve pools sampled every microsecond: `pools.csv` stops at its bound with whole samples,
/// the totals go on, and the run directory says where the pools' samples stop.
#[test]
fn the_pools_samples_stop_at_their_bound_and_say_so() {
    use cancelsim::output::RunDir;
    use cancelsim::record::POOL_SAMPLES_MAX;
    let dir = Scratch::new("pools", "bound", true);
    let names =
        |role: &str, n: usize| -> Vec<String> { (0..n).map(|i| format!("{role}{i}")).collect() };
    let (prefills, decodes) = (names("p", 6), names("d", 6));
    let stage = |n: &String, role: &str| format!("(name: \"{n}\", role: {role})");
    let stages: Vec<String> = (prefills.iter().map(|n| stage(n, "Prefill")))
        .chain(decodes.iter().map(|n| stage(n, "Decode")))
        .collect();
    let mut links: Vec<String> = prefills
        .iter()
        .map(|p| format!("(from: \"router\", to: \"{p}\")"))
        .collect();
    for p in &prefills {
        links.extend((decodes.iter()).map(|d| format!("(from: \"{p}\", to: \"{d}\")")));
    }
    links.extend((decodes.iter()).map(|d| format!("(from: \"{d}\", to: \"playback\")")));
    // Twelve requests 20 ms apart: 0.22 s and more of virtual time, 220,000 samples and more.
    let rows: Vec<(u64, u32)> = (0..12).map(|i| (i * 20, 4)).collect();
    trace(&dir, &rows);
    let text = scenario(&stages.join(", "), &links.join(", "), 12, "");
    let mut s = Scenario::parse(&text, "<inline>").unwrap();
    s.base_dir = dir.to_path_buf();
    let out = RunDir::begin(&dir.join("out"), &s.name).unwrap();
    let opts = run::RunOptions {
        sample_ns: 1_000,
        ..Default::default()
    };
    let (report, extras) = run::run(&s, 1, opts).unwrap();
    let e = &extras[0];
    let whole = POOL_SAMPLES_MAX / 12 * 12;
    assert_eq!(
        e.pool_timeseries.len(),
        whole,
        "whole samples, to the bound"
    );
    assert!(
        e.timeseries.len() * 12 > whole,
        "{} samples",
        e.timeseries.len()
    );
    let done = out.finish(&report, extras, (None, None), false).unwrap();
    let cut: Vec<&String> = (done.warnings.iter())
        .filter(|w| w.starts_with("pools.csv: run counterfactual stopped sampling its 12 pools"))
        .collect();
    assert_eq!(cut.len(), 1, "{:?}", done.warnings);
}

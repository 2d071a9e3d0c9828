//! The stage graph in scenario files: validated at load with one-line errors that name the
//! field, drawn as `graph.dot` in every run directory; a prefill/decode graph runs, and its
//! lease holds the capacity queueing theory predicts.

use crate::scratch::Scratch;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn cancelsim(args: &[&str], cwd: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cancelsim"))
        .args(args)
        .current_dir(cwd)
        .output()
        .unwrap()
}

fn scratch(name: &str) -> Scratch {
    Scratch::new("topo", name, true)
}

/// A small scenario with `topology` as its cluster's graph.
fn scenario(replicas: u32, topology: &str) -> String {
    format!(
        r#"Scenario(
    name: "topo",
    seed: 2,
    workload: (source: Poisson(rate_per_s: 20.0, requests: 30)),
    cluster: (
        replicas: {replicas},
        profile: Named("llama-3.1-8b-h100"),
        scheduler: Continuous(),
        topology: {topology},
    ),
)
"#
    )
}

const COLOCATED: &str = include_str!("../fixtures/graph-colocated.ron");

const ONE_P_ONE_D: &str = include_str!("../fixtures/graph-1p1d.ron");

/// Run `text`: (exit code, stderr, the scratch directory).
fn run(name: &str, text: &str) -> (Option<i32>, String, Scratch) {
    let dir = scratch(name);
    std::fs::write(dir.join("s.ron"), text).unwrap();
    let out = cancelsim(&["run", "s.ron", "--out", "out"], &dir);
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        dir,
    )
}

/// The one run directory `--out out` holds for `scenario`.
fn only_run(dir: &Path, scenario: &str) -> PathBuf {
    let runs: Vec<_> = std::fs::read_dir(dir.join("out").join(scenario))
        .unwrap()
        .collect();
    assert_eq!(runs.len(), 1, "one run of {scenario}");
    runs[0].as_ref().unwrap().path()
}

fn refused(name: &str, text: &str, want: &[&str]) {
    let (code, err, dir) = run(name, text);
    assert_eq!(code, Some(2), "{name}: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{name}: {err}");
    for w in want {
        assert!(err.contains(w), "{name}: missing {w:?} in {err}");
    }
    assert!(!dir.join("out").exists(), "{name}: output written");
}

#[test]
fn a_colocated_graph_runs_like_the_default_and_is_drawn() {
    let (code, err, dir) = run("colocated", &scenario(2, COLOCATED));
    assert_eq!(code, Some(0), "{err}");
    let run_dir = only_run(&dir, "topo");
    let dot = std::fs::read_to_string(run_dir.join("graph.dot")).unwrap();
    assert!(
        dot.contains("gpus\\nColocated x2") && dot.contains("local"),
        "{dot}"
    );
    // Without a topology the same scenario runs as the implied colocated graph.
    let (code, err, dir) = run("implied", &scenario(2, "None"));
    assert_eq!(code, Some(0), "{err}");
    let dot = std::fs::read_to_string(only_run(&dir, "topo").join("graph.dot")).unwrap();
    assert!(dot.contains("serve\\nColocated x2"), "{dot}");
}

#[test]
fn invalid_graphs_get_one_line_naming_the_field() {
    refused(
        "cycle",
        &scenario(
            2,
            &ONE_P_ONE_D.replace(
                "(from: \"decode\", to: \"playback\"),",
                "(from: \"decode\", to: \"playback\"), (from: \"decode\", to: \"prefill\"),",
            ),
        ),
        &["s.ron:", "cluster.topology.links", "cycle through stage"],
    );
    refused(
        "unknown",
        &scenario(
            2,
            &ONE_P_ONE_D.replace("to: \"decode\", latency", "to: \"decoder\", latency"),
        ),
        &[
            "cluster.topology.links[1].to",
            "names no stage (got `decoder`)",
        ],
    );
    refused(
        "bypass",
        &scenario(
            2,
            &ONE_P_ONE_D.replace(
                "(from: \"decode\", to: \"playback\"),",
                "(from: \"decode\", to: \"playback\"), (from: \"prefill\", to: \"playback\"),",
            ),
        ),
        &["without passing a Decode or Colocated stage"],
    );
    refused(
        "no-replicas",
        &scenario(
            2,
            &ONE_P_ONE_D.replace("role: Decode)", "role: Decode, replicas: 0)"),
        ),
        &["cluster.topology.stages[2].replicas", "needs 1 to"],
    );
    refused(
        "bandwidth",
        &scenario(2, &ONE_P_ONE_D.replace("400.0", "-1.0")),
        &["cluster.topology.links[1].bandwidth_gbps"],
    );
    refused(
        "mismatch",
        &scenario(3, COLOCATED),
        &["serving stages have 2 replicas in all", "says 3"],
    );
    refused(
        "typo",
        &scenario(
            2,
            &COLOCATED.replace("to: \"gpus\")", "to: \"gpus\", latncy_ms: 1.0)"),
        ),
        &["s.ron:", "latncy_ms"],
    );
    refused(
        "ignored-latency",
        &scenario(
            2,
            &COLOCATED.replace("to: \"gpus\")", "to: \"gpus\", latency_ms: 0.2)"),
        ),
        &[
            "cluster.topology.links[0]",
            "only the prefill-to-decode link",
        ],
    );
}

#[test]
fn a_prefill_decode_graph_runs_and_is_drawn() {
    let (code, err, dir) = run("1p1d", &scenario(3, ONE_P_ONE_D));
    assert_eq!(code, Some(0), "{err}");
    let run_dir = only_run(&dir, "topo");
    let dot = std::fs::read_to_string(run_dir.join("graph.dot")).unwrap();
    assert!(dot.contains("prefill\\nPrefill x2"), "{dot}");
    assert!(run_dir.join("plots/handoff_pinned.png").exists());
    assert!(run_dir.join("plots/pools.png").exists());
    let pools = std::fs::read_to_string(run_dir.join("pools.csv")).unwrap();
    let mut lines = pools.lines();
    assert_eq!(
        lines.next(),
        Some("policy,t_s,pool,role,kv_blocks,kv_retained,kv_pinned,queue,running")
    );
    let first: Vec<&str> = lines.take(2).collect();
    assert!(
        first[0].starts_with("counterfactual,0,prefill,prefill,"),
        "{pools}"
    );
    assert!(
        first[1].starts_with("counterfactual,0,decode,decode,"),
        "{pools}"
    );
    assert!(
        !run_dir.join("plots/recovery.png").exists(),
        "no storm in time, no plot"
    );
    let summary = std::fs::read_to_string(run_dir.join("summary.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&summary).unwrap();
    let h = &v["counterfactual"]["handoff"];
    assert_eq!(h["transfers_done"], 30, "every request crossed: {summary}");
    // The fixture's link loses 1 % of messages: a lost completion notice leaves the prefill
    // side's blocks to its lease (480 s), and every other notice returns them.
    let p = &h["prefill"];
    let returned =
        p["returned_completed"].as_u64().unwrap() + p["returned_lease"].as_u64().unwrap();
    assert_eq!(returned, 30, "{summary}");
    assert_eq!(h["notices_lost"], p["returned_lease"], "{summary}");
}

#[test]
fn graphs_the_world_cannot_run_are_refused_with_a_clear_line() {
    let two_colocated = COLOCATED
        .replace(
            "(name: \"playback\", role: Playback),",
            "(name: \"c2\", role: Colocated), (name: \"playback\", role: Playback),",
        )
        .replace(
            "links: [",
            "links: [(from: \"router\", to: \"c2\"), (from: \"c2\", to: \"playback\"),",
        );
    refused(
        "two-colocated",
        &scenario(3, &two_colocated),
        &["cluster.topology", "Prefill stages linked to Decode stages"],
    );
    let dynamic = scenario(3, ONE_P_ONE_D).replace(
        "scheduler: Continuous(),",
        "scheduler: Dynamic(max_batch_size: 8, max_queue_delay_ms: 1.0),",
    );
    refused("dynamic", &dynamic, &["cluster.scheduler", "Continuous"]);
    let handoff_stage = scenario(2, "None").replace(
        "    cluster:",
        "    cancellation: (fraction: 0.5, stage: KvTransfer),\n    cluster:",
    );
    refused(
        "stage-without-graph",
        &handoff_stage,
        &["cancellation.stage", "only in a prefill/decode graph"],
    );
}

/// Every request's client leaves in the prefill-to-decode gap, so each request's prompt blocks
/// stay pinned on the prefill side for exactly the lease. Little's law: the blocks pinned at any
/// moment average λ × lease × blocks per request. 50 req/s × 10 s × 20 blocks = 10,000.
#[test]
fn a_lease_pins_arrival_rate_times_lease_times_blocks() {
    let text = r#"Scenario(
    name: "lease-closed-form",
    seed: 3,
    workload: (
        source: Poisson(rate_per_s: 50.0, requests: 3000),
        prompt_tokens: Constant(320.0),
        output_tokens: Constant(10.0),
    ),
    cluster: (
        replicas: 2,
        profile: Custom(c0_ms: 0.1, prefill_tokens_per_s: 10000000.0, kv_blocks_16: 40000),
        scheduler: Continuous(),
        topology: Some((
            stages: [
                (name: "router", role: Router),
                (name: "prefill", role: Prefill),
                (name: "decode", role: Decode),
                (name: "playback", role: Playback),
            ],
            links: [
                (from: "router", to: "prefill"),
                (from: "prefill", to: "decode", latency_ms: 5.0),
                (from: "decode", to: "playback"),
            ],
            handoff: (prefill_reclaim: Lease(lease_ms: 10000.0, grace_ms: 0.0)),
        )),
    ),
    cancellation: (fraction: 1.0, stage: KvTransfer),
    policies: [PerRequest],
)"#;
    let s = cancelsim::scenario::Scenario::parse(text, "<inline>").unwrap();
    let opts = cancelsim::run::RunOptions {
        sample_ns: 100_000_000,
        ..Default::default()
    };
    let (report, extras) = cancelsim::run::run(&s, 3, opts).unwrap();
    let h = report.policies[0].handoff.unwrap();
    assert_eq!(h.stranded, 3000, "every request stranded");
    assert_eq!(
        h.prefill.returned_lease, 3000,
        "every hold returned by its lease"
    );
    // Steady state: after the first lease, before the arrivals end (about 60 s).
    let steady: Vec<f64> = extras[1]
        .timeseries
        .iter()
        .filter(|x| (15.0..55.0).contains(&x.t_s))
        .map(|x| x.kv_blocks as f64)
        .collect();
    let mean = steady.iter().sum::<f64>() / steady.len() as f64;
    let predicted = 50.0 * 10.0 * 20.0;
    let error = (mean - predicted).abs() / predicted;
    assert!(
        error < 0.10,
        "pinned {mean:.0} blocks against {predicted}: {error:.3}"
    );
    eprintln!(
        "lease closed form: pinned {mean:.1} blocks, predicted {predicted}, error {error:.4}"
    );
    // Each hold lasted the lease exactly: 3,000 x 20 blocks x 10 s.
    let block_s = h.prefill.retained_block_s;
    assert!((block_s - 600_000.0).abs() < 1e-3, "{block_s}");
}

/// The library's storm during KV transfers, and the same storm where the router tells the prefill
/// side: the notice frees the pinned blocks at once, so nothing stalls and nothing needs recovering.
#[test]
fn a_storm_during_transfers_pins_the_prefill_pool_until_the_leases_end() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../scenarios/library/storm-during-kv-transfer.ron"
    );
    let storm = cancelsim::scenario::Scenario::load(std::path::Path::new(path)).unwrap();
    let mut told = storm.clone();
    told.cluster
        .topology
        .as_mut()
        .unwrap()
        .handoff
        .notify_prefill = true;
    let run = |s: &cancelsim::scenario::Scenario| {
        let (r, _) = cancelsim::run::run(s, 1, Default::default()).unwrap();
        r.policies[0].clone()
    };
    let (a, b) = (run(&storm), run(&told));
    let (ha, hb) = (a.handoff.unwrap(), b.handoff.unwrap());
    let (ra, rb) = (a.recovery.unwrap(), b.recovery.unwrap());
    assert!(
        ha.prefill.admission_stalls > 0 && ha.prefill.returned_lease >= 40,
        "{ha:?}"
    );
    assert!(ra.time_to_recover_s >= 20.0, "at least the lease: {ra:?}");
    assert_eq!(hb.prefill.admission_stalls, 0, "{hb:?}");
    assert!(hb.prefill.returned_cancelled >= 40, "{hb:?}");
    assert!(rb.recovered && rb.time_to_recover_s == 0.0, "{rb:?}");
    assert_eq!(a.sibling_survival.rate, 1.0);
    assert_eq!(b.sibling_survival.rate, 1.0);
}

/// Without a hang detector a wedged engine stays wedged: the requests behind it never finish, and
/// the run says so, naming the replica, instead of a false invariant violation or a hang.
#[test]
fn a_wedged_engine_without_a_hang_detector_stalls_the_run() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../scenarios/library/wedged-prefill-hang-detector.ron"
    );
    let mut s = cancelsim::scenario::Scenario::load(std::path::Path::new(path)).unwrap();
    s.cluster
        .topology
        .as_mut()
        .unwrap()
        .handoff
        .hang_detector_ms = None;
    let Err(e) = cancelsim::run::run(&s, 1, Default::default()) else {
        panic!("a wedged engine without a detector must stall the run");
    };
    let msg = e.to_string();
    assert!(matches!(e, cancelsim::world::RunError::Stalled(_)), "{msg}");
    assert!(
        msg.contains("replica 0 wedged at 20.") && msg.contains("no hang detector"),
        "{msg}"
    );
}

/// A failed transfer is not a lost request: the decode side computes the prompt again (vLLM's
/// `recompute` policy), every request completes, and its prefill costs twice.
#[test]
fn a_failed_transfer_is_recomputed_on_the_decode_side() {
    let failing = ONE_P_ONE_D.replacen(
        "links: [",
        "handoff: (transfer_failure: 1.0),\n    links: [",
        1,
    );
    let text = scenario(3, &failing);
    let s = cancelsim::scenario::Scenario::parse(&text, "<inline>").unwrap();
    let (r, _) = cancelsim::run::run(&s, 2, Default::default()).unwrap();
    let cf = &r.counterfactual;
    let h = cf.handoff.unwrap();
    assert_eq!((h.transfers_failed, h.transfers_done), (30, 0), "{h:?}");
    assert_eq!(cf.requests.completed, 30);
    let ok = cancelsim::scenario::Scenario::parse(&scenario(3, ONE_P_ONE_D), "<inline>").unwrap();
    let (base, _) = cancelsim::run::run(&ok, 2, Default::default()).unwrap();
    assert!(
        cf.gpu.busy_s > base.counterfactual.gpu.busy_s,
        "the prompts were computed twice"
    );
    assert!(cf.ttft_ms.p50 > base.counterfactual.ttft_ms.p50);
}

/// A storm in time draws the recovery plot (PNG and SVG) from the bins the summary's time to
/// recover reads; a run without one draws none (the test above).
#[test]
fn a_storm_in_time_draws_its_recovery() {
    let dir = scratch("recovery");
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../scenarios/library/storm-during-kv-transfer.ron"
    );
    let out = cancelsim(&["run", path, "--out", "out"], &dir);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run_dir = only_run(&dir, "storm-during-kv-transfer");
    let png = std::fs::read(run_dir.join("plots/recovery.png")).unwrap();
    assert!(
        png.len() > 10_000 && png.starts_with(b"\x89PNG"),
        "{} bytes",
        png.len()
    );
    assert!(run_dir.join("plots/recovery.svg").exists());
}

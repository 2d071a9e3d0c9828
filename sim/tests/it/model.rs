//! The runtime against independent truths (queueing theory, conservation, closed forms) and the
//! golden run hashes of the committed scenarios, all through one `check` helper.

use std::path::Path;

use cancelsim::dist::Dist;
use cancelsim::metrics::Summary;
use cancelsim::run;
use cancelsim::scenario::Scenario;
use cancelsim::workload;

/// Load `scenarios/<name>.ron` (or parse inline RON), run it with `seed`, assert what every run
/// must satisfy, and compare the run hash with `expect_hash` when one is given.
fn check(source: &str, seed: Option<u64>, expect_hash: Option<&str>) -> Summary {
    let scenario = load(source);
    let seed = seed.unwrap_or(scenario.seed);
    let s = run::counterfactual(&scenario, seed).unwrap();
    // Conservation beyond what the run asserts itself: GPU time is fully attributed.
    let attributed = s.gpu.gpu_s_requests + s.gpu.gpu_s_discarded + s.gpu.gpu_s_padding;
    assert!(
        (attributed - s.gpu.busy_s).abs() <= 1e-9 * s.gpu.busy_s.max(1.0),
        "GPU time not conserved: {attributed} attributed of {} busy",
        s.gpu.busy_s
    );
    assert_eq!(
        s.kv.allocated_blocks, s.kv.freed_blocks,
        "KV blocks not conserved"
    );
    assert_eq!(
        s.requests.completed + s.requests.rejected,
        s.requests.scheduled
    );
    assert!(
        s.littles_law.relative_gap < 1e-9,
        "Little's law: {:?}",
        s.littles_law
    );
    assert!(s.ttft_ms.mean <= s.e2e_ms.mean);
    // Determinism: the same scenario and seed give the same summary in the same process.
    let again = run::counterfactual(&scenario, seed).unwrap();
    assert_eq!(s, again);
    if let Some(expect) = expect_hash {
        assert_eq!(
            s.run_hash, expect,
            "golden run hash of {source} seed {seed} changed; if the model change is deliberate, update it in a visible commit"
        );
    }
    s
}

fn load(source: &str) -> Scenario {
    if source.trim_start().starts_with("Scenario(") {
        let mut s = Scenario::parse(source, "<inline>").unwrap();
        s.base_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios");
        s
    } else {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../scenarios")
            .join(format!("{source}.ron"));
        Scenario::load(&path).unwrap()
    }
}

/// One replica with `max_num_seqs` = 1 and a flat step of `step_ms`: a single server whose
/// service time is (output tokens) × step.
fn single_server(rate_per_s: f64, requests: u64, output: &str, step_ms: f64) -> String {
    format!(
        "Scenario(name: \"q\", workload: (source: Poisson(rate_per_s: {rate_per_s}, requests: {requests}), \
         prompt_tokens: Constant(1.0), output_tokens: {output}), \
         cluster: (profile: Custom(c0_ms: {step_ms}, kv_blocks_16: 100000), \
         scheduler: Continuous(max_num_seqs: 1, max_num_batched_tokens: 64)))"
    )
}

/// Pollaczek–Khinchine for M/D/1: Wq = rho D / (2 (1 - rho)).
#[test]
fn md1_mean_wait_matches_pollaczek_khinchine() {
    for (rho, seed) in [(0.5, 11), (0.8, 12)] {
        let d_ms = 10.0;
        let s = check(
            &single_server(rho / d_ms * 1000.0, 200_000, "Constant(1.0)", d_ms),
            Some(seed),
            None,
        );
        let expect_ms = rho * d_ms / (2.0 * (1.0 - rho)) + d_ms;
        // The tolerance comes from the run itself: batch means over completion order give a
        // 95 % half-width. Allow 2 half-widths (about 4 standard errors), and require the run to
        // be long enough that this is tight (< 5 % of the mean).
        let half_width = s.e2e_ms.mean_ci95;
        assert!(
            half_width < 0.05 * expect_ms,
            "run too short: ±{half_width} ms at rho {rho}"
        );
        assert!(
            (s.e2e_ms.mean - expect_ms).abs() < 2.0 * half_width,
            "rho {rho}: mean time in system {} ms, P-K {expect_ms} ms, tolerance {}",
            s.e2e_ms.mean,
            2.0 * half_width
        );
        // Utilisation = lambda D, a second closed form.
        assert!(
            (s.gpu.utilisation - rho).abs() < 0.01,
            "utilisation {} at rho {rho}",
            s.gpu.utilisation
        );
    }
}

/// Pollaczek–Khinchine for M/G/1: Wq = lambda E[S^2] / (2 (1 - rho)). The service is N steps of
/// D, where N = max(1, round(X)) and X is exponential with mean m; E[N] and E[N^2] are summed
/// from N's exact distribution, independently of the simulator.
#[test]
fn mg1_mean_wait_matches_pollaczek_khinchine() {
    let (m, d_ms, lambda) = (4.0f64, 2.0f64, 100.0f64);
    let cdf = |x: f64| 1.0 - (-x / m).exp();
    let (mut en, mut en2) = (0.0, 0.0);
    for k in 1..2000u32 {
        let k_f = k as f64;
        let p = if k == 1 {
            cdf(1.5)
        } else {
            cdf(k_f + 0.5) - cdf(k_f - 0.5)
        };
        en += k_f * p;
        en2 += k_f * k_f * p;
    }
    let (es, es2) = (en * d_ms / 1000.0, en2 * d_ms * d_ms / 1e6);
    let rho = lambda * es;
    assert!(rho < 0.9, "rho {rho}");
    let expect_ms = (lambda * es2 / (2.0 * (1.0 - rho)) + es) * 1000.0;
    let s = check(
        &single_server(lambda, 200_000, &format!("Exponential(mean: {m})"), d_ms),
        Some(3),
        None,
    );
    assert!(
        (s.e2e_ms.mean - expect_ms).abs() < 2.0 * s.e2e_ms.mean_ci95,
        "M/G/1: mean time in system {} ms, P-K {expect_ms} ms ± {}",
        s.e2e_ms.mean,
        2.0 * s.e2e_ms.mean_ci95
    );
}

#[test]
fn same_seed_same_hash_different_seed_different_hash() {
    let a = check("default", Some(1), None);
    let c = check("default", Some(2), None);
    assert_ne!(a.run_hash, c.run_hash);
    assert_ne!(a.workload_hash, c.workload_hash);
}

/// The hash users see: the report's, over the counterfactual and every policy run.
#[test]
fn golden_run_hashes() {
    for (name, golden) in [
        ("default", GOLDEN_DEFAULT),
        ("md1-rho08", GOLDEN_MD1_RHO08),
        ("trace-azure-conv", GOLDEN_TRACE_AZURE_CONV),
    ] {
        let scenario = load(name);
        let report = run::report(&scenario, scenario.seed).unwrap();
        assert_eq!(
            report.run_hash, golden,
            "golden run hash of {name} changed; if the model change is deliberate, update it in a visible commit"
        );
    }
}

const GOLDEN_DEFAULT: &str = "9da57bf1a4775691b4ce1b8e8015c6306d8c43d102426d326181e743ce65bf05";
const GOLDEN_MD1_RHO08: &str = "cbe1f1c3fe4126f96aad02a1f5df4af192a1ad45cefb60507690210cbde01f33";
const GOLDEN_TRACE_AZURE_CONV: &str =
    "3ff4f10dc5db880d39ea25682e69a6a48ed30f9d28c4e07e86a98614e5cb22fa";

fn batched(scheduler: &str, extra_workload: &str) -> String {
    format!(
        "Scenario(name: \"b\", workload: (source: Poisson(rate_per_s: 20.0, requests: 2000), \
         prompt_tokens: LogNormal(median: 300.0, sigma: 0.8), output_tokens: LogNormal(median: 60.0, sigma: 0.8){extra_workload}), \
         cluster: (replicas: 2, profile: Named(\"llama-3.1-8b-h100\"), scheduler: {scheduler}))"
    )
}

/// Runs with two scheduler kinds on the same seed see identical arrivals and lengths.
#[test]
fn scheduler_kinds_share_common_random_numbers() {
    let cont = check(&batched("Continuous(window: 1)", ""), Some(5), None);
    let cont2 = check(
        &batched("Continuous(window: 2, max_num_seqs: 16)", ""),
        Some(5),
        None,
    );
    let dynb = check(
        &batched("Dynamic(max_batch_size: 8, max_queue_delay_ms: 5.0)", ""),
        Some(5),
        None,
    );
    assert_eq!(cont.workload_hash, dynb.workload_hash);
    assert_eq!(cont.workload_hash, cont2.workload_hash);
    assert_ne!(
        cont.run_hash, dynb.run_hash,
        "different schedulers, different dynamics"
    );
    // Same requests, so the same tokens delivered, whatever the scheduler.
    assert_eq!(cont.gpu.tokens_generated, dynb.gpu.tokens_generated);
    assert_eq!(cont.gpu.tokens_generated, cont2.gpu.tokens_generated);
    // The shared-batch frame pads; continuous batching does not.
    assert!(dynb.gpu.padding_token_steps > 0 && cont.gpu.padding_token_steps == 0);
    // W = 2 discards one overshoot token per finished request at most, W = 1 none.
    assert_eq!(cont.gpu.tokens_discarded, 0);
    assert!(
        cont2.gpu.tokens_discarded > 0 && cont2.gpu.tokens_discarded <= cont2.requests.completed
    );
}

/// Tokens: delivered = sum of output lengths, which the workload fixes.
#[test]
fn every_output_token_is_delivered_once() {
    let text = "Scenario(name: \"t\", workload: (source: Poisson(rate_per_s: 50.0, requests: 500), \
                prompt_tokens: Constant(100.0), output_tokens: Constant(37.0)), \
                cluster: (profile: Named(\"llama-2-7b-a100\"), scheduler: Continuous(kv_blocks: 300, window: 2)))";
    let s = check(text, Some(1), None);
    assert_eq!(s.gpu.tokens_generated, 500 * 37);
    assert!(s.gpu.preemptions > 0, "300 blocks should force preemptions");
    // token-steps = prefill tokens (incl. recompute) + every sampled decode slot.
    assert!(s.gpu.token_steps >= 500 * (100 + 36));
}

/// The on/off source's long-run rate is the time-weighted mean of its two rates.
#[test]
fn on_off_source_has_the_mmpp_mean_rate() {
    let text = "Scenario(name: \"burst\", workload: (source: OnOff(rate_on_per_s: 200.0, rate_off_per_s: 10.0, \
                on_ms: Exponential(mean: 500.0), off_ms: Exponential(mean: 1500.0), requests: 60000), \
                prompt_tokens: Constant(1.0), output_tokens: Constant(1.0)), \
                cluster: (replicas: 8, profile: Custom(c0_ms: 0.1, kv_blocks_16: 1000), scheduler: Continuous()))";
    let s = check(text, Some(2), None);
    let expect = (200.0 * 500.0 + 10.0 * 1500.0) / 2000.0;
    // 60,000 arrivals over ~1000 s: about 500 on/off cycles, so a few percent of noise.
    assert!(
        (s.littles_law.lambda_per_s - expect).abs() < 0.06 * expect,
        "rate {} vs {expect}",
        s.littles_law.lambda_per_s
    );
}

#[test]
fn conversations_issue_every_turn_and_barge_ins_supersede() {
    let conv = |barge: &str| {
        format!(
            "Scenario(name: \"conv\", workload: (source: Conversations(conversations: 200, start_rate_per_s: 5.0, \
             turns: Uniform(low: 1.0, high: 6.0), think_ms: Exponential(mean: 500.0), requests_per_turn: 2{barge}), \
             prompt_tokens: Constant(200.0), output_tokens: Constant(80.0)), \
             cluster: (profile: Named(\"llama-3.1-8b-h100\"), scheduler: Continuous()))"
        )
    };
    let quiet = check(&conv(""), Some(4), None);
    let scenario = load(&conv(""));
    let turns: u64 = (0..200)
        .map(|c| workload::conversation_turns(&scenario.workload, 4, c) as u64)
        .sum();
    assert_eq!(quiet.workload.turns, turns, "every drawn turn is issued");
    assert_eq!(quiet.requests.scheduled, 2 * turns);
    assert_eq!(quiet.workload.interruptions, 0);
    // Barge in on every turn 100 ms after it starts, long before 80 tokens are done. Barge-ins
    // are cancel intents, so they act in the policy runs, not in the counterfactual.
    let scenario = load(&conv(
        ", barge_in: (probability: 1.0, after_ms: Constant(100.0))",
    ));
    let report = run::report(&scenario, 4).unwrap();
    assert_eq!(report.counterfactual.workload.interruptions, 0);
    let loud = &report.policies[0];
    assert_eq!(
        loud.workload.turns, turns,
        "same turns: barge-ins only shorten the think time"
    );
    assert_eq!(loud.workload.interruptions, turns);
    assert_eq!(loud.workload.superseded_requests, 2 * turns);
    // Every request of every turn was superseded while running: cancelled, none completed.
    assert_eq!(loud.requests.cancelled, 2 * turns);
    assert_eq!(loud.requests.completed, 0);
    assert_eq!(loud.late_outputs_admitted, 0);
}

#[test]
fn deadlines_and_disconnects_fire_only_before_completion() {
    let text = batched(
        "Continuous()",
        ", deadline_ms: Constant(0.001), disconnect_ms: Constant(1000000.0)",
    );
    let report = run::report(&load(&text), 6).unwrap();
    let s = &report.policies[0];
    assert_eq!(s.workload.deadlines_missed, s.requests.admitted);
    assert_eq!(
        s.requests.expired, s.requests.admitted,
        "expiry is its own disposition"
    );
    assert_eq!(s.requests.cancelled, 0);
    assert_eq!(s.workload.disconnects, 0);
    // Adding deadlines changes no lengths or arrivals.
    let plain = check(&batched("Continuous()", ""), Some(6), None);
    assert_eq!(plain.workload_hash, s.workload_hash);
}

#[test]
fn trace_replay_honours_window_speedup_and_sampling() {
    let trace = |opts: &str| {
        format!(
            "Scenario(name: \"tr\", workload: (source: Trace(path: \"traces/azure_llm_2023_code.csv\", format: AzureCsv{opts})), \
             cluster: (replicas: 4, profile: Named(\"llama-3.1-8b-h100\"), scheduler: Continuous()))"
        )
    };
    let window = check(&trace(", first_row: 100, rows: 500"), Some(1), None);
    assert_eq!(window.requests.scheduled, 500);
    let fast = check(
        &trace(", first_row: 100, rows: 500, speedup: 4.0"),
        Some(1),
        None,
    );
    assert_eq!(fast.requests.scheduled, 500);
    assert!(fast.littles_law.lambda_per_s > 3.0 * window.littles_law.lambda_per_s);
    let half = check(&trace(", sample_fraction: 0.5"), Some(1), None);
    // Binomial(8819, 0.5): sd 47; 5 sd.
    assert!(
        (half.requests.scheduled as f64 - 4409.5).abs() < 235.0,
        "{}",
        half.requests.scheduled
    );
    let half2 = check(&trace(", sample_fraction: 0.5"), Some(2), None);
    assert_ne!(
        half.workload_hash, half2.workload_hash,
        "the sample depends on the seed"
    );
}

/// The mooncake trace parses and runs (long prompts: 70B on TP4 with chunked prefill).
#[test]
fn mooncake_trace_runs() {
    let text = "Scenario(name: \"mc\", workload: (source: Trace(path: \"traces/mooncake_conversation_trace.jsonl\", \
                format: MooncakeJsonl, rows: 300)), \
                cluster: (replicas: 2, profile: Named(\"llama-3.1-70b-tp4-h100\"), scheduler: Continuous()))";
    let s = check(text, Some(1), None);
    assert_eq!(s.requests.scheduled, 300);
    assert!(
        s.ttft_ms.p50 > 100.0,
        "median prompt ~7k tokens at 14k tok/s: TTFT {}",
        s.ttft_ms.p50
    );
}

#[test]
fn least_loaded_router_beats_round_robin_on_skewed_load() {
    // Not a closed form, but a direction any correct router model must show on a heavy-tailed
    // workload: least-loaded never sends work to a busier replica when an idle one exists.
    let text = |router: &str| {
        format!(
            "Scenario(name: \"r\", workload: (source: Poisson(rate_per_s: 30.0, requests: 3000), \
             prompt_tokens: LogNormal(median: 500.0, sigma: 1.5), output_tokens: LogNormal(median: 100.0, sigma: 1.5)), \
             cluster: (replicas: 4, router: {router}, profile: Named(\"llama-3.1-8b-h100\"), scheduler: Continuous(max_num_seqs: 4)))"
        )
    };
    let rr = check(&text("RoundRobin"), Some(8), None);
    let ll = check(&text("LeastLoaded"), Some(8), None);
    assert_eq!(rr.workload_hash, ll.workload_hash);
    assert!(
        ll.e2e_ms.mean < rr.e2e_ms.mean,
        "least-loaded {} vs round-robin {}",
        ll.e2e_ms.mean,
        rr.e2e_ms.mean
    );
}

/// A scenario that omits the lengths gets the defaults the README documents.
#[test]
fn omitted_lengths_take_the_documented_defaults() {
    let s = load(
        "Scenario(name: \"d\", workload: (source: Poisson(rate_per_s: 1.0, requests: 1)), \
         cluster: (profile: Named(\"llama-3.1-8b-h100\"), scheduler: Continuous()))",
    );
    assert_eq!(
        s.workload.prompt_tokens,
        Dist::LogNormal {
            median: 1000.0,
            sigma: 0.8
        }
    );
    assert_eq!(
        s.workload.output_tokens,
        Dist::LogNormal {
            median: 130.0,
            sigma: 0.8
        }
    );
    assert_eq!(s.workload.deadline_ms, None);
    assert_eq!(s.policies.len(), 1);
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/scenarios.md"))
            .unwrap();
    assert!(
        readme.contains("prompt_tokens: LogNormal(median: 1000.0, sigma: 0.8),   // the default")
    );
    assert!(
        readme.contains("output_tokens: LogNormal(median: 130.0, sigma: 0.8),    // the default")
    );
}

/// With W = 2, a stop-token finish costs one step already in flight, discarded; a finish at the
/// request's `max_tokens` costs none, since the scheduler knows it. Flat 10 ms steps, 20 requests
/// of 50 tokens one after another: 20 overshoot steps of one token each, or none.
#[test]
fn only_stop_token_finishes_overshoot_with_a_window_of_two() {
    let text = |capped: f64| {
        format!(
            r#"Scenario(
    name: "overshoot",
    seed: 1,
    workload: (
        source: Poisson(rate_per_s: 0.5, requests: 20),
        prompt_tokens: Constant(16.0),
        output_tokens: Constant(50.0),
        length_capped: {capped},
    ),
    cluster: (profile: Custom(c0_ms: 10.0, kv_blocks_16: 1000), scheduler: Continuous(window: 2, max_num_seqs: 1)),
)"#
        )
    };
    let stop = check(&text(0.0), None, None);
    let capped = check(&text(1.0), None, None);
    assert_eq!(stop.requests.completed, 20);
    assert_eq!(capped.requests.completed, 20);
    assert!(
        (stop.gpu.gpu_s_discarded - 20.0 * 0.010).abs() < 1e-9,
        "{:?}",
        stop.gpu
    );
    assert_eq!(capped.gpu.gpu_s_discarded, 0.0, "{:?}", capped.gpu);
    assert_eq!(stop.gpu.steps, capped.gpu.steps + 20);
}

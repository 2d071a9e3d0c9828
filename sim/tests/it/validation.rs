//! `docs/validation.md`: every number on the page that comes from cancelsim is regenerated here
//! and compared with the page. `CANCELSIM_BLESS=1 cargo test -p cancelsim --test it validation`
//! rewrites the generated blocks after a deliberate model change.

use std::path::Path;

use cancelsim::metrics::Summary;
use cancelsim::run;
use cancelsim::scenario::{Scenario, StepForm};
use cancelsim_models::gpu::fit_table::fit_table;

use super::capacity::closed_form_report;
use super::overload::plateaus;
use super::prefix::{ideal_hits, run_trace};
use super::queueing::mdc_mean_in_system;

fn counterfactual(source: &str) -> Summary {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios");
    let scenario = if source.starts_with("Scenario(") {
        let mut s = Scenario::parse(source, "<inline>").unwrap();
        s.base_dir = root;
        s
    } else {
        Scenario::load(&root.join(format!("{source}.ron"))).unwrap()
    };
    run::counterfactual(&scenario, scenario.seed).unwrap()
}

fn row(what: &str, truth: f64, sim: f64, unit: &str) -> String {
    let err = (sim / truth - 1.0) * 100.0;
    let unit = if unit.is_empty() {
        String::new()
    } else {
        format!(" {unit}")
    };
    format!("| {what} | {truth:.3}{unit} | {sim:.3}{unit} | {err:+.2} % |\n")
}

const HEAD: &str = "| quantity | truth | cancelsim | error |\n|---|---:|---:|---:|\n";

/// M/D/1 at rho = 0.8, D = 10 ms: Pollaczek–Khinchine W = D + rho D / (2 (1 - rho)) = 30 ms.
fn md1() -> String {
    let s = counterfactual("md1-rho08");
    let wq = 0.8 * 10.0 / (2.0 * 0.2);
    let mut t = String::from(HEAD);
    t += &row("mean time in system", 10.0 + wq, s.e2e_ms.mean, "ms");
    t += &row(
        "mean wait (TTFT less one step)",
        wq,
        s.ttft_ms.mean - 10.0,
        "ms",
    );
    t += &format!(
        "\n95 % confidence interval of the mean time in system (batch means): ± {:.3} ms.\n",
        s.e2e_ms.mean_ci95
    );
    t
}

/// M/D/c: c single-server replicas behind the router's shared queue, against the embedded
/// chain's exact mean (see `queueing.rs`), and the same replicas behind round robin.
fn mdc() -> String {
    let mut t = String::from(
        "| servers | ρ | truth | cancelsim | error | ± (95 %) | round robin | least loaded |\n\
         |---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for (c, rho) in [(1usize, 0.8), (2, 0.7), (4, 0.8)] {
        let mut s = load_named("mdc-4-rho08");
        let rate = rho * c as f64 / 0.010;
        s.cluster.replicas = c as u32;
        if let cancelsim::scenario::Source::Poisson { rate_per_s, .. } = &mut s.workload.source {
            *rate_per_s = rate;
        }
        let shared = run::counterfactual(&s, 1).unwrap();
        s.cluster.router = cancelsim::scenario::Router::RoundRobin;
        let rr = run::counterfactual(&s, 1).unwrap();
        s.cluster.router = cancelsim::scenario::Router::LeastLoaded;
        let ll = run::counterfactual(&s, 1).unwrap();
        let truth = mdc_mean_in_system(c, rho * c as f64) / rate * 1e3;
        let err = (shared.e2e_ms.mean / truth - 1.0) * 100.0;
        t += &format!(
            "| {c} | {rho} | {truth:.3} ms | {:.3} ms | {err:+.2} % | {:.3} ms | {:.3} ms | {:.3} ms |\n",
            shared.e2e_ms.mean, shared.e2e_ms.mean_ci95, rr.e2e_ms.mean, ll.e2e_ms.mean
        );
    }
    t
}

fn load_named(name: &str) -> Scenario {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../scenarios")
        .join(format!("{name}.ron"));
    Scenario::load(&path).unwrap()
}

/// Little's law on the default scenario: the slab's time-average occupancy against λ·W.
fn little() -> String {
    let l = counterfactual("default").littles_law;
    let mut t = String::from(HEAD);
    t += &row(
        "L, time-average requests in the system",
        l.lambda_per_s * l.mean_e2e_s,
        l.mean_in_system,
        "",
    );
    t
}

/// One server, 10 ms steps, 10 output tokens: capacity 10 req/s, whatever the overload.
fn saturation() -> String {
    let mut t = String::from(HEAD);
    for rate in [20.0, 100.0] {
        let s = counterfactual(&format!(
            "Scenario(name: \"sat\", seed: 3, workload: (source: Poisson(rate_per_s: {rate}, \
             requests: 3000), prompt_tokens: Constant(1.0), output_tokens: Constant(10.0)), \
             cluster: (profile: Custom(c0_ms: 10.0, kv_blocks_16: 1000), \
             scheduler: Continuous(max_num_seqs: 1)))"
        ));
        let what = format!("throughput at {rate} req/s offered");
        t += &row(&what, 10.0, s.throughput_rps, "req/s");
    }
    t
}

fn overload() -> String {
    let mut t = String::from(
        "| profile | output median | capacity req/s | 1x | 1.5x | 2x | 3x | preemptions at 3x |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for (profile, output) in [("llama-3.1-8b-h100", 130.0), ("llama-2-7b-a100", 400.0)] {
        let (capacity, seen) = plateaus(profile, output);
        t += &format!("| {profile} | {output} | {capacity:.2} |");
        for (_, rps, _) in &seen {
            t += &format!(" {rps:.2} |");
        }
        t += &format!(" {} |\n", seen.last().unwrap().2);
    }
    t
}

/// The four quantiles the side-by-side tables compare, in their order.
const QUANTILES: [&str; 4] = ["TTFT p50", "TTFT p99", "E2E p50", "E2E p99"];

/// A run's TTFT p50, p99 and E2E p50, p99, in ms, in the order of [`QUANTILES`].
fn quantiles(s: &Summary) -> [f64; 4] {
    [s.ttft_ms.p50, s.ttft_ms.p99, s.e2e_ms.p50, s.e2e_ms.p99]
}

/// vidur's figures for this replay under its Sarathi and its vLLM scheduler (TTFT p50, p99, E2E
/// p50, p99, ms, read off its `request_metrics.csv`), beside cancelsim's with the roofline and
/// with 0.1's linear step model.
fn vidur() -> String {
    let mut t = String::from(
        "| scheduler | quantity | vidur | cancelsim | difference | cancelsim, linear (0.1) | \
         difference |\n|---|---|---:|---:|---:|---:|---:|\n",
    );
    let runs = [
        (
            "Sarathi, chunk 512",
            "vidur-azure-conv",
            [85.8, 343.8, 1694.5, 8003.5],
        ),
        (
            "vLLM (v0)",
            "vidur-azure-conv-vllm",
            [76.1, 298.9, 1759.9, 8350.3],
        ),
    ];
    for (scheduler, file, theirs) in runs {
        let roofline = counterfactual(file);
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../scenarios/{file}.ron"));
        let mut scenario = Scenario::load(&path).unwrap();
        scenario.cluster.step_model = Some(StepForm::Linear);
        let linear = run::counterfactual(&scenario, scenario.seed).unwrap();
        let (ours, old) = (quantiles(&roofline), quantiles(&linear));
        for (i, what) in QUANTILES.into_iter().enumerate() {
            let d = |x: f64| (x / theirs[i] - 1.0) * 100.0;
            t += &format!(
                "| {scheduler} | {what} | {:.1} ms | {:.1} ms | {:+.1} % | {:.1} ms | {:+.1} % |\n",
                theirs[i],
                ours[i],
                d(ours[i]),
                old[i],
                d(old[i])
            );
        }
    }
    t
}

/// AI Simulate's figures (aisimulate 0.13.0.dev202610270000000085, `aisimulate predict`, its
/// `prediction.json`: TTFT p50, p99, E2E p50, p99, ms) for the four traces and fleets, beside
/// cancelsim's on the same scenario; then one request alone, to set their step costs side by side.
fn aisim() -> String {
    let mut t = String::from(
        "| trace | workers | quantity | AI Simulate | cancelsim | difference |\n\
         |---|---:|---|---:|---:|---:|\n",
    );
    let runs = [
        (
            "Mooncake conv",
            4,
            "aisim-mooncake",
            [511.3, 8223.4, 5053.0, 29569.1],
        ),
        (
            "Mooncake conv",
            1,
            "aisim-mooncake-1",
            [2371095.0, 4283230.6, 2393458.6, 4306622.0],
        ),
        (
            "Azure conv",
            4,
            "aisim-azure-conv",
            [30.0, 103.9, 883.9, 4083.9],
        ),
        (
            "Azure conv",
            1,
            "aisim-azure-conv-1",
            [34.1, 173.2, 1150.5, 5213.1],
        ),
    ];
    for (trace, workers, file, theirs) in runs {
        let ours = quantiles(&counterfactual(file));
        for (i, what) in QUANTILES.into_iter().enumerate() {
            let d = (ours[i] / theirs[i] - 1.0) * 100.0;
            t += &format!(
                "| {trace} | {workers} | {what} | {:.1} ms | {:.1} ms | {d:+.1} % |\n",
                theirs[i], ours[i]
            );
        }
    }
    t += "\n| one request alone, prompt | AI Simulate: prefill, decode step | cancelsim | \
          difference |\n|---:|---:|---:|---:|\n";
    // AI Simulate's TTFT and (E2E - TTFT) / 100 for one request of 101 output tokens.
    for (prompt, prefill, step) in [
        (128, 7.615, 6.128),
        (2048, 43.508, 6.238),
        (8192, 199.719, 6.398),
    ] {
        let s = counterfactual(&format!(
            "Scenario(name: \"one\", seed: 1, workload: (source: Poisson(rate_per_s: 1.0, \
             requests: 1), prompt_tokens: Constant({prompt}.0), output_tokens: Constant(101.0)), \
             cluster: (profile: Named(\"llama-3.1-8b-h100\"), \
             scheduler: Continuous(window: 1, prefix_caching: false)))"
        ));
        let (ttft, decode) = (s.ttft_ms.p50, (s.e2e_ms.p50 - s.ttft_ms.p50) / 100.0);
        let d = |x: f64, y: f64| (x / y - 1.0) * 100.0;
        t += &format!(
            "| {prompt} | {prefill:.2} ms, {step:.3} ms | {ttft:.2} ms, {decode:.3} ms | \
             {:+.1} %, {:+.1} % |\n",
            d(ttft, prefill),
            d(decode, step)
        );
    }
    t
}

/// The Mooncake trace's own hit rate (unbounded cache, one request at a time) against the run's.
fn prefix() -> String {
    let (query, hit) = ideal_hits(300);
    let s = run_trace(
        300,
        0.001,
        1,
        "kv_blocks: Some(3000000),",
        true,
        "RoundRobin",
    );
    let busy = run_trace(3000, 1.0, 2, "", true, "RoundRobin");
    let session = run_trace(3000, 1.0, 2, "", true, "Session");
    let mut t = String::from(HEAD);
    for (what, truth, sim) in [
        ("prompt tokens looked up", query, s.kv.prefix_query_tokens),
        ("prompt tokens found cached", hit, s.kv.prefix_hit_tokens),
    ] {
        let err = (sim as f64 / truth as f64 - 1.0) * 100.0;
        t += &format!("| {what} | {truth} | {sim} | {err:+.2} % |\n");
    }
    t += &format!(
        "\nThe first 3,000 rows at the trace's own speed on two 8B/H100 replicas (27,284 blocks \
         each): hit rate {:.3} with round robin ({} preemptions; the shared prefixes are split \
         between replicas, and evicted under load), {:.3} with session affinity (a row goes where \
         its second block hash goes, the first being a system prompt every row shares; {} \
         preemptions).\n",
        busy.kv.prefix_hit_rate,
        busy.gpu.preemptions,
        session.kv.prefix_hit_rate,
        session.gpu.preemptions
    );
    t += &kv_closed_form();
    t += "\nThe same 3,000 rows behind a KV-aware router (`KvAware`: one per prompt block to \
          compute, `load_weight` per request held):\n\n\
          | router | hit rate | preemptions | expected hit tokens | found at routing | misroutes |\n\
          |---|---:|---:|---:|---:|---:|\n";
    let kv_aware = [
        (
            "KV-aware, load weight 4",
            "KvAware(overlap_weight: 1, load_weight: 4)",
        ),
        (
            "KV-aware, load weight 64",
            "KvAware(overlap_weight: 1, load_weight: 64)",
        ),
        (
            "KV-aware, load weight 64, 50 ms late",
            "KvAware(overlap_weight: 1, load_weight: 64, lag_us: 50000)",
        ),
    ]
    .map(|(name, router)| (name, run_trace(3000, 1.0, 2, "", true, router)));
    let plain = [("round robin", busy), ("session affinity", session)];
    for (name, s) in plain.into_iter().chain(kv_aware) {
        let books = s
            .router
            .map_or(["–".to_string(), "–".into(), "–".into()], |r| {
                [r.expected_hit_tokens, r.present_hit_tokens, r.misroutes].map(|x| x.to_string())
            });
        t += &format!(
            "| {name} | {:.3} | {} | {} |\n",
            s.kv.prefix_hit_rate,
            s.gpu.preemptions,
            books.join(" | ")
        );
    }
    t + &pd_prefix()
}

/// Two workers and one shared prefix of 1,024 tokens (`kv_routing.rs`): six requests a second
/// apart, and two where the second comes while the first decodes.
fn kv_closed_form() -> String {
    use super::kv_routing::{scenario, trace};
    let dir = crate::scratch::Scratch::new("validation", "kv", true);
    trace(&dir, &(0..6).map(|i| (i * 1000, 4)).collect::<Vec<_>>());
    let kv = scenario(&dir, "KvAware(overlap_weight: 1, load_weight: 1)");
    let rr = scenario(&dir, "RoundRobin");
    trace(&dir, &[(0, 2000), (500, 4)]);
    let late = scenario(
        &dir,
        "KvAware(overlap_weight: 1, load_weight: 1, lag_us: 2000000)",
    );
    let mut t = String::from(
        "\nTwo workers, requests whose 2,048-token prompts share their first 1,024 tokens: six \
         a second apart, where the prefix is computed once with a KV-aware router and once per \
         worker with round robin; then two, the second 0.5 s after the first while it decodes, \
         which a router 2 s late sends to the idle worker.\n\n",
    );
    t += HEAD;
    t += &row(
        "KV-aware: prompt tokens found cached",
        5.0 * 1024.0,
        kv.kv.prefix_hit_tokens as f64,
        "",
    );
    t += &row(
        "round robin: prompt tokens found cached",
        4.0 * 1024.0,
        rr.kv.prefix_hit_tokens as f64,
        "",
    );
    let m = late.router.unwrap().misroutes as f64;
    t += &row("KV-aware 2 s late: misroutes", 1.0, m, "");
    t
}

/// The same 300 rows on one prefill and one decode replica (`pd_prefix.rs`): each side finds
/// what one unbounded cache would, and the decode side is sent none of it again.
fn pd_prefix() -> String {
    let s = super::pd_prefix::mooncake_pd(300, 0.001, 1, 1, "kv_blocks: Some(3000000)", "");
    let s = cancelsim::run::counterfactual(&s, 1).unwrap();
    let (query, hit) = ideal_hits(300);
    let h = s.handoff.unwrap();
    let mut t = String::from(
        "\nThe first 300 rows, a thousand times slower, on one prefill and one decode replica \
         with caches that never evict: the prefill replica finds the trace's own reuse, and the \
         decode replica, which caches the prompts it receives, is sent only the rest; with two \
         decode replicas behind the KV-aware router, the one each prompt's prefix is on.\n\n",
    );
    t += HEAD;
    t += &row(
        "prefill: prompt tokens found cached",
        hit as f64,
        s.kv.prefix_hit_tokens as f64,
        "",
    );
    t += &row(
        "decode: prompt tokens not sent (cached)",
        hit as f64,
        h.transfer_tokens_cached as f64,
        "",
    );
    let gb = |tokens: u64| (tokens * 131_072) as f64 / 1e9;
    t += &row(
        "KV sent",
        gb(query - hit),
        h.transfer_bytes as f64 / 1e9,
        "GB",
    );
    // Two decode replicas behind the KV-aware router, which scores them by the blocks each
    // would receive: every prompt goes where its prefix is (each replica idle at each arrival,
    // so a prompt no one holds goes to the first), so the two are sent what one would be.
    let mut two = super::pd_prefix::mooncake_pd(300, 0.001, 1, 2, "kv_blocks: Some(3000000)", "");
    two.cluster.router = cancelsim::scenario::Router::KvAware {
        overlap_weight: 1,
        load_weight: 1,
        lag_us: 0,
    };
    let s = cancelsim::run::counterfactual(&two, 1).unwrap();
    let cached = s.handoff.unwrap().transfer_tokens_cached;
    assert_eq!(
        cached, hit,
        "two decode replicas behind the KV-aware router"
    );
    t += &row(
        "two decode replicas, KV-aware: prompt tokens not sent",
        hit as f64,
        cached as f64,
        "",
    );
    t
}

/// The capacity cost on one server, where it has a closed form (see `capacity.rs`).
fn capacity() -> String {
    let (r, n) = closed_form_report();
    let mut t = String::from(HEAD);
    for (p, per_target_s) in r.policies.iter().zip([0.090, 0.010]) {
        let c = p.capacity_cost.as_ref().unwrap();
        let what = format!("{}: GPU busy time beyond the ideal", p.policy);
        t += &row(&what, n * per_target_s, c.gpu_busy_s, "s");
        let what = format!("{}: makespan beyond the ideal", p.policy);
        t += &row(&what, n * per_target_s, c.makespan_s, "s");
    }
    t
}

/// Replace the body between `<!-- begin:NAME -->` and `<!-- end:NAME -->`.
fn splice(page: &str, name: &str, body: &str) -> String {
    let (begin, end) = (
        format!("<!-- begin:{name} -->\n"),
        format!("<!-- end:{name} -->"),
    );
    let b = page
        .find(&begin)
        .unwrap_or_else(|| panic!("no {begin:?} in the page"));
    let e = page[b..]
        .find(&end)
        .unwrap_or_else(|| panic!("no {end:?} after {begin:?}"))
        + b;
    format!("{}{begin}{body}{}", &page[..b], &page[e..])
}

#[test]
fn the_validation_page_matches_the_code() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/validation.md");
    let page = std::fs::read_to_string(&path).unwrap();
    let mut fresh = page.clone();
    for (name, body) in [
        ("fit", fit_table()),
        ("md1", md1()),
        ("mdc", mdc()),
        ("little", little()),
        ("saturation", saturation()),
        ("overload", overload()),
        ("vidur", vidur()),
        ("aisim", aisim()),
        ("prefix", prefix()),
        ("capacity", capacity()),
    ] {
        fresh = splice(&fresh, name, &body);
    }
    if std::env::var_os("CANCELSIM_BLESS").is_some() {
        std::fs::write(&path, &fresh).unwrap();
        return;
    }
    assert!(
        page == fresh,
        "docs/validation.md is out of date: run CANCELSIM_BLESS=1 cargo test -p cancelsim \
         --test it validation, and say why in the commit"
    );
}

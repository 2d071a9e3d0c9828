//! Overload: past capacity, throughput plateaus instead of collapsing (vLLM degrades gracefully).
//! The truth is the saturation throughput itself: every request arriving at once.

use cancelsim::run;
use cancelsim::scenario::Scenario;

/// Completed requests per second of virtual time, and preemptions, for `requests` Poisson
/// arrivals at `rate_per_s` on one replica of `profile`, without cancellations.
pub(crate) fn throughput(
    profile: &str,
    output_median: f64,
    rate_per_s: f64,
    requests: u64,
) -> (f64, u64) {
    let ron = format!(
        "Scenario(name: \"overload\", seed: 7, \
         workload: (source: Poisson(rate_per_s: {rate_per_s}, requests: {requests}), \
         prompt_tokens: LogNormal(median: 1000.0, sigma: 0.8), \
         output_tokens: LogNormal(median: {output_median}, sigma: 0.8)), \
         cluster: (profile: Named(\"{profile}\"), scheduler: Continuous(window: 2)))"
    );
    let scenario = Scenario::parse(&ron, "<inline>").unwrap();
    let s = run::counterfactual(&scenario, 7).unwrap();
    assert_eq!(s.requests.completed, requests);
    (s.throughput_rps, s.gpu.preemptions)
}

/// Throughput from 1x to 3x capacity stays within 10 % of the peak, where capacity is the
/// throughput with every request arriving within a second.
pub(crate) fn plateaus(profile: &str, output_median: f64) -> (f64, Vec<(f64, f64, u64)>) {
    let requests = 5000;
    let (capacity, _) = throughput(profile, output_median, requests as f64, requests);
    let mut seen = Vec::new();
    for load in [1.0, 1.5, 2.0, 3.0] {
        let (rps, preemptions) = throughput(profile, output_median, load * capacity, requests);
        seen.push((load, rps, preemptions));
    }
    let peak = seen.iter().map(|s| s.1).fold(capacity, f64::max);
    eprintln!("{profile}: capacity {capacity:.2} req/s; (load, req/s, preemptions): {seen:?}");
    for &(load, rps, preemptions) in &seen {
        assert!(
            rps >= 0.9 * peak,
            "{profile}: {rps:.2} req/s at {load}x capacity ({capacity:.2}), peak {peak:.2}, \
             {preemptions} preemptions; all: {seen:?}"
        );
    }
    (capacity, seen)
}

#[test]
fn throughput_plateaus_past_capacity_on_an_h100() {
    plateaus("llama-3.1-8b-h100", 130.0);
}

#[test]
fn throughput_plateaus_past_capacity_when_kv_is_the_bottleneck() {
    // Llama-2-7B's 512 KiB per token fill an A100's 7,300 blocks: long outputs preempt.
    plateaus("llama-2-7b-a100", 400.0);
}

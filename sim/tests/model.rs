//! The model against independent truths (queueing theory, conservation) and the golden run
//! hashes of the committed scenarios, all through one `check` helper.

use std::path::Path;

use cancelsim::scenario::Scenario;
use cancelsim::world::{self, Summary};

/// Load `scenarios/<name>.ron` (or parse inline RON), run it with `seed`, assert the invariants
/// every run must satisfy, and compare the run hash with `expect_hash` when one is given.
fn check(source: &str, seed: Option<u64>, expect_hash: Option<&str>) -> Summary {
    let scenario = if source.trim_start().starts_with("Scenario(") {
        Scenario::parse(source, "<inline>").unwrap()
    } else {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../scenarios")
            .join(format!("{source}.ron"));
        Scenario::load(&path).unwrap()
    };
    let seed = seed.unwrap_or(scenario.seed);
    let s = world::run(&scenario, seed).unwrap();
    // Invariants of every run.
    assert_eq!(s.requests.scheduled, scenario.workload.requests);
    assert_eq!(
        s.requests.completed, s.requests.scheduled,
        "conservation: everyone leaves"
    );
    assert_eq!(
        s.events,
        2 * s.requests.scheduled,
        "one arrival and one departure each"
    );
    assert!(
        s.littles_law.relative_gap < 1e-9,
        "Little's law: {:?}",
        s.littles_law
    );
    assert!(s.wait_ms.mean <= s.e2e_ms.mean);
    // Determinism: the same scenario and seed give the same hash in the same process.
    let again = world::run(&scenario, seed).unwrap();
    assert_eq!(s.run_hash, again.run_hash);
    if let Some(expect) = expect_hash {
        assert_eq!(
            s.run_hash, expect,
            "golden run hash of {source} seed {seed} changed; if the model change is deliberate, update it in a visible commit"
        );
    }
    s
}

fn md1(rho: f64, requests: u64, seed: u64) -> String {
    // D = 10 ms, so lambda = rho / D = 100 rho per second.
    format!(
        "Scenario(name: \"md1\", workload: (requests: {requests}, arrivals: Poisson(rate_per_s: {})), \
         server: (slots: 1, service_ms: Constant(10.0)))",
        100.0 * rho
    ) + &format!("// seed {seed}")
}

/// Pollaczek–Khinchine for M/D/1: Wq = rho D / (2 (1 - rho)).
#[test]
fn md1_mean_wait_matches_pollaczek_khinchine() {
    for (rho, seed) in [(0.5, 11), (0.8, 12)] {
        let s = check(&md1(rho, 200_000, seed), Some(seed), None);
        let expect_ms = rho * 10.0 / (2.0 * (1.0 - rho));
        // The tolerance comes from the run itself: batch means over 32 contiguous id ranges give
        // a 95 % half-width (t_31 = 2.04). Allow 2 half-widths (about 4 standard errors), and
        // require the run to be long enough that this is tight (< 6 % of the mean).
        let half_width = s.wait_ms.mean_ci95;
        assert!(
            half_width < 0.06 * expect_ms,
            "run too short: ±{half_width} ms at rho {rho}"
        );
        assert!(
            (s.wait_ms.mean - expect_ms).abs() < 2.0 * half_width,
            "rho {rho}: mean wait {} ms, P-K {expect_ms} ms, tolerance {}",
            s.wait_ms.mean,
            2.0 * half_width
        );
        // Utilisation = lambda D, a second closed form.
        assert!(
            (s.utilisation - rho).abs() < 0.01,
            "utilisation {} at rho {rho}",
            s.utilisation
        );
        // Deterministic service: e2e = wait + D exactly, so the means differ by exactly 10 ms.
        assert!((s.e2e_ms.mean - s.wait_ms.mean - 10.0).abs() < 1e-9);
    }
}

/// M/M/1 (exponential service): Wq = rho / (mu - lambda), and the mean time in system
/// W = 1 / (mu - lambda). A second, independent closed form for the same machinery.
#[test]
fn mm1_mean_time_in_system_matches_closed_form() {
    let text = "Scenario(name: \"mm1\", workload: (requests: 200000, arrivals: Poisson(rate_per_s: 70.0)), \
                server: (slots: 1, service_ms: Exponential(mean: 10.0)))";
    let s = check(text, Some(5), None);
    let (lambda, mu) = (70.0, 100.0);
    let w_ms = 1000.0 / (mu - lambda);
    assert!(
        (s.e2e_ms.mean - w_ms).abs() < 2.0 * s.e2e_ms.mean_ci95,
        "M/M/1 W = {} ms, closed form {w_ms} ms ± {}",
        s.e2e_ms.mean,
        2.0 * s.e2e_ms.mean_ci95
    );
}

#[test]
fn same_seed_same_hash_different_seed_different_hash() {
    let a = check("default", Some(1), None);
    let b = check("default", Some(1), None);
    let c = check("default", Some(2), None);
    assert_eq!(a.run_hash, b.run_hash);
    assert_ne!(a.run_hash, c.run_hash);
    assert_eq!(a, b, "whole summaries are equal, floats included");
}

#[test]
fn golden_run_hashes() {
    check("default", None, Some(GOLDEN_DEFAULT));
    check("md1-rho08", None, Some(GOLDEN_MD1_RHO08));
}

const GOLDEN_DEFAULT: &str = "080a6aa0177b5be58dc14e92f96600c9937c2008f81302e9d7dddb5f7c9742e9";
const GOLDEN_MD1_RHO08: &str = "17bc3a10f49ac113f2dae0b5736ee3ac1b42b8e01fa45f4b37c9b1830897223b";

/// Common random numbers: a request's service demand is its own stream's, so adding requests
/// at the end leaves everyone earlier with the same arrival and service, hence (FIFO, one slot)
/// the same waits. Compare the first run with the prefix of a longer one.
#[test]
fn more_requests_do_not_shift_earlier_draws() {
    let text = |n: u64| {
        format!(
            "Scenario(name: \"crn\", workload: (requests: {n}, arrivals: Poisson(rate_per_s: 50.0)), \
             server: (slots: 1, service_ms: LogNormal(median: 10.0, sigma: 1.0)))"
        )
    };
    let short = check(&text(1000), Some(9), None);
    // In the longer run, the first 1000 requests are identical; the extra ones only arrive
    // later. So the max e2e of the short run is at most that of the long one, and the long
    // run's virtual time is longer.
    let long = check(&text(1001), Some(9), None);
    assert!(long.virtual_time_s > short.virtual_time_s);
    assert!(long.e2e_ms.max >= short.e2e_ms.max);
    // With FIFO and one slot, request 1000 cannot change requests 0..999, so the total wait of
    // the first 1000 is the same: sum_long = sum_short + wait of request 1000 >= sum_short.
    let sum = |s: &Summary| s.wait_ms.mean * s.requests.completed as f64;
    assert!(sum(&long) >= sum(&short) - 1e-6);
}

//! Per-request queueing against independent truths: each row's scheduling delay is its queue
//! wait, restarts add up to the engine's preemptions, and gamma arrivals have the gaps asked for.

use std::cell::RefCell;
use std::rc::Rc;

use cancelsim::record::{RequestRow, RequestSink};
use cancelsim::run::{self, RunOptions};
use cancelsim::scenario::Scenario;

#[derive(Clone, Default)]
struct Rows(Rc<RefCell<Vec<RequestRow>>>);

impl RequestSink for Rows {
    fn row(&mut self, row: &RequestRow) {
        self.0.borrow_mut().push(row.clone());
    }
}

/// The counterfactual's summary and its rows, for the scenario `ron`.
fn rows_of(ron: &str) -> (cancelsim::metrics::Summary, Vec<RequestRow>) {
    let scenario = Scenario::parse(ron, "<inline>").unwrap();
    let rows = Rows::default();
    let opts = RunOptions {
        sink: Some(Box::new(rows.clone())),
        ..RunOptions::default()
    };
    let (report, _) = run::run(&scenario, scenario.seed, opts).unwrap();
    let taken = rows.0.borrow().clone();
    (report.counterfactual, taken)
}

fn single_server(source: &str) -> String {
    format!(
        "Scenario(name: \"q\", seed: 3, workload: (source: {source}, \
         prompt_tokens: Constant(1.0), output_tokens: Constant(1.0)), \
         cluster: (profile: Custom(c0_ms: 10.0, kv_blocks_16: 100000), \
         scheduler: Continuous(max_num_seqs: 1, max_num_batched_tokens: 64)))"
    )
}

/// On a single server of one 10 ms step per request, a request's time in system is its queue
/// wait plus the step: the row's scheduling delay must be exactly e2e − 10 ms, and its mean the
/// Pollaczek–Khinchine wait ρD / (2(1 − ρ)) = 20 ms at ρ = 0.8.
#[test]
fn scheduling_delay_is_the_queue_wait() {
    let (s, rows) = rows_of(&single_server(
        "Poisson(rate_per_s: 80.0, requests: 100000)",
    ));
    assert_eq!(rows.len(), 100_000);
    let mut sum_ms = 0.0;
    for r in &rows {
        let delay = r.scheduling_delay_ms.expect("every request was scheduled");
        let e2e = r.e2e_ms.unwrap();
        assert!(
            (e2e - 10.0 - delay).abs() < 1e-6,
            "row {}: {delay} + 10 != {e2e}",
            r.id
        );
        assert_eq!(r.restarts, 0);
        sum_ms += delay;
    }
    let mean_ms = sum_ms / rows.len() as f64;
    let tolerance_ms = 2.0 * s.e2e_ms.mean_ci95;
    assert!(
        (mean_ms - 20.0).abs() < tolerance_ms,
        "mean wait {mean_ms} ms, P-K 20 ms ± {tolerance_ms}"
    );
}

/// Evenly spaced arrivals (gamma, cv 0) slower than the service never wait: D/D/1.
#[test]
fn evenly_spaced_arrivals_never_wait() {
    let (_, rows) = rows_of(&single_server(
        "Gamma(rate_per_s: 90.0, cv: 0.0, requests: 5000)",
    ));
    assert!(rows.iter().all(|r| r.scheduling_delay_ms == Some(0.0)));
    let gaps: Vec<f64> = rows
        .windows(2)
        .map(|w| w[1].arrival_ms - w[0].arrival_ms)
        .collect();
    assert!(
        gaps.iter().all(|g| (g - 1000.0 / 90.0).abs() < 1e-5),
        "uneven gaps"
    );
}

/// Gamma arrivals have the rate and the coefficient of variation of their gaps asked for.
#[test]
fn gamma_arrivals_have_the_gaps_asked_for() {
    for cv in [0.5, 1.0, 3.0] {
        let source = format!("Gamma(rate_per_s: 20.0, cv: {cv}, requests: 40000)");
        let (_, mut rows) = rows_of(&single_server(&source));
        rows.sort_by_key(|r| r.id);
        let gaps: Vec<f64> = rows
            .windows(2)
            .map(|w| w[1].arrival_ms - w[0].arrival_ms)
            .collect();
        let n = gaps.len() as f64;
        let mean = gaps.iter().sum::<f64>() / n;
        let sd = (gaps.iter().map(|g| (g - mean) * (g - mean)).sum::<f64>() / (n - 1.0)).sqrt();
        assert!(
            (mean - 50.0).abs() < 5.0 * 50.0 * cv / n.sqrt(),
            "cv {cv}: mean gap {mean} ms"
        );
        assert!(
            (sd / mean - cv).abs() < 0.06 * cv,
            "cv {cv}: seen {}",
            sd / mean
        );
    }
}

/// Restarts, per request, add up to the engine's preemptions, on a KV-bound replica that
/// preempts hundreds of times.
#[test]
fn restarts_add_up_to_the_preemptions() {
    let ron = "Scenario(name: \"kv\", seed: 7, \
         workload: (source: Poisson(rate_per_s: 6.0, requests: 1500), \
         prompt_tokens: LogNormal(median: 1000.0, sigma: 0.8), \
         output_tokens: LogNormal(median: 400.0, sigma: 0.8)), \
         cluster: (profile: Named(\"llama-2-7b-a100\"), scheduler: Continuous(window: 2)))";
    let (s, rows) = rows_of(ron);
    let restarts: u64 = rows.iter().map(|r| r.restarts as u64).sum();
    assert!(
        s.gpu.preemptions > 100,
        "only {} preemptions",
        s.gpu.preemptions
    );
    assert_eq!(restarts, s.gpu.preemptions);
    // A restarted request waited at least once: its delay is at most its time to first token.
    for r in rows.iter().filter(|r| r.restarts > 0) {
        assert!(r.scheduling_delay_ms.unwrap() <= r.ttft_ms.unwrap());
    }
}

//! The capacity cost against the ideal cancel, on a single server where it has a closed form.

use cancelsim::run;
use cancelsim::scenario::Scenario;

/// 200 requests arrive at once at one server (`max_num_seqs` 1, flat 10 ms steps, W = 1), each
/// with a 1-token prompt and 10 output tokens: 100 ms of service apiece. Every fourth is cancelled
/// the moment its first token is out. The ideal cancel removes it before the next step: each
/// saves the 9 steps (90 ms) finish-and-discard runs anyway. A per-request cancel takes 0.2 ms
/// to arrive, so it is observed at the next step boundary: one step (10 ms) more than ideal.
/// The report of that world, and the number of targets.
pub(crate) fn closed_form_report() -> (run::Report, f64) {
    let targets: Vec<String> = (0..200)
        .filter(|i| i % 4 == 0)
        .map(|i| i.to_string())
        .collect();
    let ron = format!(
        "Scenario(name: \"closed\", seed: 5, \
         workload: (source: Poisson(rate_per_s: 1000000.0, requests: 200), \
         prompt_tokens: Constant(1.0), output_tokens: Constant(10.0)), \
         cluster: (profile: Custom(c0_ms: 10.0, kv_blocks_16: 1000), \
         scheduler: Continuous(max_num_seqs: 1)), \
         cancellation: (requests: [{}], stage: Decode, delay_ms: Constant(0.0)), \
         policies: [FinishAndDiscard, PerRequest], \
         adapter: (rpc_latency_ms: Constant(0.2), loss: 0.0, timeout_ms: 50.0))",
        targets.join(", ")
    );
    let s = Scenario::parse(&ron, "<inline>").unwrap();
    let r = run::report(&s, 5).unwrap();
    (r, targets.len() as f64)
}

#[test]
fn capacity_cost_has_the_single_servers_closed_form() {
    let (r, n) = closed_form_report();
    let ideal = r.ideal.as_ref().expect("an ideal baseline");
    assert_eq!(ideal.policy, "ideal");
    let (fd, pr) = (&r.policies[0], &r.policies[1]);
    let fd_cost = fd.capacity_cost.as_ref().unwrap();
    let pr_cost = pr.capacity_cost.as_ref().unwrap();
    let close = |x: f64, want: f64| (x - want).abs() < 1e-6;
    assert!(close(fd_cost.gpu_busy_s, n * 0.090), "{fd_cost:?}");
    assert!(close(fd_cost.makespan_s, n * 0.090), "{fd_cost:?}");
    assert!(close(pr_cost.gpu_busy_s, n * 0.010), "{pr_cost:?}");
    assert!(close(pr_cost.makespan_s, n * 0.010), "{pr_cost:?}");
    // The same completions, sooner: the ideal's goodput is higher by exactly that makespan.
    assert_eq!(fd.requests.completed, ideal.requests.completed);
    let rps = |makespan: f64| ideal.requests.completed as f64 / makespan;
    assert!(close(
        fd_cost.goodput_rps,
        rps(ideal.makespan_s) - rps(fd.makespan_s)
    ));
    // The ideal serves every other request for 100 ms and each target for 10 ms.
    assert!(
        close(ideal.gpu.busy_s, (200.0 - n) * 0.1 + n * 0.01),
        "{}",
        ideal.gpu.busy_s
    );
}

//! One regression test per defect of the correctness issue ("right answers in every
//! configuration"): each failed before its fix. The worlds are the smallest that showed it.

use cancelsim::run::{self, Report};
use cancelsim::scenario::Scenario;

fn scenario(text: &str) -> Scenario {
    Scenario::parse(text, "<defect>").unwrap_or_else(|e| panic!("{e}"))
}

fn report(text: &str) -> Report {
    let s = scenario(text);
    run::report(&s, s.seed).unwrap_or_else(|e| panic!("{e}"))
}

/// One conversation on a flat 10 ms step, with the given extra sections.
fn conversation(turns: u32, extra: &str) -> String {
    format!(
        r#"Scenario(name: "conv", seed: 1,
        workload: (source: Conversations(conversations: 1, start_rate_per_s: 1.0,
            turns: Constant({turns}.0), think_ms: Constant(0.0)),
            prompt_tokens: Constant(10.0), output_tokens: Constant(10.0)),
        cluster: (profile: Custom(c0_ms: 10.0, kv_blocks_16: 1000), scheduler: Continuous()),
        {extra})"#
    )
}

#[test]
fn defect_1_a_conversation_ends_when_its_turn_is_expired_by_playback() {
    let r = report(&conversation(
        2,
        "playback: (writer_wait_ms: Constant(1.0), max_age_ms: 0.0)",
    ));
    let cf = &r.counterfactual;
    assert_eq!(cf.workload.turns, 2, "both turns ran");
    assert_eq!(
        cf.requests.expired, 2,
        "each turn's request expired at the sink"
    );
}

#[test]
fn defect_1_a_conversation_ends_when_its_turns_are_cancelled_by_a_storm() {
    let r = report(&conversation(
        3,
        "cancellation: (fraction: 1.0, stage: Decode), policies: [PerRequest]",
    ));
    let p = &r.policies[0];
    assert_eq!(p.workload.turns, 3);
    assert_eq!(p.requests.cancelled, 3);
    assert_eq!(r.counterfactual.requests.completed, 3);
}

#[test]
fn defect_9_a_deadline_past_the_time_limit_does_not_keep_the_run_alive() {
    let r = report(
        r#"Scenario(name: "late-deadline", seed: 1,
        workload: (source: Poisson(rate_per_s: 10.0, requests: 200),
            output_tokens: Constant(20.0), deadline_ms: Constant(7e8), disconnect_ms: Constant(6e8)),
        cluster: (profile: Named("llama-3.1-8b-h100"), scheduler: Continuous()),
        cancellation: (fraction: 0.1, stage: Decode))"#,
    );
    let p = &r.policies[0];
    assert_eq!(p.requests.completed + p.requests.cancelled, 200);
    // The run ends with its work (20 s of arrivals), not with the timers of requests long gone.
    assert!(p.virtual_time_s < 60.0, "ran {} s", p.virtual_time_s);
    assert_eq!(p.workload.deadlines_missed, 0);
}

#[test]
fn defect_10_a_huge_but_valid_max_age_runs() {
    let r = report(&conversation(1, "playback: (max_age_ms: 1e308)"));
    assert_eq!(r.counterfactual.requests.completed, 1);
}

#[test]
fn defect_11_a_prefill_rate_that_would_round_to_free_is_refused_at_load() {
    let text = r#"Scenario(name: "p", workload: (source: Poisson(rate_per_s: 1.0, requests: 1)),
        cluster: (profile: Custom(c0_ms: 1.0, prefill_tokens_per_s: 0.4, kv_blocks_16: 100),
        scheduler: Continuous()))"#;
    let e = Scenario::parse(text, "p.ron").unwrap_err().to_string();
    assert!(
        e.contains("cluster.profile.Custom.prefill_tokens_per_s") && e.contains("0.4"),
        "{e}"
    );
    assert!(e.starts_with("p.ron:2:"), "names the line: {e}");
}

#[test]
fn defect_2_a_controller_record_outlives_thousands_of_others_while_its_request_is_here() {
    // After-completion intents 6 s late at 1,000 requests/s: over 6,000 requests end between a
    // target's completion and its intent, more than the controller's 4,096 + 4,096 tombstones.
    // The record used to be evicted and the world reported the completed target as cancelled.
    let r = report(
        r#"Scenario(name: "late-intents", seed: 1,
        workload: (source: Poisson(rate_per_s: 1000.0, requests: 9000),
            prompt_tokens: Constant(4.0), output_tokens: Constant(1.0)),
        cluster: (replicas: 4, profile: Custom(c0_ms: 1.0, kv_blocks_16: 1000),
            scheduler: Continuous()),
        cancellation: (fraction: 0.05, stage: AfterCompletion, delay_ms: Constant(6000.0)),
        policies: [PerRequest])"#,
    );
    let t = &r.policies[0].targets;
    assert!(t.completed > 300, "{t:?}");
    assert_eq!((t.cancelled, t.expired), (0, 0), "{t:?}");
}

/// `requests` Poisson arrivals at 1,000/s on one 8B/H100 with `kv_blocks` blocks at window `w`.
fn tight(requests: u32, lengths: &str, kv_blocks: u32, w: u32) -> String {
    format!(
        r#"Scenario(name: "tight", seed: 1,
        workload: (source: Poisson(rate_per_s: 1000.0, requests: {requests}){lengths}),
        cluster: (profile: Named("llama-3.1-8b-h100"),
            scheduler: Continuous(kv_blocks: {kv_blocks}, window: {w})),
        limits: (max_time_s: 2000.0))"#
    )
}

#[test]
fn defect_3_preemption_makes_progress_at_every_window() {
    // Two requests that cannot both fit 30 blocks: at W = 2 each used to preempt itself while
    // its step was in flight, forever. Now the older one preempts the newer one only.
    let lengths = ", prompt_tokens: Constant(200.0), output_tokens: Constant(100.0)";
    let busy = |w| report(&tight(2, lengths, 30, w)).counterfactual.gpu.busy_s;
    let w1 = busy(1);
    for w in 2..=4 {
        let b = busy(w);
        assert!(b < w1 * 1.2, "W = {w}: {b} GPU-s against {w1} at W = 1");
    }
    // A Poisson burst on a tight pool at W = 3 takes about as long as at W = 1.
    let time = |w| {
        report(&tight(400, "", 512, w))
            .counterfactual
            .virtual_time_s
    };
    let (t1, t3) = (time(1), time(3));
    assert!(t3 < t1 * 1.1, "{t3} s at W = 3 against {t1} s at W = 1");
}

#[test]
fn defect_12_two_scenarios_with_the_same_events_never_share_a_run_hash() {
    // Only the description differs: the event streams coincide, the scenarios do not.
    let text = |d: &str| {
        format!(
            r#"Scenario(name: "same", description: "{d}", seed: 1,
            workload: (source: Poisson(rate_per_s: 10.0, requests: 20)),
            cluster: (profile: Named("llama-3.1-8b-h100"), scheduler: Continuous()))"#
        )
    };
    let (a, b) = (report(&text("one")), report(&text("two")));
    assert_ne!(a.scenario_hash, b.scenario_hash);
    assert_eq!(a.counterfactual.events, b.counterfactual.events);
    assert_ne!(a.run_hash, b.run_hash);
    assert_ne!(a.counterfactual.run_hash, b.counterfactual.run_hash);
}

#[test]
fn defect_7_a_request_its_own_owners_stale_abort_killed_is_a_loss() {
    // One conversation; a barge-in supersedes each turn and the next turn starts at once; the
    // sequence-scoped abort of the superseded turn arrives later and kills the new turn, which
    // had no intent of its own. It used to be exempt as "the owner's group": 0 of 0 siblings.
    let r = report(
        r#"Scenario(name: "own-kill", seed: 1,
        workload: (source: Conversations(conversations: 1, start_rate_per_s: 1.0,
            turns: Constant(2.0), think_ms: Constant(0.0),
            barge_in: (probability: 1.0, after_ms: Constant(30.0))),
            prompt_tokens: Constant(10.0), output_tokens: Constant(40.0)),
        cluster: (profile: Custom(c0_ms: 10.0, kv_blocks_16: 1000), scheduler: Continuous()),
        policies: [GroupAbort(Sequence)], adapter: (rpc_latency_ms: Constant(5.0)))"#,
    );
    let p = &r.policies[0];
    assert!(p.cancel_rpc.collateral_kills >= 1, "{:?}", p.cancel_rpc);
    assert!(p.sibling_survival.siblings >= p.cancel_rpc.collateral_kills);
    assert!(p.sibling_survival.rate < 1.0, "{:?}", p.sibling_survival);
}

#[test]
fn defect_4_the_dynamic_batcher_tracks_the_kv_its_cancelled_members_retain() {
    // A member's blocks are held until its shared batch ends: from its intent on, retained.
    let r = report(
        r#"Scenario(name: "dyn-retained", seed: 1,
        workload: (source: Poisson(rate_per_s: 20.0, requests: 40),
            prompt_tokens: Constant(64.0), output_tokens: Uniform(low: 20.0, high: 200.0)),
        cluster: (profile: Custom(c0_ms: 10.0, kv_blocks_16: 2000),
            scheduler: Dynamic(max_batch_size: 8, max_queue_delay_ms: 20.0)),
        cancellation: (fraction: 0.3, stage: Decode), policies: [PerRequest])"#,
    );
    let p = &r.policies[0];
    assert!(p.requests.cancelled > 0);
    assert!(p.retained.kv_block_s > 0.0, "{:?}", p.retained);
    assert!(p.retained.peak_blocks > 0, "{:?}", p.retained);
    assert!(p.retained.kv_block_s <= p.kv.block_s);
    assert_eq!(r.counterfactual.retained.kv_block_s, 0.0);
}

//! Durable agent jobs: the hand-computed case, the rules every job keeps on many seeds, the
//! plans refused at load, and AIPerf's cancel knobs.

use cancelsim::metrics::{JobsSummary, Summary};
use cancelsim::run::{self, Report};
use cancelsim::scenario::Scenario;

fn scenario(text: &str) -> Scenario {
    Scenario::parse(text, "<jobs>").unwrap_or_else(|e| panic!("{e}"))
}

fn report(text: &str, seed: u64) -> Report {
    let s = scenario(text);
    run::report(&s, seed).unwrap_or_else(|e| panic!("{e}"))
}

const LIBRARY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../scenarios/library/");

/// A library scenario's text.
fn library(name: &str) -> String {
    std::fs::read_to_string(format!("{LIBRARY}{name}")).unwrap()
}

fn jobs(s: &Summary) -> &JobsSummary {
    s.jobs.as_ref().expect("a jobs section")
}

/// Jobs with the given plan, cancel and worker on a flat 10 ms step.
fn jobs_text(n: u64, plan: &str, extra: &str) -> String {
    format!(
        r#"Scenario(name: "j", seed: 1,
        workload: (source: Jobs(jobs: {n}, rate_per_s: 5.0, job: (
            deadline_ms: Uniform(low: 2000.0, high: 20000.0), plan: {plan}, {extra})),
            prompt_tokens: Uniform(low: 50.0, high: 400.0), output_tokens: Uniform(low: 5.0, high: 60.0)),
        cluster: (replicas: 2, profile: Custom(c0_ms: 10.0, kv_blocks_16: 4000),
            scheduler: Continuous(window: 2, max_num_seqs: 16)),
        policies: [PerRequest, GroupAbort(Stream), FinishAndDiscard],
        adapter: (streams: 3))"#
    )
}

#[test]
fn the_hand_computed_job_matches_its_arithmetic() {
    // scenarios/library/jobs-hand-computed.ron gives the arithmetic, step by step.
    let text = library("jobs-hand-computed.ron");
    let r = report(&text, 1);
    let j = jobs(&r.policies[0]);
    assert_eq!((j.accepted, j.cancelled, j.completed), (1, 1, 0));
    assert_eq!(
        (j.true_tokens, j.reported_tokens, j.usage_gap_tokens),
        (352, 350, 2)
    );
    assert_eq!(j.cleanup_ms.p50, 55.0);
    assert_eq!(j.allowances_used_p99, 2);
    assert!((j.leaked_gpu_s - 0.020).abs() < 1e-9, "{}", j.leaked_gpu_s);
    assert_eq!((j.effects_completed, j.effects_unknown), (2, 0));
    // The fence: the cancel came during call 2, and no third request ever started.
    assert_eq!(r.policies[0].requests.scheduled, 2);
    // The counterfactual runs the job to its end: usage complete, all 120 + 240 tokens.
    let cf = jobs(&r.counterfactual);
    assert_eq!((cf.completed, cf.usage_complete), (1, 1));
    assert_eq!((cf.true_tokens, cf.reported_tokens), (360, 360));
}

#[test]
fn every_rule_holds_on_many_seeds_of_a_mixed_plan() {
    let plan = r#"[Call, Subagent("search"), Repeat(times: 2, steps: [Tools(tools: 3,
        duration_ms: Exponential(mean: 300.0), effect_probability: 0.4), Call]),
        Approval(wait_ms: Exponential(mean: 500.0)), Call]"#;
    let extra = r#"agents: {"search": [Call, Tools(tools: 2, duration_ms: Constant(200.0))]},
        cancel: Some((fraction: 0.5, delay_ms: Uniform(low: 0.0, high: 6000.0), duplicates: 2)),
        worker: (notify_loss: 0.3, sandbox_kill_ms: Exponential(mean: 1500.0), allowances_max: 2)"#;
    let text = jobs_text(40, plan, extra);
    let mut seen = [0u64; 6];
    for seed in 1..=12 {
        // A broken rule stops the run with an error naming it: every report here kept them all.
        let r = report(&text, seed);
        for p in std::iter::once(&r.counterfactual).chain(&r.policies) {
            let j = jobs(p);
            let ended = j.completed + j.cancelled + j.expired + j.failed;
            assert_eq!(ended, j.accepted, "every job ends in one state ({seed})");
            assert!(j.reported_tokens <= j.true_tokens);
            assert!(j.usage_complete <= j.completed);
            assert_eq!(
                j.cleanups,
                j.cancelled + j.expired,
                "one cleanup per decision"
            );
            seen[0] += j.cancelled;
            seen[1] += j.expired;
            seen[2] += j.completion_won;
            seen[3] += j.cleanup_incomplete;
            seen[4] += j.notifications_lost;
            seen[5] += j.failed;
        }
    }
    // The draws reach every path this test means to cover.
    assert!(seen.iter().all(|&n| n > 0), "{seen:?}");
}

#[test]
fn a_plan_that_cannot_run_is_refused_at_load_where_it_is_written() {
    let cases = [
        (
            r#"[Subagent("a")]"#,
            r#"agents: {"a": [Call, Subagent("b")], "b": [Subagent("a")]}"#,
            "cycle of subagents",
        ),
        (
            r#"[Tools(tools: 2, duration_ms: Constant(0.0))]"#,
            "",
            "no duration",
        ),
        (r#"[Approval(wait_ms: Constant(0.0))]"#, "", "no duration"),
        (
            r#"[Repeat(times: 4097, steps: [Call])]"#,
            "",
            "between 1 and 4096",
        ),
        (
            r#"[Repeat(times: 2048, steps: [Call])]"#,
            "call_attempts: 3",
            "provider attempts",
        ),
        (r#"[Subagent("nobody")]"#, "", "no agent named"),
        ("[]", "", "at least one step"),
        (
            r#"[Repeat(times: 300, steps: [Repeat(times: 300, steps: [Approval(wait_ms: Constant(1.0))])])]"#,
            "",
            "unrolls to 90000 steps",
        ),
    ];
    for (plan, extra, want) in cases {
        let text = jobs_text(1, plan, extra);
        let e = Scenario::parse(&text, "j.ron").unwrap_err().to_string();
        assert!(e.contains(want), "{plan}: {e}");
        assert!(e.starts_with("j.ron:"), "names the file: {e}");
        assert!(
            e.contains("workload.source.Jobs.job"),
            "names the field: {e}"
        );
    }
    let zero = jobs_text(1, "[Call]", "").replace(
        "deadline_ms: Uniform(low: 2000.0, high: 20000.0)",
        "deadline_ms: Constant(0.0)",
    );
    let e = Scenario::parse(&zero, "j.ron").unwrap_err().to_string();
    assert!(
        e.contains("deadline of 0") && e.starts_with("j.ron:3:"),
        "{e}"
    );
}

const POISSON: &str = r#"Scenario(name: "a", seed: 3,
    workload: (source: Poisson(rate_per_s: 200.0, requests: 400)),
    cluster: (profile: Named("llama-3.1-8b-h100"), scheduler: Continuous()),
    cancellation: CANCEL)"#;

#[test]
fn aiperfs_cancel_knobs_mean_what_they_mean_there() {
    let knobs = POISSON.replace(
        "CANCEL",
        "(request_cancellation_rate: 25.0, request_cancellation_delay: 0.5)",
    );
    let own = POISSON.replace(
        "CANCEL",
        "(fraction: 0.25, stage: AfterArrival, delay_ms: Constant(500.0))",
    );
    let (a, b) = (scenario(&knobs), scenario(&own));
    // One scenario, two spellings: the same hash, so the same run directory and run hash.
    assert_eq!(a.hash(), b.hash());
    let (ra, rb) = (run::report(&a, 3).unwrap(), run::report(&b, 3).unwrap());
    assert_eq!(ra.run_hash, rb.run_hash);
    let targets = ra.policies[0].workload.storm_targets;
    assert!(
        (70..=130).contains(&targets),
        "about 25 % of 400: {targets}"
    );
    for (bad, want) in [
        ("(request_cancellation_rate: 120.0)", "percentage"),
        (
            "(request_cancellation_delay: 1.0)",
            "needs `request_cancellation_rate`",
        ),
        (
            "(request_cancellation_rate: 10.0, request_cancellation_delay: -1.0)",
            ">= 0",
        ),
        (
            "(request_cancellation_rate: 10.0, fraction: 0.5)",
            "one spelling or the other",
        ),
    ] {
        let e = Scenario::parse(&POISSON.replace("CANCEL", bad), "a.ron")
            .unwrap_err()
            .to_string();
        assert!(e.contains(want) && e.starts_with("a.ron:4:"), "{bad}: {e}");
    }
}

#[test]
fn each_rule_broken_on_purpose_stops_the_run_naming_it() {
    use cancelsim::world::{Hooks, JobBug};
    let plan = r#"[Call, Subagent("s"), Tools(tools: 2, duration_ms: Constant(300.0)), Call]"#;
    let extra = r#"agents: {"s": [Call]},
        cancel: Some((fraction: 0.6, delay_ms: Uniform(low: 0.0, high: 3000.0))),
        worker: (sandbox_kill_ms: Exponential(mean: 3000.0))"#;
    let s = scenario(&jobs_text(30, plan, extra));
    for (bug, says) in [
        (
            JobBug::IgnoresFence,
            "dispatched work after its terminal decision",
        ),
        (JobBug::RedecidesTerminal, "terminal state changed"),
        (JobBug::OverReports, "reported"),
        (JobBug::ChildOutlivesParent, "a child's deadline"),
        (JobBug::AttemptsUnbounded, "provider attempts"),
    ] {
        let hooks = Hooks {
            job_bug: Some(bug),
            ..Hooks::default()
        };
        let caught = (1..=6).find_map(|seed| run::report_with(&s, seed, hooks).err());
        let e = caught
            .unwrap_or_else(|| panic!("{bug:?} was never caught"))
            .to_string();
        assert!(e.contains(says), "{bug:?}: {e}");
        // The correct model passes the same seeds.
        assert!((1..=6).all(|seed| run::report(&s, seed).is_ok()));
    }
}

#[test]
fn a_recorded_session_is_a_job_and_a_broken_trace_names_its_line() {
    let text = library("jobs-agent-trace.ron");
    // Cancel the session with the subagent at 300 ms, during its 200 ms of tool work (250-450).
    let cancelled = text.replace(
        "deadline_ms: Constant(60000.0),",
        "deadline_ms: Constant(60000.0), cancel: Some((jobs: [0], delay_ms: Constant(300.0))),",
    );
    let mut s = Scenario::parse(&cancelled, "t.ron").unwrap();
    s.base_dir = std::path::PathBuf::from(LIBRARY);
    let r = run::report(&s, 1).unwrap();
    let p = &r.policies[0];
    let j = jobs(p);
    assert_eq!((j.completed, j.cancelled), (1, 1));
    assert_eq!(
        p.requests.scheduled, 3,
        "the call after the tool work is never sent"
    );
    // The worker learns of it at 305 ms, drains the tool (it ends at 450 ms), then terminates
    // the sandbox (50 ms): 200 ms after the decision.
    assert_eq!(j.cleanup_ms.p50, 200.0);
    assert_eq!(
        j.late_observations, 1,
        "the tool's result came after the decision"
    );
    // A row that waits for a row nobody wrote is refused at load, with its line.
    let dir = crate::scratch::Scratch::new("jobs", "bad-trace", true);
    let bad = "{\"request_id\": \"a\", \"input_length\": 9, \"output_length\": 1, \"timestamp\": 0}\n\
               {\"request_id\": \"b\", \"input_length\": 9, \"output_length\": 1, \"wait_for\": [\"z\"]}\n";
    std::fs::write(dir.join("bad.jsonl"), bad).unwrap();
    let ron = text.replace("../traces/agentic-example.jsonl", "bad.jsonl");
    std::fs::write(dir.join("s.ron"), ron).unwrap();
    let e = Scenario::load(&dir.join("s.ron")).unwrap_err().to_string();
    assert!(e.contains("bad.jsonl:2:") && e.contains("\"z\""), "{e}");
}

#[test]
fn a_durable_job_outlives_its_observer_and_an_inline_one_does_not() {
    let text = library("jobs-hand-computed.ron");
    // The hand-computed job, its observer leaving when its cancel came (1,305 ms), no cancel.
    let with = |durable: bool| {
        let t = text.replace(
            "cancel: Some((jobs: [0], delay_ms: Constant(1305.0))),",
            &format!("observer: Some((disconnect_ms: Constant(1305.0), durable: {durable})),"),
        );
        report(&t, 1)
    };
    let durable = with(true);
    let j = jobs(&durable.policies[0]);
    assert_eq!(
        (
            j.completed,
            j.cancelled,
            j.observers_left,
            j.observer_cancels
        ),
        (1, 0, 1, 0)
    );
    assert_eq!(
        j.leaked_gpu_s, 0.0,
        "a durable job's work after its observer left is not leaked"
    );
    assert_eq!((j.true_tokens, j.reported_tokens), (360, 360));
    // Inline, the observer's leaving is the job's cancel: the hand-computed case's figures.
    let inline = with(false);
    let j = jobs(&inline.policies[0]);
    assert_eq!((j.completed, j.cancelled, j.observer_cancels), (0, 1, 1));
    assert_eq!(
        (j.true_tokens, j.reported_tokens, j.cleanup_ms.p50),
        (352, 350, 55.0)
    );
    assert!((j.leaked_gpu_s - 0.020).abs() < 1e-9);
    assert_eq!(j.provider_attempts, 2);
    assert_eq!(
        j.observers.as_ref().map(|o| o.results_unobserved),
        Some(1),
        "it left and never came back"
    );
}

#[test]
fn a_reconnect_is_replayed_the_retained_result_and_never_restarts_generation() {
    let text = library("jobs-hand-computed.ron");
    // The hand-computed job's observer leaves at 1,305 ms (no cancel of its own) and comes back.
    let with = |durable: bool, back_ms: f64, retention_ms: f64| {
        let t = text.replace(
            "cancel: Some((jobs: [0], delay_ms: Constant(1305.0))),",
            &format!(
                "observer: Some((disconnect_ms: Constant(1305.0), durable: {durable}, \
                 reconnect_ms: Some(Constant({back_ms})), retention_ms: Some({retention_ms}))),"
            ),
        );
        let r = report(&t, 1);
        let p = r.policies[0].clone();
        (jobs(&p).clone(), p.requests.scheduled)
    };
    // Inline: the disconnect cancelled it; back 100 ms later (the cleanup ran until 1,360 ms,
    // the job has left) it is replayed the interruption, and nothing is sent again.
    let (j, scheduled) = with(false, 100.0, 300_000.0);
    let o = j.observers.clone().unwrap();
    assert_eq!((j.cancelled, o.reconnects, o.replays), (1, 1, 1));
    assert_eq!((o.replayed_interruptions, o.results_unobserved), (1, 0));
    assert_eq!(scheduled, 2, "a reconnect restarted generation");
    assert_eq!(j.provider_attempts, 2);
    // Back after the 10 ms of retention the job's events had (1,405 ms against 1,305 + 10): gone.
    let (j, _) = with(false, 100.0, 10.0);
    let o = j.observers.clone().unwrap();
    assert_eq!((o.reconnects, o.replays, o.too_late), (1, 0, 1));
    assert_eq!(o.results_unobserved, 1);
    // Durable: it runs on (call 2 ends at 1,400 ms). Back 50 ms later the observer follows it
    // to its completion; back 100 ms later, the job has left, and its result is replayed.
    let (j, scheduled) = with(true, 50.0, 10.0);
    let o = j.observers.clone().unwrap();
    assert_eq!((j.completed, o.reconnects, o.resumed_live), (1, 1, 1));
    assert_eq!((o.replays, o.results_unobserved), (0, 0));
    assert_eq!(scheduled, 2);
    let (j, _) = with(true, 100.0, 10.0);
    let o = j.observers.clone().unwrap();
    assert_eq!(
        (o.resumed_live, o.replays, o.replayed_interruptions),
        (0, 1, 0)
    );
}

#[test]
fn parallel_branches_run_side_by_side_and_one_cancel_closes_them_all() {
    // scenarios/library/jobs-parallel-branches.ron gives the arithmetic.
    let text = library("jobs-parallel-branches.ron");
    let mut s = Scenario::parse(&text, "t.ron").unwrap();
    s.base_dir = std::path::PathBuf::from(LIBRARY);
    let r = run::report(&s, 1).unwrap();
    // Uncancelled, both branches start at 100 ms: the job ends at 500 ms, not 700 ms.
    let cf = &r.counterfactual;
    assert_eq!(cf.makespan_s, 0.5, "the branches ran one after another");
    assert_eq!(cf.requests.completed, 4);
    assert_eq!(
        (jobs(cf).true_tokens, jobs(cf).usage_complete),
        (110 + 60 + 80 + 210, 1)
    );
    let p = &r.policies[0];
    let j = jobs(p);
    assert_eq!((j.cancelled, j.cleanups, j.cleanup_incomplete), (1, 1, 0));
    assert_eq!(p.requests.scheduled, 3, "the join is fenced");
    assert_eq!(p.requests.cancelled, 2, "both branches' streams are closed");
    assert_eq!(j.cleanup_ms.p50, 15.2);
    assert_eq!(
        j.allowances_used_p99, 1,
        "two streams closing together: one wait"
    );
    assert_eq!((j.true_tokens, j.reported_tokens), (224, 220));
    // The branches are the job's own group: neither is a sibling of its cancel.
    assert_eq!(p.sibling_survival.siblings, 0);
}

#[test]
fn a_drawn_plans_parallel_branches_run_side_by_side_and_the_step_after_waits_for_all() {
    // A call, then two branches (one call; two calls), then a call, each call 100 ms on a flat
    // 10 ms step (10 output tokens): 0-100, both branches from 100 (to 200 and 300), the join
    // 300-400. One after another the calls would take 500 ms.
    let text = r#"Scenario(name: "p", seed: 1,
        workload: (source: Jobs(jobs: 1, rate_per_s: 1.0, job: (
            deadline_ms: Constant(60000.0),
            plan: [Call, Parallel([[Call], [Call, Tools(tools: 1, duration_ms: Constant(1.0)), Call]]), Call])),
            prompt_tokens: Constant(100.0), output_tokens: Constant(10.0)),
        cluster: (profile: Custom(c0_ms: 10.0, kv_blocks_16: 1000), scheduler: Continuous(window: 1)),
        policies: [PerRequest])"#;
    let r = report(text, 1);
    let cf = &r.counterfactual;
    assert_eq!(cf.requests.completed, 5);
    assert_eq!(
        cf.makespan_s, 0.401,
        "branches one after another, or the join ran early"
    );
    assert_eq!((jobs(cf).completed, jobs(cf).usage_complete), (1, 1));
    // The join's prompt carries every branch's history: 100 + 4 x (100 + 10) = 540 tokens.
    let (_, rows) = super::queueing::rows_of(text);
    let last = rows
        .iter()
        .filter(|q| q.policy == "counterfactual")
        .max_by_key(|q| q.id);
    assert_eq!(last.map(|q| q.prompt_tokens), Some(540));
    // An empty branch is refused where it is written.
    let bad = text.replace("[[Call], [Call,", "[[], [Call,");
    let e = Scenario::parse(&bad, "p.ron").unwrap_err().to_string();
    assert!(
        e.contains("Parallel[0]") && e.contains("a branch must hold a step"),
        "{e}"
    );
}

#[test]
fn developer_hosted_tools_are_not_drained_and_their_late_results_await_the_external_system() {
    // A call (0-200 ms), two tools of 1 s with an effect each (200-1,200 ms), a call; the cancel
    // at 510 ms, the worker told at 515 ms (its poll would at 750 ms).
    let text = |hosted: bool| {
        format!(
            r#"Scenario(name: "h", seed: 1,
        workload: (source: Jobs(jobs: 1, rate_per_s: 1.0, job: (
            deadline_ms: Constant(60000.0),
            plan: [Call, Tools(tools: 2, duration_ms: Constant(1000.0), effect_probability: 1.0,
                               developer_hosted: {hosted}), Call],
            cancel: Some((jobs: [0], delay_ms: Constant(510.0))))),
            prompt_tokens: Constant(100.0), output_tokens: Constant(20.0)),
        cluster: (profile: Custom(c0_ms: 10.0, kv_blocks_16: 1000), scheduler: Continuous(window: 1)),
        policies: [PerRequest])"#
        )
    };
    // In the sandbox: the worker drains the tools (to 1,200 ms) and terminates the sandbox
    // (50 ms): 740 ms; both results came after the decision, journalled, effects completed.
    let r = report(&text(false), 1);
    let j = jobs(&r.policies[0]);
    assert_eq!(j.cleanup_ms.p50, 740.0);
    assert_eq!((j.effects_completed, j.late_observations), (2, 2));
    assert_eq!(
        j.effects_awaiting_external, None,
        "no hosted tool, no such field"
    );
    // Developer-hosted: nothing of the job's to drain or terminate, so the cleanup ends when
    // the worker learns of the decision; both results come as submissions to a terminal job,
    // rejected, and their effects await the external system.
    let r = report(&text(true), 1);
    let j = jobs(&r.policies[0]);
    assert_eq!((j.cleanups, j.cleanup_ms.p50), (1, 5.0));
    assert_eq!(
        (j.effects_completed, j.late_observations, j.effects_unknown),
        (0, 0, 0)
    );
    assert_eq!(
        (j.effects_awaiting_external, j.rejected_submissions),
        (Some(2), Some(2))
    );
    // The counterfactual runs it through: both submissions land, both effects complete.
    let cf = jobs(&r.counterfactual);
    assert_eq!(
        (cf.effects_completed, cf.effects_awaiting_external),
        (2, Some(0))
    );
}

#[test]
fn a_recorded_sessions_hash_ids_feed_the_prefix_cache() {
    // `a` (1,024 tokens: blocks 1, 2), then `b` and `c` side by side (1,536 tokens each: blocks
    // 1, 2 and one of their own). Each branch finds a's two blocks cached: 2 x 1,024 of the
    // 4,096 prompt tokens looked up. Without the ids the cache keys nothing.
    let dir = crate::scratch::Scratch::new("jobs", "hash-ids", true);
    let rows = r#"{"request_id": "a", "input_length": 1024, "output_length": 4, "timestamp": 0.0, "hash_ids": [1, 2]}
{"request_id": "b", "input_length": 1536, "output_length": 4, "wait_for": ["a"], "hash_ids": [1, 2, 3]}
{"request_id": "c", "input_length": 1536, "output_length": 4, "wait_for": ["a"], "hash_ids": [1, 2, 4]}
"#;
    let kv = |rows: &str| {
        std::fs::write(dir.join("t.jsonl"), rows).unwrap();
        let ron = r#"Scenario(name: "hx", seed: 1,
            workload: (source: AgentTrace(path: "t.jsonl", job: (deadline_ms: Constant(60000.0)))),
            cluster: (profile: Custom(c0_ms: 10.0, kv_blocks_16: 1000), scheduler: Continuous(window: 1)),
            policies: [PerRequest])"#;
        std::fs::write(dir.join("s.ron"), ron).unwrap();
        let s = Scenario::load(&dir.join("s.ron")).unwrap();
        run::report(&s, 1).unwrap().counterfactual.kv
    };
    let with = kv(rows);
    assert_eq!(
        (with.prefix_query_tokens, with.prefix_hit_tokens),
        (4096, 2048)
    );
    let plain = rows
        .lines()
        .map(|l| l.split(", \"hash_ids\"").next().unwrap().to_string() + "}\n")
        .collect::<String>();
    assert_eq!(kv(&plain).prefix_hit_tokens, 0);
    // Block ids that do not cover the prompt are refused, naming the row's line.
    std::fs::write(dir.join("t.jsonl"), rows.replace("[1, 2, 4]", "[1, 2]")).unwrap();
    let e = Scenario::load(&dir.join("s.ron")).unwrap_err().to_string();
    assert!(e.contains("t.jsonl:3:") && e.contains("hash_ids"), "{e}");
}

#[test]
fn with_prices_a_job_reports_its_cost_a_lower_bound_until_complete() {
    // The hand-computed job at $1 per million input tokens and $10 per million output tokens:
    // true 320 in + 32 out = $0.00064; reported 320 in + 30 out = $0.00062. Uncancelled: 320
    // in + 40 out = $0.00072, complete.
    let text = library("jobs-hand-computed.ron");
    let priced = text.replace(
        "deadline_ms: Constant(60000.0),",
        "deadline_ms: Constant(60000.0), \
         prices: Some((input_usd_per_mtok: 1.0, output_usd_per_mtok: 10.0)),",
    );
    let r = report(&priced, 1);
    let j = jobs(&r.policies[0]);
    let close = |x: Option<f64>, want: f64| (x.unwrap() - want).abs() < 1e-12;
    assert!(close(j.true_cost_usd, 0.00064), "{:?}", j.true_cost_usd);
    assert!(
        close(j.reported_cost_usd, 0.00062),
        "{:?}",
        j.reported_cost_usd
    );
    assert_eq!(j.cost_complete, Some(0));
    let cf = jobs(&r.counterfactual);
    assert!(close(cf.true_cost_usd, 0.00072) && close(cf.reported_cost_usd, 0.00072));
    assert_eq!(cf.cost_complete, Some(1));
    assert_eq!(
        jobs(&report(&text, 1).policies[0]).true_cost_usd,
        None,
        "no prices, no cost"
    );
    let bad = priced.replace("input_usd_per_mtok: 1.0", "input_usd_per_mtok: -1.0");
    let e = Scenario::parse(&bad, "p.ron").unwrap_err().to_string();
    assert!(e.contains("prices.input_usd_per_mtok"), "{e}");
}

//! One regression test per finding of the adversarial pass ("right on every graph, bounded under
//! every load"): each failed before its fix, on the smallest world that showed it.

mod capacity;

use cancelsim::run::{self, Report};
use cancelsim::scenario::Scenario;
use cancelsim::world::RunError;

fn scenario(text: &str) -> Scenario {
    Scenario::parse(text, "<adversarial>").unwrap_or_else(|e| panic!("{e}"))
}

fn report(text: &str) -> Report {
    let s = scenario(text);
    run::report(&s, s.seed).unwrap_or_else(|e| panic!("{e}"))
}

/// 1P1D of Llama-3.1-8B/H100 with 3,000 blocks a side and a 25 Gb/s KV link (a 1,024-token
/// prompt's KV takes 43 ms on the wire): the given workload, link fields, handoff and the rest.
fn one_p_one_d(workload: &str, link: &str, handoff: &str, rest: &str) -> String {
    format!(
        r#"Scenario(name: "pd", seed: 1,
    workload: ({workload}),
    cluster: (replicas: 2, profile: Named("llama-3.1-8b-h100"),
        scheduler: Continuous(kv_blocks: Some(3000)),
        topology: Some((
            stages: [(name: "router", role: Router), (name: "prefill", role: Prefill),
                (name: "decode", role: Decode), (name: "playback", role: Playback)],
            links: [(from: "router", to: "prefill"),
                (from: "prefill", to: "decode", latency_ms: 0.5, bandwidth_gbps: 25.0{link}),
                (from: "decode", to: "playback")],
            handoff: ({handoff}),
        ))),
    {rest})"#
    )
}

/// A burst of 400 requests on `one_p_one_d`, 1 % of the link's notices lost, 30 s leases on
/// both sides, with more handoff fields, cancellation and policies.
fn pd_burst(handoff: &str, rest: &str) -> String {
    one_p_one_d(
        "source: Poisson(rate_per_s: 200.0, requests: 400), \
         prompt_tokens: Constant(1024.0), output_tokens: Constant(128.0)",
        ", loss: 0.01",
        &format!(
            "prefill_reclaim: Lease(lease_ms: 30000.0, grace_ms: 0.0), \
             decode_reclaim: Lease(lease_ms: 30000.0, grace_ms: 0.0){handoff}"
        ),
        rest,
    )
}

#[test]
fn item_1_the_ideal_cancel_frees_a_requests_handoff_blocks_at_its_intent() {
    // Half the burst cancelled as its KV leaves (in the P-to-D gap), or once the decode stage has
    // taken it. Per-request cancel tells nobody on the prefill side, so those blocks stay until
    // the 30 s lease. The ideal used to keep them just as long: per-request's capacity cost was
    // 0 while it pinned the prefill pool, and the ideal held 362,376 block-s there, 7x the
    // counterfactual's.
    // (Once the decode stage has it, its transfer's end would tell the prefill side, unless the
    // connector has no such notice; this one has none.)
    for (stage, handoff) in [
        ("KvTransfer", ""),
        (
            "AwaitingRemoteKv",
            ", transfer_cancel: AtTransferEndNoNotice",
        ),
    ] {
        let r = report(&pd_burst(
            handoff,
            &format!(
                "cancellation: (fraction: 0.5, stage: {stage}), \
                 policies: [PerRequest, FinishAndDiscard]"
            ),
        ));
        let ideal = r.ideal.as_ref().expect("an ideal baseline");
        let (cf, pr) = (&r.counterfactual, &r.policies[0]);
        let held = |s: &cancelsim::metrics::Summary| s.handoff.unwrap().prefill.retained_block_s;
        assert!(
            held(ideal) <= held(cf),
            "{stage}: the ideal held {} prefill block-s, the counterfactual {}",
            held(ideal),
            held(cf)
        );
        let h = ideal.handoff.unwrap();
        assert_eq!((h.stranded, h.decode.retained_block_s), (0, 0.0), "{h:?}");
        assert!(h.prefill.returned_cancelled > 0, "{h:?}");
        let cost = pr.capacity_cost.as_ref().unwrap();
        assert!(
            held(pr) > 2.0 * held(cf),
            "{stage}: the policy pins the pool"
        );
        assert!(
            cost.makespan_s > 1.0 && cost.gpu_busy_s > 0.0,
            "{stage}: pinning the prefill pool costs per-request capacity: {cost:?}"
        );
    }
}

/// 3P2D with 64-block pools, conversations whose turns carry their history, a share of the notices
/// lost (5 %) and no prefill reclaim: blocks are pinned for good, and the run must stall.
fn pinned_for_good(window: u32) -> String {
    format!(
        r#"Scenario(name: "pinned-for-good", seed: 2,
    workload: (source: Conversations(conversations: 20, start_rate_per_s: 5.0,
            turns: Constant(4.0), think_ms: Constant(500.0), history: true),
        prompt_tokens: LogNormal(median: 100.0, sigma: 0.8),
        output_tokens: LogNormal(median: 10.0, sigma: 0.8)),
    cluster: (replicas: 5, profile: Named("llama-3.1-8b-h100"),
        scheduler: Continuous(kv_blocks: Some(64), window: {window}, max_num_batched_tokens: Some(512)),
        topology: Some((
            stages: [(name: "router", role: Router), (name: "prefill", role: Prefill, replicas: 3),
                (name: "decode", role: Decode, replicas: 2), (name: "playback", role: Playback)],
            links: [(from: "router", to: "prefill"),
                (from: "prefill", to: "decode", latency_ms: 0.5, bandwidth_gbps: 25.0, loss: 0.05),
                (from: "decode", to: "playback")],
            handoff: (prefill_reclaim: Never),
        ))),
    limits: (max_time_s: 600.0))"#
    )
}

#[test]
fn item_3_a_stall_is_a_stall_at_every_window() {
    // At W = 2 a request that could never grow (its pool pinned for good) preempted a newer one
    // that the other window slot had just admitted again, for ever: the replica stepped on, 300
    // events a virtual second, until `max_time_s`. Now a victim whose blocks cannot make the
    // room is not preempted, the other work finishes, and the run stops as stalled.
    // Whether a seed's lost notices pin enough blocks depends on the schedule, so each window
    // runs eight seeds: every run ends finished or stalled, never at a limit, and each of W = 1
    // and 2 stalls on some seed.
    for w in 1..=4 {
        let s = scenario(&pinned_for_good(w));
        let mut stalled = 0;
        for seed in 1..=8 {
            match run::report(&s, seed) {
                Err(RunError::Stalled(why)) => {
                    assert!(why.contains("reclaim `Never`"), "{why}");
                    stalled += 1;
                }
                Err(e) => panic!("W = {w}, seed {seed}: {e}"),
                Ok(_) => {}
            }
        }
        assert!(w > 2 || stalled > 0, "W = {w}: no seed stalled");
    }
}

/// `one_p_one_d` with no loss; every request cancelled 1 ms after the decode stage took it, so
/// its abort reaches the decode stage while the KV is on the wire. The leases are shorter than
/// the transfers.
fn short_leases(transfer_cancel: &str) -> String {
    one_p_one_d(
        "source: Poisson(rate_per_s: 5.0, requests: 40), \
         prompt_tokens: Constant(1024.0), output_tokens: Constant(16.0)",
        "",
        &format!(
            "transfer_cancel: {transfer_cancel}, \
             prefill_reclaim: Lease(lease_ms: 5.0, grace_ms: 0.0), \
             decode_reclaim: Lease(lease_ms: 0.0, grace_ms: 0.0)"
        ),
        "cancellation: (fraction: 0.5, stage: AwaitingRemoteKv, delay_ms: Constant(1.0)), \
         policies: [PerRequest], adapter: (rpc_latency_ms: Constant(0.5))",
    )
}

#[test]
fn item_4_no_lease_frees_blocks_under_a_live_transfer() {
    // The 5 ms prefill lease used to run out under every 43 ms transfer (the KV given back while
    // being read), and the 0 ms decode lease freed an aborted request's receive blocks while the
    // transfer still wrote into them. A lease now runs from the transfer's end.
    let r = report(&short_leases("AtTransferEnd"));
    for p in std::iter::once(&r.counterfactual).chain(&r.policies) {
        let h = p.handoff.unwrap();
        assert_eq!(h.transfers_started, 40, "{}: {h:?}", p.policy);
        assert_eq!(h.prefill.returned_lease, 0, "{}: {h:?}", p.policy);
        assert_eq!(h.prefill.returned_completed, 40, "{}: {h:?}", p.policy);
    }
    let h = r.policies[0].handoff.unwrap();
    assert!(h.aborted_awaiting_kv > 5, "{h:?}");
    assert_eq!(h.decode.returned_lease, h.aborted_awaiting_kv, "{h:?}");
    // Each aborted request's 64 receive blocks stay until its transfer ends: at least the 42 ms
    // of wire time left after the abort (43 ms, less the 0.5 ms gap and the 1.5 ms to abort).
    let floor_s = h.aborted_awaiting_kv as f64 * 64.0 * 0.040;
    assert!(
        h.decode.retained_block_s >= floor_s,
        "receive blocks held {} block-s, at least {floor_s} while written",
        h.decode.retained_block_s
    );
}

#[test]
fn item_4_a_lease_that_ran_out_before_the_transfer_leaves_the_decode_side_to_compute() {
    // A lease of 0 on the prefill side gives the KV back in the gap, before any transfer could
    // read it: the decode side computes the prompt itself, and nothing reads freed blocks.
    let text = short_leases("AtTransferEnd").replace("lease_ms: 5.0", "lease_ms: 0.0");
    let r = report(&text);
    let h = r.counterfactual.handoff.unwrap();
    assert_eq!(h.transfers_started, 0, "{h:?}");
    assert_eq!(h.kv_released_before_transfer, 40, "{h:?}");
    assert_eq!(h.prefill.returned_lease, 40, "{h:?}");
    assert_eq!(r.counterfactual.requests.completed, 40);
}

#[test]
fn item_5_an_aborted_transfer_that_runs_to_its_end_notifies_the_prefill_side() {
    // Under `AtTransferEnd` the decode side's read completes, and its completion notice frees
    // the prefill side's blocks (vLLM's NIXL READ notifies the prefill agent). It used to leave
    // them to the lease: 30 s for every aborted request. A connector with no such notice is
    // named as such, and keeps the old behaviour.
    let cancel =
        "cancellation: (fraction: 0.5, stage: AwaitingRemoteKv, delay_ms: Constant(1.0)), \
                  policies: [PerRequest], adapter: (rpc_latency_ms: Constant(0.5))";
    let lossless = |t: &str| pd_burst(t, cancel).replace("loss: 0.01", "loss: 0.0");
    let r = report(&lossless(", transfer_cancel: AtTransferEnd"));
    let h = r.policies[0].handoff.unwrap();
    assert!(h.transfers_cancelled > 20, "{h:?}");
    // Only those aborted before their transfer began wait for the lease (nothing was read).
    let before_the_wire = h.aborted_awaiting_kv - h.transfers_cancelled;
    assert_eq!(h.prefill.returned_lease, before_the_wire, "{h:?}");
    let r = report(&lossless(", transfer_cancel: AtTransferEndNoNotice"));
    let h = r.policies[0].handoff.unwrap();
    assert!(h.prefill.returned_lease >= h.aborted_awaiting_kv, "{h:?}");
}

#[test]
fn item_5_a_wedge_needs_a_transfer_stopped_on_the_wire() {
    // Nothing is cancelled on the wire under `AtTransferEnd`, so nothing can wedge its sender.
    for t in ["AtTransferEnd", "AtTransferEndNoNotice"] {
        let text = pd_burst(
            &format!(", transfer_cancel: {t}, wedge_probability: 0.5"),
            "",
        );
        let e = Scenario::parse(&text, "w.ron").unwrap_err().to_string();
        assert!(
            e.contains("cluster.topology.handoff.wedge_probability")
                && e.contains("transfer_cancel: AtOnce"),
            "{e}"
        );
        assert!(e.starts_with("w.ron:"), "names the line: {e}");
    }
    let text = pd_burst(", transfer_cancel: AtOnce, wedge_probability: 0.5", "");
    assert!(Scenario::parse(&text, "w.ron").is_ok());
}

#[test]
fn item_2_a_rejected_target_is_not_a_cancelled_one() {
    // Five targets whose prompts the pool can never hold: rejected at arrival, never cancelled.
    // `targets: Cancelled` used to pass with nothing cancelled.
    let text = r#"Scenario(name: "rejected-targets", seed: 1,
    workload: (source: Poisson(rate_per_s: 10.0, requests: 5),
        prompt_tokens: Constant(4000.0), output_tokens: Constant(8.0)),
    cluster: (profile: Custom(c0_ms: 10.0, kv_blocks_16: 100), scheduler: Continuous()),
    cancellation: (fraction: 1.0, stage: Decode), policies: [PerRequest],
    expect: [(policy: "per_request", targets: Cancelled)])"#;
    let s = scenario(text);
    let r = run::report(&s, s.seed).unwrap();
    let p = &r.policies[0];
    assert_eq!((p.requests.rejected, p.requests.cancelled), (5, 0));
    assert_eq!(
        (p.targets.rejected, p.targets.cancelled),
        (5, 0),
        "{:?}",
        p.targets
    );
    let fails = cancelsim::check::judge(&s, &r, true);
    assert!(
        fails
            .iter()
            .any(|f| f.contains("expected every target cancelled, got 0 of 5")),
        "{fails:?}"
    );
    let rejected = text.replace("targets: Cancelled", "targets: Rejected");
    let s = scenario(&rejected);
    assert!(cancelsim::check::judge(&s, &r, true).is_empty());
    // On a prefill/decode graph: the prompt fits the prefill pool (1,590 tokens and one), but not
    // the decode pool with its output (1,690 tokens in 1,600).
    let pd = pd_burst(
        "",
        "cancellation: (fraction: 1.0, stage: Decode), policies: [PerRequest]",
    )
    .replace("requests: 400", "requests: 5")
    .replace("Constant(1024.0)", "Constant(1590.0)")
    .replace("Constant(128.0)", "Constant(100.0)")
    .replace("kv_blocks: Some(3000)", "kv_blocks: Some(100)");
    let p = &report(&pd).policies[0];
    assert_eq!(
        (p.targets.rejected, p.targets.cancelled),
        (5, 0),
        "{:?}",
        p.targets
    );
}

/// 100 requests on one flat 10 ms step, 20 % cancelled mid-decode, with the given adapter and
/// policies.
fn timers(adapter: &str, policies: &str) -> String {
    format!(
        r#"Scenario(name: "timers", seed: 1,
    workload: (source: Poisson(rate_per_s: 20.0, requests: 100),
        prompt_tokens: Constant(32.0), output_tokens: Constant(20.0)),
    cluster: (profile: Custom(c0_ms: 10.0, kv_blocks_16: 1000), scheduler: Continuous()),
    cancellation: (fraction: 0.2, stage: Decode),
    policies: {policies}, adapter: {adapter})"#
    )
}

#[test]
fn item_8_a_timer_that_can_change_nothing_keeps_no_run_alive() {
    // Every attempt is acknowledged within a millisecond, so a 1e9 ms timeout (11.6 days) or
    // fallback bound can change nothing; they used to run every run to `limits.max_time_s`.
    let r = report(&timers(
        "(timeout_ms: 1e9)",
        "[PerRequest, PerRequestWithFallback(fallback_after_ms: 1e9)]",
    ));
    for p in &r.policies {
        assert!(p.requests.cancelled > 5, "{}", p.policy);
        assert_eq!(p.cancel_rpc.acks, p.requests.cancelled, "{}", p.policy);
        assert!(
            p.virtual_time_s < 60.0,
            "{}: ran {} s",
            p.policy,
            p.virtual_time_s
        );
    }
    // An attempt still awaited keeps the run going through its timeouts: every attempt lost,
    // each target's cancel runs out of its three attempts, 3 x 2 s after its intent.
    let r = report(&timers(
        "(loss: 1.0, timeout_ms: 2000.0, max_attempts: 3)",
        "[PerRequest]",
    ));
    let p = &r.policies[0];
    assert_eq!(
        p.cancel_rpc.budget_exhausted, p.requests.cancelled,
        "{:?}",
        p.cancel_rpc
    );
    assert_eq!(p.cancel_rpc.attempts, 3 * p.requests.cancelled);
    assert!(p.virtual_time_s > 6.0, "ran {} s", p.virtual_time_s);
}

#[test]
fn a_stage_with_too_many_replicas_is_named_by_its_stage() {
    // 1,025 prefill replicas used to be reported as `cluster.replicas ... (got 1026)`.
    let text = pd_burst("", "")
        .replace(
            "(name: \"prefill\", role: Prefill)",
            "(name: \"prefill\", role: Prefill, replicas: 1025)",
        )
        .replace("replicas: 2,", "replicas: 1026,");
    let e = Scenario::parse(&text, "r.ron").unwrap_err().to_string();
    assert!(
        e.contains("cluster.topology.stages[1].replicas") && e.contains("1025"),
        "{e}"
    );
    // Each stage within its bound, but more than 1,024 in all.
    let text = pd_burst("", "")
        .replace(
            "(name: \"prefill\", role: Prefill)",
            "(name: \"prefill\", role: Prefill, replicas: 600)",
        )
        .replace(
            "(name: \"decode\", role: Decode)",
            "(name: \"decode\", role: Decode, replicas: 600)",
        )
        .replace("replicas: 2,", "replicas: 1200,");
    let e = Scenario::parse(&text, "r.ron").unwrap_err().to_string();
    assert!(
        e.contains("cluster.topology.stages") && e.contains("1200"),
        "{e}"
    );
}

#[test]
fn a_fraction_in_an_explicit_some_is_named_like_the_implicit_form() {
    // `Some(37.5)` got "Expected closing `)`"; the implicit `37.5` already got the good line.
    let base = r#"Scenario(name: "f", workload: (source: Poisson(rate_per_s: 1.0, requests: 1)),
    cluster: (profile: Named("llama-3.1-8b-h100"), ROOF scheduler: Continuous()))"#;
    for form in [
        "roofline: Some((mfu_attn_pct: Some(37.5))),",
        "roofline: (mfu_attn_pct: 37.5),",
    ] {
        let e = Scenario::parse(&base.replace("ROOF", form), "f.ron")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("f.ron:2:")
                && e.contains("mfu_attn_pct` must be a whole number (got 37.5)"),
            "{form}: {e}"
        );
    }
}

#[test]
fn a_mooncake_row_whose_block_ids_disagree_with_its_length_is_refused_at_its_line() {
    // 9 block ids for a 100-token prompt (one 512-token block) used to be taken silently.
    let dir = crate::scratch::Scratch::new("adversarial", "mooncake-ids", true);
    let rows = "{\"timestamp\": 0, \"input_length\": 600, \"output_length\": 5, \"hash_ids\": [1, 2]}\n\
                {\"timestamp\": 10, \"input_length\": 100, \"output_length\": 5, \"hash_ids\": [1, 2, 3, 4, 5, 6, 7, 8, 9]}\n";
    std::fs::write(dir.join("t.jsonl"), rows).unwrap();
    let s = r#"Scenario(name: "m", workload: (source: Trace(path: "t.jsonl", format: MooncakeJsonl)),
        cluster: (profile: Named("llama-3.1-8b-h100"), scheduler: Continuous()))"#;
    std::fs::write(dir.join("s.ron"), s).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_cancelsim"))
        .args(["run", "s.ron", "--no-write"])
        .current_dir(&*dir)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("t.jsonl:2")
            && err.contains("hash_ids has 9 block ids")
            && err.contains("needs 1 (one per 512 tokens)"),
        "{err}"
    );
}

#[test]
fn compare_names_what_a_path_is_when_it_cannot_compare_it() {
    let dir = crate::scratch::Scratch::new("adversarial", "compare-kinds", true);
    let compare = |a: &str, b: &str| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_cancelsim"))
            .args(["compare", a, b])
            .current_dir(&*dir)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    std::fs::create_dir_all(dir.join("empty")).unwrap();
    std::fs::create_dir_all(dir.join("run")).unwrap();
    std::fs::create_dir_all(dir.join("sweep")).unwrap();
    // A plain directory used to get "Is a directory (os error 21)", with no path.
    let (code, err) = compare("empty", "empty");
    assert_eq!(code, Some(2));
    assert!(
        err.contains("empty: neither a sweep") && err.contains("summary.json"),
        "{err}"
    );
    // A sweep beside a run directory used to be refused with a message about seeds.
    std::fs::write(
        dir.join("sweep/results.csv"),
        "run_policy,seed,leaked_gpu_s\nper_request,1,0.5\n",
    )
    .unwrap();
    std::fs::write(dir.join("run/summary.json"), "{}").unwrap();
    let (code, err) = compare("sweep", "run");
    assert_eq!(code, Some(2));
    assert!(
        err.contains("sweep is a sweep and run is a run directory"),
        "{err}"
    );
}

#[test]
fn item_6_requests_in_the_system_are_bounded_by_a_named_limit() {
    // The full-size flood (1e8 requests at 1e9 req/s, stopped at 2^20 under 1 GB) is the
    // `backlog` test; here the same limit, small.
    let text = r#"Scenario(name: "flood", seed: 1, limits: (max_in_system: 100),
    workload: (source: Poisson(rate_per_s: 1e9, requests: 1000)),
    cluster: (profile: Named("llama-3.1-8b-h100"), scheduler: Continuous()))"#;
    let s = scenario(text);
    match run::report(&s, 1) {
        Err(RunError::Limit(e)) => {
            let m = e.to_string();
            assert!(m.contains("limits.max_in_system = 100 requests"), "{m}");
        }
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("1,000 requests at once fit a limit of 100"),
    }
    // Within it, the same run finishes (the field, unstated, leaves the scenario hash alone).
    let roomy = scenario(&text.replace("max_in_system: 100", "max_in_system: 1000"));
    assert!(run::report(&roomy, 1).is_ok());
    let unstated = scenario(&text.replace("limits: (max_in_system: 100),", ""));
    assert!(!ron::to_string(&unstated).unwrap().contains("max_in_system"));
    let e = Scenario::parse(&text.replace(": 100)", ": 0)"), "l.ron")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("limits.max_in_system") && e.contains("got 0"),
        "{e}"
    );
}

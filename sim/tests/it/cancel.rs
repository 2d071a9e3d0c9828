//! The cancellation path against closed forms and the contract's test protocol.
//!
//! Every test builds an exact cohort: a tiny trace puts every request at t = 0 with chosen
//! lengths, and a flat 10 ms step makes each step's GPU time split evenly among its tokens, so
//! leaked work has a closed form.

use std::path::PathBuf;

use cancelsim::metrics::Summary;
use cancelsim::run::{self, Report};
use cancelsim::scenario::Scenario;

/// A trace of requests all arriving at t = 0: `(prompt, output)` each.
fn cohort(name: &str, requests: &[(u32, u32)]) -> PathBuf {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let pid = std::process::id();
    let path = std::env::temp_dir().join(format!("cancelsim-cancel-{pid}-{name}-{n}.csv"));
    let mut text = String::from("TIMESTAMP,ContextTokens,GeneratedTokens\n");
    for (p, o) in requests {
        text += &format!("2024-01-01 00:00:00.0,{p},{o}\n");
    }
    std::fs::write(&path, text).unwrap();
    path
}

struct Setup<'a> {
    name: &'a str,
    requests: &'a [(u32, u32)],
    policies: &'a str,
    cancellation: &'a str,
    window: u32,
    max_num_seqs: u32,
    adapter: &'a str,
    backend: &'a str,
    playback: &'a str,
}

impl Default for Setup<'_> {
    fn default() -> Self {
        Setup {
            name: "c",
            requests: &[(1, 50), (1, 60), (1, 60), (1, 60)],
            policies: "[PerRequest]",
            cancellation: "requests: [0], stage: Decode, delay_ms: Constant(25.0)",
            window: 1,
            max_num_seqs: 64,
            adapter: "rpc_latency_ms: Constant(0.0)",
            backend: "",
            playback: "chunk_tokens: 1",
        }
    }
}

fn run(s: Setup) -> Report {
    let trace = cohort(s.name, s.requests);
    let text = format!(
        "Scenario(name: \"{}\", workload: (source: Trace(path: {:?}, format: AzureCsv)), \
         cluster: (profile: Custom(c0_ms: 10.0, kv_blocks_16: 10000), \
         scheduler: Continuous(window: {}, max_num_seqs: {})), \
         cancellation: ({}), policies: {}, adapter: ({}), backend: ({}), playback: ({}))",
        s.name,
        trace.display().to_string(),
        s.window,
        s.max_num_seqs,
        s.cancellation,
        s.policies,
        s.adapter,
        s.backend,
        s.playback
    );
    let scenario = Scenario::parse(&text, "<test>").unwrap();
    let report = run::report(&scenario, 1).unwrap();
    // What every run must show, whatever the policy.
    for p in std::iter::once(&report.counterfactual).chain(&report.policies) {
        assert_eq!(
            p.late_outputs_admitted, 0,
            "{}: a late output reached a consumer",
            p.policy
        );
        assert_eq!(p.playback.routing_violations, 0, "{}", p.policy);
        let r = &p.requests;
        assert_eq!(
            r.completed + r.cancelled + r.expired + r.rejected,
            r.scheduled,
            "{}",
            p.policy
        );
    }
    let again = run::report(&scenario, 1).unwrap();
    std::fs::remove_file(&trace).unwrap();
    assert_eq!(
        report.run_hash, again.run_hash,
        "same scenario and seed, same hash"
    );
    report
}

fn policy<'r>(r: &'r Report, label: &str) -> &'r Summary {
    r.policies
        .iter()
        .find(|p| p.policy == label)
        .unwrap_or_else(|| panic!("no policy {label}"))
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

// One step is 10 ms shared by 4 tokens: 2.5 ms of GPU per token. The target (request 0, 50
// tokens) gets its first token at 10 ms; its intent is 25 ms later, at 35 ms, inside step 4
// (30..40 ms).
const SHARE_S: f64 = 0.0025;

#[test]
fn finish_and_discard_leaks_the_remaining_tokens_times_their_step_share() {
    let r = run(Setup {
        policies: "[FinishAndDiscard]",
        ..Setup::default()
    });
    let fd = policy(&r, "finish_and_discard");
    // Half of step 4 after the intent, then tokens 5..50 whole: 46 more steps.
    let expect = 0.5 * SHARE_S + 46.0 * SHARE_S;
    assert!(
        close(fd.leaked_work.gpu_s, expect),
        "leaked {} s, closed form {expect} s",
        fd.leaked_work.gpu_s
    );
    assert!(close(fd.leaked_work.by_cause.finish_and_discard, expect));
    assert_eq!(fd.leaked_work.token_steps, 47, "tokens 4..50");
    assert_eq!(
        fd.late_output_discards, 47,
        "every token after the intent is discarded"
    );
    assert_eq!(fd.requests.cancelled, 1);
    assert_eq!(
        fd.requests.never_observed, 1,
        "no backend cancel: nobody saw it stop"
    );
    assert_eq!(
        fd.requests.cleanup_pending, 0,
        "its blocks were released when it finished, with evidence"
    );
    assert_eq!(fd.sibling_survival.survived, 3);
    assert_eq!(fd.sibling_survival.siblings, 3);
}

#[test]
fn per_request_w1_every_step_leaks_less_than_one_step_share_plus_the_observation_delay() {
    let r = run(Setup::default());
    let p = policy(&r, "per_request");
    // The abort lands at 35 ms and is observed at the step boundary, 40 ms: half a share.
    assert!(
        close(p.leaked_work.gpu_s, 0.5 * SHARE_S),
        "leaked {}",
        p.leaked_work.gpu_s
    );
    assert!(p.leaked_work.gpu_s < SHARE_S + 0.005 * (SHARE_S / 0.010));
    assert!(close(
        p.leaked_work.by_cause.checkpoint_delay,
        0.5 * SHARE_S
    ));
    assert_eq!(p.leaked_work.by_cause.in_flight_window, 0.0);
    assert_eq!(p.late_output_discards, 1, "step 4's token");
    let obs = &p.cleanup_latency_ms["backend_observation"];
    assert_eq!((obs.count, obs.unknown), (1, 0));
    // Quantiles are exact (every value is kept up to `EXACT_MAX`).
    assert_eq!(obs.max, 5.0, "observed 5 ms after the intent");
    assert_eq!(p.requests.cleanup_pending, 0);
    assert_eq!(p.sibling_survival.rate, 1.0);
    // Siblings finish their 60 tokens sooner without the target in their steps? No: with a flat
    // step cost they take exactly as long.
    assert_eq!(p.sibling_latency_delta_ms.e2e_p99, 0.0);
}

#[test]
fn per_request_w2_leaks_at_most_two_step_shares() {
    let r = run(Setup {
        window: 2,
        ..Setup::default()
    });
    let p = policy(&r, "per_request");
    // Step 5 (40..50 ms) was dispatched at 30 ms with the target in it: one more share, in the
    // in-flight window.
    assert!(
        close(p.leaked_work.gpu_s, 1.5 * SHARE_S),
        "leaked {}",
        p.leaked_work.gpu_s
    );
    assert!(p.leaked_work.gpu_s <= 2.0 * SHARE_S);
    assert!(close(p.leaked_work.by_cause.in_flight_window, SHARE_S));
    assert!(close(
        p.leaked_work.by_cause.checkpoint_delay,
        0.5 * SHARE_S
    ));
    // Its blocks come back only when that step ends (fenced): 15 ms after the intent.
    assert!((p.cleanup_latency_ms["resource_release"].max - 15.0).abs() < 0.02);
    assert_eq!(p.sibling_survival.rate, 1.0);
}

#[test]
fn group_abort_kills_exactly_the_handle_group() {
    // Two shared streams: requests 0 and 2 on stream 0, 1 and 3 on stream 1.
    let r = run(Setup {
        policies: "[GroupAbort(Stream), PerRequest]",
        adapter: "rpc_latency_ms: Constant(0.0), streams: 2",
        ..Setup::default()
    });
    let ga = policy(&r, "group_abort_stream");
    assert_eq!(
        ga.requests.cancelled, 2,
        "the target and its stream sibling"
    );
    assert_eq!(ga.requests.completed, 2, "nobody outside the stream");
    assert_eq!(ga.cancel_rpc.collateral_kills, 1);
    assert_eq!(
        (ga.sibling_survival.survived, ga.sibling_survival.siblings),
        (2, 3)
    );
    let pr = policy(&r, "per_request");
    assert_eq!(
        (pr.sibling_survival.survived, pr.sibling_survival.siblings),
        (3, 3)
    );
}

#[test]
fn a_zero_cancel_rate_gives_the_counterfactual_run_hash() {
    let r = run(Setup {
        cancellation: "fraction: 0.0",
        policies: "[FinishAndDiscard, PerRequest, GroupAbort(Engine), PerRequestWithFallback(fallback_after_ms: 5.0)]",
        ..Setup::default()
    });
    for p in &r.policies {
        assert_eq!(p.run_hash, r.counterfactual.run_hash, "{}", p.policy);
    }
}

/// The contract's protocol: a target cancelled at each lifecycle stage, with the expected
/// disposition for the target and for every sibling. The target is request 3; three siblings share
/// its steps. `max_num_seqs` = 3 keeps the target queued until a sibling leaves.
#[test]
fn target_cancelled_at_each_lifecycle_stage() {
    // (stage, expected target disposition, target ever on a GPU)
    let cases = [
        ("BeforeAdmission", "cancelled", false),
        ("Queued", "cancelled", false),
        ("Prefill", "cancelled", true),
        ("Decode", "cancelled", true),
        ("AfterFinalOutput", "cancelled", true),
        ("AfterCompletion", "completed", true),
    ];
    for (stage, target, on_gpu) in cases {
        let cancellation = format!("requests: [3], stage: {stage}");
        let r = run(Setup {
            name: stage,
            requests: &[(1, 20), (1, 20), (1, 20), (100, 10)],
            policies: "[PerRequest]",
            cancellation: &cancellation,
            max_num_seqs: 3,
            adapter: "rpc_latency_ms: Constant(1.0)",
            // A writer wait keeps the final chunk held when the final-output cancel lands.
            playback: "chunk_tokens: 1, writer_wait_ms: Constant(2.0)",
            ..Setup::default()
        });
        let p = &r.policies[0];
        let cf = &r.counterfactual;
        assert_eq!(
            cf.requests.completed, 4,
            "{stage}: the counterfactual completes everyone"
        );
        let (completed, cancelled) = if target == "completed" {
            (4, 0)
        } else {
            (3, 1)
        };
        assert_eq!(
            p.requests.completed, completed,
            "{stage}: every sibling completes"
        );
        assert_eq!(
            p.requests.cancelled, cancelled,
            "{stage}: the target is {target}"
        );
        assert_eq!(
            p.requests.started,
            if on_gpu { 4 } else { 3 },
            "{stage}: target on a GPU"
        );
        if !on_gpu {
            assert_eq!(
                p.leaked_work.token_steps, 0,
                "{stage}: no GPU work for the target"
            );
        }
        assert_eq!(
            p.sibling_survival.survived, p.sibling_survival.siblings,
            "{stage}: siblings survive"
        );
        assert_eq!(p.requests.cleanup_pending, 0, "{stage}");
        assert_eq!(p.late_outputs_admitted, 0, "{stage}");
    }
}

#[test]
fn completion_and_cancel_race_first_terminal_transition_wins() {
    // The cancel lands while the final chunk waits for admission: cancelled, the chunk is
    // suppressed. Landing after the chunk was played: completed stays completed.
    let held = run(Setup {
        cancellation: "requests: [0], stage: AfterFinalOutput, delay_ms: Constant(1.0)",
        playback: "chunk_tokens: 1, writer_wait_ms: Constant(2.0)",
        ..Setup::default()
    });
    let p = &held.policies[0];
    assert_eq!(p.requests.cancelled, 1);
    assert!(p.playback.suppressed >= 1);
    let played = run(Setup {
        cancellation: "requests: [0], stage: AfterFinalOutput, delay_ms: Constant(3.0)",
        playback: "chunk_tokens: 1, writer_wait_ms: Constant(2.0)",
        ..Setup::default()
    });
    let p = &played.policies[0];
    assert_eq!(p.requests.cancelled, 0);
    assert_eq!(p.requests.completed, 4);
    // The local invalidation never happened because it was already complete: not applicable,
    // neither unknown (missing evidence) nor zero.
    let level = &p.cleanup_latency_ms["local_invalidation"];
    assert_eq!(
        (level.unknown, level.not_applicable, level.count),
        (0, 1, 0)
    );
}

#[test]
fn a_lost_cancel_is_never_observed_never_cancelled_at_zero() {
    let r = run(Setup {
        adapter: "rpc_latency_ms: Constant(0.0), loss: 1.0, max_attempts: 3, timeout_ms: 5.0",
        ..Setup::default()
    });
    let p = &r.policies[0];
    assert_eq!(p.cancel_rpc.attempts, 3);
    assert_eq!(p.cancel_rpc.lost, 3);
    assert_eq!(p.cancel_rpc.budget_exhausted, 1);
    assert_eq!(p.requests.never_observed, 1);
    assert_eq!(
        p.requests.cleanup_pending, 0,
        "released at its end, with evidence"
    );
    let obs = &p.cleanup_latency_ms["backend_observation"];
    assert_eq!((obs.count, obs.unknown), (0, 1), "unknown, never 0 ms");
    // The work ran to completion: the same leak as finish-and-discard, under the lost cause.
    let fd = 0.5 * SHARE_S + 46.0 * SHARE_S;
    assert!(
        close(p.leaked_work.by_cause.unobserved_or_lost, fd),
        "{}",
        p.leaked_work.by_cause.unobserved_or_lost
    );
}

#[test]
fn retries_are_bounded_and_late_acks_never_reopen() {
    // The backend observes only every 10th boundary, so the ack comes after 3 attempts 2 ms
    // apart: it is late evidence.
    let r = run(Setup {
        adapter: "rpc_latency_ms: Constant(0.0), max_attempts: 3, timeout_ms: 2.0",
        backend: "checkpoint: EveryKSteps(10)",
        ..Setup::default()
    });
    let p = &r.policies[0];
    assert_eq!(p.cancel_rpc.attempts, 3);
    assert_eq!(p.cancel_rpc.budget_exhausted, 1);
    assert_eq!(p.cancel_rpc.late_callbacks, 1);
    assert_eq!(p.requests.cancelled, 1);
    assert_eq!(
        p.cleanup_latency_ms["final_callback"].unknown, 1,
        "a late ack is not a final callback"
    );
}

/// W = 2 and one slot: the target (40 + 100 tokens) is cancelled 15 ms into its decode while a
/// sibling (40 + 10) waits, under `release` (Fenced or Immediate).
fn one_slot_w2_decode_cancel(release: &str) -> Report {
    let backend = format!("release: {release}");
    run(Setup {
        name: release,
        requests: &[(40, 100), (40, 10)],
        cancellation: "requests: [0], stage: Decode, delay_ms: Constant(15.0)",
        window: 2,
        max_num_seqs: 1,
        backend: &backend,
        ..Setup::default()
    })
}

#[test]
fn unsafe_release_corrupts_a_sibling_and_fenced_release_does_not() {
    // W = 2, one slot: the target's blocks go back while its next step is in flight, and the
    // waiting sibling takes them.
    for (release, survived) in [("Immediate", 0), ("Fenced", 1)] {
        let r = one_slot_w2_decode_cancel(release);
        let p = &r.policies[0];
        assert_eq!(p.playback.corrupted_requests, 1 - survived, "{release}");
        assert_eq!(p.sibling_survival.survived, survived, "{release}");
        assert_eq!(p.sibling_survival.siblings, 1, "{release}");
    }
}

#[test]
fn an_abort_path_fault_has_a_blast_radius_and_finish_and_discard_never_touches_it() {
    let r = run(Setup {
        policies: "[PerRequest, FinishAndDiscard]",
        backend: "abort_fault_probability: 1.0, abort_fault_radius: Batch",
        ..Setup::default()
    });
    let pr = policy(&r, "per_request");
    assert_eq!(pr.cancel_rpc.faults, 1);
    assert_eq!(pr.sibling_survival.survived, 0, "the whole batch fails");
    assert_eq!(pr.requests.cancelled, 4);
    let fd = policy(&r, "finish_and_discard");
    assert_eq!(fd.sibling_survival.survived, 3);
}

#[test]
fn a_fallback_policy_never_touches_a_backend_that_cannot_observe() {
    let r = run(Setup {
        policies: "[PerRequest, PerRequestWithFallback(fallback_after_ms: 50.0)]",
        backend: "checkpoint: Never, abort_fault_probability: 1.0, abort_fault_radius: Engine",
        ..Setup::default()
    });
    // Per-request: the backend never checks the flag, so nothing faults, but the target runs on.
    let pr = policy(&r, "per_request");
    assert_eq!(pr.requests.never_observed, 1);
    let fb = policy(&r, "per_request_fallback");
    assert_eq!(
        fb.cancel_rpc.attempts, 0,
        "no abort sent to a backend that cannot observe"
    );
    assert_eq!(fb.cancel_rpc.fallbacks, 1);
    assert!(fb.leaked_work.by_cause.finish_and_discard > 0.0);
    assert_eq!(fb.sibling_survival.rate, 1.0);
}

#[test]
fn cancel_after_completion_is_ignored_or_faults_by_runtime() {
    // Request 0 has 50 tokens; the siblings run on to 60. A cancel after its completion reaches
    // a runtime that no longer has it.
    let base = "requests: [0], stage: AfterCompletion, delay_ms: Constant(1.0)";
    let ignore = run(Setup {
        cancellation: base,
        ..Setup::default()
    });
    let p = &ignore.policies[0];
    assert_eq!(
        p.requests.completed, 4,
        "the runtime tombstoned the id and ignored it"
    );
    // The same runtime faulting on an unknown abort: its generated ids are tombstoned, so the
    // late cancel is still known and ignored. (The counterfactual sends no abort by id, so it
    // keeps no tombstones; a policy run must.)
    let tombstoned = run(Setup {
        cancellation: base,
        backend: "cancel_after_completion: Fault(Engine)",
        ..Setup::default()
    });
    let p = &tombstoned.policies[0];
    assert_eq!(p.cancel_rpc.faults, 0, "a tombstoned id is not unknown");
    assert_eq!(p.requests.completed, 4);
    let fault = run(Setup {
        cancellation: base,
        adapter: "rpc_latency_ms: Constant(0.0), identity: ClientReused(pool: 1000)",
        backend: "cancel_after_completion: Fault(Engine)",
        ..Setup::default()
    });
    let p = &fault.policies[0];
    // Nobody acknowledges an abort for an id the runtime does not have: the adapter retries.
    // The first attempt is an unknown abort that faults and takes the engine down; the retries
    // carry the same idempotency key, so the runtime ignores them as duplicates.
    assert_eq!(p.cancel_rpc.attempts, 3);
    assert_eq!(p.cancel_rpc.unknown_aborts, 1);
    assert_eq!(p.cancel_rpc.faults, 1);
    assert_eq!(p.requests.completed, 1, "only the target had finished");
    assert_eq!(
        p.requests.cancelled, 3,
        "the engine fault took every sibling"
    );
}

#[test]
fn immediate_release_charges_the_in_flight_step_to_the_target_not_to_the_next_tag() {
    // Defect 5 of the correctness issue: with an immediate release the target left at its early
    // release and its tag went to the next request while a step that held it was in flight, so
    // the step's share vanished from the target's leak and went to a request that never ran
    // (and per-request token-steps summed to one less than the run's, which the end-of-run
    // conservation check now refuses). A tag is never reused while a step holds it: the target's
    // leak is the same under both release modes.
    let leak = |release: &str| {
        one_slot_w2_decode_cancel(release).policies[0]
            .leaked_work
            .clone()
    };
    let (fenced, immediate) = (leak("Fenced"), leak("Immediate"));
    assert!(fenced.gpu_s > 0.0);
    assert_eq!(immediate.token_steps, fenced.token_steps);
    assert!(
        (immediate.gpu_s - fenced.gpu_s).abs() < 1e-12,
        "immediate {} vs fenced {}",
        immediate.gpu_s,
        fenced.gpu_s
    );
}

#[test]
fn every_token_a_cancelled_request_samples_after_its_intent_is_a_late_discard() {
    // Defect 8 of the correctness issue: at W = 2 the step in flight when the backend observed
    // the cancel samples one more token for the target; the replica throws it away, and it was
    // not counted as a late discard. Decoding one token per step, every leaked token-step is a
    // token produced after the terminal transition.
    for window in [1, 2, 3] {
        let r = run(Setup {
            name: "late",
            window,
            ..Setup::default()
        });
        let p = &r.policies[0];
        assert!(p.leaked_work.token_steps >= window as u64, "W = {window}");
        assert_eq!(
            p.late_output_discards, p.leaked_work.token_steps,
            "W = {window}: late discards against token-steps after the intent"
        );
    }
}

#[test]
fn a_duplicated_cancel_is_idempotent_even_on_a_runtime_that_faults_on_unknown_ids() {
    // Defect 6 of the correctness issue: with every attempt delivered twice, reused client ids
    // and a runtime that faults the engine on a cancel for an unknown id, the duplicate of a
    // mid-decode cancel killed every sibling.
    let r = run(Setup {
        adapter: "rpc_latency_ms: Uniform(low: 0.1, high: 30.0), duplicate: 1.0, \
                  identity: ClientReused(pool: 100)",
        backend: "cancel_after_completion: Fault(Engine)",
        ..Setup::default()
    });
    let p = &r.policies[0];
    assert_eq!(p.cancel_rpc.duplicates, p.cancel_rpc.attempts);
    assert_eq!(p.cancel_rpc.faults, 0);
    assert_eq!(p.sibling_survival.siblings, 3);
    assert_eq!(p.sibling_survival.survived, 3);
}

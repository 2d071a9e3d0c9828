//! The continuous engine and the dynamic batcher, driven alone (no kernel) by a tiny loop
//! (`driver.rs`), checked against hand-computed timelines and conservation laws.

use cancelsim_models::batcher::{Batcher, BatcherConfig};
use cancelsim_models::engine::Engine;
use cancelsim_models::protocol::{
    Abort, BlastRadius, Checkpoint, NewRequest, Rejection, ReleaseMode, Scheduler, Scope,
    UnknownAbort,
};

use crate::driver::{cfg, drive, drive_aborts, flat, req, MS};

#[test]
fn single_request_w1_takes_one_step_per_token() {
    let mut e = Engine::new(cfg(1));
    let t = drive(&mut e, &[(0, req(1, 20, 5))]);
    // Prefill step samples token 1; four decode steps follow. 10 ms each, back to back.
    assert_eq!(t[&1].tokens_ns, [10, 20, 30, 40, 50].map(|x| x * MS));
    assert_eq!(t[&1].discarded, 0);
    assert_eq!(t[&1].released_ns, Some(50 * MS));
    assert_eq!(e.kv().in_use(), 0);
    assert_eq!(e.kv().allocated_total(), e.kv().freed_total());
    assert_eq!(e.stats().steps, 5);
}

#[test]
fn window_2_overshoots_one_step_and_fences_the_release() {
    let mut e = Engine::new(cfg(2));
    let t = drive(&mut e, &[(0, req(1, 20, 5))]);
    // Same token times (the GPU runs steps back to back), but the step after the last token was
    // already dispatched with the request in it: one discarded token, and the blocks come back
    // only when that step ends.
    assert_eq!(t[&1].tokens_ns, [10, 20, 30, 40, 50].map(|x| x * MS));
    assert_eq!(t[&1].discarded, 1);
    assert_eq!(t[&1].released_ns, Some(60 * MS));
    assert_eq!(e.stats().steps, 6);
    assert_eq!(e.stats().tokens_discarded, 1);
    assert_eq!(e.kv().in_use(), 0);
}

#[test]
fn window_2_schedules_no_step_past_a_length_capped_end() {
    let mut e = Engine::new(cfg(2));
    let capped = NewRequest {
        length_capped: true,
        ..req(1, 20, 5)
    };
    let t = drive(&mut e, &[(0, capped)]);
    // The scheduler knows token 5 is the last: nothing overshoots, and the blocks come back when
    // the last token's step ends.
    assert_eq!(t[&1].tokens_ns, [10, 20, 30, 40, 50].map(|x| x * MS));
    assert_eq!(t[&1].discarded, 0);
    assert_eq!(t[&1].released_ns, Some(50 * MS));
    assert_eq!(e.stats().steps, 5);
    assert_eq!(e.kv().in_use(), 0);
}

#[test]
fn chunked_prefill_splits_the_prompt_by_the_token_budget() {
    let mut e = Engine::new(cfg(1));
    // Budget 64: a 150-token prompt takes chunks of 64, 64 and 22; token 1 comes with the third.
    let t = drive(&mut e, &[(0, req(1, 150, 2))]);
    assert_eq!(t[&1].tokens_ns, [30 * MS, 40 * MS]);
}

#[test]
fn max_num_seqs_bounds_the_running_set() {
    let mut c = cfg(1);
    c.max_num_seqs = 2;
    let mut e = Engine::new(c);
    let arrivals: Vec<_> = (0..3).map(|i| (0, req(i, 4, 3))).collect();
    let t = drive(&mut e, &arrivals);
    // Requests 0 and 1 share steps 1..3; request 2 waits until both finish, then takes 3 steps.
    assert_eq!(t[&0].tokens_ns, [10, 20, 30].map(|x| x * MS));
    assert_eq!(t[&1].tokens_ns, [10, 20, 30].map(|x| x * MS));
    assert_eq!(t[&2].tokens_ns, [40, 50, 60].map(|x| x * MS));
}

#[test]
fn kv_pressure_preempts_by_recompute_and_conserves_everything() {
    let mut c = cfg(1);
    // 6 blocks of 16 tokens: two requests of 16 prompt + 40 output cannot both finish resident.
    c.kv_blocks = 6;
    let mut e = Engine::new(c);
    let t = drive(&mut e, &[(0, req(1, 16, 40)), (0, req(2, 16, 40))]);
    assert!(e.stats().preemptions > 0, "no preemption under KV pressure");
    for id in [1, 2] {
        assert_eq!(
            t[&id].tokens_ns.len(),
            40,
            "every token delivered exactly once"
        );
        assert!(t[&id].released_ns.is_some());
    }
    assert_eq!(e.kv().in_use(), 0);
    assert_eq!(e.kv().allocated_total(), e.kv().freed_total());
    assert!(e.kv().in_use_max() <= 6);
    assert!(e.is_idle());
}

#[test]
fn preemption_never_takes_the_requester_itself_at_any_window() {
    // Two requests that cannot both fit 30 blocks of 16 tokens. At W >= 2 the requester's
    // blocks stay fenced while its step is in flight, so preempting itself freed nothing and
    // threw its work away, forever. The older one preempts the newer one; both finish, and the
    // discarded work stays small.
    for w in 1..=4 {
        let mut c = cfg(w);
        c.kv_blocks = 30;
        let mut e = Engine::new(c);
        let t = drive(&mut e, &[(0, req(1, 200, 100)), (0, req(2, 200, 100))]);
        for id in [1, 2] {
            assert_eq!(
                t[&id].tokens_ns.len(),
                100,
                "W = {w}: request {id} finished"
            );
        }
        assert!(e.stats().preemptions <= 4, "W = {w}: {:?}", e.stats());
        assert!(e.is_idle());
    }
}

#[test]
fn kv_pressure_with_window_2_conserves_blocks_and_tokens() {
    let mut c = cfg(2);
    c.kv_blocks = 9;
    let mut e = Engine::new(c);
    let arrivals: Vec<_> = (0..6)
        .map(|i| (i * 3 * MS, req(i, 10 + i as u32 * 7, 30 + i as u32)))
        .collect();
    let t = drive(&mut e, &arrivals);
    for (i, (_, r)) in arrivals.iter().enumerate() {
        assert_eq!(t[&(i as u64)].tokens_ns.len() as u32, r.output_tokens);
    }
    let s = e.stats();
    let discarded: u32 = t.values().map(|x| x.discarded).sum();
    // Tokens sampled = delivered + discarded (overshoot and preempted in-flight samples).
    assert_eq!(
        s.tokens_delivered,
        arrivals
            .iter()
            .map(|(_, r)| r.output_tokens as u64)
            .sum::<u64>()
    );
    assert!(discarded as u64 >= s.tokens_discarded);
    assert_eq!(e.kv().allocated_total(), e.kv().freed_total());
    assert!(e.is_idle());
}

#[test]
fn requests_that_can_never_fit_are_rejected() {
    let mut c = cfg(1);
    c.kv_blocks = 4;
    let mut e = Engine::new(c.clone());
    assert_eq!(e.enqueue(0, req(1, 60, 10)), Err(Rejection::TooLongForKv));
    c.kv_blocks = 100;
    c.chunked_prefill = false;
    let mut e = Engine::new(c);
    assert_eq!(
        e.enqueue(0, req(1, 60, 10)),
        Err(Rejection::TooLongForBudget)
    );
    assert_eq!(e.stats().rejected, 1);
    assert!(e.enqueue(0, req(2, 30, 10)).is_ok());
}

fn batcher(max_batch_size: u32, delay_ms: u64) -> Batcher {
    Batcher::new(BatcherConfig {
        max_batch_size,
        max_queue_delay_ns: delay_ms * MS,
        block_tokens: 16,
        kv_blocks: 1000,
        cost: flat(10 * MS),
    })
}

#[test]
fn dynamic_batch_runs_as_one_shared_execution() {
    let mut b = batcher(4, 5);
    // Four arrive together: the batch forms at once. Outputs 1, 3 and 6 tokens: the batch runs 6
    // steps, members that finished stay as padding, and KV returns only at the end.
    let t = drive(
        &mut b,
        &[
            (0, req(1, 8, 1)),
            (0, req(2, 8, 3)),
            (0, req(3, 8, 6)),
            (0, req(4, 8, 6)),
        ],
    );
    assert_eq!(t[&1].tokens_ns, [10 * MS]);
    assert_eq!(t[&2].tokens_ns, [10, 20, 30].map(|x| x * MS));
    assert_eq!(t[&3].tokens_ns.last(), Some(&(60 * MS)));
    for id in 1..=4 {
        assert_eq!(
            t[&id].released_ns,
            Some(60 * MS),
            "shared frame ends together"
        );
    }
    assert_eq!(t[&1].padding, 5);
    assert_eq!(b.stats().batches, 1);
    assert_eq!(b.kv().in_use(), 0);
}

#[test]
fn dynamic_batch_forms_on_timeout_when_not_full() {
    let mut b = batcher(4, 5);
    let t = drive(&mut b, &[(0, req(1, 8, 2)), (2 * MS, req(2, 8, 2))]);
    // The oldest waited 5 ms: the batch of two starts at 5 ms.
    assert_eq!(t[&1].tokens_ns, [15 * MS, 25 * MS]);
    assert_eq!(t[&2].tokens_ns, [15 * MS, 25 * MS]);
    // A request arriving during a batch waits for it to end.
    let mut b = batcher(1, 0);
    let t = drive(&mut b, &[(0, req(1, 8, 3)), (MS, req(2, 8, 1))]);
    assert_eq!(t[&2].tokens_ns, [40 * MS]);
}

/// An abort with a key of its own (every call is a new cancel, not a duplicate).
pub(crate) fn abort(scope: Scope) -> Abort {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    let key = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    Abort {
        scope,
        fault: None,
        key,
        ideal: false,
    }
}

#[test]
fn queued_abort_leaves_at_the_next_pass_with_no_gpu_work() {
    let mut c = cfg(1);
    c.max_num_seqs = 1;
    let mut e = Engine::new(c);
    // Request 1 holds the only slot for 5 steps; request 2 waits and is aborted at 15 ms.
    let t = drive_aborts(
        &mut e,
        &[(0, req(1, 4, 5)), (0, req(2, 4, 5))],
        &[(15 * MS, abort(Scope::Request(2)))],
    );
    assert!(t[&2].tokens_ns.is_empty());
    // The engine is mid-step at 15 ms: the next scheduler pass is at the step boundary, 20 ms.
    assert_eq!(
        t[&2].observed_ns,
        Some(20 * MS),
        "observed at the next scheduler pass"
    );
    assert_eq!(t[&2].released_ns, Some(20 * MS));
    assert_eq!(t[&1].tokens_ns.len(), 5, "the sibling is untouched");
    assert_eq!(e.stats().steps, 5, "no step ever carried request 2");
}

#[test]
fn w1_observes_at_the_next_step_boundary() {
    let mut e = Engine::new(cfg(1));
    // Steps end every 10 ms; the abort lands at 25 ms, inside step 3 (20..30).
    let t = drive_aborts(
        &mut e,
        &[(0, req(1, 4, 100)), (0, req(3, 4, 10))],
        &[(25 * MS, abort(Scope::Request(1)))],
    );
    // Step 3's token is produced (the world discards it as late output); then it is gone.
    assert_eq!(t[&1].tokens_ns, [10, 20, 30].map(|x| x * MS));
    assert_eq!(t[&1].observed_ns, Some(30 * MS));
    assert_eq!(t[&1].released_ns, Some(30 * MS));
    assert_eq!(t[&1].discarded, 0);
    assert_eq!(t[&3].tokens_ns.len(), 10);
    assert_eq!(e.kv().allocated_total(), e.kv().freed_total());
}

#[test]
fn w2_has_one_more_step_in_flight_and_fences_the_release() {
    let mut e = Engine::new(cfg(2));
    let t = drive_aborts(
        &mut e,
        &[(0, req(1, 4, 100)), (0, req(3, 4, 10))],
        &[(25 * MS, abort(Scope::Request(1)))],
    );
    // Step 4 (30..40) was dispatched at 20 ms with request 1 in it: its output is discarded,
    // and the blocks come back only when it ends.
    assert_eq!(t[&1].tokens_ns, [10, 20, 30].map(|x| x * MS));
    assert_eq!(t[&1].observed_ns, Some(30 * MS));
    assert_eq!(t[&1].discarded, 1);
    assert_eq!(t[&1].released_ns, Some(40 * MS));
}

#[test]
fn group_abort_through_a_stream_reaches_exactly_the_stream() {
    let mut e = Engine::new(cfg(1));
    // Streams are id % 2: requests 1, 3, 5 share stream 1; 2 and 4 are on stream 0.
    let arrivals: Vec<_> = (1..=5).map(|i| (0, req(i, 4, 20))).collect();
    let t = drive_aborts(&mut e, &arrivals, &[(25 * MS, abort(Scope::Stream(1)))]);
    for id in [1, 3, 5] {
        assert_eq!(t[&id].observed_ns, Some(30 * MS), "{id} is on the stream");
        assert_eq!(t[&id].tokens_ns.len(), 3);
    }
    for id in [2, 4] {
        assert_eq!(t[&id].observed_ns, None, "{id} is not");
        assert_eq!(t[&id].tokens_ns.len(), 20);
    }
}

#[test]
fn prefix_abort_widens_to_colliding_ids() {
    let mut e = Engine::new(cfg(1));
    let arrivals = [
        (0, req(1, 4, 20)),
        (0, req(12, 4, 20)),
        (0, req(2, 4, 20)),
        (0, req(21, 4, 20)),
    ];
    let t = drive_aborts(&mut e, &arrivals, &[(15 * MS, abort(Scope::Prefix(1)))]);
    assert!(
        t[&1].observed_ns.is_some() && t[&12].observed_ns.is_some(),
        "req-1 and req-12"
    );
    assert!(t[&2].observed_ns.is_none() && t[&21].observed_ns.is_none());
}

#[test]
fn late_abort_is_ignored_with_tombstones_and_kills_a_reused_id_without() {
    // Request 1 finishes at 30 ms; request 101 reuses runtime id 1 and arrives at 35 ms; the
    // abort for the first request arrives late, at 40 ms.
    let reused = |rid_new: u64| {
        let mut r = req(101, 4, 10);
        r.handle.runtime_id = rid_new;
        r
    };
    for (tombstones, rid_new, killed) in [(false, 1, true), (true, 1001, false)] {
        let mut c = cfg(1);
        c.tombstones = tombstones;
        let mut e = Engine::new(c);
        let t = drive_aborts(
            &mut e,
            &[(0, req(1, 4, 3)), (35 * MS, reused(rid_new))],
            &[(40 * MS, abort(Scope::Request(1)))],
        );
        assert_eq!(t[&1].tokens_ns.len(), 3);
        assert_eq!(
            t[&101].observed_ns.is_some(),
            killed,
            "tombstones {tombstones}"
        );
        assert_eq!(t[&101].tokens_ns.len() == 10, !killed);
    }
    // With tombstones, the id of the finished request is recognised.
    let mut c = cfg(1);
    c.tombstones = true;
    let mut e = Engine::new(c);
    drive_aborts(
        &mut e,
        &[(0, req(1, 4, 3))],
        &[(40 * MS, abort(Scope::Request(1)))],
    );
    assert_eq!(e.stats().aborts_tombstoned, 1);
    assert_eq!(e.stats().aborts_unknown, 0);
}

#[test]
fn faults_on_the_abort_path_have_a_blast_radius() {
    let arrivals: Vec<_> = (1..=4).map(|i| (0, req(i, 4, 20))).collect();
    for (radius, victims) in [
        (BlastRadius::Request, 1),
        (BlastRadius::Batch, 4),
        (BlastRadius::Engine, 4),
    ] {
        let mut e = Engine::new(cfg(1));
        let a = Abort {
            fault: Some(radius),
            ..abort(Scope::Request(2))
        };
        let t = drive_aborts(&mut e, &arrivals, &[(25 * MS, a)]);
        let hit = t.values().filter(|x| x.observed_ns.is_some()).count();
        assert_eq!(hit, victims, "{radius:?}");
        assert_eq!(e.stats().faults, 1);
    }
    // An abort for an unknown id faults the engine when the runtime faults on it.
    let mut c = cfg(1);
    c.unknown_abort = UnknownAbort::Fault(BlastRadius::Engine);
    let mut e = Engine::new(c);
    let t = drive_aborts(&mut e, &arrivals, &[(25 * MS, abort(Scope::Request(99)))]);
    assert_eq!(t.values().filter(|x| x.observed_ns.is_some()).count(), 4);
}

#[test]
fn a_duplicate_delivery_of_a_handled_abort_is_idempotent() {
    // Defect 6 of the correctness issue: the second delivery of a cancel that already removed
    // its request looked like a cancel for an unknown id, and a runtime that faults on those
    // (reused client ids, no tombstones) killed the whole engine.
    let arrivals: Vec<_> = (1..=4).map(|i| (0, req(i, 4, 20))).collect();
    let mut c = cfg(1);
    c.unknown_abort = UnknownAbort::Fault(BlastRadius::Engine);
    let mut e = Engine::new(c.clone());
    let a = abort(Scope::Request(2));
    let t = drive_aborts(&mut e, &arrivals, &[(25 * MS, a), (45 * MS, a)]);
    assert_eq!(t.values().filter(|x| x.observed_ns.is_some()).count(), 1);
    assert_eq!(e.stats().faults, 0);
    assert_eq!(e.stats().aborts_duplicate, 1);
    // A new cancel for an id nobody has still faults: that is the runtime's behaviour.
    let mut e = Engine::new(c);
    let b = abort(Scope::Request(99));
    let t = drive_aborts(&mut e, &arrivals, &[(25 * MS, a), (45 * MS, b)]);
    assert_eq!(t.values().filter(|x| x.observed_ns.is_some()).count(), 4);
}

#[test]
fn a_backend_that_never_checks_runs_to_completion() {
    let mut c = cfg(1);
    c.checkpoint = Checkpoint::Never;
    let mut e = Engine::new(c);
    let t = drive_aborts(
        &mut e,
        &[(0, req(1, 4, 10))],
        &[(25 * MS, abort(Scope::Request(1)))],
    );
    assert_eq!(t[&1].observed_ns, None);
    assert_eq!(t[&1].tokens_ns.len(), 10);
    assert_eq!(e.stats().aborts_unobserved, 1);
}

#[test]
fn sparse_checkpoints_delay_observation() {
    let mut c = cfg(1);
    c.checkpoint = Checkpoint::EveryPasses(3);
    let mut e = Engine::new(c);
    let t = drive_aborts(
        &mut e,
        &[(0, req(1, 4, 100))],
        &[(25 * MS, abort(Scope::Request(1)))],
    );
    // Passes with a pending abort are counted from its arrival: the third is at 50 ms.
    assert_eq!(t[&1].observed_ns, Some(50 * MS));
    assert_eq!(t[&1].tokens_ns.len(), 5);
}

#[test]
fn immediate_release_corrupts_the_next_owner_and_fenced_does_not() {
    for (release, corrupt) in [(ReleaseMode::Immediate, true), (ReleaseMode::Fenced, false)] {
        let mut c = cfg(2);
        c.release = release;
        c.max_num_seqs = 1;
        let mut e = Engine::new(c);
        // Request 1 runs; request 2 waits for the slot. The abort frees request 1's blocks while
        // step 4 (dispatched with request 1) is still in flight; request 2 gets them.
        let t = drive_aborts(
            &mut e,
            &[(0, req(1, 40, 100)), (0, req(2, 40, 5))],
            &[(25 * MS, abort(Scope::Request(1)))],
        );
        assert_eq!(t[&2].tokens_ns.len(), 5);
        assert_eq!(t[&2].corrupted_tokens > 0, corrupt, "{release:?}");
        assert_eq!(e.kv().allocated_total(), e.kv().freed_total());
    }
}

//! The engine's queue and its decode-stage entry points: aborts deep in a long waiting queue,
//! a prompt whose KV arrived from a prefill stage, and blocks pinned outside the engine.

use cancelsim_models::engine::Engine;
use cancelsim_models::gpu::{StepCost, StepModel};
use cancelsim_models::protocol::{Abort, NewRequest, Outbox, Scheduler, Scope};

use super::engine::abort;
use crate::driver::{cfg, drive, drive_aborts, req, MS};

#[test]
fn aborts_deep_in_the_queue_keep_its_order_and_reused_slots_do_not_jump_it() {
    // One request runs at a time (one 10 ms step each), so the order of first tokens is the
    // queue's order. 300 wait; 250 of them are aborted by id at 5 ms (their entries die in
    // place, then the queue is compacted); 20 more arrive at 15 ms into the freed slots.
    let mut c = cfg(1);
    c.max_num_seqs = 1;
    let mut e = Engine::new(c);
    let mut arrivals: Vec<(u64, NewRequest)> = (1..=300).map(|id| (0, req(id, 4, 1))).collect();
    arrivals.extend((1001..=1020).map(|id| (15 * MS, req(id, 4, 1))));
    let doomed: Vec<u64> = (1..=300).filter(|id| id % 6 != 1).collect();
    let aborts: Vec<(u64, Abort)> = doomed
        .iter()
        .map(|&id| (5 * MS, abort(Scope::Request(id))))
        .collect();
    let t = drive_aborts(&mut e, &arrivals, &aborts);
    for id in &doomed {
        let tr = &t[id];
        assert!(tr.tokens_ns.is_empty(), "aborted {id} ran");
        assert_eq!(
            tr.observed_ns,
            Some(10 * MS),
            "{id} observed at the boundary"
        );
    }
    let survivors: Vec<u64> = (1..=300)
        .filter(|id| id % 6 == 1)
        .chain(1001..=1020)
        .collect();
    let firsts: Vec<u64> = survivors.iter().map(|id| t[id].tokens_ns[0]).collect();
    assert!(
        firsts.windows(2).all(|w| w[0] < w[1]),
        "survivors, then late arrivals, in arrival order"
    );
    assert_eq!(e.waiting_len(), 0);
    assert_eq!(e.stats().steps as usize, survivors.len());
}

#[test]
fn a_prompt_whose_kv_arrived_starts_with_a_decode_step() {
    // A 150-token prompt would take three chunks (64 + 64 + 22) before its first token; with
    // its KV already here (sent by a prefill stage) the first step is a decode: tokens at 10,
    // 20 and 30 ms, no prefill token computed, and the prompt's blocks taken at admission.
    let mut c = cfg(1);
    if let StepModel::Linear(cost) = &mut c.cost {
        cost.per_kv_token_ps = 1_000_000; // 1 µs per KV token read: the decode cost shows ctx
    }
    let mut e = Engine::new(c);
    let mut r = req(1, 150, 3);
    r.kv_ready = true;
    let t = drive(&mut e, &[(0, r)]);
    // Each step: 10 ms plus 1 µs per token of context read (151, 152, 153).
    assert_eq!(
        t[&1].tokens_ns,
        [10 * MS + 151_000, 20 * MS + 303_000, 30 * MS + 456_000]
    );
    assert_eq!(e.stats().prefill_tokens, 0);
    assert_eq!(e.stats().steps, 3);
    // ceil(151 / 16) = 10 blocks at admission, 10 still for 153 tokens: all back at the end.
    assert_eq!(e.kv().allocated_total(), 10);
    assert_eq!(e.kv().in_use(), 0);
}

#[test]
fn pinned_blocks_count_against_the_pool_and_stall_admission() {
    // 1,000 blocks; 997 pinned for transfers. A 100-token prompt's first chunk (the budget's
    // 64 tokens) needs 4 blocks, with 3 free: it waits until the pin is given back.
    let mut e = Engine::new(cfg(1));
    assert!(e.pin(997));
    assert!(!e.pin(10), "no more than the pool");
    assert_eq!(e.pinned_blocks(), 997);
    let mut out = Outbox::default();
    e.enqueue(0, req(1, 100, 1)).unwrap();
    e.checkpoint(0, &mut out);
    assert!(e.dispatch(0, &mut out).is_none(), "4 blocks are not free");
    assert_eq!(e.stats().stalls_pinned, 1);
    e.unpin(997);
    assert_eq!(e.pinned_blocks(), 0);
    assert!(
        e.dispatch(0, &mut out).is_some(),
        "admitted once the pin is back"
    );
    assert_eq!(e.kv().in_use(), 4);
}

#[test]
fn without_chunked_prefill_new_prompts_run_in_steps_of_their_own() {
    // A runs from 0; B arrives at 15 ms, while A's second step is in flight. vLLM v0 gives B's
    // prompt a prefill-only step (20–30 ms), so A's third token slips from 30 to 40 ms. Chunked
    // prefill mixes them: A's tokens keep their 10 ms rhythm.
    let arrivals = [(0, req(1, 4, 5)), (15 * MS, req(2, 4, 3))];
    let run = |chunked: bool| {
        let mut c = cfg(1);
        c.chunked_prefill = chunked;
        drive(&mut Engine::new(c), &arrivals)
    };
    let v0 = run(false);
    let ms = |v: &[u64]| v.iter().map(|t| t / MS).collect::<Vec<_>>();
    assert_eq!(ms(&v0[&1].tokens_ns), [10, 20, 40, 50, 60]);
    assert_eq!(ms(&v0[&2].tokens_ns), [30, 40, 50]);
    let mixed = run(true);
    assert_eq!(ms(&mixed[&1].tokens_ns), [10, 20, 30, 40, 50]);
    assert_eq!(ms(&mixed[&2].tokens_ns), [30, 40, 50]);
}

#[test]
fn the_watermark_keeps_room_for_running_requests_but_never_blocks_a_lone_one() {
    // 100 blocks of 16 tokens, watermark 10. A holds 50 blocks (800 tokens) and grows to 52.
    // B needs 41 blocks: 49 are free once A has its first decode block, which fits B but not B
    // plus the watermark, so B waits for A. Without the watermark B starts at once.
    let arrivals = [(0, req(1, 800, 20)), (5 * MS, req(2, 656, 2))];
    let run = |watermark: u64| {
        let mut c = cfg(1);
        c.max_num_batched_tokens = 4096;
        c.kv_blocks = 100;
        c.watermark_blocks = watermark;
        drive(&mut Engine::new(c), &arrivals)
    };
    let held = run(10);
    let a_last = *held[&1].tokens_ns.last().unwrap();
    assert!(held[&2].tokens_ns[0] > a_last, "B waited for A");
    let free = run(0);
    assert_eq!(
        free[&2].tokens_ns[0],
        20 * MS,
        "B admitted at the next step"
    );
    // Alone, a request may take 95 of the 100 blocks despite the watermark.
    let mut c = cfg(1);
    c.max_num_batched_tokens = 4096;
    c.kv_blocks = 100;
    c.watermark_blocks = 10;
    let lone = drive(&mut Engine::new(c), &[(0, req(3, 1500, 2))]);
    assert_eq!(lone[&3].tokens_ns.len(), 2);
}

#[test]
fn without_chunked_prefill_a_preempted_prompt_waits_for_the_decodes_to_move() {
    // 6 blocks of 16 tokens, W = 2, no watermark; two 16-token prompts that grow to 76 tokens.
    // The older one's growth preempts the newer, whose blocks come back when its step in flight
    // ends. Admitting the newer again in the next step (prefill-only, there is room by then)
    // takes back the blocks the older one needs, and the two take turns for ever (the fuzzer
    // found this). The older one decodes first instead, and both finish.
    let mut c = cfg(2);
    c.chunked_prefill = false;
    c.max_num_batched_tokens = 4096;
    c.kv_blocks = 6;
    let t = drive(
        &mut Engine::new(c),
        &[(0, req(1, 16, 60)), (0, req(2, 16, 60))],
    );
    assert_eq!(t[&1].tokens_ns.len(), 60);
    assert_eq!(t[&2].tokens_ns.len(), 60);
}

#[test]
fn a_preempted_request_reuses_its_cached_blocks_and_finishes_sooner() {
    // 10 blocks of 16 tokens, prefill at 1,000 tokens/s on top of 10 ms steps. Two 64-token
    // prompts grow to 7 blocks each: the newer is preempted. With prefix caching its recompute
    // finds its own full blocks still cached and computes only the rest.
    let run = |caching: bool| {
        let mut c = cfg(1);
        c.kv_blocks = 10;
        c.prefix_caching = caching;
        c.cost = StepModel::Linear(StepCost {
            c0_ns: 10 * MS,
            prefill_tokens_per_s: 1_000,
            per_seq_ns: 0,
            per_kv_token_ps: 0,
        });
        let mut e = Engine::new(c);
        let t = drive(&mut e, &[(0, req(1, 64, 40)), (0, req(2, 64, 40))]);
        (t, e.stats())
    };
    let (cold, cold_stats) = run(false);
    let (warm, warm_stats) = run(true);
    assert!(cold_stats.preemptions > 0 && warm_stats.preemptions > 0);
    assert_eq!(cold_stats.prefix_hit_tokens, 0);
    // Its full blocks, less those the older request's growth evicted (the tail goes first).
    let hit = warm_stats.prefix_hit_tokens;
    assert!(hit > 0 && hit % 16 == 0 && hit <= 64, "{warm_stats:?}");
    // Every admission computes what it looked up less what it found (none was cut short).
    assert_eq!(
        warm_stats.prefill_tokens + hit,
        warm_stats.prefix_query_tokens
    );
    assert!(warm_stats.prefill_tokens < cold_stats.prefill_tokens);
    let last = |t: &std::collections::BTreeMap<u64, crate::driver::Trace>| {
        *t[&2].tokens_ns.last().unwrap()
    };
    assert!(
        last(&warm) < last(&cold),
        "{} against {}",
        last(&warm),
        last(&cold)
    );
    assert_eq!(warm[&2].tokens_ns.len(), 40);
}

#[test]
fn a_waiting_requests_cached_run_costs_what_changed_not_what_it_holds() {
    // Two 4,000-token requests on 400 blocks: the newer is preempted, and waits with its run of
    // cached blocks while the older grows into the pool, evicting that run from its tail. Each
    // step looks at the waiting front again; scanning its run every time cost O(blocks held)
    // per step (about 250 lookups a step here), where the journal of changed keys costs O(blocks
    // changed): a few per step, and one pass over the run per preemption.
    let mut c = cfg(1);
    c.kv_blocks = 400;
    c.prefix_caching = true;
    let mut e = Engine::new(c);
    let t = drive(&mut e, &[(0, req(1, 16, 4000)), (0, req(2, 16, 4000))]);
    assert_eq!(t[&1].tokens_ns.len(), 4000);
    assert_eq!(t[&2].tokens_ns.len(), 4000);
    let s = e.stats();
    eprintln!(
        "{} lookups, {} steps, {} preemptions",
        s.prefix_lookups, s.steps, s.preemptions
    );
    assert!(s.preemptions > 0, "{s:?}");
    // Every block any incarnation held, looked up a few times, and a few lookups per step.
    let blocks_held = (s.preemptions + 2) * 400;
    assert!(
        s.prefix_lookups <= 4 * blocks_held + 4 * s.steps,
        "{} lookups over {} steps and {} preemptions",
        s.prefix_lookups,
        s.steps,
        s.preemptions
    );
}

#[test]
fn block_time_is_the_closed_form_sum_of_blocks_held() {
    // One request, a 20-token prompt and 30 output tokens, 16-token blocks, one 10 ms step per
    // token: step k (dispatched at (k - 1) × 10 ms) brings its context to 19 + k tokens. It holds
    // 2 blocks from 0, 3 from step 14 (130 ms, context 33), 4 from step 30 (290 ms, context 49),
    // and releases them at the last step's end, 300 ms: 2×130 + 3×160 + 4×10 = 780 block-ms.
    // Its cancel intent at 50 ms (between steps) counts the rest as retained: 2×80 + 3×160 +
    // 4×10 = 680 block-ms. Decode steps that add no block leave the count to the next change.
    let mut e = Engine::new(cfg(1));
    let mut out = Outbox::default();
    e.enqueue(0, req(1, 20, 30)).unwrap();
    let mut now_ns = 0;
    let mut released = None;
    for _ in 0..100 {
        if now_ns == 50 * MS {
            e.mark_intent(now_ns, 1);
        }
        let Some(d) = e.dispatch(now_ns, &mut out) else {
            break;
        };
        now_ns = d.end_ns;
        e.step_done(now_ns, d.step, &mut out);
        if let Some(r) = out.released.first() {
            released = Some((now_ns, r.kv_block_ns, r.kv_block_ns_marked));
        }
        out.clear();
    }
    assert_eq!(
        released,
        Some((300 * MS, 780 * u128::from(MS), 680 * u128::from(MS)))
    );
}

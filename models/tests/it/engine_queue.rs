//! The engine's queue and its decode-stage entry points: aborts deep in a long waiting queue,
//! a prompt whose KV arrived from a prefill stage, and blocks pinned outside the engine.

use cancelsim_models::engine::Engine;
use cancelsim_models::protocol::{Abort, NewRequest, Outbox, Scheduler, Scope};

use super::engine::{abort, cfg, drive, drive_aborts, req, MS};

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
    c.cost.per_kv_token_ps = 1_000_000; // 1 µs per KV token read: the decode cost shows ctx
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

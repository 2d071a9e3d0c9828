//! The continuous engine and the dynamic batcher, driven alone (no kernel) by a tiny loop, checked
//! against hand-computed timelines and conservation laws.

use std::collections::BTreeMap;

use cancelsim_models::batcher::{Batcher, BatcherConfig};
use cancelsim_models::engine::{
    Dispatch, Engine, EngineConfig, NewRequest, Outcome, Rejection, Released, StepOutput,
};
use cancelsim_models::gpu::StepCost;

const MS: u64 = 1_000_000;

fn flat(c0_ns: u64) -> StepCost {
    StepCost {
        c0_ns,
        prefill_tokens_per_s: 0,
        per_seq_ns: 0,
        per_kv_token_ps: 0,
    }
}

fn cfg(window: u32) -> EngineConfig {
    EngineConfig {
        max_num_seqs: 8,
        max_num_batched_tokens: 64,
        chunked_prefill: true,
        block_tokens: 16,
        kv_blocks: 1000,
        window,
        cost: flat(10 * MS),
    }
}

trait Replica {
    fn enqueue(&mut self, now: u64, r: NewRequest) -> Result<(), Rejection>;
    fn dispatch(&mut self, now: u64) -> Option<Dispatch>;
    fn step_done(&mut self, now: u64, step: u64, o: &mut Vec<StepOutput>, r: &mut Vec<Released>);
    fn timer(&self) -> Option<u64>;
}

impl Replica for Engine {
    fn enqueue(&mut self, now: u64, r: NewRequest) -> Result<(), Rejection> {
        Engine::enqueue(self, now, r)
    }
    fn dispatch(&mut self, now: u64) -> Option<Dispatch> {
        Engine::dispatch(self, now)
    }
    fn step_done(&mut self, now: u64, step: u64, o: &mut Vec<StepOutput>, r: &mut Vec<Released>) {
        Engine::step_done(self, now, step, o, r);
    }
    fn timer(&self) -> Option<u64> {
        None
    }
}

impl Replica for Batcher {
    fn enqueue(&mut self, now: u64, r: NewRequest) -> Result<(), Rejection> {
        Batcher::enqueue(self, now, r)
    }
    fn dispatch(&mut self, now: u64) -> Option<Dispatch> {
        Batcher::dispatch(self, now)
    }
    fn step_done(&mut self, now: u64, step: u64, o: &mut Vec<StepOutput>, r: &mut Vec<Released>) {
        Batcher::step_done(self, now, step, o, r);
    }
    fn timer(&self) -> Option<u64> {
        Batcher::timer_ns(self)
    }
}

/// Per request: token times, discarded tokens, release.
#[derive(Default, Debug)]
struct Trace {
    tokens_ns: Vec<u64>,
    discarded: u32,
    padding: u32,
    released_ns: Option<u64>,
}

/// Feed `(time, request)` arrivals, run to idle, return what each request saw.
fn drive(rep: &mut impl Replica, arrivals: &[(u64, NewRequest)]) -> BTreeMap<u64, Trace> {
    let mut traces: BTreeMap<u64, Trace> = BTreeMap::new();
    let mut inflight: Vec<Dispatch> = Vec::new();
    let mut next_arrival = 0;
    let (mut outs, mut rels) = (Vec::new(), Vec::new());
    for _ in 0..1_000_000 {
        let t_arr = arrivals.get(next_arrival).map(|a| a.0);
        let t_step = inflight.first().map(|d| d.end_ns);
        let t_timer = rep.timer();
        let now = [t_arr, t_step, t_timer].into_iter().flatten().min();
        let Some(now) = now else { return traces };
        if t_step == Some(now) {
            let d = inflight.remove(0);
            rep.step_done(now, d.step, &mut outs, &mut rels);
            for o in outs.drain(..) {
                let t = traces.entry(o.id).or_default();
                match o.outcome {
                    Outcome::Token { index, .. } => {
                        assert_eq!(index as usize, t.tokens_ns.len() + 1, "tokens in order");
                        t.tokens_ns.push(now);
                    }
                    Outcome::Discarded => t.discarded += 1,
                    Outcome::Padding => t.padding += 1,
                    Outcome::Prefill => {}
                }
            }
            for r in rels.drain(..) {
                let t = traces.entry(r.id).or_default();
                assert!(t.released_ns.is_none(), "released twice");
                t.released_ns = Some(now);
            }
        } else if t_arr == Some(now) {
            let (_, r) = arrivals[next_arrival];
            next_arrival += 1;
            if rep.enqueue(now, r).is_err() {
                traces.entry(r.id).or_default();
            }
        }
        // Like the world's Schedule class: the scheduler runs after every event of the tick.
        let more_now = arrivals.get(next_arrival).is_some_and(|a| a.0 == now)
            || inflight.first().is_some_and(|d| d.end_ns == now);
        if !more_now {
            while let Some(d) = rep.dispatch(now) {
                inflight.push(d);
            }
        }
    }
    panic!("did not go idle");
}

fn req(id: u64, prompt: u32, output: u32) -> NewRequest {
    NewRequest {
        tag: id as u32,
        id,
        prompt_tokens: prompt,
        output_tokens: output,
    }
}

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
    let mut e = Engine::new(c);
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

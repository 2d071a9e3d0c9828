//! The books' transitions, each asserting its order, and conservation at the end of a run.

use super::*;

fn arrived(n: u64) -> Accounts {
    let mut a = Accounts::new();
    for _ in 0..n {
        a.arrived(false, false);
    }
    a
}

#[test]
fn the_books_in_order_pass_every_assertion() {
    let mut a = Accounts::new();
    a.arrived(true, true);
    a.admitted();
    a.started();
    a.prefill_token();
    a.token_overrun();
    a.stop_abort_observed();
    a.timer(true);
    a.released(&mut Cost::default(), 10, 10);
    a.completion_at(5);
    a.completion_at(5);
    a.cleanups_pending(1);
    let t = a.tally();
    assert_eq!(
        (t.counts.scheduled, t.storm_targets, t.stop_requests),
        (1, 1, 1)
    );
    assert_eq!(
        (t.deadlines_missed, t.kv_block_ns, t.last_completion_ns),
        (1, 10, 5)
    );
}

#[test]
#[should_panic(expected = "admitted than arrived")]
fn admitted_before_arrival() {
    Accounts::new().admitted();
}

#[test]
#[should_panic(expected = "started than were admitted")]
fn started_before_admission() {
    arrived(1).started();
}

#[test]
#[should_panic(expected = "client timers")]
fn a_timer_for_nobody() {
    let mut a = arrived(1);
    a.timer(true);
    a.timer(false);
}

#[test]
#[should_panic(expected = "stop-string aborts")]
fn a_stop_abort_without_a_stop_string() {
    arrived(1).stop_abort_observed();
}

#[test]
#[should_panic(expected = "past a stop string")]
fn an_overrun_without_a_stop_string() {
    arrived(1).token_overrun();
}

#[test]
#[should_panic(expected = "prefill tokens")]
fn a_prefill_token_before_admission() {
    arrived(1).prefill_token();
}

#[test]
#[should_panic(expected = "retained than held")]
fn more_retained_than_held() {
    Accounts::new().released(&mut Cost::default(), 1, 2);
}

#[test]
#[should_panic(expected = "completion went back")]
fn a_completion_back_in_time() {
    let mut a = Accounts::new();
    a.completion_at(5);
    a.completion_at(4);
}

#[test]
#[should_panic(expected = "cleanups pending")]
fn more_cleanups_than_requests() {
    arrived(1).cleanups_pending(2);
}

fn req(arrival_ns: u64) -> Req {
    let a = crate::workload::Arrival {
        id: 1,
        time_ns: arrival_ns,
        prompt_tokens: 1,
        output_tokens: 1,
    };
    Req::new(&a, arrival_ns)
}

#[test]
#[should_panic(expected = "never arrived")]
fn a_departure_without_an_arrival() {
    Accounts::new().left(&req(0), State::Cancelled, false, 1, None);
}

#[test]
#[should_panic(expected = "before it arrived")]
fn a_departure_before_the_arrival() {
    arrived(1).left(&req(10), State::Cancelled, false, 5, None);
}

#[test]
fn conservation_catches_a_lost_token_a_lost_token_step_and_lost_gpu_time() {
    let mut a = Accounts::new();
    a.t.tokens_left = 10;
    a.t.gpu.token_steps = 40;
    a.t.token_steps_left = 40;
    a.t.gpu.requests_ns = 900.0;
    a.t.gpu.discarded_ns = 100.0;
    let mut r = ReplicaStats {
        tokens_delivered: 10,
        busy_ns: 1000,
        ..ReplicaStats::default()
    };
    assert_eq!(a.conserved(&r), Ok(()));
    r.tokens_delivered = 11;
    assert!(matches!(a.conserved(&r), Err(Stop::Broken { .. })));
    r.tokens_delivered = 10;
    a.t.token_steps_left = 39;
    assert!(a.conserved(&r).is_err());
    a.t.token_steps_left = 40;
    r.busy_ns = 1_100;
    assert!(a.conserved(&r).is_err());
}

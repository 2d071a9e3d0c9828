use super::*;

const S: u64 = 1_000_000_000;

fn owner(reclaim: Reclaim, completions: Completions, release_on_cancel: bool) -> CleanupOwner {
    CleanupOwner::new(CleanupConfig {
        reclaim,
        completions,
        release_on_cancel,
    })
}

fn lease(lease_s: u64, grace_s: u64) -> Reclaim {
    Reclaim::Lease {
        lease_ns: lease_s * S,
        grace_ns: grace_s * S,
    }
}

/// splitmix64: a fixed, portable stream for the arrival gaps.
fn next(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[test]
fn lost_notices_under_a_lease_pin_rate_times_lease_times_blocks() {
    // S06: every notice is lost, so each request's blocks stay for the whole lease. By Little's
    // law the blocks held are, on average, λ × lease × blocks: 20/s × 120 s × 8 = 19,200.
    let (rate_per_s, lease_s, blocks) = (20.0, 120, 8);
    let horizon_ns = 10_000 * S;
    let mut o = owner(lease(lease_s, 0), Completions::Counted, false);
    let (mut t_ns, mut state, mut id) = (0u64, 42u64, 0u64);
    let mut exact_block_ns = 0u128;
    loop {
        let u = (next(&mut state) >> 11) as f64 / (1u64 << 53) as f64;
        t_ns += (-(1.0 - u).ln() / rate_per_s * 1e9) as u64;
        if t_ns >= horizon_ns {
            break;
        }
        for r in o.expire(t_ns) {
            assert_eq!(r.why, Why::LeaseExpired);
        }
        o.hold(t_ns, id, blocks, 1);
        exact_block_ns += blocks as u128 * (lease_s * S).min(horizon_ns - t_ns) as u128;
        id += 1;
    }
    o.expire(horizon_ns);
    // Conservation: the integral is exactly the sum of each hold's time.
    assert_eq!(o.block_ns(horizon_ns), exact_block_ns);
    // The closed form, on the steady part (after the first lease).
    let mut warm = owner(lease(lease_s, 0), Completions::Counted, false);
    let predicted = rate_per_s * lease_s as f64 * blocks as f64;
    let (mut t_ns, mut state) = (0u64, 42u64);
    let mut sampled = Vec::new();
    for id in 0.. {
        let u = (next(&mut state) >> 11) as f64 / (1u64 << 53) as f64;
        t_ns += (-(1.0 - u).ln() / rate_per_s * 1e9) as u64;
        if t_ns >= horizon_ns {
            break;
        }
        warm.expire(t_ns);
        if t_ns > lease_s * S {
            sampled.push(warm.blocks_held() as f64);
        }
        warm.hold(t_ns, id, blocks, 1);
    }
    // Poisson arrivals see time averages (PASTA).
    let mean = sampled.iter().sum::<f64>() / sampled.len() as f64;
    let err = (mean - predicted).abs() / predicted;
    println!("mean held {mean:.0} against λTb = {predicted:.0} ({err:.4})");
    assert!(
        err < 0.03,
        "mean held {mean:.0} against λTb = {predicted:.0} ({err:.3})"
    );
}

#[test]
fn without_a_deadline_a_lost_notice_leaks_until_the_end() {
    let mut o = owner(Reclaim::Never, Completions::Counted, false);
    o.hold(0, 1, 10, 1);
    o.hold(S, 2, 5, 1);
    assert_eq!(o.timer_ns(), None);
    // A cancel on a decode node that must wait for the remote write changes nothing.
    assert_eq!(o.cancel(2 * S, 1), None);
    assert_eq!(o.block_s(10 * S), 10.0 * 10.0 + 5.0 * 9.0);
    assert!(o.expire(1_000_000 * S).is_empty());
    assert_eq!((o.held(), o.blocks_held(), o.blocks_peak()), (2, 15, 15));
}

#[test]
fn a_notice_before_the_lease_returns_the_blocks_and_clears_the_timer() {
    let mut o = owner(lease(120, 20), Completions::Counted, false);
    o.hold(0, 7, 4, 1);
    assert_eq!(o.timer_ns(), Some(140 * S));
    let n = o.notice(3 * S, 7);
    assert_eq!(
        n,
        Notice::Returned(Returned {
            id: 7,
            blocks: 4,
            why: Why::Completed
        })
    );
    assert_eq!(o.timer_ns(), None);
    assert_eq!(o.notice(4 * S, 7), Notice::Ignored);
    assert_eq!(o.block_s(100 * S), 12.0);
}

#[test]
fn two_pending_notices_counted_or_the_second_one_faulting() {
    // S07 (c): a send and a receive are both pending.
    let mut counted = owner(lease(120, 0), Completions::Counted, false);
    counted.hold(0, 1, 6, 2);
    assert_eq!(counted.notice(S, 1), Notice::Pending);
    assert!(matches!(counted.notice(2 * S, 1), Notice::Returned(_)));
    let mut buggy = owner(lease(120, 0), Completions::FirstFrees, false);
    buggy.hold(0, 1, 6, 2);
    assert!(matches!(buggy.notice(S, 1), Notice::Returned(_)));
    assert_eq!(buggy.notice(2 * S, 1), Notice::Fault);
    // A notice for a request never held is not a fault.
    assert_eq!(buggy.notice(3 * S, 99), Notice::Ignored);
}

#[test]
fn an_observed_cancel_returns_the_blocks_where_the_stage_may() {
    let mut o = owner(lease(120, 0), Completions::Counted, true);
    o.hold(0, 1, 3, 1);
    let r = o.cancel(S, 1).unwrap();
    assert_eq!((r.blocks, r.why), (3, Why::Cancelled));
    assert_eq!(o.timer_ns(), None);
    assert!(o.expire(200 * S).is_empty());
    assert_eq!(o.notice(201 * S, 1), Notice::Ignored);
}

#[test]
fn a_lease_never_frees_blocks_under_a_live_transfer() {
    // A 1 s lease and a 10 s transfer: the lease stops while the blocks are read, and runs again,
    // whole, from the transfer's end.
    let mut o = owner(lease(1, 0), Completions::Counted, false);
    o.hold(0, 7, 4, 1);
    o.reading(7);
    assert_eq!(o.timer_ns(), None, "no lease runs under the transfer");
    assert!(o.expire(10 * S).is_empty());
    assert_eq!(o.read_done(10 * S, 7), ReadDone::Resumed);
    assert_eq!(o.deadline_ns(7), Some(11 * S));
    assert!(o.expire(11 * S - 1).is_empty());
    let back = o.expire(11 * S);
    assert_eq!(back.len(), 1);
    assert_eq!(back[0].why, Why::LeaseExpired);
    assert_eq!(o.block_ns(11 * S), 4 * 11 * S as u128);
    // A second end of the same transfer, or of one never started, does nothing.
    assert_eq!(o.read_done(12 * S, 7), ReadDone::Nothing);
}

#[test]
fn a_cancel_under_a_live_transfer_frees_at_its_end() {
    let mut o = owner(Reclaim::Never, Completions::Counted, true);
    o.hold(0, 1, 8, 1);
    o.reading(1);
    assert_eq!(o.cancel(S, 1), None, "still being read");
    assert_eq!(o.blocks_held(), 8);
    match o.read_done(3 * S, 1) {
        ReadDone::Returned(r) => assert_eq!((r.id, r.blocks, r.why), (1, 8, Why::Cancelled)),
        other => panic!("{other:?}"),
    }
    assert_eq!(o.blocks_held(), 0);
    assert_eq!(o.block_ns(3 * S), 8 * 3 * S as u128);
}

#[test]
fn the_ideal_release_frees_whatever_the_stage_rules() {
    // No release on a cancel, no lease: only the ideal cancel's release gives these back.
    let mut o = owner(Reclaim::Never, Completions::Counted, false);
    o.hold(0, 3, 5, 2);
    assert_eq!(o.cancel(S, 3), None);
    let r = o.release(2 * S, 3).expect("held");
    assert_eq!((r.blocks, r.why), (5, Why::Cancelled));
    assert_eq!(o.release(2 * S, 3), None, "once");
    assert_eq!(
        o.notice(3 * S, 3),
        Notice::Ignored,
        "a late notice finds nothing"
    );
}

use super::*;

const MS: u64 = 1_000_000;

/// 0.5 ms latency, 400 Gb/s (5e10 B/s).
fn link() -> Link {
    Link {
        latency_ns: MS / 2,
        bytes_per_s: 5e10,
        loss: 0.0,
    }
}

#[test]
fn a_transfer_lands_after_its_wire_time_and_the_latency() {
    let mut t = Transfers::new(link(), CancelMode::AtTransferEnd);
    // 50 MB at 5e10 B/s: 1 ms on the wire, then 0.5 ms latency.
    assert_eq!(t.start(0, 1, 50_000_000, 10, false), MS + MS / 2);
    assert_eq!(t.timer_ns(), Some(MS + MS / 2));
    assert!(t.land(MS).is_empty());
    assert_eq!(t.blocks_in_flight(), 10);
    let e = t.land(2 * MS);
    assert_eq!(
        e,
        [Ended {
            id: 1,
            end: End::Done,
            blocks: 10,
            took_ns: MS + MS / 2
        }]
    );
    assert_eq!(t.blocks_in_flight(), 0);
}

#[test]
fn transfers_share_one_wire_first_come_first_served() {
    let mut t = Transfers::new(link(), CancelMode::AtTransferEnd);
    assert_eq!(t.start(0, 1, 50_000_000, 1, false), 3 * MS / 2);
    // The second waits for the first's 1 ms on the wire.
    assert_eq!(t.start(0, 2, 50_000_000, 1, false), 5 * MS / 2);
    assert_eq!(t.stats().wait_ns, MS as u128);
    let ids: Vec<u64> = t.land(10 * MS).iter().map(|e| e.id).collect();
    assert_eq!(ids, [1, 2]);
}

/// splitmix64, for the arrival gaps.
fn next(state: &mut u64) -> f64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
}

#[test]
fn the_wire_is_an_m_d_1_queue_pollaczek_khinchine() {
    // Poisson transfers of one size: service D = 1 ms, load ρ = 0.7. Pollaczek–Khinchine for
    // M/D/1 gives the mean wait for the wire: Wq = ρ D / (2 (1 − ρ)) = 1.1667 ms.
    let d_s = 1e-3;
    let rho = 0.7;
    let rate_per_s = rho / d_s;
    let mut t = Transfers::new(link(), CancelMode::AtTransferEnd);
    let (mut now_ns, mut state) = (0u64, 7u64);
    let n = 400_000u64;
    for id in 0..n {
        now_ns += (-(1.0 - next(&mut state)).ln() / rate_per_s * 1e9) as u64;
        t.land(now_ns);
        t.start(now_ns, id, 50_000_000, 1, false);
    }
    let wq_s = t.stats().wait_ns as f64 / n as f64 / 1e9;
    let predicted = rho * d_s / (2.0 * (1.0 - rho));
    let err = (wq_s - predicted).abs() / predicted;
    println!("Wq {wq_s:.6} s against P-K {predicted:.6} s ({err:.4})");
    assert!(
        err < 0.05,
        "Wq {wq_s:.6} s against P-K {predicted:.6} s ({err:.3})"
    );
}

#[test]
fn a_cancel_ends_at_once_or_when_the_transfer_is_terminal() {
    let mut now = Transfers::new(link(), CancelMode::AtOnce);
    now.start(0, 1, 50_000_000, 4, false);
    let e = now.cancel(MS / 4, 1).unwrap();
    assert_eq!((e.end, e.blocks, e.took_ns), (End::Cancelled, 4, MS / 4));
    assert_eq!(now.timer_ns(), None);
    assert_eq!(now.cancel(MS, 1), None, "a second cancel finds nothing");
    let mut fenced = Transfers::new(link(), CancelMode::AtTransferEnd);
    fenced.start(0, 1, 50_000_000, 4, false);
    assert_eq!(fenced.cancel(MS / 4, 1), None);
    assert_eq!(fenced.blocks_in_flight(), 4, "held until terminal");
    let e = fenced.land(10 * MS);
    assert_eq!((e[0].end, e[0].took_ns), (End::Cancelled, 3 * MS / 2));
}

#[test]
fn a_lost_transfer_fails_when_it_would_have_landed() {
    let mut t = Transfers::new(link(), CancelMode::AtTransferEnd);
    t.start(0, 1, 50_000_000, 2, true);
    let e = t.land(10 * MS);
    assert_eq!(e[0].end, End::Failed);
    let s = t.stats();
    assert_eq!((s.started, s.done, s.failed, s.cancelled), (1, 0, 1, 0));
}

#[test]
fn the_ideal_stop_ends_a_transfer_now_whatever_the_mode() {
    let mut t = Transfers::new(link(), CancelMode::AtTransferEnd);
    t.start(0, 1, 50_000_000, 10, false);
    assert_eq!(t.cancel(MS / 2, 1), None, "AtTransferEnd lets it run");
    assert!(t.in_flight(1));
    let e = t.stop(MS, 1).expect("in flight");
    assert_eq!((e.end, e.took_ns, e.blocks), (End::Cancelled, MS, 10));
    assert!(!t.in_flight(1));
    assert!(t.land(10 * MS).is_empty(), "it never lands");
    assert_eq!(t.stop(MS, 1), None);
    assert_eq!(t.stats().cancelled, 1);
}

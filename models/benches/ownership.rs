//! Controller throughput: the op mix of one request's life (start, 8 output revisions each
//! followed by a two-phase admission, a barrier advance every 64 requests, a duplicate, a stale
//! update, finish, a late update), over many requests with bounded tombstones.
//!
//! `cargo bench -p cancelsim-models --bench ownership [-- REQUESTS REPS]`. Prints medians; the
//! last line is `ops_per_s=<x>` for u64 identities.

use std::hint::black_box;
use std::time::Instant;

use cancelsim_models::ownership::{
    Admission, Disposition, Identity, Owners, Retention, UpdateClass,
};

fn life<K: Identity>(o: &mut Owners<K>, id: K, i: u64, payloads: &[Vec<u8>]) -> u64 {
    let mut ops = 0;
    o.start(id.clone(), 1).unwrap();
    ops += 1;
    for rev in 0..8u64 {
        let p = &payloads[(rev as usize + i as usize) % payloads.len()];
        let c = o.update(&id, rev, p, rev == 7).unwrap();
        debug_assert_eq!(c, UpdateClass::Accepted);
        let t = o.admit_begin(id.clone(), 1, 0.0, 1e9).unwrap();
        let a = o.admit_end(&t, 1.0).unwrap();
        debug_assert!(matches!(a, Admission::Submitted(_) | Admission::Blocked));
        ops += 3;
    }
    if i % 64 == 0 {
        o.barrier_advance();
        ops += 1;
    }
    black_box(
        o.update(&id, 7, &payloads[(7 + i as usize) % payloads.len()], true)
            .unwrap(),
    );
    black_box(o.update(&id, 3, b"old", false).unwrap());
    o.finish(&id, Disposition::Completed).unwrap();
    black_box(o.update(&id, 9, b"late", false).unwrap());
    ops + 4
}

fn bench<K: Identity>(requests: u64, mk: impl Fn(u64) -> K) -> f64 {
    let payloads: Vec<Vec<u8>> = (0..16).map(|i| vec![b'a' + i as u8; 48]).collect();
    let mut o: Owners<K> = Owners::new(Retention {
        tombstones_max: 4096,
        tombstone_age_ns_max: None,
        evicted_max: usize::MAX,
        until_retired: false,
    });
    let ids: Vec<K> = (0..requests).map(&mk).collect();
    let start = Instant::now();
    let mut ops = 0u64;
    for (i, id) in ids.into_iter().enumerate() {
        ops += life(&mut o, id, i as u64, &payloads);
    }
    let secs = start.elapsed().as_secs_f64();
    black_box(o.evictions());
    ops as f64 / secs
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let requests: u64 = args.first().and_then(|a| a.parse().ok()).unwrap_or(200_000);
    let reps: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(5);
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for _ in 0..reps {
        a.push(bench(requests, |i| i));
        b.push(bench(requests, |i| format!("req-{i:08}")));
    }
    let (a, b) = (median(a), median(b));
    println!("ownership controller, {requests} request lives per repetition, median of {reps}");
    println!("u64 identities:    {:>6.2} M ops/s", a / 1e6);
    println!("string identities: {:>6.2} M ops/s", b / 1e6);
    println!("ops_per_s={a:.0}");
}

//! Hold-model benchmark of the kernel against a bare `BinaryHeap<Reverse<(u64, u64)>>`.
//!
//! Each iteration pops the earliest event and pushes one at `now + Exp(mean 1 ms)`. The kernel
//! does its full work per event: limits, clock, class-packed key and the run hash. Both loops
//! draw delays from the same sampler, so the ratio isolates the queue machinery.
//!
//! `cargo bench -p cancelsim --bench kernel [-- EVENTS REPS]`. The last line is
//! `ratio_vs_bare_heap=<x>` at queue size 1,000 (medians of interleaved repetitions).

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::hint::black_box;
use std::time::Instant;

use cancelsim::dist::round_ns;
use cancelsim::kernel::rng::{Purpose, Stream};
use cancelsim::kernel::{Class, Kernel, Limits, Traced};

const MEAN_NS: f64 = 1_000_000.0;

#[derive(Clone, Copy)]
struct Hold(u64);

impl Traced for Hold {
    fn kind_code(&self) -> u8 {
        1
    }
    fn entity(&self) -> u64 {
        self.0
    }
}

fn kernel_hold(queue_len: u64, events: u64) -> (f64, u64) {
    let mut rng = Stream::new(42, Purpose::Bench, queue_len);
    let mut k = Kernel::new(Limits {
        events_max: u64::MAX,
        time_ns_max: u64::MAX,
        queue_len_max: u64::MAX,
    });
    for i in 0..queue_len {
        k.schedule_at(round_ns(rng.exponential(MEAN_NS)), Class::Control, Hold(i))
            .unwrap();
    }
    let start = Instant::now();
    let mut acc = 0u64;
    for _ in 0..events {
        let Hold(e) = k.next_event().unwrap().unwrap();
        acc = acc.wrapping_add(e ^ k.now_ns());
        k.schedule_in(round_ns(rng.exponential(MEAN_NS)), Class::Control, Hold(e))
            .unwrap();
    }
    let secs = start.elapsed().as_secs_f64();
    black_box(k.run_hash());
    (events as f64 / secs, acc)
}

fn bare_hold(queue_len: u64, events: u64) -> (f64, u64) {
    let mut rng = Stream::new(42, Purpose::Bench, queue_len);
    let mut heap = BinaryHeap::with_capacity(1024);
    let mut seq = 0u64;
    for _ in 0..queue_len {
        heap.push(Reverse((round_ns(rng.exponential(MEAN_NS)), seq)));
        seq += 1;
    }
    let start = Instant::now();
    let mut acc = 0u64;
    for _ in 0..events {
        let Reverse((t, s)) = heap.pop().unwrap();
        acc = acc.wrapping_add(s ^ t);
        heap.push(Reverse((t + round_ns(rng.exponential(MEAN_NS)), seq)));
        seq += 1;
    }
    let secs = start.elapsed().as_secs_f64();
    (events as f64 / secs, acc)
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
    let events: u64 = args
        .first()
        .and_then(|a| a.parse().ok())
        .unwrap_or(5_000_000);
    let reps: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(5);
    println!("hold model: {events} events per repetition, {reps} interleaved repetitions, medians");
    let mut ratio_1k = 0.0;
    for queue_len in [1_000u64, 100_000] {
        let (mut k, mut b) = (Vec::new(), Vec::new());
        for _ in 0..reps {
            k.push(black_box(kernel_hold(queue_len, events)).0);
            b.push(black_box(bare_hold(queue_len, events)).0);
        }
        let (km, bm) = (median(k), median(b));
        println!(
            "queue_len={queue_len:>7}  kernel {:>6.2} M events/s  bare BinaryHeap {:>6.2} M events/s  ratio {:.3}",
            km / 1e6,
            bm / 1e6,
            km / bm
        );
        if queue_len == 1_000 {
            ratio_1k = km / bm;
        }
    }
    println!("ratio_vs_bare_heap={ratio_1k:.3}");
}

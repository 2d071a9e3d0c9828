use super::*;

/// Every pending event, in the order popped.
fn drained<E: Copy>(q: &mut EventQueue<E>) -> Vec<E> {
    std::iter::from_fn(|| q.pop().map(|(_, e)| e)).collect()
}

#[test]
fn ties_run_in_insertion_order() {
    let mut q = EventQueue::new();
    for i in 0..100u32 {
        q.push(5, Class::Control, i);
    }
    q.push(4, Class::Control, 1000);
    assert_eq!(q.pop().map(|(_, e)| e), Some(1000));
    for i in 0..100u32 {
        let (key, e) = q.pop().unwrap();
        assert_eq!(e, i);
        assert_eq!(key.time_ns, 5);
    }
    assert!(q.pop().is_none());
}

#[test]
fn pops_in_the_order_a_sorted_reference_gives() {
    // Random holds (pushes at or after the last pop, every class, ties of time) against
    // `std`'s heap over the same keys: the same sequence, entry for entry.
    use std::cmp::Reverse;
    let mut q = EventQueue::new();
    let mut reference = std::collections::BinaryHeap::new();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let classes = [
        Class::Completion,
        Class::Control,
        Class::Arrival,
        Class::Schedule,
    ];
    let mut now = 0u64;
    for i in 0..20_000u64 {
        let r = next();
        if r % 3 != 0 || q.is_empty() {
            let t = now + (r >> 8) % 5; // many ties
            let key = q.push(t, classes[(r % 4) as usize], i);
            reference.push(Reverse((key.time_ns, key.order, i)));
        } else {
            let (key, e) = q.pop().unwrap();
            let Reverse((t, order, j)) = reference.pop().unwrap();
            assert_eq!((key.time_ns, key.order, e), (t, order, j));
            now = t;
        }
    }
    while let Some((key, e)) = q.pop() {
        let Reverse((t, order, j)) = reference.pop().unwrap();
        assert_eq!((key.time_ns, key.order, e), (t, order, j));
    }
    assert!(reference.is_empty());
}

#[test]
fn times_across_every_digit_pop_in_order() {
    // Delays from 0 to 2^63 ns, so entries are filed at every digit position and refiled
    // down through them, with ties at the current tick pushed in between: the same
    // sequence as `std`'s heap, entry for entry, up to times near `u64::MAX`.
    use std::cmp::Reverse;
    let mut q = EventQueue::new();
    let mut reference = std::collections::BinaryHeap::new();
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut now = 0u64;
    for i in 0..50_000u64 {
        let r = next();
        if r % 5 < 3 || q.is_empty() {
            let delay = match r % 4 {
                0 => 0,
                _ => (r >> 1) >> ((r >> 8) % 63),
            };
            let class = [Class::Completion, Class::Schedule][(r >> 7) as usize % 2];
            let key = q.push(now.saturating_add(delay), class, i);
            reference.push(Reverse((key.time_ns, key.order, i)));
        } else {
            let (key, e) = q.pop().unwrap();
            assert_eq!(
                Reverse((key.time_ns, key.order, e)),
                reference.pop().unwrap()
            );
            now = key.time_ns;
        }
        assert_eq!(q.len(), reference.len());
    }
    let key = q.push(u64::MAX, Class::Control, u64::MAX);
    reference.push(Reverse((key.time_ns, key.order, u64::MAX)));
    while let Some((key, e)) = q.pop() {
        assert_eq!(
            Reverse((key.time_ns, key.order, e)),
            reference.pop().unwrap()
        );
    }
    assert!(reference.is_empty() && q.is_empty());
}

#[test]
fn an_emptied_bucket_gives_its_room_back() {
    // A thousand entries pending while the clock walks 200 values of a high digit (4.3 s
    // each): every bucket they pass through holds all of them once. What the buckets keep
    // afterwards is bounded by their count, not by how far the clock went (it was 200
    // buckets of 1,024 entries when each kept the most it ever held).
    let mut q = EventQueue::new();
    let digit_ns = 1u64 << 32;
    for round in 0..200u64 {
        let base_ns = round * digit_ns;
        for i in 0..1000u64 {
            q.push(base_ns + digit_ns / 2 + i, Class::Control, i);
        }
        for i in 0..1000u64 {
            let (key, e) = q.pop().expect("pending");
            assert_eq!((key.time_ns, e), (base_ns + digit_ns / 2 + i, i));
        }
    }
    assert!(q.is_empty());
    let kept: usize = q.heap.buckets.iter().flatten().map(Vec::capacity).sum();
    assert!(
        kept <= POSITIONS * DIGITS * BUCKET_KEPT,
        "the buckets keep room for {kept} entries"
    );
}

#[test]
fn an_entry_is_its_rank_and_its_event() {
    // An event the size of the run's (32 bytes) makes a 48-byte entry: no flag beside it.
    assert_eq!(std::mem::size_of::<Entry<[u64; 4]>>(), 48);
    for (time_ns, class, seq, weak) in [
        (0, Class::Completion, 0, false),
        (7, Class::Schedule, SEQ_MAX, true),
        (u64::MAX, Class::Arrival, 12345, true),
    ] {
        let key = Key {
            time_ns,
            order: ((class as u64) << CLASS_SHIFT) | seq,
        };
        let e = Entry {
            rank: key.rank(weak),
            event: (),
        };
        assert_eq!((Key::of(e.rank), e.weak()), (key, weak));
    }
}

#[test]
fn the_front_entry_gives_way_to_an_earlier_one() {
    // Each push is the earliest so far: each takes the front, and the one it displaced
    // goes to the heap, still before everything there.
    let mut q = EventQueue::new();
    q.push(50, Class::Control, "c");
    q.push(40, Class::Control, "b");
    q.push(40, Class::Completion, "a");
    q.push(60, Class::Control, "d");
    assert_eq!((q.len(), q.peek_time_ns()), (4, Some(40)));
    assert_eq!(drained(&mut q), ["a", "b", "c", "d"]);
    assert!(q.is_empty());
}

#[test]
fn class_orders_within_a_tick_but_never_across_ticks() {
    let mut q = EventQueue::new();
    q.push(10, Class::Schedule, "sched@10");
    q.push(10, Class::Arrival, "arrival@10");
    q.push(10, Class::Control, "cancel@10");
    q.push(10, Class::Completion, "step_end@10");
    q.push(9, Class::Schedule, "sched@9");
    assert_eq!(
        drained(&mut q),
        [
            "sched@9",
            "step_end@10",
            "cancel@10",
            "arrival@10",
            "sched@10"
        ]
    );
}

#[test]
fn the_earliest_time_read_ahead_still_lets_an_earlier_push_in() {
    // A coast reads the next event's time, then may push before it (`Kernel::next_time_ns`).
    let mut q = EventQueue::new();
    q.push(10, Class::Control, "a");
    q.push(300, Class::Control, "d");
    q.push(700, Class::Control, "e");
    assert_eq!(q.pop().map(|(k, e)| (k.time_ns, e)), Some((10, "a")));
    assert_eq!(q.min_time_ns(), Some(300));
    q.push(200, Class::Control, "c");
    q.push(20, Class::Control, "b");
    assert_eq!(q.min_time_ns(), Some(20));
    assert_eq!(drained(&mut q), ["b", "c", "d", "e"]);
    assert_eq!(q.min_time_ns(), None);
}

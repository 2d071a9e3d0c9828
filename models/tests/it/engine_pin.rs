//! Blocks lent outside the engine with a prompt's cached run held through the prefix cache
//! (`pin_cached`): what a prefilled request keeps for its transfer, and what a decode replica
//! that has the prefix cached receives into. Checked against counts made by hand.

use cancelsim_models::engine::Engine;
use cancelsim_models::prefix::{Content, Sharing};
use cancelsim_models::protocol::{Outbox, Scheduler};

use crate::driver::{cfg, req};

/// The keys of the first `n` 16-token blocks of a prompt of `prompt` tokens whose first 64
/// tokens are the shared block id 7.
fn keys(prompt: u64, n: u64) -> Vec<u64> {
    let content = Content {
        own: 0,
        prompt_tokens: prompt,
        sharing: Some(Box::new(Sharing::new(&[7], 64, None))),
    };
    (0..n).map(|i| content.key(16, i)).collect()
}

/// An engine of 20 blocks that ran one 65-token request sharing block id 7: its first four
/// blocks are cached, free, evictable.
fn warm() -> Engine {
    let mut c = cfg(1);
    c.prefix_caching = true;
    c.kv_blocks = 20;
    let mut e = Engine::new(c);
    let mut out = Outbox::default();
    e.enqueue(0, req(1, 65, 1)).unwrap();
    Scheduler::share_prefix(&mut e, 1, &[7], 64);
    let mut now = 0;
    for _ in 0..100 {
        e.checkpoint(now, &mut out);
        let Some(d) = e.dispatch(now, &mut out) else {
            break;
        };
        now = d.end_ns;
        e.step_done(now, d.step, &mut out);
    }
    assert!(e.is_idle());
    assert_eq!(e.kv().free_blocks(), 20);
    e
}

#[test]
fn a_cached_run_is_held_once_per_holder_and_never_evicted_while_held() {
    let mut e = warm();
    let k = keys(65, 4);
    // Five blocks for a 65-token prompt: the four cached ones are taken back, one is new.
    assert_eq!(e.pin_cached(&k, 5), Some(4));
    assert_eq!(e.kv().free_blocks(), 15);
    // A second holder of the same prompt shares the four: one new block more.
    assert_eq!(e.pin_cached(&k, 5), Some(4));
    assert_eq!(e.kv().free_blocks(), 14);
    // More than is free: refused, nothing taken.
    assert_eq!(e.pin_cached(&k, 100), None);
    assert_eq!(e.kv().free_blocks(), 14);
    // Taking every free block evicts nothing held.
    assert!(e.pin(14));
    assert_eq!(e.pin_cached(&k, 4), Some(4), "still cached");
    assert!(!e.pin(1));
    e.unpin(14);
    e.unpin_cached(&k, 4);
    // A miss in the middle ends the run: only the leading one counts.
    let mut gap = k.clone();
    gap[1] = 12345;
    assert_eq!(e.pin_cached(&gap, 5), Some(1));
    e.unpin_cached(&gap[..1], 5);
    // Back: both holders let go, and the pool has every block again, the four still cached.
    e.unpin_cached(&k, 5);
    assert_eq!(e.kv().free_blocks(), 15);
    e.unpin_cached(&k, 5);
    assert_eq!(e.kv().free_blocks(), 20);
    assert_eq!(e.pin_cached(&k, 4), Some(4), "the content kept");
    e.unpin_cached(&k, 4);
    assert_eq!(e.pinned_blocks(), 0);
    let kv = e.kv();
    assert_eq!(kv.allocated_total(), kv.freed_total() + kv.in_use());
    assert_eq!(kv.in_use(), 0);
}

#[test]
fn without_a_prefix_cache_pin_cached_is_pin() {
    let mut e = Engine::new(cfg(1));
    assert_eq!(e.pin_cached(&keys(65, 4), 5), Some(0));
    assert_eq!(e.kv().free_blocks(), 995);
    e.unpin_cached(&[], 5);
    assert_eq!(e.kv().free_blocks(), 1000);
}

#[test]
#[should_panic(expected = "more blocks held than pinned")]
fn giving_back_more_held_than_pinned_is_a_bug() {
    let mut e = warm();
    let k = keys(65, 4);
    assert_eq!(e.pin_cached(&k, 4), Some(4));
    e.unpin_cached(&k, 3);
}

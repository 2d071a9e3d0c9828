//! The prefix cache against a plain model of its contract: blocks no request holds are evicted
//! oldest-freed first, and only once the pool's blocks without content run out. The model keeps
//! its free cached blocks in an ordered map by the time they were freed; the cache keeps them in
//! a ring it sweeps lazily, so long random runs (many hits, many sweeps) must agree step by step.

use std::collections::BTreeMap;

use cancelsim_models::kv::KvPool;
use cancelsim_models::prefix::PrefixCache;
use proptest::prelude::*;

const KEYS: u64 = 24;

#[derive(Clone, Debug)]
enum Op {
    /// A request computes block `key` in a block it takes.
    Compute(u64),
    /// A request finds `key` cached and holds it.
    Hit(u64),
    /// A holder lets go of its `i`-th held block.
    Release(usize),
    /// Blocks taken for content of no one's to share, and given back.
    Plain(u64),
    PlainBack,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..KEYS).prop_map(Op::Compute),
        4 => (0..KEYS).prop_map(Op::Hit),
        4 => any::<usize>().prop_map(Op::Release),
        1 => (1..4u64).prop_map(Op::Plain),
        1 => Just(Op::PlainBack),
    ]
}

/// The contract, written the obvious way.
#[derive(Default)]
struct Model {
    /// key -> (holders, when it was last freed)
    cached: BTreeMap<u64, (u32, u64)>,
    free_cached: BTreeMap<u64, u64>,
    clock: u64,
    free: u64,
    evictions: u64,
    /// Keys whose presence or freeness changed, in order.
    changes: Vec<u64>,
}

impl Model {
    fn alloc(&mut self, n: u64) -> bool {
        if self.free < n {
            return false;
        }
        let clean = self.free - self.free_cached.len() as u64;
        for _ in clean..n {
            let (_, key) = self.free_cached.pop_first().unwrap();
            self.cached.remove(&key);
            self.evictions += 1;
            self.changes.push(key);
        }
        self.free -= n;
        true
    }

    fn register(&mut self, key: u64) -> bool {
        if self.cached.contains_key(&key) {
            return false;
        }
        self.cached.insert(key, (1, 0));
        self.changes.push(key);
        true
    }

    fn hit(&mut self, key: u64) {
        let c = self.cached.get_mut(&key).unwrap();
        c.0 += 1;
        if c.0 == 1 {
            self.free_cached.remove(&c.1);
            self.free -= 1;
            self.changes.push(key);
        }
    }

    fn release(&mut self, key: u64) {
        let c = self.cached.get_mut(&key).unwrap();
        c.0 -= 1;
        if c.0 == 0 {
            c.1 = self.clock;
            self.clock += 1;
            self.free_cached.insert(c.1, key);
            self.free += 1;
            self.changes.push(key);
        }
    }
}

fn run(blocks: u64, ops: &[Op]) -> Result<(), TestCaseError> {
    let mut kv = KvPool::new(blocks, 16);
    let mut cache = PrefixCache::default();
    cache.watch(true);
    let mut model = Model {
        free: blocks,
        ..Model::default()
    };
    let (mut held, mut plain) = (Vec::new(), 0u64);
    let mut changes = Vec::new();
    for (step, op) in ops.iter().enumerate() {
        match *op {
            Op::Compute(key) => {
                let ok = cache.alloc(&mut kv, 1);
                prop_assert_eq!(ok, model.alloc(1), "alloc at {}", step);
                if ok {
                    let fresh = cache.register(key);
                    prop_assert_eq!(fresh, model.register(key));
                    if fresh {
                        held.push(key);
                    } else {
                        kv.free(1);
                        model.free += 1;
                    }
                }
            }
            Op::Hit(key) if cache.contains(key) => {
                cache.hit(&mut kv, key);
                model.hit(key);
                held.push(key);
            }
            Op::Hit(_) => {}
            Op::Release(i) if !held.is_empty() => {
                let key = held.swap_remove(i % held.len());
                cache.release(&mut kv, key);
                model.release(key);
            }
            Op::Release(_) => {}
            Op::Plain(n) => {
                let ok = cache.alloc(&mut kv, n);
                prop_assert_eq!(ok, model.alloc(n), "plain alloc at {}", step);
                plain += if ok { n } else { 0 };
            }
            Op::PlainBack => {
                kv.free(plain);
                model.free += plain;
                plain = 0;
            }
        }
        prop_assert_eq!(kv.free_blocks(), model.free, "free blocks at {}", step);
        prop_assert_eq!(cache.evictable(), model.free_cached.len() as u64);
        prop_assert_eq!(cache.stats.evictions, model.evictions);
        for key in 0..KEYS {
            let m = model.cached.get(&key);
            prop_assert_eq!(cache.contains(key), m.is_some(), "key {} at {}", key, step);
            prop_assert_eq!(cache.is_free(key), m.is_some_and(|c| c.0 == 0));
        }
        prop_assert!(cache.take_changes(&mut changes).is_some());
        prop_assert_eq!(&changes, &model.changes, "changes at {}", step);
        model.changes.clear();
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Long runs: thousands of hits leave stale ring entries. In a pool of 12 blocks evictions
    /// are common; in one of 40, room for every key, they are rare and the ring is swept.
    #[test]
    fn the_cache_evicts_what_the_contract_says(
        blocks in prop_oneof![Just(12u64), Just(40)],
        ops in prop::collection::vec(op(), 4_000..8_000),
    ) {
        run(blocks, &ops)?;
    }
}

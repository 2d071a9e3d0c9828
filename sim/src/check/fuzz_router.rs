//! The fuzzer's KV-aware routers: drawn last, from a stream of their own, onto worlds whose
//! caches a router can look into.

use super::draw::Draw;
use super::fuzz::Tier;
use crate::kernel::rng::{Purpose, Stream};
use crate::scenario::{Router, Scenario};

/// Half the worlds whose caches a router can look into get a KV-aware router. Its draws come
/// from a stream of their own, so every world drawn before it existed stays what it was.
pub(super) fn kv_router(s: &mut Scenario, tier: Tier) {
    if matches!(s.cluster.router, Router::SharedQueue { .. }) {
        return;
    }
    let mut d = Draw {
        s: Stream::new(s.seed, Purpose::Fuzz, KV_ROUTER_SUBKEY + tier as u64),
    };
    if !d.chance(0.5) {
        return;
    }
    let was = s.cluster.router;
    let (overlap_weight, load_weight) = (d.int(0, 8) as u32, d.int(0, 400) as u32);
    let some_lag = d.int(1, 1_000_000) as u32;
    s.cluster.router = Router::KvAware {
        overlap_weight,
        load_weight,
        lag_us: d.pick(&[0, some_lag]),
    };
    if s.validate().is_err() {
        s.cluster.router = was;
    }
}

/// The KV router's draw stream: `Purpose::Fuzz` with this plus the tier.
const KV_ROUTER_SUBKEY: u64 = 0x4b56_0000;

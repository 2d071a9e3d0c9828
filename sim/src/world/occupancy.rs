//! Little's L, measured: the slab's occupancy over virtual time, apart from the books' λ and W.

/// The integral of a count over virtual time, advanced before each event (the count is constant
/// between events).
#[derive(Default)]
pub(super) struct Occupancy {
    last_ns: u64,
    pub(super) area_ns: u128,
}

impl Occupancy {
    pub(super) fn advance(&mut self, now_ns: u64, count: u64) {
        self.area_ns += (now_ns - self.last_ns) as u128 * count as u128;
        self.last_ns = now_ns;
    }
}

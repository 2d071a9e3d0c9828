//! The paged KV-cache allocator of one replica: fixed-size blocks of `block_tokens` tokens.
//!
//! It only counts blocks: which physical block holds what does not change any metric. It keeps
//! conservation counters, so every run can check `allocated = freed + in use`.

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvPool {
    block_tokens: u32,
    capacity_blocks: u64,
    free_blocks: u64,
    allocated_total: u64,
    freed_total: u64,
    in_use_max: u64,
}

impl KvPool {
    pub fn new(capacity_blocks: u64, block_tokens: u32) -> Self {
        assert!(capacity_blocks > 0 && block_tokens > 0);
        KvPool {
            block_tokens,
            capacity_blocks,
            free_blocks: capacity_blocks,
            allocated_total: 0,
            freed_total: 0,
            in_use_max: 0,
        }
    }

    /// Blocks needed to hold `tokens` tokens.
    #[inline]
    pub fn blocks_for(&self, tokens: u64) -> u64 {
        tokens.div_ceil(self.block_tokens as u64)
    }

    /// Take `n` blocks, or nothing.
    #[inline]
    pub fn try_alloc(&mut self, n: u64) -> bool {
        if n > self.free_blocks {
            return false;
        }
        self.free_blocks -= n;
        self.allocated_total += n;
        self.in_use_max = self.in_use_max.max(self.in_use());
        true
    }

    #[inline]
    pub fn free(&mut self, n: u64) {
        assert!(
            n <= self.in_use(),
            "freeing {n} blocks with {} in use",
            self.in_use()
        );
        self.free_blocks += n;
        self.freed_total += n;
    }

    pub fn in_use(&self) -> u64 {
        self.capacity_blocks - self.free_blocks
    }

    pub fn free_blocks(&self) -> u64 {
        self.free_blocks
    }

    pub fn capacity_blocks(&self) -> u64 {
        self.capacity_blocks
    }

    pub fn block_tokens(&self) -> u32 {
        self.block_tokens
    }

    pub fn allocated_total(&self) -> u64 {
        self.allocated_total
    }

    pub fn freed_total(&self) -> u64 {
        self.freed_total
    }

    pub fn in_use_max(&self) -> u64 {
        self.in_use_max
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocation_is_all_or_nothing_and_conserved() {
        let mut kv = KvPool::new(10, 16);
        assert_eq!(kv.blocks_for(0), 0);
        assert_eq!(kv.blocks_for(16), 1);
        assert_eq!(kv.blocks_for(17), 2);
        assert!(kv.try_alloc(7));
        assert!(!kv.try_alloc(4), "only 3 left");
        assert_eq!(kv.free_blocks(), 3);
        kv.free(5);
        assert!(kv.try_alloc(8));
        assert_eq!(kv.allocated_total(), kv.freed_total() + kv.in_use());
        assert_eq!(kv.in_use_max(), 10);
    }

    #[test]
    #[should_panic(expected = "freeing")]
    fn freeing_more_than_in_use_is_a_bug() {
        let mut kv = KvPool::new(4, 16);
        kv.try_alloc(1);
        kv.free(2);
    }
}

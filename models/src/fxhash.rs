//! A fast, deterministic, non-cryptographic hasher for lookup-only maps keyed by ids.
//!
//! The standard SipHash costs more than the work it guards on the per-chunk path. No map hashed
//! with this is ever iterated into an output, so the hash function cannot change a result; and
//! its keys are the simulator's own ids, so collision attacks are not a concern.

use std::hash::{BuildHasherDefault, Hasher};

/// The Firefox/rustc "Fx" hash: one rotate, xor and multiply per word.
#[derive(Clone, Copy, Default)]
pub struct FxHasher {
    hash: u64,
}

const K: u64 = 0x517c_c1b7_2722_0a95;

impl FxHasher {
    #[inline]
    fn add(&mut self, word: u64) {
        self.hash = (self.hash.rotate_left(5) ^ word).wrapping_mul(K);
    }
}

impl Hasher for FxHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            self.add(u64::from_le_bytes(c.try_into().expect("8 bytes")));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut w = [0u8; 8];
            w[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(w));
        }
    }

    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.add(i as u64);
    }

    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.add(i as u64);
    }

    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }

    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }

    #[inline]
    fn finish(&self) -> u64 {
        self.hash
    }
}

pub type FxBuildHasher = BuildHasherDefault<FxHasher>;
pub type FxHashMap<K, V> = std::collections::HashMap<K, V, FxBuildHasher>;
pub type FxHashSet<K> = std::collections::HashSet<K, FxBuildHasher>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::Hash;

    fn h(x: impl Hash) -> u64 {
        let mut s = FxHasher::default();
        x.hash(&mut s);
        s.finish()
    }

    #[test]
    fn distinct_keys_hash_apart_and_equal_keys_alike() {
        assert_eq!(h(42u64), h(42u64));
        assert_ne!(h(1u64), h(2u64));
        assert_ne!(h("req-1"), h("req-12"));
        assert_eq!(h("a-longer-string-key"), h("a-longer-string-key"));
    }
}

//! Keyed random streams and portable samplers.
//!
//! Every stream is keyed by `(run seed, purpose, entity id)`: the ChaCha8 key is the BLAKE3 hash
//! of those three little-endian words. A request's draws therefore never depend on how many draws
//! any other entity made, which is what makes runs of two policies (or a run and its
//! counterfactual) see the same workload: common random numbers.
//!
//! Samplers use only integer arithmetic, IEEE basic operations (+ - * / sqrt, which are correctly
//! rounded everywhere) and the pure-Rust `libm` crate for `log`, `exp` and `cos`. They never call
//! the platform's `f64::ln`/`exp`, whose precision is unspecified.

use rand_chacha::rand_core::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Why a stream exists. The discriminant is part of the key: never renumber a variant, append.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u64)]
pub enum Purpose {
    /// Inter-arrival gaps of one arrival process (entity = process index).
    Arrival = 1,
    /// A request's own shape: prompt and output lengths, service demand (entity = request id).
    RequestShape = 2,
    /// Kernel benchmarks and tests.
    Bench = 3,
    /// A request's deadline and disconnect times (entity = request id).
    RequestTiming = 4,
    /// Whether a trace row is kept when sampling a fraction (entity = row index).
    TraceSample = 5,
    /// A conversation's turn count and per-turn draws (entity = conversation << 20 | turn).
    Conversation = 6,
    /// Whether a request is a storm target, its stage and delay (entity = request id).
    CancelPlan = 7,
    /// One cancel RPC attempt's loss, latency and duplication (entity = request id, sub =
    /// attempt), and its acknowledgement's latency.
    CancelRpc = 8,
    /// Whether handling one abort faults (entity = request id, sub = attempt).
    AbortFault = 9,
    /// Playback waits and clear acknowledgements (entity = request or owner id, sub = counter).
    Playback = 10,
    /// Swarm testing's draw of a scenario's parameters (entity 0, keyed by the swarm seed).
    Swarm = 11,
    /// The scenario fuzzer's draw of a whole scenario (entity = tier, keyed by the fuzz seed).
    Fuzz = 12,
    /// The loss of one message of a prefill/decode handoff (entity = request id, sub = which
    /// message, `key::NOTICE_*`).
    Handoff = 13,
}

/// Entity and sub-key values that name one stream among an entity's several. Part of the key
/// like `Purpose`: never change a value, append.
pub mod key {
    /// `Arrival` entity of the open-loop process.
    pub const OPEN_LOOP: u64 = 0;
    /// `Arrival` entity of the conversation-start process.
    pub const CONVERSATION_STARTS: u64 = 1;
    /// `Conversation` entity of one turn's draws is `conv << TURN_SHIFT | turn`.
    pub const TURN_SHIFT: u32 = 20;
    /// `Conversation` "turn" of the conversation's turn count (no real turn reaches it).
    pub const TURN_COUNT: u64 = 0xF_FFFF;
    /// `CancelRpc` sub-key of the adapter's submission delay (attempts use `attempt + 1`).
    pub const SUBMIT_DELAY: u64 = 1 << 20;
    /// `Handoff` sub-key: the decode side's completion notice to the prefill side.
    pub const NOTICE_TO_PREFILL: u64 = 1;
    /// `Handoff` sub-key: the receive completion of a request the decode side aborted.
    pub const NOTICE_RECEIVED: u64 = 2;
    /// `Handoff` sub-key: the send completion, the second notice a decode-side hold may get.
    pub const NOTICE_SENT: u64 = 3;
    /// `Handoff` sub-key: the router's or the decode side's cancel notice to the prefill side.
    pub const NOTICE_CANCEL: u64 = 4;
    /// `Handoff` sub-key: whether cancelling the request's transfer wedges its sender.
    pub const WEDGE: u64 = 5;
    /// `Handoff` sub-key: whether the request's KV transfer fails.
    pub const TRANSFER_FAILS: u64 = 6;
    /// `RequestShape` sub-key: how the request's output ends (a stop token or its `max_tokens`).
    pub const FINISH_KIND: u64 = 7;
    /// `RequestShape` sub-key: whether the output ends at a stop string, and its detection delay.
    pub const STOP_STRING: u64 = 8;
    /// `CancelRpc` sub-key of the acknowledgement's latency after a backend observation.
    pub const ACK_LATENCY: u64 = 1 << 21;
    /// `Playback` entity flag of a request's blocked-admission retries (`id ^ RETRY_FLAG`,
    /// sub-key `retry + 1`); without it, the entity is the request (writer waits) or the owner
    /// (clear acknowledgements, sub-key = epoch).
    pub const RETRY_FLAG: u64 = 1 << 63;
}

/// One keyed random stream.
#[derive(Clone)]
pub struct Stream {
    rng: ChaCha8Rng,
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Stream")
    }
}

impl Stream {
    pub fn new(seed: u64, purpose: Purpose, entity: u64) -> Self {
        Self::keyed(seed, purpose, entity, 0)
    }

    /// A stream keyed by `(seed, purpose, entity, sub)`, for entities that need several
    /// independent streams (one per attempt, say). `sub` = 0 is the same stream as `new`.
    pub fn keyed(seed: u64, purpose: Purpose, entity: u64, sub: u64) -> Self {
        let mut material = [0u8; 40];
        material[..8].copy_from_slice(b"cnclsim1");
        material[8..16].copy_from_slice(&seed.to_le_bytes());
        material[16..24].copy_from_slice(&(purpose as u64).to_le_bytes());
        material[24..32].copy_from_slice(&entity.to_le_bytes());
        material[32..40].copy_from_slice(&sub.to_le_bytes());
        let len = if sub == 0 { 32 } else { 40 };
        let key: [u8; 32] = *blake3::hash(&material[..len]).as_bytes();
        Stream {
            rng: ChaCha8Rng::from_seed(key),
        }
    }

    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.rng.next_u64()
    }

    /// Uniform on the open interval (0, 1), with 53 bits of resolution. Never 0, so `log(u)` is
    /// finite; never 1, so `log(1 - u)` is too.
    #[inline]
    pub fn uniform_open01(&mut self) -> f64 {
        let bits = self.next_u64() >> 11; // 53 bits
        (bits as f64 + 0.5) * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform integer in `0..n`, by the multiply-shift method (bias below 2^-64 · n).
    #[inline]
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0);
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }

    /// Exponential with the given mean.
    #[inline]
    pub fn exponential(&mut self, mean: f64) -> f64 {
        debug_assert!(mean.is_finite() && mean >= 0.0);
        -mean * libm::log(self.uniform_open01())
    }

    /// Standard normal by Box–Muller (one value per call; two uniforms).
    pub fn standard_normal(&mut self) -> f64 {
        let u1 = self.uniform_open01();
        let u2 = self.uniform_open01();
        (-2.0 * libm::log(u1)).sqrt() * libm::cos(std::f64::consts::TAU * u2)
    }

    /// Lognormal with the given median and shape `sigma` (the standard deviation of its log).
    pub fn lognormal(&mut self, median: f64, sigma: f64) -> f64 {
        median * libm::exp(sigma * self.standard_normal())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_are_keyed_not_ordered() {
        // Interleaving draws of other entities must not change an entity's sequence.
        let alone: Vec<u64> = {
            let mut s = Stream::new(7, Purpose::RequestShape, 3);
            (0..16).map(|_| s.next_u64()).collect()
        };
        let mut others: Vec<Stream> = (0..10)
            .map(|e| Stream::new(7, Purpose::RequestShape, e))
            .collect();
        let mut mixed = Vec::new();
        for _ in 0..16 {
            for (e, s) in others.iter_mut().enumerate() {
                let x = s.next_u64();
                if e == 3 {
                    mixed.push(x);
                }
            }
        }
        assert_eq!(alone, mixed);
    }

    #[test]
    fn seed_purpose_and_entity_all_change_the_stream() {
        let first = |seed, purpose, entity| Stream::new(seed, purpose, entity).next_u64();
        let base = first(1, Purpose::RequestShape, 1);
        assert_ne!(base, first(2, Purpose::RequestShape, 1));
        assert_ne!(base, first(1, Purpose::Arrival, 1));
        assert_ne!(base, first(1, Purpose::RequestShape, 2));
    }

    #[test]
    fn uniform_stays_inside_the_open_interval() {
        let mut s = Stream::new(0, Purpose::Bench, 0);
        for _ in 0..100_000 {
            let u = s.uniform_open01();
            assert!(u > 0.0 && u < 1.0);
        }
        let mut s = Stream::new(0, Purpose::Bench, 1);
        for _ in 0..10_000 {
            assert!(s.below(7) < 7);
        }
    }
}

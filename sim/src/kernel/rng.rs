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
    /// A durable agent job's own draws: its deadline, cancel, tool waves, approval waits and
    /// notifications (entity = job number, sub = `key::JOB_*` or the step's position).
    Job = 14,
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
    /// `Job` sub-key of the job's deadline.
    pub const JOB_DEADLINE: u64 = 1 << 40;
    /// `Job` sub-key of whether the job is cancelled, and when.
    pub const JOB_CANCEL: u64 = (1 << 40) + 1;
    /// `Job` sub-key of the cleanup: the notification's loss, the sandbox's termination.
    pub const JOB_CLEANUP: u64 = (1 << 40) + 2;
    /// `Arrival` entity of the job-acceptance process.
    pub const JOB_STARTS: u64 = 2;
    /// `Job` sub-key of when the job's observer disconnects.
    pub const JOB_OBSERVER: u64 = (1 << 40) + 3;
    /// `Job` sub-key of when the job's observer reconnects.
    pub const JOB_RECONNECT: u64 = (1 << 40) + 4;
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

    /// Gamma with the given mean and coefficient of variation (shape `1/cv²`), by Marsaglia and
    /// Tsang's squeeze (2000); a shape below 1 is boosted, `G(a) = G(a+1) · U^(1/a)`. `cv` 0 is
    /// the constant `mean`. The rejection loop accepts with probability above 0.95 per try; it
    /// is bounded, and past the bound (probability below 1e-1300) returns the mode's region
    /// `d` rather than loop on.
    pub fn gamma(&mut self, mean: f64, cv: f64) -> f64 {
        debug_assert!(mean.is_finite() && mean >= 0.0 && cv.is_finite() && cv >= 0.0);
        if cv == 0.0 || mean == 0.0 {
            return mean;
        }
        let shape = 1.0 / (cv * cv);
        let scale = mean / shape;
        let (a, boost) = if shape < 1.0 {
            (shape + 1.0, Some(1.0 / shape))
        } else {
            (shape, None)
        };
        let d = a - 1.0 / 3.0;
        let c = 1.0 / (9.0 * d).sqrt();
        let mut g = d;
        for _ in 0..1000 {
            let x = self.standard_normal();
            let v = 1.0 + c * x;
            if v <= 0.0 {
                continue;
            }
            let v = v * v * v;
            let u = self.uniform_open01();
            if libm::log(u) < 0.5 * x * x + d - d * v + d * libm::log(v) {
                g = d * v;
                break;
            }
        }
        if let Some(inv) = boost {
            g *= libm::pow(self.uniform_open01(), inv);
        }
        g * scale
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

    /// Sample mean and variance of `n` gamma draws.
    fn gamma_moments(mean: f64, cv: f64, n: u32) -> (f64, f64) {
        let mut s = Stream::new(3, Purpose::Bench, (cv * 100.0) as u64);
        let xs: Vec<f64> = (0..n).map(|_| s.gamma(mean, cv)).collect();
        let m = xs.iter().sum::<f64>() / n as f64;
        let var = xs.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / (n - 1) as f64;
        (m, var)
    }

    #[test]
    fn gamma_has_the_mean_and_cv_asked_for() {
        for cv in [0.1, 0.5, 1.0, 2.0, 4.0] {
            let (m, var) = gamma_moments(10.0, cv, 200_000);
            let sd_of_mean = 10.0 * cv / (200_000f64).sqrt();
            assert!((m - 10.0).abs() < 5.0 * sd_of_mean, "cv {cv}: mean {m}");
            let cv_seen = var.sqrt() / m;
            assert!((cv_seen - cv).abs() < 0.05 * cv, "cv {cv}: seen {cv_seen}");
        }
        assert_eq!(Stream::new(0, Purpose::Bench, 0).gamma(7.0, 0.0), 7.0);
    }

    #[test]
    fn gamma_of_shape_two_has_its_closed_form_cdf() {
        // Shape 2 (cv 1/sqrt 2), scale 1: F(x) = 1 - e^-x (1 + x). Kolmogorov-Smirnov at 1 %.
        let n = 100_000;
        let mut s = Stream::new(5, Purpose::Bench, 2);
        let mut xs: Vec<f64> = (0..n).map(|_| s.gamma(2.0, 0.5f64.sqrt())).collect();
        xs.sort_by(f64::total_cmp);
        let d = xs
            .iter()
            .enumerate()
            .map(|(i, &x)| {
                let f = 1.0 - (-x).exp() * (1.0 + x);
                (f - i as f64 / n as f64)
                    .abs()
                    .max((f - (i + 1) as f64 / n as f64).abs())
            })
            .fold(0.0, f64::max);
        assert!(d < 1.63 / (n as f64).sqrt(), "KS distance {d}");
    }
}

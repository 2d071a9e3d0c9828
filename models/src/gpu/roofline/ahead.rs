//! A streak's decode steps ahead on a roofline, timed by addition: each step reads one KV token
//! more a sequence, so its attention and KV terms grow by the same fraction each step, carried
//! with no division (`Ceil`), and the loop that times a coast's steps decides once, for all of
//! them, how to take the root and whether an end could overflow.

use super::{float_root, joined, Prepared, Rate, Roofline, EXACT_ROOT_BELOW};
use crate::gpu::StepShape;

impl Roofline {
    /// The decode-only steps of `seqs` sequences that read `kv0`, `kv0 + seqs`, … KV tokens (a
    /// streak's), at most `steps + 1` of them, if every one's terms fit 64 bits: then each
    /// step's attention and KV times grow by the same fraction, and each is the last plus that
    /// fraction's quotient, its overshoot carried (`Ceil`), with no division. The same times as
    /// `step_ns_prepared` of each shape.
    pub fn decode_steps(
        &self,
        p: &Prepared,
        seqs: u64,
        kv0: u64,
        steps: u64,
    ) -> Option<DecodeSteps> {
        let kv_max = kv0.checked_add(seqs.checked_mul(steps)?)?;
        // Every quantity grows with the KV read: if the last step's fit, every step's do; if
        // its joined terms' square is below `EXACT_ROOT_BELOW`, every step's is; and no step
        // takes longer.
        let (c_last, m_last) = self.terms_narrow(StepShape::decode_only(seqs, kv_max), p)?;
        let exact_root =
            c_last.max(m_last) < 1 << 26 && c_last * c_last + m_last * m_last < EXACT_ROOT_BELOW;
        let grow = |per_token: u64, r: Rate| seqs.checked_mul(per_token)?.checked_mul(r.mul);
        let attn_from = kv0.checked_mul(self.pair_flops)?.checked_mul(p.attn.mul)?;
        let kv_from = (kv0 + seqs)
            .checked_mul(self.kv_bytes)?
            .checked_mul(p.kv.mul)?;
        let base_ns = (self.overhead_ns).saturating_add(seqs.saturating_mul(self.per_seq_ns));
        Some(DecodeSteps {
            base_ns,
            compute_ns: p.flops.ns_narrow(seqs.checked_mul(self.linear_flops)?)?,
            weight_ns: u64::try_from(p.weight_ns).ok()?,
            attn: Ceil::new(attn_from, grow(self.pair_flops, p.attn)?, p.attn.div)?,
            kv: Ceil::new(kv_from, grow(self.kv_bytes, p.kv)?, p.kv.div)?,
            left: steps + 1,
            exact_root,
            longest_ns: base_ns.saturating_add(joined(c_last, m_last)),
        })
    }
}

/// `⌈n / div⌉` for a numerator `n` that grows by `step` at each `advance`: the ceiling and
/// what it overshoots `n` by (`value · div − n`, below `div`) carried, so each value costs
/// additions only, and is read as it is.
#[derive(Clone, Copy, Debug)]
struct Ceil {
    value: u64,
    over: u64,
    step_quotient: u64,
    step_rest: u64,
    div: u64,
}

impl Ceil {
    /// None where the overshoot could overflow (a divisor of 2^63 or more).
    fn new(n: u64, step: u64, div: u64) -> Option<Ceil> {
        (div > 0 && div < 1 << 63).then_some(Ceil {
            value: n.div_ceil(div),
            over: (div - n % div) % div,
            step_quotient: step / div,
            step_rest: step % div,
            div,
        })
    }

    /// `n + step = (value + step_quotient) · div − (over − step_rest)`: where the overshoot
    /// falls short of `step_rest`, the ceiling takes one more `div`. The compiler makes the
    /// product a branch here; a conditional move in its place (`select_unpredictable`), on
    /// this sum carried from step to step, ran no faster. The ceiling wraps rather than
    /// panics one step past the last checked, which is never read.
    #[inline(always)]
    fn advance(&mut self) {
        let (over, short) = self.over.overflowing_sub(self.step_rest);
        self.over = over.wrapping_add(self.div * u64::from(short));
        self.value = (self.value)
            .wrapping_add(self.step_quotient)
            .wrapping_add(u64::from(short));
    }
}

/// A streak's steps ahead on a roofline (`Roofline::decode_steps`).
#[derive(Clone, Copy, Debug)]
pub struct DecodeSteps {
    /// The overhead and the sequences' own cost: every step's.
    base_ns: u64,
    compute_ns: u64,
    weight_ns: u64,
    attn: Ceil,
    kv: Ceil,
    /// Steps it may still time.
    left: u64,
    /// Whether every step's joined terms have the float root as it is (`isqrt_below_2_63`).
    exact_root: bool,
    /// The last step's time, the longest (`u64::MAX` where it saturates).
    longest_ns: u64,
}

impl DecodeSteps {
    /// The next step's time; the one after reads one more KV token a sequence.
    pub fn next_ns(&mut self) -> u64 {
        self.take(1);
        let (c, m) = self.terms();
        self.base_ns.saturating_add(joined(c, m))
    }

    /// The ends of the next `n` steps, the first launched at `start_ns`, onto `ends`; fewer
    /// where an end would pass `u64::MAX` ns. The same ends as `next_ns` added up.
    pub fn extend_ends(&mut self, n: u64, start_ns: u64, ends: &mut Vec<u64>) {
        // A saturated step time is no bound: its sum with the next could wrap.
        let last_ns = self.longest_ns.checked_mul(n);
        if self.longest_ns == u64::MAX || last_ns.and_then(|t| t.checked_add(start_ns)).is_none() {
            // Steps of ages, or a coast of very many.
            return crate::gpu::ends_one_by_one(n, start_ns, ends, || self.next_ns());
        }
        self.take(n);
        match self.exact_root {
            true => self.extend_by(n, start_ns, ends, |c, m| {
                let x = c * c + m * m;
                debug_assert!(x < EXACT_ROOT_BELOW);
                float_root(x)
            }),
            false => self.extend_by(n, start_ns, ends, joined),
        }
    }

    fn take(&mut self, n: u64) {
        assert!(n <= self.left, "more steps than the KV read checked");
        self.left -= n;
    }

    /// The next step's terms, the carried ones advanced past it.
    #[inline(always)]
    fn terms(&mut self) -> (u64, u64) {
        // The terms fit (`decode_steps`), so these sums do.
        let terms = (
            self.compute_ns + self.attn.value,
            self.weight_ns + self.kv.value,
        );
        self.attn.advance();
        self.kv.advance();
        terms
    }

    /// `n` steps' ends, none past `start_ns + n · longest_ns`, which fits: an iterator of known
    /// length, which `extend` writes with no test of the vector's room a step.
    #[inline(always)]
    fn extend_by(
        &mut self,
        n: u64,
        start_ns: u64,
        ends: &mut Vec<u64>,
        join: impl Fn(u64, u64) -> u64,
    ) {
        // The carried terms and the sums as locals, in registers through the loop.
        let (mut attn, mut kv, mut end_ns) = (self.attn, self.kv, start_ns);
        let (base_ns, compute_ns, weight_ns) = (self.base_ns, self.compute_ns, self.weight_ns);
        ends.extend((0..n).map(|_| {
            let (c, m) = (compute_ns + attn.value, weight_ns + kv.value);
            attn.advance();
            kv.advance();
            end_ns += base_ns + join(c, m);
            end_ns
        }));
        (self.attn, self.kv) = (attn, kv);
    }
}

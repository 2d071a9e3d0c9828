//! The GPU step-time models and the named hardware/model profiles.
//!
//! A step (one forward pass over a mixed prefill/decode batch) is costed from its [`StepShape`]
//! by one of two models:
//!
//! - [`Roofline`] (the default): compute and memory traffic from physical constants (FLOPs and
//!   bytes per token, peak FLOP/s and HBM bandwidth at a fitted utilisation), joined as a smooth
//!   roofline, with attention quadratic in a prefill chunk's context. See `roofline.rs`.
//! - [`StepCost`], the linear form of cancelsim 0.1 (BLIS-like α/β):
//!   `c0 + prefill_tokens / prefill_rate + decode_seqs · c_seq + kv_tokens_read · c_kv`. A
//!   `Custom` profile is this form, and `step_model: Linear` selects the 0.1 constants of the
//!   named profiles, so older scenarios keep their meaning.
//!
//! All times are integer nanoseconds and the arithmetic is integer, so it is portable.

pub mod aic;
pub mod fit;
pub mod fit_table;
mod memory;
mod profiles;
mod roofline;
mod table;
#[cfg(test)]
mod tests;

pub use memory::{MemoryPlan, UTILIZATION_DEFAULT};
pub use profiles::{
    model_shape_name, profile, unknown_profile, Precision, Profile, LLAMA2_7B_A100, LLAMA2_7B_H100,
    LLAMA31_70B_TP4_B200, LLAMA31_70B_TP4_H100, LLAMA31_70B_TP4_H200, LLAMA31_8B_A100,
    LLAMA31_8B_B200, LLAMA31_8B_H100, LLAMA31_8B_H200, PROFILES,
};
pub use roofline::{
    DecodeSteps, Fitted, Gpu, ModelShape, Prepared, Roofline, Shares, A100_80GB, B200_SXM,
    H100_SXM, H200_SXM, MBU_KV_PCT, MBU_PCT, MFU_ATTN_PCT, MFU_PCT,
};
pub use table::{StepTable, TableError, TABLE_ROWS_MAX};

/// The linear step costs of cancelsim 0.1, in nanoseconds (or tokens per second for prefill).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepCost {
    pub c0_ns: u64,
    /// Prompt tokens per second. 0 means prefill costs nothing beyond `c0` (for queueing tests).
    pub prefill_tokens_per_s: u64,
    pub per_seq_ns: u64,
    /// Picoseconds per KV token read (sub-nanosecond for small models).
    pub per_kv_token_ps: u64,
}

/// What a step contains, for costing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StepShape {
    pub prefill_tokens: u64,
    pub decode_seqs: u64,
    /// The context lengths of the decode sequences, summed: the KV they read.
    pub kv_tokens_read: u64,
    /// Attention (query, key) pairs of the prefill chunks: a chunk of `n` tokens after `p`
    /// cached ones has `n·p + n(n+1)/2`. The linear model ignores it.
    pub prefill_pairs: u64,
    /// Earlier context the prefill chunks read (the `p` above, summed). The linear model ignores
    /// it.
    pub prefill_ctx_tokens: u64,
}

impl StepShape {
    /// A step of `seqs` decode sequences that read `kv` KV tokens together, and nothing else
    /// (a streak step's).
    #[inline]
    pub fn decode_only(seqs: u64, kv: u64) -> StepShape {
        StepShape {
            decode_seqs: seqs,
            kv_tokens_read: kv,
            ..StepShape::default()
        }
    }

    /// Add a prefill chunk of `tokens` tokens after `ctx` cached ones.
    #[inline]
    pub fn add_prefill(&mut self, ctx: u64, tokens: u64) {
        self.prefill_tokens += tokens;
        self.prefill_ctx_tokens += ctx;
        self.prefill_pairs += tokens * ctx + tokens * (tokens + 1) / 2;
    }

    /// Add a decode sequence whose context is `ctx` tokens.
    #[inline]
    pub fn add_decode(&mut self, ctx: u64) {
        self.decode_seqs += 1;
        self.kv_tokens_read += ctx;
    }
}

impl StepCost {
    pub fn step_ns(&self, shape: StepShape) -> u64 {
        let prefill_ns = if self.prefill_tokens_per_s == 0 {
            0
        } else {
            (shape.prefill_tokens as u128 * 1_000_000_000)
                .div_ceil(self.prefill_tokens_per_s as u128) as u64
        };
        let kv_ns = (shape.kv_tokens_read as u128 * self.per_kv_token_ps as u128 / 1000) as u64;
        self.c0_ns
            .saturating_add(prefill_ns)
            .saturating_add(shape.decode_seqs.saturating_mul(self.per_seq_ns))
            .saturating_add(kv_ns)
    }
}

/// The step-time model a replica runs with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StepModel {
    Linear(StepCost),
    Roofline(Roofline),
    /// Measured step times, interpolated; shared by the replicas of a run.
    Table(std::sync::Arc<StepTable>),
}

impl StepModel {
    #[inline]
    pub fn step_ns(&self, shape: StepShape) -> u64 {
        match self {
            StepModel::Linear(c) => c.step_ns(shape),
            StepModel::Roofline(r) => r.step_ns(shape),
            StepModel::Table(t) => t.step_ns(shape),
        }
    }
}

/// A step model ready to cost one replica's steps: a roofline's work that no step changes done
/// once (`Roofline::prepare`). The same times as `StepModel::step_ns`.
#[derive(Clone, Debug)]
pub struct Costing {
    model: StepModel,
    prepared: Option<Prepared>,
}

impl Costing {
    pub fn new(model: &StepModel) -> Costing {
        let prepared = match model {
            StepModel::Roofline(r) => Some(r.prepare()),
            _ => None,
        };
        Costing {
            model: model.clone(),
            prepared,
        }
    }

    #[inline]
    pub fn step_ns(&self, shape: StepShape) -> u64 {
        match (&self.model, &self.prepared) {
            (StepModel::Roofline(r), Some(p)) => r.step_ns_prepared(shape, p),
            (model, _) => model.step_ns(shape),
        }
    }

    /// The times of a streak's steps ahead: `seqs` sequences decoding, reading `kv0` KV
    /// tokens, then `seqs` more each step, at most `steps` more. A roofline's by addition
    /// (`Roofline::decode_steps`) where every step's terms fit 64 bits; any other's one by one.
    pub fn streak_times(&self, seqs: u64, kv0: u64, steps: u64) -> StreakTimes<'_> {
        let added = match (&self.model, &self.prepared) {
            (StepModel::Roofline(r), Some(p)) => r.decode_steps(p, seqs, kv0, steps),
            _ => None,
        };
        match added {
            Some(d) => StreakTimes::Added(d),
            None => StreakTimes::Each {
                costing: self,
                seqs,
                kv: kv0,
            },
        }
    }
}

/// A streak's step times, one after another (`Costing::streak_times`): each `step_ns` of its
/// shape.
pub enum StreakTimes<'a> {
    Added(DecodeSteps),
    Each {
        costing: &'a Costing,
        seqs: u64,
        kv: u64,
    },
}

impl StreakTimes<'_> {
    /// The next step's time; the one after reads `seqs` more KV tokens.
    #[inline]
    pub fn next_ns(&mut self) -> u64 {
        match self {
            StreakTimes::Added(d) => d.next_ns(),
            StreakTimes::Each { costing, seqs, kv } => {
                let shape = StepShape {
                    decode_seqs: *seqs,
                    kv_tokens_read: *kv,
                    ..StepShape::default()
                };
                *kv = kv.saturating_add(*seqs);
                costing.step_ns(shape)
            }
        }
    }

    /// The ends of the next `n` steps, the first launched at `start_ns`, onto `ends`; fewer
    /// where an end would pass `u64::MAX` ns. The same ends as `next_ns` added up.
    pub fn extend_ends(&mut self, n: u64, start_ns: u64, ends: &mut Vec<u64>) {
        match self {
            StreakTimes::Added(d) => d.extend_ends(n, start_ns, ends),
            StreakTimes::Each { .. } => ends_one_by_one(n, start_ns, ends, || self.next_ns()),
        }
    }
}

/// The ends of `n` steps timed by `next_ns`, the first launched at `start_ns`, onto `ends`,
/// each checked; fewer where an end would pass `u64::MAX` ns.
pub(crate) fn ends_one_by_one(
    n: u64,
    start_ns: u64,
    ends: &mut Vec<u64>,
    mut next_ns: impl FnMut() -> u64,
) {
    let mut end_ns = start_ns;
    for _ in 0..n {
        let Some(next) = end_ns.checked_add(next_ns()) else {
            return;
        };
        end_ns = next;
        ends.push(end_ns);
    }
}

impl From<StepCost> for StepModel {
    fn from(c: StepCost) -> Self {
        StepModel::Linear(c)
    }
}

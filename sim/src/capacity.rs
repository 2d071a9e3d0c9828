//! The capacity cost of a cancellation policy: what it costs beyond the ideal cancel, on the
//! same seed and the same intents.
//!
//! `leaked_work` attributes each step's time to the requests in it, so it charges a step's fixed
//! cost to a cancelled request's share, and it moves opposite to the real impact: it is large at
//! low load, where freeing a slot frees almost nothing, and small at saturation, where it frees
//! throughput. The capacity cost instead compares whole runs: the policy's run against the ideal
//! cancel's (`Policy::Ideal`: each intent applied at once and perfectly), both against the same
//! arrivals and intents (common random numbers). Positive is worse than ideal.

use crate::metrics::{CapacityCost, Summary};

impl CapacityCost {
    /// `policy` against `ideal`: two runs of one report.
    pub fn of(policy: &Summary, ideal: &Summary) -> CapacityCost {
        let (p, i) = (
            &policy.sibling_latency_delta_ms,
            &ideal.sibling_latency_delta_ms,
        );
        CapacityCost {
            gpu_busy_s: policy.gpu.busy_s - ideal.gpu.busy_s,
            makespan_s: policy.makespan_s - ideal.makespan_s,
            goodput_rps: ideal.throughput_rps - policy.throughput_rps,
            output_tokens_per_s: ideal.output_tokens_per_s - policy.output_tokens_per_s,
            sibling_ttft_p99_ms: p.ttft_p99 - i.ttft_p99,
            sibling_e2e_p99_ms: p.e2e_p99 - i.e2e_p99,
        }
    }
}

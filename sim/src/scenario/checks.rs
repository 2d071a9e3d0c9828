//! What `cancelsim check` expects of a scenario: per-policy expectations, the system properties
//! that must hold, and the ranges its swarm draws from.

use serde::{Deserialize, Serialize};

/// Expectations of one policy's run (`policy` is a label such as `per_request`, or `*`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Expect {
    pub policy: String,
    /// Every storm target ends in this disposition.
    pub targets: Option<TargetDisposition>,
    pub sibling_survival_min: Option<f64>,
    pub sibling_survival_max: Option<f64>,
    pub leaked_gpu_s_min: Option<f64>,
    pub leaked_gpu_s_max: Option<f64>,
    pub late_discards_max: Option<u64>,
    pub retained_peak_blocks_max: Option<u64>,
    pub cleanup_pending_min: Option<u64>,
    pub cleanup_pending_max: Option<u64>,
    /// Bounds on any number of `summary.json`, by its dotted path (`handoff.stranded`,
    /// `handoff.prefill.blocks_never_returned`). A path the summary does not have fails.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub metrics: Vec<MetricBound>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MetricBound {
    pub metric: String,
    #[serde(default)]
    pub min: Option<f64>,
    #[serde(default)]
    pub max: Option<f64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub enum TargetDisposition {
    Completed,
    Cancelled,
    Expired,
    /// Refused at arrival: its prompt can never fit a replica's pool.
    Rejected,
}

/// The system properties a configuration must keep. Routing (each consumer receives only its own
/// request's markers) is required everywhere unless turned off; sibling isolation (survival 1.0)
/// is required for the listed policy labels.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Properties {
    pub routing: bool,
    pub sibling_isolation: Vec<String>,
}

impl Default for Properties {
    fn default() -> Self {
        Properties {
            routing: true,
            sibling_isolation: Vec::new(),
        }
    }
}

/// Inclusive ranges for swarm testing. Unset: the scenario's own value.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct SwarmRanges {
    /// Requests (Poisson, OnOff), conversations, or trace rows.
    pub requests: Option<(u64, u64)>,
    pub fraction: Option<(f64, f64)>,
    /// Draw the storm stage at random per request.
    pub random_stage: bool,
    pub window: Option<(u32, u32)>,
    pub max_num_seqs: Option<(u32, u32)>,
    pub loss: Option<(f64, f64)>,
    pub writer_wait_ms: Option<(f64, f64)>,
    /// A prefill/decode graph's replicas per stage (`cluster.replicas` follows).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefill_replicas: Option<(u32, u32)>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decode_replicas: Option<(u32, u32)>,
    /// The loss of the prefill-to-decode link.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub link_loss: Option<(f64, f64)>,
}

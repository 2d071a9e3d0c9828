//! Scenario files: RON, strict, validated.
//!
//! Every config type denies unknown fields. A parse error names the file, `line:column` and the
//! field path; a semantic error (a negative rate, NaN, an empty pool) names the file and the field
//! path, and the line of that field when it can be found. Nothing here panics on user input.
//!
//! The sections live by concern: `serving` (workload and cluster), `cancel` (storm, policies,
//! adapter, backend, playback), `checks` (what `check` expects); `load` reads files and
//! `validate` checks meaning.

mod cancel;
mod checks;
mod jobs;
mod json_shape;
mod load;
mod schema;
mod serving;
mod topology;
mod validate;

use serde::{Deserialize, Serialize};

use crate::kernel::{Limits, NS_PER_S};

pub use cancel::*;
pub use checks::*;
pub use jobs::*;
pub(crate) use load::fraction_for_whole;
pub use load::{outside_data_root, set_data_root, LoadError};
pub use schema::scenario_schema;
pub use serving::*;
pub use topology::{
    AbortOrder, CompletionsSpec, ConditionalSpec, HandoffSpec, LinkRon, ReclaimSpec, RoleSpec,
    StageSpec, TopologySpec, TransferCancel,
};
pub use validate::Invalid;

/// The scenario `cancelsim` runs when given no file.
pub const DEFAULT_SCENARIO: &str = include_str!("../../../scenarios/default.ron");
/// The name shown for the embedded default in messages.
pub const DEFAULT_SCENARIO_PATH: &str = "<embedded>/scenarios/default.ron";

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// In a JSON scenario, the schema's address for editors; ignored, and never part of the
    /// scenario's hash.
    #[serde(rename = "$schema", default, skip_serializing)]
    pub schema: Option<String>,
    /// Used for the output directory; letters, digits, `-` and `_`.
    pub name: String,
    #[serde(default)]
    pub description: String,
    /// Run seed. `--seed` overrides it.
    #[serde(default = "default_seed")]
    pub seed: u64,
    #[serde(default)]
    pub limits: LimitsConfig,
    pub workload: Workload,
    pub cluster: Cluster,
    /// Which requests get a cancel intent, and when. None: no storm (intents can still come
    /// from deadlines, disconnects and barge-ins).
    #[serde(default)]
    pub cancellation: Option<Cancellation>,
    /// The policies to compare, one run each against one shared counterfactual.
    #[serde(default = "cancel::default_policies")]
    pub policies: Vec<Policy>,
    #[serde(default)]
    pub adapter: AdapterConfig,
    #[serde(default)]
    pub backend: BackendConfig,
    #[serde(default)]
    pub playback: PlaybackConfig,
    /// What `cancelsim check` expects of each policy's run.
    #[serde(default)]
    pub expect: Vec<Expect>,
    /// Where the system properties must hold (checked in every run, swarm included).
    #[serde(default)]
    pub properties: Properties,
    /// Rare paths this scenario must reach (see `COVERAGE_MARKS`).
    #[serde(default)]
    pub coverage: Vec<String>,
    /// Ranges `check --swarm` draws this scenario's parameters from, per seed.
    #[serde(default)]
    pub swarm: Option<SwarmRanges>,
    /// The directory relative paths (traces) resolve against: the scenario file's directory, or
    /// the repository's `scenarios/` for the embedded default.
    #[serde(skip)]
    pub base_dir: std::path::PathBuf,
}

fn default_seed() -> u64 {
    1
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsConfig {
    pub max_events: u64,
    pub max_time_s: f64,
    pub max_queue_len: u64,
    /// Requests in the system at once (arrived, not yet gone), at most: every per-request
    /// structure (the world's, the controller's, the replicas' waiting queues) is bounded by
    /// it. Unstated, it is not serialised, so the scenario hash stays what it was.
    #[serde(skip_serializing_if = "is_in_system_default")]
    pub max_in_system: u64,
}

/// Requests in the system at once, by default: 2^20, about 0.3 GB of per-request state at the
/// limit, so a run that piles up requests stops with a limit error well within a 24 GB machine.
pub const IN_SYSTEM_MAX_DEFAULT: u64 = 1 << 20;

fn is_in_system_default(n: &u64) -> bool {
    *n == IN_SYSTEM_MAX_DEFAULT
}

impl Default for LimitsConfig {
    fn default() -> Self {
        let d = Limits::default();
        LimitsConfig {
            max_events: d.events_max,
            max_time_s: (d.time_ns_max / NS_PER_S) as f64,
            max_queue_len: d.queue_len_max,
            max_in_system: IN_SYSTEM_MAX_DEFAULT,
        }
    }
}

/// Upper bound on the requests of one scenario, so a typo cannot ask for 10^18.
pub const REQUESTS_MAX: u64 = 100_000_000;
pub const REPLICAS_MAX: u32 = 1024;

impl Scenario {
    pub fn limits(&self) -> Limits {
        Limits {
            events_max: self.limits.max_events,
            time_ns_max: crate::dist::ms_to_ns(self.limits.max_time_s * 1000.0),
            queue_len_max: self.limits.max_queue_len,
        }
    }

    /// BLAKE3 of the scenario's canonical RON form (after defaults, before `--seed`), so
    /// formatting and comments do not change it.
    pub fn hash(&self) -> String {
        let canonical = ron::to_string(self).expect("scenario serialises");
        blake3::hash(canonical.as_bytes()).to_hex().to_string()
    }
}

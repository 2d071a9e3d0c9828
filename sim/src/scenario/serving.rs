//! The scenario's workload and serving sections: what arrives, and the replicas that serve it.

use serde::{Deserialize, Serialize};

use cancelsim_models::gpu::{self, Profile, StepCost, StepModel};

use crate::dist::{ms_to_ns, Dist};

/// What arrives, and what each request asks for.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Workload {
    pub source: Source,
    /// Prompt length in tokens, for synthetic sources (traces carry their own).
    #[serde(default = "default_prompt")]
    pub prompt_tokens: Dist,
    /// Output length in tokens (where the model emits end of sequence), for synthetic sources.
    #[serde(default = "default_output")]
    pub output_tokens: Dist,
    /// Deadline from acceptance, per request. None: no deadline.
    #[serde(default)]
    pub deadline_ms: Option<Dist>,
    /// Time from acceptance until the client disconnects, per request. None: clients stay.
    #[serde(default)]
    pub disconnect_ms: Option<Dist>,
    /// Probability that a request's output ends at its `max_tokens`, which the scheduler knows
    /// in advance (no step in flight runs past it), rather than at a stop token, which it
    /// discovers (with W > 1, one more step is already in flight).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub length_capped: f64,
    /// Outputs that end at a stop string, which the frontend's detokenizer finds after the
    /// token comes out; the engine runs on until the frontend's abort reaches it (catalogue S14).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_strings: Option<StopStrings>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StopStrings {
    /// Probability that a request's output ends at a stop string.
    pub probability: f64,
    /// From the last token out to the frontend's abort reaching the engine: detokenizing,
    /// matching, and the abort's trip.
    #[serde(default = "stop_detect_default")]
    pub detect_ms: Dist,
}

fn stop_detect_default() -> Dist {
    Dist::Constant(1.0)
}

fn utilization_default() -> f64 {
    gpu::UTILIZATION_DEFAULT
}

fn is_utilization_default(x: &f64) -> bool {
    *x == gpu::UTILIZATION_DEFAULT
}

fn is_false(x: &bool) -> bool {
    !*x
}

fn is_zero(x: &f64) -> bool {
    *x == 0.0
}

fn default_prompt() -> Dist {
    Dist::LogNormal {
        median: 1000.0,
        sigma: 0.8,
    }
}

fn default_output() -> Dist {
    Dist::LogNormal {
        median: 130.0,
        sigma: 0.8,
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub enum Source {
    /// Open-loop Poisson arrivals.
    Poisson { rate_per_s: f64, requests: u64 },
    /// Open-loop renewal arrivals with gamma gaps (vidur's `gamma` interval generator): mean
    /// gap `1/rate_per_s`, coefficient of variation `cv`. `cv` 1 is Poisson, below 1 smoother
    /// (0: evenly spaced), above 1 burstier.
    Gamma {
        rate_per_s: f64,
        cv: f64,
        requests: u64,
    },
    /// Open-loop bursty arrivals: a two-state Markov-modulated Poisson process. The source
    /// alternates between an on period (rate `rate_on_per_s`) and an off period
    /// (`rate_off_per_s`, possibly 0), with durations drawn from `on_ms` and `off_ms`.
    OnOff {
        rate_on_per_s: f64,
        rate_off_per_s: f64,
        on_ms: Dist,
        off_ms: Dist,
        requests: u64,
    },
    /// Closed-loop conversations. Conversations start as a Poisson process; each issues `turns`
    /// turns; a turn is one generation of `requests_per_turn` requests; the next turn starts
    /// `think_ms` after the turn's last request completes. With `barge_in`, the user interrupts
    /// a turn in progress, which supersedes its generation and starts the next turn at once.
    Conversations {
        conversations: u64,
        start_rate_per_s: f64,
        turns: Dist,
        think_ms: Dist,
        #[serde(default = "one")]
        requests_per_turn: u32,
        #[serde(default)]
        barge_in: Option<BargeIn>,
        /// Each turn's prompt carries the conversation's history: every earlier prompt and the
        /// output its user saw, then the new message (`prompt_tokens`). Turns then share a prefix
        /// that the prefix cache finds, where the replica still holds it.
        #[serde(default, skip_serializing_if = "is_false")]
        history: bool,
    },
    /// Durable agent jobs: jobs arrive as a Poisson process, and each runs `job`'s plan (provider
    /// calls into the cluster, tool waves, approval waits, subagents) under one deadline.
    Jobs {
        jobs: u64,
        rate_per_s: f64,
        job: super::JobSpec,
    },
    /// Replay of recorded agent sessions (the agentic Mooncake trace: JSON Lines, one row per
    /// provider call with `wait_for`, `delay` and `tool_wait_ms`). Each chain of rows is one
    /// durable job, accepted when its first row was sent; `job` gives its deadline, cancels and
    /// worker (its `plan` stays empty: the trace is the plan). `path` is relative to the
    /// scenario file.
    AgentTrace { path: String, job: super::JobSpec },
    /// Replay of a real trace. `path` is relative to the scenario file.
    Trace {
        path: String,
        format: TraceFormat,
        /// Time scaling: 2.0 replays twice as fast.
        #[serde(default = "one_f64")]
        speedup: f64,
        /// First data row to replay (0-based).
        #[serde(default)]
        first_row: u64,
        /// How many rows from `first_row`; None: to the end.
        #[serde(default)]
        rows: Option<u64>,
        /// Keep each row with this probability (an independent draw per row).
        #[serde(default = "one_f64")]
        sample_fraction: f64,
        /// Cut a row whose prompt and output pass this many tokens, as vidur's trace replay
        /// does: the output to at most this less one, then the prompt to the rest.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        max_total_tokens: Option<u32>,
    },
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BargeIn {
    /// Probability that a turn is interrupted.
    pub probability: f64,
    /// When, from the turn's start.
    pub after_ms: Dist,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub enum TraceFormat {
    /// Azure LLM inference trace 2023: `TIMESTAMP,ContextTokens,GeneratedTokens`.
    AzureCsv,
    /// Mooncake JSON Lines: `timestamp` (ms), `input_length`, `output_length`.
    MooncakeJsonl,
}

/// The serving side: replicas behind a router, each one engine on one GPU profile.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Cluster {
    #[serde(default = "one")]
    pub replicas: u32,
    #[serde(default)]
    pub router: Router,
    pub profile: ProfileRef,
    /// The step-time model of a named profile: `Roofline` (the default) or the `Linear`
    /// constants of cancelsim 0.1. A `Custom` profile is always linear.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_model: Option<StepForm>,
    /// The roofline's utilisations, in whole percent, where your kernels differ from the fitted
    /// ones; unset: the fitted shares. A named profile's roofline only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub roofline: Option<RooflineShares>,
    pub scheduler: Scheduler,
    /// Share of each GPU's memory the engine may use (vLLM's `--gpu-memory-utilization`): a named
    /// profile's KV capacity is what is left of it after the weights, the non-torch memory and
    /// the activation peak. A `Custom` profile states its capacity instead.
    #[serde(
        default = "utilization_default",
        skip_serializing_if = "is_utilization_default"
    )]
    pub gpu_memory_utilization: f64,
    /// The stage graph; none: the colocated one-node case (router, these replicas, playback).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology: Option<super::TopologySpec>,
}

#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
pub enum Router {
    #[default]
    RoundRobin,
    /// Fewest requests waiting, running or draining (least outstanding requests); ties go to
    /// the lowest index.
    LeastLoaded,
    /// Session affinity by consistent hashing: a conversation's requests, or a trace's
    /// requests that share their first prefix block, always go to the same replica; any other
    /// request goes to the least loaded.
    Session,
    /// One queue at the router (a gateway's flow control, Triton's scheduler over instances):
    /// a request waits there, first come first served, until a replica has fewer than
    /// `max_outstanding` requests, and goes to the least loaded of those. With
    /// `max_outstanding: 1` and `max_num_seqs: 1`, c replicas are the M/D/c queue.
    SharedQueue { max_outstanding: u32 },
    /// KV-aware (NVIDIA Dynamo's KV router, llm-d's prefix-cache scorer): each replica costs
    /// `overlap_weight` per prompt block it would compute (the blocks not already in its prefix
    /// cache, from a trace's block hashes or a conversation's history) plus `load_weight` per
    /// request it holds; the request goes to the cheapest, ties to the lowest index. The router
    /// sees a cache through the blocks the replica publishes as it stores and evicts them,
    /// `lag_us` microseconds late. Colocated replicas with `prefix_caching` only; on a
    /// prefill/decode graph, the prefill replicas (and any Colocated pool beside them), and
    /// the decode replicas by the blocks they would receive when their pools cache prefixes.
    KvAware {
        overlap_weight: u32,
        load_weight: u32,
        #[serde(default)]
        lag_us: u32,
    },
}

impl Cluster {
    /// Whether the step model is a named profile's roofline, which `roofline` shares apply to.
    pub fn is_named_roofline(&self) -> bool {
        matches!(self.profile, ProfileRef::Named(_)) && self.step_model != Some(StepForm::Linear)
    }

    /// One replica's step model, KV tokens and named profile (see [`ProfileRef::costs`]).
    pub fn step_costs(
        &self,
        batched_tokens: Option<u32>,
        table: Option<&std::sync::Arc<gpu::StepTable>>,
    ) -> (StepModel, u64, Option<Profile>) {
        let (form, shares) = (self.step_model, self.roofline);
        let utilization = self.gpu_memory_utilization;
        self.profile
            .costs(form, shares, utilization, batched_tokens, table)
    }
}

/// The roofline's utilisations, each replacing the fitted one it names (docs/scenarios.md, Cluster).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(deny_unknown_fields)]
pub struct RooflineShares {
    /// The blocks' GEMMs, percent of peak FLOP/s (unset: the fitted MFU).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mfu_pct: Option<u64>,
    /// The weight read, percent of HBM bandwidth (unset: the fitted MBU).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mbu_pct: Option<u64>,
    /// The KV-cache traffic, percent of HBM bandwidth (unset: the fitted MBU_KV).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mbu_kv_pct: Option<u64>,
    /// Attention's arithmetic, percent of peak FLOP/s (unset: the fitted MFU_ATTN;
    /// FlashAttention-3 reaches up to 75 on an H100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mfu_attn_pct: Option<u64>,
}

impl RooflineShares {
    /// The same shares as the models crate takes them (it has no serde).
    pub fn shares(&self) -> gpu::Shares {
        gpu::Shares {
            mfu_pct: self.mfu_pct,
            mbu_pct: self.mbu_pct,
            mbu_kv_pct: self.mbu_kv_pct,
            mfu_attn_pct: self.mfu_attn_pct,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub enum StepForm {
    /// Compute against memory traffic, with prefill attention quadratic in its context.
    Roofline,
    /// `c0 + prefill / rate + seqs · c_seq + kv_read · c_kv`, with the 0.1 constants.
    Linear,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub enum ProfileRef {
    /// One of `llama-3.1-8b-h100`, `llama-3.1-8b-a100`, `llama-3.1-70b-tp4-h100`,
    /// `llama-2-7b-a100`, `llama-2-7b-h100`, `llama-3.1-8b-h200`, `llama-3.1-8b-b200`,
    /// `llama-3.1-70b-tp4-h200`, `llama-3.1-70b-tp4-b200` (`cancelsim profiles` lists them).
    Named(String),
    /// Your own step costs (see ARCHITECTURE.md for the formula).
    Custom {
        c0_ms: f64,
        #[serde(default)]
        prefill_tokens_per_s: f64,
        #[serde(default)]
        per_seq_us: f64,
        #[serde(default)]
        per_kv_token_ns: f64,
        kv_blocks_16: u64,
    },
    /// Step times you measured: a CSV grid of (prefill tokens, decode sequences, KV tokens,
    /// step ms), interpolated (docs/scenarios.md). `path` is relative to the scenario file.
    Table { path: String, kv_blocks_16: u64 },
}

/// The fields of a `Custom` profile, as the scenario gives them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CustomCosts {
    pub c0_ms: f64,
    pub prefill_tokens_per_s: f64,
    pub per_seq_us: f64,
    pub per_kv_token_ns: f64,
    pub kv_blocks_16: u64,
}

impl ProfileRef {
    /// The named profile; `None` for a custom one (or an unknown name, before validation).
    pub fn named(&self) -> Option<Profile> {
        match self {
            ProfileRef::Named(name) => gpu::profile(name),
            ProfileRef::Custom { .. } | ProfileRef::Table { .. } => None,
        }
    }

    /// The fields of a `Custom` profile; `None` for a named one.
    pub fn custom(&self) -> Option<CustomCosts> {
        match *self {
            ProfileRef::Named(_) | ProfileRef::Table { .. } => None,
            ProfileRef::Custom {
                c0_ms,
                prefill_tokens_per_s,
                per_seq_us,
                per_kv_token_ns,
                kv_blocks_16,
            } => Some(CustomCosts {
                c0_ms,
                prefill_tokens_per_s,
                per_seq_us,
                per_kv_token_ns,
                kv_blocks_16,
            }),
        }
    }

    /// The step model, KV capacity in tokens and named profile (if any) of one replica. A named
    /// profile's capacity is its memory plan at `utilization` of device memory, for a profiling
    /// pass of `batched_tokens` (None: the profile's default). The profile is validated: a named
    /// one exists and has the form asked for.
    pub fn costs(
        &self,
        form: Option<StepForm>,
        shares: Option<RooflineShares>,
        utilization: f64,
        batched_tokens: Option<u32>,
        table: Option<&std::sync::Arc<gpu::StepTable>>,
    ) -> (StepModel, u64, Option<Profile>) {
        if let ProfileRef::Table { kv_blocks_16, .. } = self {
            let t = table.expect("a table profile's table is loaded with the run");
            return (StepModel::Table(t.clone()), kv_blocks_16 * 16, None);
        }
        let Some(c) = self.custom() else {
            let ProfileRef::Named(name) = self else {
                unreachable!("not custom, so named")
            };
            let p = gpu::profile(name).expect("validated profile name");
            let model = match (p.model(form == Some(StepForm::Linear)), shares) {
                (Some(StepModel::Roofline(r)), Some(s)) => {
                    StepModel::Roofline(r.with_shares(p.gpu, s.shares()))
                }
                (Some(m), None) => m,
                (m, s) => unreachable!("validated step model and shares: {m:?}, {s:?}"),
            };
            let ppm = (utilization * 1e6).round() as u64;
            let batched = batched_tokens.unwrap_or(p.max_num_batched_tokens) as u64;
            return (model, p.plan(ppm, batched).kv_tokens, Some(p));
        };
        let cost = StepCost {
            c0_ns: ms_to_ns(c.c0_ms),
            prefill_tokens_per_s: c.prefill_tokens_per_s.round() as u64,
            per_seq_ns: (c.per_seq_us * 1e3).round() as u64,
            per_kv_token_ps: (c.per_kv_token_ns * 1e3).round() as u64,
        };
        (StepModel::Linear(cost), c.kv_blocks_16 * 16, None)
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub enum Scheduler {
    /// vLLM-like continuous batching. Unset limits take the profile's vLLM defaults.
    Continuous {
        #[serde(default)]
        max_num_seqs: Option<u32>,
        #[serde(default)]
        max_num_batched_tokens: Option<u32>,
        #[serde(default = "yes")]
        chunked_prefill: bool,
        #[serde(default = "sixteen")]
        block_tokens: u32,
        /// KV capacity in blocks; None: the profile's capacity.
        #[serde(default)]
        kv_blocks: Option<u64>,
        /// In-flight window W.
        #[serde(default = "one")]
        window: u32,
        /// Share of the KV pool an admission leaves free while other requests run (vLLM's
        /// `watermark`, 0.01): room for the running requests to grow, so new prompts do not
        /// force preemptions.
        #[serde(default = "watermark", skip_serializing_if = "is_watermark")]
        watermark: f64,
        /// Automatic prefix caching, on by default as in vLLM V1: released blocks keep their
        /// content until evicted, and a later admission reuses its cached prefix (a preempted
        /// request's own blocks, or a trace's shared block hashes).
        #[serde(default = "yes", skip_serializing_if = "is_yes")]
        prefix_caching: bool,
    },
    /// Triton-like dynamic batching: each batch is one shared execution.
    Dynamic {
        max_batch_size: u32,
        max_queue_delay_ms: f64,
        #[serde(default = "sixteen")]
        block_tokens: u32,
        #[serde(default)]
        kv_blocks: Option<u64>,
    },
}

/// vLLM's default admission watermark.
pub const WATERMARK: f64 = 0.01;

fn watermark() -> f64 {
    WATERMARK
}

fn is_watermark(x: &f64) -> bool {
    *x == WATERMARK
}

fn yes() -> bool {
    true
}

fn is_yes(x: &bool) -> bool {
    *x
}

pub(super) fn one() -> u32 {
    1
}

fn one_f64() -> f64 {
    1.0
}

fn sixteen() -> u32 {
    16
}

/// Longest lag a KV-aware router's view may have: past it, the published blocks waiting out the
/// lag would be a second cache.
pub const KV_ROUTER_LAG_US_MAX: u32 = 10_000_000;

impl super::Scenario {
    /// The stages a KV-aware router scores: the colocated cluster, or a prefill/decode graph's
    /// entry (its prefill pools and any Colocated pool beside them); and the graph's decode pools,
    /// which it scores too if they cache prefixes.
    fn kv_scored_stages(&self) -> (Vec<super::Cluster>, Vec<super::Cluster>) {
        use cancelsim_models::topology::Role;
        let Some(pd) = self.prefill_decode() else {
            return (vec![self.cluster.clone()], Vec::new());
        };
        let of = |want: &[Role]| -> Vec<super::Cluster> {
            (pd.pools.iter().filter(|p| want.contains(&p.role)))
                .map(|p| self.stage_cluster(&p.name))
                .collect()
        };
        (of(&[Role::Prefill, Role::Colocated]), of(&[Role::Decode]))
    }

    /// A KV-aware router needs caches to look into, blocks that requests share, and a reason
    /// to choose: refused otherwise, naming the field.
    pub(super) fn validate_kv_router(&self) -> Result<(), super::validate::Invalid> {
        let Router::KvAware {
            overlap_weight,
            load_weight,
            lag_us,
        } = self.cluster.router
        else {
            return Ok(());
        };
        let f = "cluster.router.KvAware";
        let bad = |field: &str, message: &str| {
            Err(super::validate::Invalid {
                field: format!("{f}{field}"),
                message: message.to_string(),
            })
        };
        if overlap_weight == 0 && load_weight == 0 {
            return bad(
                "",
                "overlap_weight and load_weight are both 0: nothing to choose by",
            );
        }
        if lag_us > KV_ROUTER_LAG_US_MAX {
            return bad(".lag_us", "must be at most 10,000,000 (10 s)");
        }
        let (entry, decode) = self.kv_scored_stages();
        let caching = |c: &super::Cluster| match c.scheduler {
            Scheduler::Continuous {
                prefix_caching: true,
                block_tokens,
                ..
            } => Some(block_tokens),
            _ => None,
        };
        let sizes: Vec<Option<u32>> = entry.iter().map(caching).collect();
        if sizes.iter().any(|b| b.is_none()) {
            return bad(
                "",
                "needs a Continuous scheduler with prefix_caching: true (no cache to look into)",
            );
        }
        if sizes.windows(2).any(|w| w[0] != w[1]) {
            return bad(
                "",
                "needs one block size on every replica it scores (their stages' schedulers differ)",
            );
        }
        let decode_sizes: Vec<Option<u32>> = decode.iter().map(caching).collect();
        if decode_sizes.iter().any(|b| b.is_some()) && decode_sizes.iter().any(|&b| b != sizes[0]) {
            return bad("", "scores the decode pools when they cache prefixes: every decode pool needs prefix_caching: true and the block size of the replicas it scores, or none may cache");
        }
        let shares = match &self.workload.source {
            Source::Trace { format, .. } => *format == TraceFormat::MooncakeJsonl,
            Source::AgentTrace { .. } => true,
            Source::Conversations { history, .. } => *history,
            _ => false,
        };
        if !shares {
            return bad("", "the workload shares no prompt blocks (no trace block hashes, no conversation history): nothing to score");
        }
        Ok(())
    }
}

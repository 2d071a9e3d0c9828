//! `cluster.topology`: the stage graph as a scenario spells it, turned into the models'
//! validated `Topology`. Without it, a scenario is the colocated one-node case.

use serde::{Deserialize, Serialize};

use cancelsim_models::cleanup::{CleanupConfig, Completions, Reclaim};
use cancelsim_models::topology::{self, Link, LinkSpec, PrefillDecode, Role, Stage, Topology};

use super::validate::Invalid;
use super::Scenario;

/// The stage graph: its stages, and the links between them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TopologySpec {
    pub stages: Vec<StageSpec>,
    #[serde(default)]
    pub links: Vec<LinkRon>,
    /// How the prefill and decode stages hand a request over, and clean up after it.
    #[serde(default)]
    pub handoff: HandoffSpec,
}

/// The mechanisms of the prefill-to-decode handoff, each as a real runtime may have it. The
/// defaults are vLLM's with its NIXL connector as of the research note: aborts handled before
/// output processing (the fix of vllm#29987), a 480 s abort timeout on the prefill side
/// (vllm#41269), no reclaim deadline on the decode side (vllm#46283, open).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct HandoffSpec {
    /// When a prefill node handles an abort that arrived during a request's final prefill step.
    pub abort_order: AbortOrder,
    /// What a cancel does to a KV transfer on the wire.
    pub transfer_cancel: TransferCancel,
    /// How the prefill side gets back blocks kept for a decode that never confirms.
    pub prefill_reclaim: ReclaimSpec,
    /// How the decode side gets back the receive blocks of a request aborted while its KV was
    /// on the way.
    pub decode_reclaim: ReclaimSpec,
    /// Whether a decode-side hold waits for one completion, or for two (receive and send) and
    /// frees on the first, so that the second faults the engine (vllm#46240).
    pub decode_completions: CompletionsSpec,
    /// The router tells the prefill stage about a request cancelled after its prefill, so the
    /// prefill side frees at once (vllm#41269's notification, `abort_immediately`).
    pub notify_prefill: bool,
    /// KV bytes per prompt token on the wire; unset: the profile's (a `Custom` profile's is
    /// Llama-3.1-8B's, 131,072).
    pub kv_bytes_per_token: Option<u64>,
    /// Probability that a KV transfer fails (after its wire time): the decode side then computes
    /// the prompt again, as vLLM's `kv_load_failure_policy: recompute` does.
    pub transfer_failure: f64,
    /// Probability that cancelling a transfer on the wire wedges its sending prefill engine: a
    /// stuck sender or a stalled collective leaves it alive but making no progress.
    pub wedge_probability: f64,
    /// A hang detector kills a wedged engine after this long (every request on it fails) and
    /// it starts again; unset, a wedged engine stays wedged (TensorRT-LLM's detector: 300 s).
    pub hang_detector_ms: Option<f64>,
    /// Conditional disaggregation, Dynamo's rule: a request is prefilled on the decode replica
    /// the router picks for it unless the part of its prompt that replica has not cached is
    /// longer than `max_local_prefill_tokens` (and the prefill stage is not too busy); unset,
    /// every request is prefilled on the prefill stage.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub conditional: Option<ConditionalSpec>,
}

/// When a request skips the prefill stage (`handoff.conditional`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ConditionalSpec {
    /// A prompt whose uncached part is at most this many tokens is prefilled locally, on its
    /// decode replica (Dynamo's `max_local_prefill_length`).
    pub max_local_prefill_tokens: u32,
    /// When every prefill replica holds at least this many requests, a request is prefilled
    /// locally whatever its length (Dynamo's `max_prefill_queue_size`); unset: never.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_prefill_queue: Option<u32>,
}

impl Default for HandoffSpec {
    fn default() -> Self {
        HandoffSpec {
            abort_order: AbortOrder::BeforeOutput,
            transfer_cancel: TransferCancel::AtTransferEnd,
            prefill_reclaim: ReclaimSpec::Lease {
                lease_ms: 480_000.0,
                grace_ms: 0.0,
            },
            decode_reclaim: ReclaimSpec::Never,
            decode_completions: CompletionsSpec::Counted,
            notify_prefill: false,
            kv_bytes_per_token: None,
            transfer_failure: 0.0,
            wedge_probability: 0.0,
            hang_detector_ms: None,
            conditional: None,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub enum AbortOrder {
    /// Aborts first: a cancel that arrived during the final prefill step aborts the request at
    /// the step's boundary, and its blocks go back.
    BeforeOutput,
    /// Outputs first: the request completes its prefill "normally", and its blocks stay pinned
    /// for a decode that never comes (vllm#26400).
    AfterOutput,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub enum TransferCancel {
    /// The transfer stops at once; both sides may free. Stopping a transfer on the wire is what
    /// can wedge its sender (`wedge_probability`).
    AtOnce,
    /// The transfer runs to its end (a late RDMA write could land); the blocks stay until then.
    /// Its completion notifies the prefill side as any transfer's does (vLLM's NIXL READ
    /// notifies the prefill agent when it completes; with Mooncake's push the sender knows its
    /// write finished), so the prefill side frees then, unless the notice is lost.
    AtTransferEnd,
    /// As `AtTransferEnd`, for a connector with no completion notice for a transfer the decode
    /// side aborted: the prefill side keeps the blocks until `notify_prefill` or its lease.
    AtTransferEndNoNotice,
}

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub enum ReclaimSpec {
    /// Held until the notice comes: forever, if it never does.
    Never,
    /// Freed `lease_ms + grace_ms` after the hold began, if no notice came first.
    Lease { lease_ms: f64, grace_ms: f64 },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub enum CompletionsSpec {
    Counted,
    FirstFrees,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StageSpec {
    pub name: String,
    pub role: RoleSpec,
    /// Replicas of a serving stage (Colocated, Prefill, Decode); ignored for the others.
    #[serde(default = "one")]
    pub replicas: u32,
    /// A prefill or decode stage's own GPU profile (`Named` or `Custom`); unset:
    /// `cluster.profile`. Both sides must serve one model (one KV size per token).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<super::ProfileRef>,
    /// A prefill or decode stage's own scheduler (its pool: `kv_blocks`, `max_num_seqs`, ...);
    /// unset: `cluster.scheduler`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduler: Option<super::Scheduler>,
}

fn one() -> u32 {
    1
}

impl StageSpec {
    /// A Colocated, Prefill or Decode stage: one that runs replicas.
    pub fn role_serves(&self) -> bool {
        matches!(
            self.role,
            RoleSpec::Colocated | RoleSpec::Prefill | RoleSpec::Decode
        )
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub enum RoleSpec {
    Router,
    Colocated,
    Prefill,
    Decode,
    Playback,
}

/// A link: its ends by stage name, its latency, its bandwidth for KV bytes (none: within a
/// node, free) and the probability that a message on it is lost.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LinkRon {
    pub from: String,
    pub to: String,
    #[serde(default)]
    pub latency_ms: f64,
    #[serde(default)]
    pub bandwidth_gbps: Option<f64>,
    #[serde(default)]
    pub loss: f64,
}

/// Longest link latency accepted: a day.
const LATENCY_MS_MAX: f64 = 86_400_000.0;

fn role(r: RoleSpec) -> Role {
    match r {
        RoleSpec::Router => Role::Router,
        RoleSpec::Colocated => Role::Colocated,
        RoleSpec::Prefill => Role::Prefill,
        RoleSpec::Decode => Role::Decode,
        RoleSpec::Playback => Role::Playback,
    }
}

fn link(i: usize, l: &LinkRon) -> Result<LinkSpec, Invalid> {
    let bad = |field: &str, message: String| Invalid {
        field: format!("cluster.topology.links[{i}].{field}"),
        message,
    };
    if !(0.0..=LATENCY_MS_MAX).contains(&l.latency_ms) {
        let m = format!("must be 0 to {LATENCY_MS_MAX} ms (got {})", l.latency_ms);
        return Err(bad("latency_ms", m));
    }
    let bytes_per_s = match l.bandwidth_gbps {
        None => f64::INFINITY,
        Some(g) if g.is_finite() && g > 0.0 => g * 1e9 / 8.0,
        Some(g) => return Err(bad("bandwidth_gbps", format!("must be > 0 (got {g})"))),
    };
    Ok(LinkSpec {
        from: l.from.clone(),
        to: l.to.clone(),
        link: Link {
            latency_ns: (l.latency_ms * 1e6).round() as u64,
            bytes_per_s,
            loss: l.loss,
        },
    })
}

impl TopologySpec {
    /// The validated graph; a problem names its field under `cluster.topology`.
    pub fn build(&self) -> Result<Topology, Invalid> {
        let stages = self
            .stages
            .iter()
            .map(|s| Stage {
                name: s.name.clone(),
                role: role(s.role),
                replicas: s.replicas,
            })
            .collect();
        let links = self
            .links
            .iter()
            .enumerate()
            .map(|(i, l)| link(i, l))
            .collect::<Result<Vec<_>, _>>()?;
        Topology::new(stages, links).map_err(|e: topology::Invalid| Invalid {
            field: format!("cluster.{}", e.field),
            message: e.message,
        })
    }
}

impl Scenario {
    /// The scenario's stage graph: as written, or the colocated case.
    pub fn topology(&self) -> Topology {
        match &self.cluster.topology {
            Some(spec) => spec.build().expect("a loaded scenario's topology is valid"),
            None => Topology::colocated(self.cluster.replicas),
        }
    }

    /// The topology section is valid, and one the world simulates: colocated, with as many
    /// replicas as `cluster.replicas`.
    pub(super) fn validate_topology(&self) -> Result<(), Invalid> {
        let handoff_stage = self
            .cancellation
            .as_ref()
            .is_some_and(|c| c.stage.is_handoff());
        let Some(spec) = &self.cluster.topology else {
            return match handoff_stage {
                true => Err(not_disaggregated()),
                false => Ok(()),
            };
        };
        let t = spec.build()?;
        spec.check_runnable(&t, self.cluster.replicas)?;
        self.validate_stages(spec)?;
        if t.prefill_decode().is_none() {
            if spec.handoff.conditional.is_some() {
                return Err(Invalid {
                    field: "cluster.topology.handoff.conditional".into(),
                    message: "decides between a prefill stage and a decode stage, and this \
                              graph has neither"
                        .into(),
                });
            }
            return match handoff_stage {
                true => Err(not_disaggregated()),
                false => Ok(()),
            };
        }
        let conditional = spec.handoff.conditional.is_some();
        if conditional && matches!(self.cluster.router, super::Router::SharedQueue { .. }) {
            return Err(Invalid {
                field: "cluster.topology.handoff.conditional".into(),
                message: "needs a router that places a request when it arrives: a shared \
                          queue places it later, after the decision is due"
                    .into(),
            });
        }
        if !matches!(self.cluster.scheduler, super::Scheduler::Continuous { .. }) {
            return Err(Invalid {
                field: "cluster.scheduler".into(),
                message: "a prefill/decode graph needs the Continuous scheduler: the dynamic \
                          batcher cannot take a request whose KV was computed elsewhere"
                    .into(),
            });
        }
        Ok(())
    }

    /// The serving side of pool `name` (a stage of the topology): the cluster's, with the
    /// stage's own profile and scheduler where it has them.
    pub fn stage_cluster(&self, name: &str) -> super::Cluster {
        let mut c = self.cluster.clone();
        let stage = (c.topology.as_ref()).and_then(|t| t.stages.iter().find(|s| s.name == name));
        let (profile, scheduler) = match stage {
            Some(s) => (s.profile.clone(), s.scheduler.clone()),
            None => (None, None),
        };
        if let Some(p) = profile {
            c.profile = p;
            // The fitted roofline's overrides and step form are the cluster profile's.
            c.roofline = None;
        }
        if let Some(sch) = scheduler {
            c.scheduler = sch;
        }
        c
    }

    /// Each stage's own profile and scheduler, checked as `cluster`'s are; both sides of the
    /// handoff serve one model.
    fn validate_stages(&self, spec: &TopologySpec) -> Result<(), Invalid> {
        let kv_size = |p: &super::ProfileRef| p.named().map(|n| n.kv_bytes_per_token);
        let model = kv_size(&self.cluster.profile);
        for (i, st) in spec.stages.iter().enumerate() {
            let at = format!("cluster.topology.stages[{i}]");
            if st.profile.is_none() && st.scheduler.is_none() {
                continue;
            }
            if !st.role_serves() {
                let m = "only a serving stage has a profile or scheduler of its own";
                return Err(Invalid {
                    field: at,
                    message: m.into(),
                });
            }
            if let Some(p) = &st.profile {
                if matches!(p, super::ProfileRef::Table { .. }) {
                    return Err(Invalid {
                        field: format!("{at}.profile"),
                        message: "a stage's profile is Named or Custom: a Table is the \
                                  cluster's only"
                            .into(),
                    });
                }
                let same = spec.handoff.kv_bytes_per_token.is_some() || kv_size(p) == model;
                if !same {
                    return Err(Invalid {
                        field: format!("{at}.profile"),
                        message: "serves another model than `cluster.profile` (its KV per \
                                  token differs): both sides of a handoff serve one model"
                            .into(),
                    });
                }
            }
            let c = self.stage_cluster(&st.name);
            super::validate::validate_serving(&c).map_err(|e| Invalid {
                field: e.field.replacen("cluster.", &format!("{at}."), 1),
                message: e.message,
            })?;
        }
        Ok(())
    }

    /// The prefill/decode pair this scenario runs, if its graph is disaggregated.
    pub fn prefill_decode(&self) -> Option<PrefillDecode> {
        self.cluster.topology.as_ref()?;
        self.topology().prefill_decode()
    }
}

impl TopologySpec {
    /// Whether the world can run this graph: colocated with as many replicas as
    /// `cluster.replicas`, or one Prefill stage feeding one Decode stage with as many replicas
    /// between them. Only the prefill-to-decode link may cost anything: the world has no other
    /// link to cross.
    fn check_runnable(&self, t: &Topology, replicas_cluster: u32) -> Result<(), Invalid> {
        let kv_link = t.prefill_decode().map(|_| {
            let role = |name: &str| self.stages.iter().find(|s| s.name == name).map(|s| s.role);
            move |l: &LinkRon| {
                role(&l.from) == Some(RoleSpec::Prefill) && role(&l.to) == Some(RoleSpec::Decode)
            }
        });
        if !t.is_colocated() && kv_link.is_none() {
            return Err(Invalid {
                field: "cluster.topology".into(),
                message: "this graph is validated and drawn, but not simulated: the world runs \
                          one Colocated stage, or Prefill stages linked to Decode stages (with \
                          Colocated stages beside them or not)"
                    .into(),
            });
        }
        if kv_link.is_some() {
            self.check_pd_links()?;
        }
        let costly = self.links.iter().position(|l| {
            let free = l.latency_ms == 0.0 && l.bandwidth_gbps.is_none() && l.loss == 0.0;
            !free && !kv_link.as_ref().is_some_and(|is_kv| is_kv(l))
        });
        if let Some(i) = costly {
            return Err(Invalid {
                field: format!("cluster.topology.links[{i}]"),
                message: "only the prefill-to-decode link carries a cost: latency, bandwidth \
                          and loss elsewhere would be ignored"
                    .into(),
            });
        }
        let replicas: u32 = t
            .stages()
            .filter(|s| s.role.serves())
            .map(|s| s.replicas)
            .sum();
        if replicas != replicas_cluster {
            return Err(Invalid {
                field: "cluster.topology.stages".into(),
                message: format!(
                    "the serving stages have {replicas} replicas in all, `cluster.replicas` says \
                     {replicas_cluster}"
                ),
            });
        }
        self.handoff.check()
    }
}

impl TopologySpec {
    /// A prefill/decode graph the world runs: the router feeds prefill stages, prefill stages
    /// feed decode stages (any of them, each link its own), decode stages feed playback.
    fn check_pd_links(&self) -> Result<(), Invalid> {
        use RoleSpec::{Colocated, Decode, Playback, Prefill, Router};
        let role = |name: &str| self.stages.iter().find(|s| s.name == name).map(|s| s.role);
        for (i, l) in self.links.iter().enumerate() {
            let ok = matches!(
                (role(&l.from), role(&l.to)),
                (Some(Router), Some(Prefill | Colocated))
                    | (Some(Prefill), Some(Decode))
                    | (Some(Decode | Colocated), Some(Playback))
            );
            if !ok {
                return Err(Invalid {
                    field: format!("cluster.topology.links[{i}]"),
                    message: format!(
                        "`{}` to `{}` is not simulated: a prefill/decode graph links the router \
                         to prefill (and colocated) stages, prefill stages to decode stages, and \
                         decode (and colocated) stages to playback",
                        l.from, l.to
                    ),
                });
            }
        }
        Ok(())
    }
}

impl HandoffSpec {
    fn check(&self) -> Result<(), Invalid> {
        let field = |f: &str| format!("cluster.topology.handoff.{f}");
        if !(0.0..=1.0).contains(&self.transfer_failure) {
            return Err(Invalid {
                field: field("transfer_failure"),
                message: format!("must be a probability (got {})", self.transfer_failure),
            });
        }
        if !(0.0..=1.0).contains(&self.wedge_probability) {
            return Err(Invalid {
                field: field("wedge_probability"),
                message: format!("must be a probability (got {})", self.wedge_probability),
            });
        }
        if self.wedge_probability > 0.0 && self.transfer_cancel != TransferCancel::AtOnce {
            return Err(Invalid {
                field: field("wedge_probability"),
                message: format!(
                    "applies only with `transfer_cancel: AtOnce` (got {}): a wedge is drawn when \
                     a cancel stops a transfer on the wire, and {:?} lets every transfer end",
                    self.wedge_probability, self.transfer_cancel
                ),
            });
        }
        if let Some(ms) = self.hang_detector_ms {
            if !(0.0..=LATENCY_MS_MAX).contains(&ms) {
                return Err(Invalid {
                    field: field("hang_detector_ms"),
                    message: format!("must be 0 to {LATENCY_MS_MAX} ms (got {ms})"),
                });
            }
        }
        if self
            .conditional
            .is_some_and(|c| c.max_prefill_queue == Some(0))
        {
            return Err(Invalid {
                field: field("conditional.max_prefill_queue"),
                message: "must be at least 1 (0 would prefill every request locally: leave \
                          out the prefill stage instead)"
                    .into(),
            });
        }
        for (name, r) in [
            ("prefill_reclaim", self.prefill_reclaim),
            ("decode_reclaim", self.decode_reclaim),
        ] {
            if let ReclaimSpec::Lease { lease_ms, grace_ms } = r {
                for (what, v) in [("lease_ms", lease_ms), ("grace_ms", grace_ms)] {
                    if !(0.0..=LATENCY_MS_MAX).contains(&v) {
                        return Err(Invalid {
                            field: format!("cluster.topology.handoff.{name}.{what}"),
                            message: format!("must be 0 to {LATENCY_MS_MAX} ms (got {v})"),
                        });
                    }
                }
            }
        }
        Ok(())
    }

    /// The cleanup owner of the prefill side (`decode: false`) or the decode side.
    pub fn cleanup(&self, decode: bool) -> CleanupConfig {
        let reclaim = match if decode {
            self.decode_reclaim
        } else {
            self.prefill_reclaim
        } {
            ReclaimSpec::Never => Reclaim::Never,
            ReclaimSpec::Lease { lease_ms, grace_ms } => Reclaim::Lease {
                lease_ns: (lease_ms * 1e6).round() as u64,
                grace_ns: (grace_ms * 1e6).round() as u64,
            },
        };
        let completions = match (decode, self.decode_completions) {
            (true, CompletionsSpec::FirstFrees) => Completions::FirstFrees,
            _ => Completions::Counted,
        };
        CleanupConfig {
            reclaim,
            completions,
            release_on_cancel: !decode && self.notify_prefill,
        }
    }
}

fn not_disaggregated() -> Invalid {
    Invalid {
        field: "cancellation.stage".into(),
        message: "KvTransfer and AwaitingRemoteKv happen only in a prefill/decode graph \
                  (`cluster.topology`)"
            .into(),
    }
}

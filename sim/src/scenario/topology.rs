//! `cluster.topology`: the stage graph as a scenario spells it, turned into the models'
//! validated `Topology`. Without it, a scenario is the colocated one-node case.

use serde::{Deserialize, Serialize};

use cancelsim_models::topology::{self, Link, LinkSpec, Role, Stage, Topology};

use super::validate::Invalid;
use super::Scenario;

/// The stage graph: its stages, and the links between them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TopologySpec {
    pub stages: Vec<StageSpec>,
    #[serde(default)]
    pub links: Vec<LinkRon>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StageSpec {
    pub name: String,
    pub role: RoleSpec,
    /// Replicas of a serving stage (Colocated, Prefill, Decode); ignored for the others.
    #[serde(default = "one")]
    pub replicas: u32,
}

fn one() -> u32 {
    1
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RoleSpec {
    Router,
    Colocated,
    Prefill,
    Decode,
    Playback,
}

/// A link: its ends by stage name, its latency, its bandwidth for KV bytes (none: within a
/// node, free) and the probability that a message on it is lost.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
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
        let Some(spec) = &self.cluster.topology else {
            return Ok(());
        };
        let t = spec.build()?;
        spec.check_runnable(&t, self.cluster.replicas)
    }
}

impl TopologySpec {
    /// Whether the world can run this graph: colocated, with local links and as many replicas as
    /// `cluster.replicas`.
    fn check_runnable(&self, t: &Topology, replicas_cluster: u32) -> Result<(), Invalid> {
        if !t.is_colocated() {
            return Err(Invalid {
                field: "cluster.topology".into(),
                message: "a disaggregated prefill/decode graph is validated and drawn, but not \
                          simulated yet: only a graph with one Colocated stage runs"
                    .into(),
            });
        }
        // The colocated world has no links to cross yet: a value there would be ignored.
        let costly = self
            .links
            .iter()
            .position(|l| l.latency_ms != 0.0 || l.bandwidth_gbps.is_some() || l.loss != 0.0);
        if let Some(i) = costly {
            return Err(Invalid {
                field: format!("cluster.topology.links[{i}]"),
                message: "a colocated graph's links are local: latency, bandwidth and loss \
                          take effect between stages that do not run yet"
                    .into(),
            });
        }
        let serving = t.stages().find(|s| s.role == Role::Colocated);
        let replicas = serving.map_or(0, |s| s.replicas);
        if replicas != replicas_cluster {
            return Err(Invalid {
                field: "cluster.topology.stages".into(),
                message: format!(
                    "the Colocated stage has {replicas} replicas, `cluster.replicas` says \
                     {replicas_cluster}"
                ),
            });
        }
        Ok(())
    }
}

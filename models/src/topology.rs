//! The stage graph of a deployment: where a request goes from the router to the playback sink,
//! held in a `petgraph` graph. Nodes are stages with a role and a replica count; edges are
//! links with a latency, a bandwidth for KV bytes and a loss probability.
//!
//! Colocated replicas are the one-node case: router → serve → playback. A disaggregated
//! deployment puts prefill and decode pools in separate stages with a KV-transfer link between
//! them (xPyD is their replica counts).
//!
//! Validation finds, each as one error naming its field: duplicate or unknown stage names, a
//! serving role without replicas, a bad link value, not exactly one router and one playback, a
//! cycle, a stage off every router-to-playback path, a path to playback that skips decoding
//! (the router cannot reach playback around the decoding stages), and a decode stage without a prefill stage feeding
//! it KV.

use std::fmt;

use petgraph::graph::{DiGraph, NodeIndex};
use petgraph::visit::{Dfs, EdgeRef, Reversed};
use petgraph::Direction;

/// What a stage does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Where requests enter; picks the replicas (and, disaggregated, the prefill/decode pair).
    Router,
    /// Prefill and decode on the same replicas: today's model.
    Colocated,
    /// Runs prompts only, then hands the KV to a decode stage.
    Prefill,
    /// Receives KV from a prefill stage and generates the output.
    Decode,
    /// The consumer of output chunks (the playback sink).
    Playback,
}

impl Role {
    /// Roles that run replicas of the engine.
    pub fn serves(self) -> bool {
        matches!(self, Role::Colocated | Role::Prefill | Role::Decode)
    }

    /// Roles that generate output tokens.
    pub fn decodes(self) -> bool {
        matches!(self, Role::Colocated | Role::Decode)
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Stage {
    pub name: String,
    pub role: Role,
    pub replicas: u32,
}

/// A link between two stages.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Link {
    pub latency_ns: u64,
    /// KV bytes per second the link carries.
    pub bytes_per_s: f64,
    /// Probability that a message on it (a cancel, a completion notice) is lost.
    pub loss: f64,
}

impl Link {
    /// A link that costs nothing: within a node.
    pub const LOCAL: Link = Link {
        latency_ns: 0,
        bytes_per_s: f64::INFINITY,
        loss: 0.0,
    };

    /// The time to move `bytes` over the link: its latency plus the bytes at its bandwidth,
    /// rounded up to a whole ns.
    pub fn transfer_ns(&self, bytes: u64) -> u64 {
        let wire = (bytes as f64 / self.bytes_per_s * 1e9).ceil();
        debug_assert!(wire.is_finite() && wire >= 0.0);
        self.latency_ns.saturating_add(wire as u64)
    }
}

/// A topology problem: the field it is about (a path in the scenario) and what is wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Invalid {
    pub field: String,
    pub message: String,
}

fn invalid<T>(field: impl Into<String>, message: impl Into<String>) -> Result<T, Invalid> {
    Err(Invalid {
        field: field.into(),
        message: message.into(),
    })
}

/// A link as written: the names of its ends.
#[derive(Clone, Debug, PartialEq)]
pub struct LinkSpec {
    pub from: String,
    pub to: String,
    pub link: Link,
}

/// Replicas of one serving stage, at most.
pub const REPLICAS_MAX: u32 = 1024;
/// Stages of one graph, at most.
pub const STAGES_MAX: usize = 64;

/// One serving stage of a prefill/decode graph: its name, its role, and its replicas.
#[derive(Clone, Debug, PartialEq)]
pub struct Pool {
    pub name: String,
    /// Prefill, Decode, or Colocated (beside the others: it prefills and decodes its own).
    pub role: Role,
    pub replicas: u32,
    /// Its first replica's index: the prefill pools' replicas come first, then the decode
    /// pools', then the colocated pools', each pool's in a run.
    pub first: u32,
}

/// The prefill and decode pools of a disaggregated graph, and the links that carry KV from a
/// prefill pool to a decode pool.
#[derive(Clone, Debug, PartialEq)]
pub struct PrefillDecode {
    /// Replicas of every prefill pool, of every decode pool, and of every colocated pool.
    pub prefill_replicas: u32,
    pub decode_replicas: u32,
    pub colocated_replicas: u32,
    /// The prefill pools in the order written, then the decode pools, then the colocated.
    pub pools: Vec<Pool>,
    /// `(prefill pool, decode pool, link)`, indices into `pools`, in the order written.
    pub links: Vec<(usize, usize, Link)>,
}

impl PrefillDecode {
    /// The pool of `replica`.
    pub fn pool_of(&self, replica: u32) -> usize {
        let p = self
            .pools
            .partition_point(|p| p.first + p.replicas <= replica);
        assert!(p < self.pools.len(), "replica {replica} is in no pool");
        p
    }

    /// The link from prefill pool `p` to decode pool `d`, if there is one.
    pub fn link(&self, p: usize, d: usize) -> Option<Link> {
        self.links
            .iter()
            .find(|&&(a, b, _)| (a, b) == (p, d))
            .map(|&(_, _, l)| l)
    }

    /// The decode pools prefill pool `p` sends KV to, in the order written.
    pub fn decodes_of(&self, p: usize) -> impl Iterator<Item = usize> + '_ {
        self.links.iter().filter(move |l| l.0 == p).map(|l| l.1)
    }

    /// The replicas of pool `i`.
    pub fn replicas_of(&self, i: usize) -> std::ops::Range<u32> {
        let p = &self.pools[i];
        p.first..p.first + p.replicas
    }
}

/// A validated stage graph.
#[derive(Clone, Debug)]
pub struct Topology {
    graph: DiGraph<Stage, Link>,
    router: NodeIndex,
    playback: NodeIndex,
}

impl Topology {
    /// The one-node case: `replicas` colocated replicas between the router and playback.
    pub fn colocated(replicas: u32) -> Topology {
        let stages = vec![
            stage("router", Role::Router, 1),
            stage("serve", Role::Colocated, replicas),
            stage("playback", Role::Playback, 1),
        ];
        let links = vec![
            spec("router", "serve", Link::LOCAL),
            spec("serve", "playback", Link::LOCAL),
        ];
        Topology::new(stages, links).expect("the colocated graph is valid")
    }

    /// Build and validate a graph.
    pub fn new(stages: Vec<Stage>, links: Vec<LinkSpec>) -> Result<Topology, Invalid> {
        check_stages(&stages)?;
        let mut graph = DiGraph::with_capacity(stages.len(), links.len());
        let nodes: Vec<NodeIndex> = stages.into_iter().map(|s| graph.add_node(s)).collect();
        for (i, l) in links.iter().enumerate() {
            check_link(i, &l.link)?;
            let end = |name: &str, side: &str| {
                let found = nodes.iter().find(|&&n| graph[n].name == name).copied();
                found.ok_or_else(|| Invalid {
                    field: format!("topology.links[{i}].{side}"),
                    message: format!("names no stage (got `{}`)", shown(name)),
                })
            };
            let (a, b) = (end(&l.from, "from")?, end(&l.to, "to")?);
            if a == b || graph.find_edge(a, b).is_some() {
                return invalid(
                    format!("topology.links[{i}]"),
                    format!("`{}` to `{}` is a self-loop or a second link", l.from, l.to),
                );
            }
            graph.add_edge(a, b, l.link);
        }
        let router = only(&graph, Role::Router)?;
        let playback = only(&graph, Role::Playback)?;
        let t = Topology {
            graph,
            router,
            playback,
        };
        t.check_shape()?;
        Ok(t)
    }

    /// No cycle, every stage on a router-to-playback path, decoding on every such path, and
    /// every decode stage fed by a prefill stage.
    fn check_shape(&self) -> Result<(), Invalid> {
        let g = &self.graph;
        if let Err(cycle) = petgraph::algo::toposort(g, None) {
            let name = &g[cycle.node_id()].name;
            return invalid(
                "topology.links",
                format!("form a cycle through stage `{name}`"),
            );
        }
        let from_router = reachable(g, self.router);
        let to_playback = reachable(Reversed(g), self.playback);
        for n in g.node_indices() {
            if !from_router.contains(&n) || !to_playback.contains(&n) {
                return invalid(
                    "topology.links",
                    format!(
                        "leave stage `{}` off every path from the router to playback",
                        g[n].name
                    ),
                );
            }
        }
        // Every path from the router to playback decodes: with the decoding stages taken out,
        // playback is out of the router's reach (parallel decode pools each decode).
        let skipping = petgraph::visit::NodeFiltered::from_fn(g, |n| !g[n].role.decodes());
        let decodes = !reachable(&skipping, self.router).contains(&self.playback);
        if !decodes {
            return invalid(
                "topology.links",
                "let a request reach playback without passing a Decode or Colocated stage",
            );
        }
        for n in g.node_indices().filter(|&n| g[n].role == Role::Decode) {
            let fed = g
                .edges_directed(n, Direction::Incoming)
                .any(|e| g[e.source()].role == Role::Prefill);
            if !fed {
                let name = &g[n].name;
                return invalid(
                    "topology.links",
                    format!("give decode stage `{name}` no KV source: link a Prefill stage to it"),
                );
            }
        }
        Ok(())
    }

    /// Whether this is the colocated case, the only one the world simulates so far.
    pub fn is_colocated(&self) -> bool {
        let serving: Vec<Role> = self
            .graph
            .node_weights()
            .map(|s| s.role)
            .filter(|r| r.serves())
            .collect();
        serving == [Role::Colocated]
    }

    /// The disaggregated shape the world simulates: one or more Prefill stages feeding one or
    /// more Decode stages, maybe Colocated stages beside them. `None` for any other graph.
    pub fn prefill_decode(&self) -> Option<PrefillDecode> {
        let g = &self.graph;
        let of = |role: Role| -> Vec<NodeIndex> {
            g.node_indices().filter(|&n| g[n].role == role).collect()
        };
        let (p, d, c) = (of(Role::Prefill), of(Role::Decode), of(Role::Colocated));
        if p.is_empty() || d.is_empty() {
            return None;
        }
        let mut pools = Vec::with_capacity(p.len() + d.len() + c.len());
        let mut first = 0;
        for &n in p.iter().chain(&d).chain(&c) {
            pools.push(Pool {
                name: g[n].name.clone(),
                role: g[n].role,
                replicas: g[n].replicas,
                first,
            });
            first += g[n].replicas;
        }
        let index = |n: NodeIndex| p.iter().chain(&d).position(|&m| m == n);
        let mut links: Vec<(usize, usize, Link)> = g
            .edge_references()
            .filter(|e| g[e.source()].role == Role::Prefill && g[e.target()].role == Role::Decode)
            .map(|e| {
                (
                    index(e.source()).unwrap(),
                    index(e.target()).unwrap(),
                    *e.weight(),
                )
            })
            .collect();
        links.sort_by_key(|l| (l.0, l.1));
        let sum = |v: &[NodeIndex]| v.iter().map(|&n| g[n].replicas).sum();
        Some(PrefillDecode {
            prefill_replicas: sum(&p),
            decode_replicas: sum(&d),
            colocated_replicas: sum(&c),
            pools,
            links,
        })
    }

    pub fn stages(&self) -> impl Iterator<Item = &Stage> {
        self.graph.node_weights()
    }

    /// The graph in Graphviz DOT, stages in the order written.
    pub fn to_dot(&self) -> String {
        let dot = petgraph::dot::Dot::with_attr_getters(
            &self.graph,
            &[
                petgraph::dot::Config::EdgeNoLabel,
                petgraph::dot::Config::NodeNoLabel,
            ],
            &|_, e| format!("label = \"{}\"", e.weight()),
            &|_, (_, s)| format!("label = \"{s}\", shape = {}", shape(s.role)),
        );
        format!("{dot:?}")
    }
}

fn shape(role: Role) -> &'static str {
    match role {
        Role::Router | Role::Playback => "ellipse",
        _ => "box",
    }
}

impl fmt::Display for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}\\n{:?}", self.name, self.role)?;
        if self.role.serves() {
            write!(f, " x{}", self.replicas)?;
        }
        Ok(())
    }
}

impl fmt::Display for Link {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if *self == Link::LOCAL {
            return f.write_str("local");
        }
        let ms = self.latency_ns as f64 / 1e6;
        let gbps = self.bytes_per_s * 8.0 / 1e9;
        write!(f, "{ms} ms, {gbps} Gb/s, loss {}", self.loss)
    }
}

fn stage(name: &str, role: Role, replicas: u32) -> Stage {
    Stage {
        name: name.into(),
        role,
        replicas,
    }
}

fn spec(from: &str, to: &str, link: Link) -> LinkSpec {
    LinkSpec {
        from: from.into(),
        to: to.into(),
        link,
    }
}

/// A name as an error shows it: on one line (escaped), and at most 64 characters.
fn shown(name: &str) -> String {
    let mut s: String = name
        .chars()
        .take(64)
        .collect::<String>()
        .escape_debug()
        .collect();
    if name.chars().nth(64).is_some() {
        s.push('…');
    }
    s
}

fn check_stages(stages: &[Stage]) -> Result<(), Invalid> {
    if stages.is_empty() || stages.len() > STAGES_MAX {
        return invalid(
            "topology.stages",
            format!("must hold 1 to {STAGES_MAX} stages (got {})", stages.len()),
        );
    }
    for (i, s) in stages.iter().enumerate() {
        let word = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
        let well_formed = !s.name.is_empty() && s.name.len() <= 64 && s.name.chars().all(word);
        if !well_formed || stages[..i].iter().any(|t| t.name == s.name) {
            return invalid(
                format!("topology.stages[{i}].name"),
                format!(
                    "must be a unique name of letters, digits, `_` and `-` (got `{}`)",
                    shown(&s.name)
                ),
            );
        }
        if s.role.serves() && !(1..=REPLICAS_MAX).contains(&s.replicas) {
            return invalid(
                format!("topology.stages[{i}].replicas"),
                format!(
                    "a {:?} stage needs 1 to {REPLICAS_MAX} replicas (got {})",
                    s.role, s.replicas
                ),
            );
        }
    }
    Ok(())
}

fn check_link(i: usize, l: &Link) -> Result<(), Invalid> {
    if l.bytes_per_s.is_nan() || l.bytes_per_s <= 0.0 {
        return invalid(format!("topology.links[{i}].bandwidth_gbps"), "must be > 0");
    }
    if !(0.0..=1.0).contains(&l.loss) {
        return invalid(
            format!("topology.links[{i}].loss"),
            format!("must be a probability in [0, 1] (got {})", l.loss),
        );
    }
    Ok(())
}

/// The one stage of `role`.
fn only(g: &DiGraph<Stage, Link>, role: Role) -> Result<NodeIndex, Invalid> {
    let found: Vec<NodeIndex> = g.node_indices().filter(|&n| g[n].role == role).collect();
    match found.as_slice() {
        [n] => Ok(*n),
        _ => invalid(
            "topology.stages",
            format!("must hold exactly one {role:?} stage (got {})", found.len()),
        ),
    }
}

/// The nodes reachable from `start` in `g`.
fn reachable<G>(g: G, start: NodeIndex) -> Vec<NodeIndex>
where
    G: petgraph::visit::IntoNeighbors<NodeId = NodeIndex> + petgraph::visit::Visitable,
{
    let mut dfs = Dfs::new(g, start);
    let mut seen = Vec::new();
    while let Some(n) = dfs.next(g) {
        seen.push(n);
    }
    seen
}

#[cfg(test)]
mod tests;

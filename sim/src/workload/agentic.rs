//! Recorded agent sessions: the agentic form of the Mooncake trace (JSON Lines, one row per
//! provider call, as NVIDIA Dynamo's `request_trace_to_mooncake --agentic` writes it and its
//! replay reads it), read into durable jobs.
//!
//! A row is `request_id`, `input_length`, `output_length`, and either a `timestamp` (ms from
//! the trace's start; a row with no dependency) or `wait_for` (the rows it starts after), then
//! `delay` (ms of the client's own wait) and `tool_wait_ms` (ms of tool work) after the last of
//! them ended. `branches` names the rows it spawns (a subagent's first row waits for it).
//! `hash_ids` (one block id per 512 prompt tokens) key the call's blocks in the prefix cache, as
//! a Mooncake trace row's do. Other fields (`session_id`, `prefix_reset`) are read past.
//!
//! The rows that depend on each other, however indirectly, are one job. Each row is a strand
//! of that job: once every row it waits for completed, its tool work runs, then the client's
//! own wait, then its call. Rows that wait for the same row run side by side (parallel
//! branches); a row that waits for several starts after the last of them. A second row with a
//! `timestamp` and no dependency starts that long after the job's first.

use std::path::Path;

use petgraph::algo::toposort;
use petgraph::graph::{DiGraph, NodeIndex};
use rustc_hash::FxHashMap;
use serde::Deserialize;

use crate::dist::ms_to_ns;
use crate::workload::trace::MOONCAKE_BLOCK_TOKENS;
use crate::workload::TOKENS_MAX;

/// Rows a trace may hold (the whole trace is in memory: a session's rows may be anywhere in it).
pub const ROWS_MAX: usize = 1 << 22;

#[derive(Deserialize)]
struct Row {
    request_id: String,
    input_length: u64,
    output_length: u64,
    #[serde(default)]
    timestamp: Option<f64>,
    #[serde(default)]
    delay: Option<f64>,
    #[serde(default)]
    tool_wait_ms: Option<f64>,
    #[serde(default)]
    wait_for: Vec<String>,
    #[serde(default)]
    branches: Vec<String>,
    #[serde(default)]
    hash_ids: Vec<u64>,
}

/// One provider call of a recorded session, and what comes before it once the calls it waits
/// for completed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceCall {
    pub input_tokens: u32,
    pub output_tokens: u32,
    /// Tool work, then the client's own wait (for a second root: its start after the first).
    pub tool_ns: u64,
    pub wait_ns: u64,
    /// The earlier calls of the session it waits for (indices into its calls).
    pub after: Vec<u32>,
    /// Its prompt's block ids (Mooncake's `hash_ids`, one per 512 tokens), for the prefix cache.
    pub hash_ids: Box<[u64]>,
}

/// One recorded session: a durable job's acceptance and its calls in dependency order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Session {
    pub start_ns: u64,
    pub calls: Vec<TraceCall>,
}

/// Every session of a trace, by start (then by first row).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentSessions {
    pub sessions: Vec<Session>,
}

/// Read and check a trace; an error names the file, the line and what is wrong.
pub fn load(path: &Path) -> Result<AgentSessions, String> {
    let shown = crate::input::shown(path);
    let text = std::fs::read_to_string(path).map_err(|e| format!("{shown}: cannot read: {e}"))?;
    let rows = parse(&text, &shown)?;
    sessions(&rows, &shown)
}

fn parse(text: &str, shown: &str) -> Result<Vec<(usize, Row)>, String> {
    let mut rows = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        if line.trim().is_empty() {
            continue;
        }
        if rows.len() >= ROWS_MAX {
            return Err(format!("{shown}:{n}: more than {ROWS_MAX} rows"));
        }
        let row: Row =
            serde_json::from_str(line).map_err(|e| format!("{shown}:{n}:{}: {e}", e.column()))?;
        check_row(&row).map_err(|m| format!("{shown}:{n}: {m}"))?;
        rows.push((n, row));
    }
    if rows.is_empty() {
        return Err(format!(
            "{shown}: no rows: an agentic trace needs at least one"
        ));
    }
    Ok(rows)
}

fn check_row(r: &Row) -> Result<(), String> {
    for (f, x) in [
        ("input_length", r.input_length),
        ("output_length", r.output_length),
    ] {
        if x == 0 || x > TOKENS_MAX as u64 {
            return Err(format!(
                "field `{f}` must be between 1 and {TOKENS_MAX} (got {x})"
            ));
        }
    }
    for (f, x) in [
        ("timestamp", r.timestamp),
        ("delay", r.delay),
        ("tool_wait_ms", r.tool_wait_ms),
    ] {
        if x.is_some_and(|x| !x.is_finite() || x < 0.0) {
            return Err(format!(
                "field `{f}` must be a finite number >= 0 (got {x:?})"
            ));
        }
    }
    let blocks = r.input_length.div_ceil(MOONCAKE_BLOCK_TOKENS);
    if !r.hash_ids.is_empty() && r.hash_ids.len() as u64 != blocks {
        return Err(format!(
            "`hash_ids` has {} block ids, but input_length {} needs {blocks} (one per \
             {MOONCAKE_BLOCK_TOKENS} tokens)",
            r.hash_ids.len(),
            r.input_length
        ));
    }
    if r.wait_for.is_empty() && r.timestamp.is_none() {
        return Err("a row that waits for no other needs a `timestamp`".into());
    }
    Ok(())
}

/// The rows as a graph of who waits for whom, then each connected part as one session.
fn sessions(rows: &[(usize, Row)], shown: &str) -> Result<AgentSessions, String> {
    let mut index: FxHashMap<&str, usize> = FxHashMap::default();
    for (k, (n, r)) in rows.iter().enumerate() {
        if index.insert(r.request_id.as_str(), k).is_some() {
            return Err(format!(
                "{shown}:{n}: `request_id` {:?} is used twice",
                r.request_id
            ));
        }
    }
    let mut g: DiGraph<usize, ()> = DiGraph::new();
    let nodes: Vec<NodeIndex> = (0..rows.len()).map(|k| g.add_node(k)).collect();
    for (k, (n, r)) in rows.iter().enumerate() {
        for dep in r.wait_for.iter().chain(&r.branches) {
            let Some(&d) = index.get(dep.as_str()) else {
                return Err(format!("{shown}:{n}: no row has the `request_id` {dep:?}"));
            };
            // A branch is spawned by this row: the edge runs from it to the branch.
            let (from, to) = if r.wait_for.contains(dep) {
                (d, k)
            } else {
                (k, d)
            };
            g.update_edge(nodes[from], nodes[to], ());
        }
    }
    toposort(&g, None).map_err(|c| {
        let n = rows[g[c.node_id()]].0;
        format!("{shown}:{n}: this row waits for itself, through a cycle of `wait_for`")
    })?;
    let parts = components(&g, rows.len());
    let mut by_part: Vec<Vec<usize>> = vec![Vec::new(); parts.iter().max().map_or(0, |m| m + 1)];
    for row in in_order(&g) {
        by_part[parts[row]].push(row);
    }
    let mut out: Vec<(u64, usize, Session)> = Vec::new();
    for part in by_part {
        out.push(session(rows, &g, &part));
    }
    let first = out.iter().map(|s| s.0).min().unwrap_or(0);
    out.sort_by_key(|s| (s.0, s.1));
    let sessions = out
        .into_iter()
        .map(|(start, _, mut s)| {
            s.start_ns = start - first;
            s
        })
        .collect();
    Ok(AgentSessions { sessions })
}

/// The rows in dependency order, the file's order among rows free at the same point (so a
/// session's calls are dispatched as its file lists them). The graph has no cycle.
fn in_order(g: &DiGraph<usize, ()>) -> Vec<usize> {
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;
    let mut waits: Vec<usize> = (g.node_indices())
        .map(|v| {
            g.neighbors_directed(v, petgraph::Direction::Incoming)
                .count()
        })
        .collect();
    let mut free: BinaryHeap<Reverse<usize>> = (0..waits.len())
        .filter(|&k| waits[k] == 0)
        .map(Reverse)
        .collect();
    let mut out = Vec::with_capacity(waits.len());
    while let Some(Reverse(k)) = free.pop() {
        out.push(k);
        for w in g.neighbors_directed(NodeIndex::new(k), petgraph::Direction::Outgoing) {
            waits[w.index()] -= 1;
            if waits[w.index()] == 0 {
                free.push(Reverse(w.index()));
            }
        }
    }
    assert_eq!(out.len(), waits.len(), "the rows form no cycle");
    out
}

/// Each row's connected part (its rows linked by `wait_for` or `branches` either way).
fn components(g: &DiGraph<usize, ()>, n: usize) -> Vec<usize> {
    let mut part = vec![usize::MAX; n];
    let mut next = 0;
    for start in g.node_indices() {
        if part[g[start]] != usize::MAX {
            continue;
        }
        let mut stack = vec![start];
        part[g[start]] = next;
        while let Some(v) = stack.pop() {
            for w in g.neighbors_undirected(v) {
                if part[g[w]] == usize::MAX {
                    part[g[w]] = next;
                    stack.push(w);
                }
            }
        }
        next += 1;
    }
    part
}

/// One part, in dependency order: (its start, its first line, the session). Each call waits
/// for the rows that point at it (its `wait_for`, or a row whose `branches` name it).
fn session(rows: &[(usize, Row)], g: &DiGraph<usize, ()>, part: &[usize]) -> (u64, usize, Session) {
    let first_line = rows[part[0]].0;
    let root_ns = |k: usize| {
        let root = g.neighbors_directed(NodeIndex::new(k), petgraph::Direction::Incoming);
        (root.count() == 0).then(|| ms_to_ns(rows[k].1.timestamp.unwrap_or(0.0)))
    };
    let start_ns = part.iter().filter_map(|&k| root_ns(k)).min().unwrap_or(0);
    let mut at: FxHashMap<usize, u32> = FxHashMap::default();
    let mut calls = Vec::with_capacity(part.len());
    for (i, &k) in part.iter().enumerate() {
        let r = &rows[k].1;
        at.insert(k, i as u32);
        let mut after: Vec<u32> = g
            .neighbors_directed(NodeIndex::new(k), petgraph::Direction::Incoming)
            .map(|d| at[&g[d]])
            .collect();
        after.sort_unstable();
        let (tool_ns, wait_ns) = match after.is_empty() {
            // A root starts when its timestamp says, from the session's first.
            true => (0, ms_to_ns(r.timestamp.unwrap_or(0.0)) - start_ns),
            false => (
                ms_to_ns(r.tool_wait_ms.unwrap_or(0.0)),
                ms_to_ns(r.delay.unwrap_or(0.0)),
            ),
        };
        calls.push(TraceCall {
            input_tokens: r.input_length as u32,
            output_tokens: r.output_length as u32,
            tool_ns,
            wait_ns,
            after,
            hash_ids: r.hash_ids.clone().into(),
        });
    }
    (start_ns, first_line, Session { start_ns, calls })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load_text(text: &str) -> Result<AgentSessions, String> {
        let rows = parse(text, "t.jsonl")?;
        sessions(&rows, "t.jsonl")
    }

    #[test]
    fn a_session_with_a_subagent_is_one_chained_job() {
        // The converter's own example: a parent, a child it spawns and waits for, the parent again.
        let t = r#"{"request_id": "p1", "session_id": "root", "input_length": 100, "output_length": 5, "timestamp": 1000.0, "branches": ["c1"]}
{"request_id": "c1", "session_id": "child", "input_length": 40, "output_length": 5, "wait_for": ["p1"], "delay": 100.0}
{"request_id": "p2", "session_id": "root", "input_length": 200, "output_length": 5, "wait_for": ["p1", "c1"], "delay": 20.0, "tool_wait_ms": 180.0}
{"request_id": "x1", "input_length": 10, "output_length": 2, "timestamp": 500.0}"#;
        let s = load_text(t).unwrap();
        assert_eq!(s.sessions.len(), 2);
        // Sorted by start, from the first: x1 at 0, the parent's session 500 ms later.
        assert_eq!(s.sessions[0].start_ns, 0);
        assert_eq!(s.sessions[1].start_ns, 500_000_000);
        let calls = &s.sessions[1].calls;
        assert_eq!(calls.len(), 3);
        assert_eq!(
            (
                calls[0].input_tokens,
                calls[1].input_tokens,
                calls[2].input_tokens
            ),
            (100, 40, 200)
        );
        assert_eq!((calls[1].wait_ns, calls[1].tool_ns), (100_000_000, 0));
        assert_eq!(
            (calls[2].wait_ns, calls[2].tool_ns),
            (20_000_000, 180_000_000)
        );
    }

    #[test]
    fn parallel_branches_wait_for_their_parent_and_a_join_for_all_of_them() {
        // `a` spawns `b` and `c`, which run side by side; `d` waits for both; `e` is a second
        // root of the same session (it joins `d`), 300 ms after `a`.
        let t = r#"{"request_id": "a", "input_length": 10, "output_length": 2, "timestamp": 1000.0, "branches": ["b", "c"]}
{"request_id": "b", "input_length": 11, "output_length": 2, "wait_for": ["a"], "tool_wait_ms": 50.0}
{"request_id": "c", "input_length": 12, "output_length": 2, "wait_for": ["a"], "delay": 20.0}
{"request_id": "e", "input_length": 14, "output_length": 2, "timestamp": 1300.0}
{"request_id": "d", "input_length": 13, "output_length": 2, "wait_for": ["b", "c", "e"]}"#;
        let s = load_text(t).unwrap();
        assert_eq!(s.sessions.len(), 1, "one connected part, one job");
        let calls = &s.sessions[0].calls;
        let by_input = |n: u32| calls.iter().position(|c| c.input_tokens == n).unwrap() as u32;
        let (a, b, c, d, e) = (
            by_input(10),
            by_input(11),
            by_input(12),
            by_input(13),
            by_input(14),
        );
        assert_eq!(calls[b as usize].after, vec![a]);
        assert_eq!(calls[c as usize].after, vec![a]);
        let mut join = vec![b, c, e];
        join.sort_unstable();
        assert_eq!(calls[d as usize].after, join);
        assert!(calls[e as usize].after.is_empty());
        assert_eq!(
            calls[e as usize].wait_ns, 300_000_000,
            "300 ms after the first root"
        );
        assert_eq!(calls[b as usize].tool_ns, 50_000_000);
        assert_eq!(calls[c as usize].wait_ns, 20_000_000);
        assert!(calls
            .iter()
            .enumerate()
            .all(|(k, x)| x.after.iter().all(|&p| p < k as u32)));
    }

    #[test]
    fn a_broken_trace_names_its_line() {
        let cases = [
            ("", "no rows"),
            ("{\"request_id\": \"a\", \"input_length\": 1}\n", "t.jsonl:1:"),
            ("{\"request_id\": \"a\", \"input_length\": 0, \"output_length\": 1, \"timestamp\": 0}", "input_length"),
            ("{\"request_id\": \"a\", \"input_length\": 1, \"output_length\": 1}", "needs a `timestamp`"),
            ("{\"request_id\": \"a\", \"input_length\": 1, \"output_length\": 1, \"wait_for\": [\"b\"]}", "no row has"),
            (
                "{\"request_id\": \"a\", \"input_length\": 1, \"output_length\": 1, \"timestamp\": 0}\n{\"request_id\": \"a\", \"input_length\": 1, \"output_length\": 1, \"timestamp\": 0}",
                "t.jsonl:2: `request_id` \"a\" is used twice",
            ),
            (
                "{\"request_id\": \"a\", \"input_length\": 1, \"output_length\": 1, \"wait_for\": [\"b\"]}\n{\"request_id\": \"b\", \"input_length\": 1, \"output_length\": 1, \"wait_for\": [\"a\"]}",
                "cycle",
            ),
            (
                "{\"request_id\": \"a\", \"input_length\": 1, \"output_length\": 1, \"timestamp\": -1}",
                "timestamp",
            ),
        ];
        for (text, want) in cases {
            let e = load_text(text).unwrap_err();
            assert!(e.contains(want), "{text}: {e}");
        }
    }
}

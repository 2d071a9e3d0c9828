//! Recorded agent sessions: the agentic form of the Mooncake trace (JSON Lines, one row per
//! provider call, as NVIDIA Dynamo's `request_trace_to_mooncake --agentic` writes it and its
//! replay reads it), read into durable jobs.
//!
//! A row is `request_id`, `input_length`, `output_length`, and either a `timestamp` (ms from
//! the trace's start; a row with no dependency) or `wait_for` (the rows it starts after), then
//! `delay` (ms of the client's own wait) and `tool_wait_ms` (ms of tool work) after the last of
//! them ended. `branches` names the rows it spawns (a subagent's first row waits for it). Other
//! fields (`session_id`, `hash_ids`, `prefix_reset`) are read past.
//!
//! The rows that depend on each other, however indirectly, are one job. This replay runs a job's
//! calls one after another, so a job's rows must form a chain: each row after the first waits
//! for the one before it (a subagent that runs while its parent waits is such a chain). Rows
//! that could run side by side (parallel branches) are refused, naming the row.

use std::path::Path;

use petgraph::algo::toposort;
use petgraph::graph::{DiGraph, NodeIndex};
use rustc_hash::FxHashMap;
use serde::Deserialize;

use crate::dist::ms_to_ns;
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
}

/// One provider call of a recorded session, and what came before it since the previous call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceCall {
    pub input_tokens: u32,
    pub output_tokens: u32,
    /// Tool work, then the client's own wait, between the previous call's end and this one.
    pub tool_ns: u64,
    pub wait_ns: u64,
}

/// One recorded session: a durable job's acceptance and its calls in order.
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
    if r.wait_for.is_empty() && r.timestamp.is_none() {
        return Err("a row that waits for no other needs a `timestamp`".into());
    }
    Ok(())
}

/// The rows as a graph of who waits for whom, then each connected part as one chained session.
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
    let order = toposort(&g, None).map_err(|c| {
        let n = rows[g[c.node_id()]].0;
        format!("{shown}:{n}: this row waits for itself, through a cycle of `wait_for`")
    })?;
    let parts = components(&g, rows.len());
    let mut by_part: Vec<Vec<usize>> = vec![Vec::new(); parts.iter().max().map_or(0, |m| m + 1)];
    for node in order {
        by_part[parts[g[node]]].push(g[node]);
    }
    let mut out: Vec<(u64, usize, Session)> = Vec::new();
    for chain in by_part {
        out.push(session(rows, &chain, shown)?);
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

/// One part, in dependency order, as a chain: (its start, its first line, the session).
fn session(
    rows: &[(usize, Row)],
    chain: &[usize],
    shown: &str,
) -> Result<(u64, usize, Session), String> {
    let (first_line, root) = &rows[chain[0]];
    let start_ns = ms_to_ns(root.timestamp.unwrap_or(0.0));
    let mut calls = Vec::with_capacity(chain.len());
    for (i, &k) in chain.iter().enumerate() {
        let (n, r) = &rows[k];
        if i > 0 {
            let prev = &rows[chain[i - 1]].1.request_id;
            if !r.wait_for.contains(prev) {
                return Err(format!(
                    "{shown}:{n}: row {:?} can run beside row {prev:?}: this replay runs a \
                     session's calls one after another, and parallel branches are not replayed \
                     yet",
                    r.request_id
                ));
            }
        }
        calls.push(TraceCall {
            input_tokens: r.input_length as u32,
            output_tokens: r.output_length as u32,
            tool_ns: if i > 0 {
                ms_to_ns(r.tool_wait_ms.unwrap_or(0.0))
            } else {
                0
            },
            wait_ns: if i > 0 {
                ms_to_ns(r.delay.unwrap_or(0.0))
            } else {
                0
            },
        });
    }
    Ok((start_ns, *first_line, Session { start_ns, calls }))
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
                "{\"request_id\": \"a\", \"input_length\": 1, \"output_length\": 1, \"timestamp\": 0, \"branches\": [\"b\", \"c\"]}\n{\"request_id\": \"b\", \"input_length\": 1, \"output_length\": 1, \"wait_for\": [\"a\"]}\n{\"request_id\": \"c\", \"input_length\": 1, \"output_length\": 1, \"wait_for\": [\"a\"]}",
                "parallel branches",
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

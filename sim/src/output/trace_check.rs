//! A structural checker for Chrome Trace Event JSON, the rules Perfetto's importer needs.
//!
//! No offline validator of the format exists, so this one checks:
//! - every `ph` is known;
//! - `ts` is a number on everything but metadata;
//! - thread events (`B`, `E`, `X`, `i`) have a pid and a tid;
//! - `B`/`E` balance per (pid, tid), and `X` has `dur >= 0`;
//! - slices nest per thread, with no partial overlap;
//! - `C` has an object of args;
//! - async `b`/`e` balance per (cat, id);
//! - each flow (cat, name, id) has exactly one `s` and one `f`, with `s` not after `f`.

use std::collections::BTreeMap;

use serde_json::Value;

/// Slices of one thread: (start, end, event index).
type Slices = Vec<(f64, f64, usize)>;
/// Per flow (cat, name, id): starts, ends, start ts, end ts.
type Flows = BTreeMap<(String, String, String), (u32, u32, f64, f64)>;

/// The state of one pass over a trace's events.
#[derive(Default)]
struct Checker {
    errs: Vec<String>,
    /// Slices per thread as (start, end, index), for the nesting check.
    slices: BTreeMap<(i64, i64), Slices>,
    /// Open `B` timestamps per thread.
    open: BTreeMap<(i64, i64), Vec<f64>>,
    /// Async begins minus ends per (cat, id).
    asyncs: BTreeMap<(String, String), i64>,
    flows: Flows,
}

const PHASES: [&str; 13] = [
    "B", "E", "X", "i", "I", "C", "b", "n", "e", "s", "t", "f", "M",
];

fn text(e: &Value, key: &str) -> String {
    e.get(key).and_then(Value::as_str).unwrap_or("").to_string()
}

fn id_of(e: &Value) -> String {
    e.get("id").map(|v| v.to_string()).unwrap_or_default()
}

impl Checker {
    /// Event `i`: its phase, timestamp and thread, then what its phase requires.
    fn event(&mut self, i: usize, e: &Value) {
        let Some(ph) = e.get("ph").and_then(Value::as_str) else {
            self.errs.push(format!("event {i}: no ph"));
            return;
        };
        if !PHASES.contains(&ph) {
            self.errs.push(format!("event {i}: unknown phase {ph:?}"));
            return;
        }
        if ph == "M" {
            return;
        }
        let Some(ts) = e.get("ts").and_then(Value::as_f64) else {
            self.errs
                .push(format!("event {i} ({ph}): ts is not a number"));
            return;
        };
        let thread = (
            e.get("pid").and_then(Value::as_i64),
            e.get("tid").and_then(Value::as_i64),
        );
        let key = match thread {
            (Some(p), Some(t)) => (p, t),
            _ if matches!(ph, "B" | "E" | "X" | "i" | "I") => {
                self.errs.push(format!("event {i} ({ph}): no pid or tid"));
                return;
            }
            _ => (-1, -1),
        };
        self.phase(i, e, ph, (ts, key));
    }

    fn phase(&mut self, i: usize, e: &Value, ph: &str, (ts, key): (f64, (i64, i64))) {
        match ph {
            "X" => match e.get("dur").and_then(Value::as_f64) {
                Some(d) if d >= 0.0 => self.slices.entry(key).or_default().push((ts, ts + d, i)),
                _ => self
                    .errs
                    .push(format!("event {i} (X): dur missing or negative")),
            },
            "B" => self.open.entry(key).or_default().push(ts),
            "E" => match self.open.entry(key).or_default().pop() {
                Some(b) if b <= ts => self.slices.entry(key).or_default().push((b, ts, i)),
                Some(_) => self.errs.push(format!("event {i} (E): ends before its B")),
                None => self
                    .errs
                    .push(format!("event {i} (E): no open B on {key:?}")),
            },
            "C" if !e.get("args").is_some_and(Value::is_object) => {
                self.errs
                    .push(format!("event {i} (C): args is not an object"));
            }
            "b" => *self.asyncs.entry((text(e, "cat"), id_of(e))).or_default() += 1,
            "e" => *self.asyncs.entry((text(e, "cat"), id_of(e))).or_default() -= 1,
            "s" | "t" | "f" => {
                let key = (text(e, "cat"), text(e, "name"), id_of(e));
                let f = self.flows.entry(key).or_insert((0, 0, f64::MAX, f64::MIN));
                if ph == "s" {
                    f.0 += 1;
                    f.2 = ts;
                } else if ph == "f" {
                    f.1 += 1;
                    f.3 = ts;
                }
            }
            _ => {}
        }
    }

    /// Slices nest per thread: sorted by start, longest first, each slice must end within every
    /// open one it starts in.
    fn nesting(&mut self) {
        for (key, list) in &mut self.slices {
            list.sort_by(|a, b| {
                a.0.total_cmp(&b.0)
                    .then(b.1.total_cmp(&a.1))
                    .then(a.2.cmp(&b.2))
            });
            let mut stack: Vec<(f64, f64)> = Vec::new();
            for &(s, e, i) in list.iter() {
                while stack.last().is_some_and(|&(_, end)| end <= s) {
                    stack.pop();
                }
                if stack.last().is_some_and(|&(_, end)| e > end) {
                    self.errs.push(format!(
                        "thread {key:?}: slice of event {i} overlaps its parent partially"
                    ));
                }
                stack.push((s, e));
            }
        }
    }

    /// Every `B` has its `E`.
    fn unclosed(&mut self) {
        for (key, stack) in &self.open {
            if !stack.is_empty() {
                let n = stack.len();
                self.errs.push(format!("thread {key:?}: {n} B without E"));
            }
        }
    }

    /// Async begins and ends, and flow starts and ends, balance.
    fn balance(&mut self) {
        for ((cat, id), n) in &self.asyncs {
            if *n != 0 {
                let m = format!("async {cat}/{id}: begins and ends do not balance ({n:+})");
                self.errs.push(m);
            }
        }
        for ((cat, name, id), (s, f, ts_s, ts_f)) in &self.flows {
            if *s != 1 || *f != 1 {
                let m = format!("flow {cat}/{name}/{id}: {s} starts and {f} ends");
                self.errs.push(m);
            } else if ts_s > ts_f {
                let m = format!("flow {cat}/{name}/{id}: ends before it starts");
                self.errs.push(m);
            }
        }
    }
}

impl Checker {
    /// The checks that need every event seen: unclosed `B`s, nesting, balance.
    fn settle(&mut self) {
        self.unclosed();
        self.nesting();
        self.balance();
        self.slices.clear();
        self.open.clear();
        self.asyncs.clear();
        self.flows.clear();
    }
}

/// Problems found, as messages (empty: the trace is well formed).
pub fn check(trace: &Value) -> Vec<String> {
    let events = match trace {
        Value::Array(a) => a,
        Value::Object(o) => match o.get("traceEvents") {
            Some(Value::Array(a)) => a,
            _ => return vec!["no traceEvents array".into()],
        },
        _ => return vec!["a trace is an array or an object with traceEvents".into()],
    };
    let mut c = Checker::default();
    for (i, e) in events.iter().enumerate() {
        c.event(i, e);
    }
    c.settle();
    c.errs
}

/// The same checks over a stream of events whose processes come one after another (each run of
/// a report is one process): each process is settled when the next begins, so memory holds one
/// process's slices, not the whole trace.
#[derive(Default)]
pub struct Streaming {
    c: Checker,
    seen: usize,
    pid: Option<i64>,
}

impl Streaming {
    pub fn event(&mut self, e: &Value) {
        let pid = e.get("pid").and_then(Value::as_i64);
        let meta = e.get("ph").and_then(Value::as_str) == Some("M");
        if !meta && pid != self.pid {
            if self.pid.is_some() {
                self.c.settle();
            }
            self.pid = pid;
        }
        self.c.event(self.seen, e);
        self.seen += 1;
    }

    /// Problems found, as messages (empty: well formed).
    pub fn finish(mut self) -> Vec<String> {
        self.c.settle();
        self.c.errs
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn accepts_a_well_formed_trace() {
        let t = json!({"traceEvents": [
            {"ph": "M", "name": "process_name", "pid": 0, "args": {"name": "p"}},
            {"ph": "X", "name": "a", "pid": 0, "tid": 1, "ts": 0, "dur": 10},
            {"ph": "X", "name": "b", "pid": 0, "tid": 1, "ts": 2, "dur": 3},
            {"ph": "B", "name": "c", "pid": 0, "tid": 2, "ts": 5},
            {"ph": "E", "pid": 0, "tid": 2, "ts": 6},
            {"ph": "b", "cat": "r", "id": 7, "name": "r", "pid": 0, "tid": 0, "ts": 1},
            {"ph": "e", "cat": "r", "id": 7, "name": "r", "pid": 0, "tid": 0, "ts": 9},
            {"ph": "s", "cat": "c", "name": "f", "id": 1, "pid": 0, "tid": 1, "ts": 3},
            {"ph": "f", "cat": "c", "name": "f", "id": 1, "pid": 0, "tid": 1, "ts": 4, "bp": "e"},
            {"ph": "C", "name": "kv", "pid": 0, "ts": 1, "args": {"blocks": 3}}
        ]});
        assert_eq!(check(&t), Vec::<String>::new());
    }

    #[test]
    fn flags_the_planted_errors() {
        let t = json!([
            {"ph": "B", "name": "unclosed", "pid": 0, "tid": 1, "ts": 0},
            {"ph": "X", "name": "a", "pid": 0, "tid": 2, "ts": 0, "dur": 10},
            {"ph": "X", "name": "partial", "pid": 0, "tid": 2, "ts": 5, "dur": 10},
            {"ph": "s", "cat": "c", "name": "orphan", "id": 1, "pid": 0, "tid": 1, "ts": 3},
            {"ph": "Q", "pid": 0, "tid": 1, "ts": 3},
            {"ph": "X", "name": "neg", "pid": 0, "tid": 3, "ts": 1, "dur": -1},
            {"ph": "X", "name": "nothread", "ts": 1, "dur": 1}
        ]);
        let errs = check(&t).join("\n");
        for want in [
            "B without E",
            "overlaps its parent partially",
            "1 starts and 0 ends",
            "unknown phase",
            "dur missing or negative",
            "no pid or tid",
        ] {
            assert!(errs.contains(want), "missing {want:?} in:\n{errs}");
        }
    }

    #[test]
    fn streaming_settles_each_process_and_flags_its_errors() {
        let events = [
            json!({"ph": "X", "name": "a", "pid": 0, "tid": 2, "ts": 0, "dur": 10}),
            json!({"ph": "b", "cat": "r", "id": 1, "name": "r", "pid": 0, "tid": 0, "ts": 1}),
            json!({"ph": "X", "name": "b", "pid": 1, "tid": 2, "ts": 0, "dur": 10}),
            json!({"ph": "X", "name": "partial", "pid": 1, "tid": 2, "ts": 5, "dur": 10}),
            json!({"ph": "M", "name": "process_name", "pid": 0, "args": {"name": "p"}}),
        ];
        let mut s = Streaming::default();
        for e in &events {
            s.event(e);
        }
        let errs = s.finish().join("\n");
        // Process 0's open async track is settled when process 1 begins; process 1's partial
        // overlap at the end.
        assert!(
            errs.contains("r/1: begins and ends do not balance"),
            "{errs}"
        );
        assert!(errs.contains("overlaps its parent partially"), "{errs}");
        let whole = check(&json!(events)).join("\n");
        assert!(
            whole.contains("do not balance") && whole.contains("partially"),
            "{whole}"
        );
    }
}

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

use crate::record::TraceEvent;

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

/// What the checker reads of an event: a JSON value (a trace read back), or the typed event a
/// run writes (checked as it streams, without building a JSON value per event).
pub trait Fields {
    fn text(&self, key: &str) -> Option<&str>;
    fn number(&self, key: &str) -> Option<f64>;
    fn integer(&self, key: &str) -> Option<i64>;
    fn args_is_object(&self) -> bool;
    /// The `id`, as JSON writes it.
    fn id_text(&self) -> String;
}

impl Fields for Value {
    fn text(&self, key: &str) -> Option<&str> {
        self.get(key).and_then(Value::as_str)
    }
    fn number(&self, key: &str) -> Option<f64> {
        self.get(key).and_then(Value::as_f64)
    }
    fn integer(&self, key: &str) -> Option<i64> {
        self.get(key).and_then(Value::as_i64)
    }
    fn args_is_object(&self) -> bool {
        self.get("args").is_some_and(Value::is_object)
    }
    fn id_text(&self) -> String {
        self.get("id").map(|v| v.to_string()).unwrap_or_default()
    }
}

impl Fields for TraceEvent {
    fn text(&self, key: &str) -> Option<&str> {
        match key {
            "ph" => Some(self.ph),
            "name" => Some(&self.name),
            "cat" => self.cat,
            _ => None,
        }
    }
    fn number(&self, key: &str) -> Option<f64> {
        match key {
            "ts" => self.ts.map(|t| t as f64),
            "dur" => self.dur.map(|d| d as f64),
            _ => None,
        }
    }
    fn integer(&self, key: &str) -> Option<i64> {
        match key {
            "pid" => Some(i64::from(self.pid)),
            "tid" => self.tid.map(i64::from),
            _ => None,
        }
    }
    fn args_is_object(&self) -> bool {
        // Every `TraceArgs` variant serialises as an object.
        self.args.is_some()
    }
    fn id_text(&self) -> String {
        self.id.map(|i| i.to_string()).unwrap_or_default()
    }
}

fn text<E: Fields>(e: &E, key: &str) -> String {
    e.text(key).unwrap_or("").to_string()
}

impl Checker {
    /// Event `i`: its phase, timestamp and thread, then what its phase requires.
    fn event<E: Fields>(&mut self, i: usize, e: &E) {
        let Some(ph) = e.text("ph") else {
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
        let Some(ts) = e.number("ts") else {
            self.errs
                .push(format!("event {i} ({ph}): ts is not a number"));
            return;
        };
        let thread = (e.integer("pid"), e.integer("tid"));
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

    fn phase<E: Fields>(&mut self, i: usize, e: &E, ph: &str, (ts, key): (f64, (i64, i64))) {
        match ph {
            "X" => match e.number("dur") {
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
            "C" if !e.args_is_object() => {
                self.errs
                    .push(format!("event {i} (C): args is not an object"));
            }
            "b" => {
                *self
                    .asyncs
                    .entry((text(e, "cat"), e.id_text()))
                    .or_default() += 1
            }
            "e" => {
                *self
                    .asyncs
                    .entry((text(e, "cat"), e.id_text()))
                    .or_default() -= 1
            }
            "s" | "t" | "f" => {
                let key = (text(e, "cat"), text(e, "name"), e.id_text());
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
    pub fn event<E: Fields>(&mut self, e: &E) {
        let pid = e.integer("pid");
        let meta = e.text("ph") == Some("M");
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

    #[test]
    fn typed_events_are_checked_as_their_json_is() {
        use crate::record::{TraceArgs, TraceEvent};
        let step = |ts, dur| TraceEvent {
            dur: Some(dur),
            args: Some(TraceArgs::Step { step: 1 }),
            ..TraceEvent::at("X", "step", 0, 1, ts)
        };
        let track = |ph| TraceEvent {
            cat: Some("request"),
            id: Some(9),
            ..TraceEvent::at(ph, "request 9", 0, 0, 3)
        };
        let flow = TraceEvent {
            cat: Some("cancel"),
            id: Some(4),
            ..TraceEvent::at("s", "cancel", 1, 7, 2)
        };
        // A partial overlap, an unbalanced track, a flow without its end.
        let events = [
            step(0, 10),
            step(5, 10),
            track("b"),
            track("b"),
            track("e"),
            flow,
        ];
        let (mut typed, mut json) = (Streaming::default(), Streaming::default());
        for e in &events {
            typed.event(e);
            json.event(&serde_json::to_value(e).unwrap());
        }
        let (typed, json) = (typed.finish(), json.finish());
        assert_eq!(typed.len(), 3, "{typed:?}");
        assert_eq!(typed, json);
    }
}

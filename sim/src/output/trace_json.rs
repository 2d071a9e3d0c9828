//! One Chrome trace event as JSON, written by hand: `trace.json` holds up to 400,000 events a
//! run, and serde's generic map serializer spent about 2,000 instructions on each (every key an
//! escaped string), a quarter of a written run. The bytes are serde_json's own, field for field
//! in `TraceEvent`'s order with absent fields left out; a test holds the two equal.

use std::io::{self, Write};

use crate::record::{TraceArgs, TraceEvent};

/// `ev` as `serde_json::to_writer` writes it. The event is taken apart without `..`, so a field
/// added to `TraceEvent` does not compile until it is written here too.
pub(super) fn write_event(w: &mut impl Write, ev: &TraceEvent) -> io::Result<()> {
    let TraceEvent {
        name,
        cat,
        ph,
        pid,
        tid,
        ts,
        dur,
        id,
        bp,
        args,
    } = ev;
    w.write_all(b"{\"name\":")?;
    string(w, name)?;
    if let Some(cat) = cat {
        w.write_all(b",\"cat\":")?;
        string(w, cat)?;
    }
    w.write_all(b",\"ph\":")?;
    string(w, ph)?;
    number(w, b",\"pid\":", u64::from(*pid))?;
    let numbers = [
        (&b",\"tid\":"[..], tid.map(u64::from)),
        (b",\"ts\":", *ts),
        (b",\"dur\":", *dur),
        (b",\"id\":", *id),
    ];
    for (key, value) in numbers {
        if let Some(v) = value {
            number(w, key, v)?;
        }
    }
    if let Some(bp) = bp {
        w.write_all(b",\"bp\":")?;
        string(w, bp)?;
    }
    if let Some(args) = args {
        w.write_all(b",\"args\":")?;
        write_args(w, args)?;
    }
    w.write_all(b"}")
}

/// The untagged `TraceArgs`: each variant's fields, as an object.
fn write_args(w: &mut impl Write, args: &TraceArgs) -> io::Result<()> {
    match args {
        TraceArgs::Step { step } => number(w, b"{\"step\":", *step)?,
        TraceArgs::Request { request } => number(w, b"{\"request\":", *request)?,
        TraceArgs::SortIndex { sort_index } => {
            number(w, b"{\"sort_index\":", u64::from(*sort_index))?
        }
        TraceArgs::Name { name } => {
            w.write_all(b"{\"name\":")?;
            string(w, name)?;
        }
        TraceArgs::Outcome {
            disposition,
            sibling,
            survived,
        } => {
            w.write_all(b"{\"disposition\":")?;
            string(w, disposition)?;
            w.write_all(b",\"sibling\":")?;
            w.write_all(boolean(*sibling))?;
            w.write_all(b",\"survived\":")?;
            w.write_all(survived.map_or(&b"null"[..], boolean))?;
        }
    }
    w.write_all(b"}")
}

fn number(w: &mut impl Write, key: &[u8], v: u64) -> io::Result<()> {
    w.write_all(key)?;
    w.write_all(itoa::Buffer::new().format(v).as_bytes())
}

fn boolean(b: bool) -> &'static [u8] {
    if b {
        b"true"
    } else {
        b"false"
    }
}

/// A JSON string. serde_json escapes only `"`, `\` and control characters, so a string without
/// them is written as it is; any other goes through serde_json itself.
fn string(w: &mut impl Write, s: &str) -> io::Result<()> {
    if s.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
        w.write_all(b"\"")?;
        w.write_all(s.as_bytes())?;
        return w.write_all(b"\"");
    }
    serde_json::to_writer(w, s).map_err(io::Error::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hand(ev: &TraceEvent) -> String {
        let mut out = Vec::new();
        write_event(&mut out, ev).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn every_shape_of_event_is_written_as_serde_json_writes_it() {
        let names = [
            "step",
            "",
            "a \"quoted\" \\ name",
            "tab\there\u{1}\u{7f}",
            "réplica ✓",
        ];
        let args = [
            None,
            Some(TraceArgs::Step { step: u64::MAX }),
            Some(TraceArgs::Request { request: 0 }),
            Some(TraceArgs::SortIndex { sort_index: 7 }),
            Some(TraceArgs::Name {
                name: "replica 3 / \"requests\"\n".into(),
            }),
            Some(TraceArgs::Outcome {
                disposition: "cancelled",
                sibling: true,
                survived: Some(false),
            }),
            Some(TraceArgs::Outcome {
                disposition: "completed",
                sibling: false,
                survived: None,
            }),
        ];
        let mut shapes = 0;
        for (i, name) in names.iter().enumerate() {
            for (j, a) in args.iter().enumerate() {
                // Every optional field present and absent, across the combinations.
                let bit = |k: usize| (i * args.len() + j) >> k & 1 == 1;
                let ev = TraceEvent {
                    cat: bit(0).then_some("gpu"),
                    tid: bit(1).then_some(1_000_000),
                    ts: bit(2).then_some(123_456_789),
                    dur: bit(3).then_some(0),
                    id: bit(4).then_some(u64::MAX - 1),
                    bp: bit(5).then_some("e"),
                    args: a.clone(),
                    ..TraceEvent::at("X", *name, u32::MAX, 0, 0)
                };
                assert_eq!(hand(&ev), serde_json::to_string(&ev).unwrap(), "{ev:?}");
                shapes += 1;
            }
        }
        assert_eq!(shapes, names.len() * args.len());
    }
}

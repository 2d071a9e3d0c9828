//! `cancelsim replay`: drive the ownership controller with a JSON Lines op log.
//!
//! One JSON object comes out per input line, in order: `{"result": "<word>"}` (plus `"payload"`
//! for `submitted`) or `{"error": "<message>"}`. Field presence and JSON types are checked before
//! anything else, and an error line leaves every piece of state unchanged, tickets included.

use std::collections::{HashMap, HashSet};
use std::io::{self, BufRead, Write};

use serde_json::{Map, Value};

use cancelsim_models::ownership::{
    Admission, Disposition, Owners, OwnershipError, Retention, Ticket,
};

/// Longest op line accepted, in bytes. A longer line is an error line, not an allocation.
pub const LINE_BYTES_MAX: usize = 1 << 20;

/// The replay state: the controller plus the named admission tickets.
pub struct Replayer {
    owners: Owners<String>,
    pending: HashMap<String, Ticket<String>>,
    /// Ticket names that have been ended; a ticket is used once.
    used: HashSet<String>,
}

impl Default for Replayer {
    fn default() -> Self {
        Self::new(Retention::UNBOUNDED)
    }
}

/// The output line of a successful op, or the error message of a rejected one.
type OpResult = Result<String, String>;

/// Field types with the replay's own type rules and messages: an int is a JSON integer (not
/// `2.0`, not `true`), a number is an integer or a float. Each names its field, so a type error
/// says which field it is about.
mod field {
    use std::fmt;
    use std::marker::PhantomData;

    use serde::de::{self, Deserializer, Visitor};

    /// A field's name, as a type.
    pub trait Name {
        const NAME: &'static str;
    }

    macro_rules! names {
        ($($t:ident = $s:literal),*) => {
            $(pub struct $t;
            impl Name for $t {
                const NAME: &'static str = $s;
            })*
        };
    }

    names!(
        Request = "request",
        Generation = "generation",
        Disposition = "disposition",
        Revision = "revision",
        Payload = "payload",
        Final = "final",
        Ticket = "ticket",
        Born = "born",
        MaxAge = "max_age",
        Now = "now",
        Clear = "clear"
    );

    macro_rules! field {
        ($name:ident, $t:ty, $what:literal, $($visit:ident: $arg:ty => $conv:expr),*) => {
            pub struct $name<N>(pub $t, PhantomData<N>);

            impl<'de, N: Name> de::Deserialize<'de> for $name<N> {
                fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                    struct V<N>(PhantomData<N>);
                    impl<'de, N: Name> Visitor<'de> for V<N> {
                        type Value = $name<N>;
                        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                            write!(f, "field `{}` must be {}", N::NAME, $what)
                        }
                        $(fn $visit<E: de::Error>(self, v: $arg) -> Result<$name<N>, E> {
                            #[allow(clippy::redundant_closure_call)]
                            Ok($name(($conv)(v), PhantomData))
                        })*
                    }
                    d.deserialize_any(V(PhantomData))
                }
            }
        };
    }

    field!(Int, i128, "an integer", visit_i64: i64 => i128::from, visit_u64: u64 => i128::from);
    field!(Number, f64, "a number", visit_i64: i64 => |v| v as f64, visit_u64: u64 => |v| v as f64,
        visit_f64: f64 => |v| v);
    field!(Text, String, "a string", visit_str: &str => str::to_string,
        visit_string: String => |v| v);
    field!(Bool, bool, "a boolean", visit_bool: bool => |v| v);
}

use field::{
    Bool, Born, Clear, Disposition as Disp, Final, Generation, Int, MaxAge, Now, Number, Payload,
    Request, Revision, Text, Ticket as TicketName,
};

/// One op of the log, as its JSON object spells it. Unknown fields are errors.
#[derive(serde::Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
enum Op {
    Start {
        request: Text<Request>,
        generation: Int<Generation>,
    },
    Finish {
        request: Text<Request>,
        disposition: Text<Disp>,
    },
    Update {
        request: Text<Request>,
        revision: Int<Revision>,
        payload: Text<Payload>,
        #[serde(rename = "final")]
        fin: Option<Bool<Final>>,
    },
    AdmitBegin {
        ticket: Text<TicketName>,
        request: Text<Request>,
        generation: Int<Generation>,
        born: Number<Born>,
        max_age: Number<MaxAge>,
    },
    AdmitEnd {
        ticket: Text<TicketName>,
        now: Number<Now>,
    },
    Admit {
        request: Text<Request>,
        generation: Int<Generation>,
        born: Number<Born>,
        max_age: Number<MaxAge>,
        now: Number<Now>,
    },
    BarrierAdvance {},
    SetClear {
        clear: Bool<Clear>,
    },
}

/// The ops, as `op` spells them.
const OPS: [&str; 8] = [
    "start",
    "finish",
    "update",
    "admit_begin",
    "admit_end",
    "admit",
    "barrier_advance",
    "set_clear",
];

/// A JSON object as an op, or the message of why it is not one.
fn parse_op(obj: Map<String, Value>) -> Result<Op, String> {
    match obj.get("op") {
        None => return Err("missing field `op`".into()),
        Some(Value::String(s)) if !OPS.contains(&s.as_str()) => {
            return Err(format!("unknown op {s:?}"));
        }
        Some(Value::String(_)) => {}
        Some(_) => return Err("field `op` must be a string".into()),
    }
    serde::Deserialize::deserialize(Value::Object(obj)).map_err(|e: serde_json::Error| {
        let msg = e.to_string();
        match msg.split_once(", expected ") {
            // A type error: "invalid type: X, expected field `f` must be ...".
            Some((_, what)) if what.starts_with("field `") => what.to_string(),
            // "unknown field `x`, expected one of ...": the field is what matters.
            Some((head, _)) => head.to_string(),
            None => msg,
        }
    })
}

impl Replayer {
    pub fn new(retention: Retention) -> Self {
        Replayer {
            owners: Owners::new(retention),
            pending: HashMap::new(),
            used: HashSet::new(),
        }
    }

    pub fn owners(&self) -> &Owners<String> {
        &self.owners
    }

    /// Process one line and return its output line (without the newline).
    pub fn line(&mut self, line: &str) -> String {
        self.value(serde_json::from_str::<Value>(line))
    }

    /// Process one line that may carry the result it expects in an `expect` field: its output
    /// line, and that field taken out of the op (None if the line has none).
    pub fn line_expecting(&mut self, line: &str) -> (String, Option<Value>) {
        match serde_json::from_str::<Value>(line) {
            Ok(Value::Object(mut obj)) => {
                let expect = obj.remove("expect");
                (self.value(Ok(Value::Object(obj))), expect)
            }
            other => (self.value(other), None),
        }
    }

    fn value(&mut self, parsed: Result<Value, serde_json::Error>) -> String {
        let out = match parsed {
            Err(e) => Err(format!("malformed JSON: {e}")),
            Ok(Value::Object(obj)) => parse_op(obj).and_then(|op| self.op(op)),
            Ok(_) => Err("an op line must be a JSON object".to_string()),
        };
        match out {
            Ok(line) => line,
            Err(msg) => {
                let mut m = Map::new();
                m.insert("error".into(), Value::String(msg));
                Value::Object(m).to_string()
            }
        }
    }

    fn op(&mut self, op: Op) -> OpResult {
        match op {
            Op::Start {
                request,
                generation,
            } => {
                // The reference raises one error for all three: bad identity, reused, bad
                // generation.
                let reused = || "invalid or reused request identity".to_string();
                let generation = u64::try_from(generation.0).map_err(|_| reused())?;
                self.owners
                    .start(request.0, generation)
                    .map_err(|_| reused())?;
                Ok(result("started"))
            }
            Op::Finish {
                request,
                disposition,
            } => {
                let d = Disposition::parse(&disposition.0)
                    .ok_or_else(|| "invalid terminal disposition".to_string())?;
                match self.owners.finish(&request.0, d).map_err(err)? {
                    Some(state) => Ok(result(state.as_str())),
                    None => Ok(result("late")),
                }
            }
            Op::Update {
                request,
                revision,
                payload,
                fin,
            } => {
                let revision =
                    u64::try_from(revision.0).map_err(|_| "invalid output evidence".to_string())?;
                let fin = fin.is_some_and(|b| b.0);
                let class = self
                    .owners
                    .update(&request.0, revision, payload.0.as_bytes(), fin)
                    .map_err(err)?;
                Ok(result(class.as_str()))
            }
            Op::AdmitBegin {
                ticket,
                request,
                generation,
                born,
                max_age,
            } => self.admit_begin(ticket.0, request.0, generation.0, (born.0, max_age.0)),
            Op::AdmitEnd { ticket, now } => self.admit_end(&ticket.0, now.0),
            Op::Admit {
                request,
                generation,
                born,
                max_age,
                now,
            } => {
                let admission = self
                    .owners
                    .admit(request.0, generation.0, born.0, max_age.0, now.0)
                    .map_err(err)?;
                Ok(admission_value(admission))
            }
            Op::BarrierAdvance {} => {
                self.owners.barrier_advance();
                Ok(result("ok"))
            }
            Op::SetClear { clear } => {
                self.owners.set_clear(clear.0);
                Ok(result("ok"))
            }
        }
    }

    fn admit_begin(
        &mut self,
        ticket: String,
        request: String,
        generation: i128,
        (born, max_age): (f64, f64),
    ) -> OpResult {
        if self.pending.contains_key(&ticket) || self.used.contains(&ticket) {
            return Err(format!("ticket {ticket:?} already used"));
        }
        let t = self
            .owners
            .admit_begin(request, generation, born, max_age)
            .map_err(err)?;
        self.pending.insert(ticket, t);
        Ok(result("waiting"))
    }

    fn admit_end(&mut self, ticket: &str, now: f64) -> OpResult {
        let t = self
            .pending
            .get(ticket)
            .ok_or_else(|| format!("unknown ticket {ticket:?}"))?
            .clone();
        let admission = self.owners.admit_end(&t, now).map_err(err)?;
        self.pending.remove(ticket);
        self.used.insert(ticket.to_string());
        Ok(admission_value(admission))
    }
}

fn err(e: OwnershipError) -> String {
    e.to_string()
}

fn result(word: &str) -> String {
    format!("{{\"result\":{}}}", Value::String(word.into()))
}

/// The admission result. `result` comes first, then `payload` for `submitted`.
fn admission_value(a: Admission) -> String {
    match &a {
        Admission::Submitted(payload) => {
            // Payloads enter as JSON strings, so they are valid UTF-8.
            let text = Value::String(String::from_utf8_lossy(payload).into_owned());
            format!("{{\"result\":\"submitted\",\"payload\":{text}}}")
        }
        _ => result(a.as_str()),
    }
}

/// Why a replay stopped before the end of its input.
#[derive(Debug)]
pub enum ReplayError {
    /// The op log could not be read (the caller exits 2).
    Read(io::Error),
    /// The results could not be written (the caller exits 3).
    Write(io::Error),
    /// With expectations, a line's result was not the one it expected (the caller exits 1).
    Mismatch {
        line: u64,
        op: String,
        expected: String,
        got: String,
    },
}

/// Whether output line `got` is what `expected` asks for: a result word (`"accepted"`; `"error"`
/// for any error line), or the whole result object.
pub fn matches(expected: &Value, got: &str) -> bool {
    let Ok(got) = serde_json::from_str::<Value>(got) else {
        return false;
    };
    match expected {
        Value::String(w) if w == "error" => got.get("error").is_some(),
        Value::String(w) => got.get("result").and_then(Value::as_str) == Some(w.as_str()),
        Value::Object(_) => &got == expected,
        _ => false,
    }
}

/// Skip the rest of an over-long line without keeping it: memory stays at one buffer.
fn skip_line<R: BufRead>(input: &mut R) -> io::Result<()> {
    loop {
        let chunk = input.fill_buf()?;
        if chunk.is_empty() {
            return Ok(());
        }
        match chunk.iter().position(|&b| b == b'\n') {
            Some(i) => {
                input.consume(i + 1);
                return Ok(());
            }
            None => {
                let n = chunk.len();
                input.consume(n);
            }
        }
    }
}

/// Replay every line of `input` to `output`. Returns the number of lines. Op errors are output
/// lines; only I/O stops it. A line longer than `LINE_BYTES_MAX` is an error line, and at most
/// that many bytes of it are held.
pub fn replay<R: BufRead, W: Write>(input: R, output: W) -> Result<u64, ReplayError> {
    replay_with(input, output, false)
}

/// `replay`, and with `expect` every line must carry an `expect` field (see `matches`): the
/// replay stops at the first line whose result differs, or that expects nothing, after writing
/// its result.
pub fn replay_with<R: BufRead, W: Write>(
    mut input: R,
    mut output: W,
    expect: bool,
) -> Result<u64, ReplayError> {
    let mut r = Replayer::default();
    let mut buf = Vec::new();
    let mut lines = 0u64;
    loop {
        buf.clear();
        let mut limited = io::Read::take(&mut input, LINE_BYTES_MAX as u64 + 1);
        let n = limited
            .read_until(b'\n', &mut buf)
            .map_err(ReplayError::Read)?;
        if n == 0 {
            break;
        }
        lines += 1;
        let out = if buf.len() > LINE_BYTES_MAX && !buf.ends_with(b"\n") {
            skip_line(&mut input).map_err(ReplayError::Read)?;
            format!("{{\"error\":\"line longer than {LINE_BYTES_MAX} bytes\"}}")
        } else {
            let text = buf.strip_suffix(b"\n").unwrap_or(&buf);
            let text = text.strip_suffix(b"\r").unwrap_or(text);
            match std::str::from_utf8(text) {
                Ok(s) if expect => {
                    let (out, wanted) = r.line_expecting(s);
                    write_line(&mut output, &out)?;
                    if let Err(e) = check_expectation(lines, s, wanted, &out) {
                        output.flush().map_err(ReplayError::Write)?;
                        return Err(e);
                    }
                    continue;
                }
                Ok(s) => r.line(s),
                Err(_) => "{\"error\":\"malformed JSON: line is not UTF-8\"}".to_string(),
            }
        };
        if expect {
            // An over-long or non-UTF-8 line carries no expectation that can be read.
            write_line(&mut output, &out)?;
            if let Err(e) = check_expectation(lines, "", None, &out) {
                output.flush().map_err(ReplayError::Write)?;
                return Err(e);
            }
            continue;
        }
        write_line(&mut output, &out)?;
    }
    output.flush().map_err(ReplayError::Write)?;
    Ok(lines)
}

fn write_line<W: Write>(output: &mut W, line: &str) -> Result<(), ReplayError> {
    output
        .write_all(line.as_bytes())
        .and_then(|()| output.write_all(b"\n"))
        .map_err(ReplayError::Write)
}

/// Line `line` (its text `op`) gave `got`; it wanted `wanted`.
fn check_expectation(
    line: u64,
    op: &str,
    wanted: Option<Value>,
    got: &str,
) -> Result<(), ReplayError> {
    let shorten = |s: &str| s.chars().take(200).collect::<String>();
    let mismatch = |expected: String| ReplayError::Mismatch {
        line,
        op: shorten(op),
        expected,
        got: got.to_string(),
    };
    match wanted {
        None => Err(mismatch("an `expect` field, and the line has none".into())),
        Some(w) if matches(&w, got) => Ok(()),
        Some(w) => Err(mismatch(w.to_string())),
    }
}

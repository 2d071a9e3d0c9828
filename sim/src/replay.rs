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
        let out = match serde_json::from_str::<Value>(line) {
            Err(e) => Err(format!("malformed JSON: {e}")),
            Ok(Value::Object(obj)) => self.op(&obj),
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

    fn op(&mut self, obj: &Map<String, Value>) -> OpResult {
        let op = match obj.get("op") {
            None => return Err("missing field `op`".into()),
            Some(Value::String(s)) => s.as_str(),
            Some(_) => return Err("field `op` must be a string".into()),
        };
        let f = Fields { obj };
        match op {
            "start" => {
                f.only(&["request", "generation"])?;
                let request = f.string("request")?;
                let generation = f.int("generation")?;
                // The reference raises one error for all three: bad identity, reused, bad generation.
                let generation = u64::try_from(generation)
                    .map_err(|_| "invalid or reused request identity".to_string())?;
                self.owners
                    .start(request.to_string(), generation)
                    .map_err(|_| "invalid or reused request identity".to_string())?;
                Ok(result("started"))
            }
            "finish" => {
                f.only(&["request", "disposition"])?;
                let request = f.string("request")?;
                let disposition = f.string("disposition")?;
                let d = Disposition::parse(disposition)
                    .ok_or_else(|| "invalid terminal disposition".to_string())?;
                match self.owners.finish(&request.to_string(), d).map_err(err)? {
                    Some(state) => Ok(result(state.as_str())),
                    None => Ok(result("late")),
                }
            }
            "update" => {
                f.only(&["request", "revision", "payload", "final"])?;
                let request = f.string("request")?;
                let revision = f.int("revision")?;
                let payload = f.string("payload")?;
                let fin = f.bool_or("final", false)?;
                let revision =
                    u64::try_from(revision).map_err(|_| "invalid output evidence".to_string())?;
                let class = self
                    .owners
                    .update(&request.to_string(), revision, payload.as_bytes(), fin)
                    .map_err(err)?;
                Ok(result(class.as_str()))
            }
            "admit_begin" => {
                f.only(&["ticket", "request", "generation", "born", "max_age"])?;
                let ticket = f.string("ticket")?;
                let request = f.string("request")?;
                let generation = f.int("generation")?;
                let born = f.number("born")?;
                let max_age = f.number("max_age")?;
                if self.pending.contains_key(ticket) || self.used.contains(ticket) {
                    return Err(format!("ticket {ticket:?} already used"));
                }
                let t = self
                    .owners
                    .admit_begin(request.to_string(), generation, born, max_age)
                    .map_err(err)?;
                self.pending.insert(ticket.to_string(), t);
                Ok(result("waiting"))
            }
            "admit_end" => {
                f.only(&["ticket", "now"])?;
                let ticket = f.string("ticket")?;
                let now = f.number("now")?;
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
            "admit" => {
                f.only(&["request", "generation", "born", "max_age", "now"])?;
                let request = f.string("request")?;
                let generation = f.int("generation")?;
                let born = f.number("born")?;
                let max_age = f.number("max_age")?;
                let now = f.number("now")?;
                let admission = self
                    .owners
                    .admit(request.to_string(), generation, born, max_age, now)
                    .map_err(err)?;
                Ok(admission_value(admission))
            }
            "barrier_advance" => {
                f.only(&[])?;
                self.owners.barrier_advance();
                Ok(result("ok"))
            }
            "set_clear" => {
                f.only(&["clear"])?;
                let clear = f.bool("clear")?;
                self.owners.set_clear(clear);
                Ok(result("ok"))
            }
            other => Err(format!("unknown op {other:?}")),
        }
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

/// Typed access to an op line's fields. Presence and JSON type only; meaning is the op's.
struct Fields<'a> {
    obj: &'a Map<String, Value>,
}

impl<'a> Fields<'a> {
    /// Reject fields the op does not take (besides `op`), so a typo is an error, not a default.
    fn only(&self, allowed: &[&str]) -> Result<(), String> {
        // serde_json's map is ordered by key, so the first unknown field reported is stable.
        for key in self.obj.keys() {
            if key != "op" && !allowed.contains(&key.as_str()) {
                return Err(format!("unknown field `{key}`"));
            }
        }
        Ok(())
    }

    fn get(&self, name: &str) -> Result<&'a Value, String> {
        self.obj
            .get(name)
            .ok_or_else(|| format!("missing field `{name}`"))
    }

    fn string(&self, name: &str) -> Result<&'a str, String> {
        match self.get(name)? {
            Value::String(s) => Ok(s),
            _ => Err(format!("field `{name}` must be a string")),
        }
    }

    /// A JSON integer: `2.0` and `true` are not.
    fn int(&self, name: &str) -> Result<i128, String> {
        match self.get(name)? {
            Value::Number(n) if n.is_i64() => Ok(n.as_i64().expect("is_i64") as i128),
            Value::Number(n) if n.is_u64() => Ok(n.as_u64().expect("is_u64") as i128),
            _ => Err(format!("field `{name}` must be an integer")),
        }
    }

    /// An integer or a float.
    fn number(&self, name: &str) -> Result<f64, String> {
        match self.get(name)? {
            Value::Number(n) => n
                .as_f64()
                .ok_or_else(|| format!("field `{name}` must be a number")),
            _ => Err(format!("field `{name}` must be a number")),
        }
    }

    fn bool(&self, name: &str) -> Result<bool, String> {
        match self.get(name)? {
            Value::Bool(b) => Ok(*b),
            _ => Err(format!("field `{name}` must be a boolean")),
        }
    }

    fn bool_or(&self, name: &str, default: bool) -> Result<bool, String> {
        match self.obj.get(name) {
            None => Ok(default),
            Some(_) => self.bool(name),
        }
    }
}

/// Replay every line of `input` to `output`. Returns the number of lines. An I/O error on
/// reading is returned (the caller exits 2); op errors are output lines.
pub fn replay<R: BufRead, W: Write>(mut input: R, mut output: W) -> io::Result<u64> {
    let mut r = Replayer::default();
    let mut buf = Vec::new();
    let mut lines = 0u64;
    loop {
        buf.clear();
        let mut limited = io::Read::take(&mut input, LINE_BYTES_MAX as u64 + 1);
        let n = limited.read_until(b'\n', &mut buf)?;
        if n == 0 {
            break;
        }
        lines += 1;
        let out = if buf.len() > LINE_BYTES_MAX && !buf.ends_with(b"\n") {
            // Skip the rest of the over-long line.
            let mut sink = Vec::new();
            input.read_until(b'\n', &mut sink)?;
            format!("{{\"error\":\"line longer than {LINE_BYTES_MAX} bytes\"}}")
        } else {
            let text = buf.strip_suffix(b"\n").unwrap_or(&buf);
            let text = text.strip_suffix(b"\r").unwrap_or(text);
            match std::str::from_utf8(text) {
                Ok(s) => r.line(s),
                Err(_) => "{\"error\":\"malformed JSON: line is not UTF-8\"}".to_string(),
            }
        };
        output.write_all(out.as_bytes())?;
        output.write_all(b"\n")?;
    }
    output.flush()?;
    Ok(lines)
}

//! Scenario files: RON, strict, validated.
//!
//! Every config type denies unknown fields. A parse error names the file, `line:column` and the
//! field path; a semantic error (a negative rate, NaN, an empty pool) names the file and the field
//! path, and the line of that field when it can be found. Nothing here panics on user input.

use std::fmt;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::dist::Dist;
use crate::kernel::{Limits, NS_PER_S};

/// The scenario `cancelsim` runs when given no file.
pub const DEFAULT_SCENARIO: &str = include_str!("../../scenarios/default.ron");
/// The name shown for the embedded default in messages.
pub const DEFAULT_SCENARIO_PATH: &str = "<embedded>/scenarios/default.ron";

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// Used for the output directory; letters, digits, `-` and `_`.
    pub name: String,
    #[serde(default)]
    pub description: String,
    /// Run seed. `--seed` overrides it.
    #[serde(default = "default_seed")]
    pub seed: u64,
    #[serde(default)]
    pub limits: LimitsConfig,
    pub workload: Workload,
    pub server: Server,
}

fn default_seed() -> u64 {
    1
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsConfig {
    pub max_events: u64,
    pub max_time_s: f64,
    pub max_queue_len: u64,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        let d = Limits::default();
        LimitsConfig {
            max_events: d.events_max,
            max_time_s: (d.time_ns_max / NS_PER_S) as f64,
            max_queue_len: d.queue_len_max,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Workload {
    /// Number of requests the workload issues.
    pub requests: u64,
    pub arrivals: Arrivals,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub enum Arrivals {
    /// Open-loop Poisson arrivals.
    Poisson { rate_per_s: f64 },
}

/// The minimal server of the first end-to-end path: `slots` requests in service at once, each
/// holding its slot for a service time drawn from `service_ms`, FIFO queue in front. With one
/// slot and a constant service time it is an M/D/1 queue, which the tests check against
/// Pollaczek–Khinchine. The batched runtime replaces it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Server {
    pub slots: u32,
    pub service_ms: Dist,
}

/// Upper bound on the requests of one scenario, so a typo cannot ask for 10^18.
pub const REQUESTS_MAX: u64 = 100_000_000;
pub const SLOTS_MAX: u32 = 1_000_000;

/// A scenario that failed to load: one line, naming the file and where.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadError(pub String);

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for LoadError {}

impl Scenario {
    /// Read and parse a scenario file.
    pub fn load(path: &Path) -> Result<Scenario, LoadError> {
        let shown = path.display().to_string();
        let bytes = std::fs::read(path)
            .map_err(|e| LoadError(format!("{shown}: cannot read scenario: {}", io_reason(&e))))?;
        let text = String::from_utf8(bytes).map_err(|e| {
            LoadError(format!(
                "{shown}: not UTF-8 text (byte {})",
                e.utf8_error().valid_up_to()
            ))
        })?;
        Scenario::parse(&text, &shown)
    }

    /// Parse scenario text; `shown` names its origin in messages.
    pub fn parse(text: &str, shown: &str) -> Result<Scenario, LoadError> {
        if text.trim().is_empty() {
            return Err(LoadError(format!("{shown}:1:1: empty scenario file")));
        }
        let mut de = ron::Deserializer::from_str(text)
            .map_err(|e| LoadError(format!("{shown}:{}: {}", e.span.start, e.code)))?;
        let parsed: Result<Scenario, _> = serde_path_to_error::deserialize(&mut de);
        let scenario = match parsed {
            Ok(s) => s,
            Err(e) => {
                let path = e.path().to_string();
                let spanned = de.span_error(e.into_inner());
                let field = if path == "." || path == "?" {
                    String::new()
                } else {
                    format!(" (field `{path}`)")
                };
                return Err(LoadError(format!(
                    "{shown}:{}: {}{field}",
                    spanned.span.start, spanned.code
                )));
            }
        };
        de.end().map_err(|e| {
            let spanned = de.span_error(e);
            LoadError(format!("{shown}:{}: {}", spanned.span.start, spanned.code))
        })?;
        scenario.validate().map_err(|(field, msg)| {
            let at = locate_field(text, &field)
                .map(|(l, c)| format!(":{l}:{c}"))
                .unwrap_or_default();
            LoadError(format!("{shown}{at}: field `{field}` {msg}"))
        })?;
        Ok(scenario)
    }

    /// The embedded default scenario.
    pub fn default_embedded() -> Scenario {
        Scenario::parse(DEFAULT_SCENARIO, DEFAULT_SCENARIO_PATH)
            .expect("the embedded default scenario is valid (tested)")
    }

    /// Semantic validation: `(field path, message)` of the first problem.
    pub fn validate(&self) -> Result<(), (String, String)> {
        let err = |f: &str, m: String| Err((f.to_string(), m));
        if self.name.is_empty()
            || !self
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return err(
                "name",
                format!(
                    "must be non-empty and use only letters, digits, '-' and '_' (got {:?})",
                    self.name
                ),
            );
        }
        let l = &self.limits;
        if l.max_events == 0 {
            return err("limits.max_events", "must be > 0".into());
        }
        if l.max_queue_len == 0 {
            return err("limits.max_queue_len", "must be > 0".into());
        }
        if !l.max_time_s.is_finite() || l.max_time_s <= 0.0 {
            return err(
                "limits.max_time_s",
                format!("must be a finite number > 0 (got {})", l.max_time_s),
            );
        }
        if l.max_time_s > 1e9 {
            return err(
                "limits.max_time_s",
                format!("must be <= 1e9 s (got {})", l.max_time_s),
            );
        }
        let w = &self.workload;
        if w.requests == 0 || w.requests > REQUESTS_MAX {
            return err(
                "workload.requests",
                format!("must be between 1 and {REQUESTS_MAX} (got {})", w.requests),
            );
        }
        match &w.arrivals {
            Arrivals::Poisson { rate_per_s } => {
                if !rate_per_s.is_finite() || *rate_per_s <= 0.0 {
                    return err(
                        "workload.arrivals.Poisson.rate_per_s",
                        format!("must be a finite number > 0 (got {rate_per_s})"),
                    );
                }
            }
        }
        let s = &self.server;
        if s.slots == 0 || s.slots > SLOTS_MAX {
            return err(
                "server.slots",
                format!("must be between 1 and {SLOTS_MAX} (got {})", s.slots),
            );
        }
        s.service_ms
            .validate()
            .map_err(|(f, m)| (format!("server.service_ms.{f}"), m))?;
        Ok(())
    }

    pub fn limits(&self) -> Limits {
        Limits {
            events_max: self.limits.max_events,
            time_ns_max: crate::dist::ms_to_ns(self.limits.max_time_s * 1000.0),
            queue_len_max: self.limits.max_queue_len,
        }
    }

    /// BLAKE3 of the scenario's canonical RON form (after defaults, before `--seed`), so
    /// formatting and comments do not change it.
    pub fn hash(&self) -> String {
        let canonical = ron::to_string(self).expect("scenario serialises");
        blake3::hash(canonical.as_bytes()).to_hex().to_string()
    }
}

fn io_reason(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::NotFound => "no such file".into(),
        std::io::ErrorKind::PermissionDenied => "permission denied".into(),
        _ => e.to_string(),
    }
}

/// Best-effort `line:column` of a dotted field path in RON text: walks the path, finding each
/// segment's `name:` after the previous one. Enum variant segments (`Poisson`) match `Poisson(`.
fn locate_field(text: &str, field: &str) -> Option<(usize, usize)> {
    let mut from = 0usize;
    let mut found = None;
    for seg in field.split('.') {
        let seg = seg.split('[').next().unwrap_or(seg);
        let pos = find_ident(&text[from..], seg)? + from;
        found = Some(pos);
        from = pos + seg.len();
    }
    let pos = found?;
    let line = text[..pos].matches('\n').count() + 1;
    let col = pos - text[..pos].rfind('\n').map(|i| i + 1).unwrap_or(0) + 1;
    Some((line, col))
}

/// Position of `ident` used as a field name (`ident:`) or variant (`ident(`), as a whole word.
fn find_ident(hay: &str, ident: &str) -> Option<usize> {
    let mut start = 0;
    while let Some(i) = hay[start..].find(ident) {
        let at = start + i;
        let before_ok = at == 0
            || !hay[..at]
                .chars()
                .next_back()
                .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
        let rest = hay[at + ident.len()..].trim_start();
        if before_ok && (rest.starts_with(':') || rest.starts_with('(')) {
            return Some(at);
        }
        start = at + ident.len();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_default_parses_and_validates() {
        let s = Scenario::default_embedded();
        assert!(s.validate().is_ok());
    }

    #[test]
    fn hash_ignores_formatting_but_not_content() {
        let a = Scenario::default_embedded();
        let reformatted = ron::ser::to_string_pretty(&a, Default::default()).unwrap();
        let b = Scenario::parse(&reformatted, "b").unwrap();
        assert_eq!(a.hash(), b.hash());
        let mut c = a.clone();
        c.workload.requests += 1;
        assert_ne!(a.hash(), c.hash());
    }

    #[test]
    fn locate_field_walks_the_path() {
        let text = "S(\n  workload: (\n    arrivals: Poisson(rate_per_s: -1.0),\n  ),\n)";
        assert_eq!(
            locate_field(text, "workload.arrivals.Poisson.rate_per_s"),
            Some((3, 23))
        );
        assert_eq!(locate_field(text, "nope"), None);
    }
}

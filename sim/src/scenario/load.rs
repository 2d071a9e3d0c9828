//! Reading a scenario: RON text to a validated `Scenario`, with one-line errors that name the
//! file, `line:column` and the field path.

use std::fmt;
use std::path::{Path, PathBuf};

use super::{Scenario, Source, DEFAULT_SCENARIO, DEFAULT_SCENARIO_PATH};

/// A scenario that failed to load: one line, naming the file and where.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadError(pub String);

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for LoadError {}

/// The directory every file a scenario or sweep names must lie under, once set (the command line
/// sets it: the working directory, or `--data-root`). Unset, as in library use, any path goes.
static DATA_ROOT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// Set the data root, once per process. Fails if it cannot be resolved.
pub fn set_data_root(root: &Path) -> Result<(), String> {
    let resolved = root
        .canonicalize()
        .map_err(|e| format!("--data-root {}: {e}", root.display()))?;
    DATA_ROOT
        .set(resolved)
        .map_err(|_| "the data root is set once".to_string())
}

/// The data root if `file` (which exists) resolves to a place outside it.
pub fn outside_data_root(file: &Path) -> Option<&'static Path> {
    let root = DATA_ROOT.get()?;
    match file.canonicalize() {
        Ok(f) if f.starts_with(root) => None,
        _ => Some(root.as_path()),
    }
}

impl Scenario {
    /// Read and parse a scenario file.
    pub fn load(path: &Path) -> Result<Scenario, LoadError> {
        let shown = crate::input::shown(path);
        let bytes = crate::input::read_limited(path, crate::input::CONFIG_BYTES_MAX)
            .map_err(|e| LoadError(format!("{shown}: cannot read scenario: {}", io_reason(&e))))?;
        let text = String::from_utf8(bytes).map_err(|e| {
            LoadError(format!(
                "{shown}: not UTF-8 text (byte {})",
                e.utf8_error().valid_up_to()
            ))
        })?;
        // A byte-order mark, as some Windows editors write, is not part of either syntax.
        let text = text.strip_prefix('\u{feff}').unwrap_or(&text).to_string();
        let syntax = if path
            .extension()
            .is_some_and(|x| x.eq_ignore_ascii_case("json"))
        {
            Syntax::Json
        } else {
            Syntax::Ron
        };
        let mut scenario = match syntax {
            Syntax::Json => Scenario::parse_json(&text, &shown)?,
            Syntax::Ron => Scenario::parse(&text, &shown)?,
        };
        scenario.base_dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
        scenario.check_files(&text, &shown, syntax)?;
        Ok(scenario)
    }

    /// Files the scenario refers to must exist, be readable and lie under the data root.
    fn check_files(&self, text: &str, shown: &str, syntax: Syntax) -> Result<(), LoadError> {
        if let Source::Trace { path, .. } = &self.workload.source {
            self.check_file(
                path,
                "trace",
                "workload.source.Trace.path",
                (text, shown, syntax),
            )?;
        }
        if let Source::AgentTrace { path, .. } = &self.workload.source {
            self.check_file(
                path,
                "agent trace",
                "workload.source.AgentTrace.path",
                (text, shown, syntax),
            )?;
            // Its rows too, before anything is written: the error names its line.
            crate::workload::agentic::load(&self.base_dir.join(path)).map_err(LoadError)?;
        }
        if let super::ProfileRef::Table { path, .. } = &self.cluster.profile {
            self.check_file(
                path,
                "step table",
                "cluster.profile.Table.path",
                (text, shown, syntax),
            )?;
            // Its content too, before anything is written: the error names its line and column.
            crate::step_table::load(&self.base_dir.join(path)).map_err(LoadError)?;
        }
        Ok(())
    }

    /// The file at `path` (relative to the scenario) exists, is readable and lies under the
    /// data root; else an error naming `field` where the text has it.
    fn check_file(
        &self,
        path: &str,
        what: &str,
        field: &str,
        (text, shown, syntax): (&str, &str, Syntax),
    ) -> Result<(), LoadError> {
        {
            let full = self.base_dir.join(path);
            let readable = std::fs::metadata(&full).and_then(|m| {
                if m.is_file() {
                    Ok(())
                } else {
                    Err(std::io::Error::other("not a file"))
                }
            });
            let problem = match &readable {
                Ok(()) => outside_data_root(&full).map(|root| {
                    format!(
                        "{} is outside the data root {}; pass --data-root to widen it",
                        crate::input::shown(&full),
                        root.display()
                    )
                }),
                Err(e) => Some(format!(
                    "cannot read {what} {}: {}",
                    crate::input::shown(&full),
                    io_reason(e)
                )),
            };
            if let Some(problem) = problem {
                let at = locate_field(text, field, syntax)
                    .map(|(l, c)| format!(":{l}:{c}"))
                    .unwrap_or_default();
                return Err(LoadError(format!(
                    "{shown}{at}: field `{field}`: {problem}"
                )));
            }
        }
        Ok(())
    }

    /// Parse scenario text; `shown` names its origin in messages.
    pub fn parse(text: &str, shown: &str) -> Result<Scenario, LoadError> {
        if text.trim().is_empty() {
            return Err(LoadError(format!("{shown}:1:1: empty scenario file")));
        }
        // Implicit `Some`: optional fields are written as plain values.
        let options = ron::Options::default()
            .with_default_extension(ron::extensions::Extensions::IMPLICIT_SOME);
        let mut de = ron::Deserializer::from_str_with_options(text, &options)
            .map_err(|e| LoadError(format!("{shown}:{}: {}", e.span.start, e.code)))?;
        let parsed: Result<Scenario, _> = serde_path_to_error::deserialize(&mut de);
        let scenario = match parsed {
            Ok(s) => s,
            Err(e) => {
                let path = e.path().to_string();
                let spanned = de.span_error(e.into_inner());
                // After `Some(8`, the stray `.5` is an "Expected closing `)`" instead.
                let comma = matches!(
                    spanned.code,
                    ron::Error::ExpectedComma
                        | ron::Error::ExpectedOptionEnd
                        | ron::Error::ExpectedStructLikeEnd
                );
                let fraction = comma.then(|| fraction_for_whole(text, spanned.span.start, &path));
                if let Some(m) = fraction.flatten() {
                    let at = spanned.span.start;
                    return Err(LoadError(format!("{shown}:{}:{}: {m}", at.line, at.col)));
                }
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
        scenario.validated(text, shown, Syntax::Ron)
    }

    /// Parse a scenario written as JSON (the same fields and variants, by serde's external
    /// tagging: `{"Poisson": {"rate_per_s": 2.0}}`); `docs/schemas/scenario.schema.json` is its
    /// schema. A top-level `"$schema"` key, for editors, is allowed and ignored.
    pub fn parse_json(text: &str, shown: &str) -> Result<Scenario, LoadError> {
        if text.trim().is_empty() {
            return Err(LoadError(format!("{shown}:1:1: empty scenario file")));
        }
        let mut de = serde_json::Deserializer::from_str(text);
        let scenario: Scenario = serde_path_to_error::deserialize(&mut de).map_err(|e| {
            let path = e.path().to_string();
            let inner = e.into_inner();
            // A positional list of the wrong length: say what is wrong, not how long to make it.
            let listed = inner.to_string().contains("expected struct")
                && serde_json::from_str::<serde_json::Value>(text)
                    .is_ok_and(|v| super::json_shape::array_at(&v, &path));
            if listed {
                return positional_error(text, shown, &path);
            }
            json_error(shown, &path, &inner)
        })?;
        de.end().map_err(|e| json_error(shown, ".", &e))?;
        reject_positional(&scenario, text, shown)?;
        scenario.validated(text, shown, Syntax::Json)
    }

    /// The scenario if its values make sense, else an error at the offending field.
    fn validated(self, text: &str, shown: &str, syntax: Syntax) -> Result<Scenario, LoadError> {
        self.validate().map_err(|e| {
            let (field, msg) = (e.field, e.message);
            let at = locate_field(text, &field, syntax)
                .map(|(l, c)| format!(":{l}:{c}"))
                .unwrap_or_default();
            LoadError(format!("{shown}{at}: field `{field}` {msg}"))
        })?;
        let mut s = self;
        if let Some(c) = s.cancellation.as_mut() {
            c.normalize();
        }
        Ok(s)
    }

    /// The embedded default scenario.
    pub fn default_embedded() -> Scenario {
        Scenario::parse(DEFAULT_SCENARIO, DEFAULT_SCENARIO_PATH)
            .expect("the embedded default scenario is valid (tested)")
    }
}

/// RON reads `8.5` where a whole number belongs as `8` and then a stray `.5`, and calls the dot
/// an "Expected comma". Say instead which field wants a whole number (`path` is where the
/// parser was; a list item has no field), and what it got.
pub(crate) fn fraction_for_whole(
    text: &str,
    at: ron::error::Position,
    path: &str,
) -> Option<String> {
    let line = text.lines().nth(at.line.checked_sub(1)?)?;
    let dot = line.char_indices().nth(at.col.checked_sub(1)?)?.0;
    let (before, after) = line.split_at(dot);
    let fraction: String = after
        .strip_prefix('.')?
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '+' | '_'))
        .collect();
    let whole = before.trim_end_matches(|c: char| c.is_ascii_digit() || c == '_');
    let number = &before[whole.len()..];
    if number.is_empty() {
        return None;
    }
    // `field: Some(8.5)` is the same field as the implicit `field: 8.5`.
    let whole = whole.strip_suffix("Some(").unwrap_or(whole);
    let got = format!("must be a whole number (got {number}.{fraction})");
    let Some(key_end) = whole.trim_end().strip_suffix(':') else {
        return whole
            .trim_end()
            .ends_with(['[', ','])
            .then(|| format!("a list item {got}"));
    };
    let key_end = key_end.trim_end();
    let key_start = key_end
        .char_indices()
        .rev()
        .take_while(|(_, c)| c.is_ascii_alphanumeric() || *c == '_')
        .last()
        .map_or(key_end.len(), |(i, _)| i);
    let key = &key_end[key_start..];
    let parent = path.trim_end_matches('?').trim_end_matches('.');
    match (parent, key) {
        (_, "") => None,
        ("", key) => Some(format!("field `{key}` {got}")),
        (p, key) => Some(format!("field `{p}.{key}` {got}")),
    }
}

/// An error if the JSON text writes named fields as a list (see `json_shape`).
fn reject_positional(scenario: &Scenario, text: &str, shown: &str) -> Result<(), LoadError> {
    let input: serde_json::Value =
        serde_json::from_str(text).map_err(|e| json_error(shown, ".", &e))?;
    let canonical = serde_json::to_value(scenario)
        .map_err(|e| LoadError(format!("{shown}: cannot check the scenario's shape: {e}")))?;
    match super::json_shape::positional_struct(&input, &canonical) {
        Some(field) => Err(positional_error(text, shown, &field)),
        None => Ok(()),
    }
}

/// The one line for a list written where `field`'s named fields belong.
fn positional_error(text: &str, shown: &str, field: &str) -> LoadError {
    let at = locate_field(text, field, Syntax::Json)
        .map(|(l, c)| format!(":{l}:{c}"))
        .unwrap_or_default();
    LoadError(format!(
        "{shown}{at}: field `{field}`: a list where named fields belong; write an object, \
         {{\"name\": value, ...}}"
    ))
}

/// A JSON parse error as one line: `FILE:LINE:COL: message (field `path`)`.
fn json_error(shown: &str, path: &str, e: &serde_json::Error) -> LoadError {
    let field = if path == "." || path == "?" {
        String::new()
    } else {
        format!(" (field `{path}`)")
    };
    // serde_json's message ends with its own " at line L column C": it goes in front instead.
    let text = e.to_string();
    let msg = text
        .rsplit_once(" at line ")
        .map_or(text.as_str(), |(m, _)| m);
    LoadError(format!("{shown}:{}:{}: {msg}{field}", e.line(), e.column()))
}

/// How a scenario file is written, which decides how a field is found in its text.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Syntax {
    Ron,
    Json,
}

fn io_reason(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::NotFound => "no such file".into(),
        std::io::ErrorKind::PermissionDenied => "permission denied".into(),
        _ => e.to_string(),
    }
}

/// Best-effort `line:column` of a dotted field path: walks the path, finding each segment after
/// the previous one. In RON a segment is `name:`, or `Poisson(` for an enum variant; in JSON
/// every segment, variants included, is a key `"name":`.
fn locate_field(text: &str, field: &str, syntax: Syntax) -> Option<(usize, usize)> {
    let masked = match syntax {
        Syntax::Ron => mask(text),
        Syntax::Json => text.to_string(),
    };
    let text = masked.as_str();
    let mut from = 0usize;
    let mut found = None;
    for seg in field.split('.') {
        let (name, index) = match seg.split_once('[') {
            Some((n, rest)) => (n, rest.trim_end_matches(']').parse::<usize>().ok()),
            None => (seg, None),
        };
        let pos = match syntax {
            Syntax::Ron => find_ident(&text[from..], name)?,
            Syntax::Json => find_key(&text[from..], name)?,
        } + from;
        found = Some(pos);
        from = pos + name.len();
        // Into the i-th item of the list this field holds, if it can be found.
        let b = text.as_bytes();
        let item = index.and_then(|i| {
            let open = crate::locate::next_open(b, from)?;
            crate::locate::list_items(b, open).get(i).copied()
        });
        if let Some(item) = item {
            found = Some(item);
            from = item;
        }
    }
    let pos = found?;
    let line = text[..pos].matches('\n').count() + 1;
    let col = pos - text[..pos].rfind('\n').map(|i| i + 1).unwrap_or(0) + 1;
    Some((line, col))
}

/// `text` with the insides of strings and comments blanked, byte for byte, so a field name
/// written in a description or a comment is never taken for the field.
fn mask(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = b.to_vec();
    let mut i = 0;
    while i < b.len() {
        let end = match (b[i], b.get(i + 1)) {
            (b'"', _) => {
                let mut j = i + 1;
                while j < b.len() && b[j] != b'"' {
                    j += if b[j] == b'\\' { 2 } else { 1 };
                }
                out[i + 1..j.min(b.len())].fill(b' ');
                j + 1
            }
            (b'/', Some(b'/')) => {
                let j = b[i..]
                    .iter()
                    .position(|&c| c == b'\n')
                    .map_or(b.len(), |n| i + n);
                out[i..j].fill(b' ');
                j
            }
            (b'/', Some(b'*')) => {
                let j = b[i + 2..]
                    .windows(2)
                    .position(|w| w == b"*/")
                    .map_or(b.len(), |n| i + 4 + n);
                for c in &mut out[i..j] {
                    if *c != b'\n' {
                        *c = b' ';
                    }
                }
                j
            }
            _ => i + 1,
        };
        i = end;
    }
    String::from_utf8(out).expect("only ASCII bytes were replaced, whole characters at a time")
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

/// Position of the JSON key `"key"` (followed by `:`).
fn find_key(hay: &str, key: &str) -> Option<usize> {
    let quoted = format!("\"{key}\"");
    let mut start = 0;
    while let Some(i) = hay[start..].find(&quoted) {
        let at = start + i;
        if hay[at + quoted.len()..].trim_start().starts_with(':') {
            return Some(at);
        }
        start = at + quoted.len();
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
        c.seed += 1;
        assert_ne!(a.hash(), c.hash());
    }

    #[test]
    fn locate_field_walks_the_path() {
        let text = "S(\n  workload: (\n    arrivals: Poisson(rate_per_s: -1.0),\n  ),\n)";
        assert_eq!(
            locate_field(text, "workload.arrivals.Poisson.rate_per_s", Syntax::Ron),
            Some((3, 23))
        );
        assert_eq!(locate_field(text, "nope", Syntax::Ron), None);
    }

    #[test]
    fn locate_field_skips_strings_and_comments() {
        let text = "S(\n  description: \"policies: none\", // policies: here\n  /* policies: */ policies: [],\n)";
        assert_eq!(locate_field(text, "policies", Syntax::Ron), Some((3, 19)));
    }
}

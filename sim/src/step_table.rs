//! Reading a measured step-time table (`ProfileRef::Table`): a CSV file of step times on a grid,
//! with a one-line error naming the file, line:column and field of the first problem.
//!
//! ```text
//! # comments and blank lines are skipped
//! prefill_tokens,decode_seqs,kv_tokens,step_ms
//! 0,1,0,6.5
//! 512,1,0,24.0
//! ```
//!
//! Every combination of the values each column takes must appear once (a full grid); the step
//! time of a batch between points is interpolated linearly along each axis.

use std::path::Path;
use std::sync::Arc;

use cancelsim_models::gpu::{StepTable, TABLE_ROWS_MAX};

/// The header a table starts with.
pub const HEADER: &str = "prefill_tokens,decode_seqs,kv_tokens,step_ms";
const COLUMNS: [&str; 4] = ["prefill_tokens", "decode_seqs", "kv_tokens", "step_ms"];
/// A table file's size at most.
pub const TABLE_BYTES_MAX: u64 = 64 << 20;

/// The text of the table at `path`, and the name it goes by in messages.
fn read(path: &Path) -> Result<(String, String), String> {
    let shown = crate::input::shown(path);
    let text = crate::input::read_text(path, TABLE_BYTES_MAX)
        .map_err(|e| format!("{shown}: cannot read step table: {e}"))?;
    Ok((text, shown))
}

/// The table at `path`.
pub fn load(path: &Path) -> Result<Arc<StepTable>, String> {
    let (text, shown) = read(path)?;
    parse(&text, &shown).map(Arc::new)
}

/// One measured row: `(prefill_tokens, decode_seqs, kv_tokens, step_ns)`.
pub type Row = (u64, u64, u64, u64);

/// A table's rows as read, checked as [`load`] checks them, and the model shape its header names.
pub struct Rows {
    /// In file order.
    pub rows: Vec<Row>,
    /// The first word after `# model shape` in a comment line, if one is there.
    pub model_shape: Option<String>,
}

/// The rows of the table at `path`, for `profiles --check`.
pub fn load_rows(path: &Path) -> Result<Rows, String> {
    let (text, shown) = read(path)?;
    let (_, rows) = parse_rows(&text, &shown)?;
    let model_shape = text.lines().find_map(|l| {
        let rest = l.trim().strip_prefix("# model shape ")?;
        rest.split_whitespace().next().map(str::to_string)
    });
    Ok(Rows { rows, model_shape })
}

/// Parse table text; `shown` names its origin in messages.
pub fn parse(text: &str, shown: &str) -> Result<StepTable, String> {
    parse_rows(text, shown).map(|(table, _)| table)
}

/// The table and its rows.
fn parse_rows(text: &str, shown: &str) -> Result<(StepTable, Vec<Row>), String> {
    let mut rows = Vec::new();
    let mut lines_of_rows = Vec::new();
    let mut header = false;
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if !header {
            let got: Vec<&str> = line.split(',').map(str::trim).collect();
            if got != COLUMNS {
                return Err(format!(
                    "{shown}:{n}:1: the header must be `{HEADER}` (got `{line}`)"
                ));
            }
            header = true;
            continue;
        }
        if rows.len() == TABLE_ROWS_MAX {
            return Err(format!("{shown}:{n}:1: more than {TABLE_ROWS_MAX} rows"));
        }
        rows.push(row(line, n, shown)?);
        lines_of_rows.push(n);
    }
    if !header {
        return Err(format!("{shown}: empty step table: no header `{HEADER}`"));
    }
    let table = StepTable::new(&rows).map_err(|e| match e.row {
        Some(r) => format!("{shown}:{}:1: {}", lines_of_rows[r], e.message),
        None => format!("{shown}: the table {}", e.message),
    })?;
    Ok((table, rows))
}

/// One data row: three whole numbers and a step time in ms (finite, > 0, below an hour).
fn row(line: &str, n: usize, shown: &str) -> Result<(u64, u64, u64, u64), String> {
    let mut fields = [0u64; 4];
    let mut col = 1;
    let mut count = 0;
    for (j, cell) in line.split(',').enumerate() {
        if j >= 4 {
            return Err(format!("{shown}:{n}:{col}: more than 4 fields"));
        }
        let v = cell.trim();
        let name = COLUMNS[j];
        let at = |m: String| format!("{shown}:{n}:{col}: field `{name}` {m}");
        fields[j] = if j < 3 {
            v.parse::<u64>()
                .ok()
                .filter(|&x| x <= 1 << 40)
                .ok_or_else(|| at(format!("must be a whole number up to 2^40 (got `{v}`)")))?
        } else {
            let ms: f64 = v
                .parse()
                .map_err(|_| at(format!("must be a number (got `{v}`)")))?;
            if !(ms.is_finite() && ms > 0.0 && ms < 3.6e6) {
                return Err(at(format!(
                    "must be a finite time in ms, > 0 and < 3.6e6 (got {v})"
                )));
            }
            (ms * 1e6).round().max(1.0) as u64
        };
        col += cell.len() + 1;
        count += 1;
    }
    if count < 4 {
        return Err(format!(
            "{shown}:{n}:{col}: {count} fields, 4 expected ({HEADER})"
        ));
    }
    Ok((fields[0], fields[1], fields[2], fields[3]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_the_line_column_and_field() {
        let e = |text: &str| parse(text, "t.csv").unwrap_err();
        assert!(e("").contains("t.csv: empty step table"));
        assert!(e("a,b\n").starts_with("t.csv:1:1: the header"));
        let head = format!("# measured on one H100\n{HEADER}\n");
        let bad_ms = e(&format!("{head}0,1,0,NaN\n"));
        assert!(bad_ms.starts_with("t.csv:3:7: field `step_ms`"), "{bad_ms}");
        let negative = e(&format!("{head}0,-1,0,5\n"));
        assert!(
            negative.starts_with("t.csv:3:3: field `decode_seqs`"),
            "{negative}"
        );
        assert!(e(&format!("{head}0,1,0\n")).contains("3 fields, 4 expected"));
        assert!(e(&format!("{head}0,1,0,5,6\n")).contains("more than 4 fields"));
        let repeat = e(&format!("{head}0,1,0,5\n\n0,1,0,6\n"));
        assert!(
            repeat.starts_with("t.csv:5:1: repeats the point"),
            "{repeat}"
        );
        let hole = e(&format!("{head}0,1,0,5\n8,2,0,6\n"));
        assert!(hole.contains("not a full grid"), "{hole}");
        let ok = parse(&format!("{head}0,1,0,5\n8,1,0,7\n"), "t.csv").unwrap();
        let mut mid = cancelsim_models::gpu::StepShape::default();
        mid.add_prefill(0, 4);
        mid.add_decode(0);
        assert_eq!(ok.step_ns(mid), 6_000_000);
    }
}

//! Streaming readers of real request traces: one row at a time, never the whole file.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

use crate::input::{LineLimit, LINE_BYTES_MAX};
use crate::scenario::TraceFormat;

/// One request of a trace: arrival offset from the first row, and its token counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceRow {
    /// Index of the data row in the file (0-based, header excluded).
    pub row: u64,
    pub offset_ns: u64,
    pub prompt_tokens: u32,
    pub output_tokens: u32,
}

/// The file being read, by format.
enum Rows {
    /// Azure CSV through the `csv` crate: header checked, fields trimmed as they are read
    /// (`str::trim`, what the crate's `Trim::All` does, without a new record a row), blank
    /// lines skipped.
    Azure {
        csv: csv::Reader<BufReader<LineLimit<File>>>,
        record: csv::StringRecord,
    },
    /// Mooncake JSON Lines, one object per line.
    Mooncake(std::io::Lines<BufReader<LineLimit<File>>>),
}

pub struct TraceReader {
    path: PathBuf,
    rows: Rows,
    line_no: u64,
    row: u64,
    first_ns: Option<i128>,
    /// The previous row's timestamp: rows must not go back in time.
    last_ns: i128,
    /// The last row's shared-prefix block ids (Mooncake's `hash_ids`), if it has them.
    prefix_ids: Vec<u64>,
}

/// Tokens per block of Mooncake's `hash_ids`.
pub const MOONCAKE_BLOCK_TOKENS: u64 = 512;

const AZURE_HEADER: [&str; 3] = ["TIMESTAMP", "ContextTokens", "GeneratedTokens"];

impl TraceReader {
    pub fn open(path: &Path, format: TraceFormat) -> Result<TraceReader, String> {
        let f = File::open(path)
            .map_err(|e| format!("{}: cannot read trace: {e}", crate::input::shown(path)))?;
        let f = BufReader::new(LineLimit::new(f, LINE_BYTES_MAX));
        let rows = match format {
            TraceFormat::AzureCsv => Rows::Azure {
                csv: csv::ReaderBuilder::new()
                    .has_headers(false)
                    .flexible(true)
                    .from_reader(f),
                record: csv::StringRecord::new(),
            },
            TraceFormat::MooncakeJsonl => Rows::Mooncake(f.lines()),
        };
        let mut r = TraceReader {
            path: path.to_path_buf(),
            rows,
            line_no: 0,
            row: 0,
            first_ns: None,
            last_ns: i128::MIN,
            prefix_ids: Vec::new(),
        };
        if format == TraceFormat::AzureCsv {
            r.azure_header()?;
        }
        Ok(r)
    }

    fn err(&self, msg: &str) -> String {
        format!(
            "{}:{}: {msg}",
            crate::input::shown(&self.path),
            self.line_no.max(1)
        )
    }

    /// The next CSV record into the reader's buffer; false at the end of the file.
    fn next_record(&mut self) -> Result<bool, String> {
        let Rows::Azure { csv, record } = &mut self.rows else {
            unreachable!("CSV records of a CSV trace only")
        };
        let more = csv.read_record(record);
        self.line_no = record.position().map_or(self.line_no, |p| p.line());
        more.map_err(|e| self.err(&format!("cannot read: {e}")))
    }

    fn azure_header(&mut self) -> Result<(), String> {
        if !self.next_record()? {
            return Err(self.err("empty trace file"));
        }
        let Rows::Azure { record, .. } = &self.rows else {
            unreachable!()
        };
        if record.iter().map(str::trim).ne(AZURE_HEADER) {
            let found = record.iter().map(str::trim).collect::<Vec<_>>().join(",");
            return Err(self.err(&format!(
                "expected the header TIMESTAMP,ContextTokens,GeneratedTokens, found {found:?}"
            )));
        }
        Ok(())
    }

    /// The next non-blank JSON line; `None` at the end of the file.
    fn next_line(&mut self) -> Result<Option<String>, String> {
        loop {
            let Rows::Mooncake(lines) = &mut self.rows else {
                unreachable!("lines of a JSON Lines trace only")
            };
            match lines.next() {
                None => return Ok(None),
                Some(Err(e)) => return Err(self.err(&format!("cannot read: {e}"))),
                Some(Ok(line)) => {
                    self.line_no += 1;
                    if !line.trim().is_empty() {
                        return Ok(Some(line));
                    }
                }
            }
        }
    }

    /// The shared-prefix block ids of the row `next_row` returned last (empty if it has none),
    /// one per `MOONCAKE_BLOCK_TOKENS` tokens.
    pub fn prefix_ids(&self) -> &[u64] {
        &self.prefix_ids
    }

    /// The next row, or `None` at the end of the file.
    pub fn next_row(&mut self) -> Result<Option<TraceRow>, String> {
        let parsed = match &self.rows {
            Rows::Azure { .. } => self.next_azure()?,
            Rows::Mooncake(_) => self.next_mooncake()?,
        };
        let Some((t_ns, prompt, output)) = parsed else {
            return Ok(None);
        };
        // Each row against the one before it, not only the first: an arrival in the past would
        // be scheduled before the clock.
        if t_ns < self.last_ns {
            return Err(
                self.err("timestamp earlier than the previous row's (the trace must be sorted)")
            );
        }
        self.last_ns = t_ns;
        let first = *self.first_ns.get_or_insert(t_ns);
        let row = TraceRow {
            row: self.row,
            offset_ns: (t_ns - first) as u64,
            prompt_tokens: prompt,
            output_tokens: output,
        };
        self.row += 1;
        Ok(Some(row))
    }

    fn next_azure(&mut self) -> Result<Option<(i128, u32, u32)>, String> {
        if !self.next_record()? {
            return Ok(None);
        }
        let Rows::Azure { record, .. } = &self.rows else {
            unreachable!()
        };
        let field = |i: usize| record.get(i).map(str::trim);
        let [ts, ctx, gen] = match (field(0), field(1), field(2), record.len()) {
            (Some(a), Some(b), Some(c), 3) => [a, b, c],
            _ => {
                let m = "expected 3 columns: TIMESTAMP,ContextTokens,GeneratedTokens";
                return Err(self.err(m));
            }
        };
        let t = parse_timestamp_ns(ts).ok_or_else(|| self.err(&format!("bad TIMESTAMP {ts:?}")))?;
        let ctx: u32 = ctx
            .parse()
            .map_err(|_| self.err(&format!("bad ContextTokens {ctx:?}")))?;
        let gen: u32 = gen
            .parse()
            .map_err(|_| self.err(&format!("bad GeneratedTokens {gen:?}")))?;
        Ok(Some((t, ctx, gen)))
    }

    fn next_mooncake(&mut self) -> Result<Option<(i128, u32, u32)>, String> {
        #[derive(serde::Deserialize)]
        struct Row {
            timestamp: u64,
            input_length: u32,
            output_length: u32,
            #[serde(default)]
            hash_ids: Vec<u64>,
        }
        let Some(line) = self.next_line()? else {
            return Ok(None);
        };
        let r: Row = serde_json::from_str(&line).map_err(|e| self.err(&format!("bad row: {e}")))?;
        // One id per block of the prompt: a row whose ids disagree with its length would share
        // tokens it does not have, or miss some it has.
        let blocks = (r.input_length as u64).div_ceil(MOONCAKE_BLOCK_TOKENS);
        if !r.hash_ids.is_empty() && r.hash_ids.len() as u64 != blocks {
            let m = format!(
                "hash_ids has {} block ids, but input_length {} needs {blocks} (one per {} tokens)",
                r.hash_ids.len(),
                r.input_length,
                MOONCAKE_BLOCK_TOKENS
            );
            return Err(self.err(&m));
        }
        let t = r.timestamp as i128 * 1_000_000;
        self.prefix_ids = r.hash_ids;
        Ok(Some((t, r.input_length, r.output_length)))
    }
}

/// `YYYY-MM-DD HH:MM:SS[.fffffff]` to nanoseconds since 1970-01-01 (no time zone).
pub fn parse_timestamp_ns(s: &str) -> Option<i128> {
    let s = s.trim();
    parse_fixed(s.as_bytes()).or_else(|| parse_general(s))
}

/// The shape every row of the Azure traces has, `YYYY-MM-DD HH:MM:SS` and a `.` with 1 to 9
/// digits or nothing, read digit by digit at its places: the value `parse_general` gives,
/// with no splits and no parses. `None` where `s` is not of that shape or out of range; then
/// `parse_general` decides.
fn parse_fixed(b: &[u8]) -> Option<i128> {
    if b.len() < 19 || [b[4], b[7], b[10], b[13], b[16]] != *b"-- ::" {
        return None;
    }
    let num = |digits: &[u8]| {
        (digits.iter()).try_fold(0i64, |n, &c| {
            c.is_ascii_digit().then(|| n * 10 + (c - b'0') as i64)
        })
    };
    let [y, m, day, hh, mm, ss] = [0..4, 5..7, 8..10, 11..13, 14..16, 17..19].map(|r| num(&b[r]));
    let frac_ns = match &b[19..] {
        [] => 0,
        [b'.', digits @ ..] if (1..=9).contains(&digits.len()) => {
            num(digits)? * 10i64.pow(9 - digits.len() as u32)
        }
        _ => return None,
    };
    let (y, m, day, hh, mm, ss) = (y?, m?, day?, hh?, mm?, ss?);
    if !(1..=12).contains(&m) || !(1..=31).contains(&day) || hh > 23 || mm > 59 || ss > 60 {
        return None;
    }
    let days = days_from_civil(y, m as u32, day as u32);
    Some(((days * 86_400 + hh * 3600 + mm * 60 + ss) as i128) * 1_000_000_000 + frac_ns as i128)
}

/// `parse_timestamp_ns` of a trimmed `s`, field by field.
fn parse_general(s: &str) -> Option<i128> {
    let (date, time) = s.split_once(' ')?;
    let mut d = date.split('-');
    let (y, m, day): (i64, u32, u32) = (
        d.next()?.parse().ok()?,
        d.next()?.parse().ok()?,
        d.next()?.parse().ok()?,
    );
    if d.next().is_some() || !(1..=12).contains(&m) || !(1..=31).contains(&day) {
        return None;
    }
    let (hms, frac) = match time.split_once('.') {
        Some((a, b)) => (a, b),
        None => (time, ""),
    };
    let mut t = hms.split(':');
    let (hh, mm, ss): (i64, i64, i64) = (
        t.next()?.parse().ok()?,
        t.next()?.parse().ok()?,
        t.next()?.parse().ok()?,
    );
    if t.next().is_some() || hh > 23 || mm > 59 || ss > 60 {
        return None;
    }
    if frac.len() > 9 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let frac_ns: i64 = if frac.is_empty() {
        0
    } else {
        frac.parse::<i64>().ok()? * 10i64.pow(9 - frac.len() as u32)
    };
    let days = days_from_civil(y, m, day);
    Some(((days * 86_400 + hh * 3600 + mm * 60 + ss) as i128) * 1_000_000_000 + frac_ns as i128)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let mp = (m as i64 + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_parse_to_ns() {
        assert_eq!(parse_timestamp_ns("1970-01-01 00:00:00"), Some(0));
        assert_eq!(
            parse_timestamp_ns("1970-01-02 00:00:01.5"),
            Some(86_401_500_000_000)
        );
        // The Azure format: 7 fractional digits, 100 ns resolution.
        let a = parse_timestamp_ns("2023-11-16 18:17:03.9799600").unwrap();
        let b = parse_timestamp_ns("2023-11-16 18:17:04.0000001").unwrap();
        assert_eq!(b - a, 20_040_100);
        // Across midnight and a month end.
        let c = parse_timestamp_ns("2023-11-30 23:59:59.9").unwrap();
        let d = parse_timestamp_ns("2023-12-01 00:00:00.1").unwrap();
        assert_eq!(d - c, 200_000_000);
        assert_eq!(parse_timestamp_ns("2023-13-01 00:00:00"), None);
        assert_eq!(parse_timestamp_ns("yesterday"), None);
        assert_eq!(parse_timestamp_ns("2023-11-16 18:17:03.12345678901"), None);
    }

    /// Where the fixed-place reading answers, it is the general parse's answer: over strings of
    /// that shape with every place's digits drawn (ranges and lengths out of bounds included),
    /// a stray character put anywhere, and the fraction's every length.
    #[test]
    fn the_fixed_places_read_what_the_general_parse_reads() {
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        let (mut answered, mut general) = (0, 0);
        for _ in 0..200_000 {
            let mut t = format!(
                "{:04}-{:02}-{:02} {:02}:{:02}:{:02}",
                next(10_000),
                next(14),
                next(33),
                next(26),
                next(62),
                next(63)
            );
            match next(12) {
                0 => {}
                10 => t.push('.'),
                len => {
                    t.push('.');
                    (0..len).for_each(|_| t.push((b'0' + next(10) as u8) as char));
                }
            }
            if next(8) == 0 {
                let at = next(t.len() as u64) as usize;
                t.replace_range(at..at + 1, ["x", "+", " ", "-", ":", "."][next(6) as usize]);
            }
            let want = parse_general(&t);
            match parse_fixed(t.as_bytes()) {
                Some(got) => {
                    assert_eq!(Some(got), want, "{t}");
                    answered += 1;
                }
                None => general += want.is_some() as u32,
            }
        }
        // Both sides were reached: most strings in range, and some only the general parse takes.
        assert!(answered > 50_000 && general > 0, "{answered} {general}");
    }

    fn repo_trace(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../scenarios/traces")
            .join(name)
    }

    #[test]
    fn vendored_traces_read_whole_with_the_documented_row_counts() {
        for (name, format, rows) in [
            ("azure_llm_2023_conv.csv", TraceFormat::AzureCsv, 19_366),
            ("azure_llm_2023_code.csv", TraceFormat::AzureCsv, 8_819),
            (
                "mooncake_conversation_trace.jsonl",
                TraceFormat::MooncakeJsonl,
                12_031,
            ),
        ] {
            let mut r = TraceReader::open(&repo_trace(name), format).unwrap();
            let mut n = 0;
            let mut last = 0;
            while let Some(row) = r.next_row().unwrap() {
                assert!(row.offset_ns >= last, "{name} sorted");
                last = row.offset_ns;
                n += 1;
            }
            assert_eq!(n, rows, "{name}");
        }
    }

    #[test]
    fn malformed_rows_name_file_and_line() {
        let dir = std::env::temp_dir().join(format!("cancelsim-trace-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("t.csv");
        std::fs::write(&p, "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.1,10,5\n2023-11-16 18:17:04.1,x,5\n").unwrap();
        let mut r = TraceReader::open(&p, TraceFormat::AzureCsv).unwrap();
        assert!(r.next_row().unwrap().is_some());
        let e = r.next_row().unwrap_err();
        assert!(e.ends_with("t.csv:3: bad ContextTokens \"x\""), "{e}");
        std::fs::write(&p, "time,a,b\n").unwrap();
        let e = TraceReader::open(&p, TraceFormat::AzureCsv).err().unwrap();
        assert!(e.contains("t.csv:1: expected the header"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

#[cfg(test)]
mod order_tests {
    use super::*;

    #[test]
    fn a_row_earlier_than_the_one_before_it_is_an_error_naming_the_line() {
        // The third row is later than the first but earlier than the second: it used to pass
        // and panic the kernel with an event in the past.
        let dir = std::env::temp_dir().join(format!("cancelsim-order-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("u.csv");
        let rows = "TIMESTAMP,ContextTokens,GeneratedTokens\n\
                    2023-11-16 18:17:03.0,10,5\n2023-11-16 18:17:05.0,10,5\n\
                    2023-11-16 18:17:04.0,10,5\n";
        std::fs::write(&p, rows).unwrap();
        let mut r = TraceReader::open(&p, TraceFormat::AzureCsv).unwrap();
        assert!(r.next_row().unwrap().is_some());
        assert!(r.next_row().unwrap().is_some());
        let e = r.next_row().unwrap_err();
        assert!(
            e.ends_with(
                "u.csv:4: timestamp earlier than the previous row's (the trace must be sorted)"
            ),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

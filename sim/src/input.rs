//! Reading what users give: every file and line read has a size limit, and passing it is a
//! clear error, never an allocation the size of the input (`cancelsim run /dev/zero`).
//!
//! | input | limit |
//! |---|---|
//! | scenario file, sweep file | `CONFIG_BYTES_MAX` (4 MiB) |
//! | `golden.txt`, a sweep manifest, a part file | `CONFIG_BYTES_MAX` |
//! | `results.csv` or `summary.json` read by `compare` | `TABLE_BYTES_MAX` (1 GiB) |
//! | one line of a trace (CSV row or JSON line) | `LINE_BYTES_MAX` (64 KiB) |
//! | one line of a `replay` op log | `replay::LINE_BYTES_MAX` (1 MiB) |
//!
//! Traces and op logs are streamed, so their length is not limited, only their lines.

use std::io::{self, Read};
use std::path::Path;

/// Largest scenario, sweep, golden, manifest or part file read.
pub const CONFIG_BYTES_MAX: u64 = 4 << 20;
/// Largest table `compare` reads.
pub const TABLE_BYTES_MAX: u64 = 1 << 30;
/// Longest line of a trace.
pub const LINE_BYTES_MAX: u64 = 64 << 10;

/// A path as error messages show it: as written, unless it holds a control character (a newline
/// in a file name would split the one error line), then quoted and escaped.
pub fn shown(path: &Path) -> String {
    let s = path.display().to_string();
    if s.chars().any(char::is_control) {
        format!("{s:?}")
    } else {
        s
    }
}

/// The bytes of `path`, or an error if it cannot be read or is larger than `limit`. Reads at
/// most `limit + 1` bytes, whatever the file claims to be (`/dev/zero`, a FIFO).
pub fn read_limited(path: &Path, limit: u64) -> io::Result<Vec<u8>> {
    let f = std::fs::File::open(path)?;
    let mut bytes = Vec::new();
    f.take(limit + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("larger than {limit} bytes, the limit for this input"),
        ));
    }
    Ok(bytes)
}

/// `read_limited` as UTF-8 text.
pub fn read_text(path: &Path, limit: u64) -> io::Result<String> {
    let text = String::from_utf8(read_limited(path, limit)?)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.utf8_error()))?;
    // A byte-order mark, as some Windows editors write, is not part of any format read here.
    Ok(match text.strip_prefix('\u{feff}') {
        Some(rest) => rest.to_string(),
        None => text,
    })
}

/// A reader that fails once a line runs past `max` bytes, so a parser above it never buffers
/// more than one line's limit.
pub struct LineLimit<R> {
    inner: R,
    max: u64,
    /// Bytes since the last newline.
    run: u64,
}

impl<R> LineLimit<R> {
    pub fn new(inner: R, max: u64) -> Self {
        LineLimit { inner, max, run: 0 }
    }
}

impl<R: Read> Read for LineLimit<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        for &b in &buf[..n] {
            if b == b'\n' {
                self.run = 0;
            } else {
                self.run += 1;
                if self.run > self.max {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("a line longer than {} bytes", self.max),
                    ));
                }
            }
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_line_is_an_error_and_short_lines_pass() {
        let mut ok = String::new();
        LineLimit::new("ab\ncd\n".as_bytes(), 2)
            .read_to_string(&mut ok)
            .unwrap();
        assert_eq!(ok, "ab\ncd\n");
        let long = [b'x'; 100];
        let mut sink = Vec::new();
        let e = LineLimit::new(&long[..], 10)
            .read_to_end(&mut sink)
            .unwrap_err();
        assert!(e.to_string().contains("longer than 10 bytes"), "{e}");
    }

    #[test]
    fn a_newline_in_a_path_is_escaped() {
        assert_eq!(shown(Path::new("a/b.ron")), "a/b.ron");
        assert_eq!(shown(Path::new("a\nb.ron")), "\"a\\nb.ron\"");
    }

    #[test]
    fn an_endless_file_is_cut_at_the_limit() {
        if Path::new("/dev/zero").exists() {
            let e = read_limited(Path::new("/dev/zero"), 1000).unwrap_err();
            assert!(e.to_string().contains("larger than 1000 bytes"), "{e}");
        }
    }
}

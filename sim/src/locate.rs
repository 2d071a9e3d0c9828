//! Where a value is written in a RON file, so a problem is reported at its `line:column`: the
//! n-th item of a list (`topology.links[1]`), or a sweep's grid value.

/// Skip a string literal or a comment starting at `i`; returns where scanning resumes.
fn skip(b: &[u8], i: usize) -> usize {
    match (b[i], b.get(i + 1)) {
        (b'"', _) => {
            let mut j = i + 1;
            while j < b.len() && b[j] != b'"' {
                j += if b[j] == b'\\' { 2 } else { 1 };
            }
            j + 1
        }
        (b'/', Some(b'/')) => b[i..]
            .iter()
            .position(|&c| c == b'\n')
            .map_or(b.len(), |n| i + n),
        (b'/', Some(b'*')) => b[i + 2..]
            .windows(2)
            .position(|w| w == b"*/")
            .map_or(b.len(), |n| i + 2 + n + 2),
        _ => i + 1,
    }
}

/// Offsets of the top-level items of the list that opens at `open` (a `[`).
pub(crate) fn list_items(b: &[u8], open: usize) -> Vec<usize> {
    let mut items = Vec::new();
    let (mut depth, mut expecting, mut i) = (0u32, true, open + 1);
    while i < b.len() {
        let c = b[i];
        if c == b'"' || (c == b'/' && matches!(b.get(i + 1), Some(b'/' | b'*'))) {
            if depth == 0 && expecting && c == b'"' {
                items.push(i);
                expecting = false;
            }
            i = skip(b, i);
            continue;
        }
        match c {
            b']' | b')' | b'}' if depth == 0 => break,
            b'[' | b'(' | b'{' | b']' | b')' | b'}' => {
                if depth == 0 && expecting {
                    items.push(i);
                    expecting = false;
                }
                depth = if matches!(c, b'[' | b'(' | b'{') {
                    depth + 1
                } else {
                    depth - 1
                };
            }
            b',' if depth == 0 => expecting = true,
            c if c.is_ascii_whitespace() => {}
            _ if depth == 0 && expecting => {
                items.push(i);
                expecting = false;
            }
            _ => {}
        }
        i += 1;
    }
    items
}

/// The first `[` at or after `from`, outside strings and comments.
pub(crate) fn next_open(b: &[u8], from: usize) -> Option<usize> {
    let mut i = from;
    while i < b.len() {
        match b[i] {
            b'[' => return Some(i),
            b'"' | b'/' => i = skip(b, i),
            _ => i += 1,
        }
    }
    None
}

/// The offset of the `grid:` field's list.
fn grid_list(b: &[u8]) -> Option<usize> {
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'"' || (b[i] == b'/' && matches!(b.get(i + 1), Some(b'/' | b'*'))) {
            i = skip(b, i);
            continue;
        }
        let word = b[i..].starts_with(b"grid") && (i == 0 || !b[i - 1].is_ascii_alphanumeric());
        if word {
            let rest = &b[i + 4..];
            let colon = rest.iter().position(|c| !c.is_ascii_whitespace());
            if colon.is_some_and(|n| rest[n] == b':') {
                return next_open(b, i + 4);
            }
        }
        i += 1;
    }
    None
}

/// `(line, column)`, 1-based, of value `value` of axis `axis` in the sweep file's text.
pub(crate) fn grid_value(text: &str, axis: usize, value: usize) -> Option<(usize, usize)> {
    let b = text.as_bytes();
    let axis_at = *list_items(b, grid_list(b)?).get(axis)?;
    let at = *list_items(b, next_open(b, axis_at)?).get(value)?;
    let line = text[..at].matches('\n').count() + 1;
    let col = at - text[..at].rfind('\n').map_or(0, |n| n + 1) + 1;
    Some((line, col))
}

#[cfg(test)]
mod tests {
    use super::grid_value;

    #[test]
    fn finds_each_value_past_comments_strings_and_nesting() {
        let text = "// grid: [\"not this\"]\nSweep(name: \"grid: [x]\", grid: [\n  Fraction([0.0, 0.5]),\n  Policy([PerRequest, PerRequestWithFallback(fallback_after_ms: 1.0), FinishAndDiscard]),\n])";
        assert_eq!(grid_value(text, 0, 0), Some((3, 13)));
        assert_eq!(grid_value(text, 0, 1), Some((3, 18)));
        assert_eq!(grid_value(text, 1, 1), Some((4, 23)));
        assert_eq!(grid_value(text, 1, 2), Some((4, 71)));
        assert_eq!(grid_value(text, 2, 0), None);
    }
}

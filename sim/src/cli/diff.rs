//! `cancelsim diff`: where two runs (or two sweeps) first differ.

use std::path::Path;

use super::{Code, Fail, Outcome};

/// Agreement is success; a difference is a finding (exit 1); a directory that is neither a run
/// nor a sweep, or a file that cannot be read, is bad input (exit 2).
pub fn diff(a: &Path, b: &Path) -> Outcome {
    let d = cancelsim::diff::dirs(a, b).map_err(Fail::input)?;
    say_part!("{}", cancelsim::diff::render(&d, a, b));
    if d.agree() {
        return Ok(());
    }
    Err(Fail {
        code: Code::Found,
        msg: format!("{} and {} differ", a.display(), b.display()),
    })
}

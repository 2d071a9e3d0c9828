//! The scenario library's files, in name order: what the tests that run the whole library read
//! (the `it` binary's and the differential corpus's, which includes this file by path).

use std::path::{Path, PathBuf};

/// Every `*.ron` of `scenarios/library`, sorted; fails on a library that lost its scenarios.
pub fn files() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios/library");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("an entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "ron"))
        .collect();
    files.sort();
    assert!(
        files.len() >= 30,
        "the library has {} scenarios",
        files.len()
    );
    files
}

//! Scratch directories for the tests: one per test, under the system's temp directory, removed
//! when the test passes and kept when it fails (its files are then the evidence to look at), so
//! repeated runs leave nothing behind.

use std::ops::Deref;
use std::path::{Path, PathBuf};

/// A directory that is removed on drop, unless the thread is panicking.
pub struct Scratch(PathBuf);

impl Scratch {
    /// A fresh (emptied) directory named by the suite, the test's name and the process, created
    /// if `create`.
    pub fn new(suite: &str, name: &str, create: bool) -> Scratch {
        let dir =
            std::env::temp_dir().join(format!("cancelsim-{suite}-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        if create {
            std::fs::create_dir_all(&dir).unwrap();
        }
        Scratch(dir)
    }
}

impl Deref for Scratch {
    type Target = PathBuf;
    fn deref(&self) -> &PathBuf {
        &self.0
    }
}

impl AsRef<Path> for Scratch {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

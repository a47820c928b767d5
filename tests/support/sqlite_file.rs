//! A SQLite file in a directory of its own under the system's temporary directory, removed
//! when dropped. A child process given its path opens the same file.

use std::path::{Path, PathBuf};

#[derive(Debug)]
pub(crate) struct SqliteFile {
    dir: PathBuf,
    path: PathBuf,
}

impl SqliteFile {
    /// A new directory; the file in it is created by whoever opens it first.
    pub(crate) fn new() -> Self {
        let dir = super::servers::temp_dir("sqlite", 0);
        std::fs::create_dir_all(&dir).expect("a temporary directory");
        let path = dir.join("idempotency.db");
        Self { dir, path }
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for SqliteFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

//! Test parts shared by every crate's tests, so that no crate's tests reach into another's
//! files: a real OpenSSH server on loopback ([`sshd`]), the canary search over every file a test
//! left behind ([`file_containing`]), and polling with a deadline ([`eventually`]). It depends
//! on no Postern crate, so any crate can take it as a dev-dependency.

// A test part fails the test that uses it: unwrapping is how it says what broke.
#![allow(clippy::unwrap_used)]

pub mod sshd;

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

/// The first file under `dir`, at any depth, whose bytes contain `needle`: a canary secret's
/// search covers the journal, its WAL and shared memory, logs and every subdirectory.
pub fn file_containing(dir: &Path, needle: &str) -> Option<PathBuf> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir).ok()?.flatten().map(|e| e.path()).collect();
    entries.sort();
    for path in entries {
        if path.is_dir() && !path.is_symlink() {
            if let Some(found) = file_containing(&path, needle) {
                return Some(found);
            }
        } else if std::fs::read(&path).is_ok_and(|b| contains(&b, needle.as_bytes())) {
            return Some(path);
        }
    }
    None
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    needle.is_empty() || haystack.windows(needle.len()).any(|w| w == needle)
}

/// Polls `f` until it returns `Some`, failing the test after `limit`.
pub fn eventually<T>(what: &str, limit: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_canary_is_found_at_any_depth_and_nowhere_else() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("run/logs")).unwrap();
        std::fs::write(dir.path().join("postern.db"), b"nothing here").unwrap();
        assert_eq!(file_containing(dir.path(), "CANARY-1"), None);
        std::fs::write(dir.path().join("run/logs/serve.log"), b"...CANARY-1...").unwrap();
        assert_eq!(file_containing(dir.path(), "CANARY-1"), Some(dir.path().join("run/logs/serve.log")));
        assert_eq!(file_containing(dir.path(), "CANARY-2"), None);
    }
}

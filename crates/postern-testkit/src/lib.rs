//! Test parts shared by every crate's tests, so that no crate's tests reach into another's
//! files: the loopback HTTP target that counts side effects ([`target`]), a real OpenSSH server
//! on loopback ([`sshd`]), the canary search over every file a test
//! left behind ([`file_containing`]), polling with a deadline ([`eventually`]), and an independent
//! checker of Merkle proofs and signed notes ([`tlog`]). It depends
//! on no Postern crate, so any crate can take it as a dev-dependency.

// A test part fails the test that uses it: unwrapping is how it says what broke.
#![allow(clippy::unwrap_used)]

pub mod sshd;
pub mod target;
pub mod tlog;

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

/// The first file under `dir`, at any depth, whose bytes contain `needle`: a canary secret's
/// search covers the journal, its WAL and shared memory, logs and every subdirectory. It fails
/// closed: a directory or file it cannot read fails the test (a search that skipped it would
/// pass), symbolic links are followed only to regular files, and sockets and FIFOs (which hold no
/// bytes at rest, and would block a read) are passed over. It searches the bytes as given: a
/// caller looking for an encoded spelling (base64 in a Basic header) searches for that too.
pub fn file_containing(dir: &Path, needle: &str) -> Option<PathBuf> {
    let read = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("cannot search {}: {e}", dir.display()));
    let mut entries: Vec<PathBuf> =
        read.map(|e| e.unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display())).path()).collect();
    entries.sort();
    for path in entries {
        let Ok(meta) = std::fs::symlink_metadata(&path) else { continue }; // gone since the listing
        if meta.is_dir() {
            if let Some(found) = file_containing(&path, needle) {
                return Some(found);
            }
        } else if meta.is_file() || (meta.file_type().is_symlink() && path.is_file()) {
            match std::fs::read(&path) {
                Ok(bytes) if contains(&bytes, needle.as_bytes()) => return Some(path),
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {} // removed meanwhile
                Err(e) => panic!("cannot read {}: {e}", path.display()),
            }
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

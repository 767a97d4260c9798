//! The file a process runs, looked at once: its path, its version and the bytes hashed all come
//! from one open of `/proc/PID/exe`, so a process that `execve`s another binary meanwhile
//! cannot pair one binary's path with another's hash.

use rustix::fs::{AtFlags, Mode, OFlags, StatxFlags};
use sha2::{Digest, Sha256};
use std::io::Read;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

/// The executable's version has not been hashed yet: reading it is work for the blocking pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NotHashedYet;

/// What identifies one version of a file for the hash cache: path, device and inode, size,
/// and modification *and* change times to the nanosecond. `mtime` can be set back by anyone who
/// can write the file (`touch -d`); `ctime` cannot, and moves on every write or replacement.
pub(super) type FileVersion = (PathBuf, u64, u64, u64, (i64, i64), (i64, i64));

/// One look at the file behind a link (`/proc/PID/exe`), held by an `O_PATH` descriptor: the
/// path is read from that descriptor and the version is its `statx`, so both name the one file
/// the link led to when it was opened, whatever the link leads to after. An `O_PATH` open asks
/// no file system anything (no `open` reaches a FUSE daemon): cheap enough for an async worker.
#[derive(Debug)]
pub(super) struct Look {
    file: OwnedFd,
    version: FileVersion,
}

impl Look {
    /// Looks at the file `link` leads to: `None` when there is none (the process is gone, or
    /// not this user's to look at). With `STATX_DONT_SYNC` in `flags` the version comes from the
    /// kernel's cached attributes and no file system is asked, so an executable on a same-user
    /// FUSE mount whose daemon does not answer cannot hang an async worker; a stale answer only
    /// misses the cache, and attributes it cannot give are [`NotHashedYet`] (the blocking pool
    /// looks again).
    pub(super) fn of(link: &Path, flags: AtFlags) -> Result<Option<Look>, NotHashedYet> {
        let Ok(file) = rustix::fs::open(link, OFlags::PATH | OFlags::CLOEXEC, Mode::empty()) else { return Ok(None) };
        let Ok(path) = std::fs::read_link(Self::reopening(&file)) else { return Ok(None) };
        match version_of(path, &file, flags) {
            Some(version) => Ok(Some(Look { file, version })),
            None if flags.contains(AtFlags::STATX_DONT_SYNC) => Err(NotHashedYet),
            None => Ok(None),
        }
    }

    /// The path of the looked-at file (with ` (deleted)` after it if it was unlinked).
    pub(super) fn path(&self) -> &Path {
        &self.version.0
    }

    pub(super) fn version(&self) -> &FileVersion {
        &self.version
    }

    /// The looked-at file opened for reading (the same inode, not whatever the link leads to
    /// now), with its version as opened: it differs from [`version`](Self::version) if the
    /// file was written since the look.
    pub(super) fn open(&self) -> Option<(std::fs::File, FileVersion)> {
        let file = std::fs::File::open(Self::reopening(&self.file)).ok()?;
        let version = version_of(self.version.0.clone(), &file, AtFlags::empty())?;
        Some((file, version))
    }

    /// The link that opens `file` again, as the file it is.
    fn reopening(file: &OwnedFd) -> String {
        format!("/proc/self/fd/{}", file.as_raw_fd())
    }
}

/// The version of an open `file`, filed under `path`.
fn version_of(path: PathBuf, file: impl AsFd, flags: AtFlags) -> Option<FileVersion> {
    let st = rustix::fs::statx(file, "", flags | AtFlags::EMPTY_PATH, StatxFlags::BASIC_STATS).ok()?;
    Some((
        path,
        rustix::fs::makedev(st.stx_dev_major, st.stx_dev_minor),
        st.stx_ino,
        st.stx_size,
        (st.stx_mtime.tv_sec, i64::from(st.stx_mtime.tv_nsec)),
        (st.stx_ctime.tv_sec, i64::from(st.stx_ctime.tv_nsec)),
    ))
}

/// The SHA-256 of what is left to read of `file`, in hex (`None`: a read failed).
pub(super) fn read_and_hash(file: &mut std::fs::File) -> Option<String> {
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = file.read(&mut buf).ok()?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Some(hex::encode(hasher.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The look names the file the link led to when it was opened: re-pointed after, the link
    /// changes neither the path, nor the version, nor the bytes read (what readlink-then-stat
    /// could pair: one binary's path with another's version, were a process to `execve` between).
    #[test]
    fn a_look_names_the_file_it_opened_whatever_the_link_leads_to_after() {
        let dir = tempfile::tempdir().unwrap();
        // As the kernel names it (a TMPDIR behind a symlink would not compare equal).
        let root = dir.path().canonicalize().unwrap();
        let (a, b, link) = (root.join("a"), root.join("b"), root.join("exe"));
        std::fs::write(&a, b"binary a").unwrap();
        std::fs::write(&b, b"binary b, longer").unwrap();
        std::os::unix::fs::symlink(&a, &link).unwrap();
        let look = Look::of(&link, AtFlags::empty()).unwrap().unwrap();
        std::fs::remove_file(&link).unwrap();
        std::os::unix::fs::symlink(&b, &link).unwrap();

        assert_eq!(look.path(), a);
        let a_version = Look::of(&a, AtFlags::empty()).unwrap().unwrap().version;
        assert_eq!(look.version(), &a_version);
        assert_ne!(look.version().2, Look::of(&b, AtFlags::empty()).unwrap().unwrap().version.2, "a's inode, not b's");
        let (mut opened, version) = look.open().unwrap();
        assert_eq!(version, a_version);
        assert_eq!(read_and_hash(&mut opened).unwrap(), hex::encode(Sha256::digest(b"binary a")));
    }

    /// The look on an async worker (cached attributes) names the same version as a look that
    /// asks the file system: otherwise every connection would miss the cache.
    #[test]
    fn the_cached_look_names_the_version_a_stat_names() {
        let exe = Path::new("/proc/self/exe");
        let cached = Look::of(exe, AtFlags::STATX_DONT_SYNC).unwrap().unwrap();
        assert_eq!(cached.version(), Look::of(exe, AtFlags::empty()).unwrap().unwrap().version());
        assert_eq!(cached.path(), std::env::current_exe().unwrap());
    }
}

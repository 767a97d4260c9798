//! Who is calling, as the kernel tells it (docs/src/design.md, identifiers): a process is its executable's path and
//! SHA-256 plus pid and start time. What a client claims in `initialize` is only a label.
//!
//! Linux only (`/proc`); elsewhere every lookup answers `None` and callers fall back to the
//! token's agent name.

pub use super::executable::NotHashedYet;
use super::executable::{FileVersion, Look, read_and_hash};
use super::hash_cache::HashCache;
use postern_core::Actor;
use rustix::fs::AtFlags;
use std::{
    collections::HashMap,
    io::Read,
    path::{Path, PathBuf},
    sync::Mutex,
};

/// One process, pinned by pid *and* start time (pids are reused; the pair is not).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ProcessKey {
    pub pid: u32,
    /// Start time in clock ticks since boot (`/proc/<pid>/stat` field 22).
    pub start_ticks: u64,
}

/// An agent process as Postern records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentProcess {
    pub key: ProcessKey,
    pub executable: PathBuf,
    pub sha256: String,
}

impl AgentProcess {
    pub fn actor(&self) -> Actor {
        Actor::process(&self.executable.to_string_lossy(), &self.sha256)
    }
}

/// This process's user id (the owner of `/proc/self`).
pub fn current_uid() -> std::io::Result<u32> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").map(|m| m.uid())
}

/// Launchers that sit between an agent and the bridge it starts (`sh -c "postern mcp"`,
/// `env X=1 postern mcp`): the agent is the first ancestor that is not one of them.
const LAUNCHERS: &[&str] = &["sh", "bash", "dash", "zsh", "fish", "env", "timeout", "nohup", "setsid", "stdbuf"];

/// The process's start time and parent pid, or `None` if it is gone. Read once per agent
/// connection, so without a `statx` for a size or a `String` per field. The first KiB of the
/// stat line always holds both: the command name is at most 64 bytes and the 22 fields up to the
/// start time at most 21 bytes each.
fn start_and_parent(pid: u32) -> Option<(u64, u32)> {
    // Through `take`, `read_to_end` asks for no size (a `File` would `statx` itself first).
    let mut stat = Vec::with_capacity(1024);
    std::fs::File::open(format!("/proc/{pid}/stat")).ok()?.take(1024).read_to_end(&mut stat).ok()?;
    start_and_parent_of(&stat)
}

/// [`start_and_parent`] of a stat line: the fields after the command name (which may contain
/// spaces and parens, so the last `)` ends it).
fn start_and_parent_of(stat: &[u8]) -> Option<(u64, u32)> {
    let after = std::str::from_utf8(&stat[memchr::memrchr(b')', stat)? + 1..]).ok()?;
    let mut fields = after.split_ascii_whitespace();
    // After the command: state(3) ppid(4) … starttime(22) → indexes 0, 1, …, 19.
    let ppid = fields.nth(1)?.parse().ok()?;
    let start = fields.nth(17)?.parse().ok()?;
    Some((start, ppid))
}

/// The process's key and its parent's pid.
pub fn process_lineage(pid: u32) -> Option<(ProcessKey, u32)> {
    start_and_parent(pid).map(|(start_ticks, ppid)| (ProcessKey { pid, start_ticks }, ppid))
}

pub fn process_key(pid: u32) -> Option<ProcessKey> {
    start_and_parent(pid).map(|(start_ticks, _)| ProcessKey { pid, start_ticks })
}

/// Whether the process `key` names is still the one running under its pid.
pub fn is_alive(key: &ProcessKey) -> bool {
    process_key(key.pid).is_some_and(|now| now.start_ticks == key.start_ticks)
}

pub use postern_engine::approval::process_started_at_ms;

fn executable(pid: u32) -> Option<PathBuf> {
    std::fs::read_link(format!("/proc/{pid}/exe")).ok()
}

fn is_launcher(path: &Path) -> bool {
    path.file_name().and_then(|n| n.to_str()).is_some_and(|n| LAUNCHERS.contains(&n))
}

/// Hashes executables once per file version: an agent binary can be 100 MB.
#[derive(Debug, Default)]
pub struct ExecutableHashes {
    cache: HashCache<FileVersion>,
    /// Processes described before, each pinned by a pidfd: see [`PinnedProcess`].
    pinned: Mutex<HashMap<u32, std::sync::Arc<PinnedProcess>>>,
}

/// A process held by a pidfd, with the key read while the pidfd was held. While the process
/// has not exited its pid cannot be reused, so anything read under `/proc/<pid>` before
/// [`exited`](Self::exited) answers `false` was read of this process: one `poll` instead of
/// reading the stat line before and after.
#[derive(Debug)]
struct PinnedProcess {
    pidfd: std::os::fd::OwnedFd,
    key: ProcessKey,
}

/// How many pinned processes are kept (a descriptor each); exited ones go first.
const PINNED_KEPT: usize = 64;

impl PinnedProcess {
    /// Pins `pid` and reads its key. `None` when the process is gone, pidfds are unavailable
    /// (before Linux 5.3) or their fdinfo does not confirm the pid: the caller then reads the
    /// stat line twice, as without a pin.
    fn pin(pid: u32) -> Option<PinnedProcess> {
        let raw = rustix::process::Pid::from_raw(i32::try_from(pid).ok()?)?;
        let pidfd = rustix::process::pidfd_open(raw, rustix::process::PidfdFlags::empty()).ok()?;
        // The pidfd names `pid` in the gateway's pid namespace, `/proc` in its own: where they
        // differ (a sandbox), the pin would guard another process. The pidfd's fdinfo says which
        // pid it has in `/proc`'s namespace.
        if !Self::holds_pid(&pidfd, pid) {
            return None;
        }
        let key = process_key(pid)?;
        let pinned = PinnedProcess { pidfd, key };
        // The key was read of the pidfd's process only if it had not exited by then.
        (!pinned.exited()).then_some(pinned)
    }

    /// Whether `pidfd` is, in `/proc`'s pid namespace, the process `pid`.
    fn holds_pid(pidfd: &std::os::fd::OwnedFd, pid: u32) -> bool {
        use std::os::fd::AsRawFd;
        let Ok(info) = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", pidfd.as_raw_fd())) else {
            return false;
        };
        info.lines().any(|line| line.strip_prefix("Pid:").is_some_and(|v| v.trim().parse() == Ok(pid)))
    }

    /// Whether the process has exited (a pidfd becomes readable then). An error counts as exited.
    fn exited(&self) -> bool {
        let mut fds = [rustix::event::PollFd::new(&self.pidfd, rustix::event::PollFlags::IN)];
        let now = rustix::event::Timespec { tv_sec: 0, tv_nsec: 0 };
        rustix::event::poll(&mut fds, Some(&now)).map_or(true, |ready| ready > 0)
    }
}

/// How a described process is known to still be the one whose key was read: held by a pidfd
/// (one `poll`), or, without a pin, by reading its stat line again and comparing start times.
enum HeldProcess {
    Pinned(std::sync::Arc<PinnedProcess>),
    Read(ProcessKey),
}

impl HeldProcess {
    fn key(&self) -> &ProcessKey {
        match self {
            HeldProcess::Pinned(pinned) => &pinned.key,
            HeldProcess::Read(key) => key,
        }
    }

    /// Whether the pid is still the process [`key`](Self::key) was read of.
    fn still_running(&self) -> bool {
        match self {
            HeldProcess::Pinned(pinned) => !pinned.exited(),
            HeldProcess::Read(key) => is_alive(key),
        }
    }
}

impl ExecutableHashes {
    /// The path and SHA-256 of the file the process runs, both of one look at `/proc/<pid>/exe`
    /// (the inode the process actually executes, even if the path was replaced since).
    fn executable_and_hash(&self, pid: u32, may_read: bool) -> Result<Option<(PathBuf, String)>, NotHashedYet> {
        self.look_and_hash(Path::new(&format!("/proc/{pid}/exe")), may_read)
    }

    /// The path and SHA-256 of the file `link` leads to, the hash cached under the file's
    /// version (`None`: unreadable). With `may_read: false` it answers only from the cache:
    /// [`NotHashedYet`] when this version was never hashed (reading an executable can take long:
    /// it may be 100 MB).
    ///
    /// Path, version and bytes are all of the one file the look opened: a process that
    /// `execve`s meanwhile cannot pair one binary's path with another's hash, nor file one
    /// binary's hash under another's version.
    fn look_and_hash(&self, link: &Path, may_read: bool) -> Result<Option<(PathBuf, String)>, NotHashedYet> {
        // On an async worker the look asks no file system (see `Look::of`).
        let flags = if may_read { AtFlags::empty() } else { AtFlags::STATX_DONT_SYNC };
        let Some(look) = Look::of(link, flags)? else { return Ok(None) };
        let hash = match self.cache.get(look.version()) {
            Some(hash) => Some(hash),
            None if may_read => self.hash_version(&look),
            None => return Err(NotHashedYet),
        };
        Ok(hash.map(|hash| (look.path().to_path_buf(), hash)))
    }

    /// Reads the looked-at file and keeps its hash under the version it was read as: the answer
    /// only if that is still the looked-at version (the file was not written since the look).
    fn hash_version(&self, look: &Look) -> Option<String> {
        let (mut opened, read) = look.open()?;
        let hash = self.cache.get_or_read(read.clone(), || read_and_hash(&mut opened))?;
        (read == *look.version()).then_some(hash)
    }

    /// The process `pid` as an agent. Reads its executable if this version was never hashed.
    pub fn describe(&self, pid: u32) -> Option<AgentProcess> {
        self.describe_with(pid, true).ok().flatten()
    }

    /// [`describe`](Self::describe) without reading any executable: a few `/proc` lookups, cheap
    /// enough for an async worker. [`NotHashedYet`] when the executable must be read first.
    pub fn describe_if_hashed(&self, pid: u32) -> Result<Option<AgentProcess>, NotHashedYet> {
        self.describe_with(pid, false)
    }

    fn describe_with(&self, pid: u32, may_read: bool) -> Result<Option<AgentProcess>, NotHashedYet> {
        let held = match self.pinned(pid) {
            Some(pinned) => HeldProcess::Pinned(pinned),
            None => match process_key(pid) {
                Some(key) => HeldProcess::Read(key),
                None => return Ok(None),
            },
        };
        let Some((executable, sha256)) = self.executable_and_hash(pid, may_read)? else { return Ok(None) };
        // The pid must still be the process whose key we hold: then the executable we hashed is
        // its own.
        if !held.still_running() {
            return Ok(None);
        }
        Ok(Some(AgentProcess { key: held.key().clone(), executable, sha256 }))
    }

    /// The pin of `pid`: the one kept if its process is still running, else a new one.
    fn pinned(&self, pid: u32) -> Option<std::sync::Arc<PinnedProcess>> {
        let kept = self.pinned.lock().ok()?.get(&pid).cloned();
        if let Some(kept) = kept.filter(|p| !p.exited()) {
            return Some(kept);
        }
        let pinned = std::sync::Arc::new(PinnedProcess::pin(pid)?);
        if let Ok(mut all) = self.pinned.lock() {
            if all.len() >= PINNED_KEPT {
                all.retain(|_, p| !p.exited());
                if all.len() >= PINNED_KEPT {
                    all.clear();
                }
            }
            all.insert(pid, std::sync::Arc::clone(&pinned));
        }
        Some(pinned)
    }

    /// The agent above a bridge process: its parent, skipping shells and launchers.
    pub fn agent_above(&self, bridge_pid: u32) -> Option<AgentProcess> {
        let (_, mut pid) = start_and_parent(bridge_pid)?;
        for _ in 0..8 {
            if pid <= 1 {
                return None;
            }
            let exe = executable(pid)?;
            if !is_launcher(&exe) {
                return self.describe(pid);
            }
            pid = start_and_parent(pid)?.1;
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sha2::{Digest, Sha256};
    use std::io::Write;

    /// An executable replaced in place with the same size and its old mtime set back (what
    /// `touch -d` allows anyone who can write it) is hashed again: its ctime moved.
    #[test]
    fn a_replaced_executable_with_its_old_size_and_mtime_is_hashed_again() {
        let dir = tempfile::tempdir().unwrap();
        let exe = dir.path().join("agent");
        std::fs::write(&exe, b"version A").unwrap();
        let mtime = std::fs::metadata(&exe).unwrap().modified().unwrap();
        let hashes = ExecutableHashes::default();
        assert_eq!(hashes.look_and_hash(&exe, false), Err(NotHashedYet), "never read on a worker");
        let first = hashes.look_and_hash(&exe, true).expect("hashed");
        assert_eq!(hashes.look_and_hash(&exe, false).expect("cached"), first);
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(&exe, b"version B").unwrap();
        std::fs::File::options().write(true).open(&exe).unwrap().set_modified(mtime).unwrap();
        assert_eq!(std::fs::metadata(&exe).unwrap().modified().unwrap(), mtime, "mtime set back");
        assert_eq!(hashes.look_and_hash(&exe, false), Err(NotHashedYet), "a new version is not in the cache");
        let second = hashes.look_and_hash(&exe, true).expect("hashed");
        assert_ne!(second, first, "the replaced file is hashed again, not taken from the cache");
    }

    proptest::proptest! {
        /// A command name is the process's own to choose (spaces, parens, newlines, any bytes):
        /// the fields are read after its last `)`, and any line at all never panics.
        #[test]
        fn the_stat_line_is_read_past_any_command_name(
            comm in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64),
            ppid in proptest::prelude::any::<u32>(),
            start in proptest::prelude::any::<u64>(),
            rest in proptest::collection::vec(proptest::prelude::any::<u64>(), 0..30),
        ) {
            let mut line = b"4242 (".to_vec();
            line.extend_from_slice(&comm);
            line.extend_from_slice(format!(") S {ppid}").as_bytes());
            for field in 5..22 {
                line.extend_from_slice(format!(" {field}").as_bytes());
            }
            line.extend_from_slice(format!(" {start}").as_bytes());
            for field in rest {
                line.extend_from_slice(format!(" {field}").as_bytes());
            }
            line.push(b'\n');
            // What the reader sees: the first KiB.
            line.truncate(1024);
            proptest::prop_assert_eq!(start_and_parent_of(&line), Some((start, ppid)));
        }

        #[test]
        fn any_bytes_never_panic(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512)) {
            let _ = start_and_parent_of(&bytes);
        }
    }

    #[test]
    fn this_process_is_described_by_its_own_executable() {
        let hashes = ExecutableHashes::default();
        let me = hashes.describe(std::process::id()).unwrap();
        assert_eq!(me.executable, std::env::current_exe().unwrap());
        let bytes = std::fs::read(&me.executable).unwrap();
        assert_eq!(me.sha256, hex::encode(Sha256::digest(&bytes)));
        assert!(is_alive(&me.key));
        let reused = ProcessKey { pid: me.key.pid, start_ticks: me.key.start_ticks + 1 };
        assert!(!is_alive(&reused), "same pid, different start time is a different process");
    }

    /// A file written between the look at its version and the read (its hash would be of other
    /// bytes than the looked-at version's) is not answered, nor kept under the looked-at version.
    #[test]
    fn a_file_changed_after_the_look_is_not_hashed_as_the_looked_at_version() {
        let dir = tempfile::tempdir().unwrap();
        // As the kernel names it (a TMPDIR behind a symlink would not compare equal).
        let root = dir.path().canonicalize().unwrap();
        let exe = root.join("agent");
        std::fs::write(&exe, b"trusted binary").unwrap();
        let hashes = ExecutableHashes::default();
        let look = Look::of(&exe, AtFlags::empty()).unwrap().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(&exe, b"trusted binary, patched").unwrap();
        assert_eq!(hashes.hash_version(&look), None, "not the looked-at version's hash");
        assert_eq!(hashes.cache.get(look.version()), None, "nothing kept for the looked-at version");
        let patched = hex::encode(Sha256::digest(b"trusted binary, patched"));
        assert_eq!(hashes.look_and_hash(&exe, false), Ok(Some((exe.clone(), patched))), "kept as read");
    }

    /// The look made on an async worker finds what the blocking pool hashed.
    #[test]
    fn a_hash_kept_by_the_blocking_pool_is_found_by_the_async_look() {
        let exe = Path::new("/proc/self/exe");
        let hashes = ExecutableHashes::default();
        let hashed = hashes.look_and_hash(exe, true).unwrap();
        assert_eq!(hashed.as_ref().map(|(path, _)| path.clone()), std::env::current_exe().ok());
        assert_eq!(hashes.look_and_hash(exe, false), Ok(hashed), "answered from the cache");
    }

    /// A process that keeps `execve`ing between two binaries is described, each time, by one of
    /// them: its path with its own hash, never one binary's path with the other's hash.
    #[test]
    fn a_process_exec_ing_between_two_binaries_is_never_described_by_a_mixed_pair() {
        let dir = tempfile::tempdir().unwrap();
        // As the kernel names it (a TMPDIR behind a symlink would not compare equal).
        let root = dir.path().canonicalize().unwrap();
        let (a, b) = (root.join("a"), root.join("b"));
        std::fs::copy("/bin/bash", &a).unwrap();
        std::fs::copy("/bin/bash", &b).unwrap();
        // Bytes after the ELF image change the hash, not what runs.
        std::fs::OpenOptions::new().append(true).open(&b).unwrap().write_all(b"\n#b\n").unwrap();
        let hash = |path: &Path| hex::encode(Sha256::digest(std::fs::read(path).unwrap()));
        let (hash_a, hash_b) = (hash(&a), hash(&b));
        let script = r#"case "$0" in */a) exec "$B" -c "$X";; *) exec "$A" -c "$X";; esac"#;
        let mut child = std::process::Command::new(&a)
            .args(["-c", script])
            .env("A", &a)
            .env("B", &b)
            .env("X", script)
            .spawn()
            .unwrap();
        let hashes = ExecutableHashes::default();
        let (mut seen_a, mut seen_b) = (0, 0);
        for _ in 0..20_000 {
            if let Some(described) = hashes.describe(child.id()) {
                if described.executable == a {
                    assert_eq!(described.sha256, hash_a, "a's path with b's hash");
                    seen_a += 1;
                } else {
                    assert_eq!(described.executable, b);
                    assert_eq!(described.sha256, hash_b, "b's path with a's hash");
                    seen_b += 1;
                }
            }
            if seen_a + seen_b >= 1_000 && seen_a > 0 && seen_b > 0 {
                break;
            }
        }
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(seen_a > 0 && seen_b > 0, "described as a {seen_a} and as b {seen_b} times");
    }

    /// A described process is pinned: described again it keeps its key (without reading its
    /// stat line again), and once it has exited it is described as nobody, its pin let go.
    #[test]
    fn a_pinned_process_keeps_its_key_until_it_exits() {
        let hashes = ExecutableHashes::default();
        let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let pid = child.id();
        let first = hashes.describe(pid).expect("a running child is described");
        assert_eq!(first.key, process_key(pid).unwrap());
        assert!(first.executable.ends_with("sleep"), "{:?}", first.executable);
        assert!(hashes.pinned.lock().unwrap().contains_key(&pid), "the process is pinned");
        assert_eq!(hashes.describe_if_hashed(pid), Ok(Some(first.clone())), "the pin answers again");
        child.kill().unwrap();
        // Exited but not reaped (a zombie): its pid is not free yet, and still it is nobody.
        let pin = hashes.pinned.lock().unwrap().get(&pid).cloned().unwrap();
        let gone =
            (0..1000).any(|_| pin.exited() || (std::thread::sleep(std::time::Duration::from_millis(5)), false).1);
        assert!(gone, "the pidfd of a killed process reports its exit");
        assert_eq!(hashes.describe_if_hashed(pid), Ok(None), "an exited process is not described");
        child.wait().unwrap();
        assert_eq!(hashes.describe(pid), None, "nor once reaped");
    }

    /// No pin is made of a process that has exited, reaped or not (an exited process's pid is
    /// free to be reused once it is reaped), and a pidfd vouches only for its own pid.
    #[test]
    fn a_pin_of_a_process_that_has_exited_is_not_made() {
        let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let pid = child.id();
        let raw = rustix::process::Pid::from_raw(pid as i32).unwrap();
        let pidfd = rustix::process::pidfd_open(raw, rustix::process::PidfdFlags::empty()).unwrap();
        assert!(PinnedProcess::holds_pid(&pidfd, pid));
        assert!(!PinnedProcess::holds_pid(&pidfd, std::process::id()), "not another pid");
        child.kill().unwrap();
        // A zombie: its stat line still reads, and only the poll tells it has exited.
        let exited = PinnedProcess { pidfd, key: process_key(pid).expect("a zombie's stat line") };
        let gone =
            (0..1000).any(|_| exited.exited() || (std::thread::sleep(std::time::Duration::from_millis(5)), false).1);
        assert!(gone, "the pidfd reports the exit");
        assert!(PinnedProcess::pin(pid).is_none(), "an exited, unreaped process is not pinned");
        child.wait().unwrap();
        assert!(PinnedProcess::pin(pid).is_none(), "nor a reaped one");
    }

    #[test]
    fn a_process_start_time_is_wall_clock_time() {
        let me = process_key(std::process::id()).unwrap();
        let started = process_started_at_ms(me.start_ticks).unwrap();
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
        // This test process started before now, and not before the day this was written.
        assert!(started <= now + 1000, "{started} vs {now}");
        assert!(started > 1_764_000_000_000, "{started}");
    }
}

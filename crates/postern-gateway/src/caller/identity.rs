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
    net::SocketAddr,
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

/// The gateway's own uid, read once.
fn gateway_uid() -> Option<u32> {
    static UID: std::sync::OnceLock<Option<u32>> = std::sync::OnceLock::new();
    *UID.get_or_init(|| current_uid().ok())
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

/// Who holds the client end of a loopback connection, as far as it can be told at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeerLookup {
    /// A process that held agent connections before holds this one, at one of the descriptors
    /// where they were found.
    Found(u32),
    /// The socket exists but its holder is not known yet: a scan of processes is needed (on the
    /// blocking pool). `inode` and `uid` when netlink answered.
    Scan { inode: Option<u64>, uid: Option<u32> },
    /// No such connection (closed, reset, or held by nobody), or another user's.
    Gone,
}

/// The cheap part of [`tcp_peer_pid`]: one `sock_diag` lookup for the socket's inode and owner,
/// then one look at each of the descriptors where the latest agent connections were found (at
/// most `QUICK_LOOKS`). New sockets take the lowest free descriptors, so a client that opens a
/// connection per request gets the same few numbers again: a few non-sleeping syscalls, cheap
/// enough for an async worker. Anything more is [`PeerLookup::Scan`].
pub fn tcp_peer_quick(peer: SocketAddr, local: SocketAddr) -> PeerLookup {
    let (inode, uid) = match crate::caller::sock_diag::tcp_entry(peer, local) {
        Ok(Some(entry)) if entry.inode != 0 => (u64::from(entry.inode), entry.uid),
        Ok(_) => return PeerLookup::Gone,
        Err(_) => return PeerLookup::Scan { inode: None, uid: None },
    };
    // Another user's socket is not this user's agent, whatever a privileged gateway could read
    // of it: the caller is its token alone (one run per token, on an idle lease).
    if gateway_uid().is_some_and(|own| own != uid) {
        return PeerLookup::Gone;
    }
    let needle = format!("socket:[{inode}]");
    let known: Vec<(u32, u32)> =
        KNOWN_PEERS.lock().map(|k| k.iter().take(QUICK_LOOKS).copied().collect()).unwrap_or_default();
    match known.into_iter().find(|&(pid, fd)| holds_at(pid, fd, &needle)) {
        Some((pid, fd)) => {
            remember_peer(pid, fd);
            PeerLookup::Found(pid)
        }
        None => PeerLookup::Scan { inode: Some(inode), uid: Some(uid) },
    }
}

/// The pid owning the loopback TCP connection whose client end is `peer` and server end is
/// `local` (Linux): [`tcp_peer_quick`], then [`PeerLookup::finish`]. Reads `/proc`: call it off
/// the async workers.
pub fn tcp_peer_pid(peer: SocketAddr, local: SocketAddr) -> Option<u32> {
    tcp_peer_quick(peer, local).finish(peer, local)
}

impl PeerLookup {
    /// The owner, scanning if the quick look did not find it: the descriptors of the processes
    /// that held agent connections before, then the processes of the socket's owner only
    /// (`/proc/net/tcp` gives the inode only where netlink is unavailable). Reads `/proc`: call
    /// it off the async workers.
    pub fn finish(self, peer: SocketAddr, local: SocketAddr) -> Option<u32> {
        let (inode, uid) = match self {
            PeerLookup::Found(pid) => return Some(pid),
            PeerLookup::Gone => return None,
            PeerLookup::Scan { inode: Some(inode), uid } => (inode, uid),
            PeerLookup::Scan { inode: None, .. } => (socket_inode(peer, local)?, None),
        };
        let needle = format!("socket:[{inode}]");
        let mut known: Vec<u32> = Vec::new();
        if let Ok(entries) = KNOWN_PEERS.lock() {
            for &(pid, _) in entries.iter() {
                if !known.contains(&pid) {
                    known.push(pid);
                }
            }
        }
        let (pid, fd) = known.into_iter().find_map(|pid| Some((pid, descriptor_of(pid, &needle)?))).or_else(|| {
            std::fs::read_dir("/proc").ok()?.flatten().find_map(|entry| {
                let pid = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok())?;
                if let Some(uid) = uid {
                    use std::os::unix::fs::MetadataExt;
                    if entry.metadata().ok()?.uid() != uid {
                        return None;
                    }
                }
                Some((pid, descriptor_of(pid, &needle)?))
            })
        })?;
        remember_peer(pid, fd);
        Some(pid)
    }
}

/// Whether descriptor `fd` of process `pid` is the socket `needle` (`socket:[inode]`).
fn holds_at(pid: u32, fd: u32, needle: &str) -> bool {
    std::fs::read_link(format!("/proc/{pid}/fd/{fd}")).is_ok_and(|t| t.as_os_str() == needle)
}

/// The descriptor of process `pid` that is the socket `needle`, if it holds it.
fn descriptor_of(pid: u32, needle: &str) -> Option<u32> {
    std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.flatten().find_map(|fd| {
        let n = fd.file_name().to_str()?.parse().ok()?;
        std::fs::read_link(fd.path()).is_ok_and(|t| t.as_os_str() == needle).then_some(n)
    })
}

fn remember_peer(pid: u32, fd: u32) {
    if let Ok(mut known) = KNOWN_PEERS.lock() {
        known.retain(|&entry| entry != (pid, fd));
        known.push_front((pid, fd));
        known.truncate(KNOWN_PEERS_KEPT);
    }
}

/// The descriptors where agent connections were found lately, newest first, with the process
/// holding each: where the next connection's owner is looked for before any scan. A client
/// with several connections open at once has several entries (new sockets take the lowest free
/// descriptors, so the same few numbers come round again).
static KNOWN_PEERS: std::sync::Mutex<std::collections::VecDeque<(u32, u32)>> =
    std::sync::Mutex::new(std::collections::VecDeque::new());
const KNOWN_PEERS_KEPT: usize = 128;
/// How many of them [`tcp_peer_quick`] looks at (one `readlink` each) before giving up to a scan.
const QUICK_LOOKS: usize = 48;

/// `/proc/net/tcp` spells an IPv4 address as the little-endian hex of its u32, then `:PORT`.
fn proc_net_address(addr: SocketAddr) -> String {
    match addr {
        SocketAddr::V4(a) => format!("{:08X}:{:04X}", u32::from_le_bytes(a.ip().octets()), a.port()),
        SocketAddr::V6(a) => {
            let words: String = a
                .ip()
                .octets()
                .chunks(4)
                .map(|c| format!("{:08X}", u32::from_le_bytes([c[0], c[1], c[2], c[3]])))
                .collect();
            format!("{words}:{:04X}", a.port())
        }
    }
}

/// What the kernel says about the bytes the server end of a TCP connection has sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SendQueue {
    /// This many bytes are not yet acknowledged by the client's kernel.
    Pending(u64),
    /// Every byte sent was acknowledged by the client's kernel.
    Acknowledged,
    /// Closed by the client, reset, or gone.
    Closed,
}

/// The send queue of the server end `local` of the connection to `peer`; `None` if
/// `/proc/net/tcp` cannot be read. A connection the client closed gracefully after reading
/// (`CLOSE_WAIT`, or a close of ours that went through: `FIN_WAIT*`, `TIME_WAIT`, `LAST_ACK`)
/// still says whether every byte was acknowledged; one that was reset is gone from the table.
pub fn tcp_send_queue(local: SocketAddr, peer: SocketAddr) -> Option<SendQueue> {
    // ESTABLISHED, FIN_WAIT1, FIN_WAIT2, TIME_WAIT, CLOSE_WAIT, LAST_ACK, CLOSING. Not CLOSE (7):
    // a reset socket's queue is purged, which would look acknowledged.
    const OPEN_OR_CLOSING_GRACEFULLY: [u8; 7] = [1, 4, 5, 6, 8, 9, 11];
    const TIME_WAIT: u8 = 6;
    let entry = match crate::caller::sock_diag::tcp_entry(local, peer) {
        Ok(entry) => entry.map(|e| (e.state, u64::from(e.send_queue))),
        Err(_) => proc_net_tcp_queue(local, peer)?,
    };
    Some(match entry {
        Some((state, 0)) if OPEN_OR_CLOSING_GRACEFULLY.contains(&state) => SendQueue::Acknowledged,
        Some((state, n)) if OPEN_OR_CLOSING_GRACEFULLY.contains(&state) && state != TIME_WAIT => SendQueue::Pending(n),
        _ => SendQueue::Closed,
    })
}

/// The state and send queue of the socket `local`→`peer` from `/proc/net/tcp{,6}`: `Some(None)`
/// when it is not in the table, `None` when the table cannot be read. Only where netlink is not
/// available: it makes the kernel format every socket's line.
fn proc_net_tcp_queue(local: SocketAddr, peer: SocketAddr) -> Option<Option<(u8, u64)>> {
    let file = if local.is_ipv4() { "/proc/net/tcp" } else { "/proc/net/tcp6" };
    let table = std::fs::read_to_string(file).ok()?;
    let (local_s, peer_s) = (proc_net_address(local), proc_net_address(peer));
    Some(table.lines().skip(1).find_map(|line| {
        let cols: Vec<&str> = line.split_whitespace().collect();
        // sl local rem st tx_queue:rx_queue …
        if cols.get(1) != Some(&local_s.as_str()) || cols.get(2) != Some(&peer_s.as_str()) {
            return None;
        }
        let state = u8::from_str_radix(cols.get(3)?, 16).ok()?;
        let tx = u64::from_str_radix(cols.get(4)?.split(':').next()?, 16).ok()?;
        Some((state, tx))
    }))
}

fn socket_inode(peer: SocketAddr, local: SocketAddr) -> Option<u64> {
    let (file, peer_s, local_s) = match (peer, local) {
        (SocketAddr::V4(_), SocketAddr::V4(_)) => ("/proc/net/tcp", proc_net_address(peer), proc_net_address(local)),
        _ => ("/proc/net/tcp6", proc_net_address(peer), proc_net_address(local)),
    };
    let table = std::fs::read_to_string(file).ok()?;
    table.lines().skip(1).find_map(|line| {
        let cols: Vec<&str> = line.split_whitespace().collect();
        // sl local rem st tx:rx tr:when retrnsmt uid timeout inode
        (cols.get(1) == Some(&peer_s.as_str()) && cols.get(2) == Some(&local_s.as_str()))
            .then(|| cols.get(9)?.parse().ok())
            .flatten()
    })
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

    /// The fallback (no netlink) reads the same state and queue as the exact lookup.
    #[test]
    fn proc_net_tcp_and_sock_diag_agree() {
        use std::io::Write;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let local = listener.local_addr().unwrap();
        let client = std::net::TcpStream::connect(local).unwrap();
        let (mut server, peer) = listener.accept().unwrap();
        server.write_all(b"hello").unwrap();
        let diag =
            crate::caller::sock_diag::tcp_entry(local, peer).unwrap().map(|e| (e.state, u64::from(e.send_queue)));
        assert_eq!(proc_net_tcp_queue(local, peer), Some(diag));
        drop(client);
    }

    #[test]
    fn a_loopback_connection_is_traced_to_the_process_holding_it() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (_server, peer) = listener.accept().unwrap();
        assert_eq!(peer, client.local_addr().unwrap());
        assert_eq!(tcp_peer_pid(peer, listener.local_addr().unwrap()), Some(std::process::id()));
        let unrelated: SocketAddr = "127.0.0.1:1".parse().unwrap();
        assert_eq!(tcp_peer_pid(unrelated, listener.local_addr().unwrap()), None);
    }

    /// A process that held an agent connection is found again by one look at the descriptor its
    /// last connection had — the lowest free one, which a client opening a connection per
    /// request gets again — without a scan.
    #[test]
    fn a_known_process_is_found_at_the_descriptor_its_last_connection_had() {
        let me = std::process::id();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let local = listener.local_addr().unwrap();
        let first = std::net::TcpStream::connect(local).unwrap();
        let (first_server, first_peer) = listener.accept().unwrap();
        assert_eq!(tcp_peer_pid(first_peer, local), Some(me));
        assert_eq!(tcp_peer_quick(first_peer, local), PeerLookup::Found(me));
        drop(first_server);
        // The next connection at the first one's descriptor, as the lowest free descriptor would
        // put it, but placed there by hand: other tests' threads open descriptors meanwhile.
        let mut at_first: std::os::fd::OwnedFd = first.into();
        let second = std::net::TcpStream::connect(local).unwrap();
        let (_second_server, second_peer) = listener.accept().unwrap();
        rustix::io::dup2(&second, &mut at_first).unwrap();
        drop(second);
        assert_eq!(tcp_peer_quick(second_peer, local), PeerLookup::Found(me), "the same descriptor again");
        let unrelated: SocketAddr = "127.0.0.1:1".parse().unwrap();
        assert_eq!(tcp_peer_quick(unrelated, local), PeerLookup::Gone);
    }

    #[test]
    fn the_send_queue_tells_acknowledged_bytes_from_pending_ones_and_a_closed_client() {
        use std::io::Write;
        // The kernel answers within microseconds on loopback; poll rather than sleep a guess.
        let settles_to = |local, peer, want: SendQueue| {
            (0..400).any(|_| {
                std::thread::sleep(std::time::Duration::from_millis(5));
                tcp_send_queue(local, peer) == Some(want)
            })
        };
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let local = listener.local_addr().unwrap();
        let client = std::net::TcpStream::connect(local).unwrap();
        let (mut server, peer) = listener.accept().unwrap();
        server.write_all(b"a result the client's kernel takes at once").unwrap();
        assert!(settles_to(local, peer, SendQueue::Acknowledged), "{:?}", tcp_send_queue(local, peer));
        // A client that stops reading: fill every buffer until the kernel refuses more.
        server.set_nonblocking(true).unwrap();
        let chunk = vec![b'x'; 1 << 16];
        while server.write(&chunk).is_ok() {}
        assert!(matches!(tcp_send_queue(local, peer), Some(SendQueue::Pending(n)) if n > 0));
        // A client that goes away without reading what was sent resets the connection.
        drop(client);
        assert!(settles_to(local, peer, SendQueue::Closed), "the client reset: {:?}", tcp_send_queue(local, peer));
        drop(server);
        // A client that read everything and closed: still acknowledged.
        let client = std::net::TcpStream::connect(local).unwrap();
        let (mut server, peer) = listener.accept().unwrap();
        server.write_all(b"read and gone").unwrap();
        let mut buf = [0u8; 13];
        std::io::Read::read_exact(&mut &client, &mut buf).unwrap();
        drop(client);
        // The server has seen the client's FIN (end of stream): its end is in CLOSE_WAIT now.
        assert_eq!(std::io::Read::read(&mut server, &mut buf).unwrap(), 0);
        assert!(
            settles_to(local, peer, SendQueue::Acknowledged),
            "read, then closed: {:?}",
            tcp_send_queue(local, peer)
        );
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

    #[test]
    fn proc_net_spelling_matches_the_kernel() {
        let a: SocketAddr = "127.0.0.1:8080".parse().unwrap();
        assert_eq!(proc_net_address(a), "0100007F:1F90");
    }
}

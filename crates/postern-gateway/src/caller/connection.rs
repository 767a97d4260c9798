//! One loopback TCP connection as the kernel has it: which process holds its client end (one
//! `sock_diag` lookup, then a look at the descriptors where agent connections were found before
//! or were freed by a closed one, a scan only when those miss), and whether the client's kernel
//! acknowledged what was sent.

use super::identity::current_uid;
use std::net::SocketAddr;

/// The gateway's own uid, read once.
fn gateway_uid() -> Option<u32> {
    static UID: std::sync::OnceLock<Option<u32>> = std::sync::OnceLock::new();
    *UID.get_or_init(|| current_uid().ok())
}

/// A process holding the client end of a connection, and at which of its descriptors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Holder {
    pub pid: u32,
    pub fd: u32,
}

/// Who holds the client end of a loopback connection, as far as it can be told at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeerLookup {
    /// A process that held agent connections before holds this one, at one of the descriptors
    /// where they were found, were freed by a closed connection, or where this socket was seen.
    Found(Holder),
    /// The socket exists but its holder is not known yet: a scan of processes is needed (on the
    /// blocking pool). `inode` and `uid` when netlink answered.
    Scan { inode: Option<u64>, uid: Option<u32> },
    /// No such connection (closed, reset, or held by nobody), or another user's.
    Gone,
}

/// The cheap part of [`tcp_peer_pid`]: one `sock_diag` lookup for the socket's inode and owner,
/// then one look at each of at most `QUICK_LOOKS` + 1 descriptors of agent processes: first
/// where an earlier lookup saw this socket on its way (a client with many connections has most
/// of its new ones seen before their own lookups), then those that connections which ended
/// held (see [`released`]: the process that released one last first, its descriptors lowest
/// first; each is looked at once), then those where the latest agent connections were
/// found, newest first (new sockets take the lowest free descriptors, so a client that opens a
/// connection per request gets the same few numbers again). A few non-sleeping syscalls, cheap
/// enough for an async worker. Anything more is [`PeerLookup::Scan`]. The order only saves
/// looks: a process is named only at a descriptor that is this very socket.
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
    let seen = SEEN.lock().ok().and_then(|mut seen| seen.remove(&inode));
    let mut candidates: Vec<(u32, u32)> = Vec::with_capacity(QUICK_LOOKS + 1);
    candidates.extend(seen);
    let mut add = |entry: (u32, u32)| {
        if !candidates.contains(&entry) {
            candidates.push(entry);
        }
    };
    if let Ok(freed) = FREED.lock() {
        // Descriptor numbers compare within one process only: the process that released one
        // last comes first, its descriptors lowest first.
        let mut order: Vec<(u32, u32)> = freed.clone();
        order.sort_by_cached_key(|&(pid, fd)| {
            (std::cmp::Reverse(freed.iter().rposition(|&(released, _)| released == pid)), fd)
        });
        order.into_iter().take(FREED_LOOKS).for_each(&mut add);
    }
    if let Ok(known) = KNOWN_PEERS.lock() {
        known.iter().copied().take(QUICK_LOOKS).for_each(add);
    }
    candidates.truncate(QUICK_LOOKS + 1);
    let hit = candidates.iter().position(|&(pid, fd)| holds_at(pid, fd, &needle));
    // A freed descriptor is a hint for one look: whatever was there (another socket, nothing, a
    // process gone), one that was looked at leaves the freed ones.
    let looked = &candidates[..hit.map_or(candidates.len(), |at| at + 1)];
    if let Ok(mut freed) = FREED.lock() {
        freed.retain(|entry| !looked.contains(entry));
    }
    match hit.map(|at| candidates[at]) {
        Some((pid, fd)) => {
            remember_peer(pid, fd);
            PeerLookup::Found(Holder { pid, fd })
        }
        None => PeerLookup::Scan { inode: Some(inode), uid: Some(uid) },
    }
}

/// The connection whose client end `holder` held has ended on the gateway's side: the client
/// has most likely closed it too (a client that opens a connection per request closes each
/// after reading its answer), so that descriptor is free and, being low, about to be taken by
/// the client's next connection. The next lookups look there early. Only a hint: a descriptor
/// still names a process only if it is the very socket looked for.
pub fn released(holder: Holder) {
    if let Ok(mut freed) = FREED.lock() {
        let entry = (holder.pid, holder.fd);
        freed.retain(|&kept| kept != entry);
        if freed.len() >= FREED_KEPT {
            freed.remove(0);
        }
        freed.push(entry);
    }
}

/// The pid owning the loopback TCP connection whose client end is `peer` and server end is
/// `local` (Linux): [`tcp_peer_quick`], then [`PeerLookup::finish`]. Reads `/proc`: call it off
/// the async workers.
pub fn tcp_peer_pid(peer: SocketAddr, local: SocketAddr) -> Option<u32> {
    tcp_peer_quick(peer, local).finish(peer, local).map(|holder| holder.pid)
}

impl PeerLookup {
    /// The owner, scanning if the quick look did not find it. One scan runs at a time (a lookup
    /// waits up to 100 ms for its turn): a client that opens many connections at once has them
    /// all missed by the quick look together, and the first scan to find its process notes where
    /// its other sockets are, so each lookup that waited first looks where its socket was seen
    /// (if it is still open). Then the descriptors of the processes that held agent connections
    /// before, then the processes of the socket's owner only (`/proc/net/tcp` gives the inode only
    /// where netlink is unavailable). Reads `/proc`: call it off the async workers.
    pub fn finish(self, peer: SocketAddr, local: SocketAddr) -> Option<Holder> {
        let (inode, uid) = match self {
            PeerLookup::Found(holder) => return Some(holder),
            PeerLookup::Gone => return None,
            PeerLookup::Scan { inode: Some(inode), uid } => (inode, uid),
            PeerLookup::Scan { inode: None, .. } => (socket_inode(peer, local)?, None),
        };
        let needle = format!("socket:[{inode}]");
        // Seen by a scan since the quick look (before waiting for a turn), or by the scan this
        // lookup waited for.
        let seen_at = || {
            let seen = SEEN.lock().ok().and_then(|mut seen| seen.remove(&inode));
            let (pid, fd) = seen.filter(|&(pid, fd)| holds_at(pid, fd, &needle))?;
            remember_peer(pid, fd);
            Some(Holder { pid, fd })
        };
        if let Some(holder) = seen_at() {
            return Some(holder);
        }
        let turn = ScanTurn::wait();
        // A connection that ended while this lookup waited is not looked for (where netlink
        // cannot tell, it is).
        if turn.waited {
            match crate::caller::sock_diag::tcp_entry(peer, local) {
                Ok(Some(entry)) if u64::from(entry.inode) == inode => {}
                Ok(_) => return None,
                Err(_) => {}
            }
            if let Some(holder) = seen_at() {
                return Some(holder);
            }
        }
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
        Some(Holder { pid, fd })
    }
}

/// Whether descriptor `fd` of process `pid` is the socket `needle` (`socket:[inode]`). Another
/// socket found there is remembered where it was (see [`SEEN`]).
fn holds_at(pid: u32, fd: u32, needle: &str) -> bool {
    #[cfg(test)]
    tests::LOOKS.with(|looks| looks.set(looks.get() + 1));
    let Ok(target) = std::fs::read_link(format!("/proc/{pid}/fd/{fd}")) else { return false };
    if target.as_os_str() == needle {
        return true;
    }
    if let Some(other) = socket_of(&target) {
        note_seen(&[(other, (pid, fd))]);
    }
    false
}

/// The inode of a descriptor's target if it is a socket (`socket:[inode]`).
fn socket_of(target: &std::path::Path) -> Option<u64> {
    target.to_str()?.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
}

/// Remembers where sockets were seen (see [`SEEN`]): all dropped first if these would not fit.
fn note_seen(found: &[(u64, (u32, u32))]) {
    if let Ok(mut seen) = SEEN.lock() {
        if seen.len() + found.len() > SEEN_KEPT {
            seen.clear();
        }
        seen.extend(found.iter().copied());
    }
}

/// A lookup's turn to scan (see [`PeerLookup::finish`]): alone, once the scan under way ended,
/// or alongside it if that takes longer than [`SCAN_WAIT`] (a slow scan, or many queued, delays
/// other lookups by no more).
struct ScanTurn {
    /// Whether this lookup scans alone (and ends the turn when dropped).
    alone: bool,
    /// Whether a scan was under way when this lookup came.
    waited: bool,
}

impl ScanTurn {
    fn wait() -> ScanTurn {
        let Ok(mut running) = SCANNING.lock() else { return ScanTurn { alone: false, waited: false } };
        let waited = *running;
        let deadline = std::time::Instant::now() + SCAN_WAIT;
        while *running {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return ScanTurn { alone: false, waited };
            }
            running = match SCAN_ENDED.wait_timeout(running, left) {
                Ok((running, _)) => running,
                Err(_) => return ScanTurn { alone: false, waited },
            };
        }
        *running = true;
        ScanTurn { alone: true, waited }
    }
}

impl Drop for ScanTurn {
    fn drop(&mut self) {
        if self.alone {
            if let Ok(mut running) = SCANNING.lock() {
                *running = false;
            }
            SCAN_ENDED.notify_all();
        }
    }
}

/// The descriptor of process `pid` that is the socket `needle`, if it holds it. A process that
/// holds it is an agent, and its other sockets are likely agent connections whose lookups are
/// waiting (a client opening many at once): its descriptors are read to the end (no more than a
/// process that does not hold it costs) and up to [`SEEN_PER_SCAN`] of its sockets remembered
/// where they are.
fn descriptor_of(pid: u32, needle: &str) -> Option<u32> {
    #[cfg(test)]
    tests::SCANNED.with(|scanned| scanned.set(scanned.get() + 1));
    let mut found = None;
    let mut others: Vec<(u64, (u32, u32))> = Vec::new();
    for entry in std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.flatten() {
        let Some(n) = entry.file_name().to_str().and_then(|n| n.parse().ok()) else { continue };
        let Ok(target) = std::fs::read_link(entry.path()) else { continue };
        if target.as_os_str() == needle {
            found = Some(n);
        } else if let Some(other) = socket_of(&target)
            && others.len() < SEEN_PER_SCAN
        {
            others.push((other, (pid, n)));
        }
    }
    let found = found?;
    note_seen(&others);
    Some(found)
}

fn remember_peer(pid: u32, fd: u32) {
    if let Ok(mut freed) = FREED.lock() {
        freed.retain(|&entry| entry != (pid, fd));
    }
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
/// How many descriptors [`tcp_peer_quick`] looks at (one `readlink` each) before giving up to a
/// scan.
const QUICK_LOOKS: usize = 48;

/// Descriptors that connections which ended held (see [`released`]), in the order they were
/// released; one leaves once a lookup has looked at it (see [`tcp_peer_quick`]) or a connection
/// is found there, the oldest when [`FREED_KEPT`] are kept.
static FREED: std::sync::Mutex<Vec<(u32, u32)>> = std::sync::Mutex::new(Vec::new());
const FREED_KEPT: usize = 64;
/// How many freed descriptors [`tcp_peer_quick`] looks at: a client's next socket takes its
/// lowest free descriptor.
const FREED_LOOKS: usize = 8;

/// Other sockets (by inode) that [`tcp_peer_quick`] saw on its way, and where: with many
/// connections opened at once, most are seen before their own lookups. A closed socket's entry
/// is never asked for again, and all are dropped when [`SEEN_KEPT`] are kept.
static SEEN: std::sync::LazyLock<std::sync::Mutex<std::collections::HashMap<u64, (u32, u32)>>> =
    std::sync::LazyLock::new(Default::default);
const SEEN_KEPT: usize = 1024;
/// How many of its other sockets a scan that found a process remembers (see [`descriptor_of`]).
const SEEN_PER_SCAN: usize = 256;

/// Whether a lookup scans now (see [`ScanTurn`]): the lookups that wait for it look first where
/// it saw their sockets.
static SCANNING: std::sync::Mutex<bool> = std::sync::Mutex::new(false);
static SCAN_ENDED: std::sync::Condvar = std::sync::Condvar::new();
/// How long a lookup waits for the scan under way before it scans alongside.
#[cfg(not(test))]
const SCAN_WAIT: std::time::Duration = std::time::Duration::from_millis(100);
/// Long enough that a test's lookups wait for the scan however slow a busy machine makes it.
#[cfg(test)]
const SCAN_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

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
    tcp_send_queue_of(local, peer, None)
}

/// [`tcp_send_queue`] of the very socket whose cookie is `cookie` (when given): a socket that
/// took its four-tuple since is `Closed`, and where the kernel cannot be asked by cookie
/// (netlink unavailable) the answer is `None`, never another socket's queue.
pub fn tcp_send_queue_of(
    local: SocketAddr,
    peer: SocketAddr,
    cookie: Option<crate::caller::sock_diag::Cookie>,
) -> Option<SendQueue> {
    // ESTABLISHED, FIN_WAIT1, FIN_WAIT2, TIME_WAIT, CLOSE_WAIT, LAST_ACK, CLOSING. Not CLOSE (7):
    // a reset socket's queue is purged, which would look acknowledged.
    const OPEN_OR_CLOSING_GRACEFULLY: [u8; 7] = [1, 4, 5, 6, 8, 9, 11];
    const TIME_WAIT: u8 = 6;
    let entry = match crate::caller::sock_diag::tcp_entry_of(local, peer, cookie) {
        Ok(entry) => entry.map(|e| (e.state, u64::from(e.send_queue))),
        Err(_) if cookie.is_some() => return None,
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
pub(crate) mod tests {
    use super::*;

    /// The fallback (no netlink) reads the same state and queue as the exact lookup.
    #[test]
    fn proc_net_tcp_and_sock_diag_agree() {
        use std::io::Write;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let local = listener.local_addr().unwrap();
        let (client, mut server, peer) = connect(&listener);
        server.write_all(b"hello").unwrap();
        let diag =
            crate::caller::sock_diag::tcp_entry(local, peer).unwrap().map(|e| (e.state, u64::from(e.send_queue)));
        assert_eq!(proc_net_tcp_queue(local, peer), Some(diag));
        drop(client);
    }

    #[test]
    fn a_loopback_connection_is_traced_to_the_process_holding_it() {
        let _alone = PEER_TESTS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let (client, _server, peer) = connect(&listener);
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
        let (_alone, me, listener, local) = peer_test();
        let (first, first_server, first_peer) = connect(&listener);
        assert_eq!(tcp_peer_pid(first_peer, local), Some(me));
        assert_eq!(found(tcp_peer_quick(first_peer, local)), Some(me));
        drop(first_server);
        // The next connection at the first one's descriptor, as the lowest free descriptor would
        // put it, but placed there by hand: other tests' threads open descriptors meanwhile.
        let mut at_first: std::os::fd::OwnedFd = first.into();
        let (second, _second_server, second_peer) = connect(&listener);
        rustix::io::dup2(&second, &mut at_first).unwrap();
        drop(second);
        assert_eq!(found(tcp_peer_quick(second_peer, local)), Some(me), "the same descriptor again");
        let unrelated: SocketAddr = "127.0.0.1:1".parse().unwrap();
        assert_eq!(tcp_peer_quick(unrelated, local), PeerLookup::Gone);
    }

    /// A quick lookup from no looks: the process it found, and how many descriptors it looked at.
    fn looks_to_find(peer: SocketAddr, local: SocketAddr) -> (Option<u32>, usize) {
        LOOKS.with(|looks| looks.set(0));
        let pid = found(tcp_peer_quick(peer, local));
        (pid, LOOKS.with(std::cell::Cell::get))
    }

    /// The process a quick lookup found, if it found one.
    fn found(lookup: PeerLookup) -> Option<u32> {
        match lookup {
            PeerLookup::Found(holder) => Some(holder.pid),
            _ => None,
        }
    }

    /// A peer lookup test: alone among the peer tests, this process's pid, a listener and its
    /// address.
    fn peer_test() -> (std::sync::MutexGuard<'static, ()>, u32, std::net::TcpListener, SocketAddr) {
        let alone = PEER_TESTS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let local = listener.local_addr().unwrap();
        (alone, std::process::id(), listener, local)
    }

    /// A test of the freed descriptors: [`peer_test`], none freed yet.
    fn freed_lookup_test() -> (std::sync::MutexGuard<'static, ()>, u32, std::net::TcpListener, SocketAddr) {
        let test = peer_test();
        FREED.lock().unwrap().clear();
        test
    }

    /// A client that opens a connection per request closes each one after its answer, and its
    /// next socket takes the descriptor freed: once the gateway's end of a connection is gone,
    /// the next lookup looks there first, ahead of the descriptors of connections found since
    /// (still open, so not where a new socket can be).
    #[test]
    fn a_new_connection_is_looked_for_first_where_a_closed_one_was() {
        let (_alone, me, listener, local) = freed_lookup_test();
        let (first, first_server, first_peer) = connect(&listener);
        let Some(holder) = tcp_peer_quick(first_peer, local).finish(first_peer, local) else {
            panic!("the first connection's holder")
        };
        assert_eq!(holder, Holder { pid: me, fd: std::os::fd::AsRawFd::as_raw_fd(&first) as u32 });
        // Ten connections found after it, all still open: each is newer in the known list.
        let open: Vec<_> = (0..10)
            .map(|_| {
                let (client, server, peer) = connect(&listener);
                assert_eq!(tcp_peer_pid(peer, local), Some(me));
                (client, server)
            })
            .collect();
        // The first connection ends; the next one gets its descriptor (placed there by hand, as
        // the lowest free descriptor would: other tests' threads open descriptors meanwhile).
        drop(first_server);
        released(holder);
        let mut at_first: std::os::fd::OwnedFd = first.into();
        let (next, _next_server, next_peer) = connect(&listener);
        rustix::io::dup2(&next, &mut at_first).unwrap();
        drop(next);
        assert_eq!(looks_to_find(next_peer, local), (Some(me), 1), "the freed descriptor first");
        // Found there again, it is no longer a freed one.
        assert!(FREED.lock().unwrap().iter().all(|&(pid, fd)| (pid, fd) != (holder.pid, holder.fd)));
        drop(open);
    }

    /// A freed descriptor that turns out dead (closed and not taken again, or its process gone)
    /// costs one look, not one per lookup from then on.
    #[test]
    fn a_freed_descriptor_is_looked_at_once() {
        let (_alone, me, listener, local) = freed_lookup_test();
        let (x, _x_server, x_peer) = connect(&listener);
        remember_peer(me, std::os::fd::AsRawFd::as_raw_fd(&x) as u32);
        // This thread's netlink socket opens on its first lookup: before the closed descriptor,
        // so it cannot take it.
        assert_eq!(found(tcp_peer_quick(x_peer, local)), Some(me));
        let gone = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let gone_fd = std::os::fd::AsRawFd::as_raw_fd(&gone) as u32;
        drop(gone);
        released(Holder { pid: me, fd: gone_fd });
        assert_eq!(looks_to_find(x_peer, local), (Some(me), 2), "the freed descriptor, then x's");
        assert_eq!(looks_to_find(x_peer, local), (Some(me), 1), "the freed descriptor is not looked at again");
    }

    /// A new loopback connection to `listener`: the client end, the server end, the client's
    /// address.
    fn connect(listener: &std::net::TcpListener) -> (std::net::TcpStream, std::net::TcpStream, SocketAddr) {
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, peer) = listener.accept().unwrap();
        (client, server, peer)
    }

    /// The lookup's memory (known descriptors, seen sockets) is the process's: tests that count
    /// on it run one at a time even where they share a process (`cargo test`).
    pub(crate) static PEER_TESTS: std::sync::Mutex<()> = std::sync::Mutex::new(());

    /// The freed descriptors as kept now.
    pub(crate) fn freed() -> Vec<(u32, u32)> {
        FREED.lock().unwrap().clone()
    }

    thread_local! {
        /// Descriptors this thread looked at.
        pub(super) static LOOKS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
        /// Processes whose descriptors this thread read in full (or until they ended).
        pub(super) static SCANNED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    }

    /// A socket seen on the way of another connection's lookup (a client opening many at once)
    /// is found with one look when its own lookup comes.
    #[test]
    fn a_socket_seen_by_an_earlier_lookup_is_found_with_one_look() {
        let (_alone, me, listener, local) = peer_test();
        let (x, _x_server, x_peer) = connect(&listener);
        let (y, _y_server, y_peer) = connect(&listener);
        let fd = |s: &std::net::TcpStream| std::os::fd::AsRawFd::as_raw_fd(s) as u32;
        // Known from earlier connections, y's descriptor the newest: x's lookup passes it.
        remember_peer(me, fd(&x));
        remember_peer(me, fd(&y));
        assert_eq!(looks_to_find(x_peer, local), (Some(me), 2), "y's descriptor on the way, then x's");
        // x's descriptor is now the newest known; y is looked for where it was seen.
        assert_eq!(looks_to_find(y_peer, local), (Some(me), 1), "where it was seen, first");
    }

    /// A client that opens many connections at once has them all missed by the quick look, and
    /// their lookups scan together: one scan reads the client's descriptors, and the lookups
    /// that waited for it find their sockets where it saw them, one look each.
    #[test]
    fn connections_opened_at_once_cost_one_scan() {
        let (_alone, me, listener, local) = peer_test();
        SEEN.lock().unwrap().clear();
        let opened: Vec<_> = (0..8).map(|_| connect(&listener)).collect();
        // This process is a known agent (so the scan reads it first, not every process of the
        // user), but at none of these descriptors: every quick look would miss.
        remember_peer(me, std::os::fd::AsRawFd::as_raw_fd(&listener) as u32);
        let inode = |peer: SocketAddr| match crate::caller::sock_diag::tcp_entry(peer, local) {
            Ok(Some(entry)) => u64::from(entry.inode),
            other => panic!("no socket for {peer}: {other:?}"),
        };
        let barrier = std::sync::Barrier::new(opened.len());
        let lookups: Vec<(Option<Holder>, usize, usize)> = std::thread::scope(|scope| {
            let threads: Vec<_> = opened
                .iter()
                .map(|(_, _, peer)| {
                    let (barrier, scan) = (&barrier, PeerLookup::Scan { inode: Some(inode(*peer)), uid: None });
                    scope.spawn(move || {
                        barrier.wait();
                        let holder = scan.finish(*peer, local);
                        (holder, SCANNED.with(std::cell::Cell::get), LOOKS.with(std::cell::Cell::get))
                    })
                })
                .collect();
            threads.into_iter().map(|t| t.join().unwrap()).collect()
        });
        for ((client, _, _), (holder, _, _)) in opened.iter().zip(&lookups) {
            let fd = std::os::fd::AsRawFd::as_raw_fd(client) as u32;
            assert_eq!(*holder, Some(Holder { pid: me, fd }));
        }
        let scanned: usize = lookups.iter().map(|&(_, scanned, _)| scanned).sum();
        let looked: usize = lookups.iter().map(|&(_, _, looks)| looks).sum();
        // One scan (none if another test's scan read this process first), and the others looked
        // where it saw their sockets.
        assert!(scanned <= 1 && scanned + looked == opened.len(), "{scanned} scans, {looked} looks");
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
        let (client, mut server, peer) = connect(&listener);
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
        let (client, mut server, peer) = connect(&listener);
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
    fn proc_net_spelling_matches_the_kernel() {
        let a: SocketAddr = "127.0.0.1:8080".parse().unwrap();
        assert_eq!(proc_net_address(a), "0100007F:1F90");
    }
}

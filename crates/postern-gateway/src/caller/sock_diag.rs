//! One loopback TCP connection as the kernel's socket table has it — state, bytes not yet
//! acknowledged, owner uid, inode — asked about by its four-tuple over netlink (`sock_diag`),
//! so the cost does not grow with the number of sockets on the machine (reading `/proc/net/tcp`
//! makes the kernel format every socket's line, and a laptop with a browser open has thousands).

use netlink_packet_core::{NLM_F_REQUEST, NetlinkHeader, NetlinkMessage, NetlinkPayload};
use netlink_packet_sock_diag::{
    AF_INET, AF_INET6, IPPROTO_TCP, SockDiagMessage,
    inet::{ExtensionFlags, InetRequest, SocketId, StateFlags},
};
use netlink_sys::{Socket, SocketAddr as NetlinkAddr, protocols::NETLINK_SOCK_DIAG};
use std::net::SocketAddr;

/// A TCP socket's entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TcpEntry {
    /// The kernel's TCP state (1 `ESTABLISHED` … 11 `CLOSING`), as in `/proc/net/tcp`.
    pub state: u8,
    /// Bytes written and not yet acknowledged by the other end.
    pub send_queue: u32,
    pub uid: u32,
    /// The socket's inode (0 for a connection in `TIME_WAIT`, which no process holds).
    pub inode: u32,
}

/// A socket's cookie (`SO_COOKIE`): the kernel's number for one socket, never reused while the
/// system runs, unlike a four-tuple, which a new connection from the same port takes again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cookie(pub u64);

impl Cookie {
    /// The cookie of the socket `fd` is.
    pub fn of(fd: impl std::os::fd::AsFd) -> std::io::Result<Cookie> {
        Ok(Cookie(rustix::net::sockopt::socket_cookie(fd)?))
    }

    /// As `inet_diag_sockid` carries it: two native-endian 32-bit words, the low one first.
    fn wire(self) -> [u8; 8] {
        let mut bytes = [0; 8];
        bytes[..4].copy_from_slice(&(self.0 as u32).to_ne_bytes());
        bytes[4..].copy_from_slice(&((self.0 >> 32) as u32).to_ne_bytes());
        bytes
    }
}

/// The entry of the TCP socket whose own end is `local` and whose other end is `remote`:
/// `Ok(None)` when the kernel has no such socket (closed and gone, or reset). One exact lookup,
/// not a dump of the table, over this thread's netlink socket (one per thread, kept: opening,
/// binding and closing one per lookup cost as much as the lookup).
pub fn tcp_entry(local: SocketAddr, remote: SocketAddr) -> std::io::Result<Option<TcpEntry>> {
    tcp_entry_of(local, remote, None)
}

/// [`tcp_entry`], answered only by the socket whose cookie is `cookie` (when given): another
/// socket with the same four-tuple (the client reset the connection and connected again from the
/// same port) is `Ok(None)`, as a socket that is gone.
pub fn tcp_entry_of(
    local: SocketAddr,
    remote: SocketAddr,
    cookie: Option<Cookie>,
) -> std::io::Result<Option<TcpEntry>> {
    thread_local! {
        static DIAG: std::cell::RefCell<Option<Socket>> = const { std::cell::RefCell::new(None) };
    }
    // While the thread's locals are being torn down there is no slot: a socket for this once.
    let Ok(entry) = DIAG.try_with(|slot| {
        // Taken out while in use, put back only after a whole exchange: a socket that failed
        // half-way (its answer perhaps still queued) is closed, never asked again.
        let mut socket = match slot.take() {
            Some(socket) => socket,
            None => diag_socket()?,
        };
        let entry = exchange(&mut socket, local, remote, cookie)?;
        *slot.borrow_mut() = Some(socket);
        Ok(entry)
    }) else {
        return exchange(&mut diag_socket()?, local, remote, cookie);
    };
    entry
}

fn diag_socket() -> std::io::Result<Socket> {
    let mut socket = Socket::new(NETLINK_SOCK_DIAG)?;
    socket.bind_auto()?;
    socket.connect(&NetlinkAddr::new(0, 0))?;
    Ok(socket)
}

/// Numbers each request, so an answer is known to be this request's.
static SEQUENCE: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(1);

/// One request and its answer on `socket`.
fn exchange(
    socket: &mut Socket,
    local: SocketAddr,
    remote: SocketAddr,
    cookie: Option<Cookie>,
) -> std::io::Result<Option<TcpEntry>> {
    let sequence = ask(socket, local, remote, cookie)?;
    answer(socket, sequence)
}

/// Sends the request for the socket whose ends are `local` and `remote`; its number.
fn ask(socket: &mut Socket, local: SocketAddr, remote: SocketAddr, cookie: Option<Cookie>) -> std::io::Result<u32> {
    let mut id = if local.is_ipv4() { SocketId::new_v4() } else { SocketId::new_v6() };
    id.source_port = local.port();
    id.destination_port = remote.port();
    id.source_address = local.ip();
    id.destination_address = remote.ip();
    // INET_DIAG_NOCOOKIE: any socket with this four-tuple. With a cookie, the kernel answers
    // ESTALE for a socket that has the four-tuple but not the cookie.
    id.cookie = cookie.map_or([0xff; 8], Cookie::wire);
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST;
    header.sequence_number = SEQUENCE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let sequence = header.sequence_number;
    let request = InetRequest {
        family: if local.is_ipv4() { AF_INET } else { AF_INET6 },
        protocol: IPPROTO_TCP,
        extensions: ExtensionFlags::empty(),
        states: StateFlags::all(),
        socket_id: id,
    };
    let mut packet = NetlinkMessage::new(header, SockDiagMessage::InetRequest(request).into());
    packet.finalize();
    let mut out = [0u8; 128];
    let out = out.get_mut(..packet.buffer_len()).ok_or_else(|| invalid("sock_diag request too long".into()))?;
    packet.serialize(out);
    socket.send(out, 0)?;
    Ok(sequence)
}

/// The answer to request `sequence`: an answer to any other request (one left queued by an
/// exchange that failed half-way) is an error, never taken for this one's.
fn answer(socket: &mut Socket, sequence: u32) -> std::io::Result<Option<TcpEntry>> {
    let mut answer = Vec::with_capacity(4096);
    let read = socket.recv(&mut answer, 0)?;
    let message =
        NetlinkMessage::<SockDiagMessage>::deserialize(&answer[..read]).map_err(|e| invalid(e.to_string()))?;
    if message.header.sequence_number != sequence {
        return Err(invalid(format!("sock_diag answered request {} for {sequence}", message.header.sequence_number)));
    }
    match message.payload {
        NetlinkPayload::InnerMessage(SockDiagMessage::InetResponse(r)) => Ok(Some(TcpEntry {
            state: r.header.state,
            send_queue: r.header.send_queue,
            uid: r.header.uid,
            inode: r.header.inode,
        })),
        NetlinkPayload::Error(e) => match e.to_io() {
            // ENOENT: the kernel has no such socket; ESTALE: not the one with the cookie asked for.
            gone if gone.kind() == std::io::ErrorKind::NotFound => Ok(None),
            other if other.raw_os_error() == Some(rustix::io::Errno::STALE.raw_os_error()) => Ok(None),
            other => Err(other),
        },
        other => Err(invalid(format!("unexpected sock_diag answer: {other:?}"))),
    }
}

fn invalid(what: String) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, what)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A client of `server` bound to `port` (0: any) with a small receive buffer, which resets
    /// its connection when dropped (no TIME_WAIT keeps the port, so it can connect from it again).
    pub(crate) fn resetting_client(server: SocketAddr, port: u16) -> std::net::TcpStream {
        use rustix::net::{AddressFamily, SocketType, sockopt};
        let fd = rustix::net::socket(AddressFamily::INET, SocketType::STREAM, None).unwrap();
        sockopt::set_socket_reuseaddr(&fd, true).unwrap();
        sockopt::set_socket_recv_buffer_size(&fd, 4096).unwrap();
        rustix::net::bind(&fd, &SocketAddr::from(([127, 0, 0, 1], port))).unwrap();
        rustix::net::connect(&fd, &server).unwrap();
        sockopt::set_socket_linger(&fd, Some(std::time::Duration::ZERO)).unwrap();
        std::net::TcpStream::from(fd)
    }

    #[test]
    fn a_connection_is_found_by_its_four_tuple_from_either_end() {
        use std::io::Write;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let server_addr = listener.local_addr().unwrap();
        let mut client = std::net::TcpStream::connect(server_addr).unwrap();
        let (_server, client_addr) = listener.accept().unwrap();
        let client_end = tcp_entry(client_addr, server_addr).unwrap().expect("the client's socket");
        let server_end = tcp_entry(server_addr, client_addr).unwrap().expect("the server's socket");
        assert_eq!((client_end.state, server_end.state), (1, 1), "both ESTABLISHED");
        use std::os::unix::fs::MetadataExt;
        let uid = std::fs::metadata("/proc/self").unwrap().uid();
        assert_eq!((client_end.uid, server_end.uid), (uid, uid));
        assert_ne!(client_end.inode, server_end.inode);
        client.write_all(b"x").unwrap();
        let unrelated: SocketAddr = "127.0.0.1:1".parse().unwrap();
        assert_eq!(tcp_entry(unrelated, server_addr).unwrap(), None, "no such socket");
    }

    /// The thread's one netlink socket answers each lookup with its own answer, whether the
    /// one before found a socket or not.
    #[test]
    fn lookups_on_one_thread_each_get_their_own_answer() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let server_addr = listener.local_addr().unwrap();
        let clients: Vec<_> = (0..4).map(|_| std::net::TcpStream::connect(server_addr).unwrap()).collect();
        let accepted: Vec<_> = (0..4).map(|_| listener.accept().unwrap()).collect();
        let inodes: Vec<u32> =
            accepted.iter().map(|(_, peer)| tcp_entry(*peer, server_addr).unwrap().unwrap().inode).collect();
        let unrelated: SocketAddr = "127.0.0.1:1".parse().unwrap();
        for round in 0..50 {
            let (_, peer) = &accepted[round % 4];
            assert_eq!(tcp_entry(*peer, server_addr).unwrap().map(|e| e.inode), Some(inodes[round % 4]));
            assert_eq!(tcp_entry(unrelated, server_addr).unwrap(), None, "round {round}");
        }
        drop(clients);
    }

    /// An answer left queued on the socket (an exchange that failed after sending) is not taken
    /// for the next request's: that lookup fails, it does not name the other connection's owner.
    #[test]
    fn an_answer_to_another_request_is_refused() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let server_addr = listener.local_addr().unwrap();
        let _clients: Vec<_> = (0..2).map(|_| std::net::TcpStream::connect(server_addr).unwrap()).collect();
        let (first, second) = (listener.accept().unwrap().1, listener.accept().unwrap().1);
        let mut socket = diag_socket().unwrap();
        ask(&mut socket, first, server_addr, None).unwrap();
        let read = exchange(&mut socket, second, server_addr, None);
        assert_eq!(read.map_err(|e| e.kind()), Err(std::io::ErrorKind::InvalidData), "the first's answer");
        assert!(exchange(&mut diag_socket().unwrap(), second, server_addr, None).unwrap().is_some());
    }

    /// A client that resets its connection and connects again from the same port makes a new
    /// socket with the old one's four-tuple: asked by the old socket's cookie, the kernel says it
    /// is gone, never the new one's state.
    #[test]
    fn a_lookup_by_cookie_is_not_answered_by_a_new_socket_on_the_same_four_tuple() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let server_addr = listener.local_addr().unwrap();
        let connect_from = |port| resetting_client(server_addr, port);
        let first = connect_from(0);
        let port = first.local_addr().unwrap().port();
        let (old, client_addr) = listener.accept().unwrap();
        let old_cookie = Cookie::of(&old).unwrap();
        assert_eq!(tcp_entry_of(server_addr, client_addr, Some(old_cookie)).unwrap().map(|e| e.state), Some(1));
        drop(first);
        let _second = connect_from(port);
        let (new, again) = listener.accept().unwrap();
        assert_eq!(again, client_addr, "the same four-tuple");
        let new_cookie = Cookie::of(&new).unwrap();
        assert_ne!(old_cookie, new_cookie);
        assert_eq!(tcp_entry_of(server_addr, client_addr, Some(old_cookie)).unwrap(), None, "the old socket is gone");
        assert_eq!(tcp_entry_of(server_addr, client_addr, Some(new_cookie)).unwrap().map(|e| e.state), Some(1));
        assert_eq!(tcp_entry(server_addr, client_addr).unwrap().map(|e| e.state), Some(1), "by tuple: the new one");
        drop(old);
    }

    #[test]
    fn ipv6_loopback_connections_are_found_too() {
        let Ok(listener) = std::net::TcpListener::bind("[::1]:0") else { return };
        let server_addr = listener.local_addr().unwrap();
        let _client = std::net::TcpStream::connect(server_addr).unwrap();
        let (_server, client_addr) = listener.accept().unwrap();
        assert_eq!(tcp_entry(client_addr, server_addr).unwrap().map(|e| e.state), Some(1));
    }
}

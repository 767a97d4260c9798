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

/// The entry of the TCP socket whose own end is `local` and whose other end is `remote`:
/// `Ok(None)` when the kernel has no such socket (closed and gone, or reset). One exact lookup,
/// not a dump of the table, over this thread's netlink socket (one per thread, kept: opening,
/// binding and closing one per lookup cost as much as the lookup).
pub fn tcp_entry(local: SocketAddr, remote: SocketAddr) -> std::io::Result<Option<TcpEntry>> {
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
        let entry = exchange(&mut socket, local, remote)?;
        *slot.borrow_mut() = Some(socket);
        Ok(entry)
    }) else {
        return exchange(&mut diag_socket()?, local, remote);
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
fn exchange(socket: &mut Socket, local: SocketAddr, remote: SocketAddr) -> std::io::Result<Option<TcpEntry>> {
    let sequence = ask(socket, local, remote)?;
    answer(socket, sequence)
}

/// Sends the request for the socket whose ends are `local` and `remote`; its number.
fn ask(socket: &mut Socket, local: SocketAddr, remote: SocketAddr) -> std::io::Result<u32> {
    let mut id = if local.is_ipv4() { SocketId::new_v4() } else { SocketId::new_v6() };
    id.source_port = local.port();
    id.destination_port = remote.port();
    id.source_address = local.ip();
    id.destination_address = remote.ip();
    // INET_DIAG_NOCOOKIE: any socket with this four-tuple.
    id.cookie = [0xff; 8];
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
            // ENOENT: the kernel has no such socket.
            gone if gone.kind() == std::io::ErrorKind::NotFound => Ok(None),
            other => Err(other),
        },
        other => Err(invalid(format!("unexpected sock_diag answer: {other:?}"))),
    }
}

fn invalid(what: String) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, what)
}

#[cfg(test)]
mod tests {
    use super::*;

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
        ask(&mut socket, first, server_addr).unwrap();
        let read = exchange(&mut socket, second, server_addr);
        assert_eq!(read.map_err(|e| e.kind()), Err(std::io::ErrorKind::InvalidData), "the first's answer");
        assert!(exchange(&mut diag_socket().unwrap(), second, server_addr).unwrap().is_some());
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

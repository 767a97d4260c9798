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
/// not a dump of the table.
pub fn tcp_entry(local: SocketAddr, remote: SocketAddr) -> std::io::Result<Option<TcpEntry>> {
    let mut socket = Socket::new(NETLINK_SOCK_DIAG)?;
    socket.bind_auto()?;
    socket.connect(&NetlinkAddr::new(0, 0))?;
    let mut id = if local.is_ipv4() { SocketId::new_v4() } else { SocketId::new_v6() };
    id.source_port = local.port();
    id.destination_port = remote.port();
    id.source_address = local.ip();
    id.destination_address = remote.ip();
    // INET_DIAG_NOCOOKIE: any socket with this four-tuple.
    id.cookie = [0xff; 8];
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST;
    let request = InetRequest {
        family: if local.is_ipv4() { AF_INET } else { AF_INET6 },
        protocol: IPPROTO_TCP,
        extensions: ExtensionFlags::empty(),
        states: StateFlags::all(),
        socket_id: id,
    };
    let mut packet = NetlinkMessage::new(header, SockDiagMessage::InetRequest(request).into());
    packet.finalize();
    let mut out = vec![0; packet.buffer_len()];
    packet.serialize(&mut out);
    socket.send(&out, 0)?;
    let mut answer = Vec::with_capacity(4096);
    let read = socket.recv(&mut answer, 0)?;
    let message = NetlinkMessage::<SockDiagMessage>::deserialize(&answer[..read])
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()))?;
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
        other => {
            Err(std::io::Error::new(std::io::ErrorKind::InvalidData, format!("unexpected sock_diag answer: {other:?}")))
        }
    }
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

    #[test]
    fn ipv6_loopback_connections_are_found_too() {
        let Ok(listener) = std::net::TcpListener::bind("[::1]:0") else { return };
        let server_addr = listener.local_addr().unwrap();
        let _client = std::net::TcpStream::connect(server_addr).unwrap();
        let (_server, client_addr) = listener.accept().unwrap();
        assert_eq!(tcp_entry(client_addr, server_addr).unwrap().map(|e| e.state), Some(1));
    }
}

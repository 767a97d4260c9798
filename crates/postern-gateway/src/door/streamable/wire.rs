//! The accepted connection's byte stream, which knows when the connection has handed the kernel
//! everything it buffered: the first step of a result's delivery is looked for only from then on.
//!
//! hyper takes a body's frame into its write buffer and polls the body again before it writes
//! the buffer out, so the body being polled again says only that its frame is buffered. A look at
//! the kernel's send queue then would find it empty and read it as acknowledged. hyper flushes
//! the stream (`poll_flush`) only once its buffer is empty, so a frame buffered before a flush was
//! in the kernel's hands by the time the flush comes.
//!
//! The kernel is asked right after the flush, then by a watcher that backs off, and once more
//! when the connection ends (the client's end closed, the server shutting down, the stream
//! dropped): a client that reads its answer and closes at once acknowledges it with its FIN, but
//! the socket leaves the kernel's table soon after the server closes too. Every look names the
//! accepted socket by its cookie (a new connection from the client's port after a reset has the
//! same four-tuple), and a result whose write stalls (a client that never reads) counts as not
//! delivered after the deadline, as one whose bytes are never acknowledged does.

use crate::{
    caller::{connection, sock_diag::Cookie},
    delivery::DeliveryTicket,
};
use std::{
    io,
    net::SocketAddr,
    pin::Pin,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicBool, Ordering},
    },
    task::{Context, Poll},
};
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::{TcpListener, TcpStream},
};

/// The listener: loopback TCP with Nagle off (answers are small SSE frames written in pieces;
/// with Nagle and delayed ACKs each would wait ~40 ms).
#[derive(Debug)]
pub struct NoDelayListener(pub(super) TcpListener);

impl axum::serve::Listener for NoDelayListener {
    type Io = Wire;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            match self.0.accept().await {
                Ok((stream, addr)) => {
                    if let Err(e) = stream.set_nodelay(true) {
                        tracing::debug!(error = %e, "could not set TCP_NODELAY");
                    }
                    let local = stream.local_addr().unwrap_or(addr);
                    return (Wire::new(stream, local, addr), addr);
                }
                Err(e) => {
                    tracing::error!(error = %e, "accept on the HTTP endpoint failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.0.local_addr()
    }
}

/// One accepted connection's stream. Delivery tickets whose frame the connection has buffered
/// wait in its [`Handoffs`] for the connection's next flush.
#[derive(Debug)]
pub struct Wire {
    stream: TcpStream,
    handoffs: Arc<Handoffs>,
}

impl Wire {
    pub(super) fn new(stream: TcpStream, local: SocketAddr, peer: SocketAddr) -> Self {
        Wire::with_deadline(stream, local, peer, ACK_DEADLINE)
    }

    fn with_deadline(stream: TcpStream, local: SocketAddr, peer: SocketAddr, deadline: std::time::Duration) -> Self {
        let handoffs = Handoffs {
            conn: (local, peer),
            cookie: std::sync::OnceLock::new(),
            deadline,
            tickets: Mutex::default(),
            buffered: AtomicBool::new(false),
        };
        Wire { stream, handoffs: Arc::new(handoffs) }
    }

    /// The socket's cookie, which every look at its send queue names: after a reset, a new
    /// connection from the client's port has the same four-tuple. `None` (logged): unreadable.
    fn cookie(&self) -> Option<Cookie> {
        Cookie::of(&self.stream)
            .inspect_err(
                |e| tracing::warn!(error = %e, "no SO_COOKIE: results on this connection will count as not delivered"),
            )
            .ok()
    }

    /// The server end.
    pub(super) fn local(&self) -> SocketAddr {
        self.handoffs.conn.0
    }

    /// Where this connection's response bodies hand their tickets over.
    pub(super) fn handoffs(&self) -> Arc<Handoffs> {
        Arc::clone(&self.handoffs)
    }
}

/// Tickets whose result frame the connection has taken, until the client's kernel has
/// acknowledged the frame's bytes or can no longer.
#[derive(Debug)]
pub(super) struct Handoffs {
    /// The server end and the client end.
    conn: (SocketAddr, SocketAddr),
    /// The server end's socket cookie, read at the first flush that has tickets (`None` inside:
    /// unreadable, and so is every look).
    cookie: std::sync::OnceLock<Option<Cookie>>,
    /// How long a ticket may stay unacknowledged after its flush, or buffered after its write
    /// stalled ([`ACK_DEADLINE`]).
    deadline: std::time::Duration,
    tickets: Mutex<Tickets>,
    /// Whether a ticket waits for a flush (spares the lock on each flush without one).
    buffered: AtomicBool,
}

#[derive(Debug, Default)]
struct Tickets {
    /// Their frame is in the connection's buffer.
    buffered: Vec<Buffered>,
    /// Their frame was written out; the client's kernel has not acknowledged it yet.
    unacknowledged: Vec<Unacknowledged>,
    /// How many flushes had tickets.
    flushes: u64,
    /// A task looks at the send queue until `unacknowledged` is empty.
    watched: bool,
    /// The stream is gone: nothing more is written out.
    closed: bool,
}

#[derive(Debug)]
struct Buffered {
    ticket: DeliveryTicket,
    /// A client that never reads can keep a large answer in the buffer for as long as it keeps
    /// the connection: from [`ACK_DEADLINE`] after this, it was not delivered.
    since: tokio::time::Instant,
}

#[derive(Debug)]
struct Unacknowledged {
    ticket: DeliveryTicket,
    /// The flush that wrote it out: a look at the send queue taken before it says nothing of it.
    flush: u64,
    since: tokio::time::Instant,
}

impl Handoffs {
    fn tickets(&self) -> std::sync::MutexGuard<'_, Tickets> {
        self.tickets.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn look(&self) -> Option<connection::SendQueue> {
        let cookie = (*self.cookie.get()?)?;
        connection::tcp_send_queue_of(self.conn.0, self.conn.1, Some(cookie))
    }

    /// `ticket`'s frame was taken by the connection: once the connection has written everything
    /// it buffered, the client's kernel acknowledging every byte sent settles it written. If the
    /// connection is gone already, the result was not delivered.
    pub(super) fn after_flush(&self, ticket: DeliveryTicket) {
        let mut tickets = self.tickets();
        if tickets.closed {
            drop(tickets);
            ticket.settle(false);
            return;
        }
        tickets.buffered.push(Buffered { ticket, since: tokio::time::Instant::now() });
        self.buffered.store(true, Ordering::Release);
    }

    /// The connection has written everything it buffered. On loopback the client's kernel often
    /// acknowledges inside the write, so a look right away usually settles the tickets; a client
    /// that delays its acknowledgement leaves them to [`Handoffs::watch`]. `cookie` reads the
    /// socket's cookie, the first time there are tickets.
    fn flushed(self: &Arc<Self>, cookie: impl FnOnce() -> Option<Cookie>) {
        if !self.buffered.load(Ordering::Acquire) {
            return;
        }
        // Read once, before the first look: only a connection that carries a result pays for it.
        self.cookie.get_or_init(cookie);
        let (written_out, flush) = {
            let mut tickets = self.tickets();
            self.buffered.store(false, Ordering::Release);
            tickets.flushes += 1;
            let written_out = std::mem::take(&mut tickets.buffered).into_iter().map(|b| b.ticket).collect::<Vec<_>>();
            (written_out, tickets.flushes)
        };
        match self.look() {
            Some(connection::SendQueue::Acknowledged) => written_out.iter().for_each(DeliveryTicket::written),
            Some(connection::SendQueue::Pending(_)) => {
                let since = tokio::time::Instant::now();
                let mut tickets = self.tickets();
                let waiting = written_out.into_iter().map(|ticket| Unacknowledged { ticket, flush, since });
                tickets.unacknowledged.extend(waiting);
                self.watch_unless_watched(&mut tickets);
            }
            // Reset, gone, or the table unreadable: not delivered.
            _ => written_out.iter().for_each(|t| t.settle(false)),
        }
    }

    /// The stream is gone. What it had not written out was not delivered; what it had is looked
    /// at once more ([`Handoffs::ending`]).
    fn closed(&self) {
        let buffered = {
            let mut tickets = self.tickets();
            tickets.closed = true;
            self.buffered.store(false, Ordering::Release);
            std::mem::take(&mut tickets.buffered)
        };
        buffered.iter().for_each(|b| b.ticket.settle(false));
        self.ending();
    }

    /// The connection is ending: the client closed its end, or the server is closing or gone.
    /// Unacknowledged tickets are looked at now, while the socket is surely in the kernel's
    /// table: a client that read everything and closed acknowledged it all with its FIN, and once
    /// the server closes too, the socket leaves the table at the client's last ACK, and that can
    /// no longer be told from a reset. What is still unacknowledged stays watched.
    fn ending(&self) {
        let flushes = {
            let tickets = self.tickets();
            if tickets.unacknowledged.is_empty() {
                return;
            }
            tickets.flushes
        };
        self.settle_by(self.look(), flushes);
    }

    /// The connection could not write everything out (the client's kernel takes no more): its
    /// buffered tickets are watched for their deadline.
    fn stalled(self: &Arc<Self>) {
        if !self.buffered.load(Ordering::Acquire) {
            return;
        }
        let mut tickets = self.tickets();
        if !tickets.buffered.is_empty() {
            self.watch_unless_watched(&mut tickets);
        }
    }

    /// Starts the task that watches the unacknowledged and stalled tickets, if none runs.
    fn watch_unless_watched(self: &Arc<Self>, tickets: &mut Tickets) {
        if tickets.watched {
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                tickets.watched = true;
                handle.spawn(Arc::clone(self).watch());
            }
            Err(_) => tickets.unacknowledged.drain(..).for_each(|u| u.ticket.settle(false)),
        }
    }

    /// Looks at the send queue, backing off, until no ticket is unacknowledged or buffered.
    async fn watch(self: Arc<Self>) {
        let mut pause = std::time::Duration::from_micros(200);
        loop {
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(std::time::Duration::from_millis(50));
            let flushes = self.tickets().flushes;
            let handoffs = Arc::clone(&self);
            let look = tokio::task::spawn_blocking(move || handoffs.look()).await.ok().flatten();
            if self.settle_by(look, flushes) {
                return;
            }
        }
    }

    /// Settles the unacknowledged tickets written out by flush `flushes` or before, by `look`
    /// (taken after that flush), and as not delivered the buffered ones past their deadline;
    /// whether none is left to watch, and then no watcher runs.
    fn settle_by(&self, look: Option<connection::SendQueue>, flushes: u64) -> bool {
        let (settled, expired, done) = {
            let mut tickets = self.tickets();
            let (expired, buffered): (Vec<_>, Vec<_>) =
                std::mem::take(&mut tickets.buffered).into_iter().partition(|b| b.since.elapsed() >= self.deadline);
            tickets.buffered = buffered;
            let (settled, kept): (Vec<_>, Vec<_>) =
                std::mem::take(&mut tickets.unacknowledged).into_iter().partition(|u| {
                    u.flush <= flushes
                        && !matches!(look, Some(connection::SendQueue::Pending(_)) if u.since.elapsed() < self.deadline)
                });
            tickets.unacknowledged = kept;
            let done = tickets.unacknowledged.is_empty() && tickets.buffered.is_empty();
            if done {
                tickets.watched = false;
            }
            (settled, expired, done)
        };
        expired.iter().for_each(|b| b.ticket.settle(false));
        let written = matches!(look, Some(connection::SendQueue::Acknowledged));
        for u in settled {
            if written { u.ticket.written() } else { u.ticket.settle(false) }
        }
        done
    }
}

impl Drop for Wire {
    fn drop(&mut self) {
        self.handoffs.closed();
    }
}

impl AsyncRead for Wire {
    /// The end of the stream (the client closed its end) is the moment to look at what it had
    /// not acknowledged yet ([`Handoffs::ending`]).
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let read = Pin::new(&mut self.stream).poll_read(cx, buf);
        if matches!(read, Poll::Ready(Ok(()))) && buf.filled().len() == before && buf.remaining() > 0 {
            self.handoffs.ending();
        }
        read
    }
}

impl AsyncWrite for Wire {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let written = Pin::new(&mut self.stream).poll_write(cx, buf);
        if written.is_pending() {
            self.handoffs.stalled();
        }
        written
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let written = Pin::new(&mut self.stream).poll_write_vectored(cx, bufs);
        if written.is_pending() {
            self.handoffs.stalled();
        }
        written
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    /// hyper calls this only once its write buffer is empty: every frame it took before is now
    /// in the kernel's hands.
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let flushed = Pin::new(&mut self.stream).poll_flush(cx);
        if matches!(flushed, Poll::Ready(Ok(()))) {
            let wire = &*self;
            wire.handoffs.flushed(|| wire.cookie());
        }
        flushed
    }

    /// Looks at what is unacknowledged before the server closes its end ([`Handoffs::ending`]).
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.handoffs.ending();
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// How long the client's kernel has to acknowledge a result's bytes before the result counts as
/// not delivered (a loopback peer acknowledges within microseconds unless it is gone or stuck).
const ACK_DEADLINE: std::time::Duration = std::time::Duration::from_secs(5);

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A loopback connection's server end as the door wraps it, and its client end.
    async fn connection() -> (Wire, TcpStream) {
        connection_with(ACK_DEADLINE).await
    }

    /// [`connection`], whose results count as not delivered `deadline` after they stall.
    async fn connection_with(deadline: std::time::Duration) -> (Wire, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let (server, peer) = listener.accept().await.unwrap();
        let local = server.local_addr().unwrap();
        (Wire::with_deadline(server, local, peer, deadline), client)
    }

    /// A ticket written out by the connection's first flush and not acknowledged at that look.
    fn unacknowledged(wire: &Wire) -> DeliveryTicket {
        wire.handoffs.cookie.get_or_init(|| wire.cookie());
        let ticket = DeliveryTicket::detached();
        ticket.followed_up(); // the agent's step is taken: the kernel's acknowledgement settles it
        let mut tickets = wire.handoffs.tickets();
        tickets.flushes = 1;
        tickets.watched = true;
        let since = tokio::time::Instant::now();
        tickets.unacknowledged.push(Unacknowledged { ticket: ticket.clone(), flush: 1, since });
        ticket
    }

    /// A client that reads the answer and closes at once leaves the server's socket in the
    /// kernel's table only until the server closes too, and then only until the client's last
    /// ACK: the end of the stream is when the kernel is asked, and it says the client's FIN
    /// acknowledged everything.
    #[tokio::test]
    async fn a_client_that_read_everything_and_closed_got_it() {
        let (mut wire, mut client) = connection().await;
        let ticket = unacknowledged(&wire);
        let answer = vec![b'a'; 64 * 1024];
        wire.write_all(&answer).await.unwrap();
        let mut read = vec![0; answer.len()];
        client.read_exact(&mut read).await.unwrap();
        drop(client);
        assert_eq!(ticket.verdict(), None);
        assert_eq!(wire.read(&mut [0; 1]).await.unwrap(), 0, "the client's end closed");
        assert_eq!(ticket.verdict(), Some(true));
    }

    /// A client that resets its connection and connects again from the same port gives a new
    /// socket the old one's four-tuple, its queue empty: the look names the accepted socket by
    /// its cookie, so the result it never acknowledged is not taken for delivered.
    #[tokio::test]
    async fn a_new_connection_on_the_same_port_does_not_acknowledge_the_old_ones_bytes() {
        use crate::caller::sock_diag::tests::resetting_client as connect_from;
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let server_addr = listener.local_addr().unwrap();
        let first = connect_from(server_addr, 0);
        let (server, peer) = listener.accept().await.unwrap();
        let mut wire = Wire::new(server, server_addr, peer);
        let ticket = unacknowledged(&wire);
        // More than the client's small receive buffer takes without reading: some stays queued.
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let chunk = [b'a'; 16 * 1024];
        for _ in 0..8 {
            if Pin::new(&mut wire).poll_write(&mut cx, &chunk).is_pending() {
                break;
            }
        }
        assert!(matches!(wire.handoffs.look(), Some(connection::SendQueue::Pending(_))));
        drop(first); // reset
        let _second = connect_from(server_addr, peer.port());
        let (_new, again) = listener.accept().await.unwrap();
        assert_eq!(again, peer, "the same four-tuple, a new socket with nothing queued");
        let flushes = wire.handoffs.tickets().flushes;
        wire.handoffs.settle_by(wire.handoffs.look(), flushes);
        assert_eq!(ticket.verdict(), Some(false));
    }

    /// A client that keeps its connection and never reads can keep an answer larger than the
    /// kernel's buffers in the connection's own for as long as it likes: once the write stalls,
    /// the result counts as not delivered after the deadline.
    #[tokio::test]
    async fn a_result_stuck_in_the_buffer_is_not_delivered_after_the_deadline() {
        let (mut wire, _client) = connection_with(std::time::Duration::from_millis(300)).await;
        let ticket = DeliveryTicket::detached();
        ticket.followed_up();
        wire.handoffs.after_flush(ticket.clone());
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let chunk = vec![b'a'; 1 << 20];
        while Pin::new(&mut wire).poll_write(&mut cx, &chunk).is_ready() {}
        for _ in 0..100 {
            if ticket.verdict().is_some() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        assert_eq!(ticket.verdict(), Some(false));
        assert!(wire.handoffs.tickets().buffered.is_empty());
    }

    /// A client that closes with the answer unread resets the connection: a result still
    /// unacknowledged then (its client's kernel delayed the ACK) is not delivered. (The bytes
    /// here were acknowledged by the kernel; the look after a flush would have settled them.
    /// What is tested is the look when the stream goes.)
    #[tokio::test]
    async fn a_client_that_closed_without_reading_did_not_get_it() {
        let (mut wire, client) = connection().await;
        let ticket = unacknowledged(&wire);
        wire.write_all(&[b'a'; 1024]).await.unwrap();
        // The bytes reached the client's kernel (and were acknowledged), but the client closes
        // without reading them: its kernel resets the connection.
        let mut probe = [0; 1];
        client.peek(&mut probe).await.unwrap();
        drop(client);
        let mut rest = [0; 1];
        assert!(wire.read(&mut rest).await.is_err_and(|e| e.kind() == io::ErrorKind::ConnectionReset));
        drop(wire);
        assert_eq!(ticket.verdict(), Some(false));
    }
}

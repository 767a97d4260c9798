//! The guard's checks: loopback hosts and origins only, and which requests name a run; a
//! connection's client end handed back to the peer lookup when the connection goes; a result
//! counted as written only once the connection wrote it out.

use super::loopback_origin;

/// A connection hands the descriptor its client end was found at back to the peer lookup when
/// its last handle goes, and not while a request of it still holds one.
#[test]
fn a_connection_hands_back_its_client_descriptor_when_its_last_handle_goes() {
    use crate::caller::connection::{self, tests::PEER_TESTS, tests::freed};
    let _alone = PEER_TESTS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let end = std::sync::Arc::new(super::ClientEnd::default());
    let holder = connection::Holder { pid: u32::MAX - 7, fd: 4242 };
    end.holder.set(holder).unwrap();
    let held_by_a_request = std::sync::Arc::clone(&end);
    drop(end);
    assert!(!freed().contains(&(holder.pid, holder.fd)), "a request still holds the connection");
    drop(held_by_a_request);
    assert!(freed().contains(&(holder.pid, holder.fd)));
    // A connection whose client end was never looked up hands nothing back.
    let before = freed();
    drop(super::ClientEnd::default());
    assert_eq!(freed(), before);
}

/// Another token's agent cannot name a sessionless run in `Mcp-Session-Id` (and so confirm
/// or void its results): no header value read as a session ID can begin like a run's key.
#[test]
fn no_session_header_names_a_run() {
    let forged = format!("{}alice", super::RUN_KEY);
    let read = axum::http::HeaderValue::from_str(&forged).ok().and_then(|v| v.to_str().ok().map(str::to_owned));
    assert_eq!(read, None);
    let bytes = axum::http::HeaderValue::from_bytes(forged.as_bytes()).ok();
    assert!(bytes.is_none_or(|v| v.to_str().is_err()));
}

#[test]
fn only_loopback_hosts_pass() {
    use super::loopback_host;
    for ok in ["127.0.0.1:7387", "localhost", "localhost:1", "[::1]:7387", "[::1]", "127.0.0.1"] {
        assert!(loopback_host(ok), "{ok}");
    }
    for bad in ["evil.example", "evil.example:7387", "127.0.0.1.evil.example", "[::2]:1", "localhost.evil:80", "::1"] {
        assert!(!loopback_host(bad), "{bad}");
    }
}

#[test]
fn only_loopback_origins_pass() {
    for ok in ["http://127.0.0.1:7387", "http://localhost:3000", "http://[::1]:1", "https://localhost"] {
        assert!(loopback_origin(ok), "{ok}");
    }
    for bad in ["http://evil.example", "http://127.0.0.1.evil.example", "null", "file://", "http://localhost.evil"] {
        assert!(!loopback_origin(bad), "{bad}");
    }
}

/// A body that hands out one frame, then waits (an SSE stream that stays open).
struct OneFrame(Option<axum::body::Bytes>);

impl http_body::Body for OneFrame {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        match self.0.take() {
            Some(data) => std::task::Poll::Ready(Some(Ok(http_body::Frame::data(data)))),
            None => std::task::Poll::Pending,
        }
    }
}

/// A loopback connection's server end as the door wraps it, with a fetched task result's body
/// on it (the agent's step of delivery is taken, so the kernel's acknowledgement alone settles
/// it), polled as hyper polls it: the frame, then once more. Returns the server end, the client
/// end, the ticket, and the frame's bytes.
async fn a_fetched_result_taken_by_the_connection()
-> (super::wire::Wire, tokio::net::TcpStream, crate::delivery::DeliveryTicket, axum::body::Bytes) {
    use http_body::Body as _;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let client = tokio::net::TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
    let (server, peer) = listener.accept().await.unwrap();
    let local = server.local_addr().unwrap();
    let wire = super::wire::Wire::new(server, local, peer);
    let id = postern_core::ExecutionId::from_parts(postern_core::Timestamp::from_millis(1_764_445_000_000), 31);
    let ticket = crate::delivery::DeliveryTicket::detached();
    ticket.fetched(id);
    let data = axum::body::Bytes::from(format!("{{\"result\":{{\"execution\":\"{id}\"}}}}"));
    let inner = axum::body::Body::new(OneFrame(Some(data.clone())));
    let mut body = super::DeliveryBody {
        inner,
        first: None,
        ticket: ticket.clone(),
        settled: false,
        handed_out: false,
        handoffs: wire.handoffs(),
        follow_up: None,
        preamble: None,
    };
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    let frame = std::pin::Pin::new(&mut body).poll_frame(&mut cx);
    assert!(matches!(frame, std::task::Poll::Ready(Some(Ok(_)))), "the result's frame is handed out");
    // hyper polls the body again right after taking the frame into its buffer, before writing.
    assert!(std::pin::Pin::new(&mut body).poll_frame(&mut cx).is_pending());
    (wire, client, ticket, data)
}

/// The first step of delivery is the client's kernel acknowledging the result's bytes, so it
/// cannot come while the bytes are still in the connection's buffer: the connection polls the
/// body again before it writes the frame out, and the kernel's send queue is empty then.
#[tokio::test]
async fn a_result_counts_as_written_only_once_the_connection_wrote_it_out() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (mut wire, mut client, ticket, data) = a_fetched_result_taken_by_the_connection().await;
    assert_eq!(ticket.verdict(), None, "the frame is only in the connection's buffer");
    wire.write_all(&data).await.unwrap();
    wire.flush().await.unwrap();
    // The client's kernel acknowledges at once or after its delayed-ACK timer (the connection's
    // watcher looks again): either way, without the client reading.
    for _ in 0..500 {
        if ticket.verdict().is_some() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(ticket.verdict(), Some(true), "written out and acknowledged by the client's kernel");
    let mut read = vec![0; data.len()];
    client.read_exact(&mut read).await.unwrap();
    assert_eq!(read, data);
}

/// A connection whose stream goes before it wrote the result out did not deliver it, and a body
/// that hands a frame to a gone connection settles at once.
#[tokio::test]
async fn a_result_still_buffered_when_the_connection_goes_was_not_delivered() {
    let (wire, _client, ticket, _) = a_fetched_result_taken_by_the_connection().await;
    let handoffs = wire.handoffs();
    drop(wire);
    assert_eq!(ticket.verdict(), Some(false));
    let late = crate::delivery::DeliveryTicket::detached();
    handoffs.after_flush(late.clone());
    assert_eq!(late.verdict(), Some(false));
}

/// A `tools/call` stream's opening waits for whichever comes first: the engine's release (a call
/// with an effect, or a read that waits for a person) or the answer's first frame (a read), which
/// is then handed on as the body's first frame; a body that ends first ends the wait too.
#[tokio::test]
async fn a_stream_opens_at_its_release_or_with_its_first_frame() {
    use http_body::Body as _;
    let opening = postern_engine::Opening::default();
    // Nothing yet: released, the wait ends without taking a frame.
    let mut waiting = axum::body::Body::new(OneFrame(None));
    let (done, ()) = tokio::join!(super::opened(&mut waiting, &opening), async { opening.release() });
    assert!(done.is_none());
    // The answer first: it is taken, and handed out first.
    let answer = axum::body::Bytes::from_static(b"data: {}\n\n");
    let mut answered = axum::body::Body::new(OneFrame(Some(answer.clone())));
    let first = super::opened(&mut answered, &postern_engine::Opening::default()).await;
    let frame = first.expect("the first frame was taken").expect("a frame").unwrap();
    assert_eq!(frame.into_data().unwrap(), answer);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    assert!(std::pin::Pin::new(&mut answered).poll_frame(&mut cx).is_pending(), "nothing taken twice");
    // A body that ends at once.
    let mut empty = axum::body::Body::empty();
    assert!(matches!(super::opened(&mut empty, &postern_engine::Opening::default()).await, Some(None)));
}

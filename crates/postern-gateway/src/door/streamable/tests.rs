//! The guard's checks: loopback hosts and origins only, and which requests name a run; a
//! connection's client end handed back to the peer lookup when the connection goes.

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

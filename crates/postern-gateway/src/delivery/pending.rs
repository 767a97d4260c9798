//! The socket's responses that are not confirmed delivered yet: one ticket per request, keyed by
//! its JSON-RPC id, settled by the bridge's acknowledgement and the agent's next call, or lost
//! with the connection.

use super::{Answers, DeliveryTicket, FollowUps};
use postern_engine::Engine;
use rmcp::model::NumberOrString;
use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

/// Requests of one connection whose response has not been confirmed delivered yet (socket).
///
/// A response is delivered in two steps, in either order: the `postern mcp` bridge's
/// acknowledgement, sent after it wrote and flushed the response to the agent's stdin (a write
/// into the socket proves only that the bridge's kernel buffer took it), and the agent's call of
/// another tool on the connection afterwards ([`FollowUps`]: an SDK can fail a call whose answer
/// reached it, e.g. when its connection dies while it validates the result). A connection that
/// never announced itself as a bridge gets no confirmation at all (uncertain resolves to "not
/// delivered").
#[derive(Debug, Default)]
pub struct PendingResponses {
    inner: Mutex<PendingState>,
}

#[derive(Debug, Default)]
struct PendingState {
    closed: bool,
    /// The peer announced itself as a bridge that acknowledges what it relayed.
    acknowledging: bool,
    /// Requests read from the peer whose response is not written yet (by request key). A request
    /// whose id is here, or in `awaiting_ack`, is refused: the answer and the acknowledgement
    /// name a request only by its id, so two requests sharing one would swap their tickets.
    open: std::collections::HashSet<String>,
    /// Requests whose response is not written yet, with the ticket their handler opened.
    tickets: HashMap<String, DeliveryTicket>,
    /// Responses written (or being written) to a bridge, waiting for its acknowledgement.
    awaiting_ack: HashMap<String, DeliveryTicket>,
    /// The tool each open `tools/call` request names.
    tools: HashMap<String, String>,
    /// Responses handed to the bridge, waiting for the agent's call of another tool.
    follow_ups: FollowUps,
}

/// The one session of a socket connection, as [`FollowUps`] names it.
const CONNECTION: &str = "connection";

/// Most responses one connection's bridge may leave unacknowledged. A bridge acknowledges each
/// response once it has written it out, so a real one stays far below this; a process that only
/// claims to be one and never acknowledges would otherwise grow the queue for as long as it stays
/// connected. Beyond it a response is settled by its write, as for a peer that is no bridge:
/// not delivered (uncertain resolves to "not delivered").
const MAX_UNACKNOWLEDGED: usize = 4096;

pub(crate) fn request_key(id: &NumberOrString) -> String {
    match id {
        NumberOrString::Number(n) => format!("n:{n}"),
        NumberOrString::String(s) => format!("s:{s}"),
    }
}

impl PendingResponses {
    /// A ticket for the response to request `id`; settled at once if the connection is gone.
    pub(crate) fn open(&self, id: &NumberOrString, engine: &Arc<Engine>) -> DeliveryTicket {
        let ticket = DeliveryTicket::new(Arc::clone(engine));
        let closed = match self.inner.lock() {
            Ok(mut state) if !state.closed => {
                state.tickets.insert(request_key(id), ticket.clone());
                false
            }
            _ => true,
        };
        if closed {
            ticket.settle(false);
        }
        ticket
    }

    /// The transport is about to write the response to request `key`: its ticket, and whether
    /// an acknowledgement will settle it. With an acknowledging bridge the ticket moves to the
    /// acknowledgement queue *before* the write (the bridge may acknowledge before the write call
    /// returns); otherwise the transport settles it.
    pub(crate) fn take(&self, key: &str) -> Option<(DeliveryTicket, bool)> {
        let mut state = self.inner.lock().ok()?;
        state.open.remove(key);
        let ticket = state.tickets.remove(key)?;
        let tool = state.tools.remove(key);
        if state.acknowledging && !state.closed && state.awaiting_ack.len() < MAX_UNACKNOWLEDGED {
            state.awaiting_ack.insert(key.to_owned(), ticket.clone());
            let answers = Answers { request: Some(key.to_owned()), tool };
            state.follow_ups.awaiting(CONNECTION, answers, ticket.clone());
            Some((ticket, true))
        } else {
            Some((ticket, false))
        }
    }

    /// A request with id `key` arrived: `false` if a request of the connection with that id is
    /// still unanswered or unacknowledged (MCP never reuses an id in a session). Such a request
    /// is refused without an id in the answer, so the one in flight keeps its own.
    pub(crate) fn request_arrived(&self, key: &str) -> bool {
        let Ok(mut state) = self.inner.lock() else { return false };
        if state.awaiting_ack.contains_key(key) {
            return false;
        }
        state.open.insert(key.to_owned())
    }

    /// A `tools/call` of `tool` arrived as request `key`: remember which tool it calls, and count
    /// it as the agent carrying on after the answers written before it.
    pub(crate) fn tool_called(&self, key: String, tool: &str) {
        if let Ok(mut state) = self.inner.lock() {
            state.follow_ups.tool_called(CONNECTION, tool);
            state.tools.insert(key, tool.to_owned());
        }
    }

    /// The agent withdrew request `key` (`notifications/cancelled`): it discards that answer
    /// (rmcp drops the response of a cancelled request, so it is never written): its id is free
    /// again and its ticket is settled not delivered.
    pub(crate) fn cancelled(&self, key: &str) {
        let ticket = self.inner.lock().ok().and_then(|mut state| {
            state.follow_ups.cancelled(CONNECTION, key);
            state.open.remove(key);
            state.tools.remove(key);
            state.tickets.remove(key)
        });
        if let Some(ticket) = ticket {
            ticket.settle(false);
        }
    }

    /// The write of the response to `key` failed: it was not delivered.
    pub(crate) fn write_failed(&self, key: &str, ticket: &DeliveryTicket) {
        if let Ok(mut state) = self.inner.lock() {
            state.awaiting_ack.remove(key);
        }
        ticket.settle(false);
    }

    /// Whether the peer announced itself as a `postern mcp` bridge.
    pub(crate) fn is_bridge(&self) -> bool {
        self.inner.lock().is_ok_and(|state| state.acknowledging)
    }

    /// The peer is a `postern mcp` bridge that acknowledges each response it relayed.
    pub(crate) fn expect_acknowledgements(&self) {
        if let Ok(mut state) = self.inner.lock() {
            state.acknowledging = true;
        }
    }

    /// The bridge wrote and flushed the response to `key` to the agent: one step of delivery.
    pub(crate) fn acknowledged(&self, key: &str) {
        let ticket = self.inner.lock().ok().and_then(|mut state| state.awaiting_ack.remove(key));
        if let Some(ticket) = ticket {
            ticket.written();
        }
    }

    /// The connection is gone: nothing pending or unacknowledged was delivered.
    pub(crate) fn close(&self) {
        let tickets: Vec<DeliveryTicket> = match self.inner.lock() {
            Ok(mut state) => {
                state.closed = true;
                state.follow_ups.session_ended(CONNECTION);
                state.tools.clear();
                state.open.clear();
                let mut all: Vec<DeliveryTicket> = state.tickets.drain().map(|(_, t)| t).collect();
                all.extend(state.awaiting_ack.drain().map(|(_, t)| t));
                all
            }
            Err(_) => return,
        };
        for ticket in tickets {
            ticket.settle(false);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A peer that announced itself as a bridge and never acknowledges holds at most
    /// [`MAX_UNACKNOWLEDGED`] responses in the queue; each one beyond is left to its write to
    /// settle, as for a peer that is no bridge.
    #[test]
    fn a_bridge_that_never_acknowledges_holds_a_bounded_queue() {
        let pending = PendingResponses::default();
        pending.expect_acknowledgements();
        let held = |pending: &PendingResponses| pending.inner.lock().unwrap().awaiting_ack.len();
        for n in 0..MAX_UNACKNOWLEDGED + 3 {
            let key = format!("n:{n}");
            assert!(pending.request_arrived(&key));
            pending.inner.lock().unwrap().tickets.insert(key.clone(), DeliveryTicket::detached());
            let (_, acknowledged) = pending.take(&key).expect("its ticket");
            assert_eq!(acknowledged, n < MAX_UNACKNOWLEDGED, "response {n}");
        }
        assert_eq!(held(&pending), MAX_UNACKNOWLEDGED);
        pending.acknowledged("n:0");
        assert_eq!(held(&pending), MAX_UNACKNOWLEDGED - 1, "an acknowledgement makes room");
    }
}

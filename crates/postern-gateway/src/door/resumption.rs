//! Resuming a broken Streamable HTTP stream: a client whose response stream broke before the
//! answer reconnects with `Last-Event-ID` and is answered from the journal with the outcome of the
//! execution its request reached — the same execution, never a new one — before it ever needs to
//! retry. It works across a gateway restart: the event ID names the request, and the journal
//! knows which execution each request reached. A read-only call is not resumed but read again:
//! its rows are written once it has been answered (and one that waits for nobody opens its stream
//! with its answer, in one write).
//!
//! Each `tools/call` response stream opens with a priming event whose ID is a [`ResumeToken`]
//! (the request's JSON-RPC id). On a `GET` with that ID the guard looks the request up in the
//! journal (`accepted` or `retry_received` rows carry the MCP session and JSON-RPC id), waits
//! while the execution is in flight, and sends the answer on record. Delivery of that answer is
//! settled like any other (the client's kernel acknowledges it, then the agent carries on).

use crate::{
    caller::runs::Caller,
    delivery::{Answers, DeliveryTicket},
    delivery::{
        pending::request_key,
        result::{has_result, outcome_result},
    },
    door::mcp::Gateway,
};
use axum::body::{Body, Bytes};
use base64::Engine as _;
use postern_core::ErrorCode as _;
use rmcp::model::NumberOrString;
use rmcp::transport::streamable_http_server::session::store::{SessionState, SessionStore, SessionStoreError};
use serde_json::{Value, json};
use std::{sync::Arc, time::Duration};

/// How long a client waits before reconnecting (the SSE `retry:` field of the priming event).
pub const RETRY_HINT: Duration = Duration::from_secs(1);

/// How long a resumed stream waits for the request to appear in the journal (a call with an
/// effect is journaled when accepted, moments after it arrives).
const LOOKUP_WINDOW: Duration = Duration::from_secs(10);

/// How long a resumed stream waits for an execution in flight before ending (the client then
/// reconnects with the same ID and waits again).
const ANSWER_WINDOW: Duration = Duration::from_secs(900);

/// An SSE comment that keeps a waiting stream's connection from looking idle.
const KEEP_ALIVE: Duration = Duration::from_secs(15);

const PREFIX: &str = "postern-1.";

/// Longest event ID accepted back (a JSON-RPC id is usually a small number).
const MAX_TOKEN_LEN: usize = 1024;

/// The event ID of a `tools/call` stream's priming event: the request it answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResumeToken(pub NumberOrString);

impl ResumeToken {
    /// `postern-1.n.<integer>` or `postern-1.s.<base64url of the string id>`: only characters
    /// SSE carries verbatim in an `id:` line (no newline, no NUL).
    pub fn event_id(&self) -> String {
        match &self.0 {
            NumberOrString::Number(n) => format!("{PREFIX}n.{n}"),
            NumberOrString::String(s) => {
                format!("{PREFIX}s.{}", base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s.as_bytes()))
            }
        }
    }

    /// The token in a `Last-Event-ID` header; `None` for anything else (rmcp's own IDs, garbage).
    pub fn parse(event_id: &str) -> Option<ResumeToken> {
        if event_id.len() > MAX_TOKEN_LEN {
            return None;
        }
        let rest = event_id.strip_prefix(PREFIX)?;
        let id = match rest.split_once('.')? {
            ("n", n) if !n.starts_with('+') => NumberOrString::Number(n.parse().ok()?),
            ("s", s) => {
                let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(s).ok()?;
                NumberOrString::String(String::from_utf8(bytes).ok()?.into())
            }
            _ => return None,
        };
        let token = ResumeToken(id);
        // One spelling per request: `n.007` or a padded string is not an ID this gateway sent.
        (token.event_id() == event_id).then_some(token)
    }

    /// The priming event that opens a `tools/call` response stream (empty data, as SEP-1699
    /// priming events are).
    pub fn priming_frame(&self) -> Bytes {
        Bytes::from(format!("data: \nid: {}\nretry: {}\n\n", self.event_id(), RETRY_HINT.as_millis()))
    }
}

/// A resumed stream: the request it answers, and the tool that request called (so the agent's
/// next call of another tool confirms delivery).
#[derive(Debug)]
pub struct Resumed {
    pub body: Body,
    pub answers: Answers,
}

/// Answers a `GET` with `Last-Event-ID: token` on MCP session `session` from `caller`: the
/// outcome of the execution the request reached, once it is no longer in flight; a JSON-RPC
/// error naming the request if the journal has no execution of it.
pub async fn resume(
    gateway: Arc<Gateway>,
    caller: &Caller,
    session: &str,
    token: ResumeToken,
    ticket: DeliveryTicket,
) -> Resumed {
    let request = token.0.clone();
    let jsonrpc_id = serde_json::to_value(&request).unwrap_or(Value::Null);
    let mut answers = Answers { request: Some(request_key(&request)), tool: None };
    let engine = Arc::clone(&gateway.engine);
    let actor = caller.actor();
    let started = tokio::time::Instant::now();
    let mut pause = Duration::from_millis(20);
    let found = loop {
        // One index probe, found or not: a request that never was costs no scan.
        match engine.view().execution_for_request(session, &jsonrpc_id) {
            Ok(Some((id, decision))) => match engine.view().execution(id) {
                // Only the agent that made the request may resume it.
                Ok(Some(summary)) if summary.actor == actor.as_str() => break Some((id, decision, summary.tool)),
                Ok(_) => break None,
                Err(e) => return error_stream(&jsonrpc_id, "journal_unavailable", &e.to_string(), answers),
            },
            Ok(None) if started.elapsed() < LOOKUP_WINDOW => {}
            Ok(None) => break None,
            Err(e) => return error_stream(&jsonrpc_id, "journal_unavailable", &e.to_string(), answers),
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(250));
    };
    let Some((id, decision, tool)) = found else {
        return error_stream(
            &jsonrpc_id,
            "nothing_to_resume",
            &format!(
                "Postern found no execution of request {jsonrpc_id} on this MCP session: it looked in the journal \
                 for {} s. That is not proof the request never ran (it may have arrived later, or been a read: a \
                 read-only call is not resumed). Repeat the call: a repeat in the same agent run is matched to \
                 the original and is not sent twice, and a read is read again.",
                LOOKUP_WINDOW.as_secs()
            ),
            answers,
        );
    };
    // The journal names how the request was decided; a spelling this version does not know is
    // not guessed at.
    let decision = match decision.parse::<postern_engine::engine::Decision>() {
        Ok(decision) => decision,
        Err(e) => return error_stream(&jsonrpc_id, "journal_unreadable", &e.to_string(), answers),
    };
    answers.tool = Some(tool);
    // An id beyond 2^53 is kept as its exact decimal string, as on the call's own rows (the
    // journal's canonical JSON holds no integer a double cannot).
    let detail = json!({ "correlation": {
        "transport": caller.transport.as_str(),
        "mcp_session_id": session,
        "jsonrpc_id": postern_core::canonical::with_unsafe_integers_as_strings(&jsonrpc_id),
    }});
    if let Err(e) = engine.stream_resumed(id, detail).await {
        tracing::warn!(execution = %id, error = %e, "could not journal a stream resumption");
    }
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(4);
    tokio::spawn(async move {
        let deadline = tokio::time::Instant::now() + ANSWER_WINDOW;
        let mut keep_alive = tokio::time::Instant::now() + KEEP_ALIVE;
        let mut pause = Duration::from_millis(20);
        loop {
            if tx.is_closed() {
                return;
            }
            let frame = match engine.answer_on_record(id, decision).await {
                Ok(Some(outcome)) => {
                    if has_result(outcome.state) && !outcome.read_only {
                        ticket.carries(outcome.execution_id);
                    }
                    answer_frame(&jsonrpc_id, &outcome_result(&outcome))
                }
                Ok(None) if tokio::time::Instant::now() < deadline => {
                    if tokio::time::Instant::now() >= keep_alive {
                        keep_alive = tokio::time::Instant::now() + KEEP_ALIVE;
                        let _ = tx.send(Bytes::from_static(b":\n\n")).await;
                    }
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(250));
                    continue;
                }
                // Still in flight: end the stream; the client reconnects with the same ID.
                Ok(None) => return,
                Err(e) => error_frame(&jsonrpc_id, e.code(), &e.to_string()),
            };
            let _ = tx.send(frame).await;
            return;
        }
    });
    Resumed { body: Body::new(Frames(rx)), answers }
}

/// A response body fed frame by frame from the task that waits for the answer.
struct Frames(tokio::sync::mpsc::Receiver<Bytes>);

impl http_body::Body for Frames {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        self.0.poll_recv(cx).map(|frame| frame.map(|bytes| Ok(http_body::Frame::data(bytes))))
    }
}

fn error_stream(jsonrpc_id: &Value, code: &str, message: &str, answers: Answers) -> Resumed {
    Resumed { body: Body::from(error_frame(jsonrpc_id, code, message)), answers }
}

fn answer_frame(jsonrpc_id: &Value, result: &rmcp::model::CallToolResult) -> Bytes {
    sse_data(&json!({ "jsonrpc": "2.0", "id": jsonrpc_id, "result": result }))
}

fn error_frame(jsonrpc_id: &Value, code: &str, message: &str) -> Bytes {
    sse_data(&json!({
        "jsonrpc": "2.0",
        "id": jsonrpc_id,
        "error": { "code": rmcp::model::ErrorCode::INTERNAL_ERROR.0, "message": format!("{message} ({code})"),
                   "data": { "code": code } },
    }))
}

fn sse_data(message: &Value) -> Bytes {
    Bytes::from(format!("data: {message}\n\n"))
}

/// Streamable HTTP sessions kept in the database, so that after a restart a client carries on
/// in its MCP session (rmcp replays its `initialize`) and can resume a stream there.
#[derive(Debug)]
pub struct RememberedSessions(pub Arc<postern_engine::Engine>);

#[async_trait::async_trait]
impl SessionStore for RememberedSessions {
    async fn load(&self, session_id: &str) -> Result<Option<SessionState>, SessionStoreError> {
        match self.0.view().mcp_session(session_id)? {
            Some(json) => Ok(Some(serde_json::from_str(&json)?)),
            None => Ok(None),
        }
    }

    async fn store(&self, session_id: &str, state: &SessionState) -> Result<(), SessionStoreError> {
        let json = serde_json::to_string(state)?;
        Ok(self.0.remember_mcp_session(session_id.to_owned(), json).await?)
    }

    async fn delete(&self, session_id: &str) -> Result<(), SessionStoreError> {
        Ok(self.0.forget_mcp_session(session_id.to_owned()).await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn tokens_name_the_request_they_answer() {
        let n = ResumeToken(NumberOrString::Number(42));
        assert_eq!(n.event_id(), "postern-1.n.42");
        assert_eq!(ResumeToken::parse("postern-1.n.42"), Some(n));
        let s = ResumeToken(NumberOrString::String("req/1\n".into()));
        assert_eq!(ResumeToken::parse(&s.event_id()), Some(s.clone()));
        assert!(!s.event_id().contains('\n'));
        for other in
            ["0/3", "0", "", "postern-1.", "postern-1.n.", "postern-1.n.007", "postern-1.n.+7", "postern-1.x.1"]
        {
            assert_eq!(ResumeToken::parse(other), None, "{other:?}");
        }
    }

    #[test]
    fn the_priming_frame_is_one_sse_event_with_the_token_as_its_id() {
        let frame = ResumeToken(NumberOrString::Number(-3)).priming_frame();
        assert_eq!(&frame[..], b"data: \nid: postern-1.n.-3\nretry: 1000\n\n");
    }

    proptest! {
        /// Any request id round-trips, and its event ID is one SSE line of printable ASCII.
        #[test]
        fn any_request_id_round_trips(n in any::<i64>(), s in any::<String>()) {
            for token in [ResumeToken(NumberOrString::Number(n)), ResumeToken(NumberOrString::String(s.clone().into()))] {
                let id = token.event_id();
                prop_assert!(id.bytes().all(|b| b.is_ascii_graphic()));
                if id.len() <= MAX_TOKEN_LEN {
                    prop_assert_eq!(ResumeToken::parse(&id), Some(token));
                }
            }
        }

        /// Whatever a client sends back as `Last-Event-ID`, parsing never panics, and what it
        /// accepts is exactly an ID this gateway would send.
        #[test]
        fn hostile_event_ids_parse_to_nothing_or_to_themselves(raw in "(postern-1\\.)?[ns]?\\.?[ -~]{0,40}") {
            if let Some(token) = ResumeToken::parse(&raw) {
                prop_assert_eq!(token.event_id(), raw);
            }
        }
    }
}

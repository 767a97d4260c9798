//! Streamable HTTP on 127.0.0.1 (rmcp's `StreamableHttpService` behind an axum guard): Origin
//! and Host validation (403), per-agent bearer tokens (401), the calling process traced from
//! the loopback socket, and delivery tracking on the response body.

use crate::{
    caller::runs::{Caller, Transport as RunTransport},
    caller::{connection, identity::AgentProcess},
    delivery::head::MessageHead,
    delivery::pending::request_key,
    delivery::{Answers, DeliveryTicket, FollowUps},
    door::mcp::{Gateway, HttpCaller, PosternMcp},
    door::resumption::{self, ResumeToken},
};
use axum::{
    Router,
    body::{Body, Bytes},
    extract::{ConnectInfo, Request, State, connect_info::Connected},
    http::{HeaderValue, StatusCode, header},
    middleware::{self, Next},
    response::{IntoResponse, Response},
    serve::IncomingStream,
};
use http_body::Frame;
use rmcp::transport::streamable_http_server::{
    StreamableHttpServerConfig, StreamableHttpService, session::local::LocalSessionManager,
};
use sha2::{Digest, Sha256};
use std::{
    net::SocketAddr,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};
use tokio::net::TcpListener;
use wire::{Handoffs, NoDelayListener};

/// Default port of the Streamable HTTP endpoint.
pub const DEFAULT_PORT: u16 = 7387;

/// One TCP connection: its two ends, and (looked up once, on first use) the process holding
/// the client end.
#[derive(Clone, Debug)]
pub struct PeerConnection {
    pub peer: SocketAddr,
    pub local: SocketAddr,
    client: Arc<ClientEnd>,
    /// Where its response bodies wait for their frames to be written out.
    handoffs: Arc<Handoffs>,
}

/// Who holds a connection's client end, once looked up. When the connection's last handle goes
/// (the connection ended and no request of it is still held), the descriptor it was found at is
/// handed back to the lookup as a hint ([`connection::released`]).
#[derive(Debug, Default)]
struct ClientEnd {
    process: tokio::sync::OnceCell<Option<AgentProcess>>,
    holder: std::sync::OnceLock<connection::Holder>,
}

impl Drop for ClientEnd {
    fn drop(&mut self) {
        if let Some(&holder) = self.holder.get() {
            connection::released(holder);
        }
    }
}

impl Connected<IncomingStream<'_, NoDelayListener>> for PeerConnection {
    fn connect_info(stream: IncomingStream<'_, NoDelayListener>) -> Self {
        let peer = *stream.remote_addr();
        let (local, handoffs) = (stream.io().local(), stream.io().handoffs());
        PeerConnection { peer, local, client: Arc::default(), handoffs }
    }
}

#[derive(Clone, Debug)]
struct Guard {
    gateway: Arc<Gateway>,
    follow_ups: Arc<FollowUps>,
    max_message_bytes: usize,
    sessions: Arc<AgentSessions>,
}

impl Guard {
    /// What rmcp's `response` to a request on `session` (or opening one) does to `agent_name`'s
    /// sessions; the session the request was on or opened, if any. A session is counted as rmcp
    /// answered, not as asked: a DELETE it refused (one naming a version it takes no DELETE in)
    /// leaves the session open and counted, and an id it does not know (404) is not kept as an
    /// open session of the agent. A session counts in the place it took, if it took one; a place
    /// that did not become a session (rmcp opened or kept none) is given back.
    fn counted(
        &self,
        agent_name: &str,
        method: &axum::http::Method,
        session: Option<String>,
        mut place: Option<sessions::Place>,
        response: &Response,
    ) -> Option<String> {
        if let Some(s) = &session {
            if method == axum::http::Method::DELETE {
                if response.status().is_success() {
                    self.sessions.ended(agent_name, s);
                    self.follow_ups.session_ended(s);
                }
            } else if response.status() == StatusCode::NOT_FOUND {
                self.sessions.unknown(agent_name, s);
            } else {
                self.sessions.count(&mut place, agent_name, s);
            }
            return session;
        }
        // A new session's id comes back on the response to `initialize`.
        let new = response.headers().get("mcp-session-id").and_then(|v| v.to_str().ok()).map(str::to_owned)?;
        self.sessions.count(&mut place, agent_name, &new);
        self.sessions.bind(&new, agent_name);
        let (engine, id, agent) = (Arc::clone(&self.gateway.engine), new.clone(), agent_name.to_owned());
        tokio::spawn(async move { engine.bind_mcp_session(id, agent).await });
        Some(new)
    }
}

/// The answer to a request that would make one more session count for an agent token at its
/// cap (journaled as a refusal).
async fn too_many_sessions(guard: &Guard, agent_name: &str) -> Response {
    let peer = serde_json::json!({ "actor": format!("agent:{agent_name}") });
    let attempted = format!("one more MCP session beyond {MAX_SESSIONS_PER_AGENT} open for this token");
    guard.gateway.refusals.record_async(crate::door::refusal::Refused { interface: "http", attempted, peer }).await;
    refuse(
        StatusCode::TOO_MANY_REQUESTS,
        "too_many_sessions",
        &format!(
            "this agent token already holds {MAX_SESSIONS_PER_AGENT} open MCP sessions; end one \
             (DELETE /mcp with its Mcp-Session-Id) or let one sit idle for 5 minutes"
        ),
    )
}

/// Reads a POST's body (at most `max` bytes) so the guard can see which message it carries, and
/// puts it back for rmcp.
async fn read_message(request: Request, max: usize) -> Result<(Request, Option<MessageHead>), Response> {
    let (parts, body) = request.into_parts();
    let bytes = axum::body::to_bytes(body, max).await.map_err(|_| {
        refuse(
            StatusCode::PAYLOAD_TOO_LARGE,
            "message_too_large",
            &format!("the message exceeds the gateway's limit of {max} bytes (postern serve --max-message-bytes)"),
        )
    })?;
    let head = MessageHead::parse(&bytes);
    Ok((Request::from_parts(parts, Body::from(bytes)), head))
}

fn refuse(status: StatusCode, code: &str, message: &str) -> Response {
    let body = serde_json::json!({ "error": { "code": code, "message": message } });
    let mut response = (status, axum::Json(body)).into_response();
    if status == StatusCode::UNAUTHORIZED {
        response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer realm=\"postern\""));
    }
    response
}

/// A browser page may only call from a loopback origin (any port): a DNS-rebinding page has a
/// foreign origin and is refused. A loopback page still needs an agent's token, and no CORS
/// headers are ever sent, so a browser cannot read an answer anyway.
pub fn loopback_origin(origin: &str) -> bool {
    url::Url::parse(origin).is_ok_and(|u| {
        matches!(u.scheme(), "http" | "https")
            && matches!(u.host_str(), Some("localhost" | "127.0.0.1" | "[::1]"))
            && u.path() == "/"
    })
}

/// A `Host` header naming this machine's loopback endpoint (any port).
pub fn loopback_host(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(rest) => rest.split_once(']').filter(|(_, p)| p.is_empty() || p.starts_with(':')).map(|(h, _)| h),
        None => Some(
            host.rsplit_once(':')
                .map_or(host, |(h, port)| if port.bytes().all(|b| b.is_ascii_digit()) { h } else { host }),
        ),
    };
    matches!(name, Some("127.0.0.1" | "localhost" | "::1"))
}

async fn guard(
    State(guard): State<Guard>,
    ConnectInfo(conn): ConnectInfo<PeerConnection>,
    mut request: Request,
    next: Next,
) -> Response {
    if let Some(origin) = request.headers().get(header::ORIGIN) {
        let allowed = origin.to_str().is_ok_and(loopback_origin);
        if !allowed {
            return refuse(
                StatusCode::FORBIDDEN,
                "origin_forbidden",
                "requests from web pages on other hosts are refused (Origin is not a loopback address)",
            );
        }
    }
    // A foreign Host (DNS rebinding) is refused before the token is looked at, as Origin is.
    if let Some(host) = request.headers().get(header::HOST)
        && !host.to_str().is_ok_and(loopback_host)
    {
        return refuse(
            StatusCode::FORBIDDEN,
            "host_forbidden",
            "requests for other hosts are refused (Host is not a loopback address)",
        );
    }
    let token = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    let Some(token) = token else {
        return refuse(
            StatusCode::UNAUTHORIZED,
            "token_required",
            "send Authorization: Bearer <token>; create one with `postern agents add NAME`",
        );
    };
    let digest = hex::encode(Sha256::digest(token.as_bytes()));
    let agent = match guard.gateway.engine.view().active_agent_by_token(&digest) {
        Ok(Some(agent)) => agent,
        Ok(None) => {
            return refuse(StatusCode::UNAUTHORIZED, "token_invalid", "this token is unknown or has been revoked");
        }
        Err(e) => return refuse(StatusCode::SERVICE_UNAVAILABLE, "journal_unavailable", &e.to_string()),
    };
    let hashes = Arc::clone(&guard.gateway.hashes);
    let (peer, local) = (conn.peer, conn.local);
    let client = Arc::clone(&conn.client);
    let handoffs = Arc::clone(&conn.handoffs);
    let process = conn
        .client
        .process
        .get_or_init(|| async move {
            // The common case — a process seen before, its executable hashed — costs a few
            // non-sleeping syscalls and is answered here: a hand-off to the blocking pool costs
            // more than that (measured ~110 µs a connection on the 2-core CI machine). A scan of
            // processes or a first hash of an executable goes to the blocking pool.
            let lookup = connection::tcp_peer_quick(peer, local);
            match lookup {
                connection::PeerLookup::Gone => return None,
                connection::PeerLookup::Found(holder) => {
                    let _ = client.holder.set(holder);
                    if let Ok(described) = hashes.describe_if_hashed(holder.pid) {
                        return described;
                    }
                }
                connection::PeerLookup::Scan { .. } => {}
            }
            let (holder, described) = tokio::task::spawn_blocking(move || {
                let holder = lookup.finish(peer, local)?;
                Some((holder, hashes.describe(holder.pid)))
            })
            .await
            .ok()
            .flatten()?;
            let _ = client.holder.set(holder);
            described
        })
        .await
        .clone();
    // The second step of delivery: the agent calling another tool on its session after a result
    // was written says it carried on. Nothing else is such evidence: SDKs send `tools/list`,
    // `ping` and notifications on their own (the Python SDK lists tools to validate a result it
    // has not handed over yet), a call of the same tool may repeat a call whose answer was lost,
    // and a cancellation withdraws its request (the client discards that answer).
    let session = request.headers().get("mcp-session-id").and_then(|v| v.to_str().ok()).map(str::to_owned);
    let agent_name = agent.name.clone();
    // At 2026-07-28 there is no session: the agent's run is what it carries on in (its process,
    // as `runs` keys it; the token alone when the process cannot be named). Its key starts with
    // a control character, which no header value can hold, so no `Mcp-Session-Id` names a run.
    let sessionless = request.headers().get("mcp-protocol-version").is_some_and(|v| v.as_bytes() == b"2026-07-28");
    let carries_on_in = session.clone().or_else(|| {
        sessionless.then(|| match &process {
            Some(p) => format!("{RUN_KEY}{agent_name}:{}:{}", p.key.pid, p.key.start_ticks),
            None => format!("{RUN_KEY}{agent_name}"),
        })
    });
    // An MCP session is its opener's: another token may not call on it, read its streams, or
    // (by carrying on in it) mark the first agent's result delivered.
    let mut known_session = false;
    if let Some(s) = &session {
        match guard.sessions.owner(&agent_name, s, guard.gateway.engine.view()) {
            SessionOwner::Other(owner) => {
                let peer = serde_json::json!({ "actor": format!("agent:{agent_name}") });
                let attempted = format!("MCP session of agent {owner:?}");
                let refused = crate::door::refusal::Refused { interface: "http", attempted, peer };
                guard.gateway.refusals.record_async(refused).await;
                return refuse(
                    StatusCode::NOT_FOUND,
                    "session_not_found",
                    "no such MCP session for this token (a session belongs to the agent token that opened it)",
                );
            }
            SessionOwner::NowThis => {
                known_session = true;
                let (engine, id, agent) = (Arc::clone(&guard.gateway.engine), s.clone(), agent_name.clone());
                tokio::spawn(async move { engine.bind_mcp_session(id, agent).await });
            }
            SessionOwner::This => known_session = true,
            SessionOwner::Unknown => {}
        }
    }
    let method = request.method().clone();
    // A session that does not count for this agent now (one rmcp would restore from the
    // remembered sessions, or one used again after sitting idle) counts once rmcp has it: it
    // takes a place under the cap first, as a new one does. One that counts is marked used at
    // once, so it cannot stop counting while its request is under way. A DELETE makes none count.
    let mut place = None;
    if let Some(s) = &session
        && method != axum::http::Method::DELETE
    {
        match guard.sessions.admit(&agent_name, s) {
            Ok(taken) => place = taken,
            Err(sessions::AtCap) => return too_many_sessions(&guard, &agent_name).await,
        }
    }
    let mut answers = None;
    let mut priming = None;
    if method == axum::http::Method::POST {
        let (readable, head) = match read_message(request, guard.max_message_bytes).await {
            Ok(read) => read,
            Err(refused) => return refused,
        };
        request = readable;
        // Only an `initialize` without a session opens one (rmcp routes every `initialize` to a
        // session, whatever version it names; anything else without a session is served without
        // one, at 2026-07-28, or refused): the cap is kept there, and a 2026-07-28 call of an
        // agent holding the most sessions is served.
        let opens_session = session.is_none() && head.as_ref().is_some_and(|h| h.method() == Some("initialize"));
        if opens_session {
            match guard.sessions.reserve(&agent_name) {
                Ok(taken) => place = Some(taken),
                Err(sessions::AtCap) => return too_many_sessions(&guard, &agent_name).await,
            }
        }
        if let (Some(session), Some(head)) = (&carries_on_in, &head) {
            match head.withdrawn() {
                Some(withdrawn) => guard.follow_ups.cancelled(session, &request_key(withdrawn)),
                None => {
                    if let Some(tool) = head.tool() {
                        guard.follow_ups.tool_called(session, tool);
                    }
                }
            }
        }
        // A `tools/call` stream opens with an event whose ID names the request: a client whose
        // stream breaks resumes with it and is answered from the journal (`resumption`).
        priming = head.as_ref().filter(|h| h.tool().is_some()).and_then(|h| h.id().cloned()).map(ResumeToken);
        answers = head.map(|h| Answers { tool: h.tool().map(str::to_owned), request: h.id().map(request_key) });
    }
    let ticket = DeliveryTicket::new(Arc::clone(&guard.gateway.engine));
    let caller = Caller { transport: RunTransport::StreamableHttp, agent: Some(agent.name), process };
    let resume = (request.method() == axum::http::Method::GET)
        .then(|| request.headers().get("last-event-id").and_then(|v| v.to_str().ok()).and_then(ResumeToken::parse))
        .flatten();
    if let (Some(token), Some(session)) = (resume, &session) {
        if known_session {
            guard.sessions.count(&mut place, &agent_name, session);
        }
        let resumed = resumption::resume(Arc::clone(&guard.gateway), &caller, session, token, ticket.clone()).await;
        let response = Response::builder()
            .status(StatusCode::OK)
            .header(header::CONTENT_TYPE, "text/event-stream")
            .header(header::CACHE_CONTROL, "no-cache")
            .body(resumed.body)
            .unwrap_or_default();
        let follow_up =
            FollowUp { session: session.clone(), answers: resumed.answers, follow_ups: Arc::clone(&guard.follow_ups) };
        return delivering(response, ticket, handoffs, Some(follow_up), None, None);
    }
    // At 2026-07-28 a closed response stream is its request's cancellation: the client cannot
    // resume it and must re-issue the call as a new request. The stream is closed if the
    // connection goes while the answer is awaited (the request is dropped here) or before its
    // body was read to the end ([`DeliveryBody`]). Before `dispatched` the engine then sends
    // nothing; after it the outcome is kept and answers the re-issued call.
    let abandoned = postern_engine::CancelSignal::default();
    let sessionless_call = sessionless && answers.as_ref().is_some_and(|a| a.tool.is_some());
    let mut abandon = Abandon(sessionless_call.then(|| abandoned.clone()));
    let opening = postern_engine::Opening::default();
    request.extensions_mut().insert(HttpCaller { caller, ticket: ticket.clone(), abandoned, opening: opening.clone() });
    let mut unanswered = Unanswered(Some(ticket.clone()));
    // rmcp's answer and what it does to the agent's sessions are one step: a request holding a
    // place runs to rmcp's answer and counts what rmcp opened or kept even if its client goes
    // meanwhile (rmcp keeps the session for the client to carry on in: it must count).
    let holds_place = place.is_some();
    let answered = {
        // Moved, not copied (none is needed after): only the guard's handles are cloned.
        let guard = guard.clone();
        async move {
            let response = next.run(request).await;
            let session = guard.counted(&agent_name, &method, session, place, &response);
            (response, session)
        }
    };
    let (mut response, session) = if holds_place {
        match tokio::spawn(answered).await {
            Ok(answered) => answered,
            Err(_) => {
                return refuse(StatusCode::INTERNAL_SERVER_ERROR, "internal_error", "the MCP service failed to answer");
            }
        }
    } else {
        answered.await
    };
    let streamed = response.status() == StatusCode::OK
        && response.headers().get(header::CONTENT_TYPE).is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
    let follow_up = session.or(carries_on_in).map(|session| FollowUp {
        session,
        answers: answers.unwrap_or_default(),
        follow_ups: Arc::clone(&guard.follow_ups),
    });
    let priming = priming.filter(|_| streamed).map(|t| t.priming_frame());
    let first = match priming {
        Some(_) => opened(response.body_mut(), &opening).await,
        None => None,
    };
    unanswered.0 = None;
    let mut response = delivering(response, ticket, handoffs, follow_up, priming, first);
    if let Some(signal) = abandon.0.take() {
        response = abandoned_unless_read(response, signal);
    }
    response
}

/// Waits, for a `tools/call` stream, until the engine releases the call's opening
/// ([`postern_engine::Opening`]) or the answer's first frame comes, whichever is first: a read
/// that waits for nobody is answered before it is released, and its head, priming event and
/// answer then leave in one write (hyper takes every frame that is ready before it writes). The
/// stream's keep-alive (15 s) is a frame too, so no read holds its head longer than that.
/// Returns the first frame if one was taken.
async fn opened(body: &mut Body, opening: &postern_engine::Opening) -> Option<Polled> {
    use http_body::Body as _;
    tokio::select! {
        biased;
        first = std::future::poll_fn(|cx| Pin::new(&mut *body).poll_frame(cx)) => Some(first),
        () = opening.released() => None,
    }
}

/// One poll's answer from a response body.
type Polled = Option<Result<Frame<Bytes>, axum::Error>>;

/// A response's delivery ticket, settled as not delivered if the request is dropped before its
/// response is (the client's connection went while the guard waited).
struct Unanswered(Option<DeliveryTicket>);

impl Drop for Unanswered {
    fn drop(&mut self) {
        if let Some(ticket) = self.0.take() {
            ticket.settle(false);
        }
    }
}

/// Raises the request's cancellation if dropped still holding it (the request was dropped
/// before its answer came: the client's connection went).
struct Abandon(Option<postern_engine::CancelSignal>);

impl Drop for Abandon {
    fn drop(&mut self) {
        if let Some(signal) = self.0.take() {
            signal.cancel();
        }
    }
}

/// `response`, whose request is cancelled if its body is dropped before it was read to the end.
fn abandoned_unless_read(response: Response, signal: postern_engine::CancelSignal) -> Response {
    let (parts, body) = response.into_parts();
    Response::from_parts(parts, Body::new(ReadToEnd { inner: body, abandon: Abandon(Some(signal)) }))
}

/// A body that disarms its [`Abandon`] once its last frame was taken.
struct ReadToEnd {
    inner: Body,
    abandon: Abandon,
}

impl http_body::Body for ReadToEnd {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(polled, Poll::Ready(None)) {
            self.abandon.0 = None;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        false
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// How the key of a sessionless agent run's [`FollowUps`] begins (see `guard`).
const RUN_KEY: &str = "\u{1}run:";

/// `response` with its body tracked for delivery, opened with `preamble` if any.
fn delivering(
    response: Response,
    ticket: DeliveryTicket,
    handoffs: Arc<Handoffs>,
    follow_up: Option<FollowUp>,
    preamble: Option<Bytes>,
    first: Option<Polled>,
) -> Response {
    let (parts, inner) = response.into_parts();
    let body = DeliveryBody { inner, first, ticket, settled: false, handed_out: false, handoffs, follow_up, preamble };
    Response::from_parts(parts, Body::new(body))
}

/// Where a written result waits for the client's next message.
struct FollowUp {
    session: String,
    answers: Answers,
    follow_ups: Arc<FollowUps>,
}

/// A response body that takes a result's delivery through its first step once the frame carrying
/// it was taken by the connection, written out to the kernel ([`wire`]) *and* acknowledged by the
/// client's kernel, then leaves it to the session's [`FollowUps`]; it settles the result as lost
/// if the connection drops the body or its stream first, the client's end closes or resets
/// before acknowledging, or there is no session to follow up on (uncertain resolves to "not
/// delivered").
struct DeliveryBody {
    inner: Body,
    /// The first poll of `inner`, if it was taken already (see [`opened`]).
    first: Option<Polled>,
    ticket: DeliveryTicket,
    settled: bool,
    /// A frame carrying the result was handed out and awaits the next poll.
    handed_out: bool,
    /// The connection's, where the ticket waits for the frame to be written out.
    handoffs: Arc<Handoffs>,
    follow_up: Option<FollowUp>,
    /// Sent before the first frame of `inner` (a `tools/call` stream's priming event).
    preamble: Option<Bytes>,
}

impl DeliveryBody {
    fn settle(&mut self, written: bool) {
        if !self.settled {
            self.settled = true;
            self.ticket.settle(written);
        }
    }

    /// The frame was taken by the connection: confirm it once the connection has written it out.
    fn confirm_when_written(&mut self) {
        if !self.settled {
            self.settled = true;
            self.handoffs.after_flush(self.ticket.clone());
        }
    }

    /// Does `frame` carry the result of an execution registered on this ticket?
    fn carries_result(&self, frame: &Frame<Bytes>) -> bool {
        let Some(data) = frame.data_ref() else { return false };
        self.ticket.carried().iter().any(|id| memchr::memmem::find(data, id.to_string().as_bytes()).is_some())
    }
}

impl Drop for DeliveryBody {
    fn drop(&mut self) {
        self.settle(false);
    }
}

impl http_body::Body for DeliveryBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        if let Some(preamble) = self.preamble.take() {
            return Poll::Ready(Some(Ok(Frame::data(preamble))));
        }
        // Polled again: the previous frame was taken by the connection.
        if std::mem::take(&mut self.handed_out) {
            self.confirm_when_written();
        }
        let polled = match self.first.take() {
            Some(first) => Poll::Ready(first),
            None => Pin::new(&mut self.inner).poll_frame(cx),
        };
        match &polled {
            Poll::Ready(Some(Ok(frame))) if !self.settled && self.carries_result(frame) => {
                // From now on a call of another tool on the session is a step of delivery: the
                // client may read this frame and call again before the kernel's answer is read.
                match self.follow_up.take() {
                    Some(FollowUp { session, answers, follow_ups }) => {
                        follow_ups.awaiting(&session, answers, self.ticket.clone());
                        self.handed_out = true;
                    }
                    // A result the agent fetched itself (a task's): its request was the step.
                    None if self.ticket.is_followed_up() => self.handed_out = true,
                    None => self.settle(false),
                }
            }
            // Ended without carrying a result: any execution registered later (its MCP session
            // was closed under this stream) was not delivered by it.
            Poll::Ready(None) => self.settle(false),
            _ => {}
        }
        polled
    }

    // Never claim the end early: the connection must poll past the last frame, which is how
    // this body learns the last frame was taken.
    fn is_end_stream(&self) -> bool {
        false
    }

    // Never an exact length either: with one, the connection stops polling once it has the
    // bytes and drops the body, before this body could learn the last frame was taken (a
    // fetched task result is a plain JSON answer with a length).
    fn size_hint(&self) -> http_body::SizeHint {
        let mut hint = http_body::SizeHint::new();
        hint.set_lower(self.inner.size_hint().lower());
        hint
    }
}

/// The router: `/mcp` behind the guard.
pub fn router(gateway: Arc<Gateway>, max_message_bytes: usize, config_token: CancelToken) -> Router {
    let config = StreamableHttpServerConfig::default()
        .with_allowed_hosts(["127.0.0.1", "localhost", "::1", "[::1]"])
        .with_allowed_origins(["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"])
        .enforce_origin_validation()
        .with_max_request_body_bytes(max_message_bytes)
        // A client speaking 2026-07-28 (no sessions) that accepts `application/json` gets a
        // `tools/call` answer as one JSON body instead of an SSE stream per POST.
        .with_json_response(true)
        // A comment frame on a quiet stream every 15 s; it also bounds how long a read's head
        // waits for its answer (see `opened`).
        .with_sse_keep_alive(Some(std::time::Duration::from_secs(15)))
        .with_cancellation_token(config_token.0);
    let mut config = config;
    // Sessions outlive a restart, so a resumed stream finds its session (`resumption`).
    config.session_store = Some(Arc::new(resumption::RememberedSessions(Arc::clone(&gateway.engine))));
    let factory_gateway = Arc::clone(&gateway);
    // The guard primes `tools/call` streams with event IDs the journal can answer after any
    // break, a restart included (`resumption`); rmcp's own priming IDs name an in-memory cache.
    let mut sessions = LocalSessionManager::default();
    sessions.session_config.sse_retry = None;
    let service = StreamableHttpService::new(
        move || Ok(PosternMcp::for_http(Arc::clone(&factory_gateway))),
        Arc::new(sessions),
        config,
    );
    let state = Guard {
        gateway,
        follow_ups: Arc::new(FollowUps::default()),
        max_message_bytes,
        sessions: Arc::new(AgentSessions::default()),
    };
    let refusals = Arc::clone(&state.gateway.refusals);
    Router::new()
        .nest_service("/mcp", service)
        .fallback(move |request: Request| not_offered(Arc::clone(&refusals), request))
        .layer(middleware::from_fn_with_state(state, guard))
}

/// Any path but `/mcp`, from an agent with a valid token (the guard ran first): there is no
/// approval endpoint, nor any other. Refused (404) and journaled.
async fn not_offered(refusals: Arc<crate::door::refusal::Refusals>, request: Request) -> Response {
    let peer = request.extensions().get::<HttpCaller>().map_or(serde_json::Value::Null, |h| {
        serde_json::json!({
            "actor": h.caller.actor().as_str(),
            "pid": h.caller.process.as_ref().map(|p| p.key.pid),
        })
    });
    let attempted = format!("{} {}", request.method(), request.uri().path());
    refusals.record_async(crate::door::refusal::Refused { interface: "http", attempted, peer }).await;
    refuse(
        StatusCode::NOT_FOUND,
        "not_offered",
        "Postern's only HTTP endpoint is /mcp; approvals are given only in the approver, never over HTTP",
    )
}

/// Stops the HTTP endpoint's MCP sessions on shutdown.
#[derive(Clone, Debug, Default)]
pub struct CancelToken(pub tokio_util::sync::CancellationToken);

/// Binds `127.0.0.1:port` (0 = any free port).
pub async fn bind(port: u16) -> std::io::Result<TcpListener> {
    TcpListener::bind(("127.0.0.1", port)).await
}

/// Serves until `shutdown` resolves.
pub async fn serve(
    gateway: Arc<Gateway>,
    listener: TcpListener,
    max_message_bytes: usize,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let token = CancelToken::default();
    let app = router(gateway, max_message_bytes, token.clone());
    let stop = async move {
        shutdown.await;
        token.0.cancel();
    };
    axum::serve(NoDelayListener(listener), app.into_make_service_with_connect_info::<PeerConnection>())
        .with_graceful_shutdown(stop)
        .await
}

mod sessions;
#[cfg(test)]
mod tests;
mod wire;
pub use sessions::MAX_SESSIONS_PER_AGENT;
use sessions::{AgentSessions, SessionOwner};

//! The local endpoint `postern mcp` bridges to: a Unix socket in a per-user runtime directory
//! (directory 0700, socket 0600). The kernel names each connecting process (SO_PEERCRED), so
//! the agent's identity never depends on what it claims.
//!
//! Messages are newline-delimited JSON-RPC (the MCP stdio framing). The framing is ours rather
//! than rmcp's so bad input gets an answer instead of silence: an oversize line, invalid JSON,
//! a batch or non-object params each get a specific JSON-RPC error, and the connection (and
//! every other) keeps being served.

use crate::{
    caller::runs::{Caller, Transport as RunTransport},
    delivery::head::MessageHead,
    delivery::pending::{PendingResponses, request_key},
    door::mcp::{Gateway, PosternMcp},
};
use rmcp::{
    RoleServer, ServiceExt,
    model::{ErrorCode, ErrorData, NumberOrString},
    service::{RxJsonRpcMessage, TxJsonRpcMessage},
    transport::Transport,
};
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::{
    future::Future,
    path::{Path, PathBuf},
    sync::Arc,
};
use tokio::{
    io::{AsyncBufReadExt, AsyncWriteExt, BufReader},
    net::{
        UnixListener, UnixStream,
        unix::{OwnedReadHalf, OwnedWriteHalf},
    },
};

/// Default cap on one incoming message.
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 4 * 1024 * 1024;

pub use crate::delivery::head::{BRIDGE_HELLO_METHOD, DELIVERED_METHOD};

/// The line `postern mcp` sends before anything of the agent's.
pub fn bridge_hello_line() -> Vec<u8> {
    let mut line = serde_json::to_vec(&serde_json::json!({
        "jsonrpc": "2.0", "method": BRIDGE_HELLO_METHOD, "params": { "version": 1, "acknowledges": true }
    }))
    .unwrap_or_default();
    line.push(b'\n');
    line
}

/// Does `line` (from the agent, on its way to the gateway) use one of the bridge's own methods?
/// Only the bridge may speak for delivery: it drops such lines instead of relaying them. The
/// line is read as the gateway reads it (a JSON value: escapes decoded, the last of a repeated
/// member kept), so no spelling of the method gets past; only a line with neither `postern` nor
/// an escape in its bytes is passed without parsing.
pub fn is_bridge_notification(line: &[u8]) -> bool {
    if memchr::memmem::find(line, b"postern").is_none() && memchr::memchr(b'\\', line).is_none() {
        return false;
    }
    serde_json::from_slice::<Value>(line).is_ok_and(|v| {
        v.get("method")
            .and_then(Value::as_str)
            .is_some_and(|m| m.starts_with(crate::delivery::head::BRIDGE_METHOD_PREFIX))
    })
}

/// The acknowledgement the bridge sends after relaying `relayed`, if that line is a JSON-RPC
/// response (a result or an error with an id); `None` for requests, notifications and anything
/// unparsable (nothing to acknowledge).
pub fn delivered_ack_line(relayed: &[u8]) -> Option<Vec<u8>> {
    #[derive(serde::Deserialize)]
    struct Head {
        id: Option<Value>,
        method: Option<serde::de::IgnoredAny>,
        result: Option<serde::de::IgnoredAny>,
        error: Option<serde::de::IgnoredAny>,
    }
    let head: Head = serde_json::from_slice(relayed).ok()?;
    let id = head.id.filter(|id| id.is_string() || id.is_number())?;
    if head.method.is_some() || (head.result.is_none() && head.error.is_none()) {
        return None;
    }
    let mut line = serde_json::to_vec(
        &serde_json::json!({ "jsonrpc": "2.0", "method": DELIVERED_METHOD, "params": { "id": id } }),
    )
    .ok()?;
    line.push(b'\n');
    Some(line)
}

#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    #[error("the runtime directory {path} is unsafe: {problem}")]
    UnsafeDirectory { path: PathBuf, problem: String },
    #[error("cannot prepare the gateway socket {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
}

impl postern_core::ErrorCode for SocketError {
    fn code(&self) -> &'static str {
        match self {
            SocketError::UnsafeDirectory { .. } => "unsafe_runtime_dir",
            SocketError::Io { .. } => "socket_unavailable",
        }
    }
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> SocketError + '_ {
    move |source| SocketError::Io { path: path.to_owned(), source }
}

/// `$XDG_RUNTIME_DIR/postern/<data-dir digest>/`, or `/tmp/postern-<uid>/…` without one. One
/// directory per data directory, so two installations never share a socket.
pub fn runtime_dir(data_dir: &Path) -> PathBuf {
    let base = match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir).join("postern"),
        _ => {
            let uid = crate::caller::identity::current_uid().unwrap_or(u32::MAX);
            std::env::temp_dir().join(format!("postern-{uid}"))
        }
    };
    let canonical = std::fs::canonicalize(data_dir).unwrap_or_else(|_| data_dir.to_owned());
    let digest = hex::encode(Sha256::digest(canonical.as_os_str().as_encoded_bytes()));
    base.join(&digest[..16])
}

pub fn socket_path(data_dir: &Path) -> PathBuf {
    runtime_dir(data_dir).join("mcp.sock")
}

/// What a tool call through the running gateway answered: the structured outcome agents get
/// (`execution_id`, `state`, `result`, `detail`, …), whether it is an error, and its text.
#[derive(Debug, Clone)]
pub struct SocketCallAnswer {
    pub structured: Value,
    pub is_error: bool,
    pub text: String,
}

/// Calls one tool through the running gateway's MCP socket as an MCP client named `client`
/// (`postern call` beside a gateway): the gateway identifies this process like any agent, and
/// the ladder, the journal and retry matching apply unchanged. A JSON-RPC error (an unknown
/// tool, invalid arguments) comes back as `Err` with its message.
pub async fn call_through(
    data_dir: &Path,
    client: &str,
    tool: &str,
    arguments: serde_json::Map<String, Value>,
) -> Result<SocketCallAnswer, String> {
    let stream = UnixStream::connect(socket_path(data_dir))
        .await
        .map_err(|e| format!("cannot reach the running gateway's socket {}: {e}", socket_path(data_dir).display()))?;
    let (read, write) = stream.into_split();
    let mut config = rmcp::model::ClientConfig::default();
    config.client_info = rmcp::model::Implementation::new(client, env!("CARGO_PKG_VERSION"));
    let service =
        config.serve((read, write)).await.map_err(|e| format!("the gateway did not accept the session: {e}"))?;
    let params = rmcp::model::CallToolRequestParams::new(tool.to_owned()).with_arguments(arguments);
    let called = service.peer().call_tool(params).await;
    let _ = service.cancel().await;
    let result = called.map_err(|e| match e {
        rmcp::ServiceError::McpError(e) => e.message.to_string(),
        other => other.to_string(),
    })?;
    let text = result.content.iter().filter_map(|c| c.as_text().map(|t| t.text.clone())).collect::<Vec<_>>().join("\n");
    Ok(SocketCallAnswer {
        structured: result.structured_content.unwrap_or(Value::Null),
        is_error: result.is_error == Some(true),
        text,
    })
}

/// Creates (or checks) `dir` and its parent as 0700 directories owned by this user.
fn prepare_dir(dir: &Path) -> Result<(), SocketError> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    let me = crate::caller::identity::current_uid().map_err(io(dir))?;
    for d in [dir.parent().unwrap_or(dir), dir] {
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(d).map_err(io(d))?;
        let meta = std::fs::symlink_metadata(d).map_err(io(d))?;
        if !meta.is_dir() || meta.uid() != me {
            return Err(SocketError::UnsafeDirectory {
                path: d.to_owned(),
                problem: "not a directory owned by this user".into(),
            });
        }
        if meta.mode() & 0o077 != 0 {
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o700)).map_err(io(d))?;
        }
    }
    Ok(())
}

/// Binds the gateway socket. The caller holds the journal's exclusive lock, so a socket file
/// already there is a leftover of a gateway that died, and is replaced.
pub fn bind(data_dir: &Path) -> Result<(UnixListener, PathBuf), SocketError> {
    bind_at(&socket_path(data_dir))
}

/// Binds a 0600 socket at `path` inside a 0700 directory owned by this user.
pub fn bind_at(path: &Path) -> Result<(UnixListener, PathBuf), SocketError> {
    use std::os::unix::fs::PermissionsExt;
    prepare_dir(path.parent().unwrap_or(path))?;
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io(path)(e)),
    }
    let listener = UnixListener::bind(path).map_err(io(path))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(io(path))?;
    Ok((listener, path.to_owned()))
}

/// Who is behind a socket connection: the agent above the bridge process (skipping shells),
/// or the connecting process itself when nothing sits above it.
pub async fn identify(gateway: &Gateway, stream: &UnixStream) -> Caller {
    let pid = stream.peer_cred().ok().and_then(|c| c.pid()).and_then(|p| u32::try_from(p).ok());
    let hashes = Arc::clone(&gateway.hashes);
    let process = match pid {
        Some(pid) => tokio::task::spawn_blocking(move || hashes.agent_above(pid).or_else(|| hashes.describe(pid)))
            .await
            .ok()
            .flatten(),
        None => None,
    };
    Caller { transport: RunTransport::Stdio, agent: None, process }
}

/// Serves connections until `shutdown` resolves.
pub async fn serve(
    gateway: Arc<Gateway>,
    listener: UnixListener,
    max_message_bytes: usize,
    shutdown: impl Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let gateway = Arc::clone(&gateway);
                    tokio::spawn(async move { connection(gateway, stream, max_message_bytes).await });
                }
                Err(e) => {
                    tracing::error!(error = %e, "accept on the gateway socket failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            }
        }
    }
}

async fn connection(gateway: Arc<Gateway>, stream: UnixStream, max_message_bytes: usize) {
    let caller = identify(&gateway, &stream).await;
    tracing::info!(
        pid = caller.process.as_ref().map(|p| p.key.pid),
        actor = caller.actor().as_str(),
        "bridge connected"
    );
    let pending = Arc::new(PendingResponses::default());
    // Once the peer says it is a bridge, its agent counts as one for the control socket, from
    // before its first call to the end of the connection.
    let bridged: Arc<std::sync::Mutex<Option<crate::caller::runs::BridgedProcess>>> = Arc::default();
    let on_hello: Option<Box<dyn FnOnce() + Send>> = caller.process.as_ref().map(|p| {
        let (runs, key, slot) = (Arc::clone(&gateway.runs), p.key.clone(), Arc::clone(&bridged));
        Box::new(move || {
            if let Ok(mut slot) = slot.lock() {
                *slot = Some(runs.bridge_connected(key));
            }
        }) as Box<dyn FnOnce() + Send>
    });
    let (read, write) = stream.into_split();
    let write = Arc::new(tokio::sync::Mutex::new(Some(write)));
    let flooded = {
        // Budgeted to the agent the kernel found above the bridge, not to the bridge's binary
        // (which every bridge shares).
        let mut peer = crate::door::refusal::local_peer(caller.process.as_ref().map(|p| p.key.pid));
        if let Some(fields) = peer.as_object_mut() {
            fields.insert("actor".into(), caller.actor().as_str().into());
        }
        let refusals = Arc::clone(&gateway.refusals);
        move || {
            let refused = crate::door::refusal::Refused {
                interface: "mcp:stdio",
                attempted: format!("more than {MAX_QUEUED_REJECTIONS} bad lines unread: connection closed"),
                peer,
            };
            tokio::spawn(async move { refusals.record_async(refused).await });
        }
    };
    let transport = LineTransport {
        read: BufReader::new(read),
        rejections: rejection_writer(Arc::clone(&write)),
        write,
        pending: Arc::clone(&pending),
        max: max_message_bytes,
        line: Vec::new(),
        seen: 0,
        flooded: Some(Box::new(flooded)),
        on_hello: std::sync::Mutex::new(on_hello),
    };
    let handler = PosternMcp::for_connection(gateway, caller, Arc::clone(&pending));
    match handler.serve(transport).await {
        Ok(running) => {
            let _ = running.waiting().await;
        }
        Err(e) => tracing::info!(error = %e, "bridge connection ended before initialization"),
    }
    pending.close();
    drop(bridged);
}

/// Newline-delimited JSON-RPC over one socket connection, with delivery tracking: a response
/// settles its [`crate::delivery::DeliveryTicket`] with whether the write succeeded.
struct LineTransport {
    read: BufReader<OwnedReadHalf>,
    write: Arc<tokio::sync::Mutex<Option<OwnedWriteHalf>>>,
    /// Answers to bad input, written in order by one task per connection (bounded: a peer that
    /// sends bad lines without reading the answers is disconnected, not given a task per line).
    rejections: tokio::sync::mpsc::Sender<Rejection>,
    pending: Arc<PendingResponses>,
    max: usize,
    /// The line being read (kept across cancelled reads) and its length so far.
    line: Vec<u8>,
    seen: usize,
    /// Journals (once) that this connection was closed for flooding bad input.
    flooded: Option<Box<dyn FnOnce() + Send>>,
    /// Marks the peer's agent as bridged (once), when the bridge says hello.
    on_hello: std::sync::Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

/// Answers to bad input a connection may owe at once before it is closed for not reading them.
pub const MAX_QUEUED_REJECTIONS: usize = 64;

/// The one task that writes a connection's answers to bad input, in order; ends with the
/// connection.
fn rejection_writer(write: Arc<tokio::sync::Mutex<Option<OwnedWriteHalf>>>) -> tokio::sync::mpsc::Sender<Rejection> {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Rejection>(MAX_QUEUED_REJECTIONS);
    tokio::spawn(async move {
        while let Some(r) = rx.recv().await {
            let error = TxJsonRpcMessage::<RoleServer>::error(ErrorData::new(r.code, r.message, Some(r.data)), r.id);
            if let Err(e) = write_line(&write, &error).await {
                tracing::debug!(error = %e, "could not send an error response");
                return;
            }
        }
    });
    tx
}

impl Drop for LineTransport {
    fn drop(&mut self) {
        self.pending.close();
    }
}

enum Line {
    Complete,
    Oversize(usize),
    Eof,
}

fn response_key(message: &TxJsonRpcMessage<RoleServer>) -> Option<String> {
    match message {
        rmcp::model::JsonRpcMessage::Response(r) => Some(request_key(&r.id)),
        rmcp::model::JsonRpcMessage::Error(e) => e.id.as_ref().map(request_key),
        _ => None,
    }
}

async fn write_line(
    write: &tokio::sync::Mutex<Option<OwnedWriteHalf>>,
    message: &TxJsonRpcMessage<RoleServer>,
) -> std::io::Result<()> {
    let mut bytes = serde_json::to_vec(message).map_err(std::io::Error::other)?;
    bytes.push(b'\n');
    let mut guard = write.lock().await;
    let w = guard.as_mut().ok_or_else(|| std::io::Error::new(std::io::ErrorKind::NotConnected, "closed"))?;
    w.write_all(&bytes).await?;
    w.flush().await
}

/// A JSON-RPC error to send back without a request to answer (bad input).
struct Rejection {
    code: ErrorCode,
    message: String,
    id: Option<NumberOrString>,
    data: Value,
}

impl LineTransport {
    /// Reads one line into `self.line`, refusing (and skipping) one longer than `self.max`.
    ///
    /// Cancel-safe: rmcp polls `receive` inside a `select!` and drops it whenever a response is
    /// ready to go out, so every byte taken from the reader is kept in `self.line` /
    /// `self.seen` (never in locals) until a whole line has been returned.
    async fn read_line(&mut self) -> std::io::Result<Line> {
        loop {
            let buf = self.read.fill_buf().await?;
            if buf.is_empty() {
                let seen = std::mem::take(&mut self.seen);
                return Ok(if seen == 0 {
                    Line::Eof
                } else if seen > self.max {
                    self.line.clear();
                    Line::Oversize(seen)
                } else {
                    Line::Complete
                });
            }
            let (chunk, done) = match memchr::memchr(b'\n', buf) {
                Some(i) => (&buf[..i], Some(i + 1)),
                None => (buf, None),
            };
            self.seen += chunk.len();
            if self.seen <= self.max {
                self.line.extend_from_slice(chunk);
            } else {
                self.line.clear();
            }
            let used = done.unwrap_or(buf.len());
            self.read.consume(used);
            if done.is_some() {
                let seen = std::mem::take(&mut self.seen);
                return Ok(if seen > self.max { Line::Oversize(seen) } else { Line::Complete });
            }
        }
    }

    /// Answers bad input through the connection's rejection writer (a task of its own: the
    /// write must not be cut off half-way when `receive` is cancelled, or the stream would carry
    /// a torn line). `false` if the peer already owes [`MAX_QUEUED_REJECTIONS`] unread answers:
    /// the connection is then closed, and that is journaled once.
    fn reject(&mut self, r: Rejection) -> bool {
        if self.rejections.try_send(r).is_ok() {
            return true;
        }
        tracing::warn!("a bridge connection sent bad input faster than it reads the answers; closing it");
        if let Some(journal) = self.flooded.take() {
            journal();
        }
        false
    }

    /// Parses the line read into a message, or says what to answer instead (`Ok(None)`: a
    /// blank line, or a bridge notification the transport consumed).
    fn parse(&self) -> Result<Option<RxJsonRpcMessage<RoleServer>>, Rejection> {
        let text = self.line.strip_suffix(b"\r").unwrap_or(&self.line);
        if text.iter().all(u8::is_ascii_whitespace) {
            return Ok(None);
        }
        let value: Value = serde_json::from_slice(text).map_err(|e| Rejection {
            code: ErrorCode::PARSE_ERROR,
            message: format!("the message is not valid JSON: {e}"),
            id: None,
            data: serde_json::json!({ "code": "invalid_json", "line": e.line(), "column": e.column() }),
        })?;
        // The id to answer a refusal with, if it is one (a refused message has no head).
        let refused_id = value.get("id").and_then(|id| serde_json::from_value::<NumberOrString>(id.clone()).ok());
        if value.is_array() {
            return Err(Rejection {
                code: ErrorCode::INVALID_REQUEST,
                message: "JSON-RPC batches are not supported by MCP".into(),
                id: None,
                data: serde_json::json!({ "code": "batch_not_supported" }),
            });
        }
        if let Some(params) = value.get("params")
            && !params.is_object()
        {
            return Err(Rejection {
                code: ErrorCode::INVALID_PARAMS,
                message: "params must be a JSON object".into(),
                id: refused_id,
                data: serde_json::json!({ "code": "params_not_object" }),
            });
        }
        let shown_id = value["id"].clone();
        let message = serde_json::from_value::<RxJsonRpcMessage<RoleServer>>(value).map_err(|e| Rejection {
            code: ErrorCode::INVALID_REQUEST,
            message: format!("not a valid JSON-RPC 2.0 message: {e}"),
            id: refused_id.clone(),
            data: serde_json::json!({ "code": "invalid_request" }),
        })?;
        // Delivery reads the message as rmcp parsed it (what the handler will run).
        let head = MessageHead::of(&message);
        // The bridge's own notifications are the transport's business, never the MCP handler's.
        if head.is_bridge_hello() {
            self.pending.expect_acknowledgements();
            if let Some(hello) = self.on_hello.lock().ok().and_then(|mut h| h.take()) {
                hello();
            }
            return Ok(None);
        }
        if let Some(acked) = head.acknowledgement() {
            if let Some(acked) = acked {
                self.pending.acknowledged(&request_key(acked));
            }
            return Ok(None);
        }
        let id = head.id().cloned();
        // One request per id at a time: answers and acknowledgements name a request by its id.
        // (Checked last, so a request refused for anything else leaves no id in use behind.)
        if let (Some(method), Some(request)) = (head.method(), &id)
            && !self.pending.request_arrived(&request_key(request))
        {
            return Err(Rejection {
                code: ErrorCode::INVALID_REQUEST,
                message: format!(
                    "request id {shown_id} is still in use on this connection (its answer is not yet delivered): \
                     give every request an id of its own; this {method} was not run"
                ),
                id: None,
                data: serde_json::json!({ "code": "request_id_in_use", "id": shown_id }),
            });
        }
        // What delivery needs to know of the agent's messages: which tool a call names (a call of
        // another tool is the agent carrying on), and which request a cancellation withdraws.
        if let (Some(tool), Some(request)) = (head.tool(), &id) {
            self.pending.tool_called(request_key(request), tool);
        }
        if let Some(withdrawn) = head.withdrawn() {
            self.pending.cancelled(&request_key(withdrawn));
        }
        Ok(Some(message))
    }
}

impl Transport<RoleServer> for LineTransport {
    type Error = std::io::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleServer>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        let write = Arc::clone(&self.write);
        let pending = Arc::clone(&self.pending);
        let ticket = response_key(&item).and_then(|key| Some((self.pending.take(&key)?, key)));
        async move {
            let written = write_line(&write, &item).await;
            match (ticket, &written) {
                // Written to a bridge: its acknowledgement (or the connection's end) settles it.
                (Some(((_, true), _)), Ok(())) => {}
                // Written to a peer that does not acknowledge: the bytes are in a socket buffer,
                // which proves nothing about the agent. Uncertain resolves to not delivered.
                (Some(((ticket, false), _)), Ok(())) => ticket.settle(false),
                (Some(((ticket, _), key)), Err(_)) => pending.write_failed(&key, &ticket),
                (None, _) => {}
            }
            written
        }
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleServer>> {
        loop {
            match self.read_line().await {
                Ok(Line::Eof) | Err(_) => return None,
                Ok(Line::Oversize(size)) => {
                    let rejection = Rejection {
                        code: ErrorCode::INVALID_REQUEST,
                        message: format!(
                            "message of {size} bytes exceeds the gateway's limit of {} bytes (postern serve \
                             --max-message-bytes)",
                            self.max
                        ),
                        id: None,
                        data: serde_json::json!({ "code": "message_too_large", "bytes": size, "limit": self.max }),
                    };
                    if !self.reject(rejection) {
                        return None;
                    }
                }
                Ok(Line::Complete) => {
                    let parsed = self.parse();
                    self.line.clear();
                    match parsed {
                        Ok(Some(message)) => return Some(message),
                        Ok(None) => {}
                        Err(rejection) => {
                            if !self.reject(rejection) {
                                return None;
                            }
                        }
                    }
                }
            }
        }
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        self.pending.close();
        if let Some(mut w) = self.write.lock().await.take() {
            let _ = w.shutdown().await;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ack_id(line: &[u8]) -> Option<Value> {
        let ack: Value = serde_json::from_slice(&delivered_ack_line(line)?).ok()?;
        assert_eq!(ack["method"], DELIVERED_METHOD);
        Some(ack["params"]["id"].clone())
    }

    #[test]
    fn only_responses_with_an_id_are_acknowledged() {
        assert_eq!(ack_id(br#"{"jsonrpc":"2.0","id":7,"result":{}}"#), Some(serde_json::json!(7)));
        assert_eq!(ack_id(br#"{"jsonrpc":"2.0","id":"a\"b","error":{"code":1,"message":"x"}}"#), Some("a\"b".into()));
        // requests and notifications from the gateway, and anything else, are not answers
        assert_eq!(ack_id(br#"{"jsonrpc":"2.0","id":7,"method":"ping"}"#), None);
        assert_eq!(ack_id(br#"{"jsonrpc":"2.0","method":"notifications/message","params":{}}"#), None);
        assert_eq!(ack_id(br#"{"jsonrpc":"2.0","id":null,"result":{}}"#), None);
        assert_eq!(ack_id(br#"{"jsonrpc":"2.0","id":{"x":1},"result":{}}"#), None);
        assert_eq!(ack_id(br#"{"jsonrpc":"2.0","id":7}"#), None);
        assert_eq!(ack_id(b"not json"), None);
    }

    #[test]
    fn an_agent_cannot_speak_for_the_bridge() {
        assert!(is_bridge_notification(&bridge_hello_line()));
        let ack = delivered_ack_line(br#"{"jsonrpc":"2.0","id":1,"result":{}}"#).unwrap();
        assert!(is_bridge_notification(&ack));
        // a tool argument that merely mentions the method is the agent's business
        let call = br#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"x","arguments":{"m":"notifications/postern/delivered"}}}"#;
        assert!(!is_bridge_notification(call));
        // Spellings the gateway reads as the bridge's method (an attacker review's finding):
        // escaped slashes or letters, and the method repeated with the bridge's last.
        for forged in [
            br#"{"jsonrpc":"2.0","method":"notifications\/postern\/delivered","params":{"id":1}}"#.as_slice(),
            br#"{"jsonrpc":"2.0","method":"notifications/\u0070ostern/delivered","params":{"id":1}}"#,
            br#"{"jsonrpc":"2.0","method":"x","method":"notifications/postern/delivered","params":{"id":1}}"#,
            br#"{"jsonrpc":"2.0","method":"notifications/postern/anything"}"#,
        ] {
            assert!(is_bridge_notification(forged), "{}", String::from_utf8_lossy(forged));
        }
    }

    proptest! {
        /// Whatever the gateway sends (hostile upstream text inside results included: quotes,
        /// escapes, control characters, deep nesting), the bridge acknowledges exactly the
        /// responses, with their own id, and never panics.
        #[test]
        fn acknowledgements_carry_the_response_id(
            id in prop_oneof![any::<i64>().prop_map(Value::from), ".*".prop_map(Value::from)],
            text in ".*",
            depth in 0usize..64,
            is_error in any::<bool>(),
        ) {
            let mut nested = Value::String(text.clone());
            for _ in 0..depth {
                nested = serde_json::json!({ "v": [nested] });
            }
            let body = if is_error { "error" } else { "result" };
            let line = serde_json::to_vec(&serde_json::json!({ "jsonrpc": "2.0", "id": id, body: { "content": nested } })).unwrap();
            prop_assert_eq!(ack_id(&line), Some(id));
            let request = serde_json::to_vec(&serde_json::json!({ "jsonrpc": "2.0", "id": 1, "method": text, "params": {} })).unwrap();
            prop_assert_eq!(ack_id(&request), None);
        }

        #[test]
        fn arbitrary_bytes_are_never_acknowledged_and_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = is_bridge_notification(&bytes);
            if serde_json::from_slice::<Value>(&bytes).is_err() {
                prop_assert!(delivered_ack_line(&bytes).is_none());
            }
        }
    }
}

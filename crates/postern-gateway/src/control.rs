//! The control socket: while a gateway holds the journal, the CLI's write commands that make
//! sense against a live gateway go through it instead of opening the journal themselves.
//!
//! Deliberately small: it can add an agent (the CLI sends only the token's hash), revoke one,
//! revoke an agent run, lock the vault, and say how the upstream MCP servers are doing. Nothing here can grant, unlock or approve: the
//! socket is reachable by any process of this user, agents included (see the README's security
//! notes).

use crate::{
    refusal::{Refusals, Refused, local_peer},
    socket::SocketError,
};
use postern_store::Store;
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::{
    path::{Path, PathBuf},
    sync::Arc,
};
use tokio::{
    io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader},
    net::{UnixListener, UnixStream},
};

/// One control request.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op")]
pub enum ControlRequest {
    #[serde(rename = "agents.add")]
    AddAgent { name: String, token_sha256: String },
    #[serde(rename = "agents.revoke")]
    RevokeAgent { name: String },
    #[serde(rename = "vault.lock")]
    LockVault { by: String },
    #[serde(rename = "sessions.revoke")]
    RevokeSession { id: postern_core::SessionId },
    /// Read-only: each upstream MCP server's state (running, stopped, crashed) as the gateway sees it.
    #[serde(rename = "servers.status")]
    ServersStatus,
    /// Stops an upstream MCP server and starts it again.
    #[serde(rename = "servers.restart")]
    RestartServer { name: String },
}

/// The operations the control socket offers, by their `op` tag. [`ControlRequest::op`] maps
/// every request to one (an exhaustive match: a new request cannot be left out), and a test
/// checks that the tags agree.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ControlOp {
    #[serde(rename = "agents.add")]
    AddAgent,
    #[serde(rename = "agents.revoke")]
    RevokeAgent,
    #[serde(rename = "vault.lock")]
    LockVault,
    #[serde(rename = "sessions.revoke")]
    RevokeSession,
    #[serde(rename = "servers.status")]
    ServersStatus,
    #[serde(rename = "servers.restart")]
    RestartServer,
}

impl ControlOp {
    /// Whether `op` names an operation the socket offers.
    pub fn offered(op: &str) -> bool {
        serde_json::from_value::<ControlOp>(serde_json::Value::String(op.to_owned())).is_ok()
    }
}

impl ControlRequest {
    pub fn op(&self) -> ControlOp {
        match self {
            ControlRequest::AddAgent { .. } => ControlOp::AddAgent,
            ControlRequest::RevokeAgent { .. } => ControlOp::RevokeAgent,
            ControlRequest::LockVault { .. } => ControlOp::LockVault,
            ControlRequest::RevokeSession { .. } => ControlOp::RevokeSession,
            ControlRequest::ServersStatus => ControlOp::ServersStatus,
            ControlRequest::RestartServer { .. } => ControlOp::RestartServer,
        }
    }
}

/// Why a control request was not carried out, for the caller to act on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ControlCode {
    /// Not something the socket offers (approvals, unlocking, grants): journaled.
    NotOffered,
    /// Not a well-formed request.
    InvalidRequest,
    UnknownAgent,
    DuplicateAgent,
    UnknownSession,
    SessionRevoked,
    /// The journal cannot take the write (disk full, I/O error, read-only).
    JournalUnwritable,
    /// Anything else; the message says what.
    Failed,
}

impl ControlCode {
    fn of(e: &postern_store::StoreError) -> ControlCode {
        use postern_store::StoreError as E;
        match e {
            E::UnknownAgent(_) => ControlCode::UnknownAgent,
            E::DuplicateAgent(_) => ControlCode::DuplicateAgent,
            E::UnknownSession(_) => ControlCode::UnknownSession,
            E::SessionRevoked(_) => ControlCode::SessionRevoked,
            e if e.is_unwritable() => ControlCode::JournalUnwritable,
            _ => ControlCode::Failed,
        }
    }
}

/// The answer: done, or refused with a code and a message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum ControlReply {
    Done,
    Refused {
        code: ControlCode,
        message: String,
    },
    /// The answer to `servers.status`.
    Servers {
        servers: Vec<crate::upstream::ServerStatus>,
    },
}

pub fn control_path(data_dir: &Path) -> PathBuf {
    crate::socket::runtime_dir(data_dir).join("control.sock")
}

/// Binds the control socket (0600) next to the MCP socket.
pub fn bind(data_dir: &Path) -> Result<(UnixListener, PathBuf), SocketError> {
    crate::socket::bind_at(&control_path(data_dir))
}

/// Carries out `request` on `store` (what the socket does for a caller, and what a command does
/// itself when no gateway holds the journal).
pub fn apply(store: &Store, request: ControlRequest, now: postern_core::Timestamp) -> ControlReply {
    let done = match request {
        ControlRequest::AddAgent { name, token_sha256 } => store.add_agent(&name, &token_sha256, now).map(|_| ()),
        ControlRequest::RevokeAgent { name } => store.revoke_agent(&name, now).map(|_| ()),
        ControlRequest::LockVault { by } => store.set_locked(true, json!({ "by": by }), now).map(|_| ()),
        ControlRequest::RevokeSession { id } => {
            store.set_session_standing(id, false, "cli", json!({}), now).map(|_| ())
        }
        // Without a gateway nothing runs: every server is stopped (the caller lists them).
        ControlRequest::ServersStatus => return ControlReply::Servers { servers: vec![] },
        ControlRequest::RestartServer { .. } => {
            return ControlReply::Refused {
                code: ControlCode::Failed,
                message: "no gateway is running: its upstream servers start with `postern serve` (or the app)".into(),
            };
        }
    };
    match done {
        Ok(()) => ControlReply::Done,
        Err(e) => ControlReply::Refused { code: ControlCode::of(&e), message: e.to_string() },
    }
}

/// Serves control requests until `shutdown` resolves. Anything else asked of it — an unlock, an
/// approval, a session grant — is refused and journaled (see [`crate::refusal`]).
pub async fn serve(
    store: Arc<Store>,
    clock: crate::engine::Clock,
    refusals: Arc<Refusals>,
    upstreams: Option<Arc<crate::upstream::Upstreams>>,
    listener: UnixListener,
    shutdown: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            _ = &mut shutdown => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(_) => continue,
            },
        };
        let (store, clock, refusals) = (Arc::clone(&store), Arc::clone(&clock), Arc::clone(&refusals));
        let upstreams = upstreams.clone();
        let peer = local_peer(stream.peer_cred().ok().and_then(|c| c.pid()).and_then(|p| u32::try_from(p).ok()));
        tokio::spawn(async move {
            let (read, mut write) = stream.into_split();
            let mut lines = BufReader::new(read).take(64 * 1024).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let reply = match serde_json::from_str::<ControlRequest>(&line) {
                    Ok(ControlRequest::ServersStatus) => ControlReply::Servers {
                        servers: match &upstreams {
                            Some(u) => u.status().await,
                            None => vec![],
                        },
                    },
                    Ok(ControlRequest::RestartServer { name }) => match &upstreams {
                        Some(u) => match u.restart(&name).await {
                            Ok(status) => ControlReply::Servers { servers: vec![status] },
                            Err(e) => ControlReply::Refused { code: ControlCode::Failed, message: e.to_string() },
                        },
                        None => ControlReply::Refused {
                            code: ControlCode::Failed,
                            message: "this gateway runs no upstream servers".into(),
                        },
                    },
                    Ok(request) => {
                        let store = Arc::clone(&store);
                        let now = clock();
                        tokio::task::spawn_blocking(move || apply(&store, request, now)).await.unwrap_or_else(|e| {
                            ControlReply::Refused { code: ControlCode::Failed, message: e.to_string() }
                        })
                    }
                    Err(e) => {
                        let op = serde_json::from_str::<serde_json::Value>(&line)
                            .ok()
                            .and_then(|v| v.get("op").and_then(|op| op.as_str()).map(str::to_owned));
                        let attempted = op.clone().unwrap_or_else(|| "(not a control request)".into());
                        let refused = Refused { interface: "control_socket", attempted, peer: peer.clone() };
                        refusals.record_async(refused).await;
                        match op {
                            Some(op) if !ControlOp::offered(&op) => ControlReply::Refused {
                                code: ControlCode::NotOffered,
                                message: format!(
                                    "{op:?} is not offered over the control socket: any process of this user can \
                                     reach it, so it can only add or revoke agents, revoke agent runs and lock the \
                                     vault. Approvals, unlocking and session grants are answered in the approver \
                                     (the desktop app, or `postern serve --approver terminal`). This attempt was \
                                     journaled."
                                ),
                            },
                            _ => ControlReply::Refused {
                                code: ControlCode::InvalidRequest,
                                message: format!("not a control request: {e}"),
                            },
                        }
                    }
                };
                let mut bytes = serde_json::to_vec(&reply).unwrap_or_default();
                bytes.push(b'\n');
                if write.write_all(&bytes).await.is_err() {
                    return;
                }
            }
        });
    }
}

/// The client side: sends one request to the gateway serving `data_dir`.
pub async fn request(data_dir: &Path, request: &ControlRequest) -> std::io::Result<ControlReply> {
    request_line(data_dir, serde_json::to_vec(request).map_err(std::io::Error::other)?).await
}

/// Sends one raw line (e.g. an operation the socket does not offer, so the gateway journals the
/// attempt and says where to do it instead).
pub async fn request_line(data_dir: &Path, mut line: Vec<u8>) -> std::io::Result<ControlReply> {
    let stream = UnixStream::connect(control_path(data_dir)).await?;
    let (read, mut write) = stream.into_split();
    line.push(b'\n');
    write.write_all(&line).await?;
    let mut answer = String::new();
    BufReader::new(read).read_line(&mut answer).await?;
    serde_json::from_str(&answer).map_err(std::io::Error::other)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each request's `op` tag is the tag of its [`ControlOp`], so the offered list cannot drift
    /// from the requests the socket understands.
    #[test]
    fn every_request_is_offered_under_its_own_tag() {
        let session: postern_core::SessionId = "ses_01ARZ3NDEKTSV4RRFFQ69G5FAV".parse().unwrap();
        for request in [
            ControlRequest::AddAgent { name: "a".into(), token_sha256: "00".into() },
            ControlRequest::RevokeAgent { name: "a".into() },
            ControlRequest::LockVault { by: "cli".into() },
            ControlRequest::RevokeSession { id: session },
        ] {
            let tag = serde_json::to_value(&request).unwrap()["op"].clone();
            assert_eq!(tag, serde_json::to_value(request.op()).unwrap());
            assert!(ControlOp::offered(tag.as_str().unwrap()));
        }
        for not in ["vault.unlock", "approvals.grant", "sessions.authorize", ""] {
            assert!(!ControlOp::offered(not), "{not}");
        }
        // A malformed id is refused by the request's type, not passed along as text.
        assert!(serde_json::from_str::<ControlRequest>(r#"{"op":"sessions.revoke","id":"nope"}"#).is_err());
    }
}

//! The control socket: while a gateway holds the journal, the CLI's write commands that make
//! sense against a live gateway go through it instead of opening the journal themselves.
//!
//! Deliberately small: it can add an agent (the CLI sends only the token's hash), revoke one,
//! revoke an agent run, and lock the vault. Nothing here can grant, unlock or approve: the
//! socket is reachable by any process of this user, agents included (see the README's security
//! notes).

use crate::socket::SocketError;
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
    RevokeSession { id: String },
}

/// The answer: `ok`, or a machine-readable code and a message.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ControlReply {
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

pub fn control_path(data_dir: &Path) -> PathBuf {
    crate::socket::runtime_dir(data_dir).join("control.sock")
}

/// Binds the control socket (0600) next to the MCP socket.
pub fn bind(data_dir: &Path) -> Result<(UnixListener, PathBuf), SocketError> {
    crate::socket::bind_at(&control_path(data_dir))
}

fn apply(store: &Store, request: ControlRequest, now: postern_core::Timestamp) -> ControlReply {
    use postern_core::ErrorCode as _;
    let done = match request {
        ControlRequest::AddAgent { name, token_sha256 } => store.add_agent(&name, &token_sha256, now).map(|_| ()),
        ControlRequest::RevokeAgent { name } => store.revoke_agent(&name, now).map(|_| ()),
        ControlRequest::LockVault { by } => store.set_locked(true, json!({ "by": by }), now).map(|_| ()),
        ControlRequest::RevokeSession { id } => match id.parse::<postern_core::SessionId>() {
            Ok(id) => store.set_session_standing(id, false, "cli", json!({}), now).map(|_| ()),
            Err(e) => {
                return ControlReply { ok: false, code: Some("invalid_request".into()), message: Some(e.to_string()) };
            }
        },
    };
    match done {
        Ok(()) => ControlReply { ok: true, code: None, message: None },
        Err(e) => ControlReply { ok: false, code: Some(e.code().into()), message: Some(e.to_string()) },
    }
}

/// Serves control requests until `shutdown` resolves.
pub async fn serve(
    store: Arc<Store>,
    clock: crate::engine::Clock,
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
        let (store, clock) = (Arc::clone(&store), Arc::clone(&clock));
        tokio::spawn(async move {
            let (read, mut write) = stream.into_split();
            let mut lines = BufReader::new(read).take(64 * 1024).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let reply = match serde_json::from_str::<ControlRequest>(&line) {
                    Ok(request) => {
                        let store = Arc::clone(&store);
                        let now = clock();
                        tokio::task::spawn_blocking(move || apply(&store, request, now)).await.unwrap_or_else(|e| {
                            ControlReply {
                                ok: false,
                                code: Some("internal_error".into()),
                                message: Some(e.to_string()),
                            }
                        })
                    }
                    Err(e) => ControlReply {
                        ok: false,
                        code: Some("invalid_request".into()),
                        message: Some(format!("not a control request: {e}")),
                    },
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
    let stream = UnixStream::connect(control_path(data_dir)).await?;
    let (read, mut write) = stream.into_split();
    let mut line = serde_json::to_vec(request).map_err(std::io::Error::other)?;
    line.push(b'\n');
    write.write_all(&line).await?;
    let mut answer = String::new();
    BufReader::new(read).read_line(&mut answer).await?;
    serde_json::from_str(&answer).map_err(std::io::Error::other)
}

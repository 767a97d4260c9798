//! The control socket itself: where it is (beside the MCP socket, 0600), the server loop that
//! reads one request per connection and answers it through [`super::apply`], and the client side
//! the CLI uses.

use crate::{caller::provenance::Provenance, door::refusal::Refused, door::socket::SocketError};
use std::{
    path::{Path, PathBuf},
    sync::Arc,
};
use tokio::{
    io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader},
    net::{UnixListener, UnixStream},
};

use super::*;

pub fn control_path(data_dir: &Path) -> PathBuf {
    crate::door::socket::runtime_dir(data_dir).join("control.sock")
}

/// Binds the control socket (0600) next to the MCP socket.
pub fn bind(data_dir: &Path) -> Result<(UnixListener, PathBuf), SocketError> {
    crate::door::socket::bind_at(&control_path(data_dir))
}

/// Serves control requests until `shutdown` resolves. Anything else asked of it — an unlock, an
/// approval, a session grant — is refused and journaled (see [`crate::door::refusal`]).
pub async fn serve(
    gateway: Arc<crate::door::mcp::Gateway>,
    info: GatewayInfo,
    listener: UnixListener,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let authority = Arc::new(Authority {
        store: Arc::clone(&gateway.store),
        vault: Some(Arc::clone(gateway.engine.vault())),
        upstreams: gateway.engine.upstreams().cloned(),
        gateway: Some(info),
        approver: Some(Arc::clone(gateway.engine.approver())),
        approval_timeout: gateway.engine.approval_timeout(),
        change_question: Authority::one_change_question(),
    });
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            _ = &mut shutdown => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(_) => continue,
            },
        };
        let (authority, clock, refusals) =
            (Arc::clone(&authority), Arc::clone(&gateway.clock), Arc::clone(&gateway.refusals));
        let pid = stream.peer_cred().ok().and_then(|c| c.pid()).and_then(|p| u32::try_from(p).ok());
        let runs = Arc::clone(&gateway.runs);
        let from = Provenance::of(pid, &|key| runs.run_of_process(key));
        let peer = from.detail();
        tokio::spawn(async move {
            let (read, mut write) = stream.into_split();
            let mut lines = BufReader::new(read).take(MAX_REQUEST_BYTES).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                // A request may carry a secret: the line is wiped once parsed (best effort: the
                // reader's own buffer is not, and the parsed secret is a `SecretText`).
                let line = zeroize::Zeroizing::new(line);
                let reply = match serde_json::from_str::<ControlRequest>(&line) {
                    Ok(request) => {
                        let (op, summary) = (request.op(), request.summary());
                        let now = clock();
                        let reply = apply(&authority, request, now, &from).await;
                        if op.changes() && matches!(reply, ControlReply::Done | ControlReply::Answer { .. }) {
                            let store = Arc::clone(&authority.store);
                            let mut detail = summary;
                            detail["peer"] = peer.clone();
                            let _ = blocking(move || store.control_applied(detail, now)).await;
                        }
                        reply
                    }
                    Err(e) => {
                        let op = serde_json::from_str::<serde_json::Value>(&line)
                            .ok()
                            .and_then(|v| v.get("op").and_then(|op| op.as_str()).map(str::to_owned));
                        let attempted = op.clone().unwrap_or_else(|| "(not a control request)".into());
                        let refused = Refused { interface: "control_socket", attempted, peer: peer.clone() };
                        refusals.record_async(refused).await;
                        let unlock = authority.gateway.as_ref().map(|g| g.where_to_unlock.clone()).unwrap_or_default();
                        match op {
                            Some(op) if op == "vault.unlock" => ControlReply::Refused {
                                code: ControlCode::NotOffered,
                                message: format!(
                                    "a running gateway holds the vault, and unlocking is not offered over its control \
                                     socket (any process of this user, an agent included, can reach it): {unlock}. This \
                                     attempt was journaled."
                                ),
                            },
                            Some(op) if !ControlOp::offered(&op) => ControlReply::Refused {
                                code: ControlCode::NotOffered,
                                message: format!(
                                    "{op:?} is not offered over the control socket: any process of this user can \
                                     reach it, so it never grants authority. Approvals, unlocking and session grants \
                                     are answered in the approver ({}). This attempt was journaled.",
                                    authority.gateway.as_ref().map_or("none", |g| g.approver.as_str())
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

/// The most a caller may send on one connection (an SSH private key and its request fit many
/// times over).
const MAX_REQUEST_BYTES: u64 = 256 * 1024;

/// The client side: sends one request to the gateway serving `data_dir`.
pub async fn request(data_dir: &Path, request: &ControlRequest) -> std::io::Result<ControlReply> {
    request_line(data_dir, serde_json::to_vec(request).map_err(std::io::Error::other)?).await
}

/// Sends one raw line (e.g. an operation the socket does not offer, so the gateway journals the
/// attempt and says where to do it instead).
pub async fn request_line(data_dir: &Path, line: Vec<u8>) -> std::io::Result<ControlReply> {
    // The line may carry a secret: wiped when sent (or when sending failed).
    let mut line = zeroize::Zeroizing::new(line);
    let stream = UnixStream::connect(control_path(data_dir)).await?;
    let (read, mut write) = stream.into_split();
    line.push(b'\n');
    write.write_all(&line).await?;
    let mut answer = String::new();
    BufReader::new(read).read_line(&mut answer).await?;
    serde_json::from_str(&answer).map_err(std::io::Error::other)
}

//! The control socket: while a gateway holds the journal, the CLI's commands that change the
//! vault or ask the gateway something go through it instead of opening the journal themselves,
//! with the same outcome as when run alone.
//!
//! It changes the vault's contents (agents, credentials, SSH hosts, MCP servers and their
//! contracts, the lock) and answers questions (status, an upstream's tools, a checkpoint). It
//! never grants authority — no unlock, approval, session grant or allowlist: the socket is
//! reachable by any process of this user, agents included, and those need a person in the
//! approver. Every change made through it is journaled with the peer process that asked and its
//! ancestry (`control_request_applied`), so a change an agent made is told apart from the
//! owner's. A change that weakens safety (which ones: [`ControlRequest::weakening`]) is refused
//! when the asking process descends from an agent Postern knows, and otherwise needs the
//! approver's confirmation when one is attached — one gate, [`apply`], for the socket and for a
//! command that opened the journal itself.

mod protocol;
mod server;
pub use protocol::*;
pub use server::{bind, control_path, request, request_line, serve};

use crate::caller::provenance::Provenance;
use postern_store::Store;
use postern_vault::{Sensitive, ServerStart, ToolOverride, Vault, VaultError};
use serde_json::{Value, json};
use std::sync::Arc;

/// What carries out a request: the journal, the vault (when the request needs it), the upstream
/// servers, and — inside a gateway — what it says about itself and who confirms a change.
#[derive(Debug)]
pub struct Authority {
    pub store: Arc<Store>,
    pub vault: Option<Arc<Vault>>,
    pub upstreams: Option<Arc<postern_engine::channel::upstream::Upstreams>>,
    /// `None` when the command opened the journal itself (no gateway runs).
    pub gateway: Option<GatewayInfo>,
    /// The gateway's approver, which confirms a change that weakens safety (`None`: nobody to ask).
    pub approver: Option<Arc<dyn postern_engine::Approver>>,
    /// How long its person has to answer.
    pub approval_timeout: std::time::Duration,
    /// One change put to the approver's person at a time: held until the approver's thread
    /// returns, so a caller cannot open a dialog (and hold a thread) per request.
    pub change_question: Arc<tokio::sync::Semaphore>,
}

impl Authority {
    /// The place for [`Authority::change_question`]: one.
    pub fn one_change_question() -> Arc<tokio::sync::Semaphore> {
        Arc::new(tokio::sync::Semaphore::new(1))
    }
}

/// How strictly a replay contract holds a tool: the higher, the less an uncertain outcome allows.
fn strictness(class: postern_core::ReplayClass) -> u8 {
    use postern_core::ReplayClass as C;
    match class {
        C::ReadOnly => 0,
        C::Idempotent => 1,
        C::IdempotencyKey => 2,
        C::StatusQuery | C::SshMarker => 3,
        C::Irreversible => 4,
    }
}

/// What a change that weakens safety is: in words, and why it is weaker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Weakening {
    pub change: String,
    pub weakens: String,
    /// Whether the approver's person is asked when it comes from outside an agent run (a record
    /// only an owner's command writes, after the owner agreed to it in the terminal, is not).
    pub ask: bool,
}

impl ControlRequest {
    /// Whether carrying this out weakens safety, given what holds now: a tool's contract made
    /// weaker, its approve-every-use turned off, a secret argument or the idempotency argument
    /// dropped or changed, an MCP server added or its start changed (a command whose tools reach
    /// every agent), an agent token added, a credential, SSH host or server removed, markers
    /// deleted on a host, an import record journaled. The match is exhaustive (a new request is
    /// classified when it is written), and what cannot be compared counts as weaker: the answer
    /// fails closed.
    pub async fn weakening(&self, a: &Authority) -> Option<Weakening> {
        let w = |change: String, weakens: &str| Some(Weakening { change, weakens: weakens.to_owned(), ask: true });
        match self {
            ControlRequest::SetToolContract { server, tool, contract } => {
                let name = format!("{server}{}{tool}", postern_engine::channel::upstream::SEPARATOR);
                let why = contract_weakens(a, server, tool, contract.as_ref()).await;
                if why.is_empty() {
                    return None;
                }
                let change = match contract {
                    None => format!("{name}: the owner's contract cleared"),
                    Some(c) => format!(
                        "{name}: contract set to {}",
                        c.class.map(|c| c.as_str()).unwrap_or("what the tool's annotations suggest")
                    ),
                };
                w(change, &why.join("; "))
            }
            ControlRequest::Remove { name } => {
                w(format!("remove {name:?} (and its secrets)"), "what it protected or named goes with it")
            }
            ControlRequest::AddServer { server, .. } => {
                let loaders = server.loader_variables();
                let mut weakens =
                    "a new program runs with the gateway, and its tools are offered to every agent".to_owned();
                if !loaders.is_empty() {
                    weakens.push_str(&format!("; it sets {}, which change(s) what code it loads", loaders.join(", ")));
                }
                w(format!("add MCP server {:?}: {}", server.name, server.described()), &weakens)
            }
            ControlRequest::SetServerStart { name, start } => w(
                format!("start MCP server {name:?} {}", start.as_str()),
                "when a program runs with the gateway changes",
            ),
            ControlRequest::AddAgent { name, .. } => w(
                format!("add agent {name:?} (a new token)"),
                "a new token can call every tool, whatever was revoked before",
            ),
            ControlRequest::SshGc { host, older_than_days } => w(
                format!("delete marker directories older than {older_than_days} day(s) on SSH host {host:?}"),
                "a marker is how an uncertain command is checked without running it again",
            ),
            ControlRequest::KeepSignIn { name, grant } => {
                // What the person confirming is shown: whose grant, from where, for what.
                let shown = match postern_engine::channel::oauth::Grant::read(&grant.0) {
                    Ok(g) => format!(
                        "issuer {}, client {}, scopes [{}], token endpoint {}",
                        g.issuer().unwrap_or("(none)"),
                        g.credentials.client_id,
                        g.credentials.granted_scopes.join(" "),
                        url::Url::parse(&g.metadata.token_endpoint)
                            .ok()
                            .and_then(|u| u.host_str().map(str::to_owned))
                            .unwrap_or_else(|| "(unreadable)".into())
                    ),
                    Err(_) => "a grant that does not read".into(),
                };
                w(
                    format!("sign MCP server {name:?} in with a new OAuth grant: {shown}"),
                    "its calls go out as whoever signed in, with the scopes they granted",
                )
            }
            ControlRequest::SignOut { name } => Some(Weakening {
                change: format!("sign MCP server {name:?} out (its tokens revoked and forgotten)"),
                weakens: "the owner's sign-in is lost: its calls fail until someone signs in again".to_owned(),
                ask: false,
            }),
            ControlRequest::RecordImport { event, .. } => Some(Weakening {
                change: format!("journal an import record ({})", event.as_str()),
                weakens: "`servers import --undo` trusts the record the journal vouches for".to_owned(),
                ask: false,
            }),
            // Stronger or read-only: a lock, a revocation, a status, a checkpoint. Adding a
            // credential or an SSH host widens nothing an agent could not already call with it.
            ControlRequest::RevokeAgent { .. }
            | ControlRequest::LockVault { .. }
            | ControlRequest::RevokeSession { .. }
            | ControlRequest::ServersStatus
            | ControlRequest::RestartServer { .. }
            | ControlRequest::GatewayStatus
            | ControlRequest::AddCredential { .. }
            | ControlRequest::AddSshHost { .. }
            | ControlRequest::ServerTools { .. }
            | ControlRequest::Checkpoint
            | ControlRequest::PublicKey
            | ControlRequest::RedirectRefused { .. } => None,
        }
    }
}

/// Why setting `server`'s tool `tool` to `next` is weaker than what holds now (empty: it is not).
/// The owner's current override is read from the vault; the effective class is compared when
/// the server runs and lists the tool, and otherwise an override that names no class, or a less
/// strict one, than the current override counts as weaker.
async fn contract_weakens(a: &Authority, server: &str, tool: &str, next: Option<&ToolOverride>) -> Vec<String> {
    let Some(vault) = &a.vault else { return vec!["the current contract could not be read".to_owned()] };
    let current = match vault.mcp_server(server) {
        Ok(s) => s.tools.get(tool).cloned().unwrap_or_default(),
        Err(_) => return vec!["the current contract could not be read".to_owned()],
    };
    let next = next.cloned().unwrap_or_default();
    let mut why = Vec::new();
    let effective = match &a.upstreams {
        Some(u) => {
            u.ensure_started(server).await;
            u.contract_with(server, tool, Some(&current)).zip(u.contract_with(server, tool, Some(&next)))
        }
        None => None,
    };
    match effective {
        Some(((was, approve_was), (will, approve_will))) => {
            if strictness(will.class) < strictness(was.class) {
                why.push(format!(
                    "an uncertain outcome would be {} instead of {}",
                    will.class.as_str(),
                    was.class.as_str()
                ));
            }
            if approve_was && !approve_will {
                why.push("calls would no longer wait for a reviewer".to_owned());
            }
        }
        None => {
            let rank = |o: &ToolOverride| o.class.map(strictness);
            match (rank(&current), rank(&next)) {
                (Some(was), Some(will)) if will >= was => {}
                (None, None) => {}
                (_, Some(will)) if will == strictness(postern_core::ReplayClass::Irreversible) => {}
                _ => why.push(
                    "the owner's class would be dropped or lowered (the tool could not be listed to compare)"
                        .to_owned(),
                ),
            }
            if current.approve_every_use && !next.approve_every_use {
                why.push("calls would no longer wait for a reviewer".to_owned());
            }
        }
    }
    let dropped: Vec<&String> = current.secret_arguments.difference(&next.secret_arguments).collect();
    if !dropped.is_empty() {
        why.push(format!("{dropped:?} would no longer be treated as secret"));
    }
    if current.idempotency_argument.is_some() && current.idempotency_argument != next.idempotency_argument {
        why.push("the execution ID would go into another argument (or none)".to_owned());
    }
    why
}

/// Runs a journal or vault write on the blocking pool (each is a durable SQLite transaction,
/// and a keychain call is a D-Bus round trip).
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Result<T, ControlReply> {
    tokio::task::spawn_blocking(f).await.map_err(|e| ControlReply::refused(ControlCode::Failed, e.to_string()))
}

/// Carries out `request` for the process `from` describes (what the socket does for a caller,
/// and what a command does itself when no gateway holds the journal). A change that weakens
/// safety is refused from inside an agent run and needs the approver's confirmation otherwise;
/// both outcomes are journaled with the ancestry.
pub async fn apply(
    a: &Authority,
    request: ControlRequest,
    now: postern_core::Timestamp,
    from: &Provenance,
) -> ControlReply {
    if let Some(weakening) = request.weakening(a).await {
        let refuse = |code: ControlCode, message: String, decided: &str| {
            let store = Arc::clone(&a.store);
            let detail = json!({
                "interface": "control_socket", "attempted": request.summary(), "peer": from.detail(),
                "change": weakening.change, "weakens": weakening.weakens, "decided": decided,
            });
            (store, detail, ControlReply::Refused { code, message })
        };
        if let Some(run) = &from.agent_run {
            let message = format!(
                "refused: {} weakens safety ({}), and it was asked for by a process inside agent run {run} ({}). \
                 An agent cannot change what Postern holds it to; the owner makes this change from a terminal \
                 outside the agent (or the desktop app). This attempt was journaled.",
                weakening.change,
                weakening.weakens,
                from.lines().first().cloned().unwrap_or_default()
            );
            let (store, detail, reply) = refuse(ControlCode::FromAnAgentRun, message, "refused_from_agent_run");
            let _ = blocking(move || store.refusal(detail, now)).await;
            return reply;
        }
        if let Some(approver) = a.approver.as_ref().filter(|_| weakening.ask) {
            let Ok(turn) = Arc::clone(&a.change_question).try_acquire_owned() else {
                let message = format!(
                    "refused: {} weakens safety ({}), and another such change is already waiting for the approver's \
                     person, so this one was not put to them. Ask again once that one is answered. This attempt was \
                     journaled.",
                    weakening.change, weakening.weakens
                );
                let (store, detail, reply) = refuse(ControlCode::NotConfirmed, message, "not_asked_another_waiting");
                let _ = blocking(move || store.refusal(detail, now)).await;
                return reply;
            };
            let question = postern_engine::ChangeRequest {
                op: serde_json::to_value(request.op())
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_owned))
                    .unwrap_or_default(),
                change: weakening.change.clone(),
                weakens: weakening.weakens.clone(),
                from: from.lines(),
                timeout_ms: a.approval_timeout.as_millis() as u64,
                withdrawn: postern_engine::approval::Withdrawal::default(),
            };
            let (approver, asked) = (Arc::clone(approver), question.clone());
            let answer = tokio::time::timeout(
                a.approval_timeout + std::time::Duration::from_secs(1),
                tokio::task::spawn_blocking(move || {
                    let _turn = turn;
                    approver.confirm_change(&asked)
                }),
            )
            .await;
            match answer {
                Ok(Ok(None)) => {}
                Ok(Ok(Some(true))) => {
                    let store = Arc::clone(&a.store);
                    let detail = json!({ "change": weakening.change, "weakens": weakening.weakens,
                                         "peer": from.detail(), "confirmed_by": "approver" });
                    let _ = blocking(move || store.control_applied(detail, now)).await;
                }
                _ => {
                    question.withdrawn.withdraw();
                    let message = format!(
                        "refused: {} weakens safety ({}), and the approver's person did not confirm it. This was \
                         journaled.",
                        weakening.change, weakening.weakens
                    );
                    let (store, detail, reply) = refuse(ControlCode::NotConfirmed, message, "not_confirmed");
                    let _ = blocking(move || store.refusal(detail, now)).await;
                    return reply;
                }
            }
        }
    }
    match apply_inner(a, request, now).await {
        Ok(reply) | Err(reply) => reply,
    }
}

async fn apply_inner(
    a: &Authority,
    request: ControlRequest,
    now: postern_core::Timestamp,
) -> Result<ControlReply, ControlReply> {
    let store = Arc::clone(&a.store);
    let vault =
        || a.vault.clone().ok_or_else(|| ControlReply::refused(ControlCode::Failed, "the vault is not open here"));
    let no_gateway = || {
        ControlReply::refused(
            ControlCode::Failed,
            "no gateway is running: its upstream servers start with `postern serve` (or the desktop app)",
        )
    };
    let journal = |r: Result<postern_store::JournalEntry, postern_store::StoreError>| match r {
        Ok(_) => ControlReply::Done,
        Err(e) => ControlReply::refused(ControlCode::of(&e), e.to_string()),
    };
    let vaulted = |r: Result<(), VaultError>| match r {
        Ok(()) => ControlReply::Done,
        Err(e) => ControlReply::of_vault(&e),
    };
    Ok(match request {
        ControlRequest::AddAgent { name, token_sha256 } => {
            journal(blocking(move || store.add_agent(&name, &token_sha256, now)).await?)
        }
        ControlRequest::RevokeAgent { name } => journal(blocking(move || store.revoke_agent(&name, now)).await?),
        ControlRequest::LockVault { by } => {
            journal(blocking(move || store.set_locked(true, json!({ "by": by }), now)).await?)
        }
        ControlRequest::RevokeSession { id } => {
            journal(blocking(move || store.set_session_standing(id, false, "cli", json!({}), now)).await?)
        }
        // Without a gateway nothing runs: every server is stopped (the caller lists them).
        ControlRequest::ServersStatus => ControlReply::Servers {
            servers: match &a.upstreams {
                Some(u) => u.status().await,
                None => vec![],
            },
        },
        ControlRequest::RestartServer { name } => match &a.upstreams {
            Some(u) => match u.restart(&name).await {
                Ok(status) => ControlReply::Servers { servers: vec![status] },
                Err(e) => ControlReply::refused(ControlCode::Failed, e.to_string()),
            },
            None => return Err(no_gateway()),
        },
        ControlRequest::GatewayStatus => match &a.gateway {
            Some(info) => {
                // What the gateway holds now: secrets kept in memory (none while locked).
                let now =
                    GatewayInfo { kept_secrets: a.vault.as_ref().map_or(0, |v| v.secrets_in_memory()), ..info.clone() };
                ControlReply::Answer { answer: json!(now) }
            }
            None => return Err(ControlReply::refused(ControlCode::Failed, "no gateway is running here")),
        },
        ControlRequest::AddCredential { credential, secret } => {
            let v = vault()?;
            vaulted(blocking(move || v.add_credential(&credential, &secret.0, now)).await?)
        }
        ControlRequest::AddSshHost { host, key, passphrase } => {
            let v = vault()?;
            vaulted(blocking(move || v.add_ssh_host(&host, &key.0, passphrase.as_ref().map(|p| &p.0), now)).await?)
        }
        ControlRequest::Remove { name } => {
            let v = vault()?;
            match &a.upstreams {
                // A server of a running gateway: its process is stopped before its record goes.
                Some(u) if v.mcp_server(&name).is_ok() => vaulted(u.remove(&name, now).await),
                _ => vaulted(
                    blocking(move || {
                        if v.mcp_server(&name).is_ok() {
                            v.remove_mcp_server(&name, now)
                        } else if v.ssh_host(&name).is_ok() {
                            v.remove_ssh_host(&name, now)
                        } else {
                            v.remove_credential(&name, now)
                        }
                    })
                    .await?,
                ),
            }
        }
        ControlRequest::AddServer { server, secrets } => {
            let v = vault()?;
            postern_engine::channel::upstream::check_remote(&v, &server).map_err(|e| ControlReply::of_vault(&e))?;
            // A server that signs in starts once it has (`servers login`), not before.
            let start = server.start == ServerStart::WithGateway && a.gateway.is_some() && server.oauth.is_none();
            let name = server.name.clone();
            let secrets: Vec<(String, Sensitive<String>)> = secrets.into_iter().map(|(k, s)| (k, s.0)).collect();
            let added = vaulted(blocking(move || v.add_mcp_server(&server, &secrets, now)).await?);
            if let (ControlReply::Done, true, Some(u)) = (&added, start, &a.upstreams) {
                u.ensure_started(&name).await;
            }
            added
        }
        ControlRequest::KeepSignIn { name, grant } => {
            let v = vault()?;
            match postern_engine::channel::upstream::keep_sign_in(&v, a.upstreams.as_deref(), &name, grant.0, now).await
            {
                Ok(()) => ControlReply::Done,
                Err(postern_engine::channel::upstream::UpstreamError::Vault(e)) => ControlReply::of_vault(&e),
                Err(e) => ControlReply::refused(ControlCode::Invalid, e.to_string()),
            }
        }
        ControlRequest::SignOut { name } => {
            let v = vault()?;
            let server = v.mcp_server(&name).map_err(|e| ControlReply::of_vault(&e))?;
            let kept = v.oauth_grant(&server).map_err(|e| ControlReply::of_vault(&e))?;
            let revoked = match &kept {
                Some(k) => match postern_engine::channel::oauth::Grant::read(k) {
                    Ok(g) => postern_engine::channel::oauth::revoke(&g).await,
                    Err(e) => Err(e.to_string()),
                },
                None => Ok(false),
            };
            let detail = json!({ "server": name, "was_signed_in": kept.is_some(), "revoked_at_server": revoked.as_ref().ok(),
                                 "revocation_error": revoked.as_ref().err() });
            if let Some(u) = &a.upstreams {
                u.stop(&name).await;
            }
            let (gone, answer) = (name.clone(), detail.clone());
            match vaulted(
                blocking(move || {
                    v.forget_oauth_grant(&gone)?;
                    v.journal_oauth(postern_store::OAuthEvent::OAuthSignedOut, detail, now)
                })
                .await?,
            ) {
                ControlReply::Done => ControlReply::Answer { answer },
                refused => refused,
            }
        }
        ControlRequest::RedirectRefused { name, why } => {
            let v = vault()?;
            if v.mcp_server(&name).map(|s| s.oauth.is_none()).unwrap_or(true) {
                return Err(ControlReply::refused(
                    ControlCode::Invalid,
                    format!("{name:?} does not sign in with OAuth"),
                ));
            }
            let why: String = why.chars().take(200).collect();
            let detail = json!({ "server": name, "why": why });
            vaulted(
                blocking(move || v.journal_oauth(postern_store::OAuthEvent::OAuthRedirectRefused, detail, now)).await?,
            )
        }
        ControlRequest::SetServerStart { name, start } => match &a.upstreams {
            Some(u) => vaulted(u.set_start(&name, start, now).await),
            None => {
                let v = vault()?;
                vaulted(blocking(move || v.set_mcp_server_start(&name, start, now).map(drop)).await?)
            }
        },
        ControlRequest::SetToolContract { server, tool, contract } => {
            let u = a.upstreams.as_ref().ok_or_else(no_gateway)?;
            match u.set_contract(&server, &tool, contract, now).await {
                Ok(()) => ControlReply::Done,
                Err(postern_engine::channel::upstream::UpstreamError::Vault(e)) => ControlReply::of_vault(&e),
                Err(e @ postern_engine::channel::upstream::UpstreamError::Unavailable { .. }) => {
                    ControlReply::refused(ControlCode::Failed, e.to_string())
                }
                Err(e) => ControlReply::refused(ControlCode::Invalid, e.to_string()),
            }
        }
        ControlRequest::ServerTools { name } => {
            let v = vault()?;
            v.mcp_server(&name).map_err(|e| ControlReply::of_vault(&e))?;
            let u = a.upstreams.as_ref().ok_or_else(no_gateway)?;
            u.ensure_started(&name).await;
            let status = u.status().await.into_iter().find(|s| s.name == name);
            if let Some(e) = status.as_ref().and_then(|s| s.last_error.clone()) {
                return Err(ControlReply::refused(
                    ControlCode::Failed,
                    format!("MCP server {name:?} did not start: {e}"),
                ));
            }
            let tools: Vec<Value> = u
                .tools()
                .into_iter()
                .filter(|t| t.server == name)
                .map(|t| {
                    json!({ "name": t.name, "tool": t.tool, "contract": t.contract.class.as_str(),
                            "contract_from": t.contract_source, "hinted": t.hinted.map(|c| c.as_str()),
                            "idempotency_argument": t.contract.idempotency_argument,
                            "approve_every_use": t.approve_every_use, "description": t.description })
                })
                .collect();
            ControlReply::Answer { answer: Value::Array(tools) }
        }
        ControlRequest::Checkpoint => {
            let v = vault()?;
            let signed = blocking(move || {
                let cp = store.checkpoint(now).map_err(VaultError::from)?;
                v.sign_checkpoint(cp)
            })
            .await?;
            match signed {
                Ok(cp) => ControlReply::Answer { answer: json!(cp) },
                Err(e) => ControlReply::of_vault(&e),
            }
        }
        ControlRequest::PublicKey => {
            let v = vault()?;
            let keys =
                blocking(move || Ok::<_, VaultError>((v.journal_public_key()?, v.journal_verifier_key()?))).await?;
            match keys {
                Ok((hex, vkey)) => ControlReply::Answer { answer: json!({ "hex": hex, "vkey": vkey.to_string() }) },
                Err(e) => ControlReply::of_vault(&e),
            }
        }
        ControlRequest::RecordImport { event, detail } => {
            journal(blocking(move || store.import_recorded(event, detail, now)).await?)
        }
        ControlRequest::SshGc { host, older_than_days } => {
            let v = vault()?;
            match postern_engine::channel::ssh::marker_gc_on(&v, a.store.view(), &host, older_than_days.max(1)).await {
                Ok(report) => ControlReply::Answer { answer: json!(report) },
                Err(e) => ControlReply::refused(ControlCode::Failed, e),
            }
        }
    })
}

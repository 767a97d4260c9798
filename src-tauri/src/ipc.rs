//! The typed IPC between the windows and the app: every command's argument and result type is
//! declared here once and exported to TypeScript (`ui/src/lib/bindings/`, by ts-rs, when the
//! tests run); every error crosses as an [`IpcError`] — a machine-readable code and a message.

use crate::App;
use crate::views::{ApprovalView, Reply, TimelineRow};
use postern_core::ErrorCode;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use ts_rs::TS;

/// An error as the UI receives it.
#[derive(Debug, Clone, Serialize, TS, thiserror::Error)]
#[ts(export, export_to = "../../ui/src/lib/bindings/")]
#[error("{message} ({code})")]
pub struct IpcError {
    pub code: String,
    pub message: String,
}

impl IpcError {
    fn new(code: &str, message: impl Into<String>) -> Self {
        IpcError { code: code.into(), message: message.into() }
    }
}

impl<E: ErrorCode + std::fmt::Display> From<E> for IpcError {
    fn from(e: E) -> Self {
        IpcError { code: e.code().into(), message: e.to_string() }
    }
}

/// The Activity view's filters; absent fields mean "any".
#[derive(Debug, Clone, Default, Deserialize, TS)]
#[ts(export, export_to = "../../ui/src/lib/bindings/")]
pub struct ExecutionFilter {
    pub before: Option<String>,
    pub state: Option<String>,
    pub tool: Option<String>,
    pub actor: Option<String>,
    pub session: Option<String>,
    pub from: Option<f64>,
    pub until: Option<f64>,
    pub text: Option<String>,
    pub limit: Option<u32>,
}

/// One row of the Activity table.
#[derive(Debug, Clone, Serialize, TS)]
#[ts(export, export_to = "../../ui/src/lib/bindings/")]
pub struct ExecutionRow {
    pub id: String,
    pub tool: String,
    pub state: postern_core::ExecutionState,
    pub actor: String,
    pub session: Option<String>,
    pub channel: String,
    pub contract: String,
    pub accepted_at: f64,
    pub updated_at: f64,
}

/// The Activity view's detail pane.
#[derive(Debug, Clone, Serialize, TS)]
#[ts(export, export_to = "../../ui/src/lib/bindings/")]
pub struct ExecutionDetail {
    pub row: ExecutionRow,
    pub fingerprint: String,
    pub idempotency_key: Option<String>,
    /// `POST https://…`, or the SSH host key, account and command.
    pub target: String,
    /// What the target answered (HTTP or exit status), or why the outcome is unknown, as JSON.
    pub target_outcome: Option<String>,
    pub timeline: Vec<TimelineRow>,
    /// Every call that reached the execution: the first and each retry (the incident record).
    pub calls: Vec<CallRow>,
    /// Other executions of the same intent by the same actor: `act_… state`.
    pub related: Vec<String>,
    /// The stored result as pretty JSON (`None` until there is one).
    pub result: Option<String>,
}

/// One call that reached an execution, with what it came with.
#[derive(Debug, Clone, Serialize, TS)]
#[ts(export, export_to = "../../ui/src/lib/bindings/")]
pub struct CallRow {
    pub at: f64,
    /// `accepted` (the first) or `retry_received`.
    pub event: String,
    pub decision: Option<String>,
    pub agent_session: Option<String>,
    pub mcp_session_id: Option<String>,
    pub jsonrpc_id: Option<String>,
}

#[derive(Debug, Clone, Serialize, TS)]
#[ts(export, export_to = "../../ui/src/lib/bindings/")]
pub struct SessionRow {
    pub id: String,
    pub actor: String,
    pub pid: Option<f64>,
    pub transport: String,
    pub client: Option<String>,
    pub started_at: f64,
    pub ended_at: Option<f64>,
    pub end_reason: Option<String>,
    pub calls: f64,
    pub authorization: Option<String>,
    pub authorized_by: Option<String>,
}

#[derive(Debug, Clone, Serialize, TS)]
#[ts(export, export_to = "../../ui/src/lib/bindings/")]
pub struct StatusView {
    pub locked: bool,
    pub pending: u32,
    pub data_dir: String,
    pub socket: String,
    pub http: Option<String>,
}

/// A tool as agents see it (name, description with the replay contract, MCP annotations).
#[derive(Debug, Clone, Serialize, TS)]
#[ts(export, export_to = "../../ui/src/lib/bindings/")]
pub struct ToolRow {
    pub name: String,
    pub description: String,
    /// The MCP annotations as JSON (`readOnlyHint`, `destructiveHint`, `idempotentHint`, …).
    pub annotations: String,
    pub input_schema: String,
}

/// The manifest's tools, or why it was refused (each problem with its file and line).
#[derive(Debug, Clone, Serialize, TS)]
#[ts(export, export_to = "../../ui/src/lib/bindings/")]
pub struct ToolsView {
    pub manifest: String,
    pub tools: Vec<ToolRow>,
    pub errors: Vec<ManifestProblem>,
}

#[derive(Debug, Clone, Serialize, TS)]
#[ts(export, export_to = "../../ui/src/lib/bindings/")]
pub struct ManifestProblem {
    pub file: String,
    pub line: u32,
    pub tool: Option<String>,
    pub message: String,
}

/// The tool manifest `postern-host` finds (`POSTERN_TOOLS`, else `tools.toml` in the config
/// directory; none → the built-in tools only). A manifest with problems is not served (the
/// built-ins are), and its problems are shown in the Tools view with file and line.
pub fn manifest(explicit: Option<&std::path::Path>) -> (postern_engine::Manifest, String, Vec<ManifestProblem>) {
    let problem = |file: &str, line: usize, tool: Option<String>, message: String| ManifestProblem {
        file: file.to_owned(),
        line: u32::try_from(line).unwrap_or(u32::MAX),
        tool,
        message,
    };
    match postern_host::load_manifest(explicit) {
        Ok(loaded) => {
            let shown = loaded.path.display().to_string();
            let problems = loaded.problems.into_iter().map(|e| problem(&shown, e.line, e.tool, e.message)).collect();
            (loaded.manifest, shown, problems)
        }
        Err(e) => {
            let shown = explicit.map_or_else(|| "(none)".to_owned(), |p| p.display().to_string());
            (postern_engine::Manifest::default(), shown.clone(), vec![problem(&shown, 1, None, e.to_string())])
        }
    }
}

/// Credentials and SSH hosts: names, kinds, where they may go; never a secret.
#[derive(Debug, Clone, Serialize, TS)]
#[ts(export, export_to = "../../ui/src/lib/bindings/")]
pub struct VaultView {
    pub locked: bool,
    pub credentials: Vec<CredentialRow>,
    pub ssh_hosts: Vec<SshHostRow>,
}

#[derive(Debug, Clone, Serialize, TS)]
#[ts(export, export_to = "../../ui/src/lib/bindings/")]
pub struct CredentialRow {
    pub name: String,
    pub kind: String,
    pub hosts: Vec<String>,
    pub approve_every_use: bool,
}

#[derive(Debug, Clone, Serialize, TS)]
#[ts(export, export_to = "../../ui/src/lib/bindings/")]
pub struct SshHostRow {
    pub name: String,
    pub login: String,
    pub host_key: Option<String>,
    pub policy: String,
    pub approve_every_use: bool,
}

/// A new credential from the Vault view. The secret crosses once, into the keychain; it is
/// never sent back to any window.
#[derive(Debug, Clone, Deserialize, TS)]
#[ts(export, export_to = "../../ui/src/lib/bindings/")]
pub struct NewCredential {
    pub name: String,
    /// `bearer`, `basic` or `header`.
    pub kind: String,
    pub username: Option<String>,
    pub header_name: Option<String>,
    pub hosts: Vec<String>,
    pub approve_every_use: bool,
    pub secret: String,
}

/// A new SSH host from the Vault view. The private key and passphrase cross once, into the
/// keychain; they are never sent back to any window.
#[derive(Debug, Clone, Deserialize, TS)]
#[ts(export, export_to = "../../ui/src/lib/bindings/")]
pub struct NewSshHost {
    pub name: String,
    pub address: String,
    pub port: u16,
    pub account: String,
    /// `strict` (then `host_key` is required) or `accept-new`.
    pub policy: String,
    pub host_key: Option<String>,
    pub private_key: String,
    pub passphrase: Option<String>,
    pub approve_every_use: bool,
}

/// What `audit verify` found.
#[derive(Debug, Clone, Serialize, TS)]
#[ts(export, export_to = "../../ui/src/lib/bindings/")]
pub struct AuditView {
    pub intact: bool,
    pub rows: f64,
    pub executions: f64,
    pub head: String,
    pub findings: Vec<String>,
    pub elapsed_ms: f64,
}

/// Every command the windows may invoke (`capabilities/default.json` grants them).
pub fn handler() -> impl Fn(tauri::ipc::Invoke) -> bool + Send + Sync + 'static {
    tauri::generate_handler![
        pending_approvals,
        approval,
        answer_approval,
        open_approval,
        executions,
        execution_detail,
        sessions,
        revoke_session,
        lock_vault,
        unlock_vault,
        tools,
        vault,
        add_credential,
        add_ssh_host,
        remove_credential,
        set_approve_every_use,
        audit_verify,
        audit_checkpoint,
        status,
        servers,
        restart_server,
        add_server,
        probe_server,
        remove_server,
        set_tool_contract,
        set_server_start,
        begin_sign_in,
        finish_sign_in,
        settings,
        set_autostart,
        export_status,
        import_offer,
        import_apply,
    ]
}

type State<'a> = tauri::State<'a, Arc<App>>;

#[tauri::command]
pub fn pending_approvals(app: State<'_>) -> Vec<ApprovalView> {
    app.questions.pending()
}

#[tauri::command]
pub fn approval(app: State<'_>, id: String) -> Result<ApprovalView, IpcError> {
    app.questions.get(&id).ok_or_else(|| IpcError::new("approval_closed", "this question is no longer open"))
}

/// The only way an approval is given: from one of the app's own windows.
#[tauri::command]
pub fn answer_approval(
    window: tauri::Window,
    app: State<'_>,
    id: String,
    key: String,
    reason: Option<String>,
) -> Result<(), IpcError> {
    // Only the question's own window answers it (not the main window, not another question's).
    if window.label() != crate::windows::window_label(&id) {
        return Err(IpcError::new("approval_wrong_window", "a question is answered only in its own window"));
    }
    let mut chars = key.chars();
    let (Some(key), None) = (chars.next(), chars.next()) else {
        return Err(IpcError::new("invalid_answer", format!("{key:?} is not one key")));
    };
    if app.questions.answer(&id, Reply { key, reason }) {
        Ok(())
    } else {
        Err(IpcError::new("approval_closed", "this question is no longer open (answered, timed out or withdrawn)"))
    }
}

#[tauri::command]
pub fn open_approval(handle: tauri::AppHandle, app: State<'_>, id: String) -> Result<(), IpcError> {
    let view = app.questions.get(&id).ok_or_else(|| IpcError::new("approval_closed", "no longer open"))?;
    crate::windows::show_window(&handle, &id, &view.title);
    Ok(())
}

fn row(s: &postern_store::ExecutionSummary) -> ExecutionRow {
    ExecutionRow {
        id: s.id.clone(),
        tool: s.tool.clone(),
        state: s.state,
        actor: s.actor.clone(),
        session: s.session_id.clone(),
        channel: s.channel.clone(),
        contract: s.contract.get("class").and_then(|c| c.as_str()).unwrap_or("").to_owned(),
        accepted_at: s.accepted_at as f64,
        updated_at: s.updated_at as f64,
    }
}

#[tauri::command]
pub fn executions(app: State<'_>, filter: ExecutionFilter) -> Result<Vec<ExecutionRow>, IpcError> {
    let blank = |v: Option<String>| v.filter(|s| !s.trim().is_empty());
    let query = postern_store::ExecutionQuery {
        before: blank(filter.before),
        state: blank(filter.state)
            .map(|s| s.parse::<postern_core::ExecutionState>())
            .transpose()
            .map_err(|e| IpcError::new("unknown_state", e.to_string()))?,
        tool: blank(filter.tool),
        actor: blank(filter.actor),
        session: blank(filter.session),
        from: filter.from.map(|v| v as i64),
        until: filter.until.map(|v| v as i64),
        text: blank(filter.text),
        limit: filter.limit.unwrap_or(100) as usize,
    };
    Ok(app.store.view().executions_page(&query)?.iter().map(row).collect())
}

#[tauri::command]
pub fn execution_detail(app: State<'_>, id: String) -> Result<ExecutionDetail, IpcError> {
    let parsed: postern_core::ExecutionId = id.parse().map_err(|e: postern_core::IdError| IpcError::from(e))?;
    let view = app.store.view();
    let summary =
        view.execution(parsed)?.ok_or_else(|| IpcError::new("unknown_execution", format!("no execution {id}")))?;
    let timeline: Vec<TimelineRow> = view
        .timeline(parsed)?
        .into_iter()
        .map(|e| TimelineRow {
            at: e.row.at.as_millis() as f64,
            event: e.row.event.to_string(),
            summary: serde_json::to_string(&e.row.detail).unwrap_or_default(),
        })
        .collect();
    let idempotency_key = summary.contract.get("idempotency_header").and_then(|h| h.as_str()).map(|_| id.clone());
    let result = view
        .result(parsed)?
        .and_then(|r| serde_json::from_slice::<serde_json::Value>(&r.body).ok())
        .map(|v| serde_json::to_string_pretty(&v).unwrap_or_default());
    let incident =
        view.incident(parsed)?.ok_or_else(|| IpcError::new("unknown_execution", format!("no execution {id}")))?;
    let text = |v: &Option<serde_json::Value>| match v {
        None | Some(serde_json::Value::Null) => None,
        Some(serde_json::Value::String(s)) => Some(s.clone()),
        Some(other) => Some(other.to_string()),
    };
    let target = match &incident.target {
        serde_json::Value::Object(t) if t.contains_key("url") => {
            format!("{} {}", t["method"].as_str().unwrap_or(""), t["url"].as_str().unwrap_or(""))
        }
        other => other.to_string(),
    };
    Ok(ExecutionDetail {
        row: row(&summary),
        fingerprint: summary.fingerprint.clone(),
        idempotency_key,
        target,
        target_outcome: incident.target_outcome.as_ref().map(serde_json::Value::to_string),
        timeline,
        calls: incident
            .calls
            .iter()
            .map(|c| CallRow {
                at: c.at as f64,
                event: c.event.clone(),
                decision: c
                    .decision
                    .as_ref()
                    .and_then(|d| d.get("decision"))
                    .and_then(|d| d.as_str())
                    .map(str::to_owned),
                agent_session: text(&c.agent_session),
                mcp_session_id: text(&c.mcp_session_id),
                jsonrpc_id: text(&c.jsonrpc_id),
            })
            .collect(),
        related: incident.related.iter().map(|r| format!("{} {}", r.execution_id, r.state)).collect(),
        result,
    })
}

#[tauri::command]
pub fn sessions(app: State<'_>) -> Result<Vec<SessionRow>, IpcError> {
    Ok(app
        .store
        .view()
        .sessions()?
        .into_iter()
        .map(|s| SessionRow {
            id: s.id,
            actor: s.actor,
            pid: s.pid.map(|p| p as f64),
            transport: s.transport,
            client: s.client,
            started_at: s.started_at as f64,
            ended_at: s.ended_at.map(|t| t as f64),
            end_reason: s.end_reason,
            calls: s.executions as f64,
            authorization: s.authorization,
            authorized_by: s.authorized_by,
        })
        .collect())
}

#[tauri::command]
pub fn revoke_session(app: State<'_>, id: String) -> Result<(), IpcError> {
    let parsed: postern_core::SessionId = id.parse().map_err(|e: postern_core::IdError| IpcError::from(e))?;
    app.store.set_session_standing(parsed, false, "desktop", serde_json::json!({}), crate::now())?;
    Ok(())
}

#[tauri::command]
pub fn lock_vault(handle: tauri::AppHandle, app: State<'_>) -> Result<(), IpcError> {
    app.vault.lock("desktop", crate::now())?;
    crate::notify::vault_locked(&handle);
    Ok(())
}

/// Unlocking belongs to the approver's channel: the app's own windows (never the control socket).
#[tauri::command]
pub fn unlock_vault(app: State<'_>) -> Result<(), IpcError> {
    app.vault.unlock("desktop", crate::now())?;
    Ok(())
}

#[tauri::command]
pub fn status(app: State<'_>) -> Result<StatusView, IpcError> {
    Ok(StatusView {
        locked: app.vault.is_locked()?,
        pending: u32::try_from(app.questions.pending().len()).unwrap_or(u32::MAX),
        data_dir: app.data_dir.display().to_string(),
        socket: app.socket.clone(),
        http: app.http.clone(),
    })
}

/// One upstream MCP server as the Servers view shows it.
#[derive(Debug, Clone, Serialize, TS)]
#[ts(export, export_to = "../../ui/src/lib/bindings/")]
pub struct ServerRow {
    pub name: String,
    /// `running`, `stopped` or `crashed`.
    pub state: String,
    pub last_error: Option<String>,
    /// The command line, or the URL and the credential sent to it.
    pub launched: String,
    /// Names of the environment values kept in the keychain (never their values).
    pub secret_env: Vec<String>,
    pub approve_every_use: bool,
    /// `with_gateway` or `on_first_use`.
    pub start: String,
    /// A server that signs in with OAuth: where its sign-in stands, in words (signed in until
    /// when, sign-in needed, …); read from the journal, never a token.
    pub sign_in: Option<String>,
    pub tools: Vec<UpstreamToolRow>,
}

/// An upstream tool as agents see it, with the contract Postern holds it to.
#[derive(Debug, Clone, Serialize, TS)]
#[ts(export, export_to = "../../ui/src/lib/bindings/")]
pub struct UpstreamToolRow {
    /// `<server>__<tool>`, as agents call it.
    pub name: String,
    /// The server's own name for it (what a contract is set for).
    pub tool: String,
    pub contract: String,
    /// With `idempotency_key`: the argument Postern fills with the execution ID.
    pub idempotency_argument: Option<String>,
    /// `hints_unconfirmed` (the server's annotations suggest `hinted`, not confirmed by the
    /// owner: held to irreversible), `default` (no hint), `tools.toml` (the file decides; the
    /// app does not edit it) or `owner` (set here or with `postern servers contract`).
    pub contract_from: String,
    /// The class the server's annotations suggest (`read_only`, `idempotent`), if any: only
    /// the server's claim, in force once the owner confirms it.
    pub hinted: Option<String>,
    pub approve_every_use: bool,
    /// The tool's argument names, for choosing the idempotency argument.
    pub arguments: Vec<String>,
}

/// The owner's contract for one upstream tool, as the Servers view sets it.
#[derive(Debug, Clone, Deserialize, TS)]
#[ts(export, export_to = "../../ui/src/lib/bindings/")]
pub struct ToolContractInput {
    /// `read_only`, `idempotent`, `idempotency_key` or `irreversible`; none: the annotations
    /// decide the class (the owner only asks for a reviewer on every use).
    pub class: Option<String>,
    pub idempotency_argument: Option<String>,
    pub approve_every_use: bool,
}

/// Holds one of a server's tools to the owner's contract (`None`: its annotations decide
/// again). Checked against the tool's schema, journaled, and offered to agents at once.
#[tauri::command]
pub async fn set_tool_contract(
    app: State<'_>,
    server: String,
    tool: String,
    contract: Option<ToolContractInput>,
) -> Result<(), IpcError> {
    let upstreams = app.engine.upstreams().ok_or_else(|| IpcError::new("no_upstreams", "no upstream servers"))?;
    let contract = match contract {
        None => None,
        Some(c) => Some(postern_vault::ToolOverride {
            class: match c.class {
                None => None,
                Some(class) => Some(
                    serde_json::from_value(serde_json::Value::String(class.clone()))
                        .map_err(|_| IpcError::new("invalid_contract", format!("no replay class {class:?}")))?,
                ),
            },
            idempotency_argument: c.idempotency_argument,
            approve_every_use: c.approve_every_use,
            ..postern_vault::ToolOverride::default()
        }),
    };
    upstreams.set_contract(&server, &tool, contract, crate::now()).await.map_err(IpcError::from)
}

/// When a server's process starts: `with_gateway` (started now if it is not running) or
/// `on_first_use`. Journaled.
#[tauri::command]
pub async fn set_server_start(app: State<'_>, name: String, start: String) -> Result<(), IpcError> {
    let start: postern_vault::ServerStart = serde_json::from_value(serde_json::Value::String(start.clone()))
        .map_err(|_| IpcError::new("invalid_start", format!("no start setting {start:?}")))?;
    match app.engine.upstreams() {
        Some(upstreams) => upstreams.set_start(&name, start, crate::now()).await?,
        None => drop(app.vault.set_mcp_server_start(&name, start, crate::now())?),
    }
    Ok(())
}

/// The upstream MCP servers: state, what launches them, their tools and contracts.
#[tauri::command]
pub async fn servers(app: State<'_>) -> Result<Vec<ServerRow>, IpcError> {
    let Some(upstreams) = app.engine.upstreams() else { return Ok(vec![]) };
    let statuses = upstreams.status().await;
    let tools = upstreams.tools();
    Ok(app
        .vault
        .mcp_servers()?
        .into_iter()
        .map(|s| {
            let status = statuses.iter().find(|st| st.name == s.name);
            ServerRow {
                state: status.map_or_else(|| "stopped".into(), |st| st.state.clone()),
                last_error: status.and_then(|st| st.last_error.clone()),
                launched: s.launched(),
                secret_env: s.secret_env.clone(),
                approve_every_use: s.approve_every_use,
                start: s.start.as_str().into(),
                sign_in: s
                    .oauth
                    .as_ref()
                    .and_then(|_| postern_engine::channel::oauth::standing(app.vault.journal(), &s.name).ok())
                    .map(|st| st.said),
                tools: tools
                    .iter()
                    .filter(|t| t.server == s.name)
                    .map(|t| UpstreamToolRow {
                        name: t.name.clone(),
                        tool: t.tool.clone(),
                        contract: t.contract.class.as_str().into(),
                        idempotency_argument: t.contract.idempotency_argument.clone(),
                        contract_from: t.contract_source.into(),
                        hinted: t.hinted.map(|c| c.as_str().to_owned()),
                        approve_every_use: t.approve_every_use,
                        arguments: t
                            .input_schema
                            .get("properties")
                            .and_then(serde_json::Value::as_object)
                            .map(|p| p.keys().cloned().collect())
                            .unwrap_or_default(),
                    })
                    .collect(),
                name: s.name,
            }
        })
        .collect())
}

/// An MCP server to add: a stdio server (its command, plain environment, and secret
/// environment values, typed into password fields, stored in the keychain, never sent back to
/// any window), or a remote one (`url`, with a vault credential or an OAuth sign-in).
#[derive(Debug, Clone, Deserialize, TS)]
#[ts(export, export_to = "../../ui/src/lib/bindings/")]
pub struct NewServer {
    pub name: String,
    pub command: String,
    pub args: Vec<String>,
    pub env: Vec<EnvValue>,
    pub approve_every_use: bool,
    /// A remote server's Streamable HTTP endpoint (then no command or environment).
    pub url: Option<String>,
    /// The vault credential sent to a remote server.
    pub credential: Option<String>,
    /// The remote server signs in with OAuth (the view offers it when the server asks).
    pub oauth: bool,
}

/// One environment value of a new server.
#[derive(Debug, Clone, Deserialize, TS)]
#[ts(export, export_to = "../../ui/src/lib/bindings/")]
pub struct EnvValue {
    pub key: String,
    pub value: String,
    pub secret: bool,
}

/// What a remote server not added yet says about signing in (its 401 challenge and its
/// authorization server's metadata), so the view can offer OAuth.
#[derive(Debug, Clone, Serialize, TS)]
#[ts(export, export_to = "../../ui/src/lib/bindings/")]
pub struct ServerProbe {
    pub oauth: bool,
    pub issuer: Option<String>,
    /// In words, for the form.
    pub said: String,
}

/// Asks the server at `url` whether it signs in with OAuth (an unauthenticated request; the URL
/// obeys the HTTP channel's target rules first).
#[tauri::command]
pub async fn probe_server(url: String) -> Result<ServerProbe, IpcError> {
    let offer = postern_engine::channel::oauth::offer(&url)
        .await
        .map_err(|e| IpcError::new(postern_core::ErrorCode::code(&e), e.to_string()))?;
    Ok(ServerProbe { oauth: offer.oauth, issuer: offer.issuer, said: offer.said })
}

#[tauri::command]
pub fn add_server(app: State<'_>, server: NewServer) -> Result<(), IpcError> {
    use postern_vault::{McpServer, OAuthSettings, Sensitive};
    let NewServer { name, command, args, env, approve_every_use, url, credential, oauth } = server;
    let (secret, plain): (Vec<EnvValue>, Vec<EnvValue>) = env.into_iter().partition(|e| e.secret);
    let server = McpServer {
        name,
        command,
        args,
        env: plain.into_iter().map(|e| (e.key, e.value)).collect(),
        secret_env: secret.iter().map(|e| e.key.clone()).collect(),
        approve_every_use,
        url,
        credential: credential.filter(|c| !c.is_empty()),
        oauth: oauth.then(OAuthSettings::default),
        ..McpServer::default()
    };
    server.validate()?;
    // The checks every way of adding a remote server passes (the control socket's too).
    postern_engine::channel::upstream::check_remote(&app.vault, &server)?;
    let secrets: Vec<(String, Sensitive<String>)> =
        secret.into_iter().map(|e| (e.key, Sensitive::new(e.value))).collect();
    app.vault.add_mcp_server(&server, &secrets, crate::now())?;
    Ok(())
}

/// Starts the OAuth sign-in of server `name` (discovery, registration, the loopback listener)
/// and opens the system browser at its authorization URL, which it returns for the view to show
/// (a machine with no browser: the owner opens it elsewhere). `finish_sign_in` waits for it.
#[tauri::command]
pub async fn begin_sign_in(app: State<'_>, name: String) -> Result<String, IpcError> {
    let server = app.vault.mcp_server(&name)?;
    let signin = postern_engine::channel::oauth::SignIn::begin(&server)
        .await
        .map_err(|e| IpcError::new(postern_core::ErrorCode::code(&e), e.to_string()))?;
    let url = signin.url().to_owned();
    signin.open_browser();
    app.sign_ins.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(name, signin);
    Ok(url)
}

/// Waits (up to 5 minutes) for the browser's redirect of the sign-in `begin_sign_in` started,
/// and keeps the grant as `postern servers login` does; the server reconnects with it. Returns
/// where the sign-in stands, in words.
#[tauri::command]
pub async fn finish_sign_in(app: State<'_>, name: String) -> Result<String, IpcError> {
    let signin = app
        .sign_ins
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .remove(&name)
        .ok_or_else(|| IpcError::new("no_sign_in", format!("no sign-in of {name:?} is under way")))?;
    let clock = postern_engine::engine::system_clock();
    let vault = Arc::clone(&app.vault);
    let refused_for = name.clone();
    let grant = signin
        .finish(std::time::Duration::from_secs(300), &clock, move |r| {
            let detail = serde_json::json!({ "server": refused_for, "why": r.why });
            let _ = vault.journal_oauth(postern_store::OAuthEvent::OAuthRedirectRefused, detail, crate::now());
        })
        .await
        .map_err(|e| IpcError::new(postern_core::ErrorCode::code(&e), e.to_string()))?;
    postern_engine::channel::upstream::keep_sign_in(
        &app.vault,
        app.engine.upstreams().map(|u| u.as_ref()),
        &name,
        grant.to_kept(),
        crate::now(),
    )
    .await?;
    Ok(postern_engine::channel::oauth::standing(app.vault.journal(), &name)?.said)
}

/// Stops the server and removes it and its keychain secrets.
#[tauri::command]
pub async fn remove_server(app: State<'_>, name: String) -> Result<(), IpcError> {
    match app.engine.upstreams() {
        Some(upstreams) => upstreams.remove(&name, crate::now()).await?,
        None => app.vault.remove_mcp_server(&name, crate::now())?,
    }
    Ok(())
}

/// The first-run offer: the MCP servers the agent configs on this machine launch, and how many
/// of their environment values are plaintext secrets (never the values).
#[derive(Debug, Clone, Serialize, TS)]
#[ts(export, export_to = "../../ui/src/lib/bindings/")]
pub struct ImportOffer {
    pub servers: u32,
    pub secrets: u32,
    /// The config files that would be rewritten.
    pub files: Vec<String>,
}

/// The `postern` CLI agents are pointed at: the one on PATH, else the bare name.
fn postern_on_path() -> String {
    std::env::var_os("PATH")
        .and_then(|path| std::env::split_paths(&path).map(|d| d.join("postern")).find(|c| c.is_file()))
        .map_or_else(|| "postern".into(), |p| p.display().to_string())
}

#[tauri::command]
pub fn import_offer(app: State<'_>) -> Result<ImportOffer, IpcError> {
    let plan = postern_host::import::plan(app.vault.as_ref(), &[], &postern_on_path())?;
    Ok(ImportOffer {
        servers: u32::try_from(plan.servers()).unwrap_or(u32::MAX),
        secrets: u32::try_from(plan.secrets()).unwrap_or(u32::MAX),
        files: plan.files.iter().filter(|f| !f.named.is_empty()).map(|f| f.source.path.display().to_string()).collect(),
    })
}

/// Moves them in (`postern servers import --yes`); returns how many servers moved.
#[tauri::command]
pub fn import_apply(app: State<'_>) -> Result<u32, IpcError> {
    let plan = postern_host::import::plan(app.vault.as_ref(), &[], &postern_on_path())?;
    let moved = postern_host::import::apply(app.vault.as_ref(), &app.data_dir, plan, crate::now())?;
    Ok(u32::try_from(moved.len()).unwrap_or(u32::MAX))
}

/// Stops a server (SIGTERM, then SIGKILL) and starts it again.
#[tauri::command]
pub async fn restart_server(app: State<'_>, name: String) -> Result<(), IpcError> {
    let upstreams = app.engine.upstreams().ok_or_else(|| IpcError::new("no_upstreams", "no upstream servers"))?;
    upstreams.restart(&name).await.map(|_| ()).map_err(IpcError::from)
}

#[tauri::command]
pub fn tools(app: State<'_>) -> ToolsView {
    let tools = postern_gateway::door::mcp::tool_list(&app.engine)
        .into_iter()
        .map(|t| ToolRow {
            name: t.name.to_string(),
            description: t.description.map(|d| d.to_string()).unwrap_or_default(),
            annotations: serde_json::to_string(&t.annotations).unwrap_or_default(),
            input_schema: serde_json::to_string_pretty(&t.input_schema).unwrap_or_default(),
        })
        .collect();
    ToolsView { manifest: app.manifest_path.clone(), tools, errors: app.manifest_errors.clone() }
}

#[tauri::command]
pub fn vault(app: State<'_>) -> Result<VaultView, IpcError> {
    let credentials = app
        .vault
        .credentials()?
        .into_iter()
        .map(|c| CredentialRow {
            kind: c.kind.as_str().into(),
            hosts: c.bindings.iter().map(|b| format!("{}{}", b.host, b.path_prefix.as_deref().unwrap_or(""))).collect(),
            approve_every_use: c.approve_every_use,
            name: c.name,
        })
        .collect();
    let ssh_hosts = app
        .vault
        .ssh_hosts()?
        .into_iter()
        .map(|h| SshHostRow {
            login: format!("{}@{}:{}", h.account, h.address, h.port),
            host_key: h.host_key_fingerprint,
            policy: h.policy.as_str().into(),
            approve_every_use: h.approve_every_use,
            name: h.name,
        })
        .collect();
    Ok(VaultView { locked: app.vault.is_locked()?, credentials, ssh_hosts })
}

#[tauri::command]
pub fn add_credential(app: State<'_>, credential: NewCredential) -> Result<(), IpcError> {
    use postern_vault::{Binding, Credential, CredentialKind, Sensitive};
    let NewCredential { name, kind, username, header_name, hosts, approve_every_use, secret } = credential;
    let secret = Sensitive::new(secret);
    let kind = match kind.as_str() {
        "bearer" => CredentialKind::Bearer,
        "basic" => CredentialKind::Basic { username: username.unwrap_or_default() },
        "header" => CredentialKind::Header { name: header_name.unwrap_or_default() },
        other => return Err(IpcError::new("invalid_credential", format!("unknown kind {other:?}"))),
    };
    let bindings = hosts.iter().map(|h| Binding::new(h, None)).collect::<Result<Vec<_>, _>>()?;
    let credential =
        Credential { name, kind, bindings, approve_every_use, idempotency_header: None, reads_have_effects: false };
    app.vault.add_credential(&credential, &secret, crate::now())?;
    Ok(())
}

/// Only from the main window: turning per-use approval off is a reviewer's decision.
#[tauri::command]
pub fn set_approve_every_use(app: State<'_>, name: String, on: bool) -> Result<(), IpcError> {
    app.vault.set_approve_every_use(&name, on, crate::now())?;
    Ok(())
}

#[tauri::command]
pub fn remove_credential(app: State<'_>, name: String) -> Result<(), IpcError> {
    if app.vault.ssh_host(&name).is_ok() {
        app.vault.remove_ssh_host(&name, crate::now())?;
    } else {
        app.vault.remove_credential(&name, crate::now())?;
    }
    Ok(())
}

/// `postern audit verify` on this journal (read-only; the chain and the projections).
#[tauri::command]
pub async fn audit_verify(handle: tauri::AppHandle, app: State<'_>) -> Result<AuditView, IpcError> {
    use tauri::Emitter;
    let path = app.data_dir.join("postern.db");
    let started = std::time::Instant::now();
    let report = tauri::async_runtime::spawn_blocking(move || {
        postern_store::audit::verify(&path, None, &mut |done, total| {
            let _ = handle.emit("audit-progress", (done as f64, total as f64));
        })
    })
    .await
    .map_err(|e| IpcError::new("internal_error", e.to_string()))??;
    Ok(AuditView {
        intact: report.intact(),
        rows: report.rows as f64,
        executions: report.executions as f64,
        head: report.head.hash.to_string(),
        findings: report.findings.iter().map(ToString::to_string).collect(),
        elapsed_ms: started.elapsed().as_millis() as f64,
    })
}

/// A signed checkpoint of the journal's head (as `postern audit checkpoint`): the C2SP checkpoint
/// note, for the reviewer to keep off this machine or hand to a witness.
#[tauri::command]
pub fn audit_checkpoint(app: State<'_>) -> Result<String, IpcError> {
    let signed = app.vault.sign_checkpoint(app.store.checkpoint(crate::now())?)?;
    signed.note().map(str::to_owned).map_err(|e| IpcError::new("no_checkpoint_note", e))
}

/// The host-key policy the window chose; anything else is an error, never quietly `strict`.
fn host_key_policy(policy: &str) -> Result<postern_vault::HostKeyPolicy, IpcError> {
    use postern_vault::HostKeyPolicy;
    [HostKeyPolicy::Strict, HostKeyPolicy::AcceptNew].into_iter().find(|p| p.as_str() == policy).ok_or_else(|| {
        IpcError::new(
            "invalid_host_key_policy",
            format!("host key policy {policy:?} is neither \"strict\" nor \"accept-new\""),
        )
    })
}

#[tauri::command]
pub fn add_ssh_host(app: State<'_>, host: NewSshHost) -> Result<(), IpcError> {
    use postern_vault::{Sensitive, SshHost};
    let NewSshHost { name, address, port, account, policy, host_key, private_key, passphrase, approve_every_use } =
        host;
    let key = Sensitive::new(private_key);
    let passphrase = passphrase.filter(|p| !p.is_empty()).map(Sensitive::new);
    postern_engine::channel::ssh::decode_key(key.expose(), passphrase.as_ref().map(|p| p.expose().as_str()))
        .map_err(|reason| IpcError::new("ssh_bad_key", format!("the private key cannot be used: {reason}")))?;
    let pinned =
        host_key.filter(|k| !k.trim().is_empty()).map(|k| postern_engine::channel::ssh::host_key(&k)).transpose()?;
    let host = SshHost {
        name,
        address,
        port,
        account,
        policy: host_key_policy(&policy)?,
        host_key: pinned.as_ref().and_then(|(k, _)| k.to_openssh().ok()),
        host_key_fingerprint: pinned.map(|(_, f)| f),
        marker_root: postern_vault::DEFAULT_MARKER_ROOT.into(),
        approve_every_use,
    };
    app.vault.add_ssh_host(&host, &key, passphrase.as_ref(), crate::now())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The list of execution states for the UI, generated from `ExecutionState::ALL` beside the
    /// type ts-rs writes from the enum (`ExecutionState.ts`, with the other bindings during the
    /// tests; CI fails if a committed file differs), so no view keeps a list of its own.
    #[test]
    fn the_execution_states_binding_is_written_from_the_rust_type() {
        let names: Vec<&str> = postern_core::ExecutionState::ALL.iter().map(|s| s.as_str()).collect();
        let quoted: Vec<String> = names.iter().map(|n| format!("'{n}'")).collect();
        let text = format!(
            "// Generated from postern_core::ExecutionState::ALL by src-tauri's tests. Do not edit this file manually.\n\n\
             import type {{ ExecutionState }} from './ExecutionState';\n\n\
             /** Every state, in the order the lifecycle declares them. */\n\
             export const EXECUTION_STATES: readonly ExecutionState[] = [{}];\n",
            quoted.join(", ")
        );
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../ui/src/lib/bindings/ExecutionStates.ts");
        std::fs::write(&path, text).unwrap();
        // Each spelling is the one the journal and the IPC read back as that state.
        for (name, state) in names.iter().zip(postern_core::ExecutionState::ALL) {
            assert_eq!(serde_json::from_value::<postern_core::ExecutionState>(serde_json::json!(name)).unwrap(), state);
        }
    }

    #[test]
    fn an_unknown_host_key_policy_is_an_error_not_strict() {
        assert_eq!(host_key_policy("strict").unwrap(), postern_vault::HostKeyPolicy::Strict);
        assert_eq!(host_key_policy("accept-new").unwrap(), postern_vault::HostKeyPolicy::AcceptNew);
        for bad in ["", "Strict", "accept_new", "trust-everything"] {
            assert_eq!(host_key_policy(bad).unwrap_err().code, "invalid_host_key_policy", "{bad:?}");
        }
    }
}

/// The app's settings that live outside the vault.
#[derive(Debug, Clone, Serialize, TS)]
#[ts(export, export_to = "../../ui/src/lib/bindings/")]
pub struct SettingsView {
    /// The app starts at login (its XDG autostart entry exists).
    pub autostart: bool,
    /// Where that entry is (or would be).
    pub autostart_path: String,
}

fn config_home() -> Result<std::path::PathBuf, IpcError> {
    postern_host::login::config_home()
        .ok_or_else(|| IpcError::new("no_home_directory", "cannot find the config directory (HOME is not set)"))
}

#[tauri::command]
pub fn settings() -> Result<SettingsView, IpcError> {
    let home = config_home()?;
    Ok(SettingsView {
        autostart: postern_host::login::autostart_enabled(&home),
        autostart_path: home.join("autostart").join(postern_host::login::AUTOSTART_FILE).display().to_string(),
    })
}

/// Where the journal's OpenTelemetry export stands (what its bookmark in the journal says).
#[derive(Debug, Clone, Serialize, TS)]
#[ts(export, export_to = "../../ui/src/lib/bindings/")]
pub struct ExportView {
    /// Where it sends (the traces endpoint), or `None` when no export was ever set up.
    pub target: Option<String>,
    /// Journal rows not sent yet.
    pub lag_rows: f64,
    /// When it last sent (ms).
    pub last_sent: Option<f64>,
    /// Its last failure since then.
    pub last_error: Option<String>,
}

/// The OpenTelemetry export's standing: set up with `OTEL_EXPORTER_OTLP_ENDPOINT` in the app's
/// environment (or `postern serve --otlp-endpoint`).
#[tauri::command]
pub fn export_status(app: State<'_>) -> Result<ExportView, IpcError> {
    let view = app.store.view();
    let cursor = view.export_cursor(postern_otel::CURSOR)?;
    let head = view.head()?.size;
    Ok(ExportView {
        lag_rows: cursor.as_ref().map_or(0.0, |c| head.saturating_sub(c.seq) as f64),
        last_sent: cursor.as_ref().map(|c| c.updated_at as f64),
        last_error: cursor.as_ref().and_then(|c| c.last_error.clone()),
        target: cursor.map(|c| c.target),
    })
}

/// Starts the app at login (an XDG autostart entry running this executable), or stops doing so.
#[tauri::command]
pub fn set_autostart(on: bool) -> Result<SettingsView, IpcError> {
    let home = config_home()?;
    let exe = std::env::current_exe().map_err(|e| IpcError::new("io_error", format!("find this executable: {e}")))?;
    postern_host::login::set_autostart(&home, on.then_some(exe.as_path()))
        .map_err(|e| IpcError::new("io_error", format!("write the autostart entry: {e}")))?;
    settings()
}

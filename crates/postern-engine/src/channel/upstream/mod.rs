//! Upstream MCP servers behind the gateway: each stdio server the owner added to the vault is a
//! child process Postern speaks MCP to as a client (a remote one, a Streamable HTTP endpoint
//! reached with a vault credential). Its tools are offered to agents namespaced
//! (`<server>__<tool>`, see `catalogue`) with a replay contract derived from their
//! annotations, and a forwarded call's outcome is classified for the journal: never written,
//! answered, or lost in flight.
//!
//! A server cannot hold up another: each has its own start lock and start timeout. What it sends
//! back is held to the result limit as it is read (`frames`, `remote`); the secrets Postern
//! gave it (its secret environment and arguments, its credential) are known here, for the
//! outcome stage and for its stderr, which reaches the log masked and escaped.

mod admit;
mod catalogue;
mod forward;
mod frames;
mod remote;
mod signin;
mod start;

pub use admit::check_remote;
pub use signin::keep_sign_in;
use start::listing;

use crate::catalog::redaction::CallSecrets;
use crate::catalog::upstream_contract::derive_contract;
use catalogue::{Catalogue, Listing, read_operation};
pub use catalogue::{MAX_TOOL_NAME, tool_name_ok, uri_ok};
pub use postern_core::McpOperation;
use postern_core::{Outside, ReplayClass, ReplayContract};
use postern_vault::{McpServer, Sensitive, Vault, VaultError};
use rmcp::{
    ClientServiceExt,
    model::CallToolRequestParams,
    service::{RoleClient, RunningService},
};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};
use tokio::io::AsyncBufReadExt;

/// Separates the server from the tool in the names agents see.
pub const SEPARATOR: &str = "__";
/// Upstream resources are offered as `postern://<server>/<the server's own URI>`.
pub const RESOURCE_PREFIX: &str = "postern://";

/// The `_meta` key every forwarded `tools/call` carries: the execution it belongs to.
pub const EXECUTION_META: &str = "io.postern/execution_id";
/// How long a server has to start and answer `initialize` and `tools/list`.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a tools/list waits for servers that are starting (one that takes longer offers its
/// tools when it is ready: agents are told the tool list changed).
const LIST_WAIT: Duration = Duration::from_secs(5);
/// How long a forwarded call may take before its outcome is unknown.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(120);
/// After a failed start, the next attempt waits this long, doubling with each failure up to
/// [`MAX_RESTART_BACKOFF`]. A server that ran and then ended is started again on its next use.
const RESTART_BACKOFF: Duration = Duration::from_secs(1);
const MAX_RESTART_BACKOFF: Duration = Duration::from_secs(30);
/// What a message may add to a result's size (JSON-RPC framing, the tool result's own fields):
/// the transports read that much past the result limit, the outcome stage holds the result to it.
const FRAMING: usize = 64 * 1024;

/// What the owner says about one upstream tool (`tools.toml`, or the server's vault record).
pub use postern_vault::ToolOverride;

/// Why an owner's request about an upstream server could not be done.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error(transparent)]
    Vault(#[from] VaultError),
    /// The server did not start (or its tools could not be listed): the message says why.
    #[error("MCP server {server:?} is not available: {message}")]
    Unavailable { server: String, message: String },
    #[error("MCP server {server:?} offers no tool {tool:?} (it offers: {offered})")]
    UnknownTool { server: String, tool: String, offered: String },
    #[error(
        "the contract of {server}__{tool} is set in tools.toml ([servers.{server}.tools.{tool}]): change it there, \
         the file decides"
    )]
    SetInManifest { server: String, tool: String },
    #[error("{argument:?} is not an argument of {server}__{tool} (its arguments: {arguments})")]
    NotAnArgument { server: String, tool: String, argument: String, arguments: String },
}

impl postern_core::ErrorCode for UpstreamError {
    fn code(&self) -> &'static str {
        match self {
            UpstreamError::Vault(e) => e.code(),
            UpstreamError::Unavailable { .. } => "upstream_unavailable",
            UpstreamError::UnknownTool { .. } => "unknown_tool",
            UpstreamError::SetInManifest { .. } => "set_in_manifest",
            UpstreamError::NotAnArgument { .. } => "not_an_argument",
        }
    }
}

/// One upstream tool as agents see it, with the contract Postern will hold it to.
#[derive(Clone, Debug)]
pub struct UpstreamTool {
    pub server: String,
    /// The upstream's own name for it.
    pub tool: String,
    /// `<server>__<tool>`: the name agents call.
    pub name: String,
    pub description: String,
    pub input_schema: Value,
    pub contract: ReplayContract,
    /// Where the contract came from: `hints_unconfirmed` (the server's annotations suggest
    /// [`UpstreamTool::hinted`], the owner has not confirmed it, so it is `irreversible`),
    /// `default` (no annotation said anything), `tools.toml`, or `owner` (set from the app or
    /// `postern servers contract`).
    pub contract_source: &'static str,
    /// The class the server's annotations suggest, whatever decides the contract.
    pub hinted: Option<ReplayClass>,
    pub approve_every_use: bool,
    /// The upstream's input schema, compiled once (a schema that does not compile checks nothing).
    pub validator: Arc<jsonschema::Validator>,
    /// `tools/call`, or a read that agents reach through `resources/read` and `prompts/get`
    /// ([`Upstreams::read`]), never as a tool: a read is journaled as a read-only execution
    /// named `<server>__resources/read` or `<server>__prompts/get`.
    pub operation: McpOperation,
}

/// What happened to one forwarded call. An answer is as the server sent it: it goes through
/// the engine's outcome stage before anything answers, journals or logs it.
#[derive(Debug)]
pub enum UpstreamSent {
    /// Never written to the server: it is not running and could not be started.
    NotSent { reason: String },
    /// The server answered: a tool result (even `isError`) or a JSON-RPC error.
    Answered(UpstreamResult),
    /// The server answered with more than the result limit: the answer was not read.
    TooLarge(UpstreamResult),
    /// Written, and then the server died or went silent before answering.
    Lost { reason: String },
    /// Never sent: the server signs in with OAuth and needs a new sign-in (`oauth_login_required`).
    SignInNeeded { reason: String },
}

/// An upstream's answer, stored as the execution's result.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct UpstreamResult {
    pub server: String,
    pub tool: String,
    /// The `CallToolResult` as the server sent it, or `{"error": …}` for a JSON-RPC error.
    pub upstream_result: Value,
    pub is_error: bool,
    /// The answer held a secret of the call (the server's secret environment or arguments, its
    /// credential, a secret argument): masked.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub secret_echoed: bool,
    /// The answer was larger than the limit (the number, in bytes): it was not kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result_too_large: Option<u64>,
}

impl UpstreamResult {
    fn new(server: &str, tool: &str, upstream_result: Value, is_error: bool) -> Self {
        UpstreamResult {
            server: server.into(),
            tool: tool.into(),
            upstream_result,
            is_error,
            secret_echoed: false,
            result_too_large: None,
        }
    }
}

/// A server's state as `servers list` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerStatus {
    pub name: String,
    /// `running`, `starting`, `stopped` or `crashed`.
    pub state: String,
    pub tools: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
}

struct Running {
    service: RunningService<RoleClient, UpstreamClient>,
    /// What it offers, listed at start and again after it said its tools changed.
    listing: Mutex<Listing>,
    pid: Option<u32>,
    /// Set when a stdio server's process has exited (rmcp notices a closed pipe only later).
    exited: Arc<std::sync::atomic::AtomicBool>,
    /// Set when the server said its tools changed: they are listed again at the next use.
    stale: Arc<std::sync::atomic::AtomicBool>,
    /// The secrets Postern gave it (secret environment values and arguments, a remote server's
    /// credential): what the outcome stage masks in its answers. Empty: it holds none, and may
    /// run while the vault is locked.
    secrets: CallSecrets,
    /// It signs in with OAuth: its tokens (which a refresh replaces while it runs) are masked
    /// too, read from its grant at each call.
    signs_in: bool,
}

/// Postern as an upstream's client: hears `notifications/tools/list_changed` (sent unscoped by
/// servers on earlier protocol versions), marks the server's tools stale and tells the agents.
#[derive(Clone)]
struct UpstreamClient {
    stale: Arc<std::sync::atomic::AtomicBool>,
    changes: tokio::sync::broadcast::Sender<()>,
}

impl UpstreamClient {
    fn changed(&self) {
        self.stale.store(true, std::sync::atomic::Ordering::Release);
        let _ = self.changes.send(());
    }
}

impl rmcp::ClientHandler for UpstreamClient {
    /// Postern asks for the newest protocol (servers answer with the newest they share) and
    /// declares no client capabilities: it does not sample, elicit or offer roots for a server.
    fn get_info(&self) -> rmcp::model::ClientConfig {
        let mut config = rmcp::model::ClientConfig::default();
        config.protocol_version = rmcp::model::ProtocolVersion::LATEST;
        config.client_info = rmcp::model::Implementation::new("postern", env!("CARGO_PKG_VERSION"));
        config
    }

    async fn on_tool_list_changed(&self, _context: rmcp::service::NotificationContext<RoleClient>) {
        self.changed();
    }
}

impl Running {
    fn tool_count(&self) -> usize {
        self.listing.lock().unwrap_or_else(std::sync::PoisonError::into_inner).tools.len()
    }

    fn alive(&self) -> bool {
        !self.exited.load(std::sync::atomic::Ordering::Acquire) && !self.service.is_transport_closed()
    }

    /// Stops the server: a stdio server gets SIGTERM, then SIGKILL if it has not exited within
    /// [`STOP_GRACE`]; the MCP session is closed either way (its stdin closes with it).
    async fn stop(&self) {
        if let Some(pid) = self.pid.and_then(|p| rustix::process::Pid::from_raw(p as i32))
            && !self.exited.load(std::sync::atomic::Ordering::Acquire)
        {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
            let deadline = Instant::now() + STOP_GRACE;
            while !self.exited.load(std::sync::atomic::Ordering::Acquire) && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            if !self.exited.load(std::sync::atomic::Ordering::Acquire) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            }
        }
        self.service.cancellation_token().cancel();
    }
}

/// How long a stdio server has to exit after SIGTERM before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(3);

/// One server's start lock and what it knows of its last start.
#[derive(Default)]
struct Slot {
    running: Option<Arc<Running>>,
    last_error: Option<String>,
    /// When the last start failed, and how many failed in a row.
    failed_at: Option<Instant>,
    failures: u32,
}

/// The upstream servers of one gateway: started lazily, restarted after a crash, each on its own.
pub struct Upstreams {
    vault: Arc<Vault>,
    overrides: BTreeMap<String, BTreeMap<String, ToolOverride>>,
    /// One lock per server, held while it starts: a server that hangs while starting delays no
    /// other server's calls.
    slots: Mutex<HashMap<String, Arc<tokio::sync::Mutex<Slot>>>>,
    /// The servers running now, by name: what the catalogue and the outcome stage read.
    live: Mutex<HashMap<String, Arc<Running>>>,
    /// The tools of the running servers, for the synchronous paths (tool lists, the door's lookup).
    catalogue: Mutex<Catalogue>,
    /// Held while the catalogue is rebuilt: two servers that finish starting at once each
    /// rebuild it, and without this the one that read `live` first could store its older view
    /// last, hiding the other's tools until the next change (seen in a loaded CI run:
    /// `import_moves_agent_config_secrets_*` was told `counter__balance` was unknown).
    rebuilding: Mutex<()>,
    /// Fires when an upstream's tools changed: each connected agent is told to list them again.
    changes: tokio::sync::broadcast::Sender<()>,
    /// The result limit: what a server may send in one message (plus framing).
    limit: usize,
    /// What stamps the journal rows of a server's OAuth refreshes.
    clock: postern_core::Clock,
}

impl std::fmt::Debug for Upstreams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upstreams").finish_non_exhaustive()
    }
}

fn locked<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Upstreams {
    /// `overrides`: per server, per upstream tool name, what the owner set in `tools.toml`.
    pub fn new(
        vault: Arc<Vault>,
        overrides: BTreeMap<String, BTreeMap<String, ToolOverride>>,
        clock: postern_core::Clock,
    ) -> Self {
        Upstreams {
            vault,
            overrides,
            slots: Mutex::new(HashMap::new()),
            live: Mutex::new(HashMap::new()),
            catalogue: Mutex::new(Catalogue::default()),
            rebuilding: Mutex::new(()),
            changes: tokio::sync::broadcast::channel(16).0,
            limit: crate::channel::http::DEFAULT_MAX_RESULT_BYTES,
            clock,
        }
    }

    /// Holds what a server may send in one answer to `bytes` (the engine's result limit).
    pub fn with_max_result_bytes(mut self, bytes: usize) -> Self {
        self.limit = bytes;
        self
    }

    /// The most a server may write in one message: the result limit and its framing.
    fn message_limit(&self) -> usize {
        self.limit.saturating_add(FRAMING)
    }

    /// Starts every server that is not running (each at most once per backoff period), all at
    /// once, and waits for them at most `LIST_WAIT`; errors are kept for `status`, never
    /// raised: one broken or slow server does not hide the others.
    pub async fn start_all(self: &Arc<Self>) {
        self.start_where(|_| true).await;
    }

    /// Starts the servers that start with the gateway; the others (`on_first_use`) wait for an
    /// agent to list tools or call one of theirs.
    pub async fn start_with_gateway(self: &Arc<Self>) {
        self.start_where(|s| s.start == postern_vault::ServerStart::WithGateway).await;
    }

    async fn start_where(self: &Arc<Self>, wanted: impl Fn(&McpServer) -> bool) {
        let Ok(servers) = self.vault.mcp_servers() else { return };
        {
            let names: Vec<&str> = servers.iter().map(|s| s.name.as_str()).collect();
            locked(&self.slots).retain(|name, _| names.contains(&name.as_str()));
            locked(&self.live).retain(|name, _| names.contains(&name.as_str()));
        }
        let mut starting = tokio::task::JoinSet::new();
        for server in servers.into_iter().filter(|s| wanted(s)) {
            let this = Arc::clone(self);
            starting.spawn(async move {
                if this.ensure(&server).await.is_ok_and(|(_, fresh)| fresh) {
                    // Agents that listed tools before it was ready list them again.
                    let _ = this.changes.send(());
                }
            });
        }
        let all = async { while starting.join_next().await.is_some() {} };
        if tokio::time::timeout(LIST_WAIT, all).await.is_err() {
            // The slow ones go on in the background (a JoinSet that is dropped aborts its
            // tasks, so it is detached first).
            starting.detach_all();
        }
        if locked(&self.catalogue).tools.is_empty() {
            self.refresh_catalogue();
        }
    }

    /// A client for one server, reporting its tool changes here.
    fn client(&self) -> UpstreamClient {
        UpstreamClient { stale: Arc::default(), changes: self.changes.clone() }
    }

    /// Fires when an upstream server's tools changed.
    pub fn changes(&self) -> tokio::sync::broadcast::Receiver<()> {
        self.changes.subscribe()
    }

    /// The tool an agent named, if a running server offers it. Only tools: a server's tool
    /// named `resources/read` is that tool, and a read is asked for by its kind ([`Upstreams::read`]).
    pub fn tool(&self, name: &str) -> Option<UpstreamTool> {
        locked(&self.catalogue).tools.get(name).cloned()
    }

    /// A read (`resources/read`, `prompts/get`) of the running server `server`, as a read-only
    /// operation the engine executes like a tool: `None` for a tool call or a server not running.
    pub fn read(&self, server: &str, operation: McpOperation) -> Option<UpstreamTool> {
        let catalogue = locked(&self.catalogue);
        (operation != McpOperation::CallTool && catalogue.tools.values().any(|t| t.server == server))
            .then(|| read_operation(server, operation))
    }

    /// Every upstream resource, its URI namespaced (`postern://<server>/<uri>`).
    pub fn resources(&self) -> Vec<rmcp::model::Resource> {
        locked(&self.catalogue).resources.clone()
    }

    /// Every upstream resource template, namespaced like resources (`postern://<server>/<template>`):
    /// a URI an agent expands from one is read like any upstream resource.
    pub fn resource_templates(&self) -> Vec<rmcp::model::ResourceTemplate> {
        locked(&self.catalogue).resource_templates.clone()
    }

    /// Every upstream prompt, named `<server>__<prompt>`.
    pub fn prompts(&self) -> Vec<rmcp::model::Prompt> {
        locked(&self.catalogue).prompts.clone()
    }

    /// Every upstream tool offered now, by name.
    pub fn tools(&self) -> Vec<UpstreamTool> {
        let mut tools: Vec<UpstreamTool> = locked(&self.catalogue).tools.values().cloned().collect();
        tools.sort_by(|a, b| a.name.cmp(&b.name));
        tools
    }

    /// The upstream tool `name` names, starting its server if its tools are
    /// not known yet. The one lookup both the MCP handler and the engine use.
    pub async fn resolve(&self, name: &str) -> Option<UpstreamTool> {
        if !name.contains(SEPARATOR) {
            return None;
        }
        if let Some(t) = self.tool(name) {
            return Some(t);
        }
        self.ensure_server_of(name).await;
        self.tool(name)
    }

    /// Makes sure the server `name` would be for is running, so its tools are known.
    pub async fn ensure_server_of(&self, tool_name: &str) {
        let Some((server, _)) = tool_name.split_once(SEPARATOR) else { return };
        self.ensure_started(server).await;
    }

    /// Starts the server `name` if it is not running (a failure is kept for `status`).
    pub async fn ensure_started(&self, name: &str) {
        let Ok(server) = self.vault.mcp_server(name) else { return };
        // A fresh start has put its tools in the catalogue already (`ensure`).
        let _ = self.ensure(&server).await;
    }

    pub async fn status(&self) -> Vec<ServerStatus> {
        let servers = self.vault.mcp_servers().unwrap_or_default();
        servers
            .iter()
            .map(|s| {
                let slot = self.slot(&s.name);
                let Ok(slot) = slot.try_lock() else {
                    return ServerStatus {
                        name: s.name.clone(),
                        state: "starting".into(),
                        tools: 0,
                        pid: None,
                        last_error: None,
                    };
                };
                let (state, running, last_error) = match &*slot {
                    Slot { running: Some(r), .. } if r.alive() => ("running", Some(r), None),
                    Slot { running: Some(_), .. } => ("crashed", None, Some("the server's process ended".to_owned())),
                    Slot { last_error: Some(e), .. } => ("crashed", None, Some(e.clone())),
                    _ => ("stopped", None, None),
                };
                ServerStatus {
                    name: s.name.clone(),
                    state: state.into(),
                    tools: running.map_or(0, |r| r.tool_count()),
                    pid: running.and_then(|r| r.pid),
                    last_error,
                }
            })
            .collect()
    }

    /// Stops every server (their processes are killed when the last handle goes).
    pub async fn stop_all(&self) {
        let stopping: Vec<Arc<Running>> = locked(&self.live).drain().map(|(_, r)| r).collect();
        locked(&self.slots).clear();
        futures_stop(stopping).await;
        // Under the rebuild lock, like every write of the catalogue: a rebuild that read the
        // servers before they were stopped cannot store their tools after this.
        let _one_at_a_time = locked(&self.rebuilding);
        *locked(&self.catalogue) = Catalogue::default();
    }

    /// The vault was locked: every server holding a secret Postern gave it — a stdio server with
    /// secret environment values or arguments, a remote server reached with a credential — is
    /// stopped (its process ended, its session closed), so no secret outlives the lock in a
    /// process Postern runs. It starts again on the first use after an unlock. Returns how many
    /// were stopped.
    pub async fn stop_holding_secrets(&self) -> usize {
        let stopping: Vec<(String, Arc<Running>)> = {
            let mut live = locked(&self.live);
            let names: Vec<String> =
                live.iter().filter(|(_, r)| !r.secrets.is_empty()).map(|(n, _)| n.clone()).collect();
            names.into_iter().filter_map(|n| live.remove(&n).map(|r| (n, r))).collect()
        };
        if stopping.is_empty() {
            return 0;
        }
        for (name, _) in &stopping {
            // The slot forgets it; a start under way finds the vault locked and fails.
            if let Ok(mut slot) = self.slot(name).try_lock() {
                slot.running = None;
            }
            tracing::info!(server = %name, "vault locked: upstream MCP server holding secrets stopped");
        }
        let count = stopping.len();
        futures_stop(stopping.into_iter().map(|(_, r)| r).collect()).await;
        self.refresh_catalogue();
        let _ = self.changes.send(());
        count
    }

    /// Removes the server `name`: its process stopped first (SIGTERM, then SIGKILL), then its
    /// record and keychain items (journaled).
    pub async fn remove(&self, name: &str, now: postern_core::Timestamp) -> Result<(), VaultError> {
        self.vault.mcp_server(name)?;
        let slot = self.slot(name);
        {
            let mut slot = slot.lock().await;
            locked(&self.live).remove(name);
            if let Some(running) = slot.running.take() {
                running.stop().await;
            }
            locked(&self.slots).remove(name);
        }
        self.refresh_catalogue();
        self.vault.remove_mcp_server(name, now)
    }

    /// Stops the server `name` (a sign-out: it starts again only when it is next used, and then
    /// needs a sign-in).
    pub async fn stop(&self, name: &str) {
        let slot = self.slot(name);
        let mut slot = slot.lock().await;
        locked(&self.live).remove(name);
        if let Some(running) = slot.running.take() {
            running.stop().await;
        }
        drop(slot);
        self.refresh_catalogue();
        let _ = self.changes.send(());
    }

    /// Sets when the server `name` starts (journaled); set to start with the gateway, it is
    /// started now if it is not running.
    pub async fn set_start(
        &self,
        name: &str,
        start: postern_vault::ServerStart,
        now: postern_core::Timestamp,
    ) -> Result<(), VaultError> {
        self.vault.set_mcp_server_start(name, start, now)?;
        if start == postern_vault::ServerStart::WithGateway {
            self.ensure_started(name).await;
        }
        Ok(())
    }

    /// Stops the server `name` and starts it again at once (a failed start is reported, and
    /// retried on next use as after a crash).
    pub async fn restart(&self, name: &str) -> Result<ServerStatus, UpstreamError> {
        let server = self.vault.mcp_server(name)?;
        {
            let slot = self.slot(name);
            let mut slot = slot.lock().await;
            locked(&self.live).remove(name);
            if let Some(running) = slot.running.take() {
                running.stop().await;
            }
            slot.failed_at = None;
            slot.failures = 0;
        }
        let started = self.ensure(&server).await;
        self.refresh_catalogue();
        started.map_err(|message| UpstreamError::Unavailable { server: name.into(), message })?;
        tracing::info!(server = %name, "upstream MCP server restarted");
        self.status()
            .await
            .into_iter()
            .find(|s| s.name == name)
            .ok_or_else(|| VaultError::UnknownMcpServer(name.into()).into())
    }

    /// The owner sets (or, with `None`, clears) the contract of one of `server`'s tools: checked
    /// against the tool's schema (the server is started to list it), kept in the server's vault
    /// record (journaled), and offered to agents at once (they are told the tool list changed).
    /// A tool `tools.toml` decides is refused: the file wins, and two places would disagree.
    pub async fn set_contract(
        &self,
        server: &str,
        tool: &str,
        contract: Option<ToolOverride>,
        now: postern_core::Timestamp,
    ) -> Result<(), UpstreamError> {
        if self.overrides.get(server).is_some_and(|o| o.contains_key(tool)) {
            return Err(UpstreamError::SetInManifest { server: server.into(), tool: tool.into() });
        }
        let def = self.vault.mcp_server(server)?;
        if contract.is_some() {
            let (running, _) = self
                .ensure(&def)
                .await
                .map_err(|message| UpstreamError::Unavailable { server: server.into(), message })?;
            let schema = {
                let listing = locked(&running.listing);
                match listing.tools.iter().find(|t| t.name == tool) {
                    Some(t) => Arc::clone(&t.input_schema),
                    None => {
                        let offered = listing.tools.iter().map(|t| t.name.as_ref()).collect::<Vec<_>>().join(", ");
                        return Err(UpstreamError::UnknownTool { server: server.into(), tool: tool.into(), offered });
                    }
                }
            };
            let properties = schema.get("properties").and_then(Value::as_object);
            if let Some(argument) = contract.as_ref().and_then(|c| c.idempotency_argument.as_ref())
                && !properties.is_some_and(|p| p.contains_key(argument))
            {
                let arguments =
                    properties.map(|p| p.keys().cloned().collect::<Vec<_>>().join(", ")).unwrap_or_default();
                return Err(UpstreamError::NotAnArgument {
                    server: server.into(),
                    tool: tool.into(),
                    argument: argument.clone(),
                    arguments,
                });
            }
        }
        self.vault.set_mcp_tool_contract(server, tool, contract, now)?;
        self.refresh_catalogue();
        let _ = self.changes.send(());
        tracing::info!(%server, %tool, "upstream tool contract set by the owner");
        Ok(())
    }

    /// The contract `server`'s tool `tool` would be held to with the owner's override `over`
    /// (`None`: cleared), and whether it would need a reviewer for every use; `None` when the
    /// server is not running or offers no such tool. `tools.toml` still wins where it decides.
    pub fn contract_with(
        &self,
        server: &str,
        tool: &str,
        over: Option<&ToolOverride>,
    ) -> Option<(ReplayContract, bool)> {
        let running = locked(&self.live).get(server).cloned()?;
        let manifest = self.overrides.get(server).and_then(|o| o.get(tool));
        let over = manifest.or(over);
        let (contract, _) = derive_contract(locked(&running.listing).tools.iter().find(|t| t.name == tool)?, over);
        let server_def = self.vault.mcp_server(server).ok();
        let approve = over.is_some_and(|o| o.approve_every_use) || server_def.is_some_and(|s| s.approve_every_use);
        Some((contract, approve))
    }

    /// The secrets Postern gave the running server `name`, or (while it is starting, restarting
    /// or stopped) those the vault would give it: what the outcome stage masks in what it sends
    /// back, whenever the call's answer arrives. Empty when it holds none, or the vault is locked.
    pub fn secrets_of(&self, name: &str) -> CallSecrets {
        let live = locked(&self.live).get(name).map(|r| (r.secrets.clone(), r.signs_in));
        if let Some((mut secrets, signs_in)) = live {
            // A signed-in server's tokens as they are now (a refresh replaces them mid-run).
            if signs_in && let Ok(server) = self.vault.mcp_server(name) {
                secrets.extend(&crate::channel::oauth::grant_secrets(&self.vault, &server));
            }
            return secrets;
        }
        let Ok(server) = self.vault.mcp_server(name) else { return CallSecrets::default() };
        let mut secrets = crate::channel::oauth::grant_secrets(&self.vault, &server);
        if let Some(credential) = &server.credential
            && let Ok(c) = self.vault.credential(credential)
            && let Ok(secret) = self.vault.secret_of(&c)
        {
            secrets.extend(crate::channel::http::InjectedCredential::new(&c.kind, secret).secrets());
        }
        for (_, value) in self.vault.mcp_server_secrets(&server).unwrap_or_default() {
            secrets.add_vault_secret(value.expose());
        }
        secrets
    }

    fn slot(&self, name: &str) -> Arc<tokio::sync::Mutex<Slot>> {
        Arc::clone(locked(&self.slots).entry(name.to_owned()).or_default())
    }

    /// The running server, started if needed (then `true`: its tools may have changed). Holds
    /// only this server's start lock.
    async fn ensure(&self, server: &McpServer) -> Result<(Arc<Running>, bool), String> {
        let slot = self.slot(&server.name);
        let mut slot = slot.lock().await;
        if let Some(r) = &slot.running {
            if r.alive() && r.stale.swap(false, std::sync::atomic::Ordering::AcqRel) {
                // It said its tools changed: list them again (the catalogue follows), waiting at
                // most LIST_WAIT with this server's start lock held; otherwise it keeps its list.
                let listed = tokio::time::timeout(LIST_WAIT, listing(&r.service, &server.name, &r.secrets))
                    .await
                    .unwrap_or_else(|_| {
                        Err(format!("{:?} did not list its tools within {} s", server.name, LIST_WAIT.as_secs()))
                    });
                match listed {
                    Ok(l) => *locked(&r.listing) = l,
                    Err(e) => {
                        tracing::warn!(server = %server.name, error = %Outside::line(&e), "upstream tools could not be listed again")
                    }
                }
                // Under the start lock, so a call waiting on it finds the new list.
                self.refresh_catalogue();
                return Ok((Arc::clone(r), true));
            }
            if r.alive() {
                return Ok((Arc::clone(r), false));
            }
            slot.running = None;
            locked(&self.live).remove(&server.name);
            slot.last_error = Some("the server's process ended".into());
            tracing::warn!(server = %server.name, "upstream MCP server ended; it is started again on next use");
        }
        if let Some(at) = slot.failed_at {
            let wait =
                RESTART_BACKOFF.saturating_mul(1 << slot.failures.min(5).saturating_sub(1)).min(MAX_RESTART_BACKOFF);
            if at.elapsed() < wait {
                let last = slot.last_error.clone().unwrap_or_default();
                return Err(format!("{last} (next start attempt in {} ms)", (wait - at.elapsed()).as_millis()));
            }
        }
        let started = match tokio::time::timeout(START_TIMEOUT, self.start(server)).await {
            Ok(started) => started,
            Err(_) => Err(format!("{:?} did not finish starting within {} s", server.name, START_TIMEOUT.as_secs())),
        };
        match started {
            Ok(running) => {
                let running = Arc::new(running);
                slot.running = Some(Arc::clone(&running));
                locked(&self.live).insert(server.name.clone(), Arc::clone(&running));
                // Its tools enter the catalogue before the start lock is released: a call that
                // waited on the lock (while a `tools/list` started the server) finds them. (They
                // were added after, by the starter only, and such a call was told the tool was
                // unknown: `hostile::an_upstream_flood_*` in a loaded fresh-clone CI run.)
                self.refresh_catalogue();
                slot.last_error = None;
                slot.failed_at = None;
                slot.failures = 0;
                Ok((running, true))
            }
            Err(e) => {
                tracing::warn!(server = %server.name, error = %Outside::line(&e), "upstream MCP server did not start");
                slot.last_error = Some(e.clone());
                slot.failed_at = Some(Instant::now());
                slot.failures = slot.failures.saturating_add(1);
                Err(e)
            }
        }
    }

    fn refresh_catalogue(&self) {
        let _one_at_a_time = locked(&self.rebuilding);
        let running: Vec<(String, Arc<Running>)> =
            locked(&self.live).iter().map(|(n, r)| (n.clone(), Arc::clone(r))).collect();
        match Catalogue::build(&running, &self.overrides, &self.vault) {
            Ok(catalogue) => *locked(&self.catalogue) = catalogue,
            // Kept as it was (with the owner's settings as last read); the next start or tools
            // change rebuilds it.
            Err(e) => {
                tracing::warn!(error = %e, "upstream catalogue not rebuilt: the servers' records could not be read")
            }
        }
    }
}

/// Stops `servers` side by side (each may take its grace period).
async fn futures_stop(servers: Vec<Arc<Running>>) {
    let mut stopping = tokio::task::JoinSet::new();
    for running in servers {
        stopping.spawn(async move { running.stop().await });
    }
    while stopping.join_next().await.is_some() {}
}

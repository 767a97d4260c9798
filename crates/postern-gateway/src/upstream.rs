//! Upstream MCP servers behind the gateway: each stdio server the owner added to the vault is a
//! child process Postern speaks MCP to as a client (a remote one, a Streamable HTTP endpoint
//! reached with a vault credential). Its tools are offered to agents namespaced
//! (`<server>__<tool>`) with a replay contract derived from their annotations, and a forwarded
//! call's outcome is classified for the journal: never written, answered, or lost in flight.

use postern_core::{AttachWindow, ReplayClass, ReplayContract};
use postern_vault::{McpServer, Sensitive, Vault, VaultError};
use rmcp::{
    ClientServiceExt,
    model::{CallToolRequestParams, Tool as RmcpTool},
    service::{RoleClient, RunningService},
};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};
use tokio::io::AsyncBufReadExt;

/// Separates the server from the tool in the names agents see.
pub const SEPARATOR: &str = "__";
/// Clients refuse tool names longer than this.
pub const MAX_TOOL_NAME: usize = 64;
/// The operations on an upstream that are not tool calls, journaled as read-only executions
/// under `<server>__resources/read` and `<server>__prompts/get` (names no agent can call as tools).
pub const READ_RESOURCE: &str = "resources/read";
pub const GET_PROMPT: &str = "prompts/get";
/// Upstream resources are offered as `postern://<server>/<the server's own URI>`.
pub const RESOURCE_PREFIX: &str = "postern://";

/// The `_meta` key every forwarded `tools/call` carries: the execution it belongs to.
pub const EXECUTION_META: &str = "io.postern/execution_id";
/// How long a server has to start and answer `initialize` and `tools/list`.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a forwarded call may take before its outcome is unknown.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(120);
/// After a failed start, the next attempt waits this long, doubling with each failure up to
/// [`MAX_RESTART_BACKOFF`]. A server that ran and then ended is started again on its next use.
const RESTART_BACKOFF: Duration = Duration::from_secs(1);
const MAX_RESTART_BACKOFF: Duration = Duration::from_secs(30);

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
    /// Where the contract came from: `annotations`, `default` (no annotation said anything),
    /// `tools.toml`, or `owner` (set from the app or `postern servers contract`).
    pub contract_source: &'static str,
    pub approve_every_use: bool,
    /// The upstream's input schema, compiled once (a schema that does not compile checks nothing).
    pub validator: Arc<jsonschema::Validator>,
    /// `tools/call`, or a read ([`READ_RESOURCE`], [`GET_PROMPT`]) that agents reach through
    /// `resources/read` and `prompts/get`, never as a tool.
    pub operation: &'static str,
}

/// What [`derive_contract`] says when an override decided the class; [`Upstreams`] names which
/// (`tools.toml` or `owner`).
const OVERRIDE: &str = "override";

/// Where an upstream tool's contract comes from: the owner's override, else its annotations
/// (only hints from the server, which is why the contract is shown wherever tools are listed).
pub fn derive_contract(tool: &RmcpTool, over: Option<&ToolOverride>) -> (ReplayContract, &'static str) {
    let key_argument = over.and_then(|o| o.idempotency_argument.as_deref());
    let mut secret_fields: BTreeSet<String> = tool
        .input_schema
        .get("properties")
        .and_then(Value::as_object)
        .map(|p| p.keys().filter(|k| secret_argument_name(k)).cloned().collect())
        .unwrap_or_default();
    secret_fields.extend(over.map(|o| o.secret_arguments.iter().cloned()).into_iter().flatten());
    secret_fields.retain(|k| Some(k.as_str()) != key_argument);
    let base = ReplayContract {
        attach_window: AttachWindow::Millis(15 * 60 * 1000),
        secret_fields,
        ..ReplayContract::read_only()
    };
    if let Some(o) = over
        && let Some(class) = o.class
    {
        return (ReplayContract { class, idempotency_argument: o.idempotency_argument.clone(), ..base }, OVERRIDE);
    }
    if let Some(argument) = over.and_then(|o| o.idempotency_argument.clone()) {
        let c = ReplayContract { class: ReplayClass::IdempotencyKey, idempotency_argument: Some(argument), ..base };
        return (c, OVERRIDE);
    }
    let a = tool.annotations.as_ref();
    let hint = |f: fn(&rmcp::model::ToolAnnotations) -> Option<bool>| a.and_then(f) == Some(true);
    if hint(|a| a.read_only_hint) {
        (ReplayContract { class: ReplayClass::ReadOnly, ..base }, "annotations")
    } else if hint(|a| a.idempotent_hint) {
        (ReplayContract { class: ReplayClass::Idempotent, ..base }, "annotations")
    } else {
        (ReplayContract { class: ReplayClass::Irreversible, ..base }, "default")
    }
}

/// Is an upstream tool's name one Postern offers? The MCP tool-name characters only (letters,
/// digits, `_`, `-`, `.`, `/`): a hostile server cannot put control characters, spaces or
/// look-alike Unicode into the names agents and reviewers read.
pub fn tool_name_ok(name: &str) -> bool {
    !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"_-./".contains(&b))
}

/// Is an upstream tool's argument with this name a secret by its name? Narrower than the header
/// rule (`key` alone is a map key, a sort key, a Redis key): tokens, secrets, passwords, API,
/// access and private keys, credentials, authorization values and cookies.
pub fn secret_argument_name(name: &str) -> bool {
    let flat: String = name.chars().filter(|c| c.is_ascii_alphanumeric()).collect::<String>().to_ascii_lowercase();
    [
        "token",
        "secret",
        "password",
        "passwd",
        "pwd",
        "apikey",
        "accesskey",
        "privatekey",
        "credential",
        "authorization",
        "cookie",
    ]
    .iter()
    .any(|part| flat.contains(part))
}

/// What happened to one forwarded call.
#[derive(Debug)]
pub enum UpstreamSent {
    /// Never written to the server: it is not running and could not be started.
    NotSent { reason: String },
    /// The server answered: a tool result (even `isError`) or a JSON-RPC error.
    Answered(UpstreamResult),
    /// Written, and then the server died or went silent before answering.
    Lost { reason: String },
}

/// An upstream's answer, stored as the execution's result.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct UpstreamResult {
    pub server: String,
    pub tool: String,
    /// The `CallToolResult` as the server sent it, or `{"error": …}` for a JSON-RPC error.
    pub upstream_result: Value,
    pub is_error: bool,
}

/// A server's state as `servers list` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerStatus {
    pub name: String,
    /// `running`, `stopped` or `crashed`.
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
}

#[derive(Clone, Default)]
struct Listing {
    tools: Vec<RmcpTool>,
    resources: Vec<rmcp::model::Resource>,
    resource_templates: Vec<rmcp::model::ResourceTemplate>,
    prompts: Vec<rmcp::model::Prompt>,
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

/// What the running servers offer, for the synchronous paths (lists, call preparation).
#[derive(Default)]
struct Catalogue {
    tools: HashMap<String, UpstreamTool>,
    /// Namespaced as agents see them.
    resources: Vec<rmcp::model::Resource>,
    resource_templates: Vec<rmcp::model::ResourceTemplate>,
    prompts: Vec<rmcp::model::Prompt>,
}

#[derive(Default)]
struct Slot {
    running: Option<Arc<Running>>,
    last_error: Option<String>,
    /// When the last start failed, and how many failed in a row.
    failed_at: Option<Instant>,
    failures: u32,
}

/// The upstream servers of one gateway: started lazily, restarted after a crash.
pub struct Upstreams {
    vault: Arc<Vault>,
    overrides: BTreeMap<String, BTreeMap<String, ToolOverride>>,
    slots: tokio::sync::Mutex<HashMap<String, Slot>>,
    /// The tools of the running servers, for the synchronous paths (tool lists, call preparation).
    catalogue: Mutex<Catalogue>,
    /// Fires when an upstream's tools changed: each connected agent is told to list them again.
    changes: tokio::sync::broadcast::Sender<()>,
}

impl std::fmt::Debug for Upstreams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upstreams").finish_non_exhaustive()
    }
}

impl Upstreams {
    /// `overrides`: per server, per upstream tool name, what the owner set in `tools.toml`.
    pub fn new(vault: Arc<Vault>, overrides: BTreeMap<String, BTreeMap<String, ToolOverride>>) -> Self {
        Upstreams {
            vault,
            overrides,
            slots: tokio::sync::Mutex::new(HashMap::new()),
            catalogue: Mutex::new(Catalogue::default()),
            changes: tokio::sync::broadcast::channel(16).0,
        }
    }

    /// Starts every server that is not running (each at most once per backoff period); errors
    /// are kept for `status`, never raised: one broken server does not hide the others.
    pub async fn start_all(&self) {
        self.start_where(|_| true).await;
    }

    /// Starts the servers that start with the gateway; the others (`on_first_use`) wait for an
    /// agent to list tools or call one of theirs.
    pub async fn start_with_gateway(&self) {
        self.start_where(|s| s.start == postern_vault::ServerStart::WithGateway).await;
    }

    async fn start_where(&self, wanted: impl Fn(&McpServer) -> bool) {
        let Ok(servers) = self.vault.mcp_servers() else { return };
        let servers: Vec<McpServer> = servers.into_iter().filter(|s| wanted(s)).collect();
        let mut slots = self.slots.lock().await;
        slots.retain(|name, _| servers.iter().any(|s| &s.name == name));
        let mut started = false;
        for server in servers {
            started |= self.ensure(&mut slots, &server).await.is_ok_and(|(_, fresh)| fresh);
        }
        if started || self.catalogue.lock().unwrap_or_else(std::sync::PoisonError::into_inner).tools.is_empty() {
            self.refresh_catalogue(&slots);
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

    /// The tool an agent named, if a running server offers it; or, for `<server>__resources/read`
    /// and `<server>__prompts/get`, the read-only operation on a running server.
    pub fn tool(&self, name: &str) -> Option<UpstreamTool> {
        let catalogue = self.catalogue.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(t) = catalogue.tools.get(name) {
            return Some(t.clone());
        }
        let (server, operation) = name.split_once(SEPARATOR)?;
        let operation = [READ_RESOURCE, GET_PROMPT].into_iter().find(|o| *o == operation)?;
        catalogue.tools.values().any(|t| t.server == server).then(|| read_operation(server, operation))
    }

    /// Every upstream resource, its URI namespaced (`postern://<server>/<uri>`).
    pub fn resources(&self) -> Vec<rmcp::model::Resource> {
        self.catalogue.lock().unwrap_or_else(std::sync::PoisonError::into_inner).resources.clone()
    }

    /// Every upstream resource template, namespaced like resources (`postern://<server>/<template>`):
    /// a URI an agent expands from one is read like any upstream resource.
    pub fn resource_templates(&self) -> Vec<rmcp::model::ResourceTemplate> {
        self.catalogue.lock().unwrap_or_else(std::sync::PoisonError::into_inner).resource_templates.clone()
    }

    /// Every upstream prompt, named `<server>__<prompt>`.
    pub fn prompts(&self) -> Vec<rmcp::model::Prompt> {
        self.catalogue.lock().unwrap_or_else(std::sync::PoisonError::into_inner).prompts.clone()
    }

    /// Every upstream tool offered now, by name.
    pub fn tools(&self) -> Vec<UpstreamTool> {
        let catalogue = self.catalogue.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut tools: Vec<UpstreamTool> = catalogue.tools.values().cloned().collect();
        tools.sort_by(|a, b| a.name.cmp(&b.name));
        tools
    }

    /// The upstream tool (or read operation) `name` names, starting its server if its tools are
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
        let mut slots = self.slots.lock().await;
        if self.ensure(&mut slots, &server).await.is_ok_and(|(_, fresh)| fresh) {
            self.refresh_catalogue(&slots);
        }
    }

    pub async fn status(&self) -> Vec<ServerStatus> {
        let servers = self.vault.mcp_servers().unwrap_or_default();
        let slots = self.slots.lock().await;
        servers
            .iter()
            .map(|s| {
                let slot = slots.get(&s.name);
                let (state, running, last_error) = match slot {
                    Some(Slot { running: Some(r), .. }) if r.alive() => ("running", Some(r), None),
                    Some(Slot { running: Some(_), .. }) => {
                        ("crashed", None, Some("the server's process ended".to_owned()))
                    }
                    Some(Slot { last_error: Some(e), .. }) => ("crashed", None, Some(e.clone())),
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
        let mut slots = self.slots.lock().await;
        let stopping: Vec<Arc<Running>> = slots.drain().filter_map(|(_, slot)| slot.running).collect();
        futures_stop(stopping).await;
        *self.catalogue.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Catalogue::default();
    }

    /// Removes the server `name`: its process stopped first (SIGTERM, then SIGKILL), then its
    /// record and keychain items (journaled).
    pub async fn remove(&self, name: &str, now: postern_core::Timestamp) -> Result<(), VaultError> {
        self.vault.mcp_server(name)?;
        {
            let mut slots = self.slots.lock().await;
            if let Some(running) = slots.remove(name).and_then(|slot| slot.running) {
                running.stop().await;
            }
            self.refresh_catalogue(&slots);
        }
        self.vault.remove_mcp_server(name, now)
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
            let mut slots = self.slots.lock().await;
            if let Some(running) = slots.remove(name).and_then(|slot| slot.running) {
                running.stop().await;
            }
            let started = self.ensure(&mut slots, &server).await;
            self.refresh_catalogue(&slots);
            started.map_err(|message| UpstreamError::Unavailable { server: name.into(), message })?;
        }
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
        let mut slots = self.slots.lock().await;
        if contract.is_some() {
            let (running, _) = self
                .ensure(&mut slots, &def)
                .await
                .map_err(|message| UpstreamError::Unavailable { server: server.into(), message })?;
            let listing = running.listing.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
            let Some(t) = listing.tools.iter().find(|t| t.name == tool) else {
                let offered = listing.tools.iter().map(|t| t.name.as_ref()).collect::<Vec<_>>().join(", ");
                return Err(UpstreamError::UnknownTool { server: server.into(), tool: tool.into(), offered });
            };
            let properties = t.input_schema.get("properties").and_then(Value::as_object);
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
        self.refresh_catalogue(&slots);
        let _ = self.changes.send(());
        tracing::info!(%server, %tool, "upstream tool contract set by the owner");
        Ok(())
    }

    /// Forwards one call. `arguments` are what the agent sent (with the idempotency argument
    /// filled); `execution` goes into `_meta`.
    pub async fn call(
        &self,
        server: &str,
        tool: &str,
        arguments: Map<String, Value>,
        execution: &str,
        timeout: Duration,
    ) -> UpstreamSent {
        let running = {
            let Ok(def) = self.vault.mcp_server(server) else {
                return UpstreamSent::NotSent { reason: format!("no MCP server named {server:?} in the vault") };
            };
            let mut slots = self.slots.lock().await;
            match self.ensure(&mut slots, &def).await {
                Ok((r, fresh)) => {
                    if fresh {
                        self.refresh_catalogue(&slots);
                    }
                    r
                }
                Err(reason) => return UpstreamSent::NotSent { reason },
            }
        };
        let meta = json!({ EXECUTION_META: execution });
        if tool == READ_RESOURCE || tool == GET_PROMPT {
            return read(&running, server, tool, arguments, meta, timeout).await;
        }
        let params = json!({ "name": tool, "arguments": arguments, "_meta": meta });
        let params: CallToolRequestParams = match serde_json::from_value(params) {
            Ok(p) => p,
            Err(e) => return UpstreamSent::NotSent { reason: format!("the request could not be built: {e}") },
        };
        let answer = tokio::time::timeout(timeout, running.service.peer().call_tool(params)).await;
        let answered = |upstream_result: Value, is_error: bool| {
            UpstreamSent::Answered(UpstreamResult {
                server: server.into(),
                tool: tool.into(),
                upstream_result,
                is_error,
            })
        };
        match answer {
            Ok(Ok(result)) => {
                let is_error = result.is_error == Some(true);
                answered(serde_json::to_value(&result).unwrap_or(Value::Null), is_error)
            }
            Ok(Err(rmcp::ServiceError::McpError(e))) => answered(json!({ "error": e }), true),
            Ok(Err(rmcp::ServiceError::UnexpectedResponse)) => answered(
                json!({ "error": { "message": "the server asked for input or started a task; Postern forwards only \
                                               final tool results" } }),
                true,
            ),
            Ok(Err(e)) => {
                UpstreamSent::Lost { reason: format!("the connection to {server:?} ended before it answered: {e}") }
            }
            Err(_) => {
                UpstreamSent::Lost { reason: format!("{server:?} did not answer within {} s", timeout.as_secs()) }
            }
        }
    }

    /// The running server, started if needed (then `true`: its tools may have changed).
    async fn ensure(
        &self,
        slots: &mut HashMap<String, Slot>,
        server: &McpServer,
    ) -> Result<(Arc<Running>, bool), String> {
        let slot = slots.entry(server.name.clone()).or_default();
        if let Some(r) = &slot.running {
            if r.alive() && r.stale.swap(false, std::sync::atomic::Ordering::AcqRel) {
                // It said its tools changed: list them again (the catalogue follows).
                match listing(&r.service, &server.name).await {
                    Ok(l) => *r.listing.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = l,
                    Err(e) => {
                        tracing::warn!(server = %server.name, error = %e, "upstream tools could not be listed again")
                    }
                }
                return Ok((Arc::clone(r), true));
            }
            if r.alive() {
                return Ok((Arc::clone(r), false));
            }
            slot.running = None;
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
                slot.last_error = None;
                slot.failed_at = None;
                slot.failures = 0;
                Ok((running, true))
            }
            Err(e) => {
                tracing::warn!(server = %server.name, error = %e, "upstream MCP server did not start");
                slot.last_error = Some(e.clone());
                slot.failed_at = Some(Instant::now());
                slot.failures = slot.failures.saturating_add(1);
                Err(e)
            }
        }
    }

    async fn start(&self, server: &McpServer) -> Result<Running, String> {
        match &server.url {
            Some(url) => self.start_remote(server, url).await,
            None => self.start_stdio(server).await,
        }
    }

    /// A remote Streamable HTTP server, its credential (if any) injected as its header on every
    /// request; the URL must pass the same target rules as an HTTP tool's, and the credential's
    /// binding must allow it.
    async fn start_remote(&self, server: &McpServer, url: &str) -> Result<Running, String> {
        use rmcp::transport::{
            StreamableHttpClientTransport, streamable_http_client::StreamableHttpClientTransportConfig,
        };
        let name = &server.name;
        let parsed = url::Url::parse(url).map_err(|e| format!("{name:?}: the URL {url:?} does not parse: {e}"))?;
        crate::http::check_target(&parsed).map_err(|e| format!("{name:?}: {e}"))?;
        let mut headers = HashMap::new();
        if let Some(credential) = &server.credential {
            let c = self.vault.credential(credential).map_err(|e| format!("{name:?} cannot start: {e}"))?;
            if !c.allows(&parsed) {
                return Err(format!("{name:?}: credential {credential:?} is not bound to {url}"));
            }
            let secret = self.vault.secret_of(&c).map_err(|e| format!("{name:?} cannot start: {e}"))?;
            let injected = crate::http::InjectedCredential::new(&c.kind, secret);
            let header = http::HeaderName::from_bytes(injected.header.as_bytes())
                .map_err(|_| format!("{name:?}: {:?} is not a header name", injected.header))?;
            let mut value = http::HeaderValue::from_str(injected.value.expose())
                .map_err(|_| format!("{name:?}: credential {credential:?} cannot be a header value"))?;
            value.set_sensitive(true);
            headers.insert(header, value);
        }
        let config = StreamableHttpClientTransportConfig::with_uri(url).custom_headers(headers);
        let transport = StreamableHttpClientTransport::with_client(crate::http::client(), config);
        let service = self
            .client()
            .serve_with_lifecycle(transport, lifecycle())
            .await
            .map_err(|e| format!("{name:?} did not complete MCP initialization: {e}"))?;
        let running = listed(service, None, name).await?;
        tracing::info!(server = %name, tools = running.tool_count(), %url, "remote upstream MCP server connected");
        Ok(running)
    }

    async fn start_stdio(&self, server: &McpServer) -> Result<Running, String> {
        let secrets = self
            .vault
            .mcp_server_secrets(server)
            .map_err(|e: VaultError| format!("{:?} cannot start: {e}", server.name))?;
        let mut command = child_command(server, &secrets);
        let mut child =
            command.spawn().map_err(|e| format!("{:?} could not be started ({}): {e}", server.name, server.command))?;
        drop(secrets);
        let pid = child.id();
        let (Some(stdout), Some(stdin)) = (child.stdout.take(), child.stdin.take()) else {
            return Err("the server's standard streams were not available".into());
        };
        if let Some(stderr) = child.stderr.take() {
            let name = server.name.clone();
            tokio::spawn(async move {
                let mut lines = tokio::io::BufReader::new(stderr).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    tracing::info!(server = %name, "upstream stderr: {line}");
                }
            });
        }
        // The child is owned by a task that reaps it once the transport is gone (kill on drop).
        let service = self
            .client()
            .serve_with_lifecycle((stdout, stdin), lifecycle())
            .await
            .map_err(|e| format!("{:?} did not complete MCP initialization: {e}", server.name))?;
        let running = listed(service, pid, &server.name).await?;
        let exited = Arc::clone(&running.exited);
        tokio::spawn(async move {
            let _ = child.wait().await;
            exited.store(true, std::sync::atomic::Ordering::Release);
        });
        tracing::info!(server = %server.name, tools = running.tool_count(), pid, "upstream MCP server started");
        Ok(running)
    }

    fn refresh_catalogue(&self, slots: &HashMap<String, Slot>) {
        let mut catalogue = HashMap::new();
        let (mut resources, mut resource_templates, mut prompts) = (Vec::new(), Vec::new(), Vec::new());
        for (server, slot) in slots {
            let Some(running) = &slot.running else { continue };
            let listing = running.listing.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
            for r in &listing.resources {
                let mut r = r.clone();
                r.uri = format!("{RESOURCE_PREFIX}{server}/{}", r.uri);
                r.name = format!("{server}{SEPARATOR}{}", r.name);
                resources.push(r);
            }
            for t in &listing.resource_templates {
                let mut t = t.clone();
                t.uri_template = format!("{RESOURCE_PREFIX}{server}/{}", t.uri_template);
                t.name = format!("{server}{SEPARATOR}{}", t.name);
                resource_templates.push(t);
            }
            for p in &listing.prompts {
                let mut p = p.clone();
                p.name = format!("{server}{SEPARATOR}{}", p.name);
                prompts.push(p);
            }
            let overrides = self.overrides.get(server);
            let server_def = self.vault.mcp_server(server).ok();
            for t in &listing.tools {
                let name = format!("{server}{SEPARATOR}{}", t.name);
                if name.len() > MAX_TOOL_NAME || !tool_name_ok(&t.name) {
                    tracing::warn!(%server, tool = %t.name.escape_debug(), "upstream tool not offered: its name is not 1–64 characters of letters, digits, `_`, `-`, `.` or `/` once namespaced");
                    continue;
                }
                // tools.toml is the file the owner keeps under version control: it wins over a
                // setting made in the app, which refuses to edit a tool the file decides.
                let (over, source) = match overrides.and_then(|o| o.get(t.name.as_ref())) {
                    Some(o) => (Some(o), "tools.toml"),
                    None => (server_def.as_ref().and_then(|s| s.tools.get(t.name.as_ref())), "owner"),
                };
                let (contract, contract_source) = derive_contract(t, over);
                let contract_source = if contract_source == OVERRIDE { source } else { contract_source };
                let input_schema = Value::Object((*t.input_schema).clone());
                let validator = jsonschema::validator_for(&input_schema).unwrap_or_else(|e| {
                    tracing::warn!(%server, tool = %t.name, error = %e, "upstream input schema does not compile; arguments are not checked");
                    jsonschema::validator_for(&json!({})).expect("the empty schema compiles")
                });
                catalogue.insert(
                    name.clone(),
                    UpstreamTool {
                        server: server.clone(),
                        tool: t.name.to_string(),
                        name,
                        description: t.description.as_deref().unwrap_or_default().to_owned(),
                        input_schema,
                        contract,
                        contract_source,
                        approve_every_use: over.is_some_and(|o| o.approve_every_use)
                            || server_def.as_ref().is_some_and(|s| s.approve_every_use),
                        validator: Arc::new(validator),
                        operation: "tools/call",
                    },
                );
            }
        }
        resources.sort_by(|a, b| a.uri.cmp(&b.uri));
        resource_templates.sort_by(|a, b| a.uri_template.cmp(&b.uri_template));
        prompts.sort_by(|a, b| a.name.cmp(&b.name));
        *self.catalogue.lock().unwrap_or_else(std::sync::PoisonError::into_inner) =
            Catalogue { tools: catalogue, resources, resource_templates, prompts };
    }
}

/// How Postern opens a session with an upstream: `server/discover` for protocol 2026-07-28
/// (where tool changes reach a client through `subscriptions/listen`), falling back to the
/// `initialize` handshake with a server that does not know it.
fn lifecycle() -> rmcp::ClientLifecycleMode {
    rmcp::ClientLifecycleMode::Auto {
        preferred_versions: vec![rmcp::model::ProtocolVersion::V_2026_07_28],
        legacy_version: Some(rmcp::model::ProtocolVersion::V_2025_11_25),
    }
}

/// A server's tools, resources and prompts (the last two where it advertises them).
async fn listing(service: &RunningService<RoleClient, UpstreamClient>, name: &str) -> Result<Listing, String> {
    let peer = service.peer();
    let tools = peer.list_all_tools().await.map_err(|e| format!("{name:?} tools/list: {e}"))?;
    let capabilities = peer.peer_info().map(|i| i.capabilities.clone()).unwrap_or_default();
    let resources = match capabilities.resources {
        Some(_) => peer.list_all_resources().await.map_err(|e| format!("{name:?} resources/list: {e}"))?,
        None => vec![],
    };
    // Templates are optional even for a server with resources: one that does not answer this
    // simply offers none.
    let resource_templates = match capabilities.resources {
        Some(_) => peer.list_all_resource_templates().await.unwrap_or_else(|e| {
            tracing::debug!(server = %name, error = %e, "no resource templates");
            vec![]
        }),
        None => vec![],
    };
    let prompts = match capabilities.prompts {
        Some(_) => peer.list_all_prompts().await.map_err(|e| format!("{name:?} prompts/list: {e}"))?,
        None => vec![],
    };
    Ok(Listing { tools, resources, resource_templates, prompts })
}

/// A freshly initialized server, listed; on protocol 2026-07-28 (where a tools change reaches a
/// client only through `subscriptions/listen`) Postern listens for it.
async fn listed(
    service: RunningService<RoleClient, UpstreamClient>,
    pid: Option<u32>,
    name: &str,
) -> Result<Running, String> {
    let listing = listing(&service, name).await?;
    let client = service.service().clone();
    let announces = service
        .peer()
        .peer_info()
        .is_some_and(|i| i.capabilities.tools.as_ref().is_some_and(|t| t.list_changed == Some(true)));
    let modern =
        service.peer().peer_info().is_some_and(|i| i.protocol_version == rmcp::model::ProtocolVersion::V_2026_07_28);
    let version = service.peer().peer_info().map(|i| i.protocol_version.to_string()).unwrap_or_default();
    tracing::info!(server = %name, protocol = %version, tools_list_changed = announces, "upstream MCP session");
    if announces && modern {
        let filter = rmcp::model::SubscriptionFilter::builder().tools_list_changed().build();
        match service.peer().listen(filter).await {
            Ok(mut subscription) => {
                let client = client.clone();
                tokio::spawn(async move {
                    while let Ok(Some(notification)) = subscription.next().await {
                        if matches!(notification, rmcp::model::ServerNotification::ToolListChangedNotification(_)) {
                            client.changed();
                        }
                    }
                });
            }
            Err(e) => tracing::warn!(server = %name, error = %e, "could not listen for the server's tool changes"),
        }
    }
    Ok(Running { service, listing: Mutex::new(listing), pid, exited: Arc::default(), stale: Arc::clone(&client.stale) })
}

/// The read-only operation `operation` on `server`, as the engine runs it.
fn read_operation(server: &str, operation: &'static str) -> UpstreamTool {
    static ANY: std::sync::LazyLock<Arc<jsonschema::Validator>> = std::sync::LazyLock::new(|| {
        Arc::new(jsonschema::validator_for(&json!({})).expect("the empty schema compiles"))
    });
    UpstreamTool {
        server: server.to_owned(),
        tool: operation.to_owned(),
        name: format!("{server}{SEPARATOR}{operation}"),
        description: format!("{operation} on MCP server {server}"),
        input_schema: json!({ "type": "object" }),
        contract: ReplayContract::read_only(),
        contract_source: "default",
        approve_every_use: false,
        validator: Arc::clone(&ANY),
        operation,
    }
}

/// `resources/read` (`arguments.uri`) or `prompts/get` (`arguments.name`, `arguments.arguments`).
async fn read(
    running: &Running,
    server: &str,
    operation: &str,
    arguments: Map<String, Value>,
    meta: Value,
    timeout: Duration,
) -> UpstreamSent {
    let mut params = Value::Object(arguments);
    params["_meta"] = meta;
    let answer = if operation == READ_RESOURCE {
        match serde_json::from_value::<rmcp::model::ReadResourceRequestParams>(params) {
            Ok(p) => tokio::time::timeout(timeout, running.service.read_resource(p)).await.map(|r| r.map(|r| json!(r))),
            Err(e) => return UpstreamSent::NotSent { reason: format!("the request could not be built: {e}") },
        }
    } else {
        match serde_json::from_value::<rmcp::model::GetPromptRequestParams>(params) {
            Ok(p) => tokio::time::timeout(timeout, running.service.get_prompt(p)).await.map(|r| r.map(|r| json!(r))),
            Err(e) => return UpstreamSent::NotSent { reason: format!("the request could not be built: {e}") },
        }
    };
    let answered = |upstream_result: Value, is_error: bool| {
        UpstreamSent::Answered(UpstreamResult {
            server: server.into(),
            tool: operation.into(),
            upstream_result,
            is_error,
        })
    };
    match answer {
        Ok(Ok(result)) => answered(result, false),
        Ok(Err(rmcp::ServiceError::McpError(e))) => answered(json!({ "error": e }), true),
        Ok(Err(e)) => {
            UpstreamSent::Lost { reason: format!("the connection to {server:?} ended before it answered: {e}") }
        }
        Err(_) => UpstreamSent::Lost { reason: format!("{server:?} did not answer within {} s", timeout.as_secs()) },
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

/// The child's command: only the declared environment and a minimal PATH/HOME/LANG, never
/// Postern's own environment; stdout is the MCP stream, stderr goes to Postern's log.
fn child_command(server: &McpServer, secrets: &[(String, Sensitive<String>)]) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(&server.command);
    command.args(&server.args).env_clear();
    for key in ["PATH", "HOME", "LANG"] {
        if let Some(v) = std::env::var_os(key) {
            command.env(key, v);
        }
    }
    command.envs(&server.env);
    for (k, v) in secrets {
        command.env(k, v.expose());
    }
    command
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    command
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmcp::model::ToolAnnotations;

    fn tool(annotations: Option<ToolAnnotations>) -> RmcpTool {
        let mut t = RmcpTool::new("t", "a tool", Arc::new(Map::new()));
        t.annotations = annotations;
        t
    }

    #[test]
    fn contracts_follow_annotations_unless_the_owner_overrides_them() {
        let class = |t: &RmcpTool, o: Option<&ToolOverride>| derive_contract(t, o).0.class;
        assert_eq!(class(&tool(None), None), ReplayClass::Irreversible);
        assert_eq!(class(&tool(Some(ToolAnnotations::new().read_only(true))), None), ReplayClass::ReadOnly);
        assert_eq!(class(&tool(Some(ToolAnnotations::new().idempotent(true))), None), ReplayClass::Idempotent);
        // A destructive hint alongside idempotent is still idempotent: repeating has no extra effect.
        let both = ToolAnnotations::new().idempotent(true).destructive(true);
        assert_eq!(class(&tool(Some(both)), None), ReplayClass::Idempotent);
        // The owner's word beats the server's hints, both ways.
        let keyed = ToolOverride { idempotency_argument: Some("idempotencyKey".into()), ..Default::default() };
        let (c, source) = derive_contract(&tool(Some(ToolAnnotations::new().read_only(true))), Some(&keyed));
        assert_eq!(
            (c.class, c.idempotency_argument.as_deref(), source),
            (ReplayClass::IdempotencyKey, Some("idempotencyKey"), "override")
        );
        let distrust = ToolOverride { class: Some(ReplayClass::Irreversible), ..Default::default() };
        assert_eq!(
            class(&tool(Some(ToolAnnotations::new().read_only(true))), Some(&distrust)),
            ReplayClass::Irreversible
        );
        for (name, ok) in [
            ("create_issue", true),
            ("files/read.v2", true),
            ("", false),
            ("pay\u{1b}[2J", false),
            ("pay now", false),
            ("p\u{430}y", false),
            ("a\u{202e}b", false),
            ("$(id)", false),
        ] {
            assert_eq!(tool_name_ok(name), ok, "{name:?}");
        }
        for (name, secret) in [
            ("api_key", true),
            ("GITHUB_TOKEN", true),
            ("private-key", true),
            ("key", false),
            ("keyword", false),
            ("sort_key", false),
            ("passwd", true),
        ] {
            assert_eq!(secret_argument_name(name), secret, "{name}");
        }
        // Arguments named like secrets, and those the owner names, are the contract's secrets.
        let mut with_token = tool(None);
        with_token.input_schema = Arc::new(
            json!({ "properties": { "api_token": {}, "amount": {}, "memo": {}, "idempotencyKey": {} } })
                .as_object()
                .cloned()
                .unwrap_or_default(),
        );
        let memo = ToolOverride { secret_arguments: ["memo".into()].into(), ..keyed.clone() };
        let (c, _) = derive_contract(&with_token, Some(&memo));
        assert_eq!(c.secret_fields, ["api_token".to_owned(), "memo".to_owned()].into(), "the key is not a secret");
        for (t, o) in [(tool(None), None), (tool(None), Some(&keyed))] {
            let (c, _) = derive_contract(&t, o);
            c.validate("t", postern_core::Channel::Mcp).expect("derived contracts are valid");
        }
    }
}

//! The MCP face of the engine (rmcp `ServerHandler`): tools with annotations derived from their
//! replay contracts, tool results that always carry the execution's identity and state, and
//! `execution_status` so an agent can ask instead of retrying (docs/src/design.md, identifiers, retry decisions).

use crate::{
    caller::identity::ExecutableHashes,
    caller::runs::{AgentRuns, Caller, RunLease},
    delivery::DeliveryTicket,
};
use postern_core::{ErrorCode as _, ExecutionId, ExecutionState, McpOperation};
use postern_engine::{
    Engine,
    catalog::manifest::{HTTP_REQUEST, SSH_EXEC},
};
use rmcp::{
    ErrorData as McpError, RoleServer, ServerHandler,
    model::{
        CallToolRequestParams, CallToolResponse, CallToolResult, CancelledNotificationParam, ContentBlock as Content,
        Implementation, ListToolsResult, PaginatedRequestParams, ProtocolVersion, ServerCapabilities, ServerConfig,
    },
    service::{NotificationContext, RequestContext},
};
use serde_json::{Value, json};
use std::{
    borrow::Cow,
    collections::HashMap,
    sync::{Arc, Mutex},
};

pub use postern_engine::catalog::manifest::EXECUTION_STATUS;
mod correlation;
mod listing;
pub use crate::delivery::{
    pending::PendingResponses,
    result::{execution_report, outcome_result},
};
use crate::delivery::{
    pending::request_key,
    result::{error_result, explain, has_result},
};
pub use listing::{annotations, tool_list};

/// The request methods MCP defines for a client (2025-11-25 and 2026-07-28).
#[rustfmt::skip]
const MCP_METHODS: &[&str] = &[
    "initialize", "ping", "tools/list", "tools/call", "resources/list", "resources/read",
    "resources/templates/list", "resources/subscribe", "resources/unsubscribe", "prompts/list",
    "prompts/get", "completion/complete", "logging/setLevel", "tasks/get", "tasks/list",
    "tasks/cancel", "tasks/result", "subscriptions/listen",
];
/// The protocol revisions Postern implements.
pub const PROTOCOL_VERSIONS: &[ProtocolVersion] =
    &[ProtocolVersion::V_2026_07_28, ProtocolVersion::V_2025_11_25, ProtocolVersion::V_2025_06_18];

/// What every connection shares: the engine, the run registry, the executable hash cache, and
/// the executions in flight (which a shutdown waits for).
pub struct Gateway {
    pub engine: Arc<Engine>,
    pub store: Arc<postern_store::Store>,
    pub clock: postern_engine::engine::Clock,
    pub runs: Arc<AgentRuns>,
    pub hashes: Arc<ExecutableHashes>,
    pub executions: tokio_util::task::TaskTracker,
    /// Journals requests for what is not offered (possible self-approval attempts).
    pub refusals: Arc<crate::door::refusal::Refusals>,
    /// The task calls running in this process, by the execution that answers them: what
    /// `tasks/cancel` raises (every call following that execution). A task's status is never
    /// kept here: it is read from the journal.
    pub tasks: Mutex<HashMap<ExecutionId, Vec<postern_engine::CancelSignal>>>,
    /// When this process started: an execution left before it, not sent, runs no more.
    pub started_at: postern_core::Timestamp,
}

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway").field("engine", &self.engine).finish_non_exhaustive()
    }
}

impl Gateway {
    pub fn new(
        engine: Arc<Engine>,
        store: Arc<postern_store::Store>,
        clock: postern_engine::engine::Clock,
        runs: Arc<AgentRuns>,
    ) -> Arc<Self> {
        let refusals = crate::door::refusal::Refusals::new(Arc::clone(&store), Arc::clone(&clock));
        let started_at = clock();
        Arc::new(Gateway {
            engine,
            store,
            clock,
            runs,
            hashes: Arc::new(ExecutableHashes::default()),
            executions: tokio_util::task::TaskTracker::new(),
            refusals,
            tasks: Mutex::new(HashMap::new()),
            started_at,
        })
    }
}

/// What the Streamable HTTP layer attaches to each request (read back from `http::request::Parts`).
#[derive(Debug, Clone)]
pub struct HttpCaller {
    pub caller: Caller,
    pub ticket: DeliveryTicket,
    /// Raised when a 2026-07-28 client closes the request's response stream before its answer:
    /// that revision makes a closed stream the request's cancellation (there is no resumption).
    pub abandoned: postern_engine::CancelSignal,
    /// Released when the call's answer must be opened (its stream's head and priming event
    /// sent) rather than held for the answer: see [`postern_engine::Opening`].
    pub opening: postern_engine::Opening,
}

/// A call's place among the session's calls in flight, given up however the call ends.
struct InFlight<'a> {
    calls: &'a Mutex<HashMap<String, postern_engine::CancelSignal>>,
    key: String,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if let Ok(mut m) = self.calls.lock() {
            m.remove(&self.key);
        }
    }
}

/// One MCP connection (stdio bridge) or MCP session (Streamable HTTP).
#[derive(Debug)]
pub struct PosternMcp {
    gateway: Arc<Gateway>,
    /// Known at connect time for the stdio bridge; per request for HTTP.
    caller: Option<Caller>,
    pending: Option<Arc<PendingResponses>>,
    lease: tokio::sync::Mutex<Option<RunLease>>,
    in_flight: Mutex<HashMap<String, postern_engine::CancelSignal>>,
}

impl PosternMcp {
    /// A stdio-bridge connection whose caller the kernel identified.
    pub fn for_connection(gateway: Arc<Gateway>, caller: Caller, pending: Arc<PendingResponses>) -> Self {
        PosternMcp {
            gateway,
            caller: Some(caller),
            pending: Some(pending),
            lease: tokio::sync::Mutex::new(None),
            in_flight: Mutex::new(HashMap::new()),
        }
    }

    /// A Streamable HTTP session: caller and delivery ticket come with each request.
    pub fn for_http(gateway: Arc<Gateway>) -> Self {
        PosternMcp {
            gateway,
            caller: None,
            pending: None,
            lease: tokio::sync::Mutex::new(None),
            in_flight: Mutex::new(HashMap::new()),
        }
    }

    fn http_context(context: &RequestContext<RoleServer>) -> Option<HttpCaller> {
        context.extensions.get::<http::request::Parts>()?.extensions.get::<HttpCaller>().cloned()
    }

    fn caller_and_ticket(&self, context: &RequestContext<RoleServer>) -> Result<(Caller, DeliveryTicket), McpError> {
        if let (Some(caller), Some(pending)) = (&self.caller, &self.pending) {
            return Ok((caller.clone(), pending.open(&context.id, &self.gateway.engine)));
        }
        let http = Self::http_context(context)
            .ok_or_else(|| McpError::internal_error("the request carries no caller identity", None))?;
        Ok((http.caller, http.ticket))
    }

    /// Journals a request for something this gateway does not offer.
    async fn refused(&self, caller: &Caller, attempted: String) {
        let peer = json!({
            "actor": caller.actor().as_str(),
            "pid": caller.process.as_ref().map(|p| p.key.pid),
        });
        let interface = match caller.transport {
            crate::caller::runs::Transport::Stdio => "mcp:stdio",
            crate::caller::runs::Transport::StreamableHttp => "mcp:streamable_http",
        };
        self.gateway.refusals.record_async(crate::door::refusal::Refused { interface, attempted, peer }).await;
    }

    async fn run_for(
        &self,
        caller: &Caller,
        context: &RequestContext<RoleServer>,
    ) -> Result<std::sync::Arc<crate::caller::runs::AgentRun>, McpError> {
        let mut lease = self.lease.lock().await;
        if let Some(l) = lease.as_ref() {
            return Ok(Arc::clone(&l.run));
        }
        let client = context.peer.peer_info().map(|info| {
            let i = &info.client_info;
            format!("{} {}", i.name, i.version)
        });
        let joined = self.gateway.runs.join(caller, client).await.map_err(|e| {
            McpError::internal_error(format!("could not journal the agent run: {e}"), Some(json!({ "code": e.code() })))
        })?;
        let run = Arc::clone(&joined.run);
        // Through a `postern mcp` bridge, or with an agent token: an agent's run (a connection
        // that never announced a bridge is `postern call`, a person's command, or a raw client).
        let bridged = self.pending.as_ref().is_some_and(|p| p.is_bridge());
        if bridged || caller.transport == crate::caller::runs::Transport::StreamableHttp {
            run.spoke_as_agent();
        }
        *lease = Some(joined);
        Ok(run)
    }

    /// A `tools/call`. From a client that declared the tasks extension, a side-effecting call
    /// is answered with a task as soon as it is bound to an execution on record (its ID is the
    /// execution's); the execution runs on, and `tasks/get` answers from the journal.
    async fn call(
        &self,
        params: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let (caller, ticket) = self.caller_and_ticket(&context)?;
        let as_task = context.client_capabilities().is_some_and(|c| c.supports_tasks());
        let name = params.name.to_string();
        let arguments = Value::Object(params.arguments.unwrap_or_default());
        if name == EXECUTION_STATUS {
            return Ok(CallToolResponse::Complete(self.execution_status(&caller, &arguments).await));
        }
        // Only tools: an upstream's resources and prompts are reached as themselves.
        // Looked up once: the call carries the tool the agent is told exists.
        let upstream = match self.gateway.engine.upstreams() {
            Some(u) if self.gateway.engine.manifest().tool(&name).is_none() => {
                u.resolve(&name).await.filter(|t| t.operation == McpOperation::CallTool)
            }
            _ => None,
        };
        if name != HTTP_REQUEST
            && name != SSH_EXEC
            && upstream.is_none()
            && self.gateway.engine.manifest().tool(&name).is_none()
        {
            if let Some(needed) = match self.gateway.engine.upstreams() {
                Some(u) => u.sign_in_needed(&name).await,
                None => None,
            } {
                let message = needed.to_string();
                return Ok(CallToolResponse::Complete(crate::delivery::result::error_result(
                    "oauth_login_required",
                    &message,
                )));
            }
            self.refused(&caller, format!("tools/call {name}")).await;
            return Err(McpError::invalid_params(
                format!("unknown tool {name:?}: see tools/list"),
                Some(json!({ "code": "unknown_tool" })),
            ));
        }
        let key = request_key(&context.id);
        // A 2026-07-28 stream closed before its answer (a task's handle included) cancels it.
        let http = Self::http_context(&context);
        let cancel = http.as_ref().map(|http| http.abandoned.clone()).unwrap_or_default();
        // One call per id at a time on a session: a cancellation names its request by id. (The
        // socket's transport refuses a reused id before it gets here.)
        let fresh = self.in_flight.lock().is_ok_and(|mut m| match m.entry(key.clone()) {
            std::collections::hash_map::Entry::Occupied(_) => false,
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert(cancel.clone());
                true
            }
        });
        if !fresh {
            return Err(McpError::invalid_request(
                format!(
                    "request id {key} is still in flight on this session: give every request an id of its own; this call was not run"
                ),
                Some(json!({ "code": "request_id_in_use" })),
            ));
        }
        let _in_flight = InFlight { calls: &self.in_flight, key: key.clone() };
        let run = self.run_for(&caller, &context).await?;
        let call = postern_engine::Call {
            tool: name,
            arguments,
            actor: run.actor.clone(),
            intent_scope: run.intent_scope(),
            session: Some(run.session),
            correlation: correlation::of(&caller, &run, &context),
            cancel: cancel.clone(),
            bound: if as_task { postern_engine::Bound::for_task() } else { postern_engine::Bound::default() },
            resolved: upstream,
            opening: http.map(|http| http.opening).unwrap_or_default(),
        };
        let bound = call.bound.clone();
        // The engine runs in its own task: a dropped connection must not abandon an execution
        // half-way; its outcome is journaled and waits for the retry.
        let engine = Arc::clone(&self.gateway.engine);
        let withdrawn = cancel.clone();
        let mut task = self.gateway.executions.spawn(async move {
            let result = engine.call(call).await;
            // Withdrawn by the client (`notifications/cancelled`, a closed 2026-07-28 stream,
            // `tasks/cancel`), perhaps after its request went: here, not in the handler, which
            // may be gone with the connection by now. Looked at once; the handler uses the same.
            let was_withdrawn = withdrawn.is_cancelled();
            if let Ok(o) = &result
                && was_withdrawn
            {
                if o.state != ExecutionState::FailedBeforeDispatch {
                    let _ = engine.cancel_requested(o.execution_id, None, !withdrawn.withdrawn()).await;
                }
                if has_result(o.state) && !o.read_only && !as_task {
                    // The client discards this answer whatever the transport does with it: the
                    // result is on record and not delivered. (A task's is fetched later.)
                    let _ = engine.delivered(o.execution_id, false).await;
                }
            }
            (result, was_withdrawn)
        });
        let joined = if as_task {
            let mut bound_to = bound.watch();
            tokio::select! {
                biased;
                Ok(id) = bound_to.wait_for(Option::is_some) => {
                    let id = (*id).unwrap_or_else(|| unreachable!("waited for Some"));
                    return Ok(CallToolResponse::Task(self.follow_as_task(id, cancel, task)));
                }
                joined = &mut task => joined,
            }
        } else {
            task.await
        };
        let (joined, was_withdrawn) = match joined {
            Ok((result, was_withdrawn)) => (Ok(result), was_withdrawn),
            Err(e) => (Err(e), false),
        };
        let outcome = match joined {
            Ok(Ok(outcome)) => outcome,
            Ok(Err(e)) => {
                let mut r = error_result(e.code(), &e.to_string());
                if let (postern_engine::EngineError::OutcomeNotJournaled { id, .. }, Some(Value::Object(body))) =
                    (&e, r.structured_content.as_mut())
                {
                    // It was sent: the agent gets the execution to follow, like any execution.
                    body.insert("execution_id".into(), json!(id));
                    body.insert("state".into(), json!(ExecutionState::Dispatched));
                }
                return Ok(CallToolResponse::Complete(r));
            }
            Err(e) => return Err(McpError::internal_error(format!("the engine task failed: {e}"), None)),
        };
        if has_result(outcome.state) && !outcome.read_only && !was_withdrawn {
            ticket.carries(outcome.execution_id);
        }
        Ok(CallToolResponse::Complete(outcome_result(&outcome)))
    }

    /// Lets execution `id` run on as a task: `tasks/cancel` may raise its signal until it ends.
    fn follow_as_task<T: Send + 'static>(
        &self,
        id: ExecutionId,
        cancel: postern_engine::CancelSignal,
        task: tokio::task::JoinHandle<T>,
    ) -> rmcp::model::CreateTaskResult {
        if let Ok(mut tasks) = self.gateway.tasks.lock() {
            tasks.entry(id).or_default().push(cancel.clone());
        }
        let gateway = Arc::clone(&self.gateway);
        self.gateway.executions.spawn(async move {
            let _ = task.await;
            if let Ok(mut tasks) = gateway.tasks.lock()
                && let Some(calls) = tasks.get_mut(&id)
            {
                calls.retain(|c| !c.is(&cancel));
                if calls.is_empty() {
                    tasks.remove(&id);
                }
            }
        });
        let now = postern_engine::approval::when((self.gateway.clock)().as_millis());
        rmcp::model::CreateTaskResult::new(
            rmcp::model::Task::new(id.to_string(), rmcp::model::TaskStatus::Working, now.clone(), now)
                .with_status_message("accepted; follow it with tasks/get")
                .with_poll_interval_ms(crate::delivery::tasks::POLL_INTERVAL_MS),
        )
    }

    /// The agent's own task `raw`, from the journal; another agent's is answered as unknown,
    /// and the attempt journaled.
    async fn own_task(
        &self,
        caller: &Caller,
        raw: &str,
        method: &str,
    ) -> Result<(ExecutionId, crate::delivery::tasks::TaskOnRecord), McpError> {
        let unknown = || {
            McpError::invalid_params(
                format!("no task {raw:?} was made by this agent"),
                Some(json!({ "code": "unknown_task" })),
            )
        };
        let Ok(id) = raw.parse::<ExecutionId>() else {
            self.refused(caller, format!("{method} {raw}")).await;
            return Err(unknown());
        };
        let running = self.gateway.tasks.lock().is_ok_and(|t| t.contains_key(&id));
        let since = (!running).then_some(self.gateway.started_at);
        match crate::delivery::tasks::task_on_record(&self.gateway.engine, id, &caller.actor(), since).await {
            Ok(Some(task)) => Ok((id, task)),
            Ok(None) => {
                self.refused(caller, format!("{method} {id}")).await;
                Err(unknown())
            }
            Err(e) => Err(McpError::internal_error(e.to_string(), Some(json!({ "code": e.code() })))),
        }
    }

    /// The upstream servers, every one started (so what they offer is current).
    async fn started_upstreams(&self) -> Option<&Arc<postern_engine::channel::upstream::Upstreams>> {
        let upstreams = self.gateway.engine.upstreams()?;
        upstreams.start_all().await;
        Some(upstreams)
    }

    /// A read of an upstream (`resources/read`, `prompts/get`) as a read-only execution of the
    /// calling agent's run: journaled, refused while the vault is locked, like a tool call.
    async fn upstream_read(
        &self,
        server: &str,
        operation: McpOperation,
        arguments: Value,
        context: &RequestContext<RoleServer>,
    ) -> Result<Value, McpError> {
        let (caller, _ticket) = self.caller_and_ticket(context)?;
        let run = self.run_for(&caller, context).await?;
        // The read is resolved here, by its kind: no tool name reaches it.
        let resolved = match self.gateway.engine.upstreams() {
            Some(u) => {
                u.ensure_started(server).await;
                u.read(server, operation)
            }
            None => None,
        };
        let Some(resolved) = resolved else {
            return Err(McpError::invalid_params(
                format!("no running MCP server {server:?} to {} from: see `postern servers list`", operation.as_str()),
                Some(json!({ "code": "unknown_server", "server": server })),
            ));
        };
        let call = postern_engine::Call {
            tool: resolved.name.clone(),
            arguments,
            actor: run.actor.clone(),
            intent_scope: run.intent_scope(),
            session: Some(run.session),
            correlation: json!({ "transport": caller.transport.as_str(), "agent_session": run.session.to_string() }),
            cancel: postern_engine::CancelSignal::default(),
            bound: postern_engine::Bound::default(),
            resolved: Some(resolved),
            opening: postern_engine::Opening::default(),
        };
        let engine = Arc::clone(&self.gateway.engine);
        let outcome = self
            .gateway
            .executions
            .spawn(async move { engine.call(call).await })
            .await
            .map_err(|e| McpError::internal_error(format!("the engine task failed: {e}"), None))?
            .map_err(|e| McpError::invalid_params(e.to_string(), Some(json!({ "code": e.code() }))))?;
        let id = outcome.execution_id;
        match (outcome.upstream(), outcome.state) {
            (Some(u), _) if u.result_too_large.is_some() => Err(McpError::internal_error(
                format!(
                    "MCP server {} answered with more than the result limit of {} bytes (execution {id}); the answer \
                     was not read",
                    u.server,
                    u.result_too_large.unwrap_or_default()
                ),
                Some(json!({ "execution_id": id, "code": "result_too_large", "limit": u.result_too_large })),
            )),
            (Some(u), ExecutionState::Completed) if !u.is_error => Ok(u.upstream_result.clone()),
            (Some(u), _) => Err(McpError::internal_error(
                format!("MCP server {} answered with an error (execution {id})", u.server),
                Some(json!({ "execution_id": id, "upstream": u.upstream_result })),
            )),
            _ => Err(McpError::internal_error(
                explain(&outcome).0,
                Some(json!({ "execution_id": id, "state": outcome.state, "detail": outcome.detail })),
            )),
        }
    }

    async fn execution_status(&self, caller: &Caller, arguments: &Value) -> CallToolResult {
        let Some(raw) = arguments.get("execution_id").and_then(Value::as_str) else {
            return error_result("invalid_arguments", "execution_id (a string such as act_01…) is required");
        };
        let id: ExecutionId = match raw.parse() {
            Ok(id) => id,
            Err(e) => return error_result("invalid_arguments", &format!("/execution_id: {e}")),
        };
        let engine = &self.gateway.engine;
        let mut found = execution_report(engine, id, &caller.actor());
        // A read answered a moment ago may not be on record yet (its rows are written after
        // its answer): wait for the journal to catch up, then look once more.
        if matches!(found, Ok(None)) && engine.caught_up_with(id).await {
            found = execution_report(engine, id, &caller.actor());
        }
        match found {
            Ok(Some(report)) => {
                let text = format!(
                    "Execution {id} is {}.\n{}",
                    report["state"].as_str().unwrap_or("?"),
                    serde_json::to_string_pretty(&report).unwrap_or_default()
                );
                let mut r = CallToolResult::success(vec![Content::text(text)]);
                r.structured_content = Some(report);
                r
            }
            // Another actor's execution is reported exactly like a missing one.
            Ok(None) => error_result("unknown_execution", &format!("no execution {id} was made by this agent")),
            Err(e) => error_result(e.code(), &e.to_string()),
        }
    }
}

impl ServerHandler for PosternMcp {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_tool_list_changed()
                .enable_resources()
                .enable_prompts()
                .enable_tasks()
                .build(),
        )
        .with_server_info(Implementation::new("postern", env!("CARGO_PKG_VERSION")))
        .with_protocol_version(ProtocolVersion::V_2026_07_28)
        .with_instructions(
            "Postern runs actions that need credentials. Every result carries an execution_id and state. A \
                 retry of the same call in this agent run returns the first execution instead of acting twice; if \
                 a state is outcome_unknown or needs_review, call execution_status rather than repeating.",
        )
    }

    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        Cow::Borrowed(PROTOCOL_VERSIONS)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        self.started_upstreams().await;
        Ok(ListToolsResult::with_all_items(tool_list(&self.gateway.engine)))
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::ListResourcesResult, McpError> {
        let resources = self.started_upstreams().await.map(|u| u.resources()).unwrap_or_default();
        Ok(rmcp::model::ListResourcesResult::with_all_items(resources))
    }

    async fn read_resource(
        &self,
        request: rmcp::model::ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::ReadResourceResponse, McpError> {
        use postern_engine::channel::upstream::RESOURCE_PREFIX;
        let not_found =
            || McpError::resource_not_found(format!("no resource {:?}: see resources/list", request.uri), None);
        let (server, uri) =
            request.uri.strip_prefix(RESOURCE_PREFIX).and_then(|rest| rest.split_once('/')).ok_or_else(not_found)?;
        let prefix = format!("{RESOURCE_PREFIX}{server}/");
        let value = self.upstream_read(server, McpOperation::ReadResource, json!({ "uri": uri }), &context).await?;
        let mut result: rmcp::model::ReadResourceResult = serde_json::from_value(value).map_err(|e| {
            McpError::internal_error(format!("MCP server {server} sent an unreadable resource: {e}"), None)
        })?;
        for c in &mut result.contents {
            match c {
                rmcp::model::ResourceContents::TextResourceContents { uri, .. }
                | rmcp::model::ResourceContents::BlobResourceContents { uri, .. } => *uri = format!("{prefix}{uri}"),
                _ => {}
            }
        }
        Ok(rmcp::model::ReadResourceResponse::Complete(result))
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::ListResourceTemplatesResult, McpError> {
        let templates = self.started_upstreams().await.map(|u| u.resource_templates()).unwrap_or_default();
        Ok(rmcp::model::ListResourceTemplatesResult::with_all_items(templates))
    }

    async fn list_prompts(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::ListPromptsResult, McpError> {
        let prompts = self.started_upstreams().await.map(|u| u.prompts()).unwrap_or_default();
        Ok(rmcp::model::ListPromptsResult::with_all_items(prompts))
    }

    async fn get_prompt(
        &self,
        request: rmcp::model::GetPromptRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::GetPromptResponse, McpError> {
        use postern_engine::channel::upstream::SEPARATOR;
        let (server, prompt) = request
            .name
            .split_once(SEPARATOR)
            .ok_or_else(|| McpError::invalid_params(format!("no prompt {:?}: see prompts/list", request.name), None))?;
        let arguments = json!({ "name": prompt, "arguments": request.arguments });
        let value = self.upstream_read(server, McpOperation::GetPrompt, arguments, &context).await?;
        let result: rmcp::model::GetPromptResult = serde_json::from_value(value).map_err(|e| {
            McpError::internal_error(format!("MCP server {server} sent an unreadable prompt: {e}"), None)
        })?;
        Ok(rmcp::model::GetPromptResponse::Complete(result))
    }

    /// There are no Postern-specific MCP methods: in particular nothing here approves,
    /// authorizes or unlocks (an agent's own client would be answering). Refused and journaled.
    async fn on_custom_request(
        &self,
        request: rmcp::model::CustomRequest,
        context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::CustomResult, McpError> {
        // A method MCP defines arrives here only when its params do not fit it (rmcp reads such
        // a request as a custom one): a malformed request, not a request for something else.
        if MCP_METHODS.contains(&request.method.as_str()) {
            return Err(McpError::invalid_params(
                format!("the params of {:?} do not fit its MCP schema: nothing was run", request.method),
                Some(json!({ "code": "invalid_params" })),
            ));
        }
        if let Ok((caller, _)) = self.caller_and_ticket(&context) {
            self.refused(&caller, request.method.clone()).await;
        }
        Err(McpError::new(
            rmcp::model::ErrorCode::METHOD_NOT_FOUND,
            format!(
                "{:?} is not an MCP method Postern offers; approvals are given only by the person at the approver, \
                 never over MCP",
                request.method
            ),
            Some(json!({ "code": "not_offered" })),
        ))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        self.call(request, context).await
    }

    async fn get_task(
        &self,
        request: rmcp::model::GetTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::GetTaskResult, McpError> {
        let (caller, ticket) = self.caller_and_ticket(&context)?;
        let (_, task) = self.own_task(&caller, &request.task_id, "tasks/get").await?;
        // Evidence only from the run the execution belongs to: another process holding the same
        // token is another intent scope, whose fetch says nothing about this run having it.
        if let Some(id) = task.delivers {
            let run = self.run_for(&caller, &context).await?;
            if task.session.as_deref() == Some(run.session.to_string().as_str()) {
                ticket.fetched(id);
            }
        }
        Ok(rmcp::model::GetTaskResult::new(task.task))
    }

    /// Cooperative, as the extension says: honoured until the `dispatched` row is written; after
    /// that the request is journaled and the execution runs to its end (cancelling never
    /// pretends to undo).
    async fn cancel_task(
        &self,
        request: rmcp::model::CancelTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        let (caller, _) = self.caller_and_ticket(&context)?;
        let (id, task) = self.own_task(&caller, &request.task_id, "tasks/cancel").await?;
        if task.task.status().is_terminal() {
            return Err(McpError::invalid_params(
                format!("task {id} is {:?} already; there is nothing to cancel", task.task.status()),
                Some(json!({ "code": "task_finished" })),
            ));
        }
        // The task is the execution: cancelling it withdraws every call following it, the
        // retries that joined it included.
        for signal in self.gateway.tasks.lock().ok().and_then(|t| t.get(&id).cloned()).unwrap_or_default() {
            signal.withdraw_all();
        }
        Ok(())
    }

    /// A client on an earlier protocol version hears `notifications/tools/list_changed` unscoped:
    /// one task per session relays each upstream's change until the session ends.
    async fn on_initialized(&self, context: NotificationContext<RoleServer>) {
        let Some(upstreams) = self.gateway.engine.upstreams() else { return };
        let legacy = context.peer.peer_info().is_none_or(|i| i.protocol_version != ProtocolVersion::V_2026_07_28);
        if !legacy {
            return;
        }
        let mut changes = upstreams.changes();
        let peer = context.peer.clone();
        tokio::spawn(async move {
            loop {
                let change = tokio::select! {
                    change = changes.recv() => change,
                    // A session that ended releases its relay within a minute, change or not.
                    () = tokio::time::sleep(std::time::Duration::from_secs(60)) => {
                        if peer.is_transport_closed() {
                            return;
                        }
                        continue;
                    }
                };
                match change {
                    Ok(()) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                        if peer.notify_tool_list_changed().await.is_err() {
                            return;
                        }
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                }
            }
        });
    }

    /// On protocol 2026-07-28 a client asks for tool-list changes with `subscriptions/listen`.
    fn accepted_subscription_filter(
        &self,
        requested: &rmcp::model::SubscriptionFilter,
    ) -> Option<rmcp::model::SubscriptionFilter> {
        self.gateway.engine.upstreams()?;
        let mut accepted = rmcp::model::SubscriptionFilter::default();
        accepted.tools_list_changed = requested.tools_list_changed;
        Some(accepted)
    }

    async fn listen(&self, context: rmcp::service::SubscriptionContext) -> Result<(), McpError> {
        let Some(upstreams) = self.gateway.engine.upstreams() else { return Ok(()) };
        let mut changes = upstreams.changes();
        loop {
            tokio::select! {
                () = context.cancelled() => return Ok(()),
                change = changes.recv() => match change {
                    Ok(()) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                        if context.sink().notify_tool_list_changed().await.is_err() {
                            return Ok(());
                        }
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return Ok(()),
                },
            }
        }
    }

    async fn on_cancelled(&self, notification: CancelledNotificationParam, _context: NotificationContext<RoleServer>) {
        let Some(id) = notification.request_id else { return };
        if let Some(signal) = self.in_flight.lock().ok().and_then(|m| m.get(&request_key(&id)).cloned()) {
            signal.cancel();
        }
    }
}

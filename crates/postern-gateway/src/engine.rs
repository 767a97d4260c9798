//! The engine: one call travels accept → authorize → dispatch → observe → deliver, and every
//! retry is decided from the journal (design §3–§4), never from the transport.

pub use crate::approval::{
    AgentRun, Approver, Ask, Authorization, AuthorizationRequest, DEFAULT_APPROVAL_TIMEOUT, Grant, LockOnlyApprover,
    RetryReviewRequest, ReviewAnswer, ReviewChoice, ReviewVerdict, TimelineStep, Withdrawal,
};
use crate::{
    http::{self, HttpResult, Outgoing, Sent},
    manifest::{ArgumentError, Manifest, Tool},
    redaction::CallSecrets,
};
use postern_core::{
    ActionRequest, ActionTarget, Actor, CanonicalAction, Channel, ErrorCode, ExecutionId, ExecutionState,
    FingerprintKey, HttpAction, IntentScope, LadderDecision, LadderInput, RecordError, RetryDecision, ReviewReason,
    Rung, SessionId, SessionStanding, Timestamp, Verification, decide_ladder,
};
use postern_store::{Admission, Completion, NewExecution, Store, StoreError};
use postern_vault::{Sensitive, Vault, VaultError};
use serde::Serialize;
use serde_json::{Value, json};
use std::{collections::BTreeSet, sync::Arc, time::Duration};

/// The `authorized` / `denied` row's detail for a verdict.
fn verdict_detail(v: &Authorization) -> Value {
    let mut detail = json!({ "rung": v.rung, "by": v.by, "reason": v.reason });
    if v.timed_out {
        detail["code"] = json!("approval_timed_out");
    }
    detail
}

/// How often an open question checks whether the vault was locked (then it is withdrawn).
const LOCK_CHECK_INTERVAL: Duration = Duration::from_millis(100);

/// How much of a request body a reviewer is shown.
const BODY_PREVIEW_BYTES: usize = 2048;

/// `arguments` with every string (outside the contract's secret fields, which the record digests)
/// masked by `secrets`.
fn mask_arguments(arguments: &Value, secrets: &CallSecrets, secret_fields: &BTreeSet<String>) -> Value {
    fn mask(value: &Value, secrets: &CallSecrets) -> Value {
        match value {
            Value::String(text) => Value::String(secrets.mask(text)),
            Value::Array(items) => Value::Array(items.iter().map(|v| mask(v, secrets)).collect()),
            Value::Object(map) => Value::Object(map.iter().map(|(k, v)| (k.clone(), mask(v, secrets))).collect()),
            other => other.clone(),
        }
    }
    if secrets.is_empty() {
        return arguments.clone();
    }
    match arguments {
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| (k.clone(), if secret_fields.contains(k) { v.clone() } else { mask(v, secrets) }))
                .collect(),
        ),
        other => mask(other, secrets),
    }
}

/// The credential a reviewer is told about: its name, or the SSH host whose key is used.
fn credential_shown(p: &Prepared<'_>) -> Option<String> {
    match &p.ssh {
        Some(plan) => Some(format!(
            "ssh key of host {} ({})",
            plan.host.name,
            plan.host.host_key_fingerprint.as_deref().unwrap_or("key not pinned yet")
        )),
        None => p.credential.as_ref().map(|c| c.name.clone()),
    }
}

fn ssh_shown(p: &Prepared<'_>, plan: &SshPlan) -> String {
    let command = p.shown_command(plan);
    match &plan.working_dir {
        Some(dir) => format!("$ cd {dir} && {command}"),
        None => format!("$ {command}"),
    }
}

/// The contract's secret arguments of a call (every string and number inside them).
fn contract_secrets(contract: &postern_core::ReplayContract, arguments: &Value, key: &FingerprintKey) -> CallSecrets {
    let mut secrets = CallSecrets::default();
    for name in &contract.secret_fields {
        if let Some(value) = arguments.get(name) {
            secrets.add(name, value, key);
        }
    }
    secrets
}

/// The prior states a person reviews when a retry matches them (design §6); `accepted` joins
/// the pending approval instead, `denied` returns the same denial.
fn reviewed_by_a_person(state: ExecutionState) -> bool {
    matches!(
        state,
        ExecutionState::Dispatched
            | ExecutionState::OutcomeUnknown
            | ExecutionState::NeedsReview
            | ExecutionState::Completed
            | ExecutionState::CompletedResultNotDelivered
    )
}

/// How a question put to a person ended.
enum Asked<T> {
    Answered(T),
    /// Nobody answered within the approval timeout.
    TimedOut,
    /// The vault was locked while the question was open.
    Locked,
}

/// What a call that joined another call's pending request receives: the same outcome.
type Shared = Option<Result<CallOutcome, (&'static str, String)>>;

/// Calls waiting for a person (an approval, a retry review), by execution: a retry of the same
/// execution joins the open request instead of raising a second one.
#[derive(Default)]
struct OpenRequests {
    next: std::sync::atomic::AtomicU64,
    open: std::sync::Mutex<std::collections::HashMap<ExecutionId, (u64, tokio::sync::watch::Receiver<Shared>)>>,
}

/// Either lead the handling of an execution (others join you) or join whoever leads it.
enum Turn<'a> {
    Lead(Lead<'a>),
    Join(tokio::sync::watch::Receiver<Shared>),
}

/// The leader's handle: [`Lead::close`] once the person has answered (later retries are decided
/// afresh from the journal), [`Lead::finish`] hands the outcome to everyone who joined.
struct Lead<'a> {
    requests: &'a OpenRequests,
    id: ExecutionId,
    token: u64,
    tx: tokio::sync::watch::Sender<Shared>,
}

impl OpenRequests {
    fn turn(&self, id: ExecutionId) -> Turn<'_> {
        let mut open = self.open.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((_, rx)) = open.get(&id) {
            return Turn::Join(rx.clone());
        }
        let token = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (tx, rx) = tokio::sync::watch::channel(None);
        open.insert(id, (token, rx));
        Turn::Lead(Lead { requests: self, id, token, tx })
    }
}

impl Lead<'_> {
    fn close(&self) {
        let mut open = self.requests.open.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if open.get(&self.id).is_some_and(|(token, _)| *token == self.token) {
            open.remove(&self.id);
        }
    }

    fn finish(self, result: &Result<CallOutcome, EngineError>) {
        self.close();
        let shared = match result {
            Ok(outcome) => Ok(outcome.clone()),
            Err(e) => Err((e.code(), e.to_string())),
        };
        let _ = self.tx.send(Some(shared));
    }
}

impl Drop for Lead<'_> {
    fn drop(&mut self) {
        self.close();
    }
}

/// One tool call as the gateway hands it to the engine.
#[derive(Debug, Clone)]
pub struct Call {
    pub tool: String,
    pub arguments: Value,
    pub actor: Actor,
    pub intent_scope: IntentScope,
    pub session: Option<SessionId>,
    /// Protocol correlation (JSON-RPC id, MCP session): evidence only.
    pub correlation: Value,
    /// Raised by the client's `notifications/cancelled`.
    pub cancel: CancelSignal,
}

/// A client's request to cancel a call. Honoured until the `dispatched` row is written; after
/// that the side effect may be under way, so the engine journals the request and carries on
/// (design: cancelling never pretends to undo).
#[derive(Debug, Clone, Default)]
pub struct CancelSignal(Arc<std::sync::atomic::AtomicBool>);

impl CancelSignal {
    pub fn cancel(&self) {
        self.0.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    pub fn is_cancelled(&self) -> bool {
        self.0.load(std::sync::atomic::Ordering::SeqCst)
    }
}

fn cancelled_detail() -> Value {
    json!({ "reason": "cancelled", "message": "the client cancelled the call before it was sent" })
}

/// Where a call ended up.
#[derive(Debug, Clone, Serialize)]
pub struct CallOutcome {
    pub execution_id: ExecutionId,
    pub state: ExecutionState,
    /// The call was recognised as a retry of an earlier execution.
    pub attached: bool,
    /// A read-only execution: journaled without waiting for the disk, never attached to, so its
    /// delivery is not tracked (a retry sends it again anyway).
    #[serde(skip)]
    pub read_only: bool,
    /// The retry decision that was taken (`new_execution` for a fresh call).
    pub decision: String,
    pub result: Option<HttpResult>,
    /// An SSH execution's result (exit status, output).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ssh: Option<crate::ssh::SshResult>,
    /// Why, for states without a result (denied, failed_before_dispatch, outcome_unknown, …).
    pub detail: Value,
}

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("unknown tool {0:?}")]
    UnknownTool(String),
    #[error(transparent)]
    Arguments(#[from] ArgumentError),
    #[error(transparent)]
    Record(#[from] RecordError),
    #[error("credential {credential:?} may not be sent to {url} (see its --host bindings)")]
    CredentialNotBound { credential: String, url: String },
    #[error(transparent)]
    UnsafeTarget(#[from] http::UnsafeTarget),
    #[error(transparent)]
    Vault(#[from] VaultError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(
        "Postern did not contact SSH host {host:?} (its key is not pinned yet, and pinning means logging in): {reason}; \
         nothing was sent. {}",
        match *reason {
            "vault_locked" => "Unlock the vault in the approver first.",
            "approve_every_use_needs_a_pinned_key" => "A host that needs approval for every use must have its key pinned \
                 before any call: add it again with `postern vault add-ssh --host-key-policy strict --host-key …`.",
            _ => "This agent run may not act any more.",
        }
    )]
    FirstContactRefused { host: String, reason: &'static str },
    #[error(transparent)]
    Ssh(#[from] crate::ssh::SshError),
    #[error("the engine's worker failed: {0}")]
    Internal(String),
    #[error("the request this call joined failed: {message}")]
    Joined { code: &'static str, message: String },
    /// The request was sent and answered, but the journal cannot record that yet.
    #[error(
        "execution {id} WAS SENT, but its outcome cannot be journaled yet: {source} Do not repeat \
         the call: Postern records the outcome as soon as the disk accepts writes; then execution_status \
         with execution_id {id} (or a repeat of this call, which is matched to it) returns the result"
    )]
    OutcomeNotJournaled { id: ExecutionId, source: StoreError },
    /// A tool read-only by its verb uses a credential whose reads have effects.
    #[error("{0} (its credential says reads through it have effects; add a contract in the tool manifest)")]
    Contract(#[from] postern_core::ContractError),
}

impl ErrorCode for EngineError {
    fn code(&self) -> &'static str {
        match self {
            EngineError::UnknownTool(_) => "unknown_tool",
            EngineError::Arguments(e) => e.code(),
            EngineError::Record(e) => e.code(),
            EngineError::CredentialNotBound { .. } => "credential_not_bound",
            EngineError::UnsafeTarget(_) => "unsafe_target",
            EngineError::Vault(e) => e.code(),
            EngineError::Store(e) => e.code(),
            EngineError::FirstContactRefused { .. } => "first_contact_refused",
            EngineError::Ssh(e) => e.code(),
            EngineError::Internal(_) => "internal_error",
            EngineError::Joined { code, .. } => code,
            EngineError::Contract(e) => e.code(),
            EngineError::OutcomeNotJournaled { .. } => "outcome_not_journaled",
        }
    }
}

/// The wall clock, as a parameter so tests can move time.
pub type Clock = Arc<dyn Fn() -> Timestamp + Send + Sync>;

pub fn system_clock() -> Clock {
    Arc::new(|| {
        let ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        Timestamp::from_millis(ms)
    })
}

pub struct Engine {
    store: Arc<Store>,
    vault: Arc<Vault>,
    key: FingerprintKey,
    manifest: Arc<Manifest>,
    approver: Arc<dyn Approver>,
    approval_timeout: Duration,
    /// One session-authorization question at a time per agent run.
    session_gates: tokio::sync::Mutex<std::collections::HashMap<SessionId, Arc<tokio::sync::Mutex<()>>>>,
    /// Calls waiting for a person, joinable by their retries.
    open_requests: OpenRequests,
    /// When the last call arrived or the last question was answered (ms), for the idle lock.
    last_activity: std::sync::atomic::AtomicI64,
    http: reqwest::Client,
    clock: Clock,
    body_cap: usize,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine").field("tools", &self.manifest.tools().count()).finish_non_exhaustive()
    }
}

/// Which send of an execution this is: the first (or a re-send after a proof that nothing ran),
/// or a recovery re-send with the same idempotency key, whose answer speaks for the original
/// only when it is final.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Attempt {
    First,
    SameKeyResend,
}

/// An answer to a same-key re-send that says nothing certain about the original request: still
/// in flight (409), key reused with another payload (422), too early or rate limited (425, 429),
/// request timeout (408), or a server error. Only a replayed or fresh 2xx/4xx settles it.
fn inconclusive_resend_status(status: u16) -> bool {
    matches!(status, 408 | 409 | 422 | 425 | 429) || status >= 500
}

/// The outcome of one send, before it is journaled.
struct Observation {
    state: ExecutionState,
    result: Option<HttpResult>,
    ssh: Option<crate::ssh::SshResult>,
    detail: Value,
    completion: Option<Completion>,
}

/// A manifest tool, or a built-in one made for this call.
enum ToolRef<'a> {
    Manifest(&'a Tool),
    Builtin(Box<Tool>),
}

impl std::ops::Deref for ToolRef<'_> {
    type Target = Tool;
    fn deref(&self) -> &Tool {
        match self {
            ToolRef::Manifest(t) => t,
            ToolRef::Builtin(t) => t,
        }
    }
}

/// Everything a call needs after validation.
struct Prepared<'a> {
    tool: ToolRef<'a>,
    /// For SSH: `ssh://account@address:port`, for display and the `dispatched` row.
    url: url::Url,
    method: String,
    headers: Vec<(String, String)>,
    body: Option<Vec<u8>>,
    credential: Option<postern_vault::Credential>,
    ssh: Option<SshPlan>,
    /// The secret values this call carries (the contract's `secret_fields`; for `http_request`,
    /// headers and query parameters named like secrets): masked in all Postern writes or shows.
    secrets: CallSecrets,
    /// `url` with its secrets masked: what records, journal rows and reviewers see.
    shown_url: String,
}

impl Prepared<'_> {
    /// An SSH command as records, journal rows and reviewers see it.
    fn shown_command(&self, plan: &SshPlan) -> String {
        self.secrets.mask(&plan.command)
    }
}

/// An SSH call after validation: where, as whom, what.
struct SshPlan {
    host: postern_vault::SshHost,
    command: String,
    working_dir: Option<String>,
}

/// What goes out for one execution.
enum Wire {
    Http(Outgoing),
    Ssh(SshOutgoing),
}

struct SshOutgoing {
    host: postern_vault::SshHost,
    key: Sensitive<String>,
    passphrase: Option<Sensitive<String>>,
    /// The remote command, wrapped (marker protocol, or `cd` + command).
    command: String,
    /// Ends the command on timeout, by the pid its wrapper recorded.
    kill: String,
    timeout: Duration,
    marker: bool,
}

impl Engine {
    pub fn new(
        store: Arc<Store>,
        vault: Arc<Vault>,
        manifest: Arc<Manifest>,
        approver: Arc<dyn Approver>,
        clock: Clock,
    ) -> Result<Self, EngineError> {
        let key = vault.fingerprint_key()?;
        Ok(Engine {
            store,
            vault,
            key,
            manifest,
            approver,
            approval_timeout: DEFAULT_APPROVAL_TIMEOUT,
            session_gates: tokio::sync::Mutex::new(std::collections::HashMap::new()),
            open_requests: OpenRequests::default(),
            last_activity: std::sync::atomic::AtomicI64::new(clock().as_millis()),
            http: http::client(),
            clock,
            body_cap: http::DEFAULT_BODY_CAP,
        })
    }

    /// How long a reviewer has to answer (default 120 s); then the call is denied with
    /// `approval_timed_out`.
    pub fn with_approval_timeout(mut self, timeout: Duration) -> Self {
        self.approval_timeout = timeout;
        self
    }

    /// Caps stored response bodies at `bytes` (default 8 MiB); longer bodies are truncated and
    /// flagged.
    pub fn with_body_cap(mut self, bytes: usize) -> Self {
        self.body_cap = bytes;
        self
    }

    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    fn now(&self) -> Timestamp {
        (self.clock)()
    }

    async fn transition(&self, id: ExecutionId, to: ExecutionState, detail: Value) -> Result<(), EngineError> {
        self.store.transition_steps_async(id, vec![(to, detail)], self.now()).await?;
        Ok(())
    }

    fn prepare(&self, call: &Call) -> Result<(Prepared<'_>, Value), EngineError> {
        let tool = match self.manifest.tool(&call.tool) {
            Some(tool) => tool,
            None if call.tool == crate::manifest::HTTP_REQUEST => return self.prepare_http_request(&call.arguments),
            None if call.tool == crate::manifest::SSH_EXEC => {
                let timeout = call.arguments.get("timeout_s").and_then(Value::as_u64).unwrap_or(60);
                let contract = postern_core::ReplayContract {
                    class: postern_core::ReplayClass::SshMarker,
                    attach_window: postern_core::AttachWindow::Millis(
                        crate::manifest::DEFAULT_ATTACH_WINDOW.as_millis() as u64,
                    ),
                    ..postern_core::ReplayContract::read_only()
                };
                let tool = Tool::ssh_exec(contract, Duration::from_secs(timeout.clamp(1, 3600)));
                return self.prepare_ssh(ToolRef::Builtin(Box::new(tool)), &call.arguments);
            }
            None => return Err(EngineError::UnknownTool(call.tool.clone())),
        };
        if tool.ssh.is_some() {
            return self.prepare_ssh(ToolRef::Manifest(tool), &call.arguments);
        }
        let arguments = tool.validate_arguments(&call.arguments)?;
        let rendered = tool.render(&arguments)?;
        let url = url::Url::parse(&rendered.url)
            .map_err(|e| RecordError::InvalidUrl { reason: format!("{}: {e}", rendered.url) })?;
        http::check_target(&url)?;
        let credential = match &tool.credential {
            None => None,
            Some(name) => {
                let c = self.vault.credential(name)?;
                if !c.allows(&url) {
                    return Err(EngineError::CredentialNotBound { credential: name.clone(), url: url.to_string() });
                }
                if c.reads_have_effects && tool.read_only_by_verb {
                    return Err(postern_core::ContractError::EffectfulRead {
                        tool: tool.name.clone(),
                        declared_read_only: false,
                    }
                    .into());
                }
                Some(c)
            }
        };
        let secrets = contract_secrets(&tool.contract, &arguments, &self.key);
        let prepared = Prepared {
            tool: ToolRef::Manifest(tool),
            shown_url: secrets.mask(url.as_str()),
            url,
            method: rendered.method,
            headers: rendered.headers,
            body: rendered.body,
            credential,
            ssh: None,
            secrets,
        };
        Ok((prepared, arguments))
    }

    /// An SSH tool's call: the host from the vault (the manifest's, or the agent's pick for
    /// `ssh_exec`), the command with its arguments quoted.
    fn prepare_ssh<'a>(&'a self, tool: ToolRef<'a>, raw: &Value) -> Result<(Prepared<'a>, Value), EngineError> {
        let arguments = tool.validate_arguments(raw)?;
        let spec = tool.ssh.clone().ok_or_else(|| EngineError::Internal("not an SSH tool".into()))?;
        let host_name = match &spec.host {
            Some(h) => h.clone(),
            None => arguments["host"].as_str().unwrap_or_default().to_owned(),
        };
        let host = self.vault.ssh_host(&host_name)?;
        let command = tool.render_ssh(&arguments)?;
        let working_dir = match &spec.host {
            Some(_) => spec.working_dir.clone(),
            None => arguments.get("working_dir").and_then(Value::as_str).map(str::to_owned),
        };
        let url = url::Url::parse(&format!("ssh://{}@{}:{}/", host.account, host.address, host.port))
            .map_err(|e| RecordError::InvalidUrl { reason: e.to_string() })?;
        let secrets = contract_secrets(&tool.contract, &arguments, &self.key);
        let prepared = Prepared {
            tool,
            shown_url: url.to_string(),
            url,
            method: "EXEC".into(),
            headers: vec![],
            body: None,
            credential: None,
            ssh: Some(SshPlan { host, command, working_dir }),
            secrets,
        };
        Ok((prepared, arguments))
    }

    /// An `accept-new` host without a pinned key: connect and authenticate once, and pin the key
    /// it presented only after authentication succeeded. Happens before the call becomes an
    /// execution (its record names the pinned key).
    async fn pin_first_key(&self, plan: &mut SshPlan) -> Result<(), EngineError> {
        let (key, passphrase) = self.vault.ssh_key_of(&plan.host)?;
        let connection = crate::ssh::connect(&plan.host, &key, passphrase.as_ref()).await?;
        let line = connection.presented.to_openssh().map_err(|e| EngineError::Internal(e.to_string()))?;
        let fingerprint = crate::ssh::fingerprint(&connection.presented);
        connection.close().await;
        let (vault, name, at) = (Arc::clone(&self.vault), plan.host.name.clone(), self.now());
        plan.host = tokio::task::spawn_blocking(move || vault.pin_host_key(&name, &line, &fingerprint, at))
            .await
            .map_err(|e| EngineError::Internal(e.to_string()))??;
        Ok(())
    }

    /// The built-in `http_request`: GET/HEAD are read-only; other methods are `irreversible`
    /// unless the credential bound to the URL declares an idempotency header. The credential is
    /// chosen by the URL's bindings, never by the agent (a `credential` argument only picks
    /// between several that are bound to the URL).
    fn prepare_http_request(&self, raw: &Value) -> Result<(Prepared<'_>, Value), EngineError> {
        let probe =
            Tool::http_request("GET", "", postern_core::ReplayContract::read_only(), crate::manifest::DEFAULT_TIMEOUT);
        let args = probe.validate_arguments(raw)?;
        let field_error =
            |field: &str, message: String| ArgumentError { tool: probe.name.clone(), field: field.into(), message };
        let method = args["method"].as_str().unwrap_or("GET").to_owned();
        let url = url::Url::parse(args["url"].as_str().unwrap_or(""))
            .map_err(|e| field_error("/url", format!("not an absolute URL: {e}")))?;
        http::check_target(&url)?;
        let mut headers = Vec::new();
        for (name, value) in args.get("headers").and_then(Value::as_object).into_iter().flatten() {
            if crate::manifest::RESERVED_HEADERS.contains(&name.to_ascii_lowercase().as_str()) {
                return Err(field_error(
                    &format!("/headers/{name}"),
                    "credentials come from the vault; this header cannot be set".into(),
                )
                .into());
            }
            let value = value.as_str().unwrap_or_default();
            // Checked here, before anything is journaled: a header the HTTP stack would refuse
            // must not become an execution that fails after `dispatched`.
            if reqwest::header::HeaderName::from_bytes(name.as_bytes()).is_err() {
                return Err(field_error(&format!("/headers/{name}"), "not a valid HTTP header name".into()).into());
            }
            if reqwest::header::HeaderValue::from_str(value).is_err() {
                return Err(field_error(
                    &format!("/headers/{name}"),
                    "not a valid HTTP header value (visible ASCII, no line breaks)".into(),
                )
                .into());
            }
            headers.push((name.to_ascii_lowercase(), value.to_owned()));
        }
        let bound: Vec<postern_vault::Credential> =
            self.vault.credentials()?.into_iter().filter(|c| c.allows(&url)).collect();
        let credential = match args.get("credential").and_then(Value::as_str) {
            Some(name) => Some(bound.iter().find(|c| c.name == name).cloned().ok_or_else(|| {
                EngineError::CredentialNotBound { credential: name.to_owned(), url: url.to_string() }
            })?),
            None if bound.len() > 1 => {
                let names: Vec<&str> = bound.iter().map(|c| c.name.as_str()).collect();
                return Err(field_error(
                    "/credential",
                    format!("several credentials are bound to this URL; choose one of {names:?}"),
                )
                .into());
            }
            None => bound.into_iter().next(),
        };
        let mut contract = postern_core::ReplayContract::read_only();
        contract.semantic_headers = headers.iter().map(|(k, _)| k.clone()).collect();
        let reads_have_effects = credential.as_ref().is_some_and(|c| c.reads_have_effects);
        if reads_have_effects || !postern_core::contract::is_safe_method(&method) {
            match credential.as_ref().and_then(|c| c.idempotency_header.clone()) {
                Some(header) => {
                    contract.class = postern_core::ReplayClass::IdempotencyKey;
                    contract.idempotency_header = Some(header);
                }
                None => contract.class = postern_core::ReplayClass::Irreversible,
            }
        }
        let body = args.get("body").map(|b| serde_json::to_vec(b).unwrap_or_default());
        if body.is_some() && !headers.iter().any(|(k, _)| k == "content-type") {
            headers.push(("content-type".into(), "application/json".into()));
        }
        // Headers and query parameters named like secrets (an agent's own API key, a signed URL)
        // are kept out of the record, the journal and the approval text.
        let mut secrets = CallSecrets::default();
        for (name, value) in headers.iter().filter(|(name, _)| crate::redaction::sensitive_name(name)) {
            secrets.add(name, &Value::String(value.clone()), &self.key);
        }
        for (name, value) in url.query_pairs().filter(|(name, _)| crate::redaction::sensitive_name(name)) {
            secrets.add(&name, &Value::String(value.into_owned()), &self.key);
        }
        let tool = Tool::http_request(&method, url.as_str(), contract, crate::manifest::DEFAULT_TIMEOUT);
        let shown_url = secrets.mask(url.as_str());
        let prepared = Prepared {
            tool: ToolRef::Builtin(Box::new(tool)),
            url,
            method,
            headers,
            body,
            credential,
            ssh: None,
            secrets,
            shown_url,
        };
        Ok((prepared, args))
    }

    /// Handles one call end to end. Errors are reserved for calls that never became an
    /// execution (unknown tool, invalid arguments, unsafe target, …); every execution's fate —
    /// denied, failed before dispatch, outcome unknown, completed — is a [`CallOutcome`].
    pub async fn call(&self, call: Call) -> Result<CallOutcome, EngineError> {
        self.touch();
        // Another process changed what grants authority behind the journal's back: nothing is
        // granted any more (before the lock, credentials or grants are even read).
        if let Some(found) = self.store.authority_alarm() {
            return Err(StoreError::AuthorityTampered(found).into());
        }
        let (mut p, arguments) = self.prepare(&call)?;
        if let Some(plan) = &mut p.ssh
            && plan.host.host_key_fingerprint.is_none()
        {
            // The first contact with an `accept-new` host logs in (to pin the key the record
            // names) before the call becomes an execution: the rungs that need no person are
            // decided first, and a host that needs a reviewer for every use is not logged into
            // before one has approved anything.
            if let Some(reason) = self.recovery_blocked(&call)? {
                return Err(EngineError::FirstContactRefused { host: plan.host.name.clone(), reason });
            }
            if plan.host.approve_every_use {
                return Err(EngineError::FirstContactRefused {
                    host: plan.host.name.clone(),
                    reason: "approve_every_use_needs_a_pinned_key",
                });
            }
            self.pin_first_key(plan).await?;
        }
        let new = self.admission(&p, &call, arguments)?;
        if p.tool.contract.class == postern_core::ReplayClass::ReadOnly {
            return self.read_only(&p, &call, new).await;
        }
        if !self.approver.may_block()
            && let Ok(out) = self.outgoing(&p, new.id)
        {
            // A non-interactive approver decides before admission; the verdict is applied in the
            // admission's own durable transaction, and only if this is a new execution. A retry
            // is decided from the journal as always.
            let id = new.id;
            let verdict = self.authorize(&p, &call, id, false, None).await?;
            let auth = verdict_detail(&verdict);
            let cancelled = call.cancel.is_cancelled();
            let steps = if verdict.allowed && cancelled {
                vec![
                    (ExecutionState::Authorized, auth.clone()),
                    (ExecutionState::FailedBeforeDispatch, cancelled_detail()),
                ]
            } else if verdict.allowed {
                vec![
                    (ExecutionState::Authorized, auth.clone()),
                    (ExecutionState::Dispatched, dispatched_detail(&p, &out)),
                ]
            } else {
                vec![(ExecutionState::Denied, auth.clone())]
            };
            return match self.store.admit_and_start_async(new, steps).await? {
                Admission::Accepted { .. } if verdict.allowed && cancelled => Ok(self.outcome(
                    id,
                    ExecutionState::FailedBeforeDispatch,
                    false,
                    "new_execution",
                    None,
                    cancelled_detail(),
                )),
                Admission::Accepted { .. } if verdict.allowed => {
                    self.send_and_observe(&p, id, out, "new_execution", false, Attempt::First).await
                }
                Admission::Accepted { .. } => {
                    Ok(self.outcome(id, ExecutionState::Denied, false, "new_execution", None, auth))
                }
                Admission::Matched { prior, decision } => self.on_match(&p, &call, prior, decision).await,
            };
        }
        match self.store.admit_async(new).await? {
            Admission::Accepted { id } => match self.open_requests.turn(id) {
                Turn::Lead(lead) => {
                    let result = self.authorize_and_run(&p, &call, id, "new_execution", false, Some(&lead)).await;
                    lead.finish(&result);
                    result
                }
                // A fresh ID cannot have an open request; answer from the journal regardless.
                Turn::Join(rx) => Self::join(rx).await,
            },
            Admission::Matched { prior, decision } => self.on_match(&p, &call, prior, decision).await,
        }
    }

    /// The execution a new call would become (its canonical record and fingerprint).
    fn admission(&self, p: &Prepared<'_>, call: &Call, arguments: Value) -> Result<NewExecution, EngineError> {
        // A contract may widen the scope beyond the agent run (design §5: e.g. a rotation).
        let intent_scope = match p.tool.contract.scope {
            postern_core::contract::ScopePolicy::Durable => IntentScope::durable(),
            postern_core::contract::ScopePolicy::AgentRun => call.intent_scope.clone(),
        };
        let target = match &p.ssh {
            Some(plan) => ActionTarget::Ssh(postern_core::SshAction {
                host_key_fingerprint: plan.host.host_key_fingerprint.clone().unwrap_or_default(),
                account: plan.host.account.clone(),
                working_dir: plan.working_dir.clone(),
                command: p.shown_command(plan),
            }),
            None => ActionTarget::Http(HttpAction {
                method: p.method.clone(),
                url: p.shown_url.clone(),
                headers: p.headers.iter().map(|(k, v)| (k.clone(), p.secrets.mask(v))).collect(),
            }),
        };
        // Secrets the agent put elsewhere in its arguments (a URL, a header of `http_request`)
        // are masked there too; the contract's secret fields are digested by the record itself.
        let arguments = mask_arguments(&arguments, &p.secrets, &p.tool.contract.secret_fields);
        let action = CanonicalAction::build(
            &ActionRequest {
                actor: call.actor.clone(),
                tool: p.tool.name.clone(),
                target,
                credential_ref: p.credential.as_ref().map(|c| c.name.clone()),
                arguments,
                intent_scope: intent_scope.clone(),
            },
            &p.tool.contract,
            &self.key,
        )?;
        let at = self.now();
        let mut random = [0u8; 16];
        getrandom_fill(&mut random)?;
        Ok(NewExecution {
            id: ExecutionId::from_parts(at, u128::from_le_bytes(random)),
            fingerprint: action.fingerprint(&self.key),
            actor: call.actor.clone(),
            intent_scope,
            session_id: call.session,
            tool: p.tool.name.clone(),
            channel: if p.ssh.is_some() { Channel::Ssh } else { Channel::Http },
            contract: p.tool.contract.clone(),
            record: action.record().clone(),
            correlation: call.correlation.clone(),
            at,
        })
    }

    /// A retry matched `prior`. If a call for it is already waiting for a person, this one joins
    /// it (one prompt, one decision for both). Otherwise, with a person reviewing retries, an
    /// uncertain or undelivered prior goes to them with its record; else the replay contract
    /// decides.
    async fn on_match(
        &self,
        p: &Prepared<'_>,
        call: &Call,
        prior: postern_core::PriorExecution,
        decision: RetryDecision,
    ) -> Result<CallOutcome, EngineError> {
        let lead = match self.open_requests.turn(prior.id) {
            Turn::Join(rx) => return Self::join(rx).await,
            Turn::Lead(lead) => lead,
        };
        let result = if self.approver.reviews_retries() && reviewed_by_a_person(prior.state) {
            self.retry_review(p, call, &prior, decision, &lead).await
        } else {
            self.act_on(p, call, prior.id, prior.state, decision).await
        };
        lead.finish(&result);
        result
    }

    /// Waits for the call this one joined, and answers with its outcome.
    async fn join(mut rx: tokio::sync::watch::Receiver<Shared>) -> Result<CallOutcome, EngineError> {
        let shared = match rx.wait_for(Option::is_some).await {
            Ok(value) => value.clone(),
            Err(_) => None,
        };
        match shared {
            Some(Ok(outcome)) => Ok(CallOutcome { attached: true, ..outcome }),
            Some(Err((code, message))) => Err(EngineError::Joined { code, message }),
            None => Err(EngineError::Joined {
                code: "internal_error",
                message: "the call this retry joined ended without an outcome".into(),
            }),
        }
    }

    /// Marks the gateway as in use (for the idle lock).
    fn touch(&self) {
        self.last_activity.store(self.now().as_millis(), std::sync::atomic::Ordering::Relaxed);
    }

    /// Locks the vault once `idle` has passed without a call or an answer; an unlock starts the
    /// count again. Runs until the task is dropped.
    pub async fn idle_lock(&self, idle: Duration) {
        let idle_ms = i64::try_from(idle.as_millis()).unwrap_or(i64::MAX);
        let mut baseline = self.last_activity().as_millis();
        let mut was_locked = false;
        let mut tick = tokio::time::interval(Duration::from_millis(250).min(idle));
        loop {
            tick.tick().await;
            let Ok(locked) = self.vault.is_locked() else { continue };
            let now = self.now().as_millis();
            if was_locked && !locked {
                baseline = now;
            }
            was_locked = locked;
            baseline = baseline.max(self.last_activity().as_millis());
            if !locked && now.saturating_sub(baseline) >= idle_ms {
                let by = format!("idle-lock: {} s without activity", idle.as_secs());
                match self.vault.lock(&by, self.now()) {
                    Ok(()) => tracing::info!(idle_s = idle.as_secs(), "vault locked after idle period"),
                    Err(e) => tracing::warn!(error = %e, "the idle lock could not lock the vault"),
                }
            }
        }
    }

    /// When a call last arrived or a question was last answered.
    pub fn last_activity(&self) -> Timestamp {
        Timestamp::from_millis(self.last_activity.load(std::sync::atomic::Ordering::Relaxed))
    }

    async fn act_on(
        &self,
        p: &Prepared<'_>,
        call: &Call,
        id: ExecutionId,
        state: ExecutionState,
        decision: RetryDecision,
    ) -> Result<CallOutcome, EngineError> {
        let name = decision.name();
        // A recovery that would send again (continue a prior that sent nothing, re-send with the
        // same key, ask the status endpoint, read the marker and run) is an action like any other:
        // a locked vault or a revoked run stops it, as the ladder stops a new call.
        let sends = matches!(decision, RetryDecision::VerifyPrior { .. })
            || (matches!(decision, RetryDecision::ContinuePrior { .. }) && state != ExecutionState::Accepted);
        if sends && let Some(reason) = self.recovery_blocked(call)? {
            let detail = json!({ "reason": reason, "not_resent": true, "decision": name });
            if state == ExecutionState::Authorized {
                // Nothing was ever sent for it: it ends here, as a new call would.
                self.transition(id, ExecutionState::FailedBeforeDispatch, detail.clone()).await?;
                return Ok(self.outcome(id, ExecutionState::FailedBeforeDispatch, true, name, None, detail));
            }
            self.note(id, "recovery_refused", detail.clone()).await?;
            return Ok(self.outcome(id, state, true, name, None, detail));
        }
        match decision {
            RetryDecision::NewExecution => Err(EngineError::Internal("a match cannot decide new_execution".into())),
            RetryDecision::ContinuePrior { .. } => match state {
                ExecutionState::Accepted => self.authorize_and_run(p, call, id, name, true, None).await,
                // Authorized, or verified not executed: nothing was sent, carry on with this one.
                _ => self.dispatch(p, id, name, true).await,
            },
            RetryDecision::WaitForPrior { .. } => {
                self.wait_for(id, p.tool.timeout + Duration::from_secs(5), name).await
            }
            RetryDecision::VerifyPrior { verification: Verification::ResendWithSameKey { .. }, .. } => {
                self.dispatch_after(p, id, name, true, vec![], Attempt::SameKeyResend).await
            }
            RetryDecision::VerifyPrior { verification: Verification::QueryStatus { query }, .. } => {
                self.query_status(p, id, &query, name).await
            }
            RetryDecision::VerifyPrior { verification: Verification::ReadSshMarker, .. } => {
                self.read_marker(p, id, state, name).await
            }
            RetryDecision::ReturnStoredResult { .. } => self.stored(id, state, name).await,
            RetryDecision::ReturnPriorDenial { .. } => {
                Ok(self.outcome(id, ExecutionState::Denied, true, name, None, json!({})))
            }
            RetryDecision::NeedsReview { reason, .. } => {
                let why = match reason {
                    ReviewReason::OutcomeUnknownIrreversible => {
                        "the first attempt's outcome is unknown and this tool is irreversible; Postern did not re-send it"
                    }
                    ReviewReason::AwaitingReview => "the first attempt is waiting for a reviewer",
                };
                self.review(id, state, why, name).await
            }
        }
    }

    /// Why a recovery may not send anything now: the vault is locked, or the calling run was
    /// revoked.
    fn recovery_blocked(&self, call: &Call) -> Result<Option<&'static str>, EngineError> {
        if self.vault.is_locked()? {
            return Ok(Some("vault_locked"));
        }
        if let Some(session) = call.session
            && self.store.view().session_standing(session)? == Some(false)
        {
            return Ok(Some("run_revoked_or_ended"));
        }
        Ok(None)
    }

    /// Retry review (design §6): the person behind the approver is shown the original record
    /// and chooses. Nothing is sent unless they choose "dispatch anew" with a reason, or "check
    /// status" where the contract has a safe route.
    async fn retry_review(
        &self,
        p: &Prepared<'_>,
        call: &Call,
        prior: &postern_core::PriorExecution,
        decision: RetryDecision,
        lead: &Lead<'_>,
    ) -> Result<CallOutcome, EngineError> {
        let id = prior.id;
        let request = self.review_request(p, prior, &decision)?;
        self.note(id, "retry_review_requested", json!({ "shown": &request })).await?;
        let approver = Arc::clone(&self.approver);
        let asked = request.clone();
        let answer = self.ask_person(request.withdrawn.clone(), move || approver.review_retry(&asked)).await?;
        lead.close();
        let denied = |code: &str, by: &str, reason: String| json!({ "rung": "retry_review", "code": code, "by": by, "reason": reason });
        let verdict = match answer {
            Asked::Answered(Some(v)) if request.choices.contains(&v.answer.choice()) => v,
            Asked::Answered(Some(v)) => ReviewVerdict {
                answer: ReviewAnswer::Deny {
                    reason: format!("{:?} was not one of the offered choices", v.answer.choice()),
                },
                by: v.by,
            },
            Asked::Answered(None) | Asked::TimedOut => {
                let reason = format!("no reviewer answered within {} s", self.approval_timeout.as_secs());
                let detail = denied("approval_timed_out", "timeout", reason);
                self.note(id, "retry_review_timed_out", detail.clone()).await?;
                return Ok(self.outcome(id, prior.state, true, "retry_denied", None, detail));
            }
            Asked::Locked => {
                let reason = "the vault was locked while this retry waited for a reviewer".to_owned();
                let detail = denied("vault_locked", "postern", reason);
                self.note(id, "retry_review_withdrawn", detail.clone()).await?;
                return Ok(self.outcome(id, prior.state, true, "retry_denied", None, detail));
            }
        };
        if let ReviewAnswer::DispatchAnew { reason } = &verdict.answer
            && reason.trim().is_empty()
        {
            let detail = denied("reason_required", &verdict.by, "dispatch anew needs a typed reason".into());
            self.note(id, "retry_review_decided", json!({ "decision": &verdict, "effect": detail })).await?;
            return Ok(self.outcome(id, prior.state, true, "retry_denied", None, detail));
        }
        self.note(id, "retry_review_decided", json!({ "decision": &verdict })).await?;
        match verdict.answer {
            ReviewAnswer::ReturnRecordedResult => {
                let state = self.current_state(id)?;
                match state {
                    ExecutionState::Dispatched => {
                        self.wait_for(id, p.tool.timeout + Duration::from_secs(5), "return_recorded_result").await
                    }
                    ExecutionState::Completed
                    | ExecutionState::CompletedResultNotDelivered
                    | ExecutionState::ResultDelivered => self.stored(id, state, "return_recorded_result").await,
                    other => {
                        let detail = json!({ "reason": request.known_outcome, "returned": "recorded_state" });
                        Ok(self.outcome(id, other, true, "return_recorded_result", None, detail))
                    }
                }
            }
            ReviewAnswer::CheckStatus => match (&decision, &prior.contract.status_query) {
                (RetryDecision::VerifyPrior { .. }, _) => self.act_on(p, call, id, prior.state, decision).await,
                (_, Some(query)) => self.query_status(p, id, query, "check_status").await,
                _ => Err(EngineError::Internal("check status was offered without a route".into())),
            },
            ReviewAnswer::DispatchAnew { reason } => self.dispatch_anew(p, call, id, &verdict.by, reason.trim()).await,
            ReviewAnswer::Deny { reason } => Ok(self.outcome(
                id,
                prior.state,
                true,
                "retry_denied",
                None,
                denied("retry_denied", &verdict.by, reason),
            )),
        }
    }

    /// What the reviewer of a retry is shown: the original record, never the retry's guesses.
    fn review_request(
        &self,
        p: &Prepared<'_>,
        prior: &postern_core::PriorExecution,
        decision: &RetryDecision,
    ) -> Result<RetryReviewRequest, EngineError> {
        let view = self.store.view();
        let id = prior.id;
        let summary = view.execution(id)?.ok_or(StoreError::UnknownExecution(id))?;
        let entries = view.timeline(id)?;
        let text = |v: &Value, key: &str| v.get(key).and_then(Value::as_str).map(str::to_owned);
        let authorized_by =
            entries.iter().rev().find(|e| e.row.event == "authorized").and_then(|e| text(&e.row.detail, "by"));
        let timeline = entries
            .iter()
            .map(|e| {
                let d = &e.row.detail;
                let summary = match e.row.event.as_str() {
                    "authorized" | "denied" => {
                        format!("by {} ({})", text(d, "by").unwrap_or_default(), text(d, "rung").unwrap_or_default())
                    }
                    "dispatched" => {
                        format!("{} {}", text(d, "method").unwrap_or_default(), text(d, "target").unwrap_or_default())
                    }
                    "completed" => d["outcome"].get("http_status").map_or_else(String::new, |s| format!("HTTP {s}")),
                    "approval_requested" => format!("asked: {}", text(d, "ask").unwrap_or_default()),
                    "approval_granted" | "approval_denied" | "approval_timed_out" | "approval_withdrawn" => {
                        format!("by {}", d["decision"]["by"].as_str().unwrap_or_default())
                    }
                    _ => text(d, "reason").unwrap_or_default(),
                };
                TimelineStep { at: e.row.at.as_millis(), event: e.row.event.clone(), summary }
            })
            .collect();
        let status =
            view.result(id)?.and_then(|r| serde_json::from_slice::<HttpResult>(&r.body).ok()).map(|r| r.status);
        let last_reason = entries.iter().rev().find_map(|e| text(&e.row.detail, "reason"));
        let class = prior.contract.class;
        let verifiable = matches!(decision, RetryDecision::VerifyPrior { .. })
            || (prior.state == ExecutionState::NeedsReview && prior.contract.status_query.is_some());
        let (known_outcome, why_not_resent) = match prior.state {
            ExecutionState::Dispatched => (
                format!("sent; no response yet (the original may still be running at {})", p.shown_url),
                "the original is still in flight: sending again could perform the action twice".to_owned(),
            ),
            ExecutionState::Completed
            | ExecutionState::CompletedResultNotDelivered
            | ExecutionState::ResultDelivered => (
                format!(
                    "completed{}; the result is on record but did not reach the agent",
                    status.map_or_else(String::new, |s| format!(" with HTTP {s}"))
                ),
                "the original completed: its result is on record, and sending again would repeat the action".to_owned(),
            ),
            state => (
                format!("unknown ({state}): {}", last_reason.unwrap_or_else(|| "no response was observed".into())),
                if verifiable {
                    format!(
                        "the outcome is unknown; the replay contract ({}) can verify it without repeating the action — choose check status",
                        class.as_str()
                    )
                } else {
                    format!(
                        "the outcome is unknown and the replay contract ({}) offers no safe way to verify it: a second send could repeat the action",
                        class.as_str()
                    )
                },
            ),
        };
        let mut choices = vec![ReviewChoice::ReturnRecordedResult];
        if verifiable && matches!(prior.state, ExecutionState::OutcomeUnknown | ExecutionState::NeedsReview) {
            choices.push(ReviewChoice::CheckStatus);
        }
        choices.extend([ReviewChoice::DispatchAnew, ReviewChoice::Deny]);
        Ok(RetryReviewRequest {
            execution_id: id,
            session: summary.session_id.as_deref().and_then(|s| s.parse().ok()),
            tool: summary.tool,
            actor: summary.actor,
            method: p.method.clone(),
            target: p.shown_url.clone(),
            credential: credential_shown(p),
            replay_contract: class.as_str().to_owned(),
            state: prior.state,
            accepted_at: summary.accepted_at,
            authorized_by,
            first_dispatched_at: summary.first_dispatched_at,
            known_outcome,
            why_not_resent,
            timeline,
            choices,
            timeout_ms: self.approval_timeout.as_millis() as u64,
            withdrawn: Withdrawal::default(),
        })
    }

    /// "Dispatch anew": a new execution, linked to the original and carrying the reviewer's
    /// reason. The ladder's hard rungs still hold (a locked vault, a revoked run).
    async fn dispatch_anew(
        &self,
        p: &Prepared<'_>,
        call: &Call,
        prior: ExecutionId,
        by: &str,
        reason: &str,
    ) -> Result<CallOutcome, EngineError> {
        let input = self.ladder_input(p, call)?;
        let refused = if input.vault_locked {
            Some((Rung::VaultLocked, "the vault is locked"))
        } else if input.session == SessionStanding::Revoked {
            Some((Rung::SessionAuthorization, "this agent run was revoked or has ended"))
        } else {
            None
        };
        if let Some((rung, why)) = refused {
            let detail = json!({ "rung": rung.as_str(), "by": "postern", "reason": why });
            return Ok(self.outcome(prior, self.current_state(prior)?, true, "retry_denied", None, detail));
        }
        let (_, arguments) = self.prepare(call)?;
        let new = self.admission(p, call, arguments)?;
        let id = new.id;
        let out = self.outgoing(p, id)?;
        let anew = json!({ "prior": prior, "by": by, "reason": reason });
        let steps = vec![
            (
                ExecutionState::Authorized,
                json!({ "rung": "retry_review", "by": by, "reason": reason, "dispatched_anew_of": prior }),
            ),
            (ExecutionState::Dispatched, dispatched_detail(p, &out)),
        ];
        self.store.admit_anew_async(new, anew, steps).await?;
        self.send_and_observe(p, id, out, "dispatched_anew", false, Attempt::First).await
    }

    fn current_state(&self, id: ExecutionId) -> Result<ExecutionState, EngineError> {
        let current = self.store.view().execution(id)?.ok_or(StoreError::UnknownExecution(id))?;
        current.state.parse().map_err(|e: postern_core::lifecycle::UnknownState| EngineError::Internal(e.to_string()))
    }

    fn outcome(
        &self,
        id: ExecutionId,
        state: ExecutionState,
        attached: bool,
        decision: &str,
        result: Option<HttpResult>,
        detail: Value,
    ) -> CallOutcome {
        CallOutcome {
            execution_id: id,
            state,
            attached,
            read_only: false,
            decision: decision.into(),
            result,
            ssh: None,
            detail,
        }
    }

    /// The approval ladder (design §6): the pure decision in `postern_core::decide_ladder`,
    /// the approver asked only where it says so, one session-authorization question per run.
    async fn authorize(
        &self,
        p: &Prepared<'_>,
        call: &Call,
        id: ExecutionId,
        admitted: bool,
        lead: Option<&Lead<'_>>,
    ) -> Result<Authorization, EngineError> {
        let decided = |allowed: bool, rung: Rung, reason: &str| Authorization {
            allowed,
            rung: rung.as_str().into(),
            by: "postern".into(),
            reason: reason.into(),
            grant: None,
            timed_out: false,
        };
        let mut decision = decide_ladder(self.ladder_input(p, call)?);
        // One question per run: calls of a new run wait for the first one's answer, then see it.
        let gate = match (decision, call.session) {
            (LadderDecision::AskSessionAuthorization, Some(session)) => {
                let mut gates = self.session_gates.lock().await;
                Some(Arc::clone(gates.entry(session).or_default()))
            }
            _ => None,
        };
        let _held = match &gate {
            Some(g) => {
                let held = g.lock().await;
                decision = decide_ladder(self.ladder_input(p, call)?);
                Some(held)
            }
            None => None,
        };
        let ask = match decision {
            LadderDecision::Deny { rung: rung @ Rung::VaultLocked } => {
                return Ok(decided(false, rung, "the vault is locked"));
            }
            LadderDecision::Deny { rung } => {
                return Ok(decided(
                    false,
                    rung,
                    "this agent run was revoked or has ended; a new run must be authorized",
                ));
            }
            LadderDecision::Run { rung: rung @ Rung::Allowlist } => {
                // Recorded on the run, so the journal shows why nobody was asked.
                if let Some(session) = call.session {
                    self.grant_session(session, "allowlist", json!({ "actor": call.actor.as_str() })).await?;
                }
                return Ok(decided(true, rung, "this agent is on the allowlist"));
            }
            LadderDecision::Run { rung } => return Ok(decided(true, rung, "allowed")),
            LadderDecision::AskPerUse => Ask::PerUse,
            LadderDecision::AskSessionAuthorization => Ask::SessionAuthorization,
        };
        let body = match &p.ssh {
            // For SSH the "body" is the command, where it runs, and as whom.
            Some(plan) => {
                Some(crate::approval::body_preview(ssh_shown(p, plan).as_bytes(), &p.secrets, BODY_PREVIEW_BYTES))
            }
            None => p.body.as_deref().map(|b| crate::approval::body_preview(b, &p.secrets, BODY_PREVIEW_BYTES)),
        };
        let request = AuthorizationRequest {
            ask,
            execution_id: id,
            session: call.session,
            tool: p.tool.name.clone(),
            actor: call.actor.as_str().to_owned(),
            agent: self.agent_run(call)?,
            method: p.method.clone(),
            target: p.shown_url.clone(),
            credential: credential_shown(p),
            body_preview: body.as_ref().map(|(preview, _)| preview.clone()),
            body_full: body.and_then(|(_, full)| full),
            timeout_ms: self.approval_timeout.as_millis() as u64,
            withdrawn: Withdrawal::default(),
        };
        let rung_asked = match ask {
            Ask::PerUse => Rung::ApproveEveryUse,
            Ask::SessionAuthorization => Rung::SessionAuthorization,
        };
        let verdict = if self.approver.may_block() {
            // A person is asked: the question and the answer are records of their own (when the
            // execution is already journaled; otherwise the `authorized`/`denied` row carries it).
            if admitted {
                self.note(
                    id,
                    "approval_requested",
                    json!({ "ask": ask, "rung": rung_asked.as_str(), "shown": &request }),
                )
                .await?;
            }
            let approver = Arc::clone(&self.approver);
            let asked = request.clone();
            let (verdict, event) =
                match self.ask_person(request.withdrawn.clone(), move || approver.authorize(&asked)).await? {
                    Asked::Answered(v) if v.allowed => (v, "approval_granted"),
                    // The approver's own clock ran out first.
                    Asked::Answered(v) if v.timed_out => (v, "approval_timed_out"),
                    Asked::Answered(v) => (v, "approval_denied"),
                    Asked::TimedOut => (
                        Authorization {
                            allowed: false,
                            rung: rung_asked.as_str().into(),
                            by: "timeout".into(),
                            reason: format!("no reviewer answered within {} s", self.approval_timeout.as_secs()),
                            grant: None,
                            timed_out: true,
                        },
                        "approval_timed_out",
                    ),
                    Asked::Locked => (
                        Authorization {
                            allowed: false,
                            rung: Rung::VaultLocked.as_str().into(),
                            by: "postern".into(),
                            reason: "the vault was locked while this request waited for a reviewer".into(),
                            grant: None,
                            timed_out: false,
                        },
                        "approval_withdrawn",
                    ),
                };
            if admitted {
                self.note(id, event, json!({ "ask": ask, "rung": rung_asked.as_str(), "decision": &verdict })).await?;
            }
            verdict
        } else {
            self.approver.authorize(&request)
        };
        if let Some(lead) = lead {
            // Answered: a later retry is decided from the journal, not joined to this question.
            lead.close();
        }
        // A refused run stays refused: its later calls are denied without asking again. (A
        // question nobody answered, or one withdrawn by the lock, is not a refusal.)
        let refused = !verdict.allowed && !verdict.timed_out && verdict.rung != Rung::VaultLocked.as_str();
        if let (Ask::SessionAuthorization, true, Some(session)) = (ask, refused, call.session) {
            let (by, at, detail) = (verdict.by.clone(), self.now(), json!({ "reason": verdict.reason }));
            self.on_store(move |store| store.set_session_standing(session, false, &by, detail, at)).await?;
        }
        if let (Ask::SessionAuthorization, true, Some(session)) = (ask, verdict.allowed, call.session) {
            self.grant_session(session, &verdict.by, json!({ "grant": verdict.grant, "reason": verdict.reason }))
                .await?;
            if verdict.grant == Some(Grant::Always) {
                let (actor, by, at) = (call.actor.as_str().to_owned(), verdict.by.clone(), self.now());
                self.on_store(move |store| store.set_allowlisted(&actor, true, &by, at)).await?;
            }
        }
        // The run's standing is on record now: later calls read it, and the gate is not kept
        // for the life of the gateway (waiters still hold their handle and re-read the standing).
        if let (Some(_), Some(session)) = (&gate, call.session) {
            self.session_gates.lock().await.remove(&session);
        }
        Ok(verdict)
    }

    fn ladder_input(&self, p: &Prepared<'_>, call: &Call) -> Result<LadderInput, EngineError> {
        let view = self.store.view();
        let session = match call.session {
            // A call without an agent run (`postern call`) comes from the person at the terminal.
            None => SessionStanding::Authorized,
            Some(s) => match view.session_standing(s)? {
                Some(true) => SessionStanding::Authorized,
                Some(false) => SessionStanding::Revoked,
                None => SessionStanding::New,
            },
        };
        let allowlisted = session == SessionStanding::New && view.allowlisted(call.actor.as_str())?;
        Ok(LadderInput {
            vault_locked: self.vault.is_locked()?,
            approve_every_use: p.credential.as_ref().is_some_and(|c| c.approve_every_use)
                || p.ssh.as_ref().is_some_and(|s| s.host.approve_every_use),
            session,
            actor_allowlisted: allowlisted,
        })
    }

    async fn grant_session(&self, session: SessionId, by: &str, detail: Value) -> Result<(), EngineError> {
        let (by, at) = (by.to_owned(), self.now());
        self.on_store(move |store| store.set_session_standing(session, true, &by, detail, at)).await?;
        Ok(())
    }

    /// Journals an event about execution `id` that does not change its state.
    async fn note(&self, id: ExecutionId, event: &'static str, detail: Value) -> Result<(), EngineError> {
        let at = self.now();
        self.on_store(move |store| store.note(id, event, detail, at)).await?;
        Ok(())
    }

    /// Puts a question to the person behind the approver: on a blocking thread, under the
    /// approval timeout, withdrawn at once if the vault is locked meanwhile.
    async fn ask_person<T: Send + 'static>(
        &self,
        withdrawn: Withdrawal,
        ask: impl FnOnce() -> T + Send + 'static,
    ) -> Result<Asked<T>, EngineError> {
        let mut answer = tokio::task::spawn_blocking(ask);
        let deadline = tokio::time::sleep(self.approval_timeout);
        tokio::pin!(deadline);
        let mut lock_check = tokio::time::interval(LOCK_CHECK_INTERVAL);
        let asked = loop {
            tokio::select! {
                joined = &mut answer => break Asked::Answered(joined.map_err(|e| EngineError::Internal(e.to_string()))?),
                () = &mut deadline => break Asked::TimedOut,
                _ = lock_check.tick() => if self.vault.is_locked()? { break Asked::Locked },
            }
        };
        if !matches!(asked, Asked::Answered(_)) {
            withdrawn.withdraw();
        }
        self.touch();
        Ok(asked)
    }

    /// The agent run behind a call, as a reviewer is shown it.
    fn agent_run(&self, call: &Call) -> Result<Option<AgentRun>, EngineError> {
        let Some(session) = call.session else { return Ok(None) };
        let Some(run) = self.store.view().session(session)? else { return Ok(None) };
        let (executable, sha256) = match run.actor.strip_prefix("process:").and_then(|a| a.rsplit_once("@sha256:")) {
            Some((exe, hash)) => (exe.to_owned(), hash.to_owned()),
            None => (run.actor.clone(), String::new()),
        };
        Ok(Some(AgentRun {
            executable,
            sha256,
            pid: run.pid,
            process_started_at: run
                .process_start
                .and_then(|t| u64::try_from(t).ok())
                .and_then(crate::identity::process_started_at_ms),
            transport: run.transport,
            client: run.client,
        }))
    }

    /// Runs a synchronous store write (it waits for the writer thread) off the async workers.
    async fn on_store<T: Send + 'static>(
        &self,
        write: impl FnOnce(&Store) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, EngineError> {
        let store = Arc::clone(&self.store);
        Ok(tokio::task::spawn_blocking(move || write(&store))
            .await
            .map_err(|e| EngineError::Internal(e.to_string()))??)
    }

    async fn authorize_and_run(
        &self,
        p: &Prepared<'_>,
        call: &Call,
        id: ExecutionId,
        decision: &str,
        attached: bool,
        lead: Option<&Lead<'_>>,
    ) -> Result<CallOutcome, EngineError> {
        let verdict = self.authorize(p, call, id, true, lead).await?;
        let detail = verdict_detail(&verdict);
        if !verdict.allowed {
            self.transition(id, ExecutionState::Denied, detail.clone()).await?;
            return Ok(self.outcome(id, ExecutionState::Denied, attached, decision, None, detail));
        }
        if call.cancel.is_cancelled() {
            let steps =
                vec![(ExecutionState::Authorized, detail), (ExecutionState::FailedBeforeDispatch, cancelled_detail())];
            self.store.transition_steps_async(id, steps, self.now()).await?;
            return Ok(self.outcome(
                id,
                ExecutionState::FailedBeforeDispatch,
                attached,
                decision,
                None,
                cancelled_detail(),
            ));
        }
        // `authorized` and `dispatched` are journaled together, in one fsync.
        self.dispatch_after(p, id, decision, attached, vec![(ExecutionState::Authorized, detail)], Attempt::First).await
    }

    /// A read-only call: authorized in memory, sent, then journaled as a whole in one
    /// transaction that does not wait for the disk (design: a retry of a read is harmless).
    async fn read_only(&self, p: &Prepared<'_>, call: &Call, new: NewExecution) -> Result<CallOutcome, EngineError> {
        let id = new.id;
        let verdict = self.authorize(p, call, id, false, None).await?;
        let auth = verdict_detail(&verdict);
        if !verdict.allowed {
            self.store.record_read_only_detached(new, vec![(ExecutionState::Denied, auth.clone())], None)?;
            return Ok(self.outcome(id, ExecutionState::Denied, false, "new_execution", None, auth));
        }
        let out = self.outgoing(p, id)?;
        let dispatched = json!({ "target": p.shown_url, "method": p.method });
        let mut steps = vec![(ExecutionState::Authorized, auth), (ExecutionState::Dispatched, dispatched)];
        let Observation { state, result, ssh, detail, completion } = self.send(p, out, Attempt::First).await?;
        if completion.is_none() {
            steps.push((state, detail.clone()));
        }
        self.store.record_read_only_detached(new, steps, completion)?;
        Ok(CallOutcome { read_only: true, ssh, ..self.outcome(id, state, false, "new_execution", result, detail) })
    }

    fn completion(&self, result: &HttpResult, elapsed: Duration) -> Result<Completion, EngineError> {
        Ok(Completion {
            outcome: json!({ "http_status": result.status, "elapsed_ms": elapsed.as_millis() as u64,
                             "truncated": result.truncated, "secret_echoed": result.secret_echoed }),
            result: serde_json::to_vec(result).map_err(|e| EngineError::Internal(e.to_string()))?,
            at: self.now(),
        })
    }

    /// What goes out for execution `id`: the HTTP request with its credential and idempotency
    /// key, or the SSH command (wrapped in the marker protocol for `ssh_marker` tools) with the
    /// host's key.
    fn outgoing(&self, p: &Prepared<'_>, id: ExecutionId) -> Result<Wire, EngineError> {
        if let Some(plan) = &p.ssh {
            let (key, passphrase) = self.vault.ssh_key_of(&plan.host)?;
            let marker = p.tool.contract.class == postern_core::ReplayClass::SshMarker;
            let command = if marker {
                crate::ssh::marker_command(&plan.host.marker_root, id, plan.working_dir.as_deref(), &plan.command)
            } else {
                crate::ssh::plain_command(id, plan.working_dir.as_deref(), &plan.command)
            };
            let kill = crate::ssh::kill_command(marker.then_some(plan.host.marker_root.as_str()), id);
            return Ok(Wire::Ssh(SshOutgoing {
                host: plan.host.clone(),
                key,
                passphrase,
                command,
                kill,
                timeout: p.tool.timeout,
                marker,
            }));
        }
        let credential = match &p.credential {
            None => None,
            Some(c) => Some(http::InjectedCredential::new(&c.kind, self.vault.secret_of(c)?)),
        };
        Ok(Wire::Http(Outgoing {
            method: p.method.clone(),
            url: p.url.clone(),
            headers: p.headers.clone(),
            body: p.body.clone(),
            credential,
            idempotency: p.tool.contract.idempotency_header.clone().map(|h| (h, id.to_string())),
            timeout: p.tool.timeout,
        }))
    }

    /// Sends what `outgoing` built and maps what happened to a state (one mapping per channel).
    async fn send(&self, p: &Prepared<'_>, wire: Wire, attempt: Attempt) -> Result<Observation, EngineError> {
        match wire {
            Wire::Http(out) => self.observe(p, http::send(&self.http, out, self.body_cap).await, attempt),
            Wire::Ssh(out) => self.observe_ssh(p, ssh_send(out).await),
        }
    }

    fn observe_ssh(&self, p: &Prepared<'_>, sent: crate::ssh::SshSent) -> Result<Observation, EngineError> {
        use crate::ssh::SshSent;
        Ok(match sent {
            SshSent::Finished { result, .. }
                if result.exit_status == Some(125) && result.stderr.contains("postern-marker: exists") =>
            {
                // Someone already created this execution's marker: it ran (or runs) elsewhere.
                Observation {
                    state: ExecutionState::OutcomeUnknown,
                    result: None,
                    ssh: None,
                    detail: json!({ "reason": "the execution's marker already exists on the host", "recovery": "ssh_marker" }),
                    completion: None,
                }
            }
            // Timed out, or the channel closed without an exit status: the command may have run
            // to any point. Unknown, not completed; the marker (or a reviewer) decides.
            SshSent::Finished { result, elapsed } if result.exit_status.is_none() && result.exit_signal.is_none() => {
                Observation {
                    state: ExecutionState::OutcomeUnknown,
                    result: None,
                    ssh: None,
                    detail: json!({
                        "reason": if result.timed_out.is_some() { "ssh_timed_out" } else { "ssh_no_exit_status" },
                        "explanation": "the remote command gave no exit status; it may have run partly or entirely",
                        "exit_signal": result.exit_signal, "timed_out": result.timed_out,
                        "elapsed_ms": elapsed.as_millis() as u64,
                        "recovery": p.tool.contract.class.as_str(),
                    }),
                    completion: None,
                }
            }
            SshSent::Finished { result, elapsed } => Observation {
                state: ExecutionState::Completed,
                completion: Some(Completion {
                    outcome: json!({ "exit_status": result.exit_status, "exit_signal": result.exit_signal,
                                     "truncated": result.truncated, "timed_out": result.timed_out,
                                     "elapsed_ms": elapsed.as_millis() as u64 }),
                    result: serde_json::to_vec(&result).map_err(|e| EngineError::Internal(e.to_string()))?,
                    at: self.now(),
                }),
                result: None,
                ssh: Some(result),
                detail: json!({}),
            },
            SshSent::NotSent { code, reason } => Observation {
                state: ExecutionState::FailedBeforeDispatch,
                result: None,
                ssh: None,
                detail: json!({ "reason": reason, "code": code }),
                completion: None,
            },
            SshSent::Unknown { reason } => Observation {
                state: ExecutionState::OutcomeUnknown,
                result: None,
                ssh: None,
                detail: json!({ "reason": reason, "recovery": p.tool.contract.class.as_str() }),
                completion: None,
            },
        })
    }

    async fn dispatch(
        &self,
        p: &Prepared<'_>,
        id: ExecutionId,
        decision: &str,
        attached: bool,
    ) -> Result<CallOutcome, EngineError> {
        self.dispatch_after(p, id, decision, attached, vec![], Attempt::First).await
    }

    /// Journals `before` and `dispatched` durably in one transaction, then sends, then journals
    /// what was observed.
    async fn dispatch_after(
        &self,
        p: &Prepared<'_>,
        id: ExecutionId,
        decision: &str,
        attached: bool,
        mut before: Vec<(ExecutionState, Value)>,
        attempt: Attempt,
    ) -> Result<CallOutcome, EngineError> {
        let out = match self.outgoing(p, id) {
            Ok(out) => out,
            Err(EngineError::Vault(e @ VaultError::Locked)) => {
                // Locked between authorization and dispatch: nothing was sent.
                let detail = json!({ "reason": "vault_locked", "message": e.to_string() });
                before.push((ExecutionState::FailedBeforeDispatch, detail.clone()));
                self.store.transition_steps_async(id, before, self.now()).await?;
                return Ok(self.outcome(id, ExecutionState::FailedBeforeDispatch, attached, decision, None, detail));
            }
            Err(e) => return Err(e),
        };
        before.push((ExecutionState::Dispatched, dispatched_detail(p, &out)));
        self.store.transition_steps_async(id, before, self.now()).await?;
        self.send_and_observe(p, id, out, decision, attached, attempt).await
    }

    /// Sends a request whose `dispatched` row is already durable, and journals what happened.
    async fn send_and_observe(
        &self,
        p: &Prepared<'_>,
        id: ExecutionId,
        out: Wire,
        decision: &str,
        attached: bool,
        attempt: Attempt,
    ) -> Result<CallOutcome, EngineError> {
        postern_store::crash::point("engine::dispatched::before_send");
        let Observation { state, result, ssh, detail, completion } = self.send(p, out, attempt).await?;
        postern_store::crash::point("engine::observed::before_journal");
        self.journal_observation(id, state, detail.clone(), completion).await?;
        postern_store::crash::point("engine::journaled::before_answer");
        Ok(CallOutcome { ssh, ..self.outcome(id, state, attached, decision, result, detail) })
    }

    /// Journals what a sent request's attempt observed. If the journal cannot be written right
    /// now (a full disk, an I/O error), the observation is kept and written as soon as the disk
    /// accepts it, by a task that retries with backoff; meanwhile the execution stays
    /// `dispatched` (a retry waits for it; a restart makes it `outcome_unknown`, verified through
    /// its contract), and the caller is told it was sent and must not be repeated.
    async fn journal_observation(
        &self,
        id: ExecutionId,
        state: ExecutionState,
        detail: Value,
        completion: Option<Completion>,
    ) -> Result<(), EngineError> {
        let at = self.now();
        let write = move |store: Arc<Store>, detail: Value, completion: Option<Completion>| async move {
            match completion {
                Some(c) => store.complete_async(id, c).await.map(drop),
                None => store.transition_steps_async(id, vec![(state, detail)], at).await.map(drop),
            }
        };
        match write(Arc::clone(&self.store), detail.clone(), completion.clone()).await {
            Ok(()) => Ok(()),
            Err(e) if e.is_unwritable() => {
                tracing::error!(execution = %id, error = %e, "the outcome of a sent request cannot be journaled yet; retrying");
                let store = Arc::clone(&self.store);
                tokio::spawn(async move {
                    let mut wait = Duration::from_millis(250);
                    loop {
                        tokio::time::sleep(wait).await;
                        match write(Arc::clone(&store), detail.clone(), completion.clone()).await {
                            Ok(()) => {
                                tracing::info!(execution = %id, "the outcome was journaled once the disk accepted it");
                                return;
                            }
                            Err(e) if e.is_unwritable() => wait = (wait * 2).min(Duration::from_secs(5)),
                            Err(e) => {
                                tracing::error!(execution = %id, error = %e, "the outcome could not be journaled");
                                return;
                            }
                        }
                    }
                });
                Err(EngineError::OutcomeNotJournaled { id, source: e })
            }
            Err(e) => Err(e.into()),
        }
    }

    /// What a send phase observed, as the state it leads to (one mapping for every path).
    fn observe(&self, p: &Prepared<'_>, sent: Sent, attempt: Attempt) -> Result<Observation, EngineError> {
        Ok(match sent {
            Sent::Response { result, .. }
                if attempt == Attempt::SameKeyResend && inconclusive_resend_status(result.status) =>
            {
                Observation {
                    state: ExecutionState::OutcomeUnknown,
                    result: None,
                    ssh: None,
                    detail: json!({
                        "reason": "same_key_resend_inconclusive",
                        "http_status": result.status,
                        "explanation": "the target's answer to the re-send with the same idempotency key says nothing \
                                        certain about the original request (in flight, key conflict, or a server \
                                        error); the outcome stays unknown — retry later",
                        "recovery": p.tool.contract.class.as_str(),
                    }),
                    completion: None,
                }
            }
            Sent::Response { result, elapsed } => Observation {
                state: ExecutionState::Completed,
                completion: Some(self.completion(&result, elapsed)?),
                result: Some(result),
                ssh: None,
                detail: json!({}),
            },
            Sent::NotSent { reason } => Observation {
                state: ExecutionState::FailedBeforeDispatch,
                result: None,
                ssh: None,
                detail: json!({ "reason": reason }),
                completion: None,
            },
            Sent::Unknown { reason } => Observation {
                state: ExecutionState::OutcomeUnknown,
                result: None,
                ssh: None,
                detail: json!({ "reason": reason, "recovery": p.tool.contract.class.as_str() }),
                completion: None,
            },
        })
    }

    async fn query_status(
        &self,
        p: &Prepared<'_>,
        id: ExecutionId,
        query: &postern_core::StatusQuery,
        decision: &str,
    ) -> Result<CallOutcome, EngineError> {
        let url = url::Url::parse(&query.url_template.replace("{execution_id}", &id.to_string()))
            .map_err(|e| RecordError::InvalidUrl { reason: e.to_string() })?;
        http::check_target(&url)?;
        let credential = match &p.credential {
            Some(c) if c.allows(&url) => Some(http::InjectedCredential::new(&c.kind, self.vault.secret_of(c)?)),
            _ => None,
        };
        let out = Outgoing {
            method: query.method.clone(),
            url,
            headers: vec![],
            body: None,
            credential,
            idempotency: None,
            timeout: p.tool.timeout,
        };
        match http::send(&self.http, out, self.body_cap).await {
            Sent::Response { result, .. } if (200..300).contains(&result.status) => {
                let bytes = serde_json::to_vec(&result).map_err(|e| EngineError::Internal(e.to_string()))?;
                let completion = Completion {
                    outcome: json!({ "verified_by": "status_query", "http_status": result.status }),
                    result: bytes,
                    at: self.now(),
                };
                self.store.complete_async(id, completion).await?;
                Ok(self.outcome(id, ExecutionState::Completed, true, decision, Some(result), json!({})))
            }
            Sent::Response { result, .. } if result.status == 404 => {
                let detail = json!({ "verified_by": "status_query", "http_status": 404 });
                self.transition(id, ExecutionState::NotExecuted, detail).await?;
                // Proven not executed: the same execution may now be dispatched.
                self.dispatch(p, id, decision, true).await
            }
            other => {
                let why = format!("the status query could not tell ({other:?})");
                self.review(id, ExecutionState::OutcomeUnknown, &why, decision).await
            }
        }
    }

    /// Recovery through the marker protocol: a fresh connection reads what the host recorded
    /// for the execution. Finished → completed with its exit status; no directory → proven not
    /// executed, dispatched again (the same execution, the same marker); started and still
    /// running → unchanged, reported; started and the wrapper gone → a person must decide.
    async fn read_marker(
        &self,
        p: &Prepared<'_>,
        id: ExecutionId,
        state: ExecutionState,
        decision: &str,
    ) -> Result<CallOutcome, EngineError> {
        use crate::ssh::Marker;
        let Some(plan) = &p.ssh else {
            return self.review(id, state, "an ssh_marker contract on a tool that is not SSH", decision).await;
        };
        let unreadable =
            |why: String| json!({ "reason": format!("the marker could not be read: {why}"), "recovery": "ssh_marker" });
        let (key, passphrase) = self.vault.ssh_key_of(&plan.host)?;
        let probe = crate::ssh::marker_probe(&plan.host.marker_root, id);
        let answer = match crate::ssh::connect(&plan.host, &key, passphrase.as_ref()).await {
            Ok(connection) => {
                let sent = connection.exec(&probe, Duration::from_secs(15), 4096, None).await;
                connection.close().await;
                sent
            }
            Err(e) => return Ok(self.outcome(id, state, true, decision, None, unreadable(e.to_string()))),
        };
        let line = match answer {
            crate::ssh::SshSent::Finished { result, .. } if result.exit_status == Some(0) => result.stdout,
            other => return Ok(self.outcome(id, state, true, decision, None, unreadable(format!("{other:?}")))),
        };
        let Some(marker) = crate::ssh::parse_marker(&line) else {
            return Ok(self.outcome(
                id,
                state,
                true,
                decision,
                None,
                unreadable(format!("unexpected answer {line:?}")),
            ));
        };
        match marker {
            Marker::Finished { exit_status, finished_at } => {
                let result = crate::ssh::SshResult {
                    exit_status: Some(exit_status),
                    exit_signal: None,
                    stdout: String::new(),
                    stderr: String::new(),
                    truncated: false,
                    timed_out: None,
                    from_marker: true,
                };
                let completion = Completion {
                    outcome: json!({ "verified_by": "ssh_marker", "exit_status": exit_status, "finished_at": finished_at,
                                     "output": "lost with the connection; the exit status is the marker's" }),
                    result: serde_json::to_vec(&result).map_err(|e| EngineError::Internal(e.to_string()))?,
                    at: self.now(),
                };
                self.store.complete_async(id, completion).await?;
                let detail = json!({ "verified_by": "ssh_marker" });
                Ok(CallOutcome {
                    ssh: Some(result),
                    ..self.outcome(id, ExecutionState::Completed, true, decision, None, detail)
                })
            }
            Marker::Absent => {
                let detail = json!({ "verified_by": "ssh_marker", "marker": "absent" });
                self.transition(id, ExecutionState::NotExecuted, detail).await?;
                // Proven not started: the same execution may now be dispatched (its marker makes
                // a second start impossible).
                self.dispatch(p, id, decision, true).await
            }
            Marker::Running { pid, started_at } => {
                let detail = json!({
                    "reason": format!("still running on the host (pid {pid}); ask again later"),
                    "verified_by": "ssh_marker", "started_at": started_at,
                });
                Ok(self.outcome(id, state, true, decision, None, detail))
            }
            Marker::Died { pid, started_at } => {
                let why = format!(
                    "the command started (pid {pid}) and its wrapper died without recording an exit status; it may \
                     have done part of its work"
                );
                let mut out = self.review(id, state, &why, decision).await?;
                out.detail["started_at"] = json!(started_at);
                Ok(out)
            }
            Marker::Created => {
                self.review(id, state, "the marker was created but the command's start was not recorded", decision)
                    .await
            }
        }
    }

    async fn review(
        &self,
        id: ExecutionId,
        state: ExecutionState,
        why: &str,
        decision: &str,
    ) -> Result<CallOutcome, EngineError> {
        let detail = json!({ "reason": why });
        if state == ExecutionState::OutcomeUnknown {
            self.transition(id, ExecutionState::NeedsReview, detail.clone()).await?;
        }
        Ok(self.outcome(id, ExecutionState::NeedsReview, true, decision, None, detail))
    }

    async fn stored(&self, id: ExecutionId, state: ExecutionState, decision: &str) -> Result<CallOutcome, EngineError> {
        let stored = self.store.view().result(id)?;
        let (mut result, mut ssh) = (None, None);
        if let Some(r) = stored {
            match serde_json::from_slice::<HttpResult>(&r.body) {
                Ok(http) => result = Some(http),
                Err(_) => {
                    ssh = Some(
                        serde_json::from_slice::<crate::ssh::SshResult>(&r.body)
                            .map_err(|e| EngineError::Internal(format!("stored result of {id}: {e}")))?,
                    );
                }
            }
        }
        Ok(CallOutcome {
            ssh,
            ..self.outcome(id, state, true, decision, result, json!({ "returned": "stored_result" }))
        })
    }

    /// Waits (bounded) for a dispatched execution to leave `dispatched`, then reports it.
    async fn wait_for(&self, id: ExecutionId, limit: Duration, decision: &str) -> Result<CallOutcome, EngineError> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let current = self.store.view().execution(id)?.ok_or(StoreError::UnknownExecution(id))?;
            let state: ExecutionState = current
                .state
                .parse()
                .map_err(|e: postern_core::lifecycle::UnknownState| EngineError::Internal(e.to_string()))?;
            if state != ExecutionState::Dispatched || tokio::time::Instant::now() >= deadline {
                return match state {
                    ExecutionState::Completed
                    | ExecutionState::CompletedResultNotDelivered
                    | ExecutionState::ResultDelivered => self.stored(id, state, decision).await,
                    other => Ok(self.outcome(id, other, true, decision, None, json!({ "waited_for": id }))),
                };
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// What a call that reached execution `id` (with retry decision `decision`) is answered with,
    /// read from the journal: `None` while it is in flight (accepted, authorized, dispatched). A
    /// client resuming a broken stream gets this ([`crate::resumption`]), not a new execution.
    pub async fn answer_on_record(&self, id: ExecutionId, decision: &str) -> Result<Option<CallOutcome>, EngineError> {
        let current = self.store.view().execution(id)?.ok_or(StoreError::UnknownExecution(id))?;
        let state: ExecutionState = current
            .state
            .parse()
            .map_err(|e: postern_core::lifecycle::UnknownState| EngineError::Internal(e.to_string()))?;
        let attached = decision != RetryDecision::NewExecution.name();
        let read_only = current.contract["class"] == "read_only";
        let outcome = match state {
            ExecutionState::Accepted | ExecutionState::Authorized | ExecutionState::Dispatched => return Ok(None),
            ExecutionState::Completed
            | ExecutionState::CompletedResultNotDelivered
            | ExecutionState::ResultDelivered => {
                CallOutcome { detail: json!({ "returned": "on_record" }), ..self.stored(id, state, decision).await? }
            }
            other => {
                // Why it is in this state: the row that put it there.
                let why = self
                    .store
                    .view()
                    .timeline(id)?
                    .into_iter()
                    .rev()
                    .find(|e| e.row.state == Some(other))
                    .map_or(Value::Null, |e| e.row.detail);
                self.outcome(id, other, attached, decision, None, why)
            }
        };
        Ok(Some(CallOutcome { attached, read_only, ..outcome }))
    }

    /// Keeps a Streamable HTTP session's `initialize` parameters so it survives a restart.
    pub async fn remember_mcp_session(&self, id: String, initialize: String) -> Result<(), EngineError> {
        let at = self.now();
        self.on_store(move |store| store.remember_mcp_session(&id, &initialize, at)).await
    }

    /// Forgets a Streamable HTTP session its client ended.
    pub async fn forget_mcp_session(&self, id: String) -> Result<(), EngineError> {
        self.on_store(move |store| store.forget_mcp_session(&id)).await
    }

    /// Journals that a client resumed its broken stream and is being handed execution `id`'s
    /// answer (evidence for an investigator; delivery is settled as for any answer).
    pub async fn stream_resumed(&self, id: ExecutionId, detail: Value) -> Result<(), EngineError> {
        self.note(id, "stream_resumed", detail).await
    }

    /// Journals a cancellation that arrived once the execution was past the point of no return
    /// (dispatched or later): evidence only, the state stays what was observed.
    pub async fn cancel_requested(&self, id: ExecutionId, reason: Option<String>) -> Result<(), EngineError> {
        let at = self.now();
        let detail = json!({ "reason": reason, "effect": "none: the request had already been sent" });
        self.on_store(move |store| store.note(id, "cancel_requested", detail, at)).await?;
        Ok(())
    }

    /// The journal the engine writes to (read side), for status lookups.
    pub fn view(&self) -> &postern_store::JournalView {
        self.store.view()
    }

    /// Records whether the outcome reached the agent (where the transport can tell).
    pub async fn delivered(&self, id: ExecutionId, reached_agent: bool) -> Result<(), EngineError> {
        let current = self.store.view().execution(id)?.ok_or(StoreError::UnknownExecution(id))?;
        let to =
            if reached_agent { ExecutionState::ResultDelivered } else { ExecutionState::CompletedResultNotDelivered };
        let state: ExecutionState = current
            .state
            .parse()
            .map_err(|e: postern_core::lifecycle::UnknownState| EngineError::Internal(e.to_string()))?;
        if state.transition(to).is_ok() {
            self.transition(id, to, json!({})).await?;
        }
        Ok(())
    }
}

fn dispatched_detail(p: &Prepared<'_>, out: &Wire) -> Value {
    match out {
        Wire::Http(out) => json!({ "target": p.shown_url, "method": p.method,
                                   "idempotency_key": out.idempotency.as_ref().map(|(_, k)| k) }),
        Wire::Ssh(out) => json!({ "target": p.shown_url, "method": p.method, "host": out.host.name,
                                  "host_key": out.host.host_key_fingerprint, "marker": out.marker }),
    }
}

/// One SSH execution: connect (host key, authentication), run, disconnect. Every failure before
/// the `exec` request is `NotSent`.
async fn ssh_send(out: SshOutgoing) -> crate::ssh::SshSent {
    use postern_core::ErrorCode as _;
    let connection = match crate::ssh::connect(&out.host, &out.key, out.passphrase.as_ref()).await {
        Ok(c) => c,
        Err(e) => return crate::ssh::SshSent::NotSent { code: e.code(), reason: e.to_string() },
    };
    let sent = connection.exec(&out.command, out.timeout, crate::ssh::DEFAULT_OUTPUT_CAP, Some(&out.kill)).await;
    connection.close().await;
    sent
}

fn getrandom_fill(buf: &mut [u8]) -> Result<(), EngineError> {
    getrandom::fill(buf).map_err(|e| EngineError::Internal(format!("no randomness: {e}")))
}

//! The engine: one call travels accept → authorize → dispatch → observe → deliver, and every
//! retry is decided from the journal (design §3–§4), never from the transport.

use crate::{
    http::{self, HttpResult, Outgoing, Sent},
    manifest::{ArgumentError, Manifest, Tool},
};
use postern_core::{
    ActionRequest, ActionTarget, Actor, CanonicalAction, Channel, ErrorCode, ExecutionId, ExecutionState,
    FingerprintKey, HttpAction, IntentScope, LadderDecision, LadderInput, RecordError, RetryDecision, ReviewReason,
    Rung, SessionId, SessionStanding, Timestamp, Verification, decide_ladder,
};
use postern_store::{Admission, Completion, NewExecution, Store, StoreError};
use postern_vault::{CredentialKind, Sensitive, Vault, VaultError};
use serde::Serialize;
use serde_json::{Value, json};
use std::{sync::Arc, time::Duration};

/// What a reviewer is asked (design §6). The ladder decides whether anyone is asked at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Ask {
    /// This exact call (bound to its fingerprint): never turns into a session grant.
    PerUse,
    /// The agent run, once.
    SessionAuthorization,
}

/// What the reviewer is shown (design §6): never a secret.
#[derive(Debug, Clone, Serialize)]
pub struct AuthorizationRequest {
    pub ask: Ask,
    pub execution_id: ExecutionId,
    pub session: Option<SessionId>,
    pub tool: String,
    pub actor: String,
    pub method: String,
    pub target: String,
    pub credential: Option<String>,
    /// How long the reviewer has (then the call is denied, `approval_timed_out`).
    pub timeout_ms: u64,
}

/// Default time a reviewer has to answer.
pub const DEFAULT_APPROVAL_TIMEOUT: Duration = Duration::from_secs(120);

/// A session-authorization answer beyond "this time".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Grant {
    /// Allow this agent run.
    Session,
    /// Allow this run, and every later run of the same actor (executable hash) without asking.
    Always,
}

/// The verdict, journaled with the `authorized` or `denied` row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Authorization {
    pub allowed: bool,
    /// Which rung decided: `vault_locked`, `approve_every_use`, `session_authorization`,
    /// `allowlist`, `run`.
    pub rung: String,
    pub by: String,
    pub reason: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grant: Option<Grant>,
    /// Nobody answered in time.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub timed_out: bool,
}

/// The `authorized` / `denied` row's detail for a verdict.
fn verdict_detail(v: &Authorization) -> Value {
    let mut detail = json!({ "rung": v.rung, "by": v.by, "reason": v.reason });
    if v.timed_out {
        detail["code"] = json!("approval_timed_out");
    }
    detail
}

/// Answers what the ladder asks (per-use approval, session authorization). The desktop app and
/// the terminal approver ask a person; this crate ships [`LockOnlyApprover`].
pub trait Approver: Send + Sync + std::fmt::Debug {
    fn authorize(&self, request: &AuthorizationRequest) -> Authorization;

    /// Whether `authorize` may wait (for a person, a dialog): then it runs on a blocking thread.
    fn may_block(&self) -> bool {
        true
    }
}

/// The headless policy when no reviewer runs (`postern serve` without an approver): a per-use
/// approval is denied, because there is no one to ask; an agent run is authorized by policy,
/// journaled as `session_authorized` by `policy:no-reviewer`. (A locked vault and a revoked run
/// are denied by the ladder before any approver is consulted.)
#[derive(Debug, Default)]
pub struct LockOnlyApprover;

impl Approver for LockOnlyApprover {
    fn may_block(&self) -> bool {
        false
    }

    fn authorize(&self, r: &AuthorizationRequest) -> Authorization {
        match r.ask {
            Ask::PerUse => Authorization {
                allowed: false,
                rung: "approve_every_use".into(),
                by: "postern".into(),
                reason: "this credential needs a reviewer's approval and no approver is running".into(),
                grant: None,
                timed_out: false,
            },
            Ask::SessionAuthorization => Authorization {
                allowed: true,
                rung: "session_authorization".into(),
                by: "policy:no-reviewer".into(),
                reason: "no reviewer is running; agent runs are authorized by policy".into(),
                grant: Some(Grant::Session),
                timed_out: false,
            },
        }
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
    #[error("the engine's worker failed: {0}")]
    Internal(String),
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
            EngineError::Internal(_) => "internal_error",
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
    http: reqwest::Client,
    clock: Clock,
    body_cap: usize,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine").field("tools", &self.manifest.tools().count()).finish_non_exhaustive()
    }
}

/// The outcome of one send, before it is journaled.
struct Observation {
    state: ExecutionState,
    result: Option<HttpResult>,
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
    url: url::Url,
    method: String,
    headers: Vec<(String, String)>,
    body: Option<Vec<u8>>,
    credential: Option<postern_vault::Credential>,
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
            None => return Err(EngineError::UnknownTool(call.tool.clone())),
        };
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
                Some(c)
            }
        };
        let prepared = Prepared {
            tool: ToolRef::Manifest(tool),
            url,
            method: rendered.method,
            headers: rendered.headers,
            body: rendered.body,
            credential,
        };
        Ok((prepared, arguments))
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
            headers.push((name.to_ascii_lowercase(), value.as_str().unwrap_or_default().to_owned()));
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
        if !postern_core::contract::is_safe_method(&method) {
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
        let tool = Tool::http_request(&method, url.as_str(), contract, crate::manifest::DEFAULT_TIMEOUT);
        let prepared = Prepared { tool: ToolRef::Builtin(Box::new(tool)), url, method, headers, body, credential };
        Ok((prepared, args))
    }

    /// Handles one call end to end. Errors are reserved for calls that never became an
    /// execution (unknown tool, invalid arguments, unsafe target, …); every execution's fate —
    /// denied, failed before dispatch, outcome unknown, completed — is a [`CallOutcome`].
    pub async fn call(&self, call: Call) -> Result<CallOutcome, EngineError> {
        let (p, arguments) = self.prepare(&call)?;
        // A contract may widen the scope beyond the agent run (design §5: e.g. a rotation).
        let intent_scope = match p.tool.contract.scope {
            postern_core::contract::ScopePolicy::Durable => IntentScope::durable(),
            postern_core::contract::ScopePolicy::AgentRun => call.intent_scope.clone(),
        };
        let action = CanonicalAction::build(
            &ActionRequest {
                actor: call.actor.clone(),
                tool: p.tool.name.clone(),
                target: ActionTarget::Http(HttpAction {
                    method: p.method.clone(),
                    url: p.url.to_string(),
                    headers: p.headers.clone(),
                }),
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
        let new = NewExecution {
            id: ExecutionId::from_parts(at, u128::from_le_bytes(random)),
            fingerprint: action.fingerprint(&self.key),
            actor: call.actor.clone(),
            intent_scope,
            session_id: call.session,
            tool: p.tool.name.clone(),
            channel: Channel::Http,
            contract: p.tool.contract.clone(),
            record: action.record().clone(),
            correlation: call.correlation.clone(),
            at,
        };
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
            let verdict = self.authorize(&p, &call, id, false).await?;
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
                    self.send_and_observe(&p, id, out, "new_execution", false).await
                }
                Admission::Accepted { .. } => {
                    Ok(self.outcome(id, ExecutionState::Denied, false, "new_execution", None, auth))
                }
                Admission::Matched { prior, decision } => self.act_on(&p, &call, prior.id, prior.state, decision).await,
            };
        }
        match self.store.admit_async(new).await? {
            Admission::Accepted { id } => self.authorize_and_run(&p, &call, id, "new_execution", false).await,
            Admission::Matched { prior, decision } => self.act_on(&p, &call, prior.id, prior.state, decision).await,
        }
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
        match decision {
            RetryDecision::NewExecution => Err(EngineError::Internal("a match cannot decide new_execution".into())),
            RetryDecision::ContinuePrior { .. } => match state {
                ExecutionState::Accepted => self.authorize_and_run(p, call, id, name, true).await,
                // Authorized, or verified not executed: nothing was sent, carry on with this one.
                _ => self.dispatch(p, id, name, true).await,
            },
            RetryDecision::WaitForPrior { .. } => {
                self.wait_for(id, p.tool.timeout + Duration::from_secs(5), name).await
            }
            RetryDecision::VerifyPrior { verification: Verification::ResendWithSameKey { .. }, .. } => {
                self.dispatch(p, id, name, true).await
            }
            RetryDecision::VerifyPrior { verification: Verification::QueryStatus { query }, .. } => {
                self.query_status(p, id, &query, name).await
            }
            RetryDecision::VerifyPrior { verification: Verification::ReadSshMarker, .. } => {
                self.review(id, state, "ssh_marker verification needs the SSH channel", name).await
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

    fn outcome(
        &self,
        id: ExecutionId,
        state: ExecutionState,
        attached: bool,
        decision: &str,
        result: Option<HttpResult>,
        detail: Value,
    ) -> CallOutcome {
        CallOutcome { execution_id: id, state, attached, read_only: false, decision: decision.into(), result, detail }
    }

    /// The approval ladder (design §6): the pure decision in `postern_core::decide_ladder`,
    /// the approver asked only where it says so, one session-authorization question per run.
    async fn authorize(
        &self,
        p: &Prepared<'_>,
        call: &Call,
        id: ExecutionId,
        admitted: bool,
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
        let request = AuthorizationRequest {
            ask,
            execution_id: id,
            session: call.session,
            tool: p.tool.name.clone(),
            actor: call.actor.as_str().to_owned(),
            method: p.method.clone(),
            target: p.url.to_string(),
            credential: p.credential.as_ref().map(|c| c.name.clone()),
            timeout_ms: self.approval_timeout.as_millis() as u64,
        };
        let verdict = if self.approver.may_block() {
            // A person is asked: the question and the answer are records of their own (when the
            // execution is already journaled; otherwise the `authorized`/`denied` row carries it).
            if admitted {
                let detail = json!({ "ask": ask, "shown": &request });
                let at = self.now();
                self.on_store(move |store| store.note(id, "approval_requested", detail, at)).await?;
            }
            let approver = Arc::clone(&self.approver);
            let asked = request.clone();
            let answer = tokio::time::timeout(
                self.approval_timeout,
                tokio::task::spawn_blocking(move || approver.authorize(&asked)),
            )
            .await;
            let verdict = match answer {
                Ok(joined) => joined.map_err(|e| EngineError::Internal(e.to_string()))?,
                Err(_) => Authorization {
                    allowed: false,
                    rung: match ask {
                        Ask::PerUse => Rung::ApproveEveryUse.as_str().into(),
                        Ask::SessionAuthorization => Rung::SessionAuthorization.as_str().into(),
                    },
                    by: "timeout".into(),
                    reason: format!("no reviewer answered within {} s", self.approval_timeout.as_secs()),
                    grant: None,
                    timed_out: true,
                },
            };
            if admitted {
                let event = match (verdict.timed_out, verdict.allowed) {
                    (true, _) => "approval_timed_out",
                    (false, true) => "approval_granted",
                    (false, false) => "approval_denied",
                };
                let detail = json!({ "ask": ask, "decision": &verdict });
                let at = self.now();
                self.on_store(move |store| store.note(id, event, detail, at)).await?;
            }
            verdict
        } else {
            self.approver.authorize(&request)
        };
        // A refused run stays refused: its later calls are denied without asking again. (A
        // question nobody answered is not a refusal.)
        if let (Ask::SessionAuthorization, false, false, Some(session)) =
            (ask, verdict.allowed, verdict.timed_out, call.session)
        {
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
            approve_every_use: p.credential.as_ref().is_some_and(|c| c.approve_every_use),
            session,
            actor_allowlisted: allowlisted,
        })
    }

    async fn grant_session(&self, session: SessionId, by: &str, detail: Value) -> Result<(), EngineError> {
        let (by, at) = (by.to_owned(), self.now());
        self.on_store(move |store| store.set_session_standing(session, true, &by, detail, at)).await?;
        Ok(())
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
    ) -> Result<CallOutcome, EngineError> {
        let verdict = self.authorize(p, call, id, true).await?;
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
        self.dispatch_after(p, id, decision, attached, vec![(ExecutionState::Authorized, detail)]).await
    }

    /// A read-only call: authorized in memory, sent, then journaled as a whole in one
    /// transaction that does not wait for the disk (design: a retry of a read is harmless).
    async fn read_only(&self, p: &Prepared<'_>, call: &Call, new: NewExecution) -> Result<CallOutcome, EngineError> {
        let id = new.id;
        let verdict = self.authorize(p, call, id, false).await?;
        let auth = verdict_detail(&verdict);
        if !verdict.allowed {
            self.store.record_read_only_detached(new, vec![(ExecutionState::Denied, auth.clone())], None)?;
            return Ok(self.outcome(id, ExecutionState::Denied, false, "new_execution", None, auth));
        }
        let out = self.outgoing(p, id)?;
        let dispatched = json!({ "target": p.url.to_string(), "method": p.method });
        let mut steps = vec![(ExecutionState::Authorized, auth), (ExecutionState::Dispatched, dispatched)];
        let Observation { state, result, detail, completion } =
            self.observe(p, http::send(&self.http, out, self.body_cap).await)?;
        if completion.is_none() {
            steps.push((state, detail.clone()));
        }
        self.store.record_read_only_detached(new, steps, completion)?;
        Ok(CallOutcome { read_only: true, ..self.outcome(id, state, false, "new_execution", result, detail) })
    }

    fn completion(&self, result: &HttpResult, elapsed: Duration) -> Result<Completion, EngineError> {
        Ok(Completion {
            outcome: json!({ "http_status": result.status, "elapsed_ms": elapsed.as_millis() as u64,
                             "truncated": result.truncated, "secret_echoed": result.secret_echoed }),
            result: serde_json::to_vec(result).map_err(|e| EngineError::Internal(e.to_string()))?,
            at: self.now(),
        })
    }

    /// The request for execution `id`, with its credential and idempotency key.
    fn outgoing(&self, p: &Prepared<'_>, id: ExecutionId) -> Result<Outgoing, EngineError> {
        let credential = match &p.credential {
            None => None,
            Some(c) => Some(credential_header(&c.kind, self.vault.secret_of(c)?)),
        };
        Ok(Outgoing {
            method: p.method.clone(),
            url: p.url.clone(),
            headers: p.headers.clone(),
            body: p.body.clone(),
            credential,
            idempotency: p.tool.contract.idempotency_header.clone().map(|h| (h, id.to_string())),
            timeout: p.tool.timeout,
        })
    }

    async fn dispatch(
        &self,
        p: &Prepared<'_>,
        id: ExecutionId,
        decision: &str,
        attached: bool,
    ) -> Result<CallOutcome, EngineError> {
        self.dispatch_after(p, id, decision, attached, vec![]).await
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
        self.send_and_observe(p, id, out, decision, attached).await
    }

    /// Sends a request whose `dispatched` row is already durable, and journals what happened.
    async fn send_and_observe(
        &self,
        p: &Prepared<'_>,
        id: ExecutionId,
        out: Outgoing,
        decision: &str,
        attached: bool,
    ) -> Result<CallOutcome, EngineError> {
        let Observation { state, result, detail, completion } =
            self.observe(p, http::send(&self.http, out, self.body_cap).await)?;
        match completion {
            Some(completion) => {
                self.store.complete_async(id, completion).await?;
            }
            None => self.transition(id, state, detail.clone()).await?,
        }
        Ok(self.outcome(id, state, attached, decision, result, detail))
    }

    /// What a send phase observed, as the state it leads to (one mapping for every path).
    fn observe(&self, p: &Prepared<'_>, sent: Sent) -> Result<Observation, EngineError> {
        Ok(match sent {
            Sent::Response { result, elapsed } => Observation {
                state: ExecutionState::Completed,
                completion: Some(self.completion(&result, elapsed)?),
                result: Some(result),
                detail: json!({}),
            },
            Sent::NotSent { reason } => Observation {
                state: ExecutionState::FailedBeforeDispatch,
                result: None,
                detail: json!({ "reason": reason }),
                completion: None,
            },
            Sent::Unknown { reason } => Observation {
                state: ExecutionState::OutcomeUnknown,
                result: None,
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
            Some(c) if c.allows(&url) => Some(credential_header(&c.kind, self.vault.secret_of(c)?)),
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
        let result = stored
            .map(|r| serde_json::from_slice::<HttpResult>(&r.body))
            .transpose()
            .map_err(|e| EngineError::Internal(format!("stored result of {id}: {e}")))?;
        Ok(self.outcome(id, state, true, decision, result, json!({ "returned": "stored_result" })))
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

fn dispatched_detail(p: &Prepared<'_>, out: &Outgoing) -> Value {
    json!({ "target": p.url.to_string(), "method": p.method, "idempotency_key": out.idempotency.as_ref().map(|(_, k)| k) })
}

fn credential_header(kind: &CredentialKind, secret: Sensitive<String>) -> (String, Sensitive<String>) {
    match kind {
        CredentialKind::Bearer => ("authorization".into(), Sensitive::new(format!("Bearer {}", secret.expose()))),
        CredentialKind::Basic { username } => {
            use base64::Engine as _;
            let token = base64::engine::general_purpose::STANDARD.encode(format!("{username}:{}", secret.expose()));
            ("authorization".into(), Sensitive::new(format!("Basic {token}")))
        }
        CredentialKind::Header { name } => (name.to_ascii_lowercase(), secret),
    }
}

fn getrandom_fill(buf: &mut [u8]) -> Result<(), EngineError> {
    getrandom::fill(buf).map_err(|e| EngineError::Internal(format!("no randomness: {e}")))
}

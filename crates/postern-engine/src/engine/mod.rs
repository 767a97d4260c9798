//! The engine: one call travels accept → authorize → dispatch → observe → deliver, and every
//! retry is decided from the journal (docs/src/design.md, the lifecycle, retry decisions), never from the transport.

mod authorize;
mod call;
mod detail;
mod dispatch;
mod in_flight;
mod outcome;
mod prepare;
mod questions;
mod recover;

pub use crate::approval::{
    AgentRun, Approver, Ask, Authorization, AuthorizationRequest, DEFAULT_APPROVAL_TIMEOUT, Grant, LockOnlyApprover,
    RetryReviewRequest, ReviewAnswer, ReviewChoice, ReviewVerdict, TimelineStep, Withdrawal,
};
use crate::{
    catalog::manifest::{ArgumentError, Manifest, Tool},
    catalog::redaction::CallSecrets,
    channel::http::{self, HttpResult, Outgoing, Sent},
};
use call::cancelled_detail;
pub use call::{Bound, Call, CallOutcome, CancelSignal, Decision, EngineError, Opening, UnknownDecision};
pub use detail::{CANCELLED, StepDetail, UnreadableDetail};
pub use in_flight::{CALLS_IN_FLIGHT_IN_ALL, CALLS_IN_FLIGHT_PER_AGENT};
pub use outcome::{ChannelAnswer, Settled};
use outcome::{Observation, Raw};
use postern_core::{
    ActionRequest, ActionTarget, CanonicalAction, Channel, ErrorCode, ExecutionId, ExecutionState, FingerprintKey,
    HttpAction, IntentScope, LadderDecision, LadderInput, RecordError, RetryDecision, ReviewReason, Rung, SessionId,
    SessionStanding, Timestamp, Verification, decide_ladder,
};
use postern_store::{ActivityNote, Admission, Completion, Event, NewExecution, Store, StoreError};
use postern_vault::{Sensitive, Vault, VaultError};
pub use questions::{QUESTIONS_IN_ALL, QUESTIONS_PER_AGENT};
use serde_json::{Value, json};
use std::{collections::BTreeSet, sync::Arc, time::Duration};

/// The `authorized` / `denied` row's detail for a verdict.
fn verdict_detail(v: &Authorization) -> StepDetail {
    let detail = StepDetail::because(&v.reason).decided(v.rung.as_str(), &v.by);
    if v.timed_out { detail.code("approval_timed_out") } else { detail }
}

/// The credential a reviewer is told about: its name, or the SSH host whose key is used.
fn credential_shown(p: &Prepared<'_>) -> Option<String> {
    match &p.target {
        Target::Ssh(plan) => Some(format!(
            "ssh key of host {} ({})",
            plan.host.name,
            plan.host.host_key_fingerprint.as_deref().unwrap_or("key not pinned yet")
        )),
        Target::Http(plan) => plan.credential.as_ref().map(|c| c.name.clone()),
        Target::Mcp(plan) => Some(format!("the environment of MCP server {}", plan.server)),
    }
}

/// How a question put to a person ended.
enum Asked<T> {
    Answered(T),
    /// Nobody answered within the approval timeout.
    TimedOut,
    /// The vault was locked while the question was open.
    Locked,
    /// Never put: the places in line stayed taken for the whole timeout (nothing was shown,
    /// and nothing journaled as asked).
    OutOfTurn,
    /// Never put: the vault was locked while it waited in line.
    LockedInLine,
}

impl<T> Asked<T> {
    /// Whether the question was put (and its asking journaled), whatever became of it.
    fn was_put(&self) -> bool {
        !matches!(self, Asked::OutOfTurn | Asked::LockedInLine)
    }
}

/// What a call that joined another call's pending request receives: the same outcome.
type Shared = Option<Result<CallOutcome, (&'static str, String)>>;

/// Calls waiting for a person (an approval, a retry review), by execution: a retry of the same
/// execution joins the open request instead of raising a second one.
#[derive(Default)]
struct OpenRequests {
    next: std::sync::atomic::AtomicU64,
    open: std::sync::Mutex<std::collections::HashMap<ExecutionId, OpenRequest>>,
}

/// One execution someone is handling: the leader's token, where its outcome will be told, and
/// the leader's cancel signal (a joiner keeps the execution wanted).
type OpenRequest = (u64, tokio::sync::watch::Receiver<Shared>, CancelSignal);

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
    /// Lead execution `id`'s handling, or join whoever leads it; `cancel` is the caller's.
    fn turn(&self, id: ExecutionId, cancel: &CancelSignal) -> Turn<'_> {
        let mut open = self.open.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((_, rx, lead)) = open.get(&id) {
            lead.joined_by(cancel);
            return Turn::Join(rx.clone());
        }
        let token = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (tx, rx) = tokio::sync::watch::channel(None);
        open.insert(id, (token, rx, cancel.clone()));
        Turn::Lead(Lead { requests: self, id, token, tx })
    }
}

impl Lead<'_> {
    fn close(&self) {
        let mut open = self.requests.open.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if open.get(&self.id).is_some_and(|(token, ..)| *token == self.token) {
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

pub use postern_core::Clock;

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
    /// The places in line for a person's attention: a few per run, a bounded number in all.
    questions: questions::Questions,
    /// The calls under way, a bounded number per agent.
    in_flight: in_flight::CallsInFlight,
    /// When the last call arrived or the last question was answered (ms), for the idle lock.
    last_activity: std::sync::atomic::AtomicI64,
    http: reqwest::Client,
    clock: Clock,
    /// The most bytes a result may hold, for every channel (the outcome stage holds them to it).
    max_result_bytes: usize,
    /// Authenticated SSH connections kept for reuse.
    ssh: crate::channel::ssh_pool::SshPool,
    /// The upstream MCP servers whose tools are offered beside Postern's own.
    upstreams: Option<Arc<crate::channel::upstream::Upstreams>>,
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
    /// Where the call goes and what it carries, per channel.
    target: Target,
    /// The secret values this call carries (the contract's `secret_fields`; for `http_request`,
    /// headers and query parameters named like secrets): masked in all Postern writes or shows.
    secrets: CallSecrets,
    /// Where the call goes, with its secrets masked: the HTTP URL, or
    /// `ssh://account@address:port/`. What records, journal rows and reviewers see.
    shown_url: String,
}

/// A call's destination, one variant per channel.
enum Target {
    Http(HttpPlan),
    Ssh(SshPlan),
    Mcp(McpPlan),
}

/// A call to an upstream MCP server's tool, after validation against the upstream's schema.
struct McpPlan {
    server: String,
    /// The upstream's own name for the tool.
    tool: String,
    operation: postern_core::McpOperation,
    arguments: serde_json::Map<String, Value>,
    approve_every_use: bool,
}

impl Prepared<'_> {
    /// An SSH command as records, journal rows and reviewers see it.
    fn shown_command(&self, plan: &SshPlan) -> String {
        self.secrets.mask(&plan.command)
    }

    /// The verb journaled and shown: the HTTP method, or `EXEC` for an SSH command.
    fn method(&self) -> &str {
        match &self.target {
            Target::Http(plan) => &plan.method,
            Target::Ssh(_) => "EXEC",
            Target::Mcp(_) => "CALL",
        }
    }

    fn channel(&self) -> Channel {
        match &self.target {
            Target::Http(_) => Channel::Http,
            Target::Ssh(_) => Channel::Ssh,
            Target::Mcp(_) => Channel::Mcp,
        }
    }

    /// Does the credential (or SSH host) this call uses need a reviewer for every use?
    fn approve_every_use(&self) -> bool {
        match &self.target {
            Target::Http(plan) => plan.credential.as_ref().is_some_and(|c| c.approve_every_use),
            Target::Ssh(plan) => plan.host.approve_every_use,
            Target::Mcp(plan) => plan.approve_every_use,
        }
    }

    /// The credential an HTTP call injects (none for SSH: the host's key is not a credential
    /// reference of the record).
    fn credential(&self) -> Option<&postern_vault::Credential> {
        match &self.target {
            Target::Http(plan) => plan.credential.as_ref(),
            Target::Ssh(_) | Target::Mcp(_) => None,
        }
    }

    /// An SSH call to a host whose key is not pinned yet (`accept-new`, first contact).
    fn unpinned_host(&mut self) -> Option<&mut SshPlan> {
        match &mut self.target {
            Target::Ssh(plan) if plan.host.host_key_fingerprint.is_none() => Some(plan),
            _ => None,
        }
    }
}

/// An HTTP call after validation: the request as it will be sent (before its credential and
/// idempotency key are added).
struct HttpPlan {
    url: url::Url,
    method: String,
    headers: Vec<(String, String)>,
    body: Option<Vec<u8>>,
    credential: Option<postern_vault::Credential>,
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
    Mcp(McpOutgoing),
}

impl Wire {
    /// The keyed digest of what this sends, its credential left out (the vault adds that as it
    /// goes): the same request to the same place, or not. Journaled with `dispatched`; a recovery
    /// re-send goes out only if its digest is the first attempt's.
    fn digest(&self, key: &FingerprintKey) -> String {
        use sha2::Digest as _;
        // A JSON body is compared by its value (a retry may space it otherwise: the same request
        // to any reader of it), any other body byte for byte.
        let body = |bytes: &[u8]| {
            let value = std::str::from_utf8(bytes).ok().and_then(postern_core::canonical::json_text);
            match value.and_then(|v| postern_core::canonical_bytes(&v).ok()) {
                Some(canonical) => format!("json:{}", hex::encode(sha2::Sha256::digest(canonical))),
                None => format!("bytes:{}", hex::encode(sha2::Sha256::digest(bytes))),
            }
        };
        let request = match self {
            Wire::Http(out) => json!({
                "channel": "http", "method": out.method, "url": out.url.as_str(), "headers": out.headers,
                "body": out.body.as_deref().map(body), "idempotency": out.idempotency,
            }),
            Wire::Ssh(out) => json!({
                "channel": "ssh", "host": out.host.name, "host_key": out.host.host_key_fingerprint,
                "account": out.host.account, "command": out.command,
            }),
            Wire::Mcp(out) => {
                json!({ "channel": "mcp", "server": out.server, "tool": out.tool, "arguments": out.arguments })
            }
        };
        // Canonical bytes cannot fail for these values but a huge integer argument; its text then.
        let bytes = postern_core::canonical_bytes(&postern_core::canonical::with_unsafe_integers_as_strings(&request))
            .unwrap_or_else(|_| request.to_string().into_bytes());
        key.request_digest(&bytes)
    }
}

/// A forwarded `tools/call`: the arguments with the idempotency argument filled, and the
/// execution ID for `_meta`.
struct McpOutgoing {
    server: String,
    tool: String,
    operation: postern_core::McpOperation,
    arguments: serde_json::Map<String, Value>,
    execution: String,
    timeout: Duration,
}

struct SshOutgoing {
    host: postern_vault::SshHost,
    key: Sensitive<String>,
    passphrase: Option<Sensitive<String>>,
    /// `Store::vault_epoch` read before the key: a connection made with a key read before a
    /// change is pooled under the epoch before it, so the change retires it.
    epoch: u64,
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
        let questions = questions::Questions::for_approver(approver.questions_at_once());
        Ok(Engine {
            store,
            vault,
            key,
            manifest,
            approver,
            approval_timeout: DEFAULT_APPROVAL_TIMEOUT,
            session_gates: tokio::sync::Mutex::new(std::collections::HashMap::new()),
            open_requests: OpenRequests::default(),
            questions,
            in_flight: in_flight::CallsInFlight::default(),
            last_activity: std::sync::atomic::AtomicI64::new(clock().as_millis()),
            http: http::client(),
            clock,
            max_result_bytes: http::DEFAULT_MAX_RESULT_BYTES,
            ssh: crate::channel::ssh_pool::SshPool::default(),
            upstreams: None,
        })
    }

    /// Offers the tools of these upstream MCP servers beside Postern's own.
    pub fn with_upstreams(mut self, upstreams: Arc<crate::channel::upstream::Upstreams>) -> Self {
        self.upstreams = Some(upstreams);
        self
    }

    pub fn upstreams(&self) -> Option<&Arc<crate::channel::upstream::Upstreams>> {
        self.upstreams.as_ref()
    }

    pub fn vault(&self) -> &Arc<Vault> {
        &self.vault
    }

    /// Who answers this engine's questions (see [`Approver::kind`]).
    pub fn approver(&self) -> &Arc<dyn Approver> {
        &self.approver
    }

    /// How long a reviewer has to answer.
    pub fn approval_timeout(&self) -> Duration {
        self.approval_timeout
    }

    /// How long a reviewer has to answer (default 120 s); then the call is denied with
    /// `approval_timed_out`.
    pub fn with_approval_timeout(mut self, timeout: Duration) -> Self {
        self.approval_timeout = timeout;
        self
    }

    /// Holds every channel's result to `bytes` (default 1 MiB, `--max-result-bytes`): a larger
    /// answer is not kept, and the result says `result_too_large` with the limit.
    pub fn with_max_result_bytes(mut self, bytes: usize) -> Self {
        self.max_result_bytes = bytes;
        self
    }

    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    fn now(&self) -> Timestamp {
        (self.clock)()
    }

    async fn transition(&self, id: ExecutionId, to: ExecutionState, detail: StepDetail) -> Result<(), EngineError> {
        self.store.transition_steps_async(id, vec![(to, detail.into())], self.now()).await?;
        Ok(())
    }

    /// Handles one call end to end. Errors are reserved for calls that never became an
    /// execution (unknown tool, invalid arguments, unsafe target, …); every execution's fate —
    /// denied, failed before dispatch, outcome unknown, completed — is a [`CallOutcome`].
    ///
    /// A call's future is as large as its largest path through the engine, and every move of it
    /// copies all of it: a spawned task is moved three or four times on its way into the runtime.
    /// So the rare large paths (an upstream lookup, a first SSH contact, a retry's handling, the
    /// SSH and upstream sends) are boxed where they are awaited, which took the future from
    /// ~17 KB to ~7.6 KB, and the future itself is boxed here, so a caller moves a pointer.
    pub fn call(&self, call: Call) -> impl Future<Output = Result<CallOutcome, EngineError>> + Send + '_ {
        Box::pin(self.handle(call))
    }

    async fn handle(&self, mut call: Call) -> Result<CallOutcome, EngineError> {
        self.touch();
        // Another process changed what grants authority behind the journal's back: nothing is
        // granted any more (before the lock, credentials or grants are even read).
        if let Some(found) = self.store.authority_alarm() {
            return Err(StoreError::AuthorityTampered(found).into());
        }
        // Held until this call ends, however it ends; refused before it becomes an execution.
        let _place = match self.in_flight.enter(call.actor.as_str()) {
            Ok(place) => place,
            Err(limit) => {
                tracing::debug!(actor = %call.actor.as_str(), limit, "refused a call: too many under way");
                return Err(EngineError::TooManyInFlight { limit });
            }
        };
        // A lookup is only ever for the name the call carries.
        if call.resolved.as_ref().is_some_and(|t| t.name != call.tool) {
            call.resolved = None;
        }
        if call.resolved.is_none()
            && let Some(u) = &self.upstreams
            && self.manifest.tool(&call.tool).is_none()
        {
            // Its server is started if it was not; every later step of the call uses this lookup.
            call.resolved = Box::pin(u.resolve(&call.tool)).await;
        }
        let (mut p, arguments) = self.prepare(&call, call.resolved.clone())?;
        // Only a read may keep its answer's opening held; anything else has it opened before it
        // is made durable or sent.
        if p.tool.contract.class != postern_core::ReplayClass::ReadOnly {
            call.opening.release();
        }
        if let Some(host) = p.unpinned_host().map(|plan| plan.host.name.clone()) {
            // The first contact with an `accept-new` host logs in (to pin the key the record
            // names) before the call becomes an execution: the rungs that need no person are
            // decided first, and a host that needs a reviewer for every use is not logged into
            // before one has approved anything.
            let refused = match self.ladder_denies(&p, &call)? {
                Some(reason) => Some(reason),
                None => p.approve_every_use().then_some("approve_every_use_needs_a_pinned_key"),
            };
            if let Some(reason) = refused {
                return Err(EngineError::FirstContactRefused { host, reason });
            }
            if let Some(plan) = p.unpinned_host() {
                Box::pin(self.pin_first_key(plan)).await?;
            }
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
            let cancelled = call.cancel.withdrawn();
            let steps = if verdict.allowed && cancelled {
                vec![
                    (ExecutionState::Authorized, auth.clone()),
                    (ExecutionState::FailedBeforeDispatch, cancelled_detail()),
                ]
            } else if verdict.allowed {
                vec![
                    (ExecutionState::Authorized, auth.clone()),
                    (ExecutionState::Dispatched, dispatched_detail(&p, &out, &self.key)),
                ]
            } else {
                vec![(ExecutionState::Denied, auth.clone())]
            };
            // Durable: these steps are fsynced with the acceptance.
            let admission = self.store.admit_and_start_async(new, stored(steps)).await?;
            if let Admission::Accepted { id } = &admission {
                call.bound.bind(*id);
            }
            return match admission {
                Admission::Accepted { .. } if verdict.allowed && cancelled => Ok(self
                    .outcome(id, ExecutionState::FailedBeforeDispatch, Decision::NewExecution)
                    .because(cancelled_detail())),
                Admission::Accepted { .. } if verdict.allowed => {
                    self.send_and_observe(&p, id, out, Decision::NewExecution, false, Attempt::First).await
                }
                Admission::Accepted { .. } => {
                    Ok(self.outcome(id, ExecutionState::Denied, Decision::NewExecution).because(auth))
                }
                Admission::Matched { prior, decision } => Box::pin(self.on_match(&p, &call, prior, decision)).await,
            };
        }
        let admission = if call.bound.durable() {
            self.store.admit_durably_async(new).await?
        } else {
            self.store.admit_async(new).await?
        };
        if let Admission::Accepted { id } = &admission {
            call.bound.bind(*id);
        }
        match admission {
            Admission::Accepted { id } => match self.open_requests.turn(id, &call.cancel) {
                Turn::Lead(lead) => {
                    let result =
                        self.authorize_and_run(&p, &call, id, Decision::NewExecution, false, Some(&lead)).await;
                    lead.finish(&result);
                    result
                }
                // A fresh ID cannot have an open request; answer from the journal regardless.
                Turn::Join(rx) => Self::join(rx).await,
            },
            Admission::Matched { prior, decision } => Box::pin(self.on_match(&p, &call, prior, decision)).await,
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

    /// Drops what must not outlive a lock or a credential change, at once rather than at the
    /// next use: the secrets the vault keeps in memory and the kept SSH connections (and any
    /// kept connection that is closed or idle too long).
    pub fn sweep(&self) {
        self.vault.drop_stale();
        self.ssh.prune(self.store.vault_epoch());
    }

    /// [`Engine::sweep`] every `period`, until the task is dropped. While the vault is locked it
    /// also stops the upstream servers that hold a secret Postern gave them (their processes and
    /// sessions must not outlive the lock with it); once it is unlocked, the servers that start
    /// with the gateway are started again.
    pub async fn upkeep(&self, period: Duration) {
        let mut tick = tokio::time::interval(period);
        let mut was_locked = false;
        loop {
            tick.tick().await;
            self.sweep();
            let locked = self.vault.is_locked().unwrap_or(true);
            if let Some(u) = &self.upstreams {
                if locked {
                    u.stop_holding_secrets().await;
                } else if was_locked {
                    let u = Arc::clone(u);
                    tokio::spawn(async move { u.start_with_gateway().await });
                }
            }
            was_locked = locked;
        }
    }

    /// SSH connections kept for reuse now.
    pub fn kept_ssh_connections(&self) -> usize {
        self.ssh.idle_count()
    }

    /// When a call last arrived or a question was last answered.
    pub fn last_activity(&self) -> Timestamp {
        Timestamp::from_millis(self.last_activity.load(std::sync::atomic::Ordering::Relaxed))
    }

    fn current_state(&self, id: ExecutionId) -> Result<ExecutionState, EngineError> {
        let current = self.store.view().execution(id)?.ok_or(StoreError::UnknownExecution(id))?;
        Ok(current.state)
    }

    /// How a call ended: execution `id` in `state`, decided by `decision`; a new execution that
    /// carries no answer until [`CallOutcome::answered`] says otherwise.
    fn outcome(&self, id: ExecutionId, state: ExecutionState, decision: Decision) -> CallOutcome {
        CallOutcome { execution_id: id, state, attached: false, read_only: false, decision, answer: None, detail: None }
    }

    /// Journals an event about execution `id` that does not change its state.
    async fn note(&self, id: ExecutionId, event: ActivityNote, detail: Value) -> Result<(), EngineError> {
        let at = self.now();
        self.on_store(move |store| store.note(id, event, detail, at)).await?;
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

    /// Keeps a Streamable HTTP session's `initialize` parameters so it survives a restart.
    pub async fn remember_mcp_session(&self, id: String, initialize: String) -> Result<(), EngineError> {
        let at = self.now();
        self.on_store(move |store| store.remember_mcp_session(&id, &initialize, at)).await
    }

    /// Binds a remembered Streamable HTTP session to the agent token that opened it.
    pub async fn bind_mcp_session(&self, id: String, agent: String) -> Result<(), EngineError> {
        self.on_store(move |store| store.bind_mcp_session(&id, &agent)).await
    }

    /// Forgets a Streamable HTTP session its client ended.
    pub async fn forget_mcp_session(&self, id: String) -> Result<(), EngineError> {
        self.on_store(move |store| store.forget_mcp_session(&id)).await
    }

    /// Journals that a client resumed its broken stream and is being handed execution `id`'s
    /// answer (evidence for an investigator; delivery is settled as for any answer).
    pub async fn stream_resumed(&self, id: ExecutionId, detail: Value) -> Result<(), EngineError> {
        self.note(id, ActivityNote::StreamResumed, detail).await
    }

    /// Journals a cancellation that arrived once the execution was past the point of no return
    /// (dispatched or later): evidence only, the state stays what was observed.
    /// `still_wanted`: the call was withdrawn in time, but other calls following the same
    /// execution (retries that joined it) still wanted it, so it went ahead.
    pub async fn cancel_requested(
        &self,
        id: ExecutionId,
        reason: Option<String>,
        still_wanted: bool,
    ) -> Result<(), EngineError> {
        let at = self.now();
        let effect = if still_wanted {
            "none: other calls following this execution still wanted it, so it went ahead"
        } else {
            "none: the request had already been sent"
        };
        let detail = json!({ "reason": reason, "effect": effect });
        self.on_store(move |store| store.note(id, ActivityNote::CancelRequested, detail, at)).await?;
        Ok(())
    }

    /// The journal the engine writes to (read side), for status lookups.
    pub fn view(&self) -> &postern_store::JournalView {
        self.store.view()
    }

    /// Waits until every write submitted so far is committed, if execution `id` is recent
    /// enough for its rows to be on their way (a read-only call's rows are written after its
    /// answer): `true` then, and a lookup that missed it may look again. An old, future or
    /// made-up id costs the writer nothing (`false`).
    pub async fn caught_up_with(&self, id: ExecutionId) -> bool {
        /// Far longer than a read's rows trail its answer (the writer's linger, one commit).
        const RECENT_MS: u64 = 10_000;
        let (now, made) = (self.now(), id.timestamp());
        if made > now || now.millis_since(made) > RECENT_MS {
            return false;
        }
        self.store.flush_async().await.is_ok()
    }

    /// Records whether the outcome reached the agent (where the transport can tell).
    pub async fn delivered(&self, id: ExecutionId, reached_agent: bool) -> Result<(), EngineError> {
        let current = self.store.view().execution(id)?.ok_or(StoreError::UnknownExecution(id))?;
        let to =
            if reached_agent { ExecutionState::ResultDelivered } else { ExecutionState::CompletedResultNotDelivered };
        let state = current.state;
        if state.transition(to).is_ok() {
            self.transition(id, to, StepDetail::default()).await?;
        }
        Ok(())
    }
}

fn dispatched_detail(p: &Prepared<'_>, out: &Wire, key: &FingerprintKey) -> StepDetail {
    let sent =
        StepDetail { target: Some(p.shown_url.clone()), method: Some(p.method().to_owned()), ..StepDetail::default() };
    let sent = match out {
        Wire::Http(out) => sent.with("idempotency_key", out.idempotency.as_ref().map(|(_, k)| k)),
        Wire::Ssh(out) => sent
            .with("host", &out.host.name)
            .with("host_key", &out.host.host_key_fingerprint)
            .with("marker", out.marker),
        Wire::Mcp(out) => sent
            .with("server", &out.server)
            .with("tool", &out.tool)
            .with("idempotency_key", p.tool.contract.idempotency_argument.as_ref().map(|_| &out.execution)),
    };
    StepDetail { request_digest: Some(out.digest(key)), ..sent }
}

/// Steps as the journal takes them.
fn stored(steps: Vec<(ExecutionState, StepDetail)>) -> Vec<(ExecutionState, Value)> {
    steps.into_iter().map(|(state, detail)| (state, detail.into())).collect()
}

//! Postern's durable record: the only crate that touches SQLite.
//!
//! * [`Store`] is the read-write handle the gateway holds: it admits executions (retry lookup
//!   and acceptance in one atomic step), appends lifecycle events, stores results, and on open
//!   turns every execution left `dispatched` into `outcome_unknown`.
//! * [`JournalView`] is a read-only handle for the CLI and the app.
//! * [`audit::verify`] checks a database file offline.

pub mod audit;
pub mod authority;
pub mod crash;
mod epoch;
mod error;
pub mod event;
mod incident;
pub mod journal;
pub mod merkle;
mod refusal;
mod schema;
mod view;
mod writer;

pub use audit::{Checkpoint, Checkpointed, Claim, Finding, VerifyReport};
pub use error::{StoreError, Unusable};
pub use event::{ActivityNote, Event, SessionEvent, VaultEvent};
pub use merkle::{Consistency, Inclusion, TreeReader};
pub use refusal::{REFUSAL_TEXT_CHARS, REFUSALS_PER_MINUTE, REFUSALS_PER_MINUTE_IN_ALL};

/// The SQLite library Postern's journal runs on (bundled, so the same everywhere).
pub fn sqlite_version() -> &'static str {
    rusqlite::version()
}
pub use incident::{CallRecord, IdempotencyKey, Incident, Related, ResultRef, Times};
pub use journal::{HashHex, JournalEntry, JournalHead, JournalRow, Stream};
pub use schema::{APPLICATION_ID, supported_version};
pub use view::{
    ActivityFilter, AgentRecord, ExecutionQuery, ExecutionSummary, ExportCursor, JournalView, SessionSummary,
    StoredResult,
};
pub use writer::{MCP_SESSION_LIFETIME_MS, WriterStats};

use postern_core::{
    Actor, Channel, ExecutionId, ExecutionState, Fingerprint, IntentScope, PriorExecution, ReplayContract,
    RetryDecision, SessionId, Timestamp,
};
use serde_json::Value;
use std::path::{Path, PathBuf};
use writer::WriteKind;

/// The journal events that replace a credential's spec in place
/// ([`Store::update_credential_spec`]). The authority view re-derives a spec only from these.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpecChange {
    /// An SSH host's first key pinned.
    SshHostKeyPinned,
    /// An owner's contract for an MCP server's tool.
    McpToolContractSet,
    /// When an MCP server starts.
    McpServerStartSet,
}

impl SpecChange {
    /// The stored spelling (its [`VaultEvent`]'s).
    pub fn as_str(self) -> &'static str {
        VaultEvent::from(self).as_str()
    }
}

/// The journal events of an import of agent configs ([`Store::import_recorded`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ImportEvent {
    ImportApplied,
    ImportUndone,
}

impl ImportEvent {
    /// The stored spelling (its [`VaultEvent`]'s).
    pub fn as_str(self) -> &'static str {
        VaultEvent::from(self).as_str()
    }
}

/// The journal events of a remote server's OAuth sign-in ([`Store::oauth_recorded`]): they
/// grant nothing (the tokens are keychain items); they say when a server signed in, refreshed,
/// needed a new sign-in or signed out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OAuthEvent {
    #[serde(rename = "oauth_signed_in")]
    OAuthSignedIn,
    #[serde(rename = "oauth_refreshed")]
    OAuthRefreshed,
    #[serde(rename = "oauth_refresh_failed")]
    OAuthRefreshFailed,
    #[serde(rename = "oauth_signed_out")]
    OAuthSignedOut,
    #[serde(rename = "oauth_redirect_refused")]
    OAuthRedirectRefused,
}

impl OAuthEvent {
    /// The stored spelling (its [`VaultEvent`]'s).
    pub fn as_str(self) -> &'static str {
        VaultEvent::from(self).as_str()
    }
}

/// A request to run an action, as the engine hands it to the store after canonicalisation.
#[derive(Clone, Debug)]
pub struct NewExecution {
    pub id: ExecutionId,
    pub fingerprint: Fingerprint,
    /// The record's fingerprint without its intent scope (side-effecting executions only): links
    /// an earlier execution of the same effect in another run; never decides a retry.
    pub effect_fingerprint: Option<Fingerprint>,
    pub actor: Actor,
    pub intent_scope: IntentScope,
    pub session_id: Option<SessionId>,
    pub tool: String,
    pub channel: Channel,
    pub contract: ReplayContract,
    /// The canonical action record (secret arguments already digested).
    pub record: Value,
    /// Protocol correlation (JSON-RPC id, MCP session): evidence only, never a decision input.
    pub correlation: Value,
    pub at: Timestamp,
}

/// What admission decided. (Returned once per call and matched on at once, so the size
/// difference between the variants does not matter.)
#[derive(Clone, Debug, PartialEq)]
#[allow(clippy::large_enum_variant)]
pub enum Admission {
    /// A new execution was accepted and journaled.
    Accepted { id: ExecutionId },
    /// The call matched a prior execution; the decision says what to do with it. A
    /// `retry_received` row was journaled on the prior.
    Matched { prior: PriorExecution, decision: RetryDecision },
}

/// An observed outcome and the result bytes returned to the agent (and to later retries).
#[derive(Clone, Debug)]
pub struct Completion {
    /// Machine-readable summary, e.g. `{"http_status": 201}` or `{"exit_status": 0}`.
    pub outcome: Value,
    pub result: Vec<u8>,
    pub at: Timestamp,
}

/// One step of a read-only call, with when it was taken (for [`Store::record_read_only_detached`]).
#[derive(Clone, Debug)]
pub struct Step {
    pub state: ExecutionState,
    pub detail: Value,
    pub at: Timestamp,
}

/// A new agent run.
#[derive(Clone, Debug)]
pub struct SessionStart {
    pub id: SessionId,
    pub actor: Actor,
    pub pid: Option<u32>,
    pub process_start: Option<i64>,
    pub transport: String,
    /// What the client claims in `initialize` (a label only).
    pub client: Option<String>,
    pub at: Timestamp,
}

/// A credential's non-secret metadata as stored. The vault crate gives `kind`, `spec` and
/// `bindings` their meaning; the store keeps them and journals every change.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct CredentialRecord {
    pub name: String,
    pub kind: String,
    pub spec: Value,
    pub bindings: Value,
    pub approve_every_use: bool,
    pub created_at: i64,
}

/// Executions whose state was changed when the store was opened.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Recovery {
    /// Left `dispatched` by a previous process: now `outcome_unknown`.
    pub outcome_unknown: Vec<ExecutionId>,
    /// Left `completed` (delivery never confirmed) by a previous process: now
    /// `completed_result_not_delivered`.
    pub undelivered: Vec<ExecutionId>,
}

/// Tuning for the writer.
#[derive(Clone, Copy, Debug)]
pub struct StoreOptions {
    /// Most operations committed in one transaction (1 disables group commit).
    pub max_batch: usize,
    /// How long a batch of unsynced writes nobody waits for (a read-only call's rows) waits for
    /// more before it commits; zero commits it at once.
    pub linger: std::time::Duration,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions { max_batch: 256, linger: writer::LINGER }
    }
}

/// The read-write store. Cheap to share behind an `Arc`; every method may be called from any
/// thread, and concurrent writes are grouped into shared transactions.
#[derive(Debug)]
pub struct Store {
    writer: writer::WriterHandle,
    /// Bumped by every write that changes what the vault may hand out (the lock, a credential
    /// or SSH host added, removed or changed): the vault drops what it keeps in memory when it
    /// sees a new value.
    view: JournalView,
    path: PathBuf,
    /// This minute's `request_refused` rows, per peer and in all.
    refusals: std::sync::Mutex<refusal::RefusalBudget>,
    /// Held for the life of the store: one writing process per journal. (Declared last, so it is
    /// released only after the writer has finished.)
    _lock: JournalLock,
}

impl Store {
    /// Opens (creating and migrating if needed) the database at `path`, then recovers
    /// executions left `dispatched` by a previous process. `now` stamps the recovery rows.
    pub fn open(path: &Path, now: Timestamp) -> Result<(Store, Recovery), StoreError> {
        Self::open_with(path, now, StoreOptions::default())
    }

    pub fn open_with(path: &Path, now: Timestamp, options: StoreOptions) -> Result<(Store, Recovery), StoreError> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            create_private_dir(dir)?;
        }
        // An existing but emptied file is refused rather than silently becoming a new journal:
        // truncation is exactly the kind of loss an audit trail must surface.
        if std::fs::metadata(path).is_ok_and(|m| m.len() == 0) {
            return Err(StoreError::Unusable { path: path.to_owned(), problem: Unusable::Empty });
        }
        let is_new = !path.exists();
        #[cfg(unix)]
        if is_new {
            // Owner-only from the first byte (SQLite gives the -wal and -shm files the main
            // file's mode): the journal holds who did what, even without a secret in it.
            use std::os::unix::fs::OpenOptionsExt;
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(path)
                .map_err(|source| StoreError::Io { path: path.to_owned(), source })?;
        }
        let mut conn = rusqlite::Connection::open(path)?;
        schema::check_identity(&conn, path, true)?;
        // Only now that the file is known to be (or become) a Postern journal.
        let lock = lock_journal(path)?;
        if is_new {
            // 4 KiB pages: every durable commit writes each page it touches whole to the WAL (and
            // again at the checkpoint), a few per commit, while `audit verify` walks the journal
            // sequentially. Measured on the 2-core CI machine, a side-effecting call through the
            // engine (two durable commits): 8 KiB pages 146 KiB written per call at c=1 and
            // ~1,200 calls/s, 32 KiB and ~8,000/s at c=64; 4 KiB 78 KiB and ~1,400/s, 21 KiB and
            // ~9,000/s. `audit verify --chain-only` on 300k rows: 2.17M rows/s with 8 KiB,
            // 2.08M with 4 KiB (4% slower, offline). Settable only before the first table
            // exists: a journal created with other pages keeps them.
            conn.pragma_update(None, "page_size", 4_096)?;
        }
        configure_writer(&conn)?;
        schema::migrate(&mut conn, path, now.as_millis())?;
        // The lock, credentials, tokens, grants and allowlist must be what the journal says:
        // otherwise nothing starts (`audit rederive` rebuilds them from a verified journal).
        let tampered = authority::check(&conn)?;
        if !tampered.is_empty() {
            return Err(StoreError::AuthorityTampered(tampered));
        }
        let writer = writer::WriterHandle::spawn(conn, options)?;
        let view = JournalView::open_read_only(path)?.remembering(writer.epoch());
        let store = Store { writer, view, path: path.to_owned(), refusals: Default::default(), _lock: lock };
        let recovery = store.writer.call(WriteKind::DURABLE, move |w| w.recover(now))?;
        Ok((store, recovery))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Moves whenever the lock or a credential changed: SQLite reports each row the writer changes
    /// in their tables, and the count moves before the writing caller is answered. A commit by
    /// another process moves it too. What the vault keeps in memory is kept for one value.
    pub fn vault_epoch(&self) -> u64 {
        self.writer.vault_epoch()
    }

    /// Set once the writer has seen another process commit to the database and the authority
    /// tables no longer match the journal: from then on this process grants nothing (the
    /// differences, named by table and row). Never cleared while the process runs.
    pub fn authority_alarm(&self) -> Option<Vec<authority::AuthorityMismatch>> {
        self.writer.alarm()
    }

    /// Rebuilds the authority tables of the journal at `path` from its journal, after checking
    /// the chain (a broken chain is refused: what it says cannot be trusted either), and journals
    /// what was changed (`authority_rederived`). Nothing else may hold the journal.
    pub fn rederive_authority(path: &Path, now: Timestamp) -> Result<Vec<authority::AuthorityMismatch>, StoreError> {
        let lock = lock_journal(path)?;
        let report = audit::verify_with(path, None, audit::VerifyScope::ChainOnly, &mut |_, _| {})?;
        if let Some(finding) = report.findings.first() {
            return Err(StoreError::Corrupt(format!(
                "the journal itself does not verify ({finding}); its authority state cannot be trusted"
            )));
        }
        let mut conn = rusqlite::Connection::open(path)?;
        schema::check_identity(&conn, path, false)?;
        configure_writer(&conn)?;
        let changed = authority::rederive(&mut conn)?;
        drop((conn, lock));
        if !changed.is_empty() {
            let (store, _) = Store::open(path, now)?;
            let detail = serde_json::json!({
                "changed": changed.iter().map(ToString::to_string).collect::<Vec<_>>(),
            });
            store.writer.call(WriteKind::DURABLE, move |w| w.vault_row(VaultEvent::AuthorityRederived, detail, now))?;
            store.flush()?;
        }
        Ok(changed)
    }

    /// Read access to the same database.
    pub fn view(&self) -> &JournalView {
        &self.view
    }

    /// Looks up the most recent execution with the same fingerprint, actor and scope, applies
    /// the core retry decision, and either accepts a new execution or journals the retry on the
    /// prior — atomically, so two identical concurrent calls can never both be accepted.
    pub fn admit(&self, new: NewExecution) -> Result<Admission, StoreError> {
        self.writer.call(WriteKind::ORDERED, move |w| w.admit(&new))
    }

    /// Moves an execution to `to` (checked against the lifecycle) and journals it.
    pub fn transition(
        &self,
        id: ExecutionId,
        to: ExecutionState,
        detail: Value,
        at: Timestamp,
    ) -> Result<JournalEntry, StoreError> {
        let kind = if to == ExecutionState::Dispatched { WriteKind::step("dispatched") } else { WriteKind::DURABLE };
        self.writer.call(kind, move |w| w.transition(id, to, detail, at))
    }

    /// Returns once every write queued before this call (including detached ones) is committed.
    pub fn flush(&self) -> Result<(), StoreError> {
        self.writer.flush()
    }

    /// [`Store::flush`] for async callers: every write submitted before it (a read-only call's
    /// rows, which are written after its answer and may wait a moment for company) is committed.
    pub async fn flush_async(&self) -> Result<(), StoreError> {
        self.writer.flush_async().await
    }

    /// [`Store::admit`] for async callers: the task awaits the writer without blocking a thread.
    pub async fn admit_async(&self, new: NewExecution) -> Result<Admission, StoreError> {
        self.writer.call_async(WriteKind::ORDERED, move |w| w.admit(&new)).await
    }

    /// [`Store::admit_async`], on disk before it returns: for an acceptance something outside
    /// hears of before anything is dispatched (an MCP task handle names it).
    pub async fn admit_durably_async(&self, new: NewExecution) -> Result<Admission, StoreError> {
        self.writer.call_async(WriteKind::DURABLE, move |w| w.admit(&new)).await
    }

    /// Admission as in [`Store::admit`]; if it accepts a new execution, `steps` (e.g. `authorized`
    /// and `dispatched`, decided before admission by a non-interactive approver) are applied in
    /// the same durable transaction. A matched retry ignores `steps`.
    pub async fn admit_and_start_async(
        &self,
        new: NewExecution,
        steps: Vec<(ExecutionState, Value)>,
    ) -> Result<Admission, StoreError> {
        self.writer.call_async(WriteKind::steps(&steps), move |w| w.admit_and_start(&new, &steps)).await
    }

    /// Turns a credential's (or SSH host's) "approve every use" on or off, journaled on the vault
    /// stream (`approve_every_use_changed`).
    pub fn set_approve_every_use(&self, name: &str, on: bool, at: Timestamp) -> Result<JournalEntry, StoreError> {
        let name = name.to_owned();
        self.writer.call(WriteKind::DURABLE, move |w| w.set_approve_every_use(&name, on, at))
    }

    /// Replaces a credential's spec (e.g. pins an SSH host key), journaled as `event` on the
    /// vault stream.
    pub fn update_credential_spec(
        &self,
        name: &str,
        spec: Value,
        event: SpecChange,
        detail: Value,
        at: Timestamp,
    ) -> Result<JournalEntry, StoreError> {
        let name = name.to_owned();
        self.writer.call(WriteKind::DURABLE, move |w| w.update_spec(&name, &spec, event, detail, at))
    }

    /// Journals a refused request for something not offered where an agent can reach it (an
    /// approval or unlock over the control socket, an MCP method, an HTTP path, a change that
    /// weakens safety): `request_refused` on the vault stream, with what was attempted and by
    /// whom (`detail.peer`). The one way to write such a row: each passes the per-minute budget
    /// of its peer ([`REFUSALS_PER_MINUTE`]) and of all peers ([`REFUSALS_PER_MINUTE_IN_ALL`]),
    /// and its texts are cut to [`REFUSAL_TEXT_CHARS`]. `Ok(None)`: over budget, counted
    /// instead; a minute's counts are journaled as one summary row (`interface:
    /// refusal_budget`, the peers with the most first) with the first refusal of a later minute.
    pub fn refusal(&self, detail: Value, at: Timestamp) -> Result<Option<JournalEntry>, StoreError> {
        let peer = refusal::peer_key(&detail);
        let admission = self.refusals.lock().unwrap_or_else(std::sync::PoisonError::into_inner).admit(peer, at);
        if let Some(summary) = admission.summary.map(refusal::bounded) {
            // Its own write: a summary that cannot be written does not cost the refusal its row.
            let written =
                self.writer.call(WriteKind::DURABLE, move |w| w.vault_row(VaultEvent::RequestRefused, summary, at));
            if let Err(e) = written {
                tracing::warn!(error = %e, "could not journal the summary of a minute's refused requests");
            }
        }
        if !admission.row {
            return Ok(None);
        }
        let detail = refusal::bounded(detail);
        self.writer.call(WriteKind::DURABLE, move |w| w.vault_row(VaultEvent::RequestRefused, detail, at)).map(Some)
    }

    /// Journals an import of agent configs (`import_applied`: the digest of the undo record, the
    /// files rewritten, the servers added) or its undo (`import_undone`), on the vault stream: an
    /// undo is carried out only from a record whose digest the journal holds.
    pub fn import_recorded(
        &self,
        event: ImportEvent,
        detail: Value,
        at: Timestamp,
    ) -> Result<JournalEntry, StoreError> {
        self.writer.call(WriteKind::DURABLE, move |w| w.vault_row(event.into(), detail, at))
    }

    /// Journals a step of a remote server's OAuth sign-in. `detail` names the server, the
    /// issuer, the scopes, the expiry and the client id; never a token.
    pub fn oauth_recorded(&self, event: OAuthEvent, detail: Value, at: Timestamp) -> Result<JournalEntry, StoreError> {
        self.writer.call(WriteKind::DURABLE, move |w| w.vault_row(event.into(), detail, at))
    }

    /// Journals that a change arrived over the control socket (`control_request_applied` on the
    /// vault stream: the operation and the peer process), beside the change's own row, so an
    /// incident responder can tell the owner's terminal from another process of the same user.
    pub fn control_applied(&self, detail: Value, at: Timestamp) -> Result<JournalEntry, StoreError> {
        self.writer.call(WriteKind::DURABLE, move |w| w.vault_row(VaultEvent::ControlRequestApplied, detail, at))
    }

    /// A new execution for a retry a reviewer chose to "dispatch anew": no retry matching (the
    /// reviewer has seen the prior), `anew` (prior, reason, reviewer) recorded on its `accepted`
    /// row, then `steps`, all in one durable transaction.
    pub async fn admit_anew_async(
        &self,
        new: NewExecution,
        anew: Value,
        steps: Vec<(ExecutionState, Value)>,
    ) -> Result<JournalEntry, StoreError> {
        self.writer.call_async(WriteKind::steps(&steps), move |w| w.admit_anew(&new, &anew, &steps)).await
    }

    /// Several transitions of one execution in one durable transaction (e.g. `authorized` and
    /// `dispatched`, written together just before the first byte leaves), for async callers.
    pub async fn transition_steps_async(
        &self,
        id: ExecutionId,
        steps: Vec<(ExecutionState, Value)>,
        at: Timestamp,
    ) -> Result<JournalEntry, StoreError> {
        self.writer.call_async(WriteKind::steps(&steps), move |w| w.steps(id, &steps, at)).await
    }

    /// [`Store::complete`] for async callers.
    pub async fn complete_async(&self, id: ExecutionId, completion: Completion) -> Result<JournalEntry, StoreError> {
        self.writer.call_async(WriteKind::step("completed"), move |w| w.complete(id, &completion)).await
    }

    /// Journals a whole read-only execution (accepted, its steps, its completion) in one
    /// transaction and two rows (its steps to the dispatch folded into `accepted`, then its
    /// outcome), without waiting for it at all: the record is queued behind earlier writes and
    /// committed, unsynced, with the next batch. A read-only call has no side effect, so losing its
    /// record in a crash loses evidence of a read, never causes a write. A failure is reported on
    /// stderr (nobody is waiting for it).
    pub fn record_read_only_detached(
        &self,
        new: NewExecution,
        steps: Vec<Step>,
        completion: Option<Completion>,
    ) -> Result<(), StoreError> {
        self.writer.detached(WriteKind::ORDERED, move |w| w.read_only(&new, &steps, completion.as_ref()))
    }

    /// Journals `completed` with its outcome and stores the result in the same transaction.
    pub fn complete(&self, id: ExecutionId, completion: Completion) -> Result<JournalEntry, StoreError> {
        self.writer.call(WriteKind::step("completed"), move |w| w.complete(id, &completion))
    }

    /// Journals an event about execution `id` that leaves its state as it is (e.g. a client's
    /// cancellation that arrived after dispatch).
    pub fn note(
        &self,
        id: ExecutionId,
        event: ActivityNote,
        detail: Value,
        at: Timestamp,
    ) -> Result<JournalEntry, StoreError> {
        self.writer.call(WriteKind::DURABLE, move |w| w.note(id, event, detail, at))
    }

    /// A reviewer authorized (`true`) or revoked (`false`) agent run `id`; journaled on the
    /// session stream. A revoked run cannot be authorized again.
    pub fn set_session_standing(
        &self,
        id: SessionId,
        authorized: bool,
        by: &str,
        detail: Value,
        at: Timestamp,
    ) -> Result<JournalEntry, StoreError> {
        let by = by.to_owned();
        self.writer.call(WriteKind::DURABLE, move |w| w.session_standing(id, authorized, &by, detail, at))
    }

    /// Adds an actor to (or removes it from) the reviewer's "always allow" list.
    pub fn set_allowlisted(
        &self,
        actor: &str,
        allowed: bool,
        by: &str,
        at: Timestamp,
    ) -> Result<JournalEntry, StoreError> {
        let (actor, by) = (actor.to_owned(), by.to_owned());
        self.writer.call(WriteKind::DURABLE, move |w| w.allowlist(&actor, allowed, &by, at))
    }

    pub fn start_session(&self, start: SessionStart) -> Result<JournalEntry, StoreError> {
        self.writer.call(WriteKind::DURABLE, move |w| w.start_session(&start))
    }

    pub fn end_session(&self, id: SessionId, reason: &str, at: Timestamp) -> Result<JournalEntry, StoreError> {
        let reason = reason.to_owned();
        self.writer.call(WriteKind::DURABLE, move |w| w.end_session(id, &reason, at))
    }

    /// This installation's id (created on first call with `candidate`), which namespaces its
    /// keychain items.
    pub fn installation_id(&self, candidate: &str, at: Timestamp) -> Result<String, StoreError> {
        let candidate = candidate.to_owned();
        self.writer.call(WriteKind::DURABLE, move |w| w.installation_id(&candidate, at))
    }

    /// Records a credential's metadata and journals it (the secret goes to the keychain).
    pub fn put_credential(&self, record: CredentialRecord, at: Timestamp) -> Result<JournalEntry, StoreError> {
        self.writer.call(WriteKind::DURABLE, move |w| w.put_credential(&record, at))
    }

    pub fn remove_credential(&self, name: &str, at: Timestamp) -> Result<JournalEntry, StoreError> {
        let name = name.to_owned();
        self.writer.call(WriteKind::DURABLE, move |w| w.remove_credential(&name, at))
    }

    /// Registers an agent by the SHA-256 (hex) of its token, and journals it.
    pub fn add_agent(&self, name: &str, token_sha256: &str, at: Timestamp) -> Result<JournalEntry, StoreError> {
        let (name, token_sha256) = (name.to_owned(), token_sha256.to_owned());
        self.writer.call(WriteKind::DURABLE, move |w| w.add_agent(&name, &token_sha256, at))
    }

    /// Revokes an active agent's token, and journals it.
    pub fn revoke_agent(&self, name: &str, at: Timestamp) -> Result<JournalEntry, StoreError> {
        let name = name.to_owned();
        self.writer.call(WriteKind::DURABLE, move |w| w.revoke_agent(&name, at))
    }

    /// Keeps Streamable HTTP session `id`'s `initialize` parameters (JSON), so the session
    /// survives a gateway restart. Not journaled: transport state, not evidence.
    pub fn remember_mcp_session(&self, id: &str, initialize: &str, at: Timestamp) -> Result<(), StoreError> {
        let (id, initialize) = (id.to_owned(), initialize.to_owned());
        self.writer.call(WriteKind::DURABLE, move |w| w.remember_mcp_session(&id, &initialize, at))
    }

    /// Binds a remembered MCP session to the agent token that opened it.
    pub fn bind_mcp_session(&self, id: &str, agent: &str) -> Result<(), StoreError> {
        let (id, agent) = (id.to_owned(), agent.to_owned());
        self.writer.call(WriteKind::ORDERED, move |w| w.bind_mcp_session(&id, &agent))
    }

    /// Forgets MCP session `id` (its client ended it).
    pub fn forget_mcp_session(&self, id: &str) -> Result<(), StoreError> {
        let id = id.to_owned();
        self.writer.call(WriteKind::DURABLE, move |w| w.forget_mcp_session(&id))
    }

    /// Locks or unlocks the vault and journals who/why in `detail`.
    pub fn set_locked(&self, locked: bool, detail: Value, at: Timestamp) -> Result<JournalEntry, StoreError> {
        self.writer.call(WriteKind::DURABLE, move |w| w.set_locked(locked, detail, at))
    }

    /// What the writer has committed so far (for benchmarks and status displays).
    pub fn writer_stats(&self) -> &WriterStats {
        &self.writer.stats
    }

    /// The journal's size, changed after every commit that appended rows: a live view waits on
    /// it instead of polling (a burst of commits is seen as one change).
    pub fn journal_size(&self) -> tokio::sync::watch::Receiver<u64> {
        self.writer.committed()
    }

    /// Exporter `name` has sent every row up to `seq` to `target` (its bookmark; not journaled,
    /// not fsynced on its own: a bookmark lost in a crash resends rows, never skips them).
    pub async fn export_progress(&self, name: &str, target: &str, seq: u64, at: Timestamp) -> Result<(), StoreError> {
        let (name, target) = (name.to_owned(), target.to_owned());
        self.writer.call_async(WriteKind::ORDERED, move |w| w.export_progress(&name, &target, seq, at)).await
    }

    /// Exporter `name` could not send to `target` (its bookmark starts at `from` if it had none).
    pub async fn export_failed(
        &self,
        name: &str,
        target: &str,
        from: u64,
        error: &str,
        at: Timestamp,
    ) -> Result<(), StoreError> {
        let (name, target, error) = (name.to_owned(), target.to_owned(), error.to_owned());
        self.writer.call_async(WriteKind::ORDERED, move |w| w.export_failed(&name, &target, from, &error, at)).await
    }

    /// Records the current journal head (the chain's and the Merkle tree's) as a checkpoint and
    /// returns it for signing and export.
    pub fn checkpoint(&self, at: Timestamp) -> Result<Checkpointed, StoreError> {
        self.writer.call(WriteKind::DURABLE, move |w| w.checkpoint(at))
    }
}

/// Takes the journal's exclusive lock (`<db>.lock`), or says who holds it. The operating system
/// releases the lock when the holder exits, however it exits, so a crash never leaves it stale.
fn lock_journal(path: &Path) -> Result<JournalLock, StoreError> {
    use std::io::{Read, Seek, Write};
    let mut lock_path = path.as_os_str().to_owned();
    lock_path.push(".lock");
    let lock_path = PathBuf::from(lock_path);
    let io = |source| StoreError::Io { path: lock_path.clone(), source };
    let mut options = std::fs::OpenOptions::new();
    options.read(true).write(true).create(true).truncate(false);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let mut file = options.open(&lock_path).map_err(io)?;
    // The database file itself is locked too (flock, independent of SQLite's own fcntl locks):
    // deleting `<db>.lock` cannot let a second writer in, since the journal's own inode stays
    // locked. The `.lock` file only says who holds it.
    let journal = std::fs::OpenOptions::new()
        .read(true)
        .open(path)
        .map_err(|source| StoreError::Io { path: path.to_owned(), source })?;
    let in_use = |file: &mut std::fs::File| {
        let mut holder = String::new();
        let _ = file.read_to_string(&mut holder);
        let holder = Some(holder.trim().to_owned()).filter(|h| !h.is_empty());
        StoreError::InUse { path: path.to_owned(), holder }
    };
    match journal.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => return Err(in_use(&mut file)),
        Err(std::fs::TryLockError::Error(e)) => return Err(StoreError::Io { path: path.to_owned(), source: e }),
    }
    match file.try_lock() {
        Ok(()) => {
            file.set_len(0).map_err(io)?;
            file.rewind().map_err(io)?;
            write!(file, "pid {}", std::process::id()).map_err(io)?;
            Ok(JournalLock { _journal: journal, _file: file })
        }
        Err(std::fs::TryLockError::WouldBlock) => Err(in_use(&mut file)),
        Err(std::fs::TryLockError::Error(e)) => Err(io(e)),
    }
}

/// Held while a process writes a journal: an exclusive lock on the database file and on
/// `<db>.lock` (which records the holder's pid).
#[derive(Debug)]
struct JournalLock {
    _journal: std::fs::File,
    _file: std::fs::File,
}

fn create_private_dir(dir: &Path) -> Result<(), StoreError> {
    let io = |source| StoreError::Io { path: dir.to_owned(), source };
    if dir.is_dir() {
        return Ok(());
    }
    std::fs::create_dir_all(dir).map_err(io)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(io)?;
    }
    Ok(())
}

/// The bundled SQLite is built with STAT4, which re-plans a statement whenever a bound value
/// compared to an indexed column changes — on every retry lookup. Postern's queries have one
/// right plan; the query-planner stability guarantee keeps it (measured: re-preparing was 6.6% of
/// the journal writer's time at 64 concurrent calls).
pub(crate) fn stable_plans(conn: &rusqlite::Connection) -> Result<(), rusqlite::Error> {
    conn.set_db_config(rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)?;
    Ok(())
}

fn configure_writer(conn: &rusqlite::Connection) -> Result<(), rusqlite::Error> {
    conn.busy_timeout(std::time::Duration::from_secs(5))?;
    stable_plans(conn)?;
    // WAL: readers never block the writer. FULL: a commit is on disk before it returns, so a
    // `dispatched` row exists before the first byte leaves for the target.
    let mode: String = conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(rusqlite::Error::InvalidQuery);
    }
    conn.pragma_update(None, "synchronous", "FULL")?;
    conn.pragma_update(None, "foreign_keys", true)?;
    // Each operation of a group commit runs in its own savepoint, whose statement journal (the
    // pages it changes, as they were) would otherwise be a temporary file: written through the
    // page cache on every operation and left to the filesystem (measured: ~5% of the writer's
    // time at 32 sessions). In memory it costs no I/O and leaves nothing on disk.
    conn.pragma_update(None, "temp_store", "MEMORY")?;
    Ok(())
}

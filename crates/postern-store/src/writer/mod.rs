//! The single journal writer: one thread owns the read-write connection and commits every
//! write, grouping whatever requests are waiting into one transaction (group commit).
//!
//! Serialising writes here is also what makes admission atomic: the retry lookup and the
//! acceptance of a new execution happen in the same transaction, on the same thread, so two
//! identical concurrent calls are decided one after the other.

mod executions;
mod sessions;
mod vault;

use crate::{
    Admission, Checkpoint, Completion, CredentialRecord, NewExecution, Recovery, SessionStart, StoreError,
    StoreOptions,
    journal::{HashHex, JournalEntry, JournalHead, JournalRow, ROW_VERSION, Stream, chain_hash},
};
use postern_core::{
    Actor, ExecutionId, ExecutionState, IncomingIntent, IntentScope, PriorExecution, ReplayContract, RetryDecision,
    SessionId, Timestamp, canonical::with_unsafe_integers_as_strings, decide_retry,
};
use rusqlite::{Connection, OptionalExtension, params};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use std::sync::{
    Arc,
    atomic::{AtomicU64, Ordering},
    mpsc,
};

/// How long an MCP session can be resumed after a restart (a week).
/// How often an idle writer looks for commits by another process.
const WATCH_INTERVAL: std::time::Duration = std::time::Duration::from_millis(100);

fn data_version(conn: &Connection) -> Result<i64, StoreError> {
    Ok(conn.query_row("PRAGMA data_version", [], |r| r.get(0))?)
}

pub const MCP_SESSION_LIFETIME_MS: i64 = 7 * 24 * 60 * 60 * 1000;

/// At most this many MCP sessions are kept (the newest).
pub const MCP_SESSIONS_KEPT: i64 = 10_000;

enum Op {
    Admit(Box<NewExecution>),
    AddAgent {
        name: String,
        token_sha256: String,
        at: Timestamp,
    },
    RevokeAgent {
        name: String,
        at: Timestamp,
    },
    RememberMcpSession {
        id: String,
        initialize: String,
        at: Timestamp,
    },
    ForgetMcpSession {
        id: String,
    },
    VaultEvent {
        event: &'static str,
        detail: Value,
        at: Timestamp,
    },
    Transition {
        id: ExecutionId,
        to: ExecutionState,
        detail: Value,
        at: Timestamp,
    },
    Complete {
        id: ExecutionId,
        completion: Completion,
    },
    SessionStanding {
        id: SessionId,
        authorized: bool,
        by: String,
        detail: Value,
        at: Timestamp,
    },
    Allowlist {
        actor: String,
        add: bool,
        by: String,
        at: Timestamp,
    },
    Note {
        id: ExecutionId,
        event: &'static str,
        detail: Value,
        at: Timestamp,
    },
    StartSession(Box<SessionStart>),
    EndSession {
        id: SessionId,
        reason: String,
        at: Timestamp,
    },
    Checkpoint {
        at: Timestamp,
    },
    Recover {
        now: Timestamp,
    },
    InstallationId {
        candidate: String,
        at: Timestamp,
    },
    PutCredential {
        record: Box<CredentialRecord>,
        at: Timestamp,
    },
    RemoveCredential {
        name: String,
        at: Timestamp,
    },
    SetLocked {
        locked: bool,
        detail: Value,
        at: Timestamp,
    },
    Steps {
        id: ExecutionId,
        steps: Vec<(ExecutionState, Value)>,
        at: Timestamp,
    },
    /// Writes nothing; answered once everything queued before it is committed.
    Barrier,
    /// Admission, and for a new execution the given first steps, in one durable transaction.
    AdmitAndStart {
        new: Box<NewExecution>,
        steps: Vec<(ExecutionState, Value)>,
    },
    /// A credential's "approve every use" flag changed.
    ApproveEveryUse {
        name: String,
        on: bool,
        at: Timestamp,
    },
    /// A credential's spec changed (e.g. an SSH host key pinned).
    UpdateSpec {
        name: String,
        spec: Value,
        event: &'static str,
        detail: Value,
        at: Timestamp,
    },
    /// A refused attempt to approve, unlock or authorize from outside the approver's channel.
    Refusal {
        detail: Value,
        at: Timestamp,
    },
    /// A reviewer chose "dispatch anew" for a retry: a new execution without retry matching,
    /// with its first steps, in one durable transaction.
    AdmitAnew {
        new: Box<NewExecution>,
        anew: Value,
        steps: Vec<(ExecutionState, Value)>,
    },
    ReadOnly {
        new: Box<NewExecution>,
        steps: Vec<(ExecutionState, Value)>,
        completion: Option<Completion>,
    },
}

impl Op {
    /// Must this operation be on disk before its caller hears back? Acceptance is ordered by the
    /// single writer but needs no fsync of its own: nothing has left the machine yet, and the
    /// fsync of the `dispatched` row (same WAL, written later) makes it durable too. Read-only
    /// executions are journaled without waiting for the disk: a retry of them is harmless.
    fn durable(&self) -> bool {
        !matches!(self, Op::Admit(_) | Op::ReadOnly { .. } | Op::Barrier)
    }
}

enum Reply {
    Admission(Box<Admission>),
    Entry(JournalEntry),
    Checkpoint(Checkpoint),
    Recovery(Recovery),
    Text(String),
}

/// Who is waiting for a job's outcome.
enum Responder {
    /// A thread blocked on the reply.
    Sync(mpsc::SyncSender<Result<Reply, StoreError>>),
    /// A task awaiting the reply (no thread is blocked while the writer works).
    Async(tokio::sync::oneshot::Sender<Result<Reply, StoreError>>),
    /// Nobody: a failure is reported on stderr.
    Detached,
}

struct Job {
    op: Op,
    reply: Responder,
}

/// Counters of what the writer committed: `operations / transactions` is the group-commit
/// factor (how many writes shared one fsync).
#[derive(Debug, Default)]
pub struct WriterStats {
    transactions: AtomicU64,
    operations: AtomicU64,
}

impl WriterStats {
    pub fn transactions(&self) -> u64 {
        self.transactions.load(Ordering::Relaxed)
    }

    pub fn operations(&self) -> u64 {
        self.operations.load(Ordering::Relaxed)
    }
}

#[derive(Debug)]
pub(crate) struct WriterHandle {
    pub(crate) stats: Arc<WriterStats>,
    tx: Option<mpsc::Sender<Job>>,
    thread: Option<std::thread::JoinHandle<()>>,
    alarm: Arc<std::sync::Mutex<Option<Vec<crate::authority::AuthorityMismatch>>>>,
}

impl Drop for WriterHandle {
    /// Closing the channel ends the writer loop once queued jobs are committed; joining it
    /// means the database connection is closed when the `Store` is gone.
    fn drop(&mut self) {
        self.tx.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

macro_rules! expect_reply {
    ($result:expr, $variant:ident) => {
        match $result? {
            Reply::$variant(v) => Ok(v),
            _ => Err(StoreError::Corrupt("writer answered with the wrong reply kind".into())),
        }
    };
}

impl WriterHandle {
    pub(crate) fn spawn(conn: Connection, options: StoreOptions) -> Result<Self, StoreError> {
        let head = load_head(&conn)?;
        let (tx, rx) = mpsc::channel::<Job>();
        let stats = Arc::new(WriterStats::default());
        let alarm = Arc::new(std::sync::Mutex::new(None));
        let data_version = data_version(&conn)?;
        let mut writer = Writer {
            alarm: Arc::clone(&alarm),
            data_version,
            conn,
            head,
            max_batch: options.max_batch.max(1),
            stats: Arc::clone(&stats),
            synchronous_full: true,
            states: Default::default(),
            cache_invalid: false,
        };
        let thread = std::thread::Builder::new()
            .name("postern-journal-writer".into())
            .spawn(move || writer.run(rx))
            .map_err(|e| StoreError::Corrupt(format!("cannot start the journal writer: {e}")))?;
        Ok(WriterHandle { stats, tx: Some(tx), thread: Some(thread), alarm })
    }

    fn submit(&self, op: Op, reply: Responder) -> Result<(), StoreError> {
        let tx = self.tx.as_ref().ok_or(StoreError::WriterStopped)?;
        tx.send(Job { op, reply }).map_err(|_| StoreError::WriterStopped)
    }

    fn call(&self, op: Op) -> Result<Reply, StoreError> {
        let (reply, rx) = mpsc::sync_channel(1);
        self.submit(op, Responder::Sync(reply))?;
        rx.recv().map_err(|_| StoreError::WriterStopped)?
    }

    pub(crate) fn flush(&self) -> Result<(), StoreError> {
        expect_reply!(self.call(Op::Barrier), Text).map(|_| ())
    }

    async fn call_async(&self, op: Op) -> Result<Reply, StoreError> {
        let (reply, rx) = tokio::sync::oneshot::channel();
        self.submit(op, Responder::Async(reply))?;
        rx.await.map_err(|_| StoreError::WriterStopped)?
    }

    pub(crate) async fn admit_async(&self, new: NewExecution) -> Result<Admission, StoreError> {
        expect_reply!(self.call_async(Op::Admit(Box::new(new))).await, Admission).map(|a| *a)
    }

    pub(crate) async fn steps_async(
        &self,
        id: ExecutionId,
        steps: Vec<(ExecutionState, Value)>,
        at: Timestamp,
    ) -> Result<JournalEntry, StoreError> {
        expect_reply!(self.call_async(Op::Steps { id, steps, at }).await, Entry)
    }

    pub(crate) async fn admit_and_start_async(
        &self,
        new: NewExecution,
        steps: Vec<(ExecutionState, Value)>,
    ) -> Result<Admission, StoreError> {
        expect_reply!(self.call_async(Op::AdmitAndStart { new: Box::new(new), steps }).await, Admission).map(|a| *a)
    }

    pub(crate) fn approve_every_use(&self, name: String, on: bool, at: Timestamp) -> Result<JournalEntry, StoreError> {
        expect_reply!(self.call(Op::ApproveEveryUse { name, on, at }), Entry)
    }

    pub(crate) fn update_spec(
        &self,
        name: String,
        spec: Value,
        event: &'static str,
        detail: Value,
        at: Timestamp,
    ) -> Result<JournalEntry, StoreError> {
        expect_reply!(self.call(Op::UpdateSpec { name, spec, event, detail, at }), Entry)
    }

    pub(crate) fn refusal(&self, detail: Value, at: Timestamp) -> Result<JournalEntry, StoreError> {
        expect_reply!(self.call(Op::Refusal { detail, at }), Entry)
    }

    pub(crate) async fn admit_anew_async(
        &self,
        new: NewExecution,
        anew: Value,
        steps: Vec<(ExecutionState, Value)>,
    ) -> Result<JournalEntry, StoreError> {
        expect_reply!(self.call_async(Op::AdmitAnew { new: Box::new(new), anew, steps }).await, Entry)
    }

    pub(crate) async fn complete_async(
        &self,
        id: ExecutionId,
        completion: Completion,
    ) -> Result<JournalEntry, StoreError> {
        expect_reply!(self.call_async(Op::Complete { id, completion }).await, Entry)
    }

    pub(crate) fn read_only_detached(
        &self,
        new: NewExecution,
        steps: Vec<(ExecutionState, Value)>,
        completion: Option<Completion>,
    ) -> Result<(), StoreError> {
        self.submit(Op::ReadOnly { new: Box::new(new), steps, completion }, Responder::Detached)
    }

    pub(crate) fn admit(&self, new: NewExecution) -> Result<Admission, StoreError> {
        expect_reply!(self.call(Op::Admit(Box::new(new))), Admission).map(|a| *a)
    }

    pub(crate) fn transition(
        &self,
        id: ExecutionId,
        to: ExecutionState,
        detail: Value,
        at: Timestamp,
    ) -> Result<JournalEntry, StoreError> {
        expect_reply!(self.call(Op::Transition { id, to, detail, at }), Entry)
    }

    pub(crate) fn complete(&self, id: ExecutionId, completion: Completion) -> Result<JournalEntry, StoreError> {
        expect_reply!(self.call(Op::Complete { id, completion }), Entry)
    }

    pub(crate) fn session_standing(
        &self,
        id: SessionId,
        authorized: bool,
        by: String,
        detail: Value,
        at: Timestamp,
    ) -> Result<JournalEntry, StoreError> {
        expect_reply!(self.call(Op::SessionStanding { id, authorized, by, detail, at }), Entry)
    }

    pub(crate) fn allowlist(
        &self,
        actor: String,
        add: bool,
        by: String,
        at: Timestamp,
    ) -> Result<JournalEntry, StoreError> {
        expect_reply!(self.call(Op::Allowlist { actor, add, by, at }), Entry)
    }

    pub(crate) fn note(
        &self,
        id: ExecutionId,
        event: &'static str,
        detail: Value,
        at: Timestamp,
    ) -> Result<JournalEntry, StoreError> {
        expect_reply!(self.call(Op::Note { id, event, detail, at }), Entry)
    }

    pub(crate) fn start_session(&self, start: SessionStart) -> Result<JournalEntry, StoreError> {
        expect_reply!(self.call(Op::StartSession(Box::new(start))), Entry)
    }

    pub(crate) fn end_session(&self, id: SessionId, reason: String, at: Timestamp) -> Result<JournalEntry, StoreError> {
        expect_reply!(self.call(Op::EndSession { id, reason, at }), Entry)
    }

    pub(crate) fn checkpoint(&self, at: Timestamp) -> Result<Checkpoint, StoreError> {
        expect_reply!(self.call(Op::Checkpoint { at }), Checkpoint)
    }

    pub(crate) fn recover(&self, now: Timestamp) -> Result<Recovery, StoreError> {
        expect_reply!(self.call(Op::Recover { now }), Recovery)
    }

    pub(crate) fn installation_id(&self, candidate: String, at: Timestamp) -> Result<String, StoreError> {
        expect_reply!(self.call(Op::InstallationId { candidate, at }), Text)
    }

    pub(crate) fn put_credential(&self, record: CredentialRecord, at: Timestamp) -> Result<JournalEntry, StoreError> {
        expect_reply!(self.call(Op::PutCredential { record: Box::new(record), at }), Entry)
    }

    pub(crate) fn remove_credential(&self, name: String, at: Timestamp) -> Result<JournalEntry, StoreError> {
        expect_reply!(self.call(Op::RemoveCredential { name, at }), Entry)
    }

    pub(crate) fn add_agent(
        &self,
        name: String,
        token_sha256: String,
        at: Timestamp,
    ) -> Result<JournalEntry, StoreError> {
        expect_reply!(self.call(Op::AddAgent { name, token_sha256, at }), Entry)
    }

    pub(crate) fn revoke_agent(&self, name: String, at: Timestamp) -> Result<JournalEntry, StoreError> {
        expect_reply!(self.call(Op::RevokeAgent { name, at }), Entry)
    }

    pub(crate) fn set_locked(&self, locked: bool, detail: Value, at: Timestamp) -> Result<JournalEntry, StoreError> {
        expect_reply!(self.call(Op::SetLocked { locked, detail, at }), Entry)
    }

    pub(crate) fn remember_mcp_session(&self, id: String, initialize: String, at: Timestamp) -> Result<(), StoreError> {
        expect_reply!(self.call(Op::RememberMcpSession { id, initialize, at }), Text).map(drop)
    }

    pub(crate) fn vault_event(
        &self,
        event: &'static str,
        detail: Value,
        at: Timestamp,
    ) -> Result<JournalEntry, StoreError> {
        expect_reply!(self.call(Op::VaultEvent { event, detail, at }), Entry)
    }

    /// The authority alarm the writer raised, if any (see [`crate::Store::authority_alarm`]).
    pub(crate) fn alarm(&self) -> Option<Vec<crate::authority::AuthorityMismatch>> {
        self.alarm.lock().ok().and_then(|a| a.clone())
    }

    pub(crate) fn forget_mcp_session(&self, id: String) -> Result<(), StoreError> {
        expect_reply!(self.call(Op::ForgetMcpSession { id }), Text).map(drop)
    }
}

pub(crate) fn load_head(conn: &Connection) -> Result<JournalHead, StoreError> {
    let head: Option<(i64, Vec<u8>)> = conn
        .query_row("SELECT seq, row_hash FROM journal ORDER BY seq DESC LIMIT 1", [], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    match head {
        None => Ok(JournalHead::EMPTY),
        Some((seq, hash)) => Ok(JournalHead {
            size: u64::try_from(seq).map_err(|_| StoreError::Corrupt(format!("negative journal seq {seq}")))?,
            hash: HashHex(
                hash.try_into().map_err(|_| StoreError::Corrupt(format!("row {seq}: row_hash is not 32 bytes")))?,
            ),
        }),
    }
}

struct Writer {
    conn: Connection,
    /// Set when another process committed to the database and the authority tables then
    /// differed from the journal.
    alarm: Arc<std::sync::Mutex<Option<Vec<crate::authority::AuthorityMismatch>>>>,
    /// `PRAGMA data_version` as this connection last saw it: it changes only when another
    /// connection commits (this one's own commits leave it as it is).
    data_version: i64,
    head: JournalHead,
    max_batch: usize,
    stats: Arc<WriterStats>,
    /// The connection's current `PRAGMA synchronous` (FULL or NORMAL).
    synchronous_full: bool,
    /// Current state and session of executions, as this writer (the only writer) last wrote
    /// them; saves a read per transition. Cleared whenever a transaction or savepoint rolls back.
    states: std::collections::HashMap<ExecutionId, (ExecutionState, Option<SessionId>)>,
    cache_invalid: bool,
}

/// A row about to be appended (the writer assigns `seq`).
struct Draft {
    at: Timestamp,
    stream: Stream,
    event: String,
    execution_id: Option<ExecutionId>,
    session_id: Option<SessionId>,
    state: Option<ExecutionState>,
    result_sha256: Option<String>,
    detail: Value,
}

/// The lifecycle steps a batch makes durable, naming its crash points (`failpoints` builds).
fn crash_marks(batch: &[Job]) -> Vec<&'static str> {
    if !crate::crash::ENABLED {
        return Vec::new();
    }
    let mut marks = Vec::new();
    for job in batch {
        let mark = match &job.op {
            Op::Transition { to: ExecutionState::Dispatched, .. } => "dispatched",
            Op::Steps { steps, .. } | Op::AdmitAndStart { steps, .. } | Op::AdmitAnew { steps, .. }
                if steps.iter().any(|(s, _)| *s == ExecutionState::Dispatched) =>
            {
                "dispatched"
            }
            Op::Complete { .. } => "completed",
            _ => continue,
        };
        if !marks.contains(&mark) {
            marks.push(mark);
        }
    }
    marks
}

impl Writer {
    fn run(&mut self, rx: mpsc::Receiver<Job>) {
        loop {
            // Every batch, and every WATCH_INTERVAL while idle: did another process write?
            self.watch();
            let first = match rx.recv_timeout(WATCH_INTERVAL) {
                Ok(job) => job,
                Err(mpsc::RecvTimeoutError::Timeout) => continue,
                Err(mpsc::RecvTimeoutError::Disconnected) => return,
            };
            let mut batch = vec![first];
            while batch.len() < self.max_batch {
                match rx.try_recv() {
                    Ok(job) => batch.push(job),
                    Err(_) => break,
                }
            }
            let replies = self.commit_batch(&batch);
            for (job, reply) in batch.into_iter().zip(replies) {
                // The caller may have given up waiting; the write itself stands.
                match job.reply {
                    Responder::Sync(tx) => {
                        let _ = tx.send(reply);
                    }
                    Responder::Async(tx) => {
                        let _ = tx.send(reply);
                    }
                    Responder::Detached => {
                        if let Err(e) = reply {
                            tracing::error!(error = %e, "journaling a read-only execution failed");
                        }
                    }
                }
            }
        }
    }

    /// Another process committed to the database (nothing but this writer should): if the
    /// authority tables now differ from the journal, raise the alarm and journal it once.
    fn watch(&mut self) {
        let Ok(now) = data_version(&self.conn) else { return };
        if now == self.data_version {
            return;
        }
        self.data_version = now;
        self.cache_invalid = true;
        let Ok(found) = crate::authority::check(&self.conn) else { return };
        if found.is_empty() {
            return;
        }
        let first = match self.alarm.lock() {
            Ok(mut alarm) => {
                let first = alarm.is_none();
                *alarm = Some(found.clone());
                first
            }
            Err(_) => false,
        };
        if first {
            tracing::error!(
                differences = ?found.iter().map(ToString::to_string).collect::<Vec<_>>(),
                "the authority tables were changed behind the journal's back; nothing is granted until postern \
                 restarts on a journal that verifies"
            );
            let detail = json!({ "differences": found.iter().map(ToString::to_string).collect::<Vec<_>>() });
            let at = Timestamp::from_millis(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX)),
            );
            let job =
                Job { op: Op::VaultEvent { event: "authority_tampered", detail, at }, reply: Responder::Detached };
            let _ = self.commit_batch(std::slice::from_ref(&job));
        }
    }

    /// Applies every job in one transaction. A job that fails is rolled back to its own
    /// savepoint and reported; the others still commit. If the commit fails, all fail.
    fn commit_batch(&mut self, batch: &[Job]) -> Vec<Result<Reply, StoreError>> {
        let head_before = self.head;
        // A batch is fsynced if any of its operations must be durable (which also makes every
        // earlier unsynced commit durable: the WAL is written in order).
        let durable = batch.iter().any(|job| job.op.durable());
        if durable != self.synchronous_full {
            let mode = if durable { "FULL" } else { "NORMAL" };
            if let Err(e) = self.conn.pragma_update(None, "synchronous", mode) {
                return batch.iter().map(|_| Err(StoreError::Sqlite(clone_sqlite_error(&e)))).collect();
            }
            self.synchronous_full = durable;
        }
        if let Err(e) = self.conn.execute_batch("BEGIN IMMEDIATE") {
            return batch.iter().map(|_| Err(StoreError::Sqlite(clone_sqlite_error(&e)))).collect();
        }
        let mut replies = Vec::with_capacity(batch.len());
        for job in batch {
            let head_at_savepoint = self.head;
            let result = self.statement("SAVEPOINT op").and_then(|()| {
                let r = self.apply(&job.op);
                if r.is_err() && !self.conn.is_autocommit() {
                    self.statement("ROLLBACK TO op")?;
                    self.cache_invalid = true;
                }
                if !self.conn.is_autocommit() {
                    self.statement("RELEASE op")?;
                }
                r
            });
            if result.is_err() {
                self.head = head_at_savepoint;
            }
            if self.conn.is_autocommit() {
                // SQLite rolled the whole transaction back (it may on SQLITE_FULL, SQLITE_IOERR
                // or SQLITE_NOMEM, per its documentation): every job of the batch is undone, so
                // none may be reported as written, and the jobs after it must not run outside a
                // transaction (each savepoint would then commit on its own).
                self.cache_invalid = true;
                self.head = head_before;
                let cause = match &result {
                    Err(StoreError::Sqlite(e)) => clone_sqlite_error(e),
                    Err(e) => rusqlite::Error::SqliteFailure(
                        rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_ERROR),
                        Some(e.to_string()),
                    ),
                    Ok(_) => rusqlite::Error::SqliteFailure(
                        rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_ABORT),
                        Some("the transaction was rolled back".into()),
                    ),
                };
                return batch.iter().map(|_| Err(StoreError::Sqlite(clone_sqlite_error(&cause)))).collect();
            }
            replies.push(result);
        }
        let marks = crash_marks(batch);
        for mark in &marks {
            crate::crash::point(&format!("store::commit::before::{mark}"));
        }
        if let Err(e) = self.conn.execute_batch("COMMIT") {
            let _ = self.conn.execute_batch("ROLLBACK");
            self.cache_invalid = true;
            self.head = head_before;
            return batch.iter().map(|_| Err(StoreError::Sqlite(clone_sqlite_error(&e)))).collect();
        }
        for mark in &marks {
            crate::crash::point(&format!("store::commit::after::{mark}"));
        }
        self.stats.transactions.fetch_add(1, Ordering::Relaxed);
        self.stats.operations.fetch_add(batch.len() as u64, Ordering::Relaxed);
        replies
    }

    /// Runs a fixed statement through the statement cache (no SQL parsing per operation).
    fn statement(&self, sql: &str) -> Result<(), StoreError> {
        self.conn.prepare_cached(sql)?.execute([])?;
        Ok(())
    }

    fn apply(&mut self, op: &Op) -> Result<Reply, StoreError> {
        match op {
            Op::Admit(new) => self.admit(new).map(|a| Reply::Admission(Box::new(a))),
            Op::Transition { id, to, detail, at } => self.transition(*id, *to, detail.clone(), *at).map(Reply::Entry),
            Op::SessionStanding { id, authorized, by, detail, at } => {
                self.session_standing(*id, *authorized, by, detail.clone(), *at).map(Reply::Entry)
            }
            Op::Allowlist { actor, add, by, at } => self.allowlist(actor, *add, by, *at).map(Reply::Entry),
            Op::Note { id, event, detail, at } => self.note(*id, event, detail.clone(), *at).map(Reply::Entry),
            Op::Complete { id, completion } => self.complete(*id, completion).map(Reply::Entry),
            Op::StartSession(start) => self.start_session(start).map(Reply::Entry),
            Op::EndSession { id, reason, at } => self.end_session(*id, reason, *at).map(Reply::Entry),
            Op::Checkpoint { at } => self.checkpoint(*at).map(Reply::Checkpoint),
            Op::Recover { now } => self.recover(*now).map(Reply::Recovery),
            Op::InstallationId { candidate, at } => self.installation_id(candidate, *at).map(Reply::Text),
            Op::PutCredential { record, at } => self.put_credential(record, *at).map(Reply::Entry),
            Op::RemoveCredential { name, at } => self.remove_credential(name, *at).map(Reply::Entry),
            Op::SetLocked { locked, detail, at } => self.set_locked(*locked, detail.clone(), *at).map(Reply::Entry),
            Op::Steps { id, steps, at } => self.steps(*id, steps, *at).map(Reply::Entry),
            Op::Barrier => Ok(Reply::Text(String::new())),
            Op::AddAgent { name, token_sha256, at } => self.add_agent(name, token_sha256, *at).map(Reply::Entry),
            Op::RevokeAgent { name, at } => self.revoke_agent(name, *at).map(Reply::Entry),
            Op::RememberMcpSession { id, initialize, at } => {
                self.remember_mcp_session(id, initialize, *at).map(|()| Reply::Text(String::new()))
            }
            Op::VaultEvent { event, detail, at } => self.vault_row(event, detail.clone(), *at).map(Reply::Entry),
            Op::ForgetMcpSession { id } => {
                self.conn.prepare_cached("DELETE FROM mcp_sessions WHERE id = ?1")?.execute([id])?;
                Ok(Reply::Text(String::new()))
            }
            Op::AdmitAndStart { new, steps } => self.admit_and_start(new, steps).map(|a| Reply::Admission(Box::new(a))),
            Op::ApproveEveryUse { name, on, at } => self.set_approve_every_use(name, *on, *at).map(Reply::Entry),
            Op::UpdateSpec { name, spec, event, detail, at } => {
                self.update_spec(name, spec, event, detail.clone(), *at).map(Reply::Entry)
            }
            Op::Refusal { detail, at } => self.vault_row("request_refused", detail.clone(), *at).map(Reply::Entry),
            Op::AdmitAnew { new, anew, steps } => self.admit_anew(new, anew, steps).map(Reply::Entry),
            Op::ReadOnly { new, steps, completion } => {
                self.read_only(new, steps, completion.as_ref()).map(Reply::Entry)
            }
        }
    }

    fn append(&mut self, draft: Draft) -> Result<JournalEntry, StoreError> {
        let row = JournalRow {
            v: ROW_VERSION,
            seq: self.head.size + 1,
            at: draft.at,
            stream: draft.stream,
            event: draft.event,
            execution_id: draft.execution_id,
            session_id: draft.session_id,
            state: draft.state,
            result_sha256: draft.result_sha256,
            detail: draft.detail,
        };
        let body = row.canonical()?;
        let hash = chain_hash(&self.head.hash.0, &body);
        let body_text = String::from_utf8(body).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        let seq = i64::try_from(row.seq).map_err(|_| StoreError::Corrupt("journal is full".into()))?;
        self.conn.prepare_cached("INSERT INTO journal (seq, body, row_hash) VALUES (?1, ?2, ?3)")?.execute(params![
            seq,
            body_text,
            hash.as_slice()
        ])?;
        self.head = JournalHead { size: row.seq, hash: HashHex(hash) };
        Ok(JournalEntry { row, row_hash: HashHex(hash) })
    }

    fn checkpoint(&mut self, at: Timestamp) -> Result<Checkpoint, StoreError> {
        let cp = Checkpoint::new(self.head, at);
        self.conn
            .prepare_cached("INSERT INTO checkpoints (journal_size, head_hash, created_at) VALUES (?1, ?2, ?3)")?
            .execute(params![
                i64::try_from(cp.journal_size).unwrap_or(i64::MAX),
                cp.head_hash.to_string(),
                at.as_millis()
            ])?;
        Ok(cp)
    }
}

/// `rusqlite::Error` is not `Clone`; a batch-wide failure is reported to every caller.
fn clone_sqlite_error(e: &rusqlite::Error) -> rusqlite::Error {
    match e {
        rusqlite::Error::SqliteFailure(code, msg) => rusqlite::Error::SqliteFailure(*code, msg.clone()),
        other => rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_ERROR),
            Some(other.to_string()),
        ),
    }
}

//! The single journal writer: one thread owns the read-write connection and commits every
//! write, grouping whatever requests are waiting into one transaction (group commit).
//!
//! Serialising writes here is also what makes admission atomic: the retry lookup and the
//! acceptance of a new execution happen in the same transaction, on the same thread, so two
//! identical concurrent calls are decided one after the other.

mod executions;
mod export;
mod sessions;
mod vault;

use crate::{
    Admission, Checkpoint, Checkpointed, Completion, CredentialRecord, NewExecution, Recovery, SessionStart,
    StoreError, StoreOptions,
    event::{ActivityNote, Event, SessionEvent, VaultEvent, detail_of},
    journal::{HashHex, JournalEntry, JournalHead, JournalRow, ROW_VERSION, chain_hash},
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

/// How often an idle writer looks for commits by another process.
const WATCH_INTERVAL: std::time::Duration = std::time::Duration::from_millis(100);

/// How long a batch of writes nobody waits for waits for more by default (see `Writer::linger`):
/// short beside a call's round trip (~1 ms on loopback), long enough for concurrent calls to
/// share a commit.
pub(crate) const LINGER: std::time::Duration = std::time::Duration::from_micros(1_000);

fn data_version(conn: &Connection) -> Result<i64, StoreError> {
    Ok(conn.query_row("PRAGMA data_version", [], |r| r.get(0))?)
}

pub const MCP_SESSION_LIFETIME_MS: i64 = 7 * 24 * 60 * 60 * 1000;

/// At most this many MCP sessions are kept (the newest).
pub const MCP_SESSIONS_KEPT: i64 = 10_000;

/// How a write is committed.
#[derive(Clone, Copy, Debug)]
pub(crate) struct WriteKind {
    /// Must it be on disk before its caller hears back? Acceptance is ordered by the single
    /// writer but needs no fsync of its own: nothing has left the machine yet, and the fsync of
    /// the `dispatched` row (same WAL, written later) makes it durable too. Read-only executions
    /// are journaled without waiting for the disk: a retry of them is harmless.
    durable: bool,
    /// The lifecycle step it makes durable, naming its crash points (`failpoints` builds).
    mark: Option<&'static str>,
}

impl WriteKind {
    /// On disk before the caller hears back.
    pub(crate) const DURABLE: WriteKind = WriteKind { durable: true, mark: None };
    /// Committed in order, made durable by the next durable write.
    pub(crate) const ORDERED: WriteKind = WriteKind { durable: false, mark: None };

    /// Durable, and the commit of lifecycle step `mark` (`dispatched`, `completed`).
    pub(crate) const fn step(mark: &'static str) -> WriteKind {
        WriteKind { durable: true, mark: Some(mark) }
    }

    /// Durable; marked `dispatched` if `steps` dispatch.
    pub(crate) fn steps(steps: &[(ExecutionState, Value)]) -> WriteKind {
        if steps.iter().any(|(s, _)| *s == ExecutionState::Dispatched) {
            WriteKind::step("dispatched")
        } else {
            WriteKind::DURABLE
        }
    }
}

/// Who is waiting for a write's outcome.
enum Responder<R> {
    /// A thread blocked on the reply.
    Sync(mpsc::SyncSender<Result<R, StoreError>>),
    /// A task awaiting the reply (no thread is blocked while the writer works).
    Async(tokio::sync::oneshot::Sender<Result<R, StoreError>>),
    /// Nobody: a failure is logged.
    Detached,
}

/// One write as the writer thread sees it: applied inside the batch's transaction (in its own
/// savepoint), answered once the batch is committed or has failed. Each domain's operation is a
/// `Store` method that hands the writer a closure over its SQL (`executions.rs`, `vault.rs`,
/// `sessions.rs`): adding an operation is that method plus its SQL.
trait Task: Send {
    fn kind(&self) -> WriteKind;
    /// Does a caller wait for its outcome? (A detached write — a read-only call's rows — may
    /// wait for company in the batch; a caller never does.)
    fn awaited(&self) -> bool;
    /// Runs the write and keeps its outcome; `Err` when it failed (it is then rolled back).
    fn apply(&mut self, writer: &mut Writer) -> Result<(), &StoreError>;
    /// Tells the caller: the kept outcome, or `failed` (the whole batch was undone).
    fn answer(self: Box<Self>, failed: Option<&rusqlite::Error>);
}

struct Write<R, F> {
    kind: WriteKind,
    work: Option<F>,
    outcome: Option<Result<R, StoreError>>,
    reply: Responder<R>,
}

impl<R, F> Task for Write<R, F>
where
    R: Send,
    F: FnOnce(&mut Writer) -> Result<R, StoreError> + Send,
{
    fn kind(&self) -> WriteKind {
        self.kind
    }

    fn awaited(&self) -> bool {
        !matches!(self.reply, Responder::Detached)
    }

    fn apply(&mut self, writer: &mut Writer) -> Result<(), &StoreError> {
        let outcome = match self.work.take() {
            Some(work) => work(writer),
            None => Err(StoreError::Corrupt("a write was applied twice".into())),
        };
        match self.outcome.insert(outcome) {
            Ok(_) => Ok(()),
            Err(e) => Err(e),
        }
    }

    fn answer(self: Box<Self>, failed: Option<&rusqlite::Error>) {
        let outcome = match failed {
            Some(e) => Err(StoreError::Sqlite(clone_sqlite_error(e))),
            None => self.outcome.unwrap_or(Err(StoreError::WriterStopped)),
        };
        // The caller may have given up waiting; the write itself stands.
        match self.reply {
            Responder::Sync(tx) => drop(tx.send(outcome)),
            Responder::Async(tx) => drop(tx.send(outcome)),
            Responder::Detached => {
                if let Err(e) = outcome {
                    tracing::error!(error = %e, "a write nobody waits for failed");
                }
            }
        }
    }
}

type Job = Box<dyn Task>;

fn job<R, F>(kind: WriteKind, work: F, reply: Responder<R>) -> Job
where
    R: Send + 'static,
    F: FnOnce(&mut Writer) -> Result<R, StoreError> + Send + 'static,
{
    Box::new(Write { kind, work: Some(work), outcome: None, reply })
}

/// Counters of what the writer committed: `operations / transactions` is the group-commit
/// factor (how many writes shared one fsync).
#[derive(Debug, Default)]
pub struct WriterStats {
    transactions: AtomicU64,
    operations: AtomicU64,
    external_commits: AtomicU64,
}

impl WriterStats {
    pub fn transactions(&self) -> u64 {
        self.transactions.load(Ordering::Relaxed)
    }

    pub fn operations(&self) -> u64 {
        self.operations.load(Ordering::Relaxed)
    }

    /// Commits another process made to the database since it was opened, as the writer saw them
    /// (several between two looks count once). Each one makes the gateway compare the authority
    /// tables with the journal and forget every remembered secret and pooled SSH connection.
    pub fn external_commits(&self) -> u64 {
        self.external_commits.load(Ordering::Relaxed)
    }
}

#[derive(Debug)]
pub(crate) struct WriterHandle {
    pub(crate) stats: Arc<WriterStats>,
    tx: Option<mpsc::Sender<Job>>,
    thread: Option<std::thread::JoinHandle<()>>,
    alarm: Arc<std::sync::Mutex<Option<Vec<crate::authority::AuthorityMismatch>>>>,
    /// The journal's size after each commit.
    committed: tokio::sync::watch::Receiver<u64>,
    epoch: Arc<crate::epoch::AuthorityEpoch>,
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

impl WriterHandle {
    pub(crate) fn spawn(mut conn: Connection, options: StoreOptions) -> Result<Self, StoreError> {
        let head = load_head(&conn)?;
        let epoch = Arc::new(crate::epoch::AuthorityEpoch::default());
        epoch.watch(&mut conn)?;
        // The tree's right edge; a journal from before the tree was kept gets its nodes now. A
        // journal edited so that its tree cannot be built still opens (opening is not a
        // verification, and refusing would let whoever edited it stop the gateway): it serves
        // without a tree, and a checkpoint says why there is none.
        conn.execute_batch("BEGIN IMMEDIATE")?;
        let tree = match crate::merkle::frontier(&conn, head.size) {
            Ok(tree) => {
                conn.execute_batch("COMMIT")?;
                Ok(tree)
            }
            Err(e) => {
                conn.execute_batch("ROLLBACK")?;
                tracing::error!(error = %e, "the journal's Merkle tree cannot be built; run `postern audit verify`");
                Err(e.to_string())
            }
        };
        let (tx, rx) = mpsc::channel::<Job>();
        let stats = Arc::new(WriterStats::default());
        let alarm = Arc::new(std::sync::Mutex::new(None));
        let data_version = data_version(&conn)?;
        let (committed_tx, committed) = tokio::sync::watch::channel(head.size);
        let mut writer = Writer {
            epoch: Arc::clone(&epoch),
            committed: committed_tx,
            alarm: Arc::clone(&alarm),
            data_version,
            conn,
            head,
            tree,
            max_batch: options.max_batch.max(1),
            linger: options.linger,
            stats: Arc::clone(&stats),
            synchronous_full: true,
            states: Default::default(),
            cache_invalid: false,
            alarm_to_journal: None,
        };
        let thread = std::thread::Builder::new()
            .name("postern-journal-writer".into())
            .spawn(move || writer.run(rx))
            .map_err(|e| StoreError::Corrupt(format!("cannot start the journal writer: {e}")))?;
        Ok(WriterHandle { stats, tx: Some(tx), thread: Some(thread), alarm, committed, epoch })
    }

    /// The journal's size, updated after every commit that appended rows.
    pub(crate) fn committed(&self) -> tokio::sync::watch::Receiver<u64> {
        self.committed.clone()
    }

    fn submit(&self, job: Job) -> Result<(), StoreError> {
        let tx = self.tx.as_ref().ok_or(StoreError::WriterStopped)?;
        tx.send(job).map_err(|_| StoreError::WriterStopped)
    }

    /// Has the writer run `work` in its next transaction and waits (blocking this thread) until
    /// that transaction is committed.
    pub(crate) fn call<R, F>(&self, kind: WriteKind, work: F) -> Result<R, StoreError>
    where
        R: Send + 'static,
        F: FnOnce(&mut Writer) -> Result<R, StoreError> + Send + 'static,
    {
        let (reply, rx) = mpsc::sync_channel(1);
        self.submit(job(kind, work, Responder::Sync(reply)))?;
        rx.recv().map_err(|_| StoreError::WriterStopped)?
    }

    /// [`WriterHandle::call`] for a task: it awaits the commit without blocking a thread.
    pub(crate) async fn call_async<R, F>(&self, kind: WriteKind, work: F) -> Result<R, StoreError>
    where
        R: Send + 'static,
        F: FnOnce(&mut Writer) -> Result<R, StoreError> + Send + 'static,
    {
        let (reply, rx) = tokio::sync::oneshot::channel();
        self.submit(job(kind, work, Responder::Async(reply)))?;
        rx.await.map_err(|_| StoreError::WriterStopped)?
    }

    /// Queues `work` and returns at once; nobody waits for it (a failure is logged).
    pub(crate) fn detached<R, F>(&self, kind: WriteKind, work: F) -> Result<(), StoreError>
    where
        R: Send + 'static,
        F: FnOnce(&mut Writer) -> Result<R, StoreError> + Send + 'static,
    {
        self.submit(job(kind, work, Responder::Detached))
    }

    /// Returns once everything queued before it is committed.
    pub(crate) fn flush(&self) -> Result<(), StoreError> {
        self.call(WriteKind::ORDERED, |_| Ok(()))
    }

    pub(crate) async fn flush_async(&self) -> Result<(), StoreError> {
        self.call_async(WriteKind::ORDERED, |_| Ok(())).await
    }

    /// The vault epoch ([`crate::epoch`]), without a count of the `Arc` taken.
    pub(crate) fn vault_epoch(&self) -> u64 {
        self.epoch.vault_now()
    }

    /// Moves after every commit that may have changed what grants authority.
    pub(crate) fn epoch(&self) -> Arc<crate::epoch::AuthorityEpoch> {
        Arc::clone(&self.epoch)
    }

    /// The authority alarm the writer raised, if any (see [`crate::Store::authority_alarm`]).
    pub(crate) fn alarm(&self) -> Option<Vec<crate::authority::AuthorityMismatch>> {
        self.alarm.lock().ok().and_then(|a| a.clone())
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

pub(crate) struct Writer {
    conn: Connection,
    /// Moved after a commit that touched a table that may grant authority (readers then forget
    /// what they remembered of those tables).
    epoch: Arc<crate::epoch::AuthorityEpoch>,
    /// Told the journal's size after each commit (what the app's live views wait on).
    committed: tokio::sync::watch::Sender<u64>,
    /// Set when another process committed to the database and the authority tables then
    /// differed from the journal.
    alarm: Arc<std::sync::Mutex<Option<Vec<crate::authority::AuthorityMismatch>>>>,
    /// `PRAGMA data_version` as this connection last saw it: it changes only when another
    /// connection commits (this one's own commits leave it as it is).
    data_version: i64,
    head: JournalHead,
    /// The Merkle tree's right edge at `head.size` rows; a rollback that moves the head back
    /// leaves it ahead, and [`Writer::tree`] then reads it again. Why there is none, when the
    /// journal was edited so that it cannot be built.
    tree: Result<postern_core::merkle::Frontier, String>,
    max_batch: usize,
    /// See [`crate::StoreOptions::linger`].
    linger: std::time::Duration,
    stats: Arc<WriterStats>,
    /// The connection's current `PRAGMA synchronous` (FULL or NORMAL).
    synchronous_full: bool,
    /// Current state and session of executions, as this writer (the only writer) last wrote
    /// them; saves a read per transition. Cleared whenever a transaction or savepoint rolls back.
    states: std::collections::HashMap<ExecutionId, (ExecutionState, Option<SessionId>)>,
    cache_invalid: bool,
    /// An alarm raised inside a batch, to be journaled once the batch is done.
    alarm_to_journal: Option<Vec<crate::authority::AuthorityMismatch>>,
}

/// A row about to be appended (the writer assigns `seq`).
struct Draft {
    at: Timestamp,
    event: Event,
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
    for mark in batch.iter().filter_map(|job| job.kind().mark) {
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
            self.linger(&rx, &mut batch);
            self.commit_and_answer(batch);
            self.journal_alarm();
        }
    }

    /// A batch of unsynced writes nobody waits for (read-only calls' rows, written after their
    /// answers went out) waits up to the linger ([`LINGER`] by default) for more jobs, so that
    /// several calls share one commit: the leaf pages every call touches are written once per
    /// commit, not once per call. A job somebody waits for, or one that must be on disk, ends
    /// the wait at once; so does the last handle going (shutdown commits what is held).
    fn linger(&self, rx: &mpsc::Receiver<Job>, batch: &mut Vec<Job>) {
        let may_wait = |job: &Job| !job.awaited() && !job.kind().durable;
        if self.linger.is_zero() || !batch.iter().all(may_wait) {
            return;
        }
        let deadline = std::time::Instant::now() + self.linger;
        while batch.len() < self.max_batch {
            let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) else { return };
            match rx.recv_timeout(left) {
                Ok(job) => {
                    let waits = may_wait(&job);
                    batch.push(job);
                    if !waits {
                        return;
                    }
                }
                Err(_) => return,
            }
        }
    }

    /// Commits `batch` and tells each job's caller how it went.
    fn commit_and_answer(&mut self, mut batch: Vec<Job>) {
        let failed = self.commit_batch(&mut batch);
        // Before the answers: a caller told its revocation committed is never then let in by
        // what a reader remembered from before it.
        self.epoch.settle();
        // Before the answers: a caller that reads the size after its write sees the write.
        let size = self.head.size;
        self.committed.send_if_modified(|seen| std::mem::replace(seen, size) != size);
        for job in batch {
            job.answer(failed.as_ref());
        }
    }

    /// Another process committed to the database (nothing but this writer should): if what grants
    /// authority — the authority tables, and the `executions` rows retry decisions read — now
    /// differs from the journal, raise the alarm and journal it once.
    fn watch(&mut self) {
        if self.external_changes() {
            self.journal_alarm();
        }
    }

    /// Whether another process committed since this connection last looked, and then left the
    /// authority tables or the executions projection different from the journal (the alarm is
    /// raised then). Cheap when nothing changed: one `PRAGMA data_version`.
    fn external_changes(&mut self) -> bool {
        let Ok(now) = data_version(&self.conn) else {
            // Unknown whether another process committed: forget what was remembered.
            self.epoch.advance();
            return false;
        };
        if now == self.data_version {
            return false;
        }
        self.data_version = now;
        self.cache_invalid = true;
        self.epoch.advance();
        // Nothing but this writer should commit here. Commits that change no authority raise no
        // alarm, but each one costs a comparison and every remembered secret: said in the log, at
        // the 1st, 2nd, 4th, 8th... so a process committing in a loop is visible, not noisy.
        let seen = self.stats.external_commits.fetch_add(1, Ordering::Relaxed) + 1;
        if seen.is_power_of_two() {
            tracing::warn!(
                external_commits = seen,
                "another process committed to the journal database; each commit makes postern re-check authority \
                 and re-read secrets from the keychain"
            );
        }
        // A check that cannot run is a finding, like a chain that cannot be walked: granting
        // must not go on because the tables could not be compared.
        let unread = |what: &str, e: StoreError| crate::authority::AuthorityMismatch {
            table: "journal",
            key: what.to_owned(),
            journal: "not read".into(),
            table_value: format!("could not be compared: {e}"),
        };
        let mut found = crate::authority::check(&self.conn).unwrap_or_else(|e| vec![unread("authority", e)]);
        found.extend(crate::authority::check_executions(&self.conn).unwrap_or_else(|e| vec![unread("executions", e)]));
        // The chain itself: the rows retry decisions read (`accepted`, the last state) must be
        // the ones this writer appended. Another process's commit is the rare case (the lock
        // keeps other writers out), so the whole walk is affordable.
        let chain = match crate::audit::chain_differs(&self.conn, self.head) {
            Ok(differs) => differs,
            Err(e) => Some(format!("could not be walked: {e}")),
        };
        if let Some(why) = chain {
            found.push(crate::authority::AuthorityMismatch {
                table: "journal",
                key: "chain".into(),
                journal: format!("row {} ({})", self.head.size, self.head.hash),
                table_value: why,
            });
        }
        if found.is_empty() {
            return false;
        }
        self.raise(found)
    }

    /// Raises the alarm with `found`; `true` the first time (the row is then to be journaled).
    fn raise(&mut self, found: Vec<crate::authority::AuthorityMismatch>) -> bool {
        let first = match self.alarm.lock() {
            Ok(mut alarm) => {
                let first = alarm.is_none();
                if first {
                    *alarm = Some(found.clone());
                }
                first
            }
            Err(_) => false,
        };
        if first {
            tracing::error!(
                differences = ?found.iter().map(ToString::to_string).collect::<Vec<_>>(),
                "the authority tables or the executions rows were changed behind the journal's back; nothing is \
                 granted until postern restarts on a journal that verifies"
            );
            self.alarm_to_journal = Some(found);
        }
        first
    }

    /// Journals the alarm raised, once, in a transaction of its own.
    fn journal_alarm(&mut self) {
        let Some(found) = self.alarm_to_journal.take() else { return };
        let detail = json!({ "differences": found.iter().map(ToString::to_string).collect::<Vec<_>>() });
        let at = Timestamp::from_millis(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX)),
        );
        let tampered = move |w: &mut Writer| w.vault_row(VaultEvent::AuthorityTampered, detail, at);
        self.commit_and_answer(vec![job(WriteKind::DURABLE, tampered, Responder::Detached)]);
    }

    /// The alarm, if raised: what retry decisions and grants are refused on.
    pub(crate) fn alarmed(&self) -> Option<Vec<crate::authority::AuthorityMismatch>> {
        self.alarm.lock().ok().and_then(|a| a.clone())
    }

    /// Applies every job in one transaction. A job that fails is rolled back to its own
    /// savepoint (and answers its error); the others still commit. If the transaction as a whole
    /// fails, that failure is returned and every job answers it.
    fn commit_batch(&mut self, batch: &mut [Job]) -> Option<rusqlite::Error> {
        let head_before = self.head;
        let tree_before = self.tree.clone();
        // A batch is fsynced if any of its operations must be durable (which also makes every
        // earlier unsynced commit durable: the WAL is written in order).
        let durable = batch.iter().any(|job| job.kind().durable);
        if durable != self.synchronous_full {
            let mode = if durable { "FULL" } else { "NORMAL" };
            if let Err(e) = self.conn.pragma_update(None, "synchronous", mode) {
                return Some(e);
            }
            self.synchronous_full = durable;
        }
        if let Err(e) = self.conn.execute_batch("BEGIN IMMEDIATE") {
            return Some(e);
        }
        // Another process may have committed between the last look and this transaction (which
        // now holds the write lock): look again, so no job below reads a table edited behind the
        // journal's back without the alarm up.
        self.external_changes();
        for job in batch.iter_mut() {
            let head_at_savepoint = self.head;
            let tree_at_savepoint = self.tree.clone();
            let mut failure = None;
            let savepoint = self.statement("SAVEPOINT op").and_then(|()| {
                if let Err(e) = job.apply(self) {
                    failure = Some(match e {
                        StoreError::Sqlite(e) => clone_sqlite_error(e),
                        e => rusqlite::Error::SqliteFailure(
                            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_ERROR),
                            Some(e.to_string()),
                        ),
                    });
                    if !self.conn.is_autocommit() {
                        self.statement("ROLLBACK TO op")?;
                        self.cache_invalid = true;
                    }
                }
                if !self.conn.is_autocommit() {
                    self.statement("RELEASE op")?;
                }
                Ok(())
            });
            if let Err(e) = savepoint {
                // The savepoint itself could not be taken or released: nothing this batch wrote
                // can be trusted to be what its jobs asked for.
                let _ = self.conn.execute_batch("ROLLBACK");
                self.cache_invalid = true;
                self.head = head_before;
                self.tree = tree_before;
                return Some(match e {
                    StoreError::Sqlite(e) => e,
                    e => rusqlite::Error::SqliteFailure(
                        rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_ERROR),
                        Some(e.to_string()),
                    ),
                });
            }
            if failure.is_some() {
                self.head = head_at_savepoint;
                self.tree = tree_at_savepoint;
            }
            if self.conn.is_autocommit() {
                // SQLite rolled the whole transaction back (it may on SQLITE_FULL, SQLITE_IOERR
                // or SQLITE_NOMEM, per its documentation): every job of the batch is undone, so
                // none may be reported as written, and the jobs after it must not run outside a
                // transaction (each savepoint would then commit on its own).
                self.cache_invalid = true;
                self.head = head_before;
                self.tree = tree_before;
                return Some(failure.unwrap_or_else(|| {
                    rusqlite::Error::SqliteFailure(
                        rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_ABORT),
                        Some("the transaction was rolled back".into()),
                    )
                }));
            }
        }
        let marks = crash_marks(batch);
        for mark in &marks {
            crate::crash::point(&format!("store::commit::before::{mark}"));
        }
        if let Err(e) = self.conn.execute_batch("COMMIT") {
            let _ = self.conn.execute_batch("ROLLBACK");
            self.cache_invalid = true;
            self.head = head_before;
            self.tree = tree_before;
            return Some(e);
        }
        for mark in &marks {
            crate::crash::point(&format!("store::commit::after::{mark}"));
        }
        self.stats.transactions.fetch_add(1, Ordering::Relaxed);
        self.stats.operations.fetch_add(batch.len() as u64, Ordering::Relaxed);
        None
    }

    /// Runs a fixed statement through the statement cache (no SQL parsing per operation).
    fn statement(&self, sql: &str) -> Result<(), StoreError> {
        self.conn.prepare_cached(sql)?.execute([])?;
        Ok(())
    }

    fn append(&mut self, draft: Draft) -> Result<JournalEntry, StoreError> {
        let row = JournalRow {
            v: ROW_VERSION,
            seq: self.head.size + 1,
            at: draft.at,
            event: draft.event,
            execution_id: draft.execution_id,
            session_id: draft.session_id,
            state: draft.state,
            result_sha256: draft.result_sha256,
            detail: draft.detail,
        };
        let body = row.canonical()?;
        let hash = chain_hash(&self.head.hash.0, &body);
        let completed = self.tree().ok().map(|tree| tree.push(postern_core::merkle::leaf_hash(&body)));
        if let Some(completed) = completed
            && let Some(conflict) = crate::merkle::keep(&self.conn, &completed)?
        {
            // A node planted ahead of the rows: the tree is no longer this writer's to sign, but
            // rows go on being appended (the plant must not stop the journal).
            tracing::error!(conflict = %conflict, "the journal's Merkle tree was edited behind the writer; checkpoints are refused until `postern audit verify` is run");
            self.tree = Err(conflict);
        }
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

    /// The tree's right edge at the head (restored with the head when a savepoint or the batch
    /// rolls back; read again from the database only if the two ever disagree); why there is
    /// none, when the journal cannot make one (rows go on being appended: a tree is evidence,
    /// never a condition of serving).
    fn tree(&mut self) -> Result<&mut postern_core::merkle::Frontier, StoreError> {
        let size = self.head.size;
        if self.tree.as_ref().is_ok_and(|t| t.size() != size) {
            let mut rows = crate::merkle::RowSubtrees::new(&self.conn);
            self.tree = postern_core::merkle::Frontier::at(size, &mut rows).map_err(|e| e.to_string());
        }
        self.tree.as_mut().map_err(|why| {
            StoreError::Corrupt(format!(
                "the journal's Merkle tree cannot be built ({why}): run `postern audit verify`"
            ))
        })
    }

    pub(crate) fn checkpoint(&mut self, at: Timestamp) -> Result<Checkpointed, StoreError> {
        let journal = Checkpoint::new(self.head, at);
        // Without a tree the chain's head is still recorded (the JSON checkpoint needs no tree).
        let tree = self.tree().map(|t| t.head()).map_err(|e| e.to_string());
        self.conn
            .prepare_cached(
                "INSERT INTO checkpoints (journal_size, head_hash, created_at, root_hash) VALUES (?1, ?2, ?3, ?4)",
            )?
            .execute(params![
                i64::try_from(journal.journal_size).unwrap_or(i64::MAX),
                journal.head_hash.to_string(),
                at.as_millis(),
                tree.as_ref().ok().map(|t| hex::encode(t.root))
            ])?;
        Ok(Checkpointed { journal, tree })
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

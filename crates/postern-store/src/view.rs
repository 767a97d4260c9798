//! Read-only queries over the journal and its projections, for the CLI and the app.
//! A `JournalView` never writes: it opens the file read-only and refuses files that are not a
//! Postern database before running a single query against them.

use crate::{
    StoreError, Unusable,
    epoch::{AuthorityEpoch, Remembered},
    journal::{HashHex, JournalEntry, JournalHead, JournalRow},
    schema, writer,
};
use postern_core::{ExecutionId, ExecutionState, SessionId};
use rusqlite::{Connection, OpenFlags, OptionalExtension, params};
use serde::Serialize;
use serde_json::Value;
use std::{
    path::Path,
    sync::{Arc, Mutex},
};

#[derive(Debug)]
pub struct JournalView {
    conn: Mutex<Connection>,
    /// The gateway's own view (beside the journal's writer) remembers its hottest lookups until
    /// the writer's authority epoch moves; a view opened alone remembers nothing.
    remembered: Option<Remembering>,
}

/// What the gateway's view remembers per authority epoch ([`crate::epoch`]).
#[derive(Debug)]
struct Remembering {
    /// Token SHA-256 → its active agent (an unknown or revoked token is looked up every time).
    agents: Remembered<String, Option<AgentRecord>>,
    /// Agent run → its standing.
    standings: Remembered<SessionId, Option<bool>>,
}

/// An agent allowed to use Streamable HTTP (its token is never stored, only its SHA-256).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AgentRecord {
    pub name: String,
    pub token_sha256: String,
    pub created_at: i64,
    pub revoked_at: Option<i64>,
}

fn agent_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<AgentRecord> {
    Ok(AgentRecord { name: r.get(0)?, token_sha256: r.get(1)?, created_at: r.get(2)?, revoked_at: r.get(3)? })
}

/// What `postern activity` shows.
#[derive(Clone, Debug, Default)]
pub struct ActivityFilter {
    pub execution: Option<ExecutionId>,
    pub session: Option<SessionId>,
    /// Most recent rows to return (in chronological order).
    pub limit: usize,
}

/// How far an exporter has sent the journal ([`JournalView::export_cursor`]).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ExportCursor {
    /// Where it sends (the endpoint, without credentials).
    pub target: String,
    /// Every row up to this one has been sent.
    pub seq: u64,
    /// When it last sent (ms).
    pub updated_at: i64,
    /// Its last failure since it last sent, and when (ms).
    pub last_error: Option<String>,
    pub error_at: Option<i64>,
}

/// Which executions a page holds (the Activity view's filters). `None` means "any".
#[derive(Clone, Debug, Default, PartialEq, serde::Deserialize)]
pub struct ExecutionQuery {
    /// Only executions older than this ID (the last row of the previous page).
    pub before: Option<String>,
    pub state: Option<ExecutionState>,
    pub tool: Option<String>,
    pub actor: Option<String>,
    pub session: Option<String>,
    /// Accepted at or after (ms).
    pub from: Option<i64>,
    /// Accepted before (ms).
    pub until: Option<i64>,
    /// Substring of the ID, tool, actor or state.
    pub text: Option<String>,
    pub limit: usize,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ExecutionSummary {
    pub id: String,
    pub fingerprint: String,
    pub actor: String,
    pub intent_scope: String,
    pub session_id: Option<String>,
    pub tool: String,
    pub channel: String,
    pub state: ExecutionState,
    pub accepted_at: i64,
    pub updated_at: i64,
    pub first_dispatched_at: Option<i64>,
    pub contract: Value,
    pub record: Value,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SessionSummary {
    pub id: String,
    pub actor: String,
    pub pid: Option<i64>,
    pub process_start: Option<i64>,
    pub transport: String,
    pub client: Option<String>,
    pub started_at: i64,
    pub ended_at: Option<i64>,
    pub end_reason: Option<String>,
    pub executions: i64,
    /// `authorized` or `revoked` once a reviewer (or policy) decided; `None` while undecided.
    pub authorization: Option<String>,
    /// Who decided it (`terminal`, `allowlist`, `policy:no-reviewer`, `cli`, …).
    pub authorized_by: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StoredResult {
    pub execution_id: String,
    pub recorded_at: i64,
    pub sha256: String,
    /// The journal row (`completed`) that recorded this result's digest.
    pub journal_seq: i64,
    #[serde(skip)]
    pub body: Vec<u8>,
}

/// The newest side-effecting `accepted` or `retry_received` row whose correlation names MCP
/// session ?1 and JSON-RPC id ?2, read through `journal_request_lookup` (migration 13): the query
/// repeats the index's condition, as SQLite uses a partial index only for a query that implies it.
/// The row's own correlation is read back too: an index is not hash-chained, so an entry edited
/// to point elsewhere must not pick the execution.
pub(crate) const REQUEST_EXECUTION: &str =
    "SELECT execution_id, event, json_extract(body, '$.payload.decision.decision'),
            json_extract(body, '$.payload.correlation') FROM journal
     WHERE json_extract(body, '$.payload.correlation.mcp_session_id') = ?1
       AND json_extract(body, '$.payload.correlation.jsonrpc_id') = ?2
       AND event IN ('accepted', 'retry_received')
       AND json_extract(body, '$.payload.contract.class') IS NOT 'read_only'
     ORDER BY seq DESC LIMIT 1";

/// The newest side-effecting `accepted` row with fingerprint ?1, actor ?2 and intent scope ?3 — a
/// retry's prior, read from the chain — with when it was accepted and its contract. A read-only
/// execution is never a prior (it is not in the index either: migration 12).
pub(crate) const PRIOR_ACCEPTED: &str = "SELECT execution_id, at, json_extract(body, '$.payload.contract') FROM journal
     WHERE fingerprint = ?1 AND event = 'accepted'
       AND json_extract(body, '$.payload.contract.class') IS NOT 'read_only'
       AND json_extract(body, '$.payload.actor') = ?2
       AND json_extract(body, '$.payload.intent_scope') = ?3
     ORDER BY seq DESC LIMIT 1";

/// The newest side-effecting `accepted` row with effect fingerprint ?1 and actor ?2 in an intent
/// scope other than ?3: the same effect asked for in another run. Only the newest 64 rows of the
/// effect are looked at, so an effect repeated without end in one scope costs admission a
/// bounded read (the single writer runs it).
pub(crate) const EARLIER_EFFECT: &str = "SELECT execution_id, at, json_extract(body, '$.payload.intent_scope') FROM (
       SELECT execution_id, at, body, seq FROM journal
        WHERE effect_fingerprint = ?1 AND event = 'accepted' ORDER BY seq DESC LIMIT 64)
     WHERE json_extract(body, '$.payload.actor') = ?2
       AND json_extract(body, '$.payload.intent_scope') <> ?3
     ORDER BY seq DESC LIMIT 1";

/// Execution ?1's state as its last state row in the chain says.
pub(crate) const LAST_STATE: &str =
    "SELECT state FROM journal WHERE execution_id = ?1 AND state IS NOT NULL ORDER BY seq DESC LIMIT 1";

const EXECUTION_COLUMNS: &str = "SELECT id, fingerprint, actor, intent_scope, session_id, tool, channel, state,
        accepted_at, updated_at, first_dispatched_at, contract, record FROM executions";

/// A state column read as the state it names: a spelling no state has is a corrupt row, never a
/// string passed on for a reader to guess at.
pub(crate) fn state_at(r: &rusqlite::Row<'_>, i: usize) -> rusqlite::Result<ExecutionState> {
    let text: String = r.get(i)?;
    text.parse().map_err(|e| rusqlite::Error::FromSqlConversionFailure(i, rusqlite::types::Type::Text, Box::new(e)))
}

fn execution_summary(r: &rusqlite::Row<'_>) -> rusqlite::Result<ExecutionSummary> {
    let json = |i: usize| -> rusqlite::Result<Value> {
        let text: String = r.get(i)?;
        serde_json::from_str(&text)
            .map_err(|e| rusqlite::Error::FromSqlConversionFailure(i, rusqlite::types::Type::Text, Box::new(e)))
    };
    Ok(ExecutionSummary {
        id: r.get(0)?,
        fingerprint: r.get(1)?,
        actor: r.get(2)?,
        intent_scope: r.get(3)?,
        session_id: r.get(4)?,
        tool: r.get(5)?,
        channel: r.get(6)?,
        state: state_at(r, 7)?,
        accepted_at: r.get(8)?,
        updated_at: r.get(9)?,
        first_dispatched_at: r.get(10)?,
        contract: json(11)?,
        record: json(12)?,
    })
}

const SESSION_COLUMNS: &str = "SELECT s.id, s.actor, s.pid, s.process_start, s.transport, s.client, s.started_at,
        s.ended_at, s.end_reason, (SELECT count(*) FROM executions e WHERE e.session_id = s.id),
        g.standing, g.decided_by
 FROM agent_sessions s LEFT JOIN session_grants g ON g.session_id = s.id";

fn session_summary(r: &rusqlite::Row<'_>) -> rusqlite::Result<SessionSummary> {
    Ok(SessionSummary {
        id: r.get(0)?,
        actor: r.get(1)?,
        pid: r.get(2)?,
        process_start: r.get(3)?,
        transport: r.get(4)?,
        client: r.get(5)?,
        started_at: r.get(6)?,
        ended_at: r.get(7)?,
        end_reason: r.get(8)?,
        executions: r.get(9)?,
        authorization: r.get(10)?,
        authorized_by: r.get(11)?,
    })
}

pub(crate) fn unusable(path: &Path, problem: Unusable) -> StoreError {
    StoreError::Unusable { path: path.to_owned(), problem }
}

/// Opens `path` read-only after checking it is a Postern database this build can read.
pub(crate) fn open_checked(path: &Path) -> Result<Connection, StoreError> {
    let meta = std::fs::metadata(path).map_err(|_| unusable(path, Unusable::Missing))?;
    if meta.len() == 0 {
        return Err(unusable(path, Unusable::Empty));
    }
    let conn = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX)?;
    conn.busy_timeout(std::time::Duration::from_secs(5))?;
    crate::stable_plans(&conn)?;
    schema::check_identity(&conn, path, false)?;
    Ok(conn)
}

fn entry_from(seq: i64, body: &str, hash: Vec<u8>) -> Result<JournalEntry, StoreError> {
    let row =
        JournalRow::from_body(body.as_bytes()).map_err(|e| StoreError::Corrupt(format!("journal row {seq}: {e}")))?;
    let hash = hash.try_into().map_err(|_| StoreError::Corrupt(format!("journal row {seq}: bad row_hash")))?;
    Ok(JournalEntry { row, row_hash: HashHex(hash) })
}

impl JournalView {
    pub fn open_read_only(path: &Path) -> Result<Self, StoreError> {
        Ok(JournalView { conn: Mutex::new(open_checked(path)?), remembered: None })
    }

    /// This view, remembering token and standing lookups until `epoch` moves (only for the view
    /// beside the writer that moves it).
    pub(crate) fn remembering(mut self, epoch: Arc<AuthorityEpoch>) -> Self {
        self.remembered =
            Some(Remembering { agents: Remembered::new(Arc::clone(&epoch)), standings: Remembered::new(epoch) });
        self
    }

    pub(crate) fn with<T>(&self, f: impl FnOnce(&Connection) -> Result<T, StoreError>) -> Result<T, StoreError> {
        let conn = self.conn.lock().map_err(|_| StoreError::Corrupt("view lock poisoned".into()))?;
        f(&conn)
    }

    fn entries(conn: &Connection, sql: &str, params: impl rusqlite::Params) -> Result<Vec<JournalEntry>, StoreError> {
        let mut stmt = conn.prepare_cached(sql)?;
        let rows =
            stmt.query_map(params, |r| Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?, r.get::<_, Vec<u8>>(2)?)))?;
        rows.map(|r| {
            let (seq, body, hash) = r?;
            entry_from(seq, &body, hash)
        })
        .collect()
    }

    pub fn head(&self) -> Result<JournalHead, StoreError> {
        self.with(writer::load_head)
    }

    /// Activity rows, most recent `limit` of them, oldest first.
    pub fn activity(&self, filter: &ActivityFilter) -> Result<Vec<JournalEntry>, StoreError> {
        let limit = i64::try_from(filter.limit.max(1)).unwrap_or(i64::MAX);
        let mut out = self.with(|c| {
            Self::entries(
                c,
                "SELECT seq, body, row_hash FROM journal
                 WHERE stream = 'activity'
                   AND (?1 IS NULL OR execution_id = ?1)
                   AND (?2 IS NULL OR execution_id IN (SELECT id FROM executions WHERE session_id = ?2))
                 ORDER BY seq DESC LIMIT ?3",
                params![filter.execution.map(|e| e.to_string()), filter.session.map(|s| s.to_string()), limit],
            )
        })?;
        out.reverse();
        Ok(out)
    }

    /// The newest vault-stream row whose event is one of `events`, if any.
    pub fn last_vault_event(&self, events: &[crate::VaultEvent]) -> Result<Option<JournalEntry>, StoreError> {
        let events: Vec<&str> = events.iter().map(|e| e.as_str()).collect();
        let list = serde_json::to_string(&events).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        let mut found = self.with(|c| {
            Self::entries(
                c,
                "SELECT seq, body, row_hash FROM journal
                 WHERE stream = 'vault' AND event IN (SELECT value FROM json_each(?1))
                 ORDER BY seq DESC LIMIT 1",
                [list],
            )
        })?;
        Ok(found.pop())
    }

    /// The newest row of server `server`'s OAuth sign-in that says where it stands
    /// (`oauth_signed_in`, `oauth_refreshed`, `oauth_refresh_failed`, `oauth_signed_out`).
    pub fn last_oauth_event(&self, server: &str) -> Result<Option<JournalEntry>, StoreError> {
        use crate::VaultEvent as V;
        let events: Vec<&str> = [V::OAuthSignedIn, V::OAuthRefreshed, V::OAuthRefreshFailed, V::OAuthSignedOut]
            .iter()
            .map(|e| e.as_str())
            .collect();
        let list = serde_json::to_string(&events).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        let mut found = self.with(|c| {
            Self::entries(
                c,
                "SELECT seq, body, row_hash FROM journal
                 WHERE stream = 'vault' AND event IN (SELECT value FROM json_each(?1))
                   AND json_extract(body, '$.payload.server') = ?2
                 ORDER BY seq DESC LIMIT 1",
                rusqlite::params![list, server],
            )
        })?;
        Ok(found.pop())
    }

    /// Up to `limit` rows after row `seq`, of every stream, oldest first (an exporter's next
    /// batch).
    pub fn rows_after(&self, seq: u64, limit: usize) -> Result<Vec<JournalEntry>, StoreError> {
        let limit = i64::try_from(limit.max(1)).unwrap_or(i64::MAX);
        self.with(|c| {
            Self::entries(
                c,
                "SELECT seq, body, row_hash FROM journal WHERE seq > ?1 ORDER BY seq LIMIT ?2",
                params![i64::try_from(seq).unwrap_or(i64::MAX), limit],
            )
        })
    }

    /// The lifecycle steps of one execution recorded by its first `limit` rows up to row
    /// `until`, oldest first, a folded row unfolded ([`JournalEntry::unfold`]): an exporter's
    /// bounded read, never a whole timeline a stream of retries made long.
    pub fn timeline_until(&self, id: ExecutionId, until: u64, limit: usize) -> Result<Vec<JournalEntry>, StoreError> {
        self.with(|c| {
            Self::steps(
                c,
                "SELECT seq, body, row_hash FROM journal WHERE execution_id = ?1 AND seq <= ?2 ORDER BY seq LIMIT ?3",
                params![
                    id.to_string(),
                    i64::try_from(until).unwrap_or(i64::MAX),
                    i64::try_from(limit.max(1)).unwrap_or(i64::MAX)
                ],
            )
        })
    }

    /// The row at which one execution first reached one of `states` (its first outcome).
    pub fn first_state_row(&self, id: ExecutionId, states: &[ExecutionState]) -> Result<Option<u64>, StoreError> {
        let list: Vec<&str> = states.iter().map(|s| s.as_str()).collect();
        let list = serde_json::to_string(&list).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        self.with(|c| {
            use rusqlite::OptionalExtension;
            Ok(c.prepare_cached(
                "SELECT seq FROM journal WHERE execution_id = ?1 AND stream = 'activity'
                   AND event IN (SELECT value FROM json_each(?2)) ORDER BY seq LIMIT 1",
            )?
            .query_row(params![id.to_string(), list], |r| r.get::<_, i64>(0))
            .optional()?
            .and_then(|s| u64::try_from(s).ok()))
        })
    }

    /// Exporter `name`'s bookmark, if it has one.
    pub fn export_cursor(&self, name: &str) -> Result<Option<ExportCursor>, StoreError> {
        self.with(|c| {
            use rusqlite::OptionalExtension;
            Ok(c.prepare_cached(
                "SELECT target, seq, updated_at, last_error, error_at FROM export_cursors WHERE name = ?1",
            )?
            .query_row([name], |r| {
                Ok(ExportCursor {
                    target: r.get(0)?,
                    seq: u64::try_from(r.get::<_, i64>(1)?).unwrap_or(0),
                    updated_at: r.get(2)?,
                    last_error: r.get(3)?,
                    error_at: r.get(4)?,
                })
            })
            .optional()?)
        })
    }

    /// Every lifecycle step and note of one execution, oldest first: one entry per row, except
    /// that a folded row (a read-only call's `accepted`, `authorized` and `dispatched` in one
    /// row) is one entry per step it records, each with the row's sequence number and hash.
    /// Every reader of an execution's history (the Activity view, the incident record, task
    /// status, the exporter) reads it here, so none of them has to know about folding.
    pub fn timeline(&self, id: ExecutionId) -> Result<Vec<JournalEntry>, StoreError> {
        self.with(|c| {
            Self::steps(
                c,
                "SELECT seq, body, row_hash FROM journal WHERE execution_id = ?1 ORDER BY seq",
                [id.to_string()],
            )
        })
    }

    /// [`Self::entries`], each folded row unfolded into its steps.
    fn steps(c: &Connection, sql: &str, params: impl rusqlite::Params) -> Result<Vec<JournalEntry>, StoreError> {
        Ok(Self::entries(c, sql, params)?.into_iter().flat_map(JournalEntry::unfold).collect())
    }

    /// The side-effecting execution one protocol request reached: the newest `accepted` or
    /// `retry_received` row whose correlation names this MCP session and JSON-RPC id, and the
    /// retry decision taken for it (`new_execution` for the call that created it). One index probe
    /// however long the journal, so an agent naming requests that never were costs a lookup each,
    /// never a scan. A read is not found: it is not resumed but read again (its rows are written
    /// once it has been answered).
    pub fn execution_for_request(
        &self,
        mcp_session_id: &str,
        jsonrpc_id: &Value,
    ) -> Result<Option<(ExecutionId, String)>, StoreError> {
        // As the id is journaled: integers beyond 2^53 as strings (`with_unsafe_integers_as_strings`).
        let (id, journaled) = match jsonrpc_id {
            Value::Number(n) => match n.as_i64() {
                Some(i) if i.unsigned_abs() < 1 << 53 => (rusqlite::types::Value::Integer(i), Value::from(i)),
                _ => (rusqlite::types::Value::Text(n.to_string()), Value::String(n.to_string())),
            },
            Value::String(s) => (rusqlite::types::Value::Text(s.clone()), Value::String(s.clone())),
            _ => return Ok(None),
        };
        let found = self.with(|c| {
            c.prepare_cached(REQUEST_EXECUTION)?
                .query_row(params![mcp_session_id, id], |r| {
                    Ok((
                        r.get::<_, String>(0)?,
                        r.get::<_, String>(1)?,
                        r.get::<_, Option<String>>(2)?,
                        r.get::<_, Option<String>>(3)?,
                    ))
                })
                .optional()
                .map_err(StoreError::from)
        })?;
        let Some((execution, event, decision, correlation)) = found else { return Ok(None) };
        // The row itself must name the request: the index is not hash-chained.
        let correlation: Value = correlation.and_then(|c| serde_json::from_str(&c).ok()).unwrap_or(Value::Null);
        if correlation["mcp_session_id"].as_str() != Some(mcp_session_id) || correlation["jsonrpc_id"] != journaled {
            return Err(StoreError::Corrupt(format!(
                "the journal's request index names execution {execution} for a request its row does not carry \
                 (the database was edited outside Postern): with the gateway stopped, rebuild the index \
                 (`REINDEX journal_request_lookup` in sqlite3), and run `postern audit verify` for the rows"
            )));
        }
        let execution: ExecutionId =
            execution.parse().map_err(|e| StoreError::Corrupt(format!("journal execution id {execution:?}: {e}")))?;
        let decision = match (event.as_str(), decision) {
            ("accepted", _) => "new_execution".to_owned(),
            (_, Some(d)) => d,
            (_, None) => "retry".to_owned(),
        };
        Ok(Some((execution, decision)))
    }

    /// A remembered MCP session's `initialize` parameters (JSON).
    pub fn mcp_session(&self, id: &str) -> Result<Option<String>, StoreError> {
        self.with(|c| {
            c.prepare_cached("SELECT initialize FROM mcp_sessions WHERE id = ?1")?
                .query_row([id], |r| r.get(0))
                .optional()
                .map_err(StoreError::from)
        })
    }

    /// The agent token a remembered MCP session belongs to (`Some(None)`: remembered, not bound).
    pub fn mcp_session_agent(&self, id: &str) -> Result<Option<Option<String>>, StoreError> {
        self.with(|c| {
            c.prepare_cached("SELECT agent FROM mcp_sessions WHERE id = ?1")?
                .query_row([id], |r| r.get(0))
                .optional()
                .map_err(StoreError::from)
        })
    }

    /// Execution `id`'s state as its last hash-chained journal row says (not the `executions`
    /// projection): for decisions that destroy evidence, such as removing an SSH marker.
    pub fn journal_state(&self, id: ExecutionId) -> Result<Option<String>, StoreError> {
        self.with(|c| {
            c.prepare_cached(LAST_STATE)?.query_row([id.to_string()], |r| r.get(0)).optional().map_err(StoreError::from)
        })
    }

    pub fn execution(&self, id: ExecutionId) -> Result<Option<ExecutionSummary>, StoreError> {
        self.with(|c| {
            c.prepare_cached(&format!("{EXECUTION_COLUMNS} WHERE id = ?1"))?
                .query_row([id.to_string()], execution_summary)
                .optional()
                .map_err(StoreError::from)
        })
    }

    /// One page of executions, newest first (by ID, which sorts by acceptance time), older than
    /// `query.before`, filtered. Walks the primary key: a page costs the same on a journal of a
    /// million executions as on a small one (unless a filter is very selective).
    pub fn executions_page(&self, query: &ExecutionQuery) -> Result<Vec<ExecutionSummary>, StoreError> {
        let limit = i64::try_from(query.limit.clamp(1, 1000)).unwrap_or(1000);
        self.with(|c| {
            let mut stmt = c.prepare_cached(&format!(
                "{EXECUTION_COLUMNS}
                 WHERE (?1 IS NULL OR id < ?1) AND (?2 IS NULL OR state = ?2) AND (?3 IS NULL OR tool = ?3)
                   AND (?4 IS NULL OR actor = ?4) AND (?5 IS NULL OR session_id = ?5)
                   AND (?6 IS NULL OR accepted_at >= ?6) AND (?7 IS NULL OR accepted_at < ?7)
                   AND (?8 IS NULL OR instr(id || ' ' || tool || ' ' || actor || ' ' || state, ?8) > 0)
                 ORDER BY id DESC LIMIT ?9"
            ))?;
            let rows = stmt.query_map(
                params![
                    query.before,
                    query.state.map(ExecutionState::as_str),
                    query.tool,
                    query.actor,
                    query.session,
                    query.from,
                    query.until,
                    query.text,
                    limit
                ],
                execution_summary,
            )?;
            rows.collect::<Result<_, _>>().map_err(StoreError::from)
        })
    }

    pub fn result(&self, id: ExecutionId) -> Result<Option<StoredResult>, StoreError> {
        self.with(|c| {
            c.prepare_cached(
                "SELECT execution_id, recorded_at, sha256, body, journal_seq FROM results WHERE execution_id = ?1",
            )?
            .query_row([id.to_string()], |r| {
                Ok(StoredResult {
                    execution_id: r.get(0)?,
                    recorded_at: r.get(1)?,
                    sha256: r.get(2)?,
                    body: r.get(3)?,
                    journal_seq: r.get(4)?,
                })
            })
            .optional()
            .map_err(StoreError::from)
        })
    }

    /// Agent runs, most recent first, with how many executions each made.
    pub fn sessions(&self) -> Result<Vec<SessionSummary>, StoreError> {
        self.with(|c| {
            let mut stmt = c.prepare_cached(&format!("{SESSION_COLUMNS} ORDER BY s.started_at DESC, s.id DESC"))?;
            let rows = stmt.query_map([], session_summary)?;
            rows.collect::<Result<_, _>>().map_err(StoreError::from)
        })
    }

    /// One agent run (by primary key).
    pub fn session(&self, id: SessionId) -> Result<Option<SessionSummary>, StoreError> {
        self.with(|c| {
            c.prepare_cached(&format!("{SESSION_COLUMNS} WHERE s.id = ?1"))?
                .query_row([id.to_string()], session_summary)
                .optional()
                .map_err(StoreError::from)
        })
    }

    /// Every credential's metadata, by name.
    pub fn credentials(&self) -> Result<Vec<crate::CredentialRecord>, StoreError> {
        self.with(|c| {
            let mut stmt = c.prepare_cached(
                "SELECT name, kind, spec, bindings, approve_every_use, created_at FROM credentials ORDER BY name",
            )?;
            let rows = stmt.query_map([], |r| {
                let json = |i: usize| -> rusqlite::Result<Value> {
                    let text: String = r.get(i)?;
                    serde_json::from_str(&text).map_err(|e| {
                        rusqlite::Error::FromSqlConversionFailure(i, rusqlite::types::Type::Text, Box::new(e))
                    })
                };
                Ok(crate::CredentialRecord {
                    name: r.get(0)?,
                    kind: r.get(1)?,
                    spec: json(2)?,
                    bindings: json(3)?,
                    approve_every_use: r.get(4)?,
                    created_at: r.get(5)?,
                })
            })?;
            rows.collect::<Result<_, _>>().map_err(StoreError::from)
        })
    }

    /// Every agent, active or revoked, by name.
    pub fn agents(&self) -> Result<Vec<AgentRecord>, StoreError> {
        self.with(|c| {
            let mut stmt =
                c.prepare_cached("SELECT name, token_sha256, created_at, revoked_at FROM agents ORDER BY name")?;
            let rows = stmt.query_map([], agent_from_row)?;
            rows.collect::<Result<_, _>>().map_err(StoreError::from)
        })
    }

    /// The active agent holding the token whose SHA-256 (hex) is given, if any.
    pub fn active_agent_by_token(&self, token_sha256: &str) -> Result<Option<AgentRecord>, StoreError> {
        match &self.remembered {
            Some(r) => r.agents.get_or_read(token_sha256, || self.read_agent_by_token(token_sha256), Option::is_some),
            None => self.read_agent_by_token(token_sha256),
        }
    }

    fn read_agent_by_token(&self, token_sha256: &str) -> Result<Option<AgentRecord>, StoreError> {
        self.with(|c| {
            c.prepare_cached(
                "SELECT name, token_sha256, created_at, revoked_at FROM agents
                 WHERE token_sha256 = ?1 AND revoked_at IS NULL",
            )?
            .query_row([token_sha256], agent_from_row)
            .optional()
            .map_err(StoreError::from)
        })
    }

    /// Whether the vault is locked (never locked yet means unlocked).
    /// A reviewer's standing decision on agent run `id`: `Some(true)` authorized,
    /// `Some(false)` revoked, `None` not decided yet. An ended run counts as revoked.
    pub fn session_standing(&self, id: SessionId) -> Result<Option<bool>, StoreError> {
        match &self.remembered {
            Some(r) => r.standings.get_or_read(&id, || self.read_session_standing(id), |_| true),
            None => self.read_session_standing(id),
        }
    }

    fn read_session_standing(&self, id: SessionId) -> Result<Option<bool>, StoreError> {
        self.with(|c| {
            let row: Option<(Option<String>, Option<i64>)> = c
                .prepare_cached(
                    "SELECT g.standing, s.ended_at FROM agent_sessions s
                     LEFT JOIN session_grants g ON g.session_id = s.id WHERE s.id = ?1",
                )?
                .query_row([id.to_string()], |r| Ok((r.get(0)?, r.get(1)?)))
                .optional()?;
            Ok(match row {
                None => None,
                Some((_, Some(_))) => Some(false),
                Some((standing, None)) => standing.map(|s| s == "authorized"),
            })
        })
    }

    /// The most recent side-effecting execution with this fingerprint, actor and intent scope —
    /// the prior a retry would be matched against (the admission's own lookup over the chain's
    /// `accepted` rows, read-only), e.g. to show a reviewer the original record. Never a
    /// read-only execution: a read is nobody's prior.
    pub fn prior_execution(
        &self,
        fingerprint: &str,
        actor: &str,
        intent_scope: &str,
    ) -> Result<Option<ExecutionId>, StoreError> {
        self.with(|c| {
            let id: Option<String> = c
                .prepare_cached(PRIOR_ACCEPTED)?
                .query_row(params![fingerprint, actor, intent_scope], |r| r.get(0))
                .optional()?;
            id.map(|id| id.parse().map_err(|e| StoreError::Corrupt(format!("journal execution_id {id:?}: {e}"))))
                .transpose()
        })
    }

    /// Whether `actor` is on the reviewer's "always allow" list.
    pub fn allowlisted(&self, actor: &str) -> Result<bool, StoreError> {
        self.with(|c| {
            Ok(c.prepare_cached("SELECT 1 FROM allowlist WHERE actor = ?1 AND removed_at IS NULL")?
                .query_row([actor], |_| Ok(()))
                .optional()?
                .is_some())
        })
    }

    /// The installation's id (the prefix of its keychain items), once a vault was opened on it.
    pub fn installation_id(&self) -> Result<Option<String>, StoreError> {
        self.with(|c| {
            use rusqlite::OptionalExtension;
            Ok(c.prepare_cached("SELECT id FROM installation")?.query_row([], |r| r.get(0)).optional()?)
        })
    }

    pub fn locked(&self) -> Result<bool, StoreError> {
        self.with(|c| {
            Ok(c.query_row("SELECT locked FROM vault_state", [], |r| r.get::<_, bool>(0)).optional()?.unwrap_or(false))
        })
    }

    /// Number of executions per state, for status displays.
    /// How many activity rows after journal row `seq` record one of `events` — reads only the
    /// rows appended since (the journal's primary key), however long the journal is.
    pub fn events_after(&self, seq: u64, events: &[&str]) -> Result<u64, StoreError> {
        self.stream_events_after(seq, "activity", events)
    }

    /// How many vault-stream rows after `seq` have one of `events` (an OAuth refresh that
    /// failed, for the app's notification).
    pub fn vault_events_after(&self, seq: u64, events: &[crate::VaultEvent]) -> Result<u64, StoreError> {
        let names: Vec<&str> = events.iter().map(|e| e.as_str()).collect();
        self.stream_events_after(seq, "vault", &names)
    }

    fn stream_events_after(&self, seq: u64, stream: &str, events: &[&str]) -> Result<u64, StoreError> {
        let seq = i64::try_from(seq).unwrap_or(i64::MAX);
        self.with(|c| {
            let mut stmt = c.prepare_cached("SELECT event FROM journal WHERE seq > ?1 AND stream = ?2 ORDER BY seq")?;
            let mut rows = stmt.query(rusqlite::params![seq, stream])?;
            let mut n = 0;
            while let Some(row) = rows.next()? {
                let event: String = row.get(0)?;
                if events.contains(&event.as_str()) {
                    n += 1;
                }
            }
            Ok(n)
        })
    }

    pub fn state_counts(&self) -> Result<Vec<(String, i64)>, StoreError> {
        self.with(|c| {
            let mut stmt = c.prepare_cached("SELECT state, count(*) FROM executions GROUP BY state ORDER BY state")?;
            let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
            rows.collect::<Result<_, _>>().map_err(StoreError::from)
        })
    }
}

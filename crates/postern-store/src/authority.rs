//! The state that grants authority — the lock, credentials and SSH hosts (bindings, approve every
//! use, pinned keys), agent tokens, session grants, the allowlist — re-derived from the journal,
//! so that a table edited behind the journal's back is noticed: by `audit verify`, by the gateway
//! when it starts (it refuses to), and while it runs (the writer watches for commits that are
//! not its own). `rederive` rewrites the tables from a verified chain.

use crate::{JournalRow, StoreError, event::Grant};
use rusqlite::{Connection, OptionalExtension, params};
use serde_json::Value;
use std::collections::BTreeMap;

/// The authority projections, as the journal says they are (or as the tables hold them).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AuthorityState {
    pub locked: bool,
    /// Name → `{kind, spec, bindings, approve_every_use}`.
    pub credentials: BTreeMap<String, Value>,
    /// Name → (token SHA-256, revoked).
    pub agents: BTreeMap<String, (String, bool)>,
    /// Agent run → `authorized` / `revoked`.
    pub session_grants: BTreeMap<String, String>,
    /// Actors allowlisted now.
    pub allowlist: BTreeMap<String, ()>,
    /// Journal rows that grant authority but could not be read (a field missing or of another
    /// type): each is a finding, never read with a default.
    pub malformed: Vec<AuthorityMismatch>,
}

/// One difference between a table and the journal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuthorityMismatch {
    pub table: &'static str,
    pub key: String,
    /// What the journal says (`absent` if it has no such row).
    pub journal: String,
    /// What the table holds (`absent` if it has no such row).
    pub table_value: String,
}

impl std::fmt::Display for AuthorityMismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "table `{}`, row {:?}: the journal says {}, the table holds {}",
            self.table, self.key, self.journal, self.table_value
        )
    }
}

fn credential(kind: &str, spec: &Value, bindings: &Value, approve_every_use: bool) -> Value {
    serde_json::json!({ "kind": kind, "spec": spec, "bindings": bindings, "approve_every_use": approve_every_use })
}

impl AuthorityState {
    /// Applies one journal row (rows that grant nothing are ignored). A row that grants
    /// something is read into its typed payload ([`Grant`]): one that lacks a field it needs, or
    /// has it of another type, changes nothing and says which field. Read with a default, a
    /// missing `approve_every_use` would turn approval off and a missing `name` would grant to
    /// the empty name.
    fn apply(&mut self, row: &JournalRow) -> Result<(), String> {
        let Some(grant) = Grant::read(row.event, &row.detail)? else {
            return Ok(());
        };
        match grant {
            Grant::VaultLocked => self.locked = true,
            Grant::VaultUnlocked => self.locked = false,
            Grant::CredentialAdded(c) => {
                let value = credential(&c.kind, &c.spec.0, &c.bindings.0, c.approve_every_use);
                self.credentials.insert(c.name, value);
            }
            Grant::CredentialRemoved(c) => {
                self.credentials.remove(&c.name);
            }
            Grant::ApproveEveryUseChanged(c) => {
                if let Some(held) = self.credentials.get_mut(&c.name) {
                    held["approve_every_use"] = Value::Bool(c.approve_every_use);
                }
            }
            Grant::SpecChanged(c) => {
                if let Some(held) = self.credentials.get_mut(&c.name) {
                    held["spec"] = c.spec.0;
                }
            }
            Grant::AgentAdded(a) => {
                self.agents.insert(a.name, (a.token_sha256, false));
            }
            Grant::AgentRevoked(a) => {
                if let Some(agent) = self.agents.get_mut(&a.name) {
                    agent.1 = true;
                }
            }
            Grant::SessionStanding(authorized) => {
                let session = row.session_id.ok_or_else(|| "it names no session".to_owned())?;
                let standing = if authorized { "authorized" } else { "revoked" };
                self.session_grants.insert(session.to_string(), standing.to_owned());
            }
            Grant::AllowlistAdded(a) => {
                self.allowlist.insert(a.actor, ());
            }
            Grant::AllowlistRemoved(a) => {
                self.allowlist.remove(&a.actor);
            }
        }
        Ok(())
    }

    /// The state the journal's vault and session streams build up, in order.
    pub fn from_journal(conn: &Connection) -> Result<AuthorityState, StoreError> {
        let mut state = AuthorityState::default();
        let mut stmt =
            // The partial index `journal_authority` (migration 6) holds exactly these rows.
            conn.prepare("SELECT seq, body FROM journal WHERE stream IN ('vault', 'session') ORDER BY seq")?;
        let mut rows = stmt.query([])?;
        while let Some(r) = rows.next()? {
            let (seq, body): (i64, String) = (r.get(0)?, r.get(1)?);
            // A row that does not read (an event its stream lacks) may have been a grant: a
            // finding, like a granting row with a field missing.
            let applied = match JournalRow::from_body(body.as_bytes()) {
                Ok(row) => state.apply(&row).map_err(|problem| (format!("row {seq} ({})", row.event), problem)),
                Err(e) => Err((format!("row {seq}"), format!("it does not read: {e}"))),
            };
            if let Err((key, journal)) = applied {
                state.malformed.push(AuthorityMismatch {
                    table: "journal",
                    key,
                    journal,
                    table_value: "not read".into(),
                });
            }
        }
        Ok(state)
    }

    /// The state the tables hold.
    pub fn from_tables(conn: &Connection) -> Result<AuthorityState, StoreError> {
        let json = |text: String| serde_json::from_str::<Value>(&text).unwrap_or(Value::String(text));
        let locked = conn
            .query_row("SELECT locked FROM vault_state WHERE singleton = 1", [], |r| r.get::<_, bool>(0))
            .optional()?
            .unwrap_or(false);
        let mut credentials = BTreeMap::new();
        let mut stmt = conn.prepare("SELECT name, kind, spec, bindings, approve_every_use FROM credentials")?;
        let mut rows = stmt.query([])?;
        while let Some(r) = rows.next()? {
            let kind: String = r.get(1)?;
            let c = credential(&kind, &json(r.get(2)?), &json(r.get(3)?), r.get(4)?);
            credentials.insert(r.get(0)?, c);
        }
        let mut agents = BTreeMap::new();
        let mut stmt = conn.prepare("SELECT name, token_sha256, revoked_at IS NOT NULL FROM agents")?;
        let mut rows = stmt.query([])?;
        while let Some(r) = rows.next()? {
            agents.insert(r.get(0)?, (r.get(1)?, r.get(2)?));
        }
        let mut session_grants = BTreeMap::new();
        let mut stmt = conn.prepare("SELECT session_id, standing FROM session_grants")?;
        let mut rows = stmt.query([])?;
        while let Some(r) = rows.next()? {
            session_grants.insert(r.get(0)?, r.get(1)?);
        }
        let mut allowlist = BTreeMap::new();
        let mut stmt = conn.prepare("SELECT actor FROM allowlist WHERE removed_at IS NULL")?;
        let mut rows = stmt.query([])?;
        while let Some(r) = rows.next()? {
            allowlist.insert(r.get(0)?, ());
        }
        Ok(AuthorityState { locked, credentials, agents, session_grants, allowlist, malformed: Vec::new() })
    }

    /// Every difference, naming the table and row (`self` is the journal's, `tables` the tables').
    pub fn differences(&self, tables: &AuthorityState) -> Vec<AuthorityMismatch> {
        let mut out = self.malformed.clone();
        if self.locked != tables.locked {
            out.push(AuthorityMismatch {
                table: "vault_state",
                key: "locked".into(),
                journal: self.locked.to_string(),
                table_value: tables.locked.to_string(),
            });
        }
        compare(&mut out, "credentials", &self.credentials, &tables.credentials, |v| v.to_string());
        compare(&mut out, "agents", &self.agents, &tables.agents, |(sha, revoked)| {
            format!("token sha256 {sha}{}", if *revoked { ", revoked" } else { "" })
        });
        compare(&mut out, "session_grants", &self.session_grants, &tables.session_grants, String::clone);
        compare(&mut out, "allowlist", &self.allowlist, &tables.allowlist, |()| "allowlisted".into());
        out
    }
}

fn compare<V: PartialEq>(
    out: &mut Vec<AuthorityMismatch>,
    table: &'static str,
    journal: &BTreeMap<String, V>,
    tables: &BTreeMap<String, V>,
    show: impl Fn(&V) -> String,
) {
    let shown = |v: Option<&V>| v.map_or_else(|| "absent".to_owned(), &show);
    for key in journal.keys().chain(tables.keys().filter(|k| !journal.contains_key(*k))) {
        let (j, t) = (journal.get(key), tables.get(key));
        if j != t {
            out.push(AuthorityMismatch { table, key: key.clone(), journal: shown(j), table_value: shown(t) });
        }
    }
}

/// The journal's authority state compared with the tables: every difference.
pub fn check(conn: &Connection) -> Result<Vec<AuthorityMismatch>, StoreError> {
    Ok(AuthorityState::from_journal(conn)?.differences(&AuthorityState::from_tables(conn)?))
}

/// What a retry decision reads of an execution — its state, fingerprint, actor, intent scope and
/// replay contract — compared with what the journal says (its last state row, its `accepted`
/// row): the `executions` rows grant a retry "return the stored result" or "a new execution", so
/// they are held to the chain like the authority tables. Every difference, and every execution
/// the journal accepted that the table lacks.
pub fn check_executions(conn: &Connection) -> Result<Vec<AuthorityMismatch>, StoreError> {
    let mut out = Vec::new();
    let mut stmt = conn.prepare(
        "SELECT e.id, e.state, e.fingerprint, e.actor, e.intent_scope, e.contract,
                (SELECT j.state FROM journal j WHERE j.execution_id = e.id AND j.state IS NOT NULL
                 ORDER BY j.seq DESC LIMIT 1),
                (SELECT j.body FROM journal j WHERE j.execution_id = e.id AND j.event = 'accepted'
                 ORDER BY j.seq LIMIT 1)
         FROM executions e",
    )?;
    let mut rows = stmt.query([])?;
    while let Some(r) = rows.next()? {
        let id: String = r.get(0)?;
        let table = ExecutionFacts {
            state: r.get(1)?,
            fingerprint: r.get(2)?,
            actor: r.get(3)?,
            intent_scope: r.get(4)?,
            contract: serde_json::from_str(&r.get::<_, String>(5)?).unwrap_or(Value::Null),
        };
        let last_state: Option<String> = r.get(6)?;
        let accepted: Option<String> = r.get(7)?;
        out.extend(compare_execution(&id, &table, last_state, accepted.as_deref()));
    }
    let mut missing = conn.prepare(
        "SELECT execution_id FROM journal WHERE event = 'accepted' AND execution_id IS NOT NULL
           AND execution_id NOT IN (SELECT id FROM executions)",
    )?;
    let mut rows = missing.query([])?;
    while let Some(r) = rows.next()? {
        let id: String = r.get(0)?;
        out.push(AuthorityMismatch {
            table: "executions",
            key: id,
            journal: "accepted".into(),
            table_value: "absent".into(),
        });
    }
    Ok(out)
}

/// The facts of one `executions` row a retry decision reads.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ExecutionFacts {
    pub(crate) state: String,
    pub(crate) fingerprint: String,
    pub(crate) actor: String,
    pub(crate) intent_scope: String,
    pub(crate) contract: Value,
}

/// Where the row `table` of execution `id` differs from its journal rows (its last state, its
/// `accepted` row's body).
pub(crate) fn compare_execution(
    id: &str,
    table: &ExecutionFacts,
    last_state: Option<String>,
    accepted: Option<&str>,
) -> Vec<AuthorityMismatch> {
    let mut out = Vec::new();
    let mut differ = |field: &str, journal: String, table_value: String| {
        if journal != table_value {
            out.push(AuthorityMismatch { table: "executions", key: format!("{id} {field}"), journal, table_value });
        }
    };
    differ("state", last_state.unwrap_or_else(|| "absent".into()), table.state.clone());
    let accepted = accepted.and_then(|body| JournalRow::from_body(body.as_bytes()).ok()).map(|row| row.detail);
    let text = |v: Option<&Value>| v.and_then(Value::as_str).map_or_else(|| "absent".to_owned(), str::to_owned);
    let a = accepted.as_ref();
    differ("fingerprint", text(a.map(|d| &d["fingerprint"])), table.fingerprint.clone());
    differ("actor", text(a.map(|d| &d["actor"])), table.actor.clone());
    differ("intent_scope", text(a.map(|d| &d["intent_scope"])), table.intent_scope.clone());
    let contract = a.map(|d| d["contract"].clone()).unwrap_or(Value::Null);
    if contract != table.contract {
        differ("contract", contract.to_string(), table.contract.to_string());
    }
    out
}

/// Rewrites the authority tables from the journal (the caller has verified the chain), in one
/// transaction; returns what it changed.
pub fn rederive(conn: &mut Connection) -> Result<Vec<AuthorityMismatch>, StoreError> {
    let tx = conn.transaction()?;
    let journal = AuthorityState::from_journal(&tx)?;
    // A row that cannot be read would be re-derived as if it were not there: refused instead.
    if let Some(row) = journal.malformed.first() {
        return Err(StoreError::Corrupt(format!("{} cannot be re-derived from: {}", row.key, row.journal)));
    }
    let changed = journal.differences(&AuthorityState::from_tables(&tx)?);
    if changed.is_empty() {
        return Ok(changed);
    }
    tx.execute(
        "INSERT INTO vault_state (singleton, locked, changed_at) VALUES (1, ?1, 0)
         ON CONFLICT (singleton) DO UPDATE SET locked = excluded.locked",
        [journal.locked],
    )?;
    tx.execute("DELETE FROM allowlist", [])?;
    for actor in journal.allowlist.keys() {
        tx.execute("INSERT INTO allowlist (actor, added_by, added_at) VALUES (?1, 'rederived', 0)", [actor])?;
    }
    tx.execute("DELETE FROM session_grants WHERE session_id NOT IN (SELECT id FROM agent_sessions)", [])?;
    let existing: Vec<String> =
        tx.prepare("SELECT session_id FROM session_grants")?.query_map([], |r| r.get(0))?.collect::<Result<_, _>>()?;
    for session in existing.iter().filter(|s| !journal.session_grants.contains_key(*s)) {
        tx.execute("DELETE FROM session_grants WHERE session_id = ?1", [session])?;
    }
    for (session, standing) in &journal.session_grants {
        tx.execute(
            "INSERT INTO session_grants (session_id, standing, decided_by, updated_at) VALUES (?1, ?2, 'rederived', 0)
             ON CONFLICT (session_id) DO UPDATE SET standing = excluded.standing",
            params![session, standing],
        )?;
    }
    // Upserts (keeping each row's `created_at`), and rows the journal does not have removed.
    let names = |sql: &str| -> Result<Vec<String>, StoreError> {
        Ok(tx.prepare(sql)?.query_map([], |r| r.get(0))?.collect::<Result<_, _>>()?)
    };
    for name in names("SELECT name FROM agents")?.iter().filter(|n| !journal.agents.contains_key(*n)) {
        tx.execute("DELETE FROM agents WHERE name = ?1", [name])?;
    }
    for (name, (sha, revoked)) in &journal.agents {
        tx.execute(
            "INSERT INTO agents (name, token_sha256, created_at, revoked_at) VALUES (?1, ?2, 0, ?3)
             ON CONFLICT (name) DO UPDATE SET token_sha256 = excluded.token_sha256,
                 revoked_at = CASE WHEN ?3 IS NULL THEN NULL ELSE coalesce(agents.revoked_at, 0) END",
            params![name, sha, revoked.then_some(0)],
        )?;
    }
    for name in names("SELECT name FROM credentials")?.iter().filter(|n| !journal.credentials.contains_key(*n)) {
        tx.execute("DELETE FROM credentials WHERE name = ?1", [name])?;
    }
    for (name, c) in &journal.credentials {
        tx.execute(
            "INSERT INTO credentials (name, kind, spec, bindings, approve_every_use, created_at)
             VALUES (?1, ?2, ?3, ?4, ?5, 0)
             ON CONFLICT (name) DO UPDATE SET kind = excluded.kind, spec = excluded.spec,
                 bindings = excluded.bindings, approve_every_use = excluded.approve_every_use",
            params![
                name,
                c["kind"].as_str().unwrap_or_default(),
                c["spec"].to_string(),
                c["bindings"].to_string(),
                c["approve_every_use"].as_bool().unwrap_or(false)
            ],
        )?;
    }
    tx.commit()?;
    Ok(changed)
}

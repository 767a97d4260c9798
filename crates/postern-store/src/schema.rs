//! Versioned migrations. A shipped migration is never edited: its SHA-256 is recorded in every
//! database it ran on, checked at every open, and pinned by a snapshot test.

use crate::{StoreError, Unusable};
use rusqlite::{Connection, OptionalExtension};
use sha2::{Digest, Sha256};

/// `PRAGMA application_id` of a Postern database: ASCII "Pstn".
pub const APPLICATION_ID: i32 = 0x5073_746e;

#[derive(Debug)]
pub struct Migration {
    pub version: u32,
    pub sql: &'static str,
}

pub const MIGRATIONS: &[Migration] = &[
    Migration { version: 1, sql: include_str!("migrations/0001_journal.sql") },
    Migration { version: 2, sql: include_str!("migrations/0002_vault.sql") },
    Migration { version: 3, sql: include_str!("migrations/0003_agents.sql") },
    Migration { version: 4, sql: include_str!("migrations/0004_approvals.sql") },
    Migration { version: 5, sql: include_str!("migrations/0005_mcp_sessions.sql") },
    Migration { version: 6, sql: include_str!("migrations/0006_authority_index.sql") },
    Migration { version: 7, sql: include_str!("migrations/0007_retry_lookup.sql") },
    Migration { version: 8, sql: include_str!("migrations/0008_projection_lookup_dropped.sql") },
    Migration { version: 9, sql: include_str!("migrations/0009_effect_lookup.sql") },
    Migration { version: 10, sql: include_str!("migrations/0010_merkle_tree.sql") },
    Migration { version: 11, sql: include_str!("migrations/0011_export_cursors.sql") },
    Migration { version: 12, sql: include_str!("migrations/0012_retry_lookup_without_reads.sql") },
    Migration { version: 13, sql: include_str!("migrations/0013_request_lookup.sql") },
];

/// Highest schema version this build understands.
pub fn supported_version() -> u32 {
    MIGRATIONS.last().map_or(0, |m| m.version)
}

pub fn checksum(sql: &str) -> String {
    hex::encode(Sha256::digest(sql.as_bytes()))
}

/// What kind of file is at the other end of a connection, without changing it.
pub fn inspect(conn: &Connection) -> Result<(i32, u32, bool), rusqlite::Error> {
    let app: i32 = conn.query_row("PRAGMA application_id", [], |r| r.get(0))?;
    let version: u32 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    let has_tables: bool =
        conn.query_row("SELECT EXISTS (SELECT 1 FROM sqlite_schema WHERE type = 'table')", [], |r| r.get(0))?;
    Ok((app, version, has_tables))
}

/// Checks the file is a Postern database this build can read (`allow_new` accepts a database
/// with no tables yet, which `migrate` will initialise).
pub fn check_identity(conn: &Connection, path: &std::path::Path, allow_new: bool) -> Result<u32, StoreError> {
    let unusable = |problem| StoreError::Unusable { path: path.to_owned(), problem };
    let (app, version, has_tables) = inspect(conn).map_err(|e| match e.sqlite_error_code() {
        Some(rusqlite::ErrorCode::NotADatabase) => unusable(Unusable::NotSqlite),
        _ => StoreError::Sqlite(e),
    })?;
    if app == 0 && !has_tables && allow_new {
        return Ok(0);
    }
    if app != APPLICATION_ID {
        return Err(unusable(if app == 0 && !has_tables {
            Unusable::NotInitialised
        } else {
            Unusable::NotPostern { application_id: app }
        }));
    }
    if version > supported_version() {
        return Err(unusable(Unusable::NewerSchema { found: version, supported: supported_version() }));
    }
    Ok(version)
}

/// Applies pending migrations in one transaction and checks the recorded checksums of the
/// ones already applied.
pub fn migrate(conn: &mut Connection, path: &std::path::Path, applied_at_ms: i64) -> Result<(), StoreError> {
    let current = check_identity(conn, path, true)?;
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    for m in MIGRATIONS {
        if m.version <= current {
            let recorded: Option<String> = tx
                .query_row("SELECT sha256 FROM schema_migrations WHERE version = ?1", [m.version], |r| r.get(0))
                .optional()?;
            if recorded.as_deref() != Some(checksum(m.sql).as_str()) {
                return Err(StoreError::MigrationMismatch { version: m.version });
            }
            continue;
        }
        tx.execute_batch(m.sql)?;
        tx.execute(
            "INSERT INTO schema_migrations (version, sha256, applied_at) VALUES (?1, ?2, ?3)",
            rusqlite::params![m.version, checksum(m.sql), applied_at_ms],
        )?;
        tx.pragma_update(None, "user_version", m.version)?;
    }
    tx.pragma_update(None, "application_id", APPLICATION_ID)?;
    tx.commit()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Never edit a shipped migration: add a new one. If this snapshot changes, a migration
    /// that may already exist in users' databases was edited.
    #[test]
    fn shipped_migrations_are_never_edited() {
        let pinned: Vec<String> = MIGRATIONS.iter().map(|m| format!("{} {}", m.version, checksum(m.sql))).collect();
        insta::assert_snapshot!(pinned.join("\n"));
    }

    /// The steps of SQLite's plan for `sql`.
    fn plan(sql: &str, params: impl rusqlite::Params) -> Vec<String> {
        let mut conn = Connection::open_in_memory().expect("memory");
        migrate(&mut conn, std::path::Path::new(":memory:"), 0).expect("migrate");
        conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
            .expect("plan")
            .query_map(params, |r| r.get::<_, String>(3))
            .expect("rows")
            .collect::<Result<_, _>>()
            .expect("plan rows")
    }

    /// A retry's lookup reads the retry index, never the whole journal: its query repeats the
    /// index's condition (SQLite uses a partial index only for a query that implies it).
    #[test]
    fn the_retry_lookup_reads_its_index() {
        let plan = plan(crate::view::PRIOR_ACCEPTED, rusqlite::params!["f", "a", "s"]);
        assert!(plan.iter().any(|step| step.contains("USING INDEX journal_retry_lookup")), "{plan:?}");
    }

    /// A resumed stream's lookup of the request it names reads the request index, never the
    /// journal's rows one by one: an agent can name any request, so a scan would be a way to keep
    /// the gateway busy for nothing (it scanned 100,000 rows per look until schema v13).
    #[test]
    fn the_request_lookup_reads_its_index() {
        let plan = plan(crate::view::REQUEST_EXECUTION, rusqlite::params!["mcp-1", 7]);
        // Both the session and the id from the index, and the newest first in its order.
        let both = "USING INDEX journal_request_lookup (<expr>=? AND <expr>=?)";
        assert!(plan.iter().any(|step| step.contains(both)), "{plan:?}");
        assert!(!plan.iter().any(|step| step.starts_with("SCAN") || step.contains("TEMP B-TREE")), "{plan:?}");
    }

    /// The earlier execution of the same effect (named on a new one's `accepted` row) is found
    /// through the effect index: the effect is the agent's to choose, as a request id is.
    #[test]
    fn the_effect_lookup_reads_its_index() {
        let plan = plan(crate::view::EARLIER_EFFECT, rusqlite::params!["f", "a", "s"]);
        assert!(plan.iter().any(|step| step.contains("USING INDEX journal_effect_lookup")), "{plan:?}");
        assert!(!plan.iter().any(|step| step.starts_with("SCAN journal")), "{plan:?}");
    }

    /// SQLite's update hook, through which the writer learns a commit may have changed what
    /// grants authority (`epoch`), reports nothing of a table `WITHOUT ROWID`: only a per-call
    /// table, which no remembered lookup reads, may be one.
    #[test]
    fn every_table_the_authority_epoch_watches_reports_its_changes() {
        let mut conn = Connection::open_in_memory().expect("memory");
        migrate(&mut conn, std::path::Path::new(":memory:"), 0).expect("migrate");
        let without_rowid: Vec<String> = conn
            .prepare("SELECT name FROM sqlite_schema WHERE type = 'table' AND sql LIKE '%WITHOUT ROWID%'")
            .expect("tables")
            .query_map([], |r| r.get(0))
            .expect("rows")
            .collect::<Result<_, _>>()
            .expect("names");
        for table in &without_rowid {
            assert!(crate::epoch::PER_CALL_TABLES.contains(&table.as_str()), "{table} is WITHOUT ROWID");
        }
        // The per-call tables exist (a renamed one would silently start moving the epoch), and so
        // do the vault's (a renamed one would silently stop moving the vault epoch).
        for table in crate::epoch::PER_CALL_TABLES.iter().chain(crate::epoch::VAULT_TABLES) {
            let found: bool = conn
                .query_row(
                    "SELECT EXISTS (SELECT 1 FROM sqlite_schema WHERE type = 'table' AND name = ?1)",
                    [table],
                    |r| r.get(0),
                )
                .expect("lookup");
            assert!(found, "{table}");
        }
    }

    #[test]
    fn versions_are_contiguous_from_one() {
        for (i, m) in MIGRATIONS.iter().enumerate() {
            assert_eq!(m.version as usize, i + 1);
        }
    }
}

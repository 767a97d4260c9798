//! What can go wrong with the durable record, each with the machine-readable code the CLI's
//! JSON, MCP error results and the app use.

use crate::authority;
use postern_core::{ErrorCode, ExecutionId, IllegalTransition, SessionId};
use std::path::PathBuf;

/// Why a file cannot be used as a Postern database. Nothing is written to such a file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unusable {
    #[error("no such file")]
    Missing,
    #[error("the file is empty (0 bytes), not a Postern database")]
    Empty,
    #[error("not an SQLite database")]
    NotSqlite,
    #[error("an SQLite database, but not a Postern one (application_id {application_id:#x})")]
    NotPostern { application_id: i32 },
    #[error("an SQLite database that Postern has not initialised")]
    NotInitialised,
    #[error("schema version {found} is newer than this postern supports ({supported}); upgrade postern")]
    NewerSchema { found: u32, supported: u32 },
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{}: {problem}", path.display())]
    Unusable { path: PathBuf, problem: Unusable },
    #[error("{}", describe_sqlite(.0))]
    Sqlite(#[from] rusqlite::Error),
    #[error("cannot create data directory {}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    #[error(transparent)]
    IllegalTransition(#[from] IllegalTransition),
    #[error("no execution {0}")]
    UnknownExecution(ExecutionId),
    #[error("execution {0} already exists")]
    DuplicateExecution(ExecutionId),
    #[error("no session {0}")]
    UnknownSession(SessionId),
    #[error("agent run {0} was revoked; it is never authorized again (the agent must start a new run)")]
    SessionRevoked(SessionId),
    #[error("{0} is not on the allowlist")]
    NotAllowlisted(String),
    #[error("session {0} already exists")]
    DuplicateSession(SessionId),
    #[error("session {0} has already ended")]
    SessionEnded(SessionId),
    #[error("a credential named {0:?} already exists; remove it first")]
    DuplicateCredential(String),
    #[error("no credential named {0:?}")]
    UnknownCredential(String),
    #[error("an agent named {0:?} already exists (names are never reused, even after revocation)")]
    DuplicateAgent(String),
    #[error("no active agent named {0:?} (see `postern agents list`)")]
    UnknownAgent(String),
    #[error("journal row could not be encoded: {0}")]
    Encode(#[from] postern_core::CanonicalError),
    #[error("stored data is corrupt: {0}")]
    Corrupt(String),
    #[error(
        "migration {version} recorded in this database differs from the one shipped with postern; \
         the schema history was altered"
    )]
    MigrationMismatch { version: u32 },
    #[error("the journal writer has stopped; restart postern")]
    WriterStopped,
    #[error(
        "{} is in use by another postern process{}; only one process may write a journal (stop it, \
         or run read-only commands such as `postern activity` or `postern audit verify`)",
        path.display(),
        holder.as_deref().map(|h| format!(" ({h})")).unwrap_or_default()
    )]
    InUse { path: PathBuf, holder: Option<String> },
    #[error(
        "the tables that grant authority were changed behind the journal's back: {}. Postern trusts \
         only the journal: see `postern audit verify`, then `postern audit rederive` rebuilds the \
         tables from the verified journal (a journal row that cannot be read is not rebuilt from: \
         restore the database from a backup)",
        .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
    )]
    AuthorityTampered(Vec<authority::AuthorityMismatch>),
}

fn sqlite_code(e: &rusqlite::Error) -> Option<rusqlite::ErrorCode> {
    e.sqlite_error_code()
}

impl StoreError {
    /// The journal cannot be written right now (a full disk, an I/O error, a read-only file):
    /// a condition of the machine that may pass, not a problem with the request.
    pub fn is_unwritable(&self) -> bool {
        matches!(
            self,
            StoreError::Sqlite(e) if matches!(
                sqlite_code(e),
                Some(
                    rusqlite::ErrorCode::DiskFull
                        | rusqlite::ErrorCode::SystemIoFailure
                        | rusqlite::ErrorCode::ReadOnly
                        | rusqlite::ErrorCode::CannotOpen
                )
            )
        )
    }
}

/// An SQLite failure in words a user can act on: the conditions that stop the journal from being
/// written (a full disk, an I/O error, a read-only file) say so and what still works.
fn describe_sqlite(e: &rusqlite::Error) -> String {
    let consequence = "Postern sends nothing it cannot journal, so side-effecting calls are refused until it \
                       can write again; reads, execution_status and the journals keep working";
    match sqlite_code(e) {
        Some(rusqlite::ErrorCode::DiskFull) => {
            format!(
                "the journal cannot be written: the disk holding the data directory is full ({e}). {consequence}; free some space"
            )
        }
        Some(rusqlite::ErrorCode::SystemIoFailure) => {
            format!(
                "the journal cannot be written: the disk reported an I/O error ({e}). {consequence}; check the disk"
            )
        }
        Some(rusqlite::ErrorCode::ReadOnly | rusqlite::ErrorCode::CannotOpen) => format!(
            "the journal cannot be written: the database file is read-only or cannot be opened ({e}). {consequence}; \
             check the data directory's permissions"
        ),
        _ => format!("database error: {e}"),
    }
}

impl ErrorCode for StoreError {
    fn code(&self) -> &'static str {
        match self {
            StoreError::Unusable { problem, .. } => match problem {
                Unusable::Missing => "database_missing",
                Unusable::Empty => "database_empty",
                Unusable::NotSqlite => "not_sqlite",
                Unusable::NotPostern { .. } | Unusable::NotInitialised => "not_postern_database",
                Unusable::NewerSchema { .. } => "newer_schema",
            },
            StoreError::Sqlite(e) => match sqlite_code(e) {
                Some(rusqlite::ErrorCode::DiskFull) => "journal_full",
                Some(rusqlite::ErrorCode::SystemIoFailure) => "journal_io_error",
                Some(rusqlite::ErrorCode::ReadOnly | rusqlite::ErrorCode::CannotOpen) => "journal_unwritable",
                _ => "database_error",
            },
            StoreError::Io { .. } => "io_error",
            StoreError::IllegalTransition(e) => e.code(),
            StoreError::UnknownExecution(_) => "unknown_execution",
            StoreError::DuplicateExecution(_) => "duplicate_execution",
            StoreError::UnknownSession(_) => "unknown_session",
            StoreError::SessionRevoked(_) => "session_revoked",
            StoreError::NotAllowlisted(_) => "not_allowlisted",
            StoreError::DuplicateSession(_) => "duplicate_session",
            StoreError::SessionEnded(_) => "session_ended",
            StoreError::DuplicateCredential(_) => "duplicate_credential",
            StoreError::UnknownCredential(_) => "unknown_credential",
            StoreError::DuplicateAgent(_) => "duplicate_agent",
            StoreError::UnknownAgent(_) => "unknown_agent",
            StoreError::Encode(e) => e.code(),
            StoreError::Corrupt(_) => "corrupt_data",
            StoreError::MigrationMismatch { .. } => "migration_mismatch",
            StoreError::WriterStopped => "writer_stopped",
            StoreError::InUse { .. } => "journal_in_use",
            StoreError::AuthorityTampered(_) => "authority_tampered",
        }
    }
}

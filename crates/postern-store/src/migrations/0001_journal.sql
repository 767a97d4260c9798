-- Postern schema v1. Never edit this file once shipped; add 0002_*.sql instead.

CREATE TABLE schema_migrations (
    version    INTEGER PRIMARY KEY,
    sha256     TEXT NOT NULL,
    applied_at INTEGER NOT NULL
) STRICT;

-- The Activity and Sessions journals: two streams of one append-only, hash-chained table.
-- `body` is the RFC 8785 canonical JSON of the row, {"head":{...},"payload":{...}}: `head` holds
-- the row's scalar facts (seq, time, stream, event, ids, state, result digest) and, sorting first,
-- can be read without parsing the payload. row_hash = SHA-256(previous row_hash || body), the
-- first row chaining from 32 zero bytes.
-- Every other column is generated from `body`, so there is no second copy that could disagree.
CREATE TABLE journal (
    seq          INTEGER PRIMARY KEY,
    body         TEXT NOT NULL,
    row_hash     BLOB NOT NULL CHECK (length(row_hash) = 32),
    stream       TEXT GENERATED ALWAYS AS (json_extract(body, '$.head.stream')) VIRTUAL,
    event        TEXT GENERATED ALWAYS AS (json_extract(body, '$.head.event')) VIRTUAL,
    at           INTEGER GENERATED ALWAYS AS (json_extract(body, '$.head.at')) VIRTUAL,
    execution_id TEXT GENERATED ALWAYS AS (json_extract(body, '$.head.execution_id')) VIRTUAL,
    session_id   TEXT GENERATED ALWAYS AS (json_extract(body, '$.head.session_id')) VIRTUAL,
    state        TEXT GENERATED ALWAYS AS (json_extract(body, '$.head.state')) VIRTUAL
) STRICT;

CREATE INDEX journal_by_execution ON journal (execution_id, seq) WHERE execution_id IS NOT NULL;

CREATE TRIGGER journal_refuses_update BEFORE UPDATE ON journal
BEGIN SELECT RAISE(ABORT, 'postern: the journal is append-only; UPDATE refused'); END;
CREATE TRIGGER journal_refuses_delete BEFORE DELETE ON journal
BEGIN SELECT RAISE(ABORT, 'postern: the journal is append-only; DELETE refused'); END;

CREATE VIEW activity_journal AS
    SELECT seq, at, event, execution_id, session_id, state, body, row_hash FROM journal WHERE stream = 'activity';
CREATE VIEW sessions_journal AS
    SELECT seq, at, event, session_id, body, row_hash FROM journal WHERE stream = 'session';

-- Current state of every execution: a projection of the journal, used for retry lookup.
-- `audit verify` checks it against the journal.
CREATE TABLE executions (
    id                  TEXT PRIMARY KEY,
    fingerprint         TEXT NOT NULL,
    actor               TEXT NOT NULL,
    intent_scope        TEXT NOT NULL,
    session_id          TEXT,
    tool                TEXT NOT NULL,
    channel             TEXT NOT NULL,
    state               TEXT NOT NULL,
    accepted_at         INTEGER NOT NULL,
    updated_at          INTEGER NOT NULL,
    first_dispatched_at INTEGER,
    contract            TEXT NOT NULL,
    record              TEXT NOT NULL
) STRICT;

CREATE INDEX executions_retry_lookup ON executions (fingerprint, actor, intent_scope, accepted_at DESC);
CREATE INDEX executions_by_session ON executions (session_id) WHERE session_id IS NOT NULL;

-- Results of completed executions, returned to retries. Append-only; each result's SHA-256 is
-- also in the journal's `completed` row, whose seq is `journal_seq`.
CREATE TABLE results (
    execution_id TEXT PRIMARY KEY REFERENCES executions (id),
    journal_seq  INTEGER NOT NULL,
    recorded_at  INTEGER NOT NULL,
    sha256       TEXT NOT NULL,
    body         BLOB NOT NULL
) STRICT;

CREATE TRIGGER results_refuse_update BEFORE UPDATE ON results
BEGIN SELECT RAISE(ABORT, 'postern: stored results are immutable; UPDATE refused'); END;
CREATE TRIGGER results_refuse_delete BEFORE DELETE ON results
BEGIN SELECT RAISE(ABORT, 'postern: stored results are immutable; DELETE refused'); END;

-- Agent runs: a projection of the session stream.
CREATE TABLE agent_sessions (
    id            TEXT PRIMARY KEY,
    actor         TEXT NOT NULL,
    pid           INTEGER,
    process_start INTEGER,
    transport     TEXT NOT NULL,
    client        TEXT,
    started_at    INTEGER NOT NULL,
    ended_at      INTEGER,
    end_reason    TEXT
) STRICT;

-- Journal heads recorded for off-machine keeping (signatures arrive with the vault).
CREATE TABLE checkpoints (
    journal_size INTEGER NOT NULL,
    head_hash    TEXT NOT NULL,
    created_at   INTEGER NOT NULL,
    signature    TEXT
) STRICT;

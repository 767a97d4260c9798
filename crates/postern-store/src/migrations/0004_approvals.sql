-- Postern schema v4: the approval ladder's standing state (design §6). A session grant says a
-- reviewer allowed (or revoked) one agent run; the allowlist holds actors a reviewer chose to
-- "always allow" — the actor names the executable's SHA-256, so a changed binary is a different
-- actor and is asked again. Both are projections of session-stream journal rows. Never edit
-- this file once shipped; add 0005_*.sql instead.
CREATE TABLE session_grants (
    session_id TEXT PRIMARY KEY REFERENCES agent_sessions (id),
    standing   TEXT NOT NULL CHECK (standing IN ('authorized', 'revoked')),
    decided_by TEXT NOT NULL,
    updated_at INTEGER NOT NULL
) STRICT;

CREATE TABLE allowlist (
    actor      TEXT PRIMARY KEY,
    added_by   TEXT NOT NULL,
    added_at   INTEGER NOT NULL,
    removed_at INTEGER
) STRICT;

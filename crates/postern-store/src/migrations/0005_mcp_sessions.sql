-- Postern schema v5: Streamable HTTP sessions outlive a gateway restart. Each session's
-- `initialize` parameters (client name and version, protocol version, capabilities; never a
-- secret) are kept so that a client whose gateway restarted carries on in the same MCP session,
-- and can resume a broken stream there. Transport state, not evidence: not journaled; sessions
-- are forgotten when the client ends them, and pruned after a week. Never edit this file once
-- shipped; add 0006_*.sql instead.
CREATE TABLE mcp_sessions (
    id          TEXT PRIMARY KEY,
    initialize  TEXT NOT NULL,
    created_at  INTEGER NOT NULL
) STRICT;

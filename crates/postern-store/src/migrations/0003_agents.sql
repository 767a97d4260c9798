-- Postern schema v3: agents that use Streamable HTTP authenticate with a Postern-issued bearer
-- token. Only the token's SHA-256 is stored (tokens are 256 random bits, so a plain hash is
-- not a guessing oracle). Never edit this file once shipped; add 0004_*.sql instead.
CREATE TABLE agents (
    name         TEXT PRIMARY KEY,
    token_sha256 TEXT NOT NULL UNIQUE,
    created_at   INTEGER NOT NULL,
    revoked_at   INTEGER
) STRICT;

-- Postern schema v7: retry decisions read the chain, not a projection; MCP sessions have an owner. The fingerprint of every
-- `accepted` row is a generated column of the journal, indexed, so the retry lookup finds the
-- prior execution by its hash-chained rows (its actor, intent scope and contract from its
-- `accepted` row, its state from its last state row); an `executions` row edited behind the
-- journal's back cannot hide a prior or change what a retry is decided from. Never edit this
-- file once shipped; add 0008_*.sql instead.
ALTER TABLE journal ADD COLUMN fingerprint TEXT
    GENERATED ALWAYS AS (json_extract(body, '$.payload.fingerprint')) VIRTUAL;
CREATE INDEX journal_retry_lookup ON journal (fingerprint, seq) WHERE event = 'accepted';

-- An MCP session belongs to the agent token that opened it: no other token may use it (and so,
-- for one, mark the first agent's result delivered). Transport state, like the session.
ALTER TABLE mcp_sessions ADD COLUMN agent TEXT;

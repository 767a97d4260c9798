-- Postern schema v6: the rows that grant authority (the vault and session streams) indexed, so
-- that re-deriving the lock, credentials, tokens, grants and allowlist from the journal — at
-- every start, and whenever another process is seen writing — reads those rows only, not the
-- whole journal. Never edit this file once shipped; add 0007_*.sql instead.
CREATE INDEX journal_authority ON journal (seq) WHERE stream IN ('vault', 'session');

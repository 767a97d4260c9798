-- Postern schema v9: the effect fingerprint (a record's fingerprint without its intent scope)
-- of every side-effecting `accepted` row is a generated column of the journal, indexed, so a new
-- execution can name an earlier one of the same effect in another run (a restarted agent's
-- repeat) for the reviewer and the incident record. It never decides a retry. Read-only
-- executions carry none and cost the index nothing. Never edit this file once shipped; add
-- 0010_*.sql instead.
ALTER TABLE journal ADD COLUMN effect_fingerprint TEXT
    GENERATED ALWAYS AS (json_extract(body, '$.payload.effect_fingerprint')) VIRTUAL;
CREATE INDEX journal_effect_lookup ON journal (effect_fingerprint, seq)
    WHERE event = 'accepted' AND effect_fingerprint IS NOT NULL;

-- Postern schema v8: since v7 retry lookups read the chain (`journal_retry_lookup`), and the
-- `executions` projection's fingerprint index served nothing else; each accepted execution
-- cost it one more randomly placed B-tree page per commit. The projection is still kept (and
-- checked by `audit verify`) for listings by id and session. Never edit this file once shipped;
-- add 0009_*.sql instead.
DROP INDEX executions_retry_lookup;

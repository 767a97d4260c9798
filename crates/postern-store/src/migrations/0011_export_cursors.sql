-- Postern schema v11: how far each exporter of the journal (OpenTelemetry) has sent it. Neither
-- evidence nor authority — an exporter's bookmark — so an exporter that was cut off (an endpoint
-- away, a restart) resumes from the journal, and the team's view has no gap; `postern status`
-- shows its lag and last error. Never edit this file once shipped; add 0012_*.sql instead.
CREATE TABLE export_cursors (
    name       TEXT PRIMARY KEY,
    target     TEXT NOT NULL,
    seq        INTEGER NOT NULL CHECK (seq >= 0),
    updated_at INTEGER NOT NULL,
    last_error TEXT,
    error_at   INTEGER
) STRICT;

-- Postern schema v13: a broken stream's resumption finds the request it names (its MCP session
-- and JSON-RPC id, from the `correlation` of an `accepted` or `retry_received` row) through an
-- index. Until v12 it scanned the newest 100,000 rows, parsing each body, every ~250 ms for up to
-- 10 s: any agent could keep a core and every reader of the journal busy with one GET naming a
-- request that never was. The index is on expressions of the hash-chained body (no new column:
-- adding one to this STRICT table would first check every row's declared types as well). Like
-- every index on the body, building it needs each body to be JSON; `postern audit verify`,
-- which never migrates, names a row that is not. Rows without an MCP session (stdio, protocol
-- 2026-07-28) cost it nothing, and so do reads: a read is not resumed but read again (its rows
-- are written once it has been answered, and one that waits for nobody opens its stream with
-- its answer, in one write), and indexing them cost every read over a session ~3 KiB more
-- written (measured). Building the index reads every row once (0.6-0.7 s for a million rows,
-- measured). Never edit this file once shipped; add 0014_*.sql instead.
CREATE INDEX journal_request_lookup ON journal (
    json_extract(body, '$.payload.correlation.mcp_session_id'),
    json_extract(body, '$.payload.correlation.jsonrpc_id'),
    seq
) WHERE json_extract(body, '$.payload.correlation.mcp_session_id') IS NOT NULL
    AND event IN ('accepted', 'retry_received')
    AND json_extract(body, '$.payload.contract.class') IS NOT 'read_only';

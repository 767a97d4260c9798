-- Postern schema v10: the journal's RFC 6962 Merkle tree, kept beside the hash chain so that any
-- two checkpoints have a compact consistency proof and any row an inclusion proof. Leaf i is
-- row i + 1: SHA-256(0x00 || body). Subtrees below 256 leaves are hashed from the rows when a
-- proof needs them; every complete subtree of 256 leaves or more is kept here, written in the
-- transaction of the row that completes it (one node per 128 rows on average). `audit verify`
-- recomputes them from the rows. A checkpoint records the tree head at its size. Never edit
-- this file once shipped; add 0011_*.sql instead.
CREATE TABLE merkle_nodes (
    level INTEGER NOT NULL CHECK (level >= 8 AND level < 64),
    idx   INTEGER NOT NULL CHECK (idx >= 0),
    hash  BLOB NOT NULL CHECK (length(hash) = 32),
    PRIMARY KEY (level, idx)
) STRICT, WITHOUT ROWID;

CREATE TRIGGER merkle_nodes_refuse_update BEFORE UPDATE ON merkle_nodes
BEGIN SELECT RAISE(ABORT, 'postern: the Merkle tree is append-only; UPDATE refused'); END;
CREATE TRIGGER merkle_nodes_refuse_delete BEFORE DELETE ON merkle_nodes
BEGIN SELECT RAISE(ABORT, 'postern: the Merkle tree is append-only; DELETE refused'); END;

ALTER TABLE checkpoints ADD COLUMN root_hash TEXT;

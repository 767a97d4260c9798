//! The journal's RFC 6962 Merkle tree in the database: leaf `i` is row `i + 1`
//! (`SHA-256(0x00 || body)`); subtrees below [`KEPT_LEVEL`] are hashed from the rows when a proof
//! needs them, larger complete subtrees are kept in `merkle_nodes`, written in the transaction of
//! the row that completes them. Proofs read one snapshot; a kept node is taken as it is (the
//! tree is a commitment: a witness holds it to its earlier checkpoints), and `audit verify` —
//! which `audit prove --from` runs first — recomputes every kept node from the rows, so rows
//! changed under an unchanged tree are found. An inclusion proof hashes its own row's leaf from
//! the row, so such a row no longer proves.

use crate::{StoreError, view::open_checked};
use postern_core::merkle::{self, Frontier, Hash, Subtree, Subtrees, TreeHead};
use rusqlite::{Connection, OptionalExtension, params};
use std::path::Path;

/// Complete subtrees of `2^KEPT_LEVEL` leaves (256) and larger are kept; smaller ones are hashed
/// from at most 255 rows when needed.
pub const KEPT_LEVEL: u32 = 8;

/// Complete subtrees read from a connection (inside whatever transaction it holds).
pub(crate) struct RowSubtrees<'c> {
    conn: &'c Connection,
}

impl<'c> RowSubtrees<'c> {
    pub(crate) fn new(conn: &'c Connection) -> Self {
        RowSubtrees { conn }
    }

    /// The leaf hashes of rows `first..=last`, in order (an error when one is missing).
    fn leaves(&self, first: u64, last: u64) -> Result<Vec<Hash>, StoreError> {
        let mut stmt =
            self.conn.prepare_cached("SELECT seq, body FROM journal WHERE seq BETWEEN ?1 AND ?2 ORDER BY seq")?;
        let mut rows = stmt.query(params![sql_int(first)?, sql_int(last)?])?;
        let mut out = Vec::with_capacity(usize::try_from(last - first + 1).unwrap_or(0));
        let mut expected = first;
        while let Some(row) = rows.next()? {
            if row.get::<_, i64>(0)? != sql_int(expected)? {
                break;
            }
            out.push(merkle::leaf_hash(row.get_ref(1)?.as_bytes().unwrap_or_default()));
            expected += 1;
        }
        if expected != last + 1 {
            return Err(StoreError::Corrupt(format!(
                "row {expected} is missing from the journal: the tree cannot be hashed"
            )));
        }
        Ok(out)
    }
}

fn sql_int(n: u64) -> Result<i64, StoreError> {
    i64::try_from(n).map_err(|_| StoreError::Corrupt(format!("{n} is beyond the journal")))
}

impl Subtrees for RowSubtrees<'_> {
    type Error = StoreError;

    fn hash(&mut self, s: Subtree) -> Result<Hash, StoreError> {
        if s.level >= KEPT_LEVEL {
            let kept: Option<Vec<u8>> = self
                .conn
                .prepare_cached("SELECT hash FROM merkle_nodes WHERE level = ?1 AND idx = ?2")?
                .query_row(params![s.level, sql_int(s.index)?], |r| r.get(0))
                .optional()?;
            return kept.and_then(|h| h.try_into().ok()).ok_or_else(|| {
                StoreError::Corrupt(format!(
                    "the Merkle tree has no node {}/{} (rows {}..): run `postern audit verify`",
                    s.level,
                    s.index,
                    s.start() + 1
                ))
            });
        }
        let first = s.start() + 1;
        let mut level = self.leaves(first, first + (1 << s.level) - 1)?;
        while level.len() > 1 {
            level = level.chunks(2).map(|p| merkle::node_hash(&p[0], &p[1])).collect();
        }
        Ok(level[0])
    }
}

/// Keeps the completed subtrees of [`KEPT_LEVEL`] and larger (an append's
/// [`Frontier::push`]). A node already there (planted ahead of the rows) is never a reason to
/// fail the append: it is left as it is, and what differs is returned.
pub(crate) fn keep(conn: &Connection, completed: &[(Subtree, Hash)]) -> Result<Option<String>, StoreError> {
    let mut conflict = None;
    for (s, hash) in completed.iter().filter(|(s, _)| s.level >= KEPT_LEVEL) {
        let inserted = conn
            .prepare_cached("INSERT INTO merkle_nodes (level, idx, hash) VALUES (?1, ?2, ?3) ON CONFLICT DO NOTHING")?
            .execute(params![s.level, sql_int(s.index)?, hash.as_slice()])?;
        if inserted == 0 {
            let there: Vec<u8> = conn
                .prepare_cached("SELECT hash FROM merkle_nodes WHERE level = ?1 AND idx = ?2")?
                .query_row(params![s.level, sql_int(s.index)?], |r| r.get(0))?;
            if there.as_slice() != hash.as_slice() {
                conflict = Some(format!("node {}/{} was there before its rows, with another hash", s.level, s.index));
            }
        }
    }
    Ok(conflict)
}

/// How many nodes a tree of `size` leaves keeps.
fn kept_count(size: u64) -> u64 {
    (KEPT_LEVEL..64).map(|l| size >> l).sum()
}

/// The right edge of the tree of the first `size` rows, for the writer. A journal written before
/// the tree was kept (or one whose kept nodes are fewer than its rows need) gets its nodes first,
/// hashed from its rows: the writer runs this inside its own transaction at start.
pub(crate) fn frontier(conn: &Connection, size: u64) -> Result<Frontier, StoreError> {
    let kept: i64 = conn.query_row("SELECT count(*) FROM merkle_nodes", [], |r| r.get(0))?;
    if u64::try_from(kept).unwrap_or(0) < kept_count(size) {
        let mut stmt = conn.prepare("SELECT body FROM journal WHERE seq <= ?1 ORDER BY seq")?;
        let mut rows = stmt.query([sql_int(size)?])?;
        let mut tree = Frontier::default();
        while let Some(row) = rows.next()? {
            let completed = tree.push(merkle::leaf_hash(row.get_ref(0)?.as_bytes().unwrap_or_default()));
            for (s, hash) in completed.iter().filter(|(s, _)| s.level >= KEPT_LEVEL) {
                conn.prepare_cached("INSERT OR IGNORE INTO merkle_nodes (level, idx, hash) VALUES (?1, ?2, ?3)")?
                    .execute(params![s.level, sql_int(s.index)?, hash.as_slice()])?;
            }
        }
        if tree.size() != size {
            return Err(StoreError::Corrupt(format!(
                "the journal has {} rows where {size} were expected",
                tree.size()
            )));
        }
        return Ok(tree);
    }
    Frontier::at(size, &mut RowSubtrees::new(conn))
}

/// That row `seq` is in the tree of `size` rows: its body, its leaf's audit path and the root.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Inclusion {
    pub seq: u64,
    /// The row's canonical body, as hashed into its leaf.
    pub body: String,
    pub tree: TreeHead,
    pub proof: Vec<Hash>,
}

/// That the tree of `new.size` rows extends the tree of `old.size` rows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Consistency {
    pub old: TreeHead,
    pub new: TreeHead,
    pub proof: Vec<Hash>,
}

/// A read-only snapshot of the tree, for proofs beside a running gateway.
#[derive(Debug)]
pub struct TreeReader {
    conn: Connection,
    /// Rows in the snapshot.
    pub size: u64,
}

impl TreeReader {
    /// Opens the journal at `path` read-only in one snapshot.
    pub fn open(path: &Path) -> Result<TreeReader, StoreError> {
        let conn = open_checked(path)?;
        conn.execute_batch("BEGIN DEFERRED")?;
        let size: i64 = conn.query_row("SELECT coalesce(max(seq), 0) FROM journal", [], |r| r.get(0))?;
        Ok(TreeReader { size: u64::try_from(size).unwrap_or(0), conn })
    }

    fn within(&self, size: u64) -> Result<(), StoreError> {
        if size > self.size {
            return Err(StoreError::Corrupt(format!(
                "the journal has {} rows, fewer than the {size} asked for (cut off, or another journal)",
                self.size
            )));
        }
        Ok(())
    }

    /// The tree head at `size` rows.
    pub fn head(&self, size: u64) -> Result<TreeHead, StoreError> {
        self.within(size)?;
        Ok(TreeHead { size, root: merkle::root(size, &mut RowSubtrees::new(&self.conn))? })
    }

    /// The inclusion proof of row `seq` in the tree of `size` rows.
    pub fn inclusion(&self, seq: u64, size: u64) -> Result<Inclusion, StoreError> {
        self.within(size)?;
        if seq == 0 || seq > size {
            return Err(StoreError::Corrupt(format!("row {seq} is not among the tree's {size} rows")));
        }
        let body: String =
            self.conn.query_row("SELECT body FROM journal WHERE seq = ?1", [sql_int(seq)?], |r| r.get(0))?;
        let mut src = RowSubtrees::new(&self.conn);
        let proof = merkle::inclusion_proof(seq - 1, size, &mut src)?.unwrap_or_default();
        Ok(Inclusion { seq, body, tree: TreeHead { size, root: merkle::root(size, &mut src)? }, proof })
    }

    /// The consistency proof from the tree of `old` rows to the tree of `new` rows.
    pub fn consistency(&self, old: u64, new: u64) -> Result<Consistency, StoreError> {
        self.within(new)?;
        let mut src = RowSubtrees::new(&self.conn);
        let proof = merkle::consistency_proof(old, new, &mut src)?.ok_or_else(|| {
            StoreError::Corrupt(format!("the journal's {new} rows are fewer than the {old} asked for"))
        })?;
        Ok(Consistency {
            old: TreeHead { size: old, root: merkle::root(old, &mut src)? },
            new: TreeHead { size: new, root: merkle::root(new, &mut src)? },
            proof,
        })
    }
}

/// Where the kept nodes differ from the tree the rows make (`audit verify`): each kept node the
/// walk recomputed, compared with `merkle_nodes`.
pub(crate) fn differences(
    conn: &Connection,
    recomputed: &[(Subtree, Hash)],
    size: u64,
) -> Result<Vec<String>, StoreError> {
    let mut found = Vec::new();
    let mut stmt = conn.prepare_cached("SELECT hash FROM merkle_nodes WHERE level = ?1 AND idx = ?2")?;
    for (s, hash) in recomputed {
        let kept: Option<Vec<u8>> = stmt.query_row(params![s.level, sql_int(s.index)?], |r| r.get(0)).optional()?;
        match kept {
            None => found.push(format!(
                "node {}/{} (rows {}..{}) is missing",
                s.level,
                s.index,
                s.start() + 1,
                s.start() + (1 << s.level)
            )),
            Some(k) if k.as_slice() != hash.as_slice() => found.push(format!(
                "node {}/{} (rows {}..{}) does not hash its rows",
                s.level,
                s.index,
                s.start() + 1,
                s.start() + (1 << s.level)
            )),
            Some(_) => {}
        }
    }
    let kept: i64 = conn.query_row("SELECT count(*) FROM merkle_nodes", [], |r| r.get(0))?;
    if u64::try_from(kept).unwrap_or(0) > kept_count(size) {
        found.push(format!("{kept} nodes are kept where {} rows make {}", size, kept_count(size)));
    }
    Ok(found)
}

//! Offline audit: recompute the journal's hash chain from the database file alone, name the
//! first row that does not verify and why, compare the head with an exported checkpoint, and
//! check the projections (current execution states, stored results) against the journal.
//!
//! What the chain can and cannot prove: any change, deletion, reordering or insertion inside
//! the journal is detected. Rewriting the whole chain from some row onwards, or cutting rows off
//! the end, is only detectable against a checkpoint kept somewhere else.

use crate::{
    StoreError,
    journal::{GENESIS, HashHex, JournalHead, chain_hash},
    view::open_checked,
};
use postern_core::Timestamp;
use rusqlite::{Connection, OptionalExtension};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::{fmt, path::Path};

/// A journal head exported for safekeeping outside the machine.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    pub format: String,
    pub journal_size: u64,
    pub head_hash: HashHex,
    pub created_at: Timestamp,
    /// Ed25519 signature over the head (added by the vault; `None` until then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signature: Option<String>,
}

impl Checkpoint {
    pub const FORMAT: &'static str = "postern-checkpoint/1";

    pub fn new(head: JournalHead, at: Timestamp) -> Self {
        Checkpoint {
            format: Self::FORMAT.into(),
            journal_size: head.size,
            head_hash: head.hash,
            created_at: at,
            signature: None,
        }
    }

    /// Parses an exported checkpoint file, with a message naming what is wrong.
    pub fn parse(text: &str) -> Result<Self, String> {
        let cp: Checkpoint =
            serde_json::from_str(text).map_err(|e| format!("not a Postern checkpoint: {e}"))?;
        if cp.format != Self::FORMAT {
            return Err(format!(
                "unsupported checkpoint format {:?} (expected {:?})",
                cp.format,
                Self::FORMAT
            ));
        }
        Ok(cp)
    }
}

/// One thing that does not verify.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Finding {
    /// The row's content (or its stored hash) changed after it was appended.
    Modified { seq: u64, why: String },
    /// Rows `from..=to` are gone.
    Missing { from: u64, to: u64 },
    /// The row at `position` was appended as row `found_seq`, and the row appended at
    /// `position` appears later: rows were swapped or moved.
    Reordered { position: u64, found_seq: u64 },
    /// A row that was never appended by Postern sits at `position`; the rows after it are
    /// shifted by one.
    Inserted { position: u64 },
    /// The journal is shorter than an exported checkpoint says it was.
    Truncated {
        journal_size: u64,
        checkpoint_size: u64,
    },
    /// The journal's row at the checkpoint's size does not have the checkpointed hash: history
    /// up to that point was rewritten.
    HeadDiffers {
        seq: u64,
        checkpoint: HashHex,
        journal: HashHex,
    },
    /// `executions` says one state, the journal another.
    ProjectionMismatch {
        execution_id: String,
        projection: String,
        journal: Option<String>,
    },
    /// The journal has an execution that `executions` lacks.
    ProjectionMissing { execution_id: String },
    /// A stored result does not match the digest journaled when it was recorded.
    ResultMismatch { execution_id: String, why: String },
}

impl Finding {
    /// Findings about the chain itself (as opposed to the projections).
    pub fn is_chain(&self) -> bool {
        matches!(
            self,
            Finding::Modified { .. }
                | Finding::Missing { .. }
                | Finding::Reordered { .. }
                | Finding::Inserted { .. }
                | Finding::Truncated { .. }
                | Finding::HeadDiffers { .. }
        )
    }
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Finding::Modified { seq, why } => write!(f, "row {seq}: modified ({why})"),
            Finding::Missing { from, to } if from == to => {
                write!(f, "row {from}: missing (deleted)")
            }
            Finding::Missing { from, to } => write!(f, "rows {from}..{to}: missing (deleted)"),
            Finding::Reordered {
                position,
                found_seq,
            } => write!(
                f,
                "row {position}: reordered (this position holds the row appended as {found_seq}; row {position} appears later)"
            ),
            Finding::Inserted { position } => write!(
                f,
                "row {position}: inserted (a row Postern never appended sits here; the rows after it are shifted by one)"
            ),
            Finding::Truncated {
                journal_size,
                checkpoint_size,
            } => write!(
                f,
                "journal truncated: it ends at row {journal_size} but the checkpoint covers {checkpoint_size} rows"
            ),
            Finding::HeadDiffers {
                seq,
                checkpoint,
                journal,
            } => write!(
                f,
                "row {seq}: chain head differs from the checkpoint (checkpoint {checkpoint}, journal {journal}); history was rewritten"
            ),
            Finding::ProjectionMismatch {
                execution_id,
                projection,
                journal,
            } => write!(
                f,
                "execution {execution_id}: current state says {projection:?} but the journal says {}",
                journal
                    .as_deref()
                    .map_or("nothing".to_string(), |j| format!("{j:?}"))
            ),
            Finding::ProjectionMissing { execution_id } => {
                write!(
                    f,
                    "execution {execution_id}: in the journal but missing from the executions table"
                )
            }
            Finding::ResultMismatch { execution_id, why } => {
                write!(f, "execution {execution_id}: stored result {why}")
            }
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct VerifyReport {
    pub rows: u64,
    pub executions: u64,
    pub sessions: u64,
    pub head: JournalHead,
    pub checkpoint_checked: bool,
    pub findings: Vec<Finding>,
}

impl VerifyReport {
    pub fn intact(&self) -> bool {
        self.findings.is_empty()
    }
}

const PROGRESS_EVERY: u64 = 1 << 14;

/// Verifies the database at `path` without writing to it. `progress(done, total)` is called
/// periodically. Errors are reserved for files that cannot be verified at all (missing, not a
/// Postern database, newer schema); tampering is reported in [`VerifyReport::findings`].
pub fn verify(
    path: &Path,
    checkpoint: Option<&Checkpoint>,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<VerifyReport, StoreError> {
    let conn = open_checked(path)?;
    // Read-only tuning: large page cache and memory-mapped reads for the sequential scan.
    conn.pragma_update(None, "cache_size", -65_536)?;
    conn.pragma_update(None, "mmap_size", 1i64 << 32)?;
    let total: u64 =
        conn.query_row("SELECT count(*) FROM journal", [], |r| r.get::<_, i64>(0))? as u64;
    let (head, chain_finding) = check_chain(&conn, total, progress)?;
    let mut findings: Vec<Finding> = chain_finding.into_iter().collect();
    let mut checkpoint_checked = false;
    if findings.is_empty()
        && let Some(cp) = checkpoint
    {
        checkpoint_checked = true;
        findings.extend(check_checkpoint(&conn, head, cp)?);
    }
    if findings.is_empty() {
        findings.extend(check_projection(&conn)?);
        findings.extend(check_results(&conn)?);
    }
    let count = |sql: &str| {
        conn.query_row(sql, [], |r| r.get::<_, i64>(0))
            .map(|n| n as u64)
    };
    Ok(VerifyReport {
        rows: total,
        executions: count("SELECT count(*) FROM executions")?,
        sessions: count("SELECT count(*) FROM agent_sessions")?,
        head,
        checkpoint_checked,
        findings,
    })
}

/// Walks the chain in `seq` order. Every row must chain from the stored hash of the row before
/// it; the first row that does not is diagnosed and the walk stops there.
fn check_chain(
    conn: &Connection,
    total: u64,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<(JournalHead, Option<Finding>), StoreError> {
    let mut stmt = conn.prepare("SELECT seq, body, row_hash FROM journal ORDER BY seq")?;
    let mut rows = stmt.query([])?;
    let mut prev = GENESIS;
    let mut expected: u64 = 1;
    while let Some(row) = rows.next()? {
        let seq = row.get::<_, i64>(0)? as u64;
        let (Ok(body), Ok(stored)) = (row.get_ref(1)?.as_bytes(), row.get_ref(2)?.as_bytes())
        else {
            let why = "content or hash has been replaced by a value of the wrong type".to_string();
            return Ok((
                JournalHead {
                    size: seq - 1,
                    hash: HashHex(prev),
                },
                Some(Finding::Modified { seq, why }),
            ));
        };
        if seq != expected {
            return Ok((
                JournalHead {
                    size: expected - 1,
                    hash: HashHex(prev),
                },
                Some(Finding::Missing {
                    from: expected,
                    to: seq - 1,
                }),
            ));
        }
        if chain_hash(&prev, body).as_slice() != stored {
            let finding = diagnose(conn, seq, body, stored)?;
            return Ok((
                JournalHead {
                    size: seq - 1,
                    hash: HashHex(prev),
                },
                Some(finding),
            ));
        }
        prev.copy_from_slice(stored);
        if seq.is_multiple_of(PROGRESS_EVERY) {
            progress(seq, total);
        }
        expected += 1;
    }
    progress(expected - 1, total);
    Ok((
        JournalHead {
            size: expected - 1,
            hash: HashHex(prev),
        },
        None,
    ))
}

#[derive(Deserialize)]
struct SeqOnly {
    seq: u64,
}

fn body_seq(body: &[u8]) -> Option<u64> {
    serde_json::from_slice::<SeqOnly>(body).ok().map(|s| s.seq)
}

/// Explains why the row at `position` does not chain, from the `seq` each row carries inside
/// its own hashed content.
///
/// A row whose content claims another position is only called *displaced* (reordered or
/// inserted-before) when it still chains from the hash of the row that originally preceded it,
/// which proves its content is untouched. Anything else is a modification.
fn diagnose(
    conn: &Connection,
    position: u64,
    body: &[u8],
    stored: &[u8],
) -> Result<Finding, StoreError> {
    let modified = |why: &str| {
        Ok(Finding::Modified {
            seq: position,
            why: why.into(),
        })
    };
    let Some(claimed) = body_seq(body) else {
        return modified("content is not a valid journal row");
    };
    if claimed == position || claimed == 0 {
        return modified("content does not match its recorded hash");
    }
    let predecessor = if claimed == 1 {
        Some((0, GENESIS.to_vec()))
    } else {
        row_claiming(conn, claimed - 1, position)?
    };
    match predecessor {
        Some((_, pred_hash)) => {
            let pred: [u8; 32] = pred_hash.try_into().unwrap_or([0; 32]);
            if chain_hash(&pred, body).as_slice() != stored {
                return modified("content does not match its recorded hash");
            }
            if claimed < position {
                Ok(Finding::Inserted { position: claimed })
            } else {
                Ok(Finding::Reordered {
                    position,
                    found_seq: claimed,
                })
            }
        }
        None if claimed > position
            && row_claiming(conn, claimed, position)?.is_none()
            && row_claiming(conn, position, position)?.is_none() =>
        {
            Ok(Finding::Missing {
                from: position,
                to: claimed - 1,
            })
        }
        None => modified("content does not match its recorded hash"),
    }
}

/// The (position, row_hash) of a row other than `except` whose content claims `seq`.
fn row_claiming(
    conn: &Connection,
    seq: u64,
    except: u64,
) -> Result<Option<(u64, Vec<u8>)>, StoreError> {
    Ok(conn
        .query_row(
            "SELECT seq, row_hash FROM journal
             WHERE seq != ?2 AND (CASE WHEN json_valid(body) THEN json_extract(body, '$.seq') END) = ?1
             ORDER BY seq LIMIT 1",
            rusqlite::params![seq as i64, except as i64],
            |r| Ok((r.get::<_, i64>(0)? as u64, r.get::<_, Vec<u8>>(1)?)),
        )
        .optional()?)
}

fn check_checkpoint(
    conn: &Connection,
    head: JournalHead,
    cp: &Checkpoint,
) -> Result<Option<Finding>, StoreError> {
    if cp.journal_size > head.size {
        return Ok(Some(Finding::Truncated {
            journal_size: head.size,
            checkpoint_size: cp.journal_size,
        }));
    }
    if cp.journal_size == 0 {
        return Ok(None);
    }
    let at: Option<Vec<u8>> = conn
        .query_row(
            "SELECT row_hash FROM journal WHERE seq = ?1",
            [cp.journal_size as i64],
            |r| r.get(0),
        )
        .optional()?;
    let journal = HashHex(at.and_then(|h| h.try_into().ok()).unwrap_or([0; 32]));
    Ok((journal != cp.head_hash).then_some(Finding::HeadDiffers {
        seq: cp.journal_size,
        checkpoint: cp.head_hash,
        journal,
    }))
}

fn check_projection(conn: &Connection) -> Result<Vec<Finding>, StoreError> {
    let mut findings = Vec::new();
    let mut stmt = conn.prepare(
        "SELECT e.id, e.state,
                (SELECT j.state FROM journal j WHERE j.execution_id = e.id ORDER BY j.seq DESC LIMIT 1)
         FROM executions e ORDER BY e.id",
    )?;
    let mut rows = stmt.query([])?;
    while let Some(r) = rows.next()? {
        let (id, projection, journal): (String, String, Option<String>) =
            (r.get(0)?, r.get(1)?, r.get(2)?);
        if journal.as_deref() != Some(projection.as_str()) {
            findings.push(Finding::ProjectionMismatch {
                execution_id: id,
                projection,
                journal,
            });
        }
    }
    let mut stmt = conn.prepare(
        "SELECT DISTINCT j.execution_id FROM journal j
         WHERE j.execution_id IS NOT NULL
           AND NOT EXISTS (SELECT 1 FROM executions e WHERE e.id = j.execution_id)
         ORDER BY 1",
    )?;
    let missing = stmt.query_map([], |r| r.get::<_, String>(0))?;
    for id in missing {
        findings.push(Finding::ProjectionMissing { execution_id: id? });
    }
    Ok(findings)
}

fn check_results(conn: &Connection) -> Result<Vec<Finding>, StoreError> {
    let mut findings = Vec::new();
    let mut stmt = conn.prepare(
        "SELECT r.execution_id, r.sha256, r.body,
                (SELECT json_extract(j.body, '$.detail.result.sha256') FROM journal j
                  WHERE j.execution_id = r.execution_id AND j.event = 'completed' ORDER BY j.seq DESC LIMIT 1)
         FROM results r ORDER BY r.execution_id",
    )?;
    let mut rows = stmt.query([])?;
    while let Some(r) = rows.next()? {
        let id: String = r.get(0)?;
        let recorded: String = r.get(1)?;
        let actual = hex::encode(Sha256::digest(r.get_ref(2)?.as_bytes().unwrap_or_default()));
        let journaled: Option<String> = r.get(3)?;
        let why = if journaled.is_none() {
            Some("has no `completed` row in the journal".to_string())
        } else if journaled.as_deref() != Some(actual.as_str()) {
            Some("does not match the digest in its `completed` journal row".to_string())
        } else if recorded != actual {
            Some("does not match its own recorded digest".to_string())
        } else {
            None
        };
        if let Some(why) = why {
            findings.push(Finding::ResultMismatch {
                execution_id: id,
                why,
            });
        }
    }
    Ok(findings)
}
